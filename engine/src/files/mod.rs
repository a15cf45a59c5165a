//! Files in chats (T21, T22): what a person attaches to a chat, uploaded
//! (`POST /v1/chats/{id}/files`) or inline in a message's `file` part as a `data:` URL.
//!
//! The bytes decide (`sniff.rs`): the stored media type is the one the content shows,
//! never the client's word, so text posing as a PNG is stored, served and shown to a model
//! as text. An image is decoded and encoded again before it is stored (`images.rs`): its
//! metadata (EXIF, GPS) stays behind and a large one is scaled down. Three bounds refuse
//! with nothing stored: one file, one message's files, the team's stored total
//! (`config::FilesConfig`).
//!
//! A file belongs to its chat: the bytes live in the artifact store under
//! `<team id>/<file id>`, the row in `chat_files`, and both go with the chat (erasure).
//! A message names a file by its download URL, [`url`]; [`read`] gives its bytes back.
//! A client is handed that URL signed (`urls.rs`, T26), which opens the file for a while
//! without the bearer key.
//! `workspace`: the chat's files under `uploads/` in its worker's workspace (T25).
//! `text`: a file's readable text, for a model that does not read its format and for
//! indexing (T27).

mod images;
mod sniff;
pub mod text;
mod urls;
pub mod workspace;

pub use sniff::{Sniffed, sniff};
pub use text::{ExtractError, ExtractedText, extract_text};
pub use urls::{FileUrls, UrlRefused};

use std::time::Duration;

use bytes::Bytes;
use protocol::parts::FilePart;
use protocol::{ChatId, TeamId};
use uuid::Uuid;

use crate::Engine;
use crate::artifacts::{ArtifactError, ArtifactStore, storage_key};
use crate::slots::UploadSlot;
use store::{ChatFileRow, FileInsert, NewChatFile, Store, StoreError, bounded};

/// Where the API serves a file, and how a message names it.
const URL_PREFIX: &str = "/v1/files/";
/// The longest file name kept, in bytes.
const MAX_FILENAME_BYTES: usize = 255;

/// Why a file was refused or could not be stored or read; nothing was stored.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("a file may have at most {limit} bytes")]
    TooLarge { limit: usize },
    #[error("a message's files may have at most {limit} bytes together")]
    MessageTooLarge { limit: usize },
    #[error("the team's files would pass their quota of {quota} bytes")]
    QuotaExceeded { quota: u64 },
    /// The replica, or the team on it, reads and stores as many uploads at once as allowed
    /// (T27); worth trying again after the duration.
    #[error("too many uploads at once; retry shortly")]
    Busy(Duration),
    /// The file or a file part is malformed; the message says how (never its content).
    #[error("{0}")]
    Invalid(&'static str),
    /// No such file of the team (or, for a message, of its chat).
    #[error("file not found")]
    NotFound,
    #[error(transparent)]
    Storage(#[from] ArtifactError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl FileError {
    /// A bounded label for logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::MessageTooLarge { .. } => "message_too_large",
            Self::QuotaExceeded { .. } => "quota_exceeded",
            Self::Busy(_) => "busy",
            Self::Invalid(_) => "invalid",
            Self::NotFound => "not_found",
            Self::Storage(e) => e.metric_label(),
            Self::Store(e) => e.metric_label(),
        }
    }
}

/// How soon a refused upload is worth trying again: about the time one takes.
const BUSY_RETRY_AFTER: Duration = Duration::from_secs(2);

/// A place among the replica's chat file uploads for `team` (T27), held while an upload's
/// bytes are read and stored; [`FileError::Busy`] when the replica or the team holds as
/// many as allowed.
pub fn upload_slot(engine: &Engine, team: TeamId) -> Result<UploadSlot, FileError> {
    engine
        .file_uploads
        .try_take(team)
        .ok_or(FileError::Busy(BUSY_RETRY_AFTER))
}

/// The URL a message and a client name file `id` by.
pub fn url(id: Uuid) -> String {
    format!("{URL_PREFIX}{id}")
}

/// The file a URL of [`url`]'s shape names, relative or with any origin before it, signed
/// or not (a client posts back the signed URL it was handed; the query is not read).
pub fn id_of_url(url: &str) -> Option<Uuid> {
    let path = match url.split_once("://") {
        Some((_, rest)) => &rest[rest.find('/')?..],
        None => url,
    };
    let path = path.split_once('?').map_or(path, |(path, _)| path);
    path.strip_prefix(URL_PREFIX)?.parse().ok()
}

/// A file's row and its bytes.
#[derive(Debug)]
pub struct FileBytes {
    pub row: ChatFileRow,
    pub bytes: Bytes,
}

