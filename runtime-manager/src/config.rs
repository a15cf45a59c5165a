//! Typed configuration from the environment, validated before anything connects.
//!
//! Every variable is documented in `docs/CONFIGURATION.md` (runtime-manager section; the
//! Kubernetes ones and the profiles file in `docs/kubernetes.md`). A bad variable is
//! reported by name, never by value (it may be a secret), and `main` exits with code 2.
//! The profiles file holds no secret: its errors name the field's path and quote the bad
//! value. Parsing goes through [`Env`] so tests can feed a map.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use envcfg::{ConfigError, Env, ProcessEnv, SessionTokenKey};
use envcfg::{millis, non_empty, ranged, trimmed, url_var};

use crate::profiles::Profiles;

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres:postgres@127.0.0.1:5432/agent_runtime";
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const DEFAULT_BRAIN_PUBLIC_URL: &str = "http://127.0.0.1:8080";
/// Where `GET /metrics` is served when `RUNTIME_MANAGER_METRICS_ADDR` is unset: loopback,
/// so a laptop exposes nothing; the Helm chart sets `0.0.0.0:9464`.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";

/// Which launcher runs workers (SPEC "Two launchers sit behind one interface").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LauncherKind {
    /// The worker binary as a child process (the embedded default).
    Local,
    /// A `batch/v1` Job per session (production).
    Kubernetes,
}

/// The namespace worker Jobs run in when `RUNTIME_MANAGER_NAMESPACE` is unset.
pub const DEFAULT_NAMESPACE: &str = "agent-workers";

/// The Kubernetes launcher's settings (used only with `RUNTIME_MANAGER_LAUNCHER=kubernetes`,
/// but always parsed so `render-job` works anywhere).
#[derive(Clone, Debug)]
pub struct KubernetesConfig {
    /// Where worker Jobs are created (`RUNTIME_MANAGER_NAMESPACE`).
    pub namespace: String,
    /// A worker pod still pending after this long is force-deleted and its session fails
    /// (`RUNTIME_MANAGER_START_TIMEOUT_MS`, R4).
    pub start_timeout: Duration,
    /// The shared egress proxy the workers go out through (`RUNTIME_MANAGER_EGRESS_PROXY`);
    /// `None`: workers get no proxy.
    pub egress_proxy: Option<EgressProxyRoute>,
}

/// Where the workers of some profiles reach the shared egress proxy
/// (`runtime-manager egress-proxy`, docs/design/egress.md "On Kubernetes").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressProxyRoute {
    /// `host:port` of the proxy's Service.
    pub address: String,
    /// The profiles whose workers get it (`RUNTIME_MANAGER_EGRESS_PROXY_PROFILES`; every
    /// profile that launches workers when unset).
    pub profiles: Vec<String>,
}

/// The runtime-manager's whole configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub database_url: String,
    /// `DATABASE_URL` is a transaction pooler: `DATABASE_DIRECT_URL` is set (O5). The
    /// manager holds no session state and never dials the direct URL itself.
    pub database_behind_pooler: bool,
    pub redis_url: String,
    /// A Redis Cluster's seed nodes (`REDIS_CLUSTER_URLS`, O5); when set, `redis_url` is
    /// not used.
    pub redis_cluster_urls: Option<Vec<String>>,
    /// Redis key namespace of the session queue (not an environment variable: the brain
    /// and the manager must agree, so both use `queue::DEFAULT_NAMESPACE`; tests change it).
    pub queue_namespace: String,
    pub session_token_key: SessionTokenKey,
    /// Where workers dial back (`BRAIN_PUBLIC_URL`, passed to every worker).
    pub brain_public_url: String,
    pub launcher: LauncherKind,
    /// The worker executable of the local launcher (absolute).
    pub worker_bin: PathBuf,
    /// The local launcher's root: one workspace directory and one log file per session
    /// (absolute).
    pub workspaces: PathBuf,
    /// The local launcher runs workers without namespaces of their own
    /// (`RUNTIME_MANAGER_LOCAL_UNCONFINED`; only with `AGENT_RUNTIME_DEV`).
    pub local_unconfined: bool,
    /// The RuntimeProfiles (R1): built in, or from `RUNTIME_MANAGER_PROFILES`; with
    /// `RUNTIME_MANAGER_IDLE_WINDOW_MS` replacing every idle window.
    pub profiles: Profiles,
    pub kubernetes: KubernetesConfig,
    /// A launched worker that has not dialed in by then fails with `dial_timeout`.
    pub dial_timeout: Duration,
    /// Lifetime of the session token a worker starts with (the brain renews it in-band).
    pub token_ttl: Duration,
    /// How often the reaper looks for timed-out dials and orphaned workers, and the
    /// billing sweep for worker-seconds due.
    pub reaper_interval: Duration,
    /// E1: the length of a live session's worker-seconds events
    /// (`RUNTIME_MANAGER_BILLING_INTERVAL_MS`, a minute by default).
    pub billing_interval: Duration,
    /// An idle check this overdue was lost (a failed push, a crash, a Redis restart): the
    /// reaper arms a new one. Checks fire about a second after they are due, and a failing
    /// one is retried for about ten seconds.
    pub lost_idle_check_grace: Duration,
    /// Where `GET /metrics` listens (`RUNTIME_MANAGER_METRICS_ADDR`); `None` (`off`): no
    /// listener.
    pub metrics_addr: Option<SocketAddr>,
    /// How long an idle teardown waits for the worker's workspace snapshot to be stored
    /// before it stops the worker anyway (W10, `RUNTIME_MANAGER_SNAPSHOT_TIMEOUT_MS`).
    pub snapshot_timeout: Duration,
    /// The egress proxy's settings (W13, W14).
    pub egress: EgressConfig,
}

