//! `read_file`, `write_file`, `list_dir`, `edit_file`, and the read half of
//! `upload_artifact`.
//!
//! Each function takes a path already confined by [`super::paths`] and returns the text
//! the model reads, or a [`FileError`] whose text the model reads as a tool error.

use std::io::ErrorKind;
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::output;
use super::paths::Resolved;

/// `read_file` returns at most this much text (head and tail kept).
pub const READ_CAP: usize = 256 * 1024;
/// `list_dir` lists at most this many entries.
pub const LIST_CAP: usize = 1000;
/// `edit_file` edits files up to this size.
pub const EDIT_MAX: u64 = 16 * 1024 * 1024;
/// `upload_artifact` takes files up to this size.
pub const ARTIFACT_MAX: u64 = 25 * 1024 * 1024;

/// A file tool's failure, worded for the model. The variant is the metric label.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    #[error("no such file or directory: {0}")]
    NotFound(String),
    #[error("{0} is a directory")]
    IsDirectory(String),
    #[error("{0} is not a directory")]
    NotDirectory(String),
    #[error("{0} is not a regular file")]
    NotRegular(String),
    #[error("not a text file: {0}")]
    NotText(String),
    #[error("{path} is {size} bytes; {tool} takes files up to {max} bytes")]
    TooLarge {
        path: String,
        size: u64,
        max: u64,
        tool: &'static str,
    },
    #[error("`old` must not be empty")]
    EmptyOld,
    #[error("`old` was not found in {0}; nothing was changed")]
    OldNotFound(String),
    #[error(
        "`old` occurs {count} times in {path}; it must occur exactly once, so include more \
         surrounding text; nothing was changed"
    )]
    OldNotUnique { path: String, count: usize },
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("{0}: {1}")]
    Io(String, &'static str),
}

impl FileError {
    /// A bounded label for logs.
    pub fn class(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::IsDirectory(_) => "is_directory",
            Self::NotDirectory(_) => "not_directory",
            Self::NotRegular(_) => "not_regular",
            Self::NotText(_) => "not_text",
            Self::TooLarge { .. } => "too_large",
            Self::EmptyOld => "empty_old",
            Self::OldNotFound(_) => "old_not_found",
            Self::OldNotUnique { .. } => "old_not_unique",
            Self::PermissionDenied(_) => "permission_denied",
            Self::Io(..) => "io",
        }
    }
}

fn shown(path: &Resolved) -> String {
    if path.relative.is_empty() {
        ".".to_owned()
    } else {
        path.relative.clone()
    }
}

fn io_error(path: &Resolved, err: &std::io::Error) -> FileError {
    let shown = shown(path);
    match err.kind() {
        ErrorKind::NotFound => FileError::NotFound(shown),
        ErrorKind::PermissionDenied => FileError::PermissionDenied(shown),
        ErrorKind::IsADirectory => FileError::IsDirectory(shown),
        ErrorKind::NotADirectory => FileError::NotDirectory(shown),
        ErrorKind::StorageFull => FileError::Io(shown, "no space left on the device"),
        ErrorKind::InvalidData => FileError::NotText(shown),
        _ => FileError::Io(shown, "the file could not be accessed"),
    }
}

/// The metadata of a regular file, or why it is not one.
async fn regular_file(path: &Resolved) -> Result<std::fs::Metadata, FileError> {
    let meta = tokio::fs::metadata(&path.full)
        .await
        .map_err(|err| io_error(path, &err))?;
    if meta.is_dir() {
        return Err(FileError::IsDirectory(shown(path)));
    }
    if !meta.is_file() {
        return Err(FileError::NotRegular(shown(path)));
    }
    Ok(meta)
}

/// Whether `bytes` (possibly cut at the end) look like text: UTF-8 without NUL.
fn is_text(bytes: &[u8], cut_at_end: bool) -> bool {
    if bytes.contains(&0) {
        return false;
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => true,
        Err(err) => cut_at_end && err.error_len().is_none(),
    }
}

pub async fn read_file(path: &Resolved) -> Result<String, FileError> {
    let meta = regular_file(path).await?;
    let size = meta.len();
    if size <= READ_CAP as u64 {
        let bytes = tokio::fs::read(&path.full)
            .await
            .map_err(|err| io_error(path, &err))?;
        if !is_text(&bytes, false) {
            return Err(FileError::NotText(shown(path)));
        }
        return Ok(String::from_utf8_lossy(&bytes).into_owned());
    }
    // Large: read only the head and the tail.
    let half = READ_CAP / 2;
    let mut file = tokio::fs::File::open(&path.full)
        .await
        .map_err(|err| io_error(path, &err))?;
    let mut head = vec![0u8; half];
    file.read_exact(&mut head)
        .await
        .map_err(|err| io_error(path, &err))?;
    if !is_text(&head, true) {
        return Err(FileError::NotText(shown(path)));
    }
    let tail_len = READ_CAP - half;
    file.seek(std::io::SeekFrom::End(-(tail_len as i64)))
        .await
        .map_err(|err| io_error(path, &err))?;
    let mut tail = Vec::with_capacity(tail_len);
    file.read_to_end(&mut tail)
        .await
        .map_err(|err| io_error(path, &err))?;
    if tail.contains(&0) {
        return Err(FileError::NotText(shown(path)));
    }
    let dropped = size.saturating_sub((head.len() + tail.len()) as u64);
    Ok(output::render(&head, dropped, &tail))
}

