//! Inline reasoning: open reasoning models (DeepSeek R1, Qwen3, served by vLLM or Ollama
//! without a reasoning parser) write their thinking into the answer text between
//! `<think>` and `</think>`. This stage moves it out of [`ProviderEvent::TextDelta`] into
//! [`ProviderEvent::ReasoningDelta`], so it is never shown, stored or sent back as the
//! answer (T18). Every adapter's stream passes through it (see `sse::decode`).

use std::borrow::Cow;

use super::ProviderEvent;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Splits a stream's text deltas into answer text and reasoning.
///
/// Only a block at the very start of the answer counts as reasoning (leading whitespace
/// aside), so an answer that merely mentions the tag later is left alone. A `</think>`
/// with no opening tag before any other has closed counts too: some chat templates put
/// the opening tag into the prompt, so the model's text starts inside the block.
#[derive(Debug, Default)]
pub(crate) struct InlineReasoning {
    state: State,
    /// Text not emitted yet: what might still turn out to be a tag, or the leading text
    /// until it shows whether it opens a block.
    held: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace or the beginning of `<think>` seen yet.
    #[default]
    Start,
    /// Inside the block.
    Reasoning,
    /// Answer text. `closed`: a block ended (a later `</think>` is plain text);
    /// `trim`: newlines right after the block are still to drop.
    Answer { closed: bool, trim: bool },
}

impl InlineReasoning {
    /// Feeds one decoded event; what may be emitted now goes into `out`, in order.
    pub(crate) fn feed(&mut self, event: ProviderEvent, out: &mut Vec<ProviderEvent>) {
        match event {
            ProviderEvent::TextDelta(text) => self.text(&text, out),
            // Neither ends the text: what is held may still complete a tag.
            ProviderEvent::Usage(_) | ProviderEvent::ReasoningDelta(_) => out.push(event),
            other => {
                self.flush(out);
                out.push(other);
            }
        }
    }

    fn text(&mut self, delta: &str, out: &mut Vec<ProviderEvent>) {
        self.held.push_str(delta);
        loop {
            match self.state {
                State::Start => {
                    let lead = self.held.trim_start();
                    if let Some(rest) = lead.strip_prefix(OPEN) {
                        self.held = rest.to_owned();
                        self.state = State::Reasoning;
                    } else if OPEN.starts_with(lead) {
                        return;
                    } else {
                        self.state = State::Answer {
                            closed: false,
                            trim: false,
                        };
                    }
                }
                State::Reasoning => {
                    if !self.close_block(out, reasoning) {
                        return;
                    }
                }
                State::Answer { closed, trim } => {
                    if trim && !self.trim_newlines() {
                        return;
                    }
                    if closed {
                        emit(out, text, std::mem::take(&mut self.held));
                        return;
                    }
                    if !self.close_block(out, text) {
                        return;
                    }
                }
            }
        }
    }

    /// Looks for `</think>` in what is held: emits what precedes it as reasoning and
    /// switches to the answer (true), or emits all that cannot be part of the tag as
    /// `before_tag` and holds the rest (false).
    fn close_block(
        &mut self,
        out: &mut Vec<ProviderEvent>,
        before_tag: fn(String) -> ProviderEvent,
    ) -> bool {
        if let Some(at) = self.held.find(CLOSE) {
            let rest = self.held.split_off(at + CLOSE.len());
            self.held.truncate(at);
            emit(out, reasoning, std::mem::replace(&mut self.held, rest));
            self.state = State::Answer {
                closed: true,
                trim: true,
            };
            return true;
        }
        let keep = partial_tag(&self.held, CLOSE);
        let rest = self.held.split_off(self.held.len() - keep);
        emit(out, before_tag, std::mem::replace(&mut self.held, rest));
        false
    }

    /// Drops the newlines that follow a block; false while nothing else arrived.
    fn trim_newlines(&mut self) -> bool {
        let trimmed = self.held.trim_start_matches(['\n', '\r']);
        if trimmed.is_empty() {
            self.held.clear();
            return false;
        }
        self.held = trimmed.to_owned();
        if let State::Answer { closed, .. } = self.state {
            self.state = State::Answer {
                closed,
                trim: false,
            };
        }
        true
    }

