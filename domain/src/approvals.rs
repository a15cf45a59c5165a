//! A human in the loop (SPEC A1-A4): the risk classes of tool calls, an agent's approval
//! policy, and what it decides for one call (of a tool of that name and class).
//!
//! The policy is `{"ask": [classes or tool names], "deny": [tool names]}`. A denied tool
//! never runs and never becomes an approval: the model reads a refusal. A call that asks
//! is stored as a pending approval and ends its turn (turn/run.rs); the answer, by
//! `POST /v1/approvals/{id}` or a `useChat` re-post, resumes the loop in a new turn
//! (turn/mod.rs). The approval rows and the rewrite of the stored tool part live in
//! store/approvals.rs. An MCP server's question during a call (P5) is an approval of
//! its own kind, which the running call waits on (connectors/elicitation.rs); its form
//! and the check of a person's values against it are here.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a call can do (SPEC A1), which an agent's approval policy names (A2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RiskClass {
    /// No side effects.
    Read,
    /// Changes the workspace or the agent's own state.
    Write,
    /// Acts on systems outside.
    External,
    /// Cannot be undone.
    Irreversible,
}

impl RiskClass {
    pub const ALL: [RiskClass; 4] = [Self::Read, Self::Write, Self::External, Self::Irreversible];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::External => "external",
            Self::Irreversible => "irreversible",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// The most entries either list may hold.
pub const MAX_ENTRIES: usize = 100;
/// The longest tool name a policy may name (connector tools are `<connector>__<tool>`).
pub const MAX_TOOL_NAME: usize = 128;
/// The longest reason a person may give.
pub const MAX_REASON: usize = 2000;

/// A2: which calls ask a person first and which tools never run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ask": ["external", "irreversible", "memory_write"], "deny": ["shell"]}))]
pub struct ApprovalPolicy {
    /// Risk classes (`read`, `write`, `external`, `irreversible`) and tool names whose
    /// calls wait for a person's answer.
    #[serde(default)]
    pub ask: Vec<String>,
    /// Tool names that never run.
    #[serde(default)]
    pub deny: Vec<String>,
}

/// What the policy says of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Run,
    Ask,
    Deny,
}

impl ApprovalPolicy {
    /// Checks the lists: known classes, tool-name syntax, bounded sizes; the message says
    /// what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.ask.len() > MAX_ENTRIES || self.deny.len() > MAX_ENTRIES {
            return Err(format!(
                "approval_policy: ask and deny hold at most {MAX_ENTRIES} entries each"
            ));
        }
        for entry in &self.ask {
            if RiskClass::parse(entry).is_none() {
                check_tool_name(entry).map_err(|e| {
                    format!(
                        "approval_policy.ask: `{}` is neither a risk class (read, write, \
                         external, irreversible) nor a tool name: {e}",
                        entry.chars().take(40).collect::<String>()
                    )
                })?;
            }
        }
        for entry in &self.deny {
            check_tool_name(entry).map_err(|e| format!("approval_policy.deny: {e}"))?;
        }
        Ok(())
    }

    /// The deny list wins over the ask list: a denied tool never becomes an approval.
    pub fn decide(&self, name: &str, risk: RiskClass) -> Decision {
        if self.deny.iter().any(|d| d == name) {
            Decision::Deny
        } else if self.ask.iter().any(|a| a == name || a == risk.as_str()) {
            Decision::Ask
        } else {
            Decision::Run
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ask.is_empty() && self.deny.is_empty()
    }
}

/// Tool names as providers accept them: 1 to 128 of `[A-Za-z0-9_-]`.
fn check_tool_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_TOOL_NAME {
        return Err(format!("a tool name has 1 to {MAX_TOOL_NAME} characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err("a tool name holds only letters, digits, `_` and `-`".into());
    }
    Ok(())
}

/// How an approval ended, as stored and listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalState {
    Pending,
    Approved,
    Denied,
    Expired,
    Superseded,
    /// An elicitation the turn gave up: the turn was stopped, or the server withdrew it.
    Cancelled,
}

impl ApprovalState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Expired => "expired",
            Self::Superseded => "superseded",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Pending,
            Self::Approved,
            Self::Denied,
            Self::Expired,
            Self::Superseded,
            Self::Cancelled,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }
}

/// What the model reads for a call that did not run because of an answer (or its
/// absence).
pub fn denial_text(state: ApprovalState, reason: Option<&str>) -> String {
    let why = match state {
        ApprovalState::Superseded => {
            "not run: the user sent a new message instead of answering the approval"
        }
        ApprovalState::Expired => "not run: nobody answered the approval before it expired",
        _ => "not run: a person denied this call",
    };
    match reason {
        Some(reason) if !reason.is_empty() => format!("{why}; their reason: {reason}"),
        _ => why.to_owned(),
    }
}

/// Checks a person's reason.
pub fn validate_reason(reason: Option<&str>) -> Result<(), String> {
    match reason {
        Some(r) if r.chars().count() > MAX_REASON => {
            Err(format!("reason must have at most {MAX_REASON} characters"))
        }
        Some(r) if r.contains('\0') => Err("reason must not contain NUL characters".into()),
        _ => Ok(()),
    }
}

