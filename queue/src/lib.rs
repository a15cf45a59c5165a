//! The session task queue (SPEC W2, W7): provision tasks and delayed idle checks for the
//! runtime-manager, on Redis, through apalis 1.0 and apalis-redis 1.0.
//!
//! The brain pushes ([`SessionQueue::push`], [`SessionQueue::push_after`]); the
//! runtime-manager consumes ([`consume`]). This crate is the only place that knows the
//! Redis keys of the queue: everything lives under `<namespace>:session-tasks:*`
//! (namespace [`DEFAULT_NAMESPACE`] unless a test picks its own), and on a Redis Cluster
//! (O5) under `{core:apalis:queues:list}<namespace>:session-tasks:*`.
//!
//! # On a Redis Cluster
//!
//! apalis-redis runs on any `ConnectionLike`, so on a cluster it runs on a
//! `ClusterConnection` (`redis_conn::Conn`). Its scripts take the queue's keys and build
//! more of them (a task's meta hash, a consumer's inflight set) from the queue name, which
//! one hash tag keeps in one slot; but its worker registration also writes a fixed key,
//! `core:apalis:queues:list`, from inside the script. So the hash tag is that key's own
//! name: every key of the queue, and the registry, hash to one slot, and every apalis
//! script stays single-slot and atomic as on one node. The cost: the whole queue lives on
//! one shard (provision tasks and idle checks, a few per session: light). On a single
//! node the key names are unchanged, so an upgrade keeps the tasks queued.
//!
//! # How apalis 1.0 is used, and what we design around
//!
//! apalis-redis 1.0 keeps a task's JSON in a hash, its state in a per-task meta hash, the
//! ready task ids in a list, delayed ones in a sorted set scored by unix seconds, and the
//! ids a consumer holds in a per-consumer "inflight" set. A Lua script moves due ids to
//! the consumer's inflight set atomically, so a task is claimed by exactly one consumer
//! across replicas. Its quirks shape this crate:
//!
//! - **Polling.** A consumer in another process is not woken by a push (the pub/sub wake-up
//!   does not fire in 1.0.0, and every push lands in the delayed set anyway), so consumers
//!   poll every [`ConsumerOptions::poll_interval`] (50 ms): a provision task starts at once.
//! - **Delays are whole seconds.** apalis rounds `run_at` down; [`SessionQueue::push_after`]
//!   rounds it *up* instead, so a delayed task never fires before its delay (it may fire up
//!   to one second plus one poll interval late). Delayed tasks cannot be cancelled: an idle
//!   check re-checks the session when it fires and pushes a new one if it was used since.
//! - **Bounded retries.** The backend re-schedules a failed task up to a hard-coded 25
//!   attempts (with a backoff of `attempt` seconds) whatever `max_attempts` says. The
//!   consumer therefore turns the error of the last allowed attempt
//!   ([`ConsumerOptions::max_attempts`]) and every [`TaskError::Permanent`] into apalis'
//!   `AbortError`, which the backend records as dead instead of retrying.
//! - **Crash safety.** A consumer that dies mid-task leaves the task in its inflight set.
//!   Every live consumer's heartbeat moves the inflight tasks of consumers whose last
//!   heartbeat is older than `heartbeat_interval × missed_heartbeats` back to the ready
//!   list, so an abandoned task comes back (after 15 s with the defaults). Handlers must be
//!   idempotent: a task may run again after a crash, and the runtime-manager's handlers are
//!   compare-and-set transitions on the session row.
//! - **Poison tasks.** apalis decodes the arguments in the backend stream, where a decode
//!   error ends the consumer and leaves the task to come back and end the next one. The
//!   queue therefore stores `serde_json::Value` and decodes [`SessionTask`] in the
//!   handler: a task this build cannot read is logged and dropped (aborted), never retried.
//! - **Consumer death.** A Redis error while fetching or acknowledging ends an apalis
//!   worker. [`consume`] runs one worker at a time under a fresh unique name (apalis
//!   refuses to re-register a name still within its heartbeat threshold) and restarts it
//!   after a short pause until `shutdown` is cancelled.
//! - **Housekeeping.** apalis keeps finished tasks forever. [`consume`] deletes finished
//!   and dead tasks older than [`ConsumerOptions::retention`] once a minute.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use apalis::prelude::{
    AbortError, Attempt, BackendExt, BoxDynError, TaskBuilder, WorkerBuilder, WorkerError,
};
use apalis_redis::{Config, RedisStorage};
use protocol::channel::SessionTask;
use redis_conn::{Client, Conn};
use tokio_util::sync::CancellationToken;

