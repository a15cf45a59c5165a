//! Knowledge bases (B3, B4): a team's documents, indexed in the background and searched.
//!
//! A document is uploaded to a base (Markdown, text, HTML, PDF, CSV, JSON; the format is
//! decided by the bytes, [`Format::of`]), its bytes kept in the artifact store under
//! `<team id>/<document id>` and its row written `queued`: the row is the indexing job.
//! Any replica's indexer (`index.rs`) claims it, extracts its text, cuts it into passages
//! by structure (`chunk.rs`) and writes them in the statement that makes it `ready`; a
//! file that cannot be read fails alone with its reason. Search is Postgres full-text
//! search over the passages (`search.rs`). docs/design/knowledge.md is the design.
//!
//! Each team's knowledge is bounded (`config::KnowledgeConfig`): bases, documents, bytes
//! and chunks, each refused with nothing stored.

mod chunk;
pub mod index;
pub mod search;

pub use chunk::{Chunked, OVERLAP_BYTES, TARGET_BYTES};

use bytes::Bytes;
use protocol::TeamId;
use uuid::Uuid;

use crate::Engine;
use crate::artifacts::{ArtifactError, garbage, storage_key};
use crate::files::{Sniffed, clean_filename, sniff};
use store::{
    Actor, DocumentInsert, DocumentLimits, DocumentRow, KnowledgeBaseRow, NewDocument, StoreError,
    bounded,
};

/// The longest base name, in bytes.
pub const MAX_NAME_BYTES: usize = 200;
/// The longest base description, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 2000;

/// Why a knowledge request was refused or failed; nothing was stored.
#[derive(Debug, thiserror::Error)]
pub enum KnowledgeError {
    /// No such base (or document) of the team.
    #[error("not found")]
    NotFound,
    /// The request is malformed; the message says how (never a document's content).
    #[error("{0}")]
    Invalid(String),
    #[error("a document may have at most {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the team's documents would pass their quota of {quota} bytes")]
    QuotaExceeded { quota: u64 },
    /// The team has as many of `what` (documents, knowledge bases) as it may.
    #[error("the team has {limit} {what}, as many as it may")]
    LimitReached { what: &'static str, limit: u32 },
    #[error(transparent)]
    Storage(#[from] ArtifactError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl KnowledgeError {
    /// The error's class for logs and metrics (never its message).
    pub fn class(&self) -> &'static str {
        match self {
            Self::Store(e) => e.metric_label(),
            Self::Storage(_) => "storage",
            Self::Invalid(_) => "invalid",
            Self::NotFound
            | Self::TooLarge { .. }
            | Self::QuotaExceeded { .. }
            | Self::LimitReached { .. } => "refused",
        }
    }

    fn of_store(err: StoreError) -> Self {
        match err {
            StoreError::NotFound => Self::NotFound,
            e => Self::Store(e),
        }
    }
}

/// What a document is, decided from its bytes (and, between the kinds of text, its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Markdown,
    Html,
    Pdf,
    Csv,
    Json,
    Text,
}

impl Format {
    /// The format of `bytes` named `filename`; `None` for what is not a document (an
    /// image, other binary data).
    pub fn of(bytes: &[u8], filename: &str) -> Option<Self> {
        let extension = filename
            .rsplit_once('.')
            .map(|(_, ext)| ext.to_ascii_lowercase())
            .unwrap_or_default();
        Some(match sniff(bytes, filename) {
            Sniffed::Pdf => Self::Pdf,
            Sniffed::Json => Self::Json,
            Sniffed::Csv => Self::Csv,
            Sniffed::Text if looks_like_html(bytes, &extension) => Self::Html,
            Sniffed::Text if matches!(extension.as_str(), "md" | "markdown" | "mdx") => {
                Self::Markdown
            }
            Sniffed::Text => Self::Text,
            _ => return None,
        })
    }

    /// The media type stored and shown.
    pub fn media_type(self) -> &'static str {
        match self {
            Self::Markdown => "text/markdown",
            Self::Html => "text/html",
            Self::Pdf => "application/pdf",
            Self::Csv => "text/csv",
            Self::Json => "application/json",
            Self::Text => "text/plain",
        }
    }

    /// The format a stored media type names.
    pub fn of_media_type(media_type: &str) -> Option<Self> {
        [
            Self::Markdown,
            Self::Html,
            Self::Pdf,
            Self::Csv,
            Self::Json,
            Self::Text,
        ]
        .into_iter()
        .find(|f| f.media_type() == media_type)
    }
}

fn looks_like_html(bytes: &[u8], extension: &str) -> bool {
    if matches!(extension, "html" | "htm" | "xhtml") {
        return true;
    }
    let start = &bytes[..bytes.len().min(512)];
    let start = String::from_utf8_lossy(start)
        .trim_start()
        .to_ascii_lowercase();
    start.starts_with("<!doctype html") || start.starts_with("<html")
}

