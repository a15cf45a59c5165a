//! An agent's autostart cadence and prompt (SPEC T11), as the cron tools change them.
//!
//! Changing or clearing the cadence also drops the agent's pending autostart firings: a
//! firing planned under the old cadence must not run under the new one.

use protocol::{AgentId, TeamId};

use super::{Store, StoreError};

/// An agent's autostart: its cron expression and the prompt each firing sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Autostart {
    pub cron: String,
    pub prompt: String,
}

impl Store {
    /// Sets (`Some`) or clears (`None`) the agent's autostart. `NotFound` for an unknown
    /// or archived agent, or another team's.
    pub async fn set_autostart(
        &self,
        team: TeamId,
        agent: AgentId,
        autostart: Option<&Autostart>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE agents SET autostart_cron = $3, autostart_prompt = $4, updated_at = now() \
             WHERE team_id = $1 AND id = $2 AND archived_at IS NULL",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(autostart.map(|a| a.cron.as_str()))
        .bind(autostart.map(|a| a.prompt.as_str()))
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            return Err(StoreError::NotFound);
        }
        sqlx::query(
            "DELETE FROM scheduled_tasks \
             WHERE team_id = $1 AND agent_id = $2 AND kind = 'autostart' AND state = 'pending'",
        )
        .bind(team.0)
        .bind(agent.0)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The agent's autostart, if both cadence and prompt are set.
    pub async fn autostart(
        &self,
        team: TeamId,
        agent: AgentId,
    ) -> Result<Option<Autostart>, StoreError> {
        let row: (Option<String>, Option<String>) = sqlx::query_as(
            "SELECT autostart_cron, autostart_prompt FROM agents WHERE team_id = $1 AND id = $2",
        )
        .bind(team.0)
        .bind(agent.0)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        Ok(match row {
            (Some(cron), Some(prompt)) => Some(Autostart { cron, prompt }),
            _ => None,
        })
    }
}
