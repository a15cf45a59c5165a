//! Replica leases (SPEC O3) and the reconciliation of what a dead replica left running.
//!
//! Lease times are the database's clock (`now()`), so replicas' clocks need not agree.

use std::time::Duration;

use protocol::ReplicaId;

use super::{Store, StoreError};

/// The kinds of process that hold a lease (the `replicas.kind` check).
pub const BRAIN: &str = "brain";

impl Store {
    /// Takes or renews `replica`'s lease until `ttl` from now.
    pub async fn renew_lease(
        &self,
        replica: ReplicaId,
        kind: &'static str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO replicas (id, kind, lease_until) \
             VALUES ($1, $2, now() + $3 * interval '1 millisecond') \
             ON CONFLICT (id) DO UPDATE SET lease_until = EXCLUDED.lease_until",
        )
        .bind(replica.0)
        .bind(kind)
        .bind(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Gives the lease up (a clean shutdown): what the replica still owns is reconciled at
    /// once instead of when the lease would have lapsed.
    pub async fn end_lease(&self, replica: ReplicaId) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM replicas WHERE id = $1")
            .bind(replica.0)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Forgets replicas whose lease lapsed more than `after` ago: nothing can refer to
    /// them any more once their turns are reconciled.
    pub async fn forget_lapsed_replicas(&self, after: Duration) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM replicas WHERE lease_until < now() - $1 * interval '1 millisecond'",
        )
        .bind(i64::try_from(after.as_millis()).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
