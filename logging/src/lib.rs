//! How every binary of the workspace logs (the brain, the runtime-manager, the worker):
//! `tracing` events to stderr, filtered by the operator's `EnvFilter` from the binary's own
//! variable (`BRAIN_LOG`, `RUNTIME_MANAGER_LOG`, `WORKER_LOG`) and, whatever that filter
//! says, by [`privacy_cap`].
//!
//! **Architecture Invariant:** the privacy rule (X4) holds at every log level. Lines carry
//! ids, counts, durations and error classes, never message text, tool arguments or output,
//! secrets or tokens; but dependencies log what passes through them. rmcp logs whole MCP
//! messages (tool arguments, results, the progress notifications that carry command
//! output, the renewed session token) at `debug` and even `warn`; chromiumoxide logs CDP
//! commands (page text, typed text); kube logs API bodies (a worker Job's environment holds
//! its session token) at `warn`; h2, hyper, reqwest, sqlx, tungstenite and the AWS SDK log
//! headers, frames or statements at `debug` and `trace`. Naming them one by one misses the
//! next release's new line, so the cap is an allow-list: the workspace's own crates pass at
//! every level the operator asks for; every other crate is capped at `warn`, and the ones
//! above, known to put payloads in warnings, at `error`. The cap is a filter layer of its
//! own, not directives added to the operator's filter, so no directive of theirs (however
//! specific: `rmcp::service=trace`) lifts it.
//!
//! The same subscriber exports the workspace's spans as OpenTelemetry traces when the
//! operator configures an OTLP endpoint ([`traces`]). The log lines take events only, and
//! the operator's filter applies to them alone: `BRAIN_LOG=warn` quiets the logs, not the
//! traces.

use std::io::IsTerminal;

use tracing::Metadata;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, FilterExt, LevelFilter, Targets, filter_fn};
use tracing_subscriber::fmt;
use tracing_subscriber::layer::Filter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

#[cfg(feature = "metrics")]
pub mod metrics;
pub mod traces;

pub use traces::Telemetry;

/// The workspace's crates (as `tracing` targets, which start with the crate's name): their
/// events pass the cap at every level.
pub const OWN_TARGETS: [&str; 12] = [
    "brain",
    "session_states",
    "engine",
    "providers",
    "store",
    "domain",
    "runtime_manager",
    "worker",
    "channel",
    "queue",
    "protocol",
    "scripted_provider",
];

/// Dependencies that put payloads in warnings: capped at `error`.
pub const ERROR_ONLY_TARGETS: [&str; 3] = ["rmcp", "chromiumoxide", "kube"];

/// The level every other dependency is capped at.
pub const DEPENDENCY_CAP: LevelFilter = LevelFilter::WARN;

/// The privacy cap (X4): which levels of which targets may be logged at all.
pub fn privacy_cap() -> Targets {
    Targets::new()
        .with_default(DEPENDENCY_CAP)
        .with_targets(OWN_TARGETS.map(|target| (target, LevelFilter::TRACE)))
        .with_targets(ERROR_ONLY_TARGETS.map(|target| (target, LevelFilter::ERROR)))
}

/// Whether `target` is one of [`OWN_TARGETS`] or a module of one.
pub(crate) fn is_own_target(target: &str) -> bool {
    OWN_TARGETS.iter().any(|own| {
        target
            .strip_prefix(own)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// What the log lines take: events (spans go to traces only, and a span no layer wants
/// costs nothing), under the cap, then the operator's filter.
fn line_filter<S>(operator: EnvFilter) -> impl Filter<S>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    filter_fn(|meta: &Metadata<'_>| meta.is_event())
        .and(privacy_cap())
        .and(operator)
}

/// The line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Human-readable lines, coloured when stderr is a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the process's subscriber: stderr in `format`, the `EnvFilter` in the variable
/// `filter_var` (`default` when it is unset or does not parse), under [`privacy_cap`]; and
/// the OTLP trace exporter when the `OTEL_*` variables ask for one, with `service` as the
/// default service name. Call it inside the Tokio runtime (the exporter's task runs
/// there), and [`Telemetry::shutdown`] at a graceful exit.
pub fn init(filter_var: &str, default: &str, format: Format, service: &str) -> Telemetry {
    let operator = EnvFilter::try_from_env(filter_var).unwrap_or_else(|_| EnvFilter::new(default));
    let lines = match format {
        Format::Text => fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .boxed(),
        Format::Json => fmt::layer().json().with_writer(std::io::stderr).boxed(),
    };
    let (exporter, telemetry) = traces::layer(service);
    tracing_subscriber::registry()
        .with(lines.with_filter(line_filter(operator)))
        .with(exporter)
        .init();
    telemetry
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::{Arc, Mutex};

    use super::*;

    /// What a subscriber built like [`init`]'s, with `filter`, lets through.
    fn logged(filter: &str, emit: impl FnOnce()) -> String {
        let lines = Arc::new(Mutex::new(Vec::<u8>::new()));
        let writer = {
            let lines = lines.clone();
            move || Sink(lines.clone())
        };
        let subscriber = tracing_subscriber::registry().with(
            fmt::layer()
                .with_writer(writer)
                .with_ansi(false)
                .with_filter(line_filter(EnvFilter::new(filter))),
        );
        tracing::subscriber::with_default(subscriber, emit);
        String::from_utf8(lines.lock().unwrap().clone()).unwrap()
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn no_filter_lifts_the_cap_on_dependencies() {
        let out = logged("trace,rmcp=trace,rmcp::service=trace,h2=trace", || {
            tracing::warn!(target: "rmcp::service", "rmcp-warn");
            tracing::error!(target: "rmcp::service", "rmcp-error");
            tracing::debug!(target: "h2::codec", "h2-debug");
            tracing::warn!(target: "h2::codec", "h2-warn");
            tracing::warn!(target: "kube_client::client", "kube-warn");
            tracing::info!(target: "chromiumoxide::handler", "cdp-info");
        });
        assert!(!out.contains("rmcp-warn"), "{out}");
        assert!(out.contains("rmcp-error"), "{out}");
        assert!(!out.contains("h2-debug"), "{out}");
        assert!(out.contains("h2-warn"), "{out}");
        assert!(!out.contains("kube-warn"), "{out}");
        assert!(!out.contains("cdp-info"), "{out}");
    }

    #[test]
    fn without_an_exporter_no_layer_wants_a_span() {
        let subscriber = tracing_subscriber::registry().with(
            fmt::layer()
                .with_writer(std::io::sink)
                .with_filter(line_filter(EnvFilter::new("trace"))),
        );
        tracing::subscriber::with_default(subscriber, || {
            // Disabled at the callsite: creating it records nothing, formats nothing.
            assert!(tracing::info_span!(target: "brain::turn", "turn", turn = 1).is_disabled());
            assert!(tracing::event_enabled!(target: "brain::turn", tracing::Level::INFO));
        });
    }

    #[test]
    fn the_workspace_logs_at_the_level_the_operator_asks() {
        let out = logged("info,brain::turn=trace", || {
            tracing::trace!(target: "brain::turn::run", "turn-trace");
            tracing::debug!(target: "brain::api", "api-debug");
            tracing::info!(target: "runtime_manager::manager", "manager-info");
            tracing::trace!(target: "worker", "worker-trace");
        });
        assert!(out.contains("turn-trace"), "{out}");
        assert!(!out.contains("api-debug"), "{out}");
        assert!(out.contains("manager-info"), "{out}");
        assert!(!out.contains("worker-trace"), "{out}");
    }
}
