//! Chat channels (P10) and their delivery router (P11) against a scripted Telegram Bot API
//! server (`common::telegram`: a chat platform cannot run here): the webhook registered
//! with a secret, an update refused without it, a redelivery run once, a long answer cut
//! under the limit, a failing send retried to one delivery, a replica killed mid-delivery,
//! a person not allowed refused, another team's channel out of reach.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use engine::config::Config;
use serde_json::{Value, json};
use store::SecretsKey;

use crate::common::replies::text;
use crate::common::telegram::{Call, ScriptedTelegram};
use crate::common::{BrainProcess, TestApp};
use crate::webhooks::KEY_HEX;

const ALLOWED: i64 = 1001;
const WAIT: Duration = Duration::from_secs(30);

fn fast(c: &mut Config) {
    c.secrets_key = Some(SecretsKey::parse(KEY_HEX).unwrap());
    c.webhooks.allow_private_networks = true;
    c.webhooks.poll = Duration::from_millis(50);
}

/// An agent with a Telegram channel at `tg`: the channel's id.
async fn channel(app: &TestApp, tg: &ScriptedTelegram) -> (String, String) {
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let created = app
        .post_json(
            &format!("/v1/agents/{agent}/channels"),
            &json!({"kind": "telegram", "bot_token": "123:secret-bot-token",
                    "allowed_users": [ALLOWED.to_string()], "api_base": tg.url}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    assert!(created.get("bot_token").is_none(), "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let hook = &tg.calls("setWebhook")[0];
    assert_eq!(hook.token, "123:secret-bot-token");
    assert_eq!(hook.body["url"], created["webhook_url"]);
    assert!(
        created["webhook_url"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/v1/channels/{id}/telegram"))
    );
    (agent, id)
}

async fn update(
    app: &TestApp,
    channel: &str,
    secret: &str,
    update_id: i64,
    from: i64,
    text: &str,
) -> u16 {
    let body = json!({
        "update_id": update_id,
        "message": {"message_id": update_id, "date": 0, "text": text,
                    "chat": {"id": 42, "type": "private"},
                    "from": {"id": from, "is_bot": false, "first_name": "Ada"}},
    });
    app.http
        .post(format!("{}/v1/channels/{channel}/telegram", app.url))
        .header("X-Telegram-Bot-Api-Secret-Token", secret)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn turns_of(app: &TestApp, channel: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM turns t JOIN channel_chats c ON c.chat_id = t.chat_id \
         WHERE c.channel_id = $1::uuid",
    )
    .bind(channel)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    n
}

fn sends(calls: &[Call]) -> Vec<&Call> {
    calls.iter().filter(|c| c.method == "sendMessage").collect()
}

/// The reply's delivery once it is no longer `pending`: the platform records a send before
/// the brain records its outcome, so a test that saw the send waits for the row.
async fn settled_delivery(app: &TestApp, channel: &str) -> (String, i32) {
    let settled = async {
        loop {
            let (state, attempts) = delivery_state(app, channel).await;
            if state != "pending" {
                return (state, attempts);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(WAIT, settled).await.unwrap()
}

async fn delivery_state(app: &TestApp, channel: &str) -> (String, i32) {
    let (state, attempts): (String, i32) = sqlx::query_as(
        "SELECT state, attempts FROM webhook_deliveries WHERE channel_id = $1::uuid \
         AND event = 'channel.reply'",
    )
    .bind(channel)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    (state, attempts)
}

#[tokio::test]
async fn an_update_runs_once_and_a_bad_secret_runs_nothing() {
    let app = TestApp::start_with(fast).await;
    let tg = ScriptedTelegram::start().await;
    let (_, id) = channel(&app, &tg).await;
    let secret = tg.secret_token();

    assert_eq!(update(&app, &id, "wrong", 1, ALLOWED, "hi").await, 401);
    assert_eq!(update(&app, &id, "", 1, ALLOWED, "hi").await, 401);
    assert_eq!(turns_of(&app, &id).await, 0);

    app.provider.push(text("Hello **Ada** <3"));
    assert_eq!(update(&app, &id, &secret, 7, ALLOWED, "hi").await, 200);
    // Telegram delivers the same update again (it saw no answer in time).
    assert_eq!(update(&app, &id, &secret, 7, ALLOWED, "hi").await, 200);
    tg.wait_until(WAIT, |calls, _| !sends(calls).is_empty())
        .await;
    let sent = tg.calls("sendMessage");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].body["chat_id"], "42");
    assert_eq!(sent[0].body["text"], "Hello <b>Ada</b> &lt;3");
    assert_eq!(sent[0].body["parse_mode"], "HTML");
    assert_eq!(turns_of(&app, &id).await, 1);
    assert_eq!(settled_delivery(&app, &id).await.0, "delivered");
    // The chat's end user is the Telegram person.
    let (owner,): (Option<String>,) = sqlx::query_as(
        "SELECT h.created_by FROM chats h JOIN channel_chats c ON c.chat_id = h.id \
         WHERE c.channel_id = $1::uuid",
    )
    .bind(&id)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(owner.as_deref(), Some("telegram:1001"));
    // "typing…" was shown in the conversation while the turn ran.
    tg.wait_until(WAIT, |calls, _| {
        calls
            .iter()
            .any(|c| c.method == "sendChatAction" && c.body["chat_id"] == "42")
    })
    .await;
}

#[tokio::test]
async fn a_long_answer_arrives_whole_in_parts_under_the_limit() {
    let app = TestApp::start_with(fast).await;
    let tg = ScriptedTelegram::start().await;
    let (_, id) = channel(&app, &tg).await;
    let secret = tg.secret_token();
    let sentence = "Every sentence of this long answer counts, and none may be lost. ";
    let answer = sentence.repeat(9000 / sentence.len() + 1);
    assert!(answer.chars().count() >= 9000);
    app.provider.push(text(&answer));
    assert_eq!(update(&app, &id, &secret, 1, ALLOWED, "tell me").await, 200);
    tg.wait_until(WAIT, |calls, _| sends(calls).len() >= 3)
        .await;
    assert_eq!(settled_delivery(&app, &id).await.0, "delivered");
    let parts: Vec<String> = tg
        .calls("sendMessage")
        .iter()
        .map(|c| c.body["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        parts.len(),
        3,
        "{:?}",
        parts.iter().map(String::len).collect::<Vec<_>>()
    );
    assert!(parts.iter().all(|p| p.chars().count() <= 4096));
    // Each cut ends a sentence, and together they are the answer.
    assert!(parts.iter().all(|p| p.ends_with('.')));
    assert_eq!(parts.join(" "), answer.trim());
}

#[tokio::test]
async fn a_send_failing_twice_lands_once() {
    let app = TestApp::start_with(fast).await;
    let tg = ScriptedTelegram::start().await;
    let (_, id) = channel(&app, &tg).await;
    let secret = tg.secret_token();
    tg.fail_sends(2);
    app.provider.push(text("third time lucky"));
    assert_eq!(update(&app, &id, &secret, 1, ALLOWED, "hi").await, 200);
    tg.wait_until(WAIT, |calls, _| !sends(calls).is_empty())
        .await;
    let (state, attempts) = settled_delivery(&app, &id).await;
    assert_eq!((state.as_str(), attempts), ("delivered", 3));
    assert_eq!(tg.calls("sendMessage").len(), 1);
    let (errors,): (Vec<Option<String>>,) = sqlx::query_as(
        "SELECT array_agg(a.error ORDER BY a.attempt) FROM webhook_attempts a \
         JOIN webhook_deliveries d ON d.id = a.delivery_id WHERE d.channel_id = $1::uuid",
    )
    .bind(&id)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(
        errors,
        [
            Some("server_error".to_owned()),
            Some("server_error".to_owned()),
            None
        ]
    );
}

#[tokio::test]
async fn a_person_not_allowed_is_refused_once_and_runs_nothing() {
    let app = TestApp::start_with(fast).await;
    let tg = ScriptedTelegram::start().await;
    let (_, id) = channel(&app, &tg).await;
    let secret = tg.secret_token();
    for update_id in 1..=3 {
        assert_eq!(
            update(&app, &id, &secret, update_id, 666, "let me in").await,
            200
        );
    }
    tg.wait_until(WAIT, |calls, _| !sends(calls).is_empty())
        .await;
    // The delivery loop runs every 50 ms; a second refusal would be written by now (it is
    // written at the update, not by the loop).
    let (notices,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM webhook_deliveries WHERE channel_id = $1::uuid")
            .bind(&id)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(notices, 1);
    let sent = tg.calls("sendMessage");
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0].body["text"]
            .as_str()
            .unwrap()
            .contains("not allowed")
    );
    assert_eq!(turns_of(&app, &id).await, 0);
}

#[tokio::test]
async fn another_teams_channel_is_out_of_reach() {
    let app = TestApp::start_with(fast).await;
    let tg = ScriptedTelegram::start().await;
    let (agent, id) = channel(&app, &tg).await;
    let other = app.store.create_team("other").await.unwrap().api_key;
    for (method, path) in [
        ("GET", format!("/v1/agents/{agent}/channels/{id}")),
        ("DELETE", format!("/v1/agents/{agent}/channels/{id}")),
    ] {
        let response = app
            .http
            .request(method.parse().unwrap(), format!("{}{path}", app.url))
            .bearer_auth(&other)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{method} {path}");
    }
    let listed: Value = app
        .get(&format!("/v1/agents/{agent}/channels"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["channels"].as_array().unwrap().len(), 1);
    assert!(listed.to_string().find("secret-bot-token").is_none());
    // Deleting it unregisters the webhook.
    let deleted = app
        .auth(
            app.http
                .delete(format!("{}/v1/agents/{agent}/channels/{id}", app.url)),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert_eq!(tg.calls("deleteWebhook").len(), 1);
}

#[tokio::test]
async fn a_replica_killed_mid_delivery_neither_loses_nor_doubles_the_reply() {
    // This replica takes updates and delivers nothing: the process below claims the reply.
    let app = TestApp::start_with(|c| {
        fast(c);
        c.webhooks.max_in_flight = 0;
    })
    .await;
    let tg = ScriptedTelegram::start().await;
    let (_, id) = channel(&app, &tg).await;
    let secret = tg.secret_token();
    tg.hold_sends(true);
    let mut process = BrainProcess::start(
        &app,
        &[
            ("BRAIN_SECRETS_KEY", KEY_HEX),
            ("BRAIN_WEBHOOKS_ALLOW_PRIVATE_NETWORKS", "true"),
            ("BRAIN_WEBHOOKS_POLL_MS", "50"),
            ("BRAIN_WEBHOOKS_TIMEOUT_MS", "2000"),
        ],
    )
    .await;
    app.provider.push(text("only once"));
    assert_eq!(update(&app, &id, &secret, 1, ALLOWED, "hi").await, 200);
    // The process claimed the reply and its sendMessage is in flight, unanswered.
    tg.wait_until(WAIT, |_, held| held >= 1).await;
    process.kill().await;
    tg.hold_sends(false);

    let _second = app
        .second_replica_with(|c| {
            c.webhooks.max_in_flight = 4;
        })
        .await;
    tg.wait_until(WAIT, |calls, _| !sends(calls).is_empty())
        .await;
    let (state, attempts) = settled_delivery(&app, &id).await;
    assert_eq!((state.as_str(), attempts), ("delivered", 2));
    let sent = tg.calls("sendMessage");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].body["text"], "only once");
}
