//! The parts of a stored chat message: the AI SDK's `UIMessage` parts, as the brain writes
//! them into `messages.parts` and serves them from `GET /v1/chats/{id}/messages`.
//!
//! An assistant message holds, per model call, a `step-start`, its `text`, and one
//! `tool-<name>` part per tool call with the call's state: its output or error, a pending
//! or answered approval (SPEC A3), or a denial. A user message holds `text` parts and
//! `file` parts naming the chat's files by their download URL (T21). The live
//! stream ([`crate::ui::UiChunk`]) is how a client builds the same parts as they happen.
//!
//! The serialized form is exactly the AI SDK's, so a stock `useChat` client reads a stored
//! message unchanged and re-posts it (an approval's answer) in the same shape.

use serde::de::{Deserialize, Deserializer};
use serde::ser::{Serialize, Serializer};
use serde_json::Value;
use uuid::Uuid;

/// How a tool part's `type` begins; the tool's name follows.
const TOOL_PREFIX: &str = "tool-";

/// One part of a stored message.
///
/// Reading a part never fails: a part in a shape the brain does not write is kept whole as
/// [`Part::Other`] and serialized back unchanged. Such parts do reach the brain: a `useChat`
/// client re-posts its copy of the conversation, with parts of its own (`data-*` parts of
/// the live stream, text parts with a `state`) that are not re-validated, and a history
/// written by a later brain may hold part types this one does not know. Refusing them would
/// make a chat unreadable; ignoring them keeps the history as valid as the parts this brain
/// does know. The known shapes stay closed (unknown fields make a part `Other`), so what is
/// read is served back exactly; a field the brain starts to write must therefore be known
/// (optional) to every running brain first, or an older one leaves the part out of the
/// model's history.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Opens one model call: `{"type":"step-start"}`.
    StepStart,
    /// `{"type":"text","text":…}`.
    Text { text: String },
    /// `{"type":"tool-<name>","toolCallId",…,"input",…,"state",…}`.
    Tool(ToolPart),
    /// `{"type":"file","mediaType":…,"filename"?:…,"url":…}` (T21).
    File(FilePart),
    /// `{"type":"source-document","sourceId":…,"mediaType":…,"title":…,"filename"?:…}`: a
    /// passage of a knowledge base a tool answered from (B5), written after its call.
    SourceDocument(SourceDocument),
    /// Any other part, as it was read.
    Other(Value),
}

/// A file of a user message. As the brain stores it, `url` is the file's download URL
/// (`/v1/files/{id}`) and `media_type` the type sniffed from its bytes (T22), never a
/// `data:` URL or the client's word; as a client posts it, `url` may be a `data:` URL.
#[derive(Clone, Debug, PartialEq)]
pub struct FilePart {
    pub media_type: String,
    pub filename: Option<String>,
    pub url: String,
}

/// A document an answer drew on: a passage of a knowledge base (B5). `source_id` is
/// `<document id>:<position>`, unique per passage.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceDocument {
    pub source_id: String,
    pub media_type: String,
    /// The passage's heading path, else its document's title, else its filename.
    pub title: String,
    pub filename: Option<String>,
}

/// One tool call and where it stands.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolPart {
    /// The tool's name: the part's `type` is `tool-<name>`.
    pub tool: String,
    pub tool_call_id: String,
    /// The arguments as shown (redacted where the tool demands it).
    pub input: Value,
    pub state: ToolState,
}

/// The `state` of a tool part and the fields that go with it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ToolState {
    /// The call waits for a person's answer (A3).
    ApprovalRequested { approval: ApprovalRequest },
    /// The call was approved and has not run yet: `approval.approved` is `true`.
    ApprovalResponded { approval: Approval },
    /// The tool's result; `approval` when the call ran after one.
    OutputAvailable {
        output: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval: Option<Approval>,
    },
    /// The tool failed, was refused or was cancelled; the model reads the same text.
    #[serde(rename_all = "camelCase")]
    OutputError {
        error_text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approval: Option<Approval>,
    },
    /// The call was denied and never ran; `approval.reason` is what the model reads.
    OutputDenied { approval: Approval },
}

