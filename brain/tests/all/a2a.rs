//! A2A 1.0 (P1) with the official clients: the Python SDK (PyPI `a2a-sdk`, in
//! `tests/a2a/.venv`) for the card, blocking and streamed sends, get, list, cancel and the
//! refusals; the JavaScript SDK (npm `@a2a-js/sdk`, `tests/a2a/node_modules`) for one
//! streamed send. Raw JSON-RPC where a test looks at the wire itself (the error's data).
//! Every client has generous timeouts: these machines are shared.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use crate::common::replies::{call, calls, deltas, text};
use crate::common::{TestApp, error_code};
use scripted_provider::Reply;
use serde_json::{Value, json};

fn a2a_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/a2a")
}

/// Runs `tests/a2a/client.py SCENARIO BASE BEARER ARGS...` and answers what it printed.
async fn python(base: &str, bearer: &str, scenario: &str, args: &[&str]) -> Value {
    let dir = a2a_dir();
    let python = dir.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: scripts/test-deps.sh installs a2a-sdk there",
        python.display()
    );
    let output = tokio::process::Command::new(python)
        .arg(dir.join("client.py"))
        .arg(scenario)
        .arg(base)
        .arg(bearer)
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "client.py {scenario}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "client.py {scenario} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// An agent (its system prompt is the card's description) and its A2A base URL.
async fn agent(app: &TestApp) -> (String, String) {
    agent_as(app, &app.key).await
}

