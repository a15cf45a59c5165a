//! Stable error codes: the `code` of every JSON error body and of every error chunk.
//!
//! Clients branch on these strings, so a variant is never renamed; new failure kinds get
//! new variants.

use serde::{Deserialize, Serialize};

/// The machine-readable reason a request or a turn failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// No credentials, an unknown or revoked API key, or a refused JWT.
    Unauthorized,
    /// The credentials are valid but their scope does not allow the operation (a `chat`
    /// key or a user token on an admin-only route).
    Forbidden,
    /// The credentials' team was disabled by the platform operator (L1).
    TeamDisabled,
    /// The token's user was disabled by an admin of the team (X1).
    UserDisabled,
    /// The issuer's signing keys (the JWKS) could not be fetched, so a token could be
    /// neither accepted nor refused; retry.
    AuthUnavailable,
    /// The resource does not exist or belongs to another team.
    NotFound,
    /// The body or a parameter does not match the closed schema.
    InvalidRequest,
    /// The values of an answered form do not fit the form an MCP server asked for (P5):
    /// a field it does not have, a value of the wrong type or out of its bounds, a required
    /// field missing; the message names the field.
    InvalidContent,
    /// The route exists but not with this HTTP method.
    MethodNotAllowed,
    /// The body is larger than the endpoint accepts.
    PayloadTooLarge,
    /// The agent is running another turn; the body names it.
    AgentBusy,
    /// The message id was already used and its turn is still running.
    TurnInProgress,
    /// The agent is busy and as many queued turns wait for it as allowed (T13); retry
    /// after `Retry-After`.
    QueueFull,
    /// The request collides with an existing resource (a name already taken).
    Conflict,
    /// Too many requests: the caller's request rate limit (its API key's, its JWT user's,
    /// or without valid credentials its address's), with `Retry-After` and the
    /// `RateLimit` headers; or the model provider answered 429.
    RateLimited,
    /// The model provider is down, refused the connection, timed out or cut its stream.
    ProviderUnavailable,
    /// The model provider refused the request (bad key, unknown model, bad request).
    ProviderRejected,
    /// A store the turn needs (Postgres) failed; nothing was sent to a provider.
    StoreUnavailable,
    /// The object storage that holds files and artifacts failed or refused the brain's
    /// credentials; the details are in the server log.
    StorageUnavailable,
    /// A bug or an unexpected failure; details are in the server log, never in the body.
    Internal,
    /// The brain replica running the turn died (its lease lapsed) before the turn ended;
    /// another replica ended it `interrupted` (O3).
    ReplicaLost,
    /// The turn's replica died once too often: live replicas took it over (D3) as many
    /// times as a turn may be, so it ended `failed` instead of being taken over again (a
    /// turn that kills its replica must not kill the fleet one replica at a time).
    TakeoverLimit,
    /// The turn made no progress (no model output, no tool output or progress, no person
    /// asked) for `BRAIN_TURN_STUCK_AFTER_MS`, so it was ended `failed` and its hold
    /// released (T20).
    TurnStuck,
    /// This brain replica is shutting down and starts no new turn; retry, and the load
    /// balancer sends the request to another replica (O3).
    ShuttingDown,
    /// This brain replica's queue of turn intakes is full, or the request waited its
    /// longest in it; nothing was written or sent to a model. Retry after `Retry-After`.
    Overloaded,
    /// A rate or concurrency quota of the team (turns per minute, concurrent turns or
    /// worker sessions) is reached; retry after `Retry-After` (SPEC E2).
    QuotaExceeded,
    /// A period budget of the team (model tokens per day or month, worker-seconds per
    /// day) is spent; it resets at the time `Retry-After` says (SPEC E2).
    QuotaExhausted,
    /// The chat's events stream (Redis) could not be read; retry with `Last-Event-ID`.
    EventsUnavailable,
    /// The principal, or the replica, has as many observer streams (events, resumed turn
    /// streams) open as allowed; close one, or retry after `Retry-After`.
    TooManyObservers,
    /// The principal, or the replica, has as many MCP sessions open as allowed (P2); end
    /// one (`DELETE /mcp`), or retry after `Retry-After`.
    TooManySessions,
    /// The operation needs something this server's operator has not configured (such as
    /// `BRAIN_SECRETS_KEY` for secrets); the message names it.
    NotConfigured,
    /// An autostart fire found who set the cadence no longer standing (the key revoked,
    /// the user disabled or seen without admin since): the cadence is paused until an
    /// admin sets it again (X1).
    SetterRevoked,
    /// The connector's MCP server answered without asking for authorization: there is
    /// nothing to authorize.
    AuthorizationNotRequired,
    /// The connector's MCP server or its authorization server failed or refused a step of
    /// the flow (discovery, registration, the token exchange); the message names the step
    /// and an error class.
    AuthorizationFailed,
    /// The team has as many A2A push notifications pending (waiting for delivery, or
    /// promised to tasks that have not ended) as allowed, so no further push config is
    /// kept; retry after `Retry-After`, once receivers have taken some.
    PushBacklogFull,
    /// An agent's route (its model or a fallback) names a provider connection the team
    /// does not have: neither one of the deployment's (`openai`, `anthropic`) nor one of
    /// the team's own (T14); the message names it.
    UnknownConnection,
    /// The provider connection is named by agents of the team (as a model or a fallback):
    /// change them first (T14); the message counts them.
    ProviderInUse,
    /// A file is larger than one file may be (`BRAIN_FILE_MAX_BYTES`, T22); nothing was
    /// stored.
    FileTooLarge,
    /// A message's files together are larger than one message may carry
    /// (`BRAIN_FILE_MAX_BYTES_PER_MESSAGE`, T22); nothing was stored or sent.
    MessageFilesTooLarge,
    /// The team's stored chat files would pass its quota (`BRAIN_FILE_QUOTA_BYTES`, T22);
    /// nothing was stored. Erasing chats frees it.
    FileQuotaExceeded,
    /// A skill's archive (B8) is not one Agent Skills folder: not a zip or tar.gz, no
    /// `SKILL.md`, its front matter without a valid `name` or `description`, or past the
    /// file count; the message says which. Nothing was stored.
    InvalidSkill,
    /// A skill's archive (B8) holds an entry that could leave its folder (an absolute path,
    /// `..`, a link) or a special file: refused whole, nothing stored.
    UnsafeSkillArchive,
    /// An agent's `skills` names no skill of its team (B8); the message names it.
    UnknownSkill,
    /// The team has as many skills as it may (`BRAIN_SKILLS_MAX`, B8); nothing was stored.
    SkillLimitReached,
    /// The team's knowledge documents would hold more bytes than
    /// `BRAIN_KNOWLEDGE_QUOTA_BYTES` (B3); nothing was stored. Deleting documents frees it.
    KnowledgeQuotaExceeded,
    /// The team has as many knowledge bases (`BRAIN_KNOWLEDGE_MAX_BASES`) or documents
    /// (`BRAIN_KNOWLEDGE_MAX_DOCUMENTS`) as it may (B3); nothing was stored.
    KnowledgeLimitReached,
    /// An agent's `knowledge_bases` names an id that is no knowledge base of its team (B5);
    /// the message names it.
    UnknownKnowledgeBase,
    /// An agent's `delegates` names itself or an id that is no live agent of its team
    /// (B7); the message names it.
    UnknownDelegate,
    /// A signed file URL (`/v1/files/{id}?exp=…&sig=…`, T26) has expired, or its signature
    /// is not that file's; read the transcript again for fresh URLs, or send the bearer.
    InvalidFileUrl,
}

