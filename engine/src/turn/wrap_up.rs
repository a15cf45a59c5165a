//! Wrap-up (T7, T8): the end state written whole (the assistant message, the usage, the
//! approvals that wait), the hold released, and the stream's last chunk, in that order:
//! a client that saw `finish` finds the message, and one that posts its next message on
//! `finish` does not find the agent busy. A write that fails for good ends the turn
//! `failed`, so no turn stays `running` because a write failed.

use std::future::Future;
use std::time::Duration;

use backon::Retryable;
use protocol::parts::Part;
use protocol::ui::{FinishReason, UiChunk};
use protocol::{ErrorCode, MessageId, TurnId};
use tokio_util::sync::CancellationToken;

use super::auxiliary::Title;
use super::state::{Ids, Progress, TurnTask};
use crate::metrics::TurnOutcome;
use crate::quota::Refusal;
use providers::ProviderError;
use store::{
    AssistantMessage, ModelCallUsage, NewApproval, Store, StoreError, TurnEnd, TurnStatus,
};

/// How the whole turn ended.
pub(super) enum End {
    Completed(FinishReason),
    Interrupted,
    Failed(ProviderError),
    /// A budget ran out before a further model call (E2); ends the turn `failed` like a
    /// provider failure mid-turn.
    Refused(Refusal),
    /// Neither Redis nor Postgres could say whether a further model call fits the budget.
    QuotaUnknown,
    /// No progress for the configured time (T20): cut short as a stop would, then ended
    /// `failed` with `turn_stuck`.
    Stuck,
    /// Calls wait for a person (A3): the turn ends here with them stored pending.
    AwaitingApproval(Vec<NewApproval>),
    /// Another replica took the turn over (D3): it writes the end, not this one.
    TakenOver,
    /// The drain handed the turn over at a step boundary (D4): another replica goes on.
    HandedOver,
}

/// What a turn's end writes, and the chunk its stream ends with.
struct Ending {
    status: TurnStatus,
    error_code: Option<ErrorCode>,
    /// The assistant message is stored, complete or not; none for a failed turn.
    complete: Option<bool>,
    approvals: Vec<NewApproval>,
    last: Last,
}

/// How the stream ends once the end state was written (or could not be).
enum Last {
    /// `finish` when the end state was stored, else the store's error.
    Finish(FinishReason),
    /// This error, either way.
    Error(ErrorCode, String),
}

impl End {
    fn outcome(&self) -> TurnOutcome {
        match self {
            Self::Completed(_) => TurnOutcome::Completed,
            Self::AwaitingApproval(_) => TurnOutcome::AwaitingApproval,
            Self::Interrupted | Self::TakenOver | Self::HandedOver => TurnOutcome::Interrupted,
            Self::Failed(_) | Self::QuotaUnknown | Self::Stuck => TurnOutcome::Failed,
            Self::Refused(_) => TurnOutcome::Refused,
        }
    }
}

/// How long a wrap-up keeps trying to write the whole end state through transient store
/// failures (every pooled connection busy in a burst of wrap-ups, a dropped connection)
/// before it falls back to ending the turn `failed`.
/// The class of a write refused because another replica took the turn over (D3).
pub(super) const TAKEN_OVER: &str = "turn_taken_over";
pub(super) const WRAP_UP_PATIENCE: Duration = Duration::from_secs(60);
/// How long the fallback keeps trying to end the turn `failed`.
const FALLBACK_PATIENCE: Duration = Duration::from_secs(10);
/// Bound on one write attempt: a statement that hangs (a blackholed database) is given up
/// and tried again; a retry of a write that did land is harmless (see `persist`).
const WRITE_ATTEMPT_BOUND: Duration = Duration::from_secs(10);

