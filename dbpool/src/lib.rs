//! A Postgres pool that works the same reached directly or through a transaction pooler
//! (PgBouncer `pool_mode = transaction`, RDS Proxy, Supavisor): O5.
//!
//! A transaction pooler lends a server connection to a client for one transaction at a
//! time. sqlx runs a statement with arguments as two exchanges (Parse and Describe, Sync;
//! then Bind and Execute, Sync), and the pooler may hand the server connection to another
//! client in between. Against Debian's PgBouncer 1.18, 20 clients over 3 server
//! connections running 4,000 statements outside a transaction had them fail by the
//! hundreds, however the statements were named (sqlx's default, no statement cache, or
//! unnamed): `prepared statement "sqlx_s_5" does
//! not exist`, `... already exists` (every sqlx connection names its statements
//! `sqlx_s_1`, `sqlx_s_2`, ... and they stay on the server connection), and `bind message
//! supplies 1 parameters, but prepared statement "" requires 2`, which is another client's
//! unnamed statement: with the same parameter types it would have run that client's SQL.
//! Inside a transaction both exchanges reach one server connection, and the same runs had
//! no failure. So behind a pooler ([`Db::behind_pooler`]):
//!
//! - every statement runs in a transaction: one on the pool opens its own;
//! - every transaction begins with `DEALLOCATE ALL`, in the same round trip as `BEGIN`:
//!   the statements earlier clients left on the server connection are gone, so this
//!   client's names cannot collide with them;
//! - and with `SET LOCAL statement_timeout`, also in that round trip: a pooler refuses the
//!   startup parameter a direct connection carries it in, and a session `SET` would stay
//!   on the server connection for the pooler's next client;
//! - the connections cache no statements ([`for_pooler`]): a cached name would be bound on
//!   whichever server connection a later transaction is lent.
//!
//! The price: a statement on the pool takes 4 round trips (`BEGIN`; Parse and Describe;
//! Bind and Execute; `COMMIT`) where a cached one takes 1, and is planned every time.
//! Reached directly, [`Db`] is the pool itself, and with [`Db::direct_keeping`] it also
//! keeps the connections of statements that completed out of sqlx's release and its ping
//! ([`kept`]).
//! `brain/tests/all/pooler.rs` keeps a default sqlx client failing beside it.

