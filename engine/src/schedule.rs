//! Autostart cadences (SPEC T11): what a valid cadence is, and when it fires.
//!
//! A cadence is a 5-field cron expression (minute hour day-of-month month day-of-week), or
//! 6 fields with seconds first, evaluated in an IANA time zone (UTC when none is given),
//! so "0 9 * * *" in `Europe/Paris` fires at 09:00 Paris time on both sides of a DST
//! change. The cron tools, `PATCH /v1/agents/{id}` and the scheduler all parse through
//! [`Cadence::parse`], so none of them accepts a cadence another would refuse. Firings
//! closer than the configured minimum interval (`BRAIN_AUTOSTART_MIN_INTERVAL_SECS`) are
//! refused: each firing is a whole turn.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

const MAX_CRON: usize = 200;
const MAX_TIMEZONE: usize = 64;
/// Firings inspected for the minimum interval.
const INTERVAL_SAMPLE: usize = 16;

/// A parsed cadence in its time zone.
#[derive(Clone, Debug)]
pub struct Cadence {
    cron: Cron,
    tz: Tz,
}

impl Cadence {
    /// Parses `expr` in `timezone` (`None`: UTC); the error names the problem, for the
    /// model or a client.
    pub fn parse(
        expr: &str,
        timezone: Option<&str>,
        min_interval_secs: u32,
    ) -> Result<Self, String> {
        let tz = match timezone {
            None => Tz::UTC,
            Some(name) => parse_timezone(name)?,
        };
        let expr = expr.trim();
        if expr.is_empty() || expr.chars().count() > MAX_CRON {
            return Err(format!("cron must have 1 to {MAX_CRON} characters"));
        }
        let fields = expr.split_whitespace().count();
        if !expr.starts_with('@') && !(5..=6).contains(&fields) {
            return Err(format!(
                "cron must have 5 fields (minute hour day-of-month month day-of-week), \
                 or 6 with leading seconds; got {fields}"
            ));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expr)
            .map_err(|e| format!("invalid cron expression: {e}"))?;
        let cadence = Self { cron, tz };
        let fires = cadence.next_fires(Utc::now(), INTERVAL_SAMPLE);
        if fires.is_empty() {
            return Err("invalid cron expression: it never fires".into());
        }
        if fires
            .windows(2)
            .any(|w| (w[1] - w[0]).num_seconds() < i64::from(min_interval_secs))
        {
            return Err(format!(
                "cron fires more often than once every {min_interval_secs} seconds"
            ));
        }
        Ok(cadence)
    }

    /// Up to `n` firings strictly after `after`, in order.
    pub fn next_fires(&self, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        self.cron
            .iter_after(after.with_timezone(&self.tz))
            .take(n)
            .map(|t| t.with_timezone(&Utc))
            .collect()
    }

    /// The first firing strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.next_fires(after, 1).into_iter().next()
    }

    /// The latest firing at or before `now`: after downtime, the one tick that fires for
    /// all those missed.
    pub fn latest_until(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&now.with_timezone(&self.tz), true)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    }
}

