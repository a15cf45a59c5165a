//! AgentRuntimeSession rows (SPEC W1, W2, W6): one live session per (agent, chat).
//!
//! State changes are compare-and-set on the current state, so the brain, the
//! runtime-manager and a second brain replica never overwrite each other's transitions;
//! their statements are the `session_states` crate's, which the runtime-manager shares.

use chrono::{DateTime, Utc};
use protocol::channel::{FailureReason, SessionState};
use protocol::snapshot::SnapshotState;
use protocol::{AgentId, ChatId, ReplicaId, SessionId, TeamId};
use sqlx::Row;

use super::{Store, StoreError, unique_violation};

#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct SessionRow {
    pub id: SessionId,
    pub agent_id: AgentId,
    pub chat_id: ChatId,
    pub profile: String,
    pub state: SessionState,
    pub failure_reason: Option<String>,
    pub failure_detail: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_used_at: DateTime<Utc>,
    /// For a session torn down for idleness, where its workspace snapshot stands (W10).
    pub snapshot_state: Option<SnapshotState>,
}

const COLUMNS: &str = "id, agent_id, chat_id, profile, state, failure_reason, failure_detail, \
    created_at, updated_at, last_used_at, snapshot_state";

fn from_row(row: &sqlx::postgres::PgRow) -> Result<SessionRow, StoreError> {
    let state: String = row.try_get("state")?;
    Ok(SessionRow {
        id: SessionId(row.try_get("id")?),
        agent_id: AgentId(row.try_get("agent_id")?),
        chat_id: ChatId(row.try_get("chat_id")?),
        profile: row.try_get("profile")?,
        state: SessionState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("session state {state}")))?,
        failure_reason: row.try_get("failure_reason")?,
        failure_detail: row.try_get("failure_detail")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        last_used_at: row.try_get("last_used_at")?,
        snapshot_state: row
            .try_get::<Option<String>, _>("snapshot_state")?
            .map(|s| {
                SnapshotState::parse(&s)
                    .ok_or_else(|| StoreError::Corrupt(format!("snapshot state {s}")))
            })
            .transpose()?,
    })
}

/// A session about to be written: whose, on which profile, and whether it is started
/// ahead of its call (W11).
#[derive(Clone, Copy, Debug)]
pub struct NewSession<'a> {
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    pub profile: &'a str,
    pub speculative: bool,
    /// The end user whose turn starts the session, whose budgets it counts against (L4);
    /// `None` for an API key's turn.
    pub user: Option<&'a str>,
}

/// The states from which a session is reused rather than replaced (W1).
const LIVE: &str = "('pending', 'provisioning', 'connecting', 'ready')";

impl Store {
    /// The live session of (agent, chat), if any.
    pub async fn live_session(
        &self,
        team: TeamId,
        agent: AgentId,
        chat: ChatId,
    ) -> Result<Option<SessionRow>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM agent_runtime_sessions \
             WHERE team_id = $1 AND agent_id = $2 AND chat_id = $3 AND state IN {LIVE}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(agent.0)
            .bind(chat.0)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// Writes a `pending` session; `Conflict("live_session")` when (agent, chat) already
    /// has a live one (another call won the race and queued the provision task).
    pub async fn create_session(&self, new: &NewSession<'_>) -> Result<SessionRow, StoreError> {
        let sql = format!(
            "INSERT INTO agent_runtime_sessions \
                (id, team_id, agent_id, chat_id, profile, state, speculative, user_id) \
             VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7) RETURNING {COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(SessionId::new().0)
            .bind(new.team.0)
            .bind(new.agent.0)
            .bind(new.chat.0)
            .bind(new.profile)
            .bind(new.speculative)
            .bind(new.user)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| unique_violation(e, "sessions_live", "live_session"))?;
        from_row(&row)
    }

