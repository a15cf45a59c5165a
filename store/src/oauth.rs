//! OAuth grants and pending flows of connectors (SPEC B2), sealed under the secrets key.
//!
//! A grant (tokens, expiry, client registration, endpoints) belongs to a connector, or to
//! one JWT user of it; a pending flow (PKCE verifier, state, client) to the connector and
//! user that began it. Both are serialized to JSON and sealed with [`SecretsKey`] under
//! associated data naming what the row belongs to (and, for a flow, its state hash), so
//! a row copied to another connector, user or team does not decrypt. The store never sees
//! a `state`: a flow is keyed by its SHA-256, and taken once (`DELETE … RETURNING`), so a
//! replayed callback finds nothing. Nor does it see a flow's browser nonce: a flow is
//! bound to the browser of who began it by the nonce's SHA-256 (`browser_hash`), and only
//! a callback that brings the nonce takes it.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use protocol::TeamId;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use sqlx::Row;
use uuid::Uuid;

use super::audit::{self, Action, Actor};
use super::{SecretsError, SecretsKey, Store, StoreError};

/// Whose grant or flow: a connector's (no user) or one user's of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantOwner {
    pub team: TeamId,
    pub connector: Uuid,
    /// The JWT user; `None` for the connector's own grant.
    pub user: Option<String>,
}

/// A flow taken from the store by its state.
#[derive(Debug)]
pub enum TakenFlow<T> {
    /// Live: the caller finishes it (it is gone from the store either way). The actor is
    /// who began it, without an address.
    Live(GrantOwner, T, Actor),
    /// It existed but its time was up; it is gone now too.
    Expired,
    /// It is live but bound to another browser (or to none yet): it stays, untouched, for
    /// the browser of who began it.
    Elsewhere,
}

/// What `Store::connector_authorizations` tells about one connector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuthorizationCounts {
    /// The connector's own grant exists.
    pub connector_grant: bool,
    /// Per-user grants.
    pub user_grants: i64,
    /// Flows begun and not yet finished (expired ones included until cleaned).
    pub pending_flows: i64,
}

/// A failure of [`Store::with_locked_grant`]: the store's, or the caller's step.
#[derive(Debug)]
pub enum LockedError<E> {
    Store(SecretsError),
    Step(E),
}

impl<E> From<SecretsError> for LockedError<E> {
    fn from(e: SecretsError) -> Self {
        Self::Store(e)
    }
}

