//! The turn: one run of an agent, from a user message to a persisted answer.
//!
//! `start` does the intake synchronously (SPEC T1, T3): it loads the chat and agent,
//! handles a retried message id (T12), and writes the turn row with its frozen composition
//! and the user message in one statement that also reads back the history, so a failed
//! write means no provider call. It
//! then spawns [`TurnTask::run`], which opens the model stream (trying the route's
//! fallbacks in order while nothing has been shown, T10), relays it as UI chunks, and
//! persists the end state (T7, T8).
//!
//! The HTTP status is decided by the first model output: the handler waits for the task
//! to report that a stream opened (200, then UI chunks) or that every route failed (the
//! error's status). After that, failures arrive as an `error` chunk.
//!
//! Cancellation: each turn has a `CancellationToken`, a child of the process's. The
//! response body holds its drop guard, so a client that goes away cancels the turn; the
//! task races every provider await against it and drops the provider stream, which aborts
//! the HTTP request upstream. A stop from any client on any replica cancels the same token
//! (`stop.rs`), so it does exactly what a hang-up does.
//!
//! A turn with no client attached ([`launch`] `detached`: an autostart, T11, or an
//! approval's continuation, A3) is the same turn, admitted the same way (hold and
//! quotas); it has no drop guard and nobody reads its chunks (they reach the events
//! stream), so it runs to completion and is cancelled only by a stop or the drain's
//! timeout.
//!
//! Traces (O2): each turn is one `turn` span, a child of the client's `traceparent` when
//! its request carried one; its model calls and tool calls are child spans
//! (`run.rs`). Its fields are ids, counts and the outcome class, never text (X4).

mod context;
mod history;
mod offered;
mod run;
mod speculation;
pub mod stop;
pub mod ui_stream;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use logging::traces::TraceContext;
use protocol::ui::{FinishReason, TurnInfo, UiChunk};
use protocol::{ChatId, ErrorCode, TeamId, TurnId};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use crate::AppState;
use crate::agents::DisconnectPolicy;
use crate::auth::Authority;
use crate::connectors;
use crate::error::ApiError;
use crate::hold::{Admitted, HoldGuard, TurnAdmission};
use crate::provider::ModelRequest;
use crate::quota::{Limits, Periods, RateLimitHeaders, fallback};
use crate::store::{
    AgentRow, Answer, Answered, Answerer, ApprovalRow, Close, NewTurn, StoreError, TurnBasis,
    TurnRecord, TurnStatus, bounded,
};
use history::model_messages;
pub use offered::Toolsets;
use run::TurnTask;
use ui_stream::UiBody;

/// Room for chunks between the turn and a slow client; beyond it the turn waits.
pub(super) const CHUNK_BUFFER: usize = 64;

/// A new user message.
#[derive(Debug)]
pub struct TurnInput {
    pub content: String,
    pub client_message_id: Option<String>,
}

/// T3: the run's basis, frozen and stored before the first provider request.
#[derive(Debug, Serialize)]
pub struct Composition<'a> {
    pub version: u32,
    pub system_prompt: &'a str,
    /// The primary model first, then the fallbacks in the order they are tried.
    pub model_route: Vec<&'a str>,
    /// The exact tool catalog offered to the model (name, description, schema), as
    /// rendered once for the tool set (`offered.rs`).
    pub tools: &'a serde_json::value::RawValue,
    pub max_iterations: u32,
    pub max_writes: u32,
    pub max_output_tokens: u32,
    /// The summary covers messages up to this sequence number (M1).
    pub summary_through: i64,
}

/// What starts a turn.
#[derive(Debug)]
pub enum Trigger {
    /// A new user message.
    User(TurnInput),
    /// Answers to a turn's approvals (A3); the last one resumes the loop.
    Approval(Vec<Answer>),
    /// The agent's autostart cadence (T11): its prompt, with no client attached.
    Autostart(TurnInput),
    /// A continuation whose turn row was never written (A3): the answers are recorded
    /// under this turn id, which names no turn; it is started again under a new one.
    Stranded(TurnId),
}

