//! Turns, their frozen composition, their end state and their usage events.
//!
//! Postgres `text` and `jsonb` cannot hold U+0000. What a turn stores that no one checked
//! (model text, tool input and output) has every NUL replaced by U+FFFD, the replacement
//! character, so a command that printed binary still has its answer stored. (Invalid
//! UTF-8 never reaches the brain: the worker decodes output lossily, one U+FFFD per bad
//! sequence, and everything else arrives as JSON text.)

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use protocol::parts::Part;
use protocol::{AgentId, ChatId, ErrorCode, MessageId, ReplicaId, TeamId, TurnId};
use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::Row;
use sqlx::types::Json;
use uuid::Uuid;

use super::chats::{MESSAGE_COLUMNS, message_from_row};
use super::{BasisCheck, MessageRow, Store, StoreError, unique_violation};

/// A composition as it is stored (SPEC T3): its text and the SHA-256 of the text, which
/// keys it among the team's `compositions`. Hashing is most of what rendering a
/// composition costs, so a chat's kept basis keeps the last one made
/// (the brain's `turn::Bases`) and the next turn that renders the same text reuses it.
#[derive(Debug)]
pub struct FrozenComposition {
    text: Box<serde_json::value::RawValue>,
    hash: [u8; 32],
}

impl FrozenComposition {
    pub fn new(text: Box<serde_json::value::RawValue>) -> Self {
        let hash = Sha256::digest(text.get().as_bytes()).into();
        Self { text, hash }
    }

    pub fn text(&self) -> &str {
        self.text.get()
    }

    pub(super) fn hash(&self) -> &[u8] {
        &self.hash
    }
}

/// What a turn's intake writes in one transaction.
#[derive(Debug)]
pub struct NewTurn<'a> {
    /// Chosen by the caller: the hold names the turn before the row exists.
    pub id: TurnId,
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    pub trigger: &'static str,
    /// Started for no client (D1): a hang-up has nothing to cancel.
    pub background: bool,
    /// SPEC T3: frozen before the first provider request; the insert fails as a whole if
    /// it cannot be written, and then no provider is called. Stored once per distinct
    /// text of a team (`compositions`, keyed by its SHA-256).
    pub composition: &'a FrozenComposition,
    /// `None` for a continuation after an approval (A3), which has no user message.
    pub user_parts: Option<&'a [Part]>,
    pub client_message_id: Option<&'a str>,
    /// The brain replica running the turn: if its lease lapses, another replica takes the
    /// turn over (D3).
    pub replica: ReplicaId,
    /// Whose authority the turn's tools act with (X1), kept for a takeover.
    pub actor: &'a str,
    pub actor_admin: bool,
    /// P9: the caller's own instructions for this turn, appended to the agent's prompt
    /// (a continuation carries its asking turn's).
    pub instructions: Option<&'a str>,
}

/// What [`Store::begin_turn`] did.
#[derive(Debug)]
pub enum Begun {
    /// The turn and its message are written: the chat's history, ending with the message.
    History(Vec<MessageRow>),
    /// The kept basis it was asked to check is not current: nothing is written.
    Stale,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnStatus {
    /// T13: accepted while its agent was busy; not started yet.
    Queued,
    Running,
    Completed,
    Interrupted,
    Failed,
    /// T13: stopped while queued; it never ran.
    Withdrawn,
}

impl TurnStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Interrupted => "interrupted",
            Self::Failed => "failed",
            Self::Withdrawn => "withdrawn",
        }
    }

    fn parse(s: &str) -> Result<Self, StoreError> {
        Ok(match s {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "completed" => Self::Completed,
            "interrupted" => Self::Interrupted,
            "failed" => Self::Failed,
            "withdrawn" => Self::Withdrawn,
            other => return Err(StoreError::Corrupt(format!("turn status {other}"))),
        })
    }
}

/// A turn as a retried POST finds it (T12).
#[derive(Clone, Debug)]
pub struct TurnRecord {
    pub id: TurnId,
    pub status: TurnStatus,
    pub error_code: Option<ErrorCode>,
    pub assistant: Option<MessageRow>,
}

/// Where a turn runs and how far it got, as a stop or a resumed stream finds it (T8, S2).
#[derive(Clone, Copy, Debug)]
pub struct TurnState {
    pub id: TurnId,
    pub chat: ChatId,
    pub status: TurnStatus,
    /// The brain replica running it; `None` for turns written before leases existed.
    pub replica: Option<ReplicaId>,
    /// When its row was written, by Postgres' clock.
    pub started_at: DateTime<Utc>,
}

