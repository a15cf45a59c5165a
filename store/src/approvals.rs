//! Approvals (SPEC A3, A4): the pending tool calls of a chat and their answers.
//!
//! An approval leaves `pending` once: every change is a conditional UPDATE on
//! `state = 'pending'` inside a transaction that also rewrites the stored tool part the
//! approval names, so the transcript and the approval never disagree and every call in
//! the history has a result (a denial, or the output the continuation writes).

use std::time::Duration;

use chrono::{DateTime, Utc};
use protocol::parts::{Approval, ApprovalRequest, Part, ToolPart, ToolState};
use protocol::{AgentId, ChatId, MessageId, TeamId, TurnId};
use serde_json::Value;
use sqlx::Row;
use sqlx::types::Json;
use uuid::Uuid;

use super::{Store, StoreError};
use domain::approvals::{ApprovalKind, ApprovalState, ElicitAction, Elicitation, denial_text};

/// A pending approval as the turn that asks writes it, with its end state.
#[derive(Clone, Debug)]
pub struct NewApproval {
    pub id: Uuid,
    /// The index of the tool part in the assistant message's parts.
    pub part_index: i32,
    pub tool_call_id: String,
    pub tool: String,
    /// As stored for history (and run with, once approved).
    pub input: Value,
    pub expires_at: DateTime<Utc>,
}

/// An approval as `GET /v1/chats/{id}/approvals` lists it.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ApprovalRow {
    #[schema(value_type = Uuid)]
    pub id: Uuid,
    /// A tool call to let run, or an MCP server's question the call waits on (P5).
    pub kind: ApprovalKind,
    /// The call that asks (an elicitation's: the connector tool call it came during).
    pub tool_call_id: String,
    pub tool: String,
    pub input: Value,
    /// With `kind: elicitation`: the server's message and form.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elicitation: Option<Elicitation>,
    /// With `kind: elicitation`, once accepted: the values sent to the server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
    pub state: ApprovalState,
    /// The person's reason, or why it was denied without one.
    pub reason: Option<String>,
    pub expires_at: DateTime<Utc>,
    #[serde(skip)]
    pub chat: ChatId,
    #[serde(skip)]
    pub agent: AgentId,
    #[serde(skip)]
    pub turn: TurnId,
    /// The stored tool part a tool approval rewrites; an elicitation has none.
    #[serde(skip)]
    pub message: Option<MessageId>,
    #[serde(skip)]
    pub part_index: Option<i32>,
    /// Answered by an admin: an approved call that changes the agent runs only then (X1).
    #[serde(skip)]
    pub answered_admin: bool,
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, kind, tool_call_id, tool, input, elicitation, content, state, reason, \
    expires_at, chat_id, agent_id, turn_id, message_id, part_index, answered_admin, created_at";

fn from_row(row: &sqlx::postgres::PgRow) -> Result<ApprovalRow, StoreError> {
    let state: String = row.try_get("state")?;
    let kind: String = row.try_get("kind")?;
    let elicitation: Option<Json<Elicitation>> = row.try_get("elicitation")?;
    Ok(ApprovalRow {
        id: row.try_get("id")?,
        kind: ApprovalKind::parse(&kind)
            .ok_or_else(|| StoreError::Corrupt(format!("approval kind {kind}")))?,
        tool_call_id: row.try_get("tool_call_id")?,
        tool: row.try_get("tool")?,
        input: row.try_get("input")?,
        elicitation: elicitation.map(|e| e.0),
        content: row.try_get("content")?,
        state: ApprovalState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("approval state {state}")))?,
        reason: row.try_get("reason")?,
        expires_at: row.try_get("expires_at")?,
        chat: ChatId(row.try_get("chat_id")?),
        agent: AgentId(row.try_get("agent_id")?),
        turn: TurnId(row.try_get("turn_id")?),
        message: row.try_get::<Option<Uuid>, _>("message_id")?.map(MessageId),
        part_index: row.try_get("part_index")?,
        answered_admin: row.try_get("answered_admin")?,
        created_at: row.try_get("created_at")?,
    })
}

/// The stored part of a call that waits for a person's answer.
pub fn requested_part(tool: &str, call_id: &str, input: &Value, approval: Uuid) -> Part {
    Part::Tool(ToolPart {
        tool: tool.to_owned(),
        tool_call_id: call_id.to_owned(),
        input: input.clone(),
        state: ToolState::ApprovalRequested {
            approval: ApprovalRequest { id: approval },
        },
    })
}

