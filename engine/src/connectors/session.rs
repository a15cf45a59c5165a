//! One MCP client session with a connector's server, for one turn.
//!
//! An HTTP session may carry a bearer token (an OAuth grant's, [`super::oauth`]); a server
//! that answers `401` or `403 insufficient_scope` is reported as such
//! ([`ConnectError::NeedsAuthorization`], [`ConnectError::InsufficientScope`]) with its
//! `WWW-Authenticate` challenge, which [`super::oauth::begin`] takes.

use std::process::Stdio;
use std::sync::Arc;

use channel::mask::Masks;
use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationCapability, FormElicitationCapability, Implementation, ProtocolVersion,
};
use rmcp::service::RequestContext;
use rmcp::service::{ClientInitializeError, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, InsufficientScopeError, StreamableHttpClientTransport,
    StreamableHttpClientTransportConfig,
};
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient, ServiceError, ServiceExt};
use tokio_util::sync::CancellationToken;

use super::ConnectorConfig;
use super::credentials::Resolved;
pub use super::elicitation::Asking;
use crate::address;
use store::{ConnectorRow, ConnectorTarget};

/// The variables a stdio child may see; everything else of the brain's environment (keys,
/// database URL) stays out.
const PASSED_ENV: [&str; 6] = ["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// Why a session could not start.
pub enum ConnectError {
    /// The server answered `401`: it wants a token, or the one sent is no longer good.
    NeedsAuthorization { challenge: String },
    /// The server answered `403` with `insufficient_scope`: the token lacks scopes the
    /// challenge names (a step-up authorization asks for them).
    InsufficientScope { challenge: String },
    /// Anything else, as an error class.
    Other(&'static str),
}

impl ConnectError {
    pub fn class(&self) -> &'static str {
        match self {
            Self::NeedsAuthorization { .. } => "needs_authorization",
            Self::InsufficientScope { .. } => "insufficient_scope",
            Self::Other(class) => class,
        }
    }

    /// The challenge when the server asked for authorization, else `None`.
    pub fn challenge(&self) -> Option<&str> {
        match self {
            Self::NeedsAuthorization { challenge } | Self::InsufficientScope { challenge } => {
                Some(challenge)
            }
            Self::Other(_) => None,
        }
    }
}

/// Header values stay out of logs (SPEC X4): the class only.
impl std::fmt::Debug for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.class())
    }
}

impl From<&'static str> for ConnectError {
    fn from(class: &'static str) -> Self {
        Self::Other(class)
    }
}

/// The authorization challenge behind a failed request (a token that expired or lacks a
/// scope in the middle of a session), if that is why it failed.
pub fn auth_challenge(error: &ServiceError) -> Option<ConnectError> {
    let ServiceError::TransportSend(error) = error else {
        return None;
    };
    challenge_in(error.error.as_ref())
}

fn challenge_in(error: &(dyn std::error::Error + 'static)) -> Option<ConnectError> {
    let mut source = Some(error);
    while let Some(current) = source {
        if let Some(e) = current.downcast_ref::<AuthRequiredError>() {
            return Some(ConnectError::NeedsAuthorization {
                challenge: e.www_authenticate_header.clone(),
            });
        }
        if let Some(e) = current.downcast_ref::<InsufficientScopeError>() {
            return Some(ConnectError::InsufficientScope {
                challenge: e.www_authenticate_header.clone(),
            });
        }
        source = current.source();
    }
    None
}

/// A running client session. Dropping it cancels the session's task, which closes the
/// transport (ends the HTTP session, or stops the child process).
pub struct Session {
    pub name: String,
    /// The credentials this session sent, masked in whatever the server answers.
    pub masks: Arc<Masks>,
    /// The session's running calls, which its server's questions are asked through (P5).
    pub asking: Arc<Asking>,
    client: RunningService<RoleClient, Client>,
}

impl Session {
    pub fn peer(&self) -> &Peer<RoleClient> {
        self.client.peer()
    }

    /// Connects, initializes and lists the tools within the startup timeout and `cancel`;
    /// an HTTP session sends `bearer` as its `Authorization`. The error is a class for
    /// logs and the status (never a message from the server), or the server's challenge.
    pub async fn start(
        row: &ConnectorRow,
        config: &ConnectorConfig,
        credentials: &Resolved,
        bearer: Option<&str>,
        answerer: Answerer,
        cancel: &CancellationToken,
    ) -> Result<(Self, Vec<rmcp::model::Tool>), ConnectError> {
        let started = async {
            let asking = Arc::new(Asking::new(&row.name));
            let client = connect(row, config, credentials, bearer, answerer, &asking).await?;
            let tools = client.peer().list_all_tools().await.map_err(|e| {
                auth_challenge(&e).unwrap_or(ConnectError::Other("list_tools_failed"))
            })?;
            Ok((
                Self {
                    name: row.name.clone(),
                    masks: Arc::new(credentials.masks(bearer)),
                    asking,
                    client,
                },
                tools,
            ))
        };
        // Dropping `started` on a timeout or a cancel drops the transport, which ends the
        // connection or kills the child.
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err("cancelled".into()),
            timed = tokio::time::timeout(config.startup_timeout, started) => match timed {
                Ok(result) => result,
                Err(_) => Err("timeout".into()),
            },
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        tracing::debug!(connector = %self.name, "closing connector session");
    }
}

/// Who answers a server's `elicitation/create` during a session (P5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answerer {
    /// No person can be asked (a background or autostart turn): declined at once, so the
    /// server knows and goes on.
    Nobody,
    /// A person who submits the form as it is pre-filled: the requested schema's
    /// defaults. The conformance client's stand-in for the person.
    Defaults,
    /// The person in the chat of an interactive turn, through a pending approval the call
    /// waits on for at most `ttl` (the approvals' expiry).
    Person { ttl: std::time::Duration },
}

