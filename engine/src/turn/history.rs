//! Stored messages ↔ what the model sees.
//!
//! An assistant message is stored as AI SDK UI parts (`protocol::parts::Part`): per model
//! call a step start, its text, and one tool part per call holding the input and the result. Rebuilding
//! the model's view walks those parts step by step, so every tool call sent back to a
//! provider carries exactly one result (the turn stores a synthetic one for calls it
//! could not finish, SPEC T8).

use protocol::parts::{Approval, Part, ToolPart, ToolState};
use protocol::ui::UiChunk;
use serde_json::Value;

use super::attachments::{self, Files, Shown};
use crate::tools::ToolOutput;
use providers::{Message, ToolCall, ToolResult};
use store::MessageRow;

/// A rough token count of a message's parts: providers bill about four characters per
/// token of English, and the budget only needs to be in the right range. Counted without
/// building the JSON text, since every turn estimates its whole unsummarized history.
pub fn estimate_tokens(parts: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail, and a value that does not serialize counts as empty.
    let _ = serde_json::to_writer(&mut count, parts);
    count.0 / 4 + 4
}

/// A history row and its token estimate: estimated when asked for a row just read, kept
/// with the row for a history the replica keeps ([`HistoryRow`]), which each turn of the
/// chat would otherwise estimate again.
pub trait Counted {
    fn row(&self) -> &MessageRow;
    fn tokens(&self) -> usize;
}

impl Counted for MessageRow {
    fn row(&self) -> &MessageRow {
        self
    }
    fn tokens(&self) -> usize {
        estimate_tokens(&self.parts)
    }
}

/// A row of a kept history with its estimate, computed once.
#[derive(Debug)]
pub struct HistoryRow {
    pub row: MessageRow,
    pub tokens: usize,
}

impl HistoryRow {
    pub fn new(row: MessageRow) -> Self {
        let tokens = estimate_tokens(&row.parts);
        Self { row, tokens }
    }
}

impl Counted for std::sync::Arc<HistoryRow> {
    fn row(&self) -> &MessageRow {
        &self.row
    }
    fn tokens(&self) -> usize {
        self.tokens
    }
}

/// What the model reads for a call that still waits for a person's answer.
pub const AWAITING_APPROVAL: &str = "not run yet: waiting for a person's approval";

/// Puts `output` in place of the waiting result of call `call_id` (A3: an answered
/// approval's call, run or denied by the continuation).
pub fn answer_call(conversation: &mut [Message], call_id: &str, output: &ToolOutput) {
    for message in conversation.iter_mut().rev() {
        if let Message::ToolResults(results) = message
            && let Some(result) = results.iter_mut().find(|r| r.call_id == call_id)
        {
            result.content = output.content.clone();
            result.is_error = output.is_error;
            result.images = output.images.clone();
            return;
        }
    }
}

/// The text of a message's text parts.
pub fn parts_text(parts: &[Part]) -> String {
    let mut text = String::new();
    for part in parts {
        if let Part::Text { text: t } = part {
            text.push_str(t);
        }
    }
    text
}

/// The stored form of one finished tool call; `approval` when it ran after one (A3).
pub fn tool_part(
    call: &ToolCall,
    input: &Value,
    output: &ToolOutput,
    approval: Option<Approval>,
) -> Part {
    let state = if output.is_error {
        ToolState::OutputError {
            error_text: output.content.clone(),
            approval,
        }
    } else {
        ToolState::OutputAvailable {
            output: Value::String(output.content.clone()),
            approval,
        }
    };
    Part::Tool(ToolPart {
        tool: call.name.clone(),
        tool_call_id: call.id.clone(),
        input: input.clone(),
        state,
    })
}

/// Stored messages as the model sees them, a user message's files as `files` shows them
/// (T23). Empty messages (an answer interrupted before its first word) are left out:
/// providers refuse empty content.
pub fn model_messages(history: &[impl Counted], files: &Files) -> Vec<Message> {
    let mut messages = Vec::new();
    for row in history.iter().map(Counted::row) {
        if row.role == "assistant" {
            assistant_messages(&row.parts, &mut messages);
        } else {
            messages.extend(user_message(&row.parts, files));
        }
    }
    messages
}

