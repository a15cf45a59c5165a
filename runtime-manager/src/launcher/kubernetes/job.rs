//! The worker Job of one session (SPEC R1, R2, R4): what [`super::KubernetesLauncher`]
//! creates and `runtime-manager render-job` prints.
//!
//! ```text
//! Job worker-<session>            restartPolicy Never, backoffLimit 0, activeDeadlineSeconds
//! │                               from the profile, ttlSecondsAfterFinished 300
//! └─ pod                          no service-account token, no service links,
//!    │                            uid/gid 10001, seccomp RuntimeDefault,
//!    │                            the profile's nodeSelector and tolerations
//!    └─ container worker          read-only root, no privilege escalation, no capabilities,
//!         /workspace  emptyDir    the profile's requests and limits; env: the brain's URL,
//!         /tmp        emptyDir    the session id, its short-lived token, the workspace,
//!         /dev/shm    emptyDir (Memory), browser profile only; and the manager's `OTEL_*`
//!                                 settings (not its service name, never `…_HEADERS`)
//! ```
//!
//! The session token is the only credential in the Job besides the session's egress proxy
//! credential (in `WORKER_EGRESS_PROXY`, which opens that session's egress and nothing
//! else). It is short-lived (`RUNTIME_MANAGER_TOKEN_TTL_MS`), scoped to one session (X2)
//! and renewed in-band; no database, Redis, storage, provider, collector or secrets key
//! ever reaches a worker.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, PodSecurityContext, PodSpec,
    PodTemplateSpec, ResourceRequirements, SeccompProfile, SecurityContext, Toleration, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use protocol::{AgentId, SessionId, TeamId};

use crate::profiles::{CpuMemory, RuntimeProfile};

pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "agent-runtime";
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const COMPONENT: &str = "worker";
pub const TEAM_LABEL: &str = "agent-runtime/team";
pub const AGENT_LABEL: &str = "agent-runtime/agent";
pub const SESSION_LABEL: &str = "agent-runtime/session";
pub const PROFILE_LABEL: &str = "agent-runtime/profile";
/// Selects every Job and pod this runtime manages (the watcher's and the reaper's).
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=agent-runtime";

/// The worker container's name.
pub const CONTAINER: &str = "worker";
/// `WORKER_WORKSPACE` inside the pod.
pub const WORKSPACE: &str = "/workspace";
/// The uid and gid the worker runs as (the image's user; non-root).
pub const WORKER_UID: i64 = 10001;
/// A finished Job (and its pod, with its logs) stays this long for inspection.
pub const TTL_SECONDS_AFTER_FINISHED: i32 = 300;
/// SIGTERM to SIGKILL: the worker kills its process groups and exits on SIGTERM.
pub const TERMINATION_GRACE_SECONDS: i64 = 10;

/// The fixed ids of `render-job`'s sample session.
pub const SAMPLE_SESSION: &str = "00000000-0000-4000-8000-00000000000c";
pub const SAMPLE_TEAM: &str = "00000000-0000-4000-8000-00000000000a";
pub const SAMPLE_AGENT: &str = "00000000-0000-4000-8000-00000000000b";
/// Stands for the session token in `render-job`'s output.
pub const TOKEN_PLACEHOLDER: &str = "<session-token>";
/// Stands for the session's egress proxy credential in `render-job`'s output.
pub const CREDENTIAL_PLACEHOLDER: &str = "<egress-credential>";

/// What one session's Job is made of.
pub struct JobParams<'a> {
    pub namespace: &'a str,
    pub session: SessionId,
    pub team: TeamId,
    pub agent: AgentId,
    pub profile_name: &'a str,
    pub profile: &'a RuntimeProfile,
    pub token: &'a str,
    pub brain_public_url: &'a str,
    /// `OTEL_*` settings for the worker's traces (`launcher::telemetry_env`).
    pub telemetry_env: &'a [(String, String)],
    /// `LaunchSpec::restore` (W10).
    pub restore: bool,
    /// `WORKER_EGRESS_PROXY`: the shared egress proxy's URL with this session's credential
    /// (`KubernetesSettings::egress_proxy_url`).
    pub egress_proxy: Option<&'a str>,
}

/// `worker-<session id>`: 43 characters, a valid Job name and `job-name` label value.
pub fn job_name(session: SessionId) -> String {
    format!("worker-{}", session.0)
}

