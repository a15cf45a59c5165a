//! The events stream of a chat (SPEC S2): every chunk of every turn of the chat, whoever
//! started it, for observers on any replica.
//!
//! Publishing: [`Events::publish`], called by the turn for each chunk it emits, only puts
//! the chunk on a bounded channel, so a turn never waits for Redis. One publisher task per
//! replica writes what the channel holds in one pipeline to the chat's Redis Stream
//! (`XADD MAXLEN ~`; then `XTRIM MINID ~` and `PEXPIRE` for each chat of the batch not
//! already kept up in the last tenth of the window, at most 5 s: the window is both a count
//! and an age, and a chat in a run of turns is trimmed a few times a window, not per
//! batch). A full channel or a failed batch drops chunks: they are counted, and the chat
//! gets a `resync` entry, so its observers learn of the gap instead of missing events
//! silently.
//!
//! Observing: one reader task per chat per replica (`XREAD BLOCK` on a connection of its
//! own) broadcasts entries to every local observer of the chat. An observer subscribes
//! first, then replays what it missed (`XRANGE` after its `Last-Event-ID`, in a script that
//! also tells whether anything after that id was trimmed), then follows the broadcast,
//! skipping what the replay already gave: no gap, no duplicate. The broadcast ring is the
//! observer buffer: an observer that falls further behind is disconnected with a notice,
//! and neither the reader nor any turn waits for it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::Stream;
use protocol::ui::{Notice, Resync, TurnInfo, UiChunk};
use protocol::{ChatId, ErrorCode, TurnId};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, RedisError};
use tokio::sync::{OnceCell, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::config::EventsConfig;
use crate::metrics::Metrics;

/// Chunks written in one pipeline at most.
const MAX_BATCH: usize = 512;
/// Chats remembered as kept up before the ones no longer due are forgotten.
const MAX_KEPT_UP: usize = 4096;
/// How long a reader blocks in one `XREAD`; a reader whose observers all left stops
/// within this.
const READ_BLOCK: Duration = Duration::from_secs(2);
/// Entries per `XRANGE` page of a replay, and per `XREAD` of a reader.
const PAGE: usize = 1000;
/// How far before a turn's start (by Postgres' clock) a resumed stream looks for its
/// entries, whose ids Redis stamps with its own clock.
const CLOCK_SKEW: Duration = Duration::from_secs(30);

/// Whether the entry `ARGV[1]` is still in the stream, the stream's first and last ids,
/// and the first page after `ARGV[1]`, in one atomic step: a trim between the check and
/// the read would otherwise be a silent gap. (Trimming does not move Redis'
/// `max-deleted-entry-id`, so the check is "is the client's last event still there".)
const REPLAY_SCRIPT: &str = r"
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if #first == 0 then return {0, 0, '0-0', '0-0', {}} end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local kept = #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
return {1, kept, first[1][1], last[1][1],
  redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])}
";

/// Why the events stream could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// Redis refused, failed or timed out; the class names which.
    #[error("events stream unavailable ({0})")]
    Unavailable(&'static str),
}

/// A Redis stream entry id, `<ms>-<seq>`: the SSE `id:` of an event and what
/// `Last-Event-ID` carries back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct EventId {
    ms: u64,
    seq: u64,
}

impl FromStr for EventId {
    type Err = ();

