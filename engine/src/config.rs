//! Typed configuration from the environment, validated before any port is bound.
//!
//! Every variable is documented in `docs/CONFIGURATION.md`; keep the two in step. Parsing
//! goes through [`Env`] so tests can feed a map instead of the process environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use envcfg::{ConfigError, Env, ProcessEnv};
use envcfg::{millis, non_empty, parse, ranged, trimmed, url_var};

/// The brain's whole configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub addr: SocketAddr,
    /// Where `GET /metrics` listens (`BRAIN_METRICS_ADDR`), apart from the API so that
    /// whatever publishes the API does not publish the metrics; `None` (`off`): nowhere.
    pub metrics_addr: Option<SocketAddr>,
    pub database_url: String,
    /// Postgres itself when `database_url` is a transaction pooler (`DATABASE_DIRECT_URL`,
    /// O5): migrations and `LISTEN` use it. `None`: `database_url` is Postgres itself.
    pub database_direct_url: Option<String>,
    pub database_max_connections: u32,
    /// Postgres cancels a statement of the brain's pool past this
    /// (`BRAIN_DATABASE_STATEMENT_TIMEOUT_MS`).
    pub database_statement_timeout: Duration,
    /// The queue of turn intakes in front of the pool (`BRAIN_INTAKE_QUEUE*`).
    pub intake: crate::intake::IntakeConfig,
    pub redis_url: String,
    /// A Redis Cluster's seed nodes (`REDIS_CLUSTER_URLS`, O5); when set, `redis_url` is
    /// not used.
    pub redis_cluster_urls: Option<Vec<String>>,
    pub openai: ProviderConfig,
    pub anthropic: ProviderConfig,
    /// Serve the built-in offline demo model when no provider key is set.
    pub demo_model: bool,
    pub provider_connect_timeout: Duration,
    pub provider_idle_timeout: Duration,
    pub max_output_tokens: u32,
    pub limits: Limits,
    /// History tokens a request carries besides the system prompt and summary (M1).
    pub context_tokens: usize,
    /// Whether a chat's first turn is followed by a title call (T17).
    pub chat_titles: bool,
    pub max_body_bytes: usize,
    pub max_message_chars: usize,
    /// The most queued turns an agent may have (`BRAIN_QUEUE_MAX_PER_AGENT`, T13).
    pub queue_max_per_agent: u32,
    /// Of those, the most one principal (a key, a user) may have
    /// (`BRAIN_QUEUE_MAX_PER_PRINCIPAL`), so one cannot fill the queue for everyone.
    pub queue_max_per_principal: u32,
    /// After SIGTERM, how long running turns may go on before they are cancelled (O3).
    pub drain_timeout: Duration,
    /// This replica's lease (O3): renewed every quarter of it; a replica silent for longer
    /// is dead to the others, which end its running turns.
    pub lease_ttl: Duration,
    /// How long a turn waits for a client that stopped reading its stream (the chunk
    /// channel full) before it cancels the turn.
    pub client_stall_timeout: Duration,
    /// How long a tool call waits for a person's answer before it is denied as `expired`
    /// (A4).
    pub approval_ttl: Duration,
    /// The autostart scheduler (T11).
    pub autostart: AutostartConfig,
    pub log_json: bool,
    /// MCP connectors (SPEC B2).
    pub connectors: ConnectorConfig,
    /// Key secrets are encrypted under (`BRAIN_SECRETS_KEY`); unset, the secret tools
    /// answer that secrets are not configured (B1).
    pub secrets_key: Option<store::SecretsKey>,
    /// Where files and artifacts are kept (SPEC "object storage").
    pub artifacts: ArtifactsConfig,
    /// The bounds of files attached to chats (T22).
    pub files: FilesConfig,
    /// A team's knowledge bases and their indexing (B3, B4).
    pub knowledge: KnowledgeConfig,
    /// The bounds of a team's skills (B8).
    pub skills: SkillsConfig,
    /// The bounds of delegated tasks (B7, X5).
    pub delegation: DelegationConfig,
    /// The most tokens of recalled memories a turn's first request carries (M3,
    /// `BRAIN_MEMORY_RECALL_TOKENS`); `0` recalls nothing.
    pub memory_recall_tokens: usize,
    /// How often this replica tries to sweep what is past the teams' retention (L6,
    /// `BRAIN_RETENTION_SWEEP_INTERVAL_MS`); one replica sweeps at a time.
    pub retention_sweep_interval: Duration,
    /// Worker sessions and their channel (SPEC W).
    pub workers: WorkerConfig,
    /// A new team's quotas, until it overrides them (`BRAIN_QUOTA_<FIELD>`; unset is
    /// unlimited). SPEC T2, E2.
    pub quotas: crate::quota::Limits,
    /// What each API key and each JWT user may request, unless its team overrides it
    /// (`BRAIN_RATE_LIMIT_PER_SECOND`, `BRAIN_RATE_LIMIT_BURST`); `None`: unlimited.
    pub requests: Option<crate::quota::RequestLimit>,
    /// What each client address may request without valid credentials
    /// (`BRAIN_RATE_LIMIT_ANONYMOUS_PER_SECOND`, `BRAIN_RATE_LIMIT_ANONYMOUS_BURST`).
    pub anonymous_requests: Option<crate::quota::RequestLimit>,
    /// What decides dates (quota periods, the usage month, autostart ticks): the system's
    /// time; tests pin it. Not configurable from the environment.
    pub clock: crate::clock::Clock,
    /// The platform operator's bearer for the team API (`BRAIN_OPERATOR_TOKEN`, L1);
    /// `None`: the team API answers `404`.
    pub operator_token: Option<crate::auth::OperatorToken>,
    /// The proxies in front of the brain whose `X-Forwarded-For` names the client the
    /// audit log records (`BRAIN_TRUSTED_PROXIES`, L5); empty: the TCP peer is the client.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Bearer JWTs for frontends (`BRAIN_JWT_*`, SPEC X1); `None`: the deployment has no
    /// issuer of its own (teams' issuers still sign tokens for their team).
    pub jwt: Option<crate::auth::JwtConfig>,
    /// Whether teams' own JWT issuers may have their JWKS on private networks
    /// (`BRAIN_ISSUERS_ALLOW_PRIVATE_NETWORKS`); metadata addresses never.
    pub issuers_allow_private_networks: bool,
    /// Whether a team's provider connection (T14) may have its base URL on (or resolving
    /// to) a private network (`BRAIN_PROVIDERS_ALLOW_PRIVATE_NETWORKS`); metadata addresses
    /// never.
    pub providers_allow_private_networks: bool,
    /// The model catalog (T16): the shipped table with the operator's file
    /// (`BRAIN_MODEL_CATALOG_FILE`) over it, read once at start.
    pub model_catalog: std::sync::Arc<crate::models::catalog::Catalog>,
    /// The chat events stream (`BRAIN_EVENTS_*`, SPEC S2).
    pub events: EventsConfig,
    /// The MCP server's sessions (P2): `BRAIN_MCP_MAX_SESSIONS*`, `BRAIN_MCP_SESSION_IDLE_MS`.
    pub mcp_server: McpSessionLimits,
    /// OAuth for connectors (B2): the brain's public URL and pre-registered clients.
    pub oauth: OAuthConfig,
    /// Webhook deliveries (P4, `BRAIN_WEBHOOKS_*`).
    pub webhooks: WebhooksConfig,
    /// How long audit entries are kept (`BRAIN_AUDIT_RETENTION_DAYS`, L5).
    pub audit_retention_days: u32,
}

