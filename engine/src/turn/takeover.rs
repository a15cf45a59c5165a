//! Durable turns (D2, D3): a turn's progress written at each step boundary, and the
//! takeover of a turn whose replica died by a live one, which continues it from its last
//! completed step.
//!
//! What is written (`Saved`, in `turns.progress`): the assistant parts so far, the usage
//! of the model calls made, and the loop's counters. A step with tool calls writes twice:
//! once the model's answer is complete (its calls marked pending), and once their results
//! are in. A step without tool calls is the turn's last, and its end state is the write
//! (`wrap_up.rs`): the no-tool turn costs no write more than before.
//!
//! Taken over, a turn:
//! - issues again the model call that was in flight (its partial output is dropped, never
//!   stored: only completed steps are);
//! - gets the outcome of each call that was pending where it can be had without running
//!   the call twice (`Tool::reattach`): a worker call is re-attached on its worker, which
//!   kept its outcome (or still runs it); a repeatable brain tool (a read, a set, or a
//!   write keyed by its call id) runs again. Any other call answers `outcome_unknown`
//!   (the model reads that the tool may or may not have run and was not run again; the
//!   transcript shows the same), so no call ever runs twice;
//! - holds its agent on (the hold is adopted by the turn's id), keeps its budget (its
//!   further calls reserve as any turn's do, its billed usage includes the dead replica's
//!   completed calls), and its tools act with the authority it started with (X1);
//! - has no client: it is detached, its chunks reach the chat's events stream (`GET
//!   /v1/chats/{id}/stream` follows it), which first gets a `data-notice` `resumed`.
//!
//! A turn taken over [`MAX_TAKEOVERS`] times ends `failed` (`takeover_limit`) instead.

use protocol::parts::Part;
use protocol::ui::UiChunk;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::admit;
use super::compose::offer;
use super::history::tool_part;
use super::state::{Progress, Running, TurnTask};
use super::{Launch, TurnError};
use crate::Engine;
use crate::auth::Authority;
use crate::tools::{ToolCtx, ToolOutput, Toolset};
use providers::ToolCall;
use store::{ModelCallUsage, StoreError, TakenOver, bounded, storable_text};

/// Takeovers a turn may have; the next lapse of its replica ends it `failed`.
pub const MAX_TAKEOVERS: i32 = 3;

/// What a tool call in flight at its replica's death answers, for the model and the
/// transcript.
pub(super) const OUTCOME_UNKNOWN: &str = "outcome_unknown: the replica running this tool \
     call stopped before its result was recorded; the tool may or may not have run, and it \
     was not run again. Check its effect before relying on it or calling it again.";

/// The loop's state as `turns.progress` keeps it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    /// The assistant message's id: the same across takeovers.
    assistant_id: protocol::MessageId,
    /// Completed parts.
    parts: Vec<Part>,
    /// Calls the model asked for whose results are not in yet.
    pending: Vec<Pending>,
    usage: Vec<ModelCallUsage>,
    calls_made: u32,
    tool_calls: usize,
    writes_used: u32,
    iteration: u32,
    truncation_retried: bool,
}

/// A call in flight when its step was written.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pending {
    id: String,
    name: String,
    /// As shown (redacted by its tool), like every stored input.
    input: Value,
}

/// The frozen composition's fields a takeover runs under (T3).
#[derive(Deserialize)]
struct Frozen {
    /// P9: the caller's instructions for the turn, absent when it had none.
    #[serde(default)]
    instructions: Option<String>,
    model_route: Vec<String>,
    max_iterations: u32,
    max_writes: u32,
    max_output_tokens: u32,
    summary_through: i64,
}

/// Whether a step write landed.
pub(super) enum Saving {
    Saved,
    /// Another replica took the turn over: this one must stop.
    TakenOver,
    /// The store failed: the turn goes on, less durable until its next write.
    Failed,
}

