//! Retention (L6): a team's `retention_days`, and the batches its sweep deletes. Each
//! batch is one statement (or one transaction), so a sweep cut off part way has deleted
//! whole batches only and the next one goes on where it stopped.

use protocol::TeamId;
use uuid::Uuid;

use super::{Store, StoreError};

/// The advisory lock one sweeping replica holds at a time.
const SWEEP_LOCK: i64 = 0x4c36_5245_5445_4e54; // "L6RETENT"

impl Store {
    /// The team's retention in days; `None` keeps everything.
    pub async fn retention_days(&self, team: TeamId) -> Result<Option<i32>, StoreError> {
        let row: Option<Option<i32>> =
            sqlx::query_scalar("SELECT retention_days FROM teams WHERE id = $1")
                .bind(team.0)
                .fetch_optional(&self.pool)
                .await?;
        row.ok_or(StoreError::NotFound)
    }

    /// Sets (or, with `None`, clears) the team's retention.
    pub async fn set_retention_days(
        &self,
        team: TeamId,
        days: Option<i32>,
    ) -> Result<(), StoreError> {
        let done = sqlx::query("UPDATE teams SET retention_days = $2 WHERE id = $1")
            .bind(team.0)
            .bind(days)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    /// The teams with a retention, and theirs, that are not erased.
    pub async fn retained_teams(&self) -> Result<Vec<(TeamId, i32)>, StoreError> {
        let rows: Vec<(Uuid, i32)> = sqlx::query_as(
            "SELECT id, retention_days FROM teams
             WHERE retention_days IS NOT NULL AND erasing_at IS NULL",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, days)| (TeamId(id), days))
            .collect())
    }

    /// Takes the sweep's advisory lock in a transaction of its own, held until the answer
    /// is dropped (the transaction rolls back) or the process dies (its connection ends
    /// and the transaction with it). `None` while another replica sweeps. A lock of the
    /// transaction, not of the session: behind a transaction pooler (O5) a session lock
    /// stays on whichever server connection took it, for that connection's next client.
    pub async fn take_retention_lock(&self) -> Result<Option<RetentionLock>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
            .bind(SWEEP_LOCK)
            .fetch_one(&mut *tx)
            .await?;
        Ok(taken.then_some(RetentionLock { _tx: tx }))
    }

    /// Deletes up to `limit` turns of `team` that ended more than `days` days ago, with
    /// their messages and approvals. A chat whose summary covered a deleted message loses
    /// its summary (it would hold their text), and its summary starts after them. Answers
    /// how many turns and messages went.
    pub async fn expire_turns(
        &self,
        team: TeamId,
        days: i32,
        limit: i64,
    ) -> Result<(u64, u64), StoreError> {
        let mut tx = self.pool.begin().await?;
        let turns: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM turns
             WHERE team_id = $1 AND finished_at < now() - make_interval(days => $2)
             LIMIT $3 FOR UPDATE SKIP LOCKED",
        )
        .bind(team.0)
        .bind(days)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        if turns.is_empty() {
            return Ok((0, 0));
        }
        let messages: i64 = sqlx::query_scalar(
            "WITH gone AS (
                 DELETE FROM messages WHERE team_id = $1 AND turn_id = ANY($2)
                 RETURNING chat_id, seq),
             last AS (SELECT chat_id, max(seq) AS seq FROM gone GROUP BY chat_id),
             cleared AS (
                 UPDATE chats c SET summary = '', summary_through = last.seq
                 FROM last WHERE c.team_id = $1 AND c.id = last.chat_id
                   AND c.summary_through > 0
                 RETURNING c.id)
             SELECT count(*) FROM gone",
        )
        .bind(team.0)
        .bind(&turns)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM approvals WHERE team_id = $1 AND turn_id = ANY($2)")
            .bind(team.0)
            .bind(&turns)
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query("DELETE FROM turns WHERE team_id = $1 AND id = ANY($2)")
            .bind(team.0)
            .bind(&turns)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok((done.rows_affected(), u64::try_from(messages).unwrap_or(0)))
    }

    /// Deletes up to `limit` artifacts, workspace snapshots or chat files of `team` made more than
    /// `days` days ago (their bytes queued in `blob_garbage`); answers their storage keys.
    pub async fn expire_blobs(
        &self,
        kind: Expiring,
        team: TeamId,
        days: i32,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        let table = match kind {
            Expiring::Artifacts => "artifacts",
            Expiring::Snapshots => "workspace_snapshots",
            Expiring::ChatFiles => "chat_files",
        };
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE id IN (
                 SELECT id FROM {table}
                 WHERE team_id = $1 AND created_at < now() - make_interval(days => $2)
                 LIMIT $3 FOR UPDATE SKIP LOCKED)
             RETURNING storage_key"
        )))
        .bind(team.0)
        .bind(days)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }
}

/// What of a team's files past its retention [`Store::expire_blobs`] deletes.
#[derive(Clone, Copy, Debug)]
pub enum Expiring {
    Artifacts,
    Snapshots,
    /// Files people attached to chats (T21).
    ChatFiles,
}

impl Expiring {
    /// The `kind` label of `brain_retention_deleted_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Artifacts => "artifact",
            Self::Snapshots => "snapshot",
            Self::ChatFiles => "chat_file",
        }
    }
}

/// The retention sweep's advisory lock, released when dropped: the open transaction that
/// holds it (one connection of the pool, for the pass) rolls back.
pub struct RetentionLock {
    _tx: sqlx::Transaction<'static, sqlx::Postgres>,
}
