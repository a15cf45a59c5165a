//! `cron_set` / `cron_list` / `cron_remove`: the agent's own autostart (SPEC T11, B1).
//!
//! A cadence is a standard 5-field cron expression (minute hour day-of-month month
//! day-of-week), optionally with a leading seconds field, evaluated in UTC. Firings closer
//! than [`MIN_INTERVAL_SECS`] apart are refused: each firing is a whole turn.

use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolCtx, ToolOutput, parse_args, schema_of};
use crate::provider::ToolSpec;
use crate::store::{Autostart, StoreError};

const MAX_CRON: usize = 200;
const MAX_PROMPT: usize = 4000;
/// The shortest allowed time between two firings.
pub const MIN_INTERVAL_SECS: i64 = 60;
/// Firings inspected for the minimum interval.
const INTERVAL_SAMPLE: usize = 16;

pub fn tools() -> Vec<Arc<dyn Tool>> {
    vec![Arc::new(CronSet), Arc::new(CronList), Arc::new(CronRemove)]
}

/// Parses an autostart cadence; the error names the problem, for the model or a client.
/// The scheduler evaluates stored cadences with the same function.
pub fn parse_cadence(expr: &str) -> Result<Cron, String> {
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
    let fires = next_fires(&cron, Utc::now(), INTERVAL_SAMPLE);
    if fires.is_empty() {
        return Err("invalid cron expression: it never fires".into());
    }
    if fires
        .windows(2)
        .any(|w| (w[1] - w[0]).num_seconds() < MIN_INTERVAL_SECS)
    {
        return Err(format!(
            "cron fires more often than once every {MIN_INTERVAL_SECS} seconds"
        ));
    }
    Ok(cron)
}

/// Up to `n` firings strictly after `after`, in order.
pub fn next_fires(cron: &Cron, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
    cron.iter_after(after).take(n).collect()
}

fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Arguments of `cron_set`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetArgs {
    /// A cron expression in UTC: minute hour day-of-month month day-of-week (e.g. "0 9 * * MON-FRI"), optionally with a leading seconds field; at most once a minute.
    cron: String,
    /// The message each autostarted turn begins with (1 to 4000 characters).
    prompt: String,
}

struct CronSet;

impl Tool for CronSet {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "cron_set".into(),
            description: "Make this agent start by itself on a schedule: each time the cron \
                          expression fires (UTC), a new turn runs with the given prompt. \
                          Replaces any schedule already set."
                .into(),
            input_schema: schema_of::<SetArgs>(),
        }
    }

    fn risk(&self) -> super::RiskClass {
        super::RiskClass::Write
    }

    fn writes(&self) -> bool {
        true
    }

    fn call<'a>(&'a self, ctx: &'a ToolCtx, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            let args: SetArgs = match parse_args(arguments) {
                Ok(args) => args,
                Err(e) => return e,
            };
            let cron = match parse_cadence(&args.cron) {
                Ok(cron) => cron,
                Err(problem) => return ToolOutput::error(problem),
            };
            let prompt = args.prompt.trim();
            if prompt.is_empty() || prompt.chars().count() > MAX_PROMPT {
                return ToolOutput::error(format!("prompt must have 1 to {MAX_PROMPT} characters"));
            }
            let autostart = Autostart {
                cron: args.cron.trim().to_owned(),
                prompt: prompt.to_owned(),
            };
            match ctx
                .store
                .set_autostart(ctx.team, ctx.agent, Some(&autostart))
                .await
            {
                Ok(()) => {
                    let next = next_fires(&cron, Utc::now(), 1);
                    ToolOutput::ok(match next.first() {
                        Some(t) => format!(
                            "autostart set: `{}`, next at {}",
                            autostart.cron,
                            rfc3339(t)
                        ),
                        None => format!("autostart set: `{}`", autostart.cron),
                    })
                }
                Err(e) => store_failure(ctx, "cron_set", &e),
            }
        }
        .boxed()
    }
}

/// No arguments.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

struct CronList;

