//! The worker channel's refusals and failure reasons (SPEC W3, W6), each produced by a
//! misbehaving client speaking real WebSocket (and, for the handshake, real JSON-RPC),
//! and the worker's snapshot uploads (W10) under load. The test plays the
//! runtime-manager's part: it writes the session row (`connecting`, or `terminating` with
//! a snapshot requested) and mints the session token.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::{BrainProcess, TestApp};
use bytes::Bytes;
use channel::token::TokenKeys;
use futures_util::{SinkExt, StreamExt};
use protocol::channel::{CHANNEL_VERSION, CHANNEL_VERSION_HEADER};
use protocol::{AgentId, ChatId, SessionId, TeamId};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A session row in `state` for a fresh agent/chat of the app's team.
pub(crate) async fn session(app: &TestApp, state: &str) -> (SessionId, AgentId) {
    session_of(app, app.team, &app.key, state).await
}

/// A session row in `state` for a fresh agent/chat of `team` (whose API key is `key`).
async fn session_of(app: &TestApp, team: TeamId, key: &str, state: &str) -> (SessionId, AgentId) {
    let post = |path: String, body: Value| async move {
        let created: Value = app
            .http
            .post(format!("{}{path}", app.url))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        created["id"].as_str().unwrap().to_owned()
    };
    let agent = json!({"name": "a", "system_prompt": "s", "model": "openai/gpt-test"});
    let agent: AgentId = post("/v1/agents".into(), agent).await.parse().unwrap();
    let chat: ChatId = post(format!("/v1/agents/{agent}/chats"), json!({}))
        .await
        .parse()
        .unwrap();
    let id = SessionId::new();
    sqlx::query(
        "INSERT INTO agent_runtime_sessions (id, team_id, agent_id, chat_id, profile, state) \
         VALUES ($1, $2, $3, $4, 'light', $5)",
    )
    .bind(id.0)
    .bind(team.0)
    .bind(agent.0)
    .bind(chat.0)
    .bind(state)
    .execute(app.store.pool())
    .await
    .unwrap();
    (id, agent)
}

fn token(app: &TestApp, session: SessionId, agent: AgentId) -> String {
    token_of(session, app.team, agent)
}

pub(crate) fn token_of(session: SessionId, team: TeamId, agent: AgentId) -> String {
    TokenKeys::new(test_support::SESSION_TOKEN_KEY.as_bytes())
        .unwrap()
        .mint(session, team, agent, Duration::from_secs(600))
        .unwrap()
}

async fn dial(app: &TestApp, token: &str, version: u32, named: SessionId) -> Ws {
    let url = format!("{}/v1/worker/connect", app.url.replace("http://", "ws://"));
    let mut request = url.into_client_request().unwrap();
    let headers = request.headers_mut();
    headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
    headers.insert(CHANNEL_VERSION_HEADER, version.to_string().parse().unwrap());
    headers.insert("x-agent-session-id", named.to_string().parse().unwrap());
    let (ws, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(response.status(), 101);
    ws
}

/// The close frame the brain sends, and how long it took.
async fn close_of(ws: &mut Ws) -> (u16, String) {
    let deadline = Duration::from_secs(5);
    loop {
        match tokio::time::timeout(deadline, ws.next())
            .await
            .expect("the brain never closed")
        {
            Some(Ok(Message::Close(Some(frame)))) => {
                return (u16::from(frame.code), frame.reason.to_string());
            }
            Some(Ok(_)) => continue,
            other => panic!("no close frame: {other:?}"),
        }
    }
}

async fn row(app: &TestApp, session: SessionId) -> (String, Option<String>) {
    sqlx::query_as("SELECT state, failure_reason FROM agent_runtime_sessions WHERE id = $1")
        .bind(session.0)
        .fetch_one(app.store.pool())
        .await
        .unwrap()
}

async fn metric(app: &TestApp, reason: &str) -> bool {
    app.metrics().await.contains(&format!(
        "brain_worker_failures_total{{reason=\"{reason}\"}} 1"
    ))
}

#[tokio::test]
async fn a_bad_token_is_refused_before_the_upgrade() {
    let app = TestApp::start().await;
    let url = format!("{}/v1/worker/connect", app.url.replace("http://", "ws://"));
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", "Bearer forged".parse().unwrap());
    let err = tokio_tungstenite::connect_async(request).await.unwrap_err();
    assert!(err.to_string().contains("401"), "{err}");
}

#[tokio::test]
async fn another_channel_version_is_refused_at_once() {
    let app = TestApp::start().await;
    let (id, agent) = session(&app, "connecting").await;
    let started = Instant::now();
    let mut ws = dial(&app, &token(&app, id, agent), CHANNEL_VERSION + 1, id).await;
    assert_eq!(close_of(&mut ws).await, (4001, "channel_version".into()));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once, never a hang"
    );
    assert_eq!(
        row(&app, id).await,
        ("failed".into(), Some("channel_version".into()))
    );
    assert!(metric(&app, "channel_version").await);
}

