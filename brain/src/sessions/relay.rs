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
//!   publishes [`RelayEvent`]s (live output lines, then the answer) on `relay:call:{key}`.
//!   The caller subscribes before publishing, so nothing is missed. A cancel is published
//!   on `relay:cancel:{key}`; the owner then cancels the call, which reaches the worker.
//!
//! Architecture invariant: only this module knows these Redis key and channel names.

use std::time::Duration;

use futures_util::StreamExt;
use protocol::SessionId;
use protocol::ui::{UiChunk, WorkerLog};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::tool::{Answer, call_worker};
use super::{SessionError, Sessions};

fn owner_key(session: SessionId) -> String {
    format!("worker-owner:{session}")
}

fn calls_channel(replica: &str) -> String {
    format!("relay:{replica}")
}

fn events_channel(key: &str) -> String {
    format!("relay:call:{key}")
}

fn cancel_channel(key: &str) -> String {
    format!("relay:cancel:{key}")
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
}

/// What the owner sends back, in order: any number of logs, then one answer or error.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum RelayEvent {
    Log { stream: String, text: String },
    Answer { answer: Answer },
    Error { message: String },
}

/// Deletes the owner key only while it still names this replica.
const RELEASE_OWNER: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

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

/// The bound of one owner-key command once connected.
const OWNER_CALL: Duration = Duration::from_secs(1);

impl Sessions {
    async fn redis(&self) -> Option<redis::aio::MultiplexedConnection> {
        match tokio::time::timeout(
            Duration::from_secs(2),
            self.redis_client.get_multiplexed_async_connection(),
        )
        .await
        {
            Ok(Ok(conn)) => Some(conn),
            _ => {
                tracing::warn!("relay: Redis unreachable");
                None
            }
        }
    }

    /// Marks this replica as the holder of `session`'s channel for `ttl`.
    pub(super) async fn claim_owner(&self, session: SessionId, ttl: Duration) {
        if let Some(mut conn) = self.redis().await {
            let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
            let set: redis::RedisResult<()> =
                conn.pset_ex(owner_key(session), &self.replica, ms).await;
            if set.is_err() {
                tracing::warn!(session = %session, "relay: owner key not written");
            }
        }
    }

    pub(super) async fn release_owner(&self, session: SessionId) {
        if let Some(mut conn) = self.redis().await {
            let _: redis::RedisResult<i64> = redis::Script::new(RELEASE_OWNER)
                .key(owner_key(session))
                .arg(&self.replica)
                .invoke_async(&mut conn)
                .await;
        }
    }

