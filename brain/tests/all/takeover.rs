//! Durable turns (D2, D3): a turn whose replica dies is taken over by a live replica and
//! continued from its last completed step; a call in flight answers `outcome_unknown`; a
//! turn taken over too often ends `failed` (`takeover_limit`); a draining replica hands its
//! turns over (D4); a keyed brain tool in flight is made once; a key revoked stops a
//! taken-over turn, or keeps it from being continued (X1); clients follow a turn across its takeover, by a retry of its message id
//! or by its resumable stream, and see its lost step's text never (D5).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::replies::text;
use crate::common::{BrainProcess, TestApp, parse_events, read_stream, streamed_text, words};
use crate::connector_oauth::events_text;
use crate::erasure::eventually;
use crate::faults::host_port;
use crate::recovery::{held, post, turn_row, until_taken};
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::Reply;
use serde_json::{Value, json};
use test_support::proxy::FaultProxy;

/// Waits until the turn of `client_id` is no longer running, for at most `within`;
/// answers its row and how long it took.
pub(crate) async fn until_ended(
    app: &TestApp,
    client_id: &str,
    within: Duration,
) -> ((String, Option<String>), Duration) {
    let started = Instant::now();
    loop {
        let row = turn_row(app, client_id).await;
        if row.0 != "running" {
            return (row, started.elapsed());
        }
        assert!(
            started.elapsed() < within,
            "the turn was still running after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The assistant messages' parts of `chat`, as the API serves them.
pub(crate) async fn assistant_parts(app: &TestApp, base: &str, chat: &str) -> Vec<Value> {
    let response = app
        .auth(app.http.get(format!("{base}/v1/chats/{chat}/messages")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .flat_map(|m| m["parts"].as_array().unwrap().clone())
        .collect()
}

/// Reads the victim's stream until the model's first words (of [`held`]) arrive, so its
/// model call is in flight; answers the stream's text read so far.
async fn until_talking(response: &mut reqwest::Response) -> String {
    let mut seen = String::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !seen.contains("still talking") {
            let piece = response.chunk().await.unwrap().expect("the victim streams");
            seen.push_str(&String::from_utf8_lossy(&piece));
        }
    })
    .await
    .expect("the victim's model call never streamed");
    seen
}

#[tokio::test]
async fn a_surviving_replica_takes_a_dead_replicas_turn_over_and_finishes_it() {
    // The survivor ticks every quarter of its lease; the victim's short lease lapses fast.
    let app = TestApp::start_with(|c| c.lease_ttl = Duration::from_millis(800)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let mut victim = BrainProcess::start(&app, &[("BRAIN_LEASE_TTL_MS", "800")]).await;
    app.provider.push(held());
    let mut response = post(
        &app,
        &victim.url,
        &chat,
        &json!({"content": "long", "message_id": "m-victim"}),
    )
    .await;
    assert_eq!(response.status(), 200);
    until_talking(&mut response).await;
    // What the model answers the replica that takes over.
    app.provider.push(text("The whole answer."));
    let observer = app.observe(&chat).await;
    victim.kill().await;
    drop(response);

    let (row, waited) = until_ended(&app, "m-victim", Duration::from_secs(10)).await;
    assert_eq!(row, ("completed".into(), None), "after {waited:?}");
    // The model call in flight was issued again; its partial output is nowhere.
    let parts = assistant_parts(&app, &app.url, &chat).await;
    assert_eq!(
        parts,
        [
            json!({"type": "step-start"}),
            json!({"type": "text", "text": "The whole answer."})
        ]
    );
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 2, "one call by each replica");
    assert_eq!(requests[0].body["messages"], requests[1].body["messages"]);
    // Observers of the chat hear that the turn resumed, then its answer.
    let seen = tokio::time::timeout(Duration::from_secs(5), observer)
        .await
        .unwrap()
        .unwrap();
    assert!(seen.contains("\"code\":\"resumed\""), "{seen}");
    assert!(seen.contains("The whole answer."), "{seen}");
    let reconciled = app.metrics().await;
    assert!(
        reconciled.contains("brain_turns_reconciled_total 1"),
        "{reconciled}"
    );
    // A retry of the message id replays the finished answer; the agent is free.
    let retry = post(
        &app,
        &app.url,
        &chat,
        &json!({"content": "long", "message_id": "m-victim"}),
    )
    .await;
    assert_eq!(retry.status(), 200);
    let (chunks, _) = read_stream(retry).await;
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Stop
        })
    );
    app.provider.push(text("Free."));
    let (_, next) = until_taken(&app, &app.url, &chat, Duration::from_secs(5)).await;
    assert_eq!(next.status(), 200);
    read_stream(next).await;
}

