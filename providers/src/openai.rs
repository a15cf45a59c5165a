//! OpenAI-compatible chat completions, streaming (OpenAI, vLLM, Ollama, LiteLLM,
//! OpenRouter...).
//!
//! Only what every one of those servers accepts goes into the request: `max_tokens` rather
//! than OpenAI's newer `max_completion_tokens`, plain string contents unless files come
//! with a message (T23).

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

const PROVIDER: &str = "openai";

pub struct OpenAiProvider {
    client: reqwest::Client,
    endpoint: Endpoint,
    url: String,
}

impl OpenAiProvider {
    pub fn new(client: reqwest::Client, endpoint: Endpoint) -> Self {
        let url = format!(
            "{}/chat/completions",
            endpoint.base_url.trim_end_matches('/')
        );
        Self {
            client,
            endpoint,
            url,
        }
    }
}

impl ModelProvider for OpenAiProvider {
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
            let mut http = self.client.post(&self.url).json(&ChatRequest::new(request));
            // Local servers (Ollama, vLLM) run without a key.
            if let Some(key) = &self.endpoint.api_key {
                http = http.bearer_auth(key);
            }
            let response = sse::send(PROVIDER, http, self.endpoint.connect_timeout).await?;
            Ok(sse::decode(
                PROVIDER,
                response.bytes_stream(),
                ChatDecoder::default(),
                self.endpoint.idle_timeout,
            ))
        })
    }
}

#[derive(Debug, Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<ChatMessage<'a>>,
    /// Left out when empty: some servers reject `"tools": []`. Rendered once per catalog.
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a serde_json::value::RawValue>,
    max_tokens: u32,
    stream: bool,
    /// Without it the stream carries no token counts at all.
    stream_options: StreamOptions,
}

#[derive(Debug, Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
enum ChatMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: UserContent<'a>,
    },
    Assistant {
        /// `null` when the model only called tools.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ChatToolCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: Cow<'a, str>,
    },
}

/// A plain string for text alone, which every compatible server takes; content parts
/// only when files come with it (T23).
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    Text(&'a str),
    Parts(Vec<ChatPart<'a>>),
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ChatPart<'a> {
    Text {
        text: Cow<'a, str>,
    },
    ImageUrl {
        image_url: ImageUrl<'a>,
    },
    /// Chat Completions takes PDFs only, as a `file` part.
    File {
        file: FileData<'a>,
    },
}

#[derive(Debug, Serialize)]
struct ImageUrl<'a> {
    url: DataUrl<'a>,
}

#[derive(Debug, Serialize)]
struct FileData<'a> {
    filename: &'a str,
    file_data: DataUrl<'a>,
}

impl<'a> ChatPart<'a> {
    fn file(attachment: &'a Attachment) -> Self {
        match attachment.kind {
            AttachmentKind::Image => Self::ImageUrl {
                image_url: ImageUrl {
                    url: DataUrl(attachment),
                },
            },
            AttachmentKind::Pdf => Self::File {
                file: FileData {
                    filename: &attachment.filename,
                    file_data: DataUrl(attachment),
                },
            },
        }
    }
}

#[derive(Debug, Serialize)]
struct ChatToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: ChatFunctionCall<'a>,
}

#[derive(Debug, Serialize)]
struct ChatFunctionCall<'a> {
    name: &'a str,
    /// JSON text, passed back exactly as the model produced it.
    arguments: &'a str,
}

#[derive(Debug, Serialize)]
struct ChatTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: ChatFunction<'a>,
}

#[derive(Debug, Serialize)]
struct ChatFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a serde_json::Value,
}

#[derive(Debug, Serialize)]
struct StreamOptions {
    include_usage: bool,
}

impl<'a> ChatRequest<'a> {
    fn new(request: &'a ModelRequest) -> Self {
        // Some servers reject an empty system message, and it means nothing anyway.
        let system = (!request.system.is_empty()).then(|| ChatMessage::System {
            content: &request.system,
        });
        let messages = system
            .into_iter()
            .chain(request.messages.iter().flat_map(chat_messages))
            .collect();
        Self {
            model: &request.model,
            messages,
            tools: request.tools.rendered(ProviderKind::OpenAi, |specs| {
                serde_json::value::to_raw_value(
                    &specs.iter().map(ChatTool::new).collect::<Vec<_>>(),
                )
            }),
            max_tokens: request.max_output_tokens,
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
        }
    }
}

