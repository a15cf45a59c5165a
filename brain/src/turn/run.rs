//! The agent loop of one turn (SPEC T4-T8): model call, tool calls, model call, ... until
//! the model answers without tools or a ceiling is hit.
//!
//! - Each model call tries the route's models in order until one produces output (T10).
//!   The first call's outcome decides the HTTP status; later failures become an `error`
//!   chunk.
//! - Tool calls run only after the provider finished its answer (T5). A length-truncated
//!   call is retried once, then refused with a result the model can read; at the iteration
//!   ceiling it is refused at once, so a turn never makes more than `max_iterations` calls.
//! - Calls that do not write run concurrently; writes run in order, at most `max_writes`
//!   per turn; the next one is answered "budget spent" (T6).
//! - Every `select!` races the turn's cancellation: a cancelled turn stops its provider
//!   stream and running tools, stores a synthetic result for every call without one, and
//!   starts no tool after the cancel (T8).
//! - Traces (O2): the task runs in its `turn` span; each model route tried is a
//!   `model_call` span (route, adapter, token counts, time to first output, outcome) and
//!   each tool run a `tool_call` span (tool, outcome), children of the turn. A worker
//!   call carries the `tool_call` span's context to the worker (`sessions/tool.rs`).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::future::{BoxFuture, OptionFuture};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use protocol::ui::{ConnectorStatus, FinishReason, Notice, TurnInfo, UiChunk};
use protocol::{AgentId, ChatId, ErrorCode, MessageId, TeamId, TurnId};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing::field::Empty;

use super::context::{self, Fold};
use super::history::{AWAITING_APPROVAL, answer_call, step_start, text_part, tool_part};
use crate::approvals::{ApprovalPolicy, ApprovalState, Decision};
use crate::auth::Authority;
use crate::config::Limits;
use crate::error::ApiError;
use crate::hold::{Billed, HoldGuard, Reserved};
use crate::metrics::{TurnMetrics, TurnOutcome};
use crate::provider::{
    EventStream, Message, ModelRequest, ModelRoute, ProviderError, ProviderEvent, Providers,
    StopReason, ToolCall, ToolResult, Unavailable, Usage,
};
use crate::quota::{Periods, Quotas, Refusal, fallback};
use crate::store::{
    ApprovalRow, AssistantMessage, ModelCallUsage, NewApproval, Store, StoreError, TurnEnd,
    TurnStatus, requested_part, storable_text,
};
use crate::tools::{Tool, ToolCtx, ToolOutput, Toolset};

/// Everything the spawned part of a turn needs; owned, so the task outlives the request.
pub(super) struct TurnTask {
    pub store: Store,
    pub providers: Providers,
    pub toolset: Arc<Toolset>,
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    pub turn: TurnId,
    pub route: Vec<String>,
    /// The first request; later calls append to its messages.
    pub request: ModelRequest,
    pub limits: Limits,
    pub cancel: CancellationToken,
    pub tx: mpsc::Sender<UiChunk>,
    /// Released at wrap-up (T7); `None` when Redis was unreachable at intake.
    pub hold: Option<HoldGuard>,
    /// The team's budgets, checked again before every further model call (E2).
    pub quota: super::TurnQuota,
    pub quotas: Quotas,
    /// The chat's events stream: every chunk sent to the client goes there too (S2).
    pub events: crate::events::Events,
    /// Run in the background after an answer is stored, when history outgrew the budget.
    pub fold: Fold,
    /// Shown once at the start of the stream (B2).
    pub connector_status: Vec<ConnectorStatus>,
    /// How long a send waits for a client that stopped reading (`BRAIN_CLIENT_STALL_TIMEOUT_MS`).
    pub stall_timeout: Duration,
    /// Set once a send gave the client up; from then on nothing waits for it.
    pub stalled: AtomicBool,
    /// When the wrap-up wrote the turn's billing events (Postgres' clock), for its
    /// settlement in the budget counters.
    pub billed_at: OnceLock<DateTime<Utc>>,
    /// The agent's approval policy (A2), applied to every call.
    pub policy: ApprovalPolicy,
    /// How long a call that asks waits for its answer (A4).
    pub approval_ttl: Duration,
    /// A continuation (A3): the approvals of the turn it continues, all answered; the
    /// approved calls run before the first model call.
    pub resume: Vec<ApprovalRow>,
    /// No client reads the stream (an approval answered by `POST /v1/approvals`): a
    /// dropped receiver is not a cancel.
    pub detached: bool,
    /// Starts the worker of a worker tool call the model is still streaming (W11); `None`
    /// when that is off.
    pub speculation: Option<super::speculation::Speculation>,
    /// Keeps the turn stoppable from any replica until the task ends (T8).
    pub _running: super::stop::Registration,
    /// Counts the turn live until the task ends, then by outcome (O2).
    pub metrics: TurnMetrics,
    /// Whose authority the turn's tool calls act with (X1).
    pub authority: Authority,
}

/// The outcome of one answer's tool calls.
struct Executed {
    results: Vec<(Value, ToolOutput)>,
    /// The indexes of the calls that wait for a person (A3).
    held: Vec<usize>,
    cancelled: bool,
}

/// A stream that produced its first output, with what came before it.
struct Opened {
    stream: EventStream,
    pending: VecDeque<ProviderEvent>,
    usage: Usage,
    call_index: u32,
    model: String,
    /// The call's `model_call` span, ended when the call is.
    span: tracing::Span,
}

enum OpenOutcome {
    Opened(Opened),
    Failed(ProviderError),
    Cancelled,
}

enum StepOutcome {
    Finished(StopReason),
    Failed(ProviderError),
    Cancelled,
}

/// One model call as relayed to the client.
struct Step {
    text: String,
    calls: Vec<ToolCall>,
    outcome: StepOutcome,
}

/// How the whole turn ended.
enum End {
    Completed(FinishReason),
    Interrupted,
    Failed(ProviderError),
    /// A budget ran out before a further model call (E2); ends the turn `failed` like a
    /// provider failure mid-turn.
    Refused(Refusal),
    /// Neither Redis nor Postgres could say whether a further model call fits the budget.
    QuotaUnknown,
    /// Calls wait for a person (A3): the turn ends here with them stored pending.
    AwaitingApproval(Vec<NewApproval>),
}

