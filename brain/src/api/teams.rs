//! `POST/GET /v1/teams`, `GET/PATCH/DELETE /v1/teams/{team_id}`: the platform operator's
//! team API (L1, L2), on `BRAIN_OPERATOR_TOKEN` alone. Unset, every route answers `404` as if absent.
//!
//! Disabling a team takes effect on every replica within a second: Postgres says so first,
//! then `Keys::disabled` tells every replica to forget the team's cached keys and standing
//! and to end its open streams; its running and queued turns are stopped wherever they run,
//! and its schedules stop firing (`store::cron`).

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use protocol::{ErrorBody, TeamId};
use serde::{Deserialize, Serialize};

use super::paging::{self, PageParams};
use super::{ClientAddr, JsonBody, MAX_BEARER, QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::erasure;
use engine::usage::usage_query;
use store::{
    Actor, CreatedTeam, TeamChange, TeamErasure, TeamRow, TeamStatus, UsageSums, Within, bounded,
};

const MAX_NAME_CHARS: usize = 200;
const TEAMS_CURSOR: &str = "tm1:";

/// The caller of a team API route: the platform operator, by its token.
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(token) = &state.config.operator_token else {
            return Err(ApiError::NotFound("route"));
        };
        let bearer = super::bearer(&parts.headers)
            .filter(|b| b.len() <= MAX_BEARER)
            .ok_or(ApiError::Unauthorized)?;
        if !token.matches(bearer) {
            return Err(ApiError::Refused("not the operator's token"));
        }
        Ok(Self)
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "Acme"}))]
pub struct CreateTeam {
    /// 1 to 200 characters.
    name: String,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"disabled": true}))]
pub struct UpdateTeam {
    /// 1 to 200 characters.
    #[serde(default)]
    name: Option<String>,
    /// `true` refuses the team's keys and tokens (`403 team_disabled`) on every replica
    /// within a second, stops its running and queued turns and its schedules; `false`
    /// lets it back in.
    #[serde(default)]
    disabled: Option<bool>,
}

/// A page of teams, oldest first.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TeamList {
    teams: Vec<TeamRow>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// A team with what it used this month (UTC).
#[derive(Serialize, utoipa::ToSchema)]
pub struct TeamDetail {
    #[serde(flatten)]
    team: TeamRow,
    usage_this_month: UsageSums,
}

fn checked_name(name: &str) -> Result<&str, ApiError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS || name.contains('\0') {
        return Err(ApiError::InvalidRequest(format!(
            "name must have 1 to {MAX_NAME_CHARS} characters and no NUL"
        )));
    }
    Ok(name)
}

