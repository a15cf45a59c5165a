//! `POST/GET /v1/providers`, `GET/PATCH/DELETE /v1/providers/{provider_id}`,
//! `POST /v1/providers/{provider_id}/check`: a team's own model provider connections
//! (T14), for admins. The deployment's `openai` and `anthropic` are listed first, read-only.
//! A key is sealed on the way in and never comes out: only its hint does. What makes a
//! connection valid is the engine's (`models/connections.rs`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use protocol::{ErrorBody, ErrorCode};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::paging::{self, KeysetKey, PageParams};
use super::{ClientAddr, JsonBody, QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use engine::models::catalog::ModelFacts;
use engine::models::connections::{self, Requested, RouteError};
use providers::{ProviderError, Providers};
use store::{ProviderConnectionChange, ProviderConnectionRow, SecretsError, StoreError, bounded};

const PROVIDERS_CURSOR: &str = "pc1:";

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "vllm", "kind": "openai", "base_url": "https://llm.acme.example/v1", "api_key": "sk-team-key", "models": [{"model": "qwen3-32b", "context_window": 32768}]}))]
pub struct CreateProvider {
    /// `[a-z0-9][a-z0-9_-]{0,62}`, unique in the team; `openai` and `anthropic` are the
    /// deployment's. A route names it: `vllm/qwen3-32b`.
    name: String,
    /// The wire it speaks: `openai` (Chat Completions), `openai-responses` (the Responses
    /// API) or `anthropic` (Messages).
    kind: String,
    /// `http` or `https`, no credentials; for `openai` the base including `/v1`. A public
    /// address unless the operator allows private networks.
    base_url: String,
    /// Sealed under the server's secrets key, never returned; needs `BRAIN_SECRETS_KEY`.
    #[serde(default)]
    api_key: Option<String>,
    /// Declared models: catalog entries for what this connection serves.
    #[serde(default)]
    models: Vec<ModelFacts>,
}

/// `PATCH /v1/providers/{id}`: an absent field is left as it is; `"api_key": null`
/// removes the key. The kind is fixed.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"api_key": "sk-rotated-key"}))]
pub struct PatchProvider {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    base_url: Option<String>,
    #[serde(default, deserialize_with = "engine::agents::present")]
    #[schema(value_type = Option<String>)]
    api_key: Option<Option<String>>,
    #[serde(default)]
    models: Option<Vec<ModelFacts>>,
}

