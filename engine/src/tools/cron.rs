//! `cron_set` / `cron_list` / `cron_remove`: the agent's own autostart (SPEC T11, B1).
//!
//! The cadence rules (fields, time zone, minimum interval) are `crate::schedule`'s, shared
//! with `PATCH /v1/agents/{id}` and the scheduler.

use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolCtx, ToolOutput, parse_args, schema_of};
use crate::agents::validate_autostart_prompt;
use crate::clock::Clock;
use crate::schedule::{Cadence, parse_timezone};
use domain::approvals::RiskClass;
use providers::ToolSpec;
use store::{Autostart, StoreError};

/// The cron tools; `min_interval_secs` is the operator's shortest allowed cadence, and a
/// set cadence's next tick is taken from `clock`.
pub fn tools(min_interval_secs: u32, clock: Clock) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(CronSet {
            min_interval_secs,
            clock: clock.clone(),
        }),
        Arc::new(CronList {
            min_interval_secs,
            clock,
        }),
        Arc::new(CronRemove),
    ]
}

fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Arguments of `cron_set`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetArgs {
    /// A cron expression: minute hour day-of-month month day-of-week (e.g. "0 9 * * MON-FRI"), optionally with a leading seconds field; at most once a minute unless the operator allows more.
    cron: String,
    /// The message each autostarted turn begins with (1 to 4000 characters).
    prompt: String,
    /// The IANA time zone the cron expression is read in (e.g. "Europe/Paris"); UTC when absent.
    #[serde(default)]
    timezone: Option<String>,
}

struct CronSet {
    min_interval_secs: u32,
    clock: Clock,
}

impl Tool for CronSet {
    fn metric_label(&self) -> &'static str {
        "cron_set"
    }

    /// D3: setting the same schedule again changes nothing.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "cron_set".into(),
            description: "Make this agent start by itself on a schedule: each time the cron \
                          expression fires (in the given time zone, UTC by default), a new \
                          turn runs with the given prompt in this agent's autostart chat. \
                          Replaces any schedule already set."
                .into(),
            input_schema: schema_of::<SetArgs>(),
        }
    }

    fn risk(&self) -> RiskClass {
        RiskClass::Write
    }

    fn changes_agent(&self) -> bool {
        true
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
            let timezone = args.timezone.as_deref().map(str::trim);
            let cadence = match Cadence::parse(&args.cron, timezone, self.min_interval_secs) {
                Ok(cadence) => cadence,
                Err(problem) => return ToolOutput::error(problem),
            };
            let prompt = match validate_autostart_prompt(&args.prompt) {
                Ok(prompt) => prompt,
                Err(problem) => return ToolOutput::error(problem),
            };
            let cron = args.cron.trim().to_owned();
            let autostart = Autostart {
                cron: cron.clone(),
                prompt,
                // Stored under its canonical name, as `PATCH` stores it.
                timezone: timezone
                    .and_then(|name| parse_timezone(name).ok())
                    .map(|tz| tz.name().to_owned()),
                set_by: Some(ctx.authority.actor.clone()),
            };
            let next = cadence.next_after(self.clock.now());
            match ctx
                .store
                .set_autostart(
                    ctx.team,
                    ctx.agent,
                    Some(&(autostart, next)),
                    &ctx.authority.audit_actor(),
                )
                .await
            {
                Ok(()) => ToolOutput::ok(match next {
                    Some(t) => format!("autostart set: `{cron}`, next at {}", rfc3339(&t)),
                    None => format!("autostart set: `{cron}`"),
                }),
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

struct CronList {
    min_interval_secs: u32,
    clock: Clock,
}

impl Tool for CronList {
    fn metric_label(&self) -> &'static str {
        "cron_list"
    }

    /// D3: it only reads.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "cron_list".into(),
            description: "Show this agent's autostart schedule: the cron expression, its time \
                          zone, the prompt, and the next three start times (UTC)."
                .into(),
            input_schema: schema_of::<NoArgs>(),
        }
    }

    fn risk(&self) -> RiskClass {
        RiskClass::Read
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
                    let cadence = Cadence::parse(
                        &autostart.cron,
                        autostart.timezone.as_deref(),
                        self.min_interval_secs,
                    );
                    let next: Vec<String> = match cadence {
                        Ok(cadence) => cadence
                            .next_fires(self.clock.now(), 3)
                            .iter()
                            .map(rfc3339)
                            .collect(),
                        // Stored before a rule tightened: show it, with no times.
                        Err(_) => Vec::new(),
                    };
                    ToolOutput::ok(
                        json!({
                            "cron": autostart.cron,
                            "timezone": autostart.timezone.as_deref().unwrap_or("UTC"),
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
    fn metric_label(&self) -> &'static str {
        "cron_remove"
    }

    /// D3: removing a removed schedule changes nothing.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "cron_remove".into(),
            description: "Stop this agent's autostart schedule.".into(),
            input_schema: schema_of::<NoArgs>(),
        }
    }

    fn risk(&self) -> RiskClass {
        RiskClass::Write
    }

    fn changes_agent(&self) -> bool {
        true
    }

    fn writes(&self) -> bool {
        true
    }

    fn call<'a>(&'a self, ctx: &'a ToolCtx, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            if let Err(e) = parse_args::<NoArgs>(arguments) {
                return e;
            }
            let by = ctx.authority.audit_actor();
            match ctx
                .store
                .set_autostart(ctx.team, ctx.agent, None, &by)
                .await
            {
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