impl ErrorCode {
    /// The code as it appears on the wire and as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::TeamDisabled => "team_disabled",
            Self::UserDisabled => "user_disabled",
            Self::AuthUnavailable => "auth_unavailable",
            Self::NotFound => "not_found",
            Self::InvalidRequest => "invalid_request",
            Self::InvalidContent => "invalid_content",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::PayloadTooLarge => "payload_too_large",
            Self::AgentBusy => "agent_busy",
            Self::TurnInProgress => "turn_in_progress",
            Self::QueueFull => "queue_full",
            Self::Conflict => "conflict",
            Self::RateLimited => "rate_limited",
            Self::ProviderUnavailable => "provider_unavailable",
            Self::ProviderRejected => "provider_rejected",
            Self::StoreUnavailable => "store_unavailable",
            Self::StorageUnavailable => "storage_unavailable",
            Self::Internal => "internal",
            Self::ReplicaLost => "replica_lost",
            Self::TakeoverLimit => "takeover_limit",
            Self::TurnStuck => "turn_stuck",
            Self::ShuttingDown => "shutting_down",
            Self::Overloaded => "overloaded",
            Self::QuotaExceeded => "quota_exceeded",
            Self::QuotaExhausted => "quota_exhausted",
            Self::EventsUnavailable => "events_unavailable",
            Self::TooManyObservers => "too_many_observers",
            Self::TooManySessions => "too_many_sessions",
            Self::NotConfigured => "not_configured",
            Self::SetterRevoked => "setter_revoked",
            Self::AuthorizationNotRequired => "authorization_not_required",
            Self::AuthorizationFailed => "authorization_failed",
            Self::PushBacklogFull => "push_backlog_full",
            Self::UnknownConnection => "unknown_connection",
            Self::ProviderInUse => "provider_in_use",
            Self::FileTooLarge => "file_too_large",
            Self::MessageFilesTooLarge => "message_files_too_large",
            Self::FileQuotaExceeded => "file_quota_exceeded",
            Self::InvalidSkill => "invalid_skill",
            Self::UnsafeSkillArchive => "unsafe_skill_archive",
            Self::UnknownSkill => "unknown_skill",
            Self::SkillLimitReached => "skill_limit_reached",
            Self::KnowledgeQuotaExceeded => "knowledge_quota_exceeded",
            Self::KnowledgeLimitReached => "knowledge_limit_reached",
            Self::UnknownKnowledgeBase => "unknown_knowledge_base",
            Self::UnknownDelegate => "unknown_delegate",
            Self::InvalidFileUrl => "invalid_file_url",
        }
    }

    /// Parses a code stored by [`ErrorCode::as_str`].
    pub fn parse(code: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(code.to_owned())).ok()
    }
}