/// What the manager's egress proxies need (docs/design/egress.md).
#[derive(Clone, Debug, Default)]
pub struct EgressConfig {
    /// The key agent secrets are sealed under (`BRAIN_SECRETS_KEY`, the brain's): the
    /// proxy sets egress secrets' values. Unset, a session whose agent has egress secrets
    /// fails its launch (`egress_secrets_key_missing`).
    pub secrets_key: Option<store::SecretsKey>,
    /// Loopback and private addresses reachable through the proxy
    /// (`EGRESS_ALLOW_PRIVATE_NETWORKS`; tests, on-premise installs). Metadata addresses
    /// never are.
    pub allow_private_networks: bool,
    /// Whether an agent without `egress.allow` reaches every public host
    /// (`EGRESS_DEFAULT_ALLOW`: `all`, the default, or `none`).
    pub open_by_default: bool,
    /// A PEM file of roots the proxy trusts for upstreams beside the system's
    /// (`EGRESS_EXTRA_ROOTS`).
    pub extra_roots: Option<PathBuf>,
}

impl EgressConfig {
    /// The key of the workers' credentials for the shared egress proxy, derived from
    /// `BRAIN_SECRETS_KEY`: the Kubernetes launcher makes a worker's credential with it,
    /// `runtime-manager egress-proxy` checks it.
    pub fn session_key(&self) -> Option<egress_proxy::SessionKey> {
        self.secrets_key
            .as_ref()
            .map(|key| egress_proxy::SessionKey::new(key.derive(egress_proxy::SESSION_KEY_LABEL)))
    }

    /// What a session's policy is where its agent says nothing.
    pub fn defaults(&self) -> crate::egress::EgressDefaults {
        crate::egress::EgressDefaults {
            allow_private_networks: self.allow_private_networks,
            open: self.open_by_default,
        }
    }

    pub(crate) fn from_env(env: &dyn Env, cwd: &Path) -> Result<Self, ConfigError> {
        let secrets_key = match non_empty(env, "BRAIN_SECRETS_KEY") {
            None => None,
            Some(raw) => Some(
                store::SecretsKey::parse(&raw).map_err(|problem| ConfigError {
                    name: "BRAIN_SECRETS_KEY",
                    problem: problem.into(),
                })?,
            ),
        };
        let allow_private_networks = envcfg::parse(env, "EGRESS_ALLOW_PRIVATE_NETWORKS", "false")
            .map_err(|_| ConfigError {
            name: "EGRESS_ALLOW_PRIVATE_NETWORKS",
            problem: "must be true or false".into(),
        })?;
        let open_by_default = match non_empty(env, "EGRESS_DEFAULT_ALLOW").as_deref() {
            None | Some("all") => true,
            Some("none") => false,
            Some(_) => {
                return Err(ConfigError {
                    name: "EGRESS_DEFAULT_ALLOW",
                    problem: "must be all or none".into(),
                });
            }
        };
        let extra_roots = non_empty(env, "EGRESS_EXTRA_ROOTS").map(|p| absolute(cwd, p.trim()));
        Ok(Self {
            secrets_key,
            allow_private_networks,
            open_by_default,
            extra_roots,
        })
    }
}

