//! Any replica drives any session (SPEC W4): calls for a worker whose channel another
//! replica holds travel through Redis pub/sub.
//!
//! - The replica holding a channel keeps `worker-owner:{session}` = its replica id, with
//!   a short expiry refreshed by the heartbeat (only while the key is absent or its own),
//!   and deletes it (only if still its own) when the channel ends. A `ready` session with
//!   no owner key, or one naming a replica that no longer listens on its relay channel
//!   (it died), has lost its channel: its worker is expected to dial again (W9), and a
//!   re-dial takes the key over with a compare-and-set. A lookup that fails is an error,
//!   never "no owner": unknown is not absent.
//! - A call is published on `relay:{owner}` as a [`RelayCall`]; the owner runs it and
//!   publishes [`RelayEvent`]s (live output lines, then what the model reads) on
//!   `relay:call:{key}`. A file the worker answers with is stored by the owner, which has
//!   the same artifact store: only its id travels, never its bytes (up to 25 MiB,
//!   base64-encoded, over the 32 MiB a pub/sub subscriber may lag behind by default).
//!   The caller subscribes before publishing, so nothing is missed. A cancel sets
//!   `relay:cancelled:{key}` and is published on `relay:cancel:{key}`; the owner then
//!   cancels the call, which reaches the worker. The owner subscribes to the cancel
//!   channel before it reads that key, and both before it starts the call: a cancel that
//!   came before the subscription is found in the key, a later one arrives on the channel,
//!   and one whose publish was lost is found in the key, which the owner reads each beat.
//! - The owner publishes a beat on `relay:call:{key}` as soon as it takes the call and
//!   every [`BEAT_EVERY`] while it runs: a caller that hears nothing for [`SILENCE`] (the
//!   owner died, or its publishes fail) stops waiting for an answer that cannot come; the
//!   call is then lost like one whose channel dropped, and attached to on the worker once
//!   it has dialed again (D3). An owner whose own channel to the worker drops under the
//!   call says so ([`RelayEvent::Lost`]).
//! - A replica that claimed a pooled worker another replica holds (R3) publishes a
//!   [`RemoteBind`] on `relay:{holder}:bind`; the holder binds the worker and answers on
//!   `relay:call:{key}` like a call (beats, then an answer), and the session's calls are
//!   relayed to it from then on.
//! - Every Redis call is bounded by [`REDIS_BOUND`], connecting included.
//!
//! Architecture invariant: only this module knows these Redis key and channel names.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use logging::traces::TraceContext;
use protocol::ui::{UiChunk, WorkerLog};
use protocol::uploads::Upload;
use protocol::{AgentId, ChatId, SessionId, TeamId, TurnId};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::call::{Failure, Files, UNREACHABLE, WorkerCall, call_worker};
use super::uploads::{self, TurnFiles};
use super::{SessionError, Sessions};
use crate::artifacts::{ArtifactOwner, ArtifactStore};
use crate::files::workspace::Manifest;
use crate::redis::bounded;
use crate::tools::{ToolCtx, ToolOutput};

/// Bound on each Redis call of the relay, connecting included (as the hold's): a slow or
/// blackholed Redis fails a relayed call fast rather than hanging it.
const REDIS_BOUND: Duration = Duration::from_millis(250);
/// How often the owner tells the caller that a relayed call still runs.
const BEAT_EVERY: Duration = Duration::from_secs(1);
/// Silence after which a caller gives its relayed call up: several beats missed.
const SILENCE: Duration = Duration::from_secs(5);
/// How long a cancel waits for an owner that has not yet taken the call: far longer
/// than a caller waits for it to.
const CANCEL_TTL: Duration = Duration::from_secs(60);

fn owner_key(session: SessionId) -> String {
    format!("worker-owner:{session}")
}

fn calls_channel(replica: &str) -> String {
    format!("relay:{replica}")
}

fn binds_channel(replica: &str) -> String {
    format!("relay:{replica}:bind")
}

fn events_channel(key: &str) -> String {
    format!("relay:call:{key}")
}

fn cancel_channel(key: &str) -> String {
    format!("relay:cancel:{key}")
}

fn cancelled_key(key: &str) -> String {
    format!("relay:cancelled:{key}")
}

