//! Which adapter a route calls (T14): a route is `<connection>/<model>`, the connection
//! the deployment's `openai` or `anthropic` (from the environment, every team's) or one of
//! the caller's team's own (`provider_connections`), and what makes a connection valid.
//!
//! Each replica keeps one [`Connections`]. A built-in name resolves without Postgres. A
//! team's connections are read together and kept for [`TEAM_TTL`]: a change made on
//! another replica is seen within that bound (a write on this replica forgets the team's
//! at once). An adapter is built once per (connection id, `updated_at`) and reused while
//! the row is unchanged; every team adapter shares one HTTP client whose resolver judges
//! each address by the connector address rule (`address.rs`), under
//! `BRAIN_PROVIDERS_ALLOW_PRIVATE_NETWORKS`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use protocol::TeamId;
use providers::route::{MAX_CONNECTION_NAME, adapter, is_connection_name};
use providers::{
    Endpoint, Message, ModelProvider, ModelRequest, ModelRoute, ProviderError, ProviderKind,
    Providers,
};
use store::{ConnectionKeyed, NewProviderConnection, ProviderConnectionChange, Store, StoreError};
use uuid::Uuid;

use super::catalog::ModelFacts;
use crate::address;

/// How long a replica trusts the team's connections it read: the staleness bound of a
/// change made on another replica.
pub const TEAM_TTL: Duration = Duration::from_secs(5);

/// At most one `last_error` write per connection and replica in this long: a failing
/// connection under load costs one write, not one per call.
const ERROR_RECORD_INTERVAL: Duration = Duration::from_secs(30);

/// Teams kept at once; past it the expired ones are dropped.
const MAX_TEAMS_KEPT: usize = 10_000;

/// The most declared models a connection may have.
const MAX_DECLARED_MODELS: usize = 200;

/// The setting that lets a connection's base URL reach private networks.
pub const ALLOW_PRIVATE_SETTING: &str = "BRAIN_PROVIDERS_ALLOW_PRIVATE_NETWORKS";

/// A route made ready to call.
#[derive(Clone)]
pub struct Resolved {
    pub provider: Arc<dyn ModelProvider>,
    pub kind: ProviderKind,
    /// The model's name at the provider.
    pub model: String,
    /// The team connection's id; `None` for a built-in one.
    pub connection: Option<Uuid>,
}

/// Why a route cannot be called: the turn treats it as an unavailable provider and
/// tries the next.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("the route is not <connection>/<model>")]
    Malformed,
    /// No connection of that name in the team (deleted since the agent was written).
    #[error("no such connection")]
    UnknownConnection,
    /// The connection exists but cannot be called (its key does not decrypt, its kind or
    /// address is refused here); the class says which.
    #[error("connection unusable: {0}")]
    Unusable(&'static str),
    #[error("connections unreadable: {}", .0.metric_label())]
    Store(#[from] StoreError),
}

impl RouteError {
    /// A bounded label for logs.
    pub fn class(&self) -> &'static str {
        match self {
            Self::Malformed => "malformed_route",
            Self::UnknownConnection => "unknown_connection",
            Self::Unusable(class) => class,
            Self::Store(_) => "store",
        }
    }
}

/// A team connection as this replica built it.
#[derive(Clone)]
struct Built {
    id: Uuid,
    updated_at: DateTime<Utc>,
    kind: ProviderKind,
    adapter: Result<Arc<dyn ModelProvider>, &'static str>,
}

struct TeamEntry {
    read_at: Instant,
    by_name: Arc<HashMap<String, Built>>,
}

struct Inner {
    builtins: Providers,
    store: Store,
    /// Every team adapter's client: no proxy, no redirects, each address judged.
    client: reqwest::Client,
    connect_timeout: Duration,
    idle_timeout: Duration,
    allow_private: bool,
    teams: Mutex<HashMap<TeamId, TeamEntry>>,
    /// When each connection's last error was written by this replica.
    errors_written: Mutex<HashMap<Uuid, Instant>>,
}

/// This replica's resolver of routes; cheap to clone.
#[derive(Clone)]
pub struct Connections(Arc<Inner>);

/// How [`Connections`] reaches the providers.
pub struct ConnectionsConfig {
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    /// `BRAIN_PROVIDERS_ALLOW_PRIVATE_NETWORKS`.
    pub allow_private_networks: bool,
}

