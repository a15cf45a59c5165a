//! The turn: one run of an agent, from a user message to a persisted answer.
//!
//! A turn goes through phases, each in a file of its own:
//!
//! 1. **Admit** (`admit.rs`): an intake slot (`crate::intake`), then one turn per agent
//!    and the team's quotas in one Redis round trip (T9, T2), or from Postgres when Redis
//!    is unreachable. The resulting [`admit::Budget`] goes with the turn to its end.
//! 2. **Compose** (`compose.rs`): what the trigger asks (a message, approvals' answers,
//!    A3), the connectors and the tool set, the frozen composition (T3), and the turn row
//!    with the user message in one statement that also reads back the history, so a
//!    failed write means no provider call. A retried message id replays its turn instead
//!    (`replay.rs`, T12). The first request shows the window's files (`attachments.rs`,
//!    T23): images and PDFs as the provider's own content, text inline.
//! 3. **The loop** (`task.rs`): one step at a time, each a model call (`model_call.rs`:
//!    the route's fallbacks while nothing has been shown, T10) and then its tool calls
//!    (`tool_calls.rs`, T4-T6). What the next step needs is [`state::Progress`].
//! 4. **Wrap-up** (`wrap_up.rs`): the end state written (T7, T8), the hold released, the
//!    stream's last chunk; then, in the background, the summary fold (`context.rs`) and a
//!    new chat's title (`auxiliary.rs`, T17) on their auxiliary routes.
//!
//! Front ends start turns through `post.rs` (a principal's message, its busy policy, a
//! detached post), answer approvals through `answer.rs` and stop turns through `stop.rs`
//! (these two check the principal against the chat themselves). The engine answers a [`TurnError`] when a turn does
//! not start; each front end maps it to its wire. The first model output decides it: the
//! caller waits for the task to report that a stream opened (then UI chunks, `output.rs`)
//! or that every route failed. After that, failures arrive as an `error` chunk.
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
//! its request carried one; its model calls and tool calls are child spans. Its fields are
//! ids, counts and the outcome class, never text (X4).

mod admit;
pub mod answer;
mod attachments;
mod auxiliary;
mod basis;
mod compose;
mod context;
mod continuation;
mod delegation;
mod describe;
mod error;
mod history;
mod model_call;
mod offered;
mod output;
pub mod post;
mod queue;
mod recall;
mod replay;
mod spans;
mod speculation;
mod standing;
mod state;
pub mod stop;
mod takeover;
mod task;
mod tool_calls;
pub mod ui_stream;
mod wrap_up;

use logging::traces::TraceContext;
use protocol::{AgentId, ChatId, TeamId, TurnId};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;

use crate::Engine;
use crate::agents::DisconnectPolicy;
use crate::auth::Authority;
pub use auxiliary::{MAX_TITLE_CHARS, validate_title};
pub use basis::Bases;
pub use compose::{MAX_INSTRUCTIONS_CHARS, validate_instructions};
pub use error::TurnError;
pub use offered::Toolsets;
pub use queue::{Queue, Queued, busy_policy, enqueue, interrupt, run as run_queue, start_waiting};
use spans::{TurnSpan, turn_span};
use store::{Answer, ApprovalRow, StoreError, TurnBasis, bounded};
pub use takeover::{MAX_TAKEOVERS, take_over};
use ui_stream::UiBody;

/// Room for chunks between the turn and a slow client; beyond it the turn waits.
pub(super) const CHUNK_BUFFER: usize = 64;

/// A new user message.
#[derive(Clone, Debug)]
pub struct TurnInput {
    pub content: String,
    pub client_message_id: Option<String>,
    /// The message's files as stored (T21): their download URLs and sniffed media types,
    /// after the text in the message's parts.
    pub files: Vec<protocol::parts::FilePart>,
    /// P9: the caller's own instructions for this turn (OpenAI's `instructions`), checked
    /// by [`validate_instructions`]: appended to the agent's prompt, never replacing it,
    /// and frozen with the turn (T3).
    pub instructions: Option<String>,
}

impl TurnInput {
    /// The stored parts of the message: its text (left out when empty and files carry the
    /// message), then its files.
    pub fn parts(
        content: String,
        files: Vec<protocol::parts::FilePart>,
    ) -> Vec<protocol::parts::Part> {
        let mut parts = Vec::with_capacity(1 + files.len());
        if !content.is_empty() || files.is_empty() {
            parts.push(protocol::parts::Part::Text { text: content });
        }
        parts.extend(files.into_iter().map(protocol::parts::Part::File));
        parts
    }
}

