//! This replica's lease, and the reconciliation of what dead replicas left running
//! (SPEC O3).
//!
//! Every brain process is a replica (`Engine.replica`) with a row in `replicas` whose
//! `lease_until` it pushes forward every quarter of `BRAIN_LEASE_TTL_MS`. Each turn row
//! names the replica running it: the replica's lease is the lease of each of its turns.
//! On the same tick, every replica takes over the running turns of replicas whose lease
//! lapsed and continues them from their last completed step (D3, `turn::take_over`), so
//! a turn whose brain died goes on within one lease and one tick; a turn taken over too
//! often ends `failed` (`takeover_limit`) and its agent's hold is freed. The idle warm-pool slots whose channel such a
//! replica held are retired on the same tick (R3: nobody can bind them; the
//! runtime-manager stops their workers). A restarted process is a new replica: its old
//! turns are reconciled like anyone else's, by itself or by a survivor.
//!
//! Every twelfth tick, a replica also starts again the approval continuations whose turn
//! row was never written (A3, [`restart_stranded`]).
//!
//! A replica that cannot renew (Postgres unreachable) keeps running its turns; once the
//! database is back, survivors may already have taken them over. Every write of a turn is
//! fenced by the replica that runs it (`store::takeover`): the cut-off replica's next
//! step write or end-state write is refused and it stops that turn, so a turn runs on one
//! replica past any step boundary. What can happen in that window: the step in flight on
//! the cut-off replica (a model call, a tool call) overlaps the survivor's re-issue.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::Engine;
use crate::auth::Authority;
use crate::turn::{self, Trigger};
use store::BRAIN_REPLICA;

/// A replica whose lease lapsed this long ago is forgotten: its turns were reconciled.
const FORGET_AFTER: Duration = Duration::from_secs(3600);
/// Ticks between two sweeps of forgotten replicas.
const FORGET_EVERY_TICKS: u64 = 1000;
/// Ticks between two sweeps of stranded continuations (30 s at the default lease).
const STRANDED_EVERY_TICKS: u64 = 12;
/// Turns of lapsed replicas taken over per sweep (D3); more wait for the next tick.
const TAKEOVERS_PER_SWEEP: i64 = 32;
/// Stranded continuations started again per sweep.
const STRANDED_PER_SWEEP: i64 = 16;

/// Takes the lease before the replica serves: turns it starts must be covered by it.
/// A failure is logged, not fatal: the renewal loop tries again on its next tick.
pub async fn take(state: &Engine) {
    renew(state).await;
}

/// Renews the lease and reconciles dead replicas' turns until `stop`, then gives the lease
/// up.
pub async fn keep(state: Engine, stop: CancellationToken) {
    let every = state.config.lease_ttl / 4;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    loop {
        tokio::select! {
            biased;
            // Shutdown: `serve` gives the lease up once its turns have ended.
            () = stop.cancelled() => return,
            // Time to renew and reconcile.
            _ = tick.tick() => {}
        }
        renew(&state).await;
        reconcile(&state, every).await;
        // T13: queued turns of free agents that no wrap-up started (their replica died).
        turn::start_waiting(&state).await;
        if ticks.is_multiple_of(STRANDED_EVERY_TICKS) {
            restart_stranded(&state, every).await;
        }
        ticks += 1;
        if ticks.is_multiple_of(FORGET_EVERY_TICKS) {
            let forgotten = bounded(every, state.store.forget_lapsed_replicas(FORGET_AFTER)).await;
            if let Err(class) = forgotten {
                tracing::debug!(class, "could not forget lapsed replicas");
            }
        }
    }
}

/// Gives the lease up at a clean shutdown, after the replica's turns ended.
pub async fn give_up(state: &Engine) {
    let every = state.config.lease_ttl / 4;
    if let Err(class) = bounded(every, state.store.end_lease(state.replica)).await {
        tracing::warn!(class, "could not give the replica lease up; it will lapse");
    }
}

