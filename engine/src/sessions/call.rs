//! One call of a worker tool on a worker whose channel this replica holds, and what the
//! model reads of its answer: used by the worker tools (`tool.rs`) for a local worker and
//! by the relay (`relay.rs`) for a call another replica forwarded here.

use std::sync::Arc;

use base64::Engine;
use channel::catalog::returns_file;
use logging::traces::TraceContext;
use protocol::TurnId;
use protocol::channel::{ATTACH_META, CALL_KEY_META, KEPT_CALLS_CAPABILITY, UNKNOWN_CALL};
use protocol::ui::UiChunk;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientRequest, ErrorCode,
    ServerResult,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::registry::LiveWorker;
use crate::artifacts::{ArtifactOwner, ArtifactStore, save_artifact};
use crate::tools::ToolOutput;
use providers::{Attachment, AttachmentKind};
use store::Store;

/// What the model reads when the channel drops under a call to a worker that does not keep
/// calls (W9): it stops what the call started and never runs it again.
const DROPPED_DURING_CALL: &str = "the worker's connection dropped during this call: the call \
    was stopped and will not be run again (what it did before stays done)";
/// What the model reads when a kept call's outcome could not be had back (D3).
const LOST_DURING_CALL: &str = "outcome_unknown: the worker's connection dropped during this \
    call and its outcome could not be recovered; the tool may or may not have run, and it was \
    not run again. Check its effect before relying on it or calling it again.";

/// One call of a worker tool.
pub(super) struct WorkerCall<'a> {
    pub tool: &'a str,
    pub arguments: serde_json::Map<String, Value>,
    /// The model's id of the call: live output is tagged with it, and with `turn` it keys
    /// the call on a worker that keeps calls (D3).
    pub call_id: &'a str,
    pub turn: TurnId,
    /// Asks only for the outcome of the call, made earlier under the same key (D3).
    pub attach: bool,
}

/// What the model reads of a relayed call that could not reach the replica holding the
/// worker.
pub(super) const UNREACHABLE: &str = "the replica holding the worker is unreachable";

/// Why a worker call has no answer.
#[derive(Debug)]
pub(super) enum Failure {
    /// The channel, or the replica holding it, went away during a kept call: the worker
    /// may still run it, and an attach may get its outcome (D3).
    Dropped,
    /// The worker does not know the call an attach asked for: whether it ran is unknown.
    Unknown,
    /// Nothing reached the replica holding the worker (Redis could not carry the call, or
    /// that replica was not listening): sending it again cannot run it twice.
    Unsent,
    /// Anything else: the text is for the model.
    Other(String),
}

impl Failure {
    /// A stable class for logs.
    pub(super) fn class(&self) -> &'static str {
        match self {
            Self::Dropped => "dropped",
            Self::Unknown => "unknown",
            Self::Unsent => "unsent",
            Self::Other(_) => "other",
        }
    }

    /// What the model reads.
    pub(super) fn into_message(self) -> String {
        match self {
            Self::Dropped | Self::Unknown => LOST_DURING_CALL.to_owned(),
            Self::Unsent => UNREACHABLE.to_owned(),
            Self::Other(message) => message,
        }
    }
}

/// Sends `notifications/cancelled` for a call whose future was dropped before its
/// answer (the turn was cancelled), so the worker kills what it runs (T8).
struct CancelOnDrop {
    peer: Option<rmcp::Peer<rmcp::RoleClient>>,
    request_id: rmcp::model::RequestId,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(peer) = self.peer.take() {
            let request_id = self.request_id.clone();
            tokio::spawn(async move {
                let params =
                    CancelledNotificationParam::new(Some(request_id), Some("cancelled".into()));
                let _ = peer.notify_cancelled(params).await;
            });
        }
    }
}

/// A worker's answer to one call: MCP content items as JSON, and the error flag.
#[derive(Clone, Debug)]
pub struct Answer {
    pub content: Value,
    pub is_error: bool,
}

