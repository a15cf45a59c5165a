//! One model call of a step (T10, T5): each model of the route is tried in order until one
//! produces output (`open`), then its output is relayed to the client as UI chunks and its
//! tool calls collected (`relay`). Calls of a stream that did not finish are discarded,
//! never run. Each route tried is a `model_call` span (route, adapter, token counts, time
//! to first output, outcome).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::time::Instant;

use futures_util::StreamExt;
use protocol::ui::UiChunk;
use tracing::Instrument;

use super::continuation;
use super::state::{Progress, TurnTask};
use crate::models::catalog::team_catalog;
use providers::{
    EventStream, ModelRequest, ProviderError, ProviderEvent, Reads, StopReason, ToolCall,
    Unavailable, Usage,
};
use store::ModelCallUsage;

/// A stream that produced its first output, with what came before it.
pub(super) struct Opened {
    stream: EventStream,
    pending: VecDeque<ProviderEvent>,
    usage: Usage,
    call_index: u32,
    model: String,
    /// The team connection it goes through (T14), whose failure is recorded on it.
    connection: Option<uuid::Uuid>,
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
    pub shown: Shown,
    pub calls: Vec<ToolCall>,
    pub outcome: StepOutcome,
}

/// A step's text part as shown so far: one part across the calls that continue a cut
/// answer (T19), so the client sees one text, and the transcript stores one.
pub(super) struct Shown {
    pub id: String,
    /// The text the client accepted.
    pub text: String,
    pub open: bool,
}

impl Shown {
    pub fn new(iteration: u32) -> Self {
        Self {
            id: format!("text-{iteration}"),
            text: String::new(),
            open: false,
        }
    }
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
            let resolved = match self.deps.connections.resolve(self.ids.team, route).await {
                Ok(resolved) => resolved,
                Err(err) => {
                    // A connection deleted since the agent was written (or unusable here)
                    // fails its route like an unavailable provider: the next is tried.
                    tracing::info!(turn = %self.ids.turn, class = err.class(), "model route unresolved");
                    continue;
                }
            };
            let call_index = *calls_made;
            *calls_made += 1;
            let span = super::spans::model_call_span(route, &resolved, self.ids.chat, call_index);
            let provider = resolved.provider.clone();
            resolved.model.clone_into(&mut request.model);
            let sent = self.fit(request, route).await;
            let asked = Instant::now();
            let connected = tokio::select! {
                biased;
                () = self.cut() => {
                    span.record("outcome", "cancelled");
                    return OpenOutcome::Cancelled;
                }
                result = provider.stream(&sent).instrument(span.clone()) => result,
            };
            let mut stream = match connected {
                Ok(stream) => stream,
                Err(err) => {
                    self.metrics.provider_error(&err);
                    self.deps
                        .connections
                        .failed(self.ids.team, resolved.connection, &err);
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
                self.client.liveness.progressed();
                match next {
                    Some(Ok(ProviderEvent::Usage(u))) => usage.merge(u),
                    Some(Ok(first_output)) => {
                        self.metrics.first_output(resolved.kind, asked.elapsed());
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
                            connection: resolved.connection,
                            span,
                        });
                    }
                    Some(Err(err)) => {
                        self.metrics.provider_error(&err);
                        self.deps
                            .connections
                            .failed(self.ids.team, resolved.connection, &err);
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

    /// T23: each model of the route gets only the files it reads, notes for the rest; a
    /// request without files goes as it is, uncopied.
    async fn fit<'r>(&self, request: &'r ModelRequest, route: &str) -> Cow<'r, ModelRequest> {
        if !request.has_attachments() {
            return Cow::Borrowed(request);
        }
        match request.fitted(self.reads(route).await) {
            Some(fitted) => Cow::Owned(fitted),
            None => Cow::Borrowed(request),
        }
    }

    /// What the model of `route` reads, by the team's catalog (T16); a model it does not
    /// list reads text only, since sending an image to a model without vision fails the
    /// whole request.
    async fn reads(&self, route: &str) -> Reads {
        let catalog = self.deps.team_catalog.get_or_try_init(|| {
            store::bounded(team_catalog(
                &self.deps.store,
                &self.deps.model_catalog,
                self.ids.team,
            ))
        });
        match catalog.await {
            Ok(catalog) => catalog
                .facts(route)
                .map_or(Reads::default(), |facts| Reads {
                    images: facts.vision,
                    documents: facts.documents,
                }),
            Err(err) => {
                tracing::warn!(turn = %self.ids.turn, class = err.metric_label(), "model catalog unread: files shown as notes");
                Reads::default()
            }
        }
    }

