//! Connector OAuth on the brain's side (SPEC B2): where flows begin and grants are kept,
//! refreshed and revoked. The protocol itself (discovery, registration, PKCE, the token
//! endpoint) is [`super::oauth`]'s.
//!
//! # Who holds a grant
//!
//! A grant belongs to a connector (opened by an admin key or an admin without a user) or
//! to one JWT user of it. A turn connects with the grant of the chat's creator if there is
//! one, else with the connector's, else without a token.
//!
//! # A turn
//!
//! Within the connector's startup timeout: the grant is read; if its access token expires
//! within [`REFRESH_MARGIN`], it is refreshed first, under a row lock (`SELECT … FOR
//! UPDATE`), so two replicas never spend the same refresh token (an authorization server
//! that rotates refresh tokens may revoke the whole grant on a reuse) and the second one
//! connects with the first one's new tokens. A server that still answers `401` (no grant,
//! or a revoked one that cannot be refreshed) makes the connector `needs_authorization`:
//! a flow is begun for the chat's creator (else the connector), or a live one of theirs
//! handed out again, and its authorization URL is the status's `authorize`. The turn goes
//! on without the connector's tools.
//!
//! A flow for the whole connector binds the grant every chat without a user grant uses,
//! so only a turn of an admin principal begins one (X1, [`Requester`]); any other turn of
//! a chat without a user is told `needs_authorization` without a link. A flow a turn
//! begins replaces only the grant it found refused (by its version), never one bound
//! meanwhile, and its link goes to the turn's own client, never to the events stream
//! (`turn::run`).
//!
//! # Flows
//!
//! A flow lives [`FLOW_TTL`], at most [`MAX_LIVE_FLOWS`] per connector of which
//! [`MAX_LIVE_FLOWS_PER_PRINCIPAL`] begun by one principal, stored sealed and keyed by the
//! hash of its `state`; the callback takes it once.
//!
//! A flow is bound to the principal that began it and to that principal's browser, so a
//! link sent to someone else cannot attach their account to the sender's grant: the
//! browser keeps a per-flow nonce in a cookie (set on the authenticated answer that hands
//! out the authorization URL), the flow keeps the nonce's hash, and only a callback that
//! brings the nonce takes the flow. `POST /v1/connectors/{id}/authorize` binds the flow it
//! begins at once; a turn's link is the flow's handle ([`flow_link`]), which only the
//! turn's principal can turn into an authorization URL bound to its browser
//! ([`continue_flow`]).
//!
//! # HTTP
//!
//! OAuth requests go through [`oauth::Http`] (no proxy, no redirects, the connector
//! address rule on every URL and resolved address, each request bounded); the probe of
//! the MCP server for its challenge, through a client pinned to the addresses checked,
//! like a session's.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use protocol::{AgentId, TeamId};
use tokio_util::sync::CancellationToken;

use super::credentials;
use super::oauth::{self, ClientOptions, Grant, OAuthError, PendingFlow, PreRegistered};
use super::session::{Answerer, Session};
use crate::address;
use crate::config::{ConnectorConfig, OAuthConfig};
use store::{Actor, StoreError, TakenFlow};
use store::{ConnectorRow, ConnectorTarget, GrantOwner, LockedError, SecretsError, Store};

/// How long a person has between the authorization URL and the callback.
pub const FLOW_TTL: Duration = Duration::from_secs(600);
/// Unfinished flows per connector.
pub const MAX_LIVE_FLOWS: i64 = 50;
/// Of those, the ones one principal (an API key, a JWT user) may have begun.
pub const MAX_LIVE_FLOWS_PER_PRINCIPAL: i64 = 5;
/// A turn hands out a pending flow's link again while it has this long to live.
pub const REUSE_LEFT: Duration = Duration::from_secs(300);
/// A grant whose access token expires within this is refreshed before a connect.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(60);
/// The probe of an MCP server for its challenge.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// All revocations of a deleted connector together.
pub const REVOKE_BOUND: Duration = Duration::from_secs(5);
/// The client name shown to a person at consent.
const CLIENT_NAME: &str = "agent-runtime";

