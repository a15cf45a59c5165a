//! The routes workers call (SPEC W3, W10, T25): the channel's WebSocket upgrade, the
//! workspace snapshot's upload, skip and download, and the chat's files. They authenticate
//! with the worker's session token (the upgrade also with a pool token), never a team key;
//! what follows is `engine::sessions`' (`connect.rs`, `snapshot.rs`) and
//! `engine::files::workspace`.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use protocol::SessionId;
use protocol::channel::{CHANNEL_VERSION_HEADER, SESSION_HEADER, SessionClaims};
use protocol::snapshot::{SnapshotSkipped, UNPACKED_BYTES_HEADER};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::AppState;
use crate::error::{ApiError, JsonBody};
use engine::artifacts::ArtifactBody;
use engine::sessions::{Restore, SNAPSHOT_CONTENT_TYPE, Upload};

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// The claims of the request's session token.
fn claims(state: &AppState, headers: &HeaderMap) -> Result<SessionClaims, ApiError> {
    bearer(headers)
        .and_then(|token| state.sessions.session_claims(token))
        .ok_or(ApiError::Unauthorized)
}

/// The worker channel's WebSocket upgrade (MCP over WebSocket, docs/protocol.md).
#[utoipa::path(
    get,
    path = protocol::channel::CONNECT_PATH,
    operation_id = "connect_worker",
    tag = "workers",
    security(("worker_token" = [])),
    responses(
        (status = 101, description = "Switching to the worker channel."),
        (status = 400, description = "Not a WebSocket upgrade (`invalid_request`).",
            body = protocol::ErrorBody),
        (status = 401, description = "No token, or one that is neither a valid session nor a \
            valid pool token (`unauthorized`).", body = protocol::ErrorBody),
    ),
)]
pub async fn connect(
    State(state): State<AppState>,
    mut request: Request,
) -> Result<Response, ApiError> {
    let sessions = state.sessions.clone();
    let headers = request.headers();
    let token = bearer(headers).ok_or(ApiError::Unauthorized)?;
    let dial = sessions.dialer(token).ok_or(ApiError::Unauthorized)?;
    let session = dial.claims().sub;
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| ApiError::InvalidRequest("expected a WebSocket upgrade".into()))?;
    let accept = derive_accept_key(key.as_bytes());
    let version = headers
        .get(CHANNEL_VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok());
    let named = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<SessionId>().ok())
        .unwrap_or(session);
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => sessions.serve_dial(upgraded, dial, version, named).await,
            Err(_) => tracing::info!(session = %session, "worker upgrade failed"),
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    Ok(response.into_response())
}

/// The worker's packed workspace, at an idle teardown.
#[utoipa::path(
    put,
    path = protocol::snapshot::SNAPSHOT_PATH,
    operation_id = "put_worker_snapshot",
    tag = "workers",
    security(("worker_token" = [])),
    request_body(content = Vec<u8>, content_type = "application/zstd",
        description = "A zstd-compressed tar stream of the workspace; header \
            `x-snapshot-unpacked-bytes` gives the tar stream's size."),
    responses(
        (status = 204, description = "Stored: the chat's next session restores it."),
        (status = 401, description = "No valid session token (`unauthorized`).",
            body = protocol::ErrorBody),
        (status = 409, description = "No snapshot is asked of this session (`conflict`).",
            body = protocol::ErrorBody),
        (status = 413, description = "Over the profile's cap (`payload_too_large`).",
            body = protocol::ErrorBody),
        (status = 503, description = "This replica, or the team's share of it, takes as many \
            uploads as it may at once (`overloaded`): nothing was read; retry after \
            `Retry-After`.", body = protocol::ErrorBody),
    ),
)]
pub async fn put_snapshot(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let claims = claims(&state, &headers)?;
    let unpacked = headers
        .get(UNPACKED_BYTES_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let upload = Upload {
        unpacked,
        announced,
    };
    engine::sessions::store_upload(&state, &claims, upload, body.into_data_stream()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The worker sends no snapshot: over the cap, or it could not pack or upload one.
#[utoipa::path(
    post,
    path = protocol::snapshot::SNAPSHOT_SKIPPED_PATH,
    operation_id = "skip_worker_snapshot",
    tag = "workers",
    security(("worker_token" = [])),
    request_body(content = SnapshotSkipped),
    responses(
        (status = 204, description = "Recorded on the session row."),
        (status = 401, description = "No valid session token (`unauthorized`).",
            body = protocol::ErrorBody),
        (status = 409, description = "No snapshot is asked of this session (`conflict`).",
            body = protocol::ErrorBody),
    ),
)]
pub async fn snapshot_skipped(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(skipped): JsonBody<SnapshotSkipped>,
) -> Result<StatusCode, ApiError> {
    let claims = claims(&state, &headers)?;
    engine::sessions::record_skip(&state, &claims, skipped).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The snapshot a new session's worker restores before it dials.
#[utoipa::path(
    get,
    path = protocol::snapshot::SNAPSHOT_PATH,
    operation_id = "get_worker_snapshot",
    tag = "workers",
    security(("worker_token" = [])),
    responses(
        (status = 200, description = "The chat's snapshot, a zstd-compressed tar stream; \
            header `x-snapshot-unpacked-bytes` bounds what it unpacks to.",
            content_type = "application/zstd"),
        (status = 204, description = "Nothing to restore."),
        (status = 401, description = "No valid session token (`unauthorized`).",
            body = protocol::ErrorBody),
    ),
)]
pub async fn get_snapshot(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let claims = claims(&state, &headers)?;
    let Some(Restore {
        body,
        unpacked_bytes,
    }) = engine::sessions::restorable(&state, &claims).await?
    else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let mut response = streamed(body, SNAPSHOT_CONTENT_TYPE);
    response
        .headers_mut()
        .insert(UNPACKED_BYTES_HEADER, HeaderValue::from(unpacked_bytes));
    Ok(response)
}

