//! Durable notes per agent (SPEC M2).

use protocol::{AgentId, ChatId, TeamId, TurnId};
use uuid::Uuid;

use super::{Store, StoreError};

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
