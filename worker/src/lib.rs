//! The worker: the binary inside a worker pod (or a local child process).
//!
//! It dials the brain, proves its session, and then serves MCP over the socket: the brain
//! is the MCP client, the worker the MCP server (SPEC W3, W8). The layout:
//!
//! - `config`: the environment, validated before anything else (exit code 2 on error).
//! - `dial`: the WebSocket upgrade with the session headers, retried with backoff while
//!   the brain is starting (and, re-dialing, while the token is valid); a refused upgrade
//!   is final.
//! - `session`: serves MCP over the dialed socket, pings the brain, dials again when the
//!   channel drops (W9), and turns the end of the session into the exit code; nothing a
//!   command started outlives the session, nothing a dropped channel carried runs on.
//! - `tools`: the workspace tools (`shell`, `read_file`, `write_file`, `list_dir`,
//!   `edit_file`, `upload_artifact`) and, for profile `browser`, the `browser_*` tools,
//!   with the argument types of `channel::catalog`.
//! - `browser` (cargo feature `browser`, on by default): headless Chromium over CDP,
//!   started lazily, stopped when idle.
//! - `snapshot`: workspace snapshots (W10): packed and uploaded through the brain when it
//!   asks at an idle teardown, downloaded and unpacked (safely) before the first dial.
//! - `groups`: the process groups `shell` (and the browser) started, so cancellation,
//!   timeouts and the end of the session kill whole process trees at once.
//!
//! **Invariant:** logs carry ids, counts, durations and classes only; never command text,
//! file contents, paths chosen by the model, or the session token (SPEC X4).

#[cfg(feature = "browser")]
pub mod browser;
pub mod config;
pub mod dial;
pub mod egress;
pub mod groups;
pub mod session;
pub mod snapshot;
pub mod tools;

/// Exit codes; the launcher reads them.
pub mod exit {
    /// The brain ended the session (close code 4005 `session_ended`), or SIGTERM.
    pub const SESSION_ENDED: u8 = 0;
    /// A configuration variable is missing or invalid.
    pub const CONFIG: u8 = 2;
    /// The brain refused the upgrade (HTTP 4xx): a bad token, another session, another
    /// channel version. Retrying cannot help.
    pub const REFUSED: u8 = 3;
    /// The brain closed the channel with a refusal (4001-4004): another channel version,
    /// a session that is no longer live, a handshake that timed out. (A lost socket, a
    /// silent brain or any other close is dialed again.)
    pub const CHANNEL_LOST: u8 = 4;
    /// No brain could be reached within the dial window, or, re-dialing, before the
    /// token expired.
    pub const UNREACHABLE: u8 = 5;
}