/// One of our messages as chat messages: tool results become one `tool` message each.
fn chat_messages(message: &Message) -> Vec<ChatMessage<'_>> {
    match message {
        Message::User(text) => vec![ChatMessage::User {
            content: UserContent::Text(text),
        }],
        Message::UserFiles { text, files } => {
            let text = (!text.is_empty()).then(|| ChatPart::Text {
                text: Cow::Borrowed(text),
            });
            vec![ChatMessage::User {
                content: UserContent::Parts(
                    text.into_iter()
                        .chain(files.iter().map(ChatPart::file))
                        .collect(),
                ),
            }]
        }
        Message::Assistant { text, tool_calls } => vec![ChatMessage::Assistant {
            // An assistant message needs content or tool calls; `""` stays for the odd
            // answer that had neither.
            content: (!text.is_empty() || tool_calls.is_empty()).then_some(text.as_str()),
            tool_calls: tool_calls
                .iter()
                .map(|call| ChatToolCall {
                    id: &call.id,
                    kind: "function",
                    function: ChatFunctionCall {
                        name: &call.name,
                        arguments: &call.arguments,
                    },
                })
                .collect(),
        }],
        Message::ToolResults(results) => {
            let mut messages: Vec<ChatMessage<'_>> = results
                .iter()
                .map(|result| ChatMessage::Tool {
                    tool_call_id: &result.call_id,
                    // The format has no error flag; the model reads the prefix.
                    content: if result.is_error {
                        Cow::Owned(format!("Error: {}", result.content))
                    } else {
                        Cow::Borrowed(&result.content)
                    },
                })
                .collect();
            messages.extend(tool_images(results));
            messages
        }
    }
}

/// A tool message takes text only: the images of a step's results follow its tool
/// messages as one user message, each result's images introduced by its call id (T24).
fn tool_images(results: &[ToolResult]) -> Option<ChatMessage<'_>> {
    let parts: Vec<ChatPart<'_>> = results
        .iter()
        .filter(|result| !result.images.is_empty())
        .flat_map(|result| {
            let intro = ChatPart::Text {
                text: Cow::Owned(format!(
                    "The images the tool call {} returned:",
                    result.call_id
                )),
            };
            std::iter::once(intro).chain(result.images.iter().map(ChatPart::file))
        })
        .collect();
    (!parts.is_empty()).then_some(ChatMessage::User {
        content: UserContent::Parts(parts),
    })
}

impl<'a> ChatTool<'a> {
    fn new(tool: &'a ToolSpec) -> Self {
        Self {
            kind: "function",
            function: ChatFunction {
                name: &tool.name,
                description: &tool.description,
                parameters: &tool.input_schema,
            },
        }
    }
}

