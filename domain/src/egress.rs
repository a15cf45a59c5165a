//! Egress rules (W13, W14; docs/design/egress.md) that the API, the store and the egress
//! proxy share: host patterns, an agent's allowlist, an egress secret's header, and the
//! placeholder a sandbox holds instead of an egress secret's value.

use serde::{Deserialize, Serialize};

/// At most this many allowlist rules, and hosts per egress secret.
pub const MAX_RULES: usize = 256;
/// The longest host pattern and header format.
pub const MAX_PATTERN: usize = 260;

/// What a command's environment holds under an egress secret's name: recognisable, and
/// replaced by the value only on the way to the secret's hosts.
pub fn placeholder(name: &str) -> String {
    format!("egress-placeholder-{name}")
}

/// An agent's egress allowlist (W14): `allow` absent on the agent is every host, as
/// before W14; the address rule applies either way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"allow": ["api.github.com", "*.pypi.org", "registry.npmjs.org:443"]}))]
pub struct AgentEgress {
    /// The hosts the agent's commands may reach: `host`, `*.suffix` (any deeper name) and
    /// an optional `:port` (without one, 80 and 443); at most 256. An egress secret's own
    /// hosts are reachable too. `[]` reaches only those.
    pub allow: Vec<String>,
}

impl AgentEgress {
    /// The message names the field (`egress.allow`) and the rule.
    pub fn validate(&self) -> Result<(), String> {
        check_hosts("egress.allow", &self.allow, 0)
    }
}

/// How the egress proxy sets an egress secret (W13): on requests to `hosts`, the header
/// `header` with the value `format` (`{value}` standing for the secret); the sandbox
/// holds only [`placeholder`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"hosts": ["api.github.com"], "header": "Authorization", "format": "Bearer {value}"}))]
pub struct SecretEgress {
    /// Host patterns as in an agent's `egress.allow`, 1 to 256.
    pub hosts: Vec<String>,
    /// A header name (`Authorization`, `X-Api-Key`).
    pub header: String,
    /// The header's value; `{value}` stands for the secret. `{value}` by default.
    #[serde(default = "plain_format")]
    pub format: String,
}

fn plain_format() -> String {
    "{value}".to_owned()
}

impl SecretEgress {
    /// Checks the egress settings with the secret's `value` (which must fit a header).
    /// The message names the field, never the value.
    pub fn validate(&self, value: &str) -> Result<(), String> {
        check_hosts("egress.hosts", &self.hosts, 1)?;
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if self.header.is_empty() || self.header.len() > 128 || !self.header.chars().all(token) {
            return Err("egress.header must be a header name (letters, digits, '-')".into());
        }
        let header_text = |s: &str| s.chars().all(|c| c == '\t' || (' '..='~').contains(&c));
        if !self.format.contains("{value}")
            || self.format.len() > MAX_PATTERN
            || !header_text(&self.format)
        {
            return Err(format!(
                "egress.format must hold {{value}}, be printable ASCII and at most \
                 {MAX_PATTERN} bytes"
            ));
        }
        if !header_text(value) || value.trim() != value {
            return Err(
                "value of an egress secret must fit a header: printable ASCII, no leading \
                 or trailing space"
                    .into(),
            );
        }
        Ok(())
    }
}

fn check_hosts(field: &str, hosts: &[String], min: usize) -> Result<(), String> {
    if hosts.len() < min || hosts.len() > MAX_RULES {
        return Err(format!(
            "{field} must hold {min} to {MAX_RULES} host patterns"
        ));
    }
    for raw in hosts {
        HostRule::parse(raw).map_err(|why| format!("{field}: {why}"))?;
    }
    Ok(())
}

/// A host pattern: an exact name (or address) or a `*.` suffix, and the ports it opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRule {
    host: String,
    wildcard: bool,
    /// `None`: 80 and 443.
    port: Option<u16>,
}