/// The namespace of the production queue.
pub const DEFAULT_NAMESPACE: &str = "agent-runtime";

/// A failure of the queue itself (Redis unreachable or answering with an error).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("queue backend: {0}")]
    Backend(String),
    #[error("encoding a task: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("invalid namespace (1-64 of a-z, 0-9, '-', '_', ':')")]
    Namespace,
}

impl QueueError {
    /// A bounded label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Redis(_) => "redis",
            Self::Backend(_) => "backend",
            Self::Encode(_) => "encode",
            Self::Namespace => "namespace",
        }
    }
}

impl From<apalis_redis::Error> for QueueError {
    fn from(e: apalis_redis::Error) -> Self {
        match e {
            apalis_redis::Error::Database(e) => Self::Redis(e),
            other => Self::Backend(other.to_string()),
        }
    }
}

/// How a handler failed. Only the error class is logged (never task contents).
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// Worth another attempt (a store or launcher blip); retried with a backoff of the
    /// attempt number in seconds, up to [`ConsumerOptions::max_attempts`] in all.
    #[error("retryable failure: {0}")]
    Retry(String),
    /// Never worth retrying: the task is dropped.
    #[error("permanent failure: {0}")]
    Permanent(String),
}

impl TaskError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Retry(_) => "retry",
            Self::Permanent(_) => "permanent",
        }
    }
}

/// Consumer tuning. The defaults are the production values.
#[derive(Clone, Debug)]
pub struct ConsumerOptions {
    /// How often an idle consumer looks for due tasks.
    pub poll_interval: Duration,
    /// How often a consumer proves it is alive (and looks for abandoned tasks).
    pub heartbeat_interval: Duration,
    /// A consumer silent for this many heartbeats is dead: its tasks come back.
    pub missed_heartbeats: usize,
    /// Attempts per task, the first included; the last failure drops the task.
    pub max_attempts: usize,
    /// Tasks one consumer claims per fetch (they run concurrently).
    pub batch_size: usize,
    /// How long finished and dead tasks are kept for inspection.
    pub retention: Duration,
    /// The pause before a consumer that lost Redis is started again.
    pub restart_delay: Duration,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_millis(50),
            heartbeat_interval: Duration::from_secs(5),
            missed_heartbeats: 3,
            max_attempts: 5,
            batch_size: 8,
            retention: Duration::from_secs(15 * 60),
            restart_delay: Duration::from_secs(1),
        }
    }
}

/// The queue of [`SessionTask`]s. Cheap to clone (one multiplexed, self-reconnecting
/// Redis connection).
#[derive(Clone)]
pub struct SessionQueue {
    conn: Conn,
    /// On a Redis Cluster: the queue's keys carry [`CLUSTER_TAG`].
    cluster: bool,
    config: Config,
    namespace: String,
    options: ConsumerOptions,
}

