//! Retention (L6): a team's `retention_days` (`PUT /v1/team/settings`) and the sweep that
//! keeps it. Every replica runs [`run`]; the one holding the Postgres advisory lock sweeps,
//! the others skip the pass. A pass deletes, for each team with a retention, the turns that
//! ended before the cutoff with their messages and approvals, then the artifacts and the
//! workspace snapshots made before it (their bytes through `artifacts::garbage`), a batch at
//! a time: a replica that dies part way has deleted whole batches, and the next pass, on any
//! replica, goes on. Counted in `brain_retention_deleted_total{kind}`.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::Engine;
use store::{Expiring, StoreError, bounded};

/// Rows deleted per statement.
const BATCH: i64 = 500;
/// Batches of one kind one pass takes for one team, so a backlog is worked off over
/// several passes rather than holding the lock indefinitely.
const BATCHES_PER_PASS: usize = 20;

/// Sweeps every `interval` until `stop`.
pub async fn run(state: Engine, interval: Duration, stop: CancellationToken) {
    // The first pass one interval after the start, not at it: a rollout restarting every
    // replica does not sweep once per replica.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(err) = sweep(&state).await {
            tracing::warn!(class = err.metric_label(), "retention sweep cut short");
        }
    }
}

/// One pass, if this replica takes the lock.
pub async fn sweep(state: &Engine) -> Result<(), StoreError> {
    let Some(_lock) = bounded(state.store.take_retention_lock()).await? else {
        return Ok(());
    };
    for (team, days) in bounded(state.store.retained_teams()).await? {
        for _ in 0..BATCHES_PER_PASS {
            let (turns, messages) = bounded(state.store.expire_turns(team, days, BATCH)).await?;
            state.metrics.retention_deleted("turn", turns);
            state.metrics.retention_deleted("message", messages);
            if turns < BATCH as u64 {
                break;
            }
        }
        for kind in [
            Expiring::Artifacts,
            Expiring::Snapshots,
            Expiring::ChatFiles,
        ] {
            for _ in 0..BATCHES_PER_PASS {
                let keys = bounded(state.store.expire_blobs(kind, team, days, BATCH)).await?;
                state
                    .metrics
                    .retention_deleted(kind.label(), keys.len() as u64);
                crate::artifacts::garbage::delete_bytes(&state.store, &*state.artifacts, &keys)
                    .await;
                if keys.len() < BATCH as usize {
                    break;
                }
            }
        }
    }
    Ok(())
}
