//! What the A2A front end (P1) reads and keeps: an agent's turns as tasks, the messages
//! of a page of turns, and the push notification configs of a task, whose token and
//! credentials (the receiver's secrets) are sealed under `BRAIN_SECRETS_KEY` as webhook
//! signing secrets are (migration 0034) and opened only to be sent (`claim_deliveries`),
//! never read back. A team's pending pushes are bounded when a config is kept.

use protocol::{AgentId, ChatId, TeamId, TurnId};
use sqlx::Row;

use super::chats::{MESSAGE_COLUMNS, message_from_row};
use super::secrets::SecretsError;
use super::turns::{TURN_COLUMNS, turn_row_from_row};
use super::webhooks::{PushField, seal_push};
use super::{MessageRow, Store, StoreError, TurnRow};

/// Which of an agent's turns a listing keeps.
#[derive(Debug, Default)]
pub struct TaskFilter {
    /// One chat's (`contextId`).
    pub chat: Option<ChatId>,
    /// Only chats this JWT user opened (a user token without the admin claim).
    pub created_by: Option<String>,
    /// Only turns whose stored status is one of these (`turns.status`).
    pub statuses: Option<Vec<&'static str>>,
    /// With `Some`, only turns that do (or do not) wait for an approval.
    pub awaiting_approval: Option<bool>,
    /// Leaves out the agent's autostart chat, which only admins see (X1).
    pub hide_autostart: bool,
}

/// A push notification config of a task: as the client gave it when it is kept; read
/// back, without its token and credentials (`None`), which are never shown again. `Debug`
/// never shows them (X4).
#[derive(Clone, PartialEq, Eq)]
pub struct PushConfig {
    pub id: String,
    pub turn: TurnId,
    pub url: String,
    pub token: Option<String>,
    pub auth_scheme: Option<String>,
    pub auth_credentials: Option<String>,
}

impl std::fmt::Debug for PushConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushConfig")
            .field("id", &self.id)
            .field("turn", &self.turn)
            .finish_non_exhaustive()
    }
}

/// The filters of [`TaskFilter`], as `$2..$7` of every listing statement.
const FILTERED: &str = "t.team_id = $1 AND t.agent_id = $2 \
    AND ($3::uuid IS NULL OR t.chat_id = $3) \
    AND ($4::text IS NULL OR EXISTS (SELECT 1 FROM chats c WHERE c.team_id = t.team_id \
         AND c.id = t.chat_id AND c.created_by = $4)) \
    AND ($5::text[] IS NULL OR t.status = ANY($5)) \
    AND ($6::bool IS NULL OR $6 = EXISTS (SELECT 1 FROM approvals p WHERE p.team_id = t.team_id \
         AND p.chat_id = t.chat_id AND p.turn_id = t.id AND p.state = 'pending')) \
    AND (NOT $7 OR NOT EXISTS (SELECT 1 FROM chats c WHERE c.team_id = t.team_id \
         AND c.id = t.chat_id AND c.autostart))";

/// A kept config as it is read back: its secrets stay sealed.
fn push_from_row(row: &sqlx::postgres::PgRow) -> Result<PushConfig, StoreError> {
    Ok(PushConfig {
        id: row.try_get("id")?,
        turn: TurnId(row.try_get("turn_id")?),
        url: row.try_get("url")?,
        token: None,
        auth_scheme: row.try_get("auth_scheme")?,
        auth_credentials: None,
    })
}

/// How many pushes team `$1` has pending, counted up to `$2`: deliveries not yet taken by
/// their receiver, and configs of tasks still queued or running, each of which becomes one
/// when its task ends (the `a2a_turn_ended` trigger, which never refuses). Each count
/// stops at the bound, so a team at it costs no more to refuse than one below it.
const PENDING_PUSHES: &str = "SELECT \
    (SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries \
        WHERE team_id = $1 AND state = 'pending' AND push_config IS NOT NULL LIMIT $2) d) \
  + (SELECT count(*) FROM (SELECT 1 FROM turns t JOIN a2a_push_configs c \
        ON c.team_id = t.team_id AND c.turn_id = t.id \
        WHERE t.team_id = $1 AND t.status = 'running' LIMIT $2) r) \
  + (SELECT count(*) FROM (SELECT 1 FROM turns t JOIN a2a_push_configs c \
        ON c.team_id = t.team_id AND c.turn_id = t.id \
        WHERE t.team_id = $1 AND t.status = 'queued' LIMIT $2) q)";

