//! One turn end to end: streaming, persistence, providers, failures, cancellation
//! (SPEC T1, T3, T7, T8, T10, T12, S1).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::replies::deltas;
use crate::common::{TestApp, read_stream, streamed_text, words};
use futures_util::StreamExt;
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::{Reply, Wire};
use serde_json::{Value, json};

async fn a_streamed_turn_is_persisted(model: &str, wire: Wire) {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat(model, &[]).await;
    app.provider.push(deltas(&["Hello", ", ", "world."]));

    let response = app
        .send(&chat, &json!({"content": "Say hello", "message_id": "m-1"}))
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-vercel-ai-ui-message-stream"], "v1");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let (chunks, done) = read_stream(response).await;
    assert!(done, "the stream ends with [DONE]");
    assert_eq!(streamed_text(&chunks), "Hello, world.");
    assert!(matches!(chunks.first(), Some(UiChunk::Start { .. })));
    assert!(chunks.contains(&UiChunk::StartStep));
    assert!(chunks.contains(&UiChunk::TextEnd {
        id: "text-1".into()
    }));
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Stop
        })
    );

    // The provider saw the system prompt and the user's text, on its own wire format.
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].wire, wire);
    assert_eq!(requests[0].model, model.split_once('/').unwrap().1);
    let body = requests[0].body.to_string();
    assert!(
        body.contains("You are terse.") && body.contains("Say hello"),
        "{body}"
    );

    let messages = app.messages(&chat).await;
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[0]["client_message_id"], "m-1");
    assert_eq!(
        messages[0]["parts"],
        json!([{"type": "text", "text": "Say hello"}])
    );
    assert_eq!(messages[1]["role"], "assistant");
    assert_eq!(messages[1]["status"], "complete");
    assert_eq!(
        messages[1]["parts"],
        json!([{"type": "step-start"}, {"type": "text", "text": "Hello, world."}])
    );
    let Some(UiChunk::Start { message_id }) = chunks.first() else {
        unreachable!()
    };
    assert_eq!(
        &messages[1]["id"], message_id,
        "the stream's message id is the stored one"
    );

    // T3: the composition was frozen with the turn (stored once per content, by hash);
    // E1: one usage event for the call.
    let (status, composition): (String, Value) =
        sqlx::query_as("SELECT t.status, c.body FROM turns t JOIN compositions c ON c.team_id = t.team_id AND c.hash = t.composition_hash")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(status, "completed");
    assert_eq!(composition["system_prompt"], "You are terse.");
    assert_eq!(composition["model_route"], json!([model]));
    let tools: Vec<&str> = composition["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        ["memory_write", "secret_set", "cron_set"]
            .iter()
            .all(|name| tools.contains(name)),
        "the brain tools are offered: {tools:?}"
    );
    let usage: Vec<(String, String, Option<i64>, Option<i64>)> = sqlx::query_as(
        "SELECT agent_id::text, model, input_tokens, output_tokens FROM billing_events WHERE kind = 'model_call'",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0].0, agent);
    assert_eq!(usage[0].1, model);
    assert!(
        usage[0].2.unwrap() > 0 && usage[0].3.unwrap() > 0,
        "tokens read from the stream: {usage:?}"
    );
}

#[tokio::test]
async fn an_openai_turn_streams_and_persists() {
    a_streamed_turn_is_persisted("openai/gpt-test", Wire::OpenAi).await;
}

#[tokio::test]
async fn an_anthropic_turn_streams_and_persists() {
    a_streamed_turn_is_persisted("anthropic/claude-test", Wire::Anthropic).await;
}

#[tokio::test]
async fn the_next_turn_sees_the_history() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("anthropic/claude-test", &[]).await;
    app.provider.push(deltas(&["First answer."]));
    read_stream(app.send(&chat, &json!({"content": "first question"})).await).await;
    app.settled().await;
    app.provider.push(deltas(&["Second answer."]));
    read_stream(
        app.send(&chat, &json!({"content": "second question"}))
            .await,
    )
    .await;
    let requests = app.provider.requests();
    let messages = &requests[1].body["messages"];
    assert_eq!(
        messages,
        &json!([
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": [{"type": "text", "text": "First answer."}]},
            {"role": "user", "content": "second question"},
        ])
    );
}

