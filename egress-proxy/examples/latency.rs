//! The proxy's added latency per request (W13): sequential GETs over one kept-alive client
//! connection to a loopback HTTP upstream, directly and through the proxy with an egress
//! secret set on each request. Not a test; run it with
//! `cargo run -p egress-proxy --example latency` (debug) or with `--release`;
//! `EGRESS_BENCH_REQUESTS` (default 2000) requests each way.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use egress_proxy::{Bounds, EgressProxy, Session, SessionPolicy};
use http_body_util::{BodyExt, Empty, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let requests: usize = std::env::var("EGRESS_BENCH_REQUESTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    let upstream = TcpListener::bind("127.0.0.1:0").await?;
    let port = upstream.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = upstream.accept().await {
            let _ = tcp.set_nodelay(true);
            tokio::spawn(async move {
                let service = service_fn(|_req| async {
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
                        b"hello from upstream\n",
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    let config: SessionPolicy = serde_json::from_value(serde_json::json!({
        "allow": [], "allow_private_networks": true,
        "secrets": [{"name": "TOKEN", "value": "bench-credential-0123456789",
                     "hosts": [format!("127.0.0.1:{port}")], "header": "Authorization",
                     "format": "Bearer {value}"}]
    }))?;
    let session = Session::new(config, Bounds::default(), None)?;
    let proxy = EgressProxy::start(TcpListener::bind("127.0.0.1:0").await?, session)?;

    let url = format!("http://127.0.0.1:{port}/");
    let direct = run(&format!("127.0.0.1:{port}"), "/", requests).await?;
    let proxied = run(&proxy.addr().to_string(), &url, requests).await?;
    let (d50, d99) = (percentile(&direct, 50), percentile(&direct, 99));
    let (p50, p99) = (percentile(&proxied, 50), percentile(&proxied, 99));
    println!("requests each way: {requests}");
    println!("direct   p50 {d50:?}  p99 {d99:?}");
    println!("proxied  p50 {p50:?}  p99 {p99:?}");
    println!(
        "added    p50 {:?}  p99 {:?}",
        p50.saturating_sub(d50),
        p99.saturating_sub(d99)
    );
    Ok(())
}

/// `requests` GETs of `target` over one connection to `address`; each one's duration.
async fn run(address: &str, target: &str, requests: usize) -> anyhow::Result<Vec<Duration>> {
    let tcp = TcpStream::connect(address).await?;
    tcp.set_nodelay(true)?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tcp)).await?;
    tokio::spawn(connection);
    let mut times = Vec::with_capacity(requests);
    for _ in 0..requests {
        let req = hyper::Request::get(target)
            .header("host", "127.0.0.1")
            .body(Empty::new())?;
        let start = Instant::now();
        sender.ready().await?;
        let response = sender.send_request(req).await?;
        anyhow::ensure!(response.status() == 200, "status {}", response.status());
        response.into_body().collect().await?;
        times.push(start.elapsed());
    }
    times.sort();
    Ok(times)
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}
