//! Kept calls (D3): a `tools/call` the brain keys with `_meta["agent_runtime/call"]` runs
//! apart from the channel that carried it. When that channel drops (the brain replica
//! holding it died, the network broke), the call goes on, and its outcome is kept for
//! [`KEEP_FOR`]; the brain, on the worker's re-dial (W9), asks for it again with the same
//! key and `_meta["agent_runtime/attach"] = true` and gets the running call's outcome or
//! the kept one. A key seen once is never run again: a second call with it attaches.
//!
//! An attach for a key this worker does not know (it restarted, the outcome expired or
//! was evicted) answers the JSON-RPC error [`UNKNOWN_CALL`]: whether the call ran is then
//! unknown, and the brain says so (`outcome_unknown`).
//!
//! Bounds: at most [`MAX_KEPT`] keyed calls at once (past it a call runs unkept, as an
//! unkeyed one does), and [`MAX_KEPT_BYTES`] of kept outcomes (the oldest go first).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::channel::{ATTACH_META, CALL_KEY_META};
use rmcp::ErrorData;
use rmcp::model::{CallToolResponse, RequestId, RequestMetaObject};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use protocol::channel::UNKNOWN_CALL;

/// How long a finished call's outcome waits for the brain to attach.
pub const KEEP_FOR: Duration = Duration::from_secs(300);
/// The most outcome bytes kept at once (a file answer can be tens of MiB).
pub const MAX_KEPT_BYTES: usize = 64 << 20;
/// The most keyed calls known at once, running or kept.
pub const MAX_KEPT: usize = 256;
/// The longest key taken: the brain's is a turn id and a call id.
const MAX_KEY_CHARS: usize = 256;

/// A call's outcome, as the router answered it.
pub type Outcome = Arc<Result<CallToolResponse, ErrorData>>;

/// A keyed call's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keyed {
    pub key: String,
    /// Asks for an earlier call's outcome only: never starts one.
    pub attach: bool,
}

impl Keyed {
    /// The key a request's `_meta` carries, if any usable one.
    pub fn of(meta: &RequestMetaObject) -> Option<Self> {
        let key = meta.get(CALL_KEY_META)?.as_str()?;
        if key.is_empty() || key.len() > MAX_KEY_CHARS {
            return None;
        }
        let attach = meta
            .get(ATTACH_META)
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        Some(Self {
            key: key.to_owned(),
            attach,
        })
    }
}

/// What to do with a keyed call.
pub enum Begin {
    /// A new key: run the call under `cancel`, then hand its outcome to [`Kept::finish`].
    Run {
        cancel: CancellationToken,
        done: watch::Sender<Option<Outcome>>,
    },
    /// A known key: wait for its outcome; `cancel` stops the call.
    Attach {
        cancel: CancellationToken,
        done: watch::Receiver<Option<Outcome>>,
    },
    /// An attach for a key not known here.
    Unknown,
    /// Too many keyed calls: run this one unkept.
    Full,
}

/// The most cancels kept for requests not registered (yet): one waits only for its
/// request's task to register, microseconds; the rest are for calls that were not keyed or
/// had already answered, and age out.
const MAX_EARLY_CANCELS: usize = 64;

/// One channel's keyed requests, so the brain's `notifications/cancelled` finds the call it
/// means. rmcp fires a request's own token before it hands the notification to the handler
/// in a task of its own, so the two meet in either order: the request's waiter may wake
/// first (it must not forget the request then, or the cancel finds nothing and the
/// command runs on), and the handler may run before the request's task has registered (a
/// cancel right behind its call), so a cancel for a request not known yet waits for it.
#[derive(Clone, Default)]
pub struct Cancels {
    inner: Arc<Mutex<CancelsInner>>,
}

#[derive(Default)]
struct CancelsInner {
    running: HashMap<RequestId, CancellationToken>,
    early: VecDeque<RequestId>,
}

impl Cancels {
    /// Registers request `id`'s call token; cancels it at once if its cancel came first.
    pub fn register(&self, id: RequestId, cancel: CancellationToken) {
        let mut inner = self.lock();
        if let Some(at) = inner.early.iter().position(|early| *early == id) {
            inner.early.remove(at);
            cancel.cancel();
            return;
        }
        inner.running.insert(id, cancel);
    }

    /// Request `id` was answered: a cancel of it now has nothing to stop.
    pub fn answered(&self, id: &RequestId) {
        self.lock().running.remove(id);
    }

