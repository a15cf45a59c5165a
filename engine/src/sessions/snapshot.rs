//! Workspace snapshots through the brain (SPEC W10): the worker holds no storage
//! credentials, so its packed workspace comes here and goes on to the artifact store.
//!
//! - The runtime-manager asks for a snapshot when it tears a session down for idleness:
//!   the row becomes `terminating` with `snapshot_state = requested`, and a Postgres
//!   `NOTIFY` on [`SNAPSHOT_PG_CHANNEL`] names it. Every replica listens
//!   ([`Sessions::listen_snapshots`]); the one holding the worker's channel sends it
//!   [`SNAPSHOT_NOTIFICATION`]. A notice nobody acts on (no replica holds the channel, or a
//!   listener was reconnecting) ends in `timed_out` on the manager's side.
//! - `PUT /v1/worker/snapshot` ([`store_upload`]): the bytes (zstd of a tar stream), taken
//!   only while the snapshot is `requested` and no larger than the row's
//!   `snapshot_max_bytes`; streamed to the artifact store as they arrive (never held
//!   whole), then recorded (replacing the chat's previous snapshot) in one transaction,
//!   else removed again. [`UploadSlots`] (`crate::slots`) bounds how many run at once on a
//!   replica and per team; one more is refused `503` with `Retry-After` before its body is
//!   read.
//! - `POST /v1/worker/snapshot/skipped` ([`record_skip`]): no snapshot comes, over the
//!   cap (the chat's previous snapshot is dropped) or failed (it is kept).
//! - `GET /v1/worker/snapshot` ([`restorable`]): the worker of a live session downloads
//!   its chat's snapshot before it dials, so the session is ready only once restored. A
//!   pooled worker has dialed long before: the replica binding it to a session whose chat
//!   has a snapshot sends it [`RESTORE_REQUEST`] ([`Sessions::restore_at_bind`]) and the
//!   claim returns once it answered, so the first call finds the files too.
//! - [`sweep`]: deletes snapshots past `BRAIN_SNAPSHOT_RETENTION_HOURS`, then the bytes of
//!   every deleted row (queued by a trigger, so a cascade from an agent is covered too).
//!
//! The routes are `api/worker.rs`'s: each authenticates with the session token, and what is
//! here acts only on the session the token names.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use protocol::SessionId;
use protocol::channel::SessionClaims;
use protocol::snapshot::{
    RESTORE_REQUEST, SNAPSHOT_NOTIFICATION, SNAPSHOT_PG_CHANNEL, SnapshotNotice, SnapshotRequest,
    SnapshotSkipped, SnapshotState, UNPACKED_BYTES_HEADER,
};
use rmcp::model::{ClientNotification, ClientRequest, CustomNotification, CustomRequest};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Sessions;
use super::registry::LiveWorker;
use crate::Engine;
use crate::artifacts::{ArtifactBody, ArtifactError, ArtifactStore, ByteStream};
pub use crate::slots::UploadSlots;
use store::{NewSnapshot, Store, StoreError, bounded};

/// The content type snapshots are stored and sent under.
pub const CONTENT_TYPE: &str = "application/zstd";
/// How long one upload may take to arrive; the manager's own bound is usually shorter.
const UPLOAD_BOUND: Duration = Duration::from_secs(300);
/// How soon a refused upload is worth trying again: about the time one upload takes.
const BUSY_RETRY_AFTER: Duration = Duration::from_secs(2);
/// Rows and objects one sweep pass takes: a backlog drains over several passes.
const SWEEP_BATCH: i64 = 100;
/// How long a listener waits before listening again after its connection failed.
const RELISTEN_AFTER: Duration = Duration::from_secs(1);

fn count(state: &Engine, outcome: &str) {
    state.metrics.snapshots.with_label_values(&[outcome]).inc();
}

