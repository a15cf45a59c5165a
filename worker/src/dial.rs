//! Dialing the brain: the WebSocket upgrade that proves the session (SPEC W3, X2).
//!
//! The upgrade request carries `Authorization: Bearer <token>`, the channel version
//! (`x-agent-channel-version`) and the session id (`x-agent-session-id`). The brain may
//! still be starting, so a connection that fails (refused, reset, DNS not ready) or an
//! upgrade answered with 5xx is retried with backoff for up to [`DIAL_WINDOW`]. An upgrade
//! answered with 4xx is final: the brain looked at the token or the version and said no.

use std::time::Duration;

use protocol::channel::{CHANNEL_VERSION, CHANNEL_VERSION_HEADER, SESSION_HEADER};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header::AUTHORIZATION};
use tokio_tungstenite::tungstenite::{self, Error};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::config::Config;

/// How long a brain that cannot be reached is retried.
pub const DIAL_WINDOW: Duration = Duration::from_secs(10);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

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

fn request(config: &Config) -> Result<tungstenite::handshake::client::Request, DialError> {
    let mut request = config
        .connect_url
        .as_str()
        .into_client_request()
        .map_err(|_| DialError::BadRequest)?;
    let mut bearer = HeaderValue::from_str(&format!("Bearer {}", config.token.expose()))
        .map_err(|_| DialError::BadRequest)?;
    bearer.set_sensitive(true);
    let headers = request.headers_mut();
    headers.insert(AUTHORIZATION, bearer);
    headers.insert(CHANNEL_VERSION_HEADER, HeaderValue::from(CHANNEL_VERSION));
    headers.insert(
        SESSION_HEADER,
        HeaderValue::from_str(&config.session.to_string()).map_err(|_| DialError::BadRequest)?,
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

/// Dials until connected, refused, or [`DIAL_WINDOW`] has passed.
pub async fn dial(config: &Config) -> Result<Socket, DialError> {
    let deadline = Instant::now() + DIAL_WINDOW;
    let mut backoff = FIRST_BACKOFF;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let attempt =
            tokio::time::timeout_at(deadline, tokio_tungstenite::connect_async(request(config)?))
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
        let now = Instant::now();
        if now + backoff >= deadline {
            tracing::warn!(attempts, class, "brain unreachable");
            return Err(DialError::Unreachable(class));
        }
        tracing::debug!(attempts, class, "dial failed, retrying");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
