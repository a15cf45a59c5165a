//! What makes a usage question valid (SPEC E1): the range and the grouping of
//! `GET /v1/usage`, checked here so that the route only decodes the query string.
//!
//! `from` is inclusive and `to` exclusive; each is an RFC 3339 timestamp or a date
//! (`2026-12-01`, midnight UTC). Without `from` the range starts at the beginning of the
//! current UTC month, without `to` it ends now. A range may span at most
//! [`MAX_RANGE_DAYS`], which bounds the rows a `day` grouping answers and the events one
//! request sums.

use chrono::{DateTime, Datelike, NaiveDate, TimeDelta, TimeZone, Utc};

use store::{ModelTokens, UsageGroup, UsageQuery, UsageReport};

use crate::models::catalog::TeamCatalog;

/// The longest range one request may ask for.
pub const MAX_RANGE_DAYS: i64 = 400;

/// The usage question of `from`, `to` and `group_by` as given, `now` being the
/// database-independent present; the error is a message for the caller.
pub fn usage_query(
    from: Option<&str>,
    to: Option<&str>,
    group_by: Option<&str>,
    now: DateTime<Utc>,
) -> Result<UsageQuery, String> {
    let group_by = match group_by {
        None => UsageGroup::Day,
        Some(raw) => UsageGroup::parse(raw).ok_or_else(|| {
            format!(
                "group_by must be day, agent, model or user, not {:?}",
                clip(raw)
            )
        })?,
    };
    let from = match from {
        Some(raw) => instant("from", raw)?,
        None => month_start(now),
    };
    let to = match to {
        Some(raw) => instant("to", raw)?,
        None => now,
    };
    if from > to {
        return Err(format!(
            "from ({}) is after to ({}); without from the range starts at the beginning of \
             the current UTC month",
            from.to_rfc3339(),
            to.to_rfc3339()
        ));
    }
    if to - from > TimeDelta::days(MAX_RANGE_DAYS) {
        return Err(format!(
            "the range from {} to {} is longer than {MAX_RANGE_DAYS} days",
            from.to_rfc3339(),
            to.to_rfc3339()
        ));
    }
    Ok(UsageQuery { from, to, group_by })
}

/// Fills in the cost of `report`'s totals and rows from their models' `tokens`, at the
/// team's catalog prices (T16). A group's cost is unknown when one of its models has no
/// price; a group without model calls costs nothing.
pub fn price(report: &mut UsageReport, tokens: &ModelTokens, catalog: &TeamCatalog) {
    report.totals.cost = cost(
        tokens
            .totals
            .iter()
            .map(|(model, tokens_in, tokens_out)| (model.as_str(), *tokens_in, *tokens_out)),
        catalog,
    );
    for row in &mut report.rows {
        row.sums.cost = cost(
            tokens
                .groups
                .iter()
                .filter(|(key, ..)| *key == row.key)
                .map(|(_, model, tokens_in, tokens_out)| (model.as_str(), *tokens_in, *tokens_out)),
            catalog,
        );
    }
}

fn cost<'a>(
    models: impl Iterator<Item = (&'a str, i64, i64)>,
    catalog: &TeamCatalog,
) -> Option<f64> {
    let sum: Option<f64> = models
        .map(|(route, tokens_in, tokens_out)| catalog.cost(route, tokens_in, tokens_out))
        .sum();
    // Micro-dollars: below that, float noise only.
    sum.map(|usd| (usd * 1e6).round() / 1e6)
}

fn instant(name: &str, raw: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(raw) {
        return Ok(at.with_timezone(&Utc));
    }
    if let Ok(day) = NaiveDate::parse_from_str(raw, "%Y-%m-%d") {
        return Ok(Utc.from_utc_datetime(&day.and_time(chrono::NaiveTime::MIN)));
    }
    Err(format!(
        "{name} must be an RFC 3339 timestamp (2026-12-01T00:00:00Z; a '+' offset must be \
         sent as %2B) or a date (2026-12-01), not {:?}",
        clip(raw)
    ))
}

