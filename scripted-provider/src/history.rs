//! History invariants: every tool call in a request's history has exactly one result, in
//! the place the real provider demands it, and no result points at a call that is not
//! there. The real providers reject such a request with a 400, so a history that breaks
//! this (a cancelled tool call without its synthetic result, say) would fail the next turn
//! in production; here it becomes a readable violation a test can assert on.
//!
//! Violation texts carry only indexes and ids, never message text.

use std::collections::HashSet;

use serde_json::Value;

use crate::Wire;

pub(crate) fn check(wire: Wire, body: &Value) -> Vec<String> {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Vec::new();
    };
    match wire {
        // A Responses request is checked in its chat view (`responses::chat_view`).
        Wire::OpenAi | Wire::OpenAiResponses => check_openai(messages),
        Wire::Anthropic => check_anthropic(messages),
    }
}

fn role(m: &Value) -> &str {
    m.get("role").and_then(Value::as_str).unwrap_or_default()
}

/// Pushes a violation for each id that occurs more than once in one message.
fn duplicates(i: usize, what: &str, ids: &[String], out: &mut Vec<String>) {
    let mut seen = HashSet::new();
    for id in ids {
        if !seen.insert(id) {
            out.push(format!(
                "messages[{i}]: {what} id {id} appears more than once"
            ));
        }
    }
}

/// OpenAI: an assistant message with `tool_calls` must be followed by one `role:"tool"`
/// message per call id, before any other message (the API rejects a user or assistant
/// message in between).
fn check_openai(messages: &[Value]) -> Vec<String> {
    struct Open {
        index: usize,
        calls: Vec<(String, usize)>,
    }
    fn close(open: Option<Open>, out: &mut Vec<String>) {
        let Some(open) = open else { return };
        for (id, answers) in open.calls {
            if answers == 0 {
                out.push(format!(
                    "messages[{}]: tool call {id} has no tool result",
                    open.index
                ));
            }
        }
    }

    let mut out = Vec::new();
    let mut open: Option<Open> = None;
    let mut all_calls: HashSet<String> = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        if role(m) == "tool" {
            let Some(id) = m.get("tool_call_id").and_then(Value::as_str) else {
                out.push(format!("messages[{i}]: tool message without tool_call_id"));
                continue;
            };
            let slot = open
                .as_mut()
                .and_then(|o| o.calls.iter_mut().find(|(c, _)| c == id));
            match slot {
                Some((_, answers)) => {
                    *answers += 1;
                    if *answers == 2 {
                        out.push(format!(
                            "messages[{i}]: tool call {id} has more than one tool result"
                        ));
                    }
                }
                None if all_calls.contains(id) => out.push(format!(
                    "messages[{i}]: tool result for {id} is not right after the assistant message that called it"
                )),
                None => out.push(format!(
                    "messages[{i}]: tool result refers to unknown tool call id {id}"
                )),
            }
            continue;
        }
        close(open.take(), &mut out);
        if role(m) != "assistant" {
            continue;
        }
        let ids: Vec<String> = m
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| {
                c.get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        if ids.is_empty() {
            continue;
        }
        duplicates(i, "tool call", &ids, &mut out);
        all_calls.extend(ids.iter().cloned());
        open = Some(Open {
            index: i,
            calls: ids.into_iter().map(|id| (id, 0)).collect(),
        });
    }
    close(open, &mut out);
    out
}

