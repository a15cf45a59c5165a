//! The worker binary against a fake brain on loopback.
//!
//! The fake brain accepts the upgrade (checking the three headers), then acts as the MCP
//! client over `channel::ws`, exactly as the real brain does: `initialize`, `tools/list`,
//! `tools/call`, progress notifications, cancellation, close frames.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::result_large_err)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{
    SESSION, TOKEN, Workspace, call, collect_stderr, session_token, text_of, worker_command,
};
use base64::Engine;
use channel::token::TokenKeys;
use channel::ws::{Control, split};
use protocol::channel::{
    CALL_KEY_META, CHANNEL_VERSION, CHANNEL_VERSION_HEADER, CLOSE_CHANNEL_HELD, CLOSE_GOING_AWAY,
    CLOSE_SESSION_ENDED,
};
use protocol::{AgentId, TeamId};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientNotification, ClientRequest,
    CustomNotification, CustomRequest, ProgressNotificationParam, ResourceContents,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::process::Child;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;

const WAIT: Duration = Duration::from_secs(10);

/// The brain's MCP client: it forwards every progress notification to the test.
#[derive(Clone)]
struct Brain {
    progress: mpsc::UnboundedSender<ProgressNotificationParam>,
}

impl ClientHandler for Brain {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.progress.send(params);
    }
}

/// The worker process, with its stderr collected.
struct WorkerProcess {
    child: Child,
    stderr: Arc<Mutex<String>>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl WorkerProcess {
    fn spawn(brain_url: &str, workspace: &Path, token: &str) -> Self {
        Self::spawn_as(brain_url, workspace, SESSION, token)
    }

    fn spawn_as(brain_url: &str, workspace: &Path, session: &str, token: &str) -> Self {
        let mut child = worker_command(brain_url, workspace, session, token)
            .spawn()
            .unwrap();
        let (stderr, reader) = collect_stderr(&mut child);
        Self {
            child,
            stderr,
            reader: Some(reader),
        }
    }

    async fn exit_code(&mut self) -> i32 {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the worker exits")
            .unwrap();
        // Everything it wrote to stderr has been collected.
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(WAIT, reader).await;
        }
        status.code().expect("an exit code")
    }