fn turn_state_from_row(row: &sqlx::postgres::PgRow) -> Result<TurnState, StoreError> {
    let replica: Option<Uuid> = row.try_get("replica_id")?;
    Ok(TurnState {
        id: TurnId(row.try_get("id")?),
        chat: ChatId(row.try_get("chat_id")?),
        status: TurnStatus::parse(row.try_get("status")?)?,
        replica: replica.map(ReplicaId),
        started_at: row.try_get("started_at")?,
    })
}

/// How far a turn got, as `GET /v1/turns/{id}` shows it (D1): the stored status, except
/// that a turn stored `completed` while calls of it wait for a person is
/// `awaiting_approval` (answering them starts its continuation, a turn of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnProgress {
    /// Waiting for its agent (T13); `position` says where.
    Queued,
    Running,
    Completed,
    AwaitingApproval,
    Interrupted,
    Failed,
    /// Stopped while queued (T13): it never ran.
    Withdrawn,
}

/// What started a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnTrigger {
    /// A message posted to the chat.
    User,
    /// The agent's cadence (T11).
    Autostart,
    /// The answers to a turn's approvals (A3): it continues that turn.
    Approval,
}

/// A turn of a chat (D1).
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct TurnRow {
    pub id: TurnId,
    pub chat_id: ChatId,
    pub agent_id: AgentId,
    pub status: TurnProgress,
    pub trigger: TurnTrigger,
    /// Run with no client to end it: `"background": true`, an autostart, or an approval
    /// answered through `POST /v1/approvals/{id}`.
    pub background: bool,
    pub started_at: DateTime<Utc>,
    /// `null` while it runs.
    pub ended_at: Option<DateTime<Utc>>,
    /// Why a `failed` turn failed.
    pub error: Option<ErrorCode>,
    /// A `queued` turn's place among its agent's (1 = next, T13); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u32>,
    /// The turn that delegated this one's task with the `delegate` tool (B7); `null`
    /// for a turn nobody delegated.
    pub parent_turn_id: Option<TurnId>,
    /// The turns this one delegated tasks to, oldest first (B7).
    pub children: Vec<TurnId>,
}

/// The columns [`turn_row_from_row`] reads, of `turns t`.
pub(super) const TURN_COLUMNS: &str = "t.id, t.chat_id, t.agent_id, t.status, t.trigger, t.background, \
    t.started_at, t.finished_at, t.error_code, \
    EXISTS (SELECT 1 FROM approvals p WHERE p.team_id = t.team_id AND p.chat_id = t.chat_id \
            AND p.turn_id = t.id AND p.state = 'pending') AS awaiting_approval, \
    CASE WHEN t.status = 'queued' THEN (SELECT count(*) FROM turns q \
      WHERE q.agent_id = t.agent_id AND q.status = 'queued' \
        AND (q.queued_at, q.id) <= (t.queued_at, t.id)) END AS position, \
    t.parent_turn_id, ARRAY(SELECT d.id FROM turns d WHERE d.team_id = t.team_id \
        AND d.parent_turn_id = t.id ORDER BY d.started_at, d.id) AS children";

pub(super) fn turn_row_from_row(row: &sqlx::postgres::PgRow) -> Result<TurnRow, StoreError> {
    let status = match TurnStatus::parse(row.try_get("status")?)? {
        TurnStatus::Completed if row.try_get("awaiting_approval")? => {
            TurnProgress::AwaitingApproval
        }
        TurnStatus::Completed => TurnProgress::Completed,
        TurnStatus::Running => TurnProgress::Running,
        TurnStatus::Interrupted => TurnProgress::Interrupted,
        TurnStatus::Failed => TurnProgress::Failed,
        TurnStatus::Queued => TurnProgress::Queued,
        TurnStatus::Withdrawn => TurnProgress::Withdrawn,
    };
    let trigger = match row.try_get::<&str, _>("trigger")? {
        "user" => TurnTrigger::User,
        "autostart" => TurnTrigger::Autostart,
        "approval" => TurnTrigger::Approval,
        other => return Err(StoreError::Corrupt(format!("turn trigger {other}"))),
    };
    let error: Option<&str> = row.try_get("error_code")?;
    Ok(TurnRow {
        id: TurnId(row.try_get("id")?),
        chat_id: ChatId(row.try_get("chat_id")?),
        agent_id: AgentId(row.try_get("agent_id")?),
        status,
        trigger,
        background: row.try_get("background")?,
        started_at: row.try_get("started_at")?,
        ended_at: row.try_get("finished_at")?,
        error: error.and_then(ErrorCode::parse),
        position: row
            .try_get::<Option<i64>, _>("position")?
            .map(|p| u32::try_from(p).unwrap_or(u32::MAX)),
        parent_turn_id: row
            .try_get::<Option<uuid::Uuid>, _>("parent_turn_id")?
            .map(TurnId),
        children: row
            .try_get::<Vec<uuid::Uuid>, _>("children")?
            .into_iter()
            .map(TurnId)
            .collect(),
    })
}