fn block_ids(m: &Value, kind: &str, key: &str) -> Vec<String> {
    m.get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some(kind))
        .map(|b| {
            b.get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// Anthropic: each assistant `tool_use` must be answered by exactly one `tool_result` in
/// the immediately following user message, and a `tool_result` may only answer a
/// `tool_use` of the immediately preceding assistant message.
fn check_anthropic(messages: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        match role(m) {
            "assistant" => {
                let uses = block_ids(m, "tool_use", "id");
                if uses.is_empty() {
                    continue;
                }
                duplicates(i, "tool_use", &uses, &mut out);
                let results = match messages.get(i + 1) {
                    Some(next) if role(next) == "user" => {
                        block_ids(next, "tool_result", "tool_use_id")
                    }
                    _ => Vec::new(),
                };
                for id in &uses {
                    match results.iter().filter(|r| *r == id).count() {
                        0 => out.push(format!(
                            "messages[{i}]: tool_use {id} has no tool_result in messages[{}]",
                            i + 1
                        )),
                        1 => {}
                        n => out.push(format!(
                            "messages[{i}]: tool_use {id} has {n} tool_results in messages[{}]",
                            i + 1
                        )),
                    }
                }
            }
            "user" => {
                let results = block_ids(m, "tool_result", "tool_use_id");
                if results.is_empty() {
                    continue;
                }
                let uses = match i.checked_sub(1).and_then(|p| messages.get(p)) {
                    Some(prev) if role(prev) == "assistant" => block_ids(prev, "tool_use", "id"),
                    _ => Vec::new(),
                };
                for id in results.iter().filter(|r| !uses.contains(r)) {
                    out.push(format!(
                        "messages[{i}]: tool_result for {id} answers no tool_use in the preceding assistant message"
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn openai(messages: Value) -> Vec<String> {
        check(Wire::OpenAi, &json!({ "messages": messages }))
    }

    fn anthropic(messages: Value) -> Vec<String> {
        check(Wire::Anthropic, &json!({ "messages": messages }))
    }

    fn oa_call(id: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}})
    }

    #[test]
    fn openai_valid_history_has_no_violations() {
        let v = openai(json!([
            {"role": "system", "content": "s"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [oa_call("a"), oa_call("b")]},
            {"role": "tool", "tool_call_id": "b", "content": "1"},
            {"role": "tool", "tool_call_id": "a", "content": "2"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "again"},
        ]));
        assert!(v.is_empty(), "{v:?}");
    }

    #[test]
    fn openai_missing_duplicate_orphan_and_late_results() {
        let v = openai(json!([
            {"role": "user", "content": "secret text"},
            {"role": "assistant", "tool_calls": [oa_call("a"), oa_call("b")]},
            {"role": "tool", "tool_call_id": "a", "content": "1"},
            {"role": "tool", "tool_call_id": "a", "content": "1"},
            {"role": "tool", "tool_call_id": "zzz", "content": "1"},
            {"role": "user", "content": "more"},
            {"role": "tool", "tool_call_id": "b", "content": "late"},
            {"role": "assistant", "tool_calls": [oa_call("c")]},
        ]));
        assert_eq!(v.len(), 5, "{v:?}");
        assert!(v[0].contains("a has more than one"));
        assert!(v[1].contains("unknown tool call id zzz"));
        assert!(v[2].contains("messages[1]: tool call b has no tool result"));
        assert!(v[3].contains("messages[6]") && v[3].contains("not right after"));
        assert!(v[4].contains("messages[7]: tool call c has no tool result"));
        assert!(v.iter().all(|s| !s.contains("secret")));
    }

    #[test]
    fn anthropic_rules() {
        let ok = anthropic(json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "x"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                {"type": "tool_use", "id": "t2", "name": "f", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t2", "content": "r"},
                {"type": "tool_result", "tool_use_id": "t1", "content": "r"},
                {"type": "text", "text": "and also"},
            ]},
            {"role": "assistant", "content": "fine"},
        ]));
        assert!(ok.is_empty(), "{ok:?}");

        let bad = anthropic(json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                {"type": "tool_use", "id": "t2", "name": "f", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "r"},
                {"type": "tool_result", "tool_use_id": "t1", "content": "r"},
                {"type": "tool_result", "tool_use_id": "nope", "content": "r"},
            ]},
        ]));
        assert_eq!(bad.len(), 3, "{bad:?}");
        assert!(bad[0].contains("t1 has 2 tool_results"));
        assert!(bad[1].contains("t2 has no tool_result in messages[2]"));
        assert!(bad[2].contains("messages[2]: tool_result for nope"));
    }
}
