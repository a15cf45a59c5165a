//! The engine: every agent's turn end to end, and everything a turn reads or leaves
//! behind, with no HTTP in it. The front ends (the service crate `brain`: the HTTP API,
//! A2A, AG-UI, the MCP server) call it and map what it answers to their wire; it never
//! names a status code, a response or the service's state.
//!
//! Layout:
//! - `auth/`: who the caller is (API keys, JWTs) and what it may do;
//! - `audit.rs`: the audit log's retention sweep every replica runs (L5);
//! - `intake.rs`: the bounded, first-come-first-served queue of turn intakes in front
//!   of the Postgres pool;
//! - `turn/`: one turn end to end, and the UI message stream it writes;
//! - `hold/`: the one-turn-per-agent hold and the quota counters, admitted in one Redis
//!   round trip (T9, T2), a file per phase and its Lua scripts beside them;
//! - `quota/`: the team's limits, their refusals and `RateLimit` headers, and the
//!   Postgres answer when Redis cannot give one;
//! - `liveness.rs`: a running turn's last sign of life, and the watch that ends a stuck
//!   one (T20);
//! - `clock.rs`: the clock that decides dates (quota periods, the usage month, autostart
//!   ticks), the system's unless a test pins it;
//! - `lease.rs`: this replica's lease, and what dead replicas (and stranded approval
//!   continuations) left behind (O3, A3);
//! - `tools/`: the brain's own tools and the one toolset a turn offers (T4, B1);
//! - `connectors/`: the MCP servers a team configured, their credentials and OAuth (B2);
//! - `address.rs`: the rule every address the brain calls out to obeys (connectors,
//!   webhooks, OAuth, team issuers' JWKS): no metadata or link-local address, private ones
//!   only where the operator allows;
//! - `events/`: the chat events stream (Redis Streams): publishing the turns' chunks,
//!   the reader a replica's observers share, observers' streams, and a turn's own stream
//!   resumed;
//! - `ratelimit.rs`: the request rate limit's token buckets in Redis, per principal and
//!   per address;
//! - `redis.rs`: Redis connection set-up and the bound on every Redis call (each module
//!   keeps its own keys);
//! - `conversations.rs`: which chat a client that resends its whole conversation continues
//!   (the OpenAI-compatible front end, P7);
//! - `agents.rs`: what makes an agent valid, for the API and the agent tools alike;
//! - `schedule.rs`: what makes an autostart cadence valid and when it fires;
//! - `scheduler.rs`: the autostart scheduler every replica runs (T11);
//! - `usage.rs`: what makes a usage question (range, grouping) valid;
//! - `models/`: the models a team can call, and the catalog of what each can do and
//!   costs (T16);
//! - `sessions/`: worker sessions, the channel workers dial, the worker tools;
//! - `sse.rs`: Server-Sent Events framing, for the turn's stream and the events stream;
//! - `artifacts/`: the bytes of files and artifacts (a local directory or S3);
//! - `files/`: files attached to chats, their media type sniffed from the bytes, images
//!   cleaned of metadata and bounded, the limits (T21, T22);
//! - `slots.rs`: how many uploads (chat files, workspace snapshots) a replica takes at
//!   once, in all and per team;
//! - `memories.rs`: who may see, change or delete an agent's memories (M4);
//! - `knowledge/`: knowledge bases: documents indexed in the background by any replica,
//!   cut into passages by structure and searched with Postgres full-text search (B3, B4);
//! - `skills/`: a team's Agent Skills folders, checked, versioned and stored, and what a
//!   turn's prompt lists of an agent's (B8);
//! - `config.rs`: typed configuration from the environment;
//! - `metrics.rs`: the Prometheus series and the guards the hot paths hold (O2);
//! - `webhooks/`: signed webhook deliveries from the Postgres outbox (P4);
//! - `channels/`: chat channels (Telegram, Slack): their inbound messages and their
//!   replies, delivered through the webhooks' outbox (P10, P11);
//! - `erasure.rs`: a chat, an agent or a team erased wherever it lives (L2);
//! - `retention.rs`: the sweep that deletes what is past a team's retention (L6);
//! - `retrieval.rs`: embeddings and hybrid knowledge search, lexical and vector fused (B6);
//!
//! A replica holds nothing another replica needs beyond the turns it is streaming: all
//! durable state is in Postgres, and a restarted replica loses only its live streams.

pub mod address;
pub mod agents;
pub mod artifacts;
pub mod audit;
pub mod auth;
pub mod channels;
pub mod clock;
pub mod config;
pub mod connectors;
pub mod conversations;
pub mod erasure;
pub mod events;
pub mod files;
pub mod hold;
pub mod intake;
pub mod knowledge;
pub mod lease;
pub mod liveness;
pub mod memories;
pub mod metrics;
pub mod models;
pub mod quota;
pub mod ratelimit;
pub mod redis;
pub mod retention;
pub mod retrieval;
pub mod schedule;
pub mod scheduler;
pub mod sessions;
pub mod skills;
pub mod slots;
pub mod sse;
pub mod tools;
pub mod turn;
pub mod usage;
pub mod webhooks;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use artifacts::ArtifactStore;
use config::Config;
use hold::{HoldConfig, Holds};
use metrics::Metrics;
use providers::{Endpoint, ProviderKind, Providers};
use quota::Quotas;
use sessions::Sessions;
use store::Store;

