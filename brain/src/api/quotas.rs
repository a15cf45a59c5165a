//! `GET /v1/quotas`, `PUT /v1/quotas` (SPEC E2).

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::JsonBody;
use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::quota::{Limits, Periods, QuotaUpdate, UpdateError, Used};

#[derive(Debug, Serialize)]
pub struct QuotaView {
    /// `null` is unlimited.
    limits: Limits,
    /// From Postgres' billing events and rows: what the team spent in each quota's window.
    used: Used,
    /// When each period budget starts over (UTC); `null` for a concurrency limit.
    resets: Resets,
}

#[derive(Debug, Serialize)]
struct Resets {
    tokens_per_day: DateTime<Utc>,
    tokens_per_month: DateTime<Utc>,
    turns_per_minute: Option<DateTime<Utc>>,
    concurrent_turns: Option<DateTime<Utc>>,
    concurrent_sessions: Option<DateTime<Utc>>,
    worker_seconds_per_day: DateTime<Utc>,
}

async fn view(
    state: &AppState,
    team: protocol::TeamId,
    limits: Limits,
) -> Result<QuotaView, ApiError> {
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
pub async fn put(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(update): JsonBody<QuotaUpdate>,
) -> Result<Json<QuotaView>, ApiError> {
    principal.require_admin()?;
    let team = principal.team;
    let limits = state
        .quotas
        .update(team, update)
        .await
        .map_err(|e| match e {
            UpdateError::Invalid(problem) => ApiError::InvalidRequest(problem),
            UpdateError::Store(e) => e.into(),
        })?;
    if let Err(class) = crate::hold::forget_limits(&state.holds, team).await {
        tracing::warn!(team = %team, class, "quota limits not forgotten in Redis; they lapse within a minute");
    }
    Ok(Json(view(&state, team, limits).await?))
}
