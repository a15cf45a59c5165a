//! Traces (SPEC O2): the workspace's own `tracing` spans exported over OTLP/HTTP
//! (protobuf) when the operator sets `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, with the W3C trace context carried across
//! process boundaries (an HTTP request's `traceparent`, an MCP request's `_meta`).
//!
//! - Unset (or `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`): no exporter, no
//!   OpenTelemetry layer, and, since the log lines take events only, no subscriber layer
//!   that wants a span at all: every span callsite is disabled, so a span costs one cached
//!   interest check and [`context_of`] one atomic load.
//! - Set: the standard `OTEL_*` variables configure the exporter (`…_HEADERS`, `…_TIMEOUT`,
//!   `…_COMPRESSION`), the batch processor (`OTEL_BSP_*`) and the sampler
//!   (`OTEL_TRACES_SAMPLER`, `…_ARG`); `OTEL_SERVICE_NAME` names the service (default: the
//!   binary's own name) and `OTEL_RESOURCE_ATTRIBUTES` adds resource attributes. Batches
//!   are posted by the async reqwest client from a task on the process's Tokio runtime
//!   (no blocking client, no thread of the exporter's own).
//!
//! **Architecture Invariant:** a trace carries what the logs may (X4) and nothing more:
//! only spans pass to the exporter, never events (whose messages are log text), and only
//! the workspace's own spans at `info` and above; every field of such a span becomes an
//! attribute, so those fields are ids, counts, durations, names and outcome classes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::runtime;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfig, SdkTracerProvider};
use tracing::{Level, Metadata};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{FilterFn, filter_fn};
use tracing_subscriber::registry::LookupSpan;

/// The W3C Trace Context header (and `_meta` key) naming the parent span.
pub const TRACEPARENT: &str = "traceparent";
/// Its vendor-specific companion.
pub const TRACESTATE: &str = "tracestate";

/// How long [`Telemetry::shutdown`] waits for the last batch to be posted.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(5);

/// Whether spans are exported: read on every propagation, so a process without an
/// exporter never builds a context to carry.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// What [`crate::init`] set up for traces: the exporter, if any, which
/// [`Telemetry::shutdown`] flushes and stops at a graceful exit.
#[must_use = "keep it until the process exits and call `shutdown` then, or the last spans are lost"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Posts the spans still buffered and stops the exporter, within a bound: a collector
    /// that is down must not hold up the exit. Call it inside the Tokio runtime, after the
    /// work whose spans should be seen has ended.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        EXPORTING.store(false, Ordering::Relaxed);
        // The SDK blocks its caller until the batch task (on this runtime) has posted.
        let stopped = tokio::task::spawn_blocking(move || provider.shutdown());
        match tokio::time::timeout(SHUTDOWN_BOUND, stopped).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => eprintln!("traces: the last spans may be lost: {err}"),
            Ok(Err(_)) | Err(_) => eprintln!("traces: the exporter did not stop in time"),
        }
    }
}

/// Whether the environment names a collector and does not turn traces off.
fn endpoint_configured(env: &dyn Fn(&str) -> Option<String>) -> bool {
    let set = |name: &str| env(name).is_some_and(|v| !v.trim().is_empty());
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The service name: `OTEL_SERVICE_NAME`, else the binary's default.
fn service_name(env: &dyn Fn(&str) -> Option<String>, default: &str) -> String {
    env("OTEL_SERVICE_NAME")
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// Which spans reach the exporter: the workspace's own, at `info` and above; no events.
pub(crate) fn exported(meta: &Metadata<'_>) -> bool {
    meta.is_span() && *meta.level() <= Level::INFO && crate::is_own_target(meta.target())
}

/// The layer that exports spans, or `None` (with the reason on stderr: the subscriber is
/// not up yet) when traces are off or the exporter cannot be built. Must run inside a
/// Tokio runtime: the batch processor's task is spawned on it.
pub(crate) fn layer<S>(service: &str) -> (Option<impl Layer<S> + use<S>>, Telemetry)
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    match provider(service) {
        Some(provider) => {
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer(service.to_owned()))
                .with_threads(false)
                .with_filter(exported_filter());
            EXPORTING.store(true, Ordering::Relaxed);
            (
                Some(layer),
                Telemetry {
                    provider: Some(provider),
                },
            )
        }
        None => (None, Telemetry { provider: None }),
    }
}

