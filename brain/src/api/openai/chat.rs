//! `POST /openai/v1/chat/completions` (P7): the last message of `messages` is a user
//! message posted to the chat the conversation is, through the same path as `POST
//! /v1/chats/{id}/messages` (`engine::turn::post`); the turn's UI chunks come back as one
//! `chat.completion` or, with `stream`, as `chat.completion.chunk` events.
//!
//! Which chat: the one `X-Chat-Id` or `metadata.chat_id` names; else the chat whose
//! exchange so far is exactly the messages before the new one (the client resends the
//! conversation each time: `engine::conversations`); else a new chat. The messages before
//! the new one only find the chat: the model sees the chat's own history (M1), never a
//! transcript a client sends.
//!
//! The agent's tool calls run here, with the principal's authority; they never reach the
//! client as `tool_calls` for it to run. A refusal before the turn starts is an HTTP
//! error in OpenAI's shape (`error.rs`); a turn that fails after it started is an error
//! event in a stream, a `502` otherwise.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use protocol::ui::{FinishReason, UiChunk};
use protocol::{AgentId, ChatId, ErrorCode, TeamId, TurnId};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::activity::Activity;
use super::error::{self, OpenAiErrorBody, TurnRefusals};
use super::models::agent_for;
use crate::AppState;
use crate::api::chats::{PostMessage, attach_files, message_body};
use crate::error::ApiError;
use engine::agents::BusyPolicy;
use engine::auth::Principal;
use engine::conversations::{Owner, Speaker};
use engine::sse;
use engine::turn::Trigger;
use engine::turn::post::{self, Posted};
use engine::turn::ui_stream::UiBody;
use store::{AgentRow, StoreError, bounded};

/// The header that names the chat, in a request and in every answer.
pub(super) const CHAT_HEADER: &str = "x-chat-id";
/// The most bytes an end user's name (`user`) may have.
const MAX_USER: usize = 255;
/// How long a stream may be silent before a keep-alive comment goes out.
pub(super) const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// How far before the post a turn's billing events are looked for: clocks of replicas and
/// Postgres differ a little.
pub(super) const BILLING_SKEW: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// OpenAI's chat completion request. Decoded as an open object, as OpenAI's own schema
/// is: the wire is not ours, clients send sampling fields (`temperature`, `max_tokens`,
/// `tools`, ...) this server does not read (the agent's route and tools are the runtime's),
/// and a newer client adds fields.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(example = json!({
    "model": "0b6f3c2e-4d1a-4f7e-9a35-2f4f1c9d8e21",
    "messages": [{"role": "user", "content": "What changed since yesterday?"}],
    "stream": true,
    "stream_options": {"include_usage": true}
}))]
#[schema(as = OpenAiChatRequest)]
pub struct ChatRequest {
    /// The agent: its id, or its name where no other agent of the team has it.
    model: String,
    /// The conversation. The last message is the new one and must be the user's (text
    /// and `image_url` parts); the user and assistant texts before it find the chat.
    #[schema(value_type = Vec<Value>)]
    messages: Vec<ChatMessage>,
    /// Answer as `chat.completion.chunk` events.
    #[serde(default)]
    stream: bool,
    /// `{"include_usage": true}`: a last chunk with the turn's usage.
    #[serde(default)]
    #[schema(value_type = Option<Value>)]
    stream_options: Option<StreamOptions>,
    /// For an API key: the end user the chat is opened for and whose conversations it
    /// continues. A user token's own subject is its user; this is then not read.
    #[serde(default)]
    user: Option<String>,
    /// `chat_id`: the chat to continue (as `X-Chat-Id`); other keys are not read.
    #[serde(default)]
    #[schema(value_type = Option<Value>)]
    metadata: Option<Map<String, Value>>,
    /// Only `1`: a turn has one answer.
    #[serde(default)]
    n: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    /// A string, or an array of content parts; `null` for an assistant's tool calls.
    #[serde(default)]
    content: Value,
}

