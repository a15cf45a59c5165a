//! Starting Chromium.
//!
//! The worker starts Chromium itself (rather than through chromiumoxide's launcher) so
//! that it runs as the leader of its own process group, registered in the session's
//! [`Groups`]: stopping it, and the end of the session, kill Chromium and every helper
//! process it forked with one `killpg`. Chromium picks a free DevTools port
//! (`--remote-debugging-port=0`, on 127.0.0.1) and prints
//! `DevTools listening on ws://…` on stderr; chromiumoxide then connects to that URL.
//!
//! A worker killed outright (SIGKILL, the OOM killer) cannot kill anything; so Chromium
//! is started through util-linux's `setpriv --pdeathsig KILL` when it is there (Debian
//! has it everywhere): the kernel kills Chromium when the worker thread that started it
//! goes, and Chromium's helpers (zygotes, renderers, crashpad) exit with their browser.
//! In a pod the container's end does the same.
//!
//! Everything Chromium writes stays under the profile directory: it is
//! `--user-data-dir`, and `HOME`/`XDG_*` point into it. The session token is removed
//! from its environment.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::config::WORKER_SESSION_TOKEN;
use crate::groups::{GroupGuard, Groups};

/// Sets the parent-death signal, then execs Chromium (same pid).
pub const SETPRIV: &str = "/usr/bin/setpriv";

/// How long Chromium may take to print its DevTools URL.
pub const LAUNCH_TIMEOUT: Duration = Duration::from_secs(20);
/// The browser window (and screenshot) size.
pub const WINDOW: (u32, u32) = (1280, 800);

/// The flags every start uses, before `--user-data-dir`. The first eight are the ones
/// these machines need (without the background-networking ones Chromium floods a closed
/// network with refused connections); `--no-sandbox` because a non-root pod without user
/// namespaces cannot run Chromium's sandbox (the pod is the sandbox).
pub const FLAGS: [&str; 14] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    // A pod's /dev/shm is 64 MiB: shared memory goes to the temp dir instead.
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--no-default-browser-check",
    "--password-store=basic",
    "--hide-scrollbars",
    "--mute-audio",
];

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "no Chromium found (looked for /usr/bin/chromium, /usr/bin/chromium-browser, \
         /usr/bin/google-chrome); install it or set WORKER_CHROMIUM"
    )]
    NoExecutable,
    #[error("Chromium could not be started: {0}")]
    Spawn(std::io::Error),
    #[error("the browser profile directory could not be created: {0}")]
    Profile(std::io::Error),
    #[error("Chromium exited while starting{}", tail(.0))]
    Exited(Vec<String>),
    #[error("Chromium did not start within {} s{}", LAUNCH_TIMEOUT.as_secs(), tail(.0))]
    Timeout(Vec<String>),
}

impl LaunchError {
    pub fn class(&self) -> &'static str {
        match self {
            Self::NoExecutable => "no_chromium",
            Self::Spawn(_) => "spawn_failed",
            Self::Profile(_) => "profile_failed",
            Self::Exited(_) => "exited_at_start",
            Self::Timeout(_) => "start_timeout",
        }
    }
}

fn tail(lines: &[String]) -> String {
    if lines.is_empty() {
        String::new()
    } else {
        format!("; its last words: {}", lines.join(" | "))
    }
}

/// A started Chromium: the process (a group leader) and its DevTools URL.
pub struct Launched {
    pub child: Child,
    pub pid: u32,
    /// Kills Chromium's process group when dropped.
    pub group: GroupGuard,
    pub ws_url: String,
}

/// The command line, for tests and review. With `proxy`, every request goes through it,
/// loopback included (Chromium's default bypasses loopback; in a network-confined sandbox
/// loopback is the sandbox's own).
pub fn args(profile_dir: &Path, proxy: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = FLAGS.iter().map(|f| (*f).to_owned()).collect();
    if let Some(proxy) = proxy {
        args.push(format!("--proxy-server={proxy}"));
        args.push("--proxy-bypass-list=<-loopback>".to_owned());
    }
    args.push(format!("--window-size={},{}", WINDOW.0, WINDOW.1));
    args.push(format!("--user-data-dir={}", profile_dir.display()));
    args.push("--remote-debugging-port=0".to_owned());
    args.push("about:blank".to_owned());
    args
}

