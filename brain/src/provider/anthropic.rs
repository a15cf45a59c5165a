//! Anthropic Messages, streaming.

use eventsource_stream::Event;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::sse::{self, Decoder};
use super::{
    Endpoint, EventStream, ModelProvider, ModelRequest, ProviderError, ProviderEvent, Role,
    StopReason, Unavailable, Usage,
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
    max_tokens: u32,
    stream: bool,
}

#[derive(Debug, Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: &'a str,
}

impl<'a> MessagesRequest<'a> {
    fn new(request: &'a ModelRequest) -> Self {
        Self {
            model: &request.model,
            system: &request.system,
            messages: request
                .messages
                .iter()
                .map(|message| WireMessage {
                    role: match message.role {
                        Role::User => "user",
                        Role::Assistant => "assistant",
                    },
                    content: &message.text,
                })
                .collect(),
            max_tokens: request.max_output_tokens,
            stream: true,
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
        content_block: ContentBlock,
    },
    ContentBlockDelta {
        delta: BlockDelta,
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
    /// `ping`, `content_block_stop`, and whatever Anthropic adds next: its versioning
    /// policy allows new event types without a new API version.
    #[serde(other)]
    Ignored,
}

#[derive(Debug, Deserialize)]
struct StartedMessage {
    usage: Option<WireUsage>,
}

/// Tool-use blocks (`tool_use` start, `input_json_delta`) will be assembled here once tool
/// calls are decoded; thinking blocks stay ignored.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentBlock {
    Text {
        #[serde(default)]
        text: String,
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

/// Messages stream decoder.
///
/// The stop reason arrives in `message_delta` and the end in `message_stop`, so the reason
/// is held until then.
#[derive(Debug, Default)]
struct MessagesDecoder {
    stop_reason: Option<StopReason>,
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
            // The opening text is empty in practice, but nothing promises it.
            WireEvent::ContentBlockStart {
                content_block: ContentBlock::Text { text },
            }
            | WireEvent::ContentBlockDelta {
                delta: BlockDelta::TextDelta { text },
            } if !text.is_empty() => vec![ProviderEvent::TextDelta(text)],
            WireEvent::ContentBlockStart { .. } | WireEvent::ContentBlockDelta { .. } => Vec::new(),
            WireEvent::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.stop_reason {
                    self.stop_reason = Some(stop_reason(&reason));
                }
                // Counts here are cumulative; newer responses repeat `input_tokens` too,
                // and `Usage::merge` lets them win.
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
            // Without a stop reason we cannot tell a whole answer from a cut one.
            WireEvent::MessageStop => match self.stop_reason {
                Some(reason) => vec![ProviderEvent::Finished(reason)],
                None => return Err(ProviderError::Unavailable(Unavailable::Incomplete)),
            },
            WireEvent::Error { error } => {
                return Err(match error.kind.as_str() {
                    // Mid-stream there is no header to read a delay from.
                    "rate_limit_error" => ProviderError::RateLimited { retry_after: None },
                    _ => ProviderError::Unavailable(Unavailable::StreamError),
                });
            }
            WireEvent::Ignored => Vec::new(),
        };
        Ok(events)
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
    use crate::provider::Message;
    use crate::provider::sse::testing::{Items, decode_all_ways, non_text, serve_once, text};

    async fn decode(body: &str) -> Items {
        decode_all_ways::<MessagesDecoder>(body.as_bytes()).await
    }

    fn request() -> ModelRequest {
        ModelRequest {
            model: "claude-sonnet-4-20250514".into(),
            system: "You are terse.".into(),
            messages: vec![
                Message {
                    role: Role::User,
                    text: "Hi".into(),
                },
                Message {
                    role: Role::Assistant,
                    text: "Hello.".into(),
                },
                Message {
                    role: Role::User,
                    text: "Grüß dich".into(),
                },
            ],
            max_output_tokens: 1024,
        }
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
    async fn tool_use_and_thinking_blocks_are_skipped_for_now() {
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
            r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"location\": \"Paris\"}"}}"#,
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
        assert_eq!(
            decode(body).await,
            vec![
                input(472),
                Ok(ProviderEvent::TextDelta("Let me check.".into())),
                output(89),
                Ok(ProviderEvent::Finished(StopReason::ToolCalls)),
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
                    {"role": "assistant", "content": "Hello."},
                    {"role": "user", "content": "Grüß dich"},
                ],
                "max_tokens": 1024,
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
}
