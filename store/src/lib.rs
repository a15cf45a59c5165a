//! Postgres: everything that must survive a turn (SPEC "What survives a turn").
//!
//! One file per aggregate (teams and keys, agents, chats and messages, turns and billing).
//! Every query takes the caller's `TeamId` and filters on it, so a row of another team is
//! indistinguishable from a missing one (`StoreError::NotFound`).
//!
//! Architecture invariant: SQL lives in this module only; the rest of the brain sees typed
//! rows and semantic errors.

mod a2a;
mod agent_admin;
mod agent_openai;
mod agents;
mod approvals;
mod artifacts;
mod audit;
pub mod channels;
mod chat_files;
mod chat_search;
mod chats;
mod connectors;
mod cron;
mod egress;
mod erasure;
mod issuers;
mod knowledge;
mod memories;
mod oauth;
mod pool;
mod provider_connections;
mod queue;
mod quotas;
mod replicas;
mod retention;
mod secrets;
mod server_keys;
mod sessions;
mod skills;
mod snapshots;
mod takeover;
mod teams;
mod turns;
mod usage;
mod users;
pub mod webhooks;

use std::borrow::Cow;
use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{ConnectOptions, PgPool, SqlStr};

pub use a2a::{PushConfig, TaskFilter};
pub use agents::{
    AgentRow, AgentUpdate, AuxiliaryModels, BusyPolicy, DisconnectPolicy, KnowledgeRecall,
    MemoryRecall, NewAgent,
};
pub use approvals::{
    Answer, Answered, Answerer, ApprovalRow, Asking, Close, NewApproval, NewElicitation, Stranded,
    requested_part,
};
pub use artifacts::{ArtifactRow, NewArtifact};
pub use audit::{Action, Actor, ActorKind, AuditEntry, AuditFilter};
pub use chat_files::{ChatFileRow, DescriptionClaim, FileInsert, NewChatFile};
pub use chat_search::{ChatHit, ChatsOf};
pub use chats::{
    BasisCheck, BasisVersions, ChatOwner, ChatRow, KeptHistoryCheck, MessageRow, TurnBasis,
};
pub use connectors::{ConnectorRow, ConnectorTarget, NewConnector};
pub use cron::{Autostart, AutostartAt, Claimed, DueAutostart, FireOutcome, FireRow, ScheduleView};
pub use egress::{EgressParts, EgressRequest, MAX_EGRESS_REQUESTS};
pub use erasure::{Bulky, Erased, TeamErasure};
pub use issuers::{IssuerRow, MAX_ISSUERS};
pub use knowledge::{
    ChunkVectors, ClaimedJob, DocumentInsert, DocumentLimits, DocumentRow, DocumentStatus, JobEnd,
    KnowledgeBaseRow, NewChunk, NewDocument, Passage, sign_bits, vector_of,
};
pub use memories::{CallKey, MemoryRow, MemoryScope};
pub use oauth::{AuthorizationCounts, GrantOwner, LockedError, TakenFlow, state_hash};
pub use pool::RemoteClaim;
pub use provider_connections::{
    ConnectionKeyed, LastError, MAX_PROVIDER_CONNECTIONS, NewProviderConnection,
    ProviderConnectionChange, ProviderConnectionRow,
};
pub use queue::{Enqueued, NewQueued, QueuedTurn};
pub use quotas::{BilledBefore, QuotaSettings, SessionUsage, Since, TurnUsage};
pub use replicas::BRAIN as BRAIN_REPLICA;
pub use retention::{Expiring, RetentionLock};
pub use secrets::{AgentSecrets, EgressValue, SecretInfo, SecretsError, SecretsKey};
pub use sessions::{NewSession, SessionRow};
pub use skills::{NewSkill, SkillFile, SkillInsert, SkillRow};
pub use snapshots::{NewSnapshot, Restorable, SnapshotRow, SnapshotTarget};
pub use takeover::{Resumable, TakenOver};
pub use teams::{
    CreatedTeam, KEY_PREFIX, KeyAuth, KeyRow, TeamChange, TeamRow, TeamStatus, Within, key_hash,
    new_key,
};
pub use turns::{
    AssistantMessage, Begun, FrozenComposition, ModelCallUsage, NewTurn, Started, TurnEnd,
    TurnProgress, TurnRecord, TurnRow, TurnState, TurnStatus, TurnTrigger, storable_text,
};
pub use usage::{ModelTokens, UsageGroup, UsageQuery, UsageReport, UsageRow, UsageSums};
pub use users::TeamUser;

