//! One Redis as the brain and the runtime-manager reach it (O5): a single node
//! (`REDIS_URL`) or a Redis Cluster (`REDIS_CLUSTER_URLS`, comma-separated seed nodes).
//!
//! [`Client`] makes the connections; [`Conn`] is one, of either kind, and implements
//! `redis::aio::ConnectionLike`, so commands, pipelines and scripts run on it unchanged and
//! the modules that use Redis do not care which kind it is. What they must care about is
//! the cluster's one rule: the keys of one multi-key command, pipeline, transaction or
//! script share a hash slot. Each module's key names carry the hash tag that makes it so
//! (docs/design/redis-keys.md lists every key with its slot rule).
//!
//! - Commands: on a cluster, one [`Conn`] (a `ClusterConnection`) is shared by all the
//!   calls of a [`Client`]; it routes each command to its slot's master, follows `MOVED`
//!   and `ASK`, and refreshes the slot map when a master fails over.
//! - Pub/sub: classic `PUBLISH` reaches the subscribers of every node of a cluster (the
//!   cluster bus forwards it), so a subscription is made on any one node: the seeds are
//!   tried in turn, starting from the next one each time, so a subscription lost with its
//!   node is made again on another. The price: every message crosses the cluster bus to
//!   every node (sharded pub/sub would keep it on one shard; not used yet, see
//!   docs/design/not-built-yet.md).
//!
//! TLS: a `rediss://` URL (a node, or a cluster's seeds) connects over rustls, verifying
//! the server's certificate against the system's roots (rustls-native-certs, which also
//! reads a bundle named by `SSL_CERT_FILE`); auth (`redis://user:password@host`) works
//! alike for both kinds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection, PubSub,
};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, Value,
};
use tokio::sync::OnceCell;

/// How to reach Redis: one node, or a cluster through its seed nodes. Cheap to clone.
#[derive(Clone)]
pub enum Client {
    // Boxed: with TLS built in, a node's client is thirty times a cluster's pointer.
    Node(Box<redis::Client>),
    Cluster(Arc<Cluster>),
}

/// A cluster: the client of its seeds, its shared connection (made on first use), and a
/// client per seed for subscriptions.
pub struct Cluster {
    client: ClusterClient,
    seeds: Vec<redis::Client>,
    next_seed: AtomicUsize,
    shared: OnceCell<ClusterConnection>,
    /// The bound the shared connection gives connecting and each answer.
    limit: Duration,
}

/// The bound a cluster's shared connection gives connecting and each answer: the callers
/// bound every call tighter anyway.
const CLUSTER_LIMIT: Duration = Duration::from_secs(2);

impl Client {
    /// `cluster` (seed node URLs) selects a cluster; else `url` is the single node. Does
    /// no I/O.
    pub fn open(url: &str, cluster: Option<&[String]>) -> redis::RedisResult<Self> {
        match cluster {
            Some(seeds) => Self::cluster(seeds),
            None => redis::Client::open(url).map(|client| Self::Node(Box::new(client))),
        }
    }

