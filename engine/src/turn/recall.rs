//! Recall (M3): the few memories of the turn's scope most relevant to the user's message,
//! put into the turn's first request without a tool call.
//!
//! The scope is the agent's own memories and the chat owner's (a memory written in an end
//! user's chat is that user's, X1): never another user's. They are ranked by full-text
//! match against the newest user message, then the newest notes fill what is left (a
//! greeting shares no word with "the user's name is Ada", and what the agent knows of the
//! person still matters), within `BRAIN_MEMORY_RECALL_TOKENS`.
//!
//! They go in as a context message just before that user message, not into the system
//! prompt: what changes with each message stays after the stable prefix (system prompt,
//! tools, earlier history) that providers cache, and they are not part of the frozen
//! composition (T3) any more than the history is. Each model call of the turn repeats the
//! first request's messages, so the turn's later calls reuse the same prefix too. A turn
//! taken over recalls again (a note written meanwhile may join).

use protocol::parts::SourceDocument;
use providers::Message;
use store::{KnowledgeRecall, MemoryRecall, Passage, TurnBasis, bounded};

use super::history::{Counted, parts_text};
use crate::Engine;

/// The most notes a prompt recalls, however short.
const MAX_NOTES: i64 = 8;
/// The most of the user's message the query reads: its words rank the notes, and a long
/// paste would only make the query slow.
const MAX_QUERY_CHARS: usize = 2_000;

const HEADING: &str = "Memories recalled for this conversation (notes stored earlier with \
    memory_write; they may be out of date, and memory_search finds others):";

/// The most passages of the agent's knowledge bases a prompt recalls (B5).
const MAX_PASSAGES: u32 = 5;

const PASSAGES_HEADING: &str = "Passages of your knowledge bases that match this message \
    (found by its words; knowledge_search finds others; cite the document you use):";

/// The recalled notes for `window` as one message, or `None` when the agent recalls
/// nothing (turned off, no budget, no memory in scope, or the store failed: a turn never
/// waits on its memories' failure).
pub(super) async fn recalled(
    state: &Engine,
    basis: &TurnBasis,
    window: &[impl Counted],
) -> Option<String> {
    let budget = state.config.memory_recall_tokens;
    if basis.agent.memory_recall == MemoryRecall::Off || budget == 0 {
        return None;
    }
    let query: String = asked(window).chars().take(MAX_QUERY_CHARS).collect();
    let max_chars = budget.saturating_mul(4);
    let notes = match bounded(state.store.recall_memories(
        basis.agent.team_id,
        basis.agent.id,
        basis.chat.created_by.as_deref(),
        &query,
        i64::try_from(max_chars).unwrap_or(i64::MAX),
        MAX_NOTES,
    ))
    .await
    {
        Ok(notes) => notes,
        Err(err) => {
            tracing::warn!(chat = %basis.chat.id, class = err.metric_label(), "memories not recalled");
            return None;
        }
    };
    block(&notes, max_chars)
}

/// The text of the newest user message of `window`.
fn asked(window: &[impl Counted]) -> String {
    window
        .iter()
        .rev()
        .map(Counted::row)
        .find(|row| row.role == "user")
        .map(|row| parts_text(&row.parts))
        .unwrap_or_default()
}

/// B5: the passages of the agent's knowledge bases that best match the newest user
/// message, as one message within `BRAIN_KNOWLEDGE_RECALL_TOKENS`, with the
/// `source-document` part of each passage it holds (the turn streams and keeps them, as a
/// `knowledge_search` call's); `None` when the agent recalls none (turned off, no base, no
/// budget, no match, or the store failed: a turn never waits on its knowledge's failure).
/// Placed as memories are, for the same reasons.
pub(super) async fn passages(
    state: &Engine,
    basis: &TurnBasis,
    window: &[impl Counted],
) -> Option<(String, Vec<SourceDocument>)> {
    let budget = state.config.knowledge.recall_tokens;
    let agent = &basis.agent;
    if agent.knowledge_recall == KnowledgeRecall::Off
        || agent.knowledge_bases.is_empty()
        || budget == 0
    {
        return None;
    }
    // The search reads at most its longest query: the message's first words.
    let mut query = String::new();
    for c in asked(window).chars() {
        if query.len() + c.len_utf8() > crate::knowledge::search::MAX_QUERY_BYTES {
            break;
        }
        query.push(c);
    }
    if query.trim().is_empty() {
        return None;
    }
    let found = crate::knowledge::search::search(
        state,
        agent.team_id,
        Some(agent.id),
        &agent.knowledge_bases,
        &query,
        MAX_PASSAGES,
    )
    .await;
    match found {
        Ok(found) => passage_block(&found.passages, budget.saturating_mul(4)),
        Err(err) => {
            tracing::warn!(chat = %basis.chat.id, class = err.class(), "knowledge not recalled");
            None
        }
    }
}

/// The passages that fit `max_chars`, best first, each under its source, and their
/// sources; `None` for none.
fn passage_block(passages: &[Passage], max_chars: usize) -> Option<(String, Vec<SourceDocument>)> {
    let mut text = String::from(PASSAGES_HEADING);
    let mut used = 0;
    let mut sources = Vec::new();
    for p in passages {
        let len = p.text.chars().count();
        if used + len > max_chars {
            continue;
        }
        used += len;
        sources.push(p.source());
        let place = if p.heading.is_empty() {
            String::new()
        } else {
            format!(", {}", p.heading)
        };
        text.push_str(&format!(
            "\n\n[{} (document {}, passage {}{place})]\n{}",
            p.filename, p.document_id, p.position, p.text
        ));
    }
    (!sources.is_empty()).then_some((text, sources))
}

/// The notes that fit `max_chars` in their order, under the heading; `None` for none.
fn block(notes: &[String], max_chars: usize) -> Option<String> {
    let mut text = String::from(HEADING);
    let mut used = 0;
    let mut any = false;
    for note in notes {
        let len = note.chars().count();
        if used + len > max_chars {
            continue;
        }
        used += len;
        any = true;
        text.push_str("\n- ");
        text.push_str(note);
    }
    any.then_some(text)
}

/// `messages` with `recalled` just before their last user message (at the end when there
/// is none).
pub(super) fn place(messages: &mut Vec<Message>, recalled: String) {
    let at = messages
        .iter()
        .rposition(|m| matches!(m, Message::User(_) | Message::UserFiles { .. }))
        .unwrap_or(messages.len());
    messages.insert(at, Message::User(recalled));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_keeps_the_notes_that_fit_in_their_order() {
        let notes = vec!["1".repeat(30), "2".repeat(80), "3".repeat(60)];
        let text = block(&notes, 100).unwrap();
        assert!(text.starts_with(HEADING));
        assert!(text.contains(&"1".repeat(30)) && text.contains(&"3".repeat(60)));
        assert!(!text.contains('2'), "the note past the budget is left out");
        assert!(text.find('1') < text.find('3'));
        assert_eq!(block(&["4".repeat(101)], 100), None);
        assert_eq!(block(&[], 100), None);
    }

    #[test]
    fn the_notes_go_just_before_the_last_user_message() {
        let mut messages = vec![
            Message::User("first".into()),
            Message::Assistant {
                text: "answer".into(),
                tool_calls: vec![],
            },
            Message::User("second".into()),
        ];
        place(&mut messages, "notes".into());
        assert!(matches!(&messages[2], Message::User(t) if t == "notes"));
        assert!(matches!(&messages[3], Message::User(t) if t == "second"));
        assert_eq!(messages.len(), 4);
    }
}
