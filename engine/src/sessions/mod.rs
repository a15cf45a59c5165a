//! Worker sessions: hands on demand (SPEC W1-W7).
//!
//! - `tool.rs`: the worker tools of an agent's RuntimeProfile, offered before any worker
//!   exists; the first call asks for a session and waits for it.
//! - `call.rs`: one call on a worker this replica holds, for the tools and the relay.
//! - `connect.rs`: the channel workers dial (its route is `api/worker.rs`), the MCP
//!   handshake, heartbeats.
//! - `registry.rs`: the workers whose socket this replica holds.
//! - `relay.rs`: calls for a worker another replica holds, through Redis (W4).
//! - `secrets.rs`: the agent's secrets sent as the session's environment, and masked in
//!   what the worker answers (W12).
//! - `snapshot.rs`: workspace snapshots at idle teardown and their restore (W10; the
//!   routes are `api/worker.rs`).
//! - `uploads.rs`: the chat's files under `uploads/` in the workspace before a call runs
//!   (T25).
//! - `skills.rs`: the agent's skills under `skills/` beside them (B8), and the workspace's
//!   `AGENTS.md` read into a turn's prompt (M6).
//!
//! A session row is keyed by (agent, chat); a live one is reused, so the provision queue
//! is touched once per session, never per call (W1). The runtime-manager launches the
//! worker and moves the row to `connecting`; this module moves it to `ready` or `failed`.
//!
//! A `ready` session outlives its channel (W9): when the socket drops, the worker dials
//! again and any replica takes the re-dial, so the session, its workspace and its browser
//! go on. A call that finds no live owner waits `BRAIN_WORKER_REDIAL_GRACE_MS` for the
//! re-dial before failing the session `heartbeat_lost` and provisioning anew; a call that
//! cannot tell who owns it (Redis down) fails as a tool error and leaves it alone.
//!
//! Architecture invariant: a replica holds a worker's socket and nothing else about it;
//! every state is in Postgres, so any replica can tell where a session stands.

mod call;
mod connect;
mod placing;
mod registry;
mod relay;
mod secrets;
mod skills;
mod snapshot;
mod tool;
mod uploads;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use channel::token::TokenKeys;
use logging::traces::TraceContext;
use protocol::channel::{FailureReason, SessionState, SessionTask};
use protocol::ui::{UiChunk, WorkerStatus};
use protocol::{AgentId, ChatId, SessionId, TeamId};
use queue::SessionQueue;
use tokio::sync::{OnceCell, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use connect::Dial;
use registry::{Binding, LiveWorker, Pool, Registry};
pub use snapshot::{
    CONTENT_TYPE as SNAPSHOT_CONTENT_TYPE, Restore, SnapshotError, Upload, UploadSlots,
    record_skip, restorable, store_upload, sweep as sweep_snapshots,
};
pub use tool::worker_tools;

use crate::config::WorkerConfig;
use crate::metrics::Metrics;
use crate::quota::Quotas;
use store::{NewSession, Store, StoreError};

/// What a speculative start (W11) holds while it runs; a call of its chat waits on it.
type Gate = Arc<tokio::sync::Mutex<()>>;

/// How often a waiting call looks at its session's row.
const WAIT_POLL: Duration = Duration::from_millis(20);
/// How often a call waiting for a worker's re-dial looks for it.
const REDIAL_POLL: Duration = Duration::from_millis(100);
/// Idle slots of other replicas a claim tries before it falls back to a cold start: each
/// one whose bind fails (its holder died, say) costs a bound wait.
const REMOTE_CLAIM_TRIES: usize = 2;
/// How long a replica shutting down waits for its worker channels to close.
const GOING_AWAY_WAIT: Duration = Duration::from_secs(3);

/// Why a worker tool could not get a worker; the model reads the message.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the worker failed to start: {0}")]
    Failed(String),
    #[error("the worker did not become ready in time")]
    Timeout,
    #[error("the provision queue is unavailable")]
    Queue,
    #[error("the session store is unavailable")]
    Store(#[from] StoreError),
    #[error("cancelled")]
    Cancelled,
    /// Who holds the worker's channel cannot be told (Redis does not answer): the session
    /// is left as it is.
    #[error("where the worker is connected cannot be looked up right now; try again shortly")]
    OwnerUnknown,
    /// The replica named as holding the channel is gone and the worker has not dialed
    /// again yet; the session is left as it is.
    #[error("the worker is reconnecting to the brain; try again shortly")]
    Reconnecting,
    /// A quota of the team or of the turn's user (concurrent worker sessions,
    /// worker-seconds per day) refuses a new worker; the model reads why as the tool's error.
    #[error("refused: {}", .0.message())]
    Quota(crate::quota::Refusal),
}

impl SessionError {
    /// A stable class for traces and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Failed(_) => "failed",
            Self::Timeout => "timeout",
            Self::Queue => "queue_unavailable",
            Self::Store(_) => "store_unavailable",
            Self::Cancelled => "cancelled",
            Self::OwnerUnknown => "owner_unknown",
            Self::Reconnecting => "reconnecting",
            Self::Quota(_) => "quota",
        }
    }
}