/// A file of the session's chat, which the worker places under `uploads/` (T25).
#[utoipa::path(
    get,
    path = protocol::uploads::UPLOAD_PATH,
    operation_id = "get_worker_file",
    tag = "workers",
    security(("worker_token" = [])),
    params(("id" = String, Path, description = "The file's id.")),
    responses(
        (status = 200, description = "The file's bytes.",
            content_type = "application/octet-stream"),
        (status = 401, description = "No valid session token (`unauthorized`).",
            body = protocol::ErrorBody),
        (status = 404, description = "No such file of the session's chat (`not_found`).",
            body = protocol::ErrorBody),
        (status = 503, description = "The object storage (`storage_unavailable`) or Postgres \
            (`store_unavailable`) is unavailable.", body = protocol::ErrorBody),
    ),
)]
pub async fn get_file(
    State(state): State<AppState>,
    Path(file_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let claims = claims(&state, &headers)?;
    let id: uuid::Uuid = super::parse_id(&file_id, "file")?;
    let body = engine::files::workspace::for_worker(&state, &claims, id).await?;
    Ok(streamed(body, "application/octet-stream"))
}

/// The folder of a skill the session's agent names, which the worker unpacks under
/// `skills/<name>/` (B8): a tar stream in zstd.
#[utoipa::path(
    get,
    path = protocol::skills::SKILL_PATH,
    operation_id = "get_worker_skill",
    tag = "workers",
    security(("worker_token" = [])),
    params(("id" = String, Path, description = "The skill version's id.")),
    responses(
        (status = 200, description = "The skill's folder, a zstd-compressed tar stream.",
            content_type = "application/zstd"),
        (status = 401, description = "No valid session token (`unauthorized`).",
            body = protocol::ErrorBody),
        (status = 404, description = "No newest version of a skill the session's agent \
            names (`not_found`).", body = protocol::ErrorBody),
        (status = 503, description = "The object storage (`storage_unavailable`) or Postgres \
            (`store_unavailable`) is unavailable.", body = protocol::ErrorBody),
    ),
)]
pub async fn get_skill(
    State(state): State<AppState>,
    Path(skill_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let claims = claims(&state, &headers)?;
    let id: uuid::Uuid = super::parse_id(&skill_id, "skill")?;
    let body =
        engine::skills::for_worker(&state.store, state.artifacts.as_ref(), &claims, id).await?;
    Ok(streamed(body, SNAPSHOT_CONTENT_TYPE))
}

/// A stored object's bytes streamed to a worker, never held whole, with their type and
/// length (the worker bounds its download by the length).
fn streamed(body: ArtifactBody, content_type: &'static str) -> Response {
    let size = body.size;
    let mut response = Body::from_stream(body.stream).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    response
}
