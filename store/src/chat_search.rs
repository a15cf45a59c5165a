//! Past chats found by the text of their messages (M5): for `GET /v1/agents/{id}/chats?q=`
//! and the `chat_search` tool.
//!
//! Postgres full-text search over the messages' text parts (never tool inputs or
//! outputs), through the `messages_search` index where it is built (migration 0051): the
//! expression below is the index's, verbatim, so the planner can use it.

use protocol::{AgentId, ChatId, TeamId};
use sqlx::Row;

use super::chats::{CHAT_COLUMNS, ChatRow, chat_from_row};
use super::{Keyset, Store, StoreError};

/// The text of a message's parts, as the `messages_search` index reads it.
const TEXT: &str = "jsonb_path_query_array(m.parts, '$[*] ? (@.type == \"text\").text')";

/// Whose chats a search reads.
#[derive(Clone, Copy, Debug)]
pub enum ChatsOf<'a> {
    /// Every chat of the agent (a principal who sees the team's chats).
    Anyone,
    /// The chats this end user opened.
    User(&'a str),
    /// The chats opened by whoever opened this one (its user, or a key when none did),
    /// this one left out: a turn looking back through its own conversations with the
    /// same person.
    SameOwnerAs(ChatId),
}

/// A chat a search found, with a snippet of its newest matching message.
#[derive(Clone, Debug)]
pub struct ChatHit {
    pub chat: ChatRow,
    pub snippet: String,
}

impl Store {
    /// The agent's chats among `of` whose messages match `query` (web-search syntax: words
    /// all present, `"a phrase"`, `-word`, `or`), newest chat first, at most `limit` before
    /// `before`. The autostart chat only `with_autostart` (X1). `NotFound` for an unknown or
    /// another team's agent.
    #[allow(clippy::too_many_arguments)]
    pub async fn search_chats(
        &self,
        team: TeamId,
        agent: AgentId,
        of: ChatsOf<'_>,
        with_autostart: bool,
        query: &str,
        before: Option<Keyset>,
        limit: i64,
    ) -> Result<Vec<ChatHit>, StoreError> {
        self.agent(team, agent).await?;
        let (kind, user, same_as) = match of {
            ChatsOf::Anyone => (0, None, None),
            ChatsOf::User(user) => (1, Some(user), None),
            ChatsOf::SameOwnerAs(chat) => (2, None, Some(chat.0)),
        };
        // Matching messages first (through the index), their chats kept to the caller's,
        // then a snippet for the page's chats only: `ts_headline` reads the whole text.
        let sql = format!(
            "WITH q AS (SELECT websearch_to_tsquery('simple', $3) AS q), \
             found AS ( \
               SELECT m.chat_id, max(m.seq) AS seq FROM messages m, q \
               WHERE m.team_id = $1 AND to_tsvector('simple'::regconfig, {TEXT}) @@ q.q \
                 AND m.chat_id IN ( \
                   SELECT c.id FROM chats c WHERE c.team_id = $1 AND c.agent_id = $2 \
                     AND ($4 OR NOT c.autostart) \
                     AND CASE $5::int \
                       WHEN 0 THEN true \
                       WHEN 1 THEN c.created_by = $6 \
                       ELSE c.id <> $7 AND c.created_by IS NOT DISTINCT FROM \
                            (SELECT o.created_by FROM chats o WHERE o.team_id = $1 AND o.id = $7) \
                     END) \
               GROUP BY m.chat_id) \
             SELECT {CHAT_COLUMNS}, \
               (SELECT ts_headline('simple', \
                         array_to_string(ARRAY(SELECT jsonb_array_elements_text({TEXT})), ' '), \
                         q.q, 'MaxFragments=1, MaxWords=24, MinWords=8, StartSel=\"\", StopSel=\"\"') \
                FROM messages m WHERE m.chat_id = found.chat_id AND m.seq = found.seq) AS snippet \
             FROM chats JOIN found ON found.chat_id = chats.id, q \
             WHERE chats.team_id = $1 AND {} \
             ORDER BY created_at DESC, id DESC LIMIT $8",
            super::keyset_after("<", "$9", "$10"),
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(agent.0)
            .bind(query)
            .bind(with_autostart)
            .bind(kind)
            .bind(user)
            .bind(same_as)
            .bind(limit)
            .bind(before.map(|k| k.at))
            .bind(before.map(|k| k.id))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(ChatHit {
                    chat: chat_from_row(row)?,
                    snippet: row
                        .try_get::<Option<String>, _>("snippet")?
                        .unwrap_or_default(),
                })
            })
            .collect()
    }
}
