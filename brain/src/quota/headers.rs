//! The IETF `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers):
//! one list item per limit the team has, named like the quota's field, so a client can
//! pace itself before it is refused.
//!
//! `RateLimit-Policy: "turns_per_minute";q=60;w=60, "tokens_per_day";q=100000;w=86400;qu="tokens"`
//! `RateLimit: "turns_per_minute";r=59;t=60, "tokens_per_day";r=98220;t=41100`

use std::fmt::Write;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::{Field, Limits, Periods, Used};

static POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static STATUS: HeaderName = HeaderName::from_static("ratelimit");

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

impl RateLimitHeaders {
    /// The turn-path limits: turns per minute, concurrent turns, tokens per day and month.
    pub fn turns(limits: &Limits, counts: &TurnCounts, periods: &Periods) -> Self {
        let mut h = Self::default();
        let month = (periods.month_end - periods.month_start)
            .num_seconds()
            .max(1);
        if let Some(q) = limits.turns_per_minute {
            let t = counts.window_reset.as_secs().max(1);
            h.item(
                Field::TurnsPerMinute,
                q,
                Some(60),
                None,
                counts.turns_in_window,
                Some(t),
            );
        }
        if let Some(q) = limits.concurrent_turns {
            let unit = Some("concurrent-requests");
            h.item(
                Field::ConcurrentTurns,
                q,
                None,
                unit,
                counts.concurrent_turns,
                None,
            );
        }
        if let Some(q) = limits.tokens_per_day {
            let t = periods.until_day_end().as_secs();
            h.item(
                Field::TokensPerDay,
                q,
                Some(86_400),
                Some("tokens"),
                counts.tokens_day,
                Some(t),
            );
        }
        if let Some(q) = limits.tokens_per_month {
            let t = periods.until_month_end().as_secs();
            let w = u64::try_from(month).unwrap_or(1);
            h.item(
                Field::TokensPerMonth,
                q,
                Some(w),
                Some("tokens"),
                counts.tokens_month,
                Some(t),
            );
        }
        h
    }

    /// The session-path limits: concurrent worker sessions, worker-seconds per day.
    pub fn sessions(limits: &Limits, used: &Used, periods: &Periods) -> Self {
        let mut h = Self::default();
        if let Some(q) = limits.concurrent_sessions {
            let unit = Some("concurrent-requests");
            h.item(
                Field::ConcurrentSessions,
                q,
                None,
                unit,
                used.concurrent_sessions,
                None,
            );
        }
        if let Some(q) = limits.worker_seconds_per_day {
            let t = periods.until_day_end().as_secs();
            let used = used.worker_seconds_per_day;
            h.item(
                Field::WorkerSecondsPerDay,
                q,
                Some(86_400),
                Some("seconds"),
                used,
                Some(t),
            );
        }
        h
    }

    fn item(
        &mut self,
        field: Field,
        quota: u64,
        window: Option<u64>,
        unit: Option<&str>,
        used: u64,
        reset: Option<u64>,
    ) {
        let sep = |s: &mut String| {
            if !s.is_empty() {
                s.push_str(", ");
            }
        };
        sep(&mut self.policy);
        let _ = write!(self.policy, "\"{}\";q={quota}", field.name());
        if let Some(w) = window {
            let _ = write!(self.policy, ";w={w}");
        }
        if let Some(unit) = unit {
            let _ = write!(self.policy, ";qu=\"{unit}\"");
        }
        sep(&mut self.status);
        let _ = write!(
            self.status,
            "\"{}\";r={}",
            field.name(),
            quota.saturating_sub(used)
        );
        if let Some(t) = reset {
            let _ = write!(self.status, ";t={t}");
        }
    }

    pub fn is_empty(&self) -> bool {
        self.policy.is_empty()
    }

    /// Sets both fields on a response; nothing when the team has no such limit.
    pub fn apply(&self, headers: &mut HeaderMap) {
        if self.is_empty() {
            return;
        }
        // Built from integers and field names only, so always a valid header value.
        if let (Ok(policy), Ok(status)) = (
            HeaderValue::from_str(&self.policy),
            HeaderValue::from_str(&self.status),
        ) {
            headers.insert(POLICY.clone(), policy);
            headers.insert(STATUS.clone(), status);
        }
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
        let mut headers = HeaderMap::new();
        h.apply(&mut headers);
        assert_eq!(headers.len(), 2);
        assert!(RateLimitHeaders::turns(&Limits::default(), &counts, &periods).is_empty());
    }
}
