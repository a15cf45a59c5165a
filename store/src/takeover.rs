//! Durable turns (D2, D3): a turn's progress at its last completed step, written by the
//! replica that runs it and fenced by its id, and the takeover of a dead replica's turns
//! by a live one.
//!
//! The fence is the turn row's `replica_id`: a takeover moves it to the new replica, and
//! every later write of the turn (its progress, its end state) names the replica that
//! makes it. A replica that was only cut off (not dead) and comes back finds its writes
//! refused and stops, so one turn never runs on two replicas past a step boundary.

use protocol::{AgentId, ChatId, ReplicaId, TeamId, TurnId};
use serde_json::Value;
use sqlx::Row;

use super::{Store, StoreError};

/// A turn this replica took over.
#[derive(Clone, Copy, Debug)]
pub struct TakenOver {
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    pub turn: TurnId,
    /// False when the turn had been taken over as often as it may be: it was ended
    /// `failed` (`takeover_limit`) instead, and only its hold is left to free.
    pub runs: bool,
    /// Handed over by a draining replica (D4) rather than left by a dead one: it does
    /// not count toward the limit.
    pub handed_over: bool,
}

/// What a taken-over turn continues from.
#[derive(Debug)]
pub struct Resumable {
    /// The frozen composition (T3), as stored.
    pub composition: Value,
    /// The progress at its last completed step; `None` when it died in its first step.
    pub progress: Option<Value>,
    /// Whose authority its tools act with (X1).
    pub actor: Option<String>,
    pub actor_admin: bool,
    pub takeovers: i32,
}

impl Store {
    /// O5: whether an agent's hold naming `turn`, taken by `replica`, was left behind: the
    /// replica's lease is gone (lapsed or given up) and the turn is not running. A running
    /// turn of a lost replica is the takeover's, which adopts its hold (D3).
    pub async fn hold_left_behind(
        &self,
        team: TeamId,
        turn: TurnId,
        replica: ReplicaId,
    ) -> Result<bool, StoreError> {
        let left: bool = sqlx::query_scalar(
            "SELECT NOT EXISTS (SELECT 1 FROM replicas WHERE id = $3 AND lease_until > now()) \
               AND NOT EXISTS (SELECT 1 FROM turns \
                 WHERE team_id = $1 AND id = $2 AND status = 'running')",
        )
        .bind(team.0)
        .bind(turn.0)
        .bind(replica.0)
        .fetch_one(&self.pool)
        .await?;
        Ok(left)
    }

    /// D2: the turn's progress, written only while `me` runs it. False when another
    /// replica took it over: the caller must stop.
    pub async fn save_progress(
        &self,
        team: TeamId,
        turn: TurnId,
        me: ReplicaId,
        progress: &Value,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE turns SET progress = $4 \
             WHERE team_id = $1 AND id = $2 AND replica_id = $3 AND status = 'running'",
        )
        .bind(team.0)
        .bind(turn.0)
        .bind(me.0)
        .bind(progress)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// D3: takes over up to `limit` running turns whose replica holds no live lease (a
    /// lapsed lease, or a row already gone) or that a draining replica handed over (D4),
    /// oldest first; a turn taken over `max` times
    /// already is ended `failed` (`takeover_limit`) instead. `SKIP LOCKED`: two replicas
    /// sweeping at once take disjoint turns. Turns of this replica are never taken, even
    /// if its own lease lapsed while the database was unreachable: it is alive and runs
    /// them itself.
    pub async fn take_over_orphaned_turns(
        &self,
        me: ReplicaId,
        limit: i64,
        max: i32,
    ) -> Result<Vec<TakenOver>, StoreError> {
        let rows = sqlx::query(
            "WITH orphans AS ( \
               SELECT t.id, t.replica_id IS NULL AS handed FROM turns t \
               WHERE t.status = 'running' \
                 AND (t.replica_id IS NULL OR (t.replica_id <> $1 \
                   AND NOT EXISTS (SELECT 1 FROM replicas r \
                                   WHERE r.id = t.replica_id AND r.lease_until > now()))) \
               ORDER BY t.started_at LIMIT $2 \
               FOR UPDATE OF t SKIP LOCKED), \
             judged AS ( \
               SELECT o.id, o.handed, NOT o.handed AND t.takeovers >= $3 AS spent \
               FROM orphans o JOIN turns t ON t.id = o.id) \
             UPDATE turns t SET replica_id = $1, \
               takeovers = t.takeovers + CASE WHEN j.handed THEN 0 ELSE 1 END, \
               status = CASE WHEN j.spent THEN 'failed' ELSE 'running' END, \
               error_code = CASE WHEN j.spent THEN 'takeover_limit' END, \
               finished_at = CASE WHEN j.spent THEN now() END \
             FROM judged j WHERE t.id = j.id \
             RETURNING t.team_id, t.agent_id, t.chat_id, t.id, t.status, j.handed",
        )
        .bind(me.0)
        .bind(limit)
        .bind(max)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(TakenOver {
                    team: TeamId(row.try_get(0)?),
                    agent: AgentId(row.try_get(1)?),
                    chat: ChatId(row.try_get(2)?),
                    turn: TurnId(row.try_get(3)?),
                    runs: row.try_get::<String, _>(4)? == "running",
                    handed_over: row.try_get(5)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::from)
    }

    /// D4: leaves the turn for another replica to take over (a draining replica at a step
    /// boundary), only while `me` runs it. Answers whether it was handed over.
    pub async fn hand_over(
        &self,
        team: TeamId,
        turn: TurnId,
        me: ReplicaId,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE turns SET replica_id = NULL \
             WHERE team_id = $1 AND id = $2 AND replica_id = $3 AND status = 'running'",
        )
        .bind(team.0)
        .bind(turn.0)
        .bind(me.0)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The stored basis of a turn `me` took over: its composition, progress and authority.
    /// `NotFound` when it is not running on `me` any more.
    pub async fn resumable(
        &self,
        team: TeamId,
        turn: TurnId,
        me: ReplicaId,
    ) -> Result<Resumable, StoreError> {
        let row = sqlx::query(
            "SELECT c.body, t.progress, t.actor, t.actor_admin, t.takeovers \
             FROM turns t JOIN compositions c ON c.team_id = t.team_id AND c.hash = t.composition_hash \
             WHERE t.team_id = $1 AND t.id = $2 AND t.replica_id = $3 AND t.status = 'running'",
        )
        .bind(team.0)
        .bind(turn.0)
        .bind(me.0)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        Ok(Resumable {
            composition: row.try_get(0)?,
            progress: row.try_get(1)?,
            actor: row.try_get(2)?,
            actor_admin: row.try_get(3)?,
            takeovers: row.try_get(4)?,
        })
    }
}
