//! Connectors: MCP servers per team or per agent (SPEC B2).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use protocol::{AgentId, TeamId};
use serde::Serialize;
use sqlx::Row;
use uuid::Uuid;

use super::audit::{self, Action, Actor};
use super::{Store, StoreError};
use domain::approvals::RiskClass;

/// How the brain reaches a connector's MCP server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(tag = "transport", rename_all = "snake_case")]
pub enum ConnectorTarget {
    /// Streamable HTTP at this `http(s)://` URL, with extra request headers whose values
    /// are templates (`connectors::credentials`).
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
    /// A child process speaking MCP on stdin/stdout: program and arguments, with extra
    /// environment variables whose values are templates.
    Stdio {
        command: Vec<String>,
        env: BTreeMap<String, String>,
    },
}

impl ConnectorTarget {
    /// Its credential templates, `(headers, env)`; the other transport's is empty.
    pub fn templates(&self) -> (&BTreeMap<String, String>, &BTreeMap<String, String>) {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        match self {
            Self::Http { headers, .. } => (headers, &NONE),
            Self::Stdio { env, .. } => (&NONE, env),
        }
    }
}

#[derive(Clone, Debug)]
pub struct NewConnector {
    /// `None`: every agent of the team.
    pub agent: Option<AgentId>,
    pub name: String,
    pub target: ConnectorTarget,
    /// The bound on one tool call; `None`: the server's default.
    pub call_timeout_ms: Option<u32>,
    /// Whether the server's annotations may lower a tool's risk below `write`.
    pub trust_hints: bool,
    /// Risk classes an admin set, by the tool's name on the server; they win over hints.
    pub tool_risks: BTreeMap<String, RiskClass>,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ConnectorRow {
    pub id: Uuid,
    /// `null` for a team-wide connector.
    pub agent_id: Option<AgentId>,
    pub name: String,
    #[serde(flatten)]
    pub target: ConnectorTarget,
    /// The bound on one of its tool calls; `null`: the server's
    /// `BRAIN_CONNECTOR_CALL_TIMEOUT_MS`.
    pub call_timeout_ms: Option<u32>,
    /// Whether its server's tool annotations (`readOnlyHint`...) may lower a tool's risk
    /// class below `write`; otherwise they can only raise it.
    pub trust_hints: bool,
    /// Risk classes an admin set, by the tool's name on the server: they win over the
    /// annotations, trusted or not.
    #[schema(value_type = BTreeMap<String, String>)]
    pub tool_risks: BTreeMap<String, RiskClass>,
    pub created_at: DateTime<Utc>,
}

const CONNECTOR_COLUMNS: &str = "id, agent_id, name, url, command, headers, env, \
    call_timeout_ms, trust_hints, tool_risks, created_at";

fn connector_from_row(row: &sqlx::postgres::PgRow) -> Result<ConnectorRow, StoreError> {
    let url: Option<String> = row.try_get("url")?;
    let command: Option<Vec<String>> = row.try_get("command")?;
    let templates = |column: &str| -> Result<BTreeMap<String, String>, StoreError> {
        let sqlx::types::Json(map) = row.try_get(column)?;
        Ok(map)
    };
    let target = match (url, command) {
        (Some(url), None) => ConnectorTarget::Http {
            url,
            headers: templates("headers")?,
        },
        (None, Some(command)) => ConnectorTarget::Stdio {
            command,
            env: templates("env")?,
        },
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
        call_timeout_ms: row
            .try_get::<Option<i32>, _>("call_timeout_ms")?
            .map(|ms| u32::try_from(ms).unwrap_or(u32::MAX)),
        trust_hints: row.try_get("trust_hints")?,
        tool_risks: row
            .try_get::<sqlx::types::Json<BTreeMap<String, RiskClass>>, _>("tool_risks")?
            .0,
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
        by: &Actor,
    ) -> Result<ConnectorRow, StoreError> {
        let none = BTreeMap::new();
        let (url, command, headers, env) = match &connector.target {
            ConnectorTarget::Http { url, headers } => (Some(url.as_str()), None, headers, &none),
            ConnectorTarget::Stdio { command, env } => (None, Some(command.as_slice()), &none, env),
        };
        // The count is a soft cap: two concurrent creates may both pass it by one.
        let sql = format!(
            "INSERT INTO connectors \
               (id, team_id, agent_id, name, url, command, headers, env, call_timeout_ms, \
                trust_hints, tool_risks) \
             SELECT $1, $2, $3, $4, $5, $6, $8, $9, $10, $11, $12 \
             WHERE (SELECT count(*) FROM connectors WHERE team_id = $2) < $7 \
             RETURNING {CONNECTOR_COLUMNS}"
        );
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(Uuid::now_v7())
            .bind(team.0)
            .bind(connector.agent.map(|a| a.0))
            .bind(&connector.name)
            .bind(url)
            .bind(command)
            .bind(max_per_team)
            .bind(sqlx::types::Json(headers))
            .bind(sqlx::types::Json(env))
            .bind(
                connector
                    .call_timeout_ms
                    .map(|ms| i32::try_from(ms).unwrap_or(i32::MAX)),
            )
            .bind(connector.trust_hints)
            .bind(sqlx::types::Json(&connector.tool_risks))
            .fetch_optional(&mut *tx)
            .await
            .map_err(insert_error)?
            .ok_or(StoreError::Conflict("connector_limit"))?;
        let made = connector_from_row(&row)?;
        let details = serde_json::json!({
            "name": made.name,
            "agent_id": made.agent_id,
            "trust_hints": made.trust_hints,
            "tool_risks": made.tool_risks,
        });
        audit::record(
            &mut tx,
            team,
            by,
            Action::ConnectorCreated,
            made.id,
            details,
        )
        .await?;
        tx.commit().await?;
        Ok(made)
    }

    /// Sets how the connector's tools' risk is judged: `trust_hints` and the classes set
    /// by tool (the whole map), each when given; `NotFound` for another team's.
    pub async fn update_connector_risks(
        &self,
        team: TeamId,
        id: Uuid,
        trust_hints: Option<bool>,
        tool_risks: Option<&BTreeMap<String, RiskClass>>,
        by: &Actor,
    ) -> Result<ConnectorRow, StoreError> {
        let sql = format!(
            "UPDATE connectors SET trust_hints = coalesce($3, trust_hints), \
               tool_risks = coalesce($4, tool_risks) \
             WHERE team_id = $1 AND id = $2 RETURNING {CONNECTOR_COLUMNS}"
        );
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(id)
            .bind(trust_hints)
            .bind(tool_risks.map(sqlx::types::Json))
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let updated = connector_from_row(&row)?;
        let details = serde_json::json!({
            "trust_hints": updated.trust_hints,
            "tool_risks": updated.tool_risks,
        });
        audit::record(&mut tx, team, by, Action::ConnectorUpdated, id, details).await?;
        tx.commit().await?;
        Ok(updated)
    }

    /// Every connector of the team, oldest first.
    /// One connector of the team; `NotFound` for an unknown or other team's id.
    pub async fn connector(&self, team: TeamId, id: Uuid) -> Result<ConnectorRow, StoreError> {
        let sql =
            format!("SELECT {CONNECTOR_COLUMNS} FROM connectors WHERE team_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        connector_from_row(&row)
    }

    /// A page of the team's connectors, oldest first: at most `limit` after `after`.
    pub async fn connectors(
        &self,
        team: TeamId,
        after: Option<super::Keyset>,
        limit: i64,
    ) -> Result<Vec<ConnectorRow>, StoreError> {
        let sql = format!(
            "SELECT {CONNECTOR_COLUMNS} FROM connectors WHERE team_id = $1 AND {} \
             ORDER BY created_at, id LIMIT $2",
            super::keyset_after(">", "$3", "$4")
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(limit)
            .bind(after.map(|k| k.at))
            .bind(after.map(|k| k.id))
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

    pub async fn delete_connector(
        &self,
        team: TeamId,
        id: Uuid,
        by: &Actor,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        revoke_grants(&mut tx, team, Grants::Connector(id), by).await?;
        let done = sqlx::query("DELETE FROM connectors WHERE team_id = $1 AND id = $2")
            .bind(team.0)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        let details = serde_json::json!({});
        audit::record(&mut tx, team, by, Action::ConnectorDeleted, id, details).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Whose OAuth grants [`revoke_grants`] deletes.
#[derive(Clone, Copy)]
pub(super) enum Grants<'a> {
    Connector(Uuid),
    /// Of the connectors bound to this agent.
    Agent(AgentId),
    /// An end user's own, of every connector (the user is erased).
    User(&'a str),
}

/// Deletes grants of `team` (before what they belong to goes, which would take them
/// unlogged) and logs each `grant.revoked` by `by`, naming its connector and its user
/// (`null` for the connector's own), in the caller's transaction (L5).
pub(super) async fn revoke_grants(
    conn: &mut sqlx::PgConnection,
    team: TeamId,
    grants: Grants<'_>,
    by: &Actor,
) -> Result<(), StoreError> {
    let (connector, agent, user) = match grants {
        Grants::Connector(id) => (Some(id), None, None),
        Grants::Agent(agent) => (None, Some(agent.0), None),
        Grants::User(user) => (None, None, Some(user)),
    };
    let gone: Vec<(Uuid, Option<String>)> = sqlx::query_as(
        "DELETE FROM connector_grants g WHERE g.team_id = $1 \
           AND ($2::uuid IS NULL OR g.connector_id = $2) \
           AND ($3::uuid IS NULL OR g.connector_id IN \
                (SELECT id FROM connectors WHERE team_id = $1 AND agent_id = $3)) \
           AND ($4::text IS NULL OR g.user_id = $4) \
         RETURNING g.connector_id, g.user_id",
    )
    .bind(team.0)
    .bind(connector)
    .bind(agent)
    .bind(user)
    .fetch_all(&mut *conn)
    .await?;
    let entries = gone
        .into_iter()
        .map(|(connector, user)| (connector.to_string(), serde_json::json!({ "user": user })))
        .collect();
    audit::record_each(conn, team, by, Action::GrantRevoked, entries).await
}
