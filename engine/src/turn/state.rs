//! What a turn is made of while it runs: the [`TurnTask`] the phases share (each phase
//! file adds its methods), and [`Progress`], the loop's state between steps. Types only,
//! so the phase files depend on it and not on one another.

use std::sync::Arc;
use std::time::Duration;

use protocol::parts::Part;
use protocol::{AgentId, ChatId, MessageId, ReplicaId, TeamId, TurnId};
use tokio_util::sync::CancellationToken;

use super::admit::Budget;
use super::basis::Bases;
use super::context::Fold;
use super::output::Client;
use super::{speculation, stop};
use crate::auth::Authority;
use crate::config::Limits;
use crate::metrics::TurnMetrics;
use crate::models::connections::Connections;
use crate::tools::Toolset;
use domain::approvals::ApprovalPolicy;
use providers::ModelRequest;
use store::{ApprovalRow, ModelCallUsage, Store};

/// Which turn this is.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ids {
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    pub turn: TurnId,
    /// The replica running it: every write of the turn is fenced by it (D3).
    pub replica: ReplicaId,
}

/// What the turn calls.
pub(super) struct Deps {
    pub store: Store,
    /// Told when the turn changes its chat's messages (`basis.rs`).
    pub bases: Bases,
    /// Resolves each route to its adapter (T14).
    pub connections: Connections,
    /// What each route's model reads, for a request with files (T16, T23).
    pub model_catalog: Arc<crate::models::catalog::Catalog>,
    /// The team's catalog, read once by the turn's first model call with files.
    pub team_catalog: tokio::sync::OnceCell<crate::models::catalog::TeamCatalog>,
    pub toolset: Arc<Toolset>,
}

/// The rules the turn runs under, fixed when it was composed.
pub(super) struct Rules {
    /// The route's models, tried in order (T10).
    pub route: Vec<String>,
    pub limits: Limits,
    /// The agent's approval policy (A2), applied to every call.
    pub policy: ApprovalPolicy,
    /// How long a call that asks waits for its answer (A4).
    pub approval_ttl: Duration,
    /// The agent streams the model's reasoning to the client (T18); never stored.
    pub stream_reasoning: bool,
}

/// An admitted turn: its id, its budget, and its stop handle.
pub(super) struct Running {
    pub turn: TurnId,
    pub budget: Budget,
    pub cancel: CancellationToken,
    /// Keeps the turn stoppable from any replica until the task ends (T8).
    pub registration: stop::Registration,
    /// A turn no stream follows: cancelled once its principal's authority ended
    /// (`standing.rs`), which then also cancelled the turn.
    pub lost: Option<CancellationToken>,
}

/// Everything the spawned part of a turn needs; owned, so the task outlives the request.
pub(super) struct TurnTask {
    pub ids: Ids,
    pub deps: Deps,
    pub rules: Rules,
    pub cancel: CancellationToken,
    /// The stream to the client and the chat's events stream.
    pub client: Client,
    pub budget: Budget,
    /// Run in the background after an answer is stored, when history outgrew the budget.
    pub fold: Option<Fold>,
    /// A continuation (A3): the approvals of the turn it continues, all answered; the
    /// approved calls run before the first model call.
    pub resume: Vec<ApprovalRow>,
    /// Starts the worker of a worker tool call the model is still streaming (W11); `None`
    /// when that is off.
    pub speculation: Option<speculation::Speculation>,
    /// Counts the turn live until the task ends, then by outcome (O2).
    pub metrics: TurnMetrics,
    /// Whose authority the turn's tool calls act with (X1).
    pub authority: Authority,
    /// Cancelled when that authority ended under a turn no stream follows: the turn
    /// ends `interrupted` with `unauthorized`.
    pub lost: Option<CancellationToken>,
    /// The drain's handover (D4): the turn stops at its next step boundary.
    pub handover: CancellationToken,
    /// The loop's state when it starts: the first request.
    pub first: Option<Progress>,
    /// A delegated task's place in its tree (B7, X5): its approvals fail closed and its
    /// model calls count against the tree's.
    pub lineage: Option<super::delegation::Lineage>,
    /// Taken over from a dead replica (D3): the stream says so first.
    pub resumed: bool,
    pub _running: stop::Registration,
}

/// The loop's state between steps: what the next step needs.
pub(super) struct Progress {
    /// One request for the whole turn: each model call sends its messages so far.
    pub request: ModelRequest,
    /// The assistant message's parts so far.
    pub parts: Vec<Part>,
    pub usage_log: Vec<ModelCallUsage>,
    pub assistant_id: MessageId,
    /// Model calls made, every route tried counted.
    pub calls_made: u32,
    pub tool_calls: usize,
    /// Data-changing calls made (T6).
    pub writes_used: u32,
    pub truncation_retried: bool,
    /// Steps begun.
    pub iteration: u32,
}
