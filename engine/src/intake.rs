//! Bounded queueing of turn intakes in front of the Postgres pool: a burst is admitted in
//! arrival order, and refused only past a stated bound.
//!
//! A turn's intake (the chat read, the hold, the write of the turn row with the user
//! message) uses pooled connections one after another. Left to the pool, a burst larger
//! than it queues at the pool's own acquire, whose 5 s timeout then refuses the requests
//! that waited longest with `store_unavailable`, and the wrap-ups of running turns wait
//! behind the whole burst. Instead every intake first takes one of [`Intakes`]' slots:
//! the pool's size less a quarter kept back ([`slots_for`]), so an intake burst never
//! holds more than that many connections and the wrap-ups, key lookups and reads of
//! running turns always find the rest of the pool without queueing behind it. The slots
//! are a fair semaphore (FIFO: an intake that waits is served before any that came
//! later), and the slot is given back as soon as the turn row is written, before the
//! provider is called, so waiting for a model never holds one.
//!
//! The queue has two bounds (`BRAIN_INTAKE_QUEUE`, `BRAIN_INTAKE_QUEUE_WAIT_MS`). Past
//! either the request is answered `503 overloaded` with a `Retry-After`; it had written
//! nothing, so nothing it asked for is lost and a retry (with the same message id, T12)
//! runs it once. An intake that got its slot is never refused by the queue. Whoever
//! leaves the queue (a client that hung up) leaves it at once: the waiter's guard counts
//! it out when its future is dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;

/// The queue's bounds (`BRAIN_INTAKE_QUEUE`, `BRAIN_INTAKE_QUEUE_WAIT_MS`).
#[derive(Clone, Copy, Debug)]
pub struct IntakeConfig {
    /// Intakes that may wait for a slot; the next one is refused at once. `0`: none waits.
    pub queue: usize,
    /// The longest an intake waits for a slot before it is refused.
    pub wait: Duration,
}

/// Why an intake was refused (`brain_intake_refusals_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// `BRAIN_INTAKE_QUEUE` intakes were waiting already.
    QueueFull,
    /// It waited `BRAIN_INTAKE_QUEUE_WAIT_MS` without getting a slot.
    WaitedTooLong,
}

impl Refused {
    pub const ALL: [Self; 2] = [Self::QueueFull, Self::WaitedTooLong];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::WaitedTooLong => "wait_timeout",
        }
    }
}

/// A refused intake: why, and when the queue is expected to have room again.
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error(
    "this server's queue of new turns is {}; nothing was written or sent to a model, retry",
    match .reason { Refused::QueueFull => "full", Refused::WaitedTooLong => "not moving fast enough" }
)]
pub struct Overloaded {
    pub reason: Refused,
    pub retry_after: Duration,
}

/// The slots and the queue in front of them; one per replica, cheap to clone.
#[derive(Clone)]
pub struct Intakes(Arc<Inner>);

struct Inner {
    slots: Arc<Semaphore>,
    slot_count: usize,
    config: IntakeConfig,
    /// Intakes waiting for a slot now, and the most there ever were.
    queued: AtomicUsize,
    peak: AtomicUsize,
    /// A moving average of how long an intake holds its slot, in microseconds: what
    /// `Retry-After` is estimated from.
    held_micros: AtomicU64,
    metrics: Metrics,
}

/// The slots for a pool of `pool_size` connections: all but a quarter of them (rounded
/// up), at least one.
pub fn slots_for(pool_size: u32) -> usize {
    let pool = pool_size as usize;
    (pool - pool.div_ceil(4)).max(1)
}

impl Intakes {
    pub fn new(pool_size: u32, config: IntakeConfig, metrics: Metrics) -> Self {
        let slot_count = slots_for(pool_size);
        // The closed label set starts at 0, so a rate over it exists from the first scrape.
        for reason in Refused::ALL {
            metrics
                .intake_refusals
                .with_label_values(&[reason.as_str()]);
        }
        Self(Arc::new(Inner {
            slots: Arc::new(Semaphore::new(slot_count)),
            slot_count,
            config,
            queued: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            held_micros: AtomicU64::new(0),
            metrics,
        }))
    }

