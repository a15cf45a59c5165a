//! A session's environment (SPEC W12, B1): the agent's secrets, sent by the brain to its
//! worker over the channel, as environment variables of that session's `shell` commands.
//!
//! The brain sends them in the custom MCP request [`ENV_REQUEST`] right after the
//! handshake of a session's channel (before the session is `ready`), and to a pooled
//! worker right after its bind; the worker answers once it holds them, so the first call
//! already sees them. Each request replaces the whole set. They travel only there: never in
//! the Job spec, the launcher's environment, a file or a log.
//!
//! The limits are part of the wire type: a set outside them is refused whole
//! ([`SessionEnv::check`]). The brain leaves out, before sending, any secret whose name or
//! value a worker would refuse ([`usable`]), so one odd secret never costs a session.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The custom MCP request (brain → worker) that carries a [`SessionEnv`].
pub const ENV_REQUEST: &str = "agent_runtime/env";
/// At most this many variables: an agent's whole allowance of secrets.
pub const MAX_VARS: usize = 100;
/// The longest name: a secret's name has at most 64 characters.
pub const MAX_NAME: usize = 64;
/// The largest value in bytes, as a secret's.
pub const MAX_VALUE: usize = 8 * 1024;
/// The shortest value in bytes. Every value is masked wherever it appears in tool output;
/// a shorter one would also mask every unrelated occurrence of its few bytes, so it is not
/// sent at all (the command sees the variable unset).
pub const MIN_VALUE: usize = 4;
/// Names the worker refuses because setting them would break or hijack the shell, or
/// overwrite the worker's own variables, rather than pass a credential; and (X1) names
/// that reconfigure the tools a command runs (a proxy, a CA bundle, an editor, a JVM's
/// or Ruby's options), which would let whoever sets a secret steer every other user's
/// commands of the agent. A credential is never needed under one of these names.
pub const RESERVED_NAMES: [&str; 39] = [
    "PATH",
    "HOME",
    "SHELL",
    "USER",
    "LOGNAME",
    "PWD",
    "OLDPWD",
    "IFS",
    "ENV",
    "BASH_ENV",
    "CDPATH",
    "PS4",
    "SHLVL",
    "TMPDIR",
    "TERM",
    "HOSTNAME",
    "LANG",
    "LANGUAGE",
    "PROMPT_COMMAND",
    "SHELLOPTS",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "CURL_HOME",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "SSH_AUTH_SOCK",
    "SSH_ASKPASS",
    "EDITOR",
    "VISUAL",
    "PAGER",
    "BROWSER",
    "XDG_CONFIG_HOME",
    "GNUPGHOME",
    "RUBYOPT",
    "RUBYLIB",
    "PERLLIB",
];
/// Prefixes refused for the same reasons: the dynamic loader's (`LD_PRELOAD`), the
/// locale's, the worker's own configuration (`WORKER_SESSION_TOKEN`), bash's exported
/// functions, and the tools' configuration by environment: git's (`GIT_SSH_COMMAND`,
/// `GIT_CONFIG_*`), Python's (`PYTHONPATH`, `PYTHONSTARTUP`), Node's (`NODE_OPTIONS`),
/// npm's, pip's, Perl's (`PERL5OPT`), Ruby's gems, Cargo's and Rust's.
pub const RESERVED_PREFIXES: [&str; 14] = [
    "LD_",
    "LC_",
    "WORKER_",
    "BASH_FUNC_",
    "GIT_",
    "PYTHON",
    "NODE_",
    "NPM_CONFIG_",
    "PIP_",
    "PERL5",
    "GEM_",
    "CARGO_",
    "RUSTC",
    "DOCKER_",
];
/// Suffixes refused: every proxy setting (`HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`), which
/// would route every other user's traffic through whoever set it.
pub const RESERVED_SUFFIXES: [&str; 1] = ["_PROXY"];

/// The params of [`ENV_REQUEST`]: variable name → value. `Debug` shows names only.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionEnv {
    pub vars: BTreeMap<String, String>,
}

