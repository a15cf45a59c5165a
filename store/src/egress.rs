//! What a session's egress proxy needs (W13, W14; docs/design/egress.md): the allowlist of
//! the session's agent and its egress secrets, unsealed. Read by the runtime-manager, which
//! runs the proxies, when a client connection opens. And the session's ledger of requests
//! (W15): written in batches by the manager, listed by the brain.

use chrono::{DateTime, Utc};
use domain::egress::{AgentEgress, SecretEgress};
use protocol::{AgentId, ChatId, SessionId, TeamId};

use super::secrets::{EgressValue, SecretsError, associated_data};
use super::{Store, StoreError};

/// At most this many requests are kept per session; the rest are counted.
pub const MAX_EGRESS_REQUESTS: i64 = 10_000;

/// One request through a session's egress proxy, as stored and listed (W15): never a body,
/// a header or a path.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct EgressRequest {
    /// Its place in the session's ledger, in order.
    pub id: i64,
    pub host: String,
    pub port: u16,
    /// The HTTP method; `CONNECT` for a tunnel the proxy did not look into.
    pub method: String,
    /// The status the command received (`403`: refused by the proxy).
    pub status: u16,
    /// Why the proxy refused or failed it: `host_not_allowed`, `private_address`,
    /// `metadata_address`, `name_not_resolved`, `upstream_unreachable`, `upstream_timeout`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// The proxy ended TLS to set an egress secret.
    pub tls_ended: bool,
    pub at: DateTime<Utc>,
}

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

/// The columns of the bulk insert, one array per column.
#[derive(Default)]
struct Columns {
    host: Vec<String>,
    port: Vec<i32>,
    method: Vec<String>,
    status: Vec<i32>,
    refused: Vec<Option<String>>,
    sent: Vec<i64>,
    received: Vec<i64>,
    tls: Vec<bool>,
    at: Vec<DateTime<Utc>>,
}

impl Store {
    /// Appends `records` (ids are ignored) to the ledger of the session behind `launched`
    /// (itself, or the session a warm-pool slot was claimed for), up to
    /// [`MAX_EGRESS_REQUESTS`] per session; what does not fit, and `dropped` (records the
    /// proxy could not keep for the writer), is added to the session's count. The number
    /// stored; none when no session is behind `launched`.
    pub async fn append_egress_requests(
        &self,
        launched: SessionId,
        records: &[EgressRequest],
        dropped: u64,
    ) -> Result<u64, StoreError> {
        let mut c = Columns::default();
        for r in records {
            c.host.push(r.host.clone());
            c.port.push(i32::from(r.port));
            c.method.push(r.method.clone());
            c.status.push(i32::from(r.status));
            c.refused.push(r.refused.clone());
            c.sent.push(i64::try_from(r.bytes_sent).unwrap_or(i64::MAX));
            c.received
                .push(i64::try_from(r.bytes_received).unwrap_or(i64::MAX));
            c.tls.push(r.tls_ended);
            c.at.push(r.at);
        }
        let offered = records.len() as i64 + i64::try_from(dropped).unwrap_or(i64::MAX);
        // One writer per session (its proxy's), so the count read here is not raced.
        let (stored,): (i64,) = sqlx::query_as(
            "WITH s AS (SELECT id, team_id FROM agent_runtime_sessions \
                        WHERE id = $1 OR id = (SELECT session_id FROM worker_pool WHERE id = $1) \
                        LIMIT 1), \
             room AS (SELECT GREATEST($11 - (SELECT count(*) FROM egress_requests e, s \
                                              WHERE e.session_id = s.id), 0) AS n), \
             ins AS (INSERT INTO egress_requests (team_id, session_id, host, port, method, \
                        status, refused, bytes_sent, bytes_received, tls_ended, at) \
                     SELECT s.team_id, s.id, r.host, r.port, r.method, r.status, r.refused, \
                            r.sent, r.received, r.tls, r.at \
                     FROM s, room, unnest($2::text[], $3::int4[], $4::text[], $5::int4[], \
                          $6::text[], $7::int8[], $8::int8[], $9::bool[], $10::timestamptz[]) \
                          WITH ORDINALITY AS r(host, port, method, status, refused, sent, \
                                               received, tls, at, ord) \
                     WHERE r.ord <= room.n \
                     RETURNING 1), \
             counted AS (UPDATE agent_runtime_sessions a \
                         SET egress_requests_dropped = egress_requests_dropped \
                             + ($12 - (SELECT count(*) FROM ins)) \
                         FROM s WHERE a.id = s.id AND $12 > (SELECT count(*) FROM ins) \
                         RETURNING 1) \
             SELECT count(*) FROM ins",
        )
        .bind(launched.0)
        .bind(&c.host)
        .bind(&c.port)
        .bind(&c.method)
        .bind(&c.status)
        .bind(&c.refused)
        .bind(&c.sent)
        .bind(&c.received)
        .bind(&c.tls)
        .bind(&c.at)
        .bind(MAX_EGRESS_REQUESTS)
        .bind(offered)
        .fetch_one(&self.pool)
        .await?;
        Ok(u64::try_from(stored).unwrap_or(0))
    }

    /// The session's chat and the count of its requests not kept, for the listing's
    /// authorization and answer; `NotFound` for another team's session.
    pub async fn egress_session(
        &self,
        team: TeamId,
        session: SessionId,
    ) -> Result<(ChatId, i64), StoreError> {
        let row: Option<(uuid::Uuid, i64)> = sqlx::query_as(
            "SELECT chat_id, egress_requests_dropped FROM agent_runtime_sessions \
             WHERE team_id = $1 AND id = $2",
        )
        .bind(team.0)
        .bind(session.0)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|(chat, dropped)| (ChatId(chat), dropped))
            .ok_or(StoreError::NotFound)
    }

    /// A page of the session's requests in order: at most `limit` after the one `after`.
    pub async fn egress_requests(
        &self,
        team: TeamId,
        session: SessionId,
        after: Option<i64>,
        limit: i64,
    ) -> Result<Vec<EgressRequest>, StoreError> {
        type Row = (
            i64,
            String,
            i32,
            String,
            i32,
            Option<String>,
            i64,
            i64,
            bool,
            DateTime<Utc>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, host, port, method, status, refused, bytes_sent, bytes_received, \
                    tls_ended, at \
             FROM egress_requests WHERE team_id = $1 AND session_id = $2 \
               AND ($3::int8 IS NULL OR id > $3) ORDER BY id LIMIT $4",
        )
        .bind(team.0)
        .bind(session.0)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, host, port, method, status, refused, sent, received, tls_ended, at)| {
                    EgressRequest {
                        id,
                        host,
                        port: u16::try_from(port).unwrap_or(0),
                        method,
                        status: u16::try_from(status).unwrap_or(0),
                        refused,
                        bytes_sent: u64::try_from(sent).unwrap_or(0),
                        bytes_received: u64::try_from(received).unwrap_or(0),
                        tls_ended,
                        at,
                    }
                },
            )
            .collect())
    }
}
