//! `GET /v1/chats/{id}/events`: the chat's events stream (SPEC S2), what `engine::events`
//! publishes, with `Last-Event-ID` replay; and `GET /v1/chats/{id}/stream`, the running
//! turn's own stream resumed from its start (what `useChat({ resume: true })` asks for).
//! Both are observer streams: capped per principal and per replica, and ended when the
//! principal's key is revoked or its token expires.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use protocol::ErrorBody;
use serde::Deserialize;

use super::openapi::UiStreamEvent;
use super::{QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use crate::respond;
use engine::auth::Principal;
use engine::events::EventId;
use engine::events::follow;

/// Where to resume, for clients that cannot set the `Last-Event-ID` header.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsParams {
    /// The `id:` of the last event received, like the `Last-Event-ID` header (which wins
    /// when both are given).
    #[serde(default)]
    last_event_id: Option<String>,
}

#[utoipa::path(
    get,
    path = "/chats/{chat_id}/events",
    operation_id = "chat_events",
    tag = "chats",
    params(
        ("chat_id" = Uuid, Path, description = "The chat."),
        ("Last-Event-ID" = Option<String>, Header, description = "The `id:` of the last \
            event received: the events after it in the window are replayed first."),
        EventsParams,
    ),
    responses(
        (status = 200, description = "Every chunk of every turn of the chat as the AI SDK UI \
            message stream, live: one `id: <stream id>` / `data: <UiChunk>` event per chunk, \
            a `data-turn` part (without an id) before the first chunk of each turn, \
            `: keep-alive` comments when idle. With `Last-Event-ID` the events after it come \
            first, or a `data-resync` part when some fell out of the window. An observer \
            that falls behind gets a `data-notice` (`observer_too_slow`) and the stream \
            ends; a Redis failure ends it with an `events_unavailable` error part; the \
            revocation of its key or the expiry of its token with an `unauthorized` one.",
            content_type = "text/event-stream", body = UiStreamEvent,
            headers(("x-vercel-ai-ui-message-stream" = String, description = "`v1`"))),
        (status = 400, description = "`Last-Event-ID` is not a stream id \
            (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such chat in the team, or a user token's chat of \
            another user (`not_found`).", body = ErrorBody),
        (status = 429, description = "The principal, or this replica, has as many observer \
            streams open as allowed (`too_many_observers`, with `Retry-After`).",
            body = ErrorBody),
        (status = 503, description = "The events stream (Redis) cannot be read \
            (`events_unavailable`, with `Retry-After`), or the store is unavailable \
            (`store_unavailable`).", body = ErrorBody),
    ),
)]
pub async fn events(
    State(state): State<AppState>,
    principal: Principal,
    Path(chat_id): Path<String>,
    headers: HeaderMap,
    QueryParams(params): QueryParams<EventsParams>,
) -> Result<Response, ApiError> {
    let chat = parse_id(&chat_id, "chat")?;
    let header = headers
        .get("last-event-id")
        .map(|v| v.to_str().map(str::to_owned))
        .transpose()
        .map_err(|_| ApiError::InvalidRequest("Last-Event-ID is not a stream id".into()))?;
    let after = header
        .or(params.last_event_id)
        .filter(|raw| !raw.trim().is_empty())
        .map(|raw| raw.parse::<EventId>())
        .transpose()
        .map_err(|()| {
            ApiError::InvalidRequest("Last-Event-ID is not a stream id like 1700000000000-0".into())
        })?;
    let observer = follow::observe(&state, &principal, chat, after).await?;
    Ok(respond::observer(observer))
}

#[utoipa::path(
    get,
    path = "/chats/{chat_id}/stream",
    operation_id = "resume_turn_stream",
    tag = "chats",
    params(("chat_id" = Uuid, Path, description = "The chat.")),
    responses(
        (status = 200, description = "The chat's running turn as its own stream would have \
            carried it: every chunk from its `start` (replayed from the events stream), \
            then live ones until its `finish` or `error`, then `data: [DONE]`. A turn taken \
            over by another replica (D5) is one stream: its durable steps, a `data-notice` \
            `resumed`, then the rest live, the lost step's partial output dropped (a client \
            that already got it live gets a `reset-step` first). Reading it \
            does not control the turn: closing it stops nothing (`POST \
            /v1/chats/{chat_id}/stop` does). A stream whose Redis connection drops follows \
            the chat again from its last entry. It ends early with an `error` part, then \
            `[DONE]`, when the replica drains (`shutting_down`: resume on another), the \
            events stream cannot be read or lost part of the turn (`events_unavailable`), or \
            the caller's key is revoked or token expires (`unauthorized`); the transcript \
            then says how the turn ended.",
            content_type = "text/event-stream", body = UiStreamEvent,
            headers(("x-vercel-ai-ui-message-stream" = String, description = "`v1`"))),
        (status = 204, description = "No turn of the chat runs, or the start of the one \
            that runs is no longer in the events window: nothing to resume."),
        (status = 404, description = "No such chat in the team, or a user token's chat of \
            another user (`not_found`).", body = ErrorBody),
        (status = 429, description = "The principal, or this replica, has as many observer \
            streams open as allowed (`too_many_observers`, with `Retry-After`).",
            body = ErrorBody),
        (status = 503, description = "The events stream (Redis) cannot be read \
            (`events_unavailable`, with `Retry-After`), or the store is unavailable \
            (`store_unavailable`).", body = ErrorBody),
    ),
)]
pub async fn resume(
    State(state): State<AppState>,
    principal: Principal,
    Path(chat_id): Path<String>,
) -> Result<Response, ApiError> {
    let chat = parse_id(&chat_id, "chat")?;
    Ok(match follow::resume(&state, &principal, chat).await? {
        Some(followed) => respond::followed(followed),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}
