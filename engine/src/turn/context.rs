//! Short memory (SPEC M1): what history a model call sees, and folding the rest into the
//! chat's running summary.
//!
//! Each request carries the system prompt, the running summary and the newest messages
//! that fit `BRAIN_CONTEXT_TOKENS`. At wrap-up, when the unsummarized history has outgrown
//! that budget, the older messages are folded into the summary by the summary route in a
//! background task, so the answer never waits for it. The summary records the sequence
//! number it covers and only ever advances over messages it actually summarized: nothing
//! is dropped without being summarized. Until the fold lands, a request may leave out
//! messages that are neither in its window nor yet in the summary (a short, documented
//! gap; a failed fold is retried at the next wrap-up).

use protocol::{AgentId, ChatId, TeamId, TurnId};

use super::auxiliary::{OneShot, one_shot};
use super::history::{Counted, estimate_tokens, model_messages};
use crate::models::connections::Connections;
use providers::{Message, ModelRequest};
use store::{ModelCallUsage, Store};

/// The most a model call of `request` can bill, as a quota reserves it (E2): its input,
/// estimated like history, plus its output cap.
pub fn request_tokens(request: &ModelRequest) -> u64 {
    let text: usize = request
        .messages
        .iter()
        .map(|m| match m {
            Message::User(text) => text.len(),
            Message::UserFiles { text, files } => text.len() + attachments_len(files),
            Message::Assistant { text, tool_calls } => {
                text.len()
                    + tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.len())
                        .sum::<usize>()
            }
            Message::ToolResults(results) => results
                .iter()
                .map(|r| r.content.len() + attachments_len(&r.images))
                .sum(),
        })
        .sum();
    let tools: usize = request
        .tools
        .specs()
        .iter()
        .map(|t| t.name.len() + t.description.len() + estimate_tokens(&t.input_schema) * 4)
        .sum();
    ((request.system.len() + text + tools) / 4) as u64 + u64::from(request.max_output_tokens)
}

/// The estimate of a whole history, which decides whether a wrap-up folds.
pub fn history_tokens(history: &[impl Counted]) -> usize {
    history.iter().map(Counted::tokens).sum()
}

/// The index of the first message of the window: the newest messages that fit `budget`
/// (always at least the newest one), starting at a user message because providers refuse
/// a conversation that opens with the assistant.
pub fn window_start(history: &[impl Counted], budget: usize) -> usize {
    let mut used = 0;
    let mut start = history.len();
    for (index, row) in history.iter().enumerate().rev() {
        let tokens = row.tokens();
        if used + tokens > budget && start < history.len() {
            break;
        }
        used += tokens;
        start = index;
    }
    let fitted = start;
    while start < history.len() && history[start].row().role != "user" {
        start += 1;
    }
    if start == history.len() {
        // Nothing from a user message on fits (an answer longer than the budget): keep the
        // exchange it belongs to rather than an empty window.
        start = history[..fitted]
            .iter()
            .rposition(|m| m.row().role == "user")
            .unwrap_or(fitted);
    }
    start
}

/// What a background fold needs; owned, so it outlives the turn.
pub struct Fold {
    pub store: Store,
    /// The team's quota counters, which count the fold's tokens too (E2).
    pub holds: crate::hold::Holds,
    /// Resolves the summary's routes (T14).
    pub connections: Connections,
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    pub turn: TurnId,
    /// The end user behind the turn, whose budget counters count the fold's tokens too
    /// (L4).
    pub user: Option<String>,
    /// The agent's own route: the fallback of its `summary` route.
    pub route: Vec<String>,
    /// The agent's `summary` route (T17); `None` takes the team's, if it names one.
    pub summary_route: Option<String>,
    /// The chat's title, when this is the chat's first turn (T17): generated after the
    /// answer like the fold, whether or not a fold is needed.
    pub title: Option<super::auxiliary::Title>,
    pub budget: usize,
    pub max_output_tokens: u32,
    /// The estimated tokens of the unsummarized history the turn started from.
    pub unsummarized: usize,
}

const SUMMARY_INSTRUCTIONS: &str = "You keep the running summary of a conversation between a user and an \
    AI agent. Merge the existing summary and the new messages into one concise summary in the third person. \
    Keep facts, names, numbers, decisions, tool results that matter and open tasks; drop pleasantries. \
    Answer with the summary only.";

impl Fold {
    /// Whether the history, grown by an answer of `answer_tokens`, has outgrown the
    /// budget. Decided from what the turn already read, so a turn that needs no fold
    /// (nearly every one) costs no extra read.
    pub fn needed(&self, answer_tokens: usize) -> bool {
        self.unsummarized + answer_tokens > self.budget
    }

