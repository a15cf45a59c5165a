//! `POST /agui/{agent_id}`: an AG-UI run (P3). The `threadId` is a chat of the
//! agent: the team's chat of that id, else one derived from the team and the thread
//! (`ChatId::of_thread`, created on first use, owned by the principal), so another team's
//! chat of that id is never met; the last user message of
//! `messages` is posted through the same path as `POST /v1/chats/{id}/messages`
//! (`engine::turn::post`: principal, quotas, busy policy, approvals), and the turn's stream is
//! answered as AG-UI events (`crate::agui`).
//!
//! Refused before the stream, as an HTTP error with our `ErrorBody`: credentials, a body
//! that is not a run input, a thread that is not a visible chat of this agent. Refused as
//! a run, with one `RUN_ERROR` carrying our stable code (and the `Retry-After` /
//! `RateLimit` headers the HTTP answer would carry): everything the posting path refuses
//! once the input is valid (quotas, the busy agent, an overloaded replica).

use axum::extract::{Path, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderName};
use axum::response::{IntoResponse, Response};
use protocol::ErrorBody;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::openapi::RefOr;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use uuid::Uuid;

use super::chats::PostMessage;
use super::{JsonBody, parse_id};
use crate::AppState;
use crate::agui::{AguiBody, EVENT_TYPES, Interrupt, Translator, refused};
use crate::error::ApiError;
use engine::auth::Principal;
use engine::turn::Trigger;
use engine::turn::answer;
use engine::turn::post::{self, Posted};
use protocol::{AgentId, ChatId};
use store::{Answer, bounded};

/// The most waiting approvals a run reads to answer as interrupts.
const MAX_PENDING: i64 = 200;
/// The AG-UI `RunAgentInput`. Open, as the protocol's own schema is: fields this server
/// does not read are ignored rather than refused, so a newer client still runs.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({
    "threadId": "0b6f3c2e-4d1a-4f7e-9a35-2f4f1c9d8e21",
    "runId": "run-1",
    "messages": [{"id": "msg-1", "role": "user", "content": "What changed since yesterday?"}],
    "tools": [], "context": [], "state": {}, "forwardedProps": {}
}))]
pub struct RunAgentInput {
    /// The chat: a UUID, created for this agent on first use.
    thread_id: String,
    /// The client's id of this run, echoed in `RUN_STARTED` and `RUN_FINISHED`.
    run_id: String,
    /// The client's transcript. Only the last message is read, and only when it is the
    /// user's: it is the new input. The history the model sees is the chat's own.
    #[serde(default)]
    #[schema(value_type = Vec<Value>)]
    messages: Vec<InputMessage>,
    /// Answers to the interrupts (pending approvals) a previous run ended with; a run
    /// with `resume` posts no message.
    #[serde(default)]
    resume: Vec<ResumeEntry>,
    /// Front-end tools: not offered to the model (the agent's tools are the runtime's).
    #[serde(default, rename = "tools")]
    #[schema(value_type = Vec<Value>)]
    _tools: serde::de::IgnoredAny,
    /// Not read: the model sees the chat, not the client's context.
    #[serde(default, rename = "context")]
    #[schema(value_type = Vec<Value>)]
    _context: serde::de::IgnoredAny,
    /// Not read: the agent's state is the runtime's (`STATE_SNAPSHOT`).
    #[serde(default, rename = "state")]
    #[schema(value_type = Value)]
    _state: serde::de::IgnoredAny,
    /// Not read.
    #[serde(default, rename = "forwardedProps")]
    #[schema(value_type = Value)]
    _forwarded_props: serde::de::IgnoredAny,
}

/// A message of `messages`; only the last one's are read.
#[derive(Debug, Deserialize)]
struct InputMessage {
    id: String,
    role: String,
    /// A string, or (user messages) an array of content parts of which only `text` ones
    /// are accepted.
    #[serde(default)]
    content: Value,
}

/// An answer to one interrupt.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResumeEntry {
    /// The approval's id (the interrupt's `id`).
    interrupt_id: String,
    /// `resolved` approves unless `payload.approved` is `false`; `cancelled` denies.
    status: String,
    /// `{"approved": bool, "reason": string}`, both optional.
    #[serde(default)]
    #[schema(value_type = Value)]
    payload: Value,
}

