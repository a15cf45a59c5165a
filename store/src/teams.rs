//! Teams and their API keys; the operator's view of teams (L1).

use chrono::{DateTime, Utc};
use protocol::{AgentId, ChatId, TeamId, TurnId};
use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::audit::{self, Action, Actor};
use super::{Store, StoreError};

/// A new team and the only copy of its first API key.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct CreatedTeam {
    #[schema(value_type = String, format = Uuid)]
    pub team_id: TeamId,
    pub name: String,
    /// The team's first `admin` key, shown this once.
    pub api_key: String,
}

/// A team as the operator sees it.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct TeamRow {
    #[schema(value_type = String, format = Uuid)]
    pub id: TeamId,
    pub name: String,
    /// `active`; `disabled` (its keys and tokens refused, its schedules not firing);
    /// `erasing` (`DELETE` asked: disabled, and its data being deleted in the background);
    /// `erased` (nothing of it is left but this row and its usage records).
    pub status: TeamStatus,
    pub created_at: DateTime<Utc>,
    /// When the operator disabled it; absent while active.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TeamStatus {
    Active,
    Disabled,
    Erasing,
    Erased,
}

/// Which of a team's turns [`Store::unfinished_turns`] reads.
#[derive(Clone, Copy, Debug)]
pub enum Within {
    Team,
    Agent(AgentId),
    Chat(ChatId),
}

/// What the operator changes of a team (`PATCH /v1/teams/{id}`); `None` leaves it.
#[derive(Clone, Debug, Default)]
pub struct TeamChange<'a> {
    pub name: Option<&'a str>,
    pub disabled: Option<bool>,
}

const TEAM_COLUMNS: &str = "id, name, created_at, disabled_at, erasing_at, erased_at";

type TeamTuple = (
    Uuid,
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

fn team_row((id, name, created_at, disabled_at, erasing_at, erased_at): TeamTuple) -> TeamRow {
    TeamRow {
        id: TeamId(id),
        name,
        status: match (disabled_at, erasing_at, erased_at) {
            (_, _, Some(_)) => TeamStatus::Erased,
            (_, Some(_), None) => TeamStatus::Erasing,
            (Some(_), None, None) => TeamStatus::Disabled,
            (None, None, None) => TeamStatus::Active,
        },
        created_at,
        disabled_at,
    }
}

/// Every API key starts with it, so a bearer can be told from a JWT at a glance.
pub const KEY_PREFIX: &str = "ar_";
/// How much of a key `GET /v1/keys` shows (the prefix and 6 hex digits) to tell keys apart.
const SHOWN_PREFIX: usize = KEY_PREFIX.len() + 6;

/// A live key as the team sees it: everything but the secret.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct KeyRow {
    pub id: Uuid,
    pub name: String,
    /// `admin` or `chat`, as stored (the `auth` module gives it meaning).
    pub scope: String,
    pub prefix: String,
    pub created_at: DateTime<Utc>,
}

/// What authenticating a key needs.
#[derive(Clone, Debug)]
pub struct KeyAuth {
    pub id: Uuid,
    pub team: TeamId,
    pub scope: String,
    /// The key's team is disabled (L1): the key is refused as `team_disabled`.
    pub team_disabled: bool,
}

/// The stored form of a key. Keys carry 256 random bits, so SHA-256 leaves nothing to
/// brute-force and lets the lookup be one indexed equality.
pub fn key_hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

