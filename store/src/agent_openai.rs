//! An agent's options for the OpenAI-compatible front end (P13), `agents.openai`: read
//! when that front end answers, set by an admin (`PUT /v1/agents/{id}/openai`). Kept out
//! of the agent's row type: no turn reads them.

use domain::openai::OpenAiOptions;
use protocol::{AgentId, TeamId};
use sqlx::types::Json;

use super::audit::{self, Action, Actor};
use super::{Store, StoreError};

impl Store {
    /// The options of an agent of the team, archived or not; `NotFound` otherwise.
    pub async fn agent_openai(
        &self,
        team: TeamId,
        agent: AgentId,
    ) -> Result<OpenAiOptions, StoreError> {
        let found: Option<Json<OpenAiOptions>> =
            sqlx::query_scalar("SELECT openai FROM agents WHERE team_id = $1 AND id = $2")
                .bind(team.0)
                .bind(agent.0)
                .fetch_optional(&self.pool)
                .await?;
        found.map(|options| options.0).ok_or(StoreError::NotFound)
    }

    /// Sets the options of a live agent of the team, with the change's audit entry (L5:
    /// `agent.updated`, the field's name); `NotFound` for any other agent.
    pub async fn set_agent_openai(
        &self,
        team: TeamId,
        agent: AgentId,
        options: &OpenAiOptions,
        by: &Actor,
    ) -> Result<OpenAiOptions, StoreError> {
        let mut tx = self.pool.begin().await?;
        let set: Option<Json<OpenAiOptions>> = sqlx::query_scalar(
            "UPDATE agents SET openai = $3, updated_at = now() \
             WHERE team_id = $1 AND id = $2 AND archived_at IS NULL RETURNING openai",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(Json(options))
        .fetch_optional(&mut *tx)
        .await?;
        let set = set.ok_or(StoreError::NotFound)?.0;
        let details = serde_json::json!({ "fields": ["openai"] });
        audit::record(&mut tx, team, by, Action::AgentUpdated, agent, details).await?;
        tx.commit().await?;
        Ok(set)
    }
}
