//! Team quotas (SPEC T2, E2): what a team may spend and how fast, checked before spend.
//!
//! Six limits per team, each a count or unlimited: model tokens per UTC day and per UTC
//! month (input + output as billed), turns per minute (a sliding window over the last 60
//! seconds: exact, no burst at a window edge), concurrent turns, concurrent worker
//! sessions and worker-seconds per UTC day. The defaults come from `BRAIN_QUOTA_*`; a
//! team's overrides (`PUT /v1/quotas`) replace them field by field.
//!
//! Where each is enforced:
//! - turns: at intake, in the same Redis script as the agent's hold (`hold.rs`), before
//!   anything is written; tokens again before every further model call of the turn. Token
//!   budgets reserve the call's estimate (input estimate + output cap) and settle on the
//!   billed usage when the hold is released, so concurrent turns of one team overshoot a
//!   budget by at most one reservation. With Redis unreachable, [`fallback`] decides from
//!   Postgres instead (never open).
//! - worker sessions: before a session is provisioned or a pooled worker claimed
//!   ([`Quotas::admit_session`]), from Postgres: provisioning is rare and slow, so exact
//!   counts cost nothing that matters. A session counts for the user whose turn started
//!   it.
//!
//! Postgres is the truth: the Redis counters are rebuilt from its billing events when they
//! are missing and expire hourly, so drift heals.
//!
//! End users (L4): a JWT user's turns count against limits of the user's own under the
//! team's (the team's `per_user`, with the user's overrides over it field by field), in the
//! same script and the same fallback, and so do the worker sessions its turns start; an
//! API key's turns and sessions count at the team's level only.
//! A refusal names its level ([`Refusal::scope`]).

pub mod fallback;
mod headers;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Datelike, TimeZone, Utc};
use protocol::{ErrorCode, QuotaScope, TeamId};
use serde::{Deserialize, Deserializer, Serialize};

use crate::clock::Clock;
pub use headers::{Levels, RateLimitHeaders, Standing, TurnCounts};
use store::{Actor, BilledBefore, QuotaSettings, SessionUsage, Since, Store, StoreError, bounded};

/// One quota, by its wire name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    TokensPerDay,
    TokensPerMonth,
    TurnsPerMinute,
    ConcurrentTurns,
    ConcurrentSessions,
    WorkerSecondsPerDay,
}

impl Field {
    pub const ALL: [Self; 6] = [
        Self::TokensPerDay,
        Self::TokensPerMonth,
        Self::TurnsPerMinute,
        Self::ConcurrentTurns,
        Self::ConcurrentSessions,
        Self::WorkerSecondsPerDay,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::TokensPerDay => "tokens_per_day",
            Self::TokensPerMonth => "tokens_per_month",
            Self::TurnsPerMinute => "turns_per_minute",
            Self::ConcurrentTurns => "concurrent_turns",
            Self::ConcurrentSessions => "concurrent_sessions",
            Self::WorkerSecondsPerDay => "worker_seconds_per_day",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// A spent period budget is `quota_exhausted` (402: more time or money helps, a retry
    /// soon does not); a rate or concurrency limit is `quota_exceeded` (429).
    pub fn code(self) -> ErrorCode {
        match self {
            Self::TokensPerDay | Self::TokensPerMonth | Self::WorkerSecondsPerDay => {
                ErrorCode::QuotaExhausted
            }
            Self::TurnsPerMinute | Self::ConcurrentTurns | Self::ConcurrentSessions => {
                ErrorCode::QuotaExceeded
            }
        }
    }
}

/// A team's effective limits; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Limits {
    pub tokens_per_day: Option<u64>,
    pub tokens_per_month: Option<u64>,
    pub turns_per_minute: Option<u64>,
    pub concurrent_turns: Option<u64>,
    pub concurrent_sessions: Option<u64>,
    pub worker_seconds_per_day: Option<u64>,
}

impl Limits {
    pub fn get(&self, field: Field) -> Option<u64> {
        match field {
            Field::TokensPerDay => self.tokens_per_day,
            Field::TokensPerMonth => self.tokens_per_month,
            Field::TurnsPerMinute => self.turns_per_minute,
            Field::ConcurrentTurns => self.concurrent_turns,
            Field::ConcurrentSessions => self.concurrent_sessions,
            Field::WorkerSecondsPerDay => self.worker_seconds_per_day,
        }
    }

