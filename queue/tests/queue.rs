//! The queue against the real Redis (`REDIS_URL`, default redis://127.0.0.1:6379), or the
//! shared Redis Cluster on loopback with `TEST_REDIS_CLUSTER=1` (O5, `make test`'s
//! `cluster` target), each test in a namespace of its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::SessionId;
use protocol::channel::SessionTask;
use queue::{ConsumerOptions, SessionQueue, TaskError, consume};
use tokio_util::sync::CancellationToken;

fn redis() -> redis_conn::Client {
    if std::env::var("TEST_REDIS_CLUSTER").is_ok_and(|v| v == "1") {
        return redis_conn::Client::cluster(&test_support::redis_cluster::shared().urls()).unwrap();
    }
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    redis_conn::Client::open(&url, None).unwrap()
}

/// A queue in a fresh namespace; call [`TestQueue::finish`] to delete its keys.
struct TestQueue {
    queue: SessionQueue,
}

impl TestQueue {
    async fn new(options: ConsumerOptions) -> Self {
        let namespace = format!("test-queue-{}", uuid::Uuid::new_v4().simple());
        let queue = SessionQueue::connect_with_namespace(&redis(), &namespace)
            .await
            .expect("Redis must run (make test starts it)")
            .with_options(options);
        Self { queue }
    }

    /// Another connection to the same queue, as a second replica would have.
    async fn replica(&self) -> SessionQueue {
        SessionQueue::connect_with_namespace(&redis(), self.queue.namespace())
            .await
            .unwrap()
            .with_options(self.queue.options().clone())
    }

    async fn finish(self) {
        self.queue.destroy().await.unwrap();
    }
}

fn idle_check(last_used_ms: i64) -> SessionTask {
    SessionTask::IdleCheck {
        session: SessionId::new(),
        last_used_ms,
    }
}

fn session_of(task: &SessionTask) -> SessionId {
    match task {
        SessionTask::Provision { session, .. } | SessionTask::IdleCheck { session, .. } => *session,
    }
}

fn fast() -> ConsumerOptions {
    ConsumerOptions {
        heartbeat_interval: Duration::from_secs(1),
        missed_heartbeats: 2,
        restart_delay: Duration::from_millis(100),
        ..ConsumerOptions::default()
    }
}

/// Polls `check` every 20 ms until it holds or `within` passes.
async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

