//! The brain's service: the front ends over the engine (`engine`), and `serve`, which runs
//! a replica.
//!
//! Layout, outside in:
//! - `api/`: the HTTP routes, authentication and request decoding;
//! - `agui/`: a turn's UI stream as AG-UI events (P3);
//! - `a2a/`: A2A 1.0 (P1): cards, JSON-RPC objects, turns as tasks and their streams;
//! - `error.rs`: the only place that maps failures to HTTP statuses and error codes;
//! - `mcp_server/`: the team's agents as MCP tools: sessions and JSON-RPC (P2);
//! - `respond.rs`: the engine's streams (a turn's, the events stream's) as HTTP responses,
//!   with their headers;
//! - `metrics_server.rs`: the `/metrics` listener;
//! - `supervisor.rs`: the named background tasks `serve` starts; one that ends before
//!   shutdown is logged, counted and fails readiness;
//! - `demo.rs`: the offline demo model for `make dev` without a provider key.
//!
//! Every front end calls the engine and maps what it answers to its own wire here; the
//! engine speaks no HTTP.

pub mod a2a;
pub mod agui;
pub mod api;
pub mod demo;
pub mod error;
pub mod mcp_server;
pub mod metrics_server;
pub mod respond;
pub mod supervisor;

use std::ops::Deref;

use axum::serve::ListenerExt;
use engine::Engine;
use engine::config::Config;
use engine::{audit, erasure, knowledge, lease, retention, scheduler, sessions, turn, webhooks};
use store::Store;
use tokio_util::sync::CancellationToken;

/// Shared by every request: the engine, and what only the front ends hold. Cheap to
/// clone; reads through to the engine's handles.
#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    /// `/readyz`'s last answer and its Redis connection.
    pub readiness: api::ReadinessCheck,
    /// The background tasks `serve` starts; `/readyz` fails once one has ended.
    pub supervisor: supervisor::Supervisor,
    /// The MCP sessions this replica holds (P2).
    pub mcp: mcp_server::McpSessions,
    /// The OpenAI-compatible front end's conversation fingerprints (P7).
    pub conversations: std::sync::Arc<engine::conversations::Conversations>,
}

impl AppState {
    /// The engine built from configuration, and the front ends' own state beside it.
    pub fn new(
        config: Config,
        store: Store,
        redis: engine::redis::Client,
    ) -> Result<Self, engine::StateError> {
        let engine = Engine::new(config, store, redis)?;
        Ok(Self {
            readiness: api::ReadinessCheck::new(engine.redis.clone()),
            // Tasks stopped by the drain end on purpose.
            supervisor: supervisor::Supervisor::new(
                engine.draining.clone(),
                engine.metrics.background_task_exits.clone(),
            ),
            mcp: mcp_server::McpSessions::new(engine.config.mcp_server),
            conversations: std::sync::Arc::new(engine::conversations::Conversations::new(
                engine.redis.clone(),
            )),
            engine,
        })
    }
}

impl Deref for AppState {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
}

/// How long the server waits for its connections to close once every turn has ended.
const CONNECTIONS_CLOSE_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// Serves `state` on `listener` until `shutdown` fires, then drains (SPEC O3): `/readyz`
/// answers 503 at once and new turns are refused with `shutting_down` while the server
/// still accepts (so the load balancer learns it and requests in flight get an answer);
/// running turns may finish for `BRAIN_DRAIN_TIMEOUT_MS`, then the rest are handed over
/// (D4): each stops at its next step boundary (a model call in flight is cut, a tool call
/// finishes) and is left for another replica to take over once this one's lease is given
/// up. Turns that reach no boundary within another `BRAIN_DRAIN_TIMEOUT_MS` are cancelled
/// (stored `interrupted`, their streams end with `finish: interrupted`); then the worker
/// channels are closed "going away" (the workers re-dial another replica), the server and
/// the relay stop and the lease is given up.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    lease::take(&state).await;
    // Each runs until shutdown; one that ends sooner fails readiness.
    let tasks = state.supervisor.clone();
    let lease_stop = CancellationToken::new();
    tasks.spawn(
        "lease",
        lease::keep(state.engine.clone(), lease_stop.clone()),
    );
    let app = api::router(state.clone());
    // Relayed calls for the workers this replica holds keep working while it drains.
    let stopped = CancellationToken::new();
    start_background(&state, &stopped);
    // Small frames (stream chunks, cancel notifications to workers) must not wait for
    // Nagle and delayed ACKs: without this a worker's cancel arrived ~40 ms late.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    // Each request knows its peer's address, which the audit log records (L5).
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(stopped.clone().cancelled_owned())
        .into_future();
    let server = tokio::spawn(server);

    shutdown.cancelled().await;
    drain(&state).await;
    // The workers this replica holds dial again and another replica takes them (W9).
    let closed = state.sessions.close_all_going_away().await;
    if closed > 0 {
        tracing::info!(closed, "worker channels closed going away");
    }
    stopped.cancel();
    // Every turn has ended; a connection still open now belongs to a client that stopped
    // reading (its turn was given up) or to an idle keep-alive: it gets a moment, then
    // the process stops without it.
    let served = match tokio::time::timeout(CONNECTIONS_CLOSE_WITHIN, server).await {
        Ok(joined) => joined.unwrap_or(Ok(())),
        Err(_) => {
            tracing::warn!("connections still open after the drain; closing without them");
            Ok(())
        }
    };
    lease_stop.cancel();
    lease::give_up(&state).await;
    served
}

