//! `shell`: one command, its own process group, output streamed while it runs.
//!
//! The command runs as `sh -c <command>` with stdin closed, as the leader of a new process
//! group. Its stdout and stderr are read as they arrive; each chunk goes to the result
//! (capped, head and tail kept) and, when the brain sent a progress token, to the brain
//! as an MCP progress notification whose `message` is the JSON text
//! `{"stream":"stdout"|"stderr","text":"..."}` ([`LiveLine`]). Complete lines are sent at
//! once; a partial line waits at most [`FLUSH_EVERY`].
//!
//! The session's secrets (W12) are set in the command's environment by name, and every
//! value is masked in both streams as they are read ([`StreamMask`]), before anything
//! goes to the result or the brain.
//!
//! Cancellation (the brain's `notifications/cancelled`, or the channel ending) and the
//! timeout kill the whole group with one SIGKILL; so does dropping the call future, through
//! the group's drop guard.

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use channel::mask::{Masks, StreamMask};
use protocol::env::SessionEnv;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use serde::Serialize;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::output::Capped;
use crate::config::WORKER_SESSION_TOKEN;
use crate::groups::Groups;

/// Default and maximum `timeout_s`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
pub const MAX_TIMEOUT_S: u64 = 3600;
/// The result keeps at most this much of each stream.
pub const OUTPUT_CAP: usize = 64 * 1024;
/// A partial line is streamed after this long.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// A line longer than this is streamed in pieces.
const MAX_LIVE_TEXT: usize = 16 * 1024;
/// Live output stops after this much per call (the result still has head and tail).
pub const LIVE_BUDGET: u64 = 1024 * 1024;
/// After the shell exits, output still in the pipes (or held open by a background job) is
/// read for at most this long.
const DRAIN_GRACE: Duration = Duration::from_millis(200);
/// A progress notification the channel cannot take within this long is dropped.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamName {
    Stdout,
    Stderr,
}

/// The `message` of a progress notification, JSON-encoded.
#[derive(Debug, Serialize)]
pub struct LiveLine<'a> {
    pub stream: StreamName,
    pub text: &'a str,
}

/// Where live output goes: the brain, under the call's progress token.
pub struct Live {
    pub peer: Peer<RoleServer>,
    pub token: ProgressToken,
}

/// What the command was asked to do.
pub struct ShellCall {
    pub command: String,
    pub cwd: std::path::PathBuf,
    pub timeout: Duration,
    pub secrets: Arc<Secrets>,
    /// Set after the secrets, so none of them replaces it (the egress proxy's variables).
    pub env: Arc<Vec<(String, String)>>,
}

/// The session's secrets, held in memory only: the command's environment, and the values
/// masked in everything it prints. `Debug` shows no value.
#[derive(Debug, Default)]
pub struct Secrets {
    pub env: SessionEnv,
    pub masks: Arc<Masks>,
}

impl Secrets {
    pub fn new(env: SessionEnv) -> Self {
        let masks = Arc::new(Masks::new(&env));
        Self { env, masks }
    }
}

/// How the command ended.
#[derive(Debug)]
pub enum Ending {
    Exited(ExitStatus),
    TimedOut,
    Cancelled,
}

impl Ending {
    /// A bounded label for logs and metrics.
    pub fn class(&self) -> &'static str {
        match self {
            Self::Exited(status) if status.success() => "exit_zero",
            Self::Exited(_) => "exit_nonzero",
            Self::TimedOut => "timeout",
            Self::Cancelled => "cancelled",
        }
    }
}

pub struct ShellOutcome {
    pub ending: Ending,
    pub stdout: Capped,
    pub stderr: Capped,
    /// Progress notifications sent.
    pub notifications: u64,
}

/// The timeout a call asked for, bounded to 1..=3600 s.
pub fn timeout_of(timeout_s: Option<u64>) -> Duration {
    timeout_s.map_or(DEFAULT_TIMEOUT, |s| {
        Duration::from_secs(s.clamp(1, MAX_TIMEOUT_S))
    })
}