/// Who holds a `ready` session's channel.
enum Owner {
    /// Another replica, alive.
    Replica(String),
    /// Nobody: no owner key, or one still naming `dead`, a replica that is gone.
    Gone { dead: Option<String> },
}

/// Where a session's worker can be reached.
pub enum Target {
    /// This replica holds its channel.
    Local {
        session: SessionId,
        worker: Arc<LiveWorker>,
    },
    /// Replica `owner` holds it; calls go through the relay.
    Remote { owner: String, session: SessionId },
}

impl Target {
    pub fn session(&self) -> SessionId {
        match self {
            Self::Local { session, .. } => *session,
            Self::Remote { session, .. } => *session,
        }
    }
}

/// The worker a call or a speculation asks for: the chat's, of `profile`, for the end user
/// whose turn asks (L4: a session started for it counts against its budgets).
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    pub profile: &'a str,
    /// The turn's end user (a JWT's subject); `None` for an API key's turn.
    pub user: Option<&'a str>,
}

impl<'a> Wanted<'a> {
    fn new_session(&self, speculative: bool) -> NewSession<'a> {
        NewSession {
            team: self.team,
            agent: self.agent,
            chat: self.chat,
            profile: self.profile,
            speculative,
            user: self.user,
        }
    }
}

/// Shared by every turn: cheap to clone.
#[derive(Clone)]
pub struct Sessions(Arc<Inner>);

pub struct Inner {
    store: Store,
    redis_client: crate::redis::Client,
    /// This process's identity among replicas, as owner keys and relay channels spell it.
    replica: String,
    /// The same, as the session rows record it (`owner_replica`).
    replica_id: protocol::ReplicaId,
    config: WorkerConfig,
    keys: TokenKeys,
    registry: Registry,
    /// Sessions whose last-use write is in flight.
    touching: Mutex<HashSet<SessionId>>,
    /// Pooled workers connected to this replica, unclaimed (R3).
    pool: Pool,
    queue: OnceCell<SessionQueue>,
    metrics: Metrics,
    /// Checked before a session is provisioned or a pooled worker claimed (E2).
    quotas: Quotas,
    /// The `provision` span of each session this replica queued and waits for, so its
    /// worker's handshake here joins the turn's trace (O2); best effort, kept no longer
    /// than the provision timeout. Empty when no traces are exported.
    awaited: Mutex<HashMap<SessionId, (TraceContext, Instant)>>,
    /// The chats whose worker a speculation (W11) is starting on this replica, each with a
    /// gate the speculation holds until it is done: a call of that chat waits at the gate
    /// before it looks, or it would provision while the speculation still claims.
    starting: Mutex<HashMap<(AgentId, ChatId), Gate>>,
    /// The chat's files each recent turn delivers to its worker (T25).
    manifests: uploads::Manifests,
}

