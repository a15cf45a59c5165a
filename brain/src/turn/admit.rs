//! Admission (T9, T2): one turn per agent and the team's budgets, decided before anything
//! is written or started, and the turn's [`Budget`] from then on.
//!
//! The Redis-or-Postgres choice is made here, once: a turn admitted through the hold's
//! script is counted in Redis for its whole life (its further model calls reserve through
//! the hold); a turn admitted while Redis was unreachable is counted from Postgres
//! (`quota::fallback`), and so is every further call of a turn whose Redis went away.

use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use protocol::{AgentId, ErrorCode, TeamId, TurnId};

use super::TurnError;
use super::queue::Queue;
use crate::AppState;
use crate::hold::{Admitted, Billed, HoldGuard, Reserved, TurnAdmission};
use crate::quota::{Field, Limits, Periods, Quotas, RateLimitHeaders, Refusal, fallback};
use crate::store::webhooks::{self, WebhookEvent};
use crate::store::{Store, StoreError, bounded};

/// A turn's standing against the agent's hold and the team's budgets, from admission to
/// wrap-up.
pub(super) struct Budget {
    store: Store,
    quotas: Quotas,
    team: TeamId,
    agent: AgentId,
    /// Told when the hold is given back: the agent's next queued turn may start (T13).
    queue: Queue,
    /// Released at wrap-up (T7); `None` when Redis was unreachable at intake.
    hold: Option<HoldGuard>,
    limits: Limits,
    /// Counted in Redis (reserve through the hold) or, Redis being unreachable at intake,
    /// from Postgres.
    counted_in_redis: bool,
    /// What the admission left of the team's limits, for the response's `RateLimit`.
    pub headers: RateLimitHeaders,
    /// When the wrap-up wrote the turn's billing events (Postgres' clock), for its
    /// settlement in the budget counters.
    billed_at: OnceLock<DateTime<Utc>>,
}

/// The hold and the quota decision; a refusal or a busy agent is the caller's answer.
/// `reservation` is the most the first model call can spend.
pub(super) async fn admit(
    state: &AppState,
    team: TeamId,
    agent: AgentId,
    turn: TurnId,
    reservation: u64,
) -> Result<Budget, TurnError> {
    let admission = TurnAdmission {
        team,
        agent,
        turn,
        reservation,
    };
    let periods = Periods::now();
    let budget = |hold, limits, counts: &_, counted_in_redis| Budget {
        store: state.store.clone(),
        quotas: state.quotas.clone(),
        team,
        agent,
        queue: state.queue.clone(),
        hold,
        limits,
        counted_in_redis,
        headers: RateLimitHeaders::turns(&limits, counts, &periods),
        billed_at: OnceLock::new(),
    };
    match state.holds.admit(&state.quotas, admission).await? {
        Admitted::Held {
            guard,
            limits,
            counts,
        } => Ok(budget(Some(guard), limits, &counts, true)),
        Admitted::Busy { running } => Err(TurnError::Busy(running)),
        Admitted::Refused(refusal) => Err(refused(state, team, agent, refusal, &periods).await),
        // Never open: the team's limits and counts come from Postgres instead.
        Admitted::Unavailable => {
            let limits = state.quotas.limits(team).await?;
            let counts = if limits.limits_turns() {
                match fallback::admit_turn(&state.store, team, &limits, reservation, &periods)
                    .await?
                {
                    Ok(counts) => counts,
                    Err(refusal) => {
                        return Err(refused(state, team, agent, refusal, &periods).await);
                    }
                }
            } else {
                Default::default()
            };
            Ok(budget(None, limits, &counts, false))
        }
    }
}

