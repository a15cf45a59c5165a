//! The autostart scheduler (SPEC T11): every replica runs it; each tick fires once.
//!
//! Every `BRAIN_AUTOSTART_POLL_MS` the replica reads the agents whose
//! `autostart_next_fire_at` is due (one read of a partial index). For each it computes,
//! from the cadence in its time zone, the latest tick at or before now (after downtime the
//! ticks missed fire once, as that one) and the first tick after now, and claims the
//! first while moving the agent to the second in one statement (`Store::claim_autostart`:
//! a compare-and-set on the value the poll read, so of any number of replicas one claims
//! it). The claim's turn then starts with no client attached (`turn::launch`, detached), in
//! the agent's autostart chat, with the autostart prompt, admitted like any other turn:
//! a busy agent is recorded `skipped_busy` and its running turn goes on, a quota refusal
//! or any other failure is recorded `failed` with its code.
//!
//! The scheduler stops claiming when the replica starts draining; a claimed tick's turn
//! is tracked like every other turn, so the drain waits for it.

use std::time::Duration;

use protocol::ErrorCode;
use uuid::Uuid;

use crate::Engine;
use crate::auth::{Authority, Scope};
use crate::lease::bounded;
use crate::schedule::Cadence;
use crate::turn::{self, Trigger, TurnError, TurnInput};
use store::{Claimed, DueAutostart, FireOutcome};

/// The bound on each of the scheduler's statements.
const STORE_BOUND: Duration = Duration::from_secs(5);
/// Due agents read per poll; more wait for the next poll.
const BATCH: i64 = 64;
/// Stored cadences were checked against the configured minimum when they were set; one
/// set under a smaller minimum still runs.
const ANY_INTERVAL: u32 = 1;

/// Polls and fires until the replica drains.
pub async fn run(state: Engine) {
    schedule_unscheduled(&state).await;
    let mut tick = tokio::time::interval(state.config.autostart.poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            // A draining replica starts no turn.
            () = state.draining.cancelled() => return,
            _ = tick.tick() => {}
        }
        poll(&state).await;
    }
}

/// Gives a next tick to cadences set before the scheduler existed.
async fn schedule_unscheduled(state: &Engine) {
    let agents = match bounded(STORE_BOUND, state.store.unscheduled_autostarts()).await {
        Ok(agents) => agents,
        Err(class) => {
            tracing::warn!(class, "could not read unscheduled autostarts");
            return;
        }
    };
    let now = state.clock.now();
    for due in agents {
        let next = cadence(&due).and_then(|c| c.next_after(now));
        if let Err(class) = bounded(STORE_BOUND, state.store.reschedule_autostart(&due, next)).await
        {
            tracing::warn!(agent = %due.agent, class, "could not schedule an autostart");
        }
    }
}

async fn poll(state: &Engine) {
    let due = state.store.due_autostarts(state.clock.now(), BATCH);
    let due = match bounded(STORE_BOUND, due).await {
        Ok(due) => due,
        Err(class) => {
            tracing::warn!(class, "could not read due autostarts");
            return;
        }
    };
    for due in due {
        let Some(seen) = due.next_fire_at else {
            continue;
        };
        let Some(cadence) = cadence(&due) else {
            // Unreadable now (cannot happen to a cadence the API checked): switched off
            // rather than read again at every poll.
            let _ = bounded(STORE_BOUND, state.store.reschedule_autostart(&due, None)).await;
            continue;
        };
        // Never before the stored tick, whatever this replica's clock says: each claim
        // moves the agent strictly forward, so two claims never cover one tick.
        let now = state.clock.now().max(seen);
        let scheduled_for = cadence.latest_until(now).unwrap_or(seen).max(seen);
        let next = cadence.next_after(now);
        let claimed = bounded(
            STORE_BOUND,
            state.store.claim_autostart(&due, scheduled_for, next),
        )
        .await;
        match claimed {
            Ok(Some(claimed)) => {
                let fire = fire(state.clone(), due, claimed);
                state.turn_tracker.spawn(fire);
            }
            // Another replica claimed it, or the cadence changed since the read.
            Ok(None) => {}
            Err(class) => tracing::warn!(agent = %due.agent, class, "could not claim an autostart"),
        }
    }
}