/// What connector OAuth needs at hand: its HTTP client and configuration.
#[derive(Clone)]
pub struct OAuth {
    http: oauth::Http,
    config: Arc<OAuthConfig>,
}

impl OAuth {
    pub fn new(config: &OAuthConfig, allow_private: bool) -> Result<Self, OAuthError> {
        Ok(Self {
            http: oauth::Http::new(allow_private)?,
            config: Arc::new(config.clone()),
        })
    }

    pub fn config(&self) -> &OAuthConfig {
        &self.config
    }

    fn options(&self, connector_url: &str) -> ClientOptions {
        ClientOptions {
            redirect_uri: self.config.redirect_uri(),
            client_name: CLIENT_NAME.to_owned(),
            client_metadata_url: self.config.client_metadata_url(),
            preregistered: self
                .config
                .client_for(connector_url)
                .map(|c| PreRegistered {
                    client_id: c.client_id.clone(),
                    client_secret: c.client_secret.clone(),
                }),
            scopes: Vec::new(),
        }
    }
}

/// Why a flow could not begin or finish. Classes only: never a server's words.
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    /// No `BRAIN_SECRETS_KEY`: tokens could not be stored.
    #[error("oauth is not configured")]
    NotConfigured,
    /// A stdio connector: nothing to authorize over HTTP.
    #[error("not an http connector")]
    NotHttp,
    /// The server let the brain in without a token.
    #[error("authorization not required")]
    NotRequired,
    /// The probe of the MCP server failed (a class).
    #[error("mcp server: {0}")]
    Probe(&'static str),
    #[error("oauth: {}", .0.class())]
    OAuth(#[from] OAuthError),
    #[error("too many pending authorizations")]
    TooMany,
    /// The principal's own share of the connector's pending flows is taken.
    #[error("too many pending authorizations of this principal")]
    TooManyOfPrincipal,
    #[error(transparent)]
    Store(StoreError),
}

impl From<SecretsError> for FlowError {
    fn from(e: SecretsError) -> Self {
        match e {
            SecretsError::NotConfigured => Self::NotConfigured,
            SecretsError::Store(StoreError::Conflict("too_many_flows")) => Self::TooMany,
            SecretsError::Store(StoreError::Conflict("too_many_flows_of_principal")) => {
                Self::TooManyOfPrincipal
            }
            SecretsError::Store(e) => Self::Store(e),
            // A sealing failure or a row that does not open is the store's problem.
            SecretsError::Crypto | SecretsError::TooMany => {
                Self::Store(StoreError::Corrupt("a sealed oauth row".into()))
            }
        }
    }
}

impl FlowError {
    pub fn class(&self) -> &'static str {
        match self {
            Self::NotConfigured => "oauth_not_configured",
            Self::NotHttp => "not_http",
            Self::NotRequired => "authorization_not_required",
            Self::Probe(class) => class,
            Self::OAuth(e) => e.class(),
            Self::TooMany => "too_many_flows",
            Self::TooManyOfPrincipal => "too_many_flows_of_principal",
            Self::Store(e) => e.metric_label(),
        }
    }
}

fn http_url(row: &ConnectorRow) -> Result<&str, FlowError> {
    match &row.target {
        ConnectorTarget::Http { url, .. } => Ok(url),
        ConnectorTarget::Stdio { .. } => Err(FlowError::NotHttp),
    }
}

/// A flow bound to a browser: where to send the person, until when, and what that
/// browser keeps in a cookie to finish it.
pub struct Bound {
    pub authorization_url: String,
    pub expires_at: DateTime<Utc>,
    /// The flow's handle: its state's SHA-256, base64url (never the state).
    pub flow: String,
    /// The browser's nonce (base64url of 32 random bytes); the flow keeps its hash.
    pub nonce: String,
}

/// A fresh browser nonce and the hash a flow keeps of it.
fn browser_nonce() -> (String, [u8; 32]) {
    let mut bytes = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
    let nonce = URL_SAFE_NO_PAD.encode(bytes);
    let hash = browser_hash(&nonce);
    (nonce, hash)
}

/// The hash of a browser's nonce, as a flow keeps it.
pub fn browser_hash(nonce: &str) -> [u8; 32] {
    store::state_hash(nonce)
}

