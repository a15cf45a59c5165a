//! The worker channel (SPEC W2, W3, W6): what the brain, the runtime-manager and the
//! worker agree on before and around the MCP session that runs over the WebSocket.
//!
//! The worker dials `GET /v1/worker/connect` with `Authorization: Bearer <session token>`
//! and [`CHANNEL_VERSION_HEADER`]; after the upgrade, the brain is the MCP client and the
//! worker the MCP server (`initialize`, `tools/list`, then `tools/call`).

use serde::{Deserialize, Serialize};

use crate::{AgentId, ChatId, SessionId, TeamId};

/// The channel protocol version this build speaks. A worker announcing another one is
/// refused at once with [`CLOSE_CHANNEL_VERSION`].
pub const CHANNEL_VERSION: u32 = 1;
/// The upgrade request header carrying the worker's channel version.
pub const CHANNEL_VERSION_HEADER: &str = "x-agent-channel-version";
/// The `aud` of every session token: a token minted for anything else is refused.
pub const WORKER_AUDIENCE: &str = "agent-runtime/worker-channel";
/// The upgrade request header naming the session the worker believes it serves; a token
/// for another session is `session_mismatch`.
pub const SESSION_HEADER: &str = "x-agent-session-id";
/// The `aud` of pool tokens: a pre-started worker that serves no session yet (R3). A pool
/// token can never act as a session token, nor the reverse.
pub const POOL_AUDIENCE: &str = "agent-runtime/worker-pool";
/// The custom notification that binds a pooled worker to a session; params
/// `{"session": "<id>", "token": "<session token>"}`.
pub const BIND_NOTIFICATION: &str = "notifications/agent_runtime/bind";
/// The custom notification that carries a renewed session token; params `{"token"}`.
pub const TOKEN_NOTIFICATION: &str = "notifications/agent_runtime/token";
/// Kept calls (D3): the `tools/call` `_meta` key carrying the call's key (the brain's
/// turn and call ids). A keyed call outlives the channel that carried it, its outcome is
/// kept for a while, and a call repeating a known key never runs again: it attaches.
pub const CALL_KEY_META: &str = "agent_runtime/call";
/// `_meta` flag of a keyed call that only asks for an earlier call's outcome (after a
/// re-dial or a takeover); it never starts one.
pub const ATTACH_META: &str = "agent_runtime/attach";
/// The JSON-RPC error code of an attach whose key the worker does not know (it
/// restarted, or the outcome expired): whether the call ran is unknown.
pub const UNKNOWN_CALL: i32 = -32010;
/// The experimental server capability a worker that keeps calls announces.
pub const KEPT_CALLS_CAPABILITY: &str = "agent_runtime/kept_calls";
/// The path workers dial, under the brain's public URL.
pub const CONNECT_PATH: &str = "/v1/worker/connect";

/// WebSocket close codes (private range 4000-4999) the brain sends when it refuses a
/// channel; the close reason repeats the failure reason's name. 4001-4005 mean the
/// session is over for this worker: it stops ([`ends_session`]).
pub const CLOSE_CHANNEL_VERSION: u16 = 4001;
pub const CLOSE_SESSION_MISMATCH: u16 = 4002;
pub const CLOSE_HANDSHAKE_TIMEOUT: u16 = 4003;
pub const CLOSE_READY_TIMEOUT: u16 = 4004;
/// The session ended (idle teardown, or the session was replaced).
pub const CLOSE_SESSION_ENDED: u16 = 4005;
/// A re-dial refused for now: a live channel for the session exists, or where it is held
/// cannot be told at the moment. The worker dials again after a backoff (W9).
pub const CLOSE_CHANNEL_HELD: u16 = 4006;
/// The standard "going away" (RFC 6455). From the brain: this replica is shutting down,
/// dial again (another replica will take the channel, W9). From the worker: it is exiting
/// for good (SIGTERM), so its session has lost its worker.
pub const CLOSE_GOING_AWAY: u16 = 1001;

