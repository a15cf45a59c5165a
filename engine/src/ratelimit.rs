//! Request rate limits: a token bucket per principal, shared by the replicas in
//! Redis, checked in one script and one round trip per request.
//!
//! Whose bucket: an API key's (by the key's hash) or a JWT user's (by team and subject),
//! with its team's limit (`BRAIN_RATE_LIMIT_*`, overridden per team through the quota API);
//! a request without valid credentials counts against its client address
//! (`BRAIN_RATE_LIMIT_ANONYMOUS_*`; the address `api::ClientAddr` finds). Which routes are
//! exempt is the API's decision (`api/limit.rs`).
//!
//! Keys: a team's limit, as the replicas last read it from Postgres
//! (`ratelimit:{<team>}:limit`, kept a minute, forgotten when the team's quotas change),
//! and each principal's bucket (`ratelimit:{<team>}:<identity>`) in the team's slot, so one
//! script reads both; an address's bucket is `ratelimit:{addr:<address>}`. A bucket is a
//! hash of its tokens and when they were counted, kept until it would be full again.
//!
//! Redis unreachable or slow (past [`REDIS_BOUND`]): the request is let through (fail
//! open) and counted in `brain_rate_limit_unchecked_total`. A rate limit guards the
//! replicas against floods; what a team may spend is the quotas' job, which fall back on
//! Postgres and never open.
//!
//! Architecture invariant: only this module knows these keys.

use std::net::IpAddr;
use std::time::Duration;

use protocol::TeamId;

use crate::quota::{Quotas, RateLimitHeaders, RequestLimit};
use crate::redis::{Shared, Unavailable, bounded};

/// The bound on the limit's one Redis call: a request waits no longer for it.
pub const REDIS_BOUND: Duration = Duration::from_millis(250);

/// How long a replica trusts the team limit it wrote to Redis before reading Postgres again.
const LIMIT_TTL: Duration = Duration::from_secs(60);

/// Takes one token from a bucket. Keys: the bucket, then (for a team's principal) the
/// team's limit. `ARGV[1]` is `1` when `ARGV[2..3]` (rate, burst; empty rate for
/// unlimited) are the limit to use, and to store for `ARGV[4]` ms when a limit key is
/// given; otherwise the stored limit is used, and none stored answers `{"limit"}`.
/// Answers `{"ok"}` (unlimited), or `{allowed (1/0), tokens left (floor), ms until one
/// more token, ms until full, rate, burst}`.
const TAKE: &str = r"
local rate, burst = ARGV[2], ARGV[3]
if KEYS[2] then
  if ARGV[1] == '1' then
    redis.call('SET', KEYS[2], rate .. ':' .. burst, 'PX', ARGV[4])
  else
    local stored = redis.call('GET', KEYS[2])
    if not stored then return {'limit'} end
    rate, burst = string.match(stored, '^(%d*):(%d*)$')
  end
end
rate, burst = tonumber(rate), tonumber(burst)
if not rate or not burst then return {'ok'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local b = redis.call('HMGET', KEYS[1], 'n', 'at')
local n, at = tonumber(b[1]), tonumber(b[2])
if not n or not at then n, at = burst, now end
n = math.min(burst, n + math.max(0, now - at) * rate / 1000)
local allowed = 0
local wait = 0
if n >= 1 then
  n = n - 1
  allowed = 1
else
  wait = math.ceil((1 - n) * 1000 / rate)
end
local full = math.ceil((burst - n) * 1000 / rate)
redis.call('HSET', KEYS[1], 'n', string.format('%.6f', n), 'at', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], full + 1000)
local function int(v) return string.format('%d', v) end
return {int(allowed), int(math.floor(n)), int(wait), int(full), int(rate), int(burst)}
";

/// Whose bucket a request takes from.
pub enum Subject<'a> {
    /// An API key or a JWT user of `team`: `identity` is `Principal::identity()`.
    Principal { team: TeamId, identity: &'a str },
    /// A request without valid credentials, from this address (`None`: unknown, one
    /// bucket for all such).
    Address(Option<IpAddr>),
}

/// A request past its bucket: when one more is let through, and the headers saying so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub retry_after: Duration,
    pub headers: RateLimitHeaders,
}

/// The rate limits of every request. Cheap to clone: one shared Redis connection for all.
#[derive(Clone)]
pub struct RateLimits {
    inner: std::sync::Arc<Inner>,
}

struct Inner {
    redis: Shared,
    take: redis::Script,
    quotas: Quotas,
    anonymous: Option<RequestLimit>,
}

/// What the script answered.
enum Answer {
    Unlimited,
    /// The team's limit is not in Redis: read it from Postgres and ask again.
    Limit,
    Counted {
        allowed: bool,
        left: u64,
        wait_ms: u64,
        full_ms: u64,
        limit: RequestLimit,
    },
}

