//! An OAuth 2.1 authorization server and an MCP resource server that demands its tokens,
//! both on loopback, for the brain's side of connector OAuth (`connector_oauth.rs`).
//!
//! Why a double: no authorization server in the registries here can be driven headlessly
//! the way these tests need. The client's conformance to the spec is checked elsewhere:
//! by the official MCP conformance suite against its own mock servers
//! (`mcp-conformance-client`, `brain/tests/all/mcp_conformance.rs`) and against
//! oauth2-mock-server (`brain/tests/all/oauth_client.rs`). What these two check is the brain's
//! handling around the client (storage, single-use flows, refresh before connect, the
//! refresh race between replicas, revocation on delete, a real MCP server reached with the
//! token), which needs what a packaged mock does not give: refresh tokens that rotate and
//! refuse their reuse, a resource server that checks each token's audience against the
//! same ledger, a refresh that can be slowed so two replicas overlap, and the record of
//! what was issued, accepted and revoked that the assertions read. They are strict where
//! a real server would be: PKCE S256 and its verifier, the `resource` parameter (RFC 8707),
//! registered redirect URIs, single-use codes, revoked tokens.
//!
//! The resource server is a reverse proxy in front of server-everything (streamable
//! HTTP): every `/mcp` request needs a live access token for its URL, else it answers
//! `401` with `WWW-Authenticate: Bearer resource_metadata=…` (RFC 9728).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// What the authorization server has issued and seen; tests read it.
#[derive(Default)]
pub struct Ledger {
    clients: HashMap<String, Vec<String>>,
    codes: HashMap<String, Code>,
    access: HashMap<String, Access>,
    refresh: HashMap<String, String>,
    /// Refresh tokens that were rotated out (a second use is a replay).
    rotated: HashSet<String>,
    pub registrations: usize,
    pub authorizations: usize,
    pub code_exchanges: usize,
    pub refreshes: usize,
    /// Uses of a rotated-out refresh token (refused).
    pub refresh_replays: usize,
    /// Every token `/revoke` was given.
    pub revoked: Vec<String>,
    /// Every access token issued, in order.
    pub issued_access: Vec<String>,
    /// Every refresh token issued, in order.
    pub issued_refresh: Vec<String>,
    /// The bearer tokens the resource server accepted, in order.
    pub accepted: Vec<String>,
    /// Requests the resource server refused with 401.
    pub challenged: usize,
}

struct Code {
    client_id: String,
    redirect_uri: String,
    challenge: String,
    resource: String,
    subject: String,
}

struct Access {
    resource: String,
    expires: Instant,
    subject: String,
}

#[derive(Clone)]
struct AsState {
    issuer: String,
    /// The one resource this server issues tokens for (the MCP server's URL).
    resource: Arc<Mutex<String>>,
    ledger: Arc<Mutex<Ledger>>,
    /// The lifetime of access tokens (short, so that a refresh is exercised).
    access_ttl: Arc<Mutex<Duration>>,
    /// The consenting person's identity at this server, for the next authorization.
    subject: Arc<Mutex<String>>,
    /// How long the token endpoint takes to answer a refresh.
    refresh_delay: Arc<Mutex<Duration>>,
}

/// The authorization server: metadata (RFC 8414), registration (RFC 7591), the
/// authorization and token endpoints (OAuth 2.1 with PKCE), and revocation (RFC 7009).
pub struct AuthServer {
    pub issuer: String,
    state: AsState,
}

impl AuthServer {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}", listener.local_addr().unwrap());
        let state = AsState {
            issuer: issuer.clone(),
            resource: Arc::default(),
            ledger: Arc::default(),
            access_ttl: Arc::new(Mutex::new(Duration::from_secs(3600))),
            subject: Arc::new(Mutex::new("person-1".into())),
            refresh_delay: Arc::default(),
        };
        let app = Router::new()
            .route("/.well-known/oauth-authorization-server", get(metadata))
            .route("/register", post(register))
            .route("/authorize", get(authorize))
            .route("/token", post(token))
            .route("/revoke", post(revoke))
            .with_state(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { issuer, state }
    }

    pub fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.state.ledger.lock().unwrap()
    }

    /// Access tokens issued from now on live this long.
    pub fn set_access_ttl(&self, ttl: Duration) {
        *self.state.access_ttl.lock().unwrap() = ttl;
    }

    /// The token endpoint takes this long to answer a refresh (so that two clients
    /// refreshing at once overlap).
    pub fn set_refresh_delay(&self, delay: Duration) {
        *self.state.refresh_delay.lock().unwrap() = delay;
    }

    /// Who consents at the next `/authorize`.
    pub fn set_subject(&self, subject: &str) {
        *self.state.subject.lock().unwrap() = subject.to_owned();
    }

    /// The subject an access token was issued to, if it is live.
    pub fn subject_of(&self, token: &str) -> Option<String> {
        let ledger = self.ledger();
        ledger
            .access
            .get(token)
            .filter(|a| a.expires > Instant::now())
            .map(|a| a.subject.clone())
    }

    /// Revokes `token` as `/revoke` would, without recording it as the client's.
    pub fn revoke(&self, token: &str) {
        let mut ledger = self.ledger();
        ledger.access.remove(token);
        ledger.refresh.remove(token);
    }

    /// Makes every access token issued so far expire now (as if time had passed).
    pub fn expire_access_tokens(&self) {
        let mut ledger = self.ledger();
        let past = Instant::now() - Duration::from_secs(1);
        for access in ledger.access.values_mut() {
            access.expires = past;
        }
    }
}

