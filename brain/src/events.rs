//! The events stream of a chat (SPEC S2): every chunk of every turn of the chat, whoever
//! started it, for observers on any replica.
//!
//! Publishing: [`Events::publish`], called by the turn for each chunk it emits, only puts
//! the chunk on a bounded channel, so a turn never waits for Redis. One publisher task per
//! replica gathers what the channel holds for a flush interval (`BRAIN_EVENTS_FLUSH_MS`)
//! and writes it in one pipeline to the chats' Redis Streams, a turn's chunks of one batch
//! as one entry (issue 31: a turn is one or two `XADD`s instead of one per chunk). An
//! entry's chunks are its parts: the SSE id of part `n > 0` of entry `<ms>-<seq>` is
//! `<ms>-<seq>.<n>`, part 0's is the entry's own id, so `Last-Event-ID` resumes inside an
//! entry ([`EventId`]) and `BRAIN_EVENTS_MAX_LEN` counts entries, not chunks. The pipeline
//! is `XADD MAXLEN ~`, then `XTRIM MINID ~` and `PEXPIRE` for each chat of the batch not
//! already kept up in the last tenth of the window, at most 5 s: the window is both a count
//! and an age, and a chat in a run of turns is trimmed a few times a window, not per
//! batch). A full channel or a failed batch drops chunks: they are counted, and the chat
//! gets a `resync` entry, so its observers learn of the gap instead of missing events
//! silently.
//!
//! Observing: one reader task per replica reads every chat observed here in one `XREAD
//! BLOCK` over all their keys, on the one connection of its own, and broadcasts each
//! chat's entries to the chat's local observers; so observed chats cost Redis no
//! connection each. A chat newly observed wakes the blocked read through the replica's
//! wake key (`XADD` to it, which the read also watches), so it is read at once. Observers
//! are capped per principal and per replica (`too_many_observers`), and each stream ends
//! with its principal's authority (`crate::auth::Standing`). An observer subscribes
//! first, then replays what it missed (`XRANGE` after its `Last-Event-ID`, in a script that
//! also tells whether anything after that id was trimmed), then follows the broadcast,
//! skipping what the replay already gave: no gap, no duplicate. The broadcast ring is the
//! observer buffer: an observer that falls further behind is disconnected with a notice,
//! and neither the reader nor any turn waits for it.
//!
//! Redis Cluster (O5): a stream's key carries one of [`BUCKETS`] hash tags, by its chat
//! (`events:{<tag of bucket n>}:chat:<chat>`, [`BUCKET_TAGS`]), and so does each wake key. On one node everything is
//! read as above; on a cluster the reader is one task per bucket with chats observed here
//! (one blocking `XREAD` each, on a connection of its own, with the bucket's wake key),
//! and a batch is written as one pipeline per bucket, the pipelines at once. The cost:
//! up to [`BUCKETS`] blocked reads and connections per replica instead of one, and a
//! batch is atomic per bucket only (a failed bucket marks only its own chats for a
//! resync). Sixteen buckets spread the streams over the shards.

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::{FutureExt, Stream};
use protocol::ui::{Notice, Resync, TurnInfo, UiChunk};
use protocol::{ChatId, ErrorCode, TurnId};
use tokio::sync::{Notify, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::auth::Standing;
use crate::config::EventsConfig;
use crate::metrics::Metrics;
use crate::redis::{Conn, Shared, Unavailable, bounded};
use crate::sse;

/// Chunks written in one pipeline at most.
const MAX_BATCH: usize = 512;
/// Chunks in one stream entry at most, which bounds an entry's size (and what one
/// observer's broadcast slot holds) to this many chunks.
const MAX_PARTS: usize = 64;
/// Chats remembered as kept up before the ones no longer due are forgotten.
const MAX_KEPT_UP: usize = 4096;
/// How long the reader blocks in one `XREAD`; a chat whose observers all left is read no
/// more within this.
const READ_BLOCK: Duration = Duration::from_secs(2);
/// Entries per `XRANGE` page of a replay, and per `XREAD` of a reader.
const PAGE: usize = 1000;
/// How far before a turn's start (by Postgres' clock) a resumed stream looks for its
/// entries, whose ids Redis stamps with its own clock.
const CLOCK_SKEW: Duration = Duration::from_secs(30);

/// Whether the entry `ARGV[1]` is still in the stream, the stream's first and last ids,
/// and the first page from `ARGV[1]` on (that entry included: the client may have had
/// only some of its parts), in one atomic step: a trim between the check and the read
/// would otherwise be a silent gap. (Trimming does not move Redis'
/// `max-deleted-entry-id`, so the check is "is the client's last event still there".)
const REPLAY_SCRIPT: &str = r"
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if #first == 0 then return {0, 0, '0-0', '0-0', {}} end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local kept = #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
return {1, kept, first[1][1], last[1][1],
  redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])}
