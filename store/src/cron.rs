//! An agent's autostart (SPEC T11): its cadence and prompt, as the cron tools and
//! `PATCH /v1/agents/{id}` change them, and the scheduler's claims and fire records.
//!
//! Changing or clearing the cadence also drops the agent's pending autostart firings: a
//! firing planned under the old cadence must not run under the new one.
//!
//! **Exactly once:** a tick is claimed by one statement that moves the agent's
//! `autostart_next_fire_at` forward only if it still holds the value the poll read (and
//! the cadence is the one the poll read), and inserts the tick's `scheduled_tasks` row in
//! the same statement. Two replicas that saw the same tick race on the agent's row: the
//! second finds it moved and claims nothing. The row's unique `(agent, kind, due_at)` is
//! the backstop.

use chrono::{DateTime, Utc};
use protocol::{AgentId, ChatId, ErrorCode, TeamId, TurnId};
use sqlx::Row;
use uuid::Uuid;

use super::audit::{self, Action, Actor};
use super::{Store, StoreError};

/// An agent's autostart: its cron expression, its time zone and the prompt each firing
/// sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Autostart {
    pub cron: String,
    pub prompt: String,
    /// IANA name; `None` is UTC.
    pub timezone: Option<String>,
    /// Who set it (`Authority::actor`); `None` for one set before it was recorded.
    pub set_by: Option<String>,
}

/// An autostart with its next tick (`None`: it never fires again).
pub type AutostartAt = (Autostart, Option<DateTime<Utc>>);

/// An agent whose next tick is due, as a poll read it.
#[derive(Clone, Debug)]
pub struct DueAutostart {
    pub team: TeamId,
    pub agent: AgentId,
    pub cron: String,
    pub timezone: Option<String>,
    pub prompt: String,
    /// Who set it; its turns act with that principal's authority (admin, since only an
    /// admin may set one) or, for `None`, with a chat principal's.
    pub set_by: Option<String>,
    /// The value the claim compares against; `None` for a cadence set before the
    /// scheduler existed, never computed.
    pub next_fire_at: Option<DateTime<Utc>>,
}

/// A claimed tick: its row and the chat its turn runs in.
#[derive(Clone, Copy, Debug)]
pub struct Claimed {
    pub task: Uuid,
    pub chat: ChatId,
}

/// What a claimed tick became.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FireOutcome {
    Fired(TurnId),
    /// The agent was running another turn, which went on undisturbed.
    SkippedBusy,
    /// The turn could not start (a quota, the store, every model route): its code.
    Failed(ErrorCode),
}

/// `GET /v1/agents/{id}/schedule`'s content.
#[derive(Clone, Debug)]
pub struct ScheduleView {
    pub cron: Option<String>,
    pub timezone: Option<String>,
    pub next_fire_at: Option<DateTime<Utc>>,
    /// Why the cadence does not fire until an admin sets it again (`setter_revoked`).
    pub paused: Option<String>,
    pub fires: Vec<FireRow>,
}

#[derive(Clone, Debug)]
pub struct FireRow {
    pub scheduled_for: DateTime<Utc>,
    /// `fired`, `skipped_busy` or `failed`.
    pub outcome: String,
    pub turn_id: Option<TurnId>,
    pub chat_id: Option<ChatId>,
    pub error_code: Option<String>,
}

const DUE_COLUMNS: &str = "team_id, id, autostart_cron, autostart_timezone, autostart_prompt, autostart_set_by, \
     autostart_next_fire_at";

fn due_from_row(row: &sqlx::postgres::PgRow) -> Result<DueAutostart, sqlx::Error> {
    Ok(DueAutostart {
        team: TeamId(row.try_get("team_id")?),
        agent: AgentId(row.try_get("id")?),
        cron: row.try_get("autostart_cron")?,
        timezone: row.try_get("autostart_timezone")?,
        prompt: row.try_get("autostart_prompt")?,
        set_by: row.try_get("autostart_set_by")?,
        next_fire_at: row.try_get("autostart_next_fire_at")?,
    })
}

