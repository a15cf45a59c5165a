//! Skills (B8): a team's Agent Skills folders, uploaded as one archive each, versioned by
//! name; the agents that name a skill see its name and description in every turn's prompt,
//! read its `SKILL.md` (and its files) with `skill_read`, and find its files under
//! `skills/<name>/` in their worker's workspace.
//!
//! - `archive.rs`: an upload read and checked (the snapshot unpacker's path rule, no link
//!   or special file, bounded sizes and count, the front matter), and the folder packed
//!   again in the snapshot format (tar + zstd) that the worker unpacks with the snapshot
//!   unpacker;
//! - here: the bounds, storing a version (bytes first, then the row), an agent's names
//!   checked, and what a turn's prompt lists.

pub mod archive;
pub mod tool;

use crate::config::SkillsConfig;
use bytes::Bytes;
use protocol::TeamId;
use store::{NewSkill, SkillInsert, SkillRow, Store, StoreError, bounded};
use uuid::Uuid;

use crate::artifacts::{ArtifactBody, ArtifactError, ArtifactStore, storage_key};
use crate::files::FileError;
pub use archive::{ArchiveError, Parsed};
use protocol::channel::SessionClaims;

/// The most characters of the skills listing a turn's prompt carries: 20 descriptions of
/// 1,024 characters fit, with their names.
pub const MAX_LISTING_CHARS: usize = 24_000;

/// Why a skill was not stored.
#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The team has as many skills as it may.
    #[error("the team has as many skills as it may ({0})")]
    LimitReached(u32),
    #[error("the skill's bytes could not be stored")]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Checks `bytes` as one skill's archive and stores it as a new version of its name:
/// the bytes first, then the row (a failed row write deletes the bytes).
pub async fn upload(
    store: &Store,
    artifacts: &dyn ArtifactStore,
    config: &SkillsConfig,
    team: TeamId,
    bytes: Bytes,
    by: &store::Actor,
) -> Result<SkillRow, SkillError> {
    let limits = *config;
    let parsed = tokio::task::spawn_blocking(move || archive::parse(&bytes, &limits))
        .await
        .map_err(|_| ArchiveError::Invalid("the archive could not be read".into()))??;
    let id = Uuid::now_v7();
    let key = storage_key(team, id);
    artifacts
        .put(&key, Bytes::from(parsed.packed), "application/zstd")
        .await?;
    let new = NewSkill {
        id,
        name: &parsed.name,
        description: &parsed.description,
        skill_md: &parsed.skill_md,
        files: &parsed.files,
        size_bytes: i64::try_from(parsed.unpacked_bytes).unwrap_or(i64::MAX),
        storage_key: &key,
    };
    let inserted = bounded(store.insert_skill(team, new, i64::from(config.max_per_team), by)).await;
    match inserted {
        Ok(SkillInsert::Inserted(row)) => Ok(row),
        Ok(SkillInsert::TooManySkills) => {
            let _ = artifacts.delete(&key).await;
            Err(SkillError::LimitReached(config.max_per_team))
        }
        Err(err) => {
            let _ = artifacts.delete(&key).await;
            Err(err.into())
        }
    }
}

/// The packed folder of skill version `id` for the worker of the session `claims` names:
/// only the newest version of a skill that session's agent names, of its team; any other
/// is [`FileError::NotFound`].
pub async fn for_worker(
    store: &Store,
    artifacts: &dyn ArtifactStore,
    claims: &SessionClaims,
    id: Uuid,
) -> Result<ArtifactBody, FileError> {
    let session = match bounded(store.session(claims.sub)).await {
        Ok(row) if row.agent_id == claims.agent => row,
        Ok(_) | Err(StoreError::NotFound) => return Err(FileError::NotFound),
        Err(e) => return Err(e.into()),
    };
    if !bounded(store.chat_may_read_skill(claims.team, session.chat_id, id)).await? {
        return Err(FileError::NotFound);
    }
    let row = match bounded(store.skill_version(claims.team, id)).await {
        Ok(row) => row,
        Err(StoreError::NotFound) => return Err(FileError::NotFound),
        Err(e) => return Err(e.into()),
    };
    match artifacts.get(&row.storage_key).await {
        Ok(body) => {
            tracing::info!(session = %claims.sub, skill = %id, size = body.size, "skill sent to a worker");
            Ok(body)
        }
        Err(ArtifactError::NotFound) => Err(FileError::NotFound),
        Err(e) => Err(e.into()),
    }
}

