//! `GET /v1/worker/connect`: a worker dials in (SPEC W3, W6).
//!
//! Checks before the upgrade: a valid session token (else 401, no upgrade). After the
//! upgrade, in order, each refusal closing the socket with a code and the failure
//! reason's name and recording it on the session row:
//! 1. the channel version header matches ([`CHANNEL_VERSION`]) — `channel_version`;
//! 2. the token's session is the one the worker names and it is `connecting` —
//!    `session_mismatch`;
//! 3. MCP `initialize` completes within the handshake timeout — `handshake_timeout`;
//! 4. `tools/list` answers within the ready timeout — `ready_timeout`.
//!
//! Then the session is `ready`, the worker joins this replica's registry, and a
//! heartbeat task pings it until the channel ends; silence past the heartbeat timeout is
//! `heartbeat_lost`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use channel::ws::{ChannelEnd, split};
use hyper_util::rt::TokioIo;
use protocol::SessionId;
use protocol::channel::{
    CHANNEL_VERSION, CHANNEL_VERSION_HEADER, CLOSE_CHANNEL_VERSION, CLOSE_HANDSHAKE_TIMEOUT,
    CLOSE_READY_TIMEOUT, CLOSE_SESSION_ENDED, CLOSE_SESSION_MISMATCH, FailureReason,
    SESSION_HEADER, SessionClaims, SessionState,
};
use rmcp::model::{ClientNotification, CustomNotification};
use rmcp::{RoleClient, ServiceExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::Sessions;
use super::registry::{LiveWorker, WorkerClient};
use crate::AppState;
use crate::error::ApiError;

/// The custom notification that carries a renewed session token to the worker.
pub const TOKEN_NOTIFICATION: &str = "notifications/agent_runtime/token";

pub async fn connect(
    State(state): State<AppState>,
    mut request: Request,
) -> Result<Response, ApiError> {
    let sessions = state.sessions.clone();
    let headers = request.headers();
    let claims = bearer(headers)
        .and_then(|token| sessions.keys.verify(token).ok())
        .ok_or(ApiError::Unauthorized)?;
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| ApiError::InvalidRequest("expected a WebSocket upgrade".into()))?;
    let accept = derive_accept_key(key.as_bytes());
    let version = headers
        .get(CHANNEL_VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok());
    let named = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<SessionId>().ok())
        .unwrap_or(claims.sub);
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let upgraded = match upgrade.await {
            Ok(upgraded) => upgraded,
            Err(_) => {
                tracing::info!(session = %claims.sub, "worker upgrade failed");
                return;
            }
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        sessions.run_channel(ws, claims, named, version).await;
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    Ok(response.into_response())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

impl Sessions {
    /// Runs one worker channel from upgrade to end.
    async fn run_channel<S>(
        &self,
        ws: WebSocketStream<S>,
        claims: SessionClaims,
        named: SessionId,
        version: Option<u32>,
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
        if version != Some(CHANNEL_VERSION) {
            return refuse(
                FailureReason::ChannelVersion,
                CLOSE_CHANNEL_VERSION,
                session,
            )
            .await;
        }
        if named != session {
            return refuse(
                FailureReason::SessionMismatch,
                CLOSE_SESSION_MISMATCH,
                named,
            )
            .await;
        }
        match self.store.session(session).await {
            Ok(row) if row.state == SessionState::Connecting => {
                if let Err(err) = self.store.session_dialed(session).await {
                    tracing::warn!(session = %session, class = err.metric_label(), "dial not recorded");
                }
            }
            Ok(row) if row.state == SessionState::Ready => {
                // A second dial for a session that already has its worker: refuse it
                // without disturbing the live one.
                self.metrics_refused(FailureReason::SessionMismatch);
                return control
                    .close(
                        CLOSE_SESSION_MISMATCH,
                        FailureReason::SessionMismatch.as_str(),
                    )
                    .await;
            }
            _ => {
                return refuse(
                    FailureReason::SessionMismatch,
                    CLOSE_SESSION_MISMATCH,
                    session,
                )
                .await;
            }
        }

        let client = WorkerClient::default();
        let served =
            tokio::time::timeout(self.config.handshake_timeout, client.serve((sink, stream))).await;
        let service = match served {
            Ok(Ok(service)) => service,
            Ok(Err(_)) | Err(_) => {
                return refuse(
                    FailureReason::HandshakeTimeout,
                    CLOSE_HANDSHAKE_TIMEOUT,
                    session,
                )
                .await;
            }
        };
        let listed =
            tokio::time::timeout(self.config.ready_timeout, service.list_all_tools()).await;
        if !matches!(listed, Ok(Ok(_))) {
            return refuse(FailureReason::ReadyTimeout, CLOSE_READY_TIMEOUT, session).await;
        }
        // The owner key exists before the row says `ready`: a ready session without one
        // has lost its channel.
        self.claim_owner(session, self.owner_ttl()).await;
        match self
            .store
            .transition_session(session, SessionState::Connecting, SessionState::Ready)
            .await
        {
            Ok(true) => {}
            _ => {
                // Failed meanwhile (dial timeout, torn down): this worker is not wanted.
                return control.close(CLOSE_SESSION_ENDED, "session_ended").await;
            }
        }
        tracing::info!(session = %session, "worker ready");
        let worker = Arc::new(LiveWorker {
            session,
            service,
            control: control.clone(),
        });
        self.registry.insert(worker.clone());
        self.heartbeat(&worker, &claims).await;
        self.registry.remove(session);
        self.release_owner(session).await;
        // In-flight calls hold the worker too: ending the MCP session fails them now
        // instead of leaving them waiting for an answer that cannot come.
        worker.service.cancellation_token().cancel();
    }

    /// Pings until the channel ends or the worker falls silent; renews the token in-band.
    async fn heartbeat(&self, worker: &LiveWorker, claims: &SessionClaims) {
        let session = worker.session;
        let mut ping = tokio::time::interval(self.config.ping_interval);
        let renew_every = self.config.token_ttl / 2;
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                end = worker.control.ended() => {
                    self.channel_ended(session, &end).await;
                    return;
                }
                _ = ping.tick() => {
                    if worker.control.last_seen().elapsed() > self.config.heartbeat_timeout {
                        tracing::warn!(session = %session, "worker heartbeat lost");
                        self.fail(session, FailureReason::HeartbeatLost, Some("no pong")).await;
                        worker.control.close(CLOSE_SESSION_ENDED, FailureReason::HeartbeatLost.as_str()).await;
                        return;
                    }
                    let _ = worker.control.ping().await;
                    self.claim_owner(session, self.owner_ttl()).await;
                    if renewed.elapsed() >= renew_every {
                        renewed = Instant::now();
                        self.renew_token(worker, claims).await;
                    }
                }
            }
        }
    }

    /// Owner keys outlive a few missed refreshes, not a dead replica.
    fn owner_ttl(&self) -> std::time::Duration {
        self.config.ping_interval * 3
    }

    async fn renew_token(&self, worker: &LiveWorker, claims: &SessionClaims) {
        let Ok(token) =
            self.keys
                .mint(claims.sub, claims.team, claims.agent, self.config.token_ttl)
        else {
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
            .is_err()
        {
            tracing::info!(session = %worker.session, "token renewal not delivered");
        }
    }

    /// A channel ended on its own: unless the session already ended (teardown), the
    /// worker that was ready is gone.
    async fn channel_ended(&self, session: SessionId, end: &ChannelEnd) {
        let class = match end {
            ChannelEnd::Closed { .. } => "closed",
            ChannelEnd::Eof => "eof",
            ChannelEnd::SocketError(class) => class,
            ChannelEnd::Undecodable => "undecodable",
            ChannelEnd::BinaryFrame => "binary_frame",
        };
        tracing::info!(session = %session, end = class, "worker channel ended");
        self.fail(session, FailureReason::HeartbeatLost, Some(class))
            .await;
    }
}
