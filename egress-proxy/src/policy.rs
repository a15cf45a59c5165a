//! What one session's commands may reach and which credentials the proxy adds: the
//! session's configuration, as the launcher hands it over (closed wire types, bounded).

use serde::Deserialize;

pub use domain::egress::{HostRule, placeholder};
use domain::egress::{MAX_PATTERN, MAX_RULES};

use crate::ProxyError;

/// At most this many egress secrets per session.
pub const MAX_SECRETS: usize = 64;
/// The longest secret value.
pub const MAX_VALUE: usize = 16 * 1024;

fn rule(raw: &str) -> Result<HostRule, ProxyError> {
    HostRule::parse(raw).map_err(ProxyError::Policy)
}

/// One session's egress configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionPolicy {
    /// The hosts the commands may reach (`host`, `*.suffix`, each with an optional
    /// `:port`; without a port, 80 and 443). `None`: every host (the behaviour before
    /// W14); the address rule applies either way.
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    #[serde(default)]
    pub secrets: Vec<EgressSecret>,
    /// Loopback, private and other non-public addresses reachable (tests, on-premise
    /// installs: `EGRESS_ALLOW_PRIVATE_NETWORKS`). Metadata addresses never are.
    #[serde(default)]
    pub allow_private_networks: bool,
}

/// A credential the proxy sets on requests to its hosts; the sandbox holds only
/// [`placeholder`] under its name.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSecret {
    pub name: String,
    pub value: String,
    pub hosts: Vec<String>,
    pub header: String,
    /// The header's value, `{value}` standing for the secret (`Bearer {value}`).
    #[serde(default = "plain_format")]
    pub format: String,
}

fn plain_format() -> String {
    "{value}".to_owned()
}

impl std::fmt::Debug for EgressSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressSecret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// A [`SessionPolicy`] checked and parsed once.
#[derive(Debug)]
pub struct Policy {
    allow: Option<Vec<HostRule>>,
    secrets: Vec<(EgressSecret, Vec<HostRule>)>,
    pub allow_private_networks: bool,
}

impl Policy {
    pub fn new(config: SessionPolicy) -> Result<Self, ProxyError> {
        let allow = match config.allow {
            Some(rules) if rules.len() > MAX_RULES => {
                return Err(ProxyError::Policy(format!(
                    "at most {MAX_RULES} allowlist rules"
                )));
            }
            Some(rules) => Some(rules.iter().map(|r| rule(r)).collect::<Result<_, _>>()?),
            None => None,
        };
        if config.secrets.len() > MAX_SECRETS {
            return Err(ProxyError::Policy(format!(
                "at most {MAX_SECRETS} egress secrets"
            )));
        }
        let mut secrets = Vec::with_capacity(config.secrets.len());
        for secret in config.secrets {
            check_secret(&secret)?;
            let hosts = secret
                .hosts
                .iter()
                .map(|h| rule(h))
                .collect::<Result<_, _>>()?;
            secrets.push((secret, hosts));
        }
        Ok(Self {
            allow,
            secrets,
            allow_private_networks: config.allow_private_networks,
        })
    }

    /// Whether the allowlist lets the commands reach `host:port`. A secret's own hosts
    /// are reachable too: a credential for a host the agent may not reach is pointless.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        match &self.allow {
            None => true,
            Some(rules) => {
                rules.iter().any(|r| r.matches(host, port)) || self.has_secrets(host, port)
            }
        }
    }

    /// The egress secrets meant for `host:port`.
    pub fn secrets_for<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> impl Iterator<Item = &'a EgressSecret> + 'a {
        self.secrets
            .iter()
            .filter(move |(_, rules)| rules.iter().any(|r| r.matches(host, port)))
            .map(|(s, _)| s)
    }

    pub fn has_secrets(&self, host: &str, port: u16) -> bool {
        self.secrets_for(host, port).next().is_some()
    }
}

fn check_secret(secret: &EgressSecret) -> Result<(), ProxyError> {
    let bad = |why: &str| ProxyError::Policy(format!("egress secret {:?}: {why}", secret.name));
    if secret.name.is_empty()
        || secret.name.len() > 128
        || !secret
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(bad("a name of letters, digits and '_'"));
    }
    if secret.value.is_empty() || secret.value.len() > MAX_VALUE {
        return Err(bad("an empty or too long value"));
    }
    if secret.hosts.is_empty() || secret.hosts.len() > MAX_RULES {
        return Err(bad("between 1 and 256 hosts"));
    }
    if http::HeaderName::from_bytes(secret.header.as_bytes()).is_err() {
        return Err(bad("not a header name"));
    }
    if !secret.format.contains("{value}") || secret.format.len() > MAX_PATTERN {
        return Err(bad("a format holding {value}"));
    }
    let full = secret.format.replace("{value}", &secret.value);
    if http::HeaderValue::from_str(&full).is_err() {
        return Err(bad("not a valid header value"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_opens_its_own_hosts_and_is_checked() {
        let config: SessionPolicy = serde_json::from_value(serde_json::json!({
            "allow": ["docs.rs"],
            "secrets": [{"name": "GH", "value": "ghp_x1", "hosts": ["api.github.com"],
                         "header": "Authorization", "format": "Bearer {value}"}]
        }))
        .unwrap();
        let policy = Policy::new(config).unwrap();
        assert!(policy.allows("docs.rs", 443) && policy.allows("api.github.com", 443));
        assert!(!policy.allows("evil.example", 443));
        assert_eq!(policy.secrets_for("api.github.com", 443).count(), 1);
        assert_eq!(policy.secrets_for("docs.rs", 443).count(), 0);

        let bad = |secret: serde_json::Value| {
            let config: SessionPolicy =
                serde_json::from_value(serde_json::json!({ "secrets": [secret] })).unwrap();
            Policy::new(config).is_err()
        };
        let base = serde_json::json!({"name": "K", "value": "v1234", "hosts": ["a.com"],
                                      "header": "X-Key"});
        assert!(!bad(base.clone()));
        for (field, value) in [
            ("name", serde_json::json!("a-b")),
            ("value", serde_json::json!("line\nbreak")),
            ("header", serde_json::json!("bad header")),
            ("format", serde_json::json!("Bearer")),
            ("hosts", serde_json::json!([])),
        ] {
            let mut secret = base.clone();
            secret[field] = value;
            assert!(bad(secret), "{field}");
        }
        assert!(serde_json::from_value::<SessionPolicy>(serde_json::json!({"alow": []})).is_err());
    }
}
