//! Anthropic Messages, streaming.

use eventsource_stream::Event;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::sse::{self, Decoder};
use super::{
    Attachment, AttachmentKind, Endpoint, EventStream, Message, ModelProvider, ModelRequest,
    ProviderError, ProviderEvent, ProviderKind, StopReason, ToolCall, ToolResult, ToolSpec,
    Unavailable, Usage,
};

const PROVIDER: &str = "anthropic";

/// The wire format version the decoder below was written against.
const API_VERSION: &str = "2023-06-01";

pub struct AnthropicProvider {
    client: reqwest::Client,
    endpoint: Endpoint,
    url: String,
}

impl AnthropicProvider {
    pub fn new(client: reqwest::Client, endpoint: Endpoint) -> Self {
        let url = format!("{}/v1/messages", endpoint.base_url.trim_end_matches('/'));
        Self {
            client,
            endpoint,
            url,
        }
    }
}

impl ModelProvider for AnthropicProvider {
    fn stream<'a>(
        &'a self,
        request: &'a ModelRequest,
    ) -> BoxFuture<'a, Result<EventStream, ProviderError>> {
        Box::pin(async move {
            let mut http = self
                .client
                .post(&self.url)
                .header("anthropic-version", API_VERSION)
                .json(&MessagesRequest::new(request));
            // Optional so a gateway that injects the key itself can sit in front.
            if let Some(key) = &self.endpoint.api_key {
                http = http.header("x-api-key", key);
            }
            let response = sse::send(PROVIDER, http, self.endpoint.connect_timeout).await?;
            Ok(sse::decode(
                PROVIDER,
                response.bytes_stream(),
                MessagesDecoder::default(),
                self.endpoint.idle_timeout,
            ))
        })
    }
}

#[derive(Debug, Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    /// Anthropic rejects an empty system text block.
    #[serde(skip_serializing_if = "str::is_empty")]
    system: &'a str,
    messages: Vec<WireMessage<'a>>,
    /// Rendered once per catalog; left out when empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a serde_json::value::RawValue>,
    max_tokens: u32,
    stream: bool,
}

#[derive(Debug, Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: WireContent<'a>,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum WireContent<'a> {
    Text(&'a str),
    Blocks(Vec<WireBlock<'a>>),
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: serde_json::Map<String, serde_json::Value>,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: WireContent<'a>,
        #[serde(skip_serializing_if = "is_false")]
        is_error: bool,
    },
    Image {
        source: Base64Source<'a>,
    },
    /// A PDF.
    Document {
        source: Base64Source<'a>,
        title: &'a str,
    },
}

#[derive(Debug, Serialize)]
struct Base64Source<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    media_type: &'a str,
    data: &'a str,
}

impl<'a> WireBlock<'a> {
    fn file(attachment: &'a Attachment) -> Self {
        let source = Base64Source {
            kind: "base64",
            media_type: &attachment.media_type,
            data: &attachment.base64,
        };
        match attachment.kind {
            AttachmentKind::Image => Self::Image { source },
            AttachmentKind::Pdf => Self::Document {
                source,
                title: &attachment.filename,
            },
        }
    }
}

/// A tool result's content: its text, and after it the images it carries (T24).
fn tool_result_content(result: &ToolResult) -> WireContent<'_> {
    if result.images.is_empty() {
        return WireContent::Text(&result.content);
    }
    // Anthropic rejects an empty text block.
    let text = (!result.content.is_empty()).then(|| WireBlock::Text {
        text: &result.content,
    });
    WireContent::Blocks(
        text.into_iter()
            .chain(result.images.iter().map(WireBlock::file))
            .collect(),
    )
}

/// By reference because `skip_serializing_if` passes one.
fn is_false(value: &bool) -> bool {
    !*value
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a serde_json::Value,
}

impl<'a> MessagesRequest<'a> {
    fn new(request: &'a ModelRequest) -> Self {
        Self {
            model: &request.model,
            system: &request.system,
            messages: request.messages.iter().map(WireMessage::new).collect(),
            tools: request.tools.rendered(ProviderKind::Anthropic, |specs| {
                serde_json::value::to_raw_value(
                    &specs.iter().map(WireTool::new).collect::<Vec<_>>(),
                )
            }),
            max_tokens: request.max_output_tokens,
            stream: true,
        }
    }
}

