//! Static credentials of a connector (SPEC B1, B2): the `headers` of a streamable HTTP
//! connector and the `env` of a stdio one.
//!
//! Each value is a template: literal text with `{{secret:NAME}}` references, for example
//! `Bearer {{secret:LINEAR_TOKEN}}`. A reference names a secret of the turn's agent (set with
//! `secret_set`) or, when the agent has none of that name, of its team (`PUT
//! /v1/secrets/{secret_name}`). The connector row keeps the template only; [`resolve`] replaces the
//! references when the brain connects, and what it returns goes into the connection and
//! nowhere else: not into the API, a log line, an error, a status or the model's context
//! (X4). The values also mask the connection's results ([`Resolved::masks`]), so a server
//! that echoes a credential back does not put it in the model's context either. A reference that resolves to nothing makes the connector `down` with the class
//! `secret_missing`; the turn goes on without it.
//!
//! Credential-bearing names (`Authorization`, `Cookie`, anything that says token, key,
//! secret, password or auth) must take their value from a secret, so a token is never kept
//! in the clear in a connector that the API echoes back.

use std::collections::{BTreeMap, HashSet};

use channel::mask::Masks;
use protocol::{AgentId, TeamId};
use reqwest::header::{HeaderName, HeaderValue};

use crate::tools::secrets::valid_name as valid_secret_name;
use store::{CALL_BOUND, SecretsError, Store};

/// Headers or variables per connector.
pub const MAX_ENTRIES: usize = 32;
/// The longest template, in bytes.
pub const MAX_TEMPLATE_BYTES: usize = 8 * 1024;
const MAX_ENV_NAME: usize = 128;

/// Headers the MCP transport sets itself: a connector may not replace them.
const RESERVED_HEADERS: [&str; 11] = [
    "accept",
    "connection",
    "content-length",
    "content-type",
    "host",
    "last-event-id",
    "mcp-protocol-version",
    "mcp-session-id",
    "te",
    "transfer-encoding",
    "upgrade",
];

const OPEN: &str = "{{secret:";
const CLOSE: &str = "}}";

/// One part of a template.
#[derive(Debug, PartialEq, Eq)]
enum Piece<'a> {
    Text(&'a str),
    Secret(&'a str),
}

/// Splits a template into text and references; the error says what is wrong with it.
fn pieces(template: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        if start > 0 {
            out.push(Piece::Text(&rest[..start]));
        }
        let tail = &rest[start..];
        let Some(inner) = tail.strip_prefix(OPEN) else {
            return Err("`{{` may only open a `{{secret:NAME}}` reference".into());
        };
        let end = inner
            .find(CLOSE)
            .ok_or("a `{{secret:` reference is not closed with `}}`")?;
        let name = &inner[..end];
        if !valid_secret_name(name) {
            return Err(format!(
                "`{{{{secret:{name}}}}}` does not name a secret: names are 1 to 64 of A-Z, 0-9 and _"
            ));
        }
        out.push(Piece::Secret(name));
        rest = &inner[end + CLOSE.len()..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    Ok(out)
}

fn references(template: &str) -> impl Iterator<Item = &str> {
    pieces(template)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| match p {
            Piece::Secret(name) => Some(name),
            Piece::Text(_) => None,
        })
}

/// Whether a header or variable of this name carries a credential, so its value must come
/// from a secret.
fn credential_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["auth", "token", "key", "secret", "password", "cookie"]
        .iter()
        .any(|word| name.contains(word))
}

fn check_template(what: &str, name: &str, template: &str) -> Result<(), String> {
    if template.len() > MAX_TEMPLATE_BYTES {
        return Err(format!(
            "{what} `{name}`: a value has at most {MAX_TEMPLATE_BYTES} bytes"
        ));
    }
    let parts = pieces(template).map_err(|e| format!("{what} `{name}`: {e}"))?;
    if credential_name(name) && !parts.iter().any(|p| matches!(p, Piece::Secret(_))) {
        return Err(format!(
            "{what} `{name}` carries a credential: take it from a secret, e.g. \
             \"Bearer {{{{secret:{}}}}}\"",
            suggested_secret(name)
        ));
    }
    Ok(())
}

fn suggested_secret(name: &str) -> String {
    let upper: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if upper.is_empty() {
        "TOKEN".into()
    } else {
        upper
    }
}

