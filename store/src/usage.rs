//! A team's usage (SPEC E1): its billing events summed over a time range, grouped by day,
//! agent, model or end user (L4). The events themselves are written where they happen: model calls with
//! the turn's end state (`turns.rs`), worker-seconds by the runtime-manager's billing
//! sweep.
//!
//! One statement answers a page of the rows and the totals (`GROUPING SETS`), so the
//! totals are the database's sums, never a second read that could see other events. The
//! groups page by key (L3): the aggregation runs whole, the answer is bounded.

use chrono::{DateTime, Utc};
use protocol::TeamId;
use sqlx::Row;

use super::{Store, StoreError};

/// What the events are grouped by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UsageGroup {
    /// The UTC day of the event's `created_at` (the end of the interval it bills).
    Day,
    Agent,
    /// The model of a model call; worker-seconds have none, so they form the row whose
    /// key is `null`.
    Model,
    /// The end user (a JWT's subject) whose turn billed the event (L4); an API key's
    /// turns and worker-seconds have none, so they form the row whose key is `null`.
    User,
}

impl UsageGroup {
    const ALL: [Self; 4] = [Self::Day, Self::Agent, Self::Model, Self::User];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Agent => "agent",
            Self::Model => "model",
            Self::User => "user",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.as_str() == s)
    }

    /// The group key for [`Store::usage_models`], which groups by the model as well: a
    /// copy of the column when the key is the model, so the two grouping sets differ.
    fn cost_key_sql(self) -> &'static str {
        match self {
            Self::Model => "(model || '')",
            other => other.key_sql(),
        }
    }

    /// The group key as SQL text; a constant, never input.
    fn key_sql(self) -> &'static str {
        match self {
            Self::Day => "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
            Self::Agent => "agent_id::text",
            Self::Model => "model",
            Self::User => "user_id",
        }
    }
}

/// A validated usage question: `[from, to)`, grouped by `group_by`.
#[derive(Clone, Copy, Debug)]
pub struct UsageQuery {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub group_by: UsageGroup,
}

/// Sums over a set of billing events.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct UsageSums {
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub model_calls: i64,
    /// Seconds of worker lifetime, to the millisecond.
    pub worker_seconds: f64,
    /// USD of the model calls, at the catalog's prices (T16); `null` when a model used
    /// has no known price (a partial sum would understate it). Filled in by the engine.
    pub cost: Option<f64>,
}

#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct UsageRow {
    /// The day (`YYYY-MM-DD`), the agent id, the model (`null` for worker-seconds), or the
    /// user (`null` for an API key's turns and worker-seconds).
    pub key: Option<String>,
    /// For `group_by=agent`: the agent's name, `null` once the agent was deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub agent_name: Option<Option<String>>,
    #[serde(flatten)]
    pub sums: UsageSums,
}

#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct UsageReport {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub group_by: UsageGroup,
    /// A page of groups (L3), ordered by key (`null` last); only groups with events.
    pub rows: Vec<UsageRow>,
    /// `cursor` for the next page of groups; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub totals: UsageSums,
    /// Bytes the team's workspace snapshots (W10) hold in storage now, whatever the range.
    pub snapshot_bytes: i64,
}

