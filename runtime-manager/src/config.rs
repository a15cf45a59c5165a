//! Typed configuration from the environment, validated before anything connects.
//!
//! Every variable is documented in `docs/CONFIGURATION.md` (runtime-manager section). A bad
//! variable is reported by name, never by value (it may be a secret), and `main` exits
//! with code 2. Parsing goes through [`Env`] so tests can feed a map.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The session-token signing key used when `SESSION_TOKEN_KEY` is unset, so `make dev`
/// works with no configuration. It is the `channel` crate's, so the brain's default is the
/// same. Never use it in production: anyone who reads the source can mint worker tokens.
pub use channel::token::DEV_SESSION_TOKEN_KEY;

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres:postgres@127.0.0.1:5432/agent_runtime";
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const DEFAULT_BRAIN_PUBLIC_URL: &str = "http://127.0.0.1:8080";

/// A source of variables: the process environment, or a map in tests.
pub trait Env {
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Env for HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).cloned()
    }
}

/// A variable that is set but unusable.
#[derive(Debug, thiserror::Error)]
#[error("configuration error: {name} {problem}")]
pub struct ConfigError {
    pub name: &'static str,
    pub problem: String,
}

/// Which launcher runs workers (SPEC "Two launchers sit behind one interface").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LauncherKind {
    /// The worker binary as a child process (the embedded default).
    Local,
}

/// The signing key of session tokens. `Debug` never shows it.
#[derive(Clone)]
pub struct TokenKey {
    pub bytes: Vec<u8>,
    /// Whether this is [`DEV_SESSION_TOKEN_KEY`] (the variable was unset).
    pub is_development: bool,
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenKey")
            .field("bytes", &"<redacted>")
            .field("is_development", &self.is_development)
            .finish()
    }
}

/// The runtime-manager's whole configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub database_url: String,
    pub redis_url: String,
    /// Redis key namespace of the session queue (not an environment variable: the brain
    /// and the manager must agree, so both use `queue::DEFAULT_NAMESPACE`; tests change it).
    pub queue_namespace: String,
    pub session_token_key: TokenKey,
    /// Where workers dial back (`BRAIN_PUBLIC_URL`, passed to every worker).
    pub brain_public_url: String,
    pub launcher: LauncherKind,
    /// The worker executable of the local launcher (absolute).
    pub worker_bin: PathBuf,
    /// The local launcher's root: one workspace directory and one log file per session
    /// (absolute).
    pub workspaces: PathBuf,
    pub idle_windows: IdleWindows,
    /// A launched worker that has not dialed in by then fails with `dial_timeout`.
    pub dial_timeout: Duration,
    /// Lifetime of the session token a worker starts with (the brain renews it in-band).
    pub token_ttl: Duration,
    /// How often the reaper looks for timed-out dials and orphaned workers.
    pub reaper_interval: Duration,
}

/// Idle windows per RuntimeProfile (SPEC R table); `RUNTIME_MANAGER_IDLE_WINDOW_MS`
/// replaces all of them (tests).
#[derive(Clone, Copy, Debug)]
pub struct IdleWindows {
    pub light: Duration,
    pub heavy: Duration,
    pub browser: Duration,
    pub warm: Duration,
}

impl IdleWindows {
    pub const DEFAULT: Self = Self {
        light: Duration::from_secs(90),
        heavy: Duration::from_secs(90),
        browser: Duration::from_secs(90),
        warm: Duration::from_secs(20 * 60),
    };

    fn all(window: Duration) -> Self {
        Self {
            light: window,
            heavy: window,
            browser: window,
            warm: window,
        }
    }

    /// The window of `profile`; `None` for a profile without hands (`none`) or unknown.
    pub fn for_profile(&self, profile: &str) -> Option<Duration> {
        match profile {
            "light" => Some(self.light),
            "heavy" => Some(self.heavy),
            "browser" => Some(self.browser),
            "warm" => Some(self.warm),
            _ => None,
        }
    }
}

