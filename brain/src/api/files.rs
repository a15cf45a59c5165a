//! `POST /v1/chats/{id}/files` (a file uploaded to a chat) and `GET /v1/files/{id}` (its
//! bytes), T21. Whoever may post to the chat may upload to it; whoever may read the chat
//! may download its files, and nobody else (another team's id, or a chat the caller may
//! not see, is `404`). The media type is the one sniffed from the bytes (T22,
//! `engine::files`).
//!
//! The upload is a `multipart/form-data` body with one field, `file`, read as a stream
//! under the route's own bound (one file and room for the form around it), not the
//! API-wide body limit.
//!
//! A URL handed to a client (the upload's answer, a transcript's `file` parts) is signed
//! (T26, `engine::files::FileUrls`): without a bearer, `GET` of it serves the file until it
//! expires, so an `<img src>` shows it. With a bearer, the bearer decides and the query is
//! not read.

use axum::Json;
use axum::body::Body;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use protocol::ErrorBody;
use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use uuid::Uuid;

use super::artifacts::{Binary, content_disposition};
use super::{QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::artifacts::ArtifactError;
use engine::auth::{AuthError, Principal};
use engine::files::{self, FileError};
use protocol::ChatId;
use store::{ChatFileRow, StoreError, bounded};

/// Room for the multipart framing and the field's headers around the file's bytes.
const FORM_OVERHEAD: usize = 64 << 10;

/// A stored file of a chat.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatFile {
    pub id: Uuid,
    /// Where the bytes are served, signed (T26): `GET` of it needs no bearer until `exp`.
    /// A message's `file` part names the file by it (signed or not).
    #[schema(
        example = "/v1/files/019a0000-0000-7000-8000-000000000002?exp=1767225600&sig=q0aVJ1AXpQF5Oqh3dYqz0tXbrBEoS2SNuCjTzUkfGjE"
    )]
    pub url: String,
    /// Sniffed from the bytes, never the client's word: `image/png`, `image/jpeg`,
    /// `image/gif`, `image/webp`, `application/pdf`, `application/json`, `text/csv`,
    /// `text/plain` or `application/octet-stream`.
    pub media_type: String,
    /// Bytes stored: an image's after its metadata was stripped and it was scaled down.
    pub size: i64,
    pub filename: String,
}

impl ChatFile {
    /// The file as its uploader sees it: its URL signed for the team.
    async fn signed(state: &AppState, row: ChatFileRow) -> Result<Self, ApiError> {
        let url = state
            .file_urls
            .sign(&state.store, row.team_id, row.id, state.clock.now())
            .await?;
        Ok(Self {
            id: row.id,
            url,
            media_type: row.media_type,
            size: row.size_bytes,
            filename: row.filename,
        })
    }
}

/// The form of an upload, in the contract: one field, `file`.
pub(super) enum UploadForm {}

impl utoipa::PartialSchema for UploadForm {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .property(
                "file",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
                    .description(Some(
                        "The file; its part's `filename` is kept (its last path segment).",
                    )),
            )
            .required("file")
            .into()
    }
}

impl utoipa::ToSchema for UploadForm {}

