//! Durable notes per agent (SPEC M2).

use protocol::{AgentId, TeamId};
use uuid::Uuid;

use super::{Store, StoreError};

impl Store {
    pub async fn write_memory(
        &self,
        team: TeamId,
        agent: AgentId,
        content: &str,
    ) -> Result<Uuid, StoreError> {
        let id = Uuid::now_v7();
        sqlx::query(
            "INSERT INTO memories (id, team_id, agent_id, content) VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(team.0)
        .bind(agent.0)
        .bind(content)
        .execute(&self.pool)
        .await?;
        Ok(id)
    }

    /// Notes matching any word of `query`, best first.
    pub async fn search_memory(
        &self,
        team: TeamId,
        agent: AgentId,
        query: &str,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        // OR of the words: a note about "deploy friday" should match "when do we deploy".
        let rows: Vec<(String,)> = sqlx::query_as(
            "WITH q AS (SELECT to_tsquery('simple', string_agg(quote_literal(w), ' | ')) AS q \
                        FROM regexp_split_to_table(lower($3), '[^[:alnum:]]+') AS w WHERE w <> '') \
             SELECT content FROM memories, q \
             WHERE team_id = $1 AND agent_id = $2 AND q.q IS NOT NULL AND search @@ q.q \
             ORDER BY ts_rank(search, q.q) DESC, created_at DESC LIMIT $4",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(query)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(c,)| c).collect())
    }
}
