//! One turn per agent (SPEC T9): a Redis hold taken before a turn starts.
//!
//! The hold is the key `hold:{<team_id>}:agent:<agent_id>`, set with `NX` and a short expiry; its value
//! is `{turn_id}:{replica_id}:{taken_at_ms}:{token}`, so a refused caller learns which turn
//! is running and on which replica since when, and only the holder (who alone knows the
//! random token) can extend or delete it, besides a survivor freeing the hold of a turn
//! whose replica died (`release_lost`, by the turn id) or a hold left by a replica lost
//! before it wrote its turn (`release_left_behind`, by the whole value, O5). While
//! the turn runs, a task pushes the expiry back to `ttl` every `extend_every`, never past
//! `max_total` after acquisition; a turn that outlives its hold therefore cannot free or
//! extend another's.
//!
//! Best effort: every Redis call is bounded by `op_timeout`, and when Redis is unreachable
//! or slow the turn runs without a hold (`Acquired::Unavailable`, counted in metrics)
//! rather than waiting or failing.
//!
//! Quotas (SPEC T2, E2) ride on the same round trip: [`Holds::admit`] runs one script that
//! answers busy, refuses for a team quota, or takes the hold and reserves the turn's
//! tokens at once, and releasing the hold settles the reservation on the billed tokens.
//! The team's counters (keys `quota:{<team_id>}:…`) are: the limits (a hash that expires, so
//! a replica reloads them from Postgres every minute), the running turns (a sorted set
//! scored by when each one's hold lapses, so a dead replica's turns leave it on their
//! own), their reservations (a hash and its total), the turn starts of the last minute
//! (a sorted set), and the billed tokens of the UTC day and month (rebuilt from Postgres'
//! billing events when missing, and every hour, so drift heals). A turn's billed tokens
//! are added once, keyed by the turn, through a short ledger of settled turns: whether
//! or not its reservation was reaped meanwhile, and whichever of its settlement and a
//! rebuild of the counters comes first (`settle.lua`, `rebuild.lua`).
//!
//! A JWT user's turn (L4) also counts at its user's level, whose keys
//! (`quota:{<team_id>}:user:<len>:<user>:…`) are the team's counters again, plus the user's
//! overrides; every script above takes the user's keys after the team's, in the same call.
//!
//! Redis Cluster (O5): every key here carries its team's id as its hash tag (`{<team_id>}`),
//! so each script above, whose keys are one hold and its team's (and user's) counters,
//! runs in one slot, atomic as on one node. The cost: one team's turns all land on one
//! shard; teams spread over the shards.
//!
//! Architecture invariant: only this module knows the hold's and the counters' key names
//! and value formats.

//!
//! The phases, one file each: `acquire` (the plain hold, and a taken-over turn's),
//! `admit` (the hold and the quotas in one script), `guard` (the running turn's hold and
//! its extension), `reserve` (a further model call's tokens), `release` (freeing and
//! settling), `counters` (rebuilding, billing and forgetting the budget counters);
//! `keys` names every key, `scripts` loads the Lua beside them.

use std::sync::Arc;
use std::time::Duration;

use protocol::{AgentId, ReplicaId, TeamId, TurnId};

use crate::metrics::Metrics;
use crate::quota::{Levels, Refusal};
use crate::redis::Shared;

mod acquire;
mod admit;
mod counters;
mod guard;
mod keys;
mod release;
mod reserve;
mod scripts;

pub use guard::HoldGuard;

/// Hold settings. `extend_every` must be well under `ttl`, or the hold lapses between
/// extensions.
#[derive(Clone, Debug)]
pub struct HoldConfig {
    /// Expiry set on acquisition and on every extension.
    pub ttl: Duration,
    /// How often a running turn pushes the expiry back.
    pub extend_every: Duration,
    /// The hold never outlives acquisition by more than this, however long the turn runs.
    pub max_total: Duration,
    /// Bound on every Redis call, connecting included.
    pub op_timeout: Duration,
    /// Which UTC day and month the budget counters are keyed by.
    pub clock: crate::clock::Clock,
}

impl Default for HoldConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(5 * 60),
            extend_every: Duration::from_secs(100),
            max_total: Duration::from_secs(60 * 60),
            op_timeout: Duration::from_millis(250),
            clock: crate::clock::Clock::system(),
        }
    }
}

/// Takes per-agent turn holds. Cheap to clone: one shared Redis connection for all.
#[derive(Clone)]
pub struct Holds {
    inner: Arc<Inner>,
}

struct Inner {
    config: HoldConfig,
    /// Named in every hold this replica takes.
    replica: ReplicaId,
    metrics: Metrics,
    /// Redis being down at start only makes the first acquires `Unavailable`.
    redis: Shared,
    scripts: scripts::Scripts,
}

/// The answer to `Holds::acquire`.
#[derive(Debug)]
pub enum Acquired {
    /// The agent is ours until the guard is released or dropped.
    Held(HoldGuard),
    /// Another turn holds the agent.
    Busy { running: TurnId },
    /// Redis unreachable or slow: the turn runs without a hold (best effort) and metrics
    /// count it.
    Unavailable,
}

