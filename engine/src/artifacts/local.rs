//! [`LocalDirStore`]: artifacts as files under one directory (the embedded default).
//!
//! A key `<team>/<id>` is the file `<root>/<team>/<id>`. A write streams into a temporary
//! file beside its destination, flushes it to disk and renames it into place, so a reader sees
//! the old file, the whole new file, or nothing; never half a file. Temporary files start
//! with `.tmp-` and are never valid keys.

use std::path::{Path, PathBuf};

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio_util::io::ReaderStream;

use super::{ArtifactBody, ArtifactError, ArtifactStore, ByteStream, valid_key};

/// How much of a write is gathered before it goes to the file.
const WRITE_BUFFER: usize = 1 << 20;

/// A temporary file removed on drop unless kept: a write that fails, or whose future is
/// dropped half-way (a request cut off), leaves nothing behind.
struct TempFile(PathBuf);

impl TempFile {
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Files under a root directory, which is created on the first `put`.
#[derive(Clone, Debug)]
pub struct LocalDirStore {
    root: PathBuf,
}

impl LocalDirStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf, ArtifactError> {
        if !valid_key(key) {
            return Err(ArtifactError::InvalidKey);
        }
        Ok(key.split('/').fold(self.root.clone(), |p, s| p.join(s)))
    }

    async fn write(&self, key: &str, mut body: ByteStream) -> Result<u64, ArtifactError> {
        let path = self.path(key)?;
        let dir = path.parent().ok_or(ArtifactError::InvalidKey)?;
        tokio::fs::create_dir_all(dir).await?;
        let tmp = TempFile(dir.join(format!(".tmp-{}", uuid::Uuid::new_v4().simple())));
        let file = tokio::fs::File::create(&tmp.0).await?;
        // Fewer, larger writes: each one is a trip to the blocking pool.
        let mut out = BufWriter::with_capacity(WRITE_BUFFER, file);
        let mut size = 0u64;
        while let Some(piece) = body.next().await {
            let piece = piece?;
            size += piece.len() as u64;
            out.write_all(&piece).await?;
        }
        out.flush().await?;
        let file = out.into_inner();
        // On disk before it becomes visible under its name.
        file.sync_all().await?;
        drop(file);
        tokio::fs::rename(&tmp.0, &path).await?;
        tmp.keep();
        Ok(size)
    }

    async fn open(&self, key: &str) -> Result<ArtifactBody, ArtifactError> {
        let path = self.path(key)?;
        let file = match tokio::fs::File::open(&path).await {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ArtifactError::NotFound);
            }
            Err(e) => return Err(e.into()),
        };
        let size = file.metadata().await?.len();
        let stream = ReaderStream::with_capacity(file, 64 * 1024).map(|r| r.map_err(Into::into));
        Ok(ArtifactBody {
            size,
            stream: Box::pin(stream),
        })
    }

    async fn remove(&self, key: &str) -> Result<(), ArtifactError> {
        let path = self.path(key)?;
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl ArtifactStore for LocalDirStore {
    fn put_stream<'a>(
        &'a self,
        key: &'a str,
        body: ByteStream,
        _content_type: &'a str,
    ) -> BoxFuture<'a, Result<u64, ArtifactError>> {
        // The content type lives in the metadata row only.
        self.write(key, body).boxed()
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ArtifactBody, ArtifactError>> {
        self.open(key).boxed()
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), ArtifactError>> {
        self.remove(key).boxed()
    }

    fn kind(&self) -> &'static str {
        "local"
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn temp_root() -> PathBuf {
        std::env::temp_dir().join(format!("brain-artifacts-{}", uuid::Uuid::new_v4().simple()))
    }

    #[tokio::test]
    async fn put_get_delete_round_trip() {
        let root = temp_root();
        let store = LocalDirStore::new(&root);
        let key = format!("{}/{}", uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        assert!(matches!(
            store.get(&key).await.err(),
            Some(ArtifactError::NotFound)
        ));
        store
            .put(&key, Bytes::from_static(b"hello"), "text/plain")
            .await
            .unwrap();
        store
            .put(&key, Bytes::from_static(b"hello again"), "text/plain")
            .await
            .unwrap();
        let body = store.get(&key).await.unwrap();
        assert_eq!(body.size, 11);
        assert_eq!(&body.collect().await.unwrap()[..], b"hello again");
        // Only the file itself is left in its directory: no temporary file survives.
        let dir = store.path(&key).unwrap().parent().unwrap().to_owned();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        store.delete(&key).await.unwrap();
        store.delete(&key).await.unwrap();
        assert!(matches!(
            store.get(&key).await.err(),
            Some(ArtifactError::NotFound)
        ));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[tokio::test]
    async fn a_body_that_breaks_off_leaves_nothing() {
        let root = temp_root();
        let store = LocalDirStore::new(&root);
        let key = format!("{}/{}", uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let body = futures_util::stream::iter([
            Ok(Bytes::from(vec![1u8; 3 << 20])),
            Err(ArtifactError::Source("cut")),
        ]);
        let result = store.put_stream(&key, Box::pin(body), "x/y").await;
        assert!(
            matches!(result, Err(ArtifactError::Source("cut"))),
            "{result:?}"
        );
        let dir = store.path(&key).unwrap().parent().unwrap().to_owned();
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "no temporary file"
        );
        std::fs::remove_dir_all(root).unwrap();
    }

    #[tokio::test]
    async fn keys_outside_the_root_are_refused() {
        let store = LocalDirStore::new(temp_root());
        for key in ["../escape", "/etc/passwd", "a/../../b"] {
            assert!(matches!(
                store
                    .put(key, Bytes::new(), "text/plain")
                    .await
                    .unwrap_err(),
                ArtifactError::InvalidKey
            ));
            assert!(matches!(
                store.get(key).await.err(),
                Some(ArtifactError::InvalidKey)
            ));
        }
        assert!(!store.root().exists(), "nothing was created");
    }
}