impl Config {
    /// Each subsystem's variables are read by a function of their own, in the order the
    /// first bad variable is reported.
    pub fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        let cwd = std::env::current_dir().map_err(|_| ConfigError {
            name: "RUNTIME_MANAGER_WORKSPACES",
            problem: "cannot be resolved: the current directory is unreadable".into(),
        })?;
        let launcher = launcher_kind(env)?;
        let worker_bin = worker_bin(env, &cwd)?;
        let workspaces = absolute(
            &cwd,
            non_empty(env, "RUNTIME_MANAGER_WORKSPACES")
                .as_deref()
                .map(str::trim)
                .unwrap_or("./.dev/workspaces"),
        );
        let profiles = profiles(env, &cwd)?;
        let kubernetes = KubernetesConfig::from_env(env)?;
        let (dial_timeout, token_ttl) = dial_and_token_timeouts(env, launcher, &kubernetes)?;
        let local_unconfined = local_unconfined(env)?;
        let brain_public_url = brain_public_url(env)?;
        Ok(Self {
            database_url: url_var(env, "DATABASE_URL", DEFAULT_DATABASE_URL)?,
            database_behind_pooler: non_empty(env, "DATABASE_DIRECT_URL").is_some(),
            redis_url: url_var(env, "REDIS_URL", DEFAULT_REDIS_URL)?,
            redis_cluster_urls: envcfg::redis_urls(env, "REDIS_CLUSTER_URLS")?,
            queue_namespace: non_empty(env, "SESSION_QUEUE_NAMESPACE")
                .unwrap_or_else(|| queue::DEFAULT_NAMESPACE.to_owned()),
            session_token_key: envcfg::session_token_key(env)?,
            brain_public_url,
            launcher,
            worker_bin,
            workspaces,
            local_unconfined,
            profiles,
            kubernetes,
            dial_timeout,
            token_ttl,
            reaper_interval: Duration::from_secs(1),
            billing_interval: ranged(
                env,
                "RUNTIME_MANAGER_BILLING_INTERVAL_MS",
                60_000,
                100,
                3_600_000,
            )
            .map(Duration::from_millis)?,
            lost_idle_check_grace: Duration::from_secs(30),
            metrics_addr: metrics_addr(env)?,
            snapshot_timeout: millis(env, "RUNTIME_MANAGER_SNAPSHOT_TIMEOUT_MS", 120_000)?,
            egress: EgressConfig::from_env(env, &cwd)?,
        })
    }
}

impl KubernetesConfig {
    fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        Ok(Self {
            namespace: namespace(env)?,
            start_timeout: millis(env, "RUNTIME_MANAGER_START_TIMEOUT_MS", 120_000)?,
            egress_proxy: egress_proxy_route(env)?,
        })
    }
}

/// `RUNTIME_MANAGER_EGRESS_PROXY` (`host:port`) and `RUNTIME_MANAGER_EGRESS_PROXY_PROFILES`
/// (comma-separated). A worker's proxy credential is derived from `BRAIN_SECRETS_KEY`, so
/// the route needs it.
fn egress_proxy_route(env: &dyn Env) -> Result<Option<EgressProxyRoute>, ConfigError> {
    const NAME: &str = "RUNTIME_MANAGER_EGRESS_PROXY";
    let Some(address) = trimmed(env, NAME) else {
        return Ok(None);
    };
    let valid = address.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
            && port.parse::<u16>().is_ok_and(|p| p > 0)
    });
    if !valid {
        return Err(ConfigError {
            name: NAME,
            problem: "must be host:port (the egress proxy Service, e.g. \
                      agent-runtime-egress-proxy.agent-runtime.svc.cluster.local:3128)"
                .into(),
        });
    }
    if non_empty(env, "BRAIN_SECRETS_KEY").is_none() {
        return Err(ConfigError {
            name: NAME,
            problem: "needs BRAIN_SECRETS_KEY (workers' proxy credentials are derived from it)"
                .into(),
        });
    }
    let profiles = match trimmed(env, "RUNTIME_MANAGER_EGRESS_PROXY_PROFILES") {
        None => protocol::profile::WITH_HANDS
            .iter()
            .map(|p| (*p).to_owned())
            .collect(),
        Some(list) => {
            let profiles: Vec<String> = list.split(',').map(|p| p.trim().to_owned()).collect();
            if profiles
                .iter()
                .any(|p| !protocol::profile::WITH_HANDS.contains(&p.as_str()))
            {
                return Err(ConfigError {
                    name: "RUNTIME_MANAGER_EGRESS_PROXY_PROFILES",
                    problem: format!(
                        "must be profiles that launch workers ({}), comma-separated",
                        protocol::profile::WITH_HANDS.join(", ")
                    ),
                });
            }
            profiles
        }
    };
    Ok(Some(EgressProxyRoute { address, profiles }))
}