/// X2: only what the token proves may change a row. The session the unauthenticated
/// header names is left alone; the token's own session, whose worker is evidently broken,
/// fails while it still waits for a worker.
#[tokio::test]
async fn a_token_for_another_session_is_a_mismatch() {
    let app = TestApp::start().await;
    let (named, _) = session(&app, "connecting").await;
    let (tokens, agent) = session(&app, "connecting").await;
    let mut ws = dial(&app, &token(&app, tokens, agent), CHANNEL_VERSION, named).await;
    assert_eq!(close_of(&mut ws).await, (4002, "session_mismatch".into()));
    assert_eq!(
        row(&app, named).await,
        ("connecting".into(), None),
        "the session the header names is untouched"
    );
    assert_eq!(
        row(&app, tokens).await,
        ("failed".into(), Some("session_mismatch".into()))
    );
    assert!(metric(&app, "session_mismatch").await);
}

/// A valid token for one session, dialing with a header that names a `ready`
/// session of another team, changes nothing of that session, and nothing of the token's
/// own live one.
#[tokio::test]
async fn a_mismatched_dial_leaves_a_ready_session_of_another_team_alone() {
    let app = TestApp::start().await;
    let other = app.store.create_team("other team").await.unwrap();
    let (victim, _) = session_of(&app, other.team_id, &other.api_key, "ready").await;
    let before = updated_at(&app, victim).await;
    let (tokens, agent) = session(&app, "ready").await;
    let mut ws = dial(&app, &token(&app, tokens, agent), CHANNEL_VERSION, victim).await;
    assert_eq!(close_of(&mut ws).await, (4002, "session_mismatch".into()));
    assert_eq!(row(&app, victim).await, ("ready".into(), None));
    assert_eq!(
        updated_at(&app, victim).await,
        before,
        "the row was not written"
    );
    assert_eq!(
        row(&app, tokens).await,
        ("ready".into(), None),
        "a live session is not disturbed by a confused dial"
    );
}

async fn updated_at(app: &TestApp, session: SessionId) -> chrono::DateTime<chrono::Utc> {
    let (at,) = sqlx::query_as("SELECT updated_at FROM agent_runtime_sessions WHERE id = $1")
        .bind(session.0)
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    at
}

#[tokio::test]
async fn a_session_not_expecting_a_worker_is_a_mismatch() {
    let app = TestApp::start().await;
    let (id, agent) = session(&app, "pending").await;
    let mut ws = dial(&app, &token(&app, id, agent), CHANNEL_VERSION, id).await;
    assert_eq!(close_of(&mut ws).await, (4002, "session_mismatch".into()));
    assert_eq!(
        row(&app, id).await,
        ("failed".into(), Some("session_mismatch".into()))
    );
}

#[tokio::test]
async fn a_worker_that_never_initializes_is_a_handshake_timeout() {
    let app =
        TestApp::start_with(|c| c.workers.handshake_timeout = Duration::from_millis(300)).await;
    let (id, agent) = session(&app, "connecting").await;
    let mut ws = dial(&app, &token(&app, id, agent), CHANNEL_VERSION, id).await;
    // The brain (MCP client) sends `initialize`; this worker never answers.
    let (code, reason) = close_of(&mut ws).await;
    assert_eq!((code, reason.as_str()), (4003, "handshake_timeout"));
    assert_eq!(
        row(&app, id).await,
        ("failed".into(), Some("handshake_timeout".into()))
    );
}