fn month_start(now: DateTime<Utc>) -> DateTime<Utc> {
    let day = NaiveDate::from_ymd_opt(now.year(), now.month(), 1).unwrap_or(now.date_naive());
    Utc.from_utc_datetime(&day.and_time(chrono::NaiveTime::MIN))
}

/// Echoes at most a few dozen characters of a bad value.
fn clip(raw: &str) -> String {
    raw.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::catalog::Catalog;
    use store::{UsageRow, UsageSums};

    #[test]
    fn costs_are_summed_per_group_and_unknown_where_a_price_is() {
        let catalog = TeamCatalog::new(&Catalog::shipped().unwrap(), &["openai", "anthropic"], []);
        let row = |key: &str| UsageRow {
            key: Some(key.to_owned()),
            agent_name: None,
            sums: UsageSums::default(),
        };
        let mut report = UsageReport {
            from: at("2026-03-01T00:00:00Z"),
            to: at("2026-03-02T00:00:00Z"),
            group_by: UsageGroup::Agent,
            rows: vec![row("a"), row("b"), row("c")],
            next_cursor: None,
            totals: UsageSums::default(),
            snapshot_bytes: 0,
        };
        let tokens = ModelTokens {
            totals: vec![
                ("openai/gpt-4o".into(), 1_000_000, 100_000),
                ("anthropic/claude-sonnet-4-5-20250929".into(), 100_000, 0),
                ("openai/unknown".into(), 10, 10),
            ],
            groups: vec![
                (Some("a".into()), "openai/gpt-4o".into(), 1_000_000, 100_000),
                (
                    Some("a".into()),
                    "anthropic/claude-sonnet-4-5-20250929".into(),
                    100_000,
                    0,
                ),
                (Some("b".into()), "openai/unknown".into(), 10, 10),
            ],
        };
        price(&mut report, &tokens, &catalog);
        // 1M in at 2.50 and 100k out at 10.00, plus 100k in at 3.00.
        assert_eq!(report.rows[0].sums.cost, Some(3.8));
        assert_eq!(report.rows[1].sums.cost, None);
        assert_eq!(report.rows[2].sums.cost, Some(0.0));
        assert_eq!(report.totals.cost, None);
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn defaults_are_the_current_month_to_now_by_day() {
        let now = at("2026-03-17T10:11:12Z");
        let q = usage_query(None, None, None, now).unwrap();
        assert_eq!(q.from, at("2026-03-01T00:00:00Z"));
        assert_eq!(q.to, now);
        assert_eq!(q.group_by, UsageGroup::Day);
    }

    #[test]
    fn dates_are_midnight_utc_and_offsets_are_honoured() {
        let now = at("2026-03-17T10:11:12Z");
        let q = usage_query(
            Some("2026-01-01"),
            Some("2026-02-01T01:00:00+01:00"),
            Some("model"),
            now,
        )
        .unwrap();
        assert_eq!(q.from, at("2026-01-01T00:00:00Z"));
        assert_eq!(q.to, at("2026-02-01T00:00:00Z"));
        assert_eq!(q.group_by, UsageGroup::Model);
        let empty = usage_query(Some("2026-01-01"), Some("2026-01-01"), None, now).unwrap();
        assert_eq!(empty.from, empty.to);
    }

    #[test]
    fn bad_input_is_refused_with_a_message_naming_it() {
        let now = at("2026-03-17T10:11:12Z");
        let bad = |from, to, group| usage_query(from, to, group, now).unwrap_err();
        assert!(bad(Some("yesterday"), None, None).contains("from must be"));
        assert!(bad(None, Some("2026-13-01"), None).contains("to must be"));
        assert!(bad(None, None, Some("week")).contains("group_by must be"));
        assert!(bad(Some("2026-02-02"), Some("2026-02-01"), None).contains("is after"));
        // Only `to`, before the current month: the default `from` is after it.
        assert!(bad(None, Some("2026-01-01"), None).contains("is after"));
        assert!(bad(Some("2025-01-01"), Some("2026-03-01"), None).contains("400 days"));
        assert!(usage_query(Some("2025-01-01"), Some("2026-02-04"), None, now).is_ok());
        assert!(bad(Some(&"9".repeat(500)), None, None).len() < 200);
    }
}
