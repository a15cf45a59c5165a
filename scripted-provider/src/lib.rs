//! A scripted model provider: a small loopback HTTP server that speaks the OpenAI
//! chat-completions, the OpenAI Responses and the Anthropic Messages wire formats
//! (streaming and not) exactly as the real providers do, and OpenAI's embeddings
//! (`embeddings.rs`, deterministic vectors where synonyms are near).
//!
//! Why it exists: the LLM provider is the one dependency of the runtime that cannot run
//! here. Everything else (Postgres, Redis, workers, the brain) runs for real in tests, so
//! this double stands in for the provider at the HTTP level, where the brain's real client
//! code (request building, SSE parsing, tool-call assembly, retries, cancellation) is
//! exercised unchanged. Tests script the replies (text, tool calls, truncation, errors,
//! stalls, cut streams), then assert on what the brain sent ([`ScriptedProvider::requests`],
//! [`ScriptedProvider::violations`]) and on whether it hung up in time
//! ([`ScriptedProvider::wait_aborted`]). With nothing scripted it answers as the demo model
//! (`demo.rs`), which makes it the brain's offline demo model when no API key is configured.

mod anthropic;
mod demo;
pub mod embeddings;
mod history;
mod openai;
mod plan;
mod responses;
mod seen;
mod server;
mod stream;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;

pub use plan::{input_tokens, output_tokens};
pub use seen::{SeenFile, SeenKind};

/// Handle to a running scripted provider. Cheap to clone; the server stops when the last
/// clone is dropped or [`ScriptedProvider::shutdown`] is called.
#[derive(Clone)]
pub struct ScriptedProvider {
    handle: Arc<Handle>,
}

struct Handle {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
    }
}

/// State shared between the handles and the server task. The server holds it too, so
/// dropping it cannot be the shutdown signal; the explicit `shutdown` flag is.
pub(crate) struct Shared {
    state: Mutex<State>,
    aborted: watch::Sender<Vec<Instant>>,
    pub(crate) shutdown: watch::Sender<bool>,
    /// How many times [`ScriptedProvider::release_held`] was called.
    pub(crate) released: watch::Sender<u64>,
    /// What stamps count from ([`ScriptedProvider::epoch`]).
    pub(crate) epoch: Instant,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Reply>,
    requests: Vec<RecordedRequest>,
    violations: Vec<String>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide later assertions behind a poison error.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the request and returns its 1-based sequence number, the reply to play,
    /// and the release generation the reply was taken at (releases after it end its held
    /// deltas). A body that is not a JSON object gets no reply: it is rejected before
    /// generation, as a real provider would, and must not use up a scripted reply.
    pub(crate) fn record(&self, request: RecordedRequest) -> (usize, Option<Reply>, u64) {
        let view = responses::chat_view(request.wire, &request.body);
        let found = history::check(request.wire, &view);
        let mut state = self.lock();
        let seq = state.requests.len() + 1;
        let wire = match request.wire {
            Wire::OpenAi => "openai",
            Wire::Anthropic => "anthropic",
            Wire::OpenAiResponses => "openai-responses",
        };
        for v in found {
            tracing::warn!(request = seq, wire, violation = %v, "history invariant violated");
            state
                .violations
                .push(format!("request #{seq} ({wire}): {v}"));
        }
        let reply = if request.body.is_object() {
            Some(match state.queue.pop_front() {
                Some(reply) => reply,
                None => demo::reply(&view),
            })
        } else {
            None
        };
        state.requests.push(request);
        // Read under the queue lock, which `release_held` also takes: a reply is taken
        // either before a release (and ended by it) or after it, never in between.
        let taken_at = *self.released.borrow();
        (seq, reply, taken_at)
    }

    pub(crate) fn record_abort(&self, at: Instant) {
        tracing::debug!("scripted reply aborted by the client");
        self.aborted.send_modify(|v| v.push(at));
    }
}

impl std::fmt::Debug for ScriptedProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedProvider")
            .field("addr", &self.handle.addr)
            .finish_non_exhaustive()
    }
}

