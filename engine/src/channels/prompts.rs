//! Approvals asked in a channel as the platform's buttons (P16). A turn of a channel's chat
//! that ends waiting for a tool call's approval has its reply carry one more message per
//! approval (`deliver.rs`): the call, and two buttons (Telegram's inline keyboard, Slack's
//! Block Kit `actions`). A button carries an opaque token of `channel_prompts` (migration
//! 0074) and `y` or `n`, never the approval's id: Telegram's `callback_data` holds 64 bytes,
//! and a client may send any data it likes, so the token is taken only from the channel
//! and the place it was asked in.
//!
//! A press is answered through [`answer::answer`], the one path every front end answers
//! with, as the person whose chat it is (the conversation's messages run as them, too): at
//! most once, whoever presses twice or however often the platform delivers the press. Only
//! a person the channel allows may answer; anyone else is told so and answers nothing.

use serde_json::Value;

use super::Platform;
use super::inbound::{self, REFUSAL};
use super::telegram::CallbackQuery;
use super::{Kind, slack, text};
use crate::Engine;
use crate::config::WebhooksConfig;
use crate::turn::TurnError;
use crate::turn::answer::{self, AnswerError, Reply};
use crate::turn::post::PostError;
use domain::approvals::ApprovalState;
use store::channels::{ChannelPrompt, OpenedChannel};
use store::{StoreError, bounded};

/// Characters of a call's input shown with its question at most.
const MAX_INPUT: usize = 500;
/// What a press is answered when it could not be taken now; the approval still waits.
const NOT_NOW: &str = "The agent cannot go on right now; try again in a moment.";
/// What a press of a button no prompt of this place has is answered.
const UNKNOWN: &str = "This button no longer answers anything.";

/// The two buttons of a prompt: their labels and data.
pub fn buttons(token: &str) -> [(&'static str, String); 2] {
    [
        ("Approve", format!("{token}:y")),
        ("Deny", format!("{token}:n")),
    ]
}

/// A button's data read back: its token and whether it approves.
fn parse(data: &str) -> Option<(&str, bool)> {
    match data.rsplit_once(':')? {
        (token, "y") => Some((token, true)),
        (token, "n") => Some((token, false)),
        _ => None,
    }
}

/// What a prompt asks, in Markdown.
pub fn question(prompt: &ChannelPrompt) -> String {
    asked(&prompt.tool, &prompt.input)
}

fn asked(tool: &str, input: &Value) -> String {
    let mut input = input.to_string();
    if input.chars().count() > MAX_INPUT {
        input = input.chars().take(MAX_INPUT).collect::<String>() + "…";
    }
    format!("The agent asks to run **{tool}**:\n\n```\n{input}\n```\n\nMay it?")
}

/// A prompt once answered: its question and how it ended, in Markdown.
fn outcome(tool: &str, input: &Value, state: ApprovalState) -> String {
    let ended = match state {
        ApprovalState::Pending => "Waiting for an answer.",
        ApprovalState::Approved => "Approved.",
        ApprovalState::Denied => "Denied.",
        ApprovalState::Expired => "Expired unanswered.",
        ApprovalState::Superseded => "Superseded by a newer message.",
        ApprovalState::Cancelled => "Cancelled.",
    };
    format!("{}\n\n**{ended}**", asked(tool, input))
}

/// A button pressed, once the platform's own form is read.
pub struct Press<'a> {
    pub kind: Kind,
    /// The platform's place the press came from (Telegram: the chat id; Slack: the
    /// channel id).
    pub place: &'a str,
    pub allowed: bool,
    /// The button's data.
    pub data: &'a str,
}

/// What became of a press.
#[derive(Debug, PartialEq, Eq)]
pub enum Pressed {
    /// No prompt of this channel and place has the button's token.
    Unknown,
    /// A person the channel does not allow: nothing answered.
    Refused,
    /// The approval's answer (by this press, or before it: it stays as it was), and what
    /// its message should now say (Markdown).
    Ended {
        state: ApprovalState,
        text: String,
        by_this: bool,
    },
    /// Not taken now (the agent busy, a quota reached): the approval still waits.
    NotNow,
}

