//! The HTTP side: a client connection served with hyper, each request forwarded, tunnelled
//! or intercepted (see the crate's opening comment), and every exchange metered.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

use crate::Session;
use crate::ledger::Record;
use crate::upstream::{self, Refusal};

/// Where a client of the proxy reads the session CA (origin-form, to the proxy itself).
pub const CA_PATH: &str = "/ca.pem";

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// Headers of one hop only, never forwarded either way.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::UPGRADE,
];

pub(crate) async fn client<IO>(session: Arc<Session>, io: IO)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| handle(session.clone(), req));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades()
        .await;
}

async fn handle(
    session: Arc<Session>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if req.method() == Method::CONNECT {
        return Ok(connect(session, req).await);
    }
    // A request to the proxy itself: the session CA, which a worker fetches at start
    // for its commands' trust store.
    if req.uri().authority().is_none() && req.method() == Method::GET && req.uri().path() == CA_PATH
    {
        let mut response = text(StatusCode::OK, None, session.ca_pem().trim_end());
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-pem-file"),
        );
        return Ok(response);
    }
    let Some((host, port)) =
        target(req.uri(), 80).filter(|_| req.uri().scheme_str() == Some("http"))
    else {
        return Ok(text(
            StatusCode::BAD_REQUEST,
            None,
            "egress proxy: an absolute http:// URL (or CONNECT for https)",
        ));
    };
    if let Err(refusal) = admit(&session, &host, port) {
        return Ok(refuse(&session, &host, port, req.method(), refusal));
    }
    let tcp = match upstream::connect(
        &host,
        port,
        session.policy().allow_private_networks,
        session.bounds.upstream_timeout,
    )
    .await
    {
        Ok(tcp) => tcp,
        Err(refusal) => return Ok(refuse(&session, &host, port, req.method(), refusal)),
    };
    let sender = match handshake(tcp).await {
        Ok(sender) => sender,
        Err(refusal) => return Ok(refuse(&session, &host, port, req.method(), refusal)),
    };
    Ok(forward(&session, &Mutex::new(Some(sender)), req, &host, port, false).await)
}

/// `host` and `port` of a request target (`port` when it names none); an IPv6 address
/// keeps its brackets.
fn target(uri: &Uri, default_port: u16) -> Option<(String, u16)> {
    let authority = uri.authority()?;
    let host = authority.host().to_ascii_lowercase();
    (!host.is_empty()).then(|| (host, authority.port_u16().unwrap_or(default_port)))
}

/// The allowlist; the address rule comes when connecting.
fn admit(session: &Session, host: &str, port: u16) -> Result<(), Refusal> {
    if session.policy().allows(host, port) {
        Ok(())
    } else {
        Err(Refusal::NotAllowed)
    }
}

fn refuse(
    session: &Session,
    host: &str,
    port: u16,
    method: &Method,
    refusal: Refusal,
) -> Response<Body> {
    tracing::info!(port, class = refusal.class(), "egress refused");
    session.ledger.push(Record {
        host: host.to_owned(),
        port,
        method: method.as_str().to_owned(),
        status: refusal.status().as_u16(),
        refused: Some(refusal.class()),
        bytes_sent: 0,
        bytes_received: 0,
        intercepted: false,
        at: std::time::SystemTime::now(),
    });
    text(
        refusal.status(),
        Some(refusal.class()),
        &refusal.message(host, port),
    )
}

fn text(status: StatusCode, class: Option<&'static str>, message: &str) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(format!("{message}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Some(class) = class {
        headers.insert("x-egress-refused", HeaderValue::from_static(class));
    }
    response
}

async fn handshake<IO>(io: IO) -> Result<SendRequest<Body>, Refusal>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|_| Refusal::Unreachable)?;
    tokio::spawn(connection);
    Ok(sender)
}

/// `CONNECT host:port`: refused, tunnelled, or intercepted when the host has a secret.
/// The upstream is connected before the `200`, so a refusal is still an HTTP answer.
async fn connect(session: Arc<Session>, req: Request<Incoming>) -> Response<Body> {
    let Some((host, port)) = target(req.uri(), 443) else {
        return text(
            StatusCode::BAD_REQUEST,
            None,
            "egress proxy: CONNECT needs host:port",
        );
    };
    if let Err(refusal) = admit(&session, &host, port) {
        return refuse(&session, &host, port, &Method::CONNECT, refusal);
    }
    let timeout = session.bounds.upstream_timeout;
    let tcp = match upstream::connect(
        &host,
        port,
        session.policy().allow_private_networks,
        timeout,
    )
    .await
    {
        Ok(tcp) => tcp,
        Err(refusal) => return refuse(&session, &host, port, &Method::CONNECT, refusal),
    };
    let intercept = session.policy().has_secrets(&host, port);
    // Taken before the `200`, so the place is never free between the request's end and
    // the tunnel's start; the tunnel is bounded in time like any connection.
    let held = session.hold_connection();
    let limit = session.bounds.max_connection_time;
    tokio::spawn(async move {
        let _held = held;
        let Ok(upgraded) = hyper::upgrade::on(req).await else {
            return;
        };
        let client = TokioIo::new(upgraded);
        let carried = async {
            if intercept {
                intercepted(session, client, tcp, host, port).await;
            } else {
                tunnel(session, client, tcp, host, port).await;
            }
        };
        let _ = tokio::time::timeout(limit, carried).await;
    });
    Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed(),
    )
}