/// `RUNTIME_MANAGER_LAUNCHER`: `local` (the default) or `kubernetes`.
fn launcher_kind(env: &dyn Env) -> Result<LauncherKind, ConfigError> {
    match non_empty(env, "RUNTIME_MANAGER_LAUNCHER")
        .as_deref()
        .map(str::trim)
    {
        None | Some("local") => Ok(LauncherKind::Local),
        Some("kubernetes") => Ok(LauncherKind::Kubernetes),
        Some(_) => Err(ConfigError {
            name: "RUNTIME_MANAGER_LAUNCHER",
            problem: "must be local or kubernetes".into(),
        }),
    }
}

/// `RUNTIME_MANAGER_WORKER_BIN`, or `worker` beside the manager's own executable (where
/// a build or a package puts both).
fn worker_bin(env: &dyn Env, cwd: &Path) -> Result<PathBuf, ConfigError> {
    if let Some(path) = non_empty(env, "RUNTIME_MANAGER_WORKER_BIN") {
        return Ok(absolute(cwd, path.trim()));
    }
    let exe = std::env::current_exe().map_err(|_| ConfigError {
        name: "RUNTIME_MANAGER_WORKER_BIN",
        problem: "must be set: the manager's own executable path is unknown".into(),
    })?;
    exe.parent()
        .map(|dir| dir.join("worker"))
        .ok_or(ConfigError {
            name: "RUNTIME_MANAGER_WORKER_BIN",
            problem: "must be set: the manager's own executable has no directory".into(),
        })
}

/// The built-in profiles or `RUNTIME_MANAGER_PROFILES`'s, with
/// `RUNTIME_MANAGER_IDLE_WINDOW_MS` (tests and demos) replacing every idle window.
fn profiles(env: &dyn Env, cwd: &Path) -> Result<Profiles, ConfigError> {
    let mut profiles = match non_empty(env, "RUNTIME_MANAGER_PROFILES") {
        None => Profiles::builtin(),
        Some(path) => {
            let path = absolute(cwd, path.trim());
            Profiles::from_file(&path).map_err(|e| ConfigError {
                name: "RUNTIME_MANAGER_PROFILES",
                problem: format!("({}): {e}", path.display()),
            })?
        }
    };
    if non_empty(env, "RUNTIME_MANAGER_IDLE_WINDOW_MS").is_some() {
        profiles.set_idle_windows(millis(env, "RUNTIME_MANAGER_IDLE_WINDOW_MS", 90_000)?);
    }
    Ok(profiles)
}

