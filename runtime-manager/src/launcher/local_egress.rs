//! The local launcher's egress proxies (W13, W14; docs/design/egress.md). A confined
//! worker's sandbox has its own network namespace with only loopback; its way out is two
//! unix sockets in a directory of the session's own (`$TMPDIR/egress-<session>`), bound
//! into the sandbox, which the worker carries `127.0.0.1` ports to (`WORKER_EGRESS_BRIDGE`):
//!
//! - `proxy.sock`: the session's egress proxy, served here in-process. Its configuration
//!   is read afresh from Postgres at each new client connection
//!   ([`crate::egress::policy_for`]), so a secret or an allowlist changed mid-session
//!   applies to the next connection; its records go to the session's ledger.
//! - `brain.sock`: the worker's own channel to the brain, carried to `BRAIN_PUBLIC_URL`'s
//!   host and port.
//! - `collector.sock`, when the manager has an `http://` OTLP endpoint
//!   (`OTEL_EXPORTER_OTLP_ENDPOINT`): the worker's traces, carried to the collector.
//!
//! A manager that adopts a live worker at start (O3) serves its sockets again, with the
//! CA derived from the secrets key when it has one.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_proxy::{Bounds, Session};
use prometheus::IntCounterVec;
use protocol::SessionId;
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::LaunchError;
use crate::config::EgressConfig;
use crate::egress::{EgressError, LedgerWriter, policy_for};

/// The loopback port of the proxy inside the sandbox (what `HTTP_PROXY` names); another
/// when the brain's own port is this one.
const PROXY_PORT: u16 = 3128;
/// Connections to the brain carried at once per session, and the bound on reaching it.
const MAX_BRAIN_CONNECTIONS: usize = 16;
const BRAIN_CONNECT_BOUND: Duration = Duration::from_secs(5);
/// The brain's port inside a sandbox when its own is privileged.
const INSIDE_BRAIN_PORT: u16 = 18080;
/// The collector's port inside when its own is privileged or taken.
const INSIDE_COLLECTOR_PORT: u16 = 14318;
/// The manager's variable naming the OTLP endpoint its workers export to.
const OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// A service outside (the brain, the OTLP collector) and how a sandbox reaches it.
#[derive(Clone, Debug)]
struct Outside {
    /// `host:port` the manager dials.
    outside: String,
    /// The loopback port the worker dials inside: the service's own, unless that one is
    /// privileged (an unprivileged sandbox cannot listen on it) or taken.
    port: u16,
    /// The service's URL as the worker inside dials it.
    inside_url: String,
}

impl Outside {
    /// The brain: a loopback host on an unprivileged port stays as it is (its port is
    /// bridged to the same port inside); any other `http://` brain becomes `127.0.0.1` on
    /// a port of its own. An `https://` one elsewhere cannot be reached from inside: its
    /// name would not verify on loopback.
    fn of(url: &str) -> Result<Self, LaunchError> {
        Self::reached(url, INSIDE_BRAIN_PORT, &[])
    }

    /// `url` as the sandbox reaches it: on the loopback port `fallback` when its own is
    /// privileged or among `taken`.
    fn reached(url: &str, fallback: u16, taken: &[u16]) -> Result<Self, LaunchError> {
        let unconfinable = |why: &str| LaunchError::Unconfinable(format!("BRAIN_PUBLIC_URL {why}"));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| unconfinable("is not a URL"))?;
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let default_port = if scheme == "https" { 443 } else { 80 };
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !host.ends_with(']') || authority.starts_with('[') => (
                host,
                port.parse::<u16>()
                    .map_err(|_| unconfinable("has an invalid port"))?,
            ),
            _ => (authority, default_port),
        };
        let loopback = host == "localhost" || host == "127.0.0.1";
        let inside = if port >= 1024 && !taken.contains(&port) {
            port
        } else {
            fallback
        };
        let inside_url = if loopback && inside == port {
            url.to_owned()
        } else if scheme == "http" {
            format!("http://127.0.0.1:{inside}{path}")
        } else {
            return Err(unconfinable(
                "must be http:// or a loopback host for network-confined local workers",
            ));
        };
        Ok(Self {
            outside: format!("{host}:{port}"),
            port: inside,
            inside_url,
        })
    }
}

struct Served {
    generation: u64,
    stop: CancellationToken,
    dir: PathBuf,
}

