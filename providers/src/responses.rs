//! The OpenAI Responses API, streaming (T15): `POST {base}/responses`.
//!
//! The conversation is sent whole every time (`store: false`): nothing is kept at the
//! provider, so a fallback to another connection or a retry sees the same history.

use std::borrow::Cow;

use eventsource_stream::Event;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::sse::{self, Decoder};
use super::{
    Attachment, AttachmentKind, DataUrl, EmbeddingRequest, Embeddings, Endpoint, EventStream,
    Message, ModelProvider, ModelRequest, ProviderError, ProviderEvent, ProviderKind, StopReason,
    ToolCall, ToolResult, ToolSpec, Unavailable, Usage,
};

const PROVIDER: &str = "openai-responses";

/// The Responses API refuses a `max_output_tokens` below this (a connection check asks
/// for one token).
const MIN_OUTPUT_TOKENS: u32 = 16;

pub struct ResponsesProvider {
    client: reqwest::Client,
    endpoint: Endpoint,
    url: String,
}

impl ResponsesProvider {
    /// `endpoint.base_url` includes `/v1`, as for chat completions.
    pub fn new(client: reqwest::Client, endpoint: Endpoint) -> Self {
        let url = format!("{}/responses", endpoint.base_url.trim_end_matches('/'));
        Self {
            client,
            endpoint,
            url,
        }
    }
}

impl ModelProvider for ResponsesProvider {
    /// The Chat Completions and Responses APIs share their base with `/embeddings`.
    fn embed<'a>(
        &'a self,
        request: &'a EmbeddingRequest,
    ) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        Box::pin(crate::embeddings::embed(
            PROVIDER,
            &self.client,
            &self.endpoint,
            request,
        ))
    }

    fn stream<'a>(
        &'a self,
        request: &'a ModelRequest,
    ) -> BoxFuture<'a, Result<EventStream, ProviderError>> {
        Box::pin(async move {
            let mut http = self
                .client
                .post(&self.url)
                .json(&ResponsesRequest::new(request));
            if let Some(key) = &self.endpoint.api_key {
                http = http.bearer_auth(key);
            }
            let response = sse::send(PROVIDER, http, self.endpoint.connect_timeout).await?;
            Ok(sse::decode(
                PROVIDER,
                response.bytes_stream(),
                ResponsesDecoder::default(),
                self.endpoint.idle_timeout,
            ))
        })
    }
}

#[derive(Debug, Serialize)]
struct ResponsesRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    instructions: &'a str,
    input: Vec<InputItem<'a>>,
    /// Rendered once per catalog; left out when empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a serde_json::value::RawValue>,
    max_output_tokens: u32,
    stream: bool,
    /// The history travels with every request; the provider keeps nothing.
    store: bool,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InputItem<'a> {
    Message {
        role: &'static str,
        content: MessageContent<'a>,
    },
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        /// JSON text, passed back exactly as the model produced it.
        arguments: &'a str,
    },
    FunctionCallOutput {
        call_id: &'a str,
        output: Cow<'a, str>,
    },
}