/// A row of a listing ordered by creation (its time, then its id): a page starts after (or
/// before, newest first) it (L3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keyset {
    pub at: chrono::DateTime<chrono::Utc>,
    pub id: uuid::Uuid,
}

/// The condition that keeps the rows of a page after `$at`/`$id` (as SQL parameters) in
/// the listing's order: `<` newest first, `>` oldest first; none without a cursor.
fn keyset_after(order: &str, at: &str, id: &str) -> String {
    format!("({at}::timestamptz IS NULL OR (created_at, id) {order} ({at}, {id}::uuid))")
}

/// Semantic store failures; the HTTP layer maps them to status codes.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    /// A uniqueness rule was hit; the label names which.
    #[error("conflict: {0}")]
    Conflict(&'static str),
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error("stored data is malformed: {0}")]
    Corrupt(String),
    /// The database did not answer within the caller's bound.
    #[error("database timed out")]
    TimedOut,
}

impl StoreError {
    /// A failure of the connection or of the server's state rather than of the statement
    /// (every pooled connection busy, a dropped connection, a server shutting down,
    /// out of resources, a serialization conflict): the same statement may succeed if
    /// tried again. The end-state write (a statement that is one implicit transaction) is
    /// retried on these; any other failure would fail again.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Database(
                sqlx::Error::PoolTimedOut
                | sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::Protocol(_)
                | sqlx::Error::WorkerCrashed,
            ) => true,
            // SQLSTATE classes 08 (connection), 40 (rollback: serialization, deadlock),
            // 53 (insufficient resources), 57 (operator intervention: shutdown, cancel).
            Self::Database(sqlx::Error::Database(db)) => db
                .code()
                .is_some_and(|code| ["08", "40", "53", "57"].iter().any(|c| code.starts_with(c))),
            Self::TimedOut => true,
            _ => false,
        }
    }

    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::Conflict(_) => "conflict",
            Self::Database(_) => "database",
            Self::Corrupt(_) => "corrupt",
            Self::TimedOut => "timeout",
        }
    }
}

/// Maps a unique violation of `constraint` to `Conflict(label)`.
fn unique_violation(err: sqlx::Error, constraint: &str, label: &'static str) -> StoreError {
    if let sqlx::Error::Database(db) = &err
        && db.is_unique_violation()
        && db.constraint() == Some(constraint)
    {
        return StoreError::Conflict(label);
    }
    StoreError::Database(err)
}

/// TLS to a loopback address encrypts traffic that never leaves the machine, and against a
/// local Postgres with `ssl = on` it was a sixth of the brain's CPU per turn
/// (measured in docs/design/performance-history.md, CPU per turn). So when the URL names
/// no `sslmode` and `PGSSLMODE` asks for nothing but `prefer`, a loopback host is reached
/// in the clear, as libpq reaches a Unix socket. A mode named in the URL, and every other host, keeps sqlx's rule (`prefer`: TLS
/// when the server offers it).
fn loopback_in_the_clear(url: &str, options: PgConnectOptions) -> PgConnectOptions {
    let named_in_url = url::Url::parse(url).map_or(true, |url| {
        url.query_pairs()
            .any(|(key, _)| key == "sslmode" || key == "ssl-mode")
    });
    if named_in_url || !matches!(options.get_ssl_mode(), PgSslMode::Prefer) {
        return options;
    }
    let host = options.get_host();
    let loopback = host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        options.ssl_mode(PgSslMode::Disable)
    } else {
        options
    }
}

