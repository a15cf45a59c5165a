//! Reading a binary's configuration from its environment: the source of variables
//! ([`Env`]: the process environment, or a map in tests), the error that names a bad
//! variable ([`ConfigError`]), and the parsing helpers the brain, the runtime-manager and
//! the worker share. Each binary's `config.rs` says which variables it reads and what
//! they mean; this crate only says how a value is read.
//!
//! **Architecture Invariant:** an error names the variable, never its value (it may be a
//! secret): [`ConfigError`] has no field for it.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

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

/// A map of variables from `(name, value)` pairs: what tests pass as [`Env`].
pub fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A variable that is missing or unusable. The message names the variable, never its
/// value (it may be a secret).
#[derive(Debug, thiserror::Error)]
#[error("configuration error: {name} {problem}")]
pub struct ConfigError {
    pub name: &'static str,
    pub problem: String,
}

/// The variable's value, if it is set to something other than blanks (untrimmed).
pub fn non_empty(env: &dyn Env, name: &str) -> Option<String> {
    env.get(name).filter(|v| !v.trim().is_empty())
}

/// [`non_empty`], trimmed.
pub fn trimmed(env: &dyn Env, name: &str) -> Option<String> {
    non_empty(env, name).map(|v| v.trim().to_owned())
}

/// The variable parsed as `T`, or `default` (parsed the same way) when unset.
pub fn parse<T: FromStr>(
    env: &dyn Env,
    name: &'static str,
    default: &str,
) -> Result<T, ConfigError> {
    let raw = non_empty(env, name).unwrap_or_else(|| default.to_owned());
    raw.trim().parse().map_err(|_| ConfigError {
        name,
        problem: format!("is not valid (expected something like {default})"),
    })
}

/// A whole number between `min` and `max` (inclusive), or `default` when unset.
pub fn ranged<T>(
    env: &dyn Env,
    name: &'static str,
    default: T,
    min: T,
    max: T,
) -> Result<T, ConfigError>
where
    T: FromStr + PartialOrd + std::fmt::Display + Copy,
{
    let raw = non_empty(env, name).unwrap_or_else(|| default.to_string());
    let value: T = raw.trim().parse().map_err(|_| ConfigError {
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

/// A duration in milliseconds, from 1 ms to a day, or `default` ms when unset.
pub fn millis(env: &dyn Env, name: &'static str, default: u64) -> Result<Duration, ConfigError> {
    ranged(env, name, default, 1, 24 * 3600 * 1000).map(Duration::from_millis)
}

/// A URL of a scheme the binaries speak (HTTP, Postgres, Redis), without a trailing `/`,
/// or `default` when unset.
pub fn url_var(env: &dyn Env, name: &'static str, default: &str) -> Result<String, ConfigError> {
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

/// A comma-separated list of Redis node URLs (`REDIS_CLUSTER_URLS`: a cluster's seed
/// nodes), each checked as [`url_var`] checks one; `None` when unset or blank.
pub fn redis_urls(env: &dyn Env, name: &'static str) -> Result<Option<Vec<String>>, ConfigError> {
    let Some(list) = non_empty(env, name) else {
        return Ok(None);
    };
    let mut urls = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let url = entry.trim_end_matches('/');
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            return Err(ConfigError {
                name,
                problem: "every entry must be a redis:// URL".into(),
            });
        }
        urls.push(url.to_owned());
    }
    Ok((!urls.is_empty()).then_some(urls))
}

/// The variable that marks a development setup (`make dev` sets it): the binaries then
/// start without a `SESSION_TOKEN_KEY`, using the one kept in [`DEV_KEY_FILE`].
pub const DEV_MODE: &str = "AGENT_RUNTIME_DEV";
/// Where development mode keeps its session-token key, relative to the working directory
/// (the brain's and the runtime-manager's under `make dev`: the clone's root).
pub const DEV_KEY_FILE: &str = ".dev/session-token-key";

/// The key that signs and verifies workers' session tokens (`SESSION_TOKEN_KEY`).
/// `Debug` never shows it.
#[derive(Clone)]
pub struct SessionTokenKey {
    pub bytes: Vec<u8>,
    /// Read from [`DEV_KEY_FILE`] in development mode (the variable was unset).
    pub development: bool,
}

impl std::fmt::Debug for SessionTokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTokenKey")
            .field("bytes", &"<redacted>")
            .field("development", &self.development)
            .finish()
    }
}

/// Whether [`DEV_MODE`] is `true` (unset is `false`).
pub fn dev_mode(env: &dyn Env) -> Result<bool, ConfigError> {
    parse(env, DEV_MODE, "false").map_err(|_| ConfigError {
        name: DEV_MODE,
        problem: "must be true or false".into(),
    })
}

/// `SESSION_TOKEN_KEY`, used exactly as given (at least 32 bytes). Unset, the start is
/// refused, unless in development mode: there is no default, since a key anyone can read
/// lets anyone mint a worker token for any session.
pub fn session_token_key(env: &dyn Env) -> Result<SessionTokenKey, ConfigError> {
    const NAME: &str = "SESSION_TOKEN_KEY";
    match env.get(NAME).filter(|v| !v.is_empty()) {
        Some(key) if key.len() < 32 => Err(ConfigError {
            name: NAME,
            problem: "must be at least 32 bytes".into(),
        }),
        Some(key) => Ok(SessionTokenKey {
            bytes: key.into_bytes(),
            development: false,
        }),
        None if dev_mode(env)? => Ok(SessionTokenKey {
            bytes: kept_dev_key(std::path::Path::new(DEV_KEY_FILE)).map_err(|e| ConfigError {
                name: DEV_MODE,
                problem: format!("is set, but {DEV_KEY_FILE} cannot be kept: {}", e.kind()),
            })?,
            development: true,
        }),
        None => Err(ConfigError {
            name: NAME,
            problem: format!(
                "must be set (at least 32 bytes, the same in the brain and the \
                 runtime-manager; for example `openssl rand -hex 32`), or {DEV_MODE}=true \
                 for a development key kept in {DEV_KEY_FILE}"
            ),
        }),
    }
}