impl Store {
    /// Sets (`Some`, with its next tick) or clears (`None`) the agent's autostart.
    /// `NotFound` for an unknown or archived agent, or another team's.
    pub async fn set_autostart(
        &self,
        team: TeamId,
        agent: AgentId,
        autostart: Option<&AutostartAt>,
        by: &Actor,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE agents SET autostart_cron = $3, autostart_prompt = $4, \
             autostart_timezone = $5, autostart_next_fire_at = $6, autostart_set_by = $7, \
             autostart_paused = NULL, updated_at = now() \
             WHERE team_id = $1 AND id = $2 AND archived_at IS NULL",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(autostart.map(|(a, _)| a.cron.as_str()))
        .bind(autostart.map(|(a, _)| a.prompt.as_str()))
        .bind(autostart.and_then(|(a, _)| a.timezone.as_deref()))
        .bind(autostart.and_then(|(_, next)| *next))
        .bind(autostart.and_then(|(a, _)| a.set_by.as_deref()))
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            return Err(StoreError::NotFound);
        }
        drop_pending_firings(&mut tx, team, agent).await?;
        let (action, details) = match autostart {
            Some((a, _)) => (
                Action::ToolCronSet,
                serde_json::json!({ "cron": a.cron, "timezone": a.timezone }),
            ),
            None => (Action::ToolCronRemove, serde_json::json!({})),
        };
        audit::record(&mut tx, team, by, action, agent, details).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The agent's autostart, if both cadence and prompt are set.
    pub async fn autostart(
        &self,
        team: TeamId,
        agent: AgentId,
    ) -> Result<Option<Autostart>, StoreError> {
        type Row = (
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
        );
        let row: Row = sqlx::query_as(
            "SELECT autostart_cron, autostart_prompt, autostart_timezone, autostart_set_by \
             FROM agents WHERE team_id = $1 AND id = $2",
        )
        .bind(team.0)
        .bind(agent.0)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        Ok(match row {
            (Some(cron), Some(prompt), timezone, set_by) => Some(Autostart {
                cron,
                prompt,
                timezone,
                set_by,
            }),
            _ => None,
        })
    }

