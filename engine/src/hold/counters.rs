//! The budget counters outside a turn's admission and release: rebuilt from billing
//! events when missing, billed for background work, forgotten when the limits change.

use std::time::Duration;

use protocol::TeamId;

use super::keys::LevelKeys;
use super::{Class, Holds, Inner};
use crate::quota::{Periods, Quotas};
use crate::redis::bounded;
use store::StoreError;

/// How long a replica trusts the limits it wrote to Redis before reloading them.
pub(super) const LIMITS_TTL: Duration = Duration::from_secs(60);
/// How long a budget counter lives before it is rebuilt from billing events.
const COUNTER_TTL: Duration = Duration::from_secs(60 * 60);
/// A rebuild takes from Postgres the billing events older than this, which have all
/// committed (a brain statement is cancelled within `BRAIN_DATABASE_STATEMENT_TIMEOUT_MS`,
/// at most a minute), and the newer ones from the ledger of settled turns; so a turn that
/// ends while a counter is rebuilt is counted once, whichever lands first.
const REBUILD_MARGIN: Duration = Duration::from_secs(2 * 60);
/// How long the ledger of settled turns keeps one: well past [`REBUILD_MARGIN`] and a
/// rebuild's round trips.
pub(super) const LEDGER_KEEP: Duration = Duration::from_secs(10 * 60);

impl Inner {
    /// Sets the missing budget counters of the team, or of its end `user`, from billing
    /// events (`rebuild.lua`). A Postgres failure is the caller's error (quotas are never
    /// skipped); a Redis one its class.
    pub(super) async fn rebuild(
        &self,
        quotas: &Quotas,
        team: TeamId,
        user: Option<&str>,
        periods: &Periods,
    ) -> Result<Result<(), Class>, StoreError> {
        let base = quotas
            .billed_tokens(team, user, periods, REBUILD_MARGIN)
            .await?;
        let keys = LevelKeys::of(team, user, periods);
        let args = RebuildArgs {
            keys: &keys,
            tokens_day: base.tokens_day,
            tokens_month: base.tokens_month,
            cutoff: base.cutoff,
            periods,
        };
        Ok(bounded(self.config.op_timeout, async {
            let mut conn = self.redis.get().await?;
            (args.invocation(&self.scripts.rebuild))
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|_| ()))
    }
}

/// `rebuild.lua`'s keys and arguments, in the order its head comment gives them.
struct RebuildArgs<'a> {
    keys: &'a LevelKeys,
    /// What Postgres billed before `cutoff` in the day and the month of `periods`.
    tokens_day: u64,
    tokens_month: u64,
    cutoff: chrono::DateTime<chrono::Utc>,
    periods: &'a Periods,
}

impl RebuildArgs<'_> {
    fn invocation<'s>(&self, script: &'s redis::Script) -> redis::ScriptInvocation<'s> {
        let keys = self.keys;
        let from = |start: chrono::DateTime<chrono::Utc>| {
            self.cutoff.max(start).timestamp_millis().to_string()
        };
        let mut invocation = script.prepare_invoke();
        invocation
            .key(&keys.day)
            .key(&keys.month)
            .key(&keys.day_since)
            .key(&keys.month_since)
            .key(&keys.settled)
            .key(&keys.settled_tokens)
            .arg(self.tokens_day)
            .arg(self.tokens_month)
            .arg(self.cutoff.timestamp_millis())
            .arg(from(self.periods.day_start))
            .arg(from(self.periods.month_start))
            .arg(COUNTER_TTL.as_secs());
        invocation
    }
}

impl Holds {
    /// Counts `tokens` a turn's background work billed after its hold was released (the
    /// summary fold, M1) in the team's budgets, and its end `user`'s: counted, though not
    /// reserved beforehand. Best effort: a counter that misses them is rebuilt from billing
    /// events within the hour.
    pub async fn bill(&self, team: TeamId, user: Option<&str>, tokens: u64) {
        let inner = &self.inner;
        let periods = inner.periods();
        let keys = LevelKeys::team(team, &periods);
        let user = user.map(|user| LevelKeys::user(team, user, &periods));
        let billed = bounded(inner.config.op_timeout, async {
            let mut conn = inner.redis.get().await?;
            let mut invocation = inner.scripts.bill.prepare_invoke();
            invocation.key(&keys.day).key(&keys.month).arg(tokens);
            if let Some(user) = &user {
                invocation.key(&user.day).key(&user.month);
            }
            invocation.invoke_async::<i64>(&mut conn).await
        })
        .await
        .map_err(|u| u.0);
        if let Err(class) = billed {
            tracing::warn!(team = %team, class, "summary tokens not counted in the quota counters");
        }
    }

    /// Forgets the team's stored limits and budget counters, so the next turn reloads the
    /// limits and rebuilds the counters from Postgres (after `PUT /v1/quotas`). Bounded; if
    /// Redis cannot be reached the limits it holds lapse within `LIMITS_TTL` anyway.
    pub async fn forget_limits(&self, team: TeamId) -> Result<(), Class> {
        self.forget(LevelKeys::team(team, &self.inner.periods()), None)
            .await
    }

    /// Forgets one user's stored overrides and budget counters (L4), and the team's stored
    /// limits (which say whether any user has overrides), so the next turn of the user
    /// reloads them and rebuilds its counters from Postgres (after
    /// `PUT`/`DELETE /v1/quotas/users/{user_id}`). Bounded like `forget_limits`.
    pub async fn forget_user(&self, team: TeamId, user: &str) -> Result<(), Class> {
        let periods = self.inner.periods();
        let team_limits = LevelKeys::team(team, &periods).limits;
        self.forget(LevelKeys::user(team, user, &periods), Some(&team_limits))
            .await
    }

    async fn forget(&self, keys: LevelKeys, also: Option<&str>) -> Result<(), Class> {
        let inner = &self.inner;
        bounded(inner.config.op_timeout, async {
            let mut conn = inner.redis.get().await?;
            redis::cmd("DEL")
                .arg(&keys.limits)
                .arg(&keys.day)
                .arg(&keys.month)
                .arg(&keys.day_since)
                .arg(&keys.month_since)
                .arg(also)
                .query_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|_| ())
    }
}
