//! Workspace snapshots (SPEC W10): one row per (agent, chat), the newest, pointing at
//! bytes in the artifact store. A deleted row (replaced, dropped over the cap, past
//! retention, or cascaded from its agent, chat or team) queues its bytes in
//! `blob_garbage` through a trigger; the sweep deletes them.

use std::time::Duration;

use chrono::{DateTime, Utc};
use protocol::snapshot::SnapshotState;
use protocol::{AgentId, ChatId, SessionId, TeamId};
use sqlx::Row;
use uuid::Uuid;

use super::{Store, StoreError};

/// A snapshot as the API lists it (no storage key).
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct SnapshotRow {
    pub id: Uuid,
    pub chat_id: ChatId,
    /// The session whose idle teardown took it.
    pub session_id: SessionId,
    /// Stored (compressed) size.
    pub size_bytes: i64,
    /// The workspace's size as a tar stream.
    pub unpacked_bytes: i64,
    pub created_at: DateTime<Utc>,
}

/// Where an upload for a session may go: the session is being torn down for idleness and
/// its snapshot was asked for.
#[derive(Clone, Copy, Debug)]
pub struct SnapshotTarget {
    pub team: TeamId,
    pub max_bytes: u64,
}

/// The chat snapshot a new session restores.
#[derive(Clone, Debug)]
pub struct Restorable {
    pub storage_key: String,
    pub unpacked_bytes: u64,
}

/// A snapshot whose bytes are stored, to be recorded.
pub struct NewSnapshot {
    pub id: Uuid,
    pub storage_key: String,
    pub size_bytes: u64,
    pub unpacked_bytes: u64,
}