/// Runs `call` to its end. `Err` only when the command could not be started.
pub async fn run(
    call: ShellCall,
    groups: &Groups,
    cancel: &CancellationToken,
    live: Option<Live>,
) -> std::io::Result<ShellOutcome> {
    let mut child = command(&call).spawn()?;
    let Some(pid) = child.id() else {
        return Err(std::io::Error::other(
            "the command exited before it started",
        ));
    };
    let mut guard = groups.register(pid);
    let (mut readers, mut rx) = read_pipes(&mut child);
    let mut out = Collected::new(&call.secrets.masks, live);
    let deadline = tokio::time::sleep(call.timeout);
    let grace = tokio::time::sleep(Duration::from_secs(u64::from(u32::MAX)));
    tokio::pin!(deadline, grace);
    let mut exited: Option<ExitStatus> = None;
    let mut pipes_open = true;

    let ending = loop {
        let flush_at = out.streamer.next_flush();
        tokio::select! {
            biased;
            () = cancel.cancelled() => {
                guard.kill();
                break Ending::Cancelled;
            }
            () = &mut deadline, if exited.is_none() => {
                guard.kill();
                break Ending::TimedOut;
            }
            status = child.wait(), if exited.is_none() => {
                match status {
                    Ok(status) => exited = Some(status),
                    Err(err) => {
                        guard.kill();
                        return Err(err);
                    }
                }
                if !pipes_open {
                    break Ending::Exited(status_or_default(exited));
                }
                grace.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
            }
            () = &mut grace, if exited.is_some() => {
                break Ending::Exited(status_or_default(exited));
            }
            chunk = rx.recv(), if pipes_open => match chunk {
                Some((stream, bytes)) => out.push(stream, &bytes, cancel).await,
                None => {
                    pipes_open = false;
                    if exited.is_some() {
                        break Ending::Exited(status_or_default(exited));
                    }
                }
            },
            () = sleep_until_some(flush_at) => out.streamer.flush_stale(cancel).await,
        }
    };

    match ending {
        Ending::Exited(_) => {
            // Background jobs the command left keep running until the session ends.
            guard.detach();
        }
        Ending::TimedOut => {
            // Reap the shell, and keep what the group wrote before it died.
            let _ = tokio::time::timeout(Duration::from_secs(1), child.wait()).await;
            if pipes_open {
                out.drain(&mut rx).await;
            }
        }
        Ending::Cancelled => {
            // Reap the shell so its pid is gone, not a zombie; nobody reads the result.
            let _ = tokio::time::timeout(Duration::from_millis(200), child.wait()).await;
        }
    }
    if !matches!(ending, Ending::Cancelled) {
        out.finish(cancel).await;
    }
    readers.abort_all();
    Ok(ShellOutcome {
        ending,
        stdout: out.stdout,
        stderr: out.stderr,
        notifications: out.streamer.sent,
    })
}

/// `sh -c <command>` in its own process group, with the session's secrets and without
/// anything of the worker's own that the command must not see.
fn command(call: &ShellCall) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("sh");
    command
        .arg("-c")
        .arg(&call.command)
        .current_dir(&call.cwd)
        // The session token is the worker's, never the command's.
        .env_remove(WORKER_SESSION_TOKEN)
        .envs(&call.secrets.env.vars)
        .envs(call.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // Nor its telemetry settings: a command's own OpenTelemetry SDK would export into the
    // runtime's traces under the worker's name.
    for (name, _) in std::env::vars_os() {
        if name.as_encoded_bytes().starts_with(b"OTEL_") {
            command.env_remove(name);
        }
    }
    command
}

/// A task per pipe, so one stream's backlog never holds up the other's; the receiver
/// ends once both pipes are closed.
fn read_pipes(
    child: &mut tokio::process::Child,
) -> (JoinSet<()>, mpsc::Receiver<(StreamName, Vec<u8>)>) {
    let (tx, rx) = mpsc::channel::<(StreamName, Vec<u8>)>(32);
    let mut readers = JoinSet::new();
    if let Some(out) = child.stdout.take() {
        readers.spawn(pump(out, StreamName::Stdout, tx.clone()));
    }
    if let Some(err) = child.stderr.take() {
        readers.spawn(pump(err, StreamName::Stderr, tx.clone()));
    }
    (readers, rx)
}

