//! A2A 1.0 (P1): every agent as an A2A server, a front end of the HTTP API's posting path,
//! never a second engine. The HTTP handlers are in `api/a2a.rs`; this folder translates,
//! one phase per file:
//!
//! - `wire.rs`: the JSON-RPC envelope and A2A's objects, as serde types;
//! - `card.rs`: an agent's agent card;
//! - `task.rs`: a turn (its row and messages) as a task;
//! - `stream.rs`: a turn's UI message stream as A2A stream events;
//! - `push.rs`: what makes a push notification config valid;
//! - `errors.rs`: failures as JSON-RPC errors with our stable codes in `data`.
//!
//! A task is a turn, a `contextId` a chat of the agent; see `docs/design/a2a.md`.

pub mod card;
pub mod errors;
pub mod push;
pub mod stream;
pub mod task;
pub mod wire;
