//! The `delegate` tool (B7): a turn hands a task to one of the agents its agent names in
//! `delegates`, which runs it as a turn of its own in a new child chat (its own prompt,
//! tools and model, the task as its message) while the parent's stream shows it working
//! as `data-delegation` chunks. The child's final answer is the call's result.
//!
//! A child never exceeds its parent (X5): it acts with the parent turn's authority, its
//! approvals fail closed (nobody is there to answer), its token is a child of the
//! delegate call's (a stop, cancel, hang-up or takeover of the parent ends it), and its
//! tree is bounded: depth, calls at once per turn, model calls in all, and no agent twice
//! in one chain. See docs/design/delegation.md.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use protocol::ui::{Delegation, DelegationEvent, FinishReason, UiChunk};
use protocol::{AgentId, ChatId, TurnId};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::{Launch, Trigger, TurnError, TurnInput, start};
use crate::Engine;
use crate::tools::{Tool, ToolCtx, ToolOutput, parse_args, schema_of};
use domain::approvals::RiskClass;
use providers::ToolSpec;
use store::{AgentRow, bounded};

/// How a delegated task's refused approval begins; the delegate tool quotes such
/// refusals to the parent.
pub(super) const APPROVAL_REFUSED: &str = "refused in a delegated task: ";

/// The longest task, in characters.
const MAX_TASK: usize = 20_000;

/// The model calls one tree of delegated turns has left (X5), shared by all its turns.
pub(super) struct Tree {
    left: AtomicU32,
}

impl Tree {
    fn new(max: u32) -> Arc<Self> {
        Arc::new(Self {
            left: AtomicU32::new(max),
        })
    }

    /// Takes one model call; `false` when none is left.
    pub fn take_model_call(&self) -> bool {
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(1)
            })
            .is_ok()
    }

    fn spent(&self) -> bool {
        self.left.load(Ordering::Acquire) == 0
    }
}

/// A delegated turn's place in its tree.
#[derive(Clone)]
pub(super) struct Lineage {
    /// This turn's depth: 1 for a task the turn a person started delegated.
    pub depth: u32,
    /// The agents above this turn, from the tree's root down to its parent's.
    pub chain: Vec<AgentId>,
    pub tree: Arc<Tree>,
    /// The parent's delegate call token: the child's own is its child.
    pub cancel: CancellationToken,
}

/// Arguments of `delegate`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct DelegateArgs {
    /// The agent to hand the task to: one of the names (or ids) this tool lists.
    agent: String,
    /// The task, self-contained: the delegate sees nothing else of this conversation.
    task: String,
}

/// The `delegate` tool of one turn: it holds the engine (to start the child) and the
/// turn's place in its tree, so it is made per turn, never shared.
pub(super) struct Delegate {
    engine: Engine,
    /// The calling turn's agent.
    agent: AgentId,
    delegates: Vec<AgentRow>,
    /// The calling turn's own lineage; `None` for a turn nobody delegated.
    lineage: Option<Lineage>,
    tree: Arc<Tree>,
    /// The calls of this turn that run at once (`max_parallel`).
    slots: Arc<Semaphore>,
}

/// The delegate tool for a turn of `agent`, when its agent names live delegates.
pub(super) async fn tool(
    state: &Engine,
    agent: &AgentRow,
    lineage: Option<&Lineage>,
) -> Option<Arc<dyn Tool>> {
    if agent.delegates.is_empty() {
        return None;
    }
    let delegates = match bounded(state.store.agents_by_id(agent.team_id, &agent.delegates)).await {
        Ok(rows) if rows.is_empty() => return None,
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(agent = %agent.id, class = e.metric_label(), "delegates unreadable; no delegate tool");
            return None;
        }
    };
    let config = state.config.delegation;
    Some(Arc::new(Delegate {
        engine: state.clone(),
        agent: agent.id,
        delegates,
        tree: lineage.map_or_else(
            || Tree::new(config.max_tree_model_calls),
            |l| l.tree.clone(),
        ),
        lineage: lineage.cloned(),
        slots: Arc::new(Semaphore::new(config.max_parallel as usize)),
    }))
}

