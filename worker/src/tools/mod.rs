//! The MCP server the brain drives: the workspace tools of `channel::catalog`, decoded
//! with exactly its argument types, plus the in-band token renewal and, for a pooled
//! worker, the bind to a session (SPEC W3, W8, W9, R3), and the session's secrets
//! (W12).
//!
//! - `paths`: workspace confinement for the file tools.
//! - `output`: head-and-tail capping with a truncation marker.
//! - `shell`: commands in their own process group, output streamed as progress.
//! - `files`: read, write, list, edit.
//! - `artifact`: a workspace file as an embedded resource.
//! - `browser` (cargo feature `browser`): the `browser_*` tools over
//!   [`crate::browser::Browser`].
//!
//! The worker serves exactly `catalog_for(profile)` (`WORKER_PROFILE`, default `light`):
//! the browser tools only for profile `browser`.
//!
//! A tool that ran and failed (a missing file, a path that escapes, a command that could
//! not start) answers with an `isError` result the model reads; a command that exits
//! non-zero is a normal result. Protocol errors are left to rmcp (unknown tool, arguments
//! that do not decode).
//!
//! The session's secrets arrive in the custom request `agent_runtime/env`
//! (`protocol::env`), answered once they are held: in this process's memory only, never
//! in its own environment or a file. `shell` sets them for each command and masks their
//! values in its output; the file tools mask them in what they answer. A pooled worker
//! bound to a session whose chat has a workspace snapshot is asked to restore it in the
//! custom request `agent_runtime/restore` (`protocol::snapshot`), answered once restored.
//!
//! - `kept`: calls the brain keys outlive their channel, and their outcomes wait for
//!   the brain to attach after a re-dial (D3).
//! - `uploads`: the chat's files under `uploads/`, as the brain asks before a call in the
//!   custom request `agent_runtime/uploads` (`protocol::uploads`, T25).
//! - `skills`: the agent's skills under `skills/<name>/`, as the brain asks beside them in
//!   `agent_runtime/skills` (`protocol::skills`, B8).

pub mod artifact;
#[cfg(feature = "browser")]
pub mod browser;
pub mod files;
pub mod kept;
pub mod output;
pub mod paths;
pub mod shell;
pub mod skills;
pub mod uploads;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use channel::catalog::{
    self, EditFileArgs, ListDirArgs, ReadFileArgs, ShellArgs, UploadArtifactArgs, WriteFileArgs,
};
use logging::traces::TraceContext;
use protocol::SessionId;
use protocol::channel::{BIND_NOTIFICATION, KEPT_CALLS_CAPABILITY, TOKEN_NOTIFICATION};
use protocol::env::{ENV_REQUEST, SessionEnv};
use protocol::skills::{SKILLS_CAPABILITY, SKILLS_REQUEST, SkillsRequest};
use protocol::snapshot::{RESTORE_REQUEST, Restored, SNAPSHOT_NOTIFICATION, SnapshotRequest};
use protocol::uploads::{UPLOADS_CAPABILITY, UPLOADS_REQUEST, UploadsRequest};
use rmcp::ErrorData;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ContentBlock, CustomNotification, CustomRequest, CustomResult, ErrorCode, Implementation,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{RoleServer, ServerHandler, tool, tool_handler, tool_router};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::{BrowserSettings, Token};
use crate::dial::Identity;
use crate::groups::Groups;

/// The catalog's description of `name`, so the brain and the worker describe a tool alike.
fn describe(name: &str) -> &'static str {
    catalog::all_tools()
        .into_iter()
        .find(|tool| tool.name == name)
        .map_or("", |tool| tool.description)
}

struct Shared {
    workspace: PathBuf,
    groups: Groups,
    /// Who the next dial proves to be: the newest token (renewed in-band), and for a
    /// bound pooled worker its session (W9).
    identity: Mutex<Identity>,
    /// The session's secrets (W12): replaced whole by each `agent_runtime/env`.
    secrets: RwLock<Arc<shell::Secrets>>,
    calls: AtomicU64,
    /// Keyed calls, running or kept for an attach (D3).
    kept: kept::Kept,
    /// Cancelled when the session ends: what a kept call stops with.
    session: CancellationToken,
    /// The channel endpoint, once snapshots are enabled: uploads go beside it (W10), and
    /// the chat's files come from beside it (T25).
    snapshot_brain: std::sync::OnceLock<String>,
    /// What every command's environment gets besides the session's secrets: the egress
    /// proxy and its CA bundle (W14), set once at start.
    command_env: std::sync::OnceLock<Arc<Vec<(String, String)>>>,
    /// The headless browser, when the profile serves the browser tools.
    #[cfg(feature = "browser")]
    browser: Option<crate::browser::Browser>,
}

