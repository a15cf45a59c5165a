//! Search over a team's knowledge (B4, B6): Postgres full-text search of the passages of
//! the named bases, ranked (`ts_rank_cd`, the heading weighing more than the body), each
//! passage with its document, title, heading path and place; hybrid with the passages'
//! embeddings where the team names an embedding route (`crate::retrieval`). The API's
//! search and the automatic recall come here; the `knowledge_search` tool goes to
//! `retrieval` with the same checks.

use protocol::{AgentId, TeamId};
use uuid::Uuid;

use super::KnowledgeError;
use crate::Engine;
use crate::retrieval::{self, Found, Mode};
use store::Store;

/// The longest query, in bytes.
pub const MAX_QUERY_BYTES: usize = Store::MAX_KNOWLEDGE_QUERY_BYTES;
/// The most passages one search answers.
pub const MAX_LIMIT: u32 = 50;

/// The passages of the team's bases `bases` that best match `query`, best first, at most
/// `limit`, searched for `agent` (whose usage an embedded query is). A query with no word
/// to search for answers nothing.
pub async fn search(
    engine: &Engine,
    team: TeamId,
    agent: Option<AgentId>,
    bases: &[Uuid],
    query: &str,
    limit: u32,
) -> Result<Found, KnowledgeError> {
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
        return Ok(Found {
            passages: Vec::new(),
            mode: Mode::Lexical,
            note: None,
        });
    }
    let (store, connections) = (&engine.store, &engine.connections);
    let limit = limit as usize;
    Ok(retrieval::search(store, connections, team, agent, bases, query, limit).await?)
}