/// A call forwarded to the replica that holds the worker's channel.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RelayCall {
    key: String,
    session: SessionId,
    tool: String,
    arguments: serde_json::Map<String, Value>,
    call_id: String,
    /// Where an artifact the call produces is filed (with the worker's team and agent).
    chat: ChatId,
    turn: TurnId,
    /// The caller's `tool_call` span (O2), so the worker's spans join its trace. Absent
    /// when the caller exports no traces; a replica of a release before it refuses a call
    /// that carries one (closed type), so mixed releases relay untraced or not at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tracestate: Option<String>,
    /// Asks only for the outcome of the call made earlier under the same turn and call id
    /// (D3). Sent only when set, so a release before it still takes every other call.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    attach: bool,
    /// The chat's files the owner delivers before the call (T25). Sent only when the chat
    /// has any, so a release before it still takes every call of a chat without files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    uploads: Vec<Upload>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    uploads_left_out: bool,
    /// The agent's skills the owner delivers before the call (B8), sent only when it has
    /// any, as the files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    skills: Vec<protocol::skills::SkillVersion>,
}

/// A claim of a pooled worker another replica holds (R3): the claimer has written the
/// session row (`ready`, owned by the holder) and asks the holder to bind the worker. The
/// holder answers on `relay:call:{key}` like a call: beats while it binds, then an
/// [`RelayEvent::Answer`] whose `is_error` says whether it did.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RemoteBind {
    pub slot: SessionId,
    pub session: SessionId,
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    /// The chat has a workspace snapshot for the worker to restore (W10).
    pub restore: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BindRequest {
    key: String,
    bind: RemoteBind,
}

/// What the owner sends back, in order: any number of logs, then one answer; beats
/// anywhere in between.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum RelayEvent {
    /// The owner runs the call: at once, then every [`BEAT_EVERY`].
    Beat,
    Log {
        stream: String,
        text: String,
    },
    /// What the model reads, as the owner rendered it.
    Answer {
        content: String,
        is_error: bool,
    },
    /// The owner's channel to the worker dropped under the call (`unknown`: the worker
    /// does not know the call an attach asked for), D3.
    Lost {
        unknown: bool,
    },
}

/// Deletes the owner key only while it still names this replica.
const RELEASE_OWNER: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// A pub/sub connection subscribed to `channel`.
async fn subscribe(client: &crate::redis::Client, channel: String) -> Option<redis::aio::PubSub> {
    let mut pubsub = bounded(REDIS_BOUND, client.pubsub()).await.ok()?;
    bounded(REDIS_BOUND, pubsub.subscribe(channel)).await.ok()?;
    Some(pubsub)
}

