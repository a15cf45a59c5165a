//! Memories as people manage them (M4): who may list, change or delete which.
//!
//! The rule fails closed (X1, docs/design/auth.md): an admin manages every memory of the
//! team's agents; an end user (a JWT without the admin scope) only their own, the ones
//! written in chats they opened; a chat-scoped API key may list the agent's own memories,
//! the ones its chats recall, and change none, since what every chat recalls is the
//! agent's for everyone.

use auth::{AuthError, Principal, Scope};
use store::MemoryScope;

use crate::auth;

/// The longest note, in characters, whoever writes it.
pub const MAX_NOTE: usize = 10_000;

/// `content` trimmed, or why it cannot be a note.
pub fn validate_note(content: &str) -> Result<&str, String> {
    let content = content.trim();
    if content.is_empty() || content.chars().count() > MAX_NOTE {
        return Err(format!("content must have 1 to {MAX_NOTE} characters"));
    }
    Ok(content)
}

/// The memories `principal` may list.
pub fn readable(principal: &Principal) -> MemoryScope<'_> {
    match (principal.scope, principal.user.as_deref()) {
        (Scope::Admin, _) => MemoryScope::All,
        (Scope::Chat, Some(user)) => MemoryScope::User(user),
        (Scope::Chat, None) => MemoryScope::AgentWide,
    }
}

/// The memories `principal` may change or delete; `Forbidden` for a chat-scoped key.
pub fn changeable(principal: &Principal) -> Result<MemoryScope<'_>, AuthError> {
    match readable(principal) {
        MemoryScope::AgentWide => Err(AuthError::Forbidden),
        scope => Ok(scope),
    }
}
