//! Hybrid retrieval over a team's knowledge (B6): the passages' words and, where the team
//! names an `embedding` route in its settings (`auxiliary_models.embedding`), their
//! meaning.
//!
//! - **Embedding** ([`embed`]): texts go to the route's `/v1/embeddings` in batches of
//!   `providers::embeddings::MAX_BATCH`; each vector is normalised to unit length, so a
//!   dot product is a cosine. Each call is billed as a usage event of the team (and of
//!   the agent a search ran for).
//! - **Search** ([`search`]): without a route, Postgres full-text search alone, as before.
//!   With one, the lexical candidates and the query's embedding are had at once; the
//!   vector candidates are the passages embedded by the same route whose sign bits are
//!   nearest the query's (Hamming distance in Postgres, no extension), re-scored exactly
//!   here against their full vectors; the two lists are fused by reciprocal rank fusion.
//!   A query that cannot be embedded (the route fails or is slow) answers the lexical
//!   passages with a note saying so: search never fails for its vector half.
//!
//! Its own module, beside the knowledge bases: the `knowledge_search` tool searches
//! through it, and `knowledge` sits above the tools in the module graph.

use std::collections::HashMap;
use std::time::Duration;

use protocol::{AgentId, TeamId};
use providers::EmbeddingRequest;
use providers::embeddings::MAX_BATCH;
use store::{ModelCallUsage, Passage, Store, StoreError, bounded, sign_bits, vector_of};
use uuid::Uuid;

use crate::models::connections::Connections;

/// How long a query's embedding may take before the search answers by words alone.
const QUERY_BOUND: Duration = Duration::from_secs(10);
/// Candidates of each list that are fused.
const FUSED: usize = 50;
/// Passages read by Hamming distance and re-scored exactly.
const VECTOR_CANDIDATES: i64 = 200;
/// Reciprocal rank fusion's constant: the usual 60, which keeps one list's top rank
/// from outweighing a passage both lists rank well.
const RRF_K: f32 = 60.0;

/// Why texts were not embedded; its message names no text.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("the embedding route cannot be called ({0})")]
    Route(&'static str),
    #[error("the embedding call failed: {0}")]
    Provider(#[from] providers::ProviderError),
    #[error("the embedding provider answered vectors of different widths")]
    Widths,
}

impl EmbedError {
    /// A bounded label for logs.
    pub fn class(&self) -> &'static str {
        match self {
            Self::Route(class) => class,
            Self::Provider(e) => e.metric_label(),
            Self::Widths => "widths",
        }
    }
}

/// Who an embedding is for: the team, the agent a search runs for, and where its calls'
/// usage events are keyed.
pub struct Embedder<'a> {
    pub store: &'a Store,
    pub connections: &'a Connections,
    pub team: TeamId,
    pub agent: Option<AgentId>,
    /// Each call's usage event is keyed `<key>:<batch>`: a retried write lands once.
    pub key: String,
}

/// The unit vectors of `texts` through `route`, in order, all of one width.
pub async fn embed(
    by: &Embedder<'_>,
    route: &str,
    texts: &[String],
) -> Result<Vec<Vec<f32>>, EmbedError> {
    let resolved = by
        .connections
        .resolve(by.team, route)
        .await
        .map_err(|e| EmbedError::Route(e.class()))?;
    let mut vectors = Vec::with_capacity(texts.len());
    for (batch, inputs) in texts.chunks(MAX_BATCH).enumerate() {
        let request = EmbeddingRequest {
            model: resolved.model.clone(),
            inputs: inputs.to_vec(),
        };
        let answered = match resolved.provider.embed(&request).await {
            Ok(answered) => answered,
            Err(err) => {
                by.connections.failed(by.team, resolved.connection, &err);
                return Err(err.into());
            }
        };
        let usage = ModelCallUsage {
            call_index: 0,
            model: route.to_owned(),
            input_tokens: answered.usage.input_tokens,
            output_tokens: answered.usage.output_tokens,
        };
        let key = format!("{}:{batch}", by.key);
        let recorded = by
            .store
            .record_knowledge_usage(by.team, by.agent, &key, &usage);
        if let Err(e) = bounded(recorded).await {
            tracing::warn!(team = %by.team, class = e.metric_label(), "embedding usage not recorded");
        }
        vectors.extend(answered.vectors.into_iter().map(unit));
    }
    if vectors
        .windows(2)
        .any(|pair| pair[0].len() != pair[1].len())
    {
        return Err(EmbedError::Widths);
    }
    Ok(vectors)
}

/// `vector` scaled to length 1 (a zero vector stays as it is: it is near nothing).
fn unit(mut vector: Vec<f32>) -> Vec<f32> {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
    vector
}

/// How a search found its passages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// By their words alone.
    Lexical,
    /// By their words and their meaning, fused.
    Hybrid,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lexical => "lexical",
            Self::Hybrid => "hybrid",
        }
    }
}

/// What a search answers.
#[derive(Debug)]
pub struct Found {
    /// Best first; a hybrid search's scores are fused ranks, not comparable to a lexical
    /// one's.
    pub passages: Vec<Passage>,
    pub mode: Mode,
    /// Why a search the team meant to be hybrid answered by words alone.
    pub note: Option<String>,
}

