//! Redis over TLS (O5: "TLS and auth as the single-node URL has them"): a real
//! `redis-server` listening on a TLS port only, with a certificate of a CA made for the
//! test (the `openssl` command), and a brain process whose `REDIS_URL` is `rediss://`,
//! trusting that CA through `SSL_CERT_FILE` (read by rustls-native-certs, as an operator's
//! own CA bundle would be). A turn's hold, quota script and events go to that server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::common::{BrainProcess, TestApp, parse_events};

/// A `redis-server` of the test's own, killed when dropped.
struct TlsRedis {
    child: Child,
    port: u16,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis(dir: &Path) -> TlsRedis {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args([
            "--tls-cert-file",
            "server.pem",
            "--tls-key-file",
            "server.key",
        ])
        .args(["--tls-ca-cert-file", "ca.pem", "--tls-auth-clients", "no"])
        .args(["--save", "", "--appendonly", "no"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (apt-get install redis-server)");
    let redis = TlsRedis { child, port };
    for _ in 0..200 {
        if cli(dir, port, &["PING"]).contains("PONG") {
            return redis;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("redis-server did not answer on its TLS port");
}

/// `redis-cli` over TLS, trusting the test's CA: its output.
fn cli(dir: &Path, port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["--tls", "--cacert", "ca.pem", "-p", &port.to_string()])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn a_brain_on_a_rediss_url_runs_its_turns_over_tls() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("redis-tls-{}", uuid::Uuid::new_v4().simple()));
    test_support::tls::certificates(&dir);
    let redis = start_redis(&dir);
    let app = TestApp::start().await;
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let ca = dir.join("ca.pem");
    let brain = BrainProcess::start(
        &app,
        &[
            ("REDIS_URL", url.as_str()),
            ("REDIS_CLUSTER_URLS", ""),
            ("SSL_CERT_FILE", ca.to_str().unwrap()),
        ],
    )
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let response = app
        .http
        .post(format!("{}/v1/chats/{chat}/messages", brain.url))
        .bearer_auth(&app.key)
        .json(&json!({"content": "hello over TLS"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (_, done) = parse_events(&response.text().await.unwrap());
    assert!(done, "the turn ends");
    // The hold's script and the chat's events stream went to the TLS server.
    let stats = cli(&dir, redis.port, &["INFO", "commandstats"]);
    for command in ["cmdstat_eval", "cmdstat_xadd"] {
        assert!(stats.contains(command), "{command} not in {stats}");
    }
    // Without the test's CA among its roots, a client refuses the server's certificate:
    // the connection verifies it, it does not merely encrypt.
    let untrusted = redis::Client::open(url.as_str()).unwrap();
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        untrusted.get_multiplexed_async_connection(),
    )
    .await
    .expect("a TLS failure is prompt");
    assert!(refused.is_err(), "an unknown CA's certificate was accepted");
    let _ = std::fs::remove_dir_all(&dir);
}