/// The stored part of the call `row` waits on, now in `state`.
fn answered_part(row: &ApprovalRow, state: ToolState) -> Part {
    Part::Tool(ToolPart {
        tool: row.tool.clone(),
        tool_call_id: row.tool_call_id.clone(),
        input: row.input.clone(),
        state,
    })
}

/// The stored part of an approved call until its output is written.
fn responded_part(row: &ApprovalRow, reason: Option<&str>) -> Part {
    let approval = Approval {
        id: row.id,
        approved: true,
        reason: reason.map(str::to_owned),
    };
    answered_part(row, ToolState::ApprovalResponded { approval })
}

/// The stored part of a call that never ran: `approval.reason` is what the model reads.
fn denied_part(row: &ApprovalRow, state: ApprovalState, reason: Option<&str>) -> Part {
    let approval = Approval {
        id: row.id,
        approved: false,
        reason: Some(denial_text(state, reason)),
    };
    answered_part(row, ToolState::OutputDenied { approval })
}

/// One answer to an approval.
#[derive(Clone, Debug)]
pub struct Answer {
    pub id: Uuid,
    pub approved: bool,
    pub reason: Option<String>,
}

/// Who answers approvals (X1): recorded, and the authority a continuation started again
/// after its replica died acts with.
#[derive(Clone, Copy, Debug)]
pub struct Answerer<'a> {
    /// `key:<id>` or `user:<subject>`.
    pub actor: &'a str,
    pub admin: bool,
}

/// A continuation whose turn row was never written.
#[derive(Clone, Debug)]
pub struct Stranded {
    pub team: TeamId,
    pub chat: ChatId,
    /// The turn id its answer named.
    pub continuation: TurnId,
    /// The authority of the turn it continues (X1): never the answerer's.
    pub asking: Asking,
}

/// Whose authority a turn that asked for approvals had (`turns.actor`, `actor_admin`),
/// which its continuation acts with (X1).
#[derive(Clone, Debug)]
pub struct Asking {
    pub actor: Option<String>,
    pub admin: bool,
}

/// What answering did.
#[derive(Debug)]
pub enum Answered {
    /// Every answer landed. `resume` is `Some` when no approval of the turn is left
    /// pending: all of them, whose approved calls the continuation (`turn`) runs.
    Done {
        answered: Vec<ApprovalRow>,
        resume: Option<Vec<ApprovalRow>>,
    },
    /// An approval was answered already (its state now), or had expired: nothing changed
    /// but the expiry.
    Closed(Box<ApprovalRow>),
}

/// Which pending approvals of a chat a new event denies.
#[derive(Clone, Copy, Debug)]
pub enum Close {
    /// Those past their expiry.
    Expired,
    /// All of them: the user sent a new message.
    Superseded,
    /// The elicitations only: a message was queued behind the turn that asks (P5).
    Asked,
}

