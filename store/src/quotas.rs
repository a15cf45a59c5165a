//! Team quota overrides and the counts quotas are checked against (T2, E2). Billing
//! events are the truth every count is taken from.

use std::time::Duration;

use chrono::{DateTime, Utc};
use protocol::TeamId;
use sqlx::Row;

use super::audit::{self, Action, Actor};
use super::{Store, StoreError};

/// Where a team's usage is counted from: the starts of the UTC day and month the quotas
/// count in, and the instant they are taken at.
#[derive(Clone, Copy, Debug)]
pub struct Since {
    pub day: DateTime<Utc>,
    pub month: DateTime<Utc>,
    pub now: DateTime<Utc>,
}

/// A team's worker sessions as Postgres sees them.
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionUsage {
    /// Sessions neither terminated nor failed.
    pub live: u64,
    /// Worker-seconds this UTC day.
    pub worker_seconds_day: u64,
}

/// A team's turn-path usage as Postgres sees it (Redis unreachable, or rebuilding).
#[derive(Clone, Copy, Debug, Default)]
pub struct TurnUsage {
    pub running: u64,
    /// Turns started in the last 60 seconds, and when the oldest of them leaves the window.
    pub recent: u64,
    pub window_reset: Duration,
    /// Billed model tokens (input + output) this UTC day and month.
    pub tokens_day: u64,
    pub tokens_month: u64,
}

/// Billed tokens of the UTC day and month before `cutoff` (`Store::billed_tokens`).
#[derive(Clone, Copy, Debug)]
pub struct BilledBefore {
    pub tokens_day: u64,
    pub tokens_month: u64,
    pub cutoff: DateTime<Utc>,
}

fn count(row: &sqlx::postgres::PgRow, column: &str) -> Result<u64, StoreError> {
    let value: i64 = row.try_get(column)?;
    Ok(u64::try_from(value).unwrap_or(0))
}

/// Billed tokens since `$2` (day) and `$3` (month) of the team, or of its user `$5` when
/// given (L4): one scan of the month's model calls.
const TOKENS: &str = "SELECT \
       coalesce(sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)) \
         FILTER (WHERE created_at >= $2), 0)::int8 AS tokens_day, \
       coalesce(sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)), 0)::int8 \
         AS tokens_month \
     FROM billing_events \
     WHERE team_id = $1 AND kind = 'model_call' AND created_at >= $3 \
       AND ($5::text IS NULL OR user_id = $5)";

/// A team's stored quota settings (`team_quotas`), `{}` where it has none.
#[derive(Clone, Debug)]
pub struct QuotaSettings {
    pub overrides: serde_json::Value,
    pub per_user: serde_json::Value,
    /// Whether any of its users has overrides (`user_quotas`).
    pub users_overridden: bool,
}

impl Store {
    /// The team's stored overrides and per-user limits.
    pub async fn quota_settings(&self, team: TeamId) -> Result<QuotaSettings, StoreError> {
        let (overrides, per_user, users_overridden): (
            Option<serde_json::Value>,
            Option<serde_json::Value>,
            bool,
        ) = sqlx::query_as(
            "SELECT q.overrides, q.per_user, \
               EXISTS (SELECT 1 FROM user_quotas WHERE team_id = $1) \
             FROM (SELECT 1) one LEFT JOIN team_quotas q ON q.team_id = $1",
        )
        .bind(team.0)
        .fetch_one(&self.pool)
        .await?;
        let empty = || serde_json::json!({});
        Ok(QuotaSettings {
            overrides: overrides.unwrap_or_else(empty),
            per_user: per_user.unwrap_or_else(empty),
            users_overridden,
        })
    }

