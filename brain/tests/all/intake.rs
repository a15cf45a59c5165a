//! Bursts of turns are admitted, not refused (`engine/src/intake.rs`): intakes wait in a
//! bounded first-come-first-served queue in front of a small Postgres pool, past the
//! queue's bound a turn is refused `503 overloaded` with `Retry-After` having written
//! nothing, and nothing of a turn that was admitted is lost.
//!
//! To make the intakes pile up deterministically, the test locks the `messages` table
//! (`EXCLUSIVE`: reads go on, the intake's insert of the user message waits), so every
//! admitted intake holds its slot until the lock is released. Nothing else a turn does
//! before its wrap-up writes that table.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::{TestApp, read_stream};
use engine::config::Config;
use protocol::ui::{FinishReason, UiChunk};
use serde_json::json;
use store::NewAgent;
use test_support::promtool::sample;

/// The brain's pool in these tests: 3 intake slots, one connection for the rest.
const POOL: u32 = 4;
const SLOTS: usize = 3;

fn small_pool(config: &mut Config) {
    config.database_max_connections = POOL;
}

/// `n` agents with a chat each (an agent runs one turn at a time): chat ids.
async fn chats(app: &TestApp, n: usize) -> Vec<String> {
    let agent = NewAgent {
        name: "burst".into(),
        system_prompt: "You are terse.".into(),
        model: "openai/gpt-test".into(),
        fallback_models: Vec::new(),
        runtime_profile: "none".into(),
        concierge: false,
        approval_policy: Default::default(),
        disconnect_policy: Default::default(),
        auxiliary_models: Default::default(),
        stream_reasoning: false,
        memory_recall: Default::default(),
        knowledge_bases: Vec::new(),
        knowledge_recall: Default::default(),
        delegates: Vec::new(),
        skills: Vec::new(),
        egress: None,
    };
    let mut chats = Vec::new();
    for _ in 0..n {
        let agent = app
            .store
            .create_agent(app.team, &agent, &store::Actor::operator(None))
            .await
            .unwrap();
        let chat = app
            .store
            .create_chat(app.team, agent.id, None)
            .await
            .unwrap();
        chats.push(chat.id.to_string());
    }
    chats
}

/// Holds `EXCLUSIVE` on `messages` until the transaction is committed.
async fn lock_messages(app: &TestApp) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = app.store.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE messages IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

/// Posts one message per chat at once; each task reads its stream to the end:
/// (status, whether it ended with `finish` (stop) and `[DONE]`).
fn post_all(app: &TestApp, chats: &[String]) -> Vec<tokio::task::JoinHandle<(u16, bool)>> {
    chats
        .iter()
        .map(|chat| {
            let request = app
                .auth(
                    app.http
                        .post(format!("{}/v1/chats/{chat}/messages", app.url)),
                )
                .json(&json!({"content": "hello", "message_id": format!("m-{chat}")}));
            tokio::spawn(async move {
                let response = request.send().await.unwrap();
                let status = response.status().as_u16();
                if status != 200 {
                    return (status, false);
                }
                let (chunks, done) = read_stream(response).await;
                let finished = chunks.last()
                    == Some(&UiChunk::Finish {
                        finish_reason: FinishReason::Stop,
                    });
                (status, finished && done)
            })
        })
        .collect()
}

async fn metric(app: &TestApp, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(&app.metrics().await, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?}"))
}

async fn completed_turns(app: &TestApp) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM turns WHERE status = 'completed'")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    n
}

/// 300 turns posted at once on a pool of 4 connections, with the database stalled for
/// longer than the pool's 5 s acquire timeout: without the queue the intakes behind the
/// first few would time out at the pool and be refused `store_unavailable`; with it they
/// wait their turn, and every one completes. The stall also outlasts the bound on a
/// statement, so the few intakes that held a slot when it began are
/// answered `503 store_unavailable`, having written nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_the_pool_through_a_stall_is_admitted_in_full() {
    let app = TestApp::start_with(small_pool).await;
    let n = 300;
    let chats = chats(&app, n).await;
    let lock = lock_messages(&app).await;
    let stalled = Instant::now();
    let posted = post_all(&app, &chats);
    // Every intake but the slots' is queued: the burst is in.
    let queued = (n - SLOTS) as f64;
    let deadline = Instant::now() + Duration::from_secs(20);
    while sample(&app.metrics().await, "brain_intake_queued", &[]) != Some(queued) {
        assert!(Instant::now() < deadline, "the burst did not queue");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Past the pool's acquire timeout.
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(stalled.elapsed())).await;
    lock.commit().await.unwrap();
    let (mut completed, mut bounded) = (0, 0);
    for task in posted {
        match task.await.unwrap() {
            (200, ok) => {
                assert!(ok, "a stream did not end with finish and [DONE]");
                completed += 1;
            }
            (503, _) => bounded += 1,
            (other, _) => panic!("answered {other}"),
        }
    }
    assert!(
        bounded <= SLOTS,
        "only the intakes holding a slot when the stall began meet its bound: {bounded}"
    );
    assert_eq!(completed + bounded, n);
    assert_eq!(completed_turns(&app).await, completed as i64);
    assert_eq!(metric(&app, "brain_intake_queued_peak", &[]).await, queued);
    app.wait_gauge("brain_intake_queued", 0.0).await;
    for reason in ["queue_full", "wait_timeout"] {
        let refused = metric(&app, "brain_intake_refusals_total", &[("reason", reason)]).await;
        assert_eq!(refused, 0.0, "{reason}");
    }
    assert!(app.provider.violations().is_empty());
}

