//! Chat channels (P10) and the rows of their delivery router (P11).
//!
//! A channel is an agent's bot on a chat platform (migration 0062): its bot token and the
//! secret that authenticates the platform's calls are sealed under `BRAIN_SECRETS_KEY`,
//! bound to team, channel and use, as webhook secrets are. A conversation of the platform
//! is one chat of the agent (`channel_chats`). Replies leave through the webhooks' outbox
//! (`webhook_deliveries.channel_id`): the turn's end writes the row (the
//! `channel_turn_ended` trigger), any replica claims it (`Store::claim_deliveries`), and
//! the sender records each part it sent while its claim is still the row's latest
//! ([`Store::record_channel_progress`]), so a replica whose claim lapsed sends nothing more.

use std::time::Duration;

use chrono::{DateTime, Utc};
use protocol::{AgentId, ChatId, TeamId, TurnId};
use serde_json::Value;
use uuid::Uuid;

use super::audit::{self, Action, Actor};
use super::secrets::{SecretsError, SecretsKey};
use super::{Store, StoreError};

const TOKEN: &[u8] = b"channel-token";
const SECRET: &[u8] = b"channel-secret";

/// team ‖ channel ‖ use: a sealed value copied to another row, team or use does not open.
fn associated_data(team: TeamId, channel: Uuid, what: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(32 + what.len());
    aad.extend_from_slice(team.0.as_bytes());
    aad.extend_from_slice(channel.as_bytes());
    aad.extend_from_slice(what);
    aad
}

/// A channel as its admin sees it: never its token or secret.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ChannelRow {
    pub id: Uuid,
    pub agent_id: Uuid,
    /// `telegram` or `slack`.
    pub kind: String,
    /// The platform API the brain calls.
    pub api_base: String,
    /// The platform user ids that may talk to the agent.
    pub allowed_users: Vec<String>,
    /// Slack: the channel ids where anyone may talk to the agent.
    pub allowed_channels: Vec<String>,
    pub created_at: DateTime<Utc>,
}

/// A channel to create; `token` and `secret` are sealed before they are written.
pub struct NewChannel<'a> {
    pub id: Uuid,
    pub kind: &'a str,
    pub api_base: &'a str,
    pub allowed_users: &'a [String],
    pub allowed_channels: &'a [String],
    pub token: &'a str,
    pub secret: &'a str,
}

/// A channel with its token and secret opened, for calling the platform and checking its
/// calls. `Debug` never shows them.
#[derive(Clone)]
pub struct OpenedChannel {
    pub row: ChannelRow,
    pub team: TeamId,
    pub token: String,
    pub secret: String,
}

impl std::fmt::Debug for OpenedChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedChannel")
            .field("id", &self.row.id)
            .field("kind", &self.row.kind)
            .finish_non_exhaustive()
    }
}

/// What a turn left to say in its channel: how it ended and its answer's stored parts.
#[derive(Debug)]
pub struct ChannelReply {
    pub status: String,
    pub error_code: Option<String>,
    /// The assistant message's parts (`protocol::parts::Part` as JSON); `None` when the
    /// turn wrote none.
    pub parts: Option<Value>,
}

type ChannelColumns = (
    Uuid,
    Uuid,
    Uuid,
    String,
    String,
    Vec<String>,
    Vec<String>,
    DateTime<Utc>,
    Vec<u8>,
    Vec<u8>,
    Vec<u8>,
    Vec<u8>,
);

const COLUMNS: &str = "id, team_id, agent_id, kind, api_base, allowed_users, allowed_channels, \
    created_at, token_nonce, token_sealed, secret_nonce, secret_sealed";

fn row_of(c: &ChannelColumns) -> ChannelRow {
    ChannelRow {
        id: c.0,
        agent_id: c.2,
        kind: c.3.clone(),
        api_base: c.4.clone(),
        allowed_users: c.5.clone(),
        allowed_channels: c.6.clone(),
        created_at: c.7,
    }
}

