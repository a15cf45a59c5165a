//! The Kubernetes launcher: one `batch/v1` Job per session in the workers namespace
//! (SPEC R1, R2, R4).
//!
//! - `job.rs`: the Job of a session (and `render-job`'s sample).
//! - `pods.rs`: the pod watcher: failure details (image pull, OOM kill, unschedulable)
//!   and the force-deletion of a pod stuck starting.
//!
//! The calls it makes, all in `RUNTIME_MANAGER_NAMESPACE` (what its Role must allow):
//!
//! | call | verb |
//! |---|---|
//! | launch: `POST /apis/batch/v1/namespaces/{ns}/jobs` (a leftover of the same name is deleted first) | jobs: create, delete |
//! | stop: `DELETE …/jobs/{name}` with `propagationPolicy: Background` | jobs: delete |
//! | start-up reconciliation: `GET …/jobs/{name}` | jobs: get |
//! | reaper: `GET …/jobs?labelSelector=app.kubernetes.io/managed-by=agent-runtime` | jobs: list |
//! | watcher: `GET /api/v1/namespaces/{ns}/pods?labelSelector=…` then `?watch=true` | pods: list, watch |
//! | stuck pod: `DELETE …/pods/{name}` with `gracePeriodSeconds: 0` | pods: delete |
//!
//! A worker reference is `k8s:<job name>`. Jobs outlive the manager: on restart, the rows
//! are reconciled against them (O3), and the pod watcher reports pods that failed meanwhile.

use std::time::Duration;

use backon::{ConstantBuilder, Retryable};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use protocol::SessionId;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use egress_proxy::SessionKey;

use super::{LaunchError, LaunchSpec, Launcher, RunningWorker, WorkerFailure};
use crate::Config;
use crate::config::EgressProxyRoute;
use crate::profiles::Profiles;

pub mod job;
pub mod pods;

/// A Job being deleted keeps its name for a moment: a launch that found its name taken
/// tries again 250 ms apart, 20 attempts in all.
const CREATE_RETRIES: ConstantBuilder = ConstantBuilder::new()
    .with_delay(Duration::from_millis(250))
    .with_max_times(19);

/// What the launcher needs besides a client.
#[derive(Clone, Debug)]
pub struct KubernetesSettings {
    pub namespace: String,
    pub profiles: Profiles,
    pub start_timeout: Duration,
    /// The shared egress proxy and the key of the workers' credentials for it.
    pub egress_proxy: Option<(EgressProxyRoute, SessionKey)>,
}

impl KubernetesSettings {
    pub fn from_config(config: &Config) -> Self {
        Self {
            namespace: config.kubernetes.namespace.clone(),
            profiles: config.profiles.clone(),
            start_timeout: config.kubernetes.start_timeout,
            egress_proxy: config
                .kubernetes
                .egress_proxy
                .clone()
                .zip(config.egress.session_key()),
        }
    }

    /// `WORKER_EGRESS_PROXY` of a session of `profile`: the proxy's URL with the session's
    /// own credential (never the key it is derived from); `None` when the profile's workers
    /// go without.
    pub fn egress_proxy_url(&self, session: SessionId, profile: &str) -> Option<String> {
        let (route, key) = self.egress_proxy.as_ref()?;
        route
            .profiles
            .iter()
            .any(|p| p == profile)
            .then(|| key.proxy_url(&session.0.to_string(), &route.address))
    }
}

pub struct KubernetesLauncher {
    jobs: Api<Job>,
    pods: Api<Pod>,
    settings: KubernetesSettings,
    /// The manager's telemetry settings, passed to every worker (`super::telemetry_env`).
    telemetry_env: Vec<(String, String)>,
}

/// `k8s:<job name>`.
pub fn worker_ref(job_name: &str) -> String {
    format!("k8s:{job_name}")
}

