//! The runtime-manager's Prometheus endpoint (SPEC O2, X4) against real Postgres and
//! Redis: launches, launch-to-ready, dial timeouts, sessions by state, a warm pool and the
//! queue's depth are counted as the rows imply; a sample that fails is omitted, never 0;
//! every scrape passes `promtool check metrics`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::{Harness, ThrowawayRedis};
use protocol::channel::SessionTask;
use protocol::{AgentId, ChatId, SessionId, TeamId};
use queue::SessionQueue;
use runtime_manager::metrics::Metrics;
use runtime_manager::store::Store;
use test_support::promtool::{check_metrics, sample};

const SECONDS_10: Duration = Duration::from_secs(10);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn scrape(addr: &str) -> String {
    let response = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4"
    );
    response.text().await.unwrap()
}

/// Scrapes until `name{labels}` reads `want`, or fails after 10 s.
async fn wait_value(addr: &str, name: &str, labels: &[(&str, &str)], want: f64) -> String {
    let deadline = Instant::now() + SECONDS_10;
    loop {
        let text = scrape(addr).await;
        if sample(&text, name, labels) == Some(want) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{name}{labels:?} is not {want}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launches_readiness_timeouts_sessions_and_pools_are_counted_and_pass_promtool() {
    let mut h = Harness::new().await;
    let profiles = h.dir.join("profiles.yaml");
    std::fs::write(&profiles, "profiles:\n  warm:\n    warmPoolSize: 1\n").unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    h.start(&[
        ("RUNTIME_MANAGER_METRICS_ADDR", &addr),
        ("RUNTIME_MANAGER_PROFILES", profiles.to_str().unwrap()),
        ("RUNTIME_MANAGER_DIAL_TIMEOUT_MS", "3000"),
    ]);

    // The pooled worker (a fake that never dials) is marked ready as the brain would, at
    // once: a slot still `starting` after the dial timeout is retired and started again.
    let deadline = Instant::now() + SECONDS_10;
    loop {
        let marked = sqlx::query(
            "UPDATE worker_pool SET state = 'idle' WHERE profile = 'warm' AND state = 'starting' \
             AND worker_ref IS NOT NULL",
        )
        .execute(&h.pool)
        .await
        .unwrap();
        if marked.rows_affected() == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no pooled worker was launched");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A cold session that becomes ready the way the brain moves it.
    let ready = h.provision("light").await;
    h.wait_state(ready, "connecting", SECONDS_10).await;
    sqlx::query(
        "UPDATE agent_runtime_sessions SET state = 'ready', updated_at = now() WHERE id = $1",
    )
    .bind(ready.0)
    .execute(&h.pool)
    .await
    .unwrap();
    // One that never dials, and one of a profile no manager knows.
    let silent = h.provision("light").await;
    let unknown = h.provision("made-up").await;
    h.wait_state(silent, "failed", SECONDS_10).await;
    h.wait_state(unknown, "failed", SECONDS_10).await;

    let text = wait_value(
        &addr,
        "runtime_manager_launch_to_ready_seconds_count",
        &[("profile", "light")],
        1.0,
    )
    .await;
    let text = if sample(&text, "runtime_manager_pool_idle", &[("profile", "warm")]) == Some(1.0) {
        text
    } else {
        wait_value(
            &addr,
            "runtime_manager_pool_idle",
            &[("profile", "warm")],
            1.0,
        )
        .await
    };
    let value = |name: &str, labels: &[(&str, &str)]| {
        sample(&text, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in\n{text}"))
    };
    let launches = |profile, outcome| {
        value(
            "runtime_manager_launches_total",
            &[("profile", profile), ("outcome", outcome)],
        )
    };
    assert_eq!(launches("light", "launched"), 2.0);
    assert_eq!(launches("unknown", "failed"), 1.0);
    assert_eq!(launches("warm", "launched"), 1.0);
    let ready_after = value(
        "runtime_manager_launch_to_ready_seconds_sum",
        &[("profile", "light")],
    );
    assert!(
        (0.0..SECONDS_10.as_secs_f64()).contains(&ready_after),
        "{ready_after}"
    );
    let failures = |reason| value("runtime_manager_failures_total", &[("reason", reason)]);
    assert_eq!(failures("dial_timeout"), 1.0);
    assert_eq!(failures("launch_failed"), 1.0);
    let actions = |action| {
        value(
            "runtime_manager_reaper_actions_total",
            &[("action", action)],
        )
    };
    assert_eq!(actions("dial_timeout"), 1.0);
    assert_eq!(actions("idle_check_armed"), 1.0);
    assert_eq!(actions("pool_started"), 1.0);
    let sessions = |state| value("runtime_manager_sessions", &[("state", state)]);
    assert_eq!(sessions("ready"), 1.0);
    for state in ["pending", "provisioning", "connecting", "terminating"] {
        assert_eq!(sessions(state), 0.0, "{state}");
    }
    assert_eq!(
        sample(&text, "runtime_manager_sessions", &[("state", "failed")]),
        None,
        "ended sessions are counted by reason, not as a state"
    );
    assert_eq!(
        value("runtime_manager_pool_size", &[("profile", "warm")]),
        1.0
    );
    assert_eq!(
        value("runtime_manager_pool_size", &[("profile", "light")]),
        0.0
    );
    assert_eq!(value("runtime_manager_queue_depth", &[]), 0.0);

    // X4: no session id, worker reference or unknown profile name in any label.
    for id in [ready, silent, unknown] {
        assert!(!text.contains(&id.0.to_string()), "{id:?} in\n{text}");
    }
    assert!(!text.contains("made-up") && !text.contains("local:"));
    check_metrics(&text);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_depth_counts_due_tasks_and_a_failed_sample_is_omitted_not_zero() {
    let h = Harness::new().await;
    let store = Store::connect(&h.config(&[]).database_url, false)
        .await
        .unwrap();
    let metrics = Metrics::new().unwrap();

    // No consumer on this queue: what is pushed stays.
    let redis = ThrowawayRedis::start().await;
    let queue = SessionQueue::connect_with_namespace(
        &redis_conn::Client::open(&redis.url, None).unwrap(),
        "test-rm-depth",
    )
    .await
    .unwrap();
    let task = || SessionTask::Provision {
        session: SessionId::new(),
        team: TeamId::new(),
        agent: AgentId::new(),
        chat: ChatId::new(),
        profile: "light".into(),
    };
    queue.push(task()).await.unwrap();
    queue.push(task()).await.unwrap();
    queue
        .push_after(task(), Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(
        queue.depth().await.unwrap(),
        2,
        "the delayed one is not due"
    );

    let text = metrics.scrape(&store, &queue).await;
    assert_eq!(sample(&text, "runtime_manager_queue_depth", &[]), Some(2.0));
    assert_eq!(
        sample(&text, "runtime_manager_sessions", &[("state", "ready")]),
        Some(0.0)
    );
    check_metrics(&text);

    // Redis gone: the depth is unknown, so it is absent, and the failure is counted.
    redis.kill().await;
    let started = Instant::now();
    let text = metrics.scrape(&store, &queue).await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "each sample is bounded"
    );
    assert_eq!(sample(&text, "runtime_manager_queue_depth", &[]), None);
    assert_eq!(
        sample(
            &text,
            "runtime_manager_sample_errors_total",
            &[("sample", "queue")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "runtime_manager_sessions", &[("state", "ready")]),
        Some(0.0),
        "the samples that worked are still there"
    );
    check_metrics(&text);

    h.finish().await;
}
