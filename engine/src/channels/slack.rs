//! Slack as the brain speaks it (P10): the Events API's envelope it reads, the v0
//! signature that proves Slack sent it (on events and on interactivity payloads alike),
//! the `block_actions` payload of a pressed button, and the Web API calls it makes
//! (`auth.test`, `chat.postMessage`, `chat.update`, `chat.postEphemeral`).
//!
//! An envelope is read leniently (no `deny_unknown_fields`): it is Slack's open, growing
//! schema, not ours. Its size is bounded by the route, and nothing in it is read before
//! its signature is checked.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::CallError;

/// The Web API Slack runs; a channel may name a Slack-compatible gateway instead.
pub const DEFAULT_API_BASE: &str = "https://slack.com";
pub const SIGNATURE_HEADER: &str = "x-slack-signature";
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";
/// Set on Slack's redeliveries (it retries an event not acknowledged within 3 s).
pub const RETRY_HEADER: &str = "x-slack-retry-num";
/// How far a request's timestamp may be from our clock (Slack's documented window): an
/// older signed request is a replay.
pub const MAX_SKEW_SECS: i64 = 5 * 60;
/// Bytes of an API answer read at most; the brain needs only `ok` and `error`.
const MAX_ANSWER: usize = 64 * 1024;

/// Why a request is not Slack's.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No timestamp, or one outside the five-minute window.
    Stale,
    /// No signature, or not the one the signing secret makes.
    BadSignature,
}

/// Checks Slack's v0 signature of `body`: `v0=` and the hex of HMAC-SHA256 under the
/// signing secret of `v0:{timestamp}:{body}`, the timestamp within five minutes of `now`.
/// The comparison is constant-time (`hmac::verify`).
pub fn verify(
    signing_secret: &str,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), Refused> {
    let timestamp = timestamp.ok_or(Refused::Stale)?;
    let at: i64 = timestamp.parse().map_err(|_| Refused::Stale)?;
    if (now - at).abs() > MAX_SKEW_SECS {
        return Err(Refused::Stale);
    }
    let tag = signature
        .and_then(|s| s.strip_prefix("v0="))
        .and_then(hex_decode)
        .ok_or(Refused::BadSignature)?;
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, signing_secret.as_bytes());
    aws_lc_rs::hmac::verify(&key, &signed_bytes(timestamp, body), &tag)
        .map_err(|_| Refused::BadSignature)
}

fn signed_bytes(timestamp: &str, body: &[u8]) -> Vec<u8> {
    let mut signed = Vec::with_capacity(body.len() + timestamp.len() + 4);
    signed.extend_from_slice(b"v0:");
    signed.extend_from_slice(timestamp.as_bytes());
    signed.push(b':');
    signed.extend_from_slice(body);
    signed
}

fn hex_decode(raw: &str) -> Option<Vec<u8>> {
    if raw.len() != 64 {
        return None;
    }
    (0..raw.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(raw.get(i..i + 2)?, 16).ok())
        .collect()
}

/// An Events API request: a `url_verification` (its `challenge` echoed) or an
/// `event_callback` carrying one event.
#[derive(Debug, Deserialize)]
pub struct Envelope {
    #[serde(rename = "type")]
    pub kind: String,
    pub challenge: Option<String>,
    pub event_id: Option<String>,
    pub event: Option<Event>,
}

/// A `message` event (the only kind the brain answers).
#[derive(Debug, Deserialize)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: String,
    /// Set on edits, deletions, joins and bots' messages: none of them is a person
    /// writing to the agent.
    pub subtype: Option<String>,
    /// Set on a bot's message, the channel's own replies among them.
    pub bot_id: Option<String>,
    pub user: Option<String>,
    pub text: Option<String>,
    pub ts: Option<String>,
    pub thread_ts: Option<String>,
    pub channel: Option<String>,
    pub channel_type: Option<String>,
}

/// An interactivity request (`payload=` of a form body): a `block_actions` when a person
/// pressed a button of the brain's message.
#[derive(Debug, Deserialize)]
pub struct Interaction {
    #[serde(rename = "type")]
    pub kind: String,
    pub user: Option<Named>,
    pub channel: Option<Named>,
    pub container: Option<Container>,
    #[serde(default)]
    pub actions: Vec<Action>,
}

#[derive(Debug, Deserialize)]
pub struct Named {
    pub id: String,
}

/// The message the pressed button is on.
#[derive(Debug, Deserialize)]
pub struct Container {
    pub message_ts: Option<String>,
}

