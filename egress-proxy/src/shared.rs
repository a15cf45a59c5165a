//! One proxy for many sessions (the Kubernetes launcher's, docs/design/egress.md): a
//! worker pod reaches a proxy Service shared by every session, so each client connection
//! says whose it is. It opens with `Proxy-Authorization: Basic base64(<session>:<credential>)`
//! (what every HTTP client sends from a proxy URL `http://<session>:<credential>@host:port`,
//! for plain requests and for `CONNECT`; `Authorization` too for the origin-form
//! `GET /ca.pem`), where the credential is a keyed hash of the session id that only the
//! launcher and the proxy can make ([`SessionKey`]). A missing or wrong one is `407` before
//! anything else happens, so a session id alone, or another session's credential, reaches
//! no policy and no session.
//!
//! Sessions are made on a connection's first use from a [`PolicySource`] (the manager's
//! reading of the session's agent from Postgres), kept while in use and dropped after an
//! idle time, at most [`SharedSettings::max_sessions`] at once; each has its own bounds and
//! ledger, and its own CA, whose key is drawn from the same keyed hash: every replica, and a
//! replica after a restart, signs with the key the sandbox already trusts.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use aws_lc_rs::hmac;
use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_util::sync::CancellationToken;

use crate::{Bounds, ProxyError, Session, SessionPolicy, ca, upstream};

/// The label `BRAIN_SECRETS_KEY` is derived under (`SecretsKey::derive`) for the key of
/// [`SessionKey`]: the launcher and the proxy derive the same one.
pub const SESSION_KEY_LABEL: &str = "egress-proxy session credentials v1";

/// The longest session id a client may name.
const MAX_SESSION_ID: usize = 64;
/// The longest request head read before the session is known.
const MAX_HEAD: usize = 16 * 1024;

/// The key of the sessions' credentials and CAs. `Debug` never shows it.
#[derive(Clone)]
pub struct SessionKey {
    key: hmac::Key,
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(redacted)")
    }
}

impl SessionKey {
    /// `key`: `SecretsKey::derive(SESSION_KEY_LABEL)`.
    pub fn new(key: [u8; 32]) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &key),
        }
    }

    fn tag(&self, purpose: &[u8], session: &str) -> hmac::Tag {
        let mut context = hmac::Context::with_key(&self.key);
        context.update(purpose);
        context.update(&[0]);
        context.update(session.as_bytes());
        context.sign()
    }

    /// The credential of `session`: base64url, safe in a URL's userinfo as it is.
    pub fn credential(&self, session: &str) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(self.tag(b"credential", session).as_ref())
    }

    /// Whether `credential` is `session`'s, compared in constant time.
    pub fn verify(&self, session: &str, credential: &str) -> bool {
        let Ok(given) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(credential) else {
            return false;
        };
        let mut signed = b"credential\0".to_vec();
        signed.extend_from_slice(session.as_bytes());
        hmac::verify(&self.key, &signed, &given).is_ok()
    }

    /// The proxy URL a session's worker is given: `http://<session>:<credential>@<address>`.
    pub fn proxy_url(&self, session: &str, address: &str) -> String {
        format!("http://{session}:{}@{address}", self.credential(session))
    }

    /// The session's CA, the same wherever it is made with this key.
    pub(crate) fn ca(&self, session: &str) -> Result<ca::SessionCa, ProxyError> {
        for attempt in 0u8..=255 {
            let mut purpose = b"ca".to_vec();
            purpose.push(attempt);
            let tag = self.tag(&purpose, session);
            let mut seed = [0u8; 32];
            seed.copy_from_slice(tag.as_ref());
            if let Some(ca) = ca::SessionCa::derive(&seed)? {
                return Ok(ca);
            }
        }
        Err(ProxyError::Tls("certificate: no session key".into()))
    }
}

/// Why a session's policy could not be read: a bounded class for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyUnavailable(pub &'static str);

pub type PolicyFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<SessionPolicy>, PolicyUnavailable>> + Send + 'a>>;

/// Where a shared proxy reads a session's policy. `Ok(None)`: no live session of that id
/// (it ended, or never was).
pub trait PolicySource: Send + Sync + 'static {
    fn policy<'a>(&'a self, session: &'a str) -> PolicyFuture<'a>;
}

/// A shared proxy's settings.
#[derive(Clone, Debug)]
pub struct SharedSettings {
    /// Each session's own bounds (per replica).
    pub bounds: Bounds,
    /// Sessions kept at once; a connection of one more is answered `503` while none of
    /// those kept is idle.
    pub max_sessions: usize,
    /// A session without an open connection for this long is dropped (made again, with
    /// the same CA, at its next connection).
    pub idle_expiry: Duration,
    /// A session's policy is read again at a connection's open when it is older than this,
    /// so a changed allowlist or secret applies within it.
    pub refresh_after: Duration,
    /// Reading a connection's first request head, and a policy.
    pub head_timeout: Duration,
}