    pub fn set(&mut self, field: Field, value: Option<u64>) {
        *self.slot(field) = value;
    }

    fn slot(&mut self, field: Field) -> &mut Option<u64> {
        match field {
            Field::TokensPerDay => &mut self.tokens_per_day,
            Field::TokensPerMonth => &mut self.tokens_per_month,
            Field::TurnsPerMinute => &mut self.turns_per_minute,
            Field::ConcurrentTurns => &mut self.concurrent_turns,
            Field::ConcurrentSessions => &mut self.concurrent_sessions,
            Field::WorkerSecondsPerDay => &mut self.worker_seconds_per_day,
        }
    }

    /// Whether a worker session's start has anything to count.
    pub fn limits_sessions(&self) -> bool {
        self.concurrent_sessions.is_some() || self.worker_seconds_per_day.is_some()
    }

    /// Whether a turn's admission has anything to count: with no turn or token limit the
    /// hold's script skips the counters entirely.
    pub fn limits_turns(&self) -> bool {
        self.tokens_per_day.is_some()
            || self.tokens_per_month.is_some()
            || self.turns_per_minute.is_some()
            || self.concurrent_turns.is_some()
    }

    /// The defaults with a team's stored overrides applied. A stored field that is not a
    /// limit any more (or not a count) is ignored rather than failing every turn.
    pub fn with_overrides(mut self, overrides: &serde_json::Value) -> Self {
        if let Some(map) = overrides.as_object() {
            for (name, value) in map {
                if let Some(field) = Field::parse(name)
                    && (value.is_null() || value.is_u64())
                {
                    *self.slot(field) = value.as_u64();
                }
            }
        }
        self
    }
}

/// A request rate limit: a token bucket of `burst` requests refilled at
/// `per_second`, which each API key, each JWT user and each unauthenticated client address
/// has of its own (`crate::ratelimit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RequestLimit {
    /// Requests per second, sustained.
    #[serde(rename = "requests_per_second")]
    pub per_second: u64,
    /// Requests let through at once after a quiet spell.
    #[serde(rename = "request_burst")]
    pub burst: u64,
}

/// The largest request rate or burst: beyond it a limit is no limit, and a token bucket's
/// arithmetic in Redis' Lua (doubles) stays exact.
pub const MAX_REQUESTS: u64 = 1_000_000;

const REQUESTS_PER_SECOND: &str = "requests_per_second";
const REQUEST_BURST: &str = "request_burst";

impl RequestLimit {
    /// A team's request limit: `default` with the team's stored overrides over it. A
    /// `requests_per_second` of `null` is unlimited; a `request_burst` of `null` is one
    /// second's worth, and an absent one the default's. A stored value out of range is
    /// ignored rather than failing every request.
    pub fn with_overrides(default: Option<Self>, overrides: &serde_json::Value) -> Option<Self> {
        let count = |v: &serde_json::Value| v.as_u64().filter(|n| (1..=MAX_REQUESTS).contains(n));
        let per_second = match overrides.get(REQUESTS_PER_SECOND) {
            Some(v) if v.is_null() => None,
            Some(v) => count(v).or(default.map(|d| d.per_second)),
            None => default.map(|d| d.per_second),
        }?;
        let burst = match overrides.get(REQUEST_BURST) {
            Some(v) => count(v),
            None => default.map(|d| d.burst),
        };
        Some(Self {
            per_second,
            burst: burst.unwrap_or(per_second),
        })
    }
}

/// The body of `PUT /v1/quotas`: an absent field is left as it was, `null` makes it
/// unlimited, an integer sets it. `per_user` does the same to the limits each end user
/// (a JWT's subject) has under the team's (L4).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"turns_per_minute": 60, "tokens_per_day": null, "per_user": {"tokens_per_day": 100000}}))]
pub struct QuotaUpdate {
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1125899906842624_u64)]
    pub tokens_per_day: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1125899906842624_u64)]
    pub tokens_per_month: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1125899906842624_u64)]
    pub turns_per_minute: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1125899906842624_u64)]
    pub concurrent_turns: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1125899906842624_u64)]
    pub concurrent_sessions: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1125899906842624_u64)]
    pub worker_seconds_per_day: Option<Option<u64>>,
    /// Requests per second of each API key and each end user of the team, sustained;
    /// `null` is unlimited.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1000000)]
    pub requests_per_second: Option<Option<u64>>,
    /// Requests each of them may make at once after a quiet spell; `null` is one second's
    /// worth (`requests_per_second`).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1000000)]
    pub request_burst: Option<Option<u64>>,
    /// The limits of each end user, merged field by field like the team's.
    #[serde(default)]
    pub per_user: Option<LimitsUpdate>,
}