impl End {
    fn outcome(&self) -> TurnOutcome {
        match self {
            Self::Completed(_) => TurnOutcome::Completed,
            Self::AwaitingApproval(_) => TurnOutcome::AwaitingApproval,
            Self::Interrupted => TurnOutcome::Interrupted,
            Self::Failed(_) | Self::QuotaUnknown => TurnOutcome::Failed,
            Self::Refused(_) => TurnOutcome::Refused,
        }
    }
}

/// How long a wrap-up keeps trying to write the whole end state through transient store
/// failures (every pooled connection busy in a burst of wrap-ups, a dropped connection)
/// before it falls back to ending the turn `failed`.
const WRAP_UP_PATIENCE: Duration = Duration::from_secs(60);
/// How long the fallback keeps trying to end the turn `failed`.
const FALLBACK_PATIENCE: Duration = Duration::from_secs(10);
/// Bound on one write attempt: a statement that hangs (a blackholed database) is given up
/// and tried again; a retry of a write that did land is harmless (see `persist`).
const WRITE_ATTEMPT_BOUND: Duration = Duration::from_secs(10);

const CANCELLED_RESULT: &str = "cancelled: the turn was stopped before this tool call finished";

impl TurnTask {
    pub(super) async fn run(mut self, started: oneshot::Sender<Result<(), ApiError>>) {
        // A task that stops without writing its end state (a panic) still ends the turn.
        let mut unfinished = Unfinished {
            store: Some(self.store.clone()),
            team: self.team,
            turn: self.turn,
        };
        let assistant_id = MessageId::new();
        let mut started = Some(started);
        let mut usage_log = Vec::new();
        let mut parts: Vec<Value> = Vec::new();
        // One request for the whole turn: each model call sends its messages so far.
        let mut request = std::mem::take(&mut self.request);
        let mut calls_made = 0u32;
        let mut tool_calls = 0usize;
        let mut writes_used = 0u32;
        let mut truncation_retried = false;
        let mut iteration = 0u32;
        if !self.resume.is_empty() {
            // A continuation has its status decided already (its answer was accepted):
            // the stream opens at once, with the answered calls' outcomes first.
            if let Some(started) = started.take() {
                self.begin_stream(started, assistant_id).await;
            }
            self.run_answered(&mut request.messages, &mut writes_used)
                .await;
        }

        let end = loop {
            iteration += 1;
            // The first call was reserved at admission; every further one reserves its own.
            if iteration > 1 {
                match self.reserve(context::request_tokens(&request)).await {
                    Ok(None) => {}
                    Ok(Some(refusal)) => break End::Refused(refusal),
                    Err(err) => {
                        tracing::warn!(turn = %self.turn, class = err.metric_label(), "quota unknown mid-turn");
                        break End::QuotaUnknown;
                    }
                }
            }
            let opened = match self
                .open(&mut request, &mut calls_made, &mut usage_log)
                .await
            {
                OpenOutcome::Opened(opened) => opened,
                OpenOutcome::Cancelled => {
                    // Stopped while the model was still silent (T8): a client still
                    // attached gets a stream that ends `interrupted`, not an error.
                    if let Some(started) = started.take() {
                        self.begin_stream(started, assistant_id).await;
                    }
                    break End::Interrupted;
                }
                OpenOutcome::Failed(err) => match started.take() {
                    Some(started) => {
                        tracing::warn!(turn = %self.turn, class = err.metric_label(), "every model route failed");
                        record_turn(calls_made, tool_calls, "failed");
                        let billed = billed_tokens(&usage_log);
                        // The client gets an error status, not a stream: the user message
                        // goes with the failure, so the same message id may be sent again.
                        self.persist(TurnEnd {
                            status: TurnStatus::Failed,
                            error_code: Some(err.code()),
                            assistant: None,
                            usage: usage_log,
                            withdraw_user_message: true,
                            approvals: Vec::new(),
                        })
                        .await;
                        unfinished.written();
                        // Released before the client hears of the failure, so the retry
                        // that a `Retry-After` invites does not find the agent busy.
                        self.release_hold(billed).await;
                        let _ = started.send(Err(err.into()));
                        return;
                    }
                    None => break End::Failed(err),
                },
            };
            if let Some(started) = started.take() {
                self.begin_stream(started, assistant_id).await;
            }
            self.send(UiChunk::StartStep).await;
            parts.push(step_start());
            let step = self.relay(opened, iteration, &mut usage_log).await;
            tool_calls += step.calls.len();
            if !step.text.is_empty() {
                parts.push(text_part(&step.text));
            }
            let reason = match step.outcome {
                StepOutcome::Cancelled => break End::Interrupted,
                StepOutcome::Failed(err) => break End::Failed(err),
                StepOutcome::Finished(reason) => reason,
            };
            if step.calls.is_empty() {
                self.send(UiChunk::FinishStep).await;
                break End::Completed(finish_reason(reason));
            }

            let truncated = reason == StopReason::Length;
            let refusal = if truncated && truncation_retried {
                Some(
                    "refused: this tool call was cut off by the output token limit twice; \
                     make its arguments shorter"
                        .to_owned(),
                )
            } else if iteration >= self.limits.max_iterations {
                // A cut-off answer at the ceiling is refused, not retried: a retry would be
                // one model call more than the ceiling allows.
                Some(format!(
                    "not run: the turn reached its ceiling of {} model calls",
                    self.limits.max_iterations
                ))
            } else if truncated {
                truncation_retried = true;
                self.notice(
                    "truncated_tool_call",
                    "a tool call was cut off by the output limit; asking again",
                )
                .await;
                self.send(UiChunk::FinishStep).await;
                // The cut-off call is not part of the history: the retry starts from
                // the same conversation.
                parts.pop_if(|p| p["type"] == "text");
                parts.pop_if(|p| p["type"] == "step-start");
                continue;
            } else {
                None
            };

            let Executed {
                results,
                held,
                cancelled,
            } = match refusal {
                Some(text) => {
                    let refused = step
                        .calls
                        .iter()
                        .map(|_| ToolOutput::error(text.clone()))
                        .collect();
                    Executed {
                        results: self.report(&step.calls, refused).await,
                        held: Vec::new(),
                        cancelled: false,
                    }
                }
                None => self.execute(&step.calls, &mut writes_used).await,
            };
            let mut waiting = Vec::new();
            let expires_at = chrono::Utc::now()
                + chrono::Duration::from_std(self.approval_ttl).unwrap_or(chrono::Duration::MAX);
            for (index, (call, (input, output))) in step.calls.iter().zip(&results).enumerate() {
                if held.contains(&index) && !cancelled {
                    let id = uuid::Uuid::now_v7();
                    waiting.push(NewApproval {
                        id,
                        part_index: i32::try_from(parts.len()).unwrap_or(i32::MAX),
                        tool_call_id: call.id.clone(),
                        tool: call.name.clone(),
                        input: input.clone(),
                        expires_at,
                    });
                    parts.push(requested_part(&call.name, &call.id, input, id));
                } else {
                    parts.push(tool_part(call, input, output));
                }
            }
            if !waiting.is_empty() {
                break End::AwaitingApproval(waiting);
            }
            // Later requests carry the calls as shown (redacted), not as the model wrote them.
            let shown_calls = step
                .calls
                .iter()
                .zip(&results)
                .map(|(call, (input, _))| ToolCall {
                    // Arguments that were not JSON are shown (and re-sent) as text: the raw
                    // text, or what the tool's redaction left of it.
                    arguments: match input {
                        Value::String(shown) => shown.clone(),
                        other => other.to_string(),
                    },
                    ..call.clone()
                })
                .collect();
            request.messages.push(Message::Assistant {
                text: step.text,
                tool_calls: shown_calls,
            });
            request.messages.push(Message::ToolResults(
                step.calls
                    .iter()
                    .zip(&results)
                    .map(|(call, (_, output))| ToolResult {
                        call_id: call.id.clone(),
                        content: output.content.clone(),
                        is_error: output.is_error,
                    })
                    .collect(),
            ));
            self.send(UiChunk::FinishStep).await;
            if cancelled {
                break End::Interrupted;
            }
            if iteration >= self.limits.max_iterations {
                self.notice(
                    "iteration_ceiling",
                    &format!(
                        "the turn stopped at its ceiling of {} model calls",
                        self.limits.max_iterations
                    ),
                )
                .await;
                break End::Completed(FinishReason::Other);
            }
        };
        let answer_tokens = context::estimate_tokens(&parts);
        let billed = billed_tokens(&usage_log);
        // A3: the request parts go out once the approvals exist, so an answer that
        // follows them at once finds its row.
        let requests: Vec<UiChunk> = match &end {
            End::AwaitingApproval(waiting) => waiting
                .iter()
                .map(|a| UiChunk::ToolApprovalRequest {
                    approval_id: a.id.to_string(),
                    tool_call_id: a.tool_call_id.clone(),
                })
                .chain([UiChunk::FinishStep])
                .collect(),
            _ => Vec::new(),
        };
        let outcome = end.outcome();
        let (stored, last) = self.finish(end, assistant_id, parts, usage_log).await;
        let outcome = outcome.unless_lost(stored);
        self.metrics.ended(outcome);
        record_turn(calls_made, tool_calls, outcome.as_str());
        unfinished.written();
        // The end state is written before the client is told (a client that saw `finish`
        // finds the message), and the hold is released before too: a client that posts
        // its next message on `finish` must not find the agent busy.
        self.release_hold(billed).await;
        if stored {
            for chunk in requests {
                self.send(chunk).await;
            }
        }
        self.send(last).await;
        if stored && self.fold.needed(answer_tokens) {
            tokio::spawn(self.fold.run());
        }
    }

