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
//! rebuild of the counters comes first (`SETTLE`, `REBUILD`).
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

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use protocol::{AgentId, QuotaScope, ReplicaId, TeamId, TurnId};
use redis::RedisError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::{HoldResult, Metrics};
use crate::quota::{
    Field, Levels, Limits, Periods, Quotas, RateLimitHeaders, Refusal, Standing, TurnCounts,
};
use crate::redis::{Shared, bounded};
use store::StoreError;

/// Sets the key if free and answers nil; otherwise answers the current value. One round
/// trip, atomic: a refused caller learns the running turn at once.
const ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
return redis.call('GET', KEYS[1])
";

/// Pushes the expiry back only while the value is still ours: 1 if extended, 0 if not.
const EXTEND: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Deletes the key only while the value is still ours: 1 if deleted, 0 if not.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Takes the key over for the turn `ARGV[1]` (`{turn_id}:`) with the new value `ARGV[2]`
/// while it is free or still names that turn: how a replica that took a turn over (D3)
/// holds its agent on. Answers nil when adopted, else the value of the turn that holds it.
const ADOPT: &str = r"
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return false
end
return v
";

/// Deletes the key only while its value names the turn `ARGV[1]` (`{turn_id}:`): how a
/// survivor frees the agent of a turn whose replica died, without knowing its token.
const RELEASE_TURN: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// The quota-aware `ACQUIRE` (see the module doc for the keys). Keys: the hold, then the
/// team's level (limits, running, reservations, their total, starts, day, month), then,
/// for an end user's turn (L4), the user's level (its overrides, then the same six).
/// Answers `{"busy", value}`, `{"limits"}` (none stored: the next call carries them,
/// `ARGV[5]` = `1`, `ARGV[7..10]` the team's, `ARGV[12..15]` its `per_user`, `ARGV[16]`
/// `1` when any user has overrides, `ARGV[17..20]` this user's overrides, `-` for none),
/// `{"rebuild", level}` (a budget counter of `team` or `user` is missing: `REBUILD` it,
/// then call again), `{"refused", level, field, standings…}`, `{"ok"}` (no level has a
/// turn limit) or `{"ok", standings…}`: per level counted (the team's, then the user's
/// when it has a turn limit of its own) the running turns, the turns of the last minute,
/// ms until the oldest of them leaves the window, billed + reserved tokens of the day and
/// month, as the turn leaves them, then the four turn limits (empty for unlimited). A
/// user's limit is its override if it has one, else the team's `per_user`. The refusal
/// rule is `quota::fallback::decide_levels`', in the same order.
const ADMIT: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then return {'busy', cur} end
local user = #KEYS > 8
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[2], 'set', '1', 'tpd', ARGV[7], 'tpmo', ARGV[8], 'tpm', ARGV[9], 'ct', ARGV[10],
    'utpd', ARGV[12], 'utpmo', ARGV[13], 'utpm', ARGV[14], 'uct', ARGV[15], 'uo', ARGV[16])
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
  if user then
    redis.call('HSET', KEYS[9], 'set', '1', 'tpd', ARGV[17], 'tpmo', ARGV[18], 'tpm', ARGV[19], 'ct', ARGV[20])
    redis.call('PEXPIRE', KEYS[9], ARGV[6])
  end
end
local lim = redis.call('HMGET', KEYS[2], 'set', 'tpd', 'tpmo', 'tpm', 'ct', 'utpd', 'utpmo', 'utpm', 'uct', 'uo')
if not lim[1] then return {'limits'} end
local function num(v) if not v or v == '' then return nil end return tonumber(v) end
local function limited(l) return num(l[1]) or num(l[2]) or num(l[3]) or num(l[4]) end
local levels = {{base = 3, scope = 'team', lim = {lim[2] or '', lim[3] or '', lim[4] or '', lim[5] or ''}}}
if user then
  local def = {lim[6] or '', lim[7] or '', lim[8] or '', lim[9] or ''}
  if lim[10] == '1' or limited(def) then
    local o = redis.call('HMGET', KEYS[9], 'set', 'tpd', 'tpmo', 'tpm', 'ct')
    if not o[1] then return {'limits'} end
    local u = {}
    for i = 1, 4 do
      if o[i + 1] and o[i + 1] ~= '-' then u[i] = o[i + 1] else u[i] = def[i] end
    end
    if limited(u) then levels[2] = {base = 10, scope = 'user', lim = u} end
  end
end
if not (limited(levels[1].lim) or levels[2]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {'ok'}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, lv in ipairs(levels) do
  local k = lv.base
  local gone = redis.call('ZRANGEBYSCORE', KEYS[k], '-inf', now)
  for _, m in ipairs(gone) do
    local r = redis.call('HGET', KEYS[k + 1], m)
    if r then
      redis.call('DECRBY', KEYS[k + 2], r)
      redis.call('HDEL', KEYS[k + 1], m)
    end
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now) end
  lv.running = redis.call('ZCARD', KEYS[k])
  redis.call('ZREMRANGEBYSCORE', KEYS[k + 3], '-inf', now - 60000)
  lv.recent = redis.call('ZCARD', KEYS[k + 3])
  lv.reset = 0
  if lv.recent > 0 then
    local oldest = redis.call('ZRANGE', KEYS[k + 3], 0, 0, 'WITHSCORES')
    lv.reset = tonumber(oldest[2]) + 60000 - now
  end
  lv.day, lv.month = 0, 0
  local tpd, tpmo = num(lv.lim[1]), num(lv.lim[2])
  if tpd or tpmo then
    local d, m = redis.call('GET', KEYS[k + 4]), redis.call('GET', KEYS[k + 5])
    if (tpd and not d) or (tpmo and not m) then return {'rebuild', lv.scope} end
    local resv = tonumber(redis.call('GET', KEYS[k + 2]) or '0')
    lv.day = tonumber(d or '0') + resv
    lv.month = tonumber(m or '0') + resv
  end
