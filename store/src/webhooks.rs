//! Webhooks (P4): a team's subscriptions, the outbox of deliveries and their attempts.
//!
//! The outbox is written in the transaction of the event it tells about: [`enqueue`] takes
//! any executor (a pool, a connection, `&mut *tx` of a caller's transaction), the turn's
//! end state writes its events in its own statement ([`subscribed_insert`] as one more
//! CTE), and an A2A task's push notifications are written by the turn's row itself
//! (`a2a_notify`, migration 0028). Deliveries are claimed by any replica with
//! `FOR UPDATE SKIP LOCKED`; a claim moves `next_attempt_at` past the attempt's bound, so
//! the row of a replica killed mid-attempt is claimed again when that passes (the visibility
//! timeout). Secrets are sealed under `BRAIN_SECRETS_KEY` (AES-256-GCM, bound to their team
//! and row), as team secrets are (B1), and so are a push config's token and credentials
//! (migration 0034), opened from its row when a delivery is claimed.

use std::time::Duration;

use chrono::{DateTime, Utc};
use protocol::{AgentId, ChatId, ErrorCode, TeamId, TurnId};
use serde_json::Value;
use uuid::Uuid;

use super::audit::{self, Action, Actor};
use super::secrets::{SecretsError, SecretsKey};
use super::{Store, StoreError, TurnEnd, TurnStatus, unique_violation};

/// The events a webhook may subscribe to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebhookEvent {
    /// A turn ended `completed`.
    TurnCompleted,
    /// A turn ended `failed`.
    TurnFailed,
    /// A tool call waits for a person's answer (A3).
    ApprovalRequested,
    /// An autostart firing could not start its turn (T11).
    AutostartFailed,
    /// A team quota refused work because a budget is spent (T2, E2).
    QuotaExhausted,
    /// An A2A task changed state (P1's push notifications).
    A2aTask,
}

impl WebhookEvent {
    pub const ALL: [Self; 6] = [
        Self::TurnCompleted,
        Self::TurnFailed,
        Self::ApprovalRequested,
        Self::AutostartFailed,
        Self::QuotaExhausted,
        Self::A2aTask,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::TurnCompleted => "turn.completed",
            Self::TurnFailed => "turn.failed",
            Self::ApprovalRequested => "approval.requested",
            Self::AutostartFailed => "autostart.failed",
            Self::QuotaExhausted => "quota.exhausted",
            Self::A2aTask => "a2a.task",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == raw)
    }
}

/// The body every delivery carries (Standard Webhooks' recommended shape): the event type,
/// when it happened, and ids (never message text, prompts or tool input: X4).
pub fn payload(event: WebhookEvent, data: &Value) -> Value {
    serde_json::json!({
        "type": event.as_str(),
        "timestamp": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "data": data,
    })
}

/// Pending deliveries one webhook may hold: past it, new events for it are not recorded
/// (docs/design/webhooks.md).
pub const MAX_PENDING: i64 = 10_000;

/// The statement that records `events` (a `text[]` of names, a `text[]` of keys and a
/// `jsonb[]` of payloads, as SQL expressions) for every webhook of `team` that subscribes
/// to them, when `guard` holds, within the outbox bound. A duplicate (same webhook, event
/// and key) records nothing. Usable alone or as a CTE of a larger statement, so an event
/// is written in the same transaction as the row that makes it.
pub(super) fn subscribed_insert(
    team: &str,
    events: &str,
    keys: &str,
    payloads: &str,
    guard: &str,
) -> String {
    format!(
        "INSERT INTO webhook_deliveries (id, team_id, webhook_id, event, event_key, payload) \
         SELECT gen_random_uuid(), w.team_id, w.id, e.event, e.key, e.payload \
         FROM unnest({events}::text[], {keys}::text[], {payloads}::jsonb[]) AS e(event, key, payload) \
         JOIN webhooks w ON w.team_id = {team} AND e.event = ANY(w.events) \
         WHERE {guard} \
           AND (SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries p \
                WHERE p.webhook_id = w.id AND p.state = 'pending' LIMIT {MAX_PENDING}) n) \
               < {MAX_PENDING} \
         ON CONFLICT DO NOTHING"
    )
}