#[tokio::test]
async fn a_worker_that_never_lists_its_tools_is_a_ready_timeout() {
    let app = TestApp::start_with(|c| c.workers.ready_timeout = Duration::from_millis(300)).await;
    let (id, agent) = session(&app, "connecting").await;
    let mut ws = dial(&app, &token(&app, id, agent), CHANNEL_VERSION, id).await;
    // Answer `initialize` like a real MCP server, then ignore `tools/list`.
    loop {
        match ws.next().await.unwrap().unwrap() {
            Message::Text(text) => {
                let request: Value = serde_json::from_str(text.as_str()).unwrap();
                if request["method"] == "initialize" {
                    let answer = json!({
                        "jsonrpc": "2.0",
                        "id": request["id"],
                        "result": {
                            "protocolVersion": request["params"]["protocolVersion"],
                            "capabilities": {"tools": {}},
                            "serverInfo": {"name": "silent", "version": "0"}
                        }
                    });
                    ws.send(Message::text(answer.to_string())).await.unwrap();
                    break;
                }
            }
            _ => continue,
        }
    }
    let (code, reason) = close_of(&mut ws).await;
    assert_eq!((code, reason.as_str()), (4004, "ready_timeout"));
    assert_eq!(
        row(&app, id).await,
        ("failed".into(), Some("ready_timeout".into()))
    );
}

/// Plays a worker that works: answers `initialize`, `tools/list` and the session's
/// environment (`agent_runtime/env`) like a real worker, then keeps reading (so pings are
/// answered) until the channel ends. The task yields the close frame the brain sent, if
/// any.
fn serve_as_worker(ws: Ws) -> tokio::task::JoinHandle<Option<(u16, String)>> {
    serve_as_worker_with(ws, true)
}

/// [`serve_as_worker`]; with `takes_env` false, it refuses the environment as a worker
/// refuses one outside the limits.
fn serve_as_worker_with(
    mut ws: Ws,
    takes_env: bool,
) -> tokio::task::JoinHandle<Option<(u16, String)>> {
    tokio::spawn(async move {
        while let Some(Ok(message)) = ws.next().await {
            match message {
                Message::Text(text) => {
                    let request: Value = serde_json::from_str(text.as_str()).unwrap();
                    let result = match request["method"].as_str() {
                        Some("initialize") => json!({
                            "protocolVersion": request["params"]["protocolVersion"],
                            "capabilities": {"tools": {}},
                            "serverInfo": {"name": "fake", "version": "0"}
                        }),
                        Some("tools/list") => json!({"tools": []}),
                        Some("agent_runtime/env") if takes_env => {
                            json!({"vars": request["params"]["vars"].as_object().unwrap().len()})
                        }
                        Some("agent_runtime/env") => {
                            let refusal = json!({"jsonrpc": "2.0", "id": request["id"],
                                "error": {"code": -32602, "message": "session environment refused: bad_name"}});
                            ws.send(Message::text(refusal.to_string())).await.unwrap();
                            continue;
                        }
                        _ => continue,
                    };
                    let answer = json!({"jsonrpc": "2.0", "id": request["id"], "result": result});
                    ws.send(Message::text(answer.to_string())).await.unwrap();
                }
                Message::Close(frame) => {
                    return frame.map(|f| (u16::from(f.code), f.reason.to_string()));
                }
                _ => {}
            }
        }
        None
    })
}

/// W12: the session's environment is part of being ready. A worker that refuses it never
/// serves the session: `4004 ready_timeout`, at once rather than after the timeout.
#[tokio::test]
async fn a_worker_that_refuses_the_sessions_environment_is_a_ready_timeout() {
    let app = TestApp::start().await;
    let (id, agent) = session(&app, "connecting").await;
    let started = Instant::now();
    let worker = serve_as_worker_with(
        dial(&app, &token(&app, id, agent), CHANNEL_VERSION, id).await,
        false,
    );
    let closed = tokio::time::timeout(Duration::from_secs(5), worker)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(closed, Some((4004, "ready_timeout".into())));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        row(&app, id).await,
        ("failed".into(), Some("ready_timeout".into()))
    );
}