/// Why an agent's skills were refused.
#[derive(Debug, thiserror::Error)]
pub enum AgentSkillsError {
    /// A name that is no skill of the agent's team; the message names it.
    #[error("{0}")]
    Unknown(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// B8: an agent names only its own team's skills, checked in one query when the agent is
/// created or changed. A skill deleted later drops out of its turns.
pub async fn check_agent_skills(
    store: &Store,
    team: TeamId,
    names: &[String],
) -> Result<(), AgentSkillsError> {
    if names.is_empty() {
        return Ok(());
    }
    let foreign = bounded(store.foreign_skills(team, names)).await?;
    match foreign.first() {
        None => Ok(()),
        Some(name) => Err(AgentSkillsError::Unknown(format!(
            "skills: {name:?} is no skill of this team"
        ))),
    }
}

/// The listing of `agent`'s skills for its turn's prompt (the newest version of each it
/// names that still exists); `None` when it names none, or when they could not be read
/// (a turn never waits on its skills' failure: it runs without the listing, logged).
pub async fn prompt_listing(store: &Store, agent: &store::AgentRow) -> Option<String> {
    if agent.skills.is_empty() {
        return None;
    }
    match bounded(store.newest_skills(agent.team_id, &agent.skills)).await {
        Ok(skills) => listing(&skills, agent.runtime_profile != protocol::profile::NONE),
        Err(err) => {
            tracing::warn!(agent = %agent.id, class = err.metric_label(), "skills not listed");
            None
        }
    }
}

/// What every turn's prompt says of the agent's skills: their names and descriptions,
/// never their bodies, within [`MAX_LISTING_CHARS`] (a skill past it is left out and
/// counted). `None` when the agent uses none.
pub fn listing(skills: &[SkillRow], hands: bool) -> Option<String> {
    if skills.is_empty() {
        return None;
    }
    let mut text = String::from(
        "Skills you can use. Each is a playbook: when a task calls for one, read it first \
         with the skill_read tool (its SKILL.md, then any file it names).",
    );
    if hands {
        text.push_str(" Its files are also in your workspace under skills/<name>/.");
    }
    text.push('\n');
    let mut left_out = 0;
    for skill in skills {
        let line = format!("- {}: {}\n", skill.name, skill.description.trim());
        if text.chars().count() + line.chars().count() > MAX_LISTING_CHARS {
            left_out += 1;
            continue;
        }
        text.push_str(&line);
    }
    if left_out > 0 {
        text.push_str(&format!(
            "({left_out} more skills are not listed: the list is at its bound.)\n"
        ));
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::agents::validate_agent_skills;

    fn row(name: &str, description: &str) -> SkillRow {
        SkillRow {
            id: Uuid::nil(),
            name: name.into(),
            version: 1,
            description: description.into(),
            skill_md: "---\nname: x\n---\nthe body".into(),
            files: Vec::new(),
            size_bytes: 0,
            storage_key: String::new(),
            created_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn the_listing_names_and_describes_within_its_bound() {
        let text = listing(&[row("pdf", "Reads PDFs.")], true).unwrap();
        assert!(text.contains("- pdf: Reads PDFs."));
        assert!(text.contains("skills/<name>/"));
        assert!(!text.contains("the body"), "never the body");
        assert!(listing(&[], true).is_none());
        let long = "d".repeat(1024);
        let many: Vec<SkillRow> = (0..40).map(|i| row(&format!("s{i}"), &long)).collect();
        let text = listing(&many, false).unwrap();
        assert!(text.chars().count() <= MAX_LISTING_CHARS + 100);
        assert!(text.contains("more skills are not listed"));
    }

    #[test]
    fn agent_skill_names_are_checked_and_deduplicated() {
        let names = validate_agent_skills(vec!["a".into(), "a".into(), "b-c".into()]).unwrap();
        assert_eq!(names, vec!["a".to_owned(), "b-c".to_owned()]);
        assert!(validate_agent_skills(vec!["Bad".into()]).is_err());
        let many: Vec<String> = (0..21).map(|i| format!("s{i}")).collect();
        assert!(validate_agent_skills(many).is_err());
    }
}
