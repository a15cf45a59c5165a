//! The chat's files into the workspace (T25): the brain names them in
//! `agent_runtime/uploads` before a tool call; each one not yet at `uploads/<name>` is
//! downloaded from the brain with the session token (`GET /v1/worker/files/{id}`) into a
//! temporary file beside it, then renamed into place, so a name is either the whole file or
//! absent.
//!
//! A file already at its name is kept as it is: one the model changed stays changed, and a
//! workspace restored from a snapshot keeps the copies it brought. Names are checked again
//! here (one path segment, `protocol::uploads::valid_name`), and `uploads/` must resolve
//! inside the workspace (a symlink the model made cannot send a file elsewhere).
//!
//! One request moves at most [`MAX_DELIVERY_BYTES`] within [`DELIVERY_BOUND`]; the files
//! past either are answered `deferred` and come with the brain's next call.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use protocol::uploads::{
    FailReason, Failed, Placed, UPLOAD_PATH_PREFIX, UPLOADS_DIR, Upload, UploadsRequest, valid_name,
};
use tokio::io::AsyncWriteExt;

use super::paths;
use crate::dial::Identity;
use crate::snapshot::{brain_url, client};

/// The most bytes one request downloads; a single larger file is still taken alone.
pub const MAX_DELIVERY_BYTES: u64 = 256 << 20;
/// How long one request may download; within the brain's bound on its answer.
pub const DELIVERY_BOUND: Duration = Duration::from_secs(120);

/// Places each file of `request` in `workspace` (canonical), downloading from the brain
/// beside `connect_url`.
pub async fn place(
    connect_url: &str,
    identity: &Identity,
    workspace: &Path,
    request: UploadsRequest,
) -> Placed {
    let started = Instant::now();
    let mut answer = Placed::default();
    let dir = match workspace_dir(workspace, UPLOADS_DIR).await {
        Ok(dir) => dir,
        Err(reason) => {
            answer.failed = request
                .files
                .iter()
                .map(|file| Failed {
                    id: file.id,
                    reason,
                })
                .collect();
            return answer;
        }
    };
    let mut moved = 0u64;
    for file in request.files {
        let outcome = if !valid_name(&file.name) {
            Err(FailReason::InvalidName)
        } else if tokio::fs::symlink_metadata(dir.join(&file.name))
            .await
            .is_ok()
        {
            Ok(())
        } else if moved > 0
            && (moved + file.size > MAX_DELIVERY_BYTES || started.elapsed() >= DELIVERY_BOUND)
        {
            Err(FailReason::Deferred)
        } else {
            moved += file.size;
            let deadline = DELIVERY_BOUND.saturating_sub(started.elapsed());
            match tokio::time::timeout(deadline, fetch(connect_url, identity, &dir, &file)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(FailReason::Deferred),
            }
        };
        match outcome {
            Ok(()) => answer.placed.push(file.id),
            Err(reason) => answer.failed.push(Failed {
                id: file.id,
                reason,
            }),
        }
    }
    tracing::info!(
        session = %identity.session,
        placed = answer.placed.len(),
        failed = answer.failed.len(),
        bytes = moved,
        ms = started.elapsed().as_millis() as u64,
        "chat files placed"
    );
    answer
}

/// Folder `name` (`uploads/`, `skills/`) in `workspace`, created if need be, resolved
/// inside the workspace.
pub(super) async fn workspace_dir(workspace: &Path, name: &str) -> Result<PathBuf, FailReason> {
    let resolved = paths::resolve(workspace, name).map_err(|_| FailReason::Io)?;
    tokio::fs::create_dir_all(&resolved.full)
        .await
        .map_err(|_| FailReason::Io)?;
    // Created now, or there before: what it is now must still be inside.
    let dir = tokio::fs::canonicalize(&resolved.full)
        .await
        .map_err(|_| FailReason::Io)?;
    if !dir.starts_with(workspace) || !dir.is_dir() {
        return Err(FailReason::Io);
    }
    Ok(dir)
}

/// Downloads `file` into a temporary file in `dir` and renames it to its name.
async fn fetch(
    connect_url: &str,
    identity: &Identity,
    dir: &Path,
    file: &Upload,
) -> Result<(), FailReason> {
    let response = get(
        connect_url,
        identity,
        &format!("{UPLOAD_PATH_PREFIX}{}", file.id),
    )
    .await?;
    let part = dir.join(format!(".upload-{}.part", file.id));
    let written = write(response, &part, file.size).await;
    let placed = match written {
        Ok(()) => tokio::fs::rename(&part, dir.join(&file.name))
            .await
            .map_err(|_| FailReason::Io),
        Err(reason) => Err(reason),
    };
    if placed.is_err() {
        let _ = tokio::fs::remove_file(&part).await;
    }
    placed
}