    /// Tells the handler to answer `200` with the stream, and opens it.
    async fn begin_stream(
        &self,
        started: oneshot::Sender<Result<(), ApiError>>,
        assistant_id: MessageId,
    ) {
        if started.send(Ok(())).is_err() && !self.detached {
            // The handler is gone: nobody will read this stream.
            self.cancel.cancel();
        }
        self.send(UiChunk::Start {
            message_id: assistant_id.to_string(),
        })
        .await;
        self.send(UiChunk::DataTurn {
            data: TurnInfo { turn_id: self.turn },
            transient: true,
        })
        .await;
        for status in &self.connector_status {
            self.send(UiChunk::DataConnectorStatus {
                data: status.clone(),
            })
            .await;
        }
    }

    async fn release_hold(&mut self, tokens: u64) {
        if let Some(hold) = self.hold.take() {
            let billed = Billed {
                tokens,
                at: self.billed_at.get().copied(),
            };
            hold.release_billed(billed).await;
        }
    }

    /// Reserves a further model call against the team's token budgets: through the hold's
    /// counters, or from Postgres when the turn was admitted without Redis or Redis went
    /// away since. `Some` is a refusal.
    async fn reserve(&self, tokens: u64) -> Result<Option<Refusal>, StoreError> {
        let limits = &self.quota.limits;
        if limits.tokens_per_day.is_none() && limits.tokens_per_month.is_none() {
            return Ok(None);
        }
        if self.quota.counted_in_redis
            && let Some(hold) = &self.hold
        {
            match hold.reserve(&self.quotas, limits, tokens).await? {
                Reserved::Ok => return Ok(None),
                Reserved::Refused(refusal) => return Ok(Some(refusal)),
                Reserved::Unavailable => {}
            }
        }
        let budgets = crate::quota::Limits {
            tokens_per_day: limits.tokens_per_day,
            tokens_per_month: limits.tokens_per_month,
            ..Default::default()
        };
        // This turn is among the running ones Postgres counts, at one reservation each.
        Ok(
            fallback::admit_turn(&self.store, self.team, &budgets, tokens, &Periods::now())
                .await?
                .err(),
        )
    }

