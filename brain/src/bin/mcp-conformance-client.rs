//! The brain's connector client under the official MCP conformance suite
//! (`@modelcontextprotocol/conformance`, run by `brain/tests/all/mcp_conformance.rs`).
//!
//! Like the suite's example clients: the scenario is `MCP_CONFORMANCE_SCENARIO`, its
//! context (a pre-registered client) `MCP_CONFORMANCE_CONTEXT`, the server URL the last
//! argument. It connects through the brain's own code, [`Session::start`] (the turn's
//! connect path: address rule, pinned DNS, `initialize`, `tools/list`) and
//! [`connectors::oauth`] (discovery, registration, PKCE, token exchange), then calls each
//! tool as a model would.
//!
//! What it adds is the person the brain sends to the authorization URL: it opens that URL
//! without following the redirect and hands the `code`, `state` and `iss` of the
//! `Location` to [`oauth::finish`], as the brain's callback route does. The brain offers
//! no client capability (no sampling, no elicitation: no person sits inside a tool call),
//! so neither does this client.

use std::time::Duration;

use anyhow::{Context, bail};
use engine::connectors::ConnectorConfig;
use engine::connectors::credentials::Resolved;
use engine::connectors::oauth::{self, ClientOptions, Grant, PreRegistered};
use engine::connectors::session::{self, ConnectError, Session};
use rmcp::model::{CallToolRequestParams, Tool};
use serde_json::{Map, Value};
use store::{ConnectorRow, ConnectorTarget};
use tokio_util::sync::CancellationToken;

/// Where the authorization server sends the person back; the suite's servers redirect
/// there without calling it.
const REDIRECT_URI: &str = "http://localhost:3000/callback";
/// The client ID metadata document a brain serving one would name (the suite expects
/// this URL; it fetches nothing).
const CLIENT_METADATA_URL: &str = "https://conformance-test.local/client-metadata.json";
/// Authorizations one connection may ask the person for before giving up (the spec asks
/// for a limit on repeated `403 insufficient_scope`).
const MAX_AUTHORIZATIONS: usize = 3;

#[derive(Default, serde::Deserialize)]
struct ScenarioContext {
    client_id: Option<String>,
    client_secret: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args()
        .next_back()
        .context("usage: mcp-conformance-client URL")?;
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    let context: ScenarioContext = match std::env::var("MCP_CONFORMANCE_CONTEXT") {
        Ok(json) => serde_json::from_str(&json).context("MCP_CONFORMANCE_CONTEXT")?,
        Err(_) => ScenarioContext::default(),
    };
    eprintln!("scenario {scenario} against {url}");
    let client = Client::new(url, &context)?;
    client.run().await
}

struct Client {
    row: ConnectorRow,
    config: ConnectorConfig,
    http: oauth::Http,
    options: ClientOptions,
    cancel: CancellationToken,
}

impl Client {
    fn new(url: String, context: &ScenarioContext) -> anyhow::Result<Self> {
        Ok(Self {
            row: ConnectorRow {
                id: uuid::Uuid::now_v7(),
                agent_id: None,
                name: "conformance".into(),
                // No static credentials: the scenarios authorize with OAuth.
                target: ConnectorTarget::Http {
                    url,
                    headers: Default::default(),
                },
                call_timeout_ms: None,
                trust_hints: false,
                tool_risks: Default::default(),
                created_at: chrono::Utc::now(),
            },
            // The suite's servers are on loopback.
            config: ConnectorConfig {
                allow_stdio: false,
                allow_private_networks: true,
                startup_timeout: Duration::from_secs(10),
                call_timeout: Duration::from_secs(10),
            },
            http: oauth::Http::new(true)?,
            options: ClientOptions {
                redirect_uri: REDIRECT_URI.into(),
                client_name: "agent-runtime-brain".into(),
                client_metadata_url: Some(CLIENT_METADATA_URL.into()),
                preregistered: context.client_id.clone().map(|client_id| PreRegistered {
                    client_id,
                    client_secret: context.client_secret.clone(),
                }),
                scopes: Vec::new(),
            },
            cancel: CancellationToken::new(),
        })
    }

    fn server_url(&self) -> &str {
        match &self.row.target {
            ConnectorTarget::Http { url, .. } => url,
            ConnectorTarget::Stdio { .. } => "",
        }
    }

