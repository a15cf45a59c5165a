//! Workspace confinement for the file tools.
//!
//! A path from the model is relative to the workspace. It is normalized lexically (`.` and
//! `..` folded; climbing above the root is an escape), then the deepest part of it that
//! exists is canonicalized (symlinks resolved) and must still lie inside the workspace.
//! The part that does not exist yet cannot contain a symlink, so the result stays inside.
//!
//! This confines the file tools only. `shell` runs arbitrary commands; what it can reach
//! is bounded by the pod's sandbox, not by this module.

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

pub const ESCAPES: &str = "path escapes the workspace";

/// A path refused before any file is touched; the text is what the model reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is empty; use \".\" for the workspace root")]
    Empty,
    #[error("{ESCAPES}: absolute paths are not allowed, use a path relative to the workspace")]
    Absolute,
    #[error("{ESCAPES}")]
    Escapes,
    #[error("path cannot be resolved")]
    Unresolvable,
}

/// A confined path: where it is on disk and how to name it relative to the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub full: PathBuf,
    /// Relative to the workspace, `/`-separated; empty for the root.
    pub relative: String,
}

/// Resolves `path` inside `workspace`, which must be canonical.
pub fn resolve(workspace: &Path, path: &str) -> Result<Resolved, PathError> {
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.contains('\0') {
        return Err(PathError::Unresolvable);
    }
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::RootDir | Component::Prefix(_) => return Err(PathError::Absolute),
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(PathError::Escapes);
                }
            }
            Component::Normal(part) => parts.push(part),
        }
    }
    // The deepest existing ancestor (a dangling symlink counts as existing: it is checked,
    // not followed blindly), canonicalized; the rest is appended as is.
    let mut existing = parts.len();
    loop {
        let candidate: PathBuf = parts[..existing]
            .iter()
            .fold(workspace.to_path_buf(), |acc, part| acc.join(part));
        match std::fs::symlink_metadata(&candidate) {
            Ok(_) => {
                let real = match candidate.canonicalize() {
                    Ok(real) => real,
                    // A dangling or looping symlink: where it points is not known to be
                    // inside, so writing through it is refused.
                    Err(err) if err.kind() == ErrorKind::NotFound => {
                        return Err(PathError::Escapes);
                    }
                    Err(_) => return Err(PathError::Unresolvable),
                };
                if !real.starts_with(workspace) {
                    return Err(PathError::Escapes);
                }
                let full = parts[existing..]
                    .iter()
                    .fold(real, |acc, part| acc.join(part));
                let relative = full
                    .strip_prefix(workspace)
                    .map_err(|_| PathError::Escapes)?
                    .to_string_lossy()
                    .into_owned();
                return Ok(Resolved { full, relative });
            }
            Err(err) if err.kind() == ErrorKind::NotFound && existing > 0 => existing -= 1,
            // Not a directory on the way, permission denied, or the workspace itself gone.
            Err(_) if existing > 0 => existing -= 1,
            Err(_) => return Err(PathError::Unresolvable),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::tools::test_support::TempDir;

    #[test]
    fn relative_paths_resolve_inside() {
        let dir = TempDir::new("paths-inside");
        let ws = dir.path();
        std::fs::create_dir(ws.join("a")).unwrap();
        let r = resolve(ws, "a/./b/../c.txt").unwrap();
        assert_eq!(r.full, ws.join("a/c.txt"));
        assert_eq!(r.relative, "a/c.txt");
        let root = resolve(ws, ".").unwrap();
        assert_eq!(root.full, ws);
        assert_eq!(root.relative, "");
        assert_eq!(
            resolve(ws, "new/deep/file").unwrap().relative,
            "new/deep/file"
        );
    }

    #[test]
    fn dot_dot_and_absolute_paths_are_refused() {
        let dir = TempDir::new("paths-escape");
        let ws = dir.path();
        assert_eq!(resolve(ws, "..").unwrap_err(), PathError::Escapes);
        assert_eq!(resolve(ws, "a/../../x").unwrap_err(), PathError::Escapes);
        assert_eq!(resolve(ws, "/etc/passwd").unwrap_err(), PathError::Absolute);
        assert_eq!(resolve(ws, "").unwrap_err(), PathError::Empty);
        assert!(PathError::Absolute.to_string().contains(ESCAPES));
        // Climbing out and back in is fine: the normalized form stays inside.
        assert!(resolve(ws, "a/../b").is_ok());
    }

    #[test]
    fn symlinks_out_of_the_workspace_are_refused() {
        let dir = TempDir::new("paths-symlink");
        let outside = TempDir::new("paths-symlink-outside");
        let ws = dir.path();
        std::fs::write(outside.path().join("secret"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), ws.join("leak")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("missing"), ws.join("dangling")).unwrap();
        assert_eq!(resolve(ws, "out/secret").unwrap_err(), PathError::Escapes);
        assert_eq!(resolve(ws, "out/new/file").unwrap_err(), PathError::Escapes);
        assert_eq!(resolve(ws, "leak").unwrap_err(), PathError::Escapes);
        assert_eq!(resolve(ws, "dangling").unwrap_err(), PathError::Escapes);
        // A symlink that stays inside is followed.
        std::fs::create_dir(ws.join("real")).unwrap();
        std::os::unix::fs::symlink(ws.join("real"), ws.join("alias")).unwrap();
        let r = resolve(ws, "alias/f").unwrap();
        assert_eq!(r.full, ws.join("real/f"));
        assert_eq!(r.relative, "real/f");
    }
}
