//! The offline demo model's replies (SPEC O4): with no provider key, `make dev`
//! still shows what the product is for. A few plain requests call the real tools the
//! agent is offered (``run `ls -la` ``, ``write `hi` to `notes.txt` ``, ``read `notes.txt` ``,
//! ``remember `the sky is blue` ``, `screenshot https://example.com` on a `browser` agent);
//! a tool's result is answered with its text; anything else gets what the demo can do.
//! Stateless: everything is decided from the request body, on both wire formats.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::plan::last_user_text;
use crate::{Reply, ToolCall};

pub(crate) const DEMO_DELAY: Duration = Duration::from_millis(15);

/// How much of a tool's result the demo quotes back.
const QUOTE_CHARS: usize = 1500;

const HELP: &str = "I can run a command (run `ls -la`), write a file (write `hello` to `notes.txt`), \
read it back (read `notes.txt`), remember a note (remember `the sky is blue`) and, on an agent \
with the `browser` profile, take a screenshot of a page (screenshot https://example.com). \
Set OPENAI_API_KEY or ANTHROPIC_API_KEY to talk to a real model.";

pub(crate) fn reply(body: &Value) -> Reply {
    let messages = body["messages"].as_array().map_or(&[][..], Vec::as_slice);
    if let Some((tool, output)) = last_tool_result(messages) {
        // A page opened for a screenshot: take it.
        let screenshot = last_user_text(body)
            .trim()
            .to_lowercase()
            .starts_with("screenshot ");
        if tool == "browser_navigate" && screenshot && offers(body, "browser_screenshot") {
            return call(
                messages.len(),
                "browser_screenshot",
                json!({}),
                "Offline demo model: taking the screenshot.".into(),
            );
        }
        let quoted: String = output.chars().take(QUOTE_CHARS).collect();
        return text(format!(
            "Offline demo model: `{tool}` answered:\n\n```\n{}\n```\n\nAsk for another one, or set a provider key for a real model.",
            quoted.trim_end()
        ));
    }
    let said: String = last_user_text(body).chars().take(200).collect();
    let Some((tool, input)) = request(&said) else {
        return text(format!(
            "Offline demo model here. You said: \"{said}\". {HELP}"
        ));
    };
    if !offers(body, tool) {
        return text(format!(
            "Offline demo model here. This agent has no `{tool}` tool: create one with the runtime profile `{}` to give it hands. {HELP}",
            if tool.starts_with("browser_") {
                "browser"
            } else {
                "light"
            }
        ));
    }
    call(
        messages.len(),
        tool,
        input,
        format!("Offline demo model: calling `{tool}`."),
    )
}

/// The tool and its input a plain request asks for.
fn request(said: &str) -> Option<(&'static str, Value)> {
    let lower = said.trim().to_lowercase();
    let quoted = backticked(said);
    let first = quoted.first().cloned();
    if lower.starts_with("run ") {
        return Some(("shell", json!({ "command": first? })));
    }
    if lower.starts_with("write ") && quoted.len() >= 2 {
        return Some((
            "write_file",
            json!({ "content": quoted[0], "path": quoted[1] }),
        ));
    }
    if lower.starts_with("read ") {
        return Some(("read_file", json!({ "path": first? })));
    }
    if lower.starts_with("remember ") {
        return Some(("memory_write", json!({ "content": first? })));
    }
    if lower.starts_with("screenshot ") || lower.starts_with("open ") {
        let url = said
            .split_whitespace()
            .find(|w| w.starts_with("http://") || w.starts_with("https://"))?
            .trim_matches(|c| c == '`' || c == '.' || c == ',');
        return Some(("browser_navigate", json!({ "url": url })));
    }
    None
}

/// The `code` spans of a message, in order.
fn backticked(said: &str) -> Vec<String> {
    said.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Whether the request offers the model a tool of this name (both wire formats).
fn offers(body: &Value, tool: &str) -> bool {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["function"]["name"].as_str() == Some(tool) || t["name"].as_str() == Some(tool))
}

/// When the history ends with a tool's result: the tool's name and the result's text.
fn last_tool_result(messages: &[Value]) -> Option<(String, String)> {
    let last = messages.last()?;
    let output = match (last["role"].as_str(), &last["content"]) {
        // OpenAI: a `tool` message.
        (Some("tool"), content) => content_text(content),
        // Anthropic: a user message of `tool_result` blocks.
        (Some("user"), Value::Array(blocks))
            if blocks.iter().any(|b| b["type"] == "tool_result") =>
        {
            blocks
                .iter()
                .filter(|b| b["type"] == "tool_result")
                .map(|b| content_text(&b["content"]))
                .collect::<Vec<_>>()
                .join("\n")
        }
        _ => return None,
    };
    let assistant = messages[..messages.len() - 1]
        .iter()
        .rev()
        .find(|m| m["role"] == "assistant")?;
    let openai = assistant["tool_calls"]
        .as_array()
        .and_then(|calls| calls.last())
        .and_then(|c| c["function"]["name"].as_str());
    let anthropic = assistant["content"].as_array().and_then(|blocks| {
        blocks
            .iter()
            .rev()
            .find(|b| b["type"] == "tool_use")
            .and_then(|b| b["name"].as_str())
    });
    Some((openai.or(anthropic)?.to_owned(), output))
}

fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .filter_map(|i| i["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Words per streamed delta: the help text is some 70 words, and a turn of the demo should
/// stream visibly yet end well within a second (autostart ticks each second in the tests).
const WORDS_PER_DELTA: usize = 4;

fn text(text: String) -> Reply {
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    Reply::Text {
        deltas: words
            .chunks(WORDS_PER_DELTA)
            .map(|chunk| chunk.concat())
            .collect(),
        delay: DEMO_DELAY,
    }
}

fn call(history_len: usize, tool: &str, input: Value, say: String) -> Reply {
    // Unique within the chat: the history only grows, and the clock tells apart two
    // chats' calls should a store ever compare them.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Reply::ToolCalls {
        text: Some(say),
        calls: vec![ToolCall {
            id: format!("demo_{history_len}_{nanos}"),
            name: tool.to_owned(),
            arguments: input.to_string(),
        }],
        fragment: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn openai(messages: Value, tools: &[&str]) -> Value {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t}}))
            .collect();
        json!({"messages": messages, "tools": tools})
    }

    fn called(reply: &Reply) -> (String, Value) {
        let Reply::ToolCalls { calls, text, .. } = reply else {
            panic!("not a tool call: {reply:?}");
        };
        assert!(text.as_deref().unwrap().starts_with("Offline demo model"));
        (
            calls[0].name.clone(),
            serde_json::from_str(&calls[0].arguments).unwrap(),
        )
    }

    fn said(reply: &Reply) -> String {
        let Reply::Text { deltas, .. } = reply else {
            panic!("not text: {reply:?}");
        };
        deltas.concat()
    }

    #[test]
    fn plain_requests_call_the_tools_offered() {
        let hands = ["shell", "write_file", "read_file", "memory_write"];
        let ask = |text: &str| reply(&openai(json!([{"role": "user", "content": text}]), &hands));
        assert_eq!(
            called(&ask("run `ls -la`")),
            ("shell".into(), json!({"command": "ls -la"}))
        );
        assert_eq!(
            called(&ask("Write `hello` to `notes.txt`")),
            (
                "write_file".into(),
                json!({"content": "hello", "path": "notes.txt"})
            )
        );
        assert_eq!(
            called(&ask("read `notes.txt`")),
            ("read_file".into(), json!({"path": "notes.txt"}))
        );
        assert_eq!(
            called(&ask("remember `the sky is blue`")),
            ("memory_write".into(), json!({"content": "the sky is blue"}))
        );
        // Without the backticks, nothing is called.
        assert!(said(&ask("remember it")).contains("You said: \"remember it\""));
        let help = said(&ask("what can you do?"));
        assert!(help.starts_with("Offline demo model here. You said: \"what can you do?\""));
        assert!(help.contains("run `ls -la`"), "{help}");
    }

    #[test]
    fn a_tool_not_offered_is_explained_not_called() {
        let body = openai(
            json!([{"role": "user", "content": "screenshot https://example.com"}]),
            &["shell"],
        );
        let text = said(&reply(&body));
        assert!(text.contains("no `browser_navigate` tool"), "{text}");
        assert!(text.contains("`browser`"), "{text}");
    }

    #[test]
    fn a_result_is_quoted_on_both_wires_and_a_page_is_then_screenshot() {
        let openai_after = openai(
            json!([
                {"role": "user", "content": "run `echo hi`"},
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                    "function": {"name": "shell", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "exit code: 0\nhi"},
            ]),
            &["shell"],
        );
        let text = said(&reply(&openai_after));
        assert!(
            text.starts_with("Offline demo model: `shell` answered"),
            "{text}"
        );
        assert!(text.contains("exit code: 0\nhi"), "{text}");

        let anthropic_after = json!({
            "messages": [
                {"role": "user", "content": "screenshot https://example.com"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t",
                    "name": "browser_navigate", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                    "content": "navigated"}]},
            ],
            "tools": [{"name": "browser_navigate"}, {"name": "browser_screenshot"}],
        });
        assert_eq!(
            called(&reply(&anthropic_after)),
            ("browser_screenshot".into(), json!({}))
        );
    }
}
