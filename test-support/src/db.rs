//! A database of its own for each test, created from the admin URL (`TEST_DATABASE_URL`,
//! the local trust-auth Postgres by default). Databases older than an hour whose name has
//! the same prefix are dropped on the way: they belong to runs that crashed.
//!
//! A migrated one is a copy of a template migrated once per set of migrations
//! ([`migrated_database`]): `CREATE DATABASE ... TEMPLATE` copies files, which is much
//! cheaper than running every migration in every test.

use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{Connection, PgConnection};

pub const ADMIN_URL_DEFAULT: &str = "postgres://postgres:postgres@127.0.0.1:5432/postgres";

pub fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL").unwrap_or_else(|_| ADMIN_URL_DEFAULT.to_owned())
}

/// The URL of database `name` on the admin URL's server.
pub fn db_url(name: &str) -> String {
    let admin = admin_url();
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    format!("{base}/{name}")
}

/// Creates an empty database named `{prefix}_{unix seconds}_{uuid}` and returns its name;
/// the caller migrates it.
pub async fn fresh_database(prefix: &str) -> String {
    let mut admin = admin_connection().await;
    drop_stale(&mut admin, prefix).await;
    let name = new_name(prefix);
    execute(&mut admin, &format!("CREATE DATABASE \"{name}\""))
        .await
        .unwrap();
    let _ = admin.close().await;
    name
}

/// Creates a database named as [`fresh_database`] names it, as a copy of a template that
/// `migrate` (given the template's URL; it must close its connections before it returns)
/// brought up to the `.sql` files of `migrations`, and returns its name.
///
/// The template is named by a hash of those files, so a changed migration set gets a new
/// one, and is made once per set: the first test process to need it migrates it under an
/// advisory lock while the others wait (nextest runs each test in a process of its own).
/// A template is ready once connections to it are disallowed, the last step of making it:
/// one left without that mark by a process that died midway is made again. The caller
/// still runs its migrator on the copy, which finds nothing to do but checks that what
/// the template recorded matches it.
pub async fn migrated_database<F, Fut>(prefix: &str, migrations: &Path, migrate: F) -> String
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let template = format!("tpl_{prefix}_{:016x}", migrations_hash(migrations));
    let mut admin = admin_connection().await;
    drop_stale(&mut admin, prefix).await;
    let name = new_name(prefix);
    for _ in 0..20 {
        if template_state(&mut admin, &template).await != Some(true) {
            make_template(&mut admin, prefix, &template, &migrate).await;
        }
        let created = execute(
            &mut admin,
            &format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""),
        )
        .await;
        match created {
            Ok(()) => {
                let _ = admin.close().await;
                return name;
            }
            // Another session on the template (Postgres waits 5 s for it to leave first):
            // only a template being made has one, so that maker is almost done.
            Err(e) if e.to_string().contains("being accessed by other users") => {}
            // Dropped by a checkout whose migrations differ, when it was over a day old.
            Err(e) if e.to_string().contains("does not exist") => {}
            Err(e) => panic!("copying template {template}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("template {template} stayed in use");
}

/// Makes `template` unless another process made it while this one waited for the lock.
async fn make_template<F, Fut>(admin: &mut PgConnection, prefix: &str, template: &str, migrate: &F)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let lock = format!("test-support template {template}");
    sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
        .bind(&lock)
        .execute(&mut *admin)
        .await
        .unwrap();
    match template_state(admin, template).await {
        Some(true) => {}
        state => {
            if state.is_some() {
                execute(admin, &format!("DROP DATABASE \"{template}\" WITH (FORCE)"))
                    .await
                    .unwrap();
            }
            drop_old_templates(admin, prefix).await;
            execute(admin, &format!("CREATE DATABASE \"{template}\""))
                .await
                .unwrap();
            migrate(db_url(template)).await;
            let made = now_secs();
            for statement in [
                format!("COMMENT ON DATABASE \"{template}\" IS 'made {made}'"),
                format!("ALTER DATABASE \"{template}\" WITH ALLOW_CONNECTIONS false"),
            ] {
                execute(admin, &statement).await.unwrap();
            }
        }
    }
    sqlx::query("SELECT pg_advisory_unlock(hashtext($1))")
        .bind(&lock)
        .execute(&mut *admin)
        .await
        .unwrap();
}

/// `None` when `template` does not exist, else whether it is ready (connections to it
/// disallowed).
async fn template_state(admin: &mut PgConnection, template: &str) -> Option<bool> {
    let allows: Option<(bool,)> =
        sqlx::query_as("SELECT datallowconn FROM pg_database WHERE datname = $1")
            .bind(template)
            .fetch_optional(admin)
            .await
            .unwrap();
    allows.map(|(allows,)| !allows)
}

/// Templates of other migration sets made over a day ago: a checkout that still uses one
/// makes it again.
async fn drop_old_templates(admin: &mut PgConnection, prefix: &str) {
    let templates: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database \
         WHERE datname LIKE 'tpl\\_' || $1 || '\\_%' AND NOT datallowconn",
    )
    .bind(prefix)
    .fetch_all(&mut *admin)
    .await
    .unwrap();
    let now = now_secs();
    for (name, comment) in templates {
        let made = comment
            .and_then(|c| c.strip_prefix("made ")?.parse::<u64>().ok())
            .unwrap_or(0);
        if now.saturating_sub(made) > 86_400 {
            // A plain drop: one being copied right now stays.
            let _ = execute(admin, &format!("DROP DATABASE IF EXISTS \"{name}\"")).await;
        }
    }
}

/// A hash of the names and contents of the `.sql` files in `dir`.
fn migrations_hash(dir: &Path) -> u64 {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("migrations at {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "sql"))
        .collect();
    files.sort();
    let mut hasher = DefaultHasher::new();
    for file in files {
        file.file_name().hash(&mut hasher);
        std::fs::read(&file).unwrap().hash(&mut hasher);
    }
    hasher.finish()
}

async fn admin_connection() -> PgConnection {
    PgConnection::connect_with(&connect_options(&admin_url()))
        .await
        .expect("Postgres must run (make test starts it)")
}

/// The options of `url`, in the clear to a loopback host unless the URL names an
/// `sslmode`: sqlx's default tries TLS first, and setting up its client cost about 100 ms
/// of each test process's first connection.
pub fn connect_options(url: &str) -> PgConnectOptions {
    let options: PgConnectOptions = url.parse().expect("a Postgres URL");
    let named = url::Url::parse(url).map_or(true, |url| {
        url.query_pairs()
            .any(|(key, _)| key == "sslmode" || key == "ssl-mode")
    });
    let host = options.get_host();
    let loopback = host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if named || !loopback {
        return options;
    }
    options.ssl_mode(PgSslMode::Disable)
}

async fn execute(conn: &mut PgConnection, statement: &str) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned()))
        .execute(conn)
        .await
        .map(|_| ())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn new_name(prefix: &str) -> String {
    format!("{prefix}_{}_{}", now_secs(), uuid::Uuid::new_v4().simple())
}

/// Drops the databases of `prefix` made over an hour ago: left by runs that crashed.
async fn drop_stale(admin: &mut PgConnection, prefix: &str) {
    let now = now_secs();
    let stale: Vec<(String,)> =
        sqlx::query_as("SELECT datname FROM pg_database WHERE datname LIKE $1 || '\\_%'")
            .bind(prefix)
            .fetch_all(&mut *admin)
            .await
            .unwrap();
    for (name,) in stale {
        let born: u64 = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.split('_').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(now);
        if now.saturating_sub(born) > 3600 {
            let _ = execute(
                admin,
                &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
            )
            .await;
        }
    }
}
