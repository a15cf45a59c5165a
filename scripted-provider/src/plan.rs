//! Turns a [`Reply`] into a wire-neutral plan that both wire formats render, so the two
//! formats cannot drift apart in what they say, only in how they say it.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{Reply, ToolCall};

pub(crate) struct Plan {
    /// Text deltas, each sent after its delay.
    pub text: Vec<(Duration, Piece)>,
    pub calls: Vec<PlannedCall>,
    pub ending: Ending,
}

/// What one text delta says.
pub(crate) enum Piece {
    Fixed(String),
    /// The instant the delta is written ([`stamp`]): known only then.
    Stamp,
    /// This text again after every delay until the held streams are released (zero
    /// times if the release comes first); then the plan goes on.
    Held(String),
    /// Reasoning the model shows before its answer: each wire's reasoning field or
    /// block, never its text.
    Thought(String),
}

/// Characters of a [`stamp`].
const STAMP_CHARS: usize = 13;

/// Microseconds since `epoch`, 12 digits zero-padded, and a space: fixed width, so the
/// usage of a stamped reply is known before the stamps are.
pub(crate) fn stamp(epoch: Instant) -> String {
    format!("{:012} ", epoch.elapsed().as_micros())
}

pub(crate) struct PlannedCall {
    pub id: String,
    pub name: String,
    /// The argument pieces actually sent (for a truncated call, only a prefix).
    pub fragments: Vec<String>,
    /// Before each piece.
    pub delay: Duration,
}

impl PlannedCall {
    pub fn arguments(&self) -> String {
        self.fragments.concat()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Finish(Finish),
    Cut,
    Error,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    Stop,
    ToolCalls,
    Length,
}

pub(crate) enum Prepared {
    Status {
        status: u16,
        retry_after: Option<u64>,
    },
    Play {
        /// Wait before any response headers.
        stall: Duration,
        plan: Plan,
    },
}

impl Plan {
    /// Text only, then `ending`.
    fn text_only(text: Vec<(Duration, Piece)>, ending: Ending) -> Self {
        Self {
            text,
            calls: Vec::new(),
            ending,
        }
    }

    /// The text as one complete body carries it: stamps taken now, held repeats left out.
    pub fn text(&self, epoch: Instant) -> String {
        let mut text = String::new();
        for (_, piece) in &self.text {
            match piece {
                Piece::Fixed(t) => text.push_str(t),
                Piece::Stamp => text.push_str(&stamp(epoch)),
                Piece::Held(_) | Piece::Thought(_) => {}
            }
        }
        text
    }

    /// Characters of model output, the basis of the output token count. Held repeats
    /// are not counted: the usage is rendered before anyone knows how many there were.
    pub fn output_chars(&self) -> usize {
        let text: usize = self
            .text
            .iter()
            .map(|(_, piece)| match piece {
                Piece::Fixed(t) | Piece::Thought(t) => t.chars().count(),
                Piece::Stamp => STAMP_CHARS,
                Piece::Held(_) => 0,
            })
            .sum();
        let args: usize = self
            .calls
            .iter()
            .flat_map(|c| c.fragments.iter())
            .map(|f| f.chars().count())
            .sum();
        text + args
    }

    /// The delays a non-streamed answer waits out. A held piece's delay is its tick
    /// period, not a wait: such an answer waits for the release instead ([`Plan::held`]).
    pub fn total_delay(&self) -> Duration {
        let text: Duration = self
            .text
            .iter()
            .filter(|(_, piece)| !matches!(piece, Piece::Held(_)))
            .map(|(d, _)| *d)
            .sum();
        let calls: Duration = self
            .calls
            .iter()
            .map(|c| c.delay * c.fragments.len() as u32)
            .sum();
        text + calls
    }

    /// The reasoning pieces, in order, each with its delay.
    pub fn thoughts(&self) -> Vec<(Duration, &str)> {
        self.text
            .iter()
            .filter_map(|(delay, piece)| match piece {
                Piece::Thought(t) => Some((*delay, t.as_str())),
                _ => None,
            })
            .collect()
    }

