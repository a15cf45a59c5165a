//! The brain's Prometheus metrics (SPEC O2): one registry, the series registered in it, and
//! the small guards the hot paths hold.
//!
//! `Metrics` is built once in `Engine::new` and cloned into whatever counts something; a
//! clone is one `Arc` bump. [`serve`] answers the scrape on a port of its own
//! (`BRAIN_METRICS_ADDR`), never the API's: an Ingress or load balancer that publishes the
//! API cannot publish the metrics with it.
//!
//! **Architecture Invariant:** every label value is one of a closed set of `&'static str`
//! (an outcome, a route kind, an error class, a built-in tool name, an axum path template);
//! never an id, a model name, a connector's tool name or any text of a turn (X4). A label
//! set that can grow with traffic would make every series a liability.

use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use logging::metrics::{counter, counter_vec, gauge, histogram_vec};
use prometheus::{HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry, TextEncoder};

use crate::tools::{Tool, ToolOutput};
use providers::{ModelRoute, ProviderError, ProviderKind, Providers};

/// Cheap to clone handle to the registry and its series (`metrics.hold_unavailable.inc()`).
#[derive(Clone)]
pub struct Metrics(Arc<Counters>);

/// The series themselves, reached through `Metrics`.
pub struct Counters {
    registry: Registry,
    /// Both adapters point at the offline demo model (`make dev` without a key): routes are
    /// labelled `demo`, so a dashboard never mistakes it for a provider.
    demo: bool,
    /// Turns that ran without their per-agent hold because Redis was unreachable (T9).
    pub hold_unavailable: IntCounter,
    /// Worker session failures by reason (SPEC W6).
    pub worker_failures: IntCounterVec,
    /// Running turns of dead replicas that this replica ended `interrupted` (O3).
    pub turns_reconciled: IntCounter,
    /// Turns and worker sessions a team quota refused, by quota (E2).
    pub quota_refusals: IntCounterVec,
    /// Requests the rate limit refused, or let through unchecked.
    pub rate_limits: IntCounterVec,
    /// Chunks the events publisher could not write (its channel full, or Redis failed);
    /// each gap reaches the chat's observers as a `data-resync` (S2).
    pub events_dropped: IntCounter,
    /// Observers of the events stream disconnected because they fell behind (S2).
    pub observers_too_slow: IntCounter,
    /// Observer streams refused past the per-principal or per-replica cap (S2).
    pub observers_refused: IntCounter,
    /// Turn intakes waiting for a slot in front of the Postgres pool, and the most that
    /// ever waited at once since the process started (`crate::intake`).
    pub intake_queued: IntGauge,
    pub intake_queued_peak: IntGauge,
    /// Chat file uploads (T27) and workspace snapshot uploads (W10) this replica is
    /// reading or storing (`crate::slots`).
    pub file_uploads: IntGauge,
    pub snapshot_uploads: IntGauge,
    /// Turn intakes refused by the queue's bounds, by reason (`crate::intake` starts each
    /// of its reasons at 0).
    pub intake_refusals: IntCounterVec,
    /// Where turn intakes took their chat and agent from: `kept` (this
    /// replica's, checked current by the intake), `read` (Postgres), `stale` (kept, found
    /// stale by the intake, read again).
    pub turn_bases: IntCounterVec,
    /// Workspace snapshots at idle teardown by outcome (`stored`, `over_cap`, `failed`,
    /// `refused`; `busy`: an upload sent back to retry later), and restores (`restored`)
    /// (W10).
    pub snapshots: IntCounterVec,
    /// Webhook delivery attempts by outcome: `delivered`, or the failure's class (P4).
    pub webhook_attempts: IntCounterVec,
    /// Chat channel messages (P10, P11) by platform and outcome: `inbound`, `refused`,
    /// `delivered`, `failed`.
    channel_messages: IntCounterVec,
    /// Erasures done, by what went: `chat`, `agent`, `team` (L2).
    erasures: IntCounterVec,
    /// Rows past a team's retention deleted, by kind: `turn`, `message`, `artifact`,
    /// `snapshot`, `chat_file` (L6).
    retention_deleted: IntCounterVec,
    /// Turns that ran, by how they ended ([`TurnOutcome`]).
    turns: IntCounterVec,
    /// From the turn task's start to its end state written, by the primary route's kind.
    turn_duration: HistogramVec,
    /// From a model request sent to its first output, per model call, by route kind.
    time_to_first_token: HistogramVec,
    /// Failed model calls, by error code and class (fallbacks that then succeeded count).
    provider_errors: IntCounterVec,
    /// Tool calls of turns, by tool (built-in names; `connector` for every connector tool)
    /// and outcome.
    tool_calls: IntCounterVec,
    /// Turn admissions by what the per-agent hold answered.
    holds: IntCounterVec,
    live_turns: IntGauge,
    event_observers: IntGauge,
    /// Responses by the matched route template and status code.
    http_requests: IntCounterVec,
    /// Background tasks that ended before shutdown, by task and how (the service's `supervisor`).
    pub background_task_exits: IntCounterVec,
}

