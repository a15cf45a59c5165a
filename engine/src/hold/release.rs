//! Freeing a hold: by its holder (compare-and-delete, settling a counted turn), by a
//! survivor for a dead replica's turn, or for a hold left behind before its turn was
//! written.

use std::sync::Arc;
use std::time::Duration;

use backon::Retryable;
use protocol::{AgentId, TeamId, TurnId};

use super::counters::LEDGER_KEEP;
use super::keys::{LevelKeys, hold_key};
use super::{Billed, Class, Counted, Holder, Holds, Inner, millis, turn_of};
use crate::redis::bounded;

/// The pauses between attempts at releasing a hold: four attempts in all.
const RELEASE_PAUSES: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(800),
];

impl Holds {
    /// Frees `agent` if its hold still names `turn`, a turn that ended without its holder
    /// (its replica died, O3). Bounded like every hold call; true if a hold was deleted.
    pub async fn release_lost(
        &self,
        team: TeamId,
        agent: AgentId,
        turn: TurnId,
    ) -> Result<bool, Class> {
        let inner = &self.inner;
        bounded(inner.config.op_timeout, async {
            let mut conn = inner.redis.get().await?;
            inner
                .scripts
                .release_turn
                .key(hold_key(team, agent))
                .arg(format!("{turn}:"))
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|n| n == 1)
    }

    /// O5: frees `agent` of `holder`'s hold while it is still that one (compare and
    /// delete): its replica was lost before it wrote `turn`, the turn the hold names, so
    /// no reconciliation knows of it and nothing else would free it before it lapses. In
    /// the same script the turn leaves the team's running turns and gives back its
    /// reservation, having billed nothing. An end user's level (L4) is not settled: the
    /// hold does not name the user, so the turn's entry there lapses with the hold's
    /// expiry. True if the hold was deleted.
    pub async fn release_left_behind(
        &self,
        team: TeamId,
        agent: AgentId,
        turn: TurnId,
        holder: &Holder,
    ) -> Result<bool, Class> {
        let counted = Counted {
            team,
            turn,
            user: None,
        };
        self.inner
            .settle(
                &hold_key(team, agent),
                &holder.value,
                &counted,
                Billed::default(),
            )
            .await
    }
}

impl Inner {
    /// Runs a compare-and-act script (`extend.lua` or `release.lua`): true if the value
    /// was ours.
    pub(super) async fn if_ours(
        &self,
        script: &redis::Script,
        key: &str,
        value: &str,
        arg: u64,
    ) -> Result<bool, Class> {
        bounded(self.config.op_timeout, async {
            let mut conn = self.redis.get().await?;
            script
                .key(key)
                .arg(value)
                .arg(arg)
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|n| n == 1)
    }

    /// Compare-and-delete (with the settlement of a counted turn), tried again when Redis
    /// is slow (a burst of turn ends) or reconnecting: until it lands, the agent answers
    /// `agent_busy` for up to the hold's ttl. Trying again is safe: a delete that did land
    /// leaves nothing ours, and a settlement that did land adds nothing twice.
    pub(super) async fn release(
        &self,
        key: &str,
        value: &str,
        counted: Option<&Counted>,
        billed: Billed,
    ) {
        let released = (|| async {
            match counted {
                None => self.if_ours(&self.scripts.release, key, value, 0).await,
                Some(counted) => self.settle(key, value, counted, billed).await,
            }
        })
        .retry(RELEASE_PAUSES.into_iter())
        .sleep(tokio::time::sleep)
        .await;
        match released {
            Ok(true) => {}
            Ok(false) => tracing::debug!(key, "turn hold already gone or taken over"),
            Err(class) => tracing::warn!(
                turn = turn_of(value),
                class,
                "could not release turn hold; it will expire"
            ),
        }
    }

    /// `settle.lua`: true if the hold was ours.
    async fn settle(
        &self,
        key: &str,
        value: &str,
        counted: &Counted,
        billed: Billed,
    ) -> Result<bool, Class> {
        let periods = self.periods();
        let team = LevelKeys::team(counted.team, &periods);
        let user = (counted.user.as_deref()).map(|u| LevelKeys::user(counted.team, u, &periods));
        let args = SettleArgs {
            hold: key,
            value,
            team: &team,
            user: user.as_ref(),
            turn: counted.turn,
            billed,
        };
        bounded(self.config.op_timeout, async {
            let mut conn = self.redis.get().await?;
            (args.invocation(&self.scripts.settle))
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(|n| n == 1)
    }
}

/// `settle.lua`'s keys and arguments, in the order its head comment gives them.
struct SettleArgs<'a> {
    hold: &'a str,
    /// The hold's value: deleted only while it is still this.
    value: &'a str,
    team: &'a LevelKeys,
    /// The turn's end user's level (L4).
    user: Option<&'a LevelKeys>,
    turn: TurnId,
    billed: Billed,
}

impl SettleArgs<'_> {
    fn invocation<'s>(&self, script: &'s redis::Script) -> redis::ScriptInvocation<'s> {
        let mut invocation = script.prepare_invoke();
        invocation.key(self.hold);
        for keys in std::iter::once(self.team).chain(self.user) {
            invocation
                .key(&keys.running)
                .key(&keys.reserved)
                .key(&keys.reserved_total)
                .key(&keys.day)
                .key(&keys.month)
                .key(&keys.settled)
                .key(&keys.settled_tokens)
                .key(&keys.day_since)
                .key(&keys.month_since)
                .key(&keys.starts);
        }
        let at = (self.billed.at)
            .map(|at| at.timestamp_millis().to_string())
            .unwrap_or_default();
        invocation
            .arg(self.value)
            .arg(self.turn.to_string())
            .arg(self.billed.tokens)
            .arg(at)
            .arg(millis(LEDGER_KEEP))
            .arg(if self.billed.unstarted { "1" } else { "0" });
        invocation
    }
}

/// Best-effort release in the background; without a runtime the hold simply expires.
pub(super) fn spawn_release(
    inner: Arc<Inner>,
    key: String,
    value: String,
    counted: Option<Counted>,
) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            inner
                .release(&key, &value, counted.as_ref(), Billed::default())
                .await
        });
    }
}
