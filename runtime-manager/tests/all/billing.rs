//! Worker-seconds billing (SPEC E1) at the statement: sweeps racing over the same rows,
//! a sweep that fails, and the events of a session tiling its lifetime exactly. The end to
//! end version (real workers, a manager killed, idle teardown) is in
//! `brain/tests/all/workers.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::Harness;
use protocol::SessionId;
use runtime_manager::store::Store;

const SECOND: Duration = Duration::from_secs(1);

/// A session whose worker was launched `ago_ms` ago (the launch sets `billing_from`;
/// it is then moved back in time).
async fn launched(h: &Harness, ago_ms: i64) -> SessionId {
    let (session, _) = h.insert_session("connecting", "light").await;
    sqlx::query("UPDATE agent_runtime_sessions SET worker_ref = 'local:1' WHERE id = $1")
        .bind(session.0)
        .execute(&h.pool)
        .await
        .unwrap();
    let (set,): (bool,) = sqlx::query_as(
        "UPDATE agent_runtime_sessions
         SET billing_from = billing_from - make_interval(secs => $2::float8 / 1000)
         WHERE id = $1 RETURNING billing_from IS NOT NULL",
    )
    .bind(session.0)
    .bind(ago_ms)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert!(set, "setting the worker started the billed lifetime");
    session
}

/// The session's events: (key, ms since billing_from at the interval's end, seconds).
async fn events(h: &Harness, session: SessionId) -> Vec<(String, i64, f64)> {
    sqlx::query_as(
        "SELECT e.event_key,
                round(extract(epoch FROM e.created_at - s.billing_from) * 1000)::int8,
                e.seconds
         FROM billing_events e JOIN agent_runtime_sessions s ON s.id = $1
         WHERE e.kind = 'worker_seconds' AND e.event_key LIKE 'worker:' || $1 || ':%'
           AND e.team_id = s.team_id AND e.agent_id = s.agent_id AND e.model IS NULL
         ORDER BY e.created_at",
    )
    .bind(session.0)
    .fetch_all(&h.pool)
    .await
    .unwrap()
}

/// `ended_at - billing_from`, in seconds.
async fn lifetime(h: &Harness, session: SessionId) -> f64 {
    let (seconds,): (f64,) = sqlx::query_as(
        "SELECT extract(epoch FROM ended_at - billing_from)::float8
         FROM agent_runtime_sessions WHERE id = $1",
    )
    .bind(session.0)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    seconds
}

/// Each event begins where the one before it ended (the first at `billing_from`).
fn assert_tiled(events: &[(String, i64, f64)]) {
    let mut reached_ms = 0.0;
    for (key, end_ms, seconds) in events {
        let start_ms = *end_ms as f64 - seconds * 1000.0;
        assert!(
            (start_ms - reached_ms).abs() < 1.0,
            "{key} starts at {start_ms} ms, the events before reach {reached_ms} ms: {events:?}"
        );
        reached_ms = *end_ms as f64;
    }
}