fn open(key: &SecretsKey, c: ChannelColumns) -> Result<OpenedChannel, SecretsError> {
    let team = TeamId(c.1);
    let token = key.open(&associated_data(team, c.0, TOKEN), &c.8, &c.9)?;
    let secret = key.open(&associated_data(team, c.0, SECRET), &c.10, &c.11)?;
    Ok(OpenedChannel {
        row: row_of(&c),
        team,
        token: String::from_utf8(token).map_err(|_| SecretsError::Crypto)?,
        secret: String::from_utf8(secret).map_err(|_| SecretsError::Crypto)?,
    })
}

impl Store {
    /// Creates `new` for `agent`, its token and secret sealed. `NotFound` (in `Store`) for
    /// an agent of no such id in the team; `TooMany` past `max_per_agent` channels.
    pub async fn create_channel(
        &self,
        team: TeamId,
        agent: AgentId,
        new: &NewChannel<'_>,
        max_per_agent: i64,
        by: &Actor,
    ) -> Result<ChannelRow, SecretsError> {
        let key = self.secrets.as_ref().ok_or(SecretsError::NotConfigured)?;
        let (token_nonce, token_sealed) =
            key.seal(&associated_data(team, new.id, TOKEN), new.token.as_bytes())?;
        let (secret_nonce, secret_sealed) = key.seal(
            &associated_data(team, new.id, SECRET),
            new.secret.as_bytes(),
        )?;
        let mut tx = self.pool.begin().await?;
        let inserted: Option<(DateTime<Utc>, bool)> = sqlx::query_as(
            "INSERT INTO agent_channels (id, team_id, agent_id, kind, api_base, allowed_users, \
               allowed_channels, token_nonce, token_sealed, secret_nonce, secret_sealed) \
             SELECT $1, a.team_id, a.id, $4, $5, $6, $7, $8, $9, $10, $11 FROM agents a \
             WHERE a.team_id = $2 AND a.id = $3 AND a.archived_at IS NULL \
             RETURNING created_at, \
               (SELECT count(*) FROM agent_channels WHERE team_id = $2 AND agent_id = $3) < $12",
        )
        .bind(new.id)
        .bind(team.0)
        .bind(agent.0)
        .bind(new.kind)
        .bind(new.api_base)
        .bind(new.allowed_users)
        .bind(new.allowed_channels)
        .bind(&token_nonce)
        .bind(&token_sealed)
        .bind(&secret_nonce)
        .bind(&secret_sealed)
        .bind(max_per_agent)
        .fetch_optional(&mut *tx)
        .await?;
        let (created_at, within) = inserted.ok_or(StoreError::NotFound)?;
        if !within {
            return Err(SecretsError::TooMany);
        }
        let details = serde_json::json!({ "agent_id": agent, "kind": new.kind });
        audit::record(&mut tx, team, by, Action::ChannelCreated, new.id, details).await?;
        tx.commit().await?;
        Ok(ChannelRow {
            id: new.id,
            agent_id: agent.0,
            kind: new.kind.to_owned(),
            api_base: new.api_base.to_owned(),
            allowed_users: new.allowed_users.to_vec(),
            allowed_channels: new.allowed_channels.to_vec(),
            created_at,
        })
    }