/// The body of `PUT /v1/quotas/users/{user_id}` (and `per_user` of `PUT /v1/quotas`): an
/// absent field is left as it was, `null` makes it unlimited, an integer sets it.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"tokens_per_day": 500000, "concurrent_turns": null}))]
pub struct LimitsUpdate {
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1125899906842624_u64)]
    pub tokens_per_day: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1125899906842624_u64)]
    pub tokens_per_month: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1125899906842624_u64)]
    pub turns_per_minute: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1125899906842624_u64)]
    pub concurrent_turns: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1125899906842624_u64)]
    pub concurrent_sessions: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 1125899906842624_u64)]
    pub worker_seconds_per_day: Option<Option<u64>>,
}

/// Tells a present `null` (`Some(None)`) from an absent field (`None`, by `default`).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<u64>>, D::Error> {
    Option::<u64>::deserialize(d).map(Some)
}

/// Larger values are typos, and Redis counts in signed 64-bit integers.
pub const MAX_LIMIT: u64 = 1 << 50;

impl QuotaUpdate {
    /// The fields to merge into the team's stored overrides and into its `per_user`, as
    /// JSON objects.
    pub fn into_patches(self) -> Result<(serde_json::Value, serde_json::Value), String> {
        let mut team = LimitsUpdate {
            tokens_per_day: self.tokens_per_day,
            tokens_per_month: self.tokens_per_month,
            turns_per_minute: self.turns_per_minute,
            concurrent_turns: self.concurrent_turns,
            concurrent_sessions: self.concurrent_sessions,
            worker_seconds_per_day: self.worker_seconds_per_day,
        }
        .into_patch("")?;
        for (name, value) in [
            (REQUESTS_PER_SECOND, self.requests_per_second),
            (REQUEST_BURST, self.request_burst),
        ] {
            let Some(value) = value else { continue };
            if value.is_some_and(|v| !(1..=MAX_REQUESTS).contains(&v)) {
                return Err(format!("{name} must be from 1 to {MAX_REQUESTS}"));
            }
            team[name] = value.into();
        }
        let per_user = self.per_user.unwrap_or_default().into_patch("per_user.")?;
        Ok((team, per_user))
    }
}

impl LimitsUpdate {
    /// The fields to merge into stored overrides, as a JSON object; `path` prefixes the
    /// field names in a refusal.
    pub fn into_patch(self, path: &str) -> Result<serde_json::Value, String> {
        let fields = [
            (Field::TokensPerDay, self.tokens_per_day),
            (Field::TokensPerMonth, self.tokens_per_month),
            (Field::TurnsPerMinute, self.turns_per_minute),
            (Field::ConcurrentTurns, self.concurrent_turns),
            (Field::ConcurrentSessions, self.concurrent_sessions),
            (Field::WorkerSecondsPerDay, self.worker_seconds_per_day),
        ];
        let mut patch = serde_json::Map::new();
        for (field, value) in fields {
            let Some(value) = value else { continue };
            if value.is_some_and(|v| v > MAX_LIMIT) {
                return Err(format!(
                    "{path}{} must be at most {MAX_LIMIT}",
                    field.name()
                ));
            }
            patch.insert(field.name().to_owned(), value.into());
        }
        Ok(serde_json::Value::Object(patch))
    }
}

/// The longest end-user id (a JWT's subject) a per-user limit is kept for, in bytes.
pub const MAX_USER_ID_BYTES: usize = 255;

/// A user id from a path: non-empty, at most [`MAX_USER_ID_BYTES`], no control character
/// (it becomes part of Redis keys and log-free error messages).
pub fn check_user_id(user: &str) -> Result<(), String> {
    if user.is_empty() {
        return Err("user_id must not be empty".into());
    }
    if user.len() > MAX_USER_ID_BYTES {
        return Err(format!("user_id must be at most {MAX_USER_ID_BYTES} bytes"));
    }
    if user.chars().any(char::is_control) {
        return Err("user_id must not contain control characters".into());
    }
    Ok(())
}

