//! The loop of one turn (SPEC T4-T8): model call, tool calls, model call, ... until the
//! model answers without tools or a ceiling is hit. One step at a time: a step is a model
//! call (`model_call.rs`) and then the tool calls it asked for (`tool_calls.rs`); what the
//! next step needs is [`Progress`], the whole state of the loop between steps.
//!
//! - A length-truncated call is retried once, then refused with a result the model can
//!   read; at the iteration ceiling it is refused at once, so a turn never makes more than
//!   `max_iterations` calls.
//! - A length-truncated answer without calls is continued (T19, `continuation.rs`), each
//!   continuation one of those calls; the step's text is then one part, shown once.
//! - A turn silent for `stuck_after` is cut like a stop and ends `turn_stuck` (T20,
//!   `crate::liveness`).
//! - Every `select!` races the turn's cancellation: a cancelled turn stops its provider
//!   stream and running tools, stores a synthetic result for every call without one, and
//!   starts no tool after the cancel (T8).
//! - Traces (O2): the task runs in its `turn` span; each model route tried is a
//!   `model_call` span and each tool run a `tool_call` span, children of the turn.

use protocol::MessageId;
use protocol::parts::Part;
use protocol::ui::{FinishReason, UiChunk};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::compose::Ready;
use super::history::{assistant_messages, replay_chunks, tool_part};
use super::model_call::{OpenOutcome, Shown, Step, StepOutcome};
use super::output::Client;
use super::state::{Deps, Ids, Progress, Rules, Running, TurnTask};
use super::takeover::{Restored, Saving};
use super::tool_calls::Executed;
use super::wrap_up::{End, Unfinished};
use super::{Launch, TurnError, speculation};
use super::{context, continuation};
use crate::Engine;
use crate::tools::ToolOutput;
use providers::{Message, ModelRequest, StopReason, ToolCall, ToolResult};
use store::{NewApproval, TurnBasis, requested_part};

/// What a step leads to.
enum Flow {
    Next,
    End(End),
    /// Every route failed before any output, and the client still waits for its answer:
    /// the turn ends with the request's error instead of a stream.
    Unanswered(providers::ProviderError),
}

impl TurnTask {
    pub(super) fn new(
        state: &Engine,
        launch: Launch,
        basis: &TurnBasis,
        ready: Ready,
        running: Running,
        tx: mpsc::Sender<UiChunk>,
        attached: bool,
    ) -> Self {
        let ids = Ids {
            team: launch.team,
            agent: basis.agent.id,
            chat: launch.chat,
            turn: running.turn,
            replica: state.replica,
        };
        let metrics = state
            .metrics
            .turn_started(ready.route.first().map_or("", String::as_str));
        Self {
            ids,
            deps: Deps {
                store: state.store.clone(),
                bases: state.bases.clone(),
                connections: state.connections.clone(),
                model_catalog: state.config.model_catalog.clone(),
                team_catalog: tokio::sync::OnceCell::new(),
                toolset: ready.toolset,
            },
            rules: Rules {
                route: ready.route,
                limits: state.config.limits,
                policy: basis.agent.approval_policy.clone(),
                approval_ttl: state.config.approval_ttl,
                stream_reasoning: basis.agent.stream_reasoning,
            },
            client: Client::new(
                (ids.chat, ids.turn),
                tx,
                state.events.clone(),
                running.cancel.clone(),
                !attached,
                state.config.client_stall_timeout,
                ready.connector_status,
            )
            .with_recalled(ready.recalled.clone()),
            cancel: running.cancel,
            budget: running.budget,
            fold: Some(ready.fold),
            resume: ready.resume,
            speculation: speculation::Speculation::new(
                &state.sessions,
                state.config.workers.speculation_grace,
                ids.team,
                ids.agent,
                ids.chat,
                launch.authority.user(),
            ),
            metrics,
            authority: launch.authority,
            lineage: launch.lineage,
            lost: running.lost,
            handover: state.handover.clone(),
            first: Some(Progress {
                request: ready.request,
                // B5: the recalled passages' sources lead the answer, as the stream shows.
                parts: ready
                    .recalled
                    .iter()
                    .cloned()
                    .map(Part::SourceDocument)
                    .collect(),
                usage_log: Vec::new(),
                assistant_id: MessageId::new(),
                calls_made: 0,
                tool_calls: 0,
                writes_used: 0,
                truncation_retried: false,
                iteration: 0,
            }),
            resumed: false,
            _running: running.registration,
        }
    }

