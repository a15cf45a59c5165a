//! What makes an agent valid, whoever writes it: `POST /v1/agents`, `PATCH /v1/agents/{id}`
//! and the concierge's agent and cron tools check fields with the same code, so a tool
//! cannot make an agent the API would refuse (SPEC B1). The messages say what is wrong and
//! are shown to the API client or to the model.

use chrono::{DateTime, Utc};
use protocol::profile;

use crate::schedule::{Cadence, parse_timezone};
use domain::approvals::ApprovalPolicy;
use domain::egress::AgentEgress;
use providers::ModelRoute;
use store::{AgentRow, AgentUpdate, Autostart, AutostartAt, NewAgent, Store, StoreError};
pub use store::{AuxiliaryModels, BusyPolicy, DisconnectPolicy, KnowledgeRecall, MemoryRecall};
use uuid::Uuid;

const MAX_NAME: usize = 200;
const MAX_PROMPT: usize = 100_000;
const MAX_FALLBACKS: usize = 5;
const MAX_AUTOSTART_PROMPT: usize = 4000;
/// The most knowledge bases an agent names (the column's check says the same).
pub const MAX_KNOWLEDGE_BASES: usize = 20;

/// Checks a new agent's fields; the message says what is wrong.
pub fn validate_new_agent(
    name: String,
    system_prompt: String,
    model: String,
    fallback_models: Vec<String>,
    runtime_profile: Option<String>,
    concierge: bool,
) -> Result<NewAgent, String> {
    let name = name.trim().to_owned();
    if name.is_empty() || name.chars().count() > MAX_NAME {
        return Err(format!("name must have 1 to {MAX_NAME} characters"));
    }
    // Postgres text cannot hold NUL: refused here rather than failing the write.
    if name.contains('\0') {
        return Err("name must not contain NUL characters".into());
    }
    validate_system_prompt(&system_prompt)?;
    validate_route(&model, &fallback_models)?;
    let runtime_profile = runtime_profile.unwrap_or_else(|| profile::NONE.into());
    validate_runtime_profile(&runtime_profile)?;
    Ok(NewAgent {
        name,
        system_prompt,
        model,
        fallback_models,
        runtime_profile,
        concierge,
        approval_policy: ApprovalPolicy::default(),
        disconnect_policy: DisconnectPolicy::default(),
        auxiliary_models: AuxiliaryModels::default(),
        stream_reasoning: false,
        memory_recall: MemoryRecall::default(),
        knowledge_bases: Vec::new(),
        knowledge_recall: KnowledgeRecall::default(),
        delegates: Vec::new(),
        skills: Vec::new(),
        egress: None,
    })
}

/// Checks an agent's knowledge base ids (B5) as far as they can be without the store:
/// their number; the same id twice counts once. [`check_knowledge_bases`] checks they are
/// the team's.
pub fn validate_knowledge_bases(mut ids: Vec<Uuid>) -> Result<Vec<Uuid>, String> {
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
    if ids.len() > MAX_KNOWLEDGE_BASES {
        return Err(format!(
            "knowledge_bases may name at most {MAX_KNOWLEDGE_BASES} bases"
        ));
    }
    Ok(ids)
}

