//! Following a chat for a principal (S2, D5): the one way every front end opens the chat's
//! events stream or a running turn's own stream, whatever its wire (`GET
//! /v1/chats/{id}/events` and `/stream`, a retried message that attaches to its turn, A2A's
//! `SubscribeToTask`). The principal decides what it may see and is the viewer the stream
//! is capped for and ends with. Front ends map [`FollowError`] to their wire and frame the
//! bytes as their response.

use std::convert::Infallible;

use bytes::Bytes;
use protocol::{ChatId, TeamId, TurnId};

use super::{EventId, EventsError, Observer, Resumed, TurnStream, Viewer};
use crate::Engine;
use crate::auth::{AuthError, Principal};
use crate::sse;
use store::{Store, StoreError, TurnState, TurnStatus, bounded};

/// Why a chat or a turn cannot be followed.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// The chat (the word says which) does not exist for the team.
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The chat is one the principal may not see, or could not be checked.
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("store unavailable")]
    Store(#[from] StoreError),
    /// The events stream could not be read, or the viewer has as many streams as allowed.
    #[error(transparent)]
    Events(#[from] EventsError),
}

/// How a followed turn's stream that cannot go on ends.
#[derive(Clone, Copy, Debug)]
pub enum EarlyEnd {
    /// With an `error` part and `[DONE]`: the AI SDK's stream.
    ErrorPart,
    /// Without: for a translation that would take the part for the turn's failure.
    Quiet,
}

/// What following a turn by its id found.
pub enum Following {
    /// Its stream from its `start`, then live (boxed: the stream is the large variant).
    Live(Box<Followed>),
    /// The turn is not running (ended, or still queued).
    NotRunning,
    /// Its beginning is no longer in the events window.
    OutOfWindow,
}

/// The chat's events stream for `principal`, after `after` when given.
pub async fn observe(
    state: &Engine,
    principal: &Principal,
    chat: ChatId,
    after: Option<EventId>,
) -> Result<Observer, FollowError> {
    visible(state, principal, chat).await?;
    let draining = state.draining.clone();
    let observed = state
        .events
        .observe(chat, after, draining, viewer(state, principal))
        .await;
    Ok(observed.map_err(|e| unavailable(chat, e))?)
}

/// The chat's running turn as its own stream from its `start`; `None` when no turn runs or
/// its beginning is no longer in the events window.
pub async fn resume(
    state: &Engine,
    principal: &Principal,
    chat: ChatId,
) -> Result<Option<Followed>, FollowError> {
    visible(state, principal, chat).await?;
    let running = match bounded(state.store.running_turn_of_chat(principal.team, chat)).await {
        Ok(running) => running,
        Err(StoreError::NotFound) => return Err(FollowError::NotFound("chat")),
        Err(e) => return Err(e.into()),
    };
    match running {
        Some(turn) => Ok(follow(state, principal, &turn, EarlyEnd::ErrorPart).await?),
        None => Ok(None),
    }
}

/// The turn `turn` of the principal's team, followed if it runs. The caller has found the
/// turn's chat one the principal may reach: a task it may see (A2A), a chat it posted to
/// (a retried message id).
pub async fn follow_turn(
    state: &Engine,
    principal: &Principal,
    turn: TurnId,
    early_end: EarlyEnd,
) -> Result<Following, FollowError> {
    let turn = bounded(state.store.turn_state(principal.team, turn)).await?;
    if turn.status != TurnStatus::Running {
        return Ok(Following::NotRunning);
    }
    Ok(match follow(state, principal, &turn, early_end).await? {
        Some(followed) => Following::Live(Box::new(followed)),
        None => Following::OutOfWindow,
    })
}

/// The stream of `turn`, a running turn of a chat the principal may see, from its `start`
/// (rebuilt after a takeover, D5) and then live; `None` when its beginning is no longer in
/// the events window.
async fn follow(
    state: &Engine,
    principal: &Principal,
    turn: &TurnState,
    early_end: EarlyEnd,
) -> Result<Option<Followed>, EventsError> {
    let started = u64::try_from(turn.started_at.timestamp_millis()).unwrap_or_default();
    let stream = state
        .events
        .follow_turn(
            turn.chat,
            turn.id,
            started,
            state.draining.clone(),
            viewer(state, principal),
        )
        .await
        .map_err(|e| unavailable(turn.chat, e))?;
    Ok(stream.map(|stream| Followed {
        stream: match early_end {
            EarlyEnd::ErrorPart => stream,
            EarlyEnd::Quiet => stream.quiet(),
        },
        store: state.store.clone(),
        team: principal.team,
        turn: turn.id,
    }))
}

fn viewer(state: &Engine, principal: &Principal) -> Viewer {
    Viewer {
        identity: principal.identity(),
        authority: state.auth.standing(principal),
    }
}

/// A chat the principal may observe: a user's own (the check finds it), any chat of the
/// caller's team otherwise.
async fn visible(state: &Engine, principal: &Principal, chat: ChatId) -> Result<(), FollowError> {
    principal.check_chat(&state.store, chat).await?;
    if principal.only_chats_of().is_none() {
        match bounded(state.store.chat_created_by(principal.team, chat)).await {
            Ok(_) => {}
            Err(StoreError::NotFound) => return Err(FollowError::NotFound("chat")),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn unavailable(chat: ChatId, err: EventsError) -> EventsError {
    if let EventsError::Unavailable(class) = &err {
        tracing::warn!(%chat, class, "events stream unavailable");
    }
    err
}

/// A resumed turn stream that also asks the store, whenever the stream is idle, whether the
/// turn still runs: one whose last chunk never reached the events stream (its replica died,
/// the publisher dropped it) ends here instead of being followed forever.
pub struct Followed {
    stream: TurnStream,
    store: Store,
    team: TeamId,
    turn: TurnId,
}

impl Followed {
    /// The stream's SSE bytes, keep-alives included, until the turn's end.
    pub fn into_stream(self) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send {
        futures_util::stream::unfold(self, |mut followed| async move {
            let bytes = match followed.stream.next().await? {
                Resumed::Bytes(bytes) => bytes,
                Resumed::Idle => {
                    let state = bounded(followed.store.turn_state(followed.team, followed.turn));
                    let gone = match state.await {
                        Ok(turn) => turn.status != TurnStatus::Running,
                        Err(StoreError::NotFound) => true,
                        // Unknown (the store did not answer): still followed.
                        Err(_) => false,
                    };
                    if !gone {
                        sse::keep_alive()
                    } else {
                        match followed.stream.end_unseen()? {
                            Resumed::Bytes(bytes) => bytes,
                            Resumed::Idle => return None,
                        }
                    }
                }
            };
            Some((Ok(bytes), followed))
        })
    }
}
