//! A Slack message that shows the answer as it streams (P15): Slack's bots have no typing
//! indicator in the Web API, so a message is posted in the conversation once the turn has
//! text and updated in place (`chat.update`) as more comes, at most once every
//! [`EVERY`]; the reply's first part then takes that message's place (`deliver.rs`).
//!
//! It is an outbox row of its own (`channel.progress`, written when the message starts
//! the turn, ahead of the reply's row, which waits behind it: P15's order), so it is shown
//! by one replica at a time under the delivery router's claim: each update is recorded
//! under the claim, which extends it, and a replica whose claim lapsed stops; whoever
//! claims the row next goes on updating the same message. The text is read from the
//! chat's events stream (S2), so any replica can show any turn's.

use std::time::Duration;

use super::Platform;
use super::slack::Conversation;
use super::{CallError, Kind, text};
use crate::events::{Events, TextCursor};
use protocol::{ChatId, TurnId};
use store::webhooks::ClaimedDelivery;
use store::{Store, TurnStatus, bounded};

/// The least time between two updates of the message (Slack's `chat.update` is rate
/// limited around one a second per conversation).
pub const EVERY: Duration = Duration::from_secs(1);
/// Ticks at most (about ten minutes of a turn); past them the reply still comes.
const MAX_TICKS: u32 = 600;
/// Shown after the text while it streams.
const STREAMING: &str = " …";

/// Shows delivery `delivery`'s turn streaming in its conversation until the turn ends.
/// `Ok`: the turn ended (or another replica has the row).
pub async fn show(
    store: &Store,
    events: &Events,
    platform: &Platform<'_>,
    delivery: &ClaimedDelivery,
    lease: Duration,
) -> Result<(), CallError> {
    let body = &delivery.body;
    let conversation = body["conversation"].as_str().unwrap_or_default();
    let id = |name: &str| body[name].as_str().and_then(|t| t.parse().ok());
    let (Some(chat), Some(turn)) = (id("chat_id").map(ChatId), id("turn_id").map(TurnId)) else {
        return Ok(());
    };
    let to = Conversation::parse(conversation);
    let api = platform.api();
    let mut ts = body["ts"].as_str().map(str::to_owned);
    let (mut streamed, mut shown) = (String::new(), String::new());
    let mut cursor = TextCursor::default();
    for _ in 0..MAX_TICKS {
        // A turn that answers within a tick shows no progress: its reply comes at once.
        tokio::time::sleep(EVERY).await;
        let mut ended = match bounded(store.turn_state(delivery.team, turn)).await {
            Ok(state) => !matches!(state.status, TurnStatus::Queued | TurnStatus::Running),
            Err(_) => return Err(CallError::transient("store")),
        };
        match events.turn_text(chat, turn, cursor).await {
            Ok(read) => {
                streamed.push_str(&read.delta);
                cursor = read.next;
                ended |= read.ended;
            }
            // Nothing to show this tick; the turn's end is still seen in the store.
            Err(e) => tracing::debug!(error = %e, "channels: progress not read"),
        }
        // The reply itself shows the end.
        if ended {
            return Ok(());
        }
        if !streamed.trim().is_empty() && streamed != shown {
            let first = text::parts(Kind::Slack, &streamed)
                .into_iter()
                .next()
                .map(|(formatted, _)| formatted)
                .unwrap_or_default();
            let showing = format!("{first}{STREAMING}");
            match &ts {
                Some(ts) => api.update(to.channel, ts, &showing, None).await?,
                None => ts = api.post_message(&to, &showing, None).await?,
            }
            shown.clone_from(&streamed);
        }
        // Each tick holds the claim (and records the message), fenced by it.
        let held =
            store.record_channel_message(delivery.id, delivery.attempt, ts.as_deref(), lease);
        match bounded(held).await {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(_) => return Err(CallError::transient("store")),
        }
    }
    Ok(())
}