/// The most compressed bytes taken for a workspace of `max_bytes`: zstd never grows its
/// input by more than a small fraction.
fn upload_limit(max_bytes: u64) -> usize {
    usize::try_from(max_bytes + max_bytes / 128 + (64 << 10)).unwrap_or(usize::MAX)
}

/// Why an upload's body was cut off ([`ArtifactError::Source`]).
const OVER_LIMIT: &str = "passed its limit";
const BROKE_OFF: &str = "broke off";
const PAST_DEADLINE: &str = "passed its deadline";

/// The request's body as the artifact store reads it, piece by piece: it fails once more
/// than `limit` bytes came, or at `deadline`, so a store never waits on a stalled sender
/// past the upload's bound and cleans up after itself.
fn bounded_body<E>(
    pieces: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
    limit: usize,
    deadline: tokio::time::Instant,
) -> ByteStream {
    let pieces = Box::pin(pieces);
    Box::pin(futures_util::stream::unfold(
        (pieces, 0usize, false),
        move |(mut pieces, mut seen, failed)| async move {
            if failed {
                return None;
            }
            let item = match tokio::time::timeout_at(deadline, pieces.next()).await {
                Ok(None) => return None,
                Ok(Some(Ok(piece))) => {
                    seen += piece.len();
                    if seen > limit {
                        Err(ArtifactError::Source(OVER_LIMIT))
                    } else {
                        Ok(piece)
                    }
                }
                Ok(Some(Err(_))) => Err(ArtifactError::Source(BROKE_OFF)),
                Err(_) => Err(ArtifactError::Source(PAST_DEADLINE)),
            };
            let failed = item.is_err();
            Some((item, (pieces, seen, failed)))
        },
    ))
}

/// What the worker announces of a snapshot upload: the size of the tar stream it packed
/// (`x-snapshot-unpacked-bytes`, required), and the request's `Content-Length` when it gave
/// one.
pub struct Upload {
    pub unpacked: Option<u64>,
    pub announced: Option<u64>,
}

