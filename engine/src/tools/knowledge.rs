//! `knowledge_search`: the passages of the agent's knowledge bases that best match a
//! query (B5), each with its source. Offered only to an agent that names bases; it reads
//! the agent's bases when it runs, so a base deleted or unnamed since is never searched,
//! and the search names the turn's team, so another team's passages never answer.

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{Tool, ToolCtx, ToolOutput, parse_args, schema_of};
use crate::models::connections::Connections;
use crate::retrieval;
use domain::approvals::RiskClass;
use providers::ToolSpec;
use store::{Passage, Store, bounded};

/// Passages a call answers when it names no limit.
const DEFAULT_LIMIT: u32 = 5;
/// The most passages a call answers: each costs the model up to about 300 tokens.
const MAX_LIMIT: u32 = 10;

/// The tool, searching through `connections` where the team names an embedding route
/// (B6).
pub fn tool(connections: Connections) -> Arc<dyn Tool> {
    Arc::new(KnowledgeSearch { connections })
}

/// Arguments of `knowledge_search`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    /// What to look for: words or a question ("a phrase" in quotes, -word to exclude).
    query: String,
    /// How many passages at most (1 to 10, default 5).
    #[serde(default)]
    limit: Option<u32>,
}

struct KnowledgeSearch {
    connections: Connections,
}

impl Tool for KnowledgeSearch {
    fn metric_label(&self) -> &'static str {
        "knowledge_search"
    }

    /// D3: it only reads.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "knowledge_search".into(),
            description: "Search the team's documents this agent may read (its knowledge \
                bases); returns the best matching passages, best first, each with its \
                document's id, filename, title, heading and position. Cite what you use."
                .into(),
            input_schema: schema_of::<SearchArgs>(),
        }
    }

    fn risk(&self) -> RiskClass {
        RiskClass::Read
    }

    fn writes(&self) -> bool {
        false
    }

    fn call<'a>(
        &'a self,
        ctx: &'a ToolCtx,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, ToolOutput> {
        async move {
            let args: SearchArgs = match parse_args(arguments) {
                Ok(args) => args,
                Err(e) => return e,
            };
            let limit = args.limit.unwrap_or(DEFAULT_LIMIT);
            if !(1..=MAX_LIMIT).contains(&limit) {
                return ToolOutput::error(format!("limit must be between 1 and {MAX_LIMIT}"));
            }
            // `retrieval` is searched directly: `knowledge::search` sits above the tools in
            // the engine's module graph (knowledge -> files -> metrics -> tools).
            let query = args.query.trim();
            let max = Store::MAX_KNOWLEDGE_QUERY_BYTES;
            if query.is_empty() || query.len() > max {
                return ToolOutput::error(format!("query must have 1 to {max} bytes"));
            }
            let bases = match bounded(ctx.store.agent(ctx.team, ctx.agent)).await {
                Ok(agent) => agent.knowledge_bases,
                Err(e) => {
                    tracing::warn!(turn = %ctx.turn, class = e.metric_label(), "knowledge_search failed");
                    return ToolOutput::error("knowledge search is unavailable right now");
                }
            };
            if bases.is_empty() {
                return answer(&[], None);
            }
            let (store, connections) = (&ctx.store, &self.connections);
            let (team, agent, limit) = (ctx.team, Some(ctx.agent), limit as usize);
            match retrieval::search(store, connections, team, agent, &bases, query, limit).await {
                Ok(found) => answer(&found.passages, found.note.as_deref()),
                Err(e) => {
                    tracing::warn!(turn = %ctx.turn, class = e.metric_label(), "knowledge_search failed");
                    ToolOutput::error("knowledge search is unavailable right now")
                }
            }
        }
        .boxed()
    }
}

/// The passages as the model reads them, with their sources for the stream and the
/// transcript, and the note of a search that fell back to words alone (B6).
fn answer(passages: &[Passage], note: Option<&str>) -> ToolOutput {
    if passages.is_empty() {
        return ToolOutput::ok(match note {
            Some(note) => format!("no passage matches ({note})"),
            None => "no passage matches".into(),
        });
    }
    let listed: Vec<serde_json::Value> = passages
        .iter()
        .map(|p| {
            json!({
                "source_id": p.source_id(),
                "document_id": p.document_id,
                "filename": p.filename,
                "title": p.title,
                "heading": p.heading,
                "position": p.position,
                "text": p.text,
            })
        })
        .collect();
    ToolOutput {
        sources: passages.iter().map(Passage::source).collect(),
        ..ToolOutput::ok(match note {
            Some(note) => json!({ "passages": listed, "note": note }).to_string(),
            None => json!({ "passages": listed }).to_string(),
        })
    }
}
