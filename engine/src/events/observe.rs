//! Observing: a chat's events stream (`GET /v1/chats/{id}/events`), its replay after a
//! `Last-Event-ID` and then the chat's broadcast.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt, Stream};
use protocol::ui::{Notice, Resync, TurnInfo, UiChunk};
use protocol::{ChatId, ErrorCode, TurnId};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::auth::Standing;
use crate::metrics::Metrics;
use crate::redis::bounded;
use crate::sse;

use super::{Entry, Event, EventId, Events, EventsError, PAGE, Slot, Viewer, stream_key};

/// Whether the entry `ARGV[1]` is still in the stream, the stream's first and last ids,
/// and the first page from `ARGV[1]` on (that entry included: the client may have had
/// only some of its parts), in one atomic step: a trim between the check and the read
/// would otherwise be a silent gap. (Trimming does not move Redis'
/// `max-deleted-entry-id`, so the check is "is the client's last event still there".)
pub(super) const REPLAY_SCRIPT: &str = r"
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if #first == 0 then return {0, 0, '0-0', '0-0', {}} end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local kept = #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
return {1, kept, first[1][1], last[1][1],
  redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])}
";

impl Events {
    /// An observer of `chat`: with `after`, what followed that event in the window (or a
    /// resync when part of it was trimmed), then live events until `stop`.
    pub async fn observe(
        &self,
        chat: ChatId,
        after: Option<EventId>,
        stop: CancellationToken,
        viewer: Viewer,
    ) -> Result<Observer, EventsError> {
        let slot = self.admit(viewer.identity)?;
        // Subscribed before the replay is read: whatever the replay misses, the broadcast
        // carries, and the cursor drops what both carry.
        let rx = self.subscribe(chat).await?;
        let mut observer = Observer {
            replay: VecDeque::new(),
            rx,
            cursor: after.unwrap_or_default(),
            turn: None,
            keepalive: self.0.config.keepalive,
            stop,
            authority: viewer.authority,
            metrics: self.0.metrics.clone(),
            ended: false,
            _observing: self.0.metrics.observing(),
            _slot: slot,
        };
        if let Some(after) = after {
            self.replay(chat, after, &mut observer).await?;
        }
        Ok(observer)
    }

    async fn replay(
        &self,
        chat: ChatId,
        after: EventId,
        observer: &mut Observer,
    ) -> Result<(), EventsError> {
        type Page = Vec<(String, Vec<String>)>;
        let limit = self.0.config.redis_timeout;
        let key = stream_key(chat);
        let mut conn = self.connection().await?;
        let (exists, kept, first, last, mut page): (i64, i64, String, String, Page) = bounded(
            limit,
            self.0
                .replay
                .key(&key)
                .arg(after.entry().to_string())
                .arg(PAGE)
                .invoke_async(&mut conn),
        )
        .await?;
        let first: EventId = first.parse().unwrap_or_default();
        let trimmed = if exists == 0 {
            // The whole stream expired: everything after `after` is older than the window.
            after > EventId::default()
        } else {
            // Gone, and older than what is left: trimmed, maybe with what followed it. (An
            // id that never was an entry but falls inside the window replays from there.)
            kept == 0 && first > after
        };
        if trimmed {
            observer.cursor = last.parse().map_or(after, EventId::whole);
            observer.replay.push_back(sse::chunk(
                None,
                &UiChunk::DataResync {
                    data: Resync {
                        reason: "trimmed".into(),
                    },
                    transient: true,
                },
            ));
            return Ok(());
        }
        loop {
            let full = page.len() == PAGE;
            for (id, fields) in page {
                if let Some(frame) = Entry::parse(&id, fields).and_then(|e| observer.frame(&e)) {
                    observer.replay.push_back(frame);
                }
            }
            if !full {
                return Ok(());
            }
            page = bounded(
                limit,
                redis::cmd("XRANGE")
                    .arg(&key)
                    .arg(format!("({}", observer.cursor.entry()))
                    .arg("+")
                    .arg("COUNT")
                    .arg(PAGE)
                    .query_async(&mut conn),
            )
            .await?;
        }
    }
}

