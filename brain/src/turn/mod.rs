//! The turn: one run of an agent, from a user message to a persisted answer.
//!
//! `start` does the intake synchronously (SPEC T1, T3): it loads the chat and agent,
//! handles a retried message id (T12), and writes the turn row with its frozen composition
//! and the user message in one transaction, so a failed write means no provider call. It
//! then spawns [`TurnTask::run`], which opens the model stream (trying the route's
//! fallbacks in order while nothing has been shown, T10), relays it as UI chunks, and
//! persists the end state (T7, T8).
//!
//! The HTTP status is decided by the first model output: the handler waits for the task
//! to report that a stream opened (200, then UI chunks) or that every route failed (the
//! error's status). After that, failures arrive as an `error` chunk.
//!
//! Cancellation: each turn has a `CancellationToken`, a child of the process's. The
//! response body holds its drop guard, so a client that goes away cancels the turn; the
//! task races every provider await against it and drops the provider stream, which aborts
//! the HTTP request upstream.

pub mod ui_stream;

use std::collections::VecDeque;

use futures_util::StreamExt;
use protocol::ui::{FinishReason, TurnInfo, UiChunk};
use protocol::{AgentId, ChatId, ErrorCode, MessageId, TeamId, TurnId};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::error::ApiError;
use crate::provider::{
    EventStream, Message, ModelRequest, ModelRoute, ProviderError, ProviderEvent, Providers, Role,
    StopReason, Unavailable, Usage,
};
use crate::store::{
    AgentRow, AssistantMessage, MessageRow, ModelCallUsage, NewTurn, Store, StoreError, TurnEnd,
    TurnRecord, TurnStatus,
};
use ui_stream::UiBody;

/// Room for chunks between the turn and a slow client; beyond it the turn waits.
const CHUNK_BUFFER: usize = 64;
/// The id of the single text part a turn streams (one model call per turn for now).
const TEXT_PART_ID: &str = "text-0";

/// A new user message.
#[derive(Debug)]
pub struct TurnInput {
    pub content: String,
    pub client_message_id: Option<String>,
}

/// T3: the run's basis, frozen and stored before the first provider request.
#[derive(Debug, Serialize)]
pub struct Composition<'a> {
    pub version: u32,
    pub system_prompt: &'a str,
    /// The primary model first, then the fallbacks in the order they are tried.
    pub model_route: Vec<&'a str>,
    /// The tool catalog offered to the model, by name (none yet: brain, worker and
    /// connector tools join in later issues).
    pub tools: Vec<String>,
    pub max_output_tokens: u32,
    /// The summary covers messages up to this sequence number (M1).
    pub summary_through: i64,
}

/// Starts a turn for `input` in `chat`, or replays the turn a retried message id started.
pub async fn start(
    state: &AppState,
    team: TeamId,
    chat: ChatId,
    input: TurnInput,
) -> Result<UiBody, ApiError> {
    let (chat_row, agent) = state
        .store
        .chat_with_agent(team, chat)
        .await
        .map_err(|e| match e {
            StoreError::NotFound => ApiError::NotFound("chat"),
            other => other.into(),
        })?;
    if let Some(client_id) = input.client_message_id.as_deref()
        && let Some(existing) = state
            .store
            .turn_for_client_message(team, chat, client_id)
            .await?
    {
        return replay(existing);
    }

    let composition = Composition {
        version: 1,
        system_prompt: &agent.system_prompt,
        model_route: model_route(&agent),
        tools: Vec::new(),
        max_output_tokens: state.config.max_output_tokens,
        summary_through: 0,
    };
    let composition_json = serde_json::to_value(&composition)
        .map_err(|e| ApiError::Internal(format!("composition: {e}")))?;
    let user_parts = serde_json::json!([{ "type": "text", "text": input.content }]);
    let begun = state
        .store
        .begin_turn(NewTurn {
            team,
            agent: agent.id,
            chat,
            trigger: "user",
            composition: &composition_json,
            user_parts: &user_parts,
            client_message_id: input.client_message_id.as_deref(),
        })
        .await;
    let turn_id = match begun {
        Ok((turn_id, _)) => turn_id,
        // Two POSTs with one message id raced; the loser replays the winner's turn.
        Err(StoreError::Conflict("message_id")) => {
            let client_id = input.client_message_id.as_deref().unwrap_or_default();
            let existing = state
                .store
                .turn_for_client_message(team, chat, client_id)
                .await?
                .ok_or(ApiError::Internal("conflicting message id vanished".into()))?;
            return replay(existing);
        }
        Err(e) => return Err(e.into()),
    };

    let history = state
        .store
        .messages_after(team, chat, composition.summary_through)
        .await?;
    let request = ModelRequest {
        model: String::new(),
        system: system_text(&agent.system_prompt, &chat_row.summary),
        messages: model_messages(&history),
        max_output_tokens: state.config.max_output_tokens,
    };
    let route: Vec<String> = composition
        .model_route
        .iter()
        .map(|s| (*s).to_owned())
        .collect();

    let cancel = state.turns_cancel.child_token();
    let (tx, rx) = mpsc::channel(CHUNK_BUFFER);
    let (started_tx, started_rx) = oneshot::channel();
    let task = TurnTask {
        store: state.store.clone(),
        providers: state.providers.clone(),
        team,
        agent: agent.id,
        chat,
        turn: turn_id,
        route,
        request,
        cancel: cancel.clone(),
        tx,
    };
    // The guard travels with the response body; if this handler is dropped first (the
    // client left while the model was still silent), the guard still cancels the turn.
    let guard = cancel.drop_guard();
    state.turn_tracker.spawn(task.run(started_tx));
    match started_rx.await {
        Ok(Ok(())) => Ok(UiBody::live(rx, guard)),
        Ok(Err(err)) => Err(err),
        Err(_) => Err(ApiError::Internal(
            "turn task ended before reporting".into(),
        )),
    }
}

