//! The tool calls of a step (T4-T6, A2-A3, X1): each call's arguments parsed and shown,
//! checked against the principal's authority and the agent's approval policy, then run.
//! Calls that do not write run concurrently; writes run in order, at most `max_writes`
//! per turn, the next one answered "budget spent" (T6). A continuation's approved calls
//! run here too (`run_answered`). Each run is a `tool_call` span (tool, outcome); a worker
//! call carries its context to the worker (`sessions/tool.rs`).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

use futures_util::future::{BoxFuture, OptionFuture};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use protocol::parts::Approval;
use protocol::ui::UiChunk;
use serde_json::Value;
use tracing::Instrument;

use super::history::{AWAITING_APPROVAL, answer_call, tool_part};
use super::state::{Progress, TurnTask};
use super::wrap_up::WRAP_UP_PATIENCE;
use crate::tools::{Tool, ToolCtx, ToolOutput};
use domain::approvals::{ApprovalState, Decision};
use providers::ToolCall;
use store::storable_text;

use crate::tools::CANCELLED_RESULT;

/// The outcome of one answer's tool calls.
pub(super) struct Executed {
    pub results: Vec<(Value, ToolOutput)>,
    /// The indexes of the calls that wait for a person (A3).
    pub held: Vec<usize>,
    pub cancelled: bool,
}

/// What the policy makes of a call before it runs.
enum Gate {
    Run,
    /// Answered without running.
    Refused(ToolOutput),
    /// Waits for a person (A3).
    Held,
}