/// One observer's stream: its replay, then the chat's broadcast.
pub struct Observer {
    replay: VecDeque<Bytes>,
    rx: broadcast::Receiver<Arc<Event>>,
    /// The last event given (or the one the client had): anything up to it is skipped.
    cursor: EventId,
    /// The turn the last event belonged to.
    turn: Option<TurnId>,
    keepalive: Duration,
    stop: CancellationToken,
    authority: Standing,
    metrics: Metrics,
    ended: bool,
    /// `brain_event_observers` counts this stream until its body is dropped.
    _observing: crate::metrics::Gauged,
    _slot: Slot,
}

impl Observer {
    /// The SSE bytes of `entry`'s parts after the cursor, preceded by a `data-turn` part
    /// (without an id, so a reconnect never skips the chunk itself) when they start
    /// another turn; `None` when the cursor is past them all.
    fn frame(&mut self, entry: &Entry) -> Option<Bytes> {
        if entry.chunks.is_empty() {
            if entry.id <= self.cursor {
                return None;
            }
            self.cursor = entry.id;
            return Some(sse::chunk(
                Some(&entry.id),
                &UiChunk::DataResync {
                    data: Resync {
                        reason: "dropped".into(),
                    },
                    transient: true,
                },
            ));
        }
        let mut out = Vec::new();
        for (id, json) in entry.parts_after(self.cursor) {
            self.cursor = id;
            if let Some(turn) = entry.turn
                && self.turn != Some(turn)
            {
                self.turn = Some(turn);
                out.extend_from_slice(&sse::chunk(
                    None,
                    &UiChunk::DataTurn {
                        data: TurnInfo { turn_id: turn },
                        transient: true,
                    },
                ));
            }
            out.extend_from_slice(&sse::event(Some(&id), json));
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    /// The next bytes of the stream; `None` once it ended.
    async fn next(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        if self.authority.lost().now_or_never().is_some() {
            return Some(self.end_unauthorized());
        }
        if let Some(replayed) = self.replay.pop_front() {
            return Some(replayed);
        }
        loop {
            let received = tokio::select! {
                biased;
                () = self.stop.cancelled() => {
                    // The replica drains; the client reconnects (to another) with its id.
                    self.ended = true;
                    return None;
                }
                () = self.authority.lost() => return Some(self.end_unauthorized()),
                received = self.rx.recv() => received,
                () = tokio::time::sleep(self.keepalive) => {
                    return Some(sse::keep_alive());
                }
            };
            return Some(match received {
                Ok(event) => match &*event {
                    Event::Entry(entry) => match self.frame(entry) {
                        Some(bytes) => bytes,
                        None => continue,
                    },
                    Event::Failed => self.end_unavailable(),
                },
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    self.ended = true;
                    self.metrics.observers_too_slow.inc();
                    sse::chunk(
                        None,
                        &UiChunk::DataNotice {
                            data: Notice {
                                code: "observer_too_slow".into(),
                                message: "this observer fell too far behind and was \
                                          disconnected; reconnect with Last-Event-ID"
                                    .into(),
                            },
                        },
                    )
                }
                Err(broadcast::error::RecvError::Closed) => self.end_unavailable(),
            });
        }
    }

    /// The key was revoked or the token expired: a reconnect is refused too.
    fn end_unauthorized(&mut self) -> Bytes {
        self.ended = true;
        sse::chunk(
            None,
            &UiChunk::error(
                ErrorCode::Unauthorized,
                "the credentials of this stream were revoked or expired",
            ),
        )
    }

    fn end_unavailable(&mut self) -> Bytes {
        self.ended = true;
        sse::chunk(
            None,
            &UiChunk::error(
                ErrorCode::EventsUnavailable,
                "the events stream could not be read; reconnect with Last-Event-ID",
            ),
        )
    }

    /// The observer as a body's stream of framed events.
    pub fn into_stream(self) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
        futures_util::stream::unfold(self, |mut observer| async move {
            let bytes = observer.next().await?;
            Some((Ok(bytes), observer))
        })
    }
}
