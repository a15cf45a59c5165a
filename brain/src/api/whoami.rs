//! `GET /v1/whoami`: who a bearer signs in as, so a client shows it (the web chat does,
//! and asks before a link's token replaces the credential a tab holds).

use axum::Json;
use axum::extract::State;
use protocol::TeamId;
use serde::Serialize;

use crate::AppState;
use crate::error::ApiError;
use engine::auth::{Principal, Scope};
use store::bounded;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WhoAmI {
    team_id: TeamId,
    /// The name the team was created with.
    team_name: String,
    /// The JWT's user claim; `null` for an API key.
    user: Option<String>,
    scope: Scope,
}

#[utoipa::path(
    get,
    path = "/whoami",
    operation_id = "whoami",
    tag = "whoami",
    responses((status = 200, description = "The team, user and scope the credentials \
        stand for.", body = WhoAmI)),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
) -> Result<Json<WhoAmI>, ApiError> {
    let team_name = bounded(state.store.team_name(principal.team))
        .await?
        .ok_or(ApiError::NotFound("team"))?;
    Ok(Json(WhoAmI {
        team_id: principal.team,
        team_name,
        user: principal.user,
        scope: principal.scope,
    }))
}
