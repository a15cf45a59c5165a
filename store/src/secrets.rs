//! Per-agent secrets (SPEC B1), encrypted at rest with AES-256-GCM.
//!
//! The key comes from configuration (`BRAIN_SECRETS_KEY`) and never reaches the database.
//! Every write draws a fresh random 96-bit nonce, and the ciphertext is bound to its
//! (team, agent, name) as associated data, so a row copied to another agent or renamed
//! no longer decrypts. Values never appear in logs, errors or `Debug` output (X4).

use std::collections::HashMap;
use std::sync::Arc;

use aes_gcm::aead::{Aead, Generate, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use domain::egress::SecretEgress;
use protocol::{AgentId, TeamId};
use uuid::Uuid;

use super::audit::{self, Action, Actor};
use super::{Store, StoreError};

/// The key secrets are encrypted under. `Debug` never shows it.
#[derive(Clone)]
pub struct SecretsKey {
    cipher: Arc<Aes256Gcm>,
    /// The key's bytes, for [`SecretsKey::derive`] only.
    raw: Arc<[u8; 32]>,
}

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsKey(redacted)")
    }
}

impl SecretsKey {
    /// Parses 32 bytes written as 64 hex digits or as base64 (standard or URL-safe,
    /// padded or not). The error describes the expected form, never the input.
    pub fn parse(raw: &str) -> Result<Self, &'static str> {
        const PROBLEM: &str = "must be 32 bytes, as 64 hex digits or base64";
        let raw = raw.trim();
        let bytes = if raw.len() == 64 && raw.bytes().all(|b| b.is_ascii_hexdigit()) {
            hex_decode(raw)
        } else {
            let engines = [
                &base64::engine::general_purpose::STANDARD,
                &base64::engine::general_purpose::STANDARD_NO_PAD,
                &base64::engine::general_purpose::URL_SAFE,
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            ];
            engines.iter().find_map(|e| e.decode(raw).ok())
        };
        let bytes: [u8; 32] = bytes.and_then(|b| b.try_into().ok()).ok_or(PROBLEM)?;
        Ok(Self {
            cipher: Arc::new(Aes256Gcm::new(&Key::<Aes256Gcm>::from(bytes))),
            raw: Arc::new(bytes),
        })
    }

    /// A key of its own for another use, named by `label` (HMAC-SHA256 of the label under
    /// this key): the same on every replica configured alike, and neither it nor what it
    /// signs tells anything of this key or of another label's.
    pub fn derive(&self, label: &str) -> [u8; 32] {
        let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, self.raw.as_slice());
        let tag = aws_lc_rs::hmac::sign(&key, label.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Encrypts `value` bound to `aad` (what the row belongs to, in a fixed-width or
    /// otherwise unambiguous encoding the caller chooses): (fresh nonce, ciphertext with
    /// tag).
    pub(crate) fn seal(
        &self,
        aad: &[u8],
        value: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), SecretsError> {
        let nonce = Nonce::generate();
        let ciphertext = self
            .cipher
            .encrypt(&nonce, Payload { msg: value, aad })
            .map_err(|_| SecretsError::Crypto)?;
        Ok((nonce.to_vec(), ciphertext))
    }

    /// Decrypts a stored value; fails on a wrong key, another owner (`aad`), or a tampered
    /// row.
    pub(crate) fn open(
        &self,
        aad: &[u8],
        nonce: &[u8],
        ciphertext: &[u8],
    ) -> Result<Vec<u8>, SecretsError> {
        let nonce = Nonce::try_from(nonce).map_err(|_| SecretsError::Crypto)?;
        self.cipher
            .decrypt(
                &nonce,
                Payload {
                    msg: ciphertext,
                    aad,
                },
            )
            .map_err(|_| SecretsError::Crypto)
    }
}

/// team id (16 bytes) ‖ agent id (16 bytes, all zero for a team secret: agent ids are
/// UUIDv7, never nil) ‖ name: fixed-width ids keep it unambiguous.
pub(crate) fn associated_data(team: TeamId, agent: Option<AgentId>, name: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(32 + name.len());
    aad.extend_from_slice(team.0.as_bytes());
    aad.extend_from_slice(agent.map_or(Uuid::nil(), |a| a.0).as_bytes());
    aad.extend_from_slice(name.as_bytes());
    aad
}

fn hex_decode(raw: &str) -> Option<Vec<u8>> {
    (0..raw.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(raw.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Why a secret operation failed. No variant carries a value.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// `BRAIN_SECRETS_KEY` is not set on this server.
    #[error("secrets are not configured on this server")]
    NotConfigured,
    /// The agent already holds the maximum number of secrets.
    #[error("too many secrets")]
    TooMany,
    /// Encryption failed, or a stored value does not decrypt under this key.
    #[error("secret cannot be decrypted")]
    Crypto,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for SecretsError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::Database(e))
    }
}

impl SecretsError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::NotConfigured => "not_configured",
            Self::TooMany => "too_many",
            Self::Crypto => "crypto",
            Self::Store(e) => e.metric_label(),
        }
    }
}