/// One event for the outbox: its name, what makes it the same event (a turn id, an
/// approval id) and its `data`.
#[derive(Debug)]
pub struct OutboxEvent {
    pub event: WebhookEvent,
    pub key: String,
    pub data: Value,
}

impl OutboxEvent {
    pub fn new(event: WebhookEvent, key: impl ToString, data: Value) -> Self {
        Self {
            event,
            key: key.to_string(),
            data,
        }
    }
}

/// The three arrays [`subscribed_insert`] reads, for binding.
pub(super) fn columns(events: &[OutboxEvent]) -> (Vec<&'static str>, Vec<&str>, Vec<Value>) {
    (
        events.iter().map(|e| e.event.as_str()).collect(),
        events.iter().map(|e| e.key.as_str()).collect(),
        events.iter().map(|e| payload(e.event, &e.data)).collect(),
    )
}

type TurnIds = (TeamId, AgentId, ChatId, TurnId);

/// The event a turn's end is, if any: `turn.completed` or `turn.failed` (a turn stopped or
/// cut short is neither), keyed by the turn so a second write of its end is no second event.
pub(super) fn turn_event(
    ids: TurnIds,
    status: TurnStatus,
    error_code: Option<ErrorCode>,
) -> Option<OutboxEvent> {
    let (_, agent, chat, turn) = ids;
    let event = match status {
        TurnStatus::Completed => WebhookEvent::TurnCompleted,
        TurnStatus::Failed => WebhookEvent::TurnFailed,
        _ => return None,
    };
    let data = serde_json::json!({
        "turn_id": turn,
        "chat_id": chat,
        "agent_id": agent,
        "status": status.as_str(),
        "error_code": error_code.map(ErrorCode::as_str),
    });
    Some(OutboxEvent::new(event, turn, data))
}

/// What a turn's end state tells the team's webhooks: its end, and each tool call that now
/// waits for a person (`approval.requested`, keyed by the approval).
pub(super) fn turn_end_events(ids: TurnIds, end: &TurnEnd) -> Vec<OutboxEvent> {
    let (_, agent, chat, turn) = ids;
    let mut events: Vec<OutboxEvent> = turn_event(ids, end.status, end.error_code)
        .into_iter()
        .collect();
    events.extend(end.approvals.iter().map(|a| {
        let data = serde_json::json!({
            "approval_id": a.id,
            "turn_id": turn,
            "chat_id": chat,
            "agent_id": agent,
            "tool": a.tool,
            "expires_at": a.expires_at,
        });
        OutboxEvent::new(WebhookEvent::ApprovalRequested, a.id, data)
    }));
    events
}

/// Records `event` for every webhook of `team` that subscribes to it, in the caller's
/// transaction when `executor` is one (`&mut *tx`). Answers how many deliveries were
/// recorded (none: no subscriber, a duplicate key, or a full outbox).
pub async fn enqueue<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    team: TeamId,
    event: WebhookEvent,
    key: &str,
    data: &Value,
) -> Result<u64, StoreError> {
    static SQL: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| subscribed_insert("$1", "$2", "$3", "$4", "true"));
    let done = sqlx::query(SQL.as_str())
        .bind(team.0)
        .bind(vec![event.as_str()])
        .bind(vec![key])
        .bind(vec![payload(event, data)])
        .execute(executor)
        .await?;
    Ok(done.rows_affected())
}

const SECRET: &[u8] = b"webhook-secret";

