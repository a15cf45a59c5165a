//! Admission (T9, T2): one turn per agent and the team's budgets, decided before anything
//! is written or started, and the turn's [`Budget`] from then on.
//!
//! The Redis-or-Postgres choice is made here, once: a turn admitted through the hold's
//! script is counted in Redis for its whole life (its further model calls reserve through
//! the hold); a turn admitted while Redis was unreachable is counted from Postgres
//! (`quota::fallback`), and so is every further call of a turn whose Redis went away.

use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use protocol::{AgentId, ErrorCode, QuotaScope, TeamId, TurnId};

use super::TurnError;
use super::queue::Queue;
use crate::Engine;
use crate::hold::{Admitted, Billed, HoldGuard, Holder, Reserved, TurnAdmission};
use crate::quota::{
    Field, Levels, Limits, Periods, Quotas, RateLimitHeaders, Refusal, TeamSettings, fallback,
};
use store::webhooks::{self, WebhookEvent};
use store::{Store, StoreError, bounded};

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
    /// The end user behind the turn (L4), and its limits when it has a turn limit of its
    /// own; an API key's turn has neither and counts at the team's level only.
    user: Option<String>,
    user_limits: Option<Limits>,
    /// Counted in Redis (reserve through the hold) or, Redis being unreachable at intake,
    /// from Postgres.
    counted_in_redis: bool,
    /// What the admission left of the team's and the user's limits, for the response's
    /// `RateLimit` (the tighter level per field).
    pub headers: RateLimitHeaders,
    /// When the wrap-up wrote the turn's billing events (Postgres' clock), for its
    /// settlement in the budget counters.
    billed_at: OnceLock<DateTime<Utc>>,
}

/// The hold and the quota decision; a refusal or a busy agent is the caller's answer.
/// `reservation` is the most the first model call can spend; `user` the end user behind
/// the turn (a JWT's subject), whose own limits it counts against too (L4).
pub(super) async fn admit(
    state: &Engine,
    team: TeamId,
    agent: AgentId,
    turn: TurnId,
    reservation: u64,
    user: Option<&str>,
) -> Result<Budget, TurnError> {
    let admission = TurnAdmission {
        team,
        agent,
        turn,
        user,
        reservation,
    };
    let periods = state.quotas.periods();
    let budget = |hold, limits, levels: &Levels, counted_in_redis| Budget {
        store: state.store.clone(),
        quotas: state.quotas.clone(),
        team,
        agent,
        queue: state.queue.clone(),
        hold,
        limits,
        user: user.map(str::to_owned),
        user_limits: levels.user.map(|u| u.limits),
        counted_in_redis,
        headers: RateLimitHeaders::levels(levels, &periods),
        billed_at: OnceLock::new(),
    };
    let mut admitted = state.holds.admit(&state.quotas, admission).await?;
    if let Admitted::Busy {
        running,
        holder: Some(holder),
    } = &admitted
        && left_behind(state, team, agent, *running, holder).await
    {
        admitted = state.holds.admit(&state.quotas, admission).await?;
    }
    match admitted {
        Admitted::Held { guard, levels } => {
            Ok(budget(Some(guard), levels.team.limits, &levels, true))
        }
        Admitted::Busy { running, .. } => Err(TurnError::Busy(running)),
        Admitted::Refused(refusal) => Err(refused(state, team, agent, refusal, &periods).await),
        // Never open: the limits and counts come from Postgres instead.
        Admitted::Unavailable => {
            let settings = state.quotas.settings(team).await?;
            let limits = settings.limits;
            let user_limits = user_limits(&state.quotas, team, &settings, user).await?;
            let levels = if limits.limits_turns() || user_limits.is_some() {
                let user = user.zip(user_limits.as_ref());
                match fallback::admit_turn(&state.store, team, user, &limits, reservation, &periods)
                    .await?
                {
                    Ok(levels) => levels,
                    Err(refusal) => {
                        return Err(refused(state, team, agent, refusal, &periods).await);
                    }
                }
            } else {
                Levels::default()
            };
            Ok(budget(None, limits, &levels, false))
        }
    }
}

/// O5: frees the agent of a hold its replica left behind, lost after it took the hold and
/// before it wrote the turn (so no takeover knows of it), and answers whether to admit
/// again. Only a hold of another replica older than a lease is looked at: before that,
/// its replica's lease cannot have lapsed, and a busy agent's refusals cost no read.
/// Postgres not answering leaves the agent busy: unknown is not lost.
async fn left_behind(
    state: &Engine,
    team: TeamId,
    agent: AgentId,
    running: TurnId,
    holder: &Holder,
) -> bool {
    if holder.replica == state.replica || holder.age() < state.config.lease_ttl {
        return false;
    }
    match bounded(state.store.hold_left_behind(team, running, holder.replica)).await {
        Ok(true) => {}
        Ok(false) => return false,
        Err(e) => {
            tracing::warn!(agent = %agent, class = e.metric_label(), "could not check a busy agent's hold");
            return false;
        }
    }
    match state
        .holds
        .release_left_behind(team, agent, running, holder)
        .await
    {
        Ok(freed) => {
            if freed {
                tracing::info!(agent = %agent, turn = %running, replica = %holder.replica, "freed a hold left by a lost replica");
            }
            // Not freed: the hold changed meanwhile; admitting again answers who has it.
            true
        }
        Err(class) => {
            tracing::warn!(agent = %agent, class, "could not free a hold left by a lost replica");
            false
        }
    }
}

