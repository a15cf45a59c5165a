//! Publishing: the turn's chunks onto the bounded channel, and the publisher task that
//! writes them in batches, one entry per turn of each chat, trimming and expiring the
//! streams as it goes (see the parent module).

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use protocol::ui::UiChunk;
use protocol::{ChatId, TurnId};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::redis::bounded;

use super::{Events, EventsError, stream_key};

/// Chunks written in one pipeline at most.
const MAX_BATCH: usize = 512;
/// Chunks in one stream entry at most, which bounds an entry's size (and what one
/// observer's broadcast slot holds) to this many chunks.
const MAX_PARTS: usize = 64;
/// Chats remembered as kept up before the ones no longer due are forgotten.
const MAX_KEPT_UP: usize = 4096;

/// A chunk on its way to the publisher.
pub(super) struct Published {
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
        let now = Instant::now();
        let due = self.keep_up(&mut pipes, &chats, kept_up, now);
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
        self.settle(written, &chats, &due, kept_up, now);
    }

    /// Trims and pushes back the expiry of the batch's chats not kept up for a while; the
    /// chats that are due.
    fn keep_up(
        &self,
        pipes: &mut HashMap<u32, (redis::Pipeline, usize)>,
        chats: &[ChatId],
        kept_up: &mut HashMap<ChatId, Instant>,
        now: Instant,
    ) -> Vec<ChatId> {
        let config = &self.0.config;
        let every = keep_up_every(config.window);
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
        due
    }

    /// What each group's write did: the chats it trimmed are kept up; the chunks a failed
    /// write dropped are counted and their chats marked, so their readers learn of the gap.
    fn settle(
        &self,
        written: Vec<(u32, usize, Result<(), EventsError>)>,
        chats: &[ChatId],
        due: &[ChatId],
        kept_up: &mut HashMap<ChatId, Instant>,
        now: Instant,
    ) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
