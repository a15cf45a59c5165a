//! The OAuth 2.1 client of a connector (the MCP authorization spec of 2025-11-25), built
//! on rmcp's `auth` module.
//!
//! A flow runs in two steps that may happen on different replicas, so everything between
//! them is data ([`PendingFlow`], then [`Grant`], both serializable; the caller stores them
//! encrypted):
//!
//! 1. [`begin`], after the MCP server answered `401` with a `WWW-Authenticate` challenge
//!    (or before any request): protected resource metadata (RFC 9728, from the challenge's
//!    `resource_metadata` or the well-known URLs), then the authorization server's metadata
//!    (RFC 8414 or OpenID discovery; the 2025-03-26 default-endpoint fallback is not
//!    used); the client identity in the spec's order: a pre-registered client, a client ID
//!    metadata document (when the authorization server says it supports them), dynamic
//!    registration (RFC 7591); the scopes ([`ClientOptions::scopes`] plus the challenge's
//!    `scope`, else the resource's `scopes_supported`, else none); then the authorization
//!    URL with PKCE (S256; an authorization server that does not list S256 is refused),
//!    `state` and the `resource` indicator (RFC 8707).
//! 2. [`finish`], from the redirect back: `state` must match, `iss` (RFC 9207) must be the
//!    authorization server's issuer when it sends one or promised to, the flow must be
//!    younger than [`FLOW_TTL`]; then the code is exchanged (with the verifier and the
//!    `resource`) for a [`Grant`].
//!
//! [`refresh`] keeps the old refresh token when the response has none; [`revoke`] is RFC
//! 7009 against the `revocation_endpoint` when there is one.
//!
//! # Network policy
//!
//! The URLs come from the MCP server and from documents it points to, so every request
//! goes through [`Http`]: the connector address rule ([`crate::address`]) judges every
//! host (literal addresses before the request, names at resolution, and the connection
//! goes only to the addresses judged), no redirect is followed (rmcp follows same-origin
//! redirects of metadata discovery itself, one request at a time, through the same
//! client), no system proxy, every request within [`REQUEST_TIMEOUT`] and bodies capped
//! by rmcp at 1 MiB.
//!
//! # Privacy
//!
//! Errors carry a class only, never a token, code, verifier or server text; `Debug` of
//! the flow and the grant redacts every secret.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use oauth2::basic::BasicTokenType;
use oauth2::{AccessToken, RefreshToken, Scope, TokenResponse};
use rmcp::transport::auth::{
    AuthError, AuthorizationManager, AuthorizationMetadata, AuthorizationMetadataSource,
    OAuthClientConfig, OAuthTokenResponse, StoredAuthorizationState, StoredCredentials,
    VendorExtraTokenFields, WWWAuthenticateParams,
};
use rmcp::transport::{
    CredentialStore, InMemoryCredentialStore, InMemoryStateStore, OAuthHttpClient,
    OAuthHttpClientError, OAuthHttpClientFuture, OAuthHttpRequest, StateStore,
};
use serde::{Deserialize, Serialize};

use crate::address::{self, Refused};

/// One request to an authorization server or a metadata URL.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// One whole step ([`begin`], [`finish`], [`refresh`], [`revoke`]): discovery alone may
/// try a dozen URLs.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a begun flow may wait for its callback.
pub const FLOW_TTL: Duration = Duration::from_secs(15 * 60);
/// The longest authorization server answer read (rmcp caps its own reads at 1 MiB too).
const MAX_BODY: usize = 1024 * 1024;

/// How the brain presents itself to an authorization server.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Where the authorization server sends the person back (the brain's callback URL).
    pub redirect_uri: String,
    /// The name a dynamic registration gives the client.
    pub client_name: String,
    /// The HTTPS URL of the brain's client ID metadata document, when it serves one; used
    /// when the authorization server advertises `client_id_metadata_document_supported`.
    pub client_metadata_url: Option<String>,
    /// A client registered out of band (configuration); it wins over everything else.
    pub preregistered: Option<PreRegistered>,
    /// Scopes to ask for beyond the challenge's; empty: the spec's selection alone.
    pub scopes: Vec<String>,
}

/// A client registered with the authorization server out of band.
#[derive(Clone)]
pub struct PreRegistered {
    pub client_id: String,
    pub client_secret: Option<String>,
}

impl std::fmt::Debug for PreRegistered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreRegistered")
            .field("client_id", &self.client_id)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// The client identity a flow used, kept with the grant for refresh and revocation.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    pub client_id: String,
    pub client_secret: Option<String>,
    /// How the client authenticates at the token endpoint: `client_secret_basic`,
    /// `client_secret_post` or `none`.
    pub auth_method: String,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("client_id", &self.client_id)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("auth_method", &self.auth_method)
            .finish()
    }
}