/// The worker's MCP server. The session's state is shared; each channel serves its own
/// clone ([`Worker::on_channel`]).
#[derive(Clone)]
pub struct Worker {
    /// The tools of the profile; `#[tool_handler]` serves this one.
    tool_router: ToolRouter<Self>,
    shared: Arc<Shared>,
    /// Cancelled when the channel this clone serves ends: the calls it carried stop.
    channel: CancellationToken,
    /// This channel's keyed requests in flight, so a cancel of one stops its call (the
    /// call itself runs under the kept call's token, not the request's).
    keyed: kept::Cancels,
}

fn error(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn text(text: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

impl Worker {
    /// A worker serving profile `light` (the workspace tools). `workspace` must be
    /// canonical.
    pub fn new(
        workspace: PathBuf,
        identity: Identity,
        groups: Groups,
        shutdown: CancellationToken,
    ) -> Self {
        let browser = BrowserSettings::defaults(&workspace);
        Self::for_profile("light", browser, workspace, identity, groups, shutdown)
    }

    /// A worker serving exactly `catalog_for(profile)`; a tool this build lacks (the
    /// browser tools without the `browser` feature) is left out (the configuration
    /// refuses such a profile before this).
    pub fn for_profile(
        profile: &str,
        browser: BrowserSettings,
        workspace: PathBuf,
        identity: Identity,
        groups: Groups,
        shutdown: CancellationToken,
    ) -> Self {
        #[allow(unused_mut)]
        let mut router = Self::tool_router();
        #[cfg(feature = "browser")]
        {
            router += Self::browser_router();
        }
        let offered: Vec<&str> = catalog::catalog_for(profile)
            .iter()
            .map(|tool| tool.name)
            .collect();
        let served: Vec<String> = router
            .list_all()
            .into_iter()
            .map(|t| t.name.into())
            .collect();
        for name in served {
            if !offered.contains(&name.as_str()) {
                router.remove_route(&name);
            }
        }
        #[cfg(feature = "browser")]
        let browser = router
            .has_route(catalog::BROWSER_SNAPSHOT)
            .then(|| crate::browser::Browser::new(browser, groups.clone(), shutdown.clone()));
        #[cfg(not(feature = "browser"))]
        let _ = browser;
        Self {
            tool_router: router,
            channel: shutdown.child_token(),
            keyed: kept::Cancels::default(),
            shared: Arc::new(Shared {
                workspace,
                groups,
                identity: Mutex::new(identity),
                secrets: RwLock::default(),
                calls: AtomicU64::new(0),
                kept: kept::Kept::default(),
                session: shutdown,
                snapshot_brain: std::sync::OnceLock::new(),
                command_env: std::sync::OnceLock::new(),
                #[cfg(feature = "browser")]
                browser,
            }),
        }
    }

    /// Sets what every command's environment gets besides the session's secrets (the
    /// egress proxy's variables); the first call wins.
    pub fn set_command_env(&self, env: Vec<(String, String)>) {
        let _ = self.shared.command_env.set(Arc::new(env));
    }

    /// Lets the brain's snapshot requests be answered, uploading beside `connect_url` (W10).
    pub fn enable_snapshots(&self, connect_url: String) {
        let _ = self.shared.snapshot_brain.set(connect_url);
    }

    /// Packs and uploads the workspace in the background, as the brain asked at an idle
    /// teardown; the runtime-manager waits for the outcome before it stops this worker.
    fn take_snapshot(&self, request: Option<SnapshotRequest>) {
        let (Some(request), Some(url)) = (request, self.shared.snapshot_brain.get().cloned())
        else {
            tracing::warn!("snapshot request ignored: snapshots not enabled or no cap given");
            return;
        };
        let identity = self.identity();
        let workspace = self.shared.workspace.clone();
        tokio::spawn(async move {
            crate::snapshot::take(&url, &identity, workspace, request.max_bytes).await;
        });
    }

    /// Restores the chat's workspace snapshot into the workspace, as the brain asks of a
    /// pooled worker right after binding it (R3, W10): its session's token proves the
    /// chat. A worker started for its session restored before its first dial instead.
    async fn restore_at_bind(&self) -> Result<CustomResult, ErrorData> {
        let identity = self.identity();
        let Some(url) = self.shared.snapshot_brain.get().cloned() else {
            return Err(ErrorData::invalid_request(
                "snapshots are not enabled",
                None,
            ));
        };
        if identity.pooled {
            return Err(ErrorData::invalid_request("not bound to a session", None));
        }
        match crate::snapshot::restore(&url, &identity, &self.shared.workspace).await {
            Ok(entries) => Ok(CustomResult::new(
                serde_json::to_value(Restored { entries }).unwrap_or_default(),
            )),
            Err(err) => {
                tracing::warn!(session = %identity.session, class = err.class(), "workspace not restored");
                Err(ErrorData::internal_error(
                    format!("workspace not restored: {}", err.class()),
                    None,
                ))
            }
        }
    }

    /// Places the chat's files the brain names under `uploads/` (T25), downloading them
    /// with the session's token; answers what it placed and what failed.
    async fn place_uploads(&self, request: CustomRequest) -> Result<CustomResult, ErrorData> {
        let identity = self.identity();
        let Some(url) = self.shared.snapshot_brain.get().cloned() else {
            return Err(ErrorData::invalid_request(
                "the brain's address is not known",
                None,
            ));
        };
        if identity.pooled {
            return Err(ErrorData::invalid_request("not bound to a session", None));
        }
        let Some(files) = request.params_as::<UploadsRequest>().ok().flatten() else {
            return Err(ErrorData::invalid_params(
                "expected {\"files\": [{\"id\", \"name\", \"size\"}]}",
                None,
            ));
        };
        let placed = uploads::place(&url, &identity, &self.shared.workspace, files).await;
        Ok(CustomResult::new(
            serde_json::to_value(placed).unwrap_or_default(),
        ))
    }

    /// Places the agent's skills the brain names under `skills/` (B8), as
    /// [`Self::place_uploads`] places files.
    async fn place_skills(&self, request: CustomRequest) -> Result<CustomResult, ErrorData> {
        let identity = self.identity();
        let Some(url) = self.shared.snapshot_brain.get().cloned() else {
            return Err(ErrorData::invalid_request(
                "the brain's address is not known",
                None,
            ));
        };
        if identity.pooled {
            return Err(ErrorData::invalid_request("not bound to a session", None));
        }
        let Some(skills) = request.params_as::<SkillsRequest>().ok().flatten() else {
            return Err(ErrorData::invalid_params(
                "expected {\"skills\": [{\"id\", \"name\", \"unpacked_bytes\"}]}",
                None,
            ));
        };
        let placed = skills::place(&url, &identity, &self.shared.workspace, skills).await;
        Ok(CustomResult::new(
            serde_json::to_value(placed).unwrap_or_default(),
        ))
    }

    /// The same session, serving one channel: its calls stop when `calls` is cancelled.
    pub fn on_channel(&self, calls: CancellationToken) -> Self {
        Self {
            channel: calls,
            keyed: kept::Cancels::default(),
            ..self.clone()
        }
    }

    /// A keyed call (D3): run once under its key, apart from this channel, or attached
    /// to when the key is known; an attach for an unknown key is [`kept::UNKNOWN_CALL`].
    async fn keyed(
        &self,
        keyed: kept::Keyed,
        request: CallToolRequestParams,
        mut context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let request_ct = context.ct.clone();
        let id = context.id.clone();
        let (cancel, mut done) = match self.shared.kept.begin(&keyed, &self.shared.session) {
            kept::Begin::Run { cancel, done } => {
                let receiver = done.subscribe();
                // Serves on no channel: the session's token, not this channel's, stops it.
                let worker = Self {
                    channel: self.shared.session.child_token(),
                    ..self.clone()
                };
                context.ct = cancel.clone();
                let key = keyed.key.clone();
                tokio::spawn(
                    async move {
                        let answer = worker
                            .tool_router
                            .call(ToolCallContext::new(&worker, request, context))
                            .await;
                        worker.shared.kept.finish(&key, Arc::new(answer), &done);
                    }
                    .in_current_span(),
                );
                (cancel, receiver)
            }
            kept::Begin::Attach { cancel, done } => (cancel, done),
            kept::Begin::Unknown => {
                return Err(ErrorData::new(
                    ErrorCode(kept::UNKNOWN_CALL),
                    "no call with this key is known to this worker",
                    None,
                ));
            }
            kept::Begin::Full => {
                return self
                    .tool_router
                    .call(ToolCallContext::new(self, request, context))
                    .await;
            }
        };
        self.keyed.register(id.clone(), cancel);
        let answer = tokio::select! {
            waited = done.wait_for(Option::is_some) => waited
                .ok()
                .and_then(|outcome| outcome.clone())
                .map(|outcome| outcome.as_ref().clone())
                .unwrap_or_else(|| Err(ErrorData::internal_error("the call was lost", None))),
            // The request was cancelled or its channel ended: the call goes on, kept. Its
            // registration stays: a cancel's handler runs after this token fires, and
            // stops the call through it.
            () = request_ct.cancelled() => {
                return Err(ErrorData::internal_error("cancelled", None));
            }
        };
        self.keyed.answered(&id);
        answer
    }

    /// Who the worker is now: the session and its newest token (from the environment, a
    /// renewal, or a bind).
    pub fn identity(&self) -> Identity {
        match self.shared.identity.lock() {
            Ok(identity) => identity.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the identity when `update` accepts the current one and yields the next.
    fn update_identity(&self, update: impl FnOnce(&Identity) -> Option<Identity>) -> bool {
        let mut identity = match self.shared.identity.lock() {
            Ok(identity) => identity,
            Err(poisoned) => poisoned.into_inner(),
        };
        match update(&identity) {
            Some(next) => {
                *identity = next;
                true
            }
            None => false,
        }
    }

    fn secrets(&self) -> Arc<shell::Secrets> {
        match self.shared.secrets.read() {
            Ok(secrets) => secrets.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_secrets(&self, env: SessionEnv) {
        let secrets = Arc::new(shell::Secrets::new(env));
        match self.shared.secrets.write() {
            Ok(mut held) => *held = secrets,
            Err(poisoned) => *poisoned.into_inner() = secrets,
        }
    }

    /// `result` with the session's secret values masked in its text.
    fn masked(&self, mut result: CallToolResult) -> CallToolResult {
        let secrets = self.secrets();
        if secrets.masks.is_empty() {
            return result;
        }
        for block in &mut result.content {
            if let ContentBlock::Text(text) = block {
                text.text = secrets.masks.mask(&text.text);
            }
        }
        result
    }

    fn call_id(&self) -> u64 {
        self.shared.calls.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn resolve(&self, path: &str) -> Result<paths::Resolved, CallToolResult> {
        paths::resolve(&self.shared.workspace, path).map_err(|err| error(err.to_string()))
    }

    /// Runs a file tool: confines the path, logs the outcome class, maps the error.
    async fn file_tool<F, Fut>(&self, tool: &'static str, path: &str, run: F) -> CallToolResult
    where
        F: FnOnce(paths::Resolved) -> Fut,
        Fut: Future<Output = Result<CallToolResult, files::FileError>>,
    {
        let call = self.call_id();
        let started = Instant::now();
        let resolved = match self.resolve(path) {
            Ok(resolved) => resolved,
            Err(result) => {
                tracing::info!(call, tool, outcome = "path_refused", "tool call");
                return result;
            }
        };
        let result = run(resolved).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(err) => err.class(),
        };
        tracing::info!(
            call,
            tool,
            outcome,
            ms = started.elapsed().as_millis() as u64,
            "tool call"
        );
        self.masked(result.unwrap_or_else(|err| error(err.to_string())))
    }
}

#[tool_router]
impl Worker {
    #[tool(description = describe(catalog::SHELL))]
    async fn shell(
        &self,
        Parameters(args): Parameters<ShellArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let call = self.call_id();
        let started = Instant::now();
        let cwd = match args.cwd.as_deref() {
            None => self.shared.workspace.clone(),
            Some(cwd) => match self.resolve(cwd) {
                Ok(resolved) if resolved.full.is_dir() => resolved.full,
                Ok(_) => {
                    tracing::info!(call, tool = "shell", outcome = "bad_cwd", "tool call");
                    return error(format!("cwd {cwd} is not a directory in the workspace"));
                }
                Err(result) => {
                    tracing::info!(call, tool = "shell", outcome = "path_refused", "tool call");
                    return result;
                }
            },
        };
        let timeout = shell::timeout_of(args.timeout_s);
        let live = context.meta.get_progress_token().map(|token| shell::Live {
            peer: context.peer.clone(),
            token,
        });
        // Stops when the brain cancels this call (its `ct`) or its channel ends.
        let cancel = self.channel.child_token();
        let _forward = AbortOnDrop(tokio::spawn({
            let (call_ct, cancel) = (context.ct.clone(), cancel.clone());
            async move {
                call_ct.cancelled().await;
                cancel.cancel();
            }
        }));
        let run = shell::ShellCall {
            command: args.command,
            cwd,
            timeout,
            secrets: self.secrets(),
            env: self.shared.command_env.get().cloned().unwrap_or_default(),
        };
        match shell::run(run, &self.shared.groups, &cancel, live).await {
            Ok(outcome) => {
                tracing::info!(
                    call,
                    tool = "shell",
                    outcome = outcome.ending.class(),
                    stdout_bytes = outcome.stdout.total(),
                    stderr_bytes = outcome.stderr.total(),
                    notifications = outcome.notifications,
                    ms = started.elapsed().as_millis() as u64,
                    "tool call"
                );
                text(shell::render(outcome, timeout))
            }
            Err(err) => {
                tracing::info!(call, tool = "shell", outcome = "spawn_failed", "tool call");
                error(format!("the command could not be started: {err}"))
            }
        }
    }

    #[tool(
        description = describe(catalog::READ_FILE),
        annotations(read_only_hint = true)
    )]
    async fn read_file(&self, Parameters(args): Parameters<ReadFileArgs>) -> CallToolResult {
        self.file_tool("read_file", &args.path, |path| async move {
            files::read_file(&path).await.map(text)
        })
        .await
    }

    #[tool(description = describe(catalog::WRITE_FILE))]
    async fn write_file(&self, Parameters(args): Parameters<WriteFileArgs>) -> CallToolResult {
        self.file_tool("write_file", &args.path, |path| async move {
            files::write_file(&path, &args.content).await.map(text)
        })
        .await
    }

    #[tool(
        description = describe(catalog::LIST_DIR),
        annotations(read_only_hint = true)
    )]
    async fn list_dir(&self, Parameters(args): Parameters<ListDirArgs>) -> CallToolResult {
        self.file_tool("list_dir", &args.path, |path| async move {
            files::list_dir(&path).await.map(text)
        })
        .await
    }

    #[tool(description = describe(catalog::EDIT_FILE))]
    async fn edit_file(&self, Parameters(args): Parameters<EditFileArgs>) -> CallToolResult {
        self.file_tool("edit_file", &args.path, |path| async move {
            files::edit_file(&path, &args.old, &args.new)
                .await
                .map(text)
        })
        .await
    }

    #[tool(description = describe(catalog::UPLOAD_ARTIFACT))]
    async fn upload_artifact(
        &self,
        Parameters(args): Parameters<UploadArtifactArgs>,
    ) -> CallToolResult {
        self.file_tool("upload_artifact", &args.path, |path| async move {
            let bytes = files::read_artifact(&path).await?;
            let resource = artifact::resource(&path.relative, &bytes);
            Ok(CallToolResult::success(vec![
                ContentBlock::resource(resource),
                ContentBlock::text(format!(
                    "{} ({} bytes, {})",
                    path.relative,
                    bytes.len(),
                    artifact::guess_mime(&path.relative)
                )),
            ]))
        })
        .await
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRenewal {
    token: String,
}

/// A pooled worker claimed by a session (R3): from now on it is that session.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Bind {
    session: SessionId,
    token: String,
}

/// A token as it came over the channel, if it can travel in a header.
fn usable(token: String) -> Option<Token> {
    (!token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic())).then(|| Token::new(token))
}

// The router of this worker's profile (rmcp's default would rebuild `Self::tool_router()`,
// the workspace tools only, on every request).
#[tool_handler(router = self.tool_router)]
impl ServerHandler for Worker {
    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::builder().enable_tools().build();
        // D3: the brain keys its calls only with a worker that keeps them; T25: it sends
        // the chat's files only to one that places them.
        let experimental = [KEPT_CALLS_CAPABILITY, UPLOADS_CAPABILITY, SKILLS_CAPABILITY]
            .map(|name| (name.to_owned(), serde_json::Map::new()));
        capabilities.experimental = Some(experimental.into_iter().collect());
        ServerConfig::new(capabilities).with_server_info(Implementation::new(
            "agent-runtime-worker",
            env!("CARGO_PKG_VERSION"),
        ))
    }

    /// The router's dispatch, in a `tool_call` span (O2) that continues the brain's
    /// `tool_call` span, whose context the request's `_meta` carries (MCP SEP-414). Its
    /// fields are the tool's name and the outcome class, never arguments or output (X4).
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let span = tracing::info_span!(
            "tool_call",
            tool = %request.name,
            outcome = tracing::field::Empty,
        );
        let parent = TraceContext::received(
            context.meta.get_traceparent(),
            context.meta.get_tracestate(),
        );
        logging::traces::continue_from(&span, parent.as_ref());
        let answer = match kept::Keyed::of(&context.meta) {
            Some(keyed) => {
                self.keyed(keyed, request, context)
                    .instrument(span.clone())
                    .await
            }
            None => {
                self.tool_router
                    .call(ToolCallContext::new(self, request, context))
                    .instrument(span.clone())
                    .await
            }
        };
        span.record(
            "outcome",
            match &answer {
                Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => "error",
                Ok(_) => "ok",
                Err(_) => "refused",
            },
        );
        answer
    }

    /// A cancel of a keyed request stops its call, which runs under its own token (D3).
    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        if let Some(id) = notification.request_id {
            self.keyed.cancel(id);
        }
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleServer>,
    ) {
        match notification.method.as_str() {
            TOKEN_NOTIFICATION => {
                let renewal = notification.params_as::<TokenRenewal>().ok().flatten();
                if self.update_identity(|current| renewed(current, renewal?)) {
                    tracing::info!("session token renewed");
                } else {
                    tracing::warn!("token renewal without a usable token ignored");
                }
            }
            BIND_NOTIFICATION => {
                let bind = notification.params_as::<Bind>().ok().flatten();
                if self.update_identity(|current| bound(current, bind?)) {
                    tracing::info!(session = %self.identity().session, "bound to a session");
                } else {
                    tracing::warn!("bind ignored: not pooled, or no usable session and token");
                }
            }
            SNAPSHOT_NOTIFICATION => {
                self.take_snapshot(notification.params_as::<SnapshotRequest>().ok().flatten());
            }
            _ => tracing::debug!("unknown custom notification ignored"),
        }
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        if request.method == RESTORE_REQUEST {
            return self.restore_at_bind().await;
        }
        if request.method == UPLOADS_REQUEST {
            return self.place_uploads(request).await;
        }
        if request.method == SKILLS_REQUEST {
            return self.place_skills(request).await;
        }
        if request.method != ENV_REQUEST {
            return Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                request.method,
                None,
            ));
        }
        // serde's message may quote what it could not decode: a value. The text is ours.
        let Some(env) = request.params_as::<SessionEnv>().ok().flatten() else {
            tracing::warn!(refusal = "undecodable", "session environment refused");
            return Err(ErrorData::invalid_params(
                "expected {\"vars\": {NAME: value}}",
                None,
            ));
        };
        if let Err(refusal) = env.check() {
            tracing::warn!(refusal = refusal.as_str(), "session environment refused");
            return Err(ErrorData::invalid_params(
                format!("session environment refused: {}", refusal.as_str()),
                None,
            ));
        }
        let vars = env.vars.len();
        self.set_secrets(env);
        tracing::info!(vars, "session environment set");
        Ok(CustomResult::new(serde_json::json!({ "vars": vars })))
    }
}

