//! Connector OAuth (SPEC B2): `POST /v1/connectors/{id}/authorize` begins a flow,
//! `POST /v1/oauth/flows/{flow}` hands out a flow a turn began, `GET /v1/oauth/callback`
//! finishes it, `GET /v1/oauth/client-metadata.json` is the brain's client ID metadata
//! document.
//!
//! The callback carries no bearer: its `state` is a single-use, short-lived capability,
//! and the browser must also bring the flow's cookie (`ar_oauth_<flow>`: HttpOnly,
//! SameSite=Lax, `Secure` under an `https` public URL, its path the callback's), set on the
//! authenticated answer that handed the flow's URL to the principal that began it; a link
//! sent on to someone else binds nothing. The callback answers a small HTML page for the
//! person in the browser, and never echoes the code, the state or what the authorization
//! server said; the page is neither cached nor given a referrer (its URL holds the code).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use protocol::ErrorBody;
use serde::{Deserialize, Serialize};

use super::{ClientAddr, QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use engine::connectors::authorization::{self, Bound, Finished, FlowError};
use store::GrantOwner;

/// The longest user id a grant is kept for (the column's check).
const MAX_USER: usize = 512;
/// The longest `code`, `state` or `iss` the callback reads.
const MAX_PARAM: usize = 4096;

#[derive(Serialize, utoipa::ToSchema)]
pub struct AuthorizationStarted {
    /// Send the person here (the authorization server's consent page); it leads back to
    /// `GET /v1/oauth/callback`.
    authorization_url: String,
    /// The flow can be finished until then (10 minutes).
    expires_at: DateTime<Utc>,
}

impl From<FlowError> for ApiError {
    fn from(e: FlowError) -> Self {
        match e {
            FlowError::NotConfigured => Self::NotConfigured(
                "connector OAuth needs BRAIN_SECRETS_KEY (tokens are stored encrypted), which \
                 this server does not have",
            ),
            FlowError::NotHttp => Self::InvalidRequest(
                "a stdio connector has no authorization server; only url connectors use OAuth"
                    .into(),
            ),
            FlowError::NotRequired => Self::AuthorizationNotRequired,
            FlowError::TooMany => Self::Conflict(format!(
                "the connector has {} unfinished authorizations; finish one or wait for them \
                 to expire",
                authorization::MAX_LIVE_FLOWS
            )),
            FlowError::TooManyOfPrincipal => Self::Conflict(format!(
                "you have {} unfinished authorizations of this connector; finish one or \
                 wait for them to expire",
                authorization::MAX_LIVE_FLOWS_PER_PRINCIPAL
            )),
            FlowError::Probe(class) => Self::AuthorizationFailed {
                step: "the mcp server",
                class,
            },
            FlowError::OAuth(e) => Self::AuthorizationFailed {
                step: "the authorization server",
                class: e.class(),
            },
            FlowError::Store(e) => e.into(),
        }
    }
}

#[utoipa::path(
    post,
    path = "/connectors/{connector_id}/authorize",
    operation_id = "authorize_connector",
    tag = "connectors",
    params(("connector_id" = Uuid, Path, description = "The connector.")),
    responses(
        (status = 200, description = "A flow began: send the person to `authorization_url` \
            in the browser that received this answer, which keeps the flow's cookie (set \
            here); the callback binds nothing without it. With a user token the grant will \
            be that user's; with an admin key, the connector's.",
            body = AuthorizationStarted),
        (status = 400, description = "A stdio connector (`invalid_request`).", body = ErrorBody),
        (status = 501, description = "No `BRAIN_SECRETS_KEY` on this server (`not_configured`).",
            body = ErrorBody),
        (status = 403, description = "An API key that is not an admin's (`forbidden`).",
            body = ErrorBody),
        (status = 404, description = "No such connector in the team (`not_found`).", body = ErrorBody),
        (status = 409, description = "The server does not ask for authorization \
            (`authorization_not_required`), or too many unfinished flows (`conflict`): 50 \
            per connector, 5 of them begun by one principal.",
            body = ErrorBody),
        (status = 502, description = "The MCP server or its authorization server failed a step \
            (`authorization_failed`).", body = ErrorBody),
    ),
)]
pub async fn authorize(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(connector_id): Path<String>,
) -> Result<Response, ApiError> {
    // A user authorizes for themselves; only an admin for the whole connector.
    if principal.user.is_none() {
        principal.require_admin()?;
    }
    let team = principal.team;
    let id = parse_id(&connector_id, "connector")?;
    if principal.user.as_ref().is_some_and(|u| u.len() > MAX_USER) {
        return Err(ApiError::InvalidRequest(format!(
            "per-user grants need a user id of at most {MAX_USER} bytes"
        )));
    }
    let row = match store::bounded(state.store.connector(team, id)).await {
        Ok(row) => row,
        Err(store::StoreError::NotFound) => return Err(ApiError::NotFound("connector")),
        Err(e) => return Err(e.into()),
    };
    let owner = GrantOwner {
        team,
        connector: id,
        user: principal.user.clone(),
    };
    let bound = authorization::authorize(
        &state.oauth,
        &state.store,
        state.config.connectors.allow_private_networks,
        &row,
        &owner,
        &principal.actor(address),
    )
    .await
    .inspect_err(|e| {
        tracing::warn!(team = %team, connector = %id, class = e.class(), "connector authorization could not begin")
    })?;
    tracing::info!(team = %team, connector = %id, user_grant = owner.user.is_some(), "connector authorization begun");
    Ok(started(&state, bound))
}