end
local function answer(head, scope, field)
  local a = {head}
  if scope then a[#a + 1] = scope; a[#a + 1] = field end
  for _, lv in ipairs(levels) do
    for _, v in ipairs({lv.running, lv.recent, lv.reset, lv.day, lv.month}) do
      a[#a + 1] = string.format('%.0f', v)
    end
    for i = 1, 4 do a[#a + 1] = lv.lim[i] end
  end
  return a
end
for _, lv in ipairs(levels) do
  local tpd, tpmo, tpm, ct = num(lv.lim[1]), num(lv.lim[2]), num(lv.lim[3]), num(lv.lim[4])
  if ct and lv.running >= ct then return answer('refused', lv.scope, 'concurrent_turns') end
  if tpm and lv.recent >= tpm then return answer('refused', lv.scope, 'turns_per_minute') end
  if tpd and lv.day >= tpd then return answer('refused', lv.scope, 'tokens_per_day') end
  if tpmo and lv.month >= tpmo then return answer('refused', lv.scope, 'tokens_per_month') end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local r = tonumber(ARGV[4])
for _, lv in ipairs(levels) do
  local k = lv.base
  redis.call('ZADD', KEYS[k], now + tonumber(ARGV[2]), ARGV[3])
  redis.call('HSET', KEYS[k + 1], ARGV[3], r)
  redis.call('INCRBY', KEYS[k + 2], r)
  redis.call('ZADD', KEYS[k + 3], now, ARGV[3])
  for i = k, k + 2 do redis.call('PEXPIRE', KEYS[i], ARGV[11]) end
  redis.call('PEXPIRE', KEYS[k + 3], 61000)
  lv.running, lv.recent, lv.day, lv.month = lv.running + 1, lv.recent + 1, lv.day + r, lv.month + r
  if lv.reset == 0 then lv.reset = 60000 end
end
return answer('ok')
";

/// A further model call of an admitted turn (`ARGV[1]`) reserves its estimate (`ARGV[2]`)
/// at each level it counts at (the team's, then its end user's): four keys a level (the
/// reservations, their total, the day's and the month's counters) and two limits
/// (`ARGV[3]`/`ARGV[4]` the team's day and month budgets, `ARGV[5]`/`ARGV[6]` the
/// user's; empty for none). Answers `{"rebuild", level}` (as `ADMIT`'s),
/// `{"refused", level, field, day, month}` or `{"ok"}`. A turn that is not running in a
/// level's counters (its entry lapsed) reserves nothing there and is let through: it was
/// admitted.
const RESERVE: &str = r"
local function num(v) if not v or v == '' then return nil end return tonumber(v) end
local function f(v) return string.format('%.0f', v) end
local scopes = {'team', 'user'}
for i = 1, #KEYS / 4 do
  local k = (i - 1) * 4
  local tpd, tpmo = num(ARGV[1 + 2 * i]), num(ARGV[2 + 2 * i])
  local d, m = redis.call('GET', KEYS[k + 3]), redis.call('GET', KEYS[k + 4])
  if (tpd and not d) or (tpmo and not m) then return {'rebuild', scopes[i]} end
  local resv = tonumber(redis.call('GET', KEYS[k + 2]) or '0')
  local day, month = tonumber(d or '0') + resv, tonumber(m or '0') + resv
  if tpd and day >= tpd then return {'refused', scopes[i], 'tokens_per_day', f(day), f(month)} end
  if tpmo and month >= tpmo then return {'refused', scopes[i], 'tokens_per_month', f(day), f(month)} end
end
local r = tonumber(ARGV[2])
for i = 1, #KEYS / 4 do
  local k = (i - 1) * 4
  if redis.call('HEXISTS', KEYS[k + 1], ARGV[1]) == 1 then
    redis.call('HINCRBY', KEYS[k + 1], ARGV[1], r)
    redis.call('INCRBY', KEYS[k + 2], r)
  end
end
return {'ok'}
";

/// `RELEASE` that also settles the turn's quota counters, at each level it counts at (the
/// team's, keys 2-11, then its end user's, keys 12-21, L4): it leaves the running set and
/// its reservation (if not reaped already) is returned. Its billed tokens `ARGV[3]`,
/// billed at `ARGV[4]` (ms, Postgres' clock; empty: unknown, Redis' now), go into the
/// team's ledger of settled turns (keys 7 and 8) once per turn, and with it into each
/// level's ledger and each day and month counter that exists and was rebuilt from
/// billing events before they were billed (its `since`): a counter rebuilt later holds
/// them already. A retried settlement, or one of a turn whose reservation was reaped,
/// adds nothing twice and loses nothing. `ARGV[5]`: how long a ledger keeps a turn (ms).
/// `ARGV[6]` `1`: the turn never started (a retried message id's, answered by its earlier
/// turn: T12), so it leaves the minute's starts too. A level's keys: running,
/// reservations, their total, day, month, ledger (when, tokens), day's and month's
/// `since`, starts. 1 if the hold was ours.
const SETTLE: &str = r"
local ours = redis.call('GET', KEYS[1]) == ARGV[1]
if ours then redis.call('DEL', KEYS[1]) end
local levels = (#KEYS - 1) / 10
for i = 1, levels do
  local k = 1 + (i - 1) * 10
  redis.call('ZREM', KEYS[k + 1], ARGV[2])
  if ARGV[6] == '1' then redis.call('ZREM', KEYS[k + 10], ARGV[2]) end
  local r = redis.call('HGET', KEYS[k + 2], ARGV[2])
  if r then
    redis.call('HDEL', KEYS[k + 2], ARGV[2])
    redis.call('DECRBY', KEYS[k + 3], r)
  end
end
local b = tonumber(ARGV[3])
if b > 0 then
  local at = tonumber(ARGV[4])
  if not at then
    local t = redis.call('TIME')
    at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  if redis.call('ZADD', KEYS[7], 'NX', at, ARGV[2]) == 1 then
    local keep = tonumber(ARGV[5])
    for i = 1, levels do
      local k = 1 + (i - 1) * 10
      if i > 1 then redis.call('ZADD', KEYS[k + 6], at, ARGV[2]) end
      redis.call('HSET', KEYS[k + 7], ARGV[2], b)
      for j = 4, 5 do
        if redis.call('EXISTS', KEYS[k + j]) == 1
          and at >= tonumber(redis.call('GET', KEYS[k + j + 4]) or '0') then
          redis.call('INCRBY', KEYS[k + j], b)
        end
      end
      local old = redis.call('ZRANGEBYSCORE', KEYS[k + 6], '-inf', at - keep)
      if #old > 0 then
        redis.call('HDEL', KEYS[k + 7], unpack(old))
        redis.call('ZREMRANGEBYSCORE', KEYS[k + 6], '-inf', at - keep)
      end
      redis.call('PEXPIRE', KEYS[k + 6], keep)
      redis.call('PEXPIRE', KEYS[k + 7], keep)
    end
  end
end
if ours then return 1 end
return 0
";

/// Sets a missing day (key 1) or month (key 2) counter: the tokens billed before the
/// cutoff `ARGV[3]` (ms, Postgres' clock) as Postgres summed them (`ARGV[1]`/`ARGV[2]`),
/// plus the ledger's turns billed since the cutoff and within the
/// period (`ARGV[4]`/`ARGV[5]`: from when). The cutoff is kept as the counter's `since`
/// (keys 3 and 4): turns settling later add to it only if billed at or after it. Keys 5
/// and 6 are the ledger. `ARGV[6]`: the counters' lifetime (s). Set with `NX`: a counter
/// another replica rebuilt meanwhile stays.
const REBUILD: &str = r"
for i = 1, 2 do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    local total = tonumber(ARGV[i])
    for _, turn in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], ARGV[3 + i], '+inf')) do
      total = total + tonumber(redis.call('HGET', KEYS[6], turn) or '0')
    end
    redis.call('SET', KEYS[i], string.format('%.0f', total), 'EX', ARGV[6])
    redis.call('SET', KEYS[i + 2], ARGV[3], 'EX', ARGV[6])
  end
end
return 1
";

/// Adds tokens billed outside a turn's reservation (a background summary) to the day's
/// and the month's counters that exist: the team's, and its end user's when given.
const BILL: &str = r"
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBY', KEYS[i], ARGV[1]) end
end
return 1
";

/// `EXTEND` that also pushes the turn's running entries back (the team's, and its end
/// user's when it has one), so a live turn stays counted.
const EXTEND_COUNTED: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for i = 2, #KEYS do
    redis.call('ZADD', KEYS[i], 'XX', now + tonumber(ARGV[2]), ARGV[3])
  end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// How long a replica trusts the limits it wrote to Redis before reloading them.
const LIMITS_TTL: Duration = Duration::from_secs(60);
/// How long a budget counter lives before it is rebuilt from billing events.
const COUNTER_TTL: Duration = Duration::from_secs(60 * 60);
/// A rebuild takes from Postgres the billing events older than this, which have all
/// committed (a brain statement is cancelled within `BRAIN_DATABASE_STATEMENT_TIMEOUT_MS`,
/// at most a minute), and the newer ones from the ledger of settled turns; so a turn that
/// ends while a counter is rebuilt is counted once, whichever lands first.
const REBUILD_MARGIN: Duration = Duration::from_secs(2 * 60);
/// How long the ledger of settled turns keeps one: well past [`REBUILD_MARGIN`] and a
/// rebuild's round trips.
const LEDGER_KEEP: Duration = Duration::from_secs(10 * 60);

/// Attempts at releasing a hold (50 ms, 200 ms, 800 ms apart).
const RELEASE_TRIES: u32 = 4;

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
}

