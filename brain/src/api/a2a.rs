//! A2A 1.0 (P1): `GET /a2a/{agent_id}/.well-known/agent-card.json`, the agent's card, and
//! `POST /a2a/{agent_id}`, its JSON-RPC interface. A front end of the HTTP API: a
//! message goes through `engine::turn::post` (`post` / `post_detached`) as `POST
//! /v1/chats/{id}/messages` does (same principal, quotas, busy policy, approvals), a
//! stream follows the turn's own stream or, for `SubscribeToTask`, its events
//! (`engine::events::follow`). The translation is in `crate::a2a`.
//!
//! Both routes take the same bearer as `/v1` (an API key or a user token): an agent id
//! is its team's, so the card, which names the agent and describes it from its system
//! prompt, is shown only to principals that may read the agent. Authentication failures
//! are HTTP `401` with our error body, before any JSON-RPC; everything after is a JSON-RPC
//! answer (HTTP `200`).

use std::convert::Infallible;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use protocol::{ChatId, ErrorBody, TurnId};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::chats::PostMessage;
use super::{paging, parse_id};
use crate::AppState;
use crate::a2a::errors::{self, rpc};
use crate::a2a::stream::{Frame, Frames, Translator};
use crate::a2a::wire::{
    ListParams, ListPushConfigsResponse, ListTasksResponse, PushConfig, PushConfigParams, RpcError,
    RpcRequest, RpcResponse, SendParams, StreamResponse, TaskParams, TaskState,
};
use crate::a2a::{card, push, task};
use crate::error::ApiError;
use engine::auth::{Principal, Scope};
use engine::events::follow::{self, EarlyEnd, Following};
use engine::sse;
use engine::turn::post::{self, Detached, Posted};
use engine::turn::{Trigger, stop};
use store::{AgentRow, CALL_BOUND, SecretsError, StoreError, TaskFilter, TurnRow, bounded};

/// How long `CancelTask` waits for the stopped turn to end before answering it as it is.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// `ListTasks`' page size when the client gives none, and its bounds.
const DEFAULT_PAGE: i32 = 50;
const MAX_PAGE: i32 = 100;

/// The `ListTasks` page token names the last turn of a page.
const TASKS_CURSOR: &str = "a2a1:";

/// The A2A-Version header, and the versions this server speaks.
const VERSION_HEADER: &str = "a2a-version";

#[utoipa::path(
    get,
    path = "/a2a/{agent_id}/.well-known/agent-card.json",
    operation_id = "a2a_agent_card",
    tag = "a2a",
    params(("agent_id" = Uuid, Path, description = "The agent.")),
    responses(
        (status = 200, description = "The agent's A2A 1.0 agent card: its name, a \
            description (the first paragraph of its system prompt), one `chat` skill, its \
            capabilities, the JSON-RPC interface `POST /a2a/{agent_id}` (described by the \
            A2A specification, https://a2a-protocol.org/latest/specification/, not here) and \
            a bearer security scheme (the team's API keys and user tokens).",
            body = Object),
        (status = 401, description = "No or refused credentials (`unauthorized`).",
            body = ErrorBody),
        (status = 404, description = "No such agent in the team, or an archived one \
            (`not_found`).", body = ErrorBody),
        (status = 503, description = "The store is unavailable (`store_unavailable`).",
            body = ErrorBody),
    ),
)]
pub async fn agent_card(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let agent = agent_of(&state, &principal, &agent_id).await?;
    let base = state.config.oauth.public_url.trim_end_matches('/');
    let url = format!("{base}/a2a/{}", agent.id);
    let push = state.store.secrets_configured();
    Ok(Json(card::card(&agent, &url, base, push)))
}