impl TurnTask {
    /// Ends the turn as `end` says: writes it, releases the hold, tells the client.
    pub(super) async fn wrap_up(
        &mut self,
        end: End,
        progress: Progress,
        unfinished: &mut Unfinished,
    ) {
        let Progress {
            parts,
            usage_log,
            assistant_id,
            calls_made,
            tool_calls,
            ..
        } = progress;
        // The watch cut it (T20), not a person or a hang-up.
        let end = match end {
            End::Interrupted if self.client.liveness.is_stuck() => End::Stuck,
            end => end,
        };
        if matches!(end, End::TakenOver | End::HandedOver) {
            if matches!(end, End::HandedOver) {
                self.hand_over().await;
            }
            // Nothing of it is this replica's to write, release or bill any more: the
            // replica that takes it over adopts its hold and bills its calls.
            unfinished.written();
            self.budget.abandon();
            self.metrics.moved();
            record_usage(&usage_log);
            record_turn(calls_made, tool_calls, "moved");
            self.client
                .send(UiChunk::error(
                    ErrorCode::ReplicaLost,
                    "this turn continues on another replica; follow it on the chat's stream",
                ))
                .await;
            return;
        }
        let answer_tokens = super::history::estimate_tokens(&parts);
        let billed = billed_tokens(&usage_log);
        // A3: the request parts go out once the approvals exist, so an answer that
        // follows them at once finds its row.
        let requests: Vec<UiChunk> = match &end {
            End::AwaitingApproval(waiting) => waiting
                .iter()
                .map(|a| UiChunk::ToolApprovalRequest {
                    approval_id: a.id.to_string(),
                    tool_call_id: a.tool_call_id.clone(),
                })
                .chain([UiChunk::FinishStep])
                .collect(),
            _ => Vec::new(),
        };
        let outcome = end.outcome();
        let title = self.title_owed(&end, &parts);
        record_usage(&usage_log);
        let (stored, last) = self.finish(end, assistant_id, parts, usage_log).await;
        let outcome = outcome.unless_lost(stored);
        self.metrics.ended(outcome);
        record_turn(calls_made, tool_calls, outcome.as_str());
        unfinished.written();
        // The end state is written before the client is told (a client that saw `finish`
        // finds the message), and the hold is released before too: a client that posts
        // its next message on `finish` must not find the agent busy.
        self.budget.release(billed).await;
        if stored {
            for chunk in requests {
                self.client.send(chunk).await;
            }
        }
        self.client.send(last).await;
        if stored && let Some((title, answer)) = title {
            title.start(answer);
        }
        if stored
            && let Some(fold) = self.fold.take()
            && fold.needed(answer_tokens)
        {
            tokio::spawn(fold.run());
        }
    }

    /// T17: the title a completed first turn owes its chat, with the answer's start it is
    /// asked from; started only once `finish` was sent.
    fn title_owed(&mut self, end: &End, parts: &[Part]) -> Option<(Title, String)> {
        if !matches!(end, End::Completed(_)) {
            return None;
        }
        let title = self.fold.as_mut()?.title.take()?;
        Some((title, super::auxiliary::answer_start(parts)))
    }

    /// D4: leaves the turn to another replica. A failed write leaves it this replica's,
    /// and it is taken over all the same once the lease is given up (counted as a
    /// takeover then).
    async fn hand_over(&self) {
        let ids = self.ids;
        let handed = tokio::time::timeout(
            WRITE_ATTEMPT_BOUND,
            self.deps.store.hand_over(ids.team, ids.turn, ids.replica),
        )
        .await;
        match handed {
            Ok(Ok(_)) => tracing::info!(turn = %ids.turn, "turn handed over at a step boundary"),
            Ok(Err(err)) => {
                tracing::warn!(turn = %ids.turn, class = err.metric_label(), "could not hand the turn over")
            }
            Err(_) => {
                tracing::warn!(turn = %ids.turn, class = "timeout", "could not hand the turn over")
            }
        }
    }

    /// Every route failed before any output while the client waits for its answer: the
    /// client gets an error status, not a stream, and the user message goes with the
    /// failure, so the same message id may be sent again.
    pub(super) async fn unanswered(
        &mut self,
        err: ProviderError,
        progress: Progress,
        unfinished: &mut Unfinished,
    ) {
        tracing::warn!(turn = %self.ids.turn, class = err.metric_label(), "every model route failed");
        record_usage(&progress.usage_log);
        record_turn(progress.calls_made, progress.tool_calls, "failed");
        let billed = billed_tokens(&progress.usage_log);
        self.persist(TurnEnd {
            status: TurnStatus::Failed,
            error_code: Some(err.code()),
            assistant: None,
            usage: progress.usage_log,
            withdraw_user_message: true,
            approvals: Vec::new(),
        })
        .await;
        // The message taken back bumped the chat's version: nothing kept of it holds.
        self.deps.bases.forget(self.ids.team, self.ids.chat);
        unfinished.written();
        // Released before the client hears of the failure, so the retry that a
        // `Retry-After` invites does not find the agent busy.
        self.budget.release(billed).await;
        if let Some(started) = self.client.started.take() {
            let _ = started.send(Err(err.into()));
        }
    }

