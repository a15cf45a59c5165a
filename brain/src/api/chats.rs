//! `POST|GET /v1/agents/{id}/chats`, `GET|POST /v1/chats/{id}/messages`: a posted message
//! starts a turn streamed to its client, or in the background (D1), answered `202`.
//!
//! A chat records the JWT user who opened it; a user token without the admin claim sees
//! only its user's chats (`engine::auth`), every other one is `404` like another team's.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use logging::traces::TraceContext;
use protocol::ErrorBody;
use protocol::parts::{Part, ToolPart, ToolState};
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{OneOfBuilder, Schema};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use super::openapi::UiStreamEvent;
use super::paging::{KeysetKey, PageParams};
use super::{JsonBody, QueryParams, paging, parse_id};
use crate::AppState;
use crate::error::ApiError;
use crate::respond;
use engine::agents::BusyPolicy;
use engine::auth::{Principal, Scope};
use engine::events::follow::{self, EarlyEnd, FollowError, Following};
use engine::turn::answer;
use engine::turn::post::{self, Detached, Posted};
use engine::turn::{self, Trigger, TurnInput, ui_stream::UiBody};
use protocol::ui::{FinishReason, UiChunk};
use protocol::{ChatId, MessageId, TurnId};
use store::Answer;
use store::{ChatRow, ChatsOf, MessageRow, StoreError, TurnProgress, TurnRow, bounded};

const MAX_CLIENT_ID: usize = 200;
/// The most `file` parts one message may carry (T21).
const MAX_FILES: usize = 20;