/// A pressed button: its `value` is the brain's (and the client's to forge).
#[derive(Debug, Deserialize)]
pub struct Action {
    pub value: Option<String>,
}

/// The JSON of an interactivity request's form body (`payload=…`), if it has one.
pub fn interaction_payload(body: &[u8]) -> Option<Interaction> {
    let (_, payload) = url::form_urlencoded::parse(body).find(|(name, _)| name == "payload")?;
    serde_json::from_str(&payload).ok()
}

/// A message's blocks: its text as a `section`, and when `buttons` are given, an `actions`
/// block of them (label, `value`; the first styled as the one to go on with).
pub fn blocks(text: &str, buttons: &[(&str, String)]) -> Value {
    let section = json!({ "type": "section", "text": { "type": "mrkdwn", "text": text } });
    if buttons.is_empty() {
        return json!([section]);
    }
    let elements: Vec<Value> = buttons
        .iter()
        .enumerate()
        .map(|(i, (label, value))| {
            json!({
                "type": "button",
                "action_id": format!("press-{i}"),
                "style": if i == 0 { "primary" } else { "danger" },
                "text": { "type": "plain_text", "text": label },
                "value": value,
            })
        })
        .collect();
    json!([section, { "type": "actions", "elements": elements }])
}

/// Where a reply goes: a DM (`im`) as a whole, or one thread of a channel, which the
/// message starts when it is not in one already. Written `channel` or `channel/thread_ts`
/// (Slack ids and timestamps hold no `/`) as the conversation of `channel_chats`.
#[derive(Debug, PartialEq, Eq)]
pub struct Conversation<'a> {
    pub channel: &'a str,
    pub thread_ts: Option<&'a str>,
}

impl<'a> Conversation<'a> {
    pub fn of(event: &'a Event) -> Option<Self> {
        let channel = event.channel.as_deref()?;
        if event.channel_type.as_deref() == Some("im") {
            return Some(Self {
                channel,
                thread_ts: None,
            });
        }
        let thread_ts = event.thread_ts.as_deref().or(event.ts.as_deref())?;
        Some(Self {
            channel,
            thread_ts: Some(thread_ts),
        })
    }

    pub fn parse(raw: &'a str) -> Self {
        match raw.split_once('/') {
            Some((channel, thread_ts)) => Self {
                channel,
                thread_ts: Some(thread_ts),
            },
            None => Self {
                channel: raw,
                thread_ts: None,
            },
        }
    }

    pub fn key(&self) -> String {
        match self.thread_ts {
            Some(ts) => format!("{}/{ts}", self.channel),
            None => self.channel.to_owned(),
        }
    }
}

/// A bot's Web API: its base and token (sent as a bearer, never logged).
pub struct Api<'a> {
    pub client: &'a reqwest::Client,
    pub base: &'a str,
    pub token: &'a str,
    pub allow_private_networks: bool,
    pub timeout: Duration,
}

impl Api<'_> {
    /// Calls `method` with `body`: Slack's answer when it says `ok`.
    pub async fn call(&self, method: &str, body: &Value) -> Result<Value, CallError> {
        let url = format!("{}/api/{method}", self.base.trim_end_matches('/'));
        let (client, token) = (self.client, Some(self.token));
        let (private, timeout) = (self.allow_private_networks, self.timeout);
        let answer = super::post_json(client, &url, token, body, private, timeout, MAX_ANSWER);
        let super::Answer {
            status,
            retry_after,
            body: answer,
        } = answer.await?;
        match answer {
            Some(answer) if status == 200 && answer["ok"] == true => Ok(answer),
            Some(answer) if status == 200 => Err(api_error(answer["error"].as_str())),
            _ => Err(CallError {
                class: super::status_class(status),
                status: Some(status),
                // Slack answers its errors `200 ok:false`; a 4xx other than 429 is a
                // request it will never take.
                permanent: (400..500).contains(&status) && status != 429,
                retry_after,
            }),
        }
    }

    /// Checks the token (a revoked or mistyped one is refused).
    pub async fn auth_test(&self) -> Result<(), CallError> {
        self.call("auth.test", &json!({})).await.map(drop)
    }

    /// Posts `text` (mrkdwn) in `to`: in its thread when it has one; with `blocks`, those
    /// are what shows (`text` is the notification's). Answers the message's `ts`.
    pub async fn post_message(
        &self,
        to: &Conversation<'_>,
        text: &str,
        blocks: Option<&Value>,
    ) -> Result<Option<String>, CallError> {
        let mut body = json!({ "channel": to.channel, "text": text, "mrkdwn": true });
        if let Some(ts) = to.thread_ts {
            body["thread_ts"] = json!(ts);
        }
        if let Some(blocks) = blocks {
            body["blocks"] = blocks.clone();
        }
        let answer = self.call("chat.postMessage", &body).await?;
        Ok(answer["ts"].as_str().map(str::to_owned))
    }

    /// Rewrites message `ts` of `channel` as `text` (mrkdwn), with `blocks` when given
    /// (none: its buttons are gone).
    pub async fn update(
        &self,
        channel: &str,
        ts: &str,
        text: &str,
        blocks: Option<&Value>,
    ) -> Result<(), CallError> {
        let mut body = json!({ "channel": channel, "ts": ts, "text": text });
        body["blocks"] = blocks.cloned().unwrap_or_else(|| self::blocks(text, &[]));
        self.call("chat.update", &body).await.map(drop)
    }

    /// Shows `text` to `user` alone in `channel`.
    pub async fn ephemeral(&self, channel: &str, user: &str, text: &str) -> Result<(), CallError> {
        let body = json!({ "channel": channel, "user": user, "text": text });
        self.call("chat.postEphemeral", &body).await.map(drop)
    }
}

