//! Connectors (SPEC B2): the API, and connector tools against real MCP servers installed by
//! `scripts/test-deps.sh` into `tests/mcp/`: server-everything (npm, over stdio and
//! streamable HTTP), mcp-server-time (PyPI, stdio) and `cancel_probe.py` (a small server on
//! the Python SDK that records a cancelled call). A missing server fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use futures_util::StreamExt;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::config::ConnectorConfig;
use engine::connectors::authorization::OAuth;
use engine::connectors::{ConnectorState, ConnectorStatus, Requester, connector_tools};

/// A turn of an admin key: its chats have no user, and it may authorize the connector.
const ADMIN_KEY: Requester<'static> = Requester {
    user: None,
    admin: true,
    actor: "key:test",
    answerer: engine::connectors::Answerer::Nobody,
};
use crate::common::mcp::{HttpServer, everything_js, free_port, installed, mcp_dir};
use crate::common::{TestApp, read_stream};
use engine::tools::{Tool, ToolCtx, ToolOutput};
use protocol::ui::UiChunk;
use protocol::{AgentId, ChatId, TurnId};
use scripted_provider::{Reply, ToolCall};
use serde_json::{Value, json};
use store::{ConnectorTarget, NewConnector};
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------
// The real servers.

fn venv_python() -> String {
    installed(mcp_dir().join(".venv/bin/python"))
}

fn everything_stdio() -> Vec<String> {
    vec!["node".into(), everything_js(), "stdio".into()]
}

fn time_stdio() -> Vec<String> {
    vec![venv_python(), "-m".into(), "mcp_server_time".into()]
}

fn cancel_probe() -> Vec<String> {
    vec![venv_python(), installed(mcp_dir().join("cancel_probe.py"))]
}

// ---------------------------------------------------------------------------------------
// Helpers.

fn config(startup_ms: u64, call_ms: u64) -> ConnectorConfig {
    ConnectorConfig {
        allow_stdio: true,
        // The test servers listen on loopback.
        allow_private_networks: true,
        startup_timeout: Duration::from_millis(startup_ms),
        call_timeout: Duration::from_millis(call_ms),
    }
}

async fn stdio_app() -> TestApp {
    TestApp::start_with(|c| c.connectors.allow_stdio = true).await
}

async fn new_agent(app: &TestApp) -> AgentId {
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    agent.parse().unwrap()
}

async fn add(app: &TestApp, agent: Option<AgentId>, name: &str, target: ConnectorTarget) {
    app.store
        .create_connector(
            app.team,
            &NewConnector {
                agent,
                name: name.into(),
                target,
                call_timeout_ms: None,
                trust_hints: false,
                tool_risks: BTreeMap::new(),
            },
            50,
            &store::Actor::operator(None),
        )
        .await
        .unwrap();
}

/// Connector OAuth as a brain without `BRAIN_SECRETS_KEY` has it: no grant is ever found.
fn oauth() -> OAuth {
    let config = engine::config::OAuthConfig {
        public_url: "http://127.0.0.1:8080".into(),
        clients: Default::default(),
    };
    OAuth::new(&config, true).unwrap()
}

fn http(url: String) -> ConnectorTarget {
    ConnectorTarget::Http {
        url,
        headers: BTreeMap::new(),
    }
}

fn stdio(command: Vec<String>) -> ConnectorTarget {
    ConnectorTarget::Stdio {
        command,
        env: BTreeMap::new(),
    }
}

fn ctx(app: &TestApp, agent: AgentId) -> ToolCtx {
    ToolCtx {
        store: app.store.clone(),
        team: app.team,
        agent,
        chat: ChatId::new(),
        turn: TurnId::new(),
        call_id: "call".into(),
        ui: None,
        authority: engine::auth::Authority {
            scope: engine::auth::Scope::Chat,
            actor: "test".into(),
        },
        cancel: CancellationToken::new(),
        liveness: Default::default(),
    }
}

fn find<'a>(tools: &'a [Arc<dyn Tool>], name: &str) -> &'a Arc<dyn Tool> {
    let names: Vec<String> = tools.iter().map(|t| t.spec().name).collect();
    tools
        .iter()
        .find(|t| t.spec().name == name)
        .unwrap_or_else(|| panic!("no tool {name} among {names:?}"))
}

fn status<'a>(statuses: &'a [ConnectorStatus], name: &str) -> &'a ConnectorStatus {
    statuses
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no status for {name}: {statuses:?}"))
}

