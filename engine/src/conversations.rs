//! Which chat a stateless client's conversation is (P7). An OpenAI-style client resends
//! the whole conversation with every request; the chat it continues is the one whose
//! exchange so far is exactly the messages before its new one. Each chat keeps one
//! fingerprint, a SHA-256 over its owner and its user and assistant texts as the client
//! holds them, as one Redis key naming the chat (`openai:conv:<hex>`), replaced at each
//! turn and expiring after [`KEPT`] idle: at most one key per chat, found by one `GET`.
//!
//! Redis is best effort here as everywhere: a fingerprint lost, expired or not written
//! opens a new chat for the next request, which is what a client without an explicit
//! chat id would get from any server that forgets; never another owner's chat, since the
//! owner is inside the hash.

use std::time::Duration;

use protocol::{AgentId, ChatId, TeamId};
use sha2::{Digest, Sha256};

use crate::redis::{Client, Shared, Unavailable, bounded};

/// How long a conversation's fingerprint is kept after its last turn.
pub const KEPT: Duration = Duration::from_secs(7 * 24 * 3600);
/// The bound of one Redis call: a lookup is on the request's path.
const BOUND: Duration = Duration::from_millis(500);

/// Who speaks in a fingerprinted message. Other roles (a client's `system` message) are
/// not part of the exchange the chat stores and are left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speaker {
    User,
    Assistant,
}

/// The conversations' fingerprints in Redis.
pub struct Conversations {
    redis: Shared,
}

/// Whose conversation it is: the same texts under another owner are another conversation.
pub struct Owner<'a> {
    pub team: TeamId,
    pub agent: AgentId,
    /// The principal's actor (`key:<id>`, `user:<subject>`).
    pub actor: &'a str,
    /// The end user, when the principal names one.
    pub user: Option<&'a str>,
}

impl Conversations {
    /// Does no I/O.
    pub fn new(client: Client) -> Self {
        Self {
            redis: Shared::new(client, BOUND),
        }
    }

    /// The chat whose exchange so far is `messages`, if one is known.
    pub async fn find(
        &self,
        owner: &Owner<'_>,
        messages: &[(Speaker, &str)],
    ) -> Result<Option<ChatId>, Unavailable> {
        let key = key(owner, messages);
        let found: Option<String> = bounded(BOUND, async {
            let mut conn = self.redis.get().await?;
            redis::cmd("GET").arg(&key).query_async(&mut conn).await
        })
        .await?;
        Ok(found.and_then(|raw| raw.parse().ok()))
    }

    /// Records that `chat`'s exchange is now `messages`, dropping the fingerprint it had
    /// (`before`, the exchange the turn continued) so a chat keeps one.
    pub async fn remember(
        &self,
        owner: &Owner<'_>,
        before: Option<&[(Speaker, &str)]>,
        messages: &[(Speaker, &str)],
        chat: ChatId,
    ) -> Result<(), Unavailable> {
        let key = key(owner, messages);
        let old = before
            .filter(|b| !b.is_empty())
            .map(|b| self::key(owner, b));
        bounded(BOUND, async {
            let mut conn = self.redis.get().await?;
            redis::cmd("SET")
                .arg(&key)
                .arg(chat.to_string())
                .arg("EX")
                .arg(KEPT.as_secs())
                .query_async::<()>(&mut conn)
                .await?;
            if let Some(old) = old {
                redis::cmd("DEL")
                    .arg(old)
                    .query_async::<()>(&mut conn)
                    .await?;
            }
            Ok(())
        })
        .await
    }
}

/// The Redis key of `messages` under `owner`. Each field is length-prefixed, so no two
/// different exchanges hash the same input; texts are compared without the whitespace
/// around them.
fn key(owner: &Owner<'_>, messages: &[(Speaker, &str)]) -> String {
    let mut hash = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_be_bytes());
        hash.update(bytes);
    };
    field(owner.team.to_string().as_bytes());
    field(owner.agent.to_string().as_bytes());
    field(owner.actor.as_bytes());
    field(owner.user.unwrap_or("").as_bytes());
    for (speaker, text) in messages {
        field(match speaker {
            Speaker::User => b"u",
            Speaker::Assistant => b"a",
        });
        // Clients differ in the whitespace they keep around a text they resend.
        field(text.trim().as_bytes());
    }
    let digest: [u8; 32] = hash.finalize().into();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("openai:conv:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(actor: &str) -> Owner<'_> {
        Owner {
            team: TeamId(uuid::Uuid::nil()),
            agent: AgentId(uuid::Uuid::nil()),
            actor,
            user: None,
        }
    }

    #[test]
    fn the_same_texts_of_another_owner_or_split_otherwise_are_another_conversation() {
        let texts = [(Speaker::User, "hi"), (Speaker::Assistant, "hello")];
        assert_eq!(key(&owner("key:1"), &texts), key(&owner("key:1"), &texts));
        assert_ne!(key(&owner("key:1"), &texts), key(&owner("key:2"), &texts));
        let moved = [(Speaker::User, "hih"), (Speaker::Assistant, "ello")];
        assert_ne!(key(&owner("key:1"), &texts), key(&owner("key:1"), &moved));
        let swapped = [(Speaker::Assistant, "hi"), (Speaker::User, "hello")];
        assert_ne!(key(&owner("key:1"), &texts), key(&owner("key:1"), &swapped));
    }
}