fn parse_ref(worker_ref: &str) -> Result<&str, LaunchError> {
    worker_ref
        .strip_prefix("k8s:")
        .filter(|name| {
            !name.is_empty()
                && name.len() <= 63
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        .ok_or(LaunchError::InvalidRef)
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 404)
}

/// Whether a Job still runs (or is about to): not finished, not being deleted.
fn is_active(job: &Job) -> bool {
    if job.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let finished = job
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True");
    !finished
}

fn session_of(job: &Job) -> Option<SessionId> {
    job.metadata
        .labels
        .as_ref()?
        .get(job::SESSION_LABEL)?
        .parse()
        .ok()
}

impl KubernetesLauncher {
    /// A launcher over `client` (in a cluster: `kube::Client::try_default()`; in tests, a
    /// client of a fake API server).
    pub fn new(client: kube::Client, settings: KubernetesSettings) -> Self {
        Self {
            jobs: Api::namespaced(client.clone(), &settings.namespace),
            pods: Api::namespaced(client, &settings.namespace),
            settings,
            telemetry_env: super::telemetry_env(),
        }
    }

    async fn launch_inner(&self, spec: LaunchSpec) -> Result<String, LaunchError> {
        let profile = self
            .settings
            .profiles
            .get(&spec.profile)
            .ok_or_else(|| LaunchError::UnknownProfile(spec.profile.clone()))?;
        let name = job::job_name(spec.session);
        let egress_proxy = self.settings.egress_proxy_url(spec.session, &spec.profile);
        let job = job::build(&job::JobParams {
            namespace: &self.settings.namespace,
            session: spec.session,
            team: spec.team,
            agent: spec.agent,
            profile_name: &spec.profile,
            profile,
            token: &spec.token,
            brain_public_url: &spec.brain_public_url,
            telemetry_env: &self.telemetry_env,
            restore: spec.restore,
            egress_proxy: egress_proxy.as_deref(),
        });
        let create = || async {
            match self.jobs.create(&PostParams::default(), &job).await {
                Ok(_) => Ok(()),
                // A Job left by a launch whose recording failed (a retried provision):
                // replaced, never duplicated, like the local launcher's worker.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    self.delete_job(&name).await?;
                    Err(LaunchError::JobExists)
                }
                Err(e) => Err(e.into()),
            }
        };
        let mut replacing = false;
        create
            .retry(CREATE_RETRIES)
            .sleep(tokio::time::sleep)
            .when(|e| matches!(e, LaunchError::JobExists))
            .notify(|_, _| {
                if !std::mem::replace(&mut replacing, true) {
                    tracing::info!(session = %spec.session.0, job = %name, "replacing a previous worker Job");
                }
            })
            .await?;
        tracing::info!(session = %spec.session.0, job = %name, profile = %spec.profile, "worker Job created");
        Ok(worker_ref(&name))
    }

    async fn delete_job(&self, name: &str) -> Result<(), LaunchError> {
        match self.jobs.delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Launcher for KubernetesLauncher {
    fn launch(&self, spec: LaunchSpec) -> BoxFuture<'_, Result<String, LaunchError>> {
        self.launch_inner(spec).boxed()
    }

    /// Deletes the Job; the garbage collector then deletes its pod (SIGTERM, then SIGKILL
    /// after the pod's grace period).
    fn stop<'a>(&'a self, worker_ref: &'a str) -> BoxFuture<'a, Result<(), LaunchError>> {
        async move {
            let name = parse_ref(worker_ref)?;
            self.delete_job(name).await?;
            tracing::info!(job = %name, "worker Job deleted");
            Ok(())
        }
        .boxed()
    }

    fn is_running<'a>(
        &'a self,
        session: SessionId,
        worker_ref: &'a str,
    ) -> BoxFuture<'a, Result<bool, LaunchError>> {
        async move {
            let name = parse_ref(worker_ref)?;
            let Some(job) = self.jobs.get_opt(name).await? else {
                return Ok(false);
            };
            Ok(is_active(&job) && session_of(&job) == Some(session))
        }
        .boxed()
    }

    /// The session Jobs that still run. Served from the API server's watch cache
    /// (`resourceVersion=0`): a Job a moment stale only delays the reaper by one pass.
    fn running(&self) -> BoxFuture<'_, Result<Vec<RunningWorker>, LaunchError>> {
        async move {
            let params = ListParams::default()
                .labels(job::MANAGED_SELECTOR)
                .match_any();
            let jobs = self.jobs.list(&params).await?;
            Ok(jobs
                .items
                .iter()
                .filter(|job| is_active(job))
                .filter_map(|job| {
                    Some(RunningWorker {
                        session: session_of(job)?,
                        worker_ref: worker_ref(job.metadata.name.as_deref()?),
                    })
                })
                .collect())
        }
        .boxed()
    }

    fn workers_die_with_manager(&self) -> bool {
        false
    }

    fn watch(
        &self,
        failures: mpsc::Sender<WorkerFailure>,
        shutdown: CancellationToken,
    ) -> BoxFuture<'_, ()> {
        pods::watch(
            self.pods.clone(),
            self.settings.start_timeout,
            failures,
            shutdown,
        )
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn worker_refs_parse_strictly() {
        assert_eq!(parse_ref("k8s:worker-abc").unwrap(), "worker-abc");
        for bad in ["k8s:", "local:12", "worker-abc", "k8s:Worker", "k8s:a/b"] {
            assert!(parse_ref(bad).is_err(), "{bad}");
        }
    }
}
