//! One turn per agent (SPEC T9): a Redis hold taken before a turn starts.
//!
//! The hold is the key `hold:agent:{agent_id}`, set with `NX` and a short expiry; its value
//! is `{turn_id}:{token}`, so a refused caller learns which turn is running and only the
//! holder (who alone knows the random token) can extend or delete it, besides a survivor
//! freeing the hold of a turn whose replica died (`release_lost`, by the turn id). While
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
//! The team's counters (keys `quota:{team}:…`) are: the limits (a hash that expires, so
//! a replica reloads them from Postgres every minute), the running turns (a sorted set
//! scored by when each one's hold lapses, so a dead replica's turns leave it on their
//! own), their reservations (a hash and its total), the turn starts of the last minute
//! (a sorted set), and the billed tokens of the UTC day and month (rebuilt from Postgres'
//! billing events when missing, and every hour, so drift heals). A turn's billed tokens
//! are added once, keyed by the turn, through a short ledger of settled turns: whether
//! or not its reservation was reaped meanwhile, and whichever of its settlement and a
//! rebuild of the counters comes first (`SETTLE`, `REBUILD`).
//!
//! Architecture invariant: only this module knows the hold's and the counters' key names
//! and value formats.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use protocol::{AgentId, TeamId, TurnId};
use redis::RedisError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::{HoldResult, Metrics};
use crate::quota::{Field, Limits, Periods, Quotas, RateLimitHeaders, Refusal, TurnCounts};
use crate::redis::{Shared, bounded};
use crate::store::StoreError;

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

/// The quota-aware `ACQUIRE` (see the module doc for the keys). Answers `{"busy", value}`,
/// `{"limits"}` (none stored: the next call carries them, `ARGV[5]` = `1`, `ARGV[7..10]`),
/// `{"rebuild"}` (a budget counter is missing: `REBUILD` it, then call again),
/// `{"refused", field, counts…, limits…}`, `{"ok"}` (the
/// team has no turn limit) or `{"ok", counts…, limits…}`, where counts are the running
/// turns, the turns of the last minute, ms until the oldest of them leaves the window,
/// and billed + reserved tokens of the day and month, as the turn leaves them, and limits
/// the four turn limits as stored (empty for unlimited). The refusal rule is
/// `quota::fallback::decide`'s, in the same order.
const ADMIT: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then return {'busy', cur} end
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[2], 'set', '1', 'tpd', ARGV[7], 'tpmo', ARGV[8], 'tpm', ARGV[9], 'ct', ARGV[10])
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
end
local lim = redis.call('HMGET', KEYS[2], 'set', 'tpd', 'tpmo', 'tpm', 'ct')
if not lim[1] then return {'limits'} end
local function num(v) if not v or v == '' then return nil end return tonumber(v) end
local tpd, tpmo, tpm, ct = num(lim[2]), num(lim[3]), num(lim[4]), num(lim[5])
if not (tpd or tpmo or tpm or ct) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {'ok'}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, m in ipairs(gone) do
  local r = redis.call('HGET', KEYS[4], m)
  if r then
    redis.call('DECRBY', KEYS[5], r)
    redis.call('HDEL', KEYS[4], m)
  end
end
if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now) end
local running = redis.call('ZCARD', KEYS[3])
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now - 60000)
local recent = redis.call('ZCARD', KEYS[6])
local reset = 0
if recent > 0 then
  local oldest = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
  reset = tonumber(oldest[2]) + 60000 - now
end
local day, month = 0, 0
if tpd or tpmo then
  local d, m = redis.call('GET', KEYS[7]), redis.call('GET', KEYS[8])
  if (tpd and not d) or (tpmo and not m) then return {'rebuild'} end
  local resv = tonumber(redis.call('GET', KEYS[5]) or '0')
  day = tonumber(d or '0') + resv
  month = tonumber(m or '0') + resv
