//! The worker tools, known before any worker exists (SPEC T4, W8).
//!
//! The brain offers these to the model from the agent's RuntimeProfile; the first call
//! provisions a worker, which serves the same names with the same argument types (it
//! decodes them with the types below). Both ends compile this one list, so a tool the
//! brain offers is a tool the worker serves.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

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

/// `browser_navigate`: open a page in the headless browser.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserNavigateArgs {
    /// The page to open: an absolute http:// or https:// URL.
    pub url: String,
}

/// `browser_snapshot`: the current page as text. No arguments.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserSnapshotArgs {}

/// `browser_click`: click an element of the latest snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserClickArgs {
    /// The element's number from `[ref=N]` in the latest `browser_snapshot`.
    #[serde(rename = "ref")]
    pub element: u64,
}

/// `browser_type`: put text into a field of the latest snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserTypeArgs {
    /// The field's number from `[ref=N]` in the latest `browser_snapshot`.
    #[serde(rename = "ref")]
    pub element: u64,
    /// The text; it replaces what the field holds.
    pub text: String,
}

/// `browser_screenshot`: a PNG of the visible page, kept as an artifact. No arguments.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserScreenshotArgs {}

pub const SHELL: &str = "shell";
pub const READ_FILE: &str = "read_file";
pub const WRITE_FILE: &str = "write_file";
pub const LIST_DIR: &str = "list_dir";
pub const EDIT_FILE: &str = "edit_file";
pub const UPLOAD_ARTIFACT: &str = "upload_artifact";
pub const BROWSER_NAVIGATE: &str = "browser_navigate";
pub const BROWSER_SNAPSHOT: &str = "browser_snapshot";
pub const BROWSER_CLICK: &str = "browser_click";
pub const BROWSER_TYPE: &str = "browser_type";
pub const BROWSER_SCREENSHOT: &str = "browser_screenshot";

/// The tools whose successful result carries a file (an MCP embedded resource with a
/// base64 `blob`) that the brain stores as an artifact, answering the model with its id.
pub const FILE_RESULT_TOOLS: [&str; 2] = [UPLOAD_ARTIFACT, BROWSER_SCREENSHOT];

/// Whether the brain stores `tool`'s result as an artifact (see [`FILE_RESULT_TOOLS`]).
pub fn returns_file(tool: &str) -> bool {
    FILE_RESULT_TOOLS.contains(&tool)
}

/// One worker tool as the brain declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerToolDecl {
    pub name: &'static str,
    pub description: &'static str,
    pub input_schema: serde_json::Value,
    /// Whether a call changes data (SPEC T6).
    pub writes: bool,
}

/// An argument type's JSON Schema as providers expect it (an object schema). Every turn
/// declares its tools, and generating a schema costs far more than cloning one, so each
/// type's schema is generated once per process.
pub fn schema_of<T: JsonSchema + 'static>() -> serde_json::Value {
    static SCHEMAS: OnceLock<Mutex<HashMap<TypeId, serde_json::Value>>> = OnceLock::new();
    let schemas = SCHEMAS.get_or_init(Mutex::default);
    let known = schemas
        .lock()
        .ok()
        .and_then(|s| s.get(&TypeId::of::<T>()).cloned());
    if let Some(schema) = known {
        return schema;
    }
    let schema = generate_schema::<T>();
    if let Ok(mut schemas) = schemas.lock() {
        schemas.insert(TypeId::of::<T>(), schema.clone());
    }
    schema
}