    fn from_str(raw: &str) -> Result<Self, ()> {
        let (ms, seq) = raw.trim().split_once('-').ok_or(())?;
        Ok(Self {
            ms: ms.parse().map_err(|_| ())?,
            seq: seq.parse().map_err(|_| ())?,
        })
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// What a reader broadcasts to the observers of its chat.
#[derive(Debug)]
enum Event {
    Entry(Entry),
    /// The reader could not read Redis and stopped.
    Failed,
}

/// One entry of a chat's stream.
#[derive(Debug)]
struct Entry {
    id: EventId,
    turn: Option<TurnId>,
    /// The chunk's JSON as published, or `None` for a resync marker.
    chunk: Option<String>,
}

impl Entry {
    /// An entry from its id and its flat field list; `None` for an id that is not one.
    fn parse(id: &str, fields: Vec<String>) -> Option<Self> {
        let mut entry = Self {
            id: id.parse().ok()?,
            turn: None,
            chunk: None,
        };
        let mut fields = fields.into_iter();
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            match name.as_str() {
                "t" => entry.turn = value.parse().ok(),
                "c" => entry.chunk = Some(value),
                _ => {}
            }
        }
        Some(entry)
    }
}

/// A chunk on its way to the publisher.
struct Published {
    chat: ChatId,
    turn: TurnId,
    chunk: UiChunk,
}

/// This replica's side of the chat events streams: the publisher's channel and the
/// readers of the chats observed here. Cheap to clone.
#[derive(Clone)]
pub struct Events(Arc<Inner>);

struct Inner {
    config: EventsConfig,
    client: redis::Client,
    connection: OnceCell<ConnectionManager>,
    replay: redis::Script,
    metrics: Metrics,
    tx: mpsc::Sender<Published>,
    /// Taken by the publisher task when it starts.
    rx: Mutex<Option<mpsc::Receiver<Published>>>,
    /// Chats that lost chunks since the last batch; each gets a resync entry.
    gaps: Mutex<HashSet<ChatId>>,
    /// One broadcast per observed chat, fed by that chat's reader task.
    readers: Mutex<HashMap<ChatId, broadcast::Sender<Arc<Event>>>>,
}

fn stream_key(chat: ChatId) -> String {
    format!("events:chat:{chat}")
}

fn error_class(err: &RedisError) -> &'static str {
    if err.is_connection_refusal() {
        "connection_refused"
    } else if err.is_timeout() {
        "timeout"
    } else if err.is_io_error() {
        "io"
    } else {
        "redis"
    }
}

/// Runs one Redis call under `limit`.
async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, EventsError> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(EventsError::Unavailable(error_class(&err))),
        Err(_) => Err(EventsError::Unavailable("timeout")),
    }
}

