//! The web chat (`web/`), served at `/` from files embedded at compile time.
//!
//! `web/dist/embed.rs` is written by the page's build (`npm run build` in `web/`) and lists
//! every built file as an `include_bytes!`, so the binary holds exactly what was built and
//! neither `cargo build` nor the running brain needs Node. These routes sit outside `/v1`
//! and outside the OpenAPI document: they are a client of the API, not part of it.

use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The built files, by path under `web/dist`.
static FILES: &[(&str, &[u8])] = include!("../../../web/dist/embed.rs");

/// The page runs only its own bundled script and style: no inline code, no other origin,
/// and images from the API are shown through `blob:` URLs.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' blob: data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// `GET /`: the page. Not cached, so a new brain's page (and its new asset names) is
/// picked up on the next load.
pub async fn index() -> Result<Response, ApiError> {
    let body = file("index.html").ok_or(ApiError::NotFound("page"))?;
    Ok((
        [
            (
                CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                HeaderName::from_static("content-security-policy"),
                HeaderValue::from_static(CSP),
            ),
            (X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (
                HeaderName::from_static("referrer-policy"),
                HeaderValue::from_static("no-referrer"),
            ),
        ],
        body,
    )
        .into_response())
}

/// `GET /assets/{file}`: a built script or style. Its name carries a hash of its content,
/// so it never changes and may be cached for good.
pub async fn asset(Path(name): Path<String>) -> Result<Response, ApiError> {
    let body = file(&format!("assets/{name}")).ok_or(ApiError::NotFound("asset"))?;
    Ok((
        [
            (CONTENT_TYPE, HeaderValue::from_static(content_type(&name))),
            (
                CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=31536000, immutable"),
            ),
            (X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        ],
        body,
    )
        .into_response())
}

fn file(path: &str) -> Option<&'static [u8]> {
    FILES
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, body)| *body)
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("woff2") => "font/woff2",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_the_page_names_is_embedded_with_a_known_type() {
        let page = std::str::from_utf8(file("index.html").unwrap()).unwrap();
        let named: Vec<&str> = page
            .split('"')
            .filter_map(|s| s.strip_prefix("/assets/"))
            .collect();
        assert!(
            named.len() >= 2,
            "the page names its script and style: {page}"
        );
        for name in named {
            assert!(
                file(&format!("assets/{name}")).is_some(),
                "{name} is embedded"
            );
            assert_ne!(content_type(name), "application/octet-stream", "{name}");
        }
        assert!(!page.contains("<script>"), "no inline script under the CSP");
    }
}
