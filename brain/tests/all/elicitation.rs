//! P5: an MCP server's question during a tool call (`elicitation/create`), answered by the
//! person in the chat. The real server is server-everything (npm, over stdio): its
//! `trigger-elicitation-request` tool asks for a form and echoes what it got back in its
//! result. The answer goes through the approvals API, on either replica; the call waits,
//! bounded by the approvals' expiry; a stopped turn answers `cancel`; another user cannot
//! answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::mcp::everything_js;
use crate::common::{PROMPTLY, TestApp, error_code, read_stream};
use engine::config::Config;
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::{Reply, ToolCall};
use serde_json::{Value, json};

const ASKS: &str = "everything_trigger-elicitation-request";
const QUESTION: &str = "Please provide inputs for the following fields:";

fn everything_stdio() -> Vec<String> {
    vec!["node".into(), everything_js(), "stdio".into()]
}

/// An app that runs stdio connectors, with `tweak` applied.
async fn app_with(tweak: impl FnOnce(&mut Config)) -> TestApp {
    TestApp::start_with(|c| {
        c.connectors.allow_stdio = true;
        tweak(c);
    })
    .await
}

/// Server-everything as the agent's connector, and the model's script: call the eliciting
/// tool, then answer "Done.".
async fn eliciting_agent(app: &TestApp, agent: &str) {
    let created = app
        .post_json(
            "/v1/connectors",
            &json!({"name": "everything", "command": everything_stdio(), "agent_id": agent}),
        )
        .await;
    assert_eq!(created.status(), 201);
    script(app);
}

fn script(app: &TestApp) {
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call_1".into(),
            name: ASKS.into(),
            arguments: "{}".into(),
        }],
        fragment: 7,
    });
    app.provider.push(Reply::Text {
        deltas: vec!["Done.".into()],
        delay: Duration::from_millis(1),
    });
}

/// Sends a message with `bearer` and reads its whole stream in a task.
fn converse(
    app: &TestApp,
    bearer: &str,
    chat: &str,
) -> tokio::task::JoinHandle<(Vec<UiChunk>, bool)> {
    let request = app
        .http
        .post(format!("{}/v1/chats/{chat}/messages", app.url))
        .bearer_auth(bearer)
        .json(&json!({"content": "ask me"}));
    tokio::spawn(async move { read_stream(request.send().await.unwrap()).await })
}