impl Pressed {
    /// The short line shown to the person who pressed.
    pub fn notice(&self) -> &'static str {
        match self {
            Self::Unknown => UNKNOWN,
            Self::Refused => REFUSAL,
            Self::Ended {
                state: ApprovalState::Approved,
                by_this: true,
                ..
            } => "Approved.",
            Self::Ended {
                state: ApprovalState::Denied,
                by_this: true,
                ..
            } => "Denied.",
            Self::Ended { .. } => "This was answered already.",
            Self::NotNow => NOT_NOW,
        }
    }
}

/// Answers the approval a press names, if the press may. `Err`: the store could not say;
/// the platform delivers the press again, and it answers once.
pub async fn press(
    engine: &Engine,
    channel: &OpenedChannel,
    press: Press<'_>,
) -> Result<Pressed, StoreError> {
    engine
        .metrics
        .channel_message(press.kind.as_str(), "inbound");
    let Some((token, approved)) = parse(press.data) else {
        return Ok(Pressed::Unknown);
    };
    let prompt = match bounded(engine.store.channel_prompt(channel, token)).await {
        Ok(prompt) => prompt,
        Err(StoreError::NotFound) => return Ok(Pressed::Unknown),
        Err(e) => return Err(e),
    };
    let asked_in = match press.kind {
        Kind::Telegram => prompt.conversation.as_str(),
        Kind::Slack => slack::Conversation::parse(&prompt.conversation).channel,
    };
    if asked_in != press.place {
        return Ok(Pressed::Unknown);
    }
    if !press.allowed {
        engine
            .metrics
            .channel_message(press.kind.as_str(), "refused");
        return Ok(Pressed::Refused);
    }
    let Some(owner) = prompt.owner else {
        return Ok(Pressed::Unknown);
    };
    let principal = inbound::chat_person(channel, owner);
    let reply = Reply {
        approved: Some(approved),
        ..Reply::default()
    };
    match answer::answer(engine, &principal, prompt.approval, reply, None).await {
        Ok(answered) => {
            let a = answered.approval;
            let text = outcome(&a.tool, &a.input, a.state);
            Ok(Pressed::Ended {
                state: a.state,
                text,
                by_this: true,
            })
        }
        // Answered already (this press delivered again, or another person first): it
        // stays as it was. A tool call's approval says so through its continuation's
        // launch.
        Err(
            AnswerError::Conflict(_) | AnswerError::Post(PostError::Turn(TurnError::Conflict(_))),
        ) => {
            let a = bounded(engine.store.approval(channel.team, prompt.approval)).await?;
            if a.state == ApprovalState::Pending {
                return Ok(Pressed::NotNow);
            }
            let text = outcome(&a.tool, &a.input, a.state);
            Ok(Pressed::Ended {
                state: a.state,
                text,
                by_this: false,
            })
        }
        Err(AnswerError::NotFound) => Ok(Pressed::Unknown),
        Err(AnswerError::Store(e)) => Err(e),
        Err(e) => {
            tracing::info!(channel = %channel.row.id, error = %e, "channels: a press answered nothing");
            Ok(Pressed::NotNow)
        }
    }
}

