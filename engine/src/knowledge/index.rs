//! The indexer every replica runs (B3): claim queued documents (and those whose claim's
//! lease lapsed: their replica died), index each, write its passages and make it `ready`,
//! or `failed` with the reason.
//!
//! Durable: the job is the document's row. A claim lasts the indexing bound plus
//! [`LEASE_MARGIN`]; a replica killed mid-indexing leaves its claim to lapse, and any
//! replica claims the job again (`Store::claim_knowledge_jobs`). Every write is fenced by
//! the claim's token, so a replica that outlived its lease writes nothing. A job claimed
//! [`MAX_ATTEMPTS`] times fails: a file that kills its indexer is not tried forever.
//!
//! Bounded: at most `BRAIN_KNOWLEDGE_INDEXERS` documents at once on this replica, each
//! within `BRAIN_KNOWLEDGE_INDEX_TIMEOUT_MS`; the text is extracted and cut off the
//! runtime's threads. Logs carry ids, counts and reasons' classes, never text.
//!
//! Embedded (B6): where the team names an `embedding` route, the passages are embedded
//! within what is left of the bound and written with them. An embedding that fails never
//! fails the document: it is indexed by its words alone, with the reason recorded.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::{Format, chunk};
use crate::Engine;
use crate::artifacts::ArtifactError;
use crate::files::extract_text;
use crate::retrieval::{self, Embedder};
use store::{ChunkVectors, ClaimedJob, JobEnd, NewChunk, bounded};

/// A claim outlives the indexing bound by this much, so a live replica writes its end
/// before another may claim the job.
const LEASE_MARGIN: Duration = Duration::from_secs(10);
/// Claims of one job before it fails.
const MAX_ATTEMPTS: i32 = 3;
/// How often a replica looks for jobs nobody woke it for (another replica's uploads,
/// lapsed claims).
const POLL: Duration = Duration::from_secs(1);