    /// Writes the end state and answers the chunk that ends the stream. Answers whether an
    /// assistant message was stored (the history grew).
    async fn finish(
        &self,
        end: End,
        assistant_id: MessageId,
        parts: Vec<Value>,
        usage_log: Vec<ModelCallUsage>,
    ) -> (bool, UiChunk) {
        let message = |complete| AssistantMessage {
            id: assistant_id,
            parts: Value::Array(parts.clone()),
            complete,
        };
        // The client has seen output: the user message stays, bound to this turn.
        let ended = |status, error_code, assistant, approvals| TurnEnd {
            status,
            error_code,
            assistant,
            usage: usage_log,
            withdraw_user_message: false,
            approvals,
        };
        let lost = || {
            UiChunk::error(
                ErrorCode::StoreUnavailable,
                "the answer could not be stored",
            )
        };
        match end {
            End::AwaitingApproval(waiting) => {
                tracing::info!(turn = %self.turn, approvals = waiting.len(), "turn awaits approval");
                let stored = self
                    .persist(ended(
                        TurnStatus::Completed,
                        None,
                        Some(message(true)),
                        waiting,
                    ))
                    .await;
                let last = if stored {
                    UiChunk::Finish {
                        finish_reason: FinishReason::ToolCalls,
                    }
                } else {
                    lost()
                };
                (stored, last)
            }
            End::Completed(reason) => {
                let stored = self
                    .persist(ended(
                        TurnStatus::Completed,
                        None,
                        Some(message(true)),
                        Vec::new(),
                    ))
                    .await;
                let last = if stored {
                    UiChunk::Finish {
                        finish_reason: reason,
                    }
                } else {
                    lost()
                };
                (stored, last)
            }
            End::Interrupted => {
                tracing::info!(turn = %self.turn, "turn cancelled");
                let stored = self
                    .persist(ended(
                        TurnStatus::Interrupted,
                        None,
                        Some(message(false)),
                        Vec::new(),
                    ))
                    .await;
                let last = if stored {
                    UiChunk::Finish {
                        finish_reason: FinishReason::Interrupted,
                    }
                } else {
                    lost()
                };
                (stored, last)
            }
            End::Refused(refusal) => {
                tracing::info!(turn = %self.turn, field = refusal.field.name(), "budget spent mid-turn");
                self.persist(ended(
                    TurnStatus::Failed,
                    Some(refusal.code()),
                    None,
                    Vec::new(),
                ))
                .await;
                (false, UiChunk::error(refusal.code(), &refusal.message()))
            }
            End::QuotaUnknown => {
                let code = ErrorCode::StoreUnavailable;
                self.persist(ended(TurnStatus::Failed, Some(code), None, Vec::new()))
                    .await;
                let text = "the team's budget could not be checked; the turn stopped";
                (false, UiChunk::error(code, text))
            }
            End::Failed(err) => {
                tracing::warn!(turn = %self.turn, class = err.metric_label(), "model call failed mid-turn");
                self.persist(ended(
                    TurnStatus::Failed,
                    Some(err.code()),
                    None,
                    Vec::new(),
                ))
                .await;
                let code = err.code();
                let text = ApiError::Provider(err).public_message();
                (false, UiChunk::error(code, &text))
            }
        }
    }