/// The end user's limits when it has a turn limit of its own (L4); `None` for an API
/// key's turn, and without a read when the team has neither `per_user` turn limits nor
/// any user's overrides.
async fn user_limits(
    quotas: &Quotas,
    team: TeamId,
    settings: &TeamSettings,
    user: Option<&str>,
) -> Result<Option<Limits>, StoreError> {
    let Some(user) = user.filter(|_| settings.users_limited()) else {
        return Ok(None);
    };
    let limits = quotas.user_limits(team, user).await?.limits;
    Ok(limits.limits_turns().then_some(limits))
}

/// A refused admission, counted; a spent period budget is also the team's
/// `quota.exhausted` webhook event (P4), once per quota and period (its key). Nothing else
/// is written with a refusal, so the event is its own write: when Postgres does not take
/// it the refusal is still answered and the event is lost (docs/design/webhooks.md).
async fn refused(
    state: &Engine,
    team: TeamId,
    agent: AgentId,
    refusal: Refusal,
    periods: &Periods,
) -> TurnError {
    state.metrics.quota_refused(refusal.field);
    // A user's spent budget is the user's business with the team's product, not an event
    // the team subscribed to about its own budget.
    if refusal.code() == ErrorCode::QuotaExhausted && refusal.scope == QuotaScope::Team {
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
            state.store.db(),
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
        let budgets = |limits: &Limits| {
            (limits.tokens_per_day.is_some() || limits.tokens_per_month.is_some()).then_some(
                Limits {
                    tokens_per_day: limits.tokens_per_day,
                    tokens_per_month: limits.tokens_per_month,
                    ..Default::default()
                },
            )
        };
        let team = budgets(&self.limits);
        let user = self
            .user
            .as_deref()
            .zip(self.user_limits.as_ref().and_then(budgets));
        if team.is_none() && user.is_none() {
            return Ok(None);
        }
        let team = team.unwrap_or_default();
        if self.counted_in_redis
            && let Some(hold) = &self.hold
        {
            let user = user.map(|(_, limits)| limits);
            match hold
                .reserve(&self.quotas, &team, user.as_ref(), tokens)
                .await?
            {
                Reserved::Ok => return Ok(None),
                Reserved::Refused(refusal) => return Ok(Some(refusal)),
                Reserved::Unavailable => {}
            }
        }
        let user = user.as_ref().map(|(name, limits)| (*name, limits));
        // This turn is among the running ones Postgres counts, at one reservation each.
        Ok(fallback::admit_turn(
            &self.store,
            self.team,
            user,
            &team,
            tokens,
            &self.quotas.periods(),
        )
        .await?
        .err())
    }

    /// The agent it holds.
    pub fn agent(&self) -> AgentId {
        self.agent
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
        let billed = Billed {
            tokens,
            at: self.billed_at.get().copied(),
            unstarted: false,
        };
        self.settle(billed).await;
    }

    /// Gives the hold back for a turn that never started because its message id's earlier
    /// turn answers it (T12): nothing billed, and not counted as a start of the minute.
    pub async fn unstart(&mut self) {
        let billed = Billed {
            unstarted: true,
            ..Billed::default()
        };
        self.settle(billed).await;
    }

    async fn settle(&mut self, billed: Billed) {
        if let Some(hold) = self.hold.take() {
            hold.release_billed(billed).await;
        }
        self.queue.kick(self.team, self.agent);
    }
}

/// D3: the budget of a turn taken over from a dead replica: its agent's hold adopted (by
/// the turn's id), counted in Redis as its admission was. Redis unreachable, or another
/// turn holding the agent already, leaves it without a hold, counted from Postgres.
pub(super) async fn adopt(
    state: &Engine,
    team: TeamId,
    agent: AgentId,
    turn: TurnId,
    user: Option<&str>,
) -> Result<Budget, TurnError> {
    let settings = state.quotas.settings(team).await?;
    let limits = settings.limits;
    let user_limits = user_limits(&state.quotas, team, &settings, user).await?;
    let counted = limits.limits_turns() || user_limits.is_some();
    let hold = match state.holds.adopt(team, agent, turn, user, counted).await {
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
        user: user.map(str::to_owned),
        user_limits,
        counted_in_redis,
        headers: RateLimitHeaders::turns(&limits, &Default::default(), &state.quotas.periods()),
        billed_at: OnceLock::new(),
    })
}