/// A plain string for text alone; input parts only when files come with it (T23).
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum MessageContent<'a> {
    Text(&'a str),
    Parts(Vec<InputPart<'a>>),
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InputPart<'a> {
    #[serde(rename = "input_text")]
    Text { text: Cow<'a, str> },
    #[serde(rename = "input_image")]
    Image {
        image_url: DataUrl<'a>,
        detail: &'static str,
    },
    #[serde(rename = "input_file")]
    File {
        filename: &'a str,
        file_data: DataUrl<'a>,
    },
}

impl<'a> InputPart<'a> {
    fn file(attachment: &'a Attachment) -> Self {
        match attachment.kind {
            AttachmentKind::Image => Self::Image {
                image_url: DataUrl(attachment),
                detail: "auto",
            },
            AttachmentKind::Pdf => Self::File {
                filename: &attachment.filename,
                file_data: DataUrl(attachment),
            },
        }
    }
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a serde_json::Value,
    /// Strict is the Responses API's default, and it refuses the schemas most tools have
    /// (optional properties, no `additionalProperties: false`).
    strict: bool,
}

impl<'a> ResponsesRequest<'a> {
    fn new(request: &'a ModelRequest) -> Self {
        Self {
            model: &request.model,
            instructions: &request.system,
            input: request.messages.iter().flat_map(input_items).collect(),
            tools: request
                .tools
                .rendered(ProviderKind::OpenAiResponses, |specs| {
                    serde_json::value::to_raw_value(
                        &specs.iter().map(WireTool::new).collect::<Vec<_>>(),
                    )
                }),
            max_output_tokens: request.max_output_tokens.max(MIN_OUTPUT_TOKENS),
            stream: true,
            store: false,
        }
    }
}

/// One of our messages as input items: an assistant's calls and each tool result are
/// items of their own.
fn input_items(message: &Message) -> Vec<InputItem<'_>> {
    match message {
        Message::User(text) => vec![InputItem::Message {
            role: "user",
            content: MessageContent::Text(text),
        }],
        Message::UserFiles { text, files } => {
            let text = (!text.is_empty()).then(|| InputPart::Text {
                text: Cow::Borrowed(text),
            });
            vec![InputItem::Message {
                role: "user",
                content: MessageContent::Parts(
                    text.into_iter()
                        .chain(files.iter().map(InputPart::file))
                        .collect(),
                ),
            }]
        }
        Message::Assistant { text, tool_calls } => {
            let text = (!text.is_empty() || tool_calls.is_empty()).then_some(InputItem::Message {
                role: "assistant",
                content: MessageContent::Text(text),
            });
            text.into_iter()
                .chain(tool_calls.iter().map(|call| InputItem::FunctionCall {
                    call_id: &call.id,
                    name: &call.name,
                    arguments: &call.arguments,
                }))
                .collect()
        }
        Message::ToolResults(results) => {
            let mut items: Vec<InputItem<'_>> = results
                .iter()
                .map(|result| InputItem::FunctionCallOutput {
                    call_id: &result.call_id,
                    // The format has no error flag; the model reads the prefix.
                    output: if result.is_error {
                        Cow::Owned(format!("Error: {}", result.content))
                    } else {
                        Cow::Borrowed(&result.content)
                    },
                })
                .collect();
            items.extend(tool_images(results));
            items
        }
    }
}

/// A function call's output is text: the images of a step's results follow the outputs
/// as one user message, each result's images introduced by its call id (T24).
fn tool_images(results: &[ToolResult]) -> Option<InputItem<'_>> {
    let parts: Vec<InputPart<'_>> = results
        .iter()
        .filter(|result| !result.images.is_empty())
        .flat_map(|result| {
            let intro = InputPart::Text {
                text: Cow::Owned(format!(
                    "The images the tool call {} returned:",
                    result.call_id
                )),
            };
            std::iter::once(intro).chain(result.images.iter().map(InputPart::file))
        })
        .collect();
    (!parts.is_empty()).then_some(InputItem::Message {
        role: "user",
        content: MessageContent::Parts(parts),
    })
}

impl<'a> WireTool<'a> {
    fn new(tool: &'a ToolSpec) -> Self {
        Self {
            kind: "function",
            name: &tool.name,
            description: &tool.description,
            parameters: &tool.input_schema,
            strict: false,
        }
    }
}

/// One streamed event's data, dispatched on its `type` (the SSE `event:` name repeats it).
/// Events we do not act on (`response.created`, `response.content_part.added`,
/// `response.output_text.done`...) are ignored, and so are the ones OpenAI adds later.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum WireEvent {
    #[serde(rename = "response.output_text.delta")]
    TextDelta { delta: String },
    #[serde(rename = "response.reasoning_summary_text.delta")]
    ReasoningSummaryDelta { delta: String },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningDelta { delta: String },
    #[serde(rename = "response.output_item.added")]
    ItemAdded { item: Item },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        #[serde(default)]
        item_id: Option<String>,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        #[serde(default)]
        item_id: Option<String>,
        #[serde(default)]
        arguments: Option<String>,
    },
    #[serde(rename = "response.output_item.done")]
    ItemDone { item: Item },
    #[serde(rename = "response.completed")]
    Completed { response: WireResponse },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: WireResponse },
    #[serde(rename = "response.failed")]
    Failed {
        #[serde(default)]
        response: Option<WireResponse>,
    },
    /// Lenient: an error event is an error even when its details are missing.
    #[serde(rename = "error")]
    Error {
        #[serde(default)]
        code: Option<String>,
        #[serde(default)]
        error: Option<WireError>,
    },
    #[serde(other)]
    Ignored,
}

