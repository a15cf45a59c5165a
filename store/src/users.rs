//! A team's end users as the deployment knows them (X1): disabled by an admin, and the
//! admin claim of the latest token of theirs seen. Nothing here is a profile: a user the
//! deployment never saw and nobody disabled has no row.

use protocol::TeamId;

use super::audit::{self, Action, Actor};
use super::{Store, StoreError};

/// What the deployment knows of one end user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeamUser {
    pub sub: String,
    pub disabled: bool,
    /// The admin claim of the latest token of theirs seen; `None` before any was.
    pub admin: Option<bool>,
}

impl Store {
    /// `sub` of `team`; `None` when never seen nor disabled.
    pub async fn team_user(&self, team: TeamId, sub: &str) -> Result<Option<TeamUser>, StoreError> {
        let row: Option<(bool, Option<bool>)> = sqlx::query_as(
            "SELECT disabled_at IS NOT NULL, admin FROM team_users WHERE team_id = $1 AND sub = $2",
        )
        .bind(team.0)
        .bind(sub)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(disabled, admin)| TeamUser {
            sub: sub.to_owned(),
            disabled,
            admin,
        }))
    }

    /// Disables `sub` of `team` (or enables them again), recorded `user.disabled` /
    /// `user.enabled` by `by`, in one transaction. `NotFound` for no such team.
    pub async fn set_user_disabled(
        &self,
        team: TeamId,
        sub: &str,
        disabled: bool,
        by: &Actor,
    ) -> Result<TeamUser, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(bool, Option<bool>)> = sqlx::query_as(
            "INSERT INTO team_users (team_id, sub, disabled_at) \
             SELECT id, $2, CASE WHEN $3 THEN now() END FROM teams WHERE id = $1 \
             ON CONFLICT (team_id, sub) DO UPDATE SET disabled_at = CASE WHEN $3 \
               THEN coalesce(team_users.disabled_at, now()) END \
             RETURNING disabled_at IS NOT NULL, admin",
        )
        .bind(team.0)
        .bind(sub)
        .bind(disabled)
        .fetch_optional(&mut *tx)
        .await?;
        let (disabled, admin) = row.ok_or(StoreError::NotFound)?;
        let action = if disabled {
            Action::UserDisabled
        } else {
            Action::UserEnabled
        };
        audit::record(&mut tx, team, by, action, sub, serde_json::json!({})).await?;
        tx.commit().await?;
        Ok(TeamUser {
            sub: sub.to_owned(),
            disabled,
            admin,
        })
    }

    /// Records the admin claim of a token of `sub` just seen, and answers what is known
    /// of them after it (a disabled user stays disabled).
    pub async fn saw_user(
        &self,
        team: TeamId,
        sub: &str,
        admin: bool,
    ) -> Result<TeamUser, StoreError> {
        let (disabled,): (bool,) = sqlx::query_as(
            "INSERT INTO team_users (team_id, sub, admin) VALUES ($1, $2, $3) \
             ON CONFLICT (team_id, sub) DO UPDATE SET admin = $3 \
             RETURNING disabled_at IS NOT NULL",
        )
        .bind(team.0)
        .bind(sub)
        .bind(admin)
        .fetch_one(&self.pool)
        .await?;
        Ok(TeamUser {
            sub: sub.to_owned(),
            disabled,
            admin: Some(admin),
        })
    }
}