impl std::fmt::Debug for SessionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionQueue")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl SessionQueue {
    /// The production queue (namespace [`DEFAULT_NAMESPACE`]).
    pub async fn connect(redis: &Client) -> Result<Self, QueueError> {
        Self::connect_with_namespace(redis, DEFAULT_NAMESPACE).await
    }

    /// A queue whose keys live under `namespace` (tests use one each).
    pub async fn connect_with_namespace(
        redis: &Client,
        namespace: &str,
    ) -> Result<Self, QueueError> {
        let namespace_ok = (1..=64).contains(&namespace.len())
            && namespace.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b':')
            });
        if !namespace_ok {
            return Err(QueueError::Namespace);
        }
        let conn = match redis {
            Client::Node(client) => Conn::Manager(
                client
                    .get_connection_manager_with_config(
                        redis::aio::ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(Duration::from_secs(5)))
                            .set_response_timeout(Some(Duration::from_secs(10)))
                            .set_number_of_retries(2)
                            .set_max_delay(Duration::from_secs(2)),
                    )
                    .await?,
            ),
            Client::Cluster(_) => redis.connection().await?,
        };
        let options = ConsumerOptions::default();
        let cluster = redis.is_cluster();
        Ok(Self {
            conn,
            cluster,
            config: apalis_config(namespace, cluster, &options),
            namespace: namespace.to_owned(),
            options,
        })
    }

    /// The same queue with other consumer settings (tests shorten the heartbeat).
    pub fn with_options(mut self, options: ConsumerOptions) -> Self {
        self.config = apalis_config(&self.namespace, self.cluster, &options);
        self.options = options;
        self
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn options(&self) -> &ConsumerOptions {
        &self.options
    }

    /// Queues `task` to run as soon as a consumer polls (within about 50 ms).
    pub async fn push(&self, task: SessionTask) -> Result<(), QueueError> {
        self.push_at(task, 0).await
    }

    /// Queues `task` to run after `delay`: never before it, and at most about one second
    /// after it (delays are stored in whole seconds, rounded up).
    pub async fn push_after(&self, task: SessionTask, delay: Duration) -> Result<(), QueueError> {
        let due_ms = unix_millis().saturating_add(delay.as_millis() as u64);
        self.push_at(task, due_ms.div_ceil(1000)).await
    }

    /// `run_at` in unix seconds; 0 (or the past) means now.
    async fn push_at(&self, task: SessionTask, run_at: u64) -> Result<(), QueueError> {
        let data = serde_json::to_vec(&task)?;
        let task = TaskBuilder::new(data)
            .run_at_timestamp(run_at)
            .max_attempts(self.options.max_attempts)
            .build();
        let mut conn = self.conn.clone();
        apalis_redis::queries::push_tasks(&mut conn, &self.config, &[task]).await?;
        Ok(())
    }

    /// The tasks due and not yet claimed by any consumer: the ready list, and the delayed
    /// tasks whose time has come (a consumer's poll moves them to the list). Delayed idle
    /// checks not yet due are not counted. Two O(log n) reads in one round trip; the
    /// caller bounds it.
    pub async fn depth(&self) -> Result<u64, QueueError> {
        let mut conn = self.conn.clone();
        let (ready, due): (u64, u64) = redis::pipe()
            .cmd("LLEN")
            .arg(self.config.active_jobs_list())
            .cmd("ZCOUNT")
            .arg(self.config.scheduled_jobs_set())
            .arg(0)
            .arg(unix_millis() / 1000)
            .query_async(&mut conn)
            .await?;
        Ok(ready + due)
    }

    /// Deletes every key of this queue, and its entry in apalis' global queue registry
    /// (`core:apalis:queues:list`, the one key apalis writes outside the namespace). For
    /// tests, which use a namespace each.
    pub async fn destroy(self) -> Result<(), QueueError> {
        let mut conn = self.conn.clone();
        // A script on the queue's slot, so on a cluster it runs (and scans) on the node
        // that holds every key of the queue.
        redis::Script::new(DESTROY_SCRIPT)
            .key(self.config.workers_set())
            .arg(format!("{}:*", self.config.queue.as_ref()))
            .invoke_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// Deletes finished and dead tasks that ended more than `retention` ago.
    async fn vacuum(&self) -> Result<u32, QueueError> {
        let cutoff = (unix_millis() / 1000).saturating_sub(self.options.retention.as_secs());
        let mut conn = self.conn.clone();
        let deleted = redis::Script::new(VACUUM_SCRIPT)
            .key(self.config.job_data_hash())
            .key(self.config.job_meta_hash())
            .key(self.config.done_jobs_set())
            .key(self.config.dead_jobs_set())
            .arg(cutoff)
            .invoke_async::<u32>(&mut conn)
            .await?;
        Ok(deleted)
    }
}

/// Deletes the keys matching `ARGV[1]` and the queue (`KEYS[1]`, its workers set) from
/// apalis' registry.
const DESTROY_SCRIPT: &str = r#"
local cursor = '0'
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 500)
  cursor = page[1]
  if #page[2] > 0 then redis.call('DEL', unpack(page[2])) end