    async fn run(&self) -> anyhow::Result<()> {
        let mut grant: Option<Grant> = None;
        let mut authorizations = 0;
        let (mut session, tools) = self.connect(&mut grant, &mut authorizations).await?;
        eprintln!("connected; {} tools", tools.len());
        for tool in &tools {
            loop {
                let params = CallToolRequestParams::new(tool.name.clone())
                    .with_arguments(arguments_for(tool));
                let called = tokio::time::timeout(
                    self.config.call_timeout,
                    session.peer().call_tool(params),
                )
                .await
                .context("tool call timed out")?;
                let error = match called {
                    Ok(result) => {
                        eprintln!("called {}: is_error={:?}", tool.name, result.is_error);
                        break;
                    }
                    Err(error) => error,
                };
                // A token that lapsed or lacks a scope mid-session: authorize again (a
                // step-up asks for the union), reconnect, call again.
                let Some(challenge) = session::auth_challenge(&error) else {
                    bail!("tool call failed: {error}");
                };
                eprintln!("tool call answered {challenge:?}");
                self.authorize(&challenge, &mut grant, &mut authorizations)
                    .await?;
                session = self.connect(&mut grant, &mut authorizations).await?.0;
            }
        }
        Ok(())
    }

    /// Starts a session, authorizing whenever the server asks for it, within
    /// [`MAX_AUTHORIZATIONS`].
    async fn connect(
        &self,
        grant: &mut Option<Grant>,
        authorizations: &mut usize,
    ) -> anyhow::Result<(Session, Vec<Tool>)> {
        loop {
            let bearer = grant.as_ref().map(oauth::access_token);
            let credentials = Resolved::default();
            match Session::start(
                &self.row,
                &self.config,
                &credentials,
                bearer,
                session::Answerer::Defaults,
                &self.cancel,
            )
            .await
            {
                Ok(started) => return Ok(started),
                Err(ConnectError::Other(class)) => bail!("connect failed: {class}"),
                Err(challenge) => {
                    eprintln!("connect answered {challenge:?}");
                    self.authorize(&challenge, grant, authorizations).await?;
                }
            }
        }
    }

    /// One authorization: the brain's `begin`, the person, the brain's `finish`.
    async fn authorize(
        &self,
        challenge: &ConnectError,
        grant: &mut Option<Grant>,
        authorizations: &mut usize,
    ) -> anyhow::Result<()> {
        if *authorizations >= MAX_AUTHORIZATIONS {
            bail!("the server still refuses after {MAX_AUTHORIZATIONS} authorizations; giving up");
        }
        *authorizations += 1;
        let mut options = self.options.clone();
        if let (ConnectError::InsufficientScope { .. }, Some(grant)) = (challenge, grant.as_ref()) {
            options.scopes = grant.scopes().to_vec();
        }
        let (url, flow) = oauth::begin(
            &self.http,
            self.server_url(),
            challenge.challenge(),
            &options,
        )
        .await
        .map_err(|e| anyhow::anyhow!("begin: {}", e.class()))?;
        let state = oauth::state_of(&flow).to_owned();
        let callback = person(&url).await?;
        if callback.state != state {
            bail!("the authorization server sent back another state");
        }
        let granted = oauth::finish(
            &self.http,
            flow,
            &callback.code,
            &callback.state,
            callback.iss.as_deref(),
        )
        .await
        .map_err(|e| anyhow::anyhow!("finish: {}", e.class()))?;
        eprintln!("authorized; scopes {:?}", granted.scopes());
        *grant = Some(granted);
        Ok(())
    }
}

struct Callback {
    code: String,
    state: String,
    iss: Option<String>,
}

/// The person at the authorization URL: the suite's authorization servers approve at
/// once and redirect; the redirect's query is what the callback route would receive.
async fn person(url: &str) -> anyhow::Result<Callback> {
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()?;
    let response = browser.get(url).send().await?;
    let location = response
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .context("the authorization endpoint did not redirect")?;
    let location = reqwest::Url::parse(location)?;
    let mut code = None;
    let mut state = None;
    let mut iss = None;
    for (key, value) in location.query_pairs() {
        match key.as_ref() {
            "code" => code = Some(value.into_owned()),
            "state" => state = Some(value.into_owned()),
            "iss" => iss = Some(value.into_owned()),
            _ => {}
        }
    }
    Ok(Callback {
        code: code.context("no code in the redirect")?,
        state: state.context("no state in the redirect")?,
        iss,
    })
}

/// Arguments a model would give: a placeholder for each required property, by type.
fn arguments_for(tool: &Tool) -> Map<String, Value> {
    let schema = &tool.input_schema;
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut arguments = Map::new();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return arguments;
    };
    for (name, property) in properties {
        if !required.contains(&name.as_str()) {
            continue;
        }
        let value = match property.get("type").and_then(Value::as_str) {
            Some("number") | Some("integer") => Value::from(1),
            Some("boolean") => Value::Bool(true),
            Some("array") => Value::Array(Vec::new()),
            Some("object") => Value::Object(Map::new()),
            _ => Value::String("test".into()),
        };
        arguments.insert(name.clone(), value);
    }
    arguments
}
