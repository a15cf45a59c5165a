//! Workspace snapshots (SPEC W10): pack the workspace at an idle teardown, restore it in
//! the chat's next session before the first dial.
//!
//! A snapshot is a tar stream of the workspace compressed with zstd. Both directions go
//! through the brain with the session token (the worker holds no storage credentials):
//! `PUT /v1/worker/snapshot` when the brain asks (`notifications/agent_runtime/snapshot`),
//! `GET /v1/worker/snapshot` at start. The cap is on the tar stream (about the workspace's
//! size): a workspace over it is reported `over_cap` and nothing is uploaded. An upload
//! the brain refuses as busy (`503`, its replica's bound on uploads at once) is tried
//! again after its `Retry-After`.
//!
//! Packing keeps regular files, directories and symlinks whose target stays inside the
//! workspace; it leaves out what a restore would refuse (a symlink to an absolute path or
//! out of the workspace, such as Chromium's lock links) and what cannot be archived
//! meaningfully (sockets, FIFOs, devices). Unpacking refuses the whole archive at the
//! first entry that is absolute, climbs with `..`, lies beneath a symlink, is a hard link,
//! a symlink leaving the workspace or a special file, or when the tar stream grows past
//! the size the brain recorded: a refused archive leaves the workspace empty of it rather
//! than half-trusted. Where a symlink leads is judged against the tree as restored, links
//! on the way followed (`p -> .` makes `p/q -> ..` the workspace's parent), and every link
//! is judged again once the whole archive is in, since a later link can move an earlier
//! one's target.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use backon::Retryable;
use protocol::channel::CONNECT_PATH;
use protocol::snapshot::{
    SNAPSHOT_PATH, SNAPSHOT_SKIPPED_PATH, SkipReason, SnapshotSkipped, UNPACKED_BYTES_HEADER,
    plain_path,
};

use crate::dial::Identity;

/// zstd's level: fast, most of the ratio (level 3 is zstd's default).
const LEVEL: i32 = 3;
/// The bound on one upload or download.
const TRANSFER_BOUND: Duration = Duration::from_secs(300);
/// The bound on connecting to the brain.
const CONNECT_BOUND: Duration = Duration::from_secs(5);
/// How long an upload is tried again after the brain refused it as busy or could not be
/// reached: within the runtime-manager's wait for the snapshot (120 s by default).
const UPLOAD_RETRY_FOR: Duration = Duration::from_secs(90);
/// The longest wait between two tries, whatever `Retry-After` says.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The workspace's tar stream is larger than the cap.
    #[error("the workspace is over the snapshot cap")]
    OverCap,
    /// An entry a restore must not write (its class, never its path).
    #[error("unsafe archive entry: {0}")]
    Unsafe(&'static str),
    #[error("workspace i/o: {0}")]
    Io(#[from] io::Error),
    #[error("the brain could not be reached")]
    Unreachable,
    #[error("the brain answered {0}")]
    Status(u16),
}

impl SnapshotError {
    pub fn class(&self) -> &'static str {
        match self {
            Self::OverCap => "over_cap",
            Self::Unsafe(_) => "unsafe_entry",
            Self::Io(_) => "io",
            Self::Unreachable => "unreachable",
            Self::Status(_) => "status",
        }
    }
}

/// A packed workspace in a temporary file, removed on drop.
pub struct Packed {
    path: PathBuf,
    /// The tar stream's size.
    pub unpacked_bytes: u64,
    /// The compressed size.
    pub bytes: u64,
}

impl Drop for Packed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Counts what passes through, and fails once more than `limit` has.
struct Capped<T> {
    inner: T,
    count: u64,
    limit: u64,
}

impl<T> Capped<T> {
    fn new(inner: T, limit: u64) -> Self {
        Self {
            inner,
            count: 0,
            limit,
        }
    }

    fn add(&mut self, n: usize) -> io::Result<()> {
        self.count += n as u64;
        if self.count > self.limit {
            return Err(io::Error::other(CapExceeded));
        }
        Ok(())
    }
}

/// The error a [`Capped`] stream fails with, told apart from real i/o errors.
#[derive(Debug)]
struct CapExceeded;

impl std::fmt::Display for CapExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("size cap exceeded")
    }
}

