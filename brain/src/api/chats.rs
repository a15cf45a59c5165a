//! `POST|GET /v1/agents/{id}/chats`, `GET|POST /v1/chats/{id}/messages`.
//!
//! A chat records the JWT user who opened it; a user token without the admin claim sees
//! only its user's chats (`crate::auth`), every other one is `404` like another team's.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::agents::ListParams;
use super::{JsonBody, QueryParams, parse_id};
use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::store::{ChatRow, MessageRow, StoreError};
use crate::turn::{self, TurnInput, ui_stream::UiBody};

const MAX_CLIENT_ID: usize = 200;

pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
) -> Result<(StatusCode, Json<ChatRow>), ApiError> {
    let agent = parse_id(&agent_id, "agent")?;
    match state
        .store
        .create_chat(principal.team, agent, principal.user.as_deref())
        .await
    {
        Ok(chat) => Ok((StatusCode::CREATED, Json(chat))),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

#[derive(Serialize)]
pub struct Chats {
    chats: Vec<ChatRow>,
}

/// `GET /v1/agents/{id}/chats`: the agent's chats, newest first; for a user token without
/// the admin claim, its user's only.
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
    QueryParams(params): QueryParams<ListParams>,
) -> Result<Json<Chats>, ApiError> {
    let agent = parse_id(&agent_id, "agent")?;
    let limit = params.limit()?;
    match state
        .store
        .chats(principal.team, agent, principal.only_chats_of(), limit)
        .await
    {
        Ok(chats) => Ok(Json(Chats { chats })),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

#[derive(Serialize)]
pub struct Messages {
    messages: Vec<MessageRow>,
}

pub async fn messages(
    State(state): State<AppState>,
    principal: Principal,
    Path(chat_id): Path<String>,
) -> Result<Json<Messages>, ApiError> {
    let chat = parse_id(&chat_id, "chat")?;
    principal.check_chat(&state.store, chat).await?;
    match state.store.messages(principal.team, chat).await {
        Ok(messages) => Ok(Json(Messages { messages })),
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
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlainMessage {
    content: String,
    #[serde(default)]
    message_id: Option<String>,
}

/// What the AI SDK's `DefaultChatTransport` sends: the whole client-side transcript. Only
/// the last message is new; the history the model sees comes from the server.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AiSdkRequest {
    /// The client's chat id; the chat is the one in the path.
    #[serde(rename = "id")]
    _id: serde::de::IgnoredAny,
    messages: Vec<UiMessageIn>,
    trigger: String,
    /// Set by the client only for `regenerate-message`, which is refused.
    #[serde(default, rename = "messageId")]
    _message_id: serde::de::IgnoredAny,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UiMessageIn {
    id: String,
    role: String,
    /// Parts of earlier messages are the client's copy of server output and are not
    /// re-validated; the new message's parts are checked in `into_input`.
    parts: Vec<serde_json::Value>,
    #[serde(default, rename = "metadata")]
    _metadata: serde::de::IgnoredAny,
}

impl PostMessage {
    fn into_input(self, max_chars: usize) -> Result<TurnInput, ApiError> {
        let invalid = |m: &str| ApiError::InvalidRequest(m.to_owned());
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
                if last.role != "user" {
                    return Err(invalid("the last message must have role `user`"));
                }
                let mut text = String::new();
                for part in &last.parts {
                    match (
                        part.get("type").and_then(|t| t.as_str()),
                        part.get("text").and_then(|t| t.as_str()),
                    ) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => return Err(invalid("the new message may only have text parts")),
                    }
                }
                (text, Some(last.id))
            }
        };
        if content.trim().is_empty() {
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
        Ok(TurnInput {
            content,
            client_message_id: message_id,
        })
    }
}

pub async fn post_message(
    State(state): State<AppState>,
    principal: Principal,
    Path(chat_id): Path<String>,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<UiBody, ApiError> {
    let chat = parse_id(&chat_id, "chat")?;
    // Decided by shape so that each variant reports its own unknown-field errors
    // (an untagged enum would only say "did not match any variant").
    let parsed = if body.get("messages").is_some() {
        serde_json::from_value(body).map(PostMessage::AiSdk)
    } else {
        serde_json::from_value(body).map(PostMessage::Plain)
    };
    let input = parsed
        .map_err(|e| ApiError::InvalidRequest(e.to_string()))?
        .into_input(state.config.max_message_chars)?;
    principal.check_chat(&state.store, chat).await?;
    turn::start(&state, principal.team, chat, input).await
}
