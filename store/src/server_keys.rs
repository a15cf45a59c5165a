//! Keys the brain's replicas share that no operator sets (T26): written once, at random,
//! by the first replica that needs one; every replica then reads the same bytes.

use super::{Store, StoreError};

impl Store {
    /// The key named `name`: the stored one, or `fresh` if there was none (stored now). Two
    /// replicas asking at once both get the one that was stored first.
    pub async fn server_key(&self, name: &str, fresh: &[u8; 32]) -> Result<Vec<u8>, StoreError> {
        // Two statements: a statement that found the row taken by a concurrent insert does
        // not see that row in its own snapshot, the next one does.
        sqlx::query(
            "INSERT INTO server_keys (name, key) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(fresh.as_slice())
        .execute(&self.pool)
        .await?;
        Ok(
            sqlx::query_scalar("SELECT key FROM server_keys WHERE name = $1")
                .bind(name)
                .fetch_one(&self.pool)
                .await?,
        )
    }
}
