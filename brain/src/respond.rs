//! What the engine streams, as HTTP responses: the UI message stream of a turn and of the
//! events stream's observers (SSE, with the stream's version), any event stream's headers
//! (also AG-UI's), and the `RateLimit` fields a turn's admission saw. The engine frames
//! its events (`sse`) and keeps the facts; the headers and bodies are built here.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use protocol::ui::{UI_STREAM_HEADER, UI_STREAM_VERSION};

use engine::events::Observer;
use engine::events::follow::Followed;
use engine::quota::RateLimitHeaders;
use engine::turn::ui_stream::UiBody;

/// A turn's stream, with the `RateLimit` fields of its admission.
pub fn ui_stream(mut turn: UiBody) -> Response {
    let rate_limit = turn.take_rate_limit();
    let mut response = ui_message_stream(Body::from_stream(turn));
    self::rate_limit(&rate_limit, response.headers_mut());
    response
}

/// An observer of a chat's events stream.
pub fn observer(observer: Observer) -> Response {
    ui_message_stream(Body::from_stream(observer.into_stream()))
}

/// A running turn's stream followed from its start (a resume, a retried message id).
pub fn followed(followed: Followed) -> Response {
    ui_message_stream(Body::from_stream(followed.into_stream()))
}

/// A UI message stream's response (the turn's, or an observer's of the events stream):
/// its content type, no caching, the stream's version, and no proxy buffering.
pub fn ui_message_stream(body: Body) -> Response {
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

/// Sets the `RateLimit-Policy` and `RateLimit` fields; nothing when the team has no such
/// limit.
pub fn rate_limit(facts: &RateLimitHeaders, headers: &mut HeaderMap) {
    for (name, value) in facts.fields().into_iter().flatten() {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
}
