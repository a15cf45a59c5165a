//! X1: a turn no stream follows (a background turn, a queued one, an approval's
//! continuation, an autostart, a turn taken over, a turn that outlives its client under
//! D1) still acts for its principal, and ends when that principal's authority does: its
//! API key revoked, its user or its team disabled, on any replica, within a second (the same
//! `auth:key-revoked` subscription that ends open streams). A streamed turn's stream
//! already ends it so.
//!
//! The check at start asks Postgres whether the key is live: the request that queued the
//! turn may be long gone. A standing that cannot be checked ends the turn as a revoked
//! one would: unknown is not live.

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::TurnError;
use crate::Engine;
use crate::auth::Authority;
use crate::auth::keys::Held;
use store::bounded;

/// A token cancelled when `authority`'s key is revoked, its user or `team` disabled, and
/// the hold on them; `Revoked` when one happened already. A token's expiry ends only its
/// stream, not its detached turns.
pub(super) async fn standing(
    state: &Engine,
    team: protocol::TeamId,
    authority: &Authority,
) -> Result<(CancellationToken, Option<Held>), TurnError> {
    let key = authority
        .actor
        .strip_prefix("key:")
        .and_then(|id| id.parse::<Uuid>().ok());
    let hash = match key {
        Some(id) => Some(
            bounded(state.store.live_key_hash(team, id))
                .await?
                .ok_or(TurnError::Revoked)?,
        ),
        None => {
            if bounded(state.store.team_disabled(team)).await? != Some(false) {
                return Err(TurnError::Revoked);
            }
            None
        }
    };
    let user = authority.user();
    if let Some(user) = user
        && bounded(state.store.team_user(team, user))
            .await?
            .is_some_and(|u| u.disabled)
    {
        return Err(TurnError::Revoked);
    }
    let (revoked, held) = state.auth.keys.hold(team, hash, user);
    if revoked.is_cancelled() {
        return Err(TurnError::Revoked);
    }
    Ok((revoked, held))
}

/// Cancels `cancel` once `authority` ends (or at once when it has ended, or cannot be
/// checked), until `ended` (the turn task's end). The token answers whether it did.
pub(super) async fn watch(
    state: &Engine,
    team: protocol::TeamId,
    authority: &Authority,
    cancel: &CancellationToken,
    ended: CancellationToken,
) -> CancellationToken {
    match standing(state, team, authority).await {
        Ok((revoked, held)) => {
            follow(revoked.clone(), held, cancel.clone(), ended);
            revoked
        }
        Err(err) => {
            if !matches!(err, TurnError::Revoked) {
                tracing::warn!(%team, code = err.code().as_str(), "could not check a detached turn's standing; it ends");
            }
            cancel.cancel();
            let lost = CancellationToken::new();
            lost.cancel();
            lost
        }
    }
}

/// Cancels `cancel` when `revoked` is, until `ended`; holds `held` meanwhile.
pub(super) fn follow(
    revoked: CancellationToken,
    held: Option<Held>,
    cancel: CancellationToken,
    ended: CancellationToken,
) {
    tokio::spawn(async move {
        tokio::select! {
            () = revoked.cancelled() => cancel.cancel(),
            () = ended.cancelled() => {}
        }
        drop(held);
    });
}
