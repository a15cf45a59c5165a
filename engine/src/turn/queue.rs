//! Messages that wait their turn (T13): what a user message does when its agent is busy.
//!
//! - `enqueue`: the message is stored at once as a `queued` turn with its user message
//!   ([`enqueue`]); a replica's death loses nothing. The agent's queued turns start one
//!   after another, in the order accepted, each through the normal admission (hold,
//!   quotas) with [`Trigger::Queued`], which starts the stored row instead of writing one.
//!   A turn's wrap-up (its hold released, `admit::Budget::release`) kicks [`run`], which
//!   starts the agent's next; the lease's reconcile tick ([`start_waiting`]) starts those
//!   of free agents nobody kicked (a replica died between its release and its kick). Two
//!   replicas starting the same agent's next turn are decided by the hold: one is busy.
//!   A quota that refuses a queued turn at its start ends it `failed` with the quota's
//!   code; the next is tried.
//! - `interrupt` ([`interrupt`]): the running turn is stopped as a stop would (T8), then
//!   the message's turn is admitted as soon as the hold is free. While it waits, a Redis
//!   mark keeps the queue from starting the agent's next queued turn in its place.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use logging::traces::TraceContext;
use protocol::{AgentId, ChatId, MessageId, TeamId, TurnId};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Launched, Trigger, TurnError, TurnInput, launch, stop};
use crate::Engine;
use crate::auth::Authority;
use store::{BusyPolicy, Close, NewQueued, QueuedTurn, StoreError, TurnState, bounded};

/// How often an interrupting message asks for the hold while the stopped turn winds up:
/// well inside T13's 100 ms.
const INTERRUPT_POLL: Duration = Duration::from_millis(10);
/// How long an interrupting message waits for the stopped turn to end before it is
/// answered `agent_busy`; the mark that holds the queue back lasts as long.
const INTERRUPT_PATIENCE: Duration = Duration::from_secs(10);
/// Bound on the Redis calls of the interrupt mark.
const REDIS_BOUND: Duration = Duration::from_millis(500);
/// Queued turns of one agent tried in one go: those a quota refuses end `failed` and the
/// next is tried, up to this many.
const STARTS_PER_KICK: usize = 32;

fn interrupt_key(agent: AgentId) -> String {
    format!("turn-interrupt:agent:{agent}")
}

/// Agents freed on this replica, as [`run`] reads them.
type Kicks = mpsc::UnboundedReceiver<(TeamId, AgentId)>;

/// The kicks of agents that were freed on this replica, for [`run`] to start their next
/// queued turn.
#[derive(Clone)]
pub struct Queue {
    tx: mpsc::UnboundedSender<(TeamId, AgentId)>,
    rx: Arc<Mutex<Option<Kicks>>>,
}

impl Default for Queue {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            tx,
            rx: Arc::new(Mutex::new(Some(rx))),
        }
    }
}

impl Queue {
    /// The agent is free: its next queued turn may start.
    pub fn kick(&self, team: TeamId, agent: AgentId) {
        // Closed only when the replica stops; the reconcile tick of another starts it then.
        let _ = self.tx.send((team, agent));
    }
}

/// Starts the next queued turn of each agent kicked, until `stop`.
pub async fn run(state: Engine, stop: CancellationToken) {
    let taken = state
        .queue
        .rx
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let Some(mut rx) = taken else { return };
    loop {
        let kicked = tokio::select! {
            () = stop.cancelled() => return,
            kicked = rx.recv() => kicked,
        };
        let Some((team, agent)) = kicked else { return };
        start_next(&state, team, agent).await;
    }
}

/// The reconcile tick's part: starts the next queued turn of every agent that has one and
/// is free.
pub async fn start_waiting(state: &Engine) {
    if state.draining.is_cancelled() {
        return;
    }
    match bounded(state.store.agents_with_queue()).await {
        Ok(agents) => {
            for (team, agent) in agents {
                start_next(state, team, agent).await;
            }
        }
        Err(err) => {
            tracing::debug!(
                class = err.metric_label(),
                "could not list agents with queued turns"
            );
        }
    }
}