/// File `id` of `team`, with its bytes: the media type in the row is the sniffed one.
/// Another team's file, or one whose bytes are gone, is [`FileError::NotFound`].
pub async fn read(
    store: &Store,
    artifacts: &dyn ArtifactStore,
    team: TeamId,
    id: Uuid,
) -> Result<FileBytes, FileError> {
    let row = match bounded(store.chat_file(team, id)).await {
        Ok(row) => row,
        Err(StoreError::NotFound) => return Err(FileError::NotFound),
        Err(e) => return Err(e.into()),
    };
    let bytes = match artifacts.get(&row.storage_key).await {
        Ok(body) => body.collect().await?,
        Err(ArtifactError::NotFound) => return Err(FileError::NotFound),
        Err(e) => return Err(e.into()),
    };
    Ok(FileBytes { row, bytes })
}

/// Stores `bytes` as a file of `chat`, named `filename` (sanitized; `file` when none is
/// left), and returns its row. Refused before anything is stored: more than the per-file
/// bound, an image that does not decode; after the bytes, a team past its quota (they
/// are removed again).
pub async fn save(
    engine: &Engine,
    team: TeamId,
    chat: ChatId,
    filename: &str,
    bytes: Bytes,
) -> Result<ChatFileRow, FileError> {
    let limits = engine.config.files;
    if bytes.len() > limits.max_file_bytes {
        return Err(FileError::TooLarge {
            limit: limits.max_file_bytes,
        });
    }
    let filename = clean_filename(filename);
    let (kind, bytes) = prepare(bytes, filename.clone(), limits.image_max_side).await?;
    let id = Uuid::now_v7();
    let key = storage_key(team, id);
    let media_type = kind.media_type();
    engine
        .artifacts
        .put(&key, bytes.clone(), media_type)
        .await?;
    let row = NewChatFile {
        id,
        chat,
        media_type,
        size_bytes: i64::try_from(bytes.len()).unwrap_or(i64::MAX),
        filename: &filename,
        storage_key: &key,
    };
    let quota = i64::try_from(limits.quota_bytes).unwrap_or(i64::MAX);
    let inserted = bounded(engine.store.insert_chat_file(team, &row, quota)).await;
    let refused = match inserted {
        Ok(FileInsert::Inserted(row)) => {
            tracing::info!(%team, %chat, file = %id, size = bytes.len(), media_type, "chat file stored");
            return Ok(row);
        }
        Ok(FileInsert::OverQuota) => FileError::QuotaExceeded {
            quota: limits.quota_bytes,
        },
        Err(StoreError::NotFound) => FileError::NotFound,
        Err(e) => e.into(),
    };
    if let Err(cleanup) = engine.artifacts.delete(&key).await {
        tracing::warn!(file = %id, class = cleanup.metric_label(), "could not remove a refused file's bytes");
    }
    Err(refused)
}

/// What the bytes are, and for an image the cleaned bytes, decoded off the runtime's
/// threads.
async fn prepare(
    bytes: Bytes,
    filename: String,
    max_side: u32,
) -> Result<(Sniffed, Bytes), FileError> {
    let kind = sniff(&bytes, &filename);
    if !kind.is_image() {
        return Ok((kind, bytes));
    }
    let cleaned = tokio::task::spawn_blocking(move || images::clean(&bytes, kind, max_side))
        .await
        .ok()
        .flatten()
        .ok_or(FileError::Invalid(
            "the file's bytes begin as an image but do not decode as one",
        ))?;
    Ok((kind, Bytes::from(cleaned)))
}

/// The last path segment of `name`, without control characters, cut to 255 bytes on a
/// character boundary; `file` when nothing is left.
pub(crate) fn clean_filename(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or("");
    let mut clean = String::with_capacity(base.len().min(MAX_FILENAME_BYTES));
    for c in base.trim().chars().filter(|c| !c.is_control()) {
        if clean.len() + c.len_utf8() > MAX_FILENAME_BYTES {
            break;
        }
        clean.push(c);
    }
    let clean = clean.trim();
    if clean.is_empty() || clean == "." || clean == ".." {
        "file".to_owned()
    } else {
        clean.to_owned()
    }
}