/// A turn asking to start: its hold, and the tokens its first model call may spend.
#[derive(Clone, Copy, Debug)]
pub struct TurnAdmission<'a> {
    pub team: TeamId,
    pub agent: AgentId,
    pub turn: TurnId,
    /// The end user behind the turn (a JWT's subject), whose own limits it counts against
    /// too (L4); `None` for an API key's turn.
    pub user: Option<&'a str>,
    /// The first call's input estimate plus its output cap.
    pub reservation: u64,
}

/// The answer to `Holds::admit`.
#[derive(Debug)]
pub enum Admitted {
    /// The agent is ours and the quotas let the turn start; `levels` are the turn limits
    /// Redis enforces (all `None` for a team without any; the user's level only when the
    /// user has a turn limit of its own) and what the turn leaves of them.
    Held {
        guard: HoldGuard,
        levels: Box<Levels>,
    },
    Busy {
        running: TurnId,
        /// Who took the hold, when its value says (every hold since O5's does).
        holder: Option<Holder>,
    },
    /// A team's or a user's quota refuses the turn; nothing was taken or counted.
    Refused(Refusal),
    /// Redis unreachable or slow: the caller enforces quotas from Postgres instead.
    Unavailable,
}

/// Who holds an agent: a refused admission's view of the hold, enough to free it when
/// its replica was lost before it wrote its turn ([`Holds::release_left_behind`]).
#[derive(Clone, Debug)]
pub struct Holder {
    pub replica: ReplicaId,
    /// When it was taken, by the holder's clock.
    taken_at: std::time::SystemTime,
    /// The whole value: freeing it deletes the hold only while it is still this one.
    value: String,
}

impl Holder {
    fn parse(value: &str) -> Option<Self> {
        let mut fields = value.splitn(4, ':');
        let (_turn, replica, taken_at) = (fields.next()?, fields.next()?, fields.next()?);
        fields.next()?;
        Some(Self {
            replica: replica.parse().ok()?,
            taken_at: std::time::UNIX_EPOCH + Duration::from_millis(taken_at.parse().ok()?),
            value: value.to_owned(),
        })
    }

    /// How long it has been held (zero for a clock ahead of this one's).
    pub fn age(&self) -> Duration {
        self.taken_at.elapsed().unwrap_or_default()
    }
}

/// The answer to `HoldGuard::reserve`.
#[derive(Debug)]
pub enum Reserved {
    Ok,
    Refused(Refusal),
    /// Redis unreachable or slow: the caller decides from Postgres.
    Unavailable,
}

/// What a turn billed, settled into the budget counters at its release.
#[derive(Clone, Copy, Debug, Default)]
pub struct Billed {
    /// Input + output tokens of every model call it made.
    pub tokens: u64,
    /// When its billing events were written (Postgres' clock); `None` if they were not.
    pub at: Option<chrono::DateTime<chrono::Utc>>,
    /// Admitted but never started: a retried message id answered by its earlier turn
    /// (T12). Its start leaves the minute's count, as if it had not been admitted.
    pub unstarted: bool,
}

/// A turn the team's quota counters count, settled at release: at its end user's level
/// too when it has one (a settlement where the turn was not admitted only adds its billed
/// tokens to the user's counters that exist, which is right either way).
#[derive(Clone, Debug)]
struct Counted {
    team: TeamId,
    turn: TurnId,
    user: Option<String>,
}

/// Why a Redis call failed, as a label for logs (never the error text).
type Class = &'static str;

impl Holds {
    /// Does no I/O: the connection is made on the first `acquire`.
    pub fn new(
        redis: crate::redis::Client,
        replica: ReplicaId,
        config: HoldConfig,
        metrics: Metrics,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                redis: Shared::new(redis, config.op_timeout),
                config,
                replica,
                metrics,
                scripts: scripts::Scripts::new(),
            }),
        }
    }
}

impl Inner {
    /// The periods the budget counters are keyed by now.
    fn periods(&self) -> crate::quota::Periods {
        crate::quota::Periods::now(&self.config.clock)
    }

    /// A new hold's value for `turn`: the turn, this replica, when, and a random token.
    fn value(&self, turn: TurnId) -> String {
        let taken_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        format!(
            "{turn}:{}:{taken_at}:{:032x}",
            self.replica,
            rand::random::<u128>()
        )
    }

    /// A new hold's first expiry.
    fn first_expiry(&self) -> Duration {
        self.config.ttl.min(self.config.max_total)
    }
}

/// The turn id part of a hold's value.
fn turn_of(value: &str) -> &str {
    value.split_once(':').map_or(value, |(turn, _)| turn)
}

fn running_turn(value: &str) -> Option<TurnId> {
    let (turn, _token) = value.split_once(':')?;
    turn.parse().ok()
}

/// Whole milliseconds, at least 1 (`PX 0` / `PEXPIRE 0` would be an error or a delete).
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}
