//! Agents: system prompt, model route, runtime profile, autostart.

use chrono::{DateTime, Utc};
use protocol::{AgentId, TeamId};
use sqlx::Row;

use super::{Store, StoreError};
use crate::approvals::ApprovalPolicy;

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
    pub archived: bool,
    pub concierge: bool,
    /// Which calls ask a person first and which tools never run (A2).
    pub approval_policy: ApprovalPolicy,
    pub created_at: DateTime<Utc>,
}

const AGENT_COLUMNS: &str = "id, team_id, name, system_prompt, model, fallback_models, \
    runtime_profile, autostart_cron, autostart_prompt, archived_at IS NOT NULL AS archived, concierge, approval_policy, created_at";

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
        archived: row.try_get("archived")?,
        concierge: row.try_get("concierge")?,
        approval_policy: row
            .try_get::<sqlx::types::Json<ApprovalPolicy>, _>("approval_policy")?
            .0,
        created_at: row.try_get("created_at")?,
    })
}

impl Store {
    pub async fn create_agent(
        &self,
        team: TeamId,
        agent: &NewAgent,
    ) -> Result<AgentRow, StoreError> {
        let sql = format!(
            "INSERT INTO agents (id, team_id, name, system_prompt, model, fallback_models, runtime_profile, concierge, approval_policy) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING {AGENT_COLUMNS}"
        );
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
            .fetch_one(&self.pool)
            .await?;
        Ok(agent_from_row(&row)?)
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
    pub async fn agents(&self, team: TeamId, limit: i64) -> Result<Vec<AgentRow>, StoreError> {
        let sql = format!(
            "SELECT {AGENT_COLUMNS} FROM agents WHERE team_id = $1 AND archived_at IS NULL \
             ORDER BY created_at DESC, id DESC LIMIT $2"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| agent_from_row(r).map_err(StoreError::from))
            .collect()
    }
}
