//! The one place that knows HTTP status codes.
//!
//! Every handler returns `Result<_, ApiError>`; this file turns an `ApiError` into a
//! status and the `{"error":{"code","message"}}` body. Details of 5xx failures are logged
//! here with their class and never returned. [`JsonBody`] is the other way in: it turns
//! every failure to decode a request body into `invalid_request` or `payload_too_large`,
//! for the API's handlers and the worker-facing ones in `sessions/` alike.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use protocol::{ErrorBody, ErrorCode, ErrorDetail, TurnId};
use serde::de::DeserializeOwned;

use crate::AppState;
use crate::respond;
use engine::artifacts::{ArtifactError, SaveError};
use engine::auth::AuthError;
use engine::erasure::EraseError;
use engine::events::EventsError;
use engine::events::follow::FollowError;
use engine::files::FileError;
use engine::intake::Overloaded;
use engine::knowledge::KnowledgeError;
use engine::quota::Refusal;
use engine::sessions::SnapshotError;
use engine::turn::TurnError;
use engine::turn::answer::AnswerError;
use engine::turn::post::PostError;
use engine::turn::stop::StopError;
use providers::ProviderError;
use store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing or unknown API key")]
    Unauthorized,
    /// Credentials that were refused for the short reason given (never the credentials).
    #[error("credentials refused: {0}")]
    Refused(&'static str),
    #[error("this operation needs an admin key or token")]
    Forbidden,
    #[error("this team is disabled; its platform operator can enable it again")]
    TeamDisabled,
    #[error("this user is disabled; an admin of the team can enable them again")]
    UserDisabled,
    /// The JWT issuer's keys could not be fetched.
    #[error("the token issuer's signing keys are unavailable; retry")]
    AuthUnavailable,
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    InvalidRequest(String),
    /// An elicitation's answer does not fit its form (P5); the message names the field.
    #[error("{0}")]
    InvalidContent(String),
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// T22: one file past `BRAIN_FILE_MAX_BYTES`.
    #[error("a file may have at most {0} bytes")]
    FileTooLarge(usize),
    /// T22: a message's files past `BRAIN_FILE_MAX_BYTES_PER_MESSAGE`.
    #[error("a message's files may have at most {0} bytes together")]
    MessageFilesTooLarge(usize),
    /// T22: the team's files past `BRAIN_FILE_QUOTA_BYTES`.
    #[error("the team's stored files would pass their quota of {0} bytes")]
    FileQuotaExceeded(u64),
    /// B3: the team's knowledge documents past `BRAIN_KNOWLEDGE_QUOTA_BYTES`.
    #[error("the team's knowledge documents would pass their quota of {0} bytes")]
    KnowledgeQuotaExceeded(u64),
    /// B3: the team's knowledge bases or documents at their bound; the message says which.
    #[error("{0}")]
    KnowledgeLimitReached(String),
    /// B8: a skill's archive is not one valid Agent Skills folder; the message says why.
    #[error("{0}")]
    InvalidSkill(String),
    /// B8: a skill's archive holds an entry that could leave its folder.
    #[error("{0}")]
    UnsafeSkillArchive(String),
    /// B8: a skill's files past a size bound; the message says which.
    #[error("{0}")]
    SkillTooLarge(String),
    /// B8: an agent names no skill of its team.
    #[error("{0}")]
    UnknownSkill(String),
    /// B8: the team has `BRAIN_SKILLS_MAX` skills.
    #[error("{0}")]
    SkillLimitReached(String),
    /// An agent names an id that is no knowledge base of its team (B5).
    #[error("{0}")]
    UnknownKnowledgeBase(String),
    /// An agent's delegates name itself or no live agent of its team (B7).
    #[error("{0}")]
    UnknownDelegate(String),
    /// T26: a signed file URL that expired or whose signature is not the file's.
    #[error(transparent)]
    FileUrlRefused(#[from] engine::files::UrlRefused),
    #[error("this message id's turn is still running")]
    TurnInProgress(TurnId),
    /// A uniqueness rule of the request's resource (the message says which).
    #[error("{0}")]
    Conflict(String),
    /// The running turn is named only to a principal who may read it (X1).
    #[error("the agent is running another turn")]
    AgentBusy(Option<TurnId>),
    /// T13: the agent's queue of waiting messages is full.
    #[error("the agent is busy and its queue of waiting messages is full; retry later")]
    QueueFull,
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error("store unavailable")]
    Store(#[source] StoreError),
    /// The artifact store (local directory or S3) failed or refused the credentials.
    #[error("object storage unavailable")]
    Storage(#[source] ArtifactError),
    #[error("internal error")]
    Internal(String),
    /// This replica is draining (SIGTERM): it finishes its turns and starts none.
    #[error("this server is shutting down; retry the request")]
    ShuttingDown,
    /// The queue of turn intakes is past its bound; nothing was written (`engine::intake`).
    #[error(transparent)]
    Overloaded(#[from] Overloaded),
    /// This replica, or the team's share of it, is taking as many snapshot uploads as it
    /// may hold at once; nothing was read.
    #[error("too many workspace snapshots are uploading at once; retry after Retry-After")]
    UploadsBusy(std::time::Duration),
    /// The chat's events stream could not be read from Redis (S2).
    #[error("the chat's events stream is unavailable; retry")]
    EventsUnavailable,
    /// The principal's or the replica's cap on open observer streams is reached (S2).
    #[error("too many observer streams open; close one or retry later")]
    TooManyObservers,
    /// The principal's or the replica's cap on MCP sessions is reached (P2).
    #[error(transparent)]
    TooManySessions(#[from] crate::mcp_server::SessionsFull),
    /// A browser's `Origin` names another host than the request's (MCP's transport rule
    /// against DNS rebinding).
    #[error("the Origin header names another host than this server")]
    OriginRefused,
    /// A team quota refuses the request before anything is spent (T2, E2).
    #[error("{}", .0.message())]
    Quota(Refusal),
    /// The caller's request rate limit (its key's, its user's or its address's) is
    /// reached.
    #[error("too many requests from these credentials or this address; retry after Retry-After")]
    RateLimited(engine::ratelimit::Refusal),
    /// The turn runs on another replica and Redis did not take the stop there (T8).
    #[error(
        "the turn runs on another replica and the stop could not be handed to it \
         (Redis unavailable); nothing was stopped, retry"
    )]
    StopUndeliverable,
    /// The operation needs configuration this server lacks (the message names it).
    #[error("{0}")]
    NotConfigured(&'static str),
    /// The connector's server let the brain in without authorization.
    #[error("the connector's MCP server does not ask for authorization")]
    AuthorizationNotRequired,
    /// A step of the OAuth flow failed at the MCP or authorization server: the step and an
    /// error class, never a server's message.
    #[error("authorization failed at {step}: {class}")]
    AuthorizationFailed {
        step: &'static str,
        class: &'static str,
    },
    /// The team's pending A2A push notifications are at their bound (the number given).
    #[error(
        "the team has {0} push notifications pending, as many as allowed; retry once \
         receivers have taken some"
    )]
    PushBacklogFull(i64),
    /// An agent's route names a provider connection the team lacks (T14); the message
    /// names it.
    #[error("{0}")]
    UnknownConnection(String),
    /// A provider connection still named by agents of the team (T14).
    #[error("{0}")]
    ProviderInUse(String),
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound => Self::NotFound("resource"),
            other => Self::Store(other),
        }
    }
}