impl std::error::Error for CapExceeded {}

/// Whether `err` comes from a [`Capped`] stream, however deeply the tar crate wrapped it.
fn over_cap(err: &io::Error) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        let inner = e.downcast_ref::<io::Error>().and_then(|io| io.get_ref());
        if e.is::<CapExceeded>() || inner.is_some_and(|i| i.is::<CapExceeded>()) {
            return true;
        }
        next = e.source();
    }
    false
}

impl<W: Write> Write for Capped<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.add(n)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.add(n)?;
        Ok(n)
    }
}

/// How many links one resolution may pass through, as Linux allows (`ELOOP` past it).
const MAX_LINK_HOPS: usize = 40;

/// Whether a symlink in `dir` (relative to `root`) pointing at `target` resolves inside
/// `root`, judged against the tree as it stands: every name on the way that is a symlink
/// on disk is followed, as the kernel would, so a chain of links that each look harmless
/// on their own (`p -> .` and then `p/q -> ..`) is caught. Names that do not exist yet are
/// taken as plain directories. A loop counts as leaving.
fn resolves_inside(root: &Path, dir: &Path, target: &Path) -> bool {
    // The names still to walk, nearest first; `None` is a `..`.
    let mut pending = VecDeque::new();
    if !steps(dir, &mut pending) || !steps(target, &mut pending) {
        return false;
    }
    let mut at = PathBuf::new();
    let mut hops = 0;
    while let Some(step) = pending.pop_front() {
        let Some(name) = step else {
            if !at.pop() {
                return false;
            }
            continue;
        };
        let next = at.join(name);
        let is_link =
            std::fs::symlink_metadata(root.join(&next)).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            at = next;
            continue;
        }
        hops += 1;
        let Ok(link) = std::fs::read_link(root.join(&next)) else {
            return false;
        };
        let mut followed = VecDeque::new();
        if hops > MAX_LINK_HOPS || !steps(&link, &mut followed) {
            return false;
        }
        followed.append(&mut pending);
        pending = followed;
    }
    true
}

/// Appends the names and `..`s of the relative `path` to `steps`; false for an absolute
/// path.
fn steps(path: &Path, steps: &mut VecDeque<Option<OsString>>) -> bool {
    for component in path.components() {
        match component {
            Component::Normal(name) => steps.push_back(Some(name.to_owned())),
            Component::ParentDir => steps.push_back(None),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Whether a name on the way to `path` (relative to `root`) is a symlink on disk.
fn under_a_link(root: &Path, path: &Path) -> bool {
    let mut at = root.to_owned();
    let mut components = path.components().peekable();
    while let Some(component) = components.next() {
        if components.peek().is_none() {
            return false;
        }
        at.push(component);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return true;
        }
    }
    false
}

/// Packs `workspace` into a temporary file under `tmp`, failing with
/// [`SnapshotError::OverCap`] once the tar stream passes `max_bytes`. Blocking.
pub fn pack(workspace: &Path, tmp: &Path, max_bytes: u64) -> Result<Packed, SnapshotError> {
    let path = tmp.join(format!("workspace-snapshot-{}.tar.zst", uuid_like()));
    let file = File::create(&path)?;
    // Removes the file on every early return below.
    let mut packed = Packed {
        path,
        unpacked_bytes: 0,
        bytes: 0,
    };
    let encoder = zstd::stream::write::Encoder::new(BufWriter::new(file), LEVEL)?;
    let mut builder = tar::Builder::new(Capped::new(encoder, max_bytes));
    builder.follow_symlinks(false);
    let added = add_dir(&mut builder, workspace, Path::new(""));
    let finished = added.and_then(|()| builder.into_inner());
    let capped = match finished {
        Ok(capped) => capped,
        Err(err) if over_cap(&err) => return Err(SnapshotError::OverCap),
        Err(err) => return Err(err.into()),
    };
    packed.unpacked_bytes = capped.count;
    let mut file = capped.inner.finish()?;
    file.flush()?;
    packed.bytes = file.get_ref().metadata()?.len();
    Ok(packed)
}

/// A name unique enough for a temporary file of this process.
fn uuid_like() -> String {
    format!("{}-{:x}", std::process::id(), rand::random::<u64>())
}

fn add_dir<W: Write>(
    builder: &mut tar::Builder<W>,
    root: &Path,
    relative: &Path,
) -> io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(root.join(relative))?.collect::<Result<_, _>>()?;
    // A stable order: the same workspace packs to the same stream.
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = relative.join(entry.file_name());
        let full = root.join(&name);
        let kind = entry.file_type()?;
        if kind.is_dir() {
            builder.append_dir(&name, &full)?;
            add_dir(builder, root, &name)?;
        } else if kind.is_file() {
            builder.append_path_with_name(&full, &name)?;
        } else if kind.is_symlink() {
            let target = std::fs::read_link(&full)?;
            if resolves_inside(root, name.parent().unwrap_or(Path::new("")), &target) {
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                header.set_mode(0o777);
                builder.append_link(&mut header, &name, &target)?;
            }
        }
        // Sockets, FIFOs and devices are left out.
    }
    Ok(())
}

