//! Erasure (L2): a chat, an agent or a whole team deleted everywhere it lives. Postgres
//! holds the rows (`store::erasure`); what lives elsewhere goes here, after the rows:
//! - the running and queued turns are stopped first (wherever they run) and given a
//!   moment to end, so they do not write after their chat went;
//! - the chats' events streams in Redis are deleted;
//! - artifact and snapshot bytes are deleted from the object store (what fails stays
//!   queued in `blob_garbage` for the sweep, `artifacts::garbage`);
//! - the workers: their session rows went with the chat, so the runtime-manager's reaper
//!   stops each on its next pass (a claimed pooled worker's slot is marked `gone`), and
//!   the local launcher removes a stopped worker's workspace directory.
//!
//! A team is erased in the background ([`run`]): `DELETE /v1/teams/{id}` marks it (and
//! disables it), and whichever replica holds the erasure's lease deletes it agent by
//! agent. A replica that dies part way lets the lease lapse, and another finishes.
//! Usage and billing records stay (ids and counts, no content): the team's row stays as
//! their tombstone.

use std::time::Duration;

use protocol::{AgentId, ChatId, TeamId, TurnId};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::Engine;
use crate::turn::stop::{self, StopError};
use store::{Actor, Bulky, Erased, StoreError, TurnStatus, Within, bounded};

/// How long an erasure waits for the turns it stopped to end before deleting anyway (a
/// turn on a replica that died ends only when taken over).
const TURNS_END_WITHIN: Duration = Duration::from_secs(5);
/// How often a waiting erasure looks at its turns again.
const TURNS_POLL: Duration = Duration::from_millis(50);
/// Chats or agents read per page while an agent or a team is erased.
const BATCH: i64 = 100;
/// How long a replica holds a team's erasure without renewing it.
const TEAM_LEASE: Duration = Duration::from_secs(30);
/// How often every replica looks for a team to erase (a `DELETE` on this replica wakes
/// it at once).
const TEAM_POLL: Duration = Duration::from_secs(5);
/// Redis keys deleted per `SCAN` page when a team goes.
const SCAN_PAGE: usize = 500;
/// The bound on deleting a team's Redis keys, all pages.
const KEYS_BOUND: Duration = Duration::from_secs(20);

/// Why an erasure did not finish; what it deleted before stays deleted, and repeating it
/// finishes.
#[derive(Debug, thiserror::Error)]
pub enum EraseError {
    /// No such chat or agent in the team (the word says which).
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error(transparent)]
    Stop(#[from] StopError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl EraseError {
    /// A bounded label for logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::Stop(StopError::Undeliverable) => "stop_undeliverable",
            Self::Stop(StopError::NotFound(_)) => "not_found",
            Self::Stop(StopError::Auth(_)) => "auth",
            Self::Stop(StopError::Store(e)) | Self::Store(e) => e.metric_label(),
        }
    }
}

/// Erases `chat` of `team`: its turns stopped, its rows, its events stream and its bytes.
pub async fn erase_chat(state: &Engine, team: TeamId, chat: ChatId) -> Result<(), EraseError> {
    stop_and_wait(state, team, Within::Chat(chat)).await?;
    let erased = erase_chat_rows(state, team, chat)
        .await?
        .ok_or(EraseError::NotFound("chat"))?;
    remove_outside(state, erased).await;
    state.metrics.erased("chat");
    tracing::info!(%team, %chat, "chat erased");
    Ok(())
}

/// Erases `agent` of `team`: each of its chats as [`erase_chat`] does, then the agent with
/// its memories, secrets, schedule and the connectors bound to it; `by` is recorded in
/// the audit log (L5).
pub async fn erase_agent(
    state: &Engine,
    team: TeamId,
    agent: AgentId,
    by: &Actor,
) -> Result<(), EraseError> {
    erase_chats_of(state, team, agent).await?;
    let erased = bounded(state.store.erase_agent(team, agent, by))
        .await?
        .ok_or(EraseError::NotFound("agent"))?;
    remove_outside(state, erased).await;
    state.metrics.erased("agent");
    tracing::info!(%team, %agent, "agent erased");
    Ok(())
}

