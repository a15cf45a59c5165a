//! A TCP proxy that injects network faults between a process under test and a real
//! service (Redis, Postgres), on loopback.
//!
//! - [`Fault::Cut`]: every open connection is closed and new ones are refused (the
//!   listening socket is closed): a service that went away.
//! - [`Fault::Blackhole`]: connections are accepted, and nothing moves in either
//!   direction while the fault lasts: a partition, or a peer that hangs. Bytes are held,
//!   not lost, so a connection that outlives the fault carries on.
//! - [`Fault::None`]: bytes flow; a cut proxy listens again on the same address.
//!
//! [`FaultProxy::closing_idle`] also closes every connection on which no byte moved for a
//! while, as a NAT gateway or a cloud load balancer does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    Cut,
    Blackhole,
}

pub struct FaultProxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    task: JoinHandle<()>,
    accepted: Arc<AtomicUsize>,
    closed_idle: Arc<AtomicUsize>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> Self {
        Self::start_with(upstream, None).await
    }

    /// Like [`FaultProxy::start`], and closes a connection once no byte moved on it in
    /// either direction for `idle`.
    pub async fn closing_idle(upstream: &str, idle: std::time::Duration) -> Self {
        Self::start_with(upstream, Some(idle)).await
    }

    async fn start_with(upstream: &str, idle: Option<std::time::Duration>) -> Self {
        let upstream: SocketAddr = tokio::net::lookup_host(upstream)
            .await
            .unwrap()
            .next()
            .expect("upstream address resolves");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (fault, rx) = watch::channel(Fault::None);
        let accepted = Arc::new(AtomicUsize::new(0));
        let closed_idle = Arc::new(AtomicUsize::new(0));
        let link = Link {
            upstream,
            idle,
            closed_idle: closed_idle.clone(),
        };
        let task = tokio::spawn(accept_loop(listener, addr, link, rx, accepted.clone()));
        Self {
            addr,
            fault,
            task,
            accepted,
            closed_idle,
        }
    }

    /// How many connections the proxy closed for idling (see [`FaultProxy::closing_idle`]).
    pub fn closed_idle(&self) -> usize {
        self.closed_idle.load(Ordering::SeqCst)
    }

    /// How many connections clients opened through the proxy so far: what a test reads
    /// to tell a client that reuses its connections from one that opens one per call.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Where clients connect instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The connection tasks end when the sender goes: `changed()` errors.
        self.task.abort();
    }
}

/// Where connections go, and when an idle one is closed.
#[derive(Clone)]
struct Link {
    upstream: SocketAddr,
    idle: Option<std::time::Duration>,
    closed_idle: Arc<AtomicUsize>,
}

async fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    link: Link,
    mut rx: watch::Receiver<Fault>,
    accepted_count: Arc<AtomicUsize>,
) {
    let mut listener = Some(listener);
    loop {
        let fault = *rx.borrow_and_update();
        match (fault, &listener) {
            (Fault::Cut, Some(_)) => listener = None,
            (Fault::Cut, None) => {
                if rx.changed().await.is_err() {
                    return;
                }
            }
            (_, None) => listener = Some(rebind(addr).await),
            (_, Some(l)) => {
                tokio::select! {
                    // The fault changed: re-read it.
                    changed = rx.changed() => if changed.is_err() { return },
                    // A client connected.
                    accepted = l.accept() => if let Ok((client, _)) = accepted {
                        accepted_count.fetch_add(1, Ordering::SeqCst);
                        let _ = client.set_nodelay(true);
                        tokio::spawn(forward(client, link.clone(), rx.clone()));
                    },
                }
            }
        }
    }
}

/// The port was ours a moment ago; only a race with another bind could take it.
async fn rebind(addr: SocketAddr) -> TcpListener {
    for _ in 0..100 {
        if let Ok(l) = TcpListener::bind(addr).await {
            return l;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("fault proxy could not listen on {addr} again");
}

async fn forward(client: TcpStream, link: Link, mut rx: watch::Receiver<Fault>) {
    // A connection accepted during a blackhole reaches the upstream only once it lifts.
    loop {
        let fault = *rx.borrow_and_update();
        match fault {
            Fault::None => break,
            Fault::Cut => return,
            Fault::Blackhole => {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        }
    }
    let Ok(server) = TcpStream::connect(link.upstream).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let mut up = vec![0u8; 64 * 1024];
    let mut down = vec![0u8; 64 * 1024];
    loop {
        let fault = *rx.borrow_and_update();
        match fault {
            // Dropping both halves closes both connections.
            Fault::Cut => return,
            Fault::Blackhole => {
                if rx.changed().await.is_err() {
                    return;
                }
                continue;
            }
            Fault::None => {}
        }
        let idle = async {
            match link.idle {
                Some(idle) => tokio::time::sleep(idle).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // The fault changed: re-read it before moving another byte.
            changed = rx.changed() => if changed.is_err() { return },
            // Nothing moved for the idle time: dropping both halves closes both ends.
            () = idle => {
                link.closed_idle.fetch_add(1, Ordering::SeqCst);
                return;
            }
            // The client sent something for the upstream.
            n = client_read.read(&mut up) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => if server_write.write_all(&up[..n]).await.is_err() { return },
            },
            // The upstream answered.
            n = server_read.read(&mut down) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => if client_write.write_all(&down[..n]).await.is_err() { return },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut buf))
            .await
            .map_err(|_| std::io::Error::other("timed out"))??;
        Ok(buf.to_vec())
    }

    #[tokio::test]
    async fn closes_a_connection_left_idle_and_keeps_a_busy_one() {
        let proxy =
            FaultProxy::closing_idle(&echo_server().await.to_string(), Duration::from_millis(300))
                .await;
        let mut busy = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut idle = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut idle).await.unwrap(), b"ping");
        // Bytes every 100 ms keep a connection open past the idle time.
        for _ in 0..6 {
            assert_eq!(roundtrip(&mut busy).await.unwrap(), b"ping");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut buf = [0u8; 1];
        assert_eq!(
            idle.read(&mut buf).await.unwrap_or(0),
            0,
            "the idle one is closed"
        );
        assert_eq!(proxy.closed_idle(), 1);
        assert_eq!(roundtrip(&mut busy).await.unwrap(), b"ping");
    }

    #[tokio::test]
    async fn passes_cuts_blackholes_and_heals() {
        let proxy = FaultProxy::start(&echo_server().await.to_string()).await;
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut s).await.unwrap(), b"ping");

        proxy.set(Fault::Blackhole);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            roundtrip(&mut s).await.is_err(),
            "a blackhole answers nothing"
        );
        let mut held = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.set(Fault::None);
        // The echo of the blackholed ping was held, not lost.
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        assert_eq!(roundtrip(&mut held).await.unwrap(), b"ping");

        proxy.set(Fault::Cut);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut buf = [0u8; 1];
        assert_eq!(s.read(&mut buf).await.unwrap_or(0), 0, "a cut closes");
        assert!(
            TcpStream::connect(proxy.addr()).await.is_err(),
            "a cut refuses"
        );
        proxy.set(Fault::None);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut s).await.unwrap(), b"ping");
    }
}