impl TurnTask {
    /// D2: writes `progress`, with `pending` calls (the model asked for them, they have
    /// not answered yet) marked so, fenced by this replica.
    pub(super) async fn save(&self, progress: &Progress, pending: &[ToolCall]) -> Saving {
        let pending = pending
            .iter()
            .map(|call| Pending {
                id: call.id.clone(),
                name: call.name.clone(),
                input: self.parse_input(call).1,
            })
            .collect();
        let saved = Saved {
            assistant_id: progress.assistant_id,
            parts: progress.parts.clone(),
            pending,
            usage: progress.usage_log.clone(),
            calls_made: progress.calls_made,
            tool_calls: progress.tool_calls,
            writes_used: progress.writes_used,
            iteration: progress.iteration,
            truncation_retried: progress.truncation_retried,
        };
        let Ok(saved) = serde_json::to_value(&saved) else {
            return Saving::Failed;
        };
        let ids = self.ids;
        match bounded(
            self.deps
                .store
                .save_progress(ids.team, ids.turn, ids.replica, &saved),
        )
        .await
        {
            Ok(true) => Saving::Saved,
            Ok(false) => {
                tracing::info!(turn = %ids.turn, "turn taken over by another replica; stopping here");
                Saving::TakenOver
            }
            Err(err) => {
                tracing::warn!(turn = %ids.turn, class = err.metric_label(), "could not save the turn's progress");
                Saving::Failed
            }
        }
    }
}

/// D3: continues `taken`, a turn this replica took over, from its last completed step, in
/// the background. A turn that cannot be continued (its chat or agent is gone, a store
/// failed) is ended `failed` so it does not stay `running` on this replica.
pub async fn take_over(state: &Engine, taken: TakenOver) {
    // The agent's name is not read before the turn resumes: the span is named by its
    // operation alone, as the GenAI conventions allow.
    let span = super::spans::turn_span(
        super::spans::TurnSpan {
            turn: taken.turn,
            chat: taken.chat,
            agent: taken.agent,
            team: taken.team,
            detached: true,
            resumed: true,
        },
        None,
    );
    match resume(state, taken).await {
        Ok(task) => {
            state.metrics.turns_reconciled.inc();
            let (started, _) = tokio::sync::oneshot::channel();
            state.turn_tracker.spawn(task.run(started).instrument(span));
        }
        Err(err) => {
            tracing::warn!(turn = %taken.turn, code = err.code().as_str(), "could not continue a taken-over turn; ending it");
            let ended = bounded(state.store.fail_turn(
                taken.team,
                taken.turn,
                state.replica,
                err.code(),
            ))
            .await;
            if let Err(err) = ended {
                tracing::warn!(turn = %taken.turn, class = err.metric_label(), "could not end a taken-over turn");
            }
            let _ = state
                .holds
                .release_lost(taken.team, taken.agent, taken.turn)
                .await;
        }
    }
}

/// The task of a taken-over turn, rebuilt from the store.
/// The frozen composition and the saved progress a turn's row keeps for a takeover.
fn decode(
    composition: Value,
    progress: Option<Value>,
) -> Result<(Frozen, Option<Saved>), TurnError> {
    let frozen = serde_json::from_value(composition)
        .map_err(|e| TurnError::Internal(format!("stored composition: {e}")))?;
    let saved = progress
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| TurnError::Internal(format!("stored progress: {e}")))?;
    Ok((frozen, saved))
}