    /// The channels of `agent`, oldest first (at most the per-agent cap).
    pub async fn list_channels(
        &self,
        team: TeamId,
        agent: AgentId,
    ) -> Result<Vec<ChannelRow>, StoreError> {
        let rows: Vec<ChannelColumns> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM agent_channels WHERE team_id = $1 AND agent_id = $2 \
             ORDER BY created_at, id"
        )))
        .bind(team.0)
        .bind(agent.0)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(row_of).collect())
    }

    /// Channel `id` of `agent` in `team`, opened.
    pub async fn agent_channel(
        &self,
        team: TeamId,
        agent: AgentId,
        id: Uuid,
    ) -> Result<OpenedChannel, SecretsError> {
        let key = self.secrets.as_ref().ok_or(SecretsError::NotConfigured)?;
        let row: Option<ChannelColumns> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM agent_channels WHERE team_id = $1 AND agent_id = $2 AND id = $3"
        )))
        .bind(team.0)
        .bind(agent.0)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        open(key, row.ok_or(StoreError::NotFound)?)
    }

    /// Channel `id`, whatever its team, opened: for the platform's calls, which name the
    /// channel in their URL and prove themselves with its secret, and for its deliveries.
    pub async fn channel(&self, id: Uuid) -> Result<OpenedChannel, SecretsError> {
        let key = self.secrets.as_ref().ok_or(SecretsError::NotConfigured)?;
        let row: Option<ChannelColumns> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM agent_channels WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        open(key, row.ok_or(StoreError::NotFound)?)
    }

    /// Deletes channel `id` of `agent`, its conversations' mapping and pending replies
    /// (their chats stay, as the agent's).
    pub async fn delete_channel(
        &self,
        team: TeamId,
        agent: AgentId,
        id: Uuid,
        by: &Actor,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "DELETE FROM agent_channels WHERE team_id = $1 AND agent_id = $2 AND id = $3",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        let details = serde_json::json!({ "agent_id": agent });
        audit::record(&mut tx, team, by, Action::ChannelDeleted, id, details).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The chat of `conversation` in `channel`, opened for the agent by `person` (its end
    /// user) on its first message; later messages of anyone there go to the same chat.
    pub async fn channel_chat(
        &self,
        channel: &OpenedChannel,
        conversation: &str,
        person: &str,
    ) -> Result<(ChatId, String), StoreError> {
        let mut tx = self.pool.begin().await?;
        let found: Option<(Uuid, Option<String>)> = sqlx::query_as(
            "SELECT c.chat_id, h.created_by FROM channel_chats c \
             JOIN chats h ON h.team_id = c.team_id AND h.id = c.chat_id \
             WHERE c.channel_id = $1 AND c.conversation = $2",
        )
        .bind(channel.row.id)
        .bind(conversation)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some((chat, owner)) = found {
            return Ok((ChatId(chat), owner.unwrap_or_else(|| person.to_owned())));
        }
        let chat = ChatId::new();
        // Two first messages at once: the second insert of the mapping finds the first's
        // and its transaction (with its chat) is rolled back; it then reads the first's.
        let made = sqlx::query(
            "WITH h AS (INSERT INTO chats (id, team_id, agent_id, created_by) \
               SELECT $1, team_id, id, $4 FROM agents \
               WHERE team_id = $2 AND id = $3 AND archived_at IS NULL RETURNING id) \
             INSERT INTO channel_chats (channel_id, conversation, team_id, chat_id) \
             SELECT $5, $6, $2, id FROM h ON CONFLICT DO NOTHING",
        )
        .bind(chat.0)
        .bind(channel.team.0)
        .bind(channel.row.agent_id)
        .bind(person)
        .bind(channel.row.id)
        .bind(conversation)
        .execute(&mut *tx)
        .await?;
        if made.rows_affected() == 1 {
            tx.commit().await?;
            return Ok((chat, person.to_owned()));
        }
        tx.rollback().await?;
        let found: Option<(Uuid, Option<String>)> = sqlx::query_as(
            "SELECT c.chat_id, h.created_by FROM channel_chats c \
             JOIN chats h ON h.team_id = c.team_id AND h.id = c.chat_id \
             WHERE c.channel_id = $1 AND c.conversation = $2",
        )
        .bind(channel.row.id)
        .bind(conversation)
        .fetch_optional(&self.pool)
        .await?;
        let (chat, owner) = found.ok_or(StoreError::NotFound)?;
        Ok((ChatId(chat), owner.unwrap_or_else(|| person.to_owned())))
    }

    /// Records that `person` (not allowed) wrote to `channel` in `conversation`, and when
    /// they were not told so in the last hour, puts `notice` in the outbox for them. Answers
    /// whether a notice was queued.
    pub async fn refuse_in_channel(
        &self,
        channel: &OpenedChannel,
        conversation: &str,
        person: &str,
        notice: &str,
    ) -> Result<bool, StoreError> {
        let queued = sqlx::query(
            "WITH r AS ( \
               INSERT INTO channel_refusals (channel_id, platform_user) VALUES ($1, $3) \
               ON CONFLICT (channel_id, platform_user) DO UPDATE SET refused_at = now() \
               WHERE channel_refusals.refused_at < now() - interval '1 hour' \
               RETURNING refused_at) \
             INSERT INTO webhook_deliveries (id, team_id, channel_id, event, event_key, payload) \
             SELECT gen_random_uuid(), $2, $1, 'channel.notice', \
               $3 || ':' || extract(epoch FROM r.refused_at)::text, \
               jsonb_build_object('conversation', $4::text, 'text', $5::text, 'sent', 0) \
             FROM r ON CONFLICT DO NOTHING",
        )
        .bind(channel.row.id)
        .bind(channel.team.0)
        .bind(person)
        .bind(conversation)
        .bind(notice)
        .execute(&self.pool)
        .await?;
        Ok(queued.rows_affected() == 1)
    }

    /// What turn `turn` of `team` left to say: its end and its answer's parts.
    pub async fn channel_reply(
        &self,
        team: TeamId,
        turn: TurnId,
    ) -> Result<ChannelReply, StoreError> {
        let row: Option<(String, Option<String>, Option<Value>)> = sqlx::query_as(
            "SELECT t.status, t.error_code, \
               (SELECT m.parts FROM messages m WHERE m.team_id = t.team_id \
                  AND m.turn_id = t.id AND m.role = 'assistant' ORDER BY m.seq DESC LIMIT 1) \
             FROM turns t WHERE t.team_id = $1 AND t.id = $2",
        )
        .bind(team.0)
        .bind(turn.0)
        .fetch_optional(&self.pool)
        .await?;
        let (status, error_code, parts) = row.ok_or(StoreError::NotFound)?;
        Ok(ChannelReply {
            status,
            error_code,
            parts,
        })
    }

    /// Records that the first `sent` parts of delivery `id` reached the platform, and
    /// holds the claim for `lease` more: only while attempt `attempt` is still the row's
    /// latest claim. `false`: the claim lapsed and another replica has the row; the caller
    /// sends nothing more.
    pub async fn record_channel_progress(
        &self,
        id: Uuid,
        attempt: i32,
        sent: usize,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE webhook_deliveries SET payload = jsonb_set(payload, '{sent}', to_jsonb($3::int)), \
               next_attempt_at = now() + $4 * interval '1 millisecond' \
             WHERE id = $1 AND attempts = $2 AND state = 'pending'",
        )
        .bind(id)
        .bind(attempt)
        .bind(sent as i32)
        .bind(lease.as_millis() as f64)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}

/// An approval asked in a channel as buttons (P16): the token its buttons carry, and the
/// call it asks about.
#[derive(Clone, Debug)]
pub struct ChannelPrompt {
    pub token: String,
    pub approval: Uuid,
    pub tool: String,
    pub input: Value,
}

/// A button's token read back: the approval it answers, where it was asked, and the person
/// whose chat that is (the turn goes on as theirs, as the conversation's messages do).
#[derive(Debug)]
pub struct PressedPrompt {
    pub approval: Uuid,
    pub conversation: String,
    pub owner: Option<String>,
}

impl Store {
    /// The prompts turn `turn`'s reply in `conversation` of `channel` asks: one per tool
    /// call's approval of the turn, whatever its state now (a reply sent again asks the same
    /// prompts in the same order), oldest first, each with its token, made once per
    /// approval and channel (22 characters of a random UUID: 122 random bits).
    pub async fn channel_prompts(
        &self,
        channel: &OpenedChannel,
        conversation: &str,
        turn: TurnId,
    ) -> Result<Vec<ChannelPrompt>, StoreError> {
        sqlx::query(
            "INSERT INTO channel_prompts (token, channel_id, conversation, approval_id) \
             SELECT rtrim(translate(encode(uuid_send(gen_random_uuid()), 'base64'), '+/', '-_'), '='), \
               $3, $4, a.id FROM approvals a \
             WHERE a.team_id = $1 AND a.turn_id = $2 AND a.kind = 'tool' \
             ON CONFLICT (channel_id, approval_id) DO NOTHING",
        )
        .bind(channel.team.0)
        .bind(turn.0)
        .bind(channel.row.id)
        .bind(conversation)
        .execute(&self.pool)
        .await?;
        let rows: Vec<(String, Uuid, String, Value)> = sqlx::query_as(
            "SELECT p.token, a.id, a.tool, a.input FROM approvals a \
             JOIN channel_prompts p ON p.channel_id = $3 AND p.approval_id = a.id \
             WHERE a.team_id = $1 AND a.turn_id = $2 AND a.kind = 'tool' \
             ORDER BY a.created_at, a.id",
        )
        .bind(channel.team.0)
        .bind(turn.0)
        .bind(channel.row.id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(token, approval, tool, input)| ChannelPrompt {
                token,
                approval,
                tool,
                input,
            })
            .collect())
    }

    /// The prompt of `channel` whose buttons carry `token`.
    pub async fn channel_prompt(
        &self,
        channel: &OpenedChannel,
        token: &str,
    ) -> Result<PressedPrompt, StoreError> {
        let row: Option<(Uuid, String, Option<String>)> = sqlx::query_as(
            "SELECT p.approval_id, p.conversation, h.created_by FROM channel_prompts p \
             JOIN approvals a ON a.id = p.approval_id \
             JOIN chats h ON h.team_id = a.team_id AND h.id = a.chat_id \
             WHERE p.channel_id = $1 AND p.token = $2 AND a.team_id = $3",
        )
        .bind(channel.row.id)
        .bind(token)
        .bind(channel.team.0)
        .fetch_optional(&self.pool)
        .await?;
        let (approval, conversation, owner) = row.ok_or(StoreError::NotFound)?;
        Ok(PressedPrompt {
            approval,
            conversation,
            owner,
        })
    }
}

