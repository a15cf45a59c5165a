//! The worker channel (SPEC W3, W6): what follows once a worker dialed
//! `GET /v1/worker/connect` (the route is `api/worker.rs`, which checks the token before
//! the upgrade: 401, no upgrade, for one that is neither a session's nor a pool's).
//!
//! After the upgrade, in order, each refusal closing the socket with a code and the failure
//! reason's name and recording it on the session row:
//! 1. the channel version header matches ([`CHANNEL_VERSION`]) — `channel_version`;
//! 2. the token's session is the one the worker names and it is `connecting` (or `ready`,
//!    for a re-dial) — `session_mismatch` (a mismatch with the unauthenticated header
//!    changes only the token's session, and only while `connecting`);
//! 3. MCP `initialize` completes within the handshake timeout — `handshake_timeout`;
//! 4. `tools/list` answers within the ready timeout — `ready_timeout`.
//!
//! Then the session is `ready`, the worker joins this replica's registry, and a
//! heartbeat task pings it until the channel ends; silence past the heartbeat timeout is
//! `heartbeat_lost`.
//!
//! A re-dial (W9) is a dial for a `ready` session: its worker lost its channel and dials
//! again, reaching any replica. It is taken when no live channel exists (none here, and
//! the owner key absent or naming a replica that is gone): the same handshake, then the
//! owner key is taken over (compare-and-set) and the session, still `ready`, is served
//! here. While a live channel exists, or who holds it cannot be told, the dial is closed
//! with 4006 `channel_held` (the live channel undisturbed) and the worker tries again. A
//! channel that ends on its own leaves its session `ready` for the re-dial; only a worker
//! that closes with "going away" (it is exiting) fails it `heartbeat_lost` at once.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use channel::ws::{ChannelEnd, split};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use logging::traces::TraceContext;
use protocol::SessionId;
use protocol::channel::{
    BIND_NOTIFICATION, CHANNEL_VERSION, CLOSE_CHANNEL_HELD, CLOSE_CHANNEL_VERSION,
    CLOSE_GOING_AWAY, CLOSE_HANDSHAKE_TIMEOUT, CLOSE_READY_TIMEOUT, CLOSE_SESSION_ENDED,
    CLOSE_SESSION_MISMATCH, FailureReason, SessionClaims, SessionState, TOKEN_NOTIFICATION,
};
use rmcp::model::{ClientNotification, CustomNotification};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

/// The largest channel message the brain accepts: a 25 MiB artifact, base64-encoded,
/// with room to spare.
const MAX_CHANNEL_MESSAGE: usize = 48 << 20;
/// How long a re-dial waits for this replica to let go of the session's ending channel.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

use super::registry::{Binding, LiveWorker, WorkerClient};
use super::{Owner, Sessions};

/// Who is dialing: a worker launched for a session, or a pooled worker (R3).
pub enum Dial {
    Session(SessionClaims),
    Pool(SessionClaims),
}

impl Dial {
    pub fn claims(&self) -> &SessionClaims {
        match self {
            Self::Session(claims) | Self::Pool(claims) => claims,
        }
    }
}

impl Sessions {
    /// Who a worker's bearer token says is dialing: a session's worker, else a pooled one;
    /// `None` for a token that is neither.
    pub fn dialer(&self, token: &str) -> Option<Dial> {
        match self.keys.verify(token) {
            Ok(claims) => Some(Dial::Session(claims)),
            Err(_) => self.keys.verify_pool(token).ok().map(Dial::Pool),
        }
    }

    /// A session token's claims; `None` for anything else, a pool token included.
    pub fn session_claims(&self, token: &str) -> Option<SessionClaims> {
        self.keys.verify(token).ok()
    }

