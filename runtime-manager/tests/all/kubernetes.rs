//! The Kubernetes launcher, scenario by scenario, against a fake API server speaking the
//! real REST calls over HTTP (`kubernetes/fake_api.rs`), with the whole manager running over
//! real Postgres and Redis (SPEC R1, R2, R4, W2, W7, O3):
//!
//! - created: the Job posted carries exactly the lockdown of R2 and the profile's settings;
//! - a leftover Job of the same session is replaced;
//! - running: a running worker is left alone, and adopted again by a restarted manager;
//!   a Job that vanished while no manager ran fails its session;
//! - image pull failure, OOM kill: the session fails with the detail, the Job is deleted;
//! - deleted: an idle session's Job is deleted with background propagation;
//! - stuck starting: a pod pending past the start timeout is force-deleted
//!   (`start_timeout`, or `unschedulable`);
//! - drain: stopped (SIGTERM) during a slow Job create, the manager finishes that
//!   provision, claims nothing more, and removes its lease.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake_api;

use std::time::{Duration, Instant};

use crate::common::{BRAIN_URL, Harness};
use axum::http::Method;
use channel::token::TokenKeys;
use fake_api::{FakeApi, Recorded, status};
use protocol::SessionId;
use serde_json::json;

const NS: &str = "agent-workers";
const JOBS: &str = "/apis/batch/v1/namespaces/agent-workers/jobs";
const PODS: &str = "/api/v1/namespaces/agent-workers/pods";
/// How long a wait may take on a loaded machine (two cores shared with other builds).
const WAIT: Duration = Duration::from_secs(15);

fn job_name(session: SessionId) -> String {
    format!("worker-{}", session.0)
}

fn job_path(session: SessionId) -> String {
    format!("{JOBS}/{}", job_name(session))
}

/// The manager over the fake API server; the watcher has listed the pods and is watching.
async fn start(env: &[(&str, &str)]) -> (Harness, FakeApi) {
    let fake = FakeApi::start().await;
    let mut h = Harness::new().await;
    h.start_kubernetes(fake.client(), env);
    fake.wait_for("the pod watcher to watch", WAIT, |requests| {
        requests
            .iter()
            .any(|r| r.path == PODS && r.query.get("watch").map(String::as_str) == Some("true"))
    })
    .await;
    (h, fake)
}

async fn finish(h: Harness, fake: FakeApi) {
    h.finish().await;
    assert_eq!(
        fake.unexpected()
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect::<Vec<_>>(),
        Vec::<String>::new(),
        "requests the fake does not serve"
    );
}

