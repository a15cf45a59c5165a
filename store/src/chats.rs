//! Chats and their messages.

use chrono::{DateTime, Utc};
use protocol::parts::Part;
use protocol::{AgentId, ChatId, MessageId, TeamId, TurnId};
use sqlx::Row;
use sqlx::types::Json;

use super::agents::agent_from_row;
use super::{AgentRow, Store, StoreError};

/// Who may see a chat ([`Store::chat_owner`]).
#[derive(Clone, Debug)]
pub struct ChatOwner {
    /// The user who opened it (a JWT's subject); `None` for a key's or the agent's own.
    pub created_by: Option<String>,
    /// The agent's autostart chat.
    pub autostart: bool,
}

#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ChatRow {
    pub id: ChatId,
    pub agent_id: AgentId,
    pub summary: String,
    /// The summary covers every message with `seq <= summary_through` (M1).
    pub summary_through: i64,
    /// The JWT user who opened the chat; `None` when an API key did.
    pub created_by: Option<String>,
    /// The agent's autostart chat: only admins read or write it (X1).
    pub autostart: bool,
    /// A short title, generated after the chat's first turn or set by a person (T17);
    /// `null` until then.
    pub title: Option<String>,
    pub created_at: DateTime<Utc>,
}

pub(super) const CHAT_COLUMNS: &str =
    "id, agent_id, summary, summary_through, created_by, autostart, title, created_at";

pub(super) fn chat_from_row(row: &sqlx::postgres::PgRow) -> Result<ChatRow, sqlx::Error> {
    Ok(ChatRow {
        id: ChatId(row.try_get("id")?),
        agent_id: AgentId(row.try_get("agent_id")?),
        summary: row.try_get("summary")?,
        summary_through: row.try_get("summary_through")?,
        created_by: row.try_get("created_by")?,
        autostart: row.try_get("autostart")?,
        title: row.try_get("title")?,
        created_at: row.try_get("created_at")?,
    })
}

/// What a turn's intake reads about its chat, in one round trip.
#[derive(Clone, Debug)]
pub struct TurnBasis {
    pub chat: ChatRow,
    pub agent: AgentRow,
    /// Whether any connector applies to the agent; when none does, the turn skips
    /// reading them.
    pub has_connectors: bool,
    /// Whether a tool call of the chat waits for a person (A4: a new message denies it).
    pub has_pending_approvals: bool,
    /// The rows' `basis_version`s when read: what the intake checks a kept basis against.
    pub versions: BasisVersions,
}

/// The `basis_version` of a chat and of its agent: bumped by any change of a column a
/// turn reads (migration 0038), so equal versions mean an equal basis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BasisVersions {
    pub chat: i64,
    pub agent: i64,
}

impl TurnBasis {
    /// What the intake checks on its own snapshot before it writes a turn from this
    /// basis: the versions, the connectors' presence, and that no call waits for a person
    /// (a new message has denied those it knew of, A4).
    pub fn check(&self) -> BasisCheck {
        BasisCheck {
            versions: self.versions,
            has_connectors: self.has_connectors,
            history: None,
        }
    }
}

/// See [`TurnBasis::check`].
#[derive(Clone, Copy, Debug)]
pub struct BasisCheck {
    pub versions: BasisVersions,
    pub has_connectors: bool,
    /// With a kept history, the intake reads only what follows it, and checks it.
    pub history: Option<KeptHistoryCheck>,
}

/// A history kept with a basis: its messages are the `count` complete or interrupted ones
/// with `seq` in (`summary_through`, `through`]. Changed or deleted messages bump the
/// chat's version (migration 0039); the count catches one written late with an earlier
/// `seq` (two writers of one chat at once, as when Redis is down and turns run without
/// their hold).
#[derive(Clone, Copy, Debug)]
pub struct KeptHistoryCheck {
    pub through: i64,
    pub count: i64,
}

/// A stored message. `parts` are UI message parts as the AI SDK shapes them.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct MessageRow {
    pub id: MessageId,
    #[serde(skip)]
    pub seq: i64,
    pub turn_id: TurnId,
    pub role: String,
    #[schema(value_type = Value)]
    pub parts: Vec<Part>,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_message_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