    /// Writes the end state and answers the chunk that ends the stream. Answers whether an
    /// assistant message was stored (the history grew).
    async fn finish(
        &self,
        end: End,
        assistant_id: MessageId,
        parts: Vec<Part>,
        usage_log: Vec<ModelCallUsage>,
    ) -> (bool, UiChunk) {
        let lost = || {
            UiChunk::error(
                ErrorCode::StoreUnavailable,
                "the answer could not be stored",
            )
        };
        // `wrap_up` writes nothing of a turn taken over or handed over.
        let Some(ending) = self.ending(end) else {
            return (false, lost());
        };
        let stored = self
            .persist(TurnEnd {
                status: ending.status,
                error_code: ending.error_code,
                assistant: ending.complete.map(|complete| AssistantMessage {
                    id: assistant_id,
                    parts,
                    complete,
                }),
                usage: usage_log,
                // The client has seen output: the user message stays, bound to this turn.
                withdraw_user_message: false,
                approvals: ending.approvals,
            })
            .await;
        match ending.last {
            Last::Finish(finish_reason) if stored => (true, UiChunk::Finish { finish_reason }),
            Last::Finish(_) => (false, lost()),
            Last::Error(code, text) => (false, UiChunk::error(code, &text)),
        }
    }

    /// What `end` writes, and how the stream ends; `None` for a turn this replica no
    /// longer ends (taken over, handed over).
    fn ending(&self, end: End) -> Option<Ending> {
        let done = |status, complete, approvals, reason| Ending {
            status,
            error_code: None,
            complete: Some(complete),
            approvals,
            last: Last::Finish(reason),
        };
        let failed = |code, text: String| Ending {
            status: TurnStatus::Failed,
            error_code: Some(code),
            complete: None,
            approvals: Vec::new(),
            last: Last::Error(code, text),
        };
        Some(match end {
            End::TakenOver | End::HandedOver => return None,
            End::AwaitingApproval(waiting) => {
                tracing::info!(turn = %self.ids.turn, approvals = waiting.len(), "turn awaits approval");
                done(
                    TurnStatus::Completed,
                    true,
                    waiting,
                    FinishReason::ToolCalls,
                )
            }
            End::Completed(reason) => done(TurnStatus::Completed, true, Vec::new(), reason),
            End::Interrupted => {
                // X1: its principal's authority ended under a turn no stream follows.
                let revoked = self
                    .lost
                    .as_ref()
                    .is_some_and(CancellationToken::is_cancelled)
                    .then_some(ErrorCode::Unauthorized);
                tracing::info!(turn = %self.ids.turn, revoked = revoked.is_some(), "turn cancelled");
                Ending {
                    error_code: revoked,
                    ..done(
                        TurnStatus::Interrupted,
                        false,
                        Vec::new(),
                        FinishReason::Interrupted,
                    )
                }
            }
            End::Refused(refusal) => {
                tracing::info!(turn = %self.ids.turn, field = refusal.field.name(), "budget spent mid-turn");
                failed(refusal.code(), refusal.message())
            }
            End::QuotaUnknown => failed(
                ErrorCode::StoreUnavailable,
                "the team's budget could not be checked; the turn stopped".into(),
            ),
            End::Stuck => {
                tracing::warn!(turn = %self.ids.turn, "turn made no progress; ending it failed");
                failed(
                    ErrorCode::TurnStuck,
                    "the turn made no progress for too long and was ended".into(),
                )
            }
            End::Failed(err) => {
                tracing::warn!(turn = %self.ids.turn, class = err.metric_label(), "model call failed mid-turn");
                failed(err.code(), err.public_message())
            }
        })
    }

    /// Writes the end state; `false` when it could not be written whole. Then the turn is
    /// ended `failed` with `store_unavailable` and its model calls are billed on their
    /// own, so it never stays `running`: only a store unreachable for the whole wrap-up
    /// leaves it so, for the replica's lease to settle.
    async fn persist(&self, end: TurnEnd) -> bool {
        // The answer exists only in this task until the write lands, so transient failures
        // are waited out. A retried attempt that had landed unseen fails on the assistant
        // message's id, and the fallback then finds the turn no longer `running`.
        let ids = (self.ids.team, self.ids.agent, self.ids.chat, self.ids.turn);
        let written = retrying(self.ids.turn, WRAP_UP_PATIENCE, || {
            self.deps.store.finish_turn(ids, self.ids.replica, &end)
        })
        .await;
        let class = match written {
            Ok(billed_at) => {
                self.budget.billed_at(billed_at);
                return true;
            }
            // D3: the turn runs on another replica now, which writes its end (and bills
            // its model calls, recorded in its progress).
            Err(TAKEN_OVER) => {
                tracing::info!(turn = %self.ids.turn, "turn taken over by another replica; its end is theirs");
                return false;
            }
            Err(class) => class,
        };
        tracing::error!(turn = %self.ids.turn, class, "could not write the turn's end state; ending it failed");
        // Boxed: `fail_turn`'s transaction would otherwise weigh in every turn task's
        // future, which the spawn moves (measured in docs/design/performance-history.md:
        // futures not moved whole).
        Box::pin(self.fall_back(&end)).await;
        false
    }