/// An IANA time zone name (`Europe/Paris`, `UTC`).
pub fn parse_timezone(name: &str) -> Result<Tz, String> {
    if name.is_empty() || name.len() > MAX_TIMEZONE {
        return Err(format!("timezone must have 1 to {MAX_TIMEZONE} characters"));
    }
    name.parse::<Tz>()
        .map_err(|_| "timezone must be an IANA time zone name such as Europe/Paris".to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use chrono::{SecondsFormat, TimeZone};

    use super::*;

    fn rfc3339(t: &DateTime<Utc>) -> String {
        t.to_rfc3339_opts(SecondsFormat::Secs, true)
    }

    #[test]
    fn standard_and_seconds_forms_parse() {
        for ok in [
            "*/5 * * * *",
            "0 9 * * MON-FRI",
            "30 0 9 * * *",
            "@daily",
            "0 0 1 1 *",
        ] {
            assert!(Cadence::parse(ok, None, 60).is_ok(), "{ok}");
        }
    }

    #[test]
    fn bad_expressions_name_the_problem() {
        let bad = |expr: &str| Cadence::parse(expr, None, 60).unwrap_err();
        assert!(bad("* * *").contains("5 fields"));
        assert!(bad("0 0 0 1 1 * 2030").contains("got 7"));
        assert!(bad("61 * * * *").starts_with("invalid cron expression"));
        assert!(bad("0 0 30 2 *").contains("never fires"));
        assert!(bad("* * * * * *").contains("more often"));
        assert!(bad("0,30 * * * * *").contains("more often"));
        assert!(Cadence::parse("", None, 60).is_err());
        // The minimum interval is the operator's: one second allows a per-second cadence.
        assert!(Cadence::parse("* * * * * *", None, 1).is_ok());
    }

    #[test]
    fn bad_time_zones_are_refused() {
        for bad in ["Mars/Olympus", "", "Europe/Paris/x", "+02:00"] {
            let err = Cadence::parse("0 9 * * *", Some(bad), 60).unwrap_err();
            assert!(err.contains("timezone"), "{bad}: {err}");
        }
        assert!(Cadence::parse("0 9 * * *", Some("America/New_York"), 60).is_ok());
    }

    #[test]
    fn next_fires_are_strictly_after_and_in_utc_by_default() {
        let cadence = Cadence::parse("0 9 * * *", None, 60).unwrap();
        let at_nine = Utc.with_ymd_and_hms(2030, 1, 1, 9, 0, 0).unwrap();
        assert_eq!(
            cadence
                .next_fires(at_nine, 3)
                .iter()
                .map(rfc3339)
                .collect::<Vec<_>>(),
            [
                "2030-01-02T09:00:00Z",
                "2030-01-03T09:00:00Z",
                "2030-01-04T09:00:00Z"
            ]
        );
    }

    /// 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer: the cadence keeps
    /// local time across the change (the last Sunday of March 2030 is the 31st).
    #[test]
    fn a_zoned_cadence_keeps_local_time_across_dst() {
        let cadence = Cadence::parse("0 9 * * *", Some("Europe/Paris"), 60).unwrap();
        let before = Utc.with_ymd_and_hms(2030, 3, 29, 12, 0, 0).unwrap();
        assert_eq!(
            cadence
                .next_fires(before, 3)
                .iter()
                .map(rfc3339)
                .collect::<Vec<_>>(),
            [
                "2030-03-30T08:00:00Z",
                "2030-03-31T07:00:00Z",
                "2030-04-01T07:00:00Z"
            ]
        );
        // 02:30 does not exist in Paris on 2030-03-31 (02:00 jumps to 03:00); the daily
        // 02:30 cadence still fires once that day, and on local time the next.
        let gap = Cadence::parse("30 2 * * *", Some("Europe/Paris"), 60).unwrap();
        let fires = gap.next_fires(before, 3);
        assert_eq!(fires.len(), 3);
        assert_eq!(rfc3339(&fires[0]), "2030-03-30T01:30:00Z");
        assert_eq!(rfc3339(&fires[2]), "2030-04-01T00:30:00Z");
        assert!(fires[1] > fires[0] && fires[1] < fires[2]);
    }

    #[test]
    fn the_latest_missed_tick_is_the_one_at_or_before_now() {
        let cadence = Cadence::parse("0 * * * *", None, 60).unwrap();
        let now = Utc.with_ymd_and_hms(2030, 1, 1, 12, 34, 0).unwrap();
        assert_eq!(
            rfc3339(&cadence.latest_until(now).unwrap()),
            "2030-01-01T12:00:00Z"
        );
        let on_tick = Utc.with_ymd_and_hms(2030, 1, 1, 12, 0, 0).unwrap();
        assert_eq!(cadence.latest_until(on_tick), Some(on_tick));
    }
}