/// The `approval` of a call that waits.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequest {
    /// What `addToolApprovalResponse` and `POST /v1/approvals/{id}` name.
    pub id: Uuid,
}

/// The `approval` of an answered call.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    pub id: Uuid,
    pub approved: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The parts whose `type` is fixed. Generic over the text so that writing borrows it.
/// `StepStart` has braces because serde lets a unit variant pass unknown fields.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
enum Fixed<S> {
    StepStart {},
    Text {
        text: S,
    },
    #[serde(rename_all = "camelCase")]
    File {
        media_type: S,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filename: Option<S>,
        url: S,
    },
    #[serde(rename_all = "camelCase")]
    SourceDocument {
        source_id: S,
        media_type: S,
        title: S,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filename: Option<S>,
    },
}

/// A tool part on the wire. Generic so that writing borrows what reading owns.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolWire<S, V, T> {
    #[serde(rename = "type")]
    kind: String,
    tool_call_id: S,
    input: V,
    #[serde(flatten)]
    state: T,
}

impl Part {
    /// The part `value` is, or [`Part::Other`] holding it.
    pub fn from_value(value: Value) -> Self {
        let known = match value.get("type").and_then(Value::as_str) {
            Some(kind) if kind.starts_with(TOOL_PREFIX) => {
                ToolWire::<String, Value, ToolState>::deserialize(&value)
                    .ok()
                    .and_then(|wire| {
                        Some(Part::Tool(ToolPart {
                            tool: wire.kind.strip_prefix(TOOL_PREFIX)?.to_owned(),
                            tool_call_id: wire.tool_call_id,
                            input: wire.input,
                            state: wire.state,
                        }))
                    })
            }
            Some(_) => Fixed::<String>::deserialize(&value)
                .ok()
                .map(|fixed| match fixed {
                    Fixed::StepStart {} => Part::StepStart,
                    Fixed::Text { text } => Part::Text { text },
                    Fixed::File {
                        media_type,
                        filename,
                        url,
                    } => Part::File(FilePart {
                        media_type,
                        filename,
                        url,
                    }),
                    Fixed::SourceDocument {
                        source_id,
                        media_type,
                        title,
                        filename,
                    } => Part::SourceDocument(SourceDocument {
                        source_id,
                        media_type,
                        title,
                        filename,
                    }),
                }),
            None => None,
        };
        known.unwrap_or(Part::Other(value))
    }
}