/// Which turn a background POST's answer names (D1).
#[derive(Clone, Copy, Debug)]
pub enum Started<'a> {
    /// The turn it just started.
    Turn(TurnId),
    /// The turn an earlier POST of this client message id started (T12).
    ClientMessage(&'a str),
}

/// One model call's usage, billed once (E1). Kept in a turn's progress (D2) until then.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCallUsage {
    pub call_index: u32,
    pub model: String,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

/// How a turn ended, written in one transaction.
#[derive(Debug)]
pub struct TurnEnd {
    pub status: TurnStatus,
    pub error_code: Option<ErrorCode>,
    /// Absent for a failed turn (T8: a failed turn persists no assistant message).
    pub assistant: Option<AssistantMessage>,
    pub usage: Vec<ModelCallUsage>,
    /// The turn failed before any output, so its POST was answered with an error: its
    /// user message is deleted with the end state, which frees the client message id
    /// for the retry (and keeps the retried message from appearing twice).
    pub withdraw_user_message: bool,
    /// The calls that wait for a person (A3), written with the message they point into.
    pub approvals: Vec<super::NewApproval>,
}

#[derive(Debug)]
pub struct AssistantMessage {
    pub id: MessageId,
    pub parts: Vec<Part>,
    pub complete: bool,
}

/// `text` with each NUL replaced by U+FFFD: what Postgres can store.
pub fn storable_text(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(text)
    }
}

