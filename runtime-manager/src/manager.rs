//! What the runtime-manager does with a session: provision it, tear it down when idle,
//! time out its dial, stop workers whose session ended elsewhere, and reconcile rows left
//! by a previous process (SPEC W2, W6, W7, O3).
//!
//! ```text
//! pending ──Provision──► provisioning ──launch──► connecting ──(brain)──► ready
//!                             │                      │                      │
//!                             └─ launch_failed ──►  failed ◄── dial_timeout │ (brain: W6)
//!                                                    ▲                      │
//!      IdleCheck, unused for the window since ready or last use: terminating ──► terminated
//! ```
//!
//! Idle time counts from `ready` (W7): a session still starting (an image pull, a cold
//! node) is governed by its dial and start deadlines only. The reaper arms the first
//! `IdleCheck` of every `ready` session that has none, from the row, so neither a slow
//! start nor a warm-pool claim depends on a handler remembering to arm it; and it arms a
//! new one for a session whose recorded check is overdue (a push that failed, a crash
//! between recording and pushing, a Redis restart), so arming is recoverable (W7).
//!
//! Besides the brain's failures (W6), the launcher's watcher reports what it sees in a
//! worker (R4: an image that cannot be pulled, an OOM kill, a pod stuck starting): the
//! session fails `launch_failed` with that detail, and the worker is stopped.
//!
//! Every handler is idempotent: a task may run twice (a consumer that died mid-task), and
//! every transition is a compare-and-set in [`crate::store`]. Each process is a replica
//! with a lease it renews (O3); a provision claim names its replica, and a task that comes
//! back takes a claim over only from a replica whose lease has lapsed. No state is kept in memory
//! beyond the launcher's table of local children; the dial timeout and the arming of idle
//! timers are sweeps over the rows, so they survive a restart.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use channel::token::TokenKeys;
use protocol::channel::{FailureReason, SessionState, SessionTask};
use protocol::{AgentId, ChatId, ReplicaId, SessionId, TeamId};
use queue::{SessionQueue, TaskError};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::Error;
use crate::launcher::{LaunchSpec, Launcher, WorkerFailure};
use crate::metrics::{LaunchOutcome, Metrics, ReaperAction};
use crate::store::{Billed, PoolSlot, ProvisionClaim, SnapshotAsk, Store, Teardown};

/// `failure_detail` of sessions whose worker vanished while no manager ran (O3).
pub const WORKER_GONE_ON_RESTART: &str = "worker_gone_on_restart";
/// How often an idle teardown looks whether the snapshot it asked for has arrived (W10).
const SNAPSHOT_POLL: Duration = Duration::from_millis(100);
/// A `terminating` row this old (and past its snapshot's deadline, if one was asked for)
/// has lost its idle-check task: the reaper finishes it.
const TERMINATING_PATIENCE: Duration = Duration::from_secs(30);
/// How long this process's lease in `replicas` holds without a renewal (O3): once it has
/// lapsed, another replica may take over the provisions this one claimed.
pub const LEASE: Duration = Duration::from_secs(10);
/// How often the lease is renewed: a few missed renewals before it lapses.
pub const LEASE_RENEWAL: Duration = Duration::from_secs(2);
/// The most sessions one billing statement takes: a pass after a long outage catches up
/// in several short statements rather than one long one.
const BILLING_BATCH: i64 = 500;
/// The bound on one billing statement.
const BILLING_BOUND: Duration = Duration::from_secs(10);

/// The shared handles, one per process; cheap to clone.
#[derive(Clone)]
pub struct Manager {
    inner: Arc<Inner>,
}

struct Inner {
    /// This process (O3): a restart is a new replica.
    replica: ReplicaId,
    config: Config,
    store: Store,
    queue: SessionQueue,
    launcher: Arc<dyn Launcher>,
    tokens: TokenKeys,
    /// What this process counts (O2), served by `metrics::serve`.
    metrics: Metrics,
}