async fn post(app: &TestApp, body: Value) -> (u16, Value) {
    let response = app.post_json("/v1/connectors", &body).await;
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

async fn delete(app: &TestApp, id: &str) -> u16 {
    app.auth(app.http.delete(format!("{}/v1/connectors/{id}", app.url)))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn list(app: &TestApp) -> Vec<Value> {
    let response = app.get("/v1/connectors").await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    body["connectors"].as_array().unwrap().clone()
}

// ---------------------------------------------------------------------------------------
// The API.

#[tokio::test]
async fn create_list_and_delete() {
    let app = stdio_app().await;
    let agent = new_agent(&app).await;

    let (status, team_wide) = post(
        &app,
        json!({"name": "search", "url": "https://mcp.example.com/mcp"}),
    )
    .await;
    assert_eq!(status, 201, "{team_wide}");
    assert_eq!(team_wide["name"], "search");
    assert_eq!(team_wide["transport"], "http");
    assert_eq!(team_wide["url"], "https://mcp.example.com/mcp");
    assert_eq!(team_wide["agent_id"], Value::Null);
    assert!(team_wide.get("command").is_none());

    let (status, local) = post(
        &app,
        json!({"name": "everything", "command": ["node", "server.js", "stdio"], "agent_id": agent.to_string()}),
    )
    .await;
    assert_eq!(status, 201, "{local}");
    assert_eq!(local["transport"], "stdio");
    assert_eq!(local["command"], json!(["node", "server.js", "stdio"]));
    assert_eq!(local["agent_id"], agent.to_string());

    let listed = list(&app).await;
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["id"], team_wide["id"]);
    assert_eq!(listed[1]["id"], local["id"]);

    assert_eq!(delete(&app, team_wide["id"].as_str().unwrap()).await, 204);
    assert_eq!(delete(&app, team_wide["id"].as_str().unwrap()).await, 404);
    assert_eq!(delete(&app, "not-a-uuid").await, 404);
    let listed = list(&app).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["name"], "everything");

    // Another team sees none of it and cannot delete it.
    let other = app.store.create_team("other").await.unwrap();
    let response = app
        .http
        .get(format!("{}/v1/connectors", app.url))
        .bearer_auth(&other.api_key)
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["connectors"], json!([]));
    let response = app
        .http
        .delete(format!(
            "{}/v1/connectors/{}",
            app.url,
            local["id"].as_str().unwrap()
        ))
        .bearer_auth(&other.api_key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(list(&app).await.len(), 1);

    // Without a key: 401.
    let response = app
        .http
        .get(format!("{}/v1/connectors", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
}

#[tokio::test]
async fn validation_codes() {
    // stdio not allowed: the default; the URLs below are on loopback.
    let app = TestApp::start_with(|c| c.connectors.allow_private_networks = true).await;
    let agent = new_agent(&app).await;
    let invalid = |(status, body): (u16, Value)| {
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    };

    for name in ["", "GitHub", "my-tools", "a b", &"x".repeat(33)] {
        invalid(post(&app, json!({"name": name, "url": "http://127.0.0.1:1/mcp"})).await);
    }
    invalid(
        post(
            &app,
            json!({"name": "both", "url": "http://127.0.0.1:1/mcp", "command": ["node"]}),
        )
        .await,
    );
    invalid(post(&app, json!({"name": "neither"})).await);
    invalid(
        post(
            &app,
            json!({"name": "x", "url": "http://127.0.0.1:1/mcp", "extra": 1}),
        )
        .await,
    );
    for url in [
        "ftp://example.com/",
        "file:///etc/passwd",
        "example.com/mcp",
        "http://u:p@example.com/",
    ] {
        invalid(post(&app, json!({"name": "x", "url": url})).await);
    }
    // stdio is refused unless the operator allows it.
    let (status, body) = post(
        &app,
        json!({"name": "local", "command": ["node", "server.js"]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["code"], "invalid_request");
    assert!(body["error"]["message"].as_str().unwrap().contains("stdio"));
    assert!(list(&app).await.is_empty());

    // Another team's agent, or an id that is not one: 404.
    let other = app.store.create_team("other").await.unwrap();
    let response = app
        .http
        .post(format!("{}/v1/agents", app.url))
        .bearer_auth(&other.api_key)
        .json(&json!({"name": "b", "system_prompt": "", "model": "openai/gpt-test"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let foreign: Value = response.json().await.unwrap();
    for agent_id in [foreign["id"].as_str().unwrap(), "nope"] {
        let (status, body) = post(
            &app,
            json!({"name": "x", "url": "http://127.0.0.1:1/mcp", "agent_id": agent_id}),
        )
        .await;
        assert_eq!(status, 404, "{body}");
        assert_eq!(body["error"]["code"], "not_found");
    }

    // A name is unique per scope: the team's, and each agent's.
    let url = "http://127.0.0.1:1/mcp";
    assert_eq!(post(&app, json!({"name": "dup", "url": url})).await.0, 201);
    let (status, body) = post(&app, json!({"name": "dup", "url": url})).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    let scoped = json!({"name": "dup", "url": url, "agent_id": agent.to_string()});
    assert_eq!(post(&app, scoped.clone()).await.0, 201);
    let (status, body) = post(&app, scoped).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    assert_eq!(list(&app).await.len(), 2);
}

/// SSRF: a connector URL may not point the brain at the cloud metadata service or a
/// link-local address, ever; nor at loopback or private ranges unless the operator allows
/// them (`BRAIN_CONNECTORS_ALLOW_PRIVATE_NETWORKS`).
#[tokio::test]
async fn connector_urls_may_not_point_at_metadata_or_private_addresses() {
    let app = TestApp::start().await;
    let refused = |(status, body): (u16, Value), url: &str| {
        assert_eq!(status, 400, "{url}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
        body["error"]["message"].as_str().unwrap().to_owned()
    };
    let always = [
        "http://169.254.169.254/latest/meta-data/",
        "http://169.254.1.1:8080/mcp",
        "http://[fe80::1]/mcp",
        "http://[fd00:ec2::254]/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://METADATA.google.internal./",
        "http://[::ffff:169.254.169.254]/",
        // Alibaba's and Oracle's metadata services, Azure's host endpoint, and the metadata
        // address wrapped in IPv4-translated and 6to4 IPv6 forms.
        "http://100.100.100.200/latest/meta-data/",
        "http://192.0.0.192/latest/",
        "http://168.63.129.16/metadata/",
        "http://[::ffff:0:a9fe:a9fe]/",
        "http://[2002:a9fe:a9fe::1]/",
        // Other spellings of 169.254.169.254 that the URL parser normalizes.
        "http://2852039166/",
        "http://0xa9.0xfe.0xa9.0xfe/",
    ];
    let private = [
        "http://127.0.0.1:3001/mcp",
        "http://127.1/mcp",
        "http://localhost:3001/mcp",
        "http://[::1]:3001/mcp",
        "http://10.0.0.5/mcp",
        "http://172.16.3.4/mcp",
        "http://192.168.1.10/mcp",
        "http://[fd12:3456::1]/mcp",
        "http://0.0.0.0:3001/mcp",
        // Not global unicast: IPv4-translated, local-use NAT64 and 6to4 forms of a private
        // address, multicast, reserved, benchmarking, IETF protocol assignments, site-local.
        "http://[::ffff:0:a00:5]/mcp",
        "http://[64:ff9b:1::a00:5]/mcp",
        "http://[2002:a00:5::1]/mcp",
        "http://224.0.0.1/mcp",
        "http://[ff02::1]/mcp",
        "http://240.0.0.1/mcp",
        "http://255.255.255.255/mcp",
        "http://198.18.0.1/mcp",
        "http://192.0.0.8/mcp",
        "http://[fec0::1]/mcp",
    ];
    for url in always.iter().chain(&private) {
        let message = refused(post(&app, json!({"name": "x", "url": url})).await, url);
        assert!(message.contains("url must not point at"), "{message}");
    }
    assert!(list(&app).await.is_empty());
    for url in ["https://mcp.example.com/mcp", "http://93.184.215.14/mcp"] {
        let (status, body) = post(&app, json!({"name": "public", "url": url})).await;
        assert_eq!(status, 201, "{url}: {body}");
        assert_eq!(delete(&app, body["id"].as_str().unwrap()).await, 204);
    }

    // An operator who runs MCP servers on the cluster network allows private ranges, but
    // the metadata service stays out of reach.
    let app = TestApp::start_with(|c| c.connectors.allow_private_networks = true).await;
    for url in always {
        refused(post(&app, json!({"name": "x", "url": url})).await, url);
    }
    for (i, url) in private.iter().enumerate() {
        let (status, body) = post(&app, json!({"name": format!("p{i}"), "url": url})).await;
        assert_eq!(status, 201, "{url}: {body}");
    }
}

/// The same rule at connect time, after DNS: a stored connector whose host name resolves
/// to a refused address is down (`private_address`), and the turn goes on.
#[tokio::test]
async fn a_host_resolving_to_a_refused_address_is_not_contacted() {
    let server = HttpServer::everything();
    let app = TestApp::start().await;
    let agent = new_agent(&app).await;
    // Stored directly: the API would refuse `localhost` already.
    add(
        &app,
        None,
        "named",
        http(format!("http://localhost:{}/mcp", server.port)),
    )
    .await;
    let refusing = ConnectorConfig {
        allow_private_networks: false,
        ..config(10_000, 30_000)
    };
    let (tools, statuses) = connector_tools(
        &app.store,
        &refusing,
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &CancellationToken::new(),
    )
    .await;
    assert!(tools.is_empty());
    let named = status(&statuses, "named");
    assert_eq!(named.state, ConnectorState::Down);
    assert_eq!(named.error.as_deref(), Some("private_address"), "{named:?}");

    // Allowed, the same connector works: it was the address rule, not the server.
    let (tools, statuses) = connector_tools(
        &app.store,
        &config(10_000, 30_000),
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(
        status_of(&statuses, "named"),
        ConnectorState::Ready,
        "{statuses:?}"
    );
    assert!(!tools.is_empty());

    // A turn with the refused connector goes on without its tools.
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    add(
        &app,
        Some(agent.parse().unwrap()),
        "named",
        http(format!("http://localhost:{}/mcp", server.port)),
    )
    .await;
    app.provider.push(Reply::Text {
        deltas: vec!["fine".into()],
        delay: Duration::from_millis(1),
    });
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "hi"})).await).await;
    assert!(
        chunks.iter().any(|c| matches!(c,
        UiChunk::DataConnectorStatus { data } if data.error.as_deref() == Some("private_address")))
    );
    assert!(chunks.contains(&UiChunk::Finish {
        finish_reason: protocol::ui::FinishReason::Stop
    }));
    drop(server);
}

// ---------------------------------------------------------------------------------------
// Connector tools against real servers.

#[tokio::test]
async fn server_everything_over_stdio() {
    let app = stdio_app().await;
    let agent = new_agent(&app).await;
    let pid_file = std::env::temp_dir().join(format!("brain-mcp-{}.pid", uuid::Uuid::new_v4()));
    // The shell writes its pid, then becomes the server (same pid).
    let script = format!(
        "echo $$ > '{}'; exec node '{}' stdio",
        pid_file.display(),
        everything_js()
    );
    add(
        &app,
        Some(agent),
        "everything",
        stdio(vec!["sh".into(), "-c".into(), script]),
    )
    .await;
    // Shadowed by the agent's own connector of the same name: never contacted.
    add(
        &app,
        None,
        "everything",
        http(format!("http://127.0.0.1:{}/mcp", free_port())),
    )
    .await;

    let (tools, statuses) = connector_tools(
        &app.store,
        &config(30_000, 30_000),
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    let ready = status(&statuses, "everything");
    assert_eq!(ready.state, ConnectorState::Ready, "{statuses:?}");
    assert_eq!(ready.tools, tools.len());
    assert!(tools.len() >= 5, "{}", tools.len());
    for tool in &tools {
        let name = tool.spec().name;
        assert!(name.starts_with("everything_"), "{name}");
        assert!(
            name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        );
    }

    let echo = find(&tools, "everything_echo");
    assert!(
        echo.writes(),
        "echo is annotated readOnlyHint, which this connector's admin does not trust"
    );
    let spec = echo.spec();
    assert_eq!(spec.input_schema["type"], "object");
    assert!(
        spec.input_schema["properties"]["message"].is_object(),
        "{}",
        spec.input_schema
    );
    let ctx = ctx(&app, agent);
    assert_eq!(
        echo.call(&ctx, json!({"message": "hello"})).await,
        ToolOutput::ok("Echo: hello")
    );
    let sum = find(&tools, "everything_get-sum");
    let out = sum.call(&ctx, json!({"a": 2, "b": 3})).await;
    assert!(!out.is_error && out.content.contains('5'), "{out:?}");
    // Non-text content is summarized by type.
    let image = find(&tools, "everything_get-tiny-image");
    let out = image.call(&ctx, json!({})).await;
    assert!(!out.is_error, "{out:?}");
    assert!(
        out.content
            .contains("[image content (image/png) not shown]"),
        "{out:?}"
    );
    assert!(
        !out.content.contains("iVBOR"),
        "no base64 reaches the model"
    );
    // Bad arguments come back as an error output, not a failure.
    let out = echo.call(&ctx, json!({"message": 42})).await;
    assert!(out.is_error, "{out:?}");
    let out = echo.call(&ctx, json!("not an object")).await;
    assert!(out.is_error, "{out:?}");
    // A tool not annotated read-only writes.
    assert!(find(&tools, "everything_toggle-simulated-logging").writes());

    // The session ends with its last tool: the child process goes away.
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _ = std::fs::remove_file(&pid_file);
    assert!(alive(pid), "the server runs while its tools live");
    drop(tools);
    let deadline = Instant::now() + Duration::from_secs(15);
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the stdio server outlived its tools"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Running (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

#[tokio::test]
async fn server_everything_over_streamable_http() {
    let server = HttpServer::everything();
    // The server listens on loopback.
    let app = TestApp::start_with(|c| c.connectors.allow_private_networks = true).await;
    let agent = new_agent(&app).await;
    let (status, body) = post(&app, json!({"name": "remote", "url": server.url()})).await;
    assert_eq!(status, 201, "{body}");

    let (tools, statuses) = connector_tools(
        &app.store,
        &config(30_000, 30_000),
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(
        status_of(&statuses, "remote"),
        ConnectorState::Ready,
        "{statuses:?}"
    );
    let echo = find(&tools, "remote_echo");
    let ctx = ctx(&app, agent);
    assert_eq!(
        echo.call(&ctx, json!({"message": "over http"})).await,
        ToolOutput::ok("Echo: over http")
    );
    // Concurrent calls share the session.
    let calls = (0..5).map(|i| {
        let echo = echo.clone();
        let ctx = ctx.clone();
        async move { echo.call(&ctx, json!({"message": format!("n{i}")})).await }
    });
    let outs = futures_util::future::join_all(calls).await;
    for (i, out) in outs.iter().enumerate() {
        assert_eq!(out, &ToolOutput::ok(format!("Echo: n{i}")));
    }
    drop(tools);
    drop(server);
}

fn status_of(statuses: &[ConnectorStatus], name: &str) -> ConnectorState {
    status(statuses, name).state
}

#[tokio::test]
async fn mcp_server_time_over_stdio() {
    let app = stdio_app().await;
    let agent = new_agent(&app).await;
    add(&app, None, "time", stdio(time_stdio())).await;

    let (tools, statuses) = connector_tools(
        &app.store,
        &config(30_000, 30_000),
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(
        status_of(&statuses, "time"),
        ConnectorState::Ready,
        "{statuses:?}"
    );
    assert_eq!(status(&statuses, "time").tools, 2);
    let now = find(&tools, "time_get_current_time");
    assert!(now.writes(), "its readOnlyHint is not trusted here");
    let ctx = ctx(&app, agent);
    let out = now.call(&ctx, json!({"timezone": "UTC"})).await;
    assert!(!out.is_error, "{out:?}");
    assert!(out.content.contains("UTC"), "{out:?}");
    let year = chrono::Utc::now().format("%Y-").to_string();
    assert!(out.content.contains(&year), "{out:?}");
    // The server's own refusal is an error output the model can read.
    let out = now
        .call(&ctx, json!({"timezone": "Mars/Olympus_Mons"}))
        .await;
    assert!(out.is_error, "{out:?}");
}

#[tokio::test]
async fn down_connectors_are_reported_and_the_rest_still_work() {
    let server = HttpServer::everything();
    let app = TestApp::start().await;
    let agent = new_agent(&app).await;

    // A listener that accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}/mcp", silent.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    add(
        &app,
        None,
        "dead",
        http(format!("http://127.0.0.1:{}/mcp", free_port())),
    )
    .await;
    add(&app, None, "silent", http(silent_url)).await;
    add(&app, None, "remote", http(server.url())).await;
    // Stored while allowed; the operator has since turned stdio off.
    add(&app, Some(agent), "local", stdio(everything_stdio())).await;

    // Long enough for the live server to answer on a loaded machine; the silent one
    // still times out and the whole startup is bounded by it.
    let mut cfg = config(2_000, 30_000);
    cfg.allow_stdio = false;
    let started = Instant::now();
    let (tools, statuses) = connector_tools(
        &app.store,
        &cfg,
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &CancellationToken::new(),
    )
    .await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(4_000), "took {took:?}");

    assert_eq!(statuses.len(), 4, "{statuses:?}");
    let dead = status(&statuses, "dead");
    assert_eq!(dead.state, ConnectorState::Down);
    assert_eq!(dead.tools, 0);
    assert_eq!(dead.error.as_deref(), Some("unreachable"), "{dead:?}");
    let silent = status(&statuses, "silent");
    assert_eq!(silent.state, ConnectorState::Down);
    assert_eq!(silent.error.as_deref(), Some("timeout"));
    let local = status(&statuses, "local");
    assert_eq!(local.state, ConnectorState::Down);
    assert_eq!(local.error.as_deref(), Some("stdio_disabled"));
    let remote = status(&statuses, "remote");
    assert_eq!(remote.state, ConnectorState::Ready, "{statuses:?}");
    assert_eq!(remote.tools, tools.len());
    assert!(tools.iter().all(|t| t.spec().name.starts_with("remote_")));
    let out = find(&tools, "remote_echo")
        .call(&ctx(&app, agent), json!({"message": "still here"}))
        .await;
    assert_eq!(out, ToolOutput::ok("Echo: still here"));

    // The wire form the turn reports.
    assert_eq!(
        serde_json::to_value(silent).unwrap(),
        json!({"name": "silent", "state": "down", "tools": 0, "error": "timeout"})
    );

    // A turn cancelled during startup does not wait for the connectors.
    let cancel = CancellationToken::new();
    cancel.cancel();
    let started = Instant::now();
    let (tools, statuses) = connector_tools(
        &app.store,
        &config(10_000, 30_000),
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &cancel,
    )
    .await;
    assert!(tools.is_empty());
    assert!(
        statuses
            .iter()
            .all(|s| s.error.as_deref() == Some("cancelled")),
        "{statuses:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "it did not wait out the startup timeout"
    );
    drop(server);
}

/// Waits until `marker` says `says`: "waiting" once the probe's call runs on the server,
/// "cancelled" once the server saw the cancellation.
async fn until_marker(marker: &Path, says: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(marker).is_ok_and(|s| s == says) {
        assert!(
            Instant::now() < deadline,
            "the probe's marker never said {says:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `marker` says the server saw the cancellation, and clears it.
async fn saw_cancel(marker: &Path) {
    until_marker(marker, "cancelled").await;
    let _ = std::fs::remove_file(marker);
}

#[tokio::test]
async fn call_timeout_and_cancellation_reach_the_server() {
    let app = stdio_app().await;
    let agent = new_agent(&app).await;
    add(&app, None, "probe", stdio(cancel_probe())).await;
    let (tools, statuses) = connector_tools(
        &app.store,
        &config(30_000, 700),
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(
        status_of(&statuses, "probe"),
        ConnectorState::Ready,
        "{statuses:?}"
    );
    let wait = find(&tools, "probe_wait");
    assert!(wait.writes(), "no readOnlyHint: counted as a write");

    // It answers when it is quick.
    let ctx = ctx(&app, agent);
    let marker = std::env::temp_dir().join(format!("brain-cancel-{}", uuid::Uuid::new_v4()));
    let out = wait
        .call(
            &ctx,
            json!({"marker": marker.to_str().unwrap(), "seconds": 0.01}),
        )
        .await;
    assert_eq!(out, ToolOutput::ok("done"));
    std::fs::remove_file(&marker).unwrap();

    // The call timeout gives the model an error and cancels the request on the server.
    let started = Instant::now();
    let out = wait
        .call(&ctx, json!({"marker": marker.to_str().unwrap()}))
        .await;
    assert!(out.is_error, "{out:?}");
    assert!(
        out.content.contains("did not answer within 700 ms"),
        "{out:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    saw_cancel(&marker).await;

    // The turn's cancellation does the same, at once: once the call runs on the server,
    // it ends `cancelled`, not by the call timeout.
    let (cancelled, waiting) = (ctx.cancel.clone(), marker.clone());
    tokio::spawn(async move {
        until_marker(&waiting, "waiting").await;
        cancelled.cancel();
    });
    let out = wait
        .call(&ctx, json!({"marker": marker.to_str().unwrap()}))
        .await;
    assert!(
        out.is_error && out.content.starts_with("cancelled"),
        "{out:?}"
    );
    saw_cancel(&marker).await;
}

// ---------------------------------------------------------------------------------------
// End to end: a turn offers and calls a connector tool. Needs the turn to merge
// `connector_tools` into its toolset.

#[tokio::test]
async fn turn_calls_a_stdio_connector_tool() {
    let app = stdio_app().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (status, body) = post(
        &app,
        json!({"name": "everything", "command": everything_stdio(), "agent_id": agent}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call_1".into(),
            name: "everything_echo".into(),
            arguments: json!({"message": "from the turn"}).to_string(),
        }],
        fragment: 7,
    });
    app.provider.push(Reply::Text {
        deltas: vec!["Done.".into()],
        delay: Duration::from_millis(1),
    });
    let (chunks, done) =
        read_stream(app.send(&chat, &json!({"content": "echo something"})).await).await;
    assert!(done);
    let offered = app.provider.requests()[0].body.to_string();
    assert!(
        offered.contains("everything_echo"),
        "the tool was offered: {offered}"
    );
    let output = chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::ToolOutputAvailable {
                tool_call_id,
                output,
            } if tool_call_id == "call_1" => Some(output.to_string()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool output in {chunks:?}"));
    assert!(output.contains("Echo: from the turn"), "{output}");
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
}

/// SPEC T8 through a real connector: the client hangs up while `probe_wait` runs; the
/// server sees the cancellation, the turn is stored as interrupted with a synthetic
/// result, and the next turn's history has exactly one result per call.
#[tokio::test]
async fn a_cancel_mid_tool_leaves_a_valid_history() {
    let app = stdio_app().await;
    let (agent, chat) = app.agent_and_chat("anthropic/claude-test", &[]).await;
    let (status, body) = post(
        &app,
        json!({"name": "probe", "command": cancel_probe(), "agent_id": agent}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let marker = std::env::temp_dir().join(format!("probe-{}", uuid::Uuid::new_v4()));
    app.provider.push(Reply::ToolCalls {
        text: Some("Waiting.".into()),
        calls: vec![ToolCall {
            id: "wait_1".into(),
            name: "probe_wait".into(),
            arguments: json!({"marker": marker.to_string_lossy(), "seconds": 30}).to_string(),
        }],
        fragment: 9,
    });
    let response = app.send(&chat, &json!({"content": "wait for it"})).await;
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("tool-input-available") {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    // Hang up once the tool runs on the server.
    until_marker(&marker, "waiting").await;
    drop(body);
    saw_cancel(&marker).await;
    assert_eq!(app.settled().await, vec![("interrupted".to_owned(), None)]);
    let messages = app.messages(&chat).await;
    let parts = messages[1]["parts"].as_array().unwrap();
    let tool = parts
        .iter()
        .find(|p| p["type"] == "tool-probe_wait")
        .unwrap();
    assert_eq!(tool["state"], "output-error");
    assert!(
        tool["errorText"].as_str().unwrap().starts_with("cancelled"),
        "{tool}"
    );

    app.provider.push(Reply::Text {
        deltas: vec!["Next.".into()],
        delay: Duration::from_millis(1),
    });
    read_stream(app.send(&chat, &json!({"content": "again"})).await).await;
    assert_eq!(app.provider.requests().len(), 2);
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
    let _ = std::fs::remove_file(marker);
}

/// No tool starts after the client hung up (T8): a write queued behind a running one is
/// answered "cancelled" and never runs.
#[tokio::test]
async fn no_tool_starts_after_the_client_hung_up() {
    let app = stdio_app().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (status, body) = post(
        &app,
        json!({"name": "probe", "command": cancel_probe(), "agent_id": agent}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let marker = std::env::temp_dir().join(format!("probe-{}", uuid::Uuid::new_v4()));
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![
            ToolCall {
                id: "wait_1".into(),
                name: "probe_wait".into(),
                arguments: json!({"marker": marker.to_string_lossy(), "seconds": 30}).to_string(),
            },
            ToolCall {
                id: "note_1".into(),
                name: "memory_write".into(),
                arguments: json!({"content": "written after the hang-up"}).to_string(),
            },
        ],
        fragment: 0,
    });
    let response = app
        .send(&chat, &json!({"content": "wait, then note"}))
        .await;
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while seen.matches("tool-input-available").count() < 2 {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    // Hang up while the wait runs on the server and the write is queued behind it.
    until_marker(&marker, "waiting").await;
    drop(body);
    assert_eq!(app.settled().await, vec![("interrupted".to_owned(), None)]);
    let (notes,): (i64,) = sqlx::query_as("SELECT count(*) FROM memories")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(notes, 0, "the queued write never started");
    let messages = app.messages(&chat).await;
    let note = messages[1]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "tool-memory_write")
        .unwrap()
        .clone();
    assert!(
        note["errorText"].as_str().unwrap().starts_with("cancelled"),
        "{note}"
    );
    let _ = std::fs::remove_file(marker);
}

// ---------------------------------------------------------------------------------------
// Static credentials (B1): `{{secret:NAME}}` templates in headers and env.

const SECRETS_KEY: &str = "8f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";
const TOKEN: &str = "s3cr3t-probe-token-0451";

fn secrets_key() -> store::SecretsKey {
    store::SecretsKey::parse(SECRETS_KEY).unwrap()
}

async fn keyed_app() -> TestApp {
    TestApp::start_with(|c| {
        c.connectors.allow_stdio = true;
        c.connectors.allow_private_networks = true;
        c.secrets_key = Some(secrets_key());
    })
    .await
}

fn probe_script() -> String {
    installed(mcp_dir().join("credential_probe.py"))
}

/// `credential_probe.py http`: a real MCP server (Python SDK) that answers 401 unless the
/// request's Authorization header is exactly `expected`.
fn http_probe(expected: &str) -> HttpServer {
    HttpServer::spawn(
        |port| {
            let mut command = std::process::Command::new(venv_python());
            command
                .arg(probe_script())
                .arg("http")
                .arg(port.to_string())
                .env("EXPECTED_AUTHORIZATION", expected);
            command
        },
        "credential_probe.py",
    )
}

async fn put_secret(app: &TestApp, name: &str, value: &str) -> u16 {
    app.auth(app.http.put(format!("{}/v1/secrets/{name}", app.url)))
        .json(&json!({ "value": value }))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn header_credentials_come_from_the_agents_secret_then_the_teams() {
    let probe = http_probe(&format!("Bearer {TOKEN}"));
    let app = keyed_app().await;
    let keyed = app.store.clone().with_secrets_key(Some(secrets_key()));
    let agent = new_agent(&app).await;
    let stranger = new_agent(&app).await;
    keyed
        .set_secret(
            app.team,
            agent,
            "PROBE_TOKEN",
            TOKEN,
            10,
            &store::Actor::operator(None),
        )
        .await
        .unwrap();
    assert_eq!(put_secret(&app, "TEAM_NAME", "acme").await, 201);

    let (code, created) = post(
        &app,
        json!({
            "name": "probe",
            "url": probe.url(),
            "headers": {
                "Authorization": "Bearer {{secret:PROBE_TOKEN}}",
                "X-Team": "{{secret:TEAM_NAME}}",
            },
        }),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    // The API shows the templates, never a value.
    assert_eq!(
        created["headers"]["Authorization"],
        "Bearer {{secret:PROBE_TOKEN}}"
    );
    let listed = app.get("/v1/connectors").await.text().await.unwrap();
    assert!(
        !listed.contains(TOKEN) && !listed.contains("acme"),
        "{listed}"
    );

    // The agent's own secret fills the Authorization header; the team's fills X-Team.
    let config = config(30_000, 30_000);
    let cancel = CancellationToken::new();
    let (tools, statuses) = connector_tools(
        &keyed,
        &config,
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &cancel,
    )
    .await;
    assert_eq!(
        status_of(&statuses, "probe"),
        ConnectorState::Ready,
        "{statuses:?}"
    );
    let out = find(&tools, "probe_whoami")
        .call(&ctx(&app, agent), json!({}))
        .await;
    // The value reached the server; what it says back is masked.
    assert_eq!(out, ToolOutput::ok("team=[secret:TEAM_NAME]"));
    drop(tools);

    // Another agent holds no PROBE_TOKEN and the team none either: the connector is down
    // with a class that says why, and nothing was sent.
    let (tools, statuses) = connector_tools(
        &keyed,
        &config,
        &oauth(),
        app.team,
        stranger,
        ADMIN_KEY,
        &cancel,
    )
    .await;
    assert!(tools.is_empty());
    assert_eq!(
        status(&statuses, "probe").error.as_deref(),
        Some("secret_missing")
    );

    // A team secret of the name serves every agent, and the agent's own still wins: the
    // team's value is wrong, so the stranger is refused by the server (401) while the
    // agent is let in.
    assert_eq!(
        put_secret(&app, "PROBE_TOKEN", "wrong-team-value").await,
        201
    );
    let (_, statuses) = connector_tools(
        &keyed,
        &config,
        &oauth(),
        app.team,
        stranger,
        ADMIN_KEY,
        &cancel,
    )
    .await;
    let refused = status(&statuses, "probe");
    assert_eq!(refused.state, ConnectorState::Down, "{refused:?}");
    assert_ne!(refused.error.as_deref(), Some("secret_missing"));
    let (_, statuses) = connector_tools(
        &keyed,
        &config,
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &cancel,
    )
    .await;
    assert_eq!(
        status_of(&statuses, "probe"),
        ConnectorState::Ready,
        "{statuses:?}"
    );
    // The team's value put right, the stranger gets in too.
    assert_eq!(put_secret(&app, "PROBE_TOKEN", TOKEN).await, 204);
    let (_, statuses) = connector_tools(
        &keyed,
        &config,
        &oauth(),
        app.team,
        stranger,
        ADMIN_KEY,
        &cancel,
    )
    .await;
    assert_eq!(
        status_of(&statuses, "probe"),
        ConnectorState::Ready,
        "{statuses:?}"
    );

    // Without the secrets key the brain cannot open a secret: the connector says so.
    let (_, statuses) = connector_tools(
        &app.store,
        &config,
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &cancel,
    )
    .await;
    assert_eq!(
        status(&statuses, "probe").error.as_deref(),
        Some("secrets_not_configured")
    );
    drop(probe);
}

/// B1 with W12's masking: a server that quotes the request back (`echo_request`, as an
/// echo or an error page does) hands the connector's credentials, team secrets in
/// `Authorization` and `X-Team`, back to the brain. The tool result is
/// masked before the client's stream, the model, the transcript and the events stream.
#[tokio::test]
async fn credentials_a_server_echoes_back_are_masked_everywhere() {
    let team_value = format!("team-{}", uuid::Uuid::new_v4().simple());
    let probe = http_probe(&format!("Bearer {TOKEN}"));
    let app = keyed_app().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    assert_eq!(put_secret(&app, "PROBE_TOKEN", TOKEN).await, 201);
    assert_eq!(put_secret(&app, "TEAM_NAME", &team_value).await, 201);
    let (code, created) = post(
        &app,
        json!({
            "name": "probe",
            "url": probe.url(),
            "agent_id": agent,
            "headers": {
                "Authorization": "Bearer {{secret:PROBE_TOKEN}}",
                "X-Team": "{{secret:TEAM_NAME}}",
            },
        }),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call_1".into(),
            name: "probe_echo_request".into(),
            arguments: "{}".into(),
        }],
        fragment: 0,
    });
    app.provider.push(Reply::Text {
        deltas: vec!["Done.".into()],
        delay: Duration::from_millis(1),
    });
    let events = app.observe(&chat).await;
    let stream = app
        .send(&chat, &json!({"content": "what did you send?"}))
        .await
        .text()
        .await
        .unwrap();
    let (chunks, done) = common::parse_events(&stream);
    assert!(done);
    let output = chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::ToolOutputAvailable {
                tool_call_id,
                output,
            } if tool_call_id == "call_1" => Some(output.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool output in {chunks:?}"));
    assert_eq!(
        output,
        json!("authorization=Bearer [secret:PROBE_TOKEN] team=[secret:TEAM_NAME]")
    );
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 2);
    let to_model = requests[1].body.to_string();
    assert!(to_model.contains("[secret:PROBE_TOKEN]"), "{to_model}");
    let transcript = serde_json::to_string(&app.messages(&chat).await).unwrap();
    assert!(transcript.contains("[secret:TEAM_NAME]"), "{transcript}");
    let events = events.await.unwrap();
    assert!(events.contains("[secret:TEAM_NAME]"), "{events}");
    for (sink, text) in [
        ("the client's stream", &stream),
        ("the model's next request", &to_model),
        ("the transcript", &transcript),
        ("the events stream", &events),
    ] {
        assert!(
            !text.contains(TOKEN) && !text.contains(&team_value),
            "{sink} holds a credential: {text}"
        );
    }
}

#[tokio::test]
async fn env_credentials_reach_a_stdio_child_and_nothing_else_does() {
    let app = keyed_app().await;
    let keyed = app.store.clone().with_secrets_key(Some(secrets_key()));
    let agent = new_agent(&app).await;
    assert_eq!(put_secret(&app, "PROBE_TOKEN", TOKEN).await, 201);
    let (status, created) = post(
        &app,
        json!({
            "name": "probe",
            "command": [venv_python(), probe_script(), "stdio"],
            "env": {"PROBE_TOKEN": "{{secret:PROBE_TOKEN}}", "PROBE_MODE": "test"},
        }),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["env"]["PROBE_MODE"], "test");

    let (tools, statuses) = connector_tools(
        &keyed,
        &config(60_000, 30_000),
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(
        status_of(&statuses, "probe"),
        ConnectorState::Ready,
        "{statuses:?}"
    );
    let digest = |name: &str| {
        let tool = find(&tools, "probe_env_sha256").clone();
        let ctx = ctx(&app, agent);
        let name = name.to_owned();
        async move { tool.call(&ctx, json!({ "name": name })).await.content }
    };
    let expected: String = {
        use sha2::Digest;
        sha2::Sha256::digest(TOKEN.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    assert_eq!(digest("PROBE_TOKEN").await, expected);
    assert_eq!(digest("PROBE_MODE").await.len(), 64);
    // The brain's own environment stays out.
    assert_eq!(digest("DATABASE_URL").await, "unset");
    assert_eq!(digest("BRAIN_SECRETS_KEY").await, "unset");
}

#[tokio::test]
async fn credentials_are_validated_when_a_connector_is_created() {
    let app = keyed_app().await;
    for (body, why) in [
        (
            json!({"name": "a", "url": "https://mcp.example.com/", "headers": {"Authorization": "Bearer lit3ral"}}),
            "take it from a secret",
        ),
        (
            json!({"name": "a", "url": "https://mcp.example.com/", "headers": {"Mcp-Session-Id": "x"}}),
            "set by the MCP transport",
        ),
        (
            json!({"name": "a", "url": "https://mcp.example.com/", "headers": {"X-A": "{{secret:lower}}"}}),
            "does not name a secret",
        ),
        (
            json!({"name": "a", "url": "https://mcp.example.com/", "env": {"A": "b"}}),
            "env applies to a command",
        ),
        (
            json!({"name": "a", "command": ["true"], "headers": {"X-A": "b"}}),
            "headers apply to a url",
        ),
        (
            json!({"name": "a", "command": ["true"], "env": {"API_KEY": "plain"}}),
            "take it from a secret",
        ),
        (
            json!({"name": "a", "url": "https://mcp.example.com/", "headers": {"X-A": 1}}),
            "",
        ),
    ] {
        let (status, answer) = post(&app, body.clone()).await;
        assert_eq!(status, 400, "{body} → {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(why), "{body} → {message}");
        assert!(
            !message.contains("lit3ral"),
            "the value is not echoed: {message}"
        );
    }
    assert!(list(&app).await.is_empty(), "nothing was stored");
}

#[tokio::test]
async fn team_secrets_api() {
    let app = keyed_app().await;
    assert_eq!(put_secret(&app, "LINEAR_TOKEN", "lin_1").await, 201);
    assert_eq!(put_secret(&app, "LINEAR_TOKEN", "lin_2").await, 204);
    assert_eq!(put_secret(&app, "lower", "x").await, 400);
    assert_eq!(put_secret(&app, "EMPTY", "").await, 400);
    let listed = app.get("/v1/secrets").await;
    assert_eq!(listed.status(), 200);
    let body = listed.text().await.unwrap();
    assert!(!body.contains("lin_"), "no value is listed: {body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["secrets"][0]["name"], "LINEAR_TOKEN");
    assert!(body["secrets"][0]["updated_at"].is_string());
    // The value that is kept is the last one.
    let keyed = app.store.clone().with_secrets_key(Some(secrets_key()));
    let values = keyed
        .resolve_secrets(app.team, AgentId::new(), &["LINEAR_TOKEN".into()])
        .await
        .unwrap();
    assert_eq!(values["LINEAR_TOKEN"], "lin_2");

    let delete_secret = |name: &str| {
        app.auth(app.http.delete(format!("{}/v1/secrets/{name}", app.url)))
            .send()
    };
    assert_eq!(delete_secret("LINEAR_TOKEN").await.unwrap().status(), 204);
    assert_eq!(delete_secret("LINEAR_TOKEN").await.unwrap().status(), 404);

    // Another team sees none of it.
    assert_eq!(put_secret(&app, "MINE", "v").await, 201);
    let other = app.store.create_team("other").await.unwrap();
    let theirs: Value = app
        .http
        .get(format!("{}/v1/secrets", app.url))
        .bearer_auth(&other.api_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(theirs["secrets"], json!([]));

    // A server without a secrets key says what is missing.
    let unkeyed = TestApp::start().await;
    let response = unkeyed
        .auth(unkeyed.http.put(format!("{}/v1/secrets/A", unkeyed.url)))
        .json(&json!({"value": "v"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 501);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_configured");
}

#[tokio::test]
async fn a_connectors_own_call_timeout_overrides_the_servers() {
    let app = stdio_app().await;
    let agent = new_agent(&app).await;
    let (status, created) = post(
        &app,
        json!({"name": "probe", "command": cancel_probe(), "call_timeout_ms": 400}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["call_timeout_ms"], 400);
    for bad in [0, 99, 3_600_001] {
        let (status, _) = post(
            &app,
            json!({"name": "other", "command": cancel_probe(), "call_timeout_ms": bad}),
        )
        .await;
        assert_eq!(status, 400, "{bad}");
    }
    let (tools, _) = connector_tools(
        &app.store,
        &config(30_000, 60_000),
        &oauth(),
        app.team,
        agent,
        ADMIN_KEY,
        &CancellationToken::new(),
    )
    .await;
    let marker = std::env::temp_dir().join(format!("brain-cancel-{}", uuid::Uuid::new_v4()));
    let started = Instant::now();
    let out = find(&tools, "probe_wait")
        .call(
            &ctx(&app, agent),
            json!({"marker": marker.to_str().unwrap()}),
        )
        .await;
    assert!(
        out.content.contains("did not answer within 400 ms"),
        "{out:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    saw_cancel(&marker).await;
}

/// A connector's MCP annotations (`readOnlyHint`...) are the server's claims.
/// They lower no tool's risk below `write` unless an admin marked the connector's hints
/// trusted (`trust_hints`), and an admin may set a tool's class outright (`tool_risks`,
/// keyed by the tool's name on the server), which wins over any hint.
#[tokio::test]
async fn a_connectors_hints_lower_no_risk_unless_an_admin_trusts_them() {
    use domain::approvals::RiskClass;

    let app = stdio_app().await;
    let agent = new_agent(&app).await;
    let tools_now = || async {
        let (tools, statuses) = connector_tools(
            &app.store,
            &config(30_000, 30_000),
            &oauth(),
            app.team,
            agent,
            ADMIN_KEY,
            &CancellationToken::new(),
        )
        .await;
        assert!(
            statuses.iter().all(|s| s.state == ConnectorState::Ready),
            "{statuses:?}"
        );
        tools
    };
    let everything = json!(everything_stdio());
    let (code, plain) = post(
        &app,
        json!({"name": "plain", "command": everything, "agent_id": agent.to_string()}),
    )
    .await;
    assert_eq!(code, 201, "{plain}");
    // `echo` says readOnlyHint: the server's word alone does not make it `read`.
    let tools = tools_now().await;
    assert_eq!(find(&tools, "plain_echo").risk(), RiskClass::Write);
    assert!(
        find(&tools, "plain_echo").writes(),
        "an untrusted read counts as a write"
    );
    assert_ne!(find(&tools, "plain_get-sum").risk(), RiskClass::Read);
    assert_eq!(plain["trust_hints"], false, "{plain}");

    let (code, trusted) = post(
        &app,
        json!({"name": "trusted", "command": everything, "agent_id": agent.to_string(),
               "trust_hints": true, "tool_risks": {"get-sum": "irreversible"}}),
    )
    .await;
    assert_eq!(code, 201, "{trusted}");
    assert_eq!(trusted["trust_hints"], true, "{trusted}");
    assert_eq!(
        trusted["tool_risks"]["get-sum"], "irreversible",
        "{trusted}"
    );
    let (code, classed) = post(
        &app,
        json!({"name": "classed", "command": everything, "agent_id": agent.to_string(),
               "tool_risks": {"get-sum": "read"}}),
    )
    .await;
    assert_eq!(code, 201, "{classed}");
    let tools = tools_now().await;
    // Trusted, the hint is taken at its word; what an admin set wins, whichever way.
    assert_eq!(find(&tools, "trusted_echo").risk(), RiskClass::Read);
    assert!(!find(&tools, "trusted_echo").writes());
    assert_eq!(
        find(&tools, "trusted_get-sum").risk(),
        RiskClass::Irreversible
    );
    assert_eq!(find(&tools, "classed_get-sum").risk(), RiskClass::Read);
    assert_eq!(find(&tools, "classed_echo").risk(), RiskClass::Write);

    // Classes are the approval policy's; a chat key sets nothing.
    let (code, refused) = post(
        &app,
        json!({"name": "bad", "command": everything, "tool_risks": {"echo": "harmless"}}),
    )
    .await;
    assert_eq!(code, 400, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("read, write, external, irreversible"),
        "{refused}"
    );
    let chat_key = app.chat_key().await;
    let response = app
        .http
        .post(format!("{}/v1/connectors", app.url))
        .bearer_auth(&chat_key)
        .json(&json!({"name": "mine", "command": everything, "trust_hints": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);

    // An admin changes its mind on a connector it keeps (its grants stay); a chat key
    // cannot.
    let patch = |bearer: &str, body: Value| {
        let url = format!(
            "{}/v1/connectors/{}",
            app.url,
            plain["id"].as_str().unwrap()
        );
        app.http.patch(url).bearer_auth(bearer).json(&body).send()
    };
    let refused = patch(&chat_key, json!({"trust_hints": true}))
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    let patched = patch(
        &app.key,
        json!({"trust_hints": true, "tool_risks": {"get-sum": "external"}}),
    )
    .await
    .unwrap();
    assert_eq!(patched.status(), 200);
    let patched: Value = patched.json().await.unwrap();
    assert_eq!(patched["trust_hints"], true, "{patched}");
    let tools = tools_now().await;
    assert_eq!(find(&tools, "plain_echo").risk(), RiskClass::Read);
    assert_eq!(find(&tools, "plain_get-sum").risk(), RiskClass::External);
    let bad = patch(&app.key, json!({"tool_risks": {"echo": "none"}}))
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let empty = patch(&app.key, json!({})).await.unwrap();
    assert_eq!(empty.status(), 400);
}
