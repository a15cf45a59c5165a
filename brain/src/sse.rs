//! Server-Sent Events as the brain writes them (SPEC S1, S2): the framing of one event,
//! the end of a turn's stream, the keep-alive comment and the response headers, shared by
//! the stream of the request that starts a turn (`turn::ui_stream`) and the events
//! stream's observers and resumed turn streams (`events`), so a client parses all three
//! alike.

use std::fmt;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use protocol::ui::{DONE_SENTINEL, UI_STREAM_HEADER, UI_STREAM_VERSION, UiChunk};

/// What an idle stream sends so proxies keep it open: a comment, which clients ignore.
pub fn keep_alive() -> Bytes {
    Bytes::from_static(b": keep-alive\n\n")
}

/// One event: `id:` when it has one, then `data:` with `json` (one line).
pub fn event(id: Option<&dyn fmt::Display>, json: &str) -> Bytes {
    let mut out = String::with_capacity(json.len() + 40);
    if let Some(id) = id {
        out.push_str("id: ");
        out.push_str(&id.to_string());
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(json);
    out.push_str("\n\n");
    Bytes::from(out)
}

/// One event carrying `chunk`.
pub fn chunk(id: Option<&dyn fmt::Display>, chunk: &UiChunk) -> Bytes {
    // Serializing our own closed types cannot fail; an empty object would still be valid SSE.
    let json = serde_json::to_string(chunk).unwrap_or_else(|_| "{}".into());
    event(id, &json)
}

/// `data: [DONE]`, the end of a turn's stream (also of a resumed one).
pub fn done() -> Bytes {
    event(None, DONE_SENTINEL)
}

/// A UI message stream's response (the turn's, or an observer's of the events stream):
/// its content type, no caching, the stream's version, and no proxy buffering.
pub fn response(body: Body) -> Response {
    let mut response = event_stream(body);
    response.headers_mut().insert(
        UI_STREAM_HEADER,
        HeaderValue::from_static(UI_STREAM_VERSION),
    );
    response
}

/// Any event stream's response (also AG-UI's, `crate::agui`): its content type, no
/// caching, and no proxy buffering.
pub fn event_stream(body: Body) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Reverse proxies (nginx) would otherwise buffer the stream.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_its_id_then_its_data() {
        assert_eq!(event(Some(&"1-0"), "{}"), "id: 1-0\ndata: {}\n\n");
        assert_eq!(event(None, "{}"), "data: {}\n\n");
        assert_eq!(done(), "data: [DONE]\n\n");
        assert_eq!(keep_alive(), ": keep-alive\n\n");
    }
}