mod kept;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, StreamExt, TryStreamExt};
use sqlx::postgres::{PgConnectOptions, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{AssertSqlSafe, Either, Execute, Executor, PgPool, Postgres, SqlStr, Transaction};

/// A pool of connections to Postgres, directly or through a transaction pooler.
#[derive(Clone, Debug)]
pub struct Db {
    pool: PgPool,
    /// How a transaction begins behind a pooler (see the crate's documentation); `None`
    /// reached directly.
    pooled_begin: Option<String>,
    /// Connections kept between statements (reached directly only).
    kept: Option<Arc<kept::Kept>>,
}

/// The connect options of a pool behind a transaction pooler: no statement cache. Startup
/// parameters other than those PgBouncer tracks are refused by it
/// (`unsupported startup parameter: options`): the caller sets none.
pub fn for_pooler(options: PgConnectOptions) -> PgConnectOptions {
    options.statement_cache_capacity(0)
}

impl Db {
    /// A pool reached directly: statements run as sqlx runs them.
    pub fn direct(pool: PgPool) -> Self {
        Self {
            pool,
            pooled_begin: None,
            kept: None,
        }
    }

    /// A pool reached directly that keeps up to `at_most` connections between statements,
    /// each for at most `fresh_for` idle ([`kept`]). A statement takes a kept connection
    /// before the pool's, and so does a transaction: what is kept never starves them.
    /// What reads the pool directly ([`Db::pool`]) has `at_most` connections fewer.
    pub fn direct_keeping(pool: PgPool, at_most: usize, fresh_for: Duration) -> Self {
        Self {
            pool,
            pooled_begin: None,
            kept: Some(Arc::new(kept::Kept::new(at_most, fresh_for))),
        }
    }

    /// A pool whose connections are a transaction pooler's, made with [`for_pooler`];
    /// Postgres cancels its statements past `statement_timeout` (`None`: the server's
    /// setting holds).
    pub fn behind_pooler(pool: PgPool, statement_timeout: Option<Duration>) -> Self {
        let mut begin = "BEGIN; DEALLOCATE ALL".to_owned();
        if let Some(timeout) = statement_timeout {
            begin += &format!("; SET LOCAL statement_timeout = {}", timeout.as_millis());
        }
        Self {
            pool,
            pooled_begin: Some(begin),
            kept: None,
        }
    }

    pub fn is_behind_pooler(&self) -> bool {
        self.pooled_begin.is_some()
    }

    /// The pool itself: what holds a connection (its size, closing it).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// How many connections are kept between statements now.
    pub fn kept_connections(&self) -> usize {
        self.kept.as_ref().map_or(0, |kept| kept.len())
    }

    /// Gives back the kept connections, then closes the pool (which waits for every
    /// connection out of it, so a pool closed alone would wait for the kept ones forever).
    pub async fn close(&self) {
        if let Some(kept) = &self.kept {
            kept.give_back();
        }
        self.pool.close().await;
    }

    /// A transaction on a connection of the pool: a kept one if there is one. It goes
    /// back through sqlx's release when the transaction ends, as every transaction's does.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        match (&self.pooled_begin, &self.kept) {
            (Some(begin), _) => self.pool.begin_with(AssertSqlSafe(begin.clone())).await,
            // How sqlx's own `Pool::begin` wraps a pooled connection (public, though
            // hidden from its docs; pinned by Cargo.lock, so a change fails the build).
            (None, Some(kept)) => Transaction::begin(kept.take(&self.pool).await?.conn, None).await,
            (None, None) => self.pool.begin().await,
        }
    }
}

impl<'p> Executor<'p> for &'_ Db {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if let Some(kept) = &self.kept {
            let (kept, pool) = (kept.clone(), self.pool.clone());
            // Read whole before the connection is kept: one the caller dropped part way
            // would be mid-exchange. An error or a drop sends it back through sqlx.
            return stream::once(async move {
                let mut held = kept.take(&pool).await?;
                let rows: Vec<_> = (&mut *held.conn).fetch_many(query).try_collect().await?;
                kept.keep(held, &pool);
                Ok::<_, sqlx::Error>(stream::iter(rows.into_iter().map(Ok)))
            })
            .try_flatten()
            .boxed();
        }
        if !self.is_behind_pooler() {
            return (&self.pool).fetch_many(query);
        }
        let db = self.clone();
        // The answer is read whole before the commit: a stream the caller dropped part way
        // would otherwise leave the transaction, and its server connection, open.
        stream::once(async move {
            let mut tx = db.begin().await?;
            let rows: Vec<_> = (&mut *tx).fetch_many(query).try_collect().await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(stream::iter(rows.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if let Some(kept) = &self.kept {
            let (kept, pool) = (kept.clone(), self.pool.clone());
            return Box::pin(async move {
                let mut held = kept.take(&pool).await?;
                let row = (&mut *held.conn).fetch_optional(query).await?;
                kept.keep(held, &pool);
                Ok(row)
            });
        }
        if !self.is_behind_pooler() {
            return (&self.pool).fetch_optional(query);
        }
        let db = self.clone();
        Box::pin(async move {
            let mut tx = db.begin().await?;
            let row = (&mut *tx).fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'p: 'e,
    {
        if !self.is_behind_pooler() {
            return (&self.pool).prepare_with(sql, parameters);
        }
        let db = self.clone();
        Box::pin(async move {
            let mut tx = db.begin().await?;
            let statement = (&mut *tx).prepare_with(sql, parameters).await?;
            tx.commit().await?;
            Ok(statement)
        })
    }
}