/// An `ok: false` answer: its `error` as a class of our own (a fixed set, so a log never
/// carries what Slack wrote), transient only for Slack's own trouble.
fn api_error(error: Option<&str>) -> CallError {
    let (class, permanent) = match error {
        Some("ratelimited") => ("rate_limited", false),
        Some("internal_error" | "fatal_error" | "service_unavailable" | "request_timeout") => {
            ("server_error", false)
        }
        Some("invalid_auth" | "not_authed" | "token_revoked" | "account_inactive") => {
            ("unauthorized", true)
        }
        Some("channel_not_found" | "not_in_channel" | "is_archived" | "thread_not_found") => {
            ("not_found", true)
        }
        Some("msg_too_long" | "no_text" | "invalid_blocks") => ("bad_request", true),
        _ => ("platform_error", true),
    };
    CallError {
        class,
        status: Some(200),
        permanent,
        retry_after: None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The worked example of Slack's "Verifying requests from Slack".
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const TS: &str = "1531420618";
    const BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SIGNATURE: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    #[test]
    fn slacks_documented_example_verifies() {
        let now = TS.parse::<i64>().unwrap() + 10;
        assert_eq!(
            verify(SECRET, Some(TS), Some(SIGNATURE), BODY.as_bytes(), now),
            Ok(())
        );
    }

    #[test]
    fn a_changed_body_a_wrong_secret_or_an_old_timestamp_is_refused() {
        let now = TS.parse::<i64>().unwrap();
        let body = format!("{BODY}x");
        let refused = |secret, ts, sig: Option<&str>, body: &str, now| {
            verify(secret, ts, sig, body.as_bytes(), now).unwrap_err()
        };
        assert_eq!(
            refused(SECRET, Some(TS), Some(SIGNATURE), &body, now),
            Refused::BadSignature
        );
        assert_eq!(
            refused("other", Some(TS), Some(SIGNATURE), BODY, now),
            Refused::BadSignature
        );
        assert_eq!(
            refused(SECRET, Some(TS), None, BODY, now),
            Refused::BadSignature
        );
        assert_eq!(
            refused(SECRET, Some(TS), Some(SIGNATURE), BODY, now + 301),
            Refused::Stale
        );
        assert_eq!(
            refused(SECRET, None, Some(SIGNATURE), BODY, now),
            Refused::Stale
        );
    }

    #[test]
    fn a_thread_or_a_dm_is_one_conversation() {
        let event: Event = serde_json::from_value(json!({
            "type": "message", "channel": "C1", "channel_type": "channel",
            "user": "U1", "text": "hi", "ts": "100.1"}))
        .unwrap();
        let started = Conversation::of(&event).unwrap();
        assert_eq!(started.key(), "C1/100.1");
        let reply: Event = serde_json::from_value(json!({
            "type": "message", "channel": "C1", "channel_type": "channel",
            "user": "U1", "text": "and", "ts": "101.1", "thread_ts": "100.1"}))
        .unwrap();
        assert_eq!(Conversation::of(&reply).unwrap(), started);
        assert_eq!(Conversation::parse("C1/100.1"), started);
        let dm: Event = serde_json::from_value(json!({
            "type": "message", "channel": "D1", "channel_type": "im",
            "user": "U1", "text": "hi", "ts": "102.1"}))
        .unwrap();
        assert_eq!(Conversation::of(&dm).unwrap().key(), "D1");
        assert_eq!(Conversation::parse("D1").thread_ts, None);
    }
}