/// How often a chat's stream is trimmed by age and its expiry pushed back: a tenth of the
/// window, at most 5 s.
fn keep_up_every(window: Duration) -> Duration {
    (window / 10).min(Duration::from_secs(5))
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

impl Events {
    pub fn new(client: redis::Client, config: EventsConfig, metrics: Metrics) -> Self {
        let (tx, rx) = mpsc::channel(config.publish_buffer);
        Self(Arc::new(Inner {
            config,
            client,
            connection: OnceCell::new(),
            replay: redis::Script::new(REPLAY_SCRIPT),
            metrics,
            tx,
            rx: Mutex::new(Some(rx)),
            gaps: Mutex::new(HashSet::new()),
            readers: Mutex::new(HashMap::new()),
        }))
    }

    /// Queues `chunk` of `turn` for the chat's stream; never waits. A full queue drops it
    /// (counted) and marks the chat for a resync.
    pub fn publish(&self, chat: ChatId, turn: TurnId, chunk: &UiChunk) {
        let published = Published {
            chat,
            turn,
            chunk: chunk.clone(),
        };
        if let Err(mpsc::error::TrySendError::Full(_)) = self.0.tx.try_send(published) {
            self.0.metrics.events_dropped.inc();
            if let Ok(mut gaps) = self.0.gaps.lock() {
                gaps.insert(chat);
            }
        }
    }

    /// The publisher: writes queued chunks in batches until `stop`, then what is left.
    pub async fn run_publisher(self, stop: CancellationToken) {
        let Some(mut rx) = self.0.rx.lock().ok().and_then(|mut rx| rx.take()) else {
            return;
        };
        let mut kept_up = HashMap::new();
        loop {
            let first = tokio::select! {
                next = rx.recv() => next,
                () = stop.cancelled() => rx.try_recv().ok(),
            };
            let Some(first) = first else { return };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            self.write(batch, &mut kept_up).await;
        }
    }

    /// `kept_up`: when each chat's stream was last trimmed and its expiry pushed back.
    async fn write(&self, batch: Vec<Published>, kept_up: &mut HashMap<ChatId, Instant>) {
        let config = &self.0.config;
        let gaps: Vec<ChatId> = self
            .0
            .gaps
            .lock()
            .map(|mut gaps| gaps.drain().collect())
            .unwrap_or_default();
        let mut chats: Vec<ChatId> = batch.iter().map(|p| p.chat).chain(gaps.clone()).collect();
        chats.sort_unstable_by_key(|c| c.0);
        chats.dedup();
        let mut pipe = redis::pipe();
        for published in &batch {
            // Serializing our own closed types cannot fail; an empty object stays valid.
            let json = serde_json::to_string(&published.chunk).unwrap_or_else(|_| "{}".into());
            pipe.cmd("XADD")
                .arg(stream_key(published.chat))
                .arg("MAXLEN")
                .arg("~")
                .arg(config.max_len)
                .arg("*")
                .arg("t")
                .arg(published.turn.to_string())
                .arg("c")
                .arg(json)
                .ignore();
        }
        for chat in &gaps {
            pipe.cmd("XADD")
                .arg(stream_key(*chat))
                .arg("MAXLEN")
                .arg("~")
                .arg(config.max_len)
                .arg("*")
                .arg("r")
                .arg("dropped")
                .ignore();
        }
        let every = keep_up_every(config.window);
        let now = Instant::now();
        if kept_up.len() > MAX_KEPT_UP {
            kept_up.retain(|_, at| now.duration_since(*at) < every);
        }
        let due: Vec<ChatId> = chats
            .iter()
            .copied()
            .filter(|chat| {
                kept_up
                    .get(chat)
                    .is_none_or(|at| now.duration_since(*at) >= every)
            })
            .collect();
        let oldest = now_millis().saturating_sub(config.window.as_millis() as u64);
        // Pushed back by the window and the interval, so a chunk written just after this
        // (with no trim of its own) still outlives the window.
        let expiry = (config.window + every).as_millis() as u64;
        for chat in &due {
            pipe.cmd("XTRIM")
                .arg(stream_key(*chat))
                .arg("MINID")
                .arg("~")
                .arg(oldest)
                .ignore();
            // A chat silent for the whole window has nothing left to replay.
            pipe.cmd("PEXPIRE")
                .arg(stream_key(*chat))
                .arg(expiry)
                .ignore();
        }
        let written = match self.connection().await {
            Ok(mut conn) => bounded(config.redis_timeout, pipe.query_async::<()>(&mut conn)).await,
            Err(err) => Err(err),
        };
        if written.is_ok() {
            kept_up.extend(due.into_iter().map(|chat| (chat, now)));
        }
        if let Err(EventsError::Unavailable(class)) = written {
            tracing::warn!(
                class,
                chunks = batch.len(),
                "could not publish chunks to the events stream"
            );
            self.0.metrics.events_dropped.inc_by(batch.len() as u64);
            if let Ok(mut marked) = self.0.gaps.lock() {
                marked.extend(chats);
            }
        }
    }

    async fn connection(&self) -> Result<ConnectionManager, EventsError> {
        let timeout = self.0.config.redis_timeout;
        self.0
            .connection
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(0);
                ConnectionManager::new_lazy_with_config(self.0.client.clone(), config)
            })
            .await
            .cloned()
            .map_err(|e| EventsError::Unavailable(error_class(&e)))
    }

    /// An observer of `chat`: with `after`, what followed that event in the window (or a
    /// resync when part of it was trimmed), then live events until `stop`.
    pub async fn observe(
        &self,
        chat: ChatId,
        after: Option<EventId>,
        stop: CancellationToken,
    ) -> Result<Observer, EventsError> {
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
            metrics: self.0.metrics.clone(),
            ended: false,
            _observing: self.0.metrics.observing(),
        };
        if let Some(after) = after {
            self.replay(chat, after, &mut observer).await?;
        }
        Ok(observer)
    }

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
    ) -> Result<Option<TurnStream>, EventsError> {
        type Page = Vec<(String, Vec<String>)>;
        // Subscribed first, as `observe` is: the cursor drops what replay and broadcast
        // both carry.
        let rx = self.subscribe(chat).await?;
        let mut stream = TurnStream {
            replay: VecDeque::new(),
            rx,
            cursor: EventId::default(),
            turn,
            begun: false,
            keepalive: self.0.config.keepalive,
            stop,
            ended: false,
        };
        let limit = self.0.config.redis_timeout;
        let key = stream_key(chat);
        let mut conn = self.connection().await?;
        // Entry ids are Redis' clock, which may run behind Postgres'.
        let mut from = EventId {
            ms: started.saturating_sub(CLOCK_SKEW.as_millis() as u64),
            seq: 0,
        }
        .to_string();
        loop {
            let page: Page = bounded(
                limit,
                redis::cmd("XRANGE")
                    .arg(&key)
                    .arg(&from)
                    .arg("+")
                    .arg("COUNT")
                    .arg(PAGE)
                    .query_async(&mut conn),
            )
            .await?;
            let full = page.len() == PAGE;
            for (id, fields) in page {
                let Some(entry) = Entry::parse(&id, fields) else {
                    continue;
                };
                match stream.take(&entry) {
                    Taken::Broken => return Ok(None),
                    Taken::Frame(frame) => stream.replay.push_back(frame),
                    Taken::Skipped => {}
                }
                if stream.ended {
                    return Ok(Some(stream));
                }
            }
            if !full {
                return Ok(Some(stream));
            }
            from = format!("({}", stream.cursor);
        }
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
                .arg(after.to_string())
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
            observer.cursor = last.parse().unwrap_or(after);
            observer.replay.push_back(encode(
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
                if let Some(entry) = Entry::parse(&id, fields) {
                    let frame = observer.frame(&entry);
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
                    .arg(format!("({}", observer.cursor))
                    .arg("+")
                    .arg("COUNT")
                    .arg(PAGE)
                    .query_async(&mut conn),
            )
            .await?;
        }
    }

    /// A receiver of the chat's broadcast, starting this replica's reader of the chat if
    /// none runs.
    async fn subscribe(
        &self,
        chat: ChatId,
    ) -> Result<broadcast::Receiver<Arc<Event>>, EventsError> {
        if let Some(rx) = self.existing(chat) {
            return Ok(rx);
        }
        let limit = self.0.config.redis_timeout;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(limit))
            .set_response_timeout(Some(READ_BLOCK + limit));
        let mut conn = bounded(
            limit,
            self.0
                .client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await?;
        // The reader starts at the stream's end as it is now, before the caller reads its
        // replay; starting at `$` would lose what is written before the first `XREAD`.
        let last: Vec<(String, Vec<String>)> = bounded(
            limit,
            redis::cmd("XREVRANGE")
                .arg(stream_key(chat))
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query_async(&mut conn),
        )
        .await?;
        let start = last
            .first()
            .and_then(|(id, _)| id.parse().ok())
            .unwrap_or_default();
        let mut readers = self
            .0
            .readers
            .lock()
            .map_err(|_| EventsError::Unavailable("poisoned"))?;
        if let Some(tx) = readers.get(&chat) {
            return Ok(tx.subscribe());
        }
        let (tx, rx) = broadcast::channel(self.0.config.observer_buffer);
        readers.insert(chat, tx.clone());
        tokio::spawn(self.clone().read(chat, tx, conn, start));
        Ok(rx)
    }

    fn existing(&self, chat: ChatId) -> Option<broadcast::Receiver<Arc<Event>>> {
        let readers = self.0.readers.lock().ok()?;
        readers.get(&chat).map(broadcast::Sender::subscribe)
    }

    /// The reader of one chat: broadcasts every entry after `last` until no observer is
    /// left or Redis fails.
    async fn read(
        self,
        chat: ChatId,
        tx: broadcast::Sender<Arc<Event>>,
        mut conn: MultiplexedConnection,
        mut last: EventId,
    ) {
        type Reply = Option<Vec<(String, Vec<(String, Vec<String>)>)>>;
        let key = stream_key(chat);
        // A read never brings more than the ring holds: the broadcast is sent in one go,
        // and a burst beyond the ring would lag observers that keep up.
        let count = PAGE.min(self.0.config.observer_buffer);
        loop {
            if self.leave_if_unobserved(chat, &tx) {
                return;
            }
            let reply: Result<Reply, _> = bounded(
                READ_BLOCK + self.0.config.redis_timeout,
                redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(count)
                    .arg("BLOCK")
                    .arg(READ_BLOCK.as_millis() as u64)
                    .arg("STREAMS")
                    .arg(&key)
                    .arg(last.to_string())
                    .query_async(&mut conn),
            )
            .await;
            match reply {
                Ok(streams) => {
                    for (_, entries) in streams.unwrap_or_default() {
                        for (id, fields) in entries {
                            if let Some(entry) = Entry::parse(&id, fields) {
                                last = entry.id;
                                // No receiver left is fine: the next loop notices.
                                let _ = tx.send(Arc::new(Event::Entry(entry)));
                            }
                        }
                    }
                }
                Err(EventsError::Unavailable(class)) => {
                    tracing::warn!(%chat, class, "events reader failed");
                    if let Ok(mut readers) = self.0.readers.lock()
                        && readers.get(&chat).is_some_and(|t| t.same_channel(&tx))
                    {
                        readers.remove(&chat);
                    }
                    let _ = tx.send(Arc::new(Event::Failed));
                    return;
                }
            }
        }
    }

    /// Removes the reader when its chat has no observer; under the lock, so a new
    /// observer either finds this reader running or starts another.
    fn leave_if_unobserved(&self, chat: ChatId, tx: &broadcast::Sender<Arc<Event>>) -> bool {
        let Ok(mut readers) = self.0.readers.lock() else {
            return true;
        };
        if tx.receiver_count() > 0 {
            return false;
        }
        if readers.get(&chat).is_some_and(|t| t.same_channel(tx)) {
            readers.remove(&chat);
        }
        true
    }
}