fn infos(rows: Vec<(String, DateTime<Utc>)>) -> Vec<SecretInfo> {
    rows.into_iter()
        .map(|(name, updated_at)| SecretInfo { name, updated_at })
        .collect()
}

/// An agent's secrets, decrypted (name, value), for its worker sessions. `Debug` shows
/// the names only.
#[derive(Default)]
pub struct AgentSecrets {
    /// Ordinary secrets (name, value): the commands' environment.
    pub values: Vec<(String, String)>,
    /// Egress secrets (W13): only their placeholders enter the sandbox; the values go to
    /// the egress proxy.
    pub egress: Vec<EgressValue>,
    /// Rows that did not decrypt (another key, a tampered row): left out.
    pub unreadable: usize,
}

impl std::fmt::Debug for AgentSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSecrets")
            .field(
                "names",
                &self.values.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field(
                "egress",
                &self.egress.iter().map(|e| &e.name).collect::<Vec<_>>(),
            )
            .field("unreadable", &self.unreadable)
            .finish()
    }
}

/// An egress secret, decrypted, for the egress proxy only. `Debug` shows no value.
pub struct EgressValue {
    pub name: String,
    pub value: String,
    pub egress: SecretEgress,
}

/// A stored secret as anyone but its injector may see it: no value.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct SecretInfo {
    pub name: String,
    pub updated_at: DateTime<Utc>,
}

impl Store {
    /// The store with the key secrets are encrypted under (`None`: secrets are off).
    pub fn with_secrets_key(mut self, key: Option<SecretsKey>) -> Self {
        self.secrets = key;
        self
    }

    pub fn secrets_configured(&self) -> bool {
        self.secrets.is_some()
    }

    /// The key values are sealed under (connector OAuth).
    pub fn secrets_key(&self) -> Result<&SecretsKey, SecretsError> {
        self.secrets.as_ref().ok_or(SecretsError::NotConfigured)
    }

    /// Stores `value` under `name` for the agent, replacing an older value of that name.
    /// A new name beyond `max_per_agent` is refused with `TooMany`.
    pub async fn set_secret(
        &self,
        team: TeamId,
        agent: AgentId,
        name: &str,
        value: &str,
        max_per_agent: i64,
        by: &Actor,
    ) -> Result<(), SecretsError> {
        let key = self.secrets.as_ref().ok_or(SecretsError::NotConfigured)?;
        let aad = associated_data(team, Some(agent), name);
        let (nonce, ciphertext) = key.seal(&aad, value.as_bytes())?;
        // The insert selects from agents so that another team's agent id finds nothing,
        // and counts so that a new name past the limit inserts nothing.
        let mut tx = self.pool.begin().await?;
        let written = sqlx::query(
            "INSERT INTO secrets (id, team_id, agent_id, name, nonce, ciphertext) \
             SELECT $1, a.team_id, a.id, $4, $5, $6 FROM agents a \
             WHERE a.team_id = $2 AND a.id = $3 \
               AND ((SELECT count(*) FROM secrets s WHERE s.team_id = $2 AND s.agent_id = $3) < $7 \
                    OR EXISTS (SELECT 1 FROM secrets s \
                               WHERE s.team_id = $2 AND s.agent_id = $3 AND s.name = $4)) \
             ON CONFLICT (agent_id, name) DO UPDATE \
               SET nonce = EXCLUDED.nonce, ciphertext = EXCLUDED.ciphertext, updated_at = now() \
               WHERE secrets.team_id = EXCLUDED.team_id",
        )
        .bind(Uuid::now_v7())
        .bind(team.0)
        .bind(agent.0)
        .bind(name)
        .bind(&nonce)
        .bind(&ciphertext)
        .bind(max_per_agent)
        .execute(&mut *tx)
        .await?;
        if written.rows_affected() == 1 {
            let details = serde_json::json!({ "secret": name });
            audit::record(&mut tx, team, by, Action::ToolSecretSet, agent, details).await?;
            tx.commit().await?;
            return Ok(());
        }
        let agent_exists: Option<(i32,)> =
            sqlx::query_as("SELECT 1 FROM agents WHERE team_id = $1 AND id = $2")
                .bind(team.0)
                .bind(agent.0)
                .fetch_optional(&mut *tx)
                .await?;
        Err(match agent_exists {
            Some(_) => SecretsError::TooMany,
            None => SecretsError::Store(StoreError::NotFound),
        })
    }

