//! The egress proxy with real clients (`curl`, a process of its own, with the proxy in its
//! environment as a worker's command has it) and real HTTP and HTTPS upstreams on
//! loopback, the HTTPS one with a certificate of a test CA.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use egress_proxy::{
    Bounds, EgressProxy, PolicyFuture, PolicySource, Session, SessionKey, SessionPolicy,
    SharedProxy, SharedSettings, placeholder,
};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const TOKEN: &str = "ghp_real-credential-0123456789";

/// What an upstream received: its `authorization` header and the request target.
type Seen = (Option<String>, String);

/// An HTTP (or, with `tls`, HTTPS) server on 127.0.0.1 that reports every request it
/// receives and answers `hello from upstream`.
async fn upstream(tls: Option<Arc<rustls::ServerConfig>>) -> (u16, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let auth = req
                        .headers()
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned());
                    let _ = tx.send((auth, req.uri().to_string()));
                    async {
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(
                            "hello from upstream\n",
                        ))))
                    }
                });
                let http = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(config) => {
                        let stream = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await;
                        if let Ok(stream) = stream {
                            let _ = http.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                    None => {
                        let _ = http.serve_connection(TokioIo::new(tcp), service).await;
                    }
                }
            });
        }
    });
    (port, rx)
}

/// A directory of this test's own, with the test CA and its server certificate.
fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("egress-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    test_support::tls::certificates(&dir);
    dir
}

fn tls_server(dir: &Path) -> Arc<rustls::ServerConfig> {
    let certs = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap(),
    )
}

async fn proxy(dir: &Path, config: serde_json::Value) -> EgressProxy {
    let config: SessionPolicy = serde_json::from_value(config).unwrap();
    let session = Session::new(config, Bounds::default(), Some(&dir.join("ca.pem"))).unwrap();
    std::fs::write(dir.join("session-ca.pem"), session.ca_pem()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    EgressProxy::start(listener, session).unwrap()
}

/// `curl` as a worker's command runs it: the proxy and the session CA in its environment,
/// the placeholder under the secret's name, nothing else. Its output, stdout and stderr.
async fn curl(proxy: &EgressProxy, dir: &Path, args: &[&str]) -> (bool, String) {
    let url = format!("http://{}", proxy.addr());
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "--show-error"])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("HTTP_PROXY", &url)
        .env("HTTPS_PROXY", &url)
        .env("http_proxy", &url)
        .env("https_proxy", &url)
        .env("SSL_CERT_FILE", dir.join("session-ca.pem"))
        .env("GH_TOKEN", placeholder("GH_TOKEN"))
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
    (out.status.success(), text)
}

fn secret(port: u16) -> serde_json::Value {
    serde_json::json!({"name": "GH_TOKEN", "value": TOKEN, "hosts": [format!("127.0.0.1:{port}")],
                       "header": "Authorization", "format": "Bearer {value}"})
}

#[tokio::test]
async fn plain_http_to_a_listed_host_carries_the_credential_the_command_never_holds() {
    let dir = test_dir("plain");
    let (port, mut seen) = upstream(None).await;
    let proxy = proxy(
        &dir,
        serde_json::json!({"allow": [], "secrets": [secret(port)], "allow_private_networks": true}),
    )
    .await;
    // The client puts the placeholder where a real token would go, in a header and the
    // query: both arrive as the credential.
    let (ok, out) = curl(
        &proxy,
        &dir,
        &[
            "-H",
            &format!("Authorization: token {}", placeholder("GH_TOKEN")),
            &format!(
                "http://127.0.0.1:{port}/repos?key={}",
                placeholder("GH_TOKEN")
            ),
        ],
    )
    .await;
    assert!(ok && out.contains("hello from upstream"), "{out}");
    let (auth, target) = seen.recv().await.unwrap();
    assert_eq!(auth.as_deref(), Some(format!("Bearer {TOKEN}").as_str()));
    assert_eq!(target, format!("/repos?key={TOKEN}"));
    let records = proxy.session.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        (
            records[0].method.as_str(),
            records[0].status,
            records[0].intercepted
        ),
        ("GET", 200, false)
    );
    assert_eq!(
        records[0].bytes_received,
        "hello from upstream\n".len() as u64
    );
}