/// `value` with each NUL of its strings and keys replaced by U+FFFD; copied only when it
/// holds one.
fn storable_json(value: &Value) -> Cow<'_, Value> {
    fn has_nul(value: &Value) -> bool {
        match value {
            Value::String(s) => s.contains('\0'),
            Value::Array(items) => items.iter().any(has_nul),
            Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
            _ => false,
        }
    }
    fn replaced(value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(storable_text(s).into_owned()),
            Value::Array(items) => Value::Array(items.iter().map(replaced).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (storable_text(k).into_owned(), replaced(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    if has_nul(value) {
        Cow::Owned(replaced(value))
    } else {
        Cow::Borrowed(value)
    }
}

/// E1: the billing key of a turn's model call, the same however its end is written.
fn model_call_key(turn: TurnId, call_index: u32) -> String {
    format!("turn:{turn}:model_call:{call_index}")
}

pub(crate) fn tokens(n: Option<u64>) -> Option<i64> {
    n.map(|n| i64::try_from(n).unwrap_or(i64::MAX))
}

impl Store {
    /// Writes the turn (with its composition) and the user message, and answers the chat's
    /// messages after `history_after` ending with the new one. One statement, so one round
    /// trip and an implicit transaction: the intake is on every turn's critical path. The
    /// history scan runs on the statement's snapshot, which cannot see the rows it inserts;
    /// the new message joins it from `RETURNING`. A reused client message id answers
    /// `Conflict("message_id")` and writes nothing.
    ///
    /// With a `check` (a basis this replica kept), the statement first asks on
    /// its own snapshot whether the basis is still current ([`TurnBasis::check`]); when it
    /// is not, it writes nothing and answers [`Begun::Stale`]. With a kept history,
    /// `history_after` is its end, and only what follows it is read.
    ///
    /// The composition is the team's row of its hash, inserted only when missing: the
    /// text is sent as `text` and cast only for an insert, so a known composition costs
    /// Postgres one index probe, no JSON parse and no TOAST write.
    ///
    /// [`TurnBasis::check`]: super::TurnBasis::check
    pub async fn begin_turn(
        &self,
        turn: NewTurn<'_>,
        history_after: i64,
        check: Option<BasisCheck>,
    ) -> Result<Begun, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(BEGIN_TURN.as_str()))
            .bind(turn.id.0)
            .bind(turn.team.0)
            .bind(turn.agent.0)
            .bind(turn.chat.0)
            .bind(turn.trigger)
            .bind(turn.composition.text())
            .bind(MessageId::new().0)
            .bind(turn.user_parts.map(Json))
            .bind(turn.client_message_id)
            .bind(history_after)
            .bind(turn.replica.0)
            .bind(turn.composition.hash())
            .bind(turn.background)
            .bind(turn.actor)
            .bind(turn.actor_admin)
            .bind(check.map(|c| c.versions.chat))
            .bind(check.map(|c| c.versions.agent))
            .bind(check.map(|c| c.has_connectors))
            .bind(check.and_then(|c| c.history).map(|h| h.through))
            .bind(check.and_then(|c| c.history).map(|h| h.count))
            .bind(turn.instructions)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| unique_violation(e, "messages_client_id", "message_id"))?;
        let mut history = Vec::with_capacity(rows.len());
        for row in &rows {
            if !row.try_get::<bool, _>("current")? {
                return Ok(Begun::Stale);
            }
            // A current basis and no history: the one row of NULLs the join leaves.
            if row.try_get::<Option<Uuid>, _>("id")?.is_some() {
                history.push(message_from_row(row)?);
            }
        }
        Ok(Begun::History(history))
    }

    /// A turn of `team` by id; `NotFound` for an unknown one or another team's.
    pub async fn turn_state(&self, team: TeamId, turn: TurnId) -> Result<TurnState, StoreError> {
        let row = sqlx::query(
            "SELECT id, chat_id, status, replica_id, started_at FROM turns \
             WHERE team_id = $1 AND id = $2",
        )
        .bind(team.0)
        .bind(turn.0)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        turn_state_from_row(&row)
    }

    /// The newest running turn of a chat of `team`, `None` when none runs; `NotFound` for
    /// an unknown chat or another team's. One query: the chat and its running turn.
    pub async fn running_turn_of_chat(
        &self,
        team: TeamId,
        chat: ChatId,
    ) -> Result<Option<TurnState>, StoreError> {
        let row = sqlx::query(
            "SELECT c.id AS chat_id, t.id, t.status, t.replica_id, t.started_at FROM chats c \
             LEFT JOIN LATERAL ( \
               SELECT id, status, replica_id, started_at FROM turns \
               WHERE team_id = c.team_id AND chat_id = c.id AND status = 'running' \
               ORDER BY started_at DESC LIMIT 1) t ON true \
             WHERE c.team_id = $1 AND c.id = $2",
        )
        .bind(team.0)
        .bind(chat.0)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        let turn: Option<Uuid> = row.try_get("id")?;
        match turn {
            Some(_) => turn_state_from_row(&row).map(Some),
            None => Ok(None),
        }
    }

    /// P9: the caller's instructions `turn` was composed with (`None` for none, or for
    /// a turn not of `team`), which its continuation after an approval runs with too.
    pub async fn turn_instructions(
        &self,
        team: TeamId,
        turn: TurnId,
    ) -> Result<Option<String>, StoreError> {
        let found: Option<Option<String>> =
            sqlx::query_scalar("SELECT instructions FROM turns WHERE team_id = $1 AND id = $2")
                .bind(team.0)
                .bind(turn.0)
                .fetch_optional(&self.pool)
                .await?;
        Ok(found.flatten())
    }

    /// Records that `parent` delegated the task `child` runs (B7).
    pub async fn set_parent_turn(
        &self,
        team: TeamId,
        child: TurnId,
        parent: TurnId,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE turns SET parent_turn_id = $3 WHERE team_id = $1 AND id = $2")
            .bind(team.0)
            .bind(child.0)
            .bind(parent.0)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A turn of `team` as `GET /v1/turns/{id}` shows it; `NotFound` for an unknown one or
    /// another team's.
    pub async fn turn_row(&self, team: TeamId, turn: TurnId) -> Result<TurnRow, StoreError> {
        let sql = format!("SELECT {TURN_COLUMNS} FROM turns t WHERE t.team_id = $1 AND t.id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(turn.0)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        turn_row_from_row(&row)
    }

    /// A page of a chat's turns, newest first: at most `limit` started before the turn
    /// `before` (a cursor: the last turn of the previous page), and whether older ones
    /// remain. `NotFound` for an unknown chat or another team's.
    pub async fn turn_page(
        &self,
        team: TeamId,
        chat: ChatId,
        before: Option<TurnId>,
        limit: i64,
    ) -> Result<(Vec<TurnRow>, bool), StoreError> {
        // As `message_page`: the chat row first, so that a chat without turns answers one
        // row of NULLs and a missing one none; one extra turn tells whether more remain.
        let sql = format!(
            "SELECT c.id AS chat, page.* FROM chats c LEFT JOIN LATERAL ( \
               SELECT {TURN_COLUMNS} FROM turns t \
               WHERE t.team_id = c.team_id AND t.chat_id = c.id \
                 AND ($3::uuid IS NULL OR (t.started_at, t.id) < \
                      (SELECT started_at, id FROM turns WHERE team_id = c.team_id AND id = $3)) \
               ORDER BY t.started_at DESC, t.id DESC LIMIT $4 + 1) page ON true \
             WHERE c.team_id = $1 AND c.id = $2"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(chat.0)
            .bind(before.map(|t| t.0))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        if rows.is_empty() {
            return Err(StoreError::NotFound);
        }
        let mut page = Vec::with_capacity(rows.len());
        for row in &rows {
            if row.try_get::<Option<Uuid>, _>("id")?.is_some() {
                page.push(turn_row_from_row(row)?);
            }
        }
        let more = page.len() as i64 > limit;
        page.truncate(usize::try_from(limit).unwrap_or(0));
        Ok((page, more))
    }

    /// The turn a background POST names (D1) with its user message's id (`None` for a
    /// turn that withdrew it, failing before any output); `None` when there is no such
    /// turn in the chat.
    pub async fn started_turn(
        &self,
        team: TeamId,
        chat: ChatId,
        which: Started<'_>,
    ) -> Result<Option<(TurnRow, Option<MessageId>)>, StoreError> {
        let base = format!(
            "SELECT {TURN_COLUMNS}, m.id AS message_id FROM turns t \
             LEFT JOIN messages m ON m.team_id = t.team_id AND m.turn_id = t.id AND m.role = 'user'"
        );
        let query = match which {
            Started::Turn(turn) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "{base} WHERE t.team_id = $1 AND t.chat_id = $2 AND t.id = $3"
            )))
            .bind(team.0)
            .bind(chat.0)
            .bind(turn.0),
            Started::ClientMessage(client_id) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "{base} WHERE t.team_id = $1 AND t.chat_id = $2 AND m.client_message_id = $3"
            )))
            .bind(team.0)
            .bind(chat.0)
            .bind(client_id),
        };
        let Some(row) = query.fetch_optional(&self.pool).await? else {
            return Ok(None);
        };
        let message: Option<Uuid> = row.try_get("message_id")?;
        Ok(Some((turn_row_from_row(&row)?, message.map(MessageId))))
    }

    /// The turn a client message id started, with its assistant message if any.
    pub async fn turn_for_client_message(
        &self,
        team: TeamId,
        chat: ChatId,
        client_message_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT t.id, t.status, t.error_code FROM messages m \
             JOIN turns t ON t.id = m.turn_id AND t.team_id = m.team_id \
             WHERE m.team_id = $1 AND m.chat_id = $2 AND m.client_message_id = $3",
        )
        .bind(team.0)
        .bind(chat.0)
        .bind(client_message_id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let id = TurnId(row.try_get("id")?);
        let status = TurnStatus::parse(row.try_get("status")?)?;
        let error_code: Option<String> = row.try_get("error_code")?;
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages \
             WHERE team_id = $1 AND turn_id = $2 AND role = 'assistant' ORDER BY seq DESC LIMIT 1"
        );
        let assistant = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| message_from_row(&r))
            .transpose()?;
        Ok(Some(TurnRecord {
            id,
            status,
            error_code: error_code.as_deref().and_then(ErrorCode::parse),
            assistant,
        }))
    }

    /// Records how a turn ended: status, assistant message and usage (or, for a turn that
    /// failed before any output, the user message withdrawn), all or nothing. One
    /// statement (an implicit transaction, one round trip): it closes every turn. Answers
    /// when its billing events were written (their `created_at`). Written only while `me`
    /// runs the turn (D3's fence): `Conflict("turn_taken_over")` when another replica took
    /// it over, and then nothing is written.
    pub async fn finish_turn(
        &self,
        ids: (TeamId, AgentId, ChatId, TurnId),
        me: ReplicaId,
        end: &TurnEnd,
    ) -> Result<DateTime<Utc>, StoreError> {
        let (team, agent, chat, turn) = ids;
        let assistant = end.assistant.as_ref();
        let parts = assistant
            .map(|m| serde_json::to_value(&m.parts))
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("message parts: {e}")))?;
        let parts = parts.as_ref().map(storable_json);
        let mut ids = Vec::with_capacity(end.usage.len());
        let mut keys = Vec::with_capacity(end.usage.len());
        let mut models = Vec::with_capacity(end.usage.len());
        let mut inputs = Vec::with_capacity(end.usage.len());
        let mut outputs = Vec::with_capacity(end.usage.len());
        for usage in &end.usage {
            ids.push(Uuid::now_v7());
            keys.push(model_call_key(turn, usage.call_index));
            models.push(usage.model.as_str());
            inputs.push(tokens(usage.input_tokens));
            outputs.push(tokens(usage.output_tokens));
        }
        let events = super::webhooks::turn_end_events((team, agent, chat, turn), end);
        let (event_names, event_keys, payloads) = super::webhooks::columns(&events);
        let statement = finish_turn_statement(end);
        let (billed_at, written): (DateTime<Utc>, bool) = sqlx::query_as(statement)
            .bind(team.0)
            .bind(turn.0)
            .bind(end.status.as_str())
            .bind(end.error_code.map(ErrorCode::as_str))
            .bind(assistant.map(|m| m.id.0))
            .bind(chat.0)
            .bind(parts.as_deref())
            .bind(assistant.map(|m| {
                if m.complete {
                    "complete"
                } else {
                    "interrupted"
                }
            }))
            .bind(agent.0)
            .bind(ids)
            .bind(keys)
            .bind(models)
            .bind(inputs)
            .bind(outputs)
            .bind(end.withdraw_user_message)
            .bind(end.approvals.iter().map(|a| a.id).collect::<Vec<_>>())
            .bind(
                end.approvals
                    .iter()
                    .map(|a| a.part_index)
                    .collect::<Vec<_>>(),
            )
            .bind(
                end.approvals
                    .iter()
                    .map(|a| a.tool_call_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                end.approvals
                    .iter()
                    .map(|a| a.tool.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                end.approvals
                    .iter()
                    .map(|a| storable_json(&a.input).into_owned())
                    .collect::<Vec<_>>(),
            )
            .bind(
                end.approvals
                    .iter()
                    .map(|a| a.expires_at)
                    .collect::<Vec<_>>(),
            )
            .bind(me.0)
            .bind(event_names)
            .bind(event_keys)
            .bind(payloads)
            .fetch_one(&self.pool)
            .await?;
        if !written {
            return Err(StoreError::Conflict("turn_taken_over"));
        }
        Ok(billed_at)
    }
}

