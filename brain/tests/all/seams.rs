//! Authority where one principal's work is carried on by another (issue 50): an approval's
//! continuation, an autostart, queued and background turns, memories.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::replies::{call, calls, text};
use crate::common::{TestApp, read_stream};
use protocol::ui::UiChunk;
use serde_json::{Value, json};

/// A key of `scope` of the app's team: (its bearer, its id).
async fn key_with_scope(app: &TestApp, scope: &str) -> (String, String) {
    let created = app
        .post_json("/v1/keys", &json!({"name": scope, "scope": scope}))
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    (
        created["api_key"].as_str().unwrap().to_owned(),
        created["id"].as_str().unwrap().to_owned(),
    )
}

/// Posts `content` to `chat` as `bearer` and reads the stream to its end.
async fn send_as(app: &TestApp, bearer: &str, chat: &str, content: &str) -> Vec<UiChunk> {
    let response = app
        .http
        .post(format!("{}/v1/chats/{chat}/messages", app.url))
        .bearer_auth(bearer)
        .json(&json!({"content": content}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (chunks, done) = read_stream(response).await;
    assert!(done, "{chunks:?}");
    app.settled().await;
    chunks
}

fn approval_asked(chunks: &[UiChunk]) -> String {
    chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::ToolApprovalRequest { approval_id, .. } => Some(approval_id.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("nothing asked: {chunks:?}"))
}

/// Waits until the app has `count` turns and none runs.
async fn turns_ended(app: &TestApp, count: usize) {
    for _ in 0..500 {
        let turns = app.turns().await;
        if turns.len() == count && turns.iter().all(|(s, _)| s != "running") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("turns never ended: {:?}", app.turns().await);
}

/// The stored tool part of the call `id` in `chat`.
async fn stored_part(app: &TestApp, chat: &str, id: &str) -> Value {
    let stored = app.messages(chat).await;
    stored
        .iter()
        .flat_map(|m| m["parts"].as_array().unwrap())
        .find(|p| p["toolCallId"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no part {id}: {stored:?}"))
}

async fn autostart_cron(app: &TestApp, agent: &str) -> Option<String> {
    sqlx::query_scalar("SELECT autostart_cron FROM agents WHERE id = $1::uuid")
        .bind(agent)
        .fetch_one(app.store.pool())
        .await
        .unwrap()
}

/// Hole 1: an admin approving a chat key's `memory_write` lends the continuation nothing:
/// its next model step's `cron_set` is refused, as it is in the chat key's own turn.
#[tokio::test]
async fn an_admins_answer_lends_the_continuation_nothing() {
    let app = TestApp::start().await;
    let created = app
        .post_json(
            "/v1/agents",
            &json!({"name": "careful", "system_prompt": "You are terse.",
                    "model": "openai/gpt-test",
                    "approval_policy": {"ask": ["memory_write"], "deny": []}}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let agent: Value = created.json().await.unwrap();
    let agent = agent["id"].as_str().unwrap().to_owned();
    let chat = &app.new_chat(&agent).await;
    let (chat_key, _) = key_with_scope(&app, "chat").await;

    app.provider.push(calls(vec![call(
        "remember",
        "memory_write",
        json!({"content": "the admin trusts me"}),
    )]));
    let chunks = send_as(&app, &chat_key, chat, "remember this").await;
    let approval = approval_asked(&chunks);

    // The continuation's next step asks for what only an admin may do.
    app.provider.push(calls(vec![call(
        "escalate",
        "cron_set",
        json!({"cron": "0 9 1 1 *", "prompt": "run as admin forever"}),
    )]));
    app.provider.push(text("Done."));
    let answer = app
        .post_json(
            &format!("/v1/approvals/{approval}"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(answer.status(), 202);
    turns_ended(&app, 2).await;

    assert_eq!(
        stored_part(&app, chat, "remember").await["state"],
        "output-available"
    );
    let refused = stored_part(&app, chat, "escalate").await;
    assert_eq!(refused["state"], "output-error", "{refused}");
    assert!(
        refused["errorText"]
            .as_str()
            .unwrap()
            .contains("only an admin"),
        "{refused}"
    );
    assert_eq!(autostart_cron(&app, &agent).await, None);
    // The continuation is recorded as the asking key's, the answer as the admin's.
    let (actor, admin): (String, bool) =
        sqlx::query_as("SELECT actor, actor_admin FROM turns WHERE trigger = 'approval'")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert!(actor.starts_with("key:") && !admin, "{actor} {admin}");
}