/// The handle of the flow whose state hashes to `hash`.
pub fn flow_handle(hash: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(hash)
}

/// The handle of the flow of `state`: the name of its browser's cookie is made of it.
pub fn handle_of_state(state: &str) -> String {
    flow_handle(&store::state_hash(state))
}

/// The link a turn hands out for a flow: `POST` by the turn's principal only, it answers
/// the authorization URL bound to the caller's browser ([`continue_flow`]).
fn flow_link(oauth: &OAuth, hash: &[u8]) -> String {
    format!(
        "{}/v1/oauth/flows/{}",
        oauth.config.public_url,
        flow_handle(hash)
    )
}

/// `POST /v1/connectors/{id}/authorize`: asks the server whether it wants a token (its
/// `401` challenge names its metadata), then begins a flow for `owner`, bound to the
/// caller's browser. `by` (the caller) is logged as binding the grant the flow's callback
/// stores (L5).
pub async fn authorize(
    oauth: &OAuth,
    store: &Store,
    allow_private: bool,
    row: &ConnectorRow,
    owner: &GrantOwner,
    by: &Actor,
) -> Result<Bound, FlowError> {
    if !store.secrets_configured() {
        return Err(FlowError::NotConfigured);
    }
    let url = http_url(row)?;
    let challenge = probe(url, allow_private).await?;
    let (nonce, hash) = browser_nonce();
    let begun = Begun {
        challenge: Some(&challenge),
        replaces: Replaces::Any,
        by,
        browser: Some(&hash),
    };
    let (authorization_url, expires_at, state_hash) =
        begin(oauth, store, row, owner, begun).await?;
    Ok(Bound {
        authorization_url,
        expires_at,
        flow: flow_handle(&state_hash),
        nonce,
    })
}