#[tokio::test]
async fn https_to_a_listed_host_is_ended_with_the_session_ca_and_verified_upstream() {
    let dir = test_dir("https");
    let (port, mut seen) = upstream(Some(tls_server(&dir))).await;
    let proxy = proxy(
        &dir,
        serde_json::json!({"secrets": [secret(port)], "allow_private_networks": true}),
    )
    .await;
    let (ok, out) = curl(&proxy, &dir, &[&format!("https://127.0.0.1:{port}/user")]).await;
    assert!(ok && out.contains("hello from upstream"), "{out}");
    let (auth, target) = seen.recv().await.unwrap();
    assert_eq!(auth.as_deref(), Some(format!("Bearer {TOKEN}").as_str()));
    assert_eq!(target, "/user");
    let records = proxy.session.records();
    assert_eq!(
        (
            records[0].method.as_str(),
            records[0].status,
            records[0].intercepted
        ),
        ("GET", 200, true)
    );

    // The command trusting only the upstream's real CA fails: the proxy ended TLS.
    let (ok, out) = curl(
        &proxy,
        &dir,
        &[
            "--cacert",
            dir.join("ca.pem").to_str().unwrap(),
            &format!("https://127.0.0.1:{port}/"),
        ],
    )
    .await;
    assert!(!ok, "{out}");
}

#[tokio::test]
async fn an_upstream_the_proxy_cannot_verify_is_never_presented_as_trusted() {
    let dir = test_dir("unverified");
    let (port, mut seen) = upstream(Some(tls_server(&dir))).await;
    // No extra roots: the test CA is not trusted by the proxy.
    let config: SessionPolicy = serde_json::from_value(
        serde_json::json!({"secrets": [secret(port)], "allow_private_networks": true}),
    )
    .unwrap();
    let session = Session::new(config, Bounds::default(), None).unwrap();
    std::fs::write(dir.join("session-ca.pem"), session.ca_pem()).unwrap();
    let proxy =
        EgressProxy::start(TcpListener::bind("127.0.0.1:0").await.unwrap(), session).unwrap();
    let (_, out) = curl(&proxy, &dir, &["-i", &format!("https://127.0.0.1:{port}/")]).await;
    assert!(
        out.contains("502") && out.contains("could not be reached"),
        "{out}"
    );
    assert!(seen.try_recv().is_err(), "the upstream got a request");
}

#[tokio::test]
async fn other_allowed_hosts_are_tunnelled_untouched_and_others_refused_with_a_reason() {
    let dir = test_dir("tunnel");
    let (port, mut seen) = upstream(Some(tls_server(&dir))).await;
    let proxy = proxy(
        &dir,
        serde_json::json!({"allow": [format!("127.0.0.1:{port}")], "allow_private_networks": true}),
    )
    .await;
    // Tunnelled: the command sees the upstream's own certificate (the test CA's).
    let ca = dir.join("ca.pem");
    let (ok, out) = curl(
        &proxy,
        &dir,
        &[
            "--cacert",
            ca.to_str().unwrap(),
            &format!("https://127.0.0.1:{port}/x"),
        ],
    )
    .await;
    assert!(ok && out.contains("hello from upstream"), "{out}");
    assert_eq!(seen.recv().await.unwrap().0, None);

    let (_, out) = curl(&proxy, &dir, &["-i", "http://example.com/"]).await;
    assert!(
        out.contains("403") && out.contains("not on this agent's egress allowlist"),
        "{out}"
    );
    let (ok, out) = curl(&proxy, &dir, &["https://example.com/"]).await;
    assert!(!ok && out.contains("403"), "{out}");

    let records = proxy.session.records();
    let summary: Vec<_> = records
        .iter()
        .map(|r| (r.method.as_str(), r.status, r.refused))
        .collect();
    assert_eq!(
        summary,
        [
            ("CONNECT", 200, None),
            ("GET", 403, Some("host_not_allowed")),
            ("CONNECT", 403, Some("host_not_allowed"))
        ]
    );
    assert!(records[0].bytes_sent > 0 && records[0].bytes_received > 0);
}

