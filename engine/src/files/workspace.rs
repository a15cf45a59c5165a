//! A chat's files in its worker's workspace (T25): the name each gets under `uploads/`,
//! and the bytes a worker downloads with its session token.
//!
//! A name is the file's own (cleaned as stored, checked again with
//! `protocol::uploads::valid_name`), made unique within the chat in the order the files
//! came: the second `a.png` is `a-2.png`. A file's name depends only on the files before
//! it, and a chat's files are only ever removed with the chat, so a name never changes:
//! what the model was told in one turn is still true in the next.

use std::collections::HashSet;

use protocol::channel::SessionClaims;
use protocol::uploads::{MAX_NAME_BYTES, MAX_UPLOADS, UPLOADS_DIR, Upload, valid_name};
use protocol::{ChatId, TeamId};
use uuid::Uuid;

use super::{FileError, clean_filename};
use crate::Engine;
use crate::artifacts::{ArtifactBody, ArtifactError};
use store::{ChatFileRow, Store, StoreError, bounded};

/// The files of a chat as a worker places them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    /// The chat's first [`MAX_UPLOADS`] files, oldest first.
    pub files: Vec<Upload>,
    /// The chat has more files than that: the later ones are not placed.
    pub left_out: bool,
    /// B8: the newest version of each skill the chat's agent names, for `skills/`.
    pub skills: Vec<protocol::skills::SkillVersion>,
}

impl Manifest {
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && !self.left_out && self.skills.is_empty()
    }

    /// The workspace path of file `id`, if it is placed.
    pub fn path_of(&self, id: Uuid) -> Option<String> {
        self.files
            .iter()
            .find(|file| file.id == id)
            .map(|file| path(&file.name))
    }
}

/// `uploads/<name>`.
pub fn path(name: &str) -> String {
    format!("{UPLOADS_DIR}/{name}")
}

/// The chat's files and their workspace names: one bounded read.
pub async fn manifest(store: &Store, team: TeamId, chat: ChatId) -> Result<Manifest, StoreError> {
    let limit = i64::try_from(MAX_UPLOADS + 1).unwrap_or(i64::MAX);
    let mut rows = bounded(store.chat_files_of(team, chat, limit)).await?;
    let left_out = rows.len() > MAX_UPLOADS;
    rows.truncate(MAX_UPLOADS);
    let skills = bounded(store.chat_skills(team, chat)).await?;
    Ok(Manifest {
        files: named(&rows),
        left_out,
        skills: skills
            .into_iter()
            .map(|(id, name, size)| protocol::skills::SkillVersion {
                id,
                name,
                unpacked_bytes: u64::try_from(size).unwrap_or(0),
            })
            .collect(),
    })
}

/// `rows` (oldest first) with unique names.
fn named(rows: &[ChatFileRow]) -> Vec<Upload> {
    let mut taken = HashSet::new();
    rows.iter()
        .map(|row| {
            let name = unique(&row.filename, &taken);
            taken.insert(name.clone());
            Upload {
                id: row.id,
                name,
                size: u64::try_from(row.size_bytes).unwrap_or(0),
            }
        })
        .collect()
}

/// `filename` cleaned, or with `-2`, `-3`, ... before its extension until no name in
/// `taken` has it; a stem too long for the suffix is cut on a character boundary.
fn unique(filename: &str, taken: &HashSet<String>) -> String {
    let mut base = clean_filename(filename);
    if !valid_name(&base) {
        base = "file".to_owned();
    }
    if !taken.contains(&base) {
        return base;
    }
    // A leading dot is part of the stem: `.env` becomes `.env-2`.
    let (stem, ext) = match base.rfind('.') {
        Some(dot) if dot > 0 => base.split_at(dot),
        _ => (base.as_str(), ""),
    };
    (2u32..)
        .map(|n| {
            let suffix = format!("-{n}{ext}");
            let mut end = stem.len().min(MAX_NAME_BYTES.saturating_sub(suffix.len()));
            while !stem.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}{suffix}", &stem[..end])
        })
        .find(|name| !taken.contains(name))
        .unwrap_or(base)
}

/// The bytes of file `id` for the worker of the session `claims` names: only a file of
/// that session's chat, of its team; any other is [`FileError::NotFound`].
pub async fn for_worker(
    engine: &Engine,
    claims: &SessionClaims,
    id: Uuid,
) -> Result<ArtifactBody, FileError> {
    let session = match bounded(engine.store.session(claims.sub)).await {
        Ok(row) if row.agent_id == claims.agent => row,
        Ok(_) | Err(StoreError::NotFound) => return Err(FileError::NotFound),
        Err(e) => return Err(e.into()),
    };
    let row = match bounded(engine.store.chat_file(claims.team, id)).await {
        Ok(row) if row.chat_id == session.chat_id => row,
        Ok(_) | Err(StoreError::NotFound) => return Err(FileError::NotFound),
        Err(e) => return Err(e.into()),
    };
    match engine.artifacts.get(&row.storage_key).await {
        Ok(body) => {
            tracing::info!(session = %claims.sub, file = %id, size = body.size, "chat file sent to a worker");
            Ok(body)
        }
        Err(ArtifactError::NotFound) => Err(FileError::NotFound),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(names: &[&str]) -> HashSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    /// T25: names collide into `-2`, `-3` before the extension, never into a path.
    #[test]
    fn names_are_unique_single_segments() {
        assert_eq!(unique("a.png", &taken(&[])), "a.png");
        assert_eq!(unique("a.png", &taken(&["a.png"])), "a-2.png");
        assert_eq!(unique("a.png", &taken(&["a.png", "a-2.png"])), "a-3.png");
        assert_eq!(unique("a.tar.gz", &taken(&["a.tar.gz"])), "a.tar-2.gz");
        assert_eq!(unique(".env", &taken(&[".env"])), ".env-2");
        assert_eq!(unique("../../etc/passwd", &taken(&[])), "passwd");
        assert_eq!(unique("..", &taken(&[])), "file");
        assert_eq!(unique("..", &taken(&["file"])), "file-2");
        let long = format!("{}.txt", "é".repeat(125));
        let second = unique(&long, &taken(&[&long]));
        assert!(second.len() <= MAX_NAME_BYTES && second.ends_with("-2.txt"));
        assert!(valid_name(&second));
    }
}