/// The principal's team's agent `raw`, not archived.
async fn agent_of(
    state: &AppState,
    principal: &Principal,
    raw: &str,
) -> Result<AgentRow, ApiError> {
    let id = parse_id(raw, "agent")?;
    match bounded(state.store.agent(principal.team, id)).await {
        Ok(agent) if !agent.archived => Ok(agent),
        Ok(_) | Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

/// `POST /a2a/{agent_id}`: one JSON-RPC request (batches are not part of A2A).
pub async fn rpc_endpoint(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let agent = agent_of(&state, &principal, &agent_id).await?;
    let max = state.config.max_body_bytes;
    let bytes = axum::body::to_bytes(body, max)
        .await
        .map_err(|_| ApiError::PayloadTooLarge(max))?;
    let call = Call {
        parent: super::trace_parent(&headers),
        state,
        principal,
        agent,
    };
    let (id, request) = match decode(&bytes) {
        Ok(decoded) => decoded,
        Err((id, error)) => return Ok(answer(RpcResponse::err(id, error))),
    };
    if let Some(refused) = version_refused(&headers) {
        return Ok(answer(RpcResponse::err(id, refused)));
    }
    let params = request.params.unwrap_or(Value::Null);
    let result = match request.method.as_str() {
        "SendMessage" => call.send(params).await,
        "SendStreamingMessage" => return Ok(call.send_streaming(id, params).await),
        "SubscribeToTask" => return Ok(call.subscribe(id, params).await),
        "GetTask" => call.get_task(params).await,
        "ListTasks" => call.list_tasks(params).await,
        "CancelTask" => call.cancel_task(params).await,
        "CreateTaskPushNotificationConfig" => call.create_push(params).await,
        "GetTaskPushNotificationConfig" => call.get_push(params).await,
        "ListTaskPushNotificationConfigs" => call.list_push(params).await,
        "DeleteTaskPushNotificationConfig" => call.delete_push(params).await,
        "GetExtendedAgentCard" => Err(rpc(-32007, "this agent has no extended card")),
        other => Err(rpc(
            errors::METHOD_NOT_FOUND,
            format!("no method {other:?} in A2A 1.0's JSON-RPC binding"),
        )),
    };
    Ok(answer(match result {
        Ok(value) => RpcResponse::ok(id, value),
        Err(error) => RpcResponse::err(id, error),
    }))
}

/// The request's id and the request, or the error to answer.
fn decode(bytes: &Bytes) -> Result<(Value, RpcRequest), (Value, RpcError)> {
    let value: Value = serde_json::from_slice(bytes).map_err(|_| {
        (
            Value::Null,
            rpc(errors::PARSE_ERROR, "the body is not JSON"),
        )
    })?;
    let id = value.get("id").cloned().unwrap_or(Value::Null);
    let request: RpcRequest = serde_json::from_value(value).map_err(|e| {
        (
            id.clone(),
            rpc(
                errors::INVALID_REQUEST,
                format!("not a JSON-RPC request: {e}"),
            ),
        )
    })?;
    if request.jsonrpc != "2.0" {
        return Err((id, rpc(errors::INVALID_REQUEST, "jsonrpc must be \"2.0\"")));
    }
    if !matches!(id, Value::String(_) | Value::Number(_)) {
        return Err((
            Value::Null,
            rpc(errors::INVALID_REQUEST, "id must be a string or a number"),
        ));
    }
    Ok((id, request))
}

/// A2A 1.0 only: a request that asks for another major.minor version is refused. A
/// request without the header is read as 1.0 (the official SDKs send it).
fn version_refused(headers: &HeaderMap) -> Option<RpcError> {
    let asked = headers.get(VERSION_HEADER)?.to_str().unwrap_or("");
    let mut parts = asked.trim().split('.');
    let major_minor = (parts.next(), parts.next());
    if major_minor == (Some("1"), Some("0")) {
        return None;
    }
    Some(rpc(
        errors::VERSION_NOT_SUPPORTED,
        format!("A2A version {asked:?} is not supported; this server speaks 1.0"),
    ))
}

fn answer(response: RpcResponse) -> Response {
    Json(response).into_response()
}

fn params<T: DeserializeOwned>(value: Value) -> Result<T, RpcError> {
    serde_json::from_value(value)
        .map_err(|e| rpc(errors::INVALID_PARAMS, format!("invalid params: {e}")))
}

fn to_value(value: impl serde::Serialize) -> Result<Value, RpcError> {
    serde_json::to_value(value).map_err(|_| rpc(errors::INTERNAL, "internal error"))
}

fn api(err: ApiError) -> RpcError {
    errors::from_api(&err)
}

/// A push config call of the store, bounded as every store call is, its failure as A2A's;
/// `bound` is the team's pending pushes' (`BRAIN_A2A_MAX_PENDING_PUSHES_PER_TEAM`).
async fn sealed<T>(
    call: impl std::future::Future<Output = Result<T, SecretsError>>,
    bound: i64,
) -> Result<T, RpcError> {
    let result = tokio::time::timeout(CALL_BOUND, call)
        .await
        .unwrap_or(Err(SecretsError::Store(StoreError::TimedOut)));
    result.map_err(|err| match err {
        SecretsError::NotConfigured => errors::push_not_supported(),
        SecretsError::Store(StoreError::Conflict(_)) => rpc(
            errors::INVALID_PARAMS,
            format!(
                "a task keeps at most {} push notification configs",
                push::MAX_PER_TASK
            ),
        ),
        SecretsError::Store(e) => api(e.into()),
        // Only keeping a config counts the team's pending pushes (`Store::put_push_config`).
        SecretsError::TooMany => api(ApiError::PushBacklogFull(bound)),
        SecretsError::Crypto => api(ApiError::Internal(
            "a push notification config could not be sealed".into(),
        )),
    })
}

fn task_not_found() -> RpcError {
    rpc(errors::TASK_NOT_FOUND, "no such task of this agent")
}

/// One request's context.
struct Call {
    state: AppState,
    principal: Principal,
    agent: AgentRow,
    parent: Option<logging::traces::TraceContext>,
}

/// A message, ready to post: its chat and its trigger.
struct Posting {
    chat: ChatId,
    trigger: Trigger,
    params: SendParams,
}

impl Call {
    /// The task `raw` of this agent, in a chat the principal may see.
    async fn visible_task(&self, raw: &str) -> Result<TurnRow, RpcError> {
        let turn: TurnId = raw.parse().map_err(|_| task_not_found())?;
        let row = match bounded(self.state.store.turn_row(self.principal.team, turn)).await {
            Ok(row) => row,
            Err(StoreError::NotFound) => return Err(task_not_found()),
            Err(e) => return Err(api(e.into())),
        };
        if row.agent_id != self.agent.id {
            return Err(task_not_found());
        }
        match self
            .principal
            .check_chat(&self.state.store, row.chat_id)
            .await
        {
            Ok(()) => Ok(row),
            Err(engine::auth::AuthError::NotFound(_)) => Err(task_not_found()),
            Err(e) => Err(api(e.into())),
        }
    }

    /// The chat `contextId` names (one of this agent's the principal may see), or a new
    /// one when it names none.
    async fn context(&self, context_id: Option<&str>) -> Result<ChatId, RpcError> {
        let team = self.principal.team;
        let Some(raw) = context_id.filter(|c| !c.is_empty()) else {
            let created = bounded(self.state.store.create_chat(
                team,
                self.agent.id,
                self.principal.user.as_deref(),
            ))
            .await;
            return created.map(|chat| chat.id).map_err(|e| api(e.into()));
        };
        let unknown = || {
            rpc(
                errors::INVALID_PARAMS,
                "contextId is not a context of this agent; omit it to start one",
            )
        };
        let chat: ChatId = raw.parse().map_err(|_| unknown())?;
        if let Err(e) = self.principal.check_chat(&self.state.store, chat).await {
            return Err(match e {
                engine::auth::AuthError::NotFound(_) => unknown(),
                other => api(other.into()),
            });
        }
        match bounded(self.state.store.chat_with_agent(team, chat)).await {
            Ok(basis) if basis.chat.agent_id == self.agent.id => Ok(chat),
            Ok(_) | Err(StoreError::NotFound) => Err(unknown()),
            Err(e) => Err(api(e.into())),
        }
    }

    /// Checks a `SendMessage`'s message and finds its chat; the text is checked by the
    /// posting path's own rules (`PostMessage::into_trigger`).
    async fn posting(&self, value: Value) -> Result<Posting, RpcError> {
        let params: SendParams = params(value)?;
        // Refused before the turn starts, not after.
        let configuration = params.configuration.as_ref();
        if configuration.is_some_and(|c| c.task_push_notification_config.is_some()) {
            if !self.state.store.secrets_configured() {
                return Err(errors::push_not_supported());
            }
            // The config is counted again when it is kept; this spares the turn a team
            // whose backlog is already full.
            let bound = self.push_bound();
            let pending = self.state.store.pending_pushes(self.principal.team, bound);
            if bounded(pending).await.map_err(|e| api(e.into()))? >= bound {
                return Err(api(ApiError::PushBacklogFull(bound)));
            }
        }
        let message = &params.message;
        if message.role != crate::a2a::wire::Role::User {
            return Err(rpc(
                errors::INVALID_PARAMS,
                "message.role must be ROLE_USER",
            ));
        }
        if message.task_id.as_deref().is_some_and(|t| !t.is_empty()) {
            return Err(rpc(
                errors::UNSUPPORTED_OPERATION,
                "a message to an existing task is not supported: each message is a task of \
                 its context (answer approvals with POST /v1/approvals/{id})",
            ));
        }
        let mut content = String::new();
        for part in &message.parts {
            match &part.text {
                Some(text) if part.raw.is_none() && part.url.is_none() && part.data.is_none() => {
                    content.push_str(text)
                }
                _ => {
                    return Err(rpc(
                        errors::CONTENT_TYPE_NOT_SUPPORTED,
                        "only text parts are accepted",
                    ));
                }
            }
        }
        let message_id = (!message.message_id.is_empty()).then(|| message.message_id.clone());
        let plain = serde_json::from_value(json!({"content": content, "message_id": message_id}))
            .map_err(|e| rpc(errors::INVALID_PARAMS, e.to_string()))?;
        let trigger = PostMessage::Plain(plain)
            .into_trigger(self.state.config.max_message_chars)
            .map_err(api)?;
        let chat = self.context(message.context_id.as_deref()).await?;
        Ok(Posting {
            chat,
            trigger,
            params,
        })
    }

    /// Keeps the push config a `SendMessage` carried, for its task.
    async fn keep_push(&self, params: &SendParams, turn: TurnId) -> Result<(), RpcError> {
        let config = params
            .configuration
            .as_ref()
            .and_then(|c| c.task_push_notification_config.clone());
        let Some(config) = config else {
            return Ok(());
        };
        self.store_push(turn, config).await.map(|_| ())
    }

    async fn store_push(&self, turn: TurnId, config: PushConfig) -> Result<PushConfig, RpcError> {
        let config = push::validate(turn, config).map_err(|m| rpc(errors::INVALID_PARAMS, m))?;
        let bound = self.push_bound();
        let team = self.principal.team;
        let kept = self
            .state
            .store
            .put_push_config(team, &config, push::MAX_PER_TASK, bound);
        sealed(kept, bound).await?;
        Ok(push::shown(config))
    }

    fn push_bound(&self) -> i64 {
        self.state.config.webhooks.max_pending_pushes_per_team
    }

    /// `SendMessage`: the turn's task once it ended (or waits for a person), or at once
    /// with `returnImmediately` (the turn then runs in the background, D1).
    async fn send(&self, value: Value) -> Result<Value, RpcError> {
        let Posting {
            chat,
            trigger,
            params,
        } = self.posting(value).await?;
        let immediately = params
            .configuration
            .as_ref()
            .is_some_and(|c| c.return_immediately);
        let (state, principal, parent) = (&self.state, &self.principal, self.parent.as_ref());
        if immediately {
            let detached = post::post_detached(state, principal, chat, trigger, None, parent)
                .await
                .map_err(|e| api(e.into()))?;
            let (turn, progress) = match detached {
                Detached::Started(row, _) => (row.id, row.status),
                Detached::Queued(queued) => (queued.turn, store::TurnProgress::Queued),
            };
            self.keep_push(&params, turn).await?;
            let task = task::bare(
                turn,
                chat,
                task::state_of(progress),
                Some(chrono::Utc::now()),
            );
            return to_value(json!({"task": task}));
        }
        let launched = match post::post(state, principal, chat, trigger, None, false, parent).await
        {
            Ok(Posted::Launched(launched)) => launched,
            Ok(Posted::Queued(queued)) => {
                self.keep_push(&params, queued.turn).await?;
                let task = task::bare(queued.turn, chat, TaskState::Submitted, None);
                return to_value(json!({"task": task}));
            }
            Err(err) => match err.in_progress() {
                // T12: a retried messageId whose turn still runs: that turn, as it is.
                Some(running) => {
                    let row = self.visible_task(&running.to_string()).await?;
                    return to_value(json!({"task": task::of_turn(&row, &[], None, false)}));
                }
                None => return Err(api(err.into())),
            },
        };
        let (Some(turn), Some(body)) = (launched.turn, launched.body) else {
            return Err(rpc(errors::INTERNAL, "the message started no turn"));
        };
        self.keep_push(&params, turn).await?;
        let mut body = body.until(state.auth.standing(principal));
        let mut frames = Frames::default();
        let mut translator = Translator::new(turn, chat);
        // Read to the end, not just to `finish`: dropping the body early would cancel the
        // turn while it records its end (T8).
        while let Some(Ok(bytes)) = body.next().await {
            for frame in frames.push(&bytes) {
                if let Frame::Chunk(chunk) = frame {
                    translator.feed(chunk);
                }
            }
        }
        to_value(json!({"task": translator.task(TaskState::Working)}))
    }

    /// `SendStreamingMessage`: the task, then its updates as the turn streams.
    async fn send_streaming(&self, id: Value, value: Value) -> Response {
        match self.start_streaming(id.clone(), value).await {
            Ok(response) => response,
            Err(error) => answer(RpcResponse::err(id, error)),
        }
    }

    async fn start_streaming(&self, id: Value, value: Value) -> Result<Response, RpcError> {
        let Posting {
            chat,
            trigger,
            params,
        } = self.posting(value).await?;
        let (state, principal, parent) = (&self.state, &self.principal, self.parent.as_ref());
        let launched = match post::post(state, principal, chat, trigger, None, false, parent).await
        {
            Ok(Posted::Launched(launched)) => launched,
            Ok(Posted::Queued(queued)) => {
                self.keep_push(&params, queued.turn).await?;
                let translator = Translator::new(queued.turn, chat);
                let opening = translator.opening(TaskState::Submitted);
                return Ok(sse_response(single(id, opening)));
            }
            Err(err) => match err.in_progress() {
                Some(running) => return self.follow(id, &running.to_string()).await,
                None => return Err(api(err.into())),
            },
        };
        let (Some(turn), Some(body)) = (launched.turn, launched.body) else {
            return Err(rpc(errors::INTERNAL, "the message started no turn"));
        };
        self.keep_push(&params, turn).await?;
        let body = body.until(state.auth.standing(principal));
        let translator = Translator::new(turn, chat);
        Ok(sse_response(events(id, translator, body)))
    }

    /// `SubscribeToTask`: a running task's updates, from its start.
    async fn subscribe(&self, id: Value, value: Value) -> Response {
        let result = match params::<TaskParams>(value) {
            Ok(p) => self.follow(id.clone(), &p.id).await,
            Err(e) => Err(e),
        };
        result.unwrap_or_else(|error| answer(RpcResponse::err(id, error)))
    }

    async fn follow(&self, id: Value, raw: &str) -> Result<Response, RpcError> {
        let row = self.visible_task(raw).await?;
        if row.status != store::TurnProgress::Running {
            return Err(rpc(
                errors::UNSUPPORTED_OPERATION,
                "only a running task can be subscribed to; GetTask answers the others",
            ));
        }
        // A task's subscription that ends before the task's final state is subscribed to
        // again by its client; an `error` part would read as the task's failure.
        let followed = follow::follow_turn(&self.state, &self.principal, row.id, EarlyEnd::Quiet)
            .await
            .map_err(|e| api(e.into()))?;
        let followed = match followed {
            Following::Live(followed) => *followed,
            Following::NotRunning => {
                return Err(rpc(
                    errors::UNSUPPORTED_OPERATION,
                    "the task ended; GetTask answers it",
                ));
            }
            Following::OutOfWindow => {
                return Err(rpc(
                    errors::UNSUPPORTED_OPERATION,
                    "the task's start is no longer in the events window; GetTask answers it",
                ));
            }
        };
        let translator = Translator::new(row.id, row.chat_id);
        let source = followed.into_stream();
        Ok(sse_response(events(id, translator, source)))
    }

    async fn get_task(&self, value: Value) -> Result<Value, RpcError> {
        let p: TaskParams = params(value)?;
        let row = self.visible_task(&p.id).await?;
        self.task_value(&row, p.history_length).await
    }

    async fn task_value(&self, row: &TurnRow, history: Option<i32>) -> Result<Value, RpcError> {
        let messages = bounded(
            self.state
                .store
                .turns_messages(self.principal.team, &[row.id]),
        )
        .await
        .map_err(|e| api(e.into()))?;
        to_value(task::of_turn(row, &messages, history, true))
    }

    async fn list_tasks(&self, value: Value) -> Result<Value, RpcError> {
        let p: ListParams = if value.is_null() {
            ListParams::default()
        } else {
            params(value)?
        };
        let page_size = p.page_size.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&page_size) {
            return Err(rpc(
                errors::INVALID_PARAMS,
                format!("pageSize must be 1 to {MAX_PAGE}"),
            ));
        }
        let chat = match p.context_id.as_deref().filter(|c| !c.is_empty()) {
            Some(raw) => Some(raw.parse::<ChatId>().map_err(|_| {
                rpc(
                    errors::INVALID_PARAMS,
                    "contextId is not a context of this agent",
                )
            })?),
            None => None,
        };
        let before: Option<TurnId> = p
            .page_token
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(|t| paging::key_of(TASKS_CURSOR, t, "pageToken"))
            .transpose()
            .map_err(api)?;
        let (statuses, awaiting_approval) = match p.status {
            Some(state) if state != TaskState::Unspecified => {
                let (statuses, awaiting) = task::statuses_of(state);
                (Some(statuses), awaiting)
            }
            _ => (None, None),
        };
        let filter = TaskFilter {
            chat,
            created_by: self.principal.only_chats_of().map(str::to_owned),
            statuses,
            awaiting_approval,
            hide_autostart: self.principal.scope != Scope::Admin,
        };
        let team = self.principal.team;
        let store = &self.state.store;
        let (turns, more, total) = bounded(store.agent_turn_page(
            team,
            self.agent.id,
            &filter,
            before,
            i64::from(page_size),
        ))
        .await
        .map_err(|e| api(e.into()))?;
        let with_artifacts = p.include_artifacts.unwrap_or(false);
        let messages = if with_artifacts || p.history_length != Some(0) {
            let ids: Vec<TurnId> = turns.iter().map(|t| t.id).collect();
            bounded(store.turns_messages(team, &ids))
                .await
                .map_err(|e| api(e.into()))?
        } else {
            Vec::new()
        };
        let next_page_token = if more {
            turns
                .last()
                .map(|t| paging::cursor_of(TASKS_CURSOR, t.id))
                .unwrap_or_default()
        } else {
            String::new()
        };
        let tasks = turns
            .iter()
            .map(|t| task::of_turn(t, &messages, p.history_length, with_artifacts))
            .collect();
        to_value(ListTasksResponse {
            tasks,
            next_page_token,
            page_size,
            total_size: i32::try_from(total).unwrap_or(i32::MAX),
        })
    }

    /// `CancelTask`: stops the turn as `POST /v1/turns/{id}/stop` does (T8), waits a
    /// bounded time for it to end, and answers the task.
    async fn cancel_task(&self, value: Value) -> Result<Value, RpcError> {
        let p: TaskParams = params(value)?;
        let row = self.visible_task(&p.id).await?;
        if task::state_of(row.status).is_final() {
            return Err(rpc(
                errors::TASK_NOT_CANCELABLE,
                "the task has already ended",
            ));
        }
        stop::stop_turn(&self.state, &self.principal, row.id)
            .await
            .map_err(|e| api(e.into()))?;
        let team = self.principal.team;
        let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
        let mut row = row;
        while !task::state_of(row.status).is_final() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            row = bounded(self.state.store.turn_row(team, row.id))
                .await
                .map_err(|e| api(e.into()))?;
        }
        self.task_value(&row, p.history_length).await
    }

    async fn create_push(&self, value: Value) -> Result<Value, RpcError> {
        let config: PushConfig = params(value)?;
        let row = self.visible_task(&config.task_id).await?;
        to_value(self.store_push(row.id, config).await?)
    }

    async fn get_push(&self, value: Value) -> Result<Value, RpcError> {
        let p: PushConfigParams = params(value)?;
        let row = self.visible_task(&p.task_id).await?;
        let id = p.id.unwrap_or_default();
        let configs = self
            .state
            .store
            .push_configs(self.principal.team, row.id, Some(&id));
        let found = sealed(configs, self.push_bound())
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| rpc(errors::INVALID_PARAMS, "no such push notification config"))?;
        to_value(push::shown(found))
    }

    async fn list_push(&self, value: Value) -> Result<Value, RpcError> {
        let p: PushConfigParams = params(value)?;
        let row = self.visible_task(&p.task_id).await?;
        let configs = self
            .state
            .store
            .push_configs(self.principal.team, row.id, None);
        let configs = sealed(configs, self.push_bound()).await?;
        to_value(ListPushConfigsResponse {
            configs: configs.into_iter().map(push::shown).collect(),
            next_page_token: String::new(),
        })
    }

    async fn delete_push(&self, value: Value) -> Result<Value, RpcError> {
        let p: PushConfigParams = params(value)?;
        let row = self.visible_task(&p.task_id).await?;
        let id = p.id.unwrap_or_default();
        match bounded(
            self.state
                .store
                .delete_push_config(self.principal.team, row.id, &id),
        )
        .await
        {
            Ok(()) => Ok(json!({})),
            Err(StoreError::NotFound) => Err(rpc(
                errors::INVALID_PARAMS,
                "no such push notification config",
            )),
            Err(e) => Err(api(e.into())),
        }
    }
}

