//! Model providers: wire formats in, typed events out.
//!
//! Each adapter turns one provider's streaming HTTP API into a stream of
//! [`ProviderEvent`]s; the turn loop never sees a wire format. Two real implementations sit
//! behind [`ModelProvider`] (SPEC T10): OpenAI-compatible chat completions (`openai.rs`,
//! which also covers vLLM, Ollama, LiteLLM, OpenRouter), the OpenAI Responses API
//! (`responses.rs`, T15) and Anthropic Messages (`anthropic.rs`).
//!
//! Stream contract, for every adapter:
//! - the future resolves once the provider answered with a success status; a non-success
//!   status, a refused connection or a timeout before that is an `Err`;
//! - the stream yields events and ends right after [`ProviderEvent::Finished`];
//! - a body that ends without the provider's end marker yields
//!   `Err(ProviderError::Unavailable(Unavailable::Incomplete))` as its last item;
//! - dropping the stream aborts the HTTP request (that is how cancellation reaches the
//!   provider);
//! - inline `<think>` reasoning in the text comes out as [`ProviderEvent::ReasoningDelta`]
//!   (`reasoning.rs`), like the providers' own reasoning fields.

pub mod anthropic;
pub mod embeddings;
pub mod openai;
mod reasoning;
pub mod responses;
pub mod route;
mod sse;

pub use embeddings::{EmbeddingRequest, Embeddings};
pub use reasoning::strip_inline_reasoning;
pub use route::{ModelRoute, ProviderKind, Providers};

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::Stream;
use futures_util::future::BoxFuture;
use protocol::ErrorCode;

/// What the turn asks a model for. Provider-neutral; adapters translate it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelRequest {
    /// The model's name at the provider, without our `openai/` or `anthropic/` prefix.
    pub model: String,
    pub system: String,
    pub messages: Vec<Message>,
    /// The merged toolset offered for this call; empty means no tools field is sent.
    /// Shared: every turn of an agent kind offers the same catalog (`turn::Toolsets`).
    pub tools: Arc<Catalog>,
    pub max_output_tokens: u32,
}

/// The tools offered to a model, with each adapter's wire form of them rendered once: a
/// catalog is shared by every turn that offers the same tools, and its rendering is most
/// of a provider request's bytes.
#[derive(Debug, Default)]
pub struct Catalog {
    specs: Vec<ToolSpec>,
    /// The `tools` array of each adapter's request.
    openai: OnceLock<Box<serde_json::value::RawValue>>,
    anthropic: OnceLock<Box<serde_json::value::RawValue>>,
    responses: OnceLock<Box<serde_json::value::RawValue>>,
}

impl Catalog {
    pub fn new(specs: Vec<ToolSpec>) -> Self {
        Self {
            specs,
            ..Self::default()
        }
    }

    pub fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    /// `provider`'s rendering of the specs, made by `render` on first use; `None` for an
    /// empty catalog (no tools field is sent).
    fn rendered(
        &self,
        provider: ProviderKind,
        render: impl FnOnce(&[ToolSpec]) -> serde_json::Result<Box<serde_json::value::RawValue>>,
    ) -> Option<&serde_json::value::RawValue> {
        if self.specs.is_empty() {
            return None;
        }
        let slot = match provider {
            ProviderKind::OpenAi => &self.openai,
            ProviderKind::Anthropic => &self.anthropic,
            ProviderKind::OpenAiResponses => &self.responses,
        };
        let raw = slot.get_or_init(|| {
            // Serializing our own closed types into memory cannot fail.
            render(&self.specs).unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned())
        });
        Some(raw)
    }
}

impl PartialEq for Catalog {
    fn eq(&self, other: &Self) -> bool {
        self.specs == other.specs
    }
}

impl From<Vec<ToolSpec>> for Catalog {
    fn from(specs: Vec<ToolSpec>) -> Self {
        Self::new(specs)
    }
}