/// OAuth for connectors (SPEC B2): where the authorization server sends a person back, and
/// the clients an operator registered by hand at servers without dynamic registration.
#[derive(Clone, Debug)]
pub struct OAuthConfig {
    /// The brain's external base URL (`BRAIN_PUBLIC_URL`), without a trailing `/`.
    pub public_url: String,
    /// Pre-registered clients (`BRAIN_OAUTH_CLIENTS`), by connector URL or by its origin.
    pub clients: std::collections::HashMap<String, OAuthClient>,
}

impl OAuthConfig {
    /// Where the authorization server redirects a person after consent.
    pub fn redirect_uri(&self) -> String {
        format!("{}/v1/oauth/callback", self.public_url)
    }

    /// The URL of the brain's client ID metadata document, which is its client ID at
    /// authorization servers that accept those; they must fetch it, so only an `https`
    /// public URL offers one.
    pub fn client_metadata_url(&self) -> Option<String> {
        self.public_url
            .starts_with("https://")
            .then(|| format!("{}/v1/oauth/client-metadata.json", self.public_url))
    }

    /// The pre-registered client for a connector at `url`: by the exact URL, else by its
    /// origin.
    pub fn client_for(&self, url: &str) -> Option<&OAuthClient> {
        self.clients.get(url).or_else(|| {
            let origin = reqwest::Url::parse(url)
                .ok()?
                .origin()
                .ascii_serialization();
            self.clients.get(&origin)
        })
    }
}

/// A client registered at an authorization server by the operator. `Debug` redacts the
/// secret.
#[derive(Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthClient {
    pub client_id: String,
    #[serde(default)]
    pub client_secret: Option<String>,
}

impl std::fmt::Debug for OAuthClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthClient")
            .field("client_id", &self.client_id)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// `BRAIN_METRICS_ADDR`: `IP:port`, or `off`. Loopback by default, so a laptop exposes
/// nothing; the Helm chart sets `0.0.0.0:9465`.
fn metrics_addr(env: &dyn Env) -> Result<Option<SocketAddr>, ConfigError> {
    match trimmed(env, "BRAIN_METRICS_ADDR").as_deref() {
        Some("off") => Ok(None),
        _ => parse(env, "BRAIN_METRICS_ADDR", "127.0.0.1:9465").map(Some),
    }
}

/// `BRAIN_PUBLIC_URL`, by default `http://` and the listen address (an unspecified address
/// becomes `localhost`); `BRAIN_OAUTH_CLIENTS`, a JSON object from connector URL or origin
/// to `{"client_id", "client_secret"?}`.
fn oauth(env: &dyn Env, addr: SocketAddr) -> Result<OAuthConfig, ConfigError> {
    let default = if addr.ip().is_unspecified() {
        format!("http://localhost:{}", addr.port())
    } else {
        format!("http://{addr}")
    };
    let public_url = url_var(env, "BRAIN_PUBLIC_URL", &default)?;
    if !public_url.starts_with("http://") && !public_url.starts_with("https://") {
        return Err(ConfigError {
            name: "BRAIN_PUBLIC_URL",
            problem: "must be an http or https URL".into(),
        });
    }
    let clients = match non_empty(env, "BRAIN_OAUTH_CLIENTS") {
        None => Default::default(),
        // The error names the variable only: its text holds client secrets.
        Some(raw) => serde_json::from_str(&raw).map_err(|_| ConfigError {
            name: "BRAIN_OAUTH_CLIENTS",
            problem: "must be a JSON object from connector URL (or origin) to \
                      {\"client_id\", \"client_secret\"?}"
                .into(),
        })?,
    };
    Ok(OAuthConfig {
        public_url,
        clients,
    })
}

/// The chat events stream (S2): its window in Redis and the bounds that keep a turn from
/// ever waiting for it.
#[derive(Clone, Debug)]
pub struct EventsConfig {
    /// Events kept per chat (approximately: Redis trims whole nodes).
    pub max_len: u64,
    /// How long an event stays replayable.
    pub window: Duration,
    /// A `: keep-alive` comment after this long without an event.
    pub keepalive: Duration,
    /// Chunks waiting for this replica's publisher; beyond it they are dropped (counted)
    /// and the chat's observers get a `data-resync`.
    pub publish_buffer: usize,
    /// How long the publisher gathers chunks before it writes them: a turn's chunks of one
    /// write are one stream entry. Zero writes what is there at once.
    pub flush: Duration,
    /// Stream entries an observer may fall behind before it is disconnected.
    pub observer_buffer: usize,
    /// Bound on every Redis call of the events stream but the blocking read, which is
    /// bounded by its block time plus this.
    pub redis_timeout: Duration,
    /// Open observer streams (events and resumed turn streams) on this replica.
    pub max_observers: usize,
    /// Open observer streams of one principal (an API key, a token's user) on this
    /// replica.
    pub max_observers_per_principal: usize,
}

impl EventsConfig {
    /// The events streams' settings, from the environment.
    pub fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        Ok(Self {
            max_len: ranged(env, "BRAIN_EVENTS_MAX_LEN", 10_000, 1, 10_000_000)?,
            window: millis(env, "BRAIN_EVENTS_WINDOW_MS", 15 * 60_000)?,
            keepalive: millis(env, "BRAIN_EVENTS_KEEPALIVE_MS", 15_000)?,
            publish_buffer: ranged(env, "BRAIN_EVENTS_PUBLISH_BUFFER", 8192, 1, 1 << 24)?,
            flush: ranged(env, "BRAIN_EVENTS_FLUSH_MS", 10, 0, 1000).map(Duration::from_millis)?,
            observer_buffer: ranged(env, "BRAIN_EVENTS_OBSERVER_BUFFER", 512, 1, 1 << 20)?,
            redis_timeout: millis(env, "BRAIN_EVENTS_REDIS_TIMEOUT_MS", 1_000)?,
            max_observers: ranged(env, "BRAIN_EVENTS_MAX_OBSERVERS", 10_000, 1, 1 << 20)?,
            max_observers_per_principal: ranged(
                env,
                "BRAIN_EVENTS_MAX_OBSERVERS_PER_PRINCIPAL",
                100,
                1,
                1 << 20,
            )?,
        })
    }
}

