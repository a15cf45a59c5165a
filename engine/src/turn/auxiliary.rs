//! Auxiliary routes (T17): which model writes a chat's title or folds its summary, the
//! one-shot model call both make, and the title itself.
//!
//! An agent's `auxiliary_models` name a route per purpose; where the agent names none its
//! team's default serves, and where neither does the agent's own route. The team's default
//! is read when the auxiliary call runs, in the background, so the turn never waits for
//! it. The title is asked for once the chat's first turn has sent its `finish`: from the
//! first user message and the answer's start, bounded in input, output and time, billed as
//! a usage event of the turn, and stored only if the chat has none yet (a person's rename
//! wins over a late generation). A failure leaves the title `null` and is not retried.

use std::time::Duration;

use futures_util::StreamExt;
use protocol::parts::Part;
use protocol::{AgentId, ChatId, TeamId, TurnId};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::history::Counted;
use crate::Engine;
use crate::models::connections::Connections;
use providers::{Message, ModelRequest, ProviderEvent, Usage};
use store::{AuxiliaryModels, ModelCallUsage, Store, TurnBasis};

/// How long a title may take, from its first route to its write.
const TITLE_BOUND: Duration = Duration::from_secs(20);
/// A title is a few words: a small output cap bounds its cost.
const TITLE_MAX_OUTPUT_TOKENS: u32 = 32;
/// How much of the first user message the title model reads.
const QUESTION_CHARS: usize = 1000;
/// How much of the answer's start the title model reads.
const ANSWER_CHARS: usize = 500;
/// The longest title stored, generated or set by a person.
pub const MAX_TITLE_CHARS: usize = 80;

const TITLE_INSTRUCTIONS: &str = "You name conversations. Answer with a short title of \
    two to six words for the conversation below, in its language: no quotes, no trailing \
    period, nothing else.";

/// The route `pick` names among the agent's `own` routes, else among its team's defaults
/// (read now: a background call's one query). `None` when neither names one, or when the
/// team's could not be read (the agent's own route serves then).
pub(super) async fn chosen(
    store: &Store,
    team: TeamId,
    own: Option<&str>,
    pick: impl FnOnce(AuxiliaryModels) -> Option<String>,
) -> Option<String> {
    if let Some(own) = own {
        return Some(own.to_owned());
    }
    match store.team_auxiliary_models(team).await {
        Ok(defaults) => pick(defaults),
        Err(err) => {
            tracing::info!(team = %team, class = err.metric_label(), "team auxiliary routes not read");
            None
        }
    }
}

/// An auxiliary model call of one user message (a summary, a title, an image's
/// description): no tools, no history.
pub(super) struct OneShot<'a> {
    pub system: &'a str,
    pub prompt: String,
    /// Files of the message (the image to describe, T27); empty for text alone.
    pub files: Vec<providers::Attachment>,
    pub max_output_tokens: u32,
    /// What the call is for, in its logs.
    pub what: &'static str,
}

/// The first answer of `routes` to `request`, trying each route in order, with what the
/// answering call used. Reasoning is never part of it: it reaches only the answer text's
/// deltas.
pub(super) async fn one_shot(
    connections: &Connections,
    team: TeamId,
    routes: &[String],
    request: OneShot<'_>,
) -> Option<(String, ModelCallUsage)> {
    let what = request.what;
    for route in routes {
        let resolved = match connections.resolve(team, route).await {
            Ok(resolved) => resolved,
            Err(err) => {
                tracing::info!(
                    what,
                    class = err.class(),
                    "auxiliary model route unresolved"
                );
                continue;
            }
        };
        let call = ModelRequest {
            model: resolved.model.clone(),
            system: request.system.to_owned(),
            messages: vec![if request.files.is_empty() {
                Message::User(request.prompt.clone())
            } else {
                Message::UserFiles {
                    text: request.prompt.clone(),
                    files: request.files.clone(),
                }
            }],
            tools: Default::default(),
            max_output_tokens: request.max_output_tokens,
        };
        let mut stream = match resolved.provider.stream(&call).await {
            Ok(stream) => stream,
            Err(err) => {
                connections.failed(team, resolved.connection, &err);
                tracing::info!(
                    what,
                    class = err.metric_label(),
                    "auxiliary model route failed"
                );
                continue;
            }
        };
        let mut text = String::new();
        let mut usage = Usage::default();
        let mut finished = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(ProviderEvent::TextDelta(delta)) => text.push_str(&delta),
                Ok(ProviderEvent::Usage(u)) => usage.merge(u),
                Ok(ProviderEvent::Finished(_)) => finished = true,
                Ok(_) => {}
                Err(err) => {
                    tracing::info!(
                        what,
                        class = err.metric_label(),
                        "auxiliary model stream failed"
                    );
                    break;
                }
            }
        }
        let call = ModelCallUsage {
            call_index: 0,
            model: route.clone(),
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
        };
        if finished && !text.trim().is_empty() {
            return Some((text.trim().to_owned(), call));
        }
    }
    None
}

