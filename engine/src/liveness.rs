//! Stuck turns (T20): a turn that makes no progress for `BRAIN_TURN_STUCK_AFTER_MS` is
//! ended `failed` with `turn_stuck`. Progress is anything the turn hears or shows: a model
//! event (reasoning not shown included), a chunk to the client, a tool's live output. A
//! person asked a question (an elicitation, P5) is not a stuck turn: while one waits,
//! the time does not count.
//!
//! The watch checks three times per period, so a stuck turn ends between one and four
//! thirds of the period after its last progress. It ends the turn the way a stop does (the
//! turn's cancel), and [`Liveness::is_stuck`] tells the wrap-up why.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

/// A running turn's last sign of life; clones share it.
#[derive(Clone, Debug)]
pub struct Liveness(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    born: Instant,
    /// Milliseconds after `born` of the last progress.
    last: AtomicU64,
    /// Questions waiting for a person now.
    asking: AtomicUsize,
    stuck: AtomicBool,
}

impl Default for Liveness {
    fn default() -> Self {
        Self(Arc::new(Inner {
            born: Instant::now(),
            last: AtomicU64::new(0),
            asking: AtomicUsize::new(0),
            stuck: AtomicBool::new(false),
        }))
    }
}

/// A person is asked while it lives (T20: waiting for a person is not stuck).
pub struct Asked(Liveness);

impl Drop for Asked {
    fn drop(&mut self) {
        self.0.0.asking.fetch_sub(1, Ordering::Relaxed);
        // The answer is progress: the period starts again from it.
        self.0.progressed();
    }
}

impl Liveness {
    /// The turn did something.
    pub fn progressed(&self) {
        self.0.last.store(self.elapsed_ms(), Ordering::Relaxed);
    }

    /// Holds the watch off until the returned guard drops.
    pub fn asking(&self) -> Asked {
        self.0.asking.fetch_add(1, Ordering::Relaxed);
        Asked(self.clone())
    }

    /// Whether the watch ended the turn.
    pub fn is_stuck(&self) -> bool {
        self.0.stuck.load(Ordering::Relaxed)
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.0.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn idle(&self) -> Duration {
        let last = self.0.last.load(Ordering::Relaxed);
        Duration::from_millis(self.elapsed_ms().saturating_sub(last))
    }

    /// Watches the turn until the guard drops: once it has been idle for `after` with
    /// nobody asked, it is marked stuck and `cancel` is cancelled.
    pub(crate) fn watch(&self, after: Duration, cancel: CancellationToken) -> DropGuard {
        let done = CancellationToken::new();
        let guard = done.clone().drop_guard();
        let liveness = self.clone();
        let tick = (after / 3).max(Duration::from_millis(1));
        tokio::spawn(async move {
            let mut checks = tokio::time::interval_at(Instant::now() + tick, tick);
            checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = done.cancelled() => return,
                    _ = checks.tick() => {}
                }
                if liveness.0.asking.load(Ordering::Relaxed) > 0 {
                    liveness.progressed();
                } else if liveness.idle() >= after {
                    liveness.0.stuck.store(true, Ordering::Relaxed);
                    cancel.cancel();
                    return;
                }
            }
        });
        guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_silent_turn_is_stuck_after_its_period_and_a_busy_one_never() {
        let period = Duration::from_secs(300);
        let silent = Liveness::default();
        let cancel = CancellationToken::new();
        let _watch = silent.watch(period, cancel.clone());
        tokio::time::sleep(period - Duration::from_secs(1)).await;
        assert!(!cancel.is_cancelled());
        tokio::time::sleep(period / 3 + Duration::from_secs(2)).await;
        assert!(cancel.is_cancelled() && silent.is_stuck());

        let busy = Liveness::default();
        let cancel = CancellationToken::new();
        let _watch = busy.watch(period, cancel.clone());
        for _ in 0..10 {
            tokio::time::sleep(period / 2).await;
            busy.progressed();
        }
        assert!(!cancel.is_cancelled() && !busy.is_stuck());
    }

    #[tokio::test(start_paused = true)]
    async fn a_person_asked_holds_the_watch_off() {
        let period = Duration::from_secs(300);
        let liveness = Liveness::default();
        let cancel = CancellationToken::new();
        let _watch = liveness.watch(period, cancel.clone());
        let asked = liveness.asking();
        tokio::time::sleep(period * 5).await;
        assert!(!cancel.is_cancelled());
        drop(asked);
        tokio::time::sleep(period + period / 2).await;
        assert!(cancel.is_cancelled() && liveness.is_stuck());
    }

    #[tokio::test(start_paused = true)]
    async fn the_watch_ends_with_its_guard() {
        let liveness = Liveness::default();
        let cancel = CancellationToken::new();
        drop(liveness.watch(Duration::from_secs(1), cancel.clone()));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!cancel.is_cancelled());
    }
}
