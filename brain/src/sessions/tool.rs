//! The worker tools (SPEC T4, W8): declared from the agent's RuntimeProfile, so the model
//! can call one before any worker exists; the first call provisions.

use std::sync::Arc;

use base64::Engine;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientRequest, ServerResult,
};
use rmcp::service::PeerRequestOptions;
use serde_json::Value;

use super::Sessions;
use crate::artifacts::{ArtifactOwner, ArtifactStore, save_artifact};
use crate::provider::ToolSpec;
use crate::tools::{Tool, ToolCtx, ToolOutput};
use channel::catalog::{UPLOAD_ARTIFACT, WorkerToolDecl, catalog_for};

/// The worker tools `profile` offers, bound to this turn's sessions.
pub fn worker_tools(
    sessions: &Sessions,
    artifacts: &Arc<dyn ArtifactStore>,
    max_artifact_bytes: usize,
    profile: &str,
) -> Vec<Arc<dyn Tool>> {
    catalog_for(profile)
        .into_iter()
        .map(|decl| {
            Arc::new(WorkerTool {
                decl,
                profile: profile.to_owned(),
                sessions: sessions.clone(),
                artifacts: artifacts.clone(),
                max_artifact_bytes,
            }) as Arc<dyn Tool>
        })
        .collect()
}

struct WorkerTool {
    decl: WorkerToolDecl,
    profile: String,
    sessions: Sessions,
    artifacts: Arc<dyn ArtifactStore>,
    max_artifact_bytes: usize,
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

impl Tool for WorkerTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.decl.name.to_owned(),
            description: self.decl.description.to_owned(),
            input_schema: self.decl.input_schema.clone(),
        }
    }

    fn writes(&self) -> bool {
        self.decl.writes
    }

    fn call<'a>(&'a self, ctx: &'a ToolCtx, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            let worker = match self
                .sessions
                .ensure(ctx.team, ctx.agent, ctx.chat, &self.profile, ctx.ui.as_ref(), &ctx.cancel)
                .await
            {
                Ok(worker) => worker,
                Err(err) => return ToolOutput::error(format!("no worker: {err}")),
            };
            if let Err(err) = self.sessions.store.touch_session(worker.session).await {
                tracing::warn!(session = %worker.session, class = err.metric_label(), "session use not recorded");
            }
            let Value::Object(arguments) = arguments else {
                return ToolOutput::error("arguments must be a JSON object");
            };
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(
                CallToolRequestParams::new(self.decl.name).with_arguments(arguments),
            ));
            let peer = worker.service.peer().clone();
            let handle = match peer.send_cancellable_request(request, PeerRequestOptions::no_options()).await {
                Ok(handle) => handle,
                Err(_) => return ToolOutput::error("the worker channel is closed"),
            };
            let token = handle.progress_token.clone();
            if let Some(ui) = &ctx.ui {
                worker.client().route(token.clone(), ctx.call_id.clone(), ui.clone());
            }
            let mut guard = CancelOnDrop {
                peer: Some(peer),
                request_id: handle.id.clone(),
            };
            let answer = tokio::select! {
                () = ctx.cancel.cancelled() => None,
                answer = handle.await_response() => Some(answer),
                _ = worker.control.ended() => {
                    worker.client().unroute(&token);
                    guard.peer = None;
                    return ToolOutput::error("the worker was lost during the call; the next call starts a new one");
                }
            };
            worker.client().unroute(&token);
            // A call longer than the idle window must not be torn down right after it.
            if let Err(err) = self.sessions.store.touch_session(worker.session).await {
                tracing::warn!(session = %worker.session, class = err.metric_label(), "session use not recorded");
            }
            let Some(answer) = answer else {
                // The guard tells the worker; the turn stores the synthetic result.
                return ToolOutput::error("cancelled");
            };
            guard.peer = None;
            match answer {
                Ok(ServerResult::CallToolResult(result)) => {
                    let is_error = result.is_error.unwrap_or(false);
                    let content = serde_json::to_value(&result.content).unwrap_or_default();
                    if self.decl.name == UPLOAD_ARTIFACT && !is_error {
                        return self.store_artifact(ctx, &content).await;
                    }
                    let text = content_text(&content);
                    if is_error { ToolOutput::error(text) } else { ToolOutput::ok(text) }
                }
                Ok(_) => ToolOutput::error("the worker sent an unexpected answer"),
                Err(_) => ToolOutput::error("the worker channel closed during the call"),
            }
        }
        .boxed()
    }
}

impl WorkerTool {
    /// `upload_artifact`: the bytes came through the channel; the brain stores them (the
    /// pod holds no storage credentials).
    async fn store_artifact(&self, ctx: &ToolCtx, content: &Value) -> ToolOutput {
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
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(blob) else {
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
        let owner = ArtifactOwner {
            team: ctx.team,
            agent: ctx.agent,
            chat: Some(ctx.chat),
            turn: Some(ctx.turn),
        };
        match save_artifact(
            &self.sessions.store,
            self.artifacts.as_ref(),
            self.max_artifact_bytes,
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