/// A started turn, or answers that resumed nothing yet.
pub struct Launched {
    /// The stream, unless the turn was started detached or nothing started.
    pub body: Option<UiBody>,
    /// The turn that runs, if one does.
    pub turn: Option<TurnId>,
    /// The approvals the answers closed, as they now are.
    pub answered: Vec<ApprovalRow>,
}

/// Starts a turn for `trigger`, or replays the turn a retried message id started. A
/// `detached` turn has no client: its chunks reach only the events stream, and nobody
/// leaving cancels it. `parent` is the trace context the request carried. `authority` is
/// whose the turn's tool calls are (X1): the posting principal, the one answering an
/// approval, or the one who set the autostart.
///
/// Answers run in a task of their own (A3): once recorded, their continuation's turn row
/// is written even when the caller goes away meanwhile (a client hanging up while a
/// slow connector starts), so an approved call is never left without its turn.
pub async fn launch(
    state: &AppState,
    team: TeamId,
    chat: ChatId,
    trigger: Trigger,
    authority: Authority,
    detached: bool,
    parent: Option<&TraceContext>,
) -> Result<Launched, ApiError> {
    if !matches!(trigger, Trigger::Approval(_)) {
        return start(state, team, chat, trigger, authority, detached, parent).await;
    }
    let owned = state.clone();
    let parent = parent.cloned();
    let task = state.turn_tracker.spawn(async move {
        start(
            &owned,
            team,
            chat,
            trigger,
            authority,
            detached,
            parent.as_ref(),
        )
        .await
    });
    task.await
        .map_err(|_| ApiError::Internal("a continuation's start panicked".into()))?
}

