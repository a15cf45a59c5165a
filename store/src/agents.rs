//! Agents: system prompt, model route, runtime profile, autostart.

use chrono::{DateTime, Utc};
use protocol::{AgentId, TeamId};
use sqlx::Row;

use super::audit::{self, Action, Actor};
use super::cron::drop_pending_firings;
use super::{AutostartAt, CallKey, Store, StoreError};
use domain::approvals::ApprovalPolicy;
use domain::egress::AgentEgress;

/// D1: what a hang-up of an interactive turn's client does to the turn. Background turns
/// (`"background": true`, autostarts, approval continuations) have no client to lose.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DisconnectPolicy {
    /// The turn stops as an explicit stop would (T8): closing the tab stops the spend.
    #[default]
    Cancel,
    /// The turn runs to its end and is stored; the transcript, `GET /v1/turns/{id}` and
    /// the chat's streams show it.
    Continue,
}

impl DisconnectPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Continue => "continue",
        }
    }

    /// The stored form; `None` for anything else (the column's check allows nothing else).
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "cancel" => Some(Self::Cancel),
            "continue" => Some(Self::Continue),
            _ => None,
        }
    }
}

/// T13: what a message to the agent does while it runs another turn. A message's own
/// `if_busy` overrides it.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum BusyPolicy {
    /// `409 agent_busy`: the client sends it again later.
    #[default]
    Reject,
    /// A queued turn (`202`), started when the agent is free, in the order accepted.
    Enqueue,
    /// The running turn is stopped (T8) and the message's turn starts.
    Interrupt,
}

impl BusyPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reject => "reject",
            Self::Enqueue => "enqueue",
            Self::Interrupt => "interrupt",
        }
    }

    /// The stored form; `None` for anything else (the column's check allows nothing else).
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "reject" => Some(Self::Reject),
            "enqueue" => Some(Self::Enqueue),
            "interrupt" => Some(Self::Interrupt),
            _ => None,
        }
    }
}

/// M3: whether each turn's prompt recalls the agent's memories in its scope.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum MemoryRecall {
    /// The few memories most relevant to the user's message, within the recall budget.
    #[default]
    Auto,
    /// None: the model finds them only with `memory_search`.
    Off,
}

impl MemoryRecall {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Off => "off",
        }
    }

    /// The stored form; `None` for anything else (the column's check allows nothing else).
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "auto" => Some(Self::Auto),
            "off" => Some(Self::Off),
            _ => None,
        }
    }
}

/// B5: whether each turn's prompt recalls passages of the agent's knowledge bases.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum KnowledgeRecall {
    /// The passages most relevant to the user's message, within the recall budget.
    Auto,
    /// None: the model finds them only with `knowledge_search`.
    #[default]
    Off,
}

impl KnowledgeRecall {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Off => "off",
        }
    }

    /// The stored form; `None` for anything else (the column's check allows nothing else).
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "auto" => Some(Self::Auto),
            "off" => Some(Self::Off),
            _ => None,
        }
    }
}

/// T17: the routes of an agent's auxiliary model calls, or its team's defaults for them.
/// Each is a route string checked like `model`; an absent one falls back to the team's,
/// then to the agent's own route.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct AuxiliaryModels {
    /// Writes a chat's short title after its first turn.
    #[serde(default)]
    pub title: Option<String>,
    /// Folds old history into the chat's running summary (M1).
    #[serde(default)]
    pub summary: Option<String>,
    /// Describes images for a model without vision; stored and checked now, called once
    /// images reach models.
    #[serde(default)]
    pub vision: Option<String>,
    /// Embeds knowledge passages and queries for hybrid search (B6). A team setting: an
    /// agent may not name one (a base's passages are embedded once, for the team).
    #[serde(default)]
    pub embedding: Option<String>,
}

impl AuxiliaryModels {
    /// Each route of `self`, or `defaults`' where `self` names none.
    pub fn or(&self, defaults: &AuxiliaryModels) -> AuxiliaryModels {
        AuxiliaryModels {
            title: self.title.clone().or_else(|| defaults.title.clone()),
            summary: self.summary.clone().or_else(|| defaults.summary.clone()),
            vision: self.vision.clone().or_else(|| defaults.vision.clone()),
            embedding: self
                .embedding
                .clone()
                .or_else(|| defaults.embedding.clone()),
        }
    }

