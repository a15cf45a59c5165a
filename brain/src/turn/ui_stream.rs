//! Encodes UI message stream chunks as a Server-Sent Events response (SPEC S1).
//!
//! The body owns the turn's cancellation guard: when the client goes away, hyper drops the
//! body, the guard cancels the turn, and the turn aborts its provider request.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::Stream;
use protocol::ui::{DONE_SENTINEL, UI_STREAM_HEADER, UI_STREAM_VERSION, UiChunk};
use tokio::sync::mpsc;
use tokio_util::sync::DropGuard;

/// One SSE event carrying `chunk`.
pub fn encode(chunk: &UiChunk) -> Bytes {
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(b"data: ");
    // Serializing our own closed types cannot fail; an empty object would still be valid SSE.
    if serde_json::to_writer(&mut buf, chunk).is_err() {
        buf.extend_from_slice(b"{}");
    }
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}

fn done() -> Bytes {
    Bytes::from(format!("data: {DONE_SENTINEL}\n\n"))
}

/// Where a stream's chunks come from.
enum Source {
    /// A running turn; `_guard` cancels it when the body is dropped.
    Live {
        rx: mpsc::Receiver<UiChunk>,
        _guard: DropGuard,
    },
    /// A stored result replayed for a retried message id.
    Replay(std::vec::IntoIter<UiChunk>),
}

/// The response body: chunks, then `data: [DONE]`.
pub struct UiBody {
    source: Source,
    done: bool,
}

impl UiBody {
    pub fn live(rx: mpsc::Receiver<UiChunk>, guard: DropGuard) -> Self {
        Self {
            source: Source::Live { rx, _guard: guard },
            done: false,
        }
    }

    pub fn replay(chunks: Vec<UiChunk>) -> Self {
        Self {
            source: Source::Replay(chunks.into_iter()),
            done: false,
        }
    }
}

impl Stream for UiBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let next = match &mut self.source {
            Source::Live { rx, .. } => match rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(next) => next,
            },
            Source::Replay(chunks) => chunks.next(),
        };
        Poll::Ready(Some(Ok(match next {
            Some(chunk) => encode(&chunk),
            None => {
                self.done = true;
                done()
            }
        })))
    }
}

impl IntoResponse for UiBody {
    fn into_response(self) -> Response {
        let mut response = Body::from_stream(self).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        headers.insert(
            UI_STREAM_HEADER,
            HeaderValue::from_static(UI_STREAM_VERSION),
        );
        // Reverse proxies (nginx) would otherwise buffer the stream.
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        response
    }
}