/// One message of the conversation sent to the model.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    User(String),
    /// A user message with files the model reads as content of their own (T23): its text,
    /// then each file in the wire's own form. A variant apart, so that a text-only message
    /// stays one string.
    UserFiles {
        text: String,
        files: Vec<Attachment>,
    },
    /// `text` may be empty when the model only called tools.
    Assistant {
        text: String,
        tool_calls: Vec<ToolCall>,
    },
    /// The results of the preceding assistant message's tool calls, one per call, in
    /// call order (OpenAI: one `tool` message each; Anthropic: one user message of
    /// `tool_result` blocks).
    ToolResults(Vec<ToolResult>),
}

/// A tool offered to the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub input_schema: serde_json::Value,
}

/// A tool call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text, exactly as the model produced them; may be invalid
    /// JSON (the turn answers that with a tool error).
    pub arguments: String,
}

/// The answer to one tool call.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResult {
    pub call_id: String,
    pub content: String,
    pub is_error: bool,
    /// Images the tool produced (a browser screenshot, T24), shown to the model as images
    /// beside the text. Empty for almost every result, and an empty `Vec` allocates nothing.
    pub images: Vec<Attachment>,
}

/// A file a model reads as content of its own rather than as text (T23).
#[derive(Clone, Debug, PartialEq)]
pub struct Attachment {
    pub kind: AttachmentKind,
    /// The type sniffed from the bytes (`image/png`, `application/pdf`), never a client's
    /// word.
    pub media_type: String,
    pub filename: String,
    /// The bytes in standard base64: encoded once when the history is read, and shared by
    /// every call of the turn (each step, retry and fallback).
    pub base64: Arc<str>,
    /// What a model that cannot read the file reads in its place (a PDF's text, T27);
    /// `None`: a note that the file was attached.
    pub instead: Option<Arc<str>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachmentKind {
    Image,
    /// A PDF document.
    Pdf,
}

impl Attachment {
    pub fn new(kind: AttachmentKind, media_type: &str, filename: &str, bytes: &[u8]) -> Self {
        use base64::Engine as _;
        Self {
            kind,
            media_type: media_type.to_owned(),
            filename: filename.to_owned(),
            base64: base64::engine::general_purpose::STANDARD
                .encode(bytes)
                .into(),
            instead: None,
        }
    }

    /// About what the provider bills for this file, for budgets and quotas: an image is
    /// resized by the providers to about a megapixel, some 1,600 tokens at most; a PDF is
    /// read as text and page images, estimated from its size like text.
    pub fn estimated_tokens(&self) -> usize {
        match self.kind {
            AttachmentKind::Image => 1_600,
            AttachmentKind::Pdf => self.base64.len() / 4,
        }
    }

    /// What a model that cannot read this file is told instead of it.
    pub fn note(&self) -> String {
        if let Some(instead) = &self.instead {
            return instead.to_string();
        }
        let what = match self.kind {
            AttachmentKind::Image => "an image",
            AttachmentKind::Pdf => "a PDF document",
        };
        format!(
            "[{what} was attached here ({}, {}), but this model cannot read it]",
            self.filename, self.media_type
        )
    }
}

/// An attachment's data URL, serialized straight from its base64 without building the
/// string (a 1 MB image would otherwise be copied once more per request).
#[derive(Debug)]
struct DataUrl<'a>(&'a Attachment);

impl std::fmt::Display for DataUrl<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "data:{};base64,{}", self.0.media_type, self.0.base64)
    }
}

impl serde::Serialize for DataUrl<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// What kinds of attachment a model reads, from the model catalog (T16, T23).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    pub images: bool,
    pub documents: bool,
}

impl Reads {
    fn reads(self, attachment: &Attachment) -> bool {
        match attachment.kind {
            AttachmentKind::Image => self.images,
            AttachmentKind::Pdf => self.documents,
        }
    }
}

