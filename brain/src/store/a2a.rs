//! What the A2A front end (P1) reads and keeps: an agent's turns as tasks, the messages
//! of a page of turns, and the push notification configs of a task, whose token and
//! credentials (the receiver's secrets) are sealed under `BRAIN_SECRETS_KEY` as webhook
//! signing secrets are (migration 0034).

use protocol::{AgentId, ChatId, TeamId, TurnId};
use sqlx::Row;

use super::chats::{MESSAGE_COLUMNS, message_from_row};
use super::secrets::{SecretsError, SecretsKey};
use super::turns::{TURN_COLUMNS, turn_row_from_row};
use super::webhooks::{PushField, Sealed, open_push, seal_push};
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
}

/// A push notification config of a task, as the client gave it. `Debug` never shows the
/// token or the credentials (X4).
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

/// The filters of [`TaskFilter`], as `$2..$6` of every listing statement.
const FILTERED: &str = "t.team_id = $1 AND t.agent_id = $2 \
    AND ($3::uuid IS NULL OR t.chat_id = $3) \
    AND ($4::text IS NULL OR EXISTS (SELECT 1 FROM chats c WHERE c.team_id = t.team_id \
         AND c.id = t.chat_id AND c.created_by = $4)) \
    AND ($5::text[] IS NULL OR t.status = ANY($5)) \
    AND ($6::bool IS NULL OR $6 = EXISTS (SELECT 1 FROM approvals p WHERE p.team_id = t.team_id \
         AND p.chat_id = t.chat_id AND p.turn_id = t.id AND p.state = 'pending'))";

fn push_from_row(
    key: &SecretsKey,
    team: TeamId,
    row: &sqlx::postgres::PgRow,
) -> Result<PushConfig, SecretsError> {
    let id: String = row.try_get("id").map_err(StoreError::from)?;
    let turn = TurnId(row.try_get("turn_id").map_err(StoreError::from)?);
    let sealed = |nonce: &str, sealed: &str| -> Result<Sealed, SecretsError> {
        Ok((
            row.try_get(nonce).map_err(StoreError::from)?,
            row.try_get(sealed).map_err(StoreError::from)?,
        ))
    };
    let token = sealed("token_nonce", "token_sealed")?;
    let credentials = sealed("credentials_nonce", "credentials_sealed")?;
    Ok(PushConfig {
        token: open_push(key, team, turn, &id, PushField::Token, token)?,
        auth_credentials: open_push(key, team, turn, &id, PushField::Credentials, credentials)?,
        url: row.try_get("url").map_err(StoreError::from)?,
        auth_scheme: row.try_get("auth_scheme").map_err(StoreError::from)?,
        id,
        turn,
    })
}

const PUSH_COLUMNS: &str = "id, turn_id, url, token_nonce, token_sealed, auth_scheme, \
    credentials_nonce, credentials_sealed";

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
               AND ($7::uuid IS NULL OR (t.started_at, t.id) < \
                    (SELECT started_at, id FROM turns WHERE team_id = $1 AND id = $7)) \
             ORDER BY t.started_at DESC, t.id DESC LIMIT $8 + 1"
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

    /// Creates or replaces the task's config `config.id`, its token and credentials sealed;
    /// `Conflict` when the task already has `cap` others, `NotConfigured` without a secrets
    /// key. A task that has already ended is notified of its state at once.
    pub async fn put_push_config(
        &self,
        team: TeamId,
        config: &PushConfig,
        cap: i64,
    ) -> Result<PushConfig, SecretsError> {
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
        // The turn's row first: a turn ending now either waits for this config (and its
        // trigger then sees it) or has ended when `a2a_notify` below reads it (0028).
        sqlx::query("SELECT 1 FROM turns WHERE team_id = $1 AND id = $2 FOR NO KEY UPDATE")
            .bind(team.0)
            .bind(config.turn.0)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let sql = format!(
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
               credentials_sealed = EXCLUDED.credentials_sealed \
             RETURNING {PUSH_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(config.turn.0)
            .bind(&config.id)
            .bind(&config.url)
            .bind(token.0)
            .bind(token.1)
            .bind(config.auth_scheme.as_deref())
            .bind(credentials.0)
            .bind(credentials.1)
            .bind(cap)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::Conflict("push_configs_per_task"))?;
        sqlx::query("SELECT a2a_notify($1, $2, $3)")
            .bind(team.0)
            .bind(config.turn.0)
            .bind(&config.id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        push_from_row(key, team, &row)
    }

    /// The task's configs (or its config `only`), oldest first, opened for the task's
    /// owner.
    pub async fn push_configs(
        &self,
        team: TeamId,
        turn: TurnId,
        only: Option<&str>,
    ) -> Result<Vec<PushConfig>, SecretsError> {
        let key = self.secrets.as_ref().ok_or(SecretsError::NotConfigured)?;
        let sql = format!(
            "SELECT {PUSH_COLUMNS} FROM a2a_push_configs WHERE team_id = $1 AND turn_id = $2 \
               AND ($3::text IS NULL OR id = $3) ORDER BY created_at, id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(turn.0)
            .bind(only)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| push_from_row(key, team, r)).collect()
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