async fn resume(state: &Engine, taken: TakenOver) -> Result<TurnTask, TurnError> {
    let TakenOver {
        team,
        agent,
        chat,
        turn,
        ..
    } = taken;
    let basis = bounded(state.store.chat_with_agent(team, chat))
        .await
        .map_err(|e| match e {
            StoreError::NotFound => TurnError::NotFound("chat"),
            other => other.into(),
        })?;
    let stored = bounded(state.store.resumable(team, turn, state.replica)).await?;
    let (frozen, saved) = decode(stored.composition, stored.progress)?;
    let through = frozen.summary_through;
    let history = bounded(state.store.messages_after(team, chat, through)).await?;
    let launch = Launch {
        team,
        chat,
        authority: Authority::of_turn(stored.actor, stored.actor_admin),
        answerer: None,
        detached: true,
        // A delegated task is not resumed as one: its parent's call answers
        // `outcome_unknown` (docs/design/delegation.md).
        lineage: None,
    };
    let (revoked, held) = super::standing::standing(state, team, &launch.authority).await?;
    let budget = admit::adopt(state, team, agent, turn, launch.authority.user()).await?;
    let cancel = state.turns_cancel.child_token();
    let mut registration = state.stops.register(turn, cancel.clone());
    // X1: the key's revocation or the team's disabling, on any replica, stops the turn as
    // it would have ended the stream of the turn it started.
    super::standing::follow(revoked.clone(), held, cancel.clone(), registration.ended());
    let (offered, connector_status) = offer(state, &launch, &basis, &cancel).await;
    let (request, fold, recalled) = super::compose::first_request(
        state,
        &launch,
        &basis,
        turn,
        &history,
        offered.catalog.clone(),
        frozen.model_route.clone(),
        frozen.max_output_tokens,
        frozen.instructions.as_deref(),
    )
    .await;
    let mut limits = state.config.limits;
    limits.max_iterations = frozen.max_iterations;
    limits.max_writes = frozen.max_writes;
    let ready = super::compose::Ready {
        request,
        route: frozen.model_route,
        toolset: offered.toolset.clone(),
        connector_status,
        fold,
        resume: Vec::new(),
        answered: Vec::new(),
        autostart: false,
        recalled,
    };
    let running = Running {
        turn,
        budget,
        cancel,
        registration,
        lost: Some(revoked),
    };
    // Nobody reads a taken-over turn's stream but the events stream.
    let (tx, _) = mpsc::channel::<UiChunk>(1);
    let restored = match saved {
        Some(mut saved) => {
            let pending = std::mem::take(&mut saved.pending);
            let ctx = ToolCtx {
                store: state.store.clone(),
                team,
                agent,
                chat,
                turn,
                call_id: String::new(),
                ui: None,
                cancel: running.cancel.child_token(),
                authority: launch.authority.clone(),
                liveness: Default::default(),
            };
            let answered = answer_pending(&offered.toolset, pending, &ctx).await;
            Some(Restored::from_saved(saved, answered))
        }
        None => None,
    };
    let mut task = TurnTask::new(state, launch, &basis, ready, running, tx, false);
    task.rules.limits = limits;
    task.resume_from(restored);
    Ok(task)
}

/// D3: the parts of the calls pending at the death, each with its outcome where
/// [`crate::tools::Tool::reattach`] can have it, else `outcome_unknown`.
async fn answer_pending(toolset: &Toolset, pending: Vec<Pending>, ctx: &ToolCtx) -> Vec<Part> {
    let answers = pending.into_iter().map(|call| async move {
        let ctx = ToolCtx {
            call_id: call.id.clone(),
            ..ctx.clone()
        };
        let output = match toolset.get(&call.name) {
            Some(tool) => tool.reattach(&ctx, call.input.clone()).await,
            None => None,
        };
        let outcome = if output.is_some() {
            "reattached"
        } else {
            "outcome_unknown"
        };
        let mut output = output.unwrap_or_else(|| ToolOutput::error(OUTCOME_UNKNOWN));
        if let std::borrow::Cow::Owned(clean) = storable_text(&output.content) {
            output.content = clean;
        }
        tracing::info!(tool = %call.name, outcome, "pending call answered after a takeover");
        let shown = ToolCall {
            id: call.id,
            name: call.name,
            arguments: String::new(),
        };
        tool_part(&shown, &call.input, &output, None)
    });
    futures_util::future::join_all(answers).await
}

impl Restored {
    /// What `saved` restores, its pending calls' parts replaced by `answered`.
    fn from_saved(saved: Saved, answered: Vec<Part>) -> Self {
        Self {
            parts: saved.parts.into_iter().chain(answered).collect(),
            usage_log: saved.usage,
            assistant_id: saved.assistant_id,
            calls_made: saved.calls_made,
            tool_calls: saved.tool_calls,
            writes_used: saved.writes_used,
            truncation_retried: saved.truncation_retried,
            iteration: saved.iteration,
        }
    }
}

/// The part of [`Progress`] a takeover restores; the request is rebuilt around it.
pub(super) struct Restored {
    pub parts: Vec<Part>,
    pub usage_log: Vec<ModelCallUsage>,
    pub assistant_id: protocol::MessageId,
    pub calls_made: u32,
    pub tool_calls: usize,
    pub writes_used: u32,
    pub truncation_retried: bool,
    pub iteration: u32,
}