impl HostRule {
    /// The message quotes the pattern (never a secret) and says what is wrong.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("host pattern {raw:?}: {why}");
        if raw.is_empty() || raw.len() > MAX_PATTERN {
            return Err(bad("empty or too long"));
        }
        let (host, port) = split_port(raw).ok_or_else(|| bad("invalid port"))?;
        let (host, wildcard) = match host.strip_prefix("*.") {
            Some(rest) => (rest, true),
            None => (host, false),
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let valid = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
        if !valid {
            return Err(bad("only letters, digits, '.', '-' and a leading '*.'"));
        }
        Ok(Self {
            host,
            wildcard,
            port,
        })
    }

    pub fn matches(&self, host: &str, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => port == 80 || port == 443,
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host_ok = if self.wildcard {
            host.strip_suffix(&self.host)
                .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
        } else {
            host == self.host
        };
        port_ok && host_ok
    }
}

/// `host[:port]`, an IPv6 address in brackets; `None` for a port that is not one.
fn split_port(raw: &str) -> Option<(&str, Option<u16>)> {
    let colon = match raw.rfind(':') {
        Some(i) if !raw[i..].contains(']') && raw[..i].matches(':').count() == 0 => i,
        Some(i) if raw.starts_with('[') && raw[..i].ends_with(']') => i,
        _ => return Some((raw, None)),
    };
    let port = raw[colon + 1..].parse::<u16>().ok().filter(|p| *p != 0)?;
    Some((&raw[..colon], Some(port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> HostRule {
        HostRule::parse(s).unwrap()
    }

    #[test]
    fn host_rules_match_names_wildcards_and_ports() {
        assert!(rule("api.github.com").matches("API.GitHub.com.", 443));
        assert!(rule("api.github.com").matches("api.github.com", 80));
        assert!(!rule("api.github.com").matches("api.github.com", 8443));
        assert!(!rule("api.github.com").matches("evilapi.github.com", 443));
        assert!(rule("*.example.com").matches("a.b.example.com", 443));
        assert!(!rule("*.example.com").matches("example.com", 443));
        assert!(!rule("*.example.com").matches("badexample.com", 443));
        assert!(rule("localhost:8080").matches("localhost", 8080));
        assert!(!rule("localhost:8080").matches("localhost", 80));
        assert!(rule("127.0.0.1:9").matches("127.0.0.1", 9));
        assert!(rule("[::1]:9").matches("[::1]", 9));
        for bad in ["", "a b", "host:0", "host:x", "*.", "ex/ample"] {
            assert!(HostRule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn egress_settings_are_checked_field_by_field_without_quoting_the_value() {
        let ok = SecretEgress {
            hosts: vec!["api.github.com".into()],
            header: "Authorization".into(),
            format: "Bearer {value}".into(),
        };
        assert!(ok.validate("ghp_abc").is_ok());
        let cases = [
            (
                SecretEgress {
                    hosts: vec![],
                    ..ok.clone()
                },
                "egress.hosts",
            ),
            (
                SecretEgress {
                    hosts: vec!["a b".into()],
                    ..ok.clone()
                },
                "egress.hosts",
            ),
            (
                SecretEgress {
                    header: "bad header".into(),
                    ..ok.clone()
                },
                "egress.header",
            ),
            (
                SecretEgress {
                    format: "Bearer".into(),
                    ..ok.clone()
                },
                "egress.format",
            ),
        ];
        for (egress, field) in cases {
            let err = egress.validate("ghp_abc").unwrap_err();
            assert!(err.starts_with(field), "{err}");
        }
        let err = ok.validate("line\nbreak-secret").unwrap_err();
        assert!(
            err.starts_with("value") && !err.contains("break-secret"),
            "{err}"
        );
        assert!(AgentEgress { allow: vec![] }.validate().is_ok());
        let many = AgentEgress {
            allow: vec!["a.com".into(); MAX_RULES + 1],
        };
        assert!(many.validate().unwrap_err().starts_with("egress.allow"));
        assert!(serde_json::from_str::<AgentEgress>(r#"{"alow": []}"#).is_err());
    }
}