    /// Relays one model call to the client, its text appended to `shown` (held back
    /// until its overlap is known when it `continues` a cut answer, T19); collects its
    /// tool calls. The text part stays open: [`TurnTask::end_text`] closes it.
    pub(super) async fn relay(
        &self,
        opened: Opened,
        shown: Shown,
        continues: bool,
        usage_log: &mut Vec<ModelCallUsage>,
    ) -> Step {
        let Opened {
            mut stream,
            mut pending,
            usage,
            call_index,
            model,
            connection,
            span,
        } = opened;
        let mut gathered = Gathered {
            shown,
            held: continues.then(String::new),
            reasoning: Reasoning::Closed(format!("reasoning-{call_index}")),
            calls: Vec::new(),
            hidden_inputs: Default::default(),
            usage,
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
            // T20: every event is progress, also one the client is not shown.
            self.client.liveness.progressed();
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
        self.end_reasoning(&mut gathered).await;
        if let StepOutcome::Failed(err) = &outcome {
            self.metrics.provider_error(err);
            self.deps.connections.failed(self.ids.team, connection, err);
        }
        let label = match &outcome {
            StepOutcome::Finished(_) => "ok",
            StepOutcome::Cancelled => "cancelled",
            StepOutcome::Failed(err) => err.metric_label(),
        };
        record_call(&span, gathered.usage, label);
        drop(span);
        usage_log.push(call_usage(call_index, &model, gathered.usage));
        // T5: calls of a stream that did not finish are discarded, never run.
        if !matches!(outcome, StepOutcome::Finished(_)) {
            gathered.calls.clear();
        }
        Step {
            shown: gathered.shown,
            calls: gathered.calls,
            outcome,
        }
    }

    /// Closes the step's text part, if it was opened.
    pub(super) async fn end_text(&self, shown: &mut Shown) {
        if std::mem::take(&mut shown.open) {
            let id = shown.id.clone();
            self.client.send(UiChunk::TextEnd { id }).await;
        }
    }

    /// Relays one event of the model's stream to the client, or gathers it; the step's
    /// outcome once it ends here (the model finished, the client went away).
    async fn relay_event(
        &self,
        event: ProviderEvent,
        gathered: &mut Gathered,
    ) -> Option<StepOutcome> {
        // Text held back goes before anything else the answer shows, and before its end.
        let quiet = matches!(
            event,
            ProviderEvent::TextDelta(_)
                | ProviderEvent::Usage(_)
                | ProviderEvent::ReasoningDelta(_)
        );
        if !matches!(
            event,
            ProviderEvent::ReasoningDelta(_) | ProviderEvent::Usage(_)
        ) {
            self.end_reasoning(gathered).await;
        }
        if !quiet && !self.release_held(gathered).await {
            return Some(StepOutcome::Cancelled);
        }
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
            // Reasoning is never part of the answer (T18).
            ProviderEvent::ReasoningDelta(delta) => {
                return (!self.relay_reasoning(delta, gathered).await)
                    .then_some(StepOutcome::Cancelled);
            }
        };
        (!self.client.send(chunk).await).then_some(StepOutcome::Cancelled)
    }

    /// Shows a text delta, or holds it back while a continuation's overlap with the
    /// answer is undecided (T19); whether the client took what was sent.
    async fn relay_text(&self, delta: String, gathered: &mut Gathered) -> bool {
        let Some(held) = &mut gathered.held else {
            return self.show_text(delta, gathered).await;
        };
        held.push_str(&delta);
        if !continuation::decided(&gathered.shown.text, held) {
            return true;
        }
        self.release_held(gathered).await
    }

    /// Shows a continuation's held start, without what it repeats of the answer.
    async fn release_held(&self, gathered: &mut Gathered) -> bool {
        let Some(held) = gathered.held.take() else {
            return true;
        };
        let fresh = continuation::fresh(&gathered.shown.text, &held);
        if fresh.is_empty() {
            return true;
        }
        let fresh = fresh.to_owned();
        self.show_text(fresh, gathered).await
    }

    /// Sends a text delta (opening the text part first); whether the client took it. Only
    /// text the client accepted counts as delivered (T8).
    async fn show_text(&self, delta: String, gathered: &mut Gathered) -> bool {
        let shown = &mut gathered.shown;
        if !shown.open {
            shown.open = true;
            let start = UiChunk::TextStart {
                id: shown.id.clone(),
            };
            if !self.client.send(start).await {
                return false;
            }
        }
        let len = shown.text.len();
        shown.text.push_str(&delta);
        let chunk = UiChunk::TextDelta {
            id: shown.id.clone(),
            delta,
        };
        if !self.client.send(chunk).await {
            shown.text.truncate(len);
            return false;
        }
        true
    }
}

/// The call's reasoning part, by its id: streamed only to an agent that opts in (T18).
enum Reasoning {
    Closed(String),
    Open(String),
}

impl TurnTask {
    /// Shows a reasoning delta when the agent opts in (opening the part first), else drops
    /// it; whether the client took what was sent. It is never gathered: reasoning is not
    /// part of the answer, its transcript or the next request (T18).
    async fn relay_reasoning(&self, delta: String, gathered: &mut Gathered) -> bool {
        if !self.rules.stream_reasoning || delta.is_empty() {
            return true;
        }
        if let Reasoning::Closed(id) = &gathered.reasoning {
            let id = id.clone();
            gathered.reasoning = Reasoning::Open(id.clone());
            if !self.client.send(UiChunk::ReasoningStart { id }).await {
                return false;
            }
        }
        let (Reasoning::Open(id) | Reasoning::Closed(id)) = &gathered.reasoning;
        let id = id.clone();
        self.client
            .send(UiChunk::ReasoningDelta { id, delta })
            .await
    }

    /// Closes the reasoning part before anything else the call shows, and at its end.
    async fn end_reasoning(&self, gathered: &mut Gathered) {
        if let Reasoning::Open(id) = &gathered.reasoning {
            let id = id.clone();
            gathered.reasoning = Reasoning::Closed(id.clone());
            self.client.send(UiChunk::ReasoningEnd { id }).await;
        }
    }
}

/// What one model call's relay gathered so far.
struct Gathered {
    /// The step's text, this call's included.
    shown: Shown,
    /// A continuation's start, until its overlap with `shown` is decided (T19).
    held: Option<String>,
    reasoning: Reasoning,
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