impl Store {
    /// Puts the progress of `turn` (just started in `conversation` of `channel`) in the
    /// outbox, ahead of its reply: one row per turn, which the delivery router holds while
    /// the turn runs (Slack's message updated as the answer streams).
    pub async fn queue_channel_progress(
        &self,
        channel: &OpenedChannel,
        conversation: &str,
        chat: ChatId,
        turn: TurnId,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO webhook_deliveries (id, team_id, channel_id, event, event_key, payload) \
             VALUES (gen_random_uuid(), $1, $2, 'channel.progress', $3::text, \
               jsonb_build_object('conversation', $4::text, 'chat_id', $5::uuid, \
                 'turn_id', $3::uuid, 'sent', 0)) \
             ON CONFLICT DO NOTHING",
        )
        .bind(channel.team.0)
        .bind(channel.row.id)
        .bind(turn.0)
        .bind(conversation)
        .bind(chat.0)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records that progress delivery `id` shows as platform message `ts` (when it shows
    /// one yet), and holds the claim for `lease` more, only while attempt `attempt` is the
    /// row's latest claim (as [`Store::record_channel_progress`]). `false`: another replica
    /// has the row.
    pub async fn record_channel_message(
        &self,
        id: Uuid,
        attempt: i32,
        ts: Option<&str>,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE webhook_deliveries SET payload = CASE WHEN $3::text IS NULL THEN payload \
               ELSE jsonb_set(payload, '{ts}', to_jsonb($3::text)) END, \
               next_attempt_at = now() + $4 * interval '1 millisecond' \
             WHERE id = $1 AND attempts = $2 AND state = 'pending'",
        )
        .bind(id)
        .bind(attempt)
        .bind(ts)
        .bind(lease.as_millis() as f64)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The platform message turn `turn`'s progress showed in `channel`, if it showed one:
    /// its reply's first part takes that message's place.
    pub async fn channel_progress_message(
        &self,
        channel: Uuid,
        team: TeamId,
        turn: TurnId,
    ) -> Result<Option<String>, StoreError> {
        let ts: Option<(Option<String>,)> = sqlx::query_as(
            "SELECT payload->>'ts' FROM webhook_deliveries \
             WHERE team_id = $1 AND channel_id = $2 AND event = 'channel.progress' \
               AND event_key = $3::text",
        )
        .bind(team.0)
        .bind(channel)
        .bind(turn.0)
        .fetch_optional(&self.pool)
        .await?;
        Ok(ts.and_then(|(ts,)| ts))
    }
}