/// What a confined worker is launched with: its sandbox's way out.
pub struct Sandboxed {
    /// The directory bound into the sandbox, holding the two sockets.
    pub dir: PathBuf,
    /// The worker's variables: `WORKER_EGRESS_PROXY`, `WORKER_EGRESS_BRIDGE` and
    /// `BRAIN_PUBLIC_URL` as it dials from inside.
    pub env: Vec<(&'static str, String)>,
    /// Released with [`LocalEgress::release`] when the worker is gone.
    pub generation: u64,
}

/// The proxies of this manager's confined workers, one per session.
pub struct LocalEgress {
    store: store::Store,
    config: EgressConfig,
    brain: Outside,
    /// The OTLP collector the worker's traces go to, when there is one it can reach.
    collector: Option<Outside>,
    ledger: LedgerWriter,
    counter: IntCounterVec,
    served: Mutex<HashMap<SessionId, Served>>,
    generations: AtomicU64,
}

impl LocalEgress {
    /// `store` is the manager's pool through the `store` crate; `brain_public_url` what
    /// workers dial.
    pub fn new(
        store: store::Store,
        config: EgressConfig,
        brain_public_url: &str,
    ) -> Result<Self, LaunchError> {
        let store = store.with_secrets_key(config.secrets_key.clone());
        let counter = LedgerWriter::counter().map_err(|e| {
            LaunchError::Unconfinable(format!("the egress counter cannot be made: {e}"))
        })?;
        Ok(Self {
            ledger: LedgerWriter::new(store.clone(), counter.clone()),
            store,
            config,
            collector: collector(brain_public_url),
            brain: Outside::of(brain_public_url)?,
            counter,
            served: Mutex::default(),
            generations: AtomicU64::new(0),
        })
    }

    pub fn counter(&self) -> IntCounterVec {
        self.counter.clone()
    }