/// How turns ran: their outcomes, durations, model calls and tool calls.
struct TurnSeries {
    turns: IntCounterVec,
    turn_duration: HistogramVec,
    time_to_first_token: HistogramVec,
    provider_errors: IntCounterVec,
    tool_calls: IntCounterVec,
    live_turns: IntGauge,
    turns_reconciled: IntCounter,
}

impl TurnSeries {
    fn register(r: &Registry) -> Result<Self, prometheus::Error> {
        Ok(Self {
            turns: counter_vec(
                r,
                "brain_turns_total",
                "Turns that ran, by outcome.",
                &["outcome"],
            )?,
            turn_duration: histogram_vec(
                r,
                "brain_turn_duration_seconds",
                "Turn duration from start to end state written, by the primary model route's provider.",
                &["route"],
                &[
                    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                ],
            )?,
            time_to_first_token: histogram_vec(
                r,
                "brain_time_to_first_token_seconds",
                "Time from a model request to its first output, per model call, by route provider.",
                &["route"],
                &[0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0],
            )?,
            provider_errors: counter_vec(
                r,
                "brain_provider_errors_total",
                "Failed model calls (fallbacks included), by error code and class.",
                &["code", "class"],
            )?,
            tool_calls: counter_vec(
                r,
                "brain_tool_calls_total",
                "Tool calls by tool (connector tools as `connector`) and outcome.",
                &["tool", "outcome"],
            )?,
            live_turns: gauge(r, "brain_live_turns", "Turns this replica is running.")?,
            turns_reconciled: counter(
                r,
                "brain_turns_reconciled_total",
                "Running turns of brain replicas whose lease lapsed, ended interrupted by this replica.",
            )?,
        })
    }
}

/// What let requests and turns in, queued them or refused them.
struct AdmissionSeries {
    http_requests: IntCounterVec,
    rate_limits: IntCounterVec,
    quota_refusals: IntCounterVec,
    holds: IntCounterVec,
    hold_unavailable: IntCounter,
    intake_queued: IntGauge,
    intake_queued_peak: IntGauge,
    intake_refusals: IntCounterVec,
    turn_bases: IntCounterVec,
    file_uploads: IntGauge,
    snapshot_uploads: IntGauge,
}

