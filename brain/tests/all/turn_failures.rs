//! How a turn fails: bad bytes, a lost end-state write, and the smaller failure modes
//! (SPEC T5-T9, T12). Every turn ends in a terminal state; none stays `running`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::replies::{call, calls, text};
use crate::common::{TestApp, read_stream, streamed_text};
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::Reply;
use serde_json::{Value, json};

/// The text of the stream's error chunk, if it ended with one.
fn error_text(chunks: &[UiChunk]) -> Option<&str> {
    match chunks.last() {
        Some(UiChunk::Error { error_text }) => Some(error_text),
        _ => None,
    }
}

#[tokio::test]
async fn a_message_with_nul_is_an_invalid_request() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    for body in [
        json!({"content": "a\u{0}b"}),
        json!({"content": "fine", "message_id": "id\u{0}"}),
        json!({"id": "c", "trigger": "submit-message",
               "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "x\u{0}"}]}]}),
    ] {
        let response = app.send(&chat, &body).await;
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], "invalid_request");
        assert!(
            error["error"]["message"].as_str().unwrap().contains("NUL"),
            "{error}"
        );
    }
    // The same rule for what an agent is made of.
    let response = app
        .post_json(
            "/v1/agents",
            &json!({"name": "a", "system_prompt": "be\u{0}terse", "model": "openai/gpt-test"}),
        )
        .await;
    assert_eq!(response.status(), 400);
    assert!(app.provider.requests().is_empty());
    assert!(app.turns().await.is_empty(), "nothing was written");
}

#[tokio::test]
async fn nul_in_model_output_and_tool_input_is_stored_as_a_replacement_character() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("anthropic/claude-test", &[]).await;
    app.provider.push(calls(vec![call(
        "s1",
        "memory_search",
        json!({"query": "a\u{0}b"}),
    )]));
    app.provider.push(text("bin\u{0}ary"));
    let (chunks, done) = read_stream(
        app.send(&chat, &json!({"content": "go", "message_id": "nul-1"}))
            .await,
    )
    .await;
    assert!(done);
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Stop
        }),
        "{chunks:?}"
    );
    assert_eq!(app.settled().await, vec![("completed".to_owned(), None)]);
    let messages = app.messages(&chat).await;
    assert_eq!(messages.len(), 2);
    let parts = messages[1]["parts"].to_string();
    assert!(parts.contains("bin\u{FFFD}ary"), "{parts}");
    assert!(parts.contains("a\u{FFFD}b"), "{parts}");
}

/// The end-state write fails (here a trigger of this test's own database refuses the
/// assistant message, as a constraint or a bad byte would): the turn still ends, failed
/// with `store_unavailable`, and a retry of its message id replays that instead of
/// answering `409 turn_in_progress` forever.
#[tokio::test]
async fn a_failed_end_state_write_still_ends_the_turn() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$;
         CREATE TRIGGER refuse_answers BEFORE INSERT ON messages FOR EACH ROW
           WHEN (NEW.role = 'assistant') EXECUTE FUNCTION refuse();",
    )
    .execute(app.store.pool())
    .await
    .unwrap();
    app.provider.push(text("an answer that cannot be stored"));
    let body = json!({"content": "hi", "message_id": "lost-1"});
    let response = app.send(&chat, &body).await;
    assert_eq!(response.status(), 200);
    let (chunks, done) = read_stream(response).await;
    assert!(done);
    assert!(
        error_text(&chunks).is_some_and(|t| t.starts_with("store_unavailable")),
        "{chunks:?}"
    );
    assert_eq!(
        app.settled().await,
        vec![("failed".to_owned(), Some("store_unavailable".to_owned()))]
    );

    let retry = app.send(&chat, &body).await;
    assert_eq!(retry.status(), 200, "the retry replays, no 409");
    let (replayed, done) = read_stream(retry).await;
    assert!(done);
    assert!(
        error_text(&replayed).is_some_and(|t| t.starts_with("store_unavailable")),
        "{replayed:?}"
    );
    assert_eq!(app.provider.requests().len(), 1, "the model ran once");
    // The model call is billed even though the answer was lost.
    let (billed,): (i64,) = sqlx::query_as("SELECT count(*) FROM billing_events")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(billed, 1);
    // The agent is free for the next message.
    app.provider.push(text("next"));
    sqlx::raw_sql("DROP TRIGGER refuse_answers ON messages")
        .execute(app.store.pool())
        .await
        .unwrap();
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "again"})).await).await;
    assert_eq!(streamed_text(&chunks), "next");
}

