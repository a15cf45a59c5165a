//! The artifact store: files that agents produce (worker uploads, browser screenshots) and
//! that clients download (SPEC "object storage", W8).
//!
//! Bytes and metadata live apart. The bytes go to an [`ArtifactStore`] backend under a
//! generated key; the metadata (name, type, size, SHA-256, owner) is a row in Postgres
//! (`store/artifacts.rs`). [`save_artifact`] writes the bytes first and the row second, so
//! a row always points at complete bytes; a failed row write removes the bytes again.
//!
//! Two real backends sit behind the trait (STYLE 6):
//! - [`LocalDirStore`] (`local.rs`): a directory, the embedded default for a laptop;
//! - [`S3Store`] (`s3.rs`): an S3 bucket on AWS or an S3-compatible server.
//!
//! Keys are always `<team id>/<artifact id>`, built here from generated ids; a name a user
//! or a model chose never becomes part of a path or an object key.

pub mod garbage;
mod local;
mod s3;

pub use local::LocalDirStore;
pub use s3::S3Store;

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::Stream;
use futures_util::future::BoxFuture;
use protocol::{AgentId, ChatId, TeamId, TurnId};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::config::{ArtifactBackend, ArtifactsConfig};
use store::{ArtifactRow, NewArtifact, Store, StoreError};

/// How a backend failed. Messages carry classes and status codes only: never a
/// credential, and never the stored bytes.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// No object under this key.
    #[error("artifact object not found")]
    NotFound,
    /// The backend refused the brain's credentials or signature (S3 403: a wrong secret
    /// key, an unknown key id, a policy that denies access).
    #[error("object storage refused the credentials ({0})")]
    Denied(String),
    /// The backend answered with an error that is neither of the above (a missing bucket,
    /// a 5xx); the string is the S3 error code or the status.
    #[error("object storage answered {0}")]
    Rejected(String),
    /// The backend could not be reached, timed out, or broke a transfer.
    #[error("object storage unreachable: {0}")]
    Unavailable(&'static str),
    /// A local file operation failed.
    #[error("local artifact directory: {0}")]
    Io(#[from] std::io::Error),
    /// A key not built by this module (a programming error, refused before any I/O).
    #[error("malformed storage key")]
    InvalidKey,
    /// The bytes being stored stopped coming (the sender's body broke off, passed its
    /// limit or its deadline); nothing was stored.
    #[error("the bytes to store broke off: {0}")]
    Source(&'static str),
}

impl ArtifactError {
    /// A bounded label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::Denied(_) => "denied",
            Self::Rejected(_) => "rejected",
            Self::Unavailable(_) => "unavailable",
            Self::Io(_) => "io",
            Self::InvalidKey => "invalid_key",
            Self::Source(_) => "source",
        }
    }
}

/// Bytes arriving or leaving piece by piece.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, ArtifactError>> + Send>>;

/// The bytes of one stored object, as a stream (a download never holds a whole artifact
/// in memory).
pub struct ArtifactBody {
    /// The object's size as the backend reports it.
    pub size: u64,
    pub stream: ByteStream,
}

impl ArtifactBody {
    /// Reads the whole stream (for tests and small objects).
    pub async fn collect(mut self) -> Result<Bytes, ArtifactError> {
        use futures_util::StreamExt;
        let mut all = Vec::with_capacity(usize::try_from(self.size).unwrap_or(0));
        while let Some(piece) = self.stream.next().await {
            all.extend_from_slice(&piece?);
        }
        Ok(Bytes::from(all))
    }
}

/// A place to keep artifact bytes under keys. Implementations must make a write atomic to
/// readers: a `get` sees the whole object or none of it.
pub trait ArtifactStore: Send + Sync {
    /// Stores what `body` yields under `key`, replacing any object there, and returns the
    /// bytes stored. The body is never held whole: a backend keeps at most one part in
    /// memory (S3, [`S3Store`]) or writes each piece to a temporary file (local). A body
    /// that fails ends the write with its error and leaves nothing new under the key.
    fn put_stream<'a>(
        &'a self,
        key: &'a str,
        body: ByteStream,
        content_type: &'a str,
    ) -> BoxFuture<'a, Result<u64, ArtifactError>>;

    /// Stores `bytes` under `key`, replacing any object there.
    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        content_type: &'a str,
    ) -> BoxFuture<'a, Result<(), ArtifactError>> {
        let body = Box::pin(futures_util::stream::once(std::future::ready(Ok(bytes))));
        Box::pin(async move { self.put_stream(key, body, content_type).await.map(drop) })
    }

    /// Opens the object under `key`; [`ArtifactError::NotFound`] when there is none.
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ArtifactBody, ArtifactError>>;

    /// Removes the object under `key`. Removing a missing object succeeds.
    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), ArtifactError>>;

    /// The backend's name for logs (`local`, `s3`).
    fn kind(&self) -> &'static str;
}

/// Builds the configured backend. Nothing is contacted here: a local directory is created
/// on the first `put`, and an S3 bucket is first used on the first request.
pub fn artifact_store_from(config: &ArtifactsConfig) -> Arc<dyn ArtifactStore> {
    match &config.backend {
        ArtifactBackend::Local { dir } => Arc::new(LocalDirStore::new(dir.clone())),
        ArtifactBackend::S3(s3) => Arc::new(S3Store::new(s3)),
    }
}