/// The texts a message's content holds, joined: a string, or its `text` parts.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// The new message as the AI SDK's parts, for the posting path's own checks: its text,
/// then each `image_url` as a file part (a `data:` URL, or the URL of a file uploaded to
/// the chat).
pub(super) fn new_message_parts(content: &Value) -> Result<Vec<Value>, ApiError> {
    let invalid = |m: &str| ApiError::InvalidRequest(m.to_owned());
    match content {
        Value::String(text) => Ok(vec![json!({"type": "text", "text": text})]),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part.get("type").and_then(Value::as_str) {
                Some("text") => match part.get("text") {
                    Some(Value::String(text)) => Ok(json!({"type": "text", "text": text})),
                    _ => Err(invalid("a text part needs `text`")),
                },
                Some("image_url") => {
                    let url = part
                        .get("image_url")
                        .and_then(|i| i.get("url"))
                        .and_then(Value::as_str)
                        .ok_or_else(|| invalid("an image_url part needs `image_url.url`"))?;
                    // The media type is sniffed from the bytes (T22), not taken from here.
                    Ok(
                        json!({"type": "file", "mediaType": "application/octet-stream",
                              "url": url}),
                    )
                }
                Some("file") => file_part(
                    part.get("file")
                        .ok_or_else(|| invalid("a file part needs `file`"))?,
                ),
                _ => Err(invalid(
                    "the new message may only have `text`, `image_url` and `file` parts",
                )),
            })
            .collect(),
        _ => Err(invalid("the new message has no content")),
    }
}

/// A file given inline or by reference (a chat completion's `file` part, a Responses
/// `input_file`) as a file part of the message: `file_data` base64, as a `data:` URL or
/// bare; `file_id` the id of a file uploaded to the chat (`POST /v1/chats/{id}/files`);
/// `file_url` a `data:` URL or a chat file's URL (nothing is fetched from elsewhere). The
/// posting path stores or checks it with the same limits as any file part (T21, T22).
pub(super) fn file_part(file: &Value) -> Result<Value, ApiError> {
    let invalid = |m: &str| ApiError::InvalidRequest(m.to_owned());
    let field = |name: &str| file.get(name).and_then(Value::as_str);
    let url = match (field("file_data"), field("file_id"), field("file_url")) {
        (Some(data), None, None) if data.starts_with("data:") => data.to_owned(),
        (Some(data), None, None) => format!("data:application/octet-stream;base64,{data}"),
        (None, Some(id), None) => {
            let id = id
                .parse()
                .map_err(|_| invalid("`file_id` must be the id of a file of this chat"))?;
            engine::files::url(id)
        }
        (None, None, Some(url)) => url.to_owned(),
        _ => {
            return Err(invalid(
                "a file needs one of `file_data`, `file_id` or `file_url`",
            ));
        }
    };
    let mut part = json!({"type": "file", "mediaType": "application/octet-stream", "url": url});
    if let Some(name) = field("filename") {
        part["filename"] = json!(name);
    }
    // The media type is sniffed from the bytes (T22), not taken from here.
    Ok(part)
}

/// The new message as the posting path takes it: its AI SDK parts, and the caller's
/// instructions for its turn (P9).
pub(super) struct NewMessage {
    pub(super) parts: Vec<Value>,
    pub(super) instructions: Option<String>,
}

/// The caller's instructions for a turn, checked (P9); empty is none.
pub(super) fn checked_instructions(given: Option<String>) -> Result<Option<String>, ApiError> {
    let Some(text) = given.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    engine::turn::validate_instructions(&text).map_err(ApiError::InvalidRequest)?;
    Ok(Some(text))
}

/// The request's `system` and `developer` messages, wherever they are, as the caller's
/// instructions for the turn (P9): their texts joined by blank lines.
fn system_messages(messages: &[ChatMessage]) -> Option<String> {
    let texts: Vec<String> = messages
        .iter()
        .filter(|m| matches!(m.role.as_str(), "system" | "developer"))
        .map(|m| text_of(&m.content))
        .filter(|t| !t.trim().is_empty())
        .collect();
    (!texts.is_empty()).then(|| texts.join("\n\n"))
}

/// The conversation split: the user and assistant texts before the new message, and the
/// new message (which must be the user's).
fn split(
    mut messages: Vec<ChatMessage>,
) -> Result<(Vec<(Speaker, String)>, ChatMessage), ApiError> {
    let last = messages
        .pop()
        .ok_or_else(|| ApiError::InvalidRequest("messages is empty".into()))?;
    if last.role != "user" {
        return Err(ApiError::InvalidRequest(
            "the last message must have role `user`".into(),
        ));
    }
    let prior = messages
        .iter()
        .filter_map(|m| match m.role.as_str() {
            "user" => Some((Speaker::User, text_of(&m.content))),
            // An assistant message of tool calls only (no text) is not what this server
            // answers; it is left out like the tool results.
            "assistant" => {
                Some((Speaker::Assistant, text_of(&m.content))).filter(|(_, text)| !text.is_empty())
            }
            _ => None,
        })
        .collect();
    Ok((prior, last))
}

