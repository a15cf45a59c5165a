//! The agent loop with tools: finalized calls only, write budget, iteration ceiling,
//! truncated calls, and a history that stays valid (SPEC T4-T6, T8, M2).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::replies::{call, calls, text};
use crate::common::{TestApp, read_stream, streamed_text};
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::{Reply, ToolCall};
use serde_json::{Value, json};

async fn memory_count(app: &TestApp) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM memories")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    n
}

async fn tool_turn_round_trip(model: &str) {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat(model, &[]).await;
    app.provider.push(calls(vec![call(
        "call_1",
        "memory_write",
        json!({"content": "the deploy day is friday"}),
    )]));
    app.provider.push(text("Noted."));
    let (chunks, done) = read_stream(
        app.send(&chat, &json!({"content": "remember: deploys on friday"}))
            .await,
    )
    .await;
    assert!(done);
    assert!(chunks.contains(&UiChunk::ToolInputStart {
        tool_call_id: "call_1".into(),
        tool_name: "memory_write".into()
    }));
    let fragments: String = chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::ToolInputDelta {
                input_text_delta, ..
            } => Some(input_text_delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&fragments).unwrap(),
        json!({"content": "the deploy day is friday"})
    );
    assert!(chunks.contains(&UiChunk::ToolInputAvailable {
        tool_call_id: "call_1".into(),
        tool_name: "memory_write".into(),
        input: json!({"content": "the deploy day is friday"}),
    }));
    assert!(chunks.iter().any(|c| matches!(c, UiChunk::ToolOutputAvailable { tool_call_id, .. } if tool_call_id == "call_1")));
    assert_eq!(streamed_text(&chunks), "Noted.");
    assert_eq!(
        chunks.iter().filter(|c| **c == UiChunk::StartStep).count(),
        2
    );
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Stop
        })
    );
    assert_eq!(memory_count(&app).await, 1);

    // The stored message holds both steps; the next turn's history carries the call and
    // its result, and memory_search finds the note.
    let messages = app.messages(&chat).await;
    let parts = messages[1]["parts"].as_array().unwrap();
    let kinds: Vec<&str> = parts.iter().map(|p| p["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["step-start", "tool-memory_write", "step-start", "text"]
    );
    assert_eq!(parts[1]["state"], "output-available");

    app.provider.push(calls(vec![call(
        "call_2",
        "memory_search",
        json!({"query": "when is the deploy"}),
    )]));
    app.provider.push(text("Friday."));
    read_stream(
        app.send(&chat, &json!({"content": "when do we deploy?"}))
            .await,
    )
    .await;
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 4);
    let last = requests[3].body.to_string();
    assert!(
        last.contains("the deploy day is friday"),
        "memory_search result reached the model: {last}"
    );
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
    // The composition froze the exact catalog offered.
    let (composition,): (Value,) = sqlx::query_as(
        "SELECT c.body FROM turns t JOIN compositions c ON c.team_id = t.team_id AND c.hash = t.composition_hash LIMIT 1",
    )
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    let names: Vec<&str> = composition["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names[..2],
        ["memory_write", "memory_search"],
        "brain tools come first"
    );
    assert_eq!(
        names.iter().collect::<std::collections::HashSet<_>>().len(),
        names.len(),
        "names are unique"
    );
    assert!(composition["tools"][0]["input_schema"]["properties"]["content"].is_object());
}

#[tokio::test]
async fn tool_calls_round_trip_on_openai() {
    tool_turn_round_trip("openai/gpt-test").await;
}

#[tokio::test]
async fn tool_calls_round_trip_on_anthropic() {
    tool_turn_round_trip("anthropic/claude-test").await;
}

#[tokio::test]
async fn the_fourth_write_gets_budget_spent() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(calls(
        (1..=4)
            .map(|i| {
                call(
                    &format!("w{i}"),
                    "memory_write",
                    json!({"content": format!("note {i}")}),
                )
            })
            .collect(),
    ));
    app.provider.push(text("Done."));
    let (chunks, _) = read_stream(
        app.send(&chat, &json!({"content": "write four notes"}))
            .await,
    )
    .await;
    assert_eq!(memory_count(&app).await, 3);
    let refused: Vec<&str> = chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::ToolOutputError {
                tool_call_id,
                error_text,
            } if error_text.starts_with("budget spent") => Some(tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(refused, ["w4"]);
    let second = app.provider.requests()[1].body.to_string();
    assert!(
        second.contains("budget spent"),
        "the model reads the refusal"
    );
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
}

