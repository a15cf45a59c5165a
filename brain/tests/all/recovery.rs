//! Crash reconciliation and drain (SPEC O3): replica leases, turns of a dead replica
//! ended `interrupted` (`replica_lost`) with their holds freed, and SIGTERM's drain.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::{BrainProcess, TestApp, read_stream};
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::Reply;
use serde_json::{Value, json};

/// A reply that streams until the test releases it: the turn is mid-stream for as long
/// as the test needs.
fn held() -> Reply {
    Reply::Held {
        delta: "still talking ".into(),
        every: Duration::from_millis(20),
    }
}

async fn post(app: &TestApp, base: &str, chat: &str, body: &Value) -> reqwest::Response {
    app.auth(app.http.post(format!("{base}/v1/chats/{chat}/messages")))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// Posts to `base` until the agent takes the message (not `409 agent_busy`), for at most
/// `within`; answers how long it took.
async fn until_taken(
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

async fn turn_row(app: &TestApp, client_id: &str) -> (String, Option<String>) {
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
async fn a_brain_killed_mid_turn_and_restarted_frees_its_agent_within_30_seconds() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // The in-process brain only hosts the database and the provider from here on; it must
    // not reconcile, so that the restarted process is shown to do it on its own.
    app.begin_shutdown();
    let mut brain = BrainProcess::start(&app, &[]).await;
    app.provider.push(held());
    let response = post(
        &app,
        &brain.url,
        &chat,
        &json!({"content": "a long answer please", "message_id": "m-killed"}),
    )
    .await;
    assert_eq!(response.status(), 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    brain.kill().await;
    drop(response);
    assert_eq!(turn_row(&app, "m-killed").await.0, "running");

    let mut restarted = BrainProcess::start(&app, &[]).await;
    let busy = post(&app, &restarted.url, &chat, &json!({"content": "hello?"})).await;
    assert_eq!(
        busy.status(),
        409,
        "the dead turn's hold still stands at first"
    );
    app.provider.push(Reply::Text {
        deltas: vec!["I am back.".into()],
        delay: Duration::ZERO,
    });
    let (waited, taken) = until_taken(&app, &restarted.url, &chat, Duration::from_secs(30)).await;
    assert_eq!(taken.status(), 200, "after {waited:?}");
    let (chunks, done) = read_stream(taken).await;
    assert!(done);
    assert!(chunks.contains(&UiChunk::Finish {
        finish_reason: FinishReason::Stop
    }));
    assert_eq!(
        turn_row(&app, "m-killed").await,
        ("interrupted".into(), Some("replica_lost".into()))
    );

    // The transcript is readable, and a retry of the lost turn's message id replays its
    // end state instead of `409 turn_in_progress`.
    let transcript = app
        .auth(
            app.http
                .get(format!("{}/v1/chats/{chat}/messages", restarted.url)),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(transcript.status(), 200);
    let body: Value = transcript.json().await.unwrap();
    let texts: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(texts, ["a long answer please", "are you back?"]);
    let retry = post(
        &app,
        &restarted.url,
        &chat,
        &json!({"content": "a long answer please", "message_id": "m-killed"}),
    )
    .await;
    assert_eq!(retry.status(), 200);
    let (chunks, _) = read_stream(retry).await;
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Interrupted
        })
    );
    restarted.kill().await;
}

#[tokio::test]
async fn a_surviving_replica_reconciles_a_dead_replicas_turns_without_a_restart() {
    // The survivor ticks every quarter of its lease; the victim's short lease lapses fast.
    let app = TestApp::start_with(|c| c.lease_ttl = Duration::from_millis(800)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let mut victim = BrainProcess::start(&app, &[("BRAIN_LEASE_TTL_MS", "800")]).await;
    app.provider.push(held());
    let response = post(
        &app,
        &victim.url,
        &chat,
        &json!({"content": "long", "message_id": "m-victim"}),
    )
    .await;
    assert_eq!(response.status(), 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    victim.kill().await;
    drop(response);

    app.provider.push(Reply::Text {
        deltas: vec!["Here.".into()],
        delay: Duration::ZERO,
    });
    let (waited, taken) = until_taken(&app, &app.url, &chat, Duration::from_secs(5)).await;
    assert_eq!(taken.status(), 200, "after {waited:?}");
    read_stream(taken).await;
    assert_eq!(
        turn_row(&app, "m-victim").await,
        ("interrupted".into(), Some("replica_lost".into()))
    );
    let reconciled = app.metrics().await;
    assert!(
        reconciled.contains("brain_turns_reconciled_total 1"),
        "{reconciled}"
    );
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
    // Several of both replicas' ticks.
    tokio::time::sleep(Duration::from_millis(2000)).await;
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