/// `POST /v1/oauth/flows/{flow}`: the flow a turn of `by` began (its link), bound now to
/// the caller's browser. `None`: no live flow of `by` has this handle.
pub async fn continue_flow(
    store: &Store,
    team: TeamId,
    flow: &str,
    by: &Actor,
) -> Result<Option<Bound>, FlowError> {
    // Without the key no flow was ever kept.
    if !store.secrets_configured() {
        return Ok(None);
    }
    let Some(hash) = URL_SAFE_NO_PAD.decode(flow).ok().filter(|h| h.len() == 32) else {
        return Ok(None);
    };
    let (nonce, browser) = browser_nonce();
    match bounded(store.bind_flow::<StoredFlow>(team, &hash, by, &browser)).await {
        Ok((stored, expires_at)) => Ok(Some(Bound {
            authorization_url: stored.authorization_url,
            expires_at,
            flow: flow.to_owned(),
            nonce,
        })),
        Err(SecretsError::Store(StoreError::NotFound)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// How a flow begins: the challenge it answers, which grant it may replace, who began it,
/// and the hash of its browser's nonce when it is bound to one from the start.
struct Begun<'a> {
    challenge: Option<&'a str>,
    replaces: Replaces,
    by: &'a Actor,
    browser: Option<&'a [u8; 32]>,
}

/// A pending flow as stored: the protocol's state, and what a later turn needs to hand the
/// same flow out again (its link, and the challenge it answered).
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredFlow {
    flow: PendingFlow,
    authorization_url: String,
    challenge: Option<String>,
    /// Which grant the callback may replace. Absent in flows stored before it was kept:
    /// those were begun by an admin or a turn alike, and replace nothing.
    #[serde(default = "Replaces::nothing")]
    replaces: Replaces,
}

/// Begins a flow on `row`'s server for `owner` and stores it: the authorization URL,
/// when the flow expires, and its state's hash.
async fn begin(
    oauth: &OAuth,
    store: &Store,
    row: &ConnectorRow,
    owner: &GrantOwner,
    begun: Begun<'_>,
) -> Result<(String, DateTime<Utc>, [u8; 32]), FlowError> {
    let Begun {
        challenge,
        replaces,
        by,
        browser,
    } = begun;
    let url = http_url(row)?;
    let (authorization_url, flow) =
        oauth::begin(&oauth.http, url, challenge, &oauth.options(url)).await?;
    let state = oauth::state_of(&flow).to_owned();
    let stored = StoredFlow {
        flow,
        authorization_url,
        challenge: challenge.map(str::to_owned),
        replaces,
    };
    let bounds = (FLOW_TTL, MAX_LIVE_FLOWS, MAX_LIVE_FLOWS_PER_PRINCIPAL);
    let put = store.put_flow(owner, &state, &stored, bounds, by, browser);
    let expires_at = bounded(put).await?;
    Ok((
        stored.authorization_url,
        expires_at,
        store::state_hash(&state),
    ))
}

/// What the callback found.
#[derive(Debug)]
pub enum Finished {
    /// The grant is stored for this owner.
    Connected(GrantOwner),
    /// A turn's flow came back after another grant was bound for the owner: that one is
    /// kept, this one dropped.
    Kept(GrantOwner),
    /// No flow has this state: never issued, or already used.
    Unknown,
    /// The flow's time was up.
    Expired,
    /// The flow is bound to another browser than the callback's (a link sent on to
    /// someone else): nothing is bound, and the flow waits for its own browser.
    Elsewhere,
}

/// `GET /v1/oauth/callback` with a code, from the browser whose nonce hashes to
/// `browser`: takes the flow of `state` if it is that browser's (whatever happens next, it
/// cannot be used again), exchanges the code and stores the grant, logged as bound by
/// whoever began the flow, from the callback's `address` (L5).
pub async fn finish(
    oauth: &OAuth,
    store: &Store,
    code: &str,
    state: &str,
    iss: Option<&str>,
    (address, browser): (Option<IpAddr>, Option<[u8; 32]>),
) -> Result<Finished, FlowError> {
    let (owner, stored, by) = match take(store, state, browser).await? {
        Some(TakenFlow::Live(owner, stored, began_by)) => (
            owner,
            stored,
            Actor {
                address,
                ..began_by
            },
        ),
        Some(TakenFlow::Expired) => return Ok(Finished::Expired),
        Some(TakenFlow::Elsewhere) => return Ok(Finished::Elsewhere),
        None => return Ok(Finished::Unknown),
    };
    let grant = oauth::finish(&oauth.http, stored.flow, code, state, iss).await?;
    let stored_grant =
        bounded(store.put_grant(&owner, &grant, stored.replaces.version(), &by)).await?;
    Ok(if stored_grant {
        Finished::Connected(owner)
    } else {
        Finished::Kept(owner)
    })
}

/// The callback with an `error` (the person refused, or the server did), from the
/// browser whose nonce hashes to `browser`: that browser's flow is spent all the same
/// (another browser's is left alone). Whether there was one.
pub async fn abandon(
    store: &Store,
    state: &str,
    browser: Option<[u8; 32]>,
) -> Result<bool, FlowError> {
    Ok(matches!(
        take(store, state, browser).await?,
        Some(TakenFlow::Live(..))
    ))
}

async fn take(
    store: &Store,
    state: &str,
    browser: Option<[u8; 32]>,
) -> Result<Option<TakenFlow<StoredFlow>>, FlowError> {
    if !store.secrets_configured() {
        return Err(FlowError::NotConfigured);
    }
    match bounded(store.take_flow(state, browser.as_ref())).await {
        Ok(taken) => Ok(Some(taken)),
        Err(SecretsError::Store(StoreError::NotFound)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A store call of the OAuth path under [`store::CALL_BOUND`].
async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, SecretsError>>,
) -> Result<T, SecretsError> {
    tokio::time::timeout(store::CALL_BOUND, call)
        .await
        .unwrap_or(Err(SecretsError::Store(StoreError::TimedOut)))
}

/// Asks the MCP server for `initialize` without a token: its `401` challenge
/// (`WWW-Authenticate`) is what discovery starts from. A server that answers anything
/// else successfully needs no authorization.
async fn probe(url: &str, allow_private: bool) -> Result<String, FlowError> {
    let parsed = reqwest::Url::parse(url).map_err(|_| FlowError::Probe("invalid_url"))?;
    let pinned = address::resolve(&parsed, allow_private)
        .await
        .map_err(FlowError::Probe)?;
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(PROBE_TIMEOUT);
    if let Some((host, addresses)) = pinned {
        builder = builder.resolve_to_addrs(&host, &addresses);
    }
    let client = builder
        .build()
        .map_err(|_| FlowError::Probe("client_failed"))?;
    let initialize = serde_json::json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": CLIENT_NAME, "version": env!("CARGO_PKG_VERSION")},
        },
    });
    let response = client
        .post(parsed)
        .header(
            reqwest::header::ACCEPT,
            "application/json, text/event-stream",
        )
        .json(&initialize)
        .send()
        .await
        .map_err(|e| {
            FlowError::Probe(if e.is_timeout() {
                "timeout"
            } else {
                "unreachable"
            })
        })?;
    match response.status() {
        reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN => Ok(response
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("Bearer")
            .to_owned()),
        status if status.is_success() => Err(FlowError::NotRequired),
        _ => Err(FlowError::Probe("unexpected_status")),
    }
}

/// Which grant of its owner a flow's callback may replace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum Replaces {
    /// Whichever is there: an admin's (or a user's own) explicit authorization.
    Any,
    /// A turn's flow: only the grant of this version, the one the server refused when the
    /// flow began (`None`: there was none, so it replaces nothing).
    Version(Option<i64>),
}

