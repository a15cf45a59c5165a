//! Memory people can trust (M3, M4, M5): memories recalled into each turn's prompt within
//! their scope, listed, changed and deleted by whom they belong to, and past chats found
//! by their messages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::replies::text;
use crate::common::{TestApp, send_as};
use crate::seams::{app_with_users, chat_as, tool_turn, user_token};
use serde_json::{Value, json};

/// The messages of the model request the last turn made, as one JSON text per message.
fn last_request_messages(app: &TestApp) -> Vec<String> {
    let request = app.provider.requests().pop().expect("a model request");
    request.body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(Value::to_string)
        .collect()
}

/// A turn as `bearer` in `chat` saying `content`, answered "Ok.": the model request's
/// messages.
async fn asked(app: &TestApp, bearer: &str, chat: &str, content: &str) -> Vec<String> {
    app.provider.push(text("Ok."));
    send_as(app, bearer, chat, content).await;
    last_request_messages(app)
}

/// Alice's note and the agent's own, written through the tool; the agent's id, and
/// alice's and bob's chats and tokens.
struct Noted {
    agent: String,
    alice: String,
    alice_chat: String,
    bob: String,
    bob_chat: String,
}

async fn noted(app: &TestApp) -> Noted {
    let (agent, key_chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (alice, bob) = (user_token(app, "alice"), user_token(app, "bob"));
    let alice_chat = chat_as(app, &alice, &agent).await;
    let bob_chat = chat_as(app, &bob, &agent).await;
    let note = json!({"content": "alice's vault code is 4711"});
    tool_turn(app, &alice, &alice_chat, "memory_write", note).await;
    let team_note = json!({"content": "the team's vault is in building nine"});
    tool_turn(app, &app.key, &key_chat, "memory_write", team_note).await;
    Noted {
        agent,
        alice,
        alice_chat,
        bob,
        bob_chat,
    }
}

/// Each turn's request carries the memories of its scope just before the user's message:
/// the agent's own and the chat owner's, never another user's; a message that shares no
/// word with them still recalls the newest.
#[tokio::test]
async fn recall_puts_the_scopes_memories_into_the_prompt_and_never_another_users() {
    let app = app_with_users().await;
    let n = noted(&app).await;

    let messages = asked(&app, &n.bob, &n.bob_chat, "where is the vault?").await;
    let all = messages.join("\n");
    assert!(all.contains("building nine"), "{all}");
    assert!(
        !all.contains("4711"),
        "bob's prompt recalls alice's note: {all}"
    );
    let recalled = messages
        .iter()
        .position(|m| m.contains("Memories recalled"))
        .expect("a recalled block");
    let asked_at = messages
        .iter()
        .rposition(|m| m.contains("where is the vault?"))
        .unwrap();
    assert_eq!(recalled + 1, asked_at, "just before the user's message");
    assert_eq!(asked_at, messages.len() - 1, "{messages:?}");

    // A new chat of alice's: a greeting matches no word, the newest notes come anyway.
    let fresh = chat_as(&app, &n.alice, &n.agent).await;
    let all = asked(&app, &n.alice, &fresh, "hello there")
        .await
        .join("\n");
    assert!(
        all.contains("4711") && all.contains("building nine"),
        "{all}"
    );

    // A key's chat recalls only the agent's own.
    let key_chat = app.new_chat(&n.agent).await;
    let all = asked(&app, &app.key, &key_chat, "the vault?")
        .await
        .join("\n");
    assert!(
        all.contains("building nine") && !all.contains("4711"),
        "{all}"
    );
}

/// `memory_recall: "off"` leaves the prompt without memories; anything but `auto` or `off`
/// is refused.
#[tokio::test]
async fn recall_off_leaves_the_prompt_without_memories() {
    let app = app_with_users().await;
    let n = noted(&app).await;
    let patch = |body: Value| {
        app.http
            .patch(format!("{}/v1/agents/{}", app.url, n.agent))
            .bearer_auth(&app.key)
            .json(&body)
            .send()
    };
    let refused = patch(json!({"memory_recall": "sometimes"})).await.unwrap();
    assert_eq!(refused.status(), 400);
    let off = patch(json!({"memory_recall": "off"})).await.unwrap();
    assert_eq!(off.status(), 200);
    let agent: Value = off.json().await.unwrap();
    assert_eq!(agent["memory_recall"], "off");

    // Fresh chats: alice's first one holds the note in its history.
    let fresh = chat_as(&app, &n.alice, &n.agent).await;
    let all = asked(&app, &n.alice, &fresh, "my vault code?")
        .await
        .join("\n");
    assert!(
        !all.contains("Memories recalled") && !all.contains("building nine"),
        "{all}"
    );
    // The first turns (before the switch) wrote and recalled; it is the switch that ends it.
    let on = patch(json!({"memory_recall": "auto"})).await.unwrap();
    assert_eq!(on.status(), 200);
    let fresh = chat_as(&app, &n.alice, &n.agent).await;
    let all = asked(&app, &n.alice, &fresh, "my vault code?")
        .await
        .join("\n");
    assert!(all.contains("4711"), "{all}");
}

/// `GET` of the agent's memories as `bearer`, `?` query included in `query`.
async fn listed(app: &TestApp, bearer: &str, agent: &str, query: &str) -> (u16, Value) {
    let response = app
        .http
        .get(format!("{}/v1/agents/{agent}/memories{query}", app.url))
        .bearer_auth(bearer)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn contents(page: &Value) -> Vec<String> {
    page["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect()
}

/// An admin manages every memory of the agent, an end user only their own, a chat key
/// lists the agent's own and changes none; another team's caller finds nothing. Changes
/// are audited, and what a person fixed or deleted is what later turns recall.
#[tokio::test]
async fn memories_are_listed_changed_and_deleted_by_whom_they_belong_to() {
    let app = app_with_users().await;
    let n = noted(&app).await;

    let (status, all) = listed(&app, &app.key, &n.agent, "").await;
    assert_eq!(status, 200);
    assert_eq!(
        contents(&all),
        [
            "the team's vault is in building nine",
            "alice's vault code is 4711"
        ]
    );
    let alices = all["memories"][1].clone();
    assert_eq!(alices["user_id"], "alice");
    assert_eq!(alices["chat_id"], n.alice_chat.as_str(), "{alices}");
    assert!(alices["turn_id"].is_string() && alices["created_at"].is_string());
    assert!(all["memories"][0]["user_id"].is_null());
    let (alices_id, teams_id) = (
        alices["id"].as_str().unwrap().to_owned(),
        all["memories"][0]["id"].as_str().unwrap().to_owned(),
    );
    // Paged like every listing.
    let (_, first) = listed(&app, &app.key, &n.agent, "?limit=1").await;
    assert_eq!(contents(&first), ["the team's vault is in building nine"]);
    let cursor = first["next_cursor"].as_str().unwrap();
    let (_, second) = listed(
        &app,
        &app.key,
        &n.agent,
        &format!("?limit=1&cursor={cursor}"),
    )
    .await;
    assert_eq!(contents(&second), ["alice's vault code is 4711"]);
    assert!(second.get("next_cursor").is_none());

    let (_, own) = listed(&app, &n.alice, &n.agent, "").await;
    assert_eq!(contents(&own), ["alice's vault code is 4711"]);
    let (_, none) = listed(&app, &n.bob, &n.agent, "").await;
    assert!(contents(&none).is_empty(), "{none}");
    let (chat_key, _) = crate::common::key_with_scope(&app, "chat").await;
    let (_, agents_own) = listed(&app, &chat_key, &n.agent, "").await;
    assert_eq!(
        contents(&agents_own),
        ["the team's vault is in building nine"]
    );

    let change = |bearer: &str, id: &str, content: &str| {
        app.http
            .patch(format!("{}/v1/memories/{id}", app.url))
            .bearer_auth(bearer)
            .json(&json!({ "content": content }))
            .send()
    };
    let delete = |bearer: &str, id: &str| {
        app.http
            .delete(format!("{}/v1/memories/{id}", app.url))
            .bearer_auth(bearer)
            .send()
    };
    let status = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(status(change(&n.bob, &alices_id, "x").await.unwrap()), 404);
    assert_eq!(status(delete(&n.bob, &alices_id).await.unwrap()), 404);
    assert_eq!(status(change(&n.alice, &teams_id, "x").await.unwrap()), 404);
    assert_eq!(
        status(change(&chat_key, &teams_id, "x").await.unwrap()),
        403
    );
    assert_eq!(status(delete(&chat_key, &teams_id).await.unwrap()), 403);
    assert_eq!(
        status(change(&n.alice, &alices_id, "  ").await.unwrap()),
        400
    );

    let fixed = change(&n.alice, &alices_id, "alice's vault code is 1234")
        .await
        .unwrap();
    assert_eq!(fixed.status(), 200);
    let fixed: Value = fixed.json().await.unwrap();
    assert_eq!(fixed["content"], "alice's vault code is 1234");
    let fresh = chat_as(&app, &n.alice, &n.agent).await;
    let all_text = asked(&app, &n.alice, &fresh, "my vault code?")
        .await
        .join("\n");
    assert!(
        all_text.contains("1234") && !all_text.contains("4711"),
        "{all_text}"
    );

    // Another team's admin finds neither the agent nor its memories.
    let other = app.store.create_team("other").await.unwrap();
    let (status_other, _) = listed(&app, &other.api_key, &n.agent, "").await;
    assert_eq!(status_other, 404);
    assert_eq!(
        status(change(&other.api_key, &teams_id, "x").await.unwrap()),
        404
    );
    assert_eq!(
        status(delete(&other.api_key, &teams_id).await.unwrap()),
        404
    );

    assert_eq!(status(delete(&n.alice, &alices_id).await.unwrap()), 204);
    assert_eq!(status(delete(&app.key, &teams_id).await.unwrap()), 204);
    let (_, left) = listed(&app, &app.key, &n.agent, "").await;
    assert!(contents(&left).is_empty(), "{left}");
    let fresh = chat_as(&app, &n.alice, &n.agent).await;
    let all_text = asked(&app, &n.alice, &fresh, "my vault code?")
        .await
        .join("\n");
    assert!(!all_text.contains("Memories recalled"), "{all_text}");

    let audit: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT action, actor_kind, object_id FROM audit_log \
         WHERE action LIKE 'memory.%' ORDER BY created_at",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    assert_eq!(
        audit,
        [
            ("memory.updated".into(), "user".into(), alices_id.clone()),
            ("memory.deleted".into(), "user".into(), alices_id),
            ("memory.deleted".into(), "key".into(), teams_id),
        ]
    );
}

/// Erasing an end user takes their memories from the listing and from every recall.
#[tokio::test]
async fn erasing_a_user_takes_their_memories() {
    let app = app_with_users().await;
    let n = noted(&app).await;
    let erased = app
        .http
        .delete(format!("{}/v1/users/alice", app.url))
        .bearer_auth(&app.key)
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 204);
    let (_, left) = listed(&app, &app.key, &n.agent, "").await;
    assert_eq!(contents(&left), ["the team's vault is in building nine"]);
    let fresh = chat_as(&app, &n.alice, &n.agent).await;
    let all = asked(&app, &n.alice, &fresh, "my vault code?")
        .await
        .join("\n");
    assert!(
        !all.contains("4711") && all.contains("building nine"),
        "{all}"
    );
}

/// `GET /v1/agents/{id}/chats?q=` finds chats by their messages within what the caller may
/// read, and `chat_search` finds the agent's earlier chats with the same person only.
#[tokio::test]
async fn past_chats_are_found_by_their_messages_within_what_the_caller_may_read() {
    let app = app_with_users().await;
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (alice, bob) = (user_token(&app, "alice"), user_token(&app, "bob"));
    let trip = chat_as(&app, &alice, &agent).await;
    asked(
        &app,
        &alice,
        &trip,
        "we planned the trip to Lyon for spring",
    )
    .await;
    let groceries = chat_as(&app, &alice, &agent).await;
    asked(&app, &alice, &groceries, "milk, eggs and bread").await;
    let bobs = chat_as(&app, &bob, &agent).await;
    asked(&app, &bob, &bobs, "my own trip to Lyon is a secret").await;

    let search = |bearer: &str, q: &str| {
        app.http
            .get(format!(
                "{}/v1/agents/{agent}/chats?q={}",
                app.url,
                q.replace(' ', "%20")
            ))
            .bearer_auth(bearer)
            .send()
    };
    let ids = |page: &Value| -> Vec<String> {
        page["chats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let found: Value = search(&alice, "lyon").await.unwrap().json().await.unwrap();
    assert_eq!(ids(&found), std::slice::from_ref(&trip), "{found}");
    let snippet = found["chats"][0]["snippet"].as_str().unwrap();
    assert!(snippet.contains("Lyon"), "{snippet}");
    let found: Value = search(&app.key, "trip Lyon")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ids(&found), [bobs.clone(), trip.clone()], "{found}");
    let found: Value = search(&app.key, "trip -secret")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ids(&found), std::slice::from_ref(&trip), "{found}");
    assert_eq!(search(&alice, " ").await.unwrap().status(), 400);
    let plain: Value = app
        .get(&format!("/v1/agents/{agent}/chats"))
        .await
        .json()
        .await
        .unwrap();
    assert!(plain["chats"][0].get("snippet").is_none(), "{plain}");

    let fresh = chat_as(&app, &alice, &agent).await;
    let output = tool_turn(
        &app,
        &alice,
        &fresh,
        "chat_search",
        json!({"query": "Lyon"}),
    )
    .await;
    assert!(output.contains(&trip), "{output}");
    assert!(
        !output.contains(&bobs) && !output.contains("secret"),
        "{output}"
    );
    let output = tool_turn(&app, &bob, &bobs, "chat_search", json!({"query": "milk"})).await;
    assert!(output.contains("no earlier chat matches"), "{output}");
}

/// The web chat's panel lists what the agent remembers and deletes one for good (a real
/// Chromium through tests/web/memories.mjs).
#[tokio::test]
async fn a_person_deletes_a_memory_in_the_page() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    for note in ["likes green tea", "lives in Lyon"] {
        tool_turn(
            &app,
            &app.key,
            &chat,
            "memory_write",
            json!({ "content": note }),
        )
        .await;
    }
    let name: Value = app
        .get(&format!("/v1/agents/{agent}"))
        .await
        .json()
        .await
        .unwrap();
    let run = tokio::time::timeout(
        std::time::Duration::from_secs(180),
        tokio::process::Command::new("node")
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/web/memories.mjs"))
            .arg(&app.url)
            .arg(&app.key)
            .arg(name["name"].as_str().unwrap())
            .arg("likes green tea")
            .arg("lives in Lyon")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser ends within three minutes")
    .expect("node runs (scripts/test-deps.sh installs tests/web)");
    assert!(
        run.status.success(),
        "the page did not delete the memory:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let left: Vec<(String,)> = sqlx::query_as("SELECT content FROM memories")
        .fetch_all(app.store.pool())
        .await
        .unwrap();
    assert_eq!(left, [("lives in Lyon".to_owned(),)]);
}

/// An agent without memories costs a turn no round trip: a scope a recall found empty is
/// taken as empty for a while (a note slipped into the table behind the store's back is
/// not seen), until a `memory_write` through this store clears it.
#[tokio::test]
async fn a_scope_found_empty_is_not_asked_again_until_a_note_is_written() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let agent = protocol::AgentId(agent.parse().unwrap());
    let recall = || {
        app.store
            .recall_memories(app.team, agent, None, "tea", 4000, 8)
    };
    assert!(recall().await.unwrap().is_empty());
    sqlx::query(
        "INSERT INTO memories (id, team_id, agent_id, content) VALUES ($1, $2, $3, 'green tea')",
    )
    .bind(uuid::Uuid::now_v7())
    .bind(app.team.0)
    .bind(agent.0)
    .execute(app.store.pool())
    .await
    .unwrap();
    assert!(
        recall().await.unwrap().is_empty(),
        "the empty scope was asked again"
    );

    tool_turn(
        &app,
        &app.key,
        &chat,
        "memory_write",
        json!({"content": "black tea too"}),
    )
    .await;
    let notes = recall().await.unwrap();
    assert!(
        notes.contains(&"green tea".to_owned()) && notes.contains(&"black tea too".to_owned()),
        "{notes:?}"
    );
}