    /// Up to `limit` agents whose next tick is at or before `now`, earliest first: one read
    /// of the partial index `agents_autostart_due`. `now` is the scheduler's clock, the one
    /// the ticks were computed on, not Postgres' (a test pins it across a month's edge). A
    /// disabled team's agents do not fire (L1); their ticks wait for the team to be enabled
    /// again.
    pub async fn due_autostarts(
        &self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<DueAutostart>, StoreError> {
        let sql = format!(
            "SELECT {DUE_COLUMNS} FROM agents \
             WHERE autostart_next_fire_at <= $2 AND archived_at IS NULL \
               AND autostart_cron IS NOT NULL AND autostart_prompt IS NOT NULL \
               AND autostart_paused IS NULL \
               AND NOT EXISTS (SELECT 1 FROM teams t \
                               WHERE t.id = agents.team_id AND t.disabled_at IS NOT NULL) \
             ORDER BY autostart_next_fire_at LIMIT $1"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(limit)
            .bind(now)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| due_from_row(r).map_err(StoreError::from))
            .collect()
    }

    /// Agents with a cadence but no next tick: set before the scheduler existed. Read once
    /// when a scheduler starts (no index: it is a one-off scan).
    pub async fn unscheduled_autostarts(&self) -> Result<Vec<DueAutostart>, StoreError> {
        let sql = format!(
            "SELECT {DUE_COLUMNS} FROM agents \
             WHERE autostart_next_fire_at IS NULL AND archived_at IS NULL \
               AND autostart_cron IS NOT NULL AND autostart_prompt IS NOT NULL \
               AND autostart_paused IS NULL"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| due_from_row(r).map_err(StoreError::from))
            .collect()
    }

    /// Moves the agent's next tick from what `due` read to `next` without a firing (a
    /// cadence that no longer parses is switched off with `None`); `false` when another
    /// writer moved it first.
    pub async fn reschedule_autostart(
        &self,
        due: &DueAutostart,
        next: Option<DateTime<Utc>>,
    ) -> Result<bool, StoreError> {
        let moved = sqlx::query(
            "UPDATE agents SET autostart_next_fire_at = $4 \
             WHERE team_id = $1 AND id = $2 AND autostart_cron = $3 \
               AND autostart_next_fire_at IS NOT DISTINCT FROM $5 \
               AND autostart_timezone IS NOT DISTINCT FROM $6",
        )
        .bind(due.team.0)
        .bind(due.agent.0)
        .bind(&due.cron)
        .bind(next)
        .bind(due.next_fire_at)
        .bind(due.timezone.as_deref())
        .execute(&self.pool)
        .await?;
        Ok(moved.rows_affected() == 1)
    }

    /// Claims the tick `scheduled_for` of `due` and moves the agent's next tick to `next`,
    /// in one statement (see the module doc); creates the agent's autostart chat on its
    /// first claim. `None` when another replica claimed it, or the cadence changed since
    /// the poll.
    pub async fn claim_autostart(
        &self,
        due: &DueAutostart,
        scheduled_for: DateTime<Utc>,
        next: Option<DateTime<Utc>>,
    ) -> Result<Option<Claimed>, StoreError> {
        let new_chat = ChatId::new();
        // The chat row and the agent's pointer to it are written by one statement, so an
        // agent never names a chat that does not exist. X1: the pointer is kept only while
        // it names this agent's own autostart chat; an erased one (or an id re-created
        // since under another agent, or as a chat others write) is replaced by a new chat.
        let row = sqlx::query(
            "WITH moved AS ( \
                 UPDATE agents SET autostart_next_fire_at = $4, \
                        autostart_chat_id = CASE WHEN EXISTS ( \
                            SELECT 1 FROM chats c WHERE c.id = agents.autostart_chat_id \
                              AND c.team_id = agents.team_id AND c.agent_id = agents.id \
                              AND c.autostart) \
                          THEN autostart_chat_id ELSE $7 END \
                 WHERE team_id = $1 AND id = $2 AND autostart_cron = $3 \
                   AND autostart_next_fire_at = $5 AND archived_at IS NULL \
                   AND autostart_timezone IS NOT DISTINCT FROM $9 \
                   AND NOT EXISTS (SELECT 1 FROM teams t \
                                   WHERE t.id = $1 AND t.disabled_at IS NOT NULL) \
                 RETURNING team_id, id, autostart_chat_id), \
             created AS ( \
                 INSERT INTO chats (id, team_id, agent_id, title, autostart) \
                 SELECT autostart_chat_id, team_id, id, 'autostart', true FROM moved \
                 WHERE autostart_chat_id = $7) \
             INSERT INTO scheduled_tasks (id, team_id, agent_id, kind, due_at, state, chat_id) \
             SELECT $6, team_id, id, 'autostart', $8, 'running', autostart_chat_id FROM moved \
             ON CONFLICT (agent_id, kind, due_at) DO NOTHING \
             RETURNING id, chat_id",
        )
        .bind(due.team.0)
        .bind(due.agent.0)
        .bind(&due.cron)
        .bind(next)
        .bind(due.next_fire_at)
        .bind(Uuid::now_v7())
        .bind(new_chat.0)
        .bind(scheduled_for)
        .bind(due.timezone.as_deref())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(Claimed {
                task: r.try_get("id")?,
                chat: ChatId(r.try_get("chat_id")?),
            })
        })
        .transpose()
    }

    /// Pauses the agent's cadence for `reason` (X1: `setter_revoked`) until an admin sets
    /// it again, unless it was set again since `due` was read.
    pub async fn pause_autostart(
        &self,
        due: &DueAutostart,
        reason: ErrorCode,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE agents SET autostart_paused = $3, autostart_next_fire_at = NULL \
             WHERE team_id = $1 AND id = $2 AND autostart_set_by IS NOT DISTINCT FROM $4 \
               AND autostart_cron = $5",
        )
        .bind(due.team.0)
        .bind(due.agent.0)
        .bind(reason.as_str())
        .bind(due.set_by.as_deref())
        .bind(&due.cron)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records what the claimed tick `task` became. A failed tick is also the team's
    /// `autostart.failed` webhook event (P4), written in the same transaction.
    pub async fn record_fire(&self, task: Uuid, outcome: FireOutcome) -> Result<(), StoreError> {
        let (state, turn, code) = match outcome {
            FireOutcome::Fired(turn) => ("fired", Some(turn.0), None),
            FireOutcome::SkippedBusy => ("skipped_busy", None, None),
            FireOutcome::Failed(code) => ("failed", None, Some(code.as_str())),
        };
        let mut tx = self.pool.begin().await?;
        let recorded: Option<(Uuid, Uuid, Option<Uuid>, DateTime<Utc>)> = sqlx::query_as(
            "UPDATE scheduled_tasks SET state = $2, turn_id = $3, error_code = $4 WHERE id = $1 \
             RETURNING team_id, agent_id, chat_id, due_at",
        )
        .bind(task)
        .bind(state)
        .bind(turn)
        .bind(code)
        .fetch_optional(&mut *tx)
        .await?;
        if let (Some((team, agent, chat, due_at)), Some(code)) = (recorded, code) {
            let data = serde_json::json!({
                "agent_id": agent,
                "chat_id": chat,
                "scheduled_for": due_at,
                "error_code": code,
            });
            super::webhooks::enqueue(
                &mut *tx,
                TeamId(team),
                super::webhooks::WebhookEvent::AutostartFailed,
                &task.to_string(),
                &data,
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The agent's cadence and its latest `limit` recorded fires, newest first; a tick
    /// still starting (`running`) is not shown yet. `NotFound` for another team's agent.
    pub async fn schedule(
        &self,
        team: TeamId,
        agent: AgentId,
        limit: i64,
    ) -> Result<ScheduleView, StoreError> {
        type Head = (
            Option<String>,
            Option<String>,
            Option<DateTime<Utc>>,
            Option<String>,
        );
        let head: Head = sqlx::query_as(
            "SELECT autostart_cron, autostart_timezone, autostart_next_fire_at, autostart_paused \
             FROM agents WHERE team_id = $1 AND id = $2",
        )
        .bind(team.0)
        .bind(agent.0)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        let rows = sqlx::query(
            "SELECT due_at, state, turn_id, chat_id, error_code FROM scheduled_tasks \
             WHERE agent_id = $1 AND team_id = $2 AND kind = 'autostart' \
               AND state IN ('fired', 'skipped_busy', 'failed') \
             ORDER BY due_at DESC LIMIT $3",
        )
        .bind(agent.0)
        .bind(team.0)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        let fires = rows
            .iter()
            .map(|r| {
                Ok(FireRow {
                    scheduled_for: r.try_get("due_at")?,
                    outcome: r.try_get("state")?,
                    turn_id: r.try_get::<Option<Uuid>, _>("turn_id")?.map(TurnId),
                    chat_id: r.try_get::<Option<Uuid>, _>("chat_id")?.map(ChatId),
                    error_code: r.try_get("error_code")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(ScheduleView {
            cron: head.0,
            timezone: head.1,
            next_fire_at: head.2,
            paused: head.3,
            fires,
        })
    }
}

/// Firings planned under a cadence that just changed.
pub(super) async fn drop_pending_firings(
    tx: &mut sqlx::PgConnection,
    team: TeamId,
    agent: AgentId,
) -> Result<(), StoreError> {
    sqlx::query(
        "DELETE FROM scheduled_tasks \
         WHERE team_id = $1 AND agent_id = $2 AND kind = 'autostart' AND state = 'pending'",
    )
    .bind(team.0)
    .bind(agent.0)
    .execute(tx)
    .await?;
    Ok(())
}