impl TurnTask {
    /// Runs the calls of one model answer; returns (input, output) per call in call order
    /// and whether the turn was cancelled meanwhile.
    pub(super) async fn execute(&self, calls: &[ToolCall], writes_used: &mut u32) -> Executed {
        let cancel = self.cancel.child_token();
        let ui = self.client.tool_ui();
        let ctxs: Vec<ToolCtx> = calls
            .iter()
            .map(|call| ToolCtx {
                store: self.deps.store.clone(),
                team: self.ids.team,
                agent: self.ids.agent,
                chat: self.ids.chat,
                turn: self.ids.turn,
                call_id: call.id.clone(),
                ui: Some(ui.clone()),
                cancel: cancel.clone(),
                authority: self.authority.clone(),
                liveness: self.client.liveness.clone(),
            })
            .collect();
        let mut inputs = Vec::with_capacity(calls.len());
        let mut outputs: Vec<Option<ToolOutput>> = vec![None; calls.len()];
        let reads = FuturesUnordered::new();
        let mut writes: VecDeque<(usize, BoxFuture<'_, ToolOutput>)> = VecDeque::new();
        let mut held = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            let (input, input_shown) = self.parse_input(call);
            self.client
                .send(UiChunk::ToolInputAvailable {
                    tool_call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    input: input_shown.clone(),
                })
                .await;
            inputs.push(input_shown);
            let tool = self.deps.toolset.get(&call.name);
            match self.gate(call, tool, input.is_ok()) {
                Gate::Run => {}
                Gate::Refused(refusal) => {
                    outputs[index] = Some(refusal);
                    continue;
                }
                Gate::Held => {
                    held.push(index);
                    outputs[index] = Some(ToolOutput::error(AWAITING_APPROVAL));
                    continue;
                }
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
                    if *writes_used >= self.rules.limits.max_writes {
                        outputs[index] = Some(ToolOutput::error(format!(
                            "budget spent: this turn already made {} data-changing calls; \
                             tell the user what is left to do",
                            self.rules.limits.max_writes
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
                    .tool_not_run(self.deps.toolset.get(&call.name), "refused");
            }
        }
        let cancelled = self.drive(reads, writes, &mut outputs).await || self.cancel.is_cancelled();
        let outputs = outputs
            .into_iter()
            .map(|o| o.unwrap_or_else(|| ToolOutput::error(CANCELLED_RESULT)))
            .collect();
        let reported = self.report_outputs(calls, inputs, outputs, &held).await;
        Executed {
            results: reported,
            held,
            cancelled,
        }
    }

    /// What the principal's authority (X1) and the agent's policy (A2) make of a call
    /// before it runs.
    fn gate(&self, call: &ToolCall, tool: Option<&Arc<dyn Tool>>, input_ok: bool) -> Gate {
        // X1, before any approval is asked: an answer (even the turn's own principal's)
        // cannot lend the turn an authority its principal lacks.
        if let Some(refusal) = tool.and_then(|t| self.beyond_authority(t.as_ref(), &call.name)) {
            return Gate::Refused(refusal);
        }
        match tool.map(|t| self.rules.policy.decide(&call.name, t.risk())) {
            Some(Decision::Deny) => Gate::Refused(ToolOutput::error(format!(
                "refused: this agent's policy never runs `{}`; do without it",
                call.name
            ))),
            // The arguments of a tool that redacts them (a secret's value) are not stored,
            // so such a call cannot wait for an answer: it is refused.
            Some(Decision::Ask) if tool.is_some_and(|t| t.redacts_input()) => {
                Gate::Refused(ToolOutput::error(format!(
                    "refused: `{}` needs approval and its arguments cannot be kept while it \
                     waits; ask the user to do it themselves",
                    call.name
                )))
            }
            // X5: nobody answers a delegated task's questions; what would ask is denied,
            // and the delegate tool tells the parent why.
            Some(Decision::Ask) if self.lineage.is_some() => {
                Gate::Refused(ToolOutput::error(format!(
                    "{}`{}` needs a person's approval",
                    super::delegation::APPROVAL_REFUSED,
                    call.name
                )))
            }
            Some(Decision::Ask) if input_ok => Gate::Held,
            _ => Gate::Run,
        }
    }

    /// Runs the started calls to their ends (reads at once, writes one at a time, in call
    /// order) unless the turn is cancelled first: then it says so, and no tool starts
    /// after the cancel (T8).
    async fn drive<'a>(
        &self,
        mut reads: FuturesUnordered<impl Future<Output = (usize, ToolOutput)>>,
        mut writes: VecDeque<(usize, BoxFuture<'a, ToolOutput>)>,
        outputs: &mut [Option<ToolOutput>],
    ) -> bool {
        let mut current_write = writes.pop_front();
        while !reads.is_empty() || current_write.is_some() {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return true,
                Some((index, output)) = reads.next(), if !reads.is_empty() => outputs[index] = Some(output),
                Some(output) = OptionFuture::from(current_write.as_mut().map(|(_, f)| f)), if current_write.is_some() => {
                    if let Some((index, _)) = current_write.take() {
                        outputs[index] = Some(output);
                    }
                    if !self.cancel.is_cancelled() {
                        current_write = writes.pop_front();
                    }
                }
            }
        }
        false
    }

    /// Opens the client's stream: the message id, the turn, and the connectors' status.
    /// A3: a continuation's answered calls. The denied ones were written as denials
    /// when they were answered, and only their outcome is shown; the approved ones run
    /// now (in call order, writes counted against the turn's budget), their results go
    /// into their stored parts and in place of the waiting results the model would read.
    pub(super) async fn run_answered(&self, progress: &mut Progress) {
        let Progress {
            request,
            writes_used,
            ..
        } = progress;
        for approval in &self.resume {
            if approval.state != ApprovalState::Approved {
                self.metrics
                    .tool_not_run(self.deps.toolset.get(&approval.tool), "denied");
                self.client
                    .send(UiChunk::ToolOutputDenied {
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
            let output = match self.deps.toolset.get(&approval.tool) {
                None => ToolOutput::error(format!(
                    "not run: the tool `{}` is not available any more",
                    approval.tool
                )),
                Some(_) if self.cancel.is_cancelled() => ToolOutput::error(CANCELLED_RESULT),
                // X1: a change to the agent for everyone needs an admin on both sides of
                // the gate: the turn that asked and the person who answered.
                Some(tool) if tool.changes_agent() && !approval.answered_admin => {
                    ToolOutput::error(format!(
                        "refused: `{}` changes this agent for everyone, and only an admin may \
                         approve that; ask an admin of the team to answer",
                        approval.tool
                    ))
                }
                Some(tool) if tool.writes() && *writes_used >= self.rules.limits.max_writes => {
                    ToolOutput::error(format!(
                        "budget spent: this turn already made {} data-changing calls",
                        self.rules.limits.max_writes
                    ))
                }
                Some(tool) => {
                    if tool.writes() {
                        *writes_used += 1;
                    }
                    let ctx = ToolCtx {
                        store: self.deps.store.clone(),
                        team: self.ids.team,
                        agent: self.ids.agent,
                        chat: self.ids.chat,
                        turn: self.ids.turn,
                        call_id: call.id.clone(),
                        ui: Some(self.client.tx.clone()),
                        cancel: self.cancel.child_token(),
                        authority: self.authority.clone(),
                        liveness: self.client.liveness.clone(),
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
            let approved = Approval {
                id: approval.id,
                approved: true,
                reason: None,
            };
            let part = tool_part(&call, &input, &output, Some(approved));
            if let Err(class) = super::wrap_up::retrying(self.ids.turn, WRAP_UP_PATIENCE, || {
                self.deps
                    .store
                    .resolve_approval_part(self.ids.team, approval, &part)
            })
            .await
            {
                tracing::error!(turn = %self.ids.turn, class, "could not store an approved call's result");
            }
            answer_call(&mut request.messages, &call.id, &output);
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
        let span = super::spans::tool_span(name, &ctx.call_id);
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
    pub(super) fn parse_input(&self, call: &ToolCall) -> (Result<Value, serde_json::Error>, Value) {
        let raw = if call.arguments.trim().is_empty() {
            "{}"
        } else {
            &call.arguments
        };
        let parsed: Result<Value, _> = serde_json::from_str(raw);
        let shown = match (&parsed, self.deps.toolset.get(&call.name)) {
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
    pub(super) async fn report(
        &self,
        calls: &[ToolCall],
        outputs: Vec<ToolOutput>,
    ) -> Vec<(Value, ToolOutput)> {
        let mut inputs = Vec::with_capacity(calls.len());
        for call in calls {
            self.metrics
                .tool_not_run(self.deps.toolset.get(&call.name), "refused");
            let (_, input) = self.parse_input(call);
            self.client
                .send(UiChunk::ToolInputAvailable {
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
            self.client.send(chunk).await;
            for source in &output.sources {
                self.client.send(UiChunk::source_document(source)).await;
            }
        }
        inputs.into_iter().zip(outputs).collect()
    }
}

fn record_tool(span: &tracing::Span, output: &ToolOutput) {
    span.record("outcome", if output.is_error { "error" } else { "ok" });
}