impl ModelRequest {
    /// Whether any message carries an attachment; `false` costs one pass and nothing else.
    pub fn has_attachments(&self) -> bool {
        self.messages.iter().any(|message| match message {
            Message::UserFiles { files, .. } => !files.is_empty(),
            Message::ToolResults(results) => results.iter().any(|r| !r.images.is_empty()),
            _ => false,
        })
    }

    /// This request for a model that reads what `reads` says: each attachment it cannot
    /// read becomes a note in the text (T23), so a fallback to a model without vision
    /// still gets a valid request that says an image was there. `None` when nothing
    /// changes.
    pub fn fitted(&self, reads: Reads) -> Option<ModelRequest> {
        let unreadable = |files: &[Attachment]| files.iter().any(|f| !reads.reads(f));
        let changes = self.messages.iter().any(|message| match message {
            Message::UserFiles { files, .. } => unreadable(files),
            Message::ToolResults(results) => results.iter().any(|r| unreadable(&r.images)),
            _ => false,
        });
        if !changes {
            return None;
        }
        let mut fitted = self.clone();
        for message in &mut fitted.messages {
            match message {
                Message::UserFiles { text, files } => {
                    keep_readable(text, files, reads);
                    // Without files left it is a text message, sent as plain text.
                    if files.is_empty() {
                        *message = Message::User(std::mem::take(text));
                    }
                }
                Message::ToolResults(results) => {
                    for result in results {
                        keep_readable(&mut result.content, &mut result.images, reads);
                    }
                }
                _ => {}
            }
        }
        Some(fitted)
    }
}

/// Moves the attachments `reads` excludes out of `files` into notes appended to `text`.
fn keep_readable(text: &mut String, files: &mut Vec<Attachment>, reads: Reads) {
    files.retain(|file| {
        if reads.reads(file) {
            return true;
        }
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&file.note());
        false
    });
}

/// A typed event decoded from a provider stream.
#[derive(Clone, Debug, PartialEq)]
pub enum ProviderEvent {
    /// Text to append to the answer.
    TextDelta(String),
    /// Reasoning the model shows before or while answering (a provider's reasoning field,
    /// or inline `<think>` text split out by every adapter). Never part of the answer
    /// text: not stored as it, not sent back to the model (T18).
    ReasoningDelta(String),
    /// The model began a tool call (for the UI's `tool-input-start`).
    ToolInputStart { id: String, name: String },
    /// A fragment of a tool call's JSON arguments (for the UI's `tool-input-delta`).
    ToolInputDelta { id: String, delta: String },
    /// A tool call with all its arguments. Emitted once the provider closed the call
    /// (Anthropic `content_block_stop`, OpenAI at `[DONE]`), before `Finished`.
    /// The turn runs calls only after `Finished` arrives (SPEC T5), so a stream that
    /// fails after this event runs nothing.
    ToolCall(ToolCall),
    /// Token counts as the provider reports them; later reports fill in what earlier ones
    /// lacked (Anthropic sends input tokens first and output tokens at the end).
    Usage(Usage),
    /// The model ended its answer; always the last event.
    Finished(StopReason),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

impl Usage {
    /// Folds a later report into this one: fields the later one carries win.
    pub fn merge(&mut self, later: Usage) {
        if later.input_tokens.is_some() {
            self.input_tokens = later.input_tokens;
        }
        if later.output_tokens.is_some() {
            self.output_tokens = later.output_tokens;
        }
    }
}

/// Why the model stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A natural end (`stop`, `end_turn`, `stop_sequence`).
    Stop,
    /// The output token limit was reached (`length`, `max_tokens`).
    Length,
    /// The model asked for tool calls (`tool_calls`, `tool_use`).
    ToolCalls,
    /// Anything else the provider reports (content filter, refusal...).
    Other,
}

/// How a provider call failed. Each kind maps to one stable error code (SPEC T10).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProviderError {
    /// The provider answered 429.
    #[error("provider rate limited the request")]
    RateLimited { retry_after: Option<Duration> },
    /// The provider is down, unreachable, slow, or broke its stream.
    #[error("provider unavailable: {0}")]
    Unavailable(Unavailable),
    /// The provider refused the request itself (4xx other than 429).
    #[error("provider rejected the request with status {status}")]
    Rejected { status: u16 },
}

