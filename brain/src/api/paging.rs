//! The opaque cursors of paged listings (`GET /v1/chats/{id}/messages`,
//! `GET /v1/chats/{id}/turns`): clients only hand a `next_cursor` back, so the key behind
//! it (a transcript `seq`, a turn id) may change form without breaking them. Each listing
//! tags its cursors, so one listing's cursor is refused by another.

use std::fmt::Display;
use std::str::FromStr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::error::ApiError;

/// The cursor of `key` in the listing tagged `tag`.
pub fn cursor_of(tag: &str, key: impl Display) -> String {
    URL_SAFE_NO_PAD.encode(format!("{tag}{key}"))
}

/// The key of a cursor of the listing tagged `tag`; `invalid_request` naming `param` for
/// anything this API did not return.
pub fn key_of<T: FromStr>(tag: &str, cursor: &str, param: &str) -> Result<T, ApiError> {
    URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|raw| raw.strip_prefix(tag)?.parse::<T>().ok())
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!("{param} must be a next_cursor this API returned"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_gives_back_its_key_in_its_own_listing_only() {
        let cursor = cursor_of("m1:", 42);
        assert_eq!(key_of::<i64>("m1:", &cursor, "before").unwrap(), 42);
        assert!(key_of::<i64>("t1:", &cursor, "cursor").is_err());
        assert!(key_of::<i64>("m1:", "not base64!", "before").is_err());
    }
}