/// Unpacks a zstd-compressed tar stream into `workspace`, refusing unsafe entries and a
/// tar stream larger than `max_bytes`. Returns the number of entries written. Blocking.
pub fn unpack(reader: impl Read, workspace: &Path, max_bytes: u64) -> Result<u64, SnapshotError> {
    let decoder = zstd::stream::read::Decoder::new(reader)?;
    let mut archive = tar::Archive::new(Capped::new(decoder, max_bytes));
    archive.set_overwrite(true);
    archive.set_preserve_permissions(false);
    let mut written = 0;
    let mut links = Vec::new();
    let entries = archive.entries().map_err(capped_error)?;
    for entry in entries {
        let mut entry = entry.map_err(capped_error)?;
        let path = entry.path().map_err(capped_error)?.into_owned();
        if !plain_path(&path) {
            return Err(SnapshotError::Unsafe("path"));
        }
        // Packing never descends into a link, so nothing of ours lies beneath one.
        if under_a_link(workspace, &path) {
            return Err(SnapshotError::Unsafe("under_symlink"));
        }
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Directory => {}
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(capped_error)?
                    .ok_or(SnapshotError::Unsafe("symlink"))?;
                let dir = path.parent().unwrap_or(Path::new(""));
                if !resolves_inside(workspace, dir, &target) {
                    return Err(SnapshotError::Unsafe("symlink"));
                }
                links.push((dir.to_owned(), target.into_owned()));
            }
            tar::EntryType::Link => return Err(SnapshotError::Unsafe("hard_link")),
            _ => return Err(SnapshotError::Unsafe("special_file")),
        }
        // `unpack_in` also refuses to write through a symlink that leads outside.
        if !entry.unpack_in(workspace).map_err(capped_error)? {
            return Err(SnapshotError::Unsafe("path"));
        }
        written += 1;
    }
    // A link restored later can change where an earlier one leads (`q -> p/..` before
    // `p -> .`): each is judged again against the whole restored tree.
    if links
        .iter()
        .any(|(dir, target)| !resolves_inside(workspace, dir, target))
    {
        return Err(SnapshotError::Unsafe("symlink"));
    }
    Ok(written)
}

fn capped_error(err: io::Error) -> SnapshotError {
    if over_cap(&err) {
        SnapshotError::OverCap
    } else {
        SnapshotError::Io(err)
    }
}

/// The brain's HTTP URL of `path`, beside the channel endpoint `connect_url`.
pub fn brain_url(connect_url: &str, path: &str) -> String {
    let base = connect_url
        .strip_suffix(CONNECT_PATH)
        .unwrap_or(connect_url);
    let base = if let Some(rest) = base.strip_prefix("wss://") {
        format!("https://{rest}")
    } else if let Some(rest) = base.strip_prefix("ws://") {
        format!("http://{rest}")
    } else {
        base.to_owned()
    };
    format!("{base}{path}")
}

pub(crate) fn client() -> Result<reqwest::Client, SnapshotError> {
    reqwest::Client::builder()
        .connect_timeout(CONNECT_BOUND)
        .timeout(TRANSFER_BOUND)
        .build()
        .map_err(|_| SnapshotError::Unreachable)
}

