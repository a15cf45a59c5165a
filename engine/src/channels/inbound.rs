//! A platform's message to a channel (P10): after the route checked that the platform
//! sent it (its secret or signature), the message becomes a detached turn of its
//! conversation's chat, acting for the person who opened that chat (a chat-scoped end
//! user named `telegram:<user id>` or `slack:<user id>`, whose memories and budgets are
//! theirs, L4), or a short refusal for a person not allowed.
//!
//! A redelivery runs once: the message's client id is the platform's update id (Slack's
//! `event_id`, the same on its retries), and a
//! second post of one client id starts nothing (T12). A message that finds the agent busy
//! waits its turn (busy policy `enqueue`, T13). A Slack message that starts a turn puts its
//! progress in the outbox (`progress.rs`); a Telegram one shows "typing…".

use std::time::Duration;

use protocol::ChatId;
use tokio::sync::Semaphore;

use super::telegram::{Bot, Update};
use super::{Kind, slack};
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
/// Conversations one replica shows "typing…" in at once; past it a message shows none.
const MAX_TYPING: usize = 64;
/// How often "typing…" is sent again while the turn runs (Telegram shows it ~5 s).
const TYPING_EVERY: Duration = Duration::from_secs(4);
/// The most times it is sent for one message (about ten minutes of a turn).
const TYPING_MAX: u32 = 150;

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
    let allowed = channel.row.allowed_users.contains(&user);
    let message = Message {
        kind: Kind::Telegram,
        conversation: &conversation,
        user: &user,
        allowed,
        text: &text,
        id: &update.update_id.to_string(),
    };
    let (inbound, chat) = message.post(engine, channel).await?;
    if let Some(chat) = chat {
        typing(engine, channel, conversation, chat);
    }
    Ok(inbound)
}

/// A Slack `event_callback` to `channel`, its signature checked by the route. A person
/// writes in a DM or a channel; the bot's own messages, edits and other subtypes are not
/// a person writing, and are ignored. Only `message` events are answered (an
/// `app_mention` arrives as a `message` too: answering both would answer twice).
pub async fn slack(
    engine: &Engine,
    channel: &OpenedChannel,
    envelope: slack::Envelope,
) -> Result<Inbound, InboundError> {
    let (Some(event_id), Some(event)) = (envelope.event_id, envelope.event) else {
        return Ok(Inbound::Ignored);
    };
    if event.kind != "message" || event.subtype.is_some() || event.bot_id.is_some() {
        return Ok(Inbound::Ignored);
    }
    let (Some(user), Some(text), Some(conversation)) = (
        event.user.as_deref(),
        event.text.as_deref(),
        slack::Conversation::of(&event),
    ) else {
        return Ok(Inbound::Ignored);
    };
    let allowed = channel.row.allowed_users.iter().any(|u| u == user)
        || channel
            .row
            .allowed_channels
            .iter()
            .any(|c| c == conversation.channel);
    let message = Message {
        kind: Kind::Slack,
        conversation: &conversation.key(),
        user,
        allowed,
        text,
        id: &event_id,
    };
    Ok(message.post(engine, channel).await?.0)
}

/// A person's text message in a conversation of a channel, once the platform's own form
/// is read.
struct Message<'a> {
    kind: Kind,
    conversation: &'a str,
    /// The platform's user id.
    user: &'a str,
    /// Whether the channel lets this person (or this place) talk to the agent.
    allowed: bool,
    text: &'a str,
    /// The platform's id of this delivery of the message (the same on a redelivery).
    id: &'a str,
}

impl Message<'_> {
    /// A detached turn of the conversation's chat (and that chat), or a refusal.
    async fn post(
        &self,
        engine: &Engine,
        channel: &OpenedChannel,
    ) -> Result<(Inbound, Option<ChatId>), InboundError> {
        let platform = self.kind.as_str();
        let person = format!("{platform}:{}", self.user);
        let metrics = &engine.metrics;
        metrics.channel_message(platform, "inbound");
        if !self.allowed {
            metrics.channel_message(platform, "refused");
            let refusal =
                engine
                    .store
                    .refuse_in_channel(channel, self.conversation, &person, REFUSAL);
            bounded(refusal).await?;
            return Ok((Inbound::Refused, None));
        }
        let opened = engine
            .store
            .channel_chat(channel, self.conversation, &person);
        let (chat, owner) = bounded(opened).await?;
        let principal = chat_person(channel, owner);
        let input = TurnInput {
            content: self.text.chars().take(MAX_TEXT).collect(),
            client_message_id: Some(format!("{platform}:{}", self.id)),
            files: Vec::new(),
            instructions: None,
        };
        let trigger = Trigger::User(input);
        let enqueue = Some(BusyPolicy::Enqueue);
        let posted = post::post_detached(engine, &principal, chat, trigger, enqueue, None).await?;
        let inbound = match posted {
            Detached::Started(turn, _) => {
                if self.kind == Kind::Slack {
                    let queued = engine.store.queue_channel_progress(
                        channel,
                        self.conversation,
                        chat,
                        turn.id,
                    );
                    // Best effort: without it the reply still comes, posted at the end.
                    if let Err(e) = bounded(queued).await {
                        tracing::warn!(error = %e, "channels: progress not queued");
                    }
                }
                Inbound::Started
            }
            Detached::Queued(_) => Inbound::Queued,
        };
        Ok((inbound, Some(chat)))
    }
}

/// The chat-scoped principal of `owner` (`telegram:<id>`, `slack:<id>`), the person whose
/// chat a conversation of `channel` is: whoever writes there, the turn is theirs.
pub(crate) fn chat_person(channel: &OpenedChannel, owner: String) -> Principal {
    Principal {
        team: channel.team,
        scope: Scope::Chat,
        user: Some(owner),
        sees_all_chats: false,
        key_id: None,
        key: None,
        expires: None,
    }
}

/// Shows "typing…" in the conversation while its chat has a turn running (this message's,
/// or the one it waits behind): Telegram shows it about five seconds, so it is sent again
/// every [`TYPING_EVERY`] until no turn of the chat runs (it ended, failed or was
/// stopped), at most [`TYPING_MAX`] times, and no longer than the replica runs turns.
/// Best effort: a failed call is only logged.
fn typing(engine: &Engine, channel: &OpenedChannel, conversation: String, chat: ChatId) {
    let Ok(permit) = TYPING.try_acquire() else {
        return;
    };
    let config = engine.config.webhooks;
    let (base, token) = (channel.row.api_base.clone(), channel.token.clone());
    let (store, team) = (engine.store.clone(), channel.team);
    let shutdown = engine.turns_cancel.clone();
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
        for _ in 0..TYPING_MAX {
            if let Err(e) = bot.typing(&conversation).await {
                tracing::debug!(class = e.class, "channels: typing not shown");
            }
            tokio::select! {
                // The indicator is about to fade: look whether the turn still runs.
                () = tokio::time::sleep(TYPING_EVERY) => {}
                // The replica gave up on its turns.
                () = shutdown.cancelled() => return,
            }
            match bounded(store.running_turn_of_chat(team, chat)).await {
                Ok(Some(_)) => {}
                // Nothing runs any more (or the store cannot say): the reply is due.
                Ok(None) | Err(_) => return,
            }
        }
    });
}
