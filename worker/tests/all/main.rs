//! The worker's integration tests, one binary: the worker binary against a fake brain on
//! loopback (`channel`), and its browser tools against real Chromium (`browser`, with the
//! `browser` feature). nextest still runs every test in a process of its own. Run one
//! module with `cargo nextest run -p worker --test all -E 'test(/^browser::/)'`.

mod common;

#[cfg(feature = "browser")]
mod browser;
mod channel;
