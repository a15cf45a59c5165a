//! Posting a message: the one way every front end (the HTTP API, A2A, AG-UI, the MCP
//! server) starts a turn for a principal (answering approvals is `answer.rs`). A user
//! message that finds the agent busy does what the message's `if_busy` (else the agent's
//! `busy_policy`) says (T13); a detached post (D1) answers the turn's row instead of its
//! stream. Front ends map [`PostError`] to
//! their own wire.

use logging::traces::TraceContext;
use protocol::{ChatId, MessageId, TurnId};
use store::{Started, StoreError, TurnRow, bounded};

use super::stop::{self, StopError};
use super::{Launched, Queued, Trigger, TurnError, busy_policy, enqueue, interrupt, launch};
use crate::Engine;
use crate::agents::BusyPolicy;
use crate::auth::Principal;

/// What a posted message became.
pub enum Posted {
    Launched(Launched),
    /// T13: queued behind the agent's running turn.
    Queued(Queued),
}

/// What a detached post became.
pub enum Detached {
    /// The turn (started now, or by an earlier post of the same message id) and the user
    /// message that started it.
    Started(TurnRow, Option<MessageId>),
    /// T13: queued behind the agent's running turn.
    Queued(Queued),
}

/// Why a post started nothing.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error(transparent)]
    Turn(#[from] TurnError),
    /// The agent runs another turn, named only when the principal may read it (X1).
    #[error("the agent is busy")]
    Busy(Option<TurnId>),
    #[error(transparent)]
    Stop(#[from] StopError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A turn the store said started cannot be found: a bug, never the client's doing.
    #[error("{0}")]
    Lost(&'static str),
}

impl PostError {
    /// D5: the running turn of this message id, which a retry may follow.
    pub fn in_progress(&self) -> Option<TurnId> {
        match self {
            Self::Turn(TurnError::InProgress(turn)) => Some(*turn),
            _ => None,
        }
    }
}

/// Launches `trigger`; a user message that finds the agent busy does what `if_busy` (else
/// the agent's `busy_policy`) says (T13). Interrupting a turn follows the stop rule (T8):
/// the principal must see the running turn's chat, else the agent is busy to it.
pub async fn post(
    state: &Engine,
    principal: &Principal,
    chat: ChatId,
    trigger: Trigger,
    if_busy: Option<BusyPolicy>,
    detached: bool,
    parent: Option<&TraceContext>,
) -> Result<Posted, PostError> {
    let team = principal.team;
    let input = match &trigger {
        Trigger::User(input) => Some(input.clone()),
        _ => None,
    };
    let launched = launch(
        state,
        team,
        chat,
        trigger,
        principal.authority(),
        detached,
        parent,
    )
    .await;
    let running = match launched {
        Err(TurnError::Busy(running)) => running,
        other => return Ok(Posted::Launched(other?)),
    };
    let Some(input) = input else {
        return Err(busy(state, principal, running).await);
    };
    let (agent, policy) = busy_policy(state, team, chat).await?;
    // The busy paths are boxed: their transactions would otherwise weigh in the future of
    // every request that posts a message, which the router moves.
    match if_busy.unwrap_or(policy) {
        BusyPolicy::Reject => Err(busy(state, principal, running).await),
        BusyPolicy::Enqueue => {
            let authority = principal.authority();
            let queued = Box::pin(enqueue(state, team, agent, chat, input, &authority)).await?;
            Ok(Posted::Queued(queued))
        }
        BusyPolicy::Interrupt => {
            let found = stop::find(&state.store, team, running).await?;
            if principal
                .check_chat(&state.store, found.chat)
                .await
                .is_err()
            {
                return Err(PostError::Busy(None));
            }
            let launched = Box::pin(interrupt(
                state,
                team,
                agent,
                chat,
                found,
                input,
                principal.authority(),
                detached,
                parent,
            ))
            .await?;
            Ok(Posted::Launched(launched))
        }
    }
}

/// `agent_busy`, naming the running turn only to a principal who may read it: its chat is
/// one the principal sees (X1). Another user's chat, or the agent's autostart chat for a
/// non-admin, stays as unknown as a turn id of another team.
pub async fn busy(state: &Engine, principal: &Principal, running: TurnId) -> PostError {
    let readable = match stop::find(&state.store, principal.team, running).await {
        Ok(found) => principal.check_chat(&state.store, found.chat).await.is_ok(),
        Err(_) => false,
    };
    PostError::Busy(readable.then_some(running))
}

/// D1: starts `trigger` (a user message) as a detached turn, or finds the turn an earlier
/// post of its message id started (T12), running or ended: a retry starts nothing.
pub async fn post_detached(
    state: &Engine,
    principal: &Principal,
    chat: ChatId,
    trigger: Trigger,
    if_busy: Option<BusyPolicy>,
    parent: Option<&TraceContext>,
) -> Result<Detached, PostError> {
    let client_id = match &trigger {
        Trigger::User(input) => input.client_message_id.clone(),
        _ => None,
    };
    let store = &state.store;
    if let Some(id) = client_id.as_deref()
        && let Some((turn, message)) =
            bounded(store.started_turn(principal.team, chat, Started::ClientMessage(id))).await?
    {
        return Ok(Detached::Started(turn, message));
    }
    let launched = match post(state, principal, chat, trigger, if_busy, true, parent).await {
        Ok(Posted::Queued(queued)) => return Ok(Detached::Queued(queued)),
        Ok(Posted::Launched(launched)) => Ok(launched),
        Err(PostError::Turn(TurnError::InProgress(turn))) => Err(TurnError::InProgress(turn)),
        Err(err) => return Err(err),
    };
    let which = match (launched, client_id.as_deref()) {
        (
            Ok(Launched {
                turn: Some(turn), ..
            }),
            _,
        ) => Started::Turn(turn),
        // A post of the same message id got there first (the intake replays, or finds
        // running, its turn): that turn is the answer.
        (Ok(_) | Err(TurnError::InProgress(_)), Some(id)) => Started::ClientMessage(id),
        (Ok(_), None) => return Err(PostError::Lost("a detached turn did not start")),
        (Err(err), _) => return Err(err.into()),
    };
    let (turn, message) = bounded(store.started_turn(principal.team, chat, which))
        .await?
        .ok_or(PostError::Lost("a started detached turn vanished"))?;
    Ok(Detached::Started(turn, message))
}