#[utoipa::path(
    post,
    path = "/agents/{agent_id}/chats",
    operation_id = "create_chat",
    tag = "chats",
    params(("agent_id" = Uuid, Path, description = "The agent the chat talks to.")),
    responses(
        (status = 201, description = "The new, empty chat.", body = ChatRow),
        (status = 404, description = "No such agent in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
) -> Result<(StatusCode, Json<ChatRow>), ApiError> {
    let agent = parse_id(&agent_id, "agent")?;
    match bounded(
        state
            .store
            .create_chat(principal.team, agent, principal.user.as_deref()),
    )
    .await
    {
        Ok(chat) => Ok((StatusCode::CREATED, Json(chat))),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Chats {
    chats: Vec<ListedChat>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// A chat of a listing; with `q`, the snippet of its newest matching message (M5).
#[derive(Serialize, utoipa::ToSchema)]
pub struct ListedChat {
    #[serde(flatten)]
    chat: ChatRow,
    /// Present with `q`: a few words around the match in the chat's newest matching message.
    #[serde(skip_serializing_if = "Option::is_none")]
    snippet: Option<String>,
}

/// `?limit=&cursor=&q=` of the chats listing.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ChatsParams {
    /// How many: 1 to 200, 50 when absent.
    #[serde(default)]
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
    /// The `next_cursor` of the page before, for the page after it.
    #[serde(default)]
    cursor: Option<String>,
    /// Only the chats whose messages' text matches (M5): every word, `"a phrase"`,
    /// `-word` to exclude, `or` between alternatives; 1 to 500 characters.
    #[serde(default)]
    q: Option<String>,
}

/// The longest `q`, in characters.
const MAX_CHAT_QUERY: usize = 500;

const CHATS_CURSOR: &str = "ch1:";

/// `GET /v1/agents/{id}/chats`: the agent's chats, newest first; for a user token without
/// the admin claim, its user's only; with `q`, those whose messages match it (M5).
#[utoipa::path(
    get,
    path = "/agents/{agent_id}/chats",
    operation_id = "list_chats",
    tag = "chats",
    params(("agent_id" = Uuid, Path, description = "The agent."), ChatsParams),
    responses(
        (status = 200, description = "A page of the agent's chats the caller may see, newest \
            first; with `q`, only those whose messages match, each with a `snippet`.",
            body = Chats),
        (status = 400, description = "`limit` is out of range, `cursor` is not a cursor of \
            this listing, or `q` is empty or too long (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such agent in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
    QueryParams(params): QueryParams<ChatsParams>,
) -> Result<Json<Chats>, ApiError> {
    let agent = parse_id(&agent_id, "agent")?;
    let ChatsParams { limit, cursor, q } = params;
    let page = PageParams { limit, cursor };
    let limit = page.limit()?;
    let before = page.after::<KeysetKey>(CHATS_CURSOR)?.map(|k| k.0);
    let only = principal.only_chats_of();
    let admin = principal.scope == Scope::Admin;
    let listed = match q.as_deref().map(str::trim) {
        Some(q) if q.is_empty() || q.chars().count() > MAX_CHAT_QUERY => {
            return Err(ApiError::InvalidRequest(format!(
                "q must have 1 to {MAX_CHAT_QUERY} characters"
            )));
        }
        Some(q) => {
            let of = only.map_or(ChatsOf::Anyone, ChatsOf::User);
            bounded(state.store.search_chats(
                principal.team,
                agent,
                of,
                admin,
                q,
                before,
                limit + 1,
            ))
            .await
            .map(|hits| {
                hits.into_iter()
                    .map(|hit| ListedChat {
                        chat: hit.chat,
                        snippet: Some(hit.snippet),
                    })
                    .collect::<Vec<_>>()
            })
        }
        None => bounded(
            state
                .store
                .chats(principal.team, agent, only, admin, before, limit + 1),
        )
        .await
        .map(|rows| {
            rows.into_iter()
                .map(|chat| ListedChat {
                    chat,
                    snippet: None,
                })
                .collect()
        }),
    };
    match listed {
        Ok(rows) => {
            let (chats, next_cursor) = paging::page(rows, limit, CHATS_CURSOR, |c| {
                KeysetKey::of(c.chat.created_at, c.chat.id.0)
            });
            Ok(Json(Chats { chats, next_cursor }))
        }
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

/// `PATCH /v1/chats/{id}`: a person's title for the chat (T17).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"title": "Trip to Lyon"}))]
pub struct PatchChat {
    /// 1 to 80 characters once trimmed, no control characters.
    title: String,
}

/// Renames a chat: whoever may post to it may, and the title stays, whatever a late
/// generation answers.
#[utoipa::path(
    patch,
    path = "/chats/{chat_id}",
    operation_id = "update_chat",
    tag = "chats",
    params(("chat_id" = Uuid, Path, description = "The chat.")),
    request_body = PatchChat,
    responses(
        (status = 200, description = "The chat with its new title.", body = ChatRow),
        (status = 400, description = "An unknown field, or a title that is empty, longer than \
            80 characters or holds control characters (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such chat in the team, or one the caller may not \
            see (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn rename(
    State(state): State<AppState>,
    principal: Principal,
    Path(chat_id): Path<String>,
    JsonBody(body): JsonBody<PatchChat>,
) -> Result<Json<ChatRow>, ApiError> {
    let chat = parse_id(&chat_id, "chat")?;
    let title = turn::validate_title(&body.title).map_err(ApiError::InvalidRequest)?;
    principal.check_chat(&state.store, chat).await?;
    match bounded(state.store.rename_chat(principal.team, chat, &title)).await {
        Ok(row) => {
            tracing::info!(team = %principal.team, chat = %chat, "chat renamed");
            Ok(Json(row))
        }
        Err(StoreError::NotFound) => Err(ApiError::NotFound("chat")),
        Err(e) => Err(e.into()),
    }
}

/// A page of the transcript. Without `next_cursor` it reaches the chat's first message.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Messages {
    /// Oldest first, as the chat reads.
    messages: Vec<MessageRow>,
    /// `before` for the page of older messages; absent on the oldest page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// `?limit=&before=` of the transcript.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MessageParams {
    /// How many messages, the newest before `before`: 1 to 200, 50 when absent.
    #[serde(default)]
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
    /// A `next_cursor` of an earlier page: the page of messages older than that one.
    #[serde(default)]
    before: Option<String>,
}

/// The transcript's cursors name a message's `seq`.
const MESSAGES_CURSOR: &str = "m1:";

/// `GET /v1/chats/{id}/messages`: the transcript a page at a time, newest page first.
#[utoipa::path(
    get,
    path = "/chats/{chat_id}/messages",
    operation_id = "list_messages",
    tag = "chats",
    params(("chat_id" = Uuid, Path, description = "The chat."), MessageParams),
    responses(
        (status = 200, description = "The newest `limit` messages before `before` (the \
            newest of the chat without it), oldest first; `next_cursor` pages to older ones. \
            A `file` part's `url` is signed (T26): `GET` of it needs no bearer for \
            `BRAIN_FILE_URL_TTL_SECS`.",
            body = Messages),
        (status = 400, description = "`limit` is out of range or `before` is not a cursor \
            (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such chat in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn messages(
    State(state): State<AppState>,
    principal: Principal,
    Path(chat_id): Path<String>,
    QueryParams(params): QueryParams<MessageParams>,
) -> Result<Json<Messages>, ApiError> {
    let chat = parse_id(&chat_id, "chat")?;
    let limit = paging::checked_limit(params.limit)?;
    let before = params
        .before
        .as_deref()
        .map(|c| paging::key_of(MESSAGES_CURSOR, c, "before"))
        .transpose()?;
    principal.check_chat(&state.store, chat).await?;
    match bounded(
        state
            .store
            .message_page(principal.team, chat, before, limit),
    )
    .await
    {
        Ok((mut messages, more)) => {
            // T26: each file as a URL the client can follow without the bearer; the
            // stored message keeps the unsigned one.
            let now = state.clock.now();
            for message in &mut messages {
                state
                    .file_urls
                    .sign_parts(&state.store, principal.team, &mut message.parts, now)
                    .await?;
            }
            let next_cursor = more
                .then(|| {
                    messages
                        .first()
                        .map(|m| paging::cursor_of(MESSAGES_CURSOR, m.seq))
                })
                .flatten();
            Ok(Json(Messages {
                messages,
                next_cursor,
            }))
        }
        Err(StoreError::NotFound) => Err(ApiError::NotFound("chat")),
        Err(e) => Err(e.into()),
    }
}

/// The two accepted bodies of `POST /v1/chats/{id}/messages`.
#[derive(Debug)]
pub enum PostMessage {
    Plain(PlainMessage),
    AiSdk(AiSdkRequest),
}

/// `{"content": "...", "message_id": "..."}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"content": "What changed since yesterday?"}))]
pub struct PlainMessage {
    content: String,
    #[serde(default)]
    message_id: Option<String>,
    /// Run the turn in the background (D1): answered `202` at once, it runs to its end
    /// whatever the client does.
    #[serde(default)]
    background: bool,
    /// What this message does if the agent is busy (T13), instead of the agent's
    /// `busy_policy`: `reject`, `enqueue` or `interrupt`.
    #[serde(default)]
    if_busy: Option<BusyPolicy>,
}

/// What the AI SDK's `DefaultChatTransport` sends: the whole client-side transcript. Only
/// the last message is new; the history the model sees comes from the server.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AiSdkRequest {
    /// The client's chat id; the chat is the one in the path.
    #[serde(rename = "id")]
    #[schema(value_type = Value)]
    _id: serde::de::IgnoredAny,
    messages: Vec<UiMessageIn>,
    trigger: String,
    /// Set by the client only for `regenerate-message`, which is refused.
    #[serde(default, rename = "messageId")]
    #[schema(value_type = Value)]
    _message_id: serde::de::IgnoredAny,
    /// As in the plain form (D1); a `useChat` client sets it through the transport's
    /// `body`. Not with approval responses, whose continuation `POST
    /// /v1/approvals/{id}` runs in the background.
    #[serde(default)]
    background: bool,
    /// As in the plain form (T13); a `useChat` client sets it through the request's
    /// `body`.
    #[serde(default)]
    if_busy: Option<BusyPolicy>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UiMessageIn {
    id: String,
    role: String,
    /// Parts of earlier messages are the client's copy of server output and are not
    /// re-validated; the new message's parts are checked in `into_input`.
    #[schema(value_type = Vec<Value>)]
    parts: Vec<Part>,
    #[serde(default, rename = "metadata")]
    #[schema(value_type = Value)]
    _metadata: serde::de::IgnoredAny,
}

/// `oneOf` the two forms; `into_input` tells them apart by the `messages` field.
impl utoipa::PartialSchema for PostMessage {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(Ref::from_schema_name(PlainMessage::name()))
            .item(Ref::from_schema_name(AiSdkRequest::name()))
            .into()
    }
}

impl utoipa::ToSchema for PostMessage {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((PlainMessage::name().into(), PlainMessage::schema()));
        schemas.push((AiSdkRequest::name().into(), AiSdkRequest::schema()));
        schemas.push((UiMessageIn::name().into(), UiMessageIn::schema()));
    }
}

/// A3: the answers a `useChat` client re-posts after `addToolApprovalResponse`: the tool
/// parts of its last (assistant) message whose approval was answered. A part that is not
/// one in the shape the brain writes (no approval id, no `approved`) is not an answer.
fn approval_answers(last: &UiMessageIn) -> Result<Vec<Answer>, ApiError> {
    let mut answers = Vec::new();
    for part in &last.parts {
        let Part::Tool(ToolPart {
            state: ToolState::ApprovalResponded { approval },
            ..
        }) = part
        else {
            continue;
        };
        let reason = approval.reason.clone();
        answers.push(answer::tool_call(approval.id, approval.approved, reason)?);
    }
    if answers.is_empty() {
        return Err(ApiError::InvalidRequest(
            "the last message must have role `user`, or be the assistant's with approval responses"
                .to_owned(),
        ));
    }
    Ok(answers)
}

impl PlainMessage {
    /// A message of `content` alone, as another front end (MCP, P2) posts it.
    pub(super) fn of(content: String) -> Self {
        Self {
            content,
            message_id: None,
            background: false,
            if_busy: None,
        }
    }
}

impl PostMessage {
    /// A user message another front end (AG-UI) posts, checked as this route checks its
    /// plain form.
    pub(super) fn user_trigger(
        content: String,
        message_id: Option<String>,
        max_chars: usize,
    ) -> Result<Trigger, ApiError> {
        Self::Plain(PlainMessage {
            content,
            message_id,
            background: false,
            if_busy: None,
        })
        .into_trigger(max_chars)
    }

    /// Whether the turn is to run in the background (D1).
    fn background(&self) -> bool {
        match self {
            Self::Plain(plain) => plain.background,
            Self::AiSdk(request) => request.background,
        }
    }

    /// What the message does if the agent is busy, when it says (T13).
    fn if_busy(&self) -> Option<BusyPolicy> {
        match self {
            Self::Plain(plain) => plain.if_busy,
            Self::AiSdk(request) => request.if_busy,
        }
    }

    /// The trigger the body asks for. A new message's `file` parts are as posted (their
    /// `data:` URLs not yet stored): [`attach_files`] stores them.
    pub(super) fn into_trigger(self, max_chars: usize) -> Result<Trigger, ApiError> {
        let invalid = |m: &str| ApiError::InvalidRequest(m.to_owned());
        let mut files = Vec::new();
        let (content, message_id) = match self {
            Self::Plain(plain) => (plain.content, plain.message_id),
            Self::AiSdk(request) => {
                if request.trigger != "submit-message" {
                    return Err(invalid("only trigger `submit-message` is supported"));
                }
                let last = request
                    .messages
                    .into_iter()
                    .next_back()
                    .ok_or_else(|| invalid("messages is empty"))?;
                if last.role == "assistant" {
                    return approval_answers(&last).map(Trigger::Approval);
                }
                if last.role != "user" {
                    return Err(invalid("the last message must have role `user`"));
                }
                let mut text = String::new();
                for part in last.parts {
                    match part {
                        Part::Text { text: t } => text.push_str(&t),
                        Part::File(file) if files.len() < MAX_FILES => files.push(file),
                        Part::File(_) => {
                            return Err(ApiError::InvalidRequest(format!(
                                "a message may have at most {MAX_FILES} file parts"
                            )));
                        }
                        _ => {
                            return Err(invalid(
                                "the new message may only have text and file parts",
                            ));
                        }
                    }
                }
                (text, Some(last.id))
            }
        };
        if content.trim().is_empty() && files.is_empty() {
            return Err(invalid("content is empty"));
        }
        // Postgres text cannot hold NUL; refused here rather than failing the write.
        if content.contains('\0') || message_id.as_deref().is_some_and(|id| id.contains('\0')) {
            return Err(invalid(
                "content and message_id must not contain NUL characters",
            ));
        }
        if content.chars().count() > max_chars {
            return Err(ApiError::InvalidRequest(format!(
                "content must have at most {max_chars} characters"
            )));
        }
        if let Some(id) = &message_id
            && (id.is_empty() || id.len() > MAX_CLIENT_ID)
        {
            return Err(ApiError::InvalidRequest(format!(
                "message_id must have 1 to {MAX_CLIENT_ID} bytes"
            )));
        }
        Ok(Trigger::User(TurnInput {
            content,
            client_message_id: message_id,
            files,
            instructions: None,
        }))
    }
}

/// `202` to a background POST (D1): the turn it started, or the one an earlier POST of
/// its `message_id` did (T12).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BackgroundTurn {
    pub(super) turn_id: TurnId,
    pub(super) chat_id: ChatId,
    /// The user message, as the transcript lists it; `null` when the turn failed before
    /// any output and withdrew it (its `message_id` may then be sent again).
    message_id: Option<MessageId>,
    /// `running`, `queued` (T13), or how far the turn already got (`GET /v1/turns/{id}`'s
    /// `status`).
    pub(super) status: TurnProgress,
    /// A `queued` turn's place among its agent's (1 = next).
    #[serde(skip_serializing_if = "Option::is_none")]
    position: Option<u32>,
}

#[utoipa::path(
    post,
    path = "/chats/{chat_id}/messages",
    operation_id = "post_message",
    tag = "chats",
    params(("chat_id" = Uuid, Path, description = "The chat.")),
    request_body = PostMessage,
    responses(
        (status = 200, description = "The turn as the AI SDK UI message stream: one \
            `data: <UiChunk>` event per chunk, then `data: [DONE]`. With `interrupt` (T13) \
            the agent's running turn was stopped first (it ends `interrupted`, its partial \
            kept) and this is the new message's turn. A retry with the \
            `message_id` of a finished turn replays it; of a running turn, it follows that turn \
            from its start (D5; closing that stream stops nothing). Closing the stream stops the turn \
            (T8), unless the agent's `disconnect_policy` is `continue` (D1): then the turn \
            runs to its end.",
            content_type = "text/event-stream", body = UiStreamEvent,
            headers(
                ("x-vercel-ai-ui-message-stream" = String, description = "`v1`"),
                ("ratelimit-policy" = String, description = "The team's turn quotas \
                    (draft-ietf-httpapi-ratelimit-headers), when it has any."),
                ("ratelimit" = String, description = "What is left of each of them."),
            )),
        (status = 202, description = "`\"background\": true` (D1): the turn was started and \
            runs to its end whatever the client does; follow it with `GET \
            /v1/chats/{chat_id}/stream`, `GET /v1/chats/{chat_id}/events` or `GET \
            /v1/turns/{turn_id}`. A retry with the same `message_id` answers the same turn \
            (its `status` says how far it got) and starts nothing. Also the answer to a \
            message queued behind the busy agent's running turn (T13: `if_busy` or the \
            agent's `busy_policy` is `enqueue`): `status` `queued` with its `position` \
            (1 = next); it starts when the agent is free, in the order accepted, and streams \
            on `GET /v1/chats/{chat_id}/stream` then.",
            body = BackgroundTurn),
        (status = 402, description = "A period budget of the team is spent: model tokens per \
            day or month (`quota_exhausted`, with `Retry-After` until it resets and the \
            `RateLimit-Policy` / `RateLimit` fields). Nothing was written or sent.",
            body = ErrorBody),
        (status = 400, description = "The body matches neither form, or its content is \
            empty, too long or holds NUL, or `background` comes with approval responses, or a \
            `file` part's `url` is neither a base64 `data:` URL nor the URL of a file of this \
            chat, or an inline image does not decode (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such chat in the team, or its agent is archived \
            (`not_found`).", body = ErrorBody),
        (status = 409, description = "The agent is running another turn (`agent_busy`: its \
            `busy_policy` or the message's `if_busy` is `reject`, or `interrupt` of a turn in \
            a chat the caller may not see), or \
            this `message_id`'s turn is still running and cannot be followed: its start is no \
            longer in the events window, or the events stream cannot be read \
            (`turn_in_progress`; a retry of a running turn otherwise gets \
            `200` with that turn's stream from its start, D5, and a background POST \
            answers `202`); `turn_id` names it.",
            body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`), a file is \
            larger than `BRAIN_FILE_MAX_BYTES` (`file_too_large`), the message's files \
            together than `BRAIN_FILE_MAX_BYTES_PER_MESSAGE` (`message_files_too_large`), or \
            the team's files would pass `BRAIN_FILE_QUOTA_BYTES` (`file_quota_exceeded`); \
            nothing was stored or started.", body = ErrorBody),
        (status = 429, description = "The agent's queue of waiting messages is full \
            (`queue_full`, with `Retry-After`; `BRAIN_QUEUE_MAX_PER_AGENT`), or the team's \
            turns per minute or concurrent turns are \
            reached (`quota_exceeded`, with `Retry-After` and the `RateLimit-Policy` / \
            `RateLimit` fields; nothing was written or sent), or every model route was \
            rate-limited before any output (`rate_limited`, with `Retry-After` when the \
            provider gave one; never for a background turn, whose failure is its own).",
            body = ErrorBody),
        (status = 502, description = "The provider refused the request (`provider_rejected`; \
            a background turn's is its own).",
            body = ErrorBody),
        (status = 503, description = "Every model route failed before any output \
            (`provider_unavailable`; a background turn's failure is its own), a store is \
            unavailable (`store_unavailable`), this \
            replica's queue of new turns is full or the turn waited too long in it \
            (`overloaded`, with `Retry-After`; nothing was written), or this replica is \
            draining (`shutting_down`, with `Retry-After`).", body = ErrorBody),
    ),
)]
pub async fn post_message(
    State(state): State<AppState>,
    principal: Principal,
    Path(chat_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let chat = parse_id(&chat_id, "chat")?;
    let body = message_body(&state, &headers, body).await?;
    // Decided by shape so that each variant reports its own unknown-field errors
    // (an untagged enum would only say "did not match any variant").
    let parsed = if body.get("messages").is_some() {
        serde_json::from_value(body).map(PostMessage::AiSdk)
    } else {
        serde_json::from_value(body).map(PostMessage::Plain)
    }
    .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let background = parsed.background();
    let if_busy = parsed.if_busy();
    let mut trigger = parsed.into_trigger(state.config.max_message_chars)?;
    if background && matches!(trigger, Trigger::Approval(_)) {
        return Err(ApiError::InvalidRequest(
            "background is for a new user message; answer approvals with POST \
             /v1/approvals/{id} for a continuation in the background"
                .into(),
        ));
    }
    principal.check_chat_to_post(&state.store, chat).await?;
    attach_files(&state, &principal, chat, &mut trigger).await?;
    let parent = super::trace_parent(&headers);
    if background {
        let accepted =
            start_background(&state, &principal, chat, trigger, if_busy, parent.as_ref()).await?;
        return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response());
    }
    let posted = post::post(
        &state,
        &principal,
        chat,
        trigger,
        if_busy,
        false,
        parent.as_ref(),
    )
    .await;
    let launched = match posted {
        Ok(Posted::Launched(launched)) => launched,
        Ok(Posted::Queued(queued)) => {
            let accepted = BackgroundTurn::queued(chat, queued);
            return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response());
        }
        Err(err) => match err.in_progress() {
            // D5: a retry of a running turn's message id follows that turn.
            Some(running) => return attach(&state, &principal, running).await,
            None => return Err(err.into()),
        },
    };
    // Answers that leave other approvals of the turn waiting start nothing yet.
    let body = launched.body.unwrap_or_else(|| {
        UiBody::replay(vec![UiChunk::Finish {
            finish_reason: FinishReason::ToolCalls,
        }])
    });
    Ok(respond::ui_stream(
        body.until(state.auth.standing(&principal)),
    ))
}

/// A posted message's body: JSON within the API's body limit and room for the files a
/// message may carry inline as `data:` URLs (T21; base64 spends 4 bytes on 3).
pub(super) async fn message_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<serde_json::Value, ApiError> {
    let json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim)
        .is_some_and(|essence| {
            essence.eq_ignore_ascii_case("application/json") || essence.ends_with("+json")
        });
    if !json {
        return Err(ApiError::InvalidRequest(
            "expected Content-Type: application/json".into(),
        ));
    }
    let limit = state.config.max_body_bytes + state.config.files.max_message_bytes.div_ceil(3) * 4;
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::PayloadTooLarge(limit))?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::InvalidRequest(e.to_string()))
}

/// T21: a new message's `file` parts as they are stored: `data:` URLs stored as files of
/// the chat, uploaded files checked to be the chat's, every media type sniffed
/// (`engine::files::attach`). A file of another chat is `invalid_request`, like a URL
/// that names no file.
pub(super) async fn attach_files(
    state: &AppState,
    principal: &Principal,
    chat: ChatId,
    trigger: &mut Trigger,
) -> Result<(), ApiError> {
    let Trigger::User(input) = trigger else {
        return Ok(());
    };
    if input.files.is_empty() {
        return Ok(());
    }
    // T12: a retried message replays or follows the turn its first post started, whose
    // files are stored already; storing its data URLs again would leave copies behind.
    if let Some(id) = input.client_message_id.as_deref()
        && bounded(
            state
                .store
                .turn_for_client_message(principal.team, chat, id),
        )
        .await?
        .is_some()
    {
        return Ok(());
    }
    let posted = std::mem::take(&mut input.files);
    input.files = match engine::files::attach(state, principal.team, chat, posted).await {
        Ok(files) => files,
        Err(engine::files::FileError::NotFound) => {
            return Err(ApiError::InvalidRequest(
                "a file part's url names no file of this chat".into(),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    Ok(())
}

/// D5: a retried message id whose turn still runs (its client's replica died, its
/// connection dropped) gets that turn's stream, from its start, like `GET
/// /v1/chats/{id}/stream`; `turn_in_progress` as before when it cannot be followed (its
/// beginning is no longer in the events window, the events stream is unavailable or the
/// caller has as many streams open as allowed) or it ended meanwhile (the next retry
/// replays it).
async fn attach(
    state: &AppState,
    principal: &Principal,
    running: TurnId,
) -> Result<Response, ApiError> {
    match follow::follow_turn(state, principal, running, EarlyEnd::ErrorPart).await {
        Ok(Following::Live(followed)) => Ok(respond::followed(*followed)),
        Ok(Following::NotRunning | Following::OutOfWindow) | Err(FollowError::Events(_)) => {
            Err(ApiError::TurnInProgress(running))
        }
        Err(e) => Err(e.into()),
    }
}

/// D1: `trigger` as a detached turn, or the turn an earlier POST of its message id
/// started; `202`'s body.
async fn start_background(
    state: &AppState,
    principal: &Principal,
    chat: ChatId,
    trigger: Trigger,
    if_busy: Option<BusyPolicy>,
    parent: Option<&TraceContext>,
) -> Result<BackgroundTurn, ApiError> {
    Ok(
        match post::post_detached(state, principal, chat, trigger, if_busy, parent).await? {
            Detached::Started(turn, message) => BackgroundTurn::of(chat, (turn, message)),
            Detached::Queued(queued) => BackgroundTurn::queued(chat, queued),
        },
    )
}

impl BackgroundTurn {
    fn of(chat: ChatId, (turn, message): (TurnRow, Option<MessageId>)) -> Self {
        Self {
            turn_id: turn.id,
            chat_id: chat,
            message_id: message,
            status: turn.status,
            position: turn.position,
        }
    }

    fn queued(chat: ChatId, queued: turn::Queued) -> Self {
        Self {
            turn_id: queued.turn,
            chat_id: chat,
            message_id: Some(queued.message),
            status: TurnProgress::Queued,
            position: Some(queued.position),
        }
    }
}
