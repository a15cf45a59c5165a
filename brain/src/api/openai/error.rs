//! OpenAI's error shape for every refusal under `/openai/` (P7): `{"error": {"message",
//! "type", "param", "code"}}`, the status and headers unchanged, `code` our stable code.
//! One layer rewrites the `ErrorBody` that `crate::error` answered, wherever it came from
//! (credentials, the rate limit, a body too large, a handler), so the statuses and codes
//! stay decided in `error.rs` alone and no handler maps its own.

use std::collections::BTreeMap;

use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use protocol::{ErrorBody, ErrorCode};
use serde::Serialize;
use utoipa::openapi::RefOr;

/// The path every OpenAI-compatible route is under.
pub const PREFIX: &str = "/openai/";
/// Our error bodies are a few hundred bytes; anything larger is not one of them.
const MAX_ERROR_BYTES: usize = 16 * 1024;

/// OpenAI's `type` for a refusal: what its SDKs and clients expect beside the status.
pub fn kind(status: StatusCode, code: ErrorCode) -> &'static str {
    match status.as_u16() {
        _ if code == ErrorCode::QuotaExhausted => "insufficient_quota",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        409 => "conflict_error",
        429 => "rate_limit_error",
        500.. => "server_error",
        _ => "invalid_request_error",
    }
}

/// OpenAI's error body: every refusal under `/openai/`, and the error event of a stream.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OpenAiErrorBody {
    error: OpenAiError,
}

/// The inside of an [`OpenAiErrorBody`].
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OpenAiError {
    /// Human-readable; never contains message text, prompts or secrets.
    message: String,
    /// OpenAI's class of the refusal (`invalid_request_error`, `authentication_error`,
    /// `not_found_error`, `rate_limit_error`, `insufficient_quota`, `server_error`, ...).
    #[serde(rename = "type")]
    kind: &'static str,
    /// Always `null`: no refusal names one parameter.
    param: Option<String>,
    /// Our stable error code.
    code: ErrorCode,
}

/// The error body of a refusal with `status` and our `code`.
pub fn body(status: StatusCode, code: ErrorCode, message: &str) -> OpenAiErrorBody {
    OpenAiErrorBody {
        error: OpenAiError {
            message: message.to_owned(),
            kind: kind(status, code),
            param: None,
            code,
        },
    }
}

impl OpenAiErrorBody {
    pub fn to_json(&self) -> String {
        // Serializing our own closed type cannot fail; an empty object is still JSON.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }
}

/// The status of a turn that failed after it started: its cause is past the request (the
/// provider, a tool, the store), whatever its code.
pub const TURN_FAILED: StatusCode = StatusCode::BAD_GATEWAY;

/// A turn that failed after it started, for an answer that was not streamed: the turn's
/// own code, as a [`TURN_FAILED`].
pub fn turn_failed(code: ErrorCode, message: &str) -> Response {
    let body = body(TURN_FAILED, code, message);
    (TURN_FAILED, axum::Json(body)).into_response()
}

/// The refusals both routes that start a turn (chat completions, responses) may answer
/// beside their own `400` and `404`, in OpenAI's shape: one list for both
/// `#[utoipa::path]`s. `401`, `503` and the rate limit's `429` every authenticated route
/// gets from `openapi::document`. No value of it exists: it only names the list.
pub enum TurnRefusals {}

impl utoipa::IntoResponses for TurnRefusals {
    fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
        [
            (
                "409",
                "The agent is busy and its policy rejects, or enqueues: a request here \
                 cannot be answered later (`agent_busy`).",
            ),
            (
                "413",
                "The body is too large (`payload_too_large`), a file past \
                 `BRAIN_FILE_MAX_BYTES` (`file_too_large`), or the message's files past \
                 `BRAIN_FILE_MAX_BYTES_PER_MESSAGE` (`message_files_too_large`).",
            ),
            (
                "402",
                "The team's spending quota is spent (`quota_exhausted`, OpenAI's \
                 `insufficient_quota`).",
            ),
            (
                "429",
                "A quota refused the turn (`quota_exceeded`, with `Retry-After`).",
            ),
            (
                "502",
                "A turn that was not streamed failed after it started; `code` is its \
                 error code.",
            ),
        ]
        .into_iter()
        .map(|(status, what)| (status.to_owned(), error_answer(what).into()))
        .collect()
    }
}

/// An answer with [`OpenAiErrorBody`] and `description`.
pub fn error_answer(description: &str) -> utoipa::openapi::Response {
    crate::api::openapi::error_in("OpenAiErrorBody", description)
}

/// The layer: our `ErrorBody` answers under [`PREFIX`] in OpenAI's shape.
pub async fn rewrite(request: Request, next: Next) -> Response {
    if !request.uri().path().starts_with(PREFIX) {
        return next.run(request).await;
    }
    let response = next.run(request).await;
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if response.status().is_success() || !json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = to_bytes(body, MAX_ERROR_BYTES).await else {
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, Body::empty());
    };
    let Ok(ErrorBody { error }) = serde_json::from_slice::<ErrorBody>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    let rewritten = self::body(parts.status, error.code, &error.message).to_json();
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(rewritten))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_quota_is_insufficient_quota_and_a_rate_a_rate_limit() {
        let exhausted = kind(StatusCode::TOO_MANY_REQUESTS, ErrorCode::QuotaExhausted);
        assert_eq!(exhausted, "insufficient_quota");
        let exceeded = kind(StatusCode::TOO_MANY_REQUESTS, ErrorCode::QuotaExceeded);
        assert_eq!(exceeded, "rate_limit_error");
        assert_eq!(
            kind(StatusCode::NOT_FOUND, ErrorCode::NotFound),
            "not_found_error"
        );
    }
}
