//! The turn's output: the client's stream and the chat's events stream (S1, S2). Every
//! chunk goes to both; a client that goes away or stops reading cancels an attached turn
//! (T8), while a detached one's chunks reach the events stream only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use protocol::MessageId;
use protocol::parts::SourceDocument;
use protocol::ui::{ConnectorStatus, Notice, TurnInfo, UiChunk};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::TurnError;
use crate::events::Events;
use crate::liveness::Liveness;
use protocol::{ChatId, TurnId};

/// Where a turn's chunks go.
pub(super) struct Client {
    chat: ChatId,
    turn: TurnId,
    pub tx: mpsc::Sender<UiChunk>,
    /// The chat's events stream: every chunk sent to the client goes there too (S2).
    events: Events,
    cancel: CancellationToken,
    /// No client reads the stream (an approval answered by `POST /v1/approvals`, a
    /// background turn), or its agent lets it outlive its client (D1): a dropped or
    /// stalled receiver is not a cancel.
    detached: bool,
    /// How long a send waits for a client that stopped reading (`BRAIN_CLIENT_STALL_TIMEOUT_MS`).
    stall_timeout: Duration,
    /// Set once a send gave the client up; from then on nothing waits for it.
    stalled: AtomicBool,
    /// Shown once at the start of the stream (B2).
    connector_status: Vec<ConnectorStatus>,
    /// The sources of the passages recalled into the prompt (B5), shown once at the start
    /// of the stream, after the connector statuses.
    pub recalled: Vec<SourceDocument>,
    /// Hears whether the stream opened or why not, until the stream begins.
    pub started: Option<oneshot::Sender<Result<(), TurnError>>>,
    /// Every chunk shown, the tools' live ones included, is progress (T20).
    pub liveness: Liveness,
}

impl Client {
    pub fn new(
        (chat, turn): (ChatId, TurnId),
        tx: mpsc::Sender<UiChunk>,
        events: Events,
        cancel: CancellationToken,
        detached: bool,
        stall_timeout: Duration,
        connector_status: Vec<ConnectorStatus>,
    ) -> Self {
        Self {
            chat,
            turn,
            tx,
            events,
            cancel,
            detached,
            stall_timeout,
            stalled: AtomicBool::new(false),
            connector_status,
            recalled: Vec::new(),
            started: None,
            liveness: Liveness::default(),
        }
    }

    /// The client, showing `sources` (B5: the passages recalled into the prompt) when the
    /// stream opens.
    pub fn with_recalled(mut self, sources: Vec<SourceDocument>) -> Self {
        self.recalled = sources;
        self
    }

    /// Tells the caller to answer `200` with the stream, and opens it; once.
    pub async fn begin(&mut self, assistant_id: MessageId) {
        let Some(started) = self.started.take() else {
            return;
        };
        if started.send(Ok(())).is_err() && !self.detached {
            // The handler is gone: nobody will read this stream.
            self.cancel.cancel();
        }
        self.send(UiChunk::Start {
            message_id: assistant_id.to_string(),
        })
        .await;
        self.send(UiChunk::DataTurn {
            data: TurnInfo { turn_id: self.turn },
            transient: true,
        })
        .await;
        for status in &self.connector_status {
            self.send(UiChunk::DataConnectorStatus {
                data: status.clone(),
            })
            .await;
        }
        for source in std::mem::take(&mut self.recalled) {
            self.send(UiChunk::source_document(&source)).await;
        }
    }

    pub async fn notice(&self, code: &str, message: &str) {
        self.send(UiChunk::DataNotice {
            data: Notice {
                code: code.to_owned(),
                message: message.to_owned(),
            },
        })
        .await;
    }

    /// The sender tools get for their live chunks (worker status and logs): they reach the
    /// client as before, and the chat's events stream too. Tools only `try_send` (a live
    /// log is dropped rather than waited for), so the forwarder waits for the client at
    /// most as long as a send of the turn does; it ends when the tools drop their senders.
    pub fn tool_ui(&self) -> mpsc::Sender<UiChunk> {
        let (ui, mut from_tools) = mpsc::channel::<UiChunk>(super::CHUNK_BUFFER);
        let (events, chat, turn, tx) = (self.events.clone(), self.chat, self.turn, self.tx.clone());
        let stall = self.stall_timeout;
        let liveness = self.liveness.clone();
        tokio::spawn(async move {
            // Once the client is gone or stalled, the events stream still gets every chunk
            // (a background turn's observers follow it there).
            let mut client = true;
            while let Some(chunk) = from_tools.recv().await {
                liveness.progressed();
                events.publish(chat, turn, &chunk);
                client = client
                    && matches!(
                        tokio::time::timeout(stall, tx.send(chunk)).await,
                        Ok(Ok(()))
                    );
            }
        });
        ui
    }

    /// Sends a chunk to the client; `false` when the client is gone or has stopped
    /// reading. A client that leaves the channel full for the stall timeout is given up:
    /// the turn is cancelled (and stored `interrupted`), and later chunks are not waited
    /// for, so a connected client that never reads cannot hold its turn, or a drain.
    pub async fn send(&self, chunk: UiChunk) -> bool {
        self.liveness.progressed();
        // Observers see every chunk, also those of a turn whose client left; but an
        // authorization link is for the turn's own client only (B2, X1): every key holder
        // of the team may read the events stream.
        match &chunk {
            UiChunk::DataConnectorStatus { data } if data.authorize.is_some() => {
                let data = ConnectorStatus {
                    authorize: None,
                    ..data.clone()
                };
                self.events
                    .publish(self.chat, self.turn, &UiChunk::DataConnectorStatus { data });
            }
            _ => self.events.publish(self.chat, self.turn, &chunk),
        }
        let chunk = match self.tx.try_send(chunk) {
            Ok(()) => return true,
            // Nobody was meant to read it: the chunk is dropped, the turn goes on.
            Err(mpsc::error::TrySendError::Closed(_)) if self.detached => return true,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                // The body is gone, and with it the client: that is a cancel (T8), whoever
                // notices first.
                self.cancel.cancel();
                return false;
            }
            Err(mpsc::error::TrySendError::Full(chunk)) => chunk,
        };
        if self.stalled.load(Ordering::Relaxed) {
            return self.detached;
        }
        match tokio::time::timeout(self.stall_timeout, self.tx.send(chunk)).await {
            Ok(Ok(())) => true,
            Ok(Err(_)) if self.detached => true,
            Ok(Err(_)) => {
                self.cancel.cancel();
                false
            }
            Err(_) => {
                tracing::info!(turn = %self.turn, timeout_ms = self.stall_timeout.as_millis(), "client stopped reading; cancelling the turn");
                self.stalled.store(true, Ordering::Relaxed);
                if self.detached {
                    return true;
                }
                self.cancel.cancel();
                false
            }
        }
    }
}