    /// Tries each model of the route until one produces output (T10 fallbacks).
    async fn open(
        &self,
        request: &mut ModelRequest,
        calls_made: &mut u32,
        usage_log: &mut Vec<ModelCallUsage>,
    ) -> OpenOutcome {
        let mut last_error = ProviderError::Unavailable(Unavailable::Connect);
        for route in &self.route {
            let Ok(parsed) = ModelRoute::parse(route) else {
                // Routes are validated when the agent is written; a bad one is skipped.
                continue;
            };
            let call_index = *calls_made;
            *calls_made += 1;
            let span = tracing::info_span!(
                "model_call",
                route = %route,
                adapter = parsed.provider.as_str(),
                call_index,
                input_tokens = Empty,
                output_tokens = Empty,
                ttft_ms = Empty,
                outcome = Empty,
            );
            let provider = self.providers.get(parsed.provider).clone();
            parsed.model.clone_into(&mut request.model);
            let asked = Instant::now();
            let connected = tokio::select! {
                biased;
                () = self.cancel.cancelled() => {
                    span.record("outcome", "cancelled");
                    return OpenOutcome::Cancelled;
                }
                result = provider.stream(request).instrument(span.clone()) => result,
            };
            let mut stream = match connected {
                Ok(stream) => stream,
                Err(err) => {
                    self.metrics.provider_error(&err);
                    span.record("outcome", err.metric_label());
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
                        record_call(&span, usage, "cancelled");
                        usage_log.push(call_usage(call_index, route, usage));
                        return OpenOutcome::Cancelled;
                    }
                    next = stream.next() => next,
                };
                match next {
                    Some(Ok(ProviderEvent::Usage(u))) => usage.merge(u),
                    Some(Ok(first_output)) => {
                        self.metrics.first_output(parsed.provider, asked.elapsed());
                        span.record(
                            "ttft_ms",
                            u64::try_from(asked.elapsed().as_millis()).unwrap_or(u64::MAX),
                        );
                        return OpenOutcome::Opened(Opened {
                            stream,
                            pending: VecDeque::from([first_output]),
                            usage,
                            call_index,
                            model: route.clone(),
                            span,
                        });
                    }
                    Some(Err(err)) => {
                        self.metrics.provider_error(&err);
                        tracing::info!(turn = %self.turn, call_index, class = err.metric_label(), "model stream failed before output");
                        record_call(&span, usage, err.metric_label());
                        usage_log.push(call_usage(call_index, route, usage));
                        last_error = err;
                        break;
                    }
                    None => {
                        record_call(&span, usage, "incomplete");
                        usage_log.push(call_usage(call_index, route, usage));
                        last_error = ProviderError::Unavailable(Unavailable::Incomplete);
                        self.metrics.provider_error(&last_error);
                        break;
                    }
                }
            }
        }
        OpenOutcome::Failed(last_error)
    }

    /// Relays one model call to the client; collects its tool calls.
    async fn relay(
        &self,
        opened: Opened,
        iteration: u32,
        usage_log: &mut Vec<ModelCallUsage>,
    ) -> Step {
        let Opened {
            mut stream,
            mut pending,
            mut usage,
            call_index,
            model,
            span,
        } = opened;
        let text_id = format!("text-{iteration}");
        let mut text = String::new();
        let mut text_open = false;
        let mut calls = Vec::new();
        let mut hidden_inputs = std::collections::HashSet::new();
        let outcome = loop {
            let next = match pending.pop_front() {
                Some(event) => Some(Ok(event)),
                None => tokio::select! {
                    biased;
                    () = self.cancel.cancelled() => break StepOutcome::Cancelled,
                    next = stream.next() => next,
                },
            };
            let chunk = match next {
                Some(Ok(ProviderEvent::TextDelta(delta))) => {
                    if !text_open {
                        text_open = true;
                        if !self
                            .send(UiChunk::TextStart {
                                id: text_id.clone(),
                            })
                            .await
                        {
                            break StepOutcome::Cancelled;
                        }
                    }
                    // Only text the client accepted counts as delivered (T8).
                    let len = text.len();
                    text.push_str(&delta);
                    if !self
                        .send(UiChunk::TextDelta {
                            id: text_id.clone(),
                            delta,
                        })
                        .await
                    {
                        text.truncate(len);
                        break StepOutcome::Cancelled;
                    }
                    continue;
                }
                Some(Ok(ProviderEvent::ToolInputStart { id, name })) => {
                    let tool = self.toolset.get(&name);
                    if tool.is_some_and(|tool| tool.redacts_input()) {
                        hidden_inputs.insert(id.clone());
                    }
                    if let (Some(speculation), Some(profile)) = (
                        &self.speculation,
                        tool.and_then(|tool| tool.worker_profile()),
                    ) {
                        speculation.begin(profile);
                    }
                    UiChunk::ToolInputStart {
                        tool_call_id: id,
                        tool_name: name,
                    }
                }
                // The raw fragments of a tool whose input is redacted (a secret's value)
                // are not streamed; its redacted input follows in `tool-input-available`.
                Some(Ok(ProviderEvent::ToolInputDelta { id, .. }))
                    if hidden_inputs.contains(&id) =>
                {
                    continue;
                }
                Some(Ok(ProviderEvent::ToolInputDelta { id, delta })) => UiChunk::ToolInputDelta {
                    tool_call_id: id,
                    input_text_delta: delta,
                },
                Some(Ok(ProviderEvent::ToolCall(call))) => {
                    calls.push(call);
                    continue;
                }
                Some(Ok(ProviderEvent::Usage(u))) => {
                    usage.merge(u);
                    continue;
                }
                Some(Ok(ProviderEvent::Finished(reason))) => break StepOutcome::Finished(reason),
                Some(Err(err)) => break StepOutcome::Failed(err),
                None => {
                    break StepOutcome::Failed(ProviderError::Unavailable(Unavailable::Incomplete));
                }
            };
            if !self.send(chunk).await {
                break StepOutcome::Cancelled;
            }
        };
        // Dropping the stream closes the provider connection: the abort of T8.
        drop(stream);
        if let StepOutcome::Failed(err) = &outcome {
            self.metrics.provider_error(err);
        }
        let label = match &outcome {
            StepOutcome::Finished(_) => "ok",
            StepOutcome::Cancelled => "cancelled",
            StepOutcome::Failed(err) => err.metric_label(),
        };
        record_call(&span, usage, label);
        drop(span);
        usage_log.push(call_usage(call_index, &model, usage));
        if text_open {
            self.send(UiChunk::TextEnd { id: text_id }).await;
        }
        // T5: calls of a stream that did not finish are discarded, never run.
        if !matches!(outcome, StepOutcome::Finished(_)) {
            calls.clear();
        }
        Step {
            text,
            calls,
            outcome,
        }
    }

    /// Runs the calls of one model answer; returns (input, output) per call in call order
    /// and whether the turn was cancelled meanwhile.
    async fn execute(&self, calls: &[ToolCall], writes_used: &mut u32) -> Executed {
        let cancel = self.cancel.child_token();
        let ui = self.tool_ui();
        let ctxs: Vec<ToolCtx> = calls
            .iter()
            .map(|call| ToolCtx {
                store: self.store.clone(),
                team: self.team,
                agent: self.agent,
                chat: self.chat,
                turn: self.turn,
                call_id: call.id.clone(),
                ui: Some(ui.clone()),
                cancel: cancel.clone(),
                authority: self.authority.clone(),
            })
            .collect();
        let mut inputs = Vec::with_capacity(calls.len());
        let mut outputs: Vec<Option<ToolOutput>> = vec![None; calls.len()];
        let mut reads = FuturesUnordered::new();
        let mut writes: VecDeque<(usize, BoxFuture<'_, ToolOutput>)> = VecDeque::new();
        let mut held = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            let (input, input_shown) = self.parse_input(call);
            self.send(UiChunk::ToolInputAvailable {
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                input: input_shown.clone(),
            })
            .await;
            inputs.push(input_shown);
            let tool = self.toolset.get(&call.name);
            // X1, before any approval is asked: an answer (even the turn's own principal's)
            // cannot lend the turn an authority its principal lacks.
            if let Some(refusal) = tool.and_then(|t| self.beyond_authority(t.as_ref(), &call.name))
            {
                outputs[index] = Some(refusal);
                continue;
            }
            let decision = tool.map(|t| self.policy.decide(&call.name, t.risk()));
            match decision {
                Some(Decision::Deny) => {
                    outputs[index] = Some(ToolOutput::error(format!(
                        "refused: this agent's policy never runs `{}`; do without it",
                        call.name
                    )));
                    continue;
                }
                // The arguments of a tool that redacts them (a secret's value) are not
                // stored, so such a call cannot wait for an answer: it is refused.
                Some(Decision::Ask) if tool.is_some_and(|t| t.redacts_input()) => {
                    outputs[index] = Some(ToolOutput::error(format!(
                        "refused: `{}` needs approval and its arguments cannot be kept \
                         while it waits; ask the user to do it themselves",
                        call.name
                    )));
                    continue;
                }
                Some(Decision::Ask) if input.is_ok() => {
                    held.push(index);
                    outputs[index] = Some(ToolOutput::error(AWAITING_APPROVAL));
                    continue;
                }
                _ => {}
            }
            match (tool, input) {
                (None, _) => {
                    outputs[index] =
                        Some(ToolOutput::error(format!("no tool named `{}`", call.name)))
                }
                (Some(_), Err(e)) => {
                    outputs[index] = Some(ToolOutput::error(format!(
                        "arguments are not valid JSON: {e}"
                    )));
                }
                (Some(tool), Ok(args)) if tool.writes() => {
                    if *writes_used >= self.limits.max_writes {
                        outputs[index] = Some(ToolOutput::error(format!(
                            "budget spent: this turn already made {} data-changing calls; \
                             tell the user what is left to do",
                            self.limits.max_writes
                        )));
                    } else {
                        *writes_used += 1;
                        writes.push_back((index, self.start(tool, &call.name, &ctxs[index], args)));
                    }
                }
                (Some(tool), Ok(args)) => {
                    reads.push(
                        self.start(tool, &call.name, &ctxs[index], args)
                            .map(move |output| (index, output)),
                    );
                }
            }
        }
        // What has an output before anything ran was refused (or waits for a person).
        for (index, call) in calls.iter().enumerate() {
            if outputs[index].is_some() && !held.contains(&index) {
                self.metrics
                    .tool_not_run(self.toolset.get(&call.name), "refused");
            }
        }
        let mut current_write = writes.pop_front();
        let mut cancelled = false;
        while !reads.is_empty() || current_write.is_some() {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => {
                    cancelled = true;
                    break;
                }
                Some((index, output)) = reads.next(), if !reads.is_empty() => outputs[index] = Some(output),
                Some(output) = OptionFuture::from(current_write.as_mut().map(|(_, f)| f)), if current_write.is_some() => {
                    if let Some((index, _)) = current_write.take() {
                        outputs[index] = Some(output);
                    }
                    // No tool starts after a cancel (T8).
                    if !self.cancel.is_cancelled() {
                        current_write = writes.pop_front();
                    }
                }
            }
        }
        drop(reads);
        drop(current_write);
        let outputs = outputs
            .into_iter()
            .map(|o| o.unwrap_or_else(|| ToolOutput::error(CANCELLED_RESULT)))
            .collect();
        let cancelled = cancelled || self.cancel.is_cancelled();
        let reported = self.report_outputs(calls, inputs, outputs, &held).await;
        Executed {
            results: reported,
            held,
            cancelled,
        }
    }

    /// Opens the client's stream: the message id, the turn, and the connectors' status.
    /// A3: a continuation's answered calls. The denied ones were written as denials
    /// when they were answered, and only their outcome is shown; the approved ones run
    /// now (in call order, writes counted against the turn's budget), their results go
    /// into their stored parts and in place of the waiting results the model would read.
    async fn run_answered(&self, conversation: &mut [Message], writes_used: &mut u32) {
        for approval in &self.resume {
            if approval.state != ApprovalState::Approved {
                self.metrics
                    .tool_not_run(self.toolset.get(&approval.tool), "denied");
                self.send(UiChunk::ToolOutputDenied {
                    tool_call_id: approval.tool_call_id.clone(),
                })
                .await;
                continue;
            }
            let call = ToolCall {
                id: approval.tool_call_id.clone(),
                name: approval.tool.clone(),
                arguments: approval.input.to_string(),
            };
            let output = match self.toolset.get(&approval.tool) {
                None => ToolOutput::error(format!(
                    "not run: the tool `{}` is not available any more",
                    approval.tool
                )),
                Some(_) if self.cancel.is_cancelled() => ToolOutput::error(CANCELLED_RESULT),
                Some(tool) if tool.writes() && *writes_used >= self.limits.max_writes => {
                    ToolOutput::error(format!(
                        "budget spent: this turn already made {} data-changing calls",
                        self.limits.max_writes
                    ))
                }
                Some(tool) => {
                    if tool.writes() {
                        *writes_used += 1;
                    }
                    let ctx = ToolCtx {
                        store: self.store.clone(),
                        team: self.team,
                        agent: self.agent,
                        chat: self.chat,
                        turn: self.turn,
                        call_id: call.id.clone(),
                        ui: Some(self.tx.clone()),
                        cancel: self.cancel.child_token(),
                        authority: self.authority.clone(),
                    };
                    tokio::select! {
                        biased;
                        () = self.cancel.cancelled() => ToolOutput::error(CANCELLED_RESULT),
                        output = self.start(tool, &call.name, &ctx, approval.input.clone()) => output,
                    }
                }
            };
            let mut reported = self
                .report_outputs(
                    std::slice::from_ref(&call),
                    vec![approval.input.clone()],
                    vec![output],
                    &[],
                )
                .await;
            let (input, output) = reported.remove(0);
            let mut part = tool_part(&call, &input, &output);
            part["approval"] = serde_json::json!({"id": approval.id.to_string(), "approved": true});
            if let Err(class) = self
                .retrying(WRAP_UP_PATIENCE, || {
                    self.store.resolve_approval_part(self.team, approval, &part)
                })
                .await
            {
                tracing::error!(turn = %self.turn, class, "could not store an approved call's result");
            }
            answer_call(conversation, &call.id, &output);
        }
    }

    /// One tool call, which checks the turn's cancellation right before the tool starts:
    /// no tool starts after a cancel (T8), however late in the batch it comes.
    fn start<'a>(
        &'a self,
        tool: &'a Arc<dyn Tool>,
        name: &str,
        ctx: &'a ToolCtx,
        args: Value,
    ) -> BoxFuture<'a, ToolOutput> {
        // Counted `cancelled` when the call is dropped unanswered, started or not.
        let counted = self.metrics.tool_call(tool);
        let span = tool_span(name);
        // Every call passes here, a continuation's approved ones included.
        let refused = self.beyond_authority(tool.as_ref(), name);
        async move {
            if self.cancel.is_cancelled() {
                return ToolOutput::error(CANCELLED_RESULT);
            }
            if let Some(refusal) = refused {
                counted.answered(&refusal);
                return refusal;
            }
            // A call dropped by a cancel ends its span with no `outcome` and is counted
            // `cancelled`.
            let output = tool.call(ctx, args).instrument(span.clone()).await;
            record_tool(&span, &output);
            counted.answered(&output);
            output
        }
        .boxed()
    }

    /// X1: the answer to a call of a tool that changes the agent for everyone, in a turn
    /// whose principal may not make that change over the API; `None` when it may run.
    fn beyond_authority(&self, tool: &dyn Tool, name: &str) -> Option<ToolOutput> {
        (tool.changes_agent() && !self.authority.may_change_agent()).then(|| {
            ToolOutput::error(format!(
                "refused: `{name}` changes this agent for everyone, and only an admin may \
                 do that; ask an admin of the team to make the change"
            ))
        })
    }

    /// A call's arguments parsed, and as they may be shown, stored and sent back to the
    /// model: redacted by the tool (B1: `secret_set` blanks its value), or the raw text
    /// when it is not JSON. A tool that redacts gets the raw text to redact too: a call
    /// cut off mid-value still holds the secret.
    fn parse_input(&self, call: &ToolCall) -> (Result<Value, serde_json::Error>, Value) {
        let raw = if call.arguments.trim().is_empty() {
            "{}"
        } else {
            &call.arguments
        };
        let parsed: Result<Value, _> = serde_json::from_str(raw);
        let shown = match (&parsed, self.toolset.get(&call.name)) {
            (Ok(value), Some(tool)) => tool.redact_input(value.clone()),
            (Ok(value), None) => value.clone(),
            (Err(_), Some(tool)) if tool.redacts_input() => {
                tool.redact_input(Value::String(call.arguments.clone()))
            }
            (Err(_), _) => Value::String(call.arguments.clone()),
        };
        (parsed, shown)
    }

    /// Shows refused calls (never run) to the client.
    async fn report(
        &self,
        calls: &[ToolCall],
        outputs: Vec<ToolOutput>,
    ) -> Vec<(Value, ToolOutput)> {
        let mut inputs = Vec::with_capacity(calls.len());
        for call in calls {
            self.metrics
                .tool_not_run(self.toolset.get(&call.name), "refused");
            let (_, input) = self.parse_input(call);
            self.send(UiChunk::ToolInputAvailable {
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                input: input.clone(),
            })
            .await;
            inputs.push(input);
        }
        self.report_outputs(calls, inputs, outputs, &[]).await
    }

    /// Streams the outputs, except of the `held` calls, which wait for a person.
    async fn report_outputs(
        &self,
        calls: &[ToolCall],
        inputs: Vec<Value>,
        outputs: Vec<ToolOutput>,
        held: &[usize],
    ) -> Vec<(Value, ToolOutput)> {
        // Output as the store can keep it, so the stream, the stored message and the
        // model's next request agree (a command that printed a NUL).
        let outputs: Vec<ToolOutput> = outputs
            .into_iter()
            .map(|mut output| {
                if let Cow::Owned(clean) = storable_text(&output.content) {
                    output.content = clean;
                }
                output
            })
            .collect();
        for (index, (call, output)) in calls.iter().zip(&outputs).enumerate() {
            if held.contains(&index) {
                continue;
            }
            let chunk = if output.is_error {
                UiChunk::ToolOutputError {
                    tool_call_id: call.id.clone(),
                    error_text: output.content.clone(),
                }
            } else {
                UiChunk::ToolOutputAvailable {
                    tool_call_id: call.id.clone(),
                    output: Value::String(output.content.clone()),
                }
            };
            self.send(chunk).await;
        }
        inputs.into_iter().zip(outputs).collect()
    }

    async fn notice(&self, code: &str, message: &str) {
        self.send(UiChunk::DataNotice {
            data: Notice {
                code: code.to_owned(),
                message: message.to_owned(),
            },
        })
        .await;
    }

    /// The sender tools get for their live chunks (worker status and logs): they reach the
    /// client as before, and the chat's events stream too. Tools only `try_send` (a live
    /// log is dropped rather than waited for), so the forwarder waits for the client at
    /// most as long as a send of the turn does; it ends when the tools drop their senders.
    fn tool_ui(&self) -> mpsc::Sender<UiChunk> {
        let (ui, mut from_tools) = mpsc::channel::<UiChunk>(super::CHUNK_BUFFER);
        let (events, chat, turn, tx) = (self.events.clone(), self.chat, self.turn, self.tx.clone());
        let stall = self.stall_timeout;
        tokio::spawn(async move {
            while let Some(chunk) = from_tools.recv().await {
                events.publish(chat, turn, &chunk);
                if !matches!(
                    tokio::time::timeout(stall, tx.send(chunk)).await,
                    Ok(Ok(()))
                ) {
                    return;
                }
            }
        });
        ui
    }

    /// Sends a chunk to the client; `false` when the client is gone or has stopped
    /// reading. A client that leaves the channel full for the stall timeout is given up:
    /// the turn is cancelled (and stored `interrupted`), and later chunks are not waited
    /// for, so a connected client that never reads cannot hold its turn, or a drain.
    async fn send(&self, chunk: UiChunk) -> bool {
        // Observers see every chunk, also those of a turn whose client left; but an
        // authorization link is for the turn's own client only (B2, X1): every key holder
        // of the team may read the events stream.
        match &chunk {
            UiChunk::DataConnectorStatus { data } if data.authorize.is_some() => {
                let data = ConnectorStatus {
                    authorize: None,
                    ..data.clone()
                };
                self.events
                    .publish(self.chat, self.turn, &UiChunk::DataConnectorStatus { data });
            }
            _ => self.events.publish(self.chat, self.turn, &chunk),
        }
        let chunk = match self.tx.try_send(chunk) {
            Ok(()) => return true,
            // Nobody was meant to read it: the chunk is dropped, the turn goes on.
            Err(mpsc::error::TrySendError::Closed(_)) if self.detached => return true,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                // The body is gone, and with it the client: that is a cancel (T8), whoever
                // notices first.
                self.cancel.cancel();
                return false;
            }
            Err(mpsc::error::TrySendError::Full(chunk)) => chunk,
        };
        if self.stalled.load(Ordering::Relaxed) {
            return false;
        }
        match tokio::time::timeout(self.stall_timeout, self.tx.send(chunk)).await {
            Ok(Ok(())) => true,
            Ok(Err(_)) => {
                self.cancel.cancel();
                false
            }
            Err(_) => {
                tracing::info!(turn = %self.turn, timeout_ms = self.stall_timeout.as_millis(), "client stopped reading; cancelling the turn");
                self.stalled.store(true, Ordering::Relaxed);
                self.cancel.cancel();
                false
            }
        }
    }

    /// Writes the end state; `false` when it could not be written whole. Then the turn is
    /// ended `failed` with `store_unavailable` and its model calls are billed on their
    /// own, so it never stays `running`: only a store unreachable for the whole wrap-up
    /// leaves it so, for the replica's lease to settle.
    pub(super) async fn persist(&self, end: TurnEnd) -> bool {
        // The answer exists only in this task until the write lands, so transient failures
        // are waited out. A retried attempt that had landed unseen fails on the assistant
        // message's id, and the fallback then finds the turn no longer `running`.
        let written = self
            .retrying(WRAP_UP_PATIENCE, || {
                self.store
                    .finish_turn(self.team, self.agent, self.chat, self.turn, &end)
            })
            .await;
        let class = match written {
            Ok(billed_at) => {
                let _ = self.billed_at.set(billed_at);
                return true;
            }
            Err(class) => class,
        };
        tracing::error!(turn = %self.turn, class, "could not write the turn's end state; ending it failed");
        let team = self.team;
        let turn = self.turn;
        match self
            .retrying(FALLBACK_PATIENCE, || {
                self.store
                    .fail_turn(team, turn, ErrorCode::StoreUnavailable)
            })
            .await
        {
            Ok(_) => {}
            Err(class) => {
                tracing::error!(turn = %self.turn, class, "could not end the turn; it stays running");
            }
        }
        // The model calls were made: they are billed even though the answer is lost.
        match self
            .retrying(FALLBACK_PATIENCE, || {
                self.store
                    .record_model_calls(team, self.agent, turn, &end.usage)
            })
            .await
        {
            Ok(billed_at) => {
                if let Some(billed_at) = billed_at {
                    let _ = self.billed_at.set(billed_at);
                }
            }
            Err(class) => {
                tracing::error!(turn = %self.turn, class, "could not bill the turn's model calls");
            }
        }
        false
    }

    /// Runs `write` (each attempt bounded) until it succeeds, fails for good, or
    /// `patience` is spent; the error is its class, for the log.
    async fn retrying<T, W, F>(&self, patience: Duration, mut write: W) -> Result<T, &'static str>
    where
        W: FnMut() -> F,
        F: Future<Output = Result<T, StoreError>>,
    {
        let deadline = tokio::time::Instant::now() + patience;
        let mut pause = Duration::from_millis(20);
        loop {
            let class = match tokio::time::timeout(WRITE_ATTEMPT_BOUND, write()).await {
                Ok(Ok(done)) => return Ok(done),
                Ok(Err(err)) if err.is_transient() => err.metric_label(),
                Ok(Err(err)) => return Err(err.metric_label()),
                Err(_) => "timeout",
            };
            if tokio::time::Instant::now() + pause >= deadline {
                return Err(class);
            }
            tracing::info!(turn = %self.turn, class, "store failed at wrap-up; trying again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}

/// Ends the turn `failed` (`internal`) if the task stops before its end state was written:
/// a panic unwinds through it. Dropping it after [`Unfinished::written`] does nothing.
struct Unfinished {
    store: Option<Store>,
    team: TeamId,
    turn: TurnId,
}

impl Unfinished {
    fn written(&mut self) {
        self.store = None;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        tracing::error!(turn = %self.turn, "turn task ended without an end state; ending it failed");
        let (team, turn) = (self.team, self.turn);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let ended = tokio::time::timeout(
                    WRITE_ATTEMPT_BOUND,
                    store.fail_turn(team, turn, ErrorCode::Internal),
                )
                .await;
                if !matches!(ended, Ok(Ok(_))) {
                    tracing::error!(turn = %turn, "could not end the turn; it stays running");
                }
            });
        }
    }
}

