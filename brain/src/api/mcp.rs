//! `POST /mcp`, `DELETE /mcp`, `GET /mcp`: the team's agents as an MCP server (P2), over
//! MCP's streamable HTTP transport (protocol 2025-11-25), with the same bearer
//! credentials as `/v1`.
//!
//! Each agent of the principal's team is a tool `ask_<name>` (`crate::mcp_server`); a
//! `tools/call` is a posted message: `engine::turn::post`, the path of `POST
//! /v1/chats/{id}/messages`, so scopes, quotas, the busy policy and approvals are the
//! same. The call's answer is the turn's reply. A client that accepts `text/event-stream`
//! gets the call as a stream: `notifications/progress` for the turn's steps and tool
//! calls (when it sent a `progressToken`), then the result; otherwise one JSON answer.
//!
//! Failures, in MCP's two forms (docs/design/mcp-server.md):
//! - the wire: HTTP errors before JSON-RPC (a refused credential `401`, a missing session
//!   id `400`, an unknown session `404`, too many sessions `429 too_many_sessions`), and
//!   JSON-RPC errors for a request that cannot be served (an unknown method or tool);
//! - the call: a refusal of the turn (quota, busy agent, unknown chat, bad arguments) is
//!   a tool result with `isError` whose `structuredContent.error` is the `/v1` error body's
//!   `{code, message, turn_id?}`, so a model reading it can act on it.

use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use protocol::ui::{FinishReason, UiChunk};
use protocol::{AgentId, ChatId, ErrorCode, TurnId};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::JsonBody;
use super::chats::{PlainMessage, PostMessage};
use crate::AppState;
use crate::error::ApiError;
use crate::mcp_server::rpc::{self, Incoming, RequestId};
use crate::mcp_server::{self, InFlight, PROTOCOL_VERSIONS, Tool};
use engine::auth::{Principal, Standing};
use engine::turn::post::{self, Posted};
use engine::turn::stop;
use engine::turn::ui_stream::UiBody;
use store::{StoreError, bounded};

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
/// The most agents listed as tools (MCP's pagination is not offered).
const MAX_TOOLS: i64 = 500;
/// The most reply text a result carries; the transcript keeps all of it.
const MAX_REPLY_BYTES: usize = 1 << 20;
/// Room for events between a call and a slow client; beyond it the call waits.
const EVENT_BUFFER: usize = 64;

/// A JSON-RPC message as MCP's streamable HTTP transport posts it; MCP defines the rest.
#[derive(Deserialize)]
#[serde(transparent)]
pub struct JsonRpcMessage(Value);

impl utoipa::PartialSchema for JsonRpcMessage {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        // `example`, as the derived schemas of the other bodies carry it (the contract's
        // tests call each operation with its body's example).
        #[allow(deprecated)]
        utoipa::openapi::schema::ObjectBuilder::new()
            .description(Some(
                "A JSON-RPC message as MCP's streamable HTTP transport posts it; MCP \
                 defines the rest.",
            ))
            .example(Some(json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})))
            .into()
    }
}

impl utoipa::ToSchema for JsonRpcMessage {}

