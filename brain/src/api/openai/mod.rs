//! The OpenAI-compatible front end (P7): every agent of the caller's team as a model under
//! `/openai/v1`, for the clients that speak OpenAI's wire (the official SDKs, Open WebUI,
//! LibreChat). A front end, never a second engine: a request's new message is posted
//! through `engine::turn::post` as `POST /v1/chats/{id}/messages` does (principal and
//! authority, quotas, intake, busy policy, approvals, usage, events), and the turn's UI
//! chunks are rewritten as OpenAI's answer.
//!
//! - `models.rs`: `GET /openai/v1/models`, and which agent a request's `model` names;
//! - `options.rs`: `GET`/`PUT /v1/agents/{id}/openai`, an agent's options here (P13);
//! - `chat.rs`: `POST /openai/v1/chat/completions`, streamed and not, and which chat a
//!   conversation is (`engine::conversations`);
//! - `responses.rs`: `POST /openai/v1/responses` (P8), a response being a turn;
//! - `activity.rs`: the agent's tool calls as lines of text, when its `openai` options
//!   say so (P13);
//! - `error.rs`: OpenAI's error shape for every refusal under `/openai/`.
//!
//! The design is in `docs/design/openai.md`.

mod activity;
pub(super) mod chat;
pub(super) mod error;
pub(super) mod models;
pub(super) mod options;
pub(super) mod responses;