impl<E> From<sqlx::Error> for LockedError<E> {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// How long a refresh waits for another replica's lock on the same grant.
const LOCK_TIMEOUT: &str = "5s";

const GRANT_TAG: u8 = b'g';
const FLOW_TAG: u8 = b'f';

/// tag ‖ team (16) ‖ connector (16) ‖ extra (fixed width) ‖ 0 (no user) or 1 ‖ user: the
/// variable part comes last, so the encoding is unambiguous.
fn associated_data(tag: u8, owner: &GrantOwner, extra: &[u8]) -> Vec<u8> {
    let user = owner.user.as_deref().unwrap_or("");
    let mut aad = Vec::with_capacity(34 + extra.len() + user.len());
    aad.push(tag);
    aad.extend_from_slice(owner.team.0.as_bytes());
    aad.extend_from_slice(owner.connector.as_bytes());
    aad.extend_from_slice(extra);
    match &owner.user {
        None => aad.push(0),
        Some(user) => {
            aad.push(1);
            aad.extend_from_slice(user.as_bytes());
        }
    }
    aad
}

/// The key a flow is stored under: the state never is.
pub fn state_hash(state: &str) -> [u8; 32] {
    Sha256::digest(state.as_bytes()).into()
}

fn seal<T: Serialize>(
    key: &SecretsKey,
    aad: &[u8],
    value: &T,
) -> Result<(Vec<u8>, Vec<u8>), SecretsError> {
    // Serializing our own types cannot fail; a failure is treated like one of the cipher.
    let plain = serde_json::to_vec(value).map_err(|_| SecretsError::Crypto)?;
    key.seal(aad, &plain)
}

fn open<T: DeserializeOwned>(
    key: &SecretsKey,
    aad: &[u8],
    nonce: &[u8],
    ciphertext: &[u8],
) -> Result<T, SecretsError> {
    let plain = key.open(aad, nonce, ciphertext)?;
    serde_json::from_slice(&plain).map_err(|_| SecretsError::Crypto)
}

fn owner_from_row(row: &sqlx::postgres::PgRow) -> Result<GrantOwner, sqlx::Error> {
    Ok(GrantOwner {
        team: TeamId(row.try_get("team_id")?),
        connector: row.try_get("connector_id")?,
        user: row.try_get("user_id")?,
    })
}

impl Store {
    /// Stores a pending flow under the hash of its `state` for `bounds.0`, bound to the
    /// browser whose nonce hashes to `browser` (or to none yet: [`Store::bind_flow`] binds
    /// it). At most `bounds.1` unexpired flows per connector
    /// (`Conflict("too_many_flows")`), of which `bounds.2` begun by `by`
    /// (`Conflict("too_many_flows_of_principal")`), so one
    /// principal cannot take every place; the connector's expired flows are cleaned on the
    /// way. A connector not of the team → `NotFound`. `by` began it: the grant its callback
    /// binds is logged as theirs (L5).
    pub async fn put_flow<T: Serialize>(
        &self,
        owner: &GrantOwner,
        state: &str,
        flow: &T,
        bounds: (Duration, i64, i64),
        by: &Actor,
        browser: Option<&[u8; 32]>,
    ) -> Result<DateTime<Utc>, SecretsError> {
        let (ttl, per_connector, per_principal) = bounds;
        let key = self.secrets_key()?;
        let hash = state_hash(state);
        let (nonce, ciphertext) = seal(key, &associated_data(FLOW_TAG, owner, &hash), flow)?;
        let ttl = chrono::Duration::from_std(ttl).map_err(|_| SecretsError::Crypto)?;
        let expires_at = Utc::now() + ttl;
        let (connectors, live, theirs, written): (i64, i64, i64, i64) = sqlx::query_as(
            "WITH gone AS (DELETE FROM oauth_flows WHERE connector_id = $3 AND expires_at < now()), \
             c AS (SELECT team_id, id FROM connectors WHERE team_id = $2 AND id = $3), \
             live AS (SELECT count(*) AS n, \
                        count(*) FILTER (WHERE actor_kind = $9 AND actor = $10) AS theirs \
                      FROM oauth_flows WHERE connector_id = $3 AND expires_at >= now()), \
             w AS ( \
               INSERT INTO oauth_flows (state_hash, team_id, connector_id, user_id, nonce, \
                 ciphertext, expires_at, actor_kind, actor, browser_hash) \
               SELECT $1, c.team_id, c.id, $4, $5, $6, $7, $9, $10, $11 FROM c, live \
               WHERE live.n < $8 AND live.theirs < $12 \
               RETURNING 1) \
             SELECT (SELECT count(*) FROM c), live.n, live.theirs, (SELECT count(*) FROM w) \
             FROM live",
        )
        .bind(&hash[..])
        .bind(owner.team.0)
        .bind(owner.connector)
        .bind(owner.user.as_deref())
        .bind(&nonce)
        .bind(&ciphertext)
        .bind(expires_at)
        .bind(per_connector)
        .bind(by.kind.as_str())
        .bind(&by.id)
        .bind(browser.map(|b| &b[..]))
        .bind(per_principal)
        .fetch_one(&self.pool)
        .await?;
        match (connectors, written) {
            (_, 1) => Ok(expires_at),
            (0, _) => Err(StoreError::NotFound.into()),
            _ if theirs >= per_principal && live < per_connector => {
                Err(StoreError::Conflict("too_many_flows_of_principal").into())
            }
            _ => Err(StoreError::Conflict("too_many_flows").into()),
        }
    }

    /// Binds the live flow whose state hashes to `hash`, of `team`, to the browser whose
    /// nonce hashes to `browser`, for `by` only: the principal that began it (a link a
    /// turn handed out is useless to anyone else). The flow, and when it expires;
    /// `NotFound` for another's flow, an expired one or none.
    pub async fn bind_flow<T: DeserializeOwned>(
        &self,
        team: TeamId,
        hash: &[u8],
        by: &Actor,
        browser: &[u8; 32],
    ) -> Result<(T, DateTime<Utc>), SecretsError> {
        let key = self.secrets_key()?;
        let row = sqlx::query(
            "UPDATE oauth_flows SET browser_hash = $5 \
             WHERE state_hash = $1 AND team_id = $2 AND actor_kind = $3 AND actor = $4 \
               AND expires_at > now() \
             RETURNING team_id, connector_id, user_id, nonce, ciphertext, expires_at",
        )
        .bind(hash)
        .bind(team.0)
        .bind(by.kind.as_str())
        .bind(&by.id)
        .bind(&browser[..])
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        let owner = owner_from_row(&row)?;
        let nonce: Vec<u8> = row.try_get("nonce")?;
        let ciphertext: Vec<u8> = row.try_get("ciphertext")?;
        let flow = open(
            key,
            &associated_data(FLOW_TAG, &owner, hash),
            &nonce,
            &ciphertext,
        )?;
        Ok((flow, row.try_get("expires_at")?))
    }

