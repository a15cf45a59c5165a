//! The workers whose channel this replica holds.
//!
//! A replica holds a worker's socket and nothing else about it: the session's state lives
//! in Postgres. Entries leave the registry when the channel ends, whichever way it ends;
//! until then a lookup skips an entry whose channel has ended, so a hit names a channel
//! that is up.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use channel::mask::Masks;
use channel::ws::Control;
use protocol::channel::CLOSE_GOING_AWAY;
use protocol::ui::{UiChunk, WorkerLog};
use protocol::{AgentId, ChatId, SessionId, TeamId};
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Where a running call's live output goes.
struct Route {
    call_id: String,
    ui: mpsc::Sender<UiChunk>,
}

/// The brain's side of the MCP session: relays a call's progress notifications (the
/// worker's stdout/stderr lines) to the turn that made the call, with the session's
/// secret values masked (W12).
#[derive(Clone, Default)]
pub struct WorkerClient {
    routes: Arc<Mutex<HashMap<ProgressToken, Route>>>,
    masks: Arc<RwLock<Arc<Masks>>>,
}

impl WorkerClient {
    /// The values masked in what this worker sends from now on (its session's secrets).
    pub fn set_masks(&self, masks: Arc<Masks>) {
        match self.masks.write() {
            Ok(mut held) => *held = masks,
            Err(poisoned) => *poisoned.into_inner() = masks,
        }
    }