/// Whether a close code from the brain means the session is over for the worker (it
/// stops) rather than "dial again". Any code not named here is dialed again: the brain
/// decides at the next dial, refusing one for a session that is no longer live.
pub fn ends_session(code: u16) -> bool {
    matches!(
        code,
        CLOSE_CHANNEL_VERSION
            | CLOSE_SESSION_MISMATCH
            | CLOSE_HANDSHAKE_TIMEOUT
            | CLOSE_READY_TIMEOUT
            | CLOSE_SESSION_ENDED
    )
}

/// The claims of a session token (a JWT signed by the runtime-manager or the brain with
/// the shared signing key). Short-lived and scoped to exactly one session (SPEC X2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionClaims {
    /// The session this token may act as.
    pub sub: SessionId,
    pub aud: String,
    pub team: TeamId,
    pub agent: AgentId,
    /// Unix seconds.
    pub iat: u64,
    pub exp: u64,
}

/// An AgentRuntimeSession's lifecycle, as stored in `agent_runtime_sessions.state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Row written, provision task queued.
    Pending,
    /// The runtime-manager took the task and is launching the worker.
    Provisioning,
    /// Launched; waiting for the worker to dial in and finish the MCP handshake.
    Connecting,
    /// Tools listed; calls may run.
    Ready,
    /// Being stopped by the launcher.
    Terminating,
    Terminated,
    Failed,
}

impl SessionState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Provisioning => "provisioning",
            Self::Connecting => "connecting",
            Self::Ready => "ready",
            Self::Terminating => "terminating",
            Self::Terminated => "terminated",
            Self::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }

    /// Live sessions are reused by the next worker tool call of their chat (W1).
    pub fn is_live(self) -> bool {
        !matches!(self, Self::Terminating | Self::Terminated | Self::Failed)
    }
}

/// Why a session failed (SPEC W6), recorded on the row and counted in metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// Launched, never dialed in.
    DialTimeout,
    /// Dialed in, never completed MCP `initialize`.
    HandshakeTimeout,
    /// Handshake done, tools never listed.
    ReadyTimeout,
    /// A valid token for another session, or for a session not expecting a worker.
    SessionMismatch,
    /// The worker speaks another channel version.
    ChannelVersion,
    /// Was ready, stopped answering pings or calls.
    HeartbeatLost,
    /// The launcher could not start the worker.
    LaunchFailed,
}

impl FailureReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DialTimeout => "dial_timeout",
            Self::HandshakeTimeout => "handshake_timeout",
            Self::ReadyTimeout => "ready_timeout",
            Self::SessionMismatch => "session_mismatch",
            Self::ChannelVersion => "channel_version",
            Self::HeartbeatLost => "heartbeat_lost",
            Self::LaunchFailed => "launch_failed",
        }
    }
}

/// Work for the runtime-manager, carried by the Redis queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SessionTask {
    /// Launch a worker for a `pending` session.
    Provision {
        session: SessionId,
        team: TeamId,
        agent: AgentId,
        chat: ChatId,
        profile: String,
    },
    /// Stop the session's worker if it has been idle for its profile's window since it
    /// was last used or became ready; a session used since re-arms its timer instead (W7).
    /// `last_used_ms` (unix ms) is that idle baseline when the check was armed.
    IdleCheck {
        session: SessionId,
        last_used_ms: i64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_reasons_use_their_stored_names() {
        for state in [
            SessionState::Pending,
            SessionState::Provisioning,
            SessionState::Connecting,
            SessionState::Ready,
            SessionState::Terminating,
            SessionState::Terminated,
            SessionState::Failed,
        ] {
            assert_eq!(SessionState::parse(state.as_str()), Some(state));
        }
        let reason = serde_json::to_value(FailureReason::HeartbeatLost).unwrap();
        assert_eq!(reason, FailureReason::HeartbeatLost.as_str());
    }

    #[test]
    fn refusals_end_the_session_and_everything_else_is_dialed_again() {
        for code in 4001..=4005 {
            assert!(ends_session(code), "{code}");
        }
        for code in [
            CLOSE_CHANNEL_HELD,
            CLOSE_GOING_AWAY,
            1000,
            1005,
            1011,
            4000,
            4999,
        ] {
            assert!(!ends_session(code), "{code}");
        }
    }
}
