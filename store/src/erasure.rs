//! Erasure (L2): the rows of a chat, an agent or a team, deleted so that nothing of their
//! content stays in Postgres. What lives elsewhere (the bytes in the object store, the
//! events streams in Redis, the workers) is named in what these answer, for the caller to
//! remove (the brain's `erasure`).
//!
//! A chat's messages go in batches first, each its own bounded call, so a long transcript
//! never makes one statement outlast the statement timeout (a failure part way leaves the
//! chat with some of its messages gone: erasing it again finishes); the rest of a chat goes
//! in one transaction. Deleting a row queues its bytes in `blob_garbage` (a trigger, in that
//! transaction): no path forgets bytes whose row went. Usage (`billing_events`) and
//! webhook deliveries stay: they carry ids and counts, never content, and are the
//! operator's records.

use protocol::{AgentId, ChatId, TeamId};
use uuid::Uuid;

use super::audit::{self, Action, Actor};
use super::connectors::{Grants, revoke_grants};
use super::{Store, StoreError};

/// Messages deleted per statement while a chat is erased.
const MESSAGE_BATCH: i64 = 5_000;

/// What an erasure removed from Postgres that has a counterpart elsewhere.
#[derive(Debug, Default)]
pub struct Erased {
    /// The chats deleted (their events streams go too).
    pub chats: Vec<ChatId>,
    /// Object-store keys whose rows went (artifacts, workspace snapshots), queued in
    /// `blob_garbage` until their bytes are deleted.
    pub blobs: Vec<String>,
}

impl Erased {
    fn absorb(&mut self, other: Erased) {
        self.chats.extend(other.chats);
        self.blobs.extend(other.blobs);
    }
}

/// A team's table that grows without bound, erased a batch at a time.
#[derive(Clone, Copy, Debug)]
pub enum Bulky {
    AuditLog,
    WebhookDeliveries,
}

impl Bulky {
    pub const ALL: [Self; 2] = [Self::AuditLog, Self::WebhookDeliveries];
}

/// Where a team's erasure stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeamErasure {
    /// Asked for now (or already under way): the caller starts it.
    Begun,
    /// Done before: nothing is left to erase.
    Done,
}

