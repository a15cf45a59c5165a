//! `POST /openai/v1/responses` (P8): OpenAI's Responses API over the same turns as chat
//! completions. A response is a turn (`resp_<turn id>`): `input` is the new user message,
//! posted through `engine::turn::post` (`chat::launch`), and `previous_response_id`
//! continues the chat of that turn. Unlike a chat completion the client resends nothing,
//! so no fingerprint is kept: the previous response names the chat.
//!
//! The answer is one `response` object, or with `stream` the Responses API's events
//! (`response.created` ... `response.completed`, each with its `sequence_number`). A turn
//! that fails after it started is a `502` in OpenAI's error shape, or in a stream a
//! `response.failed` event.
//!
//! `background: true` starts a detached turn (D1) and answers the response `queued` or
//! `in_progress` at once; `GET /openai/v1/responses/{id}` shows the turn as a response
//! and `POST .../cancel` stops it as `POST /v1/turns/{id}/stop` does.

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use futures_util::{Stream, StreamExt};
use protocol::ui::{FinishReason, UiChunk};
use protocol::{AgentId, ChatId, ErrorCode, TeamId, TurnId};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::openapi::RefOr;

use super::activity::Activity;
use super::chat::{
    BILLING_SKEW, KEEP_ALIVE, NewMessage, checked_instructions, decoded, end_user, failure,
    in_chat, is_agents_chat, launch, new_message_parts, tokens, tool_activity, trigger_for,
};
use super::error::{self, OpenAiErrorBody, TurnRefusals, error_answer};
use super::models::agent_for;
use crate::AppState;
use crate::a2a::stream::{Frame, Frames};
use crate::api::QueryParams;
use crate::error::ApiError;
use domain::openai::ToolActivity;
use engine::auth::Principal;
use engine::events::{Resumed, TurnStream, Viewer};
use engine::sse;
use engine::turn::post::{self, Detached};
use engine::turn::stop;
use engine::turn::ui_stream::UiBody;
use protocol::parts::Part;
use store::{StoreError, TurnProgress, TurnRow, TurnStatus, bounded};

/// What a response id is: `resp_` and the turn's id.
const ID_PREFIX: &str = "resp_";

/// OpenAI's Responses request. Decoded as an open object, as OpenAI's own schema is:
/// sampling fields, `tools`, `store`, `reasoning` and `text` are not read (the agent's
/// route and tools are the runtime's).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(example = json!({
    "model": "0b6f3c2e-4d1a-4f7e-9a35-2f4f1c9d8e21",
    "input": "What changed since yesterday?",
    "previous_response_id": "resp_0193a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b",
    "stream": true
}))]
#[schema(as = OpenAiResponseRequest)]
pub struct ResponseRequest {
    /// The agent: its id, or its name where no other agent of the team has it.
    model: String,
    /// A string, or items: the last must be the user's message (`content` a string or
    /// `input_text` and `input_image` parts); items before it are not read.
    #[schema(value_type = Value)]
    input: Value,
    /// The caller's instructions for this turn (P9): appended to the agent's own prompt
    /// under a heading that says they are the caller's, never replacing it; frozen with
    /// the turn and kept for its continuation after an approval. At most
    /// 16,384 characters. Empty is none.
    #[serde(default)]
    instructions: Option<String>,
    /// Continue the chat of this response (`resp_<turn id>`) instead of opening one.
    #[serde(default)]
    previous_response_id: Option<String>,
    /// Answer as the Responses API's events.
    #[serde(default)]
    stream: bool,
    /// Run as a background turn (D1): answered at once (`queued` or `in_progress`), then
    /// polled with `GET /openai/v1/responses/{id}` and stopped with `.../cancel`.
    #[serde(default)]
    background: bool,
    /// For an API key: the end user a new chat is opened for (as in chat completions).
    #[serde(default)]
    user: Option<String>,
}

