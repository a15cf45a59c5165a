//! The runtime-manager's integration tests, one binary (each module was a binary of its
//! own, each linking the manager again). nextest still runs every test in a process of its
//! own. Run one module with
//! `cargo nextest run -p runtime-manager --test all -E 'test(/^kubernetes::/)'`.

mod common;

mod billing;
mod egress;
mod kubernetes;
mod manager;
mod metrics;
mod render_job;
mod shared_proxy;
