//! The answer a model owes (T18, T19, T20): reasoning never leaks into the answer, the
//! transcript or the next request; an answer cut by the output limit is continued and
//! joined once; a turn that makes no progress ends `turn_stuck` with its hold released.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::replies::{deltas, text};
use crate::common::{TestApp, read_stream, streamed_text, words};
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::Reply;
use serde_json::{Value, json};

fn cut(pieces: &[&str]) -> Reply {
    Reply::TruncatedText {
        deltas: pieces.iter().map(|p| (*p).to_owned()).collect(),
    }
}

/// The text of an OpenAI request message (a string, or text blocks).
fn content(message: &Value) -> String {
    match &message["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect(),
        _ => String::new(),
    }
}

fn count(chunks: &[UiChunk], want: fn(&UiChunk) -> bool) -> usize {
    chunks.iter().filter(|c| want(c)).count()
}

#[tokio::test]
async fn a_cut_answer_is_continued_and_joined_once() {
    a_cut_answer_is_continued_on("openai/gpt-test").await;
}

#[tokio::test]
async fn a_cut_anthropic_answer_is_continued_and_joined_once() {
    a_cut_answer_is_continued_on("anthropic/claude-test").await;
}

async fn a_cut_answer_is_continued_on(model: &str) {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat(model, &[]).await;
    app.provider
        .push(cut(&["The first point is speed. ", "The second point is"]));
    // The continuation starts over from the cut sentence: that repeat is dropped.
    app.provider.push(deltas(&[
        "The second point ",
        "is cost, ",
        "which matters.",
    ]));
    let response = app.send(&chat, &json!({"content": "Two points"})).await;
    assert_eq!(response.status(), 200);
    let (chunks, done) = read_stream(response).await;
    assert!(done);
    let joined = "The first point is speed. The second point is cost, which matters.";
    assert_eq!(streamed_text(&chunks), joined, "{chunks:?}");
    assert_eq!(
        count(&chunks, |c| matches!(c, UiChunk::TextStart { .. })),
        1
    );
    assert_eq!(count(&chunks, |c| matches!(c, UiChunk::TextEnd { .. })), 1);
    assert_eq!(count(&chunks, |c| matches!(c, UiChunk::StartStep)), 1);
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Stop
        })
    );

    // The continuing call carried the partial answer and the instruction to go on.
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1].body["messages"].as_array().unwrap();
    let [.., partial, instruction] = messages.as_slice() else {
        panic!("{messages:?}")
    };
    assert_eq!(partial["role"], "assistant");
    assert_eq!(
        content(partial),
        "The first point is speed. The second point is"
    );
    assert_eq!(instruction["role"], "user");
    assert!(content(instruction).contains("Continue it exactly where it stopped"));

    // One text in the transcript; both calls billed; the next turn reads the joined
    // answer, not the request to continue it.
    let stored = app.messages(&chat).await;
    assert_eq!(
        stored[1]["parts"],
        json!([{"type": "step-start"}, {"type": "text", "text": joined}])
    );
    assert_eq!(app.settled().await, vec![("completed".to_owned(), None)]);
    let billed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM billing_events WHERE kind = 'model_call'")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(billed, 2);
    app.provider.push(text("ok"));
    let response = app.send(&chat, &json!({"content": "next"})).await;
    read_stream(response).await;
    let next = app.provider.requests().pop().unwrap().body;
    let history: Vec<(String, String)> = next["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| (m["role"].as_str().unwrap().to_owned(), content(m)))
        .collect();
    assert_eq!(
        history,
        [
            ("user".to_owned(), "Two points".to_owned()),
            ("assistant".to_owned(), joined.to_owned()),
            ("user".to_owned(), "next".to_owned()),
        ]
    );
}

#[tokio::test]
async fn continuations_stop_at_their_number_and_at_the_turns_ceiling() {
    // At most BRAIN_MAX_CONTINUATIONS (2) further calls: the answer stays cut after them.
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    for piece in ["one ", "two ", "three ", "four "] {
        app.provider.push(cut(&[piece]));
    }
    let response = app.send(&chat, &json!({"content": "count"})).await;
    let (chunks, _) = read_stream(response).await;
    assert_eq!(streamed_text(&chunks), "one two three ");
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Length
        })
    );
    assert_eq!(app.provider.requests().len(), 3);
    let stored = app.messages(&chat).await;
    assert_eq!(stored[1]["parts"][1]["text"], "one two three ");
    drop(app);

    // T6: each continuation is a model call of the turn.
    let app = TestApp::start_with(|c| c.limits.max_iterations = 2).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    for piece in ["one ", "two ", "three "] {
        app.provider.push(cut(&[piece]));
    }
    let response = app.send(&chat, &json!({"content": "count"})).await;
    let (chunks, _) = read_stream(response).await;
    assert_eq!(streamed_text(&chunks), "one two ");
    assert_eq!(app.provider.requests().len(), 2);
}