/// T3: the run's basis, frozen and stored before the first provider request.
#[derive(Debug, Serialize)]
pub struct Composition<'a> {
    pub version: u32,
    pub system_prompt: &'a str,
    /// P9: the caller's instructions for this turn, after the agent's prompt. Left out
    /// when none, so a turn without them freezes the same text (and hash) as before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<&'a str>,
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
    /// B8: the agent's skills as the prompt lists them (names and descriptions). Left out
    /// when none, so a turn without skills freezes the same text (and hash) as before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skills: Option<&'a str>,
}

/// What starts a turn.
#[derive(Debug)]
pub enum Trigger {
    /// A new user message.
    User(TurnInput),
    /// Answers to a turn's approvals (A3); the last one resumes the loop.
    Approval(Vec<Answer>),
    /// The agent's autostart cadence (T11): its prompt, with no client attached, in the
    /// autostart chat of that agent.
    Autostart(TurnInput, AgentId),
    /// A continuation whose turn row was never written (A3): the answers are recorded
    /// under this turn id, which names no turn; it is started again under a new one.
    Stranded(TurnId),
    /// A message queued while its agent was busy (T13): its turn row and user message
    /// exist (`queued`); the turn starts under that row's id.
    Queued(store::QueuedTurn),
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

impl Launched {
    fn nothing(answered: Vec<ApprovalRow>) -> Self {
        Self {
            body: None,
            turn: None,
            answered,
        }
    }
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
    state: &Engine,
    team: TeamId,
    chat: ChatId,
    trigger: Trigger,
    authority: Authority,
    detached: bool,
    parent: Option<&TraceContext>,
) -> Result<Launched, TurnError> {
    let Trigger::Approval(answers) = &trigger else {
        let launch = Launch {
            team,
            chat,
            authority,
            answerer: None,
            detached,
            lineage: None,
        };
        return start(state, launch, trigger, parent, None).await;
    };
    // X1: an answer lifts the gate of the calls it answers and lends nothing; the
    // continuation acts with the authority of the turn it continues.
    let first = answers.first().ok_or(TurnError::NotFound("approval"))?;
    let asking = match bounded(state.store.asking_authority(team, chat, first.id)).await {
        Ok(asking) => asking,
        Err(StoreError::NotFound) => return Err(TurnError::NotFound("approval")),
        Err(e) => return Err(e.into()),
    };
    let launch = Launch {
        team,
        chat,
        authority: Authority::of_turn(asking.actor, asking.admin),
        answerer: Some(authority),
        detached,
        lineage: None,
    };
    let owned = state.clone();
    let parent = parent.cloned();
    let task = state
        .turn_tracker
        .spawn(async move { start(&owned, launch, trigger, parent.as_ref(), None).await });
    task.await
        .map_err(|_| TurnError::Internal("a continuation's start panicked".into()))?
}

/// Who starts a turn where, and how it is attached.
struct Launch {
    team: TeamId,
    chat: ChatId,
    /// Whose the turn's tool calls are (X1).
    authority: Authority,
    /// Who answers the approvals a continuation resumes (recorded, never lent).
    answerer: Option<Authority>,
    detached: bool,
    /// A delegated task's place in its tree (B7, X5); `None` for a turn nobody delegated.
    lineage: Option<delegation::Lineage>,
}

/// `admitted`: the turn id and admission of an intake that found its kept basis stale and
/// starts over from Postgres; they stay the turn's while its chat names the same agent, so
/// the start over is not a second turn to the hold and the team's counters.
async fn start(
    state: &Engine,
    launch: Launch,
    trigger: Trigger,
    parent: Option<&TraceContext>,
    admitted: Option<(TurnId, admit::Budget)>,
) -> Result<Launched, TurnError> {
    let Launch { team, chat, .. } = launch;
    let mut admitted = admitted;
    let (intake, found) = enter(state, &launch, &trigger, &mut admitted).await?;
    let basis = found.basis.clone();
    let again = again(&trigger, found.source);
    let (turn_id, admitted) = carried(admitted, &basis).await;
    let retry = retried(state, &trigger, admitted.is_some(), &basis);
    if retry.is_none()
        && let Some(done) = answered_before_admission(state, team, chat, &trigger, &basis)
            .await
            .transpose()
    {
        give_back(admitted).await;
        return done;
    }

    let turn_id = match &trigger {
        Trigger::Queued(queued) => queued.turn,
        _ => turn_id.unwrap_or_else(TurnId::new),
    };
    // From admission to wrap-up; a turn refused at intake (busy, quota), or answered there
    // by its message id's earlier turn (T12), ends here with no `outcome`: its HTTP answer
    // says why.
    let span = turn_span(
        TurnSpan::new(turn_id, &launch, &basis),
        Some(&basis.agent.name),
    );
    logging::traces::continue_from(&span, parent);
    let mut budget = match admitted {
        Some(budget) => budget,
        None => match admit_new(state, &launch, &basis, &trigger, turn_id, retry).await? {
            Ok(budget) => budget,
            Err(replayed) => return Ok(replayed),
        },
    };

    // A3, A4, under the hold (so no continuation runs meanwhile): a new message denies
    // what waits; an answer is recorded at most once, and the last of its turn resumes it.
    let asked = match compose::resolve(state, &launch, &basis, trigger, turn_id).await {
        Ok(compose::Resolved::Run(asked)) => asked,
        Ok(compose::Resolved::Nothing(answered)) => {
            budget.release(0).await;
            return Ok(Launched::nothing(answered));
        }
        Err(err) => {
            budget.release(0).await;
            return Err(err);
        }
    };
    let cancel = turn_token(state, &launch);
    // The turn's guard exists from here: a client that leaves while connectors start
    // cancels their startup too.
    // D1: nor does it when the agent lets its turns outlive their client.
    let guard = (!launch.detached && basis.agent.disconnect_policy == DisconnectPolicy::Cancel)
        .then(|| cancel.clone().drop_guard());
    // Stoppable from here, before its row exists: a stop that reads the row finds it
    // registered (T8).
    let registration = state.stops.register(turn_id, cancel.clone());
    let composed = match compose::compose(state, &launch, &found, asked, turn_id, &cancel).await? {
        compose::Composed::Ready(composed) => composed,
        // Two POSTs with one message id raced; the loser replays the winner's turn.
        compose::Composed::Replayed(replayed) => {
            budget.unstart().await;
            return Ok(replayed);
        }
        // Nothing was written: start over from Postgres, still admitted.
        compose::Composed::Stale => {
            drop((registration, guard, intake));
            state.bases.stale(team, chat);
            let Some(again) = again else {
                budget.release(0).await;
                return Err(TurnError::Internal(
                    "an intake not started from a kept basis found it stale".into(),
                ));
            };
            let admitted = Some((turn_id, budget));
            return Box::pin(start(state, launch, again, parent, admitted)).await;
        }
    };
    // The intake's writes are done; the model call that follows holds no slot.
    drop(intake);
    let running = Started {
        turn: turn_id,
        budget,
        cancel,
        registration,
        guard,
        span,
    };
    run(state, launch, &basis, *composed, running).await
}

/// X5: a delegated task's token is a child of its delegate call's, so stopping,
/// cancelling or taking over the parent does the same to it.
fn turn_token(state: &Engine, launch: &Launch) -> tokio_util::sync::CancellationToken {
    match &launch.lineage {
        Some(lineage) => lineage.cancel.child_token(),
        None => state.turns_cancel.child_token(),
    }
}

/// What starts the turn again from Postgres if the kept basis proves stale.
fn again(trigger: &Trigger, source: basis::Source) -> Option<Trigger> {
    match (trigger, source) {
        (Trigger::User(input), basis::Source::Kept) => Some(Trigger::User(input.clone())),
        (Trigger::Autostart(input, agent), basis::Source::Kept) => {
            Some(Trigger::Autostart(input.clone(), *agent))
        }
        _ => None,
    }
}

/// The turn id and admission a start over carries; what was admitted for another agent
/// than the chat's now is given back.
async fn carried(
    admitted: Option<(TurnId, admit::Budget)>,
    basis: &TurnBasis,
) -> (Option<TurnId>, Option<admit::Budget>) {
    match admitted {
        Some((turn, budget)) if budget.agent() == basis.agent.id => (Some(turn), Some(budget)),
        Some((turn, mut budget)) => {
            budget.release(0).await;
            (Some(turn), None)
        }
        None => (None, None),
    }
}

/// T12: a retried message id is looked up beside the admission, one Postgres round trip
/// fewer before the model, unless something else answers before admission (a draining
/// replica, an archived agent: the lookup comes first, as for a start over).
fn retried<'t>(
    state: &Engine,
    trigger: &'t Trigger,
    admitted: bool,
    basis: &TurnBasis,
) -> Option<&'t TurnInput> {
    match trigger {
        Trigger::User(input)
            if input.client_message_id.is_some()
                && !admitted
                && !state.draining.is_cancelled()
                && !basis.agent.archived =>
        {
            Some(input)
        }
        _ => None,
    }
}

