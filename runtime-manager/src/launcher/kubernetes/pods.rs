//! The pod watcher (SPEC R4): reads every worker pod's status and reports what keeps a
//! worker from serving as a [`WorkerFailure`]; force-deletes a pod stuck starting.
//!
//! | seen on the pod | detail | when |
//! |---|---|---|
//! | a container waiting in `ErrImagePull`, `ImagePullBackOff`, `InvalidImageName`, `ErrImageNeverPull` | `image_pull` | at once |
//! | a container waiting in `CreateContainerConfigError`, `CreateContainerError`, `RunContainerError` (a root image under `runAsNonRoot`, say) | `container_config` | at once |
//! | a container terminated (now or last) with reason `OOMKilled` | `oom_killed` | at once |
//! | still `Pending` after the start timeout, `PodScheduled=False` with reason `Unschedulable` | `unschedulable` | at the timeout; the pod is force-deleted |
//! | still `Pending` after the start timeout, otherwise | `start_timeout` (or `image_pull` if that is why) | at the timeout; the pod is force-deleted |
//!
//! An unschedulable pod is not failed at once: a cluster autoscaler adding a node to the
//! workers nodepool reports the pod `Unschedulable` until the node is up. The start
//! timeout bounds that wait.
//!
//! Every replica watches and reports; the manager's compare-and-set makes the second
//! report a no-op. A pod's age is its `creationTimestamp` (the API server's clock), so a
//! restarted manager does not wait a whole timeout again.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, DeleteParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use protocol::SessionId;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::job::{MANAGED_SELECTOR, SESSION_LABEL};
use super::worker_ref;
use crate::launcher::WorkerFailure;

pub const IMAGE_PULL: &str = "image_pull";
pub const CONTAINER_CONFIG: &str = "container_config";
pub const OOM_KILLED: &str = "oom_killed";
pub const UNSCHEDULABLE: &str = "unschedulable";
pub const START_TIMEOUT: &str = "start_timeout";

const IMAGE_PULL_REASONS: [&str; 5] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "RegistryUnavailable",
];
const CONTAINER_CONFIG_REASONS: [&str; 3] = [
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

fn statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    pod.status
        .iter()
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .chain(&s.container_statuses)
        })
        .flatten()
}

fn waiting_reason(pod: &Pod, reasons: &[&str]) -> bool {
    statuses(pod).any(|c| {
        c.state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.as_deref())
            .is_some_and(|r| reasons.contains(&r))
    })
}

/// What fails the pod's session as soon as it is seen, if anything.
pub fn failure(pod: &Pod) -> Option<&'static str> {
    if statuses(pod).any(|c| {
        [c.state.as_ref(), c.last_state.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|s| s.terminated.as_ref())
            .any(|t| t.reason.as_deref() == Some("OOMKilled"))
    }) {
        return Some(OOM_KILLED);
    }
    if waiting_reason(pod, &IMAGE_PULL_REASONS) {
        return Some(IMAGE_PULL);
    }
    if waiting_reason(pod, &CONTAINER_CONFIG_REASONS) {
        return Some(CONTAINER_CONFIG);
    }
    None
}

/// Whether the pod has not started yet (and is not being deleted).
pub fn is_starting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            None | Some("Pending")
        )
}

/// Why a pod that never started did not: the detail of its force-deletion.
pub fn stuck_detail(pod: &Pod) -> &'static str {
    let unschedulable = pod
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        });
    if unschedulable {
        UNSCHEDULABLE
    } else {
        failure(pod).unwrap_or(START_TIMEOUT)
    }
}

/// How long ago the API server created the pod; `None` without a timestamp.
pub fn age(pod: &Pod, now: SystemTime) -> Option<Duration> {
    let created_ms = pod.metadata.creation_timestamp.as_ref()?.0.as_millisecond();
    let now_ms = now.duration_since(UNIX_EPOCH).ok()?.as_millis() as i64;
    Some(Duration::from_millis(
        now_ms.saturating_sub(created_ms).max(0) as u64,
    ))
}

/// The session and worker reference of a worker pod: its session label and the Job that
/// owns it. `None` for pods that are not a session's (say, a warm-pool worker).
pub fn owner(pod: &Pod) -> Option<(SessionId, String)> {
    let session = pod
        .metadata
        .labels
        .as_ref()?
        .get(SESSION_LABEL)?
        .parse::<SessionId>()
        .ok()?;
    let job = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Job")
        .map(|o| o.name.clone())
        .or_else(|| {
            let labels = pod.metadata.labels.as_ref()?;
            labels
                .get("batch.kubernetes.io/job-name")
                .or_else(|| labels.get("job-name"))
                .cloned()
        })?;
    Some((session, worker_ref(&job)))
}