pub async fn write_file(path: &Resolved, content: &str) -> Result<String, FileError> {
    if path.relative.is_empty() {
        return Err(FileError::IsDirectory(shown(path)));
    }
    if let Some(parent) = path.full.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|err| io_error(path, &err))?;
    }
    if tokio::fs::metadata(&path.full)
        .await
        .is_ok_and(|meta| meta.is_dir())
    {
        return Err(FileError::IsDirectory(shown(path)));
    }
    tokio::fs::write(&path.full, content)
        .await
        .map_err(|err| io_error(path, &err))?;
    Ok(format!("wrote {} bytes to {}", content.len(), shown(path)))
}

pub async fn list_dir(path: &Resolved) -> Result<String, FileError> {
    let meta = tokio::fs::metadata(&path.full)
        .await
        .map_err(|err| io_error(path, &err))?;
    if !meta.is_dir() {
        return Err(FileError::NotDirectory(shown(path)));
    }
    let mut reader = tokio::fs::read_dir(&path.full)
        .await
        .map_err(|err| io_error(path, &err))?;
    let mut entries: Vec<(String, String)> = Vec::new();
    while let Some(entry) = reader
        .next_entry()
        .await
        .map_err(|err| io_error(path, &err))?
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let line = match entry.file_type().await {
            Ok(kind) if kind.is_dir() => format!("{name}/"),
            Ok(kind) if kind.is_symlink() => describe_symlink(&name, &entry.path()).await,
            Ok(kind) if kind.is_file() => match entry.metadata().await {
                Ok(meta) => format!("{name}  {} bytes", meta.len()),
                Err(_) => name.clone(),
            },
            _ => name.clone(),
        };
        entries.push((name, line));
    }
    if entries.is_empty() {
        return Ok(format!("{} is empty", shown(path)));
    }
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let total = entries.len();
    let mut text: String = entries
        .iter()
        .take(LIST_CAP)
        .map(|(_, line)| format!("{line}\n"))
        .collect();
    if total > LIST_CAP {
        text.push_str(&format!(
            "[... {} more entries not shown ({total} in all) ...]\n",
            total - LIST_CAP
        ));
    }
    Ok(text)
}

async fn describe_symlink(name: &str, full: &Path) -> String {
    let target = tokio::fs::read_link(full)
        .await
        .map(|t| t.to_string_lossy().into_owned())
        .unwrap_or_default();
    match tokio::fs::metadata(full).await {
        Ok(meta) if meta.is_dir() => format!("{name}/ -> {target}"),
        _ => format!("{name} -> {target}"),
    }
}

pub async fn edit_file(path: &Resolved, old: &str, new: &str) -> Result<String, FileError> {
    if old.is_empty() {
        return Err(FileError::EmptyOld);
    }
    let meta = regular_file(path).await?;
    if meta.len() > EDIT_MAX {
        return Err(FileError::TooLarge {
            path: shown(path),
            size: meta.len(),
            max: EDIT_MAX,
            tool: "edit_file",
        });
    }
    let bytes = tokio::fs::read(&path.full)
        .await
        .map_err(|err| io_error(path, &err))?;
    if !is_text(&bytes, false) {
        return Err(FileError::NotText(shown(path)));
    }
    let text = String::from_utf8_lossy(&bytes);
    let edited = replace_once(&text, old, new).map_err(|count| match count {
        0 => FileError::OldNotFound(shown(path)),
        count => FileError::OldNotUnique {
            path: shown(path),
            count,
        },
    })?;
    tokio::fs::write(&path.full, edited)
        .await
        .map_err(|err| io_error(path, &err))?;
    Ok(format!("edited {}: replaced 1 occurrence", shown(path)))
}

/// `text` with the one occurrence of `old` replaced, or how many occurrences there are.
/// Overlapping occurrences count: `aa` occurs twice in `aaa`.
pub fn replace_once(text: &str, old: &str, new: &str) -> Result<String, usize> {
    let mut starts = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(old) {
        starts.push(from + at);
        // Step one character, so overlapping occurrences are found too.
        let step = text[from + at..].chars().next().map_or(1, char::len_utf8);
        from += at + step;
        if starts.len() > 1 {
            break;
        }
    }
    match starts.as_slice() {
        [at] => {
            let mut edited = String::with_capacity(text.len() - old.len() + new.len());
            edited.push_str(&text[..*at]);
            edited.push_str(new);
            edited.push_str(&text[at + old.len()..]);
            Ok(edited)
        }
        [] => Err(0),
        _ => Err(count_overlapping(text, old)),
    }
}