fn system_text(prompt: &str, summary: &str) -> String {
    if summary.is_empty() {
        prompt.to_owned()
    } else {
        format!("{prompt}\n\nSummary of the earlier conversation:\n{summary}")
    }
}

/// The text of a stored message's UI parts.
pub fn parts_text(parts: &serde_json::Value) -> String {
    let mut text = String::new();
    for part in parts.as_array().into_iter().flatten() {
        if part.get("type").and_then(|t| t.as_str()) == Some("text")
            && let Some(t) = part.get("text").and_then(|t| t.as_str())
        {
            text.push_str(t);
        }
    }
    text
}

/// Stored messages as the model sees them. Empty messages (an answer interrupted before
/// its first word) are left out: providers refuse empty content.
fn model_messages(history: &[MessageRow]) -> Vec<Message> {
    history
        .iter()
        .filter_map(|m| {
            let text = parts_text(&m.parts);
            if text.is_empty() {
                return None;
            }
            let role = if m.role == "assistant" {
                Role::Assistant
            } else {
                Role::User
            };
            Some(Message { role, text })
        })
        .collect()
}

/// The UI chunks of a turn that already ran (T12).
fn replay(turn: TurnRecord) -> Result<UiBody, ApiError> {
    let message_id = turn
        .assistant
        .as_ref()
        .map(|m| m.id)
        .unwrap_or_default()
        .to_string();
    let mut chunks = vec![
        UiChunk::Start { message_id },
        UiChunk::DataTurn {
            data: TurnInfo { turn_id: turn.id },
            transient: true,
        },
    ];
    match turn.status {
        TurnStatus::Running => return Err(ApiError::TurnInProgress(turn.id)),
        TurnStatus::Failed => {
            let code = turn.error_code.unwrap_or(ErrorCode::Internal);
            chunks.push(UiChunk::error(code, "this message's turn failed"));
        }
        TurnStatus::Completed | TurnStatus::Interrupted => {
            let text = turn
                .assistant
                .as_ref()
                .map(|m| parts_text(&m.parts))
                .unwrap_or_default();
            chunks.push(UiChunk::StartStep);
            if !text.is_empty() {
                chunks.push(UiChunk::TextStart {
                    id: TEXT_PART_ID.into(),
                });
                chunks.push(UiChunk::TextDelta {
                    id: TEXT_PART_ID.into(),
                    delta: text,
                });
                chunks.push(UiChunk::TextEnd {
                    id: TEXT_PART_ID.into(),
                });
            }
            chunks.push(UiChunk::FinishStep);
            chunks.push(UiChunk::Finish {
                finish_reason: if turn.status == TurnStatus::Completed {
                    FinishReason::Stop
                } else {
                    FinishReason::Interrupted
                },
            });
        }
    }
    Ok(UiBody::replay(chunks))
}

/// A stream that produced its first output, with what came before it.
struct Opened {
    stream: EventStream,
    /// Events read while deciding the stream is good; the last one is the first output.
    pending: VecDeque<ProviderEvent>,
    usage: Usage,
    call_index: u32,
    model: String,
}

enum OpenOutcome {
    Opened(Opened),
    Failed(ProviderError),
    Cancelled,
}

enum StreamOutcome {
    Finished(StopReason),
    Failed(ProviderError),
    Cancelled,
}