#[utoipa::path(
    post,
    path = "/mcp",
    operation_id = "mcp_post",
    tag = "mcp",
    description = "The team's agents as an MCP server (streamable HTTP, protocol \
        2025-11-25): one JSON-RPC message per request, described by the MCP specification \
        (https://modelcontextprotocol.io/specification/2025-11-25/basic/transports), not \
        here. See docs/design/mcp-server.md.",
    request_body = JsonRpcMessage,
    responses(
        (status = 200, description = "The JSON-RPC answer, as `application/json` or, for a \
            `tools/call` of a client that accepts it, `text/event-stream`."),
        (status = 202, description = "A notification or a response was taken."),
        (status = 400, description = "Not a JSON-RPC message, no `Mcp-Session-Id` after \
            `initialize`, or an unsupported `MCP-Protocol-Version` (`invalid_request`).",
            body = protocol::ErrorBody),
        (status = 401, description = "No credentials, or refused (`unauthorized`).",
            body = protocol::ErrorBody),
        (status = 403, description = "`Origin` names another host (`forbidden`).",
            body = protocol::ErrorBody),
        (status = 404, description = "No such session on this replica, or another \
            principal's (`not_found`): initialize again.", body = protocol::ErrorBody),
        (status = 429, description = "The principal or the replica has as many sessions \
            as allowed (`too_many_sessions`, with `Retry-After`).",
            body = protocol::ErrorBody),
    ),
)]
pub async fn post(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    JsonBody(JsonRpcMessage(body)): JsonBody<JsonRpcMessage>,
) -> Result<Response, ApiError> {
    check_origin(&headers)?;
    let message = rpc::parse(body).map_err(|bad| ApiError::InvalidRequest(bad.message.into()))?;
    let owner = principal.identity();
    if let Incoming::Request { id, method, params } = &message
        && method == "initialize"
    {
        return initialize(&state, &owner, id, params);
    }
    let session = header_str(&headers, SESSION_HEADER)
        .ok_or_else(|| ApiError::InvalidRequest("Mcp-Session-Id is required".into()))?
        .to_owned();
    if !state.mcp.touch(&session, &owner) {
        return Err(ApiError::NotFound("MCP session"));
    }
    // The transport's rule: an unsupported version is refused; clients of the SDKs send
    // any version they support, not always the negotiated one.
    if let Some(asked) = header_str(&headers, VERSION_HEADER)
        && !PROTOCOL_VERSIONS.contains(&asked)
    {
        return Err(ApiError::InvalidRequest(format!(
            "MCP-Protocol-Version {asked} is not supported"
        )));
    }
    match message {
        Incoming::Notification { method, params } => {
            if method == "notifications/cancelled"
                && let Some(request) = params.get("requestId").and_then(RequestId::of)
            {
                state.mcp.cancel(&session, &request);
            }
            Ok(StatusCode::ACCEPTED.into_response())
        }
        Incoming::Response => Ok(StatusCode::ACCEPTED.into_response()),
        Incoming::Request { id, method, params } => match method.as_str() {
            "ping" => Ok(answer(rpc::result(&id, json!({})))),
            "tools/list" => tools_list(&state, &principal, &id).await,
            "tools/call" => {
                let sse = accepts_sse(&headers);
                let parent = super::trace_parent(&headers);
                tools_call(state, principal, session, id, params, sse, parent).await
            }
            _ => Ok(answer(rpc::error(
                Some(&id),
                rpc::METHOD_NOT_FOUND,
                "method not found",
                None,
            ))),
        },
    }
}

#[utoipa::path(
    delete,
    path = "/mcp",
    operation_id = "mcp_delete",
    tag = "mcp",
    params(("Mcp-Session-Id" = String, Header, description = "The session to end.")),
    responses(
        (status = 204, description = "The session ended; its calls in flight were cancelled."),
        (status = 400, description = "No `Mcp-Session-Id` (`invalid_request`).",
            body = protocol::ErrorBody),
        (status = 404, description = "No such session (`not_found`).", body = protocol::ErrorBody),
    ),
)]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    check_origin(&headers)?;
    let session = header_str(&headers, SESSION_HEADER)
        .ok_or_else(|| ApiError::InvalidRequest("Mcp-Session-Id is required".into()))?;
    if state.mcp.close(session, &principal.identity()) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound("MCP session"))
    }
}