/// Checks the `headers` of a new connector: valid HTTP names, none the transport sets, no
/// two that differ only in case, at most [`MAX_ENTRIES`], valid templates, and
/// credentials only from secrets.
pub fn check_headers(headers: &BTreeMap<String, String>) -> Result<(), String> {
    if headers.len() > MAX_ENTRIES {
        return Err(format!("at most {MAX_ENTRIES} headers"));
    }
    let mut seen = HashSet::new();
    for (name, template) in headers {
        let parsed = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("`{name}` is not a valid HTTP header name"))?;
        if RESERVED_HEADERS.contains(&parsed.as_str()) {
            return Err(format!(
                "header `{name}` is set by the MCP transport and cannot be replaced"
            ));
        }
        if !seen.insert(parsed) {
            return Err(format!(
                "header `{name}` is given twice (names ignore case)"
            ));
        }
        check_template("header", name, template)?;
        // A literal part must be valid in a header already; resolved values are checked
        // again at connect time.
        let literal: String = pieces(template)?
            .into_iter()
            .filter_map(|p| match p {
                Piece::Text(t) => Some(t),
                Piece::Secret(_) => None,
            })
            .collect();
        if HeaderValue::from_str(&literal).is_err() {
            return Err(format!(
                "header `{name}`: the value may hold visible ASCII, spaces and tabs only"
            ));
        }
    }
    Ok(())
}

/// Checks the `env` of a new stdio connector: names `^[A-Za-z_][A-Za-z0-9_]{0,127}$`, at
/// most [`MAX_ENTRIES`], valid templates without NUL, credentials only from secrets.
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), String> {
    if env.len() > MAX_ENTRIES {
        return Err(format!("at most {MAX_ENTRIES} environment variables"));
    }
    for (name, template) in env {
        let valid = (1..=MAX_ENV_NAME).contains(&name.len())
            && name
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(format!(
                "`{name}` is not a valid variable name (^[A-Za-z_][A-Za-z0-9_]{{0,127}}$)"
            ));
        }
        if template.contains('\0') {
            return Err(format!("variable `{name}`: the value may not hold NUL"));
        }
        check_template("variable", name, template)?;
    }
    Ok(())
}

/// Resolved credentials: what goes into one connection. `Debug` shows names only.
#[derive(Default)]
pub struct Resolved {
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub env: Vec<(String, String)>,
    /// The secrets the templates named, by name: what the connection's results are
    /// masked with.
    secrets: BTreeMap<String, String>,
}

/// The name an OAuth access token is masked as: lower case, so no secret can hold it.
const BEARER_MASK: &str = "oauth_token";

impl Resolved {
    /// What a session's results are masked with (SPEC W12, B1): every secret filled into
    /// its headers or environment, and the OAuth access token it sends, if any. A server
    /// that echoes a request or quotes it in an error must not hand a credential to the
    /// model, the transcript or the events stream.
    pub fn masks(&self, bearer: Option<&str>) -> Masks {
        Masks::of(
            self.secrets
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str()))
                .chain(bearer.map(|token| (BEARER_MASK, token))),
        )
    }

    /// Whether the connector sends its own `Authorization` header (then no OAuth grant is
    /// used).
    pub fn has_authorization(&self) -> bool {
        self.headers
            .iter()
            .any(|(name, _)| name == reqwest::header::AUTHORIZATION)
    }
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field(
                "headers",
                &self.headers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("env", &self.env.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .finish()
    }
}