impl Default for HoldConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(5 * 60),
            extend_every: Duration::from_secs(100),
            max_total: Duration::from_secs(60 * 60),
            op_timeout: Duration::from_millis(250),
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
    acquire: redis::Script,
    extend: redis::Script,
    release: redis::Script,
    release_turn: redis::Script,
    adopt: redis::Script,
    admit: redis::Script,
    reserve: redis::Script,
    settle: redis::Script,
    rebuild: redis::Script,
    extend_counted: redis::Script,
    bill: redis::Script,
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
                acquire: redis::Script::new(ACQUIRE),
                extend: redis::Script::new(EXTEND),
                release: redis::Script::new(RELEASE),
                release_turn: redis::Script::new(RELEASE_TURN),
                adopt: redis::Script::new(ADOPT),
                admit: redis::Script::new(ADMIT),
                reserve: redis::Script::new(RESERVE),
                settle: redis::Script::new(SETTLE),
                rebuild: redis::Script::new(REBUILD),
                extend_counted: redis::Script::new(EXTEND_COUNTED),
                bill: redis::Script::new(BILL),
            }),
        }
    }

    /// `SET NX PX` with a random token in a single round trip; takes at most `op_timeout`.
    pub async fn acquire(&self, team: TeamId, agent: AgentId, turn: TurnId) -> Acquired {
        let inner = &self.inner;
        let acquired_at = Instant::now();
        let key = hold_key(team, agent);
        let value = inner.value(turn);
        let expiry = inner.config.ttl.min(inner.config.max_total);
        let answer = bounded(inner.config.op_timeout, async {
            match inner.try_acquire(&key, &value, expiry).await {
                // A connection that failed earlier is replaced on that failure: one
                // more try uses the fresh one, so a Redis that came back is used at once.
                Err(err) if err.is_io_error() => inner.try_acquire(&key, &value, expiry).await,
                answer => answer,
            }
        })
        .await
        .map_err(|u| u.0);
        let class = match answer {
            Ok(None) => {
                return Acquired::Held(HoldGuard::start(inner, key, value, acquired_at, None));
            }
            // Our own value: the first try's SET landed but its answer was lost.
            Ok(Some(current)) if current == value => {
                return Acquired::Held(HoldGuard::start(inner, key, value, acquired_at, None));
            }
            Ok(Some(current)) => match running_turn(&current) {
                Some(running) => return Acquired::Busy { running },
                None => "malformed_hold",
            },
            Err(class) => {
                if class != "connection_refused" {
                    // The SET may have landed after all: take it back so the agent does
                    // not look busy for a whole `ttl`.
                    spawn_release(inner.clone(), key, value, None);
                }
                class
            }
        };
        inner.metrics.hold_unavailable.inc();
        tracing::warn!(
            agent = %agent,
            turn = %turn,
            class,
            "turn hold unavailable; running without it"
        );
        Acquired::Unavailable
    }
}