/// A chat's title to generate after its first turn; owned, so it outlives the turn.
pub struct Title {
    store: Store,
    holds: crate::hold::Holds,
    connections: Connections,
    tracker: TaskTracker,
    /// Cancelled when the drain gives up on what runs: the title is abandoned with it.
    abandon: CancellationToken,
    team: TeamId,
    agent: AgentId,
    chat: ChatId,
    turn: TurnId,
    user: Option<String>,
    /// The agent's `title` route; `None` takes the team's, else the agent's route.
    own: Option<String>,
    /// The agent's own route: the fallback.
    route: Vec<String>,
    /// The first user message, cut to `QUESTION_CHARS`.
    question: String,
}

impl Title {
    /// The title a turn over `history` owes its chat: only a chat's first turn (the
    /// history is its own user message, nothing summarized) of a chat without a title.
    pub(super) fn for_first_turn(
        state: &Engine,
        basis: &TurnBasis,
        turn: TurnId,
        user: Option<&str>,
        history: &[impl Counted],
        route: &[String],
    ) -> Option<Self> {
        let [first] = history else {
            return None;
        };
        if !state.config.chat_titles {
            return None;
        }
        let first = first.row();
        if first.role != "user" || basis.chat.summary_through != 0 || basis.chat.title.is_some() {
            return None;
        }
        Some(Self {
            store: state.store.clone(),
            holds: state.holds.clone(),
            connections: state.connections.clone(),
            tracker: state.turn_tracker.clone(),
            abandon: state.turns_cancel.clone(),
            team: basis.agent.team_id,
            agent: basis.agent.id,
            chat: basis.chat.id,
            turn,
            user: user.map(str::to_owned),
            own: basis.agent.auxiliary_models.title.clone(),
            route: route.to_vec(),
            question: cut(&text_of(&first.parts), QUESTION_CHARS),
        })
    }

    /// Starts the title's generation beside the turn's end, with `answer` (the stored
    /// answer's start): tracked, so a graceful shutdown waits for it or abandons it.
    pub(super) fn start(self, answer: String) {
        let tracker = self.tracker.clone();
        let abandon = self.abandon.clone();
        let (chat, turn) = (self.chat, self.turn);
        tracker.spawn(async move {
            tokio::select! {
                () = abandon.cancelled() => {
                    tracing::info!(chat = %chat, turn = %turn, class = "shutdown", "title abandoned");
                }
                ended = tokio::time::timeout(TITLE_BOUND, self.run(answer)) => {
                    if ended.is_err() {
                        tracing::info!(chat = %chat, turn = %turn, class = "timeout", "title not generated");
                    }
                }
            }
        });
    }

    async fn run(self, answer: String) {
        let first = chosen(&self.store, self.team, self.own.as_deref(), |d| d.title).await;
        let routes: Vec<String> = first.into_iter().chain(self.route.clone()).collect();
        let request = OneShot {
            system: TITLE_INSTRUCTIONS,
            prompt: format!(
                "User:\n{}\n\nAssistant (start of the answer):\n{answer}",
                self.question
            ),
            files: Vec::new(),
            max_output_tokens: TITLE_MAX_OUTPUT_TOKENS,
            what: "title",
        };
        let Some((text, usage)) = one_shot(&self.connections, self.team, &routes, request).await
        else {
            tracing::info!(chat = %self.chat, class = "no_answer", "title not generated");
            return;
        };
        // Stored before it is billed, so a billing event of the title says its write is
        // done.
        match clean_title(&text) {
            Some(title) => self.store_title(&title).await,
            None => tracing::info!(chat = %self.chat, class = "empty", "title not generated"),
        }
        let key = format!("turn:{}:title", self.turn);
        if let Err(err) = self
            .store
            .record_usage(self.team, self.agent, self.turn, &key, &usage)
            .await
        {
            tracing::warn!(turn = %self.turn, class = err.metric_label(), "title: usage not recorded");
        }
        let tokens = usage.input_tokens.unwrap_or(0) + usage.output_tokens.unwrap_or(0);
        self.holds
            .bill(self.team, self.user.as_deref(), tokens)
            .await;
    }