    fn logs(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

/// What the upgrade request carried.
#[derive(Debug, Default, Clone)]
struct Headers {
    authorization: Option<String>,
    version: Option<String>,
    session: Option<String>,
}

fn header(request: &Request, name: &str) -> Option<String> {
    request
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A connected session: the worker process, the MCP client, the channel control.
struct Session {
    worker: WorkerProcess,
    client: RunningService<RoleClient, Brain>,
    control: Control,
    progress: mpsc::UnboundedReceiver<ProgressNotificationParam>,
    headers: Headers,
    _workspace: Workspace,
    root: PathBuf,
    /// Where the worker dials (again).
    listener: TcpListener,
    /// The accepted socket, to drop the connection without a close frame.
    socket: std::net::TcpStream,
}

impl Session {
    async fn start(label: &str) -> Self {
        Self::start_as(label, SESSION, &TOKEN).await
    }

    /// A worker started as `session` (a session's id, or a pool slot's) with `token`.
    async fn start_as(label: &str, session: &str, token: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let workspace = Workspace::new(label);
        let worker = WorkerProcess::spawn_as(&url, workspace.path(), session, token);
        Self::accept(listener, worker, workspace).await
    }

    /// Cuts the connection the way a dead replica or a network blip does: no close frame.
    fn cut(&self) {
        self.socket.shutdown(std::net::Shutdown::Both).unwrap();
    }

    /// The worker's next dial, on the same listener, by the same worker process.
    async fn redialed(self) -> Self {
        let Self {
            worker,
            _workspace,
            listener,
            ..
        } = self;
        Self::accept(listener, worker, _workspace).await
    }

    async fn accept(listener: TcpListener, worker: WorkerProcess, workspace: Workspace) -> Self {
        let (tcp, _) = tokio::time::timeout(WAIT, listener.accept())
            .await
            .expect("the worker dials")
            .unwrap();
        tcp.set_nodelay(true).unwrap();
        let std_tcp = tcp.into_std().unwrap();
        let socket = std_tcp.try_clone().unwrap();
        let tcp = tokio::net::TcpStream::from_std(std_tcp).unwrap();
        let seen = Arc::new(Mutex::new(Headers::default()));
        let record = seen.clone();
        let callback = move |request: &Request, response: Response| {
            assert_eq!(request.uri().path(), "/v1/worker/connect");
            *record.lock().unwrap() = Headers {
                authorization: header(request, "authorization"),
                version: header(request, CHANNEL_VERSION_HEADER),
                session: header(request, "x-agent-session-id"),
            };
            Ok::<_, ErrorResponse>(response)
        };
        let ws = tokio_tungstenite::accept_hdr_async(tcp, callback)
            .await
            .unwrap();
        let headers = seen.lock().unwrap().clone();
        let (sink, stream, control) = split::<RoleClient, _>(ws);
        let (tx, progress) = mpsc::unbounded_channel();
        let client = tokio::time::timeout(WAIT, Brain { progress: tx }.serve((sink, stream)))
            .await
            .expect("the MCP handshake completes")
            .unwrap();
        let root = workspace.path().canonicalize().unwrap();
        Self {
            worker,
            client,
            control,
            progress,
            headers,
            _workspace: workspace,
            root,
            listener,
            socket,
        }
    }

    /// Sends the worker a custom notification, as the brain does (renewal, bind).
    async fn notify(&self, method: &str, params: Value) {
        let notification = CustomNotification::new(method.to_owned(), Some(params));
        self.client
            .send_notification(ClientNotification::CustomNotification(notification))
            .await
            .unwrap();
    }

    async fn call(&self, tool: &str, args: Value) -> CallToolResult {
        call(&self.client, WAIT, tool, args).await
    }

    /// The next progress message, decoded from its JSON text.
    async fn next_live(&mut self) -> Value {
        let param = tokio::time::timeout(WAIT, self.progress.recv())
            .await
            .expect("a progress notification")
            .unwrap();
        serde_json::from_str(param.message.as_deref().unwrap()).unwrap()
    }

    /// Waits for a live stdout line carrying a pid (the command's first `echo $$`).
    async fn next_pid(&mut self) -> u32 {
        let live = self.next_live().await;
        assert_eq!(live["stream"], "stdout", "{live}");
        live["text"].as_str().unwrap().trim().parse().unwrap()
    }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// How long until `/proc/<pid>` is gone (panics past 2 s: far over the usual few
/// milliseconds, which the tests print, and far under the sleeper's 30 s).
async fn gone_within(pid: u32) -> Duration {
    let started = Instant::now();
    while alive(pid) {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "pid {pid} still alive"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

const SLEEPER: &str = "echo $$; exec sleep 30";

#[tokio::test]
async fn dial_headers_tools_and_streaming_shell() {
    let mut s = Session::start("basic").await;
    assert_eq!(
        s.headers.authorization.as_deref(),
        Some(format!("Bearer {}", *TOKEN).as_str())
    );
    assert_eq!(s.headers.version, Some(CHANNEL_VERSION.to_string()));
    assert_eq!(s.headers.session.as_deref(), Some(SESSION));

    let tools = s.client.list_all_tools().await.unwrap();
    let mut served: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    let mut offered: Vec<String> = channel::catalog::catalog_for("light")
        .iter()
        .map(|t| t.name.to_owned())
        .collect();
    served.sort();
    offered.sort();
    assert_eq!(served, offered);

    let hi = s.call("shell", json!({"command": "echo hi"})).await;
    assert_eq!(hi.is_error, Some(false));
    let text = text_of(&hi);
    assert!(text.contains("exit code: 0"), "{text}");
    assert!(text.contains("hi"), "{text}");
    // `echo hi` was streamed too; drain it.
    assert_eq!(
        s.next_live().await,
        json!({"stream": "stdout", "text": "hi\n"})
    );

    // Lines arrive while the command runs: all three before the result.
    let params = CallToolRequestParams::new("shell").with_arguments(
        json!({"command": "for i in 1 2 3; do echo $i; sleep 0.1; done; echo err >&2"})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let client = s.client.peer().clone();
    let call = tokio::spawn(async move { client.call_tool(params).await });
    let mut lines = Vec::new();
    while lines.len() < 3 {
        let live = s.next_live().await;
        if live["stream"] == "stdout" {
            lines.push(live["text"].as_str().unwrap().to_owned());
            // Streamed while running: the result has not arrived yet.
            assert!(!call.is_finished() || lines.len() == 3);
        }
    }
    assert_eq!(lines.concat(), "1\n2\n3\n");
    assert!(!call.is_finished(), "progress came after the result");
    let result = tokio::time::timeout(WAIT, call)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let text = text_of(&result);
    assert!(text.contains("--- stdout ---\n1\n2\n3\n"), "{text}");
    assert!(text.contains("--- stderr ---\nerr\n"), "{text}");

    // A non-zero exit is a result, not an error; a cwd outside is an error.
    let failed = s.call("shell", json!({"command": "exit 7"})).await;
    assert_eq!(failed.is_error, Some(false));
    assert!(text_of(&failed).starts_with("exit code: 7"));
    let outside = s
        .call("shell", json!({"command": "pwd", "cwd": ".."}))
        .await;
    assert_eq!(outside.is_error, Some(true));
    assert!(text_of(&outside).contains("path escapes the workspace"));
    // cwd inside the workspace is honoured.
    std::fs::create_dir(s.root.join("sub")).unwrap();
    let pwd = s
        .call("shell", json!({"command": "pwd", "cwd": "sub"}))
        .await;
    assert!(text_of(&pwd).contains(&format!("{}/sub", s.root.display())));

    // Logs carry neither the token nor command text (X4).
    let logs = s.worker.logs();
    assert!(!logs.contains(TOKEN.as_str()), "{logs}");
    assert!(!logs.contains("echo"), "{logs}");
    assert!(logs.contains("tool call"), "{logs}");
}

/// W12, worker side: `agent_runtime/env` is answered once held; its variables are each
/// command's environment (not the worker's own), and their values are masked in the live
/// lines, the result and the file tools' answers. A set outside the limits is refused
/// whole and the one held stays.
#[tokio::test]
async fn the_sessions_environment_is_set_masked_and_refused_outside_its_limits() {
    let mut s = Session::start("env").await;
    let value = "tok-4f1c9a-secret-value";
    let peer = s.client.peer().clone();
    let send = |vars: Value| {
        let peer = peer.clone();
        async move {
            let request = ClientRequest::CustomRequest(CustomRequest::new(
                protocol::env::ENV_REQUEST,
                Some(json!({ "vars": vars })),
            ));
            tokio::time::timeout(WAIT, peer.send_request(request))
                .await
                .unwrap()
        }
    };
    send(json!({"MY_TOKEN": value})).await.unwrap();

    let shell = s
        .call(
            "shell",
            json!({"command": "echo $MY_TOKEN; printenv MY_TOKEN | wc -c; echo \"$MY_TOKEN\" > f.txt"}),
        )
        .await;
    let expected = format!("[secret:MY_TOKEN]\n{}\n", value.len() + 1);
    assert!(
        text_of(&shell).ends_with(&format!("--- stdout ---\n{expected}")),
        "{shell:?}"
    );
    let mut live = String::new();
    while !live.ends_with(&expected) {
        live.push_str(s.next_live().await["text"].as_str().unwrap());
    }
    let read = s.call("read_file", json!({"path": "f.txt"})).await;
    assert_eq!(text_of(&read), "[secret:MY_TOKEN]\n");
    assert_eq!(
        std::fs::read_to_string(s.root.join("f.txt")).unwrap(),
        format!("{value}\n"),
        "the file itself is the command's business"
    );
    let own = std::fs::read(format!("/proc/{}/environ", s.worker.child.id().unwrap())).unwrap();
    assert!(!String::from_utf8_lossy(&own).contains(value));

    for refused in [
        json!({"PATH": "/nowhere"}),
        json!({"LD_PRELOAD": "/x.so"}),
        json!({"SHORT": "abc"}),
        json!({"lower": "abcd"}),
    ] {
        assert!(send(refused.clone()).await.is_err(), "{refused}");
    }
    let still = s.call("shell", json!({"command": "echo $MY_TOKEN"})).await;
    assert!(text_of(&still).contains("[secret:MY_TOKEN]"));
    assert!(!s.worker.logs().contains(value));
    assert!(s.worker.logs().contains("session environment refused"));
}

#[tokio::test]
async fn cancelling_a_call_kills_its_process_group_at_once() {
    let mut s = Session::start("cancel").await;

    // notifications/cancelled from the brain.
    let params = CallToolRequestParams::new("shell")
        .with_arguments(json!({"command": SLEEPER}).as_object().cloned().unwrap());
    let handle = s
        .client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    let pid = s.next_pid().await;
    assert!(alive(pid));
    handle.cancel(Some("turn stopped".into())).await.unwrap();
    let took = gone_within(pid).await;
    eprintln!("notifications/cancelled -> pid gone in {took:?}");

    // The brain dropping the call (its turn's client hung up) does the same.
    let params = CallToolRequestParams::new("shell")
        .with_arguments(json!({"command": SLEEPER}).as_object().cloned().unwrap());
    let client = s.client.peer().clone();
    let call = tokio::spawn(async move { client.call_tool(params).await });
    let pid = s.next_pid().await;
    assert!(alive(pid));
    call.abort();
    let took = gone_within(pid).await;
    eprintln!("call dropped -> pid gone in {took:?}");

    // The session stays usable.
    let after = s.call("shell", json!({"command": "echo still here"})).await;
    assert!(text_of(&after).contains("still here"));
}

/// A keyed call (D3) stops on `notifications/cancelled` too, every time. The cancel's
/// handler runs after the request's own token fires, which wakes the call's waiter: however
/// the worker's threads order those two, the cancel must still find the call.
#[tokio::test]
async fn cancelling_a_keyed_call_kills_its_process_group_every_time() {
    let mut s = Session::start("cancel-keyed").await;
    for round in 0..100 {
        let mut params = CallToolRequestParams::new("shell")
            .with_arguments(json!({"command": SLEEPER}).as_object().cloned().unwrap());
        params
            .meta
            .get_or_insert_default()
            .insert(CALL_KEY_META.into(), format!("turn:call-{round}").into());
        let handle = s
            .client
            .send_cancellable_request(
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                PeerRequestOptions::no_options(),
            )
            .await
            .unwrap();
        let pid = s.next_pid().await;
        handle.cancel(Some("turn stopped".into())).await.unwrap();
        let took = gone_within(pid).await;
        eprintln!("round {round}: notifications/cancelled -> pid gone in {took:?}");
    }
}

#[tokio::test]
async fn a_timeout_kills_the_command_and_says_so() {
    let mut s = Session::start("timeout").await;
    let params = CallToolRequestParams::new("shell").with_arguments(
        json!({"command": SLEEPER, "timeout_s": 1})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let client = s.client.peer().clone();
    let started = Instant::now();
    let call = tokio::spawn(async move { client.call_tool(params).await });
    let pid = s.next_pid().await;
    let result = tokio::time::timeout(WAIT, call)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    let text = text_of(&result);
    assert!(text.starts_with("timed out after 1 s"), "{text}");
    assert!(
        text.contains(&pid.to_string()),
        "output before the kill is kept: {text}"
    );
    assert!(!alive(pid));
}

#[tokio::test]
async fn file_tools_round_trip_and_stay_in_the_workspace() {
    let s = Session::start("files").await;
    let wrote = s
        .call(
            "write_file",
            json!({"path": "src/main.txt", "content": "hello world\n"}),
        )
        .await;
    assert_eq!(wrote.is_error, Some(false), "{}", text_of(&wrote));
    assert_eq!(
        std::fs::read_to_string(s.root.join("src/main.txt")).unwrap(),
        "hello world\n"
    );
    let read = s.call("read_file", json!({"path": "src/main.txt"})).await;
    assert_eq!(text_of(&read), "hello world\n");
    let listed = s.call("list_dir", json!({"path": "."})).await;
    assert_eq!(text_of(&listed), "src/\n");
    let listed = s.call("list_dir", json!({"path": "src"})).await;
    assert_eq!(text_of(&listed), "main.txt  12 bytes\n");

    let edited = s
        .call(
            "edit_file",
            json!({"path": "src/main.txt", "old": "world", "new": "there"}),
        )
        .await;
    assert_eq!(edited.is_error, Some(false));
    let read = s.call("read_file", json!({"path": "src/main.txt"})).await;
    assert_eq!(text_of(&read), "hello there\n");
    let missing = s
        .call(
            "edit_file",
            json!({"path": "src/main.txt", "old": "nope", "new": "x"}),
        )
        .await;
    assert_eq!(missing.is_error, Some(true));
    assert!(text_of(&missing).contains("not found"));
    s.call("write_file", json!({"path": "twice.txt", "content": "a a"}))
        .await;
    let twice = s
        .call(
            "edit_file",
            json!({"path": "twice.txt", "old": "a", "new": "b"}),
        )
        .await;
    assert_eq!(twice.is_error, Some(true));
    assert!(text_of(&twice).contains("occurs 2 times"));

    // Confinement: `..`, absolute paths, a symlink out.
    std::os::unix::fs::symlink("/etc", s.root.join("etc")).unwrap();
    for (tool, path) in [
        ("read_file", "../outside.txt"),
        ("read_file", "/etc/hostname"),
        ("read_file", "etc/hostname"),
        ("write_file", "etc/evil"),
        ("list_dir", "etc"),
        ("list_dir", "src/../.."),
        ("upload_artifact", "etc/hostname"),
    ] {
        let mut args = json!({"path": path});
        if tool == "write_file" {
            args["content"] = json!("x");
        }
        let refused = s.call(tool, args).await;
        assert_eq!(refused.is_error, Some(true), "{tool} {path}");
        assert!(
            text_of(&refused).contains("path escapes the workspace"),
            "{tool} {path}: {}",
            text_of(&refused)
        );
    }
    // Binary files are not read as text.
    std::fs::write(s.root.join("blob.bin"), [0u8, 159, 146, 150]).unwrap();
    let binary = s.call("read_file", json!({"path": "blob.bin"})).await;
    assert_eq!(binary.is_error, Some(true));
    assert!(text_of(&binary).contains("not a text file"));
    // Arguments are the catalog's closed types: rmcp answers an unknown field with an
    // error result the model can read.
    let extra = s.call("read_file", json!({"path": "x", "extra": 1})).await;
    assert_eq!(extra.is_error, Some(true));
    assert!(
        text_of(&extra).contains("unknown field"),
        "{}",
        text_of(&extra)
    );
}

#[tokio::test]
async fn upload_artifact_returns_the_bytes_as_an_embedded_blob() {
    let s = Session::start("artifact").await;
    let bytes: Vec<u8> = (0u8..=255).cycle().take(70_000).collect();
    std::fs::create_dir(s.root.join("out")).unwrap();
    std::fs::write(s.root.join("out/chart.png"), &bytes).unwrap();
    let result = s
        .call("upload_artifact", json!({"path": "out/chart.png"}))
        .await;
    assert_eq!(result.is_error, Some(false));
    let resource = result.content[0]
        .as_resource()
        .expect("an embedded resource");
    let ResourceContents::BlobResourceContents {
        uri,
        mime_type,
        blob,
        ..
    } = &resource.resource
    else {
        panic!("a blob resource");
    };
    assert_eq!(uri, "workspace:///out/chart.png");
    assert_eq!(mime_type.as_deref(), Some("image/png"));
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(blob)
        .unwrap();
    assert_eq!(decoded, bytes);
    let missing = s.call("upload_artifact", json!({"path": "nope.txt"})).await;
    assert_eq!(missing.is_error, Some(true));
}

#[tokio::test]
async fn session_ended_exits_zero_and_kills_running_commands() {
    let mut s = Session::start("close").await;
    // A renewed token is taken in-band (and never logged).
    let renewed = session_token(SESSION, Duration::from_secs(1200));
    s.notify(
        "notifications/agent_runtime/token",
        json!({"token": renewed}),
    )
    .await;
    let params = CallToolRequestParams::new("shell")
        .with_arguments(json!({"command": SLEEPER}).as_object().cloned().unwrap());
    let client = s.client.peer().clone();
    let _call = tokio::spawn(async move { client.call_tool(params).await });
    let pid = s.next_pid().await;

    s.control.close(CLOSE_SESSION_ENDED, "session_ended").await;
    let closed = Instant::now();
    assert_eq!(s.worker.exit_code().await, 0);
    assert!(
        closed.elapsed() < Duration::from_secs(2),
        "{:?}",
        closed.elapsed()
    );
    gone_within(pid).await;
    let logs = s.worker.logs();
    assert!(logs.contains("session token renewed"), "{logs}");
    assert!(!logs.contains(&renewed), "{logs}");
    assert!(
        logs.contains("end=\"closed\"") || logs.contains("end=closed"),
        "{logs}"
    );
}

#[tokio::test]
async fn a_close_code_that_ends_the_session_exits_four() {
    let mut s = Session::start("close-other").await;
    s.control.close(4002, "session_mismatch").await;
    assert_eq!(s.worker.exit_code().await, 4);
}

/// W9: a lost socket is dialed again with the newest token; what ran on the old channel
/// stops with it, is not run again, and the workspace is the same.
#[tokio::test]
async fn a_lost_socket_is_redialed_with_the_renewed_token() {
    let mut s = Session::start("redial").await;
    let wrote = s
        .call(
            "write_file",
            json!({"path": "kept.txt", "content": "still here"}),
        )
        .await;
    assert_eq!(wrote.is_error, Some(false));
    let renewed = session_token(SESSION, Duration::from_secs(1200));
    assert_ne!(renewed, *TOKEN);
    s.notify(
        "notifications/agent_runtime/token",
        json!({"token": renewed}),
    )
    .await;
    let params = CallToolRequestParams::new("shell").with_arguments(
        json!({"command": "echo once >> runs.log; echo $$; exec sleep 30"})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let client = s.client.peer().clone();
    let _in_flight = tokio::spawn(async move { client.call_tool(params).await });
    let pid = s.next_pid().await;

    s.cut();
    gone_within(pid).await;
    let s = s.redialed().await;
    assert_eq!(
        s.headers.authorization.as_deref(),
        Some(format!("Bearer {renewed}").as_str())
    );
    assert_eq!(s.headers.session.as_deref(), Some(SESSION));
    let kept = s.call("read_file", json!({"path": "kept.txt"})).await;
    assert_eq!(text_of(&kept), "still here");
    let runs = s.call("read_file", json!({"path": "runs.log"})).await;
    assert_eq!(text_of(&runs), "once\n", "nothing ran twice");
    let logs = s.worker.logs();
    assert!(logs.contains("re-dialing"), "{logs}");
    assert!(!logs.contains(&renewed), "{logs}");
}

/// W9 and drain: "going away" (1001) and "channel held" (4006) mean dial again; the
/// worker does, and serves the next channel.
#[tokio::test]
async fn going_away_and_channel_held_are_dialed_again() {
    let s = Session::start("going-away").await;
    s.control.close(CLOSE_GOING_AWAY, "going_away").await;
    let s = s.redialed().await;
    let hi = s.call("shell", json!({"command": "echo back"})).await;
    assert!(text_of(&hi).contains("back"));
    s.control.close(CLOSE_CHANNEL_HELD, "channel_held").await;
    let mut s = s.redialed().await;
    let hi = s.call("shell", json!({"command": "echo again"})).await;
    assert!(text_of(&hi).contains("again"));
    s.control.close(CLOSE_SESSION_ENDED, "session_ended").await;
    assert_eq!(s.worker.exit_code().await, 0);
}

/// W9, R3: a pooled worker bound to a session dials again as that session, with the
/// token the bind carried, not its pool token.
#[tokio::test]
async fn a_bound_pooled_worker_redials_as_its_session() {
    let keys = TokenKeys::new(crate::common::TOKEN_KEY).unwrap();
    let slot = protocol::SessionId::new();
    let pool_token = keys.mint_pool(slot, Duration::from_secs(600)).unwrap();
    let s = Session::start_as("pooled", &slot.to_string(), &pool_token).await;
    let session = protocol::SessionId::new();
    let token = keys
        .mint(
            session,
            TeamId::new(),
            AgentId::new(),
            Duration::from_secs(600),
        )
        .unwrap();
    s.notify(
        "notifications/agent_runtime/bind",
        json!({"session": session, "token": token}),
    )
    .await;
    // The bind is a notification: a call answered after it was handled in order.
    let hi = s.call("shell", json!({"command": "echo bound"})).await;
    assert!(text_of(&hi).contains("bound"));
    s.cut();
    let s = s.redialed().await;
    assert_eq!(s.headers.session, Some(session.to_string()));
    assert_eq!(
        s.headers.authorization.as_deref(),
        Some(format!("Bearer {token}").as_str())
    );
}

/// W9: re-dialing lasts as long as the token: a brain unreachable past its expiry ends the
/// worker (exit 5), and SIGTERM ends it at once while it re-dials (exit 0).
#[tokio::test]
async fn redialing_stops_when_the_token_expires_or_on_sigterm() {
    let short = session_token(SESSION, Duration::from_secs(2));
    let s = Session::start_as("expiring", SESSION, &short).await;
    s.cut();
    let cut = Instant::now();
    // Nothing listens any more: every dial is refused.
    let Session {
        mut worker,
        listener,
        ..
    } = s;
    drop(listener);
    assert_eq!(worker.exit_code().await, 5);
    assert!(
        cut.elapsed() < Duration::from_secs(4),
        "{:?}",
        cut.elapsed()
    );

    let mut s = Session::start("sigterm-redialing").await;
    s.cut();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = s.worker.child.id().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(s.worker.exit_code().await, 0);
}

#[tokio::test]
async fn a_refused_upgrade_exits_three_and_bad_config_exits_two() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let workspace = Workspace::new("refused");
    let mut worker = WorkerProcess::spawn(&url, workspace.path(), &TOKEN);
    let (tcp, _) = listener.accept().await.unwrap();
    let refuse = |_: &Request, _: Response| {
        let mut response = ErrorResponse::new(Some("session_mismatch".into()));
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        Err(response)
    };
    assert!(
        tokio_tungstenite::accept_hdr_async(tcp, refuse)
            .await
            .is_err()
    );
    assert_eq!(worker.exit_code().await, 3);
    assert!(!worker.logs().contains(TOKEN.as_str()));

    let mut bad = WorkerProcess::spawn("ftp://nowhere", workspace.path(), &TOKEN);
    assert_eq!(bad.exit_code().await, 2);
    let logs = bad.logs();
    assert!(logs.contains("BRAIN_PUBLIC_URL"), "{logs}");

    let mut no_token = WorkerProcess::spawn(&url, workspace.path(), "");
    assert_eq!(no_token.exit_code().await, 2);
    assert!(no_token.logs().contains("WORKER_SESSION_TOKEN"));
}

#[tokio::test]
async fn the_dial_is_retried_while_the_brain_starts() {
    // Learn a free port, release it, start the worker, then start "the brain".
    let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let workspace = Workspace::new("retry");
    let worker = WorkerProcess::spawn(&format!("http://{addr}"), workspace.path(), &TOKEN);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let listener = TcpListener::bind(addr).await.unwrap();
    let s = Session::accept(listener, worker, workspace).await;
    let hi = s.call("shell", json!({"command": "echo late"})).await;
    assert!(text_of(&hi).contains("late"));
}

#[tokio::test]
async fn sigterm_kills_running_commands_closes_with_going_away_and_exits_zero() {
    let mut s = Session::start("sigterm").await;
    let params = CallToolRequestParams::new("shell")
        .with_arguments(json!({"command": SLEEPER}).as_object().cloned().unwrap());
    let client = s.client.peer().clone();
    let _call = tokio::spawn(async move { client.call_tool(params).await });
    let pid = s.next_pid().await;
    let worker_pid = s.worker.child.id().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(worker_pid).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(s.worker.exit_code().await, 0);
    gone_within(pid).await;
    let end = tokio::time::timeout(WAIT, s.control.ended()).await.unwrap();
    assert!(
        matches!(end, channel::ws::ChannelEnd::Closed { code: 1001, .. }),
        "{end:?}"
    );
}

#[tokio::test]
async fn a_partial_line_is_streamed_after_fifty_milliseconds() {
    let mut s = Session::start("partial").await;
    let params = CallToolRequestParams::new("shell").with_arguments(
        json!({"command": "printf 'ab'; sleep 1; printf 'cd'"})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let client = s.client.peer().clone();
    let started = Instant::now();
    let call = tokio::spawn(async move { client.call_tool(params).await });
    let live = s.next_live().await;
    let took = started.elapsed();
    assert_eq!(live, json!({"stream": "stdout", "text": "ab"}));
    assert!(took < Duration::from_millis(600), "{took:?}");
    let result = tokio::time::timeout(WAIT, call)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(text_of(&result).contains("abcd"));
    assert_eq!(
        s.next_live().await,
        json!({"stream": "stdout", "text": "cd"})
    );
}
