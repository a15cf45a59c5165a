//! OpenAI-compatible chat completions, streaming (OpenAI, vLLM, Ollama, LiteLLM,
//! OpenRouter...).
//!
//! Only what every one of those servers accepts goes into the request: `max_tokens` rather
//! than OpenAI's newer `max_completion_tokens`, plain string contents.

use eventsource_stream::Event;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::sse::{self, Decoder};
use super::{
    Endpoint, EventStream, ModelProvider, ModelRequest, ProviderError, ProviderEvent, Role,
    StopReason, Unavailable, Usage,
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
    max_tokens: u32,
    stream: bool,
    /// Without it the stream carries no token counts at all.
    stream_options: StreamOptions,
}

#[derive(Debug, Serialize)]
struct ChatMessage<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Debug, Serialize)]
struct StreamOptions {
    include_usage: bool,
}

impl<'a> ChatRequest<'a> {
    fn new(request: &'a ModelRequest) -> Self {
        // Some servers reject an empty system message, and it means nothing anyway.
        let system = (!request.system.is_empty()).then(|| ChatMessage {
            role: "system",
            content: &request.system,
        });
        let messages = system
            .into_iter()
            .chain(request.messages.iter().map(|message| ChatMessage {
                role: match message.role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                },
                content: &message.text,
            }))
            .collect();
        Self {
            model: &request.model,
            messages,
            max_tokens: request.max_output_tokens,
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
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

/// `tool_calls` fragments will be read here once tool calls are decoded; reasoning and
/// refusal fields are ignored on purpose.
#[derive(Debug, Deserialize)]
struct Delta {
    content: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChunkUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

/// Chat-completions stream decoder.
///
/// The finish reason arrives in one chunk, the usage in a later one (with empty `choices`),
/// and only `[DONE]` says nothing more follows; so the reason is held until then.
#[derive(Debug, Default)]
struct ChatDecoder {
    finish_reason: Option<StopReason>,
}

impl Decoder for ChatDecoder {
    fn feed(&mut self, event: &Event) -> Result<Vec<ProviderEvent>, ProviderError> {
        // Some proxies name their error events; the data is not reliably a chunk then.
        if event.event == "error" {
            return Err(ProviderError::Unavailable(Unavailable::StreamError));
        }
        if event.data.trim() == "[DONE]" {
            // `[DONE]` without a finish reason: the server gave up on the generation
            // (LiteLLM and some vLLM versions do that after an upstream failure).
            return match self.finish_reason {
                Some(reason) => Ok(vec![ProviderEvent::Finished(reason)]),
                None => Err(ProviderError::Unavailable(Unavailable::Incomplete)),
            };
        }
        let chunk: Chunk = serde_json::from_str(&event.data).map_err(sse::undecodable)?;
        if chunk.error.is_some() {
            return Err(ProviderError::Unavailable(Unavailable::StreamError));
        }
        let mut events = Vec::new();
        // We never ask for `n > 1`, so the first choice is the only one.
        if let Some(choice) = chunk.choices.and_then(|choices| choices.into_iter().next()) {
            if let Some(text) = choice.delta.and_then(|delta| delta.content)
                && !text.is_empty()
            {
                events.push(ProviderEvent::TextDelta(text));
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
    use crate::provider::Message;
    use crate::provider::sse::testing::{Items, decode_all_ways, non_text, serve_once, text};

    async fn decode(body: &str) -> Items {
        decode_all_ways::<ChatDecoder>(body.as_bytes()).await
    }

    fn request() -> ModelRequest {
        ModelRequest {
            model: "gpt-4o-mini".into(),
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

    #[tokio::test]
    async fn tool_call_deltas_are_skipped_for_now() {
        let body = concat!(
            r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_DdmO9pD3xa9XTPNJ32zg2hcA","type":"function","function":{"name":"get_weather","arguments":""}}],"refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}"#,
            "\n\n",
            r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"location\":\"Paris\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}"#,
            "\n\n",
            r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}"#,
            "\n\n",
            r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o","choices":[],"usage":{"prompt_tokens":60,"completion_tokens":16,"total_tokens":76}}"#,
            "\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(
            decode(body).await,
            vec![
                usage(60, 16),
                Ok(ProviderEvent::Finished(StopReason::ToolCalls))
            ]
        );
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
}
