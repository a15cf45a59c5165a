//! `GET /v1/chats/{id}/events`: the chat's events stream (SPEC S2), what `engine::events`
//! publishes, with `Last-Event-ID` replay; and `GET /v1/chats/{id}/stream`, the running
//! turn's own stream resumed from its start (what `useChat({ resume: true })` asks for).
//! Both are observer streams: capped per principal and per replica, and ended when the
//! principal's key is revoked or its token expires.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use protocol::ErrorBody;
use serde::Deserialize;

use super::openapi::UiStreamEvent;
use super::{QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use crate::respond;
use engine::auth::Principal;
use engine::events::{EventId, EventsError, Resumed, TurnStream, Viewer};
use engine::sse;
use protocol::{ChatId, TeamId};
use store::{Store, StoreError, TurnState, TurnStatus};

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
    visible(&state, &principal, chat).await?;
    state
        .events
        .observe(
            chat,
            after,
            state.draining.clone(),
            viewer(&state, &principal),
        )
        .await
        .map(respond::observer)
        .map_err(|e| unavailable(chat, e))
}

fn viewer(state: &AppState, principal: &Principal) -> Viewer {
    Viewer {
        identity: principal.identity(),
        authority: state.auth.standing(principal),
    }
}

/// A chat the principal may observe: a user's own (the check finds it), any chat of the
/// caller's team otherwise.
async fn visible(state: &AppState, principal: &Principal, chat: ChatId) -> Result<(), ApiError> {
    principal.check_chat(&state.store, chat).await?;
    if principal.only_chats_of().is_none() {
        match state.store.chat_created_by(principal.team, chat).await {
            Ok(_) => {}
            Err(StoreError::NotFound) => return Err(ApiError::NotFound("chat")),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn unavailable(chat: ChatId, err: EventsError) -> ApiError {
    match err {
        EventsError::Unavailable(class) => {
            tracing::warn!(%chat, class, "events stream unavailable");
            ApiError::EventsUnavailable
        }
        EventsError::TooManyObservers => ApiError::TooManyObservers,
    }
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
    visible(&state, &principal, chat).await?;
    let running = match store::bounded(state.store.running_turn_of_chat(principal.team, chat)).await
    {
        Ok(running) => running,
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("chat")),
        Err(e) => return Err(e.into()),
    };
    let Some(turn) = running else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    Ok(follow(&state, &principal, &turn, EarlyEnd::ErrorPart)
        .await?
        .unwrap_or_else(|| StatusCode::NO_CONTENT.into_response()))
}

/// How a followed turn's stream that cannot go on ends.
pub(super) enum EarlyEnd {
    /// With an `error` part and `[DONE]`: the AI SDK's stream.
    ErrorPart,
    /// Without: for a translation that would take the part for the turn's failure.
    Quiet,
}

/// The stream of `turn`, a running turn of a chat the principal may see, from its `start`
/// (rebuilt after a takeover, D5) and then live; `None` when its beginning is no longer in
/// the events window. Also what a retried message id of a running turn attaches to.
pub(super) async fn follow(
    state: &AppState,
    principal: &Principal,
    turn: &TurnState,
    early_end: EarlyEnd,
) -> Result<Option<Response>, ApiError> {
    let started = u64::try_from(turn.started_at.timestamp_millis()).unwrap_or_default();
    let stream = state
        .events
        .follow_turn(
            turn.chat,
            turn.id,
            started,
            state.draining.clone(),
            viewer(state, principal),
        )
        .await
        .map_err(|e| unavailable(turn.chat, e))?;
    Ok(stream.map(|stream| {
        let stream = match early_end {
            EarlyEnd::ErrorPart => stream,
            EarlyEnd::Quiet => stream.quiet(),
        };
        let watched = Watched {
            stream,
            store: state.store.clone(),
            team: principal.team,
            turn: turn.id,
        };
        respond::ui_message_stream(Body::from_stream(watched.into_stream()))
    }))
}

/// A resumed turn stream that also asks the store, whenever the stream is idle, whether the
/// turn still runs: one whose last chunk never reached the events stream (its replica died,
/// the publisher dropped it) ends here instead of being followed forever.
struct Watched {
    stream: TurnStream,
    store: Store,
    team: TeamId,
    turn: protocol::TurnId,
}

impl Watched {
    fn into_stream(self) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send {
        futures_util::stream::unfold(self, |mut watched| async move {
            let bytes = match watched.stream.next().await? {
                Resumed::Bytes(bytes) => bytes,
                Resumed::Idle => {
                    let state =
                        store::bounded(watched.store.turn_state(watched.team, watched.turn)).await;
                    let gone = match state {
                        Ok(turn) => turn.status != TurnStatus::Running,
                        Err(StoreError::NotFound) => true,
                        // Unknown (the store did not answer): still followed.
                        Err(_) => false,
                    };
                    if !gone {
                        sse::keep_alive()
                    } else {
                        match watched.stream.end_unseen()? {
                            Resumed::Bytes(bytes) => bytes,
                            Resumed::Idle => return None,
                        }
                    }
                }
            };
            Some((Ok(bytes), watched))
        })
    }
}