/// Sets the owner key to ARGV[2] for ARGV[3] ms while it is absent, names ARGV[2]
/// already, or names ARGV[1] (a dead owner being taken over; empty for none).
const TAKE_OWNER: &str = r"
local current = redis.call('GET', KEYS[1])
if current == false or current == ARGV[2] or (ARGV[1] ~= '' and current == ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
";

impl Sessions {
    async fn redis(&self) -> Option<crate::redis::Conn> {
        let conn = bounded(REDIS_BOUND, self.redis_client.connection())
            .await
            .ok();
        if conn.is_none() {
            tracing::warn!("relay: Redis unreachable");
        }
        conn
    }

    /// Marks this replica as the holder of `session`'s channel for `ttl`.
    pub(super) async fn claim_owner(&self, session: SessionId, ttl: Duration) {
        if let Some(mut conn) = self.redis().await {
            let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
            let set: Option<()> = bounded(
                REDIS_BOUND,
                conn.pset_ex(owner_key(session), &self.replica, ms),
            )
            .await
            .ok();
            if set.is_none() {
                tracing::warn!(session = %session, "relay: owner key not written");
            }
        }
    }

    pub(super) async fn release_owner(&self, session: SessionId) {
        if let Some(mut conn) = self.redis().await {
            let _: Option<i64> = bounded(
                REDIS_BOUND,
                redis::Script::new(RELEASE_OWNER)
                    .key(owner_key(session))
                    .arg(&self.replica)
                    .invoke_async(&mut conn),
            )
            .await
            .ok();
        }
    }

    /// The replica holding `session`'s channel, if any. `OwnerUnknown` when Redis does not
    /// answer in time: that says nothing about the owner.
    pub(super) async fn owner(&self, session: SessionId) -> Result<Option<String>, SessionError> {
        let mut conn = self.redis().await.ok_or(SessionError::OwnerUnknown)?;
        let got = bounded(REDIS_BOUND, conn.get(owner_key(session))).await;
        match got {
            Ok(owner) => Ok(owner),
            _ => {
                tracing::warn!(session = %session, "relay: owner lookup failed");
                Err(SessionError::OwnerUnknown)
            }
        }
    }

    /// Makes this replica `session`'s owner for `ttl` if the key is absent, already ours,
    /// or names `dead` (a replica found gone). `false` when another replica holds it.
    pub(super) async fn take_owner(
        &self,
        session: SessionId,
        dead: Option<&str>,
        ttl: Duration,
    ) -> Result<bool, SessionError> {
        let mut conn = self.redis().await.ok_or(SessionError::OwnerUnknown)?;
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let script = redis::Script::new(TAKE_OWNER);
        let mut call = script.key(owner_key(session));
        call.arg(dead.unwrap_or_default())
            .arg(&self.replica)
            .arg(ms);
        match bounded(REDIS_BOUND, call.invoke_async::<i64>(&mut conn)).await {
            Ok(taken) => Ok(taken == 1),
            _ => {
                tracing::warn!(session = %session, "relay: owner key not written");
                Err(SessionError::OwnerUnknown)
            }
        }
    }

    /// Whether replica `replica` is alive as far as the relay can tell: it listens on its
    /// relay channel. A killed replica's subscription ends with its Redis connection.
    pub(super) async fn replica_listening(&self, replica: &str) -> Result<bool, SessionError> {
        let mut conn = self.redis().await.ok_or(SessionError::OwnerUnknown)?;
        let mut numsub = redis::cmd("PUBSUB");
        numsub.arg("NUMSUB").arg(calls_channel(replica));
        // On a Redis Cluster the client asks every node and sums (subscribers may be on
        // any); the answer is then a map rather than pairs: both read as one.
        let counted = bounded(
            REDIS_BOUND,
            numsub.query_async::<std::collections::HashMap<String, i64>>(&mut conn),
        )
        .await;
        match counted {
            Ok(counts) => Ok(counts.values().any(|n| *n > 0)),
            _ => Err(SessionError::OwnerUnknown),
        }
    }

    /// Serves calls other replicas forward to this one, until `shutdown`. Files the
    /// workers answer with go to `artifacts`.
    pub async fn serve_relay(
        self,
        artifacts: Arc<dyn ArtifactStore>,
        max_artifact_bytes: usize,
        shutdown: CancellationToken,
    ) {
        let files = Files::new(self.store.clone(), artifacts, max_artifact_bytes);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.relay_once(&files, &shutdown) => {}
            }
            tracing::warn!("relay subscription lost; retrying");
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Serves calls and binds until the subscription is lost (or cannot be made).
    async fn relay_once(&self, files: &Files, shutdown: &CancellationToken) {
        let binds = binds_channel(&self.replica);
        let Some(mut pubsub) = subscribe(&self.redis_client, calls_channel(&self.replica)).await
        else {
            return;
        };
        if bounded(REDIS_BOUND, pubsub.subscribe(&binds))
            .await
            .ok()
            .is_none()
        {
            return;
        }
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            let Ok(payload) = message.get_payload::<String>() else {
                continue;
            };
            if message.get_channel_name() == binds {
                match serde_json::from_str::<BindRequest>(&payload) {
                    Ok(request) => {
                        tokio::spawn(self.clone().run_bind(request));
                    }
                    Err(_) => tracing::warn!("relay: undecodable bind dropped"),
                }
                continue;
            }
            let Ok(call) = serde_json::from_str::<RelayCall>(&payload) else {
                tracing::warn!("relay: undecodable call dropped");
                continue;
            };
            tokio::spawn(
                self.clone()
                    .run_relayed(files.clone(), call, shutdown.child_token()),
            );
        }
    }

    /// Runs a forwarded call on a local worker and publishes its events. Without Redis
    /// nothing can be told to the caller, which gives the call up after [`SILENCE`].
    async fn run_relayed(self, files: Files, call: RelayCall, cancel: CancellationToken) {
        let Some(mut conn) = self.redis().await else {
            return;
        };
        let events = events_channel(&call.key);
        // Cancels from the caller: subscribed first, then the key read, so a cancel sent
        // before the subscription was live is not lost. Not knowing whether one was sent
        // is not "none was": the call is refused, never run uncancellable.
        let cancels = match subscribe(&self.redis_client, cancel_channel(&call.key)).await {
            Some(cancels) => bounded(
                REDIS_BOUND,
                conn.get::<_, Option<String>>(cancelled_key(&call.key)),
            )
            .await
            .ok()
            .map(|sent| (cancels, sent.is_some())),
            None => None,
        };
        let Some((cancels, cancelled_before)) = cancels else {
            let refused =
                ToolOutput::error("the replica holding the worker could not take the call");
            publish(&mut conn, &events, &answer(refused)).await;
            return;
        };
        if cancelled_before {
            cancel.cancel();
        }
        let watch = tokio::spawn(watch_cancel(
            cancels,
            conn.clone(),
            cancelled_key(&call.key),
            cancel.clone(),
        ));
        let beats = tokio::spawn(beat(conn.clone(), events.clone()));
        let output = if cancel.is_cancelled() {
            Ok(ToolOutput::error("cancelled"))
        } else {
            self.run_on_worker(&files, call, &conn, &events, &cancel)
                .await
        };
        beats.abort();
        watch.abort();
        let event = match output {
            Ok(output) => answer(output),
            Err(Failure::Dropped) => RelayEvent::Lost { unknown: false },
            Err(Failure::Unknown) => RelayEvent::Lost { unknown: true },
            // A local call is never `Unsent`.
            Err(failure @ (Failure::Other(_) | Failure::Unsent)) => {
                answer(ToolOutput::error(failure.into_message()))
            }
        };
        publish(&mut conn, &events, &event).await;
    }

    /// Binds a pooled worker this replica holds to a session another replica claimed its
    /// slot for, and answers whether it did; beats while it binds (a restore can take
    /// seconds).
    async fn run_bind(self, request: BindRequest) {
        let Some(mut conn) = self.redis().await else {
            return;
        };
        let events = events_channel(&request.key);
        let beats = tokio::spawn(beat(conn.clone(), events.clone()));
        let bind = request.bind;
        let bound = match self.pool.take_slot(bind.slot) {
            Some(worker) => {
                let binding = super::registry::Binding {
                    session: bind.session,
                    team: bind.team,
                    agent: bind.agent,
                };
                // The claimer fails the session when told it was not bound.
                if self.bind_claimed(&worker, binding, bind.restore).await {
                    self.registry
                        .remember_chat(bind.agent, bind.chat, bind.session);
                    ToolOutput::ok("bound")
                } else {
                    ToolOutput::error("the bind was not delivered to the worker")
                }
            }
            None => ToolOutput::error("the pooled worker is no longer connected here"),
        };
        beats.abort();
        if !bound.is_error {
            tracing::info!(session = %bind.session, slot = %bind.slot, "warm worker bound for another replica");
        }
        publish(&mut conn, &events, &answer(bound)).await;
    }

    /// Runs a forwarded call on the worker this replica holds, its live output published
    /// on `events`; a file it answers with is stored here.
    async fn run_on_worker(
        &self,
        files: &Files,
        call: RelayCall,
        conn: &crate::redis::Conn,
        events: &str,
        cancel: &CancellationToken,
    ) -> Result<ToolOutput, Failure> {
        let Some((worker, binding)) = self
            .registry
            .get(call.session)
            .and_then(|worker| worker.binding().map(|binding| (worker, binding)))
        else {
            // Nothing was sent: a call never started; an attach looks again where the
            // worker dialed (a re-dial elsewhere).
            return Err(if call.attach {
                Failure::Dropped
            } else {
                Failure::Other("the worker is no longer connected".into())
            });
        };
        let (ui, mut lines) = mpsc::channel::<UiChunk>(64);
        let forward = {
            let mut conn = conn.clone();
            let events = events.to_owned();
            tokio::spawn(async move {
                while let Some(chunk) = lines.recv().await {
                    if let UiChunk::DataWorkerLog { data, .. } = chunk {
                        publish(
                            &mut conn,
                            &events,
                            &RelayEvent::Log {
                                stream: data.stream,
                                text: data.text,
                            },
                        )
                        .await;
                    }
                }
            })
        };
        let trace = TraceContext::received(call.traceparent.as_deref(), call.tracestate.as_deref());
        let manifest = Manifest {
            files: call.uploads,
            left_out: call.uploads_left_out,
            skills: call.skills,
        };
        let note = if call.attach || manifest.is_empty() {
            None
        } else {
            uploads::deliver(&worker, &Ok(Arc::new(manifest))).await
        };
        let answer = call_worker(
            &worker,
            WorkerCall {
                tool: &call.tool,
                arguments: call.arguments,
                call_id: &call.call_id,
                turn: call.turn,
                attach: call.attach,
            },
            Some(&ui),
            cancel,
            trace.as_ref(),
        )
        .await;
        drop(ui);
        let _ = forward.await;
        // The team and agent are the worker's own, as its token proved them.
        let owner = ArtifactOwner {
            team: binding.team,
            agent: binding.agent,
            chat: Some(call.chat),
            turn: Some(call.turn),
        };
        let output = files.output(&call.tool, owner, answer?).await;
        Ok(uploads::noted(output, note))
    }
}