/// Runs until `stop`. With no indexers this replica indexes nothing (others do).
pub async fn run(engine: Engine, stop: CancellationToken) {
    let config = engine.config.knowledge;
    if config.indexers == 0 {
        stop.cancelled().await;
        return;
    }
    let slots = Arc::new(Semaphore::new(config.indexers));
    let lease = config.index_timeout + LEASE_MARGIN;
    loop {
        let free = slots.available_permits();
        let mut full_batch = false;
        if free > 0 {
            let claim = engine
                .store
                .claim_knowledge_jobs(free as i64, lease, MAX_ATTEMPTS);
            match bounded(claim).await {
                Ok(jobs) => {
                    full_batch = jobs.len() == free;
                    for job in jobs {
                        let Ok(permit) = slots.clone().try_acquire_owned() else {
                            break;
                        };
                        let engine = engine.clone();
                        tokio::spawn(async move {
                            index(&engine, job).await;
                            drop(permit);
                            engine.knowledge_jobs.notify_one();
                        });
                    }
                }
                Err(e) => tracing::warn!(class = e.metric_label(), "knowledge: claim failed"),
            }
        }
        if full_batch {
            continue;
        }
        tokio::select! {
            // Jobs in flight end with the process; their claims lapse and another replica
            // indexes them.
            () = stop.cancelled() => return,
            // A document was uploaded to this replica, or a slot came free.
            () = engine.knowledge_jobs.notified() => {}
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

/// Indexes one claimed job and writes its end.
async fn index(engine: &Engine, job: ClaimedJob) {
    let timeout = engine.config.knowledge.index_timeout;
    let started = std::time::Instant::now();
    let outcome = match tokio::time::timeout(timeout, passages(engine, &job)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(Failure::Document(format!(
            "indexing took longer than {} s",
            timeout.as_secs()
        ))),
    };
    let ended = match outcome {
        Ok(chunked) => {
            let left = timeout.saturating_sub(started.elapsed());
            let vectors = vectors(engine, &job, &chunked.chunks, left).await;
            let max_chunks = i64::from(engine.config.knowledge.max_chunks);
            let title = chunked.title.as_deref();
            match bounded(engine.store.finish_knowledge_job(
                &job,
                title,
                &chunked.chunks,
                vectors.columns(),
                max_chunks,
            ))
            .await
            {
                Ok(JobEnd::Ready) => Ok(("ready", chunked.chunks.len())),
                Ok(JobEnd::OverChunks) => Ok(("over_chunks", 0)),
                Ok(JobEnd::Lost) => Ok(("lost", 0)),
                Err(e) => Err(e),
            }
        }
        Err(Failure::Document(reason)) => {
            match bounded(engine.store.fail_knowledge_job(&job, &reason)).await {
                Ok(true) => Ok(("failed", 0)),
                Ok(false) => Ok(("lost", 0)),
                Err(e) => Err(e),
            }
        }
        // Left to lapse: another claim tries again (MAX_ATTEMPTS bounds it).
        Err(Failure::Transient(class)) => {
            tracing::warn!(document = %job.document, class, "knowledge: indexing interrupted");
            return;
        }
    };
    match ended {
        Ok((outcome, chunks)) => tracing::info!(
            team = %job.team, document = %job.document, outcome, chunks,
            ms = started.elapsed().as_millis() as u64, "knowledge document indexed"
        ),
        Err(e) => tracing::warn!(
            document = %job.document, class = e.metric_label(),
            "knowledge: the indexing's end was not written"
        ),
    }
}

/// The embeddings of a job's passages (B6), owned.
enum Vectors {
    None,
    Embedded {
        route: String,
        vectors: Vec<Vec<f32>>,
    },
    Failed(String),
}

impl Vectors {
    fn columns(&self) -> ChunkVectors<'_> {
        match self {
            Self::None => ChunkVectors::None,
            Self::Embedded { route, vectors } => ChunkVectors::Embedded {
                model: route,
                vectors,
            },
            Self::Failed(reason) => ChunkVectors::Failed(reason),
        }
    }
}

/// The passages' vectors through the team's `embedding` route (read now), within `left`;
/// none without a route, and the reason when the embedding fails (the document is then
/// indexed by its words alone).
async fn vectors(
    engine: &Engine,
    job: &ClaimedJob,
    chunks: &[NewChunk],
    left: Duration,
) -> Vectors {
    let route = match bounded(engine.store.team_auxiliary_models(job.team)).await {
        Ok(models) => models.embedding,
        Err(e) => {
            return Vectors::Failed(format!(
                "the embedding route could not be read ({})",
                e.metric_label()
            ));
        }
    };
    let Some(route) = route else {
        return Vectors::None;
    };
    let by = Embedder {
        store: &engine.store,
        connections: &engine.connections,
        team: job.team,
        agent: None,
        key: format!("knowledge:{}:{}", job.document, job.claim),
    };
    // The heading path tells the model what a passage is about, as it does the ranking.
    let texts: Vec<String> = chunks
        .iter()
        .map(|c| {
            format!("{}\n\n{}", c.heading, c.body)
                .trim_start()
                .to_owned()
        })
        .collect();
    match tokio::time::timeout(left, retrieval::embed(&by, &route, &texts)).await {
        Ok(Ok(vectors)) => Vectors::Embedded { route, vectors },
        Ok(Err(e)) => {
            tracing::info!(document = %job.document, class = e.class(), "knowledge: passages not embedded");
            Vectors::Failed(e.to_string())
        }
        Err(_) => {
            tracing::info!(document = %job.document, class = "timeout", "knowledge: passages not embedded");
            Vectors::Failed("the embedding did not finish within the indexing bound".into())
        }
    }
}

/// Why a job did not produce passages.
enum Failure {
    /// The document itself: it fails with this reason (said to whoever reads it; never
    /// its content).
    Document(String),
    /// The storage or a bound: tried again on another claim.
    Transient(&'static str),
}

/// The job's document read from the artifact store, its text extracted
/// (`files::extract_text`, bounded, off the runtime's threads) and cut into passages.
async fn passages(engine: &Engine, job: &ClaimedJob) -> Result<chunk::Chunked, Failure> {
    let format = Format::of_media_type(&job.media_type)
        .ok_or_else(|| Failure::Document("the document's format is not one indexed".into()))?;
    let bytes = match engine.artifacts.get(&job.storage_key).await {
        Ok(body) => body
            .collect()
            .await
            .map_err(|e| Failure::Transient(e.metric_label()))?,
        Err(ArtifactError::NotFound) => {
            return Err(Failure::Document("the document's bytes are gone".into()));
        }
        Err(e) => return Err(Failure::Transient(e.metric_label())),
    };
    let extracted = extract_text(&job.media_type, bytes)
        .await
        .map_err(|e| Failure::Document(e.to_string()))?;
    let chunked = tokio::task::spawn_blocking(move || cut(format, &extracted.text))
        .await
        .map_err(|_| Failure::Document("the document could not be read".into()))?
        .map_err(Failure::Document)?;
    if chunked.chunks.is_empty() {
        return Err(Failure::Document("the document holds no text".into()));
    }
    Ok(chunked)
}

/// The passages of a document's text in `format`; the reason it cannot be read
/// otherwise.
fn cut(format: Format, text: &str) -> Result<chunk::Chunked, String> {
    match format {
        // HTML's extracted text marks its headings with `#` lines.
        Format::Markdown | Format::Html => Ok(chunk::markdown(text)),
        Format::Text => Ok(chunk::plain(text)),
        // A page break ends a paragraph.
        Format::Pdf => Ok(chunk::plain(&text.replace('\u{c}', "\n\n"))),
        Format::Csv => Ok(chunk::csv(text)),
        Format::Json => {
            let value: serde_json::Value = serde_json::from_str(text)
                .map_err(|_| "the document is not valid JSON".to_owned())?;
            let pretty = serde_json::to_string_pretty(&value)
                .map_err(|_| "the document is not valid JSON".to_owned())?;
            Ok(chunk::plain(&pretty))
        }
    }
}
