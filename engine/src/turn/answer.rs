//! Answering approvals (A3, A4, P5): the one way every front end records a person's
//! answer, whatever its wire (`POST /v1/approvals/{id}`, an AG-UI run's `resume`). A tool
//! call's approval is answered at most once; the last answer of its turn starts the
//! continuation, with the authority of the turn it continues (X1: the answerer is recorded
//! and lends nothing). An MCP server's question (an elicitation) is answered in its row,
//! where the call waiting on it reads it. Front ends map [`AnswerError`] to their wire.

use logging::traces::TraceContext;
use protocol::{ChatId, TurnId};
use serde_json::Value;
use uuid::Uuid;

use super::post::{self, PostError, Posted};
use super::{Trigger, TurnError, launch};
use crate::Engine;
use crate::auth::{AuthError, Principal};
use domain::approvals::{ApprovalKind, ElicitAction, check_content, validate_reason};
use store::{Answer, Answered as Recorded, Answerer, ApprovalRow, StoreError, bounded};

/// A person's answer as a front end read it: `approved` (and a `reason`) for a tool
/// call's approval; `action` (and `content`) for an elicitation. Which fields fit is
/// decided by the approval's kind, so a wrong one is refused with a message that says so.
#[derive(Debug, Default)]
pub struct Reply {
    pub approved: Option<bool>,
    pub reason: Option<String>,
    pub action: Option<ElicitAction>,
    pub content: Option<Value>,
}

/// What an answer left: the approval as it now is and the turn that goes on (a tool
/// call's continuation, none while other approvals of its turn wait; an elicitation's
/// turn, whose call goes on).
#[derive(Debug)]
pub struct Answered {
    pub approval: ApprovalRow,
    pub turn: Option<TurnId>,
}