fn answer(output: ToolOutput) -> RelayEvent {
    RelayEvent::Answer {
        content: output.content,
        is_error: output.is_error,
    }
}

/// Cancels `cancel` when the caller cancels: a message on the call's cancel channel, or
/// its key read each beat, so a cancel whose publish was lost (a blip, a bound that ran
/// out) still arrives within [`BEAT_EVERY`]. A subscription that ends leaves the key.
async fn watch_cancel(
    cancels: redis::aio::PubSub,
    mut conn: crate::redis::Conn,
    key: String,
    cancel: CancellationToken,
) {
    let mut messages = cancels.into_on_message();
    let mut subscribed = true;
    let mut every = tokio::time::interval(BEAT_EVERY);
    // The first tick is at once: the key was read just before the call started.
    every.tick().await;
    loop {
        // The caller's cancel on the channel, against the beat that reads its key.
        tokio::select! {
            message = messages.next(), if subscribed => {
                if message.is_some() {
                    cancel.cancel();
                    return;
                }
                subscribed = false;
            }
            _ = every.tick() => {
                let sent = bounded(REDIS_BOUND, conn.get::<_, Option<String>>(&key)).await;
                if matches!(sent, Ok(Some(_))) {
                    cancel.cancel();
                    return;
                }
            }
        }
    }
}