/// Why an agent's knowledge bases were refused.
#[derive(Debug, thiserror::Error)]
pub enum KnowledgeBasesError {
    /// An id that is no base of the agent's team (another team's, deleted, or never one);
    /// the message names it.
    #[error("{0}")]
    Unknown(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// B5: an agent names only its own team's knowledge bases, checked in one query when the
/// agent is created or changed. A base deleted later drops out of its searches.
pub async fn check_knowledge_bases(
    store: &Store,
    team: protocol::TeamId,
    ids: &[Uuid],
) -> Result<(), KnowledgeBasesError> {
    if ids.is_empty() {
        return Ok(());
    }
    let foreign = store::bounded(store.foreign_knowledge_bases(team, ids)).await?;
    match foreign.first() {
        None => Ok(()),
        Some(id) => Err(KnowledgeBasesError::Unknown(format!(
            "knowledge_bases: {id} is no knowledge base of this team"
        ))),
    }
}

/// The most agents an agent delegates to (the column's check says the same).
pub const MAX_DELEGATES: usize = 20;

/// Why an agent's delegates were refused (B7).
#[derive(Debug, thiserror::Error)]
pub enum DelegatesError {
    /// The agent names itself, too many agents, or an id that is no live agent of its
    /// team (another team's, archived, or never one); the message says which.
    #[error("{0}")]
    Unknown(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// B7: the agents `agent` (`None` while it is being created) may delegate to: at most
/// [`MAX_DELEGATES`], never itself, each a live agent of `team`, checked in one query when
/// the agent is created or changed. The same id twice counts once.
pub async fn check_delegates(
    store: &Store,
    team: protocol::TeamId,
    agent: Option<protocol::AgentId>,
    mut ids: Vec<Uuid>,
) -> Result<Vec<Uuid>, DelegatesError> {
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
    if ids.len() > MAX_DELEGATES {
        return Err(DelegatesError::Unknown(format!(
            "delegates may name at most {MAX_DELEGATES} agents"
        )));
    }
    if agent.is_some_and(|agent| ids.contains(&agent.0)) {
        return Err(DelegatesError::Unknown(
            "delegates: an agent cannot delegate to itself".into(),
        ));
    }
    if ids.is_empty() {
        return Ok(ids);
    }
    let foreign = store::bounded(store.foreign_agents(team, &ids)).await?;
    match foreign.first() {
        None => Ok(ids),
        Some(id) => Err(DelegatesError::Unknown(format!(
            "delegates: {id} is no agent of this team"
        ))),
    }
}

/// Checks auxiliary routes (T17), an agent's or its team's, as `model` is checked.
pub fn validate_auxiliary(models: &AuxiliaryModels) -> Result<(), String> {
    for route in models.routes() {
        validate_route(route, &[]).map_err(|problem| format!("auxiliary_models: {problem}"))?;
    }
    Ok(())
}

/// Checks an agent's auxiliary routes: as a team's, but `embedding` is the team's alone
/// (B6): a base's passages are embedded once, for the team, and a query must be embedded
/// by the route that embedded them.
pub fn validate_agent_auxiliary(models: &AuxiliaryModels) -> Result<(), String> {
    if models.embedding.is_some() {
        return Err(
            "auxiliary_models.embedding is a team setting (PUT /v1/team/settings): \
                    knowledge is embedded once, for the team"
                .into(),
        );
    }
    validate_auxiliary(models)
}

/// Checks a system prompt, on creation and on change.
pub fn validate_system_prompt(system_prompt: &str) -> Result<(), String> {
    if system_prompt.chars().count() > MAX_PROMPT {
        return Err(format!(
            "system_prompt must have at most {MAX_PROMPT} characters"
        ));
    }
    if system_prompt.contains('\0') {
        return Err("system_prompt must not contain NUL characters".into());
    }
    Ok(())
}

fn validate_route(model: &str, fallback_models: &[String]) -> Result<(), String> {
    if fallback_models.len() > MAX_FALLBACKS {
        return Err(format!("at most {MAX_FALLBACKS} fallback_models"));
    }
    for model in std::iter::once(model).chain(fallback_models.iter().map(String::as_str)) {
        // Postgres text cannot hold NUL.
        if model.contains('\0') {
            return Err("models must not contain NUL characters".into());
        }
        ModelRoute::parse(model)?;
    }
    Ok(())
}

fn validate_runtime_profile(profile: &str) -> Result<(), String> {
    if profile::ALL.contains(&profile) {
        Ok(())
    } else {
        Err(format!(
            "runtime_profile must be one of {}",
            profile::ALL.join(", ")
        ))
    }
}

/// Checks an autostart prompt; the trimmed prompt.
pub fn validate_autostart_prompt(prompt: &str) -> Result<String, String> {
    let prompt = prompt.trim();
    if prompt.is_empty() || prompt.chars().count() > MAX_AUTOSTART_PROMPT {
        return Err(format!(
            "autostart_prompt must have 1 to {MAX_AUTOSTART_PROMPT} characters"
        ));
    }
    if prompt.contains('\0') {
        return Err("autostart_prompt must not contain NUL characters".into());
    }
    Ok(prompt.to_owned())
}

/// For a field of a change that may be `null`: `Some(None)` for `null`, while an absent
/// field stays `None` through `#[serde(default)]`.
pub fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    <Option<T> as serde::Deserialize>::deserialize(deserializer).map(Some)
}

/// A change to an agent (`PATCH /v1/agents/{id}`, the `agent_update` tool): an absent
/// field is left as it is.
#[derive(Debug, Default)]
pub struct AgentChange {
    pub system_prompt: Option<String>,
    pub model: Option<String>,
    pub fallback_models: Option<Vec<String>>,
    pub runtime_profile: Option<String>,
    /// `Some(None)` turns autostart off.
    pub autostart_cron: Option<Option<String>>,
    pub autostart_prompt: Option<String>,
    /// `Some(None)` is UTC.
    pub autostart_timezone: Option<Option<String>>,
    pub approval_policy: Option<domain::approvals::ApprovalPolicy>,
    pub disconnect_policy: Option<DisconnectPolicy>,
    pub busy_policy: Option<BusyPolicy>,
    /// Replaces the auxiliary routes as a whole (T17).
    pub auxiliary_models: Option<AuxiliaryModels>,
    /// Streams the model's reasoning to the client, or stops (T18).
    pub stream_reasoning: Option<bool>,
    /// Recalls memories into each turn's prompt, or stops (M3).
    pub memory_recall: Option<MemoryRecall>,
    /// Replaces the knowledge bases the agent searches as a whole (B5).
    pub knowledge_bases: Option<Vec<Uuid>>,
    /// Recalls passages of those bases into each turn's prompt, or stops (B5).
    pub knowledge_recall: Option<KnowledgeRecall>,
    /// Replaces the agents it may delegate to as a whole (B7), checked with
    /// [`check_delegates`] before the change is applied.
    pub delegates: Option<Vec<Uuid>>,
    /// Replaces the skills the agent uses as a whole (B8).
    pub skills: Option<Vec<String>>,
    /// Replaces the egress allowlist (W14); `Some(None)`: every host again.
    pub egress: Option<Option<AgentEgress>>,
}

impl AgentChange {
    /// The names of the fields the change gives, for the audit log (L5): never their
    /// values, which hold prompts.
    fn named_fields(&self) -> Vec<&'static str> {
        [
            ("system_prompt", self.system_prompt.is_some()),
            ("model", self.model.is_some()),
            ("fallback_models", self.fallback_models.is_some()),
            ("runtime_profile", self.runtime_profile.is_some()),
            ("autostart_cron", self.autostart_cron.is_some()),
            ("autostart_prompt", self.autostart_prompt.is_some()),
            ("autostart_timezone", self.autostart_timezone.is_some()),
            ("approval_policy", self.approval_policy.is_some()),
            ("disconnect_policy", self.disconnect_policy.is_some()),
            ("busy_policy", self.busy_policy.is_some()),
            ("auxiliary_models", self.auxiliary_models.is_some()),
            ("stream_reasoning", self.stream_reasoning.is_some()),
            ("memory_recall", self.memory_recall.is_some()),
            ("knowledge_bases", self.knowledge_bases.is_some()),
            ("knowledge_recall", self.knowledge_recall.is_some()),
            ("delegates", self.delegates.is_some()),
            ("skills", self.skills.is_some()),
            ("egress", self.egress.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }
}

/// Applies `change` to `current` and checks the result as a whole (a new time zone is
/// checked with the cadence it applies to); the agent as it will be stored. A changed
/// cadence gets its next tick after `now` and records `actor` as who set it.
pub fn apply_change(
    current: &AgentRow,
    change: AgentChange,
    min_interval_secs: u32,
    actor: &str,
    now: DateTime<Utc>,
) -> Result<AgentUpdate, String> {
    let changed = change.named_fields();
    let system_prompt = change
        .system_prompt
        .unwrap_or_else(|| current.system_prompt.clone());
    validate_system_prompt(&system_prompt)?;
    let model = change.model.unwrap_or_else(|| current.model.clone());
    let fallback_models = change
        .fallback_models
        .unwrap_or_else(|| current.fallback_models.clone());
    validate_route(&model, &fallback_models)?;
    let runtime_profile = change
        .runtime_profile
        .unwrap_or_else(|| current.runtime_profile.clone());
    validate_runtime_profile(&runtime_profile)?;
    let approval_policy = change
        .approval_policy
        .unwrap_or_else(|| current.approval_policy.clone());
    approval_policy.validate()?;
    let disconnect_policy = change
        .disconnect_policy
        .unwrap_or(current.disconnect_policy);
    let busy_policy = change.busy_policy.unwrap_or(current.busy_policy);
    let auxiliary_models = change
        .auxiliary_models
        .unwrap_or_else(|| current.auxiliary_models.clone());
    validate_agent_auxiliary(&auxiliary_models)?;
    let knowledge_bases = match change.knowledge_bases {
        Some(ids) => validate_knowledge_bases(ids)?,
        None => current.knowledge_bases.clone(),
    };
    let skills = match change.skills {
        Some(names) => validate_agent_skills(names)?,
        None => current.skills.clone(),
    };
    let egress = change.egress.unwrap_or_else(|| current.egress.clone());
    if let Some(egress) = &egress {
        egress.validate()?;
    }

    let autostart_changed = change.autostart_cron.is_some()
        || change.autostart_prompt.is_some()
        || change.autostart_timezone.is_some();
    // The stored autostart is checked only when the change touches it: a cadence set
    // under a smaller minimum interval does not block a new system prompt.
    let autostart = if autostart_changed {
        Some(changed_autostart(
            current,
            change.autostart_cron,
            change.autostart_prompt,
            change.autostart_timezone,
            min_interval_secs,
            actor,
            now,
        )?)
    } else {
        None
    };
    Ok(AgentUpdate {
        system_prompt,
        model,
        fallback_models,
        runtime_profile,
        autostart,
        approval_policy,
        disconnect_policy,
        busy_policy,
        auxiliary_models,
        stream_reasoning: change.stream_reasoning.unwrap_or(current.stream_reasoning),
        memory_recall: change.memory_recall.unwrap_or(current.memory_recall),
        knowledge_bases,
        knowledge_recall: change.knowledge_recall.unwrap_or(current.knowledge_recall),
        delegates: change
            .delegates
            .unwrap_or_else(|| current.delegates.clone()),
        skills,
        egress,
        changed,
    })
}

/// The autostart after a change that touches it, with its next tick; `None` is off.
fn changed_autostart(
    current: &AgentRow,
    cron: Option<Option<String>>,
    prompt: Option<String>,
    timezone: Option<Option<String>>,
    min_interval_secs: u32,
    actor: &str,
    now: DateTime<Utc>,
) -> Result<Option<AutostartAt>, String> {
    let Some(cron) = cron.unwrap_or_else(|| current.autostart_cron.clone()) else {
        return match prompt {
            Some(_) => Err("autostart_prompt needs an autostart_cron".into()),
            None => Ok(None),
        };
    };
    // Stored under its canonical name, so what is read back is what is evaluated.
    let timezone = match timezone
        .unwrap_or_else(|| current.autostart_timezone.clone())
        .as_deref()
        .map(str::trim)
    {
        None => None,
        Some(name) => Some(
            parse_timezone(name)
                .map_err(|problem| format!("autostart_timezone: {problem}"))?
                .name()
                .to_owned(),
        ),
    };
    let cadence = Cadence::parse(&cron, timezone.as_deref(), min_interval_secs)
        .map_err(|problem| format!("autostart_cron: {problem}"))?;
    let prompt = prompt
        .or_else(|| current.autostart_prompt.clone())
        .ok_or("autostart_cron needs an autostart_prompt")?;
    let autostart = Autostart {
        cron: cron.trim().to_owned(),
        prompt: validate_autostart_prompt(&prompt)?,
        timezone,
        set_by: Some(actor.to_owned()),
    };
    Ok(Some((autostart, cadence.next_after(now))))
}

/// Checks an agent's skill names (B8) as far as they can be without the store: each a
/// valid name, at most [`MAX_AGENT_SKILLS`]; the same name twice counts once.
pub fn validate_agent_skills(mut names: Vec<String>) -> Result<Vec<String>, String> {
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
    if names.len() > MAX_AGENT_SKILLS {
        return Err(format!("skills may name at most {MAX_AGENT_SKILLS} skills"));
    }
    if let Some(bad) = names.iter().find(|n| !protocol::skills::valid_name(n)) {
        return Err(format!(
            "skills: {bad:?} is no skill name (lowercase letters, digits and hyphens)"
        ));
    }
    Ok(names)
}

/// The most skills an agent names (the column's check says the same).
pub const MAX_AGENT_SKILLS: usize = 20;
