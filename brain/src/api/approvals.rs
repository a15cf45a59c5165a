//! `GET /v1/chats/{id}/approvals`, `POST /v1/approvals/{id}` (SPEC A3, A4).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use protocol::{ErrorBody, TurnId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::paging::{self, KeysetKey, PageParams};
use super::{JsonBody, QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use domain::approvals::ElicitAction;
use engine::auth::Principal;
use engine::turn::answer::{self, Reply};
use store::{ApprovalRow, StoreError, bounded};

#[derive(Serialize, utoipa::ToSchema)]
pub struct Approvals {
    approvals: Vec<ApprovalRow>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

const APPROVALS_CURSOR: &str = "ap1:";

/// `GET /v1/chats/{id}/approvals`: the chat's approvals, oldest first; the expired ones
/// are denied `expired` first.
#[utoipa::path(
    get,
    path = "/chats/{chat_id}/approvals",
    operation_id = "list_approvals",
    tag = "approvals",
    params(("chat_id" = Uuid, Path, description = "The chat."), PageParams),
    responses(
        (status = 200, description = "A page of the chat's approvals, oldest first.",
            body = Approvals),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such chat in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Path(chat_id): Path<String>,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<Approvals>, ApiError> {
    let chat = parse_id(&chat_id, "chat")?;
    let limit = params.limit()?;
    let after = params.after::<KeysetKey>(APPROVALS_CURSOR)?.map(|k| k.0);
    principal.check_chat(&state.store, chat).await?;
    match bounded(state.store.chat_created_by(principal.team, chat)).await {
        Ok(_) => {}
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("chat")),
        Err(e) => return Err(e.into()),
    }
    let rows = bounded(
        state
            .store
            .chat_approvals(principal.team, chat, false, after, limit + 1),
    )
    .await?;
    let (approvals, next_cursor) = paging::page(rows, limit, APPROVALS_CURSOR, |a| {
        KeysetKey::of(a.created_at, a.id)
    });
    Ok(Json(Approvals {
        approvals,
        next_cursor,
    }))
}

/// A person's answer: `approved` (and a `reason`) for a tool call's approval; `action`
/// (and `content`) for an MCP server's question (`kind: elicitation`, P5).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"approved": false, "reason": "not on a Friday"}))]
pub struct AnswerBody {
    /// A tool call's approval: whether the call may run.
    #[serde(default)]
    approved: Option<bool>,
    /// A tool call's approval: shown to the model with a denial.
    #[serde(default)]
    reason: Option<String>,
    /// An elicitation: `accept` (sends `content`), `decline` or `cancel`.
    #[serde(default)]
    action: Option<ElicitAction>,
    /// An elicitation accepted: the form's values, checked against its
    /// `requestedSchema` (`422 invalid_content` when they do not fit).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    content: Option<Value>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Answered {
    approval: ApprovalRow,
    /// A tool call's approval: the continuation, running with no client attached (its
    /// chunks reach the chat's events stream); `null` while other approvals of the same
    /// turn still wait. An elicitation: the turn whose call waited on it, which goes on.
    turn_id: Option<TurnId>,
}

/// `POST /v1/approvals/{id}`: answers a pending approval, at most once.
#[utoipa::path(
    post,
    path = "/approvals/{approval_id}",
    operation_id = "answer_approval",
    tag = "approvals",
    params(("approval_id" = Uuid, Path, description = "The approval (the stream's `approvalId`).")),
    request_body = AnswerBody,
    responses(
        (status = 202, description = "Answered; the continuation runs (the tool, or the \
            model reading the denial) with no client attached; an elicitation's answer goes \
            to the MCP server, whose call goes on in its turn.", body = Answered),
        (status = 400, description = "The body is invalid (`invalid_request`): `approved` \
            for an elicitation, `action` for a tool call, `content` without `accept`.",
            body = ErrorBody),
        (status = 402, description = "A period budget of the team is spent (`quota_exhausted`); \
            the approval still waits.", body = ErrorBody),
        (status = 404, description = "No such approval in the team (`not_found`).", body = ErrorBody),
        (status = 409, description = "The approval was answered already, expired or was \
            superseded (`conflict`), or the agent is running another turn (`agent_busy`).",
            body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).", body = ErrorBody),
        (status = 422, description = "An elicitation's `content` does not fit its form \
            (`invalid_content`, the message names the field); it still waits.", body = ErrorBody),
        (status = 429, description = "The team's turn quotas are reached (`quota_exceeded`); \
            the approval still waits.", body = ErrorBody),
        (status = 503, description = "A store is unavailable (`store_unavailable`), this \
            replica's queue of new turns is full or the continuation waited too long in it \
            (`overloaded`, with `Retry-After`; nothing was recorded), or this replica is \
            draining (`shutting_down`).", body = ErrorBody),
    ),
)]
pub async fn answer(
    State(state): State<AppState>,
    principal: Principal,
    Path(approval_id): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<AnswerBody>,
) -> Result<(StatusCode, Json<Answered>), ApiError> {
    let id: Uuid = parse_id(&approval_id, "approval")?;
    let reply = Reply {
        approved: body.approved,
        reason: body.reason,
        action: body.action,
        content: body.content,
    };
    let parent = super::trace_parent(&headers);
    let answered = answer::answer(&state, &principal, id, reply, parent.as_ref()).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Answered {
            approval: answered.approval,
            turn_id: answered.turn,
        }),
    ))
}