impl Connections {
    pub fn new(builtins: Providers, store: Store, config: ConnectionsConfig) -> Self {
        // Timeouts are applied per phase by the adapters; the client's only bound is the
        // connect, so a long answer is never cut.
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(address::CheckedResolver {
                allow_private_networks: config.allow_private_networks,
            })
            .build()
            .unwrap_or_default();
        Self(Arc::new(Inner {
            builtins,
            store,
            client,
            connect_timeout: config.connect_timeout,
            idle_timeout: config.idle_timeout,
            allow_private: config.allow_private_networks,
            teams: Mutex::default(),
            errors_written: Mutex::default(),
        }))
    }

    /// Whether private networks are allowed for base URLs.
    pub fn allow_private_networks(&self) -> bool {
        self.0.allow_private
    }

    /// The adapter and model `route` names for `team`.
    pub async fn resolve(&self, team: TeamId, route: &str) -> Result<Resolved, RouteError> {
        let parsed = ModelRoute::parse(route).map_err(|_| RouteError::Malformed)?;
        if let Some((kind, provider)) = self.0.builtins.builtin(parsed.connection) {
            return Ok(Resolved {
                provider: provider.clone(),
                kind,
                model: parsed.model.to_owned(),
                connection: None,
            });
        }
        let team_connections = self.team(team).await?;
        let built = team_connections
            .get(parsed.connection)
            .ok_or(RouteError::UnknownConnection)?;
        let provider = built.adapter.clone().map_err(RouteError::Unusable)?;
        Ok(Resolved {
            provider,
            kind: built.kind,
            model: parsed.model.to_owned(),
            connection: Some(built.id),
        })
    }

    /// Forgets what this replica read of `team`'s connections (after a write here).
    pub fn forget(&self, team: TeamId) {
        self.lock_teams().remove(&team);
    }

    fn lock_teams(&self) -> std::sync::MutexGuard<'_, HashMap<TeamId, TeamEntry>> {
        self.0
            .teams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The team's connections by name, as read at most [`TEAM_TTL`] ago.
    async fn team(&self, team: TeamId) -> Result<Arc<HashMap<String, Built>>, StoreError> {
        let previous = {
            let teams = self.lock_teams();
            match teams.get(&team) {
                Some(entry) if entry.read_at.elapsed() < TEAM_TTL => {
                    return Ok(entry.by_name.clone());
                }
                entry => entry.map(|e| e.by_name.clone()),
            }
        };
        let read_at = Instant::now();
        let rows = self.0.store.provider_connections_with_keys(team).await?;
        let by_name: HashMap<String, Built> = rows
            .into_iter()
            .map(|row| {
                let kept = previous
                    .as_ref()
                    .and_then(|p| p.get(&row.name))
                    .filter(|b| b.id == row.id && b.updated_at == row.updated_at);
                let built = match kept {
                    Some(built) => built.clone(),
                    None => self.build(&row),
                };
                (row.name, built)
            })
            .collect();
        let by_name = Arc::new(by_name);
        let mut teams = self.lock_teams();
        if teams.len() >= MAX_TEAMS_KEPT {
            teams.retain(|_, e| e.read_at.elapsed() < TEAM_TTL);
        }
        teams.insert(
            team,
            TeamEntry {
                read_at,
                by_name: by_name.clone(),
            },
        );
        Ok(by_name)
    }

    /// The adapter of a connection row, or why it cannot be called.
    fn build(&self, row: &ConnectionKeyed) -> Built {
        let kind = ProviderKind::parse_kind(&row.kind);
        let adapter = (|| {
            let kind = kind.ok_or("unknown_kind")?;
            // An address literal never reaches the client's resolver: judged here.
            let url = reqwest::Url::parse(&row.base_url).map_err(|_| "invalid_url")?;
            address::check_url(&url, self.0.allow_private).map_err(address::Refused::class)?;
            let api_key = row.api_key.clone().map_err(|_| "key_unreadable")?;
            Ok(adapter(
                kind,
                self.0.client.clone(),
                self.endpoint(&row.base_url, api_key),
            ))
        })();
        Built {
            id: row.id,
            updated_at: row.updated_at,
            kind: kind.unwrap_or(ProviderKind::OpenAi),
            adapter,
        }
    }

    fn endpoint(&self, base_url: &str, api_key: Option<String>) -> Endpoint {
        Endpoint {
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            connect_timeout: self.0.connect_timeout,
            idle_timeout: self.0.idle_timeout,
        }
    }

