//! The background tasks `serve` starts, each under a name: one that ends before shutdown
//! (returns or panics) is logged, counted in `brain_background_task_exits_total` and
//! fails `/readyz` from then on. A replica whose scheduler, publisher or relay is gone
//! still answers requests, so without this it would take traffic it serves only in part,
//! and nobody would know why.
//!
//! Shutdown is the `stopping` token: the drain ends tasks on purpose, and those exits are
//! normal.

use std::future::Future;
use std::sync::{Arc, Mutex};

use prometheus::IntCounterVec;
use tokio_util::sync::CancellationToken;

/// Cheap to clone; every clone sees the same tasks.
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

struct Inner {
    stopping: CancellationToken,
    exits: IntCounterVec,
    /// The tasks that ended before shutdown, in the order they did.
    gone: Mutex<Vec<&'static str>>,
}

/// How a supervised task ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Its future completed.
    Returned,
    Panicked,
    /// The runtime dropped it (the runtime is shutting down).
    Cancelled,
}

impl Exit {
    pub const ALL: [Self; 3] = [Self::Returned, Self::Panicked, Self::Cancelled];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Returned => "returned",
            Self::Panicked => "panicked",
            Self::Cancelled => "cancelled",
        }
    }
}

impl Supervisor {
    /// `exits` counts by `task` and `class`; exits once `stopping` is cancelled are not
    /// counted.
    pub fn new(stopping: CancellationToken, exits: IntCounterVec) -> Self {
        Self {
            inner: Arc::new(Inner {
                stopping,
                exits,
                gone: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Runs `task` on the runtime under `name` (a fixed name: it is a metric label). The
    /// handle resolves once the task has ended and its end is accounted for.
    pub fn spawn<F>(&self, name: &'static str, task: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        for exit in Exit::ALL {
            self.inner.exits.with_label_values(&[name, exit.as_str()]);
        }
        let running = tokio::spawn(task);
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let exit = match running.await {
                Ok(()) => Exit::Returned,
                Err(err) if err.is_panic() => Exit::Panicked,
                Err(_) => Exit::Cancelled,
            };
            inner.ended(name, exit);
        })
    }

    /// Whether every supervised task still runs (or ended only because of shutdown).
    pub fn all_running(&self) -> bool {
        self.gone().is_empty()
    }

    /// The tasks that ended before shutdown.
    pub fn gone(&self) -> Vec<&'static str> {
        self.inner
            .gone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Inner {
    fn ended(&self, name: &'static str, exit: Exit) {
        if self.stopping.is_cancelled() {
            tracing::debug!(task = name, class = exit.as_str(), "background task ended");
            return;
        }
        tracing::error!(
            task = name,
            class = exit.as_str(),
            "background task ended before shutdown; the replica reports not ready"
        );
        self.exits.with_label_values(&[name, exit.as_str()]).inc();
        self.gone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(name);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn exits() -> IntCounterVec {
        IntCounterVec::new(
            prometheus::Opts::new("exits_total", "test"),
            &["task", "class"],
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_task_that_panics_or_returns_is_counted_and_reported() {
        let exits = exits();
        let supervisor = Supervisor::new(CancellationToken::new(), exits.clone());
        let hold = CancellationToken::new();
        let held = hold.clone();
        supervisor.spawn("steady", async move { held.cancelled().await });
        assert!(supervisor.all_running());

        let panics = supervisor.spawn("panics", async { panic!("boom") });
        let returns = supervisor.spawn("returns", async {});
        panics.await.unwrap();
        returns.await.unwrap();

        assert!(!supervisor.all_running());
        let mut gone = supervisor.gone();
        gone.sort_unstable();
        assert_eq!(gone, ["panics", "returns"]);
        let count = |task, class| exits.with_label_values(&[task, class]).get();
        assert_eq!(count("panics", "panicked"), 1);
        assert_eq!(count("returns", "returned"), 1);
        assert_eq!(count("steady", "returned"), 0);
        hold.cancel();
    }

    #[tokio::test]
    async fn exits_during_shutdown_are_normal() {
        let exits = exits();
        let stopping = CancellationToken::new();
        let supervisor = Supervisor::new(stopping.clone(), exits.clone());
        let stop = stopping.clone();
        let drains = supervisor.spawn("drains", async move { stop.cancelled().await });
        stopping.cancel();
        drains.await.unwrap();

        assert!(supervisor.all_running());
        assert_eq!(exits.with_label_values(&["drains", "returned"]).get(), 0);
    }
}
