//! `memory_write` / `memory_search`: durable notes per agent (SPEC M2), searched with
//! Postgres full-text search; `chat_search`: the agent's past chats with the same person
//! (M5).

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{Tool, ToolCtx, ToolOutput, parse_args, schema_of};
use domain::approvals::RiskClass;
use providers::ToolSpec;

const SEARCH_LIMIT: i64 = 10;
/// The chats a `chat_search` answers: each costs the model a line of context.
const CHAT_SEARCH_LIMIT: i64 = 5;
/// The longest `chat_search` query, in characters.
const MAX_CHAT_QUERY: usize = 500;

pub fn tools() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(MemoryWrite),
        Arc::new(MemorySearch),
        Arc::new(ChatSearch),
    ]
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
            let content = match crate::memories::validate_note(&args.content) {
                Ok(content) => content,
                Err(problem) => return ToolOutput::error(problem),
            };
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

/// Arguments of `chat_search`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ChatSearchArgs {
    /// Words the past messages hold (all of them; "a phrase" in quotes, -word to exclude).
    query: String,
}

/// The agent's earlier conversations with the person of this chat (its end user, or the
/// key-opened chats when a key opened it), found by their messages: the same scope as
/// memories, so a user's turn never reads another user's chats (X1), and the autostart
/// chat only in an admin's turn.
struct ChatSearch;

impl Tool for ChatSearch {
    fn metric_label(&self) -> &'static str {
        "chat_search"
    }

    /// D3: it only reads.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "chat_search".into(),
            description: "Search your earlier conversations with this person by what was said; \
                returns the matching chats' ids, titles, dates and a snippet, newest first."
                .into(),
            input_schema: schema_of::<ChatSearchArgs>(),
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
            let args: ChatSearchArgs = match parse_args(arguments) {
                Ok(args) => args,
                Err(e) => return e,
            };
            let query = args.query.trim();
            if query.is_empty() || query.chars().count() > MAX_CHAT_QUERY {
                return ToolOutput::error(format!("query must have 1 to {MAX_CHAT_QUERY} characters"));
            }
            let found = store::bounded(ctx.store.search_chats(
                ctx.team,
                ctx.agent,
                store::ChatsOf::SameOwnerAs(ctx.chat),
                ctx.authority.may_change_agent(),
                query,
                None,
                CHAT_SEARCH_LIMIT,
            ))
            .await;
            match found {
                Ok(hits) if hits.is_empty() => ToolOutput::ok("no earlier chat matches"),
                Ok(hits) => ToolOutput::ok(
                    hits.iter()
                        .map(|hit| {
                            format!(
                                "- chat {} \"{}\" ({}): {}",
                                hit.chat.id,
                                hit.chat.title.as_deref().unwrap_or("untitled"),
                                hit.chat.created_at.format("%Y-%m-%d"),
                                hit.snippet
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n"),
                ),
                Err(e) => {
                    tracing::warn!(turn = %ctx.turn, class = e.metric_label(), "chat_search failed");
                    ToolOutput::error("chat search is unavailable right now")
                }
            }
        }
        .boxed()
    }
}