impl Store {
    /// One approval of the team.
    pub async fn approval(&self, team: TeamId, id: Uuid) -> Result<ApprovalRow, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM approvals WHERE team_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        from_row(&row)
    }

    /// A page of the chat's approvals (only those still waiting with `pending_only`),
    /// oldest first: at most `limit` after `after`, once the expired ones are denied.
    pub async fn chat_approvals(
        &self,
        team: TeamId,
        chat: ChatId,
        pending_only: bool,
        after: Option<super::Keyset>,
        limit: i64,
    ) -> Result<Vec<ApprovalRow>, StoreError> {
        self.close_approvals(team, chat, Close::Expired).await?;
        let sql = format!(
            "SELECT {COLUMNS} FROM approvals WHERE team_id = $1 AND chat_id = $2 AND {} \
               AND (NOT $6 OR state = 'pending') \
             ORDER BY created_at, id LIMIT $3",
            super::keyset_after(">", "$4", "$5")
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(chat.0)
            .bind(limit)
            .bind(after.map(|k| k.at))
            .bind(after.map(|k| k.id))
            .bind(pending_only)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(from_row).collect()
    }

    /// Denies the chat's pending approvals that `which` names, each with its tool part
    /// rewritten, in one transaction; answers how many.
    pub async fn close_approvals(
        &self,
        team: TeamId,
        chat: ChatId,
        which: Close,
    ) -> Result<usize, StoreError> {
        let (state, due) = match which {
            Close::Expired => (ApprovalState::Expired, "AND expires_at <= now()"),
            Close::Superseded => (ApprovalState::Superseded, ""),
            Close::Asked => (ApprovalState::Superseded, "AND kind = 'elicitation'"),
        };
        let mut tx = self.pool.begin().await?;
        let sql = format!(
            "UPDATE approvals SET state = $3, answered_at = now() \
             WHERE team_id = $1 AND chat_id = $2 AND state = 'pending' {due} \
             RETURNING {COLUMNS}"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(chat.0)
            .bind(state.as_str())
            .fetch_all(&mut *tx)
            .await?;
        for row in &rows {
            let row = from_row(row)?;
            set_part(&mut tx, team, &row, &denied_part(&row, state, None)).await?;
        }
        tx.commit().await?;
        Ok(rows.len())
    }

    /// Records the answers (to approvals of one turn of `chat`), at most once each: the turn's
    /// approvals are locked, so two answers race on the lock and the second finds the
    /// state already changed. An expired approval is denied `expired` instead. Answers
    /// land all or none: one that finds its approval closed or expired records nothing
    /// of the others (but the expiry).
    pub async fn answer_approvals(
        &self,
        team: TeamId,
        chat: ChatId,
        answers: &[Answer],
        continuation: TurnId,
        by: Answerer<'_>,
    ) -> Result<Answered, StoreError> {
        let first = answers.first().ok_or(StoreError::NotFound)?;
        let mut tx = self.pool.begin().await?;
        let sql = format!(
            "SELECT {COLUMNS}, expires_at <= now() AS expired FROM approvals \
             WHERE team_id = $1 AND chat_id = $3 AND kind = 'tool' AND turn_id = \
               (SELECT turn_id FROM approvals WHERE team_id = $1 AND id = $2) \
             ORDER BY part_index FOR UPDATE"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(first.id)
            .bind(chat.0)
            .fetch_all(&mut *tx)
            .await?;
        let mut turn_rows = Vec::with_capacity(rows.len());
        for row in &rows {
            let expired: bool = row.try_get("expired")?;
            turn_rows.push((from_row(row)?, expired));
        }
        // Every answer is checked before any is written.
        for answer in answers {
            let Some((row, expired)) = turn_rows.iter_mut().find(|(r, _)| r.id == answer.id) else {
                return Err(StoreError::NotFound);
            };
            if row.state != ApprovalState::Pending {
                return Ok(Answered::Closed(Box::new(row.clone())));
            }
            if *expired {
                // The expiry is written even though the answers are refused.
                close_one(&mut tx, team, row, ApprovalState::Expired, None, None).await?;
                row.state = ApprovalState::Expired;
                let closed = row.clone();
                tx.commit().await?;
                return Ok(Answered::Closed(Box::new(closed)));
            }
        }
        let mut answered = Vec::with_capacity(answers.len());
        for answer in answers {
            let Some((row, _)) = turn_rows.iter_mut().find(|(r, _)| r.id == answer.id) else {
                return Err(StoreError::NotFound);
            };
            let state = if answer.approved {
                ApprovalState::Approved
            } else {
                ApprovalState::Denied
            };
            close_one(
                &mut tx,
                team,
                row,
                state,
                answer.reason.as_deref(),
                Some(by),
            )
            .await?;
            row.state = state;
            row.reason = answer.reason.clone();
            row.answered_admin = by.admin;
            answered.push(row.clone());
        }
        let resume = if turn_rows
            .iter()
            .all(|(r, _)| r.state != ApprovalState::Pending)
        {
            let ids: Vec<Uuid> = answered.iter().map(|r| r.id).collect();
            sqlx::query(
                "UPDATE approvals SET continuation_turn = $3 WHERE team_id = $1 AND id = ANY($2)",
            )
            .bind(team.0)
            .bind(&ids)
            .bind(continuation.0)
            .execute(&mut *tx)
            .await?;
            Some(turn_rows.into_iter().map(|(r, _)| r).collect())
        } else {
            None
        };
        tx.commit().await?;
        Ok(Answered::Done { answered, resume })
    }

    /// The authority of the turn that asked for the approval `id` of `chat`.
    pub async fn asking_authority(
        &self,
        team: TeamId,
        chat: ChatId,
        id: Uuid,
    ) -> Result<Asking, StoreError> {
        let row: Option<(Option<String>, bool)> = sqlx::query_as(
            "SELECT t.actor, t.actor_admin FROM approvals a JOIN turns t ON t.id = a.turn_id \
             WHERE a.team_id = $1 AND a.chat_id = $2 AND a.id = $3",
        )
        .bind(team.0)
        .bind(chat.0)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        let (actor, admin) = row.ok_or(StoreError::NotFound)?;
        Ok(Asking { actor, admin })
    }

    /// Continuations answered at least `after` ago (and within a day) whose turn row was
    /// never written: their replica died, or a store call failed, between the answer and
    /// the turn. At most `limit`, oldest first.
    pub async fn stranded_continuations(
        &self,
        after: Duration,
        limit: i64,
    ) -> Result<Vec<Stranded>, StoreError> {
        let rows: Vec<(Uuid, Uuid, Uuid, Option<String>, bool)> = sqlx::query_as(
            "SELECT DISTINCT ON (a.continuation_turn) a.team_id, a.chat_id, a.continuation_turn, \
                    t.actor, t.actor_admin \
             FROM approvals a JOIN turns t ON t.id = a.turn_id \
             WHERE a.continuation_turn IS NOT NULL \
               AND a.answered_at < now() - make_interval(secs => $1) \
               AND a.answered_at > now() - interval '1 day' \
               AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.id = a.continuation_turn) \
             ORDER BY a.continuation_turn, a.answered_at LIMIT $2",
        )
        .bind(after.as_secs_f64())
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(team, chat, turn, actor, admin)| Stranded {
                team: TeamId(team),
                chat: ChatId(chat),
                continuation: TurnId(turn),
                asking: Asking { actor, admin },
            })
            .collect())
    }

    /// Takes over a stranded continuation for the turn `continuation`: every approval of
    /// the turn it continues, all answered. `None` when it is not stranded any more
    /// (another replica took it, or its turn row exists).
    pub async fn reclaim_continuation(
        &self,
        team: TeamId,
        chat: ChatId,
        stranded: TurnId,
        continuation: TurnId,
    ) -> Result<Option<Vec<ApprovalRow>>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let turn: Option<Uuid> = sqlx::query_scalar(
            "UPDATE approvals SET continuation_turn = $4 \
             WHERE team_id = $1 AND chat_id = $2 AND continuation_turn = $3 \
               AND NOT EXISTS (SELECT 1 FROM turns WHERE id = $3) \
             RETURNING turn_id",
        )
        .bind(team.0)
        .bind(chat.0)
        .bind(stranded.0)
        .bind(continuation.0)
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .next();
        let Some(turn) = turn else {
            return Ok(None);
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM approvals WHERE team_id = $1 AND turn_id = $2 \
               AND kind = 'tool' ORDER BY part_index FOR UPDATE"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(turn)
            .fetch_all(&mut *tx)
            .await?;
        let rows = rows.iter().map(from_row).collect::<Result<Vec<_>, _>>()?;
        tx.commit().await?;
        Ok(Some(rows))
    }

    /// Writes an approved call's result into its stored tool part.
    pub async fn resolve_approval_part(
        &self,
        team: TeamId,
        approval: &ApprovalRow,
        part: &Part,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        set_part(&mut tx, team, approval, part).await?;
        tx.commit().await?;
        Ok(())
    }
}