/// What the command printed so far: masked before it is kept in the result or streamed,
/// one mask per stream since a value may be cut across two reads of the same pipe.
struct Collected {
    stdout: Capped,
    stderr: Capped,
    masks: [StreamMask; 2],
    streamer: Streamer,
}

impl Collected {
    fn new(masks: &Arc<Masks>, live: Option<Live>) -> Self {
        Self {
            stdout: Capped::new(OUTPUT_CAP),
            stderr: Capped::new(OUTPUT_CAP),
            masks: [
                StreamMask::new(masks.clone()),
                StreamMask::new(masks.clone()),
            ],
            streamer: Streamer::new(live),
        }
    }

    /// Masks `bytes` and keeps them in the result only.
    fn keep(&mut self, stream: StreamName, bytes: &[u8]) -> Vec<u8> {
        let bytes = self.masks[Streamer::slot(stream)].push(bytes);
        match stream {
            StreamName::Stdout => self.stdout.push(&bytes),
            StreamName::Stderr => self.stderr.push(&bytes),
        }
        bytes
    }

    /// Masks `bytes`, keeps them in the result and streams them.
    async fn push(&mut self, stream: StreamName, bytes: &[u8], cancel: &CancellationToken) {
        let bytes = self.keep(stream, bytes);
        self.streamer.push(stream, &bytes, cancel).await;
    }

    /// After a timeout's kill: what the group wrote before it died goes to the result
    /// (not streamed), for at most [`DRAIN_GRACE`].
    async fn drain(&mut self, rx: &mut mpsc::Receiver<(StreamName, Vec<u8>)>) {
        let drain = tokio::time::sleep(DRAIN_GRACE);
        tokio::pin!(drain);
        loop {
            tokio::select! {
                () = &mut drain => break,
                chunk = rx.recv() => match chunk {
                    Some((stream, bytes)) => {
                        self.keep(stream, &bytes);
                    }
                    None => break,
                },
            }
        }
    }

