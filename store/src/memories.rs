//! Durable notes per agent (SPEC M2): written and searched by the model's tools, recalled
//! into each turn's prompt (M3), listed, changed and deleted by people (M4).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use protocol::{AgentId, ChatId, TeamId, TurnId};
use sqlx::Row;
use uuid::Uuid;

use super::audit::{self, Action, Actor};
use super::{Keyset, Store, StoreError};

/// The tool call that writes a row (D3): a brain tool's write is a transaction keyed by
/// it, so running the call again after a takeover finds the first run's row.
#[derive(Clone, Copy, Debug)]
pub struct CallKey<'a> {
    pub turn: TurnId,
    pub call: &'a str,
}

impl Store {
    /// Stores a note made by `call` in `chat`, or answers the note an earlier run of `call`
    /// made. A note made in an end user's chat is that user's (X1); in a chat an API key
    /// opened, the agent's.
    pub async fn write_memory(
        &self,
        team: TeamId,
        agent: AgentId,
        chat: ChatId,
        content: &str,
        call: CallKey<'_>,
    ) -> Result<Uuid, StoreError> {
        // The select reads the statement's snapshot, so it sees only an earlier run's row
        // and the insert's own `RETURNING` answers a new one: exactly one of them is there.
        let (id,): (Uuid,) = sqlx::query_as(
            "WITH made AS ( \
               INSERT INTO memories (id, team_id, agent_id, content, turn_id, call_id, user_id) \
               VALUES ($1, $2, $3, $4, $5, $6, \
                       (SELECT created_by FROM chats WHERE team_id = $2 AND id = $7)) \
               ON CONFLICT (turn_id, call_id) WHERE turn_id IS NOT NULL DO NOTHING \
               RETURNING id) \
             SELECT id FROM made \
             UNION ALL \
             SELECT id FROM memories WHERE turn_id = $5 AND call_id = $6 AND team_id = $2 \
             LIMIT 1",
        )
        .bind(Uuid::now_v7())
        .bind(team.0)
        .bind(agent.0)
        .bind(content)
        .bind(call.turn.0)
        .bind(call.call)
        .bind(chat.0)
        .fetch_one(&self.pool)
        .await?;
        self.unremembered.forget_agent(agent);
        Ok(id)
    }

    /// Notes matching any word of `query` that a turn in `chat` may recall (the agent's,
    /// and the chat's user's own), best first.
    pub async fn search_memory(
        &self,
        team: TeamId,
        agent: AgentId,
        chat: ChatId,
        query: &str,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        // OR of the words: a note about "deploy friday" should match "when do we deploy".
        let rows: Vec<(String,)> = sqlx::query_as(
            "WITH q AS (SELECT to_tsquery('simple', string_agg(quote_literal(w), ' | ')) AS q \
                        FROM regexp_split_to_table(lower($3), '[^[:alnum:]]+') AS w WHERE w <> '') \
             SELECT content FROM memories, q \
             WHERE team_id = $1 AND agent_id = $2 AND q.q IS NOT NULL AND search @@ q.q \
               AND (user_id IS NULL OR user_id = \
                    (SELECT created_by FROM chats WHERE team_id = $1 AND id = $5)) \
             ORDER BY ts_rank(search, q.q) DESC, created_at DESC LIMIT $4",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(query)
        .bind(limit)
        .bind(chat.0)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(c,)| c).collect())
    }
}

/// How long a recall scope found without memories is taken to have none: a memory written
/// through another replica is recalled at most this late by an agent that had none in
/// that scope (one written through this replica, at once).
const UNREMEMBERED_FOR: Duration = Duration::from_secs(30);
/// The most scopes kept; past it the expired ones go, then all.
const UNREMEMBERED_SCOPES: usize = 10_000;

/// The recall scopes (an agent, and a chat owner or none) a recall lately found without
/// a memory, so the turns of an agent that remembers nothing cost no round trip (M3).
#[derive(Clone, Debug, Default)]
pub(super) struct Unremembered(Arc<Mutex<HashMap<RecallScope, Instant>>>);

/// An agent, and the owner of the chat a turn runs in (`None`: a key opened it).
type RecallScope = (AgentId, Option<String>);

