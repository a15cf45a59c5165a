//! `skill_read`: a skill's `SKILL.md` (B8), or one named file of its folder, on demand.
//! Offered only to an agent that names skills; it reads the agent's names when it runs,
//! so a skill unnamed since is never read, and every read names the turn's team.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::artifacts::ArtifactStore;
use crate::tools::{Tool, ToolCtx, ToolOutput, parse_args, schema_of};
use domain::approvals::RiskClass;
use providers::ToolSpec;
use store::{SkillRow, bounded};

/// The most bytes of a named file the model reads; the rest is cut with a note.
pub const MAX_FILE_BYTES: usize = 64 << 10;
/// The bound on reading a skill's folder from the artifact store.
const READ_BOUND: Duration = Duration::from_secs(20);

pub fn tool(artifacts: Arc<dyn ArtifactStore>) -> Arc<dyn Tool> {
    Arc::new(SkillRead { artifacts })
}

/// Arguments of `skill_read`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    /// The skill's name, as listed.
    name: String,
    /// A file of the skill's folder to read instead of SKILL.md (`scripts/run.sh`, say).
    #[serde(default)]
    file: Option<String>,
}

struct SkillRead {
    artifacts: Arc<dyn ArtifactStore>,
}

impl Tool for SkillRead {
    fn metric_label(&self) -> &'static str {
        "skill_read"
    }

    /// D3: it only reads.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "skill_read".into(),
            description: "Read one of your skills: its SKILL.md instructions and the list of \
                its files, or, with `file`, one file of it. Read a skill before following it."
                .into(),
            input_schema: schema_of::<ReadArgs>(),
        }
    }

    fn risk(&self) -> RiskClass {
        RiskClass::Read
    }

    fn writes(&self) -> bool {
        false
    }

    fn call<'a>(
        &'a self,
        ctx: &'a ToolCtx,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, ToolOutput> {
        async move {
            let args: ReadArgs = match parse_args(arguments) {
                Ok(args) => args,
                Err(e) => return e,
            };
            let skill = match named_skill(ctx, &args.name).await {
                Ok(skill) => skill,
                Err(output) => return output,
            };
            match args.file.as_deref() {
                None | Some("SKILL.md") => ToolOutput::ok(body(&skill)),
                Some(file) => self.file(ctx, &skill, file).await,
            }
        }
        .boxed()
    }
}

/// The newest version of the agent's skill `name`, or what the model reads instead.
async fn named_skill(ctx: &ToolCtx, name: &str) -> Result<SkillRow, ToolOutput> {
    let unavailable = |class: &'static str| {
        tracing::warn!(turn = %ctx.turn, class, "skill_read failed");
        ToolOutput::error("skills are unavailable right now")
    };
    let agent = bounded(ctx.store.agent(ctx.team, ctx.agent))
        .await
        .map_err(|e| unavailable(e.metric_label()))?;
    if !agent.skills.iter().any(|s| s == name) {
        return Err(ToolOutput::error(format!(
            "{name:?} is not one of your skills: {}",
            agent.skills.join(", ")
        )));
    }
    let found = bounded(ctx.store.newest_skills(ctx.team, &[name.to_owned()]))
        .await
        .map_err(|e| unavailable(e.metric_label()))?;
    found
        .into_iter()
        .next()
        .ok_or_else(|| ToolOutput::error(format!("the skill {name:?} was deleted")))
}

/// SKILL.md as uploaded, then the folder's files.
fn body(skill: &SkillRow) -> String {
    let files: Vec<String> = skill
        .files
        .iter()
        .map(|f| format!("- {} ({} bytes)", f.path, f.size))
        .collect();
    format!(
        "{}\n\n[files of the skill {} (version {}), readable with skill_read and `file`:]\n{}",
        skill.skill_md.trim_end(),
        skill.name,
        skill.version,
        files.join("\n")
    )
}

impl SkillRead {
    /// One file of `skill`'s folder, read out of its packed archive, cut at
    /// [`MAX_FILE_BYTES`].
    async fn file(&self, ctx: &ToolCtx, skill: &SkillRow, file: &str) -> ToolOutput {
        let Some(listed) = skill.files.iter().find(|f| f.path == file) else {
            return ToolOutput::error(format!(
                "the skill {} has no file {file:?}; its files are listed by skill_read without `file`",
                skill.name
            ));
        };
        let read = tokio::time::timeout(READ_BOUND, async {
            self.artifacts
                .get(&skill.storage_key)
                .await?
                .collect()
                .await
        })
        .await;
        let packed = match read {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(e)) => {
                tracing::warn!(turn = %ctx.turn, class = e.metric_label(), "skill file not read");
                return ToolOutput::error("the skill's files are unavailable right now");
            }
            Err(_) => {
                tracing::warn!(turn = %ctx.turn, class = "timeout", "skill file not read");
                return ToolOutput::error("the skill's files are unavailable right now");
            }
        };
        let path = listed.path.clone();
        let found = tokio::task::spawn_blocking(move || entry(&packed, &path)).await;
        match found {
            Ok(Some(bytes)) => ToolOutput::ok(shown(&listed.path, &bytes)),
            _ => ToolOutput::error("the skill's file could not be read"),
        }
    }
}

/// The first [`MAX_FILE_BYTES`] (and one more, to know it was cut) of the file at `path`
/// in the packed folder. Blocking.
fn entry(packed: &[u8], path: &str) -> Option<Vec<u8>> {
    let decoder = zstd::stream::read::Decoder::new(packed).ok()?;
    let mut tar = tar::Archive::new(decoder);
    for entry in tar.entries().ok()? {
        let entry = entry.ok()?;
        if entry.path_bytes().as_ref() == path.as_bytes() {
            let mut bytes = Vec::new();
            entry
                .take(MAX_FILE_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
                .ok()?;
            return Some(bytes);
        }
    }
    None
}

/// What the model reads of a file: its text, cut with a note; a binary file is named.
fn shown(path: &str, bytes: &[u8]) -> String {
    let cut = bytes.len() > MAX_FILE_BYTES;
    let bytes = &bytes[..bytes.len().min(MAX_FILE_BYTES)];
    match std::str::from_utf8(bytes) {
        Ok(text) if cut => format!("{text}\n[{path} is cut here, at {MAX_FILE_BYTES} bytes]"),
        Ok(text) => text.to_owned(),
        // A cut may fall inside a character: what comes before it is still text.
        Err(e) if cut && e.error_len().is_none() => {
            let text = String::from_utf8_lossy(&bytes[..e.valid_up_to()]);
            format!("{text}\n[{path} is cut here, at {MAX_FILE_BYTES} bytes]")
        }
        Err(_) => format!("[{path} is not text: it cannot be shown here]"),
    }
}