/// The tracer provider with its OTLP exporter, when the environment asks for one.
fn provider(service: &str) -> Option<SdkTracerProvider> {
    let env = |name: &str| std::env::var(name).ok();
    if !endpoint_configured(&env) {
        return None;
    }
    if tokio::runtime::Handle::try_current().is_err() {
        eprintln!("traces: not started inside a Tokio runtime; no spans are exported");
        return None;
    }
    // The endpoint, headers, timeout and compression come from the `OTEL_EXPORTER_OTLP_*`
    // variables, read by the exporter itself.
    let exporter = match SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()
    {
        Ok(exporter) => exporter,
        Err(err) => {
            eprintln!("traces: the OTLP exporter cannot be built ({err}); no spans are exported");
            return None;
        }
    };
    // `BatchConfig::default()` reads the `OTEL_BSP_*` variables.
    let processor = BatchSpanProcessor::builder(exporter, runtime::Tokio)
        .with_batch_config(BatchConfig::default())
        .build();
    Some(
        SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(
                Resource::builder()
                    .with_service_name(service_name(&env, service))
                    .build(),
            )
            .build(),
    )
}

fn exported_filter() -> FilterFn<fn(&Metadata<'_>) -> bool> {
    filter_fn(exported as fn(&Metadata<'_>) -> bool)
}

/// A span's W3C trace context, to carry to another process; `None` when nothing is
/// exported (or the span is not part of a sampled trace).
pub fn context_of(span: &tracing::Span) -> Option<TraceContext> {
    if !EXPORTING.load(Ordering::Relaxed) {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    Some(TraceContext {
        traceparent: carrier.remove(TRACEPARENT)?,
        tracestate: carrier.remove(TRACESTATE).filter(|s| !s.is_empty()),
    })
}

/// Makes `span` (not yet entered) a child of the remote `parent`. A malformed
/// `traceparent` leaves it a root, as the W3C spec asks.
pub fn continue_from(span: &tracing::Span, parent: Option<&TraceContext>) {
    let Some(parent) = parent else {
        return;
    };
    let mut carrier = HashMap::from([(TRACEPARENT.to_owned(), parent.traceparent.clone())]);
    if let Some(tracestate) = &parent.tracestate {
        carrier.insert(TRACESTATE.to_owned(), tracestate.clone());
    }
    let parent = TraceContextPropagator::new().extract(&carrier);
    // Fails only when the span is disabled or already started: then there is nothing to do.
    let _ = span.set_parent(parent);
}

/// The W3C trace context of a span, as it travels: header values or `_meta` entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The context another process sent (an HTTP request's headers, an MCP request's
    /// `_meta`); `None` without a `traceparent`, or when this process exports nothing
    /// (nothing then needs a parent).
    pub fn received(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        if !EXPORTING.load(Ordering::Relaxed) {
            return None;
        }
        Some(Self {
            traceparent: traceparent?.to_owned(),
            tracestate: tracestate.filter(|s| !s.is_empty()).map(str::to_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| vars.get(name).cloned()
    }

    #[test]
    fn traces_are_on_only_with_an_endpoint_and_not_disabled() {
        assert!(!endpoint_configured(&env_of(&[])));
        assert!(!endpoint_configured(&env_of(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            " "
        )])));
        assert!(endpoint_configured(&env_of(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4318"
        )])));
        assert!(endpoint_configured(&env_of(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4318/v1/traces"
        )])));
        assert!(!endpoint_configured(&env_of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ])));
        assert!(!endpoint_configured(&env_of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ])));
    }

    #[test]
    fn the_service_is_named_by_the_operator_or_the_binary() {
        assert_eq!(service_name(&env_of(&[]), "brain"), "brain");
        assert_eq!(
            service_name(&env_of(&[("OTEL_SERVICE_NAME", "brain-eu")]), "brain"),
            "brain-eu"
        );
        assert_eq!(
            service_name(&env_of(&[("OTEL_SERVICE_NAME", "")]), "worker"),
            "worker"
        );
    }

    #[test]
    fn nothing_is_carried_when_nothing_is_exported() {
        let span = tracing::info_span!("turn");
        assert_eq!(context_of(&span), None);
    }
}
