//! The worker channel, shared by the brain (MCP client), the worker (MCP server) and the
//! runtime-manager (which mints session tokens).
//!
//! - `ws`: an rmcp transport over a WebSocket. rmcp ships none; its transports are
//!   role-agnostic, so one adapter serves the brain's accepted socket and the worker's
//!   dialed one. Close frames, socket errors and undecodable messages end the stream and
//!   are recorded as the channel's end reason, never swallowed.
//! - `token`: session tokens (JWT, HS256), scoped to one session (SPEC X2).
//! - `catalog`: the worker tools each RuntimeProfile offers, with JSON Schemas derived
//!   from their argument types, known to the brain before any worker exists (SPEC T4).
//! - `mask`: a session's secret values masked in tool output, whole or streamed (W12).

pub mod catalog;
pub mod mask;
pub mod token;
pub mod ws;