impl From<engine::models::connections::RouteCheckError> for ApiError {
    fn from(err: engine::models::connections::RouteCheckError) -> Self {
        match err {
            engine::models::connections::RouteCheckError::Unknown(message) => {
                Self::UnknownConnection(message)
            }
            engine::models::connections::RouteCheckError::Store(e) => e.into(),
        }
    }
}

impl From<StopError> for ApiError {
    fn from(err: StopError) -> Self {
        match err {
            StopError::Undeliverable => Self::StopUndeliverable,
            StopError::NotFound(what) => Self::NotFound(what),
            StopError::Store(e) => e.into(),
            StopError::Auth(e) => e.into(),
        }
    }
}

impl From<EraseError> for ApiError {
    fn from(err: EraseError) -> Self {
        match err {
            EraseError::NotFound(what) => Self::NotFound(what),
            EraseError::Stop(e) => e.into(),
            EraseError::Store(e) => e.into(),
        }
    }
}

impl From<SnapshotError> for ApiError {
    fn from(err: SnapshotError) -> Self {
        match err {
            SnapshotError::Conflict(message) => Self::Conflict(message.into()),
            SnapshotError::Invalid(problem) => Self::InvalidRequest(problem),
            SnapshotError::TooLarge(limit) => Self::PayloadTooLarge(limit),
            SnapshotError::Busy(retry) => Self::UploadsBusy(retry),
            SnapshotError::Storage(e) => Self::Storage(e),
            SnapshotError::Store(e) => e.into(),
        }
    }
}

