//! O5: the store behind a transaction pooler, Debian's PgBouncer 1.18 in `pool_mode =
//! transaction` (started here, one per test), with Postgres itself reached directly only
//! for what a pooler cannot carry (migrations, `LISTEN`).
//!
//! Each pooler lends few server connections, so clients take turns on them: whatever a
//! transaction left on a server connection (a lock, a `SET`, a named statement) would meet
//! the next client, and a statement whose two exchanges (Parse; Bind and Execute) landed
//! on different server connections would fail or run another client's SQL. The rest of the
//! subset that matters (turns, holds, quotas, events, stop, revocation, a worker through
//! the queue, autostart, retention) runs through a pooler under `TEST_THROUGH_PGBOUNCER=1`
//! (the Makefile's `pooler` target).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures_util::future::join_all;
use sqlx::Row;
use store::{DEFAULT_STATEMENT_TIMEOUT, Store};
use test_support::db::db_url;
use test_support::pgbouncer::PgBouncer;

use crate::erasure::eventually;

/// A migrated database of its own and a store reaching it through `pooler`.
async fn pooled_store(pooler: &PgBouncer, timeout: Duration) -> (Store, String) {
    let name = crate::common::migrated_database().await;
    let direct = db_url(&name);
    let store = Store::connect_behind_pooler(&pooler.url_for(&direct), &direct, 10, timeout)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    (store, name)
}

/// A client of the pooler as sqlx makes one by default (it names and caches statements),
/// of `connections` connections.
async fn plain_client(pooler: &PgBouncer, db: &str, connections: u32) -> sqlx::PgPool {
    let options: sqlx::postgres::PgConnectOptions = pooler.url_for(&db_url(db)).parse().unwrap();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections)
        .connect_with(options.extra_float_digits(None))
        .await
        .unwrap()
}

/// Twenty clients at once over two server connections, each with statements of its own
/// shapes: every answer is right through the store. The same load from a client as sqlx
/// makes one by default fails, which shows the pooler does lend server connections in
/// turn (a test that cannot fail otherwise).
#[tokio::test]
async fn statements_stay_whole_on_a_pooler_lending_server_connections_in_turn() {
    let pooler = PgBouncer::start(2);
    let (store, db) = pooled_store(&pooler, DEFAULT_STATEMENT_TIMEOUT).await;

    let runs = (0..20).map(|i| {
        let store = store.clone();
        async move {
            let team = store
                .create_team(&format!("team {i}"))
                .await
                .unwrap()
                .team_id;
            for days in 1..=10 {
                store
                    .set_retention_days(team, Some(days + i))
                    .await
                    .unwrap();
                assert_eq!(store.retention_days(team).await.unwrap(), Some(days + i));
            }
            team
        }
    });
    let teams = join_all(runs).await;
    assert_eq!(teams.len(), 20);
    let listed = store.retained_teams().await.unwrap();
    assert_eq!(listed.len(), 20, "{listed:?}");

    let plain = plain_client(&pooler, &db, 10).await;
    let tries = (0..20i64).map(|i| {
        let plain = plain.clone();
        async move {
            let mut failed = 0;
            for j in 0..40i64 {
                let sum: Result<i64, _> = if j % 2 == 0 {
                    sqlx::query_scalar("SELECT $1::int8 + 1")
                        .bind(i)
                        .fetch_one(&plain)
                        .await
                } else {
                    sqlx::query_scalar("SELECT $1::int8 + length($2::text)")
                        .bind(i)
                        .bind("x")
                        .fetch_one(&plain)
                        .await
                };
                failed += usize::from(sum.is_err());
            }
            failed
        }
    });
    let failed: usize = join_all(tries).await.into_iter().sum();
    assert!(
        failed > 0,
        "a default sqlx client never failed: is the pooler lending in turn?"
    );
}

/// The retention sweep's lock is refused to another replica while held and free once
/// dropped, through a pooler: a lock of the session would stay on the server connection
/// that took it and be granted again to whichever client that connection serves next.
#[tokio::test]
async fn the_retention_lock_is_held_by_its_transaction_not_by_a_server_connection() {
    let pooler = PgBouncer::start(2);
    let (store, _db) = pooled_store(&pooler, DEFAULT_STATEMENT_TIMEOUT).await;
    let held = store.take_retention_lock().await.unwrap();
    assert!(held.is_some());
    assert!(store.take_retention_lock().await.unwrap().is_none());
    drop(held);
    eventually(Duration::from_secs(5), "the lock is free again", || async {
        store.take_retention_lock().await.unwrap().is_some()
    })
    .await;
}

/// The statement timeout holds behind the pooler (a pooler refuses it as a startup
/// parameter), and it holds for the store's transaction only: the next client of the
/// same server connection sees the server's own setting.
#[tokio::test]
async fn the_statement_timeout_is_the_stores_and_does_not_reach_the_next_client() {
    let pooler = PgBouncer::start(1);
    let (store, db) = pooled_store(&pooler, Duration::from_millis(300)).await;
    let slow = sqlx::query("SELECT pg_sleep(2)").execute(store.db()).await;
    let code = match slow {
        Err(sqlx::Error::Database(e)) => e.code().map(|c| c.into_owned()),
        other => panic!("a statement past the timeout ran: {other:?}"),
    };
    assert_eq!(code.as_deref(), Some("57014"), "query_canceled");
    let within: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(store.db())
        .await
        .unwrap();
    assert_eq!(within, 1);

    // One server connection: the plain client is lent the very one the store just used.
    // A simple query (no statement named, so none to collide with what is left there).
    let plain = plain_client(&pooler, &db, 1).await;
    let theirs: String = sqlx::raw_sql("SHOW statement_timeout")
        .fetch_one(&plain)
        .await
        .unwrap()
        .get(0);
    assert_ne!(
        theirs, "300ms",
        "the store's timeout reached the next client"
    );
    // Nor did the migrations leave their advisory lock behind (they took it directly).
    let (advisory,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(store.db())
    .await
    .unwrap();
    assert_eq!(advisory, 0, "an advisory lock outlived its holder");
}