/// Runs `call` on a worker whose channel this replica holds. Live output goes to `ui`
/// tagged with its call id; a cancel sends `notifications/cancelled` so the worker kills
/// what it runs (T8). `trace`, the caller's `tool_call` span, goes in the request's
/// `_meta` (`traceparent`, `tracestate`: MCP's SEP-414), so the worker's spans for the call
/// are its children (O2). A worker that keeps calls (D3) gets the call's key in `_meta`
/// too, so a call whose channel drops goes on and can be attached to after the re-dial.
pub(super) async fn call_worker(
    worker: &LiveWorker,
    call: WorkerCall<'_>,
    ui: Option<&mpsc::Sender<UiChunk>>,
    cancel: &CancellationToken,
    trace: Option<&TraceContext>,
) -> Result<Answer, Failure> {
    let kept = keeps_calls(worker);
    if call.attach && !kept {
        return Err(Failure::Unknown);
    }
    let mut params =
        CallToolRequestParams::new(call.tool.to_owned()).with_arguments(call.arguments);
    if let Some(trace) = trace {
        let meta = params.meta.get_or_insert_default();
        meta.set_traceparent(trace.traceparent.clone());
        if let Some(tracestate) = &trace.tracestate {
            meta.set_tracestate(tracestate.clone());
        }
    }
    if kept {
        let meta = params.meta.get_or_insert_default();
        meta.insert(
            CALL_KEY_META.into(),
            format!("{}:{}", call.turn, call.call_id).into(),
        );
        if call.attach {
            meta.insert(ATTACH_META.into(), true.into());
        }
    }
    // What a channel that drops under the call means: a kept call may be attached to.
    let dropped = || {
        if kept {
            Failure::Dropped
        } else {
            Failure::Other(DROPPED_DURING_CALL.into())
        }
    };
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let peer = worker.service.peer().clone();
    let Ok(handle) = peer
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
    else {
        if call.attach {
            return Err(Failure::Dropped);
        }
        return Err(Failure::Other(
            "the worker's connection dropped before the call started; try again".to_owned(),
        ));
    };
    let routed = ui.map(|ui| {
        worker.client().route(
            handle.progress_token.clone(),
            call.call_id.to_owned(),
            ui.clone(),
        )
    });
    let mut guard = CancelOnDrop {
        peer: Some(peer),
        request_id: handle.id.clone(),
    };
    let answer = tokio::select! {
        () = cancel.cancelled() => None,
        answer = handle.await_response() => Some(answer),
        _ = worker.control.ended() => {
            guard.peer = None;
            return Err(dropped());
        }
    };
    drop(routed);
    // On cancel the guard tells the worker; the turn stores the synthetic result.
    let answer = answer.ok_or_else(|| Failure::Other("cancelled".to_owned()))?;
    guard.peer = None;
    match answer {
        Ok(ServerResult::CallToolResult(result)) => {
            let mut content = serde_json::to_value(&result.content).unwrap_or_default();
            // The worker masked its output already; a value it missed stops here (W12).
            worker.client().masks().mask_json(&mut content);
            Ok(Answer {
                is_error: result.is_error.unwrap_or(false),
                content,
            })
        }
        Ok(_) => Err(Failure::Other(
            "the worker sent an unexpected answer".into(),
        )),
        Err(ServiceError::McpError(error)) if error.code == ErrorCode(UNKNOWN_CALL) => {
            Err(Failure::Unknown)
        }
        Err(_) => Err(dropped()),
    }
}

/// Whether the worker announced that it keeps calls (D3); one of an earlier release does not.
fn keeps_calls(worker: &LiveWorker) -> bool {
    worker.service.peer().peer_info().is_some_and(|info| {
        info.capabilities
            .experimental
            .as_ref()
            .is_some_and(|experimental| experimental.contains_key(KEPT_CALLS_CAPABILITY))
    })
}