/// An agent made with the admin key `key` (of any team), and its A2A base URL.
async fn agent_as(app: &TestApp, key: &str) -> (String, String) {
    let created = app
        .http
        .post(format!("{}/v1/agents", app.url))
        .bearer_auth(key)
        .json(
            &json!({"name": "helper", "system_prompt": "You answer briefly.\n\nNever guess.",
                      "model": "openai/gpt-test"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    let base = format!("{}/a2a/{id}", app.url);
    (id, base)
}

/// One JSON-RPC request as `bearer`: the HTTP status and the body.
async fn rpc(app: &TestApp, bearer: &str, base: &str, method: &str, params: Value) -> (u16, Value) {
    let response = app
        .http
        .post(base)
        .bearer_auth(bearer)
        .header("A2A-Version", "1.0")
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

fn user_message(text: &str) -> Value {
    json!({"message": {"messageId": uuid::Uuid::new_v4().to_string(), "role": "ROLE_USER",
                       "parts": [{"text": text}]}})
}

async fn chat_key(app: &TestApp) -> String {
    let created = app
        .post_json("/v1/keys", &json!({"name": "chat", "scope": "chat"}))
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    created["api_key"].as_str().unwrap().to_owned()
}

/// The text of every artifact update, in order.
fn streamed_text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e.get("artifactUpdate"))
        .flat_map(|u| u["artifact"]["parts"].as_array().unwrap().clone())
        .filter_map(|p| p["text"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn the_python_client_resolves_the_agents_card() {
    let app = TestApp::start().await;
    let (_, base) = agent(&app).await;
    let card = python(&base, &app.key, "card", &[]).await;
    assert_eq!(card["name"], "helper", "{card}");
    assert_eq!(card["description"], "You answer briefly.");
    let interface = &card["supportedInterfaces"][0];
    assert_eq!(interface["url"], base.as_str());
    assert_eq!(interface["protocolBinding"], "JSONRPC");
    assert_eq!(interface["protocolVersion"], "1.0");
    assert_eq!(card["capabilities"]["streaming"], true);
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"],
        "Bearer"
    );
    assert_eq!(card["skills"][0]["id"], "chat");
    // The card is the team's: without credentials, or for another team, there is none.
    let anonymous = app
        .http
        .get(format!("{base}/.well-known/agent-card.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(anonymous).await, (401, "unauthorized".into()));
    let other = app.store.create_team("other team").await.unwrap();
    let foreign = app
        .http
        .get(format!("{base}/.well-known/agent-card.json"))
        .bearer_auth(&other.api_key)
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(foreign).await, (404, "not_found".into()));
}

#[tokio::test]
async fn a_blocking_send_answers_the_ended_task_and_get_and_list_find_it() {
    let app = TestApp::start().await;
    let (agent_id, base) = agent(&app).await;
    app.provider.push(text("Hello from A2A."));
    let sent = python(&base, &app.key, "send", &["hi there"]).await;
    let task = &sent["events"][0]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "Hello from A2A.");
    let (task_id, context) = (
        task["id"].as_str().unwrap().to_owned(),
        task["contextId"].as_str().unwrap().to_owned(),
    );
    app.settled().await;
    // The context is a chat of the agent, written as the HTTP API writes one.
    let messages = app.messages(&context).await;
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["parts"][0]["text"], "hi there");
    let turn: Value = app
        .get(&format!("/v1/turns/{task_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(turn["agent_id"], agent_id.as_str());
    assert_eq!(turn["chat_id"], context.as_str());

    let got = python(&base, &app.key, "get", &[&task_id]).await;
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED", "{got}");
    assert_eq!(got["history"].as_array().unwrap().len(), 2);
    assert_eq!(got["history"][0]["role"], "ROLE_USER");
    assert_eq!(got["artifacts"][0]["parts"][0]["text"], "Hello from A2A.");

    // A second message in the same context continues the chat: the model sees the first.
    app.provider.push(text("Still here."));
    let again = python(&base, &app.key, "send", &["and now?", &context]).await;
    assert_eq!(again["events"][0]["task"]["contextId"], context.as_str());
    app.settled().await;
    assert_eq!(app.messages(&context).await.len(), 4);
    let second = app.provider.requests().last().unwrap().body.to_string();
    assert!(second.contains("Hello from A2A."), "{second}");

    let listed = python(&base, &app.key, "list", &[&context]).await;
    let tasks = listed["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{listed}");
    assert_eq!(listed["totalSize"], 2);
    assert_eq!(tasks[1]["id"], task_id.as_str(), "newest first");
    // Another agent of the team does not know the task.
    let (_, other_base) = agent(&app).await;
    let missing = python(&other_base, &app.key, "get", &[&task_id]).await;
    assert_eq!(missing["error"], "TaskNotFoundError", "{missing}");
}

#[tokio::test]
async fn a_streamed_send_follows_the_turn_with_the_python_client() {
    let app = TestApp::start().await;
    let (_, base) = agent(&app).await;
    app.provider.push(deltas(&["Str", "eamed ", "reply."]));
    let streamed = python(&base, &app.key, "stream", &["stream it"]).await;
    let events = streamed["events"].as_array().unwrap();
    assert_eq!(
        events[0]["task"]["status"]["state"], "TASK_STATE_WORKING",
        "{streamed}"
    );
    assert_eq!(streamed_text(events), "Streamed reply.");
    let last = events.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{streamed}"
    );
    let task_id = events[0]["task"]["id"].as_str().unwrap();
    assert_eq!(last["statusUpdate"]["taskId"], task_id);
    app.settled().await;
    let got = python(&base, &app.key, "get", &[task_id]).await;
    assert_eq!(got["artifacts"][0]["parts"][0]["text"], "Streamed reply.");
}

#[tokio::test]
async fn the_javascript_client_streams_a_send() {
    let app = TestApp::start().await;
    let (_, base) = agent(&app).await;
    app.provider.push(deltas(&["From ", "the JS ", "SDK."]));
    let dir = a2a_dir();
    assert!(
        dir.join("node_modules/@a2a-js/sdk").exists(),
        "scripts/test-deps.sh installs @a2a-js/sdk in tests/a2a"
    );
    let output = tokio::process::Command::new("node")
        .arg(dir.join("stream.mjs"))
        .arg(&base)
        .arg(&app.key)
        .arg("hello from js")
        .output()
        .await
        .expect("node must be installed (make test installs it)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(events[0]["kind"], "task", "{events:?}");
    let text: String = events
        .iter()
        .filter(|e| e["kind"] == "artifactUpdate")
        .flat_map(|e| e["value"]["artifact"]["parts"].as_array().unwrap().clone())
        .filter_map(|p| p["content"]["value"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, "From the JS SDK.");
    let last = events.last().unwrap();
    assert_eq!(last["kind"], "statusUpdate");
    // The SDK's TaskState enum: 3 is TASK_STATE_COMPLETED.
    assert_eq!(last["value"]["status"]["state"], 3, "{last}");
}

/// `returnImmediately` runs the turn in the background (D1); `SubscribeToTask` then follows
/// it from its start through the chat's events stream, whatever it already streamed.
#[tokio::test]
async fn a_background_send_is_followed_by_subscribe_from_its_start() {
    let app = TestApp::start().await;
    let (_, base) = agent(&app).await;
    // Long enough (12 s) that the client, however slow to start on a loaded machine,
    // subscribes while the turn runs; the reply is checked whole, so what streamed before
    // the subscription is replayed.
    let words: Vec<String> = (0..300).map(|i| format!("w{i} ")).collect();
    app.provider.push(Reply::Text {
        deltas: words.clone(),
        delay: Duration::from_millis(40),
    });
    let mut params = user_message("in the background");
    params["configuration"] = json!({"returnImmediately": true});
    let (status, sent) = rpc(&app, &app.key, &base, "SendMessage", params).await;
    assert_eq!(status, 200);
    let task = &sent["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_WORKING", "{sent}");
    let task_id = task["id"].as_str().unwrap().to_owned();
    let followed = python(&base, &app.key, "subscribe", &[&task_id]).await;
    let events = followed["events"].as_array().unwrap();
    assert_eq!(events[0]["task"]["id"], task_id.as_str(), "{followed}");
    assert_eq!(streamed_text(events), words.concat(), "from its start");
    assert_eq!(
        events.last().unwrap()["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{followed}"
    );
    app.settled().await;
    // An ended task has nothing to subscribe to.
    let ended = python(&base, &app.key, "subscribe", &[&task_id]).await;
    assert_eq!(ended["error"], "UnsupportedOperationError", "{ended}");
}

/// A3 on this wire: a call that waits for a person leaves the task `input-required`, as
/// `GET /v1/turns/{id}` shows it `awaiting_approval`; the approval is the HTTP API's.
#[tokio::test]
async fn a_pending_approval_is_input_required() {
    let app = TestApp::start().await;
    let created = app
        .post_json(
            "/v1/agents",
            &json!({"name": "careful", "system_prompt": "You are careful.",
                    "model": "openai/gpt-test",
                    "approval_policy": {"ask": ["write"], "deny": []}}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let base = format!("{}/a2a/{}", app.url, created["id"].as_str().unwrap());
    app.provider.push(calls(vec![call(
        "call-1",
        "memory_write",
        json!({"content": "likes tea"}),
    )]));
    let streamed = python(&base, &app.key, "stream", &["remember that I like tea"]).await;
    let events = streamed["events"].as_array().unwrap();
    assert_eq!(
        events.last().unwrap()["statusUpdate"]["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED",
        "{streamed}"
    );
    app.settled().await;
    let task_id = events[0]["task"]["id"].as_str().unwrap();
    let got = python(&base, &app.key, "get", &[task_id]).await;
    assert_eq!(got["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{got}");
    let context = events[0]["task"]["contextId"].as_str().unwrap();
    let pending: Value = app
        .get(&format!("/v1/chats/{context}/approvals"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        pending["approvals"].as_array().unwrap().len(),
        1,
        "{pending}"
    );
    let listed = python(&base, &app.key, "list", &[context]).await;
    assert_eq!(
        listed["tasks"][0]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{listed}"
    );
}

#[tokio::test]
async fn cancel_stops_the_running_task() {
    let app = TestApp::start().await;
    let (_, base) = agent(&app).await;
    app.provider.push(Reply::Text {
        // 15 s if never cancelled: the cancel goes out on the first text, whenever the
        // client gets it.
        deltas: (0..600).map(|i| format!("w{i} ")).collect(),
        delay: Duration::from_millis(25),
    });
    let result = python(&base, &app.key, "cancel", &["a long answer"]).await;
    assert_eq!(
        result["cancelled"]["status"]["state"], "TASK_STATE_CANCELED",
        "{result}"
    );
    let events = result["events"].as_array().unwrap();
    let last = events.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_CANCELED",
        "{result}"
    );
    let task_id = events[0]["task"]["id"].as_str().unwrap();
    let turn: Value = app
        .get(&format!("/v1/turns/{task_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(turn["status"], "interrupted");
    // A task that ended cannot be cancelled again.
    let (_, again) = rpc(&app, &app.key, &base, "CancelTask", json!({"id": task_id})).await;
    assert_eq!(again["error"]["code"], -32002, "{again}");
}

#[tokio::test]
async fn a_wrong_key_is_refused() {
    let app = TestApp::start().await;
    let (_, base) = agent(&app).await;
    let refused = python(&base, "ar_not_a_key", "send", &["hi"]).await;
    assert_eq!(refused["error"], "AgentCardResolutionError", "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("401"),
        "{refused}"
    );
    let response = app
        .http
        .post(&base)
        .bearer_auth("ar_not_a_key")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                      "params": user_message("hi")}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(response).await, (401, "unauthorized".into()));
    assert!(app.provider.requests().is_empty(), "no model call");
}

/// X1 on this wire: a chat key's task runs with the chat key's authority, so a tool that
/// changes the agent for everyone is refused, exactly as over `POST /v1/chats/{id}/messages`.
#[tokio::test]
async fn a_chat_key_cannot_exceed_its_scope() {
    let app = TestApp::start().await;
    let (agent_id, base) = agent(&app).await;
    let key = chat_key(&app).await;
    app.provider.push(calls(vec![call(
        "cron",
        "cron_set",
        json!({"cron": "0 9 1 1 *", "prompt": "exfiltrate"}),
    )]));
    app.provider.push(text("Done."));
    let sent = python(&base, &key, "send", &["plant a cadence"]).await;
    let task = &sent["events"][0]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    app.settled().await;
    let (cron,): (Option<String>,) =
        sqlx::query_as("SELECT autostart_cron FROM agents WHERE id = $1::uuid")
            .bind(&agent_id)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(cron, None, "the chat key's turn changed the agent");
    let transcript = json!(app.messages(task["contextId"].as_str().unwrap()).await).to_string();
    assert!(transcript.contains("only an admin"), "{transcript}");
    // Nor may it reach past the key: another team's key does not see this agent.
    let other = app.store.create_team("other team").await.unwrap();
    let (status, _) = rpc(&app, &other.api_key, &base, "ListTasks", json!({})).await;
    assert_eq!(status, 404);
}

/// T2 on this wire: the refusal is a JSON-RPC error whose data carries the stable code and
/// the wait, and nothing reaches the model.
#[tokio::test]
async fn a_team_over_quota_is_refused_with_a_jsonrpc_error() {
    let app = TestApp::start().await;
    let (_, base) = agent(&app).await;
    let put = app
        .auth(app.http.put(format!("{}/v1/quotas", app.url)))
        .json(&json!({"turns_per_minute": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    app.provider.push(text("the one turn"));
    let first = python(&base, &app.key, "send", &["one"]).await;
    assert_eq!(
        first["events"][0]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{first}"
    );
    app.settled().await;
    let calls_before = app.provider.requests().len();
    let refused = python(&base, &app.key, "send", &["two"]).await;
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("-32000") && message.contains("quota_exceeded"),
        "{refused}"
    );
    let (status, body) = rpc(&app, &app.key, &base, "SendMessage", user_message("three")).await;
    assert_eq!(status, 200, "a JSON-RPC error rides a 200: {body}");
    assert_eq!(body["id"], 7);
    assert_eq!(body["error"]["code"], -32000);
    let info = &body["error"]["data"][0];
    assert_eq!(info["@type"], "type.googleapis.com/google.rpc.ErrorInfo");
    assert_eq!(info["metadata"]["code"], "quota_exceeded");
    let wait: u64 = info["metadata"]["retryAfterSeconds"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert_eq!(app.provider.requests().len(), calls_before, "no model call");
}

/// Push configs' tokens and credentials are sealed under the secrets key (0034).
fn keyed(c: &mut engine::config::Config) {
    c.secrets_key = Some(store::SecretsKey::parse(crate::webhooks::KEY_HEX).unwrap());
}

#[tokio::test]
async fn push_configs_are_kept_per_task_and_bad_requests_get_jsonrpc_errors() {
    let app = TestApp::start_with(keyed).await;
    let (_, base) = agent(&app).await;
    app.provider.push(text("ok"));
    let sent = python(&base, &app.key, "send", &["hi"]).await;
    let task_id = sent["events"][0]["task"]["id"].as_str().unwrap().to_owned();
    let kept = python(
        &base,
        &app.key,
        "push",
        &[&task_id, "https://hooks.example.com/a2a"],
    )
    .await;
    assert_eq!(
        kept["created"]["url"], "https://hooks.example.com/a2a",
        "{kept}"
    );
    assert_eq!(kept["created"]["taskId"], task_id.as_str());
    assert_eq!(kept["listed"]["configs"].as_array().unwrap().len(), 1);
    let config_id = kept["created"]["id"].as_str().unwrap();
    let (_, got) = rpc(
        &app,
        &app.key,
        &base,
        "GetTaskPushNotificationConfig",
        json!({"taskId": task_id, "id": config_id}),
    )
    .await;
    assert_eq!(
        got["result"]["url"], "https://hooks.example.com/a2a",
        "{got}"
    );
    assert!(
        got["result"].get("token").is_none(),
        "never shown again: {got}"
    );
    assert!(kept["created"].get("token").is_none(), "{kept}");
    let (_, deleted) = rpc(
        &app,
        &app.key,
        &base,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": task_id, "id": config_id}),
    )
    .await;
    assert!(deleted.get("result").is_some(), "{deleted}");
    let (_, bad_url) = rpc(
        &app,
        &app.key,
        &base,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task_id, "url": "file:///etc/passwd"}),
    )
    .await;
    assert_eq!(bad_url["error"]["code"], -32602, "{bad_url}");

    let (_, unknown) = rpc(&app, &app.key, &base, "message/send", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    let not_json = app
        .http
        .post(&base)
        .bearer_auth(&app.key)
        .body("{")
        .send()
        .await
        .unwrap();
    let not_json: Value = not_json.json().await.unwrap();
    assert_eq!(not_json["error"]["code"], -32700);
    let old = app
        .http
        .post(&base)
        .bearer_auth(&app.key)
        .header("A2A-Version", "0.3")
        .json(&json!({"jsonrpc": "2.0", "id": "x", "method": "GetTask", "params": {"id": task_id}}))
        .send()
        .await
        .unwrap();
    let old: Value = old.json().await.unwrap();
    assert_eq!(old["error"]["code"], -32009, "{old}");
    let (_, file) = rpc(
        &app,
        &app.key,
        &base,
        "SendMessage",
        json!({"message": {"messageId": "m", "role": "ROLE_USER",
                           "parts": [{"url": "https://example.com/x.pdf"}]}}),
    )
    .await;
    assert_eq!(file["error"]["code"], -32005, "{file}");
}

/// A secrets key, loopback receivers allowed and quick polls: push notifications go
/// through the webhooks outbox (P4), unsigned, their credentials sealed under the key.
fn pushes(c: &mut engine::config::Config) {
    keyed(c);
    c.webhooks.allow_private_networks = true;
    c.webhooks.poll = Duration::from_millis(50);
    c.webhooks.retry_base = Duration::from_millis(100);
}

/// A background `SendMessage` that carries a push config for its task.
fn sent_with_push(text: &str, config: Value) -> Value {
    let mut params = user_message(text);
    params["configuration"] = json!({"returnImmediately": true,
                                     "taskPushNotificationConfig": config});
    params
}

#[tokio::test]
async fn each_push_config_hears_the_tasks_end_once_with_its_credentials() {
    let app = TestApp::start_with(pushes).await;
    let (_, base) = agent(&app).await;
    let mut receiver = crate::webhooks::Receiver::start(&[]).await;
    receiver.verify_with("-").await;
    app.provider.push(text("Done in the background."));
    let config = json!({"url": receiver.url(), "token": "tok-1",
                        "authentication": {"scheme": "Bearer", "credentials": "cred-1"}});
    let (status, sent) = rpc(
        &app,
        &app.key,
        &base,
        "SendMessage",
        sent_with_push("work on it", config),
    )
    .await;
    assert_eq!(status, 200, "{sent}");
    let task = sent["result"]["task"]["id"].as_str().unwrap().to_owned();
    let context = sent["result"]["task"]["contextId"].as_str().unwrap();

    let got = receiver.next(Duration::from_secs(30)).await;
    let update = &got["payload"]["statusUpdate"];
    assert_eq!(update["status"]["state"], "TASK_STATE_COMPLETED", "{got}");
    assert_eq!(update["taskId"], task.as_str());
    assert_eq!(update["contextId"], context);
    assert_eq!(got["token"], "tok-1");
    assert_eq!(got["authorization"], "Bearer cred-1");
    assert_eq!(got["signed"], false);
    assert!(
        !got["payload"].to_string().contains("background"),
        "a push carries ids and state, never the reply: {got}"
    );
    // At rest the token and the credentials are sealed: the row holds neither.
    let rows: Vec<String> =
        sqlx::query_scalar("SELECT p::text FROM a2a_push_configs p WHERE turn_id = $1::uuid")
            .bind(&task)
            .fetch_all(app.store.pool())
            .await
            .unwrap();
    assert_eq!(rows.len(), 1);
    for secret in ["tok-1", "cred-1", &hex("tok-1"), &hex("cred-1")] {
        assert!(!rows[0].contains(secret), "{secret} is stored as it came");
    }
    assert!(
        rows[0].contains("Bearer"),
        "the scheme is no secret: {}",
        rows[0]
    );

    // A config kept after the end hears the state it ended in, once; keeping it again
    // (the same id) is not a second notification.
    let late = json!({"taskId": task, "id": "late", "url": receiver.url(), "token": "tok-2"});
    let (_, kept) = rpc(
        &app,
        &app.key,
        &base,
        "CreateTaskPushNotificationConfig",
        late.clone(),
    )
    .await;
    assert_eq!(kept["result"]["id"], "late", "{kept}");
    let got = receiver.next(Duration::from_secs(30)).await;
    assert_eq!(got["token"], "tok-2", "{got}");
    assert_eq!(
        got["payload"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    let (_, again) = rpc(
        &app,
        &app.key,
        &base,
        "CreateTaskPushNotificationConfig",
        late,
    )
    .await;
    assert_eq!(again["result"]["id"], "late", "{again}");
    receiver.none_within(Duration::from_millis(800)).await;
}

#[tokio::test]
async fn a_task_that_waits_for_a_person_is_pushed_as_input_required() {
    let app = TestApp::start_with(pushes).await;
    let created = app
        .post_json(
            "/v1/agents",
            &json!({"name": "careful", "system_prompt": "You are careful.",
                    "model": "openai/gpt-test",
                    "approval_policy": {"ask": ["write"], "deny": []}}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let base = format!("{}/a2a/{}", app.url, created["id"].as_str().unwrap());
    let mut receiver = crate::webhooks::Receiver::start(&[]).await;
    receiver.verify_with("-").await;
    app.provider.push(calls(vec![call(
        "call-1",
        "memory_write",
        json!({"content": "likes tea"}),
    )]));
    let (_, sent) = rpc(
        &app,
        &app.key,
        &base,
        "SendMessage",
        sent_with_push("remember that I like tea", json!({"url": receiver.url()})),
    )
    .await;
    let task = sent["result"]["task"]["id"].as_str().unwrap().to_owned();
    let got = receiver.next(Duration::from_secs(30)).await;
    let update = &got["payload"]["statusUpdate"];
    assert_eq!(update["taskId"], task.as_str(), "{got}");
    assert_eq!(
        update["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{got}"
    );
    assert_eq!(got["token"], Value::Null);
    assert_eq!(got["authorization"], Value::Null);
}

/// `value`'s bytes as Postgres prints a `bytea`'s.
fn hex(value: &str) -> String {
    value.bytes().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn a_sealed_credential_opens_only_in_its_own_config() {
    // This replica delivers nothing: the pushes wait for the one started below.
    let app = TestApp::start_with(|c| {
        pushes(c);
        c.webhooks.max_in_flight = 0;
    })
    .await;
    let (_, base) = agent(&app).await;
    let mut receiver = crate::webhooks::Receiver::start(&[]).await;
    receiver.verify_with("-").await;
    let task = ended_task(&app, &app.key, &base).await;
    for (id, token) in [("a", "tok-a"), ("b", "tok-b")] {
        let config = json!({"id": id, "url": receiver.url(), "token": token});
        let kept = keep_config(&app, &app.key, &base, &task, config).await;
        assert_eq!(kept["result"]["id"], id, "{kept}");
    }
    // `b` given `a`'s sealed token: bound to `a`, it does not open as `b`'s.
    sqlx::query(
        "UPDATE a2a_push_configs b SET token_nonce = a.token_nonce, \
           token_sealed = a.token_sealed \
         FROM a2a_push_configs a \
         WHERE a.turn_id = $1::uuid AND a.id = 'a' AND b.turn_id = a.turn_id AND b.id = 'b'",
    )
    .bind(&task)
    .execute(app.store.pool())
    .await
    .unwrap();
    let _delivering = app
        .second_replica_with(|c| c.webhooks.max_in_flight = 4)
        .await;
    let got = receiver.next(Duration::from_secs(30)).await;
    assert_eq!(got["token"], "tok-a", "{got}");
    receiver.none_within(Duration::from_millis(800)).await;
    let given_up: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT d.state, a.error FROM webhook_deliveries d \
         JOIN webhook_attempts a ON a.delivery_id = d.id WHERE d.push_config = 'b'",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    assert_eq!(
        given_up,
        [("failed".to_owned(), Some("unreadable_secret".to_owned()))]
    );
}

#[tokio::test]
async fn without_a_secrets_key_push_configs_are_refused_and_the_card_says_so() {
    let app = TestApp::start_with(|c| c.webhooks.allow_private_networks = true).await;
    let (_, base) = agent(&app).await;
    let card: Value = app
        .http
        .get(format!("{base}/.well-known/agent-card.json"))
        .bearer_auth(&app.key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(card["capabilities"]["pushNotifications"], false, "{card}");

    // A message that asks for pushes is refused before its turn starts.
    let config = json!({"url": "https://hooks.example.com/a2a", "token": "tok"});
    let (status, refused) = rpc(
        &app,
        &app.key,
        &base,
        "SendMessage",
        sent_with_push("work on it", config),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(refused["error"]["code"], -32003, "{refused}");
    assert_eq!(
        refused["error"]["data"][0]["metadata"]["code"], "not_configured",
        "{refused}"
    );
    assert!(app.provider.requests().is_empty(), "no turn ran");

    app.provider.push(text("ok"));
    let (_, sent) = rpc(&app, &app.key, &base, "SendMessage", user_message("hi")).await;
    let task = sent["result"]["task"]["id"].as_str().unwrap().to_owned();
    let config = json!({"taskId": task, "url": "https://hooks.example.com/a2a"});
    let (_, refused) = rpc(
        &app,
        &app.key,
        &base,
        "CreateTaskPushNotificationConfig",
        config,
    )
    .await;
    assert_eq!(refused["error"]["code"], -32003, "{refused}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM a2a_push_configs")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

/// A task of `base`'s agent that has ended, sent as `key`: its id.
async fn ended_task(app: &TestApp, key: &str, base: &str) -> String {
    app.provider.push(text("ok"));
    let (_, sent) = rpc(app, key, base, "SendMessage", user_message("hi")).await;
    sent["result"]["task"]["id"].as_str().unwrap().to_owned()
}

/// Keeps config `id` of `task` toward `url`, as `key`: the JSON-RPC answer.
async fn keep_config(app: &TestApp, key: &str, base: &str, task: &str, config: Value) -> Value {
    let mut config = config;
    config["taskId"] = json!(task);
    rpc(app, key, base, "CreateTaskPushNotificationConfig", config)
        .await
        .1
}

#[tokio::test]
async fn a_teams_silent_receiver_does_not_delay_another_teams_push() {
    // Four slots, two a team; an attempt may take 30 s.
    let app = TestApp::start_with(|c| {
        pushes(c);
        c.webhooks.max_in_flight = 4;
        c.webhooks.max_in_flight_per_team = 2;
        c.webhooks.timeout = Duration::from_secs(30);
    })
    .await;
    let (_, base) = agent(&app).await;
    let mut silent = crate::webhooks::Receiver::start(&["--hang", "1000"]).await;
    silent.verify_with("-").await;
    let task = ended_task(&app, &app.key, &base).await;
    // Ten configs of an ended task: ten pushes due at once toward a receiver that holds
    // every request open and never answers.
    for n in 0..10 {
        let config = json!({"id": format!("c{n}"), "url": silent.url()});
        let kept = keep_config(&app, &app.key, &base, &task, config).await;
        assert!(kept.get("result").is_some(), "{kept}");
    }
    silent.next(Duration::from_secs(30)).await;

    let other = app.store.create_team("other").await.unwrap();
    let (_, other_base) = agent_as(&app, &other.api_key).await;
    let mut heard = crate::webhooks::Receiver::start(&[]).await;
    heard.verify_with("-").await;
    let other_task = ended_task(&app, &other.api_key, &other_base).await;
    let config = json!({"url": heard.url(), "token": "theirs"});
    let kept = keep_config(&app, &other.api_key, &other_base, &other_task, config).await;
    assert!(kept.get("result").is_some(), "{kept}");

    let got = heard.next(Duration::from_secs(120)).await;
    assert_eq!(got["token"], "theirs", "{got}");
    assert_eq!(
        got["payload"]["statusUpdate"]["taskId"],
        other_task.as_str()
    );
    // It came while the silent receiver still held the first team's attempts: not one of
    // them had ended (timed out and been recorded) yet.
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM webhook_attempts a \
         JOIN webhook_deliveries d ON d.id = a.delivery_id WHERE d.team_id = $1",
    )
    .bind(app.team.0)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(
        ended, 0,
        "the other team's push waited for the silent receiver's attempts to end"
    );
}

#[tokio::test]
async fn a_teams_pending_pushes_are_bounded_and_none_accepted_is_lost() {
    // This replica delivers nothing: every push kept stays pending until another does.
    let app = TestApp::start_with(|c| {
        pushes(c);
        c.webhooks.max_in_flight = 0;
        c.webhooks.max_pending_pushes_per_team = 3;
    })
    .await;
    let (_, base) = agent(&app).await;
    let mut receiver = crate::webhooks::Receiver::start(&[]).await;
    receiver.verify_with("-").await;
    let task = ended_task(&app, &app.key, &base).await;
    let url = receiver.url();
    let config = |n: usize| json!({"id": format!("c{n}"), "url": url, "token": format!("tok-{n}")});
    for n in 0..3 {
        let kept = keep_config(&app, &app.key, &base, &task, config(n)).await;
        assert!(kept.get("result").is_some(), "{kept}");
    }
    let refused = keep_config(&app, &app.key, &base, &task, config(3)).await;
    assert_eq!(refused["error"]["code"], -32000, "{refused}");
    let details = &refused["error"]["data"][0]["metadata"];
    assert_eq!(details["code"], "push_backlog_full", "{refused}");
    assert!(details["retryAfterSeconds"].is_string(), "{refused}");
    // Keeping a kept config again adds no push.
    let again = keep_config(&app, &app.key, &base, &task, config(0)).await;
    assert!(again.get("result").is_some(), "{again}");
    // A message that asks for pushes is refused before its turn starts.
    let model_calls = app.provider.requests().len();
    let (_, sent) = rpc(
        &app,
        &app.key,
        &base,
        "SendMessage",
        sent_with_push("more", json!({"url": receiver.url()})),
    )
    .await;
    assert_eq!(
        sent["error"]["data"][0]["metadata"]["code"], "push_backlog_full",
        "{sent}"
    );
    assert_eq!(app.provider.requests().len(), model_calls, "no turn ran");

    // A replica that delivers sends every push accepted, once.
    let _delivering = app
        .second_replica_with(|c| c.webhooks.max_in_flight = 4)
        .await;
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let got = receiver.next(Duration::from_secs(30)).await;
        tokens.push(got["token"].as_str().unwrap().to_owned());
    }
    tokens.sort();
    assert_eq!(tokens, ["tok-0", "tok-1", "tok-2"]);
    receiver.none_within(Duration::from_millis(800)).await;
    // Taken by its receiver, the backlog has room again.
    let kept = keep_config(&app, &app.key, &base, &task, config(3)).await;
    assert!(kept.get("result").is_some(), "{kept}");
    assert_eq!(
        receiver.next(Duration::from_secs(30)).await["token"],
        "tok-3"
    );
}

#[tokio::test]
async fn push_credentials_are_sealed_and_never_shown_again() {
    let app = TestApp::start_with(keyed).await;
    let (_, base) = agent(&app).await;
    let task = ended_task(&app, &app.key, &base).await;
    let config = json!({"id": "mine", "url": "https://hooks.example.com/a2a",
                        "token": "tok-secret",
                        "authentication": {"scheme": "Bearer", "credentials": "cred-secret"}});
    let created = keep_config(&app, &app.key, &base, &task, config).await;
    let got = rpc(
        &app,
        &app.key,
        &base,
        "GetTaskPushNotificationConfig",
        json!({"taskId": task, "id": "mine"}),
    )
    .await
    .1;
    let listed = rpc(
        &app,
        &app.key,
        &base,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": task}),
    )
    .await
    .1;
    for (what, answer, shown) in [
        ("create", &created, &created["result"]),
        ("get", &got, &got["result"]),
        ("list", &listed, &listed["result"]["configs"][0]),
    ] {
        assert_eq!(shown["id"], "mine", "{what}: {answer}");
        assert_eq!(
            shown["authentication"]["scheme"], "Bearer",
            "{what}: {answer}"
        );
        let text = answer.to_string();
        assert!(
            !text.contains("tok-secret") && !text.contains("cred-secret"),
            "{what} shows a secret: {text}"
        );
    }
    let row: String =
        sqlx::query_scalar("SELECT p::text FROM a2a_push_configs p WHERE id = 'mine'")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    for secret in [
        "tok-secret",
        "cred-secret",
        &hex("tok-secret"),
        &hex("cred-secret"),
    ] {
        assert!(!row.contains(secret), "{secret} is stored as it came");
    }
}