/// A user message: its text, then its files (a text-only message stays one string).
fn user_message(parts: &[Part], files: &Files) -> Option<Message> {
    let mut text = parts_text(parts);
    let mut attachments = Vec::new();
    let mut paths = Vec::new();
    for part in parts {
        let Part::File(file) = part else { continue };
        paths.extend(files.path(&file.url));
        let note;
        let after = match files.get(&file.url) {
            Some(Shown::Attachment(attachment)) => {
                attachments.push(attachment.clone());
                continue;
            }
            Some(Shown::Text(shown)) => shown,
            None => {
                note = attachments::named(file);
                &note
            }
        };
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(after);
    }
    if !paths.is_empty() {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(&format!(
            "[Attached files are in your workspace at {}]",
            paths.join(", ")
        ));
    }
    if !attachments.is_empty() {
        Some(Message::UserFiles {
            text,
            files: attachments,
        })
    } else {
        (!text.is_empty()).then_some(Message::User(text))
    }
}

pub fn assistant_messages(parts: &[Part], out: &mut Vec<Message>) {
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    let mut flush =
        |text: &mut String, calls: &mut Vec<ToolCall>, results: &mut Vec<ToolResult>| {
            if !text.is_empty() || !calls.is_empty() {
                out.push(Message::Assistant {
                    text: std::mem::take(text),
                    tool_calls: std::mem::take(calls),
                });
            }
            if !results.is_empty() {
                out.push(Message::ToolResults(std::mem::take(results)));
            }
        };
    for part in parts {
        match part {
            Part::StepStart => flush(&mut text, &mut calls, &mut results),
            // T18: answers stored before reasoning was split out may carry an inline
            // `<think>` block; neither the model nor a summary reads it back.
            Part::Text { text: t } => text.push_str(&providers::strip_inline_reasoning(t)),
            Part::Tool(tool) => {
                calls.push(ToolCall {
                    id: tool.tool_call_id.clone(),
                    name: tool.tool.clone(),
                    arguments: tool.input.to_string(),
                });
                let (content, is_error) = match &tool.state {
                    ToolState::OutputError { error_text, .. } => (error_text.clone(), true),
                    ToolState::OutputDenied { approval } => {
                        (approval.reason.clone().unwrap_or_default(), true)
                    }
                    // A3: the history stays valid while a call waits; a continuation puts
                    // the real result in its place (`answer_call`).
                    ToolState::ApprovalRequested { .. } | ToolState::ApprovalResponded { .. } => {
                        (AWAITING_APPROVAL.to_owned(), true)
                    }
                    ToolState::OutputAvailable { output, .. } => match output {
                        Value::String(s) => (s.clone(), false),
                        other => (other.to_string(), false),
                    },
                };
                results.push(ToolResult {
                    call_id: tool.tool_call_id.clone(),
                    content,
                    is_error,
                    images: Vec::new(),
                });
            }
            // Parts the brain does not write carry nothing the model reads; an answer has
            // no file parts (a user message's are read where it is).
            Part::Other(_) | Part::File(_) | Part::SourceDocument(_) => {}
        }
    }
    flush(&mut text, &mut calls, &mut results);
}