impl Default for SharedSettings {
    fn default() -> Self {
        Self {
            bounds: Bounds::default(),
            max_sessions: 1024,
            idle_expiry: Duration::from_secs(10 * 60),
            refresh_after: Duration::from_secs(10),
            head_timeout: Duration::from_secs(10),
        }
    }
}

/// Counts of a shared proxy, for its metrics.
#[derive(Debug, Default)]
pub struct SharedCounts {
    /// Connections answered `407` (no or a wrong credential).
    pub unauthorised: AtomicU64,
    /// Connections whose session has ended (`403 session_ended`).
    pub ended: AtomicU64,
    /// Connections refused because the policy could not be read or too many sessions were
    /// kept (`503`).
    pub unavailable: AtomicU64,
    /// Connections handed to their session.
    pub served: AtomicU64,
}

struct Entry {
    /// Built on first use; locked while a policy is read, so one session's connections
    /// opening together read it once.
    built: tokio::sync::Mutex<Option<(Arc<Session>, Instant)>>,
    last_used: Mutex<Instant>,
}

/// The proxy of every session, on one listener or many.
pub struct SharedProxy {
    key: SessionKey,
    source: Arc<dyn PolicySource>,
    settings: SharedSettings,
    upstream_tls: Arc<rustls::ClientConfig>,
    sessions: Mutex<HashMap<String, Arc<Entry>>>,
    /// Sessions dropped since a ledger writer last took their records.
    dropped: Mutex<Vec<(String, Arc<Session>)>>,
    pub counts: SharedCounts,
}

/// A refusal written before the session's own proxy takes the connection.
struct Early {
    status: &'static str,
    class: &'static str,
    message: &'static str,
}

const NO_CREDENTIALS: Early = Early {
    status: "407 Proxy Authentication Required",
    class: "proxy_auth_required",
    message: "egress proxy: this proxy needs the session's credentials \
              (Proxy-Authorization: Basic, from the proxy URL in WORKER_EGRESS_PROXY)",
};
const BAD_CREDENTIALS: Early = Early {
    status: "407 Proxy Authentication Required",
    class: "proxy_auth_invalid",
    message: "egress proxy: these credentials are not valid for the session they name",
};
const ENDED: Early = Early {
    status: "403 Forbidden",
    class: "session_ended",
    message: "egress proxy: the session of these credentials has ended",
};
const UNAVAILABLE: Early = Early {
    status: "503 Service Unavailable",
    class: "policy_unavailable",
    message: "egress proxy: the session's egress configuration cannot be read now",
};
const TOO_MANY: Early = Early {
    status: "503 Service Unavailable",
    class: "too_many_sessions",
    message: "egress proxy: this proxy serves as many sessions as it may",
};

impl SharedProxy {
    /// `extra_roots`: a PEM file of upstream roots trusted beside the system's.
    pub fn new(
        key: SessionKey,
        source: Arc<dyn PolicySource>,
        settings: SharedSettings,
        extra_roots: Option<&std::path::Path>,
    ) -> Result<Arc<Self>, ProxyError> {
        Ok(Arc::new(Self {
            key,
            source,
            settings,
            upstream_tls: upstream::client_config(extra_roots)?,
            sessions: Mutex::default(),
            dropped: Mutex::default(),
            counts: SharedCounts::default(),
        }))
    }