/// One SSE event: `id:` when it has one, then `data:` with the chunk's JSON.
fn encode(id: Option<EventId>, chunk: &UiChunk) -> Bytes {
    let json = serde_json::to_string(chunk).unwrap_or_else(|_| "{}".into());
    frame(id, &json)
}

fn frame(id: Option<EventId>, json: &str) -> Bytes {
    let mut out = String::with_capacity(json.len() + 40);
    if let Some(id) = id {
        out.push_str("id: ");
        out.push_str(&id.to_string());
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(json);
    out.push_str("\n\n");
    Bytes::from(out)
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
    metrics: Metrics,
    ended: bool,
    /// `brain_event_observers` counts this stream until its body is dropped.
    _observing: crate::metrics::Gauged,
}

impl Observer {
    /// The SSE bytes of `entry`, preceded by a `data-turn` part (without an id, so a
    /// reconnect never skips the entry itself) when it starts another turn.
    fn frame(&mut self, entry: &Entry) -> Bytes {
        self.cursor = entry.id;
        let Some(json) = &entry.chunk else {
            return encode(
                Some(entry.id),
                &UiChunk::DataResync {
                    data: Resync {
                        reason: "dropped".into(),
                    },
                    transient: true,
                },
            );
        };
        let mut out = Vec::new();
        if let Some(turn) = entry.turn
            && self.turn != Some(turn)
        {
            self.turn = Some(turn);
            out.extend_from_slice(&encode(
                None,
                &UiChunk::DataTurn {
                    data: TurnInfo { turn_id: turn },
                    transient: true,
                },
            ));
        }
        out.extend_from_slice(&frame(Some(entry.id), json));
        Bytes::from(out)
    }

    /// The next bytes of the stream; `None` once it ended.
    async fn next(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
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
                received = self.rx.recv() => received,
                () = tokio::time::sleep(self.keepalive) => {
                    return Some(Bytes::from_static(b": keep-alive\n\n"));
                }
            };
            return Some(match received {
                Ok(event) => match &*event {
                    Event::Entry(entry) if entry.id <= self.cursor => continue,
                    Event::Entry(entry) => self.frame(entry),
                    Event::Failed => self.end_unavailable(),
                },
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    self.ended = true;
                    self.metrics.observers_too_slow.inc();
                    encode(
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

    fn end_unavailable(&mut self) -> Bytes {
        self.ended = true;
        encode(
            None,
            &UiChunk::error(
                ErrorCode::EventsUnavailable,
                "the events stream could not be read; reconnect with Last-Event-ID",
            ),
        )
    }

    fn into_stream(self) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
        futures_util::stream::unfold(self, |mut observer| async move {
            let bytes = observer.next().await?;
            Some((Ok(bytes), observer))
        })
    }
}

impl IntoResponse for Observer {
    fn into_response(self) -> Response {
        crate::turn::ui_stream::sse_response(Body::from_stream(self.into_stream()))
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

/// One turn's stream, resumed (`GET /v1/chats/{id}/stream`): its chunks from `start`, then
/// live ones until its last, then `[DONE]`, like the stream of the request that started it.
pub struct TurnStream {
    replay: VecDeque<Bytes>,
    rx: broadcast::Receiver<Arc<Event>>,
    cursor: EventId,
    turn: TurnId,
    /// Whether its `start` was given.
    begun: bool,
    keepalive: Duration,
    stop: CancellationToken,
    ended: bool,
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
    fn take(&mut self, entry: &Entry) -> Taken {
        if entry.id <= self.cursor {
            return Taken::Skipped;
        }
        self.cursor = entry.id;
        let Some(json) = &entry.chunk else {
            // A gap in the chat: once the turn began, some of its chunks may be in it.
            return if self.begun {
                Taken::Broken
            } else {
                Taken::Skipped
            };
        };
        if entry.turn != Some(self.turn) {
            return Taken::Skipped;
        }
        let kind = chunk_kind(json);
        if !self.begun {
            if kind != "start" {
                return Taken::Broken;
            }
            self.begun = true;
        }
        // No `id:`: the stream is the turn's own, as its POST carried it.
        let mut out = frame(None, json).to_vec();
        if matches!(kind, "finish" | "error" | "abort") {
            self.ended = true;
            out.extend_from_slice(&crate::turn::ui_stream::done_frame());
        }
        Taken::Frame(Bytes::from(out))
    }

    /// The next step; `None` once the turn ended, its stream broke, or the replica drains.
    pub async fn next(&mut self) -> Option<Resumed> {
        if let Some(replayed) = self.replay.pop_front() {
            return Some(Resumed::Bytes(replayed));
        }
        if self.ended {
            return None;
        }
        loop {
            let received = tokio::select! {
                biased;
                () = self.stop.cancelled() => None,
                received = self.rx.recv() => Some(received),
                () = tokio::time::sleep(self.keepalive) => return Some(Resumed::Idle),
            };
            // Draining, a failed reader or a lagging one: the stream ends without `[DONE]`
            // and the client reads the transcript (or resumes again).
            let Some(Ok(event)) = received else {
                self.ended = true;
                return None;
            };
            let Event::Entry(entry) = &*event else {
                self.ended = true;
                return None;
            };
            match self.take(entry) {
                Taken::Skipped => {}
                Taken::Frame(bytes) => return Some(Resumed::Bytes(bytes)),
                Taken::Broken => {
                    self.ended = true;
                    return None;
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_parse_and_order_like_redis() {
        let a: EventId = "1700000000000-2".parse().unwrap();
        let b: EventId = "1700000000000-10".parse().unwrap();
        let c: EventId = "1700000000001-0".parse().unwrap();
        assert!(a < b && b < c);
        assert_eq!(a.to_string(), "1700000000000-2");
        for bad in ["", "17", "a-1", "1-b", "1-2-3"] {
            assert!(bad.parse::<EventId>().is_err(), "{bad}");
        }
    }
}