impl RunAgentInput {
    fn trigger(self, max_chars: usize) -> Result<Trigger, ApiError> {
        let invalid = |m: &str| ApiError::InvalidRequest(m.to_owned());
        if !self.resume.is_empty() {
            return self
                .resume
                .into_iter()
                .map(ResumeEntry::answer)
                .collect::<Result<Vec<_>, _>>()
                .map(Trigger::Approval);
        }
        let last = self
            .messages
            .into_iter()
            .next_back()
            .ok_or_else(|| invalid("messages is empty"))?;
        if last.role != "user" {
            return Err(invalid(
                "the last message must have role `user` (or answer interrupts with `resume`)",
            ));
        }
        let content = match last.content {
            Value::String(text) => text,
            Value::Array(parts) => {
                let mut text = String::new();
                for part in parts {
                    match (part.get("type").and_then(Value::as_str), part.get("text")) {
                        (Some("text"), Some(Value::String(t))) => text.push_str(t),
                        _ => return Err(invalid("the new message may only have text parts")),
                    }
                }
                text
            }
            _ => return Err(invalid("the new message has no text content")),
        };
        PostMessage::user_trigger(content, Some(last.id), max_chars)
    }
}

impl ResumeEntry {
    fn answer(self) -> Result<Answer, ApiError> {
        let id = Uuid::parse_str(&self.interrupt_id).map_err(|_| {
            ApiError::InvalidRequest("resume: interruptId is not one of ours".into())
        })?;
        let reason = match self.payload.get("reason") {
            None | Some(Value::Null) => None,
            Some(Value::String(r)) => Some(r.clone()),
            Some(_) => {
                return Err(ApiError::InvalidRequest(
                    "resume: payload.reason must be a string".into(),
                ));
            }
        };
        let approved = match (self.status.as_str(), self.payload.get("approved")) {
            ("cancelled", _) => false,
            ("resolved", None | Some(Value::Null)) => true,
            ("resolved", Some(Value::Bool(approved))) => *approved,
            ("resolved", Some(_)) => {
                return Err(ApiError::InvalidRequest(
                    "resume: payload.approved must be a boolean".into(),
                ));
            }
            _ => {
                return Err(ApiError::InvalidRequest(
                    "resume: status must be `resolved` or `cancelled`".into(),
                ));
            }
        };
        Ok(answer::tool_call(id, approved, reason)?)
    }
}

/// One event of an AG-UI run's `text/event-stream` body, as OpenAPI 3.1 describes one:
/// its `data` is a JSON AG-UI event (`contentSchema`), named by its `type`.
pub enum AguiStreamEvent {}

impl utoipa::PartialSchema for AguiStreamEvent {
    fn schema() -> RefOr<Schema> {
        let event = json!({
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"type": "string", "enum": EVENT_TYPES}},
        });
        let mut content = Extensions::default();
        content.insert("contentSchema".into(), event);
        let data = ObjectBuilder::new()
            .schema_type(Type::String)
            .content_media_type("application/json")
            .extensions(Some(content));
        ObjectBuilder::new()
            .property("data", data)
            .required("data")
            .property("event", ObjectBuilder::new().schema_type(Type::String))
            .into()
    }
}

impl utoipa::ToSchema for AguiStreamEvent {}

/// The longest `runId` echoed back.
const MAX_RUN_ID: usize = 200;

