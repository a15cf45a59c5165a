//! `agent_create` / `agent_archive` / `agent_set_prompt` / `agent_update`: a concierge
//! agent manages its team's agents (SPEC B1). Offered only to agents created with
//! `"concierge": true`. Each call is one write (T6), however many fields it changes.
//!
//! Every call is scoped to the turn's team: another team's agent id is answered exactly
//! like an unknown one ("no such agent"). Fields are checked by the same code as
//! `POST /v1/agents` (`crate::agents`).

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use protocol::AgentId;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolCtx, ToolOutput, parse_args, schema_of};
use crate::agents::{AgentChange, apply_change, validate_new_agent, validate_system_prompt};
use crate::clock::Clock;
use crate::models::connections::{RouteCheckError, check_routes};
use domain::approvals::RiskClass;
use providers::ToolSpec;
use store::{Action, StoreError};

const NO_SUCH_AGENT: &str = "no such agent";

/// The agent tools; `min_interval_secs` bounds the cadences `agent_update` sets, whose
/// next tick is taken from `clock`.
pub fn tools(min_interval_secs: u32, clock: Clock) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(AgentCreate),
        Arc::new(AgentArchive),
        Arc::new(AgentSetPrompt),
        Arc::new(AgentUpdate {
            min_interval_secs,
            clock,
        }),
    ]
}

/// Arguments of `agent_create`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreateArgs {
    /// A short name for the new agent (1 to 200 characters).
    name: String,
    /// The new agent's system prompt.
    system_prompt: String,
    /// Its model, as connection/model: e.g. "openai/gpt-4.1", "anthropic/claude-sonnet-4",
    /// or a model of one of the team's own provider connections.
    model: String,
    /// Models tried in order when the primary fails (at most 5).
    #[serde(default)]
    fallback_models: Vec<String>,
    /// What hands it gets: none, light, browser, heavy or warm (default none).
    #[serde(default)]
    runtime_profile: Option<String>,
    /// Show the model's reasoning to the person in the chat as it streams (never stored;
    /// default false).
    #[serde(default)]
    stream_reasoning: bool,
}

struct AgentCreate;

impl Tool for AgentCreate {
    fn metric_label(&self) -> &'static str {
        "agent_create"
    }

    /// D3: keyed by its call: run again, it answers the agent the first run created.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "agent_create".into(),
            description: "Create a new agent in this team; answers its id.".into(),
            input_schema: schema_of::<CreateArgs>(),
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
            let args: CreateArgs = match parse_args(arguments) {
                Ok(args) => args,
                Err(e) => return e,
            };
            // A concierge creates ordinary agents; only the API makes concierges.
            let new = match validate_new_agent(
                args.name,
                args.system_prompt,
                args.model,
                args.fallback_models,
                args.runtime_profile,
                false,
            ) {
                Ok(new) => store::NewAgent {
                    stream_reasoning: args.stream_reasoning,
                    ..new
                },
                Err(problem) => return ToolOutput::error(problem),
            };
            if let Some(refused) = route_check(ctx, &new.model, &new.fallback_models).await {
                return refused;
            }
            let by = ctx.authority.audit_actor();
            match ctx
                .store
                .create_agent_by_call(ctx.team, &new, ctx.call_key(), &by)
                .await
            {
                Ok(row) => {
                    tracing::info!(team = %ctx.team, agent = %row.id, by = %ctx.agent, "agent created by tool");
                    ToolOutput::ok(json!({"agent_id": row.id, "name": row.name}).to_string())
                }
                Err(e) => store_failure(ctx, "agent_create", &e),
            }
        }
        .boxed()
    }
}

/// Arguments of `agent_archive`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ArchiveArgs {
    /// The id of the agent to archive (not your own).
    agent_id: String,
}

struct AgentArchive;

