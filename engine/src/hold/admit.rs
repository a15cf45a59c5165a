//! Admission: the hold and the team's (and its end user's) quotas in one script
//! (`admit.lua`), with the Postgres reads it may ask for between rounds.

use std::sync::Arc;
use std::time::Duration;

use protocol::{QuotaScope, TurnId};
use tokio::time::Instant;

use super::counters::LIMITS_TTL;
use super::guard::HoldGuard;
use super::keys::{LevelKeys, hold_key};
use super::release::spawn_release;
use super::{Admitted, Class, Counted, Holder, Holds, Inner, TurnAdmission, millis, running_turn};
use crate::metrics::HoldResult;
use crate::quota::{
    Field, Levels, Limits, Periods, Quotas, RateLimitHeaders, Refusal, Standing, TeamSettings,
    TurnCounts,
};
use crate::redis::bounded;
use store::StoreError;

/// Rounds of `admit.lua` at most: reload the limits, rebuild the team's and the user's
/// counters, then decide.
const ROUNDS: usize = 4;

impl Holds {
    /// T9 and T2 in one round trip: busy, refused by a team quota, or held with the
    /// turn's tokens reserved. A missing limits hash or budget counter costs one Postgres
    /// read and one more round trip (at most once a minute and once an hour per team).
    /// Postgres failing while it is needed is an error: quotas are never skipped.
    pub async fn admit(
        &self,
        quotas: &Quotas,
        admission: TurnAdmission<'_>,
    ) -> Result<Admitted, StoreError> {
        let admitted = self.decide(quotas, admission).await;
        let result = match &admitted {
            Ok(Admitted::Held { .. }) => Some(HoldResult::Acquired),
            Ok(Admitted::Busy { .. }) => Some(HoldResult::Busy),
            Ok(Admitted::Unavailable) => Some(HoldResult::Unavailable),
            // A quota refusal is counted by quota; a store failure fails the request.
            Ok(Admitted::Refused(_)) | Err(_) => None,
        };
        if let Some(result) = result {
            self.inner.metrics.hold(result);
        }
        admitted
    }

    async fn decide(
        &self,
        quotas: &Quotas,
        admission: TurnAdmission<'_>,
    ) -> Result<Admitted, StoreError> {
        let admitting = Admitting::new(&self.inner, admission);
        let mut limits: Option<LoadedLimits> = None;
        for _ in 0..ROUNDS {
            let answer = match admitting.call(limits.as_ref()).await {
                Ok(answer) => answer,
                Err(class) => return Ok(admitting.unavailable(class)),
            };
            match answer {
                AdmitAnswer::Busy(current) => return admitting.busy(quotas, current).await,
                AdmitAnswer::Limits => limits = Some(LoadedLimits::load(quotas, admission).await?),
                AdmitAnswer::Rebuild { user } => {
                    // Nothing was taken yet: the script answers this before the hold.
                    if let Err(class) = admitting.rebuild(quotas, user).await? {
                        admitting.inner.metrics.hold_unavailable.inc();
                        tracing::warn!(
                            agent = %admission.agent,
                            turn = %admission.turn,
                            class,
                            "quota counters could not be rebuilt; enforcing from Postgres"
                        );
                        return Ok(Admitted::Unavailable);
                    }
                }
                AdmitAnswer::Held(levels) => return Ok(admitting.held(levels)),
                AdmitAnswer::Refused {
                    scope,
                    field,
                    levels,
                } => {
                    let refusal = refusal(&scope, &field, &levels, &admitting.periods);
                    return Ok(Admitted::Refused(refusal));
                }
                AdmitAnswer::Unknown => break,
            }
        }
        tracing::error!(turn = %admission.turn, "the admission script gave no decision");
        Ok(Admitted::Unavailable)
    }
}

/// One admission under way: the hold it asks for and the counters it counts at.
struct Admitting<'a> {
    inner: &'a Arc<Inner>,
    admission: TurnAdmission<'a>,
    acquired_at: Instant,
    periods: Periods,
    team: LevelKeys,
    user: Option<LevelKeys>,
    hold: String,
    value: String,
}