/// The dial timeout and the launch token's lifetime, read together because each bounds
/// the next: a pod starts, then dials, then uses its token.
fn dial_and_token_timeouts(
    env: &dyn Env,
    launcher: LauncherKind,
    kubernetes: &KubernetesConfig,
) -> Result<(Duration, Duration), ConfigError> {
    // A pod needs time to be scheduled and to pull its image before it can dial: with
    // Jobs the dial timeout starts above the start timeout.
    let dial_default = match launcher {
        LauncherKind::Local => 15_000,
        LauncherKind::Kubernetes => kubernetes.start_timeout.as_millis() as u64 + 60_000,
    };
    let dial_timeout = millis(env, "RUNTIME_MANAGER_DIAL_TIMEOUT_MS", dial_default)?;
    if launcher == LauncherKind::Kubernetes && dial_timeout <= kubernetes.start_timeout {
        return Err(ConfigError {
            name: "RUNTIME_MANAGER_DIAL_TIMEOUT_MS",
            problem: "must be longer than RUNTIME_MANAGER_START_TIMEOUT_MS with the \
                      kubernetes launcher (a pod still starting cannot dial)"
                .into(),
        });
    }
    let token_ttl = ranged(
        env,
        "RUNTIME_MANAGER_TOKEN_TTL_MS",
        600_000,
        1_000,
        86_400_000,
    )
    .map(Duration::from_millis)?;
    if token_ttl <= dial_timeout {
        return Err(ConfigError {
            name: "RUNTIME_MANAGER_TOKEN_TTL_MS",
            problem: "must be longer than RUNTIME_MANAGER_DIAL_TIMEOUT_MS (a worker \
                      dials with the token it was launched with)"
                .into(),
        });
    }
    Ok((dial_timeout, token_ttl))
}

/// `RUNTIME_MANAGER_LOCAL_UNCONFINED`: refused outside development mode, since an
/// unconfined worker can read every other session's workspace.
fn local_unconfined(env: &dyn Env) -> Result<bool, ConfigError> {
    let local_unconfined = envcfg::parse(env, "RUNTIME_MANAGER_LOCAL_UNCONFINED", "false")
        .map_err(|_| ConfigError {
            name: "RUNTIME_MANAGER_LOCAL_UNCONFINED",
            problem: "must be true or false".into(),
        })?;
    if local_unconfined && !envcfg::dev_mode(env)? {
        return Err(ConfigError {
            name: "RUNTIME_MANAGER_LOCAL_UNCONFINED",
            problem: format!(
                "is for development only: it needs {}=true",
                envcfg::DEV_MODE
            ),
        });
    }
    Ok(local_unconfined)
}

/// `BRAIN_PUBLIC_URL`: workers dial it over HTTP(S) only.
fn brain_public_url(env: &dyn Env) -> Result<String, ConfigError> {
    let url = url_var(env, "BRAIN_PUBLIC_URL", DEFAULT_BRAIN_PUBLIC_URL)?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(ConfigError {
            name: "BRAIN_PUBLIC_URL",
            problem: "must be an http:// or https:// URL".into(),
        });
    }
    Ok(url)
}

/// `RUNTIME_MANAGER_METRICS_ADDR`: `host:port`, or `off`.
fn metrics_addr(env: &dyn Env) -> Result<Option<SocketAddr>, ConfigError> {
    match trimmed(env, "RUNTIME_MANAGER_METRICS_ADDR").as_deref() {
        Some("off") => Ok(None),
        _ => envcfg::parse(env, "RUNTIME_MANAGER_METRICS_ADDR", DEFAULT_METRICS_ADDR).map(Some),
    }
}

/// `RUNTIME_MANAGER_NAMESPACE`: a DNS label (RFC 1123).
fn namespace(env: &dyn Env) -> Result<String, ConfigError> {
    let value =
        trimmed(env, "RUNTIME_MANAGER_NAMESPACE").unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
    let valid = value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !valid {
        return Err(ConfigError {
            name: "RUNTIME_MANAGER_NAMESPACE",
            problem: "must be a namespace name (at most 63 of a-z, 0-9 and -)".into(),
        });
    }
    Ok(value)
}

