//! The HTTP API: routes, authentication and request decoding.
//!
//! One file per resource. Handlers take typed, closed request bodies (`deny_unknown_fields`)
//! through [`JsonBody`] (in `error.rs`), which turns every decoding failure into
//! `invalid_request` or `payload_too_large`; status codes themselves are chosen in
//! `error.rs` only.

mod a2a;
mod agent_secrets;
mod agents;
mod agui;
mod approvals;
mod artifacts;
mod audit;
mod channels;
mod chats;
mod connectors;
mod egress;
mod erasure;
mod events;
mod files;
mod health;
mod issuers;
mod keys;
mod knowledge;
mod limit;
mod mcp;
mod memories;
mod models;
mod oauth;
mod openai;
pub mod openapi;
mod paging;
mod providers;
mod quotas;
mod secrets;
mod settings;
mod skills;
mod teams;
mod turns;
mod usage;
mod users;
mod web;
mod webhooks;
mod whoami;
mod worker;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Request};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::error::{ApiError, JsonBody};
use engine::auth::Principal;
pub use health::ReadinessCheck;

pub fn router(state: AppState) -> Router {
    let max_body = state.config.max_body_bytes;
    let (router, _) = routes().split_for_parts();
    router
        // The web chat: a client of the API, so outside the OpenAPI document.
        .route("/", axum::routing::get(web::index))
        .route("/assets/{file}", axum::routing::get(web::asset))
        // A2A's JSON-RPC interface: described by the A2A specification, not OpenAPI (the
        // document's description links it); the agent card's route is in the document.
        .route("/a2a/{agent_id}", axum::routing::post(a2a::rpc_endpoint))
        .fallback(|| async { ApiError::NotFound("route") })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            limit::limit,
        ))
        // Outside the rate limit, whose refusals are rewritten too.
        .layer(axum::middleware::from_fn(openai::error::rewrite))
        .layer(axum::middleware::from_fn_with_state(
            state.metrics.clone(),
            count_response,
        ))
        .with_state(state)
}

/// `brain_http_requests_total{route,status}`: the route is the matched path template
/// (`/v1/chats/{chat_id}/messages`), never the path itself, which holds ids (X4).
async fn count_response(
    axum::extract::State(metrics): axum::extract::State<engine::metrics::Metrics>,
    request: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .cloned();
    let response = next.run(request).await;
    metrics.http_response(
        route.as_ref().map(|r| r.as_str()),
        response.status().as_str(),
    );
    response
}

/// Every route with its operation. A route's path and method are written once, in the
/// handler's `#[utoipa::path]`, so the router and the contract cannot disagree: adding an
/// operation is that annotation plus one `routes!` line here.
fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::base())
        .nest("/v1", v1_routes())
        // AG-UI (P3): a front end of the same posting path.
        .routes(routes!(agui::run))
        .routes(routes!(a2a::agent_card))
        // The OpenAI-compatible front end (P7): the same posting path again.
        .routes(routes!(openai::models::list))
        .routes(routes!(openai::chat::completions))
        .routes(routes!(openai::responses::create))
        .routes(routes!(openai::responses::get))
        .routes(routes!(openai::responses::cancel))
        // Workers authenticate with their session token, not a team key.
        .routes(routes!(worker::connect))
        .routes(routes!(worker::put_snapshot, worker::get_snapshot))
        .routes(routes!(worker::snapshot_skipped))
        .routes(routes!(worker::get_file))
        .routes(routes!(worker::get_skill))
        // MCP (P2): the same credentials as `/v1`, described by MCP itself.
        .routes(routes!(mcp::post, mcp::delete, mcp::get))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(openapi::serve))
}

