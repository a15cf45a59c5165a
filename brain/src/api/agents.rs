//! `POST|GET /v1/agents`, `GET /v1/agents/{id}`, `GET /v1/agents/{id}/sessions`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::{JsonBody, QueryParams, parse_id};
use crate::AppState;
use crate::agents::validate_new_agent;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::store::{AgentRow, NewAgent, SessionRow, StoreError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
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

pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody<CreateAgent>,
) -> Result<(StatusCode, Json<AgentRow>), ApiError> {
    principal.require_admin()?;
    let team = principal.team;
    let agent = body.validate()?;
    let row = state.store.create_agent(team, &agent).await?;
    tracing::info!(team = %team, agent = %row.id, "agent created");
    Ok((StatusCode::CREATED, Json(row)))
}

pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
) -> Result<Json<AgentRow>, ApiError> {
    let id = parse_id(&agent_id, "agent")?;
    match state.store.agent(principal.team, id).await {
        Ok(row) => Ok(Json(row)),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

#[derive(serde::Serialize)]
pub struct Sessions {
    sessions: Vec<SessionRow>,
}

/// `GET /v1/agents/{id}/sessions`: the agent's worker sessions, newest first, with
/// state and failure reason (SPEC W6); for a user token without the admin claim, those
/// of the user's chats only.
pub async fn sessions(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
) -> Result<Json<Sessions>, ApiError> {
    let id = parse_id(&agent_id, "agent")?;
    match state
        .store
        .agent_sessions(principal.team, id, principal.only_chats_of())
        .await
    {
        Ok(sessions) => Ok(Json(Sessions { sessions })),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

/// `?limit=` of the listings: at most [`MAX_LIST`], [`DEFAULT_LIST`] when absent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    #[serde(default)]
    limit: Option<u32>,
}

pub const DEFAULT_LIST: u32 = 50;
pub const MAX_LIST: u32 = 200;

impl ListParams {
    pub fn limit(&self) -> Result<i64, ApiError> {
        match self.limit {
            None => Ok(i64::from(DEFAULT_LIST)),
            Some(n) if (1..=MAX_LIST).contains(&n) => Ok(i64::from(n)),
            Some(_) => Err(ApiError::InvalidRequest(format!(
                "limit must be between 1 and {MAX_LIST}"
            ))),
        }
    }
}

#[derive(serde::Serialize)]
pub struct Agents {
    agents: Vec<AgentRow>,
}

/// `GET /v1/agents`: the team's agents that are not archived, newest first.
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<ListParams>,
) -> Result<Json<Agents>, ApiError> {
    let agents = state.store.agents(principal.team, params.limit()?).await?;
    Ok(Json(Agents { agents }))
}
