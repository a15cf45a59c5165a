//! The bases a replica keeps (`engine/src/turn/basis.rs`): a turn starts from its
//! chat and agent as this replica last read them, and no turn runs on a stale one: the
//! intake's statement finds it stale and the turn starts over from Postgres.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::replies::deltas;
use crate::common::{TestApp, error_code, read_stream};
use serde_json::json;

/// `brain_turn_bases_total{source}` of `app`'s replica.
async fn bases(app: &TestApp, source: &str) -> f64 {
    let scrape = app.metrics().await;
    test_support::promtool::sample(&scrape, "brain_turn_bases_total", &[("source", source)])
        .unwrap_or_else(|| panic!("no brain_turn_bases_total{{source={source}}}"))
}

async fn turn(app: &TestApp, chat: &str) {
    app.provider.push(deltas(&["ok"]));
    let response = app.send(chat, &json!({"content": "hi"})).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    assert!(read_stream(response).await.1);
    app.settled().await;
}

/// An agent changed through another replica: this replica's next turn of the chat sends
/// the new prompt, having found what it kept stale; the turn after starts from the kept
/// basis again.
#[tokio::test]
async fn a_prompt_changed_through_another_replica_reaches_the_next_turn() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("anthropic/claude-test", &[]).await;
    turn(&app, &chat).await;
    turn(&app, &chat).await;
    assert_eq!(bases(&app, "read").await, 1.0);
    assert_eq!(bases(&app, "kept").await, 1.0);

    let other = app.second_replica().await;
    let patched = app
        .auth(app.http.patch(format!("{other}/v1/agents/{agent}")))
        .json(&json!({"system_prompt": "You are verbose."}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);

    turn(&app, &chat).await;
    let requests = app.provider.requests();
    assert_eq!(requests[1].body["system"], "You are terse.");
    assert_eq!(requests[2].body["system"], "You are verbose.");
    assert_eq!(requests.len(), 3, "the stale intake called no model");
    assert_eq!(bases(&app, "stale").await, 1.0);
    assert_eq!(bases(&app, "read").await, 2.0);
    let (turns,): (i64,) = sqlx::query_as("SELECT count(*) FROM turns")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(turns, 3, "the stale intake wrote no turn");

    turn(&app, &chat).await;
    assert_eq!(
        app.provider.requests()[3].body["system"],
        "You are verbose."
    );
    assert_eq!(bases(&app, "stale").await, 1.0);
    assert_eq!(bases(&app, "kept").await, 3.0);
}

/// An agent archived behind this replica's back (any writer: the trigger bumps its
/// version) runs no new turn here, though the kept basis says it is live.
#[tokio::test]
async fn an_agent_archived_elsewhere_runs_no_turn_from_a_kept_basis() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    turn(&app, &chat).await;
    sqlx::query("UPDATE agents SET archived_at = now() WHERE id = $1::uuid")
        .bind(&agent)
        .execute(app.store.pool())
        .await
        .unwrap();

    let response = app.send(&chat, &json!({"content": "hi"})).await;
    let (status, code) = error_code(response).await;
    assert_eq!((status, code.as_str()), (404, "not_found"));
    assert_eq!(bases(&app, "stale").await, 1.0);
    assert_eq!(app.provider.requests().len(), 1);
    assert_eq!(app.messages(&chat).await.len(), 2, "nothing was written");
}

/// What the model was sent on the `n`th request, as (role, text) pairs.
fn sent(app: &TestApp, n: usize) -> Vec<(String, String)> {
    let requests = app.provider.requests();
    requests[n].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let text = match &m["content"] {
                serde_json::Value::String(s) => s.clone(),
                blocks => blocks[0]["text"].as_str().unwrap().to_owned(),
            };
            (m["role"].as_str().unwrap().to_owned(), text)
        })
        .collect()
}