/// A refusal: which limit, its value, and when trying again can succeed.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// Whose limit: the team's, or the end user's under it (L4).
    pub scope: QuotaScope,
    pub field: Field,
    pub limit: u64,
    pub retry_after: Duration,
    /// The team's policies and what is left of them, for the response headers.
    pub headers: RateLimitHeaders,
}

impl Refusal {
    pub fn code(&self) -> ErrorCode {
        self.field.code()
    }

    pub fn message(&self) -> String {
        let who = match self.scope {
            QuotaScope::Team => "team",
            QuotaScope::User => "user",
        };
        let what = match self.field {
            Field::TokensPerDay => "'s model tokens for today are spent",
            Field::TokensPerMonth => "'s model tokens for this month are spent",
            Field::TurnsPerMinute => " started its limit of turns in the last minute",
            Field::ConcurrentTurns => " runs its limit of concurrent turns",
            Field::ConcurrentSessions => " runs its limit of concurrent worker sessions",
            Field::WorkerSecondsPerDay => "'s worker-seconds for today are spent",
        };
        format!(
            "the {who}{what} ({} = {}); retry after {} s",
            self.field.name(),
            self.limit,
            self.retry_after.as_secs().max(1)
        )
    }
}

/// The UTC periods the budgets count in, at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Periods {
    pub day_start: DateTime<Utc>,
    pub day_end: DateTime<Utc>,
    pub month_start: DateTime<Utc>,
    pub month_end: DateTime<Utc>,
    pub now: DateTime<Utc>,
}

impl Periods {
    pub fn at(now: DateTime<Utc>) -> Self {
        let date = now.date_naive();
        let midnight =
            |d: chrono::NaiveDate| Utc.from_utc_datetime(&d.and_time(chrono::NaiveTime::MIN));
        let day_start = midnight(date);
        let day_end = midnight(date.succ_opt().unwrap_or(date));
        let first = date.with_day(1).unwrap_or(date);
        let next_month = if first.month() == 12 {
            chrono::NaiveDate::from_ymd_opt(first.year() + 1, 1, 1)
        } else {
            chrono::NaiveDate::from_ymd_opt(first.year(), first.month() + 1, 1)
        }
        .unwrap_or(first);
        Self {
            day_start,
            day_end,
            month_start: midnight(first),
            month_end: midnight(next_month),
            now,
        }
    }

    /// The periods at `clock`'s present.
    pub fn now(clock: &Clock) -> Self {
        Self::at(clock.now())
    }

    /// The Redis key suffixes of the day's and the month's counters.
    pub fn day_tag(&self) -> String {
        self.day_start.format("%Y%m%d").to_string()
    }

    pub fn month_tag(&self) -> String {
        self.month_start.format("%Y%m").to_string()
    }

    /// Where the store counts these periods' usage from.
    pub fn since(&self) -> Since {
        Since {
            day: self.day_start,
            month: self.month_start,
            now: self.now,
        }
    }

    pub fn until_day_end(&self) -> Duration {
        (self.day_end - self.now).to_std().unwrap_or_default()
    }

    pub fn until_month_end(&self) -> Duration {
        (self.month_end - self.now).to_std().unwrap_or_default()
    }
}

/// What a team has used, as `GET /v1/quotas` shows it (from Postgres, the truth).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Used {
    pub tokens_per_day: u64,
    pub tokens_per_month: u64,
    pub turns_per_minute: u64,
    pub concurrent_turns: u64,
    pub concurrent_sessions: u64,
    pub worker_seconds_per_day: u64,
}

impl From<SessionUsage> for Used {
    fn from(sessions: SessionUsage) -> Self {
        Self {
            concurrent_sessions: sessions.live,
            worker_seconds_per_day: sessions.worker_seconds_day,
            ..Self::default()
        }
    }
}

/// A team's limits and its users' (L4), as stored with the defaults applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TeamSettings {
    pub limits: Limits,
    /// Each end user's limits unless overridden; all `None` when the team set none.
    pub per_user: Limits,
    /// Whether any user of the team has overrides: without them and without `per_user`,
    /// a user's turn counts at the team's level only.
    pub users_overridden: bool,
    /// What each of the team's keys and users may request; `None` is unlimited.
    pub requests: Option<RequestLimit>,
}

impl TeamSettings {
    /// Whether a user's turn may have a turn limit of its own to count against.
    pub fn users_limited(&self) -> bool {
        self.users_overridden || self.per_user.limits_turns()
    }
}