/// An `application/x-www-form-urlencoded` body (the workspace's axum has no `form`
/// feature; the URL parser decodes the same encoding).
fn form(body: &[u8]) -> HashMap<String, String> {
    let text = std::str::from_utf8(body).unwrap_or("");
    reqwest::Url::parse(&format!("http://form.invalid/?{text}"))
        .map(|u| u.query_pairs().into_owned().collect())
        .unwrap_or_default()
}

fn oauth_error(status: StatusCode, error: &str) -> Response {
    (status, axum::Json(json!({"error": error}))).into_response()
}

async fn metadata(State(s): State<AsState>) -> axum::Json<Value> {
    let i = &s.issuer;
    axum::Json(json!({
        "issuer": i,
        "authorization_endpoint": format!("{i}/authorize"),
        "token_endpoint": format!("{i}/token"),
        "registration_endpoint": format!("{i}/register"),
        "revocation_endpoint": format!("{i}/revoke"),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "scopes_supported": ["mcp"],
    }))
}

async fn register(State(s): State<AsState>, axum::Json(body): axum::Json<Value>) -> Response {
    let Some(uris) = body["redirect_uris"].as_array() else {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_redirect_uri");
    };
    let uris: Vec<String> = uris
        .iter()
        .filter_map(|u| u.as_str().map(str::to_owned))
        .collect();
    if uris.is_empty() {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_redirect_uri");
    }
    let client_id = format!("client-{}", uuid::Uuid::new_v4().simple());
    let mut ledger = s.ledger.lock().unwrap();
    ledger.registrations += 1;
    ledger.clients.insert(client_id.clone(), uris.clone());
    (
        StatusCode::CREATED,
        axum::Json(json!({
            "client_id": client_id,
            "client_id_issued_at": chrono::Utc::now().timestamp(),
            "redirect_uris": uris,
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        })),
    )
        .into_response()
}

/// An auto-consenting person: checks the request as a real server would, then redirects
/// back with a code at once.
async fn authorize(State(s): State<AsState>, Query(q): Query<HashMap<String, String>>) -> Response {
    let get = |k: &str| q.get(k).cloned().unwrap_or_default();
    let mut ledger = s.ledger.lock().unwrap();
    let Some(uris) = ledger.clients.get(&get("client_id")) else {
        return oauth_error(StatusCode::BAD_REQUEST, "unauthorized_client");
    };
    let redirect_uri = get("redirect_uri");
    // A redirect URI that is not registered is never redirected to (the error is shown
    // to the person instead).
    if !uris.contains(&redirect_uri) {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_redirect_uri");
    }
    let state = get("state");
    let back = |params: &[(&str, &str)]| {
        let mut url = reqwest::Url::parse(&redirect_uri).unwrap();
        url.query_pairs_mut().extend_pairs(params);
        Response::builder()
            .status(StatusCode::FOUND)
            .header(header::LOCATION, url.as_str())
            .body(Body::empty())
            .unwrap()
    };
    let resource = s.resource.lock().unwrap().clone();
    if get("response_type") != "code"
        || get("code_challenge_method") != "S256"
        || get("code_challenge").len() < 43
        || get("resource") != resource
        || state.is_empty()
    {
        return back(&[("error", "invalid_request"), ("state", &state)]);
    }
    let code = format!("code-{}", uuid::Uuid::new_v4().simple());
    ledger.authorizations += 1;
    ledger.codes.insert(
        code.clone(),
        Code {
            client_id: get("client_id"),
            redirect_uri: redirect_uri.clone(),
            challenge: get("code_challenge"),
            resource,
            subject: s.subject.lock().unwrap().clone(),
        },
    );
    back(&[("code", &code), ("state", &state), ("iss", &s.issuer)])
}

fn issue(s: &AsState, ledger: &mut Ledger, resource: String, subject: String) -> Value {
    let ttl = *s.access_ttl.lock().unwrap();
    let access = format!("at-{}", uuid::Uuid::new_v4().simple());
    let refresh = format!("rt-{}", uuid::Uuid::new_v4().simple());
    ledger.access.insert(
        access.clone(),
        Access {
            resource: resource.clone(),
            expires: Instant::now() + ttl,
            subject: subject.clone(),
        },
    );
    ledger.refresh.insert(refresh.clone(), subject);
    ledger.issued_access.push(access.clone());
    ledger.issued_refresh.push(refresh.clone());
    json!({
        "access_token": access,
        "token_type": "Bearer",
        "expires_in": ttl.as_secs(),
        "refresh_token": refresh,
        "scope": "mcp",
    })
}