/// A flow between [`begin`] and [`finish`].
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingFlow {
    /// The MCP server's URL.
    server_url: String,
    /// The `resource` indicator sent (RFC 8707), sent again with the code.
    resource: String,
    redirect_uri: String,
    metadata: AuthorizationMetadata,
    registration: Registration,
    scopes: Vec<String>,
    /// rmcp's record of the PKCE verifier, `state`, expected issuer and creation time.
    state: StoredAuthorizationState,
}

impl std::fmt::Debug for PendingFlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFlow")
            .field("server_url", &self.server_url)
            .field("resource", &self.resource)
            .field("issuer", &self.metadata.issuer)
            .field("registration", &self.registration)
            .field("scopes", &self.scopes)
            // rmcp's Debug redacts the verifier and the state.
            .field("state", &self.state)
            .finish()
    }
}

/// What an authorization yielded: the tokens and what is needed to refresh and revoke them.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    access_token: String,
    refresh_token: Option<String>,
    /// When the access token expires; `None`: the authorization server did not say.
    expires_at: Option<DateTime<Utc>>,
    /// The scopes granted (the response's `scope`, else the ones asked for, RFC 6749 §5.1).
    scopes: Vec<String>,
    registration: Registration,
    authorization_endpoint: String,
    token_endpoint: String,
    revocation_endpoint: Option<String>,
    issuer: Option<String>,
    resource: String,
    server_url: String,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("access_token", &"<redacted>")
            .field(
                "refresh_token",
                &self.refresh_token.as_ref().map(|_| "<redacted>"),
            )
            .field("expires_at", &self.expires_at)
            .field("scopes", &self.scopes)
            .field("registration", &self.registration)
            .field("token_endpoint", &self.token_endpoint)
            .field("revocation_endpoint", &self.revocation_endpoint)
            .field("issuer", &self.issuer)
            .field("resource", &self.resource)
            .field("server_url", &self.server_url)
            .finish()
    }
}

impl Grant {
    pub fn scopes(&self) -> &[String] {
        &self.scopes
    }

    pub fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.expires_at
    }

    pub fn registration(&self) -> &Registration {
        &self.registration
    }

    pub fn has_refresh_token(&self) -> bool {
        self.refresh_token.is_some()
    }
}

/// Why a flow, a refresh or a revocation failed. Messages never carry a token, a code or
/// text from the server.
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("the server URL is not an http(s) URL")]
    InvalidUrl,
    #[error("an authorization URL points at a refused address ({})", .0.class())]
    Refused(Refused),
    #[error("an authorization server or metadata URL did not answer")]
    Unreachable,
    #[error("no usable protected resource or authorization server metadata was found")]
    DiscoveryFailed,
    #[error("the authorization server does not support PKCE with S256")]
    PkceUnsupported,
    #[error("the client could not be registered with the authorization server")]
    RegistrationFailed,
    #[error("the callback's state does not belong to this flow")]
    StateMismatch,
    #[error("the callback's issuer is not the flow's authorization server")]
    IssuerMismatch,
    #[error("the authorization flow expired before its callback")]
    FlowExpired,
    #[error("the authorization server refused the code")]
    TokenRejected,
    #[error("the refresh token was rejected; authorize again")]
    RefreshRejected,
    #[error("the grant has no refresh token; authorize again")]
    NoRefreshToken,
    #[error("the token endpoint failed")]
    TokenFailed,
    #[error("the authorization server did not revoke the token")]
    RevocationFailed,
    #[error("the OAuth client could not be built")]
    ClientFailed,
    #[error("the authorization server did not answer in time")]
    Timeout,
}

impl OAuthError {
    /// A stable class for logs, metrics and API errors.
    pub fn class(&self) -> &'static str {
        match self {
            Self::InvalidUrl => "invalid_url",
            Self::Refused(refused) => refused.class(),
            Self::Unreachable => "unreachable",
            Self::DiscoveryFailed => "discovery_failed",
            Self::PkceUnsupported => "pkce_unsupported",
            Self::RegistrationFailed => "registration_failed",
            Self::StateMismatch => "state_mismatch",
            Self::IssuerMismatch => "issuer_mismatch",
            Self::FlowExpired => "flow_expired",
            Self::TokenRejected => "token_rejected",
            Self::RefreshRejected => "refresh_rejected",
            Self::NoRefreshToken => "no_refresh_token",
            Self::TokenFailed => "token_failed",
            Self::RevocationFailed => "revocation_failed",
            Self::ClientFailed => "client_failed",
            Self::Timeout => "timeout",
        }
    }

    /// Whether only a new authorization (a person) can get past this.
    pub fn needs_authorization(&self) -> bool {
        matches!(self, Self::RefreshRejected | Self::NoRefreshToken)
    }
}