/// The handle every request clones: a connection pool.
#[derive(Clone, Debug)]
pub struct Store {
    /// What every statement runs on: Postgres directly, or a transaction pooler (O5).
    pool: dbpool::Db,
    /// What a transaction pooler cannot carry: the migrations' advisory lock (held across
    /// their transactions) and `LISTEN`. The pool's own connections when there is no
    /// pooler (`DATABASE_DIRECT_URL` unset).
    direct: PgPool,
    /// The key secrets are encrypted under; `None` when the server has none (B1).
    secrets: Option<SecretsKey>,
    /// The recall scopes found without memories lately (M3), shared by the store's clones.
    unremembered: memories::Unremembered,
}

/// The default of `BRAIN_DATABASE_STATEMENT_TIMEOUT_MS`: under [`CALL_BOUND`], so a
/// statement stuck behind a lock is cancelled by Postgres (its locks and its connection
/// freed) by the time the request that waited for it gives up.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(4);

/// What Postgres is asked to do about each of the pool's connections, as startup
/// parameters (so they hold from the first statement, with no round trip of their own):
/// cancel a statement past `statement_timeout`, and probe an idle link with TCP
/// keepalives so a brain that vanished (node lost, partition) stops holding a backend
/// and its locks within about a minute rather than the kernel's two hours. sqlx has no
/// client-side keepalive; the brain's side is bounded by [`bounded`] instead.
fn session_settings(statement_timeout: Duration) -> [(&'static str, String); 4] {
    [
        (
            "statement_timeout",
            format!("{}ms", statement_timeout.as_millis()),
        ),
        ("tcp_keepalives_idle", "30".into()),
        ("tcp_keepalives_interval", "10".into()),
        ("tcp_keepalives_count", "3".into()),
    ]
}

/// The direct connections a replica holds beside a pooler's: the snapshot listener's, and
/// the migrations' while they run.
const DIRECT_CONNECTIONS: u32 = 2;

/// Connect options for Postgres itself: the session settings ride in the startup packet.
fn direct_options(url: &str, statement_timeout: Duration) -> Result<PgConnectOptions, StoreError> {
    Ok(loopback_in_the_clear(url, url.parse()?)
        .options(session_settings(statement_timeout))
        .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(1)))
}

/// The settings of every pool of the store, at most `max_connections` connections.
fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        // A ping before every checkout doubles each query's round trips. A connection
        // in steady use is not pinged: if it died, its query fails and the pool
        // replaces it. One that sat idle through an outage is: otherwise each dead
        // idle connection fails one request after the database is back.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for < PING_IF_IDLE_FOR {
                    return Ok(true);
                }
                // `false` drops the connection and the pool opens or takes another.
                Ok(matches!(
                    tokio::time::timeout(PING_TIMEOUT, sqlx::Connection::ping(conn)).await,
                    Ok(Ok(()))
                ))
            })
        })
}