/// One end user's limits: the team's `per_user` with the user's overrides over it.
#[derive(Clone, Debug, PartialEq)]
pub struct UserLimits {
    pub limits: Limits,
    /// The user's stored overrides (`{}` for none), field by field.
    pub overrides: serde_json::Value,
}

impl UserLimits {
    fn new(per_user: &serde_json::Value, overrides: serde_json::Value) -> Self {
        Self {
            limits: Limits::default()
                .with_overrides(per_user)
                .with_overrides(&overrides),
            overrides,
        }
    }
}

/// The team's limits and their defaults, shared by the turn path, the session path and
/// the API.
#[derive(Clone)]
pub struct Quotas {
    store: Store,
    defaults: Arc<Limits>,
    requests: Option<RequestLimit>,
    clock: Clock,
}

impl Quotas {
    /// Without a request limit: [`Quotas::with_requests`] sets the default one.
    pub fn new(store: Store, defaults: Limits) -> Self {
        Self {
            store,
            defaults: Arc::new(defaults),
            requests: None,
            clock: Clock::system(),
        }
    }

    /// The clock whose present decides the periods usage counts in.
    pub fn with_clock(self, clock: Clock) -> Self {
        Self { clock, ..self }
    }

    /// The periods usage counts in now.
    pub fn periods(&self) -> Periods {
        Periods::now(&self.clock)
    }

    /// The request limit of a team that sets none (`BRAIN_RATE_LIMIT_*`).
    pub fn with_requests(self, requests: Option<RequestLimit>) -> Self {
        Self { requests, ..self }
    }

    pub fn defaults(&self) -> Limits {
        *self.defaults
    }

    /// A team's effective limits, read from Postgres.
    pub async fn limits(&self, team: TeamId) -> Result<Limits, StoreError> {
        Ok(self.settings(team).await?.limits)
    }

    /// A team's effective limits and what it says of its users' (L4), read from Postgres.
    pub async fn settings(&self, team: TeamId) -> Result<TeamSettings, StoreError> {
        let stored = bounded(self.store.quota_settings(team)).await?;
        Ok(self.settings_of(&stored))
    }

    /// Merges `update` into the team's overrides and its `per_user`; answers the new
    /// settings.
    pub async fn update(
        &self,
        team: TeamId,
        update: QuotaUpdate,
        by: &Actor,
    ) -> Result<TeamSettings, UpdateError> {
        let (patch, per_user) = update.into_patches().map_err(UpdateError::Invalid)?;
        let stored = bounded(
            self.store
                .merge_quota_overrides(team, &patch, &per_user, by),
        )
        .await?;
        Ok(self.settings_of(&stored))
    }

    fn settings_of(&self, stored: &QuotaSettings) -> TeamSettings {
        TeamSettings {
            limits: self.defaults.with_overrides(&stored.overrides),
            per_user: Limits::default().with_overrides(&stored.per_user),
            users_overridden: stored.users_overridden,
            requests: RequestLimit::with_overrides(self.requests, &stored.overrides),
        }
    }

    /// One user's limits (L4): the team's `per_user` with the user's overrides over it,
    /// field by field, and those overrides (`{}` for none).
    pub async fn user_limits(&self, team: TeamId, user: &str) -> Result<UserLimits, StoreError> {
        let (per_user, overrides) = bounded(self.store.user_quota(team, user)).await?;
        Ok(UserLimits::new(&per_user, overrides))
    }

    /// Merges `update` into one user's overrides; answers the user's limits after it.
    pub async fn update_user(
        &self,
        team: TeamId,
        user: &str,
        update: LimitsUpdate,
        by: &Actor,
    ) -> Result<UserLimits, UpdateError> {
        check_user_id(user).map_err(UpdateError::Invalid)?;
        let patch = update.into_patch("").map_err(UpdateError::Invalid)?;
        let (per_user, overrides) =
            bounded(self.store.merge_user_quota(team, user, &patch, by)).await?;
        Ok(UserLimits::new(&per_user, overrides))
    }

    /// Drops one user's overrides; false if it had none.
    pub async fn delete_user(
        &self,
        team: TeamId,
        user: &str,
        by: &Actor,
    ) -> Result<bool, StoreError> {
        bounded(self.store.delete_user_quota(team, user, by)).await
    }