impl Holds {
    /// Frees `agent` if its hold still names `turn`, a turn that ended without its holder
    /// (its replica died, O3). Bounded like every hold call; true if a hold was deleted.
    pub async fn release_lost(
        &self,
        team: TeamId,
        agent: AgentId,
        turn: TurnId,
    ) -> Result<bool, Class> {
        let inner = &self.inner;
        bounded(inner.config.op_timeout, async {
            let mut conn = inner.redis.get().await?;
            inner
                .release_turn
                .key(hold_key(team, agent))
                .arg(format!("{turn}:"))
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|n| n == 1)
    }
}

impl Holds {
    /// O5: frees `agent` of `holder`'s hold while it is still that one (compare and
    /// delete): its replica was lost before it wrote `turn`, the turn the hold names, so
    /// no reconciliation knows of it and nothing else would free it before it lapses. In
    /// the same script the turn leaves the team's running turns and gives back its
    /// reservation, having billed nothing. An end user's level (L4) is not settled: the
    /// hold does not name the user, so the turn's entry there lapses with the hold's
    /// expiry. True if the hold was deleted.
    pub async fn release_left_behind(
        &self,
        team: TeamId,
        agent: AgentId,
        turn: TurnId,
        holder: &Holder,
    ) -> Result<bool, Class> {
        let counted = Counted {
            team,
            turn,
            user: None,
        };
        self.inner
            .settle(
                &hold_key(team, agent),
                &holder.value,
                &counted,
                Billed::default(),
            )
            .await
    }
}

impl Holds {
    /// D3: holds `agent` on for `turn`, taken over from a dead replica, with a token of
    /// this replica's; `counted` when the team's counters count the turn (its release then
    /// settles its reservation, at its end `user`'s level too). `Ok(None)`: another turn holds the agent (the dead turn's
    /// hold lapsed and a new turn started meanwhile).
    pub async fn adopt(
        &self,
        team: TeamId,
        agent: AgentId,
        turn: TurnId,
        user: Option<&str>,
        counted: bool,
    ) -> Result<Option<HoldGuard>, Class> {
        let inner = &self.inner;
        let acquired_at = Instant::now();
        let key = hold_key(team, agent);
        let value = inner.value(turn);
        let expiry = inner.config.ttl.min(inner.config.max_total);
        let current = bounded(inner.config.op_timeout, async {
            let mut conn = inner.redis.get().await?;
            inner
                .adopt
                .key(&key)
                .arg(format!("{turn}:"))
                .arg(&value)
                .arg(millis(expiry))
                .invoke_async::<Option<String>>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)?;
        if current.is_some() {
            return Ok(None);
        }
        let counted = counted.then(|| Counted {
            team,
            turn,
            user: user.map(str::to_owned),
        });
        Ok(Some(HoldGuard::start(
            inner,
            key,
            value,
            acquired_at,
            counted,
        )))
    }
}

impl Holds {
    /// T9 and T2 in one round trip: busy, refused by a team quota, or held with the
    /// turn's tokens reserved. A missing limits hash or budget counter costs one Postgres
    /// read and one more round trip (at most once a minute and once an hour per team).
    /// Postgres failing while it is needed is an error: quotas are never skipped.
    pub async fn admit(
        &self,
        quotas: &Quotas,
        admission: TurnAdmission<'_>,
    ) -> Result<Admitted, StoreError> {
        let admitted = self.decide(quotas, admission).await;
        let result = match &admitted {
            Ok(Admitted::Held { .. }) => Some(HoldResult::Acquired),
            Ok(Admitted::Busy { .. }) => Some(HoldResult::Busy),
            Ok(Admitted::Unavailable) => Some(HoldResult::Unavailable),
            // A quota refusal is counted by quota; a store failure fails the request.
            Ok(Admitted::Refused(_)) | Err(_) => None,
        };
        if let Some(result) = result {
            self.inner.metrics.hold(result);
        }
        admitted
    }