impl<'a> WireMessage<'a> {
    fn new(message: &'a Message) -> Self {
        match message {
            Message::User(text) => Self {
                role: "user",
                content: WireContent::Text(text),
            },
            // Files first: Anthropic's guidance is that Claude reads an image best before
            // the text about it.
            Message::UserFiles { text, files } => Self {
                role: "user",
                content: WireContent::Blocks(
                    files
                        .iter()
                        .map(WireBlock::file)
                        .chain((!text.is_empty()).then(|| WireBlock::Text { text }))
                        .collect(),
                ),
            },
            Message::Assistant { text, tool_calls } => {
                // Anthropic rejects an empty text block.
                let text = (!text.is_empty()).then(|| WireBlock::Text { text });
                let calls = tool_calls.iter().map(|call| WireBlock::ToolUse {
                    id: &call.id,
                    name: &call.name,
                    // The API wants an object; arguments that were not one (a call cut
                    // short, a model that produced garbage) go back as no arguments.
                    input: serde_json::from_str(&call.arguments).unwrap_or_default(),
                });
                Self {
                    role: "assistant",
                    content: WireContent::Blocks(text.into_iter().chain(calls).collect()),
                }
            }
            Message::ToolResults(results) => Self {
                role: "user",
                content: WireContent::Blocks(
                    results
                        .iter()
                        .map(|result| WireBlock::ToolResult {
                            tool_use_id: &result.call_id,
                            content: tool_result_content(result),
                            is_error: result.is_error,
                        })
                        .collect(),
                ),
            },
        }
    }
}

impl<'a> WireTool<'a> {
    fn new(tool: &'a ToolSpec) -> Self {
        Self {
            name: &tool.name,
            description: &tool.description,
            input_schema: &tool.input_schema,
        }
    }
}

/// One event's data. Dispatch is on the data's `type`, not the SSE `event:` name: the two
/// always agree at Anthropic, and gateways have been seen dropping the names.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: StartedMessage,
    },
    ContentBlockStart {
        #[serde(default)]
        index: Option<u64>,
        content_block: ContentBlock,
    },
    ContentBlockDelta {
        #[serde(default)]
        index: Option<u64>,
        delta: BlockDelta,
    },
    ContentBlockStop {
        #[serde(default)]
        index: Option<u64>,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: Option<WireUsage>,
    },
    MessageStop,
    Error {
        /// Lenient: an error event is an error even when its details are missing.
        #[serde(default)]
        error: WireError,
    },
    /// `ping`, and whatever Anthropic adds next: its versioning policy allows new event
    /// types without a new API version.
    #[serde(other)]
    Ignored,
}

#[derive(Debug, Deserialize)]
struct StartedMessage {
    usage: Option<WireUsage>,
}