fn bytes(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Store {
    /// The session's upload target, when its snapshot is `requested` and it is
    /// `terminating`; `None` otherwise (too late, never asked, or already answered).
    pub async fn snapshot_target(
        &self,
        session: SessionId,
    ) -> Result<Option<SnapshotTarget>, StoreError> {
        let row: Option<(Uuid, Option<i64>)> = sqlx::query_as(
            "SELECT team_id, snapshot_max_bytes FROM agent_runtime_sessions
             WHERE id = $1 AND state = 'terminating' AND snapshot_state = 'requested'",
        )
        .bind(session.0)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(team, max)| SnapshotTarget {
            team: TeamId(team),
            max_bytes: max.map_or(0, |m| u64::try_from(m).unwrap_or(0)),
        }))
    }

    /// Records the stored bytes as the chat's snapshot, replacing the previous one, and
    /// the session's snapshot as `stored`, in one transaction. `Conflict` when the
    /// session's snapshot is no longer `requested` (the teardown gave up waiting).
    pub async fn record_snapshot(
        &self,
        session: SessionId,
        snapshot: NewSnapshot,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let owner: Option<(Uuid, Uuid, Uuid)> = sqlx::query_as(
            "UPDATE agent_runtime_sessions SET snapshot_state = 'stored'
             WHERE id = $1 AND state = 'terminating' AND snapshot_state = 'requested'
             RETURNING team_id, agent_id, chat_id",
        )
        .bind(session.0)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((team, agent, chat)) = owner else {
            return Err(StoreError::Conflict("snapshot_not_requested"));
        };
        sqlx::query("DELETE FROM workspace_snapshots WHERE agent_id = $1 AND chat_id = $2")
            .bind(agent)
            .bind(chat)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO workspace_snapshots
                 (id, team_id, agent_id, chat_id, session_id, storage_key, size_bytes, unpacked_bytes)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(snapshot.id)
        .bind(team)
        .bind(agent)
        .bind(chat)
        .bind(session.0)
        .bind(&snapshot.storage_key)
        .bind(bytes(snapshot.size_bytes))
        .bind(bytes(snapshot.unpacked_bytes))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records that no snapshot comes (`over_cap` or `failed`); over the cap, the chat's
    /// previous snapshot is dropped too, so a restore never brings back an older state
    /// than the one the chat last left. `false` when the snapshot was not `requested`.
    pub async fn skip_snapshot(
        &self,
        session: SessionId,
        outcome: SnapshotState,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let owner: Option<(Uuid, Uuid)> = sqlx::query_as(
            "UPDATE agent_runtime_sessions SET snapshot_state = $2
             WHERE id = $1 AND snapshot_state = 'requested'
             RETURNING agent_id, chat_id",
        )
        .bind(session.0)
        .bind(outcome.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let Some((agent, chat)) = owner else {
            return Ok(false);
        };
        if outcome == SnapshotState::OverCap {
            sqlx::query("DELETE FROM workspace_snapshots WHERE agent_id = $1 AND chat_id = $2")
                .bind(agent)
                .bind(chat)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The snapshot a live session restores: its chat's, taken by an earlier session.
    /// Only when the session is of `team` and `agent`, as its token claims.
    pub async fn restorable_snapshot(
        &self,
        session: SessionId,
        team: TeamId,
        agent: AgentId,
    ) -> Result<Option<Restorable>, StoreError> {
        let row: Option<(String, i64)> = sqlx::query_as(
            "SELECT w.storage_key, w.unpacked_bytes
             FROM agent_runtime_sessions s
             JOIN workspace_snapshots w
               ON w.team_id = s.team_id AND w.agent_id = s.agent_id AND w.chat_id = s.chat_id
             WHERE s.id = $1 AND s.team_id = $2 AND s.agent_id = $3 AND w.session_id <> s.id
               AND s.state IN ('pending', 'provisioning', 'connecting', 'ready')",
        )
        .bind(session.0)
        .bind(team.0)
        .bind(agent.0)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(storage_key, unpacked)| Restorable {
            storage_key,
            unpacked_bytes: u64::try_from(unpacked).unwrap_or(0),
        }))
    }

    /// Whether (agent, chat) has a snapshot to restore.
    pub async fn chat_has_snapshot(
        &self,
        team: TeamId,
        agent: AgentId,
        chat: ChatId,
    ) -> Result<bool, StoreError> {
        let found: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM workspace_snapshots WHERE team_id = $1 AND agent_id = $2 AND chat_id = $3",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(chat.0)
        .fetch_optional(&self.pool)
        .await?;
        Ok(found.is_some())
    }

    /// An agent's snapshots, newest first, filtered as `agent_sessions` is. `NotFound` for
    /// another team's agent.
    pub async fn agent_snapshots(
        &self,
        team: TeamId,
        agent: AgentId,
        created_by: Option<&str>,
        with_autostart: bool,
    ) -> Result<Vec<SnapshotRow>, StoreError> {
        self.agent(team, agent).await?;
        let rows = sqlx::query(
            "SELECT id, chat_id, session_id, size_bytes, unpacked_bytes, created_at
             FROM workspace_snapshots w
             WHERE team_id = $1 AND agent_id = $2
               AND ($3::text IS NULL OR EXISTS (SELECT 1 FROM chats c
                    WHERE c.team_id = w.team_id AND c.id = w.chat_id AND c.created_by = $3))
               AND ($4 OR NOT EXISTS (SELECT 1 FROM chats c
                    WHERE c.team_id = w.team_id AND c.id = w.chat_id AND c.autostart))
             ORDER BY created_at DESC LIMIT 100",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(created_by)
        .bind(with_autostart)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(SnapshotRow {
                    id: row.try_get("id")?,
                    chat_id: ChatId(row.try_get("chat_id")?),
                    session_id: SessionId(row.try_get("session_id")?),
                    size_bytes: row.try_get("size_bytes")?,
                    unpacked_bytes: row.try_get("unpacked_bytes")?,
                    created_at: row.try_get("created_at")?,
                })
            })
            .collect()
    }

    /// The bytes a team's snapshots hold in storage now (usage, W10).
    pub async fn snapshot_bytes(&self, team: TeamId) -> Result<i64, StoreError> {
        let total: Option<i64> = sqlx::query_scalar(
            "SELECT SUM(size_bytes)::bigint FROM workspace_snapshots WHERE team_id = $1",
        )
        .bind(team.0)
        .fetch_one(&self.pool)
        .await?;
        Ok(total.unwrap_or(0))
    }

    /// Deletes up to `limit` snapshots older than `retention`; their bytes are queued for
    /// the sweep by the trigger. Returns how many went.
    pub async fn expire_snapshots(
        &self,
        retention: Duration,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM workspace_snapshots WHERE id IN (
                 SELECT id FROM workspace_snapshots
                 WHERE created_at < now() - make_interval(secs => $1)
                 ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind(retention.as_secs_f64())
        .bind(limit)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