    async fn decide(
        &self,
        quotas: &Quotas,
        admission: TurnAdmission<'_>,
    ) -> Result<Admitted, StoreError> {
        let inner = &self.inner;
        let acquired_at = Instant::now();
        let periods = Periods::now();
        let keys = LevelKeys::team(admission.team, &periods);
        let user_keys = admission
            .user
            .map(|user| LevelKeys::user(admission.team, user, &periods));
        let hold = hold_key(admission.team, admission.agent);
        let value = inner.value(admission.turn);
        let expiry = inner.config.ttl.min(inner.config.max_total);
        let mut limits: Option<LoadedLimits> = None;
        // At most: reload the limits, rebuild the team's and the user's counters, then
        // decide.
        for _ in 0..4 {
            let call = || {
                let mut invocation = inner.admit.prepare_invoke();
                invocation
                    .key(&hold)
                    .key(&keys.limits)
                    .key(&keys.running)
                    .key(&keys.reserved)
                    .key(&keys.reserved_total)
                    .key(&keys.starts)
                    .key(&keys.day)
                    .key(&keys.month)
                    .arg(&value)
                    .arg(millis(expiry))
                    .arg(admission.turn.to_string())
                    .arg(admission.reservation)
                    .arg(if limits.is_some() { "1" } else { "" })
                    .arg(millis(LIMITS_TTL));
                let loaded = limits.as_ref();
                let settings = loaded.map(|l| l.settings).unwrap_or_default();
                for value in turn_limit_args(&settings.limits) {
                    invocation.arg(value);
                }
                invocation.arg(millis(inner.config.max_total * 2));
                for value in turn_limit_args(&settings.per_user) {
                    invocation.arg(value);
                }
                invocation.arg(if settings.users_overridden { "1" } else { "" });
                let overrides = loaded.and_then(|l| l.user.as_ref());
                for field in TURN_FIELDS {
                    invocation.arg(override_arg(overrides, field));
                }
                if let Some(user) = &user_keys {
                    invocation
                        .key(&user.limits)
                        .key(&user.running)
                        .key(&user.reserved)
                        .key(&user.reserved_total)
                        .key(&user.starts)
                        .key(&user.day)
                        .key(&user.month);
                }
                invocation
            };
            let answer = bounded(inner.config.op_timeout, async {
                let mut conn = inner.redis.get().await?;
                match call().invoke_async::<Vec<String>>(&mut conn).await {
                    Err(err) if err.is_io_error() => {
                        let mut conn = inner.redis.get().await?;
                        call().invoke_async::<Vec<String>>(&mut conn).await
                    }
                    answer => answer,
                }
            })
            .await
            .map_err(|u| u.0);
            let answer = match answer {
                Ok(answer) => answer,
                Err(class) => {
                    if class != "connection_refused" {
                        spawn_release(inner.clone(), hold, value, None);
                    }
                    inner.metrics.hold_unavailable.inc();
                    tracing::warn!(
                        agent = %admission.agent,
                        turn = %admission.turn,
                        class,
                        "turn hold and quota counters unavailable; enforcing from Postgres"
                    );
                    return Ok(Admitted::Unavailable);
                }
            };
            let counted = || Counted {
                team: admission.team,
                turn: admission.turn,
                user: admission.user.map(str::to_owned),
            };
            match answer.first().map(String::as_str) {
                Some("busy") => {
                    let current = answer.get(1).map(String::as_str).unwrap_or_default();
                    if current == value {
                        // The first try landed but its answer was lost: held and counted.
                        let guard =
                            HoldGuard::start(inner, hold, value, acquired_at, Some(counted()));
                        let limits = quotas.limits(admission.team).await?;
                        let user = match admission.user {
                            Some(user) => Some(quotas.user_limits(admission.team, user).await?),
                            None => None,
                        };
                        let level = |limits: &Limits| Standing {
                            limits: turn_limits(limits),
                            counts: TurnCounts::default(),
                        };
                        return Ok(Admitted::Held {
                            guard,
                            levels: Box::new(Levels {
                                team: level(&limits),
                                user: user
                                    .filter(|u| u.limits.limits_turns())
                                    .map(|u| level(&u.limits)),
                            }),
                        });
                    }
                    return match running_turn(current) {
                        Some(running) => Ok(Admitted::Busy {
                            running,
                            holder: Holder::parse(current),
                        }),
                        None => Ok(Admitted::Unavailable),
                    };
                }
                Some("limits") => {
                    let settings = quotas.settings(admission.team).await?;
                    let user = match admission.user {
                        Some(user) => {
                            Some(quotas.user_limits(admission.team, user).await?.overrides)
                        }
                        None => None,
                    };
                    limits = Some(LoadedLimits { settings, user });
                }
                Some("rebuild") => {
                    let user = match answer.get(1).map(String::as_str) {
                        Some("user") => admission.user,
                        _ => None,
                    };
                    // Nothing was taken yet: the script answers this before the hold.
                    if let Err(class) = inner
                        .rebuild(quotas, admission.team, user, &periods)
                        .await?
                    {
                        inner.metrics.hold_unavailable.inc();
                        tracing::warn!(
                            agent = %admission.agent,
                            turn = %admission.turn,
                            class,
                            "quota counters could not be rebuilt; enforcing from Postgres"
                        );
                        return Ok(Admitted::Unavailable);
                    }
                }
                Some("ok") if answer.len() == 1 => {
                    let guard = HoldGuard::start(inner, hold, value, acquired_at, None);
                    return Ok(Admitted::Held {
                        guard,
                        levels: Box::default(),
                    });
                }
                Some("ok") => {
                    let levels = Box::new(parse_levels(&answer[1..]));
                    let guard = HoldGuard::start(inner, hold, value, acquired_at, Some(counted()));
                    return Ok(Admitted::Held { guard, levels });
                }
                Some("refused") => {
                    return Ok(Admitted::Refused(refusal(&answer[1..], &periods)));
                }
                _ => break,
            }
        }
        tracing::error!(turn = %admission.turn, "the admission script gave no decision");
        Ok(Admitted::Unavailable)
    }
}

/// The refusal the admission script answered (level, field, then the standings), as
/// `quota::fallback::decide_levels` words it.
fn refusal(answer: &[String], periods: &Periods) -> Refusal {
    let scope = answer.first().map(String::as_str).unwrap_or_default();
    let field = answer.get(1).map(String::as_str).unwrap_or_default();
    let levels = parse_levels(answer.get(2..).unwrap_or_default());
    if let Some(refusal) = crate::quota::fallback::decide_levels(&levels, periods)
        .filter(|r| r.field.name() == field && r.scope.as_str() == scope)
    {
        return refusal;
    }
    // The script and `decide_levels` disagree: a bug, but refusing is the safe side.
    tracing::error!(
        field,
        scope,
        "quota script refused for a reason decide_levels() does not see"
    );
    Refusal {
        scope: QuotaScope::Team,
        field: Field::ConcurrentTurns,
        limit: levels.team.limits.concurrent_turns.unwrap_or_default(),
        retry_after: Duration::from_secs(1),
        headers: RateLimitHeaders::levels(&levels, periods),
    }
}

/// The turn limits as the admission script stores them.
fn turn_limits(limits: &Limits) -> Limits {
    Limits {
        tokens_per_day: limits.tokens_per_day,
        tokens_per_month: limits.tokens_per_month,
        turns_per_minute: limits.turns_per_minute,
        concurrent_turns: limits.concurrent_turns,
        ..Limits::default()
    }
}

/// The turn limits in the order the admission script takes and answers them.
const TURN_FIELDS: [Field; 4] = [
    Field::TokensPerDay,
    Field::TokensPerMonth,
    Field::TurnsPerMinute,
    Field::ConcurrentTurns,
];

/// A level's turn limits as script arguments: a count, or empty for unlimited.
fn turn_limit_args(limits: &Limits) -> [String; 4] {
    TURN_FIELDS.map(|f| limits.get(f).map(|v| v.to_string()).unwrap_or_default())
}

/// A user's override of one turn limit as a script argument: a count, empty for
/// unlimited, `-` for none (the team's `per_user` applies).
fn override_arg(overrides: Option<&serde_json::Value>, field: Field) -> String {
    match overrides.and_then(|o| o.get(field.name())) {
        Some(serde_json::Value::Null) => String::new(),
        Some(v) if v.is_u64() => v.to_string(),
        _ => "-".to_owned(),
    }
}

/// What `Holds::admit` read from Postgres when the script asked for the limits.
struct LoadedLimits {
    settings: crate::quota::TeamSettings,
    /// The user's stored overrides, for an end user's turn.
    user: Option<serde_json::Value>,
}

/// The standings at the end of an `ADMIT` answer: the team's, then the user's if there.
fn parse_levels(fields: &[String]) -> Levels {
    Levels {
        team: parse_standing(fields),
        user: (fields.len() >= 18).then(|| parse_standing(&fields[9..])),
    }
}

/// One level's counts and limits in an `ADMIT` answer.
fn parse_standing(fields: &[String]) -> Standing {
    let n = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    Standing {
        counts: TurnCounts {
            concurrent_turns: n(0).unwrap_or_default(),
            turns_in_window: n(1).unwrap_or_default(),
            window_reset: Duration::from_millis(n(2).unwrap_or_default()),
            tokens_day: n(3).unwrap_or_default(),
            tokens_month: n(4).unwrap_or_default(),
        },
        limits: Limits {
            tokens_per_day: n(5),
            tokens_per_month: n(6),
            turns_per_minute: n(7),
            concurrent_turns: n(8),
            ..Limits::default()
        },
    }
}

/// The counter keys of one level: the team's (`quota:{<team>}:…`, the braces literal: the
/// hash tag) or one of its end users' (`quota:{<team>}:user:<bytes>:<user>:…`; the user id's length keeps one user's keys from
/// reading as another's, whatever its characters). The budget counters are those of the
/// UTC day and month of `periods`.
struct LevelKeys {
    /// The team's limits, or the user's overrides.
    limits: String,
    running: String,
    reserved: String,
    reserved_total: String,
    starts: String,
    day: String,
    month: String,
    /// The cutoff each counter was rebuilt at (`REBUILD`).
    day_since: String,
    month_since: String,
    /// The ledger of settled turns: when each was billed, and its tokens.
    settled: String,
    settled_tokens: String,
}

impl LevelKeys {
    fn team(team: TeamId, periods: &Periods) -> Self {
        Self::new(format!("quota:{{{team}}}:"), periods)
    }