/// What an approval asks a person: to let a tool call run, or (P5) the question an MCP
/// server asks in the middle of a tool call (`elicitation/create`), which the call waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalKind {
    Tool,
    Elicitation,
}

impl ApprovalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tool => "tool",
            Self::Elicitation => "elicitation",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Tool, Self::Elicitation]
            .into_iter()
            .find(|kind| kind.as_str() == s)
    }
}

/// An MCP server's question (form mode), as stored and shown to the person.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Elicitation {
    /// The connector whose server asks.
    pub connector: String,
    /// The server's message to the person.
    pub message: String,
    /// The form: an object of primitive fields (string, number, integer, boolean, a
    /// multi-select of strings), as MCP restricts it; `default`s pre-fill it.
    #[schema(value_type = Object)]
    pub requested_schema: Value,
}

/// A person's answer to an elicitation, in MCP's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ElicitAction {
    /// Submits the form's values (`content`).
    Accept,
    /// Refuses to give them.
    Decline,
    /// Dismisses the question without a choice.
    Cancel,
}

impl ElicitAction {
    /// The approval's state once answered so.
    pub fn state(self) -> ApprovalState {
        match self {
            Self::Accept => ApprovalState::Approved,
            Self::Decline => ApprovalState::Denied,
            Self::Cancel => ApprovalState::Cancelled,
        }
    }
}

/// The longest message of a server's question that is shown; a longer one is declined.
pub const MAX_ELICITATION_MESSAGE: usize = 10_000;
/// The most fields a form may have.
pub const MAX_FORM_FIELDS: usize = 64;
/// The longest requested schema, serialized; a longer one is declined.
pub const MAX_FORM_SCHEMA: usize = 64 * 1024;
/// The longest string value an answer may carry.
pub const MAX_FORM_TEXT: usize = 10_000;

/// Whether a server's question can be shown as a form: a bounded message, and an object
/// schema whose fields are each of MCP's primitive kinds. The error is a class for logs.
pub fn check_question(message: &str, schema: &Value) -> Result<(), &'static str> {
    if message.chars().count() > MAX_ELICITATION_MESSAGE {
        return Err("message_too_long");
    }
    if schema.to_string().len() > MAX_FORM_SCHEMA {
        return Err("schema_too_large");
    }
    if schema["type"] != "object" {
        return Err("not_an_object");
    }
    let fields = schema["properties"].as_object();
    if fields.map_or(0, serde_json::Map::len) > MAX_FORM_FIELDS {
        return Err("too_many_fields");
    }
    for field in fields.into_iter().flat_map(serde_json::Map::values) {
        match field["type"].as_str() {
            Some("string" | "number" | "integer" | "boolean") => {}
            Some("array") if !choices(&field["items"]).is_empty() => {}
            _ => return Err("unsupported_field"),
        }
    }
    Ok(())
}

/// The values a single- or multi-select allows: `enum`, or the `const`s of `oneOf` /
/// `anyOf` (titled choices).
fn choices(field: &Value) -> Vec<&Value> {
    if let Some(values) = field["enum"].as_array() {
        return values.iter().collect();
    }
    ["oneOf", "anyOf"]
        .into_iter()
        .filter_map(|key| field[key].as_array())
        .flatten()
        .filter_map(|choice| choice.get("const"))
        .collect()
}

/// Checks a person's values against the form they answer: only its fields, each of its
/// type and within its bounds (length, range, items, choices, format), every required
/// field present. The text names the field.
pub fn check_content(schema: &Value, content: &Value) -> Result<(), String> {
    let Some(values) = content.as_object() else {
        return Err("content must be an object of the form's fields".into());
    };
    let fields = schema["properties"].as_object();
    for (name, value) in values {
        let field = fields
            .and_then(|f| f.get(name))
            .ok_or_else(|| format!("`{}` is not a field of this form", shorten(name)))?;
        check_value(field, value).map_err(|e| format!("`{}`: {e}", shorten(name)))?;
    }
    for required in schema["required"].as_array().into_iter().flatten() {
        if let Some(name) = required.as_str()
            && !values.contains_key(name)
        {
            return Err(format!("`{}` is required", shorten(name)));
        }
    }
    Ok(())
}

fn shorten(name: &str) -> String {
    name.chars().take(64).collect()
}

