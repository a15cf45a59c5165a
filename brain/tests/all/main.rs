//! The brain's integration tests, one binary (each module was a binary of its own, and
//! linking 29 copies of the brain was most of a fresh clone's `make test`). nextest still
//! runs every test in a process of its own, so a test may install a global (a log
//! capture, a tracing subscriber) as before. Run one module with
//! `cargo nextest run -p brain --test all -E 'test(/^events::/)'`.

mod common;

mod a2a;
mod agui;
mod answers;
mod api;
mod approvals;
mod architecture;
mod artifacts;
mod audit;
mod auth;
mod autostart;
mod background;
mod basis;
mod brain_tools;
mod channels;
mod cluster;
mod connector_oauth;
mod connectors;
mod contract;
mod delegation;
mod egress;
mod elicitation;
mod erasure;
mod events;
mod faults;
mod file_uploads;
mod files;
mod hold;
mod hold_turns;
mod intake;
mod issuers;
mod kept;
mod knowledge;
mod mcp_conformance;
mod mcp_server;
mod memories;
mod metrics;
mod models;
mod oauth_client;
mod openai;
mod paging;
mod pooler;
mod providers;
mod queue;
mod quotas;
mod rate_limits;
mod recovery;
mod redis_tls;
mod retention;
mod seams;
mod skills;
mod soak;
mod stop;
mod takeover;
mod teams;
mod titles;
mod tools;
mod traces;
mod turn;
mod turn_failures;
mod usage;
mod user_budgets;
mod vision;
mod web_chat;
mod webhooks;
mod worker_channel;
mod workers;
mod workspace_files;