impl Config {
    pub fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        let cwd = std::env::current_dir().map_err(|_| ConfigError {
            name: "RUNTIME_MANAGER_WORKSPACES",
            problem: "cannot be resolved: the current directory is unreadable".into(),
        })?;
        let launcher = match non_empty(env, "RUNTIME_MANAGER_LAUNCHER")
            .as_deref()
            .map(str::trim)
        {
            None | Some("local") => LauncherKind::Local,
            Some("kubernetes") => {
                return Err(ConfigError {
                    name: "RUNTIME_MANAGER_LAUNCHER",
                    problem: "kubernetes is not built yet; use local".into(),
                });
            }
            Some(_) => {
                return Err(ConfigError {
                    name: "RUNTIME_MANAGER_LAUNCHER",
                    problem: "must be local".into(),
                });
            }
        };
        let worker_bin = match non_empty(env, "RUNTIME_MANAGER_WORKER_BIN") {
            Some(path) => absolute(&cwd, path.trim()),
            None => {
                let exe = std::env::current_exe().map_err(|_| ConfigError {
                    name: "RUNTIME_MANAGER_WORKER_BIN",
                    problem: "must be set: the manager's own executable path is unknown".into(),
                })?;
                exe.parent()
                    .map(|dir| dir.join("worker"))
                    .ok_or(ConfigError {
                        name: "RUNTIME_MANAGER_WORKER_BIN",
                        problem: "must be set: the manager's own executable has no directory"
                            .into(),
                    })?
            }
        };
        let workspaces = absolute(
            &cwd,
            non_empty(env, "RUNTIME_MANAGER_WORKSPACES")
                .as_deref()
                .map(str::trim)
                .unwrap_or("./.dev/workspaces"),
        );
        let idle_windows = match non_empty(env, "RUNTIME_MANAGER_IDLE_WINDOW_MS") {
            None => IdleWindows::DEFAULT,
            Some(_) => IdleWindows::all(millis(env, "RUNTIME_MANAGER_IDLE_WINDOW_MS", 90_000)?),
        };
        let brain_public_url = url_var(env, "BRAIN_PUBLIC_URL", DEFAULT_BRAIN_PUBLIC_URL)?;
        if !(brain_public_url.starts_with("http://") || brain_public_url.starts_with("https://")) {
            return Err(ConfigError {
                name: "BRAIN_PUBLIC_URL",
                problem: "must be an http:// or https:// URL".into(),
            });
        }
        Ok(Self {
            database_url: url_var(env, "DATABASE_URL", DEFAULT_DATABASE_URL)?,
            redis_url: url_var(env, "REDIS_URL", DEFAULT_REDIS_URL)?,
            queue_namespace: non_empty(env, "SESSION_QUEUE_NAMESPACE")
                .unwrap_or_else(|| queue::DEFAULT_NAMESPACE.to_owned()),
            session_token_key: token_key(env)?,
            brain_public_url,
            launcher,
            worker_bin,
            workspaces,
            idle_windows,
            dial_timeout: millis(env, "RUNTIME_MANAGER_DIAL_TIMEOUT_MS", 15_000)?,
            token_ttl: ranged(
                env,
                "RUNTIME_MANAGER_TOKEN_TTL_MS",
                600_000,
                1_000,
                86_400_000,
            )
            .map(Duration::from_millis)?,
            reaper_interval: Duration::from_secs(1),
        })
    }
}

fn token_key(env: &dyn Env) -> Result<TokenKey, ConfigError> {
    match env.get("SESSION_TOKEN_KEY").filter(|v| !v.is_empty()) {
        None => Ok(TokenKey {
            bytes: DEV_SESSION_TOKEN_KEY.as_bytes().to_vec(),
            is_development: true,
        }),
        Some(key) if key.len() < 32 => Err(ConfigError {
            name: "SESSION_TOKEN_KEY",
            problem: "must be at least 32 bytes".into(),
        }),
        Some(key) if key == DEV_SESSION_TOKEN_KEY => Ok(TokenKey {
            bytes: key.into_bytes(),
            is_development: true,
        }),
        Some(key) => Ok(TokenKey {
            bytes: key.into_bytes(),
            is_development: false,
        }),
    }
}

fn absolute(cwd: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    }
}