impl Store {
    /// The team's usage for `query`: the totals, and up to `limit + 1` groups after the
    /// group keyed `after` (the caller pages them and sets `next_cursor`).
    pub async fn usage(
        &self,
        team: TeamId,
        query: UsageQuery,
        after: Option<&str>,
        limit: i64,
    ) -> Result<UsageReport, StoreError> {
        let sql = format!(
            "WITH g AS ( \
               SELECT {key} AS k, GROUPING({key}) = 1 AS total, \
                 COALESCE(sum(input_tokens) FILTER (WHERE kind = 'model_call'), 0)::int8 AS tokens_in, \
                 COALESCE(sum(output_tokens) FILTER (WHERE kind = 'model_call'), 0)::int8 AS tokens_out, \
                 count(*) FILTER (WHERE kind = 'model_call') AS model_calls, \
                 round(COALESCE(sum(seconds) FILTER (WHERE kind = 'worker_seconds'), 0)::numeric, 3)::float8 \
                   AS worker_seconds \
               FROM billing_events \
               WHERE team_id = $1 AND created_at >= $2 AND created_at < $3 \
               GROUP BY GROUPING SETS (({key}), ())) \
             SELECT g.*, a.name AS agent_name FROM g \
             LEFT JOIN agents a ON $4 AND NOT g.total AND a.team_id = $1 AND a.id::text = g.k \
             WHERE g.total OR $5::text IS NULL OR g.k > $5 OR g.k IS NULL \
             ORDER BY g.total DESC, g.k NULLS LAST LIMIT $6 + 2",
            key = query.group_by.key_sql()
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(query.from)
            .bind(query.to)
            .bind(query.group_by == UsageGroup::Agent)
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        let mut report = UsageReport {
            from: query.from,
            to: query.to,
            group_by: query.group_by,
            rows: Vec::with_capacity(rows.len()),
            next_cursor: None,
            totals: UsageSums::default(),
            snapshot_bytes: self.snapshot_bytes(team).await?,
        };
        for row in &rows {
            let sums = UsageSums {
                tokens_in: row.try_get("tokens_in")?,
                tokens_out: row.try_get("tokens_out")?,
                model_calls: row.try_get("model_calls")?,
                worker_seconds: row.try_get("worker_seconds")?,
                cost: None,
            };
            if row.try_get("total")? {
                report.totals = sums;
                continue;
            }
            report.rows.push(UsageRow {
                key: row.try_get("k")?,
                agent_name: (query.group_by == UsageGroup::Agent)
                    .then(|| row.try_get("agent_name"))
                    .transpose()?,
                sums,
            });
        }
        Ok(report)
    }
}

/// The tokens of each model (route) within a usage report's groups, for its cost.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelTokens {
    /// Over the whole range: (model, tokens in, tokens out).
    pub totals: Vec<(String, i64, i64)>,
    /// Per group asked for: (group key, model, tokens in, tokens out).
    pub groups: Vec<(Option<String>, String, i64, i64)>,
}

impl Store {
    /// The model calls of `query`'s range summed per model, over the whole range and per
    /// group of `keys` (a page of a report's groups, `None` the group without a key).
    pub async fn usage_models(
        &self,
        team: TeamId,
        query: UsageQuery,
        keys: &[Option<String>],
    ) -> Result<ModelTokens, StoreError> {
        let named: Vec<&str> = keys.iter().flatten().map(String::as_str).collect();
        let unnamed = keys.iter().any(Option::is_none);
        // `total` rows sum the whole range; the others only the groups asked for.
        let sql = format!(
            "SELECT {key} AS k, GROUPING({key}) = 1 AS total, model, \
               COALESCE(sum(input_tokens), 0)::int8 AS tokens_in, \
               COALESCE(sum(output_tokens), 0)::int8 AS tokens_out \
             FROM billing_events \
             WHERE team_id = $1 AND created_at >= $2 AND created_at < $3 \
               AND kind = 'model_call' AND model IS NOT NULL \
             GROUP BY GROUPING SETS (({key}, model), (model)) \
             HAVING GROUPING({key}) = 1 OR {key} = ANY($4) OR ({key} IS NULL AND $5)",
            key = query.group_by.cost_key_sql()
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(query.from)
            .bind(query.to)
            .bind(&named)
            .bind(unnamed)
            .fetch_all(&self.pool)
            .await?;
        let mut tokens = ModelTokens::default();
        for row in &rows {
            let model: String = row.try_get("model")?;
            let (tokens_in, tokens_out) = (row.try_get("tokens_in")?, row.try_get("tokens_out")?);
            if row.try_get("total")? {
                tokens.totals.push((model, tokens_in, tokens_out));
            } else {
                tokens
                    .groups
                    .push((row.try_get("k")?, model, tokens_in, tokens_out));
            }
        }
        Ok(tokens)
    }
}