/// Why an answer was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The reply does not fit the approval; the message says why.
    #[error("{0}")]
    Invalid(String),
    /// An elicitation's `content` does not fit its form; the message names the field.
    #[error("{0}")]
    InvalidContent(String),
    /// No such approval in the team.
    #[error("approval not found")]
    NotFound,
    /// The approval was answered already or expired (the message says how it ended).
    #[error("{0}")]
    Conflict(String),
    /// The approval's chat is one the principal may not see, or could not be checked.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The continuation did not start (quota, busy agent, overloaded replica, ...).
    #[error(transparent)]
    Post(#[from] PostError),
    #[error("store unavailable")]
    Store(#[from] StoreError),
    /// A row the store said it wrote cannot be found: a bug, never the client's doing.
    #[error("{0}")]
    Lost(&'static str),
}

/// A tool call's answer, its reason checked: what a front end that answers several at once
/// (`resume`) builds each of.
pub fn tool_call(id: Uuid, approved: bool, reason: Option<String>) -> Result<Answer, AnswerError> {
    validate_reason(reason.as_deref()).map_err(AnswerError::Invalid)?;
    Ok(Answer {
        id,
        approved,
        reason,
    })
}

/// Answers the team's approval `id` for `principal`, at most once. The continuation runs
/// detached (its chunks reach the chat's events stream).
pub async fn answer(
    state: &Engine,
    principal: &Principal,
    id: Uuid,
    reply: Reply,
    parent: Option<&TraceContext>,
) -> Result<Answered, AnswerError> {
    validate_reason(reply.reason.as_deref()).map_err(AnswerError::Invalid)?;
    let approval = match bounded(state.store.approval(principal.team, id)).await {
        Ok(approval) => approval,
        Err(StoreError::NotFound) => return Err(AnswerError::NotFound),
        Err(e) => return Err(e.into()),
    };
    principal.check_chat(&state.store, approval.chat).await?;
    if approval.kind == ApprovalKind::Elicitation {
        return answer_elicitation(state, principal, approval, reply).await;
    }
    if reply.action.is_some() || reply.content.is_some() {
        return Err(AnswerError::Invalid(
            "`action` and `content` answer an elicitation; this approval is a tool call's: \
             answer `approved`"
                .into(),
        ));
    }
    let approved = reply.approved.ok_or_else(|| {
        AnswerError::Invalid("`approved` is required to answer a tool call's approval".into())
    })?;
    let answer = Answer {
        id,
        approved,
        reason: reply.reason,
    };
    let answered = continuation(state, principal, approval.chat, answer, parent).await?;
    tracing::info!(team = %principal.team, approval = %id, turn = ?answered.turn, "approval answered");
    Ok(answered)
}

/// Answers of `chat`'s waiting approvals whose continuation the caller streams (an AG-UI
/// run's `resume`): posted as a message is, so the busy agent and the quotas refuse it the
/// same way. The caller has checked that the principal may see `chat`, as for a message.
pub async fn resume(
    state: &Engine,
    principal: &Principal,
    chat: ChatId,
    answers: Vec<Answer>,
    parent: Option<&TraceContext>,
) -> Result<Posted, PostError> {
    let trigger = Trigger::Approval(answers);
    post::post(state, principal, chat, trigger, None, false, parent).await
}

/// A3: the answer recorded; the last of its turn starts the continuation, detached.
async fn continuation(
    state: &Engine,
    principal: &Principal,
    chat: ChatId,
    answer: Answer,
    parent: Option<&TraceContext>,
) -> Result<Answered, PostError> {
    let id = answer.id;
    let trigger = Trigger::Approval(vec![answer]);
    let authority = principal.authority();
    let team = principal.team;
    let launched = match launch(state, team, chat, trigger, authority, true, parent).await {
        Err(TurnError::Busy(running)) => return Err(post::busy(state, principal, running).await),
        other => other?,
    };
    let approval = launched
        .answered
        .into_iter()
        .find(|a| a.id == id)
        .ok_or(PostError::Lost("the answered approval vanished"))?;
    Ok(Answered {
        approval,
        turn: launched.turn,
    })
}

/// P5: records a person's answer to an MCP server's question; the call waiting on it (on
/// whichever replica runs its turn) reads it from the row and answers the server.
async fn answer_elicitation(
    state: &Engine,
    principal: &Principal,
    approval: ApprovalRow,
    reply: Reply,
) -> Result<Answered, AnswerError> {
    if reply.approved.is_some() || reply.reason.is_some() {
        return Err(AnswerError::Invalid(
            "this approval is an MCP server's question: answer `action` (`accept`, `decline` \
             or `cancel`) and, to accept, `content`"
                .into(),
        ));
    }
    let action = reply
        .action
        .ok_or_else(|| AnswerError::Invalid("`action` is required".into()))?;
    let content = match (action, reply.content) {
        (ElicitAction::Accept, content) => {
            let content = content.unwrap_or_else(|| Value::Object(Default::default()));
            let form = approval
                .elicitation
                .as_ref()
                .map(|e| &e.requested_schema)
                .ok_or(AnswerError::Lost("an elicitation without its form"))?;
            check_content(form, &content).map_err(AnswerError::InvalidContent)?;
            Some(content)
        }
        (_, Some(_)) => {
            return Err(AnswerError::Invalid(
                "`content` goes with `action: accept` only".into(),
            ));
        }
        (_, None) => None,
    };
    let authority = principal.authority();
    let by = Answerer {
        actor: &authority.actor,
        admin: authority.may_change_agent(),
    };
    let answered = bounded(state.store.answer_elicitation(
        principal.team,
        approval.id,
        action,
        content.as_ref(),
        by,
    ))
    .await?;
    match answered {
        Recorded::Done { mut answered, .. } => {
            let approval = answered
                .pop()
                .ok_or(AnswerError::Lost("the answered approval vanished"))?;
            tracing::info!(team = %principal.team, approval = %approval.id, state = approval.state.as_str(), "elicitation answered");
            Ok(Answered {
                turn: Some(approval.turn),
                approval,
            })
        }
        Recorded::Closed(row) => Err(AnswerError::Conflict(format!(
            "this approval is {} already",
            row.state.as_str()
        ))),
    }
}