/// team id ‖ row id (16 bytes each) ‖ what the value is: a sealed value copied to another
/// row, team or use no longer opens.
fn associated_data(team: TeamId, row: Uuid, what: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(32 + what.len());
    aad.extend_from_slice(team.0.as_bytes());
    aad.extend_from_slice(row.as_bytes());
    aad.extend_from_slice(what);
    aad
}

/// The sealed fields of a push config, as their associated data names them.
#[derive(Clone, Copy, Debug)]
pub(super) enum PushField {
    Token,
    Credentials,
}

impl PushField {
    fn label(self) -> &'static [u8] {
        match self {
            Self::Token => b"a2a-push-token",
            Self::Credentials => b"a2a-push-credentials",
        }
    }
}

/// team ‖ task ‖ field ‖ NUL ‖ config id (which holds no NUL: `a2a::push::validate`): a
/// sealed value copied to another config, task, team or field no longer opens.
fn push_associated_data(team: TeamId, turn: TurnId, config: &str, field: PushField) -> Vec<u8> {
    let mut what = Vec::with_capacity(32 + config.len());
    what.extend_from_slice(field.label());
    what.push(0);
    what.extend_from_slice(config.as_bytes());
    associated_data(team, turn.0, &what)
}

/// A push config's sealed field as stored: its nonce and ciphertext, both absent when the
/// client gave none.
pub(super) type Sealed = (Option<Vec<u8>>, Option<Vec<u8>>);

/// `value` sealed as field `field` of config `config` of task `turn`.
pub(super) fn seal_push(
    key: &SecretsKey,
    team: TeamId,
    turn: TurnId,
    config: &str,
    field: PushField,
    value: Option<&str>,
) -> Result<Sealed, SecretsError> {
    let Some(value) = value else {
        return Ok((None, None));
    };
    let (nonce, sealed) = key.seal(
        &push_associated_data(team, turn, config, field),
        value.as_bytes(),
    )?;
    Ok((Some(nonce), Some(sealed)))
}

/// A sealed field of config `config` of task `turn`, opened; `Crypto` when it does not open
/// under `key` (another key, or a value moved from another row).
pub(super) fn open_push(
    key: &SecretsKey,
    team: TeamId,
    turn: TurnId,
    config: &str,
    field: PushField,
    sealed: Sealed,
) -> Result<Option<String>, SecretsError> {
    let (Some(nonce), Some(sealed)) = sealed else {
        return Ok(None);
    };
    let aad = push_associated_data(team, turn, config, field);
    let plain = key.open(&aad, &nonce, &sealed)?;
    String::from_utf8(plain)
        .map(Some)
        .map_err(|_| SecretsError::Crypto)
}

/// A subscription as its owner sees it: never the secret.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct WebhookRow {
    pub id: Uuid,
    pub url: String,
    /// The event names it receives.
    pub events: Vec<String>,
    pub created_at: DateTime<Utc>,
}

/// One delivery of a webhook, with its attempts.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct DeliveryRow {
    /// The `webhook-id` header of every attempt.
    pub id: String,
    pub event: String,
    /// `pending` (retried at `next_attempt_at`), `delivered` or `failed` (given up after
    /// 24 hours).
    pub state: String,
    pub created_at: DateTime<Utc>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub attempts: Vec<AttemptRow>,
    #[serde(skip)]
    pub seq: i64,
}

#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct AttemptRow {
    pub attempt: i32,
    pub at: DateTime<Utc>,
    /// The HTTP status answered; absent when no answer came.
    pub status: Option<i32>,
    /// Why the attempt failed, as a class (`timeout`, `connect`, `status`,
    /// `private_address`…); absent on success.
    pub error: Option<String>,
    pub duration_ms: i32,
}

/// The message id of a delivery on the wire (`webhook-id`).
pub fn message_id(id: Uuid) -> String {
    format!("msg_{}", id.simple())
}