/// Starts the agent's next queued turn if the agent is free.
async fn start_next(state: &Engine, team: TeamId, agent: AgentId) {
    if state.draining.is_cancelled() {
        return;
    }
    for _ in 0..STARTS_PER_KICK {
        let next = match bounded(state.store.next_queued(team, agent)).await {
            Ok(Some(next)) => next,
            Ok(None) => return,
            Err(err) => {
                tracing::warn!(agent = %agent, class = err.metric_label(), "could not read the agent's queue");
                return;
            }
        };
        // Asked only when something waits: most turns end with an empty queue.
        if interrupting(state, agent).await {
            return;
        }
        let turn = next.turn;
        match start_queued(state, next).await {
            Ok(_) => {
                tracing::info!(turn = %turn, agent = %agent, "queued turn started");
                return;
            }
            // Another turn holds the agent: its end kicks the queue again.
            Err(TurnError::Busy(_)) => return,
            // Withdrawn, or started by another replica, meanwhile.
            Err(TurnError::NotFound("turn")) => {}
            Err(TurnError::ShuttingDown | TurnError::Overloaded(_) | TurnError::Store(_)) => {
                // Still queued: the reconcile tick tries again.
                return;
            }
            Err(err) => {
                tracing::info!(turn = %turn, agent = %agent, code = err.code().as_str(), "queued turn refused at its start");
                let ended = bounded(state.store.end_queued(team, turn, Some(err.code()))).await;
                if let Err(err) = ended {
                    tracing::warn!(turn = %turn, class = err.metric_label(), "could not end a refused queued turn");
                    return;
                }
            }
        }
    }
}

async fn start_queued(state: &Engine, next: QueuedTurn) -> Result<Launched, TurnError> {
    let authority = Authority::of_turn(next.actor.clone(), next.actor_admin);
    let (team, chat) = (next.team, next.chat);
    launch(
        state,
        team,
        chat,
        Trigger::Queued(next),
        authority,
        true,
        None,
    )
    .await
}

/// A queued message's answer (`202`).
#[derive(Clone, Copy, Debug)]
pub struct Queued {
    pub turn: TurnId,
    pub message: MessageId,
    /// 1 = next.
    pub position: u32,
}

/// The agent of `chat` and its busy policy.
pub async fn busy_policy(
    state: &Engine,
    team: TeamId,
    chat: ChatId,
) -> Result<(AgentId, BusyPolicy), TurnError> {
    let basis = bounded(state.store.chat_with_agent(team, chat))
        .await
        .map_err(|e| match e {
            StoreError::NotFound => TurnError::NotFound("chat"),
            other => other.into(),
        })?;
    Ok((basis.agent.id, basis.agent.busy_policy))
}

/// Stores `input` as a queued turn of `agent` in `chat`, then kicks the queue: the agent
/// may have been freed since it was found busy.
pub async fn enqueue(
    state: &Engine,
    team: TeamId,
    agent: AgentId,
    chat: ChatId,
    input: TurnInput,
    authority: &Authority,
) -> Result<Queued, TurnError> {
    let turn = TurnId::new();
    let parts = TurnInput::parts(input.content, input.files);
    let queued = bounded(state.store.enqueue_turn(NewQueued {
        id: turn,
        team,
        agent,
        chat,
        user_parts: &parts,
        client_message_id: input.client_message_id.as_deref(),
        instructions: input.instructions.as_deref(),
        actor: &authority.actor,
        actor_admin: authority.may_change_agent(),
        max: state.config.queue_max_per_agent,
        max_per_actor: state.config.queue_max_per_principal,
    }))
    .await
    .map_err(|e| match e {
        StoreError::Conflict("queue_full") => TurnError::QueueFull,
        StoreError::Conflict("message_id") => {
            TurnError::Conflict("this message id was just used by another request".into())
        }
        StoreError::NotFound => TurnError::NotFound("agent"),
        other => other.into(),
    })?;
    tracing::info!(turn = %turn, agent = %agent, position = queued.position, "message queued");
    // A4, P5: a new message supersedes the MCP servers' questions the chat's running turn
    // waits on (the call goes on without the answer) rather than queue behind them.
    if let Err(e) = bounded(state.store.close_approvals(team, chat, Close::Asked)).await {
        tracing::warn!(chat = %chat, class = e.metric_label(), "could not supersede the chat's pending elicitations");
    }
    state.queue.kick(team, agent);
    Ok(Queued {
        turn,
        message: queued.message_id,
        position: queued.position,
    })
}