/// Where the files that `FILE_RESULT_TOOLS` answer with are stored. The replica that
/// receives a file's bytes from the worker stores them and they go no further: not
/// through the relay either, where a 25 MiB file, base64-encoded, would exceed Redis'
/// pub/sub output buffer.
#[derive(Clone)]
pub(super) struct Files {
    store: Store,
    artifacts: Arc<dyn ArtifactStore>,
    max_bytes: usize,
}

impl Files {
    pub(super) fn new(store: Store, artifacts: Arc<dyn ArtifactStore>, max_bytes: usize) -> Self {
        Self {
            store,
            artifacts,
            max_bytes,
        }
    }

    /// What the model reads of a worker's answer to `tool`: for `upload_artifact` and
    /// `browser_screenshot`, the file is stored and the model gets its id.
    pub(super) async fn output(
        &self,
        tool: &str,
        owner: ArtifactOwner,
        answer: Answer,
    ) -> ToolOutput {
        if returns_file(tool) && !answer.is_error {
            return self.store_artifact(owner, &answer.content).await;
        }
        let text = content_text(&answer.content);
        if answer.is_error {
            ToolOutput::error(text)
        } else {
            ToolOutput::ok(text)
        }
    }

    /// The bytes came through the channel; the brain stores them (the pod holds no
    /// storage credentials).
    async fn store_artifact(&self, owner: ArtifactOwner, content: &Value) -> ToolOutput {
        let Some(resource) = content
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|c| (c["type"] == "resource").then(|| &c["resource"]))
        else {
            return ToolOutput::error("the worker sent no file");
        };
        let Some(blob) = resource["blob"].as_str() else {
            return ToolOutput::error("the worker sent no file bytes");
        };
        // Up to 25 MiB: decoded off the runtime's threads, so the relay's beats and
        // other turns' chunks are not held up behind it.
        let blob = blob.to_owned();
        let decoded = tokio::task::spawn_blocking(move || {
            base64::engine::general_purpose::STANDARD.decode(blob)
        })
        .await;
        let Ok(Ok(bytes)) = decoded else {
            return ToolOutput::error("the worker sent undecodable bytes");
        };
        let name = resource["uri"]
            .as_str()
            .and_then(|uri| uri.rsplit('/').next())
            .unwrap_or("artifact")
            .to_owned();
        let content_type = resource["mimeType"]
            .as_str()
            .unwrap_or("application/octet-stream");
        let image = image_of(&name, &bytes);
        match save_artifact(
            &self.store,
            self.artifacts.as_ref(),
            self.max_bytes,
            owner,
            &name,
            content_type,
            bytes.into(),
        )
        .await
        {
            Ok(row) => ToolOutput {
                images: image.into_iter().collect(),
                ..ToolOutput::ok(format!(
                    "stored artifact {} ({name}, {} bytes)",
                    row.id, row.size_bytes
                ))
            },
            Err(err) => ToolOutput::error(format!("the artifact could not be stored: {err}")),
        }
    }
}

/// The image a model with vision is shown of a stored file (T24): bytes an image format
/// by their own magic numbers (never the worker's word), of at most
/// [`MAX_TOOL_IMAGE_BYTES`].
fn image_of(name: &str, bytes: &[u8]) -> Option<Attachment> {
    let sniffed = crate::files::sniff(bytes, name);
    (sniffed.is_image() && bytes.len() <= MAX_TOOL_IMAGE_BYTES)
        .then(|| Attachment::new(AttachmentKind::Image, sniffed.media_type(), name, bytes))
}

/// The largest image a tool's result shows a model: the providers refuse larger ones
/// (Anthropic's bound is 5 MB an image), and a screenshot is far below it.
const MAX_TOOL_IMAGE_BYTES: usize = 5 * 1024 * 1024;

/// The text of an MCP result's content items; other kinds are named, not inlined.
fn content_text(content: &Value) -> String {
    let mut out = Vec::new();
    for item in content.as_array().into_iter().flatten() {
        match item["type"].as_str() {
            Some("text") => out.push(item["text"].as_str().unwrap_or_default().to_owned()),
            Some(other) => out.push(format!("[{other} content]")),
            None => {}
        }
    }
    out.join("\n")
}
