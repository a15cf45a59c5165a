//! One call of a worker tool on a worker whose channel this replica holds, and what the
//! model reads of its answer: used by the worker tools (`tool.rs`) for a local worker and
//! by the relay (`relay.rs`) for a call another replica forwarded here.

use std::sync::Arc;

use base64::Engine;
use channel::catalog::returns_file;
use logging::traces::TraceContext;
use protocol::ui::UiChunk;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientRequest, ServerResult,
};
use rmcp::service::PeerRequestOptions;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::registry::LiveWorker;
use crate::artifacts::{ArtifactOwner, ArtifactStore, save_artifact};
use crate::store::Store;
use crate::tools::ToolOutput;

/// What the model reads when the channel drops under a call (W9). The worker stops what
/// the call started and never runs it again; nothing resends it.
const DROPPED_DURING_CALL: &str = "the worker's connection dropped during this call: the call \
    was stopped and will not be run again (what it did before stays done)";

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

/// Runs `tool` on a worker whose channel this replica holds. Live output goes to `ui`
/// tagged with `call_id`; a cancel sends `notifications/cancelled` so the worker kills
/// what it runs (T8). `trace`, the caller's `tool_call` span, goes in the request's
/// `_meta` (`traceparent`, `tracestate`: MCP's SEP-414), so the worker's spans for the call
/// are its children (O2). The error string is for the model.
pub(super) async fn call_worker(
    worker: &LiveWorker,
    tool: &str,
    arguments: serde_json::Map<String, Value>,
    call_id: &str,
    ui: Option<&mpsc::Sender<UiChunk>>,
    cancel: &CancellationToken,
    trace: Option<&TraceContext>,
) -> Result<Answer, String> {
    let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
    if let Some(trace) = trace {
        let meta = params.meta.get_or_insert_default();
        meta.set_traceparent(trace.traceparent.clone());
        if let Some(tracestate) = &trace.tracestate {
            meta.set_tracestate(tracestate.clone());
        }
    }
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let peer = worker.service.peer().clone();
    let handle = peer
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .map_err(|_| {
            "the worker's connection dropped before the call started; try again".to_owned()
        })?;
    let routed = ui.map(|ui| {
        worker.client().route(
            handle.progress_token.clone(),
            call_id.to_owned(),
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
            return Err(DROPPED_DURING_CALL.into());
        }
    };
    drop(routed);
    // On cancel the guard tells the worker; the turn stores the synthetic result.
    let answer = answer.ok_or_else(|| "cancelled".to_owned())?;
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
        Ok(_) => Err("the worker sent an unexpected answer".into()),
        Err(_) => Err(DROPPED_DURING_CALL.into()),
    }
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
        answer: Result<Answer, String>,
    ) -> ToolOutput {
        match answer {
            Ok(answer) if returns_file(tool) && !answer.is_error => {
                self.store_artifact(owner, &answer.content).await
            }
            Ok(answer) => {
                let text = content_text(&answer.content);
                if answer.is_error {
                    ToolOutput::error(text)
                } else {
                    ToolOutput::ok(text)
                }
            }
            Err(message) => ToolOutput::error(message),
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
            Ok(row) => ToolOutput::ok(format!(
                "stored artifact {} ({name}, {} bytes)",
                row.id, row.size_bytes
            )),
            Err(err) => ToolOutput::error(format!("the artifact could not be stored: {err}")),
        }
    }
}

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