fn non_empty(env: &dyn Env, name: &str) -> Option<String> {
    env.get(name).filter(|v| !v.trim().is_empty())
}

fn ranged(
    env: &dyn Env,
    name: &'static str,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    let raw = non_empty(env, name).unwrap_or_else(|| default.to_string());
    let value: u64 = raw.trim().parse().map_err(|_| ConfigError {
        name,
        problem: format!("is not a whole number (expected something like {default})"),
    })?;
    if value < min || value > max {
        return Err(ConfigError {
            name,
            problem: format!("must be between {min} and {max}"),
        });
    }
    Ok(value)
}

fn millis(env: &dyn Env, name: &'static str, default: u64) -> Result<Duration, ConfigError> {
    ranged(env, name, default, 1, 24 * 3600 * 1000).map(Duration::from_millis)
}

fn url_var(env: &dyn Env, name: &'static str, default: &str) -> Result<String, ConfigError> {
    let value = non_empty(env, name).unwrap_or_else(|| default.to_owned());
    let value = value.trim().trim_end_matches('/').to_owned();
    let scheme_ok = [
        "http://",
        "https://",
        "postgres://",
        "postgresql://",
        "redis://",
        "rediss://",
    ]
    .iter()
    .any(|s| value.starts_with(s));
    if !scheme_ok || value.contains(char::is_whitespace) {
        return Err(ConfigError {
            name,
            problem: "is not a URL with a known scheme".into(),
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_are_the_embedded_setup() {
        let config = Config::from_env(&env(&[])).unwrap();
        assert_eq!(config.database_url, DEFAULT_DATABASE_URL);
        assert_eq!(config.redis_url, DEFAULT_REDIS_URL);
        assert_eq!(config.brain_public_url, DEFAULT_BRAIN_PUBLIC_URL);
        assert_eq!(config.launcher, LauncherKind::Local);
        assert!(config.session_token_key.is_development);
        assert_eq!(
            config.session_token_key.bytes,
            DEV_SESSION_TOKEN_KEY.as_bytes()
        );
        assert!(DEV_SESSION_TOKEN_KEY.len() >= 32);
        assert_eq!(config.worker_bin.file_name().unwrap(), "worker");
        assert!(config.worker_bin.is_absolute());
        assert!(config.workspaces.is_absolute());
        assert!(config.workspaces.ends_with(".dev/workspaces"));
        assert_eq!(config.dial_timeout, Duration::from_secs(15));
        assert_eq!(config.token_ttl, Duration::from_secs(600));
        let windows = config.idle_windows;
        assert_eq!(windows.for_profile("light"), Some(Duration::from_secs(90)));
        assert_eq!(windows.for_profile("warm"), Some(Duration::from_secs(1200)));
        assert_eq!(windows.for_profile("none"), None);
        assert!(!format!("{config:?}").contains(DEV_SESSION_TOKEN_KEY));
    }

    #[test]
    fn bad_variables_are_named() {
        for (name, value) in [
            ("SESSION_TOKEN_KEY", "short"),
            ("BRAIN_PUBLIC_URL", "ftp://x"),
            ("RUNTIME_MANAGER_LAUNCHER", "docker"),
            ("RUNTIME_MANAGER_LAUNCHER", "kubernetes"),
            ("RUNTIME_MANAGER_IDLE_WINDOW_MS", "soon"),
            ("RUNTIME_MANAGER_DIAL_TIMEOUT_MS", "0"),
            ("RUNTIME_MANAGER_TOKEN_TTL_MS", "10"),
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
            ("SESSION_TOKEN_KEY", "0123456789abcdef0123456789abcdef"),
            ("RUNTIME_MANAGER_IDLE_WINDOW_MS", "1500"),
            ("RUNTIME_MANAGER_WORKER_BIN", "/opt/worker"),
            ("RUNTIME_MANAGER_WORKSPACES", "/tmp/ws"),
        ]))
        .unwrap();
        assert!(!config.session_token_key.is_development);
        assert_eq!(
            config.idle_windows.for_profile("warm"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(config.worker_bin, PathBuf::from("/opt/worker"));
        assert_eq!(config.workspaces, PathBuf::from("/tmp/ws"));
    }
}
