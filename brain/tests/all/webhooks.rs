//! Signed webhooks (P4) against a real receiver: a Python HTTP server that verifies each
//! delivery with the official `standardwebhooks` library (tests/webhooks/receiver.py,
//! installed by scripts/test-deps.sh). Retries with the same `webhook-id` until a 2xx,
//! delivery by another replica after a SIGKILL mid-attempt, the address rule, the secret
//! shown once, the deliveries listing, direct targets (A2A push notifications), and the
//! events of a turn's end and of a spent quota.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use engine::config::Config;
use serde_json::{Value, json};
use store::SecretsKey;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use crate::common::replies::text;
use crate::common::{BrainProcess, TestApp, error_code, read_stream};

pub(crate) const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fn webhooks_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/webhooks")
        .canonicalize()
        .expect("tests/webhooks exists")
}

/// Secrets on (webhook secrets are sealed under the key), loopback receivers allowed,
/// fast polls and retries.
fn fast(c: &mut Config) {
    c.secrets_key = Some(SecretsKey::parse(KEY_HEX).unwrap());
    c.webhooks.allow_private_networks = true;
    c.webhooks.retry_base = Duration::from_millis(100);
    c.webhooks.poll = Duration::from_millis(50);
}

/// The receiver process: its port, and its report lines.
pub(crate) struct Receiver {
    port: u16,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Receiver {
    pub(crate) async fn start(args: &[&str]) -> Self {
        let python = webhooks_dir().join(".venv/bin/python");
        assert!(
            python.exists(),
            "{} is missing: run scripts/test-deps.sh",
            python.display()
        );
        let mut child = tokio::process::Command::new(python)
            .arg(webhooks_dir().join("receiver.py"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the receiver started")
            .unwrap()
            .unwrap();
        let port = first.strip_prefix("port ").unwrap().parse().unwrap();
        Self { port, child, lines }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Hands the receiver the secret it verifies with (`-`: none).
    pub(crate) async fn verify_with(&mut self, secret: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin
            .write_all(format!("{secret}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    /// The next request's report, within `within`.
    pub(crate) async fn next(&mut self, within: Duration) -> Value {
        let line = tokio::time::timeout(within, self.lines.next_line())
            .await
            .expect("a delivery within the bound")
            .unwrap()
            .expect("the receiver is running");
        serde_json::from_str(&line).unwrap()
    }

    /// Asserts no request arrives within `quiet`.
    pub(crate) async fn none_within(&mut self, quiet: Duration) {
        if let Ok(line) = tokio::time::timeout(quiet, self.lines.next_line()).await {
            panic!("an unexpected request: {line:?}");
        }
    }
}

async fn create_webhook(app: &TestApp, url: &str, events: &[&str]) -> reqwest::Response {
    app.post_json("/v1/webhooks", &json!({"url": url, "events": events}))
        .await
}

/// Creates a webhook to `receiver` and hands it the secret: the webhook's id.
async fn subscribe(app: &TestApp, receiver: &mut Receiver, events: &[&str]) -> String {
    let created = create_webhook(app, &receiver.url(), events).await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    receiver
        .verify_with(created["secret"].as_str().unwrap())
        .await;
    created["id"].as_str().unwrap().to_owned()
}

/// One turn answered `reply` in `chat`: its id.
async fn turn(app: &TestApp, url: &str, chat: &str, reply: &str) -> String {
    app.provider.push(text(reply));
    let response = app
        .auth(app.http.post(format!("{url}/v1/chats/{chat}/messages")))
        .json(&json!({"content": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    read_stream(response).await;
    let (turn,): (uuid::Uuid,) =
        sqlx::query_as("SELECT id FROM turns WHERE chat_id = $1::uuid ORDER BY id DESC LIMIT 1")
            .bind(chat)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    turn.to_string()
}

async fn deliveries(app: &TestApp, webhook: &str, query: &str) -> Value {
    let response = app
        .get(&format!("/v1/webhooks/{webhook}/deliveries{query}"))
        .await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// Polls the listing until its newest delivery is no longer `pending`.
async fn settled_delivery(app: &TestApp, webhook: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let page = deliveries(app, webhook, "").await;
        let newest = page["deliveries"][0].clone();
        if newest["state"] != "pending" && !newest.is_null() {
            return newest;
        }
        assert!(Instant::now() < deadline, "still pending: {page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_receiver_that_fails_twice_gets_the_event_once_verified() {
    let app = TestApp::start_with(fast).await;
    let mut receiver = Receiver::start(&["--fail", "2"]).await;
    let webhook = subscribe(&app, &mut receiver, &["turn.completed"]).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let turn = turn(&app, &app.url, &chat, "done").await;

    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(receiver.next(Duration::from_secs(20)).await);
    }
    let id = seen[0]["id"].as_str().unwrap();
    assert!(id.starts_with("msg_"), "{id}");
    for (n, request) in seen.iter().enumerate() {
        assert_eq!(request["id"], id, "every retry carries the same webhook-id");
        assert_eq!(request["verified"], true, "attempt {n} verifies");
        assert_eq!(request["payload"]["type"], "turn.completed");
        assert_eq!(request["payload"]["data"]["turn_id"], turn);
        assert_eq!(request["payload"]["data"]["agent_id"], agent);
        assert_eq!(request["payload"]["data"]["chat_id"], chat);
        assert_eq!(request["payload"]["data"]["status"], "completed");
    }
    let answers: Vec<&Value> = seen.iter().map(|r| &r["answer"]).collect();
    assert_eq!(answers, [&json!(500), &json!(500), &json!(204)]);
    // Accepted once: nothing more is sent.
    receiver.none_within(Duration::from_millis(800)).await;

    let delivery = settled_delivery(&app, &webhook).await;
    assert_eq!(delivery["id"], id);
    assert_eq!(delivery["event"], "turn.completed");
    assert_eq!(delivery["state"], "delivered");
    let statuses: Vec<&Value> = delivery["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["status"])
        .collect();
    assert_eq!(statuses, [&json!(500), &json!(500), &json!(204)]);
    assert_eq!(delivery["attempts"][0]["error"], "status");
    assert!(delivery["attempts"][2]["error"].is_null());
    let metrics = app.metrics().await;
    for line in [
        "brain_webhook_attempts_total{outcome=\"status\"} 2",
        "brain_webhook_attempts_total{outcome=\"delivered\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[tokio::test]
async fn a_replica_killed_mid_delivery_leaves_it_to_another() {
    // This replica delivers nothing: the process below claims the delivery.
    let app = TestApp::start_with(|c| {
        fast(c);
        c.webhooks.max_in_flight = 0;
    })
    .await;
    let mut receiver = Receiver::start(&["--hang", "1"]).await;
    let webhook = subscribe(&app, &mut receiver, &["turn.completed"]).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let mut process = BrainProcess::start(
        &app,
        &[
            ("BRAIN_SECRETS_KEY", KEY_HEX),
            ("BRAIN_WEBHOOKS_ALLOW_PRIVATE_NETWORKS", "true"),
            ("BRAIN_WEBHOOKS_POLL_MS", "50"),
            ("BRAIN_WEBHOOKS_TIMEOUT_MS", "2000"),
        ],
    )
    .await;
    let turn = turn(&app, &process.url, &chat, "done").await;
    // The process claimed the delivery and its request is in flight, unanswered.
    let first = receiver.next(Duration::from_secs(20)).await;
    assert_eq!(first["answer"], "hang");
    assert_eq!(first["payload"]["data"]["turn_id"], turn);
    process.kill().await;
    let killed_at = Instant::now();

    // Another replica, alive, takes it once the claim lapses (timeout + margin).
    let _second = app
        .second_replica_with(|c| {
            c.webhooks.max_in_flight = 4;
        })
        .await;
    let retried = receiver.next(Duration::from_secs(20)).await;
    assert!(
        killed_at.elapsed() < Duration::from_secs(15),
        "{:?}",
        killed_at.elapsed()
    );
    assert_eq!(retried["id"], first["id"], "the same webhook-id");
    assert_eq!(retried["verified"], true);
    assert_eq!(retried["answer"], 204);
    assert_eq!(retried["payload"]["data"]["turn_id"], turn);

    let delivery = settled_delivery(&app, &webhook).await;
    assert_eq!(delivery["state"], "delivered");
    // The killed replica's attempt was never recorded: only the second one is listed.
    let attempts = delivery["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{delivery}");
    assert_eq!(attempts[0]["attempt"], 2);
    assert_eq!(attempts[0]["status"], 204);
}

#[tokio::test]
async fn private_and_metadata_urls_are_refused_with_a_stable_error() {
    let app = TestApp::start_with(|c| {
        fast(c);
        c.webhooks.allow_private_networks = false;
    })
    .await;
    for url in [
        "http://127.0.0.1:9/hook",
        "http://localhost/hook",
        "http://10.1.2.3/hook",
        "http://[::1]/hook",
    ] {
        let refused = create_webhook(&app, url, &["turn.completed"]).await;
        assert_eq!(refused.status(), 400, "{url}");
        let body: Value = refused.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_request", "{url}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("BRAIN_WEBHOOKS_ALLOW_PRIVATE_NETWORKS"),
            "{message}"
        );
    }
    for url in [
        "http://169.254.169.254/latest",
        "http://metadata.google.internal/",
    ] {
        let refused = create_webhook(&app, url, &["turn.completed"]).await;
        let body: Value = refused.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_request", "{url}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("metadata"),
            "{body}"
        );
    }
    for (url, events) in [
        ("ftp://example.com/", json!(["turn.completed"])),
        ("https://u:p@example.com/", json!(["turn.completed"])),
        ("https://example.com/", json!(["turn.started"])),
        ("https://example.com/", json!([])),
    ] {
        let response = app
            .post_json("/v1/webhooks", &json!({"url": url, "events": events}))
            .await;
        assert_eq!(
            error_code(response).await,
            (400, "invalid_request".into()),
            "{url} {events}"
        );
    }
    // Nothing was stored.
    let list: Value = app.get("/v1/webhooks").await.json().await.unwrap();
    assert_eq!(list["webhooks"], json!([]));
}

#[tokio::test]
async fn a_private_address_behind_a_name_is_refused_at_delivery() {
    // A URL allowed when it was created is judged again at every attempt: a replica that
    // does not allow private networks refuses to send to it (and records why).
    let app = TestApp::start_with(|c| {
        fast(c);
        c.webhooks.max_in_flight = 0;
    })
    .await;
    let mut receiver = Receiver::start(&[]).await;
    let webhook = subscribe(&app, &mut receiver, &["turn.completed"]).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let _strict = app
        .second_replica_with(|c| {
            c.webhooks.allow_private_networks = false;
            c.webhooks.max_in_flight = 4;
            c.webhooks.retry_base = Duration::from_secs(3600);
        })
        .await;
    turn(&app, &app.url, &chat, "done").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let attempt = loop {
        let page = deliveries(&app, &webhook, "").await;
        if let Some(attempt) = page["deliveries"][0]["attempts"].get(0) {
            break attempt.clone();
        }
        assert!(Instant::now() < deadline, "no attempt: {page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(attempt["error"], "private_address");
    assert!(attempt["status"].is_null());
    receiver.none_within(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn the_secret_is_shown_once_and_sealed_at_rest() {
    let app = TestApp::start_with(fast).await;
    let created = create_webhook(&app, "https://hooks.example.com/a", &["turn.failed"]).await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let secret = created["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    assert_eq!(created["events"], json!(["turn.failed"]));
    let id = created["id"].as_str().unwrap();

    let listed = app.get("/v1/webhooks").await.text().await.unwrap();
    assert!(
        !listed.contains(&secret[6..]),
        "the listing shows no secret"
    );
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["webhooks"][0]["id"], id);
    assert!(listed["webhooks"][0].get("secret").is_none());

    // At rest the secret is sealed: neither it nor its key bytes are in the row.
    let (sealed, url): (Vec<u8>, String) =
        sqlx::query_as("SELECT secret_sealed, url FROM webhooks WHERE id = $1::uuid")
            .bind(id)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(url, "https://hooks.example.com/a");
    let raw = secret.as_bytes();
    assert!(!sealed.windows(raw.len()).any(|w| w == raw));

    // Another team does not see it; a delete removes it.
    let other = app.store.create_team("other").await.unwrap();
    let theirs: Value = app
        .http
        .get(format!("{}/v1/webhooks", app.url))
        .bearer_auth(&other.api_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(theirs["webhooks"], json!([]));
    let stolen = app
        .http
        .delete(format!("{}/v1/webhooks/{id}", app.url))
        .bearer_auth(&other.api_key)
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(stolen).await, (404, "not_found".into()));
    let deleted = app
        .auth(app.http.delete(format!("{}/v1/webhooks/{id}", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let gone = app.get(&format!("/v1/webhooks/{id}/deliveries")).await;
    assert_eq!(error_code(gone).await, (404, "not_found".into()));
}

#[tokio::test]
async fn without_a_secrets_key_webhooks_are_not_configured() {
    let app = TestApp::start().await;
    let refused = create_webhook(&app, "https://hooks.example.com/a", &["turn.failed"]).await;
    assert_eq!(error_code(refused).await, (501, "not_configured".into()));
}

#[tokio::test]
async fn deliveries_are_listed_newest_first_in_pages() {
    let app = TestApp::start_with(fast).await;
    let mut receiver = Receiver::start(&[]).await;
    let webhook = subscribe(&app, &mut receiver, &["turn.completed"]).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let mut turns = Vec::new();
    for n in 0..3 {
        turns.push(turn(&app, &app.url, &chat, &format!("reply {n}")).await);
        let got = receiver.next(Duration::from_secs(20)).await;
        assert_eq!(got["payload"]["data"]["turn_id"], turns[n]);
    }
    settled_delivery(&app, &webhook).await;

    let first = deliveries(&app, &webhook, "?limit=2").await;
    let page: Vec<&Value> = first["deliveries"].as_array().unwrap().iter().collect();
    assert_eq!(page.len(), 2);
    assert!(page.iter().all(|d| d["state"] == "delivered"));
    let cursor = first["next_cursor"].as_str().unwrap();
    let second = deliveries(&app, &webhook, &format!("?limit=2&cursor={cursor}")).await;
    assert_eq!(second["deliveries"].as_array().unwrap().len(), 1);
    assert!(second.get("next_cursor").is_none());
    let ids: Vec<&Value> = page
        .iter()
        .copied()
        .chain(second["deliveries"].as_array().unwrap())
        .map(|d| &d["id"])
        .collect();
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(unique.len(), 3);

    for query in [
        "?limit=0",
        "?limit=201",
        "?cursor=bm90LWEtY3Vyc29y",
        "?page=2",
    ] {
        let response = app
            .get(&format!("/v1/webhooks/{webhook}/deliveries{query}"))
            .await;
        assert_eq!(
            error_code(response).await,
            (400, "invalid_request".into()),
            "{query}"
        );
    }
}

#[tokio::test]
async fn a_failed_turn_and_a_spent_quota_reach_the_webhook() {
    let app = TestApp::start_with(|c| {
        fast(c);
        c.context_tokens = 100;
        c.max_output_tokens = 50;
    })
    .await;
    let mut receiver = Receiver::start(&[]).await;
    subscribe(&app, &mut receiver, &["turn.failed", "quota.exhausted"]).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let put = app
        .auth(app.http.put(format!("{}/v1/quotas", app.url)))
        .json(&json!({"tokens_per_day": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    // The first call spends the budget; its tool call's second model call is refused:
    // the turn ends failed (quota_exhausted).
    app.provider.push(scripted_provider::Reply::ToolCalls {
        text: Some("Let me look.".into()),
        calls: vec![scripted_provider::ToolCall {
            id: "c1".into(),
            name: "memory_search".into(),
            arguments: json!({"query": "anything"}).to_string(),
        }],
        fragment: 8,
    });
    let response = app.send(&chat, &json!({"content": "search"})).await;
    read_stream(response).await;
    // The next two turns are refused at intake: one quota.exhausted event for the day.
    for _ in 0..2 {
        let refused = app.send(&chat, &json!({"content": "again"})).await;
        assert_eq!(refused.status(), 402);
    }
    let mut got = [
        receiver.next(Duration::from_secs(20)).await,
        receiver.next(Duration::from_secs(20)).await,
    ];
    got.sort_by_key(|r| r["payload"]["type"].as_str().unwrap().to_owned());
    let (exhausted, failed) = (&got[0], &got[1]);
    assert_eq!(failed["verified"], true);
    assert_eq!(failed["payload"]["type"], "turn.failed");
    assert_eq!(failed["payload"]["data"]["error_code"], "quota_exhausted");
    assert_eq!(exhausted["verified"], true);
    assert_eq!(exhausted["payload"]["type"], "quota.exhausted");
    assert_eq!(exhausted["payload"]["data"]["quota"], "tokens_per_day");
    assert_eq!(exhausted["payload"]["data"]["agent_id"], agent);
    receiver.none_within(Duration::from_millis(600)).await;
}

#[tokio::test]
async fn a_call_that_waits_for_a_person_is_an_approval_requested_event() {
    let app = TestApp::start_with(fast).await;
    let mut receiver = Receiver::start(&[]).await;
    subscribe(
        &app,
        &mut receiver,
        &["approval.requested", "turn.completed"],
    )
    .await;
    let agent = app
        .post_json(
            "/v1/agents",
            &json!({"name": "careful", "system_prompt": "You are terse.",
                    "model": "openai/gpt-test", "approval_policy": {"ask": ["write"], "deny": []}}),
        )
        .await;
    assert_eq!(agent.status(), 201);
    let agent: Value = agent.json().await.unwrap();
    let agent = agent["id"].as_str().unwrap().to_owned();
    let chat = app.new_chat(&agent).await;
    app.provider.push(scripted_provider::Reply::ToolCalls {
        text: None,
        calls: vec![scripted_provider::ToolCall {
            id: "call-1".into(),
            name: "memory_write".into(),
            arguments: json!({"content": "the user likes tea"}).to_string(),
        }],
        fragment: 16,
    });
    let response = app.send(&chat, &json!({"content": "remember it"})).await;
    read_stream(response).await;
    let listed: Value = app
        .get(&format!("/v1/chats/{chat}/approvals"))
        .await
        .json()
        .await
        .unwrap();
    let approval = listed["approvals"][0]["id"].clone();
    let mut got = [
        receiver.next(Duration::from_secs(20)).await,
        receiver.next(Duration::from_secs(20)).await,
    ];
    got.sort_by_key(|r| r["payload"]["type"].as_str().unwrap().to_owned());
    let (requested, ended) = (&got[0], &got[1]);
    assert_eq!(requested["verified"], true);
    assert_eq!(requested["payload"]["type"], "approval.requested");
    let data = &requested["payload"]["data"];
    assert_eq!(data["approval_id"], approval);
    assert_eq!(data["tool"], "memory_write");
    assert_eq!(data["agent_id"], agent);
    assert_eq!(data["chat_id"], chat);
    assert!(data.get("input").is_none(), "no tool input leaves (X4)");
    assert_eq!(ended["payload"]["type"], "turn.completed");
    assert_eq!(ended["payload"]["data"]["turn_id"], data["turn_id"]);
}

#[tokio::test]
async fn an_autostart_tick_that_cannot_start_is_an_autostart_failed_event() {
    let app = TestApp::start_with(|c| {
        fast(c);
        c.autostart.min_interval_secs = 1;
        c.autostart.poll = Duration::from_millis(50);
    })
    .await;
    let mut receiver = Receiver::start(&[]).await;
    subscribe(&app, &mut receiver, &["autostart.failed"]).await;
    let put = app
        .auth(app.http.put(format!("{}/v1/quotas", app.url)))
        .json(&json!({"turns_per_minute": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let agent = app
        .post_json(
            "/v1/agents",
            &json!({"name": "cron", "system_prompt": "You are terse.", "model": "openai/gpt-test"}),
        )
        .await;
    let agent: Value = agent.json().await.unwrap();
    let agent = agent["id"].as_str().unwrap().to_owned();
    let cadence = |cron: Value| {
        let body = if cron.is_null() {
            json!({"autostart_cron": null})
        } else {
            json!({"autostart_cron": cron, "autostart_prompt": "time to check"})
        };
        app.auth(app.http.patch(format!("{}/v1/agents/{agent}", app.url)))
            .json(&body)
            .send()
    };
    assert_eq!(cadence(json!("* * * * * *")).await.unwrap().status(), 200);
    // The first tick fires; a later one is refused by turns_per_minute.
    let failed = receiver.next(Duration::from_secs(20)).await;
    assert_eq!(cadence(Value::Null).await.unwrap().status(), 200);
    assert_eq!(failed["verified"], true);
    assert_eq!(failed["payload"]["type"], "autostart.failed");
    assert_eq!(failed["payload"]["data"]["agent_id"], agent);
    assert_eq!(failed["payload"]["data"]["error_code"], "quota_exceeded");
    let (state,): (String,) = sqlx::query_as(
        "SELECT state FROM scheduled_tasks WHERE id = (SELECT d.event_key::uuid \
         FROM webhook_deliveries d WHERE d.event = 'autostart.failed' ORDER BY seq LIMIT 1)",
    )
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(state, "failed");
    app.settled().await;
}