fn checked(response: reqwest::Response) -> Result<reqwest::Response, SnapshotError> {
    let status = response.status();
    if status.is_success() {
        Ok(response)
    } else {
        Err(SnapshotError::Status(status.as_u16()))
    }
}

/// Packs the workspace and uploads it; over the cap or on failure, tells the brain no
/// snapshot comes. Logs the outcome with sizes and durations only.
pub async fn take(connect_url: &str, identity: &Identity, workspace: PathBuf, max_bytes: u64) {
    let session = identity.session;
    let started = Instant::now();
    let tmp = std::env::temp_dir();
    let packed = tokio::task::spawn_blocking(move || pack(&workspace, &tmp, max_bytes)).await;
    let packed = match packed {
        Ok(result) => result,
        Err(_) => Err(SnapshotError::Io(io::Error::other("packing panicked"))),
    };
    let packed_ms = started.elapsed().as_millis() as u64;
    let outcome = match packed {
        Ok(packed) => upload(connect_url, identity, &packed)
            .await
            .map(|()| packed),
        Err(err) => Err(err),
    };
    match outcome {
        Ok(packed) => tracing::info!(
            %session,
            bytes = packed.bytes,
            unpacked_bytes = packed.unpacked_bytes,
            pack_ms = packed_ms,
            total_ms = started.elapsed().as_millis() as u64,
            "workspace snapshot uploaded"
        ),
        Err(err) => {
            let reason = match err {
                SnapshotError::OverCap => SkipReason::OverCap,
                _ => SkipReason::Failed,
            };
            tracing::warn!(%session, class = err.class(), "workspace snapshot not taken");
            let skipped = client().map(|c| {
                c.post(brain_url(connect_url, SNAPSHOT_SKIPPED_PATH))
                    .bearer_auth(identity.token.expose())
                    .json(&SnapshotSkipped { reason })
                    .send()
            });
            if let Ok(sent) = skipped
                && sent
                    .await
                    .map_err(|_| ())
                    .and_then(|r| checked(r).map_err(|_| ()))
                    .is_err()
            {
                tracing::warn!(%session, "snapshot skip not recorded");
            }
        }
    }
}

/// Uploads `packed`, trying again while the brain answers `503` (its replica takes as
/// many uploads as it may: it says when to come back in `Retry-After`) or cannot be
/// reached, for up to [`UPLOAD_RETRY_FOR`]. Any other answer is final.
async fn upload(
    connect_url: &str,
    identity: &Identity,
    packed: &Packed,
) -> Result<(), SnapshotError> {
    let give_up = Instant::now() + UPLOAD_RETRY_FOR;
    let backoff = std::iter::successors(Some(Duration::from_secs(1)), |backoff| {
        Some((*backoff * 2).min(MAX_RETRY_WAIT))
    });
    let attempt = || async {
        match upload_once(connect_url, identity, packed).await {
            Ok(response) if response.status().is_success() => Ok(()),
            Ok(response) if response.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                let after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse().ok())
                    .map(Duration::from_secs);
                Err((SnapshotError::Status(503), after))
            }
            Ok(response) => Err((SnapshotError::Status(response.status().as_u16()), None)),
            Err(err) => Err((err, None)),
        }
    };
    attempt
        .retry(backoff)
        .sleep(tokio::time::sleep)
        // Any answer but 503 is final; an unreachable brain is tried again.
        .when(|(failure, _)| !matches!(failure, SnapshotError::Status(code) if *code != 503))
        .adjust(|(_, after), backoff| {
            let wait = after.or(backoff)?;
            // Jitter, so uploads refused together do not come back together.
            let wait = wait.min(MAX_RETRY_WAIT)
                + Duration::from_millis(rand::random::<u64>() % (wait.as_millis() as u64 / 4 + 1));
            (Instant::now() + wait <= give_up).then_some(wait)
        })
        .notify(|(failure, _), wait| {
            tracing::info!(
                session = %identity.session,
                class = failure.class(),
                wait_ms = wait.as_millis() as u64,
                "workspace snapshot upload to be tried again"
            );
        })
        .await
        .map_err(|(failure, _)| failure)
}