impl AdmissionSeries {
    fn register(r: &Registry) -> Result<Self, prometheus::Error> {
        Ok(Self {
            http_requests: counter_vec(
                r,
                "brain_http_requests_total",
                "HTTP responses by matched route template (`unmatched` for none) and status code.",
                &["route", "status"],
            )?,
            rate_limits: counter_vec(
                r,
                "brain_rate_limits_total",
                "Requests refused by the request rate limit (refused), or let through because Redis did not answer (unchecked).",
                &["result"],
            )?,
            quota_refusals: counter_vec(
                r,
                "brain_quota_refusals_total",
                "Turns and worker sessions refused by a team quota, by quota.",
                &["quota"],
            )?,
            holds: counter_vec(
                r,
                "brain_holds_total",
                "Turn admissions by what the per-agent hold answered.",
                &["result"],
            )?,
            hold_unavailable: counter(
                r,
                "brain_hold_unavailable_total",
                "Turns that ran without the per-agent turn hold because Redis was unreachable or slow.",
            )?,
            intake_queued: gauge(
                r,
                "brain_intake_queued",
                "Turn intakes waiting for a slot in front of the Postgres pool.",
            )?,
            intake_queued_peak: gauge(
                r,
                "brain_intake_queued_peak",
                "The most turn intakes that waited for a slot at once since the process started.",
            )?,
            file_uploads: gauge(
                r,
                "brain_file_uploads",
                "Chat file uploads this replica is reading or storing.",
            )?,
            snapshot_uploads: gauge(
                r,
                "brain_snapshot_uploads",
                "Workspace snapshot uploads this replica is storing.",
            )?,
            intake_refusals: counter_vec(
                r,
                "brain_intake_refusals_total",
                "Turn intakes refused with 503 overloaded, by reason (queue_full, wait_timeout).",
                &["reason"],
            )?,
            turn_bases: counter_vec(
                r,
                "brain_turn_bases_total",
                "Where turn intakes took their chat and agent from (kept, read, stale).",
                &["source"],
            )?,
        })
    }
}

/// The chat events stream: its publisher and its observers.
struct EventSeries {
    events_dropped: IntCounter,
    observers_too_slow: IntCounter,
    observers_refused: IntCounter,
    event_observers: IntGauge,
}

impl EventSeries {
    fn register(r: &Registry) -> Result<Self, prometheus::Error> {
        Ok(Self {
            events_dropped: counter(
                r,
                "brain_events_dropped_total",
                "Turn chunks not published to the chat events stream (publisher full or Redis failing).",
            )?,
            observers_too_slow: counter(
                r,
                "brain_event_observers_too_slow_total",
                "Events stream observers disconnected because their buffer filled.",
            )?,
            observers_refused: counter(
                r,
                "brain_event_observers_refused_total",
                "Observer streams refused past the per-principal or per-replica cap.",
            )?,
            event_observers: gauge(
                r,
                "brain_event_observers",
                "Clients following a chat's events stream on this replica.",
            )?,
        })
    }
}

/// Work beside the turns: worker sessions, snapshots, webhooks, erasure, retention and
/// background tasks.
struct UpkeepSeries {
    worker_failures: IntCounterVec,
    snapshots: IntCounterVec,
    webhook_attempts: IntCounterVec,
    channel_messages: IntCounterVec,
    erasures: IntCounterVec,
    retention_deleted: IntCounterVec,
    background_task_exits: IntCounterVec,
}

impl UpkeepSeries {
    fn register(r: &Registry) -> Result<Self, prometheus::Error> {
        Ok(Self {
            worker_failures: counter_vec(
                r,
                "brain_worker_failures_total",
                "Worker sessions that failed or were refused, by failure reason.",
                &["reason"],
            )?,
            snapshots: counter_vec(
                r,
                "brain_snapshots_total",
                "Workspace snapshots of idle teardowns by outcome, and restores.",
                &["outcome"],
            )?,
            webhook_attempts: counter_vec(
                r,
                "brain_webhook_attempts_total",
                "Webhook delivery attempts by outcome: delivered, or the failure's class.",
                &["outcome"],
            )?,
            channel_messages: counter_vec(
                r,
                "brain_channel_messages_total",
                "Chat channel messages by platform and outcome: inbound, refused, delivered, failed.",
                &["platform", "outcome"],
            )?,
            erasures: counter_vec(
                r,
                "brain_erasures_total",
                "Erasures done by this replica, by what went: chat, agent, team.",
                &["kind"],
            )?,
            retention_deleted: counter_vec(
                r,
                "brain_retention_deleted_total",
                "Rows past a team's retention deleted by this replica: turn, message, artifact, snapshot, chat_file.",
                &["kind"],
            )?,
            background_task_exits: counter_vec(
                r,
                "brain_background_task_exits_total",
                "Background tasks that ended before shutdown (the replica then reports not ready), by task and class: returned, panicked, cancelled.",
                &["task", "class"],
            )?,
        })
    }
}