    /// Emits what is held as what it is so far: the stream ended or moved on to a tool
    /// call, so no tag can complete it any more.
    fn flush(&mut self, out: &mut Vec<ProviderEvent>) {
        if self.held.is_empty() {
            return;
        }
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Reasoning => emit(out, reasoning, held),
            State::Answer { trim: true, .. } => {
                emit(out, text, held.trim_start_matches(['\n', '\r']).to_owned());
            }
            State::Start | State::Answer { .. } => {
                emit(out, text, held);
                self.state = State::Answer {
                    closed: false,
                    trim: false,
                };
            }
        }
    }
}

fn text(delta: String) -> ProviderEvent {
    ProviderEvent::TextDelta(delta)
}

fn reasoning(delta: String) -> ProviderEvent {
    ProviderEvent::ReasoningDelta(delta)
}

fn emit(out: &mut Vec<ProviderEvent>, kind: fn(String) -> ProviderEvent, delta: String) {
    if !delta.is_empty() {
        out.push(kind(delta));
    }
}

/// How many bytes at the end of `held` could be the beginning of `tag`.
fn partial_tag(held: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&len| held.ends_with(&tag[..len]))
        .unwrap_or(0)
}

/// The answer in `text` without its inline reasoning, by the same rules as the stream
/// stage; for texts stored before reasoning was split out.
pub fn strip_inline_reasoning(text: &str) -> Cow<'_, str> {
    if !text.contains(CLOSE) && !text.trim_start().starts_with(OPEN) {
        return Cow::Borrowed(text);
    }
    let mut stage = InlineReasoning::default();
    let mut out = Vec::new();
    stage.text(text, &mut out);
    stage.flush(&mut out);
    Cow::Owned(
        out.into_iter()
            .filter_map(|event| match event {
                ProviderEvent::TextDelta(text) => Some(text),
                _ => None,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StopReason, Usage};

    /// Runs `deltas` through the stage and ends the stream; returns (reasoning, answer)
    /// and the events, with adjacent deltas of one kind joined.
    fn split(deltas: &[&str]) -> (String, String) {
        let mut stage = InlineReasoning::default();
        let mut out = Vec::new();
        for delta in deltas {
            stage.feed(ProviderEvent::TextDelta((*delta).to_owned()), &mut out);
        }
        stage.feed(ProviderEvent::Finished(StopReason::Stop), &mut out);
        assert_eq!(out.last(), Some(&ProviderEvent::Finished(StopReason::Stop)));
        let (mut thought, mut answer) = (String::new(), String::new());
        for event in out {
            match event {
                ProviderEvent::ReasoningDelta(delta) => thought.push_str(&delta),
                ProviderEvent::TextDelta(delta) => answer.push_str(&delta),
                _ => {}
            }
        }
        (thought, answer)
    }

    /// Every way of cutting `whole` into two and three deltas splits the same.
    fn split_all_ways(whole: &str) -> (String, String) {
        let expected = split(&[whole]);
        let bounds: Vec<usize> = (0..=whole.len())
            .filter(|at| whole.is_char_boundary(*at))
            .collect();
        for &a in &bounds {
            assert_eq!(split(&[&whole[..a], &whole[a..]]), expected, "cut at {a}");
            for &b in bounds.iter().filter(|b| **b >= a) {
                let parts = [&whole[..a], &whole[a..b], &whole[b..]];
                assert_eq!(split(&parts), expected, "cut at {a} and {b}");
            }
        }
        let bytewise: Vec<String> = whole.chars().map(String::from).collect();
        let bytewise: Vec<&str> = bytewise.iter().map(String::as_str).collect();
        assert_eq!(split(&bytewise), expected, "char by char");
        expected
    }

    fn pair(thought: &str, answer: &str) -> (String, String) {
        (thought.to_owned(), answer.to_owned())
    }

    #[test]
    fn a_leading_block_is_reasoning_however_it_is_split() {
        assert_eq!(
            split_all_ways("<think>Grüße zählen…</think>\n\nHallo 👋"),
            pair("Grüße zählen…", "Hallo 👋")
        );
        assert_eq!(
            split_all_ways("\n <think>\nplan</think>Antwort\n\nmit Absatz"),
            pair("\nplan", "Antwort\n\nmit Absatz")
        );
    }

    #[test]
    fn a_closing_tag_without_an_opening_one_ends_reasoning() {
        // Text already released as answer stays released: only the reasoning that arrives
        // with the closing tag is reclaimed (a stored text is stripped whole).
        assert_eq!(
            split(&["Der Nutzer grüßt.\n</think>", "\n", "\nHallo!"]),
            pair("Der Nutzer grüßt.\n", "Hallo!")
        );
        assert_eq!(
            split(&["Der ", "Nutzer.</think>Hallo!"]),
            pair("Nutzer.", "Der Hallo!")
        );
        assert_eq!(split_all_ways("</think>\n\nHallo!"), pair("", "Hallo!"));
    }

    #[test]
    fn answers_without_reasoning_pass_through() {
        assert_eq!(
            split_all_ways("Hallo <b>Welt</b> 👋"),
            pair("", "Hallo <b>Welt</b> 👋")
        );
        // Tags after a finished block, or an opening tag inside the answer, are text.
        assert_eq!(
            split_all_ways("<think>a</think>b </think> <think>c"),
            pair("a", "b </think> <think>c")
        );
        assert_eq!(split_all_ways("x <think>y"), pair("", "x <think>y"));
        // What looked like the start of a tag, then was not.
        assert_eq!(split_all_ways("<thin ice"), pair("", "<thin ice"));
        assert_eq!(split_all_ways("a </thi"), pair("", "a </thi"));
    }

    #[test]
    fn an_unclosed_block_is_all_reasoning() {
        assert_eq!(
            split_all_ways("<think>still going</th"),
            pair("still going</th", "")
        );
        assert_eq!(split_all_ways("<think>a</think>\n\n"), pair("a", ""));
    }

    #[test]
    fn text_is_released_as_soon_as_it_cannot_be_a_tag() {
        let mut stage = InlineReasoning::default();
        let mut out = Vec::new();
        stage.feed(ProviderEvent::TextDelta("Hal".into()), &mut out);
        assert_eq!(out, vec![ProviderEvent::TextDelta("Hal".into())]);
        out.clear();
        stage.feed(ProviderEvent::TextDelta("<think>".into()), &mut out);
        stage.feed(ProviderEvent::TextDelta("lo </".into()), &mut out);
        assert_eq!(
            out,
            vec![
                ProviderEvent::TextDelta("<think>".into()),
                ProviderEvent::TextDelta("lo ".into()),
            ]
        );
    }

    #[test]
    fn usage_passes_and_a_tool_call_releases_held_text() {
        let mut stage = InlineReasoning::default();
        let mut out = Vec::new();
        let usage = ProviderEvent::Usage(Usage {
            input_tokens: Some(3),
            output_tokens: None,
        });
        let start = ProviderEvent::ToolInputStart {
            id: "c".into(),
            name: "f".into(),
        };
        for event in [
            usage.clone(),
            ProviderEvent::TextDelta("<think>hm</thi".into()),
            ProviderEvent::ReasoningDelta("field".into()),
            start.clone(),
        ] {
            stage.feed(event, &mut out);
        }
        assert_eq!(
            out,
            vec![
                usage,
                ProviderEvent::ReasoningDelta("hm".into()),
                ProviderEvent::ReasoningDelta("field".into()),
                ProviderEvent::ReasoningDelta("</thi".into()),
                start,
            ]
        );
    }

    #[test]
    fn stored_texts_are_stripped() {
        assert!(matches!(
            strip_inline_reasoning("Hallo <b>"),
            Cow::Borrowed("Hallo <b>")
        ));
        assert_eq!(
            strip_inline_reasoning(" <think>x</think>\n\nHallo"),
            "Hallo"
        );
        assert_eq!(strip_inline_reasoning("x\n</think>\nHallo"), "Hallo");
        assert_eq!(strip_inline_reasoning("<think>cut off"), "");
    }
}