/// The new message's content as chat completion parts (`text`, `image_url`), so the one
/// translation to the posting path's parts is `chat::new_message_parts`.
fn new_content(input: Value) -> Result<Value, ApiError> {
    let invalid = |m: &str| ApiError::InvalidRequest(m.to_owned());
    let item = match input {
        Value::String(text) => return Ok(Value::String(text)),
        Value::Array(mut items) => items.pop().ok_or_else(|| invalid("input is empty"))?,
        _ => return Err(invalid("input must be a string or an array of items")),
    };
    let is_message = matches!(
        item.get("type").and_then(Value::as_str),
        None | Some("message")
    );
    if !is_message || item.get("role").and_then(Value::as_str) != Some("user") {
        return Err(invalid(
            "the last input item must be a message with role `user`",
        ));
    }
    match item.get("content") {
        Some(Value::String(text)) => Ok(Value::String(text.clone())),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|part| match part.get("type").and_then(Value::as_str) {
                Some("input_text") => Ok(json!({"type": "text", "text": part.get("text")})),
                Some("input_image") => match part.get("image_url").and_then(Value::as_str) {
                    Some(url) => Ok(json!({"type": "image_url", "image_url": {"url": url}})),
                    None => Err(invalid("an input_image part needs `image_url`")),
                },
                Some("input_file") => Ok(json!({"type": "file", "file": part})),
                _ => Err(invalid(
                    "the new message may only have `input_text`, `input_image` and \
                     `input_file` parts",
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        _ => Err(invalid("the new message has no content")),
    }
}

/// The turn a response id names.
fn turn_of(id: &str) -> Option<TurnId> {
    id.strip_prefix(ID_PREFIX)?.parse().ok()
}

/// The chat of the response `previous` names: a turn of this agent in a chat the
/// principal may post to; anything else, another team's, is `404 not_found`.
async fn previous_chat(
    state: &AppState,
    principal: &Principal,
    agent: AgentId,
    previous: &str,
) -> Result<ChatId, ApiError> {
    let not_found = || ApiError::NotFound("response");
    let turn = turn_of(previous).ok_or_else(not_found)?;
    let row = match bounded(state.store.turn_row(principal.team, turn)).await {
        Ok(row) => row,
        Err(StoreError::NotFound) => return Err(not_found()),
        Err(e) => return Err(e.into()),
    };
    if row.agent_id != agent || !is_agents_chat(state, principal, agent, row.chat_id).await? {
        return Err(not_found());
    }
    Ok(row.chat_id)
}

#[utoipa::path(
    post,
    path = "/openai/v1/responses",
    operation_id = "openai_responses",
    tag = "openai",
    request_body = ResponseRequest,
    responses(
        (status = 200, description = "The turn's answer: one `response` (`id` \
            `resp_<turn id>`, `status`, the text as an `output_text` part of one \
            assistant `message` in `output`, `usage`), or with `stream` the Responses \
            API's events over Server-Sent Events (`response.created`, \
            `response.in_progress`, `response.output_item.added`, \
            `response.content_part.added`, `response.output_text.delta`..., \
            `response.output_text.done`, `response.content_part.done`, \
            `response.output_item.done`, `response.completed`, each with its \
            `sequence_number`); a turn that fails mid-stream ends with `response.failed`. \
            `X-Chat-Id` names the chat. With `background`, at once the response `queued` \
            or `in_progress`, its turn run in the background.", body = Object),
        (status = 400, description = "Not a Responses request, the last input item is \
            not the user's message or has parts other than `input_text`, `input_image` and \
            `input_file`, a file without one of `file_data`, `file_id` or `file_url` or \
            naming no file of the chat, or `instructions` past 16,384 characters or with \
            NUL (`invalid_request`). Every refusal is in OpenAI's shape.",
            body = OpenAiErrorBody),
        (status = 404, description = "`model` names no agent of the team, or \
            `previous_response_id` no response of this agent the caller may see \
            (`not_found`).", body = OpenAiErrorBody),
        TurnRefusals,
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let request: ResponseRequest = decoded(&state, &headers, body).await?;
    let instructions = checked_instructions(request.instructions)?;
    let principal = end_user(principal, request.user)?;
    let agent = agent_for(&state, &principal, &request.model).await?;
    let content = new_content(request.input)?;
    let message = NewMessage {
        parts: new_message_parts(&content)?,
        instructions,
    };
    let chat = match &request.previous_response_id {
        Some(previous) => previous_chat(&state, &principal, agent.id, previous).await?,
        None => {
            let created =
                state
                    .store
                    .create_chat(principal.team, agent.id, principal.user.as_deref());
            bounded(created).await?.id
        }
    };
    if request.background {
        let trigger = trigger_for(&state, &principal, chat, message).await?;
        let parent = crate::api::trace_parent(&headers);
        let started =
            post::post_detached(&state, &principal, chat, trigger, None, parent.as_ref()).await?;
        let turn = match started {
            Detached::Started(row, _) => row.id,
            Detached::Queued(queued) => queued.turn,
        };
        let response = match request.stream {
            true => {
                let row = visible_turn(&state, &principal, turn).await?;
                let mut answer = Answer::of(&state, &principal, &row, Some(request.model)).await?;
                answer.previous = request.previous_response_id;
                answer.activity = Activity::new(tool_activity(&state, &agent).await?);
                followed(&state, &principal, &row, answer).await?
            }
            false => shown(&state, &principal, turn, Some(request.model)).await?,
        };
        return Ok(in_chat(response, chat));
    }
    let activity = Activity::new(tool_activity(&state, &agent).await?);
    let since = Utc::now() - BILLING_SKEW;
    let instructions = message.instructions.clone();
    let (turn, mut body) = launch(&state, &principal, &headers, &agent, chat, message).await?;
    let rate_limit = body.take_rate_limit();
    let mut answer = Answer {
        state,
        team: principal.team,
        turn,
        since,
        model: request.model,
        previous: request.previous_response_id,
        created: Utc::now().timestamp(),
        text: String::new(),
        sequence: 0,
        skip_through: None,
        background: false,
        instructions,
        activity,
    };
    let mut response = if request.stream {
        stream(answer, body_chunks(body))
    } else {
        answer.whole(body).await
    };
    crate::respond::rate_limit(&rate_limit, response.headers_mut());
    Ok(in_chat(response, chat))
}

/// How a turn's stream ended.
enum End {
    /// `completed`, or `incomplete` when the answer hit its length.
    Finished(FinishReason),
    Failed(ErrorCode, String),
}

/// One response's turn, as it is answered.
struct Answer {
    state: AppState,
    team: TeamId,
    turn: TurnId,
    since: DateTime<Utc>,
    model: String,
    previous: Option<String>,
    created: i64,
    /// The answer's text so far.
    text: String,
    /// The next event's `sequence_number`.
    sequence: u64,
    /// A resumed stream's `starting_after`: the events up to it are numbered, not sent.
    skip_through: Option<u64>,
    background: bool,
    /// The caller's instructions for the turn, echoed as OpenAI does.
    instructions: Option<String>,
    /// The agent's tool calls as lines of the text, when its options say so (P13).
    activity: Activity,
}

impl Answer {
    fn item_id(&self) -> String {
        format!("msg_{}", self.turn)
    }

    /// What a chunk adds to the text, and how the turn ended if it did.
    fn take(&mut self, chunk: UiChunk) -> (Option<String>, Option<End>) {
        if let Some(line) = self.activity.line(&chunk, &self.text) {
            self.text.push_str(&line);
            return (Some(line), None);
        }
        match chunk {
            UiChunk::TextDelta { delta, .. } => {
                self.text.push_str(&delta);
                (Some(delta), None)
            }
            UiChunk::Finish { finish_reason } => (None, Some(End::Finished(finish_reason))),
            UiChunk::Error { error_text } => {
                let (code, message) = failure(&error_text);
                (None, Some(End::Failed(code, message)))
            }
            _ => (None, None),
        }
    }

    /// The output text part as it now is.
    fn part(&self) -> Value {
        json!({"type": "output_text", "text": self.text, "annotations": []})
    }

    /// The assistant message item; `done` once the text is whole.
    fn item(&self, done: bool) -> Value {
        let (status, content) = match done {
            true => ("completed", json!([self.part()])),
            false => ("in_progress", json!([])),
        };
        json!({"type": "message", "id": self.item_id(), "status": status,
               "role": "assistant", "content": content})
    }

    /// The `response` object in `status`, with its output and usage once it ended.
    fn response(&self, status: &str, output: Vec<Value>, usage: Option<Value>) -> Value {
        json!({
            "id": format!("{ID_PREFIX}{}", self.turn),
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "usage": usage,
            "error": null,
            "incomplete_details": null,
            "instructions": self.instructions,
            "metadata": {},
            "parallel_tool_calls": false,
            "previous_response_id": self.previous,
            "temperature": null,
            "top_p": null,
            "tool_choice": "auto",
            "tools": [],
            "background": self.background,
        })
    }

    /// The ended response: completed (or incomplete, at its length) with its usage.
    async fn ended(&self, reason: FinishReason) -> Value {
        let (input, output) = tokens(&self.state, self.team, self.turn, self.since).await;
        let usage = json!({
            "input_tokens": input, "output_tokens": output, "total_tokens": input + output,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        });
        match reason {
            FinishReason::Length => {
                let mut r = self.response("incomplete", vec![self.item(true)], Some(usage));
                r["incomplete_details"] = json!({"reason": "max_output_tokens"});
                r
            }
            _ => self.response("completed", vec![self.item(true)], Some(usage)),
        }
    }

    /// The whole answer, once the turn ended.
    async fn whole(&mut self, mut body: UiBody) -> Response {
        let mut end = None;
        // Read to the end, not just to `finish`: dropping the body early would cancel the
        // turn while it records its end (T8).
        while let Some(chunk) = body.next_chunk().await {
            if let (_, Some(ended)) = self.take(chunk) {
                end.get_or_insert(ended);
            }
        }
        match end {
            Some(End::Finished(reason)) => axum::Json(self.ended(reason).await).into_response(),
            Some(End::Failed(code, message)) => error::turn_failed(code, &message),
            None => error::turn_failed(
                ErrorCode::Internal,
                "the turn's stream ended without an answer",
            ),
        }
    }

    /// One event of the stream, its `type` also as the SSE event's name; nothing for an
    /// event a resumed stream's client has (its number still counts).
    fn event(&mut self, kind: &str, mut fields: Value) -> Bytes {
        let sequence = self.sequence;
        self.sequence += 1;
        if self.skip_through.is_some_and(|after| sequence <= after) {
            return Bytes::new();
        }
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(sequence);
        let mut out = format!("event: {kind}\n").into_bytes();
        out.extend_from_slice(&sse::event(None, &fields.to_string()));
        Bytes::from(out)
    }

    /// The events that open the stream: the response, then its one message and part.
    fn opening(&mut self) -> Vec<Bytes> {
        let created = self.response("in_progress", vec![], None);
        let item = self.item(false);
        let part = json!({"type": "output_text", "text": "", "annotations": []});
        let at = self.at();
        vec![
            self.event("response.created", json!({"response": created})),
            self.event("response.in_progress", json!({"response": created})),
            self.event(
                "response.output_item.added",
                json!({"output_index": 0, "item": item}),
            ),
            self.event("response.content_part.added", with(at, "part", part)),
        ]
    }

    /// Where the text part is, as every part event names it.
    fn at(&self) -> Value {
        json!({"item_id": self.item_id(), "output_index": 0, "content_index": 0})
    }

    /// The events that close a stream whose turn ended.
    async fn closing(&mut self, end: End) -> Vec<Bytes> {
        let reason = match end {
            End::Finished(reason) => reason,
            End::Failed(code, message) => {
                let mut failed = self.response("failed", vec![], None);
                failed["error"] = json!({"code": code, "message": message});
                return vec![self.event("response.failed", json!({"response": failed}))];
            }
        };
        let at = self.at();
        let mut done = with(at.clone(), "text", json!(self.text));
        done["logprobs"] = json!([]);
        let part = self.part();
        let item = self.item(true);
        let ended = self.ended(reason).await;
        let last = match ended["status"].as_str() {
            Some("incomplete") => "response.incomplete",
            _ => "response.completed",
        };
        vec![
            self.event("response.output_text.done", done),
            self.event("response.content_part.done", with(at, "part", part)),
            self.event(
                "response.output_item.done",
                json!({"output_index": 0, "item": item}),
            ),
            self.event(last, json!({"response": ended})),
        ]
    }
}

/// The turn a response is: one of the principal's team in a chat it may see, else `404`.
async fn visible_turn(
    state: &AppState,
    principal: &Principal,
    turn: TurnId,
) -> Result<TurnRow, ApiError> {
    let row = match bounded(state.store.turn_row(principal.team, turn)).await {
        Ok(row) => row,
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("response")),
        Err(e) => return Err(e.into()),
    };
    match principal.check_chat(&state.store, row.chat_id).await {
        Ok(()) => Ok(row),
        Err(engine::auth::AuthError::NotFound(_)) => Err(ApiError::NotFound("response")),
        Err(e) => Err(e.into()),
    }
}

impl Answer {
    /// The answer of a turn that was posted earlier (a background one, a response read
    /// again): its times and instructions from the store. `model` is the agent's id unless
    /// the request named it.
    async fn of(
        state: &AppState,
        principal: &Principal,
        row: &TurnRow,
        model: Option<String>,
    ) -> Result<Self, ApiError> {
        let instructions = state.store.turn_instructions(principal.team, row.id);
        Ok(Answer {
            state: state.clone(),
            team: principal.team,
            turn: row.id,
            since: row.started_at - BILLING_SKEW,
            model: model.unwrap_or_else(|| row.agent_id.to_string()),
            previous: None,
            created: row.started_at.timestamp(),
            text: String::new(),
            sequence: 0,
            skip_through: None,
            background: row.background,
            instructions: bounded(instructions).await?,
            // Only a stream shows calls; `followed` sets the agent's choice.
            activity: Activity::new(ToolActivity::None),
        })
    }
}

/// A response as its turn now is (`GET /openai/v1/responses/{id}`): `queued`,
/// `in_progress`, or ended with its text and usage (`completed`, `failed`, `cancelled`
/// for a stopped or withdrawn turn). `model` is the agent's id unless the request named it.
async fn shown(
    state: &AppState,
    principal: &Principal,
    turn: TurnId,
    model: Option<String>,
) -> Result<Response, ApiError> {
    let row = visible_turn(state, principal, turn).await?;
    let mut answer = Answer::of(state, principal, &row, model).await?;
    let status = match row.status {
        TurnProgress::Queued => "queued",
        TurnProgress::Running => "in_progress",
        TurnProgress::Completed | TurnProgress::AwaitingApproval => "completed",
        TurnProgress::Failed => "failed",
        TurnProgress::Interrupted | TurnProgress::Withdrawn => "cancelled",
    };
    let response = match status {
        "completed" | "cancelled" | "failed" => {
            answer.text = stored_text(state, principal.team, turn).await?;
            let mut ended = answer.ended(FinishReason::Stop).await;
            ended["status"] = json!(status);
            if let Some(code) = row.error {
                ended["error"] = json!({"code": code, "message": "the turn failed"});
            }
            ended
        }
        _ => answer.response(status, vec![], None),
    };
    Ok(axum::Json(response).into_response())
}

/// The text parts of a turn's stored answer, joined.
async fn stored_text(state: &AppState, team: TeamId, turn: TurnId) -> Result<String, ApiError> {
    let messages = bounded(state.store.turns_messages(team, &[turn])).await?;
    Ok(messages
        .iter()
        .filter(|m| m.role == "assistant")
        .flat_map(|m| &m.parts)
        .filter_map(|p| match p {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect())
}

/// The `404` of the routes that read or cancel one response: one definition for their
/// `#[utoipa::path]`s. No value of it exists: it only names the answer.
pub enum ResponseNotFound {}

impl utoipa::IntoResponses for ResponseNotFound {
    fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
        let what = "No response of the team the caller may see (`not_found`).";
        BTreeMap::from([("404".to_owned(), error_answer(what).into())])
    }
}

/// The turn a response id in a path names, `404` for anything else.
fn path_turn(id: &str) -> Result<TurnId, ApiError> {
    turn_of(id).ok_or(ApiError::NotFound("response"))
}

/// The query of `GET /openai/v1/responses/{id}`. Open, as OpenAI's own wire is: its SDKs
/// also send `include` and `include_obfuscation`, which change nothing here.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RetrieveParams {
    /// Answer as the Responses API's events, from the turn's start (replayed from the
    /// events stream, S2) and then live until it ends, instead of the response as it is.
    #[serde(default)]
    stream: bool,
    /// With `stream`: only the events after this `sequence_number` (a client resuming a
    /// stream it lost).
    #[serde(default)]
    starting_after: Option<u64>,
}

#[utoipa::path(
    get,
    path = "/openai/v1/responses/{response_id}",
    operation_id = "openai_get_response",
    tag = "openai",
    params(("response_id" = String, Path, description = "`resp_<turn id>`."), RetrieveParams),
    responses(
        (status = 200, description = "The response as its turn now is: `status` \
            `queued`, `in_progress`, `completed`, `failed` or `cancelled` (a stopped or \
            withdrawn turn), with its text and `usage` once ended. With `stream`, the \
            Responses API's events of the turn over Server-Sent Events, numbered as its \
            streamed answer numbered them, those up to `starting_after` left out; a queued \
            turn's once it starts. Closing the stream stops nothing.", body = Object),
        ResponseNotFound,
        (status = 429, description = "With `stream`: the principal, or this replica, \
            has as many followed streams open as allowed (`too_many_observers`).",
            body = OpenAiErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path(response_id): Path<String>,
    QueryParams(params): QueryParams<RetrieveParams>,
) -> Result<Response, ApiError> {
    let turn = path_turn(&response_id)?;
    if !params.stream {
        return shown(&state, &principal, turn, None).await;
    }
    let row = visible_turn(&state, &principal, turn).await?;
    let mut answer = Answer::of(&state, &principal, &row, None).await?;
    answer.skip_through = params.starting_after;
    let options = bounded(state.store.agent_openai(principal.team, row.agent_id)).await?;
    answer.activity = Activity::new(options.tool_activity);
    followed(&state, &principal, &row, answer).await
}

#[utoipa::path(
    post,
    path = "/openai/v1/responses/{response_id}/cancel",
    operation_id = "openai_cancel_response",
    tag = "openai",
    params(("response_id" = String, Path, description = "`resp_<turn id>`.")),
    responses(
        (status = 200, description = "The turn is stopped as `POST /v1/turns/{id}/stop` \
            does (a queued one withdrawn): the response as it then is; a running one \
            shows `cancelled` once its stop is recorded.", body = Object),
        ResponseNotFound,
        (status = 503, description = "The turn runs on another replica and Redis, which \
            carries the stop there, is unavailable (`store_unavailable`).",
            body = OpenAiErrorBody),
    ),
)]
pub async fn cancel(
    State(state): State<AppState>,
    principal: Principal,
    Path(response_id): Path<String>,
) -> Result<Response, ApiError> {
    let turn = path_turn(&response_id)?;
    match stop::stop_turn(&state, &principal, turn).await {
        Err(stop::StopError::NotFound(_)) => return Err(ApiError::NotFound("response")),
        other => other?,
    };
    shown(&state, &principal, turn, None).await
}

/// `fields` with `name` set to `value`.
fn with(mut fields: Value, name: &str, value: Value) -> Value {
    fields[name] = value;
    fields
}

/// A posted turn's own chunks. Dropping them before the turn ended stops it (T8) unless
/// its agent's `disconnect_policy` says otherwise, as on `/v1`.
fn body_chunks(body: UiBody) -> impl Stream<Item = UiChunk> + Send + 'static {
    futures_util::stream::unfold(body, |mut body| async move {
        let chunk = body.next_chunk().await?;
        Some((chunk, body))
    })
}

