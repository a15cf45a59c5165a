//! The brain's Prometheus endpoint after real turns (SPEC O2, X4): every series a dashboard
//! reads is there with the counts the turns imply, no label carries an id, and the scrape
//! passes `promtool check metrics`; and the scrape is served on a port of its own, never
//! on the API port an Ingress publishes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::replies::text;
use crate::common::{BrainProcess, TestApp, read_stream};
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::{Reply, ToolCall};
use serde_json::json;
use test_support::promtool::{check_metrics, sample};

fn value(scrape: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(scrape, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in\n{scrape}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_tools_errors_holds_and_requests_are_counted_and_pass_promtool() {
    // Keep-alives every 50 ms: an observer that left is noticed at the next one.
    let app = TestApp::start_with(|c| c.events.keepalive = Duration::from_millis(50)).await;
    let (agent, chat) = app.agent_and_chat("openai/test-model", &[]).await;
    let (other_agent, other_chat) = app.agent_and_chat("anthropic/test-model", &[]).await;

    // A plain answer on each route.
    app.provider.push(text("Hello."));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "hi"})).await).await;
    assert!(chunks.contains(&UiChunk::Finish {
        finish_reason: FinishReason::Stop
    }));
    app.provider.push(text("Hello from the other side."));
    read_stream(app.send(&other_chat, &json!({"content": "hi"})).await).await;

    // A built-in tool that runs, and a tool the model made up (refused, never run), then
    // the answer: two model calls of one turn.
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![
            ToolCall {
                id: "c1".into(),
                name: "memory_write".into(),
                arguments: json!({"content": "the user says hi"}).to_string(),
            },
            ToolCall {
                id: "c2".into(),
                name: "no_such_tool".into(),
                arguments: "{}".into(),
            },
        ],
        fragment: 0,
    });
    app.provider.push(text("Noted."));
    read_stream(app.send(&chat, &json!({"content": "remember"})).await).await;

    // Every route fails before any output: the client gets an error status.
    app.provider.push(Reply::Status {
        status: 500,
        retry_after: None,
    });
    let failed = app.send(&chat, &json!({"content": "again"})).await;
    assert_eq!(failed.status(), 503);
    app.settled().await;

    // A turn that holds its stream open: live, holding the agent, with an observer.
    let observer = app.get(&format!("/v1/chats/{chat}/events")).await;
    assert_eq!(observer.status(), 200);
    app.provider.push(Reply::Held {
        delta: "…".into(),
        every: Duration::from_millis(20),
    });
    let held = app.send(&chat, &json!({"content": "talk"})).await;
    assert_eq!(held.status(), 200);
    let during = app.metrics().await;
    assert_eq!(value(&during, "brain_live_turns", &[]), 1.0);
    assert_eq!(value(&during, "brain_event_observers", &[]), 1.0);
    let busy = app.send(&chat, &json!({"content": "me too"})).await;
    assert_eq!(busy.status(), 409);
    let stop = app
        .post_json(&format!("/v1/chats/{chat}/stop"), &json!({}))
        .await;
    assert_eq!(stop.status(), 202);
    let (chunks, _) = read_stream(held).await;
    assert!(chunks.contains(&UiChunk::Finish {
        finish_reason: FinishReason::Interrupted
    }));
    app.provider.release_held();
    app.settled().await;
    drop(observer);
    app.wait_gauge("brain_live_turns", 0.0).await;
    app.wait_gauge("brain_event_observers", 0.0).await;

    let missing = app.get("/v1/no/such/route").await;
    assert_eq!(missing.status(), 404);

    let scrape = app.metrics().await;
    let turns = |outcome| value(&scrape, "brain_turns_total", &[("outcome", outcome)]);
    assert_eq!(turns("completed"), 3.0);
    assert_eq!(turns("failed"), 1.0);
    assert_eq!(turns("interrupted"), 1.0);
    let count = |name, route| value(&scrape, name, &[("route", route)]);
    assert_eq!(count("brain_turn_duration_seconds_count", "openai"), 4.0);
    assert_eq!(count("brain_turn_duration_seconds_count", "anthropic"), 1.0);
    // One per model call that produced output: 1 + 2 + 1 (held) on OpenAI.
    assert_eq!(
        count("brain_time_to_first_token_seconds_count", "openai"),
        4.0
    );
    assert_eq!(
        count("brain_time_to_first_token_seconds_count", "anthropic"),
        1.0
    );
    assert!(count("brain_turn_duration_seconds_sum", "openai") > 0.0);
    assert_eq!(
        value(
            &scrape,
            "brain_provider_errors_total",
            &[("code", "provider_unavailable"), ("class", "status")]
        ),
        1.0
    );
    let tool = |name, outcome| {
        value(
            &scrape,
            "brain_tool_calls_total",
            &[("tool", name), ("outcome", outcome)],
        )
    };
    assert_eq!(tool("memory_write", "ok"), 1.0);
    assert_eq!(tool("unknown", "refused"), 1.0);
    let holds = |result| value(&scrape, "brain_holds_total", &[("result", result)]);
    assert_eq!(holds("acquired"), 5.0);
    assert_eq!(holds("busy"), 1.0);
    assert_eq!(holds("unavailable"), 0.0, "known label values start at 0");
    assert_eq!(turns("refused"), 0.0);
    let requests = |route, status| {
        value(
            &scrape,
            "brain_http_requests_total",
            &[("route", route), ("status", status)],
        )
    };
    assert_eq!(requests("/v1/chats/{chat_id}/messages", "200"), 4.0);
    assert_eq!(requests("/v1/chats/{chat_id}/messages", "503"), 1.0);
    assert_eq!(requests("/v1/chats/{chat_id}/messages", "409"), 1.0);
    assert_eq!(requests("/v1/agents", "201"), 2.0);
    assert_eq!(requests("/v1/chats/{chat_id}/events", "200"), 1.0);
    assert_eq!(requests("unmatched", "404"), 1.0);

    // X4: no id of anything reaches a label.
    for id in [&agent, &chat, &other_agent, &other_chat] {
        assert!(!scrape.contains(id.as_str()), "{id} in\n{scrape}");
    }
    assert!(!scrape.contains("no_such_tool") && !scrape.contains("test-model"));
    check_metrics(&scrape);
}

