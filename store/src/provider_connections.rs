//! A team's model provider connections (T14): `provider_connections`. The API key is
//! sealed under the secrets key, bound to (team, connection id), and never read back
//! except by [`Store::provider_connections_with_keys`] and
//! [`Store::provider_connection_with_key`], for the resolver that calls the provider.
//! Every write records its audit entry in the same transaction (L5).

use chrono::{DateTime, Utc};
use protocol::TeamId;
use sqlx::Row;
use uuid::Uuid;

use super::audit::{self, Action, Actor};
use super::secrets::SecretsError;
use super::{Keyset, Store, StoreError, keyset_after};

/// Connections per team: a handful of endpoints, not a registry.
pub const MAX_PROVIDER_CONNECTIONS: i64 = 50;

/// A connection as the API shows it: no key, only its hint.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderConnectionRow {
    pub id: Uuid,
    pub name: String,
    /// The wire kind's API name (`openai`, `anthropic`...).
    pub kind: String,
    pub base_url: String,
    /// The key's last characters (at most four); `None` when it has no key.
    pub key_hint: Option<String>,
    /// Declared models: catalog entries, as the engine wrote them.
    pub models: serde_json::Value,
    pub last_error: Option<LastError>,
    pub last_check_at: Option<DateTime<Utc>>,
    pub last_check_latency_ms: Option<u32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The latest failure of a call through a connection: never provider text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastError {
    pub class: String,
    pub description: String,
    pub at: DateTime<Utc>,
}

/// A new connection; `api_key` is sealed before it is written.
#[derive(Debug)]
pub struct NewProviderConnection {
    pub name: String,
    pub kind: String,
    pub base_url: String,
    pub api_key: Option<String>,
    pub models: serde_json::Value,
}

/// A change to a connection: an absent field is left as it is; `api_key: Some(None)`
/// removes the key.
#[derive(Debug, Default)]
pub struct ProviderConnectionChange {
    pub name: Option<String>,
    pub base_url: Option<String>,
    pub api_key: Option<Option<String>>,
    pub models: Option<serde_json::Value>,
}