/// Fills the templates of a connector for a turn of `agent`. The error is a class for logs
/// and the connector status, never a value.
pub async fn resolve(
    store: &Store,
    team: TeamId,
    agent: AgentId,
    headers: &BTreeMap<String, String>,
    env: &BTreeMap<String, String>,
) -> Result<Resolved, &'static str> {
    let names: Vec<String> = headers
        .values()
        .chain(env.values())
        .flat_map(|template| references(template))
        .map(str::to_owned)
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let values = if names.is_empty() {
        Default::default()
    } else {
        tokio::time::timeout(CALL_BOUND, store.resolve_secrets(team, agent, &names))
            .await
            .map_err(|_| "secrets_unavailable")?
            .map_err(|e| match e {
                SecretsError::NotConfigured => "secrets_not_configured",
                SecretsError::Crypto => "secret_undecryptable",
                SecretsError::TooMany | SecretsError::Store(_) => "secrets_unavailable",
            })?
    };
    let mut secrets = BTreeMap::new();
    let mut fill = |template: &str| -> Result<String, &'static str> {
        let mut out = String::with_capacity(template.len());
        for piece in pieces(template).map_err(|_| "invalid_template")? {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Secret(name) => {
                    let value = values.get(name).ok_or("secret_missing")?;
                    secrets.insert(name.to_owned(), value.clone());
                    out.push_str(value);
                }
            }
        }
        Ok(out)
    };
    let mut resolved = Resolved::default();
    for (name, template) in headers {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| "invalid_template")?;
        let mut value =
            HeaderValue::from_str(&fill(template)?).map_err(|_| "invalid_secret_value")?;
        value.set_sensitive(true);
        resolved.headers.push((name, value));
    }
    for (name, template) in env {
        let value = fill(template)?;
        if value.contains('\0') {
            return Err("invalid_secret_value");
        }
        resolved.env.push((name.clone(), value));
    }
    resolved.secrets = secrets;
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn templates_split_into_text_and_references() {
        assert_eq!(
            pieces("Bearer {{secret:LINEAR_TOKEN}}").unwrap(),
            vec![Piece::Text("Bearer "), Piece::Secret("LINEAR_TOKEN")]
        );
        assert_eq!(
            pieces("{{secret:A}}:{{secret:B_2}}").unwrap(),
            vec![Piece::Secret("A"), Piece::Text(":"), Piece::Secret("B_2")]
        );
        assert_eq!(pieces("plain").unwrap(), vec![Piece::Text("plain")]);
        assert_eq!(pieces("").unwrap(), vec![]);
        for bad in [
            "{{secret:lower}}",
            "{{secret:}}",
            "{{secret:OPEN",
            "{{env:HOME}}",
            "x {{ y",
        ] {
            assert!(pieces(bad).is_err(), "{bad}");
        }
        let refs: Vec<_> = references("{{secret:A}} and {{secret:B}}").collect();
        assert_eq!(refs, ["A", "B"]);
    }

    #[test]
    fn headers_are_checked() {
        assert!(check_headers(&map(&[("Authorization", "Bearer {{secret:T}}")])).is_ok());
        assert!(check_headers(&map(&[("X-Team", "acme")])).is_ok());
        for (bad, why) in [
            (map(&[("Authorization", "Bearer abc123")]), "from a secret"),
            (map(&[("X-Api-Key", "abc123")]), "from a secret"),
            (map(&[("Mcp-Session-Id", "x")]), "set by the MCP transport"),
            (
                map(&[("Content-Type", "text/plain")]),
                "set by the MCP transport",
            ),
            (map(&[("bad header", "x")]), "not a valid HTTP header name"),
            (map(&[("X-A", "x"), ("x-a", "y")]), "twice"),
            (map(&[("X-A", "line\nbreak")]), "visible ASCII"),
            (map(&[("X-A", "{{secret:nope}}")]), "does not name a secret"),
        ] {
            let err = check_headers(&bad).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        let many: BTreeMap<String, String> = (0..=MAX_ENTRIES)
            .map(|i| (format!("X-{i}"), "v".to_owned()))
            .collect();
        assert!(check_headers(&many).is_err());
    }

    #[test]
    fn env_is_checked() {
        assert!(check_env(&map(&[("GITHUB_TOKEN", "{{secret:GH}}"), ("MODE", "ci")])).is_ok());
        for bad in [
            map(&[("1X", "v")]),
            map(&[("A-B", "v")]),
            map(&[("API_KEY", "literal")]),
            map(&[("A", "nul\0")]),
        ] {
            assert!(check_env(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn resolved_debug_shows_names_only() {
        let mut value = HeaderValue::from_static("Bearer hunter2");
        value.set_sensitive(true);
        let resolved = Resolved {
            headers: vec![(HeaderName::from_static("authorization"), value)],
            env: vec![("TOKEN".into(), "hunter2".into())],
            secrets: [("TOKEN".to_owned(), "hunter2".to_owned())].into(),
        };
        let shown = format!("{resolved:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("authorization") && shown.contains("TOKEN"));
    }
}
