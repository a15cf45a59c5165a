//! `GET /v1/agents/{id}/memories`, `PATCH|DELETE /v1/memories/{id}` (M4): what an agent
//! remembers, where each memory came from, and fixing or removing one. Who may see and
//! change which is `engine::memories`' rule; a memory outside it is `404` like another
//! team's.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::paging::{self, KeysetKey, PageParams};
use super::{ClientAddr, JsonBody, QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use engine::memories::{changeable, readable, validate_note};
use protocol::ErrorBody;
use store::{MemoryRow, StoreError, bounded};

#[derive(Serialize, utoipa::ToSchema)]
pub struct Memories {
    memories: Vec<MemoryRow>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

const MEMORIES_CURSOR: &str = "me1:";

/// `GET /v1/agents/{id}/memories`: the agent's memories the caller may see, newest first.
#[utoipa::path(
    get,
    path = "/agents/{agent_id}/memories",
    operation_id = "list_memories",
    tag = "memories",
    params(("agent_id" = Uuid, Path, description = "The agent."), PageParams),
    responses(
        (status = 200, description = "A page of the agent's memories the caller may see, \
            newest first: an admin's, all of them; an end user's, their own; a chat key's, \
            the agent's own (`user_id` null).", body = Memories),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such agent in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<Memories>, ApiError> {
    let agent = parse_id(&agent_id, "agent")?;
    let limit = params.limit()?;
    let before = params.after::<KeysetKey>(MEMORIES_CURSOR)?.map(|k| k.0);
    let scope = readable(&principal);
    match bounded(
        state
            .store
            .memories(principal.team, agent, scope, before, limit + 1),
    )
    .await
    {
        Ok(rows) => {
            let (memories, next_cursor) = paging::page(rows, limit, MEMORIES_CURSOR, |m| {
                KeysetKey::of(m.created_at, m.id)
            });
            Ok(Json(Memories {
                memories,
                next_cursor,
            }))
        }
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"content": "Prefers answers in French."}))]
pub struct PatchMemory {
    /// 1 to 10,000 characters once trimmed.
    content: String,
}

/// `PATCH /v1/memories/{id}`: a memory's corrected content, recorded `memory.updated`.
#[utoipa::path(
    patch,
    path = "/memories/{memory_id}",
    operation_id = "update_memory",
    tag = "memories",
    params(("memory_id" = Uuid, Path, description = "The memory.")),
    request_body = PatchMemory,
    responses(
        (status = 200, description = "The memory with its new content.", body = MemoryRow),
        (status = 400, description = "An unknown field, or content empty or longer than \
            10,000 characters (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "A chat key: the agent's own memories are an admin's \
            to change (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such memory in the team, or one the caller may not \
            see (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn update(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(memory_id): Path<String>,
    JsonBody(body): JsonBody<PatchMemory>,
) -> Result<Json<MemoryRow>, ApiError> {
    let id = parse_id::<uuid::Uuid>(&memory_id, "memory")?;
    let content = validate_note(&body.content).map_err(ApiError::InvalidRequest)?;
    let scope = changeable(&principal)?;
    let by = principal.actor(address);
    match bounded(
        state
            .store
            .update_memory(principal.team, id, scope, content, &by),
    )
    .await
    {
        Ok(row) => Ok(Json(row)),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("memory")),
        Err(e) => Err(e.into()),
    }
}

/// `DELETE /v1/memories/{id}`: the memory is gone from every later recall and search,
/// recorded `memory.deleted`.
#[utoipa::path(
    delete,
    path = "/memories/{memory_id}",
    operation_id = "delete_memory",
    tag = "memories",
    params(("memory_id" = Uuid, Path, description = "The memory.")),
    responses(
        (status = 204, description = "Deleted."),
        (status = 403, description = "A chat key: the agent's own memories are an admin's \
            to delete (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such memory in the team, or one the caller may not \
            see (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(memory_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = parse_id::<uuid::Uuid>(&memory_id, "memory")?;
    let scope = changeable(&principal)?;
    let by = principal.actor(address);
    match bounded(state.store.delete_memory(principal.team, id, scope, &by)).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("memory")),
        Err(e) => Err(e.into()),
    }
}