/// A length-truncated answer on the last allowed iteration is not retried: the turn never
/// makes more than `BRAIN_MAX_ITERATIONS` model calls.
#[tokio::test]
async fn a_truncated_call_at_the_ceiling_makes_no_extra_model_call() {
    let app = TestApp::start_with(|c| c.limits.max_iterations = 2).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(calls(vec![call(
        "s1",
        "memory_search",
        json!({"query": "a"}),
    )]));
    app.provider.push(Reply::TruncatedToolCall {
        calls: vec![call(
            "t1",
            "memory_write",
            json!({"content": "x".repeat(200)}),
        )],
        fragment: 16,
    });
    app.provider.push(text("a third call must not happen"));
    let (chunks, done) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    assert!(done);
    assert_eq!(app.provider.requests().len(), 2, "no third model call");
    assert!(
        chunks
            .iter()
            .any(|c| matches!(c, UiChunk::DataNotice { data } if data.code == "iteration_ceiling")),
        "{chunks:?}"
    );
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Other
        })
    );
    assert_eq!(app.settled().await, vec![("completed".to_owned(), None)]);
    // The cut-off call has a result, so the next turn's history is valid.
    app.provider.push(text("ok"));
    read_stream(app.send(&chat, &json!({"content": "and now?"})).await).await;
    assert_eq!(app.provider.requests().len(), 3);
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
}

/// A TCP proxy on loopback that delays everything it forwards by `delay` each way, in
/// order: a Redis far away. Runs until the test's runtime ends.
async fn slow_link(upstream: &str, delay: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn pipe(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        delay: Duration,
    ) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some((due, bytes)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                let bytes: Vec<u8> = bytes;
                if to.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        });
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0
                || tx
                    .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                return;
            }
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let upstream = upstream.to_owned();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                continue;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(pipe(client_read, server_write, delay));
            tokio::spawn(pipe(server_read, client_write, delay));
        }
    });
    format!("redis://{addr}")
}

/// A client that sends its next message the moment it reads `finish` (before `[DONE]`)
/// finds the agent free, even on another replica and with the first replica's Redis far
/// away: the hold is released before `finish` is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_posted_on_finish_does_not_find_the_agent_busy() {
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let far = slow_link(
        redis.trim_start_matches("redis://").trim_end_matches('/'),
        Duration::from_millis(60),
    )
    .await;
    let app = TestApp::start_with(|c| c.redis_url = far).await;
    let (near, _) = app
        .second_replica_with(|c| c.redis_url = redis.clone())
        .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // A turn of another agent on each replica first, so that their connections to
    // Postgres and Redis are open and the team's quota limits loaded (one more round trip
    // over the far link otherwise), and only the hold decides.
    let (_, other) = app.agent_and_chat("openai/gpt-test", &[]).await;
    for replica in [&near, &app.url] {
        app.provider.push(text("warm"));
        let warm = app
            .auth(
                app.http
                    .post(format!("{replica}/v1/chats/{other}/messages")),
            )
            .json(&json!({"content": "warm up"}))
            .send()
            .await
            .unwrap();
        read_stream(warm).await;
    }
    let unavailable = || async {
        let metrics = app.metrics().await;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("brain_hold_unavailable_total "))
            .map(|n| n.trim().parse::<u64>().unwrap())
            .unwrap()
    };
    let before = unavailable().await;
    app.provider.push(text("first"));
    app.provider.push(text("second"));
    let response = app.send(&chat, &json!({"content": "one"})).await;
    assert_eq!(response.status(), 200);
    // The far replica did take the hold (so only its release can free the agent).
    assert_eq!(
        unavailable().await,
        before,
        "the far replica ran without its hold"
    );
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains(r#""type":"finish""#) {
        let piece = futures_util::StreamExt::next(&mut body)
            .await
            .expect("the stream ended before finish")
            .unwrap();
        seen.push_str(std::str::from_utf8(&piece).unwrap());
    }
    // The next message goes out at once, to the other replica, the first stream still open.
    let next = app
        .auth(app.http.post(format!("{near}/v1/chats/{chat}/messages")))
        .json(&json!({"content": "two"}))
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 200, "{:?}", next.text().await);
    let (chunks, _) = read_stream(next).await;
    assert_eq!(streamed_text(&chunks), "second");
    drop(body);
}

