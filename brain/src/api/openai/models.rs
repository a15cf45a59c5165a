//! `GET /openai/v1/models`: the caller's team's agents as OpenAI models (P7); and which
//! agent a request's `model` names: its id, or its name where no other agent of the team
//! has it.

use axum::Json;
use axum::extract::State;
use serde::Serialize;

use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use protocol::AgentId;

use store::{AgentRow, StoreError, bounded};

/// The most agents listed, and searched for a name: one page, as OpenAI's list has none.
pub(super) const MAX_MODELS: i64 = 500;

/// OpenAI's model list.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = OpenAiModelList)]
pub struct ModelList {
    /// Always `list`.
    object: &'static str,
    data: Vec<Model>,
}

/// One agent as a model.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = OpenAiModel)]
pub struct Model {
    /// The agent's id: what `model` names in a request.
    id: AgentId,
    /// Always `model`.
    object: &'static str,
    /// When the agent was created, in Unix seconds.
    created: i64,
    /// The team's id.
    owned_by: String,
    /// The agent's name, which clients such as Open WebUI show; also accepted as
    /// `model` where no other agent of the team has it.
    name: String,
}

#[utoipa::path(
    get,
    path = "/openai/v1/models",
    operation_id = "openai_list_models",
    tag = "openai",
    responses(
        (status = 200, description = "The team's agents (not archived, newest first, at \
            most 500) as OpenAI models: `id` the agent's id, `owned_by` the team's id, \
            `name` the agent's name.", body = ModelList),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
) -> Result<Json<ModelList>, ApiError> {
    let agents = bounded(state.store.agents(principal.team, None, MAX_MODELS)).await?;
    let data = agents
        .into_iter()
        .map(|a| Model {
            id: a.id,
            object: "model",
            created: a.created_at.timestamp(),
            owned_by: principal.team.to_string(),
            name: a.name,
        })
        .collect();
    Ok(Json(ModelList {
        object: "list",
        data,
    }))
}

/// The live agent of the principal's team that `model` names: its id, or a name no
/// other agent of the team has. Anything else, another team's agent included, is
/// `404 not_found`.
pub(super) async fn agent_for(
    state: &AppState,
    principal: &Principal,
    model: &str,
) -> Result<AgentRow, ApiError> {
    let not_found = || ApiError::NotFound("model");
    if let Ok(id) = model.parse::<AgentId>() {
        return match bounded(state.store.agent(principal.team, id)).await {
            Ok(agent) if !agent.archived => Ok(agent),
            Ok(_) | Err(StoreError::NotFound) => Err(not_found()),
            Err(e) => Err(e.into()),
        };
    }
    let agents = bounded(state.store.agents(principal.team, None, MAX_MODELS)).await?;
    let mut named = agents.into_iter().filter(|a| a.name == model);
    match (named.next(), named.next()) {
        (Some(agent), None) => Ok(agent),
        (Some(_), Some(_)) => Err(ApiError::InvalidRequest(
            "more than one agent of the team has this name: name it by its id".into(),
        )),
        (None, _) => Err(not_found()),
    }
}