/// Publishes a beat on `events` at once, then every [`BEAT_EVERY`], until aborted.
async fn beat(mut conn: crate::redis::Conn, events: String) {
    let mut every = tokio::time::interval(BEAT_EVERY);
    loop {
        every.tick().await;
        publish(&mut conn, &events, &RelayEvent::Beat).await;
    }
}

/// Whether a `PUBLISH` that counted `receivers` surely reached no subscriber. On a Redis
/// Cluster it counts only the subscribers of the node that ran it, while the message
/// reaches every node's over the cluster bus (O5): there a 0 says nothing, and a call to a
/// gone owner is known only by its silence.
fn nobody_listened(client: &crate::redis::Client, receivers: i64) -> bool {
    receivers == 0 && !client.is_cluster()
}

async fn publish(conn: &mut crate::redis::Conn, channel: &str, event: &RelayEvent) {
    let Ok(payload) = serde_json::to_string(event) else {
        return;
    };
    let sent: Option<i64> = bounded(REDIS_BOUND, conn.publish(channel, payload))
        .await
        .ok();
    if sent.is_none() {
        tracing::warn!("relay: event not published");
    }
}

/// A call for a worker another replica holds.
pub(super) struct Remote<'a> {
    pub owner: &'a str,
    pub session: SessionId,
    pub tool: &'a str,
    /// Asks only for the outcome of the call made earlier under the turn's ids (D3).
    pub attach: bool,
    /// The chat's files for the owner to deliver first (T25); `None` for an attach.
    pub files: Option<TurnFiles>,
}

/// Runs `remote`'s tool on the worker its owner holds, relaying its live output to the
/// turn. The chat's files go along for the owner to deliver; when they could not be
/// listed, the result says so here.
pub(super) async fn call_remote(
    sessions: &Sessions,
    remote: Remote<'_>,
    arguments: serde_json::Map<String, Value>,
    ctx: &ToolCtx,
) -> Result<ToolOutput, Failure> {
    let (manifest, note) = match &remote.files {
        Some(Ok(manifest)) => (Some(manifest.as_ref()), None),
        Some(Err(note)) => (None, Some((*note).to_owned())),
        None => (None, None),
    };
    let output = relay_call(sessions, &remote, manifest, arguments, ctx).await?;
    Ok(uploads::noted(output, note))
}