/// A delivery claimed for one attempt: where it goes and how it is signed.
pub struct ClaimedDelivery {
    pub id: Uuid,
    pub team: TeamId,
    pub webhook: Option<Uuid>,
    pub event: String,
    pub body: Value,
    /// This attempt's number, from 1.
    pub attempt: i32,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub secret: Option<String>,
    /// A chat channel's reply (P11): the channel it goes to; `url` is then no URL, and
    /// the channel's sender opens its credentials.
    pub channel: Option<Uuid>,
}

/// The claim names a channel's delivery in its destination column as `channel:<id>` (the
/// row has no URL): a row holds at most 16 columns.
fn channel_of(destination: &str) -> Option<Uuid> {
    Uuid::parse_str(destination.strip_prefix("channel:")?).ok()
}

impl std::fmt::Debug for ClaimedDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimedDelivery")
            .field("id", &self.id)
            .field("event", &self.event)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

/// How an attempt went, for its row.
#[derive(Debug)]
pub struct AttemptOutcome {
    pub status: Option<u16>,
    /// `None`: delivered.
    pub error: Option<&'static str>,
    pub duration: Duration,
}

/// A claimed row's extra headers and signing secret, opened.
type Destination = (Vec<(String, String)>, Option<String>);

type ClaimRow = (
    Uuid,
    Uuid,
    Option<Uuid>,
    String,
    Value,
    i32,
    String,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    // A push config's (migrations 0028, 0034): its task and id when there is one, its
    // sealed token, its authentication scheme and sealed credentials.
    Option<Uuid>,
    Option<String>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<String>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
);

