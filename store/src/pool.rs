//! Warm-pool slots (SPEC R3): pre-started workers waiting, unassigned, for a session.
//!
//! The runtime-manager writes a slot `starting` and launches its worker; the brain
//! marks it `idle` once the worker's channel is ready, and claims it for a session in
//! one statement that also writes the session row `ready` (so two claims never take one
//! worker, and a chat never gets two live sessions).

use protocol::{ReplicaId, SessionId};
use sqlx::Row;

use super::sessions::SessionRow;
use super::{NewSession, Store, StoreError, unique_violation};

impl Store {
    /// The profile of a slot still `starting` (its worker may dial in).
    pub async fn starting_pool_slot(&self, slot: SessionId) -> Result<Option<String>, StoreError> {
        let row =
            sqlx::query("SELECT profile FROM worker_pool WHERE id = $1 AND state = 'starting'")
                .bind(slot.0)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|r| r.try_get("profile")).transpose()?)
    }

    /// `starting` → `idle`: the slot's worker is ready to be claimed, its channel held by
    /// `holder`.
    pub async fn pool_slot_idle(
        &self,
        slot: SessionId,
        holder: ReplicaId,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE worker_pool SET state = 'idle', holder_replica = $2, updated_at = now() \
             WHERE id = $1 AND state = 'starting'",
        )
        .bind(slot.0)
        .bind(holder.0)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// An unclaimed slot's worker is gone (its channel ended or never became ready).
    pub async fn pool_slot_gone(&self, slot: SessionId) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE worker_pool SET state = 'gone', updated_at = now() \
             WHERE id = $1 AND state IN ('starting', 'idle')",
        )
        .bind(slot.0)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Retires the idle slots whose holder's lease lapsed (O3): the replica died with
    /// their channels, so nobody can bind them. The runtime-manager stops their workers.
    /// Slots of `me` are never touched, as for turns.
    pub async fn retire_orphaned_slots(&self, me: ReplicaId) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE worker_pool w SET state = 'gone', updated_at = now() \
             WHERE w.state = 'idle' AND w.holder_replica <> $1 \
               AND NOT EXISTS (SELECT 1 FROM replicas r \
                               WHERE r.id = w.holder_replica AND r.lease_until > now())",
        )
        .bind(me.0)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Claims idle slot `slot` for a new `ready` session of (agent, chat). `None` when
    /// the slot was taken meanwhile; `Conflict("live_session")` when the chat already has
    /// a live session (then the slot stays idle).
    pub async fn claim_pool_slot(
        &self,
        slot: SessionId,
        new: &NewSession<'_>,
        replica: ReplicaId,
    ) -> Result<Option<SessionRow>, StoreError> {
        let session = SessionId::new();
        let row = sqlx::query(
            "WITH slot AS ( \
                UPDATE worker_pool SET state = 'claimed', session_id = $2, updated_at = now() \
                WHERE id = $1 AND state = 'idle' RETURNING worker_ref) \
             INSERT INTO agent_runtime_sessions \
                (id, team_id, agent_id, chat_id, profile, state, worker_ref, owner_replica, \
                 speculative, user_id) \
             SELECT $2, $3, $4, $5, $6, 'ready', worker_ref, $7, $8, $9 FROM slot \
             RETURNING id",
        )
        .bind(slot.0)
        .bind(session.0)
        .bind(new.team.0)
        .bind(new.agent.0)
        .bind(new.chat.0)
        .bind(new.profile)
        .bind(replica.0)
        .bind(new.speculative)
        .bind(new.user)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| unique_violation(e, "sessions_live", "live_session"))?;
        match row {
            Some(_) => Ok(Some(self.session(session).await?)),
            None => Ok(None),
        }
    }

    /// Claims the oldest idle slot of `profile` whose channel another live replica than
    /// `not` holds (its lease current), for a new `ready` session of (agent, chat) owned by that holder (R3): the
    /// claimer then asks the holder to bind the worker. `None` when no such slot is idle;
    /// `Conflict("live_session")` as for [`Store::claim_pool_slot`].
    pub async fn claim_remote_pool_slot(
        &self,
        new: &NewSession<'_>,
        not: ReplicaId,
    ) -> Result<Option<RemoteClaim>, StoreError> {
        let session = SessionId::new();
        let row = sqlx::query(
            "WITH pick AS ( \
                SELECT id FROM worker_pool \
                WHERE profile = $1 AND state = 'idle' AND holder_replica <> $7 \
                  AND EXISTS (SELECT 1 FROM replicas r \
                              WHERE r.id = holder_replica AND r.lease_until > now()) \
                ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED), \
             slot AS ( \
                UPDATE worker_pool w SET state = 'claimed', session_id = $2, updated_at = now() \
                FROM pick WHERE w.id = pick.id AND w.state = 'idle' \
                RETURNING w.id, w.worker_ref, w.holder_replica), \
             session AS ( \
                INSERT INTO agent_runtime_sessions \
                   (id, team_id, agent_id, chat_id, profile, state, worker_ref, owner_replica, \
                    speculative, user_id) \
                SELECT $2, $3, $4, $5, $1, 'ready', worker_ref, holder_replica, $6, $8 FROM slot \
                RETURNING id) \
             SELECT slot.id AS slot, slot.holder_replica AS holder FROM slot, session",
        )
        .bind(new.profile)
        .bind(session.0)
        .bind(new.team.0)
        .bind(new.agent.0)
        .bind(new.chat.0)
        .bind(new.speculative)
        .bind(not.0)
        .bind(new.user)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| unique_violation(e, "sessions_live", "live_session"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        Ok(Some(RemoteClaim {
            slot: SessionId(row.try_get("slot")?),
            holder: ReplicaId(row.try_get("holder")?),
            session: self.session(session).await?,
        }))
    }
}

/// A slot claimed by [`Store::claim_remote_pool_slot`].
pub struct RemoteClaim {
    pub slot: SessionId,
    /// The replica holding the slot's channel, now the session's owner.
    pub holder: ReplicaId,
    pub session: SessionRow,
}