#[utoipa::path(
    post,
    path = "/agui/{agent_id}",
    operation_id = "agui_run",
    tag = "agui",
    params(("agent_id" = Uuid, Path, description = "The agent to run.")),
    request_body = RunAgentInput,
    responses(
        (status = 200, description = "The run as AG-UI events over Server-Sent Events \
            (`data: <event>`): `RUN_STARTED`, `STEP_STARTED`/`STEP_FINISHED` per model call, \
            `TEXT_MESSAGE_*`, `TOOL_CALL_*` with `TOOL_CALL_RESULT`, `STATE_SNAPSHOT` (the \
            turn, its connectors and worker), `CUSTOM` (`notice`, `worker_log`), then \
            `RUN_FINISHED` (outcome `success`, `interrupt` with the pending approvals, or \
            `cancelled`) or `RUN_ERROR` (`code` is our stable error code). A run the \
            posting path refuses (a quota, the busy agent, an overloaded replica) is one \
            `RUN_ERROR` with that refusal's code and its `Retry-After` / `RateLimit` \
            headers. Closing the stream stops the turn (T8) unless the agent's \
            `disconnect_policy` is `continue`.",
            content_type = "text/event-stream", body = AguiStreamEvent),
        (status = 400, description = "Not a run input, `threadId` is not a UUID, or the \
            new message is missing, empty, too long, not text, or a resume entry is \
            malformed (`invalid_request`).", body = ErrorBody),
        (status = 401, description = "Missing or refused credentials (`unauthorized`).",
            body = ErrorBody),
        (status = 404, description = "No such agent in the team, or `threadId` is a chat \
            of another agent or one the caller may not see (`not_found`).", body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).",
            body = ErrorBody),
    ),
)]
pub async fn run(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
    headers: HeaderMap,
    JsonBody(input): JsonBody<RunAgentInput>,
) -> Result<Response, ApiError> {
    let agent: AgentId = parse_id(&agent_id, "agent")?;
    let thread = input.thread_id.clone();
    let run_id = input.run_id.clone();
    if run_id.is_empty() || run_id.len() > MAX_RUN_ID {
        return Err(ApiError::InvalidRequest(format!(
            "runId must have 1 to {MAX_RUN_ID} bytes"
        )));
    }
    let thread_id: ChatId = thread
        .parse()
        .map_err(|_| ApiError::InvalidRequest("threadId must be a UUID".into()))?;
    let trigger = input.trigger(state.config.max_message_chars)?;
    let opened = bounded(state.store.open_chat(
        principal.team,
        agent,
        thread_id,
        principal.user.as_deref(),
    ))
    .await;
    let chat = match opened {
        Ok(row) if row.agent_id == agent => row.id,
        Ok(_) | Err(store::StoreError::NotFound) => {
            return Err(ApiError::NotFound("agent or thread"));
        }
        Err(e) => return Err(e.into()),
    };
    principal.check_chat(&state.store, chat).await?;
    let parent = super::trace_parent(&headers);
    let mut translator = Translator::new(thread, run_id);
    let posted = match trigger {
        Trigger::Approval(answers) => {
            answer::resume(&state, &principal, chat, answers, parent.as_ref()).await
        }
        trigger => {
            let parent = parent.as_ref();
            post::post(&state, &principal, chat, trigger, None, false, parent).await
        }
    };
    let body = match posted {
        Ok(Posted::Launched(launched)) => match launched.body {
            Some(turn) => AguiBody::live(translator, turn.until(state.auth.standing(&principal))),
            // Answers that leave other approvals waiting start nothing yet.
            None => {
                let events = translator.waiting(pending(&state, &principal, chat).await?);
                AguiBody::of(translator, events)
            }
        },
        Ok(Posted::Queued(queued)) => {
            let events = translator.queued(queued.turn.to_string(), queued.position);
            AguiBody::of(translator, events)
        }
        Err(err) => refusal(err.into()),
    };
    Ok(body.into_response())
}

/// The chat's approvals still waiting, as interrupts.
async fn pending(
    state: &AppState,
    principal: &Principal,
    chat: ChatId,
) -> Result<Vec<Interrupt>, ApiError> {
    // The waiting calls of a chat are those of its latest turn: far fewer than a page.
    let approvals = state
        .store
        .chat_approvals(principal.team, chat, true, None, MAX_PENDING);
    Ok(bounded(approvals)
        .await?
        .into_iter()
        .map(|a| Interrupt {
            expires_at: Some(a.expires_at.to_rfc3339()),
            ..Interrupt::approval(a.id.to_string(), a.tool_call_id, &a.tool)
        })
        .collect())
}

/// The posting path's refusal as a run: its code and message, and the headers its HTTP
/// answer would have carried (`error.rs` decides them).
fn refusal(err: ApiError) -> AguiBody {
    let code = err.code();
    let message = err.public_message();
    let answer = err.into_response();
    let mut headers = HeaderMap::new();
    for name in [
        RETRY_AFTER,
        HeaderName::from_static("ratelimit-policy"),
        HeaderName::from_static("ratelimit"),
    ] {
        if let Some(value) = answer.headers().get(&name) {
            headers.insert(name, value.clone());
        }
    }
    refused(code.as_str(), message, headers)
}
