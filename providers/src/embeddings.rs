//! Embeddings (B6): `POST {base}/embeddings` on the OpenAI wire, which OpenAI, vLLM, Ollama,
//! LiteLLM and OpenRouter all serve. One call embeds a batch of inputs; the caller batches.
//!
//! Bounded: until the status by the endpoint's connect bound (as a chat call), the body by
//! its idle bound and [`MAX_BODY_BYTES`]. The answer is checked: one vector per input, all
//! of one dimension within [`MAX_DIMENSIONS`], finite numbers.

use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::{Endpoint, ProviderError, Unavailable, Usage, sse};

/// The most inputs one call sends: what OpenAI takes in one request is far more, but a
/// batch this size keeps a call's body and time small.
pub const MAX_BATCH: usize = 64;
/// The widest vector accepted (OpenAI's largest model has 3,072).
pub const MAX_DIMENSIONS: usize = 8_192;
/// The longest answer read: a full batch of the widest vectors as JSON numbers.
const MAX_BODY_BYTES: usize = MAX_BATCH * MAX_DIMENSIONS * 24;

/// One embeddings call: a vector for each input, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingRequest {
    /// The model's name at the provider.
    pub model: String,
    pub inputs: Vec<String>,
}

/// What an embeddings call answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Embeddings {
    /// One per input, in the inputs' order, all of one dimension.
    pub vectors: Vec<Vec<f32>>,
    pub usage: Usage,
}

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    input: &'a [String],
    encoding_format: &'static str,
}

#[derive(Deserialize)]
struct WireResponse {
    data: Vec<WireEmbedding>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireEmbedding {
    index: usize,
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
}

/// Embeds `request.inputs` at `endpoint` (its base includes `/v1`).
pub(crate) async fn embed(
    provider: &'static str,
    client: &reqwest::Client,
    endpoint: &Endpoint,
    request: &EmbeddingRequest,
) -> Result<Embeddings, ProviderError> {
    if request.inputs.is_empty() || request.inputs.len() > MAX_BATCH {
        // A caller's mistake, refused before anything is sent.
        return Err(ProviderError::Rejected { status: 400 });
    }
    let url = format!("{}/embeddings", endpoint.base_url.trim_end_matches('/'));
    let mut http = client.post(url).json(&WireRequest {
        model: &request.model,
        input: &request.inputs,
        encoding_format: "float",
    });
    if let Some(key) = &endpoint.api_key {
        http = http.bearer_auth(key);
    }
    let response = sse::send(provider, http, endpoint.connect_timeout).await?;
    let body = read_body(response, endpoint.idle_timeout).await?;
    let wire: WireResponse = serde_json::from_slice(&body)
        .map_err(|_| ProviderError::Unavailable(Unavailable::Decode))?;
    checked(wire, request.inputs.len())
}

/// The body, within `bound` and [`MAX_BODY_BYTES`].
async fn read_body(response: reqwest::Response, bound: Duration) -> Result<Vec<u8>, ProviderError> {
    let read = async {
        let mut body = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| ProviderError::from_transport(&e))?;
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(ProviderError::Unavailable(Unavailable::Decode));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    };
    tokio::time::timeout(bound, read)
        .await
        .map_err(|_| ProviderError::Unavailable(Unavailable::Timeout))?
}

/// The vectors of `wire` in the inputs' order, if it is one finite vector per input, all
/// of one dimension.
fn checked(mut wire: WireResponse, inputs: usize) -> Result<Embeddings, ProviderError> {
    let bad = ProviderError::Unavailable(Unavailable::Decode);
    wire.data.sort_by_key(|e| e.index);
    let in_order = wire.data.iter().enumerate().all(|(i, e)| e.index == i);
    if wire.data.len() != inputs || !in_order {
        return Err(bad);
    }
    let dimensions = wire.data[0].embedding.len();
    let sound = |v: &Vec<f32>| v.len() == dimensions && v.iter().all(|x| x.is_finite());
    if dimensions == 0
        || dimensions > MAX_DIMENSIONS
        || !wire.data.iter().all(|e| sound(&e.embedding))
    {
        return Err(bad);
    }
    Ok(Embeddings {
        vectors: wire.data.into_iter().map(|e| e.embedding).collect(),
        usage: Usage {
            input_tokens: wire.usage.and_then(|u| u.prompt_tokens),
            output_tokens: Some(0),
        },
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::sse::testing::serve_once;

    fn endpoint(base: &str) -> Endpoint {
        Endpoint {
            base_url: format!("{base}/v1"),
            api_key: Some("sk-test".into()),
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
        }
    }

    fn request(inputs: &[&str]) -> EmbeddingRequest {
        EmbeddingRequest {
            model: "embed-small".into(),
            inputs: inputs.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    async fn answer(
        body: &str,
        inputs: &[&str],
    ) -> (Result<Embeddings, ProviderError>, serde_json::Value) {
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let (base, server) = serve_once(
            &head,
            vec![body.as_bytes().to_vec()],
            Duration::ZERO,
            Duration::ZERO,
        )
        .await;
        let got = embed(
            "openai",
            &reqwest::Client::new(),
            &endpoint(&base),
            &request(inputs),
        )
        .await;
        let received = server.await.unwrap();
        assert_eq!(received.request_line, "POST /v1/embeddings HTTP/1.1");
        (got, received.body)
    }

    #[tokio::test]
    async fn a_batch_is_sent_and_its_vectors_come_back_in_order() {
        let body = r#"{"object":"list","data":[
            {"object":"embedding","index":1,"embedding":[0.0,1.0]},
            {"object":"embedding","index":0,"embedding":[1.0,0.5]}],
            "model":"embed-small","usage":{"prompt_tokens":7,"total_tokens":7}}"#;
        let (got, sent) = answer(body, &["first", "second"]).await;
        let got = got.unwrap();
        assert_eq!(got.vectors, vec![vec![1.0, 0.5], vec![0.0, 1.0]]);
        assert_eq!(got.usage.input_tokens, Some(7));
        assert_eq!(
            sent,
            serde_json::json!({"model": "embed-small", "input": ["first", "second"],
                               "encoding_format": "float"})
        );
    }

    #[tokio::test]
    async fn an_answer_that_is_not_one_vector_per_input_is_refused() {
        let short = r#"{"data":[{"index":0,"embedding":[1.0]}]}"#;
        let (got, _) = answer(short, &["a", "b"]).await;
        assert_eq!(got, Err(ProviderError::Unavailable(Unavailable::Decode)));
        let ragged =
            r#"{"data":[{"index":0,"embedding":[1.0]},{"index":1,"embedding":[1.0,2.0]}]}"#;
        let (got, _) = answer(ragged, &["a", "b"]).await;
        assert_eq!(got, Err(ProviderError::Unavailable(Unavailable::Decode)));
    }

    #[tokio::test]
    async fn an_empty_or_oversized_batch_is_refused_unsent() {
        let endpoint = endpoint("http://127.0.0.1:9");
        let client = reqwest::Client::new();
        let empty = embed("openai", &client, &endpoint, &request(&[])).await;
        assert_eq!(empty, Err(ProviderError::Rejected { status: 400 }));
        let many = vec!["x"; MAX_BATCH + 1];
        let over = embed("openai", &client, &endpoint, &request(&many)).await;
        assert_eq!(over, Err(ProviderError::Rejected { status: 400 }));
    }
}
