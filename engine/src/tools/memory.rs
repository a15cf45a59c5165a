//! `memory_write` / `memory_search`: durable notes per agent (SPEC M2), searched with
//! Postgres full-text search.

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{Tool, ToolCtx, ToolOutput, parse_args, schema_of};
use domain::approvals::RiskClass;
use providers::ToolSpec;

const MAX_NOTE: usize = 10_000;
const SEARCH_LIMIT: i64 = 10;

pub fn tools() -> Vec<Arc<dyn Tool>> {
    vec![Arc::new(MemoryWrite), Arc::new(MemorySearch)]
}

/// Arguments of `memory_write`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    /// The note to remember, self-contained.
    content: String,
}

struct MemoryWrite;

impl Tool for MemoryWrite {
    fn metric_label(&self) -> &'static str {
        "memory_write"
    }

    /// D3: keyed by its call: run again, it answers the note the first run stored.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "memory_write".into(),
            description:
                "Store a note in this agent's long-term memory; it survives every conversation."
                    .into(),
            input_schema: schema_of::<WriteArgs>(),
        }
    }

    fn risk(&self) -> RiskClass {
        RiskClass::Write
    }

    fn writes(&self) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        ctx: &'a ToolCtx,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, ToolOutput> {
        async move {
            let args: WriteArgs = match parse_args(arguments) {
                Ok(args) => args,
                Err(e) => return e,
            };
            let content = args.content.trim();
            if content.is_empty() || content.chars().count() > MAX_NOTE {
                return ToolOutput::error(format!("content must have 1 to {MAX_NOTE} characters"));
            }
            match ctx.store.write_memory(ctx.team, ctx.agent, ctx.chat, content, ctx.call_key()).await {
                Ok(id) => ToolOutput::ok(format!("remembered (note {id})")),
                Err(e) => {
                    tracing::warn!(turn = %ctx.turn, class = e.metric_label(), "memory_write failed");
                    ToolOutput::error("memory is unavailable right now")
                }
            }
        }
        .boxed()
    }
}

/// Arguments of `memory_search`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    /// Words to look for in stored notes.
    query: String,
}

struct MemorySearch;

impl Tool for MemorySearch {
    fn metric_label(&self) -> &'static str {
        "memory_search"
    }

    /// D3: it only reads.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "memory_search".into(),
            description: "Search this agent's long-term memory; returns the best matching notes."
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
            match ctx.store.search_memory(ctx.team, ctx.agent, ctx.chat, &args.query, SEARCH_LIMIT).await {
                Ok(notes) if notes.is_empty() => ToolOutput::ok("no matching notes"),
                Ok(notes) => ToolOutput::ok(notes.iter().map(|n| format!("- {n}")).collect::<Vec<_>>().join("\n")),
                Err(e) => {
                    tracing::warn!(turn = %ctx.turn, class = e.metric_label(), "memory_search failed");
                    ToolOutput::error("memory is unavailable right now")
                }
            }
        }
        .boxed()
    }
}
