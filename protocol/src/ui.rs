//! Chunks of the AI SDK *UI message stream* protocol, v1 (SPEC S1).
//!
//! The brain sends each chunk as one Server-Sent Event (`data: {json}`), then
//! `data: [DONE]`, with the header [`UI_STREAM_HEADER`] set to `v1`, so a stock `useChat`
//! frontend renders a turn unchanged. Field names follow the AI SDK's own schema
//! (`uiMessageChunkSchema`); our own live data travels as `data-*` chunks.

use serde::{Deserialize, Serialize};

use crate::TurnId;

/// The response header that announces this protocol to the AI SDK client.
pub const UI_STREAM_HEADER: &str = "x-vercel-ai-ui-message-stream";
/// The protocol version the brain speaks.
pub const UI_STREAM_VERSION: &str = "v1";
/// The last event of every stream.
pub const DONE_SENTINEL: &str = "[DONE]";

/// One event of the UI message stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum UiChunk {
    /// Opens the assistant message; its id is the stored message's id.
    #[serde(rename_all = "camelCase")]
    Start { message_id: String },
    /// Opens one model call of the turn.
    StartStep,
    /// Opens a text part.
    TextStart { id: String },
    /// Appends to the open text part `id`.
    TextDelta { id: String, delta: String },
    /// Closes the text part `id`.
    TextEnd { id: String },
    /// Opens a reasoning part: the model's reasoning, streamed only to an agent that opts
    /// in (`stream_reasoning`, T18) and never stored, so a replay shows none.
    ReasoningStart { id: String },
    /// Appends to the open reasoning part `id`.
    ReasoningDelta { id: String, delta: String },
    /// Closes the reasoning part `id`.
    ReasoningEnd { id: String },
    /// The model began a tool call.
    #[serde(rename_all = "camelCase")]
    ToolInputStart {
        tool_call_id: String,
        tool_name: String,
    },
    /// A fragment of the call's JSON arguments as the model streams them.
    #[serde(rename_all = "camelCase")]
    ToolInputDelta {
        tool_call_id: String,
        input_text_delta: String,
    },
    /// The call's complete arguments; the tool is about to run.
    #[serde(rename_all = "camelCase")]
    ToolInputAvailable {
        tool_call_id: String,
        tool_name: String,
        input: serde_json::Value,
    },
    /// The tool's result.
    #[serde(rename_all = "camelCase")]
    ToolOutputAvailable {
        tool_call_id: String,
        output: serde_json::Value,
    },
    /// A document the answer draws on (B5): each passage `knowledge_search` answered,
    /// sent after its tool output and kept in the message as the same part.
    #[serde(rename_all = "camelCase")]
    SourceDocument {
        source_id: String,
        media_type: String,
        title: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filename: Option<String>,
    },
    /// The tool failed, was refused, or was cancelled; the model reads the same text.
    #[serde(rename_all = "camelCase")]
    ToolOutputError {
        tool_call_id: String,
        error_text: String,
    },
    /// The call waits for a person's answer (SPEC A3); `approvalId` is what
    /// `addToolApprovalResponse` and `POST /v1/approvals/{id}` name.
    #[serde(rename_all = "camelCase")]
    ToolApprovalRequest {
        approval_id: String,
        tool_call_id: String,
    },
    /// The call was denied and never ran (SPEC A3, A4).
    #[serde(rename_all = "camelCase")]
    ToolOutputDenied { tool_call_id: String },
    /// Closes the model call opened by the last `start-step`.
    FinishStep,
    /// Drops what the client holds of the current step (the parts after its last
    /// `start-step`): sent by a resumed turn stream (D5) when a takeover re-issues a step
    /// whose partial output the client already got, so that output never shows twice.
    ResetStep,
    /// Ends the assistant message.
    #[serde(rename_all = "camelCase")]
    Finish { finish_reason: FinishReason },
    /// The turn failed; `errorText` starts with the stable error code and a colon.
    #[serde(rename_all = "camelCase")]
    Error { error_text: String },
    /// Which turn this stream belongs to, so a client can stop it or find it again.
    /// Transient: the AI SDK does not add it to the message.
    #[serde(rename = "data-turn")]
    DataTurn { data: TurnInfo, transient: bool },
    /// A connector's state at the start of the turn: a connector that is down lost its
    /// tools for this turn, and the turn went on (SPEC B2).
    #[serde(rename = "data-connector-status")]
    DataConnectorStatus { data: ConnectorStatus },
    /// The worker session behind the turn's worker tools changed state (provisioning,
    /// connecting, ready, failed).
    #[serde(rename = "data-worker-status")]
    DataWorkerStatus { data: WorkerStatus },
    /// A line of output from a worker tool while it runs (SPEC W5). Transient: the final
    /// tool output carries the whole (capped) text.
    #[serde(rename = "data-worker-log")]
    DataWorkerLog { data: WorkerLog, transient: bool },
    /// What a task handed to another agent with the `delegate` tool (B7) does while it
    /// runs: its turn, its text and its tool calls, tagged with the delegate call's id.
    /// Transient: the call's output carries the delegate's final answer.
    #[serde(rename = "data-delegation")]
    DataDelegation { data: Delegation, transient: bool },
    /// Something the user should know about the turn that is not an error, such as a
    /// ceiling that was hit (SPEC T6).
    #[serde(rename = "data-notice")]
    DataNotice { data: Notice },
    /// An MCP server asks the person a question in the middle of a tool call (P5): a form
    /// (`requestedSchema`, its `default`s pre-filled), answered with
    /// `POST /v1/approvals/{approvalId}` while the call waits. Sent again with the same
    /// `id` once it is answered or closed (`state`), so the client replaces the form.
    #[serde(rename = "data-elicitation")]
    DataElicitation {
        id: String,
        data: Box<ElicitationPart>,
    },
    /// Only on the events stream (S2): events this observer asked for are no longer in the
    /// window (trimmed, or dropped by a publisher under load); reload the transcript
    /// (`GET /v1/chats/{id}/messages`), then follow the live events after this one.
    /// Transient: it is never part of a message.
    #[serde(rename = "data-resync")]
    DataResync { data: Resync, transient: bool },
}