/// Bytes both ways, untouched, counted against the session's byte bound.
async fn tunnel<C>(
    session: Arc<Session>,
    client: C,
    upstream: tokio::net::TcpStream,
    host: String,
    port: u16,
) where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut up_read, mut up_write) = upstream.into_split();
    let (sent, received) = tokio::join!(
        pipe(&session, &mut client_read, &mut up_write),
        pipe(&session, &mut up_read, &mut client_write),
    );
    session.ledger.push(Record {
        host,
        port,
        method: Method::CONNECT.as_str().to_owned(),
        status: StatusCode::OK.as_u16(),
        refused: None,
        bytes_sent: sent,
        bytes_received: received,
        intercepted: false,
        at: std::time::SystemTime::now(),
    });
}

/// Copies until the end, an error or the byte bound; closes the writer; the bytes copied.
async fn pipe<R, W>(session: &Session, from: &mut R, to: &mut W) -> u64
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buffer = vec![0u8; 16 * 1024];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !session.count(n) || to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
        total += n as u64;
    }
    let _ = to.shutdown().await;
    total
}

impl Session {
    /// Adds `n` bytes to the session's total; false once it passed the byte bound.
    fn count(&self, n: usize) -> bool {
        let total = self.ledger.bytes.fetch_add(n as u64, Ordering::AcqRel) + n as u64;
        total <= self.bounds.max_bytes
    }
}

