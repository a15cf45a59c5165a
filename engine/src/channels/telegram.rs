//! The Telegram Bot API as the brain speaks it (P10): the calls it makes
//! (`setWebhook`, `deleteWebhook`, `sendMessage`, `sendChatAction`, and for an approval's
//! buttons `answerCallbackQuery`, `editMessageText`) and the part of an `Update` it reads.
//!
//! An `Update` is read leniently (no `deny_unknown_fields`): it is the platform's open,
//! growing schema, not ours, and a field Telegram adds must not refuse every message.
//! Its size is bounded by the route.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::CallError;

/// The API Telegram runs; a channel may name a self-hosted Bot API server instead.
pub const DEFAULT_API_BASE: &str = "https://api.telegram.org";
/// A message's text limit, in characters.
pub const MESSAGE_LIMIT: usize = 4096;
/// The header Telegram sends with the `secret_token` given to `setWebhook`.
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";
/// Bytes of an API answer read at most; the brain needs only `ok` and the error's numbers.
const MAX_ANSWER: usize = 64 * 1024;

#[derive(Debug, Deserialize)]
pub struct Update {
    pub update_id: i64,
    pub message: Option<Message>,
    /// A press of a button the brain sent (an approval's, P16).
    pub callback_query: Option<CallbackQuery>,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub message_id: Option<i64>,
    pub chat: Chat,
    pub from: Option<User>,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Chat {
    pub id: i64,
}

#[derive(Debug, Deserialize)]
pub struct User {
    pub id: i64,
}

/// A button pressed: who pressed it, on which message, and the button's `callback_data`
/// (the client's to send: a forged one is read as any other).
#[derive(Debug, Deserialize)]
pub struct CallbackQuery {
    pub id: String,
    pub from: User,
    pub message: Option<Message>,
    pub data: Option<String>,
}

/// An inline keyboard of one row: each button's label and `callback_data`.
pub fn keyboard(buttons: &[(&str, String)]) -> Value {
    let row: Vec<Value> = buttons
        .iter()
        .map(|(label, data)| json!({ "text": label, "callback_data": data }))
        .collect();
    json!({ "inline_keyboard": [row] })
}

/// A bot's API: its base and token (which is part of every method's URL, so a URL is
/// never logged).
pub struct Bot<'a> {
    pub client: &'a reqwest::Client,
    pub base: &'a str,
    pub token: &'a str,
    pub allow_private_networks: bool,
    pub timeout: Duration,
}

impl Bot<'_> {
    /// Calls `method` with `body`: its `result` when Telegram answered `ok`.
    pub async fn call(&self, method: &str, body: &Value) -> Result<Value, CallError> {
        let base = self.base.trim_end_matches('/');
        let url = format!("{base}/bot{}/{method}", self.token);
        let (private, timeout) = (self.allow_private_networks, self.timeout);
        let answer = super::post_json(self.client, &url, None, body, private, timeout, MAX_ANSWER);
        let super::Answer {
            status,
            body: answer,
            ..
        } = answer.await?;
        match answer {
            Some(answer) if answer["ok"] == true => Ok(answer["result"].clone()),
            answer => {
                let retry_after = answer
                    .as_ref()
                    .and_then(|a| a["parameters"]["retry_after"].as_u64())
                    .map(Duration::from_secs);
                Err(CallError {
                    class: super::status_class(status),
                    status: Some(status),
                    // A bad request, a blocked bot, an unknown chat or token: the same
                    // call never succeeds.
                    permanent: matches!(status, 400 | 401 | 403 | 404),
                    retry_after,
                })
            }
        }
    }

    /// Points Telegram at `url`, authenticated by `secret`.
    pub async fn set_webhook(&self, url: &str, secret: &str) -> Result<(), CallError> {
        let body = json!({
            "url": url,
            "secret_token": secret,
            "allowed_updates": ["message", "callback_query"],
        });
        self.call("setWebhook", &body).await.map(drop)
    }

    pub async fn delete_webhook(&self) -> Result<(), CallError> {
        self.call("deleteWebhook", &json!({})).await.map(drop)
    }

    /// Sends `text` to `chat` in `parse_mode` (`HTML`), or as plain text (`None`), with
    /// `markup` (an inline keyboard) under it.
    pub async fn send_message(
        &self,
        chat: &str,
        text: &str,
        parse_mode: Option<&str>,
        markup: Option<&Value>,
    ) -> Result<(), CallError> {
        let mut body = json!({ "chat_id": chat, "text": text });
        if let Some(mode) = parse_mode {
            body["parse_mode"] = json!(mode);
        }
        if let Some(markup) = markup {
            body["reply_markup"] = markup.clone();
        }
        self.call("sendMessage", &body).await.map(drop)
    }

    /// Ends the client's wait on a pressed button, showing `text` to the person who
    /// pressed it.
    pub async fn answer_callback(&self, query: &str, text: &str) -> Result<(), CallError> {
        let body = json!({ "callback_query_id": query, "text": text });
        self.call("answerCallbackQuery", &body).await.map(drop)
    }

    /// Rewrites message `message` of `chat` as `text` (HTML), its keyboard gone.
    pub async fn edit_message(
        &self,
        chat: &str,
        message: i64,
        text: &str,
    ) -> Result<(), CallError> {
        let body = json!({
            "chat_id": chat, "message_id": message, "text": text, "parse_mode": "HTML",
        });
        self.call("editMessageText", &body).await.map(drop)
    }

    /// "typing…" in `chat` for about five seconds, or until a message is sent.
    pub async fn typing(&self, chat: &str) -> Result<(), CallError> {
        let body = json!({ "chat_id": chat, "action": "typing" });
        self.call("sendChatAction", &body).await.map(drop)
    }
}
