//! Liveness and readiness probes.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::AppState;

/// The process is up.
pub async fn healthz() -> &'static str {
    "ok"
}

/// Postgres and Redis answer, and the replica is not draining. Redis only degrades the
/// brain (turns run without holds), but a replica that cannot see it should not take new
/// traffic when others can.
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    if state.draining.is_cancelled() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "draining": true })),
        );
    }
    let timeout = Duration::from_secs(2);
    let postgres = matches!(
        tokio::time::timeout(timeout, state.store.ping()).await,
        Ok(Ok(()))
    );
    let redis = matches!(
        tokio::time::timeout(timeout, redis_ping(&state.redis)).await,
        Ok(Ok(()))
    );
    let status = if postgres && redis {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({ "postgres": postgres, "redis": redis })),
    )
}

async fn redis_ping(client: &redis::Client) -> redis::RedisResult<()> {
    let mut conn = client.get_multiplexed_async_connection().await?;
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .map(|_| ())
}

/// Prometheus text format (SPEC O2). Counts and ids only (X4).
pub async fn metrics(
    State(state): State<AppState>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        state.metrics.render(),
    )
}
