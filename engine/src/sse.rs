//! Server-Sent Events as the brain writes them (SPEC S1, S2): the framing of one event,
//! the end of a turn's stream and the keep-alive comment (the responses' headers are the
//! service's, `respond`), shared by
//! the stream of the request that starts a turn (`turn::ui_stream`) and the events
//! stream's observers and resumed turn streams (`events`), so a client parses all three
//! alike.

use std::fmt;

use bytes::Bytes;
use protocol::ui::{DONE_SENTINEL, UiChunk};

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
