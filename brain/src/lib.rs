//! The brain: a stateless service that runs every agent's LLM loop.
//!
//! Layout, outside in:
//! - `api/`: the HTTP routes, authentication and request decoding;
//! - `agui/`: a turn's UI stream as AG-UI events (issue 28, P3);
//! - `a2a/`: A2A 1.0 (P1): cards, JSON-RPC objects, turns as tasks and their streams;
//! - `auth/`: who the caller is (API keys, JWTs) and what it may do;
//! - `audit.rs`: the audit log's retention sweep every replica runs (L5);
//! - `error.rs`: the only place that maps failures to HTTP statuses and error codes;
//! - `intake.rs`: the bounded, first-come-first-served queue of turn intakes in front
//!   of the Postgres pool;
//! - `turn/`: one turn end to end, and the UI message stream it writes;
//! - `hold/`: the one-turn-per-agent hold and the quota counters, admitted in one Redis
//!   round trip (T9, T2), a file per phase and its Lua scripts beside them;
//! - `quota/`: the team's limits, their refusals and `RateLimit` headers, and the
//!   Postgres answer when Redis cannot give one;
//! - `lease.rs`: this replica's lease, and what dead replicas (and stranded approval
//!   continuations) left behind (O3, A3);
//! - `tools/`: the brain's own tools and the one toolset a turn offers (T4, B1);
//! - `connectors/`: the MCP servers a team configured, their credentials and OAuth (B2);
//! - `address.rs`: the rule every address the brain calls out to obeys (connectors,
//!   webhooks, OAuth, team issuers' JWKS): no metadata or link-local address, private ones
//!   only where the operator allows;
//! - `approvals.rs`: the risk classes, the approval policy and states (A1-A4);
//! - `events/`: the chat events stream (Redis Streams): publishing the turns' chunks,
//!   the reader a replica's observers share, observers' streams, and a turn's own stream
//!   resumed;
//! - `mcp_server/`: the team's agents as MCP tools: sessions and JSON-RPC (P2);
//! - `ratelimit.rs`: the request rate limit's token buckets in Redis, per principal and
//!   per address (issue 50);
//! - `redis.rs`: Redis connection set-up and the bound on every Redis call (each module
//!   keeps its own keys);
//! - `agents.rs`: what makes an agent valid, for the API and the agent tools alike;
//! - `schedule.rs`: what makes an autostart cadence valid and when it fires;
//! - `scheduler.rs`: the autostart scheduler every replica runs (T11);
//! - `usage.rs`: what makes a usage question (range, grouping) valid;
//! - `sessions/`: worker sessions, the channel workers dial, the worker tools;
//! - `sse.rs`: Server-Sent Events framing, for the turn's stream and the events stream;
//! - `provider/`: the model providers' wire formats, turned into typed events;
//! - `store/`: Postgres, the only place with SQL;
//! - `artifacts/`: the bytes of files and artifacts (a local directory or S3);
//! - `config.rs`: typed configuration from the environment;
//! - `metrics.rs`: the Prometheus series and the guards the hot paths hold (O2);
//! - `supervisor.rs`: the named background tasks `serve` starts; one that ends before
//!   shutdown is logged, counted and fails readiness;
//! - `webhooks/`: signed webhook deliveries from the Postgres outbox (P4);
//! - `erasure.rs`: a chat, an agent or a team erased wherever it lives (L2);
//! - `retention.rs`: the sweep that deletes what is past a team's retention (L6);
//! - `demo.rs`: the offline demo model for `make dev` without a provider key.
//!
//! A replica holds nothing another replica needs beyond the turns it is streaming: all
//! durable state is in Postgres, and a restarted replica loses only its live streams.

pub mod a2a;
pub mod address;
pub mod agents;
pub mod agui;
pub mod api;
pub mod approvals;
pub mod artifacts;
pub mod audit;
pub mod auth;
pub mod config;
pub mod connectors;
pub mod demo;
pub mod erasure;
pub mod error;
pub mod events;
pub mod hold;
pub mod intake;
pub mod lease;
pub mod mcp_server;
pub mod metrics;
pub mod provider;
pub mod quota;
pub mod ratelimit;
pub mod redis;
pub mod retention;
pub mod schedule;
pub mod scheduler;
pub mod sessions;
pub mod sse;
pub mod store;
pub mod supervisor;
pub mod tools;
pub mod turn;
pub mod usage;
pub mod webhooks;