impl Replaces {
    fn nothing() -> Self {
        Self::Version(None)
    }

    /// What `Store::put_grant` compares: `None` replaces any, `Some(None)` none.
    fn version(self) -> Option<Option<i64>> {
        match self {
            Self::Any => None,
            Self::Version(version) => Some(version),
        }
    }
}

/// What became of one connector at a turn's start.
pub(super) enum Started {
    Ready(Session, Vec<rmcp::model::Tool>),
    /// A person must authorize: the flow's link ([`flow_link`]), unless this turn's
    /// principal may not begin the flow (an admin must authorize the connector).
    NeedsAuthorization(Option<String>),
    /// An error class.
    Down(&'static str),
}

/// Who a turn's connectors are started for.
#[derive(Clone, Copy, Debug)]
pub struct Requester<'a> {
    /// The chat's creator, whose own grants come first and for whom a flow is begun.
    pub user: Option<&'a str>,
    /// Whether the turn's principal is an admin, who alone may begin a flow for the whole
    /// connector (X1, as `POST /v1/connectors/{id}/authorize` without a user).
    pub admin: bool,
    /// The turn's principal (`Authority::actor`: `key:<id>` or `user:<subject>`), logged
    /// as binding the grant of a flow the turn begins (L5).
    pub actor: &'a str,
    /// Who answers the servers' questions (P5): the person in the chat of an interactive
    /// turn, nobody for a background or autostart one.
    pub answerer: Answerer,
}

/// What a turn starts its connectors with.
pub(super) struct Turn<'a> {
    pub oauth: &'a OAuth,
    pub store: &'a Store,
    pub team: TeamId,
    /// Whose secrets fill the connector's credential templates.
    pub agent: AgentId,
    pub requester: Requester<'a>,
    pub config: &'a ConnectorConfig,
    pub cancel: &'a CancellationToken,
}