    /// D3: continues from a taken-over turn's last completed step (`None`: it died in its
    /// first), its completed steps appended to the request as the model saw them.
    pub(super) fn resume_from(&mut self, restored: Option<Restored>) {
        self.resumed = true;
        // The stream starts over with a replay of the parts, which hold the recalled
        // sources (restored, or the first ones): shown once, by the replay.
        self.client.recalled.clear();
        let (Some(progress), Some(restored)) = (self.first.as_mut(), restored) else {
            return;
        };
        assistant_messages(&restored.parts, &mut progress.request.messages);
        progress.parts = restored.parts;
        progress.usage_log = restored.usage_log;
        progress.assistant_id = restored.assistant_id;
        progress.calls_made = restored.calls_made;
        progress.tool_calls = restored.tool_calls;
        progress.writes_used = restored.writes_used;
        progress.truncation_retried = restored.truncation_retried;
        progress.iteration = restored.iteration;
    }

    /// Runs the turn to its end; `started` hears whether the stream opened or why not.
    pub(super) async fn run(mut self, started: oneshot::Sender<Result<(), TurnError>>) {
        // A task that stops without writing its end state (a panic) still ends the turn.
        let mut unfinished = Unfinished::new(&self.deps.store, self.ids);
        self.client.started = Some(started);
        let Some(mut progress) = self.first.take() else {
            return;
        };
        // T20: ends with the loop; the wrap-up has its own bounds.
        let watch = self
            .client
            .liveness
            .watch(self.rules.limits.stuck_after, self.cancel.clone());
        if self.resumed {
            // D5: the stream starts over with the durable steps (not the dead replica's
            // partial chunks), so a reader rebuilds the message from this `start` alone.
            self.client.begin(progress.assistant_id).await;
            for chunk in replay_chunks(&progress.parts) {
                self.client.send(chunk).await;
            }
            self.client
                .notice("resumed", "the replica running this turn stopped; another one continues it from its last completed step")
                .await;
        }
        if !self.resume.is_empty() {
            // A continuation has its status decided already (its answer was accepted):
            // the stream opens at once, with the answered calls' outcomes first.
            self.client.begin(progress.assistant_id).await;
            // Boxed, as `unanswered` below: their transactions would otherwise weigh in
            // every turn task's future, which the spawn moves (measured in
            // docs/design/performance-history.md: futures not moved whole).
            Box::pin(self.run_answered(&mut progress)).await;
        }
        let end = loop {
            match self.step(&mut progress).await {
                Flow::Next => {}
                Flow::End(end) => break end,
                Flow::Unanswered(err) => {
                    drop(watch);
                    Box::pin(self.unanswered(err, progress, &mut unfinished)).await;
                    return;
                }
            }
        };
        drop(watch);
        self.wrap_up(end, progress, &mut unfinished).await;
    }

    /// One step: a model call, then the tool calls it asked for.
    async fn step(&mut self, progress: &mut Progress) -> Flow {
        // D4: the drain's time is over; this boundary is where another replica goes on.
        if self.handover.is_cancelled() {
            return Flow::End(End::HandedOver);
        }
        // Only a turn taken over at its ceiling gets here with no call left to make.
        if progress.iteration >= self.rules.limits.max_iterations {
            return Flow::End(End::Completed(FinishReason::Other));
        }
        // X5: a delegated task's model calls count against its whole tree's.
        if let Some(lineage) = &self.lineage
            && !lineage.tree.take_model_call()
        {
            return Flow::End(End::Completed(FinishReason::Other));
        }
        progress.iteration += 1;
        // The first call was reserved at admission; every further one reserves its own.
        if progress.iteration > 1 {
            match self
                .budget
                .reserve(context::request_tokens(&progress.request))
                .await
            {
                Ok(None) => {}
                Ok(Some(refusal)) => return Flow::End(End::Refused(refusal)),
                Err(err) => {
                    tracing::warn!(turn = %self.ids.turn, class = err.metric_label(), "quota unknown mid-turn");
                    return Flow::End(End::QuotaUnknown);
                }
            }
        }
        let opened = match self.open(progress).await {
            OpenOutcome::Opened(opened) => opened,
            OpenOutcome::Cancelled => {
                // Stopped while the model was still silent (T8): a client still attached
                // gets a stream that ends `interrupted`, not an error.
                self.client.begin(progress.assistant_id).await;
                return Flow::End(self.cut_short());
            }
            OpenOutcome::Failed(err) if self.client.started.is_some() => {
                return Flow::Unanswered(err);
            }
            OpenOutcome::Failed(err) => return Flow::End(End::Failed(err)),
        };
        self.client.begin(progress.assistant_id).await;
        self.client.send(UiChunk::StartStep).await;
        progress.parts.push(Part::StepStart);
        let shown = Shown::new(progress.iteration);
        let step = self
            .relay(opened, shown, false, &mut progress.usage_log)
            .await;
        let mut step = self.continue_cut(step, progress).await;
        self.end_text(&mut step.shown).await;
        progress.tool_calls += step.calls.len();
        if !step.shown.text.is_empty() {
            progress.parts.push(Part::Text {
                text: step.shown.text.clone(),
            });
        }
        let reason = match step.outcome {
            StepOutcome::Cancelled => return Flow::End(self.cut_short()),
            StepOutcome::Failed(err) => return Flow::End(End::Failed(err)),
            StepOutcome::Finished(reason) => reason,
        };
        if step.calls.is_empty() {
            self.client.send(UiChunk::FinishStep).await;
            return Flow::End(End::Completed(finish_reason(reason)));
        }
        self.tool_step(step, reason, progress).await
    }

