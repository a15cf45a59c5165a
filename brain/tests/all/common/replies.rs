//! What the scripted model answers, in the shapes most tests queue: text, and tool calls.

use std::time::Duration;

use scripted_provider::{Reply, ToolCall};
use serde_json::Value;

/// The model answers `t` in one delta.
pub fn text(t: &str) -> Reply {
    deltas(&[t])
}

/// The model answers these deltas, one after another.
pub fn deltas(deltas: &[&str]) -> Reply {
    Reply::Text {
        deltas: deltas.iter().map(|d| (*d).to_owned()).collect(),
        delay: Duration::from_millis(1),
    }
}

/// One call of tool `name` with `arguments`.
pub fn call(id: &str, name: &str, arguments: Value) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.to_string(),
    }
}

/// The model answers with these calls, their arguments streamed 7 bytes at a time.
pub fn calls(calls: Vec<ToolCall>) -> Reply {
    Reply::ToolCalls {
        text: None,
        calls,
        fragment: 7,
    }
}
