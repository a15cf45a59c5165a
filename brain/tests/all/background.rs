//! Background turns (D1): `"background": true` answers `202` at once and the turn runs to
//! its end with nobody reading; `GET /v1/turns/{id}` and `GET /v1/chats/{id}/turns` say
//! where turns are; an agent's `disconnect_policy` decides what a hang-up does to an
//! interactive turn; `GET /v1/chats/{id}/stream` follows a background turn from another
//! replica. Real Postgres and Redis, the scripted model.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::{TestApp, parse_events, read_stream, streamed_text};
use futures_util::StreamExt;
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::Reply;
use serde_json::{Value, json};

/// `n` words, `delay` apart: "w0 w1 ...".
fn slow(n: usize, delay: Duration) -> Reply {
    Reply::Text {
        deltas: (0..n).map(|i| format!("w{i} ")).collect(),
        delay,
    }
}

fn words(n: usize) -> String {
    (0..n).map(|i| format!("w{i} ")).collect()
}

async fn json_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(app: &TestApp, path: &str) -> (u16, Value) {
    json_of(app.get(path).await).await
}

/// Polls `GET /v1/turns/{turn}` until its status is `want`: the turn as then shown.
async fn turn_until(app: &TestApp, turn: &str, want: &str) -> Value {
    for _ in 0..500 {
        let (status, body) = get(app, &format!("/v1/turns/{turn}")).await;
        assert_eq!(status, 200, "{body}");
        if body["status"] == want {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("turn {turn} never became {want}");
}

async fn set_disconnect_policy(app: &TestApp, agent: &str, policy: &str) -> (u16, Value) {
    json_of(
        app.auth(app.http.patch(format!("{}/v1/agents/{agent}", app.url)))
            .json(&json!({"disconnect_policy": policy}))
            .send()
            .await
            .unwrap(),
    )
    .await
}

#[tokio::test]
async fn a_background_turn_answers_at_once_and_runs_to_its_end_unread() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(slow(10, Duration::from_millis(50)));
    let body = json!({"content": "work on it", "message_id": "bg-1", "background": true});

    let (status, accepted) = json_of(app.send(&chat, &body).await).await;
    assert_eq!(status, 202, "{accepted}");
    assert_eq!(accepted["chat_id"], chat.as_str());
    assert_eq!(accepted["status"], "running");
    let turn = accepted["turn_id"].as_str().unwrap().to_owned();
    let message = accepted["message_id"].as_str().unwrap().to_owned();

    // A retry while it runs starts nothing: the same turn, not `409 turn_in_progress`.
    let (status, again) = json_of(app.send(&chat, &body).await).await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(again, accepted);

    let running = turn_until(&app, &turn, "running").await;
    assert_eq!(running["id"], turn.as_str());
    assert_eq!(running["chat_id"], chat.as_str());
    assert_eq!(running["agent_id"], agent.as_str());
    assert_eq!(running["trigger"], "user");
    assert_eq!(running["background"], true);
    assert!(running["started_at"].is_string());
    assert!(running["ended_at"].is_null());
    assert!(running["error"].is_null());

    let done = turn_until(&app, &turn, "completed").await;
    assert!(done["ended_at"].is_string());
    let messages = app.messages(&chat).await;
    assert_eq!(messages.len(), 2);
    assert_eq!(
        messages[0]["id"],
        message.as_str(),
        "message_id names the user message"
    );
    assert_eq!(messages[1]["status"], "complete");
    assert_eq!(
        messages[1]["parts"][1]["text"],
        words(10),
        "nobody read it, all of it ran"
    );

    // A retry of the ended turn answers the same turn, as it now is.
    let (status, late) = json_of(app.send(&chat, &body).await).await;
    assert_eq!(status, 202, "{late}");
    assert_eq!(
        late,
        json!({"turn_id": turn, "chat_id": chat, "message_id": message, "status": "completed"})
    );
    assert_eq!(app.provider.requests().len(), 1, "the model ran once");
    assert_eq!(app.messages(&chat).await.len(), 2);
}

#[tokio::test]
async fn background_is_refused_with_approval_responses_and_checked_like_any_message() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let approval = json!({
        "id": chat, "trigger": "submit-message", "background": true,
        "messages": [{"id": "a1", "role": "assistant", "parts": [{
            "type": "tool-x", "toolCallId": "c1", "state": "approval-responded",
            "approval": {"id": uuid::Uuid::now_v7().to_string(), "approved": true}}]}],
    });
    let (status, error) = json_of(app.send(&chat, &approval).await).await;
    assert_eq!(status, 400, "{error}");
    assert_eq!(error["error"]["code"], "invalid_request");
    let (status, error) = json_of(
        app.send(&chat, &json!({"content": "", "background": true}))
            .await,
    )
    .await;
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, _) = json_of(
        app.send(&chat, &json!({"content": "x", "background": "yes"}))
            .await,
    )
    .await;
    assert_eq!(status, 400);
    assert!(app.turns().await.is_empty(), "nothing started");
}

