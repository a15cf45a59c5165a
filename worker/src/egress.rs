//! The worker's way out through its session's egress proxy (W14; docs/design/egress.md).
//!
//! - `WORKER_EGRESS_BRIDGE` (the local launcher's, under `bwrap --unshare-net`): the
//!   sandbox's network has only loopback, so the worker listens on the loopback addresses
//!   it names and carries each connection to a unix socket bound in from outside: the
//!   session's proxy, and the manager's way to the brain. Nothing else leaves.
//! - `WORKER_EGRESS_PROXY`: the proxy's URL (it may carry the session's credential as
//!   userinfo). At start the worker fetches the session CA from the proxy itself
//!   (`GET /ca.pem`), writes a bundle of the system roots and that CA into its private
//!   tmp, and gives every command `HTTP(S)_PROXY` and the bundle as `SSL_CERT_FILE`,
//!   `NODE_EXTRA_CA_CERTS`, `REQUESTS_CA_BUNDLE` and `CURL_CA_BUNDLE`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use protocol::SessionId;
use tokio::net::{TcpListener, UnixStream};

/// Where the system's roots are, by distribution; the first that exists goes in the bundle.
const SYSTEM_ROOTS: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];
/// The bound on fetching the CA, each attempt, and the attempts.
const FETCH_BOUND: Duration = Duration::from_secs(5);
const FETCH_ATTEMPTS: u32 = 3;
/// The largest CA answer read.
const MAX_CA_PEM: usize = 64 * 1024;
/// Connections one bridge carries at once; more wait for the kernel's backlog.
const MAX_BRIDGED: usize = 128;

/// One bridge: a loopback address inside the sandbox and the unix socket it carries to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bridge {
    pub listen: SocketAddr,
    pub socket: PathBuf,
}

/// Binds every bridge's address (so a connection made after this returns is carried),
/// then carries connections until the process ends.
pub async fn start_bridges(bridges: &[Bridge]) -> std::io::Result<()> {
    for bridge in bridges {
        let listener = TcpListener::bind(bridge.listen).await?;
        let socket = bridge.socket.clone();
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_BRIDGED));
        tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let Ok((mut client, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let socket = socket.clone();
                tokio::spawn(async move {
                    if let Ok(mut out) = UnixStream::connect(&socket).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut out).await;
                    }
                    drop(slot);
                });
            }
        });
    }
    Ok(())
}

/// Why the commands' trust store lacks the session CA.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("the proxy did not answer the CA")]
    Unreachable,
    #[error("the proxy's CA answer is not a PEM certificate")]
    NotPem,
    #[error("the CA bundle could not be written")]
    Write(std::io::Error),
}

impl CaError {
    pub fn class(&self) -> &'static str {
        match self {
            Self::Unreachable => "ca_unreachable",
            Self::NotPem => "ca_not_pem",
            Self::Write(_) => "ca_not_written",
        }
    }
}

/// The commands' environment for the proxy at `proxy`: the proxy variables always; the
/// CA bundle's too once the CA is fetched and written (else the error, with the proxy
/// variables alone: a command then trusts no certificate the proxy makes).
pub async fn command_env(
    proxy: &str,
    session: SessionId,
) -> (Vec<(String, String)>, Option<CaError>) {
    let mut env: Vec<(String, String)> = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
        .into_iter()
        .map(|name| (name.to_owned(), proxy.to_owned()))
        .collect();
    // Empty, so no inherited exception sends a host around the proxy.
    env.extend(["NO_PROXY", "no_proxy"].map(|name| (name.to_owned(), String::new())));
    let bundle = std::env::temp_dir().join(format!("egress-ca-{}.pem", session.0));
    match write_bundle(proxy, &bundle).await {
        Ok(()) => {
            let path = bundle.display().to_string();
            for name in [
                "SSL_CERT_FILE",
                "NODE_EXTRA_CA_CERTS",
                "REQUESTS_CA_BUNDLE",
                "CURL_CA_BUNDLE",
            ] {
                env.push((name.to_owned(), path.clone()));
            }
            (env, None)
        }
        Err(e) => (env, Some(e)),
    }
}

async fn write_bundle(proxy: &str, bundle: &Path) -> Result<(), CaError> {
    let ca = fetch_ca(proxy).await?;
    let mut pem = String::new();
    if let Some(roots) = SYSTEM_ROOTS
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
    {
        pem.push_str(roots.trim_end());
        pem.push('\n');
    }
    pem.push_str(ca.trim_end());
    pem.push('\n');
    tokio::fs::write(bundle, pem).await.map_err(CaError::Write)
}

/// `GET /ca.pem` to the proxy itself (origin-form; the URL's userinfo, if any, goes as
/// basic credentials), a few attempts within [`FETCH_BOUND`] each.
async fn fetch_ca(proxy: &str) -> Result<String, CaError> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(FETCH_BOUND)
        .build()
        .map_err(|_| CaError::Unreachable)?;
    let url = format!("{}/ca.pem", proxy.trim_end_matches('/'));
    for attempt in 1..=FETCH_ATTEMPTS {
        match client.get(&url).send().await {
            Ok(response) if response.status().is_success() => {
                let body = response.bytes().await.map_err(|_| CaError::Unreachable)?;
                if body.len() > MAX_CA_PEM {
                    return Err(CaError::NotPem);
                }
                let text = String::from_utf8(body.to_vec()).map_err(|_| CaError::NotPem)?;
                return if text.contains("-----BEGIN CERTIFICATE-----") {
                    Ok(text)
                } else {
                    Err(CaError::NotPem)
                };
            }
            _ if attempt < FETCH_ATTEMPTS => {
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
            _ => {}
        }
    }
    Err(CaError::Unreachable)
}
