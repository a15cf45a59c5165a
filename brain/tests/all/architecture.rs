//! The module graph's one-way rule (docs/ARCHITECTURE.md): nothing in the brain depends on
//! `api/`, so a rule a route and a tool both apply cannot hide behind HTTP. Only the crate
//! root, which mounts the router, names it.

use std::path::Path;

fn sources(dir: &Path, found: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            sources(&path, found)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    Ok(())
}

/// Whether `source` reaches into `api`: a `crate::api` path, or `api` inside a
/// `use crate::{...}` group.
fn reaches_api(source: &str) -> bool {
    if source.contains("crate::api") {
        return true;
    }
    let mut rest = source;
    while let Some(at) = rest.find("use crate::{") {
        let group = &rest[at..];
        let end = group.find("};").unwrap_or(group.len());
        if group[..end]
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .any(|word| word == "api")
        {
            return true;
        }
        rest = &group[end..];
    }
    false
}

#[test]
fn nothing_below_the_api_depends_on_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files).unwrap();
    let api = src.join("api");
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(&api) && *f != &src.join("lib.rs"))
        .filter(|f| reaches_api(&std::fs::read_to_string(f).unwrap()))
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    assert!(
        files.len() > 50,
        "the walk found the sources: {}",
        files.len()
    );
    assert!(offenders.is_empty(), "these reach into api/: {offenders:?}");
}

#[test]
fn the_check_sees_both_spellings() {
    assert!(reaches_api("use crate::api::JsonBody;"));
    assert!(reaches_api("use crate::{AppState, api, store};"));
    assert!(!reaches_api(
        "use crate::{AppState, store};\nlet api_key = 1;"
    ));
}

/// The crate root's module doc is the brain's map: every module it declares is on it.
#[test]
fn the_crate_map_names_every_module() {
    let root = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("brain/src/lib.rs");
    let map: String = root
        .lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let missing: Vec<&str> = root
        .lines()
        .filter_map(|line| line.strip_prefix("pub mod "))
        .map(|rest| rest.trim_end_matches(';'))
        .filter(|module| {
            !map.contains(&format!("`{module}/`")) && !map.contains(&format!("`{module}.rs`"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "brain/src/lib.rs's map omits {missing:?}"
    );
}

/// The turn engine answers `TurnError`s; only `crate::error` turns them into HTTP. Its
/// files name neither the HTTP error type nor the module that holds it.
#[test]
fn the_turn_engine_answers_turn_errors() {
    let turn = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/turn");
    let mut files = Vec::new();
    sources(&turn, &mut files).unwrap();
    assert!(
        files.len() > 10,
        "the walk found the engine: {}",
        files.len()
    );
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            let source = std::fs::read_to_string(f).unwrap();
            source.contains("ApiError") || source.contains("crate::error")
        })
        .map(|f| f.strip_prefix(&turn).unwrap().display().to_string())
        .collect();
    assert!(offenders.is_empty(), "these speak HTTP: {offenders:?}");
}
