//! Changes to an agent after it was created: archiving and a new system prompt (the
//! concierge's agent tools, SPEC B1).

use protocol::{AgentId, TeamId};

use super::audit::{self, Action, Actor};
use super::{Store, StoreError};

impl Store {
    /// Archives an agent: no new chat can be created for it. Archiving an archived agent
    /// changes nothing. `NotFound` for an unknown agent or another team's.
    pub async fn archive_agent(
        &self,
        team: TeamId,
        agent: AgentId,
        by: &Actor,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE agents SET archived_at = COALESCE(archived_at, now()), updated_at = now() \
             WHERE team_id = $1 AND id = $2",
        )
        .bind(team.0)
        .bind(agent.0)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            return Err(StoreError::NotFound);
        }
        let details = serde_json::json!({});
        audit::record(&mut tx, team, by, Action::ToolAgentArchive, agent, details).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Replaces a live agent's system prompt; later turns use it (a running turn keeps its
    /// frozen composition). `NotFound` for an unknown, archived or other team's agent.
    pub async fn set_agent_prompt(
        &self,
        team: TeamId,
        agent: AgentId,
        system_prompt: &str,
        by: &Actor,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE agents SET system_prompt = $3, updated_at = now() \
             WHERE team_id = $1 AND id = $2 AND archived_at IS NULL",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(system_prompt)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            return Err(StoreError::NotFound);
        }
        let details = serde_json::json!({ "fields": ["system_prompt"] });
        audit::record(
            &mut tx,
            team,
            by,
            Action::ToolAgentSetPrompt,
            agent,
            details,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
