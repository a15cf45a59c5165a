//! `GET /v1/usage`: the team's billing events summed (SPEC E1).

use axum::Json;
use axum::extract::State;
use serde::Deserialize;

use super::QueryParams;
use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::store::UsageReport;
use crate::usage::usage_query;

/// The query string, closed like a request body: an unknown parameter is refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageParams {
    from: Option<String>,
    to: Option<String>,
    group_by: Option<String>,
}

pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<UsageParams>,
) -> Result<Json<UsageReport>, ApiError> {
    // Billing covers every user of the team: a team's admins see it.
    principal.require_admin()?;
    let team = principal.team;
    let query = usage_query(
        params.from.as_deref(),
        params.to.as_deref(),
        params.group_by.as_deref(),
        chrono::Utc::now(),
    )
    .map_err(ApiError::InvalidRequest)?;
    Ok(Json(state.store.usage(team, query).await?))
}