async fn upload_once(
    connect_url: &str,
    identity: &Identity,
    packed: &Packed,
) -> Result<reqwest::Response, SnapshotError> {
    let file = tokio::fs::File::open(&packed.path).await?;
    let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
    client()?
        .put(brain_url(connect_url, SNAPSHOT_PATH))
        .bearer_auth(identity.token.expose())
        .header(reqwest::header::CONTENT_TYPE, "application/zstd")
        .header(reqwest::header::CONTENT_LENGTH, packed.bytes)
        .header(UNPACKED_BYTES_HEADER, packed.unpacked_bytes)
        .body(body)
        .send()
        .await
        .map_err(|_| SnapshotError::Unreachable)
}

/// Downloads the chat's snapshot, if any, and unpacks it into the workspace. Returns the
/// entries restored (0 when there was nothing).
pub async fn restore(
    connect_url: &str,
    identity: &Identity,
    workspace: &Path,
) -> Result<u64, SnapshotError> {
    let started = Instant::now();
    let response = client()?
        .get(brain_url(connect_url, SNAPSHOT_PATH))
        .bearer_auth(identity.token.expose())
        .send()
        .await
        .map_err(|_| SnapshotError::Unreachable)?;
    let response = checked(response)?;
    if response.status() == reqwest::StatusCode::NO_CONTENT {
        return Ok(0);
    }
    let limit: u64 = response
        .headers()
        .get(UNPACKED_BYTES_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or(SnapshotError::Status(response.status().as_u16()))?;
    // The archive is spooled to a file first: unpacking is blocking work, and the size
    // is known before a byte is written to the workspace.
    let spool = std::env::temp_dir().join(format!("workspace-restore-{}.tar.zst", uuid_like()));
    let downloaded = download(response, &spool).await;
    let unpacked = match downloaded {
        Ok(bytes) => {
            let workspace = workspace.to_owned();
            let path = spool.clone();
            tokio::task::spawn_blocking(move || {
                let file = BufReader::new(File::open(&path)?);
                unpack(file, &workspace, limit)
            })
            .await
            .unwrap_or_else(|_| Err(SnapshotError::Io(io::Error::other("unpacking panicked"))))
            .map(|entries| (entries, bytes))
        }
        Err(err) => Err(err),
    };
    let _ = tokio::fs::remove_file(&spool).await;
    let (entries, bytes) = match unpacked {
        Ok(done) => done,
        Err(err) => {
            // Nothing of a refused or broken archive stays: the session starts empty.
            empty(workspace).await;
            return Err(err);
        }
    };
    tracing::info!(
        session = %identity.session,
        entries,
        bytes,
        restore_ms = started.elapsed().as_millis() as u64,
        "workspace restored"
    );
    Ok(entries)
}

async fn empty(workspace: &Path) {
    let Ok(mut entries) = tokio::fs::read_dir(workspace).await else {
        return;
    };
    while let Ok(Some(entry)) = entries.next_entry().await {
        let path = entry.path();
        let removed = match entry.file_type().await {
            Ok(kind) if kind.is_dir() => tokio::fs::remove_dir_all(&path).await,
            _ => tokio::fs::remove_file(&path).await,
        };
        if removed.is_err() {
            tracing::warn!("a restored entry could not be removed");
        }
    }
}

async fn download(mut response: reqwest::Response, to: &Path) -> Result<u64, SnapshotError> {
    use tokio::io::AsyncWriteExt;
    let mut file = tokio::fs::File::create(to).await?;
    let mut total = 0u64;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|_| SnapshotError::Unreachable)?
    {
        total += chunk.len() as u64;
        file.write_all(&chunk).await?;
    }
    file.flush().await?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::tools::test_support::TempDir;

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        build(&mut builder);
        let tar = builder.into_inner().unwrap();
        zstd::stream::encode_all(&tar[..], LEVEL).unwrap()
    }

    /// A header whose path is written raw, bypassing the tar crate's own checks on the
    /// way in (a hostile archive is not built with them).
    fn raw_entry(
        builder: &mut tar::Builder<Vec<u8>>,
        path: &str,
        kind: tar::EntryType,
        link: Option<&str>,
        data: &[u8],
    ) {
        let mut header = tar::Header::new_gnu();
        {
            let name = &mut header.as_old_mut().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
        }
        if let Some(link) = link {
            let name = &mut header.as_old_mut().linkname;
            name[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        header.set_cksum();
        builder.append(&header, data).unwrap();
    }

    #[test]
    fn a_workspace_packs_and_unpacks_to_the_same_files() {
        let from = TempDir::new("snap-from");
        std::fs::create_dir_all(from.path().join("src/deep")).unwrap();
        std::fs::write(from.path().join("notes.txt"), "remember me").unwrap();
        std::fs::write(from.path().join("src/deep/main.rs"), "fn main() {}").unwrap();
        std::os::unix::fs::symlink("src/deep/main.rs", from.path().join("link")).unwrap();
        // Left out: they would be refused at restore.
        std::os::unix::fs::symlink("/etc/passwd", from.path().join("outside")).unwrap();
        std::os::unix::fs::symlink(".", from.path().join("here")).unwrap();
        std::os::unix::fs::symlink("here/..", from.path().join("above")).unwrap();
        let tmp = TempDir::new("snap-tmp");
        let packed = pack(from.path(), tmp.path(), 1 << 20).unwrap();
        assert!(packed.unpacked_bytes > 0 && packed.bytes > 0);

        let to = TempDir::new("snap-to");
        let file = File::open(&packed.path).unwrap();
        unpack(file, to.path(), packed.unpacked_bytes).unwrap();
        assert_eq!(
            std::fs::read_to_string(to.path().join("notes.txt")).unwrap(),
            "remember me"
        );
        assert_eq!(
            std::fs::read_to_string(to.path().join("src/deep/main.rs")).unwrap(),
            "fn main() {}"
        );
        assert_eq!(
            std::fs::read_link(to.path().join("link")).unwrap(),
            Path::new("src/deep/main.rs")
        );
        assert!(std::fs::symlink_metadata(to.path().join("outside")).is_err());
        assert!(std::fs::symlink_metadata(to.path().join("above")).is_err());
        assert!(std::fs::symlink_metadata(to.path().join("here")).is_ok());
        let path = packed.path.clone();
        drop(packed);
        assert!(!path.exists(), "the temporary archive is removed");
    }

    #[test]
    fn a_workspace_over_the_cap_is_not_packed() {
        let from = TempDir::new("snap-big");
        std::fs::write(from.path().join("big"), vec![7u8; 64 << 10]).unwrap();
        let tmp = TempDir::new("snap-big-tmp");
        assert!(matches!(
            pack(from.path(), tmp.path(), 16 << 10),
            Err(SnapshotError::OverCap)
        ));
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "nothing left behind"
        );
    }

    #[test]
    fn unpack_refuses_entries_that_leave_the_workspace() {
        let cases: [(&str, tar::EntryType, Option<&str>); 6] = [
            ("../escape.txt", tar::EntryType::Regular, None),
            ("a/../../escape.txt", tar::EntryType::Regular, None),
            ("/etc/escape.txt", tar::EntryType::Regular, None),
            ("link", tar::EntryType::Symlink, Some("/etc")),
            ("a/link", tar::EntryType::Symlink, Some("../../etc")),
            ("hard", tar::EntryType::Link, Some("/etc/passwd")),
        ];
        for (path, kind, link) in cases {
            let bytes = archive(|b| raw_entry(b, path, kind, link, b"x"));
            let parent = TempDir::new("snap-evil");
            let workspace = parent.path().join("ws");
            std::fs::create_dir(&workspace).unwrap();
            let result = unpack(&bytes[..], &workspace, 1 << 20);
            assert!(
                matches!(result, Err(SnapshotError::Unsafe(_))),
                "{path} must be refused, got {result:?}"
            );
            assert!(!parent.path().join("escape.txt").exists());
            assert_eq!(std::fs::read_dir(&workspace).unwrap().count(), 0, "{path}");
        }
    }

    /// Whether anything under `workspace` resolves outside it (the kernel's own answer).
    fn escapes(workspace: &Path) -> bool {
        let root = workspace.canonicalize().unwrap();
        let mut stack = vec![workspace.to_owned()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if let Ok(real) = path.canonicalize()
                    && !real.starts_with(&root)
                {
                    return true;
                }
                if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                    stack.push(path);
                }
            }
        }
        false
    }

    /// Links judged each on its own names can still escape once another link they pass
    /// through is restored: `p -> .` makes `p/q -> ..` the workspace's parent.
    #[test]
    fn unpack_refuses_links_that_escape_through_other_links() {
        use tar::EntryType::{Directory as D, Regular as F, Symlink as L};
        let cases: [&[(&str, tar::EntryType, Option<&str>)]; 6] = [
            &[("p", L, Some(".")), ("p/q", L, Some(".."))],
            &[
                ("a", L, Some(".")),
                ("b", L, Some("a")),
                ("b/c", L, Some("..")),
            ],
            &[
                ("d", D, None),
                ("d/l", L, Some("..")),
                ("d/l/m", L, Some("..")),
            ],
            &[("p", L, Some(".")), ("q", L, Some("p/.."))],
            // The link it passes through comes later in the archive.
            &[("q", L, Some("p/../etc")), ("p", L, Some("."))],
            // A regular file written through a link to a directory.
            &[
                ("sub", D, None),
                ("l", L, Some("sub")),
                ("l/f.txt", F, None),
            ],
        ];
        for entries in cases {
            let bytes = archive(|b| {
                for (path, kind, link) in entries {
                    raw_entry(b, path, *kind, *link, b"");
                }
            });
            let parent = TempDir::new("snap-chain");
            let workspace = parent.path().join("ws");
            std::fs::create_dir(&workspace).unwrap();
            let result = unpack(&bytes[..], &workspace, 1 << 20);
            assert!(
                matches!(result, Err(SnapshotError::Unsafe(_))),
                "{entries:?} must be refused, got {result:?}"
            );
        }
    }

    #[test]
    fn unpack_keeps_links_through_links_that_stay_inside() {
        use tar::EntryType::{Directory as D, Symlink as L};
        let bytes = archive(|b| {
            for (path, kind, link) in [
                ("sub", D, None),
                ("sub/up", L, Some("..")),
                ("here", L, Some(".")),
                ("again", L, Some("sub/up/sub")),
            ] {
                raw_entry(b, path, kind, link, b"");
            }
        });
        let workspace = TempDir::new("snap-inside");
        assert_eq!(unpack(&bytes[..], workspace.path(), 1 << 20).unwrap(), 4);
        assert!(!escapes(workspace.path()));
    }

    #[test]
    fn unpack_stops_at_the_recorded_size() {
        let bytes = archive(|b| {
            raw_entry(
                b,
                "big",
                tar::EntryType::Regular,
                None,
                &vec![1u8; 64 << 10],
            )
        });
        let workspace = TempDir::new("snap-bomb");
        let result = unpack(&bytes[..], workspace.path(), 8 << 10);
        assert!(matches!(result, Err(SnapshotError::OverCap)), "{result:?}");
    }

    #[test]
    fn a_symlink_is_judged_from_where_it_sits() {
        let root = TempDir::new("snap-judge");
        let root = root.path();
        assert!(resolves_inside(root, Path::new("a/b"), Path::new("../c")));
        assert!(resolves_inside(root, Path::new("a"), Path::new("../c")));
        assert!(!resolves_inside(root, Path::new(""), Path::new("../c")));
        assert!(!resolves_inside(root, Path::new("a"), Path::new("/a")));
        std::os::unix::fs::symlink(".", root.join("p")).unwrap();
        assert!(!resolves_inside(root, Path::new("p"), Path::new("..")));
        assert!(!resolves_inside(root, Path::new(""), Path::new("p/..")));
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        assert!(!resolves_inside(root, Path::new(""), Path::new("loop")));
    }

    #[test]
    fn the_brain_url_sits_beside_the_channel_endpoint() {
        assert_eq!(
            brain_url(
                "ws://127.0.0.1:8080/prefix/v1/worker/connect",
                SNAPSHOT_PATH
            ),
            "http://127.0.0.1:8080/prefix/v1/worker/snapshot"
        );
        assert_eq!(
            brain_url("wss://brain.example.com/v1/worker/connect", SNAPSHOT_PATH),
            "https://brain.example.com/v1/worker/snapshot"
        );
    }
}