/// Worker sessions: the channel's timeouts and the session token key.
#[derive(Clone)]
pub struct WorkerConfig {
    /// Shared with the runtime-manager (`SESSION_TOKEN_KEY`); required, but for the key
    /// development mode keeps in `.dev/` (`AGENT_RUNTIME_DEV`).
    pub token_key: Vec<u8>,
    /// Whether `token_key` is development mode's (logged as a warning at start).
    pub dev_token_key: bool,
    /// A second key whose tokens are accepted, never used to sign: the key being rotated
    /// in or out (`SESSION_TOKEN_KEY_ACCEPTED`, docs/OPERATIONS.md).
    pub token_key_accepted: Option<Vec<u8>>,
    /// Lifetime of tokens the brain mints when renewing in-band.
    pub token_ttl: Duration,
    /// Upgrade to MCP `initialize` done (W6 `handshake_timeout`).
    pub handshake_timeout: Duration,
    /// `initialize` to `tools/list` answered (W6 `ready_timeout`).
    pub ready_timeout: Duration,
    /// Pings on a live channel (W3: every 10-15 s).
    pub ping_interval: Duration,
    /// Silence after which a live worker is `heartbeat_lost` (W6).
    pub heartbeat_timeout: Duration,
    /// How long a tool call waits for its session to become ready, launch included.
    pub provision_timeout: Duration,
    /// How long a call for a `ready` session whose channel no replica holds waits for its
    /// worker to dial again before failing it `heartbeat_lost` (W9).
    pub redial_grace: Duration,
    /// The provision queue's key prefix, shared with the runtime-manager
    /// (`SESSION_QUEUE_NAMESPACE`; tests give each run its own).
    pub queue_namespace: String,
    /// How long a session started speculatively (W11) and left unused when its turn
    /// ended is kept for a call; `None` turns speculation off.
    pub speculation_grace: Option<Duration>,
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("dev_token_key", &self.dev_token_key)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("ready_timeout", &self.ready_timeout)
            .field("ping_interval", &self.ping_interval)
            .field("heartbeat_timeout", &self.heartbeat_timeout)
            .field("provision_timeout", &self.provision_timeout)
            .field("redial_grace", &self.redial_grace)
            .field("speculation_grace", &self.speculation_grace)
            .finish_non_exhaustive()
    }
}

fn workers(env: &dyn Env) -> Result<WorkerConfig, ConfigError> {
    let key = envcfg::session_token_key(env)?;
    let token_key_accepted = match non_empty(env, "SESSION_TOKEN_KEY_ACCEPTED") {
        Some(key) if key.len() >= 32 => Some(key.into_bytes()),
        Some(_) => {
            return Err(ConfigError {
                name: "SESSION_TOKEN_KEY_ACCEPTED",
                problem: "must have at least 32 bytes".into(),
            });
        }
        None => None,
    };
    Ok(WorkerConfig {
        token_key: key.bytes,
        dev_token_key: key.development,
        token_key_accepted,
        token_ttl: millis(env, "BRAIN_WORKER_TOKEN_TTL_MS", 10 * 60_000)?,
        handshake_timeout: millis(env, "BRAIN_WORKER_HANDSHAKE_TIMEOUT_MS", 10_000)?,
        ready_timeout: millis(env, "BRAIN_WORKER_READY_TIMEOUT_MS", 10_000)?,
        ping_interval: millis(env, "BRAIN_WORKER_PING_INTERVAL_MS", 12_000)?,
        heartbeat_timeout: millis(env, "BRAIN_WORKER_HEARTBEAT_TIMEOUT_MS", 30_000)?,
        provision_timeout: millis(env, "BRAIN_WORKER_PROVISION_TIMEOUT_MS", 60_000)?,
        redial_grace: millis(env, "BRAIN_WORKER_REDIAL_GRACE_MS", 5_000)?,
        queue_namespace: non_empty(env, "SESSION_QUEUE_NAMESPACE")
            .unwrap_or_else(|| "agent-runtime".to_owned()),
        speculation_grace: Some(Duration::from_millis(ranged(
            env,
            "BRAIN_WORKER_SPECULATION_GRACE_MS",
            10_000,
            0,
            600_000,
        )?))
        .filter(|grace| !grace.is_zero()),
    })
}

/// `BRAIN_QUOTA_TOKENS_PER_DAY` and the other five: a count, or unset / `unlimited`.
fn quotas(env: &dyn Env) -> Result<crate::quota::Limits, ConfigError> {
    use crate::quota::{Field, Limits, MAX_LIMIT};
    let mut limits = Limits::default();
    for field in Field::ALL {
        let name = match field {
            Field::TokensPerDay => "BRAIN_QUOTA_TOKENS_PER_DAY",
            Field::TokensPerMonth => "BRAIN_QUOTA_TOKENS_PER_MONTH",
            Field::TurnsPerMinute => "BRAIN_QUOTA_TURNS_PER_MINUTE",
            Field::ConcurrentTurns => "BRAIN_QUOTA_CONCURRENT_TURNS",
            Field::ConcurrentSessions => "BRAIN_QUOTA_CONCURRENT_SESSIONS",
            Field::WorkerSecondsPerDay => "BRAIN_QUOTA_WORKER_SECONDS_PER_DAY",
        };
        let value = match trimmed(env, name) {
            None => None,
            Some(v) if v.eq_ignore_ascii_case("unlimited") => None,
            Some(v) => Some(v.parse::<u64>().ok().filter(|n| *n <= MAX_LIMIT).ok_or(
                ConfigError {
                    name,
                    problem: format!("must be a count up to {MAX_LIMIT} or `unlimited`"),
                },
            )?),
        };
        limits.set(field, value);
    }
    Ok(limits)
}

/// A request rate limit from its two variables: requests per second (or `off`), and the
/// burst, twice the rate unless set.
fn request_limit(
    env: &dyn Env,
    [rate, burst]: [&'static str; 2],
    default_rate: u64,
) -> Result<Option<crate::quota::RequestLimit>, ConfigError> {
    use crate::quota::{MAX_REQUESTS, RequestLimit};
    if trimmed(env, rate).is_some_and(|v| v.eq_ignore_ascii_case("off")) {
        return Ok(None);
    }
    let per_second = ranged(env, rate, default_rate, 1, MAX_REQUESTS)?;
    let burst = ranged(
        env,
        burst,
        (per_second * 2).min(MAX_REQUESTS),
        1,
        MAX_REQUESTS,
    )?;
    Ok(Some(RequestLimit { per_second, burst }))
}

/// The artifact store: its backend and the size limit of one artifact.
#[derive(Clone, Debug)]
pub struct ArtifactsConfig {
    pub backend: ArtifactBackend,
    /// The largest artifact `save_artifact` accepts (`BRAIN_ARTIFACT_MAX_BYTES`).
    pub max_bytes: usize,
    /// How long a workspace snapshot is kept after it was taken
    /// (`BRAIN_SNAPSHOT_RETENTION_HOURS`, W10).
    pub snapshot_retention: Duration,
    /// How often this replica deletes expired snapshots and the bytes of deleted ones
    /// (`BRAIN_SNAPSHOT_SWEEP_INTERVAL_MS`).
    pub snapshot_sweep_interval: Duration,
    /// The most snapshot uploads this replica takes at once (`BRAIN_SNAPSHOT_UPLOADS`);
    /// one more is refused `503` with `Retry-After`.
    pub snapshot_uploads: usize,
    /// The most of them one team holds (`BRAIN_SNAPSHOT_UPLOADS_PER_TEAM`).
    pub snapshot_uploads_per_team: usize,
}

/// The bounds of files attached to chats (T22): each refused past its bound, nothing
/// stored.
#[derive(Clone, Copy, Debug)]
pub struct FilesConfig {
    /// The largest file, after an image was scaled down (`BRAIN_FILE_MAX_BYTES`).
    pub max_file_bytes: usize,
    /// The most bytes of files one message carries, new and uploaded before together
    /// (`BRAIN_FILE_MAX_BYTES_PER_MESSAGE`).
    pub max_message_bytes: usize,
    /// The most bytes a team's chat files hold, all chats together
    /// (`BRAIN_FILE_QUOTA_BYTES`).
    pub quota_bytes: u64,
    /// Chat file uploads (an upload's body, a message's `data:` parts) one replica reads and
    /// stores at once (`BRAIN_FILE_UPLOADS`), and one team of them (`BRAIN_FILE_UPLOADS_PER_TEAM`).
    pub uploads: usize,
    pub uploads_per_team: usize,
    /// The longest side of a stored image, in pixels: a larger one is scaled down to it
    /// (`BRAIN_FILE_IMAGE_MAX_SIDE`). 2048 is the largest side OpenAI's vision models
    /// keep; Anthropic's scale larger ones down themselves.
    pub image_max_side: u32,
    /// How long a signed download URL handed to a client stays valid, at least
    /// (`BRAIN_FILE_URL_TTL_SECS`, T26).
    pub url_ttl: Duration,
}

impl FilesConfig {
    fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        Ok(Self {
            max_file_bytes: ranged(env, "BRAIN_FILE_MAX_BYTES", 10 << 20, 1, 1 << 30)?,
            max_message_bytes: ranged(
                env,
                "BRAIN_FILE_MAX_BYTES_PER_MESSAGE",
                20 << 20,
                1,
                1 << 30,
            )?,
            quota_bytes: ranged(env, "BRAIN_FILE_QUOTA_BYTES", 1 << 30, 0, 1 << 50)?,
            uploads: ranged(env, "BRAIN_FILE_UPLOADS", 16, 1, 4096)?,
            uploads_per_team: ranged(env, "BRAIN_FILE_UPLOADS_PER_TEAM", 4, 1, 4096)?,
            image_max_side: ranged(env, "BRAIN_FILE_IMAGE_MAX_SIDE", 2048, 16, 16_384)?,
            url_ttl: ranged(env, "BRAIN_FILE_URL_TTL_SECS", 3600, 1, 7 * 86_400)
                .map(Duration::from_secs)?,
        })
    }
}

