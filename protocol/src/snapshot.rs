//! Workspace snapshots (SPEC W10): the words the runtime-manager, the brain and the worker
//! use to save a workspace at an idle teardown and bring it back in the next session of
//! the same (agent, chat).
//!
//! ```text
//! manager: ready ─IdleCheck─► terminating, snapshot_state = requested ──NOTIFY──► brain
//! brain (the replica holding the channel) ──SNAPSHOT_NOTIFICATION──► worker
//! worker: tar + zstd of the workspace ──PUT SNAPSHOT_PATH (session token)──► brain ─► store
//!         (or POST SNAPSHOT_SKIPPED_PATH: over the cap, or packing failed)
//! manager: snapshot_state no longer requested (or its deadline passed) ─► stop the worker
//! next session's worker: GET SNAPSHOT_PATH (session token) ─► unpack ─► dial ─► ready
//! (a pooled worker bound to the next session: bind ─► RESTORE_REQUEST ─► GET ─► unpack)
//! ```

use serde::{Deserialize, Serialize};

use crate::SessionId;

/// Whether an archive entry's `path` may be written beneath the folder it unpacks into: a
/// relative path of plain names (`.` allowed), no root, no prefix, no `..`. The one rule
/// of the snapshot unpacker and of a skill's archive (B8).
pub fn plain_path(path: &std::path::Path) -> bool {
    use std::path::Component;
    path.components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// Brain → worker, over the channel: pack the workspace and upload it.
pub const SNAPSHOT_NOTIFICATION: &str = "notifications/agent_runtime/snapshot";
/// Brain → a pooled worker just bound to a session whose chat has a snapshot (R3): restore
/// it now (a request; its answer is a [`Restored`]). A session's own worker restores
/// before its first dial instead.
pub const RESTORE_REQUEST: &str = "agent_runtime/restore";
/// `PUT`: the worker uploads its packed workspace (body `application/zstd`, a zstd-compressed
/// tar stream). `GET`: the worker of a new session downloads the snapshot of its chat
/// (`204` when there is none). Both authenticated with the session token.
pub const SNAPSHOT_PATH: &str = "/v1/worker/snapshot";
/// `POST` with a [`SnapshotSkipped`] body: the worker will not upload a snapshot.
pub const SNAPSHOT_SKIPPED_PATH: &str = "/v1/worker/snapshot/skipped";
/// On the upload and the download: the size of the tar stream inside the zstd frame, the
/// bound the restoring worker enforces while it unpacks.
pub const UNPACKED_BYTES_HEADER: &str = "x-snapshot-unpacked-bytes";
/// The Postgres `NOTIFY` channel on which the runtime-manager asks for a snapshot; its
/// payload is a JSON [`SnapshotNotice`].
pub const SNAPSHOT_PG_CHANNEL: &str = "agent_runtime_snapshot";

/// The payload of [`SNAPSHOT_PG_CHANNEL`] (written by the manager's SQL).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotNotice {
    pub session: SessionId,
    pub max_bytes: u64,
}

/// The params of [`SNAPSHOT_NOTIFICATION`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRequest {
    /// The most the workspace may hold, as a tar stream, for a snapshot to be taken.
    pub max_bytes: u64,
}

/// The answer to [`RESTORE_REQUEST`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Restored {
    /// The workspace entries restored: 0 when the chat had no snapshot after all.
    pub entries: u64,
}

/// Why a worker sends no snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// The workspace is larger than the profile's `snapshotMaxBytes`.
    OverCap,
    /// Reading the workspace or uploading it failed.
    Failed,
}

/// The body of [`SNAPSHOT_SKIPPED_PATH`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"reason": "over_cap"})))]
pub struct SnapshotSkipped {
    pub reason: SkipReason,
}

/// `agent_runtime_sessions.snapshot_state`: where the snapshot of a session torn down for
/// idleness stands. `NULL` on every other session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SnapshotState {
    /// Asked for; the manager waits for the outcome before it stops the worker.
    Requested,
    /// Uploaded and recorded: the chat's snapshot.
    Stored,
    /// The workspace was over the cap: no snapshot, and the chat's previous one dropped.
    OverCap,
    /// The worker could not pack or upload it: the chat's previous snapshot is kept.
    Failed,
    /// No outcome within the manager's bound (no replica held the channel, or the upload
    /// was too slow): the previous snapshot is kept.
    TimedOut,
}

impl SnapshotState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requested => "requested",
            Self::Stored => "stored",
            Self::OverCap => "over_cap",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Requested,
            Self::Stored,
            Self::OverCap,
            Self::Failed,
            Self::TimedOut,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }
}

impl From<SkipReason> for SnapshotState {
    fn from(reason: SkipReason) -> Self {
        match reason {
            SkipReason::OverCap => Self::OverCap,
            SkipReason::Failed => Self::Failed,
        }
    }
}
