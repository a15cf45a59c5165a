//! Signed download URLs (T26): `/v1/files/{id}?exp=<unix seconds>&sig=<base64url>`, which
//! a browser's `<img src>` or a download link can follow without the bearer key. A stored
//! message keeps the unsigned URL ([`super::url`]); a URL is signed each time it is handed
//! to a client, so a changed key or an expired signature never spoils stored data.
//!
//! The signature is HMAC-SHA256 over the file's team, its id and `exp`: it opens that one
//! file of that one team until `exp`, and nothing else (another id, a later `exp`). The key
//! is the same on every replica: derived from `BRAIN_SECRETS_KEY` when it is set, else a
//! random key stored once in Postgres (`server_keys`) and read by each replica the first
//! time it needs it.

use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::hmac;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use protocol::TeamId;
use protocol::parts::Part;
use rand::RngCore;
use store::{SecretsKey, Store, StoreError, bounded};
use uuid::Uuid;

/// The label of the key derived from `BRAIN_SECRETS_KEY`, and the name of the stored one.
const KEY_NAME: &str = "chat-file-urls";
/// What the MAC covers first: a later format gets another prefix, never this one's reading.
const DOMAIN: &[u8] = b"agent-runtime file url v1\0";
/// The longest `sig` read: the base64 of a SHA-256 MAC is 43 characters.
const SIG_CHARS: usize = 43;

/// Why a signed URL was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefused {
    #[error("the file URL has expired; read the transcript again for a fresh one")]
    Expired,
    #[error("the file URL's signature does not match this file")]
    BadSignature,
}

/// The signing key of this replica and how long a URL lasts. Cheap to clone.
#[derive(Clone)]
pub struct FileUrls {
    key: Arc<tokio::sync::OnceCell<hmac::Key>>,
    ttl_secs: i64,
}

impl FileUrls {
    /// With `secrets`, the key is derived from it at once; without, it is read (or first
    /// written) in Postgres when a URL is first signed or checked.
    pub fn new(secrets: Option<&SecretsKey>, ttl: Duration) -> Self {
        let key = secrets.map(|s| hmac::Key::new(hmac::HMAC_SHA256, &s.derive(KEY_NAME)));
        Self {
            key: Arc::new(tokio::sync::OnceCell::new_with(key)),
            ttl_secs: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX).max(1),
        }
    }

    async fn key(&self, store: &Store) -> Result<&hmac::Key, StoreError> {
        self.key
            .get_or_try_init(|| async {
                let mut fresh = [0u8; 32];
                rand::rng().fill_bytes(&mut fresh);
                let stored = bounded(store.server_key(KEY_NAME, &fresh)).await?;
                Ok(hmac::Key::new(hmac::HMAC_SHA256, &stored))
            })
            .await
    }

    /// When a URL signed at `now` expires: `now` plus the TTL, rounded up to the next tenth
    /// of the TTL, so that a transcript read twice in a while names its files by the same
    /// URLs (a browser then reuses the image it loaded instead of fetching it again).
    fn expiry(&self, now: i64) -> i64 {
        let step = (self.ttl_secs / 10).max(1);
        let end = now.saturating_add(self.ttl_secs);
        end.saturating_add((step - end.rem_euclid(step)) % step)
    }

    /// The signed URL of file `id` of `team`, valid at least the TTL from `now`.
    pub async fn sign(
        &self,
        store: &Store,
        team: TeamId,
        id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<String, StoreError> {
        let key = self.key(store).await?;
        let exp = self.expiry(now.timestamp());
        let sig = URL_SAFE_NO_PAD.encode(hmac::sign(key, &signed_bytes(team, id, exp)));
        Ok(format!("{}?exp={exp}&sig={sig}", super::url(id)))
    }

    /// Every `file` part of `parts` that names a file by its stored URL, with that URL
    /// signed for `team`; other parts, and other URLs, as they are.
    pub async fn sign_parts(
        &self,
        store: &Store,
        team: TeamId,
        parts: &mut [Part],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        for part in parts {
            if let Part::File(file) = part
                && let Some(id) = super::id_of_url(&file.url)
            {
                file.url = self.sign(store, team, id, now).await?;
            }
        }
        Ok(())
    }

    /// Whether `exp` and `sig` (as the URL carries them) open file `id` of `team` at `now`.
    /// The expiry is checked first: an expired URL is refused as such whatever its
    /// signature, without the key.
    pub async fn check(
        &self,
        store: &Store,
        team: TeamId,
        id: Uuid,
        exp: i64,
        sig: &str,
        now: DateTime<Utc>,
    ) -> Result<Result<(), UrlRefused>, StoreError> {
        if exp <= now.timestamp() {
            return Ok(Err(UrlRefused::Expired));
        }
        let Some(tag) = (sig.len() == SIG_CHARS)
            .then(|| URL_SAFE_NO_PAD.decode(sig).ok())
            .flatten()
        else {
            return Ok(Err(UrlRefused::BadSignature));
        };
        let key = self.key(store).await?;
        Ok(hmac::verify(key, &signed_bytes(team, id, exp), &tag)
            .map_err(|_| UrlRefused::BadSignature))
    }
}

/// What the MAC covers: fixed-width ids and expiry, so no two triples read alike.
fn signed_bytes(team: TeamId, id: Uuid, exp: i64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(DOMAIN.len() + 40);
    bytes.extend_from_slice(DOMAIN);
    bytes.extend_from_slice(team.0.as_bytes());
    bytes.extend_from_slice(id.as_bytes());
    bytes.extend_from_slice(&exp.to_be_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn urls(ttl: u64) -> FileUrls {
        let key = SecretsKey::parse(&"ab".repeat(32)).unwrap();
        FileUrls::new(Some(&key), Duration::from_secs(ttl))
    }

    #[test]
    fn expiry_is_at_least_the_ttl_and_rounded_up_to_a_tenth_of_it() {
        let u = urls(3600);
        assert_eq!(u.expiry(1_000_080), 1_003_680);
        assert_eq!(u.expiry(1_000_081), 1_004_040);
        assert_eq!(u.expiry(1_000_440), 1_004_040, "the same URL for a while");
        assert_eq!(u.expiry(1_000_441), 1_004_400);
        for now in [0, 1, 359, 360, 361, 99_999] {
            let exp = u.expiry(now);
            assert!(exp >= now + 3600 && exp < now + 3600 + 360, "{now}: {exp}");
        }
        assert_eq!(urls(1).expiry(50), 51);
    }
}
