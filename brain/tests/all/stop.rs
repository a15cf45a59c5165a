//! Stop (SPEC T8): `POST /v1/turns/{id}/stop` and `POST /v1/chats/{id}/stop` from any
//! client on any replica cancel the turn exactly as a hang-up does, against real Postgres
//! and Redis (two brain replicas over them); only the model is scripted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::{TestApp, parse_events, read_stream, streamed_text};
use futures_util::StreamExt;
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::Reply;
use serde_json::{Value, json};
use test_support::proxy::{Fault, FaultProxy};

fn long_answer() -> Reply {
    Reply::Text {
        deltas: (0..200).map(|i| format!("w{i} ")).collect(),
        delay: Duration::from_millis(20),
    }
}

async fn post(app: &TestApp, base: &str, key: &str, path: &str) -> (u16, Value) {
    let response = app
        .http
        .post(format!("{base}{path}"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Reads the stream until `mark` was streamed: the turn's id and what was read so far.
async fn read_until(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    mark: &str,
) -> (String, String) {
    let mut seen = String::new();
    while !seen.contains(mark) {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    let events: String = seen
        .split_inclusive("\n\n")
        .filter(|e| e.ends_with("\n\n"))
        .collect();
    let (chunks, _) = parse_events(&events);
    let turn = chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::DataTurn { data, .. } => Some(data.turn_id.to_string()),
            _ => None,
        })
        .expect("the stream names its turn");
    (turn, seen)
}

/// Reads the rest of a stream: its chunks and whether `[DONE]` ended it.
async fn read_rest(
    mut body: impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
    mut seen: String,
) -> (Vec<UiChunk>, bool) {
    while let Some(piece) = body.next().await {
        seen.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
    }
    parse_events(&seen)
}

fn finish_reason(chunks: &[UiChunk]) -> Option<FinishReason> {
    chunks.iter().rev().find_map(|c| match c {
        UiChunk::Finish { finish_reason } => Some(*finish_reason),
        _ => None,
    })
}

#[tokio::test]
async fn a_turn_on_one_replica_is_stopped_from_another_within_milliseconds() {
    let app = TestApp::start().await;
    let other = app.second_replica().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(long_answer());
    let response = app
        .send(&chat, &json!({"content": "long answer please"}))
        .await;
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let (turn, seen) = read_until(&mut body, "w3 ").await;

    let stopped = Instant::now();
    let (status, answer) = post(&app, &other, &app.key, &format!("/v1/turns/{turn}/stop")).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer, json!({"turn_id": turn, "status": "stopping"}));

    // The client still attached reads `finish` (interrupted), then [DONE].
    let (chunks, done) = read_rest(body, seen).await;
    let ended = stopped.elapsed();
    println!("stop from another replica to the end of the stream: {ended:?}");
    assert!(
        ended < crate::common::PROMPTLY,
        "the stream ended after {ended:?}"
    );
    assert!(done, "[DONE] ends the stream");
    assert_eq!(finish_reason(&chunks), Some(FinishReason::Interrupted));
    let aborted = app.provider.wait_aborted(1, Duration::from_secs(2)).await;
    assert_eq!(aborted.len(), 1, "the provider request was aborted");
    let streamed = streamed_text(&chunks);
    assert!(streamed.len() < 200 * 4, "the answer was cut: {streamed}");

    assert_eq!(app.settled().await, vec![("interrupted".to_owned(), None)]);
    let messages = app.messages(&chat).await;
    assert_eq!(messages[1]["status"], "interrupted");
    assert_eq!(
        messages[1]["parts"][1]["text"], streamed,
        "the text the client read is kept"
    );

    // A second stop, from either replica, is a no-op that says how the turn ended.
    for base in [&app.url, &other] {
        let (status, answer) = post(&app, base, &app.key, &format!("/v1/turns/{turn}/stop")).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer, json!({"turn_id": turn, "status": "interrupted"}));
    }
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
}

