//! One attempt at a channel's reply (P11), claimed from the outbox by the webhooks' loop:
//! the reply's text read from the turn's message, cut and formatted for the platform, and
//! its parts sent in order from the first one no attempt has sent yet. Each part sent is
//! recorded under the claim before the next (`Store::record_channel_progress`), which also
//! extends the claim; when that record finds the claim taken by another replica, this one
//! stops. A replica killed between the platform's answer and that record leaves the part
//! to be sent again (the platforms take no idempotency key): a part may arrive twice, a
//! reply is never lost.

use std::time::Duration;

use serde_json::Value;

use super::slack::{self, Api};
use super::telegram::Bot;
use super::{CallError, Kind, text};
use crate::config::WebhooksConfig;
use crate::metrics::Metrics;
use protocol::TurnId;
use store::channels::OpenedChannel;
use store::webhooks::ClaimedDelivery;
use store::{SecretsError, Store, StoreError, bounded};

/// Tries per reply (seed 004's delivery router): the first and four retries.
pub const MAX_TRIES: i32 = 5;
/// The first wait after a failed try, doubled after each.
pub const RETRY_BASE: Duration = Duration::from_secs(1);
/// The longest wait between two tries.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

/// What the reply to a turn says when the turn wrote no text.
const FAILED_NOTICE: &str = "Sorry, I could not answer this time.";

/// The wait before try `attempt + 1`, or `None` when `error` will never pass or the tries
/// are spent: the platform's own wait when it named one (429), else the doubling backoff.
pub fn retry_after(error: &CallError, attempt: i32) -> Option<Duration> {
    if error.permanent || attempt >= MAX_TRIES {
        return None;
    }
    let backoff = crate::address::backoff_within(RETRY_BASE, RETRY_MAX, attempt);
    Some(
        error
            .retry_after
            .map_or(backoff, |asked| asked.max(backoff)),
    )
}

/// Sends what is left of `delivery`'s reply. `Ok`: every part reached the platform (or
/// the claim lapsed and another replica has the rest).
pub async fn attempt(
    store: &Store,
    client: &reqwest::Client,
    config: &WebhooksConfig,
    metrics: &Metrics,
    delivery: &ClaimedDelivery,
    channel: uuid::Uuid,
    lease: Duration,
) -> Result<(), CallError> {
    let (platform, sent) = send_rest(store, client, config, delivery, channel, lease).await;
    match &sent {
        Ok(()) => metrics.channel_message(platform, "delivered"),
        Err(e) if retry_after(e, delivery.attempt).is_none() => {
            metrics.channel_message(platform, "failed");
        }
        Err(_) => {}
    }
    sent
}

/// [`attempt`]'s sending, with the platform it was for (`unknown` when the channel is
/// gone).
async fn send_rest(
    store: &Store,
    client: &reqwest::Client,
    config: &WebhooksConfig,
    delivery: &ClaimedDelivery,
    channel: uuid::Uuid,
    lease: Duration,
) -> (&'static str, Result<(), CallError>) {
    let opened = match bounded(async { store.channel(channel).await.map_err(secrets) }).await {
        Ok(opened) => opened,
        Err(StoreError::NotFound) => return ("unknown", Err(gone("channel_gone"))),
        Err(StoreError::Corrupt(_)) => return ("unknown", Err(gone("unreadable_secret"))),
        Err(_) => return ("unknown", Err(CallError::transient("store"))),
    };
    let Some(kind) = Kind::parse(&opened.row.kind) else {
        return ("unknown", Err(gone("unknown_kind")));
    };
    let sent = send_parts(store, client, config, delivery, &opened, kind, lease).await;
    (kind.as_str(), sent)
}

/// The parts of the reply no attempt has sent yet, in order.
async fn send_parts(
    store: &Store,
    client: &reqwest::Client,
    config: &WebhooksConfig,
    delivery: &ClaimedDelivery,
    opened: &OpenedChannel,
    kind: Kind,
    lease: Duration,
) -> Result<(), CallError> {
    let conversation = delivery.body["conversation"].as_str().unwrap_or_default();
    let markdown = reply_text(store, delivery).await?;
    let parts = text::parts(kind, &markdown);
    let sent = delivery.body["sent"].as_u64().unwrap_or(0) as usize;
    let (base, token) = (opened.row.api_base.as_str(), opened.token.as_str());
    let allow_private_networks = config.allow_private_networks;
    let timeout = config.timeout;
    for (index, (formatted, source)) in parts.iter().enumerate().skip(sent) {
        match kind {
            Kind::Telegram => {
                let bot = Bot {
                    client,
                    base,
                    token,
                    allow_private_networks,
                    timeout,
                };
                send_telegram(&bot, conversation, formatted, source).await?;
            }
            Kind::Slack => {
                let api = Api {
                    client,
                    base,
                    token,
                    allow_private_networks,
                    timeout,
                };
                let to = slack::Conversation::parse(conversation);
                api.post_message(&to, formatted).await?;
            }
        }
        let progress =
            store.record_channel_progress(delivery.id, delivery.attempt, index + 1, lease);
        match bounded(progress).await {
            Ok(true) => {}
            // Another replica holds the row now: it sends the rest.
            Ok(false) => return Ok(()),
            Err(_) => return Err(CallError::transient("store")),
        }
    }
    Ok(())
}

/// A part in HTML; when Telegram refuses its entities (a cut left them unbalanced), the
/// same part as plain text.
async fn send_telegram(
    bot: &Bot<'_>,
    chat: &str,
    html: &str,
    plain: &str,
) -> Result<(), CallError> {
    match bot.send_message(chat, html, Some("HTML")).await {
        Err(e) if e.status == Some(400) => bot.send_message(chat, plain, None).await,
        other => other,
    }
}

/// The text a delivery carries: a notice's own, or the reply of its turn read from the
/// turn's message (the outbox holds no message text).
async fn reply_text(store: &Store, delivery: &ClaimedDelivery) -> Result<String, CallError> {
    if let Some(notice) = delivery.body["text"].as_str() {
        return Ok(notice.to_owned());
    }
    let turn = delivery.body["turn_id"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .map(TurnId)
        .ok_or_else(|| gone("invalid_body"))?;
    let reply = match bounded(store.channel_reply(delivery.team, turn)).await {
        Ok(reply) => reply,
        Err(StoreError::NotFound) => return Err(gone("turn_gone")),
        Err(_) => return Err(CallError::transient("store")),
    };
    let text = reply.parts.as_ref().map(texts).unwrap_or_default();
    if text.trim().is_empty() {
        return Ok(match reply.error_code {
            Some(code) => format!("{FAILED_NOTICE} ({code})"),
            None => FAILED_NOTICE.to_owned(),
        });
    }
    Ok(text)
}

/// The text parts of a stored message, a paragraph each.
fn texts(parts: &Value) -> String {
    parts
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["type"] == "text")
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn secrets(e: SecretsError) -> StoreError {
    match e {
        SecretsError::Store(e) => e,
        _ => StoreError::Corrupt("the channel's credentials do not open".into()),
    }
}

fn gone(class: &'static str) -> CallError {
    CallError {
        class,
        status: None,
        permanent: true,
        retry_after: None,
    }
}
