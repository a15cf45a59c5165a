//! An agent's options for the OpenAI-compatible front end (P7, P13): how a client that
//! speaks OpenAI's wire sees the agent's own server-side tool calls. Stored on the agent
//! (`agents.openai`, migration 0069) and read only by that front end: a turn runs the same
//! whatever they say.

use serde::{Deserialize, Serialize};

/// `openai` on an agent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"tool_activity": "text"}))]
pub struct OpenAiOptions {
    /// How the agent's tool calls show in an OpenAI answer.
    #[serde(default)]
    pub tool_activity: ToolActivity,
}

/// How the agent's own tool calls, which run in the brain, show to an OpenAI-wire client.
/// Never as `tool_calls` for the client to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolActivity {
    /// Not at all: the client gets the answer's text only.
    #[default]
    None,
    /// A line of text per call in the answer's content (`▸ ran `shell``), which any chat
    /// client renders; the call's input and output are never shown.
    Text,
}

impl ToolActivity {
    /// The line a call that ended as `outcome` adds to the answer, its own paragraph.
    pub fn line(self, tool: &str, outcome: CallOutcome) -> Option<String> {
        match self {
            Self::None => None,
            Self::Text => Some(match outcome {
                CallOutcome::Ran => format!("▸ ran `{tool}`\n\n"),
                CallOutcome::Failed => format!("▸ `{tool}` failed\n\n"),
                CallOutcome::Denied => format!("▸ `{tool}` was denied\n\n"),
                CallOutcome::AwaitsApproval => format!("▸ `{tool}` waits for approval\n\n"),
            }),
        }
    }
}

/// How one tool call ended, as far as a client is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    Ran,
    Failed,
    Denied,
    AwaitsApproval,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_options_are_closed_and_off_by_default() {
        let none: OpenAiOptions = serde_json::from_str("{}").unwrap();
        assert_eq!(none.tool_activity, ToolActivity::None);
        assert_eq!(none.tool_activity.line("shell", CallOutcome::Ran), None);
        let text: OpenAiOptions = serde_json::from_str(r#"{"tool_activity":"text"}"#).unwrap();
        assert_eq!(
            text.tool_activity
                .line("shell", CallOutcome::Ran)
                .as_deref(),
            Some("▸ ran `shell`\n\n")
        );
        assert!(serde_json::from_str::<OpenAiOptions>(r#"{"tool_activity":"calls"}"#).is_err());
        assert!(serde_json::from_str::<OpenAiOptions>(r#"{"other":1}"#).is_err());
    }
}
