//! The egress proxies' side of the manager (W13, W14, W15; docs/design/egress.md): a
//! session's proxy configuration built from Postgres ([`policy_for`]), read afresh when a
//! client connection opens so that a secret or an allowlist changed during the session
//! applies to the connections that follow; and the writer of each session's ledger of
//! requests ([`LedgerWriter`]).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use egress_proxy::{EgressSecret, Record, SessionPolicy};
use prometheus::IntCounterVec;
use protocol::SessionId;
use store::{EgressRequest, SecretsError, StoreError};
use tokio_util::sync::CancellationToken;

/// How often a session's new records are written.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(2);
/// Records held for a write that failed, at most; more are counted as dropped.
const MAX_PENDING: usize = 2_000;

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

/// What a session's policy is where its agent says nothing: whether private addresses are
/// reachable (`EGRESS_ALLOW_PRIVATE_NETWORKS`), and whether an agent without `egress.allow`
/// reaches every public host (`open`, the local launcher's default, as before W14) or
/// only its egress secrets' hosts (the Kubernetes chart's, whose workers reached nothing
/// before the proxy: `EGRESS_DEFAULT_ALLOW=none`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EgressDefaults {
    pub allow_private_networks: bool,
    pub open: bool,
}

impl Default for EgressDefaults {
    fn default() -> Self {
        Self {
            allow_private_networks: false,
            open: true,
        }
    }
}

/// The proxy configuration of the worker launched as `launched` (a session, or a
/// warm-pool slot: a slot not yet claimed reaches no host). `store` carries the secrets
/// key (`Store::with_secrets_key`); the read is bounded by `store::CALL_BOUND`.
pub async fn policy_for(
    store: &store::Store,
    launched: SessionId,
    defaults: EgressDefaults,
) -> Result<SessionPolicy, EgressError> {
    let allow_private_networks = defaults.allow_private_networks;
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
        allow: parts
            .allow
            .map(|a| a.allow)
            .or_else(|| (!defaults.open).then(Vec::new)),
        secrets,
        allow_private_networks,
    };
    // Checked here, so a launch fails on it rather than the first request.
    egress_proxy::Policy::new(policy.clone())?;
    Ok(policy)
}

/// Writes sessions' proxy records to their ledger (`egress_requests`, W15) in batches,
/// and counts them in `runtime_manager_egress_requests_total{outcome}` (`forwarded`, or
/// the refusal class). Cheap to clone; one task per session ([`LedgerWriter::spawn`]).
#[derive(Clone)]
pub struct LedgerWriter {
    store: store::Store,
    requests: IntCounterVec,
}

impl LedgerWriter {
    /// `requests`: the counter of [`LedgerWriter::counter`], registered by its owner.
    pub fn new(store: store::Store, requests: IntCounterVec) -> Self {
        Self { store, requests }
    }

    /// `runtime_manager_egress_requests_total{outcome}`, not registered yet.
    pub fn counter() -> Result<IntCounterVec, prometheus::Error> {
        IntCounterVec::new(
            prometheus::Opts::new(
                "runtime_manager_egress_requests_total",
                "Requests through the sessions' egress proxies, by outcome (forwarded, or \
                 the proxy's refusal class).",
            ),
            &["outcome"],
        )
    }

    /// Writes the records of `session` (the proxy of the worker launched as `launched`)
    /// every two seconds until `stop`, then once more.
    pub fn spawn(
        &self,
        launched: SessionId,
        session: Arc<egress_proxy::Session>,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let writer = self.clone();
        tokio::spawn(async move {
            let mut pending = Pending::default();
            loop {
                let stopped = tokio::select! {
                    () = stop.cancelled() => true,
                    () = tokio::time::sleep(FLUSH_EVERY) => false,
                };
                writer.flush(launched, &session, &mut pending).await;
                if stopped {
                    break;
                }
            }
        })
    }

    /// Takes the proxy's new records and writes them with those a failed write left; on a
    /// failure they wait for the next flush (at most [`MAX_PENDING`]).
    pub async fn flush(
        &self,
        launched: SessionId,
        session: &egress_proxy::Session,
        pending: &mut Pending,
    ) {
        let (records, dropped) = session.take_records();
        pending.dropped += dropped;
        for record in records {
            let outcome = record.refused.unwrap_or("forwarded");
            self.requests.with_label_values(&[outcome]).inc();
            if pending.records.len() < MAX_PENDING {
                pending.records.push(stored(record));
            } else {
                pending.dropped += 1;
            }
        }
        if pending.records.is_empty() && pending.dropped == 0 {
            return;
        }
        let write = self
            .store
            .append_egress_requests(launched, &pending.records, pending.dropped);
        match tokio::time::timeout(store::CALL_BOUND, write).await {
            Ok(Ok(_)) => *pending = Pending::default(),
            Ok(Err(e)) => {
                tracing::warn!(session = %launched.0, error_class = e.metric_label(), "egress ledger not written")
            }
            Err(_) => tracing::warn!(session = %launched.0, "egress ledger write timed out"),
        }
    }
}

/// Records a writer holds until they are stored.
#[derive(Debug, Default)]
pub struct Pending {
    records: Vec<EgressRequest>,
    dropped: u64,
}

fn stored(record: Record) -> EgressRequest {
    EgressRequest {
        id: 0,
        host: record.host,
        port: record.port,
        method: record.method,
        status: record.status,
        refused: record.refused.map(str::to_owned),
        bytes_sent: record.bytes_sent,
        bytes_received: record.bytes_received,
        tls_ended: record.intercepted,
        at: DateTime::<Utc>::from(record.at),
    }
}