#[tokio::test]
async fn the_only_replica_killed_and_restarted_takes_its_own_turn_over() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // The in-process brain only hosts the database and the provider from here on: the
    // restarted process is shown to take the turn over on its own.
    app.begin_shutdown();
    let lease = [("BRAIN_LEASE_TTL_MS", "2000")];
    let mut brain = BrainProcess::start(&app, &lease).await;
    app.provider.push(held());
    let mut response = post(
        &app,
        &brain.url,
        &chat,
        &json!({"content": "a long answer please", "message_id": "m-killed"}),
    )
    .await;
    assert_eq!(response.status(), 200);
    until_talking(&mut response).await;
    brain.kill().await;
    drop(response);
    app.provider.push(text("Done after all."));
    let mut restarted = BrainProcess::start(&app, &lease).await;
    let (row, waited) = until_ended(&app, "m-killed", Duration::from_secs(10)).await;
    assert_eq!(row, ("completed".into(), None), "after {waited:?}");
    assert_eq!(
        assistant_parts(&app, &restarted.url, &chat).await,
        [
            json!({"type": "step-start"}),
            json!({"type": "text", "text": "Done after all."})
        ]
    );
    restarted.kill().await;
}

/// Starts the turn of `message_id` on a victim replica, kills it mid-model-call, then
/// writes the step the victim had made durable (D2) when it died: an answer whose `pending`
/// calls were running, as the victim writes it. The model answers the survivor `then`.
async fn die_with_pending(app: &TestApp, chat: &str, message_id: &str, pending: Value, then: &str) {
    // A lease long enough to write the victim's last step before the survivor looks.
    let mut victim = BrainProcess::start(app, &[("BRAIN_LEASE_TTL_MS", "3000")]).await;
    app.provider.push(held());
    let mut response = post(
        app,
        &victim.url,
        chat,
        &json!({"content": "save it", "message_id": message_id}),
    )
    .await;
    assert_eq!(response.status(), 200);
    until_talking(&mut response).await;
    victim.kill().await;
    drop(response);
    let calls = pending.as_array().unwrap().len();
    let progress = json!({
        "assistant_id": uuid::Uuid::now_v7(),
        "parts": [{"type": "step-start"}, {"type": "text", "text": "Saving. "}],
        "pending": pending,
        "usage": [{"call_index": 0, "model": "openai/gpt-test", "input_tokens": 10, "output_tokens": 5}],
        "calls_made": 1,
        "tool_calls": calls,
        "writes_used": calls,
        "iteration": 1,
        "truncation_retried": false,
    });
    let written = sqlx::query(
        "UPDATE turns SET progress = $1 WHERE id = \
         (SELECT turn_id FROM messages WHERE client_message_id = $2)",
    )
    .bind(&progress)
    .bind(message_id)
    .execute(app.store.pool())
    .await
    .unwrap();
    assert_eq!(written.rows_affected(), 1);
    app.provider.push(text(then));
}

