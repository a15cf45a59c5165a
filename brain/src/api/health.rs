//! Liveness and readiness probes.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;

use crate::AppState;

/// The process is up.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "probes",
    responses((status = 200, description = "`ok`", content_type = "text/plain", body = String)),
)]
pub async fn healthz() -> &'static str {
    "ok"
}

/// Postgres and Redis answer, and the replica is not draining. Redis only degrades the
/// brain (turns run without holds), but a replica that cannot see it should not take new
/// traffic when others can.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "probes",
    responses(
        (status = 200, description = "Postgres and Redis answer.", body = Readiness),
        (status = 503, description = "A store does not answer, or the replica is draining.",
            body = Readiness),
    ),
)]
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Readiness>) {
    if state.draining.is_cancelled() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Readiness::Draining { draining: true }),
        );
    }
    let timeout = Duration::from_secs(2);
    let postgres = matches!(
        tokio::time::timeout(timeout, state.store.ping()).await,
        Ok(Ok(()))
    );
    let redis = crate::redis::bounded(timeout, redis_ping(&state.redis))
        .await
        .is_ok();
    let status = if postgres && redis {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(Readiness::Checked { postgres, redis }))
}

/// What `/readyz` found.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Readiness {
    /// Whether each store answered within 2 s.
    Checked { postgres: bool, redis: bool },
    /// The replica is draining (SIGTERM); the stores were not asked.
    Draining { draining: bool },
}

async fn redis_ping(client: &crate::redis::Client) -> redis::RedisResult<()> {
    let mut conn = client.connection().await?;
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .map(|_| ())
}
