//! `runtime-manager egress-proxy`: the egress proxy every Kubernetes worker of the
//! deployment shares (W13, W14; docs/design/egress.md "On Kubernetes"). A mode of the
//! manager's binary rather than a binary of its own: it needs what the manager already
//! reads (`DATABASE_URL`, `BRAIN_SECRETS_KEY`, the egress settings) and the manager's
//! reading of a session's policy ([`crate::egress::policy_for`]), and the chart runs it
//! from the manager's image, so there is no third image to build, scan and publish.
//!
//! It serves `egress_proxy::SharedProxy` on `EGRESS_PROXY_ADDR` (`:3128` in the chart),
//! each session's policy read from Postgres when its connection opens, writes the
//! sessions' requests to their ledgers ([`LedgerWriter`]), and serves `GET /healthz` and
//! `GET /metrics` on `EGRESS_PROXY_METRICS_ADDR`.

use axum::http::header::CONTENT_TYPE;
use egress_proxy::{
    PolicyFuture, PolicySource, PolicyUnavailable, SessionKey, SharedProxy, SharedSettings,
};
use envcfg::{ConfigError, Env, non_empty, ranged, url_var};
use protocol::SessionId;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::config::{DEFAULT_DATABASE_URL, EgressConfig};
use crate::egress::{FLUSH_EVERY, LedgerWriter, Pending};

/// Where the proxy listens when `EGRESS_PROXY_ADDR` is unset: loopback (the chart sets
/// `0.0.0.0:3128`).
pub const DEFAULT_PROXY_ADDR: &str = "127.0.0.1:3128";
/// Where `/healthz` and `/metrics` are served when `EGRESS_PROXY_METRICS_ADDR` is unset.
pub const DEFAULT_PROXY_METRICS_ADDR: &str = "127.0.0.1:9466";
/// The Postgres connections of one proxy replica: a policy read is one short query pair.
const DATABASE_CONNECTIONS: u32 = 8;

/// The proxy's configuration.
#[derive(Debug)]
pub struct ProxyConfig {
    pub database_url: String,
    /// `DATABASE_DIRECT_URL`: `DATABASE_URL` is a transaction pooler (O5).
    pub database_direct_url: Option<String>,
    pub listen: SocketAddr,
    pub metrics: SocketAddr,
    /// `EGRESS_PROXY_MAX_SESSIONS`: sessions one replica keeps at once.
    pub max_sessions: usize,
    pub key: SessionKey,
    pub egress: EgressConfig,
}

impl ProxyConfig {
    pub fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        let cwd = std::env::current_dir().map_err(|_| ConfigError {
            name: "EGRESS_EXTRA_ROOTS",
            problem: "cannot be resolved: the current directory is unreadable".into(),
        })?;
        let egress = EgressConfig::from_env(env, &cwd)?;
        let key = egress.session_key().ok_or(ConfigError {
            name: "BRAIN_SECRETS_KEY",
            problem: "must be set for the egress proxy (sessions' credentials and CAs are \
                      derived from it)"
                .into(),
        })?;
        Ok(Self {
            database_url: url_var(env, "DATABASE_URL", DEFAULT_DATABASE_URL)?,
            database_direct_url: non_empty(env, "DATABASE_DIRECT_URL"),
            listen: envcfg::parse(env, "EGRESS_PROXY_ADDR", DEFAULT_PROXY_ADDR)?,
            metrics: envcfg::parse(env, "EGRESS_PROXY_METRICS_ADDR", DEFAULT_PROXY_METRICS_ADDR)?,
            max_sessions: ranged(env, "EGRESS_PROXY_MAX_SESSIONS", 1024, 1, 100_000)? as usize,
            key,
            egress,
        })
    }
}

/// A session's policy from Postgres, through [`crate::egress::policy_for`].
struct Policies {
    store: store::Store,
    defaults: crate::egress::EgressDefaults,
}

impl PolicySource for Policies {
    fn policy<'a>(&'a self, session: &'a str) -> PolicyFuture<'a> {
        Box::pin(async move {
            // The credential was checked first: only an id a launcher named gets here.
            let Ok(id) = session.parse() else {
                return Ok(None);
            };
            crate::egress::policy_for(&self.store, SessionId(id), self.defaults)
                .await
                .map(Some)
                .map_err(|e| PolicyUnavailable(e.metric_label()))
        })
    }
}