    /// Merges `patch` into the overrides and `per_user` into the per-user limits (field →
    /// count or null); answers the result.
    pub async fn merge_quota_overrides(
        &self,
        team: TeamId,
        patch: &serde_json::Value,
        per_user: &serde_json::Value,
        by: &Actor,
    ) -> Result<QuotaSettings, StoreError> {
        let mut tx = self.pool.begin().await?;
        let (overrides, per_user_now, users_overridden): (
            serde_json::Value,
            serde_json::Value,
            bool,
        ) = sqlx::query_as(
            "INSERT INTO team_quotas (team_id, overrides, per_user) VALUES ($1, $2, $3) \
                 ON CONFLICT (team_id) DO UPDATE \
                   SET overrides = team_quotas.overrides || EXCLUDED.overrides, \
                       per_user = team_quotas.per_user || EXCLUDED.per_user, \
                       updated_at = now() \
                 RETURNING overrides, per_user, \
                   EXISTS (SELECT 1 FROM user_quotas WHERE team_id = $1)",
        )
        .bind(team.0)
        .bind(patch)
        .bind(per_user)
        .fetch_one(&mut *tx)
        .await?;
        let details = serde_json::json!({
            "fields": field_names(patch),
            "per_user_fields": field_names(per_user),
        });
        audit::record(&mut tx, team, by, Action::QuotasSet, team, details).await?;
        tx.commit().await?;
        Ok(QuotaSettings {
            overrides,
            per_user: per_user_now,
            users_overridden,
        })
    }

    /// The team's per-user limits and one user's overrides (`{}` for none).
    pub async fn user_quota(
        &self,
        team: TeamId,
        user: &str,
    ) -> Result<(serde_json::Value, serde_json::Value), StoreError> {
        let (per_user, overrides): (Option<serde_json::Value>, Option<serde_json::Value>) =
            sqlx::query_as(
                "SELECT (SELECT per_user FROM team_quotas WHERE team_id = $1), \
                   (SELECT overrides FROM user_quotas WHERE team_id = $1 AND user_id = $2)",
            )
            .bind(team.0)
            .bind(user)
            .fetch_one(&self.pool)
            .await?;
        let empty = || serde_json::json!({});
        Ok((
            per_user.unwrap_or_else(empty),
            overrides.unwrap_or_else(empty),
        ))
    }

    /// Merges `patch` into one user's overrides; answers the team's per-user limits and
    /// the user's overrides after it.
    pub async fn merge_user_quota(
        &self,
        team: TeamId,
        user: &str,
        patch: &serde_json::Value,
        by: &Actor,
    ) -> Result<(serde_json::Value, serde_json::Value), StoreError> {
        let mut tx = self.pool.begin().await?;
        let (per_user, overrides): (Option<serde_json::Value>, serde_json::Value) = sqlx::query_as(
            "WITH u AS ( \
                   INSERT INTO user_quotas (team_id, user_id, overrides) VALUES ($1, $2, $3) \
                   ON CONFLICT (team_id, user_id) DO UPDATE \
                     SET overrides = user_quotas.overrides || EXCLUDED.overrides, \
                         updated_at = now() \
                   RETURNING overrides) \
                 SELECT (SELECT per_user FROM team_quotas WHERE team_id = $1), u.overrides \
                 FROM u",
        )
        .bind(team.0)
        .bind(user)
        .bind(patch)
        .fetch_one(&mut *tx)
        .await?;
        let details = serde_json::json!({ "fields": field_names(patch) });
        audit::record(&mut tx, team, by, Action::UserQuotaSet, user, details).await?;
        tx.commit().await?;
        Ok((per_user.unwrap_or_else(|| serde_json::json!({})), overrides))
    }

