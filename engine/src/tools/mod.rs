//! The tools a turn offers the model, merged into one toolset (SPEC T4).
//!
//! Each tool declares its name, a JSON Schema derived from its Rust parameter type, and
//! whether it writes (SPEC T6 counts data-changing calls). A tool never fails the turn:
//! bad arguments and failures come back as a [`ToolOutput`] with `is_error`, which the
//! model reads.
//!
//! Brain tools (in-process) live here; worker and connector tools join the same
//! [`Toolset`] (`sessions/tool.rs`, `connectors/tool.rs`). Names are unique: the first source to claim a name keeps
//! it (brain tools are added first), and a later tool with a taken name is left out with a
//! log line, so a connector can never shadow a built-in.

pub mod agents;
pub mod cron;
mod knowledge;
mod memory;
pub mod secrets;

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, ready};
use protocol::parts::SourceDocument;
use protocol::ui::UiChunk;
use protocol::{AgentId, ChatId, TeamId, TurnId};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::auth::Authority;
use domain::approvals::RiskClass;
use providers::ToolSpec;
use store::{CallKey, Store};

/// What a call cut off by its turn's stop answers (T8).
pub const CANCELLED_RESULT: &str = "cancelled: the turn was stopped before this tool call finished";

/// What a tool call may use: the turn's identity and stores, and its cancellation.
#[derive(Clone)]
pub struct ToolCtx {
    pub store: Store,
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    pub turn: TurnId,
    /// The model's id for this call; live output is tagged with it.
    pub call_id: String,
    /// The turn's UI stream, for live output while the tool runs (SPEC W5); `None` when
    /// no client is attached.
    pub ui: Option<mpsc::Sender<UiChunk>>,
    /// A child of the turn's token: a cancelled turn cancels its running tools.
    pub cancel: CancellationToken,
    /// Whose authority the turn acts with (X1); a tool that records who changed something
    /// records its `actor`.
    pub authority: Authority,
    /// The turn's sign of life (T20): a tool that waits for a person holds its watch off.
    pub liveness: crate::liveness::Liveness,
}

impl ToolCtx {
    /// What keys this call's writes (D3).
    pub fn call_key(&self) -> CallKey<'_> {
        CallKey {
            turn: self.turn,
            call: &self.call_id,
        }
    }
}

/// A tool's answer, as the model will read it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolOutput {
    pub content: String,
    pub is_error: bool,
    /// Images the tool produced (a browser screenshot), shown to a model with vision
    /// in the result (T24); only the text is stored with the call.
    pub images: Vec<providers::Attachment>,
    /// The documents the output quotes (`knowledge_search`'s passages, B5): each streamed
    /// as a `source-document` chunk after the output and stored after the call's part.
    pub sources: Vec<SourceDocument>,
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
            images: Vec::new(),
            sources: Vec::new(),
        }
    }

    pub fn error(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
            images: Vec::new(),
            sources: Vec::new(),
        }
    }
}

/// One tool of any source.
pub trait Tool: Send + Sync {
    fn spec(&self) -> ToolSpec;
    /// The tool's label in metrics: a built-in tool's own name, `connector` for every
    /// connector tool (their names are the servers' and unbounded, X4).
    fn metric_label(&self) -> &'static str;
    /// Whether a call changes data (counted against the turn's write budget).
    fn writes(&self) -> bool;
    /// The tool's risk class (SPEC A1); every tool says, there is no default.
    fn risk(&self) -> RiskClass;
    fn call<'a>(
        &'a self,
        ctx: &'a ToolCtx,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, ToolOutput>;
    /// The call's input as it may be stored, streamed and sent back to the model in later
    /// requests. A tool whose arguments carry a secret blanks it here (B1, X4:
    /// `secret_set` replaces its `value`); the default keeps the input as it is.
    fn redact_input(&self, input: serde_json::Value) -> serde_json::Value {
        input
    }

    /// Whether `redact_input` hides something: then the raw argument fragments are not
    /// streamed to the client either.
    fn redacts_input(&self) -> bool {
        false
    }

    /// Whether a call changes the agent for everyone (its schedule, its secrets, the
    /// team's agents): then it runs only in a turn whose principal could make the same
    /// change over the API (X1, [`Authority::may_change_agent`]).
    fn changes_agent(&self) -> bool {
        false
    }

    /// The RuntimeProfile of the worker that runs it, for the worker tools: the turn
    /// starts that worker as soon as the model begins streaming a call (W11).
    fn worker_profile(&self) -> Option<&str> {
        None
    }