/// The routes under `/v1`: the API by resource.
fn v1_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(agents::list, agents::create))
        .routes(routes!(agents::get, agents::update, erasure::erase_agent))
        .routes(routes!(agents::schedule))
        .routes(routes!(openai::options::get, openai::options::put))
        .routes(routes!(channels::list, channels::create))
        .routes(routes!(channels::get, channels::delete))
        .routes(routes!(channels::telegram_update))
        .routes(routes!(channels::slack_event))
        .routes(routes!(channels::slack_interaction))
        .routes(routes!(chats::list, chats::create))
        .routes(routes!(memories::list))
        .routes(routes!(memories::update, memories::delete))
        .routes(routes!(erasure::erase_chat, chats::rename))
        .routes(routes!(erasure::erase_user, users::get, users::update))
        .routes(routes!(agents::sessions))
        .routes(routes!(egress::list))
        .routes(routes!(artifacts::download))
        .routes(routes!(artifacts::meta))
        .routes(routes!(audit::list))
        .routes(routes!(connectors::list, connectors::create))
        .routes(routes!(connectors::delete, connectors::update))
        .routes(routes!(oauth::authorize))
        .routes(routes!(oauth::callback))
        .routes(routes!(oauth::continue_authorization))
        .routes(routes!(oauth::client_metadata))
        .routes(routes!(chats::messages, chats::post_message))
        .routes(routes!(files::upload))
        .routes(routes!(files::download))
        .routes(routes!(events::events))
        .routes(routes!(events::resume))
        .routes(routes!(issuers::list, issuers::create))
        .routes(routes!(issuers::get, issuers::delete))
        .routes(routes!(keys::list, keys::create))
        .routes(routes!(knowledge::list, knowledge::create))
        .routes(routes!(
            knowledge::get,
            knowledge::update,
            knowledge::delete
        ))
        .routes(routes!(knowledge::documents, knowledge::upload))
        .routes(routes!(knowledge::document, knowledge::delete_document))
        .routes(routes!(knowledge::search))
        .routes(routes!(skills::list, skills::upload))
        .routes(routes!(skills::get, skills::delete))
        .routes(routes!(providers::list, providers::create))
        .routes(routes!(
            providers::get,
            providers::update,
            providers::delete
        ))
        .routes(routes!(providers::check))
        .routes(routes!(models::list))
        .routes(routes!(keys::delete))
        .routes(routes!(quotas::get, quotas::put))
        .routes(routes!(
            quotas::get_user,
            quotas::put_user,
            quotas::delete_user
        ))
        .routes(routes!(secrets::list))
        .routes(routes!(settings::get, settings::put))
        .routes(routes!(secrets::put, secrets::delete))
        .routes(routes!(agent_secrets::put))
        .routes(routes!(teams::list, teams::create))
        .routes(routes!(teams::get, teams::update, teams::erase))
        .routes(routes!(usage::get))
        .routes(routes!(approvals::list))
        .routes(routes!(approvals::answer))
        .routes(routes!(turns::get_turn))
        .routes(routes!(turns::list_turns))
        .routes(routes!(turns::stop_turn))
        .routes(routes!(turns::stop_chat))
        .routes(routes!(webhooks::list, webhooks::create))
        .routes(routes!(webhooks::delete))
        .routes(routes!(webhooks::deliveries))
        .routes(routes!(whoami::get))
}

/// The authenticated caller of a `/v1` request (`Authorization: Bearer <API key or JWT>`);
/// what it may do is decided in `engine::auth`.
impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // Authenticated already by the rate limit (`limit.rs`).
        if let Some(principal) = parts.extensions.remove::<Principal>() {
            return Ok(principal);
        }
        let bearer = bearer(&parts.headers).ok_or(ApiError::Unauthorized)?;
        // A JWT with a few claims is well under this; a bigger bearer is never parsed.
        if bearer.len() > MAX_BEARER {
            return Err(ApiError::Refused("the credentials are too long"));
        }
        Ok(state.auth.authenticate(bearer).await?)
    }
}

/// The address a request came from, for the audit log (L5): the TCP peer the server
/// accepted or, when that peer is one of `BRAIN_TRUSTED_PROXIES`, the client its
/// `X-Forwarded-For` names ([`forwarded_client`]). A client's own header is never believed:
/// only a trusted proxy's. `None` where the server was not asked to record peers.
pub struct ClientAddr(pub Option<std::net::IpAddr>);

impl FromRequestParts<AppState> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|peer| peer.0.ip().to_canonical());
        Ok(Self(peer.map(|peer| {
            forwarded_client(
                peer,
                parts.headers.get_all("x-forwarded-for"),
                &state.config.trusted_proxies,
            )
        })))
    }
}

/// The hops of `X-Forwarded-For` read at most; a longer chain is spoofed or broken.
const MAX_FORWARDED_HOPS: usize = 32;