#[tokio::test]
async fn private_and_metadata_addresses_are_refused_unless_the_operator_allows_private_ones() {
    let dir = test_dir("private");
    let (port, mut seen) = upstream(None).await;
    let proxy = proxy(&dir, serde_json::json!({})).await;
    let (_, out) = curl(&proxy, &dir, &["-i", &format!("http://127.0.0.1:{port}/")]).await;
    assert!(
        out.contains("403") && out.contains("EGRESS_ALLOW_PRIVATE_NETWORKS"),
        "{out}"
    );
    let (_, out) = curl(&proxy, &dir, &["-i", &format!("http://localhost:{port}/")]).await;
    assert!(out.contains("x-egress-refused: private_address"), "{out}");
    assert!(seen.try_recv().is_err());

    let open = proxy_allowing_private(&dir).await;
    let (_, out) = curl(
        &open,
        &dir,
        &["-i", "http://169.254.169.254/latest/meta-data/"],
    )
    .await;
    assert!(out.contains("x-egress-refused: metadata_address"), "{out}");
}

async fn proxy_allowing_private(dir: &Path) -> EgressProxy {
    proxy(dir, serde_json::json!({"allow_private_networks": true})).await
}

#[tokio::test]
async fn a_session_past_its_connection_bound_is_answered_503() {
    let dir = test_dir("bounds");
    let config: SessionPolicy = serde_json::from_value(serde_json::json!({})).unwrap();
    let bounds = Bounds {
        max_connections: 1,
        ..Bounds::default()
    };
    let session = Session::new(config, bounds, None).unwrap();
    let proxy =
        EgressProxy::start(TcpListener::bind("127.0.0.1:0").await.unwrap(), session).unwrap();
    // One connection held open (its request head not yet complete), then a second.
    let mut held = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut held, b"GET http://a.example/ HTTP/1.1\r\n")
        .await
        .unwrap();
    loop {
        if proxy.session.open_connections() == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    let (_, out) = curl(&proxy, &dir, &["-i", "http://b.example/"]).await;
    assert!(
        out.contains("503") && out.contains("too_many_connections"),
        "{out}"
    );
}

/// A proxy made again for a live sandbox (the local launcher's manager restarted and
/// adopting its workers) has the CA the sandbox already trusts when it has the key: the
/// same name and key (the signature differs: ECDSA draws a nonce); without the key,
/// each proxy draws its own.
#[tokio::test]
async fn a_keyed_sessions_ca_is_the_same_each_time_it_is_made() {
    let config = || -> SessionPolicy { serde_json::from_value(serde_json::json!({})).unwrap() };
    let key = SessionKey::new([7; 32]);
    let signed = |session: Arc<Session>| tbs_certificate(session.ca_pem());
    let made =
        |id: &str| signed(Session::keyed(config(), Bounds::default(), None, &key, id).unwrap());
    assert_eq!(made("s-1"), made("s-1"));
    assert_ne!(made("s-1"), made("s-2"));
    let drawn = || signed(Session::new(config(), Bounds::default(), None).unwrap());
    assert_ne!(drawn(), drawn());
}

/// The signed part of a PEM certificate (its `tbsCertificate`, which holds the subject
/// and the public key): the first element of the outer DER sequence.
fn tbs_certificate(pem: &str) -> Vec<u8> {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
    // A DER header: the tag, then a short length or 0x8N and N bytes of it.
    let header = |at: usize| -> (usize, usize) {
        let first = usize::from(der[at + 1]);
        if first < 0x80 {
            return (2, first);
        }
        let n = first - 0x80;
        let len = der[at + 2..at + 2 + n]
            .iter()
            .fold(0, |len, b| (len << 8) | usize::from(*b));
        (2 + n, len)
    };
    let (outer, _) = header(0);
    let (inner, len) = header(outer);
    der[outer..outer + inner + len].to_vec()
}

