//! A human in the loop (SPEC A1-A4): the risk classes of tool calls, an agent's approval
//! policy, and what it decides for one call (of a tool of that name and class).
//!
//! The policy is `{"ask": [classes or tool names], "deny": [tool names]}`. A denied tool
//! never runs and never becomes an approval: the model reads a refusal. A call that asks
//! is stored as a pending approval and ends its turn (turn/run.rs); the answer, by
//! `POST /v1/approvals/{id}` or a `useChat` re-post, resumes the loop in a new turn
//! (turn/mod.rs). The approval rows and the rewrite of the stored tool part live in
//! store/approvals.rs.

use serde::{Deserialize, Serialize};

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
}

impl ApprovalState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Expired => "expired",
            Self::Superseded => "superseded",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Pending,
            Self::Approved,
            Self::Denied,
            Self::Expired,
            Self::Superseded,
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
}