/// Who an artifact belongs to and where it came from.
#[derive(Clone, Copy, Debug)]
pub struct ArtifactOwner {
    pub team: TeamId,
    pub agent: AgentId,
    /// The chat it was produced in, if any.
    pub chat: Option<ChatId>,
    /// The turn it was produced in, if any.
    pub turn: Option<TurnId>,
}

/// Why [`save_artifact`] refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// More bytes than `BRAIN_ARTIFACT_MAX_BYTES`; nothing was written.
    #[error("artifact is larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// The name or content type breaks the rules below; nothing was written.
    #[error("{0}")]
    Invalid(&'static str),
    /// The backend failed; no row was written.
    #[error(transparent)]
    Storage(#[from] ArtifactError),
    /// The row could not be written (the bytes were removed again, best effort). A
    /// `NotFound` means the agent, chat or turn is not the team's.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SaveError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::Invalid(_) => "invalid",
            Self::Storage(e) => e.metric_label(),
            Self::Store(e) => e.metric_label(),
        }
    }
}

/// The longest artifact name, in bytes.
pub const MAX_NAME_BYTES: usize = 255;
/// The longest content type, in bytes.
pub const MAX_CONTENT_TYPE_BYTES: usize = 255;

/// Stores `bytes` as a new artifact of `owner` and returns its row. The bytes are written
/// first (under a generated key), then the metadata row; if the row cannot be written the
/// bytes are deleted again. Refused before any write: more than `max_bytes` bytes, a name
/// that is empty, longer than 255 bytes or holds control characters, a content type that
/// is not `type/subtype[; parameters]` in printable ASCII.
pub async fn save_artifact(
    store: &Store,
    backend: &dyn ArtifactStore,
    max_bytes: usize,
    owner: ArtifactOwner,
    name: &str,
    content_type: &str,
    bytes: Bytes,
) -> Result<ArtifactRow, SaveError> {
    if bytes.len() > max_bytes {
        return Err(SaveError::TooLarge { limit: max_bytes });
    }
    let name = name.trim();
    if name.is_empty() || name.len() > MAX_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(SaveError::Invalid(
            "artifact name must be 1-255 bytes without control characters",
        ));
    }
    let content_type = content_type.trim();
    if !valid_content_type(content_type) {
        return Err(SaveError::Invalid(
            "content type must look like type/subtype, in at most 255 printable ASCII bytes",
        ));
    }
    let id = Uuid::now_v7();
    let key = storage_key(owner.team, id);
    let sha256 = hex(&Sha256::digest(&bytes));
    let size = bytes.len();
    backend.put(&key, bytes, content_type).await?;
    let row = NewArtifact {
        id,
        agent: owner.agent,
        chat: owner.chat,
        turn: owner.turn,
        name,
        content_type,
        size_bytes: i64::try_from(size).unwrap_or(i64::MAX),
        sha256: &sha256,
        storage_key: &key,
    };
    match store.insert_artifact(owner.team, &row).await {
        Ok(row) => {
            tracing::info!(
                team = %owner.team,
                artifact = %id,
                size,
                backend = backend.kind(),
                "artifact saved"
            );
            Ok(row)
        }
        Err(e) => {
            if let Err(cleanup) = backend.delete(&key).await {
                tracing::warn!(
                    artifact = %id,
                    class = cleanup.metric_label(),
                    "could not remove the bytes of an artifact whose row failed"
                );
            }
            Err(e.into())
        }
    }
}

/// `<team id>/<artifact id>`: generated ids only, so a key is always a safe relative path.
pub fn storage_key(team: TeamId, id: Uuid) -> String {
    format!("{}/{}", team.0, id)
}

/// Whether `key` has the shape [`storage_key`] builds: segments of hex digits and dashes.
/// Backends check it before any I/O, so a stored key can never name a path outside the
/// store.
pub(crate) fn valid_key(key: &str) -> bool {
    let mut segments = 0;
    for segment in key.split('/') {
        segments += 1;
        if segment.is_empty()
            || segment.len() > 64
            || !segment.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        {
            return false;
        }
    }
    (1..=4).contains(&segments)
}

fn valid_content_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or("").trim();
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    value.len() <= MAX_CONTENT_TYPE_BYTES
        && value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && essence
            .split_once('/')
            .is_some_and(|(kind, sub)| token(kind) && token(sub))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_generated_ids_only() {
        let team = TeamId(Uuid::now_v7());
        let key = storage_key(team, Uuid::now_v7());
        assert!(valid_key(&key), "{key}");
        for bad in [
            "",
            "/abs",
            "a/../b",
            "..",
            "a//b",
            "a/b/",
            "report.pdf",
            "a\\b",
            "a/b/c/d/e",
        ] {
            assert!(!valid_key(bad), "{bad}");
        }
    }

    #[test]
    fn content_types() {
        for ok in [
            "image/png",
            "text/plain; charset=utf-8",
            "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        ] {
            assert!(valid_content_type(ok), "{ok}");
        }
        for bad in [
            "",
            "png",
            "/png",
            "image/",
            "text/plain\r\nX-Evil: 1",
            "tëxt/plain",
        ] {
            assert!(!valid_content_type(bad), "{bad}");
        }
    }

    #[test]
    fn sha256_hex() {
        assert_eq!(
            hex(&Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