/// The `file` parts of a new message as they are stored: each `data:` URL decoded and
/// stored as a file of `chat`, each URL of a file uploaded before checked to be of
/// `chat`, every media type the sniffed one. Refused before anything is stored: a part
/// that is neither, a file past its bound, all of them past the message's bound; a later
/// failure removes what this message stored.
pub async fn attach(
    engine: &Engine,
    team: TeamId,
    chat: ChatId,
    parts: Vec<FilePart>,
) -> Result<Vec<FilePart>, FileError> {
    // New bytes are decoded and stored under an upload slot, as an upload's are.
    let _slot = parts
        .iter()
        .any(|part| part.url.starts_with("data:"))
        .then(|| upload_slot(engine, team))
        .transpose()?;
    let limits = engine.config.files;
    let mut resolved = Vec::with_capacity(parts.len());
    let mut total = 0usize;
    for part in parts {
        let source = match decode_data_url(&part.url)? {
            Some(bytes) => {
                if bytes.len() > limits.max_file_bytes {
                    return Err(FileError::TooLarge {
                        limit: limits.max_file_bytes,
                    });
                }
                total += bytes.len();
                Source::New(part.filename.unwrap_or_default(), bytes)
            }
            None => {
                let id = id_of_url(&part.url).ok_or(FileError::Invalid(
                    "a file part's url must be a data: URL or the url of a file uploaded to this chat",
                ))?;
                let row = match bounded(engine.store.chat_file(team, id)).await {
                    Ok(row) if row.chat_id == chat => row,
                    Ok(_) | Err(StoreError::NotFound) => return Err(FileError::NotFound),
                    Err(e) => return Err(e.into()),
                };
                total += usize::try_from(row.size_bytes).unwrap_or(usize::MAX);
                Source::Uploaded(row)
            }
        };
        resolved.push(source);
    }
    if total > limits.max_message_bytes {
        return Err(FileError::MessageTooLarge {
            limit: limits.max_message_bytes,
        });
    }
    store_new(engine, team, chat, resolved).await
}

/// A file part's file: bytes to store, or a file of the chat.
enum Source {
    New(String, Bytes),
    Uploaded(ChatFileRow),
}

async fn store_new(
    engine: &Engine,
    team: TeamId,
    chat: ChatId,
    sources: Vec<Source>,
) -> Result<Vec<FilePart>, FileError> {
    let mut parts = Vec::with_capacity(sources.len());
    let mut stored = Vec::new();
    for source in sources {
        let row = match source {
            Source::Uploaded(row) => row,
            Source::New(filename, bytes) => {
                match save(engine, team, chat, &filename, bytes).await {
                    Ok(row) => {
                        stored.push(row.id);
                        row
                    }
                    Err(e) => {
                        forget(engine, team, &stored).await;
                        return Err(e);
                    }
                }
            }
        };
        parts.push(FilePart {
            media_type: row.media_type,
            filename: Some(row.filename),
            url: url(row.id),
        });
    }
    Ok(parts)
}

/// Removes files this request stored before it failed (best effort: their rows, whose
/// deletion queues the bytes for the sweep, then the bytes).
async fn forget(engine: &Engine, team: TeamId, ids: &[Uuid]) {
    for id in ids {
        match bounded(engine.store.delete_chat_file(team, *id)).await {
            Ok(Some(key)) => {
                if engine.artifacts.delete(&key).await.is_ok() {
                    let _ = bounded(engine.store.forget_blob_garbage(&key)).await;
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(file = %id, class = e.metric_label(), "could not remove a file of a refused message")
            }
        }
    }
}

/// The bytes of a `data:` URL; `None` for any other URL. Only base64 data URLs are
/// taken, as browsers' `FileReader.readAsDataURL` (and the AI SDK) write them.
fn decode_data_url(url: &str) -> Result<Option<Bytes>, FileError> {
    use base64::Engine as _;
    let Some(rest) = url.strip_prefix("data:") else {
        return Ok(None);
    };
    let (header, data) = rest
        .split_once(',')
        .ok_or(FileError::Invalid("a data: URL has no comma"))?;
    if !header.ends_with(";base64") {
        return Err(FileError::Invalid("a data: URL must be base64"));
    }
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map(|bytes| Some(Bytes::from(bytes)))
        .map_err(|_| FileError::Invalid("a data: URL's base64 does not decode"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_files_with_or_without_an_origin() {
        let id = Uuid::now_v7();
        assert_eq!(id_of_url(&url(id)), Some(id));
        assert_eq!(
            id_of_url(&format!("https://brain.example{}", url(id))),
            Some(id)
        );
        assert_eq!(
            id_of_url(&format!("{}?exp=1&sig=x", url(id))),
            Some(id),
            "a signed URL"
        );
        for bad in [
            "/v1/files/",
            "/v1/artifacts/x",
            "https://x",
            "/v1/files/not-a-uuid",
        ] {
            assert_eq!(id_of_url(bad), None, "{bad}");
        }
    }

    #[test]
    fn data_urls() {
        assert_eq!(
            decode_data_url("data:text/plain;base64,aGk=")
                .unwrap()
                .unwrap(),
            Bytes::from_static(b"hi")
        );
        assert!(decode_data_url("/v1/files/x").unwrap().is_none());
        assert!(decode_data_url("data:text/plain,hi").is_err());
        assert!(decode_data_url("data:;base64,@@").is_err());
    }

    #[test]
    fn filenames_are_cleaned() {
        assert_eq!(clean_filename("../../etc/passwd"), "passwd");
        assert_eq!(clean_filename("a\r\nb.txt"), "ab.txt");
        assert_eq!(clean_filename(""), "file");
        assert_eq!(clean_filename(".."), "file");
        assert_eq!(clean_filename(&"é".repeat(200)).len(), 254);
    }
}
