//! One session: dial, serve MCP over the channel, dial again when it drops, and leave
//! nothing running at the end.
//!
//! After the upgrade the worker is the MCP server over `channel::ws` (the brain sends
//! `initialize`, `tools/list`, then `tools/call`). The worker pings the brain every
//! [`PING_EVERY`]; a brain silent for [`SILENCE_LIMIT`] (no frame at all, pongs included)
//! counts as lost.
//!
//! A channel that drops is dialed again (W9): the socket lost, the brain silent, or a
//! close that does not end the session ("going away" from a replica that shuts down,
//! "channel held", any code but 4001-4005, see `protocol::channel::ends_session`). The
//! re-dial goes to the same URL, so any replica behind it may take the channel, with the
//! newest token: the one renewed in-band, or for a pooled worker the session token its bind
//! carried. Calls running on the dropped channel stop there (their process groups are
//! killed): their answers cannot be delivered, MCP requests are not resent, and nothing
//! runs again on the next channel. Processes a finished command left in the background,
//! the workspace and the browser live on. Waits between dials back off (with jitter, up
//! to 2 s), for as long as the token is valid.
//!
//! The session ends when the brain closes the channel with a code that says so (4005
//! session ended, or a refusal 4001-4004), a dial is refused at the upgrade (4xx), the
//! token expires before a re-dial gets through, or SIGTERM arrives; then every process
//! group a command started (Chromium's included) is killed at once and the exit code says
//! which way it ended.

use std::time::Duration;

use channel::ws::{ChannelEnd, Control};
use protocol::SessionId;
use protocol::channel::{CLOSE_GOING_AWAY, CLOSE_SESSION_ENDED, ends_session};
use rmcp::service::RunningService;
use rmcp::{RoleServer, ServiceExt};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::dial::{Backoff, DIAL_WINDOW, DialError, Identity, Socket, dial};
use crate::exit;
use crate::groups::Groups;
use crate::snapshot;
use crate::tools::Worker;

pub const PING_EVERY: Duration = Duration::from_secs(15);
pub const SILENCE_LIMIT: Duration = Duration::from_secs(45);
/// The brain must finish the MCP handshake within this long (it gives up sooner itself).
pub const HANDSHAKE_LIMIT: Duration = Duration::from_secs(60);
/// How long a closing worker waits for the brain to answer its close frame.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// How a channel, or the whole session, ended.
#[derive(Debug)]
enum End {
    Channel(ChannelEnd),
    Silent,
    HandshakeFailed,
    Terminated,
    Dial(DialError),
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
            Self::Dial(err) => err.class(),
        }
    }

    /// Whether the session is over; otherwise the worker dials again.
    fn is_final(&self) -> bool {
        match self {
            Self::Channel(ChannelEnd::Closed { code, .. }) => ends_session(*code),
            Self::Channel(_) | Self::Silent | Self::HandshakeFailed => false,
            Self::Terminated | Self::Dial(_) => true,
        }
    }

    fn close_code(&self) -> Option<u16> {
        match self {
            Self::Channel(ChannelEnd::Closed { code, .. }) => Some(*code),
            _ => None,
        }
    }

    fn exit_code(&self) -> u8 {
        match self {
            Self::Channel(ChannelEnd::Closed { code, .. }) if *code == CLOSE_SESSION_ENDED => {
                exit::SESSION_ENDED
            }
            Self::Terminated => exit::SESSION_ENDED,
            Self::Dial(DialError::Refused(_)) => exit::REFUSED,
            Self::Dial(DialError::Unreachable(_)) => exit::UNREACHABLE,
            Self::Dial(DialError::BadRequest) => exit::CONFIG,
            _ => exit::CHANNEL_LOST,
        }
    }
}

/// One channel, served until it ended.
struct Served {
    control: Control,
    /// The MCP service, once initialized; dropping it stops serving.
    service: Option<RunningService<RoleServer, Worker>>,
}