";

/// Why the events stream could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// Redis refused, failed or timed out; the class names which.
    #[error("events stream unavailable ({0})")]
    Unavailable(&'static str),
    /// The principal, or this replica, has as many observer streams open as allowed.
    #[error("too many observer streams open")]
    TooManyObservers,
}

impl From<Unavailable> for EventsError {
    fn from(Unavailable(class): Unavailable) -> Self {
        Self::Unavailable(class)
    }
}

/// One chunk's place in a chat's stream: a Redis stream entry id, `<ms>-<seq>`, and the
/// chunk's part of that entry: the SSE `id:` of an event and what `Last-Event-ID` carries
/// back, `<ms>-<seq>` for part 0 and `<ms>-<seq>.<part>` after it (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct EventId {
    ms: u64,
    seq: u64,
    part: u32,
}

impl EventId {
    /// Part `part` of this id's entry.
    fn part(self, part: usize) -> Self {
        Self {
            part: u32::try_from(part).unwrap_or(u32::MAX),
            ..self
        }
    }

    /// The entry's own id, what Redis is given (part 0, written `<ms>-<seq>`).
    fn entry(self) -> Self {
        self.part(0)
    }

    /// Past every part of this id's entry: a cursor that skips the whole entry.
    fn whole(self) -> Self {
        self.part(usize::MAX)
    }
}

impl FromStr for EventId {
    type Err = ();

    fn from_str(raw: &str) -> Result<Self, ()> {
        let (entry, part) = match raw.trim().split_once('.') {
            Some((entry, part)) => (entry, part.parse().map_err(|_| ())?),
            None => (raw.trim(), 0),
        };
        let (ms, seq) = entry.split_once('-').ok_or(())?;
        Ok(Self {
            ms: ms.parse().map_err(|_| ())?,
            seq: seq.parse().map_err(|_| ())?,
            part,
        })
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)?;
        if self.part > 0 {
            write!(f, ".{}", self.part)?;
        }
        Ok(())
    }
}

/// What the reader broadcasts to the observers of a chat.
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
    /// Its chunks' JSON as published, in order (its parts); none for a resync marker.
    chunks: Vec<String>,
}

impl Entry {
    /// An entry from its id and its flat field list; `None` for an id that is not one.
    fn parse(id: &str, fields: Vec<String>) -> Option<Self> {
        let mut entry = Self {
            id: id.parse().ok()?,
            turn: None,
            chunks: Vec::new(),
        };
        let mut fields = fields.into_iter();
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            match name.as_str() {
                "t" => entry.turn = value.parse().ok(),
                "c" => entry.chunks.push(value),
                _ => {}
            }
        }
        Some(entry)
    }

    /// Its parts after `cursor`, each with its id.
    fn parts_after(&self, cursor: EventId) -> impl Iterator<Item = (EventId, &str)> {
        self.chunks
            .iter()
            .enumerate()
            .map(|(n, json)| (self.id.part(n), json.as_str()))
            .filter(move |(id, _)| *id > cursor)
    }
}

/// A chunk on its way to the publisher.
struct Published {
    chat: ChatId,
    turn: TurnId,
    chunk: UiChunk,
}

/// One entry the publisher writes: consecutive chunks of one turn of a chat.
struct Run {
    chat: ChatId,
    turn: TurnId,
    chunks: Vec<String>,
}