impl Tool for AgentArchive {
    fn metric_label(&self) -> &'static str {
        "agent_archive"
    }

    /// D3: archiving an archived agent changes nothing.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "agent_archive".into(),
            description: "Archive an agent of this team: it can no longer be chatted with. \
                          An agent cannot archive itself."
                .into(),
            input_schema: schema_of::<ArchiveArgs>(),
        }
    }

    fn risk(&self) -> RiskClass {
        RiskClass::Irreversible
    }

    fn changes_agent(&self) -> bool {
        true
    }

    fn writes(&self) -> bool {
        true
    }

    fn call<'a>(&'a self, ctx: &'a ToolCtx, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            let args: ArchiveArgs = match parse_args(arguments) {
                Ok(args) => args,
                Err(e) => return e,
            };
            let Ok(id) = args.agent_id.trim().parse::<AgentId>() else {
                return ToolOutput::error(NO_SUCH_AGENT);
            };
            if id == ctx.agent {
                return ToolOutput::error("an agent cannot archive itself");
            }
            let by = ctx.authority.audit_actor();
            match ctx.store.archive_agent(ctx.team, id, &by).await {
                Ok(()) => {
                    tracing::info!(team = %ctx.team, agent = %id, by = %ctx.agent, "agent archived by tool");
                    ToolOutput::ok(format!("archived agent {id}"))
                }
                Err(e) => store_failure(ctx, "agent_archive", &e),
            }
        }
        .boxed()
    }
}

/// Arguments of `agent_set_prompt`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetPromptArgs {
    /// The id of the agent to change.
    agent_id: String,
    /// Its new system prompt, used from its next turn on.
    system_prompt: String,
}

struct AgentSetPrompt;

impl Tool for AgentSetPrompt {
    fn metric_label(&self) -> &'static str {
        "agent_set_prompt"
    }

    /// D3: setting the same prompt again changes nothing.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "agent_set_prompt".into(),
            description: "Replace the system prompt of an agent of this team (takes effect \
                          from its next turn)."
                .into(),
            input_schema: schema_of::<SetPromptArgs>(),
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
            let args: SetPromptArgs = match parse_args(arguments) {
                Ok(args) => args,
                Err(e) => return e,
            };
            let Ok(id) = args.agent_id.trim().parse::<AgentId>() else {
                return ToolOutput::error(NO_SUCH_AGENT);
            };
            if let Err(problem) = validate_system_prompt(&args.system_prompt) {
                return ToolOutput::error(problem);
            }
            match ctx
                .store
                .set_agent_prompt(
                    ctx.team,
                    id,
                    &args.system_prompt,
                    &ctx.authority.audit_actor(),
                )
                .await
            {
                Ok(()) => ToolOutput::ok(format!("system prompt of agent {id} replaced")),
                // Unknown, another team's, or archived: tell the last apart for the model.
                Err(StoreError::NotFound) => match ctx.store.agent(ctx.team, id).await {
                    Ok(row) if row.archived => ToolOutput::error(format!("agent {id} is archived")),
                    _ => ToolOutput::error(NO_SUCH_AGENT),
                },
                Err(e) => store_failure(ctx, "agent_set_prompt", &e),
            }
        }
        .boxed()
    }
}

/// Arguments of `agent_update`: the fields of `PATCH /v1/agents/{id}`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct UpdateArgs {
    /// The id of the agent to change.
    agent_id: String,
    /// A new system prompt.
    #[serde(default)]
    system_prompt: Option<String>,
    /// A new model, as connection/model.
    #[serde(default)]
    model: Option<String>,
    /// New fallback models, tried in order (at most 5).
    #[serde(default)]
    fallback_models: Option<Vec<String>>,
    /// New hands: none, light, browser, heavy or warm.
    #[serde(default)]
    runtime_profile: Option<String>,
    /// A cron expression (5 fields, or 6 with seconds first) the agent starts by itself on; null turns it off.
    #[serde(default, deserialize_with = "crate::agents::present")]
    autostart_cron: Option<Option<String>>,
    /// The message each autostart turn begins with.
    #[serde(default)]
    autostart_prompt: Option<String>,
    /// The IANA time zone of the cron expression (e.g. "Europe/Paris"); null is UTC.
    #[serde(default, deserialize_with = "crate::agents::present")]
    autostart_timezone: Option<Option<String>>,
    /// Show the model's reasoning to the person in the chat as it streams, or stop.
    #[serde(default)]
    stream_reasoning: Option<bool>,
}

struct AgentUpdate {
    min_interval_secs: u32,
    clock: Clock,
}

