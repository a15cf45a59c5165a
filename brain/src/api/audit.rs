//! `GET /v1/audit` (L5): the team's audit log, newest first, for admins. Every admin
//! change and every tool call that changed an agent is written there in the change's
//! own transaction (`store::audit`); docs/design/audit.md is the design.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use super::QueryParams;
use super::paging::{self, KeysetKey};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use protocol::ErrorBody;
use store::{AuditEntry, AuditFilter, bounded};

const AUDIT_CURSOR: &str = "au1:";
/// The longest `object` or `actor` filter: the longest stored value.
const MAX_FILTER: usize = 512;

/// `?limit=&cursor=&object=&actor=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// How many: 1 to 200, 50 when absent.
    #[serde(default)]
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
    /// The `next_cursor` of the page before, for the page after it.
    #[serde(default)]
    cursor: Option<String>,
    /// Only entries about this object: an agent's, key's, connector's or webhook's id, a
    /// team's id, or a team secret's name.
    #[serde(default)]
    #[param(min_length = 1, max_length = 512)]
    object: Option<String>,
    /// Only entries by this actor: a key's id or a token's user.
    #[serde(default)]
    #[param(min_length = 1, max_length = 512)]
    actor: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct AuditPage {
    entries: Vec<AuditEntry>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

fn checked_filter<'a>(value: Option<&'a str>, name: &str) -> Result<Option<&'a str>, ApiError> {
    match value {
        Some(v) if v.is_empty() || v.len() > MAX_FILTER => Err(ApiError::InvalidRequest(format!(
            "{name} must have 1 to {MAX_FILTER} bytes"
        ))),
        // No stored value holds a NUL (Postgres text cannot), and Postgres refuses one as a
        // parameter: the caller's error, not the server's.
        Some(v) if v.contains('\0') => Err(ApiError::InvalidRequest(format!(
            "{name} must not contain NUL characters"
        ))),
        other => Ok(other),
    }
}

#[utoipa::path(
    get,
    path = "/audit",
    operation_id = "list_audit",
    tag = "audit",
    params(AuditParams),
    responses(
        (status = 200, description = "A page of the team's audit entries, newest first: who \
            (a key's id or a token's user, never a credential), what, on which object, when \
            and from which address. Kept `BRAIN_AUDIT_RETENTION_DAYS`.", body = AuditPage),
        (status = 400, description = "`limit` is out of range, `cursor` is not a cursor of \
            this listing, or a filter is empty, too long or holds a NUL (`invalid_request`).",
            body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<AuditParams>,
) -> Result<Json<AuditPage>, ApiError> {
    principal.require_admin()?;
    let limit = paging::checked_limit(params.limit)?;
    let before = params
        .cursor
        .as_deref()
        .map(|c| paging::key_of::<KeysetKey>(AUDIT_CURSOR, c, "cursor"))
        .transpose()?
        .map(|k| k.0);
    let filter = AuditFilter {
        object: checked_filter(params.object.as_deref(), "object")?,
        actor: checked_filter(params.actor.as_deref(), "actor")?,
    };
    let rows = bounded(
        state
            .store
            .audit_entries(principal.team, filter, before, limit + 1),
    )
    .await?;
    let (entries, next_cursor) =
        paging::page(rows, limit, AUDIT_CURSOR, |e| KeysetKey::of(e.at, e.id));
    Ok(Json(AuditPage {
        entries,
        next_cursor,
    }))
}
