//! The bytes of deleted rows. A deleted artifact or workspace snapshot queues its storage
//! key in `blob_garbage` in its own transaction (a trigger); the bytes are deleted here,
//! by whoever deleted the row (at once, L2) and by every replica's sweep (what that
//! missed). A key is forgotten only once its bytes are gone, and deleting an object twice
//! is harmless, so a crash in between costs a second delete, never a leak.

use std::time::Duration;

use super::ArtifactStore;
use store::{Store, bounded};

/// The bound on deleting one object.
const DELETE_BOUND: Duration = Duration::from_secs(10);

/// Deletes the bytes under `keys` and forgets each deleted one; answers how many went. A
/// failure is logged (its class) and left for the sweep.
pub async fn delete_bytes(store: &Store, backend: &dyn ArtifactStore, keys: &[String]) -> usize {
    let mut deleted = 0;
    for key in keys {
        match tokio::time::timeout(DELETE_BOUND, backend.delete(key)).await {
            Ok(Ok(())) => {
                deleted += 1;
                if let Err(err) = bounded(store.forget_blob_garbage(key)).await {
                    tracing::warn!(class = err.metric_label(), "deleted bytes not forgotten");
                }
            }
            Ok(Err(err)) => tracing::warn!(class = err.metric_label(), "bytes not deleted"),
            Err(_) => tracing::warn!(class = "timeout", "bytes not deleted"),
        }
    }
    deleted
}

/// Deletes the bytes of up to `batch` queued keys, oldest first.
pub async fn sweep(store: &Store, backend: &dyn ArtifactStore, batch: i64) {
    match bounded(store.blob_garbage(batch)).await {
        Ok(keys) => {
            delete_bytes(store, backend, &keys).await;
        }
        Err(err) => tracing::warn!(class = err.metric_label(), "blob garbage not read"),
    }
}