    /// Folds what no longer fits into the summary, if anything. Errors are logged; the
    /// next wrap-up tries again.
    pub async fn run(self) {
        let chat = match self.store.chat_with_agent(self.team, self.chat).await {
            Ok(basis) => basis.chat,
            Err(err) => {
                tracing::warn!(chat = %self.chat, class = err.metric_label(), "summary: could not read the chat");
                return;
            }
        };
        let history = match self
            .store
            .messages_after(self.team, self.chat, chat.summary_through)
            .await
        {
            Ok(history) => history,
            Err(err) => {
                tracing::warn!(chat = %self.chat, class = err.metric_label(), "summary: could not read history");
                return;
            }
        };
        let start = window_start(&history, self.budget);
        let Some(last_folded) = start.checked_sub(1).map(|i| history[i].seq) else {
            return;
        };
        let transcript = transcript(&model_messages(
            &history[..start],
            &super::attachments::Files::default(),
        ));
        let prompt = format!(
            "Existing summary:\n{}\n\nNew messages:\n{transcript}",
            if chat.summary.is_empty() {
                "(none)"
            } else {
                &chat.summary
            }
        );
        let Some((summary, usage)) = self.ask(prompt).await else {
            return;
        };
        if let Some(usage) = &usage
            && let Err(err) = self
                .store
                .record_usage(
                    self.team,
                    self.agent,
                    self.turn,
                    &format!("turn:{}:summary", self.turn),
                    usage,
                )
                .await
        {
            tracing::warn!(turn = %self.turn, class = err.metric_label(), "summary: usage not recorded");
        }
        if let Some(usage) = &usage {
            let tokens = usage.input_tokens.unwrap_or(0) + usage.output_tokens.unwrap_or(0);
            self.holds
                .bill(self.team, self.user.as_deref(), tokens)
                .await;
        }
        match self
            .store
            .advance_summary(
                self.team,
                self.chat,
                chat.summary_through,
                last_folded,
                &summary,
            )
            .await
        {
            Ok(true) => tracing::info!(chat = %self.chat, folded = start, "summary advanced"),
            Ok(false) => tracing::info!(chat = %self.chat, "summary moved meanwhile; fold dropped"),
            Err(err) => {
                tracing::warn!(chat = %self.chat, class = err.metric_label(), "summary not stored")
            }
        }
    }

    /// The summary route's answer to `prompt`: the agent's (or its team's) `summary` route
    /// first, then the agent's own route (T17).
    async fn ask(&self, prompt: String) -> Option<(String, Option<ModelCallUsage>)> {
        let first = super::auxiliary::chosen(
            &self.store,
            self.team,
            self.summary_route.as_deref(),
            |defaults| defaults.summary,
        )
        .await;
        let routes: Vec<String> = first.into_iter().chain(self.route.clone()).collect();
        let request = OneShot {
            system: SUMMARY_INSTRUCTIONS,
            prompt,
            files: Vec::new(),
            max_output_tokens: self.max_output_tokens,
            what: "summary",
        };
        one_shot(&self.connections, self.team, &routes, request)
            .await
            .map(|(text, call)| (text, Some(call)))
    }
}

/// Attachments in the characters of text they weigh like (four to a token, as
/// everywhere here), by [`providers::Attachment::estimated_tokens`].
fn attachments_len(files: &[providers::Attachment]) -> usize {
    files.iter().map(|f| f.estimated_tokens() * 4).sum()
}

/// Messages as plain text for the summarizer.
fn transcript(messages: &[Message]) -> String {
    let mut out = String::new();
    for message in messages {
        match message {
            Message::User(text) => out.push_str(&format!("user: {text}\n")),
            // The summarizer reads text: a file is named, never inlined.
            Message::UserFiles { text, files } => {
                out.push_str(&format!("user: {text}\n"));
                for file in files {
                    out.push_str(&format!("user attached {}\n", file.filename));
                }
            }
            Message::Assistant { text, tool_calls } => {
                if !text.is_empty() {
                    out.push_str(&format!("assistant: {text}\n"));
                }
                for call in tool_calls {
                    out.push_str(&format!(
                        "assistant called {}({})\n",
                        call.name, call.arguments
                    ));
                }
            }
            Message::ToolResults(results) => {
                for result in results {
                    let kind = if result.is_error { "error" } else { "result" };
                    out.push_str(&format!("tool {kind}: {}\n", result.content));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::parts::Part;
    use protocol::{MessageId, TurnId};
    use store::MessageRow;

    fn row(seq: i64, role: &str, chars: usize) -> MessageRow {
        MessageRow {
            id: MessageId::new(),
            seq,
            turn_id: TurnId::new(),
            role: role.into(),
            parts: vec![Part::Text {
                text: "x".repeat(chars),
            }],
            status: "complete".into(),
            client_message_id: None,
            created_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn a_history_within_the_budget_has_nothing_to_fold() {
        // The wrap-up skips the fold when the estimate fits the budget; that is sound only
        // if such a history's window starts at its first message.
        let history: Vec<_> = (1..=6)
            .map(|i| {
                row(
                    i,
                    if i % 2 == 1 { "user" } else { "assistant" },
                    100 * i as usize,
                )
            })
            .collect();
        let used = history_tokens(&history);
        assert_eq!(window_start(&history, used), 0);
        assert!(window_start(&history, used - 1) > 0);
        // The estimate counts the JSON text without building it.
        assert_eq!(
            estimate_tokens(&history[2].parts),
            serde_json::to_string(&history[2].parts).unwrap().len() / 4 + 4
        );
    }

    #[test]
    fn the_window_keeps_the_newest_that_fit_and_opens_with_a_user_message() {
        let history: Vec<_> = (1..=6)
            .map(|i| row(i, if i % 2 == 1 { "user" } else { "assistant" }, 400))
            .collect();
        // Each row is ~111 tokens: 250 fits two rows, the newest (assistant) and the user before it.
        assert_eq!(window_start(&history, 250), 4);
        // 350 fits three rows, but the third from the end is an assistant message.
        assert_eq!(window_start(&history, 350), 4);
        assert_eq!(window_start(&history, 100_000), 0);
        // The newest message is kept even when it alone is over budget.
        assert_eq!(window_start(&history[..5], 10), 4);
        // An answer alone over budget keeps the question it answers.
        assert_eq!(window_start(&history, 150), 4);
    }
}
