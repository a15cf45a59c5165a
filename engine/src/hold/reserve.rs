//! A further model call of an admitted turn reserves its tokens (`reserve.lua`).

use protocol::{QuotaScope, TurnId};

use super::guard::HoldGuard;
use super::keys::LevelKeys;
use super::{Class, Counted, Inner, Reserved};
use crate::quota::{Limits, Periods, Quotas, TurnCounts};
use crate::redis::bounded;
use store::StoreError;

/// Rounds of `reserve.lua` at most: rebuild the team's and the user's counters, then
/// decide.
const ROUNDS: usize = 3;

impl HoldGuard {
    /// Reserves a further model call's tokens against the budgets of `team` and, when the
    /// turn counts at its end user's level, of `user`. A turn the counters do not count (a
    /// team without turn limits) has nothing to reserve.
    pub async fn reserve(
        &self,
        quotas: &Quotas,
        team: &Limits,
        user: Option<&Limits>,
        reservation: u64,
    ) -> Result<Reserved, StoreError> {
        let Some(held) = &self.held else {
            return Ok(Reserved::Ok);
        };
        let Some(counted) = &held.counted else {
            return Ok(Reserved::Ok);
        };
        let budgeted = |l: &Limits| l.tokens_per_day.is_some() || l.tokens_per_month.is_some();
        let user = counted
            .user
            .as_deref()
            .zip(user)
            .filter(|(_, limits)| budgeted(limits));
        if !budgeted(team) && user.is_none() {
            return Ok(Reserved::Ok);
        }
        let periods = held.inner.periods();
        let mut levels = vec![(LevelKeys::team(counted.team, &periods), team)];
        if let Some((name, limits)) = user {
            levels.push((LevelKeys::user(counted.team, name, &periods), limits));
        }
        let reserving = Reserving {
            inner: &held.inner,
            counted,
            periods,
            levels,
        };
        reserving.decide(quotas, reservation).await
    }
}

/// One reservation under way: the levels it counts at, each with its budgets.
struct Reserving<'a> {
    inner: &'a Inner,
    counted: &'a Counted,
    periods: Periods,
    levels: Vec<(LevelKeys, &'a Limits)>,
}

impl Reserving<'_> {
    async fn decide(&self, quotas: &Quotas, reservation: u64) -> Result<Reserved, StoreError> {
        let turn = self.counted.turn;
        for _ in 0..ROUNDS {
            let answer = match self.call(reservation).await {
                Ok(answer) => answer,
                Err(class) => {
                    tracing::warn!(turn = %turn, class, "quota counters unavailable mid-turn");
                    return Ok(Reserved::Unavailable);
                }
            };
            match answer {
                ReserveAnswer::Ok => return Ok(Reserved::Ok),
                ReserveAnswer::Rebuild { user } => {
                    let user = user.then_some(self.counted.user.as_deref()).flatten();
                    let team = self.counted.team;
                    let rebuilt = self.inner.rebuild(quotas, team, user, &self.periods);
                    if let Err(class) = rebuilt.await? {
                        tracing::warn!(turn = %turn, class, "quota counters unavailable mid-turn");
                        return Ok(Reserved::Unavailable);
                    }
                }
                ReserveAnswer::Refused { user, day, month } => {
                    return Ok(self.refused(user, day, month));
                }
                ReserveAnswer::Unknown => break,
            }
        }
        Ok(Reserved::Unavailable)
    }

    async fn call(&self, reservation: u64) -> Result<ReserveAnswer, Class> {
        let args = ReserveArgs {
            turn: self.counted.turn,
            reservation,
            levels: &self.levels,
        };
        bounded(self.inner.config.op_timeout, async {
            let mut conn = self.inner.redis.get().await?;
            (args.invocation(&self.inner.scripts.reserve))
                .invoke_async(&mut conn)
                .await
        })
        .await
        .map_err(|u| u.0)
        .map(ReserveAnswer::parse)
    }

    /// The script refused at the team's level, or the user's when `user`, with the tokens
    /// of the `day` and `month` it counted: worded as `quota::fallback::decide` words it.
    fn refused(&self, user: bool, day: u64, month: u64) -> Reserved {
        let counts = TurnCounts {
            tokens_day: day,
            tokens_month: month,
            ..TurnCounts::default()
        };
        let limits = if user {
            self.levels[self.levels.len() - 1].1
        } else {
            self.levels[0].1
        };
        let budgets = Limits {
            tokens_per_day: limits.tokens_per_day,
            tokens_per_month: limits.tokens_per_month,
            ..Limits::default()
        };
        match crate::quota::fallback::decide(&budgets, &counts, &self.periods) {
            Some(mut refusal) => {
                if user {
                    refusal.scope = QuotaScope::User;
                }
                Reserved::Refused(refusal)
            }
            None => Reserved::Ok,
        }
    }
}

/// `reserve.lua`'s keys and arguments, in the order its head comment gives them.
struct ReserveArgs<'a> {
    turn: TurnId,
    reservation: u64,
    /// The team's level, then the user's: each its keys and its day and month budgets.
    levels: &'a [(LevelKeys, &'a Limits)],
}

impl ReserveArgs<'_> {
    fn invocation<'s>(&self, script: &'s redis::Script) -> redis::ScriptInvocation<'s> {
        let limit = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        let mut invocation = script.prepare_invoke();
        invocation.arg(self.turn.to_string()).arg(self.reservation);
        for (keys, limits) in self.levels {
            invocation
                .key(&keys.reserved)
                .key(&keys.reserved_total)
                .key(&keys.day)
                .key(&keys.month)
                .arg(limit(limits.tokens_per_day))
                .arg(limit(limits.tokens_per_month));
        }
        invocation
    }
}

/// `reserve.lua`'s answer.
#[derive(Debug)]
enum ReserveAnswer {
    Ok,
    /// A budget counter of the team, or of the user when `user`, is missing.
    Rebuild {
        user: bool,
    },
    /// Refused at the team's level, or the user's when `user`, with the tokens counted.
    Refused {
        user: bool,
        day: u64,
        month: u64,
    },
    /// Anything else: a script out of step with this file.
    Unknown,
}

impl ReserveAnswer {
    fn parse(answer: Vec<String>) -> Self {
        let n = |i: usize| {
            answer
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_default()
        };
        let user = answer.get(1).is_some_and(|l| l == "user");
        match answer.first().map(String::as_str) {
            Some("ok") => Self::Ok,
            Some("rebuild") => Self::Rebuild { user },
            Some("refused") => Self::Refused {
                user,
                day: n(3),
                month: n(4),
            },
            _ => Self::Unknown,
        }
    }
}