    /// T19: an answer the output limit cut, with no tool call in it, is continued by
    /// further calls (at most `max_continuations`, each a model call of the turn, T6):
    /// the answer so far as the model's message, then an instruction to go on. The
    /// continuation joins the same text part. A continuation that cannot be made (the
    /// ceiling, the budget, every route failing) leaves the answer as it was cut.
    async fn continue_cut(&self, mut step: Step, progress: &mut Progress) -> Step {
        let limits = &self.rules.limits;
        for _ in 0..limits.max_continuations {
            let cut = matches!(step.outcome, StepOutcome::Finished(StopReason::Length));
            if !cut
                || !step.calls.is_empty()
                || step.shown.text.is_empty()
                || progress.iteration >= limits.max_iterations
            {
                break;
            }
            let asked = progress.request.messages.len();
            progress.request.messages.extend([
                Message::Assistant {
                    text: step.shown.text.clone(),
                    tool_calls: Vec::new(),
                },
                Message::User(continuation::INSTRUCTION.to_owned()),
            ]);
            let opened = if self.reserve_continuation(progress).await {
                progress.iteration += 1;
                Some(self.open(progress).await)
            } else {
                None
            };
            // Later calls see the joined answer, not the request to continue it.
            progress.request.messages.truncate(asked);
            let opened = match opened {
                Some(OpenOutcome::Opened(opened)) => opened,
                Some(OpenOutcome::Cancelled) => {
                    step.outcome = StepOutcome::Cancelled;
                    break;
                }
                Some(OpenOutcome::Failed(err)) => {
                    tracing::info!(turn = %self.ids.turn, class = err.metric_label(), "a cut answer could not be continued");
                    break;
                }
                None => break,
            };
            step = self
                .relay(opened, step.shown, true, &mut progress.usage_log)
                .await;
        }
        step
    }

    /// Whether the team's budgets allow the continuing call (as any further call).
    async fn reserve_continuation(&self, progress: &Progress) -> bool {
        let tokens = context::request_tokens(&progress.request);
        match self.budget.reserve(tokens).await {
            Ok(None) => true,
            Ok(Some(refusal)) => {
                tracing::info!(turn = %self.ids.turn, field = refusal.field.name(), "a cut answer is not continued: budget spent");
                false
            }
            Err(err) => {
                tracing::warn!(turn = %self.ids.turn, class = err.metric_label(), "a cut answer is not continued: quota unknown");
                false
            }
        }
    }

    /// How a model call cut short ends the turn: handed over when the drain cut it (D4),
    /// else interrupted (a stop, a hang-up).
    fn cut_short(&self) -> End {
        if self.handover.is_cancelled() && !self.cancel.is_cancelled() {
            End::HandedOver
        } else {
            End::Interrupted
        }
    }

    /// A model call is cut by the turn's cancel (a stop, a hang-up) or by the drain's
    /// handover (D4); a tool call only by the cancel, so a handover waits for it.
    pub(super) async fn cut(&self) {
        tokio::select! {
            () = self.cancel.cancelled() => {}
            () = self.handover.cancelled() => {}
        }
    }