/// How a turn ended, as `brain_turns_total{outcome}` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnOutcome {
    Completed,
    /// Calls wait for a person (A3); the continuation is a turn of its own.
    AwaitingApproval,
    Interrupted,
    /// A provider failure, a store that lost the answer, a panic.
    Failed,
    /// A team budget ran out before a further model call (E2).
    Refused,
}

impl TurnOutcome {
    pub const ALL: [Self; 5] = [
        Self::Completed,
        Self::AwaitingApproval,
        Self::Interrupted,
        Self::Failed,
        Self::Refused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::AwaitingApproval => "awaiting_approval",
            Self::Interrupted => "interrupted",
            Self::Failed => "failed",
            Self::Refused => "refused",
        }
    }

    /// An outcome whose answer should have been stored, and was not: the turn ends
    /// `failed` (`store_unavailable`) instead.
    pub fn unless_lost(self, stored: bool) -> Self {
        match self {
            Self::Completed | Self::AwaitingApproval | Self::Interrupted if !stored => Self::Failed,
            other => other,
        }
    }
}

/// What the per-agent hold answered an admission (`brain_holds_total{result}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldResult {
    Acquired,
    Busy,
    /// Redis unreachable or slow: the turn runs without a hold.
    Unavailable,
}

impl HoldResult {
    pub const ALL: [Self; 3] = [Self::Acquired, Self::Busy, Self::Unavailable];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Busy => "busy",
            Self::Unavailable => "unavailable",
        }
    }
}