impl From<EventsError> for ApiError {
    fn from(err: EventsError) -> Self {
        match err {
            EventsError::Unavailable(_) => Self::EventsUnavailable,
            EventsError::TooManyObservers => Self::TooManyObservers,
        }
    }
}

impl From<FollowError> for ApiError {
    fn from(err: FollowError) -> Self {
        match err {
            FollowError::NotFound(what) => Self::NotFound(what),
            FollowError::Auth(e) => e.into(),
            FollowError::Store(e) => e.into(),
            FollowError::Events(e) => e.into(),
        }
    }
}

impl From<AnswerError> for ApiError {
    fn from(err: AnswerError) -> Self {
        match err {
            AnswerError::Invalid(message) => Self::InvalidRequest(message),
            AnswerError::InvalidContent(message) => Self::InvalidContent(message),
            AnswerError::NotFound => Self::NotFound("approval"),
            AnswerError::Conflict(message) => Self::Conflict(message),
            AnswerError::Auth(e) => e.into(),
            AnswerError::Post(e) => e.into(),
            AnswerError::Store(e) => e.into(),
            AnswerError::Lost(what) => Self::Internal(what.into()),
        }
    }
}

impl From<PostError> for ApiError {
    fn from(err: PostError) -> Self {
        match err {
            PostError::Turn(e) => e.into(),
            // Named by `post::busy` where the caller may read it.
            PostError::Busy(running) => Self::AgentBusy(running),
            PostError::Stop(e) => e.into(),
            PostError::Store(e) => e.into(),
            PostError::Lost(what) => Self::Internal(what.into()),
        }
    }
}

