//! `/v1/skills`: a team's Agent Skills (B8), an admin's to upload, list, read and delete.
//! A skill is uploaded as a `multipart/form-data` body with one field, `file`: a zip or a
//! tar.gz of one skill folder, read under `BRAIN_SKILL_MAX_ARCHIVE_BYTES`, checked and
//! stored by `engine::skills`; an upload of a name the team has is its next version.
//! docs/design/skills.md is the design.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use protocol::ErrorBody;
use serde::Serialize;
use uuid::Uuid;

use super::files::{UploadForm, read_form};
use super::paging::{self, PageParams};
use super::{ClientAddr, QueryParams};
use crate::AppState;
use crate::error::ApiError;
use engine::artifacts::garbage;
use engine::auth::Principal;
use store::{SkillFile, SkillRow, StoreError, bounded};

const SKILLS_CURSOR: &str = "sk1:";

/// A skill version.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Skill {
    /// This version's id.
    id: Uuid,
    name: String,
    /// 1 for the first upload of the name, one more for each later one.
    version: i32,
    description: String,
    /// Its files unpacked, in bytes.
    size_bytes: i64,
    created_at: DateTime<Utc>,
}

impl From<&SkillRow> for Skill {
    fn from(row: &SkillRow) -> Self {
        Self {
            id: row.id,
            name: row.name.clone(),
            version: row.version,
            description: row.description.clone(),
            size_bytes: row.size_bytes,
            created_at: row.created_at,
        }
    }
}

/// A skill's newest version with its `SKILL.md` and files, and the versions before it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SkillDetail {
    #[serde(flatten)]
    skill: Skill,
    /// `SKILL.md` as uploaded, front matter included.
    skill_md: String,
    files: Vec<SkillFile>,
    /// Every version, newest first (this one included).
    versions: Vec<Skill>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SkillList {
    /// The newest version of each skill, by name.
    skills: Vec<Skill>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

#[utoipa::path(
    post,
    path = "/skills",
    operation_id = "upload_skill",
    tag = "skills",
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 201, description = "Stored: the first version of its name, or the next.",
            body = Skill),
        (status = 400, description = "Not a multipart form with one `file` field \
            (`invalid_request`); not one Agent Skills folder: not a zip or tar.gz, no \
            `SKILL.md`, a bad `name` or `description`, too many files (`invalid_skill`); an \
            entry that is absolute, climbs with `..`, is a link or a special file \
            (`unsafe_skill_archive`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 413, description = "The archive, one file or all files past their bound \
            (`file_too_large`).", body = ErrorBody),
        (status = 429, description = "The team has `BRAIN_SKILLS_MAX` skills \
            (`skill_limit_reached`).", body = ErrorBody),
        (status = 503, description = "The object storage (`storage_unavailable`) or Postgres \
            (`store_unavailable`) is unavailable.", body = ErrorBody),
    ),
)]
pub async fn upload(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<Skill>), ApiError> {
    principal.require_admin()?;
    let config = state.config.skills;
    let (_, bytes) = read_form(&headers, body, config.max_archive_bytes).await?;
    let by = principal.actor(address);
    let row = engine::skills::upload(
        &state.store,
        state.artifacts.as_ref(),
        &config,
        principal.team,
        bytes,
        &by,
    )
    .await?;
    tracing::info!(team = %principal.team, skill = %row.id, version = row.version, "skill uploaded");
    Ok((StatusCode::CREATED, Json((&row).into())))
}

#[utoipa::path(
    get,
    path = "/skills",
    operation_id = "list_skills",
    tag = "skills",
    params(PageParams),
    responses(
        (status = 200, description = "A page of the team's skills by name, each its newest \
            version.", body = SkillList),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<SkillList>, ApiError> {
    principal.require_admin()?;
    let limit = params.limit()?;
    let after = params.after::<String>(SKILLS_CURSOR)?;
    let rows = bounded(
        state
            .store
            .skills(principal.team, after.as_deref(), limit + 1),
    )
    .await?;
    let (rows, next_cursor) = paging::page(rows, limit, SKILLS_CURSOR, |skill| skill.name.clone());
    Ok(Json(SkillList {
        skills: rows.iter().map(Into::into).collect(),
        next_cursor,
    }))
}

#[utoipa::path(
    get,
    path = "/skills/{skill_name}",
    operation_id = "get_skill",
    tag = "skills",
    params(("skill_name" = String, Path, description = "The skill's name.")),
    responses(
        (status = 200, description = "The newest version, its SKILL.md and files, and every \
            version.", body = SkillDetail),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such skill in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path(skill_name): Path<String>,
) -> Result<Json<SkillDetail>, ApiError> {
    principal.require_admin()?;
    let versions = bounded(state.store.skill_versions(principal.team, &skill_name)).await?;
    let newest = versions.first().ok_or(ApiError::NotFound("skill"))?;
    Ok(Json(SkillDetail {
        skill: newest.into(),
        skill_md: newest.skill_md.clone(),
        files: newest.files.clone(),
        versions: versions.iter().map(Into::into).collect(),
    }))
}

#[utoipa::path(
    delete,
    path = "/skills/{skill_name}",
    operation_id = "delete_skill",
    tag = "skills",
    params(("skill_name" = String, Path, description = "The skill's name.")),
    responses(
        (status = 204, description = "Every version deleted with its bytes; agents that \
            name it no longer see it."),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such skill in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(skill_name): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let by = principal.actor(address);
    let keys = match bounded(state.store.delete_skill(principal.team, &skill_name, &by)).await {
        Ok(keys) => keys,
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("skill")),
        Err(e) => return Err(e.into()),
    };
    // The rows are gone and their keys queued: the bytes now, or by the sweep.
    garbage::delete_bytes(&state.store, state.artifacts.as_ref(), &keys).await;
    tracing::info!(team = %principal.team, versions = keys.len(), "skill deleted");
    Ok(StatusCode::NO_CONTENT)
}
