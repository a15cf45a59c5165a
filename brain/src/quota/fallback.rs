//! Turn admission from Postgres, for when Redis is unreachable: never silently open.
//!
//! What it costs, compared with the Redis script: one more Postgres statement per turn (a
//! few indexed counts and sums, about a millisecond), and precision. Nothing is reserved,
//! so each running turn is counted as one reservation on top of the billed tokens; two
//! admissions at the same instant do not see each other, so a budget can be overshot by
//! one reservation per turn admitted in that instant, not one in all.

use std::time::Duration;

use protocol::TeamId;

use super::headers::TurnCounts;
use super::{Field, Limits, Periods, RateLimitHeaders, Refusal};
use crate::store::{Store, StoreError, bounded};

/// Admits a turn that would reserve `reservation` tokens, or refuses it.
pub async fn admit_turn(
    store: &Store,
    team: TeamId,
    limits: &Limits,
    reservation: u64,
    periods: &Periods,
) -> Result<Result<TurnCounts, Refusal>, StoreError> {
    let seen = bounded(store.turn_usage(team, &periods.since())).await?;
    let in_flight = seen.running.saturating_mul(reservation);
    let counts = TurnCounts {
        concurrent_turns: seen.running,
        turns_in_window: seen.recent,
        window_reset: seen.window_reset,
        tokens_day: seen.tokens_day.saturating_add(in_flight),
        tokens_month: seen.tokens_month.saturating_add(in_flight),
    };
    Ok(match decide(limits, &counts, periods) {
        Some(refusal) => Err(refusal),
        None => Ok(TurnCounts {
            concurrent_turns: counts.concurrent_turns + 1,
            turns_in_window: counts.turns_in_window + 1,
            tokens_day: counts.tokens_day.saturating_add(reservation),
            tokens_month: counts.tokens_month.saturating_add(reservation),
            ..counts
        }),
    })
}

/// The rule the Redis script applies too (`hold.rs`), in the same order: a turn is
/// refused when a concurrency or rate limit is reached, or when a budget has nothing
/// left (billed + reserved at or over the limit). A budget with anything left admits the
/// turn's whole reservation: that is the one reservation a budget may be overshot by.
pub fn decide(limits: &Limits, counts: &TurnCounts, periods: &Periods) -> Option<Refusal> {
    let headers = || RateLimitHeaders::turns(limits, counts, periods);
    let refuse = |field: Field, limit: u64, retry_after: Duration| {
        Some(Refusal {
            field,
            limit,
            retry_after,
            headers: headers(),
        })
    };
    if let Some(limit) = limits.concurrent_turns
        && counts.concurrent_turns >= limit
    {
        return refuse(Field::ConcurrentTurns, limit, Duration::from_secs(1));
    }
    if let Some(limit) = limits.turns_per_minute
        && counts.turns_in_window >= limit
    {
        return refuse(Field::TurnsPerMinute, limit, counts.window_reset);
    }
    if let Some(limit) = limits.tokens_per_day
        && counts.tokens_day >= limit
    {
        return refuse(Field::TokensPerDay, limit, periods.until_day_end());
    }
    if let Some(limit) = limits.tokens_per_month
        && counts.tokens_month >= limit
    {
        return refuse(Field::TokensPerMonth, limit, periods.until_month_end());
    }
    None
}