impl std::ops::Deref for Sessions {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

/// What a wait for a session's worker does next.
enum Next {
    Found(Target),
    /// Its worker is gone: a new session replaces it (once per call).
    Replace,
    Wait,
}

impl Sessions {
    pub fn new(
        replica: protocol::ReplicaId,
        store: Store,
        redis_client: crate::redis::Client,
        config: WorkerConfig,
        metrics: Metrics,
        quotas: Quotas,
    ) -> Result<Self, channel::token::TokenError> {
        let mut keys = TokenKeys::new(&config.token_key)?;
        if let Some(accepted) = &config.token_key_accepted {
            keys = keys.also_accepting(accepted)?;
        }
        Ok(Self(Arc::new(Inner {
            store,
            redis_client,
            replica: replica.0.simple().to_string(),
            replica_id: replica,
            config,
            keys,
            registry: Registry::default(),
            touching: Mutex::default(),
            pool: Pool::default(),
            queue: OnceCell::new(),
            metrics,
            quotas,
            awaited: Mutex::default(),
            starting: Mutex::default(),
            manifests: uploads::Manifests::default(),
        })))
    }

    async fn queue(&self) -> Result<&SessionQueue, SessionError> {
        self.queue
            .get_or_try_init(|| async {
                SessionQueue::connect_with_namespace(
                    &self.redis_client,
                    &self.config.queue_namespace,
                )
                .await
            })
            .await
            .map_err(|err| {
                tracing::warn!(class = err.metric_label(), "provision queue unavailable");
                SessionError::Queue
            })
    }

    /// Records a failure on a live session (a no-op on one that already ended).
    async fn fail(&self, session: SessionId, reason: FailureReason, detail: Option<&str>) {
        match self.store.fail_session(session, reason, detail).await {
            // Counted when the session actually failed, not when its teardown's end
            // of channel arrives after it.
            Ok(true) => {
                self.metrics_refused(reason);
                tracing::warn!(session = %session, reason = reason.as_str(), "worker session failed")
            }
            Ok(false) => {}
            Err(err) => {
                tracing::error!(session = %session, class = err.metric_label(), "could not record a session failure")
            }
        }
    }

