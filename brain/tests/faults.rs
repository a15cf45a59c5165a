//! Fault injection (issue "Hold up under real conditions", part 5): a TCP proxy between
//! the brain and Redis or Postgres cuts the link (drop and refuse) or blackholes it
//! (accept, never answer), and the brain must keep its promises: no-tool turns need no
//! Redis (T9: best effort, bounded), and a lost Postgres fails fast with a stable code
//! and heals without a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{TestApp, read_stream, streamed_text};
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::Reply;
use serde_json::{Value, json};
use test_support::proxy::{Fault, FaultProxy};

/// The hold's bound on every Redis call (`HoldConfig::default().op_timeout`).
const HOLD_BOUND: Duration = Duration::from_millis(250);
/// What a loaded two-core CI machine adds to a turn that needs nothing slow.
const SLACK: Duration = Duration::from_millis(750);

/// `host:port` of a service URL such as `redis://127.0.0.1:6379` or
/// `postgres://user:pw@127.0.0.1:5432/db`.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let rest = rest.rsplit_once('@').map(|(_, r)| r).unwrap_or(rest);
    rest.split('/').next().unwrap().to_owned()
}

/// One short no-tool turn: how long it took end to end, and its chunks.
async fn turn(app: &TestApp, chat: &str, text: &str) -> (Duration, Vec<UiChunk>) {
    app.provider.push(Reply::Text {
        deltas: vec![text.to_owned()],
        delay: Duration::ZERO,
    });
    let started = Instant::now();
    let response = app.send(chat, &json!({"content": "hi"})).await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    let (chunks, done) = read_stream(response).await;
    assert!(done);
    (started.elapsed(), chunks)
}

#[tokio::test]
async fn no_tool_turns_complete_with_redis_blackholed_or_refusing() {
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let proxy = FaultProxy::start(&host_port(&redis_url)).await;
    let app = TestApp::start_with(|c| c.redis_url = format!("redis://{}", proxy.addr())).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // A healthy turn first: the hold's connection exists when the fault starts.
    let (_, chunks) = turn(&app, &chat, "healthy").await;
    assert_eq!(streamed_text(&chunks), "healthy");

    for fault in [Fault::Blackhole, Fault::Cut] {
        proxy.set(fault);
        for i in 0..4 {
            let text = format!("{fault:?} {i}");
            let (took, chunks) = turn(&app, &chat, &text).await;
            assert_eq!(streamed_text(&chunks), text);
            assert!(chunks.contains(&UiChunk::Finish {
                finish_reason: FinishReason::Stop
            }));
            assert!(
                took < HOLD_BOUND + SLACK,
                "{fault:?}: a turn took {took:?}, more than the hold's bound allows"
            );
        }
        proxy.set(Fault::None);
        // Healed: holds work again, so a second message to a busy agent is refused.
        app.provider.push(Reply::Held {
            delta: "busy ".into(),
            every: Duration::from_millis(20),
        });
        let mut refused = false;
        for _ in 0..20 {
            let first = app.send(&chat, &json!({"content": "long"})).await;
            assert_eq!(first.status(), 200);
            let second = app.send(&chat, &json!({"content": "again"})).await;
            let status = second.status();
            app.provider.release_held();
            read_stream(first).await;
            app.settled().await;
            if status == 409 {
                refused = true;
                break;
            }
            // The hold ran unheld (the connection was being replaced): try again.
            assert_eq!(status, 200);
            read_stream(second).await;
            app.provider.push(Reply::Held {
                delta: "busy ".into(),
                every: Duration::from_millis(20),
            });
        }
        assert!(refused, "after {fault:?} healed, the hold never came back");
    }
    let statuses = app.settled().await;
    assert!(
        statuses.iter().all(|(s, _)| s == "completed"),
        "{statuses:?}"
    );
}

async fn error_code(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    (status, body["error"]["code"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_cut_postgres_fails_turns_fast_and_they_work_again_without_a_restart() {
    let upstream = host_port(&test_support::db::admin_url());
    let proxy = FaultProxy::start(&upstream).await;
    let via = proxy.addr().to_string();
    let app =
        TestApp::start_with(|c| c.database_url = c.database_url.replace(&upstream, &via)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    turn(&app, &chat, "before").await;

    proxy.set(Fault::Cut);
    let started = Instant::now();
    let refused = app.send(&chat, &json!({"content": "during"})).await;
    let took = started.elapsed();
    assert_eq!(error_code(refused).await, (503, "store_unavailable".into()));
    assert!(took < Duration::from_secs(8), "the refusal took {took:?}");

    // An outage lasts longer than a request: the pool's idle connections sit through it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.set(Fault::None);
    let (_, chunks) = turn(&app, &chat, "after").await;
    assert_eq!(streamed_text(&chunks), "after");
    let statuses = app.settled().await;
    assert_eq!(
        statuses,
        vec![
            ("completed".to_owned(), None),
            ("completed".to_owned(), None)
        ],
        "the refused turn wrote nothing"
    );
}
