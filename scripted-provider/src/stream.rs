//! A streamed reply as the wire formats write it and the server plays it: the request's
//! context a format renders with, and the events of the body, each due after its delay.
//! The formats (`openai.rs`, `anthropic.rs`) make the events; the server (`server.rs`)
//! writes them.

use std::time::{Duration, Instant};

use axum::body::Bytes;

use crate::plan::Piece;

/// What a wire format needs to know to render a reply.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub seq: usize,
    pub model: String,
    pub created: u64,
    pub input_tokens: u64,
    /// OpenAI `stream_options.include_usage`.
    pub include_usage: bool,
    /// What stamps count from.
    pub epoch: Instant,
}

/// One piece of a streamed body, written as soon as its delay has passed.
pub(crate) struct Event {
    pub delay: Duration,
    pub data: Data,
}

/// Turns a delta's text into the wire's event for it.
type Render = Box<dyn Fn(&str) -> String + Send>;

pub(crate) enum Data {
    Fixed(Bytes),
    /// A text delta carrying the instant it is written, rendered then.
    Stamp(Render),
    /// Written after every delay until the held streams are released.
    Held(Bytes),
}

impl Event {
    pub fn now(data: String) -> Event {
        Self::after(Duration::ZERO, data)
    }

    pub fn after(delay: Duration, data: String) -> Event {
        Event {
            delay,
            data: Data::Fixed(Bytes::from(data)),
        }
    }

    /// A text delta; `render` makes the wire's event of its text.
    pub fn text(
        delay: Duration,
        piece: &Piece,
        render: impl Fn(&str) -> String + Send + 'static,
    ) -> Event {
        let data = match piece {
            Piece::Fixed(text) | Piece::Thought(text) => Data::Fixed(Bytes::from(render(text))),
            Piece::Stamp => Data::Stamp(Box::new(render)),
            Piece::Held(text) => Data::Held(Bytes::from(render(text))),
        };
        Event { delay, data }
    }
}