impl<'a> Admitting<'a> {
    fn new(inner: &'a Arc<Inner>, admission: TurnAdmission<'a>) -> Self {
        let acquired_at = Instant::now();
        let periods = inner.periods();
        Self {
            inner,
            admission,
            acquired_at,
            team: LevelKeys::team(admission.team, &periods),
            user: (admission.user).map(|user| LevelKeys::user(admission.team, user, &periods)),
            periods,
            hold: hold_key(admission.team, admission.agent),
            value: inner.value(admission.turn),
        }
    }

    /// One round of `admit.lua`, storing `limits` first when given; tried once more on a
    /// fresh connection when the shared one failed earlier.
    async fn call(&self, limits: Option<&LoadedLimits>) -> Result<AdmitAnswer, Class> {
        let inner = self.inner;
        let args = AdmitArgs {
            hold: &self.hold,
            team: &self.team,
            user: self.user.as_ref(),
            value: &self.value,
            expiry: inner.first_expiry(),
            turn: self.admission.turn,
            reservation: self.admission.reservation,
            limits,
            counted_ttl: inner.config.max_total * 2,
        };
        let script = &inner.scripts.admit;
        bounded(inner.config.op_timeout, async {
            let mut conn = inner.redis.get().await?;
            match args.invocation(script).invoke_async(&mut conn).await {
                Err(err) if err.is_io_error() => {
                    let mut conn = inner.redis.get().await?;
                    args.invocation(script).invoke_async(&mut conn).await
                }
                answer => answer,
            }
        })
        .await
        .map_err(|u| u.0)
        .map(AdmitAnswer::parse)
    }

    /// Redis failed: the hold may have been taken all the same, so it is freed in the
    /// background unless the call never reached Redis.
    fn unavailable(&self, class: Class) -> Admitted {
        let inner = self.inner;
        if class != "connection_refused" {
            spawn_release(inner.clone(), self.hold.clone(), self.value.clone(), None);
        }
        inner.metrics.hold_unavailable.inc();
        tracing::warn!(
            agent = %self.admission.agent,
            turn = %self.admission.turn,
            class,
            "turn hold and quota counters unavailable; enforcing from Postgres"
        );
        Admitted::Unavailable
    }

    /// The hold is taken: `busy` with `current`, unless that is our own value (an earlier
    /// try landed but its answer was lost), then held and counted.
    async fn busy(self, quotas: &Quotas, current: String) -> Result<Admitted, StoreError> {
        if current != self.value {
            return Ok(match running_turn(&current) {
                Some(running) => Admitted::Busy {
                    running,
                    holder: Holder::parse(&current),
                },
                None => Admitted::Unavailable,
            });
        }
        let admission = self.admission;
        let guard = self.start(true);
        let levels = stored_levels(quotas, admission).await?;
        Ok(Admitted::Held {
            guard,
            levels: Box::new(levels),
        })
    }

    /// Held: counted at the `levels` the script answered, or not at all without them.
    fn held(self, levels: Option<Levels>) -> Admitted {
        let counted = levels.is_some();
        Admitted::Held {
            guard: self.start(counted),
            levels: Box::new(levels.unwrap_or_default()),
        }
    }

    fn start(self, counted: bool) -> HoldGuard {
        let counted = counted.then(|| Counted {
            team: self.admission.team,
            turn: self.admission.turn,
            user: self.admission.user.map(str::to_owned),
        });
        HoldGuard::start(self.inner, self.hold, self.value, self.acquired_at, counted)
    }

    /// Rebuilds the missing counters of the team, or of its end user when `user`.
    async fn rebuild(&self, quotas: &Quotas, user: bool) -> Result<Result<(), Class>, StoreError> {
        let user = if user { self.admission.user } else { None };
        self.inner
            .rebuild(quotas, self.admission.team, user, &self.periods)
            .await
    }
}

