//! `GET /v1/team/settings`, `PUT /v1/team/settings`: the team's own settings: its
//! retention (L6), kept by `engine::retention`, and the default auxiliary routes of its
//! agents (T17).

use axum::Json;
use axum::extract::State;
use protocol::ErrorBody;
use serde::{Deserialize, Serialize};

use super::JsonBody;
use crate::AppState;
use crate::error::ApiError;
use engine::agents::{AuxiliaryModels, validate_auxiliary};
use engine::auth::Principal;
use engine::models::connections;
use store::bounded;

/// The longest retention, in days (100 years).
const MAX_RETENTION_DAYS: i32 = 36_500;

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(example = json!({"retention_days": 90, "auxiliary_models": {"title": "openai/gpt-4o-mini", "summary": null, "vision": null}}))]
pub struct TeamSettings {
    /// Transcripts (turns that ended, with their messages and approvals), artifacts and
    /// workspace snapshots older than this many days are deleted; `null` keeps them.
    retention_days: Option<i32>,
    /// The routes of titles, summaries and image descriptions for the team's agents that
    /// name none of their own (T17); where neither does, an agent's own `model` serves.
    auxiliary_models: AuxiliaryModels,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"retention_days": 90}))]
pub struct PutTeamSettings {
    /// 1 to 36,500 days, or `null` to keep everything.
    #[schema(minimum = 1, maximum = 36_500)]
    retention_days: Option<i64>,
    /// Replaces the default auxiliary routes (each checked like an agent's `model`); absent
    /// leaves them as they are, `{}` clears them.
    #[serde(default)]
    auxiliary_models: Option<AuxiliaryModels>,
}

#[utoipa::path(
    get,
    path = "/team/settings",
    operation_id = "get_team_settings",
    tag = "team",
    responses((status = 200, description = "The team's settings.", body = TeamSettings)),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
) -> Result<Json<TeamSettings>, ApiError> {
    let retention_days = bounded(state.store.retention_days(principal.team)).await?;
    let auxiliary_models = bounded(state.store.team_auxiliary_models(principal.team)).await?;
    Ok(Json(TeamSettings {
        retention_days,
        auxiliary_models,
    }))
}

#[utoipa::path(
    put,
    path = "/team/settings",
    operation_id = "put_team_settings",
    tag = "team",
    request_body = PutTeamSettings,
    responses(
        (status = 200, description = "The team's settings as changed. A shorter retention \
            deletes what is past it at the next sweep (`BRAIN_RETENTION_SWEEP_INTERVAL_MS`).",
            body = TeamSettings),
        (status = 400, description = "An unknown field, a retention that is not 1 to \
            36,500 days or `null`, or an auxiliary route that is not a route \
            (`invalid_request`); an auxiliary route naming a connection the team does not \
            have (`unknown_connection`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
    ),
)]
pub async fn put(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody<PutTeamSettings>,
) -> Result<Json<TeamSettings>, ApiError> {
    principal.require_admin()?;
    let retention_days = body
        .retention_days
        .map(|days| {
            i32::try_from(days)
                .ok()
                .filter(|d| (1..=MAX_RETENTION_DAYS).contains(d))
                .ok_or_else(|| {
                    ApiError::InvalidRequest(format!(
                        "retention_days must be 1 to {MAX_RETENTION_DAYS}, or null"
                    ))
                })
        })
        .transpose()?;
    if let Some(models) = &body.auxiliary_models {
        validate_auxiliary(models).map_err(ApiError::InvalidRequest)?;
        // T14: the team's own connections or the deployment's, as for an agent's routes.
        let routes: Vec<&str> = models.routes().collect();
        let team = principal.team;
        bounded(async { Ok(connections::check_routes(&state.store, team, &routes).await) })
            .await??;
    }
    bounded(
        state
            .store
            .set_retention_days(principal.team, retention_days),
    )
    .await?;
    let auxiliary_models = match body.auxiliary_models {
        Some(models) => {
            bounded(
                state
                    .store
                    .set_team_auxiliary_models(principal.team, &models),
            )
            .await?;
            models
        }
        None => bounded(state.store.team_auxiliary_models(principal.team)).await?,
    };
    tracing::info!(team = %principal.team, "team settings changed");
    Ok(Json(TeamSettings {
        retention_days,
        auxiliary_models,
    }))
}