/// The key in `file`, made first (64 random hex digits, readable by its owner only) when
/// there is none. The brain and the runtime-manager may start at once: the key is written
/// aside and linked into place, so both read whichever landed first.
fn kept_dev_key(file: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    if !file.exists() {
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut random = [0u8; 32];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut random)?;
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let aside = file.with_extension(format!("{}.tmp", std::process::id()));
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&aside)?;
        out.write_all(hex.as_bytes())?;
        drop(out);
        let linked = std::fs::hard_link(&aside, file);
        std::fs::remove_file(&aside)?;
        if let Err(e) = linked
            && e.kind() != std::io::ErrorKind::AlreadyExists
        {
            return Err(e);
        }
    }
    let key = std::fs::read_to_string(file)?.trim().as_bytes().to_vec();
    if key.len() < 32 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "shorter than 32 bytes",
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    use vars as env;

    #[test]
    fn redis_url_lists_are_split_trimmed_and_checked() {
        let vars = env(&[
            ("LIST", " redis://a:1/ , ,redis://b:2"),
            ("BAD", "redis://a:1,http://b:2"),
            ("BLANK", " , "),
        ]);
        assert_eq!(
            redis_urls(&vars, "LIST").unwrap(),
            Some(vec!["redis://a:1".to_owned(), "redis://b:2".to_owned()])
        );
        assert_eq!(redis_urls(&vars, "BAD").unwrap_err().name, "BAD");
        assert_eq!(redis_urls(&vars, "BLANK").unwrap(), None);
        assert_eq!(redis_urls(&vars, "MISSING").unwrap(), None);
    }

    #[test]
    fn the_session_token_key_is_required_outside_development_mode() {
        let err = session_token_key(&env(&[])).unwrap_err();
        assert_eq!(err.name, "SESSION_TOKEN_KEY");
        assert!(err.to_string().contains(DEV_MODE), "{err}");
        let err = session_token_key(&env(&[(DEV_MODE, "false")])).unwrap_err();
        assert_eq!(err.name, "SESSION_TOKEN_KEY");
        let err = session_token_key(&env(&[(DEV_MODE, "yes")])).unwrap_err();
        assert_eq!(err.name, DEV_MODE);
        let err =
            session_token_key(&env(&[("SESSION_TOKEN_KEY", "secret-but-short")])).unwrap_err();
        assert_eq!(err.name, "SESSION_TOKEN_KEY");
        assert!(!err.to_string().contains("secret-but-short"), "{err}");
        let given = " 0123456789abcdef0123456789abcdef";
        let key =
            session_token_key(&env(&[("SESSION_TOKEN_KEY", given), (DEV_MODE, "true")])).unwrap();
        assert_eq!(
            key.bytes,
            given.as_bytes(),
            "untrimmed, and preferred to the kept one"
        );
        assert!(!key.development);
        assert!(!format!("{key:?}").contains("0123456789abcdef"));
    }

    #[test]
    fn the_development_key_is_made_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("envcfg-dev-key-{}", std::process::id()));
        let file = dir.join(".dev/session-token-key");
        let first = kept_dev_key(&file).unwrap();
        assert_eq!(first.len(), 64);
        assert!(first.iter().all(u8::is_ascii_hexdigit));
        assert_eq!(kept_dev_key(&file).unwrap(), first, "a restart keeps it");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let other = kept_dev_key(&dir.join("elsewhere/key")).unwrap();
        assert_ne!(other, first, "each is random");
        std::fs::write(&file, "short").unwrap();
        assert!(kept_dev_key(&file).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn blanks_are_unset_and_values_are_trimmed() {
        let vars = env(&[("BLANK", "  "), ("SET", " x ")]);
        assert_eq!(non_empty(&vars, "BLANK"), None);
        assert_eq!(non_empty(&vars, "MISSING"), None);
        assert_eq!(non_empty(&vars, "SET").as_deref(), Some(" x "));
        assert_eq!(trimmed(&vars, "SET").as_deref(), Some("x"));
    }

    #[test]
    fn numbers_durations_and_urls_are_checked_and_never_echoed() {
        let vars = env(&[
            ("N", " 7 "),
            ("BIG", "70"),
            ("WORD", "secret-value"),
            ("URL", "https://x.example/v1/"),
            ("ODD", "ftp://secret-value"),
        ]);
        assert_eq!(ranged(&vars, "N", 1, 1, 10).unwrap(), 7);
        assert_eq!(ranged(&vars, "UNSET", 3, 1, 10).unwrap(), 3);
        let too_big = ranged(&vars, "BIG", 1, 1, 10).unwrap_err();
        assert_eq!(
            too_big.to_string(),
            "configuration error: BIG must be between 1 and 10"
        );
        let word = millis(&vars, "WORD", 500).unwrap_err();
        assert_eq!(word.name, "WORD");
        assert!(!word.to_string().contains("secret-value"), "{word}");
        assert_eq!(
            millis(&vars, "UNSET", 500).unwrap(),
            Duration::from_millis(500)
        );
        assert!(parse::<bool>(&vars, "WORD", "false").is_err());
        assert_eq!(url_var(&vars, "URL", "").unwrap(), "https://x.example/v1");
        let odd = url_var(&vars, "ODD", "").unwrap_err();
        assert!(!odd.to_string().contains("secret-value"), "{odd}");
    }
}
