//! Search over a team's knowledge (B4): Postgres full-text search of the passages of the
//! named bases, ranked (`ts_rank_cd`, the heading weighing more than the body), each
//! passage with its document, title, heading path and place. The API's search, the
//! `knowledge_search` tool and the automatic recall all come here.

use protocol::TeamId;
use uuid::Uuid;

use super::KnowledgeError;
use store::{Passage, Store, bounded};

/// The longest query, in bytes.
pub const MAX_QUERY_BYTES: usize = Store::MAX_KNOWLEDGE_QUERY_BYTES;
/// The most passages one search answers.
pub const MAX_LIMIT: u32 = 50;

/// The passages of the team's bases `bases` that best match `query`, best first, at most
/// `limit`. A query with no word to search for answers nothing.
pub async fn search(
    store: &Store,
    team: TeamId,
    bases: &[Uuid],
    query: &str,
    limit: u32,
) -> Result<Vec<Passage>, KnowledgeError> {
    let query = query.trim();
    if query.is_empty() || query.len() > MAX_QUERY_BYTES {
        return Err(KnowledgeError::Invalid(format!(
            "query must have 1 to {MAX_QUERY_BYTES} bytes"
        )));
    }
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(KnowledgeError::Invalid(format!(
            "limit must be between 1 and {MAX_LIMIT}"
        )));
    }
    if bases.is_empty() {
        return Ok(Vec::new());
    }
    Ok(bounded(store.search_knowledge(team, bases, query, i64::from(limit))).await?)
}