/// A stream of A2A events as Server-Sent Events: `text/event-stream`, not cached, not
/// buffered by proxies.
fn sse_response(
    events: impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> Response {
    let mut response = Body::from_stream(events).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

fn event_bytes(id: &Value, event: &StreamResponse) -> Bytes {
    let response = RpcResponse::ok(
        id.clone(),
        serde_json::to_value(event).unwrap_or(Value::Null),
    );
    let json = serde_json::to_string(&response).unwrap_or_else(|_| "{}".into());
    sse::event(None, &json)
}

fn single(
    id: Value,
    event: StreamResponse,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    futures_util::stream::once(async move { Ok(event_bytes(&id, &event)) })
}

/// How long a stream may be silent before a keep-alive comment goes out.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// The turn's stream `source` (UI message stream frames) as A2A events: the task
/// (working) first, then what [`Translator`] makes of each chunk. The source is read to
/// its end even after the last event (dropping a turn's own stream early would cancel it).
fn events<S, E>(
    id: Value,
    translator: Translator,
    source: S,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Send + 'static,
{
    let opening = event_bytes(&id, &translator.opening(TaskState::Working));
    struct Reading<S> {
        id: Value,
        source: std::pin::Pin<Box<S>>,
        frames: Frames,
        translator: Translator,
    }
    let reading = Reading {
        id,
        source: Box::pin(source),
        frames: Frames::default(),
        translator,
    };
    let rest = futures_util::stream::unfold(reading, |mut r| async move {
        loop {
            let next = match tokio::time::timeout(KEEP_ALIVE, r.source.next()).await {
                Err(_) => return Some((vec![sse::keep_alive()], r)),
                Ok(next) => next,
            };
            let bytes = match next {
                Some(Ok(bytes)) => bytes,
                Some(Err(_)) | None => return None,
            };
            let mut out = Vec::new();
            for frame in r.frames.push(&bytes) {
                if let Frame::Chunk(chunk) = frame {
                    for event in r.translator.feed(chunk) {
                        out.push(event_bytes(&r.id, &event));
                    }
                }
            }
            if !out.is_empty() {
                return Some((out, r));
            }
        }
    })
    .flat_map(|batch| futures_util::stream::iter(batch.into_iter().map(Ok)));
    futures_util::stream::once(async move { Ok(opening) }).chain(rest)
}
