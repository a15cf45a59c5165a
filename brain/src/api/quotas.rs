//! `GET /v1/quotas`, `PUT /v1/quotas` (SPEC E2).

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{ClientAddr, JsonBody};
use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::quota::{Limits, Periods, QuotaUpdate, UpdateError, Used};
use protocol::{ErrorBody, TeamId};

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct QuotaView {
    /// `null` is unlimited.
    limits: Limits,
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

async fn view(state: &AppState, team: TeamId, limits: Limits) -> Result<QuotaView, ApiError> {
    let periods = Periods::now();
    let used = state.quotas.used(team, &periods).await?;
    Ok(QuotaView {
        limits,
        used,
        resets: Resets {
            tokens_per_day: periods.day_end,
            tokens_per_month: periods.month_end,
            // A sliding window: the last minute's turns have all left it a minute from now.
            turns_per_minute: (used.turns_per_minute > 0)
                .then(|| periods.now + chrono::Duration::seconds(60)),
            concurrent_turns: None,
            concurrent_sessions: None,
            worker_seconds_per_day: periods.day_end,
        },
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
    let limits = state.quotas.limits(team).await?;
    Ok(Json(view(&state, team, limits).await?))
}

/// Merges the given fields into the team's overrides; answers the new view. Every replica
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
        (status = 400, description = "An unknown field, or a value that is not a count up to \
            2^50 or `null` (`invalid_request`).", body = ErrorBody),
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
    let limits = state
        .quotas
        .update(team, update, &principal.actor(address))
        .await
        .map_err(|e| match e {
            UpdateError::Invalid(problem) => ApiError::InvalidRequest(problem),
            UpdateError::Store(e) => e.into(),
        })?;
    if let Err(class) = state.holds.forget_limits(team).await {
        tracing::warn!(team = %team, class, "quota limits not forgotten in Redis; they lapse within a minute");
    }
    Ok(Json(view(&state, team, limits).await?))
}