fn check_value(field: &Value, value: &Value) -> Result<(), String> {
    let bound = |key: &str| field[key].as_f64();
    match field["type"].as_str() {
        Some("string") => {
            let text = value.as_str().ok_or("must be a string")?;
            let length = text.chars().count();
            if length > MAX_FORM_TEXT {
                return Err(format!("must have at most {MAX_FORM_TEXT} characters"));
            }
            if bound("minLength").is_some_and(|min| (length as f64) < min)
                || bound("maxLength").is_some_and(|max| (length as f64) > max)
            {
                return Err("has a length outside the form's bounds".into());
            }
            let allowed = choices(field);
            if !allowed.is_empty() && !allowed.contains(&value) {
                return Err("is not one of the form's choices".into());
            }
            check_format(field["format"].as_str(), text)
        }
        Some(kind @ ("number" | "integer")) => {
            let number = value.as_f64().ok_or("must be a number")?;
            if kind == "integer" && !(value.is_i64() || value.is_u64()) {
                return Err("must be an integer".into());
            }
            if bound("minimum").is_some_and(|min| number < min)
                || bound("maximum").is_some_and(|max| number > max)
            {
                return Err("is outside the form's range".into());
            }
            Ok(())
        }
        Some("boolean") if value.is_boolean() => Ok(()),
        Some("boolean") => Err("must be true or false".into()),
        Some("array") => {
            let items = value.as_array().ok_or("must be a list of choices")?;
            let count = items.len() as f64;
            if bound("minItems").is_some_and(|min| count < min)
                || bound("maxItems").is_some_and(|max| count > max)
            {
                return Err("has a number of choices outside the form's bounds".into());
            }
            let allowed = choices(&field["items"]);
            if items.iter().any(|item| !allowed.contains(&item)) {
                return Err("holds a value that is not one of the form's choices".into());
            }
            Ok(())
        }
        _ => Err("the form's field is of a kind no value fits".into()),
    }
}

/// The string formats MCP names; others are not checked.
fn check_format(format: Option<&str>, text: &str) -> Result<(), String> {
    let fits = match format {
        Some("email") => text
            .split_once('@')
            .is_some_and(|(local, domain)| !local.is_empty() && domain.contains('.')),
        Some("uri") => url::Url::parse(text).is_ok(),
        Some("date") => chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").is_ok(),
        Some("date-time") => chrono::DateTime::parse_from_rfc3339(text).is_ok(),
        _ => true,
    };
    if fits {
        Ok(())
    } else {
        Err(format!("is not a valid {}", format.unwrap_or("value")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_checked() {
        let ok = ApprovalPolicy {
            ask: vec!["external".into(), "memory_write".into()],
            deny: vec!["conn__drop-table".into()],
        };
        assert_eq!(ok.validate(), Ok(()));
        let bad_ask = ApprovalPolicy {
            ask: vec!["dangerous things".into()],
            deny: vec![],
        };
        assert!(
            bad_ask
                .validate()
                .unwrap_err()
                .contains("neither a risk class")
        );
        let class_denied = ApprovalPolicy {
            ask: vec![],
            deny: vec!["".into()],
        };
        assert!(class_denied.validate().is_err());
        let too_many = ApprovalPolicy {
            ask: vec!["read".into(); MAX_ENTRIES + 1],
            deny: vec![],
        };
        assert!(too_many.validate().is_err());
        assert!(
            ApprovalPolicy {
                ask: vec![],
                deny: vec!["x".repeat(MAX_TOOL_NAME + 1)],
            }
            .validate()
            .is_err()
        );
    }

    #[test]
    fn answers_are_checked_against_the_form() {
        use serde_json::json;
        let form = json!({"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "maxLength": 5},
            "age": {"type": "integer", "minimum": 1, "maximum": 100},
            "ok": {"type": "boolean"},
            "mail": {"type": "string", "format": "email"},
            "hero": {"type": "string", "oneOf": [{"const": "h1", "title": "Superman"}]},
            "fish": {"type": "array", "maxItems": 2,
                     "items": {"anyOf": [{"const": "f1"}, {"const": "f2"}, {"const": "f3"}]}},
        }});
        assert_eq!(check_question("hi", &form), Ok(()));
        assert_eq!(
            check_content(
                &form,
                &json!({"name": "Ada", "age": 36, "ok": true, "mail": "a@b.io", "hero": "h1",
                        "fish": ["f1", "f3"]})
            ),
            Ok(())
        );
        for (content, says) in [
            (json!({"age": 3}), "`name` is required"),
            (json!({"name": "Ada", "x": 1}), "`x` is not a field"),
            (json!({"name": 1}), "`name`: must be a string"),
            (json!({"name": "Adalbert"}), "`name`: has a length"),
            (
                json!({"name": "A", "age": 3.5}),
                "`age`: must be an integer",
            ),
            (json!({"name": "A", "age": 101}), "`age`: is outside"),
            (json!({"name": "A", "ok": "yes"}), "`ok`: must be true"),
            (
                json!({"name": "A", "mail": "nope"}),
                "`mail`: is not a valid email",
            ),
            (json!({"name": "A", "hero": "h9"}), "`hero`: is not one of"),
            (
                json!({"name": "A", "fish": ["f1", "f2", "f3"]}),
                "`fish`: has a number",
            ),
            (
                json!({"name": "A", "fish": ["f9"]}),
                "`fish`: holds a value",
            ),
            (json!(["A"]), "content must be an object"),
        ] {
            let error = check_content(&form, &content).unwrap_err();
            assert!(error.starts_with(says), "{content}: {error}");
        }
        let nested = json!({"type": "object", "properties": {"a": {"type": "object"}}});
        assert_eq!(check_question("hi", &nested), Err("unsupported_field"));
        assert_eq!(
            check_question(&"x".repeat(MAX_ELICITATION_MESSAGE + 1), &form),
            Err("message_too_long")
        );
    }
}