/// The identity after a renewal: only a token for the session this worker is.
fn renewed(current: &Identity, renewal: TokenRenewal) -> Option<Identity> {
    Identity::new(current.session, usable(renewal.token)?)
}

/// The identity after a bind: only a pooled worker is bound (so only once), to the
/// session its new token names.
fn bound(current: &Identity, bind: Bind) -> Option<Identity> {
    if !current.pooled {
        return None;
    }
    Identity::new(bind.session, usable(bind.token)?)
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A directory under the system temp dir, canonical, removed on drop.
    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new(label: &str) -> Self {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "worker-{label}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap_or_default();
            Self(path.canonicalize().unwrap_or(path))
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The worker never checks a signature: any key mints its tokens.
    fn keys() -> channel::token::TokenKeys {
        channel::token::TokenKeys::new(b"any key of 32 bytes or more, for tests").unwrap()
    }

    fn session_token(session: SessionId) -> Token {
        let ttl = std::time::Duration::from_secs(60);
        let token = keys().mint(
            session,
            protocol::TeamId::new(),
            protocol::AgentId::new(),
            ttl,
        );
        Token::new(token.unwrap())
    }

    fn worker(profile: &str) -> Worker {
        let session = SessionId::new();
        Worker::for_profile(
            profile,
            BrowserSettings::defaults(std::path::Path::new("/")),
            PathBuf::from("/"),
            Identity::new(session, session_token(session)).unwrap(),
            Groups::default(),
            CancellationToken::new(),
        )
    }

    #[test]
    fn a_renewal_is_taken_only_for_the_same_session() {
        let session = SessionId::new();
        let current = Identity::new(session, session_token(session)).unwrap();
        let renewal = |token: Token| TokenRenewal {
            token: token.expose().to_owned(),
        };
        let next = renewed(&current, renewal(session_token(session))).unwrap();
        assert_eq!(next.session, session);
        assert!(renewed(&current, renewal(session_token(SessionId::new()))).is_none());
        let garbage = TokenRenewal {
            token: "not a token".into(),
        };
        assert!(renewed(&current, garbage).is_none());
    }

    #[test]
    fn only_a_pooled_worker_is_bound_and_only_once() {
        let slot = SessionId::new();
        let pool = keys()
            .mint_pool(slot, std::time::Duration::from_secs(60))
            .unwrap();
        let pooled = Identity::new(slot, Token::new(pool)).unwrap();
        assert!(pooled.pooled);
        let session = SessionId::new();
        let bind = |session, token: Token| Bind {
            session,
            token: token.expose().to_owned(),
        };
        let next = bound(&pooled, bind(session, session_token(session))).unwrap();
        assert_eq!(next.session, session);
        assert!(!next.pooled);
        let other = SessionId::new();
        assert!(
            bound(&next, bind(other, session_token(other))).is_none(),
            "bound once"
        );
        assert!(bound(&pooled, bind(other, session_token(session))).is_none());
    }

    #[test]
    fn the_worker_serves_exactly_the_catalog() {
        for profile in ["light", "heavy", "warm"] {
            assert_serves_catalog(&worker(profile), profile);
        }
        if cfg!(feature = "browser") {
            assert_serves_catalog(&worker("browser"), "browser");
        }
    }

    fn assert_serves_catalog(worker: &Worker, profile: &str) {
        let mut served: Vec<_> = worker
            .tool_router
            .list_all()
            .into_iter()
            .map(|tool| {
                (
                    tool.name.to_string(),
                    tool.description.map(|d| d.to_string()),
                )
            })
            .collect();
        served.sort();
        let mut offered: Vec<_> = catalog::catalog_for(profile)
            .into_iter()
            .map(|tool| (tool.name.to_owned(), Some(tool.description.to_owned())))
            .collect();
        offered.sort();
        assert_eq!(served, offered, "{profile}");
        // The served schemas take the catalog's fields.
        for tool in worker.tool_router.list_all() {
            let decl = catalog::catalog_for(profile)
                .into_iter()
                .find(|decl| decl.name == tool.name)
                .unwrap();
            let served = serde_json::Value::Object((*tool.input_schema).clone());
            // An argument-less tool: the catalog spells out `"properties": {}`.
            let properties = match &served["properties"] {
                serde_json::Value::Null => serde_json::json!({}),
                properties => properties.clone(),
            };
            assert_eq!(properties, decl.input_schema["properties"], "{}", tool.name);
            assert_eq!(served["required"], decl.input_schema["required"]);
        }
    }
}