/// Starts Chromium and waits for its DevTools URL.
pub async fn launch(
    executable: Option<&Path>,
    profile_dir: &Path,
    proxy: Option<&str>,
    groups: &Groups,
) -> Result<Launched, LaunchError> {
    let executable = executable.ok_or(LaunchError::NoExecutable)?;
    let home = profile_dir.join("home");
    tokio::fs::create_dir_all(&home)
        .await
        .map_err(LaunchError::Profile)?;
    // The parent-death signal follows the thread that forks: a tokio worker thread, which
    // lives as long as the runtime (the worker never uses `block_in_place`).
    let mut command = if Path::new(SETPRIV).is_file() {
        let mut command = Command::new(SETPRIV);
        command.args(["--pdeathsig", "KILL", "--"]).arg(executable);
        command
    } else {
        Command::new(executable)
    };
    command
        .args(args(profile_dir, proxy))
        .env_remove(WORKER_SESSION_TOKEN)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(LaunchError::Spawn)?;
    let Some(pid) = child.id() else {
        return Err(LaunchError::Exited(Vec::new()));
    };
    // From here on, a dropped future kills the whole group.
    let group = groups.register(pid);
    let Some(stderr) = child.stderr.take() else {
        return Err(LaunchError::Exited(Vec::new()));
    };
    let mut lines = BufReader::new(stderr);
    let mut last: Vec<String> = Vec::new();
    let found = tokio::time::timeout(LAUNCH_TIMEOUT, async {
        let mut line = String::new();
        loop {
            line.clear();
            match lines.read_line(&mut line).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
            if let Some(url) = devtools_url(&line) {
                return Some(url);
            }
            let trimmed = line.trim();
            if !trimmed.is_empty() {
                if last.len() == 3 {
                    last.remove(0);
                }
                last.push(trimmed.chars().take(300).collect());
            }
        }
    })
    .await;
    let ws_url = match found {
        Ok(Some(url)) => url,
        Ok(None) => return Err(LaunchError::Exited(last)),
        Err(_) => return Err(LaunchError::Timeout(last)),
    };
    // Chromium keeps writing to stderr; the pipe must not fill up. Nothing of it is
    // logged (it can name pages).
    tokio::spawn(async move {
        let mut sink = [0u8; 8192];
        let mut stderr = lines.into_inner();
        while matches!(stderr.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    Ok(Launched {
        child,
        pid,
        group,
        ws_url,
    })
}

/// `DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID` → the URL.
fn devtools_url(line: &str) -> Option<String> {
    let rest = line.trim().strip_prefix("DevTools listening on ")?;
    rest.starts_with("ws://").then(|| rest.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_devtools_line_gives_the_url() {
        assert_eq!(
            devtools_url("DevTools listening on ws://127.0.0.1:4242/devtools/browser/ab-cd\n")
                .as_deref(),
            Some("ws://127.0.0.1:4242/devtools/browser/ab-cd")
        );
        assert_eq!(devtools_url("[123:ERROR:foo.cc] DevTools listening"), None);
    }

    #[test]
    fn the_command_line_has_the_required_flags_and_the_profile() {
        let args = args(Path::new("/ws/.browser-profile"), None);
        for flag in [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--user-data-dir=/ws/.browser-profile",
            "--remote-debugging-port=0",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag}");
        }
    }

    #[tokio::test]
    async fn a_missing_or_failing_executable_is_a_readable_error() {
        let dir = crate::tools::test_support::TempDir::new("launch");
        let groups = Groups::default();
        let err = launch(None, dir.path(), None, &groups).await.err().unwrap();
        assert_eq!(err.class(), "no_chromium");
        assert!(err.to_string().contains("WORKER_CHROMIUM"));
        // `false` exits at once without printing a DevTools URL.
        let err = launch(Some(Path::new("/bin/false")), dir.path(), None, &groups)
            .await
            .err()
            .unwrap();
        assert_eq!(err.class(), "exited_at_start");
    }
}
