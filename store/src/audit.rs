//! The audit log (L5): who changed what of a team, when and from where.
//!
//! A store method that makes an admin change takes the [`Actor`] and writes its entry with
//! [`record`] on the change's own transaction, so an entry exists exactly when its change
//! does: a change rolled back takes its entry with it, and an entry that cannot be written
//! rolls the change back. Entries carry ids, names and the names of changed fields, never
//! a secret's value, a key, a prompt or a message (X4).

use std::net::IpAddr;

use chrono::{DateTime, Utc};
use protocol::TeamId;
use serde_json::Value;
use uuid::Uuid;

use super::{Keyset, Store, StoreError};

/// What kind of caller made a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ActorKind {
    /// An API key; the actor is its id.
    Key,
    /// A JWT; the actor is its user claim.
    User,
    /// The platform operator (`BRAIN_OPERATOR_TOKEN`, or `brain team create`).
    Operator,
    /// A turn whose authority was recorded before its actor was (an older row), or an
    /// OAuth flow begun before who began it was kept.
    Unknown,
}

impl ActorKind {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Key => "key",
            Self::User => "user",
            Self::Operator => "operator",
            Self::Unknown => "unknown",
        }
    }

    fn parse(stored: &str) -> Option<Self> {
        match stored {
            "key" => Some(Self::Key),
            "user" => Some(Self::User),
            "operator" => Some(Self::Operator),
            "unknown" => Some(Self::Unknown),
            _ => None,
        }
    }
}

/// Who makes a change, and from which address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    pub kind: ActorKind,
    /// A key's id or a token's subject; never a credential.
    pub id: String,
    /// The peer address of the request (behind a proxy, the proxy's); `None` for a tool
    /// call, which the model made, and for the command line.
    pub address: Option<IpAddr>,
}

impl Actor {
    pub fn operator(address: Option<IpAddr>) -> Self {
        Self {
            kind: ActorKind::Operator,
            id: "operator".to_owned(),
            address,
        }
    }

    /// An actor as a row stored it (`actor_kind`, `actor`), without an address; `None`s
    /// (a row from before it was kept) are `unknown`.
    pub(super) fn stored(kind: Option<&str>, id: Option<String>) -> Self {
        match (kind.and_then(ActorKind::parse), id) {
            (Some(kind), Some(id)) => Self {
                kind,
                id,
                address: None,
            },
            _ => Self {
                kind: ActorKind::Unknown,
                id: "unknown".to_owned(),
                address: None,
            },
        }
    }

    /// The actor a turn's tools change things as: its authority's `key:<id>` or
    /// `user:<subject>` (the brain's `auth::Authority`), without an address.
    pub fn of_turn(authority_actor: &str) -> Self {
        let (kind, id) = match authority_actor.split_once(':') {
            Some(("key", id)) => (ActorKind::Key, id),
            Some(("user", id)) => (ActorKind::User, id),
            _ => (ActorKind::Unknown, authority_actor),
        };
        Self {
            kind,
            id: id.to_owned(),
            address: None,
        }
    }
}