/// `GET /mcp` would open a stream of server-initiated messages; this server sends none
/// outside a call's own stream, which the transport allows by answering `405`.
#[utoipa::path(
    get,
    path = "/mcp",
    operation_id = "mcp_get",
    tag = "mcp",
    responses(
        (status = 405, description = "No stream of server-initiated messages is offered \
            (`method_not_allowed`).", body = protocol::ErrorBody),
    ),
)]
pub async fn get(_principal: Principal) -> ApiError {
    ApiError::MethodNotAllowed
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn accepts_sse(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

/// MCP's transport rule against DNS rebinding: a browser's `Origin` must name the host
/// the request was sent to. Clients that are not browsers send none.
fn check_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = header_str(headers, header::ORIGIN.as_str()) else {
        return Ok(());
    };
    let host = header_str(headers, header::HOST.as_str()).unwrap_or_default();
    let origin_host = origin
        .split_once("://")
        .map_or(origin, |(_, rest)| rest)
        .trim_end_matches('/');
    if origin_host.eq_ignore_ascii_case(host) {
        Ok(())
    } else {
        Err(ApiError::OriginRefused)
    }
}

fn answer(message: Value) -> Response {
    Json(message).into_response()
}

fn initialize(
    state: &AppState,
    owner: &str,
    id: &RequestId,
    params: &Value,
) -> Result<Response, ApiError> {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = PROTOCOL_VERSIONS
        .iter()
        .find(|v| Some(**v) == asked)
        .copied()
        .unwrap_or(PROTOCOL_VERSIONS[0]);
    let session = state.mcp.open(owner)?;
    let mut response = answer(rpc::result(
        id,
        json!({
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": false}},
            "serverInfo": {
                "name": "agent-runtime",
                "title": "agent-runtime agents",
                "version": env!("CARGO_PKG_VERSION"),
            },
            "instructions": "Each tool asks one agent of your team: it runs a turn of the \
                agent on your message and answers its reply. Pass the chat_id of an \
                earlier answer to continue that chat.",
        }),
    ));
    if let Ok(value) = HeaderValue::from_str(&session) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    Ok(response)
}

async fn team_tools(state: &AppState, principal: &Principal) -> Result<Vec<Tool>, ApiError> {
    let agents = bounded(state.store.agents(principal.team, None, MAX_TOOLS)).await?;
    Ok(mcp_server::tool_names(&agents))
}

async fn tools_list(
    state: &AppState,
    principal: &Principal,
    id: &RequestId,
) -> Result<Response, ApiError> {
    let max_chars = state.config.max_message_chars;
    let tools: Vec<Value> = team_tools(state, principal)
        .await?
        .into_iter()
        .map(|tool| {
            json!({
                "name": tool.name,
                "description": format!(
                    "Ask the agent \"{}\" of your team: runs a turn on `message` and \
                     answers the agent's reply, with the chat and turn ids.",
                    tool.agent_name
                ),
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "message": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": max_chars,
                            "description": "What to ask the agent.",
                        },
                        "chat_id": {
                            "type": "string",
                            "format": "uuid",
                            "description": "Continue this chat of the agent (the chat_id \
                                of an earlier answer); a new chat without it.",
                        },
                    },
                    "required": ["message"],
                    "additionalProperties": false,
                },
                "annotations": {"readOnlyHint": false, "openWorldHint": true},
            })
        })
        .collect();
    Ok(answer(rpc::result(id, json!({ "tools": tools }))))
}

/// `tools/call`'s params: MCP's, so unknown fields (a later revision's) are ignored.
#[derive(Deserialize)]
struct CallParams {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default, rename = "_meta")]
    meta: Option<CallMeta>,
}

#[derive(Deserialize)]
struct CallMeta {
    #[serde(default, rename = "progressToken")]
    progress_token: Option<Value>,
}

/// An `ask_*` tool's arguments: ours, so closed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AskArgs {
    message: String,
    #[serde(default)]
    chat_id: Option<String>,
}

