//! The egress proxy of a worker's commands (W13, W14; docs/design/egress.md). One proxy
//! serves one session: its commands reach the network only through it (the sandbox's
//! network namespace, or the worker pod's NetworkPolicy, has no other way out). It speaks
//! HTTP forward proxying and `CONNECT`:
//!
//! - a host off the session's allowlist, or an address the address rule refuses
//!   (`domain::address`), gets `403` with the reason in the body and in
//!   `x-egress-refused`;
//! - plain HTTP to an allowed host is forwarded, with the egress secrets meant for that
//!   host set in their headers (the sandbox holds only placeholders);
//! - `CONNECT` to a host with an egress secret ends TLS with a leaf certificate of the
//!   session's own CA (`ca.rs`), sets the secret, and talks TLS to the upstream verified
//!   against the system roots and the extra roots; `CONNECT` to any other allowed host is
//!   a tunnel the proxy does not look into;
//! - bounded: client connections at once, bytes both ways, and each connection's lifetime;
//! - every request (a tunnel counts as one) is recorded in the session's ledger (host,
//!   method, status, bytes; never a body, a header or a path).
//!
//! Layout: `policy.rs` the session's configuration and host matching; `ca.rs` the
//! per-session CA; `upstream.rs` resolving, the address rule, connecting, upstream TLS;
//! `serve.rs` the HTTP side; `ledger.rs` the records.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

mod ca;
mod ledger;
mod policy;
mod serve;
mod shared;
mod upstream;

pub use ledger::{Ledger, Record};
pub use policy::{EgressSecret, HostRule, Policy, SessionPolicy, placeholder};
pub use serve::CA_PATH;
pub use shared::{
    PolicyFuture, PolicySource, PolicyUnavailable, SESSION_KEY_LABEL, SessionKey, SharedCounts,
    SharedProxy, SharedSettings,
};

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("invalid egress configuration: {0}")]
    Policy(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("the proxy's socket: {0}")]
    Io(#[from] std::io::Error),
}

/// What one session may hold through its proxy.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Client connections open at once; one more is answered `503` and closed.
    pub max_connections: usize,
    /// Bytes both ways over the session's life; past it, transfers are cut.
    pub max_bytes: u64,
    /// How long one client connection (a tunnel included) may last.
    pub max_connection_time: Duration,
    /// Resolving and connecting to an upstream, and waiting for its response head.
    pub upstream_timeout: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_connections: 64,
            max_bytes: 1 << 30,
            max_connection_time: Duration::from_secs(30 * 60),
            upstream_timeout: Duration::from_secs(30),
        }
    }
}

/// A session's proxy state, shared by its connections.
pub struct Session {
    /// Replaced whole by [`Session::set_policy`]; a request reads the one in force when
    /// it arrives.
    policy: RwLock<Arc<Policy>>,
    ca: ca::SessionCa,
    ledger: Ledger,
    bounds: Bounds,
    upstream_tls: Arc<rustls::ClientConfig>,
}

impl Session {
    /// `extra_roots`: a PEM file of upstream roots trusted beside the system's.
    pub fn new(
        config: SessionPolicy,
        bounds: Bounds,
        extra_roots: Option<&Path>,
    ) -> Result<Arc<Self>, ProxyError> {
        let upstream_tls = upstream::client_config(extra_roots)?;
        Self::assemble(config, bounds, upstream_tls, ca::SessionCa::generate()?)
    }

    /// As [`Session::new`], with the CA derived from `key` for `session` rather than drawn:
    /// the same wherever and whenever it is made with that key, so a proxy made again for
    /// a live sandbox (a manager restarted, adopting its workers) signs with the CA the
    /// sandbox already trusts.
    pub fn keyed(
        config: SessionPolicy,
        bounds: Bounds,
        extra_roots: Option<&Path>,
        key: &SessionKey,
        session: &str,
    ) -> Result<Arc<Self>, ProxyError> {
        let upstream_tls = upstream::client_config(extra_roots)?;
        Self::assemble(config, bounds, upstream_tls, key.ca(session)?)
    }