async fn start(
    state: &AppState,
    team: TeamId,
    chat: ChatId,
    trigger: Trigger,
    authority: Authority,
    detached: bool,
    parent: Option<&TraceContext>,
) -> Result<Launched, ApiError> {
    // In line for a share of the Postgres pool until the turn row is written.
    let intake = state.intakes.enter().await?;
    let TurnBasis {
        chat: chat_row,
        agent,
        has_connectors,
        has_pending_approvals,
    } = bounded(state.store.chat_with_agent(team, chat))
        .await
        .map_err(|e| match e {
            StoreError::NotFound => ApiError::NotFound("chat"),
            other => other.into(),
        })?;
    let replayed = |body| Launched {
        body: Some(body),
        turn: None,
        answered: Vec::new(),
    };
    if let Trigger::User(input) = &trigger
        && let Some(client_id) = input.client_message_id.as_deref()
        && let Some(existing) =
            bounded(state.store.turn_for_client_message(team, chat, client_id)).await?
    {
        return replay(existing).map(replayed);
    }
    // A draining replica answers retries of finished turns (above) but starts nothing.
    if state.draining.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    // An archived agent keeps its transcripts readable but runs no new turn.
    if agent.archived {
        return Err(ApiError::NotFound("agent"));
    }

    // T9 and T2: one turn per agent and the team's quotas, decided before anything is
    // written or started, in one Redis round trip; a busy or refused answer leaves no
    // trace. The first call's input is not known before the history is read (in the
    // write below), so its reservation is the most the history can add: the prompt, the
    // summary, the message, the whole history window, and the output cap. Settling on the
    // billed tokens gives back what it did not use.
    let turn_id = TurnId::new();
    // From admission to wrap-up; a turn refused at intake (busy, quota) ends here with no
    // `outcome`, its HTTP answer says why.
    let span = tracing::info_span!(
        "turn",
        turn.id = %turn_id,
        chat.id = %chat,
        agent.id = %agent.id,
        team.id = %team,
        detached,
        outcome = tracing::field::Empty,
        model_calls = tracing::field::Empty,
        tool_calls = tracing::field::Empty,
    );
    logging::traces::continue_from(&span, parent);
    let reservation = context::estimate_tokens(&agent.system_prompt)
        + context::estimate_tokens(&chat_row.summary)
        + match &trigger {
            Trigger::User(input) | Trigger::Autostart(input) => {
                context::estimate_tokens(&input.content)
            }
            Trigger::Approval(_) | Trigger::Stranded(_) => 0,
        }
        + state.config.context_tokens
        + state.config.max_output_tokens as usize;
    let admission = TurnAdmission {
        team,
        agent: agent.id,
        turn: turn_id,
        reservation: reservation as u64,
    };
    let (mut hold, quota) = admit(state, admission).await?;

    // A3, A4, under the hold (so no continuation runs meanwhile): a new message denies
    // what waits; an answer is recorded at most once, and the last of its turn resumes it.
    let autostart = matches!(trigger, Trigger::Autostart(_));
    let (content, client_message_id, resume, answered) = match trigger {
        Trigger::User(input) | Trigger::Autostart(input) => {
            if has_pending_approvals {
                bounded(state.store.close_approvals(team, chat, Close::Superseded)).await?;
            }
            (
                Some(input.content),
                input.client_message_id,
                Vec::new(),
                Vec::new(),
            )
        }
        Trigger::Stranded(stranded) => {
            match bounded(
                state
                    .store
                    .reclaim_continuation(team, chat, stranded, turn_id),
            )
            .await
            {
                Ok(Some(resume)) => (None, None, resume, Vec::new()),
                other => {
                    if let Some(hold) = hold.take() {
                        hold.release().await;
                    }
                    // Taken by another replica meanwhile, or its turn row exists after all.
                    other?;
                    return Ok(Launched {
                        body: None,
                        turn: None,
                        answered: Vec::new(),
                    });
                }
            }
        }
        Trigger::Approval(answers) => {
            let by = Answerer {
                actor: &authority.actor,
                admin: authority.may_change_agent(),
            };
            let outcome = bounded(
                state
                    .store
                    .answer_approvals(team, chat, &answers, turn_id, by),
            )
            .await;
            let release = async |hold: &mut Option<HoldGuard>| {
                if let Some(hold) = hold.take() {
                    hold.release().await;
                }
            };
            match outcome {
                Ok(Answered::Done {
                    answered,
                    resume: Some(resume),
                }) => (None, None, resume, answered),
                Ok(Answered::Done {
                    answered,
                    resume: None,
                }) => {
                    release(&mut hold).await;
                    return Ok(Launched {
                        body: None,
                        turn: None,
                        answered,
                    });
                }
                Ok(Answered::Closed(row)) => {
                    release(&mut hold).await;
                    return Err(ApiError::Conflict(format!(
                        "this approval is {} already",
                        row.state.as_str()
                    )));
                }
                Err(StoreError::NotFound) => {
                    release(&mut hold).await;
                    return Err(ApiError::NotFound("approval"));
                }
                Err(e) => {
                    release(&mut hold).await;
                    return Err(e.into());
                }
            }
        }
    };

    let cancel = state.turns_cancel.child_token();
    // The turn's guard exists from here: a client that leaves while connectors start
    // cancels their startup too.
    // D1: nor does it when the agent lets its turns outlive their client.
    let guard = (!detached && agent.disconnect_policy == DisconnectPolicy::Cancel)
        .then(|| cancel.clone().drop_guard());
    // Stoppable from here, before its row exists: a stop that reads the row finds it
    // registered (T8).
    let running = state.stops.register(turn_id, cancel.clone());
    let (connector_tools, connector_status) = if has_connectors {
        connectors::connector_tools(
            &state.store,
            &state.config.connectors,
            &state.oauth,
            team,
            agent.id,
            connectors::Requester {
                user: chat_row.created_by.as_deref(),
                admin: authority.may_change_agent(),
            },
            &cancel,
        )
        .await
    } else {
        (Vec::new(), Vec::new())
    };
    // Brain tools keep their names, then the worker's, then connectors'.
    let shared = state
        .toolsets
        .get(state, agent.concierge, &agent.runtime_profile);
    let offered = if connector_tools.is_empty() {
        shared
    } else {
        Arc::new(shared.with(connector_tools))
    };
    let composition = Composition {
        version: 1,
        system_prompt: &agent.system_prompt,
        model_route: model_route(&agent),
        tools: &offered.composition_tools,
        max_iterations: state.config.limits.max_iterations,
        max_writes: state.config.limits.max_writes,
        max_output_tokens: state.config.max_output_tokens,
        summary_through: chat_row.summary_through,
    };
    let composition_json = serde_json::value::to_raw_value(&composition)
        .map_err(|e| ApiError::Internal(format!("composition: {e}")))?;
    let user_parts = content.map(|text| serde_json::json!([{ "type": "text", "text": text }]));
    let begun = bounded(state.store.begin_turn(
        NewTurn {
            id: turn_id,
            team,
            agent: agent.id,
            chat,
            background: detached,
            trigger: if !resume.is_empty() {
                "approval"
            } else if autostart {
                "autostart"
            } else {
                "user"
            },
            composition: &composition_json,
            user_parts: user_parts.as_ref(),
            client_message_id: client_message_id.as_deref(),
            replica: state.replica,
        },
        composition.summary_through,
    ))
    .await;
    let history = match begun {
        Ok(history) => history,
        // Two POSTs with one message id raced; the loser replays the winner's turn.
        Err(StoreError::Conflict("message_id")) => {
            let client_id = client_message_id.as_deref().unwrap_or_default();
            let existing = bounded(state.store.turn_for_client_message(team, chat, client_id))
                .await?
                .ok_or(ApiError::Internal("conflicting message id vanished".into()))?;
            return replay(existing).map(replayed);
        }
        Err(e) => return Err(e.into()),
    };
    // The intake's writes are done; the model call that follows holds no slot.
    drop(intake);
    let request = ModelRequest {
        model: String::new(),
        system: system_text(&agent.system_prompt, &chat_row.summary),
        messages: model_messages(
            &history[context::window_start(&history, state.config.context_tokens)..],
        ),
        tools: offered.catalog.clone(),
        max_output_tokens: state.config.max_output_tokens,
    };
    let route: Vec<String> = composition
        .model_route
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let fold = context::Fold {
        store: state.store.clone(),
        holds: state.holds.clone(),
        providers: state.providers.clone(),
        team,
        agent: agent.id,
        chat,
        turn: turn_id,
        route: summary_route(&agent),
        budget: state.config.context_tokens,
        max_output_tokens: state.config.max_output_tokens,
        unsummarized: context::history_tokens(&history),
    };

    let (tx, rx) = mpsc::channel(CHUNK_BUFFER);
    let (started_tx, started_rx) = oneshot::channel();
    let metrics = state
        .metrics
        .turn_started(route.first().map_or("", String::as_str));
    let task = TurnTask {
        store: state.store.clone(),
        providers: state.providers.clone(),
        toolset: offered.toolset.clone(),
        team,
        agent: agent.id,
        chat,
        turn: turn_id,
        route,
        request,
        limits: state.config.limits,
        cancel: cancel.clone(),
        tx,
        hold,
        quota: quota.clone(),
        quotas: state.quotas.clone(),
        events: state.events.clone(),
        fold,
        connector_status,
        stall_timeout: state.config.client_stall_timeout,
        stalled: AtomicBool::new(false),
        billed_at: std::sync::OnceLock::new(),
        policy: agent.approval_policy.clone(),
        approval_ttl: state.config.approval_ttl,
        resume,
        detached: guard.is_none(),
        speculation: speculation::Speculation::new(
            &state.sessions,
            state.config.workers.speculation_grace,
            team,
            agent.id,
            chat,
        ),
        metrics,
        authority,
        _running: running,
    };
    // The guard travels with the response body; if this handler is dropped first (the
    // client left while the model was still silent), the guard still cancels the turn.
    state
        .turn_tracker
        .spawn(task.run(started_tx).instrument(span));
    let launched = |body| Launched {
        body,
        turn: Some(turn_id),
        answered: answered.clone(),
    };
    if detached {
        // Nobody reads a detached turn's stream: its chunks go to the events stream only.
        drop(rx);
        // The scheduler records whether a fire's turn got going; an approval's answer is
        // given back at once (its continuation's failure is the turn's own).
        if autostart && let Ok(Err(err)) = started_rx.await {
            return Err(err);
        }
        return Ok(launched(None));
    }
    match started_rx.await {
        Ok(Ok(())) => Ok(launched(Some(
            UiBody::live(rx, guard).with_rate_limit(quota.headers),
        ))),
        Ok(Err(err)) => Err(err),
        Err(_) => Err(ApiError::Internal(
            "turn task ended before reporting".into(),
        )),
    }
}

