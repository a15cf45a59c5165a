//! `PUT /v1/agents/{agent_id}/secrets/{secret_name}`: an agent's secret set by an admin
//! (B1, W13), in the store `secret_set` writes to. With `egress`, the value never enters
//! the agent's sandbox: its commands hold a placeholder under the name and the egress
//! proxy sets the value on requests to the secret's hosts (docs/design/egress.md).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use domain::egress::SecretEgress;
use protocol::ErrorBody;
use serde::Deserialize;

use super::{ClientAddr, JsonBody, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use engine::tools::secrets::{MAX_PER_AGENT, MAX_VALUE_BYTES, valid_name};
use store::{SecretsError, StoreError};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"value": "ghp_example", "egress": {"hosts": ["api.github.com"], "header": "Authorization", "format": "Bearer {value}"}}))]
pub struct PutAgentSecret {
    /// 1 to 8192 bytes. Stored encrypted; never shown again.
    value: String,
    /// Set it on the way out instead of in the commands' environment (W13); absent: an
    /// ordinary secret, in the environment of the agent's commands as before.
    #[serde(default)]
    egress: Option<SecretEgress>,
}

// `Debug` by hand: the derive would print the value.
impl std::fmt::Debug for PutAgentSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PutAgentSecret(redacted)")
    }
}

/// The checks `secret_set` makes (a name a shell can use and that reconfigures no tool,
/// a bounded value), and the egress settings' own (`SecretEgress::validate`).
fn check(name: &str, body: &PutAgentSecret) -> Result<(), ApiError> {
    if !valid_name(name) {
        return Err(ApiError::InvalidRequest(
            "a secret name is 1 to 64 of A-Z, 0-9 and _".into(),
        ));
    }
    if protocol::env::reserved(name) {
        return Err(ApiError::InvalidRequest(format!(
            "`{name}` is reserved: it would reconfigure the tools the agent's commands run"
        )));
    }
    if body.value.is_empty() || body.value.len() > MAX_VALUE_BYTES {
        return Err(ApiError::InvalidRequest(format!(
            "value must have 1 to {MAX_VALUE_BYTES} bytes"
        )));
    }
    match &body.egress {
        Some(egress) => egress
            .validate(&body.value)
            .map_err(ApiError::InvalidRequest),
        None => Ok(()),
    }
}

#[utoipa::path(
    put,
    path = "/agents/{agent_id}/secrets/{secret_name}",
    operation_id = "put_agent_secret",
    tag = "agents",
    params(
        ("agent_id" = Uuid, Path, description = "The agent."),
        ("secret_name" = String, Path, description = "The secret's name, `^[A-Z0-9_]{1,64}$`."),
    ),
    request_body = PutAgentSecret,
    responses(
        (status = 201, description = "Stored under a new name."),
        (status = 204, description = "Replaced the secret of an existing name (its value and \
            egress settings as a whole)."),
        (status = 400, description = "A bad name, value or `egress` field (the message names \
            it), or the agent has too many secrets (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such live agent in the team (`not_found`).", body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).", body = ErrorBody),
        (status = 501, description = "The server has no `BRAIN_SECRETS_KEY` (`not_configured`).",
            body = ErrorBody),
    ),
)]
pub async fn put(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path((agent_id, name)): Path<(String, String)>,
    JsonBody(body): JsonBody<PutAgentSecret>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let agent = parse_id(&agent_id, "agent")?;
    check(&name, &body)?;
    let by = principal.actor(address);
    let stored = tokio::time::timeout(
        store::CALL_BOUND,
        state.store.put_agent_secret(
            principal.team,
            agent,
            &name,
            &body.value,
            body.egress.as_ref(),
            MAX_PER_AGENT,
            &by,
        ),
    )
    .await
    .unwrap_or(Err(SecretsError::Store(StoreError::TimedOut)))
    .map_err(|err| match err {
        SecretsError::NotConfigured => ApiError::NotConfigured(
            "secrets are not configured on this server (BRAIN_SECRETS_KEY is unset)",
        ),
        SecretsError::TooMany => ApiError::InvalidRequest(format!(
            "an agent may have at most {MAX_PER_AGENT} secrets; replace one instead"
        )),
        SecretsError::Crypto => ApiError::Internal("a secret could not be sealed".into()),
        SecretsError::Store(StoreError::NotFound) => ApiError::NotFound("agent"),
        SecretsError::Store(e) => e.into(),
    })?;
    // As `secret_set`: the agent's live workers this replica holds get the new set (and
    // their proxies the new egress settings) before the answer.
    (state.sessions.on_secret_set())(principal.team, agent).await;
    tracing::info!(team = %principal.team, %agent, created = stored, egress = body.egress.is_some(), "agent secret stored");
    Ok(if stored {
        StatusCode::CREATED
    } else {
        StatusCode::NO_CONTENT
    })
}