/// `n` sweeps at once over two connection pools, as replicas would: what they wrote.
async fn race(stores: &[Store; 2], n: usize, interval: Duration) -> (i64, i64) {
    let sweeps = (0..n).map(|i| stores[i % 2].bill_worker_seconds(interval, 500));
    let results = futures_util::future::join_all(sweeps).await;
    results.into_iter().fold((0, 0), |(events, closed), r| {
        let r = r.unwrap();
        (events + r.events, closed + r.closed)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_sweeps_bill_each_interval_once_and_the_events_tile_the_lifetime() {
    let h = Harness::new().await;
    let url = test_support::db::db_url(&h.db_name);
    let stores = [
        Store::connect(&url, false).await.unwrap(),
        Store::connect(&url, false).await.unwrap(),
    ];
    let live = launched(&h, 10_350).await;
    // Launched a moment ago: not due anything yet.
    let fresh = launched(&h, 300).await;
    // Never launched: never billed, even once it ends.
    let (unlaunched, _) = h.insert_session("pending", "light").await;

    let (written, closed) = race(&stores, 8, SECOND).await;
    assert_eq!((written, closed), (10, 0), "ten full seconds, once");
    let billed = events(&h, live).await;
    assert_eq!(billed.len(), 10);
    assert_tiled(&billed);
    assert!(billed.iter().all(|(_, _, s)| *s == 1.0));
    assert_eq!(billed[0].0, format!("worker:{}:1000", live.0));
    assert!(events(&h, fresh).await.is_empty());
    // Nothing new is due: a sweep writes nothing.
    assert_eq!(race(&stores, 2, SECOND).await, (0, 0));

    // The session ends (whichever process writes it): the rest is its final event.
    for session in [live, unlaunched] {
        sqlx::query(
            "UPDATE agent_runtime_sessions SET state = 'failed', failure_reason = 'heartbeat_lost'
             WHERE id = $1",
        )
        .bind(session.0)
        .execute(&h.pool)
        .await
        .unwrap();
    }
    let (written, closed) = race(&stores, 8, SECOND).await;
    assert_eq!((written, closed), (1, 1), "one final event");
    let billed = events(&h, live).await;
    assert_eq!(billed.len(), 11);
    assert_eq!(billed[10].0, format!("worker:{}:final", live.0));
    assert_tiled(&billed);
    let total: f64 = billed.iter().map(|(_, _, s)| s).sum();
    let lived = lifetime(&h, live).await;
    assert!(
        (total - lived).abs() < 1e-3,
        "{total} s billed, {lived} s lived"
    );
    assert!(lived > 10.35, "{lived}");
    assert_eq!(
        race(&stores, 2, SECOND).await,
        (0, 0),
        "a closed session stays closed"
    );
    let (unbilled,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM billing_events WHERE event_key LIKE 'worker:' || $1 || ':%'",
    )
    .bind(unlaunched.0)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(unbilled, 0);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_that_fails_bills_nothing_and_the_next_one_bills_those_intervals_once() {
    let h = Harness::new().await;
    let store = Store::connect(&test_support::db::db_url(&h.db_name), false)
        .await
        .unwrap();
    let session = launched(&h, 3_500).await;
    // A writer that dies mid-statement: its insert fails after some rows went in.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_third() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.event_key LIKE '%:3000' THEN RAISE EXCEPTION 'writer lost'; END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_third BEFORE INSERT ON billing_events
           FOR EACH ROW EXECUTE FUNCTION refuse_third();",
    )
    .execute(&h.pool)
    .await
    .unwrap();
    assert!(store.bill_worker_seconds(SECOND, 500).await.is_err());
    assert!(events(&h, session).await.is_empty(), "all or nothing");
    let (until,): (Option<f64>,) = sqlx::query_as(
        "SELECT extract(epoch FROM billed_until)::float8 FROM agent_runtime_sessions WHERE id = $1",
    )
    .bind(session.0)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(until, None, "progress is not recorded without its events");

    sqlx::raw_sql("DROP TRIGGER refuse_third ON billing_events")
        .execute(&h.pool)
        .await
        .unwrap();
    let billed = store.bill_worker_seconds(SECOND, 500).await.unwrap();
    assert_eq!((billed.sessions, billed.events), (1, 3));
    let keys: Vec<String> = events(&h, session).await.into_iter().map(|e| e.0).collect();
    let id = session.0;
    assert_eq!(
        keys,
        [
            format!("worker:{id}:1000"),
            format!("worker:{id}:2000"),
            format!("worker:{id}:3000")
        ]
    );
    // A sweep whose progress was lost (billed_until rolled back by hand) rewrites nothing.
    sqlx::query("UPDATE agent_runtime_sessions SET billed_until = NULL WHERE id = $1")
        .bind(session.0)
        .execute(&h.pool)
        .await
        .unwrap();
    assert_eq!(
        store.bill_worker_seconds(SECOND, 500).await.unwrap().events,
        0
    );
    assert_eq!(events(&h, session).await.len(), 3);
    h.finish().await;
}

/// L4: a session started for an end user bills its worker-seconds to that user (and one
/// of an API key's turn to nobody), so the user's daily budget counts them.
#[tokio::test]
async fn a_users_session_bills_its_seconds_to_that_user() {
    let h = Harness::new().await;
    let store = Store::connect(&test_support::db::db_url(&h.db_name))
        .await
        .unwrap();
    let users = launched(&h, 2_500).await;
    let keys = launched(&h, 2_500).await;
    sqlx::query("UPDATE agent_runtime_sessions SET user_id = 'alice' WHERE id = $1")
        .bind(users.0)
        .execute(&h.pool)
        .await
        .unwrap();
    let billed = store.bill_worker_seconds(SECOND, 500).await.unwrap();
    assert_eq!(billed.events, 4);
    let owners: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT event_key, user_id FROM billing_events WHERE kind = 'worker_seconds' \
         ORDER BY event_key",
    )
    .fetch_all(&h.pool)
    .await
    .unwrap();
    assert_eq!(owners.len(), 4);
    for (key, user) in owners {
        let expected = key
            .starts_with(&format!("worker:{}:", users.0))
            .then_some("alice");
        assert!(
            key.starts_with(&format!("worker:{}:", keys.0)) || expected.is_some(),
            "{key}"
        );
        assert_eq!(user.as_deref(), expected, "{key}");
    }
    h.finish().await;
}
