//! The HTTP API: routes, authentication and request decoding.
//!
//! One file per resource. Handlers take typed, closed request bodies (`deny_unknown_fields`)
//! through [`JsonBody`], which turns every decoding failure into `invalid_request` or
//! `payload_too_large`; status codes themselves are chosen in `error.rs` only.

mod agents;
mod artifacts;
mod chats;
mod connectors;
mod health;
mod keys;
mod quotas;
mod usage;

use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::routing::{delete, get};
use serde::de::DeserializeOwned;

use crate::AppState;
use crate::auth::Principal;
use crate::error::ApiError;

pub fn router(state: AppState) -> Router {
    let max_body = state.config.max_body_bytes;
    let v1 = Router::new()
        .route("/agents", get(agents::list).post(agents::create))
        .route("/agents/{agent_id}", get(agents::get))
        .route(
            "/agents/{agent_id}/chats",
            get(chats::list).post(chats::create),
        )
        .route("/agents/{agent_id}/sessions", get(agents::sessions))
        // Workers authenticate with their session token, not a team key.
        .route(
            protocol::channel::CONNECT_PATH.trim_start_matches("/v1"),
            get(crate::sessions::connect),
        )
        .route("/artifacts/{artifact_id}", get(artifacts::download))
        .route("/artifacts/{artifact_id}/meta", get(artifacts::meta))
        .route(
            "/connectors",
            get(connectors::list).post(connectors::create),
        )
        .route("/connectors/{connector_id}", delete(connectors::delete))
        .route("/quotas", get(quotas::get).put(quotas::put))
        .route("/keys", get(keys::list).post(keys::create))
        .route("/keys/{key_id}", delete(keys::delete))
        .route(
            "/chats/{chat_id}/messages",
            get(chats::messages).post(chats::post_message),
        )
        .route("/usage", get(usage::get));
    Router::new()
        .nest("/v1", v1)
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .fallback(|| async { ApiError::NotFound("route") })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// The authenticated caller of a `/v1` request (`Authorization: Bearer <API key or JWT>`);
/// what it may do is decided in `crate::auth`.
impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let bearer = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .ok_or(ApiError::Unauthorized)?;
        // A JWT with a few claims is well under this; a bigger bearer is never parsed.
        if bearer.len() > MAX_BEARER {
            return Err(ApiError::Refused("the credentials are too long"));
        }
        Ok(state.auth.authenticate(bearer).await?)
    }
}

/// The longest bearer credential read.
const MAX_BEARER: usize = 8192;

/// A JSON body decoded into a closed type; failures become stable error codes.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(JsonRejection::BytesRejection(e))
                if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE =>
            {
                Err(ApiError::PayloadTooLarge(state.config.max_body_bytes))
            }
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::InvalidRequest(
                "expected Content-Type: application/json".into(),
            )),
            Err(e) => Err(ApiError::InvalidRequest(e.body_text())),
        }
    }
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
