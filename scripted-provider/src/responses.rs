//! OpenAI Responses API wire format (`POST /v1/responses`), and the chat view of its
//! request that the history check, the demo model and the token estimate read.

use std::borrow::Cow;

use serde_json::{Value, json};

use crate::Wire;
use crate::plan::{self, Ending, Finish, Piece, Plan};
use crate::stream::{Ctx, Event};

/// A request body as the chat-completions-shaped readers see it.
pub(crate) fn chat_view(wire: Wire, body: &Value) -> Cow<'_, Value> {
    match wire {
        Wire::OpenAiResponses if body.is_object() => Cow::Owned(as_chat(body)),
        _ => Cow::Borrowed(body),
    }
}

fn response_id(ctx: &Ctx) -> String {
    format!("resp_scripted{}", ctx.seq)
}

fn message_id(ctx: &Ctx) -> String {
    format!("msg_scripted{}", ctx.seq)
}

fn call_item_id(ctx: &Ctx, index: usize) -> String {
    format!("fc_scripted{}_{index}", ctx.seq)
}

fn usage(plan: &Plan, ctx: &Ctx) -> Value {
    let output = plan::output_tokens_of(plan);
    json!({
        "input_tokens": ctx.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": ctx.input_tokens + output,
    })
}

/// The response object as the lifecycle events and the non-streamed answer carry it.
fn response(ctx: &Ctx, status: &str, output: Vec<Value>, plan: Option<&Plan>) -> Value {
    let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
    json!({
        "id": response_id(ctx),
        "object": "response",
        "created_at": ctx.created,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "model": ctx.model,
        "output": output,
        "parallel_tool_calls": true,
        "store": false,
        "usage": plan.map(|plan| usage(plan, ctx)),
    })
}

fn message_item(ctx: &Ctx, status: &str, text: Option<&str>) -> Value {
    let content = text.map_or_else(Vec::new, |text| {
        vec![json!({"type": "output_text", "text": text, "annotations": []})]
    });
    json!({
        "id": message_id(ctx),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    })
}

fn call_item(ctx: &Ctx, index: usize, call: &plan::PlannedCall, done: bool) -> Value {
    json!({
        "id": call_item_id(ctx, index),
        "type": "function_call",
        "status": if done { "completed" } else { "in_progress" },
        "arguments": if done { call.arguments() } else { String::new() },
        "call_id": call.id,
        "name": call.name,
    })
}

/// Writes the events of one stream, numbering them as the real API does.
struct Writer {
    events: Vec<Event>,
    sequence: u64,
}

impl Writer {
    fn render(&mut self, mut data: Value) -> String {
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        let kind = data["type"].as_str().unwrap_or_default().to_owned();
        format!("event: {kind}\ndata: {data}\n\n")
    }

    fn now(&mut self, data: Value) {
        let event = Event::now(self.render(data));
        self.events.push(event);
    }
}

pub(crate) fn stream_events(plan: &Plan, ctx: &Ctx) -> Vec<Event> {
    let mut w = Writer {
        events: Vec::new(),
        sequence: 0,
    };
    let created = response(ctx, "in_progress", Vec::new(), None);
    w.now(json!({"type": "response.created", "response": created}));
    w.now(json!({"type": "response.in_progress", "response": created}));
    if !plan.thoughts().is_empty() {
        reasoning_events(&mut w, plan, ctx);
    }
    if has_message(plan) {
        text_events(&mut w, plan, ctx);
        if plan.ending == Ending::Cut {
            return w.events;
        }
    }
    let offset = first_call_index(plan);
    for (i, call) in plan.calls.iter().enumerate() {
        let index = offset + i;
        let item_id = call_item_id(ctx, index);
        w.now(
            json!({"type": "response.output_item.added", "output_index": index,
            "item": call_item(ctx, index, call, false)}),
        );
        for piece in &call.fragments {
            let data = w.render(json!({"type": "response.function_call_arguments.delta",
                "item_id": item_id, "output_index": index, "delta": piece}));
            w.events.push(Event::after(call.delay, data));
        }
        // A call cut by the output limit is never done.
        let cut = plan.ending == Ending::Finish(Finish::Length) && i + 1 == plan.calls.len();
        if !cut {
            w.now(
                json!({"type": "response.function_call_arguments.done", "item_id": item_id,
                "output_index": index, "arguments": call.arguments()}),
            );
            w.now(
                json!({"type": "response.output_item.done", "output_index": index,
                "item": call_item(ctx, index, call, true)}),
            );
        }
    }
    end_events(&mut w, plan, ctx);
    w.events
}

