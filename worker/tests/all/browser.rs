//! The browser tools (profile `browser`) against real Chromium from Debian and pages
//! served on 127.0.0.1 by the test, through the worker binary over a real channel (the
//! fake brain of the `channel` module: it accepts the upgrade and drives MCP as the brain
//! does).
//!
//! Chromium is required: these tests fail, not skip, without it (`scripts/test-deps.sh`
//! installs Debian's `chromium`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::result_large_err)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{SESSION, TOKEN, Workspace, call, collect_stderr, text_of, worker_command};
use base64::Engine;
use channel::ws::{Control, split};
use protocol::channel::CLOSE_SESSION_ENDED;
use rmcp::model::{CallToolRequestParams, CallToolResult, ResourceContents};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::process::Child;

/// Chromium's first start on a busy two-core machine can take a few seconds.
const WAIT: Duration = Duration::from_secs(45);
const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];

/// The Chromium the tests use; panics (fails the test) when there is none.
fn chromium() -> PathBuf {
    [
        "/usr/bin/chromium",
        "/usr/bin/chromium-browser",
        "/usr/bin/google-chrome",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|path| path.is_file())
    .expect("Chromium is required for the browser tests: run scripts/test-deps.sh")
}

// ---------------------------------------------------------------------------------------
// The pages.

const HOME: &str = r#"<!doctype html>
<html><head><title>Test page</title></head>
<body>
  <h1>Hello browser</h1>
  <p id="out">Nobody greeted yet</p>
  <label for="name">Your name</label>
  <input id="name" type="text" value="placeholder">
  <button id="greet" onclick="document.getElementById('out').textContent = 'Hello, ' + document.getElementById('name').value + '!'">Greet</button>
  <a href="/next">Next page</a>
</body></html>"#;

const NEXT: &str = r#"<!doctype html>
<html><head><title>Second page</title></head>
<body><h1>The second page</h1><a href="/">Back home</a></body></html>"#;

/// A tiny HTTP/1.1 server: `/` and `/next` are pages, `/redirect` goes to `/next`,
/// anything else is 404. One request per connection.
async fn serve_pages() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&request);
                let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let (status, extra, body) = match path.as_str() {
                    "/" => ("200 OK", "", HOME),
                    "/next" => ("200 OK", "", NEXT),
                    "/redirect" => ("302 Found", "Location: /next\r\n", ""),
                    _ => (
                        "404 Not Found",
                        "",
                        "<title>Missing</title><h1>Not here</h1>",
                    ),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\n{extra}Content-Type: text/html; charset=utf-8\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tcp.write_all(response.as_bytes()).await;
                let _ = tcp.shutdown().await;
            });
        }
    });
    base
}

// ---------------------------------------------------------------------------------------
// The fake brain and the worker process (as in the `channel` module).

/// The browser's profile directory in a session's workspace.
fn profile_of(workspace: &Workspace) -> PathBuf {
    workspace.path().join(".browser-profile")
}

struct Session {
    child: Child,
    stderr: Arc<Mutex<String>>,
    client: RunningService<RoleClient, ()>,
    control: Control,
    workspace: Workspace,
}

impl Session {
    /// A worker with `WORKER_PROFILE=profile` and the given extra environment.
    async fn start(label: &str, profile: &str, env: &[(&str, &str)]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let workspace = Workspace::new(label);
        let mut command = worker_command(&url, workspace.path(), SESSION, &TOKEN);
        command.env("WORKER_PROFILE", profile);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().unwrap();
        let (stderr, _) = collect_stderr(&mut child);
        let (tcp, _) = tokio::time::timeout(WAIT, listener.accept())
            .await
            .expect("the worker dials")
            .unwrap();
        tcp.set_nodelay(true).unwrap();
        let ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let (sink, stream, control) = split::<RoleClient, _>(ws);
        let client = tokio::time::timeout(WAIT, ().serve((sink, stream)))
            .await
            .expect("the MCP handshake completes")
            .unwrap();
        Self {
            child,
            stderr,
            client,
            control,
            workspace,
        }
    }

    async fn browser(label: &str, env: &[(&str, &str)]) -> Self {
        let chromium = chromium();
        let mut all = vec![("WORKER_CHROMIUM", chromium.to_str().unwrap())];
        all.extend_from_slice(env);
        Self::start(label, "browser", &all).await
    }

    async fn call(&self, tool: &str, args: Value) -> CallToolResult {
        call(&self.client, WAIT, tool, args).await
    }

    /// Calls `tool` and returns its text, asserting it succeeded.
    async fn ok(&self, tool: &str, args: Value) -> String {
        let result = self.call(tool, args).await;
        let text = text_of(&result);
        assert_eq!(result.is_error, Some(false), "{tool}: {text}");
        text
    }