/// What an entry records: a stable dotted name, and the kind of object it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    KeyCreated,
    KeyRevoked,
    QuotasSet,
    /// One user's quota overrides (L4) set or dropped; the entry names the user.
    UserQuotaSet,
    UserQuotaDeleted,
    /// An end user erased (L2): their chats, memories and grants; the entry names the user.
    UserErased,
    /// An end user disabled by an admin (their tokens refused, their detached work ended)
    /// or enabled again (X1); the entry names the user.
    UserDisabled,
    UserEnabled,
    AgentCreated,
    AgentUpdated,
    /// For the deletion of an agent (L2), recorded by the store method that deletes it.
    AgentDeleted,
    ConnectorCreated,
    /// Its tools' risk rules changed (`trust_hints`, `tool_risks`).
    ConnectorUpdated,
    ConnectorDeleted,
    SecretSet,
    SecretDeleted,
    WebhookCreated,
    WebhookDeleted,
    /// An agent's chat channel (P10) added or deleted; the entry names the agent and kind.
    ChannelCreated,
    ChannelDeleted,
    /// A team's own JWT issuer added or deleted; the entry names its `iss`.
    IssuerCreated,
    IssuerDeleted,
    /// A team's model provider connection (T14) added, changed or deleted; the entry names
    /// the fields changed, never the key.
    ProviderCreated,
    ProviderUpdated,
    ProviderDeleted,
    /// A connector's OAuth grant bound by the callback (B2); the entry names the connector,
    /// its actor is who began the flow.
    GrantBound,
    /// A grant deleted with its connector or its agent (revoked at its authorization
    /// server with a connector, best effort).
    GrantRevoked,
    TeamCreated,
    TeamUpdated,
    /// The brain tools that change the agent (X1): the entry names the agent.
    ToolCronSet,
    ToolCronRemove,
    ToolSecretSet,
    ToolAgentCreate,
    ToolAgentUpdate,
    ToolAgentArchive,
    ToolAgentSetPrompt,
    /// A memory's content changed or the memory deleted by a person (M4); the entry names
    /// the agent, never the content.
    MemoryUpdated,
    MemoryDeleted,
    /// A skill's version uploaded, or all its versions deleted (B8); the entry names the
    /// skill's version id (upload) or its name (deletion).
    SkillCreated,
    SkillDeleted,
    /// A knowledge base created, renamed or redescribed, or deleted with its documents
    /// (B3); the entry names the base, with its name or the fields given.
    KnowledgeCreated,
    KnowledgeUpdated,
    KnowledgeDeleted,
    /// A document uploaded to a base or deleted (B3); the entry names the document and its
    /// base, never its content or filename.
    KnowledgeDocumentAdded,
    KnowledgeDocumentDeleted,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::KeyCreated => "key.created",
            Self::KeyRevoked => "key.revoked",
            Self::QuotasSet => "quotas.set",
            Self::UserQuotaSet => "quotas.user_set",
            Self::UserQuotaDeleted => "quotas.user_deleted",
            Self::UserErased => "user.erased",
            Self::UserDisabled => "user.disabled",
            Self::UserEnabled => "user.enabled",
            Self::AgentCreated => "agent.created",
            Self::AgentUpdated => "agent.updated",
            Self::AgentDeleted => "agent.deleted",
            Self::ConnectorCreated => "connector.created",
            Self::ConnectorUpdated => "connector.updated",
            Self::ConnectorDeleted => "connector.deleted",
            Self::SecretSet => "secret.set",
            Self::SecretDeleted => "secret.deleted",
            Self::WebhookCreated => "webhook.created",
            Self::WebhookDeleted => "webhook.deleted",
            Self::ChannelCreated => "channel.created",
            Self::ChannelDeleted => "channel.deleted",
            Self::IssuerCreated => "issuer.created",
            Self::IssuerDeleted => "issuer.deleted",
            Self::ProviderCreated => "provider.created",
            Self::ProviderUpdated => "provider.updated",
            Self::ProviderDeleted => "provider.deleted",
            Self::GrantBound => "grant.bound",
            Self::GrantRevoked => "grant.revoked",
            Self::TeamCreated => "team.created",
            Self::TeamUpdated => "team.updated",
            Self::ToolCronSet => "tool.cron_set",
            Self::ToolCronRemove => "tool.cron_remove",
            Self::ToolSecretSet => "tool.secret_set",
            Self::ToolAgentCreate => "tool.agent_create",
            Self::ToolAgentUpdate => "tool.agent_update",
            Self::ToolAgentArchive => "tool.agent_archive",
            Self::ToolAgentSetPrompt => "tool.agent_set_prompt",
            Self::MemoryUpdated => "memory.updated",
            Self::MemoryDeleted => "memory.deleted",
            Self::SkillCreated => "skill.created",
            Self::SkillDeleted => "skill.deleted",
            Self::KnowledgeCreated => "knowledge.created",
            Self::KnowledgeUpdated => "knowledge.updated",
            Self::KnowledgeDeleted => "knowledge.deleted",
            Self::KnowledgeDocumentAdded => "knowledge.document_added",
            Self::KnowledgeDocumentDeleted => "knowledge.document_deleted",
        }
    }

    /// The kind of the object the entry's `object_id` names.
    fn object_kind(self) -> &'static str {
        match self {
            Self::KeyCreated | Self::KeyRevoked => "key",
            Self::QuotasSet | Self::TeamCreated | Self::TeamUpdated => "team",
            Self::UserQuotaSet
            | Self::UserQuotaDeleted
            | Self::UserErased
            | Self::UserDisabled
            | Self::UserEnabled => "user",
            Self::AgentCreated
            | Self::AgentUpdated
            | Self::AgentDeleted
            | Self::ToolCronSet
            | Self::ToolCronRemove
            | Self::ToolSecretSet
            | Self::ToolAgentCreate
            | Self::ToolAgentUpdate
            | Self::ToolAgentArchive
            | Self::ToolAgentSetPrompt => "agent",
            Self::ConnectorCreated
            | Self::ConnectorUpdated
            | Self::ConnectorDeleted
            | Self::GrantBound
            | Self::GrantRevoked => "connector",
            Self::SecretSet | Self::SecretDeleted => "secret",
            Self::WebhookCreated | Self::WebhookDeleted => "webhook",
            Self::ChannelCreated | Self::ChannelDeleted => "channel",
            Self::IssuerCreated | Self::IssuerDeleted => "issuer",
            Self::ProviderCreated | Self::ProviderUpdated | Self::ProviderDeleted => "provider",
            Self::MemoryUpdated | Self::MemoryDeleted => "memory",
            Self::SkillCreated | Self::SkillDeleted => "skill",
            Self::KnowledgeCreated | Self::KnowledgeUpdated | Self::KnowledgeDeleted => {
                "knowledge_base"
            }
            Self::KnowledgeDocumentAdded | Self::KnowledgeDocumentDeleted => "knowledge_document",
        }
    }
}