/// Erases end user `user` of `team` (L2): each chat they opened as [`erase_chat`] does
/// (its turns, uploads, artifacts and snapshots with it), then their memories and their
/// own connector grants; `by` is recorded in the audit log (L5).
pub async fn erase_user(
    state: &Engine,
    team: TeamId,
    user: &str,
    by: &Actor,
) -> Result<(), EraseError> {
    loop {
        let chats = bounded(state.store.chats_of_user(team, user, BATCH)).await?;
        if chats.is_empty() {
            break;
        }
        for chat in chats {
            match erase_chat(state, team, chat).await {
                // Erased meanwhile by another request.
                Ok(()) | Err(EraseError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    bounded(state.store.erase_user(team, user, by)).await?;
    state.metrics.erased("user");
    tracing::info!(%team, "end user erased");
    Ok(())
}

/// Stops the agent's turns, then erases its chats one by one, so no one transaction holds
/// a long history.
async fn erase_chats_of(state: &Engine, team: TeamId, agent: AgentId) -> Result<(), EraseError> {
    stop_and_wait(state, team, Within::Agent(agent)).await?;
    loop {
        let chats = bounded(state.store.chats_of_agent(team, agent, BATCH)).await?;
        if chats.is_empty() {
            return Ok(());
        }
        for chat in chats {
            if let Some(erased) = erase_chat_rows(state, team, chat).await? {
                remove_outside(state, erased).await;
            }
        }
    }
}

/// Deletes the rows of `chat`: its messages a batch at a time (each call bounded), then
/// the rest in one transaction. `None` when there is no such chat.
async fn erase_chat_rows(
    state: &Engine,
    team: TeamId,
    chat: ChatId,
) -> Result<Option<Erased>, StoreError> {
    while bounded(state.store.erase_messages_batch(team, chat)).await? {}
    bounded(state.store.erase_chat(team, chat)).await
}

/// Stops every running or queued turn of `team` (`within` one agent or chat), wherever it
/// runs (a disabled team's too, L1). A turn that slips in after the read was admitted
/// before the caller's change reached its replica; repeating the request stops it.
/// Answers the turns that were running.
pub async fn stop_turns(
    state: &Engine,
    team: TeamId,
    within: Within,
) -> Result<Vec<TurnId>, StopError> {
    let mut running = Vec::new();
    for turn in bounded(state.store.unfinished_turns(team, within)).await? {
        let found = match stop::find(&state.store, team, turn).await {
            Ok(found) => found,
            Err(StopError::NotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        let was_running = found.status == TurnStatus::Running;
        stop::stop(state, team, found).await?;
        if was_running {
            running.push(turn);
        }
    }
    Ok(running)
}

/// [`stop_turns`], then waits up to [`TURNS_END_WITHIN`] for the running ones to end.
async fn stop_and_wait(state: &Engine, team: TeamId, within: Within) -> Result<(), StopError> {
    let running = stop_turns(state, team, within).await?;
    wait_ended(state, team, &running).await;
    Ok(())
}

/// Waits until none of `turns` runs, or [`TURNS_END_WITHIN`] passed.
async fn wait_ended(state: &Engine, team: TeamId, turns: &[TurnId]) {
    let deadline = tokio::time::Instant::now() + TURNS_END_WITHIN;
    for turn in turns {
        loop {
            match stop::find(&state.store, team, *turn).await {
                Ok(now) if now.status == TurnStatus::Running => {}
                _ => break,
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(%turn, "a stopped turn still runs; erasing anyway");
                return;
            }
            tokio::time::sleep(TURNS_POLL).await;
        }
    }
}

/// Deletes what the rows in `erased` had outside Postgres: the chats' events streams and
/// the bytes. A failure is logged (its class) and left: the stream expires with its window,
/// the bytes stay queued for the sweep.
async fn remove_outside(state: &Engine, erased: Erased) {
    for chat in &erased.chats {
        if let Err(err) = state.events.forget(*chat).await {
            tracing::warn!(%chat, class = %err, "events stream of an erased chat not deleted");
        }
    }
    crate::artifacts::garbage::delete_bytes(&state.store, &*state.artifacts, &erased.blobs).await;
}

/// Wakes this replica's team erasures at once (after a `DELETE /v1/teams/{id}`).
#[derive(Clone, Default)]
pub struct TeamErasures(std::sync::Arc<Notify>);

impl TeamErasures {
    pub fn wake(&self) {
        self.0.notify_one();
    }
}

/// Erases the teams marked for it, one at a time, every [`TEAM_POLL`] and whenever this
/// replica is woken, until `stop`. Every replica runs it; a team's lease keeps it to one.
pub async fn run(state: Engine, stop: CancellationToken) {
    let lease_ms = TEAM_LEASE.as_millis() as i64;
    loop {
        loop {
            let team = match bounded(state.store.claim_team_erasure(lease_ms)).await {
                Ok(Some(team)) => team,
                Ok(None) => break,
                Err(err) => {
                    tracing::warn!(class = err.metric_label(), "team erasure not claimed");
                    break;
                }
            };
            match erase_team(&state, team, lease_ms, &stop).await {
                Ok(true) => tracing::info!(%team, "team erased"),
                Ok(false) => {}
                // The lease lapses; this replica or another tries again.
                Err(err) => {
                    tracing::warn!(%team, class = err.metric_label(), "team erasure interrupted")
                }
            }
            if stop.is_cancelled() {
                return;
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = state.team_erasures.0.notified() => {}
            () = tokio::time::sleep(TEAM_POLL) => {}
        }
    }
}

/// Erases `team`, agent by agent, renewing its lease between them; `false` when the lease
/// was lost or the replica stops (another replica, or this one later, goes on).
async fn erase_team(
    state: &Engine,
    team: TeamId,
    lease_ms: i64,
    stop: &CancellationToken,
) -> Result<bool, EraseError> {
    stop_and_wait(state, team, Within::Team).await?;
    loop {
        let agents = bounded(state.store.agents_of_team(team, BATCH)).await?;
        if agents.is_empty() {
            break;
        }
        for agent in agents {
            if stop.is_cancelled()
                || !bounded(state.store.renew_team_erasure(team, lease_ms)).await?
            {
                return Ok(false);
            }
            // The operator erases the team (in the background, so with no address); these
            // entries go with the team's log when the erasure finishes.
            match erase_agent(state, team, agent, &Actor::operator(None)).await {
                Ok(()) | Err(EraseError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    for table in Bulky::ALL {
        while bounded(state.store.erase_team_batch(team, table)).await? {}
    }
    let erased = bounded(state.store.finish_team_erasure(team)).await?;
    remove_outside(state, erased).await;
    forget_team_keys(state, team).await;
    state.metrics.erased("team");
    Ok(true)
}

/// Deletes the team's quota counters in Redis (`quota:{<team>}:*`: counts and turn ids, no
/// content; they would expire by themselves within a month). The team's id is their hash
/// tag, so on a Redis Cluster the scan runs on the one master that holds them all.
async fn forget_team_keys(state: &Engine, team: TeamId) {
    let tagged = format!("quota:{{{team}}}:");
    let pattern = format!("{tagged}*");
    let result = crate::redis::bounded(KEYS_BOUND, async {
        let mut conn = state.redis.connection().await?;
        let mut cursor: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_PAGE);
            let (next, keys): (u64, Vec<String>) = conn.query_on_slot_of(&tagged, &scan).await?;
            if !keys.is_empty() {
                redis::cmd("DEL")
                    .arg(&keys)
                    .query_async::<()>(&mut conn)
                    .await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    })
    .await;
    if let Err(err) = result {
        tracing::warn!(%team, class = err.0, "quota counters of an erased team not deleted");
    }
}