impl UiChunk {
    /// The chunk that streams `source` (B5), as the stored part will show it.
    pub fn source_document(source: &crate::parts::SourceDocument) -> Self {
        Self::SourceDocument {
            source_id: source.source_id.clone(),
            media_type: source.media_type.clone(),
            title: source.title.clone(),
            filename: source.filename.clone(),
        }
    }
}

/// The payload of a `data-elicitation` chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ElicitationPart {
    /// What `POST /v1/approvals/{id}` names.
    pub approval_id: uuid::Uuid,
    /// The connector tool call the question came during.
    pub tool_call_id: String,
    pub connector: String,
    /// The server's message to the person.
    pub message: String,
    /// The form: an object of primitive fields, MCP's restricted JSON Schema.
    pub requested_schema: serde_json::Value,
    /// RFC 3339: when an unanswered question is closed (`expired`).
    pub expires_at: String,
    /// `pending` while the call waits; then `approved` (accepted), `denied` (declined),
    /// `cancelled`, `expired` or `superseded` (a new message).
    pub state: String,
}

/// The payload of a `data-resync` chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Resync {
    /// Stable: `trimmed` (the id fell out of the window), `dropped` (events were not
    /// published while a replica was overloaded).
    pub reason: String,
}

/// The payload of a `data-connector-status` chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ConnectorStatus {
    pub name: String,
    pub state: ConnectorState,
    /// Tools the connector added to this turn.
    pub tools: usize,
    /// Why it is down: an error class such as `timeout` or `unreachable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With `needs_authorization`: the flow's link (`{brain}/v1/oauth/flows/{flow}`). The
    /// turn's principal `POST`s it, with its credentials, from the browser the person
    /// authorizes in; the answer's `authorization_url` is the authorization server's page,
    /// which leads back to the brain's callback, and its cookie binds the flow to that
    /// browser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorize: Option<String>,
}

/// The payload of a `data-worker-status` chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerStatus {
    pub session_id: crate::SessionId,
    pub state: crate::channel::SessionState,
    /// The failure reason when `state` is `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The payload of a `data-worker-log` chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerLog {
    pub tool_call_id: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    pub text: String,
}

/// The payload of a `data-delegation` chunk (B7).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Delegation {
    /// The `delegate` call of the parent turn this progress belongs to.
    pub tool_call_id: String,
    /// The delegated task's own turn (its `parent_turn_id` is the streaming turn).
    pub turn_id: TurnId,
    /// The child chat the task runs in.
    pub chat_id: crate::ChatId,
    /// The agent the task was handed to.
    pub agent_id: crate::AgentId,
    pub event: DelegationEvent,
}

