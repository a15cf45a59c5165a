//! The runtime-manager's Prometheus metrics (SPEC O2) and the listener that serves them at
//! `GET /metrics` on `RUNTIME_MANAGER_METRICS_ADDR`.
//!
//! Counters and the launch-to-ready histogram are updated where things happen
//! (`manager.rs`). The gauges that describe shared state (the queue's depth, sessions by
//! state, the warm pools) are sampled at each scrape, every read bounded by
//! [`SAMPLE_BOUND`]: a scrape costs one Redis round trip and two small Postgres queries,
//! whatever the traffic. A sample that fails or times out is *omitted* (its series vanish
//! from that scrape, so Prometheus marks them stale) and counted in
//! `runtime_manager_sample_errors_total{sample}`: an unknown value is never shown as 0.
//!
//! **Architecture Invariant:** label values are closed sets: a profile of
//! [`protocol::profile::WITH_HANDS`] (anything else is `unknown`), a session state, a
//! failure reason, an outcome, a reaper action. Never an id or a worker reference (X4).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use logging::metrics::{counter_vec, gauge_vec, histogram_vec};
use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec, Registry, TextEncoder};
use protocol::channel::{FailureReason, SessionState};
use protocol::profile::WITH_HANDS;
use queue::SessionQueue;
use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// The bound on each read a scrape makes.
pub const SAMPLE_BOUND: Duration = Duration::from_secs(2);

/// The states `runtime_manager_sessions` reports: a row's until it ends. The ended ones
/// grow forever (a count of them would scan the table) and are counted by the failure and
/// action counters instead.
const REPORTED_STATES: [SessionState; 5] = [
    SessionState::Pending,
    SessionState::Provisioning,
    SessionState::Connecting,
    SessionState::Ready,
    SessionState::Terminating,
];

/// Cheap to clone: the registry and its series behind one `Arc`.
#[derive(Clone)]
pub struct Metrics(Arc<Series>);

struct Series {
    registry: Registry,
    queue_depth: IntGaugeVec,
    launches: IntCounterVec,
    launch_to_ready: HistogramVec,
    sessions: IntGaugeVec,
    pool_size: IntGaugeVec,
    pool_idle: IntGaugeVec,
    reaper_actions: IntCounterVec,
    failures: IntCounterVec,
    sample_errors: IntCounterVec,
}

/// What a launch came to (`runtime_manager_launches_total{outcome}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchOutcome {
    /// The launcher started a worker (a session's or a warm-pool slot's).
    Launched,
    /// The launcher refused or failed (its error class is the session's failure detail).
    Failed,
}

impl LaunchOutcome {
    pub fn of<T, E>(launch: &Result<T, E>) -> Self {
        match launch {
            Ok(_) => Self::Launched,
            Err(_) => Self::Failed,
        }
    }
}

/// What the reaper (and the idle timer) did (`runtime_manager_reaper_actions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReaperAction {
    /// A launched worker never dialed in: its session failed `dial_timeout`.
    DialTimeout,
    /// A `ready` session's idle timer was armed (or re-armed after a lost check).
    IdleCheckArmed,
    /// An idle session was torn down (W7).
    IdleTeardown,
    /// A worker whose session ended, vanished or was replaced was stopped.
    WorkerStopped,
    /// A teardown left half done was finished.
    TeardownFinished,
    /// A warm-pool worker was started.
    PoolStarted,
    /// A warm-pool slot that never became ready was retired.
    PoolRetired,
    /// An idle warm-pool slot past its profile's maximum age was retired.
    PoolAged,
    /// The worker of a retired warm-pool slot was stopped and its row removed.
    PoolStopped,
}

