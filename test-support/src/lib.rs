//! Test support shared by the integration tests of the brain and the runtime-manager, and
//! by the bench's soak (its Redis blips).
//!
//! - `db.rs`: a fresh Postgres database per test, so tests run in parallel and may
//!   install triggers freely, copied from a template migrated once per migration set;
//! - `proxy.rs`: a TCP proxy that injects the faults an operator meets (a cut link, a
//!   peer that accepts and never answers) between a process and Redis or Postgres;
//! - `pgbouncer.rs`: Debian's PgBouncer in transaction mode in front of the test Postgres (O5);
//! - `redis_cluster.rs`: Redis Clusters on loopback (O5), one shared by the cluster tests
//!   and one of its own for a test that kills a master;
//! - `tls.rs`: a CA and a server certificate for the tests that run Redis over TLS;
//! - `promtool.rs`: `promtool check metrics` over a scrape, and reading a sample from it;
//! - `sandbox.rs`: the host pid of a process inside a confined worker's PID namespace.
//!
//! Only tests and the bench depend on this crate, so it may panic on set-up failures: a
//! run that cannot set up must fail loudly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The session-token key every brain and runtime-manager of the tests is given, and the
/// tests mint worker tokens with: the binaries have no default key.
pub const SESSION_TOKEN_KEY: &str = "agent-runtime-tests-session-token-key-0123456789";

pub mod db;
pub mod pgbouncer;
pub mod promtool;
pub mod proxy;
pub mod redis_cluster;
pub mod sandbox;
pub mod tls;