/// For an API key, the end user `user` names; a user token is its own user.
pub(super) fn end_user(
    mut principal: Principal,
    user: Option<String>,
) -> Result<Principal, ApiError> {
    let Some(user) = user else {
        return Ok(principal);
    };
    if principal.key_id.is_none() {
        return Ok(principal);
    }
    if user.is_empty() || user.len() > MAX_USER || user.chars().any(char::is_control) {
        return Err(ApiError::InvalidRequest(format!(
            "user must have 1 to {MAX_USER} bytes and no control characters"
        )));
    }
    principal.user = Some(user);
    Ok(principal)
}

/// The chat `X-Chat-Id` or `metadata.chat_id` names, if either does (the header wins).
fn explicit_chat(
    headers: &HeaderMap,
    metadata: Option<&Map<String, Value>>,
) -> Result<Option<ChatId>, ApiError> {
    let header = headers.get(CHAT_HEADER).map(|v| v.to_str().unwrap_or(""));
    let named = header.or_else(|| metadata?.get("chat_id")?.as_str());
    named
        .map(|raw| {
            raw.trim()
                .parse()
                .map_err(|_| ApiError::InvalidRequest("the chat id must be a UUID".into()))
        })
        .transpose()
}

/// Who a conversation belongs to, owned so a stream can carry it.
#[derive(Clone)]
struct Owned {
    team: TeamId,
    agent: AgentId,
    actor: String,
    user: Option<String>,
}

impl Owned {
    fn owner(&self) -> Owner<'_> {
        Owner {
            team: self.team,
            agent: self.agent,
            actor: &self.actor,
            user: self.user.as_deref(),
        }
    }
}