#[utoipa::path(
    post,
    path = "/chats/{chat_id}/files",
    operation_id = "upload_file",
    tag = "files",
    params(("chat_id" = Uuid, Path, description = "The chat the file belongs to.")),
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 201, description = "The stored file; name it in a message's `file` part by \
            its `url`.", body = ChatFile),
        (status = 400, description = "Not a multipart form with exactly one `file` field, or \
            bytes that begin as an image and do not decode as one (`invalid_request`).",
            body = ErrorBody),
        (status = 404, description = "No such chat in the team, or one the caller may not \
            see (`not_found`).", body = ErrorBody),
        (status = 413, description = "The file is larger than `BRAIN_FILE_MAX_BYTES` \
            (`file_too_large`), or the team's files would pass `BRAIN_FILE_QUOTA_BYTES` \
            (`file_quota_exceeded`); nothing was stored.", body = ErrorBody),
        (status = 503, description = "The object storage (`storage_unavailable`) or Postgres \
            (`store_unavailable`) is unavailable.", body = ErrorBody),
    ),
)]
pub async fn upload(
    State(state): State<AppState>,
    principal: Principal,
    Path(chat_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<ChatFile>), ApiError> {
    let chat: ChatId = parse_id(&chat_id, "chat")?;
    // Before the body is read: an unknown chat is `404` whatever the body, and nothing of
    // it is taken in.
    match bounded(state.store.chat_owner(principal.team, chat)).await {
        Ok(_) => {}
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("chat")),
        Err(e) => return Err(e.into()),
    }
    principal.check_chat(&state.store, chat).await?;
    // Held while the body is read and stored (T27): a replica takes so many at once.
    let _slot = files::upload_slot(&state, principal.team)?;
    let (filename, bytes) = read_form(&headers, body, state.config.files.max_file_bytes).await?;
    match files::save(&state, principal.team, chat, &filename, bytes).await {
        Ok(row) => Ok((
            StatusCode::CREATED,
            Json(ChatFile::signed(&state, row).await?),
        )),
        Err(FileError::NotFound) => Err(ApiError::NotFound("chat")),
        Err(e) => Err(e.into()),
    }
}

/// The `file` field of a multipart body of at most `max_file` bytes: its file name and
/// bytes.
pub(super) async fn read_form(
    headers: &HeaderMap,
    body: Body,
    max_file: usize,
) -> Result<(String, Bytes), ApiError> {
    let boundary = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| multer::parse_boundary(v).ok())
        .ok_or_else(|| invalid("expected Content-Type: multipart/form-data with a boundary"))?;
    let constraints = multer::Constraints::new().size_limit(
        multer::SizeLimit::new()
            .whole_stream((max_file + FORM_OVERHEAD) as u64)
            .per_field(max_file as u64 + 1),
    );
    let mut form =
        multer::Multipart::with_constraints(body.into_data_stream(), boundary, constraints);
    let mut found = None;
    while let Some(mut field) = form
        .next_field()
        .await
        .map_err(|e| form_error(e, max_file))?
    {
        if field.name() != Some("file") || found.is_some() {
            return Err(invalid("the form must have exactly one field, `file`"));
        }
        let filename = field.file_name().unwrap_or_default().to_owned();
        let mut bytes = BytesMut::new();
        while let Some(chunk) = field.chunk().await.map_err(|e| form_error(e, max_file))? {
            if bytes.len() + chunk.len() > max_file {
                return Err(ApiError::FileTooLarge(max_file));
            }
            bytes.extend_from_slice(&chunk);
        }
        found = Some((filename, bytes.freeze()));
    }
    found.ok_or_else(|| invalid("the form must have exactly one field, `file`"))
}

fn invalid(message: &str) -> ApiError {
    ApiError::InvalidRequest(message.to_owned())
}

fn form_error(err: multer::Error, max_file: usize) -> ApiError {
    match err {
        multer::Error::StreamSizeExceeded { .. } | multer::Error::FieldSizeExceeded { .. } => {
            ApiError::FileTooLarge(max_file)
        }
        _ => invalid("the body is not a well-formed multipart form"),
    }
}

/// The query of a signed file URL (T26).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SignedQuery {
    /// When the signature expires, in Unix seconds.
    exp: Option<i64>,
    /// The signature, as the URL was handed out.
    sig: Option<String>,
}