    /// What each mask held back (a possible start of a value) ends its stream.
    async fn finish(&mut self, cancel: &CancellationToken) {
        for stream in [StreamName::Stdout, StreamName::Stderr] {
            let rest = self.masks[Streamer::slot(stream)].finish();
            match stream {
                StreamName::Stdout => self.stdout.push(&rest),
                StreamName::Stderr => self.stderr.push(&rest),
            }
            self.streamer.push(stream, &rest, cancel).await;
        }
        self.streamer.flush_all(cancel).await;
    }
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

fn status_or_default(status: Option<ExitStatus>) -> ExitStatus {
    status.unwrap_or_default()
}

async fn pump<R: tokio::io::AsyncRead + Unpin>(
    mut pipe: R,
    stream: StreamName,
    tx: mpsc::Sender<(StreamName, Vec<u8>)>,
) {
    let mut buf = vec![0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send((stream, buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Batches output into progress notifications: per line, or per [`FLUSH_EVERY`].
struct Streamer {
    live: Option<Live>,
    pending: [Vec<u8>; 2],
    since: [Option<Instant>; 2],
    streamed: u64,
    sent: u64,
}

impl Streamer {
    fn new(live: Option<Live>) -> Self {
        Self {
            live,
            pending: [Vec::new(), Vec::new()],
            since: [None, None],
            streamed: 0,
            sent: 0,
        }
    }

    fn slot(stream: StreamName) -> usize {
        match stream {
            StreamName::Stdout => 0,
            StreamName::Stderr => 1,
        }
    }

    async fn push(&mut self, stream: StreamName, bytes: &[u8], cancel: &CancellationToken) {
        if self.live.is_none() {
            return;
        }
        let i = Self::slot(stream);
        self.pending[i].extend_from_slice(bytes);
        // Everything up to the last newline goes now; a partial line waits for the tick.
        if let Some(last) = self.pending[i].iter().rposition(|b| *b == b'\n') {
            let rest = self.pending[i].split_off(last + 1);
            let lines = std::mem::replace(&mut self.pending[i], rest);
            self.send(stream, &lines, cancel).await;
        }
        if self.pending[i].len() >= MAX_LIVE_TEXT {
            self.flush(stream, cancel).await;
        }
        self.since[i] = if self.pending[i].is_empty() {
            None
        } else {
            self.since[i].or(Some(Instant::now()))
        };
    }

    /// When the oldest partial line is due.
    fn next_flush(&self) -> Option<Instant> {
        self.since
            .iter()
            .flatten()
            .min()
            .map(|since| *since + FLUSH_EVERY)
    }

    async fn flush_stale(&mut self, cancel: &CancellationToken) {
        for stream in [StreamName::Stdout, StreamName::Stderr] {
            let i = Self::slot(stream);
            if self.since[i].is_some_and(|since| since.elapsed() >= FLUSH_EVERY) {
                self.flush(stream, cancel).await;
            }
        }
    }

    async fn flush_all(&mut self, cancel: &CancellationToken) {
        for stream in [StreamName::Stdout, StreamName::Stderr] {
            self.flush(stream, cancel).await;
            // A character cut at the very end is sent as it is.
            let i = Self::slot(stream);
            let rest = std::mem::take(&mut self.pending[i]);
            self.send(stream, &rest, cancel).await;
        }
    }

    /// Sends the pending bytes of `stream`, keeping back a character cut at the end.
    async fn flush(&mut self, stream: StreamName, cancel: &CancellationToken) {
        let i = Self::slot(stream);
        let complete = match std::str::from_utf8(&self.pending[i]) {
            Err(err) if err.error_len().is_none() => err.valid_up_to(),
            _ => self.pending[i].len(),
        };
        let rest = self.pending[i].split_off(complete);
        let text = std::mem::replace(&mut self.pending[i], rest);
        self.since[i] = if self.pending[i].is_empty() {
            None
        } else {
            Some(Instant::now())
        };
        self.send(stream, &text, cancel).await;
    }

    async fn send(&mut self, stream: StreamName, bytes: &[u8], cancel: &CancellationToken) {
        let Some(live) = &self.live else { return };
        if bytes.is_empty() || self.streamed >= LIVE_BUDGET {
            return;
        }
        let budget = usize::try_from(LIVE_BUDGET - self.streamed).unwrap_or(usize::MAX);
        let mut text = String::from_utf8_lossy(&bytes[..bytes.len().min(budget)]).into_owned();
        self.streamed += bytes.len() as u64;
        if self.streamed >= LIVE_BUDGET {
            text.push_str(
                "\n[... live output stops here; the result keeps the head and the tail ...]\n",
            );
        }
        let Ok(message) = serde_json::to_string(&LiveLine {
            stream,
            text: &text,
        }) else {
            return;
        };
        let param = ProgressNotificationParam::new(live.token.clone(), self.streamed as f64)
            .with_message(message);
        tokio::select! {
            biased;
            () = cancel.cancelled() => {}
            sent = tokio::time::timeout(NOTIFY_TIMEOUT, live.peer.notify_progress(param)) => {
                match sent {
                    Ok(Ok(())) => self.sent += 1,
                    // The channel is gone or wedged: the result still carries the output.
                    Ok(Err(_)) | Err(_) => tracing::debug!("progress notification dropped"),
                }
            }
        }
    }
}

/// The text the model reads.
pub fn render(outcome: ShellOutcome, timeout: Duration) -> String {
    use std::os::unix::process::ExitStatusExt;
    let mut text = match &outcome.ending {
        Ending::Exited(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit code: {code}\n"),
            (None, Some(signal)) => format!("exit code: none (killed by signal {signal})\n"),
            (None, None) => "exit code: unknown\n".to_owned(),
        },
        Ending::TimedOut => format!(
            "timed out after {} s: the command and its process group were killed\n",
            timeout.as_secs()
        ),
        Ending::Cancelled => "cancelled: the command and its process group were killed\n".into(),
    };
    let (out_bytes, err_bytes) = (outcome.stdout.total(), outcome.stderr.total());
    if out_bytes == 0 && err_bytes == 0 {
        text.push_str("(no output)\n");
    }
    for (name, capped) in [("stdout", outcome.stdout), ("stderr", outcome.stderr)] {
        if capped.total() > 0 {
            text.push_str(&format!("--- {name} ---\n"));
            text.push_str(&capped.finish());
            if !text.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn timeouts_are_bounded() {
        assert_eq!(timeout_of(None), DEFAULT_TIMEOUT);
        assert_eq!(timeout_of(Some(0)), Duration::from_secs(1));
        assert_eq!(timeout_of(Some(5)), Duration::from_secs(5));
        assert_eq!(timeout_of(Some(1_000_000)), Duration::from_secs(3600));
    }

    #[test]
    fn the_live_message_is_the_documented_json() {
        let line = LiveLine {
            stream: StreamName::Stderr,
            text: "oops\n",
        };
        assert_eq!(
            serde_json::to_string(&line).unwrap(),
            r#"{"stream":"stderr","text":"oops\n"}"#
        );
    }

    #[tokio::test]
    async fn a_command_runs_and_its_output_is_captured() {
        let dir = crate::tools::test_support::TempDir::new("shell-run");
        let groups = Groups::default();
        let call = ShellCall {
            command: "echo out; echo err >&2; exit 3".into(),
            cwd: dir.path().to_path_buf(),
            timeout: Duration::from_secs(5),
            secrets: Arc::default(),
            env: Arc::default(),
        };
        let outcome = run(call, &groups, &CancellationToken::new(), None)
            .await
            .unwrap();
        assert_eq!(outcome.ending.class(), "exit_nonzero");
        let text = render(outcome, Duration::from_secs(5));
        assert_eq!(
            text,
            "exit code: 3\n--- stdout ---\nout\n--- stderr ---\nerr\n"
        );
    }

    #[tokio::test]
    async fn the_token_is_not_in_the_commands_environment() {
        let dir = crate::tools::test_support::TempDir::new("shell-env");
        let call = ShellCall {
            command: format!("echo \"[${WORKER_SESSION_TOKEN}]\""),
            cwd: dir.path().to_path_buf(),
            timeout: Duration::from_secs(5),
            secrets: Arc::default(),
            env: Arc::default(),
        };
        let outcome = run(call, &Groups::default(), &CancellationToken::new(), None)
            .await
            .unwrap();
        assert!(render(outcome, Duration::from_secs(5)).contains("[]"));
    }

    #[tokio::test]
    async fn secrets_are_the_commands_environment_and_masked_in_its_output() {
        let dir = crate::tools::test_support::TempDir::new("shell-secrets");
        let env = SessionEnv {
            vars: [("MY_TOKEN".to_owned(), "tok-1234-abcd".to_owned())].into(),
        };
        // The value leaves the command cut in two writes, on both streams.
        let call = ShellCall {
            command: "printf %s \"${MY_TOKEN%%-*}\"; sleep 0.1; echo \"-${MY_TOKEN#*-}\"; \
                      echo \"$MY_TOKEN\" >&2; printenv MY_TOKEN | wc -c"
                .into(),
            cwd: dir.path().to_path_buf(),
            timeout: Duration::from_secs(5),
            secrets: Arc::new(Secrets::new(env)),
            env: Arc::default(),
        };
        let outcome = run(call, &Groups::default(), &CancellationToken::new(), None)
            .await
            .unwrap();
        let text = render(outcome, Duration::from_secs(5));
        assert_eq!(
            text,
            "exit code: 0\n--- stdout ---\n[secret:MY_TOKEN]\n14\n--- stderr ---\n[secret:MY_TOKEN]\n"
        );
    }

    #[tokio::test]
    async fn a_timeout_kills_the_group_and_keeps_the_output() {
        let dir = crate::tools::test_support::TempDir::new("shell-timeout");
        let call = ShellCall {
            command: "echo started; sleep 30 & sleep 30".into(),
            cwd: dir.path().to_path_buf(),
            timeout: Duration::from_secs(1),
            secrets: Arc::default(),
            env: Arc::default(),
        };
        let started = Instant::now();
        let outcome = run(call, &Groups::default(), &CancellationToken::new(), None)
            .await
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(outcome.ending.class(), "timeout");
        let text = render(outcome, Duration::from_secs(1));
        assert!(text.starts_with("timed out after 1 s"), "{text}");
        assert!(text.contains("started"), "{text}");
    }
}
