//! Chat channels (P10) and their delivery router (P11) against a scripted Telegram Bot API
//! server (`common::telegram`: a chat platform cannot run here): the webhook registered
//! with a secret, an update refused without it, a redelivery run once, a long answer cut
//! under the limit, a failing send retried to one delivery, a replica killed mid-delivery,
//! a person not allowed refused, another team's channel out of reach; and a scripted Slack
//! Web API server (`common::slack`), the events signed as Slack signs them: a thread or a
//! DM as one conversation, a bad signature or a stale timestamp refused, a retry run once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use engine::config::Config;
use scripted_provider::{Reply, ToolCall};
use serde_json::{Value, json};
use store::SecretsKey;

use crate::common::replies::text;
use crate::common::slack::{self, Call as SlackCall, ScriptedSlack};
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

const SIGNING: &str = "slack-signing-secret-0123";
const SLACK_TOKEN: &str = "xoxb-1-secret-slack-token";

/// An agent with a Slack channel at `slack`, allowing `users` anywhere and anyone in
/// `channels`: the channel's id.
async fn slack_channel(
    app: &TestApp,
    slack: &ScriptedSlack,
    users: &[&str],
    channels: &[&str],
) -> String {
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let created = app
        .post_json(
            &format!("/v1/agents/{agent}/channels"),
            &json!({"kind": "slack", "bot_token": SLACK_TOKEN, "signing_secret": SIGNING,
                    "allowed_users": users, "allowed_channels": channels,
                    "api_base": slack.url}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let shown = created.to_string();
    assert!(
        !shown.contains(SIGNING) && !shown.contains(SLACK_TOKEN),
        "{shown}"
    );
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(
        created["webhook_url"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/v1/channels/{id}/slack"))
    );
    // The token was checked with Slack before the channel was kept.
    assert_eq!(slack.calls("auth.test")[0].token, SLACK_TOKEN);
    id
}

/// A person's message event: in a channel (`thread_ts` when it is a reply in a thread) or,
/// for a `D…` channel, a DM.
fn slack_message(
    event_id: &str,
    user: &str,
    channel: &str,
    ts: &str,
    thread_ts: Option<&str>,
    text: &str,
) -> Value {
    let channel_type = if channel.starts_with('D') {
        "im"
    } else {
        "channel"
    };
    let mut event = json!({"type": "message", "user": user, "text": text, "ts": ts,
                           "channel": channel, "channel_type": channel_type});
    if let Some(thread) = thread_ts {
        event["thread_ts"] = json!(thread);
    }
    json!({"token": "unused", "team_id": "T1", "api_app_id": "A1", "type": "event_callback",
           "event_id": event_id, "event_time": 0, "event": event})
}

/// Posts `body` to the channel's Slack URL as Slack would at `at` (seconds), signed with
/// `secret`; `retry` sets `X-Slack-Retry-Num`.
async fn slack_send(
    app: &TestApp,
    channel: &str,
    body: &Value,
    at: i64,
    secret: &str,
    retry: Option<u32>,
) -> reqwest::Response {
    let raw = serde_json::to_vec(body).unwrap();
    let mut request = app
        .http
        .post(format!("{}/v1/channels/{channel}/slack", app.url))
        .header("Content-Type", "application/json")
        .header("X-Slack-Request-Timestamp", at.to_string())
        .header("X-Slack-Signature", slack::sign(secret, at, &raw));
    if let Some(n) = retry {
        request = request
            .header("X-Slack-Retry-Num", n.to_string())
            .header("X-Slack-Retry-Reason", "http_timeout");
    }
    request.body(raw).send().await.unwrap()
}

async fn slack_status(app: &TestApp, channel: &str, body: &Value) -> u16 {
    let now = chrono::Utc::now().timestamp();
    slack_send(app, channel, body, now, SIGNING, None)
        .await
        .status()
        .as_u16()
}

#[tokio::test]
async fn a_slack_message_in_a_thread_is_answered_in_that_thread() {
    let app = TestApp::start_with(fast).await;
    let slack = ScriptedSlack::start().await;
    let id = slack_channel(&app, &slack, &["U1"], &[]).await;

    let challenge = json!({"token": "unused", "type": "url_verification", "challenge": "c-123"});
    let now = chrono::Utc::now().timestamp();
    let answered = slack_send(&app, &id, &challenge, now, SIGNING, None).await;
    assert_eq!(answered.status(), 200);
    assert_eq!(
        answered.json::<Value>().await.unwrap()["challenge"],
        "c-123"
    );

    // A message in channel C1 starts a thread: the reply goes in it, in mrkdwn.
    app.provider.push(text("Hello **Ada** <3"));
    let first = slack_message("Ev1", "U1", "C1", "100.000001", None, "hi");
    assert_eq!(slack_status(&app, &id, &first).await, 200);
    slack
        .wait_until(WAIT, |calls| slack::settled(calls) >= 1)
        .await;
    assert_eq!(slack.calls("chat.postMessage")[0].token, SLACK_TOKEN);
    let sent = slack.shown();
    assert_eq!(sent[0]["channel"], "C1");
    assert_eq!(sent[0]["thread_ts"], "100.000001");
    assert_eq!(sent[0]["text"], "Hello *Ada* &lt;3");

    // The bot's own message and an edit in the thread are no one writing to the agent.
    let mut own = slack_message("Ev2", "UBOT", "C1", "100.5", Some("100.000001"), "Hello");
    own["event"]["bot_id"] = json!("BBOT");
    assert_eq!(slack_status(&app, &id, &own).await, 200);
    let mut edit = slack_message("Ev3", "U1", "C1", "100.6", Some("100.000001"), "hi!");
    edit["event"]["subtype"] = json!("message_changed");
    assert_eq!(slack_status(&app, &id, &edit).await, 200);
    assert_eq!(turns_of(&app, &id).await, 1);

    // A reply in the thread is the same conversation: the same chat, answered there.
    app.provider.push(text("Again"));
    let reply = slack_message("Ev4", "U1", "C1", "101.000001", Some("100.000001"), "more");
    assert_eq!(slack_status(&app, &id, &reply).await, 200);
    slack
        .wait_until(WAIT, |calls| slack::settled(calls) >= 2)
        .await;
    let sent = slack.shown();
    assert_eq!(sent[1]["thread_ts"], "100.000001");
    assert_eq!(sent[1]["text"], "Again");

    // A DM is a conversation of its own, answered outside any thread.
    app.provider.push(text("In private"));
    let dm = slack_message("Ev5", "U1", "D9", "102.000001", None, "psst");
    assert_eq!(slack_status(&app, &id, &dm).await, 200);
    slack
        .wait_until(WAIT, |calls| slack::settled(calls) >= 3)
        .await;
    let sent = slack.shown();
    assert_eq!(sent[2]["channel"], "D9");
    assert!(sent[2].get("thread_ts").is_none(), "{:?}", sent[2]);

    assert_eq!(turns_of(&app, &id).await, 3);
    let owners: Vec<(Option<String>, String)> = sqlx::query_as(
        "SELECT h.created_by, c.conversation FROM chats h \
         JOIN channel_chats c ON c.chat_id = h.id WHERE c.channel_id = $1::uuid \
         ORDER BY c.conversation",
    )
    .bind(&id)
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    assert_eq!(
        owners,
        [
            (Some("slack:U1".to_owned()), "C1/100.000001".to_owned()),
            (Some("slack:U1".to_owned()), "D9".to_owned()),
        ]
    );
}

#[tokio::test]
async fn a_bad_slack_signature_or_a_stale_timestamp_runs_nothing() {
    let app = TestApp::start_with(fast).await;
    let slack = ScriptedSlack::start().await;
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // A Slack channel needs its signing secret; a Telegram one takes none.
    for body in [
        json!({"kind": "slack", "bot_token": SLACK_TOKEN, "allowed_users": ["U1"],
               "api_base": slack.url}),
        json!({"kind": "telegram", "bot_token": "1:t", "allowed_users": ["1"],
               "signing_secret": SIGNING, "api_base": slack.url}),
    ] {
        let refused = app
            .post_json(&format!("/v1/agents/{agent}/channels"), &body)
            .await;
        assert_eq!(refused.status(), 400, "{body}");
    }
    let id = slack_channel(&app, &slack, &["U1"], &[]).await;
    let message = slack_message("Ev1", "U1", "C1", "100.1", None, "hi");
    let now = chrono::Utc::now().timestamp();
    let refused = [
        slack_send(&app, &id, &message, now, "not-the-secret", None).await,
        // Signed rightly, but long ago (a replay) or from too far ahead.
        slack_send(&app, &id, &message, now - 6 * 60, SIGNING, None).await,
        slack_send(&app, &id, &message, now + 6 * 60, SIGNING, None).await,
        app.http
            .post(format!("{}/v1/channels/{id}/slack", app.url))
            .json(&message)
            .send()
            .await
            .unwrap(),
    ];
    for response in refused {
        assert_eq!(response.status(), 401);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    }
    // A body changed after it was signed.
    let raw = serde_json::to_vec(&message).unwrap();
    let tampered = app
        .http
        .post(format!("{}/v1/channels/{id}/slack", app.url))
        .header("X-Slack-Request-Timestamp", now.to_string())
        .header("X-Slack-Signature", slack::sign(SIGNING, now, &raw))
        .body(
            serde_json::to_vec(&slack_message("Ev1", "U1", "C1", "100.1", None, "rm -rf")).unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(tampered.status(), 401);
    assert_eq!(turns_of(&app, &id).await, 0);

    // The same message, signed now, runs.
    app.provider.push(text("ok"));
    assert_eq!(slack_status(&app, &id, &message).await, 200);
    assert_eq!(turns_of(&app, &id).await, 1);
    slack
        .wait_until(WAIT, |calls| slack::settled(calls) >= 1)
        .await;
}

#[tokio::test]
async fn a_slack_retry_runs_once() {
    let app = TestApp::start_with(fast).await;
    let slack = ScriptedSlack::start().await;
    let id = slack_channel(&app, &slack, &["U1"], &[]).await;
    slack.fail_posts(1);
    app.provider.push(text("only once"));
    let message = slack_message("Ev7", "U1", "C1", "100.1", None, "hi");
    let now = chrono::Utc::now().timestamp();
    let first = slack_send(&app, &id, &message, now, SIGNING, None).await;
    assert_eq!(first.status(), 200);
    // Slack saw no answer in time and sends the same event again.
    let again = slack_send(&app, &id, &message, now + 3, SIGNING, Some(1)).await;
    assert_eq!(again.status(), 200);
    slack
        .wait_until(WAIT, |calls| slack::settled(calls) >= 1)
        .await;
    let (state, attempts) = settled_delivery(&app, &id).await;
    assert_eq!((state.as_str(), attempts), ("delivered", 2));
    assert_eq!(turns_of(&app, &id).await, 1);
    let sent = slack.shown();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["text"], "only once");
}

#[tokio::test]
async fn a_slack_user_not_allowed_is_refused_once_but_an_allowed_channel_lets_anyone_in() {
    let app = TestApp::start_with(fast).await;
    let slack = ScriptedSlack::start().await;
    let id = slack_channel(&app, &slack, &["U1"], &["COPEN"]).await;
    for n in 1..=3 {
        let ts = format!("100.{n}");
        let message = slack_message(&format!("Ev{n}"), "U9", "C1", &ts, Some("100.1"), "in?");
        assert_eq!(slack_status(&app, &id, &message).await, 200);
    }
    assert_eq!(turns_of(&app, &id).await, 0);
    slack
        .wait_until(WAIT, |calls| slack::settled(calls) >= 1)
        .await;
    let refusal = &slack.shown()[0];
    assert_eq!(refusal["thread_ts"], "100.1");
    assert!(refusal["text"].as_str().unwrap().contains("not allowed"));
    let (notices,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM webhook_deliveries WHERE channel_id = $1::uuid")
            .bind(&id)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(notices, 1);

    // In an allowed channel, the same person is answered.
    app.provider.push(text("welcome"));
    let open = slack_message("Ev9", "U9", "COPEN", "200.1", None, "hello");
    assert_eq!(slack_status(&app, &id, &open).await, 200);
    slack
        .wait_until(WAIT, |calls| slack::settled(calls) >= 2)
        .await;
    assert_eq!(slack.shown()[1]["text"], "welcome");
    assert_eq!(turns_of(&app, &id).await, 1);
}

#[tokio::test]
async fn typing_is_shown_again_while_the_turn_runs() {
    let app = TestApp::start_with(fast).await;
    let tg = ScriptedTelegram::start().await;
    let (_, id) = channel(&app, &tg).await;
    let secret = tg.secret_token();
    // The answer streams until the test releases it: the turn runs past one indicator.
    app.provider.push(Reply::Held {
        delta: "thinking ".into(),
        every: Duration::from_millis(200),
    });
    assert_eq!(
        update(&app, &id, &secret, 1, ALLOWED, "slow one").await,
        200
    );
    let typing = |calls: &[Call]| {
        calls
            .iter()
            .filter(|c| c.method == "sendChatAction" && c.body["action"] == "typing")
            .count()
    };
    // Telegram shows one indicator about five seconds: a second is sent while it runs.
    tg.wait_until(WAIT, |calls, _| typing(calls) >= 2).await;
    assert!(sends(&tg.calls("sendMessage")).is_empty());
    app.provider.release_held();
    tg.wait_until(WAIT, |calls, _| !sends(calls).is_empty())
        .await;
    assert_eq!(settled_delivery(&app, &id).await.0, "delivered");
}

#[tokio::test]
async fn two_replies_due_at_once_for_one_conversation_go_out_in_order() {
    // This replica takes updates and delivers nothing: both replies wait in the outbox.
    let app = TestApp::start_with(|c| {
        fast(c);
        c.webhooks.max_in_flight = 0;
    })
    .await;
    let tg = ScriptedTelegram::start().await;
    let (_, id) = channel(&app, &tg).await;
    let secret = tg.secret_token();
    app.provider.push(text("first"));
    app.provider.push(text("second"));
    assert_eq!(update(&app, &id, &secret, 1, ALLOWED, "one").await, 200);
    assert_eq!(update(&app, &id, &secret, 2, ALLOWED, "two").await, 200);
    let both = async {
        loop {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM webhook_deliveries WHERE channel_id = $1::uuid \
                 AND event = 'channel.reply'",
            )
            .bind(&id)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
            if n == 2 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(WAIT, both).await.unwrap();
    // The first reply's send hangs at the platform: the second must not overtake it.
    tg.hold_sends(true);
    let _second = app
        .second_replica_with(|c| {
            c.webhooks.max_in_flight = 4;
        })
        .await;
    tg.wait_until(WAIT, |_, held| held >= 1).await;
    // Both were due when the replica's first claim ran: only the earlier was taken.
    let (claimed,): (Vec<i32>,) = sqlx::query_as(
        "SELECT array_agg(attempts ORDER BY seq) FROM webhook_deliveries \
         WHERE channel_id = $1::uuid",
    )
    .bind(&id)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(claimed[1], 0, "{claimed:?}");
    tg.hold_sends(false);
    tg.wait_until(WAIT, |calls, _| sends(calls).len() >= 2)
        .await;
    let texts: Vec<Value> = tg
        .calls("sendMessage")
        .iter()
        .map(|c| c.body["text"].clone())
        .collect();
    assert_eq!(texts, [json!("first"), json!("second")]);
}

/// The agent asks before every write: `memory_write` waits for a person's answer.
async fn asks_before_writing(app: &TestApp, agent: &str) {
    let patched = app
        .auth(app.http.patch(format!("{}/v1/agents/{agent}", app.url)))
        .json(&json!({"approval_policy": {"ask": ["write"], "deny": []}}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);
}

fn remember(note: &str) -> Reply {
    Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call-1".into(),
            name: "memory_write".into(),
            arguments: json!({"content": note}).to_string(),
        }],
        fragment: 16,
    }
}

async fn memories(app: &TestApp) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM memories")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    n
}

async fn approval_states(app: &TestApp) -> Vec<String> {
    sqlx::query_scalar("SELECT state FROM approvals ORDER BY created_at")
        .fetch_all(app.store.pool())
        .await
        .unwrap()
}

/// Telegram's update for a press of a button with `data` by `from`, on message 1 of the
/// conversation.
async fn press(app: &TestApp, channel: &str, secret: &str, update_id: i64, from: i64, data: &str) {
    let body = json!({
        "update_id": update_id,
        "callback_query": {"id": format!("cb-{update_id}"), "chat_instance": "ci-1",
            "from": {"id": from, "is_bot": false, "first_name": "Ada"},
            "message": {"message_id": 1, "date": 0, "text": "asks",
                        "chat": {"id": 42, "type": "private"}},
            "data": data},
    });
    let status = app
        .http
        .post(format!("{}/v1/channels/{channel}/telegram", app.url))
        .header("X-Telegram-Bot-Api-Secret-Token", secret)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_telegram_approval_is_answered_once_by_an_allowed_persons_button() {
    let app = TestApp::start_with(fast).await;
    let tg = ScriptedTelegram::start().await;
    let (agent, id) = channel(&app, &tg).await;
    asks_before_writing(&app, &agent).await;
    let secret = tg.secret_token();
    app.provider.push(remember("likes tea"));
    assert_eq!(
        update(&app, &id, &secret, 1, ALLOWED, "remember tea").await,
        200
    );
    let asked = |calls: &[Call]| {
        calls
            .iter()
            .find(|c| c.method == "sendMessage" && c.body.get("reply_markup").is_some())
            .cloned()
    };
    tg.wait_until(WAIT, |calls, _| asked(calls).is_some()).await;
    let prompt = asked(&tg.calls("sendMessage")).unwrap();
    // The call's own text is the only message: the turn wrote none.
    assert_eq!(sends(&tg.calls("sendMessage")).len(), 1);
    assert!(
        prompt.body["text"]
            .as_str()
            .unwrap()
            .contains("memory_write")
    );
    let row = &prompt.body["reply_markup"]["inline_keyboard"][0];
    let (approve, deny) = (
        row[0]["callback_data"].as_str().unwrap(),
        row[1]["callback_data"].as_str().unwrap(),
    );
    assert!(approve.len() <= 64 && deny.len() <= 64);
    let approval: String = sqlx::query_scalar("SELECT id::text FROM approvals")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert!(
        !approve.contains(&approval),
        "the button names no approval id"
    );

    // Someone the channel does not allow is told so and answers nothing.
    press(&app, &id, &secret, 2, 999, approve).await;
    tg.wait_until(WAIT, |calls, _| {
        calls.iter().any(|c| c.method == "answerCallbackQuery")
    })
    .await;
    let acks = tg.calls("answerCallbackQuery");
    assert_eq!(acks[0].body["callback_query_id"], "cb-2");
    assert!(
        acks[0].body["text"]
            .as_str()
            .unwrap()
            .contains("not allowed")
    );
    assert_eq!(approval_states(&app).await, ["pending"]);
    assert_eq!(memories(&app).await, 0);
    // A forged button of no prompt answers nothing either.
    press(&app, &id, &secret, 3, ALLOWED, "forged-token-0000000:y").await;
    assert_eq!(approval_states(&app).await, ["pending"]);

    // The allowed person approves: the call runs in the continuation, whose answer comes.
    app.provider.push(text("Noted."));
    press(&app, &id, &secret, 4, ALLOWED, approve).await;
    tg.wait_until(WAIT, |calls, _| {
        sends(calls).iter().any(|c| c.body["text"] == "Noted.")
    })
    .await;
    assert_eq!(approval_states(&app).await, ["approved"]);
    assert_eq!(memories(&app).await, 1);
    tg.wait_until(WAIT, |calls, _| {
        calls.iter().any(|c| c.method == "editMessageText")
    })
    .await;
    let edit = &tg.calls("editMessageText")[0];
    assert_eq!(
        (
            edit.body["chat_id"].clone(),
            edit.body["message_id"].clone()
        ),
        (json!("42"), json!(1))
    );
    assert!(edit.body["text"].as_str().unwrap().contains("Approved"));
    assert!(edit.body.get("reply_markup").is_none());

    // Telegram delivers the press again, and the person presses Deny too: nothing more.
    press(&app, &id, &secret, 4, ALLOWED, approve).await;
    press(&app, &id, &secret, 5, ALLOWED, deny).await;
    tg.wait_until(WAIT, |calls, _| {
        calls
            .iter()
            .filter(|c| c.method == "answerCallbackQuery")
            .count()
            >= 5
    })
    .await;
    let acks = tg.calls("answerCallbackQuery");
    assert_eq!(acks[3].body["text"], "This was answered already.");
    assert_eq!(acks[4].body["text"], "This was answered already.");
    assert_eq!(approval_states(&app).await, ["approved"]);
    assert_eq!(memories(&app).await, 1);
    assert_eq!(
        turns_of(&app, &id).await,
        2,
        "one turn and one continuation"
    );
}

/// A Slack interactivity request: `payload=` and the JSON of a `block_actions` press of
/// `value` by `user` in `channel` on message `ts`, form-encoded as Slack sends it.
fn slack_press(user: &str, channel: &str, ts: &str, value: &str) -> Vec<u8> {
    let payload = json!({
        "type": "block_actions", "user": {"id": user, "username": "ada", "team_id": "T1"},
        "api_app_id": "A1", "token": "unused", "trigger_id": "1.2.3",
        "team": {"id": "T1", "domain": "t"},
        "container": {"type": "message", "message_ts": ts, "channel_id": channel,
                      "is_ephemeral": false},
        "channel": {"id": channel, "name": "general"},
        "response_url": "https://hooks.slack.invalid/actions/1",
        "actions": [{"type": "button", "action_id": "press-0", "block_id": "b1",
                     "value": value, "action_ts": "1.1"}],
    });
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish()
        .into_bytes()
}

async fn slack_interact(app: &TestApp, channel: &str, body: Vec<u8>, secret: &str) -> u16 {
    let at = chrono::Utc::now().timestamp();
    app.http
        .post(format!(
            "{}/v1/channels/{channel}/slack/interactivity",
            app.url
        ))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .header("X-Slack-Request-Timestamp", at.to_string())
        .header("X-Slack-Signature", slack::sign(secret, at, &body))
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn a_slack_approval_is_answered_by_its_button_and_a_bad_signature_answers_nothing() {
    let app = TestApp::start_with(fast).await;
    let slack = ScriptedSlack::start().await;
    let id = slack_channel(&app, &slack, &["U1"], &[]).await;
    let agent: String = sqlx::query_scalar("SELECT agent_id::text FROM agent_channels")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    asks_before_writing(&app, &agent).await;
    let listed: Value = app
        .get(&format!("/v1/agents/{agent}/channels/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert!(
        listed["interactivity_url"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/v1/channels/{id}/slack/interactivity"))
    );
    app.provider.push(remember("likes tea"));
    let asked = slack_message("Ev1", "U1", "C1", "100.1", None, "remember tea");
    assert_eq!(slack_status(&app, &id, &asked).await, 200);
    let with_buttons = |calls: &[SlackCall]| {
        calls
            .iter()
            .find(|c| c.method == "chat.postMessage" && c.body.get("blocks").is_some())
            .cloned()
    };
    slack
        .wait_until(WAIT, |calls| with_buttons(calls).is_some())
        .await;
    let prompt = with_buttons(&slack.calls("chat.postMessage")).unwrap();
    assert_eq!(prompt.body["thread_ts"], "100.1");
    let actions = &prompt.body["blocks"][1];
    assert_eq!(actions["type"], "actions");
    let approve = actions["elements"][0]["value"].as_str().unwrap().to_owned();
    let ts = "900.000001";

    // Signed with another secret: refused, nothing answered.
    let forged = slack_press("U1", "C1", ts, &approve);
    assert_eq!(
        slack_interact(&app, &id, forged, "not-the-secret-0").await,
        401
    );
    assert_eq!(approval_states(&app).await, ["pending"]);
    // Someone not allowed: told alone, nothing answered.
    let stranger = slack_press("U9", "C1", ts, &approve);
    assert_eq!(slack_interact(&app, &id, stranger, SIGNING).await, 200);
    slack
        .wait_until(WAIT, |calls| {
            calls.iter().any(|c| c.method == "chat.postEphemeral")
        })
        .await;
    assert_eq!(slack.calls("chat.postEphemeral")[0].body["user"], "U9");
    assert_eq!(approval_states(&app).await, ["pending"]);

    app.provider.push(text("Noted."));
    let pressed = slack_press("U1", "C1", ts, &approve);
    assert_eq!(slack_interact(&app, &id, pressed, SIGNING).await, 200);
    slack
        .wait_until(WAIT, |calls| {
            calls
                .iter()
                .any(|c| c.method == "chat.postMessage" && c.body["text"] == "Noted.")
        })
        .await;
    assert_eq!(approval_states(&app).await, ["approved"]);
    assert_eq!(memories(&app).await, 1);
    slack
        .wait_until(WAIT, |calls| {
            calls.iter().any(|c| c.method == "chat.update")
        })
        .await;
    let update = &slack.calls("chat.update")[0];
    assert_eq!(
        (update.body["channel"].as_str(), update.body["ts"].as_str()),
        (Some("C1"), Some(ts))
    );
    assert!(update.body["text"].as_str().unwrap().contains("Approved"));
    assert_eq!(
        update.body["blocks"].as_array().unwrap().len(),
        1,
        "its buttons are gone"
    );
}

#[tokio::test]
async fn a_slack_answer_shows_as_it_streams_updated_at_most_once_a_second() {
    let app = TestApp::start_with(fast).await;
    let slack = ScriptedSlack::start().await;
    let id = slack_channel(&app, &slack, &["U1"], &[]).await;
    // The answer streams a word every 100 ms until the test releases it.
    app.provider.push(Reply::Held {
        delta: "word ".into(),
        every: Duration::from_millis(100),
    });
    let asked = slack_message("Ev1", "U1", "C1", "100.1", None, "talk slowly");
    assert_eq!(slack_status(&app, &id, &asked).await, 200);
    let updates = |calls: &[SlackCall]| {
        calls
            .iter()
            .filter(|c| c.method == "chat.update")
            .cloned()
            .collect::<Vec<_>>()
    };
    slack
        .wait_until(WAIT, |calls| updates(calls).len() >= 3)
        .await;
    // One message shows the answer so far, in the thread.
    let posted = slack.calls("chat.postMessage");
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert_eq!(posted[0].body["thread_ts"], "100.1");
    assert!(posted[0].body["text"].as_str().unwrap().starts_with("word"));
    app.provider.release_held();
    let done = |calls: &[SlackCall]| {
        calls
            .iter()
            .any(|c| c.method == "chat.update" && !c.body["text"].as_str().unwrap().ends_with(" …"))
    };
    slack.wait_until(WAIT, done).await;
    let updates = updates(&slack.calls("chat.update"));
    // Each update of the streaming message came a second or more after the one before
    // (the post counts as the first); the last one is the reply itself, in its place.
    let mut times = vec![posted[0].at];
    times.extend(updates.iter().map(|c| c.at));
    let streaming = &times[..times.len() - 1];
    for pair in streaming.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_secs(1),
            "updates closer than a second: {:?}",
            pair[1] - pair[0]
        );
    }
    let last = updates.last().unwrap();
    // The double numbers its messages from 900.000001.
    assert_eq!(last.body["ts"], "900.000001");
    assert!(last.body["text"].as_str().unwrap().starts_with("word word"));
    // No second message: the reply took the streaming one's place.
    assert_eq!(slack.calls("chat.postMessage").len(), 1);
    assert_eq!(settled_delivery(&app, &id).await.0, "delivered");
}