impl Unremembered {
    fn knows(&self, agent: AgentId, owner: Option<&str>) -> bool {
        let found = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        found
            .get(&(agent, owner.map(str::to_owned)))
            .is_some_and(|at| at.elapsed() < UNREMEMBERED_FOR)
    }

    fn remember(&self, agent: AgentId, owner: Option<&str>) {
        let mut found = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if found.len() >= UNREMEMBERED_SCOPES {
            found.retain(|_, at| at.elapsed() < UNREMEMBERED_FOR);
            if found.len() >= UNREMEMBERED_SCOPES {
                found.clear();
            }
        }
        found.insert((agent, owner.map(str::to_owned)), Instant::now());
    }

    fn forget_agent(&self, agent: AgentId) {
        let mut found = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        found.retain(|(a, _), _| *a != agent);
    }
}

/// A memory as people manage it (M4): what it says, whose it is and where it came from.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct MemoryRow {
    pub id: Uuid,
    pub agent_id: AgentId,
    pub content: String,
    /// The end user it belongs to (a memory written in a chat a JWT user opened); `null`
    /// for the agent's own, recalled in every chat.
    pub user_id: Option<String>,
    /// The chat whose turn wrote it; `null` once that chat is erased, or for a note older
    /// than its turn's record.
    pub chat_id: Option<ChatId>,
    /// The turn that wrote it.
    pub turn_id: Option<TurnId>,
    pub created_at: DateTime<Utc>,
}

/// Whose memories a caller manages (M4), decided by `engine::memories` from its principal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryScope<'a> {
    /// Every memory of the team's agents: an admin.
    All,
    /// Only the agent's own (`user_id` null).
    AgentWide,
    /// Only this end user's.
    User(&'a str),
}

impl MemoryScope<'_> {
    /// As two SQL parameters: whether every row is in scope, else the `user_id` rows must
    /// have (`NULL`: the agent's own).
    fn params(self) -> (bool, Option<String>) {
        match self {
            Self::All => (true, None),
            Self::AgentWide => (false, None),
            Self::User(user) => (false, Some(user.to_owned())),
        }
    }
}

/// The condition of [`MemoryScope::params`] bound as `$all` and `$user` on `m`.
fn in_scope(all: &str, user: &str) -> String {
    format!("({all}::bool OR m.user_id IS NOT DISTINCT FROM {user}::text)")
}

const MEMORY_COLUMNS: &str = "m.id, m.agent_id, m.content, m.user_id, m.turn_id, m.created_at, \
    (SELECT t.chat_id FROM turns t WHERE t.team_id = m.team_id AND t.id = m.turn_id) AS chat_id";

fn memory_from_row(row: &sqlx::postgres::PgRow) -> Result<MemoryRow, sqlx::Error> {
    Ok(MemoryRow {
        id: row.try_get("id")?,
        agent_id: AgentId(row.try_get("agent_id")?),
        content: row.try_get("content")?,
        user_id: row.try_get("user_id")?,
        chat_id: row.try_get::<Option<Uuid>, _>("chat_id")?.map(ChatId),
        turn_id: row.try_get::<Option<Uuid>, _>("turn_id")?.map(TurnId),
        created_at: row.try_get("created_at")?,
    })
}

