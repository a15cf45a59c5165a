//! What both modules need to run the worker binary as the brain would: its session and
//! token, a workspace directory, the command that starts it with its stderr collected, and
//! a tool call's text.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use channel::token::TokenKeys;
use protocol::{AgentId, TeamId};
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RunningService, Service};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

pub const SESSION: &str = "0190b1b8-8a7e-7cc0-8f1e-2f6a3c2b9d10";

/// The session token the worker starts with: a real one, since the worker reads when it
/// expires (it re-dials no longer than that).
pub static TOKEN: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| session_token(SESSION, Duration::from_secs(600)));

/// What the tests sign tokens with: the worker never checks a signature, any key does.
pub const TOKEN_KEY: &[u8] = b"any key of 32 bytes or more, for tests";

/// A session token for `session`.
pub fn session_token(session: &str, ttl: Duration) -> String {
    let keys = TokenKeys::new(TOKEN_KEY).unwrap();
    keys.mint(session.parse().unwrap(), TeamId::new(), AgentId::new(), ttl)
        .unwrap()
}

/// A workspace directory of its own under the temp directory, created empty and removed
/// on drop.
pub struct Workspace(PathBuf);

impl Workspace {
    pub fn new(label: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "worker-it-{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path.canonicalize().unwrap())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        // Chromium may still be writing its profile for a moment after the kill.
        for _ in 0..10 {
            if std::fs::remove_dir_all(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The worker binary as a launcher starts it: a clean environment naming the brain, the
/// session, its token and the workspace; stderr piped, killed on drop.
pub fn worker_command(brain_url: &str, workspace: &Path, session: &str, token: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_worker"));
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("BRAIN_PUBLIC_URL", brain_url)
        .env("WORKER_SESSION_ID", session)
        .env("WORKER_SESSION_TOKEN", token)
        .env("WORKER_WORKSPACE", workspace)
        .env("WORKER_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Collects what `child` writes to stderr, line by line, until it closes the pipe.
pub fn collect_stderr(child: &mut Child) -> (Arc<Mutex<String>>, JoinHandle<()>) {
    let stderr = Arc::new(Mutex::new(String::new()));
    let pipe = child.stderr.take().unwrap();
    let sink = stderr.clone();
    let reader = tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut all = sink.lock().unwrap();
            all.push_str(&line);
            all.push('\n');
        }
    });
    (stderr, reader)
}

/// Calls `tool` with `args` over the brain's side of the channel, within `wait`.
pub async fn call<S: Service<RoleClient>>(
    client: &RunningService<RoleClient, S>,
    wait: Duration,
    tool: &str,
    args: Value,
) -> CallToolResult {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().cloned().unwrap());
    tokio::time::timeout(wait, client.call_tool(params))
        .await
        .expect("the call answers")
        .unwrap()
}

/// The text parts of a tool's result, one per line.
pub fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}
