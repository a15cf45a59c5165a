//! `POST/GET /v1/issuers`, `GET/DELETE /v1/issuers/{issuer_id}`: a team's own JWT issuers,
//! for admins. A token whose `iss` is one of them is accepted for this team
//! only (`auth/issuers.rs`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use protocol::ErrorBody;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::paging::{self, KeysetKey, PageParams};
use super::{ClientAddr, JsonBody, QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::address;
use engine::auth::Principal;
use store::{IssuerRow, StoreError, bounded};

const ISSUERS_CURSOR: &str = "is1:";

/// The longest `issuer` or `audience`.
const MAX_CLAIM_CHARS: usize = 500;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"issuer": "https://id.acme.example", "audience": "acme-agents", "jwks_url": "https://id.acme.example/.well-known/jwks.json"}))]
pub struct CreateIssuer {
    /// The `iss` of the team's tokens, 1 to 500 characters: registered by one team only,
    /// and never the deployment's own issuer.
    issuer: String,
    /// The `aud` the team's tokens must carry, 1 to 500 characters.
    audience: String,
    /// The issuer's signing keys (a JWKS): `http` or `https`, no credentials, a public
    /// address unless the operator allows private networks.
    jwks_url: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct IssuerList {
    issuers: Vec<IssuerRow>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

fn claim(value: &str, name: &str) -> Result<(), ApiError> {
    let chars = value.chars().count();
    if value.trim().is_empty() || chars > MAX_CLAIM_CHARS || value.chars().any(char::is_control) {
        return Err(ApiError::InvalidRequest(format!(
            "{name} must have 1 to {MAX_CLAIM_CHARS} characters, none a control character"
        )));
    }
    Ok(())
}

#[utoipa::path(
    post,
    path = "/issuers",
    operation_id = "create_issuer",
    tag = "issuers",
    request_body = CreateIssuer,
    responses(
        (status = 201, description = "Registered: tokens of this `iss` signed by a key of \
            the JWKS are accepted for this team, and this team only (at once on this \
            replica, within 10 seconds on every other).", body = IssuerRow),
        (status = 400, description = "A bad issuer, audience or JWKS URL (private and \
            metadata addresses are refused with a message naming the rule) \
            (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 409, description = "The issuer is registered already (by any team), is \
            the deployment's own, or the team has 10 (`conflict`).", body = ErrorBody),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    JsonBody(body): JsonBody<CreateIssuer>,
) -> Result<(StatusCode, Json<IssuerRow>), ApiError> {
    principal.require_admin()?;
    claim(&body.issuer, "issuer")?;
    claim(&body.audience, "audience")?;
    let url = address::valid_url(
        &body.jwks_url,
        state.auth.issuers.allow_private(),
        "BRAIN_ISSUERS_ALLOW_PRIVATE_NETWORKS",
    )
    .map_err(|problem| ApiError::InvalidRequest(problem.replacen("url", "jwks_url", 1)))?;
    if state
        .config
        .jwt
        .as_ref()
        .is_some_and(|jwt| jwt.issuer == body.issuer)
    {
        return Err(ApiError::Conflict(
            "this is the deployment's own issuer, trusted for every team already".into(),
        ));
    }
    let by = principal.actor(address);
    let created = bounded(state.store.create_issuer(
        principal.team,
        &body.issuer,
        &body.audience,
        url.as_str(),
        &by,
    ))
    .await
    .map_err(conflict)?;
    // This replica may remember the `iss` as nobody's; others do for at most 10 s.
    state.auth.issuers.forget(&created);
    tracing::info!(team = %principal.team, issuer = %created.id, "team issuer created");
    Ok((StatusCode::CREATED, Json(created)))
}

fn conflict(err: StoreError) -> ApiError {
    match err {
        StoreError::Conflict(why) => ApiError::Conflict(why.into()),
        other => other.into(),
    }
}

#[utoipa::path(
    get,
    path = "/issuers",
    operation_id = "list_issuers",
    tag = "issuers",
    params(PageParams),
    responses(
        (status = 200, description = "A page of the team's issuers, oldest first.",
            body = IssuerList),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<IssuerList>, ApiError> {
    principal.require_admin()?;
    let limit = params.limit()?;
    let after = params.after::<KeysetKey>(ISSUERS_CURSOR)?.map(|k| k.0);
    let rows = bounded(state.store.list_issuers(principal.team, after, limit + 1)).await?;
    let (issuers, next_cursor) = paging::page(rows, limit, ISSUERS_CURSOR, |i| {
        KeysetKey::of(i.created_at, i.id)
    });
    Ok(Json(IssuerList {
        issuers,
        next_cursor,
    }))
}

#[utoipa::path(
    get,
    path = "/issuers/{issuer_id}",
    operation_id = "get_issuer",
    tag = "issuers",
    params(("issuer_id" = Uuid, Path, description = "The issuer.")),
    responses(
        (status = 200, description = "The issuer.", body = IssuerRow),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such issuer in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path(issuer_id): Path<String>,
) -> Result<Json<IssuerRow>, ApiError> {
    principal.require_admin()?;
    let id: Uuid = parse_id(&issuer_id, "issuer")?;
    match bounded(state.store.issuer(principal.team, id)).await {
        Ok(row) => Ok(Json(row)),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("issuer")),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(
    delete,
    path = "/issuers/{issuer_id}",
    operation_id = "delete_issuer",
    tag = "issuers",
    params(("issuer_id" = Uuid, Path, description = "The issuer.")),
    responses(
        (status = 204, description = "Deleted: its tokens are refused at once on this replica \
            and within 10 seconds on every other."),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such issuer in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(issuer_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let id: Uuid = parse_id(&issuer_id, "issuer")?;
    let by = principal.actor(address);
    match bounded(state.store.delete_issuer(principal.team, id, &by)).await {
        Ok(deleted) => {
            state.auth.issuers.forget(&deleted);
            Ok(StatusCode::NO_CONTENT)
        }
        Err(StoreError::NotFound) => Err(ApiError::NotFound("issuer")),
        Err(e) => Err(e.into()),
    }
}