/// Whether `chat` is a chat of `agent` the principal may post to.
pub(super) async fn is_agents_chat(
    state: &AppState,
    principal: &Principal,
    agent: AgentId,
    chat: ChatId,
) -> Result<bool, ApiError> {
    match principal.check_chat(&state.store, chat).await {
        Ok(()) => {}
        Err(engine::auth::AuthError::NotFound(_)) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    match bounded(state.store.chat_with_agent(principal.team, chat)).await {
        Ok(basis) => Ok(basis.chat.agent_id == agent),
        Err(StoreError::NotFound) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The chat this request continues, or a new one (module doc).
async fn chat_for(
    state: &AppState,
    principal: &Principal,
    owner: &Owned,
    explicit: Option<ChatId>,
    prior: &[(Speaker, &str)],
) -> Result<ChatId, ApiError> {
    if let Some(chat) = explicit {
        return match is_agents_chat(state, principal, owner.agent, chat).await? {
            true => Ok(chat),
            false => Err(ApiError::NotFound("chat")),
        };
    }
    if !prior.is_empty() {
        match state.conversations.find(&owner.owner(), prior).await {
            Ok(Some(chat)) if is_agents_chat(state, principal, owner.agent, chat).await? => {
                return Ok(chat);
            }
            Ok(_) => {}
            Err(unavailable) => tracing::warn!(
                error_class = unavailable.0,
                "a conversation's chat could not be looked up; it continues in a new chat"
            ),
        }
    }
    let created = state
        .store
        .create_chat(principal.team, owner.agent, principal.user.as_deref());
    Ok(bounded(created).await?.id)
}

#[utoipa::path(
    post,
    path = "/openai/v1/chat/completions",
    operation_id = "openai_chat_completions",
    tag = "openai",
    request_body = ChatRequest,
    responses(
        (status = 200, description = "The turn's answer: one `chat.completion` (`id` \
            `chatcmpl-<turn id>`, the text in `choices[0].message.content`, `usage`), or \
            with `stream` `chat.completion.chunk` events over Server-Sent Events (`data: \
            <chunk>`, the role first, then the text's deltas, then `finish_reason`, a \
            usage chunk with `stream_options.include_usage`, then `data: [DONE]`). A turn \
            that fails mid-stream ends with `data: {\"error\": {...}}` in OpenAI's shape. \
            The agent's tool calls run server-side and never appear as `tool_calls`. \
            `X-Chat-Id` names the chat the conversation is.",
            body = Object),
        (status = 400, description = "Not a chat completion request, the last message is \
            not the user's or has parts other than `text`, `image_url` and `file`, a file \
            part without one of `file_data`, `file_id` or `file_url` or naming no file of \
            the chat, `n` is not 1, or the chat id is not a UUID (`invalid_request`). Every \
            refusal is in OpenAI's shape, `{\"error\": {\"message\", \"type\", \"param\", \
            \"code\"}}`, `code` our stable code.", body = OpenAiErrorBody),
        (status = 404, description = "`model` names no agent of the team, or the chat id \
            no chat of this agent the caller may see (`not_found`).", body = OpenAiErrorBody),
        TurnRefusals,
    ),
)]
pub async fn completions(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let request: ChatRequest = decoded(&state, &headers, body).await?;
    if request.n.is_some_and(|n| n != 1) {
        return Err(ApiError::InvalidRequest("n must be 1".into()));
    }
    let principal = end_user(principal, request.user)?;
    let agent = agent_for(&state, &principal, &request.model).await?;
    let explicit = explicit_chat(&headers, request.metadata.as_ref())?;
    let instructions = checked_instructions(system_messages(&request.messages))?;
    let (prior, last) = split(request.messages)?;
    let owner = Owned {
        team: principal.team,
        agent: agent.id,
        actor: principal.authority().actor,
        user: principal.user.clone(),
    };
    let prior_refs: Vec<(Speaker, &str)> = prior.iter().map(|(s, t)| (*s, t.as_str())).collect();
    let chat = chat_for(&state, &principal, &owner, explicit, &prior_refs).await?;
    let said = text_of(&last.content);
    let message = NewMessage {
        parts: new_message_parts(&last.content)?,
        instructions,
    };
    let activity = Activity::new(tool_activity(&state, &agent).await?);
    let since = Utc::now() - BILLING_SKEW;
    let (turn, mut body) = launch(&state, &principal, &headers, &agent, chat, message).await?;
    let rate_limit = body.take_rate_limit();
    let mut exchange = Exchange {
        state,
        owner,
        prior,
        said,
        chat,
        turn,
        since,
        model: request.model,
        created: Utc::now().timestamp(),
        answer: String::new(),
        activity,
    };
    let mut response = if request.stream {
        let usage = request.stream_options.is_some_and(|o| o.include_usage);
        stream(exchange, body, usage)
    } else {
        exchange.whole(body).await?
    };
    crate::respond::rate_limit(&rate_limit, response.headers_mut());
    Ok(in_chat(response, chat))
}

/// An OpenAI request's body: read within the posting path's limits, then decoded.
pub(super) async fn decoded<T: serde::de::DeserializeOwned>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    let value = message_body(state, headers, body).await?;
    serde_json::from_value(value).map_err(|e| ApiError::InvalidRequest(e.to_string()))
}

/// `response` with `X-Chat-Id` naming the chat its turn is in.
pub(super) fn in_chat(mut response: Response, chat: ChatId) -> Response {
    if let Ok(value) = HeaderValue::from_str(&chat.to_string()) {
        response.headers_mut().insert(CHAT_HEADER, value);
    }
    response
}

/// The new message as a trigger to post to `chat`, its files stored.
pub(super) async fn trigger_for(
    state: &AppState,
    principal: &Principal,
    chat: ChatId,
    new: NewMessage,
) -> Result<Trigger, ApiError> {
    // The posting path's own checks (length, NUL, at most so many files); a fresh message
    // id, since an OpenAI request has none to retry with.
    let message = json!({
        "id": chat, "trigger": "submit-message",
        "messages": [{"id": uuid::Uuid::now_v7().to_string(), "role": "user", "parts": new.parts}],
    });
    let message =
        serde_json::from_value(message).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let mut trigger = PostMessage::AiSdk(message).into_trigger(state.config.max_message_chars)?;
    // P9: the caller's words for this turn; they are not the agent's settings, so any
    // principal that may post may pass them, and they lift no tool's gate.
    if let Trigger::User(input) = &mut trigger {
        input.instructions = new.instructions;
    }
    principal.check_chat_to_post(&state.store, chat).await?;
    attach_files(state, principal, chat, &mut trigger).await?;
    Ok(trigger)
}