async fn token(State(s): State<AsState>, body: axum::body::Bytes) -> Response {
    let f = form(&body);
    if f.get("grant_type").map(String::as_str) == Some("refresh_token") {
        let delay = *s.refresh_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
    }
    let get = |k: &str| f.get(k).cloned().unwrap_or_default();
    let mut ledger = s.ledger.lock().unwrap();
    match get("grant_type").as_str() {
        "authorization_code" => {
            // Single use: a code is gone after its first exchange, right or wrong.
            let Some(code) = ledger.codes.remove(&get("code")) else {
                return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant");
            };
            let verifier = get("code_verifier");
            let computed = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(Sha256::digest(verifier.as_bytes()));
            if code.client_id != get("client_id")
                || code.redirect_uri != get("redirect_uri")
                || computed != code.challenge
                || (f.contains_key("resource") && get("resource") != code.resource)
            {
                return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant");
            }
            ledger.code_exchanges += 1;
            let body = issue(&s, &mut ledger, code.resource, code.subject);
            axum::Json(body).into_response()
        }
        "refresh_token" => {
            let presented = get("refresh_token");
            if ledger.rotated.contains(&presented) {
                ledger.refresh_replays += 1;
                return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant");
            }
            let Some(subject) = ledger.refresh.remove(&presented) else {
                return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant");
            };
            ledger.rotated.insert(presented);
            ledger.refreshes += 1;
            let resource = s.resource.lock().unwrap().clone();
            let body = issue(&s, &mut ledger, resource, subject);
            axum::Json(body).into_response()
        }
        _ => oauth_error(StatusCode::BAD_REQUEST, "unsupported_grant_type"),
    }
}

async fn revoke(State(s): State<AsState>, body: axum::body::Bytes) -> StatusCode {
    let f = form(&body);
    let token = f.get("token").cloned().unwrap_or_default();
    let mut ledger = s.ledger.lock().unwrap();
    ledger.access.remove(&token);
    ledger.refresh.remove(&token);
    ledger.revoked.push(token);
    StatusCode::OK
}

#[derive(Clone)]
struct RsState {
    /// This server's `/mcp` URL: the resource tokens must be for.
    resource: String,
    metadata_url: String,
    issuer: String,
    upstream: String,
    ledger: Arc<Mutex<Ledger>>,
    http: reqwest::Client,
}

/// The protected MCP server: the proxy in front of `upstream` (server-everything's
/// `/mcp`).
pub struct ResourceServer {
    /// The MCP endpoint a connector names.
    pub url: String,
}

impl ResourceServer {
    pub async fn start(auth: &AuthServer, upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let url = format!("{base}/mcp");
        *auth.state.resource.lock().unwrap() = url.clone();
        let state = RsState {
            resource: url.clone(),
            metadata_url: format!("{base}/.well-known/oauth-protected-resource/mcp"),
            issuer: auth.issuer.clone(),
            upstream,
            ledger: auth.state.ledger.clone(),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
        };
        let app = Router::new()
            .route(
                "/.well-known/oauth-protected-resource/mcp",
                get(resource_metadata),
            )
            .route(
                "/.well-known/oauth-protected-resource",
                get(resource_metadata),
            )
            .route("/mcp", any(proxy))
            .with_state(state);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url }
    }
}

async fn resource_metadata(State(s): State<RsState>) -> axum::Json<Value> {
    axum::Json(json!({
        "resource": s.resource,
        "authorization_servers": [s.issuer],
        "bearer_methods_supported": ["header"],
        "scopes_supported": ["mcp"],
    }))
}

async fn proxy(
    State(s): State<RsState>,
    method: Method,
    _uri: Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let live = {
        let mut ledger = s.ledger.lock().unwrap();
        let ok = bearer.as_ref().is_some_and(|t| {
            ledger
                .access
                .get(t)
                .is_some_and(|a| a.expires > Instant::now() && a.resource == s.resource)
        });
        if ok {
            ledger.accepted.push(bearer.clone().unwrap());
        } else {
            ledger.challenged += 1;
        }
        ok
    };
    if !live {
        let challenge = format!(
            "Bearer resource_metadata=\"{}\", scope=\"mcp\"",
            s.metadata_url
        );
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_str(&challenge).unwrap(),
            )
            .body(Body::empty())
            .unwrap();
    }
    let mut request = s.http.request(method, &s.upstream).body(body);
    for (name, value) in &headers {
        if name != header::HOST && name != header::AUTHORIZATION && name != header::CONTENT_LENGTH {
            request = request.header(name, value);
        }
    }
    let upstream = match request.send().await {
        Ok(r) => r,
        Err(_) => return StatusCode::BAD_GATEWAY.into_response(),
    };
    let mut response = Response::builder().status(upstream.status());
    for (name, value) in upstream.headers() {
        if name != header::CONTENT_LENGTH && name != header::TRANSFER_ENCODING {
            response = response.header(name, value);
        }
    }
    response
        .body(Body::from_stream(upstream.bytes_stream()))
        .unwrap()
}