/// Runs the session to its end and returns the process exit code.
pub async fn run(config: Config) -> u8 {
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(terminate) => terminate,
        Err(_) => {
            tracing::error!(session = %config.session, "cannot listen for SIGTERM");
            return exit::CHANNEL_LOST;
        }
    };
    let Some(identity) = Identity::new(config.session, config.token.clone()) else {
        // The configuration checked the token's claims already.
        tracing::error!(session = %config.session, "the session token names another session");
        return exit::CONFIG;
    };
    let Some(command_env) = egress(&config).await else {
        return exit::CONFIG;
    };
    // W10: the chat's workspace is back before the first dial, so the session is ready
    // only once it is. A pooled worker has no chat yet (the brain cold-starts a chat that
    // has a snapshot). A failed restore starts the session empty rather than not at all.
    if config.restore
        && !identity.pooled
        && let Err(err) = snapshot::restore(&config.connect_url, &identity, &config.workspace).await
    {
        tracing::warn!(session = %config.session, class = err.class(), "workspace not restored");
    }
    let mut deadline = (Instant::now() + DIAL_WINDOW).min(identity.expiry());
    let groups = Groups::default();
    let shutdown = CancellationToken::new();
    let worker = Worker::for_profile(
        &config.profile,
        config.browser.clone(),
        config.workspace.clone(),
        identity,
        groups.clone(),
        shutdown.clone(),
    );
    worker.enable_snapshots(config.connect_url.clone());
    worker.set_command_env(command_env);
    let mut backoff = Backoff::default();
    let mut channels = 0u32;
    let (end, last) = loop {
        let identity = worker.identity();
        let socket = tokio::select! {
            socket = dial(&config.connect_url, &identity, deadline, &mut backoff) => socket,
            _ = terminate.recv() => break (End::Terminated, None),
        };
        let socket = match socket {
            Ok(socket) => socket,
            Err(err) => break (End::Dial(err), None),
        };
        channels += 1;
        tracing::info!(session = %identity.session, profile = %config.profile, channels, "channel open");
        // Cancelled when this channel ends: the calls it carried stop with it.
        let calls = shutdown.child_token();
        let (end, served) = serve(worker.on_channel(calls.clone()), socket, &mut terminate).await;
        calls.cancel();
        if end.is_final() {
            break (end, Some(served));
        }
        if served.service.is_some() {
            backoff.reset();
        }
        let identity = worker.identity();
        tracing::info!(
            session = %identity.session,
            end = end.class(),
            close_code = end.close_code(),
            "channel lost; re-dialing"
        );
        // No close frame: the brain reads "going away" from a worker as its exit.
        drop(served);
        deadline = identity.expiry();
        tokio::select! {
            () = tokio::time::sleep(backoff.next_wait()) => {}
            _ = terminate.recv() => break (End::Terminated, None),
        }
    };

    // Nothing a command started outlives the session (Chromium included: its process
    // group is among the groups).
    shutdown.cancel();
    let killed = groups.kill_all();
    let code = end.exit_code();
    let session = worker.identity().session;
    if let End::Dial(err) = &end {
        tracing::error!(%session, class = err.class(), status = refused_status(err), "dial failed");
    }
    tracing::info!(%session, end = end.class(), close_code = end.close_code(), groups_killed = killed, exit_code = code, "session ended");
    if let (End::Terminated, Some(served)) = (&end, &last) {
        // Going away (1001): tell the brain this worker is gone, and give its close reply
        // (proof that our frame was written) a moment; it may already be gone.
        let _ = tokio::time::timeout(CLOSE_GRACE, async {
            served.control.close(CLOSE_GOING_AWAY, end.class()).await;
            served.control.ended().await;
        })
        .await;
    }
    drop(last);
    code
}

/// W14: the way out of a network-confined sandbox, set up before anything dials (the
/// brain is reached through it too), and what the commands' environment gains for the
/// session's proxy. `None`: the bridges could not be started.
async fn egress(config: &Config) -> Option<Vec<(String, String)>> {
    if let Err(e) = crate::egress::start_bridges(&config.egress_bridges).await {
        tracing::error!(session = %config.session, error = %e.kind(), "egress bridges not started");
        return None;
    }
    let Some(proxy) = &config.egress_proxy else {
        return Some(Vec::new());
    };
    let (env, missing) = crate::egress::command_env(proxy, config.session).await;
    if let Some(e) = missing {
        tracing::warn!(session = %config.session, class = e.class(), "commands get no session CA");
    }
    Some(env)
}

/// Serves MCP over one dialed socket until the channel ends, the brain falls silent or
/// SIGTERM arrives.
async fn serve(worker: Worker, socket: Socket, terminate: &mut Signal) -> (End, Served) {
    let session: SessionId = worker.identity().session;
    let (sink, stream, control) = channel::ws::split::<RoleServer, _>(socket);
    // The handshake: the brain sends `initialize`.
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
    (end, Served { control, service })
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