/// The bounds of a team's knowledge (B3, B4): each refused past its bound, nothing stored.
#[derive(Clone, Copy, Debug)]
pub struct KnowledgeConfig {
    /// The largest document (`BRAIN_KNOWLEDGE_MAX_FILE_BYTES`).
    pub max_file_bytes: usize,
    /// The most bytes a team's documents hold (`BRAIN_KNOWLEDGE_QUOTA_BYTES`).
    pub quota_bytes: u64,
    /// The most documents a team holds (`BRAIN_KNOWLEDGE_MAX_DOCUMENTS`).
    pub max_documents: u32,
    /// The most passages a team's documents are cut into (`BRAIN_KNOWLEDGE_MAX_CHUNKS`).
    pub max_chunks: u32,
    /// The most knowledge bases a team holds (`BRAIN_KNOWLEDGE_MAX_BASES`).
    pub max_bases: u32,
    /// The documents this replica indexes at once (`BRAIN_KNOWLEDGE_INDEXERS`); `0`: none.
    pub indexers: usize,
    /// The longest one document's indexing may take (`BRAIN_KNOWLEDGE_INDEX_TIMEOUT_MS`).
    pub index_timeout: Duration,
    /// The most of an agent's passages a turn's prompt recalls, in tokens
    /// (`BRAIN_KNOWLEDGE_RECALL_TOKENS`, B5); `0`: none.
    pub recall_tokens: usize,
}

impl KnowledgeConfig {
    fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        Ok(Self {
            max_file_bytes: ranged(env, "BRAIN_KNOWLEDGE_MAX_FILE_BYTES", 20 << 20, 1, 1 << 30)?,
            quota_bytes: ranged(env, "BRAIN_KNOWLEDGE_QUOTA_BYTES", 1 << 30, 0, 1 << 50)?,
            max_documents: ranged(env, "BRAIN_KNOWLEDGE_MAX_DOCUMENTS", 10_000, 0, 10_000_000)?,
            max_chunks: ranged(env, "BRAIN_KNOWLEDGE_MAX_CHUNKS", 200_000, 0, 100_000_000)?,
            max_bases: ranged(env, "BRAIN_KNOWLEDGE_MAX_BASES", 100, 0, 100_000)?,
            indexers: ranged(env, "BRAIN_KNOWLEDGE_INDEXERS", 2, 0, 64)?,
            index_timeout: ranged(
                env,
                "BRAIN_KNOWLEDGE_INDEX_TIMEOUT_MS",
                120_000,
                1,
                86_400_000,
            )
            .map(Duration::from_millis)?,
            recall_tokens: ranged(env, "BRAIN_KNOWLEDGE_RECALL_TOKENS", 1_500, 0, 100_000)?,
        })
    }
}

/// The bounds of delegation (B7, X5): how deep a chain of delegated tasks goes, how many
/// one turn runs at once, and how many model calls a whole tree of them makes.
#[derive(Clone, Copy, Debug)]
pub struct DelegationConfig {
    /// The deepest a delegated task may be, the turn a person started being depth 0
    /// (`BRAIN_DELEGATION_MAX_DEPTH`).
    pub max_depth: u32,
    /// The delegated tasks one turn runs at once (`BRAIN_DELEGATION_MAX_PARALLEL`).
    pub max_parallel: u32,
    /// The model calls the delegated turns of one tree make in all
    /// (`BRAIN_DELEGATION_MAX_TREE_MODEL_CALLS`).
    pub max_tree_model_calls: u32,
}

impl DelegationConfig {
    fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        Ok(Self {
            max_depth: ranged(env, "BRAIN_DELEGATION_MAX_DEPTH", 3, 0, 10)?,
            max_parallel: ranged(env, "BRAIN_DELEGATION_MAX_PARALLEL", 4, 1, 32)?,
            max_tree_model_calls: ranged(
                env,
                "BRAIN_DELEGATION_MAX_TREE_MODEL_CALLS",
                100,
                1,
                10_000,
            )?,
        })
    }
}

/// `BRAIN_ARTIFACTS_BACKEND`: a local directory (the embedded default) or an S3 bucket.
#[derive(Clone, Debug)]
pub enum ArtifactBackend {
    /// Files under this directory (`BRAIN_ARTIFACTS_DIR`).
    Local {
        dir: PathBuf,
    },
    S3(S3Config),
}

/// An S3 bucket, on AWS or any S3-compatible server (MinIO, s3s).
#[derive(Clone, Debug)]
pub struct S3Config {
    pub bucket: String,
    /// `None`: AWS's own endpoint for the region.
    pub endpoint: Option<String>,
    pub region: String,
    /// `http://host/bucket/key` instead of `http://bucket.host/key` (most S3-compatible
    /// servers need it).
    pub force_path_style: bool,
    pub credentials: S3Credentials,
}