#[tokio::test]
async fn a_call_in_flight_at_the_death_answers_outcome_unknown_and_never_runs_again() {
    let app = TestApp::start_with(|c| c.lease_ttl = Duration::from_millis(800)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // `secret_set` cannot be run again: its stored input has no value (B1).
    let pending = json!([{"id": "call_1", "name": "secret_set",
        "input": {"name": "API_TOKEN", "value": "[redacted]"}}]);
    die_with_pending(&app, &chat, "m-tool", pending, "It may not be saved.").await;

    let (row, _) = until_ended(&app, "m-tool", Duration::from_secs(10)).await;
    assert_eq!(row, ("completed".into(), None));
    let parts = assistant_parts(&app, &app.url, &chat).await;
    assert_eq!(parts.len(), 5, "{parts:?}");
    assert_eq!(parts[1], json!({"type": "text", "text": "Saving. "}));
    assert_eq!(parts[2]["type"], "tool-secret_set");
    assert_eq!(parts[2]["state"], "output-error");
    assert!(
        parts[2]["errorText"]
            .as_str()
            .unwrap()
            .starts_with("outcome_unknown"),
        "{parts:?}"
    );
    assert_eq!(
        parts[4],
        json!({"type": "text", "text": "It may not be saved."})
    );
    // The model read the unknown outcome; the tool was not run again.
    let last = app.provider.requests().pop().unwrap();
    let said = last.body["messages"].to_string();
    assert!(said.contains("outcome_unknown"), "{said}");
    let secrets: i64 = sqlx::query_scalar("SELECT count(*) FROM secrets")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(secrets, 0);
    // The dead replica's model call is billed with the survivor's, once each.
    let billed: Vec<(String, Option<i64>)> = sqlx::query_as(
        "SELECT b.event_key, b.input_tokens FROM billing_events b JOIN messages m \
         ON m.turn_id = b.turn_id WHERE m.client_message_id = 'm-tool' ORDER BY b.event_key",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    assert_eq!(billed.len(), 2, "{billed:?}");
    assert_eq!(billed[0].1, Some(10));
}

#[tokio::test]
async fn a_keyed_brain_tool_in_flight_at_the_death_is_made_once() {
    let app = TestApp::start_with(|c| c.lease_ttl = Duration::from_millis(800)).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // Two notes were being written at the death: the victim's transaction of the first
    // committed, the second's did not.
    let pending = json!([
        {"id": "call_1", "name": "memory_write", "input": {"content": "the first note"}},
        {"id": "call_2", "name": "memory_write", "input": {"content": "the second note"}},
    ]);
    die_with_pending(&app, &chat, "m-notes", pending, "Both kept.").await;
    let turn: uuid::Uuid =
        sqlx::query_scalar("SELECT turn_id FROM messages WHERE client_message_id = 'm-notes'")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    let first = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO memories (id, team_id, agent_id, content, turn_id, call_id) \
         VALUES ($1, $2, $3, 'the first note', $4, 'call_1')",
    )
    .bind(first)
    .bind(app.team.0)
    .bind(uuid::Uuid::parse_str(&agent).unwrap())
    .bind(turn)
    .execute(app.store.pool())
    .await
    .unwrap();

    let (row, _) = until_ended(&app, "m-notes", Duration::from_secs(10)).await;
    assert_eq!(row, ("completed".into(), None));
    // Each note exists once: the first as the victim made it, the second made now.
    let notes: Vec<(uuid::Uuid, String, String)> = sqlx::query_as(
        "SELECT id, content, call_id FROM memories WHERE turn_id = $1 ORDER BY call_id",
    )
    .bind(turn)
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert_eq!(notes[0].0, first);
    assert_eq!(notes[1].1, "the second note");
    let parts = assistant_parts(&app, &app.url, &chat).await;
    let outputs: Vec<&Value> = parts
        .iter()
        .filter(|p| p["type"] == "tool-memory_write")
        .map(|p| &p["output"])
        .collect();
    assert_eq!(
        outputs,
        [
            &json!(format!("remembered (note {first})")),
            &json!(format!("remembered (note {})", notes[1].0)),
        ],
        "{parts:?}"
    );
}

#[tokio::test]
async fn a_taken_over_turn_stops_when_its_key_is_revoked_and_one_revoked_before_is_not_continued() {
    let app = TestApp::start_with(|c| c.lease_ttl = Duration::from_millis(800)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    for (message_id, revoke_after_takeover) in [("m-after", true), ("m-before", false)] {
        let created: Value = app
            .post_json("/v1/keys", &json!({"name": message_id, "scope": "chat"}))
            .await
            .json()
            .await
            .unwrap();
        let (key_id, key) = (
            created["id"].as_str().unwrap(),
            created["api_key"].as_str().unwrap(),
        );
        let mut victim = BrainProcess::start(&app, &[("BRAIN_LEASE_TTL_MS", "800")]).await;
        app.provider.push(held());
        let mut response = app
            .http
            .post(format!("{}/v1/chats/{chat}/messages", victim.url))
            .bearer_auth(key)
            .json(&json!({"content": "go on", "message_id": message_id}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        until_talking(&mut response).await;
        let requests = app.provider.requests().len();
        // The survivor's model call is held too: the turn runs until something stops it.
        app.provider.push(held());
        victim.kill().await;
        drop(response);
        let revoke = || async {
            let revoked = app
                .auth(app.http.delete(format!("{}/v1/keys/{key_id}", app.url)))
                .send()
                .await
                .unwrap();
            assert!(revoked.status().is_success(), "{}", revoked.status());
        };
        if revoke_after_takeover {
            let started = Instant::now();
            while app.provider.requests().len() == requests {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "never taken over"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(turn_row(&app, message_id).await.0, "running");
            revoke().await;
            let (row, waited) = until_ended(&app, message_id, Duration::from_secs(5)).await;
            assert_eq!(row.0, "interrupted", "{row:?} after {waited:?}");
        } else {
            revoke().await;
            let (row, _) = until_ended(&app, message_id, Duration::from_secs(10)).await;
            assert_eq!(row, ("failed".into(), Some("unauthorized".into())));
            assert_eq!(app.provider.requests().len(), requests, "not continued");
        }
    }
}

#[tokio::test]
async fn a_turn_taken_over_too_often_ends_failed_and_frees_its_agent() {
    let app = TestApp::start_with(|c| c.lease_ttl = Duration::from_millis(800)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let mut victim = BrainProcess::start(&app, &[("BRAIN_LEASE_TTL_MS", "3000")]).await;
    app.provider.push(held());
    let mut response = post(
        &app,
        &victim.url,
        &chat,
        &json!({"content": "poison", "message_id": "m-poison"}),
    )
    .await;
    assert_eq!(response.status(), 200);
    until_talking(&mut response).await;
    victim.kill().await;
    drop(response);
    sqlx::query(
        "UPDATE turns SET takeovers = $1 WHERE id = \
         (SELECT turn_id FROM messages WHERE client_message_id = 'm-poison')",
    )
    .bind(engine::turn::MAX_TAKEOVERS)
    .execute(app.store.pool())
    .await
    .unwrap();
    let (row, _) = until_ended(&app, "m-poison", Duration::from_secs(10)).await;
    assert_eq!(row, ("failed".into(), Some("takeover_limit".into())));
    assert_eq!(
        app.provider.requests().len(),
        1,
        "no model call after the limit"
    );
    app.provider.push(text("Fresh."));
    let (_, next) = until_taken(&app, &app.url, &chat, Duration::from_secs(5)).await;
    assert_eq!(next.status(), 200);
    read_stream(next).await;
}

#[tokio::test]
async fn a_draining_replica_hands_its_turn_over_and_another_finishes_it() {
    let app = TestApp::start_with(|c| c.lease_ttl = Duration::from_millis(800)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let mut leaving = BrainProcess::start(
        &app,
        &[
            ("BRAIN_LEASE_TTL_MS", "800"),
            ("BRAIN_DRAIN_TIMEOUT_MS", "300"),
        ],
    )
    .await;
    app.provider.push(held());
    let mut response = post(
        &app,
        &leaving.url,
        &chat,
        &json!({"content": "long", "message_id": "m-rollout"}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let seen = until_talking(&mut response).await;
    app.provider.push(text("Finished elsewhere."));
    // A rollout: SIGTERM, the drain's time runs out while the model still talks.
    assert!(leaving.terminate().await.success());
    let (chunks, _) = parse_events(&(seen + &response.text().await.unwrap()));
    assert!(
        !chunks.contains(&UiChunk::Finish {
            finish_reason: FinishReason::Interrupted
        }),
        "the turn was handed over, not interrupted: {chunks:?}"
    );
    let (row, waited) = until_ended(&app, "m-rollout", Duration::from_secs(10)).await;
    assert_eq!(row, ("completed".into(), None), "after {waited:?}");
    assert_eq!(
        assistant_parts(&app, &app.url, &chat).await,
        [
            json!({"type": "step-start"}),
            json!({"type": "text", "text": "Finished elsewhere."})
        ]
    );
    // A handover is not a crash: it does not count toward the takeover limit.
    let takeovers: i32 = sqlx::query_scalar(
        "SELECT takeovers FROM turns WHERE id = \
         (SELECT turn_id FROM messages WHERE client_message_id = 'm-rollout')",
    )
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(takeovers, 0);
}

/// The text a client (the AI SDK's message builder) shows after `chunks`: a `reset-step`
/// drops what the current step showed.
fn shown_text(chunks: &[UiChunk]) -> String {
    let mut steps: Vec<String> = vec![String::new()];
    for chunk in chunks {
        match chunk {
            UiChunk::StartStep => steps.push(String::new()),
            UiChunk::ResetStep => steps.last_mut().unwrap().clear(),
            UiChunk::TextDelta { delta, .. } => steps.last_mut().unwrap().push_str(delta),
            _ => {}
        }
    }
    steps.concat()
}

fn resumed_notices(chunks: &[UiChunk]) -> usize {
    chunks
        .iter()
        .filter(|c| matches!(c, UiChunk::DataNotice { data } if data.code == "resumed"))
        .count()
}

#[tokio::test]
async fn a_retry_of_a_running_turns_message_id_follows_it_across_its_takeover() {
    let app = TestApp::start_with(|c| c.lease_ttl = Duration::from_millis(800)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let mut victim = BrainProcess::start(&app, &[("BRAIN_LEASE_TTL_MS", "800")]).await;
    app.provider.push(held());
    let body = json!({"content": "long", "message_id": "m-retried"});
    let mut response = post(&app, &victim.url, &chat, &body).await;
    assert_eq!(response.status(), 200);
    until_talking(&mut response).await;
    // The publisher writes in batches: the victim dies once its words are in the events.
    eventually(
        Duration::from_secs(10),
        "the victim's words reach the events",
        || async { events_text(&chat).await.contains("still talking") },
    )
    .await;
    app.provider.push(text("The whole answer."));
    victim.kill().await;
    drop(response);

    // The client whose replica died posts again, before the survivor took the turn over:
    // it gets the turn's stream, not `409 turn_in_progress`.
    let retry = post(&app, &app.url, &chat, &body).await;
    assert_eq!(retry.status(), 200);
    let (chunks, done) = tokio::time::timeout(Duration::from_secs(10), read_stream(retry))
        .await
        .expect("the attached stream ends with the turn");
    assert!(done, "{chunks:?}");
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Stop
        })
    );
    // It had the dead replica's partial step, which the takeover's `reset-step` drops.
    assert!(
        streamed_text(&chunks).contains("still talking"),
        "{chunks:?}"
    );
    assert!(chunks.contains(&UiChunk::ResetStep), "{chunks:?}");
    assert_eq!(shown_text(&chunks), "The whole answer.");
    assert_eq!(resumed_notices(&chunks), 1, "{chunks:?}");
    let (row, _) = until_ended(&app, "m-retried", Duration::from_secs(5)).await;
    assert_eq!(row, ("completed".into(), None));
    assert_eq!(
        app.provider.requests().len(),
        2,
        "the retry started nothing"
    );
}

/// The retried message of a taken-over turn follows it through Redis, whose connections
/// the network closes when idle for a second (a NAT gateway's or load balancer's idle
/// timeout, shortened): the survivor's answer pauses longer than that between words, so
/// the follower's read loses its connection in every pause. Its stream resumes on a new
/// connection and ends with the turn's `finish`, or ends with an `error` part the client
/// can act on; never in the middle of the answer without either.
#[tokio::test]
async fn a_followed_turn_whose_redis_connection_drops_ends_with_finish_or_an_error() {
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let proxy = FaultProxy::closing_idle(&host_port(&redis_url), Duration::from_secs(1)).await;
    let app = TestApp::start_with(|c| {
        c.lease_ttl = Duration::from_millis(800);
        c.redis_url = format!("redis://{}", proxy.addr());
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let mut victim = BrainProcess::start(&app, &[("BRAIN_LEASE_TTL_MS", "800")]).await;
    app.provider.push(held());
    let body = json!({"content": "long", "message_id": "m-idle"});
    let mut response = post(&app, &victim.url, &chat, &body).await;
    assert_eq!(response.status(), 200);
    until_talking(&mut response).await;
    app.provider.push(Reply::Text {
        deltas: words("Slow but whole."),
        delay: Duration::from_millis(1_500),
    });
    victim.kill().await;
    drop(response);

    let retry = post(&app, &app.url, &chat, &body).await;
    assert_eq!(retry.status(), 200);
    let (chunks, done) = tokio::time::timeout(Duration::from_secs(30), read_stream(retry))
        .await
        .expect("the attached stream ends");
    assert!(
        proxy.closed_idle() > 0,
        "the proxy closed no idle connection: the test tested nothing"
    );
    match chunks.last() {
        Some(UiChunk::Finish { finish_reason }) => {
            assert_eq!(*finish_reason, FinishReason::Stop);
            assert!(done, "{chunks:?}");
            assert_eq!(shown_text(&chunks), "Slow but whole.", "{chunks:?}");
        }
        Some(UiChunk::Error { error_text }) => {
            assert!(error_text.starts_with("events_unavailable: "), "{chunks:?}");
        }
        _ => panic!("the stream ended with neither finish nor an error: {chunks:?}"),
    }
    let (row, _) = until_ended(&app, "m-idle", Duration::from_secs(10)).await;
    assert_eq!(row, ("completed".into(), None));
}

#[tokio::test]
async fn the_stream_of_a_taken_over_turn_is_rebuilt_from_its_durable_steps() {
    let app = TestApp::start_with(|c| c.lease_ttl = Duration::from_millis(800)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // A lease long enough to write the victim's last step before the survivor looks.
    let mut victim = BrainProcess::start(&app, &[("BRAIN_LEASE_TTL_MS", "3000")]).await;
    app.provider.push(held());
    let mut response = post(
        &app,
        &victim.url,
        &chat,
        &json!({"content": "save it", "message_id": "m-rebuilt"}),
    )
    .await;
    assert_eq!(response.status(), 200);
    until_talking(&mut response).await;
    victim.kill().await;
    drop(response);
    // The step the victim had made durable (D2): an answer whose call was running, of a
    // tool that cannot be run again.
    let progress = json!({
        "assistant_id": uuid::Uuid::now_v7(),
        "parts": [{"type": "step-start"}, {"type": "text", "text": "Saving. "}],
        "pending": [{"id": "call_1", "name": "secret_set", "input": {"name": "K", "value": "[redacted]"}}],
        "usage": [{"call_index": 0, "model": "openai/gpt-test", "input_tokens": 10, "output_tokens": 5}],
        "calls_made": 1,
        "tool_calls": 1,
        "writes_used": 1,
        "iteration": 1,
        "truncation_retried": false,
    });
    sqlx::query(
        "UPDATE turns SET progress = $1 WHERE id = \
         (SELECT turn_id FROM messages WHERE client_message_id = 'm-rebuilt')",
    )
    .bind(&progress)
    .execute(app.store.pool())
    .await
    .unwrap();
    // Slow enough that the turn still runs when the client connects after the takeover.
    app.provider.push(Reply::Text {
        deltas: words("It may not be saved, sorry."),
        delay: Duration::from_millis(150),
    });
    // The client connects once the survivor's stream has started over (its `start`, the
    // durable step, then the notice, in the publisher's order): before, it would follow
    // the dead replica's partial step.
    eventually(
        Duration::from_secs(10),
        "the survivor's resumed notice",
        || async { events_text(&chat).await.contains("resumed") },
    )
    .await;

    let resumed = app
        .auth(app.http.get(format!("{}/v1/chats/{chat}/stream", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let (chunks, done) = tokio::time::timeout(Duration::from_secs(10), read_stream(resumed))
        .await
        .unwrap();
    assert!(done, "{chunks:?}");
    // One coherent stream: the durable step, the notice, the rest live; the dead
    // replica's partial text nowhere.
    let text = streamed_text(&chunks);
    assert!(!text.contains("still talking"), "{chunks:?}");
    assert_eq!(text, "Saving. It may not be saved, sorry.");
    assert!(!chunks.contains(&UiChunk::ResetStep), "{chunks:?}");
    assert!(matches!(chunks[0], UiChunk::Start { .. }), "{chunks:?}");
    let notice = chunks
        .iter()
        .position(|c| matches!(c, UiChunk::DataNotice { data } if data.code == "resumed"))
        .expect("a resumed notice");
    let unknown = chunks
        .iter()
        .position(|c| matches!(c, UiChunk::ToolOutputError { error_text, .. } if error_text.starts_with("outcome_unknown")))
        .expect("the pending call's outcome");
    assert!(unknown < notice, "{chunks:?}");
    assert_eq!(resumed_notices(&chunks), 1);
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Stop
        })
    );
}

/// O5: a replica SIGKILLed after it took an agent's hold and before it wrote the turn
/// (here: waiting on a connector that accepts and never answers) leaves a hold that no
/// takeover knows of. While the replica lives the agent is busy, however long it waits;
/// once its lease lapses, the next message frees the hold and runs, instead of finding the
/// agent busy until the hold's five minutes run out (what the soak's short form once hit).
/// The turn the hold names leaves the team's running turns with it, so a team allowed one
/// concurrent turn is not refused `concurrent_turns` by a turn that never ran.
#[tokio::test]
async fn a_hold_left_by_a_replica_killed_before_writing_its_turn_is_freed_after_its_lease() {
    let app = TestApp::start_with(|c| {
        c.lease_ttl = Duration::from_millis(800);
        c.connectors.allow_private_networks = true;
    })
    .await;
    // The team's one concurrent turn is the victim's until its hold is freed, no longer.
    let quota = app
        .auth(app.http.put(format!("{}/v1/quotas", app.url)))
        .json(&json!({"concurrent_turns": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(quota.status(), 200);
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", silent.local_addr().unwrap());
    let connector = app
        .post_json(
            "/v1/connectors",
            &json!({"name": "silent", "url": url, "agent_id": agent}),
        )
        .await;
    assert_eq!(connector.status(), 201);
    let connector: Value = connector.json().await.unwrap();
    let mut victim = BrainProcess::start(
        &app,
        &[
            ("BRAIN_LEASE_TTL_MS", "800"),
            ("BRAIN_CONNECTORS_ALLOW_PRIVATE_NETWORKS", "true"),
            ("BRAIN_CONNECTOR_STARTUP_TIMEOUT_MS", "120000"),
        ],
    )
    .await;
    let posting = tokio::spawn(
        app.http
            .post(format!("{}/v1/chats/{chat}/messages", victim.url))
            .bearer_auth(&app.key)
            .json(&json!({"content": "hello"}))
            .send(),
    );
    // The victim dials the connector: it holds the agent and has written no turn.
    let (_socket, _) = tokio::time::timeout(Duration::from_secs(30), silent.accept())
        .await
        .expect("the victim never started the connector")
        .unwrap();
    let held_at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(app.store.pool())
        .await
        .unwrap();

    // Alive past two of its leases, it keeps the agent: its renewal after them (the
    // replica started last) shows both that the time passed and that it still lives.
    let renewed_past = || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT lease_until >= $1 + interval '2400 milliseconds' FROM replicas \
             WHERE kind = 'brain' ORDER BY started_at DESC LIMIT 1",
        )
        .bind(held_at)
        .fetch_one(app.store.pool())
        .await
        .unwrap()
    };
    eventually(
        Duration::from_secs(10),
        "the victim renews its lease",
        renewed_past,
    )
    .await;
    let busy = post(&app, &app.url, &chat, &json!({"content": "me too"})).await;
    assert_eq!(busy.status(), 409, "a live replica's hold was freed");

    victim.kill().await;
    posting.abort();
    let turns: i64 = sqlx::query_scalar("SELECT count(*) FROM turns")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(turns, 0, "the victim died before writing its turn");
    let removed = app
        .auth(app.http.delete(format!(
            "{}/v1/connectors/{}",
            app.url,
            connector["id"].as_str().unwrap()
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 204);

    app.provider.push(text("Back."));
    let (took, response) = until_taken(&app, &app.url, &chat, Duration::from_secs(30)).await;
    let status = response.status();
    assert_eq!(status, 200, "{}", response.text().await.unwrap());
    let (chunks, _) = read_stream(response).await;
    assert!(
        chunks.contains(&UiChunk::Finish {
            finish_reason: FinishReason::Stop
        }),
        "{chunks:?}"
    );
    println!("the agent was free again {took:?} after the kill");
}
