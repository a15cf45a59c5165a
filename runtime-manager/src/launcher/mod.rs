//! Launchers: how a worker process comes to exist and stops existing.
//!
//! SPEC names two, behind one interface: Kubernetes ([`kubernetes::KubernetesLauncher`], a
//! `batch/v1` Job per session) and the local process launcher
//! ([`local::LocalProcessLauncher`], the embedded default). The manager holds an
//! `Arc<dyn Launcher>` and never knows which one runs.
//!
//! **Architecture Invariant:** a launcher knows processes (or Jobs and pods), never session
//! states; every state change is the manager's (`manager.rs`), recorded with
//! compare-and-set SQL. What a launcher observes on its own (an image that cannot be
//! pulled, an OOM kill) it reports as a [`WorkerFailure`] for the manager to record.

use std::path::PathBuf;

use futures_util::future::BoxFuture;
use protocol::{AgentId, ChatId, SessionId, TeamId};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub mod kubernetes;
pub mod local;
pub mod local_egress;
pub mod sandbox;

/// The manager's telemetry configuration a worker shares, whichever launcher starts it
/// (O2): its `OTEL_*` variables, since the collector of its traces is the workers' too,
/// except `OTEL_SERVICE_NAME` (a worker names itself `worker`) and the `…_HEADERS` ones,
/// which may hold a collector's credentials while a worker runs model-chosen commands.
pub fn telemetry_env() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(name, _)| passes_telemetry(name))
        .collect()
}

fn passes_telemetry(name: &str) -> bool {
    name.starts_with("OTEL_") && name != "OTEL_SERVICE_NAME" && !name.ends_with("_HEADERS")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_shares_the_collector_but_not_its_credentials_or_name() {
        assert!(passes_telemetry("OTEL_EXPORTER_OTLP_ENDPOINT"));
        assert!(passes_telemetry("OTEL_BSP_SCHEDULE_DELAY"));
        assert!(passes_telemetry("OTEL_RESOURCE_ATTRIBUTES"));
        assert!(!passes_telemetry("OTEL_EXPORTER_OTLP_HEADERS"));
        assert!(!passes_telemetry("OTEL_EXPORTER_OTLP_TRACES_HEADERS"));
        assert!(!passes_telemetry("OTEL_SERVICE_NAME"));
        assert!(!passes_telemetry("DATABASE_URL"));
    }
}

/// Everything a launcher needs to start one session's worker.
#[derive(Clone)]
pub struct LaunchSpec {
    pub session: SessionId,
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    /// The RuntimeProfile's name (`light`, `heavy`, `browser`, `warm`); each launcher
    /// resolves it in its own copy of the profiles.
    pub profile: String,
    /// The session token the worker presents when it dials the brain (X2).
    pub token: String,
    /// Where the worker dials (`BRAIN_PUBLIC_URL`).
    pub brain_public_url: String,
    /// Whether the worker restores its chat's workspace snapshot before it dials
    /// (`WORKER_RESTORE`, W10): the profile keeps snapshots and the chat has one; never for
    /// a pooled worker, which has no chat yet.
    pub restore: bool,
}

impl std::fmt::Debug for LaunchSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchSpec")
            .field("session", &self.session)
            .field("profile", &self.profile)
            .field("token", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// A failure a launcher observed in one of its workers (R4). The manager fails the session
/// (`launch_failed` with [`WorkerFailure::detail`]; a session already failed for another
/// reason gets the detail added) and stops the worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerFailure {
    pub session: SessionId,
    pub worker_ref: String,
    /// A bounded label for `failure_detail`: `image_pull`, `container_config`,
    /// `unschedulable`, `oom_killed` or `start_timeout`.
    pub detail: &'static str,
}

/// A worker this launcher runs right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningWorker {
    pub session: SessionId,
    pub worker_ref: String,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("the worker executable {0} does not exist")]
    BinaryMissing(PathBuf),
    #[error("the worker executable could not be started: {0}")]
    Spawn(std::io::Error),
    #[error("the workspace could not be prepared: {0}")]
    Workspace(std::io::Error),
    #[error("not a worker reference of this launcher")]
    InvalidRef,
    #[error("signalling the worker failed: {0}")]
    Signal(nix::Error),
    #[error("no RuntimeProfile named {0:?} launches workers")]
    UnknownProfile(String),
    #[error("the Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("a Job of this name still exists after deleting it")]
    JobExists,
    #[error("local workers cannot be confined here: {0}")]
    Unconfinable(String),
    /// The session's egress proxy cannot be served (W13, W14).
    #[error("egress: {0}")]
    Egress(#[from] crate::egress::EgressError),
}

impl LaunchError {
    /// A bounded label for logs, metrics and `failure_detail`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::BinaryMissing(_) => "worker_binary_missing",
            Self::Spawn(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                "worker_binary_not_executable"
            }
            Self::Spawn(_) => "spawn_failed",
            Self::Workspace(_) => "workspace_unavailable",
            Self::InvalidRef => "invalid_worker_ref",
            Self::Signal(_) => "signal_failed",
            Self::UnknownProfile(_) => "unknown_profile",
            Self::Kube(kube::Error::Api(status)) => match status.code {
                401 | 403 => "kube_forbidden",
                400 | 404 | 409 | 422 => "job_rejected",
                _ => "kube_unavailable",
            },
            Self::Kube(kube::Error::InferConfig(_)) => "kube_config",
            Self::Kube(_) => "kube_unavailable",
            Self::JobExists => "job_exists",
            Self::Unconfinable(_) => "confinement_unavailable",
            Self::Egress(e) => e.metric_label(),
        }
    }
}

/// Starts and stops workers. Implementations must make `stop` idempotent (stopping a
/// worker that is gone succeeds) and must never outlive a stopped worker's processes.
pub trait Launcher: Send + Sync {
    /// Starts the worker of `spec.session` and returns its reference (`local:<pid>`,
    /// `k8s:<job name>`), recorded as `worker_ref`. Launching a session again replaces
    /// any worker this launcher still runs for it.
    fn launch(&self, spec: LaunchSpec) -> BoxFuture<'_, Result<String, LaunchError>>;

    /// Stops the worker: a polite signal first, then a forced one after a grace period.
    fn stop<'a>(&'a self, worker_ref: &'a str) -> BoxFuture<'a, Result<(), LaunchError>>;

    /// Whether the worker behind `worker_ref` still runs (used at start to reconcile rows
    /// left by a previous process, O3). A running worker is tracked from then on.
    fn is_running<'a>(
        &'a self,
        session: SessionId,
        worker_ref: &'a str,
    ) -> BoxFuture<'a, Result<bool, LaunchError>>;

    /// The workers this launcher runs (the reaper compares them with the session rows).
    fn running(&self) -> BoxFuture<'_, Result<Vec<RunningWorker>, LaunchError>>;

    /// On shutdown: whether this launcher's workers die with the manager (local children)
    /// or live on (Kubernetes Jobs).
    fn workers_die_with_manager(&self) -> bool;

    /// The launcher's own series, registered with the manager's metrics (the local
    /// launcher's egress proxies count their requests).
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        Vec::new()
    }

    /// Watches the workers until `shutdown` and sends every failure it observes (R4). The
    /// local launcher observes none: a child that dies is noticed by the brain.
    fn watch(
        &self,
        failures: mpsc::Sender<WorkerFailure>,
        shutdown: CancellationToken,
    ) -> BoxFuture<'_, ()> {
        let _ = failures;
        Box::pin(async move { shutdown.cancelled().await })
    }
}
