//! The audit log's retention (L5): every replica deletes entries older than
//! `BRAIN_AUDIT_RETENTION_DAYS`, a bounded batch at a time. Replicas sweeping at once skip
//! each other's rows (`FOR UPDATE SKIP LOCKED`), so running it everywhere costs a few
//! indexed statements an hour. The entries are written by the store methods that make
//! the changes (`store::audit`).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use store::{Store, bounded};

/// How often a replica sweeps: entries live for days, so an hour late is nothing.
const SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// Entries deleted per statement, so a sweep never holds many locks or runs long.
const SWEEP_BATCH: i64 = 1000;
/// Statements per sweep: a backlog (retention just shortened) drains over several.
const SWEEP_BATCHES: usize = 100;

/// Sweeps at once, then every [`SWEEP_EVERY`], until `stop`.
pub async fn sweep(store: Store, retention_days: u32, stop: CancellationToken) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut expired = 0;
        for _ in 0..SWEEP_BATCHES {
            match bounded(store.expire_audit_entries(retention_days, SWEEP_BATCH)).await {
                Ok(n) => {
                    expired += n;
                    if n < SWEEP_BATCH as u64 {
                        break;
                    }
                }
                Err(err) => {
                    tracing::warn!(class = err.metric_label(), "audit entries not expired");
                    break;
                }
            }
        }
        if expired > 0 {
            tracing::info!(expired, "audit entries past retention deleted");
        }
    }
}
