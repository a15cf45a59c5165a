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
pub mod openapi;

use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use protocol::TeamId;
use serde::de::DeserializeOwned;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::error::ApiError;

pub fn router(state: AppState) -> Router {
    let max_body = state.config.max_body_bytes;
    let (router, _) = routes().split_for_parts();
    router
        .fallback(|| async { ApiError::NotFound("route") })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// Every route with its operation. A route's path and method are written once, in the
/// handler's `#[utoipa::path]`, so the router and the contract cannot disagree: adding an
/// operation is that annotation plus one `routes!` line here.
fn routes() -> OpenApiRouter<AppState> {
    let v1 = OpenApiRouter::new()
        .routes(routes!(agents::create))
        .routes(routes!(agents::get))
        .routes(routes!(chats::create))
        .routes(routes!(agents::sessions))
        .routes(routes!(artifacts::download))
        .routes(routes!(artifacts::meta))
        .routes(routes!(connectors::list, connectors::create))
        .routes(routes!(connectors::delete))
        .routes(routes!(chats::messages, chats::post_message));
    OpenApiRouter::with_openapi(openapi::base())
        .nest("/v1", v1)
        // Workers authenticate with their session token, not a team key.
        .routes(routes!(crate::sessions::connect))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics))
        .routes(routes!(openapi::serve))
}

/// The authenticated team of a `/v1` request (`Authorization: Bearer <api key>`).
pub struct Team(pub TeamId);

impl FromRequestParts<AppState> for Team {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let key = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|k| !k.is_empty() && k.len() <= 200)
            .ok_or(ApiError::Unauthorized)?;
        state
            .store
            .team_for_key(key)
            .await?
            .map(Team)
            .ok_or(ApiError::Unauthorized)
    }
}

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

/// Parses a path id; a malformed one is as absent as an unknown one.
fn parse_id<T: std::str::FromStr>(raw: &str, what: &'static str) -> Result<T, ApiError> {
    raw.parse().map_err(|_| ApiError::NotFound(what))
}
