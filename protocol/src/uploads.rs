//! A chat's files in the worker's workspace (T25): the words the brain and the worker use
//! to put every file attached to a chat under `uploads/` before a tool call runs.
//!
//! ```text
//! brain (the replica holding the channel), before a tools/call, for the files this
//! channel has not confirmed yet:
//!     ──UPLOADS_REQUEST {files: [{id, name, size}]}──► worker
//! worker, for each file whose uploads/<name> does not exist yet:
//!     GET UPLOAD_PATH_PREFIX<id> (session token) ─► a temporary file ─► rename to uploads/<name>
//! worker ──{placed, failed: [{id, reason}]}──► brain (the model is told what failed)
//! ```
//!
//! The brain names the files (unique within the chat, one path segment, [`valid_name`]);
//! the worker checks each name again and never writes outside `uploads/`.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Brain → worker, over the channel: place these files (a request; its answer is a
/// [`Placed`]). Sent only to a worker announcing [`UPLOADS_CAPABILITY`].
pub const UPLOADS_REQUEST: &str = "agent_runtime/uploads";
/// The experimental server capability of a worker that takes [`UPLOADS_REQUEST`].
pub const UPLOADS_CAPABILITY: &str = "agent_runtime/uploads";
/// The workspace directory the files go in.
pub const UPLOADS_DIR: &str = "uploads";
/// `GET` + a file's id: the bytes of a file of the session's chat, authenticated with the
/// session token.
pub const UPLOAD_PATH_PREFIX: &str = "/v1/worker/files/";
/// The same route as the brain's router spells it.
pub const UPLOAD_PATH: &str = "/v1/worker/files/{id}";
/// The most files one request names: a chat's oldest, the rest told as left out.
pub const MAX_UPLOADS: usize = 256;
/// The longest name, in bytes (a file name on common file systems).
pub const MAX_NAME_BYTES: usize = 255;

/// One file to place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upload {
    pub id: Uuid,
    /// Its name under `uploads/`: one path segment ([`valid_name`]).
    pub name: String,
    /// Its size in bytes: the download must be exactly this long.
    pub size: u64,
}

/// The params of [`UPLOADS_REQUEST`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadsRequest {
    pub files: Vec<Upload>,
}

/// The answer to [`UPLOADS_REQUEST`]: every file asked for is either placed (now, or
/// found there already) or failed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placed {
    pub placed: Vec<Uuid>,
    pub failed: Vec<Failed>,
}

/// A file that is not in the workspace, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failed {
    pub id: Uuid,
    pub reason: FailReason,
}

/// Why a file was not placed; the brain tells the model in these words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailReason {
    /// The name is not one path segment the worker may write.
    InvalidName,
    /// The brain could not be reached for the bytes.
    Unreachable,
    /// The brain refused the download (the file is gone, or not of the session's chat).
    Refused,
    /// The download was not the announced size.
    SizeMismatch,
    /// Writing it into the workspace failed (a full disk, a directory in the way).
    Io,
    /// The request's byte or time bound was spent before this file: it is tried again at
    /// the next call.
    Deferred,
}

impl FailReason {
    /// What the model reads.
    pub fn describe(self) -> &'static str {
        match self {
            Self::InvalidName => "its name cannot be written in the workspace",
            Self::Unreachable => "the download from the brain failed",
            Self::Refused => "the brain refused the download (the file is gone)",
            Self::SizeMismatch => "the download broke off",
            Self::Io => "writing it into the workspace failed",
            Self::Deferred => {
                "not placed yet: the bound on one delivery was reached; \
                               the next tool call places it"
            }
        }
    }
}

/// Whether `name` is one path segment a worker may create under [`UPLOADS_DIR`]: not
/// empty, not `.` or `..`, no separator, no NUL or other control character, at most
/// [`MAX_NAME_BYTES`].
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn names_are_one_segment() {
        for good in ["a.csv", "a-2.png", ".hidden", "é.txt", "a b"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", ".", "..", "../x", "a/b", "a\\b", "a\0b", "a\nb"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(!valid_name(&"x".repeat(MAX_NAME_BYTES + 1)));
        assert_eq!(UPLOAD_PATH.strip_suffix("{id}"), Some(UPLOAD_PATH_PREFIX));
    }

    #[test]
    fn the_wire_is_closed() {
        let req: Result<UploadsRequest, _> = serde_json::from_value(serde_json::json!(
            {"files": [], "extra": 1}
        ));
        assert!(req.is_err());
        let placed: Placed = serde_json::from_value(serde_json::json!({
            "placed": [], "failed": [{"id": Uuid::nil(), "reason": "deferred"}]
        }))
        .unwrap();
        assert_eq!(placed.failed[0].reason, FailReason::Deferred);
    }
}