async fn tools_call(
    state: AppState,
    principal: Principal,
    session: String,
    id: RequestId,
    params: Value,
    sse: bool,
    parent: Option<logging::traces::TraceContext>,
) -> Result<Response, ApiError> {
    let Ok(params) = serde_json::from_value::<CallParams>(params) else {
        return Ok(answer(rpc::error(
            Some(&id),
            rpc::INVALID_PARAMS,
            "tools/call needs a name and object arguments",
            None,
        )));
    };
    let tools = team_tools(&state, &principal).await?;
    let Some(agent) = tools
        .into_iter()
        .find(|t| t.name == params.name)
        .map(|t| t.agent)
    else {
        return Ok(answer(rpc::error(
            Some(&id),
            rpc::INVALID_PARAMS,
            "unknown tool",
            Some(json!({"code": ErrorCode::NotFound.as_str()})),
        )));
    };
    let Some(in_flight) = state.mcp.begin(&session, id.clone()) else {
        return Ok(answer(rpc::error(
            Some(&id),
            rpc::INVALID_REQUEST,
            "a call with this request id is already in flight",
            None,
        )));
    };
    let progress_token = params.meta.and_then(|m| m.progress_token);
    let arguments = params.arguments.unwrap_or_else(|| json!({}));
    let call = Call {
        standing: state.auth.standing(&principal),
        state,
        principal,
        agent,
        parent,
        in_flight,
    };
    if !sse {
        // Without a stream there is nowhere for progress to go.
        let mut events = Events::None;
        return Ok(match call.run(arguments, &mut events).await {
            Some(result) => answer(rpc::result(&id, result)),
            // Cancelled: MCP wants no answer; the transport still needs one.
            None => StatusCode::ACCEPTED.into_response(),
        });
    }
    let keep_alive = call.state.config.events.keepalive;
    let (tx, rx) = mpsc::channel::<Bytes>(EVENT_BUFFER);
    tokio::spawn(async move {
        let mut events = Events::Stream {
            tx,
            token: progress_token,
            sent: 0,
            keep_alive,
        };
        if let Some(result) = call.run(arguments, &mut events).await {
            events.send(rpc::result(&id, result)).await;
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::io::Error>);
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// Where a call's progress goes.
enum Events {
    /// A JSON answer: nowhere.
    None,
    /// The call's SSE stream; progress only when the client sent a token.
    Stream {
        tx: mpsc::Sender<Bytes>,
        token: Option<Value>,
        sent: u64,
        keep_alive: Duration,
    },
}

impl Events {
    async fn send(&self, message: Value) {
        if let Self::Stream { tx, .. } = self {
            // A client that left is noticed by `gone`.
            let _ = tx
                .send(engine::sse::event(None, &message.to_string()))
                .await;
        }
    }

    async fn progress(&mut self, message: String) {
        let Self::Stream {
            tx, token, sent, ..
        } = self
        else {
            return;
        };
        let Some(token) = token else { return };
        *sent += 1;
        let note = rpc::notification(
            "notifications/progress",
            json!({"progressToken": token, "progress": *sent, "message": message}),
        );
        let _ = tx.send(engine::sse::event(None, &note.to_string())).await;
    }

    /// Ready when the client closed the call's stream.
    async fn gone(&self) {
        match self {
            Self::Stream { tx, .. } => tx.closed().await,
            Self::None => std::future::pending().await,
        }
    }

    /// Ready when the stream has been idle for the keep-alive period.
    async fn idle(&self) {
        match self {
            Self::Stream { keep_alive, .. } => tokio::time::sleep(*keep_alive).await,
            Self::None => std::future::pending().await,
        }
    }

    async fn keep_alive(&self) {
        if let Self::Stream { tx, .. } = self {
            let _ = tx.send(engine::sse::keep_alive()).await;
        }
    }
}

/// One `tools/call`, from the arguments to the result.
struct Call {
    state: AppState,
    principal: Principal,
    agent: AgentId,
    parent: Option<logging::traces::TraceContext>,
    in_flight: InFlight,
    standing: Standing,
}

/// What the turn's stream said, gathered for the result.
#[derive(Default)]
struct Gathered {
    turn: Option<TurnId>,
    text: String,
    truncated: bool,
    approvals: Vec<String>,
    error: Option<String>,
    finish: Option<FinishReason>,
    steps: u32,
}

impl Call {
    /// The call's result; `None` when it was cancelled (or its client left), which MCP
    /// answers with nothing.
    async fn run(self, arguments: Value, events: &mut Events) -> Option<Value> {
        let args = match serde_json::from_value::<AskArgs>(arguments) {
            Ok(args) => args,
            Err(e) => {
                return Some(refusal(&ApiError::InvalidRequest(format!(
                    "arguments: {e}"
                ))));
            }
        };
        let chat = match self.chat(args.chat_id.as_deref()).await {
            Ok(chat) => chat,
            Err(err) => return Some(refusal(&err)),
        };
        let trigger = match PostMessage::Plain(PlainMessage::of(args.message))
            .into_trigger(self.state.config.max_message_chars)
        {
            Ok(trigger) => trigger,
            Err(err) => return Some(refusal(&err)),
        };
        let launched = tokio::select! {
            // A cancel or a hang-up before the first output drops the launch, and with it
            // the turn's guard: the turn is cancelled as a hung-up `/v1` client's is.
            () = self.in_flight.cancel.cancelled() => return None,
            () = events.gone() => return None,
            posted = post::post(
                &self.state,
                &self.principal,
                chat,
                trigger,
                None,
                false,
                self.parent.as_ref(),
            ) => posted,
        };
        match launched {
            Ok(Posted::Launched(launched)) => {
                let Some(body) = launched.body else {
                    return Some(refusal(&ApiError::Internal(
                        "a message started no turn".into(),
                    )));
                };
                let gathered = self.follow(body, events).await?;
                Some(reply(chat, gathered))
            }
            Ok(Posted::Queued(queued)) => Some(tool_result(
                format!(
                    "The agent is busy; the message is queued (position {}) and runs when \
                     the agent is free. Its reply will be in chat {chat}.",
                    queued.position
                ),
                json!({"chat_id": chat, "turn_id": queued.turn, "status": "queued",
                       "position": queued.position}),
                false,
            )),
            Err(err) => Some(refusal(&err.into())),
        }
    }

    /// The chat the message goes to: `chat_id`'s, which must be the agent's and visible to
    /// the principal, or a new one.
    async fn chat(&self, chat_id: Option<&str>) -> Result<ChatId, ApiError> {
        let team = self.principal.team;
        let store = &self.state.store;
        let Some(raw) = chat_id else {
            let user = self.principal.user.as_deref();
            let created = bounded(store.create_chat(team, self.agent, user)).await?;
            return Ok(created.id);
        };
        let chat: ChatId = super::parse_id(raw, "chat")?;
        self.principal.check_chat(store, chat).await?;
        match bounded(store.chat_with_agent(team, chat)).await {
            Ok(basis) if basis.agent.id == self.agent => Ok(chat),
            Ok(_) | Err(StoreError::NotFound) => Err(ApiError::NotFound("chat of this agent")),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads the turn's chunks to its end, turning its steps and tool calls into
    /// progress; `None` when the call was cancelled or its client left.
    async fn follow(&self, mut body: UiBody, events: &mut Events) -> Option<Gathered> {
        let mut gathered = Gathered::default();
        loop {
            let chunk = tokio::select! {
                // `notifications/cancelled` or the session's end: stopped as
                // `POST /v1/turns/{id}/stop` stops it, whatever its disconnect policy.
                () = self.in_flight.cancel.cancelled() => {
                    self.stop(gathered.turn).await;
                    return None;
                }
                // The client closed the call's stream: dropping the body is a hang-up.
                () = events.gone() => return None,
                // The key was revoked or the token expired.
                () = self.standing.lost() => {
                    return Some(Gathered {
                        error: Some(format!(
                            "{}: the credentials of this call were revoked or expired",
                            ErrorCode::Unauthorized.as_str()
                        )),
                        ..gathered
                    });
                }
                () = events.idle() => {
                    events.keep_alive().await;
                    continue;
                }
                chunk = body.next_chunk() => chunk,
            };
            let Some(chunk) = chunk else {
                return Some(gathered);
            };
            if let Some(note) = gathered.take(chunk) {
                events.progress(note).await;
            }
        }
    }

    async fn stop(&self, turn: Option<TurnId>) {
        let Some(turn) = turn else { return };
        if let Err(e) = stop::stop_turn(&self.state, &self.principal, turn).await {
            // The hang-up that follows (the body is dropped) still cancels a guarded turn.
            tracing::warn!(turn = %turn, error = %e, "MCP cancel: stop failed");
        }
    }
}

impl Gathered {
    /// Takes one chunk; answers the progress message it is worth, if any.
    fn take(&mut self, chunk: UiChunk) -> Option<String> {
        match chunk {
            UiChunk::DataTurn { data, .. } => self.turn = Some(data.turn_id),
            UiChunk::StartStep => {
                self.steps += 1;
                return Some(format!("model call {}", self.steps));
            }
            UiChunk::ResetStep => self.text.clear(),
            UiChunk::TextStart { .. } if !self.text.is_empty() => self.push("\n\n"),
            UiChunk::TextDelta { delta, .. } => self.push(&delta),
            UiChunk::ToolInputAvailable { tool_name, .. } => {
                return Some(format!("calling tool {tool_name}"));
            }
            UiChunk::ToolOutputAvailable { .. } => return Some("tool call done".into()),
            UiChunk::ToolOutputError { .. } => return Some("tool call failed".into()),
            UiChunk::ToolApprovalRequest { approval_id, .. } => {
                self.approvals.push(approval_id);
                return Some("waiting for approval".into());
            }
            UiChunk::Error { error_text } => self.error = Some(error_text),
            UiChunk::Finish { finish_reason } => self.finish = Some(finish_reason),
            _ => {}
        }
        None
    }

    fn push(&mut self, text: &str) {
        let room = MAX_REPLY_BYTES.saturating_sub(self.text.len());
        if text.len() <= room {
            self.text.push_str(text);
            return;
        }
        let mut cut = room;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        self.text.push_str(&text[..cut]);
        self.truncated = true;
    }
}

fn tool_result(text: String, structured: Value, is_error: bool) -> Value {
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": is_error,
    })
}

/// A refused call: `isError`, with the `/v1` error body's fields.
fn refusal(err: &ApiError) -> Value {
    let code = err.code().as_str();
    let message = err.public_message();
    if matches!(err, ApiError::Store(_) | ApiError::Internal(_)) {
        tracing::warn!(code, error = %err, "MCP call failed");
    }
    let mut error = json!({"code": code, "message": message});
    if let Some(turn) = err.turn_id() {
        error["turn_id"] = json!(turn);
    }
    tool_result(
        format!("{code}: {message}"),
        json!({ "error": error }),
        true,
    )
}

/// The turn's reply as the call's result: its text, and `structuredContent` naming the
/// chat and the turn and how the turn ended.
fn reply(chat: ChatId, gathered: Gathered) -> Value {
    let Gathered {
        turn,
        mut text,
        truncated,
        approvals,
        error,
        finish,
        ..
    } = gathered;
    let (status, is_error) = if !approvals.is_empty() {
        text.push_str(&format!(
            "\n\n[The turn waits for approval of a tool call ({}). Answer with POST \
             /v1/approvals/{{id}}; the turn goes on in chat {chat}.]",
            approvals.join(", ")
        ));
        ("awaiting_approval", false)
    } else if error.is_some() {
        ("failed", true)
    } else if finish == Some(FinishReason::Interrupted) {
        ("interrupted", true)
    } else {
        ("completed", false)
    };
    let mut structured = json!({
        "chat_id": chat,
        "turn_id": turn,
        "status": status,
    });
    if !approvals.is_empty() {
        structured["approval_ids"] = json!(approvals);
    }
    if truncated {
        structured["truncated"] = json!(true);
    }
    if let Some(error_text) = error {
        let (code, message) = error_text
            .split_once(": ")
            .unwrap_or(("internal", error_text.as_str()));
        structured["error"] = json!({"code": code, "message": message});
        if text.is_empty() {
            text = error_text.clone();
        }
    }
    tool_result(text, structured, is_error)
}
