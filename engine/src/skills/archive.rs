//! A skill's archive read and checked (B8), then packed again for the workspace.
//!
//! An upload is a zip or a tar.gz (told by its first bytes) of one Agent Skills folder:
//! `SKILL.md` at its root, or every entry inside one folder that holds it (then named as
//! the skill). Every entry obeys the snapshot unpacker's rule
//! (`protocol::snapshot::plain_path`: relative, plain names, no `..`); a skill needs no
//! link, so any symlink or hard link is refused, as are devices, FIFOs and the like; the
//! whole archive is refused at the first such entry. Sizes are counted as the bytes come
//! out of the decompressor, never from what a header claims, so a small archive that
//! inflates past the bounds stops there.
//!
//! What is kept is the folder's files packed again as the snapshot format (a tar stream in
//! zstd, regular files only, sorted): the worker unpacks it with the snapshot unpacker.

use std::collections::BTreeMap;
use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use protocol::skills::{MAX_NAME_CHARS, valid_name};
use protocol::snapshot::plain_path;
use serde::Deserialize;
use serde::de::IgnoredAny;
use store::SkillFile;

use crate::config::SkillsConfig;

/// The most bytes of `SKILL.md` (the column's check says the same).
pub const MAX_SKILL_MD_BYTES: usize = 256 << 10;
/// The longest description (the Agent Skills rule), in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
/// The longest `compatibility` (the Agent Skills rule), in characters.
const MAX_COMPATIBILITY_CHARS: usize = 500;
/// zstd's level for the kept folder, as for snapshots.
const LEVEL: i32 = 3;

/// Why an archive was refused; the message says what, never a file's content.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// Not one well-formed skill folder.
    #[error("{0}")]
    Invalid(String),
    /// An entry that could leave the folder, or is no regular file or directory; the class.
    #[error("the archive holds an entry a workspace may not take ({0}): refused whole")]
    Unsafe(&'static str),
    /// Past a size bound; the message says which.
    #[error("{0}")]
    TooLarge(String),
}

/// A checked skill.
#[derive(Debug)]
pub struct Parsed {
    pub name: String,
    pub description: String,
    pub skill_md: String,
    /// Every file, by path.
    pub files: Vec<SkillFile>,
    /// The folder as a zstd-compressed tar stream.
    pub packed: Vec<u8>,
    /// The size of that tar stream, the bound the unpacking worker enforces.
    pub unpacked_bytes: u64,
}

/// The front matter of `SKILL.md`: the Agent Skills fields, no others.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FrontMatter {
    name: String,
    description: String,
    #[serde(default)]
    compatibility: Option<String>,
    #[serde(default, rename = "license")]
    _license: Option<IgnoredAny>,
    #[serde(default, rename = "metadata")]
    _metadata: Option<IgnoredAny>,
    #[serde(default, rename = "allowed-tools")]
    _allowed_tools: Option<IgnoredAny>,
}

/// A file read out of the archive.
struct Entry {
    path: PathBuf,
    bytes: Vec<u8>,
    executable: bool,
}

/// The running count of what the archive unpacks to.
struct Budget<'a> {
    limits: &'a SkillsConfig,
    files: usize,
    bytes: u64,
}

impl Budget<'_> {
    /// Reads one file of at most the bounds left out of `reader`.
    fn read(&mut self, path: &Path, reader: impl Read) -> Result<Vec<u8>, ArchiveError> {
        self.files += 1;
        if self.files > self.limits.max_files {
            return Err(ArchiveError::Invalid(format!(
                "a skill holds at most {} files",
                self.limits.max_files
            )));
        }
        let room = self
            .limits
            .max_file_bytes
            .min(self.limits.max_bytes.saturating_sub(self.bytes));
        let mut bytes = Vec::new();
        reader
            .take(room + 1)
            .read_to_end(&mut bytes)
            .map_err(|_| ArchiveError::Invalid("the archive is corrupt".into()))?;
        let size = bytes.len() as u64;
        if size > room {
            return Err(ArchiveError::TooLarge(
                if size > self.limits.max_file_bytes {
                    format!(
                        "{} is larger than {} bytes",
                        path.display(),
                        self.limits.max_file_bytes
                    )
                } else {
                    format!(
                        "the skill's files hold more than {} bytes",
                        self.limits.max_bytes
                    )
                },
            ));
        }
        self.bytes += size;
        Ok(bytes)
    }
}