/// The client side of a connector session: what it declares and how it answers the
/// server's requests.
pub struct Client {
    answerer: Answerer,
    asking: Arc<Asking>,
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        client_info()
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        if let Answerer::Person { ttl } = self.answerer {
            return Ok(self.asking.ask(request, ttl, &context.ct).await);
        }
        let schema = match (&request, self.answerer) {
            (
                ElicitRequestParams::FormElicitationParams {
                    requested_schema, ..
                },
                Answerer::Defaults,
            ) => serde_json::to_value(requested_schema).unwrap_or_default(),
            // A URL elicitation needs a person to open it; nobody can here.
            _ => return Ok(ElicitResult::new(ElicitationAction::Decline)),
        };
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(form_defaults(&schema)))
    }
}

/// The form a requested schema pre-fills: each property's `default`, where it has one
/// (SEP-1034).
pub fn form_defaults(schema: &serde_json::Value) -> serde_json::Value {
    let filled: serde_json::Map<String, serde_json::Value> = schema["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, property)| Some((name.clone(), property.get("default")?.clone())))
        .collect();
    serde_json::Value::Object(filled)
}

/// The brain runs the `initialize` handshake, so it asks for the newest revision that has
/// one (2025-11-25, the one the official conformance suite checks); rmcp's default is a
/// later revision without it. It declares form elicitation (P5): a server may ask, and a
/// session that cannot ask a person declines (say so to the server) rather than leaving
/// the server to guess.
fn client_info() -> ClientConfig {
    let mut elicitation = ElicitationCapability::new();
    elicitation.form = Some(FormElicitationCapability::new());
    let mut capabilities = ClientCapabilities::default();
    capabilities.elicitation = Some(elicitation);
    ClientConfig::new(
        capabilities,
        Implementation::new("agent-runtime-brain", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

async fn connect(
    row: &ConnectorRow,
    config: &ConnectorConfig,
    credentials: &Resolved,
    bearer: Option<&str>,
    answerer: Answerer,
    asking: &Arc<Asking>,
) -> Result<RunningService<RoleClient, Client>, ConnectError> {
    let client = Client {
        answerer,
        asking: asking.clone(),
    };
    match &row.target {
        ConnectorTarget::Http { url, .. } => {
            let url = reqwest::Url::parse(url).map_err(|_| "invalid_url")?;
            let pinned = address::resolve(&url, config.allow_private_networks).await?;
            let mut transport_config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            transport_config.custom_headers = credentials.headers.iter().cloned().collect();
            // rmcp adds the `Bearer ` prefix.
            transport_config.auth_header = bearer.map(str::to_owned);
            let transport =
                StreamableHttpClientTransport::with_client(http_client(pinned)?, transport_config);
            client.serve(transport).await.map_err(init_class)
        }
        ConnectorTarget::Stdio { command, .. } => {
            if !config.allow_stdio {
                return Err("stdio_disabled".into());
            }
            let transport = spawn(command, &credentials.env).map_err(|_| "spawn_failed")?;
            client.serve(transport).await.map_err(init_class)
        }
    }
}

/// The HTTP client of one connector session. Like rmcp's own: no idle pooling, and only
/// same-origin 307 and 308 redirects (a POST keeps its body, and the session id and
/// headers go to no other host). Unlike it: a host name connects only to the addresses
/// that were checked (`pinned`), and no system proxy is used, because the address rule
/// must judge the address actually connected to.
fn http_client(
    pinned: Option<(String, Vec<std::net::SocketAddr>)>,
) -> Result<reqwest::Client, &'static str> {
    const MAX_REDIRECTS: usize = 10;
    let redirects = reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if keeps_body && same_origin && attempt.previous().len() <= MAX_REDIRECTS {
            attempt.follow()
        } else {
            attempt.stop()
        }
    });
    let mut builder = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .redirect(redirects)
        .no_proxy();
    if let Some((host, addresses)) = pinned {
        builder = builder.resolve_to_addrs(&host, &addresses);
    }
    builder.build().map_err(|_| "client_failed")
}

/// Starts `command` in a process group of its own (so stopping it also stops whatever it
/// started) with a scrubbed environment plus the connector's own `env`, and no stderr.
fn spawn(command: &[String], env: &[(String, String)]) -> std::io::Result<TokioChildProcess> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).env_clear();
    for name in PASSED_ENV {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    cmd.envs(env.iter().map(|(name, value)| (name, value)));
    let mut wrapped = CommandWrap::from(cmd);
    wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
    let (transport, _stderr) = TokioChildProcess::builder(wrapped)
        .stderr(Stdio::null())
        .spawn()?;
    Ok(transport)
}

fn init_class(err: ClientInitializeError) -> ConnectError {
    match err {
        ClientInitializeError::TransportError { error, .. } => {
            challenge_in(error.error.as_ref()).unwrap_or(ConnectError::Other("unreachable"))
        }
        ClientInitializeError::ConnectionClosed(_) => "connection_closed".into(),
        ClientInitializeError::JsonRpcError(_) => "initialize_rejected".into(),
        ClientInitializeError::Cancelled => "cancelled".into(),
        _ => "initialize_failed".into(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::form_defaults;

    #[test]
    fn the_form_is_pre_filled_with_the_schema_defaults() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "Ada"},
            "age": {"type": "integer", "default": 36},
            "plan": {"type": "string", "enum": ["a", "b"], "default": "b"},
            "note": {"type": "string"},
        }});
        assert_eq!(
            form_defaults(&schema),
            json!({"name": "Ada", "age": 36, "plan": "b"})
        );
        assert_eq!(form_defaults(&json!({})), json!({}));
    }
}