/// The HTTP client of the OAuth flows (see the module docs for its policy). Cheap to clone.
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    allow_private_networks: bool,
}

impl Http {
    /// `allow_private_networks` as in the connector configuration
    /// (`BRAIN_CONNECTORS_ALLOW_PRIVATE_NETWORKS`).
    pub fn new(allow_private_networks: bool) -> Result<Self, OAuthError> {
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(address::CheckedResolver {
                allow_private_networks,
            })
            .build()
            .map_err(|_| OAuthError::ClientFailed)?;
        Ok(Self {
            client,
            allow_private_networks,
        })
    }

    fn check(&self, url: &reqwest::Url) -> Result<(), OAuthError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(OAuthError::InvalidUrl);
        }
        address::check_url(url, self.allow_private_networks).map_err(OAuthError::Refused)
    }
}

/// rmcp's view of [`Http`] for one operation, remembering why a request failed (rmcp's
/// errors turn the cause into text).
struct Transport {
    http: Http,
    failure: Mutex<Option<OAuthError>>,
}

impl Transport {
    fn new(http: &Http) -> Arc<Self> {
        Arc::new(Self {
            http: http.clone(),
            failure: Mutex::new(None),
        })
    }

    fn fail(&self, error: OAuthError) -> OAuthHttpClientError {
        let text = error.to_string();
        if let Ok(mut slot) = self.failure.lock() {
            slot.get_or_insert(error);
        }
        text.into()
    }

    /// Forgets failures rmcp got past (a discovery candidate that did not answer while
    /// another did), so a later error is not blamed on them.
    fn forget(&self) {
        if let Ok(mut slot) = self.failure.lock() {
            slot.take();
        }
    }

    /// The network cause of a failure, if a request failed at all; `otherwise` else.
    fn error(&self, otherwise: OAuthError) -> OAuthError {
        self.failure
            .lock()
            .ok()
            .and_then(|mut slot| slot.take())
            .unwrap_or(otherwise)
    }
}

impl OAuthHttpClient for Transport {
    fn execute(&self, request: OAuthHttpRequest) -> OAuthHttpClientFuture<'_> {
        Box::pin(async move {
            // No redirect is followed whatever the request asks (see the module docs):
            // a 3xx reaches rmcp as it is, which treats it as a failure or, in
            // discovery, follows it same-origin by a new request through here.
            let OAuthHttpRequest { request, .. } = request;
            let request = reqwest::Request::try_from(request)
                .map_err(|_| self.fail(OAuthError::InvalidUrl))?;
            self.http.check(request.url()).map_err(|e| self.fail(e))?;
            let response = self.http.client.execute(request).await.map_err(|e| {
                self.fail(match address::refused_in(&e) {
                    Some(refused) => OAuthError::Refused(refused),
                    None => OAuthError::Unreachable,
                })
            })?;
            let mut builder = http::Response::builder()
                .status(response.status())
                .version(response.version());
            for (name, value) in response.headers() {
                builder = builder.header(name, value);
            }
            let body = read_capped(response).await.map_err(|e| self.fail(e))?;
            builder
                .body(body)
                .map_err(|_| self.fail(OAuthError::Unreachable))
        })
    }
}

async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, OAuthError> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|_| OAuthError::Unreachable)?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(OAuthError::Unreachable);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn parse_http_url(url: &str) -> Result<reqwest::Url, OAuthError> {
    let url = reqwest::Url::parse(url).map_err(|_| OAuthError::InvalidUrl)?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(OAuthError::InvalidUrl);
    }
    Ok(url)
}

/// Starts a flow for the MCP server at `server_url`, after its `401` challenge (the
/// `WWW-Authenticate` value) when there was one. Answers the URL to send the person to.
pub async fn begin(
    http: &Http,
    server_url: &str,
    challenge: Option<&str>,
    options: &ClientOptions,
) -> Result<(String, PendingFlow), OAuthError> {
    bounded(begin_unbounded(http, server_url, challenge, options)).await
}

async fn bounded<T>(step: impl Future<Output = Result<T, OAuthError>>) -> Result<T, OAuthError> {
    tokio::time::timeout(STEP_TIMEOUT, step)
        .await
        .unwrap_or(Err(OAuthError::Timeout))
}