#[tokio::test]
async fn a_stuck_turn_ends_failed_with_its_hold_released() {
    let app = TestApp::start_with(|c| c.limits.stuck_after = Duration::from_millis(300)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // A provider that accepts the request and then says nothing (short of the connect
    // timeout, which would give up on it first).
    app.provider.push(Reply::Stall {
        delay: Duration::from_secs(20),
        deltas: words("far too late"),
    });
    let response = app.send(&chat, &json!({"content": "hi"})).await;
    assert_eq!(response.status(), 200);
    let (chunks, done) = read_stream(response).await;
    assert!(done);
    let Some(UiChunk::Error { error_text }) = chunks.last() else {
        panic!("{chunks:?}")
    };
    assert!(error_text.starts_with("turn_stuck"), "{error_text}");
    assert_eq!(
        app.settled().await,
        vec![("failed".to_owned(), Some("turn_stuck".to_owned()))]
    );

    // The hold is gone: the agent takes the next message at once.
    app.provider.push(text("back"));
    let response = app.send(&chat, &json!({"content": "again"})).await;
    assert_eq!(response.status(), 200);
    let (chunks, _) = read_stream(response).await;
    assert_eq!(streamed_text(&chunks), "back");
}

#[tokio::test]
async fn a_turn_that_streams_slowly_is_not_stuck() {
    // Each delta comes well within the period (a loaded machine's pause must not look like
    // a stall), the whole answer twice the period after the first.
    let app = TestApp::start_with(|c| c.limits.stuck_after = Duration::from_secs(2)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let answer = "one two three four five six seven eight nine ten";
    app.provider.push(Reply::Text {
        deltas: words(answer),
        delay: Duration::from_millis(400),
    });
    let response = app.send(&chat, &json!({"content": "hi"})).await;
    let (chunks, _) = read_stream(response).await;
    assert_eq!(streamed_text(&chunks), answer);
    assert_eq!(app.settled().await, vec![("completed".to_owned(), None)]);
}

fn reasoning_of(chunks: &[UiChunk]) -> String {
    chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::ReasoningDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect()
}

fn is_reasoning(chunk: &UiChunk) -> bool {
    matches!(
        chunk,
        UiChunk::ReasoningStart { .. }
            | UiChunk::ReasoningDelta { .. }
            | UiChunk::ReasoningEnd { .. }
    )
}

/// A model that thinks inline: its block split across deltas, as models stream it.
fn thinking() -> Reply {
    deltas(&["<think>the secret", " plan</th", "ink>\n\nHel", "lo."])
}

#[tokio::test]
async fn inline_reasoning_never_reaches_the_stream_the_transcript_or_the_next_request() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(thinking());
    let response = app.send(&chat, &json!({"content": "hi"})).await;
    let (chunks, _) = read_stream(response).await;
    assert_eq!(streamed_text(&chunks), "Hello.");
    assert_eq!(count(&chunks, is_reasoning), 0, "the agent did not opt in");
    let stored = app.messages(&chat).await;
    assert_eq!(
        stored[1]["parts"],
        json!([{"type": "step-start"}, {"type": "text", "text": "Hello."}])
    );

    // An answer stored before reasoning was split out still carries its block: the next
    // request reads the answer without it.
    sqlx::query(
        "UPDATE messages SET parts = $1 WHERE role = 'assistant'",
    )
    .bind(json!([{"type": "step-start"}, {"type": "text", "text": "<think>an old secret</think>Hello."}]))
    .execute(app.store.pool())
    .await
    .unwrap();
    app.provider.push(text("ok"));
    let response = app.send(&chat, &json!({"content": "next"})).await;
    read_stream(response).await;
    let requests = app.provider.requests();
    let next = requests.last().unwrap().body.to_string();
    assert!(
        !next.contains("old secret") && !next.contains("secret plan") && !next.contains("think>"),
        "{next}"
    );
    assert!(next.contains("Hello."), "{next}");
}

#[tokio::test]
async fn an_agent_that_opts_in_streams_reasoning_parts_and_stores_none() {
    let app = TestApp::start().await;
    let created = app
        .post_json(
            "/v1/agents",
            &json!({"name": "thinker", "system_prompt": "Think.", "model": "openai/gpt-test",
                    "stream_reasoning": true}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let agent: Value = created.json().await.unwrap();
    assert_eq!(agent["stream_reasoning"], true);
    let agent_id = agent["id"].as_str().unwrap();
    let chat = app.new_chat(agent_id).await;
    app.provider.push(thinking());
    let response = app
        .send(&chat, &json!({"content": "hi", "message_id": "m-1"}))
        .await;
    let (chunks, _) = read_stream(response).await;
    assert_eq!(reasoning_of(&chunks), "the secret plan");
    assert_eq!(streamed_text(&chunks), "Hello.");
    // One reasoning part, closed before the answer's text opens.
    let at = |want: fn(&UiChunk) -> bool| chunks.iter().position(want).unwrap();
    assert!(
        at(|c| matches!(c, UiChunk::ReasoningStart { .. }))
            < at(|c| matches!(c, UiChunk::ReasoningEnd { .. }))
    );
    assert!(
        at(|c| matches!(c, UiChunk::ReasoningEnd { .. }))
            < at(|c| matches!(c, UiChunk::TextStart { .. }))
    );
    assert_eq!(
        count(&chunks, |c| matches!(c, UiChunk::ReasoningStart { .. })),
        1
    );

    // Never stored: neither the transcript nor a replay of the turn (T12) shows any.
    let stored = app.messages(&chat).await;
    assert_eq!(
        stored[1]["parts"],
        json!([{"type": "step-start"}, {"type": "text", "text": "Hello."}])
    );
    let replay = app
        .send(&chat, &json!({"content": "hi", "message_id": "m-1"}))
        .await;
    assert_eq!(replay.status(), 200);
    let (replayed, _) = read_stream(replay).await;
    assert_eq!(streamed_text(&replayed), "Hello.");
    assert_eq!(count(&replayed, is_reasoning), 0);

    // Turned off again, it streams none.
    let patched = app
        .auth(app.http.patch(format!("{}/v1/agents/{agent_id}", app.url)))
        .json(&json!({"stream_reasoning": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);
    let patched: Value = patched.json().await.unwrap();
    assert_eq!(patched["stream_reasoning"], false);
    app.provider.push(thinking());
    let response = app.send(&chat, &json!({"content": "again"})).await;
    let (chunks, _) = read_stream(response).await;
    assert_eq!(streamed_text(&chunks), "Hello.");
    assert_eq!(count(&chunks, is_reasoning), 0);
}

/// The providers' reasoning fields (OpenAI-compatible `reasoning_content`, Anthropic
/// `thinking` blocks) take the same way as an inline block: reasoning parts for an agent
/// that opts in, nothing for one that does not, and never the answer, the transcript or
/// the next request.
#[tokio::test]
async fn reasoning_fields_of_both_wires_are_kept_out_of_the_answer() {
    let app = TestApp::start().await;
    for (model, opted_in) in [
        ("openai/gpt-test", true),
        ("anthropic/claude-test", true),
        ("openai/gpt-test", false),
        ("anthropic/claude-test", false),
    ] {
        let created = app
            .post_json(
                "/v1/agents",
                &json!({"name": "r", "system_prompt": "Think.", "model": model,
                        "stream_reasoning": opted_in}),
            )
            .await;
        assert_eq!(created.status(), 201);
        let agent: Value = created.json().await.unwrap();
        let chat = app.new_chat(agent["id"].as_str().unwrap()).await;
        app.provider.push(Reply::Reasoning {
            reasoning: words("weigh the hidden options"),
            deltas: words("Take the second."),
            delay: Duration::from_millis(1),
        });
        let response = app.send(&chat, &json!({"content": "which?"})).await;
        let (chunks, _) = read_stream(response).await;
        assert_eq!(streamed_text(&chunks), "Take the second.", "{model}");
        let shown = if opted_in {
            "weigh the hidden options"
        } else {
            ""
        };
        assert_eq!(reasoning_of(&chunks), shown, "{model}");
        let stored = app.messages(&chat).await;
        assert_eq!(
            stored[1]["parts"],
            json!([{"type": "step-start"}, {"type": "text", "text": "Take the second."}]),
            "{model}"
        );
        app.provider.push(text("ok"));
        let response = app.send(&chat, &json!({"content": "sure?"})).await;
        read_stream(response).await;
        let next = app.provider.requests().pop().unwrap().body.to_string();
        assert!(
            !next.contains("hidden options") && next.contains("Take the second."),
            "{model}: {next}"
        );
    }
}