impl Tool for Delegate {
    fn metric_label(&self) -> &'static str {
        "delegate"
    }

    fn spec(&self) -> ToolSpec {
        let listed: Vec<String> = self
            .delegates
            .iter()
            .map(|a| format!("- {} (id {})", a.name, a.id))
            .collect();
        ToolSpec {
            name: "delegate".into(),
            description: format!(
                "Hand a task to another agent, which works on it with its own tools and \
                 answers; its answer is this call's result. Several calls in one step run \
                 at once (at most {}). The agents you may delegate to:\n{}",
                self.engine.config.delegation.max_parallel,
                listed.join("\n")
            ),
            input_schema: schema_of::<DelegateArgs>(),
        }
    }

    /// The child's own calls are counted and gated in its own turn: the delegation itself
    /// changes nothing, so calls of one step run at once.
    fn risk(&self) -> RiskClass {
        RiskClass::Read
    }

    fn writes(&self) -> bool {
        false
    }

    fn call<'a>(
        &'a self,
        ctx: &'a ToolCtx,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, ToolOutput> {
        // Taken before the first await, so the calls of one step claim slots in call order.
        let slot = self.slots.clone().try_acquire_owned();
        async move {
            let args: DelegateArgs = match parse_args(arguments) {
                Ok(args) => args,
                Err(e) => return e,
            };
            let task = args.task.trim();
            if task.is_empty() || task.chars().count() > MAX_TASK || task.contains('\0') {
                return ToolOutput::error(format!("task must have 1 to {MAX_TASK} characters"));
            }
            let delegate = match self.checked(&args.agent) {
                Ok(delegate) => delegate,
                Err(refusal) => return refusal,
            };
            let Ok(_slot) = slot else {
                return ToolOutput::error(format!(
                    "at most {} delegated tasks run at once in one turn; wait for these \
                     answers and delegate the rest in your next step",
                    self.engine.config.delegation.max_parallel
                ));
            };
            if self.tree.spent() {
                return ToolOutput::error(
                    "the model calls of this tree of delegated tasks are spent; answer with \
                     what you have",
                );
            }
            self.run(ctx, delegate, task).await
        }
        .boxed()
    }
}

impl Delegate {
    /// The named delegate, unless handing it the task would go too deep or come back to an
    /// agent already working on it (X5).
    fn checked(&self, wanted: &str) -> Result<&AgentRow, ToolOutput> {
        let wanted = wanted.trim();
        let Some(delegate) = self
            .delegates
            .iter()
            .find(|a| a.id.to_string() == wanted || a.name.eq_ignore_ascii_case(wanted))
        else {
            let names: Vec<&str> = self.delegates.iter().map(|a| a.name.as_str()).collect();
            return Err(ToolOutput::error(format!(
                "no delegate named `{wanted}`; you may delegate to: {}",
                names.join(", ")
            )));
        };
        let depth = self.lineage.as_ref().map_or(0, |l| l.depth) + 1;
        let max = self.engine.config.delegation.max_depth;
        if depth > max {
            return Err(ToolOutput::error(format!(
                "refused: delegated tasks go at most {max} deep and this one would be {depth} \
                 deep; do the task yourself"
            )));
        }
        let chain = self.chain();
        if chain.contains(&delegate.id) {
            return Err(ToolOutput::error(format!(
                "refused: recursive delegation: `{}` is already working on this task further \
                 up the chain; do the task yourself",
                delegate.name
            )));
        }
        Ok(delegate)
    }

    /// The agents from the tree's root down to this turn's.
    fn chain(&self) -> Vec<AgentId> {
        let mut chain = self
            .lineage
            .as_ref()
            .map(|l| l.chain.clone())
            .unwrap_or_default();
        chain.push(self.agent);
        chain
    }

    /// Starts the child turn and follows it to its end.
    async fn run(&self, ctx: &ToolCtx, delegate: &AgentRow, task: &str) -> ToolOutput {
        let state = &self.engine;
        // The child chat is the parent's principal's, as a chat it opened itself.
        let chat = match bounded(state.store.create_chat(
            ctx.team,
            delegate.id,
            ctx.authority.user(),
        ))
        .await
        {
            Ok(chat) => chat.id,
            Err(e) => {
                tracing::warn!(turn = %ctx.turn, class = e.metric_label(), "delegate chat not created");
                return ToolOutput::error(
                    "the delegated task could not start: the store is unavailable",
                );
            }
        };
        let launch = Launch {
            team: ctx.team,
            chat,
            authority: ctx.authority.clone(),
            answerer: None,
            detached: false,
            lineage: Some(Lineage {
                depth: self.lineage.as_ref().map_or(0, |l| l.depth) + 1,
                chain: self.chain(),
                tree: self.tree.clone(),
                cancel: ctx.cancel.clone(),
            }),
        };
        let trigger = Trigger::User(TurnInput {
            content: task.to_owned(),
            client_message_id: None,
            files: Vec::new(),
            instructions: None,
        });
        let launched = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => return ToolOutput::error(crate::tools::CANCELLED_RESULT),
            launched = Box::pin(start(state, launch, trigger, None, None)) => launched,
        };
        let (body, turn) = match launched {
            Ok(super::Launched {
                body: Some(body),
                turn: Some(turn),
                ..
            }) => (body, turn),
            Ok(_) => return ToolOutput::error("the delegated task did not start"),
            Err(TurnError::Busy(_)) => {
                return ToolOutput::error(format!(
                    "`{}` is busy with another turn; try again later or do the task yourself",
                    delegate.name
                ));
            }
            Err(err) => {
                return ToolOutput::error(format!("the delegated task could not start: {err}"));
            }
        };
        if let Err(e) = bounded(state.store.set_parent_turn(ctx.team, turn, ctx.turn)).await {
            tracing::warn!(turn = %ctx.turn, class = e.metric_label(), "parent of a delegated turn not recorded");
        }
        let progress = Progress {
            ctx,
            turn,
            chat,
            agent: delegate.id,
        };
        progress.send(DelegationEvent::Started);
        let followed = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => None,
            followed = follow(body, &progress) => Some(followed),
        };
        let Some(followed) = followed else {
            return ToolOutput::error(crate::tools::CANCELLED_RESULT);
        };
        followed.answer(&delegate.name, self.tree.spent())
    }
}

