//! The IETF `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers):
//! one list item per limit the team has, named like the quota's field, so a client can
//! pace itself before it is refused.
//!
//! `RateLimit-Policy: "turns_per_minute";q=60;w=60, "tokens_per_day";q=100000;w=86400;qu="tokens"`
//! `RateLimit: "turns_per_minute";r=59;t=60, "tokens_per_day";r=98220;t=41100`
//!
//! A refusal of the request rate limit (`crate::ratelimit`) names its token bucket
//! `requests`: its burst over the seconds it takes to fill, and what is left of it.

use std::fmt::Write;
use std::time::Duration;

use super::{Field, Limits, Periods, RequestLimit, Used};

/// What a turn's admission saw of the team's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TurnCounts {
    pub concurrent_turns: u64,
    pub turns_in_window: u64,
    /// Until the oldest turn of the window leaves it.
    pub window_reset: Duration,
    /// Billed plus reserved, this UTC day and month.
    pub tokens_day: u64,
    pub tokens_month: u64,
}

/// The two header values; empty when the team has no limit they describe.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateLimitHeaders {
    policy: String,
    status: String,
}

/// A turn's standing at one level of its quotas: the limits, and what the turn leaves of
/// them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Standing {
    pub limits: Limits,
    pub counts: TurnCounts,
}

/// The levels a turn counts at: its team's, and its end user's (L4) when the user has a
/// turn limit of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Levels {
    pub team: Standing,
    pub user: Option<Standing>,
}

/// One list item, before it is written.
#[derive(Clone, Copy)]
struct Item {
    /// The quota's field name, or `requests` for the request rate limit.
    name: &'static str,
    quota: u64,
    window: Option<u64>,
    unit: Option<&'static str>,
    used: u64,
    reset: Option<u64>,
}

impl Item {
    fn remaining(&self) -> u64 {
        self.quota.saturating_sub(self.used)
    }
}

/// The turn-path items of one level, in the fields' order.
fn turn_items(limits: &Limits, counts: &TurnCounts, periods: &Periods) -> Vec<Item> {
    let month = (periods.month_end - periods.month_start)
        .num_seconds()
        .max(1);
    let mut items = Vec::with_capacity(4);
    if let Some(quota) = limits.turns_per_minute {
        items.push(Item {
            name: Field::TurnsPerMinute.name(),
            quota,
            window: Some(60),
            unit: None,
            used: counts.turns_in_window,
            reset: Some(counts.window_reset.as_secs().max(1)),
        });
    }
    if let Some(quota) = limits.concurrent_turns {
        items.push(Item {
            name: Field::ConcurrentTurns.name(),
            quota,
            window: None,
            unit: Some("concurrent-requests"),
            used: counts.concurrent_turns,
            reset: None,
        });
    }
    if let Some(quota) = limits.tokens_per_day {
        items.push(Item {
            name: Field::TokensPerDay.name(),
            quota,
            window: Some(86_400),
            unit: Some("tokens"),
            used: counts.tokens_day,
            reset: Some(periods.until_day_end().as_secs()),
        });
    }
    if let Some(quota) = limits.tokens_per_month {
        items.push(Item {
            name: Field::TokensPerMonth.name(),
            quota,
            window: Some(u64::try_from(month).unwrap_or(1)),
            unit: Some("tokens"),
            used: counts.tokens_month,
            reset: Some(periods.until_month_end().as_secs()),
        });
    }
    items
}

impl RateLimitHeaders {
    /// The turn-path limits: turns per minute, concurrent turns, tokens per day and month.
    pub fn turns(limits: &Limits, counts: &TurnCounts, periods: &Periods) -> Self {
        let mut h = Self::default();
        for item in turn_items(limits, counts, periods) {
            h.push(&item);
        }
        h
    }

    /// The turn-path limits of both levels (L4): per field, the level with less left (the
    /// team's on a tie), so a client paces itself by whichever refuses it first.
    pub fn levels(levels: &Levels, periods: &Periods) -> Self {
        let team = turn_items(&levels.team.limits, &levels.team.counts, periods);
        let user = levels
            .user
            .map(|u| turn_items(&u.limits, &u.counts, periods))
            .unwrap_or_default();
        let mut h = Self::default();
        let order = [
            Field::TurnsPerMinute,
            Field::ConcurrentTurns,
            Field::TokensPerDay,
            Field::TokensPerMonth,
        ];
        for field in order {
            let of = |items: &[Item]| items.iter().find(|i| i.name == field.name()).copied();
            let tighter = match (of(&team), of(&user)) {
                (Some(t), Some(u)) if u.remaining() < t.remaining() => Some(u),
                (Some(t), _) => Some(t),
                (None, u) => u,
            };
            if let Some(item) = tighter {
                h.push(&item);
            }
        }
        h
    }

