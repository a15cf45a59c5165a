//! `POST /v1/keys`, `GET /v1/keys`, `DELETE /v1/keys/{id}` (SPEC X1): admin only.
//!
//! The secret is shown once, in the answer to its creation; the list shows a prefix to
//! tell keys apart. A revoked key stops working on every replica within a second
//! (`crate::auth::keys`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{JsonBody, parse_id};
use crate::AppState;
use crate::auth::keys::{MAX_KEYS_PER_TEAM, validate_name};
use crate::auth::{Principal, Scope};
use crate::error::ApiError;
use crate::store::{KeyRow, StoreError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    name: String,
    scope: Scope,
}

/// The answer to a creation: the only time the secret is shown.
#[derive(Serialize)]
pub struct CreatedKey {
    id: Uuid,
    name: String,
    scope: String,
    api_key: String,
    created_at: DateTime<Utc>,
}

pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody<CreateKey>,
) -> Result<(StatusCode, Json<CreatedKey>), ApiError> {
    principal.require_admin()?;
    validate_name(&body.name).map_err(|m| ApiError::InvalidRequest(m.into()))?;
    let team = principal.team;
    match state.auth.keys.create(team, &body.name, body.scope).await {
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

#[derive(Serialize)]
pub struct KeyList {
    keys: Vec<KeyRow>,
}

pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
) -> Result<Json<KeyList>, ApiError> {
    principal.require_admin()?;
    let keys = state.auth.keys.list(principal.team).await?;
    Ok(Json(KeyList { keys }))
}

pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    Path(key_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let id: Uuid = parse_id(&key_id, "key")?;
    let team = principal.team;
    match state.auth.keys.revoke(team, id).await {
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
