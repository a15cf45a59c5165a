//! Redis connection set-up and the bound on Redis calls, in one place.
//!
//! Every module that talks to Redis keeps its own key and channel names (each says so in
//! its module doc); what they share is here: [`Shared`], the one long-lived connection of
//! a module (lazy, reconnecting by itself), and [`bounded`], one Redis call under a time
//! limit that fails with [`Unavailable`] and an error class when Redis errs or is slower.
//! Redis is best effort everywhere in the brain, so a slow Redis must fail a call fast
//! rather than hold up a turn. The limits differ on purpose (a turn's hold and the relay
//! bound each call tighter than a stop or a key revocation, which nothing waits on), so
//! each caller passes its own.
//!
//! Single node or cluster (O5): [`Client`] (from the `redis-conn` crate) is either, and
//! the connections it gives run the same commands; each module's keys carry the hash tag
//! that keeps its multi-key commands in one slot (docs/design/redis-keys.md).

use std::future::Future;
use std::time::Duration;

use redis::RedisError;
pub use redis_conn::{Client, Conn};
use tokio::sync::OnceCell;

/// Redis did not answer a bounded call; the error class (`timeout`, `connection_refused`,
/// `io`, `redis`) is a closed set, fit for a log field or a metrics label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Redis unavailable ({0})")]
pub struct Unavailable(pub &'static str);

impl From<RedisError> for Unavailable {
    fn from(err: RedisError) -> Self {
        Self(if err.is_connection_refusal() {
            "connection_refused"
        } else if err.is_timeout() {
            "timeout"
        } else if err.is_io_error() {
            "io"
        } else {
            "redis"
        })
    }
}

/// Runs one Redis call (connecting included, when the future connects) under `limit`.
/// Not an `async fn`, which would keep `call` twice in its caller's future (`store::bounded`).
pub fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> impl Future<Output = Result<T, Unavailable>> {
    use futures_util::FutureExt;
    tokio::time::timeout(limit, call).map(|done| match done {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(err.into()),
        Err(_) => Err(Unavailable("timeout")),
    })
}

/// A module's one connection, shared by all its calls: made on first use, inside the
/// runtime, and reconnecting by itself, so Redis being down at start only fails the first
/// calls. Connecting and every answer are bounded by `limit`.
pub struct Shared {
    client: Client,
    limit: Duration,
    connection: OnceCell<Conn>,
}

impl Shared {
    /// Does no I/O.
    pub fn new(client: Client, limit: Duration) -> Self {
        Self {
            client,
            limit,
            connection: OnceCell::new(),
        }
    }

    /// The connection (no I/O: it connects lazily). A call that fails on a broken
    /// connection replaces it, so the next call uses a fresh one.
    pub async fn get(&self) -> redis::RedisResult<Conn> {
        self.connection
            .get_or_try_init(|| self.client.manager(self.limit))
            .await
            .cloned()
    }

    /// The client, for a module that needs a connection of its own besides (a blocking
    /// read would hold up every other call on the shared one).
    pub fn client(&self) -> &Client {
        &self.client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_slower_than_its_limit_is_a_timeout() {
        let slow = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(())
        };
        assert_eq!(
            bounded(Duration::from_millis(10), slow).await,
            Err(Unavailable("timeout"))
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_classed_as_such() {
        // Nothing listens on port 1.
        let client = Client::open("redis://127.0.0.1:1/", None).unwrap();
        let shared = Shared::new(client, Duration::from_secs(1));
        let answer = bounded(Duration::from_secs(2), async {
            let mut conn = shared.get().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        })
        .await;
        assert_eq!(answer, Err(Unavailable("connection_refused")));
    }
}