/// Stops `running` (as `POST /v1/turns/{id}/stop` would, T8) and starts `input`'s turn as
/// soon as the agent is free. The caller checked that it may stop `running`.
#[allow(clippy::too_many_arguments)]
pub async fn interrupt(
    state: &Engine,
    team: TeamId,
    agent: AgentId,
    chat: ChatId,
    running: TurnState,
    input: TurnInput,
    authority: Authority,
    detached: bool,
    parent: Option<&TraceContext>,
) -> Result<Launched, TurnError> {
    mark(state, agent, true).await;
    let launched = stop_and_start(
        state, team, chat, running, input, authority, detached, parent,
    )
    .await;
    mark(state, agent, false).await;
    // The queue was held back meanwhile; a started turn kicks it at its own end.
    if launched.is_err() {
        state.queue.kick(team, agent);
    }
    launched
}

#[allow(clippy::too_many_arguments)]
async fn stop_and_start(
    state: &Engine,
    team: TeamId,
    chat: ChatId,
    running: TurnState,
    input: TurnInput,
    authority: Authority,
    detached: bool,
    parent: Option<&TraceContext>,
) -> Result<Launched, TurnError> {
    let stopped = running.id;
    stop::stop(state, team, running)
        .await
        .map_err(|e| match e {
            stop::StopError::Store(e) => TurnError::Store(e),
            // Nothing was stopped: the agent is as busy as it was.
            _ => TurnError::Busy(stopped),
        })?;
    let deadline = tokio::time::Instant::now() + INTERRUPT_PATIENCE;
    loop {
        let trigger = Trigger::User(input.clone());
        match launch(
            state,
            team,
            chat,
            trigger,
            authority.clone(),
            detached,
            parent,
        )
        .await
        {
            Err(TurnError::Busy(holder))
                if holder == stopped && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(INTERRUPT_POLL).await;
            }
            other => return other,
        }
    }
}

/// Sets (or clears) the mark that holds the agent's queue back while an interrupting
/// message waits for the hold. Redis unreachable leaves it unset: the queue may then start
/// first, and the message is answered `agent_busy`.
async fn mark(state: &Engine, agent: AgentId, set: bool) {
    let key = interrupt_key(agent);
    let ttl = u64::try_from(INTERRUPT_PATIENCE.as_millis()).unwrap_or(u64::MAX);
    let done = crate::redis::bounded(REDIS_BOUND, async {
        let mut conn = state.redis.connection().await?;
        if set {
            redis::cmd("SET")
                .arg(&key)
                .arg(1)
                .arg("PX")
                .arg(ttl)
                .query_async::<()>(&mut conn)
                .await
        } else {
            redis::cmd("DEL")
                .arg(&key)
                .query_async::<()>(&mut conn)
                .await
        }
    })
    .await;
    if done.is_err() {
        tracing::warn!(agent = %agent, set, "could not mark an interrupt in Redis");
    }
}

/// Whether an interrupting message waits for the agent; Redis unreachable is no.
async fn interrupting(state: &Engine, agent: AgentId) -> bool {
    let key = interrupt_key(agent);
    crate::redis::bounded(REDIS_BOUND, async {
        let mut conn = state.redis.connection().await?;
        redis::cmd("EXISTS")
            .arg(&key)
            .query_async::<bool>(&mut conn)
            .await
    })
    .await
    .unwrap_or(false)
}