impl Store {
    /// The notes a turn's prompt recalls (M3): of the agent's own and `owner`'s (the chat's
    /// end user; `None` for a chat a key opened), those matching a word of `query` best
    /// first, then the newest, at most `limit`, each at most `max_chars` long. One round
    /// trip, none at all for a scope found without memories lately.
    pub async fn recall_memories(
        &self,
        team: TeamId,
        agent: AgentId,
        owner: Option<&str>,
        query: &str,
        max_chars: i64,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        if self.unremembered.knows(agent, owner) {
            return Ok(Vec::new());
        }
        // Two index scans (the words through `memories_search`, the newest through
        // `memories_agent`), not a rank of every note: an agent may remember thousands.
        // A note too long for the budget is read as `NULL`, so that a scope whose notes
        // are all too long still counts as having some.
        let rows: Vec<(Uuid, Option<String>)> = sqlx::query_as(
            "WITH q AS (SELECT to_tsquery('simple', string_agg(quote_literal(w), ' | ')) AS q \
                        FROM regexp_split_to_table(lower($4), '[^[:alnum:]]+') AS w WHERE w <> '') \
             (SELECT m.id, m.content FROM memories m, q \
              WHERE m.team_id = $1 AND m.agent_id = $2 AND q.q IS NOT NULL AND m.search @@ q.q \
                AND (m.user_id IS NULL OR m.user_id = $3) AND length(m.content) <= $5 \
              ORDER BY ts_rank(m.search, q.q) DESC, m.created_at DESC LIMIT $6) \
             UNION ALL \
             (SELECT m.id, CASE WHEN length(m.content) <= $5 THEN m.content END \
              FROM memories m \
              WHERE m.team_id = $1 AND m.agent_id = $2 AND (m.user_id IS NULL OR m.user_id = $3) \
              ORDER BY m.created_at DESC LIMIT $6)",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(owner)
        .bind(query)
        .bind(max_chars)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        if rows.is_empty() {
            self.unremembered.remember(agent, owner);
        }
        let mut seen = std::collections::HashSet::new();
        Ok(rows
            .into_iter()
            .filter_map(|(id, content)| content.filter(|_| seen.insert(id)))
            .take(usize::try_from(limit).unwrap_or(0))
            .collect())
    }

    /// The agent's memories in `scope`, newest first, at most `limit` before `before`.
    /// `NotFound` for an unknown or another team's agent.
    pub async fn memories(
        &self,
        team: TeamId,
        agent: AgentId,
        scope: MemoryScope<'_>,
        before: Option<Keyset>,
        limit: i64,
    ) -> Result<Vec<MemoryRow>, StoreError> {
        self.agent(team, agent).await?;
        let (all, user) = scope.params();
        let sql = format!(
            "SELECT {MEMORY_COLUMNS} FROM memories m \
             WHERE m.team_id = $1 AND m.agent_id = $2 AND {} AND {} \
             ORDER BY m.created_at DESC, m.id DESC LIMIT $5",
            in_scope("$3", "$4"),
            super::keyset_after("<", "$6", "$7"),
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(agent.0)
            .bind(all)
            .bind(user)
            .bind(limit)
            .bind(before.map(|k| k.at))
            .bind(before.map(|k| k.id))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| memory_from_row(r).map_err(StoreError::from))
            .collect()
    }

    /// Replaces a memory's content, recorded `memory.updated` in the audit log (L5) on the
    /// same transaction. `NotFound` for a memory outside `scope` or another team's.
    pub async fn update_memory(
        &self,
        team: TeamId,
        id: Uuid,
        scope: MemoryScope<'_>,
        content: &str,
        by: &Actor,
    ) -> Result<MemoryRow, StoreError> {
        let (all, user) = scope.params();
        let sql = format!(
            "WITH changed AS (UPDATE memories m SET content = $5 \
               WHERE m.team_id = $1 AND m.id = $2 AND {} RETURNING m.*) \
             SELECT {MEMORY_COLUMNS} FROM changed m",
            in_scope("$3", "$4"),
        );
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(id)
            .bind(all)
            .bind(user)
            .bind(content)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let memory = memory_from_row(&row)?;
        let details = serde_json::json!({ "agent_id": memory.agent_id, "fields": ["content"] });
        audit::record(&mut tx, team, by, Action::MemoryUpdated, id, details).await?;
        tx.commit().await?;
        Ok(memory)
    }

    /// Deletes a memory, recorded `memory.deleted` in the audit log (L5) on the same
    /// transaction. `NotFound` for a memory outside `scope` or another team's.
    pub async fn delete_memory(
        &self,
        team: TeamId,
        id: Uuid,
        scope: MemoryScope<'_>,
        by: &Actor,
    ) -> Result<(), StoreError> {
        let (all, user) = scope.params();
        let sql = format!(
            "DELETE FROM memories m WHERE m.team_id = $1 AND m.id = $2 AND {} \
             RETURNING m.agent_id",
            in_scope("$3", "$4"),
        );
        let mut tx = self.pool.begin().await?;
        let (agent,): (Uuid,) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(id)
            .bind(all)
            .bind(user)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let details = serde_json::json!({ "agent_id": agent });
        audit::record(&mut tx, team, by, Action::MemoryDeleted, id, details).await?;
        tx.commit().await?;
        Ok(())
    }
}
