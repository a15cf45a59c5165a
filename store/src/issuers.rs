//! A team's own JWT issuers: `team_issuers`, each `iss` one team's across the
//! deployment. Created and deleted with their audit entry in one transaction.

use chrono::{DateTime, Utc};
use protocol::TeamId;
use serde::Serialize;
use uuid::Uuid;

use super::audit::{self, Action, Actor};
use super::{Keyset, Store, StoreError, keyset_after};

/// A team's issuer, as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct IssuerRow {
    pub id: Uuid,
    /// The `iss` its tokens carry.
    pub issuer: String,
    /// The `aud` its tokens must carry.
    pub audience: String,
    /// Where its signing keys are fetched.
    pub jwks_url: String,
    pub created_at: DateTime<Utc>,
}

/// Issuers per team: a few apps, not a registry.
pub const MAX_ISSUERS: i64 = 10;

type Row = (Uuid, String, String, String, DateTime<Utc>);

fn row((id, issuer, audience, jwks_url, created_at): Row) -> IssuerRow {
    IssuerRow {
        id,
        issuer,
        audience,
        jwks_url,
        created_at,
    }
}

impl Store {
    /// Adds an issuer to `team`; `Conflict` when the `iss` is taken (by any team) or the
    /// team has [`MAX_ISSUERS`] already.
    pub async fn create_issuer(
        &self,
        team: TeamId,
        issuer: &str,
        audience: &str,
        jwks_url: &str,
        by: &Actor,
    ) -> Result<IssuerRow, StoreError> {
        let mut tx = self.pool.begin().await?;
        // Serializes the count with other creations of the team's.
        sqlx::query("SELECT 1 FROM teams WHERE id = $1 FOR UPDATE")
            .bind(team.0)
            .execute(&mut *tx)
            .await?;
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM team_issuers WHERE team_id = $1")
            .bind(team.0)
            .fetch_one(&mut *tx)
            .await?;
        if count >= MAX_ISSUERS {
            return Err(StoreError::Conflict("a team may have at most 10 issuers"));
        }
        let created: Option<Row> = sqlx::query_as(
            "INSERT INTO team_issuers (id, team_id, issuer, audience, jwks_url) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (issuer) DO NOTHING \
             RETURNING id, issuer, audience, jwks_url, created_at",
        )
        .bind(Uuid::now_v7())
        .bind(team.0)
        .bind(issuer)
        .bind(audience)
        .bind(jwks_url)
        .fetch_optional(&mut *tx)
        .await?;
        let created = row(created.ok_or(StoreError::Conflict(
            "this issuer is registered already, by this team or another",
        ))?);
        let details = serde_json::json!({"issuer": issuer});
        audit::record(
            &mut tx,
            team,
            by,
            Action::IssuerCreated,
            created.id,
            details,
        )
        .await?;
        tx.commit().await?;
        Ok(created)
    }

    /// A page of the team's issuers, oldest first, after `after`.
    pub async fn list_issuers(
        &self,
        team: TeamId,
        after: Option<Keyset>,
        limit: i64,
    ) -> Result<Vec<IssuerRow>, StoreError> {
        let sql = format!(
            "SELECT id, issuer, audience, jwks_url, created_at FROM team_issuers \
             WHERE team_id = $1 AND {} ORDER BY created_at, id LIMIT $2",
            keyset_after(">", "$3", "$4")
        );
        let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(team.0)
            .bind(limit)
            .bind(after.map(|k| k.at))
            .bind(after.map(|k| k.id))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(row).collect())
    }

    /// One of the team's issuers; `NotFound` for another team's.
    pub async fn issuer(&self, team: TeamId, id: Uuid) -> Result<IssuerRow, StoreError> {
        let found: Option<Row> = sqlx::query_as(
            "SELECT id, issuer, audience, jwks_url, created_at FROM team_issuers \
             WHERE team_id = $1 AND id = $2",
        )
        .bind(team.0)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        found.map(row).ok_or(StoreError::NotFound)
    }

    /// The issuer whose `iss` this is, with its team: how a token finds its team.
    pub async fn issuer_by_iss(
        &self,
        iss: &str,
    ) -> Result<Option<(TeamId, IssuerRow)>, StoreError> {
        let found: Option<(Uuid, Uuid, String, String, String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT team_id, id, issuer, audience, jwks_url, created_at FROM team_issuers \
             WHERE issuer = $1",
        )
        .bind(iss)
        .fetch_optional(&self.pool)
        .await?;
        Ok(
            found.map(|(team, id, issuer, audience, jwks_url, created_at)| {
                (
                    TeamId(team),
                    row((id, issuer, audience, jwks_url, created_at)),
                )
            }),
        )
    }

    /// Deletes one of the team's issuers, answering it; `NotFound` for another team's.
    pub async fn delete_issuer(
        &self,
        team: TeamId,
        id: Uuid,
        by: &Actor,
    ) -> Result<IssuerRow, StoreError> {
        let mut tx = self.pool.begin().await?;
        let deleted: Option<Row> = sqlx::query_as(
            "DELETE FROM team_issuers WHERE team_id = $1 AND id = $2 \
             RETURNING id, issuer, audience, jwks_url, created_at",
        )
        .bind(team.0)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let deleted = row(deleted.ok_or(StoreError::NotFound)?);
        let details = serde_json::json!({"issuer": deleted.issuer});
        audit::record(&mut tx, team, by, Action::IssuerDeleted, id, details).await?;
        tx.commit().await?;
        Ok(deleted)
    }
}
