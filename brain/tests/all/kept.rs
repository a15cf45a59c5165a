//! `dbpool`'s kept connections: a statement that completed keeps its connection for the
//! next one, out of sqlx's release and the ping it sends on every release. The pools here
//! count their releases (sqlx's `after_release` runs on each, just before that ping), so a
//! kept connection shows as a release that did not happen.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dbpool::Db;
use futures_util::future::join_all;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};
use test_support::db::admin_url;

use crate::erasure::eventually;

/// A pool of `max` connections that counts the connections released to it.
async fn counting_pool(max: u32) -> (PgPool, Arc<AtomicUsize>) {
    let released = Arc::new(AtomicUsize::new(0));
    let counter = released.clone();
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(2))
        .after_release(move |_, _| {
            counter.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(true) })
        })
        .connect(&admin_url())
        .await
        .unwrap();
    // Every connection open and idle first, so that statements run at once each find one
    // at once, and their count says how many were kept.
    let all: Vec<_> = join_all((0..max).map(|_| pool.acquire())).await;
    drop(all);
    eventually(Duration::from_secs(5), "the pool filled", || async {
        pool.num_idle() == max as usize
    })
    .await;
    released.store(0, Ordering::SeqCst);
    (pool, released)
}

/// Runs `n` statements one after another, each of the three ways callers run them, and
/// checks each answer.
async fn statements(db: &Db, n: i32) {
    for i in 0..n {
        let one: i32 = sqlx::query_scalar("SELECT $1::int4")
            .bind(i)
            .fetch_one(db)
            .await
            .unwrap();
        assert_eq!(one, i);
        let all = sqlx::query("SELECT generate_series(1, $1)")
            .bind(i % 5 + 1)
            .fetch_all(db)
            .await
            .unwrap();
        assert_eq!(all.len() as i32, i % 5 + 1);
        assert_eq!(all.last().unwrap().get::<i32, _>(0), i % 5 + 1);
        sqlx::query("SELECT 1").execute(db).await.unwrap();
    }
}

#[tokio::test]
async fn a_statement_that_completed_keeps_its_connection_and_skips_the_release_ping() {
    let (pool, released) = counting_pool(4).await;
    let kept = Db::direct_keeping(pool.clone(), 2, Duration::from_secs(10));
    statements(&kept, 50).await;
    assert_eq!(
        released.load(Ordering::SeqCst),
        0,
        "150 statements, no release"
    );
    assert_eq!(
        kept.kept_connections(),
        1,
        "one at a time needs one connection"
    );

    // The same statements on the pool as sqlx runs them: each releases its connection,
    // which is what the count above would have seen without keeping.
    let plain = Db::direct(pool.clone());
    statements(&plain, 50).await;
    eventually(
        Duration::from_secs(5),
        "each statement released",
        || async { released.load(Ordering::SeqCst) == 150 },
    )
    .await;
    kept.close().await;
}

#[tokio::test]
async fn a_failed_or_dropped_statement_goes_back_through_the_ping_and_the_next_is_whole() {
    let (pool, released) = counting_pool(3).await;
    let db = Db::direct_keeping(pool, 1, Duration::from_secs(10));
    statements(&db, 1).await;
    assert_eq!(db.kept_connections(), 1);

    let failed = sqlx::query("SELECT 1 / 0").execute(&db).await;
    assert!(failed.is_err());
    eventually(
        Duration::from_secs(5),
        "the failed statement's release",
        || async { released.load(Ordering::SeqCst) == 1 },
    )
    .await;
    assert_eq!(db.kept_connections(), 0);
    statements(&db, 3).await;

    // Dropped while Postgres still runs it: the connection is mid-exchange, and only the
    // release's ping (which waits out the answer) may lend it again.
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        sqlx::query("SELECT pg_sleep(0.3), 'late'").fetch_one(&db),
    )
    .await;
    assert!(dropped.is_err(), "the sleep outlasts the timeout");
    assert_eq!(db.kept_connections(), 0);
    let answer: String = sqlx::query_scalar("SELECT 'next'")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(answer, "next", "not the dropped statement's answer");
    eventually(
        Duration::from_secs(5),
        "the dropped statement's release",
        || async { released.load(Ordering::SeqCst) == 2 },
    )
    .await;
    db.close().await;
}

#[tokio::test]
async fn kept_connections_never_starve_a_transaction_or_a_caller_waiting_on_the_pool() {
    let (pool, released) = counting_pool(4).await;
    let db = Db::direct_keeping(pool.clone(), 4, Duration::from_secs(10));
    // Two at once with connections to spare: both end up kept. Then the spares are taken.
    join_all((0..2).map(|_| sqlx::query("SELECT pg_sleep(0.05)").execute(&db))).await;
    assert_eq!(db.kept_connections(), 2);
    let spare = (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());

    // The pool itself has nothing to lend within its 2 s; the transaction takes a kept one.
    let mut tx = db
        .begin()
        .await
        .expect("a kept connection, not the pool's timeout");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(one, 1);
    tx.commit().await.unwrap();
    assert_eq!(db.kept_connections(), 1);
    // A transaction's connection goes back through sqlx, as every transaction's does.
    eventually(
        Duration::from_secs(5),
        "the transaction's release",
        || async { released.load(Ordering::SeqCst) == 1 },
    )
    .await;

    // Every connection out (one kept, one running a statement, the spares): a caller
    // waiting on the pool itself gets the statement's when it completes, not a timeout.
    let kept_one = db.begin().await.unwrap();
    let running = tokio::spawn({
        let db = db.clone();
        async move { sqlx::query("SELECT pg_sleep(1)").execute(&db).await }
    });
    // Once the statement has the last idle connection, the pool has nothing left to lend.
    while pool.num_idle() > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waiting = tokio::time::timeout(Duration::from_secs(3), pool.acquire())
        .await
        .expect("the completed statement's connection, released to the pool")
        .unwrap();
    running.await.unwrap().unwrap();
    drop((waiting, spare, kept_one));
    db.close().await;
}

#[tokio::test]
async fn a_stale_connection_goes_back_to_the_pool_and_close_does_not_wait_for_kept_ones() {
    let (pool, released) = counting_pool(5).await;
    let db = Db::direct_keeping(pool.clone(), 4, Duration::from_secs(1));
    join_all((0..3).map(|_| sqlx::query("SELECT pg_sleep(0.05)").execute(&db))).await;
    assert_eq!(db.kept_connections(), 3);

    // Past `fresh_for` the top one is stale, and so are those kept before it: all go back
    // through the release's ping rather than one being lent unchecked.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    statements(&db, 1).await;
    eventually(
        Duration::from_secs(5),
        "the stale ones released",
        || async { released.load(Ordering::SeqCst) == 3 },
    )
    .await;
    assert_eq!(db.kept_connections(), 1);

    tokio::time::timeout(Duration::from_secs(5), db.close())
        .await
        .expect("close gives the kept connection back instead of waiting for it");
    assert!(pool.is_closed());
}