/// Whether the output has a message item: when there is text, and for a plain answer
/// with no deltas.
fn has_message(plan: &Plan) -> bool {
    plan.has_text() || plan.calls.is_empty()
}

/// The output items in order: the reasoning, the message, the calls.
fn message_index(plan: &Plan) -> usize {
    usize::from(!plan.thoughts().is_empty())
}

fn first_call_index(plan: &Plan) -> usize {
    message_index(plan) + usize::from(has_message(plan))
}

fn reasoning_item(ctx: &Ctx, summary: Option<&str>) -> Value {
    let summary = summary.map_or_else(Vec::new, |text| {
        vec![json!({"type": "summary_text", "text": text})]
    });
    json!({"id": format!("rs_scripted{}", ctx.seq), "type": "reasoning", "summary": summary})
}

/// The reasoning item, first in the output: its summary streamed, then done.
fn reasoning_events(w: &mut Writer, plan: &Plan, ctx: &Ctx) {
    let item_id = format!("rs_scripted{}", ctx.seq);
    w.now(
        json!({"type": "response.output_item.added", "output_index": 0,
        "item": reasoning_item(ctx, None)}),
    );
    w.now(
        json!({"type": "response.reasoning_summary_part.added", "item_id": item_id,
        "output_index": 0, "summary_index": 0, "part": {"type": "summary_text", "text": ""}}),
    );
    let mut whole = String::new();
    for (delay, thought) in plan.thoughts() {
        whole.push_str(thought);
        let data = w.render(json!({"type": "response.reasoning_summary_text.delta",
            "item_id": item_id, "output_index": 0, "summary_index": 0, "delta": thought}));
        w.events.push(Event::after(delay, data));
    }
    w.now(
        json!({"type": "response.reasoning_summary_text.done", "item_id": item_id,
        "output_index": 0, "summary_index": 0, "text": whole}),
    );
    w.now(
        json!({"type": "response.reasoning_summary_part.done", "item_id": item_id,
        "output_index": 0, "summary_index": 0, "part": {"type": "summary_text", "text": whole}}),
    );
    w.now(
        json!({"type": "response.output_item.done", "output_index": 0,
        "item": reasoning_item(ctx, Some(&whole))}),
    );
}