#[utoipa::path(
    get,
    path = "/files/{file_id}",
    operation_id = "download_file",
    tag = "files",
    params(("file_id" = Uuid, Path, description = "The file."), SignedQuery),
    // The bearer, or the URL's signature instead (T26).
    security(("team_key" = []), ()),
    responses(
        (status = 200, description = "The bytes with the sniffed media type: an image \
            `inline`, anything else as an `attachment` under a `sandbox` Content-Security-Policy.",
            content_type = "*/*", body = Binary,
            headers(
                ("Content-Disposition" = String, description = "`inline` for an image, else \
                    `attachment`, with a sanitized file name."),
                ("Content-Security-Policy" = String, description = "`sandbox; default-src \
                    'none'` for anything not an image."),
            )),
        (status = 401, description = "Neither a bearer nor a signature (`unauthorized`).",
            body = ErrorBody),
        (status = 403, description = "Without a bearer: the signature has expired or is not \
            this file's (`invalid_file_url`); the transcript read again has fresh URLs.",
            body = ErrorBody),
        (status = 404, description = "No such file in the team, one of a chat the caller may \
            not see, or its bytes are gone, erased with its chat (`not_found`).",
            body = ErrorBody),
        (status = 503, description = "The object storage (`storage_unavailable`) or Postgres \
            (`store_unavailable`) is unavailable.", body = ErrorBody),
    ),
)]
pub async fn download(
    State(state): State<AppState>,
    Path(file_id): Path<String>,
    QueryParams(query): QueryParams<SignedQuery>,
    mut parts: Parts,
) -> Result<Response, ApiError> {
    let id: Uuid = parse_id(&file_id, "file")?;
    let row = match (query.exp, query.sig.as_deref()) {
        (Some(exp), Some(sig)) if !parts.headers.contains_key(header::AUTHORIZATION) => {
            signed_file(&state, id, exp, sig).await?
        }
        _ => {
            let principal = Principal::from_request_parts(&mut parts, &state).await?;
            readable_file(&state, &principal, id).await?
        }
    };
    let body = match state.artifacts.get(&row.storage_key).await {
        Ok(body) => body,
        Err(ArtifactError::NotFound) => {
            tracing::warn!(team = %row.team_id, file = %row.id, "chat file bytes missing");
            return Err(ApiError::NotFound("file"));
        }
        Err(e) => return Err(e.into()),
    };
    // Stored media types are sniffed ones: `image/` is PNG, JPEG, GIF or WebP, never SVG.
    let image = row.media_type.starts_with("image/");
    let content_type = HeaderValue::from_str(&row.media_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let mut disposition = content_disposition(&row.filename);
    if image {
        // Opened on its own (a click on the picture), an image shows; nothing else does.
        disposition = disposition.replacen("attachment", "inline", 1);
    }
    let disposition =
        HeaderValue::from_str(&disposition).unwrap_or(HeaderValue::from_static("attachment"));
    let mut response = Body::from_stream(body.stream).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, content_type);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.size));
    headers.insert(header::CONTENT_DISPOSITION, disposition);
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if !image {
        // Text or a PDF opened at this origin runs no script and reaches nothing of it.
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("sandbox; default-src 'none'"),
        );
    }
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-cache"),
    );
    Ok(response)
}

/// The file a bearer's principal may read: of its team, in a chat it may see.
async fn readable_file(
    state: &AppState,
    principal: &Principal,
    id: Uuid,
) -> Result<ChatFileRow, ApiError> {
    let row = match bounded(state.store.chat_file(principal.team, id)).await {
        Ok(row) => row,
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("file")),
        Err(e) => return Err(e.into()),
    };
    match principal.check_chat(&state.store, row.chat_id).await {
        Ok(()) => Ok(row),
        Err(AuthError::NotFound(_)) => Err(ApiError::NotFound("file")),
        Err(e) => Err(e.into()),
    }
}

/// The file a signed URL opens: its signature checked against the file's own team, so a
/// signature made for one file opens no other, of this team or another. An expired URL is
/// refused as such; a file erased since is `404`.
async fn signed_file(
    state: &AppState,
    id: Uuid,
    exp: i64,
    sig: &str,
) -> Result<ChatFileRow, ApiError> {
    let row = match bounded(state.store.chat_file_of_any_team(id)).await {
        Ok(row) => row,
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("file")),
        Err(e) => return Err(e.into()),
    };
    state
        .file_urls
        .check(&state.store, row.team_id, id, exp, sig, state.clock.now())
        .await??;
    Ok(row)
}