#[utoipa::path(
    post,
    path = "/oauth/flows/{flow}",
    operation_id = "continue_authorization",
    tag = "connectors",
    params(("flow" = String, Path, description = "The flow's handle, the last segment of \
        the `authorize` link of a connector's `needs_authorization` status.")),
    responses(
        (status = 200, description = "The flow a turn of the caller began: send the person \
            to `authorization_url` in the browser that received this answer, which keeps the \
            flow's cookie (set here, replacing any other browser's).",
            body = AuthorizationStarted),
        (status = 404, description = "No live flow with this handle that the caller began \
            (another principal's link is not found either; `not_found`).", body = ErrorBody),
    ),
)]
pub async fn continue_authorization(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(flow): Path<String>,
) -> Result<Response, ApiError> {
    let by = principal.actor(address);
    match authorization::continue_flow(&state.store, principal.team, &flow, &by).await {
        Ok(Some(bound)) => Ok(started(&state, bound)),
        Ok(None) => Err(ApiError::NotFound("authorization flow")),
        Err(e) => Err(e.into()),
    }
}

/// The answer that hands a flow's URL to the browser of who began it, with the flow's
/// cookie: only that browser's callback takes the flow.
fn started(state: &AppState, bound: Bound) -> Response {
    let config = state.oauth.config();
    let redirect = config.redirect_uri();
    let path = reqwest::Url::parse(&redirect)
        .map(|u| u.path().to_owned())
        .unwrap_or_else(|_| "/v1/oauth/callback".to_owned());
    let secure = if redirect.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    let max_age = authorization::FLOW_TTL.as_secs();
    let cookie = format!(
        "{}={}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}",
        cookie_name(&bound.flow),
        bound.nonce
    );
    let mut response = Json(AuthorizationStarted {
        authorization_url: bound.authorization_url,
        expires_at: bound.expires_at,
    })
    .into_response();
    // A handle and a nonce of base64url characters always make a valid header value.
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn cookie_name(flow: &str) -> String {
    format!("ar_oauth_{flow}")
}

/// The hash of the nonce the browser brought for the flow of `state`, if it brought one.
fn browser_of(headers: &HeaderMap, state: &str) -> Option<[u8; 32]> {
    let name = cookie_name(&authorization::handle_of_state(state));
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, nonce)| authorization::browser_hash(nonce))
}

/// What the authorization server sends back (RFC 6749 §4.1.2, RFC 9207's `iss`). Open:
/// servers add parameters of their own.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct Callback {
    code: Option<String>,
    state: Option<String>,
    iss: Option<String>,
    /// `access_denied` when the person refused.
    error: Option<String>,
}

#[utoipa::path(
    get,
    path = "/oauth/callback",
    operation_id = "oauth_callback",
    tag = "connectors",
    params(Callback),
    security(()),
    responses(
        (status = 200, description = "The connector is authorized (an HTML page).",
            content_type = "text/html", body = String),
        (status = 400, description = "The state is unknown, already used or expired, or a \
            parameter is missing (an HTML page).", content_type = "text/html", body = String),
        (status = 403, description = "The person refused (`error=access_denied`), or the \
            browser is not the one that began the flow (without its cookie; nothing is bound \
            and the flow waits for its own browser); an HTML page.",
            content_type = "text/html", body = String),
        (status = 502, description = "The authorization server refused the code or failed \
            (an HTML page).", content_type = "text/html", body = String),
        (status = 503, description = "The store is unavailable (an HTML page).",
            content_type = "text/html", body = String),
    ),
)]
pub async fn callback(
    State(state): State<AppState>,
    ClientAddr(address): ClientAddr,
    headers: HeaderMap,
    QueryParams(query): QueryParams<Callback>,
) -> Response {
    let too_long = [&query.code, &query.state, &query.iss, &query.error]
        .iter()
        .any(|p| p.as_ref().is_some_and(|p| p.len() > MAX_PARAM));
    let Some(flow_state) = query.state.filter(|s| !s.is_empty() && !too_long) else {
        return page(
            StatusCode::BAD_REQUEST,
            "Not connected",
            "This link is incomplete. Start the authorization again.",
        );
    };
    let browser = browser_of(&headers, &flow_state);
    if let Some(error) = query.error {
        return refused(&state, &flow_state, browser, &error).await;
    }
    let Some(code) = query.code.filter(|c| !c.is_empty()) else {
        return page(
            StatusCode::BAD_REQUEST,
            "Not connected",
            "This link has no authorization code. Start the authorization again.",
        );
    };
    let finished = authorization::finish(
        &state.oauth,
        &state.store,
        &code,
        &flow_state,
        query.iss.as_deref(),
        (address, browser),
    )
    .await;
    finished_page(finished)
}