/// Starts `row`'s session for a turn (see the module docs): its static credentials filled
/// from secrets, then its OAuth grant, all within the startup timeout and the turn's
/// cancellation. A connector with a static `Authorization` header does not use OAuth: a
/// server that refuses it is `down` with `credentials_refused`.
pub(super) async fn start(turn: &Turn<'_>, row: &ConnectorRow) -> Started {
    let Turn {
        oauth,
        store,
        team,
        agent,
        requester,
        config,
        cancel,
    } = *turn;
    let answerer = requester.answerer;
    let user = requester.user;
    let attempt = async {
        let (headers, env) = row.target.templates();
        let credentials = match credentials::resolve(store, team, agent, headers, env).await {
            Ok(credentials) => credentials,
            Err(class) => return Started::Down(class),
        };
        if credentials.has_authorization() {
            return match Session::start(row, config, &credentials, None, answerer, cancel).await {
                Ok((session, tools)) => Started::Ready(session, tools),
                Err(e) if e.challenge().is_some() => Started::Down("credentials_refused"),
                Err(e) => Started::Down(e.class()),
            };
        }
        let grant = match grant_token(oauth, store, team, row, user).await {
            Ok(grant) => grant,
            Err(Refresh::Rejected) => return ask(oauth, store, team, row, requester, None).await,
            Err(Refresh::Failed(class)) => return Started::Down(class),
        };
        let bearer = grant.as_ref().map(|(_, token, _)| token.as_str());
        let challenge =
            match Session::start(row, config, &credentials, bearer, answerer, cancel).await {
                Ok((session, tools)) => return Started::Ready(session, tools),
                Err(e) => match e.challenge() {
                    Some(challenge) => challenge.to_owned(),
                    None => return Started::Down(e.class()),
                },
            };
        // A token the server refused before its time (revoked, or shorter-lived than it
        // said): one refresh, then one more try, before asking a person.
        if let Some((owner, _, version)) = grant {
            match locked_refresh(oauth, store, &owner, version).await {
                Ok((token, _)) => {
                    match Session::start(row, config, &credentials, Some(&token), answerer, cancel)
                        .await
                    {
                        Ok((session, tools)) => return Started::Ready(session, tools),
                        Err(e) if e.challenge().is_none() => return Started::Down(e.class()),
                        Err(_) => {}
                    }
                }
                Err(Refresh::Rejected) => {}
                Err(Refresh::Failed(class)) => return Started::Down(class),
            }
        }
        ask(oauth, store, team, row, requester, Some(&challenge)).await
    };
    tokio::select! {
        biased;
        () = cancel.cancelled() => Started::Down("cancelled"),
        timed = tokio::time::timeout(config.startup_timeout, attempt) => {
            timed.unwrap_or(Started::Down("timeout"))
        }
    }
}

/// The link of a flow for the chat's creator (an API key's chat: for the connector): a
/// live one begun earlier for the same challenge, with at least [`REUSE_LEFT`] to go
/// (so that turns of a chat waiting for its person do not each register and begin
/// anew), else a new one. A chat's user never gets to authorize for the whole connector,
/// nor does a turn of a non-admin key (X1).
async fn ask(
    oauth: &OAuth,
    store: &Store,
    team: TeamId,
    row: &ConnectorRow,
    requester: Requester<'_>,
    challenge: Option<&str>,
) -> Started {
    if !store.secrets_configured() {
        return Started::Down("oauth_not_configured");
    }
    if requester.user.is_none() && !requester.admin {
        return Started::NeedsAuthorization(None);
    }
    let owner = GrantOwner {
        team,
        connector: row.id,
        user: requester.user.map(str::to_owned),
    };
    let by = Actor::of_turn(requester.actor);
    match bounded(store.live_flows::<StoredFlow>(&owner, &by, REUSE_LEFT)).await {
        Ok(flows) => {
            if let Some((hash, _)) = flows
                .into_iter()
                .find(|(_, f)| f.challenge.as_deref() == challenge)
            {
                return Started::NeedsAuthorization(Some(flow_link(oauth, &hash)));
            }
        }
        // A flow that cannot be read is no reason not to begin another.
        Err(e) => {
            tracing::warn!(connector = %row.id, class = e.metric_label(), "could not read the connector's pending flows")
        }
    }
    // The grant this flow may replace: the one in force now, which the server refused.
    let replaces = match bounded(store.grant_version(&owner)).await {
        Ok(version) => Replaces::Version(version),
        Err(e) => return Started::Down(e.metric_label()),
    };
    let begun = Begun {
        challenge,
        replaces,
        by: &by,
        browser: None,
    };
    match begin(oauth, store, row, &owner, begun).await {
        Ok((_, _, hash)) => Started::NeedsAuthorization(Some(flow_link(oauth, &hash))),
        Err(e) => Started::Down(e.class()),
    }
}