/// The background work every replica runs, under the supervisor: what the drain stops
/// (`state.draining`) and what goes on until `stopped`.
fn start_background(state: &AppState, stopped: &CancellationToken) {
    let tasks = &state.supervisor;
    // Claims ticks until the drain begins.
    tasks.spawn("scheduler", scheduler::run(state.engine.clone()));
    // Teams being erased (L2) are worked on until the drain begins; the lease of one cut
    // off lapses and another replica finishes it.
    tasks.spawn(
        "erasure",
        erasure::run(state.engine.clone(), state.draining.clone()),
    );
    tasks.spawn(
        "retention",
        retention::run(
            state.engine.clone(),
            state.config.retention_sweep_interval,
            state.draining.clone(),
        ),
    );
    // Queued turns (T13) start until the drain begins.
    tasks.spawn(
        "run_queue",
        turn::run_queue(state.engine.clone(), state.draining.clone()),
    );
    tasks.spawn("key_watch", state.auth.keys.clone().watch(stopped.clone()));
    // Documents are indexed until the drain begins; a claim cut off by the exit lapses and
    // another replica indexes the document (B3).
    tasks.spawn(
        "knowledge_indexer",
        knowledge::index::run(state.engine.clone(), state.draining.clone()),
    );
    // Stopped after the drain, so the chunks of the last turns are still published.
    tasks.spawn(
        "events_publisher",
        state.events.clone().run_publisher(stopped.clone()),
    );
    // Webhook deliveries go on through the drain; a claim cut off by the exit lapses and
    // another replica sends it (P4).
    tasks.spawn(
        "webhooks",
        webhooks::run(
            state.store.clone(),
            state.events.clone(),
            state.config.webhooks,
            state.metrics.clone(),
            stopped.clone(),
        ),
    );
    tasks.spawn(
        "audit_sweep",
        audit::sweep(
            state.store.clone(),
            state.config.audit_retention_days,
            stopped.clone(),
        ),
    );
    // Stops keep reaching this replica's turns while it drains.
    tasks.spawn("stop_listener", state.stops.clone().listen(stopped.clone()));
    // Snapshot requests keep reaching this replica's workers while it drains (W10).
    tasks.spawn(
        "snapshot_listener",
        state.sessions.clone().listen_snapshots(stopped.clone()),
    );
    tasks.spawn(
        "snapshot_sweep",
        sessions::sweep_snapshots(
            state.store.clone(),
            state.artifacts.clone(),
            state.config.artifacts.snapshot_retention,
            state.config.artifacts.snapshot_sweep_interval,
            stopped.clone(),
        ),
    );
    tasks.spawn(
        "relay",
        state.sessions.clone().serve_relay(
            state.artifacts.clone(),
            state.config.artifacts.max_bytes,
            stopped.clone(),
        ),
    );
}

/// D4, O3: running turns may finish for `BRAIN_DRAIN_TIMEOUT_MS`, then are handed over;
/// those that reach no step boundary within another are cancelled.
async fn drain(state: &AppState) {
    state.draining.cancel();
    let tracker = &state.turn_tracker;
    tracker.close();
    // The drain starts at the signal, not when the last connection closes: a live stream
    // keeps its connection open until its turn ends.
    if tokio::time::timeout(state.config.drain_timeout, tracker.wait())
        .await
        .is_err()
    {
        tracing::info!(
            running = tracker.len(),
            "drain timeout over; handing running turns over"
        );
        state.handover.cancel();
        if tokio::time::timeout(state.config.drain_timeout, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running = tracker.len(),
                "turns reached no step boundary; cancelling them"
            );
            state.turns_cancel.cancel();
            tracker.wait().await;
        }
    }
}