/// The labels of the Job and of its pod.
pub fn labels(p: &JobParams<'_>) -> BTreeMap<String, String> {
    [
        (MANAGED_BY_LABEL, MANAGED_BY.to_owned()),
        (COMPONENT_LABEL, COMPONENT.to_owned()),
        (TEAM_LABEL, p.team.0.to_string()),
        (AGENT_LABEL, p.agent.0.to_string()),
        (SESSION_LABEL, p.session.0.to_string()),
        (PROFILE_LABEL, p.profile_name.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The session's Job.
pub fn build(p: &JobParams<'_>) -> Job {
    let labels = labels(p);
    let (volumes, mounts) = volumes(p.profile);
    let pod = pod_spec(p.profile, container(p, mounts), volumes);
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(p.session)),
            namespace: Some(p.namespace.to_owned()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(p.profile.active_deadline.as_secs() as i64),
            ttl_seconds_after_finished: Some(TTL_SECONDS_AFTER_FINISHED),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}

/// The worker's environment: its session and where to dial, nothing of the manager's
/// own but the telemetry settings.
fn env(p: &JobParams<'_>) -> Vec<EnvVar> {
    [
        ("BRAIN_PUBLIC_URL", p.brain_public_url.to_owned()),
        ("WORKER_SESSION_ID", p.session.0.to_string()),
        ("WORKER_SESSION_TOKEN", p.token.to_owned()),
        ("WORKER_WORKSPACE", WORKSPACE.to_owned()),
        // Which tool catalog the worker serves (the browser tools only in `browser`).
        ("WORKER_PROFILE", p.profile_name.to_owned()),
        // W10: restore the chat's workspace snapshot before dialing.
        ("WORKER_RESTORE", p.restore.to_string()),
    ]
    .into_iter()
    // W14: the commands' only way out. Its credential opens this session's egress and no
    // other's (docs/design/egress.md "On Kubernetes").
    .chain(
        p.egress_proxy
            .map(|url| ("WORKER_EGRESS_PROXY", url.to_owned())),
    )
    .map(|(name, value)| (name.to_owned(), value))
    .chain(p.telemetry_env.iter().cloned())
    .map(|(name, value)| EnvVar {
        name,
        value: Some(value),
        ..EnvVar::default()
    })
    .collect()
}

/// Scratch volumes sized by the profile, and their mounts: the root filesystem is
/// read-only, so these are the only places the worker can write.
fn volumes(profile: &RuntimeProfile) -> (Vec<Volume>, Vec<VolumeMount>) {
    let scratch = |name: &str| Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: None,
            size_limit: Some(Quantity(profile.workspace_size.as_str().to_owned())),
        }),
        ..Volume::default()
    };
    let mount = |name: &str, path: &str| VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        ..VolumeMount::default()
    };
    let mut volumes = vec![scratch("workspace"), scratch("tmp")];
    let mut mounts = vec![mount("workspace", WORKSPACE), mount("tmp", "/tmp")];
    if let Some(shm) = &profile.shm_size {
        volumes.push(Volume {
            name: "dshm".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".to_owned()),
                size_limit: Some(Quantity(shm.as_str().to_owned())),
            }),
            ..Volume::default()
        });
        mounts.push(mount("dshm", "/dev/shm"));
    }
    (volumes, mounts)
}

/// The worker container: the profile's image and resources, with every privilege dropped.
fn container(p: &JobParams<'_>, mounts: Vec<VolumeMount>) -> Container {
    let profile = p.profile;
    Container {
        name: CONTAINER.to_owned(),
        image: Some(profile.image.clone()),
        image_pull_policy: Some(profile.image_pull_policy.as_str().to_owned()),
        env: Some(env(p)),
        working_dir: Some(WORKSPACE.to_owned()),
        resources: Some(ResourceRequirements {
            requests: Some(cpu_memory(&profile.resources.requests)),
            limits: Some(cpu_memory(&profile.resources.limits)),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: None,
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(mounts),
        ..Container::default()
    }
}

/// The pod around the worker: non-root, no service-account token, placed where the
/// profile says.
fn pod_spec(profile: &RuntimeProfile, container: Container, volumes: Vec<Volume>) -> PodSpec {
    PodSpec {
        restart_policy: Some("Never".to_owned()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
        // The pause process is pid 1 and reaps orphans, so the image needs no init: an
        // init would hold the worker's environment, token included, in a /proc/1/environ
        // its commands (same uid) can read. The worker itself is non-dumpable.
        share_process_namespace: Some(true),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(WORKER_UID),
            run_as_group: Some(WORKER_UID),
            fs_group: Some(WORKER_UID),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                localhost_profile: None,
            }),
            ..PodSecurityContext::default()
        }),
        node_selector: (!profile.node_selector.is_empty()).then(|| profile.node_selector.clone()),
        runtime_class_name: profile.runtime_class_name.clone(),
        tolerations: (!profile.tolerations.is_empty())
            .then(|| profile.tolerations.iter().map(toleration).collect()),
        containers: vec![container],
        volumes: Some(volumes),
        ..PodSpec::default()
    }
}