impl ProviderConnectionChange {
    /// The names of the fields the change gives, for the audit log: never their values.
    fn named_fields(&self) -> Vec<&'static str> {
        [
            ("name", self.name.is_some()),
            ("base_url", self.base_url.is_some()),
            ("api_key", self.api_key.is_some()),
            ("models", self.models.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }
}

/// A connection with its key decrypted, for the code that calls the provider. `Debug`
/// never shows the key.
#[derive(Clone)]
pub struct ConnectionKeyed {
    pub id: Uuid,
    pub name: String,
    pub kind: String,
    pub base_url: String,
    /// `Ok(None)`: no key. `Err`: the stored key does not decrypt under this server's key
    /// (another key, a tampered row) or no secrets key is configured; the error's class.
    pub api_key: Result<Option<String>, &'static str>,
    pub updated_at: DateTime<Utc>,
}

impl std::fmt::Debug for ConnectionKeyed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionKeyed")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

const COLUMNS: &str = "id, name, kind, base_url, key_hint, models, last_error_class, \
    last_error, last_error_at, last_check_at, last_check_latency_ms, created_at, updated_at";

const KEYED_COLUMNS: &str = "id, name, kind, base_url, key_nonce, key_ciphertext, updated_at";

fn from_row(row: &sqlx::postgres::PgRow) -> Result<ProviderConnectionRow, StoreError> {
    let class: Option<String> = row.try_get("last_error_class")?;
    let description: Option<String> = row.try_get("last_error")?;
    let at: Option<DateTime<Utc>> = row.try_get("last_error_at")?;
    Ok(ProviderConnectionRow {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        kind: row.try_get("kind")?,
        base_url: row.try_get("base_url")?,
        key_hint: row.try_get("key_hint")?,
        models: row
            .try_get::<sqlx::types::Json<serde_json::Value>, _>("models")?
            .0,
        last_error: match (class, description, at) {
            (Some(class), Some(description), Some(at)) => Some(LastError {
                class,
                description,
                at,
            }),
            _ => None,
        },
        last_check_at: row.try_get("last_check_at")?,
        last_check_latency_ms: row
            .try_get::<Option<i32>, _>("last_check_latency_ms")?
            .map(|ms| u32::try_from(ms).unwrap_or(0)),
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// team id (16 bytes) ‖ connection id (16 bytes) ‖ a fixed label: a sealed key copied to
/// another row or team no longer opens.
fn associated_data(team: TeamId, id: Uuid) -> Vec<u8> {
    let mut aad = Vec::with_capacity(48);
    aad.extend_from_slice(team.0.as_bytes());
    aad.extend_from_slice(id.as_bytes());
    aad.extend_from_slice(b"provider_key");
    aad
}

/// The last four characters of a key, at most (none for a key of four or fewer, which
/// would be the whole key).
fn hint(key: &str) -> Option<String> {
    let chars: Vec<char> = key.chars().collect();
    (chars.len() > 4).then(|| chars[chars.len() - 4..].iter().collect())
}

/// A name taken in the team → `Conflict("provider_name")`.
fn write_error(err: sqlx::Error) -> StoreError {
    super::unique_violation(err, "provider_connections_team_name", "provider_name")
}

type Sealed = (Option<Vec<u8>>, Option<Vec<u8>>, Option<String>);

impl Store {
    /// Seals `key` for connection `id` of `team`: (nonce, ciphertext, hint); all `None`
    /// without a key. A key without a configured secrets key is `NotConfigured`.
    fn seal_provider_key(
        &self,
        team: TeamId,
        id: Uuid,
        key: Option<&str>,
    ) -> Result<Sealed, SecretsError> {
        let Some(key) = key else {
            return Ok((None, None, None));
        };
        let secrets = self.secrets_key()?;
        let (nonce, ciphertext) = secrets.seal(&associated_data(team, id), key.as_bytes())?;
        Ok((Some(nonce), Some(ciphertext), hint(key)))
    }

    /// Adds a connection to `team`. `Conflict("provider_name")` for a name taken,
    /// `Conflict("provider_limit")` past [`MAX_PROVIDER_CONNECTIONS`], `NotConfigured` for
    /// a key on a server without a secrets key.
    pub async fn create_provider_connection(
        &self,
        team: TeamId,
        new: &NewProviderConnection,
        by: &Actor,
    ) -> Result<ProviderConnectionRow, SecretsError> {
        let id = Uuid::now_v7();
        let (nonce, ciphertext, key_hint) =
            self.seal_provider_key(team, id, new.api_key.as_deref())?;
        // The count is a soft cap: two concurrent creates may both pass it by one.
        let sql = format!(
            "INSERT INTO provider_connections \
               (id, team_id, name, kind, base_url, key_nonce, key_ciphertext, key_hint, models) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9 \
             WHERE (SELECT count(*) FROM provider_connections WHERE team_id = $2) < $10 \
             RETURNING {COLUMNS}"
        );
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(team.0)
            .bind(&new.name)
            .bind(&new.kind)
            .bind(&new.base_url)
            .bind(nonce)
            .bind(ciphertext)
            .bind(key_hint)
            .bind(sqlx::types::Json(&new.models))
            .bind(MAX_PROVIDER_CONNECTIONS)
            .fetch_optional(&mut *tx)
            .await
            .map_err(write_error)?
            .ok_or(StoreError::Conflict("provider_limit"))?;
        let made = from_row(&row)?;
        let details = serde_json::json!({"name": made.name, "kind": made.kind});
        audit::record(&mut tx, team, by, Action::ProviderCreated, id, details).await?;
        tx.commit().await?;
        Ok(made)
    }

    /// One connection of the team; `NotFound` for an unknown or other team's id.
    pub async fn provider_connection(
        &self,
        team: TeamId,
        id: Uuid,
    ) -> Result<ProviderConnectionRow, StoreError> {
        let sql =
            format!("SELECT {COLUMNS} FROM provider_connections WHERE team_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        from_row(&row)
    }

    /// A page of the team's connections, oldest first: at most `limit` after `after`.
    pub async fn provider_connections(
        &self,
        team: TeamId,
        after: Option<Keyset>,
        limit: i64,
    ) -> Result<Vec<ProviderConnectionRow>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM provider_connections WHERE team_id = $1 AND {} \
             ORDER BY created_at, id LIMIT $2",
            keyset_after(">", "$3", "$4")
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(limit)
            .bind(after.map(|k| k.at))
            .bind(after.map(|k| k.id))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(from_row).collect()
    }

    /// Applies `change`; a change of anything a call uses moves `updated_at`, which
    /// replaces the replicas' adapters of it. Errors as [`Store::create_provider_connection`].
    pub async fn update_provider_connection(
        &self,
        team: TeamId,
        id: Uuid,
        change: &ProviderConnectionChange,
        by: &Actor,
    ) -> Result<ProviderConnectionRow, SecretsError> {
        let new_key = change.api_key.as_ref().map(Option::as_deref);
        let (nonce, ciphertext, key_hint) = self.seal_provider_key(team, id, new_key.flatten())?;
        let sql = format!(
            "UPDATE provider_connections SET name = coalesce($3, name), \
               base_url = coalesce($4, base_url), models = coalesce($5, models), \
               key_nonce = CASE WHEN $6 THEN $7 ELSE key_nonce END, \
               key_ciphertext = CASE WHEN $6 THEN $8 ELSE key_ciphertext END, \
               key_hint = CASE WHEN $6 THEN $9 ELSE key_hint END, \
               updated_at = clock_timestamp() \
             WHERE team_id = $1 AND id = $2 RETURNING {COLUMNS}"
        );
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(id)
            .bind(change.name.as_deref())
            .bind(change.base_url.as_deref())
            .bind(change.models.as_ref().map(sqlx::types::Json))
            .bind(new_key.is_some())
            .bind(nonce)
            .bind(ciphertext)
            .bind(key_hint)
            .fetch_optional(&mut *tx)
            .await
            .map_err(write_error)?
            .ok_or(StoreError::NotFound)?;
        let updated = from_row(&row)?;
        let details = serde_json::json!({"name": updated.name, "changed": change.named_fields()});
        audit::record(&mut tx, team, by, Action::ProviderUpdated, id, details).await?;
        tx.commit().await?;
        Ok(updated)
    }

    /// Deletes a connection no agent of the team names (as its model or a fallback):
    /// `Conflict("provider_in_use")` while one does (its archived agents aside, which
    /// never run). Answers the deleted connection's name.
    pub async fn delete_provider_connection(
        &self,
        team: TeamId,
        id: Uuid,
        by: &Actor,
    ) -> Result<String, StoreError> {
        let mut tx = self.pool.begin().await?;
        let name: String = sqlx::query_scalar(
            "SELECT name FROM provider_connections WHERE team_id = $1 AND id = $2 FOR UPDATE",
        )
        .bind(team.0)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let naming: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM agents WHERE team_id = $1 AND archived_at IS NULL \
               AND (split_part(model, '/', 1) = $2 \
                    OR EXISTS (SELECT 1 FROM unnest(fallback_models) f \
                               WHERE split_part(f, '/', 1) = $2))",
        )
        .bind(team.0)
        .bind(&name)
        .fetch_one(&mut *tx)
        .await?;
        if naming > 0 {
            return Err(StoreError::Conflict("provider_in_use"));
        }
        sqlx::query("DELETE FROM provider_connections WHERE team_id = $1 AND id = $2")
            .bind(team.0)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let details = serde_json::json!({"name": name});
        audit::record(&mut tx, team, by, Action::ProviderDeleted, id, details).await?;
        tx.commit().await?;
        Ok(name)
    }

    /// Which of `names` are connections of the team.
    pub async fn provider_connection_names(
        &self,
        team: TeamId,
        names: &[String],
    ) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT name FROM provider_connections WHERE team_id = $1 AND name = ANY($2)",
        )
        .bind(team.0)
        .bind(names)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Every connection of the team with its key decrypted.
    ///
    /// **Who may call this:** only the code that builds a provider adapter; no response,
    /// log line, error or stream chunk may carry the key (X4).
    pub async fn provider_connections_with_keys(
        &self,
        team: TeamId,
    ) -> Result<Vec<ConnectionKeyed>, StoreError> {
        let sql = format!("SELECT {KEYED_COLUMNS} FROM provider_connections WHERE team_id = $1");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|row| self.keyed(team, row)).collect()
    }

    /// One connection with its key decrypted; as [`Store::provider_connections_with_keys`].
    pub async fn provider_connection_with_key(
        &self,
        team: TeamId,
        id: Uuid,
    ) -> Result<ConnectionKeyed, StoreError> {
        let sql = format!(
            "SELECT {KEYED_COLUMNS} FROM provider_connections WHERE team_id = $1 AND id = $2"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        self.keyed(team, &row)
    }

    fn keyed(
        &self,
        team: TeamId,
        row: &sqlx::postgres::PgRow,
    ) -> Result<ConnectionKeyed, StoreError> {
        let id: Uuid = row.try_get("id")?;
        let nonce: Option<Vec<u8>> = row.try_get("key_nonce")?;
        let ciphertext: Option<Vec<u8>> = row.try_get("key_ciphertext")?;
        let api_key = match (nonce, ciphertext) {
            (Some(nonce), Some(ciphertext)) => self
                .secrets_key()
                .and_then(|key| {
                    let plain = key.open(&associated_data(team, id), &nonce, &ciphertext)?;
                    String::from_utf8(plain)
                        .map(Some)
                        .map_err(|_| SecretsError::Crypto)
                })
                .map_err(|e| e.metric_label()),
            _ => Ok(None),
        };
        Ok(ConnectionKeyed {
            id,
            name: row.try_get("name")?,
            kind: row.try_get("kind")?,
            base_url: row.try_get("base_url")?,
            api_key,
            updated_at: row.try_get("updated_at")?,
        })
    }

    /// Records a failure of a call through the connection: a class and a description
    /// that hold no provider text. `updated_at` stays, so no replica rebuilds its adapter.
    pub async fn record_provider_error(
        &self,
        team: TeamId,
        id: Uuid,
        class: &str,
        description: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE provider_connections SET last_error_class = $3, last_error = $4, \
               last_error_at = now() WHERE team_id = $1 AND id = $2",
        )
        .bind(team.0)
        .bind(id)
        .bind(class)
        .bind(description)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records a check that answered after `latency_ms`.
    pub async fn record_provider_check(
        &self,
        team: TeamId,
        id: Uuid,
        latency_ms: u32,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE provider_connections SET last_check_at = now(), \
               last_check_latency_ms = $3 WHERE team_id = $1 AND id = $2",
        )
        .bind(team.0)
        .bind(id)
        .bind(i32::try_from(latency_ms).unwrap_or(i32::MAX))
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::hint;

    #[test]
    fn a_hint_is_the_last_four_characters_of_a_longer_key() {
        assert_eq!(hint("sk-abcdef1234").as_deref(), Some("1234"));
        assert_eq!(hint("abcd"), None);
        assert_eq!(hint("ключ-ЖЗИЙ").as_deref(), Some("ЖЗИЙ"));
    }
}
