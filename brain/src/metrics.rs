//! The brain's Prometheus metrics: one registry and the counters registered in it.
//!
//! `Metrics` is built once in `main` and cloned into whatever counts something; a clone is
//! one `Arc` bump. `render` produces the Prometheus text format for the scrape endpoint.

use std::ops::Deref;
use std::sync::Arc;

use prometheus::{IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

/// Cheap to clone handle to the registry and its counters (`metrics.hold_unavailable.inc()`).
#[derive(Clone)]
pub struct Metrics(Arc<Counters>);

/// The counters themselves, reached through `Metrics`.
pub struct Counters {
    registry: Registry,
    /// Turns that ran without their per-agent hold because Redis was unreachable (T9).
    pub hold_unavailable: IntCounter,
    /// Worker session failures by reason (SPEC W6).
    pub worker_failures: IntCounterVec,
    /// Running turns of dead replicas that this replica ended `interrupted` (O3).
    pub turns_reconciled: IntCounter,
    /// Turns and worker sessions a team quota refused, by quota (E2).
    pub quota_refusals: IntCounterVec,
    /// Chunks the events publisher could not write (its channel full, or Redis failed);
    /// each gap reaches the chat's observers as a `data-resync` (S2).
    pub events_dropped: IntCounter,
    /// Observers of the events stream disconnected because they fell behind (S2).
    pub observers_too_slow: IntCounter,
    /// Workspace snapshots at idle teardown by outcome (`stored`, `over_cap`, `failed`,
    /// `refused`), and restores (`restored`) (W10).
    pub snapshots: IntCounterVec,
}

impl Metrics {
    /// Registers every counter in a fresh registry. Fails only on an invalid or duplicate
    /// metric name, which is a programming error caught by the tests.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let hold_unavailable = counter(
            &registry,
            "brain_hold_unavailable_total",
            "Turns that ran without the per-agent turn hold because Redis was unreachable or slow.",
        )?;
        let worker_failures = IntCounterVec::new(
            Opts::new(
                "brain_worker_failures_total",
                "Worker sessions that failed or were refused, by failure reason.",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(worker_failures.clone()))?;
        let turns_reconciled = counter(
            &registry,
            "brain_turns_reconciled_total",
            "Running turns of brain replicas whose lease lapsed, ended interrupted by this replica.",
        )?;
        let quota_refusals = IntCounterVec::new(
            Opts::new(
                "brain_quota_refusals_total",
                "Turns and worker sessions refused by a team quota, by quota.",
            ),
            &["quota"],
        )?;
        registry.register(Box::new(quota_refusals.clone()))?;
        let events_dropped = counter(
            &registry,
            "brain_events_dropped_total",
            "Turn chunks not published to the chat events stream (publisher full or Redis failing).",
        )?;
        let observers_too_slow = counter(
            &registry,
            "brain_event_observers_too_slow_total",
            "Events stream observers disconnected because their buffer filled.",
        )?;
        let snapshots = IntCounterVec::new(
            Opts::new(
                "brain_snapshots_total",
                "Workspace snapshots of idle teardowns by outcome, and restores.",
            ),
            &["outcome"],
        )?;
        registry.register(Box::new(snapshots.clone()))?;
        Ok(Self(Arc::new(Counters {
            registry,
            snapshots,
            hold_unavailable,
            worker_failures,
            turns_reconciled,
            quota_refusals,
            events_dropped,
            observers_too_slow,
        })))
    }

    pub fn quota_refused(&self, field: crate::quota::Field) {
        self.quota_refusals.with_label_values(&[field.name()]).inc();
    }

    /// Every registered metric in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        match TextEncoder::new().encode_to_string(&self.0.registry.gather()) {
            Ok(text) => text,
            Err(err) => {
                tracing::warn!(error = %err, "could not encode metrics");
                String::new()
            }
        }
    }
}

impl Deref for Metrics {
    type Target = Counters;

    fn deref(&self) -> &Counters {
        &self.0
    }
}

fn counter(registry: &Registry, name: &str, help: &str) -> Result<IntCounter, prometheus::Error> {
    let counter = IntCounter::with_opts(Opts::new(name, help))?;
    registry.register(Box::new(counter.clone()))?;
    Ok(counter)
}
