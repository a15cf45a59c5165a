//! A turn's UI message stream (the chunks its own stream or the events stream carry) as
//! A2A stream events: the task first, an `artifact-update` per text delta of the reply,
//! then a `status-update` with the state the turn ended in.
//!
//! The sources are Server-Sent Events bodies (`engine::sse` framing), read back here with
//! [`Frames`]; a resumed stream's `reset-step` (D5) becomes an artifact update that
//! replaces the reply with what it held before the step, so a client never keeps text the
//! turn dropped.

use protocol::ui::{DONE_SENTINEL, FinishReason, UiChunk};
use protocol::{ChatId, TurnId};

use super::task::{self, RESPONSE_ARTIFACT};
use super::wire::{Artifact, ArtifactUpdate, Part, StatusUpdate, StreamResponse, Task, TaskState};

/// Server-Sent Events read back into their `data:` payloads.
#[derive(Default)]
pub struct Frames {
    buffer: String,
}

/// One event's payload.
#[derive(Debug, PartialEq)]
pub enum Frame {
    Chunk(UiChunk),
    /// `data: [DONE]`: the turn's stream ended.
    Done,
}

impl Frames {
    /// Appends `bytes` and answers the events now complete. Comments (keep-alives) and
    /// payloads that are not chunks are skipped.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Frame> {
        self.buffer.push_str(&String::from_utf8_lossy(bytes));
        let mut frames = Vec::new();
        while let Some(end) = self.buffer.find("\n\n") {
            let event: String = self.buffer.drain(..end + 2).collect();
            let data: String = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect::<Vec<_>>()
                .join("\n");
            if data.is_empty() {
                continue;
            }
            if data == DONE_SENTINEL {
                frames.push(Frame::Done);
            } else if let Ok(chunk) = serde_json::from_str::<UiChunk>(&data) {
                frames.push(Frame::Chunk(chunk));
            }
        }
        frames
    }
}

/// Where a translated turn stands.
pub struct Translator {
    turn: TurnId,
    chat: ChatId,
    /// The reply so far.
    text: String,
    /// Where the current step's text begins in `text`.
    step_start: usize,
    /// Whether an artifact update went out (later ones append).
    sent_text: bool,
    /// A call of the turn waits for a person (A3).
    awaiting_approval: bool,
    /// The state the turn ended in, once it did.
    ended: Option<TaskState>,
    /// Why it failed.
    error: Option<String>,
}

impl Translator {
    pub fn new(turn: TurnId, chat: ChatId) -> Self {
        Self {
            turn,
            chat,
            text: String::new(),
            step_start: 0,
            sent_text: false,
            awaiting_approval: false,
            ended: None,
            error: None,
        }
    }

    /// The first event of a stream: the task, `state` (working, or submitted while queued).
    pub fn opening(&self, state: TaskState) -> StreamResponse {
        StreamResponse::Task(task::bare(
            self.turn,
            self.chat,
            state,
            Some(chrono::Utc::now()),
        ))
    }

    /// The state the turn ended in, once its stream said.
    pub fn ended(&self) -> Option<TaskState> {
        self.ended
    }

    /// The task as the stream left it: for a blocking send's answer.
    pub fn task(&self, fallback: TaskState) -> Task {
        let mut task = task::bare(
            self.turn,
            self.chat,
            self.ended.unwrap_or(fallback),
            Some(chrono::Utc::now()),
        );
        task.artifacts = task::response_artifact(&self.text);
        if let Some(error) = &self.error {
            task.status.message = Some(task::status_message(self.turn, self.chat, error.clone()));
        }
        task
    }

    fn artifact(&mut self, text: String, append: bool, last_chunk: bool) -> StreamResponse {
        self.sent_text = true;
        StreamResponse::ArtifactUpdate(ArtifactUpdate {
            task_id: self.turn.to_string(),
            context_id: self.chat.to_string(),
            artifact: Artifact {
                artifact_id: RESPONSE_ARTIFACT.to_owned(),
                name: Some(RESPONSE_ARTIFACT.to_owned()),
                parts: vec![Part::text(text)],
            },
            append,
            last_chunk,
        })
    }

    fn end(&mut self, state: TaskState) -> Vec<StreamResponse> {
        self.ended = Some(state);
        let mut events = Vec::new();
        if self.sent_text {
            events.push(self.artifact(String::new(), true, true));
        }
        let mut status = task::bare(self.turn, self.chat, state, Some(chrono::Utc::now())).status;
        if let Some(error) = &self.error {
            status.message = Some(task::status_message(self.turn, self.chat, error.clone()));
        }
        events.push(StreamResponse::StatusUpdate(StatusUpdate {
            task_id: self.turn.to_string(),
            context_id: self.chat.to_string(),
            status,
        }));
        events
    }