/// The streamed answer of a turn posted earlier (a background one, a stream resumed):
/// the turn's chunks from the events stream (S2), from its `start`, replayed while it is
/// in the window, then live until its end, as `GET /v1/chats/{id}/stream` follows a turn;
/// a queued turn's once it starts. The same chunks make the same events with the same
/// numbers as the stream of its post. Closing it stops nothing: the turn is detached.
/// A turn whose start left the window is answered from the store: its whole text as one
/// delta, numbered as such.
async fn followed(
    state: &AppState,
    principal: &Principal,
    row: &TurnRow,
    answer: Answer,
) -> Result<Response, ApiError> {
    let viewer = Viewer {
        identity: principal.identity(),
        authority: state.auth.standing(principal),
    };
    let started = u64::try_from(row.started_at.timestamp_millis()).unwrap_or_default();
    let draining = state.draining.clone();
    let turn_stream = state
        .events
        .follow_turn(row.chat_id, row.id, started, draining, viewer)
        .await?;
    let Some(turn_stream) = turn_stream else {
        let chunks = stored_chunks(state, principal.team, row).await?;
        return Ok(stream(answer, futures_util::stream::iter(chunks)));
    };
    let following = Following {
        // Quiet: a stream that cannot go on (the replica drains, the events stream fails)
        // just ends, for the client to resume; an error part would read as the turn's
        // failure.
        stream: turn_stream.quiet(),
        store: state.store.clone(),
        team: principal.team,
        turn: row.id,
        frames: Frames::default(),
        ready: VecDeque::new(),
    };
    Ok(stream(answer, following.chunks()))
}