/// TLS ended with the session CA's certificate for `host`, each request forwarded over
/// one verified TLS connection to the upstream (made again if the upstream closed it).
async fn intercepted<C>(
    session: Arc<Session>,
    client: C,
    tcp: tokio::net::TcpStream,
    host: String,
    port: u16,
) where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Ok(server_config) = session.ca.server_config(&host) else {
        return;
    };
    let Ok(tls) = tokio_rustls::TlsAcceptor::from(server_config)
        .accept(client)
        .await
    else {
        return;
    };
    let first = upstream_sender(&session, tcp, &host).await.ok();
    let sender = Arc::new(Mutex::new(first));
    let service = service_fn(move |req| {
        let (session, sender, host) = (session.clone(), sender.clone(), host.clone());
        async move { Ok::<_, Infallible>(forward(&session, &sender, req, &host, port, true).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

async fn upstream_sender(
    session: &Session,
    tcp: tokio::net::TcpStream,
    host: &str,
) -> Result<SendRequest<Body>, Refusal> {
    let timeout = session.bounds.upstream_timeout;
    let tls = upstream::tls(tcp, host, session.upstream_tls.clone(), timeout).await?;
    handshake(tls).await
}

/// The held upstream connection, ready for a request (made again when it closed); held
/// locked until the response head arrives (HTTP/1.1: one request at a time).
async fn ready<'a>(
    session: &Session,
    held: &'a Mutex<Option<SendRequest<Body>>>,
    host: &str,
    port: u16,
    tls: bool,
) -> Result<tokio::sync::MutexGuard<'a, Option<SendRequest<Body>>>, Refusal> {
    let mut guard = held.lock().await;
    if let Some(sender) = guard.as_mut()
        && sender.ready().await.is_ok()
    {
        return Ok(guard);
    }
    let timeout = session.bounds.upstream_timeout;
    let tcp =
        upstream::connect(host, port, session.policy().allow_private_networks, timeout).await?;
    let sender = if tls {
        upstream_sender(session, tcp, host).await?
    } else {
        handshake(tcp).await?
    };
    *guard = Some(sender);
    Ok(guard)
}

/// One request to the upstream with the host's secrets set; the response streamed back
/// with their values masked in its headers, the exchange metered.
async fn forward(
    session: &Arc<Session>,
    held: &Mutex<Option<SendRequest<Body>>>,
    req: Request<Incoming>,
    host: &str,
    port: u16,
    tls: bool,
) -> Response<Body> {
    let method = req.method().clone();
    let mut guard = match ready(session, held, host, port, tls).await {
        Ok(guard) => guard,
        Err(refusal) => return refuse(session, host, port, &method, refusal),
    };
    let Some(sender) = guard.as_mut() else {
        return refuse(session, host, port, &method, Refusal::Unreachable);
    };
    let meter = Arc::new(Meter {
        session: session.clone(),
        host: host.to_owned(),
        port,
        method: method.as_str().to_owned(),
        status: AtomicU16::new(0),
        sent: AtomicU64::new(0),
        received: AtomicU64::new(0),
        intercepted: tls,
    });
    let req = match prepare(session, req, host, port, tls, &meter) {
        Some(req) => req,
        None => {
            return text(
                StatusCode::BAD_REQUEST,
                None,
                "egress proxy: invalid request target",
            );
        }
    };
    let sent =
        tokio::time::timeout(session.bounds.upstream_timeout, sender.send_request(req)).await;
    let response = match sent {
        Ok(Ok(response)) => response,
        Ok(Err(_)) => return refuse(session, host, port, &method, Refusal::Unreachable),
        Err(_) => return refuse(session, host, port, &method, Refusal::Timeout),
    };
    drop(guard);
    meter
        .status
        .store(response.status().as_u16(), Ordering::Relaxed);
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    mask_values(session, &mut parts.headers, host, port);
    let body = Metered {
        inner: body.map_err(BoxError::from).boxed(),
        meter,
        sending: false,
    };
    Response::from_parts(parts, body.boxed())
}

/// The request as the upstream gets it: origin-form target, one hop's headers gone, the
/// host's secrets set (the placeholder replaced wherever the client put it in the target
/// or a header, and each secret's header set to its format).
fn prepare(
    session: &Session,
    req: Request<Incoming>,
    host: &str,
    port: u16,
    tls: bool,
    meter: &Arc<Meter>,
) -> Option<Request<Body>> {
    let (mut parts, body) = req.into_parts();
    let default_port = if tls { 443 } else { 80 };
    let authority = if port == default_port {
        host.to_owned()
    } else {
        format!("{host}:{port}")
    };
    let mut path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    strip_hop_by_hop(&mut parts.headers);
    for secret in session.policy().secrets_for(host, port) {
        let placeholder = crate::placeholder(&secret.name);
        path = path.replace(&placeholder, &secret.value);
        for value in parts.headers.values_mut() {
            if let Ok(text) = value.to_str()
                && text.contains(&placeholder)
                && let Ok(replaced) =
                    HeaderValue::from_str(&text.replace(&placeholder, &secret.value))
            {
                *value = replaced;
            }
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(secret.header.as_bytes()),
            HeaderValue::from_str(&secret.format.replace("{value}", &secret.value)),
        ) {
            parts.headers.insert(name, value);
        }
    }
    parts.uri = match path.parse::<Uri>() {
        Ok(uri) => uri,
        Err(_) => return None,
    };
    if !parts.headers.contains_key(header::HOST)
        && let Ok(value) = HeaderValue::from_str(&authority)
    {
        parts.headers.insert(header::HOST, value);
    }
    let body = Metered {
        inner: body.map_err(BoxError::from).boxed(),
        meter: meter.clone(),
        sending: true,
    };
    Some(Request::from_parts(parts, body.boxed()))
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// An upstream that echoes a credential in a response header hands back the placeholder.
fn mask_values(session: &Session, headers: &mut HeaderMap, host: &str, port: u16) {
    for secret in session.policy().secrets_for(host, port) {
        for value in headers.values_mut() {
            if let Ok(text) = value.to_str()
                && text.contains(&secret.value)
                && let Ok(masked) = HeaderValue::from_str(
                    &text.replace(&secret.value, &crate::placeholder(&secret.name)),
                )
            {
                *value = masked;
            }
        }
    }
}

/// One exchange's counts; recorded in the ledger when both bodies are done with.
struct Meter {
    session: Arc<Session>,
    host: String,
    port: u16,
    method: String,
    status: AtomicU16,
    sent: AtomicU64,
    received: AtomicU64,
    intercepted: bool,
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.session.ledger.push(Record {
            host: std::mem::take(&mut self.host),
            port: self.port,
            method: std::mem::take(&mut self.method),
            status: self.status.load(Ordering::Relaxed),
            refused: None,
            bytes_sent: self.sent.load(Ordering::Relaxed),
            bytes_received: self.received.load(Ordering::Relaxed),
            intercepted: self.intercepted,
            at: std::time::SystemTime::now(),
        });
    }
}

/// A body counted frame by frame into its exchange and the session's byte bound.
struct Metered {
    inner: Body,
    meter: Arc<Meter>,
    /// The request body (bytes sent) or the response body (bytes received).
    sending: bool,
}

impl hyper::body::Body for Metered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            let n = data.len();
            let counter = if self.sending {
                &self.meter.sent
            } else {
                &self.meter.received
            };
            counter.fetch_add(n as u64, Ordering::Relaxed);
            if !self.meter.session.count(n) {
                return Poll::Ready(Some(Err(
                    "the session's egress byte bound is reached".into()
                )));
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
