//! The brain's domain rules that its store and its engine share: what a value must be to be
//! stored, with no I/O. A rule lives here when both the store's rows and the engine's
//! checks need it; the engine's other rules stay beside their owners in the brain.
//!
//! - `openai.rs`: an agent's options for the OpenAI-compatible front end (P13).
//! - `address.rs`: the address rule of every outbound connection (SSRF): metadata
//!   addresses always refused, private ones unless the operator allows them; shared by
//!   the engine's connectors and the egress proxy (W14).
//! - `egress.rs`: host patterns, an agent's egress allowlist and an egress secret's
//!   header, checked alike by the API and the egress proxy (W13, W14).
//! - `approvals.rs`: risk classes, an agent's approval policy and what it decides, the
//!   approval states and kinds, and the elicitation forms (SPEC A1-A4, P5).

pub mod address;
pub mod approvals;
pub mod egress;
pub mod openai;