/// A followed turn's stream read back into its chunks.
struct Following {
    stream: TurnStream,
    store: store::Store,
    team: TeamId,
    turn: TurnId,
    frames: Frames,
    /// Chunks read and not yet given.
    ready: VecDeque<UiChunk>,
}

impl Following {
    fn chunks(self) -> impl Stream<Item = UiChunk> + Send + 'static {
        futures_util::stream::unfold(self, |mut f| async move {
            loop {
                if let Some(chunk) = f.ready.pop_front() {
                    return Some((chunk, f));
                }
                let bytes = match f.stream.next().await? {
                    Resumed::Bytes(bytes) => bytes,
                    // Idle: a turn whose last chunk never reached the events stream (its
                    // replica died) ends here rather than being followed forever; a
                    // queued one is waited for.
                    Resumed::Idle if f.goes_on().await => continue,
                    Resumed::Idle => match f.stream.end_unseen()? {
                        Resumed::Bytes(bytes) => bytes,
                        Resumed::Idle => return None,
                    },
                };
                f.ready.extend(
                    f.frames
                        .push(&bytes)
                        .into_iter()
                        .filter_map(|frame| match frame {
                            Frame::Chunk(chunk) => Some(chunk),
                            Frame::Done => None,
                        }),
                );
            }
        })
    }

    /// Whether the turn is queued or running; unknown (the store did not answer) is yes.
    async fn goes_on(&self) -> bool {
        match bounded(self.store.turn_state(self.team, self.turn)).await {
            Ok(turn) => matches!(turn.status, TurnStatus::Queued | TurnStatus::Running),
            Err(StoreError::NotFound) => false,
            Err(_) => true,
        }
    }
}

