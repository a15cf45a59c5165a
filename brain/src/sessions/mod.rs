//! Worker sessions: hands on demand (SPEC W1-W7).
//!
//! - `tool.rs`: the worker tools of an agent's RuntimeProfile, offered before any worker
//!   exists; the first call asks for a session and waits for it.
//! - `connect.rs`: the endpoint workers dial, the MCP handshake, heartbeats.
//! - `registry.rs`: the workers whose socket this replica holds.
//! - `relay.rs`: calls for a worker another replica holds, through Redis (W4).
//!
//! A session row is keyed by (agent, chat); a live one is reused, so the provision queue
//! is touched once per session, never per call (W1). The runtime-manager launches the
//! worker and moves the row to `connecting`; this module moves it to `ready` or `failed`.
//!
//! Architecture invariant: a replica holds a worker's socket and nothing else about it;
//! every state is in Postgres, so any replica can tell where a session stands.

mod connect;
mod registry;
mod relay;
mod tool;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use channel::token::TokenKeys;
use protocol::channel::{FailureReason, SessionState, SessionTask};
use protocol::ui::{UiChunk, WorkerStatus};
use protocol::{AgentId, ChatId, SessionId, TeamId};
use queue::SessionQueue;
use tokio::sync::{OnceCell, mpsc};
use tokio_util::sync::CancellationToken;

pub use connect::connect;
use registry::{Binding, LiveWorker, Pool, Registry};
pub use tool::worker_tools;

use crate::config::WorkerConfig;
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};

/// How often a waiting call looks at its session's row.
const WAIT_POLL: Duration = Duration::from_millis(20);

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

/// Shared by every turn: cheap to clone.
#[derive(Clone)]
pub struct Sessions(Arc<Inner>);

pub struct Inner {
    store: Store,
    redis_url: String,
    redis_client: redis::Client,
    /// This process's identity among replicas (owner keys, relay channel).
    replica: String,
    config: WorkerConfig,
    keys: TokenKeys,
    registry: Registry,
    /// Sessions whose last-use write is in flight.
    touching: Mutex<HashSet<SessionId>>,
    /// Pooled workers connected to this replica, unclaimed (R3).
    pool: Pool,
    queue: OnceCell<SessionQueue>,
    metrics: Metrics,
}

impl std::ops::Deref for Sessions {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl Sessions {
    pub fn new(
        replica: protocol::ReplicaId,
        store: Store,
        redis_url: String,
        redis_client: redis::Client,
        config: WorkerConfig,
        metrics: Metrics,
    ) -> Result<Self, channel::token::TokenError> {
        let keys = TokenKeys::new(&config.token_key)?;
        Ok(Self(Arc::new(Inner {
            store,
            redis_url,
            redis_client,
            replica: replica.0.simple().to_string(),
            config,
            keys,
            registry: Registry::default(),
            touching: Mutex::default(),
            pool: Pool::default(),
            queue: OnceCell::new(),
            metrics,
        })))
    }