/// A tunnel outlives the request that opened it (hyper hands the connection over at the
/// upgrade): it still holds its place under the session's connection bound until it
/// closes.
#[tokio::test]
async fn an_open_tunnel_still_counts_against_the_connection_bound() {
    let dir = test_dir("tunnel-bound");
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = upstream.local_addr().unwrap().port();
    tokio::spawn(async move {
        // Says nothing, and closes when its peer does.
        while let Ok((mut stream, _)) = upstream.accept().await {
            tokio::spawn(async move {
                let mut sink = Vec::new();
                let _ = tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut sink).await;
            });
        }
    });
    let config: SessionPolicy =
        serde_json::from_value(serde_json::json!({"allow_private_networks": true})).unwrap();
    let bounds = Bounds {
        max_connections: 1,
        ..Bounds::default()
    };
    let session = Session::new(config, bounds, None).unwrap();
    let proxy =
        EgressProxy::start(TcpListener::bind("127.0.0.1:0").await.unwrap(), session).unwrap();
    let mut tunnel = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let head = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut tunnel, head.as_bytes())
        .await
        .unwrap();
    let mut answer = [0u8; 64];
    let n = tokio::io::AsyncReadExt::read(&mut tunnel, &mut answer)
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    let (_, out) = curl(&proxy, &dir, &["-i", "http://b.example/"]).await;
    assert!(
        out.contains("503") && out.contains("too_many_connections"),
        "the open tunnel left its place: {out}"
    );
    drop(tunnel);
    let freed = async {
        while proxy.session.open_connections() != 0 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), freed)
        .await
        .expect("the closed tunnel gives its place back");
}

/// The sandbox's way out (W14), with bubblewrap as the local launcher confines a worker:
/// a network namespace of its own (only loopback), the proxy's unix socket bound in, and
/// the bridge on `127.0.0.1:3128` inside. Through the proxy the command reaches the
/// upstream, which gets the credential; ignoring the proxy (`--noproxy`, a raw socket, a
/// public address) it reaches nothing.
#[tokio::test]
async fn in_its_own_network_namespace_a_command_reaches_only_the_proxy() {
    let dir = test_dir("netns");
    let (port, mut seen) = upstream(None).await;
    let config: SessionPolicy = serde_json::from_value(
        serde_json::json!({"allow": [], "secrets": [secret(port)], "allow_private_networks": true}),
    )
    .unwrap();
    let session = Session::new(config, Bounds::default(), None).unwrap();
    let socket = dir.join("proxy.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let serving = session.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serving.clone().serve(stream));
        }
    });
    let script = r#"
        exec 4< <("$BRIDGE" 127.0.0.1:3128 "$SOCKET")
        read -r ready <&4
        {
          echo "--- via proxy"
          curl -sS --max-time 20 -x http://127.0.0.1:3128 -H "Authorization: Bearer $GH_TOKEN" "http://127.0.0.1:$PORT/"
          echo "--- noproxy"
          curl -sS --max-time 5 --noproxy '*' "http://127.0.0.1:$PORT/" && echo NOPROXY-REACHED
          echo "--- raw socket"
          (exec 3<>"/dev/tcp/127.0.0.1/$PORT") && echo RAW-REACHED
          echo "--- public address"
          curl -sS --max-time 5 --noproxy '*' http://1.1.1.1/ && echo PUBLIC-REACHED
          true
        }"#;
    let dir_str = dir.to_str().unwrap();
    let out = tokio::process::Command::new("bwrap")
        .args([
            "--unshare-user",
            "--unshare-net",
            "--unshare-pid",
            "--die-with-parent",
        ])
        .args([
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
        ])
        .args(["--bind", dir_str, dir_str, "--", "bash", "-c", script])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("BRIDGE", env!("CARGO_BIN_EXE_egress-bridge"))
        .env("SOCKET", &socket)
        .env("PORT", port.to_string())
        .env("GH_TOKEN", placeholder("GH_TOKEN"))
        .output()
        .await
        .expect("bwrap (bubblewrap, scripts/test-deps.sh)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
    assert_eq!(text.matches("hello from upstream").count(), 1, "{text}");
    for escaped in ["NOPROXY-REACHED", "RAW-REACHED", "PUBLIC-REACHED"] {
        assert!(!text.contains(escaped), "{text}");
    }
    let (auth, _) = seen.recv().await.unwrap();
    assert_eq!(auth.as_deref(), Some(format!("Bearer {TOKEN}").as_str()));
    assert!(
        seen.try_recv().is_err(),
        "the upstream was reached another way"
    );
}