fn generate_schema<T: JsonSchema>() -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default();
    if let Some(map) = schema.as_object_mut() {
        // Providers reject some meta keys; they only need the object schema.
        map.remove("$schema");
        map.remove("title");
        // An argument-less tool: some providers refuse an object schema without
        // `properties`.
        if map.get("type").and_then(|t| t.as_str()) == Some("object") {
            map.entry("properties")
                .or_insert_with(|| serde_json::json!({}));
        }
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

/// The headless-browser tools of profile `browser` (SPEC W8). Refs (`[ref=N]`) come from
/// the latest snapshot and die with the next snapshot or navigation.
///
/// `writes` (T6): opening, reading and typing into a page change nothing outside it; a
/// click may submit a form, and a screenshot stores an artifact (as `upload_artifact`).
fn browser_tools() -> Vec<WorkerToolDecl> {
    vec![
        WorkerToolDecl {
            name: BROWSER_NAVIGATE,
            description: "Open a web page (http or https) in your headless browser; returns the final URL, the title and the HTTP status.",
            input_schema: schema_of::<BrowserNavigateArgs>(),
            writes: false,
        },
        WorkerToolDecl {
            name: BROWSER_SNAPSHOT,
            description: "Read the current browser page as text: its accessibility tree (role, name, value), with [ref=N] on the elements you can click or type into. Refs last until the next snapshot or navigation.",
            input_schema: schema_of::<BrowserSnapshotArgs>(),
            writes: false,
        },
        WorkerToolDecl {
            name: BROWSER_CLICK,
            description: "Click an element of the browser page by its ref from the latest browser_snapshot.",
            input_schema: schema_of::<BrowserClickArgs>(),
            writes: true,
        },
        WorkerToolDecl {
            name: BROWSER_TYPE,
            description: "Type text into a field of the browser page by its ref from the latest browser_snapshot; the text replaces what the field holds.",
            input_schema: schema_of::<BrowserTypeArgs>(),
            writes: false,
        },
        WorkerToolDecl {
            name: BROWSER_SCREENSHOT,
            description: "Take a PNG screenshot of the visible browser page and keep it as an artifact the user can download; returns its id.",
            input_schema: schema_of::<BrowserScreenshotArgs>(),
            writes: true,
        },
    ]
}

/// The worker tools `profile` offers; `none` (and an unknown profile) offers none.
pub fn catalog_for(profile: &str) -> Vec<WorkerToolDecl> {
    match profile {
        "light" | "heavy" | "warm" => workspace_tools(),
        "browser" => {
            let mut tools = workspace_tools();
            tools.extend(browser_tools());
            tools
        }
        _ => Vec::new(),
    }
}

/// Every worker tool of any profile, each once.
pub fn all_tools() -> Vec<WorkerToolDecl> {
    catalog_for("browser")
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

    #[test]
    fn the_browser_profile_adds_the_browser_tools() {
        let light: Vec<_> = catalog_for("light").iter().map(|t| t.name).collect();
        let browser: Vec<_> = catalog_for("browser").iter().map(|t| t.name).collect();
        assert_eq!(browser[..light.len()], light[..]);
        assert_eq!(
            browser[light.len()..],
            [
                BROWSER_NAVIGATE,
                BROWSER_SNAPSHOT,
                BROWSER_CLICK,
                BROWSER_TYPE,
                BROWSER_SCREENSHOT
            ]
        );
        for profile in ["light", "heavy", "warm", "none"] {
            assert!(
                catalog_for(profile)
                    .iter()
                    .all(|t| !t.name.starts_with("browser_")),
                "{profile}"
            );
        }
        assert_eq!(all_tools(), catalog_for("browser"));
    }

    #[test]
    fn browser_tool_schemas() {
        let by_name = |name: &str| {
            catalog_for("browser")
                .into_iter()
                .find(|t| t.name == name)
                .map(|t| t.input_schema)
                .unwrap_or_default()
        };
        let navigate = by_name(BROWSER_NAVIGATE);
        assert_eq!(navigate["required"], serde_json::json!(["url"]));
        assert_eq!(navigate["properties"]["url"]["type"], "string");
        let click = by_name(BROWSER_CLICK);
        assert_eq!(click["required"], serde_json::json!(["ref"]));
        assert_eq!(click["properties"]["ref"]["type"], "integer");
        let typed = by_name(BROWSER_TYPE);
        assert_eq!(typed["required"], serde_json::json!(["ref", "text"]));
        for empty in [BROWSER_SNAPSHOT, BROWSER_SCREENSHOT] {
            let schema = by_name(empty);
            assert_eq!(schema["type"], "object", "{empty}");
            assert_eq!(schema["additionalProperties"], false, "{empty}");
            assert_eq!(schema["properties"], serde_json::json!({}), "{empty}");
            assert!(schema.get("required").is_none(), "{empty}");
        }
        // The argument types decode what the schemas describe.
        let args: BrowserTypeArgs = serde_json::from_value(
            serde_json::json!({"ref": 12, "text": "hi"}),
        )
        .unwrap_or_else(|_| BrowserTypeArgs {
            element: 0,
            text: String::new(),
        });
        assert_eq!(args.element, 12);
        assert!(
            serde_json::from_value::<BrowserSnapshotArgs>(serde_json::json!({"x": 1})).is_err()
        );
        assert!(returns_file(UPLOAD_ARTIFACT) && returns_file(BROWSER_SCREENSHOT));
        assert!(!returns_file(BROWSER_SNAPSHOT) && !returns_file(SHELL));
    }
}