/// Posts the new message to `chat` through the posting path of every front end, and
/// starts its turn: the turn and its UI chunks.
pub(super) async fn launch(
    state: &AppState,
    principal: &Principal,
    headers: &HeaderMap,
    agent: &AgentRow,
    chat: ChatId,
    new: NewMessage,
) -> Result<(TurnId, UiBody), ApiError> {
    let trigger = trigger_for(state, principal, chat, new).await?;
    // An OpenAI request cannot be answered later: a busy agent that would queue it
    // refuses it instead.
    let if_busy = (agent.busy_policy == BusyPolicy::Enqueue).then_some(BusyPolicy::Reject);
    let parent = crate::api::trace_parent(headers);
    let launched = match post::post(
        state,
        principal,
        chat,
        trigger,
        if_busy,
        false,
        parent.as_ref(),
    )
    .await?
    {
        Posted::Launched(launched) => launched,
        Posted::Queued(_) => return Err(ApiError::Internal("an OpenAI turn was queued".into())),
    };
    let (Some(turn), Some(body)) = (launched.turn, launched.body) else {
        return Err(ApiError::Internal("the message started no turn".into()));
    };
    Ok((turn, body.until(state.auth.standing(principal))))
}

/// How the agent's tool calls show in its answers (P13).
pub(super) async fn tool_activity(
    state: &AppState,
    agent: &AgentRow,
) -> Result<domain::openai::ToolActivity, ApiError> {
    let options = bounded(state.store.agent_openai(agent.team_id, agent.id)).await?;
    Ok(options.tool_activity)
}

/// A turn's billed tokens (input, output), E1; zeros when the store cannot say.
pub(super) async fn tokens(
    state: &AppState,
    team: TeamId,
    turn: TurnId,
    since: DateTime<Utc>,
) -> (i64, i64) {
    bounded(state.store.turn_tokens(team, turn, since))
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "a turn's usage could not be read");
            (0, 0)
        })
}

/// One request's turn, as it is answered.
struct Exchange {
    state: AppState,
    owner: Owned,
    prior: Vec<(Speaker, String)>,
    /// The new message's text, as the client will resend it.
    said: String,
    chat: ChatId,
    turn: TurnId,
    since: DateTime<Utc>,
    model: String,
    created: i64,
    /// The answer's text so far, the lines of tool activity in it included (as the
    /// client will resend it).
    answer: String,
    activity: Activity,
}

/// How a turn's stream ended.
enum End {
    Finished(&'static str),
    Failed(ErrorCode, String),
}

/// OpenAI's `finish_reason` for the turn's. A turn waiting for an approval (`tool-calls`)
/// ends here: the call is answered elsewhere and its continuation shows in the chat.
fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

/// The code and message of an `error` chunk (`<code>: <message>`).
pub(super) fn failure(text: &str) -> (ErrorCode, String) {
    let (code, message) = text.split_once(": ").unwrap_or(("internal", text));
    (
        ErrorCode::parse(code).unwrap_or(ErrorCode::Internal),
        message.to_owned(),
    )
}

impl Exchange {
    fn id(&self) -> String {
        format!("chatcmpl-{}", self.turn)
    }

    /// What a chunk adds to the answer, and how the turn ended if it did.
    fn take(&mut self, chunk: UiChunk) -> (Option<String>, Option<End>) {
        if let Some(line) = self.activity.line(&chunk, &self.answer) {
            self.answer.push_str(&line);
            return (Some(line), None);
        }
        match chunk {
            UiChunk::TextDelta { delta, .. } => {
                self.answer.push_str(&delta);
                (Some(delta), None)
            }
            UiChunk::Finish { finish_reason } => (
                None,
                Some(End::Finished(self::finish_reason(finish_reason))),
            ),
            UiChunk::Error { error_text } => {
                let (code, message) = failure(&error_text);
                (None, Some(End::Failed(code, message)))
            }
            _ => (None, None),
        }
    }