/// Runs the proxy until `shutdown`: both listeners bound and Postgres reached before it
/// reports ready, so a replica that cannot serve fails its start instead.
pub async fn run(config: ProxyConfig, shutdown: CancellationToken) -> Result<(), Error> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(Error::ProxyListener)?;
    let metrics_listener = TcpListener::bind(config.metrics)
        .await
        .map_err(Error::MetricsListener)?;
    // Logged as bound: a port 0 of the configuration is the one the system chose.
    let bound = listener.local_addr().map_err(Error::ProxyListener)?;
    let metrics_bound = metrics_listener
        .local_addr()
        .map_err(Error::MetricsListener)?;
    let store = store::Store::connect_configured(
        &config.database_url,
        config.database_direct_url.as_deref(),
        DATABASE_CONNECTIONS,
        store::DEFAULT_STATEMENT_TIMEOUT,
    )
    .await
    .map_err(Error::ProxyStore)?
    .with_secrets_key(config.egress.secrets_key.clone());
    let source = Arc::new(Policies {
        store: store.clone(),
        defaults: config.egress.defaults(),
    });
    let settings = SharedSettings {
        max_sessions: config.max_sessions,
        ..SharedSettings::default()
    };
    let proxy = SharedProxy::new(
        config.key,
        source,
        settings,
        config.egress.extra_roots.as_deref(),
    )
    .map_err(Error::Proxy)?;

    let registry = prometheus::Registry::new();
    let requests = LedgerWriter::counter()?;
    registry.register(Box::new(requests.clone()))?;
    let ledger = tokio::spawn(write_ledgers(
        proxy.clone(),
        LedgerWriter::new(store, requests),
        shutdown.clone(),
    ));

    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/metrics",
            axum::routing::get({
                let proxy = proxy.clone();
                move || {
                    let text = exposition(&proxy, &registry);
                    async move { ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text) }
                }
            }),
        );
    let metrics = tokio::spawn(
        axum::serve(metrics_listener, app)
            .with_graceful_shutdown(shutdown.clone().cancelled_owned())
            .into_future(),
    );
    tracing::info!(
        addr = %bound,
        metrics_addr = %metrics_bound,
        max_sessions = config.max_sessions,
        "egress proxy serving"
    );
    proxy.listen(listener, shutdown).await;
    let _ = ledger.await;
    let _ = metrics.await;
    Ok(())
}

/// Every [`FLUSH_EVERY`], each session's new records to its ledger (one writer for the
/// replica's sessions, a dropped session's flushed once more), and once more at `stop`.
async fn write_ledgers(proxy: Arc<SharedProxy>, writer: LedgerWriter, stop: CancellationToken) {
    let mut pending: HashMap<String, Pending> = HashMap::new();
    loop {
        let stopped = tokio::select! {
            () = stop.cancelled() => true,
            () = tokio::time::sleep(FLUSH_EVERY) => false,
        };
        let sessions = proxy.sessions_to_flush();
        for (id, session) in &sessions {
            let Ok(launched) = id.parse() else { continue };
            let held = pending.entry(id.clone()).or_default();
            writer.flush(SessionId(launched), session, held).await;
        }
        // What a dropped session's last flush could not write is given up with it.
        pending.retain(|id, _| sessions.iter().any(|(kept, _)| kept == id));
        if stopped {
            break;
        }
    }
}

/// The proxy's series in Prometheus' text format: connections by outcome and the sessions
/// kept (closed label sets; never a session id).
fn exposition(proxy: &SharedProxy, registry: &prometheus::Registry) -> String {
    let counts = &proxy.counts;
    let mut text = String::from(
        "# HELP egress_proxy_connections_total Client connections of the shared egress proxy, \
         by what became of them before their session served them.\n\
         # TYPE egress_proxy_connections_total counter\n",
    );
    for (outcome, counter) in [
        ("served", &counts.served),
        ("unauthorised", &counts.unauthorised),
        ("session_ended", &counts.ended),
        ("unavailable", &counts.unavailable),
    ] {
        let _ = writeln!(
            text,
            "egress_proxy_connections_total{{outcome=\"{outcome}\"}} {}",
            counter.load(Ordering::Relaxed)
        );
    }
    let _ = write!(
        text,
        "# HELP egress_proxy_sessions Sessions this replica keeps (each with its CA and bounds).\n\
         # TYPE egress_proxy_sessions gauge\n\
         egress_proxy_sessions {}\n",
        proxy.sessions()
    );
    let _ = prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut text);
    text
}