/// The intake in one statement (see [`Store::begin_turn`]). `v` is the kept basis' check
/// (true without one, `$16` NULL; its history's count only with one, `$19`); every write is conditioned on it, and the history joins
/// only a current one, so a stale basis answers a single row with `current` false.
static BEGIN_TURN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH v AS ( \
           SELECT $16::int8 IS NULL OR EXISTS ( \
             SELECT 1 FROM chats c JOIN agents a ON a.team_id = c.team_id AND a.id = c.agent_id \
             WHERE c.team_id = $2 AND c.id = $4 AND c.basis_version = $16 \
               AND a.basis_version = $17 \
               AND NOT EXISTS (SELECT 1 FROM approvals p WHERE p.team_id = $2 \
                               AND p.chat_id = $4 AND p.state = 'pending') \
               AND EXISTS (SELECT 1 FROM connectors k WHERE k.team_id = $2 \
                           AND (k.agent_id IS NULL OR k.agent_id = $3)) = $18 \
               AND ($19::int8 IS NULL OR $20 = ( \
                 SELECT count(*) FROM messages n WHERE n.team_id = $2 AND n.chat_id = $4 \
                   AND n.seq > c.summary_through AND n.seq <= $19 \
                   AND n.status IN ('complete', 'interrupted')))) AS current), \
         c AS ( \
           INSERT INTO compositions (team_id, hash, body) \
           SELECT $2, $12, $6::text::jsonb FROM v WHERE v.current \
             AND NOT EXISTS (SELECT 1 FROM compositions WHERE team_id = $2 AND hash = $12) \
           ON CONFLICT DO NOTHING), \
         t AS ( \
           INSERT INTO turns (id, team_id, agent_id, chat_id, trigger, status, composition_hash, \
             replica_id, background, actor, actor_admin, instructions) \
           SELECT $1, $2, $3, $4, $5, 'running', $12, $11, $13, $14, $15, $21 FROM v WHERE v.current \
           RETURNING id), \
         m AS ( \
           INSERT INTO messages (id, team_id, chat_id, turn_id, role, parts, status, client_message_id) \
           SELECT $7, $2, $4, t.id, 'user', $8, 'complete', $9 FROM t WHERE $8::jsonb IS NOT NULL \
           RETURNING {MESSAGE_COLUMNS}) \
         SELECT v.current, h.* FROM v LEFT JOIN LATERAL ( \
           SELECT {MESSAGE_COLUMNS} FROM messages WHERE team_id = $2 AND chat_id = $4 AND seq > $10 \
             AND status IN ('complete', 'interrupted') \
           UNION ALL SELECT {MESSAGE_COLUMNS} FROM m) h ON v.current \
         ORDER BY h.seq"
    )
});

