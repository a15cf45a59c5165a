//! `secret_set` / `secret_list`: per-agent secrets, encrypted at rest (SPEC B1).
//!
//! A value goes in and never comes back out on this path: `secret_list` answers names and
//! times only, and no answer, error or log line carries a value (X4). The value is read
//! back only by code that injects it into a tool's execution (`Store::secret_value`,
//! `Store::agent_secrets`). A secret stored while the agent has live worker sessions is
//! pushed to them before `secret_set` answers ([`OnSecretSet`], W12).

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use protocol::{AgentId, TeamId};

use super::{Tool, ToolCtx, ToolOutput, schema_of};
use domain::approvals::RiskClass;
use providers::ToolSpec;
use store::SecretsError;

const MAX_NAME: usize = 64;
/// The largest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 8 * 1024;
/// Secrets per agent.
pub const MAX_PER_AGENT: i64 = 100;
/// What replaces a value wherever a call's input is kept or shown.
pub const REDACTED: &str = "[redacted]";

/// Run after a secret of (team, agent) was stored: brings the agent's live worker
/// sessions up to date (W12), so a command later in the same chat already sees it.
pub type OnSecretSet = Arc<dyn Fn(TeamId, AgentId) -> BoxFuture<'static, ()> + Send + Sync>;

pub fn tools(on_set: Option<OnSecretSet>) -> Vec<Arc<dyn Tool>> {
    vec![Arc::new(SecretSet { on_set }), Arc::new(SecretList)]
}

/// Arguments of `secret_set`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetArgs {
    /// The secret's name: 1 to 64 of A-Z, 0-9 and _, e.g. GITHUB_TOKEN.
    #[schemars(regex(pattern = r"^[A-Z0-9_]{1,64}$"))]
    name: String,
    /// The secret's value (at most 8 KiB). It is stored encrypted and never shown again.
    value: String,
}

/// A valid secret name: `^[A-Z0-9_]{1,64}$`.
pub fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

struct SecretSet {
    on_set: Option<OnSecretSet>,
}

impl Tool for SecretSet {
    fn metric_label(&self) -> &'static str {
        "secret_set"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "secret_set".into(),
            description: "Store a secret (an API key, a password) for this agent under a name, \
                          encrypted; an existing secret of that name is replaced. The value is \
                          never shown again, not even to you."
                .into(),
            input_schema: schema_of::<SetArgs>(),
        }
    }

    fn risk(&self) -> RiskClass {
        RiskClass::Write
    }

    fn changes_agent(&self) -> bool {
        true
    }

    fn writes(&self) -> bool {
        true
    }

    fn redact_input(&self, input: Value) -> Value {
        redact_value(input)
    }

    fn redacts_input(&self) -> bool {
        true
    }

    fn call<'a>(&'a self, ctx: &'a ToolCtx, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            // serde's message may quote what it could not decode, so the error is ours.
            let args: SetArgs = match serde_json::from_value(arguments) {
                Ok(args) => args,
                Err(_) => {
                    return ToolOutput::error(
                        "invalid arguments: expected {\"name\": string, \"value\": string} and nothing else",
                    );
                }
            };
            if !valid_name(&args.name) {
                return ToolOutput::error(format!(
                    "name must be 1 to {MAX_NAME} characters of A-Z, 0-9 and _"
                ));
            }
            // X1: a secret becomes a variable of every command the agent's workers run;
            // one that reconfigures a tool (a proxy, git's ssh command) is never a credential.
            if protocol::env::reserved(&args.name) {
                return ToolOutput::error(format!(
                    "`{}` is reserved: it would reconfigure the tools every user's commands \
                     run, not pass a credential; choose another name",
                    args.name
                ));
            }
            if args.value.is_empty() || args.value.len() > MAX_VALUE_BYTES {
                return ToolOutput::error(format!(
                    "value must have 1 to {MAX_VALUE_BYTES} bytes"
                ));
            }
            let stored = ctx
                .store
                .set_secret(
                    ctx.team,
                    ctx.agent,
                    &args.name,
                    &args.value,
                    MAX_PER_AGENT,
                    &ctx.authority.audit_actor(),
                )
                .await;
            match stored {
                Ok(()) => {
                    if let Some(on_set) = &self.on_set {
                        on_set(ctx.team, ctx.agent).await;
                    }
                    ToolOutput::ok(format!("stored secret {}", args.name))
                }
                Err(SecretsError::NotConfigured) => {
                    ToolOutput::error("secrets are not configured on this server")
                }
                Err(SecretsError::TooMany) => ToolOutput::error(format!(
                    "this agent already has {MAX_PER_AGENT} secrets; replace one instead"
                )),
                Err(e) => {
                    tracing::warn!(turn = %ctx.turn, class = e.metric_label(), "secret_set failed");
                    ToolOutput::error("secrets are unavailable right now")
                }
            }
        }
        .boxed()
    }
}

/// The input with its `value` blanked: what may be stored, streamed and replayed.
fn redact_value(mut input: Value) -> Value {
    match input.as_object_mut() {
        Some(map) => {
            if let Some(v) = map.get_mut("value") {
                *v = json!(REDACTED);
            }
            input
        }
        // Not an object (arguments that are not JSON arrive as their raw text, which may
        // hold the value anywhere): keep nothing of it.
        None => json!(REDACTED),
    }
}

/// No arguments.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListArgs {}

struct SecretList;

impl Tool for SecretList {
    fn metric_label(&self) -> &'static str {
        "secret_list"
    }

    /// D3: it only reads.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "secret_list".into(),
            description: "List this agent's stored secrets: names and when each was last set \
                          (values are never shown)."
                .into(),
            input_schema: schema_of::<ListArgs>(),
        }
    }

    fn risk(&self) -> RiskClass {
        RiskClass::Read
    }

    fn writes(&self) -> bool {
        false
    }

    fn call<'a>(&'a self, ctx: &'a ToolCtx, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            if let Err(e) = super::parse_args::<ListArgs>(arguments) {
                return e;
            }
            match ctx.store.list_secrets(ctx.team, ctx.agent).await {
                Ok(secrets) if secrets.is_empty() => ToolOutput::ok("no secrets stored"),
                Ok(secrets) => {
                    let list: Vec<Value> = secrets
                        .iter()
                        .map(|s| {
                            json!({
                                "name": s.name,
                                "updated_at": s.updated_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                            })
                        })
                        .collect();
                    ToolOutput::ok(Value::Array(list).to_string())
                }
                Err(e) => {
                    tracing::warn!(turn = %ctx.turn, class = e.metric_label(), "secret_list failed");
                    ToolOutput::error("secrets are unavailable right now")
                }
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_pattern() {
        assert!(valid_name("GITHUB_TOKEN"));
        assert!(valid_name("A"));
        assert!(valid_name(&"X".repeat(64)));
        assert!(!valid_name(""));
        assert!(!valid_name(&"X".repeat(65)));
        assert!(!valid_name("github_token"));
        assert!(!valid_name("MY-KEY"));
        assert!(!valid_name("É"));
    }

    #[test]
    fn redaction_keeps_the_name_and_drops_the_value() {
        let input = json!({"name": "TOKEN", "value": "hunter2"});
        assert_eq!(
            redact_value(input),
            json!({"name": "TOKEN", "value": REDACTED})
        );
        assert_eq!(redact_value(json!("hunter2 as a string")), json!(REDACTED));
    }

    #[test]
    fn the_schema_is_closed() {
        let schema = schema_of::<SetArgs>();
        assert_eq!(schema["additionalProperties"], json!(false));
        assert_eq!(schema["required"], json!(["name", "value"]));
    }
}