    /// The events `chunk` makes; none once the turn ended.
    pub fn feed(&mut self, chunk: UiChunk) -> Vec<StreamResponse> {
        if self.ended.is_some() {
            return Vec::new();
        }
        match chunk {
            UiChunk::StartStep => {
                self.step_start = self.text.len();
                Vec::new()
            }
            UiChunk::TextDelta { delta, .. } if !delta.is_empty() => {
                self.text.push_str(&delta);
                let append = self.sent_text;
                vec![self.artifact(delta, append, false)]
            }
            UiChunk::ResetStep => {
                self.text.truncate(self.step_start);
                if !self.sent_text {
                    return Vec::new();
                }
                let replaced = self.text.clone();
                vec![self.artifact(replaced, false, false)]
            }
            UiChunk::ToolApprovalRequest { .. } => {
                self.awaiting_approval = true;
                Vec::new()
            }
            // P5: a call waits on a person's answer to an MCP server's question (answered
            // through the approvals API), then goes on.
            UiChunk::DataElicitation { data, .. } => {
                let state = if data.state == "pending" {
                    TaskState::InputRequired
                } else {
                    TaskState::Working
                };
                let status =
                    task::bare(self.turn, self.chat, state, Some(chrono::Utc::now())).status;
                vec![StreamResponse::StatusUpdate(StatusUpdate {
                    task_id: self.turn.to_string(),
                    context_id: self.chat.to_string(),
                    status,
                })]
            }
            UiChunk::Error { error_text } => {
                self.error = Some(error_text);
                self.end(TaskState::Failed)
            }
            UiChunk::Finish { finish_reason } => {
                let state = match finish_reason {
                    FinishReason::Interrupted => TaskState::Canceled,
                    FinishReason::Error => TaskState::Failed,
                    _ if self.awaiting_approval => TaskState::InputRequired,
                    _ => TaskState::Completed,
                };
                self.end(state)
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::sse;

    fn ids() -> (TurnId, ChatId) {
        (TurnId::new(), ChatId::new())
    }

    #[test]
    fn frames_survive_any_split_and_skip_comments() {
        let mut whole = Vec::new();
        whole.extend_from_slice(&sse::keep_alive());
        whole.extend_from_slice(&sse::chunk(
            Some(&"1-0"),
            &UiChunk::TextDelta {
                id: "t".into(),
                delta: "hi".into(),
            },
        ));
        whole.extend_from_slice(&sse::done());
        for cut in 0..whole.len() {
            let mut frames = Frames::default();
            let mut got = frames.push(&whole[..cut]);
            got.extend(frames.push(&whole[cut..]));
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(got[1], Frame::Done);
        }
    }

    #[test]
    fn text_becomes_appended_artifact_chunks_then_the_final_state() {
        let (turn, chat) = ids();
        let mut t = Translator::new(turn, chat);
        assert!(t.feed(UiChunk::StartStep).is_empty());
        let first = t.feed(UiChunk::TextDelta {
            id: "a".into(),
            delta: "Hel".into(),
        });
        let second = t.feed(UiChunk::TextDelta {
            id: "a".into(),
            delta: "lo".into(),
        });
        let (StreamResponse::ArtifactUpdate(a), StreamResponse::ArtifactUpdate(b)) =
            (&first[0], &second[0])
        else {
            panic!("{first:?} {second:?}");
        };
        assert!(!a.append && b.append);
        let end = t.feed(UiChunk::Finish {
            finish_reason: FinishReason::Stop,
        });
        assert_eq!(end.len(), 2);
        let StreamResponse::StatusUpdate(status) = &end[1] else {
            panic!("{end:?}");
        };
        assert_eq!(status.status.state, TaskState::Completed);
        assert_eq!(
            t.task(TaskState::Working).artifacts[0].parts[0]
                .text
                .as_deref(),
            Some("Hello")
        );
        assert!(
            t.feed(UiChunk::StartStep).is_empty(),
            "nothing after the end"
        );
    }

    #[test]
    fn a_reset_step_replaces_the_reply_and_an_approval_wants_input() {
        let (turn, chat) = ids();
        let mut t = Translator::new(turn, chat);
        t.feed(UiChunk::StartStep);
        t.feed(UiChunk::TextDelta {
            id: "a".into(),
            delta: "kept ".into(),
        });
        t.feed(UiChunk::StartStep);
        t.feed(UiChunk::TextDelta {
            id: "b".into(),
            delta: "lost".into(),
        });
        let reset = t.feed(UiChunk::ResetStep);
        let StreamResponse::ArtifactUpdate(replaced) = &reset[0] else {
            panic!("{reset:?}");
        };
        assert!(!replaced.append);
        assert_eq!(replaced.artifact.parts[0].text.as_deref(), Some("kept "));
        t.feed(UiChunk::ToolApprovalRequest {
            approval_id: "p".into(),
            tool_call_id: "c".into(),
        });
        t.feed(UiChunk::Finish {
            finish_reason: FinishReason::ToolCalls,
        });
        assert_eq!(t.ended(), Some(TaskState::InputRequired));
    }

    #[test]
    fn an_error_part_fails_the_task_with_its_text() {
        let (turn, chat) = ids();
        let mut t = Translator::new(turn, chat);
        t.feed(UiChunk::Error {
            error_text: "provider_unavailable: every route failed".into(),
        });
        let task = t.task(TaskState::Working);
        assert_eq!(task.status.state, TaskState::Failed);
        let message = task.status.message.unwrap();
        assert!(
            message.parts[0]
                .text
                .as_deref()
                .unwrap()
                .starts_with("provider_unavailable:")
        );
    }

    #[test]
    fn a_question_waiting_on_a_person_is_input_required_until_answered() {
        let (turn, chat) = ids();
        let mut t = Translator::new(turn, chat);
        let mut part = protocol::ui::ElicitationPart {
            approval_id: uuid::Uuid::new_v4(),
            tool_call_id: "c".into(),
            connector: "crm".into(),
            message: "which account?".into(),
            requested_schema: serde_json::json!({"type": "object", "properties": {}}),
            expires_at: "2026-01-01T00:00:00Z".into(),
            state: "pending".into(),
        };
        let mut states = Vec::new();
        for state in ["pending", "approved"] {
            part.state = state.into();
            let events = t.feed(UiChunk::DataElicitation {
                id: part.approval_id.to_string(),
                data: Box::new(part.clone()),
            });
            let [StreamResponse::StatusUpdate(update)] = &events[..] else {
                panic!("{events:?}");
            };
            states.push(update.status.state);
        }
        assert_eq!(states, [TaskState::InputRequired, TaskState::Working]);
        assert_eq!(t.ended(), None, "the turn goes on");
    }
}