/// The UI chunks that rebuild a stored assistant message (a replayed turn, T12).
pub fn replay_chunks(parts: &[Part]) -> Vec<UiChunk> {
    let mut chunks = Vec::new();
    let mut step = 0;
    for part in parts {
        match part {
            Part::StepStart => {
                if step > 0 {
                    chunks.push(UiChunk::FinishStep);
                }
                step += 1;
                chunks.push(UiChunk::StartStep);
            }
            Part::Text { text } => {
                let id = format!("text-{step}");
                chunks.push(UiChunk::TextStart { id: id.clone() });
                chunks.push(UiChunk::TextDelta {
                    id: id.clone(),
                    delta: text.clone(),
                });
                chunks.push(UiChunk::TextEnd { id });
            }
            Part::Tool(tool) => {
                let tool_call_id = tool.tool_call_id.clone();
                chunks.push(UiChunk::ToolInputAvailable {
                    tool_call_id: tool_call_id.clone(),
                    tool_name: tool.tool.clone(),
                    input: tool.input.clone(),
                });
                match &tool.state {
                    ToolState::ApprovalRequested { approval } => {
                        chunks.push(UiChunk::ToolApprovalRequest {
                            approval_id: approval.id.to_string(),
                            tool_call_id,
                        });
                    }
                    ToolState::OutputDenied { .. } => {
                        chunks.push(UiChunk::ToolOutputDenied { tool_call_id });
                    }
                    ToolState::ApprovalResponded { .. } => {}
                    ToolState::OutputError { error_text, .. } => {
                        chunks.push(UiChunk::ToolOutputError {
                            tool_call_id,
                            error_text: error_text.clone(),
                        });
                    }
                    ToolState::OutputAvailable { output, .. } => {
                        chunks.push(UiChunk::ToolOutputAvailable {
                            tool_call_id,
                            output: output.clone(),
                        });
                    }
                }
            }
            Part::SourceDocument(source) => chunks.push(UiChunk::source_document(source)),
            Part::Other(_) | Part::File(_) => {}
        }
    }
    if step > 0 {
        chunks.push(UiChunk::FinishStep);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use protocol::parts::ApprovalRequest;
    use protocol::{MessageId, TurnId};
    use serde_json::json;

    use super::*;

    fn row(role: &str, parts: Vec<Part>) -> MessageRow {
        MessageRow {
            id: MessageId::new(),
            seq: 1,
            turn_id: TurnId::new(),
            role: role.into(),
            parts,
            status: "complete".into(),
            client_message_id: None,
            created_at: chrono::Utc::now(),
        }
    }

    fn text(t: &str) -> Part {
        Part::Text { text: t.into() }
    }

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "memory_write".into(),
            arguments: json!({"content": id}).to_string(),
        }
    }

    fn tool(id: &str, state: ToolState) -> Part {
        Part::Tool(ToolPart {
            tool: "memory_write".into(),
            tool_call_id: id.into(),
            input: json!({"content": id}),
            state,
        })
    }

    /// A part this brain does not write (a later brain's, or a client's) is neither read
    /// by the model nor replayed, and does not break the history around it.
    fn foreign() -> Part {
        Part::Other(json!({"type": "a-later-kind", "text": "not for the model"}))
    }

    fn result(id: &str, content: &str, is_error: bool) -> ToolResult {
        ToolResult {
            call_id: id.into(),
            content: content.into(),
            is_error,
            images: Vec::new(),
        }
    }

    fn file(url: &str, name: &str, media_type: &str) -> Part {
        Part::File(protocol::parts::FilePart {
            media_type: media_type.into(),
            filename: Some(name.into()),
            url: url.into(),
        })
    }

    /// T23: a user message's image is an attachment after its text, a text file is
    /// inlined after it, and a history read without its files names each one.
    #[test]
    fn a_user_message_shows_its_files() {
        let photo = providers::Attachment::new(
            providers::AttachmentKind::Image,
            "image/png",
            "cat.png",
            b"\x89PNG",
        );
        let history = [
            row(
                "user",
                vec![
                    text("what is this?"),
                    file("/v1/files/a", "cat.png", "image/png"),
                    file("/v1/files/b", "n.txt", "text/plain"),
                ],
            ),
            row("user", vec![text("plain")]),
        ];
        let files: Files = [
            ("/v1/files/a".to_owned(), Shown::Attachment(photo.clone())),
            ("/v1/files/b".to_owned(), Shown::Text("[file n.txt]".into())),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            model_messages(&history, &files),
            vec![
                Message::UserFiles {
                    text: "what is this?\n\n[file n.txt]".into(),
                    files: vec![photo],
                },
                Message::User("plain".into()),
            ]
        );
        assert_eq!(
            model_messages(&history[..1], &Files::default()),
            vec![Message::User(
                "what is this?\n\n[a file cat.png (image/png) was attached here]\n\n\
                 [a file n.txt (text/plain) was attached here]"
                    .into()
            )]
        );
    }

    #[test]
    fn stored_inline_reasoning_is_not_read_back() {
        let history = [
            row("user", vec![text("<think>mine</think>hi")]),
            row(
                "assistant",
                vec![Part::StepStart, text("<think>plan it</think>\n\nHello.")],
            ),
            row(
                "assistant",
                vec![Part::StepStart, text("<think>only this</think>")],
            ),
        ];
        assert_eq!(
            model_messages(&history, &Files::default()),
            vec![
                Message::User("<think>mine</think>hi".into()),
                Message::Assistant {
                    text: "Hello.".into(),
                    tool_calls: Vec::new(),
                },
            ]
        );
    }

    #[test]
    fn every_stored_call_reads_with_one_result() {
        let approval = uuid::Uuid::now_v7();
        let denied = Approval {
            id: uuid::Uuid::now_v7(),
            approved: false,
            reason: Some("denied: not now".into()),
        };
        let history = [
            row("user", vec![text("remember "), foreign(), text("both")]),
            row(
                "assistant",
                vec![
                    Part::StepStart,
                    text("On it."),
                    tool_part(
                        &call("c1"),
                        &json!({"content": "c1"}),
                        &ToolOutput::error("budget spent"),
                        None,
                    ),
                    tool("c2", ToolState::OutputDenied { approval: denied }),
                    foreign(),
                    Part::StepStart,
                    tool(
                        "c3",
                        ToolState::ApprovalRequested {
                            approval: ApprovalRequest { id: approval },
                        },
                    ),
                ],
            ),
        ];
        assert_eq!(
            model_messages(&history, &Files::default()),
            vec![
                Message::User("remember both".into()),
                Message::Assistant {
                    text: "On it.".into(),
                    tool_calls: vec![call("c1"), call("c2")],
                },
                Message::ToolResults(vec![
                    result("c1", "budget spent", true),
                    result("c2", "denied: not now", true),
                ]),
                Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![call("c3")],
                },
                Message::ToolResults(vec![result("c3", AWAITING_APPROVAL, true)]),
            ]
        );
        assert_eq!(
            replay_chunks(&history[1].parts),
            vec![
                UiChunk::StartStep,
                UiChunk::TextStart {
                    id: "text-1".into()
                },
                UiChunk::TextDelta {
                    id: "text-1".into(),
                    delta: "On it.".into(),
                },
                UiChunk::TextEnd {
                    id: "text-1".into()
                },
                UiChunk::ToolInputAvailable {
                    tool_call_id: "c1".into(),
                    tool_name: "memory_write".into(),
                    input: json!({"content": "c1"}),
                },
                UiChunk::ToolOutputError {
                    tool_call_id: "c1".into(),
                    error_text: "budget spent".into(),
                },
                UiChunk::ToolInputAvailable {
                    tool_call_id: "c2".into(),
                    tool_name: "memory_write".into(),
                    input: json!({"content": "c2"}),
                },
                UiChunk::ToolOutputDenied {
                    tool_call_id: "c2".into(),
                },
                UiChunk::FinishStep,
                UiChunk::StartStep,
                UiChunk::ToolInputAvailable {
                    tool_call_id: "c3".into(),
                    tool_name: "memory_write".into(),
                    input: json!({"content": "c3"}),
                },
                UiChunk::ToolApprovalRequest {
                    approval_id: approval.to_string(),
                    tool_call_id: "c3".into(),
                },
                UiChunk::FinishStep,
            ]
        );
    }
}
