//! One MCP client session with a connector's server, for one turn.

use std::collections::BTreeMap;
use std::process::Stdio;

use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use protocol::{AgentId, TeamId};
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{ClientInitializeError, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
};
use rmcp::{Peer, RoleClient, ServiceExt};
use tokio_util::sync::CancellationToken;

use super::credentials::{self, Resolved};
use super::{ConnectorConfig, address};
use crate::store::{ConnectorRow, ConnectorTarget, Store};

/// The variables a stdio child may see; everything else of the brain's environment (keys,
/// database URL) stays out.
const PASSED_ENV: [&str; 6] = ["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// A running client session. Dropping it cancels the session's task, which closes the
/// transport (ends the HTTP session, or stops the child process).
pub(super) struct Session {
    pub name: String,
    client: RunningService<RoleClient, ClientConfig>,
}

impl Session {
    pub fn peer(&self) -> &Peer<RoleClient> {
        self.client.peer()
    }

    /// Connects, initializes and lists the tools within the startup timeout and `cancel`.
    /// The error is a class for logs and the status (never a message from the server).
    pub async fn start(
        row: &ConnectorRow,
        config: &ConnectorConfig,
        owner: (&Store, TeamId, AgentId),
        cancel: &CancellationToken,
    ) -> Result<(Self, Vec<rmcp::model::Tool>), &'static str> {
        let started = async {
            let (store, team, agent) = owner;
            let none = BTreeMap::new();
            let (headers, env) = match &row.target {
                ConnectorTarget::Http { headers, .. } => (headers, &none),
                ConnectorTarget::Stdio { env, .. } => (&none, env),
            };
            let resolved = credentials::resolve(store, team, agent, headers, env).await?;
            let client = connect(row, config, resolved).await?;
            let tools = client
                .peer()
                .list_all_tools()
                .await
                .map_err(|_| "list_tools_failed")?;
            Ok((
                Self {
                    name: row.name.clone(),
                    client,
                },
                tools,
            ))
        };
        // Dropping `started` on a timeout or a cancel drops the transport, which ends the
        // connection or kills the child.
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err("cancelled"),
            timed = tokio::time::timeout(config.startup_timeout, started) => match timed {
                Ok(result) => result,
                Err(_) => Err("timeout"),
            },
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        tracing::debug!(connector = %self.name, "closing connector session");
    }
}

fn client_info() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("agent-runtime-brain", env!("CARGO_PKG_VERSION")),
    )
}

async fn connect(
    row: &ConnectorRow,
    config: &ConnectorConfig,
    credentials: Resolved,
) -> Result<RunningService<RoleClient, ClientConfig>, &'static str> {
    match &row.target {
        ConnectorTarget::Http { url, .. } => {
            let url = reqwest::Url::parse(url).map_err(|_| "invalid_url")?;
            let pinned = address::resolve(&url, config.allow_private_networks).await?;
            let mut transport_config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            transport_config.custom_headers = credentials.headers.into_iter().collect();
            let transport =
                StreamableHttpClientTransport::with_client(http_client(pinned)?, transport_config);
            client_info().serve(transport).await.map_err(init_class)
        }
        ConnectorTarget::Stdio { command, .. } => {
            if !config.allow_stdio {
                return Err("stdio_disabled");
            }
            let transport = spawn(command, &credentials.env).map_err(|_| "spawn_failed")?;
            client_info().serve(transport).await.map_err(init_class)
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

fn init_class(err: ClientInitializeError) -> &'static str {
    match err {
        ClientInitializeError::TransportError { .. } => "unreachable",
        ClientInitializeError::ConnectionClosed(_) => "connection_closed",
        ClientInitializeError::JsonRpcError(_) => "initialize_rejected",
        ClientInitializeError::Cancelled => "cancelled",
        _ => "initialize_failed",
    }
}
