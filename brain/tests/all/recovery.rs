//! Replica leases and drain (SPEC O3): a live replica's turns are left alone, and
//! SIGTERM's drain. What happens to a dead replica's turns is `takeover.rs` (D3).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::{BrainProcess, TestApp, read_stream};
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::Reply;
use serde_json::{Value, json};

/// A reply that streams until the test releases it: the turn is mid-stream for as long
/// as the test needs.
pub(crate) fn held() -> Reply {
    Reply::Held {
        delta: "still talking ".into(),
        every: Duration::from_millis(20),
    }
}

pub(crate) async fn post(app: &TestApp, base: &str, chat: &str, body: &Value) -> reqwest::Response {
    app.auth(app.http.post(format!("{base}/v1/chats/{chat}/messages")))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// Posts to `base` until the agent takes the message (not `409 agent_busy`), for at most
/// `within`; answers how long it took.
pub(crate) async fn until_taken(
    app: &TestApp,
    base: &str,
    chat: &str,
    within: Duration,
) -> (Duration, reqwest::Response) {
    let started = Instant::now();
    loop {
        let response = post(app, base, chat, &json!({"content": "are you back?"})).await;
        if response.status() != 409 {
            return (started.elapsed(), response);
        }
        assert!(
            started.elapsed() < within,
            "the agent was still busy after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn turn_row(app: &TestApp, client_id: &str) -> (String, Option<String>) {
    sqlx::query_as(
        "SELECT t.status, t.error_code FROM turns t JOIN messages m ON m.turn_id = t.id \
         WHERE m.client_message_id = $1",
    )
    .bind(client_id)
    .fetch_one(app.store.pool())
    .await
    .unwrap()
}

#[tokio::test]
async fn a_live_replicas_turns_are_left_alone() {
    let app = TestApp::start_with(|c| c.lease_ttl = Duration::from_millis(800)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let mut other = BrainProcess::start(&app, &[("BRAIN_LEASE_TTL_MS", "800")]).await;
    app.provider.push(held());
    let response = post(
        &app,
        &other.url,
        &chat,
        &json!({"content": "long", "message_id": "m-alive"}),
    )
    .await;
    assert_eq!(response.status(), 200);
    // Each replica renews, then reconciles, every quarter lease (200 ms). Once both renewed
    // more than two leases and a tick after the turn started, the survivor has reconciled
    // past the point where a lapsed lease would have been taken over.
    let started: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    crate::erasure::eventually(Duration::from_secs(10), "both replicas renew", || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT count(*) = 2 AND bool_and(lease_until >= $1 + interval '2600 milliseconds') \
             FROM replicas WHERE kind = 'brain'",
        )
        .bind(started)
        .fetch_one(app.store.pool())
        .await
        .unwrap()
    })
    .await;
    assert_eq!(turn_row(&app, "m-alive").await.0, "running");
    app.provider.release_held();
    let (chunks, done) = read_stream(response).await;
    assert!(done);
    assert!(chunks.contains(&UiChunk::Finish {
        finish_reason: FinishReason::Stop
    }));
    assert_eq!(turn_row(&app, "m-alive").await, ("completed".into(), None));
    other.kill().await;
}

#[tokio::test]
async fn sigterm_drains_readiness_first_refuses_new_turns_and_lets_running_ones_finish() {
    let app = TestApp::start_with(|c| c.drain_timeout = Duration::from_secs(20)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (_, other_chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    assert_eq!(
        app.http
            .get(format!("{}/readyz", app.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    app.provider.push(held());
    let running = app.send(&chat, &json!({"content": "long"})).await;
    assert_eq!(running.status(), 200);

    app.begin_shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let ready = app
        .http
        .get(format!("{}/readyz", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503, "readiness fails at once");
    let refused = app.send(&other_chat, &json!({"content": "new"})).await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "shutting_down");

    // The running turn is not cut: it ends when its answer does.
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.provider.release_held();
    let (chunks, done) = read_stream(running).await;
    assert!(done);
    assert!(chunks.contains(&UiChunk::Finish {
        finish_reason: FinishReason::Stop
    }));
    assert_eq!(app.settled().await, vec![("completed".to_owned(), None)]);
}
