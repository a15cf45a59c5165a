//! `GET /v1/turns/{id}`, `GET /v1/chats/{id}/turns` (D1): where a turn is, however it was
//! started; `POST /v1/turns/{id}/stop`, `POST /v1/chats/{id}/stop` (SPEC T8): stop a
//! running turn from any client on any replica, exactly as a hang-up stops it
//! (`engine::turn::stop`), or withdraw a queued one (T13).
//!
//! Either key scope may read or stop a turn (a `chat` key runs turns, of its chat only); a
//! user token without the admin claim only its own chats' turns: another user's is `404`,
//! like another team's.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use protocol::{ChatId, ErrorBody, TurnId};
use serde::Serialize;

use super::paging::{self, PageParams};
use super::{QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::{AuthError, Principal};
use engine::turn::stop::{self, StopAnswer};
use store::{StoreError, TurnRow, bounded};

#[utoipa::path(
    get,
    path = "/turns/{turn_id}",
    operation_id = "get_turn",
    tag = "turns",
    params(("turn_id" = Uuid, Path, description = "The turn, as the stream's `data-turn` \
        part or a background POST's `202` names it.")),
    responses(
        (status = 200, description = "The turn: `status` is `queued` (T13: waiting for \
            its busy agent, `position` 1 = next), `running`, `completed`, \
            `awaiting_approval` (it ended with calls waiting for a person; answering them \
            starts its continuation, a turn with `trigger` `approval`), `interrupted` or \
            `failed` (with `error`, a stable error code; a queued turn refused by a quota at \
            its start has the quota's), or `withdrawn` (stopped while queued: it never \
            ran).", body = TurnRow),
        (status = 404, description = "No such turn in the team, or one of a chat the caller \
            may not see (`not_found`).", body = ErrorBody),
        (status = 503, description = "The store is unavailable (`store_unavailable`).",
            body = ErrorBody),
    ),
)]
pub async fn get_turn(
    State(state): State<AppState>,
    principal: Principal,
    Path(turn_id): Path<String>,
) -> Result<Json<TurnRow>, ApiError> {
    let turn = parse_id(&turn_id, "turn")?;
    let row = match bounded(state.store.turn_row(principal.team, turn)).await {
        Ok(row) => row,
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("turn")),
        Err(e) => return Err(e.into()),
    };
    visible_turn(&state, &principal, row.chat_id).await?;
    Ok(Json(row))
}

/// A turn's chat the principal may see; any other is `404 turn`.
async fn visible_turn(
    state: &AppState,
    principal: &Principal,
    chat: ChatId,
) -> Result<(), ApiError> {
    principal
        .check_chat(&state.store, chat)
        .await
        .map_err(|e| match e {
            AuthError::NotFound(_) => ApiError::NotFound("turn"),
            other => other.into(),
        })
}

/// A page of a chat's turns. Without `next_cursor` it reaches the chat's first turn.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Turns {
    /// Newest first.
    turns: Vec<TurnRow>,
    /// `cursor` for the page of older turns; absent on the oldest page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// The turn listing's cursors name the last turn of a page.
const TURNS_CURSOR: &str = "t1:";

#[utoipa::path(
    get,
    path = "/chats/{chat_id}/turns",
    operation_id = "list_turns",
    tag = "turns",
    params(("chat_id" = Uuid, Path, description = "The chat."), PageParams),
    responses(
        (status = 200, description = "The chat's turns, newest first, `limit` at most, older \
            than `cursor`'s page when given; `next_cursor` pages to older ones.", body = Turns),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor \
            (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such chat in the team, or one the caller may not \
            see (`not_found`).", body = ErrorBody),
        (status = 503, description = "The store is unavailable (`store_unavailable`).",
            body = ErrorBody),
    ),
)]
pub async fn list_turns(
    State(state): State<AppState>,
    principal: Principal,
    Path(chat_id): Path<String>,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<Turns>, ApiError> {
    let chat = parse_id(&chat_id, "chat")?;
    let limit = params.limit()?;
    let before: Option<TurnId> = params.after(TURNS_CURSOR)?;
    principal.check_chat(&state.store, chat).await?;
    match bounded(state.store.turn_page(principal.team, chat, before, limit)).await {
        Ok((turns, more)) => {
            let next_cursor = more
                .then(|| turns.last().map(|t| paging::cursor_of(TURNS_CURSOR, t.id)))
                .flatten();
            Ok(Json(Turns { turns, next_cursor }))
        }
        Err(StoreError::NotFound) => Err(ApiError::NotFound("chat")),
        Err(e) => Err(e.into()),
    }
}

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
        (status = 200, description = "The turn was queued (T13) and is now withdrawn \
            (`status`: `withdrawn`): it never reaches the model, its user message stays in \
            the transcript with `status` `withdrawn`. Or the turn had already ended; nothing \
            was done (`status`: `completed`, `interrupted`, `failed` or `withdrawn`).",
            body = StopAnswer),
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
    Ok(answer(stop::stop_turn(&state, &principal, turn).await?))
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
    Ok(answer(stop::stop_chat(&state, &principal, chat).await?))
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
