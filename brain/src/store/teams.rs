//! Teams and their API keys.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// How long a replica trusts a key it has looked up. A key revoked in the database stops
/// working on every replica within this time; in exchange, a warm key's request costs no
/// round trip to authenticate (every turn starts with one).
const KEY_CACHE_TTL: Duration = Duration::from_secs(5);
/// Bounds the cache's memory; when full it starts over.
const KEY_CACHE_MAX: usize = 10_000;

/// Key hash → (team, when looked up). Only known keys are kept: an unknown key always asks
/// the database, so a key created on another replica works at once.
#[derive(Default)]
pub(super) struct KeyCache(Mutex<HashMap<[u8; 32], (TeamId, Instant)>>);

impl std::fmt::Debug for KeyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entries = self.0.lock().map(|c| c.len()).unwrap_or(0);
        f.debug_struct("KeyCache")
            .field("entries", &entries)
            .finish()
    }
}

impl KeyCache {
    fn get(&self, hash: &[u8; 32]) -> Option<TeamId> {
        let cache = self.0.lock().ok()?;
        let (team, at) = cache.get(hash)?;
        (at.elapsed() < KEY_CACHE_TTL).then_some(*team)
    }

    fn put(&self, hash: [u8; 32], team: TeamId) {
        if let Ok(mut cache) = self.0.lock() {
            if cache.len() >= KEY_CACHE_MAX {
                cache.clear();
            }
            cache.insert(hash, (team, Instant::now()));
        }
    }
}

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

    /// The team an API key belongs to, if the key is known and not revoked (as of at most
    /// [`KEY_CACHE_TTL`] ago).
    pub async fn team_for_key(&self, key: &str) -> Result<Option<TeamId>, StoreError> {
        let hash = key_hash(key);
        if let Some(team) = self.keys.get(&hash) {
            return Ok(Some(team));
        }
        let row: Option<(Uuid,)> = sqlx::query_as(
            "SELECT team_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL",
        )
        .bind(&hash[..])
        .fetch_optional(&self.pool)
        .await?;
        let team = row.map(|(id,)| TeamId(id));
        if let Some(team) = team {
            self.keys.put(hash, team);
        }
        Ok(team)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_looked_up_key_is_trusted_for_its_ttl_only() {
        let cache = KeyCache::default();
        let (hash, team) = (key_hash("ar_one"), TeamId::new());
        assert_eq!(cache.get(&hash), None);
        cache.put(hash, team);
        assert_eq!(cache.get(&hash), Some(team));
        assert_eq!(cache.get(&key_hash("ar_two")), None);
        // Looked up a TTL ago: the database is asked again.
        let stale = Instant::now()
            .checked_sub(KEY_CACHE_TTL)
            .expect("the clock is past the TTL");
        cache.0.lock().unwrap().insert(hash, (team, stale));
        assert_eq!(cache.get(&hash), None);
    }

    #[test]
    fn a_full_cache_starts_over() {
        let cache = KeyCache::default();
        for n in 0..KEY_CACHE_MAX {
            cache.put(key_hash(&format!("ar_{n}")), TeamId::new());
        }
        let last = key_hash("ar_last");
        cache.put(last, TeamId::new());
        assert_eq!(cache.0.lock().unwrap().len(), 1);
        assert!(cache.get(&last).is_some());
    }
}
