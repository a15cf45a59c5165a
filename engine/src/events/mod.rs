//! The events stream of a chat (SPEC S2): every chunk of every turn of the chat, whoever
//! started it, for observers on any replica.
//!
//! Publishing: [`Events::publish`], called by the turn for each chunk it emits, only puts
//! the chunk on a bounded channel, so a turn never waits for Redis. One publisher task per
//! replica gathers what the channel holds for a flush interval (`BRAIN_EVENTS_FLUSH_MS`)
//! and writes it in one pipeline to the chats' Redis Streams, a turn's chunks of one batch
//! as one entry (so a turn is one or two `XADD`s instead of one per chunk). An
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
//!
//! By phase: `publish.rs` (the channel and the publisher task), `read.rs` (the reader
//! tasks and their broadcasts), `observe.rs` (an observer's replay and stream),
//! `turn_stream.rs` (a running turn's own stream, resumed), `follow.rs` (both for a
//! principal: what every front end opens).

pub mod follow;
mod observe;
mod publish;
mod read;
mod turn_stream;
mod turn_text;

pub use observe::Observer;
use publish::Published;
pub use turn_stream::{Resumed, TurnStream};
pub use turn_text::{TextCursor, TextRead};

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use protocol::{ChatId, TurnId};
use tokio::sync::{Notify, broadcast, mpsc};

use crate::auth::Standing;
use crate::config::EventsConfig;
use crate::metrics::Metrics;
use crate::redis::{Conn, Shared, Unavailable, bounded};

/// Entries per `XRANGE` page of a replay, and per `XREAD` of a reader.
const PAGE: usize = 1000;

/// One page of a chat's entries after `from` (an `XRANGE` bound), at most [`PAGE`], within
/// `limit`: each entry's id and fields.
async fn page_after(
    conn: &mut Conn,
    key: &str,
    from: &str,
    limit: std::time::Duration,
) -> Result<Vec<(String, Vec<String>)>, EventsError> {
    Ok(bounded(
        limit,
        redis::cmd("XRANGE")
            .arg(key)
            .arg(from)
            .arg("+")
            .arg("COUNT")
            .arg(PAGE)
            .query_async(conn),
    )
    .await?)
}

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

impl Events {
    pub fn new(client: crate::redis::Client, config: EventsConfig, metrics: Metrics) -> Self {
        let (tx, rx) = mpsc::channel(config.publish_buffer);
        let groups = if client.is_cluster() { BUCKETS } else { 1 };
        Self(Arc::new(Inner {
            redis: Shared::new(client, config.redis_timeout),
            config,
            replay: redis::Script::new(observe::REPLAY_SCRIPT),
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

    async fn connection(&self) -> Result<Conn, EventsError> {
        self.0
            .redis
            .get()
            .await
            .map_err(|e| Unavailable::from(e).into())
    }
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
}
