//! Teams and their API keys.

use protocol::TeamId;
use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{Store, StoreError};

/// A new team and the only copy of its first API key.
#[derive(Debug, serde::Serialize)]
pub struct CreatedTeam {
    pub team_id: TeamId,
    pub api_key: String,
}

const KEY_PREFIX: &str = "ar_";

/// The stored form of a key. Keys carry 256 random bits, so SHA-256 leaves nothing to
/// brute-force and lets the lookup be one indexed equality.
pub(crate) fn key_hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn new_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let mut key = String::with_capacity(KEY_PREFIX.len() + 64);
    key.push_str(KEY_PREFIX);
    for b in bytes {
        key.push_str(&format!("{b:02x}"));
    }
    key
}

impl Store {
    pub async fn create_team(&self, name: &str) -> Result<CreatedTeam, StoreError> {
        let team_id = TeamId::new();
        let api_key = new_key();
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO teams (id, name) VALUES ($1, $2)")
            .bind(team_id.0)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO api_keys (id, team_id, key_hash, prefix) VALUES ($1, $2, $3, $4)")
            .bind(Uuid::now_v7())
            .bind(team_id.0)
            .bind(&key_hash(&api_key)[..])
            .bind(&api_key[..KEY_PREFIX.len() + 6])
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(CreatedTeam { team_id, api_key })
    }

    /// The team an API key belongs to, if the key is known and not revoked.
    pub async fn team_for_key(&self, key: &str) -> Result<Option<TeamId>, StoreError> {
        let row: Option<(Uuid,)> = sqlx::query_as(
            "SELECT team_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL",
        )
        .bind(&key_hash(key)[..])
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(id,)| TeamId(id)))
    }
}