fn cpu_memory(set: &CpuMemory) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_owned(), Quantity(set.cpu.as_str().to_owned())),
        (
            "memory".to_owned(),
            Quantity(set.memory.as_str().to_owned()),
        ),
    ])
}

fn toleration(t: &crate::profiles::Toleration) -> Toleration {
    Toleration {
        key: t.key.clone(),
        operator: t.operator.map(|o| o.as_str().to_owned()),
        value: t.value.clone(),
        effect: t.effect.map(|e| e.as_str().to_owned()),
        toleration_seconds: t.toleration_seconds,
    }
}

/// The Job of a sample session of `profile_name` (fixed ids, [`TOKEN_PLACEHOLDER`] for the
/// token), as `render-job` prints it; `None` for `none` and unknown names.
pub fn sample(config: &crate::Config, profile_name: &str) -> Option<Job> {
    let profile = config.profiles.get(profile_name)?;
    let id = |s: &str| uuid::Uuid::parse_str(s).unwrap_or_default();
    let egress_proxy = config
        .kubernetes
        .egress_proxy
        .as_ref()
        .filter(|route| route.profiles.iter().any(|p| p == profile_name))
        .map(|route| {
            format!(
                "http://{SAMPLE_SESSION}:{CREDENTIAL_PLACEHOLDER}@{}",
                route.address
            )
        });
    Some(build(&JobParams {
        namespace: &config.kubernetes.namespace,
        session: SessionId(id(SAMPLE_SESSION)),
        team: TeamId(id(SAMPLE_TEAM)),
        agent: AgentId(id(SAMPLE_AGENT)),
        profile_name,
        profile,
        token: TOKEN_PLACEHOLDER,
        brain_public_url: &config.brain_public_url,
        // The rendered sample is the same wherever it is rendered.
        telemetry_env: &[],
        restore: profile.snapshots,
        egress_proxy: egress_proxy.as_deref(),
    }))
}

/// `render-job`'s output for `job` (a [`sample`]): a comment saying what it is, then the
/// Job as YAML.
pub fn to_yaml(job: &Job, profile_name: &str) -> Result<String, serde_saphyr::SerializeError> {
    let yaml = serde_saphyr::to_string(job)?;
    Ok(format!(
        "# The Job runtime-manager creates for a session of profile {profile_name}\n\
         # (sample ids; the real token is a short-lived session JWT).\n\
         {yaml}"
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::profiles::Profiles;

    #[test]
    fn names_and_labels_are_valid_kubernetes_names() {
        let session = SessionId::new();
        let name = job_name(session);
        assert!(name.len() <= 63);
        let profiles = Profiles::builtin();
        let p = JobParams {
            namespace: "agent-workers",
            session,
            team: TeamId::new(),
            agent: AgentId::new(),
            profile_name: "heavy",
            profile: &profiles.heavy,
            token: "t",
            brain_public_url: "http://brain:8080",
            telemetry_env: &[],
            restore: false,
            egress_proxy: None,
        };
        for (k, v) in labels(&p) {
            assert!(crate::profiles::is_label_key(&k), "{k}");
            assert!(crate::profiles::is_label_value(&v), "{v}");
        }
        let job = serde_json::to_value(build(&p)).unwrap();
        let pod = &job["spec"]["template"]["spec"];
        assert_eq!(pod["nodeSelector"]["agent-runtime/pool"], "workers");
        assert_eq!(pod["tolerations"][0]["effect"], "NoSchedule");
        assert!(
            pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|v| v["name"] != "dshm"),
            "/dev/shm only for the browser"
        );
    }

    #[test]
    fn the_worker_gets_the_telemetry_settings_it_is_given() {
        let profiles = Profiles::builtin();
        let telemetry = [(
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            "http://collector:4318".to_owned(),
        )];
        let job = serde_json::to_value(build(&JobParams {
            namespace: "agent-workers",
            session: SessionId::new(),
            team: TeamId::new(),
            agent: AgentId::new(),
            profile_name: "light",
            profile: &profiles.light,
            token: "t",
            brain_public_url: "http://brain:8080",
            telemetry_env: &telemetry,
            restore: false,
            egress_proxy: None,
        }))
        .unwrap();
        let env = &job["spec"]["template"]["spec"]["containers"][0]["env"];
        assert!(
            env.as_array()
                .unwrap()
                .iter()
                .any(|v| v["name"] == "OTEL_EXPORTER_OTLP_ENDPOINT"
                    && v["value"] == "http://collector:4318"),
            "{env}"
        );
    }
}