/// Everything the spawned part of a turn needs; owned, so the task outlives the request.
struct TurnTask {
    store: Store,
    providers: Providers,
    team: TeamId,
    agent: AgentId,
    chat: ChatId,
    turn: TurnId,
    route: Vec<String>,
    request: ModelRequest,
    cancel: CancellationToken,
    tx: mpsc::Sender<UiChunk>,
}

impl TurnTask {
    async fn run(self, started: oneshot::Sender<Result<(), ApiError>>) {
        let mut usage_log = Vec::new();
        let opened = match self.open(&mut usage_log).await {
            OpenOutcome::Opened(opened) => opened,
            OpenOutcome::Failed(err) => {
                tracing::warn!(turn = %self.turn, class = err.metric_label(), "every model route failed");
                self.persist(TurnStatus::Failed, Some(err.code()), None, usage_log)
                    .await;
                let _ = started.send(Err(err.into()));
                return;
            }
            OpenOutcome::Cancelled => {
                self.persist(TurnStatus::Interrupted, None, None, usage_log)
                    .await;
                return;
            }
        };
        if started.send(Ok(())).is_err() {
            // The handler is gone: nobody will read this stream.
            self.cancel.cancel();
        }
        let assistant_id = MessageId::new();
        self.relay(opened, assistant_id, usage_log).await;
    }