/// Runs the watcher until `shutdown`: a reflector over the worker pods, a report for every
/// pod that fails, and a sweep for pods stuck starting every `sweep` interval.
pub async fn watch(
    pods: Api<Pod>,
    start_timeout: Duration,
    failures: mpsc::Sender<WorkerFailure>,
    shutdown: CancellationToken,
) {
    let (store, writer) = reflector::store::<Pod>();
    let config = watcher::Config::default().labels(MANAGED_SELECTOR);
    let events = reflector(writer, watcher(pods.clone(), config).default_backoff());
    let mut events = std::pin::pin!(events);
    let sweep_every = (start_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let mut sweep = tokio::time::interval(sweep_every);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // (pod uid, detail) already reported, and pods already force-deleted: each is reported
    // once per process (a report is idempotent anyway; this only saves API calls).
    let mut reported: HashSet<(String, &'static str)> = HashSet::new();
    let mut forced: HashSet<String> = HashSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            event = events.next() => match event {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watching worker pods failed; retrying");
                }
                Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => {
                    let (Some(detail), Some((session, worker_ref)), Some(uid)) =
                        (failure(&pod), owner(&pod), pod.metadata.uid.clone())
                    else {
                        continue;
                    };
                    if !reported.insert((uid, detail)) {
                        continue;
                    }
                    tracing::info!(session = %session.0, detail, "worker pod failed");
                    let failure = WorkerFailure { session, worker_ref, detail };
                    if failures.send(failure).await.is_err() {
                        return;
                    }
                }
                Some(Ok(watcher::Event::Delete(pod))) => {
                    if let Some(uid) = &pod.metadata.uid {
                        reported.retain(|(u, _)| u != uid);
                        forced.remove(uid);
                    }
                }
                Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
            },
            _ = sweep.tick() => {
                let now = SystemTime::now();
                for pod in store.state() {
                    let stuck = is_starting(&pod)
                        && age(&pod, now).is_some_and(|age| age >= start_timeout);
                    let Some(uid) = pod.metadata.uid.clone() else { continue };
                    if !stuck || forced.contains(&uid) {
                        continue;
                    }
                    let Some(name) = pod.metadata.name.clone() else { continue };
                    let detail = stuck_detail(&pod);
                    let force = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
                    match pods.delete(&name, &force).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(status)) if status.code == 404 => {}
                        Err(e) => {
                            tracing::warn!(pod = %name, error = %e, "force-deleting a stuck worker pod failed");
                            continue;
                        }
                    }
                    forced.insert(uid);
                    let Some((session, worker_ref)) = owner(&pod) else { continue };
                    tracing::info!(session = %session.0, detail, "worker pod stuck starting; force-deleted");
                    if failures.send(WorkerFailure { session, worker_ref, detail }).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn waiting(reason: &str) -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Pending", "containerStatuses": [{
                "name": "worker", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": reason}}
            }]}
        }))
    }

    #[test]
    fn pod_statuses_map_to_failure_details() {
        assert_eq!(failure(&waiting("ErrImagePull")), Some(IMAGE_PULL));
        assert_eq!(failure(&waiting("ImagePullBackOff")), Some(IMAGE_PULL));
        assert_eq!(
            failure(&waiting("CreateContainerConfigError")),
            Some(CONTAINER_CONFIG)
        );
        assert_eq!(failure(&waiting("ContainerCreating")), None);
        assert_eq!(stuck_detail(&waiting("ContainerCreating")), START_TIMEOUT);
        assert_eq!(stuck_detail(&waiting("ImagePullBackOff")), IMAGE_PULL);
        let oom = pod(serde_json::json!({
            "status": {"phase": "Failed", "containerStatuses": [{
                "name": "worker", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
            }]}
        }));
        assert_eq!(failure(&oom), Some(OOM_KILLED));
        assert!(!is_starting(&oom));
        let unschedulable = pod(serde_json::json!({
            "status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable"
            }]}
        }));
        assert!(is_starting(&unschedulable));
        assert_eq!(failure(&unschedulable), None);
        assert_eq!(stuck_detail(&unschedulable), UNSCHEDULABLE);
    }

    #[test]
    fn a_pod_belongs_to_its_session_and_job() {
        let session = SessionId::new();
        let p = pod(serde_json::json!({
            "metadata": {
                "name": "worker-x-abcde",
                "labels": {SESSION_LABEL: session.0.to_string()},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "worker-x", "uid": "u"}],
                "creationTimestamp": "2020-01-01T00:00:00Z"
            }
        }));
        assert_eq!(owner(&p), Some((session, "k8s:worker-x".to_owned())));
        assert!(age(&p, SystemTime::now()).unwrap() > Duration::from_secs(3600));
        assert_eq!(owner(&waiting("x")), None);
    }
}
