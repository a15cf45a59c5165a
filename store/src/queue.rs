//! Queued turns (T13): a message accepted while its agent was busy, stored at once as a
//! `queued` turn row and its user message (`queued`, which no model reads), started in the
//! order accepted once the agent is free, or withdrawn.

use protocol::parts::Part;
use protocol::{AgentId, ChatId, ErrorCode, MessageId, ReplicaId, TeamId, TurnId};
use sqlx::Row;
use sqlx::types::Json;

use super::chats::{MESSAGE_COLUMNS, message_from_row};
use super::{FrozenComposition, MessageRow, Store, StoreError, unique_violation};

/// A message to queue for a busy agent.
#[derive(Debug)]
pub struct NewQueued<'a> {
    pub id: TurnId,
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    pub user_parts: &'a [Part],
    pub client_message_id: Option<&'a str>,
    /// P9: the caller's own instructions for the turn, kept until it starts.
    pub instructions: Option<&'a str>,
    /// Whose authority the turn's tools act with when it runs (X1).
    pub actor: &'a str,
    pub actor_admin: bool,
    /// The most queued turns the agent may have; past it nothing is written.
    pub max: u32,
    /// The most of them `actor` may have.
    pub max_per_actor: u32,
}

/// A queued turn's place: its user message and its position (1 = next).
#[derive(Clone, Copy, Debug)]
pub struct Enqueued {
    pub message_id: MessageId,
    pub position: u32,
}

/// The agent's next queued turn, as its start needs it.
#[derive(Clone, Debug)]
pub struct QueuedTurn {
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    pub turn: TurnId,
    pub actor: Option<String>,
    pub actor_admin: bool,
    /// Its message's text, for the admission's reservation.
    pub content: String,
    /// P9: the caller's own instructions for the turn, as queued.
    pub instructions: Option<String>,
}

/// The order queued turns run in; `q` is the table's alias.
const QUEUE_ORDER: &str = "q.queued_at, q.id";

