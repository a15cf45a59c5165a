//! Session tokens: short-lived JWTs (HS256) that let one worker act as one session.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use protocol::channel::{POOL_AUDIENCE, SessionClaims, WORKER_AUDIENCE};
use protocol::{AgentId, SessionId, TeamId};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TokenError {
    #[error("the signing key must have at least 32 bytes")]
    WeakKey,
    #[error("token expired")]
    Expired,
    #[error("token invalid")]
    Invalid,
}

/// Mints session tokens with one shared secret, and checks them against it and, while the
/// secret is rotated, one more (`accepted`): tokens signed with either are valid, new ones
/// are signed with the first only.
#[derive(Clone)]
pub struct TokenKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    accepted: Option<DecodingKey>,
}

impl std::fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKeys(..)")
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

impl TokenKeys {
    pub fn new(secret: &[u8]) -> Result<Self, TokenError> {
        if secret.len() < 32 {
            return Err(TokenError::WeakKey);
        }
        Ok(Self {
            encoding: EncodingKey::from_secret(secret).map_err(|_| TokenError::WeakKey)?,
            decoding: DecodingKey::from_secret(secret).map_err(|_| TokenError::WeakKey)?,
            accepted: None,
        })
    }

    /// Also accepts tokens signed with `accepted` (never signs with it): the key being
    /// rotated in or out (`SESSION_TOKEN_KEY_ACCEPTED`).
    pub fn also_accepting(mut self, accepted: &[u8]) -> Result<Self, TokenError> {
        if accepted.len() < 32 {
            return Err(TokenError::WeakKey);
        }
        self.accepted = Some(DecodingKey::from_secret(accepted).map_err(|_| TokenError::WeakKey)?);
        Ok(self)
    }

    /// A token for `session`, valid for `ttl`.
    pub fn mint(
        &self,
        session: SessionId,
        team: TeamId,
        agent: AgentId,
        ttl: Duration,
    ) -> Result<String, TokenError> {
        self.mint_for(WORKER_AUDIENCE, session, team, agent, ttl)
    }

    /// A pool token for warm-pool slot `slot` (R3): no team, no agent, its own audience.
    pub fn mint_pool(&self, slot: SessionId, ttl: Duration) -> Result<String, TokenError> {
        self.mint_for(POOL_AUDIENCE, slot, TeamId::nil(), AgentId::nil(), ttl)
    }

    fn mint_for(
        &self,
        audience: &str,
        sub: SessionId,
        team: TeamId,
        agent: AgentId,
        ttl: Duration,
    ) -> Result<String, TokenError> {
        let iat = now_secs();
        let claims = SessionClaims {
            sub,
            aud: audience.to_owned(),
            team,
            agent,
            iat,
            exp: iat + ttl.as_secs().max(1),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(|_| TokenError::Invalid)
    }

    /// The claims of a valid, unexpired token minted for the worker channel.
    pub fn verify(&self, token: &str) -> Result<SessionClaims, TokenError> {
        self.verify_for(WORKER_AUDIENCE, token)
    }

    /// The claims of a valid, unexpired pool token; `sub` is the slot.
    pub fn verify_pool(&self, token: &str) -> Result<SessionClaims, TokenError> {
        self.verify_for(POOL_AUDIENCE, token)
    }

    fn verify_for(&self, audience: &str, token: &str) -> Result<SessionClaims, TokenError> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_audience(&[audience]);
        validation.leeway = 0;
        validation.set_required_spec_claims(&["exp", "aud", "sub"]);
        let decode = |key: &DecodingKey| {
            jsonwebtoken::decode::<SessionClaims>(token, key, &validation)
                .map(|data| data.claims)
                .map_err(|e| match e.kind() {
                    jsonwebtoken::errors::ErrorKind::ExpiredSignature => TokenError::Expired,
                    _ => TokenError::Invalid,
                })
        };
        match (decode(&self.decoding), &self.accepted) {
            // Not this key's signature: maybe the other one's.
            (Err(TokenError::Invalid), Some(accepted)) => decode(accepted),
            (verified, _) => verified,
        }
    }
}

