//! `POST /v1/keys`, `GET /v1/keys`, `DELETE /v1/keys/{id}` (SPEC X1): admin only.
//!
//! The secret is shown once, in the answer to its creation; the list shows a prefix to
//! tell keys apart. A revoked key stops working on every replica within a second
//! (`engine::auth::keys`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::paging::{self, KeysetKey, PageParams};
use super::{ClientAddr, JsonBody, QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::keys::{MAX_KEYS_PER_TEAM, validate_name};
use engine::auth::{Principal, Scope};
use protocol::ErrorBody;
use store::{KeyRow, StoreError, bounded};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "ci", "scope": "chat"}))]
pub struct CreateKey {
    name: String,
    scope: Scope,
}

/// The answer to a creation: the only time the secret is shown.
#[derive(Serialize, utoipa::ToSchema)]
pub struct CreatedKey {
    id: Uuid,
    name: String,
    scope: String,
    api_key: String,
    created_at: DateTime<Utc>,
}

#[utoipa::path(
    post,
    path = "/keys",
    operation_id = "create_key",
    tag = "keys",
    request_body = CreateKey,
    responses(
        (status = 201, description = "The key; `api_key` is shown this once.", body = CreatedKey),
        (status = 400, description = "A field is missing, unknown or invalid, or the team has \
            too many keys (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).", body = ErrorBody),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    JsonBody(body): JsonBody<CreateKey>,
) -> Result<(StatusCode, Json<CreatedKey>), ApiError> {
    principal.require_admin()?;
    validate_name(&body.name).map_err(|m| ApiError::InvalidRequest(m.into()))?;
    let team = principal.team;
    let by = principal.actor(address);
    match state
        .auth
        .keys
        .create(team, &body.name, body.scope, &by)
        .await
    {
        Ok((row, api_key)) => {
            tracing::info!(team = %team, key = %row.id, scope = body.scope.as_str(), "api key created");
            Ok((
                StatusCode::CREATED,
                Json(CreatedKey {
                    id: row.id,
                    name: row.name,
                    scope: row.scope,
                    api_key,
                    created_at: row.created_at,
                }),
            ))
        }
        Err(StoreError::Conflict("key_limit")) => Err(ApiError::InvalidRequest(format!(
            "a team may have at most {MAX_KEYS_PER_TEAM} live keys"
        ))),
        Err(e) => Err(e.into()),
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyList {
    keys: Vec<KeyRow>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

const KEYS_CURSOR: &str = "ky1:";

#[utoipa::path(
    get,
    path = "/keys",
    operation_id = "list_keys",
    tag = "keys",
    params(PageParams),
    responses(
        (status = 200, description = "A page of the team's live keys, oldest first, without \
            their secrets.", body = KeyList),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<KeyList>, ApiError> {
    principal.require_admin()?;
    let limit = params.limit()?;
    let after = params.after::<KeysetKey>(KEYS_CURSOR)?.map(|k| k.0);
    let rows = bounded(state.store.keys(principal.team, after, limit + 1)).await?;
    let (keys, next_cursor) = paging::page(rows, limit, KEYS_CURSOR, |k| {
        KeysetKey::of(k.created_at, k.id)
    });
    Ok(Json(KeyList { keys, next_cursor }))
}

#[utoipa::path(
    delete,
    path = "/keys/{key_id}",
    operation_id = "delete_key",
    tag = "keys",
    params(("key_id" = Uuid, Path, description = "The key.")),
    responses(
        (status = 204, description = "Revoked, on every replica within a second."),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such live key in the team (`not_found`).", body = ErrorBody),
        (status = 409, description = "The team's last admin key (`conflict`).", body = ErrorBody),
    ),
)]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(key_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let id: Uuid = parse_id(&key_id, "key")?;
    let team = principal.team;
    match state
        .auth
        .keys
        .revoke(team, id, &principal.actor(address))
        .await
    {
        Ok(()) => {
            tracing::info!(team = %team, key = %id, "api key revoked");
            Ok(StatusCode::NO_CONTENT)
        }
        Err(StoreError::NotFound) => Err(ApiError::NotFound("key")),
        Err(StoreError::Conflict("last_admin_key")) => Err(ApiError::Conflict(
            "this is the team's last admin key; create another admin key first".into(),
        )),
        Err(e) => Err(e.into()),
    }
}