/// One `chat.completion.chunk`. Every field is optional because the compatible servers
/// disagree on which ones they send, and several send explicit `null`s.
#[derive(Debug, Deserialize)]
struct Chunk {
    choices: Option<Vec<Choice>>,
    usage: Option<ChunkUsage>,
    /// OpenAI and OpenRouter report mid-stream failures as a chunk with this field.
    error: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

/// Refusal fields are ignored on purpose.
#[derive(Debug, Deserialize)]
struct Delta {
    content: Option<String>,
    /// The model's reasoning: `reasoning_content` from vLLM and DeepSeek, `reasoning`
    /// from OpenRouter and newer vLLM.
    reasoning_content: Option<String>,
    reasoning: Option<String>,
    tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A piece of one tool call: the first carries the id and the name, the following ones
/// fragments of the arguments. Some servers (Ollama) send a whole call in one piece.
#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    index: Option<usize>,
    id: Option<String>,
    function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct FunctionDelta {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChunkUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

/// A tool call being assembled.
#[derive(Debug)]
struct PendingCall {
    /// The call's `index` on the wire.
    index: usize,
    id: String,
    name: String,
    arguments: String,
}

/// Chat-completions stream decoder.
///
/// The finish reason arrives in one chunk, the usage in a later one (with empty `choices`),
/// and only `[DONE]` says nothing more follows; so the reason is held until then, and so
/// are the tool calls: they are emitted whole at `[DONE]` (SPEC T5), never from a stream
/// that failed or was cut.
#[derive(Debug, Default)]
struct ChatDecoder {
    finish_reason: Option<StopReason>,
    /// In the order they started.
    calls: Vec<PendingCall>,
}

impl Decoder for ChatDecoder {
    fn feed(&mut self, event: &Event) -> Result<Vec<ProviderEvent>, ProviderError> {
        // Some proxies name their error events; the data is not reliably a chunk then.
        if event.event == "error" {
            return Err(ProviderError::Unavailable(Unavailable::StreamError));
        }
        if event.data.trim() == "[DONE]" {
            return self.done();
        }
        let chunk: Chunk = serde_json::from_str(&event.data).map_err(sse::undecodable)?;
        if chunk.error.is_some() {
            return Err(ProviderError::Unavailable(Unavailable::StreamError));
        }
        let mut events = Vec::new();
        // We never ask for `n > 1`, so the first choice is the only one.
        if let Some(choice) = chunk.choices.and_then(|choices| choices.into_iter().next()) {
            if let Some(delta) = choice.delta {
                for thought in [delta.reasoning_content, delta.reasoning] {
                    if let Some(thought) = thought.filter(|thought| !thought.is_empty()) {
                        events.push(ProviderEvent::ReasoningDelta(thought));
                    }
                }
                if let Some(text) = delta.content
                    && !text.is_empty()
                {
                    events.push(ProviderEvent::TextDelta(text));
                }
                for piece in delta.tool_calls.into_iter().flatten() {
                    self.tool_call_piece(piece, &mut events)?;
                }
            }
            // Some servers send `""` instead of `null` before the end.
            if let Some(reason) = choice.finish_reason.filter(|reason| !reason.is_empty()) {
                self.finish_reason = Some(stop_reason(&reason));
            }
        }
        if let Some(usage) = chunk.usage
            && (usage.prompt_tokens.is_some() || usage.completion_tokens.is_some())
        {
            events.push(ProviderEvent::Usage(Usage {
                input_tokens: usage.prompt_tokens,
                output_tokens: usage.completion_tokens,
            }));
        }
        Ok(events)
    }
}

impl ChatDecoder {
    fn done(&mut self) -> Result<Vec<ProviderEvent>, ProviderError> {
        // `[DONE]` without a finish reason: the server gave up on the generation (LiteLLM
        // and some vLLM versions do that after an upstream failure).
        let Some(reason) = self.finish_reason else {
            return Err(ProviderError::Unavailable(Unavailable::Incomplete));
        };
        // Whatever the reason: a call cut by `length` is still reported, and the turn
        // decides what to do with it.
        let mut calls = std::mem::take(&mut self.calls);
        calls.sort_by_key(|call| call.index);
        Ok(calls
            .into_iter()
            .map(|call| {
                ProviderEvent::ToolCall(ToolCall {
                    id: call.id,
                    name: call.name,
                    // A call without arguments is a call with no arguments.
                    arguments: if call.arguments.is_empty() {
                        "{}".to_owned()
                    } else {
                        call.arguments
                    },
                })
            })
            .chain([ProviderEvent::Finished(reason)])
            .collect())
    }

    fn tool_call_piece(
        &mut self,
        piece: ToolCallDelta,
        events: &mut Vec<ProviderEvent>,
    ) -> Result<(), ProviderError> {
        let (name, arguments) = piece
            .function
            .map_or((None, None), |function| (function.name, function.arguments));
        let id = piece.id.filter(|id| !id.is_empty());
        let known = match (piece.index, &id) {
            (Some(index), _) => self.calls.iter().position(|call| call.index == index),
            // Servers that leave the index out: an id names the call, and a piece without
            // one continues the latest call.
            (None, Some(id)) => self.calls.iter().position(|call| &call.id == id),
            (None, None) => self.calls.len().checked_sub(1),
        };
        let call = match known {
            // Later pieces may repeat the id and name; the first ones stand.
            Some(position) => &mut self.calls[position],
            None => {
                // Without an id there is nothing to answer the call with; without a name,
                // nothing to run.
                let (Some(id), Some(name)) = (id, name.filter(|name| !name.is_empty())) else {
                    return Err(ProviderError::Unavailable(Unavailable::Decode));
                };
                let index = piece.index.unwrap_or_else(|| {
                    self.calls
                        .iter()
                        .map(|call| call.index + 1)
                        .max()
                        .unwrap_or(0)
                });
                events.push(ProviderEvent::ToolInputStart {
                    id: id.clone(),
                    name: name.clone(),
                });
                let position = self.calls.len();
                self.calls.push(PendingCall {
                    index,
                    id,
                    name,
                    arguments: String::new(),
                });
                &mut self.calls[position]
            }
        };
        if let Some(fragment) = arguments.filter(|fragment| !fragment.is_empty()) {
            call.arguments.push_str(&fragment);
            events.push(ProviderEvent::ToolInputDelta {
                id: call.id.clone(),
                delta: fragment,
            });
        }
        Ok(())
    }
}

fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "stop" => StopReason::Stop,
        "length" => StopReason::Length,
        "tool_calls" | "function_call" => StopReason::ToolCalls,
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
    use crate::{Catalog, Message, ToolResult};

    async fn decode(body: &str) -> Items {
        decode_all_ways::<ChatDecoder>(body.as_bytes()).await
    }

    fn request() -> ModelRequest {
        ModelRequest {
            model: "gpt-4o-mini".into(),
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
    /// with two calls, their results (one failed).
    fn tool_request() -> ModelRequest {
        ModelRequest {
            model: "gpt-4o".into(),
            system: String::new(),
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
                    tool_calls: vec![
                        ToolCall {
                            id: "call_2".into(),
                            name: "get_weather".into(),
                            arguments: r#"{"location":"Bern"}"#.into(),
                        },
                        ToolCall {
                            id: "call_3".into(),
                            name: "get_time".into(),
                            // Passed back as produced, even when it is not JSON.
                            arguments: r#"{"tz":"#.into(),
                        },
                    ],
                },
                Message::ToolResults(vec![
                    ToolResult {
                        call_id: "call_2".into(),
                        content: "9 °C".into(),
                        is_error: false,
                        images: Vec::new(),
                    },
                    ToolResult {
                        call_id: "call_3".into(),
                        content: "arguments are not valid JSON".into(),
                        is_error: true,
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
                    description: String::new(),
                    input_schema: json!({"type": "object", "properties": {}}),
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

    /// The `data:` line of a chunk with this delta and finish reason, as api.openai.com
    /// frames it.
    fn chunk(delta: &str, finish_reason: &str) -> String {
        format!(
            concat!(
                r#"data: {{"id":"chatcmpl-BTdXq4XLbd3qWm0Vr3fOdJtL1BZ2a","object":"chat.completion.chunk","created":1746365012,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f5bdcc3276","choices":[{{"index":0,"delta":{},"logprobs":null,"finish_reason":{}}}],"usage":null}}"#,
                "\n\n"
            ),
            delta, finish_reason
        )
    }

    /// The piece of tool call `index` carrying `arguments` (a JSON string literal).
    fn fragment(index: usize, arguments: &str) -> String {
        chunk(
            &format!(
                r#"{{"tool_calls":[{{"index":{index},"function":{{"arguments":{arguments}}}}}]}}"#
            ),
            "null",
        )
    }

    const USAGE_AND_DONE: &str = concat!(
        r#"data: {"id":"chatcmpl-BTdXq4XLbd3qWm0Vr3fOdJtL1BZ2a","object":"chat.completion.chunk","created":1746365012,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f5bdcc3276","choices":[],"usage":{"prompt_tokens":82,"completion_tokens":41,"total_tokens":123}}"#,
        "\n\n",
        "data: [DONE]\n\n",
    );

    fn usage(input: u64, output: u64) -> Result<ProviderEvent, ProviderError> {
        Ok(ProviderEvent::Usage(Usage {
            input_tokens: Some(input),
            output_tokens: Some(output),
        }))
    }

    fn unavailable(kind: Unavailable) -> Result<ProviderEvent, ProviderError> {
        Err(ProviderError::Unavailable(kind))
    }

    /// As api.openai.com sends it with `include_usage`: a role-only first chunk, `usage:
    /// null` on every chunk, the finish reason in an empty delta, then the usage in a
    /// chunk with empty `choices`.
    const OPENAI_TEXT: &str = concat!(
        r#"data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        "\n\n",
        r#"data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"content":"Grüß"},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        "\n\n",
        r#"data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"content":" dich 👋 — 日本"},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        "\n\n",
        r#"data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}"#,
        "\n\n",
        r#"data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":7,"total_tokens":26,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}"#,
        "\n\n",
        "data: [DONE]\n\n",
    );

    #[tokio::test]
    async fn openai_text_usage_and_stop() {
        let items = decode(OPENAI_TEXT).await;
        assert_eq!(text(&items), "Grüß dich 👋 — 日本");
        assert_eq!(
            items,
            vec![
                Ok(ProviderEvent::TextDelta("Grüß".into())),
                Ok(ProviderEvent::TextDelta(" dich 👋 — 日本".into())),
                usage(19, 7),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    #[tokio::test]
    async fn reasoning_fields_are_reasoning_not_text() {
        // vLLM/DeepSeek `reasoning_content`, then OpenRouter's `reasoning`; the
        // content may open with a stray `</think>` when the server split the reasoning
        // itself.
        let body = [
            chunk(
                r#"{"role":"assistant","content":null,"reasoning_content":"Gruß? "}"#,
                "null",
            ),
            chunk(r#"{"content":null,"reasoning":"Antworten."}"#, "null"),
            chunk(
                r#"{"content":"</think>\n\nHallo","reasoning_content":null}"#,
                "null",
            ),
            chunk(r#"{"content":"!"}"#, r#""stop""#),
            USAGE_AND_DONE.to_owned(),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                Ok(ProviderEvent::ReasoningDelta("Gruß? ".into())),
                Ok(ProviderEvent::ReasoningDelta("Antworten.".into())),
                Ok(ProviderEvent::TextDelta("Hallo".into())),
                Ok(ProviderEvent::TextDelta("!".into())),
                usage(82, 41),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    #[tokio::test]
    async fn inline_think_tags_split_across_chunks_are_reasoning() {
        // Qwen3 on vLLM without a reasoning parser: the tags are tokens of the text.
        let body = [
            chunk(r#"{"role":"assistant","content":"<thi"}"#, "null"),
            chunk(r#"{"content":"nk>\nDer Nutzer grüßt.</"}"#, "null"),
            chunk(r#"{"content":"think>\n"}"#, "null"),
            chunk(r#"{"content":"\nHallo 👋"}"#, "null"),
            chunk("{}", r#""stop""#),
            USAGE_AND_DONE.to_owned(),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                Ok(ProviderEvent::ReasoningDelta("\nDer Nutzer grüßt.".into())),
                Ok(ProviderEvent::TextDelta("Hallo 👋".into())),
                usage(82, 41),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    #[tokio::test]
    async fn crlf_line_endings_and_keep_alive_comments() {
        // OpenRouter-style: comments while waiting, usage on the last content chunk, CRLF
        // as some proxies rewrite it.
        let body = concat!(
            ": OPENROUTER PROCESSING\r\n\r\n",
            ": OPENROUTER PROCESSING\r\n\r\n",
            r#"data: {"id":"gen-1741","provider":"OpenAI","model":"openai/gpt-4o","object":"chat.completion.chunk","created":1741569952,"choices":[{"index":0,"delta":{"role":"assistant","content":"Ça va"},"finish_reason":null,"native_finish_reason":null,"logprobs":null}]}"#,
            "\r\n\r\n",
            r#"data: {"id":"gen-1741","provider":"OpenAI","model":"openai/gpt-4o","object":"chat.completion.chunk","created":1741569952,"choices":[{"index":0,"delta":{"role":"assistant","content":"?"},"finish_reason":"stop","native_finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}"#,
            "\r\n\r\n",
            "data: [DONE]\r\n\r\n",
        );
        let items = decode(body).await;
        assert_eq!(
            items,
            vec![
                Ok(ProviderEvent::TextDelta("Ça va".into())),
                Ok(ProviderEvent::TextDelta("?".into())),
                usage(10, 3),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    #[tokio::test]
    async fn finish_reasons() {
        for (wire, expected) in [
            ("length", StopReason::Length),
            ("tool_calls", StopReason::ToolCalls),
            ("function_call", StopReason::ToolCalls),
            ("content_filter", StopReason::Other),
            ("something_new", StopReason::Other),
        ] {
            let body = format!(
                concat!(
                    r#"data: {{"id":"c","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":"x"}},"finish_reason":null}}]}}"#,
                    "\n\n",
                    r#"data: {{"id":"c","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{}},"finish_reason":"{}"}}]}}"#,
                    "\n\n",
                    "data: [DONE]\n\n",
                ),
                wire
            );
            let items = decode(&body).await;
            assert_eq!(
                items,
                vec![
                    Ok(ProviderEvent::TextDelta("x".into())),
                    Ok(ProviderEvent::Finished(expected))
                ],
                "{wire}"
            );
        }
    }

    /// Text, then two calls whose arguments arrive in fragments split mid-token (and, in
    /// the byte-wise runs, mid-character), as gpt-4o streams parallel calls.
    fn two_calls() -> String {
        [
            chunk(
                r#"{"role":"assistant","content":"","refusal":null}"#,
                "null",
            ),
            chunk(r#"{"content":"Let me check."}"#, "null"),
            chunk(
                r#"{"tool_calls":[{"index":0,"id":"call_DdmO9pD3xa9XTPNJ32zg2hcA","type":"function","function":{"name":"get_weather","arguments":""}}]}"#,
                "null",
            ),
            fragment(0, r#""{\"lo""#),
            fragment(0, r#""cation\": \"Zü""#),
            fragment(0, r#""rich\"}""#),
            chunk(
                r#"{"tool_calls":[{"index":1,"id":"call_Kq7wHeWbY1l8MlYiQhK6a2Xf","type":"function","function":{"name":"get_time","arguments":""}}]}"#,
                "null",
            ),
            fragment(1, r#""{\"tz\":""#),
            fragment(1, r#"" \"Europe/Zurich\"}""#),
            chunk("{}", r#""tool_calls""#),
            USAGE_AND_DONE.to_owned(),
        ]
        .concat()
    }

    #[tokio::test]
    async fn tool_calls_are_assembled_and_reported_at_done() {
        let a = "call_DdmO9pD3xa9XTPNJ32zg2hcA";
        let b = "call_Kq7wHeWbY1l8MlYiQhK6a2Xf";
        assert_eq!(
            decode(&two_calls()).await,
            vec![
                Ok(ProviderEvent::TextDelta("Let me check.".into())),
                start(a, "get_weather"),
                delta(a, r#"{"lo"#),
                delta(a, r#"cation": "Zü"#),
                delta(a, r#"rich"}"#),
                start(b, "get_time"),
                delta(b, r#"{"tz":"#),
                delta(b, r#" "Europe/Zurich"}"#),
                usage(82, 41),
                call(a, "get_weather", r#"{"location": "Zürich"}"#),
                call(b, "get_time", r#"{"tz": "Europe/Zurich"}"#),
                Ok(ProviderEvent::Finished(StopReason::ToolCalls)),
            ]
        );
    }

    #[tokio::test]
    async fn a_stream_cut_mid_arguments_reports_no_call() {
        let body = [
            chunk(
                r#"{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"write_file","arguments":""}}],"refusal":null}"#,
                "null",
            ),
            fragment(0, r#""{\"path\":\"/tmp/a\",""#),
            // Cut inside the next chunk.
            r#"data: {"id":"chatcmpl-BTdXq4XLbd3qWm0Vr3fOdJtL1BZ2a","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"argu"#.to_owned(),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                start("call_1", "write_file"),
                delta("call_1", r#"{"path":"/tmp/a","#),
                unavailable(Unavailable::Incomplete),
            ]
        );
    }

    #[tokio::test]
    async fn a_stream_failing_after_the_finish_reason_reports_no_call() {
        // The calls are complete, but `[DONE]` never came.
        let body = two_calls();
        let cut = &body[..body.find("data: [DONE]").unwrap()];
        let items = decode(cut).await;
        assert!(
            !items
                .iter()
                .any(|item| matches!(item, Ok(ProviderEvent::ToolCall(_)))),
            "{items:?}"
        );
        assert_eq!(items.last(), Some(&unavailable(Unavailable::Incomplete)));

        let body = [
            chunk(
                r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]}"#,
                "null",
            ),
            r#"data: {"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#.to_owned(),
            "\n\n".to_owned(),
            chunk("{}", r#""tool_calls""#),
            USAGE_AND_DONE.to_owned(),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                start("call_1", "get_weather"),
                delta("call_1", "{}"),
                unavailable(Unavailable::StreamError),
            ]
        );
    }

    #[tokio::test]
    async fn done_without_a_finish_reason_reports_no_call() {
        let body = [
            chunk(
                r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]}"#,
                "null",
            ),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                start("call_1", "get_weather"),
                delta("call_1", "{}"),
                unavailable(Unavailable::Incomplete),
            ]
        );
    }

    #[tokio::test]
    async fn a_call_cut_by_the_length_limit_is_still_reported() {
        // The turn decides what a truncated call means; the adapter reports what came.
        let body = [
            chunk(
                r#"{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"write_file","arguments":""}}],"refusal":null}"#,
                "null",
            ),
            fragment(0, r#""{\"path\":\"/tmp/a\",""#),
            fragment(0, r#""\"content\":\"Grüß""#),
            chunk("{}", r#""length""#),
            USAGE_AND_DONE.to_owned(),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                start("call_1", "write_file"),
                delta("call_1", r#"{"path":"/tmp/a","#),
                delta("call_1", r#""content":"Grüß"#),
                usage(82, 41),
                call(
                    "call_1",
                    "write_file",
                    r#"{"path":"/tmp/a","content":"Grüß"#
                ),
                Ok(ProviderEvent::Finished(StopReason::Length)),
            ]
        );
    }

    #[tokio::test]
    async fn a_whole_call_in_one_chunk_decodes() {
        // Ollama: each call complete in one piece, and `stop` as the finish reason.
        let body = concat!(
            r#"data: {"id":"chatcmpl-912","object":"chat.completion.chunk","created":1746365012,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_p3ds4ywu","index":0,"type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"Paris\"}"}}]},"finish_reason":null}]}"#,
            "\n\n",
            r#"data: {"id":"chatcmpl-912","object":"chat.completion.chunk","created":1746365012,"model":"qwen3:8b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"stop"}]}"#,
            "\n\n",
            "data: [DONE]\n\n",
        );
        let arguments = r#"{"location":"Paris"}"#;
        assert_eq!(
            decode(body).await,
            vec![
                start("call_p3ds4ywu", "get_weather"),
                delta("call_p3ds4ywu", arguments),
                call("call_p3ds4ywu", "get_weather", arguments),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    #[tokio::test]
    async fn calls_are_reported_in_index_order() {
        let body = [
            chunk(
                r#"{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"g","arguments":"{\"b\":1}"}},{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":""}}]}"#,
                "null",
            ),
            fragment(0, r#""{\"a\":1}""#),
            chunk("{}", r#""tool_calls""#),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                start("call_b", "g"),
                delta("call_b", r#"{"b":1}"#),
                start("call_a", "f"),
                delta("call_a", r#"{"a":1}"#),
                call("call_a", "f", r#"{"a":1}"#),
                call("call_b", "g", r#"{"b":1}"#),
                Ok(ProviderEvent::Finished(StopReason::ToolCalls)),
            ]
        );
    }

    #[tokio::test]
    async fn pieces_without_an_index_follow_their_id() {
        // Some servers leave out the index and repeat the id on every piece.
        let body = [
            chunk(
                r#"{"tool_calls":[{"id":"call_a","type":"function","function":{"name":"f","arguments":"{\"a\":"}}]}"#,
                "null",
            ),
            chunk(
                r#"{"tool_calls":[{"id":"call_a","function":{"arguments":"1}"}}]}"#,
                "null",
            ),
            chunk(
                r#"{"tool_calls":[{"id":"call_b","type":"function","function":{"name":"g","arguments":""}}]}"#,
                "null",
            ),
            chunk(
                r#"{"tool_calls":[{"function":{"arguments":"{}"}}]}"#,
                "null",
            ),
            chunk("{}", r#""tool_calls""#),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        assert_eq!(
            non_text(decode(&body).await)
                .into_iter()
                .filter(|item| matches!(
                    item,
                    Ok(ProviderEvent::ToolCall(_) | ProviderEvent::Finished(_))
                ))
                .collect::<Items>(),
            vec![
                call("call_a", "f", r#"{"a":1}"#),
                call("call_b", "g", "{}"),
                Ok(ProviderEvent::Finished(StopReason::ToolCalls)),
            ]
        );
    }

    #[tokio::test]
    async fn a_call_without_arguments_has_an_empty_object() {
        let body = [
            chunk(
                r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"now","arguments":""}}]}"#,
                "null",
            ),
            chunk("{}", r#""tool_calls""#),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        assert_eq!(
            decode(&body).await,
            vec![
                start("call_1", "now"),
                call("call_1", "now", "{}"),
                Ok(ProviderEvent::Finished(StopReason::ToolCalls)),
            ]
        );
    }

    #[tokio::test]
    async fn arguments_for_a_call_never_started_are_undecodable() {
        for first in [
            fragment(0, r#""{}""#),
            // An id without a name, and a name without an id.
            chunk(
                r#"{"tool_calls":[{"index":0,"id":"call_1","function":{"arguments":""}}]}"#,
                "null",
            ),
            chunk(
                r#"{"tool_calls":[{"index":0,"function":{"name":"f","arguments":""}}]}"#,
                "null",
            ),
        ] {
            let body = [first.clone(), chunk("{}", r#""tool_calls""#)].concat();
            assert_eq!(
                decode(&body).await,
                vec![unavailable(Unavailable::Decode)],
                "{first}"
            );
        }
    }

    #[tokio::test]
    async fn a_mid_stream_error_chunk_ends_the_stream() {
        let body = concat!(
            r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hal"},"finish_reason":null}],"usage":null}"#,
            "\n\n",
            r#"data: {"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#,
            "\n\n",
            r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}],"usage":null}"#,
            "\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(
            decode(body).await,
            vec![
                Ok(ProviderEvent::TextDelta("Hal".into())),
                unavailable(Unavailable::StreamError),
            ]
        );
    }

    #[tokio::test]
    async fn an_openrouter_error_chunk_with_choices_is_an_error() {
        let body = concat!(
            r#"data: {"id":"gen-1","object":"chat.completion.chunk","created":1741569952,"model":"anthropic/claude-3.5-sonnet","provider":"Anthropic","error":{"code":502,"message":"Provider disconnected"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}"#,
            "\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(
            decode(body).await,
            vec![unavailable(Unavailable::StreamError)]
        );
    }

    #[tokio::test]
    async fn a_named_error_event_is_an_error() {
        let body = "event: error\ndata: upstream went away\n\n";
        assert_eq!(
            decode(body).await,
            vec![unavailable(Unavailable::StreamError)]
        );
    }

    #[tokio::test]
    async fn a_cut_stream_is_incomplete_even_after_a_finish_reason() {
        // The usage and `[DONE]` never came: we cannot tell how much is missing.
        let body = concat!(
            r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hallo"},"finish_reason":null}],"usage":null}"#,
            "\n\n",
            r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}"#,
            "\n\n",
            r#"data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_"#,
        );
        assert_eq!(
            decode(body).await,
            vec![
                Ok(ProviderEvent::TextDelta("Hallo".into())),
                unavailable(Unavailable::Incomplete),
            ]
        );
    }

    #[tokio::test]
    async fn done_without_a_finish_reason_is_incomplete() {
        let body = concat!(
            r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hal"},"finish_reason":null}]}"#,
            "\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(
            decode(body).await,
            vec![
                Ok(ProviderEvent::TextDelta("Hal".into())),
                unavailable(Unavailable::Incomplete),
            ]
        );
    }

    #[tokio::test]
    async fn malformed_json_is_undecodable() {
        let body = concat!(
            r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hal"},"finish_reason":null}]}"#,
            "\n\n",
            r#"data: {"id":"c","choices":[{"index":0,"delta":{"content":"lo"}"#,
            "\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(
            decode(body).await,
            vec![
                Ok(ProviderEvent::TextDelta("Hal".into())),
                unavailable(Unavailable::Decode),
            ]
        );
        // Valid JSON, wrong shape.
        assert_eq!(
            decode("data: [1, 2]\n\n").await,
            vec![unavailable(Unavailable::Decode)]
        );
    }

    #[tokio::test]
    async fn servers_sending_nulls_and_empty_reasons_decode() {
        // Ollama/vLLM variants: `choices: null` on the usage chunk, `""` as a pending
        // finish reason, usage fields partly absent.
        let body = concat!(
            r#"data: {"id":"chatcmpl-459","object":"chat.completion.chunk","created":1741569952,"model":"llama3.2","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":""}]}"#,
            "\n\n",
            r#"data: {"id":"chatcmpl-459","object":"chat.completion.chunk","created":1741569952,"model":"llama3.2","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"stop"}]}"#,
            "\n\n",
            r#"data: {"id":"chatcmpl-459","object":"chat.completion.chunk","created":1741569952,"model":"llama3.2","choices":null,"usage":{"prompt_tokens":26}}"#,
            "\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(
            non_text(decode(body).await),
            vec![
                Ok(ProviderEvent::Usage(Usage {
                    input_tokens: Some(26),
                    output_tokens: None,
                })),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    #[test]
    fn request_body() {
        let body = serde_json::to_value(ChatRequest::new(&request())).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "gpt-4o-mini",
                "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello."},
                    {"role": "user", "content": "Grüß dich"},
                ],
                "max_tokens": 1024,
                "stream": true,
                "stream_options": {"include_usage": true},
            })
        );
    }

    #[test]
    fn request_body_with_tools_calls_and_results() {
        let body = serde_json::to_value(ChatRequest::new(&tool_request())).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "gpt-4o",
                "messages": [
                    {"role": "user", "content": "Weather in Zürich?"},
                    {
                        "role": "assistant",
                        "content": "Let me check.",
                        "tool_calls": [{
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"location\":\"Zürich\"}"},
                        }],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": "12 °C"},
                    {
                        "role": "assistant",
                        "content": null,
                        "tool_calls": [
                            {
                                "id": "call_2",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": "{\"location\":\"Bern\"}"},
                            },
                            {
                                "id": "call_3",
                                "type": "function",
                                "function": {"name": "get_time", "arguments": "{\"tz\":"},
                            },
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_2", "content": "9 °C"},
                    {"role": "tool", "tool_call_id": "call_3", "content": "Error: arguments are not valid JSON"},
                ],
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "description": "Current weather at a place.",
                            "parameters": {
                                "type": "object",
                                "properties": {"location": {"type": "string"}},
                                "required": ["location"],
                            },
                        },
                    },
                    {
                        "type": "function",
                        "function": {
                            "name": "get_time",
                            "description": "",
                            "parameters": {"type": "object", "properties": {}},
                        },
                    },
                ],
                "max_tokens": 512,
                "stream": true,
                "stream_options": {"include_usage": true},
            })
        );
    }

    #[test]
    fn an_empty_assistant_message_keeps_a_content() {
        let mut request = request();
        request.messages = vec![Message::Assistant {
            text: String::new(),
            tool_calls: Vec::new(),
        }];
        let body = serde_json::to_value(ChatRequest::new(&request)).unwrap();
        assert_eq!(
            body["messages"][1],
            json!({"role": "assistant", "content": ""})
        );
    }

    #[test]
    fn an_empty_system_prompt_is_left_out() {
        let mut request = request();
        request.system.clear();
        let body = serde_json::to_value(ChatRequest::new(&request)).unwrap();
        assert_eq!(
            body["messages"][0],
            json!({"role": "user", "content": "Hi"})
        );
        assert_eq!(body["messages"].as_array().unwrap().len(), 3);
    }

    fn endpoint(base_url: String, api_key: Option<&str>) -> Endpoint {
        Endpoint {
            base_url,
            api_key: api_key.map(str::to_owned),
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
        }
    }

    /// The whole path over loopback HTTP: URL, headers, body, decoding.
    #[tokio::test]
    async fn streams_over_http() {
        let (base, server) = serve_once(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n",
            OPENAI_TEXT
                .as_bytes()
                .chunks(100)
                .map(<[u8]>::to_vec)
                .collect(),
            Duration::from_millis(1),
            Duration::ZERO,
        )
        .await;
        let provider = OpenAiProvider::new(
            reqwest::Client::new(),
            endpoint(format!("{base}/v1/"), Some("sk-test")),
        );
        let request = request();
        let items: Items = provider.stream(&request).await.unwrap().collect().await;
        assert_eq!(text(&items), "Grüß dich 👋 — 日本");
        assert_eq!(
            items.last(),
            Some(&Ok(ProviderEvent::Finished(StopReason::Stop)))
        );

        let received = server.await.unwrap();
        assert_eq!(received.request_line, "POST /v1/chat/completions HTTP/1.1");
        assert_eq!(received.header("authorization"), Some("Bearer sk-test"));
        assert_eq!(received.header("content-type"), Some("application/json"));
        assert_eq!(
            received.body,
            serde_json::to_value(ChatRequest::new(&request)).unwrap()
        );
    }

    #[tokio::test]
    async fn no_key_sends_no_authorization() {
        let (base, server) = serve_once(
            "HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n",
            vec![],
            Duration::ZERO,
            Duration::ZERO,
        )
        .await;
        let provider = OpenAiProvider::new(reqwest::Client::new(), endpoint(base, None));
        let err = provider.stream(&request()).await.err();
        assert_eq!(err, Some(ProviderError::Rejected { status: 401 }));
        assert_eq!(server.await.unwrap().header("authorization"), None);
    }

    /// T23: Chat Completions takes an image as an `image_url` part with a data URL and a
    /// PDF as a `file` part; a tool message takes text only, so the screenshot follows the
    /// tool messages in a user message.
    #[test]
    fn files_and_tool_images_in_chat_completions_form() {
        let body =
            serde_json::to_value(ChatRequest::new(&crate::fixtures::files_request())).unwrap();
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "What is in these?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
                    {"type": "file", "file": {
                        "filename": "report.pdf",
                        "file_data": "data:application/pdf;base64,JVBERg=="
                    }}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call_s", "type": "function",
                    "function": {"name": "browser_screenshot", "arguments": "{}"}
                }]},
                {"role": "tool", "tool_call_id": "call_s", "content": "saved shot.png"},
                {"role": "user", "content": [
                    {"type": "text", "text": "The images the tool call call_s returned:"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}}
                ]}
            ])
        );
    }
}