/// The chunks an ended turn's stored answer stands for: its text as one delta, then its
/// end (a failure as an error). A running turn's are not stored yet: none.
async fn stored_chunks(
    state: &AppState,
    team: TeamId,
    row: &TurnRow,
) -> Result<Vec<UiChunk>, ApiError> {
    let end = match row.status {
        TurnProgress::Queued | TurnProgress::Running => return Ok(Vec::new()),
        TurnProgress::Failed => UiChunk::Error {
            error_text: format!(
                "{}: the turn failed",
                row.error.unwrap_or(ErrorCode::Internal).as_str()
            ),
        },
        _ => UiChunk::Finish {
            finish_reason: FinishReason::Stop,
        },
    };
    let text = stored_text(state, team, row.id).await?;
    let delta = (!text.is_empty()).then(|| UiChunk::TextDelta {
        id: String::new(),
        delta: text,
    });
    Ok(delta.into_iter().chain([end]).collect())
}

/// The streamed answer: the opening events, a delta per text delta, then the closing
/// events (or `response.failed`). `chunks` are read to their end even after the last
/// event (a posted turn's: dropping them early would stop the turn while it records
/// its end).
fn stream(mut answer: Answer, chunks: impl Stream<Item = UiChunk> + Send + 'static) -> Response {
    let opening = answer.opening();
    struct Reading {
        answer: Answer,
        chunks: std::pin::Pin<Box<dyn Stream<Item = UiChunk> + Send>>,
        ended: bool,
    }
    let reading = Reading {
        answer,
        chunks: Box::pin(chunks),
        ended: false,
    };
    let rest = futures_util::stream::unfold(reading, |mut r| async move {
        loop {
            let chunk = match tokio::time::timeout(KEEP_ALIVE, r.chunks.next()).await {
                Err(_) => return Some((vec![sse::keep_alive()], r)),
                Ok(Some(chunk)) => chunk,
                Ok(None) => return None,
            };
            if r.ended {
                continue;
            }
            let out = match r.answer.take(chunk) {
                (Some(delta), _) => {
                    let mut fields = with(r.answer.at(), "delta", json!(delta));
                    fields["logprobs"] = json!([]);
                    vec![r.answer.event("response.output_text.delta", fields)]
                }
                (None, Some(end)) => {
                    r.ended = true;
                    r.answer.closing(end).await
                }
                (None, None) => continue,
            };
            return Some((out, r));
        }
    });
    let events = futures_util::stream::iter(opening)
        .chain(rest.flat_map(futures_util::stream::iter))
        .filter(|bytes| std::future::ready(!bytes.is_empty()))
        .map(Ok::<_, Infallible>);
    crate::respond::event_stream(Body::from_stream(events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_user_item_is_the_message_and_its_parts_are_chat_parts() {
        let input = json!([
            {"role": "user", "content": "earlier"},
            {"role": "assistant", "content": "ignored"},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
            ]},
        ]);
        assert_eq!(
            new_content(input).unwrap(),
            json!([{"type": "text", "text": "What is this?"},
                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])
        );
        let last_is_assistant = json!([{"role": "assistant", "content": "no"}]);
        assert!(new_content(last_is_assistant).is_err());
        assert!(turn_of("resp_nope").is_none());
        assert!(turn_of("0193a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b").is_none());
    }
}