    /// Takes the flow of `state` out of the store, if `browser` is the hash of the nonce
    /// of the browser it is bound to: whoever takes it first gets it, every later call
    /// `NotFound`, like a state never issued. Another browser's call (or one without a
    /// nonce) leaves it where it is: `Elsewhere`.
    pub async fn take_flow<T: DeserializeOwned>(
        &self,
        state: &str,
        browser: Option<&[u8; 32]>,
    ) -> Result<TakenFlow<T>, SecretsError> {
        let key = self.secrets_key()?;
        let hash = state_hash(state);
        let taken = sqlx::query(
            "DELETE FROM oauth_flows WHERE state_hash = $1 \
               AND (browser_hash = $2 OR expires_at <= now()) \
             RETURNING team_id, connector_id, user_id, nonce, ciphertext, actor_kind, actor, \
               expires_at > now() AS live",
        )
        .bind(&hash[..])
        .bind(browser.map(|b| &b[..]))
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = taken else {
            let exists: Option<i32> =
                sqlx::query_scalar("SELECT 1 FROM oauth_flows WHERE state_hash = $1")
                    .bind(&hash[..])
                    .fetch_optional(&self.pool)
                    .await?;
            return match exists {
                Some(_) => Ok(TakenFlow::Elsewhere),
                None => Err(StoreError::NotFound.into()),
            };
        };
        if !row.try_get::<bool, _>("live")? {
            return Ok(TakenFlow::Expired);
        }
        let owner = owner_from_row(&row)?;
        let began_by = Actor::stored(
            row.try_get::<Option<String>, _>("actor_kind")?.as_deref(),
            row.try_get("actor")?,
        );
        let nonce: Vec<u8> = row.try_get("nonce")?;
        let ciphertext: Vec<u8> = row.try_get("ciphertext")?;
        let flow = open(
            key,
            &associated_data(FLOW_TAG, &owner, &hash),
            &nonce,
            &ciphertext,
        )?;
        Ok(TakenFlow::Live(owner, flow, began_by))
    }

    /// The pending flows of `owner` that `by` began with more than `left` to live, with
    /// their state's hash, the newest first (at most a few: the newest five).
    pub async fn live_flows<T: DeserializeOwned>(
        &self,
        owner: &GrantOwner,
        by: &Actor,
        left: Duration,
    ) -> Result<Vec<(Vec<u8>, T)>, SecretsError> {
        let key = self.secrets_key()?;
        let left = chrono::Duration::from_std(left).map_err(|_| SecretsError::Crypto)?;
        let rows: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = sqlx::query_as(
            "SELECT state_hash, nonce, ciphertext FROM oauth_flows \
             WHERE team_id = $1 AND connector_id = $2 AND user_id IS NOT DISTINCT FROM $3 \
               AND expires_at > $4 AND actor_kind = $5 AND actor = $6 \
             ORDER BY expires_at DESC LIMIT 5",
        )
        .bind(owner.team.0)
        .bind(owner.connector)
        .bind(owner.user.as_deref())
        .bind(Utc::now() + left)
        .bind(by.kind.as_str())
        .bind(&by.id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|(hash, nonce, ciphertext)| {
                let aad = associated_data(FLOW_TAG, owner, hash);
                Ok((hash.clone(), open(key, &aad, nonce, ciphertext)?))
            })
            .collect()
    }