/// A thinking block's start (its text comes in `thinking_delta`s), redacted thinking, and
/// server tool blocks (`server_tool_use`, whose input deltas look like ours but are not
/// calls for us to run) are ignored.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        /// `{}` when streaming: the input comes as `input_json_delta`s.
        #[serde(default)]
        input: Option<serde_json::Value>,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: String,
    },
    /// In a `thinking` block; `signature_delta` and `redacted_thinking` blocks carry
    /// nothing readable and fall under `Other`.
    ThinkingDelta {
        #[serde(default)]
        thinking: String,
    },
    InputJsonDelta {
        #[serde(default)]
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct MessageDelta {
    stop_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct WireError {
    #[serde(default, rename = "type")]
    kind: String,
}

/// The `tool_use` block being streamed; blocks never interleave, so there is at most one.
#[derive(Debug)]
struct OpenCall {
    index: Option<u64>,
    id: String,
    name: String,
    /// The input the start event carried, for a gateway that sends it there whole.
    start_input: Option<serde_json::Value>,
    arguments: String,
}

impl OpenCall {
    fn close(self) -> ToolCall {
        let arguments = if self.arguments.is_empty() {
            match self.start_input {
                Some(serde_json::Value::Object(input)) if !input.is_empty() => {
                    serde_json::Value::Object(input).to_string()
                }
                _ => "{}".to_owned(),
            }
        } else {
            self.arguments
        };
        ToolCall {
            id: self.id,
            name: self.name,
            arguments,
        }
    }
}

/// Messages stream decoder.
///
/// The stop reason arrives in `message_delta` and the end in `message_stop`, so the reason
/// is held until then. A tool call is emitted whole at its block's `content_block_stop`;
/// one still open when the stream fails or is cut is never emitted.
#[derive(Debug, Default)]
struct MessagesDecoder {
    stop_reason: Option<StopReason>,
    call: Option<OpenCall>,
}

impl Decoder for MessagesDecoder {
    fn feed(&mut self, event: &Event) -> Result<Vec<ProviderEvent>, ProviderError> {
        let wire: WireEvent = serde_json::from_str(&event.data).map_err(sse::undecodable)?;
        let events = match wire {
            WireEvent::MessageStart { message } => message
                .usage
                .and_then(|usage| usage.input_tokens)
                // `output_tokens` here is a placeholder (usually 1); the real count comes
                // with `message_delta`.
                .map(|input| {
                    ProviderEvent::Usage(Usage {
                        input_tokens: Some(input),
                        output_tokens: None,
                    })
                })
                .into_iter()
                .collect(),
            WireEvent::ContentBlockStart {
                index,
                content_block:
                    ContentBlock::ToolUse {
                        id,
                        name,
                        input: start_input,
                    },
            } => self.open_call(index, id, name, start_input)?,
            WireEvent::ContentBlockDelta {
                index,
                delta: BlockDelta::InputJsonDelta { partial_json },
            } => self.call_input(index, partial_json),
            WireEvent::ContentBlockStop { index } => self.close_call(index),
            // The opening text is empty in practice, but nothing promises it.
            WireEvent::ContentBlockStart {
                content_block: ContentBlock::Text { text },
                ..
            }
            | WireEvent::ContentBlockDelta {
                delta: BlockDelta::TextDelta { text },
                ..
            } if !text.is_empty() => vec![ProviderEvent::TextDelta(text)],
            WireEvent::ContentBlockDelta {
                delta: BlockDelta::ThinkingDelta { thinking },
                ..
            } if !thinking.is_empty() => vec![ProviderEvent::ReasoningDelta(thinking)],
            WireEvent::ContentBlockStart { .. } | WireEvent::ContentBlockDelta { .. } => Vec::new(),
            WireEvent::MessageDelta { delta, usage } => self.message_delta(delta, usage),
            // Without a stop reason we cannot tell a whole answer from a cut one; a tool
            // call never closed is a cut one too.
            WireEvent::MessageStop => match self.stop_reason {
                Some(reason) if self.call.is_none() => vec![ProviderEvent::Finished(reason)],
                _ => return Err(ProviderError::Unavailable(Unavailable::Incomplete)),
            },
            WireEvent::Error { error } => return Err(stream_error(&error.kind)),
            WireEvent::Ignored => Vec::new(),
        };
        Ok(events)
    }
}

/// The phases of `feed` that track the open tool call and the stop reason.
impl MessagesDecoder {
    fn open_call(
        &mut self,
        index: Option<u64>,
        id: String,
        name: String,
        start_input: Option<serde_json::Value>,
    ) -> Result<Vec<ProviderEvent>, ProviderError> {
        // A block that starts before the previous one stopped: the stream is not the
        // documented format.
        if self.call.is_some() {
            return Err(ProviderError::Unavailable(Unavailable::Decode));
        }
        self.call = Some(OpenCall {
            index,
            id: id.clone(),
            name: name.clone(),
            start_input,
            arguments: String::new(),
        });
        Ok(vec![ProviderEvent::ToolInputStart { id, name }])
    }

    fn call_input(&mut self, index: Option<u64>, partial_json: String) -> Vec<ProviderEvent> {
        match &mut self.call {
            // The real API opens every input with an empty fragment.
            Some(call) if call.index == index && !partial_json.is_empty() => {
                call.arguments.push_str(&partial_json);
                vec![ProviderEvent::ToolInputDelta {
                    id: call.id.clone(),
                    delta: partial_json,
                }]
            }
            // Empty, or the input of a server tool.
            _ => Vec::new(),
        }
    }

    fn close_call(&mut self, index: Option<u64>) -> Vec<ProviderEvent> {
        match self.call.take() {
            Some(call) if call.index == index => vec![ProviderEvent::ToolCall(call.close())],
            other => {
                self.call = other;
                Vec::new()
            }
        }
    }

    fn message_delta(
        &mut self,
        delta: MessageDelta,
        usage: Option<WireUsage>,
    ) -> Vec<ProviderEvent> {
        if let Some(reason) = delta.stop_reason {
            self.stop_reason = Some(stop_reason(&reason));
        }
        // Counts here are cumulative; newer responses repeat `input_tokens` too, and
        // `Usage::merge` lets them win.
        usage
            .filter(|usage| usage.input_tokens.is_some() || usage.output_tokens.is_some())
            .map(|usage| {
                ProviderEvent::Usage(Usage {
                    input_tokens: usage.input_tokens,
                    output_tokens: usage.output_tokens,
                })
            })
            .into_iter()
            .collect()
    }
}

fn stream_error(kind: &str) -> ProviderError {
    match kind {
        // Mid-stream there is no header to read a delay from.
        "rate_limit_error" => ProviderError::RateLimited { retry_after: None },
        _ => ProviderError::Unavailable(Unavailable::StreamError),
    }
}

fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "end_turn" | "stop_sequence" => StopReason::Stop,
        "max_tokens" => StopReason::Length,
        "tool_use" => StopReason::ToolCalls,
        // `pause_turn`, `refusal`, `model_context_window_exceeded`...
        _ => StopReason::Other,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::StreamExt;
    use serde_json::json;

    use super::*;
    use crate::sse::testing::{Items, decode_all_ways, non_text, serve_once, text};
    use crate::{Catalog, ToolResult};

    async fn decode(body: &str) -> Items {
        decode_all_ways::<MessagesDecoder>(body.as_bytes()).await
    }

    fn request() -> ModelRequest {
        ModelRequest {
            model: "claude-sonnet-4-20250514".into(),
            system: "You are terse.".into(),
            messages: vec![
                Message::User("Hi".into()),
                Message::Assistant {
                    text: "Hello.".into(),
                    tool_calls: Vec::new(),
                },
                Message::User("Grüß dich".into()),
            ],
            tools: Default::default(),
            max_output_tokens: 1024,
        }
    }

    /// A conversation in the middle of a tool round: text with a call, a tool-only answer
    /// with two calls (one with arguments that do not parse), their results (one failed).
    fn tool_request() -> ModelRequest {
        ModelRequest {
            model: "claude-sonnet-4-20250514".into(),
            system: "You are terse.".into(),
            messages: vec![
                Message::User("Weather in Zürich?".into()),
                Message::Assistant {
                    text: "Let me check.".into(),
                    tool_calls: vec![ToolCall {
                        id: "toolu_1".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"location":"Zürich","days":[1,2]}"#.into(),
                    }],
                },
                Message::ToolResults(vec![ToolResult {
                    call_id: "toolu_1".into(),
                    content: "12 °C".into(),
                    is_error: false,
                    images: Vec::new(),
                }]),
                Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![
                        ToolCall {
                            id: "toolu_2".into(),
                            name: "get_time".into(),
                            arguments: r#"{"tz":"#.into(),
                        },
                        ToolCall {
                            id: "toolu_3".into(),
                            name: "get_time".into(),
                            // Valid JSON, but not an object.
                            arguments: "[1]".into(),
                        },
                    ],
                },
                Message::ToolResults(vec![
                    ToolResult {
                        call_id: "toolu_2".into(),
                        content: "arguments are not valid JSON".into(),
                        is_error: true,
                        images: Vec::new(),
                    },
                    ToolResult {
                        call_id: "toolu_3".into(),
                        content: "10:00".into(),
                        is_error: false,
                        images: Vec::new(),
                    },
                ]),
            ],
            tools: std::sync::Arc::new(Catalog::new(vec![
                ToolSpec {
                    name: "get_weather".into(),
                    description: "Current weather at a place.".into(),
                    input_schema: json!({
                        "type": "object",
                        "properties": {"location": {"type": "string"}},
                        "required": ["location"],
                    }),
                },
                ToolSpec {
                    name: "get_time".into(),
                    description: "The time in a zone.".into(),
                    input_schema: json!({"type": "object", "properties": {"tz": {"type": "string"}}}),
                },
            ])),
            max_output_tokens: 512,
        }
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

    /// One SSE event, named after its data's type as Anthropic sends it.
    fn event(data: &str) -> String {
        let kind = serde_json::from_str::<serde_json::Value>(data).unwrap()["type"]
            .as_str()
            .unwrap()
            .to_owned();
        format!("event: {kind}\ndata: {data}\n\n")
    }

    fn tool_start(index: usize, id: &str, name: &str) -> String {
        event(&format!(
            r#"{{"type":"content_block_start","index":{index},"content_block":{{"type":"tool_use","id":"{id}","name":"{name}","input":{{}}}}}}"#
        ))
    }

    /// An `input_json_delta`; `partial_json` is a JSON string literal.
    fn input_delta(index: usize, partial_json: &str) -> String {
        event(&format!(
            r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"input_json_delta","partial_json":{partial_json}}}}}"#
        ))
    }

    fn block_stop(index: usize) -> String {
        event(&format!(
            r#"{{"type":"content_block_stop","index":{index}}}"#
        ))
    }

    fn message_end(stop_reason: &str, output_tokens: u64) -> String {
        [
            event(&format!(
                r#"{{"type":"message_delta","delta":{{"stop_reason":"{stop_reason}","stop_sequence":null}},"usage":{{"output_tokens":{output_tokens}}}}}"#
            )),
            event(r#"{"type":"message_stop"}"#),
        ]
        .concat()
    }

    fn input(tokens: u64) -> Result<ProviderEvent, ProviderError> {
        Ok(ProviderEvent::Usage(Usage {
            input_tokens: Some(tokens),
            output_tokens: None,
        }))
    }

    fn output(tokens: u64) -> Result<ProviderEvent, ProviderError> {
        Ok(ProviderEvent::Usage(Usage {
            input_tokens: None,
            output_tokens: Some(tokens),
        }))
    }

    fn unavailable(kind: Unavailable) -> Result<ProviderEvent, ProviderError> {
        Err(ProviderError::Unavailable(kind))
    }

    const MESSAGE_START: &str = concat!(
        "event: message_start\n",
        r#"data: {"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1,"service_tier":"standard"}}}"#,
        "\n\n",
    );

    /// As api.anthropic.com sends it, `ping` included.
    const ANTHROPIC_TEXT: &str = concat!(
        "event: message_start\n",
        r#"data: {"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1,"service_tier":"standard"}}}"#,
        "\n\n",
        "event: content_block_start\n",
        r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        "\n\n",
        "event: ping\n",
        r#"data: {"type": "ping"}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Grüß"}}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" dich 👋 — 日本"}}"#,
        "\n\n",
        "event: content_block_stop\n",
        r#"data: {"type":"content_block_stop","index":0}"#,
        "\n\n",
        "event: message_delta\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#,
        "\n\n",
        "event: message_stop\n",
        r#"data: {"type":"message_stop"}"#,
        "\n\n",
    );

    #[tokio::test]
    async fn anthropic_text_usage_and_stop() {
        let items = decode(ANTHROPIC_TEXT).await;
        assert_eq!(text(&items), "Grüß dich 👋 — 日本");
        assert_eq!(
            items,
            vec![
                input(25),
                Ok(ProviderEvent::TextDelta("Grüß".into())),
                Ok(ProviderEvent::TextDelta(" dich 👋 — 日本".into())),
                output(15),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    #[tokio::test]
    async fn stop_reasons() {
        for (wire, expected) in [
            ("stop_sequence", StopReason::Stop),
            ("max_tokens", StopReason::Length),
            ("tool_use", StopReason::ToolCalls),
            ("refusal", StopReason::Other),
            ("pause_turn", StopReason::Other),
        ] {
            let body = format!(
                concat!(
                    "{}",
                    "event: message_delta\n",
                    r#"data: {{"type":"message_delta","delta":{{"stop_reason":"{}","stop_sequence":null}},"usage":{{"output_tokens":3}}}}"#,
                    "\n\n",
                    "event: message_stop\n",
                    r#"data: {{"type":"message_stop"}}"#,
                    "\n\n",
                ),
                MESSAGE_START, wire
            );
            assert_eq!(
                decode(&body).await,
                vec![input(25), output(3), Ok(ProviderEvent::Finished(expected))],
                "{wire}"
            );
        }
    }

    #[tokio::test]
    async fn thinking_is_reasoning_and_a_tool_call_assembled() {
        let body = concat!(
            "event: message_start\n",
            r#"data: {"type":"message_start","message":{"id":"msg_014p7gG3wDgGV9EUtLvnow3U","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","stop_sequence":null,"usage":{"input_tokens":472,"output_tokens":2},"content":[],"stop_reason":null}}"#,
            "\n\n",
            "event: content_block_start\n",
            r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            "\n\n",
            "event: content_block_delta\n",
            r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"The user wants the weather."}}"#,
            "\n\n",
            "event: content_block_delta\n",
            r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"}}"#,
            "\n\n",
            "event: content_block_stop\n",
            r#"data: {"type":"content_block_stop","index":0}"#,
            "\n\n",
            "event: content_block_start\n",
            r#"data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            "\n\n",
            "event: content_block_delta\n",
            r#"data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Let me check."}}"#,
            "\n\n",
            "event: content_block_stop\n",
            r#"data: {"type":"content_block_stop","index":1}"#,
            "\n\n",
            "event: content_block_start\n",
            r#"data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}"#,
            "\n\n",
            "event: content_block_delta\n",
            r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}"#,
            "\n\n",
            "event: content_block_delta\n",
            r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"location\": \"Zü"}}"#,
            "\n\n",
            "event: content_block_delta\n",
            r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"rich\", \"unit\": \"c"}}"#,
            "\n\n",
            "event: content_block_delta\n",
            r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"elsius\"}"}}"#,
            "\n\n",
            "event: content_block_stop\n",
            r#"data: {"type":"content_block_stop","index":2}"#,
            "\n\n",
            "event: message_delta\n",
            r#"data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}"#,
            "\n\n",
            "event: message_stop\n",
            r#"data: {"type":"message_stop"}"#,
            "\n\n",
        );
        let id = "toolu_01T1x1fJ34qAmk2tNTrN7Up6";
        assert_eq!(
            decode(body).await,
            vec![
                input(472),
                Ok(ProviderEvent::ReasoningDelta(
                    "The user wants the weather.".into()
                )),
                Ok(ProviderEvent::TextDelta("Let me check.".into())),
                start(id, "get_weather"),
                delta(id, r#"{"location": "Zü"#),
                delta(id, r#"rich", "unit": "c"#),
                delta(id, r#"elsius"}"#),
                call(
                    id,
                    "get_weather",
                    r#"{"location": "Zürich", "unit": "celsius"}"#
                ),
                output(89),
                Ok(ProviderEvent::Finished(StopReason::ToolCalls)),
            ]
        );
    }

    #[tokio::test]
    async fn two_tool_calls_in_one_answer() {
        // Tool-only, as the scripted provider and the real API send it: the first block
        // starts at index 0, with the `ping` after it.
        let body = [
            MESSAGE_START.to_owned(),
            tool_start(0, "toolu_a", "read_file"),
            event(r#"{"type": "ping"}"#),
            input_delta(0, r#""""#),
            input_delta(0, r#""{\"pa""#),
            input_delta(0, r#""th\":\"/etc/hosts\"}""#),
            block_stop(0),
            tool_start(1, "toolu_b", "now"),
            input_delta(1, r#""""#),
            block_stop(1),
            message_end("tool_use", 40),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                input(25),
                start("toolu_a", "read_file"),
                delta("toolu_a", r#"{"pa"#),
                delta("toolu_a", r#"th":"/etc/hosts"}"#),
                call("toolu_a", "read_file", r#"{"path":"/etc/hosts"}"#),
                start("toolu_b", "now"),
                // Nothing collected: no arguments.
                call("toolu_b", "now", "{}"),
                output(40),
                Ok(ProviderEvent::Finished(StopReason::ToolCalls)),
            ]
        );
    }

    #[tokio::test]
    async fn a_stream_cut_mid_arguments_reports_no_call() {
        let body = [
            MESSAGE_START.to_owned(),
            tool_start(0, "toolu_a", "write_file"),
            input_delta(0, r#""""#),
            input_delta(0, r#""{\"path\":\"/tmp/a\",""#),
            r#"event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"\"cont"#.to_owned(),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                input(25),
                start("toolu_a", "write_file"),
                delta("toolu_a", r#"{"path":"/tmp/a","#),
                unavailable(Unavailable::Incomplete),
            ]
        );
    }

    #[tokio::test]
    async fn an_error_mid_arguments_reports_no_call() {
        let body = [
            MESSAGE_START.to_owned(),
            tool_start(0, "toolu_a", "write_file"),
            input_delta(0, r#""{\"path\":""#),
            event(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#),
            input_delta(0, r#""\"/tmp/a\"}""#),
            block_stop(0),
            message_end("tool_use", 10),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                input(25),
                start("toolu_a", "write_file"),
                delta("toolu_a", r#"{"path":"#),
                unavailable(Unavailable::StreamError),
            ]
        );
    }

    #[tokio::test]
    async fn a_call_cut_by_max_tokens_is_still_reported() {
        // The API closes the block and reports `max_tokens`; the turn decides what a
        // truncated call means.
        let body = [
            MESSAGE_START.to_owned(),
            tool_start(0, "toolu_a", "write_file"),
            input_delta(0, r#""""#),
            input_delta(0, r#""{\"path\":\"/tmp/a\",""#),
            input_delta(0, r#""\"content\":\"Grüß""#),
            block_stop(0),
            message_end("max_tokens", 512),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                input(25),
                start("toolu_a", "write_file"),
                delta("toolu_a", r#"{"path":"/tmp/a","#),
                delta("toolu_a", r#""content":"Grüß"#),
                call(
                    "toolu_a",
                    "write_file",
                    r#"{"path":"/tmp/a","content":"Grüß"#
                ),
                output(512),
                Ok(ProviderEvent::Finished(StopReason::Length)),
            ]
        );
    }

    #[tokio::test]
    async fn a_call_never_closed_is_incomplete() {
        let body = [
            MESSAGE_START.to_owned(),
            tool_start(0, "toolu_a", "now"),
            input_delta(0, r#""{}""#),
            message_end("tool_use", 5),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                input(25),
                start("toolu_a", "now"),
                delta("toolu_a", "{}"),
                output(5),
                unavailable(Unavailable::Incomplete),
            ]
        );
    }

    #[tokio::test]
    async fn input_sent_whole_with_the_start_is_used() {
        // A gateway replaying a non-streamed answer puts the input in the start event.
        let body = [
            MESSAGE_START.to_owned(),
            event(
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_a","name":"get_weather","input":{"location":"Paris"}}}"#,
            ),
            block_stop(0),
            message_end("tool_use", 5),
        ]
        .concat();
        assert_eq!(
            non_text(decode(&body).await)[2],
            call("toolu_a", "get_weather", r#"{"location":"Paris"}"#)
        );
    }

    #[tokio::test]
    async fn server_tool_blocks_are_not_calls() {
        let body = [
            MESSAGE_START.to_owned(),
            event(
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_014hJH82Qum7Td6UV8gDXThB","name":"web_search","input":{}}}"#,
            ),
            input_delta(0, r#""{\"query\": \"weather Paris\"}""#),
            block_stop(0),
            event(
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"web_search_tool_result","tool_use_id":"srvtoolu_014hJH82Qum7Td6UV8gDXThB","content":[]}}"#,
            ),
            block_stop(1),
            event(
                r#"{"type":"content_block_start","index":2,"content_block":{"type":"text","text":""}}"#,
            ),
            event(
                r#"{"type":"content_block_delta","index":2,"delta":{"type":"text_delta","text":"Sunny."}}"#,
            ),
            block_stop(2),
            message_end("end_turn", 30),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                input(25),
                Ok(ProviderEvent::TextDelta("Sunny.".into())),
                output(30),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    #[tokio::test]
    async fn unknown_event_types_are_ignored() {
        let body = format!(
            concat!(
                "{}",
                "event: content_block_start\n",
                r#"data: {{"type":"content_block_start","index":0,"content_block":{{"type":"text","text":""}}}}"#,
                "\n\n",
                "event: brand_new_event\n",
                r#"data: {{"type":"brand_new_event","payload":{{"nested":[1,2,3]}}}}"#,
                "\n\n",
                "event: content_block_delta\n",
                r#"data: {{"type":"content_block_delta","index":0,"delta":{{"type":"citations_delta","citation":{{"type":"char_location","cited_text":"x"}}}}}}"#,
                "\n\n",
                "event: content_block_delta\n",
                r#"data: {{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"ok"}}}}"#,
                "\n\n",
                "event: message_delta\n",
                r#"data: {{"type":"message_delta","delta":{{"stop_reason":"end_turn","stop_sequence":null}},"usage":{{"input_tokens":25,"output_tokens":2}}}}"#,
                "\n\n",
                "event: message_stop\n",
                r#"data: {{"type":"message_stop"}}"#,
                "\n\n",
            ),
            MESSAGE_START
        );
        assert_eq!(
            decode(&body).await,
            vec![
                input(25),
                Ok(ProviderEvent::TextDelta("ok".into())),
                Ok(ProviderEvent::Usage(Usage {
                    input_tokens: Some(25),
                    output_tokens: Some(2),
                })),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    #[tokio::test]
    async fn a_mid_stream_error_event_ends_the_stream() {
        let body = format!(
            concat!(
                "{}",
                "event: content_block_delta\n",
                r#"data: {{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"Hal"}}}}"#,
                "\n\n",
                "event: error\n",
                r#"data: {{"type": "error", "error": {{"type": "overloaded_error", "message": "Overloaded"}}}}"#,
                "\n\n",
                "event: content_block_delta\n",
                r#"data: {{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"lo"}}}}"#,
                "\n\n",
            ),
            MESSAGE_START
        );
        assert_eq!(
            decode(&body).await,
            vec![
                input(25),
                Ok(ProviderEvent::TextDelta("Hal".into())),
                unavailable(Unavailable::StreamError),
            ]
        );
    }

    #[tokio::test]
    async fn a_mid_stream_rate_limit_is_rate_limited() {
        let body = concat!(
            "event: error\n",
            r#"data: {"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#,
            "\n\n",
        );
        assert_eq!(
            decode(body).await,
            vec![Err(ProviderError::RateLimited { retry_after: None })]
        );
    }

    #[tokio::test]
    async fn an_error_event_without_details_is_still_an_error() {
        assert_eq!(
            decode("event: error\ndata: {\"type\":\"error\"}\n\n").await,
            vec![unavailable(Unavailable::StreamError)]
        );
    }

    #[tokio::test]
    async fn a_cut_stream_is_incomplete_even_after_a_stop_reason() {
        let body = format!(
            concat!(
                "{}",
                "event: content_block_delta\n",
                r#"data: {{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"Hallo"}}}}"#,
                "\n\n",
                "event: message_delta\n",
                r#"data: {{"type":"message_delta","delta":{{"stop_reason":"end_turn","stop_sequence":null}},"usage":{{"output_tokens":2}}}}"#,
                "\n\n",
                "event: message_stop\n",
                r#"data: {{"type":"mess"#,
            ),
            MESSAGE_START
        );
        assert_eq!(
            decode(&body).await,
            vec![
                input(25),
                Ok(ProviderEvent::TextDelta("Hallo".into())),
                output(2),
                unavailable(Unavailable::Incomplete),
            ]
        );
    }

    #[tokio::test]
    async fn message_stop_without_a_stop_reason_is_incomplete() {
        let body = format!(
            concat!(
                "{}",
                "event: message_stop\n",
                r#"data: {{"type":"message_stop"}}"#,
                "\n\n",
            ),
            MESSAGE_START
        );
        assert_eq!(
            decode(&body).await,
            vec![input(25), unavailable(Unavailable::Incomplete)]
        );
    }

    #[tokio::test]
    async fn malformed_json_is_undecodable() {
        let body = format!(
            concat!(
                "{}",
                "event: content_block_delta\n",
                r#"data: {{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"Hal"#,
                "\n\n",
                "event: message_stop\n",
                r#"data: {{"type":"message_stop"}}"#,
                "\n\n",
            ),
            MESSAGE_START
        );
        assert_eq!(
            decode(&body).await,
            vec![input(25), unavailable(Unavailable::Decode)]
        );
        // Valid JSON without a type, and a known type missing its payload.
        for data in [
            r#"{"index":0}"#,
            r#"{"type":"content_block_delta","index":0}"#,
        ] {
            assert_eq!(
                decode(&format!("data: {data}\n\n")).await,
                vec![unavailable(Unavailable::Decode)],
                "{data}"
            );
        }
    }

    #[tokio::test]
    async fn event_names_are_not_needed() {
        // A gateway that strips `event:` lines keeps working: the data carries the type.
        let body: String = ANTHROPIC_TEXT
            .lines()
            .filter(|line| !line.starts_with("event:"))
            .map(|line| format!("{line}\n"))
            .collect();
        assert_eq!(
            non_text(decode(&body).await),
            non_text(decode(ANTHROPIC_TEXT).await)
        );
    }

    #[test]
    fn request_body() {
        let body = serde_json::to_value(MessagesRequest::new(&request())).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "claude-sonnet-4-20250514",
                "system": "You are terse.",
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
                    {"role": "user", "content": "Grüß dich"},
                ],
                "max_tokens": 1024,
                "stream": true,
            })
        );
    }

    #[test]
    fn request_body_with_tools_calls_and_results() {
        let body = serde_json::to_value(MessagesRequest::new(&tool_request())).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "claude-sonnet-4-20250514",
                "system": "You are terse.",
                "messages": [
                    {"role": "user", "content": "Weather in Zürich?"},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Let me check."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"location": "Zürich", "days": [1, 2]},
                        },
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "12 °C"},
                    ]},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}},
                        {"type": "tool_use", "id": "toolu_3", "name": "get_time", "input": {}},
                    ]},
                    {"role": "user", "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "content": "arguments are not valid JSON",
                            "is_error": true,
                        },
                        {"type": "tool_result", "tool_use_id": "toolu_3", "content": "10:00"},
                    ]},
                ],
                "tools": [
                    {
                        "name": "get_weather",
                        "description": "Current weather at a place.",
                        "input_schema": {
                            "type": "object",
                            "properties": {"location": {"type": "string"}},
                            "required": ["location"],
                        },
                    },
                    {
                        "name": "get_time",
                        "description": "The time in a zone.",
                        "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}},
                    },
                ],
                "max_tokens": 512,
                "stream": true,
            })
        );
    }

    #[test]
    fn an_empty_system_prompt_is_left_out() {
        let mut request = request();
        request.system.clear();
        let body = serde_json::to_value(MessagesRequest::new(&request)).unwrap();
        assert!(body.get("system").is_none(), "{body}");
    }

    /// The whole path over loopback HTTP: URL, headers, body, decoding.
    #[tokio::test]
    async fn streams_over_http() {
        let (base, server) = serve_once(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n\r\n",
            ANTHROPIC_TEXT
                .as_bytes()
                .chunks(100)
                .map(<[u8]>::to_vec)
                .collect(),
            Duration::from_millis(1),
            Duration::ZERO,
        )
        .await;
        let provider = AnthropicProvider::new(
            reqwest::Client::new(),
            Endpoint {
                base_url: format!("{base}/"),
                api_key: Some("sk-ant-test".into()),
                connect_timeout: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(5),
            },
        );
        let request = request();
        let items: Items = provider.stream(&request).await.unwrap().collect().await;
        assert_eq!(text(&items), "Grüß dich 👋 — 日本");
        assert_eq!(
            items.last(),
            Some(&Ok(ProviderEvent::Finished(StopReason::Stop)))
        );

        let received = server.await.unwrap();
        assert_eq!(received.request_line, "POST /v1/messages HTTP/1.1");
        assert_eq!(received.header("x-api-key"), Some("sk-ant-test"));
        assert_eq!(received.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(received.header("authorization"), None);
        assert_eq!(received.header("content-type"), Some("application/json"));
        assert_eq!(
            received.body,
            serde_json::to_value(MessagesRequest::new(&request)).unwrap()
        );
    }

    /// T23: Anthropic takes `image` and `document` blocks with a base64 source, files
    /// before the text; a tool result carries its screenshot in its own content blocks.
    #[test]
    fn files_and_tool_images_in_anthropic_form() {
        let body =
            serde_json::to_value(MessagesRequest::new(&crate::fixtures::files_request())).unwrap();
        let png = json!({"type": "base64", "media_type": "image/png", "data": "iVBORw=="});
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [
                    {"type": "image", "source": png},
                    {"type": "document", "title": "report.pdf", "source":
                        {"type": "base64", "media_type": "application/pdf", "data": "JVBERg=="}},
                    {"type": "text", "text": "What is in these?"}
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_s", "name": "browser_screenshot", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_s", "content": [
                        {"type": "text", "text": "saved shot.png"},
                        {"type": "image", "source": png}
                    ]}
                ]}
            ])
        );
    }
}
