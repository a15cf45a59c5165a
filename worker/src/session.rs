//! One session: dial, serve MCP until the channel ends, leave nothing running.
//!
//! After the upgrade the worker is the MCP server over `channel::ws` (the brain sends
//! `initialize`, `tools/list`, then `tools/call`). The worker pings the brain every
//! [`PING_EVERY`]; a brain silent for [`SILENCE_LIMIT`] (no frame at all, pongs included)
//! counts as lost. The session ends when the brain closes the channel, the socket goes,
//! the brain falls silent, or SIGTERM arrives; then every process group a command
//! started is killed at once and the exit code says which way it ended.
//!
//! The worker does not re-dial: a lost channel ends the session, and the brain provisions
//! a fresh one for the next call. (Renewed tokens are kept in memory for a re-dial all the
//! same; see `tools::TOKEN_NOTIFICATION`.)

use std::time::Duration;

use channel::ws::{ChannelEnd, Control};
use protocol::channel::CLOSE_SESSION_ENDED;
use rmcp::{RoleServer, ServiceExt};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::dial::{DialError, dial};
use crate::exit;
use crate::groups::Groups;
use crate::tools::Worker;

pub const PING_EVERY: Duration = Duration::from_secs(15);
pub const SILENCE_LIMIT: Duration = Duration::from_secs(45);
/// The brain must finish the MCP handshake within this long (it gives up sooner itself).
pub const HANDSHAKE_LIMIT: Duration = Duration::from_secs(60);
/// How long a closing worker waits for the brain to answer its close frame.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// How the session ended.
#[derive(Debug)]
enum End {
    Channel(ChannelEnd),
    Silent,
    HandshakeFailed,
    Terminated,
}

impl End {
    fn class(&self) -> &'static str {
        match self {
            Self::Channel(ChannelEnd::Closed { .. }) => "closed",
            Self::Channel(ChannelEnd::Eof) => "eof",
            Self::Channel(ChannelEnd::SocketError(_)) => "socket_error",
            Self::Channel(ChannelEnd::Undecodable) => "undecodable",
            Self::Channel(ChannelEnd::BinaryFrame) => "binary_frame",
            Self::Silent => "heartbeat_lost",
            Self::HandshakeFailed => "handshake_failed",
            Self::Terminated => "terminated",
        }
    }

    fn exit_code(&self) -> u8 {
        match self {
            Self::Channel(ChannelEnd::Closed { code, .. }) if *code == CLOSE_SESSION_ENDED => {
                exit::SESSION_ENDED
            }
            Self::Terminated => exit::SESSION_ENDED,
            _ => exit::CHANNEL_LOST,
        }
    }
}

/// Runs the session to its end and returns the process exit code.
pub async fn run(config: Config) -> u8 {
    let session = config.session;
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(terminate) => terminate,
        Err(_) => {
            tracing::error!(%session, "cannot listen for SIGTERM");
            return exit::CHANNEL_LOST;
        }
    };
    let socket = tokio::select! {
        socket = dial(&config) => socket,
        _ = terminate.recv() => return exit::SESSION_ENDED,
    };
    let socket = match socket {
        Ok(socket) => socket,
        Err(err) => {
            tracing::error!(%session, class = err.class(), status = refused_status(&err), "dial failed");
            return match err {
                DialError::Refused(_) => exit::REFUSED,
                DialError::Unreachable(_) => exit::UNREACHABLE,
                DialError::BadRequest => exit::CONFIG,
            };
        }
    };
    tracing::info!(%session, profile = %config.profile, "channel open");

    let (sink, stream, control) = channel::ws::split::<RoleServer, _>(socket);
    let groups = Groups::default();
    let shutdown = CancellationToken::new();
    let worker = Worker::for_profile(
        &config.profile,
        config.browser.clone(),
        config.workspace.clone(),
        config.token.clone(),
        groups.clone(),
        shutdown.clone(),
    );

    // The handshake: the brain sends `initialize`. The service is kept alive until the end
    // (dropping it stops serving).
    let mut service = None;
    let end = tokio::select! {
        served = tokio::time::timeout(HANDSHAKE_LIMIT, worker.serve((sink, stream))) => match served {
            Ok(Ok(running)) => {
                tracing::info!(%session, "mcp initialized");
                service = Some(running);
                None
            }
            Ok(Err(_)) | Err(_) => Some(control.end().map_or(End::HandshakeFailed, End::Channel)),
        },
        end = control.ended() => Some(End::Channel(end)),
        _ = terminate.recv() => Some(End::Terminated),
    };
    let end = match end {
        Some(end) => end,
        None => tokio::select! {
            end = control.ended() => End::Channel(end),
            () = heartbeat(&control) => End::Silent,
            _ = terminate.recv() => End::Terminated,
        },
    };

    // Nothing a command started outlives the channel (Chromium included: its process
    // group is among the groups).
    shutdown.cancel();
    let killed = groups.kill_all();
    let code = end.exit_code();
    let close_code = match &end {
        End::Channel(ChannelEnd::Closed { code, .. }) => Some(*code),
        _ => None,
    };
    tracing::info!(%session, end = end.class(), close_code, groups_killed = killed, exit_code = code, "session ended");
    if matches!(end, End::Terminated | End::Silent | End::HandshakeFailed) {
        // Going away (1001): tell the brain, and give its close reply (proof that our
        // frame was written) a moment; it may already be gone.
        let _ = tokio::time::timeout(CLOSE_GRACE, async {
            control.close(1001, end.class()).await;
            control.ended().await;
        })
        .await;
    }
    drop(service);
    code
}

fn refused_status(err: &DialError) -> Option<u16> {
    match err {
        DialError::Refused(status) => Some(*status),
        _ => None,
    }
}

/// Pings the brain; returns when it has been silent past [`SILENCE_LIMIT`].
async fn heartbeat(control: &Control) {
    let mut tick = tokio::time::interval(PING_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if control.last_seen().elapsed() >= SILENCE_LIMIT {
            return;
        }
        if control.ping().await.is_err() {
            // The writer is gone; the read side will say why in a moment.
            std::future::pending::<()>().await;
        }
    }
}
