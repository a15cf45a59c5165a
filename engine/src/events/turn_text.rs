//! A running turn's text so far, read from its chat's stream (S2) by any replica: what a
//! channel shows while the answer streams (Slack's message updated in place, P15).

use protocol::ui::UiChunk;
use protocol::{ChatId, TurnId};

use super::{Entry, EventId, Events, EventsError, PAGE, page_after, stream_key};

/// What a read of a turn's text brought.
#[derive(Debug, Default)]
pub struct TextRead {
    /// The text deltas of the turn after the read's start, in order.
    pub delta: String,
    /// Where the next read starts.
    pub next: TextCursor,
    /// Whether the turn's last chunk (its finish, or an error) was read.
    pub ended: bool,
}

/// A place in a chat's stream, past which a read goes on.
#[derive(Clone, Copy, Debug, Default)]
pub struct TextCursor(Option<EventId>);

impl Events {
    /// The text `turn` of `chat` streamed after `after`, every page of it to the stream's
    /// end (each `XRANGE` bounded). Deltas trimmed from the stream's window are not there.
    pub async fn turn_text(
        &self,
        chat: ChatId,
        turn: TurnId,
        after: TextCursor,
    ) -> Result<TextRead, EventsError> {
        let limit = self.0.config.redis_timeout;
        let key = stream_key(chat);
        let mut conn = self.connection().await?;
        let mut read = TextRead {
            next: after,
            ..TextRead::default()
        };
        loop {
            let from = match read.next.0 {
                Some(id) => format!("({}", id.entry()),
                None => "-".to_owned(),
            };
            let page = page_after(&mut conn, &key, &from, limit).await?;
            let full = page.len() == PAGE;
            for (id, fields) in page {
                let Some(entry) = Entry::parse(&id, fields) else {
                    continue;
                };
                read.next = TextCursor(Some(entry.id));
                if entry.turn != Some(turn) {
                    continue;
                }
                for json in &entry.chunks {
                    match serde_json::from_str::<UiChunk>(json) {
                        Ok(UiChunk::TextDelta { delta, .. }) => read.delta.push_str(&delta),
                        Ok(UiChunk::Finish { .. } | UiChunk::Error { .. }) => read.ended = true,
                        _ => {}
                    }
                }
            }
            if !full || read.ended {
                return Ok(read);
            }
        }
    }
}