/// A stored part the brain does not write (another brain's, a later AI SDK's) is served
/// back unchanged and left out of what the model reads: the history stays readable.
#[tokio::test]
async fn a_part_of_an_unknown_type_is_kept_and_not_sent_to_the_model() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("anthropic/claude-test", &[]).await;
    app.provider.push(deltas(&["First answer."]));
    read_stream(app.send(&chat, &json!({"content": "first question"})).await).await;
    app.settled().await;
    let foreign = json!([
        {"type": "reasoning", "text": "private musings", "state": "done"},
        {"type": "data-connector-status", "data": {"name": "crm", "state": "ready", "tools": 1}},
    ]);
    sqlx::query("UPDATE messages SET parts = parts || $1 WHERE role = 'assistant'")
        .bind(&foreign)
        .execute(app.store.pool())
        .await
        .unwrap();
    let stored = app.messages(&chat).await;
    assert_eq!(
        stored[1]["parts"].as_array().unwrap()[2..],
        foreign.as_array().unwrap()[..]
    );

    app.provider.push(deltas(&["Second answer."]));
    let (_, done) = read_stream(
        app.send(&chat, &json!({"content": "second question"}))
            .await,
    )
    .await;
    assert!(done);
    let requests = app.provider.requests();
    assert_eq!(
        requests[1].body["messages"],
        json!([
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": [{"type": "text", "text": "First answer."}]},
            {"role": "user", "content": "second question"},
        ])
    );
}

#[tokio::test]
async fn a_repeated_message_id_returns_the_same_turn() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(deltas(&["Only ", "once."]));
    let body = json!({"content": "hi", "message_id": "retry-me"});
    let (first, _) = read_stream(app.send(&chat, &body).await).await;
    app.settled().await;
    let (second, done) = read_stream(app.send(&chat, &body).await).await;
    assert!(done);
    assert_eq!(streamed_text(&second), "Only once.");
    assert_eq!(first.first(), second.first(), "same assistant message id");
    assert_eq!(app.provider.requests().len(), 1, "the model ran once");
    assert_eq!(app.messages(&chat).await.len(), 2);
}

#[tokio::test]
async fn a_repeated_message_id_of_a_running_turn_follows_that_turn() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(Reply::Text {
        deltas: words("a slow answer that takes a while to stream"),
        delay: Duration::from_millis(100),
    });
    let body = json!({"content": "hi", "message_id": "busy"});
    let first = app.send(&chat, &body).await;
    assert_eq!(first.status(), 200);
    // The retry comes once the first client has the answer's first word (eight to come).
    let mut first = first.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("\"delta\":\"a ") {
        let piece = first.next().await.expect("the turn's stream ended early");
        seen.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
    }
    // D5: the retry gets the running turn's stream from its start; it starts nothing.
    let second = app.send(&chat, &body).await;
    assert_eq!(second.status(), 200);
    let (again, done) = read_stream(second).await;
    assert!(done);
    while let Some(piece) = first.next().await {
        seen.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
    }
    let (chunks, _) = crate::common::parse_events(&seen);
    assert_eq!(
        streamed_text(&again),
        "a slow answer that takes a while to stream"
    );
    assert_eq!(streamed_text(&again), streamed_text(&chunks));
    assert_eq!(again.first(), chunks.first(), "the same assistant message");
    assert_eq!(app.provider.requests().len(), 1, "the model ran once");
}

async fn fails_before_output(reply: Reply, status: u16, code: &str) -> TestApp {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(reply);
    let response = app.send(&chat, &json!({"content": "hi"})).await;
    assert_eq!(response.status(), status);
    let retry_after = response.headers().get("retry-after").cloned();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], code);
    assert_eq!(
        app.settled().await,
        vec![("failed".to_owned(), Some(code.to_owned()))]
    );
    // The POST was answered with an error: no assistant message, and the user message
    // went with the failure (so the same message id may be sent again).
    assert!(app.messages(&chat).await.is_empty());
    if let Some(value) = retry_after {
        assert_eq!(value, "7");
    }
    app
}

#[tokio::test]
async fn provider_429_is_rate_limited() {
    let app = fails_before_output(
        Reply::Status {
            status: 429,
            retry_after: Some(7),
        },
        429,
        "rate_limited",
    )
    .await;
    assert_eq!(app.provider.requests().len(), 1);
}

#[tokio::test]
async fn provider_5xx_is_unavailable() {
    fails_before_output(
        Reply::Status {
            status: 503,
            retry_after: None,
        },
        503,
        "provider_unavailable",
    )
    .await;
    fails_before_output(
        Reply::Status {
            status: 500,
            retry_after: None,
        },
        503,
        "provider_unavailable",
    )
    .await;
}

#[tokio::test]
async fn provider_4xx_is_rejected() {
    fails_before_output(
        Reply::Status {
            status: 401,
            retry_after: None,
        },
        502,
        "provider_rejected",
    )
    .await;
}

#[tokio::test]
async fn a_stream_cut_before_output_is_unavailable() {
    fails_before_output(
        Reply::Cut {
            deltas: vec![],
            delay: Duration::from_millis(1),
        },
        503,
        "provider_unavailable",
    )
    .await;
}