impl Store {
    /// A pool under [`DEFAULT_STATEMENT_TIMEOUT`].
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Self::connect_with(url, max_connections, DEFAULT_STATEMENT_TIMEOUT).await
    }

    /// A pool of at most `max_connections` whose statements Postgres cancels past
    /// `statement_timeout` (`BRAIN_DATABASE_STATEMENT_TIMEOUT_MS`).
    pub async fn connect_with(
        url: &str,
        max_connections: u32,
        statement_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let pool = pool_options(max_connections)
            .connect_with(direct_options(url, statement_timeout)?)
            .await?;
        // Half the pool at most is kept between statements: what reads the pool itself
        // (the snapshot listener, migrations, tests) always has the other half.
        let keep = (max_connections as usize / 2).max(1);
        Ok(Self {
            pool: dbpool::Db::direct_keeping(pool.clone(), keep, PING_IF_IDLE_FOR),
            direct: pool,
            secrets: None,
            unremembered: Default::default(),
        })
    }

    /// A pool of at most `max_connections` through the transaction pooler at `url`, and
    /// the few connections of [`Store::direct`] to Postgres itself at `direct_url`
    /// (`DATABASE_DIRECT_URL`): O5, `dbpool` says what changes behind a pooler.
    pub async fn connect_behind_pooler(
        url: &str,
        direct_url: &str,
        max_connections: u32,
        statement_timeout: Duration,
    ) -> Result<Self, StoreError> {
        // No startup parameters but the ones PgBouncer tracks: it refuses the others
        // (`options`), and sqlx's `extra_float_digits` only matters to floats read as text.
        let options = dbpool::for_pooler(loopback_in_the_clear(url, url.parse()?))
            .extra_float_digits(None)
            .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(1));
        let pool = pool_options(max_connections).connect_with(options).await?;
        // Dialed when first needed: a replica whose migrations are done holds one.
        let direct = pool_options(DIRECT_CONNECTIONS)
            .connect_lazy_with(direct_options(direct_url, statement_timeout)?);
        Ok(Self {
            pool: dbpool::Db::behind_pooler(pool, Some(statement_timeout)),
            direct,
            secrets: None,
            unremembered: Default::default(),
        })
    }

    /// [`Store::connect_behind_pooler`] when there is a `direct_url`, else
    /// [`Store::connect_with`]: the configuration's choice.
    pub async fn connect_configured(
        url: &str,
        direct_url: Option<&str>,
        max_connections: u32,
        statement_timeout: Duration,
    ) -> Result<Self, StoreError> {
        match direct_url {
            Some(direct) => {
                Self::connect_behind_pooler(url, direct, max_connections, statement_timeout).await
            }
            None => Self::connect_with(url, max_connections, statement_timeout).await,
        }
    }

    /// A store over a pool made elsewhere: the runtime-manager's, for the statements it
    /// shares with the brain (the egress proxy's configuration and ledger).
    pub fn from_db(db: dbpool::Db) -> Self {
        Self {
            direct: db.pool().clone(),
            pool: db,
            secrets: None,
            unremembered: Default::default(),
        }
    }

    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            pool: dbpool::Db::direct(pool.clone()),
            direct: pool,
            secrets: None,
            unremembered: Default::default(),
        }
    }

    /// The pool's connections, for what looks at rows directly (tests, the bench).
    pub fn pool(&self) -> &PgPool {
        self.pool.pool()
    }

    /// What statements run on, directly or through the pooler.
    pub fn db(&self) -> &dbpool::Db {
        &self.pool
    }

    /// Connections to Postgres itself, not through a pooler: for `LISTEN`.
    pub fn direct(&self) -> &PgPool {
        &self.direct
    }

    /// The pool's size: what the intake queue shares out (the brain's `intake`).
    pub fn max_connections(&self) -> u32 {
        self.pool.pool().options().get_max_connections()
    }

    /// Applies every migration not yet applied. Migrations are compiled into the binary so
    /// a container needs no files beside it.
    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        // A migration may rewrite a large table: it runs on a connection of its own without
        // the pool's statement timeout, and that connection is closed afterwards rather
        // than returned to the pool with the timeout lifted. It is a direct one: the
        // migrator's advisory lock is held across its transactions, which a transaction
        // pooler would spread over server connections (and leave one locked).
        let mut conn = self.direct.acquire().await?;
        conn.close_on_drop();
        sqlx::query("SET statement_timeout = 0")
            .execute(&mut *conn)
            .await?;
        migrator().run(&mut *conn).await
    }

    /// Refuses a database whose schema is newer than this binary's newest migration (O6):
    /// a brain of an older version would read and write rows whose meaning it does not
    /// know. A database with no schema yet, or an older one, passes (`brain migrate`
    /// brings it up).
    pub async fn check_schema(&self) -> Result<(), SchemaError> {
        let applied: Option<i64> = bounded(async {
            // Two statements: one naming an absent table fails as a whole, whatever
            // branch would have read it.
            let migrated: bool =
                sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
                    .fetch_one(&self.pool)
                    .await?;
            if !migrated {
                return Ok(None);
            }
            Ok(
                sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
                    .fetch_one(&self.pool)
                    .await?,
            )
        })
        .await?;
        schema_compatible(applied)
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

/// Creates the database named in `url` when it does not exist yet (`brain migrate` on a
/// fresh machine).
pub async fn create_database_if_missing(url: &str) -> Result<bool, sqlx::Error> {
    use sqlx::migrate::MigrateDatabase;
    if sqlx::Postgres::database_exists(url).await? {
        return Ok(false);
    }
    sqlx::Postgres::create_database(url).await?;
    Ok(true)
}

/// The bound on one store call of a request's path (auth, quotas): a database that does
/// not answer makes the request fail `store_unavailable` rather than hang.
pub const CALL_BOUND: Duration = Duration::from_secs(5);

/// Runs a store call under [`CALL_BOUND`]; past it, [`StoreError::TimedOut`].
///
/// A plain function, not an `async fn`: an `async fn` keeps `call` as its argument beside
/// the timeout that owns it, so every bounded call weighed twice in its caller's future
/// (a transaction's 15 KB became 30 KB in each request's handler).
pub fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> impl std::future::Future<Output = Result<T, StoreError>> {
    use futures_util::FutureExt;
    tokio::time::timeout(CALL_BOUND, call).map(|done| done.unwrap_or(Err(StoreError::TimedOut)))
}

/// A pooled connection idle this long is pinged before it is used again.
const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);
/// The bound on that ping: a connection that does not answer is replaced.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a brain may not serve a database.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "the database's schema is at version {database}, newer than this brain's newest \
         migration {binary}: run a brain of the version that migrated it, or newer"
    )]
    Newer { database: i64, binary: i64 },
    #[error("reading the schema version: {0}")]
    Store(#[from] StoreError),
}