/// The ways a provider can be unavailable; kept apart for logs and metrics.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Unavailable {
    #[error("status {0}")]
    Status(u16),
    #[error("connection failed")]
    Connect,
    #[error("timed out")]
    Timeout,
    /// The body ended without the provider's end marker.
    #[error("stream ended early")]
    Incomplete,
    /// The provider sent an error event mid-stream.
    #[error("error event in stream")]
    StreamError,
    /// The body was not the documented wire format.
    #[error("undecodable stream")]
    Decode,
}

impl ProviderError {
    /// The message a client may see: what kind of failure, never the provider's text.
    pub fn public_message(&self) -> String {
        match self {
            Self::Unavailable(_) => {
                "the model provider is unavailable (outage, timeout or broken stream)".into()
            }
            other => other.to_string(),
        }
    }

    /// The stable code the client sees.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::RateLimited { .. } => ErrorCode::RateLimited,
            Self::Unavailable(_) => ErrorCode::ProviderUnavailable,
            Self::Rejected { .. } => ErrorCode::ProviderRejected,
        }
    }

    /// A bounded label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::RateLimited { .. } => "rate_limited",
            Self::Rejected { .. } => "rejected",
            Self::Unavailable(Unavailable::Status(_)) => "status",
            Self::Unavailable(Unavailable::Connect) => "connect",
            Self::Unavailable(Unavailable::Timeout) => "timeout",
            Self::Unavailable(Unavailable::Incomplete) => "incomplete",
            Self::Unavailable(Unavailable::StreamError) => "stream_error",
            Self::Unavailable(Unavailable::Decode) => "decode",
        }
    }

    /// Classifies a non-success HTTP status.
    pub fn from_status(status: u16, retry_after: Option<Duration>) -> Self {
        match status {
            429 => Self::RateLimited { retry_after },
            // 408 (timeout), 409 (Anthropic's lock conflicts) and 529 (overloaded) are outages.
            408 | 409 | 500..=599 => Self::Unavailable(Unavailable::Status(status)),
            _ => Self::Rejected { status },
        }
    }

    /// Classifies a reqwest failure (connect, timeout, body read).
    pub fn from_transport(err: &reqwest::Error) -> Self {
        if err.is_timeout() {
            Self::Unavailable(Unavailable::Timeout)
        } else if err.is_connect() {
            Self::Unavailable(Unavailable::Connect)
        } else if err.is_decode() || err.is_body() {
            Self::Unavailable(Unavailable::Incomplete)
        } else {
            Self::Unavailable(Unavailable::Connect)
        }
    }
}

/// Events of one model call, in order. See the module docs for the contract.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<ProviderEvent, ProviderError>> + Send>>;

/// One provider's streaming API.
pub trait ModelProvider: Send + Sync {
    /// Sends `request` and resolves once the provider accepted it.
    fn stream<'a>(
        &'a self,
        request: &'a ModelRequest,
    ) -> BoxFuture<'a, Result<EventStream, ProviderError>>;

    /// Embeds a batch of texts (B6). The default is a provider without an embeddings
    /// endpoint (Anthropic's API has none): refused as a call to a missing endpoint is.
    fn embed<'a>(
        &'a self,
        request: &'a EmbeddingRequest,
    ) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        let _ = request;
        Box::pin(async { Err(ProviderError::Rejected { status: 404 }) })
    }
}

/// Connection settings shared by the adapters.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// For OpenAI, the base including `/v1` (`https://api.openai.com/v1`); for Anthropic,
    /// the host (`https://api.anthropic.com`).
    pub base_url: String,
    pub api_key: Option<String>,
    /// Until the response status arrives.
    pub connect_timeout: Duration,
    /// Longest silence between two chunks of a stream.
    pub idle_timeout: Duration,
}

