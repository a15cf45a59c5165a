//! Dialing the brain: the WebSocket upgrade that proves the session (SPEC W3, W9, X2).
//!
//! The upgrade request carries `Authorization: Bearer <token>`, the channel version
//! (`x-agent-channel-version`) and the session id (`x-agent-session-id`) of an
//! [`Identity`]. A connection that fails (refused, reset, DNS not ready) or an upgrade
//! answered with 5xx is retried with a [`Backoff`] until the dial's deadline: for the first
//! dial [`DIAL_WINDOW`] (the brain may still be starting), for a re-dial the token's expiry
//! (after it no replica would take the token). An upgrade answered with 4xx is final: the
//! brain looked at the token or the version and said no.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protocol::SessionId;
use protocol::channel::{CHANNEL_VERSION, CHANNEL_VERSION_HEADER, POOL_AUDIENCE, SESSION_HEADER};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header::AUTHORIZATION};
use tokio_tungstenite::tungstenite::{self, Error};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::config::Token;

/// How long a brain that cannot be reached is retried at the first dial.
pub const DIAL_WINDOW: Duration = Duration::from_secs(10);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two attempts: well inside the brain's re-dial grace (5 s by
/// default), so a call waiting for this worker's re-dial sees it.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The brain answered the upgrade with this 4xx status.
    #[error("the brain refused the channel with HTTP {0}")]
    Refused(u16),
    /// Not connected within the window; the string is the last failure's class.
    #[error("the brain could not be reached ({0})")]
    Unreachable(&'static str),
    /// The request could not be built (the URL or a header is unusable).
    #[error("the upgrade request could not be built")]
    BadRequest,
}

impl DialError {
    pub fn class(&self) -> &'static str {
        match self {
            Self::Refused(_) => "refused",
            Self::Unreachable(_) => "unreachable",
            Self::BadRequest => "bad_request",
        }
    }
}

/// Who the worker dials as: the session and its newest token. A pooled worker starts as
/// its slot with a pool token and becomes the session a bind names, with that session's
/// token (R3).
#[derive(Clone, Debug)]
pub struct Identity {
    pub session: SessionId,
    pub token: Token,
    /// The token's `exp`, read from its claims (the worker cannot verify them; the brain
    /// does).
    expires: SystemTime,
    /// A pool token: the worker waits in a pool and may be bound to a session.
    pub pooled: bool,
}

impl Identity {
    /// `None` unless `token` is a JWT whose claims name `session`.
    pub fn new(session: SessionId, token: Token) -> Option<Self> {
        let claims = channel::token::read_claims(token.expose()).ok()?;
        (claims.sub == session).then(|| Self {
            session,
            expires: UNIX_EPOCH + Duration::from_secs(claims.exp),
            pooled: claims.aud == POOL_AUDIENCE,
            token,
        })
    }

    /// When the token expires, on the monotonic clock.
    pub fn expiry(&self) -> Instant {
        let left = self
            .expires
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        Instant::now() + left
    }
}

/// Waits between attempts: doubling from 100 ms to [`MAX_BACKOFF`], each drawn between
/// half and all of the step, so the workers a dead replica held do not dial the next one
/// in lockstep.
#[derive(Debug)]
pub struct Backoff {
    step: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            step: FIRST_BACKOFF,
        }
    }
}

impl Backoff {
    pub fn next_wait(&mut self) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(MAX_BACKOFF);
        let half = u64::try_from(step.as_millis() / 2).unwrap_or(u64::MAX);
        Duration::from_millis(half + rand::random_range(0..=half))
    }

    /// After a channel that worked: the next loss starts from the shortest wait again.
    pub fn reset(&mut self) {
        self.step = FIRST_BACKOFF;
    }
}

fn request(
    url: &str,
    identity: &Identity,
) -> Result<tungstenite::handshake::client::Request, DialError> {
    let mut request = url
        .into_client_request()
        .map_err(|_| DialError::BadRequest)?;
    let mut bearer = HeaderValue::from_str(&format!("Bearer {}", identity.token.expose()))
        .map_err(|_| DialError::BadRequest)?;
    bearer.set_sensitive(true);
    let headers = request.headers_mut();
    headers.insert(AUTHORIZATION, bearer);
    headers.insert(CHANNEL_VERSION_HEADER, HeaderValue::from(CHANNEL_VERSION));
    headers.insert(
        SESSION_HEADER,
        HeaderValue::from_str(&identity.session.to_string()).map_err(|_| DialError::BadRequest)?,
    );
    Ok(request)
}

/// What one attempt's failure means.
enum Attempt {
    Retry(&'static str),
    Final(DialError),
}

fn classify(err: Error) -> Attempt {
    match err {
        Error::Http(response) => {
            let status = response.status();
            if status.is_client_error() {
                Attempt::Final(DialError::Refused(status.as_u16()))
            } else {
                Attempt::Retry("http_status")
            }
        }
        Error::Io(_) => Attempt::Retry("io"),
        Error::Url(_) | Error::HttpFormat(_) => Attempt::Final(DialError::BadRequest),
        Error::Tls(_) => Attempt::Retry("tls"),
        Error::ConnectionClosed | Error::AlreadyClosed => Attempt::Retry("closed"),
        _ => Attempt::Retry("protocol"),
    }
}

/// Dials `url` as `identity` until connected, refused, or `deadline` has passed.
pub async fn dial(
    url: &str,
    identity: &Identity,
    deadline: Instant,
    backoff: &mut Backoff,
) -> Result<Socket, DialError> {
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let attempt = tokio::time::timeout_at(
            deadline,
            tokio_tungstenite::connect_async(request(url, identity)?),
        )
        .await;
        let class = match attempt {
            Ok(Ok((socket, _response))) => {
                tracing::debug!(attempts, "upgrade accepted");
                return Ok(socket);
            }
            Ok(Err(err)) => match classify(err) {
                Attempt::Final(err) => return Err(err),
                Attempt::Retry(class) => class,
            },
            Err(_) => "timeout",
        };
        let wait = backoff.next_wait();
        if Instant::now() + wait >= deadline {
            tracing::warn!(attempts, class, "brain unreachable");
            return Err(DialError::Unreachable(class));
        }
        tracing::debug!(attempts, class, "dial failed, retrying");
        tokio::time::sleep(wait).await;
    }
}