/// Why no token came of a refresh.
enum Refresh {
    /// The authorization server refused it (revoked, expired, none): a person must
    /// authorize again.
    Rejected,
    /// An error class: the connector is down for this turn.
    Failed(&'static str),
}

/// The grant a turn of `user`'s chat connects `row` with, refreshed first when it expires
/// soon: its owner, access token and version. `None` without a grant (or without the
/// secrets key).
async fn grant_token(
    oauth: &OAuth,
    store: &Store,
    team: TeamId,
    row: &ConnectorRow,
    user: Option<&str>,
) -> Result<Option<(GrantOwner, String, i64)>, Refresh> {
    if !store.secrets_configured() || !matches!(row.target, ConnectorTarget::Http { .. }) {
        return Ok(None);
    }
    let found = bounded(store.grant_for::<Grant>(team, row.id, user))
        .await
        .map_err(|e| Refresh::Failed(e.metric_label()))?;
    let Some((owner, grant, version)) = found else {
        return Ok(None);
    };
    if !oauth::expires_soon(&grant, REFRESH_MARGIN) {
        let token = oauth::access_token(&grant).to_owned();
        return Ok(Some((owner, token, version)));
    }
    let (token, version) = locked_refresh(oauth, store, &owner, version).await?;
    Ok(Some((owner, token, version)))
}

/// Refreshes `owner`'s grant, read at version `seen`, under its row lock, unless another
/// replica wrote a newer version while this one waited (then that one's tokens serve).
/// The access token in force afterwards, and its version.
async fn locked_refresh(
    oauth: &OAuth,
    store: &Store,
    owner: &GrantOwner,
    seen: i64,
) -> Result<(String, i64), Refresh> {
    let http = oauth.http.clone();
    let refreshed = store
        .with_locked_grant(owner, |current: &Grant, version| {
            let current = current.clone();
            async move {
                if version != seen {
                    return Ok(None);
                }
                oauth::refresh(&http, &current).await.map(Some)
            }
        })
        .await;
    match refreshed {
        Ok((grant, version)) => {
            tracing::debug!(connector = %owner.connector, user_grant = owner.user.is_some(), version, "connector grant current");
            Ok((oauth::access_token(&grant).to_owned(), version))
        }
        Err(LockedError::Step(e)) if e.needs_authorization() => {
            tracing::info!(connector = %owner.connector, class = e.class(), "connector grant can no longer be refreshed");
            Err(Refresh::Rejected)
        }
        Err(LockedError::Step(e)) => Err(Refresh::Failed(e.class())),
        // The grant was deleted meanwhile (its connector went): nothing to refresh.
        Err(LockedError::Store(SecretsError::Store(StoreError::NotFound))) => {
            Err(Refresh::Rejected)
        }
        Err(LockedError::Store(e)) => Err(Refresh::Failed(e.metric_label())),
    }
}

/// The grants of a connector about to be deleted, to revoke after the delete. Best
/// effort: grants that cannot be read (no key, a store failure) are deleted unrevoked,
/// with a log line.
pub async fn grants_to_revoke(store: &Store, team: TeamId, connector: uuid::Uuid) -> Vec<Grant> {
    if !store.secrets_configured() {
        return Vec::new();
    }
    bounded(store.connector_grants::<Grant>(team, connector))
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(team = %team, connector = %connector, class = e.metric_label(), "could not read the connector's grants; they are deleted unrevoked");
            Vec::new()
        })
}

/// Revokes `grants` at their authorization servers, concurrently, within
/// [`REVOKE_BOUND`]; best effort: a failure is logged by class.
pub async fn revoke_all(oauth: &OAuth, connector: uuid::Uuid, grants: Vec<Grant>) {
    if grants.is_empty() {
        return;
    }
    let all = join_all(grants.iter().map(|g| oauth::revoke(&oauth.http, g)));
    match tokio::time::timeout(REVOKE_BOUND, all).await {
        Ok(results) => {
            for e in results.into_iter().filter_map(Result::err) {
                tracing::warn!(connector = %connector, class = e.class(), "revoking a connector grant failed; it was deleted all the same");
            }
        }
        Err(_) => {
            tracing::warn!(connector = %connector, class = "timeout", "revoking a connector's grants timed out; they were deleted all the same")
        }
    }
}
