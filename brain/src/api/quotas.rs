//! `GET /v1/quotas`, `PUT /v1/quotas` (SPEC E2), and one end user's limits under them:
//! `GET`, `PUT`, `DELETE /v1/quotas/users/{user_id}` (L4).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{ClientAddr, JsonBody};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use engine::quota::{Limits, RequestLimit};
use engine::quota::{
    LimitsUpdate, Periods, QuotaUpdate, TeamSettings, UpdateError, Used, UserLimits, check_user_id,
};
use protocol::{ErrorBody, TeamId};

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct QuotaView {
    /// `null` is unlimited.
    limits: Limits,
    /// What each end user (a JWT's subject) may spend under the team's limits, unless
    /// overridden for that user (`PUT /v1/quotas/users/{user_id}`); `null` is unlimited.
    /// An API key's turns count against the team's limits only.
    per_user: Limits,
    /// What each API key and each end user of the team may request, each counted apart;
    /// `null` is unlimited. Past it a request is refused `429 rate_limited`.
    requests: Option<RequestLimit>,
    /// From Postgres' billing events and rows: what the team spent in each quota's window.
    used: Used,
    /// When each period budget starts over (UTC); `null` for a concurrency limit.
    resets: Resets,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct Resets {
    tokens_per_day: DateTime<Utc>,
    tokens_per_month: DateTime<Utc>,
    turns_per_minute: Option<DateTime<Utc>>,
    concurrent_turns: Option<DateTime<Utc>>,
    concurrent_sessions: Option<DateTime<Utc>>,
    worker_seconds_per_day: DateTime<Utc>,
}

/// One end user's limits (L4).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UserQuotaView {
    user_id: String,
    /// The team's `per_user` with this user's overrides over it, field by field; `null`
    /// is unlimited. The team's own limits still apply on top.
    limits: Limits,
    /// This user's stored overrides (`{}` for none): a field present replaces the team's
    /// `per_user` one, `null` making it unlimited.
    #[schema(value_type = Object)]
    overrides: serde_json::Value,
    /// From Postgres: what this user spent in each quota's window: its turns, and the
    /// worker sessions its turns started.
    used: Used,
    resets: Resets,
}

fn resets(periods: &Periods, used: &Used) -> Resets {
    Resets {
        tokens_per_day: periods.day_end,
        tokens_per_month: periods.month_end,
        // A sliding window: the last minute's turns have all left it a minute from now.
        turns_per_minute: (used.turns_per_minute > 0)
            .then(|| periods.now + chrono::Duration::seconds(60)),
        concurrent_turns: None,
        concurrent_sessions: None,
        worker_seconds_per_day: periods.day_end,
    }
}

async fn view(
    state: &AppState,
    team: TeamId,
    settings: TeamSettings,
) -> Result<QuotaView, ApiError> {
    let periods = state.quotas.periods();
    let used = state.quotas.used(team, &periods).await?;
    Ok(QuotaView {
        limits: settings.limits,
        per_user: settings.per_user,
        requests: settings.requests,
        used,
        resets: resets(&periods, &used),
    })
}

async fn user_view(
    state: &AppState,
    team: TeamId,
    user: String,
    limits: UserLimits,
) -> Result<UserQuotaView, ApiError> {
    let periods = state.quotas.periods();
    let used = state.quotas.used_by_user(team, &user, &periods).await?;
    Ok(UserQuotaView {
        user_id: user,
        limits: limits.limits,
        overrides: limits.overrides,
        used,
        resets: resets(&periods, &used),
    })
}

#[utoipa::path(
    get,
    path = "/quotas",
    operation_id = "get_quotas",
    tag = "quotas",
    responses((status = 200, description = "The team's limits, what it used, and when each \
        period starts over.", body = QuotaView)),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
) -> Result<Json<QuotaView>, ApiError> {
    let team = principal.team;
    let settings = state.quotas.settings(team).await?;
    Ok(Json(view(&state, team, settings).await?))
}

/// Merges the given fields into the team's overrides (and `per_user`'s into the per-user
/// limits); answers the new view. Every replica
/// enforces the new limits from its next turn on (the limits Redis holds are forgotten
/// here; if Redis cannot be reached they lapse within a minute).
#[utoipa::path(
    put,
    path = "/quotas",
    operation_id = "put_quotas",
    tag = "quotas",
    request_body = QuotaUpdate,
    responses(
        (status = 200, description = "The team's limits after the update.", body = QuotaView),
        (status = 400, description = "An unknown field (in `per_user` too), or a value that is \
            not a count up to 2^50 or `null` (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).", body = ErrorBody),
    ),
)]
pub async fn put(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    JsonBody(update): JsonBody<QuotaUpdate>,
) -> Result<Json<QuotaView>, ApiError> {
    principal.require_admin()?;
    let team = principal.team;
    let settings = state
        .quotas
        .update(team, update, &principal.actor(address))
        .await
        .map_err(update_error)?;
    if let Err(class) = state.holds.forget_limits(team).await {
        tracing::warn!(team = %team, class, "quota limits not forgotten in Redis; they lapse within a minute");
    }
    if let Err(unavailable) = state.rate_limits.forget(team).await {
        tracing::warn!(team = %team, class = unavailable.0, "request rate limit not forgotten in Redis; it lapses within a minute");
    }
    Ok(Json(view(&state, team, settings).await?))
}

