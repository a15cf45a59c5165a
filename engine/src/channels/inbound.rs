//! A platform's message to a channel (P10): after the route checked that the platform
//! sent it (its secret or signature), the message becomes a detached turn of its
//! conversation's chat, acting for the person who opened that chat (a chat-scoped end
//! user named `telegram:<user id>`, whose memories and budgets are theirs, L4), or a
//! short refusal for a person not allowed.
//!
//! A redelivery runs once: the message's client id is the platform's update id, and a
//! second post of one client id starts nothing (T12). A message that finds the agent busy
//! waits its turn (busy policy `enqueue`, T13).

use tokio::sync::Semaphore;

use super::Kind;
use super::telegram::{Bot, Update};
use crate::Engine;
use crate::agents::BusyPolicy;
use crate::auth::{Principal, Scope};
use crate::turn::post::{self, Detached, PostError};
use crate::turn::{Trigger, TurnInput};
use store::channels::OpenedChannel;
use store::{StoreError, bounded};

/// What a person not allowed is told (at most once an hour each).
pub const REFUSAL: &str = "Sorry, you are not allowed to talk to this agent.";
/// Characters of a message taken at most; Telegram's own limit is 4,096.
pub const MAX_TEXT: usize = 16_000;
/// "typing…" calls one replica makes at once; past it a message shows none.
const MAX_TYPING: usize = 64;

static TYPING: Semaphore = Semaphore::const_new(MAX_TYPING);

/// What became of a platform's message.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound {
    /// Not a text message (an edit, a join, a photo): nothing to answer.
    Ignored,
    /// A person not allowed: no turn (and at most one refusal an hour).
    Refused,
    /// A turn started (or had started for this same update).
    Started,
    /// Queued behind the agent's running turn.
    Queued,
}

#[derive(Debug, thiserror::Error)]
pub enum InboundError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Post(#[from] PostError),
}

/// A Telegram update to `channel`.
pub async fn telegram(
    engine: &Engine,
    channel: &OpenedChannel,
    update: Update,
) -> Result<Inbound, InboundError> {
    let Some(message) = update.message else {
        return Ok(Inbound::Ignored);
    };
    let (Some(from), Some(text)) = (message.from, message.text) else {
        return Ok(Inbound::Ignored);
    };
    let conversation = message.chat.id.to_string();
    let user = from.id.to_string();
    let metrics = &engine.metrics;
    metrics.channel_message(Kind::Telegram.as_str(), "inbound");
    if !channel.row.allowed_users.contains(&user) {
        metrics.channel_message(Kind::Telegram.as_str(), "refused");
        let person = format!("telegram:{user}");
        bounded(
            engine
                .store
                .refuse_in_channel(channel, &conversation, &person, REFUSAL),
        )
        .await?;
        return Ok(Inbound::Refused);
    }
    let person = format!("telegram:{user}");
    let (chat, owner) = bounded(engine.store.channel_chat(channel, &conversation, &person)).await?;
    let principal = Principal {
        team: channel.team,
        scope: Scope::Chat,
        user: Some(owner),
        sees_all_chats: false,
        key_id: None,
        key: None,
        expires: None,
    };
    let input = TurnInput {
        content: text.chars().take(MAX_TEXT).collect(),
        client_message_id: Some(format!("telegram:{}", update.update_id)),
        files: Vec::new(),
        instructions: None,
    };
    let trigger = Trigger::User(input);
    let posted = post::post_detached(
        engine,
        &principal,
        chat,
        trigger,
        Some(BusyPolicy::Enqueue),
        None,
    )
    .await?;
    typing(engine, channel, conversation);
    Ok(match posted {
        Detached::Started(..) => Inbound::Started,
        Detached::Queued(_) => Inbound::Queued,
    })
}

/// Shows "typing…" in the conversation while the turn starts (Telegram shows it about
/// five seconds, or until the reply), best effort: a failure is only logged.
fn typing(engine: &Engine, channel: &OpenedChannel, conversation: String) {
    let Ok(permit) = TYPING.try_acquire() else {
        return;
    };
    let config = engine.config.webhooks;
    let (base, token) = (channel.row.api_base.clone(), channel.token.clone());
    tokio::spawn(async move {
        let _permit = permit;
        let Ok(client) = super::client(&config) else {
            return;
        };
        let bot = Bot {
            client: &client,
            base: &base,
            token: &token,
            allow_private_networks: config.allow_private_networks,
            timeout: config.timeout,
        };
        if let Err(e) = bot.typing(&conversation).await {
            tracing::debug!(class = e.class, "channels: typing not shown");
        }
    });
}