/// The passages of the team's bases `bases` that best match `query` (checked by the
/// caller), best first, at most `limit`: see the module's comment.
pub async fn search(
    store: &Store,
    connections: &Connections,
    team: TeamId,
    agent: Option<AgentId>,
    bases: &[Uuid],
    query: &str,
    limit: usize,
) -> Result<Found, StoreError> {
    let lexical = |n: usize| store.search_knowledge(team, bases, query, n as i64);
    let Some(route) = bounded(store.team_auxiliary_models(team)).await?.embedding else {
        return Ok(Found {
            passages: bounded(lexical(limit)).await?,
            mode: Mode::Lexical,
            note: None,
        });
    };
    let by = Embedder {
        store,
        connections,
        team,
        agent,
        key: format!("knowledge:query:{}", Uuid::now_v7()),
    };
    let texts = [query.to_owned()];
    let (words, meant) = tokio::join!(
        bounded(lexical(FUSED.max(limit))),
        tokio::time::timeout(QUERY_BOUND, embed(&by, &route, &texts))
    );
    let words = words?;
    let vector = match meant {
        Ok(Ok(mut vectors)) => vectors.pop(),
        Ok(Err(e)) => {
            tracing::info!(%team, class = e.class(), "knowledge query not embedded");
            return Ok(by_words(words, limit, e.to_string()));
        }
        Err(_) => {
            tracing::info!(%team, class = "timeout", "knowledge query not embedded");
            let reason = format!("the embedding took longer than {} s", QUERY_BOUND.as_secs());
            return Ok(by_words(words, limit, reason));
        }
    };
    let Some(vector) = vector else {
        return Ok(by_words(
            words,
            limit,
            "the embedding answered nothing".into(),
        ));
    };
    let near = bounded(store.knowledge_vector_candidates(
        team,
        bases,
        &route,
        &sign_bits(&vector),
        VECTOR_CANDIDATES,
    ))
    .await?;
    Ok(Found {
        passages: fuse(&words, &rescored(&vector, near), limit),
        mode: Mode::Hybrid,
        note: None,
    })
}

fn by_words(mut words: Vec<Passage>, limit: usize, reason: String) -> Found {
    words.truncate(limit);
    Found {
        passages: words,
        mode: Mode::Lexical,
        note: Some(format!("{reason}: passages matched by their words only")),
    }
}

/// The candidates re-scored by their exact cosine to `query` (both unit vectors), best
/// first, at most [`FUSED`]; those at a cosine of 0 or less share no meaning with the
/// query and are left out.
fn rescored(query: &[f32], candidates: Vec<(Passage, Vec<u8>)>) -> Vec<Passage> {
    let mut scored: Vec<Passage> = candidates
        .into_iter()
        .filter_map(|(mut passage, bytes)| {
            let vector = vector_of(&bytes);
            if vector.len() != query.len() {
                return None;
            }
            passage.score = vector.iter().zip(query).map(|(a, b)| a * b).sum();
            (passage.score > 0.0).then_some(passage)
        })
        .collect();
    scored.sort_by(|a, b| b.score.total_cmp(&a.score));
    scored.truncate(FUSED);
    scored
}

/// Reciprocal rank fusion of two ranked lists: each passage scores the sum over the lists
/// it is in of `1 / (RRF_K + rank)` (rank from 1); best first, ties by document and
/// position, at most `limit`.
fn fuse(lexical: &[Passage], vector: &[Passage], limit: usize) -> Vec<Passage> {
    let mut fused: HashMap<(Uuid, i32), Passage> = HashMap::new();
    for list in [lexical, vector] {
        for (rank, passage) in list.iter().enumerate() {
            let add = 1.0 / (RRF_K + rank as f32 + 1.0);
            fused
                .entry((passage.document_id, passage.position))
                .and_modify(|p| p.score += add)
                .or_insert_with(|| Passage {
                    score: add,
                    ..passage.clone()
                });
        }
    }
    let mut fused: Vec<Passage> = fused.into_values().collect();
    fused.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(a.document_id.cmp(&b.document_id))
            .then(a.position.cmp(&b.position))
    });
    fused.truncate(limit);
    fused
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passage(document: Uuid, position: i32) -> Passage {
        Passage {
            base_id: Uuid::nil(),
            document_id: document,
            filename: "f.md".into(),
            media_type: "text/markdown".into(),
            title: None,
            heading: String::new(),
            position,
            text: String::new(),
            score: 0.0,
        }
    }

    #[test]
    fn a_passage_both_lists_rank_wins_over_one_list_top() {
        let d = Uuid::now_v7();
        let lexical = [passage(d, 0), passage(d, 1), passage(d, 2)];
        let vector = [passage(d, 3), passage(d, 1)];
        let fused: Vec<i32> = fuse(&lexical, &vector, 3)
            .iter()
            .map(|p| p.position)
            .collect();
        // 1 is second in both; 0 and 3 are first in one each (0 before 3 by position).
        assert_eq!(fused, vec![1, 0, 3]);
    }

    #[test]
    fn candidates_are_rescored_exactly_and_unrelated_ones_dropped() {
        let d = Uuid::now_v7();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let query = unit(vec![1.0, 1.0, 0.0]);
        let candidates = vec![
            (passage(d, 0), bytes(&unit(vec![0.0, 0.0, 1.0]))),
            (passage(d, 1), bytes(&unit(vec![1.0, 0.0, 0.0]))),
            (passage(d, 2), bytes(&unit(vec![1.0, 1.0, 0.1]))),
            (passage(d, 3), bytes(&[1.0, 0.0])),
        ];
        let kept: Vec<i32> = rescored(&query, candidates)
            .iter()
            .map(|p| p.position)
            .collect();
        assert_eq!(kept, vec![2, 1]);
    }
}