/// `GET` of `path` from the brain with the session token: the response of a success; a
/// refusal (the file or skill is gone, or not the session's) is `Refused`, anything else
/// `Unreachable`.
pub(super) async fn get(
    connect_url: &str,
    identity: &Identity,
    path: &str,
) -> Result<reqwest::Response, FailReason> {
    let response = client()
        .map_err(|_| FailReason::Unreachable)?
        .get(brain_url(connect_url, path))
        .bearer_auth(identity.token.expose())
        .send()
        .await
        .map_err(|_| FailReason::Unreachable)?;
    let status = response.status();
    if [
        reqwest::StatusCode::UNAUTHORIZED,
        reqwest::StatusCode::FORBIDDEN,
        reqwest::StatusCode::NOT_FOUND,
    ]
    .contains(&status)
    {
        return Err(FailReason::Refused);
    }
    if !status.is_success() {
        return Err(FailReason::Unreachable);
    }
    Ok(response)
}

/// The body of `response` into `to`: exactly `size` bytes, or a failure.
async fn write(mut response: reqwest::Response, to: &Path, size: u64) -> Result<(), FailReason> {
    let mut out = tokio::fs::File::create(to)
        .await
        .map_err(|_| FailReason::Io)?;
    let mut total = 0u64;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|_| FailReason::SizeMismatch)?
    {
        total += chunk.len() as u64;
        if total > size {
            return Err(FailReason::SizeMismatch);
        }
        out.write_all(&chunk).await.map_err(|_| FailReason::Io)?;
    }
    if total != size {
        return Err(FailReason::SizeMismatch);
    }
    out.flush().await.map_err(|_| FailReason::Io)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::tools::test_support::TempDir;

    fn identity() -> Identity {
        let keys =
            channel::token::TokenKeys::new(b"any key of 32 bytes or more, for tests").unwrap();
        let session = protocol::SessionId::new();
        let token = keys
            .mint(
                session,
                protocol::TeamId::new(),
                protocol::AgentId::new(),
                Duration::from_secs(60),
            )
            .unwrap();
        Identity::new(session, crate::config::Token::new(token)).unwrap()
    }

    /// T25: a name that is not one segment is refused, a file already there is kept as it
    /// is (nothing is downloaded for either: the brain's address here answers nothing).
    #[tokio::test]
    async fn bad_names_are_refused_and_present_files_kept() {
        let workspace = TempDir::new("uploads-names");
        let dir = workspace.path().join(UPLOADS_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.csv"), "edited").unwrap();
        let file = |name: &str| Upload {
            id: protocol::SessionId::new().0,
            name: name.to_owned(),
            size: 3,
        };
        let files = vec![file("a.csv"), file("../escape"), file("..")];
        let ids: Vec<_> = files.iter().map(|f| f.id).collect();
        let placed = place(
            "ws://127.0.0.1:9/v1/worker/connect",
            &identity(),
            workspace.path(),
            UploadsRequest { files },
        )
        .await;
        assert_eq!(placed.placed, vec![ids[0]]);
        let reasons: Vec<_> = placed.failed.iter().map(|f| (f.id, f.reason)).collect();
        assert_eq!(
            reasons,
            vec![
                (ids[1], FailReason::InvalidName),
                (ids[2], FailReason::InvalidName)
            ]
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("a.csv")).unwrap(),
            "edited"
        );
        assert!(!workspace.path().join("escape").exists());
    }

    /// T25: an `uploads` that is a symlink out of the workspace is refused, never written
    /// through.
    #[tokio::test]
    async fn uploads_must_stay_inside_the_workspace() {
        let workspace = TempDir::new("uploads");
        let outside = TempDir::new("uploads-outside");
        assert!(workspace_dir(workspace.path(), UPLOADS_DIR).await.is_ok());
        std::fs::remove_dir(workspace.path().join(UPLOADS_DIR)).unwrap();
        std::os::unix::fs::symlink(outside.path(), workspace.path().join(UPLOADS_DIR)).unwrap();
        assert_eq!(
            workspace_dir(workspace.path(), UPLOADS_DIR).await,
            Err(FailReason::Io),
            "a link leaving the workspace"
        );
    }
}