/// A batch's chunks as entries: per chat in the order published, a turn's consecutive
/// chunks in one entry of at most [`MAX_PARTS`].
fn runs(batch: Vec<Published>) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    // Each chat's run still open to more chunks.
    let mut open: HashMap<ChatId, usize> = HashMap::new();
    for published in batch {
        // Serializing our own closed types cannot fail; an empty object stays valid.
        let json = serde_json::to_string(&published.chunk).unwrap_or_else(|_| "{}".into());
        if let Some(run) = open.get(&published.chat).map(|n| &mut runs[*n])
            && run.turn == published.turn
            && run.chunks.len() < MAX_PARTS
        {
            run.chunks.push(json);
            continue;
        }
        open.insert(published.chat, runs.len());
        runs.push(Run {
            chat: published.chat,
            turn: published.turn,
            chunks: vec![json],
        });
    }
    runs
}

/// This replica's side of the chat events streams: the publisher's channel and the
/// reader of the chats observed here. Cheap to clone.
#[derive(Clone)]
pub struct Events(Arc<Inner>);

struct Inner {
    config: EventsConfig,
    /// The publisher's and the replays' connection (the reader has its own).
    redis: Shared,
    replay: redis::Script,
    metrics: Metrics,
    tx: mpsc::Sender<Published>,
    /// Taken by the publisher task when it starts.
    rx: Mutex<Option<mpsc::Receiver<Published>>>,
    /// Chats that lost chunks since the last batch; each gets a resync entry.
    gaps: Mutex<HashSet<ChatId>>,
    /// The chats observed here, which the reader reads.
    observed: Mutex<HashMap<ChatId, Observed>>,
    /// How many readers there are (1 on one node, [`BUCKETS`] on a cluster); a chat is
    /// read by the one of its [`Inner::group`].
    groups: u32,
    /// Whether each reader task was started.
    reading: Vec<AtomicBool>,
    /// Wakes each reader when it waits for a first chat to read.
    wake: Vec<Notify>,
    /// Names this replica's wake keys: an entry added to a reader's ([`Inner::wake_key`])
    /// ends its blocked `XREAD`.
    replica_tag: String,
    /// Open observer streams, per principal and in all.
    observers: Arc<Mutex<Counts>>,
}

/// A chat observed on this replica: its broadcast, and the last entry read for it.
struct Observed {
    tx: broadcast::Sender<Arc<Event>>,
    last: EventId,
}

/// Who opens an observer stream: the principal's identity, for the caps, and its
/// authority, which the stream ends with.
pub struct Viewer {
    pub identity: String,
    pub authority: Standing,
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_principal: HashMap<String, usize>,
}

/// An observer stream's place under the caps; given back when dropped.
struct Slot {
    counts: Arc<Mutex<Counts>>,
    identity: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut counts) = self.counts.lock() {
            counts.total = counts.total.saturating_sub(1);
            if let Some(open) = counts.per_principal.get_mut(&self.identity) {
                *open -= 1;
                if *open == 0 {
                    counts.per_principal.remove(&self.identity);
                }
            }
        }
    }
}

/// The hash tags of the streams on a Redis Cluster (see the module doc).
const BUCKETS: u32 = 16;
/// Bucket `n`'s hash tag, chosen so that its slot is in the `n`th sixteenth of the 16,384
/// slots: a cluster whose masters hold equal runs of slots (what `redis-cli --cluster
/// create` and the managed services make) gets the buckets as evenly as sixteen divide
/// (three masters: 5, 5 and 6), where the plain tags `b0`..`b15` gave three masters 4, 6
/// and 6. Checked by `events::tests::each_buckets_tag_is_in_its_sixteenth_of_the_slots`.
const BUCKET_TAGS: [&str; BUCKETS as usize] = [
    "b0.2", "b1.1", "b2.61", "b3.62", "b4.22", "b5.21", "b6.11", "b7.12", "b8.61", "b9.62",
    "b10.63", "b11.60", "b12.42", "b13.41", "b14.13", "b15.10",
];
/// How long a replica's wake key outlives its last use.
const WAKE_KEY_TTL_MS: u64 = 60_000;

/// What one `XREAD` brings: each stream's key, with its entries (id and flat fields).
type Streams = Vec<(String, Vec<(String, Vec<String>)>)>;