impl From<TurnError> for ApiError {
    fn from(err: TurnError) -> Self {
        match err {
            TurnError::NotFound(what) => Self::NotFound(what),
            TurnError::Busy(_) => Self::AgentBusy(None),
            TurnError::QueueFull => Self::QueueFull,
            TurnError::InProgress(turn) => Self::TurnInProgress(turn),
            TurnError::Quota(refusal) => Self::Quota(refusal),
            TurnError::Overloaded(overloaded) => Self::Overloaded(overloaded),
            TurnError::ShuttingDown => Self::ShuttingDown,
            TurnError::Provider(e) => Self::Provider(e),
            TurnError::Store(e) => e.into(),
            TurnError::Conflict(message) => Self::Conflict(message),
            TurnError::Revoked => Self::Refused("revoked"),
            TurnError::Internal(message) => Self::Internal(message),
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(err: AuthError) -> Self {
        match err {
            AuthError::Refused(reason) => Self::Refused(reason),
            AuthError::Forbidden => Self::Forbidden,
            AuthError::TeamDisabled => Self::TeamDisabled,
            AuthError::UserDisabled => Self::UserDisabled,
            AuthError::NotFound(what) => Self::NotFound(what),
            AuthError::KeysUnavailable => Self::AuthUnavailable,
            AuthError::Store(e) => e.into(),
        }
    }
}

impl From<ArtifactError> for ApiError {
    fn from(err: ArtifactError) -> Self {
        match err {
            ArtifactError::NotFound => Self::NotFound("artifact"),
            other => Self::Storage(other),
        }
    }
}

impl From<SaveError> for ApiError {
    fn from(err: SaveError) -> Self {
        match err {
            SaveError::TooLarge { limit } => Self::PayloadTooLarge(limit),
            SaveError::Invalid(problem) => Self::InvalidRequest(problem.into()),
            SaveError::Storage(e) => Self::Storage(e),
            SaveError::Store(StoreError::NotFound) => Self::NotFound("agent, chat or turn"),
            SaveError::Store(e) => Self::Store(e),
        }
    }
}

impl From<FileError> for ApiError {
    fn from(err: FileError) -> Self {
        match err {
            FileError::TooLarge { limit } => Self::FileTooLarge(limit),
            FileError::MessageTooLarge { limit } => Self::MessageFilesTooLarge(limit),
            FileError::QuotaExceeded { quota } => Self::FileQuotaExceeded(quota),
            FileError::Busy(retry) => Self::UploadsBusy(retry),
            FileError::Invalid(problem) => Self::InvalidRequest(problem.into()),
            FileError::NotFound => Self::NotFound("file"),
            FileError::Storage(e) => e.into(),
            FileError::Store(e) => e.into(),
        }
    }
}

impl From<engine::skills::SkillError> for ApiError {
    fn from(err: engine::skills::SkillError) -> Self {
        use engine::skills::{ArchiveError, SkillError};
        match err {
            SkillError::Archive(e @ ArchiveError::Invalid(_)) => Self::InvalidSkill(e.to_string()),
            SkillError::Archive(e @ ArchiveError::Unsafe(_)) => {
                Self::UnsafeSkillArchive(e.to_string())
            }
            SkillError::Archive(e @ ArchiveError::TooLarge(_)) => {
                Self::SkillTooLarge(e.to_string())
            }
            e @ SkillError::LimitReached(_) => Self::SkillLimitReached(e.to_string()),
            SkillError::Artifact(e) => e.into(),
            SkillError::Store(e) => e.into(),
        }
    }
}

impl From<engine::skills::AgentSkillsError> for ApiError {
    fn from(err: engine::skills::AgentSkillsError) -> Self {
        match err {
            engine::skills::AgentSkillsError::Unknown(problem) => Self::UnknownSkill(problem),
            engine::skills::AgentSkillsError::Store(e) => e.into(),
        }
    }
}

impl From<KnowledgeError> for ApiError {
    fn from(err: KnowledgeError) -> Self {
        match err {
            KnowledgeError::NotFound => Self::NotFound("knowledge base or document"),
            KnowledgeError::Invalid(problem) => Self::InvalidRequest(problem),
            KnowledgeError::TooLarge { limit } => Self::FileTooLarge(limit),
            KnowledgeError::QuotaExceeded { quota } => Self::KnowledgeQuotaExceeded(quota),
            e @ KnowledgeError::LimitReached { .. } => Self::KnowledgeLimitReached(e.to_string()),
            KnowledgeError::Storage(e) => e.into(),
            KnowledgeError::Store(e) => e.into(),
        }
    }
}

impl ApiError {
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Unauthorized | Self::Refused(_) => ErrorCode::Unauthorized,
            Self::Forbidden => ErrorCode::Forbidden,
            Self::TeamDisabled => ErrorCode::TeamDisabled,
            Self::UserDisabled => ErrorCode::UserDisabled,
            Self::AuthUnavailable => ErrorCode::AuthUnavailable,
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::InvalidRequest(_) => ErrorCode::InvalidRequest,
            Self::InvalidContent(_) => ErrorCode::InvalidContent,
            Self::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            Self::PayloadTooLarge(_) => ErrorCode::PayloadTooLarge,
            Self::FileTooLarge(_) => ErrorCode::FileTooLarge,
            Self::MessageFilesTooLarge(_) => ErrorCode::MessageFilesTooLarge,
            Self::FileQuotaExceeded(_) => ErrorCode::FileQuotaExceeded,
            Self::KnowledgeQuotaExceeded(_) => ErrorCode::KnowledgeQuotaExceeded,
            Self::KnowledgeLimitReached(_) => ErrorCode::KnowledgeLimitReached,
            Self::InvalidSkill(_) => ErrorCode::InvalidSkill,
            Self::UnsafeSkillArchive(_) => ErrorCode::UnsafeSkillArchive,
            Self::SkillTooLarge(_) => ErrorCode::FileTooLarge,
            Self::UnknownSkill(_) => ErrorCode::UnknownSkill,
            Self::SkillLimitReached(_) => ErrorCode::SkillLimitReached,
            Self::UnknownKnowledgeBase(_) => ErrorCode::UnknownKnowledgeBase,
            Self::UnknownDelegate(_) => ErrorCode::UnknownDelegate,
            Self::FileUrlRefused(_) => ErrorCode::InvalidFileUrl,
            Self::TurnInProgress(_) => ErrorCode::TurnInProgress,
            Self::Conflict(_) => ErrorCode::Conflict,
            Self::AgentBusy(_) => ErrorCode::AgentBusy,
            Self::QueueFull => ErrorCode::QueueFull,
            Self::Provider(e) => e.code(),
            Self::Store(_) | Self::StopUndeliverable => ErrorCode::StoreUnavailable,
            Self::Storage(_) => ErrorCode::StorageUnavailable,
            Self::Internal(_) => ErrorCode::Internal,
            Self::ShuttingDown => ErrorCode::ShuttingDown,
            Self::Overloaded(_) | Self::UploadsBusy(_) => ErrorCode::Overloaded,
            Self::EventsUnavailable => ErrorCode::EventsUnavailable,
            Self::TooManyObservers => ErrorCode::TooManyObservers,
            Self::TooManySessions(_) => ErrorCode::TooManySessions,
            Self::OriginRefused => ErrorCode::Forbidden,
            Self::Quota(refusal) => refusal.code(),
            Self::RateLimited(_) => ErrorCode::RateLimited,
            Self::NotConfigured(_) => ErrorCode::NotConfigured,
            Self::AuthorizationNotRequired => ErrorCode::AuthorizationNotRequired,
            Self::AuthorizationFailed { .. } => ErrorCode::AuthorizationFailed,
            Self::PushBacklogFull(_) => ErrorCode::PushBacklogFull,
            Self::UnknownConnection(_) => ErrorCode::UnknownConnection,
            Self::ProviderInUse(_) => ErrorCode::ProviderInUse,
        }
    }

