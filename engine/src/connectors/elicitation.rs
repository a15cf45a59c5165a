//! P5: an MCP server's question (`elicitation/create`, form mode) during a tool call of an
//! interactive turn, asked of the person in the chat.
//!
//! The question becomes a pending approval of kind `elicitation` (one row, with its
//! `approval.requested` event), the chat stream gets a `data-elicitation` part (the page's
//! form), and the call waits. The answer (`POST /v1/approvals/{id}`, on any replica) is
//! recorded in the row; the waiting call reads the row every [`POLL`], so it reaches the
//! turn wherever the answer landed. The wait ends with the answer, the approvals' expiry
//! (`expired`: the server reads `cancel`), a new message queued behind the turn
//! (`superseded`: `cancel`), the turn's cancellation or the server's withdrawal
//! (`cancelled`: `cancel`). While a person is asked, the session's call timeouts stand
//! still ([`Asking::waited`]): a person is not a slow server.
//!
//! The message and the values never reach logs or metrics (X4): ids, the state and an
//! error class only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use protocol::ui::{ElicitationPart, UiChunk};
use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::tools::ToolCtx;
use domain::approvals::{ApprovalState, Elicitation, check_question};
use store::{NewElicitation, bounded};

/// How often a waiting call reads its question's row for an answer.
const POLL: Duration = Duration::from_millis(500);
/// Bound on handing the form to the turn's stream.
const SEND_BOUND: Duration = Duration::from_secs(5);
/// Questions one session may have waiting at once; more are declined at once.
const MAX_WAITING: usize = 4;

/// A call of the session that is running, through which its server's questions are asked.
struct Running {
    seq: u64,
    ctx: ToolCtx,
    /// The tool's name in the toolset.
    tool: String,
    input: Value,
}

#[derive(Default)]
struct State {
    running: Vec<Running>,
    /// Questions waiting for a person now.
    waiting: usize,
    /// Since when at least one waits.
    since: Option<Instant>,
    /// Time spent with at least one waiting, before `since`.
    waited: Duration,
}

/// A session's running calls and the time its questions kept a person busy.
pub struct Asking {
    /// The session's connector.
    connector: String,
    state: Mutex<State>,
    next: AtomicU64,
}

/// A call's registration: it ends when the call does.
pub struct Entered<'a> {
    asking: &'a Asking,
    seq: u64,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.asking.lock().running.retain(|r| r.seq != self.seq);
    }
}

/// One waiting question: counted while it lives.
struct Waiting<'a>(&'a Asking);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.waiting -= 1;
        if state.waiting == 0
            && let Some(since) = state.since.take()
        {
            state.waited += since.elapsed();
        }
    }
}

