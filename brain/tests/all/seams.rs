//! Authority where one principal's work is carried on by another: an approval's
//! continuation, an autostart, queued and background turns, memories.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::autostart::{db_now, polled_after, ticking};
use crate::common::replies::{call, calls, text};
use crate::common::{TestApp, key_with_scope, send_as};
use protocol::ui::UiChunk;
use serde_json::{Value, json};

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

/// An admin approving a chat key's `memory_write` lends the continuation nothing:
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

/// Per-second cadences allowed, polled often, so a test sees ticks in seconds.
fn fast(c: &mut engine::config::Config) {
    c.autostart.min_interval_secs = 1;
    c.autostart.poll = Duration::from_millis(50);
}

async fn plain_agent(app: &TestApp, name: &str) -> String {
    let created = app
        .post_json(
            "/v1/agents",
            &json!({"name": name, "system_prompt": "You are terse.", "model": "openai/gpt-test"}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let agent: Value = created.json().await.unwrap();
    agent["id"].as_str().unwrap().to_owned()
}

/// Sets (or clears) the agent's cadence as `bearer`: the response's status.
pub(crate) async fn set_cadence(
    app: &TestApp,
    bearer: &str,
    agent: &str,
    cron: Option<&str>,
) -> u16 {
    let body = match cron {
        Some(cron) => json!({"autostart_cron": cron, "autostart_prompt": "time to check"}),
        None => json!({"autostart_cron": null}),
    };
    app.http
        .patch(format!("{}/v1/agents/{agent}", app.url))
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The agent's recorded fires: (state, chat id, error code), oldest first.
async fn fires(app: &TestApp, agent: &str) -> Vec<(String, Option<String>, Option<String>)> {
    sqlx::query_as(
        "SELECT state, chat_id::text, error_code FROM scheduled_tasks \
         WHERE agent_id = $1::uuid AND state <> 'running' ORDER BY due_at",
    )
    .bind(agent)
    .fetch_all(app.store.pool())
    .await
    .unwrap()
}

async fn wait_fires(
    app: &TestApp,
    agent: &str,
    done: impl Fn(&[(String, Option<String>, Option<String>)]) -> bool,
) -> Vec<(String, Option<String>, Option<String>)> {
    for _ in 0..300 {
        let recorded = fires(app, agent).await;
        if done(&recorded) {
            return recorded;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("fires never got there: {:?}", fires(app, agent).await);
}

/// Lets the agent's per-second cadence fire until a tick is `fired`, then clears it: the
/// autostart chat that fire ran in.
async fn fired_once(app: &TestApp, agent: &str) -> String {
    for _ in 0..4 {
        app.provider.push(text("Checked."));
    }
    assert_eq!(
        set_cadence(app, &app.key, agent, Some("* * * * * *")).await,
        200
    );
    let recorded = wait_fires(app, agent, |f| f.iter().any(|f| f.0 == "fired")).await;
    assert_eq!(set_cadence(app, &app.key, agent, None).await, 200);
    app.settled().await;
    let fired = recorded.into_iter().find(|f| f.0 == "fired").unwrap();
    fired.1.unwrap()
}

async fn status_as(app: &TestApp, bearer: &str, method: reqwest::Method, path: &str) -> u16 {
    let mut request = app
        .http
        .request(method.clone(), format!("{}{path}", app.url))
        .bearer_auth(bearer);
    if method == reqwest::Method::POST {
        request = request.json(&json!({"content": "steer the admin's next fire"}));
    }
    request.send().await.unwrap().status().as_u16()
}

/// The autostart chat is the agent's own: a chat key neither lists, reads nor
/// writes it; an admin does.
#[tokio::test]
async fn only_admins_see_or_write_the_autostart_chat() {
    let app = TestApp::start_with(fast).await;
    let agent = plain_agent(&app, "cron").await;
    let chat = fired_once(&app, &agent).await;
    let (chat_key, _) = key_with_scope(&app, "chat").await;

    use reqwest::Method;
    let messages = format!("/v1/chats/{chat}/messages");
    assert_eq!(
        status_as(&app, &chat_key, Method::GET, &messages).await,
        404
    );
    assert_eq!(
        status_as(&app, &chat_key, Method::POST, &messages).await,
        404
    );
    assert_eq!(
        status_as(
            &app,
            &chat_key,
            Method::GET,
            &format!("/v1/chats/{chat}/approvals")
        )
        .await,
        404
    );
    let listed: Value = app
        .http
        .get(format!("{}/v1/agents/{agent}/chats", app.url))
        .bearer_auth(&chat_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(!listed.to_string().contains(&chat), "{listed}");
    // Nor does A2A list its turns as tasks.
    let tasks = |bearer: &str| {
        app.http
            .post(format!("{}/a2a/{agent}", app.url))
            .bearer_auth(bearer)
            .header("A2A-Version", "1.0")
            .json(&json!({"jsonrpc": "2.0", "id": 7, "method": "ListTasks", "params": {}}))
            .send()
    };
    let listed: Value = tasks(&chat_key).await.unwrap().json().await.unwrap();
    assert_eq!(listed["result"]["tasks"], json!([]), "{listed}");
    let listed: Value = tasks(&app.key).await.unwrap().json().await.unwrap();
    assert!(listed.to_string().contains(&chat), "{listed}");
    assert_eq!(status_as(&app, &app.key, Method::GET, &messages).await, 200);
    let listed: Value = app
        .get(&format!("/v1/agents/{agent}/chats"))
        .await
        .json()
        .await
        .unwrap();
    assert!(listed.to_string().contains(&chat), "{listed}");
}

/// The worker sessions (and snapshots) of the autostart chat are the agent's own too: a
/// chat key listing the agent's sessions does not see them; an admin does.
#[tokio::test]
async fn a_chat_key_lists_no_session_of_the_autostart_chat() {
    let app = TestApp::start_with(fast).await;
    let agent = plain_agent(&app, "cron").await;
    let chat = fired_once(&app, &agent).await;
    let session = app
        .store
        .create_session(&store::NewSession {
            team: app.team,
            agent: protocol::AgentId(agent.parse().unwrap()),
            chat: protocol::ChatId(chat.parse().unwrap()),
            profile: "default",
            speculative: false,
            user: None,
        })
        .await
        .unwrap();
    let session = session.id.0.to_string();
    let (chat_key, _) = key_with_scope(&app, "chat").await;
    let listed = |bearer: String| {
        let request = app
            .http
            .get(format!("{}/v1/agents/{agent}/sessions", app.url))
            .bearer_auth(bearer);
        async move {
            let answer = request.send().await.unwrap();
            assert_eq!(answer.status(), 200);
            answer.json::<Value>().await.unwrap().to_string()
        }
    };
    let seen = listed(chat_key).await;
    assert!(!seen.contains(&session) && !seen.contains(&chat), "{seen}");
    assert!(listed(app.key.clone()).await.contains(&session));
}

/// An erased autostart chat is replaced by a new one at the next fire, and an id
/// re-created since under another agent is never fired into.
#[tokio::test]
async fn an_erased_autostart_chat_is_replaced_at_the_next_fire() {
    let app = TestApp::start_with(fast).await;
    let agent = plain_agent(&app, "cron").await;
    let other = plain_agent(&app, "other").await;
    let erased = fired_once(&app, &agent).await;
    let response = app
        .auth(app.http.delete(format!("{}/v1/chats/{erased}", app.url)))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    // The erased id comes back as another agent's chat (as an AG-UI thread id can).
    sqlx::query("INSERT INTO chats (id, team_id, agent_id, title) SELECT $1::uuid, team_id, id, 'x' FROM agents WHERE id = $2::uuid")
        .bind(&erased)
        .bind(&other)
        .execute(app.store.pool())
        .await
        .unwrap();

    for _ in 0..4 {
        app.provider.push(text("Checked."));
    }
    let before = fires(&app, &agent).await.len();
    assert_eq!(
        set_cadence(&app, &app.key, &agent, Some("* * * * * *")).await,
        200
    );
    let after = wait_fires(&app, &agent, |f| {
        f.len() > before && f[before..].iter().any(|f| f.0 == "fired")
    })
    .await;
    assert_eq!(set_cadence(&app, &app.key, &agent, None).await, 200);
    app.settled().await;
    let fired = after[before..].iter().find(|f| f.0 == "fired").unwrap();
    let new_chat = fired.1.clone().unwrap();
    assert_ne!(new_chat, erased);
    let owner: (String, bool) =
        sqlx::query_as("SELECT agent_id::text, autostart FROM chats WHERE id = $1::uuid")
            .bind(&new_chat)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(owner, (agent.clone(), true));
    let in_other: i64 = sqlx::query_scalar("SELECT count(*) FROM turns WHERE chat_id = $1::uuid")
        .bind(&erased)
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(in_other, 0, "nothing fired into the other agent's chat");
}

/// A cadence set by an admin key whose key is revoked stops acting for it: the
/// next fire is `failed` with `setter_revoked` (the `autostart.failed` webhook event's
/// code, as every failed fire's), the cadence pauses (shown by the schedule), and an
/// admin's PATCH re-arms it.
#[tokio::test]
async fn a_revoked_setter_pauses_its_cadence_until_an_admin_re_arms_it() {
    let app = TestApp::start_with(fast).await;
    let agent = plain_agent(&app, "cron").await;
    let (admin_key, admin_id) = key_with_scope(&app, "admin").await;
    assert_eq!(
        set_cadence(&app, &admin_key, &agent, Some("* * * * * *")).await,
        200
    );
    let revoked = app
        .auth(app.http.delete(format!("{}/v1/keys/{admin_id}", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status(), 204);

    let recorded = wait_fires(&app, &agent, |f| !f.is_empty()).await;
    assert_eq!(
        recorded[0],
        (
            "failed".to_owned(),
            recorded[0].1.clone(),
            Some("setter_revoked".to_owned())
        )
    );
    let turns: i64 = sqlx::query_scalar("SELECT count(*) FROM turns WHERE agent_id = $1::uuid")
        .bind(&agent)
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(turns, 0, "no turn ran as the revoked key");
    let schedule: Value = app
        .get(&format!("/v1/agents/{agent}/schedule"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(schedule["paused"], "setter_revoked", "{schedule}");
    assert!(schedule["next_fire_at"].is_null(), "{schedule}");
    // Paused: no further fire, while the scheduler polls on.
    let control = ticking(&app, &app.key).await;
    polled_after(&app, &control, db_now(&app).await).await;
    assert_eq!(set_cadence(&app, &app.key, &control, None).await, 200);
    app.settled().await;
    assert_eq!(fires(&app, &agent).await.len(), 1);

    app.provider.push(text("Checked."));
    assert_eq!(
        set_cadence(&app, &app.key, &agent, Some("* * * * * *")).await,
        200
    );
    wait_fires(&app, &agent, |f| f.iter().any(|f| f.0 == "fired")).await;
    assert_eq!(set_cadence(&app, &app.key, &agent, None).await, 200);
    app.settled().await;
}

/// A background turn whose key is revoked ends `interrupted` with
/// `unauthorized` within seconds, as its open stream would have.
#[tokio::test]
async fn a_background_turn_ends_when_its_key_is_revoked() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (chat_key, chat_key_id) = key_with_scope(&app, "chat").await;
    held_in_background(&app, &chat_key, &chat).await;
    let revoked = app
        .auth(
            app.http
                .delete(format!("{}/v1/keys/{chat_key_id}", app.url)),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status(), 204);
    let ended = none_running(&app).await;
    app.provider.release_held();
    let turns = ended.expect("the turn outlived its key's revocation");
    assert_eq!(
        turns,
        vec![("interrupted".to_owned(), Some("unauthorized".to_owned()))]
    );
}

/// A background turn in `chat`, posted as `bearer`, whose model call is held until the
/// provider releases it.
async fn held_in_background(app: &TestApp, bearer: &str, chat: &str) {
    app.provider.push(scripted_provider::Reply::Held {
        delta: "working ".into(),
        every: Duration::from_millis(20),
    });
    let accepted = app
        .http
        .post(format!("{}/v1/chats/{chat}/messages", app.url))
        .bearer_auth(bearer)
        .json(&json!({"content": "take your time", "background": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
}

/// The turns once none runs, within five seconds: `None` if one still does.
async fn none_running(app: &TestApp) -> Option<Vec<(String, Option<String>)>> {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let turns = app.turns().await;
            if !turns.is_empty() && turns.iter().all(|(s, _)| s != "running") {
                return turns;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .ok()
}

/// A brain taking EdDSA user tokens signed with the fixture key.
pub(crate) async fn app_with_users() -> TestApp {
    app_with_users_and(|_| {}).await
}

/// [`app_with_users`], configured further by `tweak`.
async fn app_with_users_and(tweak: impl FnOnce(&mut engine::config::Config)) -> TestApp {
    use crate::auth::jwt;
    let config = engine::auth::JwtConfig::from_env(&envcfg::vars(&[
        ("BRAIN_JWT_ISSUER", jwt::ISSUER),
        ("BRAIN_JWT_AUDIENCE", jwt::AUDIENCE),
        (
            "BRAIN_JWT_PUBLIC_KEYS",
            include_str!("fixtures/jwt/ed.pub.pem"),
        ),
    ]))
    .unwrap()
    .unwrap();
    TestApp::start_with(move |c| {
        c.jwt = Some(config);
        tweak(c);
    })
    .await
}

/// A token of the app's team for end user `user`.
pub(crate) fn user_token(app: &TestApp, user: &str) -> String {
    use crate::auth::jwt;
    jwt::sign(
        &jwt::ed(),
        jsonwebtoken::Algorithm::EdDSA,
        None,
        &jwt::claims(app.team, user, json!({})),
    )
}

/// A chat of `agent` opened by `bearer`.
pub(crate) async fn chat_as(app: &TestApp, bearer: &str, agent: &str) -> String {
    let response = app
        .http
        .post(format!("{}/v1/agents/{agent}/chats", app.url))
        .bearer_auth(bearer)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let chat: Value = response.json().await.unwrap();
    chat["id"].as_str().unwrap().to_owned()
}

/// One turn as `bearer` in which the model makes `tool` with `args`: the call's output.
pub(crate) async fn tool_turn(
    app: &TestApp,
    bearer: &str,
    chat: &str,
    tool: &str,
    args: Value,
) -> String {
    app.provider.push(calls(vec![call("c", tool, args)]));
    app.provider.push(text("Done."));
    let chunks = send_as(app, bearer, chat, "go").await;
    chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::ToolOutputAvailable { output, .. } => Some(output.to_string()),
            UiChunk::ToolOutputError { error_text, .. } => Some(error_text.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool output: {chunks:?}"))
}

/// A memory written in an end user's chat is that user's: another user's turns
/// never recall it, the agent-wide ones (written in a key's chat) every user's do, and
/// `DELETE /v1/users/{sub}` erases the user's chats and memories, nothing else.
#[tokio::test]
async fn memories_belong_to_their_end_user_and_go_with_them() {
    let app = app_with_users().await;
    let (agent, key_chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (alice, bob) = (user_token(&app, "alice"), user_token(&app, "bob"));
    let alice_chat = chat_as(&app, &alice, &agent).await;
    let bob_chat = chat_as(&app, &bob, &agent).await;

    let note = json!({"content": "alice's vault code is 4711"});
    tool_turn(&app, &alice, &alice_chat, "memory_write", note).await;
    let team_note = json!({"content": "the team's vault is in building nine"});
    tool_turn(&app, &app.key, &key_chat, "memory_write", team_note).await;

    let query = json!({"query": "vault"});
    let found = tool_turn(&app, &bob, &bob_chat, "memory_search", query.clone()).await;
    assert!(!found.contains("4711"), "bob recalls alice's note: {found}");
    assert!(found.contains("building nine"), "{found}");
    let found = tool_turn(&app, &alice, &alice_chat, "memory_search", query.clone()).await;
    assert!(
        found.contains("4711") && found.contains("building nine"),
        "{found}"
    );
    let found = tool_turn(&app, &app.key, &key_chat, "memory_search", query.clone()).await;
    assert!(
        !found.contains("4711"),
        "a key's chat recalls a user's note: {found}"
    );

    // Only an admin erases a user.
    let erase = |bearer: String| {
        let request = app
            .http
            .delete(format!("{}/v1/users/alice", app.url))
            .bearer_auth(bearer);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(erase(bob.clone()).await, 403);
    assert_eq!(erase(app.key.clone()).await, 204);
    let left: Vec<(Option<String>,)> =
        sqlx::query_as("SELECT user_id FROM memories ORDER BY created_at")
            .fetch_all(app.store.pool())
            .await
            .unwrap();
    assert_eq!(left, vec![(None,)], "only the agent-wide note is left");
    let chats: Vec<(String,)> = sqlx::query_as("SELECT id::text FROM chats ORDER BY created_at")
        .fetch_all(app.store.pool())
        .await
        .unwrap();
    assert!(!chats.iter().any(|(c,)| *c == alice_chat), "{chats:?}");
    assert!(chats.iter().any(|(c,)| *c == bob_chat), "{chats:?}");
    let audit: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'user.erased' AND object_id = 'alice'",
    )
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(audit, 1);
}

/// `409 agent_busy` names the running turn only to whom may read it: the user
/// whose chat runs it, not another user of the team.
#[tokio::test]
async fn agent_busy_names_the_running_turn_only_to_whom_may_read_it() {
    let app = app_with_users().await;
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (alice, bob) = (user_token(&app, "alice"), user_token(&app, "bob"));
    let alice_chat = chat_as(&app, &alice, &agent).await;
    let bob_chat = chat_as(&app, &bob, &agent).await;
    held_in_background(&app, &alice, &alice_chat).await;
    let post = |bearer: &str, chat: &str| {
        app.http
            .post(format!("{}/v1/chats/{chat}/messages", app.url))
            .bearer_auth(bearer)
            .json(&json!({"content": "me too", "if_busy": "reject"}))
            .send()
    };
    let theirs = post(&bob, &bob_chat).await.unwrap();
    assert_eq!(theirs.status(), 409);
    let theirs: Value = theirs.json().await.unwrap();
    assert_eq!(theirs["error"]["code"], "agent_busy", "{theirs}");
    assert!(theirs["error"].get("turn_id").is_none(), "{theirs}");
    let own = post(&alice, &alice_chat).await.unwrap();
    assert_eq!(own.status(), 409);
    let own: Value = own.json().await.unwrap();
    assert!(own["error"]["turn_id"].is_string(), "{own}");
    app.provider.release_held();
    app.settled().await;
}

/// One principal cannot fill an agent's queue for everyone: past its share its
/// next message is `429 queue_full`, while another principal's still waits its turn.
#[tokio::test]
async fn one_principal_cannot_fill_the_agents_queue() {
    let app = TestApp::start_with(|c| {
        c.queue_max_per_agent = 4;
        c.queue_max_per_principal = 2;
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(scripted_provider::Reply::Held {
        delta: "working ".into(),
        every: Duration::from_millis(20),
    });
    let running = app
        .send(
            &chat,
            &json!({"content": "take your time", "background": true}),
        )
        .await;
    assert_eq!(running.status(), 202);
    let (greedy, _) = key_with_scope(&app, "chat").await;
    let (other, _) = key_with_scope(&app, "chat").await;
    let enqueue = |bearer: &str| {
        app.http
            .post(format!("{}/v1/chats/{chat}/messages", app.url))
            .bearer_auth(bearer)
            .json(&json!({"content": "after you", "if_busy": "enqueue"}))
            .send()
    };
    for _ in 0..2 {
        assert_eq!(enqueue(&greedy).await.unwrap().status(), 202);
    }
    let refused = enqueue(&greedy).await.unwrap();
    assert_eq!(refused.status(), 429);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["error"]["code"], "queue_full", "{refused}");
    assert_eq!(enqueue(&other).await.unwrap().status(), 202);
    for _ in 0..3 {
        app.provider.push(text("Next."));
    }
    app.provider.release_held();
    turns_ended(&app, 4).await;
}

/// `PATCH /v1/users/{user}` as the app's admin: the user as answered.
async fn set_disabled(app: &TestApp, user: &str, disabled: bool) -> Value {
    let response = app
        .auth(app.http.patch(format!("{}/v1/users/{user}", app.url)))
        .json(&json!({ "disabled": disabled }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// A token of the app's team for end user `user`, with the admin claim `admin`.
fn token_with_admin(app: &TestApp, user: &str, admin: bool) -> String {
    use crate::auth::jwt;
    jwt::sign(
        &jwt::ed(),
        jsonwebtoken::Algorithm::EdDSA,
        None,
        &jwt::claims(app.team, user, json!({"admin": admin})),
    )
}

/// An admin disables an end user (the brain asks no issuer): the user's tokens are refused
/// with `user_disabled`, their background turn ends `interrupted` as a revoked key's does,
/// another user goes on; enabled again, they are let in.
#[tokio::test]
async fn a_disabled_users_tokens_are_refused_and_their_detached_turn_ends() {
    let app = app_with_users().await;
    let (alice, bob) = (user_token(&app, "alice"), user_token(&app, "bob"));
    let agent = plain_agent(&app, "helper").await;
    let chat = chat_as(&app, &alice, &agent).await;
    held_in_background(&app, &alice, &chat).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while app.turns().await.iter().all(|(s, _)| s != "running") {
        assert!(std::time::Instant::now() < deadline, "the turn never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let disabled = set_disabled(&app, "alice", true).await;
    assert_eq!(disabled["disabled"], true, "{disabled}");
    let ended = none_running(&app).await;
    app.provider.release_held();
    assert_eq!(
        ended.expect("the turn outlived its user's disabling"),
        vec![("interrupted".to_owned(), Some("unauthorized".to_owned()))]
    );
    let refused = app
        .http
        .get(format!("{}/v1/chats/{chat}/messages", app.url))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(
        crate::common::error_code(refused).await,
        (403, "user_disabled".to_owned())
    );
    assert_eq!(
        status_as(&app, &bob, reqwest::Method::GET, "/v1/whoami").await,
        200
    );
    let shown: Value = app.get("/v1/users/alice").await.json().await.unwrap();
    assert_eq!(
        (&shown["disabled"], &shown["admin"]),
        (&json!(true), &json!(false))
    );

    let enabled = set_disabled(&app, "alice", false).await;
    assert_eq!(enabled["disabled"], false, "{enabled}");
    assert_eq!(
        status_as(
            &app,
            &alice,
            reqwest::Method::GET,
            &format!("/v1/chats/{chat}/messages")
        )
        .await,
        200
    );
    let audited: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM audit_log WHERE object_id = 'alice' ORDER BY created_at",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    assert_eq!(audited, ["user.disabled", "user.enabled"]);
}

/// A cadence set by a user with the admin claim pauses `setter_revoked` once a token of
/// theirs is seen without it (they lost admin at the issuer), as a revoked key's does.
#[tokio::test]
async fn a_setter_seen_without_admin_since_pauses_their_cadence() {
    let app = app_with_users_and(fast).await;
    let agent = plain_agent(&app, "cron").await;
    let carol = token_with_admin(&app, "carol", true);
    assert_eq!(
        set_cadence(&app, &carol, &agent, Some("0 0 1 1 *")).await,
        200
    );
    // Carol's next token lacks the claim: the brain records it.
    let demoted = token_with_admin(&app, "carol", false);
    assert_eq!(
        status_as(&app, &demoted, reqwest::Method::GET, "/v1/whoami").await,
        200
    );
    assert_eq!(
        set_cadence(&app, &demoted, &agent, Some("* * * * * *")).await,
        403,
        "no longer an admin"
    );
    // Due now: the fire finds its setter no longer standing.
    sqlx::query("UPDATE agents SET autostart_next_fire_at = now() WHERE id = $1::uuid")
        .bind(&agent)
        .execute(app.store.pool())
        .await
        .unwrap();
    let recorded = wait_fires(&app, &agent, |f| !f.is_empty()).await;
    assert_eq!(
        recorded[0].2.as_deref(),
        Some("setter_revoked"),
        "{recorded:?}"
    );
    let schedule: Value = app
        .get(&format!("/v1/agents/{agent}/schedule"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(schedule["paused"], "setter_revoked", "{schedule}");
}