/// An intake slot, then the chat with its agent: as this replica kept them when the
/// trigger may start from a kept basis, else from Postgres. What was `admitted` before a
/// start over is given back when the turn cannot start.
async fn enter(
    state: &Engine,
    launch: &Launch,
    trigger: &Trigger,
    admitted: &mut Option<(TurnId, admit::Budget)>,
) -> Result<(crate::intake::Intake, basis::Found), TurnError> {
    // A message or an autostart may start from the basis this replica kept (`basis.rs`):
    // what it does before the intake's check (A4's denial) can be done again if the check
    // finds it stale; an approval's recorded answers cannot.
    let kept_ok = matches!(trigger, Trigger::User(_) | Trigger::Autostart(..));
    let entered = async {
        // In line for a share of the Postgres pool until the turn row is written.
        let intake = state.intakes.enter().await?;
        let found = state
            .bases
            .basis(&state.store, launch.team, launch.chat, kept_ok)
            .await
            .map_err(|e| match e {
                StoreError::NotFound => TurnError::NotFound("chat"),
                other => other.into(),
            })?;
        // X1: nobody but an admin writes in an autostart chat (what they wrote would steer
        // the next fire, which acts as an admin); a continuation's answerer was checked
        // already.
        if found.basis.chat.autostart
            && matches!(trigger, Trigger::User(_) | Trigger::Queued(_))
            && !launch.authority.may_change_agent()
        {
            return Err(TurnError::NotFound("chat"));
        }
        Ok::<_, TurnError>((intake, found))
    };
    match entered.await {
        Ok(entered) => Ok(entered),
        Err(err) => {
            give_back(admitted.take().map(|(_, budget)| budget)).await;
            Err(err)
        }
    }
}