impl Metrics {
    /// Registers every series in a fresh registry. Fails only on an invalid or duplicate
    /// metric name, which is a programming error caught by the tests. `demo`: the
    /// adapters serve the offline demo model.
    pub fn new(demo: bool) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let r = &registry;
        // Registered by area, one short list each, then laid out flat: the hot paths
        // reach every series as `metrics.<series>`.
        let TurnSeries {
            turns,
            turn_duration,
            time_to_first_token,
            provider_errors,
            tool_calls,
            live_turns,
            turns_reconciled,
        } = TurnSeries::register(r)?;
        let AdmissionSeries {
            http_requests,
            rate_limits,
            quota_refusals,
            holds,
            hold_unavailable,
            intake_queued,
            intake_queued_peak,
            intake_refusals,
            turn_bases,
            file_uploads,
            snapshot_uploads,
        } = AdmissionSeries::register(r)?;
        let EventSeries {
            events_dropped,
            observers_too_slow,
            observers_refused,
            event_observers,
        } = EventSeries::register(r)?;
        let UpkeepSeries {
            worker_failures,
            snapshots,
            webhook_attempts,
            channel_messages,
            erasures,
            retention_deleted,
            background_task_exits,
        } = UpkeepSeries::register(r)?;
        let metrics = Self(Arc::new(Counters {
            demo,
            hold_unavailable,
            worker_failures,
            turns_reconciled,
            quota_refusals,
            rate_limits,
            events_dropped,
            observers_too_slow,
            observers_refused,
            turns,
            turn_duration,
            time_to_first_token,
            provider_errors,
            tool_calls,
            holds,
            live_turns,
            event_observers,
            http_requests,
            intake_queued,
            intake_queued_peak,
            intake_refusals,
            turn_bases,
            file_uploads,
            snapshot_uploads,
            snapshots,
            webhook_attempts,
            channel_messages,
            erasures,
            retention_deleted,
            background_task_exits,
            registry,
        }));
        // The closed label sets start at 0, so a rate over them exists from the first
        // scrape rather than from the first event.
        for outcome in TurnOutcome::ALL {
            metrics.turns.with_label_values(&[outcome.as_str()]);
        }
        for result in HoldResult::ALL {
            metrics.holds.with_label_values(&[result.as_str()]);
        }
        for kind in ["turn", "message", "artifact", "snapshot"] {
            metrics.retention_deleted.with_label_values(&[kind]);
        }
        Ok(metrics)
    }

    /// A chat channel message on `platform` (`telegram`, `slack`): `inbound`, `refused`,
    /// `delivered` or `failed` (a reply given up).
    pub fn channel_message(&self, platform: &'static str, outcome: &'static str) {
        self.channel_messages
            .with_label_values(&[platform, outcome])
            .inc();
    }

    /// An erasure of `kind` (`chat`, `agent`, `team`) finished.
    pub fn erased(&self, kind: &'static str) {
        self.erasures.with_label_values(&[kind]).inc();
    }

    /// `count` rows of `kind` past their team's retention were deleted.
    pub fn retention_deleted(&self, kind: &'static str, count: u64) {
        self.retention_deleted
            .with_label_values(&[kind])
            .inc_by(count);
    }

    pub fn quota_refused(&self, field: crate::quota::Field) {
        self.quota_refusals.with_label_values(&[field.name()]).inc();
    }

    pub fn hold(&self, result: HoldResult) {
        self.holds.with_label_values(&[result.as_str()]).inc();
    }

    /// A turn task begins; `route` is its primary model route (`openai/<model>`). The
    /// label is a built-in connection's name, or `team` for any team's own (T14): a
    /// team's names would make the series unbounded.
    pub fn turn_started(&self, route: &str) -> TurnMetrics {
        self.live_turns.inc();
        TurnMetrics {
            route: ModelRoute::parse(route)
                .map(
                    |r| match Providers::BUILTIN.iter().find(|&&b| b == r.connection) {
                        Some(_) if self.demo => "demo",
                        Some(&builtin) => builtin,
                        None => "team",
                    },
                )
                .unwrap_or("unknown"),
            metrics: self.clone(),
            started: Instant::now(),
            ended: false,
        }
    }

    /// The label of a route kind.
    pub fn route(&self, kind: ProviderKind) -> &'static str {
        if self.demo { "demo" } else { kind.as_str() }
    }

    /// Counts one observer of the events stream for as long as the guard lives.
    pub fn observing(&self) -> Gauged {
        self.event_observers.inc();
        Gauged(self.event_observers.clone())
    }

    /// One response of the API; `route` is the matched path template, `status` the code as
    /// the service writes it (`"200"`).
    pub fn http_response(&self, route: Option<&str>, status: &str) {
        self.http_requests
            .with_label_values(&[route.unwrap_or("unmatched"), status])
            .inc();
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

/// What one turn task measures. Counts the turn live while it exists; dropped without
/// [`TurnMetrics::ended`] (the task panicked or answered an error before any output), the
/// turn counts as `failed`, which is what its row says.
pub struct TurnMetrics {
    metrics: Metrics,
    route: &'static str,
    started: Instant,
    ended: bool,
}

impl TurnMetrics {
    /// The turn moved to another replica (D3, D4), which counts its outcome: this replica
    /// counts none.
    pub fn moved(&mut self) {
        self.ended = true;
    }

    pub fn ended(&mut self, outcome: TurnOutcome) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let metrics = &self.metrics;
        metrics.turns.with_label_values(&[outcome.as_str()]).inc();
        metrics
            .turn_duration
            .with_label_values(&[self.route])
            .observe(self.started.elapsed().as_secs_f64());
    }

    /// A model call of `kind` produced its first output `elapsed` after it was sent.
    pub fn first_output(&self, kind: ProviderKind, elapsed: Duration) {
        self.metrics
            .time_to_first_token
            .with_label_values(&[self.metrics.route(kind)])
            .observe(elapsed.as_secs_f64());
    }

    /// A model call failed (before or after its first output).
    pub fn provider_error(&self, err: &ProviderError) {
        self.metrics
            .provider_errors
            .with_label_values(&[err.code().as_str(), err.metric_label()])
            .inc();
    }

    /// A call that never ran: `outcome` is `refused` (policy, budget, ceiling, unknown tool,
    /// arguments that are not JSON) or `denied` (a person said no).
    pub fn tool_not_run(&self, tool: Option<&Arc<dyn Tool>>, outcome: &'static str) {
        self.metrics
            .tool_calls
            .with_label_values(&[tool_label(tool), outcome])
            .inc();
    }

    /// A call about to run: counted `ok` or `error` by [`CountedCall::answered`], `cancelled`
    /// if the guard is dropped first (the turn was stopped).
    pub fn tool_call(&self, tool: &Arc<dyn Tool>) -> CountedCall {
        CountedCall {
            counter: Some((self.metrics.tool_calls.clone(), tool.metric_label())),
        }
    }
}