    pub fn masks(&self) -> Arc<Masks> {
        match self.masks.read() {
            Ok(masks) => masks.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Routes the progress of `token` to `ui` until the answer is dropped. A guard, so a
    /// call future dropped mid-call (its turn cancelled) does not leave a clone of the
    /// turn's sender behind: that would hold the client's stream open, after `finish`,
    /// until the channel ends.
    pub fn route(
        &self,
        token: ProgressToken,
        call_id: String,
        ui: mpsc::Sender<UiChunk>,
    ) -> Routed {
        if let Ok(mut routes) = self.routes.lock() {
            routes.insert(token.clone(), Route { call_id, ui });
        }
        Routed {
            client: self.clone(),
            token,
        }
    }
}

/// A call's progress route; dropping it removes the route.
pub struct Routed {
    client: WorkerClient,
    token: ProgressToken,
}

impl Drop for Routed {
    fn drop(&mut self) {
        if let Ok(mut routes) = self.client.routes.lock() {
            routes.remove(&self.token);
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
        let masks = self.masks();
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
                    text: masks.mask(&line.text),
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
    /// Cancelled once the channel has ended and this replica has let go of the session
    /// (owner key released, registry entry gone), so a re-dial can be taken anywhere.
    pub released: CancellationToken,
    /// When the worker's newest token expires (unix seconds): renewed in time, it lets
    /// the worker dial again whenever its channel drops (W9).
    token_expires: AtomicU64,
    /// This replica closed the channel with "going away": the worker's echo of that close
    /// is not the worker leaving.
    sent_going_away: AtomicBool,
    /// The chat's files and the skill versions (B8) this worker confirmed in its
    /// workspace (T25): a call whose files are all here costs no delivery round trip. Per channel, so a re-dial or a new worker
    /// asks again (the worker keeps what it holds).
    pub placed: Mutex<HashSet<Uuid>>,
}

impl LiveWorker {
    pub fn new(
        binding: Option<Binding>,
        slot: Option<SessionId>,
        service: RunningService<RoleClient, WorkerClient>,
        control: Control,
        token_expires: u64,
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
            released: CancellationToken::new(),
            token_expires: AtomicU64::new(token_expires),
            sent_going_away: AtomicBool::new(false),
            placed: Mutex::default(),
        }
    }

    /// Closes the channel with "going away" (1001): the worker dials again elsewhere.
    pub async fn close_going_away(&self) {
        self.sent_going_away.store(true, Ordering::Relaxed);
        self.control.close(CLOSE_GOING_AWAY, "going_away").await;
    }

    pub fn sent_going_away(&self) -> bool {
        self.sent_going_away.load(Ordering::Relaxed)
    }

    pub fn token_expires(&self) -> u64 {
        self.token_expires.load(Ordering::Relaxed)
    }

    /// The worker was sent a token expiring at `unix_secs`.
    pub fn token_sent(&self, unix_secs: u64) {
        self.token_expires.store(unix_secs, Ordering::Relaxed);
    }

    /// Whether its channel is still up.
    pub fn is_up(&self) -> bool {
        self.control.end().is_none()
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
    /// The worker of `session`, if its channel is up.
    pub fn get(&self, session: SessionId) -> Option<Arc<LiveWorker>> {
        let worker = self.inner.lock().ok()?.workers.get(&session).cloned()?;
        worker.is_up().then_some(worker)
    }

    /// The entry for `session`, its channel up or ending: a re-dial waits until an ending
    /// one has been let go of.
    pub fn entry(&self, session: SessionId) -> Option<Arc<LiveWorker>> {
        self.inner.lock().ok()?.workers.get(&session).cloned()
    }

    pub fn insert(&self, session: SessionId, worker: Arc<LiveWorker>) {
        if let Ok(mut entries) = self.inner.lock() {
            entries.workers.insert(session, worker);
        }
    }

    /// Forgets `session`'s entry if it is still `worker`'s (a re-dial may have replaced it).
    pub fn remove(&self, session: SessionId, worker: &Arc<LiveWorker>) {
        if let Ok(mut entries) = self.inner.lock()
            && entries
                .workers
                .get(&session)
                .is_some_and(|w| Arc::ptr_eq(w, worker))
        {
            entries.chats.retain(|_, s| *s != session);
            entries.workers.remove(&session);
        }
    }

    /// Every worker this replica holds a session's channel for.
    pub fn all(&self) -> Vec<Arc<LiveWorker>> {
        self.inner
            .lock()
            .map(|entries| entries.workers.values().cloned().collect())
            .unwrap_or_default()
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
        let worker = entries.workers.get(&session)?.clone();
        worker.is_up().then_some((session, worker))
    }
}

/// Pooled workers of this replica, ready and unclaimed, by profile (R3). A worker taken
/// for a local claim that found its slot claimed already (by another replica, whose bind
/// is on its way here through the relay) is parked: out of the idle lists, still found
/// by its slot.
#[derive(Clone, Default)]
pub struct Pool {
    inner: Arc<Mutex<PoolEntries>>,
}

#[derive(Default)]
struct PoolEntries {
    idle: HashMap<String, Vec<Arc<LiveWorker>>>,
    parked: HashMap<SessionId, Arc<LiveWorker>>,
}

impl Pool {
    pub fn put(&self, profile: &str, worker: Arc<LiveWorker>) {
        if let Ok(mut pool) = self.inner.lock() {
            pool.idle
                .entry(profile.to_owned())
                .or_default()
                .push(worker);
        }
    }

    /// The oldest idle worker of `profile`.
    pub fn take(&self, profile: &str) -> Option<Arc<LiveWorker>> {
        let mut pool = self.inner.lock().ok()?;
        let workers = pool.idle.get_mut(profile)?;
        (!workers.is_empty()).then(|| workers.remove(0))
    }

    /// Keeps a taken worker findable by its slot only.
    pub fn park(&self, worker: Arc<LiveWorker>) {
        if let (Some(slot), Ok(mut pool)) = (worker.slot, self.inner.lock()) {
            pool.parked.insert(slot, worker);
        }
    }

    /// The worker of `slot`, idle or parked, taken out of the pool.
    pub fn take_slot(&self, slot: SessionId) -> Option<Arc<LiveWorker>> {
        let mut pool = self.inner.lock().ok()?;
        if let Some(worker) = pool.parked.remove(&slot) {
            return Some(worker);
        }
        pool.idle.values_mut().find_map(|workers| {
            let at = workers.iter().position(|w| w.slot == Some(slot))?;
            Some(workers.remove(at))
        })
    }

    /// Every pooled worker here, idle or parked.
    pub fn all(&self) -> Vec<Arc<LiveWorker>> {
        self.inner
            .lock()
            .map(|pool| {
                pool.idle
                    .values()
                    .flatten()
                    .chain(pool.parked.values())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Forgets the worker of `slot` (its channel ended).
    pub fn remove(&self, slot: SessionId) {
        if let Ok(mut pool) = self.inner.lock() {
            pool.parked.remove(&slot);
            for workers in pool.idle.values_mut() {
                workers.retain(|w| w.slot != Some(slot));
            }
        }
    }
}
