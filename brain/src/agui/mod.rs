//! AG-UI (P3): an agent's turn as the AG-UI event stream, for CopilotKit-style
//! front ends. A protocol here is a front end, never a second engine: `api::agui` decodes
//! the `RunAgentInput` and starts the turn through the same posting path as `POST
//! /v1/chats/{id}/messages`; this module only rewrites the turn's UI chunks (the AI SDK
//! stream the turn already writes, `turn::ui_stream`) as AG-UI events.
//!
//! - `events.rs`: the AG-UI events the brain sends, with the protocol's field names;
//! - `translate.rs`: UI chunks in, events out, keeping the protocol's ordering rules
//!   (every start closed before the run finishes, nothing after the run's end);
//! - `body.rs`: the Server-Sent Events response body around a turn's stream.
//!
//! The design, and what each input field becomes, is in `docs/design/agui.md`.

mod body;
mod events;
mod translate;

pub use body::{AguiBody, refused};
pub use events::{EVENT_TYPES, Event, Interrupt, Outcome};
pub use translate::Translator;
