//! Launchers: how a worker process comes to exist and stops existing.
//!
//! SPEC names two, behind one interface: Kubernetes (a Job per session, next issue) and the
//! local process launcher ([`local::LocalProcessLauncher`], the embedded default). The
//! manager holds an `Arc<dyn Launcher>` and never knows which one runs.
//!
//! **Architecture Invariant:** a launcher knows processes (or Jobs), never session states;
//! every state change is the manager's (`manager.rs`), recorded with compare-and-set SQL.

use std::path::PathBuf;

use futures_util::future::BoxFuture;
use protocol::{AgentId, ChatId, SessionId, TeamId};

pub mod local;

/// Everything a launcher needs to start one session's worker.
#[derive(Clone)]
pub struct LaunchSpec {
    pub session: SessionId,
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    /// The RuntimeProfile's name (`light`, `heavy`, `browser`, `warm`).
    pub profile: String,
    /// The session token the worker presents when it dials the brain (X2).
    pub token: String,
    /// Where the worker dials (`BRAIN_PUBLIC_URL`).
    pub brain_public_url: String,
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
        }
    }
}

/// Starts and stops workers. Implementations must make `stop` idempotent (stopping a
/// worker that is gone succeeds) and must never outlive a stopped worker's processes.
pub trait Launcher: Send + Sync {
    /// Starts the worker of `spec.session` and returns its reference (`local:<pid>`,
    /// later `k8s:<job>`), recorded as `worker_ref`. Launching a session again replaces
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
}
