//! The workers whose channel this replica holds.
//!
//! A replica holds a worker's socket and nothing else about it: the session's state lives
//! in Postgres. Entries leave the registry when the channel ends, whichever way it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use channel::ws::Control;
use protocol::SessionId;
use protocol::ui::{UiChunk, WorkerLog};
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

/// A worker whose channel this replica holds.
pub struct LiveWorker {
    pub session: SessionId,
    pub service: RunningService<RoleClient, WorkerClient>,
    pub control: Control,
}

impl LiveWorker {
    pub fn client(&self) -> &WorkerClient {
        self.service.service()
    }
}

/// Session id → live worker.
#[derive(Clone, Default)]
pub struct Registry {
    workers: Arc<Mutex<HashMap<SessionId, Arc<LiveWorker>>>>,
}

impl Registry {
    pub fn get(&self, session: SessionId) -> Option<Arc<LiveWorker>> {
        self.workers.lock().ok()?.get(&session).cloned()
    }

    pub fn insert(&self, worker: Arc<LiveWorker>) {
        if let Ok(mut workers) = self.workers.lock() {
            workers.insert(worker.session, worker);
        }
    }

    pub fn remove(&self, session: SessionId) -> Option<Arc<LiveWorker>> {
        self.workers.lock().ok()?.remove(&session)
    }
}