    /// The session-path limits: concurrent worker sessions, worker-seconds per day.
    pub fn sessions(limits: &Limits, used: &Used, periods: &Periods) -> Self {
        let mut h = Self::default();
        if let Some(quota) = limits.concurrent_sessions {
            h.push(&Item {
                name: Field::ConcurrentSessions.name(),
                quota,
                window: None,
                unit: Some("concurrent-requests"),
                used: used.concurrent_sessions,
                reset: None,
            });
        }
        if let Some(quota) = limits.worker_seconds_per_day {
            h.push(&Item {
                name: Field::WorkerSecondsPerDay.name(),
                quota,
                window: Some(86_400),
                unit: Some("seconds"),
                used: used.worker_seconds_per_day,
                reset: Some(periods.until_day_end().as_secs()),
            });
        }
        h
    }

    /// A request rate limit's token bucket, as one policy: its burst over the
    /// seconds the bucket takes to fill, and what is left of it until it is full again.
    pub fn requests(limit: RequestLimit, left: u64, until_full: Duration) -> Self {
        let mut h = Self::default();
        h.push(&Item {
            name: "requests",
            quota: limit.burst,
            window: Some(limit.burst.div_ceil(limit.per_second.max(1))),
            unit: None,
            used: limit.burst.saturating_sub(left),
            reset: Some(until_full.as_secs_f64().ceil() as u64),
        });
        h
    }

    fn push(&mut self, item: &Item) {
        let sep = |s: &mut String| {
            if !s.is_empty() {
                s.push_str(", ");
            }
        };
        sep(&mut self.policy);
        let _ = write!(self.policy, "\"{}\";q={}", item.name, item.quota);
        if let Some(w) = item.window {
            let _ = write!(self.policy, ";w={w}");
        }
        if let Some(unit) = item.unit {
            let _ = write!(self.policy, ";qu=\"{unit}\"");
        }
        sep(&mut self.status);
        let _ = write!(self.status, "\"{}\";r={}", item.name, item.remaining());
        if let Some(t) = item.reset {
            let _ = write!(self.status, ";t={t}");
        }
    }

    pub fn is_empty(&self) -> bool {
        self.policy.is_empty()
    }

    /// The two fields as (name, value), for a front end's response; `None` when the
    /// team has no limit they describe. Built from integers and field names only.
    pub fn fields(&self) -> Option<[(&'static str, &str); 2]> {
        (!self.is_empty()).then_some([
            ("ratelimit-policy", self.policy.as_str()),
            ("ratelimit", self.status.as_str()),
        ])
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};

    use super::*;

    #[test]
    fn items_follow_the_draft_syntax() {
        let limits = Limits {
            turns_per_minute: Some(60),
            concurrent_turns: Some(4),
            tokens_per_day: Some(1000),
            ..Limits::default()
        };
        let counts = TurnCounts {
            concurrent_turns: 1,
            turns_in_window: 61,
            window_reset: Duration::from_millis(12_400),
            tokens_day: 250,
            tokens_month: 250,
        };
        let periods = Periods::at(Utc.with_ymd_and_hms(2026, 12, 1, 23, 0, 0).unwrap());
        let h = RateLimitHeaders::turns(&limits, &counts, &periods);
        assert_eq!(
            h.policy,
            "\"turns_per_minute\";q=60;w=60, \"concurrent_turns\";q=4;qu=\"concurrent-requests\", \
             \"tokens_per_day\";q=1000;w=86400;qu=\"tokens\""
        );
        assert_eq!(
            h.status,
            "\"turns_per_minute\";r=0;t=12, \"concurrent_turns\";r=3, \"tokens_per_day\";r=750;t=3600"
        );
        assert_eq!(h.fields().map(|f| f.len()), Some(2));
        let user = Standing {
            limits: Limits {
                tokens_per_day: Some(300),
                concurrent_turns: Some(10),
                ..Limits::default()
            },
            counts,
        };
        let both = Levels {
            team: Standing { limits, counts },
            user: Some(user),
        };
        let h = RateLimitHeaders::levels(&both, &periods);
        assert_eq!(
            h.status,
            "\"turns_per_minute\";r=0;t=12, \"concurrent_turns\";r=3, \
             \"tokens_per_day\";r=50;t=3600",
            "per field the level with less left: the user's day, the team's others"
        );
        assert!(h.policy.contains("\"tokens_per_day\";q=300;"));
        assert!(RateLimitHeaders::turns(&Limits::default(), &counts, &periods).is_empty());
    }

    #[test]
    fn a_request_bucket_is_its_burst_over_the_seconds_it_takes_to_fill() {
        let limit = RequestLimit {
            per_second: 200,
            burst: 500,
        };
        let h = RateLimitHeaders::requests(limit, 0, Duration::from_millis(2_499));
        assert_eq!(h.policy, "\"requests\";q=500;w=3");
        assert_eq!(h.status, "\"requests\";r=0;t=3");
    }
}