    fn metrics_refused(&self, reason: FailureReason) {
        self.metrics
            .worker_failures
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// Records use of a session, which pushes its idle teardown back (W7). Off the call's
    /// path, which a commit would otherwise dominate: the write runs in its own task, and
    /// a use while a write for the same session is in flight rides on that write (the
    /// idle window is seconds to minutes, one write is about a millisecond).
    fn touched(&self, session: SessionId) {
        let first = self
            .touching
            .lock()
            .map(|mut touching| touching.insert(session))
            .unwrap_or(false);
        if !first {
            return;
        }
        let sessions = self.clone();
        tokio::spawn(async move {
            if let Err(err) = sessions.store.touch_session(session).await {
                tracing::warn!(session = %session, class = err.metric_label(), "session use not recorded");
            }
            if let Ok(mut touching) = sessions.touching.lock() {
                touching.remove(&session);
            }
        });
    }

    /// The live worker of (agent, chat), provisioning one if needed (W1, W2). Shows
    /// each state change on `ui` as a `data-worker-status` part. A session whose worker
    /// this replica holds is found in memory: a reused session's call reads nothing.
    pub async fn ensure(
        &self,
        wanted: Wanted<'_>,
        ui: Option<&mpsc::Sender<UiChunk>>,
        cancel: &CancellationToken,
    ) -> Result<Target, SessionError> {
        let Wanted {
            agent,
            chat,
            profile,
            ..
        } = wanted;
        let gate = self
            .starting
            .lock()
            .ok()
            .and_then(|starting| starting.get(&(agent, chat)).cloned());
        if let Some(gate) = gate {
            tokio::select! {
                _ = gate.lock() => {}
                () = cancel.cancelled() => return Err(SessionError::Cancelled),
            }
        }
        if let Some((session, worker)) = self.registry.for_chat(agent, chat) {
            return Ok(Target::Local { session, worker });
        }
        // O2: finding, claiming or provisioning the chat's worker, and waiting for it.
        let span = tracing::info_span!(
            "provision",
            profile = %profile,
            session.id = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let located = self
            .locate(wanted, ui, cancel)
            .instrument(span.clone())
            .await;
        let target = match located {
            Ok(target) => target,
            Err(err) => {
                span.record("outcome", err.metric_label());
                return Err(err);
            }
        };
        span.record("session.id", tracing::field::display(target.session()));
        span.record(
            "outcome",
            match &target {
                Target::Local { .. } => "local",
                Target::Remote { .. } => "remote",
            },
        );
        if let Target::Local { session, .. } = &target {
            self.registry.remember_chat(agent, chat, *session);
        }
        Ok(target)
    }

    async fn locate(
        &self,
        wanted: Wanted<'_>,
        ui: Option<&mpsc::Sender<UiChunk>>,
        cancel: &CancellationToken,
    ) -> Result<Target, SessionError> {
        let Wanted {
            team, agent, chat, ..
        } = wanted;
        let mut row = match self.store.live_session(team, agent, chat).await? {
            Some(row) => row,
            None => {
                // E2, L4: before any worker is started or claimed for the team and user.
                if let Some(refusal) = self.quotas.admit_session(team, wanted.user).await? {
                    self.metrics.quota_refused(refusal.field);
                    return Err(SessionError::Quota(refusal));
                }
                if let Some(target) = self.claim_warm(wanted, false).await? {
                    return Ok(target);
                }
                self.provision(wanted, false).await?
            }
        };
        if let Some(worker) = self.registry.get(row.id) {
            return Ok(Target::Local {
                session: row.id,
                worker,
            });
        }
        let deadline = Instant::now() + self.config.provision_timeout;
        let mut shown = None;
        let mut replaced = false;
        // Since when this `ready` session has had no live channel.
        let mut channel_gone = None;
        loop {
            if shown != Some(row.state) {
                shown = Some(row.state);
                // A progress part, never waited for: a client that stopped reading must
                // not hold the call up (its turn gives it up by the stall timeout).
                if let Some(ui) = ui {
                    let _ = ui.try_send(UiChunk::DataWorkerStatus {
                        data: WorkerStatus {
                            session_id: row.id,
                            state: row.state,
                            reason: row.failure_reason.clone(),
                        },
                    });
                }
            }
            let next = match row.state {
                // It failed while this call waited for its worker's re-dial (the
                // runtime-manager found the worker gone, say): a new one is needed.
                SessionState::Failed if channel_gone.is_some() && !replaced => Next::Replace,
                SessionState::Failed => {
                    return Err(SessionError::Failed(
                        row.failure_reason.unwrap_or_else(|| "unknown".into()),
                    ));
                }
                SessionState::Terminating | SessionState::Terminated => {
                    return Err(SessionError::Failed("the session ended".into()));
                }
                SessionState::Ready => self.on_ready(&row, &mut channel_gone, replaced).await?,
                _ => Next::Wait,
            };
            match next {
                Next::Found(target) => return Ok(target),
                Next::Replace => {
                    replaced = true;
                    channel_gone = None;
                    row = self.provision(wanted, false).await?;
                    continue;
                }
                Next::Wait => {}
            }
            if Instant::now() >= deadline {
                return Err(SessionError::Timeout);
            }
            // A re-dial is a reconnect and a handshake: no need to look every 20 ms.
            let poll = if channel_gone.is_some() {
                REDIAL_POLL
            } else {
                WAIT_POLL
            };
            tokio::select! {
                () = cancel.cancelled() => return Err(SessionError::Cancelled),
                () = tokio::time::sleep(poll) => {}
            }
            if let Some(worker) = self.registry.get(row.id) {
                return Ok(Target::Local {
                    session: row.id,
                    worker,
                });
            }
            row = self.store.session(row.id).await?;
        }
    }

    /// A `ready` session: its worker's channel here or on another replica, or none: then
    /// the worker may be dialing again (W9) until the grace is over, and a worker that
    /// never dialed back is gone, its session failed to be replaced once.
    async fn on_ready(
        &self,
        row: &store::SessionRow,
        channel_gone: &mut Option<Instant>,
        replaced: bool,
    ) -> Result<Next, SessionError> {
        if let Some(worker) = self.registry.get(row.id) {
            return Ok(Next::Found(Target::Local {
                session: row.id,
                worker,
            }));
        }
        let dead = match self.live_owner(row.id).await? {
            Owner::Replica(owner) => {
                return Ok(Next::Found(Target::Remote {
                    owner,
                    session: row.id,
                }));
            }
            Owner::Gone { dead } => dead,
        };
        let since = *channel_gone.get_or_insert_with(Instant::now);
        if since.elapsed() < self.config.redial_grace {
            return Ok(Next::Wait);
        }
        if dead.is_some() {
            // The key names a replica that seems gone, but the key lives on: too unsure
            // to replace the session.
            return Err(SessionError::Reconnecting);
        }
        if replaced {
            return Ok(Next::Wait);
        }
        // No worker dialed back: it is gone, and so are its workspace and browser (O3).
        self.fail(
            row.id,
            FailureReason::HeartbeatLost,
            Some("no replica holds its channel"),
        )
        .await;
        Ok(Next::Replace)
    }

    /// The chat's `ready` session, if it has one: where a call in flight at a takeover
    /// ran (D3). Not knowing is `None`: the call is then `outcome_unknown`.
    pub(super) async fn chat_session(
        &self,
        team: TeamId,
        agent: AgentId,
        chat: ChatId,
    ) -> Option<SessionId> {
        match store::bounded(self.store.live_session(team, agent, chat)).await {
            Ok(Some(row)) if row.state == SessionState::Ready => Some(row.id),
            _ => None,
        }
    }

    /// D3: the worker of `session` once it is connected again (W9) after its channel
    /// dropped under a call, waiting up to the re-dial grace; never provisions. `None` when
    /// the session ended or no worker came back in time.
    pub(super) async fn rejoin(
        &self,
        session: SessionId,
        cancel: &CancellationToken,
    ) -> Option<Target> {
        let deadline = Instant::now() + self.config.redial_grace;
        loop {
            if let Some(worker) = self.registry.get(session).filter(|worker| worker.is_up()) {
                return Some(Target::Local { session, worker });
            }
            match store::bounded(self.store.session(session)).await {
                Ok(row) if row.state == SessionState::Ready => {
                    if let Ok(Owner::Replica(owner)) = self.live_owner(session).await {
                        return Some(Target::Remote { owner, session });
                    }
                }
                Ok(_) => return None,
                // Unknown is not "ended": look again.
                Err(_) => {}
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::select! {
                () = cancel.cancelled() => return None,
                () = tokio::time::sleep(REDIAL_POLL) => {}
            }
        }
    }

    /// Who holds `session`'s channel, as far as it can be told. The caller has checked
    /// this replica's registry: an owner key naming this replica is stale (our channel
    /// ended), and one naming a replica that does not listen on its relay channel any more
    /// is a dead replica's.
    async fn live_owner(&self, session: SessionId) -> Result<Owner, SessionError> {
        match self.owner(session).await? {
            None => Ok(Owner::Gone { dead: None }),
            Some(owner) if owner == self.replica => Ok(Owner::Gone { dead: None }),
            Some(owner) => {
                if self.replica_listening(&owner).await? {
                    Ok(Owner::Replica(owner))
                } else {
                    Ok(Owner::Gone { dead: Some(owner) })
                }
            }
        }
    }

    /// Starts the worker of (agent, chat) ahead of a call the model is still streaming
    /// (W11): claims a pooled worker or queues a provision, marked speculative, and does
    /// not wait for it. `None` when nothing was started: the chat has a live session, a
    /// quota refuses, or the store or queue failed (the call itself finds out and says
    /// so).
    pub async fn speculate(&self, wanted: Wanted<'_>) -> Option<SessionId> {
        let Wanted {
            team,
            agent,
            chat,
            profile,
            ..
        } = wanted;
        if self.registry.for_chat(agent, chat).is_some() {
            return None;
        }
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let held = gate.clone().lock_owned().await;
        if let Ok(mut starting) = self.starting.lock() {
            starting.insert((agent, chat), gate.clone());
        }
        // The same steps, and bounds, as a call's own start (`locate`); not raced against
        // a timeout of its own, which could leave a row written and its task unqueued.
        let started: Result<Option<SessionId>, SessionError> = async {
            if self.store.live_session(team, agent, chat).await?.is_some()
                || self
                    .quotas
                    .admit_session(team, wanted.user)
                    .await?
                    .is_some()
            {
                return Ok(None);
            }
            if let Some(target) = self.claim_warm(wanted, true).await? {
                return Ok(Some(target.session()));
            }
            self.provision(wanted, true).await.map(|row| Some(row.id))
        }
        .await;
        // Out of the map first, then open: a call that found the gate waits for this
        // start; one that comes later finds its session.
        if let Ok(mut starting) = self.starting.lock()
            && starting
                .get(&(agent, chat))
                .is_some_and(|g| Arc::ptr_eq(g, &gate))
        {
            starting.remove(&(agent, chat));
        }
        drop(held);
        match started {
            Ok(Some(session)) => {
                tracing::info!(session = %session, profile, "worker started speculatively");
                Some(session)
            }
            Ok(None) => None,
            Err(err) => {
                tracing::debug!(error = %err, "no speculative start; the call will start its worker");
                None
            }
        }
    }

    /// The turn that started `session` speculatively ended: unless a call used it, it is
    /// torn down `grace` from now (W11). The runtime-manager does it, on an idle check
    /// pushed for then; a push that fails is caught up by its reaper, which arms checks
    /// from the rows.
    pub async fn abandon_speculation(&self, session: SessionId, grace: Duration) {
        match store::bounded(self.store.abandon_speculation(session, grace)).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => {
                tracing::warn!(session = %session, class = err.metric_label(), "unused speculative session left to its idle window");
                return;
            }
        }
        tracing::info!(session = %session, grace_ms = grace.as_millis() as u64, "speculative session unused");
        let task = SessionTask::IdleCheck {
            session,
            last_used_ms: chrono::Utc::now().timestamp_millis(),
        };
        let pushed = match self.queue().await {
            Ok(queue) => queue.push_after(task, grace).await.is_ok(),
            Err(_) => false,
        };
        if !pushed {
            tracing::warn!(session = %session, "idle check of an unused speculative session not queued; the reaper arms it");
        }
    }

    /// Closes every worker channel this replica holds with "going away" (1001), for a
    /// replica shutting down: each worker dials again and another replica takes it (W9).
    /// Returns once each channel has ended and been let go of here (owner key released),
    /// or after a few seconds; the count is of the channels closed.
    pub async fn close_all_going_away(&self) -> usize {
        let workers: Vec<Arc<LiveWorker>> = self
            .registry
            .all()
            .into_iter()
            .chain(self.pool.all())
            .collect();
        for worker in &workers {
            worker.close_going_away().await;
        }
        let released = futures_util::future::join_all(
            workers.iter().map(|worker| worker.released.cancelled()),
        );
        if tokio::time::timeout(GOING_AWAY_WAIT, released)
            .await
            .is_err()
        {
            tracing::warn!(workers = workers.len(), "worker channels still closing");
        }
        tracing::info!(
            workers = workers.len(),
            "worker channels closed: going away"
        );
        workers.len()
    }

    /// Claims a pooled worker of `profile`, if one waits anywhere: the session is `ready`
    /// at once, no launch and no queue (R3). One connected to this replica first; else one
    /// another replica holds, which binds it when asked over the relay and then serves the
    /// session's calls through it (W4). No idle slot answers `None` and the caller falls
    /// back to a cold start. A chat with a workspace snapshot (W10) has it restored by the
    /// bound worker before the claim returns.
    async fn claim_warm(
        &self,
        wanted: Wanted<'_>,
        speculative: bool,
    ) -> Result<Option<Target>, SessionError> {
        let Wanted {
            team,
            agent,
            chat,
            profile,
            ..
        } = wanted;
        let restore = self.store.chat_has_snapshot(team, agent, chat).await?;
        let new = wanted.new_session(speculative);
        while let Some(worker) = self.pool.take(profile) {
            let Some(slot) = worker.slot else { continue };
            match self
                .store
                .claim_pool_slot(slot, &new, self.replica_id)
                .await
            {
                Ok(Some(row)) => {
                    let binding = Binding {
                        session: row.id,
                        team,
                        agent,
                    };
                    if !self.bind_claimed(&worker, binding, restore).await {
                        continue;
                    }
                    tracing::info!(session = %row.id, slot = %slot, profile, "warm worker claimed");
                    return Ok(Some(Target::Local {
                        session: row.id,
                        worker,
                    }));
                }
                // Claimed by another replica (its bind is on its way here), or retired:
                // kept findable by its slot until its channel ends.
                Ok(None) => self.pool.park(worker),
                Err(StoreError::Conflict(_)) => {
                    // The chat got a live session meanwhile: it will be reused.
                    self.pool.put(profile, worker);
                    return Ok(None);
                }
                Err(err) => {
                    self.pool.put(profile, worker);
                    return Err(err.into());
                }
            }
        }
        for _ in 0..REMOTE_CLAIM_TRIES {
            let claimed = match self
                .store
                .claim_remote_pool_slot(&new, self.replica_id)
                .await
            {
                Ok(Some(claimed)) => claimed,
                Ok(None) | Err(StoreError::Conflict(_)) => return Ok(None),
                Err(err) => return Err(err.into()),
            };
            let session = claimed.session.id;
            let holder = claimed.holder.0.simple().to_string();
            let bound = relay::bind_remote(
                self,
                &holder,
                relay::RemoteBind {
                    slot: claimed.slot,
                    session,
                    team,
                    agent,
                    chat,
                    restore,
                },
            )
            .await;
            match bound {
                Ok(()) => {
                    tracing::info!(session = %session, slot = %claimed.slot, profile, "warm worker of another replica claimed");
                    return Ok(Some(Target::Remote {
                        owner: holder,
                        session,
                    }));
                }
                Err(why) => {
                    tracing::warn!(session = %session, slot = %claimed.slot, why, "remote warm claim not bound");
                    self.fail(
                        session,
                        FailureReason::HeartbeatLost,
                        Some("bind not delivered"),
                    )
                    .await;
                }
            }
        }
        Ok(None)
    }

    /// Binds a pooled worker this replica holds to the session just claimed with its slot,
    /// and makes it the session's: owner key, registry. A bind that cannot be delivered
    /// fails the session (`heartbeat_lost`, "bind not delivered").
    async fn bind_claimed(
        &self,
        worker: &Arc<LiveWorker>,
        binding: Binding,
        restore: bool,
    ) -> bool {
        self.claim_owner(binding.session, self.config.ping_interval * 3)
            .await;
        if !self.bind(worker, binding, restore).await {
            self.fail(
                binding.session,
                FailureReason::HeartbeatLost,
                Some("bind not delivered"),
            )
            .await;
            return false;
        }
        self.registry.insert(binding.session, worker.clone());
        true
    }

    /// Writes a `pending` session and queues its provision task (once per session).
    async fn provision(
        &self,
        wanted: Wanted<'_>,
        speculative: bool,
    ) -> Result<store::SessionRow, SessionError> {
        let Wanted {
            team,
            agent,
            chat,
            profile,
            ..
        } = wanted;
        let row = match self
            .store
            .create_session(&wanted.new_session(speculative))
            .await
        {
            Ok(row) => row,
            // Another call of this chat won the race; its task is queued.
            Err(StoreError::Conflict(_)) => {
                return self
                    .store
                    .live_session(team, agent, chat)
                    .await?
                    .ok_or(SessionError::Failed("the session ended".into()));
            }
            Err(err) => return Err(err.into()),
        };
        let task = SessionTask::Provision {
            session: row.id,
            team,
            agent,
            chat,
            profile: profile.to_owned(),
        };
        let pushed = match self.queue().await {
            Ok(queue) => queue.push(task).await.map_err(|err| {
                tracing::warn!(class = err.metric_label(), "provision task not queued");
                SessionError::Queue
            }),
            Err(err) => Err(err),
        };
        if let Err(err) = pushed {
            self.fail(
                row.id,
                FailureReason::LaunchFailed,
                Some("queue_unavailable"),
            )
            .await;
            return Err(err);
        }
        tracing::info!(session = %row.id, profile, "provision task queued");
        // Called in the `provision` span: the worker's handshake is to continue it.
        if let Some(trace) = logging::traces::context_of(&tracing::Span::current())
            && let Ok(mut awaited) = self.awaited.lock()
        {
            let window = self.config.provision_timeout;
            awaited.retain(|_, (_, since)| since.elapsed() < window);
            awaited.insert(row.id, (trace, Instant::now()));
        }
        Ok(row)
    }

    /// The trace context of the provisioning that waits for `session`'s worker here.
    fn awaited_trace(&self, session: SessionId) -> Option<TraceContext> {
        let mut awaited = self.awaited.lock().ok()?;
        awaited.remove(&session).map(|(trace, _)| trace)
    }
}
