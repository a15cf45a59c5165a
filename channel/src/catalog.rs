//! The worker tools, known before any worker exists (SPEC T4, W8).
//!
//! The brain offers these to the model from the agent's RuntimeProfile; the first call
//! provisions a worker, which serves the same names with the same argument types (it
//! decodes them with the types below). Both ends compile this one list, so a tool the
//! brain offers is a tool the worker serves.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `shell`: run a command in the workspace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellArgs {
    /// The command line, run by `sh -c`.
    pub command: String,
    /// Working directory, relative to the workspace (default: the workspace root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Seconds before the command is killed (default 120, at most 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
}

/// `read_file`: the text of a file in the workspace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Path relative to the workspace.
    pub path: String,
}

/// `write_file`: create or replace a file in the workspace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// Path relative to the workspace; parent directories are created.
    pub path: String,
    /// The whole new content.
    pub content: String,
}

/// `list_dir`: the entries of a workspace directory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirArgs {
    /// Path relative to the workspace (`.` for the root).
    pub path: String,
}

/// `edit_file`: replace one exact occurrence of a string in a file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFileArgs {
    /// Path relative to the workspace.
    pub path: String,
    /// The exact text to replace; it must occur exactly once.
    pub old: String,
    /// The replacement.
    pub new: String,
}

/// `upload_artifact`: keep a workspace file as an artifact the user can download.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UploadArtifactArgs {
    /// Path relative to the workspace.
    pub path: String,
}

pub const SHELL: &str = "shell";
pub const READ_FILE: &str = "read_file";
pub const WRITE_FILE: &str = "write_file";
pub const LIST_DIR: &str = "list_dir";
pub const EDIT_FILE: &str = "edit_file";
pub const UPLOAD_ARTIFACT: &str = "upload_artifact";

/// One worker tool as the brain declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerToolDecl {
    pub name: &'static str,
    pub description: &'static str,
    pub input_schema: serde_json::Value,
    /// Whether a call changes data (SPEC T6).
    pub writes: bool,
}

/// An argument type's JSON Schema as providers expect it (an object schema).
pub fn schema_of<T: JsonSchema>() -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default();
    if let Some(map) = schema.as_object_mut() {
        // Providers reject some meta keys; they only need the object schema.
        map.remove("$schema");
        map.remove("title");
    }
    schema
}

/// The tools every profile with hands offers (`light`, `heavy`, `warm`, `browser`).
fn workspace_tools() -> Vec<WorkerToolDecl> {
    vec![
        WorkerToolDecl {
            name: SHELL,
            description: "Run a shell command in your workspace; output streams while it runs.",
            input_schema: schema_of::<ShellArgs>(),
            writes: true,
        },
        WorkerToolDecl {
            name: READ_FILE,
            description: "Read a text file from your workspace.",
            input_schema: schema_of::<ReadFileArgs>(),
            writes: false,
        },
        WorkerToolDecl {
            name: WRITE_FILE,
            description: "Create or overwrite a file in your workspace.",
            input_schema: schema_of::<WriteFileArgs>(),
            writes: true,
        },
        WorkerToolDecl {
            name: LIST_DIR,
            description: "List a directory of your workspace.",
            input_schema: schema_of::<ListDirArgs>(),
            writes: false,
        },
        WorkerToolDecl {
            name: EDIT_FILE,
            description: "Replace one exact occurrence of a string in a workspace file.",
            input_schema: schema_of::<EditFileArgs>(),
            writes: true,
        },
        WorkerToolDecl {
            name: UPLOAD_ARTIFACT,
            description: "Keep a workspace file as an artifact the user can download; returns its id.",
            input_schema: schema_of::<UploadArtifactArgs>(),
            writes: true,
        },
    ]
}

/// The worker tools `profile` offers; `none` (and an unknown profile) offers none.
pub fn catalog_for(profile: &str) -> Vec<WorkerToolDecl> {
    match profile {
        "light" | "heavy" | "warm" | "browser" => workspace_tools(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_with_hands_offer_the_workspace_tools() {
        assert!(catalog_for("none").is_empty());
        let names: Vec<_> = catalog_for("light").iter().map(|t| t.name).collect();
        assert_eq!(
            names,
            [
                SHELL,
                READ_FILE,
                WRITE_FILE,
                LIST_DIR,
                EDIT_FILE,
                UPLOAD_ARTIFACT
            ]
        );
        let shell = &catalog_for("heavy")[0];
        assert_eq!(
            shell.input_schema["required"],
            serde_json::json!(["command"])
        );
        assert_eq!(shell.input_schema["additionalProperties"], false);
    }
}