    async fn queue(&self) -> Result<&SessionQueue, SessionError> {
        self.queue
            .get_or_try_init(|| async {
                SessionQueue::connect_with_namespace(&self.redis_url, &self.config.queue_namespace)
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
        team: TeamId,
        agent: AgentId,
        chat: ChatId,
        profile: &str,
        ui: Option<&mpsc::Sender<UiChunk>>,
        cancel: &CancellationToken,
    ) -> Result<Target, SessionError> {
        if let Some((session, worker)) = self.registry.for_chat(agent, chat) {
            return Ok(Target::Local { session, worker });
        }
        let target = self.locate(team, agent, chat, profile, ui, cancel).await?;
        if let Target::Local { session, .. } = &target {
            self.registry.remember_chat(agent, chat, *session);
        }
        Ok(target)
    }

    async fn locate(
        &self,
        team: TeamId,
        agent: AgentId,
        chat: ChatId,
        profile: &str,
        ui: Option<&mpsc::Sender<UiChunk>>,
        cancel: &CancellationToken,
    ) -> Result<Target, SessionError> {
        let mut row = match self.store.live_session(team, agent, chat).await? {
            Some(row) => row,
            None => {
                if let Some((session, worker)) = self.claim_warm(team, agent, chat, profile).await?
                {
                    return Ok(Target::Local { session, worker });
                }
                self.provision(team, agent, chat, profile).await?
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
        loop {
            if shown != Some(row.state) {
                shown = Some(row.state);
                if let Some(ui) = ui {
                    let _ = ui
                        .send(UiChunk::DataWorkerStatus {
                            data: WorkerStatus {
                                session_id: row.id,
                                state: row.state,
                                reason: row.failure_reason.clone(),
                            },
                        })
                        .await;
                }
            }
            match row.state {
                SessionState::Failed => {
                    return Err(SessionError::Failed(
                        row.failure_reason.unwrap_or_else(|| "unknown".into()),
                    ));
                }
                SessionState::Terminating | SessionState::Terminated => {
                    return Err(SessionError::Failed("the session ended".into()));
                }
                SessionState::Ready => {
                    if let Some(worker) = self.registry.get(row.id) {
                        return Ok(Target::Local {
                            session: row.id,
                            worker,
                        });
                    }
                    match self.owner(row.id).await {
                        Some(owner) if owner != self.replica => {
                            return Ok(Target::Remote {
                                owner,
                                session: row.id,
                            });
                        }
                        Some(_) => {}
                        None if !replaced => {
                            // Ready, but no replica holds its channel (its replica died or
                            // restarted): this session needs a new worker (O3).
                            self.fail(
                                row.id,
                                FailureReason::HeartbeatLost,
                                Some("no replica holds its channel"),
                            )
                            .await;
                            replaced = true;
                            row = self.provision(team, agent, chat, profile).await?;
                            continue;
                        }
                        None => {}
                    }
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(SessionError::Timeout);
            }
            tokio::select! {
                () = cancel.cancelled() => return Err(SessionError::Cancelled),
                () = tokio::time::sleep(WAIT_POLL) => {}
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

    /// Claims a pooled worker of `profile` connected to this replica, if one waits: the
    /// session is `ready` at once, no launch and no queue (R3). An empty pool answers
    /// `None` and the caller falls back to a cold start.
    async fn claim_warm(
        &self,
        team: TeamId,
        agent: AgentId,
        chat: ChatId,
        profile: &str,
    ) -> Result<Option<(SessionId, Arc<LiveWorker>)>, SessionError> {
        while let Some(worker) = self.pool.take(profile) {
            let Some(slot) = worker.slot else { continue };
            match self
                .store
                .claim_pool_slot(slot, team, agent, chat, profile)
                .await
            {
                Ok(Some(row)) => {
                    let binding = Binding {
                        session: row.id,
                        team,
                        agent,
                    };
                    self.claim_owner(row.id, self.config.ping_interval * 3)
                        .await;
                    if !self.bind(&worker, binding).await {
                        self.fail(
                            row.id,
                            FailureReason::HeartbeatLost,
                            Some("bind not delivered"),
                        )
                        .await;
                        continue;
                    }
                    self.registry.insert(row.id, worker.clone());
                    tracing::info!(session = %row.id, slot = %slot, profile, "warm worker claimed");
                    return Ok(Some((row.id, worker)));
                }
                // Taken or gone meanwhile: try the next one.
                Ok(None) => continue,
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
        Ok(None)
    }

    /// Writes a `pending` session and queues its provision task (once per session).
    async fn provision(
        &self,
        team: TeamId,
        agent: AgentId,
        chat: ChatId,
        profile: &str,
    ) -> Result<crate::store::SessionRow, SessionError> {
        let row = match self.store.create_session(team, agent, chat, profile).await {
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
        Ok(row)
    }
}
