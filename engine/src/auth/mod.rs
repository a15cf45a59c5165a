//! Who the caller is and what it may do (SPEC X1).
//!
//! - `keys.rs`: API keys: their lookup with a replica-local cache that is trusted only
//!   while its invalidation subscription in Redis is live, creation and revocation.
//! - `jwt.rs`: bearer JWTs from the configured issuer, verified against its JWKS (fetched
//!   and cached) or inline public keys.
//! - `issuers.rs`: JWTs of a team's own issuers (`POST /v1/issuers`), accepted for that
//!   team only.
//! - `operator.rs`: the platform operator's bearer, which reaches the team API only (L1).
//!
//! A request's bearer becomes a [`Principal`]: its team, its [`Scope`], the JWT user if
//! any, and whether it sees every chat of the team. The rules of what a principal may do
//! live here, so a route asks (`require_admin`, `check_chat`) rather than decides.
//!
//! A route checks the credential once; a response that outlives its request (an events
//! stream, a turn's stream) also runs under the principal's [`Standing`], which ends when
//! its key is revoked or its team disabled on any replica, or its token expires.

pub mod issuers;
pub mod jwt;
pub mod keys;
pub mod operator;

use std::time::SystemTime;

use protocol::{ChatId, TeamId};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use store::{Actor, Store, StoreError};

pub use issuers::TeamIssuers;
pub use jwt::{JwtConfig, JwtVerifier};
pub use keys::Keys;
pub use operator::OperatorToken;

/// Whether two secrets' bytes are equal, in time that depends on their length only.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What a principal may do.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Everything a `chat` principal may, plus managing keys, agents, connectors and
    /// quotas.
    Admin,
    /// Run turns, open and read chats (their messages, artifacts and worker sessions),
    /// read agents.
    Chat,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Chat => "chat",
        }
    }

    fn parse(stored: &str) -> Option<Self> {
        match stored {
            "admin" => Some(Self::Admin),
            "chat" => Some(Self::Chat),
            _ => None,
        }
    }
}

/// The authenticated caller of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub team: TeamId,
    pub scope: Scope,
    /// The JWT's user claim; `None` for an API key.
    pub user: Option<String>,
    /// Whether every chat of the team is visible, or only the user's own.
    pub sees_all_chats: bool,
    /// The API key's id; `None` for a JWT.
    pub key_id: Option<Uuid>,
    /// The API key's hash (never the key), so its revocation reaches what it holds open.
    pub key: Option<[u8; 32]>,
    /// When a token stops being accepted (its `exp` plus the leeway); `None` for a key.
    pub expires: Option<SystemTime>,
}

/// Whose authority a turn acts with (X1): what its tools may change. A tool that changes
/// the agent for everyone (its schedule, its secrets, the team's agents) runs only when
/// the principal behind the turn could make the same change over the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authority {
    pub scope: Scope,
    /// Who, as recorded beside what the turn changes: `key:<id>` or `user:<subject>`;
    /// never a credential.
    pub actor: String,
}

impl Authority {
    /// A turn's authority as its row keeps it (`turns.actor`, `actor_admin`): a row from
    /// before the actor was recorded acts as nobody in particular, with a chat's scope.
    pub fn of_turn(actor: Option<String>, admin: bool) -> Self {
        Self {
            scope: if admin { Scope::Admin } else { Scope::Chat },
            actor: actor.unwrap_or_else(|| "unknown".to_owned()),
        }
    }

    /// The end user (a JWT's subject) behind the turn, whose own budgets it counts against
    /// (L4); `None` for an API key's turn, which counts at the team's level only.
    pub fn user(&self) -> Option<&str> {
        self.actor.strip_prefix("user:").filter(|u| !u.is_empty())
    }

    /// Whether changes to the agent for everyone are allowed (`PATCH /v1/agents/{id}`'s
    /// rule).
    pub fn may_change_agent(&self) -> bool {
        self.scope == Scope::Admin
    }