#[tokio::test]
async fn a_chat_key_stops_the_running_turn_of_a_chat() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let created: Value = app
        .post_json("/v1/keys", &json!({"name": "frontend", "scope": "chat"}))
        .await
        .json()
        .await
        .unwrap();
    let chat_key = created["api_key"].as_str().unwrap().to_owned();

    let (status, idle) = post(&app, &app.url, &chat_key, &format!("/v1/chats/{chat}/stop")).await;
    assert_eq!(status, 200, "{idle}");
    assert_eq!(idle, json!({"turn_id": null, "status": "idle"}));

    app.provider.push(long_answer());
    let response = app.send(&chat, &json!({"content": "go on"})).await;
    let mut body = response.bytes_stream();
    let (turn, seen) = read_until(&mut body, "w2 ").await;
    let (status, answer) = post(&app, &app.url, &chat_key, &format!("/v1/chats/{chat}/stop")).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer, json!({"turn_id": turn, "status": "stopping"}));
    let (chunks, done) = read_rest(body, seen).await;
    assert!(done);
    assert_eq!(finish_reason(&chunks), Some(FinishReason::Interrupted));
    assert_eq!(app.settled().await, vec![("interrupted".to_owned(), None)]);

    // The agent is free at once: the next message runs.
    app.provider.push(Reply::Text {
        deltas: vec!["again".into()],
        delay: Duration::from_millis(1),
    });
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "again"})).await).await;
    assert_eq!(streamed_text(&chunks), "again");
    let (status, idle) = post(&app, &app.url, &chat_key, &format!("/v1/chats/{chat}/stop")).await;
    assert_eq!(
        (status, idle),
        (200, json!({"turn_id": null, "status": "idle"}))
    );
}

#[tokio::test]
async fn stopping_a_finished_turn_answers_its_status() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(Reply::Text {
        deltas: vec!["done".into()],
        delay: Duration::from_millis(1),
    });
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "hi"})).await).await;
    let turn = chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::DataTurn { data, .. } => Some(data.turn_id.to_string()),
            _ => None,
        })
        .unwrap();
    app.settled().await;
    let (status, answer) = post(&app, &app.url, &app.key, &format!("/v1/turns/{turn}/stop")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({"turn_id": turn, "status": "completed"}));
    assert_eq!(app.settled().await, vec![("completed".to_owned(), None)]);
}

#[tokio::test]
async fn a_stop_while_the_model_is_silent_ends_the_stream_interrupted() {
    let app = TestApp::start().await;
    let other = app.second_replica().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(Reply::Stall {
        delay: Duration::from_secs(30),
        deltas: vec!["never".into()],
    });
    let send = {
        let (http, url, key, chat) = (
            app.http.clone(),
            app.url.clone(),
            app.key.clone(),
            chat.clone(),
        );
        tokio::spawn(async move {
            http.post(format!("{url}/v1/chats/{chat}/messages"))
                .bearer_auth(key)
                .json(&json!({"content": "think hard"}))
                .send()
                .await
                .unwrap()
        })
    };
    // The turn's row exists before its provider request.
    while app.provider.requests().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, answer) = post(&app, &other, &app.key, &format!("/v1/chats/{chat}/stop")).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["status"], "stopping");
    let response = tokio::time::timeout(Duration::from_secs(2), send)
        .await
        .expect("the POST was answered")
        .unwrap();
    assert_eq!(response.status(), 200, "a stopped turn is not an error");
    let (chunks, done) = read_stream(response).await;
    assert!(done);
    assert_eq!(finish_reason(&chunks), Some(FinishReason::Interrupted));
    assert_eq!(app.settled().await, vec![("interrupted".to_owned(), None)]);
}