impl ReaperAction {
    const ALL: [Self; 9] = [
        Self::DialTimeout,
        Self::IdleCheckArmed,
        Self::IdleTeardown,
        Self::WorkerStopped,
        Self::TeardownFinished,
        Self::PoolStarted,
        Self::PoolRetired,
        Self::PoolAged,
        Self::PoolStopped,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Self::DialTimeout => "dial_timeout",
            Self::IdleCheckArmed => "idle_check_armed",
            Self::IdleTeardown => "idle_teardown",
            Self::WorkerStopped => "worker_stopped",
            Self::TeardownFinished => "teardown_finished",
            Self::PoolStarted => "pool_started",
            Self::PoolRetired => "pool_retired",
            Self::PoolAged => "pool_aged",
            Self::PoolStopped => "pool_stopped",
        }
    }
}

/// A profile name as a bounded label.
pub fn profile_label(profile: &str) -> &'static str {
    WITH_HANDS
        .iter()
        .find(|p| **p == profile)
        .copied()
        .unwrap_or("unknown")
}

impl Metrics {
    /// Registers every series. Fails only on an invalid or duplicate name, a programming
    /// error every test would catch.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let r = &registry;
        let metrics = Self(Arc::new(Series {
            queue_depth: gauge_vec(
                r,
                "runtime_manager_queue_depth",
                "Session tasks due and not yet claimed by a runtime-manager (sampled at scrape).",
                &[],
            )?,
            launches: counter_vec(
                r,
                "runtime_manager_launches_total",
                "Worker launches (sessions and warm-pool slots) by profile and outcome.",
                &["profile", "outcome"],
            )?,
            launch_to_ready: histogram_vec(
                r,
                "runtime_manager_launch_to_ready_seconds",
                "From a cold session's worker launched to the session ready, by profile.",
                &["profile"],
                &[
                    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                ],
            )?,
            sessions: gauge_vec(
                r,
                "runtime_manager_sessions",
                "Live worker sessions by state, across replicas (sampled at scrape).",
                &["state"],
            )?,
            pool_size: gauge_vec(
                r,
                "runtime_manager_pool_size",
                "Warm-pool slots starting or idle, by profile (sampled at scrape).",
                &["profile"],
            )?,
            pool_idle: gauge_vec(
                r,
                "runtime_manager_pool_idle",
                "Warm-pool workers ready and unclaimed, by profile (sampled at scrape).",
                &["profile"],
            )?,
            reaper_actions: counter_vec(
                r,
                "runtime_manager_reaper_actions_total",
                "What the reaper and the idle timer did, by action.",
                &["action"],
            )?,
            failures: counter_vec(
                r,
                "runtime_manager_failures_total",
                "Sessions this replica failed, by failure reason.",
                &["reason"],
            )?,
            sample_errors: counter_vec(
                r,
                "runtime_manager_sample_errors_total",
                "Scrape-time samples that failed or timed out (their series were omitted).",
                &["sample"],
            )?,
            registry,
        }));
        // The closed label sets start at 0, so a rate over them exists from the first
        // scrape rather than from the first event.
        let s = &metrics.0;
        for profile in WITH_HANDS {
            for outcome in ["launched", "failed"] {
                s.launches.with_label_values(&[profile, outcome]);
            }
        }
        for action in ReaperAction::ALL {
            s.reaper_actions.with_label_values(&[action.as_str()]);
        }
        for reason in [
            FailureReason::DialTimeout,
            FailureReason::LaunchFailed,
            FailureReason::HeartbeatLost,
        ] {
            s.failures.with_label_values(&[reason.as_str()]);
        }
        Ok(metrics)
    }

    /// Adds series kept elsewhere (a launcher's) to what `GET /metrics` renders.
    pub fn register(
        &self,
        collector: Box<dyn prometheus::core::Collector>,
    ) -> Result<(), prometheus::Error> {
        self.0.registry.register(collector)
    }

    pub fn launched(&self, profile: &str, outcome: LaunchOutcome) {
        let outcome = match outcome {
            LaunchOutcome::Launched => "launched",
            LaunchOutcome::Failed => "failed",
        };
        self.0
            .launches
            .with_label_values(&[profile_label(profile), outcome])
            .inc();
    }

    pub fn became_ready(&self, profile: &str, after: Duration) {
        self.0
            .launch_to_ready
            .with_label_values(&[profile_label(profile)])
            .observe(after.as_secs_f64());
    }

    pub fn reaper(&self, action: ReaperAction) {
        self.0
            .reaper_actions
            .with_label_values(&[action.as_str()])
            .inc();
    }

    /// Counts a failure; answers how many of its reason this process has counted.
    pub fn failed(&self, reason: FailureReason) -> u64 {
        let counter = self.0.failures.with_label_values(&[reason.as_str()]);
        counter.inc();
        counter.get()
    }

    /// Samples the shared gauges, then renders every series in the text format.
    pub async fn scrape(&self, store: &Store, queue: &SessionQueue) -> String {
        let (depth, sessions, pools) = tokio::join!(
            tokio::time::timeout(SAMPLE_BOUND, queue.depth()),
            tokio::time::timeout(SAMPLE_BOUND, store.live_sessions_by_state()),
            tokio::time::timeout(SAMPLE_BOUND, store.pool_counts()),
        );
        let s = &self.0;
        match depth {
            Ok(Ok(depth)) => s
                .queue_depth
                .with_label_values::<&str>(&[])
                .set(i64::try_from(depth).unwrap_or(i64::MAX)),
            _ => self.omit(&s.queue_depth, "queue"),
        }
        match sessions {
            Ok(Ok(counts)) => {
                for state in REPORTED_STATES {
                    let n = counts
                        .iter()
                        .find(|(s, _)| SessionState::parse(s) == Some(state))
                        .map_or(0, |(_, n)| *n);
                    s.sessions.with_label_values(&[state.as_str()]).set(n);
                }
            }
            _ => self.omit(&s.sessions, "sessions"),
        }
        match pools {
            Ok(Ok(counts)) => {
                s.pool_size.reset();
                s.pool_idle.reset();
                for profile in WITH_HANDS {
                    s.pool_size.with_label_values(&[profile]).set(0);
                    s.pool_idle.with_label_values(&[profile]).set(0);
                }
                for (profile, open, idle) in counts {
                    let label = profile_label(&profile);
                    s.pool_size.with_label_values(&[label]).add(open);
                    s.pool_idle.with_label_values(&[label]).add(idle);
                }
            }
            _ => {
                self.omit(&s.pool_size, "pools");
                s.pool_idle.reset();
            }
        }
        match TextEncoder::new().encode_to_string(&s.registry.gather()) {
            Ok(text) => text,
            Err(e) => {
                tracing::warn!(error = %e, "could not encode metrics");
                String::new()
            }
        }
    }

    fn omit(&self, gauge: &IntGaugeVec, sample: &'static str) {
        gauge.reset();
        self.0.sample_errors.with_label_values(&[sample]).inc();
        tracing::warn!(sample, "metrics sample failed or timed out; omitted");
    }
}

#[derive(Clone)]
struct Scrape {
    metrics: Metrics,
    store: Store,
    queue: SessionQueue,
}

/// Serves `GET /metrics` on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    store: Store,
    queue: SessionQueue,
    shutdown: CancellationToken,
) {
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(get_metrics))
        .with_state(Scrape {
            metrics,
            store,
            queue,
        });
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
    {
        tracing::warn!(error_class = "metrics_listener", error = %e, "metrics listener ended");
    }
}

async fn get_metrics(
    State(at): State<Scrape>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4")],
        at.metrics.scrape(&at.store, &at.queue).await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_outside_the_catalog_are_one_label() {
        assert_eq!(profile_label("warm"), "warm");
        assert_eq!(profile_label("none"), "unknown");
        assert_eq!(profile_label("made-up-by-a-row"), "unknown");
    }

    #[test]
    fn failures_count_per_reason() {
        let metrics = Metrics::new().unwrap();
        assert_eq!(metrics.failed(FailureReason::DialTimeout), 1);
        assert_eq!(metrics.failed(FailureReason::DialTimeout), 2);
        assert_eq!(metrics.failed(FailureReason::LaunchFailed), 1);
    }
}
