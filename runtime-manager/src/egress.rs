//! The egress proxies' side of the manager (W13, W14; docs/design/egress.md): a session's
//! proxy configuration built from Postgres ([`policy_for`]), read afresh when a client
//! connection opens so that a secret or an allowlist changed during the session applies
//! to the connections that follow.

use egress_proxy::{EgressSecret, SessionPolicy};
use protocol::SessionId;
use store::{SecretsError, StoreError};

/// Why a session's egress configuration is not available.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The agent has egress secrets and the manager has no `BRAIN_SECRETS_KEY`: its
    /// commands must not run without them.
    #[error(
        "the agent has egress secrets, and BRAIN_SECRETS_KEY is not set on the runtime-manager"
    )]
    SecretsKeyMissing,
    #[error("the egress configuration could not be read: {0}")]
    Store(StoreError),
    /// What is stored does not make a configuration the proxy accepts.
    #[error("invalid egress configuration: {0}")]
    Policy(#[from] egress_proxy::ProxyError),
}

impl EgressError {
    /// A bounded label for logs, metrics and `failure_detail`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::SecretsKeyMissing => "egress_secrets_key_missing",
            Self::Store(StoreError::TimedOut) => "egress_store_timeout",
            Self::Store(_) => "egress_store",
            Self::Policy(_) => "egress_policy_invalid",
        }
    }
}

impl From<SecretsError> for EgressError {
    fn from(e: SecretsError) -> Self {
        match e {
            SecretsError::NotConfigured => Self::SecretsKeyMissing,
            SecretsError::Store(e) => Self::Store(e),
            // Unsealing failures are counted by the store, never returned; the rest are
            // writes.
            SecretsError::Crypto | SecretsError::TooMany => {
                Self::Store(StoreError::Corrupt("egress secrets".into()))
            }
        }
    }
}

/// The proxy configuration of the worker launched as `launched` (a session, or a
/// warm-pool slot: a slot not yet claimed reaches no host). `store` carries the secrets
/// key (`Store::with_secrets_key`); the read is bounded by `store::CALL_BOUND`.
pub async fn policy_for(
    store: &store::Store,
    launched: SessionId,
    allow_private_networks: bool,
) -> Result<SessionPolicy, EgressError> {
    let parts = tokio::time::timeout(store::CALL_BOUND, store.egress_policy_parts(launched))
        .await
        .map_err(|_| EgressError::Store(StoreError::TimedOut))??;
    let Some(parts) = parts else {
        return Ok(SessionPolicy {
            allow: Some(Vec::new()),
            secrets: Vec::new(),
            allow_private_networks,
        });
    };
    if parts.unreadable > 0 {
        tracing::warn!(
            session = %parts.session.0,
            unreadable = parts.unreadable,
            "egress secrets that do not decrypt under BRAIN_SECRETS_KEY are left out"
        );
    }
    let secrets = parts
        .secrets
        .into_iter()
        .map(|s| EgressSecret {
            name: s.name,
            value: s.value,
            hosts: s.egress.hosts,
            header: s.egress.header,
            format: s.egress.format,
        })
        .collect();
    let policy = SessionPolicy {
        allow: parts.allow.map(|a| a.allow),
        secrets,
        allow_private_networks,
    };
    // Checked here, so a launch fails on it rather than the first request.
    egress_proxy::Policy::new(policy.clone())?;
    Ok(policy)
}