fn deletes_of(fake: &FakeApi, session: SessionId) -> Vec<Recorded> {
    fake.requests_to(Method::DELETE, &job_path(session))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_the_job_is_locked_down_and_follows_its_profile() {
    let (h, fake) = start(&[]).await;
    let session = h.provision("light").await;
    let row = h.wait_state(session, "connecting", WAIT).await;
    assert_eq!(row.worker_ref, Some(format!("k8s:{}", job_name(session))));

    let posts = fake.requests_to(Method::POST, JOBS);
    assert_eq!(posts.len(), 1, "one Job per session");
    let job = posts[0].body.clone().expect("a JSON Job");
    assert_eq!(job["apiVersion"], "batch/v1");
    assert_eq!(job["kind"], "Job");
    let labels = json!({
        "app.kubernetes.io/managed-by": "agent-runtime",
        "app.kubernetes.io/component": "worker",
        "agent-runtime/team": h.team.0.to_string(),
        "agent-runtime/agent": h.agent.0.to_string(),
        "agent-runtime/session": session.0.to_string(),
        "agent-runtime/profile": "light",
    });
    assert_eq!(
        job["metadata"],
        json!({"name": job_name(session), "namespace": NS, "labels": labels})
    );
    let spec = &job["spec"];
    assert_eq!(spec["backoffLimit"], 0);
    assert_eq!(spec["ttlSecondsAfterFinished"], 300);
    assert_eq!(spec["activeDeadlineSeconds"], 3600);
    assert_eq!(spec["template"]["metadata"], json!({"labels": labels}));
    assert!(spec.get("selector").is_none() && spec.get("manualSelector").is_none());

    let pod = &spec["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["enableServiceLinks"], false);
    assert_eq!(pod["terminationGracePeriodSeconds"], 10);
    // pid 1 is the pod's pause process, which reaps orphans: no init in the container
    // holds the worker's environment, token included, where its commands read /proc/1.
    assert_eq!(pod["shareProcessNamespace"], true);
    assert_eq!(
        pod["securityContext"],
        json!({
            "runAsNonRoot": true,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        })
    );
    for absent in [
        "nodeSelector",
        "tolerations",
        "serviceAccountName",
        "hostNetwork",
        "hostPID",
        "hostIPC",
    ] {
        assert!(pod.get(absent).is_none(), "{absent} on a light pod");
    }
    assert_eq!(
        pod["volumes"],
        json!([
            {"name": "workspace", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        ])
    );
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(c["name"], "worker");
    assert_eq!(c["image"], "agent-runtime/worker:dev");
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert_eq!(c["workingDir"], "/workspace");
    assert_eq!(
        c["securityContext"],
        json!({
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
        })
    );
    assert_eq!(
        c["resources"],
        json!({
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"cpu": "1", "memory": "1Gi"},
        })
    );
    assert_eq!(
        c["volumeMounts"],
        json!([
            {"name": "workspace", "mountPath": "/workspace"},
            {"name": "tmp", "mountPath": "/tmp"},
        ])
    );
    // The env: the brain's URL, the session, its short-lived token, the workspace; nothing
    // else (no database, Redis or signing key), and no envFrom.
    assert!(c.get("envFrom").is_none());
    let env: Vec<(String, String)> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert!(e.get("valueFrom").is_none(), "{e}");
            (
                e["name"].as_str().unwrap().to_owned(),
                e["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "BRAIN_PUBLIC_URL",
            "WORKER_SESSION_ID",
            "WORKER_SESSION_TOKEN",
            "WORKER_WORKSPACE",
            "WORKER_PROFILE",
            "WORKER_RESTORE"
        ]
    );
    assert_eq!(env[0].1, BRAIN_URL);
    assert_eq!(env[1].1, session.0.to_string());
    assert_eq!(env[3].1, "/workspace");
    let claims = TokenKeys::new(test_support::SESSION_TOKEN_KEY.as_bytes())
        .unwrap()
        .verify(&env[2].1)
        .expect("a session token the brain accepts");
    assert_eq!(claims.sub, session);
    assert_eq!(claims.team, h.team);
    assert!(claims.exp - claims.iat <= 600, "short-lived");

    // heavy: the workers nodepool, high limits, a longer deadline.
    let heavy = h.provision("heavy").await;
    h.wait_state(heavy, "connecting", WAIT).await;
    let job = fake.job(NS, &job_name(heavy)).expect("the heavy Job");
    assert_eq!(job["spec"]["activeDeadlineSeconds"], 7200);
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(
        pod["nodeSelector"],
        json!({"agent-runtime/pool": "workers"})
    );
    assert_eq!(
        pod["tolerations"],
        json!([{"key": "agent-runtime/pool", "operator": "Equal", "value": "workers", "effect": "NoSchedule"}])
    );
    assert_eq!(
        pod["containers"][0]["resources"]["limits"],
        json!({"cpu": "4", "memory": "8Gi"})
    );
    assert_eq!(
        pod["containers"][0]["securityContext"]["capabilities"],
        json!({"drop": ["ALL"]})
    );

    // The reaper lists the managed Jobs by label (from the watch cache); the watcher lists
    // and watches the managed pods by label.
    fake.wait_for("the reaper's Job list", WAIT, |requests| {
        requests.iter().any(|r| {
            r.method == Method::GET
                && r.path == JOBS
                && r.query.get("labelSelector").map(String::as_str)
                    == Some("app.kubernetes.io/managed-by=agent-runtime")
        })
    })
    .await;
    let pod_calls = fake.requests_to(Method::GET, PODS);
    assert!(pod_calls.iter().all(|r| {
        r.query.get("labelSelector").map(String::as_str)
            == Some("app.kubernetes.io/managed-by=agent-runtime")
    }));
    let watch = pod_calls
        .iter()
        .find(|r| r.query.contains_key("watch"))
        .unwrap();
    assert!(watch.query.contains_key("resourceVersion"), "{watch:?}");
    assert!(
        fake.requests().iter().all(|r| r.method != Method::DELETE),
        "nothing deleted"
    );
    finish(h, fake).await;
}

/// A profile may run its workers under another container runtime (gVisor,
/// Kata): its `runtimeClassName` is the pod's; a profile without one leaves it unset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profiles_runtime_class_is_its_pods() {
    let dir = std::env::temp_dir().join(format!("rm-rc-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("profiles.yaml");
    std::fs::write(
        &file,
        "profiles:\n  browser:\n    runtimeClassName: gvisor\n",
    )
    .unwrap();
    let (h, fake) = start(&[("RUNTIME_MANAGER_PROFILES", file.to_str().unwrap())]).await;
    let browser = h.provision("browser").await;
    let light = h.provision("light").await;
    h.wait_state(browser, "connecting", WAIT).await;
    h.wait_state(light, "connecting", WAIT).await;
    let spec =
        |session| fake.job(NS, &job_name(session)).unwrap()["spec"]["template"]["spec"].clone();
    assert_eq!(spec(browser)["runtimeClassName"], "gvisor");
    assert!(spec(light).get("runtimeClassName").is_none());
    finish(h, fake).await;
    std::fs::remove_dir_all(dir).unwrap();
}

/// With the shared egress proxy configured, a worker of a proxied profile gets
/// `WORKER_EGRESS_PROXY`: the proxy's URL with its session's own credential, which the
/// proxy accepts for that session and no other; the key it is derived from never reaches
/// the Job. A profile left out gets no proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_workers_job_carries_its_sessions_egress_credential_never_the_key() {
    const SECRETS_KEY: &str = "b0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecf";
    const PROXY: &str = "agent-runtime-egress-proxy.agent-runtime.svc.cluster.local:3128";
    let (h, fake) = start(&[
        ("BRAIN_SECRETS_KEY", SECRETS_KEY),
        ("RUNTIME_MANAGER_EGRESS_PROXY", PROXY),
        ("RUNTIME_MANAGER_EGRESS_PROXY_PROFILES", "light,browser"),
    ])
    .await;
    let light = h.provision("light").await;
    let heavy = h.provision("heavy").await;
    h.wait_state(light, "connecting", WAIT).await;
    h.wait_state(heavy, "connecting", WAIT).await;
    let env = |session| -> Vec<(String, String)> {
        let job = fake.job(NS, &job_name(session)).unwrap();
        job["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["value"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };

    let key = egress_proxy::SessionKey::new(
        store::SecretsKey::parse(SECRETS_KEY)
            .unwrap()
            .derive(egress_proxy::SESSION_KEY_LABEL),
    );
    let light_env = env(light);
    let proxies: Vec<&str> = light_env
        .iter()
        .filter(|(name, _)| name == "WORKER_EGRESS_PROXY")
        .map(|(_, value)| value.as_str())
        .collect();
    let [url] = proxies[..] else {
        panic!("one WORKER_EGRESS_PROXY: {light_env:?}");
    };
    let userinfo = url
        .strip_prefix("http://")
        .and_then(|rest| rest.strip_suffix(&format!("@{PROXY}")))
        .unwrap_or_else(|| panic!("the proxy's URL with credentials: {url}"));
    let (user, credential) = userinfo.split_once(':').unwrap();
    assert_eq!(user, light.0.to_string());
    assert!(
        key.verify(user, credential),
        "the proxy takes it for the session"
    );
    assert!(
        !key.verify(&heavy.0.to_string(), credential),
        "and for no other"
    );
    for (name, value) in light_env.iter().chain(env(heavy).iter()) {
        assert!(name != "BRAIN_SECRETS_KEY", "{name}");
        assert!(
            !value.to_ascii_lowercase().contains(SECRETS_KEY),
            "{name} holds the secrets key"
        );
    }
    assert!(
        env(heavy)
            .iter()
            .all(|(name, _)| name != "WORKER_EGRESS_PROXY"),
        "heavy is not a proxied profile here"
    );
    finish(h, fake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leftover_job_of_the_session_is_replaced() {
    let (h, fake) = start(&[]).await;
    // A manager created the Job and died before recording it; the task is retried.
    let (session, chat) = h.insert_session("provisioning", "light").await;
    fake.insert_job(
        NS,
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": job_name(session), "labels": {"agent-runtime/session": session.0.to_string()}},
            "spec": {"template": {"spec": {"containers": []}}},
        }),
    );
    h.push_provision(session, chat, "light").await;
    h.wait_state(session, "connecting", WAIT).await;
    let calls: Vec<(Method, String)> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with(JOBS) && r.method != Method::GET)
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(
        calls,
        [
            (Method::POST, JOBS.to_owned()),
            (Method::DELETE, job_path(session)),
            (Method::POST, JOBS.to_owned()),
        ]
    );
    let job = fake.job(NS, &job_name(session)).unwrap();
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["name"],
        "worker"
    );
    finish(h, fake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_a_running_worker_is_kept_and_adopted_after_a_restart() {
    let (mut h, fake) = start(&[]).await;
    let session = h.provision("light").await;
    h.wait_state(session, "connecting", WAIT).await;
    fake.set_pod_status(NS, &job_name(session), status::running());
    // The brain: the worker dialed in and listed its tools.
    sqlx::query(
        "UPDATE agent_runtime_sessions SET state = 'ready', updated_at = now() WHERE id = $1",
    )
    .bind(session.0)
    .execute(&h.pool)
    .await
    .unwrap();
    let gone = h.provision("light").await;
    h.wait_state(gone, "connecting", WAIT).await;
    sqlx::query(
        "UPDATE agent_runtime_sessions SET state = 'ready', updated_at = now() WHERE id = $1",
    )
    .bind(gone.0)
    .execute(&h.pool)
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.row(session).await.state, "ready");
    assert!(
        deletes_of(&fake, session).is_empty(),
        "a running worker is left alone"
    );

    // The manager restarts; meanwhile one Job went away (an operator deleted it).
    h.stop_manager().await;
    assert!(
        fake.job(NS, &job_name(session)).is_some(),
        "Jobs outlive the manager"
    );
    fake.remove_job(NS, &job_name(gone));
    let before = fake.requests().len();
    h.start_kubernetes(fake.client(), &[]);
    let row = h.wait_state(gone, "failed", WAIT).await;
    assert_eq!(row.failure_reason.as_deref(), Some("heartbeat_lost"));
    assert_eq!(
        row.failure_detail.as_deref(),
        Some("worker_gone_on_restart")
    );
    let gets: Vec<String> = fake.requests()[before..]
        .iter()
        .filter(|r| r.method == Method::GET && r.path.starts_with(&format!("{JOBS}/")))
        .map(|r| r.path.clone())
        .collect();
    assert!(
        gets.contains(&job_path(session)) && gets.contains(&job_path(gone)),
        "{gets:?}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.row(session).await.state, "ready", "adopted");
    assert!(deletes_of(&fake, session).is_empty());

    // Adopted means tracked: when the brain ends the session, the reaper deletes the Job.
    sqlx::query("UPDATE agent_runtime_sessions SET state = 'failed', failure_reason = 'heartbeat_lost' WHERE id = $1")
        .bind(session.0)
        .execute(&h.pool)
        .await
        .unwrap();
    fake.wait_for("the reaper to delete the Job", WAIT, |_| {
        !deletes_of(&fake, session).is_empty()
    })
    .await;
    assert!(fake.job(NS, &job_name(session)).is_none());
    finish(h, fake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_pull_failure_fails_the_session_with_its_detail() {
    let (h, fake) = start(&[]).await;
    let session = h.provision("light").await;
    h.wait_state(session, "connecting", WAIT).await;
    fake.set_pod_status(
        NS,
        &job_name(session),
        status::image_pull_failed("ErrImagePull"),
    );

    let row = h.wait_state(session, "failed", WAIT).await;
    assert_eq!(row.failure_reason.as_deref(), Some("launch_failed"));
    assert_eq!(row.failure_detail.as_deref(), Some("image_pull"));
    fake.wait_for("the Job's deletion", WAIT, |_| {
        !deletes_of(&fake, session).is_empty()
    })
    .await;
    assert_eq!(
        deletes_of(&fake, session)[0].body,
        Some(json!({"propagationPolicy": "Background"}))
    );
    assert!(fake.job(NS, &job_name(session)).is_none());
    assert!(fake.pod_of(NS, &job_name(session)).is_none());
    finish(h, fake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oom_kill_fails_the_session_or_details_the_brains_failure() {
    let (h, fake) = start(&[]).await;
    let session = h.provision("light").await;
    h.wait_state(session, "connecting", WAIT).await;
    fake.set_pod_status(NS, &job_name(session), status::running());
    sqlx::query(
        "UPDATE agent_runtime_sessions SET state = 'ready', updated_at = now() WHERE id = $1",
    )
    .bind(session.0)
    .execute(&h.pool)
    .await
    .unwrap();
    fake.set_pod_status(NS, &job_name(session), status::oom_killed());
    let row = h.wait_state(session, "failed", WAIT).await;
    assert_eq!(row.failure_reason.as_deref(), Some("launch_failed"));
    assert_eq!(row.failure_detail.as_deref(), Some("oom_killed"));
    fake.wait_for("the Job's deletion", WAIT, |_| {
        !deletes_of(&fake, session).is_empty()
    })
    .await;

    // The brain saw the socket close first: its reason stays, the detail says why.
    let second = h.provision("light").await;
    h.wait_state(second, "connecting", WAIT).await;
    sqlx::query(
        "UPDATE agent_runtime_sessions SET state = 'failed', failure_reason = 'heartbeat_lost',
         updated_at = now() WHERE id = $1",
    )
    .bind(second.0)
    .execute(&h.pool)
    .await
    .unwrap();
    fake.set_pod_status(NS, &job_name(second), status::oom_killed());
    let deadline = Instant::now() + WAIT;
    loop {
        let row = h.row(second).await;
        if row.failure_detail.is_some() {
            assert_eq!(row.failure_reason.as_deref(), Some("heartbeat_lost"));
            assert_eq!(row.failure_detail.as_deref(), Some("oom_killed"));
            break;
        }
        assert!(Instant::now() < deadline, "no detail: {row:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    finish(h, fake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_an_idle_session_deletes_its_job_with_background_propagation() {
    let (h, fake) = start(&[("RUNTIME_MANAGER_IDLE_WINDOW_MS", "1000")]).await;
    let session = h.provision("warm").await;
    h.wait_state(session, "connecting", WAIT).await;
    fake.set_pod_status(NS, &job_name(session), status::running());
    sqlx::query(
        "UPDATE agent_runtime_sessions SET state = 'ready', updated_at = now() WHERE id = $1",
    )
    .bind(session.0)
    .execute(&h.pool)
    .await
    .unwrap();

    let row = h.wait_state(session, "terminated", WAIT).await;
    assert_eq!(row.failure_reason, None);
    let deletes = deletes_of(&fake, session);
    assert!(!deletes.is_empty());
    assert_eq!(
        deletes[0].body,
        Some(json!({"propagationPolicy": "Background"})),
        "the garbage collector deletes the pod"
    );
    assert!(fake.job(NS, &job_name(session)).is_none());
    assert!(fake.pod_of(NS, &job_name(session)).is_none());
    // No pod was force-deleted: the pod went with its Job.
    assert!(
        fake.requests()
            .iter()
            .all(|r| !(r.method == Method::DELETE && r.path.starts_with(PODS)))
    );
    finish(h, fake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_starting_a_pending_pod_is_force_deleted_after_the_start_timeout() {
    let (h, fake) = start(&[("RUNTIME_MANAGER_START_TIMEOUT_MS", "3000")]).await;
    let created = Instant::now();
    let stuck = h.provision("light").await;
    let unschedulable = h.provision("heavy").await;
    h.wait_state(stuck, "connecting", WAIT).await;
    h.wait_state(unschedulable, "connecting", WAIT).await;
    fake.set_pod_status(NS, &job_name(unschedulable), status::unschedulable());
    let stuck_pod = fake.pod_of(NS, &job_name(stuck)).unwrap();
    let stuck_pod_path = format!("{PODS}/{}", stuck_pod["metadata"]["name"].as_str().unwrap());

    // Not before the timeout. creationTimestamp has whole seconds, so an age reads up to
    // one second long: look well before the timeout.
    tokio::time::sleep(Duration::from_millis(1000).saturating_sub(created.elapsed())).await;
    assert_eq!(h.row(stuck).await.state, "connecting");
    assert!(fake.requests_to(Method::DELETE, &stuck_pod_path).is_empty());

    let row = h.wait_state(stuck, "failed", WAIT).await;
    let after = created.elapsed();
    assert_eq!(row.failure_reason.as_deref(), Some("launch_failed"));
    assert_eq!(row.failure_detail.as_deref(), Some("start_timeout"));
    assert!(
        after >= Duration::from_secs(2) && after < Duration::from_secs(10),
        "around the timeout: {after:?}"
    );
    let force = fake.requests_to(Method::DELETE, &stuck_pod_path);
    assert_eq!(force.len(), 1);
    assert_eq!(force[0].body, Some(json!({"gracePeriodSeconds": 0})));
    fake.wait_for("the Job's deletion", WAIT, |_| {
        !deletes_of(&fake, stuck).is_empty()
    })
    .await;

    let row = h.wait_state(unschedulable, "failed", WAIT).await;
    assert_eq!(row.failure_reason.as_deref(), Some("launch_failed"));
    assert_eq!(row.failure_detail.as_deref(), Some("unschedulable"));
    finish(h, fake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_profile_never_reaches_the_api_server() {
    let (h, fake) = start(&[]).await;
    let session = h.provision("none").await;
    let row = h.wait_state(session, "failed", WAIT).await;
    assert_eq!(row.failure_detail.as_deref(), Some("unknown_profile"));
    assert!(fake.requests_to(Method::POST, JOBS).is_empty());
    finish(h, fake).await;
}

/// On SIGTERM the manager stops claiming tasks and finishes the one in
/// hand. A provision whose Job create is slow (a busy API server) still ends `connecting`
/// with its Job; a task pushed during the stop is left to the next manager; the lease row
/// goes with the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_a_stop_during_a_slow_launch_lets_that_provision_finish() {
    let (mut h, fake) = start(&[]).await;
    assert_eq!(
        h.manager_leases().await.len(),
        1,
        "the manager holds a lease"
    );
    fake.delay_job_creates(Duration::from_secs(2));
    let in_hand = h.provision("light").await;
    fake.wait_for("the Job create", WAIT, |requests| {
        requests
            .iter()
            .any(|r| r.method == Method::POST && r.path == JOBS)
    })
    .await;
    let manager = h.signal_stop().unwrap();
    let asked = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after_stop = h.provision("light").await;
    tokio::time::timeout(WAIT, manager)
        .await
        .expect("the manager stops")
        .unwrap()
        .unwrap();
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_millis(1500),
        "it waited for the launch in hand: {took:?}"
    );
    let row = h.row(in_hand).await;
    assert_eq!(row.state, "connecting", "{row:?}");
    assert_eq!(
        row.worker_ref.as_deref(),
        Some(format!("k8s:{}", job_name(in_hand)).as_str())
    );
    assert!(fake.job(NS, &job_name(in_hand)).is_some());
    assert_eq!(
        h.row(after_stop).await.state,
        "pending",
        "claimed nothing more"
    );
    assert_eq!(h.manager_leases().await, vec![], "the lease went with it");

    // The next manager provisions what was left.
    fake.delay_job_creates(Duration::ZERO);
    h.start_kubernetes(fake.client(), &[]);
    h.wait_state(after_stop, "connecting", WAIT).await;
    finish(h, fake).await;
}