impl Answer {
    fn parse(answer: &[String]) -> Option<Self> {
        match answer {
            [word] if word == "ok" => Some(Self::Unlimited),
            [word] if word == "limit" => Some(Self::Limit),
            [allowed, left, wait_ms, full_ms, per_second, burst] => Some(Self::Counted {
                allowed: allowed == "1",
                left: left.parse().ok()?,
                wait_ms: wait_ms.parse().ok()?,
                full_ms: full_ms.parse().ok()?,
                limit: RequestLimit {
                    per_second: per_second.parse().ok()?,
                    burst: burst.parse().ok()?,
                },
            }),
            _ => None,
        }
    }
}

impl RateLimits {
    /// Does no I/O.
    pub fn new(
        redis: crate::redis::Client,
        quotas: Quotas,
        anonymous: Option<RequestLimit>,
    ) -> Self {
        Self {
            inner: std::sync::Arc::new(Inner {
                redis: Shared::new(redis, REDIS_BOUND),
                take: redis::Script::new(TAKE),
                quotas,
                anonymous,
            }),
        }
    }

    /// Takes one request from `subject`'s bucket: `Ok(None)` when let through,
    /// `Ok(Some(refusal))` past the limit, `Err` when Redis (or, for a team whose limit
    /// Redis lost, Postgres) did not answer in time: the caller lets the request through.
    /// One round trip warm; two, and one Postgres read, a minute for each team.
    pub async fn take(&self, subject: &Subject<'_>) -> Result<Option<Refusal>, Unchecked> {
        let inner = &self.inner;
        let (bucket, team) = match subject {
            Subject::Principal { team, identity } => (
                format!("ratelimit:{{{team}}}:{identity}"),
                Some((*team, limit_key(*team))),
            ),
            Subject::Address(address) => {
                if inner.anonymous.is_none() {
                    return Ok(None);
                }
                let address = address.map_or_else(|| "unknown".to_owned(), |a| a.to_string());
                (format!("ratelimit:{{addr:{address}}}"), None)
            }
        };
        // An address's limit is the configuration's; a team's is in Redis until the
        // script asks for it.
        let mut given = match team {
            Some(_) => None,
            None => Some(inner.anonymous),
        };
        loop {
            let mut call = inner.take.key(&bucket);
            if let Some((_, key)) = &team {
                call.key(key);
            }
            match given {
                Some(limit) => call
                    .arg("1")
                    .arg(limit.map(|l| l.per_second.to_string()).unwrap_or_default())
                    .arg(limit.map(|l| l.burst.to_string()).unwrap_or_default())
                    .arg(LIMIT_TTL.as_millis() as u64),
                None => call.arg("").arg("").arg("").arg(""),
            };
            let answer = bounded(REDIS_BOUND, async {
                let mut conn = inner.redis.get().await?;
                call.invoke_async::<Vec<String>>(&mut conn).await
            })
            .await
            .map_err(Unchecked::Redis)?;
            match Answer::parse(&answer).ok_or(Unchecked::Answer)? {
                Answer::Unlimited => return Ok(None),
                Answer::Counted { allowed: true, .. } => return Ok(None),
                Answer::Counted {
                    allowed: false,
                    left,
                    wait_ms,
                    full_ms,
                    limit,
                } => {
                    return Ok(Some(Refusal {
                        retry_after: Duration::from_millis(wait_ms),
                        headers: RateLimitHeaders::requests(
                            limit,
                            left,
                            Duration::from_millis(full_ms),
                        ),
                    }));
                }
                // Asked once: the next call carries the limit.
                Answer::Limit if given.is_none() => {
                    let (team, _) = team.as_ref().ok_or(Unchecked::Answer)?;
                    let settings = inner
                        .quotas
                        .settings(*team)
                        .await
                        .map_err(|_| Unchecked::Postgres)?;
                    given = Some(settings.requests);
                }
                Answer::Limit => return Err(Unchecked::Answer),
            }
        }
    }

    /// Forgets the team's limit in Redis, so every replica reads the new one at its next
    /// request (after `PUT /v1/quotas`). If Redis cannot be reached, the old one lapses
    /// within a minute.
    pub async fn forget(&self, team: TeamId) -> Result<(), Unavailable> {
        let inner = &self.inner;
        bounded(REDIS_BOUND, async {
            let mut conn = inner.redis.get().await?;
            redis::cmd("DEL")
                .arg(limit_key(team))
                .query_async::<i64>(&mut conn)
                .await
        })
        .await
        .map(|_| ())
    }
}

fn limit_key(team: TeamId) -> String {
    format!("ratelimit:{{{team}}}:limit")
}

/// Why a request's limit was not checked; a closed set, fit for a metrics label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unchecked {
    #[error("Redis unavailable ({})", .0.0)]
    Redis(Unavailable),
    #[error("the team's limit could not be read from Postgres")]
    Postgres,
    #[error("Redis answered the rate limit script unexpectedly")]
    Answer,
}

impl Unchecked {
    pub fn class(self) -> &'static str {
        match self {
            Self::Redis(unavailable) => unavailable.0,
            Self::Postgres => "postgres",
            Self::Answer => "answer",
        }
    }
}