    /// Calls `tool` and returns its text, asserting it failed.
    async fn fails(&self, tool: &str, args: Value) -> String {
        let result = self.call(tool, args).await;
        let text = text_of(&result);
        assert_eq!(result.is_error, Some(true), "{tool}: {text}");
        text
    }

    fn logs(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until the worker has logged `needle` (panics after 5 s).
    async fn wait_for_log(&self, needle: &str) {
        let started = Instant::now();
        while !self.logs().contains(needle) {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "no {needle:?} in:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The main Chromium process using this session's profile, if one runs.
    fn chromium_pid(&self) -> Option<u32> {
        chromium_processes(&profile_of(&self.workspace))
            .into_iter()
            .find(|(_, cmdline)| !cmdline.contains("--type=") && !cmdline.contains("crashpad"))
            .map(|(pid, _)| pid)
    }
}

/// Every live (non-zombie) process whose command line names `profile`: the browser, its
/// helpers, and the crashpad handlers (whose database is in it).
fn chromium_processes(profile: &Path) -> Vec<(u32, String)> {
    let needle = profile.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .map(|stat| {
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(true);
        if cmdline.contains(&needle) && !zombie {
            found.push((pid, cmdline));
        }
    }
    found
}

/// Waits until no process uses `profile` (panics after `limit`).
async fn all_gone(profile: &Path, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let left = chromium_processes(profile);
        if left.is_empty() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "Chromium still running after {limit:?}: {:?}",
            left.iter().map(|(pid, _)| pid).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The number in `[ref=N]` on the first line of `snapshot` containing `needle`.
fn ref_of(snapshot: &str, needle: &str) -> u64 {
    let line = snapshot
        .lines()
        .find(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle} in:\n{snapshot}"));
    let start = line
        .find("[ref=")
        .unwrap_or_else(|| panic!("no ref on {line:?}"))
        + 5;
    line[start..].split(']').next().unwrap().parse().unwrap()
}

// ---------------------------------------------------------------------------------------
// The tests.

#[tokio::test]
async fn navigate_snapshot_type_click_and_screenshot() {
    let site = serve_pages().await;
    let s = Session::browser("flow", &[]).await;

    // Profile `browser` serves the workspace tools and the browser tools.
    let mut served: Vec<String> = s
        .client
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    let mut offered: Vec<String> = channel::catalog::catalog_for("browser")
        .iter()
        .map(|t| t.name.to_owned())
        .collect();
    served.sort();
    offered.sort();
    assert_eq!(served, offered);

    // Nothing runs before the first browser tool.
    assert_eq!(s.chromium_pid(), None);

    let opened = s
        .ok("browser_navigate", json!({"url": format!("{site}/")}))
        .await;
    assert_eq!(
        opened,
        format!("url: {site}/\ntitle: \"Test page\"\nstatus: 200")
    );
    assert!(s.chromium_pid().is_some());
    assert!(
        profile_of(&s.workspace).is_dir(),
        "the profile is in the workspace"
    );

    let snapshot = s.ok("browser_snapshot", json!({})).await;
    eprintln!("{snapshot}");
    assert!(snapshot.starts_with(&format!("url: {site}/\ntitle: \"Test page\"\n\n")));
    assert!(snapshot.contains("heading \"Hello browser\""), "{snapshot}");
    assert!(snapshot.contains("Nobody greeted yet"), "{snapshot}");
    let input = ref_of(&snapshot, "textbox \"Your name\"");
    let button = ref_of(&snapshot, "button \"Greet\"");
    let link = ref_of(&snapshot, "link \"Next page\"");
    assert!(snapshot.contains("value=\"placeholder\""), "{snapshot}");
    // Indented under the document.
    assert!(
        snapshot
            .lines()
            .any(|l| l.starts_with("  - heading \"Hello browser\"")),
        "{snapshot}"
    );

    // Typing replaces the field's text.
    let typed = s
        .ok(
            "browser_type",
            json!({"ref": input, "text": "Ada Lovelace"}),
        )
        .await;
    assert!(typed.starts_with("typed 12 characters into ref"), "{typed}");
    assert!(
        !typed.contains("Ada"),
        "the typed text is not echoed: {typed}"
    );
    let clicked = s.ok("browser_click", json!({"ref": button})).await;
    assert!(
        clicked.starts_with(&format!("clicked ref {button} (button \"Greet\")")),
        "{clicked}"
    );

    let after = s.ok("browser_snapshot", json!({})).await;
    assert!(after.contains("Hello, Ada Lovelace!"), "{after}");
    assert!(!after.contains("Nobody greeted yet"), "{after}");
    assert!(after.contains("value=\"Ada Lovelace\""), "{after}");
    // Refs continue: the new snapshot's refs are new numbers, the old ones are stale.
    let new_button = ref_of(&after, "button \"Greet\"");
    assert!(new_button > link, "{new_button} after {link}");
    let stale = s.fails("browser_click", json!({"ref": button})).await;
    assert!(
        stale.contains(&format!(
            "ref {button} is not in the latest browser_snapshot"
        )),
        "{stale}"
    );
    let unknown = s
        .fails("browser_type", json!({"ref": 9999, "text": "x"}))
        .await;
    assert!(unknown.contains("take a new browser_snapshot"), "{unknown}");
    // Only fields take text.
    let not_field = s
        .fails("browser_type", json!({"ref": new_button, "text": "x"}))
        .await;
    assert!(not_field.contains("cannot take text"), "{not_field}");

    // A screenshot: an embedded PNG resource for the brain to store.
    let shot = s.call("browser_screenshot", json!({})).await;
    assert_eq!(shot.is_error, Some(false), "{}", text_of(&shot));
    let resource = shot.content[0].as_resource().expect("an embedded resource");
    let ResourceContents::BlobResourceContents {
        uri,
        mime_type,
        blob,
        ..
    } = &resource.resource
    else {
        panic!("a blob resource");
    };
    assert_eq!(uri, "browser:///screenshot-1.png");
    assert_eq!(mime_type.as_deref(), Some("image/png"));
    let png = base64::engine::general_purpose::STANDARD
        .decode(blob)
        .unwrap();
    assert_eq!(png[..8], PNG_SIGNATURE);
    if let Ok(path) = std::env::var("BROWSER_TEST_SCREENSHOT") {
        // For a look at it: BROWSER_TEST_SCREENSHOT=/tmp/shot.png cargo test ...
        std::fs::write(path, &png).unwrap();
    }
    assert!(png.len() > 1000, "{} bytes", png.len());
    let line = text_of(&shot);
    assert!(
        line.starts_with(&format!(
            "screenshot-1.png ({} bytes, image/png)",
            png.len()
        )),
        "{line}"
    );
    let second = s.call("browser_screenshot", json!({})).await;
    let ResourceContents::BlobResourceContents { uri, .. } =
        &second.content[0].as_resource().unwrap().resource
    else {
        panic!("a blob resource");
    };
    assert_eq!(uri, "browser:///screenshot-2.png");

    // Clicking a link navigates; the refs of the old page are gone.
    let snapshot = s.ok("browser_snapshot", json!({})).await;
    let link = ref_of(&snapshot, "link \"Next page\"");
    let input = ref_of(&snapshot, "textbox \"Your name\"");
    let clicked = s.ok("browser_click", json!({"ref": link})).await;
    assert!(clicked.contains(&format!("url: {site}/next")), "{clicked}");
    assert!(clicked.contains("title: \"Second page\""), "{clicked}");
    let gone = s
        .fails("browser_type", json!({"ref": input, "text": "x"}))
        .await;
    assert!(gone.contains("no longer exists"), "{gone}");
    let next = s.ok("browser_snapshot", json!({})).await;
    assert!(next.contains("heading \"The second page\""), "{next}");

    // A redirect reports the final URL; a 404 is a page with its status.
    let redirected = s
        .ok(
            "browser_navigate",
            json!({"url": format!("{site}/redirect")}),
        )
        .await;
    assert!(
        redirected.starts_with(&format!("url: {site}/next\n")),
        "{redirected}"
    );
    assert!(redirected.ends_with("status: 200"), "{redirected}");
    let missing = s
        .ok(
            "browser_navigate",
            json!({"url": format!("{site}/nowhere")}),
        )
        .await;
    assert!(missing.ends_with("status: 404"), "{missing}");
    // Only http(s); an unreachable site is a readable error.
    for url in ["file:///etc/passwd", "javascript:alert(1)", "about:blank"] {
        let refused = s.fails("browser_navigate", json!({"url": url})).await;
        assert!(
            refused.contains("only absolute http:// and https://"),
            "{refused}"
        );
    }
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = format!("http://{}/", closed.local_addr().unwrap());
    drop(closed);
    let unreachable = s.fails("browser_navigate", json!({"url": dead})).await;
    assert!(
        unreachable.starts_with("navigation failed:"),
        "{unreachable}"
    );
    assert!(
        unreachable.contains("ERR_CONNECTION_REFUSED"),
        "{unreachable}"
    );

    // Logs carry no URL, page text or typed text (X4).
    let logs = s.logs();
    assert!(logs.contains("browser started"), "{logs}");
    assert!(logs.contains("tool=\"browser_click\"") || logs.contains("tool=browser_click"));
    for secret in [
        site.as_str(),
        "Ada Lovelace",
        "Hello browser",
        TOKEN.as_str(),
    ] {
        assert!(!logs.contains(secret), "{secret} in logs:\n{logs}");
    }
}

#[tokio::test]
async fn the_browser_stops_when_idle_and_starts_again() {
    let site = serve_pages().await;
    let s = Session::browser("idle", &[("WORKER_BROWSER_IDLE_MS", "300")]).await;
    s.ok("browser_navigate", json!({"url": format!("{site}/")}))
        .await;
    let snapshot = s.ok("browser_snapshot", json!({})).await;
    let button = ref_of(&snapshot, "button \"Greet\"");
    let first = s.chromium_pid().expect("Chromium runs");

    // Idle for 300 ms: the whole process group goes; the profile stays.
    let took = all_gone(&profile_of(&s.workspace), Duration::from_secs(10)).await;
    eprintln!("stopped {took:?} after the last call");
    assert!(profile_of(&s.workspace).join("Default").is_dir());
    s.wait_for_log("browser stopped").await;
    let logs = s.logs();
    assert!(
        logs.contains("reason=\"idle\"") || logs.contains("reason=idle"),
        "{logs}"
    );

    // The next browser tool starts it again and reopens the page; old refs are stale.
    let snapshot = s.ok("browser_snapshot", json!({})).await;
    assert!(
        snapshot.starts_with(&format!(
            "(the browser had been stopped; reopened {site}/)\n"
        )),
        "{snapshot}"
    );
    assert!(snapshot.contains("heading \"Hello browser\""), "{snapshot}");
    let second = s.chromium_pid().expect("Chromium runs again");
    assert_ne!(first, second);
    let stale = s.fails("browser_click", json!({"ref": button})).await;
    assert!(
        stale.contains("not in the latest browser_snapshot"),
        "{stale}"
    );
    let button = ref_of(&snapshot, "button \"Greet\"");
    s.ok("browser_click", json!({"ref": button})).await;
    let logs = s.logs();
    for line in logs.lines().filter(|l| l.contains("browser st")) {
        eprintln!("{line}");
    }
    assert_eq!(logs.matches("browser started").count(), 2, "{logs}");
}

#[tokio::test]
async fn the_end_of_the_session_or_of_the_worker_kills_chromium() {
    let site = serve_pages().await;
    let mut s = Session::browser("end", &[]).await;
    s.ok("browser_navigate", json!({"url": format!("{site}/")}))
        .await;
    assert!(s.chromium_pid().is_some());
    assert!(
        chromium_processes(&profile_of(&s.workspace)).len() > 1,
        "helpers too"
    );
    s.control.close(CLOSE_SESSION_ENDED, "session_ended").await;
    let status = tokio::time::timeout(WAIT, s.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    all_gone(&profile_of(&s.workspace), Duration::from_secs(2)).await;

    // A worker killed outright (SIGKILL) takes Chromium with it (parent-death signal).
    let mut s = Session::browser("killed", &[]).await;
    s.ok("browser_navigate", json!({"url": format!("{site}/")}))
        .await;
    assert!(s.chromium_pid().is_some());
    s.child.start_kill().unwrap();
    s.child.wait().await.unwrap();
    let took = all_gone(&profile_of(&s.workspace), Duration::from_secs(5)).await;
    eprintln!("worker SIGKILLed -> Chromium gone in {took:?}");
}

#[tokio::test]
async fn profiles_decide_the_tools_and_a_broken_chromium_is_a_readable_error() {
    // The default profile (light) serves no browser tool.
    let light = Session::start("light", "light", &[]).await;
    let served: Vec<String> = light
        .client
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(
        served.iter().all(|name| !name.starts_with("browser_")),
        "{served:?}"
    );
    assert_eq!(served.len(), channel::catalog::catalog_for("light").len());
    // Calling one anyway is refused (rmcp: tool not found).
    let params =
        CallToolRequestParams::new("browser_snapshot").with_arguments(serde_json::Map::new());
    let unknown = light.client.call_tool(params).await;
    assert!(
        unknown
            .as_ref()
            .map_or(true, |result| result.is_error == Some(true)),
        "{unknown:?}"
    );

    // A Chromium that exits at start: the tool says so; the worker lives on.
    let broken = Session::start("broken", "browser", &[("WORKER_CHROMIUM", "/bin/false")]).await;
    let failed = broken.fails("browser_snapshot", json!({})).await;
    assert!(
        failed.starts_with("Chromium exited while starting"),
        "{failed}"
    );
    let shell = broken.ok("shell", json!({"command": "echo alive"})).await;
    assert!(shell.contains("alive"));
}
