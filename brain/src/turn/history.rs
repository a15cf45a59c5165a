//! Stored messages ↔ what the model sees.
//!
//! An assistant message is stored as AI SDK UI parts: per model call a `step-start`, its
//! text, and one `tool-<name>` part per call holding the input and the result. Rebuilding
//! the model's view walks those parts step by step, so every tool call sent back to a
//! provider carries exactly one result (the turn stores a synthetic one for calls it
//! could not finish, SPEC T8).

use protocol::ui::UiChunk;
use serde_json::{Value, json};

use crate::provider::{Message, ToolCall, ToolResult};
use crate::store::MessageRow;
use crate::tools::ToolOutput;

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
            return;
        }
    }
}

/// The text of a message's text parts.
pub fn parts_text(parts: &Value) -> String {
    let mut text = String::new();
    for part in parts.as_array().into_iter().flatten() {
        if part["type"] == "text"
            && let Some(t) = part["text"].as_str()
        {
            text.push_str(t);
        }
    }
    text
}

pub fn step_start() -> Value {
    json!({ "type": "step-start" })
}

pub fn text_part(text: &str) -> Value {
    json!({ "type": "text", "text": text })
}

/// The stored form of one finished tool call.
pub fn tool_part(call: &ToolCall, input: &Value, output: &ToolOutput) -> Value {
    let mut part = json!({
        "type": format!("tool-{}", call.name),
        "toolCallId": call.id,
        "input": input,
    });
    if output.is_error {
        part["state"] = json!("output-error");
        part["errorText"] = json!(output.content);
    } else {
        part["state"] = json!("output-available");
        part["output"] = json!(output.content);
    }
    part
}

/// Stored messages as the model sees them. Empty messages (an answer interrupted before
/// its first word) are left out: providers refuse empty content.
pub fn model_messages(history: &[MessageRow]) -> Vec<Message> {
    let mut messages = Vec::new();
    for row in history {
        if row.role == "assistant" {
            assistant_messages(&row.parts, &mut messages);
        } else {
            let text = parts_text(&row.parts);
            if !text.is_empty() {
                messages.push(Message::User(text));
            }
        }
    }
    messages
}

pub fn assistant_messages(parts: &Value, out: &mut Vec<Message>) {
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
    for part in parts.as_array().into_iter().flatten() {
        let kind = part["type"].as_str().unwrap_or_default();
        if kind == "step-start" {
            flush(&mut text, &mut calls, &mut results);
        } else if kind == "text" {
            text.push_str(part["text"].as_str().unwrap_or_default());
        } else if let Some(name) = kind.strip_prefix("tool-") {
            let id = part["toolCallId"].as_str().unwrap_or_default().to_owned();
            calls.push(ToolCall {
                id: id.clone(),
                name: name.to_owned(),
                arguments: part["input"].to_string(),
            });
            let (content, is_error) = match part["state"].as_str() {
                Some("output-error") => (
                    part["errorText"].as_str().unwrap_or_default().to_owned(),
                    true,
                ),
                Some("output-denied") => (
                    part["approval"]["reason"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    true,
                ),
                // A3: the history stays valid while a call waits; a continuation puts
                // the real result in its place (`answer_call`).
                Some("approval-requested" | "approval-responded") => {
                    (AWAITING_APPROVAL.to_owned(), true)
                }
                _ => match &part["output"] {
                    Value::String(s) => (s.clone(), false),
                    other => (other.to_string(), false),
                },
            };
            results.push(ToolResult {
                call_id: id,
                content,
                is_error,
            });
        }
    }
    flush(&mut text, &mut calls, &mut results);
}

/// The UI chunks that rebuild a stored assistant message (a replayed turn, T12).
pub fn replay_chunks(parts: &Value) -> Vec<UiChunk> {
    let mut chunks = Vec::new();
    let mut step = 0;
    for part in parts.as_array().into_iter().flatten() {
        let kind = part["type"].as_str().unwrap_or_default();
        if kind == "step-start" {
            if step > 0 {
                chunks.push(UiChunk::FinishStep);
            }
            step += 1;
            chunks.push(UiChunk::StartStep);
        } else if kind == "text" {
            let id = format!("text-{step}");
            chunks.push(UiChunk::TextStart { id: id.clone() });
            chunks.push(UiChunk::TextDelta {
                id: id.clone(),
                delta: part["text"].as_str().unwrap_or_default().to_owned(),
            });
            chunks.push(UiChunk::TextEnd { id });
        } else if let Some(name) = kind.strip_prefix("tool-") {
            let tool_call_id = part["toolCallId"].as_str().unwrap_or_default().to_owned();
            chunks.push(UiChunk::ToolInputAvailable {
                tool_call_id: tool_call_id.clone(),
                tool_name: name.to_owned(),
                input: part["input"].clone(),
            });
            match part["state"].as_str() {
                Some("approval-requested") => {
                    chunks.push(UiChunk::ToolApprovalRequest {
                        approval_id: part["approval"]["id"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        tool_call_id,
                    });
                    continue;
                }
                Some("output-denied") => {
                    chunks.push(UiChunk::ToolOutputDenied { tool_call_id });
                    continue;
                }
                Some("approval-responded") => continue,
                _ => {}
            }
            chunks.push(if part["state"] == "output-error" {
                UiChunk::ToolOutputError {
                    tool_call_id,
                    error_text: part["errorText"].as_str().unwrap_or_default().to_owned(),
                }
            } else {
                UiChunk::ToolOutputAvailable {
                    tool_call_id,
                    output: part["output"].clone(),
                }
            });
        }
    }
    if step > 0 {
        chunks.push(UiChunk::FinishStep);
    }
    chunks
}