    /// Serves the channel of a worker whose upgrade was accepted, until it ends: refused
    /// at once for another channel `version`, else the handshake. `named` is the session
    /// the worker's header names (its token's, when it named none).
    pub async fn serve_dial(
        &self,
        upgraded: Upgraded,
        dial: Dial,
        version: Option<u32>,
        named: SessionId,
    ) {
        // Artifacts come through the channel base64-encoded in one message: allow more
        // than tungstenite's 16 MiB frame default (BRAIN_ARTIFACT_MAX_BYTES is 25 MiB).
        let limits = WebSocketConfig::default()
            .max_message_size(Some(MAX_CHANNEL_MESSAGE))
            .max_frame_size(Some(MAX_CHANNEL_MESSAGE));
        let ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(limits))
                .await;
        if version != Some(CHANNEL_VERSION) {
            self.refuse_version(ws, &dial).await;
            return;
        }
        match dial {
            Dial::Session(claims) => self.run_session_channel(ws, claims, named).await,
            Dial::Pool(claims) => self.run_pool_channel(ws, claims).await,
        }
    }

    /// Another channel version: refused at once with a close reason, never a hang.
    async fn refuse_version<S>(&self, ws: WebSocketStream<S>, dial: &Dial)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (_sink, _stream, control) = split::<RoleClient, _>(ws);
        match dial {
            Dial::Session(claims) => {
                self.fail(claims.sub, FailureReason::ChannelVersion, None)
                    .await
            }
            Dial::Pool(claims) => {
                self.slot_gone(claims.sub, FailureReason::ChannelVersion)
                    .await
            }
        }
        control
            .close(
                CLOSE_CHANNEL_VERSION,
                FailureReason::ChannelVersion.as_str(),
            )
            .await;
    }

    /// MCP `initialize`, then `tools/list`, each within its timeout; in a
    /// `channel_handshake` span (O2) for `session` (or pool slot).
    async fn handshake<Si, St>(
        &self,
        sink: Si,
        stream: St,
        session: SessionId,
        parent: Option<&TraceContext>,
    ) -> Result<RunningService<RoleClient, WorkerClient>, (FailureReason, u16)>
    where
        Si: futures_util::Sink<
                rmcp::service::TxJsonRpcMessage<RoleClient>,
                Error = channel::ws::ChannelError,
            > + Send
            + Unpin
            + 'static,
        St: futures_util::Stream<Item = rmcp::service::RxJsonRpcMessage<RoleClient>>
            + Send
            + Unpin
            + 'static,
    {
        let span = tracing::info_span!(
            "channel_handshake",
            session.id = %session,
            outcome = tracing::field::Empty,
        );
        logging::traces::continue_from(&span, parent);
        let done = async {
            let served = tokio::time::timeout(
                self.config.handshake_timeout,
                WorkerClient::default().serve((sink, stream)),
            )
            .await;
            let Ok(Ok(service)) = served else {
                return Err((FailureReason::HandshakeTimeout, CLOSE_HANDSHAKE_TIMEOUT));
            };
            match tokio::time::timeout(self.config.ready_timeout, service.list_all_tools()).await {
                Ok(Ok(_)) => Ok(service),
                _ => Err((FailureReason::ReadyTimeout, CLOSE_READY_TIMEOUT)),
            }
        }
        // Not entered: rmcp's service task would take it as its own span and keep it open
        // for the channel's life.
        .await;
        span.record(
            "outcome",
            match &done {
                Ok(_) => "ready",
                Err((reason, _)) => reason.as_str(),
            },
        );
        done
    }

    /// A worker launched for one session dials in (W3).
    async fn run_session_channel<S>(
        &self,
        ws: WebSocketStream<S>,
        claims: SessionClaims,
        named: SessionId,
    ) where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let session = claims.sub;
        let (sink, stream, control) = split::<RoleClient, _>(ws);
        let refuse = |reason: FailureReason, code: u16, on: SessionId| {
            let control = control.clone();
            async move {
                self.fail(on, reason, None).await;
                control.close(code, reason.as_str()).await;
            }
        };
        if named != session {
            return self.refuse_mismatch(session, &control).await;
        }
        let redial = match self.dialed_session(session).await {
            Ok(row) if row.state == SessionState::Connecting => {
                if let Err(err) = self.store.session_dialed(session).await {
                    tracing::warn!(session = %session, class = err.metric_label(), "dial not recorded");
                }
                None
            }
            // Its worker lost its channel and dials again (W9).
            Ok(row) if row.state == SessionState::Ready => match self.redial_free(session).await {
                Some(dead) => Some(dead),
                None => return control.close(CLOSE_CHANNEL_HELD, "channel_held").await,
            },
            _ => {
                return refuse(
                    FailureReason::SessionMismatch,
                    CLOSE_SESSION_MISMATCH,
                    session,
                )
                .await;
            }
        };
        // The provisioning that waits for this worker, when it waits on this replica.
        let parent = self.awaited_trace(session);
        let service = match self.handshake(sink, stream, session, parent.as_ref()).await {
            Ok(service) => service,
            Err((reason, code)) => return refuse(reason, code, session).await,
        };
        // The secrets are part of being ready: the first call already has them (W12).
        if let Err(err) = self.send_env(&service, claims.team, claims.agent).await {
            tracing::warn!(session = %session, class = err.metric_label(), "session environment not delivered");
            return refuse(FailureReason::ReadyTimeout, CLOSE_READY_TIMEOUT, session).await;
        }
        let taken = match &redial {
            None => {
                // The owner key exists before the row says `ready`: a ready session
                // without one has lost its channel.
                self.claim_owner(session, self.owner_ttl()).await;
                self.store.session_ready(session, self.replica_id).await
            }
            Some(dead) => match self
                .take_owner(session, dead.as_deref(), self.owner_ttl())
                .await
            {
                Ok(true) => self.store.session_redialed(session, self.replica_id).await,
                // Another re-dial won, or Redis cannot tell: this worker tries again.
                Ok(false) | Err(_) => {
                    return control.close(CLOSE_CHANNEL_HELD, "channel_held").await;
                }
            },
        };
        if !matches!(taken, Ok(true)) {
            // Ended meanwhile (dial timeout, torn down, replaced): this worker is not
            // wanted.
            self.release_owner(session).await;
            return control.close(CLOSE_SESSION_ENDED, "session_ended").await;
        }
        match &redial {
            None => tracing::info!(session = %session, "worker ready"),
            Some(dead) => tracing::info!(session = %session, from = ?dead, "worker re-dialed"),
        }
        let binding = Binding {
            session,
            team: claims.team,
            agent: claims.agent,
        };
        let worker = Arc::new(LiveWorker::new(
            Some(binding),
            None,
            service,
            control,
            claims.exp,
        ));
        self.registry.insert(session, worker.clone());
        self.serve_worker(&worker).await;
    }

    /// A dial whose header names another session than its token (X2). Only what the
    /// token proves may change a row: the session the unauthenticated header names is
    /// never touched, and the token's own only while it waits for its worker (the worker
    /// launched for it is evidently broken), never a live one.
    async fn refuse_mismatch(&self, session: SessionId, control: &channel::ws::Control) {
        self.metrics_refused(FailureReason::SessionMismatch);
        match self
            .store
            .fail_connecting_session(session, FailureReason::SessionMismatch)
            .await
        {
            Ok(true) => {
                tracing::warn!(session = %session, reason = "session_mismatch", "worker session failed")
            }
            Ok(false) => {}
            Err(err) => {
                tracing::error!(session = %session, class = err.metric_label(), "could not record a session failure")
            }
        }
        control
            .close(
                CLOSE_SESSION_MISMATCH,
                FailureReason::SessionMismatch.as_str(),
            )
            .await;
    }

    /// Whether a re-dial may take `session`'s channel (W9): `Some(dead)` when no live
    /// channel for it exists, `dead` naming the gone replica the owner key still names,
    /// if any. `None` while a live channel exists (here, or on a replica that is alive) or
    /// that cannot be told: the live one is left alone and the worker tries again.
    async fn redial_free(&self, session: SessionId) -> Option<Option<String>> {
        if let Some(old) = self.registry.entry(session) {
            // Our channel for it is ending (the worker saw the drop first): wait for it to
            // be let go of, briefly.
            let released = tokio::time::timeout(RELEASE_WAIT, old.released.cancelled());
            if old.is_up() || released.await.is_err() {
                self.metrics_refused(FailureReason::SessionMismatch);
                return None;
            }
        }
        match self.live_owner(session).await {
            Ok(Owner::Gone { dead }) => Some(dead),
            Ok(Owner::Replica(_)) => {
                self.metrics_refused(FailureReason::SessionMismatch);
                None
            }
            Err(_) => None,
        }
    }

    /// The session a worker dialed for. A local worker can dial before the launcher has
    /// recorded the launch (`provisioning` → `connecting`): that short window is waited
    /// out, bounded by the handshake timeout, rather than refused.
    async fn dialed_session(
        &self,
        session: SessionId,
    ) -> Result<store::SessionRow, store::StoreError> {
        let deadline = Instant::now() + self.config.handshake_timeout;
        loop {
            let row = self.store.session(session).await?;
            if row.state != SessionState::Provisioning || Instant::now() >= deadline {
                return Ok(row);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// A pre-started worker dials in unassigned (R3); it waits in this replica's pool
    /// until a session claims it.
    async fn run_pool_channel<S>(&self, ws: WebSocketStream<S>, claims: SessionClaims)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let slot = claims.sub;
        let (sink, stream, control) = split::<RoleClient, _>(ws);
        let profile = match self.store.starting_pool_slot(slot).await {
            Ok(Some(profile)) => profile,
            _ => {
                self.metrics_refused(FailureReason::SessionMismatch);
                return control
                    .close(
                        CLOSE_SESSION_MISMATCH,
                        FailureReason::SessionMismatch.as_str(),
                    )
                    .await;
            }
        };
        // A pooled worker starts ahead of any turn: its handshake is a trace of its own.
        let service = match self.handshake(sink, stream, slot, None).await {
            Ok(service) => service,
            Err((reason, code)) => {
                self.slot_gone(slot, reason).await;
                return control.close(code, reason.as_str()).await;
            }
        };
        if !matches!(
            self.store.pool_slot_idle(slot, self.replica_id).await,
            Ok(true)
        ) {
            return control.close(CLOSE_SESSION_ENDED, "session_ended").await;
        }
        tracing::info!(slot = %slot, profile, "pooled worker ready");
        let worker = Arc::new(LiveWorker::new(
            None,
            Some(slot),
            service,
            control,
            claims.exp,
        ));
        self.pool.put(&profile, worker.clone());
        self.serve_worker(&worker).await;
    }

    async fn slot_gone(&self, slot: SessionId, reason: FailureReason) {
        self.metrics_refused(reason);
        if let Err(err) = self.store.pool_slot_gone(slot).await {
            tracing::warn!(slot = %slot, class = err.metric_label(), "pool slot end not recorded");
        }
    }

    /// Heartbeats until the channel ends, then forgets the worker everywhere.
    async fn serve_worker(&self, worker: &Arc<LiveWorker>) {
        self.heartbeat(worker).await;
        if let Some(slot) = worker.slot {
            self.pool.remove(slot);
            if worker.binding().is_none() {
                self.slot_gone(slot, FailureReason::HeartbeatLost).await;
            }
        }
        if let Some(binding) = worker.binding() {
            // Owner key and row first, the registry entry last: a re-dial reaching this
            // replica waits for the entry to go, so it never finds the key still ours.
            self.release_owner(binding.session).await;
            if let Err(err) = self
                .store
                .session_released(binding.session, self.replica_id)
                .await
            {
                tracing::warn!(session = %binding.session, class = err.metric_label(), "channel release not recorded");
            }
            self.registry.remove(binding.session, worker);
        }
        // In-flight calls hold the worker too: ending the MCP session fails them now
        // instead of leaving them waiting for an answer that cannot come.
        worker.service.cancellation_token().cancel();
        worker.released.cancel();
    }

    /// Binds a pooled worker to a new session: the session's token, then its secrets,
    /// then (when the chat has one) the restore of its workspace snapshot travel over the
    /// channel, so no cold start is needed.
    pub(super) async fn bind(&self, worker: &LiveWorker, binding: Binding, restore: bool) -> bool {
        if !worker.bind(binding) {
            return false;
        }
        let Ok(token) = self.keys.mint(
            binding.session,
            binding.team,
            binding.agent,
            self.config.token_ttl,
        ) else {
            return false;
        };
        worker.token_sent(unix_now() + self.config.token_ttl.as_secs());
        let params = serde_json::json!({ "session": binding.session, "token": token });
        let notification = CustomNotification::new(BIND_NOTIFICATION, Some(params));
        if worker
            .service
            .peer()
            .send_notification(ClientNotification::CustomNotification(notification))
            .await
            .is_err()
        {
            return false;
        }
        // The session's secrets follow the bind and are held before the claim returns, so
        // a pooled worker never needs a cold start for them (W12).
        match self
            .send_env(&worker.service, binding.team, binding.agent)
            .await
        {
            Ok(()) => {
                if restore {
                    self.restore_at_bind(worker, binding.session).await;
                }
                true
            }
            Err(err) => {
                tracing::warn!(session = %binding.session, class = err.metric_label(), "session environment not delivered");
                // Bound to a session that now fails: this worker serves nothing more.
                worker
                    .control
                    .close(CLOSE_SESSION_ENDED, "session_ended")
                    .await;
                false
            }
        }
    }

    /// Pings until the channel ends or the worker falls silent; keeps the owner key
    /// (unless a re-dial took it elsewhere) and renews the token in-band while less than
    /// half a token lifetime is left, so a re-dial always has a valid token.
    async fn heartbeat(&self, worker: &LiveWorker) {
        let mut ping = tokio::time::interval(self.config.ping_interval);
        let renew_within = self.config.token_ttl.as_secs() / 2;
        loop {
            tokio::select! {
                end = worker.control.ended() => {
                    self.channel_ended(worker, &end).await;
                    return;
                }
                _ = ping.tick() => {
                    if worker.control.last_seen().elapsed() > self.config.heartbeat_timeout {
                        tracing::warn!(slot = ?worker.slot, "worker heartbeat lost");
                        if let Some(binding) = worker.binding() {
                            self.fail(binding.session, FailureReason::HeartbeatLost, Some("no pong")).await;
                        }
                        worker.control.close(CLOSE_SESSION_ENDED, FailureReason::HeartbeatLost.as_str()).await;
                        return;
                    }
                    let _ = worker.control.ping().await;
                    if let Some(binding) = worker.binding() {
                        if let Ok(false) = self.take_owner(binding.session, None, self.owner_ttl()).await {
                            // This channel was given up for dead and its worker's re-dial
                            // taken elsewhere: whatever is still on it is not the session's.
                            tracing::warn!(session = %binding.session, "channel superseded by a re-dial");
                            worker.control.close(CLOSE_SESSION_ENDED, "session_ended").await;
                            return;
                        }
                        if worker.token_expires() <= unix_now() + renew_within {
                            self.renew_token(worker, binding).await;
                        }
                    }
                }
            }
        }
    }

    /// Owner keys outlive a few missed refreshes, not a dead replica.
    fn owner_ttl(&self) -> std::time::Duration {
        self.config.ping_interval * 3
    }

    async fn renew_token(&self, worker: &LiveWorker, binding: Binding) {
        let Ok(token) = self.keys.mint(
            binding.session,
            binding.team,
            binding.agent,
            self.config.token_ttl,
        ) else {
            return;
        };
        let notification = CustomNotification::new(
            TOKEN_NOTIFICATION,
            Some(serde_json::json!({ "token": token })),
        );
        if worker
            .service
            .peer()
            .send_notification(ClientNotification::CustomNotification(notification))
            .await
            .is_ok()
        {
            worker.token_sent(unix_now() + self.config.token_ttl.as_secs());
        } else {
            tracing::info!(session = %binding.session, "token renewal not delivered");
        }
    }

    /// A channel ended on its own. A worker that closed with "going away" is exiting:
    /// unless its session already ended (teardown), it has lost its worker. Any other end
    /// leaves the session `ready`: its worker dials again (W9), and a call meanwhile waits
    /// for that within the re-dial grace.
    async fn channel_ended(&self, worker: &LiveWorker, end: &ChannelEnd) {
        let class = match end {
            ChannelEnd::Closed { .. } => "closed",
            ChannelEnd::Eof => "eof",
            ChannelEnd::SocketError(class) => class,
            ChannelEnd::Undecodable => "undecodable",
            ChannelEnd::BinaryFrame => "binary_frame",
        };
        tracing::info!(slot = ?worker.slot, end = class, "worker channel ended");
        let Some(binding) = worker.binding() else {
            return;
        };
        let leaving = matches!(end, ChannelEnd::Closed { code, .. } if *code == CLOSE_GOING_AWAY);
        if leaving && !worker.sent_going_away() {
            self.fail(binding.session, FailureReason::HeartbeatLost, Some(class))
                .await;
        } else {
            tracing::info!(session = %binding.session, end = class, "worker channel lost; awaiting its re-dial");
        }
    }
}

/// Seconds since the Unix epoch, the unit of a token's `exp`.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}