end
local function answer(head, field)
  local a = {head}
  if field then a[#a + 1] = field end
  for _, v in ipairs({running, recent, reset, day, month}) do
    a[#a + 1] = string.format('%.0f', v)
  end
  for i = 2, 5 do a[#a + 1] = lim[i] or '' end
  return a
end
if ct and running >= ct then return answer('refused', 'concurrent_turns') end
if tpm and recent >= tpm then return answer('refused', 'turns_per_minute') end
if tpd and day >= tpd then return answer('refused', 'tokens_per_day') end
if tpmo and month >= tpmo then return answer('refused', 'tokens_per_month') end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local r = tonumber(ARGV[4])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[3])
redis.call('HSET', KEYS[4], ARGV[3], r)
redis.call('INCRBY', KEYS[5], r)
redis.call('ZADD', KEYS[6], now, ARGV[3])
for i = 3, 5 do redis.call('PEXPIRE', KEYS[i], ARGV[11]) end
redis.call('PEXPIRE', KEYS[6], 61000)
running, recent, day, month = running + 1, recent + 1, day + r, month + r
if reset == 0 then reset = 60000 end
return answer('ok')
";

/// A further model call of an admitted turn (`ARGV[1]`) reserves its estimate (`ARGV[2]`)
/// against the budgets `ARGV[3]`/`ARGV[4]` (day, month; empty for none). Keys: the
/// reservations, their total, the day's and the month's counters. Answers `{"rebuild"}`
/// (as `ADMIT`'s),
/// `{"refused", field, day, month}` or `{"ok", day, month}`. A turn that is not running
/// in the counters (its entry lapsed) reserves nothing and is let through: it was admitted.
const RESERVE: &str = r"
local function num(v) if not v or v == '' then return nil end return tonumber(v) end
local tpd, tpmo = num(ARGV[3]), num(ARGV[4])
local d, m = redis.call('GET', KEYS[3]), redis.call('GET', KEYS[4])
if (tpd and not d) or (tpmo and not m) then return {'rebuild'} end
local resv = tonumber(redis.call('GET', KEYS[2]) or '0')
local day, month = tonumber(d or '0') + resv, tonumber(m or '0') + resv
local function f(v) return string.format('%.0f', v) end
if tpd and day >= tpd then return {'refused', 'tokens_per_day', f(day), f(month)} end
if tpmo and month >= tpmo then return {'refused', 'tokens_per_month', f(day), f(month)} end
local r = tonumber(ARGV[2])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], r)
  redis.call('INCRBY', KEYS[2], r)
  day, month = day + r, month + r
end
return {'ok', f(day), f(month)}
";

/// `RELEASE` that also settles the turn's quota counters: it leaves the running set and
/// its reservation (if not reaped already) is returned. Its billed tokens `ARGV[3]`, billed
/// at `ARGV[4]` (ms, Postgres' clock; empty: unknown, Redis' now), go into the ledger of
/// settled turns (keys 7 and 8) once per turn, and with it into each day and month
/// counter that exists and was rebuilt from billing events before they were billed (its
/// `since`, keys 9 and 10): a counter rebuilt later holds them already. A retried
/// settlement, or one of a turn whose reservation was reaped, adds nothing twice and
/// loses nothing. `ARGV[5]`: how long the ledger keeps a turn (ms). 1 if the hold was ours.
const SETTLE: &str = r"
local ours = redis.call('GET', KEYS[1]) == ARGV[1]
if ours then redis.call('DEL', KEYS[1]) end
redis.call('ZREM', KEYS[2], ARGV[2])
local r = redis.call('HGET', KEYS[3], ARGV[2])
if r then
  redis.call('HDEL', KEYS[3], ARGV[2])
  redis.call('DECRBY', KEYS[4], r)
end
local b = tonumber(ARGV[3])
if b > 0 then
  local at = tonumber(ARGV[4])
  if not at then
    local t = redis.call('TIME')
    at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  if redis.call('ZADD', KEYS[7], 'NX', at, ARGV[2]) == 1 then
    redis.call('HSET', KEYS[8], ARGV[2], b)
    for i = 5, 6 do
      if redis.call('EXISTS', KEYS[i]) == 1
        and at >= tonumber(redis.call('GET', KEYS[i + 4]) or '0') then
        redis.call('INCRBY', KEYS[i], b)
      end
    end
    local keep = tonumber(ARGV[5])
    local old = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', at - keep)
    if #old > 0 then
      redis.call('HDEL', KEYS[8], unpack(old))
      redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', at - keep)
    end
    redis.call('PEXPIRE', KEYS[7], keep)
    redis.call('PEXPIRE', KEYS[8], keep)
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
/// and the month's counters that exist.
const BILL: &str = r"
for i = 1, 2 do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBY', KEYS[i], ARGV[1]) end
end
return 1
";

