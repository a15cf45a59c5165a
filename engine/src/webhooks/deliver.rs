//! The delivery loop every replica runs (P4): claim due deliveries from the outbox
//! (`FOR UPDATE SKIP LOCKED`, hidden from other replicas for one attempt's bound), send
//! each once, record the attempt and when to try again.
//!
//! At least once: a delivery leaves the outbox only when a receiver answered 2xx. A replica
//! killed between its claim and its record leaves the row hidden only until the claim's
//! lease passes; any replica then claims it again, with the same `webhook-id`. A receiver
//! therefore dedupes on `webhook-id`.
//!
//! Bounds: at most `max_in_flight` attempts at once per replica, of which one team's
//! deliveries hold at most `max_in_flight_per_team`, and each claim takes every team's
//! oldest due deliveries in turn (`Store::claim_deliveries`): a team whose receivers never
//! answer holds its share of the slots for an attempt's bound, never the others'. Each
//! attempt within `timeout` (connect, send, headers); the response body is never read (so
//! never logged); no redirects; no proxy; the URL is judged by the connectors' address
//! rule at every attempt, its host name's addresses by [`address::CheckedResolver`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use protocol::TeamId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::address;
use crate::channels;
use crate::config::WebhooksConfig;
use crate::events::Events;
use crate::metrics::Metrics;
use store::webhooks::{AttemptOutcome, ClaimedDelivery, message_id};
use store::{Store, bounded};

use super::sign;

/// A claim outlives the attempt's bound by this much, so a live replica records its
/// attempt before another may take the row.
const LEASE_MARGIN: Duration = Duration::from_secs(2);
/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// Runs until `stop`. With `max_in_flight` 0 this replica delivers nothing (others do).
pub async fn run(
    store: Store,
    events: Events,
    config: WebhooksConfig,
    metrics: Metrics,
    stop: CancellationToken,
) {
    if config.max_in_flight == 0 {
        return;
    }
    let client = match address::client(config.timeout, config.allow_private_networks) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "webhooks: no HTTP client; this replica delivers nothing");
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(config.max_in_flight));
    let held = Held::default();
    let per_team = config.max_in_flight_per_team.min(config.max_in_flight) as i64;
    let lease = config.timeout + LEASE_MARGIN;
    loop {
        let free = slots.available_permits();
        let mut full_batch = false;
        if free > 0 {
            let held_now = held.snapshot();
            let claim = store.claim_deliveries(free as i64, per_team, &held_now, lease);
            match bounded(claim).await {
                Ok(claimed) => {
                    full_batch = claimed.len() == free;
                    for delivery in claimed {
                        let Ok(permit) = slots.clone().try_acquire_owned() else {
                            break;
                        };
                        let slot = held.take(delivery.team, permit);
                        let (store, client) = (store.clone(), client.clone());
                        let events = events.clone();
                        let metrics = metrics.clone();
                        tokio::spawn(async move {
                            attempt(&store, &events, &client, &config, &metrics, delivery).await;
                            drop(slot);
                        });
                    }
                }
                Err(e) => tracing::warn!(class = e.metric_label(), "webhooks: claim failed"),
            }
        }
        if full_batch {
            continue;
        }
        tokio::select! {
            // The drain is over: attempts in flight end with the process; their claims
            // lapse and another replica sends them.
            () = stop.cancelled() => return,
            // The next look for due deliveries.
            () = tokio::time::sleep(config.poll) => {}
        }
    }
}

/// The slots each team's attempts hold on this replica.
#[derive(Clone, Default)]
struct Held(Arc<Mutex<HashMap<TeamId, usize>>>);

impl Held {
    /// The teams holding slots, and how many each: what the next claim leaves out.
    fn snapshot(&self) -> Vec<(TeamId, i64)> {
        let held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.iter().map(|(team, n)| (*team, *n as i64)).collect()
    }

    fn take(&self, team: TeamId, permit: OwnedSemaphorePermit) -> Slot {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *held.entry(team).or_default() += 1;
        Slot {
            held: self.clone(),
            team,
            _permit: permit,
        }
    }
}

/// One attempt's slot, given back to its team and to the replica when dropped (an attempt
/// that panics included).
struct Slot {
    held: Held,
    team: TeamId,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.held.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.team) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.team);
            }
        }
    }
}