/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`. `Debug` shows the key
/// id only, so a logged configuration never carries the secret.
#[derive(Clone)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// The turn's ceilings (SPEC T6).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Model calls per turn; the last answer is kept and the stream says so.
    pub max_iterations: u32,
    /// Data-changing tool calls per turn, across all tools.
    pub max_writes: u32,
    /// Further calls that continue an answer cut by the output limit (T19), each counted
    /// as a model call of the turn.
    pub max_continuations: u32,
    /// A turn with no progress for this long ends `failed` with `turn_stuck` (T20).
    pub stuck_after: Duration,
}

/// The autostart scheduler (SPEC T11).
#[derive(Clone, Copy, Debug)]
pub struct AutostartConfig {
    /// How often every replica looks for due agents (one indexed query).
    pub poll: Duration,
    /// The shortest interval between two firings a cadence may have.
    pub min_interval_secs: u32,
}

impl AutostartConfig {
    /// The scheduler's poll and the shortest cadence, from the environment.
    pub fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        Ok(Self {
            poll: ranged(env, "BRAIN_AUTOSTART_POLL_MS", 1_000, 50, 60_000)
                .map(Duration::from_millis)?,
            min_interval_secs: ranged(env, "BRAIN_AUTOSTART_MIN_INTERVAL_SECS", 60, 1, 86_400)?,
        })
    }
}

/// How the brain runs connectors (SPEC B2).
#[derive(Clone, Copy, Debug)]
pub struct ConnectorConfig {
    /// Whether a connector may be a local command (stdio); off, only URLs are accepted.
    pub allow_stdio: bool,
    /// Whether a connector URL may reach loopback and private ranges (a cluster's own MCP
    /// servers). Link-local and cloud metadata addresses are refused regardless.
    pub allow_private_networks: bool,
    /// Connect, `initialize` and `tools/list`, per connector and turn.
    pub startup_timeout: Duration,
    /// One `tools/call`.
    pub call_timeout: Duration,
}

impl ConnectorConfig {
    /// What connectors may be and how long they may take, from the environment.
    pub fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        Ok(Self {
            allow_stdio: parse(env, "BRAIN_CONNECTORS_ALLOW_STDIO", "false")?,
            allow_private_networks: parse(env, "BRAIN_CONNECTORS_ALLOW_PRIVATE_NETWORKS", "false")?,
            startup_timeout: millis(env, "BRAIN_CONNECTOR_STARTUP_TIMEOUT_MS", 10_000)?,
            call_timeout: millis(env, "BRAIN_CONNECTOR_CALL_TIMEOUT_MS", 300_000)?,
        })
    }
}

/// How this replica delivers webhooks (P4).
#[derive(Clone, Copy, Debug)]
pub struct WebhooksConfig {
    /// Whether a webhook URL may reach loopback and private ranges. Link-local and cloud
    /// metadata addresses are refused regardless.
    pub allow_private_networks: bool,
    /// The wait after a first failed attempt, doubled after each (at most an hour).
    pub retry_base: Duration,
    /// One attempt: connect, send, and the response's status and headers.
    pub timeout: Duration,
    /// Attempts this replica makes at once; 0: it delivers nothing (other replicas do).
    pub max_in_flight: usize,
    /// Of those, the most one team's deliveries hold at once, so a team whose receivers
    /// never answer leaves the other slots to everyone else.
    pub max_in_flight_per_team: usize,
    /// A2A push notifications one team may have pending (queued, or promised to a task
    /// that has not ended): past it a new push config is refused (`push_backlog_full`).
    pub max_pending_pushes_per_team: i64,
    /// How often this replica looks for due deliveries.
    pub poll: Duration,
}

impl WebhooksConfig {
    /// Webhook and push deliveries' settings, from the environment.
    pub fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        Ok(Self {
            allow_private_networks: parse(env, "BRAIN_WEBHOOKS_ALLOW_PRIVATE_NETWORKS", "false")?,
            retry_base: ranged(env, "BRAIN_WEBHOOKS_RETRY_BASE_MS", 5_000, 10, 3_600_000)
                .map(Duration::from_millis)?,
            timeout: ranged(env, "BRAIN_WEBHOOKS_TIMEOUT_MS", 10_000, 100, 60_000)
                .map(Duration::from_millis)?,
            max_in_flight: ranged(env, "BRAIN_WEBHOOKS_MAX_IN_FLIGHT", 16, 0, 1_000)?,
            max_in_flight_per_team: ranged(
                env,
                "BRAIN_WEBHOOKS_MAX_IN_FLIGHT_PER_TEAM",
                4,
                1,
                1_000,
            )?,
            max_pending_pushes_per_team: ranged(
                env,
                "BRAIN_A2A_MAX_PENDING_PUSHES_PER_TEAM",
                1_000,
                1,
                1_000_000,
            )?,
            poll: ranged(env, "BRAIN_WEBHOOKS_POLL_MS", 1_000, 50, 60_000)
                .map(Duration::from_millis)?,
        })
    }
}

#[derive(Clone, Debug)]
pub struct ProviderConfig {
    pub base_url: String,
    pub api_key: Option<String>,
}

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres:postgres@127.0.0.1:5432/agent_runtime";
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

impl Config {
    pub fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        let (openai, anthropic, demo_model) = providers(env)?;
        let addr = parse(env, "BRAIN_ADDR", "127.0.0.1:8080")?;
        Ok(Self {
            addr,
            metrics_addr: metrics_addr(env)?,
            database_url: url_var(env, "DATABASE_URL", DEFAULT_DATABASE_URL)?,
            database_direct_url: match non_empty(env, "DATABASE_DIRECT_URL") {
                Some(_) => Some(url_var(env, "DATABASE_DIRECT_URL", "")?),
                None => None,
            },
            database_max_connections: ranged(env, "BRAIN_DATABASE_MAX_CONNECTIONS", 20, 1, 1000)?,
            database_statement_timeout: ranged(
                env,
                "BRAIN_DATABASE_STATEMENT_TIMEOUT_MS",
                store::DEFAULT_STATEMENT_TIMEOUT.as_millis() as u64,
                100,
                60_000,
            )
            .map(Duration::from_millis)?,
            intake: crate::intake::IntakeConfig {
                queue: ranged(env, "BRAIN_INTAKE_QUEUE", 10_000, 0, 1_000_000)?,
                wait: millis(env, "BRAIN_INTAKE_QUEUE_WAIT_MS", 30_000)?,
            },
            redis_url: url_var(env, "REDIS_URL", DEFAULT_REDIS_URL)?,
            redis_cluster_urls: envcfg::redis_urls(env, "REDIS_CLUSTER_URLS")?,
            openai,
            anthropic,
            demo_model,
            provider_connect_timeout: millis(env, "BRAIN_PROVIDER_CONNECT_TIMEOUT_MS", 30_000)?,
            provider_idle_timeout: millis(env, "BRAIN_PROVIDER_IDLE_TIMEOUT_MS", 120_000)?,
            max_output_tokens: ranged(env, "BRAIN_MAX_OUTPUT_TOKENS", 4096, 1, 1_000_000)?,
            context_tokens: ranged(env, "BRAIN_CONTEXT_TOKENS", 24_000, 100, 10_000_000)?,
            chat_titles: parse(env, "BRAIN_CHAT_TITLES", "true")?,
            limits: Limits {
                max_iterations: ranged(env, "BRAIN_MAX_ITERATIONS", 8, 1, 100)?,
                max_writes: ranged(env, "BRAIN_MAX_WRITES_PER_TURN", 3, 0, 100)?,
                max_continuations: ranged(env, "BRAIN_MAX_CONTINUATIONS", 2, 0, 20)?,
                stuck_after: ranged(env, "BRAIN_TURN_STUCK_AFTER_MS", 300_000, 100, 86_400_000)
                    .map(Duration::from_millis)?,
            },
            max_body_bytes: ranged(env, "BRAIN_MAX_BODY_BYTES", 1 << 20, 1024, 64 << 20)?,
            max_message_chars: ranged(env, "BRAIN_MAX_MESSAGE_CHARS", 100_000, 1, 10_000_000)?,
            queue_max_per_agent: ranged(env, "BRAIN_QUEUE_MAX_PER_AGENT", 16, 0, 10_000)?,
            queue_max_per_principal: ranged(env, "BRAIN_QUEUE_MAX_PER_PRINCIPAL", 8, 0, 10_000)?,
            // Fits Kubernetes' default 30 s grace period, with room for the close.
            drain_timeout: millis(env, "BRAIN_DRAIN_TIMEOUT_MS", 25_000)?,
            lease_ttl: ranged(env, "BRAIN_LEASE_TTL_MS", 6_000, 400, 3_600_000)
                .map(Duration::from_millis)?,
            client_stall_timeout: millis(env, "BRAIN_CLIENT_STALL_TIMEOUT_MS", 30_000)?,
            approval_ttl: ranged(env, "BRAIN_APPROVAL_TTL_MS", 86_400_000, 1, 31_536_000_000)
                .map(Duration::from_millis)?,
            autostart: AutostartConfig::from_env(env)?,
            connectors: ConnectorConfig::from_env(env)?,
            secrets_key: secrets_key(env)?,
            artifacts: artifacts(env)?,
            files: FilesConfig::from_env(env)?,
            knowledge: KnowledgeConfig::from_env(env)?,
            skills: SkillsConfig::from_env(env)?,
            delegation: DelegationConfig::from_env(env)?,
            memory_recall_tokens: ranged(env, "BRAIN_MEMORY_RECALL_TOKENS", 1_000, 0, 100_000)?,
            retention_sweep_interval: millis(env, "BRAIN_RETENTION_SWEEP_INTERVAL_MS", 300_000)?,
            workers: workers(env)?,
            quotas: quotas(env)?,
            clock: crate::clock::Clock::system(),
            requests: request_limit(
                env,
                ["BRAIN_RATE_LIMIT_PER_SECOND", "BRAIN_RATE_LIMIT_BURST"],
                200,
            )?,
            anonymous_requests: request_limit(
                env,
                [
                    "BRAIN_RATE_LIMIT_ANONYMOUS_PER_SECOND",
                    "BRAIN_RATE_LIMIT_ANONYMOUS_BURST",
                ],
                50,
            )?,
            operator_token: crate::auth::OperatorToken::from_env(env)?,
            trusted_proxies: trusted_proxies(env)?,
            jwt: crate::auth::JwtConfig::from_env(env)?,
            issuers_allow_private_networks: parse(
                env,
                "BRAIN_ISSUERS_ALLOW_PRIVATE_NETWORKS",
                "false",
            )?,
            providers_allow_private_networks: parse(
                env,
                "BRAIN_PROVIDERS_ALLOW_PRIVATE_NETWORKS",
                "false",
            )?,
            model_catalog: model_catalog(env)?,
            oauth: oauth(env, addr)?,
            webhooks: WebhooksConfig::from_env(env)?,
            audit_retention_days: ranged(env, "BRAIN_AUDIT_RETENTION_DAYS", 400, 1, 36_500)?,
            events: EventsConfig::from_env(env)?,
            mcp_server: McpSessionLimits::from_env(env)?,
            log_json: log_json(env)?,
        })
    }
}

/// The bounds of a skill's archive (B8); each refused with nothing stored.
#[derive(Clone, Copy, Debug)]
pub struct SkillsConfig {
    /// The largest archive uploaded (`BRAIN_SKILL_MAX_ARCHIVE_BYTES`).
    pub max_archive_bytes: usize,
    /// The most bytes its files hold unpacked, all together (`BRAIN_SKILL_MAX_BYTES`).
    pub max_bytes: u64,
    /// The largest one file (`BRAIN_SKILL_MAX_FILE_BYTES`).
    pub max_file_bytes: u64,
    /// The most files in it (`BRAIN_SKILL_MAX_FILES`).
    pub max_files: usize,
    /// The most skills (names) a team holds (`BRAIN_SKILLS_MAX`).
    pub max_per_team: u32,
}

impl SkillsConfig {
    pub fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        Ok(Self {
            max_archive_bytes: ranged(env, "BRAIN_SKILL_MAX_ARCHIVE_BYTES", 10 << 20, 1, 1 << 30)?,
            max_bytes: ranged(env, "BRAIN_SKILL_MAX_BYTES", 20 << 20, 1, 1 << 32)?,
            max_file_bytes: ranged(env, "BRAIN_SKILL_MAX_FILE_BYTES", 5 << 20, 1, 1 << 32)?,
            max_files: ranged(env, "BRAIN_SKILL_MAX_FILES", 500, 1, 100_000)?,
            max_per_team: ranged(env, "BRAIN_SKILLS_MAX", 200, 0, 100_000)?,
        })
    }
}

/// `BRAIN_MODEL_CATALOG_FILE`: a JSON file of models per connection name, over the shipped
/// table; a file that cannot be read or is not a valid catalog stops the start.
fn model_catalog(
    env: &dyn Env,
) -> Result<std::sync::Arc<crate::models::catalog::Catalog>, ConfigError> {
    let path = trimmed(env, "BRAIN_MODEL_CATALOG_FILE").map(PathBuf::from);
    crate::models::catalog::Catalog::load(path.as_deref())
        .map(std::sync::Arc::new)
        .map_err(|err| ConfigError {
            name: "BRAIN_MODEL_CATALOG_FILE",
            problem: err.to_string(),
        })
}

/// The environment's provider endpoints, and whether the offline demo model answers
/// (`auto`: when no provider has a key).
fn providers(env: &dyn Env) -> Result<(ProviderConfig, ProviderConfig, bool), ConfigError> {
    let openai = ProviderConfig {
        base_url: url_var(env, "OPENAI_BASE_URL", "https://api.openai.com/v1")?,
        api_key: non_empty(env, "OPENAI_API_KEY"),
    };
    let anthropic = ProviderConfig {
        base_url: url_var(env, "ANTHROPIC_BASE_URL", "https://api.anthropic.com")?,
        api_key: non_empty(env, "ANTHROPIC_API_KEY"),
    };
    let any_key = openai.api_key.is_some() || anthropic.api_key.is_some();
    let demo_model = match non_empty(env, "BRAIN_DEMO_MODEL").as_deref() {
        None | Some("auto") => !any_key,
        Some("on") => true,
        Some("off") => false,
        Some(_) => {
            return Err(ConfigError {
                name: "BRAIN_DEMO_MODEL",
                problem: "must be one of auto, on, off".into(),
            });
        }
    };
    Ok((openai, anthropic, demo_model))
}

/// `BRAIN_LOG_FORMAT`: `text` (the default) or `json`.
fn log_json(env: &dyn Env) -> Result<bool, ConfigError> {
    match non_empty(env, "BRAIN_LOG_FORMAT").as_deref() {
        None | Some("text") => Ok(false),
        Some("json") => Ok(true),
        Some(_) => Err(ConfigError {
            name: "BRAIN_LOG_FORMAT",
            problem: "must be text or json".into(),
        }),
    }
}

/// `BRAIN_TRUSTED_PROXIES`: comma-separated networks (`10.0.0.0/8`) or addresses.
fn trusted_proxies(env: &dyn Env) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    let name = "BRAIN_TRUSTED_PROXIES";
    let Some(raw) = non_empty(env, name) else {
        return Ok(Vec::new());
    };
    raw.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            entry
                .parse::<ipnet::IpNet>()
                .or_else(|_| entry.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map(|net| net.trunc())
                .map_err(|_| ConfigError {
                    name,
                    problem: "must be a comma-separated list of networks (10.0.0.0/8) or addresses"
                        .into(),
                })
        })
        .collect()
}

/// `BRAIN_SECRETS_KEY`: unset means secrets are off; nothing is generated in its place.
fn secrets_key(env: &dyn Env) -> Result<Option<store::SecretsKey>, ConfigError> {
    let Some(raw) = non_empty(env, "BRAIN_SECRETS_KEY") else {
        return Ok(None);
    };
    store::SecretsKey::parse(&raw)
        .map(Some)
        .map_err(|problem| ConfigError {
            name: "BRAIN_SECRETS_KEY",
            problem: problem.into(),
        })
}

/// The artifact store's variables; the S3 ones are required only with `s3`.
fn artifacts(env: &dyn Env) -> Result<ArtifactsConfig, ConfigError> {
    let max_bytes = ranged(env, "BRAIN_ARTIFACT_MAX_BYTES", 25 << 20, 1, 1 << 30)?;
    let backend = match non_empty(env, "BRAIN_ARTIFACTS_BACKEND").as_deref() {
        None | Some("local") => ArtifactBackend::Local {
            dir: PathBuf::from(
                trimmed(env, "BRAIN_ARTIFACTS_DIR")
                    .unwrap_or_else(|| "./.dev/artifacts".to_owned()),
            ),
        },
        Some("s3") => ArtifactBackend::S3(s3_config(env)?),
        Some(_) => {
            return Err(ConfigError {
                name: "BRAIN_ARTIFACTS_BACKEND",
                problem: "must be local or s3".into(),
            });
        }
    };
    let retention_hours: u64 = ranged(env, "BRAIN_SNAPSHOT_RETENTION_HOURS", 168, 1, 87_600)?;
    Ok(ArtifactsConfig {
        backend,
        max_bytes,
        snapshot_retention: Duration::from_secs(retention_hours * 3600),
        snapshot_sweep_interval: millis(env, "BRAIN_SNAPSHOT_SWEEP_INTERVAL_MS", 60_000)?,
        snapshot_uploads: ranged(env, "BRAIN_SNAPSHOT_UPLOADS", 8, 1, 1024)?,
        snapshot_uploads_per_team: ranged(env, "BRAIN_SNAPSHOT_UPLOADS_PER_TEAM", 4, 1, 1024)?,
    })
}

fn s3_config(env: &dyn Env) -> Result<S3Config, ConfigError> {
    let required = |name: &'static str| {
        trimmed(env, name).ok_or(ConfigError {
            name,
            problem: "must be set when BRAIN_ARTIFACTS_BACKEND=s3".into(),
        })
    };
    let bucket = required("BRAIN_S3_BUCKET")?;
    // S3's bucket naming rules, which also keep the name safe in a path or host name.
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
        && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !bucket_ok {
        return Err(ConfigError {
            name: "BRAIN_S3_BUCKET",
            problem: "must be an S3 bucket name (3-63 of a-z, 0-9, '.', '-')".into(),
        });
    }
    let endpoint = match non_empty(env, "BRAIN_S3_ENDPOINT") {
        None => None,
        Some(_) => {
            let url = url_var(env, "BRAIN_S3_ENDPOINT", "")?;
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError {
                    name: "BRAIN_S3_ENDPOINT",
                    problem: "must be an http:// or https:// URL".into(),
                });
            }
            Some(url)
        }
    };
    let region = trimmed(env, "BRAIN_S3_REGION").unwrap_or_else(|| "us-east-1".to_owned());
    if region.len() > 64
        || !region
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(ConfigError {
            name: "BRAIN_S3_REGION",
            problem: "must be a region name such as us-east-1".into(),
        });
    }
    Ok(S3Config {
        bucket,
        endpoint,
        region,
        force_path_style: parse(env, "BRAIN_S3_FORCE_PATH_STYLE", "false")?,
        credentials: S3Credentials {
            access_key_id: required("AWS_ACCESS_KEY_ID")?,
            secret_access_key: required("AWS_SECRET_ACCESS_KEY")?,
            session_token: trimmed(env, "AWS_SESSION_TOKEN"),
        },
    })
}

/// The caps on the MCP server's sessions (`/mcp`) and how long an idle one is kept.
#[derive(Clone, Copy, Debug)]
pub struct McpSessionLimits {
    /// Open sessions on this replica.
    pub max: usize,
    /// Open sessions of one principal (an API key, a token's user) on this replica.
    pub max_per_principal: usize,
    /// A session with no call in flight and no request for this long is dropped (a
    /// client that never sends `DELETE /mcp` does not hold its place for ever).
    pub idle: Duration,
}

impl McpSessionLimits {
    /// The MCP server's session caps, from the environment.
    pub fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        Ok(Self {
            max: ranged(env, "BRAIN_MCP_MAX_SESSIONS", 10_000, 1, 1 << 20)?,
            max_per_principal: ranged(env, "BRAIN_MCP_MAX_SESSIONS_PER_PRINCIPAL", 20, 1, 1 << 20)?,
            idle: millis(env, "BRAIN_MCP_SESSION_IDLE_MS", 30 * 60_000)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef0123456789abcdef";

    /// The variables of `pairs`, with a session-token key unless they set one.
    fn env(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        let mut vars = envcfg::vars(&[("SESSION_TOKEN_KEY", KEY)]);
        vars.extend(envcfg::vars(pairs));
        vars
    }

    #[test]
    fn without_a_session_token_key_the_start_is_refused() {
        let err = Config::from_env(&envcfg::vars(&[])).unwrap_err();
        assert_eq!(err.name, "SESSION_TOKEN_KEY");
        let config = Config::from_env(&env(&[])).unwrap();
        assert_eq!(config.workers.token_key, KEY.as_bytes());
        assert!(!config.workers.dev_token_key);
    }

    #[test]
    fn defaults_are_the_embedded_setup() {
        let config = Config::from_env(&env(&[])).unwrap();
        assert_eq!(config.addr.to_string(), "127.0.0.1:8080");
        assert_eq!(
            config.metrics_addr.map(|a| a.to_string()).as_deref(),
            Some("127.0.0.1:9465")
        );
        let off = Config::from_env(&env(&[("BRAIN_METRICS_ADDR", "off")])).unwrap();
        assert_eq!(off.metrics_addr, None);
        let err = Config::from_env(&env(&[("BRAIN_METRICS_ADDR", "metrics:1")])).unwrap_err();
        assert_eq!(err.name, "BRAIN_METRICS_ADDR");
        assert_eq!(config.database_url, DEFAULT_DATABASE_URL);
        // Under the 5 s request bound, and within the quota rebuild's 2 min margin.
        assert_eq!(config.database_statement_timeout, Duration::from_secs(4));
        let err = Config::from_env(&env(&[("BRAIN_DATABASE_STATEMENT_TIMEOUT_MS", "60001")]))
            .unwrap_err();
        assert_eq!(err.name, "BRAIN_DATABASE_STATEMENT_TIMEOUT_MS");
        assert!(config.demo_model, "no key means the offline demo model");
        assert!(
            !config.connectors.allow_stdio,
            "stdio connectors are opt-in"
        );
        assert_eq!(config.connectors.startup_timeout, Duration::from_secs(10));
        let err = Config::from_env(&env(&[("BRAIN_CONNECTORS_ALLOW_STDIO", "yes")])).unwrap_err();
        assert_eq!(err.name, "BRAIN_CONNECTORS_ALLOW_STDIO");
        assert!(config.secrets_key.is_none(), "no key is generated");
        assert_eq!(
            config.redis_cluster_urls, None,
            "one Redis node unless told"
        );
        let cluster = Config::from_env(&env(&[(
            "REDIS_CLUSTER_URLS",
            "redis://10.0.0.1:6379,redis://10.0.0.2:6379",
        )]))
        .unwrap();
        assert_eq!(cluster.redis_cluster_urls.map(|u| u.len()), Some(2));
        let err = Config::from_env(&env(&[("REDIS_CLUSTER_URLS", "10.0.0.1:6379")])).unwrap_err();
        assert_eq!(err.name, "REDIS_CLUSTER_URLS");
    }

    #[test]
    fn a_bad_model_catalog_file_stops_the_start() {
        let config = Config::from_env(&env(&[])).unwrap();
        assert!(!config.model_catalog.models("anthropic").is_empty());
        let err = Config::from_env(&env(&[(
            "BRAIN_MODEL_CATALOG_FILE",
            "/nonexistent/models.json",
        )]))
        .unwrap_err();
        assert_eq!(err.name, "BRAIN_MODEL_CATALOG_FILE");
    }

    #[test]
    fn request_rate_limits_default_on_and_turn_off() {
        use crate::quota::RequestLimit;
        let limit = |per_second, burst| Some(RequestLimit { per_second, burst });
        let config = Config::from_env(&env(&[])).unwrap();
        assert_eq!(config.requests, limit(200, 400));
        assert_eq!(config.anonymous_requests, limit(50, 100));
        let set = Config::from_env(&env(&[
            ("BRAIN_RATE_LIMIT_PER_SECOND", "10"),
            ("BRAIN_RATE_LIMIT_ANONYMOUS_PER_SECOND", "off"),
            ("BRAIN_RATE_LIMIT_ANONYMOUS_BURST", "not read"),
        ]))
        .unwrap();
        assert_eq!(set.requests, limit(10, 20), "the burst follows the rate");
        assert_eq!(set.anonymous_requests, None);
        let err = Config::from_env(&env(&[("BRAIN_RATE_LIMIT_BURST", "0")])).unwrap_err();
        assert_eq!(err.name, "BRAIN_RATE_LIMIT_BURST");
    }

    #[test]
    fn oauth_public_url_and_clients() {
        let config = Config::from_env(&env(&[])).unwrap();
        assert_eq!(config.oauth.public_url, "http://127.0.0.1:8080");
        assert_eq!(
            config.oauth.redirect_uri(),
            "http://127.0.0.1:8080/v1/oauth/callback"
        );
        assert_eq!(config.oauth.client_metadata_url(), None, "not over http");
        let anywhere = Config::from_env(&env(&[("BRAIN_ADDR", "0.0.0.0:9000")])).unwrap();
        assert_eq!(anywhere.oauth.public_url, "http://localhost:9000");

        let config = Config::from_env(&env(&[
            ("BRAIN_PUBLIC_URL", "https://brain.example.com/"),
            (
                "BRAIN_OAUTH_CLIENTS",
                r#"{"https://mcp.example.com": {"client_id": "c1", "client_secret": "s3cret"},
                    "https://other.example/mcp": {"client_id": "c2"}}"#,
            ),
        ]))
        .unwrap();
        assert_eq!(
            config.oauth.client_metadata_url().as_deref(),
            Some("https://brain.example.com/v1/oauth/client-metadata.json")
        );
        let by_origin = config
            .oauth
            .client_for("https://mcp.example.com/a/mcp")
            .unwrap();
        assert_eq!(by_origin.client_id, "c1");
        assert!(
            !format!("{config:?}").contains("s3cret"),
            "the secret is redacted"
        );
        assert_eq!(
            config
                .oauth
                .client_for("https://other.example/mcp")
                .unwrap()
                .client_id,
            "c2"
        );
        assert!(config.oauth.client_for("https://other.example/x").is_none());

        for (name, value) in [
            ("BRAIN_PUBLIC_URL", "ftp://x"),
            (
                "BRAIN_OAUTH_CLIENTS",
                r#"{"u": {"client_id": "c", "secret": "s3cret"}}"#,
            ),
        ] {
            let err = Config::from_env(&env(&[(name, value)])).unwrap_err();
            assert_eq!(err.name, name);
            assert!(!err.problem.contains("s3cret"));
        }
    }

    #[test]
    fn artifact_backends() {
        let config = Config::from_env(&env(&[])).unwrap();
        assert_eq!(config.artifacts.max_bytes, 25 << 20);
        assert!(matches!(
            &config.artifacts.backend,
            ArtifactBackend::Local { dir } if dir == &PathBuf::from("./.dev/artifacts")
        ));
        let s3 = [
            ("BRAIN_ARTIFACTS_BACKEND", "s3"),
            ("BRAIN_S3_BUCKET", "artifacts"),
            ("BRAIN_S3_ENDPOINT", "http://127.0.0.1:9000/"),
            ("BRAIN_S3_FORCE_PATH_STYLE", "true"),
            ("AWS_ACCESS_KEY_ID", "AKID"),
            ("AWS_SECRET_ACCESS_KEY", "very-secret-value"),
        ];
        let config = Config::from_env(&env(&s3)).unwrap();
        let ArtifactBackend::S3(s3_config) = &config.artifacts.backend else {
            panic!("expected s3");
        };
        assert_eq!(s3_config.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(s3_config.region, "us-east-1");
        assert!(s3_config.force_path_style);
        assert!(
            !format!("{config:?}").contains("very-secret-value"),
            "Debug never shows the secret key"
        );
        let without_secret: Vec<_> = s3
            .iter()
            .copied()
            .filter(|(k, _)| *k != "AWS_SECRET_ACCESS_KEY")
            .collect();
        let err = Config::from_env(&env(&without_secret)).unwrap_err();
        assert_eq!(err.name, "AWS_SECRET_ACCESS_KEY");
        let err = Config::from_env(&env(&[("BRAIN_ARTIFACTS_BACKEND", "gcs")])).unwrap_err();
        assert_eq!(err.name, "BRAIN_ARTIFACTS_BACKEND");
        let mut bad_bucket = s3.to_vec();
        bad_bucket[1] = ("BRAIN_S3_BUCKET", "../etc");
        let err = Config::from_env(&env(&bad_bucket)).unwrap_err();
        assert_eq!(err.name, "BRAIN_S3_BUCKET");
    }

    #[test]
    fn a_provider_key_turns_the_demo_model_off() {
        let config = Config::from_env(&env(&[("ANTHROPIC_API_KEY", "k")])).unwrap();
        assert!(!config.demo_model);
    }

    #[test]
    fn errors_name_the_variable_not_the_value() {
        let err = Config::from_env(&env(&[("BRAIN_ADDR", "nonsense-secret")])).unwrap_err();
        assert_eq!(err.name, "BRAIN_ADDR");
        assert!(!err.to_string().contains("nonsense-secret"));
        let err = Config::from_env(&env(&[("BRAIN_MAX_OUTPUT_TOKENS", "0")])).unwrap_err();
        assert_eq!(err.name, "BRAIN_MAX_OUTPUT_TOKENS");
        let err = Config::from_env(&env(&[("DATABASE_URL", "mysql://x")])).unwrap_err();
        assert_eq!(err.name, "DATABASE_URL");
        let err = Config::from_env(&env(&[("BRAIN_SECRETS_KEY", "too-short-secret")])).unwrap_err();
        assert_eq!(err.name, "BRAIN_SECRETS_KEY");
        assert!(!err.to_string().contains("too-short-secret"));
    }
}
