//! Anthropic Messages wire format.

use std::time::Duration;

use serde_json::{Value, json};

use crate::plan::{self, Ending, Finish, Piece, Plan};
use crate::stream::{Ctx, Event};

fn stop_reason(ending: Ending) -> &'static str {
    match ending {
        Ending::Finish(Finish::ToolCalls) => "tool_use",
        Ending::Finish(Finish::Length) => "max_tokens",
        Ending::Finish(Finish::Stop) | Ending::Cut | Ending::Error => "end_turn",
    }
}

fn message_id(ctx: &Ctx) -> String {
    format!("msg_scripted{}", ctx.seq)
}

fn sse(kind: &str, data: &Value) -> String {
    format!("event: {kind}\ndata: {data}\n\n")
}

/// Whether the answer opens with a text block: it does when there is text, and a plain
/// text answer with no deltas still has its (empty) block.
fn has_text_block(plan: &Plan) -> bool {
    plan.has_text() || plan.calls.is_empty()
}

/// Anthropic's signature of a thinking block: opaque to the client, sent back as is.
const SIGNATURE: &str = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds";

fn ping() -> Event {
    Event::now(sse("ping", &json!({"type": "ping"})))
}

fn block_stop(index: usize) -> Event {
    Event::now(sse(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": index}),
    ))
}

/// The plan's reasoning as the first block, a signed `thinking` block; whether there was
/// any.
fn thinking_block(plan: &Plan, events: &mut Vec<Event>) -> bool {
    let thoughts = plan.thoughts();
    if thoughts.is_empty() {
        return false;
    }
    events.push(Event::now(sse(
        "content_block_start",
        &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
    )));
    events.push(ping());
    for (delay, thought) in thoughts {
        events.push(Event::after(
            delay,
            sse(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": thought}}),
            ),
        ));
    }
    events.push(Event::now(sse(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": SIGNATURE}}),
    )));
    events.push(block_stop(0));
    true
}

pub(crate) fn stream_events(plan: &Plan, ctx: &Ctx) -> Vec<Event> {
    let mut events = vec![Event::now(sse(
        "message_start",
        &json!({"type": "message_start", "message": {
            "id": message_id(ctx),
            "type": "message",
            "role": "assistant",
            "model": ctx.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {"input_tokens": ctx.input_tokens, "output_tokens": 1},
        }}),
    ))];
    let mut index = 0;
    if thinking_block(plan, &mut events) {
        index = 1;
    }
    if has_text_block(plan) {
        let text_index = index;
        events.push(Event::now(sse(
            "content_block_start",
            &json!({"type": "content_block_start", "index": text_index, "content_block": {"type": "text", "text": ""}}),
        )));
        if text_index == 0 {
            events.push(ping());
        }
        for (delay, piece) in &plan.text {
            if matches!(piece, Piece::Thought(_)) {
                continue;
            }
            events.push(Event::text(*delay, piece, move |text| {
                sse(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": text_index, "delta": {"type": "text_delta", "text": text}}),
                )
            }));
        }
        match plan.ending {
            Ending::Cut => return events,
            Ending::Error => {
                events.push(Event::now(sse(
                    "error",
                    &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
                )));
                return events;
            }
            Ending::Finish(_) => {}
        }
        events.push(block_stop(text_index));
        index += 1;
    }
    for call in &plan.calls {
        events.push(Event::now(sse(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": call.id, "name": call.name, "input": {},
            }}),
        )));
        if index == 0 {
            events.push(ping());
        }
        // The real API opens every tool input with an empty partial_json.
        let pieces = std::iter::once("").chain(call.fragments.iter().map(String::as_str));
        for (i, piece) in pieces.enumerate() {
            let delay = if i == 0 { Duration::ZERO } else { call.delay };
            events.push(Event::after(
                delay,
                sse(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index, "delta": {
                        "type": "input_json_delta", "partial_json": piece,
                    }}),
                ),
            ));
        }
        events.push(block_stop(index));
        index += 1;
    }
    events.push(Event::now(sse(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(plan.ending), "stop_sequence": null},
            "usage": {"output_tokens": plan::output_tokens_of(plan)},
        }),
    )));
    events.push(Event::now(sse(
        "message_stop",
        &json!({"type": "message_stop"}),
    )));
    events
}

pub(crate) fn complete(plan: &Plan, ctx: &Ctx) -> Value {
    let mut content = Vec::new();
    let thoughts: String = plan.thoughts().into_iter().map(|(_, t)| t).collect();
    if !thoughts.is_empty() {
        content.push(json!({"type": "thinking", "thinking": thoughts, "signature": SIGNATURE}));
    }
    if has_text_block(plan) {
        content.push(json!({"type": "text", "text": plan.text(ctx.epoch)}));
    }
    for call in &plan.calls {
        // A truncated call's arguments do not parse; the real API then reports no input.
        let input: Value = serde_json::from_str(&call.arguments()).unwrap_or_else(|_| json!({}));
        content.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
    }
    json!({
        "id": message_id(ctx),
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        "stop_reason": stop_reason(plan.ending),
        "stop_sequence": null,
        "usage": {"input_tokens": ctx.input_tokens, "output_tokens": plan::output_tokens_of(plan)},
    })
}

pub(crate) fn error_body(status: u16, message: Option<&str>) -> Value {
    let (kind, default_message) = match status {
        401 => ("authentication_error", "invalid x-api-key"),
        403 => (
            "permission_error",
            "Your API key does not have permission to use the specified resource.",
        ),
        404 => (
            "not_found_error",
            "The requested resource could not be found.",
        ),
        413 => (
            "request_too_large",
            "Request exceeds the maximum allowed size.",
        ),
        429 => (
            "rate_limit_error",
            "Number of requests has exceeded your rate limit. Please try again later.",
        ),
        503 | 529 => ("overloaded_error", "Overloaded"),
        500..=599 => ("api_error", "Internal server error"),
        _ => ("invalid_request_error", "Invalid request."),
    };
    json!({"type": "error", "error": {"type": kind, "message": message.unwrap_or(default_message)}})
}