/// An output item; only function calls matter here (messages arrive as text deltas,
/// reasoning as reasoning deltas).
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum Item {
    #[serde(rename = "function_call")]
    FunctionCall {
        /// The item's id (`fc_…`), which the argument deltas name.
        #[serde(default)]
        id: Option<String>,
        /// The id a `function_call_output` answers.
        call_id: String,
        name: String,
        #[serde(default)]
        arguments: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Default, Deserialize)]
struct WireResponse {
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    incomplete_details: Option<IncompleteDetails>,
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct IncompleteDetails {
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct WireError {
    #[serde(default)]
    code: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

/// A function call being streamed.
#[derive(Debug)]
struct OpenCall {
    item_id: Option<String>,
    call_id: String,
    name: String,
    arguments: String,
    /// Reported as a [`ProviderEvent::ToolCall`] already.
    closed: bool,
}

/// Responses stream decoder.
///
/// A call is reported whole when its arguments are done (or its item is, for a server
/// that skips the arguments events); `response.completed` or `response.incomplete` is
/// the end marker and carries the usage.
#[derive(Debug, Default)]
struct ResponsesDecoder {
    calls: Vec<OpenCall>,
}

impl Decoder for ResponsesDecoder {
    fn feed(&mut self, event: &Event) -> Result<Vec<ProviderEvent>, ProviderError> {
        let wire: WireEvent = serde_json::from_str(&event.data).map_err(sse::undecodable)?;
        let events = match wire {
            WireEvent::TextDelta { delta } if !delta.is_empty() => {
                vec![ProviderEvent::TextDelta(delta)]
            }
            WireEvent::ReasoningSummaryDelta { delta } | WireEvent::ReasoningDelta { delta }
                if !delta.is_empty() =>
            {
                vec![ProviderEvent::ReasoningDelta(delta)]
            }
            WireEvent::ItemAdded { item } => self.open_call(item),
            WireEvent::ArgumentsDelta { item_id, delta } => self.arguments(item_id, delta),
            WireEvent::ArgumentsDone { item_id, arguments } => {
                self.arguments_done(item_id.as_deref(), arguments)
            }
            WireEvent::ItemDone { item } => self.item_done(item),
            WireEvent::Completed { response } => {
                let reason = if self.calls.is_empty() {
                    StopReason::Stop
                } else {
                    StopReason::ToolCalls
                };
                self.finish(response, reason)
            }
            WireEvent::Incomplete { response } => {
                let reason = match response
                    .incomplete_details
                    .as_ref()
                    .and_then(|details| details.reason.as_deref())
                {
                    Some("max_output_tokens") => StopReason::Length,
                    _ => StopReason::Other,
                };
                self.finish(response, reason)
            }
            WireEvent::Failed { response } => {
                return Err(stream_error(response.and_then(|r| r.error).as_ref()));
            }
            WireEvent::Error { code, error } => {
                let error = error.unwrap_or(WireError { code, kind: None });
                return Err(stream_error(Some(&error)));
            }
            WireEvent::TextDelta { .. }
            | WireEvent::ReasoningSummaryDelta { .. }
            | WireEvent::ReasoningDelta { .. }
            | WireEvent::Ignored => Vec::new(),
        };
        Ok(events)
    }
}

impl ResponsesDecoder {
    fn open_call(&mut self, item: Item) -> Vec<ProviderEvent> {
        let Item::FunctionCall {
            id,
            call_id,
            name,
            arguments,
        } = item
        else {
            return Vec::new();
        };
        let mut events = vec![ProviderEvent::ToolInputStart {
            id: call_id.clone(),
            name: name.clone(),
        }];
        if !arguments.is_empty() {
            events.push(ProviderEvent::ToolInputDelta {
                id: call_id.clone(),
                delta: arguments.clone(),
            });
        }
        self.calls.push(OpenCall {
            item_id: id,
            call_id,
            name,
            arguments,
            closed: false,
        });
        events
    }

    /// The call `item_id` names; without an id, the latest open one.
    fn position(&self, item_id: Option<&str>) -> Option<usize> {
        match item_id {
            Some(id) => self
                .calls
                .iter()
                .position(|call| call.item_id.as_deref() == Some(id)),
            None => self.calls.iter().rposition(|call| !call.closed),
        }
    }

    fn arguments(&mut self, item_id: Option<String>, delta: String) -> Vec<ProviderEvent> {
        let Some(call) = self
            .position(item_id.as_deref())
            .map(|at| &mut self.calls[at])
        else {
            return Vec::new();
        };
        if call.closed || delta.is_empty() {
            return Vec::new();
        }
        call.arguments.push_str(&delta);
        vec![ProviderEvent::ToolInputDelta {
            id: call.call_id.clone(),
            delta,
        }]
    }

    /// Reports call `at` once; `arguments`, when given, are the whole arguments.
    fn close_call(&mut self, at: usize, arguments: Option<String>) -> Vec<ProviderEvent> {
        let call = &mut self.calls[at];
        if call.closed {
            return Vec::new();
        }
        if let Some(arguments) = arguments.filter(|arguments| !arguments.is_empty()) {
            call.arguments = arguments;
        }
        call.closed = true;
        vec![ProviderEvent::ToolCall(ToolCall {
            id: call.call_id.clone(),
            name: call.name.clone(),
            // A call without arguments is a call with no arguments.
            arguments: if call.arguments.is_empty() {
                "{}".to_owned()
            } else {
                call.arguments.clone()
            },
        })]
    }

    fn arguments_done(
        &mut self,
        item_id: Option<&str>,
        arguments: Option<String>,
    ) -> Vec<ProviderEvent> {
        match self.position(item_id) {
            Some(at) => self.close_call(at, arguments),
            None => Vec::new(),
        }
    }

    fn item_done(&mut self, item: Item) -> Vec<ProviderEvent> {
        let Item::FunctionCall {
            id,
            call_id,
            name,
            arguments,
        } = item
        else {
            return Vec::new();
        };
        let (mut events, at) = match self.calls.iter().position(|call| call.call_id == call_id) {
            Some(at) => (Vec::new(), at),
            // A server that announces the call only now.
            None => {
                let events = self.open_call(Item::FunctionCall {
                    id,
                    call_id,
                    name,
                    arguments: String::new(),
                });
                (events, self.calls.len() - 1)
            }
        };
        events.extend(self.close_call(at, Some(arguments)));
        events
    }

    /// The end: calls never closed are reported with what came (the turn decides what a
    /// cut call means), then the usage and the reason.
    fn finish(&mut self, response: WireResponse, reason: StopReason) -> Vec<ProviderEvent> {
        let mut events = Vec::new();
        for at in 0..self.calls.len() {
            events.extend(self.close_call(at, None));
        }
        if let Some(usage) = response.usage
            && (usage.input_tokens.is_some() || usage.output_tokens.is_some())
        {
            events.push(ProviderEvent::Usage(Usage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
            }));
        }
        events.push(ProviderEvent::Finished(reason));
        events
    }
}

fn stream_error(error: Option<&WireError>) -> ProviderError {
    let named = |name: &str| {
        error.is_some_and(|error| {
            error.code.as_deref() == Some(name) || error.kind.as_deref() == Some(name)
        })
    };
    if named("rate_limit_exceeded") {
        // Mid-stream there is no header to read a delay from.
        ProviderError::RateLimited { retry_after: None }
    } else {
        ProviderError::Unavailable(Unavailable::StreamError)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::StreamExt;
    use serde_json::json;

    use super::*;
    use crate::sse::testing::{Items, decode_all_ways, serve_once, text};
    use crate::{Catalog, ToolResult};

    async fn decode(body: &str) -> Items {
        decode_all_ways::<ResponsesDecoder>(body.as_bytes()).await
    }

    /// One SSE event as api.openai.com frames it: the name, then the data repeating it.
    fn event(data: serde_json::Value) -> String {
        format!(
            "event: {}\ndata: {data}\n\n",
            data["type"].as_str().unwrap()
        )
    }

    fn response(status: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut response = json!({
            "id": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
            "object": "response",
            "created_at": 1741476542,
            "status": status,
            "error": null,
            "incomplete_details": null,
            "instructions": null,
            "max_output_tokens": 1024,
            "model": "gpt-4.1-2025-04-14",
            "output": [],
            "parallel_tool_calls": true,
            "store": false,
            "usage": null,
        });
        for (key, value) in extra.as_object().unwrap() {
            response[key] = value.clone();
        }
        response
    }

    fn usage_of(input: u64, output: u64) -> serde_json::Value {
        json!({
            "input_tokens": input,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input + output,
        })
    }

    fn usage(input: u64, output: u64) -> Result<ProviderEvent, ProviderError> {
        Ok(ProviderEvent::Usage(Usage {
            input_tokens: Some(input),
            output_tokens: Some(output),
        }))
    }

    fn text_events(deltas: &[&str]) -> String {
        let mut body = vec![
            event(
                json!({"type": "response.created", "sequence_number": 0, "response": response("in_progress", json!({}))}),
            ),
            event(
                json!({"type": "response.in_progress", "sequence_number": 1, "response": response("in_progress", json!({}))}),
            ),
            event(
                json!({"type": "response.output_item.added", "sequence_number": 2, "output_index": 0, "item": {"id": "msg_67ccd2bf17f0819081ff3bb2cf6508e6", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
            ),
            event(
                json!({"type": "response.content_part.added", "sequence_number": 3, "item_id": "msg_67ccd2bf17f0819081ff3bb2cf6508e6", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
            ),
        ];
        for (i, delta) in deltas.iter().enumerate() {
            body.push(event(json!({"type": "response.output_text.delta", "sequence_number": 4 + i, "item_id": "msg_67ccd2bf17f0819081ff3bb2cf6508e6", "output_index": 0, "content_index": 0, "delta": delta, "logprobs": []})));
        }
        body.push(event(json!({"type": "response.output_text.done", "sequence_number": 90, "item_id": "msg_67ccd2bf17f0819081ff3bb2cf6508e6", "output_index": 0, "content_index": 0, "text": deltas.concat(), "logprobs": []})));
        body.concat()
    }

    fn completed(usage: serde_json::Value) -> String {
        event(
            json!({"type": "response.completed", "sequence_number": 99, "response": response("completed", json!({"usage": usage}))}),
        )
    }

    #[tokio::test]
    async fn text_usage_and_stop() {
        let body = text_events(&["Grüß", " dich 👋 — 日本"]) + &completed(usage_of(37, 11));
        let items = decode(&body).await;
        assert_eq!(
            items,
            vec![
                Ok(ProviderEvent::TextDelta("Grüß".into())),
                Ok(ProviderEvent::TextDelta(" dich 👋 — 日本".into())),
                usage(37, 11),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    #[tokio::test]
    async fn reasoning_summaries_and_text_are_reasoning() {
        let body = [
            event(json!({"type": "response.output_item.added", "sequence_number": 2, "output_index": 0, "item": {"id": "rs_6806bfca0b2481918a5748308061a2600d3ce51bdffd5476", "type": "reasoning", "summary": []}})),
            event(json!({"type": "response.reasoning_summary_part.added", "sequence_number": 3, "item_id": "rs_6806bfca0b2481918a5748308061a2600d3ce51bdffd5476", "output_index": 0, "summary_index": 0, "part": {"type": "summary_text", "text": ""}})),
            event(json!({"type": "response.reasoning_summary_text.delta", "sequence_number": 4, "item_id": "rs_6806bfca0b2481918a5748308061a2600d3ce51bdffd5476", "output_index": 0, "summary_index": 0, "delta": "**Grüßen**"})),
            event(json!({"type": "response.reasoning_text.delta", "sequence_number": 5, "item_id": "rs_6806bfca0b2481918a5748308061a2600d3ce51bdffd5476", "output_index": 0, "content_index": 0, "delta": " kurz."})),
            event(json!({"type": "response.output_item.done", "sequence_number": 6, "output_index": 0, "item": {"id": "rs_6806bfca0b2481918a5748308061a2600d3ce51bdffd5476", "type": "reasoning", "summary": [{"type": "summary_text", "text": "**Grüßen**"}]}})),
            text_events(&["Hallo"]),
            completed(usage_of(20, 60)),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                Ok(ProviderEvent::ReasoningDelta("**Grüßen**".into())),
                Ok(ProviderEvent::ReasoningDelta(" kurz.".into())),
                Ok(ProviderEvent::TextDelta("Hallo".into())),
                usage(20, 60),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    fn call_events(index: usize, item: &str, call: &str, name: &str, pieces: &[&str]) -> String {
        let mut body = vec![event(
            json!({"type": "response.output_item.added", "sequence_number": 10 * index + 20, "output_index": index, "item": {"id": item, "type": "function_call", "status": "in_progress", "arguments": "", "call_id": call, "name": name}}),
        )];
        for piece in pieces {
            body.push(event(json!({"type": "response.function_call_arguments.delta", "sequence_number": 10 * index + 21, "item_id": item, "output_index": index, "delta": piece})));
        }
        let arguments = pieces.concat();
        body.push(event(json!({"type": "response.function_call_arguments.done", "sequence_number": 10 * index + 28, "item_id": item, "output_index": index, "arguments": arguments})));
        body.push(event(json!({"type": "response.output_item.done", "sequence_number": 10 * index + 29, "output_index": index, "item": {"id": item, "type": "function_call", "status": "completed", "arguments": arguments, "call_id": call, "name": name}})));
        body.concat()
    }

    fn start(id: &str, name: &str) -> Result<ProviderEvent, ProviderError> {
        Ok(ProviderEvent::ToolInputStart {
            id: id.into(),
            name: name.into(),
        })
    }

    fn delta(id: &str, delta: &str) -> Result<ProviderEvent, ProviderError> {
        Ok(ProviderEvent::ToolInputDelta {
            id: id.into(),
            delta: delta.into(),
        })
    }

    fn call(id: &str, name: &str, arguments: &str) -> Result<ProviderEvent, ProviderError> {
        Ok(ProviderEvent::ToolCall(ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }))
    }

    #[tokio::test]
    async fn function_calls_are_reported_by_call_id() {
        let a = "call_FthC9qRpsL5kBpwwyw6c7j4k";
        let b = "call_Wd9pmrmXb2UQ8KfX3nD1ZJ0e";
        let body = [
            text_events(&["Let me check."]),
            call_events(
                1,
                "fc_67ca09c6bedc8190a7abfec07b1a1332",
                a,
                "get_weather",
                &[r#"{"lo"#, r#"cation":"Zü"#, r#"rich"}"#],
            ),
            call_events(2, "fc_67ca09c6bedc8190a7abfec07b1a1333", b, "now", &[]),
            completed(usage_of(82, 41)),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                Ok(ProviderEvent::TextDelta("Let me check.".into())),
                start(a, "get_weather"),
                delta(a, r#"{"lo"#),
                delta(a, r#"cation":"Zü"#),
                delta(a, r#"rich"}"#),
                call(a, "get_weather", r#"{"location":"Zürich"}"#),
                start(b, "now"),
                call(b, "now", "{}"),
                usage(82, 41),
                Ok(ProviderEvent::Finished(StopReason::ToolCalls)),
            ]
        );
    }

    #[tokio::test]
    async fn a_call_announced_only_when_done_is_reported() {
        let body = [
            event(json!({"type": "response.output_item.done", "output_index": 0, "item": {"id": "fc_1", "type": "function_call", "status": "completed", "arguments": "{\"a\":1}", "call_id": "call_1", "name": "f"}})),
            completed(usage_of(1, 2)),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                start("call_1", "f"),
                call("call_1", "f", r#"{"a":1}"#),
                usage(1, 2),
                Ok(ProviderEvent::Finished(StopReason::ToolCalls)),
            ]
        );
    }

    #[tokio::test]
    async fn the_output_limit_is_length_and_a_cut_call_is_still_reported() {
        let body = [
            event(json!({"type": "response.output_item.added", "output_index": 0, "item": {"id": "fc_1", "type": "function_call", "status": "in_progress", "arguments": "", "call_id": "call_1", "name": "write_file"}})),
            event(json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 0, "delta": "{\"path\":\"/tmp/a\","})),
            event(json!({"type": "response.incomplete", "response": response("incomplete", json!({"incomplete_details": {"reason": "max_output_tokens"}, "usage": usage_of(5, 16)}))})),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                start("call_1", "write_file"),
                delta("call_1", r#"{"path":"/tmp/a","#),
                call("call_1", "write_file", r#"{"path":"/tmp/a","#),
                usage(5, 16),
                Ok(ProviderEvent::Finished(StopReason::Length)),
            ]
        );
        let filtered = text_events(&["x"])
            + &event(
                json!({"type": "response.incomplete", "response": response("incomplete", json!({"incomplete_details": {"reason": "content_filter"}}))}),
            );
        assert_eq!(
            decode(&filtered).await.last(),
            Some(&Ok(ProviderEvent::Finished(StopReason::Other)))
        );
    }

    #[tokio::test]
    async fn failures_and_error_events_end_the_stream() {
        let failed = text_events(&["Hal"])
            + &event(
                json!({"type": "response.failed", "sequence_number": 9, "response": response("failed", json!({"error": {"code": "server_error", "message": "The model failed to generate a response."}}))}),
            );
        assert_eq!(
            decode(&failed).await,
            vec![
                Ok(ProviderEvent::TextDelta("Hal".into())),
                Err(ProviderError::Unavailable(Unavailable::StreamError)),
            ]
        );
        let limited = event(
            json!({"type": "error", "sequence_number": 1, "code": "rate_limit_exceeded", "message": "Rate limit reached.", "param": null}),
        );
        assert_eq!(
            decode(&limited).await,
            vec![Err(ProviderError::RateLimited { retry_after: None })]
        );
        let nested = event(
            json!({"type": "error", "error": {"type": "server_error", "code": null, "message": "x"}}),
        );
        assert_eq!(
            decode(&nested).await,
            vec![Err(ProviderError::Unavailable(Unavailable::StreamError))]
        );
    }

    #[tokio::test]
    async fn a_cut_or_garbled_stream_is_incomplete_or_undecodable() {
        // The text is complete, but `response.completed` never came.
        let items = decode(&text_events(&["Hallo"])).await;
        assert_eq!(
            items,
            vec![
                Ok(ProviderEvent::TextDelta("Hallo".into())),
                Err(ProviderError::Unavailable(Unavailable::Incomplete)),
            ]
        );
        let calls = call_events(0, "fc_1", "call_1", "f", &["{}"]);
        let items = decode(&calls).await;
        assert_eq!(
            items.last(),
            Some(&Err(ProviderError::Unavailable(Unavailable::Incomplete)))
        );
        assert_eq!(
            decode("data: {\"type\":\"response.output_text.delta\"}\n\n").await,
            vec![Err(ProviderError::Unavailable(Unavailable::Decode))]
        );
    }

    fn tool_request() -> ModelRequest {
        ModelRequest {
            model: "gpt-4.1".into(),
            system: "You are terse.".into(),
            messages: vec![
                Message::User("Weather in Zürich?".into()),
                Message::Assistant {
                    text: "Let me check.".into(),
                    tool_calls: vec![ToolCall {
                        id: "call_1".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"location":"Zürich"}"#.into(),
                    }],
                },
                Message::ToolResults(vec![ToolResult {
                    call_id: "call_1".into(),
                    content: "12 °C".into(),
                    is_error: false,
                    images: Vec::new(),
                }]),
                Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "call_2".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"tz":"#.into(),
                    }],
                },
                Message::ToolResults(vec![ToolResult {
                    call_id: "call_2".into(),
                    content: "arguments are not valid JSON".into(),
                    is_error: true,
                    images: Vec::new(),
                }]),
                Message::Assistant {
                    text: "Sunny.".into(),
                    tool_calls: Vec::new(),
                },
            ],
            tools: Arc::new(Catalog::new(vec![ToolSpec {
                name: "get_weather".into(),
                description: "Current weather at a place.".into(),
                input_schema: json!({"type": "object", "properties": {"location": {"type": "string"}}}),
            }])),
            max_output_tokens: 512,
        }
    }

    #[test]
    fn request_body() {
        let body = serde_json::to_value(ResponsesRequest::new(&tool_request())).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "gpt-4.1",
                "instructions": "You are terse.",
                "input": [
                    {"type": "message", "role": "user", "content": "Weather in Zürich?"},
                    {"type": "message", "role": "assistant", "content": "Let me check."},
                    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"location\":\"Zürich\"}"},
                    {"type": "function_call_output", "call_id": "call_1", "output": "12 °C"},
                    {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"tz\":"},
                    {"type": "function_call_output", "call_id": "call_2", "output": "Error: arguments are not valid JSON"},
                    {"type": "message", "role": "assistant", "content": "Sunny."},
                ],
                "tools": [{
                    "type": "function",
                    "name": "get_weather",
                    "description": "Current weather at a place.",
                    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
                    "strict": false,
                }],
                "max_output_tokens": 512,
                "stream": true,
                "store": false,
            })
        );
        let mut plain = tool_request();
        plain.system.clear();
        plain.tools = Default::default();
        plain.max_output_tokens = 1;
        let body = serde_json::to_value(ResponsesRequest::new(&plain)).unwrap();
        assert!(body.get("instructions").is_none() && body.get("tools").is_none());
        assert_eq!(body["max_output_tokens"], 16);
    }

    /// The whole path over loopback HTTP: URL, headers, body, decoding, inline reasoning.
    #[tokio::test]
    async fn streams_over_http() {
        let body =
            text_events(&["<think>kurz</th", "ink>\n\nGrüß dich"]) + &completed(usage_of(3, 4));
        let (base, server) = serve_once(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n",
            body.as_bytes().chunks(100).map(<[u8]>::to_vec).collect(),
            Duration::from_millis(1),
            Duration::ZERO,
        )
        .await;
        let provider = ResponsesProvider::new(
            reqwest::Client::new(),
            Endpoint {
                base_url: format!("{base}/v1/"),
                api_key: Some("sk-test".into()),
                connect_timeout: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(5),
            },
        );
        let request = tool_request();
        let items: Items = provider.stream(&request).await.unwrap().collect().await;
        assert_eq!(text(&items), "Grüß dich");
        assert_eq!(items[0], Ok(ProviderEvent::ReasoningDelta("kurz".into())));
        assert_eq!(
            items.last(),
            Some(&Ok(ProviderEvent::Finished(StopReason::Stop)))
        );
        let received = server.await.unwrap();
        assert_eq!(received.request_line, "POST /v1/responses HTTP/1.1");
        assert_eq!(received.header("authorization"), Some("Bearer sk-test"));
        assert_eq!(
            received.body,
            serde_json::to_value(ResponsesRequest::new(&request)).unwrap()
        );
    }

    #[tokio::test]
    async fn a_refusal_status_is_mapped_like_the_others() {
        let (base, _server) = serve_once(
            "HTTP/1.1 429 Too Many Requests\r\nretry-after: 2\r\ncontent-length: 0\r\n\r\n",
            vec![],
            Duration::ZERO,
            Duration::ZERO,
        )
        .await;
        let provider = ResponsesProvider::new(
            reqwest::Client::new(),
            Endpoint {
                base_url: base,
                api_key: None,
                connect_timeout: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(5),
            },
        );
        assert_eq!(
            provider.stream(&tool_request()).await.err(),
            Some(ProviderError::RateLimited {
                retry_after: Some(Duration::from_secs(2))
            })
        );
    }

    /// T23: the Responses API takes `input_image` and `input_file` parts; a function
    /// call's output is text, so the screenshot follows it as a user message.
    #[test]
    fn files_and_tool_images_in_responses_form() {
        let body =
            serde_json::to_value(ResponsesRequest::new(&crate::fixtures::files_request())).unwrap();
        assert_eq!(
            body["input"],
            json!([
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "What is in these?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw==", "detail": "auto"},
                    {"type": "input_file", "filename": "report.pdf",
                     "file_data": "data:application/pdf;base64,JVBERg=="}
                ]},
                {"type": "function_call", "call_id": "call_s", "name": "browser_screenshot", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_s", "output": "saved shot.png"},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "The images the tool call call_s returned:"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw==", "detail": "auto"}
                ]}
            ])
        );
    }
}
