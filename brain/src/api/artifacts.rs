//! `GET /v1/artifacts/{id}` (the bytes) and `GET /v1/artifacts/{id}/meta` (the row).
//!
//! Artifacts are created by the brain itself (`engine::artifacts::save_artifact`, called by
//! the worker's upload tool and the browser screenshot), never uploaded through this API.
//! A download is streamed from the backend, to the owning team only; another team's id
//! and a malformed id are both `404`. The response always says `attachment` with a
//! sanitized file name and `nosniff`, so a stored HTML or SVG file is never rendered on the
//! API's origin.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use protocol::ErrorBody;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use uuid::Uuid;

use super::parse_id;
use crate::AppState;
use crate::error::ApiError;
use engine::artifacts::ArtifactError;
use engine::auth::Principal;
use store::{ArtifactRow, StoreError};

/// The artifact, if the principal may see it: its team's, and for a user token without
/// the admin claim, of one of the user's chats.
async fn row(state: &AppState, principal: &Principal, raw: &str) -> Result<ArtifactRow, ApiError> {
    let id: Uuid = parse_id(raw, "artifact")?;
    let row = match state.store.artifact(principal.team, id).await {
        Ok(row) => row,
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("artifact")),
        Err(e) => return Err(e.into()),
    };
    principal
        .check_artifact_chat(&state.store, row.chat_id)
        .await?;
    Ok(row)
}

#[utoipa::path(
    get,
    path = "/artifacts/{artifact_id}/meta",
    operation_id = "get_artifact",
    tag = "artifacts",
    params(("artifact_id" = Uuid, Path, description = "The artifact.")),
    responses(
        (status = 200, description = "The artifact's row.", body = ArtifactRow),
        (status = 404, description = "No such artifact in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn meta(
    State(state): State<AppState>,
    principal: Principal,
    Path(artifact_id): Path<String>,
) -> Result<Json<ArtifactRow>, ApiError> {
    Ok(Json(row(&state, &principal, &artifact_id).await?))
}

#[utoipa::path(
    get,
    path = "/artifacts/{artifact_id}",
    operation_id = "download_artifact",
    tag = "artifacts",
    params(
        ("artifact_id" = Uuid, Path, description = "The artifact."),
        ("If-None-Match" = Option<String>, Header, description = "ETags (or `*`) the client holds."),
    ),
    responses(
        (status = 200, description = "The bytes, as an attachment with the stored content type.",
            content_type = "*/*", body = Binary,
            headers(
                ("ETag" = String, description = "The quoted SHA-256 of the bytes."),
                ("Content-Disposition" = String, description = "`attachment` with a sanitized file name."),
            )),
        (status = 304, description = "`If-None-Match` names this artifact's ETag.",
            headers(("ETag" = String, description = "The quoted SHA-256 of the bytes."))),
        (status = 404, description = "No such artifact in the team, or its bytes are gone (`not_found`).",
            body = ErrorBody),
        (status = 503, description = "The object storage (`storage_unavailable`) or Postgres \
            (`store_unavailable`) is unavailable.", body = ErrorBody),
    ),
)]
pub async fn download(
    State(state): State<AppState>,
    principal: Principal,
    Path(artifact_id): Path<String>,
    request_headers: HeaderMap,
) -> Result<Response, ApiError> {
    let row = row(&state, &principal, &artifact_id).await?;
    let team = principal.team;
    let etag = HeaderValue::from_str(&format!("\"{}\"", row.sha256))
        .map_err(|_| ApiError::Internal("stored sha256 is not a header value".into()))?;
    if if_none_match(&request_headers, &row.sha256) {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response());
    }
    let body = match state.artifacts.get(&row.storage_key).await {
        Ok(body) => body,
        Err(ArtifactError::NotFound) => {
            // A row whose bytes are gone: the client sees a missing artifact.
            tracing::warn!(team = %team, artifact = %row.id, "artifact bytes missing");
            return Err(ApiError::NotFound("artifact"));
        }
        Err(e) => return Err(e.into()),
    };
    if i64::try_from(body.size).ok() != Some(row.size_bytes) {
        return Err(ApiError::Internal(format!(
            "artifact {} has {} stored bytes, its row says {}",
            row.id, body.size, row.size_bytes
        )));
    }
    let content_type = HeaderValue::from_str(&row.content_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let disposition = HeaderValue::from_str(&content_disposition(&row.name))
        .unwrap_or(HeaderValue::from_static("attachment"));
    let mut response = Body::from_stream(body.stream).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, content_type);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.size));
    headers.insert(header::CONTENT_DISPOSITION, disposition);
    headers.insert(header::ETAG, etag);
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-cache"),
    );
    tracing::debug!(team = %team, artifact = %row.id, size = body.size, "artifact download");
    Ok(response)
}

/// A download's body in the contract: any bytes.
pub(super) enum Binary {}

impl utoipa::PartialSchema for Binary {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .into()
    }
}

impl utoipa::ToSchema for Binary {}

/// Whether `If-None-Match` names this artifact's ETag (or `*`).
fn if_none_match(headers: &HeaderMap, sha256: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/").trim_matches('"'))
        .any(|tag| tag == "*" || tag == sha256)
}

/// `attachment; filename="<ASCII fallback>"`, plus `filename*=UTF-8''…` (RFC 6266 / 8187)
/// when the name has characters the fallback had to replace. Only the last path segment
/// of a name is kept, and the fallback holds no quote, backslash or control character.
pub fn content_disposition(name: &str) -> String {
    let base = name
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or("")
        .trim()
        .trim_start_matches('.');
    let base = if base.is_empty() { "artifact" } else { base };
    let fallback: String = base
        .chars()
        .take(200)
        .map(|c| {
            if c.is_ascii_alphanumeric() || " ._-()+,=@[]".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut value = format!("attachment; filename=\"{fallback}\"");
    if fallback != base {
        value.push_str("; filename*=UTF-8''");
        for byte in base.bytes() {
            if byte.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&byte) {
                value.push(char::from(byte));
            } else {
                value.push_str(&format!("%{byte:02X}"));
            }
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disposition_is_sanitized() {
        assert_eq!(
            content_disposition("report.pdf"),
            "attachment; filename=\"report.pdf\""
        );
        assert_eq!(
            content_disposition("../../etc/passwd"),
            "attachment; filename=\"passwd\""
        );
        assert_eq!(
            content_disposition("a\"b\r\nX-Evil: 1.txt"),
            "attachment; filename=\"a_b__X-Evil_ 1.txt\"; filename*=UTF-8''a%22b%0D%0AX-Evil%3A%201.txt"
        );
        assert_eq!(
            content_disposition("résumé.txt"),
            "attachment; filename=\"r_sum_.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9.txt"
        );
        assert_eq!(
            content_disposition(".."),
            "attachment; filename=\"artifact\""
        );
        for name in ["x\"y", "a\\b", "é", "\u{0}", "tab\tname"] {
            assert!(
                HeaderValue::from_str(&content_disposition(name)).is_ok(),
                "{name:?}"
            );
        }
    }

    #[test]
    fn etag_matching() {
        let mut headers = HeaderMap::new();
        assert!(!if_none_match(&headers, "abc"));
        headers.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static("\"x\", \"abc\""),
        );
        assert!(if_none_match(&headers, "abc"));
        assert!(!if_none_match(&headers, "abd"));
    }
}
