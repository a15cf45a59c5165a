//! Stopping a running turn from any client on any replica (SPEC T8).
//!
//! A stop is a hang-up: it cancels the turn's own `CancellationToken`, so the provider
//! request is aborted, a running worker command is killed, the text already streamed is
//! kept as `interrupted` and every cut-off tool call gets its synthetic result, all by the
//! code a client that goes away already runs. The client that started the turn, if still
//! attached, reads `finish` (`interrupted`) and `[DONE]`.
//!
//! - Each replica keeps [`Running`]: the turns it runs, by id, with their tokens;
//!   `turn::start` registers a turn before it writes its row and the entry goes when the
//!   turn task ends (its [`Registration`] is dropped), after the end state is written.
//! - The replica that receives a stop reads the turn's row, which names the replica
//!   running it (`turns.replica_id`). Its own turn it cancels at once. Another replica's
//!   it hands over Redis: it sets `turn-stop:turn:{turn}` (for [`STOP_TTL`]) and publishes
//!   the turn id on `turn-stop:replica:{replica}`, the key first (two round trips: the key
//!   and the channel have different hash slots on a Redis Cluster, O5, so they cannot share
//!   a transaction; a publish that fails after the key was set still fails the stop, and
//!   the key alone stops the turn at the owner's next re-subscription). Each replica listens on its own
//!   channel ([`Stops::listen`]) and cancels the turn on the message, within
//!   milliseconds. Whenever the subscription is (re)made, the listener then reads the keys
//!   of every turn it runs: a stop published while it was not subscribed (a Redis blip,
//!   a subscription that died silently, found by a ping every second) is found there.
//! - Redis unreachable (or slower than [`REDIS_BOUND`]) while the turn runs elsewhere is
//!   [`StopError::Undeliverable`]: the stop is refused, never reported as done.
//!
//! The stop is answered as soon as it is delivered (the cancel issued, or the message
//! handed to Redis), without waiting for the turn's end state: the stream (`finish`) and
//! the turn's row say when it ended.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use protocol::{ReplicaId, TeamId, TurnId};
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::Engine;
use crate::auth::{AuthError, Principal};
use store::{Store, StoreError, TurnState, TurnStatus};

/// Bound on each Redis call of a stop, connecting included.
const REDIS_BOUND: Duration = Duration::from_millis(500);
/// How long a stop waits in Redis for an owner that is not subscribed (re-subscribing
/// after a blip): far longer than a re-subscription takes.
const STOP_TTL: Duration = Duration::from_secs(300);
/// Pause before the listener subscribes again after losing its subscription.
const RESUBSCRIBE_AFTER: Duration = Duration::from_millis(250);
/// How often the listener checks that its subscription is alive.
const PING_EVERY: Duration = Duration::from_secs(1);

fn stop_key(turn: TurnId) -> String {
    format!("turn-stop:turn:{turn}")
}

fn stop_channel(replica: ReplicaId) -> String {
    format!("turn-stop:replica:{replica}")
}

/// The turns this replica runs, with their cancellation tokens.
#[derive(Clone, Default)]
struct Running {
    turns: Arc<Mutex<HashMap<TurnId, CancellationToken>>>,
}