async fn close_one(
    tx: &mut sqlx::PgConnection,
    team: TeamId,
    row: &ApprovalRow,
    state: ApprovalState,
    reason: Option<&str>,
    by: Option<Answerer<'_>>,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE approvals SET state = $3, reason = $4, answered_at = now(), \
         answered_by = $5, answered_admin = $6 \
         WHERE team_id = $1 AND id = $2 AND state = 'pending'",
    )
    .bind(team.0)
    .bind(row.id)
    .bind(state.as_str())
    .bind(reason)
    .bind(by.map(|b| b.actor))
    .bind(by.is_some_and(|b| b.admin))
    .execute(&mut *tx)
    .await?;
    let part = if state == ApprovalState::Approved {
        responded_part(row, reason)
    } else {
        denied_part(row, state, reason)
    };
    set_part(tx, team, row, &part).await
}

async fn set_part(
    conn: &mut sqlx::PgConnection,
    team: TeamId,
    row: &ApprovalRow,
    part: &Part,
) -> Result<(), StoreError> {
    // An elicitation names no stored part: its call is still running.
    let (Some(message), Some(index)) = (row.message, row.part_index) else {
        return Ok(());
    };
    sqlx::query(
        "UPDATE messages SET parts = jsonb_set(parts, ARRAY[$3::text], $4) \
         WHERE team_id = $1 AND id = $2",
    )
    .bind(team.0)
    .bind(message.0)
    .bind(index.to_string())
    .bind(Json(part))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// An MCP server's question as the call that waits on it records it (P5).
#[derive(Debug)]
pub struct NewElicitation<'a> {
    pub id: Uuid,
    pub agent: AgentId,
    pub chat: ChatId,
    pub turn: TurnId,
    pub tool_call_id: &'a str,
    pub tool: &'a str,
    pub input: &'a Value,
    pub elicitation: &'a Elicitation,
    pub expires_at: DateTime<Utc>,
}