    /// Whether a call may run again after its turn was taken over mid-call (D3) without
    /// its effect happening twice: it only reads, repeating it changes nothing, or it is a
    /// transaction keyed by its call id. The default is no: such a call answers
    /// `outcome_unknown`.
    fn repeatable(&self) -> bool {
        false
    }

    /// The outcome of a call that was in flight when its turn's replica died (D3), with
    /// its input as stored: a repeatable tool runs it again; a worker tool asks its worker
    /// for the call's kept outcome. `None` when it cannot be known.
    fn reattach<'a>(
        &'a self,
        ctx: &'a ToolCtx,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, Option<ToolOutput>> {
        if self.repeatable() {
            self.call(ctx, arguments).map(Some).boxed()
        } else {
            ready(None).boxed()
        }
    }
}

/// The JSON Schema of a parameter type, as providers expect it: one rule for brain,
/// connector-facing and worker tools alike.
pub use channel::catalog::schema_of;

/// Decodes a tool's arguments into its parameter type; the error is for the model.
pub fn parse_args<T: DeserializeOwned>(arguments: serde_json::Value) -> Result<T, ToolOutput> {
    serde_json::from_value(arguments)
        .map_err(|e| ToolOutput::error(format!("invalid arguments: {e}")))
}

/// The merged toolset of one turn.
#[derive(Clone, Default)]
pub struct Toolset {
    tools: Vec<Arc<dyn Tool>>,
    /// Each tool's spec, taken once when it is added.
    specs: Vec<ToolSpec>,
    by_name: HashMap<String, usize>,
}

impl Toolset {
    /// The brain's own tools, offered to every agent; a concierge agent also gets the
    /// agent tools (create, archive, change prompt, update) for its team, and an agent
    /// that names knowledge bases `knowledge_search` (B5), which searches through
    /// `knowledge`'s connections (B6).
    /// `min_interval_secs` bounds the cadences the cron and agent tools set, whose next
    /// tick is taken from `clock`; `on_secret_set` runs after `secret_set` stored a secret.
    pub fn brain(
        concierge: bool,
        knowledge: Option<crate::models::connections::Connections>,
        min_interval_secs: u32,
        clock: crate::clock::Clock,
        on_secret_set: Option<secrets::OnSecretSet>,
    ) -> Self {
        let mut set = Self::default();
        for tool in memory::tools() {
            set.add(tool);
        }
        if let Some(connections) = knowledge {
            set.add(knowledge::tool(connections));
        }
        for tool in secrets::tools(on_secret_set)
            .into_iter()
            .chain(cron::tools(min_interval_secs, clock.clone()))
        {
            set.add(tool);
        }
        if concierge {
            for tool in agents::tools(min_interval_secs, clock) {
                set.add(tool);
            }
        }
        set
    }

    /// Adds `tool` unless its name is taken (the earlier source wins).
    pub fn add(&mut self, tool: Arc<dyn Tool>) {
        let spec = tool.spec();
        if self.by_name.contains_key(&spec.name) {
            tracing::warn!(tool = %spec.name, "tool name already taken; later tool left out");
            return;
        }
        self.by_name.insert(spec.name.clone(), self.tools.len());
        self.tools.push(tool);
        self.specs.push(spec);
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.by_name.get(name).map(|&i| &self.tools[i])
    }

    pub fn specs(&self) -> Vec<ToolSpec> {
        self.specs.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tools_that_change_the_agent_for_everyone_say_so() {
        let set = Toolset::brain(true, None, 60, crate::clock::Clock::system(), None);
        let changing: Vec<&str> = set
            .tools
            .iter()
            .zip(&set.specs)
            .filter(|(tool, _)| tool.changes_agent())
            .map(|(_, spec)| spec.name.as_str())
            .collect();
        for name in [
            "secret_set",
            "cron_set",
            "cron_remove",
            "agent_create",
            "agent_update",
            "agent_archive",
        ] {
            assert!(changing.contains(&name), "{name}: {changing:?}");
        }
        for name in ["secret_list", "cron_list", "memory_write"] {
            assert!(!changing.contains(&name), "{name}: {changing:?}");
        }
    }

    #[test]
    fn every_brain_tool_is_labelled_by_its_own_name_in_metrics() {
        let set = Toolset::brain(true, None, 60, crate::clock::Clock::system(), None);
        assert!(set.tools.len() >= 12);
        for (tool, spec) in set.tools.iter().zip(&set.specs) {
            assert_eq!(tool.metric_label(), spec.name);
        }
    }
}
