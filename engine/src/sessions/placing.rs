//! What the brain asks a worker to place in its workspace over the channel, and what the
//! worker confirmed: the chat's files (T25, `uploads.rs`) and the agent's skills (B8,
//! `skills.rs`) go the same way. The replica holding the channel sends the ids its channel
//! has not confirmed; the worker downloads each with its session token and answers what it
//! placed and what failed; confirmed ids are kept on the channel's `LiveWorker`.

use std::sync::PoisonError;
use std::time::Duration;

use protocol::uploads::Placed;
use rmcp::model::{ClientRequest, CustomRequest};
use uuid::Uuid;

use super::registry::LiveWorker;

/// The longest a delivery may take: the worker's own bound on its downloads, and a margin.
const DELIVERY_BOUND: Duration = Duration::from_secs(150);

/// What a worker places in its workspace over its channel: the chat's files (T25) or the
/// agent's skills (B8).
pub(super) struct Delivery {
    /// What the worker announces when it takes them.
    pub capability: &'static str,
    /// The channel's request that carries them.
    pub method: &'static str,
    /// What the model reads when the worker does not announce `capability`.
    pub older: &'static str,
}

/// The items of `all` (by `id`) the worker's channel has not confirmed yet.
pub(super) fn unconfirmed<T: Clone>(
    worker: &LiveWorker,
    all: &[T],
    id: impl Fn(&T) -> Uuid,
) -> Vec<T> {
    let placed = worker.placed.lock().unwrap_or_else(PoisonError::into_inner);
    all.iter()
        .filter(|item| !placed.contains(&id(item)))
        .cloned()
        .collect()
}

/// Asks `worker` to place `named` (each an id and what the model calls it) with
/// `delivery`'s request, `params`; keeps what it confirmed on the channel, and answers
/// each one not placed with why, in the model's words.
pub(super) async fn place(
    worker: &LiveWorker,
    delivery: &Delivery,
    params: serde_json::Result<serde_json::Value>,
    named: &[(Uuid, String)],
) -> Vec<(String, &'static str)> {
    match ask(worker, delivery, params).await {
        Ok(answer) => {
            let mut placed = worker.placed.lock().unwrap_or_else(PoisonError::into_inner);
            placed.extend(answer.placed.iter().copied());
            named
                .iter()
                .filter(|(id, _)| !placed.contains(id))
                .map(|(id, name)| {
                    let why = answer
                        .failed
                        .iter()
                        .find(|failed| failed.id == *id)
                        .map_or("the worker did not say", |failed| failed.reason.describe());
                    (name.clone(), why)
                })
                .collect()
        }
        Err(why) => named.iter().map(|(_, name)| (name.clone(), why)).collect(),
    }
}

/// Sends `delivery`'s request with `params` and reads the answer; why not, in the model's
/// words.
async fn ask(
    worker: &LiveWorker,
    delivery: &Delivery,
    params: serde_json::Result<serde_json::Value>,
) -> Result<Placed, &'static str> {
    let announced = worker.service.peer().peer_info().is_some_and(|info| {
        info.capabilities
            .experimental
            .as_ref()
            .is_some_and(|experimental| experimental.contains_key(delivery.capability))
    });
    if !announced {
        return Err(delivery.older);
    }
    let params = params.map_err(|_| "the delivery could not be written")?;
    let request = ClientRequest::CustomRequest(CustomRequest::new(delivery.method, Some(params)));
    let answer = tokio::time::timeout(DELIVERY_BOUND, worker.service.peer().send_request(request))
        .await
        .map_err(|_| "the worker did not place them in time")?
        .map_err(|_| "the worker's connection failed during the delivery")?;
    serde_json::to_value(answer)
        .ok()
        .and_then(|answer| serde_json::from_value(answer).ok())
        .ok_or("the worker's answer to the delivery was not understood")
}
