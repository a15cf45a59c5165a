//! `POST /v1/chats/{id}/files` (a file uploaded to a chat) and `GET /v1/files/{id}` (its
//! bytes), T21. Whoever may post to the chat may upload to it; whoever may read the chat
//! may download its files, and nobody else (another team's id, or a chat the caller may
//! not see, is `404`). The media type is the one sniffed from the bytes (T22,
//! `engine::files`).
//!
//! The upload is a `multipart/form-data` body with one field, `file`, read as a stream
//! under the route's own bound (one file and room for the form around it), not the
//! API-wide body limit.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use protocol::ErrorBody;
use serde::Serialize;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use uuid::Uuid;

use super::artifacts::{Binary, content_disposition};
use super::parse_id;
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
    /// Where the bytes are served, and how a message's `file` part names the file.
    #[schema(example = "/v1/files/019a0000-0000-7000-8000-000000000002")]
    pub url: String,
    /// Sniffed from the bytes, never the client's word: `image/png`, `image/jpeg`,
    /// `image/gif`, `image/webp`, `application/pdf`, `application/json`, `text/csv`,
    /// `text/plain` or `application/octet-stream`.
    pub media_type: String,
    /// Bytes stored: an image's after its metadata was stripped and it was scaled down.
    pub size: i64,
    pub filename: String,
}

impl From<ChatFileRow> for ChatFile {
    fn from(row: ChatFileRow) -> Self {
        Self {
            id: row.id,
            url: files::url(row.id),
            media_type: row.media_type,
            size: row.size_bytes,
            filename: row.filename,
        }
    }
}

/// The form of an upload, in the contract: one field, `file`.
enum UploadForm {}

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
    let (filename, bytes) = read_form(&state, &headers, body).await?;
    match files::save(&state, principal.team, chat, &filename, bytes).await {
        Ok(row) => Ok((StatusCode::CREATED, Json(row.into()))),
        Err(FileError::NotFound) => Err(ApiError::NotFound("chat")),
        Err(e) => Err(e.into()),
    }
}

/// The `file` field of a multipart body: its file name and bytes.
async fn read_form(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(String, Bytes), ApiError> {
    let max_file = state.config.files.max_file_bytes;
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

#[utoipa::path(
    get,
    path = "/files/{file_id}",
    operation_id = "download_file",
    tag = "files",
    params(("file_id" = Uuid, Path, description = "The file.")),
    responses(
        (status = 200, description = "The bytes, as an attachment with the sniffed media type.",
            content_type = "*/*", body = Binary,
            headers(
                ("Content-Disposition" = String, description = "`attachment` with a sanitized file name."),
            )),
        (status = 404, description = "No such file in the team, one of a chat the caller may \
            not see, or its bytes are gone (`not_found`).", body = ErrorBody),
        (status = 503, description = "The object storage (`storage_unavailable`) or Postgres \
            (`store_unavailable`) is unavailable.", body = ErrorBody),
    ),
)]
pub async fn download(
    State(state): State<AppState>,
    principal: Principal,
    Path(file_id): Path<String>,
) -> Result<Response, ApiError> {
    let id: Uuid = parse_id(&file_id, "file")?;
    let row = match bounded(state.store.chat_file(principal.team, id)).await {
        Ok(row) => row,
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("file")),
        Err(e) => return Err(e.into()),
    };
    match principal.check_chat(&state.store, row.chat_id).await {
        Ok(()) => {}
        Err(AuthError::NotFound(_)) => return Err(ApiError::NotFound("file")),
        Err(e) => return Err(e.into()),
    }
    let body = match state.artifacts.get(&row.storage_key).await {
        Ok(body) => body,
        Err(ArtifactError::NotFound) => {
            tracing::warn!(team = %principal.team, file = %row.id, "chat file bytes missing");
            return Err(ApiError::NotFound("file"));
        }
        Err(e) => return Err(e.into()),
    };
    let content_type = HeaderValue::from_str(&row.media_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let disposition = HeaderValue::from_str(&content_disposition(&row.filename))
        .unwrap_or(HeaderValue::from_static("attachment"));
    let mut response = Body::from_stream(body.stream).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, content_type);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.size));
    headers.insert(header::CONTENT_DISPOSITION, disposition);
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-cache"),
    );
    Ok(response)
}
