//! `GET`, `PATCH /v1/users/{user_id}` (admin): what the deployment knows of one end user
//! of the team, and disabling them (X1). The brain keeps no directory of the people an
//! issuer signs tokens for: a disabled user's tokens are refused (`403 user_disabled`),
//! what they hold open and their detached turns end within a second, and a cadence they
//! set pauses at its next fire, until an admin enables them again.

use axum::Json;
use axum::extract::{Path, State};
use protocol::ErrorBody;
use serde::{Deserialize, Serialize};

use super::{ClientAddr, JsonBody};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use engine::quota::check_user_id;
use store::bounded;

/// One end user as the deployment knows them.
#[derive(Serialize, utoipa::ToSchema)]
pub struct UserView {
    /// A JWT's subject.
    user_id: String,
    /// Whether an admin disabled them.
    disabled: bool,
    /// The admin claim of the latest token of theirs seen; `null` before any was.
    admin: Option<bool>,
}

impl From<store::TeamUser> for UserView {
    fn from(user: store::TeamUser) -> Self {
        Self {
            user_id: user.sub,
            disabled: user.disabled,
            admin: user.admin,
        }
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateUser {
    /// `true` refuses the user's tokens and ends their detached work; `false` lets them in
    /// again.
    disabled: bool,
}

#[utoipa::path(
    get,
    path = "/users/{user_id}",
    operation_id = "get_user",
    tag = "users",
    params(("user_id" = String, Path, description = "The end user: a JWT's subject, 1 to 255 \
        bytes.")),
    responses(
        (status = 200, description = "What the deployment knows of the user; a user never \
            seen nor disabled is `{disabled: false, admin: null}`.", body = UserView),
        (status = 400, description = "A bad user id (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).",
            body = ErrorBody),
        (status = 503, description = "The store is unavailable (`store_unavailable`).",
            body = ErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path(user): Path<String>,
) -> Result<Json<UserView>, ApiError> {
    principal.require_admin()?;
    check_user_id(&user).map_err(ApiError::InvalidRequest)?;
    let known = bounded(state.store.team_user(principal.team, &user)).await?;
    Ok(Json(
        known
            .unwrap_or(store::TeamUser {
                sub: user,
                disabled: false,
                admin: None,
            })
            .into(),
    ))
}

#[utoipa::path(
    patch,
    path = "/users/{user_id}",
    operation_id = "update_user",
    tag = "users",
    params(("user_id" = String, Path, description = "The end user: a JWT's subject, 1 to 255 \
        bytes.")),
    request_body = UpdateUser,
    responses(
        (status = 200, description = "Disabled (their tokens answer `403 user_disabled`, \
            their streams and detached turns end within a second on every replica, a \
            cadence they set pauses `setter_revoked` at its next fire) or enabled again; \
            recorded `user.disabled` / `user.enabled`.", body = UserView),
        (status = 400, description = "A bad user id or body (`invalid_request`).",
            body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).",
            body = ErrorBody),
        (status = 503, description = "The store is unavailable (`store_unavailable`).",
            body = ErrorBody),
    ),
)]
pub async fn update(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(user): Path<String>,
    JsonBody(body): JsonBody<UpdateUser>,
) -> Result<Json<UserView>, ApiError> {
    principal.require_admin()?;
    check_user_id(&user).map_err(ApiError::InvalidRequest)?;
    let by = principal.actor(address);
    let changed = state
        .auth
        .keys
        .set_user_disabled(principal.team, &user, body.disabled, &by)
        .await?;
    Ok(Json(changed.into()))
}