impl ScriptedProvider {
    /// Binds 127.0.0.1:0 and serves in a spawned tokio task until the last clone is
    /// dropped or `shutdown` is called.
    pub async fn start() -> std::io::Result<ScriptedProvider> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await
    }

    /// Like [`ScriptedProvider::start`], on a chosen address.
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<ScriptedProvider> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            aborted: watch::Sender::new(Vec::new()),
            shutdown: watch::Sender::new(false),
            released: watch::Sender::new(0),
            epoch: Instant::now(),
        });
        server::spawn(listener, shared.clone());
        tracing::debug!(%addr, "scripted provider listening");
        Ok(ScriptedProvider {
            handle: Arc::new(Handle { shared, addr }),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.handle.addr
    }

    /// Base URL for an OpenAI-compatible client: "http://127.0.0.1:PORT/v1" (requests go
    /// to {this}/chat/completions, or {this}/responses for the Responses API).
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.handle.addr)
    }

    /// Base URL for an Anthropic client: "http://127.0.0.1:PORT" (requests go to
    /// {this}/v1/messages).
    pub fn anthropic_base_url(&self) -> String {
        format!("http://{}", self.handle.addr)
    }

    /// Queue a reply; requests of either wire format pop replies in FIFO order.
    /// When the queue is empty a request gets the demo reply (`demo.rs`): a call of the
    /// tool a plain request names (``run `ls -la` ``, …) when the request offers it, the
    /// tool's result quoted back after a call, or else
    /// `Offline demo model here. You said: "<last user text>". I can …` streamed four words
    /// at a time, 15 ms apart.
    pub fn push(&self, reply: Reply) {
        self.handle.shared.lock().queue.push_back(reply);
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.handle.shared.lock().requests.clone()
    }

    /// Streams whose HTTP response body was dropped (client went away) before the scripted
    /// reply finished, with the instant it was noticed. A client that hangs up while a
    /// `Stall` (or a non-streamed reply) is still pending counts too.
    pub fn aborted_streams(&self) -> Vec<Instant> {
        self.handle.shared.aborted.borrow().clone()
    }

    /// Waits until at least `n` aborted streams were recorded or `timeout` passes; returns
    /// the recorded instants.
    pub async fn wait_aborted(&self, n: usize, timeout: Duration) -> Vec<Instant> {
        let mut rx = self.handle.shared.aborted.subscribe();
        // The sender lives as long as `self`, so `wait_for` can only end by the predicate.
        let _ = tokio::time::timeout(timeout, rx.wait_for(|v| v.len() >= n)).await;
        self.aborted_streams()
    }

    /// History invariant violations found in received requests: every tool call in a
    /// request's history must have exactly one result right after it, and no result may
    /// refer to a call that is not there. Tests assert this is empty.
    pub fn violations(&self) -> Vec<String> {
        self.handle.shared.lock().violations.clone()
    }

    /// The instant [`Reply::Stamped`] deltas count from (when the provider started). A
    /// client in the same process reads the same clock, so its receive time minus a stamp
    /// is the delta's time in flight.
    pub fn epoch(&self) -> Instant {
        self.handle.shared.epoch
    }

    /// Ends every [`Reply::Held`] reply taken by a request before this call: each sends
    /// its normal end (a non-streamed one answers). Held replies taken later wait for the
    /// next call.
    pub fn release_held(&self) {
        let shared = &self.handle.shared;
        let _queue = shared.lock();
        shared.released.send_modify(|generation| *generation += 1);
    }

    /// Stops accepting connections and cuts every response still streaming.
    pub fn shutdown(&self) {
        self.handle.shared.shutdown.send_replace(true);
    }
}