impl Store {
    /// Writes a queued turn and its user message, unless the agent has `max` queued turns
    /// already (`Conflict("queue_full")`) or the client message id is taken
    /// (`Conflict("message_id")`). The agent's row is locked for the count, so two
    /// messages queued at once cannot both take the last place.
    pub async fn enqueue_turn(&self, new: NewQueued<'_>) -> Result<Enqueued, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT 1 FROM agents WHERE team_id = $1 AND id = $2 FOR NO KEY UPDATE")
            .bind(new.team.0)
            .bind(new.agent.0)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let (waiting, theirs): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE actor = $2) FROM turns \
             WHERE agent_id = $1 AND status = 'queued'",
        )
        .bind(new.agent.0)
        .bind(new.actor)
        .fetch_one(&mut *tx)
        .await?;
        if waiting >= i64::from(new.max) || theirs >= i64::from(new.max_per_actor) {
            return Err(StoreError::Conflict("queue_full"));
        }
        sqlx::query(
            "INSERT INTO turns (id, team_id, agent_id, chat_id, trigger, status, background, \
               actor, actor_admin, queued_at, instructions) \
             VALUES ($1, $2, $3, $4, 'user', 'queued', true, $5, $6, clock_timestamp(), $7)",
        )
        .bind(new.id.0)
        .bind(new.team.0)
        .bind(new.agent.0)
        .bind(new.chat.0)
        .bind(new.actor)
        .bind(new.actor_admin)
        .bind(new.instructions)
        .execute(&mut *tx)
        .await?;
        let message = MessageId::new();
        sqlx::query(
            "INSERT INTO messages (id, team_id, chat_id, turn_id, role, parts, status, \
               client_message_id) VALUES ($1, $2, $3, $4, 'user', $5, 'queued', $6)",
        )
        .bind(message.0)
        .bind(new.team.0)
        .bind(new.chat.0)
        .bind(new.id.0)
        .bind(Json(new.user_parts))
        .bind(new.client_message_id)
        .execute(&mut *tx)
        .await
        .map_err(|e| unique_violation(e, "messages_client_id", "message_id"))?;
        tx.commit().await?;
        Ok(Enqueued {
            message_id: message,
            position: u32::try_from(waiting + 1).unwrap_or(u32::MAX),
        })
    }

    /// The agent's next queued turn, `None` when none waits.
    pub async fn next_queued(
        &self,
        team: TeamId,
        agent: AgentId,
    ) -> Result<Option<QueuedTurn>, StoreError> {
        let sql = format!(
            "SELECT q.id, q.chat_id, q.actor, q.actor_admin, q.instructions, \
               (SELECT coalesce(string_agg(p->>'text', ''), '') FROM messages m, \
                  jsonb_array_elements(m.parts) p \
                WHERE m.team_id = q.team_id AND m.turn_id = q.id AND m.role = 'user') AS content \
             FROM turns q WHERE q.team_id = $1 AND q.agent_id = $2 AND q.status = 'queued' \
             ORDER BY {QUEUE_ORDER} LIMIT 1"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(agent.0)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(QueuedTurn {
            team,
            agent,
            chat: ChatId(row.try_get("chat_id")?),
            turn: TurnId(row.try_get("id")?),
            actor: row.try_get("actor")?,
            actor_admin: row.try_get("actor_admin")?,
            content: row.try_get("content")?,
            instructions: row.try_get("instructions")?,
        }))
    }

    /// The agents with queued turns, of every team: what the reconcile tick starts. An
    /// agent whose turn is still `running` is left out: that turn may be a dead replica's,
    /// waiting to be taken over, and the agent's queue goes on once it ends (its wrap-up
    /// kicks the queue), never before it.
    pub async fn agents_with_queue(&self) -> Result<Vec<(TeamId, AgentId)>, StoreError> {
        let rows: Vec<(uuid::Uuid, uuid::Uuid)> = sqlx::query_as(
            "SELECT DISTINCT q.team_id, q.agent_id FROM turns q WHERE q.status = 'queued' \
             AND NOT EXISTS (SELECT 1 FROM turns r WHERE r.team_id = q.team_id \
                               AND r.agent_id = q.agent_id AND r.status = 'running') \
             LIMIT 1000",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(team, agent)| (TeamId(team), AgentId(agent)))
            .collect())
    }

    /// Starts a queued turn on `replica`: its composition frozen (T3), its user message
    /// moved to the end of the transcript (it follows the answers of the turns before it)
    /// and made `complete`; answers the chat's messages after `history_after` ending with
    /// it, as [`Store::begin_turn`] does. `None` when it is no longer queued (withdrawn,
    /// or started by another replica).
    pub async fn begin_queued_turn(
        &self,
        team: TeamId,
        turn: TurnId,
        replica: ReplicaId,
        composition: &FrozenComposition,
        history_after: i64,
    ) -> Result<Option<Vec<MessageRow>>, StoreError> {
        let sql = format!(
            "WITH c AS ( \
               INSERT INTO compositions (team_id, hash, body) \
               SELECT $1, $4, $5::text::jsonb \
               WHERE NOT EXISTS (SELECT 1 FROM compositions WHERE team_id = $1 AND hash = $4) \
               ON CONFLICT DO NOTHING), \
             t AS ( \
               UPDATE turns SET status = 'running', replica_id = $3, composition_hash = $4, \
                 started_at = now() \
               WHERE team_id = $1 AND id = $2 AND status = 'queued' RETURNING id, chat_id), \
             m AS ( \
               UPDATE messages SET seq = DEFAULT, status = 'complete' \
               WHERE team_id = $1 AND turn_id = (SELECT id FROM t) AND role = 'user' \
               RETURNING {MESSAGE_COLUMNS}) \
             SELECT true AS started, {MESSAGE_COLUMNS} FROM messages \
             WHERE team_id = $1 AND chat_id = (SELECT chat_id FROM t) AND seq > $6 \
               AND status IN ('complete', 'interrupted') \
             UNION ALL SELECT true, {MESSAGE_COLUMNS} FROM m \
             UNION ALL SELECT EXISTS (SELECT 1 FROM t), NULL, NULL, NULL, NULL, NULL, NULL, \
               NULL, NULL \
             ORDER BY seq NULLS FIRST"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(turn.0)
            .bind(replica.0)
            .bind(composition.hash())
            .bind(composition.text())
            .bind(history_after)
            .fetch_all(&self.pool)
            .await?;
        // The first row says whether the turn started; the messages follow.
        let Some((first, messages)) = rows.split_first() else {
            return Ok(None);
        };
        if !first.try_get::<bool, _>("started")? {
            return Ok(None);
        }
        messages
            .iter()
            .map(|r| message_from_row(r).map_err(StoreError::from))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// Ends a queued turn that never ran: `withdrawn` (a stop) or `failed` with `code`
    /// (refused at its start, a quota), its message kept and marked `withdrawn`. Answers
    /// whether it was still queued.
    pub async fn end_queued(
        &self,
        team: TeamId,
        turn: TurnId,
        code: Option<ErrorCode>,
    ) -> Result<bool, StoreError> {
        let (ended,): (bool,) = sqlx::query_as(
            "WITH t AS ( \
               UPDATE turns SET status = CASE WHEN $3::text IS NULL THEN 'withdrawn' \
                 ELSE 'failed' END, error_code = $3, finished_at = now() \
               WHERE team_id = $1 AND id = $2 AND status = 'queued' RETURNING id), \
             m AS ( \
               UPDATE messages SET status = 'withdrawn' \
               WHERE team_id = $1 AND turn_id = (SELECT id FROM t) AND role = 'user') \
             SELECT EXISTS (SELECT 1 FROM t)",
        )
        .bind(team.0)
        .bind(turn.0)
        .bind(code.map(ErrorCode::as_str))
        .fetch_one(&self.pool)
        .await?;
        Ok(ended)
    }
}
