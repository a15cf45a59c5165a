//! Skills in the worker's workspace (B8): the words the brain and the worker use to put
//! the agent's skills under `skills/<name>/` before a tool call runs, as chat files go
//! under `uploads/` (T25).
//!
//! ```text
//! brain (the replica holding the channel), before a tools/call, for the skill versions
//! this channel has not confirmed yet:
//!     ──SKILLS_REQUEST {skills: [{id, name, size}]}──► worker
//! worker, for each skill whose skills/<name>/ is not that version yet:
//!     GET SKILL_PATH_PREFIX<id> (session token) ─► tar + zstd ─► the snapshot unpacker
//!     into a temporary folder ─► rename to skills/<name>
//! worker ──uploads::Placed {placed, failed: [{id, reason}]}──► brain
//! ```

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Brain → worker, over the channel: place these skills (a request; its answer is an
/// [`crate::uploads::Placed`]). Sent only to a worker announcing [`SKILLS_CAPABILITY`].
pub const SKILLS_REQUEST: &str = "agent_runtime/skills";
/// The experimental server capability of a worker that takes [`SKILLS_REQUEST`].
pub const SKILLS_CAPABILITY: &str = "agent_runtime/skills";
/// The workspace directory the skills go in, a folder each.
pub const SKILLS_DIR: &str = "skills";
/// The file in a placed skill's folder naming its version: a folder of another version (or
/// none) is replaced.
pub const VERSION_FILE: &str = ".skill-version";
/// `GET` + a skill version's id: its folder as a tar stream compressed with zstd (the
/// snapshot format), authenticated with the session token; only a skill the session's
/// agent names.
pub const SKILL_PATH_PREFIX: &str = "/v1/worker/skills/";
/// The same route as the brain's router spells it.
pub const SKILL_PATH: &str = "/v1/worker/skills/{id}";
/// The longest skill name (the Agent Skills rule).
pub const MAX_NAME_CHARS: usize = 64;

/// One skill version to place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillVersion {
    /// The version's id: what is downloaded, and what [`VERSION_FILE`] holds.
    pub id: Uuid,
    /// Its folder under `skills/` ([`valid_name`]).
    pub name: String,
    /// The size of the tar stream (the bound the unpacker enforces).
    pub unpacked_bytes: u64,
}

/// The params of [`SKILLS_REQUEST`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillsRequest {
    pub skills: Vec<SkillVersion>,
}

/// The Agent Skills name rule: 1 to [`MAX_NAME_CHARS`] lowercase ASCII letters, digits and
/// hyphens, no hyphen first, last or twice in a row. Such a name is one path segment.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn names_follow_the_agent_skills_rule() {
        for good in ["a", "pdf-processing", "x2", "a-b-c"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "A", "-a", "a-", "a--b", "a_b", "a.b", "../a", "é"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(valid_name(&"a".repeat(MAX_NAME_CHARS)));
        assert!(!valid_name(&"a".repeat(MAX_NAME_CHARS + 1)));
        assert_eq!(SKILL_PATH.strip_suffix("{id}"), Some(SKILL_PATH_PREFIX));
    }

    #[test]
    fn the_wire_is_closed() {
        let req: Result<SkillsRequest, _> =
            serde_json::from_value(serde_json::json!({"skills": [], "extra": 1}));
        assert!(req.is_err());
    }
}