    /// How many intakes run at once.
    pub fn slots(&self) -> usize {
        self.0.slot_count
    }

    /// Waits for a slot in arrival order; refused past the queue's bounds.
    pub async fn enter(&self) -> Result<Intake, Overloaded> {
        let inner = &self.0;
        // Free slots mean nobody waits: tokio hands a released permit to the oldest
        // waiter before it becomes available, so this never overtakes the queue.
        if let Ok(permit) = inner.slots.clone().try_acquire_owned() {
            return Ok(self.admitted(permit));
        }
        let waiting = inner.queued.fetch_add(1, Ordering::AcqRel) + 1;
        if waiting > inner.config.queue {
            inner.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(self.refuse(Refused::QueueFull));
        }
        let waiter = Waiter::enter(inner);
        self.raise_peak(waiting);
        let acquired =
            tokio::time::timeout(inner.config.wait, inner.slots.clone().acquire_owned()).await;
        drop(waiter);
        match acquired {
            Ok(Ok(permit)) => Ok(self.admitted(permit)),
            // The semaphore is never closed; a closed one would admit nothing either.
            Ok(Err(_)) | Err(_) => Err(self.refuse(Refused::WaitedTooLong)),
        }
    }

    fn admitted(&self, permit: OwnedSemaphorePermit) -> Intake {
        Intake {
            _permit: permit,
            since: Instant::now(),
            inner: self.0.clone(),
        }
    }

    fn refuse(&self, reason: Refused) -> Overloaded {
        self.0
            .metrics
            .intake_refusals
            .with_label_values(&[reason.as_str()])
            .inc();
        Overloaded {
            reason,
            retry_after: self.drain_estimate(),
        }
    }

    /// How long the intakes waiting now take to get through the slots, at the recent
    /// pace: at least a second, at most the longest wait.
    fn drain_estimate(&self) -> Duration {
        let inner = &self.0;
        let queued = inner.queued.load(Ordering::Acquire) as u64;
        let held = inner.held_micros.load(Ordering::Relaxed);
        let micros = queued.saturating_mul(held) / inner.slot_count as u64;
        Duration::from_micros(micros).clamp(
            Duration::from_secs(1),
            inner.config.wait.max(Duration::from_secs(1)),
        )
    }

    /// Raises the peak gauge to `waiting` if it is higher. A gauge has no compare-and-set:
    /// whoever sets it reads the peak again afterwards, so a lower value set late by a
    /// racing waiter is corrected by that same waiter.
    fn raise_peak(&self, waiting: usize) {
        let inner = &self.0;
        if inner.peak.fetch_max(waiting, Ordering::AcqRel) >= waiting {
            return;
        }
        loop {
            let peak = inner.peak.load(Ordering::Acquire);
            inner.metrics.intake_queued_peak.set(peak as i64);
            if inner.peak.load(Ordering::Acquire) == peak {
                return;
            }
        }
    }
}

/// One waiter counted in the queue's gauge, and out of the queue when it leaves, however
/// it leaves (a slot, a refusal, its client gone).
struct Waiter<'a>(&'a Inner);

impl<'a> Waiter<'a> {
    /// Counted in `queued` already (that is what the bound was checked on).
    fn enter(inner: &'a Inner) -> Self {
        inner.metrics.intake_queued.inc();
        Self(inner)
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
        self.0.metrics.intake_queued.dec();
    }
}

/// A slot: held from admission until the turn row is written (or the intake ended
/// otherwise); dropping it lets the next waiter in.
pub struct Intake {
    _permit: OwnedSemaphorePermit,
    since: Instant,
    inner: Arc<Inner>,
}