    /// The routes named, for checking each.
    pub fn routes(&self) -> impl Iterator<Item = &str> {
        [&self.title, &self.summary, &self.vision, &self.embedding]
            .into_iter()
            .filter_map(|route| route.as_deref())
    }
}

#[derive(Clone, Debug)]
pub struct NewAgent {
    pub name: String,
    pub system_prompt: String,
    pub model: String,
    pub fallback_models: Vec<String>,
    pub runtime_profile: String,
    /// Offered the agent tools (create, archive, change prompt) for its team (B1).
    pub concierge: bool,
    /// Validated by `ApprovalPolicy::validate` (A2).
    pub approval_policy: ApprovalPolicy,
    pub disconnect_policy: DisconnectPolicy,
    /// Checked like `model` (T17).
    pub auxiliary_models: AuxiliaryModels,
    /// Streams the model's reasoning to the client (T18).
    pub stream_reasoning: bool,
    /// Recalls memories into each turn's prompt (M3).
    pub memory_recall: MemoryRecall,
    /// The team's knowledge bases the agent searches (B5), checked to be the team's.
    pub knowledge_bases: Vec<uuid::Uuid>,
    /// Recalls passages of those bases into each turn's prompt (B5).
    pub knowledge_recall: KnowledgeRecall,
    /// The team's skills the agent uses, by name (B8), checked to be the team's.
    pub skills: Vec<String>,
    /// The agents of its team it may delegate to (B7), checked to be the team's.
    pub delegates: Vec<uuid::Uuid>,
    /// The egress allowlist of its commands (W14); `None`: every host.
    pub egress: Option<AgentEgress>,
}

/// An agent's changeable fields after a change (the brain's `agents::apply_change`).
#[derive(Clone, Debug)]
pub struct AgentUpdate {
    pub system_prompt: String,
    pub model: String,
    pub fallback_models: Vec<String>,
    pub runtime_profile: String,
    /// `None`: the autostart is left as it is; `Some(None)`: off; otherwise the new one
    /// with its next tick.
    pub autostart: Option<Option<AutostartAt>>,
    pub approval_policy: ApprovalPolicy,
    pub disconnect_policy: DisconnectPolicy,
    pub busy_policy: BusyPolicy,
    pub auxiliary_models: AuxiliaryModels,
    pub stream_reasoning: bool,
    pub memory_recall: MemoryRecall,
    pub knowledge_bases: Vec<uuid::Uuid>,
    pub knowledge_recall: KnowledgeRecall,
    pub skills: Vec<String>,
    pub delegates: Vec<uuid::Uuid>,
    pub egress: Option<AgentEgress>,
    /// The names of the fields the change gave, for its audit entry (L5).
    pub changed: Vec<&'static str>,
}

#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct AgentRow {
    pub id: AgentId,
    pub team_id: TeamId,
    pub name: String,
    pub system_prompt: String,
    pub model: String,
    pub fallback_models: Vec<String>,
    pub runtime_profile: String,
    pub autostart_cron: Option<String>,
    pub autostart_prompt: Option<String>,
    /// The IANA time zone of `autostart_cron`; `null` is UTC.
    pub autostart_timezone: Option<String>,
    pub archived: bool,
    pub concierge: bool,
    /// Which calls ask a person first and which tools never run (A2).
    pub approval_policy: ApprovalPolicy,
    /// What a hang-up of an interactive turn's client does to the turn (D1).
    pub disconnect_policy: DisconnectPolicy,
    /// What a message does while the agent runs another turn (T13).
    pub busy_policy: BusyPolicy,
    /// The models of the agent's titles, summaries and image descriptions (T17); an
    /// absent one is the team's default, else the agent's own route.
    pub auxiliary_models: AuxiliaryModels,
    /// Whether the model's reasoning is streamed to the client as reasoning parts (T18);
    /// it is never stored either way.
    pub stream_reasoning: bool,
    /// Whether each turn's prompt recalls the memories of its scope (M3).
    pub memory_recall: MemoryRecall,
    /// The team's knowledge bases the agent searches (B5); a base deleted since is left
    /// out of every search.
    pub knowledge_bases: Vec<uuid::Uuid>,
    /// Whether each turn's prompt recalls passages of those bases (B5).
    pub knowledge_recall: KnowledgeRecall,
    /// The team's skills its turns list and read, by name (B8); a skill deleted since is
    /// left out.
    pub skills: Vec<String>,
    /// The agents of its team it may hand a task to with the `delegate` tool (B7).
    pub delegates: Vec<uuid::Uuid>,
    /// The hosts its commands may reach through the egress proxy (W14); `null`: every
    /// host (the address rule applies either way).
    pub egress: Option<AgentEgress>,
    pub created_at: DateTime<Utc>,
}