/// The policies a shared proxy's tests serve, and how often each was read.
struct Policies {
    by_session: std::collections::HashMap<String, serde_json::Value>,
    reads: std::sync::atomic::AtomicUsize,
}

impl PolicySource for Policies {
    fn policy<'a>(&'a self, session: &'a str) -> PolicyFuture<'a> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let policy = self
            .by_session
            .get(session)
            .map(|p| serde_json::from_value(p.clone()).unwrap());
        Box::pin(async move { Ok(policy) })
    }
}

const SHARED_KEY: [u8; 32] = [42; 32];

/// A shared proxy (one replica) over `policies`, on a listener of its own.
async fn shared_proxy(dir: &Path, policies: Arc<Policies>) -> (Arc<SharedProxy>, String) {
    let proxy = SharedProxy::new(
        SessionKey::new(SHARED_KEY),
        policies,
        SharedSettings::default(),
        Some(&dir.join("ca.pem")),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        proxy
            .clone()
            .listen(listener, tokio_util::sync::CancellationToken::new()),
    );
    (proxy, addr)
}

/// `curl` with `proxy_url` (userinfo and all) as its proxy, trusting `ca`.
async fn curl_via(proxy_url: &str, ca: &Path, args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "--show-error"])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("HTTP_PROXY", proxy_url)
        .env("HTTPS_PROXY", proxy_url)
        .env("http_proxy", proxy_url)
        .env("https_proxy", proxy_url)
        .env("SSL_CERT_FILE", ca)
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
    (out.status.success(), text)
}

/// The session CA as a worker fetches it: `GET /ca.pem` to the proxy itself, with the
/// session's credentials.
async fn fetch_ca(addr: &str, session: &str, credential: &str, into: &Path) -> (bool, String) {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "--noproxy", "*", "-u"])
        .arg(format!("{session}:{credential}"))
        .arg("-o")
        .arg(into)
        .arg("-w")
        .arg("%{http_code}")
        .arg(format!("http://{addr}{}", egress_proxy::CA_PATH))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