impl Running {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TurnId, CancellationToken>> {
        // The map is consistent after any panic (single inserts and removes).
        self.turns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn cancel(&self, turn: TurnId) -> bool {
        match self.lock().get(&turn) {
            Some(token) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    fn ids(&self) -> Vec<TurnId> {
        self.lock().keys().copied().collect()
    }
}

/// A turn's place in [`Running`]; dropping it (when the turn task ends) removes the turn.
pub struct Registration {
    running: Running,
    turn: TurnId,
    /// Cancelled with the registration: what watches the turn from outside stops then.
    ended: Option<tokio_util::sync::DropGuard>,
}

impl Registration {
    /// A token cancelled when the turn task ends.
    pub fn ended(&mut self) -> CancellationToken {
        let ended = CancellationToken::new();
        self.ended = Some(ended.clone().drop_guard());
        ended
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.running.lock().remove(&self.turn);
    }
}

/// Why a stop was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    /// The turn runs on another replica and Redis, which carries the stop there, did not
    /// take it.
    #[error("the stop could not be handed to the replica running the turn")]
    Undeliverable,
    /// The turn or chat (the word says which) does not exist for the team.
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("store unavailable")]
    Store(#[from] StoreError),
    /// The principal could not be checked against the turn's chat.
    #[error(transparent)]
    Auth(#[from] AuthError),
}

/// Stops of this replica's turns and of other replicas'.
#[derive(Clone)]
pub struct Stops {
    replica: ReplicaId,
    redis: crate::redis::Client,
    running: Running,
}

/// How a stop was delivered.
enum Delivered {
    /// This replica runs the turn: its token is cancelled.
    Here,
    /// Handed to the turn's replica through Redis.
    Sent,
    /// The row names this replica, but its task is gone: the turn has just ended.
    Ended,
}

impl Stops {
    pub fn new(replica: ReplicaId, redis: crate::redis::Client) -> Self {
        Self {
            replica,
            redis,
            running: Running::default(),
        }
    }

    /// Makes `turn` stoppable through `cancel` until the registration is dropped.
    pub fn register(&self, turn: TurnId, cancel: CancellationToken) -> Registration {
        self.running.lock().insert(turn, cancel);
        Registration {
            running: self.running.clone(),
            turn,
            ended: None,
        }
    }

    async fn deliver(
        &self,
        turn: TurnId,
        owner: Option<ReplicaId>,
    ) -> Result<Delivered, StopError> {
        if self.running.cancel(turn) {
            return Ok(Delivered::Here);
        }
        // Turns written before leases name no replica: nothing can reach them.
        let owner = owner.ok_or(StopError::Undeliverable)?;
        if owner == self.replica {
            return Ok(Delivered::Ended);
        }
        let mut conn = bounded(self.redis.connection())
            .await
            .ok_or(StopError::Undeliverable)?;
        let ttl = u64::try_from(STOP_TTL.as_millis()).unwrap_or(u64::MAX);
        // The key first: an owner that subscribes after the publish still finds it.
        let sent: Option<i64> =
            match bounded(conn.pset_ex::<_, _, ()>(stop_key(turn), 1, ttl)).await {
                Some(()) => bounded(conn.publish(stop_channel(owner), turn.to_string())).await,
                None => None,
            };
        match sent {
            Some(listeners) => {
                // No listener: the owner is re-subscribing (it finds the key) or dead (its
                // lease lapses and a survivor ends the turn `interrupted`).
                tracing::info!(turn = %turn, owner = %owner, listeners, "stop handed to the turn's replica");
                Ok(Delivered::Sent)
            }
            None => {
                tracing::warn!(turn = %turn, owner = %owner, "stop not delivered: Redis unreachable");
                Err(StopError::Undeliverable)
            }
        }
    }

    /// Cancels this replica's turns that other replicas were asked to stop, until
    /// `shutdown`.
    pub async fn listen(self, shutdown: CancellationToken) {
        loop {
            let was_live = self.listen_once(&shutdown).await;
            if shutdown.is_cancelled() {
                return;
            }
            // Once per loss, not once per failed attempt while Redis stays down.
            if was_live {
                tracing::warn!("turn stop subscription lost; subscribing again");
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(RESUBSCRIBE_AFTER) => {}
            }
        }
    }

    /// Serves one subscription until it is lost (`true`) or cannot be made (`false`).
    async fn listen_once(&self, shutdown: &CancellationToken) -> bool {
        let Some(mut pubsub) = bounded(self.redis.pubsub()).await else {
            return false;
        };
        if bounded(pubsub.subscribe(stop_channel(self.replica)))
            .await
            .is_none()
        {
            return false;
        }
        // Subscribed: what was published before is in the keys.
        if !self.sweep().await {
            return false;
        }
        let (mut sink, mut messages) = pubsub.split();
        let mut ping = tokio::time::interval(PING_EVERY);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return true,
                message = messages.next() => {
                    let Some(message) = message else { return true };
                    let turn = message.get_payload::<String>().ok().and_then(|id| id.parse().ok());
                    if let Some(turn) = turn
                        && self.running.cancel(turn)
                    {
                        tracing::info!(turn = %turn, "turn stopped from another replica");
                    }
                }
                _ = ping.tick() => {
                    if bounded(sink.ping::<redis::Value>()).await.is_none() {
                        return true;
                    }
                }
            }
        }
    }

    /// Cancels the turns of this replica whose stop key is set; `false` if Redis did not
    /// answer (then the subscription is made again, and the sweep with it).
    async fn sweep(&self) -> bool {
        let turns = self.running.ids();
        if turns.is_empty() {
            return true;
        }
        let Some(mut conn) = bounded(self.redis.connection()).await else {
            return false;
        };
        let keys: Vec<String> = turns.iter().map(|t| stop_key(*t)).collect();
        let Some(found) = bounded(conn.mget::<_, Vec<Option<i64>>>(keys)).await else {
            return false;
        };
        for (turn, found) in turns.into_iter().zip(found) {
            if found.is_some() && self.running.cancel(turn) {
                tracing::info!(turn = %turn, "turn stopped from another replica (found on subscribing)");
            }
        }
        true
    }
}

/// What a stop answers: the turn (none when a chat had no running turn) and where it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[schema(example = json!({"turn_id": "0190f5c2-7d1e-7a3b-9c4d-5e6f70819203", "status": "stopping"}))]
pub struct StopAnswer {
    pub turn_id: Option<TurnId>,
    pub status: StopStatus,
}

/// `stopping`: the turn was running and its cancel is delivered (`202`). A terminal
/// status: the turn had already ended, nothing was done (`200`). `idle`: the chat had no
/// running turn (`200`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StopStatus {
    Stopping,
    Completed,
    Interrupted,
    Failed,
    /// A queued turn withdrawn by this stop (T13), or earlier: it never ran.
    Withdrawn,
    Idle,
}