    fn user(team: TeamId, user: &str, periods: &Periods) -> Self {
        Self::new(
            format!("quota:{{{team}}}:user:{}:{user}:", user.len()),
            periods,
        )
    }

    fn of(team: TeamId, user: Option<&str>, periods: &Periods) -> Self {
        match user {
            Some(user) => Self::user(team, user, periods),
            None => Self::team(team, periods),
        }
    }

    fn new(prefix: String, periods: &Periods) -> Self {
        let key = |name: &str| format!("{prefix}{name}");
        let day = key(&format!("tokens:day:{}", periods.day_tag()));
        let month = key(&format!("tokens:month:{}", periods.month_tag()));
        Self {
            limits: key("limits"),
            running: key("running"),
            reserved: key("reserved"),
            reserved_total: key("reserved_total"),
            starts: key("starts"),
            day_since: format!("{day}:since"),
            month_since: format!("{month}:since"),
            day,
            month,
            settled: key("settled"),
            settled_tokens: key("settled_tokens"),
        }
    }
}

impl Holds {
    /// Counts `tokens` a turn's background work billed after its hold was released (the
    /// summary fold, M1) in the team's budgets, and its end `user`'s: counted, though not
    /// reserved beforehand. Best effort: a counter that misses them is rebuilt from billing
    /// events within the hour.
    pub async fn bill(&self, team: TeamId, user: Option<&str>, tokens: u64) {
        let inner = &self.inner;
        let periods = Periods::now();
        let keys = LevelKeys::team(team, &periods);
        let user = user.map(|user| LevelKeys::user(team, user, &periods));
        let billed = bounded(inner.config.op_timeout, async {
            let mut conn = inner.redis.get().await?;
            let mut invocation = inner.bill.prepare_invoke();
            invocation.key(&keys.day).key(&keys.month).arg(tokens);
            if let Some(user) = &user {
                invocation.key(&user.day).key(&user.month);
            }
            invocation.invoke_async::<i64>(&mut conn).await
        })
        .await
        .map_err(|u| u.0);
        if let Err(class) = billed {
            tracing::warn!(team = %team, class, "summary tokens not counted in the quota counters");
        }
    }

    /// Forgets the team's stored limits and budget counters, so the next turn reloads the
    /// limits and rebuilds the counters from Postgres (after `PUT /v1/quotas`). Bounded; if
    /// Redis cannot be reached the limits it holds lapse within `LIMITS_TTL` anyway.
    pub async fn forget_limits(&self, team: TeamId) -> Result<(), Class> {
        self.forget(LevelKeys::team(team, &Periods::now()), None)
            .await
    }

    /// Forgets one user's stored overrides and budget counters (L4), and the team's stored
    /// limits (which say whether any user has overrides), so the next turn of the user
    /// reloads them and rebuilds its counters from Postgres (after
    /// `PUT`/`DELETE /v1/quotas/users/{user_id}`). Bounded like `forget_limits`.
    pub async fn forget_user(&self, team: TeamId, user: &str) -> Result<(), Class> {
        let periods = Periods::now();
        let team_limits = LevelKeys::team(team, &periods).limits;
        self.forget(LevelKeys::user(team, user, &periods), Some(&team_limits))
            .await
    }

    async fn forget(&self, keys: LevelKeys, also: Option<&str>) -> Result<(), Class> {
        let inner = &self.inner;
        bounded(inner.config.op_timeout, async {
            let mut conn = inner.redis.get().await?;
            redis::cmd("DEL")
                .arg(&keys.limits)
                .arg(&keys.day)
                .arg(&keys.month)
                .arg(&keys.day_since)
                .arg(&keys.month_since)
                .arg(also)
                .query_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|_| ())
    }
}

impl Inner {
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

