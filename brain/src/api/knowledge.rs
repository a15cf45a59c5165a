//! `/v1/knowledge`: a team's knowledge bases, their documents and search (B3, B4).
//! Admins manage and read bases and documents and search any base of their team; any other
//! principal searches only a base an agent of the team names, since that agent's
//! `knowledge_search` tool answers it the same passages (`Principal::check_knowledge_search`).
//! A document is uploaded as a `multipart/form-data` body with one field, `file`, read
//! under `BRAIN_KNOWLEDGE_MAX_FILE_BYTES`, and answered `202`: it is indexed in the
//! background by any replica (`engine::knowledge`). docs/design/knowledge.md is the design.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use protocol::ErrorBody;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::files::{UploadForm, read_form};
use super::paging::{self, KeysetKey, PageParams};
use super::{ClientAddr, QueryParams, parse_id};
use crate::AppState;
use crate::error::{ApiError, JsonBody};
use engine::auth::Principal;
use engine::knowledge::{self, search};
use store::{DocumentRow, KnowledgeBaseRow, Passage, StoreError, bounded};

const BASES_CURSOR: &str = "kb1:";
const DOCUMENTS_CURSOR: &str = "kd1:";
/// Passages a search answers when it names no limit.
const DEFAULT_SEARCH_LIMIT: u32 = 5;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "Handbook", "description": "How we work"}))]
pub struct CreateKnowledgeBase {
    /// 1 to 200 bytes.
    name: String,
    /// At most 2000 bytes; empty when absent.
    #[serde(default)]
    description: String,
}

/// `PATCH /v1/knowledge/{id}`: an absent field is left as it is.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"description": "How we work, 2027 edition"}))]
pub struct PatchKnowledgeBase {
    name: Option<String>,
    description: Option<String>,
}

/// A knowledge base with what its documents count.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KnowledgeBase {
    id: Uuid,
    name: String,
    description: String,
    created_at: DateTime<Utc>,
    /// Documents uploaded, whatever their status.
    documents: i64,
    /// Documents indexed and searched.
    documents_ready: i64,
    /// Passages of the ready documents.
    chunks: i64,
    /// Bytes of the documents as uploaded.
    bytes: i64,
}

