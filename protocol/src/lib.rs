//! The wire vocabulary shared by every process of the runtime.
//!
//! Anything serialized across a process boundary lives here: typed ids, the stable error
//! codes of the HTTP API, the runtime profiles' names, the chunks of the UI message stream
//! that the brain sends to a web chat, and the parts of a stored message. This crate does
//! no I/O and depends on serde alone, so the brain, the worker and the runtime-manager can
//! all speak it without pulling each other's dependencies.

pub mod channel;
pub mod env;
pub mod error;
pub mod ids;
pub mod parts;
pub mod profile;
pub mod skills;
pub mod snapshot;
pub mod ui;
pub mod uploads;

pub use error::{ErrorBody, ErrorCode, ErrorDetail, QuotaScope};
pub use ids::{AgentId, ChatId, MessageId, ReplicaId, SessionId, TeamId, TurnId};
