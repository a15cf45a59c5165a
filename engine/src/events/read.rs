//! Reading: one task per reader group follows every chat observed on this replica in one
//! blocking `XREAD` on a connection of its own, and broadcasts each chat's entries to its
//! local observers; `subscribe` adds a chat to what is read.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use protocol::ChatId;
use tokio::sync::broadcast;

use crate::redis::{Conn, Unavailable, bounded};

use super::{Entry, Event, EventId, Events, EventsError, Observed, PAGE, chat_of, stream_key};

/// How long the reader blocks in one `XREAD`; a chat whose observers all left is read no
/// more within this.
const READ_BLOCK: Duration = Duration::from_secs(2);
/// How long a replica's wake key outlives its last use.
const WAKE_KEY_TTL_MS: u64 = 60_000;

/// What one `XREAD` brings: each stream's key, with its entries (id and flat fields).
type Streams = Vec<(String, Vec<(String, Vec<String>)>)>;

impl Events {
    /// A receiver of the chat's broadcast, adding the chat to what this replica's reader
    /// reads if it is not observed here yet.
    pub(super) async fn subscribe(
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