    /// A call through the team's `connection` (`None`: a built-in one, which records
    /// nothing) failed with `err`: recorded as its last error, at most once per
    /// [`ERROR_RECORD_INTERVAL`] here, in the background.
    pub fn failed(&self, team: TeamId, connection: Option<Uuid>, err: &ProviderError) {
        let Some(id) = connection else {
            return;
        };
        {
            let mut written = self
                .0
                .errors_written
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if written
                .get(&id)
                .is_some_and(|at| at.elapsed() < ERROR_RECORD_INTERVAL)
            {
                return;
            }
            if written.len() >= MAX_TEAMS_KEPT {
                written.retain(|_, at| at.elapsed() < ERROR_RECORD_INTERVAL);
            }
            written.insert(id, Instant::now());
        }
        let store = self.0.store.clone();
        let (class, description) = (err.metric_label(), err.to_string());
        tokio::spawn(async move {
            if let Err(e) = store
                .record_provider_error(team, id, class, &description)
                .await
            {
                tracing::info!(connection = %id, class = e.metric_label(), "provider error not recorded");
            }
        });
    }

    /// A minimal call (one output token) to `model` through the team's connection `id`:
    /// its latency, or the provider's error; recorded on the connection either way.
    pub async fn check(
        &self,
        team: TeamId,
        id: Uuid,
        model: &str,
    ) -> Result<Result<Duration, ProviderError>, RouteError> {
        let row = self.0.store.provider_connection_with_key(team, id).await?;
        let provider = self.build(&row).adapter.map_err(RouteError::Unusable)?;
        let request = ModelRequest {
            model: model.to_owned(),
            system: String::new(),
            messages: vec![Message::User("ping".into())],
            tools: Default::default(),
            max_output_tokens: 1,
        };
        let started = Instant::now();
        let outcome = first_event(provider.as_ref(), &request).await;
        let latency = started.elapsed();
        let recorded = match &outcome {
            Ok(()) => {
                let ms = u32::try_from(latency.as_millis()).unwrap_or(u32::MAX);
                self.0.store.record_provider_check(team, id, ms).await
            }
            Err(err) => {
                let description = err.to_string();
                self.0
                    .store
                    .record_provider_error(team, id, err.metric_label(), &description)
                    .await
            }
        };
        recorded?;
        Ok(outcome.map(|()| latency))
    }
}

/// Sends `request` and waits for the provider's first event (or the end of a stream that
/// has none, which is a success).
async fn first_event(
    provider: &dyn ModelProvider,
    request: &ModelRequest,
) -> Result<(), ProviderError> {
    let mut stream = provider.stream(request).await?;
    match stream.next().await {
        Some(Ok(_)) | None => Ok(()),
        Some(Err(err)) => Err(err),
    }
}

/// A connection as an admin asks for it: what [`validate_new`] checks.
pub struct Requested {
    pub name: String,
    pub kind: String,
    pub base_url: String,
    pub api_key: Option<String>,
    pub models: Vec<ModelFacts>,
}

/// Checks a new connection; the message says what is wrong. `allow_private` is
/// `BRAIN_PROVIDERS_ALLOW_PRIVATE_NETWORKS`.
pub fn validate_new(
    requested: Requested,
    allow_private: bool,
) -> Result<NewProviderConnection, String> {
    validate_name(&requested.name)?;
    if ProviderKind::parse_kind(&requested.kind).is_none() {
        let kinds: Vec<&str> = ProviderKind::ALL.iter().map(|k| k.as_str()).collect();
        return Err(format!("kind must be one of {}", kinds.join(", ")));
    }
    let base_url = validate_base_url(&requested.base_url, allow_private)?;
    let api_key = requested.api_key.map(validate_key).transpose()?;
    Ok(NewProviderConnection {
        name: requested.name,
        kind: requested.kind,
        base_url,
        api_key,
        models: validate_models(&requested.models)?,
    })
}

/// Checks a change's fields as [`validate_new`] does.
pub fn validate_change(
    change: ProviderConnectionChange,
    declared: Option<&[ModelFacts]>,
    allow_private: bool,
) -> Result<ProviderConnectionChange, String> {
    if let Some(name) = &change.name {
        validate_name(name)?;
    }
    Ok(ProviderConnectionChange {
        base_url: change
            .base_url
            .map(|url| validate_base_url(&url, allow_private))
            .transpose()?,
        api_key: change
            .api_key
            .map(|key| key.map(validate_key).transpose())
            .transpose()?,
        models: declared.map(validate_models).transpose()?,
        ..change
    })
}

fn validate_name(name: &str) -> Result<(), String> {
    if !is_connection_name(name) {
        return Err(format!(
            "name must match [a-z0-9][a-z0-9_-]{{0,{}}}",
            MAX_CONNECTION_NAME - 1
        ));
    }
    if Providers::BUILTIN.contains(&name) {
        return Err(format!(
            "name `{name}` is the deployment's own connection; choose another"
        ));
    }
    Ok(())
}

