//! Failures as A2A's JSON-RPC errors. A2A's own codes where one fits (`-32001` task not
//! found, `-32002` not cancelable, `-32003` push notifications not supported (no
//! `BRAIN_SECRETS_KEY`), `-32004` unsupported, `-32005` content type, `-32009`
//! version, `-32602` invalid params); every refusal of the posting path (quotas, busy
//! agent, full queue, overload, a full push backlog) is `-32000`, and infrastructure
//! failures `-32603`. The
//! message starts with this server's stable error code and a colon, as a turn's error
//! part does, and `data` carries a `google.rpc.ErrorInfo` whose metadata holds the code,
//! the seconds to wait (`retryAfterSeconds`) and the turn it names, for clients (as the
//! official SDKs do) that read A2A's error details.

use serde_json::{Value, json};

use super::wire::RpcError;
use crate::error::ApiError;
use protocol::ErrorCode;

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL: i64 = -32603;
/// Implementation-defined: the posting path refused the message.
pub const REFUSED: i64 = -32000;
pub const TASK_NOT_FOUND: i64 = -32001;
pub const TASK_NOT_CANCELABLE: i64 = -32002;
pub const PUSH_NOT_SUPPORTED: i64 = -32003;
pub const UNSUPPORTED_OPERATION: i64 = -32004;
pub const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
pub const VERSION_NOT_SUPPORTED: i64 = -32009;

const ERROR_INFO: &str = "type.googleapis.com/google.rpc.ErrorInfo";
/// `ErrorInfo.domain`.
const DOMAIN: &str = "agent-runtime";

/// An error of A2A's own (no stable code of ours behind it).
pub fn rpc(code: i64, message: impl Into<String>) -> RpcError {
    RpcError {
        code,
        message: message.into(),
        data: None,
    }
}

/// `err` as the JSON-RPC error of this binding.
pub fn from_api(err: &ApiError) -> RpcError {
    err.log_server_error();
    let code = err.code();
    let rpc_code = match (err, code) {
        (ApiError::NotFound("turn" | "task"), _) => TASK_NOT_FOUND,
        (ApiError::NotFound(_) | ApiError::InvalidRequest(_), _) => INVALID_PARAMS,
        (
            _,
            ErrorCode::QuotaExceeded
            | ErrorCode::QuotaExhausted
            | ErrorCode::AgentBusy
            | ErrorCode::TurnInProgress
            | ErrorCode::QueueFull
            | ErrorCode::PushBacklogFull
            | ErrorCode::RateLimited
            | ErrorCode::Overloaded
            | ErrorCode::ShuttingDown
            | ErrorCode::TooManyObservers
            | ErrorCode::Conflict
            | ErrorCode::PayloadTooLarge
            | ErrorCode::Forbidden,
        ) => REFUSED,
        _ => INTERNAL,
    };
    let stable = code.as_str();
    let mut metadata = serde_json::Map::new();
    metadata.insert("code".into(), Value::String(stable.to_owned()));
    if let Some(after) = err.retry_after() {
        metadata.insert(
            "retryAfterSeconds".into(),
            Value::String(after.as_secs().max(1).to_string()),
        );
    }
    if let Some(turn) = err.turn_id() {
        metadata.insert("taskId".into(), Value::String(turn.to_string()));
    }
    RpcError {
        code: rpc_code,
        message: format!("{stable}: {}", err.public_message()),
        data: Some(json!([{
            "@type": ERROR_INFO,
            "reason": stable.to_ascii_uppercase(),
            "domain": DOMAIN,
            "metadata": metadata,
        }])),
    }
}

/// A push config on a server without `BRAIN_SECRETS_KEY`, which tokens and credentials
/// are sealed under: A2A's own code, with our `not_configured` as the details.
pub fn push_not_supported() -> RpcError {
    let mut error = from_api(&ApiError::NotConfigured(
        "push notifications need BRAIN_SECRETS_KEY, which their tokens and credentials are \
         sealed under; it is unset on this server",
    ));
    error.code = PUSH_NOT_SUPPORTED;
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_carries_its_stable_code_and_wait() {
        let err = ApiError::QueueFull;
        let rpc = from_api(&err);
        assert_eq!(rpc.code, REFUSED);
        assert!(rpc.message.starts_with("queue_full: "), "{}", rpc.message);
        let info = &rpc.data.unwrap()[0];
        assert_eq!(info["@type"], ERROR_INFO);
        assert_eq!(info["reason"], "QUEUE_FULL");
        assert_eq!(info["metadata"]["code"], "queue_full");
        assert_eq!(info["metadata"]["retryAfterSeconds"], "10");
    }

    #[test]
    fn an_unknown_task_is_a2as_task_not_found() {
        assert_eq!(from_api(&ApiError::NotFound("turn")).code, TASK_NOT_FOUND);
        assert_eq!(from_api(&ApiError::NotFound("chat")).code, INVALID_PARAMS);
        assert_eq!(from_api(&ApiError::Internal("x".into())).code, INTERNAL);
    }
}
