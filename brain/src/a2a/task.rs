//! A turn as an A2A task: its state from the turn's, its artifact the assistant's text,
//! its history the turn's user and assistant messages (text parts only: tool calls and
//! their results stay in our transcript, `GET /v1/chats/{id}/messages`).

use chrono::{DateTime, Utc};
use protocol::parts::Part as UiPart;
use protocol::{ChatId, TurnId};

use super::wire::{Artifact, Message, Part, Role, Task, TaskState, TaskStatus};
use store::{MessageRow, TurnProgress, TurnRow};

/// The one artifact of a task: the assistant's reply.
pub const RESPONSE_ARTIFACT: &str = "response";

/// The task state of a turn in `progress`.
pub fn state_of(progress: TurnProgress) -> TaskState {
    match progress {
        TurnProgress::Queued => TaskState::Submitted,
        TurnProgress::Running => TaskState::Working,
        TurnProgress::Completed => TaskState::Completed,
        TurnProgress::AwaitingApproval => TaskState::InputRequired,
        TurnProgress::Interrupted | TurnProgress::Withdrawn => TaskState::Canceled,
        TurnProgress::Failed => TaskState::Failed,
    }
}

/// Which stored turn statuses, and which approval condition, a task state filter keeps.
pub fn statuses_of(state: TaskState) -> (Vec<&'static str>, Option<bool>) {
    match state {
        TaskState::Submitted => (vec!["queued"], None),
        TaskState::Working => (vec!["running"], None),
        TaskState::Completed => (vec!["completed"], Some(false)),
        TaskState::InputRequired => (vec!["completed"], Some(true)),
        TaskState::Canceled => (vec!["interrupted", "withdrawn"], None),
        TaskState::Failed => (vec!["failed"], None),
        // No turn is ever in these.
        TaskState::Unspecified | TaskState::Rejected | TaskState::AuthRequired => {
            (Vec::new(), None)
        }
    }
}

pub fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A task with no artifact or history yet.
pub fn bare(turn: TurnId, chat: ChatId, state: TaskState, at: Option<DateTime<Utc>>) -> Task {
    Task {
        id: turn.to_string(),
        context_id: chat.to_string(),
        status: TaskStatus {
            state,
            message: None,
            timestamp: at.map(timestamp),
        },
        artifacts: Vec::new(),
        history: Vec::new(),
    }
}

/// The text parts of a stored message.
fn text_of(parts: &[UiPart]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            UiPart::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// The agent message a status carries: why a task failed.
pub fn status_message(turn: TurnId, chat: ChatId, text: String) -> Message {
    Message {
        message_id: format!("{turn}-status"),
        context_id: Some(chat.to_string()),
        task_id: Some(turn.to_string()),
        role: Role::Agent,
        parts: vec![Part::text(text)],
    }
}

/// The text reply as the task's artifact; none while it is empty.
pub fn response_artifact(text: &str) -> Vec<Artifact> {
    if text.is_empty() {
        return Vec::new();
    }
    vec![Artifact {
        artifact_id: RESPONSE_ARTIFACT.to_owned(),
        name: Some(RESPONSE_ARTIFACT.to_owned()),
        parts: vec![Part::text(text)],
    }]
}

/// `turn` as a task, from its row and its messages (any order of turns; those of other
/// turns are skipped). `history_length` keeps the newest that many messages (A2A's
/// `historyLength`: unset is all, 0 none).
pub fn of_turn(
    turn: &TurnRow,
    messages: &[MessageRow],
    history_length: Option<i32>,
    with_artifacts: bool,
) -> Task {
    let state = state_of(turn.status);
    let mut task = bare(
        turn.id,
        turn.chat_id,
        state,
        Some(turn.ended_at.unwrap_or(turn.started_at)),
    );
    let own: Vec<&MessageRow> = messages.iter().filter(|m| m.turn_id == turn.id).collect();
    if with_artifacts {
        let reply: String = own
            .iter()
            .filter(|m| m.role == "assistant")
            .map(|m| text_of(&m.parts))
            .collect();
        task.artifacts = response_artifact(&reply);
    }
    let mut history: Vec<Message> = own
        .iter()
        .map(|m| Message {
            message_id: m.id.to_string(),
            context_id: Some(turn.chat_id.to_string()),
            task_id: Some(turn.id.to_string()),
            role: if m.role == "user" {
                Role::User
            } else {
                Role::Agent
            },
            parts: vec![Part::text(text_of(&m.parts))],
        })
        .collect();
    if let Some(keep) = history_length {
        let keep = usize::try_from(keep.max(0)).unwrap_or(0);
        let drop = history.len().saturating_sub(keep);
        history.drain(..drop);
    }
    task.history = history;
    if let (TaskState::Failed, Some(code)) = (state, turn.error) {
        task.status.message = Some(status_message(
            turn.id,
            turn.chat_id,
            format!("{}: the turn failed", code.as_str()),
        ));
    }
    task
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_turn_progress_has_a_task_state_and_filters_back_to_it() {
        let all = [
            TurnProgress::Queued,
            TurnProgress::Running,
            TurnProgress::Completed,
            TurnProgress::AwaitingApproval,
            TurnProgress::Interrupted,
            TurnProgress::Failed,
            TurnProgress::Withdrawn,
        ];
        for progress in all {
            let state = state_of(progress);
            let (statuses, _) = statuses_of(state);
            assert!(!statuses.is_empty(), "{progress:?} -> {state:?}");
        }
        assert_eq!(state_of(TurnProgress::Interrupted), TaskState::Canceled);
        assert_eq!(
            state_of(TurnProgress::AwaitingApproval),
            TaskState::InputRequired
        );
    }
}