/// One attempt of one delivery, recorded. A record that fails leaves the claim to lapse:
/// the delivery is sent again (at least once).
async fn attempt(
    store: &Store,
    events: &Events,
    client: &reqwest::Client,
    config: &WebhooksConfig,
    metrics: &Metrics,
    delivery: ClaimedDelivery,
) {
    let started = Instant::now();
    let (status, error, retry_after) = match delivery.channel {
        Some(channel) => {
            let lease = config.timeout + LEASE_MARGIN;
            let sent = channels::deliver::attempt(
                store, events, client, config, metrics, &delivery, channel, lease,
            )
            .await;
            match sent {
                Ok(()) => (None, None, None),
                Err(e) => (
                    e.status,
                    Some(e.class),
                    channels::deliver::retry_after(&e, delivery.attempt),
                ),
            }
        }
        None => {
            let (status, error) = send(client, config, &delivery).await;
            let retry_after = error.map(|_| backoff(config.retry_base, delivery.attempt));
            (status, error, retry_after)
        }
    };
    metrics
        .webhook_attempts
        .with_label_values(&[error.unwrap_or("delivered")])
        .inc();
    let outcome = AttemptOutcome {
        status,
        error,
        duration: started.elapsed(),
    };
    tracing::info!(
        delivery = %delivery.id,
        team = %delivery.team,
        event = %delivery.event,
        attempt = delivery.attempt,
        status = status.unwrap_or(0),
        error = error.unwrap_or("none"),
        "webhook attempt"
    );
    if let Err(e) =
        bounded(store.record_attempt(delivery.id, delivery.attempt, &outcome, retry_after)).await
    {
        tracing::warn!(class = e.metric_label(), delivery = %delivery.id, "webhooks: attempt not recorded");
    }
}

/// Sends one attempt: the status answered, and `None` or the class of failure.
async fn send(
    client: &reqwest::Client,
    config: &WebhooksConfig,
    delivery: &ClaimedDelivery,
) -> (Option<u16>, Option<&'static str>) {
    let Ok(url) = reqwest::Url::parse(&delivery.url) else {
        return (None, Some("invalid_url"));
    };
    // An address literal never reaches the resolver.
    if let Err(refused) = address::check_url(&url, config.allow_private_networks) {
        return (None, Some(refused.class()));
    }
    let Ok(body) = serde_json::to_vec(&delivery.body) else {
        return (None, Some("invalid_body"));
    };
    let id = message_id(delivery.id);
    let timestamp = chrono::Utc::now().timestamp();
    let mut request = client
        .post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", timestamp.to_string());
    if let Some(secret) = &delivery.secret {
        let Some(signature) = sign::signature(secret, &id, timestamp, &body) else {
            return (None, Some("unreadable_secret"));
        };
        request = request.header("webhook-signature", signature);
    }
    for (name, value) in &delivery.headers {
        request = request.header(name, value);
    }
    // The client's timeout bounds the whole exchange; this one also bounds a resolver
    // that never answers.
    match tokio::time::timeout(config.timeout, request.body(body).send()).await {
        Err(_) => (None, Some("timeout")),
        Ok(Err(e)) => (None, Some(address::request_class(&e))),
        // The body is dropped unread: nothing a receiver writes reaches a log.
        Ok(Ok(response)) if response.status().is_success() => {
            (Some(response.status().as_u16()), None)
        }
        Ok(Ok(response)) => (Some(response.status().as_u16()), Some("status")),
    }
}

/// The wait after failed attempt `attempt` (from 1): `base` doubled per attempt, at most
/// an hour, less up to a fifth at random so a receiver back from an outage is not met by
/// every delivery at once.
pub fn backoff(base: Duration, attempt: i32) -> Duration {
    address::backoff_within(base, MAX_BACKOFF, attempt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_an_hour() {
        let base = Duration::from_secs(5);
        let b1 = backoff(base, 1);
        assert!(b1 >= Duration::from_secs(4) && b1 <= base);
        let b4 = backoff(base, 4);
        assert!(b4 >= Duration::from_secs(32) && b4 <= Duration::from_secs(40));
        let late = backoff(base, 40);
        assert!(late <= MAX_BACKOFF && late >= MAX_BACKOFF.mul_f64(0.8));
    }
}
