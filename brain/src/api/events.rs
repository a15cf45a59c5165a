//! `GET /v1/chats/{id}/events`: the chat's events stream (SPEC S2), what `crate::events`
//! publishes, with `Last-Event-ID` replay.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use protocol::ErrorBody;
use serde::Deserialize;

use super::openapi::UiStreamEvent;
use super::{QueryParams, parse_id};
use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::events::{EventId, EventsError, Observer};
use crate::store::StoreError;

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
            ends; a Redis failure ends it with an `events_unavailable` error part.",
            content_type = "text/event-stream", body = UiStreamEvent,
            headers(("x-vercel-ai-ui-message-stream" = String, description = "`v1`"))),
        (status = 400, description = "`Last-Event-ID` is not a stream id \
            (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such chat in the team, or a user token's chat of \
            another user (`not_found`).", body = ErrorBody),
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
) -> Result<Observer, ApiError> {
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
    principal.check_chat(&state.store, chat).await?;
    if principal.only_chats_of().is_none() {
        // A user's chat was found by the check; any other caller's must exist in its team.
        match state.store.chat_created_by(principal.team, chat).await {
            Ok(_) => {}
            Err(StoreError::NotFound) => return Err(ApiError::NotFound("chat")),
            Err(e) => return Err(e.into()),
        }
    }
    state
        .events
        .observe(chat, after, state.draining.clone())
        .await
        .map_err(|EventsError::Unavailable(class)| {
            tracing::warn!(%chat, class, "events stream unavailable");
            ApiError::EventsUnavailable
        })
}
