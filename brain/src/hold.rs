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
//! Architecture invariant: only this module knows the hold's key name and value format.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use protocol::{AgentId, TurnId};
use redis::RedisError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

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

/// Deletes the key only while its value names the turn `ARGV[1]` (`{turn_id}:`): how a
/// survivor frees the agent of a turn whose replica died, without knowing its token.
const RELEASE_TURN: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

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
    client: redis::Client,
    config: HoldConfig,
    metrics: Metrics,
    /// Created on first use, inside the runtime; it connects lazily and reconnects by
    /// itself, so Redis being down at start only makes the first acquires `Unavailable`.
    connection: OnceCell<ConnectionManager>,
    acquire: redis::Script,
    extend: redis::Script,
    release: redis::Script,
    release_turn: redis::Script,
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

/// Why a Redis call failed, as a label for logs (never the error text).
type Class = &'static str;

impl Holds {
    /// Does no I/O: the connection is made on the first `acquire`.
    pub fn new(redis: redis::Client, config: HoldConfig, metrics: Metrics) -> Self {
        Self {
            inner: Arc::new(Inner {
                client: redis,
                config,
                metrics,
                connection: OnceCell::new(),
                acquire: redis::Script::new(ACQUIRE),
                extend: redis::Script::new(EXTEND),
                release: redis::Script::new(RELEASE),
                release_turn: redis::Script::new(RELEASE_TURN),
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
        let answer = inner
            .bounded(async {
                match inner.try_acquire(&key, &value, expiry).await {
                    // A connection that failed earlier is replaced on that failure: one
                    // more try uses the fresh one, so a Redis that came back is used at once.
                    Err(err) if err.is_io_error() => inner.try_acquire(&key, &value, expiry).await,
                    answer => answer,
                }
            })
            .await;
        let class = match answer {
            Ok(None) => return Acquired::Held(HoldGuard::start(inner, key, value, acquired_at)),
            // Our own value: the first try's SET landed but its answer was lost.
            Ok(Some(current)) if current == value => {
                return Acquired::Held(HoldGuard::start(inner, key, value, acquired_at));
            }
            Ok(Some(current)) => match running_turn(&current) {
                Some(running) => return Acquired::Busy { running },
                None => "malformed_hold",
            },
            Err(class) => {
                if class != "connection_refused" {
                    // The SET may have landed after all: take it back so the agent does
                    // not look busy for a whole `ttl`.
                    spawn_release(inner.clone(), key, value);
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
        inner
            .bounded(async {
                let mut conn = inner.connection().await?;
                inner
                    .release_turn
                    .key(hold_key(agent))
                    .arg(format!("{turn}:"))
                    .invoke_async::<i64>(&mut conn)
                    .await
            })
            .await
            .map(|n| n == 1)
    }
}

impl Inner {
    async fn connection(&self) -> Result<ConnectionManager, RedisError> {
        self.connection
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.config.op_timeout))
                    .set_response_timeout(Some(self.config.op_timeout))
                    // No backoff inside the manager: a failed connection is retried by the
                    // next call, so a Redis that comes back is used at once.
                    .set_number_of_retries(0);
                ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            })
            .await
            .cloned()
    }

    /// The `ACQUIRE` script: `None` if the hold is now ours, else the current value.
    async fn try_acquire(
        &self,
        key: &str,
        value: &str,
        expiry: Duration,
    ) -> Result<Option<String>, RedisError> {
        let mut conn = self.connection().await?;
        self.acquire
            .key(key)
            .arg(value)
            .arg(millis(expiry))
            .invoke_async(&mut conn)
            .await
    }

    /// Runs one Redis call under `op_timeout`.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, Class> {
        match tokio::time::timeout(self.config.op_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(error_class(&err)),
            Err(_) => Err("timeout"),
        }
    }

    /// Runs a compare-and-act script (`EXTEND` or `RELEASE`): true if the value was ours.
    async fn if_ours(
        &self,
        script: &redis::Script,
        key: &str,
        value: &str,
        arg: u64,
    ) -> Result<bool, Class> {
        self.bounded(async {
            let mut conn = self.connection().await?;
            script
                .key(key)
                .arg(value)
                .arg(arg)
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await
        .map(|n| n == 1)
    }

    /// Compare-and-delete, tried again when Redis is slow (a burst of turn ends) or
    /// reconnecting: until it lands, the agent answers `agent_busy` for up to the hold's
    /// ttl. Trying again is safe, since a delete that did land leaves nothing ours.
    async fn release(&self, key: &str, value: &str) {
        let mut pause = Duration::from_millis(50);
        for attempt in 1..=RELEASE_TRIES {
            match self.if_ours(&self.release, key, value, 0).await {
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
    /// Stops the extension task.
    stop: CancellationToken,
}

impl HoldGuard {
    fn start(inner: &Arc<Inner>, key: String, value: String, acquired_at: Instant) -> Self {
        let stop = CancellationToken::new();
        tokio::spawn(extend_until_stopped(
            inner.clone(),
            key.clone(),
            value.clone(),
            acquired_at,
            stop.clone(),
        ));
        Self {
            held: Some(Held {
                inner: inner.clone(),
                key,
                value,
                stop,
            }),
        }
    }

    /// Stops extending and deletes the hold if it is still ours (compare-and-delete), so a
    /// turn that outlived its hold never frees another turn's.
    pub async fn release(mut self) {
        if let Some(held) = self.held.take() {
            held.stop.cancel();
            held.inner.release(&held.key, &held.value).await;
        }
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            held.stop.cancel();
            spawn_release(held.inner, held.key, held.value);
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
fn spawn_release(inner: Arc<Inner>, key: String, value: String) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move { inner.release(&key, &value).await });
    }
}

/// Pushes the expiry back every `extend_every` until stopped, the hold is lost, or
/// `max_total` since acquisition is reached; the hold then expires on its own.
async fn extend_until_stopped(
    inner: Arc<Inner>,
    key: String,
    value: String,
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
            .if_ours(&inner.extend, &key, &value, millis(expiry))
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

fn error_class(err: &RedisError) -> Class {
    if err.is_connection_refusal() {
        "connection_refused"
    } else if err.is_timeout() {
        "timeout"
    } else if err.is_io_error() {
        "io"
    } else {
        "redis"
    }
}
