//! What a session's egress proxy needs (W13, W14; docs/design/egress.md): the allowlist of
//! the session's agent and its egress secrets, unsealed. Read by the runtime-manager, which
//! runs the proxies, when a client connection opens.

use domain::egress::{AgentEgress, SecretEgress};
use protocol::{AgentId, SessionId, TeamId};

use super::Store;
use super::secrets::{EgressValue, SecretsError, associated_data};

/// A session's egress configuration as stored. `Debug` shows no secret value.
#[derive(Debug)]
pub struct EgressParts {
    /// The session the worker serves: itself, or the session a warm-pool slot was claimed
    /// for.
    pub session: SessionId,
    pub team: TeamId,
    pub agent: AgentId,
    /// `None`: every host (the agent has no allowlist).
    pub allow: Option<AgentEgress>,
    pub secrets: Vec<EgressValue>,
    /// Egress secrets that did not decrypt under this key (another key, a tampered row):
    /// left out, so requests to their hosts go without the credential.
    pub unreadable: usize,
}

impl std::fmt::Debug for EgressValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressValue")
            .field("name", &self.name)
            .field("egress", &self.egress)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// The egress configuration of the worker launched as `launched` (a session, or a
    /// warm-pool slot once claimed). `Ok(None)`: no session is behind it yet (a slot still
    /// waiting, or a row gone). An agent with egress secrets on a store without a key is
    /// [`SecretsError::NotConfigured`]: its commands must not run without them.
    ///
    /// **Who may call this:** as [`Store::secret_value`], only the egress proxy.
    pub async fn egress_policy_parts(
        &self,
        launched: SessionId,
    ) -> Result<Option<EgressParts>, SecretsError> {
        type Head = (
            uuid::Uuid,
            uuid::Uuid,
            uuid::Uuid,
            Option<sqlx::types::Json<AgentEgress>>,
        );
        let head: Option<Head> = sqlx::query_as(
            "SELECT s.id, s.team_id, s.agent_id, a.egress \
             FROM agent_runtime_sessions s \
             JOIN agents a ON a.team_id = s.team_id AND a.id = s.agent_id \
             WHERE s.id = $1 \
                OR s.id = (SELECT w.session_id FROM worker_pool w WHERE w.id = $1) \
             LIMIT 1",
        )
        .bind(launched.0)
        .fetch_optional(&self.pool)
        .await?;
        let Some((session, team, agent, allow)) = head else {
            return Ok(None);
        };
        let (team, agent) = (TeamId(team), AgentId(agent));
        type Row = (String, Vec<u8>, Vec<u8>, sqlx::types::Json<SecretEgress>);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT name, nonce, ciphertext, egress FROM secrets \
             WHERE team_id = $1 AND agent_id = $2 AND egress IS NOT NULL ORDER BY name",
        )
        .bind(team.0)
        .bind(agent.0)
        .fetch_all(&self.pool)
        .await?;
        let mut parts = EgressParts {
            session: SessionId(session),
            team,
            agent,
            allow: allow.map(|a| a.0),
            secrets: Vec::with_capacity(rows.len()),
            unreadable: 0,
        };
        if rows.is_empty() {
            return Ok(Some(parts));
        }
        let key = self.secrets.as_ref().ok_or(SecretsError::NotConfigured)?;
        for (name, nonce, ciphertext, egress) in rows {
            let aad = associated_data(team, Some(agent), &name);
            match key
                .open(&aad, &nonce, &ciphertext)
                .ok()
                .and_then(|plain| String::from_utf8(plain).ok())
            {
                Some(value) => parts.secrets.push(EgressValue {
                    name,
                    value,
                    egress: egress.0,
                }),
                None => parts.unreadable += 1,
            }
        }
        Ok(Some(parts))
    }
}