/// Requests with attachments, shared by the wires' rendering tests (T23).
#[cfg(test)]
mod fixtures {
    use super::{Attachment, AttachmentKind, Message, ModelRequest, ToolCall, ToolResult};

    /// `\x89PNG` in base64.
    pub const PNG_BASE64: &str = "iVBORw==";
    /// `%PDF` in base64.
    pub const PDF_BASE64: &str = "JVBERg==";

    pub fn png(name: &str) -> Attachment {
        Attachment::new(AttachmentKind::Image, "image/png", name, b"\x89PNG")
    }

    pub fn pdf(name: &str) -> Attachment {
        Attachment::new(AttachmentKind::Pdf, "application/pdf", name, b"%PDF")
    }

    /// A user message with an image and a PDF, then a tool call whose result carries a
    /// screenshot.
    pub fn files_request() -> ModelRequest {
        ModelRequest {
            model: "m".into(),
            messages: vec![
                Message::UserFiles {
                    text: "What is in these?".into(),
                    files: vec![png("photo.png"), pdf("report.pdf")],
                },
                Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "call_s".into(),
                        name: "browser_screenshot".into(),
                        arguments: "{}".into(),
                    }],
                },
                Message::ToolResults(vec![ToolResult {
                    call_id: "call_s".into(),
                    content: "saved shot.png".into(),
                    is_error: false,
                    images: vec![png("shot.png")],
                }]),
            ],
            max_output_tokens: 100,
            ..ModelRequest::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{files_request, pdf, png};
    use super::*;

    #[test]
    fn attachments_are_base64_once() {
        assert_eq!(&*png("a.png").base64, fixtures::PNG_BASE64);
        assert_eq!(&*pdf("a.pdf").base64, fixtures::PDF_BASE64);
        let url = serde_json::to_value(DataUrl(&png("a.png"))).unwrap();
        assert_eq!(url, "data:image/png;base64,iVBORw==");
    }

    /// T23: a model that reads everything gets the request as it is, and a text-only
    /// request is never copied.
    #[test]
    fn a_request_it_can_read_is_not_fitted() {
        let all = Reads {
            images: true,
            documents: true,
        };
        assert!(files_request().has_attachments());
        assert_eq!(files_request().fitted(all), None);
        let text_only = ModelRequest {
            messages: vec![Message::User("hi".into())],
            ..ModelRequest::default()
        };
        assert!(!text_only.has_attachments());
        assert_eq!(text_only.fitted(Reads::default()), None);
    }

    /// T23: what the model cannot read becomes a note saying it was attached, in the
    /// user message's text and in the tool result's.
    #[test]
    fn unreadable_attachments_become_notes() {
        let images_only = Reads {
            images: true,
            documents: false,
        };
        let fitted = files_request().fitted(images_only).unwrap();
        assert_eq!(
            fitted.messages[0],
            Message::UserFiles {
                text: "What is in these?\n[a PDF document was attached here (report.pdf, \
                       application/pdf), but this model cannot read it]"
                    .into(),
                files: vec![png("photo.png")],
            }
        );
        assert_eq!(fitted.messages[2], files_request().messages[2]);

        let blind = files_request().fitted(Reads::default()).unwrap();
        assert_eq!(
            blind.messages[0],
            Message::User(
                "What is in these?\n[an image was attached here (photo.png, image/png), but \
                 this model cannot read it]\n[a PDF document was attached here (report.pdf, \
                 application/pdf), but this model cannot read it]"
                    .into()
            )
        );
        let Message::ToolResults(results) = &blind.messages[2] else {
            panic!("not results: {:?}", blind.messages[2]);
        };
        assert!(results[0].images.is_empty());
        assert_eq!(
            results[0].content,
            "saved shot.png\n[an image was attached here (shot.png, image/png), but this model \
             cannot read it]"
        );
        assert!(!blind.has_attachments());
    }
}