/// The claims of a token, read without checking its signature or its expiry. For the
/// worker, which holds no key: it reads which session its token names and when it expires
/// (to stop re-dialing then, W9). Never a proof of anything; the brain verifies.
pub fn read_claims(token: &str) -> Result<SessionClaims, TokenError> {
    jsonwebtoken::dangerous::insecure_decode_claims::<SessionClaims>(token)
        .map_err(|_| TokenError::Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_token_names_exactly_its_session() {
        let keys = TokenKeys::new(SECRET).unwrap();
        let session = SessionId::new();
        let token = keys
            .mint(
                session,
                TeamId::new(),
                AgentId::new(),
                Duration::from_secs(60),
            )
            .unwrap();
        let claims = keys.verify(&token).unwrap();
        assert_eq!(claims.sub, session);
        assert_eq!(claims.aud, WORKER_AUDIENCE);
    }

    #[test]
    fn other_keys_expired_tokens_and_weak_keys_are_refused() {
        let keys = TokenKeys::new(SECRET).unwrap();
        let other = TokenKeys::new(b"another secret that is long enough!!").unwrap();
        let token = keys
            .mint(
                SessionId::new(),
                TeamId::new(),
                AgentId::new(),
                Duration::from_secs(60),
            )
            .unwrap();
        assert_eq!(other.verify(&token), Err(TokenError::Invalid));
        assert_eq!(keys.verify("not.a.jwt"), Err(TokenError::Invalid));
        let claims = SessionClaims {
            sub: SessionId::new(),
            aud: WORKER_AUDIENCE.into(),
            team: TeamId::new(),
            agent: AgentId::new(),
            iat: 1,
            exp: 2,
        };
        let expired = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET).unwrap(),
        )
        .unwrap();
        assert_eq!(keys.verify(&expired), Err(TokenError::Expired));
        assert_eq!(TokenKeys::new(b"short").err(), Some(TokenError::WeakKey));
        // A pool token is not a session token, nor the reverse.
        let pool = keys
            .mint_pool(SessionId::new(), Duration::from_secs(60))
            .unwrap();
        assert_eq!(keys.verify(&pool), Err(TokenError::Invalid));
        assert!(keys.verify_pool(&pool).is_ok());
        assert_eq!(keys.verify_pool(&token), Err(TokenError::Invalid));
    }

    #[test]
    fn while_a_key_is_rotated_tokens_of_both_are_valid_and_new_ones_use_the_current() {
        const NEXT: &[u8] = b"the next secret, also long enough!!";
        let old = TokenKeys::new(SECRET).unwrap();
        let mint = |keys: &TokenKeys| {
            keys.mint(
                SessionId::new(),
                TeamId::new(),
                AgentId::new(),
                Duration::from_secs(60),
            )
            .unwrap()
        };
        // Phase one: signing with the old key, accepting the next one too.
        let first = TokenKeys::new(SECRET)
            .unwrap()
            .also_accepting(NEXT)
            .unwrap();
        // Phase two: signing with the next key, accepting the old one.
        let second = TokenKeys::new(NEXT)
            .unwrap()
            .also_accepting(SECRET)
            .unwrap();
        let next_only = TokenKeys::new(NEXT).unwrap();
        let by_first = mint(&first);
        let by_second = mint(&second);
        assert!(first.verify(&by_second).is_ok());
        assert!(second.verify(&by_first).is_ok());
        assert!(
            old.verify(&by_first).is_ok(),
            "phase one still signs with the old key"
        );
        assert_eq!(old.verify(&by_second), Err(TokenError::Invalid));
        assert!(next_only.verify(&by_second).is_ok());
        assert_eq!(
            next_only.verify(&by_first),
            Err(TokenError::Invalid),
            "phase three"
        );
        assert!(
            TokenKeys::new(SECRET)
                .unwrap()
                .also_accepting(b"short")
                .is_err()
        );
    }

    #[test]
    fn claims_are_readable_without_the_key() {
        let keys = TokenKeys::new(SECRET).unwrap();
        let slot = SessionId::new();
        let pool = keys.mint_pool(slot, Duration::from_secs(60)).unwrap();
        let claims = read_claims(&pool).unwrap();
        assert_eq!((claims.sub, claims.aud.as_str()), (slot, POOL_AUDIENCE));
        assert_eq!(claims.exp, claims.iat + 60);
        assert_eq!(read_claims("not.a.jwt"), Err(TokenError::Invalid));
        assert_eq!(
            read_claims("header.payload.signature"),
            Err(TokenError::Invalid)
        );
    }
}