/// The default Ingress routes `/` to the API port, so `/metrics` there would be
/// public. The brain binary answers it with 404 on the API port and serves it on
/// `BRAIN_METRICS_ADDR`, which serves nothing else.
#[tokio::test]
async fn metrics_are_served_on_their_own_port_never_on_the_api_port() {
    let app = TestApp::start().await;
    let brain = BrainProcess::start(&app, &[]).await;
    for api in [&brain.url, &app.url] {
        let public = app.http.get(format!("{api}/metrics")).send().await.unwrap();
        assert_eq!(public.status(), 404, "{api}/metrics");
        let body: serde_json::Value = public.json().await.unwrap();
        assert_eq!(body["error"]["code"], "not_found", "{body}");
    }

    let scrape = app
        .http
        .get(format!("{}/metrics", brain.metrics_url))
        .send()
        .await
        .unwrap();
    assert_eq!(scrape.status(), 200);
    assert_eq!(
        scrape.headers()["content-type"],
        "text/plain; version=0.0.4"
    );
    let scrape = scrape.text().await.unwrap();
    // The readiness polls of the start were counted on the API port.
    assert!(
        value(
            &scrape,
            "brain_http_requests_total",
            &[("route", "/readyz"), ("status", "200")]
        ) >= 1.0,
        "{scrape}"
    );
    check_metrics(&scrape);

    // The metrics port is not a second door to the API.
    let api_on_metrics = app
        .auth(app.http.get(format!("{}/v1/agents", brain.metrics_url)))
        .send()
        .await
        .unwrap();
    assert_eq!(api_on_metrics.status(), 404);
}
