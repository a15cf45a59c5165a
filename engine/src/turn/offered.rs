//! The tools a turn offers, built once per kind of agent rather than once per turn.
//!
//! The brain's own tools depend only on whether the agent is a concierge (and names
//! knowledge bases) and the worker
//! tools only on its runtime profile, and both only on the process' configuration: every
//! turn of agents alike offers the same tools, so their `Toolset`, the provider catalog
//! (whose wire rendering each adapter makes once, `provider::Catalog`) and the catalog's
//! form in the turn's composition are made once per kind of agent and shared.
//! Connector tools are the team's and change with the connectors' servers: a turn with
//! connectors offers a fresh copy of the shared set with them added.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::value::RawValue;

use crate::Engine;
use crate::tools::{Tool, Toolset};
use providers::{Catalog, ToolSpec};

/// Kinds of agent whose tools are kept; more (runtime profiles are strings) start over.
const MAX_KINDS: usize = 64;

/// What a turn offers the model.
pub(super) struct Offered {
    pub toolset: Arc<Toolset>,
    pub catalog: Arc<Catalog>,
    /// The catalog as the composition freezes it: name, description, schema (T3).
    pub composition_tools: Box<RawValue>,
}

/// One tool in the composition.
#[derive(Serialize)]
struct Frozen<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a serde_json::Value,
}

impl Offered {
    fn new(toolset: Toolset) -> Self {
        let specs = toolset.specs();
        let frozen: Vec<Frozen<'_>> = specs
            .iter()
            .map(|spec: &ToolSpec| Frozen {
                name: &spec.name,
                description: &spec.description,
                input_schema: &spec.input_schema,
            })
            .collect();
        // Serializing our own closed types into memory cannot fail.
        let composition_tools =
            serde_json::value::to_raw_value(&frozen).unwrap_or_else(|_| RawValue::NULL.to_owned());
        Self {
            catalog: Arc::new(Catalog::new(specs)),
            toolset: Arc::new(toolset),
            composition_tools,
        }
    }

    /// This set with `extra` tools added after its own (connector tools).
    pub fn with(&self, extra: Vec<Arc<dyn Tool>>) -> Self {
        let mut toolset = Toolset::clone(&self.toolset);
        for tool in extra {
            toolset.add(tool);
        }
        Self::new(toolset)
    }
}

/// A kind of agent, as far as its tools go: (concierge, has knowledge bases, runtime
/// profile).
type Kind = (bool, bool, String);

/// The shared tool sets of this process, by kind of agent.
#[derive(Clone, Default)]
pub struct Toolsets(Arc<Mutex<HashMap<Kind, Arc<Offered>>>>);

impl Toolsets {
    /// The brain tools, then the worker tools of `profile`.
    pub(super) fn get(
        &self,
        state: &Engine,
        concierge: bool,
        knowledge: bool,
        profile: &str,
    ) -> Arc<Offered> {
        let key = (concierge, knowledge, profile.to_owned());
        if let Some(known) = self.0.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return known;
        }
        let mut toolset = Toolset::brain(
            concierge,
            knowledge.then(|| state.connections.clone()),
            state.config.autostart.min_interval_secs,
            state.clock.clone(),
            Some(state.sessions.on_secret_set()),
        );
        // Worker tools are declared by the profile before any worker exists (T4); brain
        // tools keep their names, then the worker's.
        for tool in crate::sessions::worker_tools(
            &state.sessions,
            &state.artifacts,
            state.config.artifacts.max_bytes,
            profile,
        ) {
            toolset.add(tool);
        }
        let offered = Arc::new(Offered::new(toolset));
        if let Ok(mut known) = self.0.lock() {
            if known.len() >= MAX_KINDS {
                known.clear();
            }
            known.insert(key, offered.clone());
        }
        offered
    }
}