#[tokio::test]
async fn a_refused_connection_is_unavailable() {
    let app = TestApp::start_with(|c| {
        c.openai.base_url = "http://127.0.0.1:1/v1".into();
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let response = app.send(&chat, &json!({"content": "hi"})).await;
    assert_eq!(response.status(), 503);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "provider_unavailable");
}

#[tokio::test]
async fn a_provider_timeout_is_unavailable() {
    let app =
        TestApp::start_with(|c| c.provider_connect_timeout = Duration::from_millis(200)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(Reply::Stall {
        delay: Duration::from_secs(5),
        deltas: words("too late"),
    });
    let started = Instant::now();
    let response = app.send(&chat, &json!({"content": "hi"})).await;
    assert_eq!(response.status(), 503);
    assert!(started.elapsed() < Duration::from_secs(3));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "provider_unavailable");
}

#[tokio::test]
async fn fallbacks_are_tried_in_order_until_one_answers() {
    let app = TestApp::start().await;
    let (_, chat) = app
        .agent_and_chat("openai/primary", &["anthropic/second", "openai/third"])
        .await;
    app.provider.push(Reply::Status {
        status: 529,
        retry_after: None,
    });
    app.provider.push(Reply::Status {
        status: 429,
        retry_after: None,
    });
    app.provider.push(deltas(&["from ", "the third"]));
    let response = app.send(&chat, &json!({"content": "hi"})).await;
    assert_eq!(response.status(), 200);
    let (chunks, _) = read_stream(response).await;
    assert_eq!(streamed_text(&chunks), "from the third");
    let models: Vec<String> = app
        .provider
        .requests()
        .into_iter()
        .map(|r| r.model)
        .collect();
    assert_eq!(models, ["primary", "second", "third"]);
    assert_eq!(app.settled().await, vec![("completed".to_owned(), None)]);
}

#[tokio::test]
async fn a_failure_after_output_arrives_as_an_error_chunk() {
    for reply in [
        Reply::Cut {
            deltas: words("partial answer then"),
            delay: Duration::from_millis(1),
        },
        Reply::StreamError {
            deltas: words("partial answer then"),
            delay: Duration::from_millis(1),
        },
    ] {
        let app = TestApp::start().await;
        let (_, chat) = app
            .agent_and_chat("anthropic/claude-test", &["openai/unused"])
            .await;
        app.provider.push(reply);
        let response = app.send(&chat, &json!({"content": "hi"})).await;
        assert_eq!(response.status(), 200);
        let (chunks, done) = read_stream(response).await;
        assert!(done);
        assert_eq!(streamed_text(&chunks), "partial answer then");
        let Some(UiChunk::Error { error_text }) = chunks.last() else {
            panic!("{chunks:?}")
        };
        assert!(
            error_text.starts_with("provider_unavailable:"),
            "{error_text}"
        );
        assert_eq!(
            app.provider.requests().len(),
            1,
            "no fallback once output was shown"
        );
        assert_eq!(
            app.settled().await,
            vec![("failed".to_owned(), Some("provider_unavailable".to_owned()))]
        );
        assert_eq!(
            app.messages(&chat).await.len(),
            1,
            "a failed turn stores no assistant message"
        );
    }
}

#[tokio::test]
async fn no_provider_call_when_the_composition_cannot_be_written() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // This test's own database: make every turn insert fail as a full disk or a lost
    // primary would.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$;
         CREATE TRIGGER refuse_turns BEFORE INSERT ON turns FOR EACH ROW EXECUTE FUNCTION refuse();",
    )
    .execute(app.store.pool())
    .await
    .unwrap();
    let response = app.send(&chat, &json!({"content": "hi"})).await;
    assert_eq!(response.status(), 503);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "store_unavailable");
    assert!(
        app.provider.requests().is_empty(),
        "the provider was never called"
    );
    assert!(
        app.messages(&chat).await.is_empty(),
        "the user message went with the failed transaction"
    );
}