    /// Billed model tokens this UTC day and month written more than `settled_for` ago, of
    /// the team or of one of its users, which the Redis counters are rebuilt from.
    pub async fn billed_tokens(
        &self,
        team: TeamId,
        user: Option<&str>,
        periods: &Periods,
        settled_for: Duration,
    ) -> Result<BilledBefore, StoreError> {
        bounded(
            self.store
                .billed_tokens(team, user, &periods.since(), settled_for),
        )
        .await
    }

    /// What the team has used in each quota's window, from Postgres.
    pub async fn used(&self, team: TeamId, periods: &Periods) -> Result<Used, StoreError> {
        let since = periods.since();
        let (turns, sessions) = bounded(async {
            let turns = self.store.turn_usage(team, None, &since).await?;
            Ok((turns, self.store.session_usage(team, None, &since).await?))
        })
        .await?;
        Ok(Used {
            tokens_per_day: turns.tokens_day,
            tokens_per_month: turns.tokens_month,
            turns_per_minute: turns.recent,
            concurrent_turns: turns.running,
            ..Used::from(sessions)
        })
    }

    /// What one user used in each quota's window, from Postgres: its turns, and the worker
    /// sessions its turns started.
    pub async fn used_by_user(
        &self,
        team: TeamId,
        user: &str,
        periods: &Periods,
    ) -> Result<Used, StoreError> {
        let since = periods.since();
        let (turns, sessions) = bounded(async {
            let turns = self.store.turn_usage(team, Some(user), &since).await?;
            Ok((
                turns,
                self.store.session_usage(team, Some(user), &since).await?,
            ))
        })
        .await?;
        Ok(Used {
            tokens_per_day: turns.tokens_day,
            tokens_per_month: turns.tokens_month,
            turns_per_minute: turns.recent,
            concurrent_turns: turns.running,
            ..Used::from(sessions)
        })
    }

    /// W2/E2: may the team, and the end user whose turn asks (L4), start one more worker
    /// session? Checked before a session is provisioned or a pooled worker claimed; the
    /// team's limits first, then the user's; the refusal is a tool error for the model.
    /// From Postgres, whether Redis answers or not.
    pub async fn admit_session(
        &self,
        team: TeamId,
        user: Option<&str>,
    ) -> Result<Option<Refusal>, StoreError> {
        let settings = self.settings(team).await?;
        if let Some(refusal) = self.admit_session_at(team, None, &settings.limits).await? {
            return Ok(Some(refusal));
        }
        let Some(user) = user else { return Ok(None) };
        // Without a session limit in `per_user` nor any user's overrides, no user has one:
        // the common case reads nothing more.
        if !settings.users_overridden && !settings.per_user.limits_sessions() {
            return Ok(None);
        }
        let limits = self.user_limits(team, user).await?.limits;
        self.admit_session_at(team, Some(user), &limits).await
    }