impl Manager {
    pub fn new(
        config: Config,
        store: Store,
        queue: SessionQueue,
        launcher: Arc<dyn Launcher>,
    ) -> Result<Self, Error> {
        let tokens = TokenKeys::new(&config.session_token_key.bytes)?;
        let metrics = Metrics::new()?;
        for collector in launcher.collectors() {
            metrics.register(collector)?;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                replica: ReplicaId::new(),
                config,
                store,
                queue,
                launcher,
                tokens,
                metrics,
            }),
        })
    }

    /// This process's replica id.
    pub fn replica(&self) -> ReplicaId {
        self.inner.replica
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Records or renews this process's lease (O3).
    pub async fn renew_lease(&self) -> Result<(), Error> {
        Ok(self
            .inner
            .store
            .renew_lease(self.inner.replica, LEASE)
            .await?)
    }

    /// Renews the lease every [`LEASE_RENEWAL`] until `stop`, then removes it: a clean
    /// shutdown leaves no lease for the survivors to wait out.
    pub async fn keep_lease(self, stop: CancellationToken) {
        every(LEASE_RENEWAL, &stop, "renewing the lease failed", || {
            self.renew_lease()
        })
        .await;
        if self
            .inner
            .store
            .release_lease(self.inner.replica)
            .await
            .is_err()
        {
            tracing::warn!(error_class = "store", "removing the lease failed");
        }
    }

    /// The queue handler.
    pub async fn handle(&self, task: SessionTask) -> Result<(), TaskError> {
        let result = match task {
            SessionTask::Provision { session, .. } => self.provision(session).await,
            SessionTask::IdleCheck {
                session,
                last_used_ms,
            } => self.idle_check(session, last_used_ms).await,
        };
        result.map_err(|e| TaskError::Retry(e.metric_label().to_owned()))
    }

    async fn provision(&self, session: SessionId) -> Result<(), Error> {
        let inner = &self.inner;
        let replica = inner.replica;
        let claim = match inner.store.claim_for_provision(session, replica).await? {
            ProvisionClaim::Claimed(claim) => claim,
            // Launched already (a repeated or retried task), or over.
            ProvisionClaim::Done => return Ok(()),
            // Delivered twice while its claimer launches: the retry finds it launched, or
            // takes it over once that claimer's lease has lapsed.
            ProvisionClaim::Held => return Err(Error::ProvisionHeld),
        };
        if inner.config.profiles.idle_window(&claim.profile).is_none() {
            if inner
                .store
                .fail_provision(
                    session,
                    replica,
                    FailureReason::LaunchFailed,
                    "unknown_profile",
                )
                .await?
            {
                self.count_failure(session, FailureReason::LaunchFailed, "unknown_profile");
            }
            inner
                .metrics
                .launched(&claim.profile, LaunchOutcome::Failed);
            return Ok(());
        }
        let token = inner
            .tokens
            .mint(session, claim.team, claim.agent, inner.config.token_ttl)?;
        // Only a chat with a snapshot costs its worker a request before the dial (W10).
        let restore = inner
            .config
            .profiles
            .get(&claim.profile)
            .is_some_and(|p| p.snapshots)
            && inner
                .store
                .chat_has_snapshot(claim.agent, claim.chat)
                .await?;
        let spec = LaunchSpec {
            session,
            team: claim.team,
            agent: claim.agent,
            chat: claim.chat,
            profile: claim.profile,
            token,
            brain_public_url: inner.config.brain_public_url.clone(),
            restore,
        };
        let profile = spec.profile.clone();
        let launched = inner.launcher.launch(spec).await;
        inner
            .metrics
            .launched(&profile, LaunchOutcome::of(&launched));
        let worker_ref = match launched {
            Ok(worker_ref) => worker_ref,
            Err(e) => {
                let detail = e.metric_label();
                if inner
                    .store
                    .fail_provision(session, replica, FailureReason::LaunchFailed, detail)
                    .await?
                {
                    self.count_failure(session, FailureReason::LaunchFailed, detail);
                }
                return Ok(());
            }
        };
        if !inner
            .store
            .mark_connecting(session, replica, &worker_ref)
            .await?
        {
            // The session ended, or another replica took the provision over (this one's
            // lease lapsed), while we launched.
            tracing::info!(session = %session.0, "session moved on during launch; stopping its worker");
            inner.launcher.stop(&worker_ref).await?;
        }
        // Its idle timer is armed by the reaper once the session is `ready` (W7).
        Ok(())
    }

    /// Tears the session down if it has been idle for its profile's window since it was
    /// last used or became ready; otherwise arms the next check for the end of that
    /// window. `armed_for_ms` is the idle baseline the check was armed for (logged).
    async fn idle_check(&self, session: SessionId, armed_for_ms: i64) -> Result<(), Error> {
        let inner = &self.inner;
        let Some(row) = inner.store.session(session).await? else {
            return Ok(());
        };
        match row.state {
            Some(SessionState::Ready) => {}
            // A teardown that was interrupted: finish it.
            Some(SessionState::Terminating) => {
                return self.finish_teardown(session, &row.worker_ref).await;
            }
            // Still starting (its dial and start deadlines govern it; the reaper arms its
            // first check once it is ready), or over.
            _ => return Ok(()),
        }
        tracing::debug!(
            session = %session.0,
            armed_for_ms,
            idle_since_ms = row.idle_since_ms,
            "idle check"
        );
        let snapshot = self.snapshot_ask(&row.profile);
        if self.idle_due(&row.profile, row.idle_since_ms, row.speculation_due_ms) > row.now_ms
            || inner
                .store
                .begin_terminating(session, row.idle_since_ms, snapshot)
                .await?
                == Teardown::NotIdle
        {
            // Used since: a new timer for the last use (read again: the compare-and-set
            // may have lost to a use that just happened).
            let Some(row) = inner.store.session(session).await? else {
                return Ok(());
            };
            let due = self.idle_due(&row.profile, row.idle_since_ms, row.speculation_due_ms);
            return self
                .arm_idle_check(session, row.idle_since_ms, due, row.now_ms, Duration::ZERO)
                .await
                .map(drop);
        }
        tracing::info!(session = %session.0, "session idle; tearing it down");
        inner.metrics.reaper(ReaperAction::IdleTeardown);
        self.finish_teardown(session, &row.worker_ref).await
    }

    /// What an idle teardown of `profile` asks of its worker: a workspace snapshot, unless
    /// the profile turns them off (W10).
    fn snapshot_ask(&self, profile: &str) -> Option<SnapshotAsk> {
        let profile = self.inner.config.profiles.get(profile)?;
        profile.snapshots.then(|| SnapshotAsk {
            max_bytes: profile.snapshot_max_bytes,
            timeout: self.inner.config.snapshot_timeout,
        })
    }

    /// Waits while the session's snapshot is `requested` and before its deadline (the
    /// worker packs and uploads it through the brain), then records a miss as `timed_out`.
    async fn await_snapshot(&self, session: SessionId) -> Result<(), Error> {
        let store = &self.inner.store;
        let started = std::time::Instant::now();
        let mut waited = false;
        while store.awaits_snapshot(session).await? {
            waited = true;
            tokio::time::sleep(SNAPSHOT_POLL).await;
        }
        if store.snapshot_timed_out(session).await? {
            tracing::warn!(session = %session.0, "workspace snapshot not stored in time; tearing down without it");
        } else if waited {
            tracing::info!(
                session = %session.0,
                waited_ms = started.elapsed().as_millis() as u64,
                "workspace snapshot answered"
            );
        }
        Ok(())
    }

    /// `terminating`: wait for a requested snapshot (bounded), stop the worker, then
    /// `terminated`.
    async fn finish_teardown(
        &self,
        session: SessionId,
        worker_ref: &Option<String>,
    ) -> Result<(), Error> {
        self.await_snapshot(session).await?;
        if let Some(worker_ref) = worker_ref {
            self.inner.launcher.stop(worker_ref).await?;
        }
        if self.inner.store.finish_terminating(session).await? {
            tracing::info!(session = %session.0, "session terminated");
        }
        Ok(())
    }

    /// Arms the idle check of a `ready` session, due at `due_ms` (database clock): records
    /// its due time, then pushes it. Nothing is pushed when the session is no longer
    /// `ready` or another check is pending (one due later than `stale_after` ago), so a
    /// check delivered twice does not start a second chain of checks. `true` when this
    /// call armed it.
    async fn arm_idle_check(
        &self,
        session: SessionId,
        idle_since_ms: i64,
        due_ms: i64,
        now_ms: i64,
        stale_after: Duration,
    ) -> Result<bool, Error> {
        let inner = &self.inner;
        if !inner
            .store
            .claim_idle_check(session, due_ms, stale_after)
            .await?
        {
            return Ok(false);
        }
        let delay = Duration::from_millis((due_ms - now_ms).max(0) as u64);
        inner
            .queue
            .push_after(
                SessionTask::IdleCheck {
                    session,
                    last_used_ms: idle_since_ms,
                },
                delay,
            )
            .await?;
        Ok(true)
    }

    /// Arms the idle timer of every `ready` session that has none (it just became ready,
    /// cold or claimed from a warm pool) or whose check is overdue by more than the grace
    /// (lost to a failed push, a manager that died between recording and pushing it, a
    /// Redis restart).
    async fn arm_idle_checks(&self) -> Result<(), Error> {
        let grace = self.inner.config.lost_idle_check_grace;
        let metrics = &self.inner.metrics;
        for row in self.inner.store.unarmed_idle_checks(grace).await? {
            let due_ms = self.idle_due(&row.profile, row.idle_since_ms, row.speculation_due_ms);
            if self
                .arm_idle_check(row.session, row.idle_since_ms, due_ms, row.now_ms, grace)
                .await?
            {
                metrics.reaper(ReaperAction::IdleCheckArmed);
                // The first arming is won by one replica only: observed once per session.
                if let Some(ms) = row.launch_to_ready_ms {
                    metrics.became_ready(&row.profile, Duration::from_millis(ms.max(0) as u64));
                }
            }
        }
        Ok(())
    }

    /// When a `ready` session idle since `idle_since_ms` is torn down: its profile's idle
    /// window after that, or, for a speculative start its turn left unused (W11), at the
    /// end of the grace it was given.
    fn idle_due(&self, profile: &str, idle_since_ms: i64, speculation_due_ms: Option<i64>) -> i64 {
        speculation_due_ms
            .unwrap_or_else(|| idle_since_ms + self.window(profile).as_millis() as i64)
    }

    fn window(&self, profile: &str) -> Duration {
        let profiles = &self.inner.config.profiles;
        profiles
            .idle_window(profile)
            .unwrap_or(profiles.light.idle_window)
    }

    fn count_failure(&self, session: SessionId, reason: FailureReason, detail: &str) {
        let total = self.inner.metrics.failed(reason);
        tracing::info!(
            session = %session.0,
            reason = reason.as_str(),
            detail,
            failures_with_reason = total,
            "session failed"
        );
    }

    /// One pass of the reaper: time out dials, arm the idle timers of ready sessions that
    /// have none, tend the pools, and stop every local worker whose session ended elsewhere (the brain records heartbeat_lost, session_mismatch and the
    /// handshake and ready timeouts), was replaced, or is gone.
    pub async fn reap_once(&self) -> Result<(), Error> {
        let inner = &self.inner;
        for (session, worker_ref) in inner
            .store
            .fail_dial_timeouts(inner.config.dial_timeout)
            .await?
        {
            self.count_failure(session, FailureReason::DialTimeout, "");
            inner.metrics.reaper(ReaperAction::DialTimeout);
            if let Some(worker_ref) = worker_ref {
                self.stop_logged(session, &worker_ref).await;
            }
        }

        self.arm_idle_checks().await?;
        self.pool_once().await?;

        let running = inner.launcher.running().await?;
        if running.is_empty() {
            return Ok(());
        }
        // Pooled workers run under their slot's id; once claimed, their session's row
        // decides (R3).
        let ids: Vec<SessionId> = running.iter().map(|w| w.session).collect();
        let slots: HashMap<SessionId, PoolSlot> = inner
            .store
            .pool_slots(&ids)
            .await?
            .into_iter()
            .map(|slot| (slot.slot, slot))
            .collect();
        let owner_of = |id: SessionId| match slots.get(&id) {
            Some(slot) => slot.session,
            None => Some(id),
        };
        let session_ids: Vec<SessionId> = ids.iter().filter_map(|id| owner_of(*id)).collect();
        let rows: HashMap<SessionId, _> = inner
            .store
            .rows(&session_ids, TERMINATING_PATIENCE)
            .await?
            .into_iter()
            .map(|row| (row.session, row))
            .collect();
        for mut worker in running {
            if let Some(slot) = slots.get(&worker.session) {
                match slot.session {
                    // Waiting in the pool: `pool_once` tends it.
                    None => continue,
                    Some(session) => worker.session = session,
                }
            }
            let Some(row) = rows.get(&worker.session) else {
                tracing::info!(session = %worker.session.0, "session row gone; stopping its worker");
                inner.metrics.reaper(ReaperAction::WorkerStopped);
                self.stop_logged(worker.session, &worker.worker_ref).await;
                continue;
            };
            let replaced = row
                .worker_ref
                .as_deref()
                .is_some_and(|r| r != worker.worker_ref);
            match row.state {
                Some(SessionState::Failed | SessionState::Terminated) => {
                    tracing::info!(session = %worker.session.0, "session ended; stopping its worker");
                    inner.metrics.reaper(ReaperAction::WorkerStopped);
                    self.stop_logged(worker.session, &worker.worker_ref).await;
                }
                Some(SessionState::Terminating) if row.stale => {
                    inner.metrics.reaper(ReaperAction::TeardownFinished);
                    self.finish_teardown(worker.session, &Some(worker.worker_ref.clone()))
                        .await?;
                }
                _ if replaced => {
                    tracing::info!(session = %worker.session.0, "worker replaced; stopping the old one");
                    inner.metrics.reaper(ReaperAction::WorkerStopped);
                    self.stop_logged(worker.session, &worker.worker_ref).await;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Tends the warm pools (R3): tops each profile up to its `warmPoolSize` with workers
    /// started under a pool token, retires slots whose worker never became ready or that
    /// waited past `warmPoolMaxAgeSeconds`, and stops the workers of retired slots, in
    /// that order, so a retired worker is replaced in the same pass. A session that claimed a slot is `ready`: its idle
    /// timer is armed like any other's.
    async fn pool_once(&self) -> Result<(), Error> {
        let inner = &self.inner;
        for slot in inner
            .store
            .pool_stale_starting(inner.config.dial_timeout)
            .await?
        {
            tracing::info!(slot = %slot.0, "pooled worker never became ready; retiring it");
            inner.metrics.reaper(ReaperAction::PoolRetired);
        }
        let pooled = || {
            inner
                .config
                .profiles
                .iter()
                .filter(|(_, settings)| settings.warm_pool_size > 0)
        };
        for (profile, settings) in pooled() {
            for slot in inner
                .store
                .pool_retire_aged(profile, settings.warm_pool_max_age)
                .await?
            {
                tracing::info!(slot = %slot.0, profile, "pooled worker past its maximum age; retiring it");
                inner.metrics.reaper(ReaperAction::PoolAged);
            }
        }
        for (slot, worker_ref) in inner.store.pool_gone_workers().await? {
            if let Some(worker_ref) = worker_ref {
                self.stop_logged(slot, &worker_ref).await;
            }
            inner.store.pool_forget(slot).await?;
            inner.metrics.reaper(ReaperAction::PoolStopped);
        }
        for (profile, settings) in pooled() {
            for slot in inner
                .store
                .pool_top_up(profile, settings.warm_pool_size)
                .await?
            {
                self.start_pooled(slot, profile).await?;
            }
        }
        Ok(())
    }

    /// Starts the worker of slot `slot`, just opened: it dials in with a pool token and
    /// waits, unassigned, for a session to claim it.
    async fn start_pooled(&self, slot: SessionId, profile: &str) -> Result<(), Error> {
        let inner = &self.inner;
        let spec = LaunchSpec {
            session: slot,
            team: TeamId::nil(),
            agent: AgentId::nil(),
            chat: ChatId::nil(),
            profile: profile.to_owned(),
            token: inner.tokens.mint_pool(slot, inner.config.token_ttl)?,
            brain_public_url: inner.config.brain_public_url.clone(),
            restore: false,
        };
        let launched = inner.launcher.launch(spec).await;
        inner
            .metrics
            .launched(profile, LaunchOutcome::of(&launched));
        match launched {
            Ok(worker_ref) => {
                inner.metrics.reaper(ReaperAction::PoolStarted);
                inner.store.pool_launched(slot, &worker_ref).await?
            }
            Err(e) => {
                tracing::warn!(
                    profile,
                    error_class = e.metric_label(),
                    "pooled worker not launched"
                );
                inner.store.pool_gone(slot).await?;
            }
        }
        Ok(())
    }

    async fn stop_logged(&self, session: SessionId, worker_ref: &str) {
        if let Err(e) = self.inner.launcher.stop(worker_ref).await {
            tracing::warn!(session = %session.0, error_class = e.metric_label(), "stopping a worker failed");
        }
    }

    /// E1: writes the worker-seconds events due now (see [`Store::bill_worker_seconds`]),
    /// batch after batch until none is due. Every replica runs it; the row locks and the
    /// event keys make each interval land once whichever replica (or retry) bills it, and
    /// a live session goes on being billed as long as any replica runs, whoever launched
    /// it.
    pub async fn bill_once(&self) -> Result<Billed, Error> {
        let inner = &self.inner;
        let mut total = Billed::default();
        loop {
            let billed = tokio::time::timeout(
                BILLING_BOUND,
                inner
                    .store
                    .bill_worker_seconds(inner.config.billing_interval, BILLING_BATCH),
            )
            .await
            .map_err(|_| Error::StoreTimeout)??;
            total.sessions += billed.sessions;
            total.events += billed.events;
            total.closed += billed.closed;
            if billed.sessions < BILLING_BATCH {
                break;
            }
        }
        if total.events > 0 {
            tracing::debug!(
                sessions = total.sessions,
                events = total.events,
                closed = total.closed,
                "worker-seconds billed"
            );
        }
        Ok(total)
    }

    /// Runs [`Self::bill_once`] every `reaper_interval` until `shutdown`.
    pub async fn billing(self, shutdown: CancellationToken) {
        every(
            self.inner.config.reaper_interval,
            &shutdown,
            "billing worker-seconds failed",
            || async { self.bill_once().await.map(drop) },
        )
        .await;
    }

    /// Runs [`Self::reap_once`] every `reaper_interval` until `shutdown`.
    pub async fn reaper(self, shutdown: CancellationToken) {
        every(
            self.inner.config.reaper_interval,
            &shutdown,
            "reaper pass failed",
            || self.reap_once(),
        )
        .await;
    }

    /// Runs the launcher's watcher until `shutdown` and records every failure it reports
    /// (R4): the session fails `launch_failed` with the failure's detail (a session that
    /// failed already, say `heartbeat_lost` when the brain saw the socket close first, gets
    /// the detail added), and the worker is stopped.
    pub async fn watch_workers(self, shutdown: CancellationToken) {
        let (tx, mut rx) = mpsc::channel::<WorkerFailure>(64);
        let launcher = self.inner.launcher.clone();
        let watcher = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { launcher.watch(tx, shutdown).await }
        });
        while let Some(failure) = rx.recv().await {
            if let Err(e) = self.record_worker_failure(&failure).await {
                tracing::warn!(
                    session = %failure.session.0,
                    error_class = e.metric_label(),
                    "recording a worker failure failed"
                );
            }
        }
        let _ = watcher.await;
    }

    async fn record_worker_failure(&self, failure: &WorkerFailure) -> Result<(), Error> {
        let inner = &self.inner;
        let WorkerFailure {
            session,
            worker_ref,
            detail,
        } = failure;
        if inner
            .store
            .fail_worker(*session, worker_ref, FailureReason::LaunchFailed, detail)
            .await?
        {
            self.count_failure(*session, FailureReason::LaunchFailed, detail);
        } else if inner
            .store
            .add_failure_detail(*session, worker_ref, detail)
            .await?
        {
            tracing::info!(session = %session.0, detail, "failure detail recorded");
        } else {
            // Recorded already (another replica, an earlier report), or the row is not
            // this worker's: the reaper stops what belongs to an ended session.
            return Ok(());
        }
        self.stop_logged(*session, worker_ref).await;
        Ok(())
    }

    /// O3 at start: a session whose worker vanished with a previous process fails; one
    /// whose worker still runs is tracked again. Sessions `provisioning` with no worker
    /// are left to their retried provision task.
    pub async fn reconcile(&self) -> Result<(), Error> {
        let inner = &self.inner;
        let mut gone = 0usize;
        let mut adopted = 0usize;
        for row in inner.store.launched().await? {
            let Some(worker_ref) = row.worker_ref.as_deref() else {
                continue;
            };
            let running = match inner.launcher.is_running(row.session, worker_ref).await {
                Ok(running) => running,
                // Another launcher's worker (say, a Job while running locally): not ours.
                Err(crate::launcher::LaunchError::InvalidRef) => continue,
                Err(e) => return Err(e.into()),
            };
            if running {
                adopted += 1;
                continue;
            }
            gone += 1;
            match row.state {
                Some(SessionState::Terminating) => {
                    inner.store.finish_terminating(row.session).await?;
                }
                Some(state @ (SessionState::Connecting | SessionState::Ready)) => {
                    let reason = if state == SessionState::Connecting {
                        FailureReason::DialTimeout
                    } else {
                        FailureReason::HeartbeatLost
                    };
                    if inner
                        .store
                        .fail_worker(row.session, worker_ref, reason, WORKER_GONE_ON_RESTART)
                        .await?
                    {
                        self.count_failure(row.session, reason, WORKER_GONE_ON_RESTART);
                    }
                }
                _ => {}
            }
        }
        if gone + adopted > 0 {
            tracing::info!(
                gone,
                adopted,
                "reconciled sessions left by a previous process"
            );
        }
        Ok(())
    }

    /// On shutdown: local workers die with the manager, and their sessions end.
    pub async fn stop_workers(&self) {
        let inner = &self.inner;
        if !inner.launcher.workers_die_with_manager() {
            return;
        }
        let Ok(running) = inner.launcher.running().await else {
            return;
        };
        let stops = running.iter().map(|worker| async move {
            self.stop_logged(worker.session, &worker.worker_ref).await;
            if inner
                .store
                .terminate_worker(worker.session, &worker.worker_ref)
                .await
                .is_err()
            {
                tracing::warn!(session = %worker.session.0, error_class = "store", "recording a stopped worker failed");
            }
        });
        futures_util::future::join_all(stops).await;
        if !running.is_empty() {
            tracing::info!(stopped = running.len(), "local workers stopped");
        }
    }
}

/// Runs `pass` every `period` until `stop`; a failed pass is logged as `failed` with its
/// error class, and the next one runs on time.
async fn every<F, Fut>(
    period: Duration,
    stop: &CancellationToken,
    failed: &'static str,
    mut pass: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = pass().await {
            tracing::warn!(error_class = e.metric_label(), "{failed}");
        }
    }
}