    fn served(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Served>> {
        self.served
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Serves `session`'s proxy and its way to the brain on sockets in `dir` (made here,
    /// replacing any earlier ones). Fails before anything is served when the session's
    /// configuration cannot be read (an agent with egress secrets and no key included).
    pub async fn serve(
        &self,
        session: SessionId,
        dir: PathBuf,
        sandbox_uid: Option<u32>,
    ) -> Result<Sandboxed, LaunchError> {
        let policy = policy_for(&self.store, session, self.config.defaults())
            .await
            .map_err(LaunchError::Egress)?;
        // With the secrets key, the session's CA survives this manager: an adopted worker's
        // sandbox keeps trusting the proxy made for it again.
        let roots = self.config.extra_roots.as_deref();
        let proxy = match self.config.session_key() {
            Some(key) => Session::keyed(
                policy,
                Bounds::default(),
                roots,
                &key,
                &session.0.to_string(),
            ),
            None => Session::new(policy, Bounds::default(), roots),
        }
        .map_err(|e| LaunchError::Egress(EgressError::Policy(e)))?;
        let _ = tokio::fs::remove_dir_all(&dir).await;
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(LaunchError::Workspace)?;
        // Passable, not listable, by the sandbox's user; the sockets are its alone.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .map_err(LaunchError::Workspace)?;
        let proxy_socket = dir.join("proxy.sock");
        let brain_socket = dir.join("brain.sock");
        let proxy_listener = listen(&proxy_socket, sandbox_uid)?;
        let brain_listener = listen(&brain_socket, sandbox_uid)?;
        let stop = CancellationToken::new();
        tokio::spawn(serve_proxy(
            proxy_listener,
            proxy.clone(),
            self.store.clone(),
            session,
            self.config.defaults(),
            stop.clone(),
        ));
        tokio::spawn(serve_outside(
            brain_listener,
            self.brain.outside.clone(),
            stop.clone(),
        ));
        let collector_bridge = match &self.collector {
            Some(collector) => {
                let socket = dir.join("collector.sock");
                let listener = listen(&socket, sandbox_uid)?;
                tokio::spawn(serve_outside(
                    listener,
                    collector.outside.clone(),
                    stop.clone(),
                ));
                Some(format!(
                    ",127.0.0.1:{}={}",
                    collector.port,
                    socket.display()
                ))
            }
            None => None,
        };
        self.ledger.spawn(session, proxy, stop.clone());
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let previous = self.served().insert(
            session,
            Served {
                generation,
                stop,
                dir: dir.clone(),
            },
        );
        if let Some(previous) = previous {
            previous.stop.cancel();
        }
        Ok(Sandboxed {
            env: self.worker_env(&proxy_socket, &brain_socket, collector_bridge),
            dir,
            generation,
        })
    }

    /// The worker's variables for its sandbox's way out: the proxy and the brain (and the
    /// collector, whose bridge `collector_bridge` already names) on loopback ports inside.
    fn worker_env(
        &self,
        proxy_socket: &Path,
        brain_socket: &Path,
        collector_bridge: Option<String>,
    ) -> Vec<(&'static str, String)> {
        let proxy_port = if self.brain.port == PROXY_PORT {
            PROXY_PORT + 1
        } else {
            PROXY_PORT
        };
        let bridges = format!(
            "127.0.0.1:{proxy_port}={},127.0.0.1:{}={}{}",
            proxy_socket.display(),
            self.brain.port,
            brain_socket.display(),
            collector_bridge.unwrap_or_default(),
        );
        let mut env = vec![
            (
                "WORKER_EGRESS_PROXY",
                format!("http://127.0.0.1:{proxy_port}"),
            ),
            ("WORKER_EGRESS_BRIDGE", bridges),
            ("BRAIN_PUBLIC_URL", self.brain.inside_url.clone()),
        ];
        if let Some(collector) = &self.collector {
            env.push((OTLP_ENDPOINT, collector.inside_url.clone()));
        }
        env
    }

    /// Stops serving `session` if `generation` is still its latest (a replaced worker's
    /// end leaves its successor's proxy alone), writing its last records.
    pub async fn release(&self, session: SessionId, generation: u64) {
        let served = {
            let mut served = self.served();
            match served.get(&session) {
                Some(s) if s.generation == generation => served.remove(&session),
                _ => None,
            }
        };
        if let Some(served) = served {
            served.stop.cancel();
            let _ = tokio::fs::remove_dir_all(&served.dir).await;
        }
    }
}

/// The manager's OTLP endpoint as a confined worker reaches it, on a port neither the
/// brain's nor the proxy's inside. `None` without one, or for one no bridge can carry (an
/// `https://` collector elsewhere than loopback: its name would not verify inside), whose
/// workers then export nothing.
fn collector(brain_public_url: &str) -> Option<Outside> {
    let url = std::env::var(OTLP_ENDPOINT)
        .ok()
        .filter(|u| !u.trim().is_empty())?;
    let brain_port = Outside::of(brain_public_url).ok()?.port;
    let taken = [brain_port, PROXY_PORT, PROXY_PORT + 1];
    match Outside::reached(url.trim(), INSIDE_COLLECTOR_PORT, &taken) {
        Ok(collector) => Some(collector),
        Err(_) => {
            tracing::warn!(
                "the OTLP endpoint cannot be reached from a confined worker; its traces are not exported"
            );
            None
        }
    }
}

/// A unix socket the sandbox's user may connect to (a socket's write permission is what
/// `connect` checks).
fn listen(path: &Path, sandbox_uid: Option<u32>) -> Result<UnixListener, LaunchError> {
    let listener = UnixListener::bind(path).map_err(LaunchError::Workspace)?;
    if let Some(uid) = sandbox_uid {
        std::os::unix::fs::chown(path, Some(uid), Some(uid)).map_err(LaunchError::Workspace)?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(LaunchError::Workspace)?;
    Ok(listener)
}

/// Each client connection gets the session's configuration as it is now, then the proxy.
/// A configuration that cannot be read leaves the one in force (a store outage must not
/// open the allowlist, nor close a session that works).
async fn serve_proxy(
    listener: UnixListener,
    proxy: Arc<Session>,
    store: store::Store,
    session: SessionId,
    defaults: crate::egress::EgressDefaults,
    stop: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        match policy_for(&store, session, defaults).await {
            Ok(policy) => {
                if let Err(e) = proxy.set_policy(policy) {
                    tracing::warn!(session = %session.0, error = %e, "egress configuration refused; the earlier one stays");
                }
            }
            Err(e) => {
                tracing::warn!(session = %session.0, class = e.metric_label(), "egress configuration not read; the earlier one stays")
            }
        }
        let (proxy, stop) = (proxy.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = proxy.serve(stream) => {}
            }
        });
    }
}

/// Each connection carried to `outside` (the brain, the collector), at most
/// [`MAX_BRAIN_CONNECTIONS`] at once per socket.
async fn serve_outside(listener: UnixListener, outside: String, stop: CancellationToken) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_BRAIN_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut inside: UnixStream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (address, stop) = (outside.clone(), stop.clone());
        tokio::spawn(async move {
            let dialed =
                tokio::time::timeout(BRAIN_CONNECT_BOUND, TcpStream::connect(&address)).await;
            if let Ok(Ok(mut dialed)) = dialed {
                let _ = dialed.set_nodelay(true);
                tokio::select! {
                    () = stop.cancelled() => {}
                    _ = tokio::io::copy_bidirectional(&mut inside, &mut dialed) => {}
                }
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_brain_is_dialed_as_is_and_another_http_one_on_loopback_inside() {
        let local = Outside::of("http://127.0.0.1:8080/prefix").unwrap();
        assert_eq!(
            (
                local.outside.as_str(),
                local.port,
                local.inside_url.as_str()
            ),
            ("127.0.0.1:8080", 8080, "http://127.0.0.1:8080/prefix")
        );
        let named = Outside::of("http://brain.internal").unwrap();
        assert_eq!(
            (
                named.outside.as_str(),
                named.port,
                named.inside_url.as_str()
            ),
            (
                "brain.internal:80",
                INSIDE_BRAIN_PORT,
                "http://127.0.0.1:18080"
            )
        );
        assert!(Outside::of("https://brain.example.com").is_err());
        assert!(Outside::of("https://localhost:8443").is_ok());
        // The collector: a port taken inside (the brain's, the proxy's) is not reused.
        let collector = Outside::reached(
            "http://127.0.0.1:3128/",
            INSIDE_COLLECTOR_PORT,
            &[8080, 3128],
        )
        .unwrap();
        assert_eq!(
            (collector.port, collector.inside_url.as_str()),
            (INSIDE_COLLECTOR_PORT, "http://127.0.0.1:14318/")
        );
    }
}