const AGENT_COLUMNS: &str = "id, team_id, name, system_prompt, model, fallback_models, \
    runtime_profile, autostart_cron, autostart_prompt, autostart_timezone, archived_at IS NOT NULL AS archived, concierge, approval_policy, disconnect_policy, busy_policy, auxiliary_models, stream_reasoning, memory_recall, knowledge_bases, knowledge_recall, skills, delegates, egress, created_at";

pub(super) fn agent_from_row(row: &sqlx::postgres::PgRow) -> Result<AgentRow, sqlx::Error> {
    Ok(AgentRow {
        id: AgentId(row.try_get("id")?),
        team_id: TeamId(row.try_get("team_id")?),
        name: row.try_get("name")?,
        system_prompt: row.try_get("system_prompt")?,
        model: row.try_get("model")?,
        fallback_models: row.try_get("fallback_models")?,
        runtime_profile: row.try_get("runtime_profile")?,
        autostart_cron: row.try_get("autostart_cron")?,
        autostart_prompt: row.try_get("autostart_prompt")?,
        autostart_timezone: row.try_get("autostart_timezone")?,
        archived: row.try_get("archived")?,
        concierge: row.try_get("concierge")?,
        approval_policy: row
            .try_get::<sqlx::types::Json<ApprovalPolicy>, _>("approval_policy")?
            .0,
        disconnect_policy: {
            let raw: String = row.try_get("disconnect_policy")?;
            DisconnectPolicy::parse(&raw).ok_or_else(|| sqlx::Error::ColumnDecode {
                index: "disconnect_policy".into(),
                source: format!("unknown disconnect policy {raw}").into(),
            })?
        },
        busy_policy: {
            let raw: String = row.try_get("busy_policy")?;
            BusyPolicy::parse(&raw).ok_or_else(|| sqlx::Error::ColumnDecode {
                index: "busy_policy".into(),
                source: format!("unknown busy policy {raw}").into(),
            })?
        },
        auxiliary_models: row
            .try_get::<sqlx::types::Json<AuxiliaryModels>, _>("auxiliary_models")?
            .0,
        stream_reasoning: row.try_get("stream_reasoning")?,
        memory_recall: {
            let raw: String = row.try_get("memory_recall")?;
            MemoryRecall::parse(&raw).ok_or_else(|| sqlx::Error::ColumnDecode {
                index: "memory_recall".into(),
                source: format!("unknown memory recall {raw}").into(),
            })?
        },
        knowledge_bases: row.try_get("knowledge_bases")?,
        skills: row.try_get("skills")?,
        knowledge_recall: {
            let raw: String = row.try_get("knowledge_recall")?;
            KnowledgeRecall::parse(&raw).ok_or_else(|| sqlx::Error::ColumnDecode {
                index: "knowledge_recall".into(),
                source: format!("unknown knowledge recall {raw}").into(),
            })?
        },
        delegates: row.try_get("delegates")?,
        egress: row
            .try_get::<Option<sqlx::types::Json<AgentEgress>>, _>("egress")?
            .map(|e| e.0),
        created_at: row.try_get("created_at")?,
    })
}

impl Store {
    pub async fn create_agent(
        &self,
        team: TeamId,
        agent: &NewAgent,
        by: &Actor,
    ) -> Result<AgentRow, StoreError> {
        self.insert_agent(team, agent, None, by).await
    }