impl StopAnswer {
    fn ended(turn: &TurnState) -> Self {
        let status = match turn.status {
            // A queued turn is withdrawn, never "stopping" (see `stop`).
            TurnStatus::Running | TurnStatus::Queued => StopStatus::Stopping,
            TurnStatus::Withdrawn => StopStatus::Withdrawn,
            TurnStatus::Completed => StopStatus::Completed,
            TurnStatus::Interrupted => StopStatus::Interrupted,
            TurnStatus::Failed => StopStatus::Failed,
        };
        Self {
            turn_id: Some(turn.id),
            status,
        }
    }

    /// A chat with no running turn.
    pub fn idle() -> Self {
        Self {
            turn_id: None,
            status: StopStatus::Idle,
        }
    }

    /// Whether a cancel went out (`202`) rather than finding nothing to stop (`200`).
    pub fn stopping(&self) -> bool {
        self.status == StopStatus::Stopping
    }
}

/// A turn of `team`; `NotFound` for an unknown one or another team's.
pub async fn find(store: &Store, team: TeamId, turn: TurnId) -> Result<TurnState, StopError> {
    match store::bounded(store.turn_state(team, turn)).await {
        Err(StoreError::NotFound) => Err(StopError::NotFound("turn")),
        other => Ok(other?),
    }
}

/// The running turn of a chat of `team`, if any; `NotFound` for an unknown chat.
pub async fn running_in_chat(
    store: &Store,
    team: TeamId,
    chat: protocol::ChatId,
) -> Result<Option<TurnState>, StopError> {
    match store::bounded(store.running_turn_of_chat(team, chat)).await {
        Err(StoreError::NotFound) => Err(StopError::NotFound("chat")),
        other => Ok(other?),
    }
}

/// T8: the one way a front end stops a turn for `principal`, whatever its wire (`POST
/// /v1/turns/{id}/stop`, A2A's `CancelTask`, MCP's `notifications/cancelled`): a turn of a
/// chat the principal may not see is as unknown as another team's (`NotFound("turn")`).
pub async fn stop_turn(
    state: &Engine,
    principal: &Principal,
    turn: TurnId,
) -> Result<StopAnswer, StopError> {
    let found = find(&state.store, principal.team, turn).await?;
    match principal.check_chat(&state.store, found.chat).await {
        Ok(()) => {}
        Err(AuthError::NotFound(_)) => return Err(StopError::NotFound("turn")),
        Err(e) => return Err(e.into()),
    }
    stop(state, principal.team, found).await
}

/// T8: stops the running turn of `chat`, one the principal may see; [`StopAnswer::idle`]
/// when none runs.
pub async fn stop_chat(
    state: &Engine,
    principal: &Principal,
    chat: protocol::ChatId,
) -> Result<StopAnswer, StopError> {
    principal.check_chat(&state.store, chat).await?;
    match running_in_chat(&state.store, principal.team, chat).await? {
        Some(running) => stop(state, principal.team, running).await,
        None => Ok(StopAnswer::idle()),
    }
}

/// Stops `turn` (of `team`, as the store found it) wherever it runs; stopping a turn that
/// already ended is a no-op that answers its status.
pub async fn stop(state: &Engine, team: TeamId, turn: TurnState) -> Result<StopAnswer, StopError> {
    if turn.status == TurnStatus::Queued {
        // T13: withdrawn, unless it started meanwhile (then it is stopped as it runs).
        if store::bounded(state.store.end_queued(team, turn.id, None)).await? {
            tracing::info!(turn = %turn.id, "queued turn withdrawn");
            return Ok(StopAnswer {
                turn_id: Some(turn.id),
                status: StopStatus::Withdrawn,
            });
        }
        let now = find(&state.store, team, turn.id).await?;
        return Box::pin(stop(state, team, now)).await;
    }
    if turn.status != TurnStatus::Running {
        return Ok(StopAnswer::ended(&turn));
    }
    match state.stops.deliver(turn.id, turn.replica).await? {
        Delivered::Here | Delivered::Sent => Ok(StopAnswer::ended(&turn)),
        // Ended between the read and the cancel: its row says how (or, still `running`,
        // that its end state is being written).
        Delivered::Ended => Ok(StopAnswer::ended(&find(&state.store, team, turn.id).await?)),
    }
}

async fn bounded<T>(call: impl Future<Output = redis::RedisResult<T>>) -> Option<T> {
    crate::redis::bounded(REDIS_BOUND, call).await.ok()
}