    /// [`Quotas::admit_session`] at one level: the team's (`user` `None`) or a user's.
    async fn admit_session_at(
        &self,
        team: TeamId,
        user: Option<&str>,
        limits: &Limits,
    ) -> Result<Option<Refusal>, StoreError> {
        if !limits.limits_sessions() {
            return Ok(None);
        }
        let scope = match user {
            Some(_) => QuotaScope::User,
            None => QuotaScope::Team,
        };
        let periods = self.periods();
        let used =
            Used::from(bounded(self.store.session_usage(team, user, &periods.since())).await?);
        let headers = RateLimitHeaders::sessions(limits, &used, &periods);
        if let Some(limit) = limits.concurrent_sessions
            && used.concurrent_sessions >= limit
        {
            return Ok(Some(Refusal {
                scope,
                field: Field::ConcurrentSessions,
                limit,
                // A session ends when its chat goes idle; a minute is a fair first wait.
                retry_after: Duration::from_secs(60),
                headers,
            }));
        }
        if let Some(limit) = limits.worker_seconds_per_day
            && used.worker_seconds_per_day >= limit
        {
            return Ok(Some(Refusal {
                scope,
                field: Field::WorkerSecondsPerDay,
                limit,
                retry_after: periods.until_day_end(),
                headers,
            }));
        }
        Ok(None)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_replace_defaults_field_by_field() {
        let defaults = Limits {
            tokens_per_day: Some(1000),
            turns_per_minute: Some(10),
            ..Limits::default()
        };
        let limits = defaults.with_overrides(&serde_json::json!({
            "tokens_per_day": null,
            "concurrent_turns": 3,
            "retired_field": 7,
            "turns_per_minute": "ten"
        }));
        assert_eq!(limits.tokens_per_day, None, "null is unlimited");
        assert_eq!(limits.concurrent_turns, Some(3));
        assert_eq!(
            limits.turns_per_minute,
            Some(10),
            "a bad value keeps the default"
        );
        assert!(limits.limits_turns());
        assert!(!Limits::default().limits_turns());
    }

    #[test]
    fn an_update_tells_null_from_absent_and_refuses_junk() {
        let update: QuotaUpdate =
            serde_json::from_str(r#"{"tokens_per_day": null, "concurrent_turns": 4}"#).unwrap();
        assert_eq!(
            update.into_patches().unwrap(),
            (
                serde_json::json!({"tokens_per_day": null, "concurrent_turns": 4}),
                serde_json::json!({})
            )
        );
        let update: QuotaUpdate =
            serde_json::from_str(r#"{"per_user": {"turns_per_minute": 2}}"#).unwrap();
        assert_eq!(
            update.into_patches().unwrap().1,
            serde_json::json!({"turns_per_minute": 2})
        );
        assert!(serde_json::from_str::<QuotaUpdate>(r#"{"per_user": {"tokens": 1}}"#).is_err());
        assert!(check_user_id("").is_err());
        assert!(check_user_id(&"u".repeat(256)).is_err());
        assert!(check_user_id("auth0|user-1").is_ok());
        assert!(serde_json::from_str::<QuotaUpdate>(r#"{"tokens": 1}"#).is_err());
        assert!(serde_json::from_str::<QuotaUpdate>(r#"{"concurrent_turns": -1}"#).is_err());
        assert!(serde_json::from_str::<QuotaUpdate>(r#"{"concurrent_turns": 1.5}"#).is_err());
        let huge: QuotaUpdate =
            serde_json::from_str(&format!(r#"{{"tokens_per_day": {}}}"#, MAX_LIMIT + 1)).unwrap();
        assert!(huge.into_patches().is_err());
    }

    #[test]
    fn a_teams_request_limit_overrides_the_default_field_by_field() {
        let default = Some(RequestLimit {
            per_second: 200,
            burst: 400,
        });
        let of = |overrides: serde_json::Value| RequestLimit::with_overrides(default, &overrides);
        assert_eq!(of(serde_json::json!({})), default);
        assert_eq!(of(serde_json::json!({"requests_per_second": null})), None);
        assert_eq!(
            of(serde_json::json!({"requests_per_second": 5})),
            Some(RequestLimit {
                per_second: 5,
                burst: 400
            })
        );
        assert_eq!(
            of(serde_json::json!({"requests_per_second": 5, "request_burst": null})),
            Some(RequestLimit {
                per_second: 5,
                burst: 5
            }),
            "a null burst is one second's worth"
        );
        assert_eq!(
            of(serde_json::json!({"requests_per_second": 0})),
            default,
            "out of range"
        );
        assert_eq!(
            RequestLimit::with_overrides(None, &serde_json::json!({"requests_per_second": 3})),
            Some(RequestLimit {
                per_second: 3,
                burst: 3
            })
        );
        let update: QuotaUpdate = serde_json::from_str(r#"{"requests_per_second": 0}"#).unwrap();
        assert!(update.into_patches().is_err());
        let update: QuotaUpdate =
            serde_json::from_str(r#"{"requests_per_second": null, "request_burst": 9}"#).unwrap();
        assert_eq!(
            update.into_patches().unwrap().0,
            serde_json::json!({"requests_per_second": null, "request_burst": 9})
        );
    }

    #[test]
    fn periods_are_utc_days_and_months() {
        let now = Utc.with_ymd_and_hms(2026, 12, 31, 23, 59, 30).unwrap();
        let p = Periods::at(now);
        assert_eq!(p.day_tag(), "20261231");
        assert_eq!(p.month_tag(), "202612");
        assert_eq!(p.until_day_end(), Duration::from_secs(30));
        assert_eq!(p.until_month_end(), Duration::from_secs(30));
        assert_eq!(
            p.month_end,
            Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap()
        );
        let p = Periods::at(Utc.with_ymd_and_hms(2026, 2, 10, 12, 0, 0).unwrap());
        assert_eq!(
            p.month_start,
            Utc.with_ymd_and_hms(2026, 2, 1, 0, 0, 0).unwrap()
        );
        assert_eq!(
            p.month_end,
            Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap()
        );
    }
}
