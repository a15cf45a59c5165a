//! The turn's UI message stream as a Server-Sent Events response body (SPEC S1), framed
//! by `crate::sse` as the events stream is.
//!
//! The body owns the turn's cancellation guard: when the client goes away, hyper drops the
//! body, the guard cancels the turn, and the turn aborts its provider request (unless the
//! agent's `disconnect_policy` is `continue`, D1: then there is no guard). The turn is
//! its principal's: when the key is revoked or the token expires, the body ends with an
//! `unauthorized` error part, and the turn stops as if its client had gone.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use protocol::ErrorCode;
use protocol::ui::UiChunk;
use tokio::sync::mpsc;
use tokio_util::sync::DropGuard;

use crate::auth::Standing;
use crate::quota::RateLimitHeaders;
use crate::sse;

/// Where a stream's chunks come from.
enum Source {
    /// A running turn; `_guard` cancels it when the body is dropped, unless its agent
    /// lets it outlive its client (D1: no guard).
    Live {
        /// Declared first, so dropped first: the turn is cancelled before its channel
        /// closes, and a turn woken by the closed channel finds itself cancelled rather
        /// than starting another tool (T8).
        _guard: Option<DropGuard>,
        rx: mpsc::Receiver<UiChunk>,
    },
    /// A stored result replayed for a retried message id.
    Replay(std::vec::IntoIter<UiChunk>),
}

/// The response body: chunks, then `data: [DONE]`.
pub struct UiBody {
    source: Source,
    /// No chunk follows.
    done: bool,
    /// The principal's authority ended the stream (no `[DONE]` then).
    revoked: bool,
    /// The SSE framing sent its last event.
    closed: bool,
    /// The team's `RateLimit` fields as the turn's admission left them (E2).
    rate_limit: RateLimitHeaders,
    /// Ready once the principal's authority ended.
    lost: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl UiBody {
    pub fn live(rx: mpsc::Receiver<UiChunk>, guard: Option<DropGuard>) -> Self {
        Self {
            source: Source::Live { _guard: guard, rx },
            done: false,
            revoked: false,
            closed: false,
            rate_limit: RateLimitHeaders::default(),
            lost: None,
        }
    }

    /// Ends the stream when `authority` ends.
    pub fn until(self, authority: Standing) -> Self {
        Self {
            lost: Some(Box::pin(async move { authority.lost().await })),
            ..self
        }
    }

    pub fn with_rate_limit(self, rate_limit: RateLimitHeaders) -> Self {
        Self { rate_limit, ..self }
    }

    /// The next chunk, for a front end that frames chunks its own way (the MCP server,
    /// P2); `None` after the last. Watching the principal's standing is then the caller's.
    pub async fn next_chunk(&mut self) -> Option<UiChunk> {
        match &mut self.source {
            Source::Live { rx, .. } => rx.recv().await,
            Source::Replay(chunks) => chunks.next(),
        }
    }

    pub fn replay(chunks: Vec<UiChunk>) -> Self {
        Self {
            source: Source::Replay(chunks.into_iter()),
            done: false,
            revoked: false,
            closed: false,
            rate_limit: RateLimitHeaders::default(),
            lost: None,
        }
    }
}

impl UiBody {
    /// The next chunk; once the principal's authority ended, an `unauthorized` error
    /// chunk, then `None`. Other front ends (the service's `agui`) translate these.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<UiChunk>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(lost) = &mut self.lost
            && lost.as_mut().poll(cx).is_ready()
        {
            self.done = true;
            self.revoked = true;
            return Poll::Ready(Some(UiChunk::error(
                ErrorCode::Unauthorized,
                "the credentials of this stream were revoked or expired",
            )));
        }
        let next = match &mut self.source {
            Source::Live { rx, .. } => match rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(next) => next,
            },
            Source::Replay(chunks) => chunks.next(),
        };
        if next.is_none() {
            self.done = true;
        }
        Poll::Ready(next)
    }

    /// The team's `RateLimit` fields, for a front end that writes its own response.
    pub fn take_rate_limit(&mut self) -> RateLimitHeaders {
        std::mem::take(&mut self.rate_limit)
    }
}

impl Stream for UiBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(None);
        }
        match this.poll_chunk(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(chunk)) => Poll::Ready(Some(Ok(sse::chunk(None, &chunk)))),
            // A stream whose credentials ended stops at its error, without `[DONE]`.
            Poll::Ready(None) => {
                this.closed = true;
                Poll::Ready((!this.revoked).then(|| Ok(sse::done())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::{Arc, Mutex};

    use futures_util::task::{ArcWake, waker};
    use tokio_util::sync::CancellationToken;

    use super::*;

    /// Records, at the moment a waiting sender is woken, whether the turn was cancelled.
    struct Probe {
        turn: CancellationToken,
        cancelled_when_woken: Mutex<Option<bool>>,
    }

    impl ArcWake for Probe {
        fn wake_by_ref(probe: &Arc<Self>) {
            if let Ok(mut seen) = probe.cancelled_when_woken.lock() {
                seen.get_or_insert(probe.turn.is_cancelled());
            }
        }
    }

    /// A turn that learns its client is gone (its send fails) is already cancelled, so it
    /// can never start a tool in between (T8).
    #[test]
    fn the_turn_is_cancelled_before_its_channel_closes() {
        let turn = CancellationToken::new();
        let (tx, rx) = mpsc::channel(1);
        tx.try_send(UiChunk::StartStep).unwrap();
        let body = UiBody::live(rx, Some(turn.clone().drop_guard()));
        let probe = Arc::new(Probe {
            turn: turn.clone(),
            cancelled_when_woken: Mutex::new(None),
        });
        let waker = waker(probe.clone());
        let mut cx = Context::from_waker(&waker);
        let mut send = Box::pin(tx.send(UiChunk::FinishStep));
        assert!(
            send.as_mut().poll(&mut cx).is_pending(),
            "the channel is full"
        );
        drop(body);
        assert_eq!(*probe.cancelled_when_woken.lock().unwrap(), Some(true));
        assert!(send.as_mut().poll(&mut cx).is_ready());
    }
}