    /// Stores the grant of `owner`. `replaces` says which existing grant it may replace:
    /// `None` any, `Some(Some(v))` only the one at version `v`, `Some(None)` none. `false`
    /// when an existing grant was kept. A connector that is gone (or another team's) →
    /// `NotFound`. A grant written is logged `grant.bound` by `by` in the same
    /// transaction (L5).
    pub async fn put_grant<T: Serialize>(
        &self,
        owner: &GrantOwner,
        grant: &T,
        replaces: Option<Option<i64>>,
        by: &Actor,
    ) -> Result<bool, SecretsError> {
        let key = self.secrets_key()?;
        let (nonce, ciphertext) = seal(key, &associated_data(GRANT_TAG, owner, &[]), grant)?;
        let mut tx = self.pool.begin().await?;
        let (connectors, written): (i64, i64) = sqlx::query_as(
            "WITH c AS (SELECT team_id, id FROM connectors WHERE team_id = $2 AND id = $3), \
             w AS ( \
               INSERT INTO connector_grants (id, team_id, connector_id, user_id, nonce, ciphertext) \
               SELECT $1, c.team_id, c.id, $4, $5, $6 FROM c \
               ON CONFLICT ON CONSTRAINT connector_grants_owner DO UPDATE \
                 SET nonce = EXCLUDED.nonce, ciphertext = EXCLUDED.ciphertext, \
                     version = connector_grants.version + 1, updated_at = now() \
                 WHERE NOT $7 OR connector_grants.version = $8 \
               RETURNING 1) \
             SELECT (SELECT count(*) FROM c), (SELECT count(*) FROM w)",
        )
        .bind(Uuid::now_v7())
        .bind(owner.team.0)
        .bind(owner.connector)
        .bind(owner.user.as_deref())
        .bind(&nonce)
        .bind(&ciphertext)
        .bind(replaces.is_some())
        .bind(replaces.flatten())
        .fetch_one(&mut *tx)
        .await?;
        if connectors == 0 {
            return Err(StoreError::NotFound.into());
        }
        if written == 0 {
            return Ok(false);
        }
        let details = serde_json::json!({ "user": owner.user });
        audit::record(
            &mut tx,
            owner.team,
            by,
            Action::GrantBound,
            owner.connector,
            details,
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The version of `owner`'s own grant, if it has one.
    pub async fn grant_version(&self, owner: &GrantOwner) -> Result<Option<i64>, SecretsError> {
        Ok(sqlx::query_scalar(
            "SELECT version FROM connector_grants \
             WHERE team_id = $1 AND connector_id = $2 AND user_id IS NOT DISTINCT FROM $3",
        )
        .bind(owner.team.0)
        .bind(owner.connector)
        .bind(owner.user.as_deref())
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The grant a turn uses for `connector`: `user`'s own first, else the connector's,
    /// with its version. `None`: neither exists.
    pub async fn grant_for<T: DeserializeOwned>(
        &self,
        team: TeamId,
        connector: Uuid,
        user: Option<&str>,
    ) -> Result<Option<(GrantOwner, T, i64)>, SecretsError> {
        let key = self.secrets_key()?;
        let row = sqlx::query(
            "SELECT team_id, connector_id, user_id, nonce, ciphertext, version FROM connector_grants \
             WHERE team_id = $1 AND connector_id = $2 AND (user_id IS NULL OR user_id = $3) \
             ORDER BY user_id IS NULL LIMIT 1",
        )
        .bind(team.0)
        .bind(connector)
        .bind(user)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let owner = owner_from_row(&row)?;
        let nonce: Vec<u8> = row.try_get("nonce")?;
        let ciphertext: Vec<u8> = row.try_get("ciphertext")?;
        let version: i64 = row.try_get("version")?;
        let grant = open(
            key,
            &associated_data(GRANT_TAG, &owner, &[]),
            &nonce,
            &ciphertext,
        )?;
        Ok(Some((owner, grant, version)))
    }

    /// Runs `step` on the grant of `owner` and its version while holding its row locked
    /// (`SELECT … FOR UPDATE`, waiting at most 5 s for another holder): `step` sees the
    /// newest grant, and the grant it returns (`Some`) is written, as the next version,
    /// before the lock is released; so two replicas refreshing at once go one after the
    /// other and the second sees the first's tokens. Returns the grant in force afterwards
    /// and its version. The caller bounds the whole call.
    pub async fn with_locked_grant<T, E, F, Fut>(
        &self,
        owner: &GrantOwner,
        step: F,
    ) -> Result<(T, i64), LockedError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(&T, i64) -> Fut,
        Fut: Future<Output = Result<Option<T>, E>>,
    {
        let key = self.secrets_key()?;
        let aad = associated_data(GRANT_TAG, owner, &[]);
        let mut tx = self.pool.begin().await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"
        )))
        .execute(&mut *tx)
        .await?;
        let row: Option<(Vec<u8>, Vec<u8>, i64)> = sqlx::query_as(
            "SELECT nonce, ciphertext, version FROM connector_grants \
             WHERE team_id = $1 AND connector_id = $2 AND user_id IS NOT DISTINCT FROM $3 \
             FOR UPDATE",
        )
        .bind(owner.team.0)
        .bind(owner.connector)
        .bind(owner.user.as_deref())
        .fetch_optional(&mut *tx)
        .await?;
        let (nonce, ciphertext, version) = row.ok_or(SecretsError::Store(StoreError::NotFound))?;
        let current: T = open(key, &aad, &nonce, &ciphertext)?;
        let Some(new) = step(&current, version).await.map_err(LockedError::Step)? else {
            return Ok((current, version));
        };
        let (nonce, ciphertext) = seal(key, &aad, &new)?;
        let (written,): (i64,) = sqlx::query_as(
            "UPDATE connector_grants SET nonce = $4, ciphertext = $5, \
               version = version + 1, updated_at = now() \
             WHERE team_id = $1 AND connector_id = $2 AND user_id IS NOT DISTINCT FROM $3 \
             RETURNING version",
        )
        .bind(owner.team.0)
        .bind(owner.connector)
        .bind(owner.user.as_deref())
        .bind(&nonce)
        .bind(&ciphertext)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((new, written))
    }

    /// Every grant of a connector (before it is deleted, to revoke them). A grant that
    /// does not decrypt is left out with a log line: it can be neither used nor revoked.
    pub async fn connector_grants<T: DeserializeOwned>(
        &self,
        team: TeamId,
        connector: Uuid,
    ) -> Result<Vec<T>, SecretsError> {
        let key = self.secrets_key()?;
        let rows = sqlx::query(
            "SELECT team_id, connector_id, user_id, nonce, ciphertext FROM connector_grants \
             WHERE team_id = $1 AND connector_id = $2",
        )
        .bind(team.0)
        .bind(connector)
        .fetch_all(&self.pool)
        .await?;
        let mut grants = Vec::with_capacity(rows.len());
        for row in &rows {
            let owner = owner_from_row(row)?;
            let nonce: Vec<u8> = row.try_get("nonce")?;
            let ciphertext: Vec<u8> = row.try_get("ciphertext")?;
            match open(
                key,
                &associated_data(GRANT_TAG, &owner, &[]),
                &nonce,
                &ciphertext,
            ) {
                Ok(grant) => grants.push(grant),
                Err(e) => {
                    tracing::warn!(team = %team, connector = %connector, class = e.metric_label(), "a stored grant does not decrypt; it cannot be revoked")
                }
            }
        }
        Ok(grants)
    }

    /// Grants and pending flows per connector of the team (no secrets are read).
    pub async fn connector_authorizations(
        &self,
        team: TeamId,
    ) -> Result<std::collections::HashMap<Uuid, AuthorizationCounts>, StoreError> {
        let rows: Vec<(Uuid, bool, i64, i64)> = sqlx::query_as(
            "SELECT c.id, \
               EXISTS (SELECT 1 FROM connector_grants g WHERE g.connector_id = c.id AND g.user_id IS NULL), \
               (SELECT count(*) FROM connector_grants g WHERE g.connector_id = c.id AND g.user_id IS NOT NULL), \
               (SELECT count(*) FROM oauth_flows f WHERE f.connector_id = c.id) \
             FROM connectors c WHERE c.team_id = $1",
        )
        .bind(team.0)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, connector_grant, user_grants, pending_flows)| {
                (
                    id,
                    AuthorizationCounts {
                        connector_grant,
                        user_grants,
                        pending_flows,
                    },
                )
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn associated_data_tells_owners_apart() {
        let (team, connector) = (TeamId::new(), Uuid::now_v7());
        let owner = |user: Option<&str>| GrantOwner {
            team,
            connector,
            user: user.map(str::to_owned),
        };
        let all = [
            associated_data(GRANT_TAG, &owner(None), &[]),
            associated_data(GRANT_TAG, &owner(Some("")), &[]),
            associated_data(GRANT_TAG, &owner(Some("alice")), &[]),
            associated_data(FLOW_TAG, &owner(Some("alice")), &[]),
            associated_data(FLOW_TAG, &owner(Some("alice")), &[0; 32]),
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn a_sealed_grant_opens_only_for_its_owner() {
        let key = SecretsKey::parse(&"cd".repeat(32)).unwrap();
        let alice = GrantOwner {
            team: TeamId::new(),
            connector: Uuid::now_v7(),
            user: Some("alice".into()),
        };
        let aad = associated_data(GRANT_TAG, &alice, &[]);
        let (nonce, ciphertext) = seal(&key, &aad, &serde_json::json!({"t": 1})).unwrap();
        let back: serde_json::Value = open(&key, &aad, &nonce, &ciphertext).unwrap();
        assert_eq!(back, serde_json::json!({"t": 1}));
        let bob = GrantOwner {
            user: Some("bob".into()),
            ..alice.clone()
        };
        let other = associated_data(GRANT_TAG, &bob, &[]);
        assert!(open::<serde_json::Value>(&key, &other, &nonce, &ciphertext).is_err());
        let connector_wide = GrantOwner {
            user: None,
            ..alice
        };
        let other = associated_data(GRANT_TAG, &connector_wide, &[]);
        assert!(open::<serde_json::Value>(&key, &other, &nonce, &ciphertext).is_err());
    }
}
