//! A turn's own stream, resumed (`GET /v1/chats/{id}/stream`, a retried message id):
//! the turn's entries from its `start`, then live, rebuilt across a takeover, and followed
//! again on a new connection when the chat's reader loses its own.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use protocol::ui::UiChunk;
use protocol::{ChatId, ErrorCode, TurnId};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::auth::Standing;
use crate::sse;

use super::{
    Entry, Event, EventId, Events, EventsError, PAGE, Slot, Viewer, page_after, stream_key,
};

/// How far before a turn's start (by Postgres' clock) a resumed stream looks for its
/// entries, whose ids Redis stamps with its own clock.
const CLOCK_SKEW: Duration = Duration::from_secs(30);

impl Events {
    /// The chunks of `turn`, a running turn of `chat` whose row was written at `started`
    /// (ms, Postgres' clock), from its `start` on, then live until it ends: the AI SDK's
    /// resumable stream. `None` when its beginning is no longer in the window (trimmed, or
    /// dropped by the publisher): a client could not build its message on the rest.
    pub async fn follow_turn(
        &self,
        chat: ChatId,
        turn: TurnId,
        started: u64,
        stop: CancellationToken,
        viewer: Viewer,
    ) -> Result<Option<TurnStream>, EventsError> {
        let slot = self.admit(viewer.identity)?;
        // Subscribed first, as `observe` is: the cursor drops what replay and broadcast
        // both carry.
        let rx = self.subscribe(chat).await?;
        let mut stream = TurnStream {
            events: self.clone(),
            chat,
            replay: VecDeque::new(),
            rx,
            cursor: EventId::default(),
            turn,
            begun: false,
            live: false,
            steps: 0,
            restart: None,
            keepalive: self.0.config.keepalive,
            stop,
            authority: viewer.authority,
            ended: false,
            error_parts: true,
            _slot: slot,
        };
        // Entry ids are Redis' clock, which may run behind Postgres'.
        let from = EventId {
            ms: started.saturating_sub(CLOCK_SKEW.as_millis() as u64),
            ..EventId::default()
        }
        .to_string();
        match self.read_turn(&mut stream, from).await? {
            Read::Broken => Ok(None),
            Read::Open | Read::Ended => Ok(Some(stream)),
        }
    }

    /// Reads the entries of `stream`'s chat from `from` (an `XRANGE` bound) into its
    /// replay, page by page, until the end of the chat's stream or of the turn.
    async fn read_turn(
        &self,
        stream: &mut TurnStream,
        mut from: String,
    ) -> Result<Read, EventsError> {
        let limit = self.0.config.redis_timeout;
        let key = stream_key(stream.chat);
        let mut conn = self.connection().await?;
        loop {
            let page = page_after(&mut conn, &key, &from, limit).await?;
            let full = page.len() == PAGE;
            for (id, fields) in page {
                let Some(entry) = Entry::parse(&id, fields) else {
                    continue;
                };
                match stream.take(&entry) {
                    Taken::Broken => return Ok(Read::Broken),
                    Taken::Frame(frame) => stream.replay.push_back(frame),
                    Taken::Skipped => {}
                }
                if stream.ended {
                    return Ok(Read::Ended);
                }
            }
            if !full {
                return Ok(Read::Open);
            }
            from = format!("({}", stream.cursor.entry());
        }
    }
}

/// What a resumed turn stream makes of one entry of its chat.
enum Taken {
    /// Another turn's, or already given.
    Skipped,
    /// The SSE bytes of one of its chunks (with `[DONE]` after the last).
    Frame(Bytes),
    /// Its beginning, or a chunk after it, is missing: what follows cannot be built on.
    Broken,
}

/// How far reading a turn's entries from Redis got.
enum Read {
    /// To the end of the chat's stream; the turn goes on.
    Open,
    /// To the turn's last chunk.
    Ended,
    /// To a gap the turn's chunks cannot be built across.
    Broken,
}

/// Times a turn stream whose broadcast failed tries to follow the chat again.
const RECONNECT_ATTEMPTS: u32 = 3;
/// The pause before a further attempt, times the attempts made.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

