//! The agent's skills into the workspace (B8): the brain names the newest version of each
//! in `agent_runtime/skills` before a tool call; each whose `skills/<name>/` is not that
//! version yet is downloaded from the brain with the session token
//! (`GET /v1/worker/skills/{id}`, a tar stream in zstd), unpacked by the snapshot unpacker
//! (`snapshot::unpack`: the same refusals, the same size bound) into a temporary folder
//! beside it, marked with its version, and renamed into place: a skill's folder is one
//! whole version or absent. The folder of an older version is replaced, so a file the
//! model changed in it is lost: the skill's folder is the skill's, the rest of the
//! workspace the model's.

use std::io::Cursor;
use std::path::Path;
use std::time::{Duration, Instant};

use protocol::skills::{
    SKILL_PATH_PREFIX, SKILLS_DIR, SkillVersion, SkillsRequest, VERSION_FILE, valid_name,
};
use protocol::uploads::{FailReason, Failed, Placed};

use super::uploads::{get, workspace_dir};
use crate::dial::Identity;
use crate::snapshot::unpack;

/// How long one request may take for all its skills; within the brain's bound.
pub const DELIVERY_BOUND: Duration = Duration::from_secs(120);

/// Places each skill of `request` in `workspace` (canonical), downloading from the brain
/// beside `connect_url`.
pub async fn place(
    connect_url: &str,
    identity: &Identity,
    workspace: &Path,
    request: SkillsRequest,
) -> Placed {
    let started = Instant::now();
    let mut answer = Placed::default();
    let dir = match workspace_dir(workspace, SKILLS_DIR).await {
        Ok(dir) => dir,
        Err(reason) => {
            answer.failed = request
                .skills
                .iter()
                .map(|skill| Failed {
                    id: skill.id,
                    reason,
                })
                .collect();
            return answer;
        }
    };
    for skill in request.skills {
        let outcome = if !valid_name(&skill.name) {
            Err(FailReason::InvalidName)
        } else if is_version(&dir.join(&skill.name), &skill).await {
            Ok(())
        } else {
            let deadline = DELIVERY_BOUND.saturating_sub(started.elapsed());
            match tokio::time::timeout(deadline, fetch(connect_url, identity, &dir, &skill)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(FailReason::Deferred),
            }
        };
        match outcome {
            Ok(()) => answer.placed.push(skill.id),
            Err(reason) => answer.failed.push(Failed {
                id: skill.id,
                reason,
            }),
        }
    }
    tracing::info!(
        session = %identity.session,
        placed = answer.placed.len(),
        failed = answer.failed.len(),
        ms = started.elapsed().as_millis() as u64,
        "skills placed"
    );
    answer
}

/// Whether `folder` holds version `skill` already.
async fn is_version(folder: &Path, skill: &SkillVersion) -> bool {
    tokio::fs::read_to_string(folder.join(VERSION_FILE))
        .await
        .is_ok_and(|held| held.trim() == skill.id.to_string())
}

/// Downloads `skill`, unpacks it into a temporary folder in `dir` and renames that to the
/// skill's name, replacing the folder of another version.
async fn fetch(
    connect_url: &str,
    identity: &Identity,
    dir: &Path,
    skill: &SkillVersion,
) -> Result<(), FailReason> {
    let response = get(
        connect_url,
        identity,
        &format!("{SKILL_PATH_PREFIX}{}", skill.id),
    )
    .await?;
    let bytes = response
        .bytes()
        .await
        .map_err(|_| FailReason::SizeMismatch)?;
    let part = dir.join(format!(".skill-{}.part", skill.id));
    let target = dir.join(&skill.name);
    let (version, bound) = (skill.id.to_string(), skill.unpacked_bytes);
    tokio::task::spawn_blocking(move || put_in_place(&bytes, &part, &target, version, bound))
        .await
        .unwrap_or(Err(FailReason::Io))
}

/// Unpacks `packed` into `part` (the snapshot unpacker's rules), marks its version and
/// renames it to `target`. Blocking.
fn put_in_place(
    packed: &[u8],
    part: &Path,
    target: &Path,
    version: String,
    bound: u64,
) -> Result<(), FailReason> {
    let _ = std::fs::remove_dir_all(part);
    std::fs::create_dir(part).map_err(|_| FailReason::Io)?;
    let done = unpack(Cursor::new(packed), part, bound)
        .map_err(|_| FailReason::SizeMismatch)
        .and_then(|_| std::fs::write(part.join(VERSION_FILE), version).map_err(|_| FailReason::Io))
        .and_then(|()| {
            // A folder of another version, or anything the model left under the name.
            match std::fs::symlink_metadata(target) {
                Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(target),
                Ok(_) => std::fs::remove_file(target),
                Err(_) => Ok(()),
            }
            .map_err(|_| FailReason::Io)
        })
        .and_then(|()| std::fs::rename(part, target).map_err(|_| FailReason::Io));
    if done.is_err() {
        let _ = std::fs::remove_dir_all(part);
    }
    done
}
