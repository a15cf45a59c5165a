//! Typed ids: a chat id can never be passed where an agent id is expected.
//!
//! All ids are UUIDs; new ones are v7 so that they sort by creation time in indexes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! id_type {
    ($(#[$doc:meta] $name:ident),* $(,)?) => {$(
        #[$doc]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh, time-ordered id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// The all-zero id: "none" where a claim must carry one (a pool token has no
            /// team or agent).
            pub const fn nil() -> Self {
                Self(Uuid::nil())
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }

        impl From<Uuid> for $name {
            fn from(id: Uuid) -> Self {
                Self(id)
            }
        }
    )*};
}

id_type! {
    /// A tenant. Every stored row belongs to exactly one team.
    TeamId,
    /// An agent: a system prompt, a model route and a runtime profile.
    AgentId,
    /// A conversation between users and one agent.
    ChatId,
    /// One run of the agent loop, started by a user message or an autostart.
    TurnId,
    /// A stored message of a chat.
    MessageId,
    /// A worker session (AgentRuntimeSession), keyed by agent and chat.
    SessionId,
    /// One brain or runtime-manager process with its lease (O3); a restart is a new one.
    ReplicaId,
}

impl ChatId {
    /// The chat a client-named thread (an AG-UI `threadId` that is no chat of the team)
    /// opens in `team`: derived from both, so a chat of that id in another team is never
    /// met and whether one exists never shows.
    pub fn of_thread(team: TeamId, thread: Uuid) -> Self {
        Self(Uuid::new_v5(&team.0, thread.as_bytes()))
    }
}