    /// Creates the agent `call` asks for, or answers the one an earlier run of `call`
    /// created (D3: a taken-over turn runs the call again).
    pub async fn create_agent_by_call(
        &self,
        team: TeamId,
        agent: &NewAgent,
        call: CallKey<'_>,
        by: &Actor,
    ) -> Result<AgentRow, StoreError> {
        self.insert_agent(team, agent, Some(call), by).await
    }

    /// The agent's entry is written only when this call made it: an earlier run's agent
    /// has its entry already.
    async fn insert_agent(
        &self,
        team: TeamId,
        agent: &NewAgent,
        call: Option<CallKey<'_>>,
        by: &Actor,
    ) -> Result<AgentRow, StoreError> {
        // As `write_memory`: the snapshot's select finds only an earlier run's agent.
        let sql = format!(
            "WITH made AS ( \
               INSERT INTO agents (id, team_id, name, system_prompt, model, fallback_models, runtime_profile, concierge, approval_policy, disconnect_policy, created_by_turn, created_by_call, auxiliary_models, stream_reasoning, memory_recall, knowledge_bases, knowledge_recall, delegates, skills, egress) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20) \
               ON CONFLICT (created_by_turn, created_by_call) WHERE created_by_turn IS NOT NULL DO NOTHING \
               RETURNING *) \
             SELECT {AGENT_COLUMNS}, true AS made FROM made \
             UNION ALL \
             SELECT {AGENT_COLUMNS}, false AS made FROM agents \
             WHERE team_id = $2 AND created_by_turn = $11 AND created_by_call = $12 \
             LIMIT 1"
        );
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(AgentId::new().0)
            .bind(team.0)
            .bind(&agent.name)
            .bind(&agent.system_prompt)
            .bind(&agent.model)
            .bind(&agent.fallback_models)
            .bind(&agent.runtime_profile)
            .bind(agent.concierge)
            .bind(sqlx::types::Json(&agent.approval_policy))
            .bind(agent.disconnect_policy.as_str())
            .bind(call.map(|call| call.turn.0))
            .bind(call.map(|call| call.call))
            .bind(sqlx::types::Json(&agent.auxiliary_models))
            .bind(agent.stream_reasoning)
            .bind(agent.memory_recall.as_str())
            .bind(&agent.knowledge_bases)
            .bind(agent.knowledge_recall.as_str())
            .bind(&agent.delegates)
            .bind(&agent.skills)
            .bind(agent.egress.as_ref().map(sqlx::types::Json))
            .fetch_one(&mut *tx)
            .await?;
        let made = agent_from_row(&row)?;
        if row.try_get("made")? {
            let action = match call {
                None => Action::AgentCreated,
                Some(_) => Action::ToolAgentCreate,
            };
            let details = serde_json::json!({ "name": made.name });
            audit::record(&mut tx, team, by, action, made.id, details).await?;
        }
        tx.commit().await?;
        Ok(made)
    }

    /// The live agents of `team` among `ids`, in the order `ids` names them (B7).
    pub async fn agents_by_id(
        &self,
        team: TeamId,
        ids: &[uuid::Uuid],
    ) -> Result<Vec<AgentRow>, StoreError> {
        let sql = format!(
            "SELECT {AGENT_COLUMNS} FROM agents WHERE team_id = $1 AND id = ANY($2) \
               AND archived_at IS NULL ORDER BY array_position($2, id)"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(ids)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| agent_from_row(r).map_err(StoreError::from))
            .collect()
    }

