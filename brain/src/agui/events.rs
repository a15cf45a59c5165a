//! The AG-UI events the brain sends (AG-UI 1.0, `@ag-ui/core`'s schemas): `type` in
//! SCREAMING_SNAKE_CASE, fields in camelCase, optional fields left out rather than `null`
//! (the client refuses `null` where a field is optional).

use serde::Serialize;
use serde_json::Value;

/// One event of a run's stream.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Event {
    /// The first event of a run.
    #[serde(rename_all = "camelCase")]
    RunStarted { thread_id: String, run_id: String },
    /// The run ended without failing: `outcome` says whether it completed, waits for
    /// approvals (interrupts), or was stopped.
    #[serde(rename_all = "camelCase")]
    RunFinished {
        thread_id: String,
        run_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        outcome: Outcome,
    },
    /// The run failed or was refused; `code` is the brain's stable error code.
    RunError { message: String, code: String },
    /// One model call of the turn opens.
    #[serde(rename_all = "camelCase")]
    StepStarted { step_name: String },
    /// That model call closed.
    #[serde(rename_all = "camelCase")]
    StepFinished { step_name: String },
    #[serde(rename_all = "camelCase")]
    TextMessageStart {
        message_id: String,
        role: &'static str,
    },
    #[serde(rename_all = "camelCase")]
    TextMessageContent { message_id: String, delta: String },
    #[serde(rename_all = "camelCase")]
    TextMessageEnd { message_id: String },
    #[serde(rename_all = "camelCase")]
    ToolCallStart {
        tool_call_id: String,
        tool_call_name: String,
        parent_message_id: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCallArgs { tool_call_id: String, delta: String },
    #[serde(rename_all = "camelCase")]
    ToolCallEnd { tool_call_id: String },
    #[serde(rename_all = "camelCase")]
    ToolCallResult {
        message_id: String,
        tool_call_id: String,
        content: String,
        role: &'static str,
    },
    /// The agent's runtime state as the turn sees it (its turn, connectors, worker).
    StateSnapshot { snapshot: Value },
    /// Our live data that AG-UI has no event for (`notice`, `worker_log`).
    Custom { name: String, value: Value },
}

/// Every `type` an [`Event`] takes, for the OpenAPI contract of the stream.
pub const EVENT_TYPES: [&str; 14] = [
    "RUN_STARTED",
    "RUN_FINISHED",
    "RUN_ERROR",
    "STEP_STARTED",
    "STEP_FINISHED",
    "TEXT_MESSAGE_START",
    "TEXT_MESSAGE_CONTENT",
    "TEXT_MESSAGE_END",
    "TOOL_CALL_START",
    "TOOL_CALL_ARGS",
    "TOOL_CALL_END",
    "TOOL_CALL_RESULT",
    "STATE_SNAPSHOT",
    "CUSTOM",
];

/// Why a run ended (`RUN_FINISHED.outcome`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Outcome {
    Success,
    /// The turn waits for a person's answers to these approvals (A3); a new run whose
    /// `resume` answers them continues it.
    Interrupt {
        interrupts: Vec<Interrupt>,
    },
    /// The turn was stopped (T8) or interrupted by a newer message (T13).
    Cancelled,
}

/// A pending approval as an AG-UI interrupt: its id is the approval's id, the one `POST
/// /v1/approvals/{id}` and a resume entry's `interruptId` name.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Interrupt {
    pub id: String,
    /// Always `tool_approval`.
    pub reason: &'static str,
    pub message: String,
    pub tool_call_id: String,
    /// RFC 3339, when known (the approvals a resume left pending).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// The reason of every interrupt the brain raises.
pub const TOOL_APPROVAL: &str = "tool_approval";

impl Interrupt {
    pub fn approval(id: String, tool_call_id: String, tool: &str) -> Self {
        Self {
            id,
            reason: TOOL_APPROVAL,
            message: format!("the call of `{tool}` waits for a person's approval"),
            tool_call_id,
            expires_at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_use_the_protocol_field_names() {
        let cases = [
            (
                Event::RunStarted {
                    thread_id: "t".into(),
                    run_id: "r".into(),
                },
                json!({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
            ),
            (
                Event::ToolCallStart {
                    tool_call_id: "c".into(),
                    tool_call_name: "memory_write".into(),
                    parent_message_id: "m".into(),
                },
                json!({"type": "TOOL_CALL_START", "toolCallId": "c",
                       "toolCallName": "memory_write", "parentMessageId": "m"}),
            ),
            (
                Event::RunFinished {
                    thread_id: "t".into(),
                    run_id: "r".into(),
                    result: None,
                    outcome: Outcome::Interrupt {
                        interrupts: vec![Interrupt::approval("a".into(), "c".into(), "x")],
                    },
                },
                json!({"type": "RUN_FINISHED", "threadId": "t", "runId": "r",
                       "outcome": {"type": "interrupt", "interrupts": [{
                           "id": "a", "reason": "tool_approval", "toolCallId": "c",
                           "message": "the call of `x` waits for a person's approval"}]}}),
            ),
            (
                Event::RunError {
                    message: "m".into(),
                    code: "quota_exceeded".into(),
                },
                json!({"type": "RUN_ERROR", "message": "m", "code": "quota_exceeded"}),
            ),
        ];
        for (event, wire) in cases {
            assert_eq!(serde_json::to_value(&event).unwrap(), wire);
            assert!(EVENT_TYPES.contains(&wire["type"].as_str().unwrap()));
        }
    }
}
