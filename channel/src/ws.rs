//! An rmcp transport over a WebSocket, for either role.
//!
//! [`split`] turns a `WebSocketStream` into the `(Sink, Stream)` pair rmcp's `serve`
//! accepts, plus a [`Control`] handle for what MCP does not cover: pings, the time the
//! peer was last heard from, a close with a code and reason, and why the channel ended.
//!
//! One writer task owns the socket's write half, so rmcp's messages, pings and the final
//! close frame never interleave mid-frame. The read half decodes text frames as JSON-RPC;
//! anything else ends the stream (rmcp then ends the session) and is recorded in
//! [`Control::end`], so a failure always says which way it failed.

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use futures_channel::mpsc;
use futures_util::stream::SplitStream;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use rmcp::service::{RxJsonRpcMessage, ServiceRole, TxJsonRpcMessage};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

/// Frames waiting for the writer; beyond this, senders wait.
const OUTBOX: usize = 64;

/// Why a channel ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChannelEnd {
    /// The peer sent a close frame.
    Closed { code: u16, reason: String },
    /// The socket ended without a close frame.
    Eof,
    /// Reading failed; the string is an error class, not a message.
    SocketError(&'static str),
    /// A text frame that is not a JSON-RPC message for this role.
    Undecodable,
    /// A binary frame: the channel carries JSON text only.
    BinaryFrame,
}

/// Writing to a channel that has ended, or a message that cannot be encoded.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("the channel is closed")]
    Closed,
    #[error("message could not be encoded")]
    Encode(#[from] serde_json::Error),
}

impl From<mpsc::SendError> for ChannelError {
    fn from(_: mpsc::SendError) -> Self {
        Self::Closed
    }
}

struct Shared {
    last_seen: Mutex<Instant>,
    end: watch::Sender<Option<ChannelEnd>>,
}

impl Shared {
    fn touch(&self) {
        if let Ok(mut seen) = self.last_seen.lock() {
            *seen = Instant::now();
        }
    }

    fn finish(&self, end: ChannelEnd) {
        self.end.send_if_modified(|slot| {
            if slot.is_none() {
                *slot = Some(end);
                true
            } else {
                false
            }
        });
    }
}

/// Pings, liveness and close for a channel whose messages rmcp drives.
#[derive(Clone)]
pub struct Control {
    out: mpsc::Sender<Message>,
    shared: Arc<Shared>,
}

impl Control {
    /// When a frame (any frame, pongs included) last arrived.
    pub fn last_seen(&self) -> Instant {
        self.shared
            .last_seen
            .lock()
            .map(|seen| *seen)
            .unwrap_or_else(|_| Instant::now())
    }

    /// Why the channel ended, once it has.
    pub fn end(&self) -> Option<ChannelEnd> {
        self.shared.end.borrow().clone()
    }

    /// Resolves when the read side has ended, with the reason.
    pub async fn ended(&self) -> ChannelEnd {
        let mut rx = self.shared.end.subscribe();
        loop {
            if let Some(end) = rx.borrow_and_update().clone() {
                return end;
            }
            if rx.changed().await.is_err() {
                return ChannelEnd::Eof;
            }
        }
    }

    /// Sends a ping; the peer's WebSocket layer answers it without involving MCP.
    pub async fn ping(&self) -> Result<(), ChannelError> {
        self.out
            .clone()
            .send(Message::Ping(Vec::new().into()))
            .await?;
        Ok(())
    }

    /// Sends a close frame with `code` and `reason`; the writer stops after it.
    pub async fn close(&self, code: u16, reason: &str) {
        let frame = CloseFrame {
            code: CloseCode::from(code),
            reason: reason.to_owned().into(),
        };
        // A channel already gone needs no close frame.
        let _ = self.out.clone().send(Message::Close(Some(frame))).await;
    }
}

/// The read half as rmcp's message stream.
pub struct Incoming<R, S> {
    inner: SplitStream<WebSocketStream<S>>,
    shared: Arc<Shared>,
    done: bool,
    _role: PhantomData<fn() -> R>,
}

impl<R, S> Stream for Incoming<R, S>
where
    R: ServiceRole,
    S: AsyncRead + AsyncWrite + Unpin,
{
    type Item = RxJsonRpcMessage<R>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            let end = match self.inner.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(Message::Text(text)))) => {
                    self.shared.touch();
                    match serde_json::from_str::<RxJsonRpcMessage<R>>(text.as_str()) {
                        Ok(message) => return Poll::Ready(Some(message)),
                        Err(_) => ChannelEnd::Undecodable,
                    }
                }
                Poll::Ready(Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)))) => {
                    self.shared.touch();
                    continue;
                }
                Poll::Ready(Some(Ok(Message::Binary(_)))) => ChannelEnd::BinaryFrame,
                Poll::Ready(Some(Ok(Message::Close(frame)))) => ChannelEnd::Closed {
                    code: frame.as_ref().map(|f| u16::from(f.code)).unwrap_or(1005),
                    reason: frame
                        .map(|f| f.reason.as_str().to_owned())
                        .unwrap_or_default(),
                },
                Poll::Ready(Some(Err(err))) => ChannelEnd::SocketError(error_class(&err)),
                Poll::Ready(None) => ChannelEnd::Eof,
            };
            tracing::debug!(end = ?end, "channel read side ended");
            self.shared.finish(end);
            self.done = true;
        }
    }
}

fn error_class(err: &tokio_tungstenite::tungstenite::Error) -> &'static str {
    use tokio_tungstenite::tungstenite::Error;
    match err {
        Error::ConnectionClosed | Error::AlreadyClosed => "closed",
        Error::Io(_) => "io",
        Error::Protocol(_) => "protocol",
        Error::Capacity(_) => "capacity",
        Error::Utf8(_) => "utf8",
        _ => "other",
    }
}

/// Splits `ws` into rmcp's transport halves for role `R`, and the channel's control.
#[allow(clippy::type_complexity)]
pub fn split<R, S>(
    ws: WebSocketStream<S>,
) -> (
    impl Sink<TxJsonRpcMessage<R>, Error = ChannelError> + Send + Unpin + 'static,
    Incoming<R, S>,
    Control,
)
where
    R: ServiceRole,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut write, read) = ws.split();
    let (out, mut outbox) = mpsc::channel::<Message>(OUTBOX);
    let (end, _) = watch::channel(None);
    let shared = Arc::new(Shared {
        last_seen: Mutex::new(Instant::now()),
        end,
    });
    tokio::spawn(async move {
        while let Some(message) = outbox.next().await {
            let closing = matches!(message, Message::Close(_));
            if write.send(message).await.is_err() || closing {
                break;
            }
        }
        // Every sender is gone or the socket failed: end the write side cleanly.
        let _ = write.close().await;
    });
    let sink = out
        .clone()
        .sink_map_err(ChannelError::from)
        .with(|message: TxJsonRpcMessage<R>| {
            futures_util::future::ready(
                serde_json::to_string(&message)
                    .map(Message::text)
                    .map_err(ChannelError::from),
            )
        });
    let incoming = Incoming {
        inner: read,
        shared: shared.clone(),
        done: false,
        _role: PhantomData,
    };
    (sink, incoming, Control { out, shared })
}