impl From<KnowledgeBaseRow> for KnowledgeBase {
    fn from(row: KnowledgeBaseRow) -> Self {
        Self {
            id: row.id,
            name: row.name,
            description: row.description,
            created_at: row.created_at,
            documents: row.documents,
            documents_ready: row.documents_ready,
            chunks: row.chunks,
            bytes: row.bytes,
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KnowledgeBaseList {
    knowledge_bases: Vec<KnowledgeBase>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// A document of a knowledge base and where its indexing is.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KnowledgeDocument {
    id: Uuid,
    knowledge_id: Uuid,
    filename: String,
    /// Decided from the bytes: `text/markdown`, `text/plain`, `text/html`,
    /// `application/pdf`, `text/csv` or `application/json`.
    media_type: String,
    size: i64,
    /// The document's first top-level heading, once indexed, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    title: Option<String>,
    /// `queued`, `indexing`, `ready` or `failed`.
    #[schema(example = "ready")]
    status: String,
    /// Why it failed (`failed` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// Its passages, once ready.
    chunks: i32,
    created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    indexed_at: Option<DateTime<Utc>>,
    /// The team's `embedding` route that embedded its passages (B6); absent when they
    /// were not embedded.
    #[serde(skip_serializing_if = "Option::is_none")]
    embedding_model: Option<String>,
    /// Why its passages were not embedded though the team names an embedding route: the
    /// document is searched by its words alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    embedding_error: Option<String>,
}

impl From<DocumentRow> for KnowledgeDocument {
    fn from(row: DocumentRow) -> Self {
        Self {
            id: row.id,
            knowledge_id: row.base_id,
            filename: row.filename,
            media_type: row.media_type,
            size: row.size_bytes,
            title: row.title,
            status: row.status.as_str().to_owned(),
            error: row.error,
            chunks: row.chunks,
            created_at: row.created_at,
            indexed_at: row.indexed_at,
            embedding_model: row.embedding_model,
            embedding_error: row.embedding_error,
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KnowledgeDocumentList {
    documents: Vec<KnowledgeDocument>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"query": "how do I reset my password", "limit": 5}))]
pub struct KnowledgeSearch {
    /// Words, `"a phrase"`, `-excluded` (web search syntax); 1 to 1000 bytes.
    query: String,
    /// 1 to 50; 5 when absent.
    #[serde(default)]
    limit: Option<u32>,
}

/// A passage of a document, as a search answers it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KnowledgePassage {
    document_id: Uuid,
    knowledge_id: Uuid,
    filename: String,
    /// The document's title, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    title: Option<String>,
    /// The passage's heading path (`Guide > Install`); empty outside any heading.
    heading: String,
    /// The passage's place in its document, from 0.
    position: i32,
    /// Relevance, higher is better: between 0 and 1 by words alone (`lexical`); a fused
    /// rank score, not comparable, when `hybrid`.
    score: f32,
    text: String,
}

impl From<Passage> for KnowledgePassage {
    fn from(p: Passage) -> Self {
        Self {
            document_id: p.document_id,
            knowledge_id: p.base_id,
            filename: p.filename,
            title: p.title,
            heading: p.heading,
            position: p.position,
            score: p.score,
            text: p.text,
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KnowledgeSearchResult {
    /// Best first.
    passages: Vec<KnowledgePassage>,
    /// `hybrid` (words and meaning, fused: the team names an `embedding` route) or
    /// `lexical` (words alone).
    #[schema(example = "hybrid")]
    mode: &'static str,
    /// Why a search the team meant to be hybrid answered by words alone (the query could
    /// not be embedded).
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

#[utoipa::path(
    post,
    path = "/knowledge",
    operation_id = "create_knowledge_base",
    tag = "knowledge",
    request_body = CreateKnowledgeBase,
    responses(
        (status = 201, description = "Created.", body = KnowledgeBase),
        (status = 400, description = "A bad field (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 429, description = "The team has `BRAIN_KNOWLEDGE_MAX_BASES` bases \
            (`knowledge_limit_reached`).", body = ErrorBody),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    JsonBody(body): JsonBody<CreateKnowledgeBase>,
) -> Result<(StatusCode, Json<KnowledgeBase>), ApiError> {
    principal.require_admin()?;
    let by = principal.actor(address);
    let base =
        knowledge::create_base(&state, principal.team, &body.name, &body.description, &by).await?;
    Ok((StatusCode::CREATED, Json(base.into())))
}

#[utoipa::path(
    get,
    path = "/knowledge",
    operation_id = "list_knowledge_bases",
    tag = "knowledge",
    params(PageParams),
    responses(
        (status = 200, description = "A page of the team's bases, oldest first.",
            body = KnowledgeBaseList),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<KnowledgeBaseList>, ApiError> {
    principal.require_admin()?;
    let limit = params.limit()?;
    let after = params.after::<KeysetKey>(BASES_CURSOR)?.map(|k| k.0);
    let rows = bounded(
        state
            .store
            .knowledge_bases(principal.team, after, limit + 1),
    )
    .await?;
    let (rows, next_cursor) = paging::page(rows, limit, BASES_CURSOR, |b| {
        KeysetKey::of(b.created_at, b.id)
    });
    Ok(Json(KnowledgeBaseList {
        knowledge_bases: rows.into_iter().map(Into::into).collect(),
        next_cursor,
    }))
}

#[utoipa::path(
    get,
    path = "/knowledge/{knowledge_id}",
    operation_id = "get_knowledge_base",
    tag = "knowledge",
    params(("knowledge_id" = Uuid, Path, description = "The knowledge base.")),
    responses(
        (status = 200, description = "The base with its counts.", body = KnowledgeBase),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such base in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path(knowledge_id): Path<String>,
) -> Result<Json<KnowledgeBase>, ApiError> {
    principal.require_admin()?;
    let id: Uuid = parse_id(&knowledge_id, "knowledge base")?;
    match bounded(state.store.knowledge_base(principal.team, id)).await {
        Ok(base) => Ok(Json(base.into())),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("knowledge base")),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(
    patch,
    path = "/knowledge/{knowledge_id}",
    operation_id = "update_knowledge_base",
    tag = "knowledge",
    params(("knowledge_id" = Uuid, Path, description = "The knowledge base.")),
    request_body = PatchKnowledgeBase,
    responses(
        (status = 200, description = "The base as changed.", body = KnowledgeBase),
        (status = 400, description = "A bad field (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such base in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn update(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(knowledge_id): Path<String>,
    JsonBody(body): JsonBody<PatchKnowledgeBase>,
) -> Result<Json<KnowledgeBase>, ApiError> {
    principal.require_admin()?;
    let id: Uuid = parse_id(&knowledge_id, "knowledge base")?;
    let base = knowledge::update_base(
        &state,
        principal.team,
        id,
        body.name.as_deref(),
        body.description.as_deref(),
        &principal.actor(address),
    )
    .await?;
    Ok(Json(base.into()))
}

#[utoipa::path(
    delete,
    path = "/knowledge/{knowledge_id}",
    operation_id = "delete_knowledge_base",
    tag = "knowledge",
    params(("knowledge_id" = Uuid, Path, description = "The knowledge base.")),
    responses(
        (status = 204, description = "Deleted with its documents, their passages and bytes."),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such base in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(knowledge_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let id: Uuid = parse_id(&knowledge_id, "knowledge base")?;
    knowledge::delete_base(&state, principal.team, id, &principal.actor(address)).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/knowledge/{knowledge_id}/documents",
    operation_id = "upload_knowledge_document",
    tag = "knowledge",
    params(("knowledge_id" = Uuid, Path, description = "The knowledge base.")),
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 202, description = "Stored and queued for indexing; follow its `status` at \
            `GET /v1/knowledge/{knowledge_id}/documents/{document_id}`.", body = KnowledgeDocument),
        (status = 400, description = "Not a multipart form with exactly one `file` field, or \
            not a document: Markdown, text, HTML, PDF, CSV or JSON (`invalid_request`).",
            body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such base in the team (`not_found`).", body = ErrorBody),
        (status = 413, description = "The file is larger than \
            `BRAIN_KNOWLEDGE_MAX_FILE_BYTES` (`file_too_large`), or the team's documents \
            would pass `BRAIN_KNOWLEDGE_QUOTA_BYTES` (`knowledge_quota_exceeded`).",
            body = ErrorBody),
        (status = 429, description = "The team has `BRAIN_KNOWLEDGE_MAX_DOCUMENTS` documents \
            (`knowledge_limit_reached`).", body = ErrorBody),
        (status = 503, description = "The object storage (`storage_unavailable`) or Postgres \
            (`store_unavailable`) is unavailable.", body = ErrorBody),
    ),
)]
pub async fn upload(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(knowledge_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<KnowledgeDocument>), ApiError> {
    principal.require_admin()?;
    let base: Uuid = parse_id(&knowledge_id, "knowledge base")?;
    // Before the body is read: an unknown base is `404` whatever the body.
    match bounded(state.store.knowledge_base(principal.team, base)).await {
        Ok(_) => {}
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("knowledge base")),
        Err(e) => return Err(e.into()),
    }
    let max = state.config.knowledge.max_file_bytes;
    let (filename, bytes) = read_form(&headers, body, max).await?;
    let by = principal.actor(address);
    let row = knowledge::add_document(&state, principal.team, base, &filename, bytes, &by).await?;
    Ok((StatusCode::ACCEPTED, Json(row.into())))
}

#[utoipa::path(
    get,
    path = "/knowledge/{knowledge_id}/documents",
    operation_id = "list_knowledge_documents",
    tag = "knowledge",
    params(("knowledge_id" = Uuid, Path, description = "The knowledge base."), PageParams),
    responses(
        (status = 200, description = "A page of the base's documents, oldest first.",
            body = KnowledgeDocumentList),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such base in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn documents(
    State(state): State<AppState>,
    principal: Principal,
    Path(knowledge_id): Path<String>,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<KnowledgeDocumentList>, ApiError> {
    principal.require_admin()?;
    let base: Uuid = parse_id(&knowledge_id, "knowledge base")?;
    let limit = params.limit()?;
    let after = params.after::<KeysetKey>(DOCUMENTS_CURSOR)?.map(|k| k.0);
    match bounded(state.store.knowledge_base(principal.team, base)).await {
        Ok(_) => {}
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("knowledge base")),
        Err(e) => return Err(e.into()),
    }
    let rows = bounded(
        state
            .store
            .knowledge_documents(principal.team, base, after, limit + 1),
    )
    .await?;
    let (rows, next_cursor) = paging::page(rows, limit, DOCUMENTS_CURSOR, |d| {
        KeysetKey::of(d.created_at, d.id)
    });
    Ok(Json(KnowledgeDocumentList {
        documents: rows.into_iter().map(Into::into).collect(),
        next_cursor,
    }))
}

#[utoipa::path(
    get,
    path = "/knowledge/{knowledge_id}/documents/{document_id}",
    operation_id = "get_knowledge_document",
    tag = "knowledge",
    params(
        ("knowledge_id" = Uuid, Path, description = "The knowledge base."),
        ("document_id" = Uuid, Path, description = "The document."),
    ),
    responses(
        (status = 200, description = "The document and where its indexing is.", body = KnowledgeDocument),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such document in the base (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn document(
    State(state): State<AppState>,
    principal: Principal,
    Path((knowledge_id, document_id)): Path<(String, String)>,
) -> Result<Json<KnowledgeDocument>, ApiError> {
    principal.require_admin()?;
    let base: Uuid = parse_id(&knowledge_id, "knowledge base")?;
    let id: Uuid = parse_id(&document_id, "document")?;
    match bounded(state.store.knowledge_document(principal.team, base, id)).await {
        Ok(row) => Ok(Json(row.into())),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("document")),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(
    delete,
    path = "/knowledge/{knowledge_id}/documents/{document_id}",
    operation_id = "delete_knowledge_document",
    tag = "knowledge",
    params(
        ("knowledge_id" = Uuid, Path, description = "The knowledge base."),
        ("document_id" = Uuid, Path, description = "The document."),
    ),
    responses(
        (status = 204, description = "Deleted with its passages and bytes: in no answer from \
            now on."),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such document in the base (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn delete_document(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path((knowledge_id, document_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let base: Uuid = parse_id(&knowledge_id, "knowledge base")?;
    let id: Uuid = parse_id(&document_id, "document")?;
    let by = principal.actor(address);
    knowledge::delete_document(&state, principal.team, base, id, &by).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/knowledge/{knowledge_id}/search",
    operation_id = "search_knowledge",
    tag = "knowledge",
    params(("knowledge_id" = Uuid, Path, description = "The knowledge base.")),
    request_body = KnowledgeSearch,
    responses(
        (status = 200, description = "The passages that best match, best first (Postgres \
            full-text search: any of the words matches; more of them, closer together and \
            in a heading rank higher; fused with the nearest passages by meaning where the \
            team names an `embedding` route).", body = KnowledgeSearchResult),
        (status = 400, description = "A bad query or limit (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin and no agent of the team \
            names the base in its `knowledge_bases` (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such base in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn search(
    State(state): State<AppState>,
    principal: Principal,
    Path(knowledge_id): Path<String>,
    JsonBody(body): JsonBody<KnowledgeSearch>,
) -> Result<Json<KnowledgeSearchResult>, ApiError> {
    let base: Uuid = parse_id(&knowledge_id, "knowledge base")?;
    match bounded(state.store.knowledge_base(principal.team, base)).await {
        Ok(_) => {}
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("knowledge base")),
        Err(e) => return Err(e.into()),
    }
    principal.check_knowledge_search(&state.store, base).await?;
    let limit = body.limit.unwrap_or(DEFAULT_SEARCH_LIMIT);
    let found = search::search(&state, principal.team, None, &[base], &body.query, limit).await?;
    Ok(Json(KnowledgeSearchResult {
        passages: found.passages.into_iter().map(Into::into).collect(),
        mode: found.mode.as_str(),
        note: found.note,
    }))
}
