//! `GET /v1/sessions/{id}/egress`: what a worker session's commands reached through its
//! egress proxy (W15; docs/design/egress.md): host, port, method, status, the refusal
//! class and bytes of each request, never a body, a header or a path.

use axum::Json;
use axum::extract::{Path, State};
use protocol::{ErrorBody, SessionId};
use serde::Serialize;
use uuid::Uuid;

use super::paging::{self, PageParams};
use super::{QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::{AuthError, Principal};
use store::{EgressRequest, StoreError, bounded};

#[derive(Serialize, utoipa::ToSchema)]
pub struct EgressRequests {
    /// A page of the session's requests, in the order they were answered.
    requests: Vec<EgressRequest>,
    /// Requests past the ledger's bound per session (10,000), counted and not kept.
    not_kept: i64,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

const EGRESS_CURSOR: &str = "eg1:";

/// `GET /v1/sessions/{id}/egress`: the session's ledger of egress requests, oldest first,
/// for whoever may see the session's chat.
#[utoipa::path(
    get,
    path = "/sessions/{session_id}/egress",
    operation_id = "list_session_egress",
    tag = "agents",
    params(("session_id" = Uuid, Path, description = "The worker session."), PageParams),
    responses(
        (status = 200, description = "A page of the session's egress requests, oldest first.",
            body = EgressRequests),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such session in the team, or its chat is not the \
            caller's to see (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Path(session_id): Path<String>,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<EgressRequests>, ApiError> {
    let session = SessionId(parse_id::<Uuid>(&session_id, "session")?);
    let limit = params.limit()?;
    let after = params.after::<i64>(EGRESS_CURSOR)?;
    let (chat, not_kept) = match bounded(state.store.egress_session(principal.team, session)).await
    {
        Ok(found) => found,
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("session")),
        Err(e) => return Err(e.into()),
    };
    match principal.check_chat(&state.store, chat).await {
        Ok(()) => {}
        Err(AuthError::NotFound(_)) => return Err(ApiError::NotFound("session")),
        Err(e) => return Err(e.into()),
    }
    let rows = bounded(
        state
            .store
            .egress_requests(principal.team, session, after, limit + 1),
    )
    .await?;
    let (requests, next_cursor) = paging::page(rows, limit, EGRESS_CURSOR, |r| r.id);
    Ok(Json(EgressRequests {
        requests,
        not_kept,
        next_cursor,
    }))
}