async fn relay_call(
    sessions: &Sessions,
    remote: &Remote<'_>,
    manifest: Option<&Manifest>,
    arguments: serde_json::Map<String, Value>,
    ctx: &ToolCtx,
) -> Result<ToolOutput, Failure> {
    let Remote {
        owner,
        session,
        tool,
        attach,
        ..
    } = *remote;
    let key = uuid::Uuid::new_v4().simple().to_string();
    let Some(pubsub) = subscribe(&sessions.redis_client, events_channel(&key)).await else {
        return Err(Failure::Unsent);
    };
    let Some(mut conn) = sessions.redis().await else {
        return Err(Failure::Unsent);
    };
    let trace = logging::traces::context_of(&tracing::Span::current());
    let (traceparent, tracestate) = match trace {
        Some(trace) => (Some(trace.traceparent), trace.tracestate),
        None => (None, None),
    };
    let call = RelayCall {
        key: key.clone(),
        session,
        tool: tool.to_owned(),
        arguments,
        call_id: ctx.call_id.clone(),
        chat: ctx.chat,
        turn: ctx.turn,
        traceparent,
        tracestate,
        attach,
        uploads: manifest.map(|m| m.files.clone()).unwrap_or_default(),
        uploads_left_out: manifest.is_some_and(|m| m.left_out),
        skills: manifest.map(|m| m.skills.clone()).unwrap_or_default(),
    };
    let Ok(payload) = serde_json::to_string(&call) else {
        return Err(Failure::Other(UNREACHABLE.into()));
    };
    let receivers: Option<i64> = bounded(REDIS_BOUND, conn.publish(calls_channel(owner), payload))
        .await
        .ok();
    // The turn may drop this future without polling it again (its cancel races every
    // tool): the guard then tells the owner, as a local call's guard tells its worker. It
    // is armed before the answer to the publish is known: a publish that timed out may
    // still have reached the owner.
    let mut guard = CancelRemote {
        conn: Some(conn),
        key,
    };
    match receivers {
        // Nobody listened: the owner never saw the call.
        Some(n) if nobody_listened(&sessions.redis_client, n) => {
            guard.conn = None;
            return Err(Failure::Unsent);
        }
        // Whether the owner got it is unknown: the worker may run it, so it is attached
        // to by its key (D3) rather than sent again.
        None => {
            guard.conn = None;
            return Err(Failure::Dropped);
        }
        Some(_) => {}
    }
    await_answer(pubsub.into_on_message(), ctx, &mut guard).await
}

/// The relayed call's live output, shown to the turn, until its answer; what became of
/// the call when the owner or the relay fell silent (then no cancel is sent).
async fn await_answer(
    mut events: impl futures_util::Stream<Item = redis::Msg> + Unpin,
    ctx: &ToolCtx,
    guard: &mut CancelRemote,
) -> Result<ToolOutput, Failure> {
    loop {
        let message = tokio::select! {
            () = ctx.cancel.cancelled() => return Ok(ToolOutput::error("cancelled")),
            message = tokio::time::timeout(SILENCE, events.next()) => message,
        };
        let message = match message {
            Ok(Some(message)) => message,
            // The subscription ended (a Redis blip): the worker still runs the call, which
            // is attached to by its key once the relay is back (D3).
            Ok(None) => {
                guard.conn = None;
                return Err(Failure::Dropped);
            }
            // The owner may have died: the worker dials again elsewhere and still runs
            // the call (D3), which the caller attaches to there; no cancel is sent.
            Err(_) => {
                guard.conn = None;
                return Err(Failure::Dropped);
            }
        };
        let Ok(payload) = message.get_payload::<String>() else {
            continue;
        };
        match serde_json::from_str::<RelayEvent>(&payload) {
            Ok(RelayEvent::Beat) => {}
            Ok(RelayEvent::Log { stream, text }) => {
                if let Some(ui) = &ctx.ui {
                    let _ = ui.try_send(UiChunk::DataWorkerLog {
                        data: WorkerLog {
                            tool_call_id: ctx.call_id.clone(),
                            stream,
                            text,
                        },
                        transient: true,
                    });
                }
            }
            Ok(RelayEvent::Answer { content, is_error }) => {
                guard.conn = None;
                // A file's bytes never cross the relay (`call::Files`): its images stay
                // with the replica that stored them.
                return Ok(ToolOutput {
                    content,
                    is_error,
                    images: Vec::new(),
                    sources: Vec::new(),
                });
            }
            Ok(RelayEvent::Lost { unknown }) => {
                guard.conn = None;
                return Err(if unknown {
                    Failure::Unknown
                } else {
                    Failure::Dropped
                });
            }
            Err(_) => {
                return Err(Failure::Other(
                    "the replica holding the worker sent an undecodable answer".into(),
                ));
            }
        }
    }
}

