//! The runtime-manager against real Postgres and Redis, launching a fake worker (a shell
//! script that never dials): provisioning, launch failures, the dial timeout, idle
//! teardown, crash recovery, the reaper and start-up reconciliation (SPEC W2, W6, W7, O3).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::{Harness, ThrowawayRedis, alive, wait_gone};
use channel::token::TokenKeys;
use protocol::SessionId;
use queue::SessionQueue;
use runtime_manager::launcher::local::LocalProcessLauncher;
use runtime_manager::launcher::sandbox::Confinement;

const SECONDS_5: Duration = Duration::from_secs(5);

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn sleep_until_unix_ms(at: i64) {
    let wait = at - unix_ms();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisioned_session_gets_a_worker_with_only_its_own_environment() {
    let mut h = Harness::new().await;
    h.start(&[]);
    let started = Instant::now();
    let session = h.provision("light").await;
    let row = h.wait_state(session, "connecting", SECONDS_5).await;
    let launched_in = started.elapsed();
    let pid = row.pid();
    assert!(alive(pid));
    assert!(
        launched_in < Duration::from_secs(2),
        "a provision task starts at once: {launched_in:?}"
    );

    let env = h.worker_env(session).await;
    // Confined, the worker's network is its own (W16): the brain, on a privileged port
    // here, is reached on a loopback port of the sandbox, and the proxy on another.
    assert_eq!(env["BRAIN_PUBLIC_URL"], "http://127.0.0.1:18080");
    assert_eq!(env["WORKER_EGRESS_PROXY"], "http://127.0.0.1:3128");
    let bridges: Vec<&str> = env["WORKER_EGRESS_BRIDGE"].split(',').collect();
    assert!(
        bridges[0].starts_with("127.0.0.1:3128=/") && bridges[0].ends_with("/proxy.sock"),
        "{bridges:?}"
    );
    assert!(bridges[1].starts_with("127.0.0.1:18080=/"), "{bridges:?}");
    assert_eq!(env["WORKER_SESSION_ID"], session.0.to_string());
    assert_eq!(
        env["WORKER_WORKSPACE"],
        h.workspace(session).display().to_string()
    );
    // The token comes on standard input: an environment stays readable in /proc.
    assert_eq!(env["WORKER_SESSION_TOKEN"], "-");
    let token = std::fs::read_to_string(h.workspace(session).join("stdin.txt")).unwrap();
    let claims = TokenKeys::new(test_support::SESSION_TOKEN_KEY.as_bytes())
        .unwrap()
        .verify(&token)
        .expect("a token the brain accepts");
    assert_eq!(claims.sub, session);
    assert_eq!(claims.team, h.team);
    assert_eq!(claims.agent, h.agent);
    assert!(claims.exp - claims.iat <= 600, "short-lived");
    // Nothing of the manager's environment beyond the allow-list (the shell adds PWD,
    // SHLVL and `_` itself).
    let allowed = [
        "BRAIN_PUBLIC_URL",
        "WORKER_SESSION_ID",
        "WORKER_SESSION_TOKEN",
        "WORKER_WORKSPACE",
        "WORKER_PROFILE",
        "WORKER_RESTORE",
        "WORKER_EGRESS_PROXY",
        "WORKER_EGRESS_BRIDGE",
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    ];
    for name in env.keys() {
        assert!(
            allowed.contains(&name.as_str()),
            "unexpected variable {name}"
        );
    }
    for secret in ["DATABASE_URL", "REDIS_URL", "SESSION_TOKEN_KEY"] {
        assert!(!env.contains_key(secret), "{secret} leaked to the worker");
    }
    // Output goes to a log next to the workspace.
    let log = h.workspaces().join(format!("{}.log", session.0));
    let deadline = Instant::now() + SECONDS_5;
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("fake worker")
    {
        assert!(
            Instant::now() < deadline,
            "no worker log at {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // SIGTERM: the manager stops its local workers and ends their sessions.
    let grandchild = h.grandchild(session).await;
    h.stop_manager().await;
    assert!(
        !alive(pid) && !alive(grandchild),
        "no worker outlives the manager"
    );
    assert_eq!(h.row(session).await.state, "terminated");
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_that_cannot_start_fails_the_session() {
    let mut h = Harness::new().await;
    let missing = h.dir.join("no-such-worker").display().to_string();
    h.start(&[("RUNTIME_MANAGER_WORKER_BIN", &missing)]);

    let session = h.provision("light").await;
    let row = h.wait_state(session, "failed", SECONDS_5).await;
    assert_eq!(row.failure_reason.as_deref(), Some("launch_failed"));
    assert_eq!(row.failure_detail.as_deref(), Some("worker_binary_missing"));
    assert_eq!(row.worker_ref, None);

    let session = h.provision("none").await;
    let row = h.wait_state(session, "failed", SECONDS_5).await;
    assert_eq!(row.failure_reason.as_deref(), Some("launch_failed"));
    assert_eq!(row.failure_detail.as_deref(), Some("unknown_profile"));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_dials_times_out_and_is_stopped() {
    let mut h = Harness::new().await;
    h.start(&[("RUNTIME_MANAGER_DIAL_TIMEOUT_MS", "1000")]);

    let session = h.provision("light").await;
    let row = h.wait_state(session, "connecting", SECONDS_5).await;
    let connecting_at = Instant::now();
    let pid = row.pid();
    let grandchild = h.grandchild(session).await;

    let row = h.wait_state(session, "failed", SECONDS_5).await;
    let after = connecting_at.elapsed();
    assert_eq!(row.failure_reason.as_deref(), Some("dial_timeout"));
    assert!(
        after >= Duration::from_millis(900),
        "not before the timeout: {after:?}"
    );
    assert!(
        after < Duration::from_millis(3000),
        "soon after it: {after:?}"
    );
    wait_gone(pid, SECONDS_5).await;
    wait_gone(grandchild, SECONDS_5).await;
    h.finish().await;
}

/// What the brain does once the worker's `tools/list` is answered: `connecting → ready`.
/// The database time of the change, unix ms.
async fn mark_ready(h: &Harness, session: SessionId) -> i64 {
    let (ready_ms,): (i64,) = sqlx::query_as(
        "UPDATE agent_runtime_sessions SET state = 'ready', updated_at = now() WHERE id = $1
         RETURNING floor(extract(epoch from updated_at) * 1000)::bigint",
    )
    .bind(session.0)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    ready_ms
}

/// The session's `last_used_at` and `updated_at`, unix ms of the database clock.
async fn used_and_updated_ms(h: &Harness, session: SessionId) -> (i64, i64) {
    sqlx::query_as(
        "SELECT floor(extract(epoch from last_used_at) * 1000)::bigint,
                floor(extract(epoch from updated_at) * 1000)::bigint
         FROM agent_runtime_sessions WHERE id = $1",
    )
    .bind(session.0)
    .fetch_one(&h.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_is_torn_down_and_a_use_rearms_its_timer() {
    let mut h = Harness::new().await;
    h.start(&[("RUNTIME_MANAGER_IDLE_WINDOW_MS", "1500")]);

    let session = h.provision("light").await;
    let row = h.wait_state(session, "connecting", SECONDS_5).await;
    let pid = row.pid();
    let grandchild = h.grandchild(session).await;
    // Idle time counts from `ready`.
    let ready_ms = mark_ready(&h, session).await;

    // Delays are whole seconds, rounded up: the first check fires at this second at the
    // earliest. Use the session just before it.
    let first_check_ms = (ready_ms + 1500 + 999) / 1000 * 1000;
    sleep_until_unix_ms(first_check_ms - 300).await;
    let (bumped_ms,): (i64,) = sqlx::query_as(
        "UPDATE agent_runtime_sessions SET last_used_at = now() WHERE id = $1
         RETURNING floor(extract(epoch from last_used_at) * 1000)::bigint",
    )
    .bind(session.0)
    .fetch_one(&h.pool)
    .await
    .unwrap();

    // The first check has fired by now and found the session used: still alive.
    sleep_until_unix_ms(bumped_ms + 1400).await;
    assert_eq!(
        h.row(session).await.state,
        "ready",
        "re-armed, not torn down"
    );
    assert!(alive(pid));

    let row = h.wait_state(session, "terminated", SECONDS_5).await;
    assert_eq!(row.failure_reason, None);
    wait_gone(pid, SECONDS_5).await;
    wait_gone(grandchild, SECONDS_5).await;
    let (last_used_ms, ended_ms) = used_and_updated_ms(&h, session).await;
    assert_eq!(last_used_ms, bumped_ms);
    assert!(
        ended_ms - last_used_ms >= 1500,
        "torn down only after a full idle window: {} ms",
        ended_ms - last_used_ms
    );
    h.finish().await;
}

/// A worker still starting when its idle window has passed (an image pull
/// longer than `heavy`'s 45 s) is left to its dial; the idle window counts from `ready`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_slower_to_dial_than_its_idle_window_is_kept_and_idle_counts_from_ready() {
    let mut h = Harness::new().await;
    h.start(&[("RUNTIME_MANAGER_IDLE_WINDOW_MS", "1000")]);

    let session = h.provision("light").await;
    let row = h.wait_state(session, "connecting", SECONDS_5).await;
    let pid = row.pid();
    // Two windows and more (the first check fires within two seconds of the launch).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let row = h.row(session).await;
    assert_eq!(
        row.state, "connecting",
        "not torn down while it starts: {row:?}"
    );
    assert!(alive(pid));

    let ready_ms = mark_ready(&h, session).await;
    h.wait_state(session, "terminated", SECONDS_5).await;
    wait_gone(pid, SECONDS_5).await;
    let (_, ended_ms) = used_and_updated_ms(&h, session).await;
    assert!(
        ended_ms - ready_ms >= 1000,
        "a full window after ready: {} ms",
        ended_ms - ready_ms
    );
    h.finish().await;
}

/// A claimed warm session whose idle check could not be pushed (Redis gone
/// at the arming step; a manager dying between recording and pushing it is the same) is
/// torn down after its idle window anyway: the reaper arms a new check once the recorded
/// one is overdue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_session_whose_idle_check_was_never_pushed_is_reaped_anyway() {
    let mut h = Harness::new().await;
    // A pooled worker that a brain replica claimed: the slot is `claimed`, the session
    // `ready` with the slot's worker.
    let (session, _) = h.insert_session("ready", "light").await;
    let slot = SessionId::new();
    let workspace = h.workspace(slot);
    std::fs::create_dir_all(&workspace).unwrap();
    let mut worker = tokio::process::Command::new(&h.worker_bin)
        .env("WORKER_WORKSPACE", &workspace)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let worker_ref = format!("local:{}", worker.id().unwrap());
    sqlx::query("UPDATE agent_runtime_sessions SET worker_ref = $2 WHERE id = $1")
        .bind(session.0)
        .bind(&worker_ref)
        .execute(&h.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO worker_pool (id, profile, state, worker_ref, session_id)
         VALUES ($1, 'light', 'claimed', $2, $3)",
    )
    .bind(slot.0)
    .bind(&worker_ref)
    .bind(session.0)
    .execute(&h.pool)
    .await
    .unwrap();

    // A manager's reaper pass whose Redis is gone by the time it arms the idle check.
    let idle = [("RUNTIME_MANAGER_IDLE_WINDOW_MS", "1000")];
    let redis = ThrowawayRedis::start().await;
    let config = h.config(&idle);
    let queue = SessionQueue::connect_with_namespace(
        &redis_conn::Client::open(&redis.url, None).unwrap(),
        &h.namespace,
    )
    .await
    .unwrap();
    let blind = in_process(config, queue).await;
    redis.kill().await;
    assert!(blind.reap_once().await.is_err(), "the arming push failed");
    drop(blind);

    // A manager with a working queue: the session is torn down all the same.
    h.start_with(&idle, |c| c.lost_idle_check_grace = Duration::from_secs(2));
    let row = h
        .wait_state(session, "terminated", Duration::from_secs(10))
        .await;
    assert_eq!(row.failure_reason, None);
    let stopped = tokio::time::timeout(SECONDS_5, worker.wait()).await;
    assert!(stopped.is_ok(), "the claimed worker was stopped");
    h.finish().await;
}

/// A manager whose passes the test drives (`reap_once`), with the local launcher.
async fn in_process(
    config: runtime_manager::config::Config,
    queue: SessionQueue,
) -> runtime_manager::Manager {
    let store = runtime_manager::store::Store::connect(&config.database_url, false)
        .await
        .unwrap();
    let launcher = Arc::new(LocalProcessLauncher::new(
        config.worker_bin.clone(),
        config.workspaces.clone(),
        Confinement::detect(config.local_unconfined),
    ));
    runtime_manager::Manager::new(config, store, queue, launcher).unwrap()
}

/// Every slot: its id, state and worker.
async fn pool_rows(h: &Harness) -> Vec<(uuid::Uuid, String, Option<String>)> {
    sqlx::query_as("SELECT id, state, worker_ref FROM worker_pool ORDER BY created_at")
        .fetch_all(&h.pool)
        .await
        .unwrap()
}

fn pid_of(worker_ref: &Option<String>) -> u32 {
    worker_ref
        .as_deref()
        .and_then(|r| r.strip_prefix("local:"))
        .and_then(|p| p.parse().ok())
        .unwrap()
}

/// R3 with several manager replicas: three managers tending one pool at the same moment,
/// pass after pass, never open more slots than its `warmPoolSize` between them (each used
/// to count, then insert, on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managers_tending_one_pool_at_once_never_overfill_it() {
    let h = Harness::new().await;
    let mut managers = Vec::new();
    for _ in 0..3 {
        let mut config = h.config(&[]);
        config.profiles.light.warm_pool_size = 2;
        managers.push(in_process(config, h.queue.clone()).await);
    }
    for _ in 0..5 {
        let passes = futures_util::future::join_all(managers.iter().map(|m| m.reap_once())).await;
        assert!(passes.iter().all(Result::is_ok), "{passes:?}");
        let open = pool_rows(&h)
            .await
            .into_iter()
            .filter(|(_, state, _)| state == "starting" || state == "idle")
            .count();
        assert_eq!(open, 2, "the pool holds exactly its size");
    }
    let rows = pool_rows(&h).await;
    assert_eq!(rows.len(), 2, "no slot was opened and retired: {rows:?}");
    stop_pool(&h).await;
    h.finish().await;
}

/// Retires every slot and lets a manager without pools stop their workers.
async fn stop_pool(h: &Harness) {
    sqlx::query("UPDATE worker_pool SET state = 'gone'")
        .execute(&h.pool)
        .await
        .unwrap();
    let rows = pool_rows(h).await;
    in_process(h.config(&[]), h.queue.clone())
        .await
        .reap_once()
        .await
        .unwrap();
    for (_, _, worker_ref) in &rows {
        wait_gone(pid_of(worker_ref), SECONDS_5).await;
    }
}

/// R3: an idle pooled worker that waited past its profile's `warmPoolMaxAgeSeconds` is
/// retired, its worker stopped and a fresh one started in the same pass; a younger one
/// waits on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_worker_past_its_maximum_age_is_replaced() {
    let h = Harness::new().await;
    let mut config = h.config(&[]);
    config.profiles.light.warm_pool_size = 2;
    config.profiles.light.warm_pool_max_age = Duration::from_secs(60);
    let manager = in_process(config, h.queue.clone()).await;
    manager.reap_once().await.unwrap();
    let started = pool_rows(&h).await;
    assert_eq!(started.len(), 2);
    // The brain's part: both workers dialed in and wait; one of them since over a minute.
    sqlx::query("UPDATE worker_pool SET state = 'idle'")
        .execute(&h.pool)
        .await
        .unwrap();
    let (old, _, old_ref) = &started[0];
    let (young, _, young_ref) = &started[1];
    sqlx::query("UPDATE worker_pool SET created_at = now() - interval '61 seconds' WHERE id = $1")
        .bind(old)
        .execute(&h.pool)
        .await
        .unwrap();

    manager.reap_once().await.unwrap();
    wait_gone(pid_of(old_ref), SECONDS_5).await;
    assert!(
        alive(pid_of(young_ref)),
        "the younger pooled worker waits on"
    );
    let rows = pool_rows(&h).await;
    assert!(
        rows.iter().all(|(id, _, _)| id != old),
        "the retired slot's row is removed once its worker is stopped: {rows:?}"
    );
    let states: Vec<(&uuid::Uuid, &str)> = rows.iter().map(|(id, s, _)| (id, s.as_str())).collect();
    assert_eq!(states.len(), 2, "{states:?}");
    assert!(states.contains(&(young, "idle")), "{states:?}");
    assert!(
        states
            .iter()
            .any(|(id, s)| *id != young && *s == "starting"),
        "a replacement was started in the same pass: {states:?}"
    );
    stop_pool(&h).await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provision_retried_after_a_crash_between_claim_and_launch_launches() {
    let mut h = Harness::new().await;
    h.start(&[]);
    // A manager took the task, claimed the row and died before launching.
    let (session, chat) = h.insert_session("provisioning", "light").await;
    h.push_provision(session, chat, "light").await;

    let row = h.wait_state(session, "connecting", SECONDS_5).await;
    assert!(alive(row.pid()));
    assert_eq!(
        h.worker_env(session).await["WORKER_SESSION_ID"],
        session.0.to_string()
    );

    // The same task delivered again changes nothing.
    h.push_provision(session, chat, "light").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = h.row(session).await;
    assert_eq!(again.state, "connecting");
    assert_eq!(again.worker_ref, row.worker_ref);
    h.finish().await;
}

/// O3: a Provision delivered again while the live manager that claimed
/// it still launches is left to that manager (no second worker); once that manager's
/// lease has lapsed (it died mid-launch), the retried task takes the session over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provision_claimed_by_a_live_manager_is_taken_over_only_once_its_lease_lapses() {
    let mut h = Harness::new().await;
    let (session, chat) = h.insert_session("provisioning", "light").await;
    let other = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO replicas (id, kind, lease_until)
         VALUES ($1, 'runtime-manager', now() + interval '3 seconds')",
    )
    .bind(other)
    .execute(&h.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE agent_runtime_sessions SET manager_replica = $2 WHERE id = $1")
        .bind(session.0)
        .bind(other)
        .execute(&h.pool)
        .await
        .unwrap();
    h.start(&[]);
    h.push_provision(session, chat, "light").await;

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let row = h.row(session).await;
    assert_eq!(row.state, "provisioning", "{row:?}");
    assert_eq!(row.worker_ref, None);
    assert!(
        !h.workspace(session).join("env.txt").exists(),
        "no second worker while the claimer lives"
    );

    // The claimer's lease lapses: the retried task takes the provision over.
    let row = h
        .wait_state(session, "connecting", Duration::from_secs(15))
        .await;
    assert!(alive(row.pid()));
    let ours: Vec<uuid::Uuid> = h
        .manager_leases()
        .await
        .into_iter()
        .filter(|(id, live)| *id != other && *live)
        .map(|(id, _)| id)
        .collect();
    let (claimer,): (Option<uuid::Uuid>,) =
        sqlx::query_as("SELECT manager_replica FROM agent_runtime_sessions WHERE id = $1")
            .bind(session.0)
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(claimer.map(|c| vec![c]), Some(ours));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_stops_the_worker_of_a_session_failed_elsewhere() {
    let mut h = Harness::new().await;
    h.start(&[]);
    let session = h.provision("light").await;
    let row = h.wait_state(session, "connecting", SECONDS_5).await;
    let pid = row.pid();
    let grandchild = h.grandchild(session).await;

    // The brain saw the worker stop answering.
    sqlx::query(
        "UPDATE agent_runtime_sessions
         SET state = 'failed', failure_reason = 'heartbeat_lost', updated_at = now()
         WHERE id = $1",
    )
    .bind(session.0)
    .execute(&h.pool)
    .await
    .unwrap();
    wait_gone(pid, SECONDS_5).await;
    wait_gone(grandchild, SECONDS_5).await;
    let row = h.row(session).await;
    assert_eq!(row.state, "failed");
    assert_eq!(row.failure_reason.as_deref(), Some("heartbeat_lost"));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_start_sessions_whose_worker_vanished_fail_and_running_ones_are_kept() {
    let mut h = Harness::new().await;
    // Pids of processes that have exited.
    let mut dead = Vec::new();
    for _ in 0..2 {
        let mut child = tokio::process::Command::new("true").spawn().unwrap();
        dead.push(child.id().unwrap());
        child.wait().await.unwrap();
    }
    let set_worker = |session: protocol::SessionId, state: &'static str, worker_ref: String| {
        let pool = h.pool.clone();
        async move {
            sqlx::query(
                "UPDATE agent_runtime_sessions SET state = $2, worker_ref = $3 WHERE id = $1",
            )
            .bind(session.0)
            .bind(state)
            .bind(worker_ref)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let (ready_gone, _) = h.insert_session("pending", "light").await;
    set_worker(ready_gone, "ready", format!("local:{}", dead[0])).await;
    let (connecting_gone, _) = h.insert_session("pending", "light").await;
    set_worker(connecting_gone, "connecting", format!("local:{}", dead[1])).await;
    let (unlaunched, _) = h.insert_session("provisioning", "light").await;
    // A worker a previous manager launched, still running.
    let (survivor, _) = h.insert_session("pending", "light").await;
    let workspace = h.workspace(survivor);
    std::fs::create_dir_all(&workspace).unwrap();
    let mut orphan = tokio::process::Command::new(&h.worker_bin)
        .env("WORKER_WORKSPACE", &workspace)
        .process_group(0)
        .spawn()
        .unwrap();
    let orphan_pid = orphan.id().unwrap();
    set_worker(survivor, "ready", format!("local:{orphan_pid}")).await;

    h.start(&[]);
    let row = h.wait_state(ready_gone, "failed", SECONDS_5).await;
    assert_eq!(row.failure_reason.as_deref(), Some("heartbeat_lost"));
    assert_eq!(
        row.failure_detail.as_deref(),
        Some("worker_gone_on_restart")
    );
    let row = h.wait_state(connecting_gone, "failed", SECONDS_5).await;
    assert_eq!(row.failure_reason.as_deref(), Some("dial_timeout"));
    assert_eq!(
        row.failure_detail.as_deref(),
        Some("worker_gone_on_restart")
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        h.row(unlaunched).await.state,
        "provisioning",
        "left for its retried task"
    );
    assert_eq!(h.row(survivor).await.state, "ready");
    assert!(alive(orphan_pid), "a running worker is kept");

    // ...and tracked: when its session ends, the reaper stops it.
    sqlx::query("UPDATE agent_runtime_sessions SET state = 'terminated' WHERE id = $1")
        .bind(survivor.0)
        .execute(&h.pool)
        .await
        .unwrap();
    let stopped = tokio::time::timeout(SECONDS_5, orphan.wait()).await;
    assert!(stopped.is_ok(), "the adopted worker was stopped");
    h.finish().await;
}
