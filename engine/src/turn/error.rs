//! What the turn engine answers when a turn does not start: the engine's own vocabulary,
//! which the service (`brain::error`) maps to HTTP at the edge (the engine never speaks
//! HTTP).
//!
//! Failures after the first model output are not errors of this kind: they end the turn
//! (`wrap_up.rs`) and reach the client as an `error` chunk.

use protocol::{ErrorCode, TurnId};

use crate::intake::Overloaded;
use crate::quota::Refusal;
use providers::ProviderError;
use store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// The chat, agent or approval (the word says which) does not exist for the team.
    #[error("{0} not found")]
    NotFound(&'static str),
    /// T9: the agent runs another turn (its id).
    #[error("the agent is running another turn")]
    Busy(TurnId),
    /// T13: the agent is busy and its queue holds as many turns as allowed.
    #[error("the agent is busy and its queue of waiting messages is full")]
    QueueFull,
    /// A retried message id whose turn still runs (its id).
    #[error("this message id's turn is still running")]
    InProgress(TurnId),
    /// A team quota refuses the turn before anything is spent (T2, E2).
    #[error("{}", .0.message())]
    Quota(Refusal),
    /// The queue of turn intakes is past its bound; nothing was written.
    #[error(transparent)]
    Overloaded(#[from] Overloaded),
    /// This replica is draining: it finishes its turns and starts none.
    #[error("this server is shutting down; retry the request")]
    ShuttingDown,
    /// Every model of the route failed before any output (T10).
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// A store the turn needs failed; nothing was sent to a model.
    #[error("store unavailable")]
    Store(#[source] StoreError),
    /// An approval answered already (the message says how it ended).
    #[error("{0}")]
    Conflict(String),
    /// The key the turn acts for was revoked: a taken-over turn is not continued (X1).
    #[error("the key this turn acts for was revoked")]
    Revoked,
    #[error("internal error")]
    Internal(String),
}

impl From<StoreError> for TurnError {
    fn from(err: StoreError) -> Self {
        Self::Store(err)
    }
}

impl TurnError {
    /// The stable code a caller records (an autostart tick's outcome, a log line).
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::Busy(_) => ErrorCode::AgentBusy,
            Self::QueueFull => ErrorCode::QueueFull,
            Self::InProgress(_) => ErrorCode::TurnInProgress,
            Self::Quota(refusal) => refusal.code(),
            Self::Overloaded(_) => ErrorCode::Overloaded,
            Self::ShuttingDown => ErrorCode::ShuttingDown,
            Self::Provider(e) => e.code(),
            Self::Store(_) => ErrorCode::StoreUnavailable,
            Self::Conflict(_) => ErrorCode::Conflict,
            Self::Revoked => ErrorCode::Unauthorized,
            Self::Internal(_) => ErrorCode::Internal,
        }
    }
}