    /// The second half of a step: the answer's tool calls, run or refused, and their
    /// results appended to the request for the next step.
    async fn tool_step(&self, step: Step, reason: StopReason, progress: &mut Progress) -> Flow {
        let truncated = reason == StopReason::Length;
        let limits = &self.rules.limits;
        let refusal = if truncated && progress.truncation_retried {
            Some(
                "refused: this tool call was cut off by the output token limit twice; \
                 make its arguments shorter"
                    .to_owned(),
            )
        } else if progress.iteration >= limits.max_iterations {
            // A cut-off answer at the ceiling is refused, not retried: a retry would be
            // one model call more than the ceiling allows.
            Some(format!(
                "not run: the turn reached its ceiling of {} model calls",
                limits.max_iterations
            ))
        } else if truncated {
            progress.truncation_retried = true;
            self.client
                .notice(
                    "truncated_tool_call",
                    "a tool call was cut off by the output limit; asking again",
                )
                .await;
            self.client.send(UiChunk::FinishStep).await;
            // The cut-off call is not part of the history: the retry starts from the
            // same conversation.
            progress.parts.pop_if(|p| matches!(p, Part::Text { .. }));
            progress.parts.pop_if(|p| matches!(p, Part::StepStart));
            return Flow::Next;
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
            None => {
                // D2: the model's answer is durable before its calls run; taken over from
                // here, they answer `outcome_unknown` instead of running twice.
                if let Saving::TakenOver = self.save(progress, &step.calls).await {
                    return Flow::End(End::TakenOver);
                }
                self.execute(&step.calls, &mut progress.writes_used).await
            }
        };
        let waiting = self.record_results(&step.calls, &results, &held, cancelled, progress);
        if !waiting.is_empty() {
            return Flow::End(End::AwaitingApproval(waiting));
        }
        append_results(&mut progress.request, step, &results);
        self.client.send(UiChunk::FinishStep).await;
        if cancelled {
            return Flow::End(End::Interrupted);
        }
        // D2: the step is complete and durable before the next one begins.
        if let Saving::TakenOver = self.save(progress, &[]).await {
            return Flow::End(End::TakenOver);
        }
        if progress.iteration >= limits.max_iterations {
            self.client
                .notice(
                    "iteration_ceiling",
                    &format!(
                        "the turn stopped at its ceiling of {} model calls",
                        limits.max_iterations
                    ),
                )
                .await;
            return Flow::End(End::Completed(FinishReason::Other));
        }
        Flow::Next
    }

    /// Adds the calls' parts to the answer: a result, or a request for approval (A3) for
    /// the `held` ones, which are returned to be stored with the turn's end.
    fn record_results(
        &self,
        calls: &[ToolCall],
        results: &[(Value, ToolOutput)],
        held: &[usize],
        cancelled: bool,
        progress: &mut Progress,
    ) -> Vec<NewApproval> {
        let mut waiting = Vec::new();
        let expires_at = chrono::Utc::now()
            + chrono::Duration::from_std(self.rules.approval_ttl).unwrap_or(chrono::Duration::MAX);
        for (index, (call, (input, output))) in calls.iter().zip(results).enumerate() {
            if held.contains(&index) && !cancelled {
                let id = uuid::Uuid::now_v7();
                waiting.push(NewApproval {
                    id,
                    part_index: i32::try_from(progress.parts.len()).unwrap_or(i32::MAX),
                    tool_call_id: call.id.clone(),
                    tool: call.name.clone(),
                    input: input.clone(),
                    expires_at,
                });
                progress
                    .parts
                    .push(requested_part(&call.name, &call.id, input, id));
            } else {
                progress.parts.push(tool_part(call, input, output, None));
                // B5: the passages the call answered, as the stream showed them.
                progress
                    .parts
                    .extend(output.sources.iter().cloned().map(Part::SourceDocument));
            }
        }
        waiting
    }
}

/// The answer and its results, as the next model call reads them. Later requests carry
/// the calls as shown (redacted), not as the model wrote them.
fn append_results(request: &mut ModelRequest, step: Step, results: &[(Value, ToolOutput)]) {
    let shown_calls = step
        .calls
        .iter()
        .zip(results)
        .map(|(call, (input, _))| ToolCall {
            // Arguments that were not JSON are shown (and re-sent) as text: the raw text,
            // or what the tool's redaction left of it.
            arguments: match input {
                Value::String(shown) => shown.clone(),
                other => other.to_string(),
            },
            ..call.clone()
        })
        .collect();
    request.messages.push(Message::Assistant {
        text: step.shown.text,
        tool_calls: shown_calls,
    });
    request.messages.push(Message::ToolResults(
        step.calls
            .iter()
            .zip(results)
            .map(|(call, (_, output))| ToolResult {
                call_id: call.id.clone(),
                content: output.content.clone(),
                is_error: output.is_error,
                images: output.images.clone(),
            })
            .collect(),
    ));
}

fn finish_reason(reason: StopReason) -> FinishReason {
    match reason {
        StopReason::Stop => FinishReason::Stop,
        StopReason::Length => FinishReason::Length,
        StopReason::ToolCalls => FinishReason::ToolCalls,
        StopReason::Other => FinishReason::Other,
    }
}