impl Store {
    /// Records a pending elicitation and its `approval.requested` event (ids only, X4) in
    /// one transaction.
    pub async fn insert_elicitation(
        &self,
        team: TeamId,
        new: &NewElicitation<'_>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO approvals (id, team_id, agent_id, chat_id, turn_id, kind, tool_call_id, \
               tool, input, elicitation, state, expires_at) \
             VALUES ($1, $2, $3, $4, $5, 'elicitation', $6, $7, $8, $9, 'pending', $10)",
        )
        .bind(new.id)
        .bind(team.0)
        .bind(new.agent.0)
        .bind(new.chat.0)
        .bind(new.turn.0)
        .bind(new.tool_call_id)
        .bind(new.tool)
        .bind(new.input)
        .bind(Json(new.elicitation))
        .bind(new.expires_at)
        .execute(&mut *tx)
        .await?;
        let data = serde_json::json!({
            "approval_id": new.id,
            "kind": ApprovalKind::Elicitation.as_str(),
            "turn_id": new.turn,
            "chat_id": new.chat,
            "agent_id": new.agent,
            "tool": new.tool,
            "expires_at": new.expires_at,
        });
        super::webhooks::enqueue(
            &mut *tx,
            team,
            super::webhooks::WebhookEvent::ApprovalRequested,
            &new.id.to_string(),
            &data,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Where an elicitation stands: its state, and the values once accepted.
    pub async fn elicitation_state(
        &self,
        team: TeamId,
        id: Uuid,
    ) -> Result<(ApprovalState, Option<Value>), StoreError> {
        let (state, content): (String, Option<Value>) = sqlx::query_as(
            "SELECT state, content FROM approvals \
             WHERE team_id = $1 AND id = $2 AND kind = 'elicitation'",
        )
        .bind(team.0)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        let state = ApprovalState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("approval state {state}")))?;
        Ok((state, content))
    }

    /// Records a person's answer to a pending elicitation, at most once (a conditional
    /// UPDATE: of two answers one wins); one past its expiry is closed `expired` instead.
    pub async fn answer_elicitation(
        &self,
        team: TeamId,
        id: Uuid,
        action: ElicitAction,
        content: Option<&Value>,
        by: Answerer<'_>,
    ) -> Result<Answered, StoreError> {
        let sql = format!(
            "UPDATE approvals SET state = $3, content = $4, answered_at = now(), \
               answered_by = $5, answered_admin = $6 \
             WHERE team_id = $1 AND id = $2 AND kind = 'elicitation' AND state = 'pending' \
               AND expires_at > now() \
             RETURNING {COLUMNS}"
        );
        let answered = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(id)
            .bind(action.state().as_str())
            .bind(content)
            .bind(by.actor)
            .bind(by.admin)
            .fetch_optional(&self.pool)
            .await?;
        if let Some(row) = answered {
            return Ok(Answered::Done {
                answered: vec![from_row(&row)?],
                resume: None,
            });
        }
        self.close_elicitation(team, id, ApprovalState::Expired)
            .await?;
        Ok(Answered::Closed(Box::new(self.approval(team, id).await?)))
    }

    /// Closes a pending elicitation in `state` (expired, or cancelled by its turn or its
    /// server), unless it was answered first. Answers whether it closed it.
    pub async fn close_elicitation(
        &self,
        team: TeamId,
        id: Uuid,
        state: ApprovalState,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE approvals SET state = $3, answered_at = now() \
             WHERE team_id = $1 AND id = $2 AND kind = 'elicitation' AND state = 'pending'",
        )
        .bind(team.0)
        .bind(id)
        .bind(state.as_str())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}