    /// Stores an agent secret through the API (`PUT /v1/agents/{id}/secrets/{name}`,
    /// W13): `value` and its egress settings as a whole (`None`: an ordinary secret), an
    /// older secret of that name replaced. A new name beyond `max_per_agent` is refused
    /// with `TooMany`, another team's or an archived agent is `NotFound`. `true` when the
    /// name is new.
    #[allow(clippy::too_many_arguments)]
    pub async fn put_agent_secret(
        &self,
        team: TeamId,
        agent: AgentId,
        name: &str,
        value: &str,
        egress: Option<&SecretEgress>,
        max_per_agent: i64,
        by: &Actor,
    ) -> Result<bool, SecretsError> {
        let key = self.secrets.as_ref().ok_or(SecretsError::NotConfigured)?;
        let aad = associated_data(team, Some(agent), name);
        let (nonce, ciphertext) = key.seal(&aad, value.as_bytes())?;
        let mut tx = self.pool.begin().await?;
        // As `set_secret`, with the egress settings written on both paths.
        let written: Option<(bool,)> = sqlx::query_as(
            "INSERT INTO secrets (id, team_id, agent_id, name, nonce, ciphertext, egress) \
             SELECT $1, a.team_id, a.id, $4, $5, $6, $8 FROM agents a \
             WHERE a.team_id = $2 AND a.id = $3 AND a.archived_at IS NULL \
               AND ((SELECT count(*) FROM secrets s WHERE s.team_id = $2 AND s.agent_id = $3) < $7 \
                    OR EXISTS (SELECT 1 FROM secrets s \
                               WHERE s.team_id = $2 AND s.agent_id = $3 AND s.name = $4)) \
             ON CONFLICT (agent_id, name) DO UPDATE \
               SET nonce = EXCLUDED.nonce, ciphertext = EXCLUDED.ciphertext, \
                   egress = EXCLUDED.egress, updated_at = now() \
               WHERE secrets.team_id = EXCLUDED.team_id \
             RETURNING xmax = 0",
        )
        .bind(Uuid::now_v7())
        .bind(team.0)
        .bind(agent.0)
        .bind(name)
        .bind(&nonce)
        .bind(&ciphertext)
        .bind(max_per_agent)
        .bind(egress.map(sqlx::types::Json))
        .fetch_optional(&mut *tx)
        .await?;
        let Some((created,)) = written else {
            let live: Option<(i32,)> = sqlx::query_as(
                "SELECT 1 FROM agents WHERE team_id = $1 AND id = $2 AND archived_at IS NULL",
            )
            .bind(team.0)
            .bind(agent.0)
            .fetch_optional(&mut *tx)
            .await?;
            return Err(match live {
                Some(_) => SecretsError::TooMany,
                None => SecretsError::Store(StoreError::NotFound),
            });
        };
        let details = serde_json::json!({
            "agent": agent.0, "created": created, "egress": egress.is_some()
        });
        audit::record(&mut tx, team, by, Action::SecretSet, name, details).await?;
        tx.commit().await?;
        Ok(created)
    }

    /// The agent's secret names, without values, by name.
    pub async fn list_secrets(
        &self,
        team: TeamId,
        agent: AgentId,
    ) -> Result<Vec<SecretInfo>, StoreError> {
        let rows: Vec<(String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT name, updated_at FROM secrets WHERE team_id = $1 AND agent_id = $2 ORDER BY name",
        )
        .bind(team.0)
        .bind(agent.0)
        .fetch_all(&self.pool)
        .await?;
        Ok(infos(rows))
    }

