//! Liveness and readiness probes.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

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

/// Postgres and Redis answer, every background task runs, and the replica is not
/// draining. Redis only degrades the brain (turns run without holds), but a replica that
/// cannot see it should not take new traffic when others can; nor should one whose
/// scheduler, events publisher or relay has stopped. The stores' answer
/// is at most a second old; draining and a task's end show at once.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "probes",
    responses(
        (status = 200, description = "Postgres and Redis answer.", body = Readiness),
        (status = 503, description = "A store does not answer, a background task has ended, \
            or the replica is draining.",
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
    let (postgres, redis) = state.readiness.check(&state.store).await;
    let stopped = state.supervisor.gone();
    let status = if postgres && redis && stopped.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(Readiness::Checked {
            postgres,
            redis,
            stopped,
        }),
    )
}

/// How long a readiness check is the answer: probes from every kubelet and load balancer
/// cost the stores one check a second, however many come.
const KEPT: Duration = Duration::from_secs(1);

/// Each store's bound in a check.
const BOUND: Duration = Duration::from_secs(2);

/// `/readyz`'s last check and the Redis connection it checks on, which it keeps.
#[derive(Clone)]
pub struct ReadinessCheck {
    inner: Arc<Inner>,
}

struct Inner {
    redis: engine::redis::Shared,
    /// When the last check was made and what it found; held while a check runs, so
    /// probes arriving meanwhile take its answer rather than checking again.
    last: tokio::sync::Mutex<Option<(Instant, bool, bool)>>,
}

impl ReadinessCheck {
    /// Does no I/O.
    pub fn new(redis: engine::redis::Client) -> Self {
        Self {
            inner: Arc::new(Inner {
                redis: engine::redis::Shared::new(redis, BOUND),
                last: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// Whether Postgres and Redis answer: the last check if under a second old.
    async fn check(&self, store: &store::Store) -> (bool, bool) {
        let mut last = self.inner.last.lock().await;
        if let Some((at, postgres, redis)) = *last
            && at.elapsed() < KEPT
        {
            return (postgres, redis);
        }
        let (postgres, redis) = tokio::join!(
            tokio::time::timeout(BOUND, store.ping()),
            engine::redis::bounded(BOUND, async {
                let mut conn = self.inner.redis.get().await?;
                redis::cmd("PING").query_async::<String>(&mut conn).await
            }),
        );
        let (postgres, redis) = (matches!(postgres, Ok(Ok(()))), redis.is_ok());
        *last = Some((Instant::now(), postgres, redis));
        (postgres, redis)
    }
}

/// What `/readyz` found.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Readiness {
    /// Whether each store answered within 2 s, and the background tasks that ended before
    /// shutdown (absent when none did).
    Checked {
        postgres: bool,
        redis: bool,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        #[schema(value_type = Vec<String>)]
        stopped: Vec<&'static str>,
    },
    /// The replica is draining (SIGTERM); the stores were not asked.
    Draining { draining: bool },
}