    /// The `ACQUIRE` script: `None` if the hold is now ours, else the current value.
    async fn try_acquire(
        &self,
        key: &str,
        value: &str,
        expiry: Duration,
    ) -> Result<Option<String>, RedisError> {
        let mut conn = self.redis.get().await?;
        self.acquire
            .key(key)
            .arg(value)
            .arg(millis(expiry))
            .invoke_async(&mut conn)
            .await
    }

    /// Runs a compare-and-act script (`EXTEND` or `RELEASE`): true if the value was ours.
    async fn if_ours(
        &self,
        script: &redis::Script,
        key: &str,
        value: &str,
        arg: u64,
    ) -> Result<bool, Class> {
        bounded(self.config.op_timeout, async {
            let mut conn = self.redis.get().await?;
            script
                .key(key)
                .arg(value)
                .arg(arg)
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|n| n == 1)
    }

    /// Compare-and-delete (with the settlement of a counted turn), tried again when Redis
    /// is slow (a burst of turn ends) or reconnecting: until it lands, the agent answers
    /// `agent_busy` for up to the hold's ttl. Trying again is safe: a delete that did land
    /// leaves nothing ours, and a settlement that did land adds nothing twice.
    async fn release(&self, key: &str, value: &str, counted: Option<&Counted>, billed: Billed) {
        let mut pause = Duration::from_millis(50);
        for attempt in 1..=RELEASE_TRIES {
            let released = match counted {
                None => self.if_ours(&self.release, key, value, 0).await,
                Some(counted) => self.settle(key, value, counted, billed).await,
            };
            match released {
                Ok(true) => return,
                Ok(false) => {
                    tracing::debug!(key, "turn hold already gone or taken over");
                    return;
                }
                Err(_) if attempt < RELEASE_TRIES => {
                    tokio::time::sleep(pause).await;
                    pause *= 4;
                }
                Err(class) => tracing::warn!(
                    turn = turn_of(value),
                    class,
                    "could not release turn hold; it will expire"
                ),
            }
        }
    }

    async fn settle(
        &self,
        key: &str,
        value: &str,
        counted: &Counted,
        billed: Billed,
    ) -> Result<bool, Class> {
        let periods = Periods::now();
        let mut levels = vec![LevelKeys::team(counted.team, &periods)];
        if let Some(user) = &counted.user {
            levels.push(LevelKeys::user(counted.team, user, &periods));
        }
        let at = billed
            .at
            .map(|at| at.timestamp_millis().to_string())
            .unwrap_or_default();
        bounded(self.config.op_timeout, async {
            let mut conn = self.redis.get().await?;
            let mut invocation = self.settle.prepare_invoke();
            invocation.key(key);
            for keys in &levels {
                invocation
                    .key(&keys.running)
                    .key(&keys.reserved)
                    .key(&keys.reserved_total)
                    .key(&keys.day)
                    .key(&keys.month)
                    .key(&keys.settled)
                    .key(&keys.settled_tokens)
                    .key(&keys.day_since)
                    .key(&keys.month_since)
                    .key(&keys.starts);
            }
            invocation
                .arg(value)
                .arg(counted.turn.to_string())
                .arg(billed.tokens)
                .arg(&at)
                .arg(millis(LEDGER_KEEP))
                .arg(if billed.unstarted { "1" } else { "0" })
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|n| n == 1)
    }

    /// Sets the missing budget counters of the team, or of its end `user`, from billing
    /// events (`REBUILD`). A Postgres failure is the caller's error (quotas are never
    /// skipped); a Redis one its class.
    async fn rebuild(
        &self,
        quotas: &Quotas,
        team: TeamId,
        user: Option<&str>,
        periods: &Periods,
    ) -> Result<Result<(), Class>, StoreError> {
        let base = quotas
            .billed_tokens(team, user, periods, REBUILD_MARGIN)
            .await?;
        let keys = LevelKeys::of(team, user, periods);
        let from = |start: chrono::DateTime<chrono::Utc>| {
            base.cutoff.max(start).timestamp_millis().to_string()
        };
        Ok(bounded(self.config.op_timeout, async {
            let mut conn = self.redis.get().await?;
            self.rebuild
                .key(&keys.day)
                .key(&keys.month)
                .key(&keys.day_since)
                .key(&keys.month_since)
                .key(&keys.settled)
                .key(&keys.settled_tokens)
                .arg(base.tokens_day)
                .arg(base.tokens_month)
                .arg(base.cutoff.timestamp_millis())
                .arg(from(periods.day_start))
                .arg(from(periods.month_start))
                .arg(COUNTER_TTL.as_secs())
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|_| ()))
    }

    async fn extend(
        &self,
        key: &str,
        value: &str,
        counted: Option<&Counted>,
        expiry: u64,
    ) -> Result<bool, Class> {
        let Some(counted) = counted else {
            return self.if_ours(&self.extend, key, value, expiry).await;
        };
        let periods = Periods::now();
        let team = LevelKeys::team(counted.team, &periods).running;
        let user = (counted.user.as_deref()).map(|u| LevelKeys::user(counted.team, u, &periods));
        bounded(self.config.op_timeout, async {
            let mut conn = self.redis.get().await?;
            let mut invocation = self.extend_counted.prepare_invoke();
            invocation.key(key).key(&team);
            if let Some(user) = &user {
                invocation.key(&user.running);
            }
            invocation
                .arg(value)
                .arg(expiry)
                .arg(counted.turn.to_string())
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|n| n == 1)
    }
}

/// The running turn's hold. Release it when the turn ends; dropping it also releases, in
/// the background.
pub struct HoldGuard {
    /// `None` once released.
    held: Option<Held>,
}

struct Held {
    inner: Arc<Inner>,
    key: String,
    value: String,
    /// Set when the team's quota counters count this turn.
    counted: Option<Counted>,
    /// Stops the extension task.
    stop: CancellationToken,
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

impl HoldGuard {
    fn start(
        inner: &Arc<Inner>,
        key: String,
        value: String,
        acquired_at: Instant,
        counted: Option<Counted>,
    ) -> Self {
        let stop = CancellationToken::new();
        tokio::spawn(extend_until_stopped(
            inner.clone(),
            key.clone(),
            value.clone(),
            counted.clone(),
            acquired_at,
            stop.clone(),
        ));
        Self {
            held: Some(Held {
                inner: inner.clone(),
                key,
                value,
                counted,
                stop,
            }),
        }
    }

    /// Stops extending and deletes the hold if it is still ours (compare-and-delete), so a
    /// turn that outlived its hold never frees another turn's.
    pub async fn release(self) {
        self.release_billed(Billed::default()).await;
    }

    /// Stops extending the hold without releasing it: the turn moved to another replica
    /// (D3), which holds the agent (and settles the turn's reservation) now.
    pub fn abandon(mut self) {
        if let Some(held) = self.held.take() {
            held.stop.cancel();
        }
    }

    /// `release`, settling a counted turn's reservations on what it `billed`.
    pub async fn release_billed(mut self, billed: Billed) {
        if let Some(held) = self.held.take() {
            held.stop.cancel();
            held.inner
                .release(&held.key, &held.value, held.counted.as_ref(), billed)
                .await;
        }
    }

    /// Reserves a further model call's tokens against the budgets of `team` and, when the
    /// turn counts at its end user's level, of `user`. A turn the counters do not count (a
    /// team without turn limits) has nothing to reserve.
    pub async fn reserve(
        &self,
        quotas: &Quotas,
        team: &Limits,
        user: Option<&Limits>,
        reservation: u64,
    ) -> Result<Reserved, StoreError> {
        let Some(held) = &self.held else {
            return Ok(Reserved::Ok);
        };
        let Some(counted) = &held.counted else {
            return Ok(Reserved::Ok);
        };
        let budgeted = |l: &Limits| l.tokens_per_day.is_some() || l.tokens_per_month.is_some();
        let user = counted
            .user
            .as_deref()
            .zip(user)
            .filter(|(_, limits)| budgeted(limits));
        if !budgeted(team) && user.is_none() {
            return Ok(Reserved::Ok);
        }
        let inner = &held.inner;
        let periods = Periods::now();
        let mut levels = vec![(LevelKeys::team(counted.team, &periods), team)];
        if let Some((name, limits)) = user {
            levels.push((LevelKeys::user(counted.team, name, &periods), limits));
        }
        let limit = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        for _ in 0..3 {
            let answer = bounded(inner.config.op_timeout, async {
                let mut conn = inner.redis.get().await?;
                let mut invocation = inner.reserve.prepare_invoke();
                invocation.arg(counted.turn.to_string()).arg(reservation);
                for (keys, limits) in &levels {
                    invocation
                        .key(&keys.reserved)
                        .key(&keys.reserved_total)
                        .key(&keys.day)
                        .key(&keys.month)
                        .arg(limit(limits.tokens_per_day))
                        .arg(limit(limits.tokens_per_month));
                }
                invocation.invoke_async::<Vec<String>>(&mut conn).await
            })
            .await
            .map_err(|u| u.0);
            let answer = match answer {
                Ok(answer) => answer,
                Err(class) => {
                    tracing::warn!(turn = %counted.turn, class, "quota counters unavailable mid-turn");
                    return Ok(Reserved::Unavailable);
                }
            };
            let n = |i: usize| {
                answer
                    .get(i)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or_default()
            };
            let at_user = answer.get(1).is_some_and(|l| l == "user");
            match answer.first().map(String::as_str) {
                Some("ok") => return Ok(Reserved::Ok),
                Some("rebuild") => {
                    let user = at_user.then_some(counted.user.as_deref()).flatten();
                    if let Err(class) = inner.rebuild(quotas, counted.team, user, &periods).await? {
                        tracing::warn!(turn = %counted.turn, class, "quota counters unavailable mid-turn");
                        return Ok(Reserved::Unavailable);
                    }
                }
                Some("refused") => {
                    let counts = TurnCounts {
                        tokens_day: n(3),
                        tokens_month: n(4),
                        ..TurnCounts::default()
                    };
                    let limits = if at_user {
                        levels[levels.len() - 1].1
                    } else {
                        team
                    };
                    let budgets = Limits {
                        tokens_per_day: limits.tokens_per_day,
                        tokens_per_month: limits.tokens_per_month,
                        ..Limits::default()
                    };
                    if let Some(mut refusal) =
                        crate::quota::fallback::decide(&budgets, &counts, &periods)
                    {
                        if at_user {
                            refusal.scope = QuotaScope::User;
                        }
                        return Ok(Reserved::Refused(refusal));
                    }
                    return Ok(Reserved::Ok);
                }
                _ => break,
            }
        }
        Ok(Reserved::Unavailable)
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            held.stop.cancel();
            spawn_release(held.inner, held.key, held.value, held.counted);
        }
    }
}

impl fmt::Debug for HoldGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token stays out of logs: only the turn id is shown.
        let turn = self.held.as_ref().map(|held| turn_of(&held.value));
        f.debug_struct("HoldGuard").field("turn", &turn).finish()
    }
}

/// Best-effort release in the background; without a runtime the hold simply expires.
fn spawn_release(inner: Arc<Inner>, key: String, value: String, counted: Option<Counted>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            inner
                .release(&key, &value, counted.as_ref(), Billed::default())
                .await
        });
    }
}

/// Pushes the expiry back every `extend_every` until stopped, the hold is lost, or
/// `max_total` since acquisition is reached; the hold then expires on its own.
async fn extend_until_stopped(
    inner: Arc<Inner>,
    key: String,
    value: String,
    counted: Option<Counted>,
    acquired_at: Instant,
    stop: CancellationToken,
) {
    let deadline = acquired_at + inner.config.max_total;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(inner.config.extend_every) => {}
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return;
        }
        // Never past `max_total`: the last extension only reaches the deadline.
        let expiry = inner.config.ttl.min(remaining);
        match inner
            .extend(&key, &value, counted.as_ref(), millis(expiry))
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    turn = turn_of(&value),
                    "turn hold lost; no longer extending it"
                );
                return;
            }
            // Transient: the next tick tries again while the hold has not expired.
            Err(class) => {
                tracing::warn!(turn = turn_of(&value), class, "could not extend turn hold")
            }
        }
    }
}

fn hold_key(team: TeamId, agent: AgentId) -> String {
    format!("hold:{{{team}}}:agent:{agent}")
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