/// Reads, checks and packs one skill archive. Blocking (decompression).
pub fn parse(archive: &[u8], limits: &SkillsConfig) -> Result<Parsed, ArchiveError> {
    if archive.len() > limits.max_archive_bytes {
        return Err(ArchiveError::TooLarge(format!(
            "the archive is larger than {} bytes",
            limits.max_archive_bytes
        )));
    }
    let mut budget = Budget {
        limits,
        files: 0,
        bytes: 0,
    };
    let entries = if archive.starts_with(b"PK\x03\x04") || archive.starts_with(b"PK\x05\x06") {
        read_zip(archive, &mut budget)?
    } else if archive.starts_with(&[0x1f, 0x8b]) {
        read_tar_gz(archive, &mut budget)?
    } else {
        return Err(ArchiveError::Invalid(
            "the body is neither a zip nor a tar.gz archive".into(),
        ));
    };
    let (folder, entries) = rooted(entries)?;
    let skill_md = entries
        .get(Path::new("SKILL.md"))
        .ok_or_else(|| ArchiveError::Invalid("the folder has no SKILL.md".into()))?;
    let skill_md = String::from_utf8(skill_md.bytes.clone())
        .map_err(|_| ArchiveError::Invalid("SKILL.md is not UTF-8 text".into()))?;
    if skill_md.len() > MAX_SKILL_MD_BYTES {
        return Err(ArchiveError::TooLarge(format!(
            "SKILL.md is larger than {MAX_SKILL_MD_BYTES} bytes"
        )));
    }
    let front = front_matter(&skill_md)?;
    if let Some(folder) = folder
        && folder != front.name
    {
        return Err(ArchiveError::Invalid(format!(
            "the folder {folder:?} is not named as the skill ({:?})",
            front.name
        )));
    }
    let files = entries
        .iter()
        .map(|(path, entry)| SkillFile {
            path: slashed(path),
            size: entry.bytes.len() as u64,
        })
        .collect();
    let (packed, unpacked_bytes) = pack(&entries)?;
    Ok(Parsed {
        name: front.name,
        description: front.description.trim().to_owned(),
        skill_md,
        files,
        packed,
        unpacked_bytes,
    })
}

/// The front matter between the leading `---` lines, checked.
fn front_matter(skill_md: &str) -> Result<FrontMatter, ArchiveError> {
    let text = skill_md.strip_prefix('\u{feff}').unwrap_or(skill_md);
    let missing = || ArchiveError::Invalid("SKILL.md does not open with a --- front matter".into());
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
        .ok_or_else(missing)?;
    let end = rest
        .match_indices("\n---")
        .map(|(at, _)| at)
        .find(|&at| {
            let after = &rest[at + 4..];
            after.is_empty() || after.starts_with('\n') || after.starts_with("\r\n")
        })
        .ok_or_else(missing)?;
    let yaml = &rest[..end];
    let front: FrontMatter = serde_saphyr::from_str(yaml).map_err(|e| {
        // The parser's message may quote the document: only its first line, which names
        // the field or the position.
        let first = e.to_string().lines().next().unwrap_or_default().to_owned();
        ArchiveError::Invalid(format!("SKILL.md's front matter: {first}"))
    })?;
    if !valid_name(&front.name) {
        return Err(ArchiveError::Invalid(format!(
            "name {:?} is no skill name: 1 to {MAX_NAME_CHARS} lowercase letters, digits and \
             single hyphens, not first or last",
            front.name
        )));
    }
    let chars = front.description.trim().chars().count();
    if chars == 0 || chars > MAX_DESCRIPTION_CHARS {
        return Err(ArchiveError::Invalid(format!(
            "description must have 1 to {MAX_DESCRIPTION_CHARS} characters"
        )));
    }
    if front
        .compatibility
        .as_ref()
        .is_some_and(|c| c.chars().count() > MAX_COMPATIBILITY_CHARS)
    {
        return Err(ArchiveError::Invalid(format!(
            "compatibility must have at most {MAX_COMPATIBILITY_CHARS} characters"
        )));
    }
    Ok(front)
}