/// A new turn's admission (T9, T2); a retried message id's earlier turn, looked up beside
/// it, answers instead (T12).
async fn admit_new(
    state: &Engine,
    launch: &Launch,
    basis: &TurnBasis,
    trigger: &Trigger,
    turn_id: TurnId,
    retry: Option<&TurnInput>,
) -> Result<Result<admit::Budget, Launched>, TurnError> {
    let admission = admit::admit(
        state,
        launch.team,
        basis.agent.id,
        turn_id,
        reservation(state, basis, trigger),
        launch.authority.user(),
    );
    match retry {
        Some(input) => {
            admit_unless_retried(state, launch.team, launch.chat, input, admission).await
        }
        None => admission.await.map(Ok),
    }
}

/// A composed turn, admitted and stoppable, before its task runs.
struct Started {
    turn: TurnId,
    budget: admit::Budget,
    cancel: CancellationToken,
    registration: stop::Registration,
    /// Cancels the turn when its client's stream is dropped (none for a detached turn).
    guard: Option<DropGuard>,
    span: tracing::Span,
}

/// Spawns the turn's task, then answers once its first model output decided how it
/// started: the live stream, or nothing to read for a detached turn.
async fn run(
    state: &Engine,
    launch: Launch,
    basis: &TurnBasis,
    composed: compose::Ready,
    started: Started,
) -> Result<Launched, TurnError> {
    let Started {
        turn: turn_id,
        budget,
        cancel,
        mut registration,
        guard,
        span,
    } = started;
    let (tx, rx) = mpsc::channel(CHUNK_BUFFER);
    let (started_tx, started_rx) = oneshot::channel();
    let headers = budget.headers.clone();
    let autostart = composed.autostart;
    let answered = composed.answered.clone();
    let (detached, attached) = (launch.detached, guard.is_some());
    // X1: a turn no stream follows ends with its principal's authority.
    let lost = if attached {
        None
    } else {
        let ended = registration.ended();
        Some(standing::watch(state, launch.team, &launch.authority, &cancel, ended).await)
    };
    let running = state::Running {
        turn: turn_id,
        budget,
        cancel,
        registration,
        lost,
    };
    let task = state::TurnTask::new(state, launch, basis, composed, running, tx, attached);
    // The guard travels with the response body; if this caller is dropped first (the
    // client left while the model was still silent), the guard still cancels the turn.
    state
        .turn_tracker
        .spawn(task.run(started_tx).instrument(span));
    let launched = |body| Launched {
        body,
        turn: Some(turn_id),
        answered,
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
            UiBody::live(rx, guard).with_rate_limit(headers),
        ))),
        Ok(Err(err)) => Err(err),
        Err(_) => Err(TurnError::Internal(
            "turn task ended before reporting".into(),
        )),
    }
}
/// What a start answers before it admits anything: a retried message id's turn (T12),
/// or a refusal (draining, an archived agent). `None`: go on.
async fn answered_before_admission(
    state: &Engine,
    team: TeamId,
    chat: ChatId,
    trigger: &Trigger,
    basis: &TurnBasis,
) -> Result<Option<Launched>, TurnError> {
    if let Trigger::User(input) = trigger
        && let Some(replayed) = replay::retried(state, team, chat, input).await?
    {
        return Ok(Some(replayed));
    }
    // A draining replica answers retries of finished turns (above) but starts nothing.
    if state.draining.is_cancelled() {
        return Err(TurnError::ShuttingDown);
    }
    // An archived agent keeps its transcripts readable but runs no new turn. A kept basis
    // that says otherwise is stale, which the intake finds.
    if basis.agent.archived {
        return Err(TurnError::NotFound("agent"));
    }
    // X1: an autostart acts with an admin's authority only in its own agent's chat.
    if let Trigger::Autostart(_, agent) = trigger
        && (basis.agent.id != *agent || !basis.chat.autostart)
    {
        return Err(TurnError::NotFound("chat"));
    }
    Ok(None)
}

