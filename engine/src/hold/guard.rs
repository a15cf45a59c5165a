//! The running turn's hold: extended in the background until the turn ends, then
//! released (and its counters settled) by the guard or, dropped, in the background.

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::keys::LevelKeys;
use super::release::spawn_release;
use super::{Billed, Class, Counted, Inner, millis, turn_of};
use crate::redis::bounded;

/// The running turn's hold. Release it when the turn ends; dropping it also releases, in
/// the background.
pub struct HoldGuard {
    /// `None` once released.
    pub(super) held: Option<Held>,
}

pub(super) struct Held {
    pub inner: Arc<Inner>,
    key: String,
    value: String,
    /// Set when the team's quota counters count this turn.
    pub counted: Option<Counted>,
    /// Stops the extension task.
    stop: CancellationToken,
}

impl HoldGuard {
    pub(super) fn start(
        inner: &Arc<Inner>,
        key: String,
        value: String,
        acquired_at: Instant,
        counted: Option<Counted>,
    ) -> Self {
        let stop = CancellationToken::new();
        tokio::spawn(extend_until_stopped(
            inner.clone(),
            key.clone(),
            value.clone(),
            counted.clone(),
            acquired_at,
            stop.clone(),
        ));
        Self {
            held: Some(Held {
                inner: inner.clone(),
                key,
                value,
                counted,
                stop,
            }),
        }
    }

    /// Stops extending and deletes the hold if it is still ours (compare-and-delete), so a
    /// turn that outlived its hold never frees another turn's.
    pub async fn release(self) {
        self.release_billed(Billed::default()).await;
    }

    /// Stops extending the hold without releasing it: the turn moved to another replica
    /// (D3), which holds the agent (and settles the turn's reservation) now.
    pub fn abandon(mut self) {
        if let Some(held) = self.held.take() {
            held.stop.cancel();
        }
    }

    /// `release`, settling a counted turn's reservations on what it `billed`.
    pub async fn release_billed(mut self, billed: Billed) {
        if let Some(held) = self.held.take() {
            held.stop.cancel();
            held.inner
                .release(&held.key, &held.value, held.counted.as_ref(), billed)
                .await;
        }
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            held.stop.cancel();
            spawn_release(held.inner, held.key, held.value, held.counted);
        }
    }
}

impl fmt::Debug for HoldGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token stays out of logs: only the turn id is shown.
        let turn = self.held.as_ref().map(|held| turn_of(&held.value));
        f.debug_struct("HoldGuard").field("turn", &turn).finish()
    }
}

/// Pushes the expiry back every `extend_every` until stopped, the hold is lost, or
/// `max_total` since acquisition is reached; the hold then expires on its own.
async fn extend_until_stopped(
    inner: Arc<Inner>,
    key: String,
    value: String,
    counted: Option<Counted>,
    acquired_at: Instant,
    stop: CancellationToken,
) {
    let deadline = acquired_at + inner.config.max_total;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(inner.config.extend_every) => {}
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return;
        }
        // Never past `max_total`: the last extension only reaches the deadline.
        let expiry = inner.config.ttl.min(remaining);
        match inner
            .extend(&key, &value, counted.as_ref(), millis(expiry))
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    turn = turn_of(&value),
                    "turn hold lost; no longer extending it"
                );
                return;
            }
            // Transient: the next tick tries again while the hold has not expired.
            Err(class) => {
                tracing::warn!(turn = turn_of(&value), class, "could not extend turn hold")
            }
        }
    }
}

impl Inner {
    /// `extend.lua`, or `extend_counted.lua` for a counted turn: true while the hold is ours.
    async fn extend(
        &self,
        key: &str,
        value: &str,
        counted: Option<&Counted>,
        expiry: u64,
    ) -> Result<bool, Class> {
        let Some(counted) = counted else {
            return self.if_ours(&self.scripts.extend, key, value, expiry).await;
        };
        let periods = self.periods();
        let team = LevelKeys::team(counted.team, &periods).running;
        let user = (counted.user.as_deref()).map(|u| LevelKeys::user(counted.team, u, &periods));
        bounded(self.config.op_timeout, async {
            let mut conn = self.redis.get().await?;
            let mut invocation = self.scripts.extend_counted.prepare_invoke();
            invocation.key(key).key(&team);
            if let Some(user) = &user {
                invocation.key(&user.running);
            }
            invocation
                .arg(value)
                .arg(expiry)
                .arg(counted.turn.to_string())
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|n| n == 1)
    }
}
