//! Fault injection, the brain held up under real conditions: a TCP proxy between
//! the brain and Redis or Postgres cuts the link (drop and refuse) or blackholes it
//! (accept, never answer), and the brain must keep its promises: no-tool turns need no
//! Redis (T9: best effort, bounded), and a lost Postgres fails fast with a stable code
//! and heals without a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::{Duration, Instant};

use crate::common::error_code;
use crate::common::{TestApp, read_stream, streamed_text};
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
pub(crate) fn host_port(url: &str) -> String {
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

/// The request's bound on a store call (`store::CALL_BOUND`), with the slack a
/// loaded CI machine adds.
const STORE_BOUND: Duration = Duration::from_secs(5);

/// A Postgres that takes statements and does not answer them (here its
/// tables locked by another session, so every statement on them waits) costs a request
/// its bound, not forever: posting a message, reading the transcript, opening a chat and
/// creating a key each answer `503 store_unavailable` within it, and a posted message
/// gives its intake slot and its agent's hold back.
#[tokio::test]
async fn statements_that_never_answer_fail_within_the_bound_and_free_their_slots() {
    // Three intake slots and no queue: an intake that finds no free slot is refused
    // `overloaded` at once, so a slot kept by a failed intake shows.
    let app = TestApp::start_with(|c| {
        c.database_max_connections = 4;
        c.intake.queue = 0;
    })
    .await;
    let mut chats = Vec::new();
    for _ in 0..3 {
        chats.push(app.agent_and_chat("openai/gpt-test", &[]).await);
    }
    for (_, chat) in &chats {
        turn(&app, chat, "before").await;
    }
    let client = reqwest::Client::builder()
        .timeout(STORE_BOUND * 3)
        .build()
        .unwrap();
    let request = |method: reqwest::Method, path: String, body: Value| {
        let mut req = client
            .request(method, format!("{}{path}", app.url))
            .bearer_auth(&app.key);
        if !body.is_null() {
            req = req.json(&body);
        }
        async move {
            let started = Instant::now();
            let response = req.send().await;
            let took = started.elapsed();
            let response = response.unwrap_or_else(|e| panic!("{path}: no answer ({e})"));
            (path, error_code(response).await, took)
        }
    };
    let all_unavailable = async |round: &str, calls| {
        let answers: Vec<(String, (u16, String), Duration)> =
            futures_util::future::join_all(calls).await;
        for (path, answer, took) in answers {
            assert_eq!(answer, (503, "store_unavailable".into()), "{round}: {path}");
            assert!(
                took < STORE_BOUND + SLACK,
                "{round}: {path} took {took:?}, more than the bound"
            );
        }
    };

    // Reads of chats and key lookups go on; what writes a message, a chat or a key, or
    // reads messages, waits for the lock.
    let mut locker = app.store.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *locker)
        .await
        .unwrap();
    sqlx::query("LOCK TABLE chats, api_keys IN SHARE MODE")
        .execute(&mut *locker)
        .await
        .unwrap();
    for round in ["every slot taken", "every slot given back"] {
        let posts = chats.iter().map(|(_, chat)| {
            request(
                reqwest::Method::POST,
                format!("/v1/chats/{chat}/messages"),
                json!({"content": "during"}),
            )
        });
        all_unavailable(round, posts.collect::<Vec<_>>()).await;
    }
    let others = vec![
        request(
            reqwest::Method::GET,
            format!("/v1/chats/{}/messages", chats[0].1),
            Value::Null,
        ),
        request(
            reqwest::Method::POST,
            format!("/v1/agents/{}/chats", chats[0].0),
            json!({}),
        ),
        request(
            reqwest::Method::POST,
            "/v1/keys".into(),
            json!({"name": "during", "scope": "chat"}),
        ),
    ];
    all_unavailable("reads and other writes", others).await;
    locker.rollback().await.unwrap();

    // Nothing was written, and every agent takes a turn again.
    for (_, chat) in &chats {
        app.provider.push(Reply::Text {
            deltas: vec!["after".into()],
            delay: Duration::ZERO,
        });
        let mut status = 0;
        for _ in 0..20 {
            let response = app.send(chat, &json!({"content": "after"})).await;
            status = response.status().as_u16();
            if status == 200 {
                read_stream(response).await;
                break;
            }
            // The failed intake's hold is released in the background.
            assert_eq!(status, 409);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(status, 200);
        assert_eq!(app.messages(chat).await.len(), 4);
    }
    let statuses = app.settled().await;
    assert_eq!(statuses.len(), 6, "{statuses:?}");
    assert!(
        statuses.iter().all(|(s, _)| s == "completed"),
        "{statuses:?}"
    );
}

/// The pool's connections carry the statement timeout: Postgres itself cancels a
/// statement past it.
#[tokio::test]
async fn postgres_cancels_a_statement_of_the_pool_past_its_timeout() {
    let (_, db) = common::fresh_store().await;
    let store = store::Store::connect_with(
        &test_support::db::db_url(&db),
        1,
        Duration::from_millis(300),
    )
    .await
    .unwrap();
    let (timeout,): (String,) = sqlx::query_as("SHOW statement_timeout")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(timeout, "300ms");
    let started = Instant::now();
    let err = sqlx::query("SELECT pg_sleep(5)")
        .execute(store.pool())
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    let code = err
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("57014"), "{err}");
}
