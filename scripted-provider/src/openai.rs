//! OpenAI chat-completions wire format.

use serde_json::{Value, json};

use crate::plan::{self, Ending, Finish, Piece, Plan};
use crate::stream::{Ctx, Event};

fn finish_reason(ending: Ending) -> &'static str {
    match ending {
        Ending::Finish(Finish::ToolCalls) => "tool_calls",
        Ending::Finish(Finish::Length) => "length",
        Ending::Finish(Finish::Stop) | Ending::Cut | Ending::Error => "stop",
    }
}

fn usage(plan: &Plan, ctx: &Ctx) -> Value {
    let output = plan::output_tokens_of(plan);
    json!({
        "prompt_tokens": ctx.input_tokens,
        "completion_tokens": output,
        "total_tokens": ctx.input_tokens + output,
    })
}

fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

fn chunk_of(ctx: &Ctx, delta: Value, finish: Option<&str>) -> String {
    let mut c = json!({
        "id": format!("chatcmpl-{}", ctx.seq),
        "object": "chat.completion.chunk",
        "created": ctx.created,
        "model": ctx.model,
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
    });
    // With include_usage the real API puts `"usage": null` on every chunk but the last.
    if ctx.include_usage {
        c["usage"] = Value::Null;
    }
    data(&c)
}

pub(crate) fn stream_events(plan: &Plan, ctx: &Ctx) -> Vec<Event> {
    let chunk = |delta: Value, finish: Option<&str>| chunk_of(ctx, delta, finish);

    let mut events = Vec::new();
    let mut role_sent = false;
    if !plan.text.is_empty() || plan.calls.is_empty() {
        events.push(Event::now(chunk(
            json!({"role": "assistant", "content": "", "refusal": null}),
            None,
        )));
        role_sent = true;
        for (delay, piece) in &plan.text {
            // vLLM's and DeepSeek's field; the content stays absent meanwhile.
            if let Piece::Thought(thought) = piece {
                events.push(Event::after(
                    *delay,
                    chunk(json!({"reasoning_content": thought}), None),
                ));
                continue;
            }
            // A stamped delta is rendered when it is sent, so the renderer owns its context.
            let ctx = ctx.clone();
            events.push(Event::text(*delay, piece, move |text| {
                chunk_of(&ctx, json!({"content": text}), None)
            }));
        }
    }
    for (i, call) in plan.calls.iter().enumerate() {
        let mut head = json!({"tool_calls": [{
            "index": i,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]});
        // A tool-only answer announces the role on its first tool-call chunk.
        if !role_sent {
            head["role"] = json!("assistant");
            head["content"] = Value::Null;
            role_sent = true;
        }
        events.push(Event::now(chunk(head, None)));
        for piece in &call.fragments {
            events.push(Event::after(
                call.delay,
                chunk(
                    json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}),
                    None,
                ),
            ));
        }
    }
    match plan.ending {
        Ending::Finish(_) => {
            events.push(Event::now(chunk(
                json!({}),
                Some(finish_reason(plan.ending)),
            )));
            if ctx.include_usage {
                events.push(Event::now(data(&json!({
                    "id": format!("chatcmpl-{}", ctx.seq),
                    "object": "chat.completion.chunk",
                    "created": ctx.created,
                    "model": ctx.model,
                    "choices": [],
                    "usage": usage(plan, ctx),
                }))));
            }
            events.push(Event::now("data: [DONE]\n\n".to_string()));
        }
        Ending::Cut => {}
        Ending::Error => {
            events.push(Event::now(data(&json!({"error": {
                "message": "The server is overloaded or not ready yet.",
                "type": "server_error",
                "param": null,
                "code": null,
            }}))));
        }
    }
    events
}

pub(crate) fn complete(plan: &Plan, ctx: &Ctx) -> Value {
    let text = plan.text(ctx.epoch);
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !plan.calls.is_empty() { Value::Null } else { json!(text) },
        "refusal": null,
    });
    let thoughts: String = plan.thoughts().into_iter().map(|(_, t)| t).collect();
    if !thoughts.is_empty() {
        message["reasoning_content"] = json!(thoughts);
    }
    if !plan.calls.is_empty() {
        message["tool_calls"] = plan
            .calls
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments()},
                })
            })
            .collect();
    }
    json!({
        "id": format!("chatcmpl-{}", ctx.seq),
        "object": "chat.completion",
        "created": ctx.created,
        "model": ctx.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason(plan.ending),
        }],
        "usage": usage(plan, ctx),
    })
}

pub(crate) fn error_body(status: u16, message: Option<&str>) -> Value {
    let (kind, code, default_message) = match status {
        401 => (
            "invalid_request_error",
            Some("invalid_api_key"),
            "Incorrect API key provided.",
        ),
        404 => (
            "invalid_request_error",
            Some("model_not_found"),
            "The model does not exist or you do not have access to it.",
        ),
        429 => (
            "requests",
            Some("rate_limit_exceeded"),
            "Rate limit reached for requests. Please try again later.",
        ),
        503 => (
            "server_error",
            None,
            "The engine is currently overloaded, please try again later.",
        ),
        500..=599 => (
            "server_error",
            None,
            "The server had an error while processing your request.",
        ),
        _ => ("invalid_request_error", None, "Invalid request."),
    };
    json!({"error": {
        "message": message.unwrap_or(default_message),
        "type": kind,
        "param": null,
        "code": code,
    }})
}