async fn a_shared_proxy_answers_407_without_the_sessions_credential_before_any_policy_is_read() {
    let dir = test_dir("shared-407");
    let (port, mut seen) = upstream(None).await;
    let policies = Arc::new(Policies {
        by_session: [(
            "s-one".to_owned(),
            serde_json::json!({"secrets": [secret(port)], "allow_private_networks": true}),
        )]
        .into(),
        reads: Default::default(),
    });
    let (proxy, addr) = shared_proxy(&dir, policies.clone()).await;
    let key = SessionKey::new(SHARED_KEY);
    let target = format!("http://127.0.0.1:{port}/");
    let ca = dir.join("ca.pem");

    let (_, out) = curl_via(&format!("http://{addr}"), &ca, &["-i", &target]).await;
    assert!(
        out.contains("407") && out.contains("x-egress-refused: proxy_auth_required"),
        "{out}"
    );
    assert!(out.contains("needs the session's credentials"), "{out}");
    // Another session's credential, a credential of another key, one made up: all 407,
    // for plain HTTP and for CONNECT alike.
    let other = key.credential("s-two");
    let foreign = SessionKey::new([1; 32]).credential("s-one");
    for credential in [other.as_str(), foreign.as_str(), "made-up"] {
        let url = format!("http://s-one:{credential}@{addr}");
        let (_, out) = curl_via(&url, &ca, &["-i", &target]).await;
        assert!(
            out.contains("x-egress-refused: proxy_auth_invalid"),
            "{out}"
        );
        let (ok, out) = curl_via(&url, &ca, &[&format!("https://127.0.0.1:{port}/")]).await;
        assert!(!ok && out.contains("407"), "{out}");
    }
    let (ok, code) = fetch_ca(&addr, "s-one", &other, &dir.join("refused.pem")).await;
    assert!(ok && code == "407", "{code}");
    assert_eq!(
        policies.reads.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a refused client reached the policy source"
    );
    assert_eq!(proxy.sessions(), 0);
    assert!(seen.try_recv().is_err());

    // With the session's own credential, its policy applies.
    let url = key.proxy_url("s-one", &addr);
    let (ok, out) = curl_via(&url, &ca, &[&target]).await;
    assert!(ok && out.contains("hello from upstream"), "{out}");
    assert_eq!(
        seen.recv().await.unwrap().0.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    // A session whose row is gone: refused as ended.
    let url = key.proxy_url("s-gone", &addr);
    let (_, out) = curl_via(&url, &ca, &["-i", &target]).await;
    assert!(
        out.contains("403") && out.contains("session_ended"),
        "{out}"
    );
    assert_eq!(
        proxy
            .counts
            .unauthorised
            .load(std::sync::atomic::Ordering::SeqCst),
        8
    );
}

#[tokio::test]
async fn two_sessions_on_one_shared_listener_get_their_own_policies_and_cas() {
    let dir = test_dir("shared-two");
    let (port, mut seen) = upstream(Some(tls_server(&dir))).await;
    let other_token = "ghp_the-other-sessions-credential";
    let mut second = secret(port);
    second["value"] = serde_json::json!(other_token);
    let policies = Arc::new(Policies {
        by_session: [
            (
                "s-one".to_owned(),
                serde_json::json!({"secrets": [secret(port)], "allow_private_networks": true}),
            ),
            (
                "s-two".to_owned(),
                serde_json::json!({"allow": ["docs.rs"], "secrets": [second],
                                   "allow_private_networks": true}),
            ),
            (
                "s-three".to_owned(),
                serde_json::json!({"allow": ["docs.rs"], "allow_private_networks": true}),
            ),
        ]
        .into(),
        reads: Default::default(),
    });
    let (_proxy, addr) = shared_proxy(&dir, policies.clone()).await;
    let key = SessionKey::new(SHARED_KEY);
    let https = format!("https://127.0.0.1:{port}/user");

    let mut cas = Vec::new();
    for session in ["s-one", "s-two"] {
        let path = dir.join(format!("{session}-ca.pem"));
        let (ok, code) = fetch_ca(&addr, session, &key.credential(session), &path).await;
        assert!(ok && code == "200", "{code}");
        let pem = std::fs::read_to_string(&path).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
        cas.push(path);
    }
    assert_ne!(
        std::fs::read(&cas[0]).unwrap(),
        std::fs::read(&cas[1]).unwrap(),
        "each session has its own CA"
    );

    // Each session's requests carry its own credential, ended with its own CA.
    let (ok, out) = curl_via(&key.proxy_url("s-one", &addr), &cas[0], &[&https]).await;
    assert!(ok && out.contains("hello from upstream"), "{out}");
    assert_eq!(
        seen.recv().await.unwrap().0.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    let (ok, out) = curl_via(&key.proxy_url("s-two", &addr), &cas[1], &[&https]).await;
    assert!(ok && out.contains("hello from upstream"), "{out}");
    assert_eq!(
        seen.recv().await.unwrap().0.as_deref(),
        Some(format!("Bearer {other_token}").as_str())
    );
    // One session's CA does not vouch for the other's certificates.
    let (ok, out) = curl_via(&key.proxy_url("s-two", &addr), &cas[0], &[&https]).await;
    assert!(!ok, "{out}");
    // A session whose allowlist leaves the host out is refused, whatever another allows.
    let (ok, out) = curl_via(&key.proxy_url("s-three", &addr), &cas[0], &[&https]).await;
    assert!(!ok && out.contains("403"), "{out}");
    assert!(seen.try_recv().is_err());

    // Another replica with the same key makes the same session CA: a sandbox that
    // fetched it from one replica is served by any.
    let (_replica, other_addr) = shared_proxy(&dir, policies).await;
    let (ok, out) = curl_via(&key.proxy_url("s-one", &other_addr), &cas[0], &[&https]).await;
    assert!(ok && out.contains("hello from upstream"), "{out}");
    assert_eq!(
        seen.recv().await.unwrap().0.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
}
