//! The run's Server-Sent Events body: `RUN_STARTED`, then the turn's chunks translated,
//! one `data: <event>` per event. It owns the turn's `UiBody`, hence its cancellation
//! guard: an AG-UI client that aborts its run closes the connection and stops the turn
//! (T8), unless the agent's `disconnect_policy` is `continue` (D1).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::Stream;

use super::events::Event;
use super::translate::Translator;
use engine::sse;
use engine::turn::ui_stream::UiBody;

/// A run's response body.
pub struct AguiBody {
    turn: Option<UiBody>,
    translator: Translator,
    ready: VecDeque<Bytes>,
    /// Headers the turn's admission left (`RateLimit`), or a refusal's (`Retry-After`).
    headers: HeaderMap,
}

impl AguiBody {
    /// The run of a started turn.
    pub fn live(translator: Translator, mut turn: UiBody) -> Self {
        let mut headers = HeaderMap::new();
        crate::respond::rate_limit(&turn.take_rate_limit(), &mut headers);
        let first = translator.started();
        Self {
            turn: Some(turn),
            translator,
            ready: VecDeque::from([encode(&first)]),
            headers,
        }
    }

    /// A run whose events are all known now (a queued message, a resume that started
    /// nothing yet).
    pub fn of(translator: Translator, events: Vec<Event>) -> Self {
        let first = translator.started();
        Self {
            turn: None,
            translator,
            ready: std::iter::once(&first).chain(&events).map(encode).collect(),
            headers: HeaderMap::new(),
        }
    }
}

/// A run refused before its turn started (a quota, the busy agent, an overloaded
/// replica): one `RUN_ERROR` with the stable code, and the refusal's `Retry-After` and
/// `RateLimit` headers, as `POST /v1/chats/{id}/messages` would have answered them.
pub fn refused(code: &str, message: String, headers: HeaderMap) -> AguiBody {
    let event = Event::RunError {
        message,
        code: code.to_owned(),
    };
    AguiBody {
        turn: None,
        translator: Translator::new(String::new(), String::new()),
        ready: VecDeque::from([encode(&event)]),
        headers,
    }
}

fn encode(event: &Event) -> Bytes {
    // Serializing our own closed types cannot fail; an empty object would still be valid SSE.
    let json = serde_json::to_string(event).unwrap_or_else(|_| "{}".into());
    sse::event(None, &json)
}

impl Stream for AguiBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(bytes) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(bytes)));
            }
            let Some(turn) = this.turn.as_mut() else {
                return Poll::Ready(None);
            };
            let events = match turn.poll_chunk(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(chunk)) => this.translator.push(chunk),
                Poll::Ready(None) => {
                    this.turn = None;
                    this.translator.end()
                }
            };
            this.ready.extend(events.iter().map(encode));
        }
    }
}

impl IntoResponse for AguiBody {
    fn into_response(mut self) -> Response {
        let headers = std::mem::take(&mut self.headers);
        let mut response = crate::respond::event_stream(Body::from_stream(self));
        response.headers_mut().extend(headers);
        response
    }
}