/// The chat's elicitation once it waits (as `GET /v1/chats/{id}/approvals` lists it).
async fn pending_elicitation(app: &TestApp, bearer: &str, chat: &str) -> Value {
    // The connector starts (node) and the model calls the tool first.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed: Value = app
            .http
            .get(format!("{}/v1/chats/{chat}/approvals", app.url))
            .bearer_auth(bearer)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if let Some(found) = listed["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["kind"] == "elicitation" && a["state"] == "pending")
        {
            return found.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no pending elicitation: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The id of the chat's elicitation once it waits.
async fn asked_id(app: &TestApp, bearer: &str, chat: &str) -> String {
    pending_elicitation(app, bearer, chat).await["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The stream of a turn that goes on once its question is answered.
async fn ended(turn: tokio::task::JoinHandle<(Vec<UiChunk>, bool)>) -> (Vec<UiChunk>, bool) {
    tokio::time::timeout(Duration::from_secs(60), turn)
        .await
        .expect("the turn goes on")
        .unwrap()
}

async fn answer(
    url: &str,
    app: &TestApp,
    bearer: &str,
    id: &str,
    body: Value,
) -> reqwest::Response {
    app.http
        .post(format!("{url}/v1/approvals/{id}"))
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// The tool's output as the stream carried it.
fn tool_output(chunks: &[UiChunk]) -> String {
    chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::ToolOutputAvailable {
                tool_call_id,
                output,
            } if tool_call_id == "call_1" => Some(output.to_string()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool output in {chunks:?}"))
}

/// The `state`s of the stream's `data-elicitation` parts for `id`, in order, and the index
/// of the first among all chunks.
fn form_states(chunks: &[UiChunk], id: &str) -> (Vec<String>, usize) {
    let mut states = Vec::new();
    let mut first = usize::MAX;
    for (i, chunk) in chunks.iter().enumerate() {
        if let UiChunk::DataElicitation { id: part, data } = chunk
            && part == id
        {
            assert_eq!(data.approval_id.to_string(), id);
            assert_eq!(data.tool_call_id, "call_1");
            assert_eq!(data.connector, "everything");
            assert_eq!(data.message, QUESTION);
            first = first.min(i);
            states.push(data.state.clone());
        }
    }
    (states, first)
}

fn finish(chunks: &[UiChunk]) -> Option<FinishReason> {
    chunks.iter().find_map(|c| match c {
        UiChunk::Finish { finish_reason } => Some(*finish_reason),
        _ => None,
    })
}

/// The whole path: the form reaches the stream and the listing, a bad answer is refused
/// with a stable code and changes nothing, the person's values (posted to the other
/// replica) reach the server, which echoes them, and the turn completes; a second answer
/// is refused.
#[tokio::test]
async fn an_interactive_turns_question_is_answered_in_the_chat() {
    let app = app_with(|c| {
        c.secrets_key = Some(store::SecretsKey::parse(&"ab".repeat(32)).unwrap());
        c.webhooks.allow_private_networks = true;
    })
    .await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let hook = app
        .post_json(
            "/v1/webhooks",
            &json!({"url": "http://127.0.0.1:9/hook", "events": ["approval.requested"]}),
        )
        .await;
    assert_eq!(hook.status(), 201);
    eliciting_agent(&app, &agent).await;
    let turn = converse(&app, &app.key, &chat);

    let asked = pending_elicitation(&app, &app.key, &chat).await;
    let id = asked["id"].as_str().unwrap().to_owned();
    assert_eq!(asked["tool"], ASKS);
    assert_eq!(asked["tool_call_id"], "call_1");
    assert_eq!(asked["elicitation"]["connector"], "everything");
    assert_eq!(asked["elicitation"]["message"], QUESTION);
    let form = &asked["elicitation"]["requestedSchema"];
    assert_eq!(
        form["properties"]["firstLine"]["default"],
        "It was a dark and stormy night."
    );
    assert_eq!(form["required"], json!(["name"]));
    // The team's webhook hears of it, by ids only (X4).
    let event: Value = sqlx::query_scalar(
        "SELECT payload FROM webhook_deliveries WHERE event = 'approval.requested'",
    )
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(event["data"]["approval_id"], id.as_str());
    assert_eq!(event["data"]["kind"], "elicitation");
    assert!(!event.to_string().contains(QUESTION), "{event}");

    // Answers that do not fit (a required field missing, a value out of range, a tool
    // call's answer): refused, and it still waits.
    for (body, refused) in [
        (
            json!({"action": "accept", "content": {"check": true}}),
            (422, "invalid_content"),
        ),
        (
            json!({"action": "accept", "content": {"name": "Ada", "integer": 500}}),
            (422, "invalid_content"),
        ),
        (json!({"approved": true}), (400, "invalid_request")),
    ] {
        let (status, code) =
            error_code(answer(&app.url, &app, &app.key, &id, body.clone()).await).await;
        assert_eq!((status, code.as_str()), refused, "{body}");
    }
    assert_eq!(pending_elicitation(&app, &app.key, &chat).await["id"], id);

    // The person submits the form on the other replica: the call on this one reads it.
    let other = app.second_replica().await;
    let content = json!({"name": "Ada Lovelace", "check": true, "integer": 7,
                         "firstLine": "It was a dark and stormy night.",
                         "untitledMultipleSelectEnum": ["Piano"]});
    let answered = answer(
        &other,
        &app,
        &app.key,
        &id,
        json!({"action": "accept", "content": content}),
    )
    .await;
    assert_eq!(answered.status(), 202);
    let answered: Value = answered.json().await.unwrap();
    assert_eq!(answered["approval"]["state"], "approved");
    assert_eq!(answered["approval"]["content"], content);

    let (chunks, done) = tokio::time::timeout(Duration::from_secs(30), turn)
        .await
        .expect("the turn goes on once answered")
        .unwrap();
    assert!(done);
    let output = tool_output(&chunks);
    assert!(output.contains("Name: Ada Lovelace"), "{output}");
    assert!(output.contains("Favorite Integer: 7"), "{output}");
    assert!(
        output.contains("\\\"action\\\": \\\"accept\\\""),
        "{output}"
    );
    let (states, first) = form_states(&chunks, &id);
    assert_eq!(states, ["pending", "approved"]);
    let output_at = chunks
        .iter()
        .position(|c| matches!(c, UiChunk::ToolOutputAvailable { .. }))
        .unwrap();
    assert!(first < output_at, "the form is shown while the call waits");
    assert_eq!(finish(&chunks), Some(FinishReason::Stop));

    let (status, code) =
        error_code(answer(&app.url, &app, &app.key, &id, json!({"action": "decline"})).await).await;
    assert_eq!(
        (status, code.as_str()),
        (409, "conflict"),
        "answered at most once"
    );
}

/// A decline reaches the server as a decline; the turn completes.
#[tokio::test]
async fn a_declined_question_tells_the_server() {
    let app = app_with(|_| {}).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    eliciting_agent(&app, &agent).await;
    let turn = converse(&app, &app.key, &chat);
    let id = asked_id(&app, &app.key, &chat).await;
    let (status, code) = error_code(
        answer(
            &app.url,
            &app,
            &app.key,
            &id,
            json!({"action": "decline", "content": {}}),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, code.as_str()),
        (400, "invalid_request"),
        "content goes with accept"
    );
    let answered = answer(&app.url, &app, &app.key, &id, json!({"action": "decline"})).await;
    assert_eq!(answered.status(), 202);

    let (chunks, done) = ended(turn).await;
    assert!(done);
    let output = tool_output(&chunks);
    assert!(output.contains("User declined"), "{output}");
    assert_eq!(form_states(&chunks, &id).0, ["pending", "denied"]);
    assert_eq!(finish(&chunks), Some(FinishReason::Stop));
}

/// Nobody answers: at the approvals' expiry the server reads `cancel` and the turn goes on;
/// a late answer is refused.
#[tokio::test]
async fn an_unanswered_question_expires_and_the_turn_goes_on() {
    let app = app_with(|c| c.approval_ttl = Duration::from_secs(2)).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    eliciting_agent(&app, &agent).await;
    let turn = converse(&app, &app.key, &chat);
    let id = asked_id(&app, &app.key, &chat).await;

    let (chunks, done) = tokio::time::timeout(Duration::from_secs(30), turn)
        .await
        .expect("the expiry ends the wait")
        .unwrap();
    assert!(done);
    let output = tool_output(&chunks);
    assert!(output.contains("User cancelled"), "{output}");
    assert_eq!(form_states(&chunks, &id).0, ["pending", "expired"]);
    assert_eq!(finish(&chunks), Some(FinishReason::Stop));
    let (status, code) =
        error_code(answer(&app.url, &app, &app.key, &id, json!({"action": "decline"})).await).await;
    assert_eq!((status, code.as_str()), (409, "conflict"));
}

/// A stop while the call waits: the wait ends at once (the server reads `cancel`), the
/// question is closed `cancelled`, and the turn ends `interrupted`.
#[tokio::test]
async fn a_stopped_turn_cancels_its_question() {
    let app = app_with(|_| {}).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    eliciting_agent(&app, &agent).await;
    let turn = converse(&app, &app.key, &chat);
    let id = asked_id(&app, &app.key, &chat).await;
    let stopped = app
        .auth(app.http.post(format!("{}/v1/chats/{chat}/stop", app.url)))
        .send()
        .await
        .unwrap();
    assert!(stopped.status().is_success(), "{}", stopped.status());
    let (chunks, _) = tokio::time::timeout(PROMPTLY * 4, turn)
        .await
        .expect("a stop ends the wait")
        .unwrap();
    assert_eq!(finish(&chunks), Some(FinishReason::Interrupted));
    let state: String = sqlx::query_scalar("SELECT state FROM approvals WHERE id = $1::uuid")
        .bind(&id)
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(state, "cancelled");
}

/// A background turn has no person to ask: declined at once, and the server says so.
#[tokio::test]
async fn a_background_turns_question_is_declined_at_once() {
    let app = app_with(|_| {}).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    eliciting_agent(&app, &agent).await;
    let started = Instant::now();
    let accepted = app
        .send(&chat, &json!({"content": "ask me", "background": true}))
        .await;
    assert_eq!(accepted.status(), 202);
    let accepted: Value = accepted.json().await.unwrap();
    let turn = accepted["turn_id"].as_str().unwrap().to_owned();
    loop {
        let row: Value = app
            .get(&format!("/v1/turns/{turn}"))
            .await
            .json()
            .await
            .unwrap();
        if row["status"] == "completed" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the turn did not complete: {row}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let output = app
        .messages(&chat)
        .await
        .iter()
        .flat_map(|m| m["parts"].as_array().cloned().unwrap_or_default())
        .find(|p| p["type"] == format!("tool-{ASKS}"))
        .map(|p| p["output"].to_string())
        .expect("the tool part");
    assert!(output.contains("User declined"), "{output}");
    let asked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM approvals WHERE kind = 'elicitation'")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(asked, 0, "nobody was asked");
}

/// X1: a user who may see only their own chats can neither list nor answer another user's
/// question; its owner can.
#[tokio::test]
async fn another_users_question_cannot_be_answered() {
    const ISSUER: &str = "https://issuer.test";
    const AUDIENCE: &str = "brain";
    const SECRET: &str = "elicitation-test-secret-elicitation-test";
    let jwt = engine::auth::JwtConfig::from_env(&envcfg::vars(&[
        ("BRAIN_JWT_ISSUER", ISSUER),
        ("BRAIN_JWT_AUDIENCE", AUDIENCE),
        ("BRAIN_JWT_HS256_SECRET", SECRET),
    ]))
    .unwrap();
    let app = app_with(|c| c.jwt = jwt).await;
    let token = |user: &str| {
        let now = chrono::Utc::now().timestamp();
        let claims = json!({
            "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600,
            "sub": user, "team_id": app.team.to_string(), "admin": false,
        });
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
        )
        .unwrap()
    };
    let (ada, eve) = (token("ada"), token("eve"));
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    eliciting_agent(&app, &agent).await;
    let opened: Value = app
        .http
        .post(format!("{}/v1/agents/{agent}/chats", app.url))
        .bearer_auth(&ada)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let chat = opened["id"].as_str().unwrap().to_owned();
    let turn = converse(&app, &ada, &chat);
    let id = asked_id(&app, &ada, &chat).await;

    let listed = app
        .http
        .get(format!("{}/v1/chats/{chat}/approvals", app.url))
        .bearer_auth(&eve)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 404);
    let (status, code) = error_code(
        answer(
            &app.url,
            &app,
            &eve,
            &id,
            json!({"action": "accept", "content": {"name": "Eve"}}),
        )
        .await,
    )
    .await;
    assert_eq!((status, code.as_str()), (404, "not_found"));

    let answered = answer(
        &app.url,
        &app,
        &ada,
        &id,
        json!({"action": "accept", "content": {"name": "Ada"}}),
    )
    .await;
    assert_eq!(answered.status(), 202);
    let (chunks, _) = ended(turn).await;
    let output = tool_output(&chunks);
    assert!(output.contains("Name: Ada"), "{output}");
    assert!(!output.contains("Eve"), "{output}");
}