/// Writes the entry of `action` on `object` by `by` in the caller's transaction (`&mut
/// *tx`). `details` holds names only (of fields, of a secret), never values.
pub(super) async fn record(
    conn: &mut sqlx::PgConnection,
    team: TeamId,
    by: &Actor,
    action: Action,
    object: impl std::fmt::Display,
    details: Value,
) -> Result<(), StoreError> {
    record_each(conn, team, by, action, vec![(object.to_string(), details)]).await
}

/// Writes one entry of `action` by `by` per object of `objects` (its id and details), in
/// one statement of the caller's transaction: a change of many objects at once (the
/// grants of a deleted connector) costs one round trip however many there are.
pub(super) async fn record_each(
    conn: &mut sqlx::PgConnection,
    team: TeamId,
    by: &Actor,
    action: Action,
    objects: Vec<(String, Value)>,
) -> Result<(), StoreError> {
    if objects.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = objects.iter().map(|_| Uuid::now_v7()).collect();
    let (object_ids, details): (Vec<String>, Vec<Value>) = objects.into_iter().unzip();
    sqlx::query(
        "INSERT INTO audit_log \
           (id, team_id, actor_kind, actor, action, object_kind, object_id, address, details) \
         SELECT e.id, $2, $3, $4, $5, $6, e.object_id, $7::inet, e.details \
         FROM unnest($1::uuid[], $8::text[], $9::jsonb[]) AS e (id, object_id, details)",
    )
    .bind(ids)
    .bind(team.0)
    .bind(by.kind.as_str())
    .bind(&by.id)
    .bind(action.as_str())
    .bind(action.object_kind())
    .bind(by.address.map(|a| a.to_string()))
    .bind(object_ids)
    .bind(details)
    .execute(conn)
    .await?;
    Ok(())
}

/// One entry as `GET /v1/audit` shows it.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct AuditEntry {
    pub id: Uuid,
    pub at: DateTime<Utc>,
    pub actor_kind: ActorKind,
    /// The key's id, the token's user, or `operator`.
    pub actor: String,
    /// A stable dotted name: `key.created`, `agent.updated`, `tool.secret_set`, ...
    pub action: String,
    /// `key`, `team`, `agent`, `connector`, `secret` or `webhook`.
    pub object_kind: String,
    /// The object's id (a secret's name).
    pub object_id: String,
    /// The client's address as the brain saw it; absent for a tool call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Non-secret facts: names of changed fields, a secret's name.
    #[schema(value_type = Object)]
    pub details: Value,
}

/// Which entries a listing shows.
#[derive(Clone, Copy, Debug, Default)]
pub struct AuditFilter<'a> {
    /// Only entries about this object id.
    pub object: Option<&'a str>,
    /// Only entries by this actor (a key's id, a token's user).
    pub actor: Option<&'a str>,
}

type EntryTuple = (
    Uuid,
    DateTime<Utc>,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    Value,
);

impl Store {
    /// A page of the team's entries, newest first: at most `limit` before `before`.
    pub async fn audit_entries(
        &self,
        team: TeamId,
        filter: AuditFilter<'_>,
        before: Option<Keyset>,
        limit: i64,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let sql = format!(
            "SELECT id, created_at, actor_kind, actor, action, object_kind, object_id, \
               host(address), details FROM audit_log \
             WHERE team_id = $1 AND ($5::text IS NULL OR object_id = $5) \
               AND ($6::text IS NULL OR actor = $6) AND {} \
             ORDER BY created_at DESC, id DESC LIMIT $2",
            super::keyset_after("<", "$3", "$4")
        );
        let rows: Vec<EntryTuple> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(limit)
            .bind(before.map(|k| k.at))
            .bind(before.map(|k| k.id))
            .bind(filter.object)
            .bind(filter.actor)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(
                |(id, at, kind, actor, action, object_kind, object_id, address, details)| {
                    Ok(AuditEntry {
                        id,
                        at,
                        actor_kind: ActorKind::parse(&kind).ok_or_else(|| {
                            StoreError::Corrupt(format!("audit entry {id} has actor kind {kind}"))
                        })?,
                        actor,
                        action,
                        object_kind,
                        object_id,
                        address,
                        details,
                    })
                },
            )
            .collect()
    }

    /// Deletes at most `limit` entries older than `retention_days`, oldest first; answers
    /// how many. Replicas sweeping at once skip each other's rows.
    pub async fn expire_audit_entries(
        &self,
        retention_days: u32,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM audit_log WHERE id IN ( \
               SELECT id FROM audit_log WHERE created_at < now() - make_interval(days => $1) \
               ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind(i32::try_from(retention_days).unwrap_or(i32::MAX))
        .bind(limit)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turns_actor_is_read_from_its_authority() {
        let key = Actor::of_turn("key:0190c5a4-0000-7000-8000-000000000001");
        assert_eq!(key.kind, ActorKind::Key);
        assert_eq!(key.id, "0190c5a4-0000-7000-8000-000000000001");
        assert_eq!(key.address, None);
        let user = Actor::of_turn("user:alice:x");
        assert_eq!((user.kind, user.id.as_str()), (ActorKind::User, "alice:x"));
        let old = Actor::of_turn("unknown");
        assert_eq!((old.kind, old.id.as_str()), (ActorKind::Unknown, "unknown"));
    }
}