/// A turn that failed before any output (here the provider's 429) answered the POST with
/// an error, so it binds nothing: the retry that `Retry-After` invites, with the same
/// message id, runs and completes, and the transcript holds the message once.
#[tokio::test]
async fn a_retry_after_a_failure_before_output_runs_again() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(Reply::Status {
        status: 429,
        retry_after: Some(1),
    });
    app.provider.push(text("answered on retry"));
    let body = json!({"content": "hi", "message_id": "retry-after-429"});
    let first = app.send(&chat, &body).await;
    assert_eq!(first.status(), 429);
    assert_eq!(first.headers()["retry-after"], "1");
    let retry = app.send(&chat, &body).await;
    assert_eq!(retry.status(), 200);
    let (chunks, done) = read_stream(retry).await;
    assert!(done);
    assert_eq!(streamed_text(&chunks), "answered on retry");
    assert_eq!(
        app.provider.requests().len(),
        2,
        "the retry called the model"
    );
    let turns = app.settled().await;
    assert_eq!(
        turns,
        vec![
            ("failed".to_owned(), Some("rate_limited".to_owned())),
            ("completed".to_owned(), None)
        ]
    );
    let messages = app.messages(&chat).await;
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0]["parts"][0]["text"], "hi");
    assert_eq!(messages[1]["role"], "assistant");
    // From now on the id is bound to the completed turn.
    let (replayed, _) = read_stream(app.send(&chat, &body).await).await;
    assert_eq!(streamed_text(&replayed), "answered on retry");
    assert_eq!(app.provider.requests().len(), 2);
}

/// A client that stays connected but stops reading cannot hold its turn forever: once the
/// chunk channel stays full for `BRAIN_CLIENT_STALL_TIMEOUT_MS`, the turn is cancelled
/// and stored `interrupted` with the text the channel took.
#[tokio::test]
async fn a_client_that_stops_reading_interrupts_its_turn() {
    let app = TestApp::start_with(|c| c.client_stall_timeout = Duration::from_millis(300)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // 48 MiB of text, 8 KiB a millisecond: the client side (socket buffers, hyper's
    // buffer, the chunk channel; about 5 MiB) fills within a second, while the provider
    // is still seconds from its end when the turn is cancelled. Sent at full speed, a
    // fast machine's autotuned buffers took a whole 12 MiB answer and the provider saw a
    // completed stream, not an abort.
    app.provider.push(Reply::Text {
        deltas: (0..6144)
            .map(|i| format!("{i:07} {}", "x".repeat(8184)))
            .collect(),
        delay: Duration::from_millis(1),
    });
    let socket = app.post_unread(&chat, "a long answer please").await;
    // Never read; the connection stays open.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let turns = loop {
        let turns = app.turns().await;
        if !turns.is_empty() && turns.iter().all(|(s, _)| s != "running") {
            break turns;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the turn is still running behind a client that does not read: {turns:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(turns, vec![("interrupted".to_owned(), None)]);
    let aborted = app.provider.wait_aborted(1, Duration::from_secs(2)).await;
    assert_eq!(aborted.len(), 1, "the provider request was aborted");
    let messages = app.messages(&chat).await;
    assert_eq!(messages[1]["status"], "interrupted");
    let stored = messages[1]["parts"][1]["text"].as_str().unwrap();
    assert!(stored.starts_with("0000000 x"), "the accepted text is kept");
    assert!(!stored.contains("0006143 "), "not the whole answer");
    drop(socket);
}