    /// A cluster reached through `seeds` (each a `redis://` URL of one node). Does no I/O.
    pub fn cluster(seeds: &[String]) -> redis::RedisResult<Self> {
        if seeds.is_empty() {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "no cluster seed node",
            )));
        }
        let nodes = seeds
            .iter()
            .map(|url| redis::Client::open(url.as_str()))
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let client = ClusterClient::builder(nodes.iter().map(|n| n.get_connection_info().clone()))
            .connection_timeout(CLUSTER_LIMIT)
            .response_timeout(CLUSTER_LIMIT)
            // A failed command is retried while the slot map is refreshed (a failover),
            // within the caller's own bound.
            .retries(3)
            .build()?;
        Ok(Self::Cluster(Arc::new(Cluster {
            client,
            seeds: nodes,
            next_seed: AtomicUsize::new(0),
            shared: OnceCell::new(),
            limit: CLUSTER_LIMIT,
        })))
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// A connection for short commands: a new multiplexed connection to the node, or the
    /// cluster's shared one.
    pub async fn connection(&self) -> redis::RedisResult<Conn> {
        match self {
            Self::Node(client) => client
                .get_multiplexed_async_connection()
                .await
                .map(Conn::Multiplexed),
            Self::Cluster(cluster) => cluster.shared().await,
        }
    }

    /// A long-lived connection that reconnects by itself, each connect and answer bounded
    /// by `limit` (no backoff: the next call tries again at once). No I/O for a node; a
    /// cluster's is its shared connection.
    pub async fn manager(&self, limit: Duration) -> redis::RedisResult<Conn> {
        match self {
            Self::Node(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(limit))
                    .set_response_timeout(Some(limit))
                    .set_number_of_retries(0);
                ConnectionManager::new_lazy_with_config((**client).clone(), config)
                    .map(Conn::Manager)
            }
            Self::Cluster(cluster) => cluster.shared().await,
        }
    }

    /// A connection of its own, for a blocking read that would hold up every other call
    /// on a shared one: `connect` bounds connecting, `response` each answer.
    pub async fn dedicated(
        &self,
        connect: Duration,
        response: Duration,
    ) -> redis::RedisResult<Conn> {
        match self {
            Self::Node(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect))
                    .set_response_timeout(Some(response));
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map(Conn::Multiplexed)
            }
            Self::Cluster(cluster) => {
                let config = ClusterConfig::new()
                    .set_connection_timeout(connect)
                    .set_response_timeout(response);
                cluster
                    .client
                    .get_async_connection_with_config(config)
                    .await
                    .map(Conn::Cluster)
            }
        }
    }

    /// A pub/sub connection: to the node, or to one of the cluster's seeds (the next one
    /// first, then the others), which hears what is published on any node.
    pub async fn pubsub(&self) -> redis::RedisResult<PubSub> {
        match self {
            Self::Node(client) => client.get_async_pubsub().await,
            Self::Cluster(cluster) => {
                let count = cluster.seeds.len();
                let first = cluster.next_seed.fetch_add(1, Ordering::Relaxed);
                let mut last = None;
                for i in 0..count {
                    match cluster.seeds[(first + i) % count].get_async_pubsub().await {
                        Ok(pubsub) => return Ok(pubsub),
                        Err(err) => last = Some(err),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    RedisError::from((ErrorKind::InvalidClientConfig, "no cluster seed node"))
                }))
            }
        }
    }
}

impl Cluster {
    async fn shared(&self) -> redis::RedisResult<Conn> {
        let conn = self
            .shared
            .get_or_init(|| async {
                let config = ClusterConfig::new()
                    .set_connection_timeout(self.limit)
                    .set_response_timeout(self.limit);
                self.client.get_pending_async_connection_with_config(config)
            })
            .await;
        Ok(Conn::Cluster(conn.clone()))
    }
}

/// One connection to a node or a cluster. Cheap to clone (all kinds are multiplexed).
#[derive(Clone)]
pub enum Conn {
    Manager(ConnectionManager),
    Multiplexed(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Runs `cmd` on the master that serves `key`'s slot: for a command with no key of
    /// its own that must reach that node (`SCAN` for the keys of one hash tag). On a node,
    /// just runs it.
    pub async fn query_on_slot_of<T: FromRedisValue>(
        &mut self,
        key: &str,
        cmd: &Cmd,
    ) -> redis::RedisResult<T> {
        match self {
            Self::Cluster(conn) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let value = conn.route_command(cmd.clone(), routing).await?;
                Ok(T::from_redis_value(value)?)
            }
            _ => cmd.query_async(self).await,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Manager(conn) => conn.req_packed_command(cmd),
            Self::Multiplexed(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Manager(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Multiplexed(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Manager(conn) => conn.get_db(),
            Self::Multiplexed(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_select_a_cluster_and_none_is_no_cluster() {
        assert!(Client::cluster(&[]).is_err());
        let seeds = ["redis://127.0.0.1:7001".to_owned()];
        assert!(
            Client::open("redis://127.0.0.1:6379", Some(&seeds))
                .unwrap()
                .is_cluster()
        );
        assert!(
            !Client::open("redis://127.0.0.1:6379", None)
                .unwrap()
                .is_cluster()
        );
    }

    #[test]
    fn a_malformed_seed_is_refused() {
        let seeds = ["redis://ok:1".to_owned(), "nonsense".to_owned()];
        assert!(Client::open("redis://127.0.0.1:6379", Some(&seeds)).is_err());
    }

    #[tokio::test]
    async fn a_cluster_with_no_live_seed_fails_to_subscribe() {
        // Nothing listens on port 1 or 2.
        let cluster =
            Client::cluster(&["redis://127.0.0.1:1".into(), "redis://127.0.0.1:2".into()]).unwrap();
        let err = cluster.pubsub().await.err().unwrap();
        assert!(err.is_connection_refusal());
    }
}