/// Asks replica `holder` to bind the pooled worker of `bind.slot` (R3) and waits for its
/// answer; `Err` says why it was not bound: the holder is unreachable or fell silent, or
/// the worker is gone.
pub(super) async fn bind_remote(
    sessions: &Sessions,
    holder: &str,
    bind: RemoteBind,
) -> Result<(), &'static str> {
    let key = uuid::Uuid::new_v4().simple().to_string();
    let pubsub = subscribe(&sessions.redis_client, events_channel(&key))
        .await
        .ok_or("redis_unreachable")?;
    let mut conn = sessions.redis().await.ok_or("redis_unreachable")?;
    let payload = serde_json::to_string(&BindRequest { key, bind }).map_err(|_| "undecodable")?;
    let receivers: Option<i64> = bounded(REDIS_BOUND, conn.publish(binds_channel(holder), payload))
        .await
        .ok();
    if receivers.is_none_or(|n| nobody_listened(&sessions.redis_client, n)) {
        return Err("holder_unreachable");
    }
    let mut events = pubsub.into_on_message();
    loop {
        let message = match tokio::time::timeout(SILENCE, events.next()).await {
            Ok(Some(message)) => message,
            Ok(None) => return Err("holder_unreachable"),
            Err(_) => return Err("holder_silent"),
        };
        let Ok(payload) = message.get_payload::<String>() else {
            continue;
        };
        match serde_json::from_str::<RelayEvent>(&payload) {
            Ok(RelayEvent::Beat | RelayEvent::Log { .. }) => {}
            Ok(RelayEvent::Lost { .. }) => return Err("worker_gone"),
            Ok(RelayEvent::Answer {
                is_error: false, ..
            }) => return Ok(()),
            Ok(RelayEvent::Answer { is_error: true, .. }) => return Err("worker_gone"),
            Err(_) => return Err("undecodable"),
        }
    }
}

/// Sends the cancel of an unfinished relayed call when dropped.
struct CancelRemote {
    conn: Option<crate::redis::Conn>,
    key: String,
}

impl Drop for CancelRemote {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            let key = std::mem::take(&mut self.key);
            tokio::spawn(async move {
                let ttl = u64::try_from(CANCEL_TTL.as_millis()).unwrap_or(u64::MAX);
                // The key first, then the channel: two round trips, as they have
                // different hash slots on a Redis Cluster (O5). An owner that subscribes
                // after the publish still finds the key.
                let sent: Option<i64> = match bounded(
                    REDIS_BOUND,
                    conn.pset_ex::<_, _, ()>(cancelled_key(&key), 1, ttl),
                )
                .await
                {
                    Ok(()) => bounded(REDIS_BOUND, conn.publish(cancel_channel(&key), "cancel"))
                        .await
                        .ok(),
                    Err(_) => None,
                };
                if sent.is_none() {
                    tracing::warn!("relay: cancel not sent");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bind is a closed type, inside and out: a field this release does not know is
    /// refused rather than dropped.
    #[test]
    fn a_bind_request_refuses_unknown_fields() {
        let request = BindRequest {
            key: "k".into(),
            bind: RemoteBind {
                slot: SessionId::new(),
                session: SessionId::new(),
                team: TeamId::new(),
                agent: AgentId::new(),
                chat: ChatId::new(),
                restore: true,
            },
        };
        let mut json = serde_json::to_value(&request).unwrap_or_default();
        let back = serde_json::from_value::<BindRequest>(json.clone()).ok();
        assert_eq!(
            back.map(|b| (b.bind.slot, b.bind.restore)),
            Some((request.bind.slot, true))
        );
        json["bind"]["extra"] = Value::Bool(true);
        assert!(serde_json::from_value::<BindRequest>(json.clone()).is_err());
        if let Some(bind) = json["bind"].as_object_mut() {
            bind.remove("extra");
        }
        json["extra"] = Value::Bool(true);
        assert!(serde_json::from_value::<BindRequest>(json).is_err());
    }
}
