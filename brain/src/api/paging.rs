//! Paged listings (L3): `?limit=&cursor=` in, `next_cursor` out. Clients only hand a
//! `next_cursor` back, so the key behind it (a transcript `seq`, a turn id, a row's
//! creation time and id) may change form without breaking them. Each listing tags its
//! cursors, so one listing's cursor is refused by another. Pages are keyset pages (the
//! rows after the last one shown, never `OFFSET`), so rows inserted meanwhile neither
//! repeat nor push a row off a page.

use std::fmt::Display;
use std::str::FromStr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

use crate::error::ApiError;
use store::Keyset;

pub const DEFAULT_LIST: u32 = 50;
pub const MAX_LIST: u32 = 200;

/// `?limit=&cursor=` of a paged listing.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// How many: 1 to 200, 50 when absent.
    #[serde(default)]
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the page before, for the page after it.
    #[serde(default)]
    pub cursor: Option<String>,
}

impl PageParams {
    pub fn limit(&self) -> Result<i64, ApiError> {
        checked_limit(self.limit)
    }

    /// The key of `cursor` in the listing tagged `tag`, if one was given.
    pub fn after<T: FromStr>(&self, tag: &str) -> Result<Option<T>, ApiError> {
        self.cursor
            .as_deref()
            .map(|c| key_of(tag, c, "cursor"))
            .transpose()
    }
}

/// A `?limit=` of any listing, checked against the listings' bounds.
pub fn checked_limit(limit: Option<u32>) -> Result<i64, ApiError> {
    match limit {
        None => Ok(i64::from(DEFAULT_LIST)),
        Some(n) if (1..=MAX_LIST).contains(&n) => Ok(i64::from(n)),
        Some(_) => Err(ApiError::InvalidRequest(format!(
            "limit must be between 1 and {MAX_LIST}"
        ))),
    }
}

/// `rows`, read with `limit + 1`, cut to `limit`, and the cursor of the page after them
/// (`None`: this was the last).
pub fn page<T, K: Display>(
    mut rows: Vec<T>,
    limit: i64,
    tag: &str,
    key: impl Fn(&T) -> K,
) -> (Vec<T>, Option<String>) {
    let more = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(0));
    let next = if more {
        rows.last().map(|last| cursor_of(tag, key(last)))
    } else {
        None
    };
    (rows, next)
}

/// A keyset cursor's text: the row's creation time (microseconds) and id.
pub struct KeysetKey(pub Keyset);

impl KeysetKey {
    pub fn of(at: DateTime<Utc>, id: Uuid) -> Self {
        Self(Keyset { at, id })
    }
}

impl Display for KeysetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0.at.timestamp_micros(), self.0.id)
    }
}

impl FromStr for KeysetKey {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        let (micros, id) = s.split_once('.').ok_or(())?;
        let at = DateTime::from_timestamp_micros(micros.parse().map_err(|_| ())?).ok_or(())?;
        Ok(Self::of(at, id.parse().map_err(|_| ())?))
    }
}

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
    fn a_keyset_cursor_keeps_its_time_to_the_microsecond() {
        let at = DateTime::from_timestamp_micros(1_764_000_000_123_456).unwrap();
        let id = Uuid::now_v7();
        let cursor = cursor_of("k1:", KeysetKey::of(at, id));
        let back: KeysetKey = key_of("k1:", &cursor, "cursor").unwrap();
        assert_eq!((back.0.at, back.0.id), (at, id));
        assert!(key_of::<KeysetKey>("k1:", &cursor_of("k1:", "12"), "cursor").is_err());
    }

    #[test]
    fn a_page_has_a_cursor_only_when_more_rows_follow() {
        let (rows, next) = page(vec![1, 2, 3], 2, "n:", |n| *n);
        assert_eq!(rows, [1, 2]);
        assert_eq!(key_of::<i32>("n:", &next.unwrap(), "cursor").unwrap(), 2);
        let (rows, next) = page(vec![1, 2], 2, "n:", |n| *n);
        assert_eq!((rows, next), (vec![1, 2], None));
    }

    #[test]
    fn a_cursor_gives_back_its_key_in_its_own_listing_only() {
        let cursor = cursor_of("m1:", 42);
        assert_eq!(key_of::<i64>("m1:", &cursor, "before").unwrap(), 42);
        assert!(key_of::<i64>("t1:", &cursor, "cursor").is_err());
        assert!(key_of::<i64>("m1:", "not base64!", "before").is_err());
    }
}