/// Input + output tokens of every model call, as billed.
fn billed_tokens(usage_log: &[ModelCallUsage]) -> u64 {
    usage_log
        .iter()
        .map(|u| u.input_tokens.unwrap_or(0) + u.output_tokens.unwrap_or(0))
        .sum()
}

/// A `tool_call` span: the tool's name only, never its arguments (X4).
fn tool_span(name: &str) -> tracing::Span {
    tracing::info_span!("tool_call", tool = %name, outcome = Empty)
}

fn record_tool(span: &tracing::Span, output: &ToolOutput) {
    span.record("outcome", if output.is_error { "error" } else { "ok" });
}

/// What a `model_call` span ends with: the token counts the provider reported.
fn record_call(span: &tracing::Span, usage: Usage, outcome: &str) {
    if let Some(tokens) = usage.input_tokens {
        span.record("input_tokens", tokens);
    }
    if let Some(tokens) = usage.output_tokens {
        span.record("output_tokens", tokens);
    }
    span.record("outcome", outcome);
}

/// What the `turn` span (the task's current span) ends with.
fn record_turn(model_calls: u32, tool_calls: usize, outcome: &'static str) {
    let span = tracing::Span::current();
    span.record("model_calls", model_calls);
    span.record("tool_calls", tool_calls);
    span.record("outcome", outcome);
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