type Seen = Arc<Mutex<Vec<(SessionId, &'static str, Instant)>>>;

fn recorder(
    seen: &Seen,
    who: &'static str,
) -> impl Fn(SessionTask) -> std::future::Ready<Result<(), TaskError>> + Send + Sync + Clone + 'static
{
    let seen = seen.clone();
    move |task| {
        seen.lock()
            .unwrap()
            .push((session_of(&task), who, Instant::now()));
        std::future::ready(Ok(()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_task_is_consumed_once_by_competing_consumers() {
    let q = TestQueue::new(fast()).await;
    let seen: Seen = Arc::default();
    let shutdown = CancellationToken::new();
    let a = tokio::spawn(consume(
        q.queue.clone(),
        recorder(&seen, "a"),
        shutdown.clone(),
    ));
    let b = tokio::spawn(consume(
        q.replica().await,
        recorder(&seen, "b"),
        shutdown.clone(),
    ));

    let started = Instant::now();
    let mut pushed = Vec::new();
    for i in 0..40 {
        let task = idle_check(i);
        pushed.push(session_of(&task));
        q.queue.push(task).await.unwrap();
    }
    assert!(
        eventually(Duration::from_secs(5), || seen.lock().unwrap().len() >= 40).await,
        "all tasks consumed"
    );
    // A duplicate would show up shortly after.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 40, "each task exactly once");
    let mut ids: Vec<_> = seen.iter().map(|(id, _, _)| *id).collect();
    ids.sort();
    pushed.sort();
    assert_eq!(ids, pushed);
    let first = seen.iter().map(|(_, _, at)| *at).min().unwrap();
    assert!(
        first.duration_since(started) < Duration::from_millis(500),
        "a pushed task starts at once, not after a 30 s poll"
    );

    shutdown.cancel();
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
    q.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_task_fires_after_its_delay() {
    let q = TestQueue::new(fast()).await;
    let seen: Seen = Arc::default();
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(consume(
        q.queue.clone(),
        recorder(&seen, "a"),
        shutdown.clone(),
    ));

    let delay = Duration::from_millis(2500);
    let pushed = Instant::now();
    q.queue.push_after(idle_check(1), delay).await.unwrap();
    q.queue.push(idle_check(2)).await.unwrap();
    assert!(eventually(Duration::from_secs(6), || seen.lock().unwrap().len() >= 2).await);
    let seen = seen.lock().unwrap().clone();
    let immediate = seen[0].2.duration_since(pushed);
    let delayed = seen[1].2.duration_since(pushed);
    assert!(immediate < Duration::from_millis(500), "{immediate:?}");
    assert!(delayed >= delay, "never before the delay: {delayed:?}");
    assert!(
        delayed < delay + Duration::from_millis(1500),
        "at most about a second late: {delayed:?}"
    );

    shutdown.cancel();
    consumer.await.unwrap().unwrap();
    q.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_task_is_retried_a_bounded_number_of_times_then_dropped() {
    let q = TestQueue::new(ConsumerOptions {
        max_attempts: 3,
        ..fast()
    })
    .await;
    let retried = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let permanent = Arc::new(Mutex::new(0usize));
    let retry_session = SessionId::new();
    let handler = {
        let retried = retried.clone();
        let permanent = permanent.clone();
        move |task: SessionTask| {
            let result = if session_of(&task) == retry_session {
                retried.lock().unwrap().push(Instant::now());
                Err(TaskError::Retry("launcher busy".into()))
            } else {
                *permanent.lock().unwrap() += 1;
                Err(TaskError::Permanent("no such profile".into()))
            };
            std::future::ready(result)
        }
    };
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(consume(q.queue.clone(), handler, shutdown.clone()));

    q.queue
        .push(SessionTask::IdleCheck {
            session: retry_session,
            last_used_ms: 0,
        })
        .await
        .unwrap();
    q.queue.push(idle_check(0)).await.unwrap();
    // Backoff of `attempt` seconds: attempts at about 0 s, 1 s and 3 s.
    assert!(
        eventually(Duration::from_secs(8), || retried.lock().unwrap().len()
            >= 3)
        .await
    );
    // Nothing after the last attempt (the backend alone would go on to 25).
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(retried.lock().unwrap().len(), 3, "bounded retries");
    assert_eq!(
        *permanent.lock().unwrap(),
        1,
        "a permanent failure is not retried"
    );

    shutdown.cancel();
    consumer.await.unwrap().unwrap();
    q.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_abandoned_by_a_dead_consumer_comes_back() {
    let q = TestQueue::new(fast()).await;
    let started = Arc::new(tokio::sync::Notify::new());
    let hanging = {
        let started = started.clone();
        move |_task: SessionTask| {
            let started = started.clone();
            async move {
                started.notify_one();
                std::future::pending::<()>().await;
                Ok(())
            }
        }
    };
    // The first consumer takes the task and dies without acknowledging it (its future is
    // dropped, as when the process is killed).
    let doomed = tokio::spawn(consume(q.queue.clone(), hanging, CancellationToken::new()));
    let task = idle_check(7);
    let id = session_of(&task);
    q.queue.push(task).await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), started.notified())
        .await
        .expect("the first consumer took the task");
    doomed.abort();
    let _ = doomed.await;
    let killed_at = Instant::now();

    let seen: Seen = Arc::default();
    let shutdown = CancellationToken::new();
    let survivor = tokio::spawn(consume(
        q.replica().await,
        recorder(&seen, "survivor"),
        shutdown.clone(),
    ));
    // Orphaned after heartbeat × missed heartbeats (2 s), noticed on the survivor's next
    // heartbeat (1 s), with whole-second timestamps.
    assert!(
        eventually(Duration::from_secs(10), || !seen.lock().unwrap().is_empty()).await,
        "the abandoned task came back"
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, id);
    let after = seen[0].2.duration_since(killed_at);
    assert!(after >= Duration::from_secs(1), "{after:?}");

    shutdown.cancel();
    survivor.await.unwrap().unwrap();
    q.finish().await;
}