    fn status(&self) -> StatusCode {
        match self.code() {
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            // A signed file URL is a capability, not the caller's credentials: `403`, as
            // a refused credential's `401` would send a client (the web chat) back to
            // sign-in for an image link that merely expired.
            ErrorCode::Forbidden
            | ErrorCode::TeamDisabled
            | ErrorCode::UserDisabled
            | ErrorCode::InvalidFileUrl => StatusCode::FORBIDDEN,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::InvalidRequest
            | ErrorCode::UnknownConnection
            | ErrorCode::InvalidSkill
            | ErrorCode::UnsafeSkillArchive
            | ErrorCode::UnknownSkill
            | ErrorCode::UnknownKnowledgeBase
            | ErrorCode::UnknownDelegate => StatusCode::BAD_REQUEST,
            ErrorCode::InvalidContent => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::PayloadTooLarge
            | ErrorCode::FileTooLarge
            | ErrorCode::MessageFilesTooLarge
            | ErrorCode::FileQuotaExceeded
            | ErrorCode::KnowledgeQuotaExceeded => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::AgentBusy
            | ErrorCode::TurnInProgress
            | ErrorCode::Conflict
            | ErrorCode::ProviderInUse
            | ErrorCode::AuthorizationNotRequired => StatusCode::CONFLICT,
            ErrorCode::RateLimited
            | ErrorCode::QuotaExceeded
            | ErrorCode::TooManyObservers
            | ErrorCode::TooManySessions
            | ErrorCode::QueueFull
            | ErrorCode::PushBacklogFull
            | ErrorCode::SkillLimitReached
            | ErrorCode::KnowledgeLimitReached => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::QuotaExhausted => StatusCode::PAYMENT_REQUIRED,
            ErrorCode::ProviderUnavailable
            | ErrorCode::StoreUnavailable
            | ErrorCode::StorageUnavailable
            | ErrorCode::AuthUnavailable
            | ErrorCode::EventsUnavailable
            | ErrorCode::ShuttingDown
            | ErrorCode::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::ProviderRejected | ErrorCode::AuthorizationFailed => StatusCode::BAD_GATEWAY,
            ErrorCode::NotConfigured => StatusCode::NOT_IMPLEMENTED,
            // A turn's or a fire's end state, never a request's answer.
            ErrorCode::Internal
            | ErrorCode::ReplicaLost
            | ErrorCode::TakeoverLimit
            | ErrorCode::TurnStuck
            | ErrorCode::SetterRevoked => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The message a client may see: 5xx internals stay in the log.
    pub fn public_message(&self) -> String {
        match self {
            Self::Store(_) => {
                "a store the request needs is unavailable; nothing was sent to a model".into()
            }
            Self::Storage(_) => "the object storage that holds artifacts is unavailable".into(),
            Self::Internal(_) => "internal error".into(),
            Self::Provider(err) => err.public_message(),
            other => other.to_string(),
        }
    }

    /// How long a client should wait before trying again (`Retry-After`), when that is
    /// known.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Provider(ProviderError::RateLimited { retry_after }) => *retry_after,
            // Another replica can take it at once.
            Self::ShuttingDown => Some(std::time::Duration::from_secs(1)),
            Self::EventsUnavailable => Some(std::time::Duration::from_secs(1)),
            // Places free only as other streams close, which nothing here can foresee.
            Self::TooManyObservers => Some(std::time::Duration::from_secs(5)),
            // Places free as sessions end or idle out.
            Self::TooManySessions(_) => Some(std::time::Duration::from_secs(5)),
            // A place frees when the agent's running turn ends, which nothing here foresees.
            Self::QueueFull => Some(std::time::Duration::from_secs(10)),
            // Receivers drain it at their own pace; a first retry of a failed delivery
            // comes after `BRAIN_WEBHOOKS_RETRY_BASE_MS`.
            Self::PushBacklogFull(_) => Some(std::time::Duration::from_secs(30)),
            Self::Overloaded(refused) => Some(refused.retry_after),
            Self::UploadsBusy(after) => Some(*after),
            Self::Quota(refusal) => Some(refusal.retry_after),
            Self::RateLimited(refusal) => Some(refusal.retry_after),
            // The keys are fetched again at most this often.
            Self::AuthUnavailable => Some(std::time::Duration::from_secs(5)),
            _ => None,
        }
    }