/// An entry's path checked by the snapshot unpacker's rule, `.` steps dropped.
fn checked_path(raw: &str) -> Result<PathBuf, ArchiveError> {
    let path = Path::new(raw);
    if raw.contains('\0') || raw.contains('\\') || !plain_path(path) {
        return Err(ArchiveError::Unsafe("path"));
    }
    Ok(path.components().collect())
}

fn read_zip(archive: &[u8], budget: &mut Budget<'_>) -> Result<Vec<Entry>, ArchiveError> {
    let corrupt = |_| ArchiveError::Invalid("the zip archive is corrupt".into());
    let mut zip = zip::ZipArchive::new(Cursor::new(archive)).map_err(corrupt)?;
    let mut entries = Vec::new();
    for i in 0..zip.len() {
        let file = zip.by_index(i).map_err(corrupt)?;
        let name = file.name().map_err(corrupt)?.into_owned();
        let path = checked_path(&name)?;
        if file.is_symlink() {
            return Err(ArchiveError::Unsafe("link"));
        }
        if file.is_dir() {
            continue;
        }
        // A Unix mode that is no regular file: a device, a FIFO, a socket.
        let mode = file.unix_mode();
        if mode.is_some_and(|m| m & 0o170000 != 0 && m & 0o170000 != 0o100000) {
            return Err(ArchiveError::Unsafe("special_file"));
        }
        let executable = mode.is_some_and(|m| m & 0o111 != 0);
        let bytes = budget.read(&path, file)?;
        entries.push(Entry {
            path,
            bytes,
            executable,
        });
    }
    Ok(entries)
}

fn read_tar_gz(archive: &[u8], budget: &mut Budget<'_>) -> Result<Vec<Entry>, ArchiveError> {
    let corrupt = |_| ArchiveError::Invalid("the tar.gz archive is corrupt".into());
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    let mut entries = Vec::new();
    for entry in tar.entries().map_err(corrupt)? {
        let entry = entry.map_err(corrupt)?;
        let raw = entry.path_bytes();
        let name = std::str::from_utf8(&raw)
            .map_err(|_| ArchiveError::Invalid("an entry's path is not UTF-8".into()))?
            .to_owned();
        let path = checked_path(&name)?;
        let kind = entry.header().entry_type();
        match kind {
            tar::EntryType::Directory | tar::EntryType::XGlobalHeader => continue,
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            tar::EntryType::Symlink | tar::EntryType::Link => {
                return Err(ArchiveError::Unsafe("link"));
            }
            _ => return Err(ArchiveError::Unsafe("special_file")),
        }
        let executable = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
        let bytes = budget.read(&path, entry)?;
        entries.push(Entry {
            path,
            bytes,
            executable,
        });
    }
    Ok(entries)
}

/// The entries by their path inside the skill's folder, and that folder's name when the
/// archive wraps it in one.
#[allow(clippy::type_complexity)]
fn rooted(entries: Vec<Entry>) -> Result<(Option<String>, BTreeMap<PathBuf, Entry>), ArchiveError> {
    let at_root = entries.iter().any(|e| e.path == Path::new("SKILL.md"));
    let folder = if at_root {
        None
    } else {
        let first = entries
            .first()
            .and_then(|e| e.path.components().next())
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .ok_or_else(|| ArchiveError::Invalid("the archive holds no file".into()))?;
        Some(first)
    };
    let mut by_path = BTreeMap::new();
    for mut entry in entries {
        if let Some(folder) = &folder {
            entry.path = entry
                .path
                .strip_prefix(folder)
                .map(Path::to_path_buf)
                .map_err(|_| {
                    ArchiveError::Invalid(
                        "the archive holds more than one folder and no SKILL.md at its root".into(),
                    )
                })?;
        }
        if entry.path.as_os_str().is_empty() {
            return Err(ArchiveError::Invalid(
                "a file is named as the folder".into(),
            ));
        }
        if by_path.contains_key(&entry.path) {
            return Err(ArchiveError::Invalid(format!(
                "{} is in the archive twice",
                entry.path.display()
            )));
        }
        by_path.insert(entry.path.clone(), entry);
    }
    Ok((folder, by_path))
}