async fn begin_unbounded(
    http: &Http,
    server_url: &str,
    challenge: Option<&str>,
    options: &ClientOptions,
) -> Result<(String, PendingFlow), OAuthError> {
    let base = parse_http_url(server_url)?;
    http.check(&base)?;
    let transport = Transport::new(http);
    let mut manager =
        AuthorizationManager::new_with_oauth_http_client(base.clone(), transport.clone())
            .await
            .map_err(|_| OAuthError::ClientFailed)?;
    let states = InMemoryStateStore::new();
    manager.set_state_store(states.clone());

    let metadata = discover(&mut manager, &transport, challenge).await?;
    let scopes = select_scopes(&manager, &metadata, &base, challenge, &options.scopes).await;
    let scope_refs: Vec<&str> = scopes.iter().map(String::as_str).collect();

    let config = client_config(&mut manager, &transport, &metadata, options, &scope_refs).await?;
    let registration = Registration {
        auth_method: auth_method(&metadata, config.client_secret.is_some()).to_owned(),
        client_id: config.client_id.clone(),
        client_secret: config.client_secret.clone(),
    };
    manager
        .configure_client(config)
        .map_err(|_| OAuthError::RegistrationFailed)?;

    let url = manager
        .get_authorization_url(&scope_refs)
        .await
        .map_err(|e| match e {
            AuthError::PkceUnsupported => OAuthError::PkceUnsupported,
            _ => OAuthError::DiscoveryFailed,
        })?;
    let parsed = parse_http_url(&url).map_err(|_| OAuthError::DiscoveryFailed)?;
    let query: HashMap<String, String> = parsed.query_pairs().into_owned().collect();
    let (Some(csrf), Some(resource)) = (query.get("state"), query.get("resource")) else {
        return Err(OAuthError::DiscoveryFailed);
    };
    let state = states
        .load(csrf)
        .await
        .ok()
        .flatten()
        .ok_or(OAuthError::ClientFailed)?;
    let flow = PendingFlow {
        server_url: base.to_string(),
        resource: resource.clone(),
        redirect_uri: options.redirect_uri.clone(),
        metadata,
        registration,
        scopes,
        state,
    };
    Ok((url, flow))
}

/// The authorization server's metadata, found from the challenge or the well-known
/// paths, and set on `manager`; refused when it cannot do PKCE.
async fn discover(
    manager: &mut AuthorizationManager,
    transport: &Transport,
    challenge: Option<&str>,
) -> Result<AuthorizationMetadata, OAuthError> {
    let resolution = manager
        .resolve_metadata_from_challenge(challenge)
        .await
        .map_err(|e| transport.error(discovery_error(&e)))?;
    if resolution.source == AuthorizationMetadataSource::LegacyEndpointFallback {
        // rmcp falls back when every discovery request failed, too: say why.
        return Err(transport.error(OAuthError::DiscoveryFailed));
    }
    transport.forget();
    let metadata = resolution.metadata;
    // The spec: no S256 listed means no PKCE, and the client must not go on (rmcp only
    // refuses a list without S256).
    if !metadata
        .code_challenge_methods_supported
        .as_ref()
        .is_some_and(|methods| methods.iter().any(|m| m == "S256"))
    {
        return Err(OAuthError::PkceUnsupported);
    }
    manager.set_metadata(metadata.clone());
    Ok(metadata)
}

/// Who the brain is to this authorization server, in the spec's order of preference: a
/// preregistered client, a client ID metadata document the server accepts, or a client
/// registered dynamically now.
async fn client_config(
    manager: &mut AuthorizationManager,
    transport: &Transport,
    metadata: &AuthorizationMetadata,
    options: &ClientOptions,
    scope_refs: &[&str],
) -> Result<OAuthClientConfig, OAuthError> {
    let supports_cimd = metadata
        .additional_fields
        .get("client_id_metadata_document_supported")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    if let Some(pre) = &options.preregistered {
        let mut config =
            OAuthClientConfig::new(pre.client_id.clone(), options.redirect_uri.clone());
        config.client_secret = pre.client_secret.clone();
        Ok(config)
    } else if let Some(url) = options
        .client_metadata_url
        .as_ref()
        .filter(|_| supports_cimd)
    {
        Ok(OAuthClientConfig::new(
            url.clone(),
            options.redirect_uri.clone(),
        ))
    } else if metadata.registration_endpoint.is_some() {
        // The brain is a web application (an https callback, not a loopback or custom
        // scheme): OpenID registration's `application_type` says so (rmcp's default is
        // `native`). rmcp takes it from a configured client only, so one is configured
        // first and replaced by the one this answers.
        manager
            .configure_client(
                OAuthClientConfig::new(String::new(), options.redirect_uri.clone())
                    .with_application_type("web"),
            )
            .map_err(|_| OAuthError::ClientFailed)?;
        manager
            .register_client(&options.client_name, &options.redirect_uri, scope_refs)
            .await
            .map_err(|e| {
                transport.error(match e {
                    AuthError::PkceUnsupported => OAuthError::PkceUnsupported,
                    _ => OAuthError::RegistrationFailed,
                })
            })
    } else {
        Err(OAuthError::RegistrationFailed)
    }
}