fn validate_base_url(raw: &str, allow_private: bool) -> Result<String, String> {
    address::valid_url(raw, allow_private, ALLOW_PRIVATE_SETTING)
        .map(|url| url.as_str().trim_end_matches('/').to_owned())
        .map_err(|problem| format!("base_{problem}"))
}

fn validate_key(key: String) -> Result<String, String> {
    let key = key.trim().to_owned();
    if key.is_empty() || key.len() > 4096 || key.chars().any(char::is_control) {
        return Err("api_key must have 1 to 4096 characters, without control characters".into());
    }
    Ok(key)
}

fn validate_models(models: &[ModelFacts]) -> Result<serde_json::Value, String> {
    if models.len() > MAX_DECLARED_MODELS {
        return Err(format!("at most {MAX_DECLARED_MODELS} models"));
    }
    for facts in models {
        facts
            .validate()
            .map_err(|problem| format!("models: {problem}"))?;
    }
    serde_json::to_value(models).map_err(|_| "models are not serializable".to_owned())
}

/// Why an agent's routes are refused beyond their syntax.
#[derive(Debug, thiserror::Error)]
pub enum RouteCheckError {
    /// A route names a connection the team does not have; the message names it.
    #[error("{0}")]
    Unknown(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Checks that every connection `routes` name is the team's or a built-in one (T14): an
/// agent (its model, its fallbacks) may name nothing else. A route that does not parse
/// is left to the route's own check.
pub async fn check_routes(
    store: &Store,
    team: TeamId,
    routes: &[&str],
) -> Result<(), RouteCheckError> {
    let mut wanted: Vec<String> = routes
        .iter()
        .filter_map(|route| ModelRoute::parse(route).ok())
        .map(|route| route.connection)
        .filter(|name| !Providers::BUILTIN.contains(name))
        .map(str::to_owned)
        .collect();
    wanted.sort();
    wanted.dedup();
    if wanted.is_empty() {
        return Ok(());
    }
    let known = store.provider_connection_names(team, &wanted).await?;
    wanted.retain(|name| !known.contains(name));
    if wanted.is_empty() {
        return Ok(());
    }
    Err(RouteCheckError::Unknown(format!(
        "this team has no provider connection named {} (every team has {}; add one with \
         POST /v1/providers)",
        wanted.join(", "),
        Providers::BUILTIN.join(" and ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requested(name: &str, kind: &str, base_url: &str) -> Requested {
        Requested {
            name: name.into(),
            kind: kind.into(),
            base_url: base_url.into(),
            api_key: Some(" sk-team-1234 ".into()),
            models: Vec::new(),
        }
    }

    #[test]
    fn a_connection_is_named_kinded_and_addressed_by_the_rules() {
        let ok = validate_new(
            requested("vllm-1", "openai", "https://llm.example.com/v1/"),
            false,
        )
        .unwrap();
        assert_eq!(ok.base_url, "https://llm.example.com/v1");
        assert_eq!(ok.api_key.as_deref(), Some("sk-team-1234"));
        for (name, kind, url, problem) in [
            (
                "openai",
                "openai",
                "https://x.example.com",
                "deployment's own",
            ),
            ("Bad", "openai", "https://x.example.com", "name must match"),
            (
                "ok",
                "gemini",
                "https://x.example.com",
                "kind must be one of",
            ),
            (
                "ok",
                "openai",
                "http://127.0.0.1:8000/v1",
                "BRAIN_PROVIDERS_ALLOW_PRIVATE_NETWORKS",
            ),
            ("ok", "openai", "http://169.254.169.254/", "metadata"),
            ("ok", "openai", "ftp://x.example.com", "http or https"),
        ] {
            let err = validate_new(requested(name, kind, url), false)
                .err()
                .unwrap();
            assert!(err.contains(problem), "{name} {kind} {url}: {err}");
        }
        assert!(validate_new(requested("ok", "anthropic", "http://127.0.0.1:8000"), true).is_ok());
        assert!(validate_new(requested("ok", "openai", "http://169.254.169.254/"), true).is_err());
    }

    #[test]
    fn a_route_error_has_a_class_for_logs() {
        assert_eq!(RouteError::UnknownConnection.class(), "unknown_connection");
        assert_eq!(
            RouteError::Unusable("key_unreadable").class(),
            "key_unreadable"
        );
    }
}
