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

use std::io::IsTerminal;

use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::fmt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The workspace's crates (as `tracing` targets, which start with the crate's name): their
/// events pass the cap at every level.
pub const OWN_TARGETS: [&str; 7] = [
    "brain",
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

/// The line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Human-readable lines, coloured when stderr is a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the process's subscriber: stderr in `format`, the `EnvFilter` in the variable
/// `filter_var` (`default` when it is unset or does not parse), under [`privacy_cap`].
pub fn init(filter_var: &str, default: &str, format: Format) {
    let filter = EnvFilter::try_from_env(filter_var).unwrap_or_else(|_| EnvFilter::new(default));
    let capped = tracing_subscriber::registry()
        .with(privacy_cap())
        .with(filter);
    match format {
        Format::Text => capped
            .with(
                fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::stderr().is_terminal()),
            )
            .init(),
        Format::Json => capped
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .init(),
    }
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
        let subscriber = tracing_subscriber::registry()
            .with(privacy_cap())
            .with(EnvFilter::new(filter))
            .with(fmt::layer().with_writer(writer).with_ansi(false));
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
