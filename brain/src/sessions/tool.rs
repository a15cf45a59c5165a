//! The worker tools (SPEC T4, W8): declared from the agent's RuntimeProfile, so the model
//! can call one before any worker exists; the first call provisions.

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde_json::Value;

use super::call::{Files, call_worker};
use super::{Sessions, Target, relay};
use crate::approvals::RiskClass;
use crate::artifacts::{ArtifactOwner, ArtifactStore};
use crate::provider::ToolSpec;
use crate::tools::{Tool, ToolCtx, ToolOutput};
use channel::catalog::{WorkerToolDecl, catalog_for};

/// How often a running call records use of its session.
const IN_CALL_TOUCH: std::time::Duration = std::time::Duration::from_secs(15);

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
                files: Files::new(
                    sessions.store.clone(),
                    artifacts.clone(),
                    max_artifact_bytes,
                ),
            }) as Arc<dyn Tool>
        })
        .collect()
}

struct WorkerTool {
    decl: WorkerToolDecl,
    profile: String,
    sessions: Sessions,
    files: Files,
}

impl Tool for WorkerTool {
    fn metric_label(&self) -> &'static str {
        self.decl.name
    }

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

    fn risk(&self) -> RiskClass {
        worker_risk(self.decl.name)
    }

    fn worker_profile(&self) -> Option<&str> {
        Some(&self.profile)
    }

    fn call<'a>(&'a self, ctx: &'a ToolCtx, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            let Value::Object(arguments) = arguments else {
                return ToolOutput::error("arguments must be a JSON object");
            };
            let target = match self
                .sessions
                .ensure(
                    ctx.team,
                    ctx.agent,
                    ctx.chat,
                    &self.profile,
                    ctx.ui.as_ref(),
                    &ctx.cancel,
                )
                .await
            {
                Ok(target) => target,
                Err(err) => return ToolOutput::error(format!("no worker: {err}")),
            };
            let session = target.session();
            self.sessions.touched(session);
            let call = async {
                match target {
                    Target::Local { worker, .. } => {
                        // The current span is the turn's `tool_call`.
                        let trace = logging::traces::context_of(&tracing::Span::current());
                        let answer = call_worker(
                            &worker,
                            self.decl.name,
                            arguments,
                            &ctx.call_id,
                            ctx.ui.as_ref(),
                            &ctx.cancel,
                            trace.as_ref(),
                        )
                        .await;
                        let owner = ArtifactOwner {
                            team: ctx.team,
                            agent: ctx.agent,
                            chat: Some(ctx.chat),
                            turn: Some(ctx.turn),
                        };
                        self.files.output(self.decl.name, owner, answer).await
                    }
                    Target::Remote { owner, session } => {
                        relay::call_remote(
                            &self.sessions,
                            &owner,
                            session,
                            self.decl.name,
                            arguments,
                            ctx,
                        )
                        .await
                    }
                }
            };
            tokio::pin!(call);
            // A running call is use: keep pushing the idle teardown back while it runs,
            // or a command longer than the idle window would be torn down under it (W7).
            let mut still_running = tokio::time::interval_at(
                tokio::time::Instant::now() + IN_CALL_TOUCH,
                IN_CALL_TOUCH,
            );
            let output = loop {
                tokio::select! {
                    output = &mut call => break output,
                    _ = still_running.tick() => self.sessions.touched(session),
                }
            };
            // A call longer than the idle window must not be torn down right after it.
            self.sessions.touched(session);
            output
        }
        .boxed()
    }
}

/// A1: the worker's tools act on its workspace, except what reaches beyond the pod: a
/// shell command may call anything on the network, and the browser drives real sites.
fn worker_risk(tool: &str) -> RiskClass {
    use channel::catalog::{
        BROWSER_CLICK, BROWSER_NAVIGATE, BROWSER_SNAPSHOT, BROWSER_TYPE, LIST_DIR, READ_FILE, SHELL,
    };
    match tool {
        READ_FILE | LIST_DIR | BROWSER_SNAPSHOT => RiskClass::Read,
        SHELL | BROWSER_NAVIGATE | BROWSER_CLICK | BROWSER_TYPE => RiskClass::External,
        _ => RiskClass::Write,
    }
}