/// What the engine's work reads: built once in `main` from the configuration, cheap to
/// clone, no global locks.
#[derive(Clone)]
pub struct Engine {
    pub config: Arc<Config>,
    /// This process among the replicas, with a lease in Postgres (O3).
    pub replica: protocol::ReplicaId,
    pub store: Store,
    pub redis: crate::redis::Client,
    /// API keys and JWTs (SPEC X1).
    pub auth: auth::Auth,
    /// Resolves a route to its adapter: the deployment's connections and the teams' own
    /// (T14).
    pub connections: models::connections::Connections,
    /// Turn intakes wait here, in arrival order, for a share of the Postgres pool.
    pub intakes: intake::Intakes,
    /// The chats and agents this replica's turns started from, checked by each intake.
    pub bases: turn::Bases,
    /// One turn per agent (SPEC T9).
    pub holds: Holds,
    /// Team quotas (T2, E2): their limits, usage and the session-path check.
    pub quotas: Quotas,
    /// What decides dates: quota periods, the usage month, autostart ticks.
    pub clock: clock::Clock,
    /// The request rate limit of every principal and client address.
    pub rate_limits: ratelimit::RateLimits,
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
    /// The chat file uploads this replica takes at once, in all and per team (T27).
    pub file_uploads: slots::UploadSlots,
    /// Parent of every turn's token: cancelled when shutdown gives up on draining.
    pub turns_cancel: CancellationToken,
    /// Cancelled when the drain's time is over (D4): running turns stop at their next step
    /// boundary (a model call in flight is cut) and are handed over to another replica.
    pub handover: CancellationToken,
    /// Cancelled at SIGTERM: `/readyz` answers 503 and no new turn starts (O3).
    pub draining: CancellationToken,
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
    /// Wakes this replica's team erasures (L2).
    pub team_erasures: erasure::TeamErasures,
    /// Wakes this replica's knowledge indexer: a document was queued here (B3).
    pub knowledge_jobs: Arc<tokio::sync::Notify>,
    /// Signs and checks the download URLs of chat files handed to clients (T26).
    pub file_urls: files::FileUrls,
}

impl Engine {
    /// Builds the engine from configuration. Fails only on a programming error caught by
    /// every test (a metric registered twice) or a token key the configuration let pass.
    pub fn new(
        config: Config,
        store: Store,
        redis: crate::redis::Client,
    ) -> Result<Self, StateError> {
        // Secrets are encrypted in the store, under the configured key (B1).
        let store = store.with_secrets_key(config.secrets_key.clone());
        let connections = connections_from(&config, &store);
        let metrics = Metrics::new(config.demo_model)?;
        let replica = protocol::ReplicaId::new();
        let clock = config.clock.clone();
        let holds = Holds::new(
            redis.clone(),
            replica,
            HoldConfig {
                clock: clock.clone(),
                ..HoldConfig::default()
            },
            metrics.clone(),
        );
        // Sized from the pool the store really has (a test's may differ from the
        // configured size).
        let intakes = intake::Intakes::new(store.max_connections(), config.intake, metrics.clone());
        let quotas = Quotas::new(store.clone(), config.quotas)
            .with_requests(config.requests)
            .with_clock(clock.clone());
        let rate_limits =
            ratelimit::RateLimits::new(redis.clone(), quotas.clone(), config.anonymous_requests);
        let artifacts = artifacts::artifact_store_from(&config.artifacts);
        warn_if_dev_token_key(&config);
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
        let file_uploads = slots::UploadSlots::new(
            config.files.uploads,
            config.files.uploads_per_team,
            metrics.file_uploads.clone(),
        );
        let snapshot_uploads = sessions::UploadSlots::new(
            config.artifacts.snapshot_uploads,
            config.artifacts.snapshot_uploads_per_team,
            metrics.snapshot_uploads.clone(),
        );
        let draining = CancellationToken::new();
        let file_urls = files::FileUrls::new(config.secrets_key.as_ref(), config.files.url_ttl);
        Ok(Self {
            config: Arc::new(config),
            replica,
            store,
            redis: redis.clone(),
            auth,
            connections,
            intakes,
            bases: turn::Bases::new(metrics.clone()),
            holds,
            rate_limits,
            quotas,
            clock,
            events,
            metrics,
            artifacts,
            sessions,
            snapshot_uploads,
            file_uploads,
            turns_cancel: CancellationToken::new(),
            handover: CancellationToken::new(),
            draining,
            turn_tracker: TaskTracker::new(),
            stops: turn::stop::Stops::new(replica, redis),
            queue: turn::Queue::default(),
            toolsets: turn::Toolsets::default(),
            oauth,
            team_erasures: erasure::TeamErasures::default(),
            knowledge_jobs: Arc::default(),
            file_urls,
        })
    }
}

/// The models a team can call: the deployment's two connections and the team's own.
fn connections_from(config: &Config, store: &Store) -> models::connections::Connections {
    models::connections::Connections::new(
        providers_from(config),
        store.clone(),
        models::connections::ConnectionsConfig {
            connect_timeout: config.provider_connect_timeout,
            idle_timeout: config.provider_idle_timeout,
            allow_private_networks: config.providers_allow_private_networks,
        },
    )
}

fn warn_if_dev_token_key(config: &Config) {
    if config.workers.dev_token_key {
        tracing::warn!(
            "development mode (AGENT_RUNTIME_DEV): using the session token key kept in {}; \
             set SESSION_TOKEN_KEY in any deployment",
            envcfg::DEV_KEY_FILE
        );
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

/// The deployment's two connections over one HTTP client (one connection pool per
/// provider host).
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
        openai: providers::route::adapter(
            ProviderKind::OpenAi,
            client.clone(),
            endpoint(&config.openai),
        ),
        anthropic: providers::route::adapter(
            ProviderKind::Anthropic,
            client,
            endpoint(&config.anthropic),
        ),
    }
}