pub(super) fn message_from_row(row: &sqlx::postgres::PgRow) -> Result<MessageRow, sqlx::Error> {
    Ok(MessageRow {
        id: MessageId(row.try_get("id")?),
        seq: row.try_get("seq")?,
        turn_id: TurnId(row.try_get("turn_id")?),
        role: row.try_get("role")?,
        parts: row.try_get::<Json<Vec<Part>>, _>("parts")?.0,
        status: row.try_get("status")?,
        client_message_id: row.try_get("client_message_id")?,
        created_at: row.try_get("created_at")?,
    })
}

pub(super) const MESSAGE_COLUMNS: &str =
    "id, seq, turn_id, role, parts, status, client_message_id, created_at";

impl Store {
    /// A new chat with the team's agent, opened by `created_by` (a JWT user; `None` for
    /// an API key).
    pub async fn create_chat(
        &self,
        team: TeamId,
        agent: AgentId,
        created_by: Option<&str>,
    ) -> Result<ChatRow, StoreError> {
        // The insert selects from agents so that another team's agent id finds nothing.
        let sql = format!(
            "INSERT INTO chats (id, team_id, agent_id, created_by) \
             SELECT $1, team_id, id, $4 FROM agents WHERE team_id = $2 AND id = $3 AND archived_at IS NULL \
             RETURNING {CHAT_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(ChatId::new().0)
            .bind(team.0)
            .bind(agent.0)
            .bind(created_by)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        Ok(chat_from_row(&row)?)
    }

    /// The chat of a client-named thread (an AG-UI `threadId`, P3): the team's chat of that
    /// id when there is one, else the chat [`ChatId::of_thread`] derives from the team and
    /// the thread, created for `agent` on first use. A chat of that id in another team is
    /// never met, so whether one exists never shows. Answers the chat as it is, whichever
    /// agent it belongs to: the caller checks that. `NotFound` when the chat is new and the
    /// agent unknown or archived.
    pub async fn open_chat(
        &self,
        team: TeamId,
        agent: AgentId,
        thread: ChatId,
        created_by: Option<&str>,
    ) -> Result<ChatRow, StoreError> {
        // The statement's snapshot does not see its own insert: the union is the team's
        // chat of the thread's id, the new derived row or the derived one that was there,
        // never two.
        let sql = format!(
            "WITH own AS (SELECT {CHAT_COLUMNS} FROM chats WHERE team_id = $2 AND id = $1), \
             new AS (INSERT INTO chats (id, team_id, agent_id, created_by) \
               SELECT $5, team_id, id, $4 FROM agents \
               WHERE team_id = $2 AND id = $3 AND archived_at IS NULL \
                 AND NOT EXISTS (SELECT 1 FROM own) \
               ON CONFLICT (id) DO NOTHING RETURNING {CHAT_COLUMNS}) \
             SELECT * FROM own UNION ALL SELECT * FROM new \
             UNION ALL SELECT {CHAT_COLUMNS} FROM chats \
               WHERE team_id = $2 AND id = $5 AND NOT EXISTS (SELECT 1 FROM own)"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(thread.0)
            .bind(team.0)
            .bind(agent.0)
            .bind(created_by)
            .bind(ChatId::of_thread(team, thread.0).0)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        Ok(chat_from_row(&row)?)
    }

    /// The agent's chats, newest first, at most `limit`; with `created_by`, only that
    /// user's. `NotFound` for an unknown or another team's agent.
    pub async fn chats(
        &self,
        team: TeamId,
        agent: AgentId,
        created_by: Option<&str>,
        with_autostart: bool,
        before: Option<super::Keyset>,
        limit: i64,
    ) -> Result<Vec<ChatRow>, StoreError> {
        self.agent(team, agent).await?;
        let sql = format!(
            "SELECT {CHAT_COLUMNS} FROM chats \
             WHERE team_id = $1 AND agent_id = $2 AND ($3::text IS NULL OR created_by = $3) \
               AND ($7 OR NOT autostart) \
               AND {} ORDER BY created_at DESC, id DESC LIMIT $4",
            super::keyset_after("<", "$5", "$6")
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(agent.0)
            .bind(created_by)
            .bind(limit)
            .bind(before.map(|k| k.at))
            .bind(before.map(|k| k.id))
            .bind(with_autostart)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| chat_from_row(r).map_err(StoreError::from))
            .collect()
    }

    /// A chat with its agent, in one round trip (the turn's intake needs both).
    pub async fn chat_with_agent(
        &self,
        team: TeamId,
        chat: ChatId,
    ) -> Result<TurnBasis, StoreError> {
        let row = sqlx::query(
            "SELECT c.id AS chat_id, c.summary, c.summary_through, c.created_by, c.autostart, \
                    c.title, c.created_at AS chat_created_at, \
                    a.id, a.team_id, a.name, a.system_prompt, a.model, a.fallback_models, \
                    a.runtime_profile, a.autostart_cron, a.autostart_prompt, a.autostart_timezone, \
                    a.archived_at IS NOT NULL AS archived, a.concierge, a.approval_policy, \
                    a.disconnect_policy, a.busy_policy, a.auxiliary_models, a.stream_reasoning, \
                    a.memory_recall, a.knowledge_bases, a.knowledge_recall, a.skills, a.delegates, a.egress, a.created_at, \
                    c.basis_version AS chat_version, a.basis_version AS agent_version, \
                    EXISTS (SELECT 1 FROM approvals p WHERE p.team_id = c.team_id \
                            AND p.chat_id = c.id AND p.state = 'pending') AS has_pending_approvals, \
                    EXISTS (SELECT 1 FROM connectors k WHERE k.team_id = c.team_id \
                            AND (k.agent_id IS NULL OR k.agent_id = a.id)) AS has_connectors \
             FROM chats c JOIN agents a ON a.team_id = c.team_id AND a.id = c.agent_id \
             WHERE c.team_id = $1 AND c.id = $2",
        )
        .bind(team.0)
        .bind(chat.0)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        let agent = agent_from_row(&row)?;
        let chat = ChatRow {
            id: ChatId(row.try_get("chat_id")?),
            agent_id: agent.id,
            summary: row.try_get("summary")?,
            summary_through: row.try_get("summary_through")?,
            created_by: row.try_get("created_by")?,
            autostart: row.try_get("autostart")?,
            title: row.try_get("title")?,
            created_at: row.try_get("chat_created_at")?,
        };
        Ok(TurnBasis {
            chat,
            agent,
            has_connectors: row.try_get("has_connectors")?,
            has_pending_approvals: row.try_get("has_pending_approvals")?,
            versions: BasisVersions {
                chat: row.try_get("chat_version")?,
                agent: row.try_get("agent_version")?,
            },
        })
    }

    /// A page of a chat's transcript: the newest `limit` messages with `seq < before`
    /// (all of them without `before`), in transcript order, and whether older ones
    /// remain. A keyset on `seq` (the `messages_seq` index), so a page costs the same at
    /// any depth. One round trip; `NotFound` for another team's chat.
    pub async fn message_page(
        &self,
        team: TeamId,
        chat: ChatId,
        before: Option<i64>,
        limit: i64,
    ) -> Result<(Vec<MessageRow>, bool), StoreError> {
        // The chat row comes first so that an empty chat answers one row of NULLs and a
        // missing one none; one extra message tells whether older ones remain.
        let sql = format!(
            "SELECT m.* FROM chats c LEFT JOIN LATERAL ( \
               SELECT {MESSAGE_COLUMNS} FROM messages \
               WHERE team_id = c.team_id AND chat_id = c.id \
                 AND ($3::int8 IS NULL OR seq < $3) \
               ORDER BY seq DESC LIMIT $4 + 1) m ON true \
             WHERE c.team_id = $1 AND c.id = $2"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(chat.0)
            .bind(before)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        if rows.is_empty() {
            return Err(StoreError::NotFound);
        }
        let mut page = Vec::with_capacity(rows.len());
        for row in &rows {
            if row.try_get::<Option<uuid::Uuid>, _>("id")?.is_some() {
                page.push(message_from_row(row)?);
            }
        }
        let more = page.len() as i64 > limit;
        page.truncate(usize::try_from(limit).unwrap_or(0));
        page.reverse();
        Ok((page, more))
    }

    /// Messages with `seq > after`, oldest first: the tail a turn sends to the model.
    pub async fn messages_after(
        &self,
        team: TeamId,
        chat: ChatId,
        after: i64,
    ) -> Result<Vec<MessageRow>, StoreError> {
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages \
             WHERE team_id = $1 AND chat_id = $2 AND seq > $3 \
               AND status IN ('complete', 'interrupted') ORDER BY seq"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(chat.0)
            .bind(after)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| message_from_row(r).map_err(StoreError::from))
            .collect()
    }
}

impl Store {
    /// The user who opened the team's chat (`None`: an API key did); `NotFound` for an
    /// unknown or another team's chat.
    /// Who may see a chat: its opener, and whether it is an agent's autostart chat,
    /// which only admins see (X1).
    pub async fn chat_owner(&self, team: TeamId, chat: ChatId) -> Result<ChatOwner, StoreError> {
        let row: Option<(Option<String>, bool)> = sqlx::query_as(
            "SELECT created_by, autostart FROM chats WHERE team_id = $1 AND id = $2",
        )
        .bind(team.0)
        .bind(chat.0)
        .fetch_optional(&self.pool)
        .await?;
        let (created_by, autostart) = row.ok_or(StoreError::NotFound)?;
        Ok(ChatOwner {
            created_by,
            autostart,
        })
    }

    pub async fn chat_created_by(
        &self,
        team: TeamId,
        chat: ChatId,
    ) -> Result<Option<String>, StoreError> {
        let row: Option<(Option<String>,)> =
            sqlx::query_as("SELECT created_by FROM chats WHERE team_id = $1 AND id = $2")
                .bind(team.0)
                .bind(chat.0)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|(by,)| by).ok_or(StoreError::NotFound)
    }

    /// Folds messages up to `through` into the running summary, unless another writer
    /// moved the summary since `expected_through` was read (then nothing changes and the
    /// answer is `false`).
    pub async fn advance_summary(
        &self,
        team: TeamId,
        chat: ChatId,
        expected_through: i64,
        through: i64,
        summary: &str,
    ) -> Result<bool, StoreError> {
        let updated = sqlx::query(
            "UPDATE chats SET summary = $4, summary_through = $5 \
             WHERE team_id = $1 AND id = $2 AND summary_through = $3",
        )
        .bind(team.0)
        .bind(chat.0)
        .bind(expected_through)
        .bind(summary)
        .bind(through)
        .execute(&self.pool)
        .await?;
        Ok(updated.rows_affected() == 1)
    }

    /// Stores a generated title unless the chat has one (T17): a person's rename, or a
    /// generation that landed first, wins. Answers whether it was stored.
    pub async fn set_generated_title(
        &self,
        team: TeamId,
        chat: ChatId,
        title: &str,
    ) -> Result<bool, StoreError> {
        let updated = sqlx::query(
            "UPDATE chats SET title = $3 WHERE team_id = $1 AND id = $2 AND title IS NULL",
        )
        .bind(team.0)
        .bind(chat.0)
        .bind(title)
        .execute(&self.pool)
        .await?;
        Ok(updated.rows_affected() == 1)
    }

    /// A person's title for the chat (T17); `NotFound` for an unknown or another team's
    /// chat.
    pub async fn rename_chat(
        &self,
        team: TeamId,
        chat: ChatId,
        title: &str,
    ) -> Result<ChatRow, StoreError> {
        let sql = format!(
            "UPDATE chats SET title = $3 WHERE team_id = $1 AND id = $2 RETURNING {CHAT_COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(chat.0)
            .bind(title)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        Ok(chat_from_row(&row)?)
    }
}