/// One turn's stream, resumed (`GET /v1/chats/{id}/stream`): its chunks from `start`, then
/// live ones until its last, then `[DONE]`, like the stream of the request that started it.
///
/// It never stops mid-answer without saying so: when the chat's reader loses its Redis
/// connection (or this stream falls behind the broadcast), it follows the chat again (the
/// reader dials a new connection) and reads what followed its last entry from Redis; when
/// that fails, or it cannot go on for another reason (a gap in the turn's chunks, the
/// replica draining, the credentials revoked), it ends with an `error` part and `[DONE]`.
///
/// A turn taken over (D3, D5) starts its chunks over in the events stream: a second `start`,
/// the durable steps, a `data-notice` `resumed`, then the re-issued step live. Read before
/// the stream goes live, that restart replaces what was gathered (the dead replica's
/// partial step is never given); read live, the client already has the dead replica's
/// chunks, so it gets a `reset-step` (dropping the step that was lost) and only the durable
/// chunks past the steps it has.
pub struct TurnStream {
    /// To follow the chat again after its broadcast failed.
    events: Events,
    chat: ChatId,
    replay: VecDeque<Bytes>,
    rx: broadcast::Receiver<Arc<Event>>,
    cursor: EventId,
    turn: TurnId,
    /// Whether its `start` was given.
    begun: bool,
    /// Whether the replay was handed out and entries now come live.
    live: bool,
    /// The `start-step` chunks given since the last `start`.
    steps: usize,
    /// A restart read live, gathered until its `resumed` notice.
    restart: Option<Vec<(String, bool)>>,
    keepalive: Duration,
    stop: CancellationToken,
    authority: Standing,
    ended: bool,
    /// Whether an early end is said with an `error` part (see `quiet`).
    error_parts: bool,
    _slot: Slot,
}

/// The next step of a resumed turn stream.
pub enum Resumed {
    Bytes(Bytes),
    /// Nothing came for a keep-alive interval: the caller checks that the turn still
    /// runs (one that ended without its last chunk reaching the stream would otherwise be
    /// followed forever) and sends a keep-alive.
    Idle,
}

impl TurnStream {
    /// What `entry`'s parts after the cursor give, until the turn's last chunk.
    fn take(&mut self, entry: &Entry) -> Taken {
        if entry.chunks.is_empty() {
            if entry.id <= self.cursor {
                return Taken::Skipped;
            }
            self.cursor = entry.id;
            // A gap in the chat: once the turn began, some of its chunks may be in it.
            return if self.begun {
                Taken::Broken
            } else {
                Taken::Skipped
            };
        }
        let mut out = Vec::new();
        for (id, json) in entry.parts_after(self.cursor) {
            if self.ended {
                break;
            }
            self.cursor = id;
            if entry.turn == Some(self.turn) && self.take_chunk(json, &mut out).is_err() {
                return Taken::Broken;
            }
        }
        if out.is_empty() {
            Taken::Skipped
        } else {
            Taken::Frame(Bytes::from(out))
        }
    }

    /// Adds to `out` what one chunk of the turn gives; `Err` when it cannot be built on
    /// (the turn's beginning is missing).
    fn take_chunk(&mut self, json: &str, out: &mut Vec<u8>) -> Result<(), ()> {
        let kind = chunk_kind(json);
        if !self.begun {
            if kind != "start" {
                return Err(());
            }
            self.begun = true;
        } else if kind == "start" {
            // A takeover starts the turn's stream over.
            if self.live {
                self.restart = Some(Vec::new());
                return Ok(());
            }
            self.replay.clear();
            out.clear();
            self.steps = 0;
        }
        if let Some(gathered) = &mut self.restart {
            if kind != "data-notice" {
                gathered.push((json.to_owned(), kind == "start-step"));
                return Ok(());
            }
            let gathered = std::mem::take(gathered);
            self.restart = None;
            out.extend_from_slice(&self.rebuilt(gathered, json));
            return Ok(());
        }
        if kind == "start-step" {
            self.steps += 1;
        }
        // No `id:`: the stream is the turn's own, as its POST carried it.
        out.extend_from_slice(&sse::event(None, json));
        if matches!(kind, "finish" | "error" | "abort") {
            self.ended = true;
            out.extend_from_slice(&sse::done());
        }
        Ok(())
    }

    /// What a client that got the dead replica's chunks needs of a restart (`gathered`,
    /// each chunk with whether it opens a step, and its `notice`): the lost step dropped,
    /// then the durable chunks past the steps it already has (those are the same steps),
    /// then the notice.
    fn rebuilt(&mut self, gathered: Vec<(String, bool)>, notice: &str) -> Bytes {
        let had = self.steps;
        let mut out = sse::chunk(None, &UiChunk::ResetStep).to_vec();
        let mut steps = 0;
        for (json, opens) in gathered {
            if opens {
                steps += 1;
            }
            if had == 0 || steps > had {
                out.extend_from_slice(&sse::event(None, &json));
            }
        }
        self.steps = had.max(steps);
        out.extend_from_slice(&sse::event(None, notice));
        Bytes::from(out)
    }