impl Drop for Intake {
    fn drop(&mut self) {
        let held = u64::try_from(self.since.elapsed().as_micros()).unwrap_or(u64::MAX);
        // An exponential moving average over about the last eight intakes.
        let _ = self
            .inner
            .held_micros
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| {
                Some(if mean == 0 {
                    held
                } else {
                    mean - mean / 8 + held / 8
                })
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intakes(pool: u32, queue: usize, wait_ms: u64) -> (Intakes, Metrics) {
        let metrics = Metrics::new(false).unwrap();
        let config = IntakeConfig {
            queue,
            wait: Duration::from_millis(wait_ms),
        };
        (Intakes::new(pool, config, metrics.clone()), metrics)
    }

    #[test]
    fn every_refusal_reason_is_counted_from_zero() {
        let (_intakes, metrics) = intakes(4, 3, 1_000);
        let scraped = metrics.render();
        for reason in Refused::ALL {
            let series = format!(
                "brain_intake_refusals_total{{reason=\"{}\"}} 0",
                reason.as_str()
            );
            assert!(scraped.contains(&series), "{series} in {scraped}");
        }
    }

    #[test]
    fn a_quarter_of_the_pool_is_kept_for_everything_else() {
        assert_eq!([1, 2, 4, 10, 20, 100].map(slots_for), [1, 1, 3, 7, 15, 75]);
    }

    #[tokio::test]
    async fn waiters_enter_in_arrival_order_and_the_one_past_the_bound_is_refused() {
        let (intakes, metrics) = intakes(4, 3, 60_000);
        assert_eq!(intakes.slots(), 3);
        let running: Vec<Intake> = futures_util::future::join_all((0..3).map(|_| intakes.enter()))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut waiting = Vec::new();
        for i in 0..3 {
            let (intakes, order_tx) = (intakes.clone(), order_tx.clone());
            waiting.push(tokio::spawn(async move {
                let intake = intakes.enter().await.unwrap();
                order_tx.send(i).unwrap();
                drop(intake);
            }));
            // Each waiter queued before the next arrives.
            while metrics.intake_queued.get() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        let refused = intakes.enter().await.err().unwrap();
        assert_eq!(refused.reason, Refused::QueueFull);
        assert!(refused.retry_after >= Duration::from_secs(1));
        assert_eq!(metrics.intake_queued_peak.get(), 3);
        // One slot frees at a time: the waiters go in the order they came.
        for intake in running {
            drop(intake);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for task in waiting {
            task.await.unwrap();
        }
        let order: Vec<i64> = std::iter::from_fn(|| order_rx.try_recv().ok()).collect();
        assert_eq!(order, [0, 1, 2]);
        assert_eq!(metrics.intake_queued.get(), 0);
        let refusals = |r: Refused| {
            metrics
                .intake_refusals
                .with_label_values(&[r.as_str()])
                .get()
        };
        assert_eq!(
            (
                refusals(Refused::QueueFull),
                refusals(Refused::WaitedTooLong)
            ),
            (1, 0)
        );
        assert_eq!(intakes.0.queued.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_waiter_past_the_wait_bound_is_refused_and_one_that_leaves_is_counted_out() {
        let (intakes, metrics) = intakes(1, 10, 50);
        let held = intakes.enter().await.unwrap();
        let refused = intakes.enter().await.err().unwrap();
        assert_eq!(refused.reason, Refused::WaitedTooLong);
        assert_eq!(metrics.intake_queued.get(), 0);
        // A client that hangs up while queued: its future is dropped mid-wait.
        let left = tokio::time::timeout(Duration::from_millis(10), intakes.enter()).await;
        assert!(left.is_err());
        assert_eq!(metrics.intake_queued.get(), 0);
        assert_eq!(intakes.0.queued.load(Ordering::Acquire), 0);
        drop(held);
        assert!(intakes.enter().await.is_ok());
    }
}
