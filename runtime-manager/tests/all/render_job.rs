//! `runtime-manager render-job`: the Job of every profile, printed by the real binary, is
//! valid against the Kubernetes OpenAPI schema (`kubernetes-validate --strict`, installed
//! by `scripts/test-deps.sh` into `tests/k8s/.venv`; missing, the test fails), and a bad
//! profiles file stops the binary with exit code 2 naming the field (SPEC R1, R2).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::batch::v1::Job;
use protocol::profile::WITH_HANDS;
use runtime_manager::launcher::kubernetes::job;

/// The oldest and the newest Kubernetes versions checked: the client's feature (`v1_33`)
/// and the newest schema `kubernetes-validate` bundles.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.33.0", "1.37.0"];

fn validator() -> PathBuf {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/k8s/.venv/bin/kubernetes-validate");
    assert!(
        path.exists(),
        "{} is missing: run scripts/test-deps.sh (or `make test-deps`)",
        path.display()
    );
    path
}

/// The binary with a clean environment plus a session-token key and `env`.
fn render(profile: &str, env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_runtime-manager"));
    command
        .env_clear()
        .env("SESSION_TOKEN_KEY", test_support::SESSION_TOKEN_KEY)
        .args(["render-job", "--profile", profile]);
    if let Ok(path) = std::env::var("PATH") {
        command.env("PATH", path);
    }
    command.envs(env.iter().copied());
    command.output().unwrap()
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rm-render-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `kubernetes-validate --strict` on `files` for each version; panics with its output.
fn validate(files: &[PathBuf]) {
    let validator = validator();
    for version in KUBERNETES_VERSIONS {
        let out = Command::new(&validator)
            .args(["--strict", "--quiet", "--kubernetes-version", version])
            .args(files)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubernetes-validate {version}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_profiles_job_is_valid_against_the_kubernetes_schema() {
    let dir = temp_dir();
    let config = runtime_manager::Config::from_env(&envcfg::vars(&[(
        "SESSION_TOKEN_KEY",
        test_support::SESSION_TOKEN_KEY,
    )]))
    .unwrap();
    let mut files = Vec::new();
    for profile in WITH_HANDS {
        let out = render(profile, &[]);
        assert!(
            out.status.success(),
            "{profile}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let yaml = String::from_utf8(out.stdout).unwrap();
        assert!(yaml.contains(job::TOKEN_PLACEHOLDER), "{yaml}");
        // The YAML reads back as the very Job the launcher would post.
        let parsed: Job = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(parsed, job::sample(&config, profile).unwrap(), "{profile}");
        let file = dir.join(format!("{profile}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        files.push(file);
    }
    validate(&files);

    // The check is strict: a misspelled field fails it.
    let light = std::fs::read_to_string(&files[0]).unwrap();
    let misspelled = dir.join("misspelled.yaml");
    std::fs::write(&misspelled, light.replace("backoffLimit", "backofLimit")).unwrap();
    let out = Command::new(validator())
        .args(["--strict", "--quiet"])
        .arg(&misspelled)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a misspelled field passed");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_configured_profile_renders_and_validates() {
    let dir = temp_dir();
    let profiles = dir.join("profiles.yaml");
    std::fs::write(
        &profiles,
        r#"profiles:
  heavy:
    image: registry.example.com/agent-runtime/worker:0.1.0
    imagePullPolicy: Always
    resources:
      requests: { cpu: 1.5, memory: 3Gi }
      limits: { cpu: 6, memory: 12Gi }
    workspaceSize: 20Gi
    nodeSelector:
      agent-runtime/pool: workers
      kubernetes.io/arch: amd64
    tolerations:
      - key: agent-runtime/pool
        operator: Exists
        effect: NoExecute
        tolerationSeconds: 60
    activeDeadlineSeconds: 1800
"#,
    )
    .unwrap();
    let out = render(
        "heavy",
        &[
            ("RUNTIME_MANAGER_PROFILES", profiles.to_str().unwrap()),
            ("RUNTIME_MANAGER_NAMESPACE", "tenant-workers"),
            ("BRAIN_PUBLIC_URL", "http://brain.agent-runtime.svc:8080"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).unwrap();
    let job: Job = serde_saphyr::from_str(&yaml).unwrap();
    let value = serde_json::to_value(&job).unwrap();
    assert_eq!(value["metadata"]["namespace"], "tenant-workers");
    assert_eq!(value["spec"]["activeDeadlineSeconds"], 1800);
    let container = &value["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        "registry.example.com/agent-runtime/worker:0.1.0"
    );
    assert_eq!(container["resources"]["requests"]["cpu"], "1.5");
    assert_eq!(container["resources"]["limits"]["cpu"], "6");
    assert_eq!(
        container["env"][0]["value"],
        "http://brain.agent-runtime.svc:8080"
    );
    let file = dir.join("heavy.yaml");
    std::fs::write(&file, yaml).unwrap();
    validate(&[file]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_configuration_stops_the_binary_naming_the_field() {
    let dir = temp_dir();
    let bad = dir.join("profiles.yaml");
    std::fs::write(
        &bad,
        "profiles:\n  heavy:\n    resources:\n      limits:\n        memory: 12 GB\n",
    )
    .unwrap();
    let out = render(
        "heavy",
        &[("RUNTIME_MANAGER_PROFILES", bad.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("RUNTIME_MANAGER_PROFILES")
            && stderr
                .contains("profiles.heavy.resources.limits.memory: invalid quantity \"12 GB\""),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    let out = render("none", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("light, browser, heavy, warm"));
    std::fs::remove_dir_all(dir).unwrap();
}

/// No published key signs worker tokens: without `SESSION_TOKEN_KEY` the
/// manager refuses to start, naming it, unless in development mode, whose key is made
/// under `.dev/` of the working directory (where the brain of `make dev` finds it too).
#[test]
fn without_a_session_token_key_the_manager_refuses_to_start() {
    let dir = temp_dir();
    let run = |dev: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_runtime-manager"));
        command
            .env_clear()
            .current_dir(&dir)
            .args(["render-job", "--profile", "light"]);
        if dev {
            command.env("AGENT_RUNTIME_DEV", "true");
        }
        command.output().unwrap()
    };
    let refused = run(false);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("SESSION_TOKEN_KEY"), "{stderr}");
    assert!(refused.stdout.is_empty());

    let dev = run(true);
    assert!(
        dev.status.success(),
        "{}",
        String::from_utf8_lossy(&dev.stderr)
    );
    let key = std::fs::read_to_string(dir.join(".dev/session-token-key")).unwrap();
    assert_eq!(key.len(), 64);
    std::fs::remove_dir_all(dir).unwrap();
}
