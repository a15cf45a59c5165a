//! The runtime-manager's one error enum. Logs carry [`Error::metric_label`], never the
//! inner message (it may echo a URL with credentials).

use channel::token::TokenError;
use queue::QueueError;

use crate::launcher::LaunchError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("store: {0}")]
    Store(#[from] sqlx::Error),
    /// A statement did not answer within its bound.
    #[error("store: no answer in time")]
    StoreTimeout,
    #[error("queue: {0}")]
    Queue(#[from] QueueError),
    #[error("launcher: {0}")]
    Launch(#[from] LaunchError),
    #[error("session token: {0}")]
    Token(#[from] TokenError),
    /// A live runtime-manager replica claimed the provision and is launching: the task is
    /// retried, and taken over if that replica's lease lapses meanwhile.
    #[error("another runtime-manager is launching this session")]
    ProvisionHeld,
    /// A metric registered twice or misnamed: a programming error.
    #[error("metrics registry: {0}")]
    Metrics(#[from] prometheus::Error),
    /// `RUNTIME_MANAGER_METRICS_ADDR` (or the egress proxy's) could not be bound.
    #[error("metrics listener: {0}")]
    MetricsListener(std::io::Error),
    /// `EGRESS_PROXY_ADDR` could not be bound.
    #[error("egress proxy listener: {0}")]
    ProxyListener(std::io::Error),
    /// The egress proxy could not reach Postgres at its start.
    #[error("egress proxy store: {0}")]
    ProxyStore(store::StoreError),
    /// The egress proxy's upstream roots could not be read.
    #[error("egress proxy: {0}")]
    Proxy(egress_proxy::ProxyError),
}

impl Error {
    /// A bounded label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Store(_) => "store",
            Self::StoreTimeout => "store_timeout",
            Self::Queue(e) => match e {
                QueueError::Redis(_) => "queue_redis",
                _ => "queue",
            },
            Self::Launch(e) => e.metric_label(),
            Self::Token(_) => "token",
            Self::ProvisionHeld => "provision_held",
            Self::Metrics(_) => "metrics",
            Self::MetricsListener(_) => "metrics_listener",
            Self::ProxyListener(_) => "egress_proxy_listener",
            Self::ProxyStore(_) => "egress_proxy_store",
            Self::Proxy(_) => "egress_proxy",
        }
    }
}
