//! What the A2A front end (P1) reads and keeps: an agent's turns as tasks, the messages
//! of a page of turns, and the push notification configs of a task.

use protocol::{AgentId, ChatId, TeamId, TurnId};
use sqlx::Row;

use super::chats::{MESSAGE_COLUMNS, message_from_row};
use super::turns::{TURN_COLUMNS, turn_row_from_row};
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

/// A push notification config of a task, as the client gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushConfig {
    pub id: String,
    pub turn: TurnId,
    pub url: String,
    pub token: Option<String>,
    pub auth_scheme: Option<String>,
    pub auth_credentials: Option<String>,
}

/// The filters of [`TaskFilter`], as `$2..$6` of every listing statement.
const FILTERED: &str = "t.team_id = $1 AND t.agent_id = $2 \
    AND ($3::uuid IS NULL OR t.chat_id = $3) \
    AND ($4::text IS NULL OR EXISTS (SELECT 1 FROM chats c WHERE c.team_id = t.team_id \
         AND c.id = t.chat_id AND c.created_by = $4)) \
    AND ($5::text[] IS NULL OR t.status = ANY($5)) \
    AND ($6::bool IS NULL OR $6 = EXISTS (SELECT 1 FROM approvals p WHERE p.team_id = t.team_id \
         AND p.chat_id = t.chat_id AND p.turn_id = t.id AND p.state = 'pending'))";

fn push_from_row(row: &sqlx::postgres::PgRow) -> Result<PushConfig, StoreError> {
    Ok(PushConfig {
        id: row.try_get("id")?,
        turn: TurnId(row.try_get("turn_id")?),
        url: row.try_get("url")?,
        token: row.try_get("token")?,
        auth_scheme: row.try_get("auth_scheme")?,
        auth_credentials: row.try_get("auth_credentials")?,
    })
}

const PUSH_COLUMNS: &str = "id, turn_id, url, token, auth_scheme, auth_credentials";

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

    /// Creates or replaces the task's config `config.id`; `Conflict` when the task already
    /// has `cap` others. A task that has already ended is notified of its state at once.
    pub async fn put_push_config(
        &self,
        team: TeamId,
        config: &PushConfig,
        cap: i64,
    ) -> Result<PushConfig, StoreError> {
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
               (team_id, turn_id, id, url, token, auth_scheme, auth_credentials) \
             SELECT $1, $2, $3, $4, $5, $6, $7 \
             WHERE (SELECT count(*) FROM a2a_push_configs \
                    WHERE team_id = $1 AND turn_id = $2 AND id <> $3) < $8 \
             ON CONFLICT (team_id, turn_id, id) DO UPDATE SET url = EXCLUDED.url, \
               token = EXCLUDED.token, auth_scheme = EXCLUDED.auth_scheme, \
               auth_credentials = EXCLUDED.auth_credentials \
             RETURNING {PUSH_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(config.turn.0)
            .bind(&config.id)
            .bind(&config.url)
            .bind(config.token.as_deref())
            .bind(config.auth_scheme.as_deref())
            .bind(config.auth_credentials.as_deref())
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
        push_from_row(&row)
    }

    /// The task's configs, oldest first.
    pub async fn push_configs(
        &self,
        team: TeamId,
        turn: TurnId,
    ) -> Result<Vec<PushConfig>, StoreError> {
        let sql = format!(
            "SELECT {PUSH_COLUMNS} FROM a2a_push_configs WHERE team_id = $1 AND turn_id = $2 \
             ORDER BY created_at, id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(turn.0)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(push_from_row).collect()
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