/// `agent_runtime_sessions.owner_replica` of `session` is set (`true`) or not.
async fn owned(app: &TestApp, session: SessionId) -> bool {
    let (owned,): (bool,) = sqlx::query_as(
        "SELECT owner_replica IS NOT NULL FROM agent_runtime_sessions WHERE id = $1",
    )
    .bind(session.0)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    owned
}

async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// W9, brain side: a second dial for a `ready` session is held off (4006, the live
/// channel undisturbed); once that channel is gone the session stays `ready`, and the
/// next dial with the same token takes the channel over.
#[tokio::test]
async fn a_redial_is_taken_only_once_the_live_channel_is_gone() {
    let app = TestApp::start().await;
    let (id, agent) = session(&app, "connecting").await;
    let token = token(&app, id, agent);
    let first = serve_as_worker(dial(&app, &token, CHANNEL_VERSION, id).await);
    until("ready", async || row(&app, id).await.0 == "ready").await;
    assert!(owned(&app, id).await);

    let mut second = dial(&app, &token, CHANNEL_VERSION, id).await;
    assert_eq!(close_of(&mut second).await, (4006, "channel_held".into()));
    assert!(!first.is_finished(), "the live channel was not disturbed");
    assert!(metric(&app, "session_mismatch").await);

    // The socket just goes (no close frame): the session waits for its worker.
    first.abort();
    until("released", async || !owned(&app, id).await).await;
    assert_eq!(row(&app, id).await, ("ready".into(), None));

    let third = serve_as_worker(dial(&app, &token, CHANNEL_VERSION, id).await);
    until("taken over", async || owned(&app, id).await).await;
    assert_eq!(row(&app, id).await, ("ready".into(), None));
    assert!(!third.is_finished(), "the re-dial is served");
}

/// Rotating `SESSION_TOKEN_KEY` (docs/OPERATIONS.md): a token signed with the key named in
/// `SESSION_TOKEN_KEY_ACCEPTED` passes the upgrade (the dial goes on to the version check,
/// refused here on purpose), where a brain without that key refuses it with 401.
#[tokio::test]
async fn a_token_of_the_accepted_key_passes_while_the_key_is_rotated() {
    const NEXT: &[u8] = b"the next session token key, 32 bytes or more";
    let rotating =
        TestApp::start_with(|c| c.workers.token_key_accepted = Some(NEXT.to_vec())).await;
    let plain = TestApp::start().await;
    for app in [&rotating, &plain] {
        let (id, agent) = session(app, "connecting").await;
        let token = TokenKeys::new(NEXT)
            .unwrap()
            .mint(id, app.team, agent, Duration::from_secs(60))
            .unwrap();
        let url = format!("{}/v1/worker/connect", app.url.replace("http://", "ws://"));
        let mut request = url.into_client_request().unwrap();
        let headers = request.headers_mut();
        headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
        headers.insert(
            CHANNEL_VERSION_HEADER,
            (CHANNEL_VERSION + 1).to_string().parse().unwrap(),
        );
        headers.insert("x-agent-session-id", id.to_string().parse().unwrap());
        let dialed = tokio_tungstenite::connect_async(request).await;
        if std::ptr::eq(app, &rotating) {
            let (mut ws, _) = dialed.expect("the accepted key's token passes the upgrade");
            assert_eq!(close_of(&mut ws).await, (4001, "channel_version".into()));
        } else {
            let err = dialed.unwrap_err();
            assert!(err.to_string().contains("401"), "{err}");
        }
    }
}