#[tokio::test]
async fn the_iteration_ceiling_keeps_the_last_answer() {
    let app = TestApp::start_with(|c| c.limits.max_iterations = 2).await;
    let (_, chat) = app.agent_and_chat("anthropic/claude-test", &[]).await;
    app.provider.push(calls(vec![call(
        "s1",
        "memory_search",
        json!({"query": "a"}),
    )]));
    app.provider.push(Reply::ToolCalls {
        text: Some("Still looking".into()),
        calls: vec![call("s2", "memory_search", json!({"query": "b"}))],
        fragment: 3,
    });
    let (chunks, _) =
        read_stream(app.send(&chat, &json!({"content": "search forever"})).await).await;
    assert_eq!(app.provider.requests().len(), 2, "no third model call");
    assert!(
        chunks
            .iter()
            .any(|c| matches!(c, UiChunk::DataNotice { data } if data.code == "iteration_ceiling"))
    );
    assert_eq!(streamed_text(&chunks), "Still looking");
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Other
        })
    );
    let messages = app.messages(&chat).await;
    assert!(
        messages[1]["parts"].to_string().contains("Still looking"),
        "the last answer is kept"
    );
    // The next turn's history is valid: the unrun call has its "not run" result.
    app.provider.push(text("ok"));
    read_stream(app.send(&chat, &json!({"content": "and now?"})).await).await;
    assert!(
        app.provider.requests()[2]
            .body
            .to_string()
            .contains("not run: the turn reached its ceiling")
    );
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
}

#[tokio::test]
async fn a_truncated_tool_call_is_retried_once_then_refused() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let long = call("t1", "memory_write", json!({"content": "x".repeat(200)}));
    app.provider.push(Reply::TruncatedToolCall {
        calls: vec![long.clone()],
        fragment: 16,
    });
    app.provider.push(Reply::TruncatedToolCall {
        calls: vec![long],
        fragment: 16,
    });
    app.provider.push(text("I could not save it."));
    let (chunks, _) = read_stream(
        app.send(&chat, &json!({"content": "save a long note"}))
            .await,
    )
    .await;
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(
        requests[0].body["messages"], requests[1].body["messages"],
        "the retry asks the same thing"
    );
    assert!(
        requests[2]
            .body
            .to_string()
            .contains("cut off by the output token limit twice")
    );
    assert_eq!(memory_count(&app).await, 0, "a truncated call never runs");
    assert_eq!(streamed_text(&chunks), "I could not save it.");
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
}

#[tokio::test]
async fn a_stream_cut_during_tool_arguments_runs_nothing() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("anthropic/claude-test", &[]).await;
    app.provider.push(calls(vec![call(
        "ok",
        "memory_search",
        json!({"query": "x"}),
    )]));
    app.provider.push(Reply::Cut {
        deltas: vec!["Saving".into()],
        delay: Duration::from_millis(1),
    });
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    let Some(UiChunk::Error { error_text }) = chunks.last() else {
        panic!("{chunks:?}")
    };
    assert!(error_text.starts_with("provider_unavailable"));
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

#[tokio::test]
async fn unknown_tools_and_bad_arguments_are_tool_errors() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(calls(vec![
        call("u1", "launch_rockets", json!({})),
        ToolCall {
            id: "u2".into(),
            name: "memory_write".into(),
            arguments: "{not json".into(),
        },
        call("u3", "memory_write", json!({"text": "wrong field"})),
    ]));
    app.provider.push(text("Sorry."));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    let errors = chunks
        .iter()
        .filter(|c| matches!(c, UiChunk::ToolOutputError { .. }))
        .count();
    assert_eq!(errors, 3);
    assert_eq!(streamed_text(&chunks), "Sorry.");
    assert_eq!(memory_count(&app).await, 0);
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
}

#[tokio::test]
async fn nine_tool_calls_in_a_row_stop_at_eight_iterations() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    for i in 1..=9 {
        app.provider.push(calls(vec![call(
            &format!("c{i}"),
            "memory_search",
            json!({"query": format!("q{i}")}),
        )]));
    }
    let (chunks, _) =
        read_stream(app.send(&chat, &json!({"content": "keep searching"})).await).await;
    assert_eq!(
        app.provider.requests().len(),
        8,
        "the ninth call is never made"
    );
    assert_eq!(
        chunks.iter().filter(|c| **c == UiChunk::StartStep).count(),
        8
    );
    assert!(
        chunks
            .iter()
            .any(|c| matches!(c, UiChunk::DataNotice { data } if data.code == "iteration_ceiling"))
    );
    let ran = chunks
        .iter()
        .filter(|c| matches!(c, UiChunk::ToolOutputAvailable { .. }))
        .count();
    assert_eq!(ran, 7, "the eighth answer's call is answered, not run");
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
}