/// A connection as the API shows it: never its key.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Provider {
    /// `null` for the deployment's own.
    id: Option<Uuid>,
    name: String,
    kind: String,
    /// The deployment's own connections are configured by the operator and not shown.
    base_url: Option<String>,
    /// The deployment's own: every team has it, and it cannot be changed here.
    builtin: bool,
    /// The key's last four characters; `null` without a key (or for a short one).
    key_hint: Option<String>,
    models: Vec<ModelFacts>,
    /// The latest failure of a call through it (a turn's or a check's).
    last_error: Option<ProviderFailure>,
    /// The latest successful check.
    last_check: Option<ProviderCheckMark>,
    created_at: Option<DateTime<Utc>>,
    updated_at: Option<DateTime<Utc>>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ProviderFailure {
    /// `rejected`, `rate_limited`, `status`, `connect`, `timeout`, …
    class: String,
    /// What failed, without the provider's own text (`provider rejected the request
    /// with status 401`).
    description: String,
    at: DateTime<Utc>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ProviderCheckMark {
    at: DateTime<Utc>,
    latency_ms: u32,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ProviderList {
    providers: Vec<Provider>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// `POST /v1/providers/{id}/check?model=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CheckParams {
    /// The model to ask; the connection's first declared model when absent.
    #[serde(default)]
    model: Option<String>,
}

/// What a check found.
#[derive(Serialize, utoipa::ToSchema)]
pub struct CheckResult {
    ok: bool,
    /// From sending the call to the provider's first event, when `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    latency_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<CheckFailure>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct CheckFailure {
    /// The stable code a turn would fail with (`provider_rejected`, `provider_unavailable`,
    /// `rate_limited`).
    #[schema(value_type = String)]
    code: ErrorCode,
    /// The failure's class (`rejected`, `connect`, `timeout`, `key_unreadable`, …).
    class: String,
    /// The provider's HTTP status, when it answered one.
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
}

fn view(row: ProviderConnectionRow) -> Provider {
    Provider {
        id: Some(row.id),
        name: row.name,
        kind: row.kind,
        base_url: Some(row.base_url),
        builtin: false,
        key_hint: row.key_hint,
        models: serde_json::from_value(row.models).unwrap_or_default(),
        last_error: row.last_error.map(|e| ProviderFailure {
            class: e.class,
            description: e.description,
            at: e.at,
        }),
        last_check: row
            .last_check_at
            .zip(row.last_check_latency_ms)
            .map(|(at, latency_ms)| ProviderCheckMark { at, latency_ms }),
        created_at: Some(row.created_at),
        updated_at: Some(row.updated_at),
    }
}

fn builtin(name: &str) -> Provider {
    Provider {
        id: None,
        name: name.to_owned(),
        kind: name.to_owned(),
        base_url: None,
        builtin: true,
        key_hint: None,
        models: Vec::new(),
        last_error: None,
        last_check: None,
        created_at: None,
        updated_at: None,
    }
}

fn write_error(err: SecretsError) -> ApiError {
    match err {
        SecretsError::NotConfigured => ApiError::NotConfigured(
            "a provider connection's key is sealed under BRAIN_SECRETS_KEY, which is unset \
             on this server",
        ),
        SecretsError::Store(StoreError::Conflict("provider_name")) => {
            ApiError::Conflict("this team has a provider connection of that name".into())
        }
        SecretsError::Store(StoreError::Conflict(_)) => ApiError::Conflict(format!(
            "a team may have at most {} provider connections",
            store::MAX_PROVIDER_CONNECTIONS
        )),
        SecretsError::Store(StoreError::NotFound) => ApiError::NotFound("provider"),
        SecretsError::Store(e) => e.into(),
        SecretsError::TooMany | SecretsError::Crypto => {
            ApiError::Internal("a provider key could not be sealed".into())
        }
    }
}

#[utoipa::path(
    post,
    path = "/providers",
    operation_id = "create_provider",
    tag = "providers",
    request_body = CreateProvider,
    responses(
        (status = 201, description = "The connection: routes `<name>/<model>` call it, at \
            once on this replica and within 5 seconds on every other.", body = Provider),
        (status = 400, description = "A bad name, kind, base URL (private and metadata \
            addresses are refused with a message naming the rule), key or model \
            (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 409, description = "The name is taken in the team, or the team has 50 \
            (`conflict`).", body = ErrorBody),
        (status = 501, description = "A key was given and `BRAIN_SECRETS_KEY` is unset \
            (`not_configured`).", body = ErrorBody),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    JsonBody(body): JsonBody<CreateProvider>,
) -> Result<(StatusCode, Json<Provider>), ApiError> {
    principal.require_admin()?;
    let requested = Requested {
        name: body.name,
        kind: body.kind,
        base_url: body.base_url,
        api_key: body.api_key,
        models: body.models,
    };
    let new = connections::validate_new(requested, state.connections.allow_private_networks())
        .map_err(ApiError::InvalidRequest)?;
    let by = principal.actor(address);
    let created = bounded(async {
        Ok(state
            .store
            .create_provider_connection(principal.team, &new, &by)
            .await)
    })
    .await?
    .map_err(write_error)?;
    state.connections.forget(principal.team);
    tracing::info!(team = %principal.team, provider = %created.id, "provider connection created");
    Ok((StatusCode::CREATED, Json(view(created))))
}

#[utoipa::path(
    get,
    path = "/providers",
    operation_id = "list_providers",
    tag = "providers",
    params(PageParams),
    responses(
        (status = 200, description = "A page of the team's connections, oldest first; the \
            first page begins with the deployment's own (`builtin`).", body = ProviderList),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<ProviderList>, ApiError> {
    principal.require_admin()?;
    let limit = params.limit()?;
    let after = params.after::<KeysetKey>(PROVIDERS_CURSOR)?.map(|k| k.0);
    let rows = bounded(
        state
            .store
            .provider_connections(principal.team, after, limit + 1),
    )
    .await?;
    let (rows, next_cursor) = paging::page(rows, limit, PROVIDERS_CURSOR, |p| {
        KeysetKey::of(p.created_at, p.id)
    });
    let builtins = after
        .is_none()
        .then(|| Providers::BUILTIN.map(builtin))
        .into_iter()
        .flatten();
    Ok(Json(ProviderList {
        providers: builtins.chain(rows.into_iter().map(view)).collect(),
        next_cursor,
    }))
}

async fn read(
    state: &AppState,
    principal: &Principal,
    id: &str,
) -> Result<ProviderConnectionRow, ApiError> {
    principal.require_admin()?;
    let id: Uuid = parse_id(id, "provider")?;
    match bounded(state.store.provider_connection(principal.team, id)).await {
        Ok(row) => Ok(row),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("provider")),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(
    get,
    path = "/providers/{provider_id}",
    operation_id = "get_provider",
    tag = "providers",
    params(("provider_id" = Uuid, Path, description = "The connection.")),
    responses(
        (status = 200, description = "The connection.", body = Provider),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such connection in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path(provider_id): Path<String>,
) -> Result<Json<Provider>, ApiError> {
    Ok(Json(view(read(&state, &principal, &provider_id).await?)))
}

#[utoipa::path(
    patch,
    path = "/providers/{provider_id}",
    operation_id = "update_provider",
    tag = "providers",
    params(("provider_id" = Uuid, Path, description = "The connection.")),
    request_body = PatchProvider,
    responses(
        (status = 200, description = "The connection as changed (at once on this replica, \
            within 5 seconds on every other).", body = Provider),
        (status = 400, description = "A bad field (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such connection in the team (`not_found`).", body = ErrorBody),
        (status = 409, description = "The new name is taken in the team (`conflict`).", body = ErrorBody),
        (status = 501, description = "A key was given and `BRAIN_SECRETS_KEY` is unset \
            (`not_configured`).", body = ErrorBody),
    ),
)]
pub async fn update(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(provider_id): Path<String>,
    JsonBody(body): JsonBody<PatchProvider>,
) -> Result<Json<Provider>, ApiError> {
    principal.require_admin()?;
    let id: Uuid = parse_id(&provider_id, "provider")?;
    let change = ProviderConnectionChange {
        name: body.name,
        base_url: body.base_url,
        api_key: body.api_key,
        models: None,
    };
    let change = connections::validate_change(
        change,
        body.models.as_deref(),
        state.connections.allow_private_networks(),
    )
    .map_err(ApiError::InvalidRequest)?;
    let by = principal.actor(address);
    let updated = bounded(async {
        Ok(state
            .store
            .update_provider_connection(principal.team, id, &change, &by)
            .await)
    })
    .await?
    .map_err(write_error)?;
    state.connections.forget(principal.team);
    tracing::info!(team = %principal.team, provider = %id, "provider connection changed");
    Ok(Json(view(updated)))
}

#[utoipa::path(
    delete,
    path = "/providers/{provider_id}",
    operation_id = "delete_provider",
    tag = "providers",
    params(("provider_id" = Uuid, Path, description = "The connection.")),
    responses(
        (status = 204, description = "Deleted: its routes fail (and turns fall back to the \
            next route) at once on this replica, within 5 seconds on every other."),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such connection in the team (`not_found`).", body = ErrorBody),
        (status = 409, description = "Agents of the team still name it as their model or a \
            fallback (`provider_in_use`): change them first.", body = ErrorBody),
    ),
)]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(provider_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let id: Uuid = parse_id(&provider_id, "provider")?;
    let by = principal.actor(address);
    match bounded(
        state
            .store
            .delete_provider_connection(principal.team, id, &by),
    )
    .await
    {
        Ok(_) => {
            state.connections.forget(principal.team);
            tracing::info!(team = %principal.team, provider = %id, "provider connection deleted");
            Ok(StatusCode::NO_CONTENT)
        }
        Err(StoreError::NotFound) => Err(ApiError::NotFound("provider")),
        Err(StoreError::Conflict(_)) => Err(ApiError::ProviderInUse(
            "agents of this team name this connection as their model or a fallback; change \
             them first"
                .into(),
        )),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(
    post,
    path = "/providers/{provider_id}/check",
    operation_id = "check_provider",
    tag = "providers",
    params(("provider_id" = Uuid, Path, description = "The connection."), CheckParams),
    responses(
        (status = 200, description = "A minimal call (one output token) was made: its \
            latency, or the provider's failure as a turn would see it. Recorded on the \
            connection (`last_check`, `last_error`).", body = CheckResult),
        (status = 400, description = "No `model` given and none declared (`invalid_request`).",
            body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such connection in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn check(
    State(state): State<AppState>,
    principal: Principal,
    Path(provider_id): Path<String>,
    QueryParams(params): QueryParams<CheckParams>,
) -> Result<Json<CheckResult>, ApiError> {
    let row = read(&state, &principal, &provider_id).await?;
    let declared: Vec<ModelFacts> = serde_json::from_value(row.models).unwrap_or_default();
    let model = params
        .model
        .or_else(|| declared.into_iter().next().map(|facts| facts.model))
        .ok_or_else(|| {
            ApiError::InvalidRequest("name a model to check with: ?model=<model>".into())
        })?;
    let outcome = state
        .connections
        .check(principal.team, row.id, &model)
        .await;
    let result = match outcome {
        Ok(Ok(latency)) => CheckResult {
            ok: true,
            latency_ms: Some(u64::try_from(latency.as_millis()).unwrap_or(u64::MAX)),
            error: None,
        },
        Ok(Err(err)) => failed(&err),
        Err(RouteError::Unusable(class)) => CheckResult {
            ok: false,
            latency_ms: None,
            error: Some(CheckFailure {
                code: ErrorCode::ProviderUnavailable,
                class: class.to_owned(),
                status: None,
            }),
        },
        Err(RouteError::Store(e)) => return Err(e.into()),
        Err(RouteError::UnknownConnection | RouteError::Malformed) => {
            return Err(ApiError::NotFound("provider"));
        }
    };
    tracing::info!(team = %principal.team, provider = %row.id, ok = result.ok, "provider connection checked");
    Ok(Json(result))
}

fn failed(err: &ProviderError) -> CheckResult {
    let status = match err {
        ProviderError::Rejected { status }
        | ProviderError::Unavailable(providers::Unavailable::Status(status)) => Some(*status),
        ProviderError::RateLimited { .. } => Some(429),
        ProviderError::Unavailable(_) => None,
    };
    CheckResult {
        ok: false,
        latency_ms: None,
        error: Some(CheckFailure {
            code: err.code(),
            class: err.metric_label().to_owned(),
            status,
        }),
    }
}