    /// The brain cancelled request `id`.
    pub fn cancel(&self, id: RequestId) {
        let mut inner = self.lock();
        match inner.running.remove(&id) {
            Some(cancel) => cancel.cancel(),
            None => {
                if inner.early.len() == MAX_EARLY_CANCELS {
                    inner.early.pop_front();
                }
                inner.early.push_back(id);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CancelsInner> {
        match self.inner.lock() {
            Ok(inner) => inner,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

struct Entry {
    cancel: CancellationToken,
    done: watch::Receiver<Option<Outcome>>,
    /// When it finished and how many bytes its outcome holds.
    finished: Option<(Instant, usize)>,
}

/// The keyed calls of this session, across its channels.
#[derive(Default)]
pub struct Kept {
    entries: Mutex<HashMap<String, Entry>>,
}

impl Kept {
    /// Registers `keyed` (a new key) or finds it. `session` is the session's shutdown
    /// token: a kept call stops with the session, not with its channel.
    pub fn begin(&self, keyed: &Keyed, session: &CancellationToken) -> Begin {
        let mut entries = self.lock();
        prune(&mut entries, Instant::now());
        if let Some(entry) = entries.get(&keyed.key) {
            return Begin::Attach {
                cancel: entry.cancel.clone(),
                done: entry.done.clone(),
            };
        }
        if keyed.attach {
            return Begin::Unknown;
        }
        if entries.len() >= MAX_KEPT {
            return Begin::Full;
        }
        let cancel = session.child_token();
        let (done, receiver) = watch::channel(None);
        entries.insert(
            keyed.key.clone(),
            Entry {
                cancel: cancel.clone(),
                done: receiver,
                finished: None,
            },
        );
        Begin::Run { cancel, done }
    }

    /// Keeps the outcome of the call `key` and wakes whoever waits for it.
    pub fn finish(&self, key: &str, outcome: Outcome, done: &watch::Sender<Option<Outcome>>) {
        let bytes = size_of(&outcome);
        {
            let mut entries = self.lock();
            if let Some(entry) = entries.get_mut(key) {
                entry.finished = Some((Instant::now(), bytes));
            }
            prune(&mut entries, Instant::now());
        }
        done.send_replace(Some(outcome));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        match self.entries.lock() {
            Ok(entries) => entries,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// Drops the outcomes older than [`KEEP_FOR`], then the oldest until the rest fit in
/// [`MAX_KEPT_BYTES`]. Running calls are never dropped.
fn prune(entries: &mut HashMap<String, Entry>, now: Instant) {
    entries.retain(|_, entry| {
        entry
            .finished
            .is_none_or(|(at, _)| now.duration_since(at) < KEEP_FOR)
    });
    let mut kept: Vec<(Instant, usize, String)> = entries
        .iter()
        .filter_map(|(key, entry)| entry.finished.map(|(at, bytes)| (at, bytes, key.clone())))
        .collect();
    let mut total: usize = kept.iter().map(|(_, bytes, _)| bytes).sum();
    kept.sort();
    for (_, bytes, key) in kept {
        if total <= MAX_KEPT_BYTES {
            break;
        }
        entries.remove(&key);
        total -= bytes;
    }
}

/// What an outcome weighs, as it would travel.
fn size_of(outcome: &Result<CallToolResponse, ErrorData>) -> usize {
    match outcome {
        Ok(CallToolResponse::Complete(result)) => {
            serde_json::to_vec(result).map_or(0, |bytes| bytes.len())
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use rmcp::model::{CallToolResult, ContentBlock};

    use super::*;

    fn keyed(key: &str, attach: bool) -> Keyed {
        Keyed {
            key: key.into(),
            attach,
        }
    }

    fn outcome(text: &str) -> Outcome {
        Arc::new(Ok(CallToolResponse::Complete(CallToolResult::success(
            vec![ContentBlock::text(text)],
        ))))
    }

    fn text_of(outcome: &Outcome) -> String {
        match outcome.as_ref() {
            Ok(CallToolResponse::Complete(result)) => result.content[0]
                .as_text()
                .map(|t| t.text.clone())
                .unwrap_or_default(),
            _ => String::new(),
        }
    }

    #[test]
    fn the_key_is_read_from_meta_and_a_bad_one_is_no_key() {
        let mut meta = RequestMetaObject::default();
        assert_eq!(Keyed::of(&meta), None);
        meta.insert(CALL_KEY_META.into(), "t:c".into());
        assert_eq!(Keyed::of(&meta), Some(keyed("t:c", false)));
        meta.insert(ATTACH_META.into(), true.into());
        assert_eq!(Keyed::of(&meta), Some(keyed("t:c", true)));
        meta.insert(CALL_KEY_META.into(), "".into());
        assert_eq!(Keyed::of(&meta), None);
        meta.insert(CALL_KEY_META.into(), "k".repeat(MAX_KEY_CHARS + 1).into());
        assert_eq!(Keyed::of(&meta), None);
        meta.insert(CALL_KEY_META.into(), 7.into());
        assert_eq!(Keyed::of(&meta), None);
    }

    #[tokio::test]
    async fn a_key_runs_once_and_later_calls_attach_to_its_outcome() {
        let kept = Kept::default();
        let session = CancellationToken::new();
        assert!(matches!(
            kept.begin(&keyed("a", true), &session),
            Begin::Unknown
        ));
        let Begin::Run { done, .. } = kept.begin(&keyed("a", false), &session) else {
            panic!("a new key runs");
        };
        // Running: a retry and an attach both wait for it, never run it again.
        for attach in [false, true] {
            let Begin::Attach {
                done: mut waiting, ..
            } = kept.begin(&keyed("a", attach), &session)
            else {
                panic!("a known key attaches");
            };
            assert!(waiting.borrow_and_update().is_none());
        }
        kept.finish("a", outcome("ran"), &done);
        let Begin::Attach {
            done: mut later, ..
        } = kept.begin(&keyed("a", true), &session)
        else {
            panic!("a finished key is kept");
        };
        let got = later
            .wait_for(Option::is_some)
            .await
            .unwrap()
            .clone()
            .unwrap();
        assert_eq!(text_of(&got), "ran");
    }

    #[test]
    fn cancelling_the_session_cancels_a_kept_call_and_an_attach_can_cancel_it() {
        let kept = Kept::default();
        let session = CancellationToken::new();
        let Begin::Run { cancel, .. } = kept.begin(&keyed("a", false), &session) else {
            panic!("runs");
        };
        let Begin::Attach {
            cancel: attached, ..
        } = kept.begin(&keyed("a", true), &session)
        else {
            panic!("attaches");
        };
        attached.cancel();
        assert!(cancel.is_cancelled());
        let Begin::Run { cancel: other, .. } = kept.begin(&keyed("b", false), &session) else {
            panic!("runs");
        };
        session.cancel();
        assert!(other.is_cancelled());
    }

    #[test]
    fn outcomes_expire_and_the_oldest_go_first_past_the_byte_cap() {
        let kept = Kept::default();
        let session = CancellationToken::new();
        for key in ["old", "new"] {
            let Begin::Run { done, .. } = kept.begin(&keyed(key, false), &session) else {
                panic!("runs");
            };
            kept.finish(key, outcome(key), &done);
        }
        {
            let mut entries = kept.lock();
            let now = Instant::now();
            entries.get_mut("old").unwrap().finished = Some((now, MAX_KEPT_BYTES));
            entries.get_mut("new").unwrap().finished = Some((now + Duration::from_secs(1), 10));
            prune(&mut entries, now + Duration::from_secs(1));
            assert!(
                !entries.contains_key("old"),
                "over the cap: the oldest goes"
            );
            assert!(entries.contains_key("new"));
            prune(&mut entries, now + KEEP_FOR + Duration::from_secs(2));
            assert!(entries.is_empty(), "expired");
        }
        assert!(matches!(
            kept.begin(&keyed("new", true), &session),
            Begin::Unknown
        ));
    }

    #[test]
    fn past_the_count_cap_a_call_runs_unkept() {
        let kept = Kept::default();
        let session = CancellationToken::new();
        for n in 0..MAX_KEPT {
            assert!(matches!(
                kept.begin(&keyed(&n.to_string(), false), &session),
                Begin::Run { .. }
            ));
        }
        assert!(matches!(
            kept.begin(&keyed("one more", false), &session),
            Begin::Full
        ));
    }

    #[test]
    fn a_cancel_finds_its_request_whichever_comes_first() {
        let cancels = Cancels::default();
        let id = |n: i64| RequestId::Number(n);

        // Registered, its waiter woken by the request's token (nothing forgotten), then
        // the cancel's handler.
        let first = CancellationToken::new();
        cancels.register(id(1), first.clone());
        cancels.cancel(id(1));
        assert!(first.is_cancelled());

        // The cancel's handler before the request's task registered.
        cancels.cancel(id(2));
        let second = CancellationToken::new();
        cancels.register(id(2), second.clone());
        assert!(second.is_cancelled());

        // A cancel after the answer stops nothing.
        let third = CancellationToken::new();
        cancels.register(id(3), third.clone());
        cancels.answered(&id(3));
        cancels.cancel(id(3));
        assert!(!third.is_cancelled());

        // Cancels of requests never registered age out.
        for n in 100..100 + MAX_EARLY_CANCELS as i64 + 1 {
            cancels.cancel(id(n));
        }
        let aged = CancellationToken::new();
        cancels.register(id(3), aged.clone());
        assert!(!aged.is_cancelled(), "the oldest early cancel is gone");
        let kept = CancellationToken::new();
        cancels.register(id(100 + MAX_EARLY_CANCELS as i64), kept.clone());
        assert!(kept.is_cancelled());
    }
}
