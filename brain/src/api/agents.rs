//! `POST /v1/agents`, `GET /v1/agents/{id}`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use protocol::ErrorBody;
use serde::Deserialize;

use super::{JsonBody, Team, parse_id};
use crate::AppState;
use crate::agents::validate_new_agent;
use crate::error::ApiError;
use crate::store::{AgentRow, NewAgent, SessionRow, StoreError};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "support", "system_prompt": "You are terse.", "model": "openai/gpt-4o-mini"}))]
pub struct CreateAgent {
    name: String,
    system_prompt: String,
    model: String,
    #[serde(default)]
    fallback_models: Vec<String>,
    #[serde(default)]
    runtime_profile: Option<String>,
    /// Offer this agent the agent tools (create, archive, change prompt) for its team.
    #[serde(default)]
    concierge: bool,
}

impl CreateAgent {
    fn validate(self) -> Result<NewAgent, ApiError> {
        validate_new_agent(
            self.name,
            self.system_prompt,
            self.model,
            self.fallback_models,
            self.runtime_profile,
            self.concierge,
        )
        .map_err(ApiError::InvalidRequest)
    }
}

#[utoipa::path(
    post,
    path = "/agents",
    operation_id = "create_agent",
    tag = "agents",
    request_body = CreateAgent,
    responses(
        (status = 201, description = "The agent.", body = AgentRow),
        (status = 400, description = "A field is missing, unknown or invalid (`invalid_request`).", body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).", body = ErrorBody),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    Team(team): Team,
    JsonBody(body): JsonBody<CreateAgent>,
) -> Result<(StatusCode, Json<AgentRow>), ApiError> {
    let agent = body.validate()?;
    let row = state.store.create_agent(team, &agent).await?;
    tracing::info!(team = %team, agent = %row.id, "agent created");
    Ok((StatusCode::CREATED, Json(row)))
}

#[utoipa::path(
    get,
    path = "/agents/{agent_id}",
    operation_id = "get_agent",
    tag = "agents",
    params(("agent_id" = Uuid, Path, description = "The agent.")),
    responses(
        (status = 200, description = "The agent.", body = AgentRow),
        (status = 404, description = "No such agent in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    Team(team): Team,
    Path(agent_id): Path<String>,
) -> Result<Json<AgentRow>, ApiError> {
    let id = parse_id(&agent_id, "agent")?;
    match state.store.agent(team, id).await {
        Ok(row) => Ok(Json(row)),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Sessions {
    sessions: Vec<SessionRow>,
}

/// `GET /v1/agents/{id}/sessions`: the agent's worker sessions, newest first, with
/// state and failure reason (SPEC W6).
#[utoipa::path(
    get,
    path = "/agents/{agent_id}/sessions",
    operation_id = "list_agent_sessions",
    tag = "agents",
    params(("agent_id" = Uuid, Path, description = "The agent.")),
    responses(
        (status = 200, description = "The agent's worker sessions, newest first.", body = Sessions),
        (status = 404, description = "No such agent in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn sessions(
    State(state): State<AppState>,
    Team(team): Team,
    Path(agent_id): Path<String>,
) -> Result<Json<Sessions>, ApiError> {
    let id = parse_id(&agent_id, "agent")?;
    match state.store.agent_sessions(team, id).await {
        Ok(sessions) => Ok(Json(Sessions { sessions })),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}