    /// Sessions kept now.
    pub fn sessions(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// The sessions whose records a ledger writer takes (`Session::take_records`): every
    /// session kept, and once more each dropped since the last call.
    pub fn sessions_to_flush(&self) -> Vec<(String, Arc<Session>)> {
        let mut sessions = std::mem::take(&mut *lock(&self.dropped));
        let entries: Vec<(String, Arc<Entry>)> = lock(&self.sessions)
            .iter()
            .map(|(id, entry)| (id.clone(), entry.clone()))
            .collect();
        for (id, entry) in entries {
            if let Ok(built) = entry.built.try_lock()
                && let Some((session, _)) = built.as_ref()
            {
                sessions.push((id, session.clone()));
            }
        }
        sessions
    }

    /// Serves every connection of `listener` until `stop` (the connections open included).
    pub async fn listen(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        stop: CancellationToken,
    ) {
        crate::accept(listener, stop, move |stream| self.clone().serve(stream)).await;
    }

    /// Serves one client connection: its credentials checked on its first request head,
    /// then the connection handed to its session (which answers `/ca.pem` too).
    pub async fn serve<IO>(self: Arc<Self>, mut io: IO)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let head = match tokio::time::timeout(self.settings.head_timeout, read_head(&mut io)).await
        {
            Ok(Some(head)) => head,
            _ => return,
        };
        let (session_id, credential) = match identity(&head) {
            Some(identity) => identity,
            None => {
                self.counts.unauthorised.fetch_add(1, Ordering::Relaxed);
                return early(io, &NO_CREDENTIALS).await;
            }
        };
        if !self.key.verify(&session_id, &credential) {
            self.counts.unauthorised.fetch_add(1, Ordering::Relaxed);
            tracing::info!("egress proxy: credentials refused");
            return early(io, &BAD_CREDENTIALS).await;
        }
        let session = match self.session(&session_id).await {
            Ok(session) => session,
            Err(refusal) => {
                let counter = if refusal.class == ENDED.class {
                    &self.counts.ended
                } else {
                    &self.counts.unavailable
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tracing::info!(class = refusal.class, "egress proxy: session refused");
                return early(io, refusal).await;
            }
        };
        self.counts.served.fetch_add(1, Ordering::Relaxed);
        session.serve(Replay { head, at: 0, io }).await;
        if let Some(entry) = lock(&self.sessions).get(&session_id) {
            *lock(&entry.last_used) = Instant::now();
        }
    }

    /// The session `id` (its credentials checked), made or refreshed from the source.
    async fn session(&self, id: &str) -> Result<Arc<Session>, &'static Early> {
        let entry = self.entry(id).ok_or(&TOO_MANY)?;
        let mut built = entry.built.lock().await;
        if let Some((session, read)) = built.as_ref()
            && read.elapsed() < self.settings.refresh_after
        {
            return Ok(session.clone());
        }
        let read = tokio::time::timeout(self.settings.head_timeout, self.source.policy(id)).await;
        let policy = match read {
            Ok(Ok(Some(policy))) => policy,
            Ok(Ok(None)) => {
                drop(built);
                self.forget(id);
                return Err(&ENDED);
            }
            Ok(Err(PolicyUnavailable(class))) => {
                tracing::warn!(class, "egress proxy: a session's policy could not be read");
                return Err(&UNAVAILABLE);
            }
            Err(_) => {
                tracing::warn!(
                    class = "timeout",
                    "egress proxy: a session's policy could not be read"
                );
                return Err(&UNAVAILABLE);
            }
        };
        let session = match built.as_ref() {
            Some((session, _)) => session.set_policy(policy).map(|()| session.clone()),
            None => self.build(id, policy),
        };
        match session {
            Ok(session) => {
                *built = Some((session.clone(), Instant::now()));
                Ok(session)
            }
            Err(e) => {
                tracing::warn!(error = %e, "egress proxy: a session's policy is invalid");
                Err(&UNAVAILABLE)
            }
        }
    }

    fn build(&self, id: &str, policy: SessionPolicy) -> Result<Arc<Session>, ProxyError> {
        Session::assemble(
            policy,
            self.settings.bounds,
            self.upstream_tls.clone(),
            self.key.ca(id)?,
        )
    }

    /// The entry of `id`, made if need be; `None` when as many sessions are kept as may be
    /// and none of them is idle.
    fn entry(&self, id: &str) -> Option<Arc<Entry>> {
        let mut sessions = lock(&self.sessions);
        if let Some(entry) = sessions.get(id) {
            *lock(&entry.last_used) = Instant::now();
            return Some(entry.clone());
        }
        if sessions.len() >= self.settings.max_sessions {
            let idle: Vec<String> = sessions
                .iter()
                .filter(|(_, entry)| self.is_idle(entry))
                .map(|(id, _)| id.clone())
                .collect();
            for id in idle {
                if let Some(entry) = sessions.remove(&id) {
                    self.keep_for_writer(id, &entry);
                }
            }
            if sessions.len() >= self.settings.max_sessions {
                return None;
            }
        }
        let entry = Arc::new(Entry {
            built: tokio::sync::Mutex::new(None),
            last_used: Mutex::new(Instant::now()),
        });
        sessions.insert(id.to_owned(), entry.clone());
        Some(entry)
    }

    /// Unused for the idle expiry with no connection open (one being made is in use).
    fn is_idle(&self, entry: &Entry) -> bool {
        if lock(&entry.last_used).elapsed() < self.settings.idle_expiry {
            return false;
        }
        match entry.built.try_lock() {
            Ok(built) => built
                .as_ref()
                .is_none_or(|(session, _)| session.open_connections() == 0),
            Err(_) => false,
        }
    }

    fn forget(&self, id: &str) {
        if let Some(entry) = lock(&self.sessions).remove(id) {
            self.keep_for_writer(id.to_owned(), &entry);
        }
    }

