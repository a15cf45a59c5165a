//! The workers whose channel this replica holds.
//!
//! A replica holds a worker's socket and nothing else about it: the session's state lives
//! in Postgres. Entries leave the registry when the channel ends, whichever way it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use channel::ws::Control;
use protocol::ui::{UiChunk, WorkerLog};
use protocol::{AgentId, ChatId, SessionId, TeamId};
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient};
use tokio::sync::mpsc;

/// Where a running call's live output goes.
struct Route {
    call_id: String,
    ui: mpsc::Sender<UiChunk>,
}

/// The brain's side of the MCP session: relays a call's progress notifications (the
/// worker's stdout/stderr lines) to the turn that made the call.
#[derive(Clone, Default)]
pub struct WorkerClient {
    routes: Arc<Mutex<HashMap<ProgressToken, Route>>>,
}

impl WorkerClient {
    pub fn route(&self, token: ProgressToken, call_id: String, ui: mpsc::Sender<UiChunk>) {
        if let Ok(mut routes) = self.routes.lock() {
            routes.insert(token, Route { call_id, ui });
        }
    }

    pub fn unroute(&self, token: &ProgressToken) {
        if let Ok(mut routes) = self.routes.lock() {
            routes.remove(token);
        }
    }
}

/// One line of live output as the worker encodes it in a progress message.
#[derive(serde::Deserialize)]
struct LogLine {
    stream: String,
    text: String,
}

impl ClientHandler for WorkerClient {
    fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        let target = self.routes.lock().ok().and_then(|routes| {
            routes
                .get(&params.progress_token)
                .map(|r| (r.call_id.clone(), r.ui.clone()))
        });
        async move {
            let Some((tool_call_id, ui)) = target else {
                return;
            };
            let Some(line) = params
                .message
                .as_deref()
                .and_then(|m| serde_json::from_str::<LogLine>(m).ok())
            else {
                return;
            };
            // A slow client must not stall the channel: drop live lines it cannot take
            // (the final tool output carries the whole text).
            let _ = ui.try_send(UiChunk::DataWorkerLog {
                data: WorkerLog {
                    tool_call_id,
                    stream: line.stream,
                    text: line.text,
                },
                transient: true,
            });
        }
    }
}

/// The session a worker serves, and whose session it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    pub session: SessionId,
    pub team: TeamId,
    pub agent: AgentId,
}

/// A worker whose channel this replica holds.
pub struct LiveWorker {
    /// Set when the channel is for a session; for a pooled worker, when a session
    /// claims it (R3). Never changes once set.
    binding: OnceLock<Binding>,
    /// The warm-pool slot it was started for, if any.
    pub slot: Option<SessionId>,
    pub service: RunningService<RoleClient, WorkerClient>,
    pub control: Control,
}

impl LiveWorker {
    pub fn new(
        binding: Option<Binding>,
        slot: Option<SessionId>,
        service: RunningService<RoleClient, WorkerClient>,
        control: Control,
    ) -> Self {
        let cell = OnceLock::new();
        if let Some(binding) = binding {
            let _ = cell.set(binding);
        }
        Self {
            binding: cell,
            slot,
            service,
            control,
        }
    }

    pub fn client(&self) -> &WorkerClient {
        self.service.service()
    }

    pub fn binding(&self) -> Option<Binding> {
        self.binding.get().copied()
    }

    /// Binds a pooled worker to a session; `false` if it already serves one.
    pub fn bind(&self, binding: Binding) -> bool {
        self.binding.set(binding).is_ok()
    }
}

/// Session id → live worker, and (agent, chat) → the session a call last found there.
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<Mutex<Entries>>,
}

#[derive(Default)]
struct Entries {
    workers: HashMap<SessionId, Arc<LiveWorker>>,
    /// Lets a reused session's call skip the database: an entry lives exactly as long as
    /// its worker's entry, so a hit always names a channel that is still up.
    chats: HashMap<(AgentId, ChatId), SessionId>,
}

impl Registry {
    pub fn get(&self, session: SessionId) -> Option<Arc<LiveWorker>> {
        self.inner.lock().ok()?.workers.get(&session).cloned()
    }

    pub fn insert(&self, session: SessionId, worker: Arc<LiveWorker>) {
        if let Ok(mut entries) = self.inner.lock() {
            entries.workers.insert(session, worker);
        }
    }

    pub fn remove(&self, session: SessionId) -> Option<Arc<LiveWorker>> {
        let mut entries = self.inner.lock().ok()?;
        entries.chats.retain(|_, s| *s != session);
        entries.workers.remove(&session)
    }

    /// Remembers that (agent, chat)'s live session is `session`, if its worker is here.
    pub fn remember_chat(&self, agent: AgentId, chat: ChatId, session: SessionId) {
        if let Ok(mut entries) = self.inner.lock()
            && entries.workers.contains_key(&session)
        {
            entries.chats.insert((agent, chat), session);
        }
    }

    /// The live session of (agent, chat) and its worker, when this replica holds it.
    pub fn for_chat(&self, agent: AgentId, chat: ChatId) -> Option<(SessionId, Arc<LiveWorker>)> {
        let entries = self.inner.lock().ok()?;
        let session = *entries.chats.get(&(agent, chat))?;
        Some((session, entries.workers.get(&session)?.clone()))
    }
}

/// Pooled workers of this replica, ready and unclaimed, by profile (R3).
#[derive(Clone, Default)]
pub struct Pool {
    idle: Arc<Mutex<HashMap<String, Vec<Arc<LiveWorker>>>>>,
}

impl Pool {
    pub fn put(&self, profile: &str, worker: Arc<LiveWorker>) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.entry(profile.to_owned()).or_default().push(worker);
        }
    }

    /// The oldest idle worker of `profile`.
    pub fn take(&self, profile: &str) -> Option<Arc<LiveWorker>> {
        let mut idle = self.idle.lock().ok()?;
        let workers = idle.get_mut(profile)?;
        (!workers.is_empty()).then(|| workers.remove(0))
    }

    /// Forgets the worker of `slot` (its channel ended).
    pub fn remove(&self, slot: SessionId) {
        if let Ok(mut idle) = self.idle.lock() {
            for workers in idle.values_mut() {
                workers.retain(|w| w.slot != Some(slot));
            }
        }
    }
}