fn slashed(path: &Path) -> String {
    path.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// The files as a tar stream compressed with zstd, and the stream's size.
fn pack(entries: &BTreeMap<PathBuf, Entry>) -> Result<(Vec<u8>, u64), ArchiveError> {
    let failed = |_| ArchiveError::Invalid("the skill could not be packed".into());
    let mut builder = tar::Builder::new(Vec::new());
    for (path, entry) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(entry.bytes.len() as u64);
        header.set_mode(if entry.executable { 0o755 } else { 0o644 });
        builder
            .append_data(&mut header, path, entry.bytes.as_slice())
            .map_err(failed)?;
    }
    let stream = builder.into_inner().map_err(failed)?;
    let packed = zstd::stream::encode_all(stream.as_slice(), LEVEL).map_err(failed)?;
    Ok((packed, stream.len() as u64))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write;

    use super::*;

    fn limits() -> SkillsConfig {
        SkillsConfig {
            max_archive_bytes: 1 << 20,
            max_bytes: 4096,
            max_file_bytes: 2048,
            max_files: 4,
            max_per_team: 10,
        }
    }

    fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, bytes) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            // `append_data` refuses `..`; the raw name is written as an attacker would.
            header.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
            header.set_cksum();
            builder.append(&header, *bytes).unwrap();
        }
        let tar = builder.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        gz.finish().unwrap()
    }

    const MD: &[u8] = b"---\nname: hello\ndescription: Says hello.\n---\n# Hello\nRun it.\n";

    #[test]
    fn a_folder_is_read_and_packed_again() {
        let parsed = parse(
            &tar_gz(&[("hello/SKILL.md", MD), ("hello/scripts/hi.sh", b"echo hi")]),
            &limits(),
        )
        .unwrap();
        assert_eq!(parsed.name, "hello");
        assert_eq!(parsed.description, "Says hello.");
        let paths: Vec<&str> = parsed.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["SKILL.md", "scripts/hi.sh"]);
        let tar = zstd::stream::decode_all(parsed.packed.as_slice()).unwrap();
        assert_eq!(tar.len() as u64, parsed.unpacked_bytes);
    }

    #[test]
    fn escapes_links_and_bounds_are_refused() {
        let escape = parse(&tar_gz(&[("SKILL.md", MD), ("../x", b"x")]), &limits());
        assert!(matches!(escape, Err(ArchiveError::Unsafe("path"))));
        let absolute = parse(&tar_gz(&[("SKILL.md", MD), ("/etc/x", b"x")]), &limits());
        assert!(matches!(absolute, Err(ArchiveError::Unsafe("path"))));
        let big = vec![b'a'; 3000];
        let large = parse(&tar_gz(&[("SKILL.md", MD), ("big", &big)]), &limits());
        assert!(matches!(large, Err(ArchiveError::TooLarge(_))));
        let many: Vec<(String, &[u8])> = (0..5).map(|i| (format!("f{i}"), &b"x"[..])).collect();
        let mut files: Vec<(&str, &[u8])> = many.iter().map(|(p, b)| (p.as_str(), *b)).collect();
        files.push(("SKILL.md", MD));
        assert!(matches!(
            parse(&tar_gz(&files), &limits()),
            Err(ArchiveError::Invalid(_))
        ));
        assert!(matches!(
            parse(b"plain text", &limits()),
            Err(ArchiveError::Invalid(_))
        ));
    }

    #[test]
    fn the_front_matter_is_checked() {
        let bad_name = b"---\nname: Bad_Name\ndescription: x\n---\nbody";
        let unknown = b"---\nname: a\ndescription: x\nextra: 1\n---\nbody";
        let no_front = b"# just a body";
        for md in [&bad_name[..], &unknown[..], &no_front[..]] {
            assert!(matches!(
                parse(&tar_gz(&[("SKILL.md", md)]), &limits()),
                Err(ArchiveError::Invalid(_))
            ));
        }
        let wrong_folder = parse(&tar_gz(&[("other/SKILL.md", MD)]), &limits());
        assert!(matches!(wrong_folder, Err(ArchiveError::Invalid(_))));
        let folded = b"---\nname: a\ndescription: >\n  Two\n  lines.\nlicense: MIT\n---\nbody";
        let parsed = parse(&tar_gz(&[("SKILL.md", folded)]), &limits()).unwrap();
        assert_eq!(parsed.description, "Two lines.");
    }
}
