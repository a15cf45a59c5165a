//! Connections kept between statements instead of going back through sqlx's release.
//!
//! sqlx 0.9 pings every connection released to its pool, unconditionally
//! (`PoolConnection::return_to_pool` sends a Sync and waits for `ReadyForQuery` in a task
//! it spawns): one more round trip, a task and a wake-up on both sides for each
//! statement. What the ping guards against is a connection left mid-exchange: a future
//! dropped part way through a statement (its answer half read, a message half written) or
//! a transaction whose `ROLLBACK` is still queued. A statement outside a transaction that
//! returned its whole answer leaves neither, so its connection is kept here, the most
//! recent on top, and the next statement takes it with no round trip. Anything else goes
//! back through sqlx as before, ping included: a statement that failed or was dropped
//! (the [`Held`] is dropped with it), every transaction's connection when it ends, and
//! what is kept longer than the bounds below.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::pool::PoolConnection;
use sqlx::postgres::Postgres;

/// A connection taken out of the pool for one statement.
pub(crate) struct Held {
    pub(crate) conn: PoolConnection<Postgres>,
    /// When it left sqlx's pool: what it has been kept since counts from here.
    taken_at: Instant,
}

/// Connections of one pool kept between statements, at most `at_most` of them.
#[derive(Debug)]
pub(crate) struct Kept {
    stack: Mutex<Vec<Idle>>,
    at_most: usize,
    /// A connection idle this long may have died unnoticed (a restart, a partition): it is
    /// given back to the pool, whose own check pings it before its next use.
    fresh_for: Duration,
}

#[derive(Debug)]
struct Idle {
    conn: PoolConnection<Postgres>,
    taken_at: Instant,
    idle_since: Instant,
}

/// How long a connection stays out of the pool's own accounting in all: past this it goes
/// back through sqlx, whose `max_lifetime` and `idle_timeout` then apply to it again.
const OUT_OF_THE_POOL_AT_MOST: Duration = Duration::from_secs(60);

/// How often a statement waiting on the pool's acquire looks at the stack again.
const RECHECK_WHILE_ACQUIRING: Duration = Duration::from_millis(10);

impl Kept {
    pub(crate) fn new(at_most: usize, fresh_for: Duration) -> Self {
        Self {
            stack: Mutex::new(Vec::with_capacity(at_most)),
            at_most,
            fresh_for,
        }
    }

    /// The most recently kept connection if it is fresh, else one from the pool. When the
    /// top is stale, so is everything under it (it was kept last): all go back.
    pub(crate) async fn take(&self, pool: &PgPool) -> Result<Held, sqlx::Error> {
        if let Some(held) = self.pop_fresh() {
            return Ok(held);
        }
        let acquire = pool.acquire();
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                // The pool's own acquire, under its `acquire_timeout` (pinned, not
                // restarted, so that bound holds).
                conn = &mut acquire => {
                    return Ok(Held { conn: conn?, taken_at: Instant::now() });
                }
                // A statement may have kept its connection between this call's look at
                // the stack and the pool running dry: it is taken rather than waited past.
                // The acquire dropped then may close a connection it had in hand (sqlx's
                // note on `Pool::acquire`): a reconnect, the price of that rare race.
                () = tokio::time::sleep(RECHECK_WHILE_ACQUIRING) => {
                    if let Some(held) = self.pop_fresh() {
                        return Ok(held);
                    }
                }
            }
        }
    }

    /// The top of the stack if it is fresh; a stale top goes back with all under it.
    fn pop_fresh(&self) -> Option<Held> {
        let stale = {
            let mut stack = self.lock();
            match stack.pop() {
                Some(top) if top.idle_since.elapsed() < self.fresh_for => {
                    return Some(Held {
                        conn: top.conn,
                        taken_at: top.taken_at,
                    });
                }
                Some(top) => {
                    let mut all = std::mem::take(&mut *stack);
                    all.push(top);
                    all
                }
                None => return None,
            }
        };
        // Dropped outside the lock: each drop spawns sqlx's release of it.
        drop(stale);
        None
    }

    /// Keeps a connection whose statement returned its whole answer, unless the pool has
    /// none left to lend: a caller may be waiting in its acquire (what reads the pool
    /// directly, or a statement that found nothing kept a moment ago), and only a
    /// connection released to the pool reaches it. The oldest kept one goes back to the
    /// pool if it has gone stale, so a replica past a burst does not hold the burst's
    /// connections while it keeps serving a trickle from the top.
    pub(crate) fn keep(&self, held: Held, pool: &PgPool) {
        let exhausted = pool.num_idle() == 0 && pool.size() >= pool.options().get_max_connections();
        if exhausted || held.taken_at.elapsed() >= OUT_OF_THE_POOL_AT_MOST {
            return;
        }
        let back = {
            let mut stack = self.lock();
            let oldest_stale = stack
                .first()
                .is_some_and(|oldest| oldest.idle_since.elapsed() >= self.fresh_for);
            let stale = oldest_stale.then(|| stack.remove(0));
            let over = if stack.len() < self.at_most {
                stack.push(Idle {
                    conn: held.conn,
                    taken_at: held.taken_at,
                    idle_since: Instant::now(),
                });
                None
            } else {
                Some(held)
            };
            (stale, over)
        };
        drop(back);
    }

    /// Gives every kept connection back to the pool: before the pool is closed, which
    /// waits for every connection out of it.
    pub(crate) fn give_back(&self) {
        let all = std::mem::take(&mut *self.lock());
        drop(all);
    }

    /// How many connections are kept now.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // A panic while the lock was held left at worst a stack missing an entry, which
        // went back to the pool when it was dropped.
        self.stack
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