/// The turn limits from Postgres, for an admission whose script answer was lost: no
/// counts, as if the turn were the first.
async fn stored_levels(
    quotas: &Quotas,
    admission: TurnAdmission<'_>,
) -> Result<Levels, StoreError> {
    let limits = quotas.limits(admission.team).await?;
    let user = match admission.user {
        Some(user) => Some(quotas.user_limits(admission.team, user).await?),
        None => None,
    };
    let level = |limits: &Limits| Standing {
        limits: turn_limits(limits),
        counts: TurnCounts::default(),
    };
    Ok(Levels {
        team: level(&limits),
        user: user
            .filter(|u| u.limits.limits_turns())
            .map(|u| level(&u.limits)),
    })
}

/// `admit.lua`'s keys and arguments, in the order its head comment gives them.
struct AdmitArgs<'a> {
    hold: &'a str,
    team: &'a LevelKeys,
    /// An end user's turn's level (L4).
    user: Option<&'a LevelKeys>,
    /// The new hold's value and expiry.
    value: &'a str,
    expiry: Duration,
    turn: TurnId,
    reservation: u64,
    /// Read from Postgres because the script asked: it stores them before deciding.
    limits: Option<&'a LoadedLimits>,
    /// How long the running turns and the reservations outlive their last write.
    counted_ttl: Duration,
}

impl AdmitArgs<'_> {
    fn invocation<'s>(&self, script: &'s redis::Script) -> redis::ScriptInvocation<'s> {
        let mut invocation = script.prepare_invoke();
        invocation.key(self.hold);
        for keys in std::iter::once(self.team).chain(self.user) {
            invocation
                .key(&keys.limits)
                .key(&keys.running)
                .key(&keys.reserved)
                .key(&keys.reserved_total)
                .key(&keys.starts)
                .key(&keys.day)
                .key(&keys.month);
        }
        let settings = self.limits.map(|l| l.settings).unwrap_or_default();
        invocation
            .arg(self.value)
            .arg(millis(self.expiry))
            .arg(self.turn.to_string())
            .arg(self.reservation)
            .arg(if self.limits.is_some() { "1" } else { "" })
            .arg(millis(LIMITS_TTL))
            .arg(&turn_limit_args(&settings.limits))
            .arg(millis(self.counted_ttl))
            .arg(&turn_limit_args(&settings.per_user))
            .arg(if settings.users_overridden { "1" } else { "" });
        let overrides = self.limits.and_then(|l| l.user.as_ref());
        for field in TURN_FIELDS {
            invocation.arg(override_arg(overrides, field));
        }
        invocation
    }
}

/// `admit.lua`'s answer.
#[derive(Debug)]
enum AdmitAnswer {
    /// The agent is held: the holder's value.
    Busy(String),
    /// No limits are stored: call again with them.
    Limits,
    /// A budget counter of the team, or of the user when `user`, is missing: rebuild it,
    /// then call again.
    Rebuild { user: bool },
    /// Held, with the standings of the levels counted; `None` when no level has a turn
    /// limit (the turn is not counted).
    Held(Option<Levels>),
    /// Refused at a level (`team` or `user`) for a field, with the standings.
    Refused {
        scope: String,
        field: String,
        levels: Levels,
    },
    /// Anything else: a script out of step with this file.
    Unknown,
}

impl AdmitAnswer {
    fn parse(answer: Vec<String>) -> Self {
        let at = |i: usize| answer.get(i).cloned().unwrap_or_default();
        match answer.first().map(String::as_str) {
            Some("busy") => Self::Busy(at(1)),
            Some("limits") => Self::Limits,
            Some("rebuild") => Self::Rebuild {
                user: answer.get(1).is_some_and(|level| level == "user"),
            },
            Some("ok") if answer.len() == 1 => Self::Held(None),
            Some("ok") => Self::Held(Some(parse_levels(&answer[1..]))),
            Some("refused") => Self::Refused {
                scope: at(1),
                field: at(2),
                levels: parse_levels(answer.get(3..).unwrap_or_default()),
            },
            _ => Self::Unknown,
        }
    }
}

