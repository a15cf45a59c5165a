//! The way out: a host name resolved, every address judged by the address rule
//! (`domain::address`), a TCP connection to a judged address only (so a name cannot
//! resolve to another address in between), and TLS to the upstream verified against the
//! system roots plus the operator's extra roots.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::ProxyError;

/// The aws-lc-rs provider the workspace builds, named explicitly (no process default).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The TLS client configuration for upstreams: the system roots (read as
/// `rustls-native-certs` reads them) and every certificate of `extra_roots` (a PEM file,
/// `SSL_CERT_FILE` for the proxy binary).
pub fn client_config(extra_roots: Option<&Path>) -> Result<Arc<ClientConfig>, ProxyError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = extra_roots {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| ProxyError::Tls(format!("extra roots {}: {e}", path.display())))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ProxyError::Tls(format!("extra roots {}: {e}", path.display())))?;
        roots.add_parsable_certificates(certs);
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ProxyError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Why a connection was not made: a class for the ledger and the `403`/`502` reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    NotAllowed,
    Address(domain::address::Refused),
    Unresolved,
    Unreachable,
    Timeout,
}

impl Refusal {
    pub fn class(self) -> &'static str {
        match self {
            Self::NotAllowed => "host_not_allowed",
            Self::Address(refused) => refused.class(),
            Self::Unresolved => "name_not_resolved",
            Self::Unreachable => "upstream_unreachable",
            Self::Timeout => "upstream_timeout",
        }
    }

    /// The HTTP status the command receives.
    pub fn status(self) -> http::StatusCode {
        match self {
            Self::NotAllowed | Self::Address(_) => http::StatusCode::FORBIDDEN,
            Self::Timeout => http::StatusCode::GATEWAY_TIMEOUT,
            Self::Unresolved | Self::Unreachable => http::StatusCode::BAD_GATEWAY,
        }
    }

    /// The reason in the response body: what a model reads.
    pub fn message(self, host: &str, port: u16) -> String {
        match self {
            Self::NotAllowed => format!(
                "egress proxy: {host}:{port} is not on this agent's egress allowlist \
                 (egress.allow)"
            ),
            Self::Address(domain::address::Refused::Metadata) => format!(
                "egress proxy: {host}:{port} is a link-local or cloud metadata address, never \
                 reachable"
            ),
            Self::Address(domain::address::Refused::Private) => format!(
                "egress proxy: {host}:{port} is a loopback, private or other non-public \
                 address (EGRESS_ALLOW_PRIVATE_NETWORKS is off)"
            ),
            Self::Unresolved => format!("egress proxy: {host} could not be resolved"),
            Self::Unreachable => format!("egress proxy: {host}:{port} could not be reached"),
            Self::Timeout => format!("egress proxy: {host}:{port} did not answer in time"),
        }
    }
}

/// A TCP connection to `host:port` through the address rule, within `timeout` for the
/// lookup and the connection together.
pub async fn connect(
    host: &str,
    port: u16,
    allow_private: bool,
    timeout: Duration,
) -> Result<TcpStream, Refusal> {
    let addresses = tokio::time::timeout(timeout, resolve(host, port, allow_private))
        .await
        .map_err(|_| Refusal::Timeout)??;
    let attempt = async {
        let mut last = Refusal::Unreachable;
        for address in addresses {
            match TcpStream::connect(address).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Err(_) => last = Refusal::Unreachable,
            }
        }
        Err(last)
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| Refusal::Timeout)?
}

/// Every address of `host`, each allowed by the rule; one refused address refuses the
/// name (a name that answers with a private address beside public ones is suspect).
async fn resolve(host: &str, port: u16, allow_private: bool) -> Result<Vec<SocketAddr>, Refusal> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        domain::address::check_ip(ip, allow_private).map_err(Refusal::Address)?;
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    domain::address::check_name(bare, allow_private).map_err(Refusal::Address)?;
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((bare, port))
        .await
        .map_err(|_| Refusal::Unresolved)?
        .collect();
    if addresses.is_empty() {
        return Err(Refusal::Unresolved);
    }
    for address in &addresses {
        domain::address::check_ip(address.ip(), allow_private).map_err(Refusal::Address)?;
    }
    Ok(addresses)
}

/// TLS over `tcp` to `host`, verified; a failed verification is `Unreachable` (the
/// command sees a `502`, never a certificate it should not trust).
pub async fn tls(
    tcp: TcpStream,
    host: &str,
    config: Arc<ClientConfig>,
    timeout: Duration,
) -> Result<TlsStream<TcpStream>, Refusal> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(bare.to_owned()).map_err(|_| Refusal::Unresolved)?;
    tokio::time::timeout(timeout, TlsConnector::from(config).connect(name, tcp))
        .await
        .map_err(|_| Refusal::Timeout)?
        .map_err(|_| Refusal::Unreachable)
}