/// The spec's scope selection (2025-11-25, "Scope Selection Strategy"): the challenge's
/// `scope`, else the resource metadata's `scopes_supported`, else none; the configured
/// scopes are always added (a step-up passes the grant's scopes there, so it asks for
/// the union). `offline_access` is added when the authorization server lists it, so a
/// refresh token comes back (SEP-2207).
async fn select_scopes(
    manager: &AuthorizationManager,
    metadata: &AuthorizationMetadata,
    base: &reqwest::Url,
    challenge: Option<&str>,
    configured: &[String],
) -> Vec<String> {
    let challenged = challenge
        .map(|c| WWWAuthenticateParams::parse(c, base))
        .and_then(|p| p.scope)
        .is_some_and(|s| !s.trim().is_empty());
    let mut scopes: Vec<String> = configured.to_vec();
    if challenged || scopes.is_empty() {
        scopes.extend(manager.select_initial_scopes(&[]).await);
    }
    let offline = metadata
        .scopes_supported
        .as_ref()
        .is_some_and(|s| s.iter().any(|s| s == "offline_access"));
    if offline && !scopes.is_empty() {
        scopes.push("offline_access".into());
    }
    let mut seen = std::collections::HashSet::new();
    scopes.retain(|s| seen.insert(s.clone()));
    scopes
}

/// How rmcp's client authenticates at the token endpoint for this metadata (its
/// `configure_client` rule): with a secret, `client_secret_post` when the server lists
/// post and not basic, else basic; without one, the client id in the body.
fn auth_method(metadata: &AuthorizationMetadata, has_secret: bool) -> &'static str {
    if !has_secret {
        return "none";
    }
    let methods: Vec<&str> = metadata
        .additional_fields
        .get("token_endpoint_auth_methods_supported")
        .and_then(serde_json::Value::as_array)
        .map(|a| a.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    if methods.contains(&"client_secret_post") && !methods.contains(&"client_secret_basic") {
        "client_secret_post"
    } else {
        "client_secret_basic"
    }
}

fn discovery_error(error: &AuthError) -> OAuthError {
    match error {
        AuthError::PkceUnsupported => OAuthError::PkceUnsupported,
        _ => OAuthError::DiscoveryFailed,
    }
}

/// The `state` the callback of this flow carries: how the caller finds the flow.
pub fn state_of(flow: &PendingFlow) -> &str {
    &flow.state.csrf_token
}

/// The metadata a manager needs to use a stored client: the endpoints, the issuer, and
/// the one auth method the registration uses (so rmcp picks that one again).
fn metadata_for(
    authorization_endpoint: &str,
    token_endpoint: &str,
    issuer: Option<&str>,
    auth_method: &str,
) -> AuthorizationMetadata {
    let mut metadata = AuthorizationMetadata::default();
    metadata.authorization_endpoint = authorization_endpoint.to_owned();
    metadata.token_endpoint = token_endpoint.to_owned();
    metadata.issuer = issuer.map(str::to_owned);
    metadata.code_challenge_methods_supported = Some(vec!["S256".into()]);
    metadata.additional_fields.insert(
        "token_endpoint_auth_methods_supported".into(),
        serde_json::json!([auth_method]),
    );
    metadata
}

/// A manager for the token endpoint of a known client. Its base URL is the `resource`, so
/// rmcp sends that same indicator with the code and on refresh.
async fn manager_for(
    transport: Arc<Transport>,
    resource: &str,
    metadata: AuthorizationMetadata,
    registration: &Registration,
    redirect_uri: &str,
) -> Result<AuthorizationManager, OAuthError> {
    let mut manager = AuthorizationManager::new_with_oauth_http_client(resource, transport)
        .await
        .map_err(|_| OAuthError::ClientFailed)?;
    manager.set_metadata(metadata);
    let mut config = OAuthClientConfig::new(registration.client_id.clone(), redirect_uri);
    config.client_secret = registration.client_secret.clone();
    manager
        .configure_client(config)
        .map_err(|_| OAuthError::ClientFailed)?;
    Ok(manager)
}

/// Finishes `flow` with the callback's `code`, `state` and `iss`.
pub async fn finish(
    http: &Http,
    flow: PendingFlow,
    code: &str,
    state: &str,
    iss: Option<&str>,
) -> Result<Grant, OAuthError> {
    bounded(finish_unbounded(http, flow, code, state, iss)).await
}