impl Asking {
    pub fn new(connector: &str) -> Self {
        Self {
            connector: connector.to_owned(),
            state: Mutex::default(),
            next: AtomicU64::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Consistent after any panic: single pushes, retains and counter changes.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a running call: the server's questions while it runs are asked through
    /// it (its turn, its stream, its cancellation).
    pub fn enter(&self, ctx: &ToolCtx, tool: &str, input: &Value) -> Entered<'_> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().running.push(Running {
            seq,
            ctx: ctx.clone(),
            tool: tool.to_owned(),
            input: input.clone(),
        });
        Entered { asking: self, seq }
    }

    /// The time questions of this session have kept a person busy so far (overlapping
    /// waits once); a call's timeout is extended by what it grew during the call.
    pub fn waited(&self) -> Duration {
        let state = self.lock();
        state.waited + state.since.map_or(Duration::ZERO, |s| s.elapsed())
    }

    /// Whether a question waits for a person now.
    pub fn is_waiting(&self) -> bool {
        self.lock().waiting > 0
    }

    fn begin_wait(&self) -> Option<Waiting<'_>> {
        let mut state = self.lock();
        if state.waiting >= MAX_WAITING {
            return None;
        }
        state.waiting += 1;
        state.since.get_or_insert_with(Instant::now);
        Some(Waiting(self))
    }

    /// The call a question is asked through: MCP does not say which request a server's
    /// question belongs to, so it is the session's only running call, or with several
    /// the one that started last.
    fn current(&self) -> Option<(ToolCtx, String, Value)> {
        let state = self.lock();
        let call = state.running.last()?;
        Some((call.ctx.clone(), call.tool.clone(), call.input.clone()))
    }

    /// Asks the person in the chat and answers the server: the form's values, a decline,
    /// or `cancel` when nobody answered in time (`ttl`), the turn was stopped or the
    /// server withdrew the question (`withdrawn`). A question that cannot be asked (a URL
    /// elicitation, a form outside MCP's primitive fields, no running call, a store
    /// failure) is declined at once.
    pub async fn ask(
        &self,
        request: ElicitRequestParams,
        ttl: Duration,
        withdrawn: &CancellationToken,
    ) -> ElicitResult {
        let decline = ElicitResult::new(ElicitationAction::Decline);
        let ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } = request
        else {
            return decline;
        };
        let Some((ctx, tool, input)) = self.current() else {
            return decline;
        };
        let connector = self.connector.as_str();
        let schema = serde_json::to_value(&requested_schema).unwrap_or_default();
        if let Err(class) = check_question(&message, &schema) {
            tracing::info!(turn = %ctx.turn, connector, class, "elicitation declined: not a form the chat can show");
            return decline;
        }
        let Some(_waiting) = self.begin_wait() else {
            tracing::info!(turn = %ctx.turn, connector, class = "too_many_waiting", "elicitation declined");
            return decline;
        };
        // T20: a turn waiting for a person is not stuck.
        let _asked = ctx.liveness.asking();
        let id = Uuid::new_v4();
        let expires_at =
            chrono::Utc::now() + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
        let elicitation = Elicitation {
            connector: connector.to_owned(),
            message,
            requested_schema: schema,
        };
        let new = NewElicitation {
            id,
            agent: ctx.agent,
            chat: ctx.chat,
            turn: ctx.turn,
            tool_call_id: &ctx.call_id,
            tool: &tool,
            input: &input,
            elicitation: &elicitation,
            expires_at,
        };
        if let Err(e) = bounded(ctx.store.insert_elicitation(ctx.team, &new)).await {
            tracing::warn!(turn = %ctx.turn, connector, class = e.metric_label(), "elicitation declined: could not record it");
            return decline;
        }
        tracing::info!(turn = %ctx.turn, approval = %id, connector, "elicitation asked");
        let mut part = ElicitationPart {
            approval_id: id,
            tool_call_id: ctx.call_id.clone(),
            connector: connector.to_owned(),
            message: elicitation.message,
            requested_schema: elicitation.requested_schema,
            expires_at: expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            state: ApprovalState::Pending.as_str().to_owned(),
        };
        show(&ctx, &part).await;
        let (state, content) = wait(&ctx, id, ttl, withdrawn).await;
        tracing::info!(turn = %ctx.turn, approval = %id, connector, state = state.as_str(), "elicitation ended");
        part.state = state.as_str().to_owned();
        show(&ctx, &part).await;
        match state {
            ApprovalState::Approved => ElicitResult::new(ElicitationAction::Accept)
                .with_content(content.unwrap_or_else(|| Value::Object(Default::default()))),
            ApprovalState::Denied => decline,
            _ => ElicitResult::new(ElicitationAction::Cancel),
        }
    }
}

/// Hands the form (or its end) to the turn's stream, which also reaches the chat's events
/// stream; bounded, since the turn must not hang on it.
async fn show(ctx: &ToolCtx, part: &ElicitationPart) {
    let Some(ui) = &ctx.ui else {
        return;
    };
    let chunk = UiChunk::DataElicitation {
        id: part.approval_id.to_string(),
        data: Box::new(part.clone()),
    };
    if tokio::time::timeout(SEND_BOUND, ui.send(chunk))
        .await
        .is_err()
    {
        tracing::info!(turn = %ctx.turn, approval = %part.approval_id, "elicitation part not delivered: the stream is full");
    }
}

/// Waits for the row of question `id` to leave `pending`; closes it itself on the expiry
/// (`expired`), the turn's cancellation or the server's withdrawal (`cancelled`), unless
/// the answer landed first. Answers the end state and the accepted values.
async fn wait(
    ctx: &ToolCtx,
    id: Uuid,
    ttl: Duration,
    withdrawn: &CancellationToken,
) -> (ApprovalState, Option<Value>) {
    let deadline = tokio::time::Instant::now() + ttl;
    let gave_up = loop {
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => break ApprovalState::Cancelled,
            () = withdrawn.cancelled() => break ApprovalState::Cancelled,
            () = tokio::time::sleep_until(deadline) => break ApprovalState::Expired,
            () = tokio::time::sleep(POLL) => {
                match bounded(ctx.store.elicitation_state(ctx.team, id)).await {
                    Ok((ApprovalState::Pending, _)) => {}
                    Ok(answered) => return answered,
                    // The expiry still bounds the wait.
                    Err(e) => tracing::warn!(turn = %ctx.turn, approval = %id, class = e.metric_label(), "could not read the elicitation's state"),
                }
            }
        }
    };
    match bounded(ctx.store.close_elicitation(ctx.team, id, gave_up)).await {
        Ok(true) => (gave_up, None),
        // Answered (or closed) just before: that answer stands, unless the turn is
        // stopped, whose call is dropped anyway.
        Ok(false) if gave_up != ApprovalState::Cancelled => {
            match bounded(ctx.store.elicitation_state(ctx.team, id)).await {
                Ok((state, content)) if state != ApprovalState::Pending => (state, content),
                _ => (gave_up, None),
            }
        }
        Ok(false) => (gave_up, None),
        Err(e) => {
            tracing::warn!(turn = %ctx.turn, approval = %id, class = e.metric_label(), "could not close the elicitation");
            (gave_up, None)
        }
    }
}