    /// Logs what a 5xx answer hides from its client (classes, never message text).
    pub fn log_server_error(&self) {
        if self.status().is_server_error() {
            match self {
                Self::Store(e) => {
                    tracing::error!(class = e.metric_label(), error = %e, "store failure")
                }
                Self::Storage(e) => {
                    tracing::error!(class = e.metric_label(), error = %e, "object storage failure")
                }
                Self::Internal(detail) => tracing::error!(detail, "internal error"),
                Self::Provider(e) => tracing::warn!(class = e.metric_label(), "provider failure"),
                Self::StopUndeliverable => tracing::warn!("stop undeliverable: Redis unavailable"),
                _ => {}
            }
        }
    }

    pub fn turn_id(&self) -> Option<TurnId> {
        match self {
            Self::TurnInProgress(id) => Some(*id),
            Self::AgentBusy(id) => *id,
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        self.log_server_error();
        let retry_after = self.retry_after();
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: self.public_message(),
                turn_id: self.turn_id(),
                scope: match &self {
                    Self::Quota(refusal) => Some(refusal.scope),
                    _ => None,
                },
            },
        };
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(after) = retry_after
            && let Ok(value) = HeaderValue::from_str(&after.as_secs().max(1).to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        match &self {
            Self::Quota(refusal) => respond::rate_limit(&refusal.headers, response.headers_mut()),
            Self::RateLimited(refusal) => {
                respond::rate_limit(&refusal.headers, response.headers_mut())
            }
            _ => {}
        }
        response
    }
}

/// A JSON body decoded into a closed type; failures become stable error codes.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(JsonRejection::BytesRejection(e))
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE =>
            {
                Err(ApiError::PayloadTooLarge(state.config.max_body_bytes))
            }
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::InvalidRequest(
                "expected Content-Type: application/json".into(),
            )),
            Err(e) => Err(ApiError::InvalidRequest(e.body_text())),
        }
    }
}
