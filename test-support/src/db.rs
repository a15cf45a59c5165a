//! A database of its own for each test, created from the admin URL (`TEST_DATABASE_URL`,
//! the local trust-auth Postgres by default). Databases older than an hour whose name has
//! the same prefix are dropped on the way: they belong to runs that crashed.

use std::time::{SystemTime, UNIX_EPOCH};

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
    let admin = sqlx::PgPool::connect(&admin_url())
        .await
        .expect("Postgres must run (make test starts it)");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let stale: Vec<(String,)> =
        sqlx::query_as("SELECT datname FROM pg_database WHERE datname LIKE $1 || '\\_%'")
            .bind(prefix)
            .fetch_all(&admin)
            .await
            .unwrap();
    for (name,) in stale {
        let born: u64 = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.split('_').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(now);
        if now.saturating_sub(born) > 3600 {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
            )))
            .execute(&admin)
            .await;
        }
    }
    let name = format!("{prefix}_{now}_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    name
}