/// One scripted answer to one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Streams `deltas` as text, `delay` apart (first one also after `delay`), then a
    /// normal end (finish_reason "stop" / stop_reason "end_turn") with usage.
    Text {
        deltas: Vec<String>,
        delay: Duration,
    },
    /// Streams optional text, then tool calls whose JSON `arguments` string is sent in
    /// fragments of `fragment` bytes (OpenAI: delta.tool_calls[i].function.arguments
    /// pieces, first piece carries id/type/name; Anthropic: content_block_start tool_use +
    /// input_json_delta partial_json pieces), ends with finish_reason "tool_calls" /
    /// stop_reason "tool_use". A `fragment` of 0 sends the arguments whole.
    ToolCalls {
        text: Option<String>,
        calls: Vec<ToolCall>,
        fragment: usize,
    },
    /// Like ToolCalls, but each argument fragment comes `delay` after the one before it
    /// (the first one too): a model writing a long argument, whose call is named well
    /// before it is complete.
    PacedToolCalls {
        calls: Vec<ToolCall>,
        fragment: usize,
        delay: Duration,
    },
    /// Like ToolCalls but ends with finish_reason "length" / stop_reason "max_tokens"
    /// after sending only the first half of the last call's arguments (a length-truncated
    /// tool call).
    TruncatedToolCall {
        calls: Vec<ToolCall>,
        fragment: usize,
    },
    /// Streams `deltas` as text, then ends as a provider does at its output limit with no
    /// tool call (finish_reason "length" / stop_reason "max_tokens"): an answer cut off.
    TruncatedText { deltas: Vec<String> },
    /// Answers with this HTTP status and the provider's error JSON body (OpenAI:
    /// {"error":{"message","type","param","code"}}; Anthropic:
    /// {"type":"error","error":{"type","message"}}); `retry_after` sets the Retry-After
    /// header (seconds).
    Status {
        status: u16,
        retry_after: Option<u64>,
    },
    /// Streams `deltas` (delay apart) then ends the body: no finish chunk, no [DONE] / no
    /// message_stop (the HTTP body itself ends cleanly, so only the missing terminator
    /// tells the client the stream is incomplete).
    Cut {
        deltas: Vec<String>,
        delay: Duration,
    },
    /// Streams `deltas` then a mid-stream error (Anthropic: `event: error` with
    /// {"type":"error","error":{"type":"overloaded_error",...}}; OpenAI: a
    /// `data: {"error":{...}}` line), then closes.
    StreamError {
        deltas: Vec<String>,
        delay: Duration,
    },
    /// Streams `count` text deltas `delay` apart (the first also after `delay`), then ends
    /// like `Text`. Each delta is the instant it is written, in microseconds since
    /// [`ScriptedProvider::epoch`]: 12 zero-padded digits and a space
    /// (`"000001234567 "`). For latency benches: a client on the same clock subtracts the
    /// stamp from its receive time. A non-streamed answer carries stamps taken when its
    /// body is built.
    Stamped { count: usize, delay: Duration },
    /// Streams `delta` at once and again every `every` (at least 1 ms) until
    /// [`ScriptedProvider::release_held`] is called, then ends like `Text`. For holding
    /// many streams open at once. The usage counts `delta` once, however often it was
    /// sent. A non-streamed answer comes after the release and carries `delta` once.
    Held { delta: String, every: Duration },
    /// Streams `reasoning` as the model's shown reasoning, then `deltas` as text, each
    /// `delay` after the one before, then ends like `Text`. Each wire writes reasoning its
    /// own way: OpenAI `delta.reasoning_content` (`message.reasoning_content` whole),
    /// Anthropic a `thinking` block of `thinking_delta`s closed by a `signature_delta`,
    /// Responses a `reasoning` item's `response.reasoning_summary_text.delta`s. Its
    /// characters count as output tokens, as reasoning tokens do.
    Reasoning {
        reasoning: Vec<String>,
        deltas: Vec<String>,
        delay: Duration,
    },
    /// Waits `delay` before sending response headers at all (for timeout tests), then
    /// behaves like Text with the given deltas, sent without further delay.
    Stall {
        delay: Duration,
        deltas: Vec<String>,
    },
}

/// A tool call the scripted model makes.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

/// A request as the provider received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// Which endpoint.
    pub wire: Wire,
    /// Body "model".
    pub model: String,
    /// The whole JSON body (`Null` if it was not JSON).
    pub body: serde_json::Value,
    /// OpenAI: "Authorization" header value; Anthropic: "x-api-key" value.
    pub authorization: Option<String>,
    pub received_at: Instant,
}

impl RecordedRequest {
    /// The images and documents this request showed the model, read back from its wire
    /// (T23, T24).
    pub fn files(&self) -> Vec<SeenFile> {
        seen::files(self.wire, &self.body)
    }
}

/// Which wire format a request used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    OpenAi,
    Anthropic,
    /// The OpenAI Responses API (`/v1/responses`).
    OpenAiResponses,
}