async fn say(app: &TestApp, chat: &str, content: &str, answer: &str) {
    app.provider.push(deltas(&[answer]));
    let response = app.send(chat, &json!({ "content": content })).await;
    assert_eq!(response.status(), 200);
    assert!(read_stream(response).await.1);
    app.settled().await;
}

fn pairs(said: &[(&str, &str)]) -> Vec<(String, String)> {
    said.iter()
        .map(|(r, t)| ((*r).to_owned(), (*t).to_owned()))
        .collect()
}

/// The kept history is followed by what was written since: each turn sends the whole
/// conversation, read from Postgres once.
#[tokio::test]
async fn a_kept_history_is_followed_by_the_messages_written_since() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("anthropic/claude-test", &[]).await;
    say(&app, &chat, "one", "1").await;
    say(&app, &chat, "two", "2").await;
    // Written by another replica meanwhile: the next intake reads it after the kept end.
    let other = app.second_replica().await;
    app.provider.push(deltas(&["3"]));
    let response = app
        .auth(app.http.post(format!("{other}/v1/chats/{chat}/messages")))
        .json(&json!({"content": "three"}))
        .send()
        .await
        .unwrap();
    assert!(read_stream(response).await.1);
    app.settled().await;
    say(&app, &chat, "four", "4").await;
    assert_eq!(
        sent(&app, 3),
        pairs(&[
            ("user", "one"),
            ("assistant", "1"),
            ("user", "two"),
            ("assistant", "2"),
            ("user", "three"),
            ("assistant", "3"),
            ("user", "four"),
        ])
    );
    assert_eq!(bases(&app, "stale").await, 0.0);
    assert_eq!(bases(&app, "kept").await, 2.0);
}

/// A message deleted behind the replica's back (retention, erasure, a failed turn's
/// message taken back by the replica that took the turn over) bumps its chat's version:
/// the kept history that holds it is found stale and never sent again.
#[tokio::test]
async fn a_message_deleted_elsewhere_leaves_the_kept_history() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("anthropic/claude-test", &[]).await;
    say(&app, &chat, "one", "1").await;
    say(&app, &chat, "two", "2").await;
    sqlx::query("DELETE FROM messages WHERE chat_id = $1::uuid AND role = 'assistant'")
        .bind(&chat)
        .execute(app.store.pool())
        .await
        .unwrap();
    say(&app, &chat, "three", "3").await;
    assert_eq!(
        sent(&app, 2),
        pairs(&[("user", "one"), ("user", "two"), ("user", "three")])
    );
    assert_eq!(bases(&app, "stale").await, 1.0);
}

/// A message committed late with an earlier `seq` than the kept history's end (two
/// writers of one chat at once, as when turns run without their hold) changes the count
/// the intake checks: it is found stale and the late message is read.
#[tokio::test]
async fn a_message_written_late_before_the_kept_end_is_read() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("anthropic/claude-test", &[]).await;
    let elsewhere = app.new_chat(&agent).await;
    say(&app, &chat, "one", "1").await;
    // Takes the next `seq`s, which `chat` then lacks.
    say(&app, &elsewhere, "aside", "a").await;
    say(&app, &chat, "two", "2").await;
    sqlx::query(
        "INSERT INTO messages (id, team_id, chat_id, turn_id, role, parts, status, seq)          OVERRIDING SYSTEM VALUE          SELECT gen_random_uuid(), team_id, $1::uuid, turn_id, 'user',                 '[{\"type\": \"text\", \"text\": \"late\"}]', 'complete', seq          FROM messages WHERE chat_id = $2::uuid AND role = 'user'",
    )
    .bind(&chat)
    .bind(&elsewhere)
    .execute(app.store.pool())
    .await
    .unwrap();
    say(&app, &chat, "three", "3").await;
    assert_eq!(
        sent(&app, 3),
        pairs(&[
            ("user", "one"),
            ("assistant", "1"),
            ("user", "late"),
            ("user", "two"),
            ("assistant", "2"),
            ("user", "three"),
        ])
    );
    assert_eq!(bases(&app, "stale").await, 1.0);
}