    /// What `persist` does when the end state could not be written: the turn ended
    /// `failed`, its model calls billed.
    async fn fall_back(&self, end: &TurnEnd) {
        let team = self.ids.team;
        let turn = self.ids.turn;
        match retrying(self.ids.turn, FALLBACK_PATIENCE, || {
            self.deps
                .store
                .fail_turn(team, turn, self.ids.replica, ErrorCode::StoreUnavailable)
        })
        .await
        {
            Ok(_) => {}
            Err(class) => {
                tracing::error!(turn = %self.ids.turn, class, "could not end the turn; it stays running");
            }
        }
        // The model calls were made: they are billed even though the answer is lost.
        match retrying(self.ids.turn, FALLBACK_PATIENCE, || {
            self.deps
                .store
                .record_model_calls(team, self.ids.agent, turn, &end.usage)
        })
        .await
        {
            Ok(billed_at) => {
                if let Some(billed_at) = billed_at {
                    self.budget.billed_at(billed_at);
                }
            }
            Err(class) => {
                tracing::error!(turn = %self.ids.turn, class, "could not bill the turn's model calls");
            }
        }
    }
}

/// Runs `write` (each attempt bounded) until it succeeds, fails for good, or
/// `patience` is spent; the error is its class, for the log.
pub(super) async fn retrying<T, W, F>(
    turn: TurnId,
    patience: Duration,
    mut write: W,
) -> Result<T, &'static str>
where
    W: FnMut() -> F,
    F: Future<Output = Result<T, StoreError>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    let pauses = std::iter::successors(Some(Duration::from_millis(20)), |pause| {
        Some((*pause * 2).min(Duration::from_secs(1)))
    });
    let attempt = || {
        let written = tokio::time::timeout(WRITE_ATTEMPT_BOUND, write());
        async move {
            match written.await {
                Ok(Ok(done)) => Ok(done),
                Ok(Err(err)) => Err((err.metric_label(), err.is_transient())),
                Err(_) => Err(("timeout", true)),
            }
        }
    };
    attempt
        .retry(pauses)
        .sleep(tokio::time::sleep)
        .when(|&(_, transient)| transient)
        .adjust(|_, pause| pause.filter(|p| tokio::time::Instant::now() + *p < deadline))
        .notify(|&(class, _), _| {
            tracing::info!(turn = %turn, class, "store failed at wrap-up; trying again");
        })
        .await
        .map_err(|(class, _)| class)
}

/// Ends the turn `failed` (`internal`) if the task stops before its end state was written:
/// a panic unwinds through it. Dropping it after [`Unfinished::written`] does nothing.
pub(super) struct Unfinished {
    store: Option<Store>,
    ids: Ids,
}

impl Unfinished {
    pub fn new(store: &Store, ids: Ids) -> Self {
        Self {
            store: Some(store.clone()),
            ids,
        }
    }

    pub fn written(&mut self) {
        self.store = None;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        tracing::error!(turn = %self.ids.turn, "turn task ended without an end state; ending it failed");
        let Ids {
            team,
            turn,
            replica,
            ..
        } = self.ids;
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let ended = tokio::time::timeout(
                    WRITE_ATTEMPT_BOUND,
                    store.fail_turn(team, turn, replica, ErrorCode::Internal),
                )
                .await;
                if !matches!(ended, Ok(Ok(_))) {
                    tracing::error!(turn = %turn, "could not end the turn; it stays running");
                }
            });
        }
    }
}

/// Input + output tokens of every model call, as billed.
fn billed_tokens(usage_log: &[ModelCallUsage]) -> u64 {
    usage_log
        .iter()
        .map(|u| u.input_tokens.unwrap_or(0) + u.output_tokens.unwrap_or(0))
        .sum()
}

/// What the `turn` span (the task's current span) ends with.
fn record_turn(model_calls: u32, tool_calls: usize, outcome: &'static str) {
    let span = tracing::Span::current();
    span.record("model_calls", model_calls);
    span.record("tool_calls", tool_calls);
    span.record("outcome", outcome);
}

/// The GenAI usage of the `turn` span (`invoke_agent`): the tokens of its model calls,
/// each total only when some call reported it.
fn record_usage(usage_log: &[ModelCallUsage]) {
    let span = tracing::Span::current();
    let total = |of: fn(&ModelCallUsage) -> Option<u64>| {
        usage_log
            .iter()
            .filter_map(of)
            .reduce(|a, b| a.saturating_add(b))
    };
    if let Some(tokens) = total(|u| u.input_tokens) {
        span.record("gen_ai.usage.input_tokens", tokens);
    }
    if let Some(tokens) = total(|u| u.output_tokens) {
        span.record("gen_ai.usage.output_tokens", tokens);
    }
}
