//! Connectors: MCP servers per team or per agent (SPEC B2).

use chrono::{DateTime, Utc};
use protocol::{AgentId, TeamId};
use serde::Serialize;
use sqlx::Row;
use uuid::Uuid;

use super::{Store, StoreError};

/// How the brain reaches a connector's MCP server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(tag = "transport", rename_all = "snake_case")]
pub enum ConnectorTarget {
    /// Streamable HTTP at this `http(s)://` URL.
    Http { url: String },
    /// A child process speaking MCP on stdin/stdout: program and arguments.
    Stdio { command: Vec<String> },
}

#[derive(Clone, Debug)]
pub struct NewConnector {
    /// `None`: every agent of the team.
    pub agent: Option<AgentId>,
    pub name: String,
    pub target: ConnectorTarget,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ConnectorRow {
    pub id: Uuid,
    /// `null` for a team-wide connector.
    pub agent_id: Option<AgentId>,
    pub name: String,
    #[serde(flatten)]
    pub target: ConnectorTarget,
    pub created_at: DateTime<Utc>,
}

const CONNECTOR_COLUMNS: &str = "id, agent_id, name, url, command, created_at";

fn connector_from_row(row: &sqlx::postgres::PgRow) -> Result<ConnectorRow, StoreError> {
    let url: Option<String> = row.try_get("url")?;
    let command: Option<Vec<String>> = row.try_get("command")?;
    let target = match (url, command) {
        (Some(url), None) => ConnectorTarget::Http { url },
        (None, Some(command)) => ConnectorTarget::Stdio { command },
        _ => {
            return Err(StoreError::Corrupt(
                "connector has not exactly one transport".into(),
            ));
        }
    };
    Ok(ConnectorRow {
        id: row.try_get("id")?,
        agent_id: row.try_get::<Option<Uuid>, _>("agent_id")?.map(AgentId),
        name: row.try_get("name")?,
        target,
        created_at: row.try_get("created_at")?,
    })
}

/// A unique name per scope → `Conflict("connector_name")`; an agent that vanished (or is
/// another team's) → `NotFound`.
fn insert_error(err: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &err {
        if db.is_unique_violation()
            && matches!(
                db.constraint(),
                Some("connectors_team_name" | "connectors_agent_name")
            )
        {
            return StoreError::Conflict("connector_name");
        }
        if db.is_foreign_key_violation() {
            return StoreError::NotFound;
        }
    }
    StoreError::Database(err)
}

impl Store {
    /// Creates a connector unless the team already has `max_per_team`
    /// (`Conflict("connector_limit")`).
    pub async fn create_connector(
        &self,
        team: TeamId,
        connector: &NewConnector,
        max_per_team: i64,
    ) -> Result<ConnectorRow, StoreError> {
        let (url, command) = match &connector.target {
            ConnectorTarget::Http { url } => (Some(url.as_str()), None),
            ConnectorTarget::Stdio { command } => (None, Some(command.as_slice())),
        };
        // The count is a soft cap: two concurrent creates may both pass it by one.
        let sql = format!(
            "INSERT INTO connectors (id, team_id, agent_id, name, url, command) \
             SELECT $1, $2, $3, $4, $5, $6 \
             WHERE (SELECT count(*) FROM connectors WHERE team_id = $2) < $7 \
             RETURNING {CONNECTOR_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(Uuid::now_v7())
            .bind(team.0)
            .bind(connector.agent.map(|a| a.0))
            .bind(&connector.name)
            .bind(url)
            .bind(command)
            .bind(max_per_team)
            .fetch_optional(&self.pool)
            .await
            .map_err(insert_error)?
            .ok_or(StoreError::Conflict("connector_limit"))?;
        connector_from_row(&row)
    }

    /// Every connector of the team, oldest first.
    pub async fn connectors(&self, team: TeamId) -> Result<Vec<ConnectorRow>, StoreError> {
        let sql = format!(
            "SELECT {CONNECTOR_COLUMNS} FROM connectors WHERE team_id = $1 \
             ORDER BY created_at, id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(connector_from_row).collect()
    }

    /// The connectors that apply to `agent`: its own first, then the team-wide ones, each
    /// group oldest first.
    pub async fn connectors_for_agent(
        &self,
        team: TeamId,
        agent: AgentId,
    ) -> Result<Vec<ConnectorRow>, StoreError> {
        let sql = format!(
            "SELECT {CONNECTOR_COLUMNS} FROM connectors \
             WHERE team_id = $1 AND (agent_id IS NULL OR agent_id = $2) \
             ORDER BY agent_id IS NULL, created_at, id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(agent.0)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(connector_from_row).collect()
    }

    pub async fn delete_connector(&self, team: TeamId, id: Uuid) -> Result<(), StoreError> {
        let done = sqlx::query("DELETE FROM connectors WHERE team_id = $1 AND id = $2")
            .bind(team.0)
            .bind(id)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }
}