    /// Records the conversation as it now is, so the client's next request finds this
    /// chat; Redis failing only makes that request open a new chat.
    async fn remember(&self) {
        let mut now: Vec<(Speaker, &str)> =
            self.prior.iter().map(|(s, t)| (*s, t.as_str())).collect();
        let before = now.clone();
        now.push((Speaker::User, &self.said));
        now.push((Speaker::Assistant, &self.answer));
        let owner = self.owner.owner();
        let kept = self
            .state
            .conversations
            .remember(&owner, Some(&before), &now, self.chat);
        if let Err(unavailable) = kept.await {
            tracing::warn!(
                error_class = unavailable.0,
                "a conversation's fingerprint could not be kept"
            );
        }
    }

    /// The turn's billed tokens as OpenAI's `usage`; zeros when the store cannot say.
    async fn usage(&self) -> Value {
        let (input, output) = tokens(&self.state, self.owner.team, self.turn, self.since).await;
        json!({"prompt_tokens": input, "completion_tokens": output,
               "total_tokens": input + output})
    }

    /// The whole answer, once the turn ended: one `chat.completion`.
    async fn whole(&mut self, mut body: UiBody) -> Result<Response, ApiError> {
        let mut end = None;
        // Read to the end, not just to `finish`: dropping the body early would cancel the
        // turn while it records its end (T8).
        while let Some(chunk) = body.next_chunk().await {
            if let (_, Some(ended)) = self.take(chunk) {
                end.get_or_insert(ended);
            }
        }
        let reason = match end {
            Some(End::Finished(reason)) => reason,
            Some(End::Failed(code, message)) => return Ok(error::turn_failed(code, &message)),
            None => {
                return Ok(error::turn_failed(
                    ErrorCode::Internal,
                    "the turn's stream ended without an answer",
                ));
            }
        };
        self.remember().await;
        let completion = json!({
            "id": self.id(),
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": self.answer, "refusal": null},
                "logprobs": null,
                "finish_reason": reason,
            }],
            "usage": self.usage().await,
        });
        Ok(axum::Json(completion).into_response())
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Bytes {
        let mut chunk = json!({
            "id": self.id(),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        sse::event(None, &chunk.to_string())
    }

    fn delta(&self, delta: Value, finish_reason: Option<&str>) -> Bytes {
        let choice = json!([{"index": 0, "delta": delta, "logprobs": null,
                             "finish_reason": finish_reason}]);
        self.chunk(choice, None)
    }
}

/// The streamed answer: the role, each text delta, the finish, the usage when asked, then
/// `[DONE]`; an error event instead when the turn fails. The turn's stream is read to its
/// end even after the last event.
fn stream(exchange: Exchange, body: UiBody, include_usage: bool) -> Response {
    let opening = exchange.delta(json!({"role": "assistant", "content": ""}), None);
    struct Reading {
        exchange: Exchange,
        body: UiBody,
        include_usage: bool,
        ended: bool,
    }
    let reading = Reading {
        exchange,
        body,
        include_usage,
        ended: false,
    };
    let rest = futures_util::stream::unfold(reading, |mut r| async move {
        loop {
            let chunk = match tokio::time::timeout(KEEP_ALIVE, r.body.next_chunk()).await {
                Err(_) => return Some((vec![sse::keep_alive()], r)),
                Ok(Some(chunk)) => chunk,
                Ok(None) => return None,
            };
            if r.ended {
                continue;
            }
            let mut out = Vec::new();
            match r.exchange.take(chunk) {
                (Some(delta), _) => out.push(r.exchange.delta(json!({"content": delta}), None)),
                (None, Some(End::Finished(reason))) => {
                    r.ended = true;
                    out.push(r.exchange.delta(json!({}), Some(reason)));
                    r.exchange.remember().await;
                    if r.include_usage {
                        let usage = r.exchange.usage().await;
                        out.push(r.exchange.chunk(json!([]), Some(usage)));
                    }
                    out.push(sse::event(None, "[DONE]"));
                }
                (None, Some(End::Failed(code, message))) => {
                    r.ended = true;
                    let event = error::body(error::TURN_FAILED, code, &message);
                    out.push(sse::event(None, &event.to_json()));
                }
                (None, None) => {}
            }
            if !out.is_empty() {
                return Some((out, r));
            }
        }
    })
    .flat_map(|batch| futures_util::stream::iter(batch.into_iter().map(Ok::<_, Infallible>)));
    let events = futures_util::stream::once(async move { Ok(opening) }).chain(rest);
    crate::respond::event_stream(Body::from_stream(events))
}