impl Serialize for Part {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Part::StepStart => Fixed::<&str>::StepStart {}.serialize(serializer),
            Part::Text { text } => Fixed::Text {
                text: text.as_str(),
            }
            .serialize(serializer),
            Part::File(file) => Fixed::File {
                media_type: file.media_type.as_str(),
                filename: file.filename.as_deref(),
                url: file.url.as_str(),
            }
            .serialize(serializer),
            Part::SourceDocument(source) => Fixed::SourceDocument {
                source_id: source.source_id.as_str(),
                media_type: source.media_type.as_str(),
                title: source.title.as_str(),
                filename: source.filename.as_deref(),
            }
            .serialize(serializer),
            Part::Tool(tool) => ToolWire {
                kind: format!("{TOOL_PREFIX}{}", tool.tool),
                tool_call_id: tool.tool_call_id.as_str(),
                input: &tool.input,
                state: &tool.state,
            }
            .serialize(serializer),
            Part::Other(value) => value.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Part::from_value)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const APPROVAL: &str = "019a0000-0000-7000-8000-000000000001";

    fn tool(state: ToolState) -> Part {
        Part::Tool(ToolPart {
            tool: "memory_write".into(),
            tool_call_id: "call_1".into(),
            input: json!({"content": "tea"}),
            state,
        })
    }

    fn approval(approved: bool, reason: Option<&str>) -> Approval {
        Approval {
            id: APPROVAL.parse().unwrap(),
            approved,
            reason: reason.map(str::to_owned),
        }
    }

    /// Every part the brain writes, against the JSON it wrote before the parts were typed
    /// (`turn/history.rs`, `store/approvals.rs`, the turn loop): stored rows read back as
    /// the same parts and are written the same.
    #[test]
    fn each_part_is_the_ai_sdk_shape() {
        let cases = [
            (
                Part::SourceDocument(SourceDocument {
                    source_id: "019a0000-0000-7000-8000-000000000003:2".into(),
                    media_type: "text/markdown".into(),
                    title: "Team Handbook > Security".into(),
                    filename: Some("handbook.md".into()),
                }),
                json!({"type": "source-document",
                       "sourceId": "019a0000-0000-7000-8000-000000000003:2",
                       "mediaType": "text/markdown", "title": "Team Handbook > Security",
                       "filename": "handbook.md"}),
            ),
            (Part::StepStart, json!({"type": "step-start"})),
            (
                Part::Text {
                    text: "Grüß dich".into(),
                },
                json!({"type": "text", "text": "Grüß dich"}),
            ),
            (
                Part::File(FilePart {
                    media_type: "image/png".into(),
                    filename: Some("cat.png".into()),
                    url: "/v1/files/019a0000-0000-7000-8000-000000000002".into(),
                }),
                json!({"type": "file", "mediaType": "image/png", "filename": "cat.png",
                       "url": "/v1/files/019a0000-0000-7000-8000-000000000002"}),
            ),
            (
                Part::File(FilePart {
                    media_type: "text/plain".into(),
                    filename: None,
                    url: "data:,hi".into(),
                }),
                json!({"type": "file", "mediaType": "text/plain", "url": "data:,hi"}),
            ),
            (
                tool(ToolState::OutputAvailable {
                    output: json!("stored"),
                    approval: None,
                }),
                json!({"type": "tool-memory_write", "toolCallId": "call_1",
                       "input": {"content": "tea"}, "state": "output-available",
                       "output": "stored"}),
            ),
            (
                tool(ToolState::OutputError {
                    error_text: "budget spent".into(),
                    approval: None,
                }),
                json!({"type": "tool-memory_write", "toolCallId": "call_1",
                       "input": {"content": "tea"}, "state": "output-error",
                       "errorText": "budget spent"}),
            ),
            (
                tool(ToolState::ApprovalRequested {
                    approval: ApprovalRequest {
                        id: APPROVAL.parse().unwrap(),
                    },
                }),
                json!({"type": "tool-memory_write", "toolCallId": "call_1",
                       "input": {"content": "tea"}, "state": "approval-requested",
                       "approval": {"id": APPROVAL}}),
            ),
            (
                tool(ToolState::ApprovalResponded {
                    approval: approval(true, Some("fine")),
                }),
                json!({"type": "tool-memory_write", "toolCallId": "call_1",
                       "input": {"content": "tea"}, "state": "approval-responded",
                       "approval": {"id": APPROVAL, "approved": true, "reason": "fine"}}),
            ),
            (
                tool(ToolState::ApprovalResponded {
                    approval: approval(true, None),
                }),
                json!({"type": "tool-memory_write", "toolCallId": "call_1",
                       "input": {"content": "tea"}, "state": "approval-responded",
                       "approval": {"id": APPROVAL, "approved": true}}),
            ),
            (
                tool(ToolState::OutputDenied {
                    approval: approval(false, Some("denied: not about plans")),
                }),
                json!({"type": "tool-memory_write", "toolCallId": "call_1",
                       "input": {"content": "tea"}, "state": "output-denied",
                       "approval": {"id": APPROVAL, "approved": false,
                                    "reason": "denied: not about plans"}}),
            ),
            (
                tool(ToolState::OutputAvailable {
                    output: json!("stored"),
                    approval: Some(approval(true, None)),
                }),
                json!({"type": "tool-memory_write", "toolCallId": "call_1",
                       "input": {"content": "tea"}, "state": "output-available",
                       "output": "stored", "approval": {"id": APPROVAL, "approved": true}}),
            ),
            (
                tool(ToolState::OutputError {
                    error_text: "not run: the tool is not available any more".into(),
                    approval: Some(approval(true, None)),
                }),
                json!({"type": "tool-memory_write", "toolCallId": "call_1",
                       "input": {"content": "tea"}, "state": "output-error",
                       "errorText": "not run: the tool is not available any more",
                       "approval": {"id": APPROVAL, "approved": true}}),
            ),
        ];
        for (part, wire) in cases {
            assert_eq!(serde_json::to_value(&part).unwrap(), wire);
            assert_eq!(serde_json::from_value::<Part>(wire.clone()).unwrap(), part);
            // Text too: the map order of `to_value` must not hide a difference.
            let text = serde_json::to_string(&part).unwrap();
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), wire);
        }
    }

    /// Input that was not JSON is stored as the raw (or redacted) string; a tool's name
    /// may itself hold dashes.
    #[test]
    fn a_tool_part_keeps_any_input_and_the_whole_name() {
        let wire = json!({"type": "tool-web-fetch", "toolCallId": "c", "input": "[redacted]",
                          "state": "output-available", "output": {"k": [1]}});
        let Part::Tool(part) = serde_json::from_value::<Part>(wire.clone()).unwrap() else {
            panic!("not a tool part");
        };
        assert_eq!(part.tool, "web-fetch");
        assert_eq!(part.input, json!("[redacted]"));
        assert_eq!(serde_json::to_value(Part::Tool(part)).unwrap(), wire);
    }

    /// A whole stored assistant message, as a row holds it.
    #[test]
    fn a_stored_message_reads_as_its_parts() {
        let row = json!([
            {"type": "step-start"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool-memory_write", "toolCallId": "call_1", "input": {"content": "tea"},
             "state": "approval-requested", "approval": {"id": APPROVAL}},
        ]);
        let parts: Vec<Part> = serde_json::from_value(row.clone()).unwrap();
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| !matches!(p, Part::Other(_))));
        assert_eq!(serde_json::to_value(&parts).unwrap(), row);
    }

    /// What the brain does not write is kept as it came, never refused: other part types
    /// (a client's `data-*` and `reasoning` parts, a later brain's), the AI SDK's own
    /// optional fields on a known type, states the brain never stores, and malformed parts.
    #[test]
    fn other_parts_are_kept_unchanged() {
        let others = [
            json!({"type": "data-connector-status", "data": {"name": "crm", "state": "ready", "tools": 2}}),
            json!({"type": "reasoning", "text": "hmm", "state": "done"}),
            json!({"type": "text", "text": "Hello", "state": "done"}),
            json!({"type": "file", "mediaType": "image/png", "url": "data:,",
                   "providerMetadata": {}}),
            json!({"type": "tool-shell", "toolCallId": "c", "input": {}, "state": "input-available"}),
            json!({"type": "tool-shell", "toolCallId": "c", "input": {}, "state": "output-available",
                   "output": "ok", "providerExecuted": false}),
            json!({"type": "tool-shell", "toolCallId": "c", "input": {}, "state": "approval-responded",
                   "approval": {"id": "not-a-uuid", "approved": true}}),
            json!({"type": "tool-shell", "toolCallId": "c", "input": {}, "state": "approval-responded",
                   "approval": {"id": APPROVAL}}),
            json!({"type": "tool-shell", "toolCallId": "c", "state": "output-error", "errorText": "x"}),
            json!({"type": "step-start", "extra": 1}),
            json!({"type": "text"}),
            json!({"text": "no type"}),
            json!("not an object"),
        ];
        for wire in others {
            let part = serde_json::from_value::<Part>(wire.clone()).unwrap();
            assert_eq!(part, Part::Other(wire.clone()));
            assert_eq!(serde_json::to_value(&part).unwrap(), wire);
        }
    }
}