impl Drop for TurnMetrics {
    fn drop(&mut self) {
        self.ended(TurnOutcome::Failed);
        self.metrics.live_turns.dec();
    }
}

/// One running tool call; see [`TurnMetrics::tool_call`].
pub struct CountedCall {
    counter: Option<(IntCounterVec, &'static str)>,
}

impl CountedCall {
    pub fn answered(mut self, output: &ToolOutput) {
        if let Some((counter, tool)) = self.counter.take() {
            let outcome = if output.is_error { "error" } else { "ok" };
            counter.with_label_values(&[tool, outcome]).inc();
        }
    }
}

impl Drop for CountedCall {
    fn drop(&mut self) {
        if let Some((counter, tool)) = self.counter.take() {
            counter.with_label_values(&[tool, "cancelled"]).inc();
        }
    }
}

/// Holds a gauge up by one while it lives.
pub struct Gauged(IntGauge);

impl Drop for Gauged {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The bounded label of a tool: its own for built-in tools, `connector` for connector
/// tools, `unknown` for a name the model made up.
fn tool_label(tool: Option<&Arc<dyn Tool>>) -> &'static str {
    tool.map_or("unknown", |t| t.metric_label())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_dropped_unended_counts_failed_once_and_leaves_the_live_gauge() {
        let metrics = Metrics::new(false).unwrap();
        let mut turn = metrics.turn_started("anthropic/claude");
        assert_eq!(metrics.live_turns.get(), 1);
        turn.ended(TurnOutcome::Completed);
        drop(turn);
        drop(metrics.turn_started("openai/gpt"));
        assert_eq!(metrics.live_turns.get(), 0);
        let turns = |o: &str| metrics.turns.with_label_values(&[o]).get();
        assert_eq!((turns("completed"), turns("failed")), (1, 1));
        let observed = |route: &str| {
            metrics
                .turn_duration
                .with_label_values(&[route])
                .get_sample_count()
        };
        assert_eq!((observed("anthropic"), observed("openai")), (1, 1));
    }

    #[test]
    fn the_demo_model_is_its_own_route_and_a_lost_answer_is_a_failure() {
        let demo = Metrics::new(true).unwrap();
        assert_eq!(demo.route(ProviderKind::OpenAi), "demo");
        assert_eq!(
            Metrics::new(false).unwrap().route(ProviderKind::Anthropic),
            "anthropic"
        );
        assert_eq!(
            TurnOutcome::Completed.unless_lost(false),
            TurnOutcome::Failed
        );
        assert_eq!(
            TurnOutcome::Refused.unless_lost(false),
            TurnOutcome::Refused
        );
        assert_eq!(
            TurnOutcome::Interrupted.unless_lost(true),
            TurnOutcome::Interrupted
        );
    }
}