impl Store {
    /// Creates a subscription with its signing `secret` (sealed). Past `max_per_team`
    /// webhooks, `TooMany`.
    pub async fn create_webhook(
        &self,
        team: TeamId,
        url: &str,
        events: &[String],
        secret: &str,
        max_per_team: i64,
        by: &Actor,
    ) -> Result<WebhookRow, SecretsError> {
        let key = self.secrets.as_ref().ok_or(SecretsError::NotConfigured)?;
        let id = Uuid::now_v7();
        let (nonce, sealed) = key.seal(&associated_data(team, id, SECRET), secret.as_bytes())?;
        let mut tx = self.pool.begin().await?;
        let row: Option<(DateTime<Utc>,)> = sqlx::query_as(
            "INSERT INTO webhooks (id, team_id, url, events, secret_nonce, secret_sealed) \
             SELECT $1, $2, $3, $4, $5, $6 \
             WHERE (SELECT count(*) FROM webhooks WHERE team_id = $2) < $7 \
             RETURNING created_at",
        )
        .bind(id)
        .bind(team.0)
        .bind(url)
        .bind(events)
        .bind(&nonce)
        .bind(&sealed)
        .bind(max_per_team)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| unique_violation(e, "webhooks_pkey", "webhook"))?;
        let (created_at,) = row.ok_or(SecretsError::TooMany)?;
        // The URL may carry a token of the receiver's in its query: the entry names the
        // events only.
        let details = serde_json::json!({ "events": events });
        audit::record(&mut tx, team, by, Action::WebhookCreated, id, details).await?;
        tx.commit().await?;
        Ok(WebhookRow {
            id,
            url: url.to_owned(),
            events: events.to_vec(),
            created_at,
        })
    }

    /// A page of the team's webhooks, oldest first: at most `limit` after `after`.
    pub async fn list_webhooks(
        &self,
        team: TeamId,
        after: Option<super::Keyset>,
        limit: i64,
    ) -> Result<Vec<WebhookRow>, StoreError> {
        let sql = format!(
            "SELECT id, url, events, created_at FROM webhooks WHERE team_id = $1 AND {} \
             ORDER BY created_at, id LIMIT $2",
            super::keyset_after(">", "$3", "$4")
        );
        let rows: Vec<(Uuid, String, Vec<String>, DateTime<Utc>)> =
            sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(team.0)
                .bind(limit)
                .bind(after.map(|k| k.at))
                .bind(after.map(|k| k.id))
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .map(|(id, url, events, created_at)| WebhookRow {
                id,
                url,
                events,
                created_at,
            })
            .collect())
    }

    /// Deletes a webhook and its deliveries (pending ones are never sent).
    pub async fn delete_webhook(
        &self,
        team: TeamId,
        id: Uuid,
        by: &Actor,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("DELETE FROM webhooks WHERE team_id = $1 AND id = $2")
            .bind(team.0)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        let details = serde_json::json!({});
        audit::record(&mut tx, team, by, Action::WebhookDeleted, id, details).await?;
        tx.commit().await?;
        Ok(())
    }

    /// A page of a webhook's deliveries, newest first, before the delivery at `before`
    /// (a `seq`), with their attempts.
    pub async fn webhook_deliveries(
        &self,
        team: TeamId,
        webhook: Uuid,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let exists: Option<(i32,)> =
            sqlx::query_as("SELECT 1 FROM webhooks WHERE team_id = $1 AND id = $2")
                .bind(team.0)
                .bind(webhook)
                .fetch_optional(&self.pool)
                .await?;
        if exists.is_none() {
            return Err(StoreError::NotFound);
        }
        type Row = (
            Uuid,
            i64,
            String,
            String,
            DateTime<Utc>,
            DateTime<Utc>,
            Option<DateTime<Utc>>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, seq, event, state, created_at, next_attempt_at, finished_at \
             FROM webhook_deliveries \
             WHERE team_id = $1 AND webhook_id = $2 AND ($3::bigint IS NULL OR seq < $3) \
             ORDER BY seq DESC LIMIT $4",
        )
        .bind(team.0)
        .bind(webhook)
        .bind(before)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        let ids: Vec<Uuid> = rows.iter().map(|r| r.0).collect();
        type Attempt = (Uuid, i32, DateTime<Utc>, Option<i32>, Option<String>, i32);
        let attempts: Vec<Attempt> = sqlx::query_as(
            "SELECT delivery_id, attempt, at, status, error, duration_ms \
                 FROM webhook_attempts WHERE delivery_id = ANY($1) \
                 ORDER BY delivery_id, attempt",
        )
        .bind(&ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, seq, event, state, created_at, next, finished_at)| DeliveryRow {
                    id: message_id(id),
                    event,
                    next_attempt_at: (state == "pending").then_some(next),
                    state,
                    created_at,
                    finished_at,
                    attempts: attempts
                        .iter()
                        .filter(|a| a.0 == id)
                        .map(|a| AttemptRow {
                            attempt: a.1,
                            at: a.2,
                            status: a.3,
                            error: a.4.clone(),
                            duration_ms: a.5,
                        })
                        .collect(),
                    seq,
                },
            )
            .collect())
    }

    /// Claims up to `limit` due deliveries for one attempt each, hiding them from every
    /// replica for `lease` (past it, a delivery whose attempt was never recorded is due
    /// again). Fair across teams: each team with pending deliveries (found by a skip scan
    /// of `webhook_deliveries_team_due`, one index probe per team) offers its oldest due
    /// ones, at most `per_team` less what it already `held` on this replica, and the claim
    /// takes every team's first, then every team's second, and so on; one team's backlog
    /// never sits ahead of another team's delivery. A row whose secret or target does not
    /// open under this key is given up as `failed` at once rather than retried for a day.
    /// A channel's reply waits while an earlier one (by `seq`) of its conversation is still
    /// pending, so one conversation's replies go out in the order they were written (P15;
    /// `webhook_deliveries_conversation`, migration 0068).
    pub async fn claim_deliveries(
        &self,
        limit: i64,
        per_team: i64,
        held: &[(TeamId, i64)],
        lease: Duration,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        let (held_teams, held_counts): (Vec<Uuid>, Vec<i64>) =
            held.iter().map(|(team, n)| (team.0, *n)).unzip();
        let rows: Vec<ClaimRow> = sqlx::query_as(
            "WITH RECURSIVE teams (team_id) AS ( \
               (SELECT team_id FROM webhook_deliveries WHERE state = 'pending' \
                ORDER BY team_id LIMIT 1) \
               UNION ALL \
               SELECT (SELECT p.team_id FROM webhook_deliveries p \
                       WHERE p.state = 'pending' AND p.team_id > t.team_id \
                       ORDER BY p.team_id LIMIT 1) \
               FROM teams t WHERE t.team_id IS NOT NULL), \
             room AS ( \
               SELECT t.team_id, $3 - coalesce(h.held, 0) AS room FROM teams t \
               LEFT JOIN unnest($4::uuid[], $5::int8[]) AS h (team_id, held) \
                 ON h.team_id = t.team_id \
               WHERE t.team_id IS NOT NULL), \
             offered AS ( \
               SELECT o.* FROM room r CROSS JOIN LATERAL ( \
                 SELECT p.id, p.team_id, p.next_attempt_at FROM webhook_deliveries p \
                 WHERE p.team_id = r.team_id AND p.state = 'pending' \
                   AND p.next_attempt_at <= now() \
                   AND (p.channel_id IS NULL OR NOT EXISTS ( \
                     SELECT 1 FROM webhook_deliveries e WHERE e.channel_id = p.channel_id \
                       AND e.payload->>'conversation' = p.payload->>'conversation' \
                       AND e.state = 'pending' AND e.seq < p.seq)) \
                 ORDER BY p.next_attempt_at LIMIT least(r.room, $1) \
                 FOR UPDATE SKIP LOCKED) o \
               WHERE r.room > 0), \
             c AS ( \
               SELECT id FROM (SELECT id, next_attempt_at, row_number() OVER \
                   (PARTITION BY team_id ORDER BY next_attempt_at) AS place FROM offered) o \
               ORDER BY place, next_attempt_at LIMIT $1), \
             u AS ( \
               UPDATE webhook_deliveries d \
               SET attempts = d.attempts + 1, \
                   next_attempt_at = now() + $2 * interval '1 millisecond' \
               FROM c WHERE d.id = c.id \
               RETURNING d.id, d.team_id, d.webhook_id, d.event, d.payload, d.attempts, \
                 d.target_url, d.push_turn, d.push_config, d.channel_id) \
             SELECT u.id, u.team_id, u.webhook_id, u.event, u.payload, u.attempts, \
               coalesce(w.url, u.target_url, 'channel:' || u.channel_id), w.secret_nonce, w.secret_sealed, \
               p.turn_id, p.id, p.token_nonce, p.token_sealed, p.auth_scheme, \
               p.credentials_nonce, p.credentials_sealed \
             FROM u LEFT JOIN webhooks w ON w.id = u.webhook_id \
             LEFT JOIN a2a_push_configs p ON p.team_id = u.team_id \
               AND p.turn_id = u.push_turn AND p.id = u.push_config",
        )
        .bind(limit)
        .bind(lease.as_millis() as f64)
        .bind(per_team)
        .bind(held_teams)
        .bind(held_counts)
        .fetch_all(&self.pool)
        .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            let opened = self.open_destination(TeamId(row.1), row.2, &row);
            let (id, team, webhook, event, body, attempt, url) =
                (row.0, TeamId(row.1), row.2, row.3, row.4, row.5, row.6);
            let channel = channel_of(&url);
            match opened {
                Some((headers, secret)) => claimed.push(ClaimedDelivery {
                    id,
                    team,
                    webhook,
                    event,
                    body,
                    attempt,
                    url,
                    headers,
                    secret,
                    channel,
                }),
                None => {
                    let outcome = AttemptOutcome {
                        status: None,
                        error: Some("unreadable_secret"),
                        duration: Duration::ZERO,
                    };
                    self.record_attempt(id, attempt, &outcome, None).await?;
                }
            }
        }
        Ok(claimed)
    }

    /// The headers and secret of a claimed row, decrypted; `None` when they do not open.
    /// A push notification (A2A) is unsigned: its receiver knows it by the config's token
    /// and the `Authorization` it asked for.
    fn open_destination(
        &self,
        team: TeamId,
        webhook: Option<Uuid>,
        row: &ClaimRow,
    ) -> Option<Destination> {
        let key = self.secrets.as_ref()?;
        if channel_of(&row.6).is_some() {
            return Some((Vec::new(), None));
        }
        match (webhook, &row.7, &row.8, row.9, &row.10) {
            (Some(webhook), Some(nonce), Some(sealed), None, None) => {
                let plain = key
                    .open(&associated_data(team, webhook, SECRET), nonce, sealed)
                    .ok()?;
                Some((Vec::new(), Some(String::from_utf8(plain).ok()?)))
            }
            (None, _, _, Some(turn), Some(config)) => {
                let turn = TurnId(turn);
                let sealed_token = (row.11.clone(), row.12.clone());
                let sealed_credentials = (row.14.clone(), row.15.clone());
                let token =
                    open_push(key, team, turn, config, PushField::Token, sealed_token).ok()?;
                let credentials = open_push(
                    key,
                    team,
                    turn,
                    config,
                    PushField::Credentials,
                    sealed_credentials,
                )
                .ok()?;
                let scheme = &row.13;
                let mut headers = Vec::new();
                if let Some(token) = token {
                    headers.push(("X-A2A-Notification-Token".to_owned(), token));
                }
                if let (Some(scheme), Some(credentials)) = (scheme, credentials) {
                    headers.push((
                        "Authorization".to_owned(),
                        format!("{scheme} {credentials}"),
                    ));
                }
                Some((headers, None))
            }
            _ => None,
        }
    }

    /// Records attempt `attempt` of a delivery and what comes next: delivered, retried
    /// after `retry_after`, or (`None`, or past the 24-hour horizon) failed for good. Only
    /// while the attempt is the row's latest claim: a replica whose claim lapsed and was
    /// taken again records its attempt but decides nothing. A delivery deleted meanwhile
    /// (its webhook was) records nothing.
    pub async fn record_attempt(
        &self,
        id: Uuid,
        attempt: i32,
        outcome: &AttemptOutcome,
        retry_after: Option<Duration>,
    ) -> Result<(), StoreError> {
        let delivered = outcome.error.is_none();
        sqlx::query(
            "WITH a AS ( \
               INSERT INTO webhook_attempts (delivery_id, attempt, status, error, duration_ms) \
               SELECT $1, $2, $3, $4, $5 FROM webhook_deliveries WHERE id = $1 \
               ON CONFLICT DO NOTHING) \
             UPDATE webhook_deliveries SET \
               state = CASE WHEN $6 THEN 'delivered' \
                 WHEN $7::float8 IS NULL \
                   OR now() + $7 * interval '1 millisecond' > created_at + $8 * interval '1 millisecond' \
                   THEN 'failed' ELSE 'pending' END, \
               next_attempt_at = now() + coalesce($7, 0) * interval '1 millisecond', \
               finished_at = CASE WHEN $6 OR $7::float8 IS NULL \
                 OR now() + $7 * interval '1 millisecond' > created_at + $8 * interval '1 millisecond' \
                 THEN now() END \
             WHERE id = $1 AND attempts = $2 AND state = 'pending'",
        )
        .bind(id)
        .bind(attempt)
        .bind(outcome.status.map(i32::from))
        .bind(outcome.error)
        .bind(outcome.duration.as_millis().min(i32::MAX as u128) as i32)
        .bind(delivered)
        .bind(retry_after.map(|d| d.as_millis() as f64))
        .bind(RETRY_HORIZON.as_millis() as f64)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// How long a delivery is retried after its event.
pub const RETRY_HORIZON: Duration = Duration::from_secs(24 * 3600);