/// `GET /v1/worker/snapshot` restores only for the team and agent the token names
/// (X2): the same session's token minted under another team's or agent's claim gets
/// nothing, where its own gets the chat's snapshot.
#[tokio::test]
async fn a_token_of_another_team_restores_no_snapshot() {
    let app = TestApp::start().await;
    let other = app.store.create_team("other team").await.unwrap();
    let (id, agent) = session(&app, "connecting").await;
    let (chat,): (uuid::Uuid,) =
        sqlx::query_as("SELECT chat_id FROM agent_runtime_sessions WHERE id = $1")
            .bind(id.0)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    crate::erasure::stored_snapshot(
        &app,
        &agent.to_string(),
        &chat.to_string(),
        uuid::Uuid::new_v4(),
    )
    .await;
    let restore = |token: String| {
        let url = format!("{}{}", app.url, protocol::snapshot::SNAPSHOT_PATH);
        async move {
            reqwest::Client::new()
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(restore(token_of(id, app.team, agent)).await, 200);
    assert_eq!(restore(token_of(id, other.team_id, agent)).await, 204);
    assert_eq!(restore(token_of(id, app.team, AgentId::new())).await, 204);
}

/// A session of `team` at an idle teardown that asks for a snapshot of at most
/// `max_bytes`, as the manager leaves it: its session token.
async fn snapshot_requested(app: &TestApp, team: TeamId, key: &str, max_bytes: u64) -> String {
    let (session, agent) = session_of(app, team, key, "terminating").await;
    sqlx::query(
        "UPDATE agent_runtime_sessions SET snapshot_state = 'requested', snapshot_max_bytes = $2 \
         WHERE id = $1",
    )
    .bind(session.0)
    .bind(i64::try_from(max_bytes).unwrap())
    .execute(app.store.pool())
    .await
    .unwrap();
    token_of(session, team, agent)
}

/// `PUT /v1/worker/snapshot` of `body` (`size` bytes when known) to the brain at `url`.
async fn put_snapshot(
    url: &str,
    token: &str,
    body: reqwest::Body,
    size: Option<u64>,
) -> reqwest::Result<reqwest::Response> {
    let mut request = reqwest::Client::new()
        .put(format!("{url}{}", protocol::snapshot::SNAPSHOT_PATH))
        .bearer_auth(token)
        .header("content-type", "application/zstd")
        .header(
            protocol::snapshot::UNPACKED_BYTES_HEADER,
            size.unwrap_or(1 << 20),
        );
    if let Some(size) = size {
        request = request.header("content-length", size);
    }
    request.body(body).send().await
}

/// A body of `pieces` copies of `piece`, made as it is sent.
fn repeated(piece: Bytes, pieces: usize) -> reqwest::Body {
    reqwest::Body::wrap_stream(futures_util::stream::iter(
        (0..pieces).map(move |_| Ok::<_, std::io::Error>(piece.clone())),
    ))
}

/// The files under `dir` whose names start with `.tmp-`: writes under way.
fn temporary_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            })
            .count()
    })
}

/// A team's share of a replica's snapshot uploads: one more is refused `503 overloaded`
/// with `Retry-After` before its body is read; another team's upload goes on; an upload
/// that breaks off leaves no bytes behind and gives its place back.
#[tokio::test]
async fn snapshot_uploads_past_the_teams_share_are_refused_with_retry_after() {
    let app = TestApp::start_with(|c| c.artifacts.snapshot_uploads_per_team = 1).await;
    let other = app.store.create_team("other team").await.unwrap();
    let holding = snapshot_requested(&app, app.team, &app.key, 1 << 20).await;
    let waiting = snapshot_requested(&app, app.team, &app.key, 1 << 20).await;
    let others = snapshot_requested(&app, other.team_id, &other.api_key, 1 << 20).await;

    // The first upload sends a piece, then holds its place.
    let (pieces, received) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(1);
    pieces.send(Ok(Bytes::from(vec![1u8; 4096]))).await.unwrap();
    let body = futures_util::stream::unfold(received, |mut received| async move {
        received.recv().await.map(|piece| (piece, received))
    });
    let url = app.url.clone();
    let first = tokio::spawn(async move {
        put_snapshot(&url, &holding, reqwest::Body::wrap_stream(body), None).await
    });
    let artifacts = std::env::temp_dir()
        .join(format!("brain-test-artifacts-{}", app.db_name))
        .join(app.team.0.to_string());
    until("the first upload is being written", async || {
        temporary_files(&artifacts) == 1
    })
    .await;

    let refused = put_snapshot(
        &app.url,
        &waiting,
        repeated(Bytes::from(vec![2u8; 4096]), 1),
        Some(4096),
    )
    .await
    .unwrap();
    assert_eq!(refused.status(), 503);
    let after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&after), "{after}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");

    let another_team = put_snapshot(
        &app.url,
        &others,
        repeated(Bytes::from(vec![3u8; 4096]), 1),
        Some(4096),
    )
    .await
    .unwrap();
    assert_eq!(
        another_team.status(),
        204,
        "another team's share is its own"
    );

    // The first upload breaks off: its bytes are removed and its place is free again.
    pieces
        .send(Err(std::io::Error::other("cut")))
        .await
        .unwrap();
    let cut = first.await.unwrap();
    assert!(cut.as_ref().map_or(true, |r| r.status() != 204), "{cut:?}");
    until("the broken upload's file is gone", async || {
        temporary_files(&artifacts) == 0
    })
    .await;
    let retried = put_snapshot(
        &app.url,
        &waiting,
        repeated(Bytes::from(vec![2u8; 4096]), 1),
        Some(4096),
    )
    .await
    .unwrap();
    assert_eq!(retried.status(), 204);
    let stored: Vec<i64> = sqlx::query_scalar("SELECT size_bytes FROM workspace_snapshots")
        .fetch_all(app.store.pool())
        .await
        .unwrap();
    assert_eq!(
        stored,
        [4096, 4096],
        "the two whole uploads, and nothing of the cut one"
    );
}