use std::sync::Arc;

use axum::serve::ListenerExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use artifacts::ArtifactStore;
use config::Config;
use hold::{HoldConfig, Holds};
use metrics::Metrics;
use provider::anthropic::AnthropicProvider;
use provider::openai::OpenAiProvider;
use provider::{Endpoint, Providers};
use quota::Quotas;
use sessions::Sessions;
use store::Store;

/// Shared by every request: cheap to clone, no global locks.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    /// This process among the replicas, with a lease in Postgres (O3).
    pub replica: protocol::ReplicaId,
    pub store: Store,
    pub redis: crate::redis::Client,
    /// API keys and JWTs (SPEC X1).
    pub auth: auth::Auth,
    pub providers: Providers,
    /// Turn intakes wait here, in arrival order, for a share of the Postgres pool.
    pub intakes: intake::Intakes,
    /// The chats and agents this replica's turns started from, checked by each intake
    /// (issue 31).
    pub bases: turn::Bases,
    /// One turn per agent (SPEC T9).
    pub holds: Holds,
    /// Team quotas (T2, E2): their limits, usage and the session-path check.
    pub quotas: Quotas,
    /// The request rate limit of every principal and client address (issue 50).
    pub rate_limits: ratelimit::RateLimits,
    /// `/readyz`'s last answer and its Redis connection.
    pub readiness: api::ReadinessCheck,
    /// The chat events streams (S2): the publisher every turn feeds, the reader observers
    /// share.
    pub events: events::Events,
    pub metrics: Metrics,
    /// Where artifact bytes live (SPEC "object storage"): the backend the configuration
    /// names, a local directory by default.
    pub artifacts: Arc<dyn ArtifactStore>,
    /// Worker sessions and the channels this replica holds (SPEC W).
    pub sessions: Sessions,
    /// The snapshot uploads this replica takes at once, in all and per team.
    pub snapshot_uploads: sessions::UploadSlots,
    /// Parent of every turn's token: cancelled when shutdown gives up on draining.
    pub turns_cancel: CancellationToken,
    /// Cancelled when the drain's time is over (D4): running turns stop at their next step
    /// boundary (a model call in flight is cut) and are handed over to another replica.
    pub handover: CancellationToken,
    /// Cancelled at SIGTERM: `/readyz` answers 503 and no new turn starts (O3).
    pub draining: CancellationToken,
    /// The background tasks `serve` starts; `/readyz` fails once one has ended.
    pub supervisor: supervisor::Supervisor,
    /// Running turns, so shutdown can wait for them.
    pub turn_tracker: TaskTracker,
    /// The turns this replica runs, and stops of any replica's (SPEC T8).
    pub stops: turn::stop::Stops,
    /// Agents freed on this replica, whose next queued turn may start (T13).
    pub queue: turn::Queue,
    /// The tools turns offer, built once per kind of agent.
    pub toolsets: turn::Toolsets,
    /// Connector OAuth: its HTTP client and configuration (SPEC B2).
    pub oauth: connectors::authorization::OAuth,
    /// The MCP sessions this replica holds (P2).
    pub mcp: mcp_server::McpSessions,
    /// Wakes this replica's team erasures (L2).
    pub team_erasures: erasure::TeamErasures,
}