/// The end state of a turn in one statement (see [`Store::finish_turn`]), its webhook
/// events (P4) written by the last CTE, in the same transaction as the row they tell about.
///
/// Four texts, by the end's shape: the CTE that withdraws the user message is left out of
/// an end that keeps it, and the one that asks approvals out of an end that asks none
/// (nearly every turn's end: it keeps the message and asks nothing). A CTE that writes
/// nothing still opens its table and every index of it: the two cost up to ~60 µs of
/// Postgres CPU a turn (`make bench-pg`, docs/PERFORMANCE.md). The parameters stay bound
/// either way: sqlx names their types, so one the text does not use is no error.
fn finish_turn_statement(end: &TurnEnd) -> &'static str {
    static TEXTS: std::sync::LazyLock<[String; 4]> = std::sync::LazyLock::new(|| {
        [(false, false), (false, true), (true, false), (true, true)]
            .map(|(withdraw, approvals)| finish_turn_text(withdraw, approvals))
    });
    let index = usize::from(end.withdraw_user_message) * 2 + usize::from(!end.approvals.is_empty());
    &TEXTS[index]
}

fn finish_turn_text(withdraw: bool, approvals: bool) -> String {
    let withdrawal = if withdraw {
        "w AS ( \
           DELETE FROM messages \
           WHERE team_id = $1 AND turn_id = $2 AND role = 'user' AND $15 \
             AND EXISTS (SELECT 1 FROM t)), "
    } else {
        ""
    };
    let asked = if approvals {
        "a AS ( \
           INSERT INTO approvals (id, team_id, agent_id, chat_id, turn_id, message_id, \
             part_index, tool_call_id, tool, input, state, expires_at) \
           SELECT a.id, $1, $9, $6, $2, $5, a.idx, a.call, a.tool, a.input, 'pending', a.exp \
           FROM unnest($16::uuid[], $17::int4[], $18::text[], $19::text[], $20::jsonb[], \
             $21::timestamptz[]) AS a(id, idx, call, tool, input, exp) \
           WHERE EXISTS (SELECT 1 FROM t)), "
    } else {
        ""
    };
    format!(
        "WITH t AS ( \
           UPDATE turns SET status = $3, error_code = $4, finished_at = now() \
           WHERE team_id = $1 AND id = $2 AND replica_id = $22 RETURNING id), \
         m AS ( \
           INSERT INTO messages (id, team_id, chat_id, turn_id, role, parts, status) \
           SELECT $5, $1, $6, $2, 'assistant', $7, $8 FROM t WHERE $5::uuid IS NOT NULL), \
         u AS ( \
           INSERT INTO billing_events \
             (id, team_id, agent_id, turn_id, event_key, kind, model, input_tokens, output_tokens) \
           SELECT u.id, $1, $9, $2, u.key, 'model_call', u.model, u.input, u.output \
           FROM unnest($10::uuid[], $11::text[], $12::text[], $13::int8[], $14::int8[]) \
             AS u(id, key, model, input, output) \
           WHERE EXISTS (SELECT 1 FROM t) \
           ON CONFLICT (event_key) DO NOTHING), \
         {withdrawal}{asked}o AS ({}) \
         SELECT now(), EXISTS (SELECT 1 FROM t)",
        super::webhooks::subscribed_insert("$1", "$23", "$24", "$25", "EXISTS (SELECT 1 FROM t)")
    )
}