until cursor == '0'
redis.call('ZREM', 'core:apalis:queues:list', KEYS[1])
return 1
"#;

/// The hash tag of every queue key on a Redis Cluster: the name of the one key apalis
/// writes outside the queue's names (see the module doc).
const CLUSTER_TAG: &str = "{core:apalis:queues:list}";

/// Removes terminal tasks (in the done or dead set) whose `done_at` is at or before the
/// cutoff: their data, meta hash and set membership. Tasks waiting for a retry are in
/// neither set and are left alone.
const VACUUM_SCRIPT: &str = r#"
local cutoff = tonumber(ARGV[1])
local deleted = 0
for _, set in ipairs({KEYS[3], KEYS[4]}) do
  for _, id in ipairs(redis.call('smembers', set)) do
    local meta_key = KEYS[2] .. ':' .. id
    local done_at = tonumber(redis.call('hget', meta_key, 'done_at') or '0')
    if done_at <= cutoff then
      redis.call('hdel', KEYS[1], id)
      redis.call('del', meta_key)
      redis.call('srem', set, id)
      deleted = deleted + 1
    end
  end
end
return deleted
"#;

fn apalis_config(namespace: &str, cluster: bool, options: &ConsumerOptions) -> Config {
    let tag = if cluster { CLUSTER_TAG } else { "" };
    Config::default()
        .queue(format!("{tag}{namespace}:session-tasks"))
        .batch_size(options.batch_size.max(1))
        .heartbeat_interval(options.heartbeat_interval)
        .missed_heartbeats(options.missed_heartbeats.max(1))
        // Acknowledgements go through "results": without them a finished task would stay
        // in the consumer's inflight set and come back when the consumer stops.
        .persist_results(true)
        .lock_tasks(true)
        .emit_events(false)
}

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// A name no other consumer has used: apalis refuses a name seen within its heartbeat
/// threshold, and a restarted consumer must not inherit a dead one's inflight set.
fn consumer_name() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".to_owned());
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(63)
        .collect();
    format!(
        "{host}-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Runs `handler` for every task of `queue` until `shutdown` is cancelled; then stops
/// claiming, waits for the running handlers, and returns. Tasks run concurrently.
///
/// A handler's `Ok` finishes the task. A [`TaskError::Retry`] runs it again later, up to
/// [`ConsumerOptions::max_attempts`] attempts; a [`TaskError::Permanent`] or the last
/// attempt's failure drops it. A lost Redis connection restarts the consumer after
/// [`ConsumerOptions::restart_delay`]; this function only returns an error if the very
/// first connection check fails.
pub async fn consume<F, Fut>(
    queue: SessionQueue,
    handler: F,
    shutdown: CancellationToken,
) -> Result<(), QueueError>
where
    F: Fn(SessionTask) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = Result<(), TaskError>> + Send + 'static,
{
    // Fail fast on a queue that cannot work at all.
    let mut conn = queue.conn.clone();
    redis::cmd("PING").query_async::<String>(&mut conn).await?;

    let janitor = tokio::spawn(janitor(queue.clone(), shutdown.clone()));
    while !shutdown.is_cancelled() {
        let name = consumer_name();
        let storage = RedisStorage::<serde_json::Value, Conn>::new(queue.conn.clone())
            .with_config(queue.config.clone())
            .poll_with_interval(queue.options.poll_interval);
        let max_attempts = queue.options.max_attempts.max(1);
        let handler = handler.clone();
        let service = move |raw: serde_json::Value, attempt: Attempt| {
            let handler = handler.clone();
            async move { run_one(handler, raw, attempt.current(), max_attempts).await }
        };
        let worker = WorkerBuilder::new(name.as_str())
            .backend(storage)
            .build(service);
        let token = shutdown.clone();
        tracing::debug!(consumer = %name, "session queue consumer starting");
        // Boxed here, where the types are concrete: proving the worker future `Send` inside
        // a caller's `tokio::spawn` trips a higher-ranked lifetime limitation of rustc.
        let run: Pin<Box<dyn Future<Output = Result<(), WorkerError>> + Send>> =
            Box::pin(worker.run_until(async move {
                token.cancelled().await;
                Ok::<(), std::io::Error>(())
            }));
        let result = run.await;
        forget_consumer(&queue, &name).await;
        match result {
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(
                    consumer = %name,
                    error_class = worker_error_label(&e),
                    "session queue consumer stopped; restarting"
                );
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(queue.options.restart_delay) => {}
                }
            }
        }
    }
    janitor.abort();
    Ok(())
}

