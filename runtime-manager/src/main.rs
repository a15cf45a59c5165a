//! The runtime-manager: launches, tracks and reaps workers.
//!
//! This first version validates its configuration, proves it can reach Postgres (with the
//! schema migrated) and Redis, and then waits for SIGTERM. The provision-queue consumer and
//! the launchers join it with the worker issue; until then no worker is ever launched,
//! which matches the brain offering no worker tools yet.

use std::time::Duration;

use anyhow::Context;
const DEFAULT_DATABASE_URL: &str = "postgres://postgres:postgres@127.0.0.1:5432/agent_runtime";
const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RUNTIME_MANAGER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let database_url = env_or("DATABASE_URL", DEFAULT_DATABASE_URL);
    let redis_url = env_or("REDIS_URL", DEFAULT_REDIS_URL);

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&database_url)
        .await
        .context("connecting to Postgres (DATABASE_URL)")?;
    let (sessions,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM agent_runtime_sessions WHERE state NOT IN ('terminated', 'failed')",
    )
    .fetch_one(&pool)
    .await
    .context("reading agent_runtime_sessions (has `brain migrate` run?)")?;

    let redis = redis::Client::open(redis_url.as_str()).context("REDIS_URL")?;
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .context("connecting to Redis (REDIS_URL)")?;
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .context("pinging Redis")?;

    tracing::info!(live_sessions = sessions, "runtime-manager ready");
    wait_for_signal().await;
    tracing::info!("runtime-manager stopped");
    Ok(())
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// SIGTERM (Kubernetes) or Ctrl-C.
async fn wait_for_signal() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}