/// A refused admission, counted; a spent period budget is also the team's
/// `quota.exhausted` webhook event (P4), once per quota and period (its key). Nothing else
/// is written with a refusal, so the event is its own write: when Postgres does not take
/// it the refusal is still answered and the event is lost (docs/design/webhooks.md).
async fn refused(
    state: &AppState,
    team: TeamId,
    agent: AgentId,
    refusal: Refusal,
    periods: &Periods,
) -> TurnError {
    state.metrics.quota_refused(refusal.field);
    if refusal.code() == ErrorCode::QuotaExhausted {
        let period = match refusal.field {
            Field::TokensPerMonth => periods.month_tag(),
            _ => periods.day_tag(),
        };
        let data = serde_json::json!({
            "quota": refusal.field.name(),
            "limit": refusal.limit,
            "period": period,
            "agent_id": agent,
            "retry_after_secs": refusal.retry_after.as_secs(),
        });
        let key = format!("{}:{period}", refusal.field.name());
        let written = bounded(webhooks::enqueue(
            state.store.pool(),
            team,
            WebhookEvent::QuotaExhausted,
            &key,
            &data,
        ))
        .await;
        if let Err(e) = written {
            tracing::warn!(team = %team, class = e.metric_label(), "quota.exhausted event not recorded");
        }
    }
    TurnError::Quota(refusal)
}

impl Budget {
    /// Reserves a further model call against the team's token budgets: through the hold's
    /// counters, or from Postgres when the turn was admitted without Redis or Redis went
    /// away since. `Some` is a refusal.
    pub async fn reserve(&self, tokens: u64) -> Result<Option<Refusal>, StoreError> {
        let limits = &self.limits;
        if limits.tokens_per_day.is_none() && limits.tokens_per_month.is_none() {
            return Ok(None);
        }
        if self.counted_in_redis
            && let Some(hold) = &self.hold
        {
            match hold.reserve(&self.quotas, limits, tokens).await? {
                Reserved::Ok => return Ok(None),
                Reserved::Refused(refusal) => return Ok(Some(refusal)),
                Reserved::Unavailable => {}
            }
        }
        let budgets = Limits {
            tokens_per_day: limits.tokens_per_day,
            tokens_per_month: limits.tokens_per_month,
            ..Default::default()
        };
        // This turn is among the running ones Postgres counts, at one reservation each.
        Ok(
            fallback::admit_turn(&self.store, self.team, &budgets, tokens, &Periods::now())
                .await?
                .err(),
        )
    }

    /// Remembers when the turn's billing events were written.
    pub fn billed_at(&self, at: DateTime<Utc>) {
        let _ = self.billed_at.set(at);
    }

    /// Lets the hold go without releasing it: another replica took the turn over (D3).
    pub fn abandon(&mut self) {
        if let Some(hold) = self.hold.take() {
            hold.abandon();
        }
    }

    /// Gives the hold back, settling the reservations on the `tokens` billed. Also for a
    /// turn that ends before it was written (nothing billed).
    pub async fn release(&mut self, tokens: u64) {
        if let Some(hold) = self.hold.take() {
            let billed = Billed {
                tokens,
                at: self.billed_at.get().copied(),
            };
            hold.release_billed(billed).await;
        }
        self.queue.kick(self.team, self.agent);
    }
}

/// D3: the budget of a turn taken over from a dead replica: its agent's hold adopted (by
/// the turn's id), counted in Redis as its admission was. Redis unreachable, or another
/// turn holding the agent already, leaves it without a hold, counted from Postgres.
pub(super) async fn adopt(
    state: &AppState,
    team: TeamId,
    agent: AgentId,
    turn: TurnId,
) -> Result<Budget, TurnError> {
    let limits = state.quotas.limits(team).await?;
    let counted = limits.limits_turns()
        || limits.tokens_per_day.is_some()
        || limits.tokens_per_month.is_some();
    let hold = match state.holds.adopt(team, agent, turn, counted).await {
        Ok(Some(hold)) => Some(hold),
        Ok(None) => {
            tracing::warn!(turn = %turn, agent = %agent, "a taken-over turn's agent is held by another turn");
            None
        }
        Err(class) => {
            tracing::warn!(turn = %turn, class, "could not adopt a taken-over turn's hold");
            None
        }
    };
    let counted_in_redis = counted && hold.is_some();
    Ok(Budget {
        store: state.store.clone(),
        quotas: state.quotas.clone(),
        team,
        agent,
        queue: state.queue.clone(),
        hold,
        limits,
        counted_in_redis,
        headers: RateLimitHeaders::turns(&limits, &Default::default(), &Periods::now()),
        billed_at: OnceLock::new(),
    })
}