fn update_error(e: UpdateError) -> ApiError {
    match e {
        UpdateError::Invalid(problem) => ApiError::InvalidRequest(problem),
        UpdateError::Store(e) => e.into(),
    }
}

/// A user id from the path, or `invalid_request` saying what is wrong with it.
fn user_id(raw: String) -> Result<String, ApiError> {
    check_user_id(&raw).map_err(ApiError::InvalidRequest)?;
    Ok(raw)
}

/// Whether `principal` may read `user`'s limits: a team admin, or the user itself.
fn may_read(principal: &Principal, user: &str) -> Result<(), ApiError> {
    if principal.user.as_deref() == Some(user) {
        return Ok(());
    }
    Ok(principal.require_admin()?)
}

/// Forgets one user's limits in Redis after a change, so its next turn reloads them.
async fn forget(state: &AppState, team: TeamId, user: &str) {
    if let Err(class) = state.holds.forget_user(team, user).await {
        tracing::warn!(team = %team, class, "user quota limits not forgotten in Redis; they lapse within a minute");
    }
}

#[utoipa::path(
    get,
    path = "/quotas/users/{user_id}",
    operation_id = "get_user_quotas",
    tag = "quotas",
    params(("user_id" = String, Path, description = "The end user: a JWT's subject, 1 to 255 \
        bytes.")),
    responses(
        (status = 200, description = "The user's effective limits, its overrides, and what \
            its turns used.", body = UserQuotaView),
        (status = 400, description = "A user id that is too long or holds control characters \
            (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is neither an admin nor that user \
            (`forbidden`).", body = ErrorBody),
    ),
)]
pub async fn get_user(
    State(state): State<AppState>,
    principal: Principal,
    Path(user): Path<String>,
) -> Result<Json<UserQuotaView>, ApiError> {
    let user = user_id(user)?;
    may_read(&principal, &user)?;
    let team = principal.team;
    let limits = state.quotas.user_limits(team, &user).await?;
    Ok(Json(user_view(&state, team, user, limits).await?))
}

/// Merges the given fields into one user's overrides of the team's `per_user`; answers
/// the user's view. Its next turn, on any replica, counts against the new limits.
#[utoipa::path(
    put,
    path = "/quotas/users/{user_id}",
    operation_id = "put_user_quotas",
    tag = "quotas",
    params(("user_id" = String, Path, description = "The end user: a JWT's subject, 1 to 255 \
        bytes.")),
    request_body = LimitsUpdate,
    responses(
        (status = 200, description = "The user's limits after the update.", body = UserQuotaView),
        (status = 400, description = "A bad user id, an unknown field, or a value that is not \
            a count up to 2^50 or `null` (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).", body = ErrorBody),
    ),
)]
pub async fn put_user(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(user): Path<String>,
    JsonBody(update): JsonBody<LimitsUpdate>,
) -> Result<Json<UserQuotaView>, ApiError> {
    principal.require_admin()?;
    let user = user_id(user)?;
    let team = principal.team;
    let limits = state
        .quotas
        .update_user(team, &user, update, &principal.actor(address))
        .await
        .map_err(update_error)?;
    forget(&state, team, &user).await;
    Ok(Json(user_view(&state, team, user, limits).await?))
}

/// Drops one user's overrides: the team's `per_user` applies to it again.
#[utoipa::path(
    delete,
    path = "/quotas/users/{user_id}",
    operation_id = "delete_user_quotas",
    tag = "quotas",
    params(("user_id" = String, Path, description = "The end user: a JWT's subject, 1 to 255 \
        bytes.")),
    responses(
        (status = 204, description = "Dropped; the user's next turn counts against the team's \
            `per_user`."),
        (status = 400, description = "A bad user id (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "The user has no overrides (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn delete_user(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(user): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let user = user_id(user)?;
    let team = principal.team;
    let by = principal.actor(address);
    if !state.quotas.delete_user(team, &user, &by).await? {
        return Err(ApiError::NotFound("user quota"));
    }
    forget(&state, team, &user).await;
    Ok(StatusCode::NO_CONTENT)
}