/// `{"error": {...}}`, the body of every non-2xx answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The inside of an [`ErrorBody`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    /// Human-readable; never contains message text, prompts or secrets.
    pub message: String,
    /// The turn concerned, for `agent_busy` and `turn_in_progress`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<crate::TurnId>,
    /// For `quota_exhausted` and `quota_exceeded`: whose limit refused, the team's or the
    /// end user's (L4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<QuotaScope>,
}

/// Whose quota a refusal is of: the team's, or the end user's (a JWT's subject) under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum QuotaScope {
    Team,
    User,
}

impl QuotaScope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Team => "team",
            Self::User => "user",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_str_matches_serde() {
        for code in [
            ErrorCode::Unauthorized,
            ErrorCode::Forbidden,
            ErrorCode::TeamDisabled,
            ErrorCode::UserDisabled,
            ErrorCode::AuthUnavailable,
            ErrorCode::NotFound,
            ErrorCode::InvalidRequest,
            ErrorCode::InvalidContent,
            ErrorCode::MethodNotAllowed,
            ErrorCode::PayloadTooLarge,
            ErrorCode::AgentBusy,
            ErrorCode::TurnInProgress,
            ErrorCode::QueueFull,
            ErrorCode::Conflict,
            ErrorCode::RateLimited,
            ErrorCode::ProviderUnavailable,
            ErrorCode::ProviderRejected,
            ErrorCode::StoreUnavailable,
            ErrorCode::StorageUnavailable,
            ErrorCode::Internal,
            ErrorCode::ReplicaLost,
            ErrorCode::TakeoverLimit,
            ErrorCode::TurnStuck,
            ErrorCode::ShuttingDown,
            ErrorCode::Overloaded,
            ErrorCode::QuotaExceeded,
            ErrorCode::QuotaExhausted,
            ErrorCode::EventsUnavailable,
            ErrorCode::TooManyObservers,
            ErrorCode::TooManySessions,
            ErrorCode::NotConfigured,
            ErrorCode::SetterRevoked,
            ErrorCode::AuthorizationNotRequired,
            ErrorCode::AuthorizationFailed,
            ErrorCode::PushBacklogFull,
            ErrorCode::UnknownConnection,
            ErrorCode::ProviderInUse,
            ErrorCode::FileTooLarge,
            ErrorCode::MessageFilesTooLarge,
            ErrorCode::FileQuotaExceeded,
            ErrorCode::InvalidSkill,
            ErrorCode::UnsafeSkillArchive,
            ErrorCode::UnknownSkill,
            ErrorCode::SkillLimitReached,
            ErrorCode::KnowledgeQuotaExceeded,
            ErrorCode::KnowledgeLimitReached,
            ErrorCode::UnknownKnowledgeBase,
            ErrorCode::UnknownDelegate,
        ] {
            let wire = serde_json::to_value(code).unwrap();
            assert_eq!(wire, serde_json::Value::String(code.as_str().into()));
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
        }
        assert_eq!(ErrorCode::parse("nope"), None);
    }
}
