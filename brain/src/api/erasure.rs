//! `DELETE /v1/chats/{id}` and `DELETE /v1/agents/{id}` (L2): erasure that takes
//! everything of the chat or the agent, wherever it lives (`engine::erasure`), before it
//! answers `204`. A team is erased by the operator (`api/teams.rs`), in the background.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use protocol::ErrorBody;

use super::{ClientAddr, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use engine::erasure;
use engine::quota::check_user_id;

#[utoipa::path(
    delete,
    path = "/chats/{chat_id}",
    operation_id = "erase_chat",
    tag = "chats",
    params(("chat_id" = Uuid, Path, description = "The chat.")),
    responses(
        (status = 204, description = "Erased: its running turn stopped, its messages, \
            turns, approvals, artifacts (and their bytes), workspace snapshots, events \
            stream and worker sessions are gone (the worker is stopped by the \
            runtime-manager's next pass). Usage records stay, with ids only."),
        (status = 403, description = "Neither an admin nor the user who opened the chat \
            (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such chat in the team, or one this principal may \
            not see (`not_found`).", body = ErrorBody),
        (status = 503, description = "A store is unavailable (`store_unavailable`), or a \
            stop could not be delivered: part of the chat may be erased; repeating the \
            request finishes it.", body = ErrorBody),
    ),
)]
pub async fn erase_chat(
    State(state): State<AppState>,
    principal: Principal,
    Path(chat_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let chat = parse_id(&chat_id, "chat")?;
    principal.check_chat_eraser(&state.store, chat).await?;
    erasure::erase_chat(&state, principal.team, chat).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    delete,
    path = "/agents/{agent_id}",
    operation_id = "erase_agent",
    tag = "agents",
    params(("agent_id" = Uuid, Path, description = "The agent.")),
    responses(
        (status = 204, description = "Erased: each of its chats as `DELETE \
            /v1/chats/{id}` erases one, then its memories, secrets, schedule, the \
            connectors bound to it and their grants. Usage records stay, with ids only."),
        (status = 403, description = "The caller is not an admin (`forbidden`).",
            body = ErrorBody),
        (status = 404, description = "No such agent in the team (`not_found`).",
            body = ErrorBody),
        (status = 503, description = "A store is unavailable (`store_unavailable`), or a \
            stop could not be delivered: some of its chats may be erased; repeating the \
            request finishes it.", body = ErrorBody),
    ),
)]
pub async fn erase_agent(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(agent_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let agent = parse_id(&agent_id, "agent")?;
    let by = principal.actor(address);
    erasure::erase_agent(&state, principal.team, agent, &by).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    delete,
    path = "/users/{user_id}",
    operation_id = "erase_user",
    tag = "users",
    params(("user_id" = String, Path, description = "The end user: a JWT's subject, 1 to 255 \
        bytes.")),
    responses(
        (status = 204, description = "Erased: every chat the user opened as `DELETE \
            /v1/chats/{id}` erases one (uploads, artifacts and workspace snapshots with it), \
            then the user's memories and own connector grants. Usage records and quota \
            overrides stay. Erasing a user with nothing stored also answers `204`."),
        (status = 400, description = "A bad user id (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).",
            body = ErrorBody),
        (status = 503, description = "A store is unavailable (`store_unavailable`), or a \
            stop could not be delivered: some of it may be erased; repeating the request \
            finishes it.", body = ErrorBody),
    ),
)]
pub async fn erase_user(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(user): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    check_user_id(&user).map_err(ApiError::InvalidRequest)?;
    let by = principal.actor(address);
    erasure::erase_user(&state, principal.team, &user, &by).await?;
    Ok(StatusCode::NO_CONTENT)
}