/// A base's name and description, checked.
fn checked_base(name: Option<&str>, description: Option<&str>) -> Result<(), KnowledgeError> {
    if let Some(name) = name
        && (name.trim().is_empty() || name.len() > MAX_NAME_BYTES)
    {
        return Err(KnowledgeError::Invalid(format!(
            "name must have 1 to {MAX_NAME_BYTES} bytes"
        )));
    }
    if description.is_some_and(|d| d.len() > MAX_DESCRIPTION_BYTES) {
        return Err(KnowledgeError::Invalid(format!(
            "description must have at most {MAX_DESCRIPTION_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Creates a knowledge base of `team`, by `by` (the audit log's actor, L5).
pub async fn create_base(
    engine: &Engine,
    team: TeamId,
    name: &str,
    description: &str,
    by: &Actor,
) -> Result<KnowledgeBaseRow, KnowledgeError> {
    checked_base(Some(name), Some(description))?;
    let limit = engine.config.knowledge.max_bases;
    let created = bounded(engine.store.create_knowledge_base(
        team,
        name.trim(),
        description,
        i64::from(limit),
        by,
    ))
    .await?;
    let base = created.ok_or(KnowledgeError::LimitReached {
        what: "knowledge bases",
        limit,
    })?;
    tracing::info!(%team, base = %base.id, "knowledge base created");
    Ok(base)
}

/// Renames or redescribes base `id` (`None` keeps a field).
pub async fn update_base(
    engine: &Engine,
    team: TeamId,
    id: Uuid,
    name: Option<&str>,
    description: Option<&str>,
    by: &Actor,
) -> Result<KnowledgeBaseRow, KnowledgeError> {
    checked_base(name, description)?;
    bounded(
        engine
            .store
            .update_knowledge_base(team, id, name.map(str::trim), description, by),
    )
    .await
    .map_err(KnowledgeError::of_store)
}

/// Deletes base `id` with its documents, their passages and their bytes.
pub async fn delete_base(
    engine: &Engine,
    team: TeamId,
    id: Uuid,
    by: &Actor,
) -> Result<(), KnowledgeError> {
    let keys = bounded(engine.store.delete_knowledge_base(team, id, by))
        .await?
        .ok_or(KnowledgeError::NotFound)?;
    let documents = keys.len();
    garbage::delete_bytes(&engine.store, engine.artifacts.as_ref(), &keys).await;
    tracing::info!(%team, base = %id, documents, "knowledge base deleted");
    Ok(())
}

/// Stores `bytes`, named `filename`, as a document of base `base`, queued for indexing.
/// Refused before anything is stored: past the per-document bound, not a document; after
/// the bytes, a base that is not the team's or a team past its documents or bytes (the
/// bytes are removed again).
pub async fn add_document(
    engine: &Engine,
    team: TeamId,
    base: Uuid,
    filename: &str,
    bytes: Bytes,
    by: &Actor,
) -> Result<DocumentRow, KnowledgeError> {
    let limits = engine.config.knowledge;
    if bytes.len() > limits.max_file_bytes {
        return Err(KnowledgeError::TooLarge {
            limit: limits.max_file_bytes,
        });
    }
    let filename = clean_filename(filename);
    let format = Format::of(&bytes, &filename).ok_or_else(|| {
        KnowledgeError::Invalid(
            "a document must be Markdown, plain text, HTML, PDF, CSV or JSON".into(),
        )
    })?;
    let id = Uuid::now_v7();
    let key = storage_key(team, id);
    let media_type = format.media_type();
    engine
        .artifacts
        .put(&key, bytes.clone(), media_type)
        .await?;
    let row = NewDocument {
        id,
        base,
        filename: &filename,
        media_type,
        size_bytes: i64::try_from(bytes.len()).unwrap_or(i64::MAX),
        storage_key: &key,
    };
    let bounds = DocumentLimits {
        max_documents: i64::from(limits.max_documents),
        quota_bytes: i64::try_from(limits.quota_bytes).unwrap_or(i64::MAX),
    };
    let refused = match bounded(
        engine
            .store
            .insert_knowledge_document(team, &row, bounds, by),
    )
    .await
    {
        Ok(DocumentInsert::Inserted(row)) => {
            tracing::info!(%team, %base, document = %id, size = bytes.len(), media_type, "knowledge document queued");
            engine.knowledge_jobs.notify_one();
            return Ok(*row);
        }
        Ok(DocumentInsert::TooManyDocuments) => KnowledgeError::LimitReached {
            what: "documents",
            limit: limits.max_documents,
        },
        Ok(DocumentInsert::OverQuota) => KnowledgeError::QuotaExceeded {
            quota: limits.quota_bytes,
        },
        Err(e) => KnowledgeError::of_store(e),
    };
    if let Err(cleanup) = engine.artifacts.delete(&key).await {
        tracing::warn!(document = %id, class = cleanup.metric_label(), "could not remove a refused document's bytes");
    }
    Err(refused)
}

/// Deletes document `id` of base `base` with its passages and bytes: it is in no answer
/// from then on.
pub async fn delete_document(
    engine: &Engine,
    team: TeamId,
    base: Uuid,
    id: Uuid,
    by: &Actor,
) -> Result<(), KnowledgeError> {
    let key = bounded(engine.store.delete_knowledge_document(team, base, id, by))
        .await?
        .ok_or(KnowledgeError::NotFound)?;
    garbage::delete_bytes(&engine.store, engine.artifacts.as_ref(), &[key]).await;
    tracing::info!(%team, %base, document = %id, "knowledge document deleted");
    Ok(())
}
