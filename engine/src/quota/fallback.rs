//! Turn admission from Postgres, for when Redis is unreachable: never silently open.
//!
//! What it costs, compared with the Redis script: one more Postgres statement per turn (a
//! few indexed counts and sums, about a millisecond), and precision. Nothing is reserved,
//! so each running turn is counted as one reservation on top of the billed tokens; two
//! admissions at the same instant do not see each other, so a budget can be overshot by
//! one reservation per turn admitted in that instant, not one in all.

use std::time::Duration;

use protocol::{QuotaScope, TeamId};

use super::headers::TurnCounts;
use super::{Field, Levels, Limits, Periods, RateLimitHeaders, Refusal, Standing};
use store::{Store, StoreError, bounded};

/// Admits a turn that would reserve `reservation` tokens, or refuses it: against the
/// team's `limits`, and against its end user's when `user` names one with limits of its
/// own (L4; one more statement).
pub async fn admit_turn(
    store: &Store,
    team: TeamId,
    user: Option<(&str, &Limits)>,
    limits: &Limits,
    reservation: u64,
    periods: &Periods,
) -> Result<Result<Levels, Refusal>, StoreError> {
    let mut levels = Levels {
        team: standing(store, team, None, limits, reservation, periods).await?,
        user: None,
    };
    if let Some((user, limits)) = user {
        levels.user = Some(standing(store, team, Some(user), limits, reservation, periods).await?);
    }
    if let Some(refusal) = decide_levels(&levels, periods) {
        return Ok(Err(refusal));
    }
    let admitted = |s: Standing| Standing {
        counts: TurnCounts {
            concurrent_turns: s.counts.concurrent_turns + 1,
            turns_in_window: s.counts.turns_in_window + 1,
            tokens_day: s.counts.tokens_day.saturating_add(reservation),
            tokens_month: s.counts.tokens_month.saturating_add(reservation),
            ..s.counts
        },
        ..s
    };
    Ok(Ok(Levels {
        team: admitted(levels.team),
        user: levels.user.map(admitted),
    }))
}

/// One level as Postgres sees it: each running turn counted as one reservation on top of
/// the billed tokens.
async fn standing(
    store: &Store,
    team: TeamId,
    user: Option<&str>,
    limits: &Limits,
    reservation: u64,
    periods: &Periods,
) -> Result<Standing, StoreError> {
    let seen = bounded(store.turn_usage(team, user, &periods.since())).await?;
    let in_flight = seen.running.saturating_mul(reservation);
    Ok(Standing {
        limits: *limits,
        counts: TurnCounts {
            concurrent_turns: seen.running,
            turns_in_window: seen.recent,
            window_reset: seen.window_reset,
            tokens_day: seen.tokens_day.saturating_add(in_flight),
            tokens_month: seen.tokens_month.saturating_add(in_flight),
        },
    })
}

/// [`decide_levels`] for the team's level alone.
pub fn decide(limits: &Limits, counts: &TurnCounts, periods: &Periods) -> Option<Refusal> {
    let levels = Levels {
        team: Standing {
            limits: *limits,
            counts: *counts,
        },
        user: None,
    };
    decide_levels(&levels, periods)
}

/// The rule the Redis script applies too (`hold.rs`), in the same order: the team's level
/// first, then the user's; at each, a turn is refused when a concurrency or rate limit is
/// reached, or when a budget has nothing left (billed + reserved at or over the limit). A
/// budget with anything left admits the turn's whole reservation: that is the one
/// reservation a budget may be overshot by.
pub fn decide_levels(levels: &Levels, periods: &Periods) -> Option<Refusal> {
    let team = reason(&levels.team, periods).map(|r| (QuotaScope::Team, r));
    let (scope, (field, limit, retry_after)) = team.or_else(|| {
        let user = levels.user.as_ref()?;
        reason(user, periods).map(|r| (QuotaScope::User, r))
    })?;
    Some(Refusal {
        scope,
        field,
        limit,
        retry_after,
        headers: RateLimitHeaders::levels(levels, periods),
    })
}

/// Which limit of one level refuses, its value and when to try again.
fn reason(level: &Standing, periods: &Periods) -> Option<(Field, u64, Duration)> {
    let (limits, counts) = (&level.limits, &level.counts);
    if let Some(limit) = limits.concurrent_turns
        && counts.concurrent_turns >= limit
    {
        return Some((Field::ConcurrentTurns, limit, Duration::from_secs(1)));
    }
    if let Some(limit) = limits.turns_per_minute
        && counts.turns_in_window >= limit
    {
        return Some((Field::TurnsPerMinute, limit, counts.window_reset));
    }
    if let Some(limit) = limits.tokens_per_day
        && counts.tokens_day >= limit
    {
        return Some((Field::TokensPerDay, limit, periods.until_day_end()));
    }
    if let Some(limit) = limits.tokens_per_month
        && counts.tokens_month >= limit
    {
        return Some((Field::TokensPerMonth, limit, periods.until_month_end()));
    }
    None
}
