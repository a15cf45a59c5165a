//! Test support shared by the integration tests of the brain and the runtime-manager.
//!
//! - `db.rs`: a fresh Postgres database per test, so tests run in parallel and may
//!   install triggers freely;
//! - `proxy.rs`: a TCP proxy that injects the faults an operator meets (a cut link, a
//!   peer that accepts and never answers) between a process and Redis or Postgres.
//!
//! Only tests depend on this crate, so it may panic on set-up failures: a test that cannot
//! set up must fail loudly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod db;
pub mod proxy;