/// Where a child's progress goes: the parent's stream, tagged with the delegate call.
struct Progress<'a> {
    ctx: &'a ToolCtx,
    turn: TurnId,
    chat: ChatId,
    agent: AgentId,
}

impl Progress<'_> {
    /// Live output only: a parent whose client reads slowly loses progress chunks rather
    /// than slowing the child (the call's result carries the answer).
    fn send(&self, event: DelegationEvent) {
        if let Some(ui) = &self.ctx.ui {
            let _ = ui.try_send(UiChunk::DataDelegation {
                data: Delegation {
                    tool_call_id: self.ctx.call_id.clone(),
                    turn_id: self.turn,
                    chat_id: self.chat,
                    agent_id: self.agent,
                    event,
                },
                transient: true,
            });
        }
    }
}

/// What the child's stream said by its end.
#[derive(Default)]
struct Followed {
    /// The text of the child's last step that wrote any: its final answer.
    answer: String,
    step_text: String,
    /// The child's calls that would have asked a person (X5), with the refusal.
    refused: Vec<String>,
    error: Option<String>,
    finish: Option<FinishReason>,
}

impl Followed {
    fn answer(self, name: &str, spent: bool) -> ToolOutput {
        let mut answer = if self.step_text.is_empty() {
            self.answer
        } else {
            self.step_text
        };
        if let Some(error) = self.error {
            return ToolOutput::error(format!("the delegated task of `{name}` failed: {error}"));
        }
        if matches!(self.finish, None | Some(FinishReason::Interrupted)) {
            return ToolOutput::error(format!(
                "the delegated task of `{name}` was interrupted before it answered"
            ));
        }
        // X5: a child the tree's limit stopped mid-task has no answer to give, only what
        // it wrote so far; the parent's model reads that as the call's error.
        if spent && self.finish == Some(FinishReason::Other) {
            let written = if answer.trim().is_empty() {
                String::new()
            } else {
                format!("; what it wrote before: {answer}")
            };
            return ToolOutput::error(format!(
                "the delegated task of `{name}` stopped: the model calls of this tree of \
                 delegated tasks are spent{written}"
            ));
        }
        for refusal in &self.refused {
            answer.push_str(&format!("\n\n[{refusal}]"));
        }
        if spent {
            answer.push_str(
                "\n\n[the model calls of this tree of delegated tasks are spent: the \
                 delegate may have stopped early]",
            );
        }
        if answer.trim().is_empty() {
            return ToolOutput::error(format!("`{name}` answered nothing"));
        }
        ToolOutput::ok(answer)
    }
}

/// Reads the child's stream to its end, showing its progress.
async fn follow(mut body: super::ui_stream::UiBody, progress: &Progress<'_>) -> Followed {
    let mut followed = Followed::default();
    while let Some(chunk) = body.next_chunk().await {
        match chunk {
            UiChunk::StartStep if !followed.step_text.is_empty() => {
                followed.answer = std::mem::take(&mut followed.step_text);
            }
            UiChunk::TextDelta { delta, .. } => {
                followed.step_text.push_str(&delta);
                progress.send(DelegationEvent::Text { delta });
            }
            UiChunk::ToolInputAvailable {
                tool_call_id,
                tool_name,
                ..
            } => {
                progress.send(DelegationEvent::ToolCall {
                    tool_call_id,
                    tool_name,
                });
            }
            UiChunk::ToolOutputAvailable { tool_call_id, .. } => {
                progress.send(DelegationEvent::ToolResult {
                    tool_call_id,
                    error: false,
                });
            }
            UiChunk::ToolOutputError {
                tool_call_id,
                error_text,
            } => {
                if error_text.starts_with(APPROVAL_REFUSED) {
                    followed.refused.push(error_text);
                }
                progress.send(DelegationEvent::ToolResult {
                    tool_call_id,
                    error: true,
                });
            }
            UiChunk::Error { error_text } => followed.error = Some(error_text),
            UiChunk::Finish { finish_reason } => followed.finish = Some(finish_reason),
            _ => {}
        }
    }
    let status = match (&followed.error, followed.finish) {
        (Some(_), _) => "failed",
        (None, Some(FinishReason::Interrupted)) => "interrupted",
        (None, Some(_)) => "completed",
        (None, None) => "interrupted",
    };
    progress.send(DelegationEvent::Finished {
        status: status.into(),
    });
    followed
}
