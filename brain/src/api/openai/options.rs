//! `GET` and `PUT /v1/agents/{id}/openai` (P13): an agent's options for this front end,
//! `{"tool_activity": "none" | "text"}`, closed and checked by their domain type
//! (`domain::openai`). Only the OpenAI front end reads them; a turn runs the same
//! whatever they say.

use axum::Json;
use axum::extract::{Path, State};
use domain::openai::OpenAiOptions;
use protocol::{AgentId, ErrorBody};
use store::{StoreError, bounded};

use crate::AppState;
use crate::api::{ClientAddr, parse_id};
use crate::error::{ApiError, JsonBody};
use engine::auth::Principal;

fn not_found(err: StoreError) -> ApiError {
    match err {
        StoreError::NotFound => ApiError::NotFound("agent"),
        other => other.into(),
    }
}

#[utoipa::path(
    get,
    path = "/agents/{agent_id}/openai",
    operation_id = "get_agent_openai",
    tag = "agents",
    params(("agent_id" = Uuid, Path, description = "The agent.")),
    responses(
        (status = 200, description = "How the agent's tool calls show to OpenAI-wire \
            clients (`tool_activity`: `none`, the default, or `text`).", body = OpenAiOptions),
        (status = 404, description = "No such agent in the team (`not_found`).",
            body = ErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
) -> Result<Json<OpenAiOptions>, ApiError> {
    let id: AgentId = parse_id(&agent_id, "agent")?;
    let options = bounded(state.store.agent_openai(principal.team, id)).await;
    Ok(Json(options.map_err(not_found)?))
}

#[utoipa::path(
    put,
    path = "/agents/{agent_id}/openai",
    operation_id = "put_agent_openai",
    tag = "agents",
    params(("agent_id" = Uuid, Path, description = "The agent.")),
    request_body = OpenAiOptions,
    responses(
        (status = 200, description = "The options as set (an `agent.updated` entry of the \
            audit log names the field).", body = OpenAiOptions),
        (status = 400, description = "An unknown field or value (`invalid_request`).",
            body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).",
            body = ErrorBody),
        (status = 404, description = "No such live agent in the team (`not_found`).",
            body = ErrorBody),
    ),
)]
pub async fn put(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(agent_id): Path<String>,
    JsonBody(options): JsonBody<OpenAiOptions>,
) -> Result<Json<OpenAiOptions>, ApiError> {
    principal.require_admin()?;
    let id: AgentId = parse_id(&agent_id, "agent")?;
    let by = principal.actor(address);
    let set = state
        .store
        .set_agent_openai(principal.team, id, &options, &by);
    Ok(Json(bounded(set).await.map_err(not_found)?))
}
