//! JSON-RPC 2.0 as MCP's streamable HTTP carries it: one message per POST body (batches
//! were removed in MCP 2025-06-18), told apart by shape, and the answers the server
//! writes.

use serde::Deserialize;
use serde_json::{Value, json};

/// JSON-RPC's own codes, and the one this server adds for a refusal of ours.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// A request this server refuses for a reason of its own (a cap, an unavailable store):
/// `data.code` holds the stable error code, as `{"error": {"code"}}` does over HTTP.
pub const SERVER_REFUSED: i64 = -32000;

/// The longest request id echoed back (a string id is the client's choice).
const MAX_ID: usize = 200;

/// A JSON-RPC id: a string or an integer, kept as the client wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(String);

impl RequestId {
    /// A request id as JSON holds it; `None` for any other value.
    pub fn of(value: &Value) -> Option<Self> {
        match value {
            Value::String(s) if s.len() <= MAX_ID => Some(Self(value.to_string())),
            Value::Number(n) if n.is_i64() || n.is_u64() => Some(Self(n.to_string())),
            _ => None,
        }
    }

    /// The id as JSON again.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }
}

/// What a POST carried.
#[derive(Debug)]
pub enum Incoming {
    Request {
        id: RequestId,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// A response to a request of the server's (this server sends none, so it is only
    /// acknowledged).
    Response,
}

#[derive(Deserialize)]
struct Envelope {
    jsonrpc: String,
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<Value>,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

/// Why a body is not a JSON-RPC message: the error to answer it with.
#[derive(Debug)]
pub struct Malformed {
    pub code: i64,
    pub message: &'static str,
}

/// Tells a body's message kind by its shape.
pub fn parse(body: Value) -> Result<Incoming, Malformed> {
    let invalid = |message| Malformed {
        code: INVALID_REQUEST,
        message,
    };
    if body.is_array() {
        return Err(invalid("batches are not part of MCP 2025-11-25"));
    }
    // `"id": null` reads as no id below, yet it is neither a request nor a notification.
    let null_id = body.get("id").is_some_and(Value::is_null);
    let envelope: Envelope =
        serde_json::from_value(body).map_err(|_| invalid("not a JSON-RPC 2.0 message"))?;
    if envelope.jsonrpc != "2.0" {
        return Err(invalid("jsonrpc must be \"2.0\""));
    }
    let params = envelope.params.unwrap_or(Value::Null);
    if !(params.is_object() || params.is_null()) {
        return Err(invalid("params must be an object"));
    }
    match (envelope.method, envelope.id) {
        (Some(method), Some(id)) => Ok(Incoming::Request {
            id: RequestId::of(&id).ok_or(invalid("an id is a string or an integer"))?,
            method,
            params,
        }),
        (Some(method), None) if !null_id => Ok(Incoming::Notification { method, params }),
        (None, Some(_)) if envelope.result.is_some() || envelope.error.is_some() => {
            Ok(Incoming::Response)
        }
        _ => Err(invalid("neither a request, a notification nor a response")),
    }
}

/// `{"jsonrpc":"2.0","id":…,"result":…}`.
pub fn result(id: &RequestId, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id.to_value(), "result": result})
}

/// `{"jsonrpc":"2.0","id":…,"error":{"code","message","data"?}}`; `id` is `null` when the
/// request's could not be read.
pub fn error(id: Option<&RequestId>, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut error = json!({"code": code, "message": message});
    if let Some(data) = data {
        error["data"] = data;
    }
    json!({
        "jsonrpc": "2.0",
        "id": id.map_or(Value::Null, RequestId::to_value),
        "error": error,
    })
}

/// A notification from the server.
pub fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_told_apart_by_shape() {
        let request = parse(json!({"jsonrpc": "2.0", "id": 7, "method": "ping"})).unwrap();
        let Incoming::Request { id, method, .. } = request else {
            panic!("a request")
        };
        assert_eq!((id.to_value(), method.as_str()), (json!(7), "ping"));
        let string_id = parse(json!({"jsonrpc": "2.0", "id": "a", "method": "ping"})).unwrap();
        let Incoming::Request { id, .. } = string_id else {
            panic!("a request")
        };
        assert_eq!(id.to_value(), json!("a"));
        assert!(matches!(
            parse(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
            Ok(Incoming::Notification { .. })
        ));
        assert!(matches!(
            parse(json!({"jsonrpc": "2.0", "id": 1, "result": {}})),
            Ok(Incoming::Response)
        ));
        for bad in [
            json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]),
            json!({"jsonrpc": "1.0", "id": 1, "method": "ping"}),
            json!({"jsonrpc": "2.0", "id": null, "method": "ping"}),
            json!({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}),
            json!({"jsonrpc": "2.0", "id": 1}),
        ] {
            assert_eq!(
                parse(bad.clone()).unwrap_err().code,
                INVALID_REQUEST,
                "{bad}"
            );
        }
    }
}
