//! The plain hold (no quota counters), and the hold a replica takes over with a turn.

use protocol::{AgentId, TeamId, TurnId};
use redis::RedisError;
use tokio::time::Instant;

use super::guard::HoldGuard;
use super::keys::hold_key;
use super::release::spawn_release;
use super::{Acquired, Class, Counted, Holds, Inner, millis, running_turn};
use crate::redis::bounded;

impl Holds {
    /// `SET NX PX` with a random token in a single round trip; takes at most `op_timeout`.
    pub async fn acquire(&self, team: TeamId, agent: AgentId, turn: TurnId) -> Acquired {
        let inner = &self.inner;
        let acquired_at = Instant::now();
        let key = hold_key(team, agent);
        let value = inner.value(turn);
        let answer = bounded(inner.config.op_timeout, async {
            match inner.try_acquire(&key, &value).await {
                // A connection that failed earlier is replaced on that failure: one
                // more try uses the fresh one, so a Redis that came back is used at once.
                Err(err) if err.is_io_error() => inner.try_acquire(&key, &value).await,
                answer => answer,
            }
        })
        .await
        .map_err(|u| u.0);
        let class = match answer {
            Ok(None) => {
                return Acquired::Held(HoldGuard::start(inner, key, value, acquired_at, None));
            }
            // Our own value: the first try's SET landed but its answer was lost.
            Ok(Some(current)) if current == value => {
                return Acquired::Held(HoldGuard::start(inner, key, value, acquired_at, None));
            }
            Ok(Some(current)) => match running_turn(&current) {
                Some(running) => return Acquired::Busy { running },
                None => "malformed_hold",
            },
            Err(class) => {
                if class != "connection_refused" {
                    // The SET may have landed after all: take it back so the agent does
                    // not look busy for a whole `ttl`.
                    spawn_release(inner.clone(), key, value, None);
                }
                class
            }
        };
        inner.metrics.hold_unavailable.inc();
        tracing::warn!(
            agent = %agent,
            turn = %turn,
            class,
            "turn hold unavailable; running without it"
        );
        Acquired::Unavailable
    }

    /// D3: holds `agent` on for `turn`, taken over from a dead replica, with a token of
    /// this replica's; `counted` when the team's counters count the turn (its release then
    /// settles its reservation, at its end `user`'s level too). `Ok(None)`: another turn holds the agent (the dead turn's
    /// hold lapsed and a new turn started meanwhile).
    pub async fn adopt(
        &self,
        team: TeamId,
        agent: AgentId,
        turn: TurnId,
        user: Option<&str>,
        counted: bool,
    ) -> Result<Option<HoldGuard>, Class> {
        let inner = &self.inner;
        let acquired_at = Instant::now();
        let key = hold_key(team, agent);
        let value = inner.value(turn);
        let current = bounded(inner.config.op_timeout, async {
            let mut conn = inner.redis.get().await?;
            inner
                .scripts
                .adopt
                .key(&key)
                .arg(format!("{turn}:"))
                .arg(&value)
                .arg(millis(inner.first_expiry()))
                .invoke_async::<Option<String>>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)?;
        if current.is_some() {
            return Ok(None);
        }
        let counted = counted.then(|| Counted {
            team,
            turn,
            user: user.map(str::to_owned),
        });
        Ok(Some(HoldGuard::start(
            inner,
            key,
            value,
            acquired_at,
            counted,
        )))
    }
}

impl Inner {
    /// `acquire.lua`: `None` if the hold is now ours, else the current value.
    async fn try_acquire(&self, key: &str, value: &str) -> Result<Option<String>, RedisError> {
        let mut conn = self.redis.get().await?;
        self.scripts
            .acquire
            .key(key)
            .arg(value)
            .arg(millis(self.first_expiry()))
            .invoke_async(&mut conn)
            .await
    }
}