#[tokio::test]
async fn a_chats_turns_are_listed_newest_first_a_page_at_a_time() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (status, empty) = get(&app, &format!("/v1/chats/{chat}/turns")).await;
    assert_eq!(status, 200);
    assert_eq!(empty, json!({"turns": []}));

    let mut started = Vec::new();
    for i in 0..3 {
        app.provider.push(Reply::Text {
            deltas: vec![format!("answer {i}")],
            delay: Duration::from_millis(1),
        });
        let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "hi"})).await).await;
        started.push(
            chunks
                .iter()
                .find_map(|c| match c {
                    UiChunk::DataTurn { data, .. } => Some(data.turn_id.to_string()),
                    _ => None,
                })
                .unwrap(),
        );
        app.settled().await;
    }
    let (status, first) = get(&app, &format!("/v1/chats/{chat}/turns?limit=2")).await;
    assert_eq!(status, 200, "{first}");
    let ids = |page: &Value| -> Vec<String> {
        page["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(&first), vec![started[2].clone(), started[1].clone()]);
    assert_eq!(first["turns"][0]["status"], "completed");
    assert_eq!(first["turns"][0]["background"], false);
    let cursor = first["next_cursor"].as_str().unwrap();
    let (status, second) = get(
        &app,
        &format!("/v1/chats/{chat}/turns?limit=2&cursor={cursor}"),
    )
    .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(ids(&second), vec![started[0].clone()]);
    assert!(
        second.get("next_cursor").is_none(),
        "the oldest page: {second}"
    );

    for bad in ["limit=0", "limit=201", "cursor=nope", "before=x"] {
        let (status, error) = get(&app, &format!("/v1/chats/{chat}/turns?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {error}");
        assert_eq!(error["error"]["code"], "invalid_request");
    }
    // A transcript cursor is not a turn cursor.
    let (_, page) = get(&app, &format!("/v1/chats/{chat}/messages?limit=1")).await;
    let messages_cursor = page["next_cursor"].as_str().unwrap();
    let (status, _) = get(
        &app,
        &format!("/v1/chats/{chat}/turns?cursor={messages_cursor}"),
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn another_teams_turns_and_chats_are_not_found() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(Reply::Text {
        deltas: vec!["mine".into()],
        delay: Duration::from_millis(1),
    });
    let (status, accepted) = json_of(
        app.send(&chat, &json!({"content": "hi", "background": true}))
            .await,
    )
    .await;
    assert_eq!(status, 202);
    let turn = accepted["turn_id"].as_str().unwrap().to_owned();
    turn_until(&app, &turn, "completed").await;

    let other = app.store.create_team("other team").await.unwrap();
    for path in [
        format!("/v1/turns/{turn}"),
        format!("/v1/chats/{chat}/turns"),
        format!("/v1/turns/{}", uuid::Uuid::now_v7()),
        "/v1/turns/not-an-id".to_owned(),
    ] {
        let (status, error) = json_of(
            app.http
                .get(format!("{}{path}", app.url))
                .bearer_auth(&other.api_key)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 404, "{path}: {error}");
        assert_eq!(error["error"]["code"], "not_found");
    }
    let (status, _) = json_of(
        app.http
            .post(format!("{}/v1/chats/{chat}/messages", app.url))
            .bearer_auth(&other.api_key)
            .json(&json!({"content": "theirs", "background": true}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(app.turns().await.len(), 1, "the other team started nothing");
}

/// Reads `response` until `mark` was streamed, then hangs up.
async fn hang_up_after(response: reqwest::Response, mark: &str) -> String {
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains(mark) {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    drop(body);
    let events: String = seen
        .split_inclusive("\n\n")
        .filter(|e| e.ends_with("\n\n"))
        .collect();
    let (chunks, _) = parse_events(&events);
    chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::DataTurn { data, .. } => Some(data.turn_id.to_string()),
            _ => None,
        })
        .expect("the stream names its turn")
}

#[tokio::test]
async fn an_agent_that_continues_keeps_its_turn_running_past_a_hang_up() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (status, changed) = set_disconnect_policy(&app, &agent, "continue").await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["disconnect_policy"], "continue");
    let (_, read) = get(&app, &format!("/v1/agents/{agent}")).await;
    assert_eq!(read["disconnect_policy"], "continue");

    app.provider.push(slow(30, Duration::from_millis(20)));
    let response = app.send(&chat, &json!({"content": "long answer"})).await;
    assert_eq!(response.status(), 200);
    let turn = hang_up_after(response, "w3 ").await;

    let done = turn_until(&app, &turn, "completed").await;
    assert_eq!(done["background"], false, "it was an interactive turn");
    assert!(
        app.provider.aborted_streams().is_empty(),
        "the model call ran on"
    );
    let messages = app.messages(&chat).await;
    assert_eq!(messages[1]["status"], "complete");
    assert_eq!(messages[1]["parts"][1]["text"], words(30));

    // Back to the default: the next hang-up stops its turn.
    let (status, changed) = set_disconnect_policy(&app, &agent, "cancel").await;
    assert_eq!(
        (status, changed["disconnect_policy"].as_str()),
        (200, Some("cancel"))
    );
    app.provider.push(slow(100, Duration::from_millis(20)));
    let response = app.send(&chat, &json!({"content": "again"})).await;
    let turn = hang_up_after(response, "w3 ").await;
    let ended = turn_until(&app, &turn, "interrupted").await;
    assert!(ended["ended_at"].is_string());
    assert_eq!(app.messages(&chat).await[3]["status"], "interrupted");
}

#[tokio::test]
async fn disconnect_policy_defaults_to_cancel_and_takes_only_its_values() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (_, read) = get(&app, &format!("/v1/agents/{agent}")).await;
    assert_eq!(read["disconnect_policy"], "cancel");
    let (status, error) = set_disconnect_policy(&app, &agent, "linger").await;
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, created) = json_of(
        app.post_json(
            "/v1/agents",
            &json!({"name": "b", "system_prompt": "", "model": "openai/gpt-test",
                    "disconnect_policy": "continue"}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["disconnect_policy"], "continue");

    // The default: a hang-up interrupts the turn.
    app.provider.push(slow(100, Duration::from_millis(20)));
    let response = app.send(&chat, &json!({"content": "long answer"})).await;
    let turn = hang_up_after(response, "w3 ").await;
    turn_until(&app, &turn, "interrupted").await;
    let aborted = app.provider.wait_aborted(1, Duration::from_secs(2)).await;
    assert_eq!(aborted.len(), 1, "the model call was aborted");
}

#[tokio::test]
async fn the_stream_follows_a_background_turn_from_another_replica_then_answers_204() {
    let app = TestApp::start().await;
    let replica_b = app.second_replica().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let resume = || {
        app.auth(app.http.get(format!("{replica_b}/v1/chats/{chat}/stream")))
            .send()
    };
    app.provider.push(slow(8, Duration::from_millis(100)));
    let (status, accepted) = json_of(
        app.send(&chat, &json!({"content": "go", "background": true}))
            .await,
    )
    .await;
    assert_eq!(status, 202, "{accepted}");
    let turn = accepted["turn_id"].as_str().unwrap().to_owned();
    // Some chunks are out before it is joined: an observer of the chat has seen text.
    let observed = app
        .auth(app.http.get(format!("{}/v1/chats/{chat}/events", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(observed.status(), 200);
    let mut observed = observed.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("text-delta") {
        let next = tokio::time::timeout(Duration::from_secs(10), observed.next())
            .await
            .expect("the turn streams text");
        seen.push_str(std::str::from_utf8(&next.unwrap().unwrap()).unwrap());
    }
    drop(observed);
    let followed = resume().await.unwrap();
    assert_eq!(followed.status(), 200);
    let (chunks, done) = read_stream(followed).await;
    assert!(done, "[DONE] ends it");
    assert!(
        matches!(chunks.first(), Some(UiChunk::Start { .. })),
        "from its start"
    );
    assert!(
        chunks.iter().any(
            |c| matches!(c, UiChunk::DataTurn { data, .. } if data.turn_id.to_string() == turn)
        )
    );
    assert_eq!(streamed_text(&chunks), words(8));
    assert!(matches!(
        chunks.last(),
        Some(UiChunk::Finish {
            finish_reason: FinishReason::Stop
        })
    ));
    turn_until(&app, &turn, "completed").await;
    assert_eq!(resume().await.unwrap().status(), 204, "the turn ended");
}

/// D1: with `continue`, a client that stays connected but stops reading is given up, not
/// its turn: past the stall timeout the turn goes on without it and completes.
#[tokio::test]
async fn an_agent_that_continues_keeps_its_turn_running_past_a_stalled_client() {
    let app = TestApp::start_with(|c| c.client_stall_timeout = Duration::from_millis(300)).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    assert_eq!(set_disconnect_policy(&app, &agent, "continue").await.0, 200);
    // 24 MiB, 8 KiB a millisecond: far more than the socket buffers, hyper's and the
    // chunk channel take (about 5 MiB, 12 MiB on a fast machine's autotuned buffers).
    let deltas = 3072;
    app.provider.push(Reply::Text {
        deltas: (0..deltas)
            .map(|i| format!("{i:07} {}", "x".repeat(8184)))
            .collect(),
        delay: Duration::from_millis(1),
    });
    let socket = app.post_unread(&chat, "a long answer please").await;
    // Never read; the connection stays open.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let turns = loop {
        let turns = app.turns().await;
        if !turns.is_empty() && turns.iter().all(|(s, _)| s != "running") {
            break turns;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running: {turns:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(turns, vec![("completed".to_owned(), None)]);
    assert!(app.provider.aborted_streams().is_empty());
    let stored: i32 = sqlx::query_scalar(
        "SELECT length(parts->1->>'text') FROM messages WHERE role = 'assistant'",
    )
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(stored, deltas * 8192, "the whole answer is kept");
    drop(socket);
}