    fn keep_for_writer(&self, id: String, entry: &Entry) {
        if let Ok(built) = entry.built.try_lock()
            && let Some((session, _)) = built.as_ref()
        {
            lock(&self.dropped).push((id, session.clone()));
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The bytes up to the end of the first request head (and whatever came with them);
/// `None` when the client closed first or the head is longer than [`MAX_HEAD`].
async fn read_head<IO: AsyncRead + Unpin>(io: &mut IO) -> Option<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut buffer = [0u8; 4096];
    loop {
        let n = io.read(&mut buffer).await.ok()?;
        if n == 0 {
            return None;
        }
        let searched_from = head.len().saturating_sub(3);
        head.extend_from_slice(&buffer[..n]);
        if head[searched_from..].windows(4).any(|w| w == b"\r\n\r\n") {
            return Some(head);
        }
        if head.len() > MAX_HEAD {
            return None;
        }
    }
}

/// The session and credential of a request head's `Proxy-Authorization` (or, for a
/// request to the proxy itself, `Authorization`): `Basic base64(<session>:<credential>)`.
fn identity(head: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(head).ok()?;
    let end = text.find("\r\n\r\n")?;
    let mut lines = text[..end].split("\r\n");
    let request_line = lines.next()?;
    let origin_form = request_line
        .split(' ')
        .nth(1)
        .is_some_and(|t| t.starts_with('/'));
    let mut found = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name.eq_ignore_ascii_case("proxy-authorization")
            || (origin_form && found.is_none() && name.eq_ignore_ascii_case("authorization"))
        {
            found = Some(value.trim());
        }
    }
    let (scheme, encoded) = found?.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (session, credential) = decoded.split_once(':')?;
    let valid = !session.is_empty()
        && session.len() <= MAX_SESSION_ID
        && session
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    valid.then(|| (session.to_owned(), credential.to_owned()))
}

async fn early<IO: AsyncWrite + Unpin>(mut io: IO, refusal: &Early) {
    let body = format!("{}\n", refusal.message);
    let authenticate = if refusal.status.starts_with("407") {
        "proxy-authenticate: Basic realm=\"egress\"\r\n"
    } else {
        ""
    };
    let response = format!(
        "HTTP/1.1 {}\r\n{authenticate}x-egress-refused: {}\r\n\
         content-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        refusal.status,
        refusal.class,
        body.len()
    );
    let _ = io.write_all(response.as_bytes()).await;
    let _ = io.shutdown().await;
}

/// The connection with the head already read put back in front.
struct Replay<IO> {
    head: Vec<u8>,
    at: usize,
    io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Replay<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.head.len() {
            let n = buf.remaining().min(self.head.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.head[at..at + n]);
            self.at += n;
            if self.at == self.head.len() {
                self.head = Vec::new();
                self.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Replay<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_the_sessions_own() {
        let key = SessionKey::new([7; 32]);
        let credential = key.credential("s-1");
        assert!(key.verify("s-1", &credential));
        assert!(!key.verify("s-2", &credential));
        assert!(!key.verify("s-1", "not base64 !"));
        assert!(!SessionKey::new([8; 32]).verify("s-1", &credential));
        assert!(!format!("{key:?}").contains('7'));
        assert_eq!(
            key.proxy_url("s-1", "proxy:3128"),
            format!("http://s-1:{credential}@proxy:3128")
        );
    }

    #[test]
    fn the_identity_is_read_from_the_proxy_authorization_header() {
        let basic = |user: &str| base64::engine::general_purpose::STANDARD.encode(user);
        let head = |line: &str, header: &str| {
            format!("{line}\r\nHost: x\r\n{header}\r\n\r\n").into_bytes()
        };
        let connect = "CONNECT api.github.com:443 HTTP/1.1";
        assert_eq!(
            identity(&head(
                connect,
                &format!("proxy-authorization: Basic {}", basic("s-1:c"))
            )),
            Some(("s-1".into(), "c".into()))
        );
        // `Authorization` names the proxy's own user only for a request to the proxy.
        let auth = format!("Authorization: Basic {}", basic("s-1:c"));
        assert_eq!(identity(&head(connect, &auth)), None);
        assert_eq!(
            identity(&head("GET /ca.pem HTTP/1.1", &auth)),
            Some(("s-1".into(), "c".into()))
        );
        for bad in [
            format!("Proxy-Authorization: Bearer {}", basic("s-1:c")),
            format!("Proxy-Authorization: Basic {}", basic("no-colon")),
            format!("Proxy-Authorization: Basic {}", basic("a/b:c")),
            "Proxy-Authorization: Basic !!".to_owned(),
        ] {
            assert_eq!(identity(&head(connect, &bad)), None, "{bad}");
        }
    }
}