/// The advisory lock's first key (the second is the team's): keeping configs of one team
/// is serialized so that two at once cannot both pass the bound.
const PUSH_BOUND_LOCK: i32 = 0x5055_5348;

impl Store {
    /// A page of the agent's turns that `filter` keeps, newest first: at most `limit`
    /// started before the turn `before` (the last of the previous page), whether more
    /// remain, and how many the filter keeps in all.
    pub async fn agent_turn_page(
        &self,
        team: TeamId,
        agent: AgentId,
        filter: &TaskFilter,
        before: Option<TurnId>,
        limit: i64,
    ) -> Result<(Vec<TurnRow>, bool, i64), StoreError> {
        let page = format!(
            "SELECT {TURN_COLUMNS} FROM turns t WHERE {FILTERED} \
               AND ($8::uuid IS NULL OR (t.started_at, t.id) < \
                    (SELECT started_at, id FROM turns WHERE team_id = $1 AND id = $8)) \
             ORDER BY t.started_at DESC, t.id DESC LIMIT $9 + 1"
        );
        let statuses = filter
            .statuses
            .as_ref()
            .map(|s| s.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>());
        let rows = sqlx::query(sqlx::AssertSqlSafe(page))
            .bind(team.0)
            .bind(agent.0)
            .bind(filter.chat.map(|c| c.0))
            .bind(filter.created_by.as_deref())
            .bind(statuses.clone())
            .bind(filter.awaiting_approval)
            .bind(filter.hide_autostart)
            .bind(before.map(|t| t.0))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        let mut turns = rows
            .iter()
            .map(turn_row_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        let more = turns.len() as i64 > limit;
        turns.truncate(usize::try_from(limit).unwrap_or(0));
        let count = format!("SELECT count(*) FROM turns t WHERE {FILTERED}");
        let total: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count))
            .bind(team.0)
            .bind(agent.0)
            .bind(filter.chat.map(|c| c.0))
            .bind(filter.created_by.as_deref())
            .bind(statuses)
            .bind(filter.awaiting_approval)
            .bind(filter.hide_autostart)
            .fetch_one(&self.pool)
            .await?;
        Ok((turns, more, total))
    }

    /// The messages of these turns, in transcript order.
    pub async fn turns_messages(
        &self,
        team: TeamId,
        turns: &[TurnId],
    ) -> Result<Vec<MessageRow>, StoreError> {
        let ids: Vec<uuid::Uuid> = turns.iter().map(|t| t.0).collect();
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE team_id = $1 AND turn_id = ANY($2) \
             ORDER BY seq"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(ids)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| message_from_row(r).map_err(StoreError::from))
            .collect()
    }

    /// How many pushes the team has pending, counted up to `bound` (see [`PENDING_PUSHES`]).
    pub async fn pending_pushes(&self, team: TeamId, bound: i64) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(PENDING_PUSHES)
            .bind(team.0)
            .bind(bound)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Creates or replaces the task's config `config.id`, its token and credentials sealed.
    /// `Conflict` when the task already has `per_task` others; `TooMany` when the team has
    /// `per_team` pushes pending (a config replaced counts as before); `NotConfigured`
    /// without a secrets key. A task that has already ended is notified of its state at
    /// once.
    pub async fn put_push_config(
        &self,
        team: TeamId,
        config: &PushConfig,
        per_task: i64,
        per_team: i64,
    ) -> Result<(), SecretsError> {
        let key = self.secrets.as_ref().ok_or(SecretsError::NotConfigured)?;
        let (turn, id) = (config.turn, config.id.as_str());
        let token = seal_push(
            key,
            team,
            turn,
            id,
            PushField::Token,
            config.token.as_deref(),
        )?;
        let credentials = config.auth_credentials.as_deref();
        let credentials = seal_push(key, team, turn, id, PushField::Credentials, credentials)?;
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2::uuid::text))")
            .bind(PUSH_BOUND_LOCK)
            .bind(team.0)
            .execute(&mut *tx)
            .await?;
        // The turn's row first: a turn ending now either waits for this config (and its
        // trigger then sees it) or has ended when `a2a_notify` below reads it (0028).
        sqlx::query("SELECT 1 FROM turns WHERE team_id = $1 AND id = $2 FOR NO KEY UPDATE")
            .bind(team.0)
            .bind(config.turn.0)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let replaced: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM a2a_push_configs \
             WHERE team_id = $1 AND turn_id = $2 AND id = $3)",
        )
        .bind(team.0)
        .bind(config.turn.0)
        .bind(&config.id)
        .fetch_one(&mut *tx)
        .await?;
        if !replaced {
            let pending: i64 = sqlx::query_scalar(PENDING_PUSHES)
                .bind(team.0)
                .bind(per_team)
                .fetch_one(&mut *tx)
                .await?;
            if pending >= per_team {
                return Err(SecretsError::TooMany);
            }
        }
        let kept = sqlx::query(
            "INSERT INTO a2a_push_configs \
               (team_id, turn_id, id, url, token_nonce, token_sealed, auth_scheme, \
                credentials_nonce, credentials_sealed) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9 \
             WHERE (SELECT count(*) FROM a2a_push_configs \
                    WHERE team_id = $1 AND turn_id = $2 AND id <> $3) < $10 \
             ON CONFLICT (team_id, turn_id, id) DO UPDATE SET url = EXCLUDED.url, \
               token_nonce = EXCLUDED.token_nonce, token_sealed = EXCLUDED.token_sealed, \
               auth_scheme = EXCLUDED.auth_scheme, \
               credentials_nonce = EXCLUDED.credentials_nonce, \
               credentials_sealed = EXCLUDED.credentials_sealed",
        )
        .bind(team.0)
        .bind(config.turn.0)
        .bind(&config.id)
        .bind(&config.url)
        .bind(token.0)
        .bind(token.1)
        .bind(config.auth_scheme.as_deref())
        .bind(credentials.0)
        .bind(credentials.1)
        .bind(per_task)
        .execute(&mut *tx)
        .await?;
        if kept.rows_affected() == 0 {
            return Err(StoreError::Conflict("push_configs_per_task").into());
        }
        sqlx::query("SELECT a2a_notify($1, $2, $3)")
            .bind(team.0)
            .bind(config.turn.0)
            .bind(&config.id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The task's configs (or its config `only`), oldest first, without their secrets.
    pub async fn push_configs(
        &self,
        team: TeamId,
        turn: TurnId,
        only: Option<&str>,
    ) -> Result<Vec<PushConfig>, SecretsError> {
        if self.secrets.is_none() {
            return Err(SecretsError::NotConfigured);
        }
        let rows = sqlx::query(
            "SELECT id, turn_id, url, auth_scheme FROM a2a_push_configs \
             WHERE team_id = $1 AND turn_id = $2 AND ($3::text IS NULL OR id = $3) \
             ORDER BY created_at, id",
        )
        .bind(team.0)
        .bind(turn.0)
        .bind(only)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(push_from_row)
            .collect::<Result<_, StoreError>>()?)
    }

    /// Deletes the task's config `id`; `NotFound` when there is none.
    pub async fn delete_push_config(
        &self,
        team: TeamId,
        turn: TurnId,
        id: &str,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(
            "DELETE FROM a2a_push_configs WHERE team_id = $1 AND turn_id = $2 AND id = $3",
        )
        .bind(team.0)
        .bind(turn.0)
        .bind(id)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }
}