fn cadence(due: &DueAutostart) -> Option<Cadence> {
    match Cadence::parse(&due.cron, due.timezone.as_deref(), ANY_INTERVAL) {
        Ok(cadence) => Some(cadence),
        Err(_) => {
            tracing::warn!(agent = %due.agent, "stored autostart cadence no longer parses; switched off");
            None
        }
    }
}

/// X1: an autostart's turns act with the authority of who set it: an admin, since only an
/// admin may set one (over the API or through a tool). A cadence from before the setter
/// was recorded gets a chat principal's authority, which changes nothing of the agent.
fn autostart_authority(set_by: Option<String>) -> Authority {
    match set_by {
        Some(actor) => Authority {
            scope: Scope::Admin,
            actor,
        },
        None => Authority {
            scope: Scope::Chat,
            actor: "autostart".to_owned(),
        },
    }
}

/// X1: whether who set the cadence still stands. A key's must be live (a revoked key's
/// cadence stops acting for it); a user's must not be disabled, nor seen since without
/// the admin claim (the brain asks no issuer: the latest token of theirs tells, see
/// `Keys::check_user`); the team's own check is the turn's (`turn/standing.rs`).
async fn setter_stands(state: &Engine, due: &DueAutostart) -> Result<bool, &'static str> {
    let Some(setter) = due.set_by.as_deref() else {
        return Ok(true);
    };
    if let Some(user) = setter.strip_prefix("user:") {
        let known = bounded(STORE_BOUND, state.store.team_user(due.team, user)).await?;
        return Ok(!known.is_some_and(|u| u.disabled || u.admin == Some(false)));
    }
    let Some(key) = setter
        .strip_prefix("key:")
        .and_then(|id| id.parse::<Uuid>().ok())
    else {
        return Ok(true);
    };
    let live = bounded(STORE_BOUND, state.store.live_key_hash(due.team, key)).await?;
    Ok(live.is_some())
}

/// Starts the claimed tick's turn and records what it became.
async fn fire(state: Engine, due: DueAutostart, claimed: Claimed) {
    let outcome = match setter_stands(&state, &due).await {
        Ok(true) => launch(&state, &due, claimed).await,
        Ok(false) => {
            // Paused until an admin sets the cadence again; the failed fire is the
            // team's `autostart.failed` webhook.
            let code = ErrorCode::SetterRevoked;
            if let Err(class) = bounded(STORE_BOUND, state.store.pause_autostart(&due, code)).await
            {
                tracing::warn!(agent = %due.agent, class, "could not pause an autostart");
            }
            FireOutcome::Failed(code)
        }
        Err(class) => {
            tracing::warn!(agent = %due.agent, class, "could not check an autostart's setter");
            FireOutcome::Failed(ErrorCode::StoreUnavailable)
        }
    };
    tracing::info!(
        team = %due.team,
        agent = %due.agent,
        chat = %claimed.chat,
        outcome = ?outcome,
        "autostart tick"
    );
    if let Err(class) = bounded(STORE_BOUND, state.store.record_fire(claimed.task, outcome)).await {
        tracing::warn!(agent = %due.agent, class, "could not record an autostart tick");
    }
}

/// The claimed tick's turn, in the agent's own autostart chat.
async fn launch(state: &Engine, due: &DueAutostart, claimed: Claimed) -> FireOutcome {
    let input = TurnInput {
        content: due.prompt.clone(),
        client_message_id: None,
        files: Vec::new(),
        instructions: None,
    };
    let authority = autostart_authority(due.set_by.clone());
    let started = turn::launch(
        state,
        due.team,
        claimed.chat,
        Trigger::Autostart(input, due.agent),
        authority,
        true,
        None,
    )
    .await
    .and_then(|launched| {
        launched.turn.ok_or(TurnError::Internal(
            "an autostart fire started no turn".into(),
        ))
    });
    match started {
        Ok(turn) => FireOutcome::Fired(turn),
        Err(TurnError::Busy(_)) => FireOutcome::SkippedBusy,
        Err(err) => FireOutcome::Failed(err.code()),
    }
}