    /// Stores `title` unless the chat has one by now.
    async fn store_title(&self, title: &str) {
        match self
            .store
            .set_generated_title(self.team, self.chat, title)
            .await
        {
            Ok(true) => tracing::info!(chat = %self.chat, "title generated"),
            Ok(false) => tracing::info!(chat = %self.chat, "chat titled meanwhile; title dropped"),
            Err(err) => {
                tracing::warn!(chat = %self.chat, class = err.metric_label(), "title not stored")
            }
        }
    }
}

/// Checks a person's title for a chat (`PATCH /v1/chats/{id}`): 1 to `MAX_TITLE_CHARS`
/// characters once trimmed, no control characters. The trimmed title.
pub fn validate_title(title: &str) -> Result<String, String> {
    let title = title.trim();
    if title.is_empty() || title.chars().count() > MAX_TITLE_CHARS {
        return Err(format!("title must have 1 to {MAX_TITLE_CHARS} characters"));
    }
    if title.chars().any(char::is_control) {
        return Err("title must not contain control characters".into());
    }
    Ok(title.to_owned())
}

/// The start of an answer, as the title model reads it.
pub(super) fn answer_start(parts: &[Part]) -> String {
    cut(&text_of(parts), ANSWER_CHARS)
}

/// The text parts of a message, joined.
fn text_of(parts: &[Part]) -> String {
    parts
        .iter()
        .filter_map(|part| match part {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// At most `chars` characters of `text`.
fn cut(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

/// A model's answer as a title: its first line, any inline reasoning, quotes, markdown
/// marks and trailing period gone, whitespace collapsed, at most `MAX_TITLE_CHARS`
/// (cut at a word). `None` when nothing is left.
pub fn clean_title(text: &str) -> Option<String> {
    // The adapters split inline reasoning out of the text already (T18); this is the
    // same rule for a text that still holds some.
    let text = providers::strip_inline_reasoning(text);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let line = line.strip_prefix("Title:").unwrap_or(line);
    let marks: &[char] = &['"', '\'', '`', '*', '#', '“', '”', '«', '»', ' '];
    let words: Vec<&str> = line
        .trim_matches(marks)
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect();
    let mut title = String::new();
    for word in words {
        let added = title.chars().count() + usize::from(!title.is_empty()) + word.chars().count();
        if added > MAX_TITLE_CHARS {
            break;
        }
        if !title.is_empty() {
            title.push(' ');
        }
        title.push_str(word);
    }
    let title = title
        .trim_end_matches(['.', '。'])
        .trim_matches(marks)
        .to_owned();
    (!title.is_empty()).then_some(title)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_title_is_one_clean_line_of_bounded_words() {
        assert_eq!(
            clean_title("\"Planning a trip to Lyon.\"\n").as_deref(),
            Some("Planning a trip to Lyon")
        );
        assert_eq!(
            clean_title("<think>the user wants\na title</think>\n\n**Rust   lifetimes**\nmore")
                .as_deref(),
            Some("Rust lifetimes")
        );
        assert_eq!(
            clean_title("Title: Weekly report").as_deref(),
            Some("Weekly report")
        );
        assert_eq!(clean_title(" \n\"\" "), None);
        let long = "word ".repeat(40);
        let title = clean_title(&long).unwrap();
        assert!(title.chars().count() <= MAX_TITLE_CHARS, "{title}");
        assert!(title.ends_with("word"));
        // A word longer than the whole bound leaves nothing rather than half a word.
        assert_eq!(clean_title(&"x".repeat(MAX_TITLE_CHARS + 1)), None);
        // What a model may answer, a person may set.
        assert_eq!(validate_title(&title).as_deref(), Ok(title.as_str()));
    }

    #[test]
    fn a_persons_title_is_trimmed_bounded_and_printable() {
        assert_eq!(validate_title("  Trip  ").as_deref(), Ok("Trip"));
        assert!(validate_title("   ").is_err());
        assert!(validate_title(&"é".repeat(MAX_TITLE_CHARS)).is_ok());
        assert!(validate_title(&"é".repeat(MAX_TITLE_CHARS + 1)).is_err());
        assert!(validate_title("a\nb").is_err());
        assert!(validate_title("a\u{7f}b").is_err());
        assert!(validate_title("a\0b").is_err());
    }
}