fn count_overlapping(text: &str, old: &str) -> usize {
    let mut count = 0;
    let mut from = 0;
    while let Some(at) = text[from..].find(old) {
        count += 1;
        let step = text[from + at..].chars().next().map_or(1, char::len_utf8);
        from += at + step;
    }
    count
}

/// The bytes of a file for `upload_artifact` (at most [`ARTIFACT_MAX`]).
pub async fn read_artifact(path: &Resolved) -> Result<Vec<u8>, FileError> {
    let meta = regular_file(path).await?;
    if meta.len() > ARTIFACT_MAX {
        return Err(FileError::TooLarge {
            path: shown(path),
            size: meta.len(),
            max: ARTIFACT_MAX,
            tool: "upload_artifact",
        });
    }
    let mut file = tokio::fs::File::open(&path.full)
        .await
        .map_err(|err| io_error(path, &err))?;
    // The file may grow between the check and the read: never read past the limit.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    (&mut file)
        .take(ARTIFACT_MAX + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|err| io_error(path, &err))?;
    if bytes.len() as u64 > ARTIFACT_MAX {
        return Err(FileError::TooLarge {
            path: shown(path),
            size: bytes.len() as u64,
            max: ARTIFACT_MAX,
            tool: "upload_artifact",
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::tools::paths::resolve;
    use crate::tools::test_support::TempDir;

    #[test]
    fn edit_replaces_exactly_one_occurrence() {
        assert_eq!(replace_once("a b c", "b", "B").unwrap(), "a B c");
        assert_eq!(replace_once("a b c", "x", "B").unwrap_err(), 0);
        assert_eq!(replace_once("b b b", "b", "B").unwrap_err(), 3);
        // Overlapping occurrences are ambiguous too.
        assert_eq!(replace_once("aaa", "aa", "x").unwrap_err(), 2);
        assert_eq!(replace_once("héllo", "é", "e").unwrap(), "hello");
    }

    #[tokio::test]
    async fn edit_file_says_which_rule_failed() {
        let dir = TempDir::new("files-edit");
        let path = resolve(dir.path(), "f.txt").unwrap();
        write_file(&path, "one two two").await.unwrap();
        let err = edit_file(&path, "three", "3").await.unwrap_err();
        assert_eq!(err, FileError::OldNotFound("f.txt".into()));
        assert!(err.to_string().contains("not found"));
        let err = edit_file(&path, "two", "2").await.unwrap_err();
        assert!(err.to_string().contains("occurs 2 times"), "{err}");
        assert_eq!(
            edit_file(&path, "", "x").await.unwrap_err(),
            FileError::EmptyOld
        );
        edit_file(&path, "one", "1").await.unwrap();
        assert_eq!(read_file(&path).await.unwrap(), "1 two two");
    }

    #[tokio::test]
    async fn read_refuses_binary_and_caps_large_files() {
        let dir = TempDir::new("files-read");
        let bin = resolve(dir.path(), "b.bin").unwrap();
        std::fs::write(&bin.full, [0x89, b'P', b'N', b'G', 0, 1, 2]).unwrap();
        assert_eq!(
            read_file(&bin).await.unwrap_err().to_string(),
            "not a text file: b.bin"
        );
        let big = resolve(dir.path(), "big.txt").unwrap();
        let content = format!("{}{}", "a".repeat(READ_CAP), "b".repeat(1000));
        std::fs::write(&big.full, &content).unwrap();
        let text = read_file(&big).await.unwrap();
        assert!(text.starts_with("aaaa"));
        assert!(text.ends_with("bbbb"));
        assert!(text.contains("[... 1000 bytes truncated ...]"), "marker");
    }

    #[tokio::test]
    async fn list_is_sorted_with_dirs_and_sizes() {
        let dir = TempDir::new("files-list");
        let root = resolve(dir.path(), ".").unwrap();
        assert_eq!(list_dir(&root).await.unwrap(), ". is empty");
        write_file(&resolve(dir.path(), "b.txt").unwrap(), "12345")
            .await
            .unwrap();
        write_file(&resolve(dir.path(), "a/inner.txt").unwrap(), "")
            .await
            .unwrap();
        assert_eq!(list_dir(&root).await.unwrap(), "a/\nb.txt  5 bytes\n");
        let err = list_dir(&resolve(dir.path(), "b.txt").unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.class(), "not_directory");
    }
}