/// A Telegram button pressed in `channel`: answered, then the press acknowledged
/// (`answerCallbackQuery`) and its message rewritten with the outcome, buttons gone.
pub async fn telegram(
    engine: &Engine,
    channel: &OpenedChannel,
    query: CallbackQuery,
) -> Result<Pressed, StoreError> {
    let user = query.from.id.to_string();
    let chat = query.message.as_ref().map(|m| m.chat.id.to_string());
    let pressed = match (&chat, query.data.as_deref()) {
        (Some(chat), Some(data)) => {
            let allowed = channel.row.allowed_users.contains(&user);
            let place = chat.as_str();
            let kind = Kind::Telegram;
            press(
                engine,
                channel,
                Press {
                    kind,
                    place,
                    allowed,
                    data,
                },
            )
            .await?
        }
        _ => Pressed::Unknown,
    };
    let message = query.message.as_ref().and_then(|m| m.message_id);
    let edit = match (&pressed, chat, message) {
        (Pressed::Ended { text, .. }, Some(chat), Some(message)) => {
            Some((chat, message, text::format(Kind::Telegram, text)))
        }
        _ => None,
    };
    let notice = pressed.notice();
    let query_id = query.id;
    tell(engine, channel, move |reach| async move {
        let platform = reach.platform();
        let bot = platform.bot();
        if let Err(e) = bot.answer_callback(&query_id, notice).await {
            tracing::debug!(class = e.class, "channels: press not acknowledged");
        }
        if let Some((chat, message, html)) = edit
            && let Err(e) = bot.edit_message(&chat, message, &html).await
        {
            tracing::debug!(class = e.class, "channels: prompt not rewritten");
        }
    });
    Ok(pressed)
}

/// A Slack `block_actions` in `channel`, its signature checked by the route: answered,
/// then its message rewritten with the outcome (`chat.update`), or the person told alone
/// (`chat.postEphemeral`) why nothing was.
pub async fn slack(
    engine: &Engine,
    channel: &OpenedChannel,
    interaction: slack::Interaction,
) -> Result<Pressed, StoreError> {
    let place = interaction.channel.map(|c| c.id);
    let user = interaction.user.map(|u| u.id);
    let data = interaction.actions.into_iter().next().and_then(|a| a.value);
    let (Some(place), Some(user), Some(data)) = (place, user, data) else {
        return Ok(Pressed::Unknown);
    };
    if interaction.kind != "block_actions" {
        return Ok(Pressed::Unknown);
    }
    let row = &channel.row;
    let allowed = row.allowed_users.contains(&user) || row.allowed_channels.contains(&place);
    let kind = Kind::Slack;
    let pressed = press(
        engine,
        channel,
        Press {
            kind,
            place: &place,
            allowed,
            data: &data,
        },
    )
    .await?;
    let ts = interaction.container.and_then(|c| c.message_ts);
    let edit = match (&pressed, ts) {
        (Pressed::Ended { text, .. }, Some(ts)) => Some((ts, text::format(kind, text))),
        _ => None,
    };
    let notice = pressed.notice();
    tell(engine, channel, move |reach| async move {
        let platform = reach.platform();
        let api = platform.api();
        let told = match edit {
            Some((ts, mrkdwn)) => api.update(&place, &ts, &mrkdwn, None).await,
            None => api.ephemeral(&place, &user, notice).await,
        };
        if let Err(e) = told {
            tracing::debug!(class = e.class, "channels: press not shown");
        }
    });
    Ok(pressed)
}

/// Runs `calls` to `channel`'s platform after the press's request is answered (Slack wants
/// its answer within three seconds), each call bounded by the webhooks' timeout. Best
/// effort: the approval's answer is recorded already.
fn tell<F, Fut>(engine: &Engine, channel: &OpenedChannel, calls: F)
where
    F: FnOnce(Reach) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let config = engine.config.webhooks;
    let (base, token) = (channel.row.api_base.clone(), channel.token.clone());
    tokio::spawn(async move {
        let Ok(client) = super::client(&config) else {
            return;
        };
        calls(Reach {
            client,
            base,
            token,
            config,
        })
        .await;
    });
}

/// What [`tell`]'s calls reach the platform with.
struct Reach {
    client: reqwest::Client,
    base: String,
    token: String,
    config: WebhooksConfig,
}

impl Reach {
    fn platform(&self) -> Platform<'_> {
        Platform {
            client: &self.client,
            base: &self.base,
            token: &self.token,
            config: &self.config,
        }
    }
}