impl Store {
    /// The least a turn's end can be: `failed` with `code`, nothing else, and only while
    /// it is still `running`. Written when the whole end state cannot be, so no turn stays
    /// `running` (and its message id answering `turn_in_progress`) while this process
    /// lives. Only while `me` runs it (D3's fence). Answers whether the row changed.
    pub async fn fail_turn(
        &self,
        team: TeamId,
        turn: TurnId,
        me: ReplicaId,
        code: ErrorCode,
    ) -> Result<bool, StoreError> {
        // Its `turn.failed` webhook event (P4) commits with it or not at all.
        let mut tx = self.pool.begin().await?;
        let failed: Option<(Uuid, Uuid)> = sqlx::query_as(
            "UPDATE turns SET status = 'failed', error_code = $3, finished_at = now() \
             WHERE team_id = $1 AND id = $2 AND status = 'running' AND replica_id = $4 \
             RETURNING agent_id, chat_id",
        )
        .bind(team.0)
        .bind(turn.0)
        .bind(code.as_str())
        .bind(me.0)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((agent, chat)) = failed else {
            return Ok(false);
        };
        let event = super::webhooks::turn_event(
            (team, AgentId(agent), ChatId(chat), turn),
            TurnStatus::Failed,
            Some(code),
        );
        if let Some(event) = event {
            super::webhooks::enqueue(&mut *tx, team, event.event, &event.key, &event.data).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Bills a turn's model calls without its end state (which could not be written), under
    /// the keys the end state would have used, so a later write of either bills once.
    /// Answers when the last was written (`None`: there was none).
    pub async fn record_model_calls(
        &self,
        team: TeamId,
        agent: AgentId,
        turn: TurnId,
        usage: &[ModelCallUsage],
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let mut billed_at = None;
        for call in usage {
            let key = model_call_key(turn, call.call_index);
            billed_at = Some(insert_usage(&self.pool, team, agent, turn, &key, call).await?);
        }
        Ok(billed_at)
    }

    /// Records one model call made outside a turn's own loop (the summarizer), once per
    /// `event_key`.
    pub async fn record_usage(
        &self,
        team: TeamId,
        agent: AgentId,
        turn: TurnId,
        event_key: &str,
        usage: &ModelCallUsage,
    ) -> Result<(), StoreError> {
        insert_usage(&self.pool, team, agent, turn, event_key, usage).await?;
        Ok(())
    }

    /// The input and output tokens billed to `turn` (E1), which started at `since`: its
    /// billing events are read through the team's index from the turn's start, not by a
    /// scan for the turn.
    pub async fn turn_tokens(
        &self,
        team: TeamId,
        turn: TurnId,
        since: DateTime<Utc>,
    ) -> Result<(i64, i64), StoreError> {
        let (input, output): (i64, i64) = sqlx::query_as(
            "SELECT coalesce(sum(input_tokens), 0)::bigint, \
                    coalesce(sum(output_tokens), 0)::bigint \
             FROM billing_events WHERE team_id = $1 AND created_at >= $2 AND turn_id = $3",
        )
        .bind(team.0)
        .bind(since)
        .bind(turn.0)
        .fetch_one(&self.pool)
        .await?;
        Ok((input, output))
    }
}

/// E1: a usage event lands once per `event_key`, however often the write is retried.
/// Answers when it was written (now, for a retry).
async fn insert_usage(
    pool: &dbpool::Db,
    team: TeamId,
    agent: AgentId,
    turn: TurnId,
    event_key: &str,
    usage: &ModelCallUsage,
) -> Result<DateTime<Utc>, StoreError> {
    let (at,): (DateTime<Utc>,) = sqlx::query_as(
        "WITH i AS ( \
           INSERT INTO billing_events \
             (id, team_id, agent_id, turn_id, event_key, kind, model, input_tokens, \
              output_tokens) \
           VALUES ($1, $2, $3, $4, $5, 'model_call', $6, $7, $8) \
           ON CONFLICT (event_key) DO NOTHING) \
         SELECT now()",
    )
    .bind(Uuid::now_v7())
    .bind(team.0)
    .bind(agent.0)
    .bind(turn.0)
    .bind(event_key)
    .bind(&usage.model)
    .bind(tokens(usage.input_tokens))
    .bind(tokens(usage.output_tokens))
    .fetch_one(pool)
    .await?;
    Ok(at)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn nul_becomes_the_replacement_character() {
        assert_eq!(storable_text("a\0b\0"), "a\u{FFFD}b\u{FFFD}");
        assert!(matches!(storable_text("clean"), Cow::Borrowed(_)));
        let parts = json!([{"note": "x\u{0}y", "n": 1, "k\u{0}": ["\u{0}"]}]);
        assert_eq!(
            storable_json(&parts).into_owned(),
            json!([{"note": "x\u{FFFD}y", "n": 1, "k\u{FFFD}": ["\u{FFFD}"]}])
        );
        let clean = json!({"a": ["b", 1, null]});
        assert!(matches!(storable_json(&clean), Cow::Borrowed(_)));
    }
}
