//! `POST /v1/turns/{id}/stop`, `POST /v1/chats/{id}/stop` (SPEC T8): stop a running turn
//! from any client on any replica, exactly as a hang-up stops it (`crate::turn::stop`).
//!
//! Either key scope may stop a turn (a `chat` key runs turns); a user token without the
//! admin claim only its own chats' turns: another user's is `404`, like another team's.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use protocol::ErrorBody;

use super::parse_id;
use crate::AppState;
use crate::auth::{AuthError, Principal};
use crate::error::ApiError;
use crate::turn::stop::{self, StopAnswer};

#[utoipa::path(
    post,
    path = "/turns/{turn_id}/stop",
    operation_id = "stop_turn",
    tag = "turns",
    params(("turn_id" = Uuid, Path, description = "The turn, as the stream's `data-turn` part names it.")),
    responses(
        (status = 202, description = "The turn was running and is being stopped \
            (`status`: `stopping`): its stream ends with `finish` (`interrupted`) and its \
            row becomes `interrupted`, with the text streamed so far kept.", body = StopAnswer),
        (status = 200, description = "The turn had already ended; nothing was done \
            (`status`: `completed`, `interrupted` or `failed`).", body = StopAnswer),
        (status = 404, description = "No such turn in the team, or one of another user's \
            chat (`not_found`).", body = ErrorBody),
        (status = 503, description = "The turn runs on another replica and Redis, which \
            carries the stop there, is unavailable, or the store is (`store_unavailable`); \
            nothing was stopped.", body = ErrorBody),
    ),
)]
pub async fn stop_turn(
    State(state): State<AppState>,
    principal: Principal,
    Path(turn_id): Path<String>,
) -> Result<(StatusCode, Json<StopAnswer>), ApiError> {
    let turn = parse_id(&turn_id, "turn")?;
    let found = stop::find(&state.store, principal.team, turn).await?;
    principal
        .check_chat(&state.store, found.chat)
        .await
        .map_err(|e| match e {
            AuthError::NotFound(_) => ApiError::NotFound("turn"),
            other => other.into(),
        })?;
    Ok(answer(stop::stop(&state, principal.team, found).await?))
}

#[utoipa::path(
    post,
    path = "/chats/{chat_id}/stop",
    operation_id = "stop_chat",
    tag = "turns",
    params(("chat_id" = Uuid, Path, description = "The chat.")),
    responses(
        (status = 202, description = "The chat's running turn is being stopped \
            (`status`: `stopping`, `turn_id` names it).", body = StopAnswer),
        (status = 200, description = "No turn of the chat was running: `{\"turn_id\": null, \
            \"status\": \"idle\"}` (or the turn ended between the lookup and the stop: its \
            terminal status).", body = StopAnswer),
        (status = 404, description = "No such chat in the team, or another user's \
            (`not_found`).", body = ErrorBody),
        (status = 503, description = "The turn runs on another replica and Redis is \
            unavailable, or the store is (`store_unavailable`); nothing was stopped.",
            body = ErrorBody),
    ),
)]
pub async fn stop_chat(
    State(state): State<AppState>,
    principal: Principal,
    Path(chat_id): Path<String>,
) -> Result<(StatusCode, Json<StopAnswer>), ApiError> {
    let chat = parse_id(&chat_id, "chat")?;
    principal.check_chat(&state.store, chat).await?;
    let answered = match stop::running_in_chat(&state.store, principal.team, chat).await? {
        Some(running) => stop::stop(&state, principal.team, running).await?,
        None => StopAnswer::idle(),
    };
    Ok(answer(answered))
}

/// `202` when a cancel went out, `200` when there was nothing to stop.
fn answer(answer: StopAnswer) -> (StatusCode, Json<StopAnswer>) {
    let status = if answer.stopping() {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    (status, Json(answer))
}
