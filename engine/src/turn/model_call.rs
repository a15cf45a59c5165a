//! One model call of a step (T10, T5): each model of the route is tried in order until one
//! produces output (`open`), then its output is relayed to the client as UI chunks and its
//! tool calls collected (`relay`). Calls of a stream that did not finish are discarded,
//! never run. Each route tried is a `model_call` span (route, adapter, token counts, time
//! to first output, outcome).

use std::collections::VecDeque;
use std::time::Instant;

use futures_util::StreamExt;
use protocol::ui::UiChunk;
use tracing::Instrument;

use super::state::{Progress, TurnTask};
use providers::{
    EventStream, ModelRoute, ProviderError, ProviderEvent, StopReason, ToolCall, Unavailable, Usage,
};
use store::ModelCallUsage;

/// A stream that produced its first output, with what came before it.
pub(super) struct Opened {
    stream: EventStream,
    pending: VecDeque<ProviderEvent>,
    usage: Usage,
    call_index: u32,
    model: String,
    /// The call's `model_call` span, ended when the call is.
    span: tracing::Span,
}

pub(super) enum OpenOutcome {
    Opened(Opened),
    Failed(ProviderError),
    Cancelled,
}

pub(super) enum StepOutcome {
    Finished(StopReason),
    Failed(ProviderError),
    Cancelled,
}

/// One model call as relayed to the client.
pub(super) struct Step {
    pub text: String,
    pub calls: Vec<ToolCall>,
    pub outcome: StepOutcome,
}

impl TurnTask {
    /// Tries each model of the route until one produces output (T10 fallbacks).
    pub(super) async fn open(&self, progress: &mut Progress) -> OpenOutcome {
        let Progress {
            request,
            calls_made,
            usage_log,
            ..
        } = progress;
        let mut last_error = ProviderError::Unavailable(Unavailable::Connect);
        for route in &self.rules.route {
            let Ok(parsed) = ModelRoute::parse(route) else {
                // Routes are validated when the agent is written; a bad one is skipped.
                continue;
            };
            let call_index = *calls_made;
            *calls_made += 1;
            let span = super::spans::model_call_span(route, &parsed, self.ids.chat, call_index);
            let provider = self.deps.providers.get(parsed.provider).clone();
            parsed.model.clone_into(&mut request.model);
            let asked = Instant::now();
            let connected = tokio::select! {
                biased;
                () = self.cut() => {
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
                    tracing::info!(turn = %self.ids.turn, call_index, class = err.metric_label(), "model route failed before output");
                    last_error = err;
                    continue;
                }
            };
            let mut usage = Usage::default();
            loop {
                let next = tokio::select! {
                    biased;
                    () = self.cut() => {
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
                        tracing::info!(turn = %self.ids.turn, call_index, class = err.metric_label(), "model stream failed before output");
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
    pub(super) async fn relay(
        &self,
        opened: Opened,
        iteration: u32,
        usage_log: &mut Vec<ModelCallUsage>,
    ) -> Step {
        let Opened {
            mut stream,
            mut pending,
            usage,
            call_index,
            model,
            span,
        } = opened;
        let mut gathered = Gathered {
            text_id: format!("text-{iteration}"),
            usage,
            ..Gathered::default()
        };
        let outcome = loop {
            let next = match pending.pop_front() {
                Some(event) => Some(Ok(event)),
                None => tokio::select! {
                    biased;
                    () = self.cut() => break StepOutcome::Cancelled,
                    next = stream.next() => next,
                },
            };
            let event = match next {
                Some(Ok(event)) => event,
                Some(Err(err)) => break StepOutcome::Failed(err),
                None => {
                    break StepOutcome::Failed(ProviderError::Unavailable(Unavailable::Incomplete));
                }
            };
            if let Some(outcome) = self.relay_event(event, &mut gathered).await {
                break outcome;
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
        record_call(&span, gathered.usage, label);
        drop(span);
        usage_log.push(call_usage(call_index, &model, gathered.usage));
        if gathered.text_open {
            self.client
                .send(UiChunk::TextEnd {
                    id: gathered.text_id,
                })
                .await;
        }
        // T5: calls of a stream that did not finish are discarded, never run.
        if !matches!(outcome, StepOutcome::Finished(_)) {
            gathered.calls.clear();
        }
        Step {
            text: gathered.text,
            calls: gathered.calls,
            outcome,
        }
    }

    /// Relays one event of the model's stream to the client, or gathers it; the step's
    /// outcome once it ends here (the model finished, the client went away).
    async fn relay_event(
        &self,
        event: ProviderEvent,
        gathered: &mut Gathered,
    ) -> Option<StepOutcome> {
        let chunk = match event {
            ProviderEvent::TextDelta(delta) => {
                return (!self.relay_text(delta, gathered).await).then_some(StepOutcome::Cancelled);
            }
            ProviderEvent::ToolInputStart { id, name } => {
                let tool = self.deps.toolset.get(&name);
                if tool.is_some_and(|tool| tool.redacts_input()) {
                    gathered.hidden_inputs.insert(id.clone());
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
            // The raw fragments of a tool whose input is redacted (a secret's value) are
            // not streamed; its redacted input follows in `tool-input-available`.
            ProviderEvent::ToolInputDelta { id, .. } if gathered.hidden_inputs.contains(&id) => {
                return None;
            }
            ProviderEvent::ToolInputDelta { id, delta } => UiChunk::ToolInputDelta {
                tool_call_id: id,
                input_text_delta: delta,
            },
            ProviderEvent::ToolCall(call) => {
                gathered.calls.push(call);
                return None;
            }
            ProviderEvent::Usage(u) => {
                gathered.usage.merge(u);
                return None;
            }
            ProviderEvent::Finished(reason) => return Some(StepOutcome::Finished(reason)),
        };
        (!self.client.send(chunk).await).then_some(StepOutcome::Cancelled)
    }

    /// Sends a text delta (opening the text part first); whether the client took it. Only
    /// text the client accepted counts as delivered (T8).
    async fn relay_text(&self, delta: String, gathered: &mut Gathered) -> bool {
        if !gathered.text_open {
            gathered.text_open = true;
            let start = UiChunk::TextStart {
                id: gathered.text_id.clone(),
            };
            if !self.client.send(start).await {
                return false;
            }
        }
        let len = gathered.text.len();
        gathered.text.push_str(&delta);
        let chunk = UiChunk::TextDelta {
            id: gathered.text_id.clone(),
            delta,
        };
        if !self.client.send(chunk).await {
            gathered.text.truncate(len);
            return false;
        }
        true
    }
}

/// What one model call's relay gathered so far.
#[derive(Default)]
struct Gathered {
    text_id: String,
    /// The text the client accepted.
    text: String,
    text_open: bool,
    calls: Vec<ToolCall>,
    /// The calls whose input fragments are not streamed (a tool that redacts its input).
    hidden_inputs: std::collections::HashSet<String>,
    usage: Usage,
}

/// What a `model_call` span ends with: the token counts the provider reported.
fn record_call(span: &tracing::Span, usage: Usage, outcome: &str) {
    super::spans::record_model_usage(span, usage.input_tokens, usage.output_tokens);
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