/// With the queue full, the next turn is refused at once with `503 overloaded` and a
/// `Retry-After`, having written nothing; the turns already queued all complete once the
/// database moves, and the refused one runs when it is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_queue_bound_a_turn_is_refused_with_retry_after_and_nothing_accepted_is_lost() {
    let bound = 20;
    let app = TestApp::start_with(|c| {
        small_pool(c);
        c.intake.queue = bound;
    })
    .await;
    let chats = chats(&app, SLOTS + bound + 1).await;
    let (accepted, refused_chat) = chats.split_at(SLOTS + bound);
    let refused_chat = &refused_chat[0];
    let lock = lock_messages(&app).await;
    let posted = post_all(&app, accepted);
    let deadline = Instant::now() + Duration::from_secs(20);
    while sample(&app.metrics().await, "brain_intake_queued", &[]) != Some(bound as f64) {
        assert!(Instant::now() < deadline, "the queue did not fill");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let message = json!({"content": "one too many", "message_id": "late"});
    let answered = Instant::now();
    let refused = app.send(refused_chat, &message).await;
    assert!(
        answered.elapsed() < Duration::from_secs(2),
        "refused at once, not after a wait"
    );
    assert_eq!(refused.status(), 503);
    let retry_after: u64 = refused
        .headers()
        .get("retry-after")
        .expect("a Retry-After")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after), "Retry-After {retry_after}");
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing was written"),
        "{body}"
    );
    assert_eq!(
        metric(
            &app,
            "brain_intake_refusals_total",
            &[("reason", "queue_full")]
        )
        .await,
        1.0
    );

    lock.commit().await.unwrap();
    for task in posted {
        assert_eq!(task.await.unwrap(), (200, true));
    }
    // Every accepted turn has its user message and its answer; the refused one left no
    // trace, so its retry runs it (once).
    assert_eq!(completed_turns(&app).await, accepted.len() as i64);
    for chat in accepted {
        let roles: Vec<_> = app
            .messages(chat)
            .await
            .iter()
            .map(|m| m["role"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(roles, ["user", "assistant"], "chat {chat}");
    }
    assert!(app.messages(refused_chat).await.is_empty());
    let retried = app.send(refused_chat, &message).await;
    assert_eq!(retried.status(), 200);
    let (chunks, done) = read_stream(retried).await;
    assert!(done);
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Stop
        })
    );
    assert_eq!(app.messages(refused_chat).await.len(), 2);
    assert_eq!(completed_turns(&app).await, accepted.len() as i64 + 1);
}

/// An intake that waits longer than `BRAIN_INTAKE_QUEUE_WAIT_MS` for a slot is refused
/// `503 overloaded` (`wait_timeout`), having written nothing; the admitted ones complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intake_that_waits_past_the_wait_bound_is_refused() {
    let app = TestApp::start_with(|c| {
        small_pool(c);
        c.intake.wait = Duration::from_millis(300);
    })
    .await;
    let chats = chats(&app, SLOTS + 1).await;
    let (admitted, late) = chats.split_at(SLOTS);
    let lock = lock_messages(&app).await;
    let posted = post_all(&app, admitted);
    // The slots are taken (their intakes wait for the lock) before the late one comes.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_locks WHERE relation = 'messages'::regclass AND NOT granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_one(app.store.pool())
        .await
        .unwrap();
        if n == SLOTS as i64 {
            break;
        }
        assert!(Instant::now() < deadline, "the slots did not fill");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let refused = app.send(&late[0], &json!({"content": "too late"})).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().get("retry-after").is_some());
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
    assert_eq!(
        metric(
            &app,
            "brain_intake_refusals_total",
            &[("reason", "wait_timeout")]
        )
        .await,
        1.0
    );
    lock.commit().await.unwrap();
    for task in posted {
        assert_eq!(task.await.unwrap(), (200, true));
    }
    assert!(app.messages(&late[0]).await.is_empty());
    assert_eq!(completed_turns(&app).await, SLOTS as i64);
}