impl Tool for AgentUpdate {
    fn metric_label(&self) -> &'static str {
        "agent_update"
    }

    /// D3: setting the same fields again changes nothing.
    fn repeatable(&self) -> bool {
        true
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "agent_update".into(),
            description: "Change any of an agent's system prompt, models, hands and autostart \
                          schedule (fields left out stay as they are); takes effect from its \
                          next turn."
                .into(),
            input_schema: schema_of::<UpdateArgs>(),
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
            let args: UpdateArgs = match parse_args(arguments) {
                Ok(args) => args,
                Err(e) => return e,
            };
            let Ok(id) = args.agent_id.trim().parse::<AgentId>() else {
                return ToolOutput::error(NO_SUCH_AGENT);
            };
            let current = match ctx.store.agent(ctx.team, id).await {
                Ok(row) if row.archived => return ToolOutput::error(format!("agent {id} is archived")),
                Ok(row) => row,
                Err(e) => return store_failure(ctx, "agent_update", &e),
            };
            let change = AgentChange {
                system_prompt: args.system_prompt,
                model: args.model,
                fallback_models: args.fallback_models,
                runtime_profile: args.runtime_profile,
                autostart_cron: args.autostart_cron,
                autostart_prompt: args.autostart_prompt,
                autostart_timezone: args.autostart_timezone,
                // Approval policies are a person's (the API's) to set: an agent that could
                // loosen them would approve itself.
                approval_policy: None,
                // What a client's hang-up does is the API's to set, like the policy above.
                disconnect_policy: None,
                busy_policy: None,
                // Which models the agent's auxiliary calls bill is the API's to set.
                auxiliary_models: None,
                stream_reasoning: args.stream_reasoning,
                // Whether turns recall memories is the API's to set.
                memory_recall: None,
                // Which of the team's documents the agent reads is the API's to set.
                knowledge_bases: None,
                knowledge_recall: None,
                // Which of the team's skills the agent uses is the API's to set (B8).
                skills: None,
                // Which hosts the agent's commands reach is the API's to set (W14): an
                // agent that could widen it would open its own way out.
                egress: None,
                // Whom the agent hands work to is the API's to set (B7, X5): an agent
                // that could add delegates would widen its own reach.
                delegates: None,
            };
            let update = match apply_change(
                &current,
                change,
                self.min_interval_secs,
                &ctx.authority.actor,
                self.clock.now(),
            ) {
                Ok(update) => update,
                Err(problem) => return ToolOutput::error(problem),
            };
            if let Some(refused) = route_check(ctx, &update.model, &update.fallback_models).await {
                return refused;
            }
            let by = ctx.authority.audit_actor();
            let updated = ctx
                .store
                .update_agent(ctx.team, id, &update, &by, Action::ToolAgentUpdate)
                .await;
            match updated {
                Ok(_) => {
                    tracing::info!(team = %ctx.team, agent = %id, by = %ctx.agent, "agent changed by tool");
                    ToolOutput::ok(format!("agent {id} changed"))
                }
                Err(e) => store_failure(ctx, "agent_update", &e),
            }
        }
        .boxed()
    }
}

/// T14: an agent's routes may name only the team's provider connections and the
/// deployment's own, as through the API.
async fn route_check(ctx: &ToolCtx, model: &str, fallback_models: &[String]) -> Option<ToolOutput> {
    let routes: Vec<&str> = std::iter::once(model)
        .chain(fallback_models.iter().map(String::as_str))
        .collect();
    match check_routes(&ctx.store, ctx.team, &routes).await {
        Ok(()) => None,
        Err(RouteCheckError::Unknown(problem)) => Some(ToolOutput::error(problem)),
        Err(RouteCheckError::Store(e)) => Some(store_failure(ctx, "agent_routes", &e)),
    }
}

fn store_failure(ctx: &ToolCtx, tool: &'static str, e: &StoreError) -> ToolOutput {
    if matches!(e, StoreError::NotFound) {
        return ToolOutput::error(NO_SUCH_AGENT);
    }
    tracing::warn!(turn = %ctx.turn, tool, class = e.metric_label(), "agent tool failed");
    ToolOutput::error("agents are unavailable right now")
}
