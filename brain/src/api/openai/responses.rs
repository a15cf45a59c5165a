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

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use protocol::ui::{FinishReason, UiChunk};
use protocol::{AgentId, ChatId, ErrorCode, TeamId, TurnId};
use serde::Deserialize;
use serde_json::{Value, json};

use super::chat::{
    BILLING_SKEW, KEEP_ALIVE, NewMessage, checked_instructions, decoded, end_user, failure,
    in_chat, is_agents_chat, launch, new_message_parts, tokens, trigger_for,
};
use super::error::{self, OpenAiErrorBody};
use super::models::agent_for;
use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use engine::sse;
use engine::turn::post::{self, Detached};
use engine::turn::stop;
use engine::turn::ui_stream::UiBody;
use protocol::parts::Part;
use store::{StoreError, TurnProgress, bounded};

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
                _ => Err(invalid(
                    "the new message may only have `input_text` and `input_image` parts",
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
            not the user's message or has parts other than `input_text` and \
            `input_image`, `instructions` past 16,384 characters or with NUL, or \
            `background` with `stream` (`invalid_request`). Every refusal is in OpenAI's shape.",
            body = OpenAiErrorBody),
        (status = 401, description = "Missing or refused credentials (`unauthorized`).",
            body = OpenAiErrorBody),
        (status = 404, description = "`model` names no agent of the team, or \
            `previous_response_id` no response of this agent the caller may see \
            (`not_found`).", body = OpenAiErrorBody),
        (status = 409, description = "The agent is busy and its policy rejects (or \
            enqueues) (`agent_busy`).", body = OpenAiErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).",
            body = OpenAiErrorBody),
        (status = 429, description = "A quota or the rate limit refused the turn \
            (`quota_exceeded`, `rate_limited`), with `Retry-After`.", body = OpenAiErrorBody),
        (status = 502, description = "A turn that was not streamed failed after it \
            started; `code` is its error code.", body = OpenAiErrorBody),
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
    if request.background && request.stream {
        return Err(ApiError::InvalidRequest(
            "background and stream together are not supported: poll the response".into(),
        ));
    }
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
        let response = shown(&state, &principal, turn, Some(request.model)).await?;
        return Ok(in_chat(response, chat));
    }
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
        background: false,
        instructions,
    };
    let mut response = if request.stream {
        stream(answer, body)
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
    background: bool,
    /// The caller's instructions for the turn, echoed as OpenAI does.
    instructions: Option<String>,
}

impl Answer {
    fn item_id(&self) -> String {
        format!("msg_{}", self.turn)
    }

    /// What a chunk adds to the text, and how the turn ended if it did.
    fn take(&mut self, chunk: UiChunk) -> (Option<String>, Option<End>) {
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

    /// One event of the stream, its `type` also as the SSE event's name.
    fn event(&mut self, kind: &str, mut fields: Value) -> Bytes {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
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

/// A response as its turn now is (`GET /openai/v1/responses/{id}`): `queued`,
/// `in_progress`, or ended with its text and usage (`completed`, `failed`, `cancelled`
/// for a stopped or withdrawn turn). `model` is the agent's id unless the request named it.
async fn shown(
    state: &AppState,
    principal: &Principal,
    turn: TurnId,
    model: Option<String>,
) -> Result<Response, ApiError> {
    let row = match bounded(state.store.turn_row(principal.team, turn)).await {
        Ok(row) => row,
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("response")),
        Err(e) => return Err(e.into()),
    };
    match principal.check_chat(&state.store, row.chat_id).await {
        Ok(()) => {}
        Err(engine::auth::AuthError::NotFound(_)) => return Err(ApiError::NotFound("response")),
        Err(e) => return Err(e.into()),
    }
    let mut answer = Answer {
        state: state.clone(),
        team: principal.team,
        turn,
        since: row.started_at - BILLING_SKEW,
        model: model.unwrap_or_else(|| row.agent_id.to_string()),
        previous: None,
        created: row.started_at.timestamp(),
        text: String::new(),
        sequence: 0,
        background: row.background,
        instructions: bounded(state.store.turn_instructions(principal.team, turn)).await?,
    };
    let status = match row.status {
        TurnProgress::Queued => "queued",
        TurnProgress::Running => "in_progress",
        TurnProgress::Completed | TurnProgress::AwaitingApproval => "completed",
        TurnProgress::Failed => "failed",
        TurnProgress::Interrupted | TurnProgress::Withdrawn => "cancelled",
    };
    let response = match status {
        "completed" | "cancelled" | "failed" => {
            let messages = bounded(state.store.turns_messages(principal.team, &[turn])).await?;
            answer.text = messages
                .iter()
                .filter(|m| m.role == "assistant")
                .flat_map(|m| &m.parts)
                .filter_map(|p| match p {
                    Part::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
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

/// The turn a response id in a path names, `404` for anything else.
fn path_turn(id: &str) -> Result<TurnId, ApiError> {
    turn_of(id).ok_or(ApiError::NotFound("response"))
}

#[utoipa::path(
    get,
    path = "/openai/v1/responses/{response_id}",
    operation_id = "openai_get_response",
    tag = "openai",
    params(("response_id" = String, Path, description = "`resp_<turn id>`.")),
    responses(
        (status = 200, description = "The response as its turn now is: `status` \
            `queued`, `in_progress`, `completed`, `failed` or `cancelled` (a stopped or \
            withdrawn turn), with its text and `usage` once ended.", body = Object),
        (status = 401, description = "Missing or refused credentials (`unauthorized`).",
            body = OpenAiErrorBody),
        (status = 404, description = "No response of the team the caller may see \
            (`not_found`).", body = OpenAiErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path(response_id): Path<String>,
) -> Result<Response, ApiError> {
    shown(&state, &principal, path_turn(&response_id)?, None).await
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
        (status = 401, description = "Missing or refused credentials (`unauthorized`).",
            body = OpenAiErrorBody),
        (status = 404, description = "No response of the team the caller may see \
            (`not_found`).", body = OpenAiErrorBody),
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
    let found = match stop::find(&state.store, principal.team, turn).await {
        Err(stop::StopError::NotFound(_)) => return Err(ApiError::NotFound("response")),
        other => other?,
    };
    match principal.check_chat(&state.store, found.chat).await {
        Ok(()) => {}
        Err(engine::auth::AuthError::NotFound(_)) => return Err(ApiError::NotFound("response")),
        Err(e) => return Err(e.into()),
    }
    stop::stop(&state, principal.team, found).await?;
    shown(&state, &principal, turn, None).await
}

/// `fields` with `name` set to `value`.
fn with(mut fields: Value, name: &str, value: Value) -> Value {
    fields[name] = value;
    fields
}

/// The streamed answer: the opening events, a delta per text delta, then the closing
/// events (or `response.failed`). The turn's stream is read to its end even after the
/// last event.
fn stream(mut answer: Answer, body: UiBody) -> Response {
    let opening = answer.opening();
    struct Reading {
        answer: Answer,
        body: UiBody,
        ended: bool,
    }
    let reading = Reading {
        answer,
        body,
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
