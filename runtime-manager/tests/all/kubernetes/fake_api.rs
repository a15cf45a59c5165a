//! A fake Kubernetes API server on 127.0.0.1:0 that speaks the REST calls the Kubernetes
//! launcher makes, so the real kube client (HTTP, JSON, watch streaming) is exercised
//! without a cluster (in the spirit of kube-rs/controller-rs's `fixtures.rs`, over real
//! HTTP instead of a mock service):
//!
//! | call | what the fake does |
//! |---|---|
//! | `POST /apis/batch/v1/namespaces/{ns}/jobs` | stores the Job (409 `AlreadyExists` if the name is taken) and, like the Job controller, creates its pod `Pending` |
//! | `GET …/jobs/{name}`, `GET …/jobs?labelSelector=` | the Job, or the matching Jobs |
//! | `DELETE …/jobs/{name}` | removes the Job; with `propagationPolicy` Background or Foreground also its pods, like the garbage collector |
//! | `GET /api/v1/namespaces/{ns}/pods?labelSelector=` | a `PodList` with the current `resourceVersion` |
//! | `GET …/pods?watch=true&resourceVersion=N` | newline-delimited `{"type","object"}` events after N, streamed as they happen |
//! | `DELETE …/pods/{name}` | removes the pod (a `DELETED` event) |
//!
//! A test plays the kubelet with [`FakeApi::set_pod_status`] (the fixtures in
//! [`status`]), slows Job creates down with [`FakeApi::delay_job_creates`] (a busy API
//! server), and reads every request the launcher made with [`FakeApi::requests`].
//! Anything else is answered 404 and kept in [`FakeApi::unexpected`].

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// One request the launcher made.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    pub query: HashMap<String, String>,
    pub body: Option<Value>,
}

#[derive(Default)]
struct Inner {
    resource_version: u64,
    jobs: BTreeMap<(String, String), Value>,
    pods: BTreeMap<(String, String), Value>,
    /// Every pod event, for watches that start from an older resourceVersion.
    history: Vec<(u64, Value)>,
    requests: Vec<Recorded>,
    unexpected: Vec<Recorded>,
    /// How long a Job create takes before it is answered (recorded at once).
    create_delay: Duration,
}