    /// Whether the answer has text pieces (reasoning aside).
    pub fn has_text(&self) -> bool {
        self.text
            .iter()
            .any(|(_, piece)| !matches!(piece, Piece::Thought(_)))
    }

    /// Whether the plan waits for [`crate::ScriptedProvider::release_held`].
    pub fn held(&self) -> bool {
        self.text.iter().any(|(_, p)| matches!(p, Piece::Held(_)))
    }
}

/// The shortest tick of a held reply: a zero period would send without pause.
const MIN_TICK: Duration = Duration::from_millis(1);

pub(crate) fn prepare(reply: Reply) -> Prepared {
    let play = |plan: Plan| Prepared::Play {
        stall: Duration::ZERO,
        plan,
    };
    let text = |text, ending| play(Plan::text_only(text, ending));
    match reply {
        Reply::Text { deltas, delay } => text(timed(deltas, delay), Ending::Finish(Finish::Stop)),
        Reply::ToolCalls {
            text,
            calls,
            fragment,
        } => play(Plan {
            text: text
                .into_iter()
                .map(|t| (Duration::ZERO, Piece::Fixed(t)))
                .collect(),
            calls: calls.into_iter().map(|c| planned(c, fragment)).collect(),
            ending: Ending::Finish(Finish::ToolCalls),
        }),
        Reply::PacedToolCalls {
            calls,
            fragment,
            delay,
        } => play(Plan {
            text: Vec::new(),
            calls: calls
                .into_iter()
                .map(|c| PlannedCall {
                    delay,
                    ..planned(c, fragment)
                })
                .collect(),
            ending: Ending::Finish(Finish::ToolCalls),
        }),
        Reply::TruncatedToolCall { calls, fragment } => play(Plan {
            text: Vec::new(),
            calls: truncated(calls, fragment),
            ending: Ending::Finish(Finish::Length),
        }),
        Reply::TruncatedText { deltas } => text(
            timed(deltas, Duration::ZERO),
            Ending::Finish(Finish::Length),
        ),
        Reply::Status {
            status,
            retry_after,
        } => Prepared::Status {
            status,
            retry_after,
        },
        Reply::Cut { deltas, delay } => text(timed(deltas, delay), Ending::Cut),
        Reply::StreamError { deltas, delay } => text(timed(deltas, delay), Ending::Error),
        Reply::Stamped { count, delay } => play(Plan {
            text: (0..count).map(|_| (delay, Piece::Stamp)).collect(),
            calls: Vec::new(),
            ending: Ending::Finish(Finish::Stop),
        }),
        Reply::Held { delta, every } => play(Plan {
            text: vec![
                (Duration::ZERO, Piece::Fixed(delta.clone())),
                (every.max(MIN_TICK), Piece::Held(delta)),
            ],
            calls: Vec::new(),
            ending: Ending::Finish(Finish::Stop),
        }),
        Reply::Reasoning {
            reasoning,
            deltas,
            delay,
        } => play(Plan {
            text: reasoning
                .into_iter()
                .map(|t| (delay, Piece::Thought(t)))
                .chain(timed(deltas, delay))
                .collect(),
            calls: Vec::new(),
            ending: Ending::Finish(Finish::Stop),
        }),
        Reply::Stall { delay, deltas } => Prepared::Play {
            stall: delay,
            plan: Plan {
                text: timed(deltas, Duration::ZERO),
                calls: Vec::new(),
                ending: Ending::Finish(Finish::Stop),
            },
        },
    }
}

/// Text deltas sent `delay` apart.
fn timed(deltas: Vec<String>, delay: Duration) -> Vec<(Duration, Piece)> {
    deltas
        .into_iter()
        .map(|d| (delay, Piece::Fixed(d)))
        .collect()
}

/// The calls as planned, but the last one's arguments stop halfway, as when a provider
/// hits its output limit mid-call.
fn truncated(calls: Vec<ToolCall>, fragment: usize) -> Vec<PlannedCall> {
    let mut planned_calls: Vec<PlannedCall> = Vec::with_capacity(calls.len());
    let last = calls.len().saturating_sub(1);
    for (i, call) in calls.into_iter().enumerate() {
        if i == last {
            let cut = floor_char_boundary(&call.arguments, call.arguments.len() / 2);
            planned_calls.push(PlannedCall {
                fragments: fragments(&call.arguments[..cut], fragment),
                id: call.id,
                name: call.name,
                delay: Duration::ZERO,
            });
        } else {
            planned_calls.push(planned(call, fragment));
        }
    }
    planned_calls
}

fn planned(call: ToolCall, fragment: usize) -> PlannedCall {
    PlannedCall {
        fragments: fragments(&call.arguments, fragment),
        id: call.id,
        name: call.name,
        delay: Duration::ZERO,
    }
}

/// Splits into pieces of about `size` bytes, never inside a UTF-8 character (a real
/// provider never sends half a character either).
fn fragments(s: &str, size: usize) -> Vec<String> {
    if s.is_empty() {
        return Vec::new();
    }
    if size == 0 {
        return vec![s.to_string()];
    }
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let mut end = size.min(rest.len());
        while !rest.is_char_boundary(end) {
            end += 1;
        }
        let (piece, tail) = rest.split_at(end);
        out.push(piece.to_string());
        rest = tail;
    }
    out
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The deterministic token estimate used in every usage report: characters / 4, at least 1.
fn tokens(chars: usize) -> u64 {
    (chars as u64 / 4).max(1)
}

/// Input tokens the provider reports for a request body: characters of all text in the
/// messages (text content, tool arguments and results) and the system prompt, / 4, at
/// least 1. Public so tests can predict the usage numbers.
pub fn input_tokens(body: &Value) -> u64 {
    let chars =
        body.get("messages").map_or(0, text_chars) + body.get("system").map_or(0, text_chars);
    tokens(chars)
}

/// Output tokens the provider reports for the given output (text plus tool arguments).
pub fn output_tokens(output: &str) -> u64 {
    tokens(output.chars().count())
}

pub(crate) fn output_tokens_of(plan: &Plan) -> u64 {
    tokens(plan.output_chars())
}

fn text_chars(v: &Value) -> usize {
    match v {
        // A file's bytes are not text: providers bill an image by its size in pixels.
        Value::String(s) if s.starts_with("data:") => 0,
        Value::String(s) => s.chars().count(),
        Value::Array(items) => items.iter().map(text_chars).sum(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| match k.as_str() {
                // Structure, not text.
                "role" | "type" | "id" | "tool_call_id" | "tool_use_id" | "name"
                | "cache_control" => 0,
                // An Anthropic image or document's base64 bytes.
                "source" => 0,
                // Anthropic tool_use input is JSON, counted as the text it would be.
                "input" => serde_json::to_string(v).map_or(0, |s| s.chars().count()),
                _ => text_chars(v),
            })
            .sum(),
        _ => 0,
    }
}

/// The text of the last user message that has any text; works for both wire formats since
/// both allow a plain string or an array of `{"type":"text","text":..}` blocks. Anthropic
/// tool results ride in user messages, so those without text are skipped.
pub(crate) fn last_user_text(body: &Value) -> String {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return String::new();
    };
    for m in messages.iter().rev() {
        if m.get("role").and_then(Value::as_str) != Some("user") {
            continue;
        }
        let text = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(blocks)) => blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        };
        if !text.is_empty() {
            return text;
        }
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_respect_char_boundaries() {
        let s = "{\"a\":\"héllo\"}";
        let parts = fragments(s, 3);
        assert_eq!(parts.concat(), s);
        assert!(
            parts
                .iter()
                .all(|p| p.len() >= 3 || p == parts.last().unwrap())
        );
        assert_eq!(fragments(s, 0), vec![s.to_string()]);
        assert!(fragments("", 4).is_empty());
    }

    #[test]
    fn token_estimate_is_chars_over_four() {
        let body = serde_json::json!({
            "system": "abcd",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "12345678"}]}]
        });
        assert_eq!(input_tokens(&body), 3);
        assert_eq!(input_tokens(&serde_json::json!({})), 1);
        assert_eq!(output_tokens("abcdefghi"), 2);
    }
}