    /// The decrypted value of one secret.
    ///
    /// **Who may call this:** only code that injects secrets into a tool's execution (the
    /// worker channel, connector credentials), never the model path: no tool result, log
    /// line, error or stream chunk may carry what this returns (SPEC B1, X4).
    pub async fn secret_value(
        &self,
        team: TeamId,
        agent: AgentId,
        name: &str,
    ) -> Result<String, SecretsError> {
        let key = self.secrets.as_ref().ok_or(SecretsError::NotConfigured)?;
        let (nonce, ciphertext): (Vec<u8>, Vec<u8>) = sqlx::query_as(
            "SELECT nonce, ciphertext FROM secrets WHERE team_id = $1 AND agent_id = $2 AND name = $3",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        let plain = key.open(
            &associated_data(team, Some(agent), name),
            &nonce,
            &ciphertext,
        )?;
        String::from_utf8(plain).map_err(|_| SecretsError::Crypto)
    }

    /// Every secret of the agent, decrypted, by name: the environment of its sessions'
    /// commands (W12). A row that does not decrypt under this key is left out and
    /// counted. Secrets off (no key): none.
    ///
    /// **Who may call this:** as [`Store::secret_value`], only the worker channel.
    pub async fn agent_secrets(
        &self,
        team: TeamId,
        agent: AgentId,
    ) -> Result<AgentSecrets, StoreError> {
        let Some(key) = self.secrets.as_ref() else {
            return Ok(AgentSecrets::default());
        };
        type Row = (
            String,
            Vec<u8>,
            Vec<u8>,
            Option<sqlx::types::Json<SecretEgress>>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT name, nonce, ciphertext, egress FROM secrets \
             WHERE team_id = $1 AND agent_id = $2 ORDER BY name",
        )
        .bind(team.0)
        .bind(agent.0)
        .fetch_all(&self.pool)
        .await?;
        let mut secrets = AgentSecrets::default();
        for (name, nonce, ciphertext, egress) in rows {
            let aad = associated_data(team, Some(agent), &name);
            match key
                .open(&aad, &nonce, &ciphertext)
                .ok()
                .and_then(|plain| String::from_utf8(plain).ok())
            {
                Some(value) => match egress {
                    Some(egress) => secrets.egress.push(EgressValue {
                        name,
                        value,
                        egress: egress.0,
                    }),
                    None => secrets.values.push((name, value)),
                },
                None => secrets.unreadable += 1,
            }
        }
        Ok(secrets)
    }

    /// Stores a team secret (`PUT /v1/secrets/{secret_name}`), replacing an older value of that
    /// name; a new name beyond `max_per_team` is refused with `TooMany`. `true` when the
    /// name is new.
    pub async fn set_team_secret(
        &self,
        team: TeamId,
        name: &str,
        value: &str,
        max_per_team: i64,
        by: &Actor,
    ) -> Result<bool, SecretsError> {
        let key = self.secrets.as_ref().ok_or(SecretsError::NotConfigured)?;
        let (nonce, ciphertext) = key.seal(&associated_data(team, None, name), value.as_bytes())?;
        // `xmax = 0` tells an insert from an update of the conflicting row.
        let mut tx = self.pool.begin().await?;
        let written: Option<(bool,)> = sqlx::query_as(
            "INSERT INTO team_secrets (team_id, name, nonce, ciphertext) \
             SELECT $1, $2, $3, $4 \
             WHERE (SELECT count(*) FROM team_secrets WHERE team_id = $1) < $5 \
                OR EXISTS (SELECT 1 FROM team_secrets WHERE team_id = $1 AND name = $2) \
             ON CONFLICT (team_id, name) DO UPDATE \
               SET nonce = EXCLUDED.nonce, ciphertext = EXCLUDED.ciphertext, updated_at = now() \
             RETURNING xmax = 0",
        )
        .bind(team.0)
        .bind(name)
        .bind(&nonce)
        .bind(&ciphertext)
        .bind(max_per_team)
        .fetch_optional(&mut *tx)
        .await?;
        let (created,) = written.ok_or(SecretsError::TooMany)?;
        let details = serde_json::json!({ "created": created });
        audit::record(&mut tx, team, by, Action::SecretSet, name, details).await?;
        tx.commit().await?;
        Ok(created)
    }

    /// The team's secret names, without values, by name.
    /// A page of the team's secret names in name order: at most `limit` after `after`.
    pub async fn list_team_secrets(
        &self,
        team: TeamId,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<SecretInfo>, StoreError> {
        let rows: Vec<(String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT name, updated_at FROM team_secrets \
             WHERE team_id = $1 AND ($3::text IS NULL OR name > $3) ORDER BY name LIMIT $2",
        )
        .bind(team.0)
        .bind(limit)
        .bind(after)
        .fetch_all(&self.pool)
        .await?;
        Ok(infos(rows))
    }

    pub async fn delete_team_secret(
        &self,
        team: TeamId,
        name: &str,
        by: &Actor,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("DELETE FROM team_secrets WHERE team_id = $1 AND name = $2")
            .bind(team.0)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        let details = serde_json::json!({});
        audit::record(&mut tx, team, by, Action::SecretDeleted, name, details).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The decrypted values of `names` for a connector of `agent`'s turn: the agent's own
    /// secret of a name, else the team's. A name neither holds is absent from the answer.
    ///
    /// **Who may call this:** the same as [`Store::secret_value`]: only code that injects
    /// the values into a connection (connector credentials), never the model path.
    pub async fn resolve_secrets(
        &self,
        team: TeamId,
        agent: AgentId,
        names: &[String],
    ) -> Result<HashMap<String, String>, SecretsError> {
        let key = self.secrets.as_ref().ok_or(SecretsError::NotConfigured)?;
        // The agent's rows sort first, so the team's row of a name the agent also holds is
        // skipped below.
        let rows: Vec<(bool, String, Vec<u8>, Vec<u8>)> = sqlx::query_as(
            "SELECT true, name, nonce, ciphertext FROM secrets \
               WHERE team_id = $1 AND agent_id = $2 AND name = ANY($3) \
             UNION ALL \
             SELECT false, name, nonce, ciphertext FROM team_secrets \
               WHERE team_id = $1 AND name = ANY($3) \
             ORDER BY 1 DESC",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(names)
        .fetch_all(&self.pool)
        .await?;
        let mut values = HashMap::with_capacity(rows.len());
        for (own, name, nonce, ciphertext) in rows {
            if values.contains_key(&name) {
                continue;
            }
            let aad = associated_data(team, own.then_some(agent), &name);
            let plain = key.open(&aad, &nonce, &ciphertext)?;
            let value = String::from_utf8(plain).map_err(|_| SecretsError::Crypto)?;
            values.insert(name, value);
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn keys_parse_from_hex_and_base64_only_at_32_bytes() {
        let b64 = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        assert!(SecretsKey::parse(HEX).is_ok());
        assert!(SecretsKey::parse(&HEX.to_uppercase()).is_ok());
        assert!(SecretsKey::parse(&b64).is_ok());
        assert!(SecretsKey::parse(b64.trim_end_matches('=')).is_ok());
        assert!(SecretsKey::parse(&HEX[..62]).is_err());
        let short = base64::engine::general_purpose::STANDARD.encode([7u8; 16]);
        assert!(SecretsKey::parse(&short).is_err());
        assert!(SecretsKey::parse("not a key at all").is_err());
        assert_eq!(
            format!("{:?}", SecretsKey::parse(HEX).unwrap()),
            "SecretsKey(redacted)"
        );
    }

    /// The derivation is pinned (HMAC-SHA256 of the label): a later build must derive the
    /// same key, or URLs signed by the replicas of a rolling update would be refused.
    #[test]
    fn derived_keys_are_stable_and_apart_by_label() {
        let key = SecretsKey::parse(HEX).unwrap();
        let a = key.derive("file-urls");
        assert_eq!(a, SecretsKey::parse(HEX).unwrap().derive("file-urls"));
        assert_ne!(a, key.derive("something-else"));
        assert_ne!(
            a,
            SecretsKey::parse(&HEX.replace('0', "1"))
                .unwrap()
                .derive("file-urls")
        );
        let tag = aws_lc_rs::hmac::sign(
            &aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &hex_decode(HEX).unwrap()),
            b"file-urls",
        );
        assert_eq!(a.as_slice(), tag.as_ref());
    }

    #[test]
    fn sealing_binds_the_owner_and_uses_a_fresh_nonce() {
        let key = SecretsKey::parse(HEX).unwrap();
        let (team, agent) = (TeamId::new(), AgentId::new());
        let aad = |team, agent, name| associated_data(team, agent, name);
        let own = aad(team, Some(agent), "TOKEN");
        let (n1, c1) = key.seal(&own, b"hunter2").unwrap();
        let (n2, c2) = key.seal(&own, b"hunter2").unwrap();
        assert_eq!(n1.len(), 12);
        assert_ne!(n1, n2);
        assert_ne!(c1, c2);
        assert_eq!(key.open(&own, &n1, &c1).unwrap(), b"hunter2");
        assert!(
            key.open(&aad(team, Some(agent), "OTHER"), &n1, &c1)
                .is_err()
        );
        assert!(
            key.open(&aad(team, Some(AgentId::new()), "TOKEN"), &n1, &c1)
                .is_err()
        );
        assert!(
            key.open(&aad(TeamId::new(), Some(agent), "TOKEN"), &n1, &c1)
                .is_err()
        );
        // A team secret of the same name is another owner.
        assert!(key.open(&aad(team, None, "TOKEN"), &n1, &c1).is_err());
        let other = SecretsKey::parse(&"ab".repeat(32)).unwrap();
        assert!(other.open(&own, &n1, &c1).is_err());
    }
}