async fn renew(state: &Engine) {
    let ttl = state.config.lease_ttl;
    let renewed = bounded(
        ttl / 4,
        state.store.renew_lease(state.replica, BRAIN_REPLICA, ttl),
    )
    .await;
    if let Err(class) = renewed {
        tracing::warn!(replica = %state.replica, class, "could not renew the replica lease");
    }
}

/// Takes over the running turns of replicas whose lease lapsed (D3), or ends those taken
/// over too often and frees their agents.
async fn reconcile(state: &Engine, bound: Duration) {
    match bounded(bound, state.store.retire_orphaned_slots(state.replica)).await {
        Ok(0) => {}
        Ok(slots) => tracing::info!(slots, "retired warm-pool slots of a lost replica"),
        Err(class) => tracing::debug!(class, "could not retire slots of lapsed replicas"),
    }
    // A draining replica hands its turns over; it takes none.
    if state.draining.is_cancelled() {
        return;
    }
    let taken = bounded(
        bound,
        state.store.take_over_orphaned_turns(
            state.replica,
            TAKEOVERS_PER_SWEEP,
            turn::MAX_TAKEOVERS,
        ),
    )
    .await;
    let taken = match taken {
        Ok(taken) => taken,
        Err(class) => {
            tracing::debug!(class, "could not reconcile turns of lapsed replicas");
            return;
        }
    };
    for turn in taken {
        if turn.runs {
            tracing::info!(turn = %turn.turn, agent = %turn.agent, "taking over a turn whose replica was lost");
            // In a task of its own: rebuilding a turn starts its connectors, which must
            // not hold up this loop's next renewal of the lease.
            let owned = state.clone();
            state
                .turn_tracker
                .spawn(async move { turn::take_over(&owned, turn).await });
            continue;
        }
        state.metrics.turns_reconciled.inc();
        match state
            .holds
            .release_lost(turn.team, turn.agent, turn.turn)
            .await
        {
            Ok(freed) => tracing::info!(
                turn = %turn.turn,
                agent = %turn.agent,
                hold_freed = freed,
                "ended a turn taken over too often"
            ),
            // The hold then expires by itself (T9's 5 minutes at most).
            Err(class) => tracing::warn!(
                turn = %turn.turn,
                agent = %turn.agent,
                class,
                "ended a turn taken over too often; could not free its hold"
            ),
        }
    }
}

/// A3: starts again the continuations whose turn row was never written (their replica
/// died, or a store call failed, between the answer and the turn). One is stranded once
/// it is older than the longest a continuation's start can take (the connectors' startup
/// and the lease); the claim (`Store::reclaim_continuation`) lets one replica take it.
async fn restart_stranded(state: &Engine, bound: Duration) {
    let after = state.config.connectors.startup_timeout + state.config.lease_ttl;
    let stranded = match bounded(
        bound,
        state
            .store
            .stranded_continuations(after, STRANDED_PER_SWEEP),
    )
    .await
    {
        Ok(stranded) => stranded,
        Err(class) => {
            tracing::debug!(class, "could not look for stranded continuations");
            return;
        }
    };
    for found in stranded {
        let owned = state.clone();
        let task = async move {
            // X1: the turn it continues is whose it is, never who answered.
            let authority = Authority::of_turn(found.asking.actor, found.asking.admin);
            let started = turn::launch(
                &owned,
                found.team,
                found.chat,
                Trigger::Stranded(found.continuation),
                authority,
                true,
                None,
            )
            .await;
            match started {
                Ok(launched) => tracing::info!(
                    chat = %found.chat,
                    turn = ?launched.turn,
                    "started a stranded continuation again"
                ),
                // The agent is busy, a store is down: the next sweep tries again.
                Err(err) => tracing::info!(
                    chat = %found.chat,
                    code = err.code().as_str(),
                    "could not start a stranded continuation yet"
                ),
            }
        };
        state.turn_tracker.spawn(task);
    }
}

/// A store call under `bound`, with its failure as a class for the log.
pub(crate) async fn bounded<T>(
    bound: Duration,
    call: impl Future<Output = Result<T, store::StoreError>>,
) -> Result<T, &'static str> {
    match tokio::time::timeout(bound, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(err.metric_label()),
        Err(_) => Err("timeout"),
    }
}