/// How a running turn's further model calls are checked against the team's budgets.
#[derive(Clone, Debug)]
pub(crate) struct TurnQuota {
    pub limits: Limits,
    /// Counted in Redis (reserve through the hold) or, Redis being unreachable at intake,
    /// from Postgres.
    pub counted_in_redis: bool,
    /// What the admission left of the team's limits, for the response's `RateLimit`.
    pub headers: RateLimitHeaders,
}

/// The hold and the quota decision; a refusal or a busy agent is the request's answer.
async fn admit(
    state: &AppState,
    admission: TurnAdmission,
) -> Result<(Option<HoldGuard>, TurnQuota), ApiError> {
    let periods = Periods::now();
    match state.holds.admit(&state.quotas, admission).await? {
        Admitted::Held {
            guard,
            limits,
            counts,
        } => Ok((
            Some(guard),
            TurnQuota {
                limits,
                counted_in_redis: true,
                headers: RateLimitHeaders::turns(&limits, &counts, &periods),
            },
        )),
        Admitted::Busy { running } => Err(ApiError::AgentBusy(running)),
        Admitted::Refused(refusal) => {
            state.metrics.quota_refused(refusal.field);
            Err(ApiError::Quota(refusal))
        }
        // Never open: the team's limits and counts come from Postgres instead.
        Admitted::Unavailable => {
            let limits = state.quotas.limits(admission.team).await?;
            let counts = if limits.limits_turns() {
                match fallback::admit_turn(
                    &state.store,
                    admission.team,
                    &limits,
                    admission.reservation,
                    &periods,
                )
                .await?
                {
                    Ok(counts) => counts,
                    Err(refusal) => {
                        state.metrics.quota_refused(refusal.field);
                        return Err(ApiError::Quota(refusal));
                    }
                }
            } else {
                Default::default()
            };
            Ok((
                None,
                TurnQuota {
                    limits,
                    counted_in_redis: false,
                    headers: RateLimitHeaders::turns(&limits, &counts, &periods),
                },
            ))
        }
    }
}

fn system_text(prompt: &str, summary: &str) -> String {
    if summary.is_empty() {
        prompt.to_owned()
    } else {
        format!("{prompt}\n\nSummary of the earlier conversation:\n{summary}")
    }
}

/// The UI chunks of a turn that already ran (T12).
fn replay(turn: TurnRecord) -> Result<UiBody, ApiError> {
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
        TurnStatus::Running => return Err(ApiError::TurnInProgress(turn.id)),
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
    Ok(UiBody::replay(chunks))
}

/// The primary model, then the fallbacks in order.
fn model_route(agent: &AgentRow) -> Vec<&str> {
    std::iter::once(agent.model.as_str())
        .chain(agent.fallback_models.iter().map(String::as_str))
        .collect()
}

/// The models that fold history into the summary: the agent's own route for now.
fn summary_route(agent: &AgentRow) -> Vec<String> {
    model_route(agent).into_iter().map(str::to_owned).collect()
}