/// Why a worker's snapshot call was refused; the service (`brain::error`) maps it to
/// HTTP.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The session is not in the state the call needs (the message says which).
    #[error("{0}")]
    Conflict(&'static str),
    #[error("{0}")]
    Invalid(String),
    #[error("the snapshot is larger than {0} bytes")]
    TooLarge(usize),
    /// This replica, or the team's share of it, takes as many uploads as it may.
    #[error("too many workspace snapshots are uploading at once")]
    Busy(Duration),
    #[error("object storage unavailable")]
    Storage(#[source] ArtifactError),
    #[error("store unavailable")]
    Store(#[from] StoreError),
}

const NOT_ASKED: &str = "no snapshot is asked of this session";

/// Stores the worker's packed workspace, at an idle teardown: taken only while a snapshot
/// is asked of its session and within the row's cap, streamed to the artifact store, then
/// recorded (replacing the chat's previous snapshot), else removed again.
pub async fn store_upload<E>(
    state: &Engine,
    claims: &SessionClaims,
    upload: Upload,
    body: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
) -> Result<(), SnapshotError> {
    let started = Instant::now();
    let session = claims.sub;
    let target = bounded(state.store.snapshot_target(session))
        .await?
        .filter(|target| target.team == claims.team)
        .ok_or(SnapshotError::Conflict(NOT_ASKED))?;
    // Asked after the lookup, so a session asked for nothing is told so first.
    let unpacked = upload
        .unpacked
        .ok_or_else(|| SnapshotError::Invalid(format!("expected {UNPACKED_BYTES_HEADER}")))?;
    let limit = upload_limit(target.max_bytes);
    if unpacked > target.max_bytes || upload.announced.is_some_and(|n| n > limit as u64) {
        count(state, "refused");
        return Err(SnapshotError::TooLarge(limit));
    }
    let Some(_slot) = state.snapshot_uploads.try_take(target.team) else {
        count(state, "busy");
        return Err(SnapshotError::Busy(BUSY_RETRY_AFTER));
    };
    let id = Uuid::now_v7();
    let storage_key = format!("{}/{id}", target.team.0);
    let body = bounded_body(body, limit, tokio::time::Instant::now() + UPLOAD_BOUND);
    let size = match state
        .artifacts
        .put_stream(&storage_key, body, CONTENT_TYPE)
        .await
    {
        Ok(size) => size,
        Err(ArtifactError::Source(why)) => {
            count(state, "refused");
            tracing::warn!(%session, why, "snapshot upload not stored");
            return Err(if why == OVER_LIMIT {
                SnapshotError::TooLarge(limit)
            } else {
                SnapshotError::Invalid(format!("the snapshot upload {why}"))
            });
        }
        Err(err) => return Err(SnapshotError::Storage(err)),
    };
    let recorded = bounded(state.store.record_snapshot(
        session,
        NewSnapshot {
            id,
            storage_key: storage_key.clone(),
            size_bytes: size,
            unpacked_bytes: unpacked,
        },
    ))
    .await;
    if let Err(err) = recorded {
        // Bytes without a row are never left behind.
        if let Err(e) = state.artifacts.delete(&storage_key).await {
            tracing::warn!(%session, class = e.metric_label(), "unrecorded snapshot bytes not removed");
        }
        count(state, "refused");
        return Err(match err {
            StoreError::Conflict(_) => {
                SnapshotError::Conflict("the teardown stopped waiting for this snapshot")
            }
            other => other.into(),
        });
    }
    count(state, SnapshotState::Stored.as_str());
    tracing::info!(
        %session,
        snapshot = %id,
        bytes = size,
        unpacked_bytes = unpacked,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "workspace snapshot stored"
    );
    Ok(())
}

/// Records that the worker sends no snapshot: over the cap, or it could not pack or upload
/// one.
pub async fn record_skip(
    state: &Engine,
    claims: &SessionClaims,
    skipped: SnapshotSkipped,
) -> Result<(), SnapshotError> {
    let outcome = SnapshotState::from(skipped.reason);
    if !bounded(state.store.skip_snapshot(claims.sub, outcome)).await? {
        return Err(SnapshotError::Conflict(NOT_ASKED));
    }
    count(state, outcome.as_str());
    tracing::info!(session = %claims.sub, outcome = outcome.as_str(), "workspace snapshot skipped");
    Ok(())
}

/// A snapshot for a new session's worker to restore before it dials.
pub struct Restore {
    pub body: ArtifactBody,
    /// What the tar stream unpacks to, which bounds the worker's unpacking.
    pub unpacked_bytes: u64,
}

/// The snapshot of the session's chat, if there is one to restore. A token whose `team`
/// or `agent` claim is not its session's restores nothing: a snapshot goes
/// back only where it came from.
pub async fn restorable(
    state: &Engine,
    claims: &SessionClaims,
) -> Result<Option<Restore>, SnapshotError> {
    let session = claims.sub;
    let lookup = state
        .store
        .restorable_snapshot(session, claims.team, claims.agent);
    let Some(found) = bounded(lookup).await? else {
        return Ok(None);
    };
    let body = match state.artifacts.get(&found.storage_key).await {
        Ok(body) => body,
        Err(ArtifactError::NotFound) => {
            // Its row outlived its bytes (someone emptied the store): start empty.
            tracing::warn!(%session, "snapshot bytes missing; nothing restored");
            return Ok(None);
        }
        Err(err) => return Err(SnapshotError::Storage(err)),
    };
    count(state, "restored");
    tracing::info!(%session, bytes = body.size, "workspace snapshot sent for restore");
    Ok(Some(Restore {
        body,
        unpacked_bytes: found.unpacked_bytes,
    }))
}

impl Sessions {
    /// Has a pooled worker just bound to `session` restore its chat's snapshot, and waits
    /// for it, within the provision timeout (a restore moves up to the profile's cap). A
    /// restore that fails or takes longer leaves the session as a cold start's failed
    /// restore does: it goes on, its workspace as the worker left it (empty on failure).
    pub(super) async fn restore_at_bind(&self, worker: &LiveWorker, session: SessionId) {
        let started = Instant::now();
        let request = ClientRequest::CustomRequest(CustomRequest::new(RESTORE_REQUEST, None));
        let answer = tokio::time::timeout(
            self.config.provision_timeout,
            worker.service.peer().send_request(request),
        )
        .await;
        let outcome = match answer {
            Ok(Ok(_)) => "restored",
            Ok(Err(_)) => "failed",
            Err(_) => "timed_out",
        };
        tracing::info!(
            session = %session,
            outcome,
            restore_ms = started.elapsed().as_millis() as u64,
            "pooled worker's workspace restore"
        );
    }

    /// Listens for the manager's snapshot requests until `stop`, and passes each to the
    /// worker whose channel this replica holds (the others ignore it).
    pub async fn listen_snapshots(self, stop: CancellationToken) {
        loop {
            let listener = async {
                let mut listener =
                    sqlx::postgres::PgListener::connect_with(self.store.direct()).await?;
                listener.listen(SNAPSHOT_PG_CHANNEL).await?;
                Ok::<_, sqlx::Error>(listener)
            };
            let mut listener = tokio::select! {
                () = stop.cancelled() => return,
                listener = tokio::time::timeout(Duration::from_secs(5), listener) => match listener {
                    Ok(Ok(listener)) => listener,
                    _ => {
                        tracing::warn!(error_class = "store", "snapshot listener not connected");
                        tokio::time::sleep(RELISTEN_AFTER).await;
                        continue;
                    }
                },
            };
            loop {
                let notice = tokio::select! {
                    () = stop.cancelled() => return,
                    notice = listener.recv() => notice,
                };
                match notice {
                    Ok(notice) => match serde_json::from_str::<SnapshotNotice>(notice.payload()) {
                        Ok(notice) => self.ask_snapshot(notice).await,
                        Err(_) => tracing::warn!("undecodable snapshot notice ignored"),
                    },
                    Err(_) => {
                        tracing::warn!(
                            error_class = "store",
                            "snapshot listener lost its connection"
                        );
                        tokio::time::sleep(RELISTEN_AFTER).await;
                        break;
                    }
                }
            }
        }
    }

    /// Tells the worker of `notice.session` to pack its workspace, if its channel is here.
    async fn ask_snapshot(&self, notice: SnapshotNotice) {
        let session: SessionId = notice.session;
        let Some(worker) = self.registry.get(session) else {
            return;
        };
        let params = serde_json::to_value(SnapshotRequest {
            max_bytes: notice.max_bytes,
        })
        .ok();
        let notification = CustomNotification::new(SNAPSHOT_NOTIFICATION, params);
        let sent = tokio::time::timeout(
            Duration::from_secs(5),
            worker
                .service
                .peer()
                .send_notification(ClientNotification::CustomNotification(notification)),
        )
        .await;
        match sent {
            Ok(Ok(())) => tracing::info!(%session, "workspace snapshot asked of the worker"),
            _ => tracing::warn!(%session, "snapshot request not delivered"),
        }
    }
}

/// Deletes expired snapshots, and the bytes of deleted snapshots and artifacts (L2), every
/// `interval` until `stop`. Every replica sweeps: a row is deleted once (`SKIP LOCKED`),
/// and deleting an object twice is harmless.
pub async fn sweep(
    store: Store,
    artifacts: std::sync::Arc<dyn ArtifactStore>,
    retention: Duration,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match bounded(store.expire_snapshots(retention, SWEEP_BATCH)).await {
            Ok(0) => {}
            Ok(expired) => tracing::info!(expired, "workspace snapshots past retention deleted"),
            Err(err) => tracing::warn!(class = err.metric_label(), "snapshot expiry failed"),
        }
        crate::artifacts::garbage::sweep(&store, &*artifacts, SWEEP_BATCH).await;
    }
}
