//! The worker tools (SPEC T4, W8): declared from the agent's RuntimeProfile, so the model
//! can call one before any worker exists; the first call provisions.
//!
//! A call whose channel drops under it (the worker's socket, or the replica holding it)
//! is not lost: the worker keeps running it, and once the worker has dialed again (W9)
//! the call is attached to by its key and answers what the worker kept (D3). A turn taken
//! over does the same for the calls that were in flight at its replica's death.
//!
//! A call that could not be handed to the replica holding the worker (Redis, which carries
//! it there, blipped: the owner could not be looked up, or nothing was published) is sent
//! again for up to [`RESEND_FOR`]: nothing ran, so sending again cannot run it twice.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde_json::Value;

use super::call::{Failure, Files, WorkerCall, call_worker};
use super::{SessionError, Sessions, Target, Wanted, relay, uploads};
use crate::artifacts::{ArtifactOwner, ArtifactStore};
use crate::tools::{Tool, ToolCtx, ToolOutput};
use channel::catalog::{WorkerToolDecl, catalog_for};
use domain::approvals::RiskClass;
use providers::ToolSpec;

/// How often a running call records use of its session.
const IN_CALL_TOUCH: std::time::Duration = std::time::Duration::from_secs(15);
/// Attaches a call makes after its channel dropped: each waits for a re-dial (W9).
const MAX_REATTACH: usize = 3;
/// How long a call that reached no replica is sent again: a Redis blip, not an outage.
const RESEND_FOR: Duration = Duration::from_secs(3);
/// The pause between two sends of such a call.
const RESEND_PAUSE: Duration = Duration::from_millis(200);

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
            let resend_until = Instant::now() + RESEND_FOR;
            let target = match self.target(ctx, resend_until).await {
                Ok(target) => target,
                Err(err) => return ToolOutput::error(format!("no worker: {err}")),
            };
            let session = target.session();
            self.sessions.touched(session);
            let call = async {
                let (mut target, mut session) = (target, session);
                let first = loop {
                    let outcome = self.once(ctx, target, arguments.clone(), false).await;
                    if !matches!(outcome, Err(Failure::Unsent))
                        || !resend_pause(ctx, resend_until).await
                    {
                        break outcome;
                    }
                    target = match self.target(ctx, resend_until).await {
                        Ok(target) => target,
                        Err(err) => break Err(Failure::Other(format!("no worker: {err}"))),
                    };
                    session = target.session();
                };
                self.attach_after(ctx, session, first).await
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
            output.unwrap_or_else(|failure| ToolOutput::error(failure.into_message()))
        }
        .boxed()
    }

    /// The worker kept the call's outcome, or still runs it (D3): attached to by its key
    /// once the chat's worker is connected again; the input is not needed for that.
    fn reattach<'a>(
        &'a self,
        ctx: &'a ToolCtx,
        _input: Value,
    ) -> BoxFuture<'a, Option<ToolOutput>> {
        async move {
            let session = self
                .sessions
                .chat_session(ctx.team, ctx.agent, ctx.chat)
                .await?;
            self.attach_after(ctx, session, Err(Failure::Dropped))
                .await
                .ok()
        }
        .boxed()
    }
}

/// Waits [`RESEND_PAUSE`] before a call is sent again; `false` when it is not to be: the
/// turn was cancelled, or `until` has passed.
async fn resend_pause(ctx: &ToolCtx, until: Instant) -> bool {
    if Instant::now() >= until {
        return false;
    }
    tokio::select! {
        () = ctx.cancel.cancelled() => false,
        () = tokio::time::sleep(RESEND_PAUSE) => true,
    }
}

impl WorkerTool {
    /// The chat's worker (provisioned if need be); while Redis cannot say who holds its
    /// channel, asked again until `until`.
    async fn target(&self, ctx: &ToolCtx, until: Instant) -> Result<Target, SessionError> {
        loop {
            let wanted = Wanted {
                team: ctx.team,
                agent: ctx.agent,
                chat: ctx.chat,
                profile: &self.profile,
                user: ctx.authority.user(),
            };
            let located = self.sessions.ensure(wanted, ctx.ui.as_ref(), &ctx.cancel);
            match located.await {
                Err(SessionError::OwnerUnknown) if resend_pause(ctx, until).await => {}
                other => return other,
            }
        }
    }

    /// One call (or, with `attach`, one attach: `arguments` are then not looked at) on the
    /// worker at `target`.
    async fn once(
        &self,
        ctx: &ToolCtx,
        target: Target,
        arguments: serde_json::Map<String, Value>,
        attach: bool,
    ) -> Result<ToolOutput, Failure> {
        // T25: the chat's files go first; an attach asks for a call that had them.
        let files = if attach {
            None
        } else {
            Some(self.sessions.manifest(ctx.team, ctx.chat, ctx.turn).await)
        };
        match target {
            Target::Local { worker, .. } => {
                let note = match &files {
                    Some(files) => uploads::deliver(&worker, files).await,
                    None => None,
                };
                // The current span is the turn's `tool_call`.
                let trace = logging::traces::context_of(&tracing::Span::current());
                let call = WorkerCall {
                    tool: self.decl.name,
                    arguments,
                    call_id: &ctx.call_id,
                    turn: ctx.turn,
                    attach,
                };
                let answer =
                    call_worker(&worker, call, ctx.ui.as_ref(), &ctx.cancel, trace.as_ref())
                        .await?;
                let owner = ArtifactOwner {
                    team: ctx.team,
                    agent: ctx.agent,
                    chat: Some(ctx.chat),
                    turn: Some(ctx.turn),
                };
                let output = self.files.output(self.decl.name, owner, answer).await;
                Ok(uploads::noted(output, note))
            }
            Target::Remote { owner, session } => {
                let remote = relay::Remote {
                    owner: &owner,
                    session,
                    tool: self.decl.name,
                    attach,
                    files,
                };
                relay::call_remote(&self.sessions, remote, arguments, ctx).await
            }
        }
    }

    /// D3: while `outcome` says the channel dropped under the call, waits for the worker
    /// of `session` to dial again and attaches to the call there.
    async fn attach_after(
        &self,
        ctx: &ToolCtx,
        session: protocol::SessionId,
        mut outcome: Result<ToolOutput, Failure>,
    ) -> Result<ToolOutput, Failure> {
        for _ in 0..MAX_REATTACH {
            if !matches!(outcome, Err(Failure::Dropped)) {
                break;
            }
            let Some(target) = self.sessions.rejoin(session, &ctx.cancel).await else {
                break;
            };
            outcome = self.once(ctx, target, serde_json::Map::new(), true).await;
        }
        if let Err(failure) = &outcome {
            tracing::info!(session = %session, class = failure.class(), "worker call lost");
        }
        outcome
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