#[tokio::test]
async fn another_teams_turn_and_chat_are_not_found() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(long_answer());
    let response = app.send(&chat, &json!({"content": "long"})).await;
    let mut body = response.bytes_stream();
    let (turn, _) = read_until(&mut body, "w1 ").await;

    let stranger = app.store.create_team("another team").await.unwrap().api_key;
    for path in [
        format!("/v1/turns/{turn}/stop"),
        format!("/v1/chats/{chat}/stop"),
        format!("/v1/turns/{}/stop", uuid::Uuid::now_v7()),
        "/v1/turns/not-a-uuid/stop".to_owned(),
    ] {
        let (status, answer) = post(&app, &app.url, &stranger, &path).await;
        assert_eq!(status, 404, "{path}: {answer}");
        assert_eq!(answer["error"]["code"], "not_found");
    }
    // Nothing was stopped: the turn still streams.
    assert_eq!(app.turns().await[0].0, "running");
    let (status, _) = post(&app, &app.url, &app.key, &format!("/v1/turns/{turn}/stop")).await;
    assert_eq!(status, 202);
    drop(body);
    app.settled().await;
}

#[tokio::test]
async fn without_redis_a_stop_for_another_replica_is_refused_not_pretended() {
    let app = TestApp::start().await;
    // This replica's Redis is a closed port: it cannot hand a stop to the turn's replica.
    let (cut_off, _) = app
        .second_replica_with(|c| c.redis_url = "redis://127.0.0.1:1".into())
        .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(long_answer());
    let response = app.send(&chat, &json!({"content": "long"})).await;
    let mut body = response.bytes_stream();
    let (turn, seen) = read_until(&mut body, "w1 ").await;

    let (status, answer) = post(&app, &cut_off, &app.key, &format!("/v1/turns/{turn}/stop")).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "store_unavailable");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing was stopped"),
        "{answer}"
    );
    assert_eq!(app.turns().await[0].0, "running", "the turn goes on");

    // The replica running it stops it without Redis.
    let (status, _) = post(&app, &app.url, &app.key, &format!("/v1/turns/{turn}/stop")).await;
    assert_eq!(status, 202);
    let (chunks, _) = read_rest(body, seen).await;
    assert_eq!(finish_reason(&chunks), Some(FinishReason::Interrupted));
}

/// A stop published while the owner was not subscribed (its Redis connection cut) is not
/// lost: the owner finds the stop's key when it subscribes again, and stops the turn.
#[tokio::test]
async fn a_stop_published_while_the_owner_was_not_listening_is_found_on_resubscribing() {
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let upstream = redis
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let proxy = FaultProxy::start(&upstream).await;
    // The turn runs on `app`, whose Redis goes through the proxy; the stop comes through
    // `other`, whose Redis is direct.
    let app = TestApp::start_with(|c| c.redis_url = format!("redis://{}", proxy.addr())).await;
    let (other, _) = app
        .second_replica_with(|c| c.redis_url = redis.clone())
        .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(Reply::Text {
        deltas: (0..400).map(|i| format!("w{i} ")).collect(),
        delay: Duration::from_millis(20),
    });
    let response = app.send(&chat, &json!({"content": "long"})).await;
    let mut body = response.bytes_stream();
    let (turn, seen) = read_until(&mut body, "w1 ").await;

    proxy.set(Fault::Cut);
    // The owner's subscription is gone once Redis counts no listener on its channel: the
    // stop published next is heard by nobody.
    let replica: uuid::Uuid =
        sqlx::query_scalar("SELECT replica_id FROM turns WHERE id = $1::uuid")
            .bind(&turn)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    let mut conn = redis::Client::open(redis.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, listeners): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(format!("turn-stop:replica:{replica}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if listeners == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the owner stayed subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, answer) = post(&app, &other, &app.key, &format!("/v1/turns/{turn}/stop")).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        app.turns().await[0].0,
        "running",
        "no subscription heard the stop"
    );

    proxy.set(Fault::None);
    let restored = Instant::now();
    let (chunks, done) = tokio::time::timeout(Duration::from_secs(5), read_rest(body, seen))
        .await
        .expect("the turn was stopped once its replica subscribed again");
    println!("Redis back to the turn stopped: {:?}", restored.elapsed());
    assert!(done);
    assert_eq!(finish_reason(&chunks), Some(FinishReason::Interrupted));
    assert!(
        !streamed_text(&chunks).contains("w399 "),
        "the answer was cut"
    );
    assert_eq!(app.settled().await, vec![("interrupted".to_owned(), None)]);
}