    /// A session by id, whatever its team (the worker channel knows only the session).
    pub async fn session(&self, id: SessionId) -> Result<SessionRow, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM agent_runtime_sessions WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        from_row(&row)
    }

    /// The handshake of a session's first worker is done: `connecting → ready`, held by
    /// `replica`; `false` when it was not `connecting` (failed or torn down meanwhile).
    pub async fn session_ready(
        &self,
        id: SessionId,
        replica: ReplicaId,
    ) -> Result<bool, StoreError> {
        Ok(session_states::ready(&self.pool, id, replica)
            .await?
            .moved())
    }

    /// A `ready` session's worker dialed again and `replica` took its channel (W9);
    /// `false` when the session is no longer `ready`.
    pub async fn session_redialed(
        &self,
        id: SessionId,
        replica: ReplicaId,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE agent_runtime_sessions SET owner_replica = $2, updated_at = now() \
             WHERE id = $1 AND state = 'ready'",
        )
        .bind(id.0)
        .bind(replica.0)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// `replica` no longer holds the session's channel (a re-dial may take it elsewhere).
    /// A no-op when another replica holds it by now.
    pub async fn session_released(
        &self,
        id: SessionId,
        replica: ReplicaId,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE agent_runtime_sessions SET owner_replica = NULL \
             WHERE id = $1 AND owner_replica = $2",
        )
        .bind(id.0)
        .bind(replica.0)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Fails a live session with a reason (W6); `false` when it had already ended.
    pub async fn fail_session(
        &self,
        id: SessionId,
        reason: FailureReason,
        detail: Option<&str>,
    ) -> Result<bool, StoreError> {
        Ok(session_states::fail_live(&self.pool, id, reason, detail)
            .await?
            .moved())
    }

    /// Fails a session only while it waits for its worker to dial (`connecting`); `false`
    /// in any other state, a `ready` one included.
    pub async fn fail_connecting_session(
        &self,
        id: SessionId,
        reason: FailureReason,
    ) -> Result<bool, StoreError> {
        Ok(session_states::fail_connecting(&self.pool, id, reason)
            .await?
            .moved())
    }

    /// A worker dialed in: the dial timeout (counted from `updated_at` while
    /// `connecting`) stops running while its handshake proceeds.
    pub async fn session_dialed(&self, id: SessionId) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE agent_runtime_sessions SET updated_at = now() \
             WHERE id = $1 AND state = 'connecting'",
        )
        .bind(id.0)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records use, which pushes the idle teardown back (W7).
    pub async fn touch_session(&self, id: SessionId) -> Result<(), StoreError> {
        // A call uses it: a speculative start was followed through (W11).
        sqlx::query(
            "UPDATE agent_runtime_sessions SET last_used_at = now(), speculative = false \
             WHERE id = $1",
        )
        .bind(id.0)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The turn that started `id` speculatively ended without a call using it: unless one
    /// does within `grace`, the runtime-manager tears it down then (W11). `false` when it
    /// was used, or is over.
    pub async fn abandon_speculation(
        &self,
        id: SessionId,
        grace: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE agent_runtime_sessions \
             SET speculation_expires_at = now() + make_interval(secs => $2) \
             WHERE id = $1 AND speculative AND state IN {LIVE}"
        )))
        .bind(id.0)
        .bind(grace.as_secs_f64())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// An agent's sessions, newest first; with `created_by`, only those of that user's
    /// chats; the autostart chat's only `with_autostart` (X1). `NotFound` for another
    /// team's agent.
    pub async fn agent_sessions(
        &self,
        team: TeamId,
        agent: AgentId,
        created_by: Option<&str>,
        with_autostart: bool,
        before: Option<super::Keyset>,
        limit: i64,
    ) -> Result<Vec<SessionRow>, StoreError> {
        self.agent(team, agent).await?;
        let sql = format!(
            "SELECT {COLUMNS} FROM agent_runtime_sessions s \
             WHERE team_id = $1 AND agent_id = $2 \
               AND ($3::text IS NULL OR EXISTS (SELECT 1 FROM chats c \
                    WHERE c.team_id = s.team_id AND c.id = s.chat_id AND c.created_by = $3)) \
               AND ($7 OR NOT EXISTS (SELECT 1 FROM chats c \
                    WHERE c.team_id = s.team_id AND c.id = s.chat_id AND c.autostart)) \
               AND {} ORDER BY created_at DESC, id DESC LIMIT $4",
            super::keyset_after("<", "$5", "$6")
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(agent.0)
            .bind(created_by)
            .bind(limit)
            .bind(before.map(|k| k.at))
            .bind(before.map(|k| k.id))
            .bind(with_autostart)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(from_row).collect()
    }
}