    /// The ids among `ids` that are no live agent of `team` (another team's, archived,
    /// or never one): an agent's `delegates` may name none of them (B7).
    pub async fn foreign_agents(
        &self,
        team: TeamId,
        ids: &[uuid::Uuid],
    ) -> Result<Vec<uuid::Uuid>, StoreError> {
        let rows = sqlx::query_scalar(
            "SELECT i FROM unnest($2::uuid[]) AS i \
             WHERE NOT EXISTS (SELECT 1 FROM agents a WHERE a.team_id = $1 AND a.id = i \
                               AND a.archived_at IS NULL)",
        )
        .bind(team.0)
        .bind(ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    pub async fn agent(&self, team: TeamId, id: AgentId) -> Result<AgentRow, StoreError> {
        let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE team_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        Ok(agent_from_row(&row)?)
    }

    /// The team's agents that are not archived, newest first, at most `limit`.
    pub async fn agents(
        &self,
        team: TeamId,
        before: Option<super::Keyset>,
        limit: i64,
    ) -> Result<Vec<AgentRow>, StoreError> {
        let sql = format!(
            "SELECT {AGENT_COLUMNS} FROM agents WHERE team_id = $1 AND archived_at IS NULL \
               AND {} ORDER BY created_at DESC, id DESC LIMIT $2",
            super::keyset_after("<", "$3", "$4")
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(limit)
            .bind(before.map(|k| k.at))
            .bind(before.map(|k| k.id))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| agent_from_row(r).map_err(StoreError::from))
            .collect()
    }

    /// Writes `update` to a live agent in one transaction; a changed autostart drops the
    /// pending firings of the old one. `NotFound` for an unknown, archived or other team's
    /// agent.
    pub async fn update_agent(
        &self,
        team: TeamId,
        id: AgentId,
        update: &AgentUpdate,
        by: &Actor,
        action: Action,
    ) -> Result<AgentRow, StoreError> {
        let mut tx = self.pool.begin().await?;
        let autostart = update.autostart.as_ref();
        let next = autostart.and_then(|a| a.as_ref().and_then(|(_, next)| *next));
        let set = autostart.and_then(Option::as_ref).map(|(a, _)| a);
        // $7 says whether the autostart columns change at all.
        let sql = format!(
            "UPDATE agents SET system_prompt = $3, model = $4, fallback_models = $5, \
             runtime_profile = $6, \
             autostart_cron = CASE WHEN $7 THEN $8 ELSE autostart_cron END, \
             autostart_prompt = CASE WHEN $7 THEN $9 ELSE autostart_prompt END, \
             autostart_timezone = CASE WHEN $7 THEN $10 ELSE autostart_timezone END, \
             autostart_next_fire_at = CASE WHEN $7 THEN $11 ELSE autostart_next_fire_at END, \
             autostart_set_by = CASE WHEN $7 THEN $13 ELSE autostart_set_by END, \
             autostart_paused = CASE WHEN $7 THEN NULL ELSE autostart_paused END, \
             approval_policy = $12, disconnect_policy = $14, busy_policy = $15, \
             auxiliary_models = $16, stream_reasoning = $17, memory_recall = $18, \
             knowledge_bases = $19, knowledge_recall = $20, delegates = $21, skills = $22, egress = $23, updated_at = now() \
             WHERE team_id = $1 AND id = $2 AND archived_at IS NULL RETURNING {AGENT_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(id.0)
            .bind(&update.system_prompt)
            .bind(&update.model)
            .bind(&update.fallback_models)
            .bind(&update.runtime_profile)
            .bind(autostart.is_some())
            .bind(set.map(|a| a.cron.as_str()))
            .bind(set.map(|a| a.prompt.as_str()))
            .bind(set.and_then(|a| a.timezone.as_deref()))
            .bind(next)
            .bind(sqlx::types::Json(&update.approval_policy))
            .bind(set.and_then(|a| a.set_by.as_deref()))
            .bind(update.disconnect_policy.as_str())
            .bind(update.busy_policy.as_str())
            .bind(sqlx::types::Json(&update.auxiliary_models))
            .bind(update.stream_reasoning)
            .bind(update.memory_recall.as_str())
            .bind(&update.knowledge_bases)
            .bind(update.knowledge_recall.as_str())
            .bind(&update.delegates)
            .bind(&update.skills)
            .bind(update.egress.as_ref().map(sqlx::types::Json))
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        if autostart.is_some() {
            drop_pending_firings(&mut tx, team, id).await?;
        }
        let details = serde_json::json!({ "fields": update.changed });
        audit::record(&mut tx, team, by, action, id, details).await?;
        tx.commit().await?;
        Ok(agent_from_row(&row)?)
    }
}
