//! `GET /v1/usage`: the team's billing events summed (SPEC E1).

use axum::Json;
use axum::extract::State;
use serde::Deserialize;

use super::{QueryParams, paging};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use engine::models::catalog::team_catalog;
use engine::usage::{price, usage_query};
use protocol::ErrorBody;
use store::{UsageReport, bounded};

/// The query string, closed like a request body: an unknown parameter is refused.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Inclusive: an RFC 3339 time or a date (midnight UTC); the current UTC month's start
    /// when absent.
    from: Option<String>,
    /// Exclusive, like `from`; now when absent. At most 400 days after `from`.
    to: Option<String>,
    /// `day` (the default), `agent`, `model` or `user` (the JWT subject whose turn billed
    /// the event; an API key's turns and worker-seconds are the `null` row).
    group_by: Option<String>,
    /// How many groups: 1 to 200, 50 when absent (L3).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
    /// The `next_cursor` of the page before, for the groups after it.
    cursor: Option<String>,
}

#[utoipa::path(
    get,
    path = "/usage",
    operation_id = "get_usage",
    tag = "usage",
    params(UsageParams),
    responses(
        (status = 200, description = "The team's billing events summed per group (a page of \
            groups), and in total; `cost` in USD at the catalog's prices (`GET /v1/models`), \
            `null` where a model used has no known price.", body = UsageReport),
        (status = 400, description = "A bad time, a range backwards or over 400 days, an \
            unknown `group_by` or parameter, a bad `limit` or `cursor` (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<UsageParams>,
) -> Result<Json<UsageReport>, ApiError> {
    // Billing covers every user of the team: a team's admins see it.
    principal.require_admin()?;
    let team = principal.team;
    let query = usage_query(
        params.from.as_deref(),
        params.to.as_deref(),
        params.group_by.as_deref(),
        state.clock.now(),
    )
    .map_err(ApiError::InvalidRequest)?;
    let limit = paging::checked_limit(params.limit)?;
    // A cursor names a group of one grouping: another grouping's is refused.
    let tag = format!("u1:{}:", query.group_by.as_str());
    let after: Option<String> = params
        .cursor
        .as_deref()
        .map(|c| paging::key_of(&tag, c, "cursor"))
        .transpose()?;
    let mut report = bounded(state.store.usage(team, query, after.as_deref(), limit)).await?;
    let rows = std::mem::take(&mut report.rows);
    // The key is `null` only on the last group, after which no page follows.
    let (rows, next_cursor) =
        paging::page(rows, limit, &tag, |r| r.key.clone().unwrap_or_default());
    report.rows = rows;
    report.next_cursor = next_cursor;
    let keys: Vec<Option<String>> = report.rows.iter().map(|row| row.key.clone()).collect();
    let tokens = bounded(state.store.usage_models(team, query, &keys)).await?;
    let catalog = bounded(team_catalog(
        &state.store,
        &state.config.model_catalog,
        team,
    ))
    .await?;
    price(&mut report, &tokens, &catalog);
    Ok(Json(report))
}