    /// A session of `config` under `bounds`, signing with `ca`.
    pub(crate) fn assemble(
        config: SessionPolicy,
        bounds: Bounds,
        upstream_tls: Arc<rustls::ClientConfig>,
        ca: ca::SessionCa,
    ) -> Result<Arc<Self>, ProxyError> {
        Ok(Arc::new(Self {
            policy: RwLock::new(Arc::new(Policy::new(config)?)),
            ca,
            ledger: Ledger::default(),
            bounds,
            upstream_tls,
        }))
    }

    /// Replaces the session's configuration for the requests that follow (an allowlist or
    /// a secret changed during the session). An invalid one changes nothing.
    pub fn set_policy(&self, config: SessionPolicy) -> Result<(), ProxyError> {
        let policy = Arc::new(Policy::new(config)?);
        *self
            .policy
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = policy;
        Ok(())
    }

    pub(crate) fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The records not yet taken, oldest first, and how many were dropped since the last
    /// take because more than [`ledger::MAX_RECORDS`] waited: what a ledger writer stores.
    pub fn take_records(&self) -> (Vec<Record>, u64) {
        self.ledger.take()
    }

    /// The session CA's certificate (PEM), for the sandbox's trust store.
    pub fn ca_pem(&self) -> &str {
        self.ca.pem()
    }

    /// The session's requests, oldest first (the latest [`ledger::MAX_RECORDS`]).
    pub fn records(&self) -> Vec<Record> {
        self.ledger.records()
    }

    /// Client connections open now.
    pub fn open_connections(&self) -> usize {
        self.ledger.connections.load(Ordering::Acquire)
    }

    /// Serves one client connection (a TCP connection, or a unix socket bridged from a
    /// sandbox) until it ends, within the connection bound.
    pub async fn serve<IO>(self: Arc<Self>, mut io: IO)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let open = self.ledger.connections.fetch_add(1, Ordering::AcqRel);
        if open >= self.bounds.max_connections {
            self.ledger.connections.fetch_sub(1, Ordering::AcqRel);
            let _ = io
                .write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\nx-egress-refused: too_many_connections\r\n\
                      content-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
            return;
        }
        let limit = self.bounds.max_connection_time;
        let _ = tokio::time::timeout(limit, serve::client(self.clone(), io)).await;
        self.ledger.connections.fetch_sub(1, Ordering::AcqRel);
    }

    /// Holds a place under the connection bound for a tunnel, which outlives the serving
    /// of the request that opened it (the connection is handed over at the upgrade), until
    /// the guard drops. Past the bound already (the opening connection's place is being
    /// given back), it is taken all the same: the tunnel is that same connection.
    fn hold_connection(self: &Arc<Self>) -> ConnectionHeld {
        self.ledger.connections.fetch_add(1, Ordering::AcqRel);
        ConnectionHeld(self.clone())
    }
}

/// A place under the session's connection bound, given back on drop.
struct ConnectionHeld(Arc<Session>);

impl Drop for ConnectionHeld {
    fn drop(&mut self) {
        self.0.ledger.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A running proxy on a TCP listener.
pub struct EgressProxy {
    pub session: Arc<Session>,
    addr: SocketAddr,
    stop: CancellationToken,
}

impl EgressProxy {
    /// Serves `session` on `listener` until [`EgressProxy::stop`] (or the drop).
    pub fn start(listener: TcpListener, session: Arc<Session>) -> Result<Self, ProxyError> {
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let serving = session.clone();
        tokio::spawn(accept(listener, stop.clone(), move |stream| {
            serving.clone().serve(stream)
        }));
        Ok(Self {
            session,
            addr,
            stop,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes the listener and every connection.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

/// Accepts connections on `listener` until `stop`, each served by `serve` until it ends
/// or `stop`.
pub(crate) async fn accept<F, Fut>(listener: TcpListener, stop: CancellationToken, serve: F)
where
    F: Fn(tokio::net::TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                let served = serve(stream);
                let stop = stop.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = served => {}
                    }
                });
            }
            Err(e) => {
                // Out of descriptors, most likely: pause instead of spinning.
                tracing::warn!(error = %e.kind(), "egress proxy accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