    /// Who the turn's tools change things as, in the audit log (L5): no address, since
    /// the model made the call.
    pub fn audit_actor(&self) -> Actor {
        Actor::of_turn(&self.actor)
    }
}

/// Why a principal was not made or may not go on. The API maps each to a status.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No credentials, an unknown or revoked key, or a refused token; the reason is short
    /// and never echoes the credentials.
    #[error("credentials refused: {0}")]
    Refused(&'static str),
    #[error("this operation needs an admin key or token")]
    Forbidden,
    /// The credentials' team was disabled by the operator (L1).
    #[error("this team is disabled")]
    TeamDisabled,
    /// The token's user was disabled by an admin of the team (X1).
    #[error("this user is disabled")]
    UserDisabled,
    /// A chat (or what belongs to one) this principal may not see: exactly as absent as
    /// another team's.
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The issuer's keys could not be fetched, so the token can be neither accepted nor
    /// refused.
    #[error("the token issuer's keys are unavailable")]
    KeysUnavailable,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Principal {
    /// An API key's principal: the whole team, with the key's scope.
    pub fn for_key(team: TeamId, scope: Scope, id: Uuid, key: [u8; 32]) -> Self {
        Self {
            team,
            scope,
            user: None,
            sees_all_chats: true,
            key_id: Some(id),
            key: Some(key),
            expires: None,
        }
    }

    /// The authority a turn this principal starts acts with.
    pub fn authority(&self) -> Authority {
        let actor = match (&self.key_id, &self.user) {
            (Some(id), _) => format!("key:{id}"),
            (None, Some(user)) => format!("user:{user}"),
            (None, None) => "unknown".to_owned(),
        };
        Authority {
            scope: self.scope,
            actor,
        }
    }

    /// Who this is in the audit log (L5), calling from `address`.
    pub fn actor(&self, address: Option<std::net::IpAddr>) -> Actor {
        Actor {
            address,
            ..Actor::of_turn(&self.authority().actor)
        }
    }

    /// Who this is, for limits per principal: its key, or its token's team and user.
    pub fn identity(&self) -> String {
        match (&self.key, &self.user) {
            (Some(hash), _) => format!("key:{}", keys::to_hex(hash)),
            (None, user) => format!("user:{}:{}", self.team, user.as_deref().unwrap_or("")),
        }
    }

    /// Refuses a principal without the admin scope (`403 forbidden`).
    pub fn require_admin(&self) -> Result<(), AuthError> {
        match self.scope {
            Scope::Admin => Ok(()),
            Scope::Chat => Err(AuthError::Forbidden),
        }
    }

    /// The user whose chats alone this principal sees; `None` when it sees the team's.
    pub fn only_chats_of(&self) -> Option<&str> {
        if self.sees_all_chats {
            None
        } else {
            self.user.as_deref()
        }
    }

    /// Refuses a chat this principal may not see as `NotFound`: another user's, for a
    /// principal restricted to its user's chats, and an agent's autostart chat for any but
    /// an admin (X1: its turns act with an admin's authority, so what others wrote there
    /// would steer them). Costs no query for an admin who sees the team's chats; the
    /// caller still reads the chat under the team, so an unknown or another team's id
    /// stays `NotFound` there.
    pub async fn check_chat(&self, store: &Store, chat: ChatId) -> Result<(), AuthError> {
        let admin = self.scope == Scope::Admin;
        if admin && self.only_chats_of().is_none() {
            return Ok(());
        }
        match bounded(store.chat_owner(self.team, chat)).await {
            Ok(owner) if owner.autostart && !admin => Err(AuthError::NotFound("chat")),
            Ok(owner) => match self.only_chats_of() {
                Some(user) if owner.created_by.as_deref() != Some(user) => {
                    Err(AuthError::NotFound("chat"))
                }
                _ => Ok(()),
            },
            Err(AuthError::Store(StoreError::NotFound)) => Err(AuthError::NotFound("chat")),
            Err(e) => Err(e),
        }
    }

    /// Refuses a search of the team's knowledge base `base` (B4, X1): an admin searches any;
    /// any other principal only a base an agent of the team names, whose `knowledge_search`
    /// would answer it the same passages (`Forbidden` otherwise). The caller reads the base
    /// under the team first, so another team's stays `NotFound`.
    pub async fn check_knowledge_search(&self, store: &Store, base: Uuid) -> Result<(), AuthError> {
        if self.scope == Scope::Admin {
            return Ok(());
        }
        if bounded(store.knowledge_base_named(self.team, base)).await? {
            Ok(())
        } else {
            Err(AuthError::Forbidden)
        }
    }

    /// [`Principal::check_chat`] for a message posted to `chat`, without its query for a
    /// principal who sees the team's chats: the turn's intake refuses an autostart chat
    /// to a non-admin from the chat row it reads anyway (`turn::start`), so the hot path
    /// of a chat key costs no round trip more.
    pub async fn check_chat_to_post(&self, store: &Store, chat: ChatId) -> Result<(), AuthError> {
        if self.only_chats_of().is_none() {
            return Ok(());
        }
        self.check_chat(store, chat).await
    }

    /// Refuses erasing `chat` (L2) unless this principal is an admin or the user who opened
    /// it: `NotFound` for a chat it may not see (or none), `Forbidden` for one it sees and
    /// did not open (a chat-scoped key, a user who sees the team's chats).
    pub async fn check_chat_eraser(&self, store: &Store, chat: ChatId) -> Result<(), AuthError> {
        if self.scope == Scope::Admin {
            return Ok(());
        }
        match bounded(store.chat_created_by(self.team, chat)).await {
            Ok(Some(owner)) if self.user.as_deref() == Some(owner.as_str()) => Ok(()),
            Ok(_) if self.only_chats_of().is_some() => Err(AuthError::NotFound("chat")),
            Ok(_) => Err(AuthError::Forbidden),
            Err(AuthError::Store(StoreError::NotFound)) => Err(AuthError::NotFound("chat")),
            Err(e) => Err(e),
        }
    }

    /// Refuses an artifact this principal may not see: for a user restricted to its own
    /// chats, an artifact of another user's chat or of no chat.
    pub async fn check_artifact_chat(
        &self,
        store: &Store,
        chat: Option<ChatId>,
    ) -> Result<(), AuthError> {
        if self.only_chats_of().is_none() {
            return Ok(());
        }
        let chat = chat.ok_or(AuthError::NotFound("artifact"))?;
        self.check_chat(store, chat).await.map_err(|e| match e {
            AuthError::NotFound(_) => AuthError::NotFound("artifact"),
            other => other,
        })
    }
}

/// What a response that outlives its request runs under: its principal's authority, which
/// ends when the key is revoked (on any replica: [`Keys`] hears every revocation) or the
/// token expires. Holding one keeps the key's place among what its revocation must end.
pub struct Standing {
    revoked: CancellationToken,
    expires: Option<tokio::time::Instant>,
    _held: Option<keys::Held>,
}

impl Standing {
    /// Returns once the authority has ended.
    pub async fn lost(&self) {
        match self.expires {
            Some(at) => tokio::select! {
                () = self.revoked.cancelled() => {}
                () = tokio::time::sleep_until(at) => {}
            },
            None => self.revoked.cancelled().await,
        }
    }
}

/// Authenticates bearers: API keys, and JWTs of the deployment's issuer (when one is
/// configured) or of a team's own.
#[derive(Clone)]
pub struct Auth {
    pub keys: Keys,
    jwt: Option<JwtVerifier>,
    pub issuers: TeamIssuers,
}

impl Auth {
    /// `issuers_allow_private`: whether team issuers' JWKS may be on private networks
    /// (`BRAIN_ISSUERS_ALLOW_PRIVATE_NETWORKS`).
    pub fn new(
        store: Store,
        redis: crate::redis::Client,
        jwt: Option<JwtConfig>,
        issuers_allow_private: bool,
    ) -> Self {
        let jwt = jwt.map(JwtVerifier::new);
        let issuers = TeamIssuers::new(
            store.clone(),
            issuers_allow_private,
            jwt.as_ref()
                .map(JwtVerifier::claim_names)
                .unwrap_or_default(),
            jwt.as_ref()
                .map_or(jwt::DEFAULT_MIN_REFETCH, JwtVerifier::min_refetch),
        );
        Self {
            keys: Keys::new(store, redis),
            jwt,
            issuers,
        }
    }

    /// The principal of a bearer credential. One that starts with `ar_` is an API key;
    /// anything else of three dot-separated parts is a JWT.
    pub async fn authenticate(&self, bearer: &str) -> Result<Principal, AuthError> {
        if bearer.starts_with(store::KEY_PREFIX) {
            return self.keys.principal(bearer).await;
        }
        if bearer.bytes().filter(|b| *b == b'.').count() != 2 {
            return Err(AuthError::Refused("not an API key or a JWT"));
        }
        let iss = jwt::unverified_issuer(bearer).ok_or(AuthError::Refused("malformed token"))?;
        // The deployment's issuer is the operator's, trusted for every team; any other
        // `iss` is at most one team's (`issuers.rs`).
        let principal = match &self.jwt {
            Some(jwt) if jwt.issuer() == iss => jwt.principal(bearer).await?,
            jwt => match self.issuers.principal(&iss, bearer).await? {
                Some(principal) => principal,
                // Refused there, as a token of the wrong issuer.
                None => match jwt {
                    Some(jwt) => jwt.principal(bearer).await?,
                    None => {
                        return Err(AuthError::Refused("tokens of this issuer are not accepted"));
                    }
                },
            },
        };
        self.keys.check_team(principal.team).await?;
        if let Some(user) = &principal.user {
            let admin = principal.scope == Scope::Admin;
            self.keys.check_user(principal.team, user, admin).await?;
        }
        Ok(principal)
    }

    /// The standing `principal` holds from now on, for a long-lived response.
    pub fn standing(&self, principal: &Principal) -> Standing {
        // A key's principal may name an end user (a chat's `user`), who holds no standing
        // of their own: only a token's user is disabled.
        let user = principal
            .key
            .is_none()
            .then_some(principal.user.as_deref())
            .flatten();
        let (revoked, held) = self.keys.hold(principal.team, principal.key, user);
        let expires = principal.expires.map(|at| {
            let left = at.duration_since(SystemTime::now()).unwrap_or_default();
            tokio::time::Instant::now() + left
        });
        Standing {
            revoked,
            expires,
            _held: held,
        }
    }
}

/// Runs a store call under the store's bound.
fn bounded<T>(
    call: impl Future<Output = Result<T, StoreError>>,
) -> impl Future<Output = Result<T, AuthError>> {
    use futures_util::TryFutureExt;
    store::bounded(call).map_err(AuthError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_and_views() {
        let team = TeamId::new();
        let admin = Principal::for_key(team, Scope::Admin, Uuid::nil(), [1; 32]);
        let chat = Principal::for_key(team, Scope::Chat, Uuid::nil(), [2; 32]);
        assert!(admin.require_admin().is_ok());
        assert!(matches!(chat.require_admin(), Err(AuthError::Forbidden)));
        assert_eq!(chat.only_chats_of(), None, "a key sees the whole team");
        let user = Principal {
            team,
            scope: Scope::Chat,
            user: Some("u1".into()),
            sees_all_chats: false,
            key_id: None,
            key: None,
            expires: None,
        };
        assert_eq!(user.authority().actor, "user:u1");
        assert_eq!(user.authority().user(), Some("u1"));
        assert!(!user.authority().may_change_agent());
        assert!(admin.authority().may_change_agent());
        assert_eq!(admin.authority().actor, format!("key:{}", Uuid::nil()));
        assert_eq!(admin.authority().user(), None);
        assert_eq!(user.only_chats_of(), Some("u1"));
        assert_eq!(Scope::parse("chat"), Some(Scope::Chat));
        assert_eq!(Scope::parse("owner"), None);
    }
}