impl Inner {
    fn bump(&mut self, object: &mut Value) -> u64 {
        self.resource_version += 1;
        object["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        self.resource_version
    }

    fn pod_event(&mut self, kind: &str, pod: Value, tx: &broadcast::Sender<(u64, Value)>) {
        let rv = self.resource_version;
        let event = json!({"type": kind, "object": pod});
        self.history.push((rv, event.clone()));
        let _ = tx.send((rv, event));
    }
}

#[derive(Clone)]
struct Shared {
    inner: Arc<Mutex<Inner>>,
    events: broadcast::Sender<(u64, Value)>,
}

pub struct FakeApi {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    shared: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// `now` in the API server's format (RFC 3339, whole seconds).
pub fn timestamp(ago: Duration) -> String {
    let now = Timestamp::now().as_second() - ago.as_secs() as i64;
    Timestamp::from_second(now).unwrap().to_string()
}

fn api_status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    (
        StatusCode::from_u16(code).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn json_response(code: StatusCode, value: &Value) -> Response {
    (
        code,
        [("content-type", "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// Equality selectors (`a=b,c==d`) and existence (`a`), what the launcher sends.
fn matches(selector: Option<&String>, object: &Value) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = &object["metadata"]["labels"];
    selector.split(',').all(
        |term| match term.split_once("==").or_else(|| term.split_once('=')) {
            Some((k, v)) => labels[k.trim()] == json!(v.trim()),
            None => !labels[term.trim()].is_null(),
        },
    )
}

impl FakeApi {
    pub async fn start() -> Self {
        let (events, _) = broadcast::channel(1024);
        let shared = Shared {
            inner: Arc::default(),
            events,
        };
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            url,
            shared,
            server,
        }
    }

    /// A kube client of this server (plain HTTP, no credentials).
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap()
    }

    /// Answers every later Job create only after `delay`.
    pub fn delay_job_creates(&self, delay: Duration) {
        self.inner().create_delay = delay;
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner().requests.clone()
    }

    /// The requests with `method` on `path` (no query).
    pub fn requests_to(&self, method: Method, path: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == method && r.path == path)
            .collect()
    }

    /// Requests no route served.
    pub fn unexpected(&self) -> Vec<Recorded> {
        self.inner().unexpected.clone()
    }

    pub fn job(&self, ns: &str, name: &str) -> Option<Value> {
        self.inner()
            .jobs
            .get(&(ns.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The pod of a Job (the one the fake's Job controller created).
    pub fn pod_of(&self, ns: &str, job: &str) -> Option<Value> {
        self.inner()
            .pods
            .iter()
            .find(|((pod_ns, _), pod)| {
                pod_ns == ns && pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] == job
            })
            .map(|(_, pod)| pod.clone())
    }

    /// Stores a Job as if created earlier (say, by a manager that crashed before recording
    /// it), without a request.
    pub fn insert_job(&self, ns: &str, mut job: Value) {
        let name = job["metadata"]["name"].as_str().unwrap().to_owned();
        let mut inner = self.inner();
        inner.bump(&mut job);
        job["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
        job["metadata"]["namespace"] = json!(ns);
        inner.jobs.insert((ns.to_owned(), name), job);
    }

    /// Removes a Job and its pods without a request (the TTL controller, or an operator).
    pub fn remove_job(&self, ns: &str, name: &str) {
        let mut inner = self.inner();
        inner.jobs.remove(&(ns.to_owned(), name.to_owned()));
        delete_pods_of(&mut inner, ns, name, &self.shared.events);
    }

    /// Plays the kubelet: replaces the status of `job`'s pod (a `MODIFIED` event).
    pub fn set_pod_status(&self, ns: &str, job: &str, status: Value) {
        self.update_pod(ns, job, |pod| pod["status"] = status);
    }

    /// Changes `job`'s pod with `change` (a `MODIFIED` event).
    pub fn update_pod(&self, ns: &str, job: &str, change: impl FnOnce(&mut Value)) {
        let mut inner = self.inner();
        let key = inner
            .pods
            .iter()
            .find(|((pod_ns, _), pod)| {
                pod_ns == ns && pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] == job
            })
            .map(|(key, _)| key.clone())
            .unwrap_or_else(|| panic!("no pod of Job {job}"));
        let mut pod = inner.pods[&key].clone();
        change(&mut pod);
        inner.bump(&mut pod);
        inner.pods.insert(key, pod.clone());
        inner.pod_event("MODIFIED", pod, &self.shared.events);
    }

    /// Waits until `check` holds for the recorded requests.
    pub async fn wait_for(
        &self,
        what: &str,
        within: Duration,
        check: impl Fn(&[Recorded]) -> bool,
    ) {
        let deadline = Instant::now() + within;
        loop {
            if check(&self.requests()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "waited {within:?} for {what}; requests: {:#?}",
                self.requests()
                    .iter()
                    .map(|r| format!("{} {} {:?}", r.method, r.path, r.query))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn delete_pods_of(
    inner: &mut Inner,
    ns: &str,
    job: &str,
    events: &broadcast::Sender<(u64, Value)>,
) {
    let keys: Vec<_> = inner
        .pods
        .iter()
        .filter(|((pod_ns, _), pod)| {
            pod_ns == ns && pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] == job
        })
        .map(|(key, _)| key.clone())
        .collect();
    for key in keys {
        if let Some(mut pod) = inner.pods.remove(&key) {
            inner.bump(&mut pod);
            inner.pod_event("DELETED", pod, events);
        }
    }
}

/// The pod the Job controller creates for a new Job: the template, `Pending`.
fn pod_for(job: &Value, ns: &str) -> Value {
    let name = job["metadata"]["name"].as_str().unwrap();
    let uid = job["metadata"]["uid"].as_str().unwrap();
    let mut labels = job["spec"]["template"]["metadata"]["labels"].clone();
    labels["batch.kubernetes.io/job-name"] = json!(name);
    labels["job-name"] = json!(name);
    labels["batch.kubernetes.io/controller-uid"] = json!(uid);
    let suffix: String = uuid::Uuid::new_v4().simple().to_string()[..5].to_owned();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{name}-{suffix}"),
            "namespace": ns,
            "uid": uuid::Uuid::new_v4().to_string(),
            "labels": labels,
            "creationTimestamp": timestamp(Duration::ZERO),
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": job["spec"]["template"]["spec"],
        "status": status::pending(),
    })
}

async fn handle(
    State(shared): State<Shared>,
    method: Method,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let recorded = Recorded {
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        body: serde_json::from_slice(&body).ok(),
    };
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let creates_job = method == Method::POST
        && matches!(
            segments.as_slice(),
            ["apis", "batch", "v1", "namespaces", _, "jobs"]
        );
    let delay = {
        let mut inner = shared.inner.lock().unwrap();
        inner.requests.push(recorded.clone());
        if creates_job {
            inner.create_delay
        } else {
            Duration::ZERO
        }
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut inner = shared.inner.lock().unwrap();
    let selector = query.get("labelSelector");
    match (method.clone(), segments.as_slice()) {
        (Method::POST, ["apis", "batch", "v1", "namespaces", ns, "jobs"]) => {
            let Some(mut job) = recorded.body.clone() else {
                return api_status(400, "BadRequest", "not JSON");
            };
            let Some(name) = job["metadata"]["name"].as_str().map(str::to_owned) else {
                return api_status(422, "Invalid", "metadata.name: Required value");
            };
            let key = ((*ns).to_owned(), name.clone());
            if inner.jobs.contains_key(&key) {
                return api_status(
                    409,
                    "AlreadyExists",
                    &format!("jobs.batch \"{name}\" already exists"),
                );
            }
            inner.bump(&mut job);
            job["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
            job["metadata"]["namespace"] = json!(ns);
            job["metadata"]["creationTimestamp"] = json!(timestamp(Duration::ZERO));
            job["status"] = json!({"active": 1});
            inner.jobs.insert(key, job.clone());
            let mut pod = pod_for(&job, ns);
            inner.bump(&mut pod);
            let pod_key = (
                (*ns).to_owned(),
                pod["metadata"]["name"].as_str().unwrap().to_owned(),
            );
            inner.pods.insert(pod_key, pod.clone());
            inner.pod_event("ADDED", pod, &shared.events);
            json_response(StatusCode::CREATED, &job)
        }
        (Method::GET, ["apis", "batch", "v1", "namespaces", ns, "jobs"]) => {
            let items: Vec<Value> = inner
                .jobs
                .iter()
                .filter(|((job_ns, _), job)| job_ns == ns && matches(selector, job))
                .map(|(_, job)| job.clone())
                .collect();
            let list = json!({
                "apiVersion": "batch/v1", "kind": "JobList",
                "metadata": {"resourceVersion": inner.resource_version.to_string()},
                "items": items,
            });
            json_response(StatusCode::OK, &list)
        }
        (Method::GET, ["apis", "batch", "v1", "namespaces", ns, "jobs", name]) => {
            match inner.jobs.get(&((*ns).to_owned(), (*name).to_owned())) {
                Some(job) => json_response(StatusCode::OK, job),
                None => api_status(404, "NotFound", &format!("jobs.batch \"{name}\" not found")),
            }
        }
        (Method::DELETE, ["apis", "batch", "v1", "namespaces", ns, "jobs", name]) => {
            let Some(mut job) = inner.jobs.remove(&((*ns).to_owned(), (*name).to_owned())) else {
                return api_status(404, "NotFound", &format!("jobs.batch \"{name}\" not found"));
            };
            let policy = recorded
                .body
                .as_ref()
                .and_then(|b| b["propagationPolicy"].as_str())
                .unwrap_or("Background");
            if policy != "Orphan" {
                delete_pods_of(&mut inner, ns, name, &shared.events);
            }
            job["metadata"]["deletionTimestamp"] = json!(timestamp(Duration::ZERO));
            json_response(StatusCode::OK, &job)
        }
        (Method::GET, ["api", "v1", "namespaces", ns, "pods"])
            if query.get("watch").map(String::as_str) == Some("true") =>
        {
            let from: u64 = query
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let ns = (*ns).to_owned();
            let selector = selector.cloned();
            let backlog: Vec<(u64, Value)> = inner
                .history
                .iter()
                .filter(|(rv, _)| *rv > from)
                .cloned()
                .collect();
            let receiver = shared.events.subscribe();
            drop(inner);
            let keep = move |rv: u64, event: &Value, last: u64| {
                rv > last
                    && event["object"]["metadata"]["namespace"] == json!(ns)
                    && matches(selector.as_ref(), &event["object"])
            };
            let stream = futures_util::stream::unfold(
                (backlog.into_iter(), receiver, from, keep),
                |(mut backlog, mut receiver, mut last, keep)| async move {
                    loop {
                        let (rv, event) = match backlog.next() {
                            Some(next) => next,
                            None => match receiver.recv().await {
                                Ok(next) => next,
                                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                                Err(broadcast::error::RecvError::Closed) => return None,
                            },
                        };
                        if keep(rv, &event, last) {
                            last = rv;
                            let line = Bytes::from(format!("{event}\n"));
                            return Some((
                                Ok::<_, std::convert::Infallible>(line),
                                (backlog, receiver, last, keep),
                            ));
                        }
                    }
                },
            );
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(Body::from_stream(stream))
                .unwrap()
        }
        (Method::GET, ["api", "v1", "namespaces", ns, "pods"]) => {
            let items: Vec<Value> = inner
                .pods
                .iter()
                .filter(|((pod_ns, _), pod)| pod_ns == ns && matches(selector, pod))
                .map(|(_, pod)| pod.clone())
                .collect();
            let list = json!({
                "apiVersion": "v1", "kind": "PodList",
                "metadata": {"resourceVersion": inner.resource_version.to_string()},
                "items": items,
            });
            json_response(StatusCode::OK, &list)
        }
        (Method::DELETE, ["api", "v1", "namespaces", ns, "pods", name]) => {
            let Some(mut pod) = inner.pods.remove(&((*ns).to_owned(), (*name).to_owned())) else {
                return api_status(404, "NotFound", &format!("pods \"{name}\" not found"));
            };
            inner.bump(&mut pod);
            inner.pod_event("DELETED", pod.clone(), &shared.events);
            json_response(StatusCode::OK, &pod)
        }
        _ => {
            inner.unexpected.push(recorded);
            api_status(404, "NotFound", "the fake API server does not serve this")
        }
    }
}

/// Pod statuses as the kubelet and the scheduler write them (the fixtures of the scenarios).
pub mod status {
    use serde_json::{Value, json};

    fn container(state: Value, ready: bool) -> Value {
        json!([{
            "name": "worker", "image": "agent-runtime/worker:dev", "imageID": "",
            "ready": ready, "restartCount": 0, "state": state
        }])
    }

    /// Scheduled, the container being created.
    pub fn pending() -> Value {
        json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": container(json!({"waiting": {"reason": "ContainerCreating"}}), false),
        })
    }

    /// The worker runs.
    pub fn running() -> Value {
        json!({
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": container(json!({"running": {"startedAt": super::timestamp(std::time::Duration::ZERO)}}), true),
        })
    }

    /// The image cannot be pulled (`ErrImagePull`, later `ImagePullBackOff`).
    pub fn image_pull_failed(reason: &str) -> Value {
        json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": container(json!({"waiting": {
                "reason": reason,
                "message": "failed to pull and unpack image \"registry.invalid/worker:nope\""
            }}), false),
        })
    }

    /// The worker was killed for exceeding its memory limit.
    pub fn oom_killed() -> Value {
        json!({
            "phase": "Failed",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
            "containerStatuses": container(json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}}), false),
        })
    }

    /// No node fits (or none of the workers nodepool is up yet).
    pub fn unschedulable() -> Value {
        json!({
            "phase": "Pending",
            "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
            }],
        })
    }
}