/// A brain process's memory, in KiB, as `/proc/<pid>/status` reports `field` (`VmHWM`: the
/// peak resident set).
fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Six large snapshots upload to one brain process at once: each streams to the artifact
/// store as it arrives, so the process's peak memory grows by far less than the bytes in
/// flight. `SNAPSHOT_UPLOAD_MIB` sets each upload's size (40 MiB here; docs/PERFORMANCE.md
/// has the 200 MiB figure).
#[tokio::test]
async fn six_large_snapshot_uploads_at_once_stay_within_a_memory_bound() {
    let mib: u64 = std::env::var("SNAPSHOT_UPLOAD_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let app = TestApp::start().await;
    let brain = BrainProcess::start(
        &app,
        &[
            ("BRAIN_SNAPSHOT_UPLOADS", "6"),
            ("BRAIN_SNAPSHOT_UPLOADS_PER_TEAM", "6"),
        ],
    )
    .await;
    let mut tokens = Vec::new();
    for _ in 0..6 {
        tokens.push(snapshot_requested(&app, app.team, &app.key, (mib + 1) << 20).await);
    }
    let before = memory_kib(brain.pid(), "VmHWM");
    let piece = Bytes::from(vec![7u8; 1 << 20]);
    let uploads = tokens.iter().map(|token| {
        put_snapshot(
            &brain.url,
            token,
            repeated(piece.clone(), mib as usize),
            Some(mib << 20),
        )
    });
    let started = Instant::now();
    for response in futures_util::future::join_all(uploads).await {
        assert_eq!(response.unwrap().status(), 204);
    }
    let elapsed = started.elapsed();
    let peak = memory_kib(brain.pid(), "VmHWM");
    let stored: Vec<i64> = sqlx::query_scalar("SELECT size_bytes FROM workspace_snapshots")
        .fetch_all(app.store.pool())
        .await
        .unwrap();
    assert_eq!(stored, vec![i64::try_from(mib << 20).unwrap(); 6]);
    let growth_mib = peak.saturating_sub(before) / 1024;
    eprintln!(
        "six {mib} MiB snapshot uploads in {elapsed:?}: peak RSS {} MiB (from {} MiB)",
        peak / 1024,
        before / 1024
    );
    // Six large files are no test's business to leave behind.
    let _ = std::fs::remove_dir_all(
        std::env::temp_dir().join(format!("brain-test-artifacts-{}", app.db_name)),
    );
    // Holding the bodies would take 6 x mib MiB; streaming takes a buffer per upload.
    assert!(
        growth_mib < 100,
        "the brain's peak RSS grew by {growth_mib} MiB for six {mib} MiB uploads"
    );
}