/// The admission, with T12's lookup of a retried message id run beside it: the earlier
/// turn's answer (its replay, or that it is still running) wins over whatever the
/// admission answered, and a hold the admission took is given back as never started.
async fn admit_unless_retried(
    state: &Engine,
    team: TeamId,
    chat: ChatId,
    input: &TurnInput,
    admission: impl Future<Output = Result<admit::Budget, TurnError>>,
) -> Result<Result<admit::Budget, Launched>, TurnError> {
    let (retried, admitted) = tokio::join!(replay::retried(state, team, chat, input), admission);
    let answered = match retried {
        Ok(None) => return admitted.map(Ok),
        Ok(Some(replayed)) => Ok(Err(replayed)),
        Err(err) => Err(err),
    };
    if let Ok(mut budget) = admitted {
        budget.unstart().await;
    }
    answered
}

/// Lets go of an admission carried into a start over that does not use it.
async fn give_back(admitted: Option<admit::Budget>) {
    if let Some(mut budget) = admitted {
        budget.release(0).await;
    }
}

/// The most the first model call can spend, reserved at admission: its input is not
/// known before the history is read (in the turn row's write), so it is the prompt, the
/// summary, the message, the whole history window, and the output cap. Settling on the
/// billed tokens gives back what it did not use.
fn reservation(state: &Engine, basis: &TurnBasis, trigger: &Trigger) -> u64 {
    let tokens = history::estimate_tokens(&basis.agent.system_prompt)
        + history::estimate_tokens(&basis.chat.summary)
        + match trigger {
            Trigger::User(input) | Trigger::Autostart(input, _) => {
                history::estimate_tokens(&input.content)
                    + input
                        .instructions
                        .as_ref()
                        .map_or(0, history::estimate_tokens)
            }
            Trigger::Queued(queued) => {
                history::estimate_tokens(&queued.content)
                    + queued
                        .instructions
                        .as_ref()
                        .map_or(0, history::estimate_tokens)
            }
            Trigger::Approval(_) | Trigger::Stranded(_) => 0,
        }
        + state.config.context_tokens
        + state.config.max_output_tokens as usize;
    tokens as u64
}