fn absolute(cwd: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const KEY: &str = "0123456789abcdef0123456789abcdef";
    /// A `BRAIN_SECRETS_KEY`: 32 bytes as hex.
    const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    /// The variables of `pairs`, with a session-token key unless they set one.
    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut vars = envcfg::vars(&[("SESSION_TOKEN_KEY", KEY)]);
        vars.extend(envcfg::vars(pairs));
        vars
    }

    #[test]
    fn without_a_session_token_key_the_start_is_refused() {
        let err = Config::from_env(&envcfg::vars(&[])).unwrap_err();
        assert_eq!(err.name, "SESSION_TOKEN_KEY");
    }

    #[test]
    fn unconfined_local_workers_are_for_development_only() {
        assert!(!Config::from_env(&env(&[])).unwrap().local_unconfined);
        let unconfined = ("RUNTIME_MANAGER_LOCAL_UNCONFINED", "true");
        let err = Config::from_env(&env(&[unconfined])).unwrap_err();
        assert_eq!(err.name, "RUNTIME_MANAGER_LOCAL_UNCONFINED");
        let dev = Config::from_env(&env(&[unconfined, (envcfg::DEV_MODE, "true")])).unwrap();
        assert!(dev.local_unconfined);
    }

    #[test]
    fn defaults_are_the_embedded_setup() {
        let config = Config::from_env(&env(&[])).unwrap();
        assert_eq!(config.database_url, DEFAULT_DATABASE_URL);
        assert_eq!(config.redis_url, DEFAULT_REDIS_URL);
        assert_eq!(config.brain_public_url, DEFAULT_BRAIN_PUBLIC_URL);
        assert_eq!(config.launcher, LauncherKind::Local);
        assert!(!config.session_token_key.development);
        assert_eq!(config.session_token_key.bytes, KEY.as_bytes());
        assert_eq!(config.worker_bin.file_name().unwrap(), "worker");
        assert!(config.worker_bin.is_absolute());
        assert!(config.workspaces.is_absolute());
        assert!(config.workspaces.ends_with(".dev/workspaces"));
        assert_eq!(config.dial_timeout, Duration::from_secs(15));
        assert_eq!(config.token_ttl, Duration::from_secs(600));
        let profiles = &config.profiles;
        assert_eq!(*profiles, Profiles::builtin());
        assert_eq!(profiles.idle_window("light"), Some(Duration::from_secs(90)));
        assert_eq!(
            profiles.idle_window("warm"),
            Some(Duration::from_secs(1200))
        );
        assert_eq!(profiles.idle_window("none"), None);
        assert_eq!(config.kubernetes.namespace, DEFAULT_NAMESPACE);
        assert_eq!(config.kubernetes.start_timeout, Duration::from_secs(120));
        assert_eq!(
            config.metrics_addr,
            Some(DEFAULT_METRICS_ADDR.parse().unwrap())
        );
        assert!(!format!("{config:?}").contains(KEY));
    }

    #[test]
    fn bad_variables_are_named() {
        for (name, value) in [
            ("SESSION_TOKEN_KEY", "short"),
            ("BRAIN_PUBLIC_URL", "ftp://x"),
            ("RUNTIME_MANAGER_LAUNCHER", "docker"),
            ("RUNTIME_MANAGER_NAMESPACE", "Agent_Workers"),
            ("RUNTIME_MANAGER_START_TIMEOUT_MS", "later"),
            ("RUNTIME_MANAGER_PROFILES", "/nonexistent/profiles.yaml"),
            ("RUNTIME_MANAGER_IDLE_WINDOW_MS", "soon"),
            ("RUNTIME_MANAGER_DIAL_TIMEOUT_MS", "0"),
            ("RUNTIME_MANAGER_TOKEN_TTL_MS", "10"),
            ("RUNTIME_MANAGER_METRICS_ADDR", "9464"),
            ("DATABASE_URL", "not a url"),
        ] {
            let err = Config::from_env(&env(&[(name, value)])).unwrap_err();
            assert_eq!(err.name, name, "{value}");
        }
        let err = Config::from_env(&env(&[("SESSION_TOKEN_KEY", "secret-but-short")])).unwrap_err();
        assert!(
            !err.to_string().contains("secret-but-short"),
            "values are never echoed"
        );
    }

    #[test]
    fn overrides_apply() {
        let config = Config::from_env(&env(&[
            ("RUNTIME_MANAGER_IDLE_WINDOW_MS", "1500"),
            ("RUNTIME_MANAGER_WORKER_BIN", "/opt/worker"),
            ("RUNTIME_MANAGER_WORKSPACES", "/tmp/ws"),
        ]))
        .unwrap();
        assert_eq!(
            config.profiles.idle_window("warm"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(config.worker_bin, PathBuf::from("/opt/worker"));
        assert_eq!(config.workspaces, PathBuf::from("/tmp/ws"));
        let metrics = |value| {
            Config::from_env(&env(&[("RUNTIME_MANAGER_METRICS_ADDR", value)]))
                .unwrap()
                .metrics_addr
        };
        assert_eq!(
            metrics("0.0.0.0:9464"),
            Some("0.0.0.0:9464".parse().unwrap())
        );
        assert_eq!(metrics(" off "), None);
    }

    #[test]
    fn the_kubernetes_launcher_waits_longer_for_a_dial() {
        let config = Config::from_env(&env(&[
            ("RUNTIME_MANAGER_LAUNCHER", "kubernetes"),
            ("RUNTIME_MANAGER_NAMESPACE", "team-workers"),
        ]))
        .unwrap();
        assert_eq!(config.launcher, LauncherKind::Kubernetes);
        assert_eq!(config.kubernetes.namespace, "team-workers");
        assert!(config.dial_timeout > config.kubernetes.start_timeout);
        let err = Config::from_env(&env(&[
            ("RUNTIME_MANAGER_LAUNCHER", "kubernetes"),
            ("RUNTIME_MANAGER_DIAL_TIMEOUT_MS", "15000"),
        ]))
        .unwrap_err();
        assert_eq!(err.name, "RUNTIME_MANAGER_DIAL_TIMEOUT_MS");
        let err = Config::from_env(&env(&[
            ("RUNTIME_MANAGER_DIAL_TIMEOUT_MS", "60000"),
            ("RUNTIME_MANAGER_TOKEN_TTL_MS", "30000"),
        ]))
        .unwrap_err();
        assert_eq!(err.name, "RUNTIME_MANAGER_TOKEN_TTL_MS");
    }

    #[test]
    fn the_workers_egress_proxy_route_needs_the_secrets_key_and_known_profiles() {
        assert_eq!(
            Config::from_env(&env(&[])).unwrap().kubernetes.egress_proxy,
            None
        );
        let address = (
            "RUNTIME_MANAGER_EGRESS_PROXY",
            "proxy.agent-runtime.svc:3128",
        );
        let key = ("BRAIN_SECRETS_KEY", KEY_HEX);
        let err = Config::from_env(&env(&[address])).unwrap_err();
        assert_eq!(err.name, "RUNTIME_MANAGER_EGRESS_PROXY");
        let route = Config::from_env(&env(&[address, key]))
            .unwrap()
            .kubernetes
            .egress_proxy
            .unwrap();
        assert_eq!(route.address, "proxy.agent-runtime.svc:3128");
        assert_eq!(route.profiles, protocol::profile::WITH_HANDS);
        let only = ("RUNTIME_MANAGER_EGRESS_PROXY_PROFILES", "light, browser");
        let route = Config::from_env(&env(&[address, key, only]))
            .unwrap()
            .kubernetes
            .egress_proxy
            .unwrap();
        assert_eq!(route.profiles, ["light", "browser"]);
        for (name, value) in [
            ("RUNTIME_MANAGER_EGRESS_PROXY", "proxy"),
            ("RUNTIME_MANAGER_EGRESS_PROXY", "http://proxy:3128"),
            ("RUNTIME_MANAGER_EGRESS_PROXY_PROFILES", "light,none"),
        ] {
            let err = Config::from_env(&env(&[address, key, (name, value)])).unwrap_err();
            assert_eq!(err.name, name, "{value}");
        }
    }

    #[test]
    fn a_profiles_file_is_read_and_its_errors_name_the_field() {
        let dir = std::env::temp_dir().join(format!("rm-config-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("profiles.yaml");
        std::fs::write(&good, "profiles:\n  heavy:\n    idleWindowSeconds: 50\n").unwrap();
        let config = Config::from_env(&env(&[(
            "RUNTIME_MANAGER_PROFILES",
            good.to_str().unwrap(),
        )]))
        .unwrap();
        assert_eq!(
            config.profiles.idle_window("heavy"),
            Some(Duration::from_secs(50))
        );

        let bad = dir.join("bad.yaml");
        std::fs::write(
            &bad,
            "profiles:\n  heavy:\n    resources:\n      limits:\n        memory: 12 GB\n",
        )
        .unwrap();
        let err = Config::from_env(&env(&[("RUNTIME_MANAGER_PROFILES", bad.to_str().unwrap())]))
            .unwrap_err();
        assert_eq!(err.name, "RUNTIME_MANAGER_PROFILES");
        assert!(
            err.to_string()
                .contains("profiles.heavy.resources.limits.memory: invalid quantity \"12 GB\""),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
