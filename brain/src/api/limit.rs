//! The request rate limit on every route: whose bucket a request takes from,
//! and which routes take from none.
//!
//! A request with a bearer that authenticates counts against its principal (its API key,
//! or its JWT user); the principal is kept in the request, so the route does not
//! authenticate it again. Any other request counts against its client address, so
//! guessing credentials is limited too. Exempt, and why:
//! - the probes (`/healthz`, `/readyz`): the kubelet must always get the replica's answer,
//!   and `/readyz` answers from a check of the last second anyway;
//! - the worker routes (the dial, its snapshots, the chat's files): workers are the
//!   deployment's own, a fleet of them redials at once after a replica restarts, their
//!   token is checked without a store, and snapshot uploads have their own slots;
//! - the team API with the operator's token: the operator must be able to disable a
//!   flooding team while it floods. A wrong token there counts against its address.

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ClientAddr, MAX_BEARER};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use engine::ratelimit::Subject;

/// The middleware: takes one request from the caller's bucket, or refuses it
/// `429 rate_limited`. Redis not answering lets the request through (`ratelimit.rs`).
pub async fn limit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let route = parts
        .extensions
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    if route.is_some_and(exempt) {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let operator_route = route.is_some_and(|r| r.starts_with("/v1/teams"));
    let bearer = super::bearer(&parts.headers).filter(|b| b.len() <= MAX_BEARER);
    let principal = match (bearer, &state.config.operator_token) {
        (Some(bearer), Some(operator)) if operator_route && operator.matches(bearer) => {
            return next.run(Request::from_parts(parts, body)).await;
        }
        // The team API takes no team's credentials: such a bearer there is a wrong one.
        (Some(bearer), _) if !operator_route => state.auth.authenticate(bearer).await.ok(),
        _ => None,
    };
    let identity = principal.as_ref().map(Principal::identity);
    let subject = match (&principal, &identity) {
        (Some(principal), Some(identity)) => Subject::Principal {
            team: principal.team,
            identity,
        },
        _ => {
            let Ok(ClientAddr(address)) = ClientAddr::from_request_parts(&mut parts, &state).await;
            Subject::Address(address)
        }
    };
    let refused = state
        .rate_limits
        .take(&subject)
        .await
        .unwrap_or_else(|unchecked| {
            tracing::debug!(class = unchecked.class(), "request rate limit unchecked");
            state
                .metrics
                .rate_limits
                .with_label_values(&["unchecked"])
                .inc();
            None
        });
    if let Some(refusal) = refused {
        state
            .metrics
            .rate_limits
            .with_label_values(&["refused"])
            .inc();
        return ApiError::RateLimited(refusal).into_response();
    }
    // The route's `Principal` extractor takes it from here rather than authenticating again.
    if let Some(principal) = principal {
        parts.extensions.insert(principal);
    }
    next.run(Request::from_parts(parts, body)).await
}

/// Routes no request rate limit applies to (the module doc says why).
fn exempt(route: &str) -> bool {
    matches!(route, "/healthz" | "/readyz")
        || [
            protocol::channel::CONNECT_PATH,
            protocol::snapshot::SNAPSHOT_PATH,
            protocol::snapshot::SNAPSHOT_SKIPPED_PATH,
            protocol::uploads::UPLOAD_PATH,
            protocol::skills::SKILL_PATH,
        ]
        .contains(&route)
}