impl Tool for CronList {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "cron_list".into(),
            description: "Show this agent's autostart schedule: the cron expression, the prompt, \
                          and the next three start times (UTC)."
                .into(),
            input_schema: schema_of::<NoArgs>(),
        }
    }

    fn risk(&self) -> super::RiskClass {
        super::RiskClass::Read
    }

    fn writes(&self) -> bool {
        false
    }

    fn call<'a>(&'a self, ctx: &'a ToolCtx, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            if let Err(e) = parse_args::<NoArgs>(arguments) {
                return e;
            }
            match ctx.store.autostart(ctx.team, ctx.agent).await {
                Ok(None) => ToolOutput::ok("no autostart is set"),
                Ok(Some(autostart)) => {
                    let next: Vec<String> = match parse_cadence(&autostart.cron) {
                        Ok(cron) => next_fires(&cron, Utc::now(), 3)
                            .iter()
                            .map(rfc3339)
                            .collect(),
                        // Stored before a rule tightened: show it, with no times.
                        Err(_) => Vec::new(),
                    };
                    ToolOutput::ok(
                        json!({
                            "cron": autostart.cron,
                            "prompt": autostart.prompt,
                            "next_fires_utc": next,
                        })
                        .to_string(),
                    )
                }
                Err(e) => store_failure(ctx, "cron_list", &e),
            }
        }
        .boxed()
    }
}

struct CronRemove;

impl Tool for CronRemove {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "cron_remove".into(),
            description: "Stop this agent's autostart schedule.".into(),
            input_schema: schema_of::<NoArgs>(),
        }
    }

    fn risk(&self) -> super::RiskClass {
        super::RiskClass::Write
    }

    fn writes(&self) -> bool {
        true
    }

    fn call<'a>(&'a self, ctx: &'a ToolCtx, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            if let Err(e) = parse_args::<NoArgs>(arguments) {
                return e;
            }
            match ctx.store.set_autostart(ctx.team, ctx.agent, None).await {
                Ok(()) => ToolOutput::ok("autostart removed"),
                Err(e) => store_failure(ctx, "cron_remove", &e),
            }
        }
        .boxed()
    }
}

fn store_failure(ctx: &ToolCtx, tool: &'static str, e: &StoreError) -> ToolOutput {
    if matches!(e, StoreError::NotFound) {
        return ToolOutput::error("this agent is archived; its schedule cannot change");
    }
    tracing::warn!(turn = %ctx.turn, tool, class = e.metric_label(), "cron tool failed");
    ToolOutput::error("the schedule is unavailable right now")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use chrono::TimeZone;

    use super::*;

    #[test]
    fn standard_and_seconds_forms_parse() {
        for ok in [
            "*/5 * * * *",
            "0 9 * * MON-FRI",
            "30 0 9 * * *",
            "@daily",
            "0 0 1 1 *",
        ] {
            assert!(parse_cadence(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn bad_expressions_name_the_problem() {
        let err = parse_cadence("* * *").unwrap_err();
        assert!(err.contains("5 fields"), "{err}");
        let err = parse_cadence("0 0 0 1 1 * 2030").unwrap_err();
        assert!(err.contains("got 7"), "{err}");
        let err = parse_cadence("61 * * * *").unwrap_err();
        assert!(err.starts_with("invalid cron expression"), "{err}");
        let err = parse_cadence("0 0 30 2 *").unwrap_err();
        assert!(err.contains("never fires"), "{err}");
        let err = parse_cadence("* * * * * *").unwrap_err();
        assert!(err.contains("more often"), "{err}");
        let err = parse_cadence("0,30 * * * * *").unwrap_err();
        assert!(err.contains("more often"), "{err}");
        assert!(parse_cadence("").is_err());
    }

    #[test]
    fn next_fires_are_strictly_after_and_in_utc() {
        let cron = parse_cadence("0 9 * * *").unwrap();
        let at_nine = Utc.with_ymd_and_hms(2030, 1, 1, 9, 0, 0).unwrap();
        let fires = next_fires(&cron, at_nine, 3);
        assert_eq!(
            fires.iter().map(rfc3339).collect::<Vec<_>>(),
            [
                "2030-01-02T09:00:00Z",
                "2030-01-03T09:00:00Z",
                "2030-01-04T09:00:00Z"
            ]
        );
    }
}