/// The client behind `peer`: walking `X-Forwarded-For` from its right end (the hop the
/// nearest proxy added) while each address is a trusted proxy's, the first that is not.
/// An unreadable entry stops the walk at the last trusted hop, since what lies before it
/// was written by someone unknown; a chain of trusted proxies only answers its first.
fn forwarded_client(
    peer: std::net::IpAddr,
    headers: axum::http::header::GetAll<'_, axum::http::HeaderValue>,
    trusted: &[ipnet::IpNet],
) -> std::net::IpAddr {
    let is_trusted = |ip: &std::net::IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    // Several headers are one list, in order (RFC 9110, 5.3).
    let hops: Vec<&str> = headers
        .iter()
        .flat_map(|value| value.to_str().unwrap_or("?").split(','))
        .collect();
    let mut client = peer;
    for hop in hops.iter().rev().take(MAX_FORWARDED_HOPS) {
        let Ok(ip) = hop.trim().parse::<std::net::IpAddr>() else {
            break;
        };
        client = ip.to_canonical();
        if !is_trusted(&client) {
            break;
        }
    }
    client
}

/// The longest bearer credential read.
pub(super) const MAX_BEARER: usize = 8192;

/// A request's bearer credential (`Authorization: Bearer …`), trimmed; `None` when
/// absent or empty.
fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|b| !b.is_empty())
}

/// Query parameters decoded into a closed type; failures are `invalid_request`.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned> FromRequestParts<AppState> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Self(value))
            .map_err(|e| ApiError::InvalidRequest(e.body_text()))
    }
}

/// Parses a path id; a malformed one is as absent as an unknown one.
fn parse_id<T: std::str::FromStr>(raw: &str, what: &'static str) -> Result<T, ApiError> {
    raw.parse().map_err(|_| ApiError::NotFound(what))
}

/// The W3C trace context of a request (O2): its turn continues the client's trace. `None`
/// without a `traceparent`, or when this process exports no traces.
fn trace_parent(headers: &axum::http::HeaderMap) -> Option<logging::traces::TraceContext> {
    let value = |name| headers.get(name).and_then(|v| v.to_str().ok());
    logging::traces::TraceContext::received(
        value(logging::traces::TRACEPARENT),
        value(logging::traces::TRACESTATE),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(peer: &str, headers: &[&str], trusted: &[&str]) -> String {
        let mut map = axum::http::HeaderMap::new();
        for value in headers {
            map.append("x-forwarded-for", value.parse().unwrap());
        }
        let trusted: Vec<ipnet::IpNet> = trusted.iter().map(|n| n.parse().unwrap()).collect();
        forwarded_client(
            peer.parse().unwrap(),
            map.get_all("x-forwarded-for"),
            &trusted,
        )
        .to_string()
    }

    #[test]
    fn only_a_trusted_proxys_forwarded_for_is_believed() {
        // No trusted proxies, or a peer that is not one: the header is the client's own.
        assert_eq!(client("10.0.0.5", &["203.0.113.7"], &[]), "10.0.0.5");
        assert_eq!(
            client("192.0.2.1", &["203.0.113.7"], &["10.0.0.0/8"]),
            "192.0.2.1"
        );
        // A trusted peer: the nearest untrusted hop, whatever the client wrote before it.
        assert_eq!(
            client("10.0.0.5", &["198.51.100.9, 203.0.113.7"], &["10.0.0.0/8"]),
            "203.0.113.7"
        );
        // Two trusted proxies, the list spread over two headers.
        assert_eq!(
            client(
                "10.0.0.5",
                &["1.2.3.4, 203.0.113.7", "10.1.1.1"],
                &["10.0.0.0/8"]
            ),
            "203.0.113.7"
        );
        // An unreadable hop stops at the last trusted one; none at all leaves the peer.
        assert_eq!(
            client(
                "10.0.0.5",
                &["203.0.113.7, junk, 10.2.2.2"],
                &["10.0.0.0/8"]
            ),
            "10.2.2.2"
        );
        assert_eq!(client("10.0.0.5", &[], &["10.0.0.0/8"]), "10.0.0.5");
        // IPv4-mapped IPv6 is its IPv4 address.
        assert_eq!(
            client("10.0.0.5", &["::ffff:203.0.113.7"], &["10.0.0.0/8"]),
            "203.0.113.7"
        );
    }
}