/// The authorization server sent the person back with an error instead of a code.
async fn refused(
    state: &AppState,
    flow_state: &str,
    browser: Option<[u8; 32]>,
    error: &str,
) -> Response {
    // The flow is spent either way, so the link cannot be retried by someone else;
    // another browser's refusal leaves it to its own.
    let known = authorization::abandon(&state.store, flow_state, browser).await;
    let denied = error == "access_denied";
    tracing::info!(
        known = matches!(known, Ok(true)),
        denied,
        "connector authorization refused at the authorization server"
    );
    if denied {
        page(
            StatusCode::FORBIDDEN,
            "Not connected",
            "The authorization was refused. Nothing was stored.",
        )
    } else {
        page(
            StatusCode::BAD_REQUEST,
            "Not connected",
            "The authorization server reported an error. Nothing was stored; start the \
             authorization again.",
        )
    }
}

/// The page for how finishing the flow went.
fn finished_page(finished: Result<Finished, FlowError>) -> Response {
    match finished {
        Ok(Finished::Connected(owner)) => {
            tracing::info!(team = %owner.team, connector = %owner.connector, user_grant = owner.user.is_some(), "connector authorized");
            page(
                StatusCode::OK,
                "Connected",
                "The connector is authorized. You may close this tab.",
            )
        }
        Ok(Finished::Kept(owner)) => {
            tracing::info!(team = %owner.team, connector = %owner.connector, user_grant = owner.user.is_some(), "connector authorization came back after another; the other is kept");
            page(
                StatusCode::CONFLICT,
                "Not connected",
                "The connector was authorized with another account meanwhile; that \
                 authorization is kept. An admin can authorize it again from the API.",
            )
        }
        Ok(Finished::Unknown) => page(
            StatusCode::BAD_REQUEST,
            "Not connected",
            "This authorization link is unknown or was already used. Start the \
             authorization again.",
        ),
        Ok(Finished::Expired) => page(
            StatusCode::BAD_REQUEST,
            "Not connected",
            "This authorization link has expired. Start the authorization again.",
        ),
        Ok(Finished::Elsewhere) => {
            tracing::info!(
                class = "other_browser",
                "connector authorization came back to a browser that did not begin it; nothing bound"
            );
            page(
                StatusCode::FORBIDDEN,
                "Not connected",
                "This authorization was begun in another browser, by someone else or for \
                 someone else. Nothing was stored. Whoever needs the connector must start \
                 the authorization themselves.",
            )
        }
        Err(e) => {
            tracing::warn!(
                class = e.class(),
                "connector authorization could not finish"
            );
            let status = match &e {
                FlowError::OAuth(_) | FlowError::Probe(_) => StatusCode::BAD_GATEWAY,
                FlowError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::BAD_REQUEST,
            };
            page(
                status,
                "Not connected",
                "The authorization could not be completed. Nothing was stored; start the \
                 authorization again.",
            )
        }
    }
}

/// A page for the browser: fixed text only, no script, no cache, no referrer.
fn page(status: StatusCode, title: &'static str, text: &'static str) -> Response {
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\
         </head><body><h1>{title}</h1><p>{text}</p></body></html>"
    );
    let mut response = (status, Html(body)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'"),
    );
    response
}

#[utoipa::path(
    get,
    path = "/oauth/client-metadata.json",
    operation_id = "oauth_client_metadata",
    tag = "connectors",
    security(()),
    responses(
        (status = 200, description = "The brain's OAuth client ID metadata document: an \
            authorization server that accepts these fetches it to learn the client (its \
            URL is the client ID; used only with an `https` `BRAIN_PUBLIC_URL`).",
            body = Object),
    ),
)]
pub async fn client_metadata(State(state): State<AppState>) -> Json<serde_json::Value> {
    let config = state.oauth.config();
    Json(serde_json::json!({
        "client_id": format!("{}/v1/oauth/client-metadata.json", config.public_url),
        "client_name": "agent-runtime",
        "client_uri": config.public_url,
        "redirect_uris": [config.redirect_uri()],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }))
}