    /// Tries each model of the route until one produces output (T10 fallbacks).
    async fn open(&self, usage_log: &mut Vec<ModelCallUsage>) -> OpenOutcome {
        let mut last_error = ProviderError::Unavailable(Unavailable::Connect);
        for (index, route) in self.route.iter().enumerate() {
            let call_index = u32::try_from(index).unwrap_or(u32::MAX);
            let parsed = match ModelRoute::parse(route) {
                Ok(parsed) => parsed,
                // Routes are validated when the agent is written; a bad one is skipped.
                Err(_) => continue,
            };
            let provider = self.providers.get(parsed.provider).clone();
            let request = ModelRequest {
                model: parsed.model.to_owned(),
                ..self.request.clone()
            };
            let connected = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return OpenOutcome::Cancelled,
                result = provider.stream(&request) => result,
            };
            let mut stream = match connected {
                Ok(stream) => stream,
                Err(err) => {
                    tracing::info!(turn = %self.turn, call_index, class = err.metric_label(), "model route failed before output");
                    last_error = err;
                    continue;
                }
            };
            let mut usage = Usage::default();
            loop {
                let next = tokio::select! {
                    biased;
                    () = self.cancel.cancelled() => {
                        usage_log.push(call_usage(call_index, route, usage));
                        return OpenOutcome::Cancelled;
                    }
                    next = stream.next() => next,
                };
                match next {
                    Some(Ok(ProviderEvent::Usage(u))) => usage.merge(u),
                    Some(Ok(first_output)) => {
                        return OpenOutcome::Opened(Opened {
                            stream,
                            pending: VecDeque::from([first_output]),
                            usage,
                            call_index,
                            model: route.clone(),
                        });
                    }
                    Some(Err(err)) => {
                        tracing::info!(turn = %self.turn, call_index, class = err.metric_label(), "model stream failed before output");
                        usage_log.push(call_usage(call_index, route, usage));
                        last_error = err;
                        break;
                    }
                    None => {
                        usage_log.push(call_usage(call_index, route, usage));
                        last_error = ProviderError::Unavailable(Unavailable::Incomplete);
                        break;
                    }
                }
            }
        }
        OpenOutcome::Failed(last_error)
    }

    /// Relays the opened stream to the client, then persists the end state.
    async fn relay(
        &self,
        opened: Opened,
        assistant_id: MessageId,
        mut usage_log: Vec<ModelCallUsage>,
    ) {
        let Opened {
            mut stream,
            mut pending,
            mut usage,
            call_index,
            model,
        } = opened;
        let mut text = String::new();
        let mut text_open = false;
        let header = [
            UiChunk::Start {
                message_id: assistant_id.to_string(),
            },
            UiChunk::DataTurn {
                data: TurnInfo { turn_id: self.turn },
                transient: true,
            },
            UiChunk::StartStep,
        ];
        let mut outcome = None;
        for chunk in header {
            if !self.send(chunk).await {
                outcome = Some(StreamOutcome::Cancelled);
            }
        }
        let outcome = match outcome {
            Some(outcome) => outcome,
            None => loop {
                let next = match pending.pop_front() {
                    Some(event) => Some(Ok(event)),
                    None => tokio::select! {
                        biased;
                        () = self.cancel.cancelled() => break StreamOutcome::Cancelled,
                        next = stream.next() => next,
                    },
                };
                match next {
                    Some(Ok(ProviderEvent::TextDelta(delta))) => {
                        if !text_open {
                            text_open = true;
                            if !self
                                .send(UiChunk::TextStart {
                                    id: TEXT_PART_ID.into(),
                                })
                                .await
                            {
                                break StreamOutcome::Cancelled;
                            }
                        }
                        // Only text the client accepted counts as delivered (T8).
                        let len = text.len();
                        text.push_str(&delta);
                        let chunk = UiChunk::TextDelta {
                            id: TEXT_PART_ID.into(),
                            delta,
                        };
                        if !self.send(chunk).await {
                            text.truncate(len);
                            break StreamOutcome::Cancelled;
                        }
                    }
                    Some(Ok(ProviderEvent::Usage(u))) => usage.merge(u),
                    Some(Ok(ProviderEvent::Finished(reason))) => {
                        break StreamOutcome::Finished(reason);
                    }
                    Some(Err(err)) => break StreamOutcome::Failed(err),
                    None => {
                        break StreamOutcome::Failed(ProviderError::Unavailable(
                            Unavailable::Incomplete,
                        ));
                    }
                }
            },
        };
        // Dropping the stream closes the provider connection: the abort of T8.
        drop(stream);
        usage_log.push(call_usage(call_index, &model, usage));

        let parts = if text.is_empty() {
            serde_json::json!([])
        } else {
            serde_json::json!([{ "type": "text", "text": text }])
        };
        match outcome {
            StreamOutcome::Finished(reason) => {
                let assistant = AssistantMessage {
                    id: assistant_id,
                    parts,
                    complete: true,
                };
                // Persist before `finish`: a client that saw the end finds the message stored.
                if self
                    .persist(TurnStatus::Completed, None, Some(assistant), usage_log)
                    .await
                {
                    if text_open {
                        self.send(UiChunk::TextEnd {
                            id: TEXT_PART_ID.into(),
                        })
                        .await;
                    }
                    self.send(UiChunk::FinishStep).await;
                    self.send(UiChunk::Finish {
                        finish_reason: finish_reason(reason),
                    })
                    .await;
                } else {
                    self.send(UiChunk::error(
                        ErrorCode::StoreUnavailable,
                        "the answer could not be stored",
                    ))
                    .await;
                }
            }
            StreamOutcome::Cancelled => {
                tracing::info!(turn = %self.turn, "turn cancelled");
                let assistant = AssistantMessage {
                    id: assistant_id,
                    parts,
                    complete: false,
                };
                self.persist(TurnStatus::Interrupted, None, Some(assistant), usage_log)
                    .await;
            }
            StreamOutcome::Failed(err) => {
                tracing::warn!(turn = %self.turn, class = err.metric_label(), "model stream failed mid-answer");
                self.persist(TurnStatus::Failed, Some(err.code()), None, usage_log)
                    .await;
                let code = err.code();
                let message = ApiError::Provider(err).public_message();
                self.send(UiChunk::error(code, &message)).await;
            }
        }
    }

    /// Sends a chunk to the client; `false` when the client is gone.
    async fn send(&self, chunk: UiChunk) -> bool {
        self.tx.send(chunk).await.is_ok()
    }

    /// Writes the end state; `false` (and a log line) when the store refused.
    async fn persist(
        &self,
        status: TurnStatus,
        error_code: Option<ErrorCode>,
        assistant: Option<AssistantMessage>,
        usage: Vec<ModelCallUsage>,
    ) -> bool {
        let end = TurnEnd {
            status,
            error_code,
            assistant,
            usage,
        };
        match self
            .store
            .finish_turn(self.team, self.agent, self.chat, self.turn, &end)
            .await
        {
            Ok(()) => true,
            Err(err) => {
                tracing::error!(turn = %self.turn, class = err.metric_label(), error = %err, "could not persist the turn's end");
                false
            }
        }
    }
}

fn call_usage(call_index: u32, model: &str, usage: Usage) -> ModelCallUsage {
    ModelCallUsage {
        call_index,
        model: model.to_owned(),
        input_tokens: usage.input_tokens,
        output_tokens: usage.output_tokens,
    }
}

fn finish_reason(reason: StopReason) -> FinishReason {
    match reason {
        StopReason::Stop => FinishReason::Stop,
        StopReason::Length => FinishReason::Length,
        StopReason::ToolCalls => FinishReason::ToolCalls,
        StopReason::Other => FinishReason::Other,
    }
}

/// The primary model, then the fallbacks in order.
fn model_route(agent: &AgentRow) -> Vec<&str> {
    std::iter::once(agent.model.as_str())
        .chain(agent.fallback_models.iter().map(String::as_str))
        .collect()
}