async fn finish_unbounded(
    http: &Http,
    flow: PendingFlow,
    code: &str,
    state: &str,
    iss: Option<&str>,
) -> Result<Grant, OAuthError> {
    if !crate::auth::constant_time_eq(state.as_bytes(), flow.state.csrf_token.as_bytes()) {
        return Err(OAuthError::StateMismatch);
    }
    let age = Utc::now()
        .timestamp()
        .saturating_sub(flow.state.created_at as i64);
    if age < 0 || age as u64 > FLOW_TTL.as_secs() {
        return Err(OAuthError::FlowExpired);
    }
    let transport = Transport::new(http);
    let mut manager = manager_for(
        transport.clone(),
        &flow.resource,
        flow.metadata.clone(),
        &flow.registration,
        &flow.redirect_uri,
    )
    .await?;
    let states = InMemoryStateStore::new();
    states
        .save(state, flow.state.clone())
        .await
        .map_err(|_| OAuthError::ClientFailed)?;
    manager.set_state_store(states);
    let credentials = InMemoryCredentialStore::new();
    manager.set_credential_store(credentials.clone());
    manager
        .exchange_code_for_token_with_issuer(code, state, iss)
        .await
        .map_err(|e| {
            transport.error(match e {
                AuthError::AuthorizationServerMismatch { .. }
                | AuthError::AuthorizationServerMissingIssuer { .. }
                | AuthError::AuthorizationFailed(_) => OAuthError::IssuerMismatch,
                _ => OAuthError::TokenRejected,
            })
        })?;
    let stored = credentials
        .load()
        .await
        .ok()
        .flatten()
        .ok_or(OAuthError::ClientFailed)?;
    let token = stored.token_response.ok_or(OAuthError::TokenRejected)?;
    Ok(Grant {
        access_token: token.access_token().secret().clone(),
        refresh_token: token.refresh_token().map(|t| t.secret().clone()),
        expires_at: token.expires_in().map(expiry),
        scopes: stored.granted_scopes,
        revocation_endpoint: flow
            .metadata
            .additional_fields
            .get("revocation_endpoint")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned),
        authorization_endpoint: flow.metadata.authorization_endpoint,
        token_endpoint: flow.metadata.token_endpoint,
        issuer: flow.metadata.issuer,
        registration: flow.registration,
        resource: flow.resource,
        server_url: flow.server_url,
    })
}

fn expiry(expires_in: Duration) -> DateTime<Utc> {
    Utc::now() + chrono::Duration::from_std(expires_in).unwrap_or(chrono::Duration::MAX)
}

/// A new grant from `grant`'s refresh token. The old refresh token is kept when the
/// response has none (RFC 6749 §6); the scopes stay those of the original grant.
pub async fn refresh(http: &Http, grant: &Grant) -> Result<Grant, OAuthError> {
    bounded(refresh_unbounded(http, grant)).await
}

async fn refresh_unbounded(http: &Http, grant: &Grant) -> Result<Grant, OAuthError> {
    let Some(refresh_token) = grant.refresh_token.as_ref() else {
        return Err(OAuthError::NoRefreshToken);
    };
    let transport = Transport::new(http);
    let metadata = metadata_for(
        &grant.authorization_endpoint,
        &grant.token_endpoint,
        grant.issuer.as_deref(),
        &grant.registration.auth_method,
    );
    let mut manager = manager_for(
        transport.clone(),
        &grant.resource,
        metadata,
        &grant.registration,
        // A refresh sends no redirect URI; rmcp's client wants one all the same.
        &grant.server_url,
    )
    .await?;
    let mut current = OAuthTokenResponse::new(
        AccessToken::new(grant.access_token.clone()),
        BasicTokenType::Bearer,
        VendorExtraTokenFields::default(),
    );
    current.set_refresh_token(Some(RefreshToken::new(refresh_token.clone())));
    current.set_scopes(Some(grant.scopes.iter().cloned().map(Scope::new).collect()));
    let credentials = InMemoryCredentialStore::new();
    credentials
        .save(StoredCredentials::new(
            grant.registration.client_id.clone(),
            Some(current),
            grant.scopes.clone(),
            None,
        ))
        .await
        .map_err(|_| OAuthError::ClientFailed)?;
    manager.set_credential_store(credentials);
    let token = manager.refresh_token().await.map_err(|e| {
        transport.error(match e {
            AuthError::TokenRefreshRejected(_) => OAuthError::RefreshRejected,
            AuthError::AuthorizationRequired => OAuthError::NoRefreshToken,
            _ => OAuthError::TokenFailed,
        })
    })?;
    let scopes = token
        .scopes()
        .map(|s| s.iter().map(|s| s.to_string()).collect())
        .unwrap_or_else(|| grant.scopes.clone());
    Ok(Grant {
        access_token: token.access_token().secret().clone(),
        refresh_token: token
            .refresh_token()
            .map(|t| t.secret().clone())
            .or_else(|| grant.refresh_token.clone()),
        expires_at: token.expires_in().map(expiry),
        scopes,
        ..grant.clone()
    })
}