#[utoipa::path(
    post,
    path = "/teams",
    operation_id = "create_team",
    tag = "teams",
    request_body = CreateTeam,
    responses(
        (status = 201, description = "Created, with its first admin key (`api_key`), shown \
            this once.", body = CreatedTeam),
        (status = 400, description = "A bad name (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "The team API is off: `BRAIN_OPERATOR_TOKEN` is unset \
            (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    _operator: Operator,
    ClientAddr(address): ClientAddr,
    JsonBody(body): JsonBody<CreateTeam>,
) -> Result<(StatusCode, Json<CreatedTeam>), ApiError> {
    let name = checked_name(&body.name)?;
    let by = Actor::operator(address);
    let created = bounded(state.store.create_team_by(name, &by)).await?;
    tracing::info!(team = %created.team_id, "team created by the operator");
    Ok((StatusCode::CREATED, Json(created)))
}

#[utoipa::path(
    get,
    path = "/teams",
    operation_id = "list_teams",
    tag = "teams",
    params(PageParams),
    responses(
        (status = 200, description = "A page of teams, oldest first.", body = TeamList),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor \
            of this listing (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "The team API is off (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    _operator: Operator,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<TeamList>, ApiError> {
    let limit = params.limit()?;
    let after: Option<TeamId> = params.after(TEAMS_CURSOR)?;
    let rows = bounded(state.store.teams_page(after, limit + 1)).await?;
    let (teams, next_cursor) = paging::page(rows, limit, TEAMS_CURSOR, |t| t.id);
    Ok(Json(TeamList { teams, next_cursor }))
}

#[utoipa::path(
    get,
    path = "/teams/{team_id}",
    operation_id = "get_team",
    tag = "teams",
    params(("team_id" = Uuid, Path, description = "The team.")),
    responses(
        (status = 200, description = "The team and its usage this month (UTC).",
            body = TeamDetail),
        (status = 404, description = "No such team, or the team API is off (`not_found`).",
            body = ErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    _operator: Operator,
    Path(team_id): Path<String>,
) -> Result<Json<TeamDetail>, ApiError> {
    let id: TeamId = parse_id(&team_id, "team")?;
    let team = bounded(state.store.team(id))
        .await?
        .ok_or(ApiError::NotFound("team"))?;
    let month = usage_query(None, None, None, state.clock.now()).map_err(ApiError::Internal)?;
    // The totals only: no group is read.
    let usage = bounded(state.store.usage(id, month, None, 0)).await?;
    Ok(Json(TeamDetail {
        team,
        usage_this_month: usage.totals,
    }))
}

#[utoipa::path(
    patch,
    path = "/teams/{team_id}",
    operation_id = "update_team",
    tag = "teams",
    params(("team_id" = Uuid, Path, description = "The team.")),
    request_body = UpdateTeam,
    responses(
        (status = 200, description = "The team as changed. Once disabled, its keys and \
            tokens are refused on every replica within a second, its running and queued \
            turns have been told to stop, and its worker sessions are ended (the \
            runtime-manager stops their workers on its next pass).", body = TeamRow),
        (status = 400, description = "A bad name (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such team, or the team API is off (`not_found`).",
            body = ErrorBody),
        (status = 503, description = "A store is unavailable (`store_unavailable`): the \
            change may or may not be written; `GET` says which. A stop that could not be \
            delivered is `store_unavailable` too; repeating the request stops what is left.",
            body = ErrorBody),
    ),
)]
pub async fn update(
    State(state): State<AppState>,
    _operator: Operator,
    ClientAddr(address): ClientAddr,
    Path(team_id): Path<String>,
    JsonBody(body): JsonBody<UpdateTeam>,
) -> Result<Json<TeamRow>, ApiError> {
    let id: TeamId = parse_id(&team_id, "team")?;
    let name = body.name.as_deref().map(checked_name).transpose()?;
    let change = TeamChange {
        name,
        disabled: body.disabled,
    };
    if body.disabled == Some(false) {
        let now = bounded(state.store.team(id))
            .await?
            .ok_or(ApiError::NotFound("team"))?;
        if matches!(now.status, TeamStatus::Erasing | TeamStatus::Erased) {
            return Err(ApiError::Conflict(
                "the team is being erased or was; it cannot be enabled".into(),
            ));
        }
    }
    let by = Actor::operator(address);
    let team = bounded(state.store.update_team(id, &change, &by))
        .await?
        .ok_or(ApiError::NotFound("team"))?;
    match body.disabled {
        Some(true) => {
            state.auth.keys.disabled(id).await;
            erasure::stop_turns(&state, id, Within::Team).await?;
            let sessions = bounded(state.store.end_team_sessions(id)).await?;
            tracing::info!(team = %id, sessions, "team disabled by the operator");
        }
        Some(false) => state.auth.keys.enabled(id).await,
        None => {}
    }
    Ok(Json(team))
}

#[utoipa::path(
    delete,
    path = "/teams/{team_id}",
    operation_id = "erase_team",
    tag = "teams",
    params(("team_id" = Uuid, Path, description = "The team.")),
    responses(
        (status = 202, description = "The team is disabled (its keys and tokens refused on \
            every replica within a second, its turns stopped) and is being erased in the \
            background: `GET` shows `erasing`, then `erased`. Its usage records and this row \
            stay; nothing else of it does. Asking again is harmless.", body = TeamRow),
        (status = 404, description = "No such team, or the team API is off (`not_found`).",
            body = ErrorBody),
        (status = 503, description = "A store is unavailable (`store_unavailable`): the \
            erasure may or may not be under way; `GET` says which.", body = ErrorBody),
    ),
)]
pub async fn erase(
    State(state): State<AppState>,
    _operator: Operator,
    Path(team_id): Path<String>,
) -> Result<(StatusCode, Json<TeamRow>), ApiError> {
    let id: TeamId = parse_id(&team_id, "team")?;
    let begun = bounded(state.store.begin_team_erasure(id))
        .await?
        .ok_or(ApiError::NotFound("team"))?;
    if begun == TeamErasure::Begun {
        state.auth.keys.disabled(id).await;
        state.team_erasures.wake();
        tracing::info!(team = %id, "team erasure asked by the operator");
    }
    let team = bounded(state.store.team(id))
        .await?
        .ok_or(ApiError::NotFound("team"))?;
    Ok((StatusCode::ACCEPTED, Json(team)))
}
