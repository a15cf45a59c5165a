//! The agent's own tool calls as text in an OpenAI answer (P13), when its `openai`
//! options say `tool_activity: "text"`: a line per call once it ended (`▸ ran `shell``),
//! its own paragraph in the content stream, so any chat client renders it. The calls ran
//! in the brain; a client never gets `tool_calls` to run, and never a call's input or
//! output (they may hold what the principal's tools read, which the answer need not
//! repeat).

use std::collections::HashMap;

use domain::openai::{CallOutcome, ToolActivity};
use protocol::ui::UiChunk;

/// The most calls of one turn whose names are remembered until they end; past it a call
/// shows as `a tool`. A turn's calls are bounded by its step limit far below this.
const MAX_CALLS: usize = 1024;

/// One answer's tool activity: the calls begun, by id, until they end.
pub(super) struct Activity {
    mode: ToolActivity,
    names: HashMap<String, String>,
}

impl Activity {
    pub(super) fn new(mode: ToolActivity) -> Self {
        Self {
            mode,
            names: HashMap::new(),
        }
    }

    /// The line `chunk` adds to the answer whose text so far is `answer`, if it ends a
    /// call and the agent shows its calls.
    pub(super) fn line(&mut self, chunk: &UiChunk, answer: &str) -> Option<String> {
        if self.mode == ToolActivity::None {
            return None;
        }
        let (id, outcome) = match chunk {
            UiChunk::ToolInputAvailable {
                tool_call_id,
                tool_name,
                ..
            } => {
                if self.names.len() < MAX_CALLS {
                    self.names.insert(tool_call_id.clone(), tool_name.clone());
                }
                return None;
            }
            UiChunk::ToolOutputAvailable { tool_call_id, .. } => (tool_call_id, CallOutcome::Ran),
            UiChunk::ToolOutputError { tool_call_id, .. } => (tool_call_id, CallOutcome::Failed),
            UiChunk::ToolOutputDenied { tool_call_id } => (tool_call_id, CallOutcome::Denied),
            UiChunk::ToolApprovalRequest { tool_call_id, .. } => {
                (tool_call_id, CallOutcome::AwaitsApproval)
            }
            _ => return None,
        };
        // An approval request is followed by the call's end in a later turn; its name is
        // kept only until the first of them here.
        let name = self.names.remove(id).unwrap_or_else(|| "a tool".into());
        let line = self.mode.line(&name, outcome)?;
        // Its own paragraph after text the model wrote before the call.
        let gap = match answer {
            "" => "",
            text if text.ends_with("\n\n") => "",
            text if text.ends_with('\n') => "\n",
            _ => "\n\n",
        };
        Some(format!("{gap}{line}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str, name: &str) -> UiChunk {
        UiChunk::ToolInputAvailable {
            tool_call_id: id.into(),
            tool_name: name.into(),
            input: json!({}),
        }
    }

    #[test]
    fn each_ended_call_is_a_paragraph_and_none_shows_nothing() {
        let mut shown = Activity::new(ToolActivity::Text);
        assert_eq!(shown.line(&call("1", "shell"), ""), None);
        let ran = UiChunk::ToolOutputAvailable {
            tool_call_id: "1".into(),
            output: json!("secret output"),
        };
        assert_eq!(
            shown.line(&ran, "Let me look.").as_deref(),
            Some("\n\n▸ ran `shell`\n\n")
        );
        shown.line(&call("2", "web_fetch"), "");
        let failed = UiChunk::ToolOutputError {
            tool_call_id: "2".into(),
            error_text: "refused".into(),
        };
        assert_eq!(
            shown.line(&failed, "").as_deref(),
            Some("▸ `web_fetch` failed\n\n")
        );
        let mut hidden = Activity::new(ToolActivity::None);
        assert_eq!(hidden.line(&call("1", "shell"), ""), None);
        assert_eq!(hidden.line(&ran, ""), None);
    }
}