    /// The next step; `None` once the turn's last chunk, or the `error` part that ended the
    /// stream early, was given.
    pub async fn next(&mut self) -> Option<Resumed> {
        if self.authority.lost().now_or_never().is_some() {
            if self.ended {
                return None;
            }
            return self.end_unauthorized();
        }
        if let Some(replayed) = self.replay.pop_front() {
            return Some(Resumed::Bytes(replayed));
        }
        if self.ended {
            return None;
        }
        self.live = true;
        loop {
            let received = tokio::select! {
                biased;
                () = self.stop.cancelled() => {
                    return self.end_with(
                        ErrorCode::ShuttingDown,
                        "this replica is shutting down; resume the stream on another",
                    );
                }
                () = self.authority.lost() => return self.end_unauthorized(),
                received = self.rx.recv() => received,
                () = tokio::time::sleep(self.keepalive) => return Some(Resumed::Idle),
            };
            let read = match received {
                Ok(event) => match &*event {
                    Event::Entry(entry) => match self.take(entry) {
                        Taken::Skipped => continue,
                        Taken::Frame(bytes) => return Some(Resumed::Bytes(bytes)),
                        Taken::Broken => Ok(Read::Broken),
                    },
                    Event::Failed => self.reconnect().await,
                },
                Err(
                    broadcast::error::RecvError::Lagged(_) | broadcast::error::RecvError::Closed,
                ) => self.reconnect().await,
            };
            match read {
                Ok(Read::Open) if self.replay.is_empty() => continue,
                Ok(Read::Open | Read::Ended) => return self.replay.pop_front().map(Resumed::Bytes),
                Ok(Read::Broken) => {
                    return self.end_with(
                        ErrorCode::EventsUnavailable,
                        "part of this turn's stream was lost; its messages show the answer once \
                         it ends",
                    );
                }
                Err(err) => {
                    tracing::warn!(error = %err, "turn stream could not follow its chat again");
                    return self.end_with(
                        ErrorCode::EventsUnavailable,
                        "the events stream could not be read; resume the stream",
                    );
                }
            }
        }
    }

    /// After the chat's broadcast failed or left this stream behind: follows the chat again
    /// and reads what followed the cursor from Redis into the replay.
    async fn reconnect(&mut self) -> Result<Read, EventsError> {
        let events = self.events.clone();
        let mut attempt = 0;
        loop {
            let read = async {
                self.rx = events.subscribe(self.chat).await?;
                // From the cursor's entry on: parts of it not given yet are taken.
                events
                    .read_turn(self, self.cursor.entry().to_string())
                    .await
            }
            .await;
            attempt += 1;
            match read {
                Err(err) if attempt < RECONNECT_ATTEMPTS => {
                    tracing::debug!(error = %err, attempt, "turn stream follows its chat again");
                    tokio::time::sleep(RECONNECT_PAUSE * attempt).await;
                }
                read => return read,
            }
        }
    }

    /// Ends early without an `error` part: for a translation whose clients would read one
    /// as the turn's own failure (an A2A task's subscription, which its client takes up
    /// again when it ends without the task's final state).
    pub fn quiet(mut self) -> Self {
        self.error_parts = false;
        self
    }

    /// Ends the stream after what the replay holds: an `error` part, then `[DONE]`.
    fn end_with(&mut self, code: ErrorCode, message: &str) -> Option<Resumed> {
        self.ended = true;
        if !self.error_parts {
            return self.replay.pop_front().map(Resumed::Bytes);
        }
        let mut out = sse::chunk(None, &UiChunk::error(code, message)).to_vec();
        out.extend_from_slice(&sse::done());
        self.replay.push_back(Bytes::from(out));
        self.replay.pop_front().map(Resumed::Bytes)
    }

    /// The turn ended (its row says so) and its last chunks never came: its replica died
    /// before publishing them, or the publisher dropped them.
    pub fn end_unseen(&mut self) -> Option<Resumed> {
        self.end_with(
            ErrorCode::EventsUnavailable,
            "this turn ended and its last chunks did not reach the events stream; its \
             messages show how it ended",
        )
    }

    /// The key was revoked or the token expired: what was not given yet is not.
    fn end_unauthorized(&mut self) -> Option<Resumed> {
        self.replay.clear();
        self.end_with(
            ErrorCode::Unauthorized,
            "the credentials of this stream were revoked or expired",
        )
    }
}

/// The `type` of a published chunk's JSON (`""` when it has none).
fn chunk_kind(json: &str) -> &str {
    #[derive(serde::Deserialize)]
    struct Kind<'a> {
        #[serde(rename = "type", borrow)]
        kind: &'a str,
    }
    serde_json::from_str::<Kind<'_>>(json)
        .map(|k| k.kind)
        .unwrap_or_default()
}