impl Store {
    /// Deletes up to [`MESSAGE_BATCH`] messages of `chat`, the first step of erasing it;
    /// answers whether some are left.
    pub async fn erase_messages_batch(
        &self,
        team: TeamId,
        chat: ChatId,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "DELETE FROM messages WHERE id IN (
                 SELECT id FROM messages WHERE team_id = $1 AND chat_id = $2 LIMIT $3)",
        )
        .bind(team.0)
        .bind(chat.0)
        .bind(MESSAGE_BATCH)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == MESSAGE_BATCH as u64)
    }

    /// Deletes `chat` of `team` and everything of it, in one transaction: messages (the
    /// caller deleted a long history first, [`Store::erase_messages_batch`]), turns,
    /// approvals, worker sessions (a claimed pooled worker is marked `gone`, so the manager
    /// stops it), artifacts, chat files, workspace snapshots, A2A push configs. `None` when there is no
    /// such chat.
    pub async fn erase_chat(
        &self,
        team: TeamId,
        chat: ChatId,
    ) -> Result<Option<Erased>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let found: Option<Uuid> =
            sqlx::query_scalar("SELECT id FROM chats WHERE team_id = $1 AND id = $2 FOR UPDATE")
                .bind(team.0)
                .bind(chat.0)
                .fetch_optional(&mut *tx)
                .await?;
        if found.is_none() {
            return Ok(None);
        }
        let where_chat = "team_id = $1 AND chat_id = $2";
        let mut blobs = erase_owned(&mut tx, team, where_chat, chat.0).await?;
        // Their cascade from the chat would queue the bytes too, for the sweep; named here
        // they go with this request.
        let files: Vec<String> = sqlx::query_scalar(
            "DELETE FROM chat_files WHERE team_id = $1 AND chat_id = $2 RETURNING storage_key",
        )
        .bind(team.0)
        .bind(chat.0)
        .fetch_all(&mut *tx)
        .await?;
        blobs.extend(files);
        sqlx::query("DELETE FROM chats WHERE team_id = $1 AND id = $2")
            .bind(team.0)
            .bind(chat.0)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(Erased {
            chats: vec![chat],
            blobs,
        }))
    }

    /// Up to `limit` chats end user `user` opened (any order), for erasing them one by one.
    pub async fn chats_of_user(
        &self,
        team: TeamId,
        user: &str,
        limit: i64,
    ) -> Result<Vec<ChatId>, StoreError> {
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM chats WHERE team_id = $1 AND created_by = $2 LIMIT $3",
        )
        .bind(team.0)
        .bind(user)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(ids.into_iter().map(ChatId).collect())
    }

    /// Deletes what is left of end user `user` once their chats are erased: their memories,
    /// what the deployment knew of them (unless disabled) and their own connector grants
    /// (each logged `grant.revoked`), with the `user.erased` entry by `by`, in one
    /// transaction.
    pub async fn erase_user(&self, team: TeamId, user: &str, by: &Actor) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM memories WHERE team_id = $1 AND user_id = $2")
            .bind(team.0)
            .bind(user)
            .execute(&mut *tx)
            .await?;
        // A disabled user stays disabled: erasure removes what they left, not the refusal.
        sqlx::query(
            "DELETE FROM team_users WHERE team_id = $1 AND sub = $2 AND disabled_at IS NULL",
        )
        .bind(team.0)
        .bind(user)
        .execute(&mut *tx)
        .await?;
        revoke_grants(&mut tx, team, Grants::User(user), by).await?;
        audit::record(
            &mut tx,
            team,
            by,
            Action::UserErased,
            user,
            serde_json::json!({}),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Up to `limit` chats of `agent` (any order), for erasing them one by one.
    pub async fn chats_of_agent(
        &self,
        team: TeamId,
        agent: AgentId,
        limit: i64,
    ) -> Result<Vec<ChatId>, StoreError> {
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM chats WHERE team_id = $1 AND agent_id = $2 LIMIT $3",
        )
        .bind(team.0)
        .bind(agent.0)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(ids.into_iter().map(ChatId).collect())
    }

    /// Deletes `agent` of `team` and what is left of it: its chats (each as
    /// [`Store::erase_chat`] does; the caller erases big ones first), memories, secrets,
    /// schedule, the connectors bound to it and their grants, its artifacts and snapshots.
    /// `None` when there is no such agent. Its audit entry (`agent.deleted`, by `by`) is
    /// written in the same transaction, after one `grant.revoked` per grant of its
    /// connectors (which, unlike a deleted connector's, are not revoked at their
    /// authorization servers).
    pub async fn erase_agent(
        &self,
        team: TeamId,
        agent: AgentId,
        by: &Actor,
    ) -> Result<Option<Erased>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let found: Option<Uuid> =
            sqlx::query_scalar("SELECT id FROM agents WHERE team_id = $1 AND id = $2 FOR UPDATE")
                .bind(team.0)
                .bind(agent.0)
                .fetch_optional(&mut *tx)
                .await?;
        if found.is_none() {
            return Ok(None);
        }
        revoke_grants(&mut tx, team, Grants::Agent(agent), by).await?;
        let erased = erase_agent_in(&mut tx, team, agent.0).await?;
        let details = serde_json::json!({});
        audit::record(&mut tx, team, by, Action::AgentDeleted, agent, details).await?;
        tx.commit().await?;
        Ok(Some(erased))
    }

    /// Up to `limit` agents of `team`, for erasing them one by one.
    pub async fn agents_of_team(
        &self,
        team: TeamId,
        limit: i64,
    ) -> Result<Vec<AgentId>, StoreError> {
        let ids: Vec<Uuid> =
            sqlx::query_scalar("SELECT id FROM agents WHERE team_id = $1 LIMIT $2")
                .bind(team.0)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
        Ok(ids.into_iter().map(AgentId).collect())
    }

    /// Marks `team` for erasure (disabling it, so its keys are refused from now on).
    /// `None` for an unknown team.
    pub async fn begin_team_erasure(
        &self,
        team: TeamId,
    ) -> Result<Option<TeamErasure>, StoreError> {
        let erased: Option<Option<chrono::DateTime<chrono::Utc>>> = sqlx::query_scalar(
            "UPDATE teams SET disabled_at = coalesce(disabled_at, now()),
                              erasing_at = coalesce(erasing_at, now())
             WHERE id = $1 RETURNING erased_at",
        )
        .bind(team.0)
        .fetch_optional(&self.pool)
        .await?;
        Ok(erased.map(|at| match at {
            Some(_) => TeamErasure::Done,
            None => TeamErasure::Begun,
        }))
    }

    /// Takes the lease on one team being erased whose lease is free or lapsed, for
    /// `lease_ms`; `None` when there is none to take.
    pub async fn claim_team_erasure(&self, lease_ms: i64) -> Result<Option<TeamId>, StoreError> {
        let id: Option<Uuid> = sqlx::query_scalar(
            "UPDATE teams SET erase_lease_until = now() + make_interval(secs => $1 / 1000.0)
             WHERE id = (SELECT id FROM teams
                         WHERE erasing_at IS NOT NULL AND erased_at IS NULL
                           AND (erase_lease_until IS NULL OR erase_lease_until < now())
                         ORDER BY erasing_at LIMIT 1 FOR UPDATE SKIP LOCKED)
             RETURNING id",
        )
        .bind(lease_ms as f64)
        .fetch_optional(&self.pool)
        .await?;
        Ok(id.map(TeamId))
    }

    /// Extends the lease on `team`'s erasure; `false` when it is not being erased any more.
    pub async fn renew_team_erasure(
        &self,
        team: TeamId,
        lease_ms: i64,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE teams SET erase_lease_until = now() + make_interval(secs => $2 / 1000.0)
             WHERE id = $1 AND erasing_at IS NOT NULL AND erased_at IS NULL",
        )
        .bind(team.0)
        .bind(lease_ms as f64)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes up to [`MESSAGE_BATCH`] rows of one of the team's tables that grow without
    /// bound (its audit log, its webhook deliveries), before [`Store::finish_team_erasure`]
    /// takes the rest in one transaction; answers whether some are left.
    pub async fn erase_team_batch(&self, team: TeamId, table: Bulky) -> Result<bool, StoreError> {
        let table = match table {
            Bulky::AuditLog => "audit_log",
            Bulky::WebhookDeliveries => "webhook_deliveries",
        };
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE ctid = ANY(ARRAY(
                 SELECT ctid FROM {table} WHERE team_id = $1 LIMIT $2))"
        )))
        .bind(team.0)
        .bind(MESSAGE_BATCH)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == MESSAGE_BATCH as u64)
    }

    /// Deletes what `team` holds outside its agents (keys, team secrets, team-wide
    /// connectors and their grants, webhooks and their deliveries, compositions, quotas,
    /// approvals left over, its audit log) and marks it erased; the caller erased its agents first. The
    /// team's row stays, with its name, as the tombstone its usage records point at.
    pub async fn finish_team_erasure(&self, team: TeamId) -> Result<Erased, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut erased = Erased::default();
        // An agent made while its team was being erased (it cannot be: the team's keys are
        // refused), or one whose erasure failed: taken here with the rest.
        let agents: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM agents WHERE team_id = $1")
            .bind(team.0)
            .fetch_all(&mut *tx)
            .await?;
        for agent in agents {
            erased.absorb(erase_agent_in(&mut tx, team, agent).await?);
        }
        for table in [
            "approvals",
            "api_keys",
            "team_secrets",
            "connectors",
            "provider_connections",
            "webhooks",
            "webhook_deliveries",
            "compositions",
            "team_quotas",
            "user_quotas",
            "oauth_flows",
            "connector_grants",
            "audit_log",
            "knowledge_bases",
            "skills",
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE team_id = $1"
            )))
            .bind(team.0)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("UPDATE teams SET erased_at = now(), erase_lease_until = NULL WHERE id = $1")
            .bind(team.0)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(erased)
    }

    /// Up to `limit` object-store keys whose rows are gone, oldest first.
    pub async fn blob_garbage(&self, limit: i64) -> Result<Vec<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT storage_key FROM blob_garbage ORDER BY queued_at LIMIT $1")
                .bind(limit)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// Forgets a storage key once its bytes are deleted.
    pub async fn forget_blob_garbage(&self, storage_key: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM blob_garbage WHERE storage_key = $1")
            .bind(storage_key)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// Deletes, in `tx`, `agent` and everything of it (its chats as one, by cascade: the
/// caller erased long ones first).
async fn erase_agent_in(
    tx: &mut sqlx::PgTransaction<'_>,
    team: TeamId,
    agent: Uuid,
) -> Result<Erased, StoreError> {
    let blobs = erase_owned(tx, team, "team_id = $1 AND agent_id = $2", agent).await?;
    // The statement's snapshot is from before its delete: it reads the chats the cascade
    // takes.
    let chats: Vec<Uuid> = sqlx::query_scalar(
        "WITH gone AS (DELETE FROM agents WHERE team_id = $1 AND id = $2)
         SELECT id FROM chats WHERE team_id = $1 AND agent_id = $2",
    )
    .bind(team.0)
    .bind(agent)
    .fetch_all(&mut **tx)
    .await?;
    Ok(Erased {
        chats: chats.into_iter().map(ChatId).collect(),
        blobs,
    })
}

/// Deletes, in `tx`, what of a chat or an agent (the rows matching `filter`, with `$1` the
/// team and `$2` the owner's id) has no cascade from it or needs its bytes named:
/// approvals, artifacts and snapshots (their storage keys answered), and marks the pooled
/// workers its sessions claimed `gone`.
async fn erase_owned(
    tx: &mut sqlx::PgTransaction<'_>,
    team: TeamId,
    filter: &str,
    owner: Uuid,
) -> Result<Vec<String>, StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM approvals WHERE {filter}"
    )))
    .bind(team.0)
    .bind(owner)
    .execute(&mut **tx)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE worker_pool SET state = 'gone', updated_at = now()
         WHERE state = 'claimed'
           AND session_id IN (SELECT id FROM agent_runtime_sessions WHERE {filter})"
    )))
    .bind(team.0)
    .bind(owner)
    .execute(&mut **tx)
    .await?;
    let mut blobs: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "DELETE FROM artifacts WHERE {filter} RETURNING storage_key"
    )))
    .bind(team.0)
    .bind(owner)
    .fetch_all(&mut **tx)
    .await?;
    let snapshots: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "DELETE FROM workspace_snapshots WHERE {filter} RETURNING storage_key"
    )))
    .bind(team.0)
    .bind(owner)
    .fetch_all(&mut **tx)
    .await?;
    blobs.extend(snapshots);
    Ok(blobs)
}