pub fn new_key() -> String {
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
    /// A team made by the operator from the command line (`brain admin create-team`), which
    /// holds the database and has no address to record.
    pub async fn create_team(&self, name: &str) -> Result<CreatedTeam, StoreError> {
        self.create_team_by(name, &Actor::operator(None)).await
    }

    /// A team made by `by` (the operator's team API), with its entry in the audit log.
    pub async fn create_team_by(&self, name: &str, by: &Actor) -> Result<CreatedTeam, StoreError> {
        let team_id = TeamId::new();
        let api_key = new_key();
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO teams (id, name) VALUES ($1, $2)")
            .bind(team_id.0)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        // The bootstrap key manages the team, so it is `admin`.
        sqlx::query(
            "INSERT INTO api_keys (id, team_id, key_hash, prefix, name, scope) \
             VALUES ($1, $2, $3, $4, 'bootstrap', 'admin')",
        )
        .bind(Uuid::now_v7())
        .bind(team_id.0)
        .bind(&key_hash(&api_key)[..])
        .bind(&api_key[..SHOWN_PREFIX])
        .execute(&mut *tx)
        .await?;
        let details = serde_json::json!({ "name": name });
        audit::record(&mut tx, team_id, by, Action::TeamCreated, team_id, details).await?;
        tx.commit().await?;
        Ok(CreatedTeam {
            team_id,
            name: name.to_owned(),
            api_key,
        })
    }

    /// A page of teams in creation order (their ids are time-ordered): at most `limit`
    /// after the team `after`.
    pub async fn teams_page(
        &self,
        after: Option<TeamId>,
        limit: i64,
    ) -> Result<Vec<TeamRow>, StoreError> {
        let sql = format!(
            "SELECT {TEAM_COLUMNS} FROM teams WHERE ($1::uuid IS NULL OR id > $1) \
             ORDER BY id LIMIT $2"
        );
        let rows: Vec<TeamTuple> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(after.map(|t| t.0))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(team_row).collect())
    }

    pub async fn team(&self, team: TeamId) -> Result<Option<TeamRow>, StoreError> {
        let sql = format!("SELECT {TEAM_COLUMNS} FROM teams WHERE id = $1");
        let row: Option<TeamTuple> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(team_row))
    }

    /// Renames, disables or enables `team`; disabling an already disabled team keeps when
    /// it was first disabled. `None` for no such team.
    pub async fn update_team(
        &self,
        team: TeamId,
        change: &TeamChange<'_>,
        by: &Actor,
    ) -> Result<Option<TeamRow>, StoreError> {
        let sql = format!(
            "UPDATE teams SET name = coalesce($2, name), \
               disabled_at = CASE WHEN $3::bool IS NULL OR erasing_at IS NOT NULL THEN disabled_at \
                                  WHEN $3 THEN coalesce(disabled_at, now()) END \
             WHERE id = $1 RETURNING {TEAM_COLUMNS}"
        );
        let mut tx = self.pool.begin().await?;
        let row: Option<TeamTuple> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(change.name)
            .bind(change.disabled)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let details = serde_json::json!({ "name": change.name, "disabled": change.disabled });
        audit::record(&mut tx, team, by, Action::TeamUpdated, team, details).await?;
        tx.commit().await?;
        Ok(Some(team_row(row)))
    }

    /// The turns of `team` (of one of its agents or chats, `within`) that run or wait to:
    /// a disabled team's are stopped (L1), an erased chat's or agent's too (L2).
    pub async fn unfinished_turns(
        &self,
        team: TeamId,
        within: Within,
    ) -> Result<Vec<TurnId>, StoreError> {
        let (column, id) = match within {
            Within::Team => ("agent_id", None),
            Within::Agent(agent) => ("agent_id", Some(agent.0)),
            Within::Chat(chat) => ("chat_id", Some(chat.0)),
        };
        let rows: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM turns WHERE team_id = $1 AND ($2::uuid IS NULL OR {column} = $2) \
             AND status IN ('running', 'queued')"
        )))
        .bind(team.0)
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(TurnId).collect())
    }

    /// Ends the team's live worker sessions (a disabled team's workers are released at
    /// once, L1): `terminated`, so the runtime-manager's reaper stops their workers on its
    /// next pass, and a claimed pooled worker's slot `gone`, in one transaction. Answers
    /// how many ended.
    pub async fn end_team_sessions(&self, team: TeamId) -> Result<i64, StoreError> {
        let mut tx = self.pool.begin().await?;
        let ended = session_states::end_team_sessions(&mut *tx, team).await?;
        let ids: Vec<Uuid> = ended.iter().map(|s| s.0).collect();
        sqlx::query(
            "UPDATE worker_pool SET state = 'gone', updated_at = now()
             WHERE state = 'claimed' AND session_id = ANY($1)",
        )
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(i64::try_from(ids.len()).unwrap_or(i64::MAX))
    }

    /// The live key whose hash is `hash`, if any.
    pub async fn key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<KeyAuth>, StoreError> {
        let row: Option<(Uuid, Uuid, String, bool)> = sqlx::query_as(
            "SELECT k.id, k.team_id, k.scope, t.disabled_at IS NOT NULL FROM api_keys k \
             JOIN teams t ON t.id = k.team_id WHERE k.key_hash = $1 AND k.revoked_at IS NULL",
        )
        .bind(&hash[..])
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(id, team, scope, team_disabled)| KeyAuth {
            id,
            team: TeamId(team),
            scope,
            team_disabled,
        }))
    }

    /// The hash of `team`'s key `id` while it is live (not revoked, its team not
    /// disabled).
    pub async fn live_key_hash(
        &self,
        team: TeamId,
        id: Uuid,
    ) -> Result<Option<[u8; 32]>, StoreError> {
        let row: Option<(Vec<u8>,)> = sqlx::query_as(
            "SELECT k.key_hash FROM api_keys k JOIN teams t ON t.id = k.team_id \
             WHERE k.team_id = $1 AND k.id = $2 AND k.revoked_at IS NULL \
               AND t.disabled_at IS NULL",
        )
        .bind(team.0)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.and_then(|(hash,)| hash.try_into().ok()))
    }

    /// Stores a new key of `team` for `secret`, unless the team already has `max_live`
    /// live keys (`Conflict("key_limit")`).
    pub async fn create_key(
        &self,
        team: TeamId,
        name: &str,
        scope: &str,
        secret: &str,
        max_live: i64,
        by: &Actor,
    ) -> Result<KeyRow, StoreError> {
        let mut tx = self.pool.begin().await?;
        // A bound on growth, not an exact count: two creations racing at the limit may
        // both pass (the count is read from the statement's snapshot).
        let row: Option<(Uuid, String, String, String, DateTime<Utc>)> = sqlx::query_as(
            "INSERT INTO api_keys (id, team_id, key_hash, prefix, name, scope) \
             SELECT $1, id, $3, $4, $5, $6 FROM teams WHERE id = $2 AND (SELECT count(*) FROM api_keys WHERE team_id = $2 AND revoked_at IS NULL) < $7 \
             RETURNING id, name, scope, prefix, created_at",
        )
        .bind(Uuid::now_v7())
        .bind(team.0)
        .bind(&key_hash(secret)[..])
        .bind(&secret[..SHOWN_PREFIX.min(secret.len())])
        .bind(name)
        .bind(scope)
        .bind(max_live)
        .fetch_optional(&mut *tx)
        .await?;
        let (id, name, scope, prefix, created_at) = row.ok_or(StoreError::Conflict("key_limit"))?;
        let details = serde_json::json!({ "name": name, "scope": scope });
        audit::record(&mut tx, team, by, Action::KeyCreated, id, details).await?;
        tx.commit().await?;
        Ok(KeyRow {
            id,
            name,
            scope,
            prefix,
            created_at,
        })
    }

    /// A page of the team's live keys, oldest first: at most `limit` after `after`.
    pub async fn keys(
        &self,
        team: TeamId,
        after: Option<super::Keyset>,
        limit: i64,
    ) -> Result<Vec<KeyRow>, StoreError> {
        let sql = format!(
            "SELECT id, name, scope, prefix, created_at FROM api_keys \
             WHERE team_id = $1 AND revoked_at IS NULL AND {} \
             ORDER BY created_at, id LIMIT $2",
            super::keyset_after(">", "$3", "$4")
        );
        let rows: Vec<(Uuid, String, String, String, DateTime<Utc>)> =
            sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(team.0)
                .bind(limit)
                .bind(after.map(|k| k.at))
                .bind(after.map(|k| k.id))
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .map(|(id, name, scope, prefix, created_at)| KeyRow {
                id,
                name,
                scope,
                prefix,
                created_at,
            })
            .collect())
    }

    /// Revokes the team's live key `id` and returns its hash. `NotFound` for an unknown,
    /// revoked or other team's key; `Conflict("last_admin_key")` when it is the team's
    /// last live `admin` key. The team row is locked first, so two revocations of a
    /// team's last two admin keys run one after the other and the second sees one left.
    pub async fn revoke_key(
        &self,
        team: TeamId,
        id: Uuid,
        by: &Actor,
    ) -> Result<[u8; 32], StoreError> {
        let mut tx = self.pool.begin().await?;
        let locked: Option<(Uuid,)> =
            sqlx::query_as("SELECT id FROM teams WHERE id = $1 FOR UPDATE")
                .bind(team.0)
                .fetch_optional(&mut *tx)
                .await?;
        if locked.is_none() {
            return Err(StoreError::NotFound);
        }
        let key: Option<(Vec<u8>, String)> = sqlx::query_as(
            "SELECT key_hash, scope FROM api_keys \
             WHERE team_id = $1 AND id = $2 AND revoked_at IS NULL",
        )
        .bind(team.0)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let (hash, scope) = key.ok_or(StoreError::NotFound)?;
        if scope == "admin" {
            let (admins,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM api_keys \
                 WHERE team_id = $1 AND scope = 'admin' AND revoked_at IS NULL",
            )
            .bind(team.0)
            .fetch_one(&mut *tx)
            .await?;
            if admins <= 1 {
                return Err(StoreError::Conflict("last_admin_key"));
            }
        }
        sqlx::query("UPDATE api_keys SET revoked_at = now() WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let details = serde_json::json!({ "scope": scope });
        audit::record(&mut tx, team, by, Action::KeyRevoked, id, details).await?;
        tx.commit().await?;
        hash.try_into()
            .map_err(|_| StoreError::Corrupt(format!("api key {id} has a malformed hash")))
    }

    /// The name `team` was created with; `None` for no such team.
    pub async fn team_name(&self, team: TeamId) -> Result<Option<String>, StoreError> {
        let row: Option<(String,)> = sqlx::query_as("SELECT name FROM teams WHERE id = $1")
            .bind(team.0)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|(name,)| name))
    }

    /// Whether `team` exists (a JWT's team claim must name one) and is disabled:
    /// `None` for no such team.
    pub async fn team_disabled(&self, team: TeamId) -> Result<Option<bool>, StoreError> {
        let row: Option<(bool,)> =
            sqlx::query_as("SELECT disabled_at IS NOT NULL FROM teams WHERE id = $1")
                .bind(team.0)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(disabled,)| disabled))
    }
}

impl Store {
    /// The team's default auxiliary routes (T17), for agents that name none of their own.
    pub async fn team_auxiliary_models(
        &self,
        team: TeamId,
    ) -> Result<super::AuxiliaryModels, StoreError> {
        let row: Option<sqlx::types::Json<super::AuxiliaryModels>> =
            sqlx::query_scalar("SELECT auxiliary_models FROM teams WHERE id = $1")
                .bind(team.0)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|models| models.0).ok_or(StoreError::NotFound)
    }

    /// Replaces the team's default auxiliary routes (T17).
    pub async fn set_team_auxiliary_models(
        &self,
        team: TeamId,
        models: &super::AuxiliaryModels,
    ) -> Result<(), StoreError> {
        let done = sqlx::query("UPDATE teams SET auxiliary_models = $2 WHERE id = $1")
            .bind(team.0)
            .bind(sqlx::types::Json(models))
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }
}