/// `EXTEND` that also pushes the turn's running entry back, so a live turn stays counted.
const EXTEND_COUNTED: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[2], 'XX', now + tonumber(ARGV[2]), ARGV[3])
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
pub struct TurnAdmission {
    pub team: TeamId,
    pub agent: AgentId,
    pub turn: TurnId,
    /// The first call's input estimate plus its output cap.
    pub reservation: u64,
}

/// The answer to `Holds::admit`.
#[derive(Debug)]
pub enum Admitted {
    /// The agent is ours and the team's quotas let the turn start; `limits` are the turn
    /// limits Redis enforces (all `None` for a team without any) and `counts` what the
    /// turn leaves of them.
    Held {
        guard: HoldGuard,
        limits: Limits,
        counts: TurnCounts,
    },
    Busy {
        running: TurnId,
    },
    /// A team quota refuses the turn; nothing was taken or counted.
    Refused(Refusal),
    /// Redis unreachable or slow: the caller enforces quotas from Postgres instead.
    Unavailable,
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
    pub fn new(redis: redis::Client, config: HoldConfig, metrics: Metrics) -> Self {
        Self {
            inner: Arc::new(Inner {
                redis: Shared::new(redis, config.op_timeout),
                config,
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
    pub async fn acquire(&self, agent: AgentId, turn: TurnId) -> Acquired {
        let inner = &self.inner;
        let acquired_at = Instant::now();
        let key = hold_key(agent);
        let value = format!("{turn}:{:032x}", rand::random::<u128>());
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
    pub async fn release_lost(&self, agent: AgentId, turn: TurnId) -> Result<bool, Class> {
        let inner = &self.inner;
        bounded(inner.config.op_timeout, async {
            let mut conn = inner.redis.get().await?;
            inner
                .release_turn
                .key(hold_key(agent))
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
    /// D3: holds `agent` on for `turn`, taken over from a dead replica, with a token of
    /// this replica's; `counted` when the team's counters count the turn (its release then
    /// settles its reservation). `Ok(None)`: another turn holds the agent (the dead turn's
    /// hold lapsed and a new turn started meanwhile).
    pub async fn adopt(
        &self,
        team: TeamId,
        agent: AgentId,
        turn: TurnId,
        counted: bool,
    ) -> Result<Option<HoldGuard>, Class> {
        let inner = &self.inner;
        let acquired_at = Instant::now();
        let key = hold_key(agent);
        let value = format!("{turn}:{:032x}", rand::random::<u128>());
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
        let counted = counted.then_some(Counted { team, turn });
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
        admission: TurnAdmission,
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
        admission: TurnAdmission,
    ) -> Result<Admitted, StoreError> {
        let inner = &self.inner;
        let acquired_at = Instant::now();
        let periods = Periods::now();
        let keys = TeamKeys::new(admission.team, &periods);
        let hold = hold_key(admission.agent);
        let value = format!("{}:{:032x}", admission.turn, rand::random::<u128>());
        let expiry = inner.config.ttl.min(inner.config.max_total);
        let mut limits: Option<Limits> = None;
        // At most: reload the limits, rebuild the counters, then decide.
        for _ in 0..3 {
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
                let l = limits.unwrap_or_default();
                for field in [
                    l.tokens_per_day,
                    l.tokens_per_month,
                    l.turns_per_minute,
                    l.concurrent_turns,
                ] {
                    invocation.arg(field.map(|v| v.to_string()).unwrap_or_default());
                }
                invocation.arg(millis(inner.config.max_total * 2));
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
            };
            match answer.first().map(String::as_str) {
                Some("busy") => {
                    let current = answer.get(1).map(String::as_str).unwrap_or_default();
                    if current == value {
                        // The first try landed but its answer was lost: held and counted.
                        let guard =
                            HoldGuard::start(inner, hold, value, acquired_at, Some(counted()));
                        let limits = quotas.limits(admission.team).await?;
                        return Ok(Admitted::Held {
                            guard,
                            limits: turn_limits(&limits),
                            counts: TurnCounts::default(),
                        });
                    }
                    return match running_turn(current) {
                        Some(running) => Ok(Admitted::Busy { running }),
                        None => Ok(Admitted::Unavailable),
                    };
                }
                Some("limits") => limits = Some(quotas.limits(admission.team).await?),
                Some("rebuild") => {
                    // Nothing was taken yet: the script answers this before the hold.
                    if let Err(class) = inner.rebuild(quotas, admission.team, &periods).await? {
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
                        limits: Limits::default(),
                        counts: TurnCounts::default(),
                    });
                }
                Some("ok") => {
                    let (counts, limits) = parse_counts(&answer[1..]);
                    let guard = HoldGuard::start(inner, hold, value, acquired_at, Some(counted()));
                    return Ok(Admitted::Held {
                        guard,
                        limits,
                        counts,
                    });
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

/// The refusal the admission script answered (`field`, then the counts and limits), as
/// `quota::fallback::decide` words it.
fn refusal(answer: &[String], periods: &Periods) -> Refusal {
    let field = answer.first().map(String::as_str).unwrap_or_default();
    let (counts, limits) = parse_counts(answer.get(1..).unwrap_or_default());
    if let Some(refusal) = crate::quota::fallback::decide(&limits, &counts, periods)
        .filter(|r| r.field.name() == field)
    {
        return refusal;
    }
    // The script and `decide` disagree: a bug, but refusing is the safe side.
    tracing::error!(
        field,
        "quota script refused for a reason decide() does not see"
    );
    Refusal {
        field: Field::ConcurrentTurns,
        limit: limits.concurrent_turns.unwrap_or_default(),
        retry_after: Duration::from_secs(1),
        headers: RateLimitHeaders::turns(&limits, &counts, periods),
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

/// The counts and limits at the end of an `ADMIT` answer.
fn parse_counts(fields: &[String]) -> (TurnCounts, Limits) {
    let n = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    let counts = TurnCounts {
        concurrent_turns: n(0).unwrap_or_default(),
        turns_in_window: n(1).unwrap_or_default(),
        window_reset: Duration::from_millis(n(2).unwrap_or_default()),
        tokens_day: n(3).unwrap_or_default(),
        tokens_month: n(4).unwrap_or_default(),
    };
    let limits = Limits {
        tokens_per_day: n(5),
        tokens_per_month: n(6),
        turns_per_minute: n(7),
        concurrent_turns: n(8),
        ..Limits::default()
    };
    (counts, limits)
}

/// The team's counter keys; the budget counters are those of the UTC day and month of
/// `periods`.
struct TeamKeys {
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

impl TeamKeys {
    fn new(team: TeamId, periods: &Periods) -> Self {
        let prefix = format!("quota:{team}:");
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
    /// summary fold, M1) in the team's budgets: counted, though not reserved beforehand.
    /// Best effort: a counter that misses them is rebuilt from billing events within the
    /// hour.
    pub async fn bill(&self, team: TeamId, tokens: u64) {
        let inner = &self.inner;
        let keys = TeamKeys::new(team, &Periods::now());
        let billed = bounded(inner.config.op_timeout, async {
            let mut conn = inner.redis.get().await?;
            inner
                .bill
                .key(&keys.day)
                .key(&keys.month)
                .arg(tokens)
                .invoke_async::<i64>(&mut conn)
                .await
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
        let inner = &self.inner;
        let keys = TeamKeys::new(team, &Periods::now());
        bounded(inner.config.op_timeout, async {
            let mut conn = inner.redis.get().await?;
            redis::cmd("DEL")
                .arg(&keys.limits)
                .arg(&keys.day)
                .arg(&keys.month)
                .arg(&keys.day_since)
                .arg(&keys.month_since)
                .query_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|_| ())
    }
}

impl Inner {
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
        let keys = TeamKeys::new(counted.team, &Periods::now());
        let at = billed
            .at
            .map(|at| at.timestamp_millis().to_string())
            .unwrap_or_default();
        bounded(self.config.op_timeout, async {
            let mut conn = self.redis.get().await?;
            self.settle
                .key(key)
                .key(&keys.running)
                .key(&keys.reserved)
                .key(&keys.reserved_total)
                .key(&keys.day)
                .key(&keys.month)
                .key(&keys.settled)
                .key(&keys.settled_tokens)
                .key(&keys.day_since)
                .key(&keys.month_since)
                .arg(value)
                .arg(counted.turn.to_string())
                .arg(billed.tokens)
                .arg(&at)
                .arg(millis(LEDGER_KEEP))
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|n| n == 1)
    }

    /// Sets the team's missing budget counters from billing events (`REBUILD`). A
    /// Postgres failure is the caller's error (quotas are never skipped); a Redis one its
    /// class.
    async fn rebuild(
        &self,
        quotas: &Quotas,
        team: TeamId,
        periods: &Periods,
    ) -> Result<Result<(), Class>, StoreError> {
        let base = quotas.billed_tokens(team, periods, REBUILD_MARGIN).await?;
        let keys = TeamKeys::new(team, periods);
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
        let keys = TeamKeys::new(counted.team, &Periods::now());
        bounded(self.config.op_timeout, async {
            let mut conn = self.redis.get().await?;
            self.extend_counted
                .key(key)
                .key(&keys.running)
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
}

/// A turn the team's quota counters count, settled at release.
#[derive(Clone, Copy, Debug)]
struct Counted {
    team: TeamId,
    turn: TurnId,
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
            counted,
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

    /// Reserves a further model call's tokens against the budgets in `limits`. A turn
    /// the counters do not count (a team without turn limits) has nothing to reserve.
    pub async fn reserve(
        &self,
        quotas: &Quotas,
        limits: &Limits,
        reservation: u64,
    ) -> Result<Reserved, StoreError> {
        let Some(held) = &self.held else {
            return Ok(Reserved::Ok);
        };
        let Some(counted) = held.counted else {
            return Ok(Reserved::Ok);
        };
        if limits.tokens_per_day.is_none() && limits.tokens_per_month.is_none() {
            return Ok(Reserved::Ok);
        }
        let inner = &held.inner;
        let periods = Periods::now();
        let keys = TeamKeys::new(counted.team, &periods);
        let limit = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        for _ in 0..2 {
            let answer = bounded(inner.config.op_timeout, async {
                let mut conn = inner.redis.get().await?;
                inner
                    .reserve
                    .key(&keys.reserved)
                    .key(&keys.reserved_total)
                    .key(&keys.day)
                    .key(&keys.month)
                    .arg(counted.turn.to_string())
                    .arg(reservation)
                    .arg(limit(limits.tokens_per_day))
                    .arg(limit(limits.tokens_per_month))
                    .invoke_async::<Vec<String>>(&mut conn)
                    .await
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
            match answer.first().map(String::as_str) {
                Some("ok") => return Ok(Reserved::Ok),
                Some("rebuild") => {
                    if let Err(class) = inner.rebuild(quotas, counted.team, &periods).await? {
                        tracing::warn!(turn = %counted.turn, class, "quota counters unavailable mid-turn");
                        return Ok(Reserved::Unavailable);
                    }
                }
                Some("refused") => {
                    let counts = TurnCounts {
                        tokens_day: n(2),
                        tokens_month: n(3),
                        ..TurnCounts::default()
                    };
                    let budgets = Limits {
                        tokens_per_day: limits.tokens_per_day,
                        tokens_per_month: limits.tokens_per_month,
                        ..Limits::default()
                    };
                    if let Some(refusal) =
                        crate::quota::fallback::decide(&budgets, &counts, &periods)
                    {
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

fn hold_key(agent: AgentId) -> String {
    format!("hold:agent:{agent}")
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
