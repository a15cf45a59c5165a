//! Signed webhooks, delivered at least once (P4).
//!
//! - `sign.rs`: signing secrets (`whsec_…`) and the Standard Webhooks signature;
//! - `deliver.rs`: the delivery loop every replica runs: claim due deliveries from the
//!   Postgres outbox, send each once, record the attempt and when to retry.
//!
//! Events enter the outbox in the transaction of the write that makes them
//! (`store::webhooks::enqueue`, the turn's end state, and the `a2a_turn_ended` trigger for
//! A2A push notifications); nothing here
//! is on a turn's path. docs/design/webhooks.md is the design.

pub mod deliver;
pub mod sign;

pub use deliver::run;
