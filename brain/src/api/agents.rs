//! `POST|GET /v1/agents`, `GET /v1/agents/{id}`, `GET /v1/agents/{id}/sessions`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use protocol::ErrorBody;
use serde::Deserialize;

use super::{JsonBody, QueryParams, parse_id};
use crate::AppState;
use crate::agents::validate_new_agent;
use crate::approvals::ApprovalPolicy;
use crate::auth::Principal;
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
    /// Which calls ask a person first and which tools never run; by default nothing asks.
    #[serde(default)]
    approval_policy: ApprovalPolicy,
}

impl CreateAgent {
    fn validate(self) -> Result<NewAgent, ApiError> {
        self.approval_policy
            .validate()
            .map_err(ApiError::InvalidRequest)?;
        let approval_policy = self.approval_policy;
        validate_new_agent(
            self.name,
            self.system_prompt,
            self.model,
            self.fallback_models,
            self.runtime_profile,
            self.concierge,
        )
        .map(|agent| NewAgent {
            approval_policy,
            ..agent
        })
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
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).", body = ErrorBody),
    ),
)]
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

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Sessions {
    sessions: Vec<SessionRow>,
}

/// `GET /v1/agents/{id}/sessions`: the agent's worker sessions, newest first, with
/// state and failure reason (SPEC W6); for a user token without the admin claim, those
/// of the user's chats only.
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
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// How many, newest first: 1 to 200, 50 when absent.
    #[serde(default)]
    #[param(minimum = 1, maximum = 200)]
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

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Agents {
    agents: Vec<AgentRow>,
}

/// `GET /v1/agents`: the team's agents that are not archived, newest first.
#[utoipa::path(
    get,
    path = "/agents",
    operation_id = "list_agents",
    tag = "agents",
    params(ListParams),
    responses(
        (status = 200, description = "The team's agents, newest first.", body = Agents),
        (status = 400, description = "`limit` is out of range (`invalid_request`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<ListParams>,
) -> Result<Json<Agents>, ApiError> {
    let agents = state.store.agents(principal.team, params.limit()?).await?;
    Ok(Json(Agents { agents }))
}