    /// The replica holding `session`'s channel, if any. `OwnerUnknown` when Redis does not
    /// answer in time: that says nothing about the owner.
    pub(super) async fn owner(&self, session: SessionId) -> Result<Option<String>, SessionError> {
        let mut conn = self.redis().await.ok_or(SessionError::OwnerUnknown)?;
        let got = tokio::time::timeout(OWNER_CALL, conn.get(owner_key(session))).await;
        match got {
            Ok(Ok(owner)) => Ok(owner),
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
        match tokio::time::timeout(OWNER_CALL, call.invoke_async::<i64>(&mut conn)).await {
            Ok(Ok(taken)) => Ok(taken == 1),
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
        let counted = tokio::time::timeout(
            OWNER_CALL,
            numsub.query_async::<Vec<(String, i64)>>(&mut conn),
        )
        .await;
        match counted {
            Ok(Ok(counts)) => Ok(counts.iter().any(|(_, n)| *n > 0)),
            _ => Err(SessionError::OwnerUnknown),
        }
    }

    /// Serves calls other replicas forward to this one, until `shutdown`.
    pub async fn serve_relay(self, shutdown: CancellationToken) {
        loop {
            let served = tokio::select! {
                () = shutdown.cancelled() => return,
                served = self.relay_once(&shutdown) => served,
            };
            if let Err(err) = served {
                tracing::warn!(class = ?err.kind(), "relay subscription lost; retrying");
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    async fn relay_once(&self, shutdown: &CancellationToken) -> redis::RedisResult<()> {
        let mut pubsub = self.redis_client.get_async_pubsub().await?;
        pubsub.subscribe(calls_channel(&self.replica)).await?;
        let mut messages = pubsub.on_message();
        while let Some(message) = messages.next().await {
            let Ok(payload) = message.get_payload::<String>() else {
                continue;
            };
            let Ok(call) = serde_json::from_str::<RelayCall>(&payload) else {
                tracing::warn!("relay: undecodable call dropped");
                continue;
            };
            tokio::spawn(self.clone().run_relayed(call, shutdown.child_token()));
        }
        Ok(())
    }

    /// Runs a forwarded call on a local worker and publishes its events.
    async fn run_relayed(self, call: RelayCall, cancel: CancellationToken) {
        let Some(mut conn) = self.redis().await else {
            return;
        };
        let events = events_channel(&call.key);
        let Some(worker) = self.registry.get(call.session) else {
            publish(
                &mut conn,
                &events,
                &RelayEvent::Error {
                    message: "the worker is no longer connected".into(),
                },
            )
            .await;
            return;
        };
        // Cancels from the caller, and live output to the caller.
        let watch = {
            let client = self.redis_client.clone();
            let channel = cancel_channel(&call.key);
            let cancel = cancel.clone();
            tokio::spawn(async move {
                let Ok(mut pubsub) = client.get_async_pubsub().await else {
                    return;
                };
                if pubsub.subscribe(channel).await.is_err() {
                    return;
                }
                if pubsub.on_message().next().await.is_some() {
                    cancel.cancel();
                }
            })
        };
        let (ui, mut lines) = mpsc::channel::<UiChunk>(64);
        let forward = {
            let mut conn = conn.clone();
            let events = events.clone();
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
        let answer = call_worker(
            &worker,
            &call.tool,
            call.arguments,
            &call.call_id,
            Some(&ui),
            &cancel,
        )
        .await;
        drop(ui);
        let _ = forward.await;
        watch.abort();
        let event = match answer {
            Ok(answer) => RelayEvent::Answer { answer },
            Err(message) => RelayEvent::Error { message },
        };
        publish(&mut conn, &events, &event).await;
    }
}

async fn publish(conn: &mut redis::aio::MultiplexedConnection, channel: &str, event: &RelayEvent) {
    let Ok(payload) = serde_json::to_string(event) else {
        return;
    };
    let sent: redis::RedisResult<i64> = conn.publish(channel, payload).await;
    if sent.is_err() {
        tracing::warn!("relay: event not published");
    }
}

/// Runs `tool` on the worker `owner` holds, relaying its live output to `ui`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn call_remote(
    sessions: &Sessions,
    owner: &str,
    session: SessionId,
    tool: &str,
    arguments: serde_json::Map<String, Value>,
    call_id: &str,
    ui: Option<&mpsc::Sender<UiChunk>>,
    cancel: &CancellationToken,
) -> Result<Answer, String> {
    let unreachable = || "the replica holding the worker is unreachable".to_owned();
    let key = uuid::Uuid::new_v4().simple().to_string();
    let mut pubsub = sessions
        .redis_client
        .get_async_pubsub()
        .await
        .map_err(|_| unreachable())?;
    pubsub
        .subscribe(events_channel(&key))
        .await
        .map_err(|_| unreachable())?;
    let mut conn = sessions.redis().await.ok_or_else(unreachable)?;
    let call = RelayCall {
        key: key.clone(),
        session,
        tool: tool.to_owned(),
        arguments,
        call_id: call_id.to_owned(),
    };
    let payload = serde_json::to_string(&call).map_err(|_| unreachable())?;
    let receivers: i64 = conn
        .publish(calls_channel(owner), payload)
        .await
        .map_err(|_| unreachable())?;
    if receivers == 0 {
        return Err(unreachable());
    }
    // The turn may drop this future without polling it again (its cancel races every
    // tool): the guard then tells the owner, as a local call's guard tells its worker.
    let mut guard = CancelRemote {
        conn: Some(conn),
        channel: cancel_channel(&key),
    };
    let mut events = pubsub.on_message();
    loop {
        let message = tokio::select! {
            () = cancel.cancelled() => return Err("cancelled".into()),
            message = events.next() => message,
        };
        let Some(message) = message else {
            return Err(unreachable());
        };
        let Ok(payload) = message.get_payload::<String>() else {
            continue;
        };
        match serde_json::from_str::<RelayEvent>(&payload) {
            Ok(RelayEvent::Log { stream, text }) => {
                if let Some(ui) = ui {
                    let _ = ui.try_send(UiChunk::DataWorkerLog {
                        data: WorkerLog {
                            tool_call_id: call_id.to_owned(),
                            stream,
                            text,
                        },
                        transient: true,
                    });
                }
            }
            Ok(RelayEvent::Answer { answer }) => {
                guard.conn = None;
                return Ok(answer);
            }
            Ok(RelayEvent::Error { message }) => {
                guard.conn = None;
                return Err(message);
            }
            Err(_) => {
                return Err("the replica holding the worker sent an undecodable answer".into());
            }
        }
    }
}

/// Publishes the cancel of an unfinished relayed call when dropped.
struct CancelRemote {
    conn: Option<redis::aio::MultiplexedConnection>,
    channel: String,
}

impl Drop for CancelRemote {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            let channel = std::mem::take(&mut self.channel);
            tokio::spawn(async move {
                let _: redis::RedisResult<i64> = conn.publish(channel, "cancel").await;
            });
        }
    }
}