/// The message item: its text deltas, and its end unless the stream breaks in it.
fn text_events(w: &mut Writer, plan: &Plan, ctx: &Ctx) {
    let item_id = message_id(ctx);
    let index = message_index(plan);
    w.now(
        json!({"type": "response.output_item.added", "output_index": index,
        "item": message_item(ctx, "in_progress", None)}),
    );
    w.now(
        json!({"type": "response.content_part.added", "item_id": item_id, "output_index": index,
        "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
    );
    for (delay, piece) in &plan.text {
        if matches!(piece, Piece::Thought(_)) {
            continue;
        }
        // Rendered when sent (a stamp), so it numbers itself from where the text began.
        let sequence = w.sequence;
        let item_id = item_id.clone();
        w.events.push(Event::text(*delay, piece, move |text| {
            let data = json!({"type": "response.output_text.delta", "item_id": item_id,
                "output_index": index, "content_index": 0, "delta": text, "logprobs": [],
                "sequence_number": sequence});
            format!("event: response.output_text.delta\ndata: {data}\n\n")
        }));
        w.sequence += 1;
    }
    match plan.ending {
        Ending::Cut => {}
        Ending::Error => {}
        Ending::Finish(_) => {
            let text = plan.text(ctx.epoch);
            w.now(
                json!({"type": "response.output_text.done", "item_id": item_id,
                "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
            );
            w.now(
                json!({"type": "response.content_part.done", "item_id": item_id,
                "output_index": index, "content_index": 0,
                "part": {"type": "output_text", "text": text, "annotations": []}}),
            );
            w.now(
                json!({"type": "response.output_item.done", "output_index": index,
                "item": message_item(ctx, "completed", Some(&text))}),
            );
        }
    }
}

fn end_events(w: &mut Writer, plan: &Plan, ctx: &Ctx) {
    match plan.ending {
        Ending::Finish(Finish::Length) => {
            let response = response(ctx, "incomplete", output(plan, ctx), Some(plan));
            w.now(json!({"type": "response.incomplete", "response": response}));
        }
        Ending::Finish(_) => {
            let response = response(ctx, "completed", output(plan, ctx), Some(plan));
            w.now(json!({"type": "response.completed", "response": response}));
        }
        Ending::Cut => {}
        Ending::Error => w.now(json!({"type": "error", "code": "server_error",
            "message": "The server had an error while processing your request.", "param": null})),
    }
}

fn output(plan: &Plan, ctx: &Ctx) -> Vec<Value> {
    let thoughts: String = plan.thoughts().into_iter().map(|(_, t)| t).collect();
    let reasoning = (!thoughts.is_empty()).then(|| reasoning_item(ctx, Some(&thoughts)));
    let message =
        has_message(plan).then(|| message_item(ctx, "completed", Some(&plan.text(ctx.epoch))));
    let offset = first_call_index(plan);
    reasoning
        .into_iter()
        .chain(message)
        .chain(
            plan.calls
                .iter()
                .enumerate()
                .map(|(i, call)| call_item(ctx, offset + i, call, true)),
        )
        .collect()
}

pub(crate) fn complete(plan: &Plan, ctx: &Ctx) -> Value {
    let status = match plan.ending {
        Ending::Finish(Finish::Length) => "incomplete",
        _ => "completed",
    };
    response(ctx, status, output(plan, ctx), Some(plan))
}

/// The request as chat-completions messages (`system` from `instructions`, a function
/// call joined to the assistant message before it, an output as a `tool` message), for
/// the parts of the provider that read a conversation.
pub(crate) fn as_chat(body: &Value) -> Value {
    let mut messages: Vec<Value> = Vec::new();
    for item in body["input"].as_array().into_iter().flatten() {
        match item["type"].as_str().unwrap_or("message") {
            "function_call" => {
                let call = json!({"id": item["call_id"], "type": "function", "function": {
                    "name": item["name"], "arguments": item["arguments"]}});
                match messages.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        if !last["tool_calls"].is_array() {
                            last["tool_calls"] = json!([]);
                        }
                        if let Some(calls) = last["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => messages
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => messages.push(json!({"role": "tool",
                "tool_call_id": item["call_id"], "content": item["output"]})),
            _ => messages.push(json!({"role": item["role"], "content": item["content"]})),
        }
    }
    let mut chat = json!({"model": body["model"], "messages": messages, "tools": body["tools"]});
    if let Some(system) = body["instructions"].as_str() {
        chat["system"] = json!(system);
    }
    chat
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chat_view_joins_calls_to_their_message() {
        let body = json!({
            "model": "gpt-4.1",
            "instructions": "Be brief.",
            "input": [
                {"type": "message", "role": "user", "content": "Weather?"},
                {"type": "message", "role": "assistant", "content": "Checking."},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "t", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "9"},
                {"type": "function_call_output", "call_id": "c2", "output": "noon"},
                {"type": "function_call", "call_id": "c3", "name": "w", "arguments": "{}"},
            ],
        });
        let chat = as_chat(&body);
        assert_eq!(chat["system"], "Be brief.");
        let messages = chat["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 5);
        assert_eq!(messages[1]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(
            messages[3],
            json!({"role": "tool", "tool_call_id": "c2", "content": "noon"})
        );
        assert_eq!(messages[4]["tool_calls"][0]["id"], "c3");
    }
}