    /// Drops one user's overrides; false if it had none.
    pub async fn delete_user_quota(
        &self,
        team: TeamId,
        user: &str,
        by: &Actor,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("DELETE FROM user_quotas WHERE team_id = $1 AND user_id = $2")
            .bind(team.0)
            .bind(user)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        let details = serde_json::json!({});
        audit::record(&mut tx, team, by, Action::UserQuotaDeleted, user, details).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Billed model tokens this UTC day and month, of the events written more than
    /// `settled_for` ago by Postgres' clock, and that cutoff: what a missing Redis counter
    /// is rebuilt from (the brain's `hold`). Events younger than the cutoff may still be
    /// committing; the counters take those from the turns' own settlements.
    pub async fn billed_tokens(
        &self,
        team: TeamId,
        user: Option<&str>,
        since: &Since,
        settled_for: Duration,
    ) -> Result<BilledBefore, StoreError> {
        let sql = format!(
            "SELECT t.*, c.at AS cutoff \
             FROM (SELECT now() - make_interval(secs => $4) AS at) c, \
             LATERAL ({TOKENS} AND created_at < c.at) t"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(since.day)
            .bind(since.month)
            .bind(settled_for.as_secs_f64())
            .bind(user)
            .fetch_one(&self.pool)
            .await?;
        Ok(BilledBefore {
            tokens_day: count(&row, "tokens_day")?,
            tokens_month: count(&row, "tokens_month")?,
            cutoff: row.try_get("cutoff")?,
        })
    }

    /// Everything the turn path counts, in one statement: the team's, or one user's
    /// (L4: its turns are those whose actor is `user:<subject>`).
    pub async fn turn_usage(
        &self,
        team: TeamId,
        user: Option<&str>,
        since: &Since,
    ) -> Result<TurnUsage, StoreError> {
        let sql = format!(
            "WITH tokens AS ({TOKENS}) \
             SELECT tokens.*, \
               (SELECT count(*) FROM turns WHERE team_id = $1 AND status = 'running' \
                  AND ($5::text IS NULL OR actor = 'user:' || $5)) AS running, \
               recent.n AS recent, \
               coalesce(extract(epoch FROM (recent.oldest + interval '60 seconds' - $4)) \
                 * 1000, 0)::int8 AS reset_ms \
             FROM tokens, \
               (SELECT count(*) AS n, min(started_at) AS oldest FROM turns \
                WHERE team_id = $1 AND started_at > $4 - interval '60 seconds' \
                  AND ($5::text IS NULL OR actor = 'user:' || $5)) AS recent"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(since.day)
            .bind(since.month)
            .bind(since.now)
            .bind(user)
            .fetch_one(&self.pool)
            .await?;
        Ok(TurnUsage {
            running: count(&row, "running")?,
            recent: count(&row, "recent")?,
            window_reset: Duration::from_millis(count(&row, "reset_ms")?),
            tokens_day: count(&row, "tokens_day")?,
            tokens_month: count(&row, "tokens_month")?,
        })
    }

    /// Live worker sessions and today's worker-seconds, of the team or of one of its users
    /// (L4: the sessions its turns started, and their events): the billed events, and what
    /// the billing sweep has not reached yet (the running minute of each live session).
    pub async fn session_usage(
        &self,
        team: TeamId,
        user: Option<&str>,
        since: &Since,
    ) -> Result<SessionUsage, StoreError> {
        let row = sqlx::query(
            "SELECT \
               (SELECT count(*) FROM agent_runtime_sessions \
                WHERE team_id = $1 AND state NOT IN ('terminated', 'failed') \
                  AND ($3::text IS NULL OR user_id = $3)) AS sessions, \
               (SELECT coalesce(sum(seconds), 0) FROM billing_events \
                WHERE team_id = $1 AND kind = 'worker_seconds' AND created_at >= $2 \
                  AND ($3::text IS NULL OR user_id = $3)) \
               + (SELECT coalesce(sum(greatest(extract(epoch FROM coalesce(ended_at, now()) \
                    - greatest(coalesce(billed_until, billing_from), $2)), 0)), 0) \
                  FROM agent_runtime_sessions \
                  WHERE team_id = $1 AND billing_from IS NOT NULL \
                    AND (ended_at IS NULL OR billed_until IS NULL OR billed_until < ended_at) \
                    AND ($3::text IS NULL OR user_id = $3)) \
               AS seconds_raw",
        )
        .bind(team.0)
        .bind(since.day)
        .bind(user)
        .fetch_one(&self.pool)
        .await?;
        let seconds: f64 = row.try_get("seconds_raw")?;
        Ok(SessionUsage {
            live: count(&row, "sessions")?,
            worker_seconds_day: seconds.max(0.0).ceil() as u64,
        })
    }
}

/// The field names a quota patch sets (for the audit entry: names, never values).
fn field_names(patch: &serde_json::Value) -> Vec<&String> {
    patch
        .as_object()
        .into_iter()
        .flat_map(|p| p.keys())
        .collect()
}