impl AppState {
    /// Builds the state from configuration. Fails only on a programming error caught by
    /// every test (a metric registered twice) or a token key the configuration let pass.
    pub fn new(
        config: Config,
        store: Store,
        redis: crate::redis::Client,
    ) -> Result<Self, StateError> {
        let providers = providers_from(&config);
        // Secrets are encrypted in the store, under the configured key (B1).
        let store = store.with_secrets_key(config.secrets_key.clone());
        let metrics = Metrics::new(config.demo_model)?;
        let replica = protocol::ReplicaId::new();
        let holds = Holds::new(
            redis.clone(),
            replica,
            HoldConfig::default(),
            metrics.clone(),
        );
        // Sized from the pool the store really has (a test's may differ from the
        // configured size).
        let intakes = intake::Intakes::new(store.max_connections(), config.intake, metrics.clone());
        let quotas = Quotas::new(store.clone(), config.quotas).with_requests(config.requests);
        let rate_limits =
            ratelimit::RateLimits::new(redis.clone(), quotas.clone(), config.anonymous_requests);
        let artifacts = artifacts::artifact_store_from(&config.artifacts);
        if config.workers.dev_token_key {
            tracing::warn!(
                "development mode (AGENT_RUNTIME_DEV): using the session token key kept in {}; \
                 set SESSION_TOKEN_KEY in any deployment",
                envcfg::DEV_KEY_FILE
            );
        }
        let auth = auth::Auth::new(
            store.clone(),
            redis.clone(),
            config.jwt.clone(),
            config.issuers_allow_private_networks,
        );
        let events = events::Events::new(redis.clone(), config.events.clone(), metrics.clone());
        let sessions = Sessions::new(
            replica,
            store.clone(),
            redis.clone(),
            config.workers.clone(),
            metrics.clone(),
            quotas.clone(),
        )?;
        let oauth = connectors::authorization::OAuth::new(
            &config.oauth,
            config.connectors.allow_private_networks,
        )?;
        let snapshot_uploads = sessions::UploadSlots::new(
            config.artifacts.snapshot_uploads,
            config.artifacts.snapshot_uploads_per_team,
        );
        let mcp = mcp_server::McpSessions::new(config.mcp_server);
        let draining = CancellationToken::new();
        // Tasks stopped by the drain end on purpose.
        let supervisor =
            supervisor::Supervisor::new(draining.clone(), metrics.background_task_exits.clone());
        Ok(Self {
            config: Arc::new(config),
            replica,
            store,
            redis: redis.clone(),
            auth,
            providers,
            intakes,
            bases: turn::Bases::new(metrics.clone()),
            holds,
            rate_limits,
            readiness: api::ReadinessCheck::new(redis.clone()),
            quotas,
            events,
            metrics,
            artifacts,
            sessions,
            snapshot_uploads,
            turns_cancel: CancellationToken::new(),
            handover: CancellationToken::new(),
            draining,
            supervisor,
            turn_tracker: TaskTracker::new(),
            stops: turn::stop::Stops::new(replica, redis),
            queue: turn::Queue::default(),
            toolsets: turn::Toolsets::default(),
            oauth,
            mcp,
            team_erasures: erasure::TeamErasures::default(),
        })
    }
}

/// Why the shared state could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("metrics registry: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("session token key: {0}")]
    TokenKey(#[from] channel::token::TokenError),
    /// The OAuth HTTP client could not be built.
    #[error("oauth http client: {}", .0.class())]
    OAuthClient(#[from] connectors::oauth::OAuthError),
}

/// Both adapters over one HTTP client (one connection pool per provider host).
pub fn providers_from(config: &Config) -> Providers {
    // Timeouts are applied per phase by the adapters; the client itself has none so a long
    // answer is never cut.
    let client = reqwest::Client::builder()
        .connect_timeout(config.provider_connect_timeout)
        .pool_idle_timeout(std::time::Duration::from_secs(90))
        .build()
        .unwrap_or_default();
    let endpoint = |p: &config::ProviderConfig| Endpoint {
        base_url: p.base_url.clone(),
        api_key: p.api_key.clone(),
        connect_timeout: config.provider_connect_timeout,
        idle_timeout: config.provider_idle_timeout,
    };
    Providers {
        openai: Arc::new(OpenAiProvider::new(
            client.clone(),
            endpoint(&config.openai),
        )),
        anthropic: Arc::new(AnthropicProvider::new(client, endpoint(&config.anthropic))),
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
    tasks.spawn("lease", lease::keep(state.clone(), lease_stop.clone()));
    let app = api::router(state.clone());
    // Claims ticks until the drain begins.
    tasks.spawn("scheduler", scheduler::run(state.clone()));
    // Teams being erased (L2) are worked on until the drain begins; the lease of one cut
    // off lapses and another replica finishes it.
    tasks.spawn(
        "erasure",
        erasure::run(state.clone(), state.draining.clone()),
    );
    tasks.spawn(
        "retention",
        retention::run(
            state.clone(),
            state.config.retention_sweep_interval,
            state.draining.clone(),
        ),
    );
    // Queued turns (T13) start until the drain begins.
    tasks.spawn(
        "run_queue",
        turn::run_queue(state.clone(), state.draining.clone()),
    );
    // Relayed calls for the workers this replica holds keep working while it drains.
    let stopped = CancellationToken::new();
    tasks.spawn("key_watch", state.auth.keys.clone().watch(stopped.clone()));
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