/// The refusal the admission script answered, as `quota::fallback::decide_levels` words
/// it.
fn refusal(scope: &str, field: &str, levels: &Levels, periods: &Periods) -> Refusal {
    if let Some(refusal) = crate::quota::fallback::decide_levels(levels, periods)
        .filter(|r| r.field.name() == field && r.scope.as_str() == scope)
    {
        return refusal;
    }
    // The script and `decide_levels` disagree: a bug, but refusing is the safe side.
    tracing::error!(
        field,
        scope,
        "quota script refused for a reason decide_levels() does not see"
    );
    Refusal {
        scope: QuotaScope::Team,
        field: Field::ConcurrentTurns,
        limit: levels.team.limits.concurrent_turns.unwrap_or_default(),
        retry_after: Duration::from_secs(1),
        headers: RateLimitHeaders::levels(levels, periods),
    }
}

/// The turn limits as the admission script stores them.
fn turn_limits(limits: &Limits) -> Limits {
    Limits {
        tokens_per_day: limits.tokens_per_day,
        tokens_per_month: limits.tokens_per_month,
        turns_per_minute: limits.turns_per_minute,
        concurrent_turns: limits.concurrent_turns,
        ..Limits::default()
    }
}

/// The turn limits in the order the admission script takes and answers them.
const TURN_FIELDS: [Field; 4] = [
    Field::TokensPerDay,
    Field::TokensPerMonth,
    Field::TurnsPerMinute,
    Field::ConcurrentTurns,
];

/// A level's turn limits as script arguments: a count, or empty for unlimited.
fn turn_limit_args(limits: &Limits) -> [String; 4] {
    TURN_FIELDS.map(|f| limits.get(f).map(|v| v.to_string()).unwrap_or_default())
}

/// A user's override of one turn limit as a script argument: a count, empty for
/// unlimited, `-` for none (the team's `per_user` applies).
fn override_arg(overrides: Option<&serde_json::Value>, field: Field) -> String {
    match overrides.and_then(|o| o.get(field.name())) {
        Some(serde_json::Value::Null) => String::new(),
        Some(v) if v.is_u64() => v.to_string(),
        _ => "-".to_owned(),
    }
}

/// What `Holds::admit` read from Postgres when the script asked for the limits.
struct LoadedLimits {
    settings: TeamSettings,
    /// The user's stored overrides, for an end user's turn.
    user: Option<serde_json::Value>,
}

impl LoadedLimits {
    async fn load(quotas: &Quotas, admission: TurnAdmission<'_>) -> Result<Self, StoreError> {
        let settings = quotas.settings(admission.team).await?;
        let user = match admission.user {
            Some(user) => Some(quotas.user_limits(admission.team, user).await?.overrides),
            None => None,
        };
        Ok(Self { settings, user })
    }
}

/// The standings at the end of an `admit.lua` answer: the team's, then the user's if there.
fn parse_levels(fields: &[String]) -> Levels {
    Levels {
        team: parse_standing(fields),
        user: (fields.len() >= 18).then(|| parse_standing(&fields[9..])),
    }
}

/// One level's counts and limits in an `admit.lua` answer.
fn parse_standing(fields: &[String]) -> Standing {
    let n = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    Standing {
        counts: TurnCounts {
            concurrent_turns: n(0).unwrap_or_default(),
            turns_in_window: n(1).unwrap_or_default(),
            window_reset: Duration::from_millis(n(2).unwrap_or_default()),
            tokens_day: n(3).unwrap_or_default(),
            tokens_month: n(4).unwrap_or_default(),
        },
        limits: Limits {
            tokens_per_day: n(5),
            tokens_per_month: n(6),
            turns_per_minute: n(7),
            concurrent_turns: n(8),
            ..Limits::default()
        },
    }
}
