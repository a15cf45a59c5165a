//! A retried message id (T12): the turn it started already is answered again, from its
//! stored end state, instead of running a second one.

use protocol::ui::{FinishReason, TurnInfo, UiChunk};
use protocol::{ChatId, ErrorCode, TeamId};

use super::history;
use super::ui_stream::UiBody;
use super::{Launched, TurnError, TurnInput};
use crate::Engine;
use store::{TurnRecord, TurnStatus, bounded};

/// The replay of the turn `input`'s message id started, if it started one.
pub(super) async fn retried(
    state: &Engine,
    team: TeamId,
    chat: ChatId,
    input: &TurnInput,
) -> Result<Option<Launched>, TurnError> {
    let Some(client_id) = input.client_message_id.as_deref() else {
        return Ok(None);
    };
    let existing = bounded(state.store.turn_for_client_message(team, chat, client_id)).await?;
    existing.map(replay).transpose()
}

/// The UI chunks of a turn that already ran.
pub(super) fn replay(turn: TurnRecord) -> Result<Launched, TurnError> {
    let message_id = turn
        .assistant
        .as_ref()
        .map(|m| m.id)
        .unwrap_or_default()
        .to_string();
    let mut chunks = vec![
        UiChunk::Start { message_id },
        UiChunk::DataTurn {
            data: TurnInfo { turn_id: turn.id },
            transient: true,
        },
    ];
    match turn.status {
        TurnStatus::Running | TurnStatus::Queued => return Err(TurnError::InProgress(turn.id)),
        TurnStatus::Withdrawn => {
            chunks.push(UiChunk::error(
                ErrorCode::Conflict,
                "this message was withdrawn before its turn started",
            ));
        }
        TurnStatus::Failed => {
            let code = turn.error_code.unwrap_or(ErrorCode::Internal);
            chunks.push(UiChunk::error(code, "this message's turn failed"));
        }
        TurnStatus::Completed | TurnStatus::Interrupted => {
            let parts = turn
                .assistant
                .as_ref()
                .map(|m| m.parts.clone())
                .unwrap_or_default();
            chunks.extend(history::replay_chunks(&parts));
            chunks.push(UiChunk::Finish {
                finish_reason: if turn.status == TurnStatus::Completed {
                    FinishReason::Stop
                } else {
                    FinishReason::Interrupted
                },
            });
        }
    }
    Ok(Launched {
        body: Some(UiBody::replay(chunks)),
        turn: None,
        answered: Vec::new(),
    })
}
