//! `runtime-manager egress-proxy`, the real binary, over the test's Postgres: a command
//! (`curl`) with a session's credentials in its proxy URL reaches a loopback upstream with
//! the agent's egress secret set, one without them gets `407`, the request lands in the
//! session's ledger, and `/healthz` and `/metrics` answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use domain::egress::SecretEgress;
use store::{Actor, SecretsKey};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use test_support::db::db_url;

use crate::common::Harness;

const KEY_HEX: &str = "6a1f2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";
const TOKEN: &str = "ghp_the-real-credential-42";
const WAIT: Duration = Duration::from_secs(20);

/// A loopback HTTP server that reports each request's `authorization` header and
/// answers `hello from upstream`.
async fn upstream() -> (u16, mpsc::UnboundedReceiver<Option<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                let auth = text.lines().find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("authorization")
                        .then(|| value.trim().to_owned())
                });
                let _ = tx.send(auth);
                let body = "hello from upstream\n";
                let _ = tcp
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    (port, rx)
}

/// `curl` through `proxy_url`; its output, stdout and stderr.
async fn curl(proxy_url: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "20"])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("http_proxy", proxy_url)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains(TOKEN),
        "the command saw the credential: {text}"
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_egress_proxy_binary_serves_a_session_with_its_credential_and_writes_its_ledger() {
    let h = Harness::new().await;
    let (session, _) = h.insert_session("ready", "light").await;
    let (port, mut seen) = upstream().await;
    let key = SecretsKey::parse(KEY_HEX).unwrap();
    store::Store::from_pool(h.pool.clone())
        .with_secrets_key(Some(key.clone()))
        .put_agent_secret(
            h.team,
            h.agent,
            "GH_TOKEN",
            TOKEN,
            Some(&SecretEgress {
                hosts: vec![format!("127.0.0.1:{port}")],
                header: "Authorization".into(),
                format: "Bearer {value}".into(),
            }),
            100,
            &Actor::operator(None),
        )
        .await
        .unwrap();

    let mut proxy = tokio::process::Command::new(env!("CARGO_BIN_EXE_runtime-manager"))
        .arg("egress-proxy")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("DATABASE_URL", db_url(&h.db_name))
        .env("BRAIN_SECRETS_KEY", KEY_HEX)
        .env("EGRESS_PROXY_ADDR", "127.0.0.1:0")
        .env("EGRESS_PROXY_METRICS_ADDR", "127.0.0.1:0")
        .env("EGRESS_ALLOW_PRIVATE_NETWORKS", "true")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The addresses it bound, from its start line.
    let mut lines = BufReader::new(proxy.stderr.take().unwrap()).lines();
    let started = Instant::now();
    let (addr, metrics) = loop {
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("the proxy's start line")
            .unwrap()
            .expect("the proxy exited before serving");
        if line.contains("egress proxy serving") {
            let value = |name: &str| {
                line.split_whitespace()
                    .find_map(|token| token.strip_prefix(name))
                    .unwrap()
                    .to_owned()
            };
            break (value("addr="), value("metrics_addr="));
        }
        assert!(started.elapsed() < WAIT, "no start line");
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let target = format!("http://127.0.0.1:{port}/user");
    let out = curl(&format!("http://{addr}"), &["-i", &target]).await;
    assert!(
        out.contains("407") && out.contains("proxy_auth_required"),
        "{out}"
    );

    let session_key = egress_proxy::SessionKey::new(key.derive(egress_proxy::SESSION_KEY_LABEL));
    let url = session_key.proxy_url(&session.0.to_string(), &addr);
    let out = curl(&url, &[&target]).await;
    assert!(out.contains("hello from upstream"), "{out}");
    assert_eq!(
        seen.recv().await.unwrap().as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );

    // The request reaches the session's ledger (written every two seconds).
    let deadline = Instant::now() + WAIT;
    loop {
        let rows: Vec<(String, i32, i32)> =
            sqlx::query_as("SELECT host, port, status FROM egress_requests WHERE session_id = $1")
                .bind(session.0)
                .fetch_all(&h.pool)
                .await
                .unwrap();
        if !rows.is_empty() {
            assert_eq!(rows, [("127.0.0.1".to_owned(), i32::from(port), 200)]);
            break;
        }
        assert!(Instant::now() < deadline, "the ledger was not written");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let health = curl(
        "",
        &["--noproxy", "*", &format!("http://{metrics}/healthz")],
    )
    .await;
    assert_eq!(health.trim(), "ok");
    let scraped = curl(
        "",
        &["--noproxy", "*", &format!("http://{metrics}/metrics")],
    )
    .await;
    for series in [
        "egress_proxy_connections_total{outcome=\"served\"} 1",
        "egress_proxy_connections_total{outcome=\"unauthorised\"} 1",
        "egress_proxy_sessions 1",
        "runtime_manager_egress_requests_total{outcome=\"forwarded\"} 1",
    ] {
        assert!(scraped.contains(series), "{series} in {scraped}");
    }
    proxy.start_kill().unwrap();
    let _ = proxy.wait().await;
    h.finish().await;
}