/// Whether the access token expires within `within` (a grant without an expiry never
/// does, until the server refuses it).
pub fn expires_soon(grant: &Grant, within: Duration) -> bool {
    let within = chrono::Duration::from_std(within).unwrap_or(chrono::Duration::MAX);
    grant.expires_at.is_some_and(|at| {
        at <= Utc::now()
            .checked_add_signed(within)
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    })
}

/// The bearer token to send to the MCP server.
pub fn access_token(grant: &Grant) -> &str {
    &grant.access_token
}

/// Revokes the grant's tokens (RFC 7009): the refresh token (which ends the access tokens
/// issued from it at most servers), then the access token. `Ok` when the authorization
/// server has no `revocation_endpoint`: there is nothing to call.
pub async fn revoke(http: &Http, grant: &Grant) -> Result<(), OAuthError> {
    bounded(revoke_unbounded(http, grant)).await
}

async fn revoke_unbounded(http: &Http, grant: &Grant) -> Result<(), OAuthError> {
    let Some(endpoint) = grant.revocation_endpoint.as_deref() else {
        return Ok(());
    };
    let endpoint = parse_http_url(endpoint)?;
    http.check(&endpoint)?;
    let tokens = grant
        .refresh_token
        .iter()
        .map(|t| (t.as_str(), "refresh_token"))
        .chain(std::iter::once((
            grant.access_token.as_str(),
            "access_token",
        )));
    for (token, hint) in tokens {
        let mut form = vec![("token", token), ("token_type_hint", hint)];
        let registration = &grant.registration;
        let mut request = http.client.post(endpoint.clone());
        match (
            registration.auth_method.as_str(),
            &registration.client_secret,
        ) {
            ("client_secret_basic", Some(secret)) => {
                request = request.basic_auth(&registration.client_id, Some(secret));
            }
            ("client_secret_post", Some(secret)) => {
                form.push(("client_id", &registration.client_id));
                form.push(("client_secret", secret));
            }
            _ => form.push(("client_id", &registration.client_id)),
        }
        // reqwest's `form` feature is off in the workspace; the same encoding by hand.
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&form)
            .finish();
        let response = request
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|e| {
                address::refused_in(&e).map_or(OAuthError::Unreachable, OAuthError::Refused)
            })?;
        // RFC 7009 §2.2: 200 also for a token that was already invalid.
        if !response.status().is_success() {
            return Err(OAuthError::RevocationFailed);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration() -> Registration {
        Registration {
            client_id: "client-1".into(),
            client_secret: Some("secret-s3cr3t".into()),
            auth_method: "client_secret_basic".into(),
        }
    }

    fn flow(created_at: i64) -> PendingFlow {
        let state: StoredAuthorizationState = serde_json::from_value(serde_json::json!({
            "pkce_verifier": "verifier-v3r1f13r",
            "csrf_token": "state-123",
            "expected_issuer": "https://as.example",
            "require_issuer": false,
            "created_at": created_at,
            "requested_scopes": ["read"],
        }))
        .unwrap();
        let metadata: AuthorizationMetadata = serde_json::from_value(serde_json::json!({
            "issuer": "https://as.example",
            "authorization_endpoint": "https://as.example/authorize",
            "token_endpoint": "https://as.example/token",
            "revocation_endpoint": "https://as.example/revoke",
            "code_challenge_methods_supported": ["S256"],
        }))
        .unwrap();
        PendingFlow {
            server_url: "https://mcp.example/mcp".into(),
            resource: "https://mcp.example/mcp".into(),
            redirect_uri: "https://brain.example/v1/oauth/callback".into(),
            metadata,
            registration: registration(),
            scopes: vec!["read".into()],
            state,
        }
    }

    fn grant(expires_at: Option<DateTime<Utc>>) -> Grant {
        Grant {
            access_token: "access-4cc355".into(),
            refresh_token: Some("refresh-r3fr35h".into()),
            expires_at,
            scopes: vec!["read".into()],
            registration: registration(),
            authorization_endpoint: "https://as.example/authorize".into(),
            token_endpoint: "https://as.example/token".into(),
            revocation_endpoint: None,
            issuer: Some("https://as.example".into()),
            resource: "https://mcp.example/mcp".into(),
            server_url: "https://mcp.example/mcp".into(),
        }
    }

    #[test]
    fn debug_never_shows_a_secret() {
        let shown = format!("{:?} {:?}", flow(0), grant(None));
        for secret in [
            "secret-s3cr3t",
            "verifier-v3r1f13r",
            "state-123",
            "access-4cc355",
            "refresh-r3fr35h",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("client-1") && shown.contains("https://as.example"));
        let options = ClientOptions {
            redirect_uri: "https://brain.example/cb".into(),
            client_name: "brain".into(),
            client_metadata_url: None,
            preregistered: Some(PreRegistered {
                client_id: "pre".into(),
                client_secret: Some("secret-s3cr3t".into()),
            }),
            scopes: Vec::new(),
        };
        assert!(!format!("{options:?}").contains("secret-s3cr3t"));
    }

    /// A flow begun on one replica finishes on another: both survive their stored form.
    #[test]
    fn flow_and_grant_survive_json() {
        let flow = flow(1_700_000_000);
        let back: PendingFlow =
            serde_json::from_str(&serde_json::to_string(&flow).unwrap()).unwrap();
        assert_eq!(state_of(&back), "state-123");
        assert_eq!(back.state.pkce_verifier, "verifier-v3r1f13r");
        assert_eq!(back.registration, flow.registration);
        assert_eq!(
            back.metadata.additional_fields.get("revocation_endpoint"),
            Some(&serde_json::json!("https://as.example/revoke"))
        );
        let at = Utc::now();
        let grant = grant(Some(at));
        let back: Grant = serde_json::from_str(&serde_json::to_string(&grant).unwrap()).unwrap();
        assert_eq!(access_token(&back), "access-4cc355");
        assert_eq!(back.refresh_token.as_deref(), Some("refresh-r3fr35h"));
        assert_eq!(back.expires_at, Some(at));
        assert_eq!(back.scopes(), ["read"]);
        assert!(serde_json::from_str::<Grant>(r#"{"access_token": "x"}"#).is_err());
    }

    #[tokio::test]
    async fn a_callback_must_match_its_flow_and_come_in_time() {
        let http = Http::new(false).unwrap();
        let now = Utc::now().timestamp();
        let err = finish(&http, flow(now), "code", "state-124", None)
            .await
            .unwrap_err();
        assert_eq!(err.class(), "state_mismatch");
        let stale = now - FLOW_TTL.as_secs() as i64 - 1;
        let err = finish(&http, flow(stale), "code", "state-123", None)
            .await
            .unwrap_err();
        assert_eq!(err.class(), "flow_expired");
    }

    #[test]
    fn expiry_is_absolute() {
        let minute = Duration::from_secs(60);
        assert!(!expires_soon(&grant(None), minute));
        assert!(expires_soon(
            &grant(Some(Utc::now() + chrono::Duration::seconds(30))),
            minute
        ));
        assert!(!expires_soon(
            &grant(Some(Utc::now() + chrono::Duration::seconds(300))),
            minute
        ));
        assert!(expires_soon(&grant(Some(Utc::now())), Duration::ZERO));
    }

    #[tokio::test]
    async fn refused_addresses_are_never_asked() {
        let http = Http::new(false).unwrap();
        let options = ClientOptions {
            redirect_uri: "https://brain.example/cb".into(),
            client_name: "brain".into(),
            client_metadata_url: None,
            preregistered: None,
            scopes: Vec::new(),
        };
        for (url, class) in [
            ("http://127.0.0.1:9/mcp", "private_address"),
            ("http://localhost:9/mcp", "private_address"),
            ("http://169.254.169.254/mcp", "metadata_address"),
            ("ftp://example.com/mcp", "invalid_url"),
        ] {
            let err = begin(&http, url, None, &options).await.unwrap_err();
            assert_eq!(err.class(), class, "{url}");
        }
        let mut refused = grant(None);
        refused.revocation_endpoint = Some("http://10.0.0.1/revoke".into());
        assert_eq!(
            revoke(&http, &refused).await.unwrap_err().class(),
            "private_address"
        );
        // Nothing to call: no revocation endpoint.
        revoke(&http, &grant(None)).await.unwrap();
        let mut no_refresh = grant(None);
        no_refresh.refresh_token = None;
        let err = refresh(&http, &no_refresh).await.unwrap_err();
        assert_eq!(err.class(), "no_refresh_token");
        assert!(err.needs_authorization());
    }

    #[test]
    fn the_auth_method_follows_the_metadata() {
        let with = |methods: serde_json::Value| {
            let mut metadata = AuthorizationMetadata::default();
            metadata
                .additional_fields
                .insert("token_endpoint_auth_methods_supported".into(), methods);
            metadata
        };
        let post = with(serde_json::json!(["client_secret_post"]));
        assert_eq!(auth_method(&post, true), "client_secret_post");
        assert_eq!(auth_method(&post, false), "none");
        let both = with(serde_json::json!([
            "client_secret_basic",
            "client_secret_post"
        ]));
        assert_eq!(auth_method(&both, true), "client_secret_basic");
        assert_eq!(
            auth_method(&AuthorizationMetadata::default(), true),
            "client_secret_basic"
        );
    }
}