/// One attempt of one task: decode, run, and map the outcome to what apalis should do.
async fn run_one<F, Fut>(
    handler: F,
    raw: serde_json::Value,
    attempt: usize,
    max_attempts: usize,
) -> Result<(), BoxDynError>
where
    F: Fn(SessionTask) -> Fut,
    Fut: Future<Output = Result<(), TaskError>>,
{
    let task: SessionTask = match serde_json::from_value(raw) {
        Ok(task) => task,
        Err(_) => {
            tracing::error!("dropping a session task this build cannot decode");
            return Err(Box::new(AbortError::new(TaskError::Permanent(
                "undecodable task".into(),
            ))));
        }
    };
    let kind = match &task {
        SessionTask::Provision { .. } => "provision",
        SessionTask::IdleCheck { .. } => "idle_check",
    };
    match handler(task).await {
        Ok(()) => Ok(()),
        Err(e) => {
            let last = attempt >= max_attempts;
            let drop = last || matches!(e, TaskError::Permanent(_));
            tracing::warn!(
                task = kind,
                attempt,
                max_attempts,
                error_class = e.metric_label(),
                dropped = drop,
                "session task failed"
            );
            if drop {
                Err(Box::new(AbortError::new(e)))
            } else {
                Err(Box::new(e))
            }
        }
    }
}

fn worker_error_label(e: &WorkerError) -> &'static str {
    match e {
        WorkerError::BackendError(_) => "backend",
        WorkerError::StateError(_) => "state",
        WorkerError::PanicError(_) => "panic",
        WorkerError::IoError(_) => "io",
        _ => "other",
    }
}

/// Drops the bookkeeping apalis keeps per consumer name once that consumer has stopped.
async fn forget_consumer(queue: &SessionQueue, name: &str) {
    let mut conn = queue.conn.clone();
    let key = format!("{}:workers:metadata:{name}", queue.config.queue.as_ref());
    let _ = redis::cmd("DEL")
        .arg(key)
        .query_async::<()>(&mut conn)
        .await;
}

async fn janitor(queue: SessionQueue, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match queue.vacuum().await {
            Ok(0) => {}
            Ok(deleted) => tracing::debug!(deleted, "session queue vacuumed"),
            Err(e) => tracing::debug!(
                error_class = e.metric_label(),
                "session queue vacuum failed"
            ),
        }
    }
}
