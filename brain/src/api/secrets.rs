//! `PUT /v1/secrets/{secret_name}`, `GET /v1/secrets`, `DELETE /v1/secrets/{secret_name}`: the team's
//! secrets (SPEC B1), for admins. A team secret is what a connector's `{{secret:NAME}}`
//! reference finds when the turn's agent holds no secret of that name
//! (`connectors::credentials`). A value goes in and never comes out: answers carry names and
//! times only.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use protocol::ErrorBody;
use serde::{Deserialize, Serialize};

use super::paging::{self, PageParams};
use super::{ClientAddr, JsonBody, QueryParams};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use engine::tools::secrets::{MAX_VALUE_BYTES, valid_name};
use store::{SecretInfo, SecretsError, StoreError, bounded};

/// Secrets per team.
pub const MAX_PER_TEAM: i64 = 100;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"value": "lin_api_…"}))]
pub struct PutSecret {
    /// 1 to 8192 bytes. Stored encrypted; never shown again.
    value: String,
}

// `Debug` by hand: the derive would print the value.
impl std::fmt::Debug for PutSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PutSecret(redacted)")
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct SecretList {
    secrets: Vec<SecretInfo>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

const SECRETS_CURSOR: &str = "sc1:";

fn checked_name(name: &str) -> Result<(), ApiError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::InvalidRequest(
            "a secret name is 1 to 64 of A-Z, 0-9 and _".into(),
        ))
    }
}

fn secrets_error(err: SecretsError) -> ApiError {
    match err {
        SecretsError::NotConfigured => ApiError::NotConfigured(
            "secrets are not configured on this server (BRAIN_SECRETS_KEY is unset)",
        ),
        SecretsError::TooMany => ApiError::InvalidRequest(format!(
            "a team may have at most {MAX_PER_TEAM} secrets; replace one instead"
        )),
        SecretsError::Crypto => ApiError::Internal("a secret could not be sealed".into()),
        SecretsError::Store(e) => e.into(),
    }
}

#[utoipa::path(
    put,
    path = "/secrets/{secret_name}",
    operation_id = "put_secret",
    tag = "secrets",
    params(("secret_name" = String, Path, description = "The secret's name, `^[A-Z0-9_]{1,64}$`.")),
    request_body = PutSecret,
    responses(
        (status = 201, description = "Stored under a new name."),
        (status = 204, description = "Replaced the value of an existing name."),
        (status = 400, description = "A bad name or value, or the team has too many secrets \
            (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).", body = ErrorBody),
        (status = 501, description = "The server has no `BRAIN_SECRETS_KEY` (`not_configured`).",
            body = ErrorBody),
    ),
)]
pub async fn put(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<PutSecret>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    checked_name(&name)?;
    if body.value.is_empty() || body.value.len() > MAX_VALUE_BYTES {
        return Err(ApiError::InvalidRequest(format!(
            "value must have 1 to {MAX_VALUE_BYTES} bytes"
        )));
    }
    let by = principal.actor(address);
    let stored = tokio::time::timeout(
        store::CALL_BOUND,
        state
            .store
            .set_team_secret(principal.team, &name, &body.value, MAX_PER_TEAM, &by),
    )
    .await
    .unwrap_or(Err(SecretsError::Store(StoreError::TimedOut)))
    .map_err(secrets_error)?;
    tracing::info!(team = %principal.team, created = stored, "team secret stored");
    Ok(if stored {
        StatusCode::CREATED
    } else {
        StatusCode::NO_CONTENT
    })
}

#[utoipa::path(
    get,
    path = "/secrets",
    operation_id = "list_secrets",
    tag = "secrets",
    params(PageParams),
    responses(
        (status = 200, description = "A page of the team's secret names in name order, \
            without values.", body = SecretList),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<SecretList>, ApiError> {
    principal.require_admin()?;
    let limit = params.limit()?;
    let after: Option<String> = params.after(SECRETS_CURSOR)?;
    let rows = state
        .store
        .list_team_secrets(principal.team, after.as_deref(), limit + 1);
    let (secrets, next_cursor) = paging::page(bounded(rows).await?, limit, SECRETS_CURSOR, |s| {
        s.name.clone()
    });
    Ok(Json(SecretList {
        secrets,
        next_cursor,
    }))
}

#[utoipa::path(
    delete,
    path = "/secrets/{secret_name}",
    operation_id = "delete_secret",
    tag = "secrets",
    params(("secret_name" = String, Path, description = "The secret's name.")),
    responses(
        (status = 204, description = "Deleted; connectors that reference it report \
            `secret_missing` from their next turn."),
        (status = 400, description = "Not a secret name (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "The team has no secret of that name (`not_found`).",
            body = ErrorBody),
    ),
)]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    checked_name(&name)?;
    let by = principal.actor(address);
    match bounded(state.store.delete_team_secret(principal.team, &name, &by)).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("secret")),
        Err(e) => Err(e.into()),
    }
}