impl std::fmt::Debug for SessionEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionEnv")
            .field("names", &self.vars.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Why a [`SessionEnv`] is refused; names no value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvRefusal {
    TooMany,
    BadName,
    ReservedName,
    BadValue,
}

impl EnvRefusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TooMany => "too_many",
            Self::BadName => "bad_name",
            Self::ReservedName => "reserved_name",
            Self::BadValue => "bad_value",
        }
    }
}

/// `^[A-Z_][A-Z0-9_]{0,63}$`: a name a POSIX shell can expand.
pub fn valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=MAX_NAME).contains(&bytes.len())
        && !bytes[0].is_ascii_digit()
        && bytes
            .iter()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_')
}

pub fn reserved(name: &str) -> bool {
    RESERVED_NAMES.contains(&name)
        || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
        || RESERVED_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// `MIN_VALUE..=MAX_VALUE` bytes, no NUL (an environment cannot hold one).
pub fn valid_value(value: &str) -> bool {
    (MIN_VALUE..=MAX_VALUE).contains(&value.len()) && !value.contains('\0')
}

/// Whether one variable passes: what the brain checks before it sends a secret.
pub fn usable(name: &str, value: &str) -> Result<(), EnvRefusal> {
    if !valid_name(name) {
        return Err(EnvRefusal::BadName);
    }
    if reserved(name) {
        return Err(EnvRefusal::ReservedName);
    }
    if !valid_value(value) {
        return Err(EnvRefusal::BadValue);
    }
    Ok(())
}

impl SessionEnv {
    /// The whole set within the limits, or why not.
    pub fn check(&self) -> Result<(), EnvRefusal> {
        if self.vars.len() > MAX_VARS {
            return Err(EnvRefusal::TooMany);
        }
        self.vars
            .iter()
            .try_for_each(|(name, value)| usable(name, value))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> SessionEnv {
        SessionEnv {
            vars: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn the_wire_form_is_closed() {
        let parsed: SessionEnv =
            serde_json::from_value(serde_json::json!({"vars": {"MY_TOKEN": "abcd"}})).unwrap();
        assert_eq!(parsed, env(&[("MY_TOKEN", "abcd")]));
        assert!(
            serde_json::from_value::<SessionEnv>(serde_json::json!({"vars": {}, "more": 1}))
                .is_err()
        );
        assert_eq!(
            format!("{parsed:?}"),
            r#"SessionEnv { names: ["MY_TOKEN"] }"#
        );
    }

    #[test]
    fn credentials_keep_their_ordinary_names() {
        for name in [
            "GITHUB_TOKEN",
            "OPENAI_API_KEY",
            "SSH_PRIVATE_KEY",
            "PROXY_PASSWORD",
        ] {
            assert!(!reserved(name), "{name}");
        }
    }

    #[test]
    fn names_values_and_counts_are_bounded() {
        assert_eq!(
            env(&[("MY_TOKEN", "abcd"), ("_X1", "wxyz")]).check(),
            Ok(())
        );
        for bad in ["", "1ABC", "lower", "A-B", &"A".repeat(65)] {
            assert_eq!(
                env(&[(bad, "abcd")]).check(),
                Err(EnvRefusal::BadName),
                "{bad}"
            );
        }
        for reserved in [
            "PATH",
            "HOME",
            "IFS",
            "LD_PRELOAD",
            "LC_ALL",
            "WORKER_SESSION_TOKEN",
            "HTTPS_PROXY",
            "NO_PROXY",
            "GIT_SSH_COMMAND",
            "PYTHONPATH",
            "NODE_OPTIONS",
            "JAVA_TOOL_OPTIONS",
            "SSL_CERT_FILE",
        ] {
            assert_eq!(
                env(&[(reserved, "abcd")]).check(),
                Err(EnvRefusal::ReservedName),
                "{reserved}"
            );
        }
        let long = "v".repeat(MAX_VALUE + 1);
        for bad in ["abc", "ab\0cd", long.as_str()] {
            assert_eq!(env(&[("A", bad)]).check(), Err(EnvRefusal::BadValue));
        }
        let many = SessionEnv {
            vars: (0..=MAX_VARS)
                .map(|i| (format!("V{i}"), "abcd".to_owned()))
                .collect(),
        };
        assert_eq!(many.check(), Err(EnvRefusal::TooMany));
    }
}