/// One step of a delegated task's progress.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum DelegationEvent {
    /// The task's turn started.
    Started,
    /// The delegate wrote `delta`.
    #[serde(rename_all = "camelCase")]
    Text { delta: String },
    /// The delegate called a tool.
    #[serde(rename_all = "camelCase")]
    ToolCall {
        tool_call_id: String,
        tool_name: String,
    },
    /// The delegate's tool call ended; `error` when it failed or was refused.
    #[serde(rename_all = "camelCase")]
    ToolResult { tool_call_id: String, error: bool },
    /// The task ended: `completed`, `failed` or `interrupted`.
    Finished { status: String },
}

/// Whether a connector's tools joined the turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ConnectorState {
    Ready,
    Down,
    /// The server demands an OAuth authorization the brain does not hold (none yet, or one
    /// that was revoked or can no longer be refreshed): `authorize` says where a person
    /// grants it; the turn goes on without the connector's tools.
    NeedsAuthorization,
}

/// The payload of a `data-notice` chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Notice {
    /// Stable: `iteration_ceiling`, `write_budget_spent`, `truncated_tool_call`; on the
    /// events stream, `observer_too_slow` (its last event: the observer's buffer filled).
    pub code: String,
    pub message: String,
}

/// Why the assistant message ended, in the AI SDK's vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    Error,
    Interrupted,
    Other,
}

/// The payload of a `data-turn` chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TurnInfo {
    pub turn_id: TurnId,
}

impl UiChunk {
    /// The error chunk for a stable code: `"<code>: <message>"`.
    pub fn error(code: crate::ErrorCode, message: &str) -> Self {
        Self::Error {
            error_text: format!("{}: {message}", code.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_use_the_ai_sdk_field_names() {
        let cases = [
            (
                UiChunk::Start {
                    message_id: "m1".into(),
                },
                r#"{"type":"start","messageId":"m1"}"#,
            ),
            (UiChunk::StartStep, r#"{"type":"start-step"}"#),
            (UiChunk::ResetStep, r#"{"type":"reset-step"}"#),
            (
                UiChunk::TextDelta {
                    id: "t".into(),
                    delta: "hi".into(),
                },
                r#"{"type":"text-delta","id":"t","delta":"hi"}"#,
            ),
            (
                UiChunk::ReasoningStart { id: "r".into() },
                r#"{"type":"reasoning-start","id":"r"}"#,
            ),
            (
                UiChunk::ReasoningDelta {
                    id: "r".into(),
                    delta: "hmm".into(),
                },
                r#"{"type":"reasoning-delta","id":"r","delta":"hmm"}"#,
            ),
            (
                UiChunk::ReasoningEnd { id: "r".into() },
                r#"{"type":"reasoning-end","id":"r"}"#,
            ),
            (
                UiChunk::Finish {
                    finish_reason: FinishReason::ToolCalls,
                },
                r#"{"type":"finish","finishReason":"tool-calls"}"#,
            ),
            (
                UiChunk::ToolApprovalRequest {
                    approval_id: "a1".into(),
                    tool_call_id: "c1".into(),
                },
                r#"{"type":"tool-approval-request","approvalId":"a1","toolCallId":"c1"}"#,
            ),
            (
                UiChunk::ToolOutputDenied {
                    tool_call_id: "c1".into(),
                },
                r#"{"type":"tool-output-denied","toolCallId":"c1"}"#,
            ),
            (
                UiChunk::error(crate::ErrorCode::RateLimited, "slow down"),
                r#"{"type":"error","errorText":"rate_limited: slow down"}"#,
            ),
        ];
        for (chunk, wire) in cases {
            assert_eq!(serde_json::to_string(&chunk).unwrap(), wire);
            assert_eq!(serde_json::from_str::<UiChunk>(wire).unwrap(), chunk);
        }
    }

    #[test]
    fn resync_is_a_transient_data_part() {
        let chunk = UiChunk::DataResync {
            data: Resync {
                reason: "trimmed".into(),
            },
            transient: true,
        };
        let wire = r#"{"type":"data-resync","data":{"reason":"trimmed"},"transient":true}"#;
        assert_eq!(serde_json::to_string(&chunk).unwrap(), wire);
        assert_eq!(serde_json::from_str::<UiChunk>(wire).unwrap(), chunk);
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(serde_json::from_str::<UiChunk>(r#"{"type":"text-end","id":"t","x":1}"#).is_err());
    }
}