fn bucket(chat: ChatId) -> u32 {
    (chat.0.as_u128() % u128::from(BUCKETS)) as u32
}

/// The key of `chat`'s stream (public for the tests that read it).
pub fn stream_key(chat: ChatId) -> String {
    format!(
        "events:{{{}}}:chat:{chat}",
        BUCKET_TAGS[bucket(chat) as usize]
    )
}

/// The chat whose stream `key` is.
fn chat_of(key: &str) -> Option<ChatId> {
    key.split_once("}:chat:")?.1.parse().ok()
}

impl Inner {
    /// The reader of `chat`.
    fn group(&self, chat: ChatId) -> u32 {
        if self.groups == 1 { 0 } else { bucket(chat) }
    }

    /// The wake key of reader `group`, in its bucket's slot.
    fn wake_key(&self, group: u32) -> String {
        format!(
            "events:{{{}}}:wake:{}",
            BUCKET_TAGS[group as usize], self.replica_tag
        )
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
    pub fn new(client: crate::redis::Client, config: EventsConfig, metrics: Metrics) -> Self {
        let (tx, rx) = mpsc::channel(config.publish_buffer);
        let groups = if client.is_cluster() { BUCKETS } else { 1 };
        Self(Arc::new(Inner {
            redis: Shared::new(client, config.redis_timeout),
            config,
            replay: redis::Script::new(REPLAY_SCRIPT),
            metrics,
            tx,
            rx: Mutex::new(Some(rx)),
            gaps: Mutex::new(HashSet::new()),
            observed: Mutex::new(HashMap::new()),
            groups,
            reading: (0..groups).map(|_| AtomicBool::new(false)).collect(),
            wake: (0..groups).map(|_| Notify::new()).collect(),
            replica_tag: uuid::Uuid::new_v4().to_string(),
            observers: Arc::default(),
        }))
    }

    /// A place for one more observer stream of `identity`, within both caps.
    fn admit(&self, identity: String) -> Result<Slot, EventsError> {
        let config = &self.0.config;
        let mut counts = self
            .0
            .observers
            .lock()
            .map_err(|_| EventsError::Unavailable("poisoned"))?;
        let open = counts.per_principal.get(&identity).copied().unwrap_or(0);
        if counts.total >= config.max_observers || open >= config.max_observers_per_principal {
            self.0.metrics.observers_refused.inc();
            return Err(EventsError::TooManyObservers);
        }
        counts.total += 1;
        *counts.per_principal.entry(identity.clone()).or_default() += 1;
        Ok(Slot {
            counts: self.0.observers.clone(),
            identity,
        })
    }

    /// Deletes the stream of `chat`, erased (L2): what it held of its turns goes with it.
    /// A chunk of a turn still running when its chat went starts the stream again, with
    /// its expiry, so it goes within the window.
    pub async fn forget(&self, chat: ChatId) -> Result<(), EventsError> {
        let mut conn = self.connection().await?;
        bounded(
            self.0.config.redis_timeout,
            redis::cmd("DEL")
                .arg(stream_key(chat))
                .query_async::<()>(&mut conn),
        )
        .await?;
        Ok(())
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
            // Gathers for the flush interval, so a turn's chunks within it are one entry.
            let flush_at = tokio::time::Instant::now() + self.0.config.flush;
            while batch.len() < MAX_BATCH {
                let next = tokio::select! {
                    biased;
                    next = rx.recv() => next,
                    () = stop.cancelled() => rx.try_recv().ok(),
                    () = tokio::time::sleep_until(flush_at) => None,
                };
                let Some(next) = next else { break };
                batch.push(next);
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
        let batched = batch.len();
        let runs = runs(batch);
        let mut chats: Vec<ChatId> = runs.iter().map(|r| r.chat).chain(gaps.clone()).collect();
        chats.sort_unstable_by_key(|c| c.0);
        chats.dedup();
        // One pipeline per reader group: on a cluster each holds one bucket's keys.
        let mut pipes: HashMap<u32, (redis::Pipeline, usize)> = HashMap::new();
        for run in runs {
            let (pipe, chunks) = pipes.entry(self.0.group(run.chat)).or_default();
            *chunks += run.chunks.len();
            let xadd = pipe
                .cmd("XADD")
                .arg(stream_key(run.chat))
                .arg("MAXLEN")
                .arg("~")
                .arg(config.max_len)
                .arg("*")
                .arg("t")
                .arg(run.turn.to_string());
            for json in run.chunks {
                xadd.arg("c").arg(json);
            }
            xadd.ignore();
        }
        for chat in &gaps {
            let (pipe, _) = pipes.entry(self.0.group(*chat)).or_default();
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
            let (pipe, _) = pipes.entry(self.0.group(*chat)).or_default();
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
        let written: Vec<(u32, usize, Result<(), EventsError>)> = match self.connection().await {
            Ok(conn) => {
                futures_util::future::join_all(pipes.into_iter().map(|(group, (pipe, n))| {
                    let mut conn = conn.clone();
                    async move {
                        let result =
                            bounded(config.redis_timeout, pipe.query_async::<()>(&mut conn))
                                .await
                                .map_err(EventsError::from);
                        (group, n, result)
                    }
                }))
                .await
            }
            Err(err) => vec![(u32::MAX, batched, Err(err))],
        };
        for (group, chunks, result) in written {
            let in_group = |chat: &ChatId| group == u32::MAX || self.0.group(*chat) == group;
            match result {
                Ok(()) => kept_up.extend(due.iter().filter(|c| in_group(c)).map(|c| (*c, now))),
                Err(EventsError::Unavailable(class)) => {
                    tracing::warn!(
                        class,
                        chunks,
                        "could not publish chunks to the events stream"
                    );
                    self.0.metrics.events_dropped.inc_by(chunks as u64);
                    if let Ok(mut marked) = self.0.gaps.lock() {
                        marked.extend(chats.iter().filter(|c| in_group(c)));
                    }
                }
                Err(EventsError::TooManyObservers) => {}
            }
        }
    }

    async fn connection(&self) -> Result<Conn, EventsError> {
        self.0
            .redis
            .get()
            .await
            .map_err(|e| Unavailable::from(e).into())
    }

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
        type Page = Vec<(String, Vec<String>)>;
        let limit = self.0.config.redis_timeout;
        let key = stream_key(stream.chat);
        let mut conn = self.connection().await?;
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

    /// A receiver of the chat's broadcast, adding the chat to what this replica's reader
    /// reads if it is not observed here yet.
    async fn subscribe(
        &self,
        chat: ChatId,
    ) -> Result<broadcast::Receiver<Arc<Event>>, EventsError> {
        if let Some(rx) = self.existing(chat) {
            return Ok(rx);
        }
        let limit = self.0.config.redis_timeout;
        let mut conn = self.connection().await?;
        // The chat is read from the stream's end as it is now, before the caller reads its
        // replay; starting at `$` would lose what is written before the next `XREAD`.
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
        let rx = {
            let mut observed = self
                .0
                .observed
                .lock()
                .map_err(|_| EventsError::Unavailable("poisoned"))?;
            if let Some(known) = observed.get(&chat) {
                return Ok(known.tx.subscribe());
            }
            let (tx, rx) = broadcast::channel(self.0.config.observer_buffer);
            observed.insert(chat, Observed { tx, last: start });
            rx
        };
        let group = self.0.group(chat);
        let wake_key = self.0.wake_key(group);
        if !self.0.reading[group as usize].swap(true, Ordering::SeqCst) {
            tokio::spawn(self.clone().read(group));
        }
        self.0.wake[group as usize].notify_one();
        let woken = bounded(
            limit,
            redis::pipe()
                .cmd("XADD")
                .arg(&wake_key)
                .arg("MAXLEN")
                .arg(1)
                .arg("*")
                .arg("w")
                .arg(1)
                .ignore()
                .cmd("PEXPIRE")
                .arg(&wake_key)
                .arg(WAKE_KEY_TTL_MS)
                .ignore()
                .query_async::<()>(&mut conn),
        )
        .await;
        if let Err(Unavailable(class)) = woken {
            // Not lost: the reader takes the chat into its next read, within its block time.
            tracing::debug!(class, "events reader not woken");
        }
        Ok(rx)
    }

    fn existing(&self, chat: ChatId) -> Option<broadcast::Receiver<Arc<Event>>> {
        let observed = self.0.observed.lock().ok()?;
        observed.get(&chat).map(|known| known.tx.subscribe())
    }

    /// The reader of `group`: reads every chat of the group observed here (and the
    /// group's wake key) in one blocking `XREAD`, again and again; with no chat observed it
    /// holds no connection.
    async fn read(self, group: u32) {
        let wake_key = self.0.wake_key(group);
        let limit = self.0.config.redis_timeout;
        // A read never brings more than the ring holds: the broadcast is sent in one go,
        // and a burst beyond the ring would lag observers that keep up.
        let count = PAGE.min(self.0.config.observer_buffer);
        let mut conn: Option<Conn> = None;
        let mut woken = EventId::default();
        loop {
            let chats = self.still_observed(group);
            if chats.is_empty() {
                conn = None;
                self.0.wake[group as usize].notified().await;
                continue;
            }
            if conn.is_none() {
                match bounded(
                    limit,
                    self.0.redis.client().dedicated(limit, READ_BLOCK + limit),
                )
                .await
                {
                    Ok(dialed) => conn = Some(dialed),
                    Err(err) => {
                        self.fail(&chats, err.into());
                        continue;
                    }
                }
            }
            let Some(reading) = conn.as_mut() else {
                continue;
            };
            let mut xread = redis::cmd("XREAD");
            xread
                .arg("COUNT")
                .arg(count)
                .arg("BLOCK")
                .arg(READ_BLOCK.as_millis() as u64)
                .arg("STREAMS");
            for (chat, _, _) in &chats {
                xread.arg(stream_key(*chat));
            }
            xread.arg(&wake_key);
            for (_, last, _) in &chats {
                xread.arg(last.to_string());
            }
            xread.arg(woken.to_string());
            match bounded(
                READ_BLOCK + limit,
                xread.query_async::<Option<Streams>>(reading),
            )
            .await
            {
                Ok(streams) => self.deliver(streams.unwrap_or_default(), &wake_key, &mut woken),
                Err(err) => {
                    conn = None;
                    self.fail(&chats, err.into());
                }
            }
        }
    }

    /// The chats still observed, with where each is read from; chats without an observer
    /// are dropped here, under the lock, so a new observer either finds its chat still
    /// read or adds it again.
    fn still_observed(&self, group: u32) -> Vec<(ChatId, EventId, broadcast::Sender<Arc<Event>>)> {
        let Ok(mut observed) = self.0.observed.lock() else {
            return Vec::new();
        };
        observed.retain(|_, known| known.tx.receiver_count() > 0);
        observed
            .iter()
            .filter(|(chat, _)| self.0.group(**chat) == group)
            .map(|(chat, known)| (*chat, known.last, known.tx.clone()))
            .collect()
    }

    /// Broadcasts what one read brought to each chat's observers.
    fn deliver(&self, streams: Streams, wake_key: &str, woken: &mut EventId) {
        let Ok(mut observed) = self.0.observed.lock() else {
            return;
        };
        for (key, entries) in streams {
            if key == wake_key {
                if let Some(id) = entries.last().and_then(|(id, _)| id.parse().ok()) {
                    *woken = id;
                }
                continue;
            }
            let Some(known) = chat_of(&key).and_then(|chat| observed.get_mut(&chat)) else {
                continue;
            };
            for (id, fields) in entries {
                // A chat observed again since the read began starts after these.
                if let Some(entry) = Entry::parse(&id, fields)
                    && entry.id > known.last
                {
                    known.last = entry.id;
                    // No receiver left is fine: the next read drops the chat.
                    let _ = known.tx.send(Arc::new(Event::Entry(entry)));
                }
            }
        }
    }

    /// Ends the streams of the chats a failed read was for; their observers reconnect.
    fn fail(&self, chats: &[(ChatId, EventId, broadcast::Sender<Arc<Event>>)], err: EventsError) {
        tracing::warn!(chats = chats.len(), error = %err, "events reader failed");
        if let Ok(mut observed) = self.0.observed.lock() {
            for (chat, _, tx) in chats {
                if observed
                    .get(chat)
                    .is_some_and(|known| known.tx.same_channel(tx))
                {
                    observed.remove(chat);
                }
            }
        }
        for (_, _, tx) in chats {
            let _ = tx.send(Arc::new(Event::Failed));
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

    fn into_stream(self) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
        futures_util::stream::unfold(self, |mut observer| async move {
            let bytes = observer.next().await?;
            Some((Ok(bytes), observer))
        })
    }
}

impl IntoResponse for Observer {
    fn into_response(self) -> Response {
        sse::response(Body::from_stream(self.into_stream()))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis Cluster's key slot: CRC16 (XMODEM) of the hash tag, modulo 16,384.
    fn slot(tag: &str) -> u16 {
        let mut crc: u16 = 0;
        for byte in tag.bytes() {
            crc ^= u16::from(byte) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc % 16_384
    }

    #[test]
    fn each_buckets_tag_is_in_its_sixteenth_of_the_slots() {
        // The cluster's own answer for two keys (`CLUSTER KEYSLOT`): the function is Redis'.
        assert_eq!(slot("123456789"), 12_739);
        assert_eq!(slot("b0"), 6_939);
        for (n, tag) in BUCKET_TAGS.iter().enumerate() {
            assert_eq!(usize::from(slot(tag) / 1024), n, "{tag}");
        }
        let masters = |count: u16| {
            let mut held = vec![0; usize::from(count)];
            for tag in BUCKET_TAGS {
                held[usize::from(slot(tag) / 16_384u16.div_ceil(count))] += 1;
            }
            held
        };
        assert_eq!(masters(3), [5, 5, 6]);
        assert_eq!(masters(4), [4, 4, 4, 4]);
    }

    #[test]
    fn event_ids_parse_and_order_like_redis() {
        let a: EventId = "1700000000000-2".parse().unwrap();
        let b: EventId = "1700000000000-10".parse().unwrap();
        let c: EventId = "1700000000001-0".parse().unwrap();
        assert!(a < b && b < c);
        assert_eq!(a.to_string(), "1700000000000-2");
        for bad in ["", "17", "a-1", "1-b", "1-2-3", "1-2.", "1-2.x", "1-2.-1"] {
            assert!(bad.parse::<EventId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_part_is_after_its_entry_and_before_the_next() {
        let entry: EventId = "1700000000000-2".parse().unwrap();
        let part: EventId = "1700000000000-2.3".parse().unwrap();
        assert_eq!(part, entry.part(3));
        assert_eq!(part.to_string(), "1700000000000-2.3");
        assert_eq!(part.entry(), entry);
        assert_eq!(entry.part(0).to_string(), "1700000000000-2");
        let next: EventId = "1700000000000-3".parse().unwrap();
        assert!(entry < part && part < entry.whole() && entry.whole() < next);
    }

    fn published(chat: ChatId, turn: TurnId, text: &str) -> Published {
        Published {
            chat,
            turn,
            chunk: UiChunk::TextDelta {
                id: "t".into(),
                delta: text.into(),
            },
        }
    }

    #[test]
    fn a_batch_becomes_one_entry_per_turn_of_each_chat_in_order() {
        let (a, b) = (ChatId(uuid::Uuid::new_v4()), ChatId(uuid::Uuid::new_v4()));
        let (first, second) = (TurnId(uuid::Uuid::new_v4()), TurnId(uuid::Uuid::new_v4()));
        let other = TurnId(uuid::Uuid::new_v4());
        let batch = vec![
            published(a, first, "1"),
            published(b, other, "x"),
            published(a, first, "2"),
            published(a, second, "3"),
            published(b, other, "y"),
            published(a, second, "4"),
        ];
        let runs: Vec<(ChatId, TurnId, usize)> = runs(batch)
            .into_iter()
            .map(|r| (r.chat, r.turn, r.chunks.len()))
            .collect();
        assert_eq!(runs, [(a, first, 2), (b, other, 2), (a, second, 2)]);

        let long: Vec<Published> = (0..MAX_PARTS + 1)
            .map(|n| published(a, first, &n.to_string()))
            .collect();
        let sizes: Vec<usize> = super::runs(long).iter().map(|r| r.chunks.len()).collect();
        assert_eq!(sizes, [MAX_PARTS, 1]);
    }
}