/// The newest migration this binary knows.
pub fn newest_migration() -> i64 {
    MIGRATIONS.last().map_or(0, |&(version, _, _)| version)
}

fn schema_compatible(applied: Option<i64>) -> Result<(), SchemaError> {
    let binary = newest_migration();
    match applied {
        Some(database) if database > binary => Err(SchemaError::Newer { database, binary }),
        _ => Ok(()),
    }
}

/// Every migration in version order, `(version, description, SQL)`: the files of
/// `migrations/`, listed by `build.rs`.
const MIGRATIONS: &[(i64, &str, &str)] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

fn migrator() -> Migrator {
    let migrations = MIGRATIONS
        .iter()
        .map(|&(version, description, sql)| {
            Migration::new(
                version,
                Cow::Borrowed(description),
                MigrationType::Simple,
                SqlStr::from_static(sql),
                false,
            )
        })
        .collect();
    Migrator::with_migrations(migrations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_schema_is_refused_naming_both_versions() {
        let binary = newest_migration();
        assert!(binary >= 45, "the migrations folder is listed");
        let err = schema_compatible(Some(binary + 1)).unwrap_err().to_string();
        assert!(err.contains(&format!("version {}", binary + 1)), "{err}");
        assert!(err.contains(&format!("migration {binary}")), "{err}");
        assert!(schema_compatible(Some(binary)).is_ok());
        assert!(schema_compatible(Some(binary - 1)).is_ok());
        assert!(
            schema_compatible(None).is_ok(),
            "an empty database is migrated first"
        );
    }

    fn mode(url: &str) -> PgSslMode {
        let options: PgConnectOptions = url.parse().unwrap();
        loopback_in_the_clear(url, options).get_ssl_mode()
    }

    #[test]
    fn only_an_unnamed_mode_to_a_loopback_host_drops_tls() {
        let cases = [
            ("postgres://u@127.0.0.1:5432/db", "disable"),
            ("postgres://u@localhost/db", "disable"),
            ("postgres://u@[::1]:5432/db", "disable"),
            ("postgres://u@127.0.0.1/db?sslmode=prefer", "prefer"),
            ("postgres://u@127.0.0.1/db?sslmode=require", "require"),
            ("postgres://u@db.internal:5432/db", "prefer"),
            ("postgres://u@10.0.0.7/db", "prefer"),
        ];
        for (url, expected) in cases {
            let got = match mode(url) {
                PgSslMode::Disable => "disable",
                PgSslMode::Prefer => "prefer",
                PgSslMode::Require => "require",
                _ => "other",
            };
            assert_eq!(got, expected, "{url}");
        }
    }
}