/// T3: a composition is stored once per distinct content: turns of agents alike share
/// one row, an agent with another prompt gets its own.
#[tokio::test]
async fn turns_of_agents_alike_share_one_stored_composition() {
    let app = TestApp::start().await;
    let (_, first) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (_, second) = app.agent_and_chat("openai/gpt-test", &[]).await;
    for chat in [&first, &first, &second] {
        app.provider.push(deltas(&["ok"]));
        let response = app.send(chat, &json!({"content": "hi"})).await;
        assert_eq!(response.status(), 200);
        assert!(read_stream(response).await.1);
    }
    let pool = app.store.pool().clone();
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            let (n,): (i64,) = sqlx::query_as(sql).fetch_one(&pool).await.unwrap();
            n
        }
    };
    assert_eq!(count("SELECT count(*) FROM turns").await, 3);
    assert_eq!(count("SELECT count(*) FROM compositions").await, 1);

    let other = app
        .post_json(
            "/v1/agents",
            &json!({"name": "b", "system_prompt": "You are verbose.", "model": "openai/gpt-test"}),
        )
        .await;
    let other: Value = other.json().await.unwrap();
    let chat = app
        .post_json(
            &format!("/v1/agents/{}/chats", other["id"].as_str().unwrap()),
            &json!({}),
        )
        .await;
    let chat: Value = chat.json().await.unwrap();
    let chat = chat["id"].as_str().unwrap().to_owned();
    app.provider.push(deltas(&["ok"]));
    let response = app.send(&chat, &json!({"content": "hi"})).await;
    assert!(read_stream(response).await.1);
    assert_eq!(count("SELECT count(*) FROM compositions").await, 2);
    let (prompt,): (String,) = sqlx::query_as(
        "SELECT c.body->>'system_prompt' FROM turns t \
         JOIN compositions c ON c.team_id = t.team_id AND c.hash = t.composition_hash \
         WHERE t.chat_id = $1::uuid",
    )
    .bind(&chat)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(prompt, "You are verbose.");
}

#[tokio::test]
async fn closing_the_stream_aborts_the_provider_and_keeps_the_delivered_text() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let deltas: Vec<String> = (0..100).map(|i| format!("w{i} ")).collect();
    app.provider.push(Reply::Text {
        deltas,
        delay: Duration::from_millis(20),
    });
    let response = app
        .send(&chat, &json!({"content": "long answer please"}))
        .await;
    assert_eq!(response.status(), 200);

    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("w3 ") {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    drop(body);

    // How soon is the bench's (`busy answer`, hang-up): here, that it happens at all.
    let aborted = app.provider.wait_aborted(1, Duration::from_secs(5)).await;
    assert_eq!(aborted.len(), 1, "the provider request was aborted");

    assert_eq!(app.settled().await, vec![("interrupted".to_owned(), None)]);
    let messages = app.messages(&chat).await;
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[1]["status"], "interrupted");
    assert_eq!(messages[1]["parts"][0]["type"], "step-start");
    let stored = messages[1]["parts"][1]["text"].as_str().unwrap();
    assert!(stored.starts_with("w0 w1 w2 w3 "), "{stored}");
    assert!(
        !stored.contains("w99"),
        "only delivered text is kept: {stored}"
    );
}

#[tokio::test]
async fn the_ai_sdk_client_reads_the_stream() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider
        .push(deltas(&["Parsed ", "by the ", "AI SDK."]));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/ai-sdk/chat.mjs");
    let output = tokio::process::Command::new("node")
        .arg(script)
        .arg(format!("{}/v1/chats/{chat}/messages", app.url))
        .arg(&app.key)
        .arg("Hello from useChat")
        .output()
        .await
        .expect("node must be installed (make test installs it)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let message: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(message["role"], "assistant");
    let text: String = message["parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "text")
        .map(|p| p["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Parsed by the AI SDK.");
    app.settled().await;
    let stored = app.messages(&chat).await;
    assert_eq!(
        message["id"], stored[1]["id"],
        "the client's message id is the stored one"
    );
    assert_eq!(
        stored[0]["parts"],
        json!([{"type": "text", "text": "Hello from useChat"}])
    );
    assert_eq!(app.provider.requests().len(), 1);
}

#[tokio::test]
async fn shutdown_drains_then_hands_the_turn_over_after_the_grace_period() {
    let app = TestApp::start_with(|c| c.drain_timeout = Duration::from_millis(200)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let deltas: Vec<String> = (0..200).map(|i| format!("w{i} ")).collect();
    app.provider.push(Reply::Text {
        deltas,
        delay: Duration::from_millis(20),
    });
    let response = app.send(&chat, &json!({"content": "long"})).await;
    assert_eq!(response.status(), 200);
    let signalled = Instant::now();
    app.begin_shutdown();
    let (chunks, done) = read_stream(response).await;
    let drained = signalled.elapsed();
    assert!(done);
    assert!(
        drained >= Duration::from_millis(200),
        "the turn ran for the grace period: {drained:?}"
    );
    // Then it was handed over: the model's answer was cut, not streamed to its end.
    assert!(!streamed_text(&chunks).contains("w199"), "{chunks:?}");
    // D4: the model call in flight was cut and the turn left for another replica, not
    // interrupted; with no other replica it waits, running and held by none, for the
    // next one to start.
    match chunks.last() {
        Some(UiChunk::Error { error_text }) => {
            assert!(error_text.starts_with("replica_lost:"), "{error_text}")
        }
        other => panic!("the stream ends saying where the turn went: {other:?}"),
    }
    let (status, replica): (String, Option<uuid::Uuid>) =
        sqlx::query_as("SELECT status, replica_id FROM turns")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!((status.as_str(), replica), ("running", None));
}
