//! Chat channels (P10) and their delivery router (P11): an agent reached from the chat
//! apps people use.
//!
//! - `telegram.rs`: the Telegram Bot API calls the brain makes and the updates it reads;
//! - `slack.rs`: the Slack Web API calls, the Events API's envelope and its v0 signature;
//! - `text.rs`: a reply cut under a platform's limit and written in its formatting;
//! - `inbound.rs`: a platform's message to a channel becomes a detached turn of the
//!   conversation's chat, or a refusal;
//! - `deliver.rs`: a reply claimed from the outbox sent, part by part;
//! - `prompts.rs`: an approval asked as the platform's buttons, and a press answered;
//! - `progress.rs`: a Slack message updated while the answer streams.
//!
//! [`Platform`] (here) is a channel's platform API as the last three call it.
//!
//! Replies travel through the webhooks' outbox (P4): the turn's end writes the row
//! (migration 0062's trigger), the webhooks' loop (`webhooks/deliver.rs`) claims it with
//! its lease and hands it here. docs/design/channels.md is the design.

pub mod deliver;
pub mod inbound;
pub mod progress;
pub mod prompts;
pub mod slack;
pub mod telegram;
pub mod text;

use std::time::Duration;

use crate::config::WebhooksConfig;

/// The platforms a channel may be on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Telegram,
    Slack,
}

impl Kind {
    pub const ALL: [Self; 2] = [Self::Telegram, Self::Slack];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Telegram => "telegram",
            Self::Slack => "slack",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == raw)
    }

    /// Characters one message may hold.
    pub fn message_limit(self) -> usize {
        match self {
            Self::Telegram => telegram::MESSAGE_LIMIT,
            // A `section` block's text holds 3,000; one text field is what is sent.
            Self::Slack => 3000,
        }
    }
}

/// The HTTP client channels call platforms with: the webhooks' (the same address rule at
/// every connection, no redirects, no proxy).
pub fn client(config: &WebhooksConfig) -> reqwest::Result<reqwest::Client> {
    crate::address::client(config.timeout, config.allow_private_networks)
}

pub(crate) use crate::address::request_class;

/// A channel's platform API, reached with the webhooks' client and rules.
pub struct Platform<'a> {
    pub client: &'a reqwest::Client,
    pub base: &'a str,
    pub token: &'a str,
    pub config: &'a WebhooksConfig,
}

impl Platform<'_> {
    pub fn bot(&self) -> telegram::Bot<'_> {
        telegram::Bot {
            client: self.client,
            base: self.base,
            token: self.token,
            allow_private_networks: self.config.allow_private_networks,
            timeout: self.config.timeout,
        }
    }

    pub fn api(&self) -> slack::Api<'_> {
        slack::Api {
            client: self.client,
            base: self.base,
            token: self.token,
            allow_private_networks: self.config.allow_private_networks,
            timeout: self.config.timeout,
        }
    }
}

/// What a platform answered a call: its status, the wait it asked for in `Retry-After`,
/// and its body as JSON (`None` when it was not JSON or over `max_answer` bytes).
pub(crate) struct Answer {
    pub status: u16,
    pub retry_after: Option<Duration>,
    pub body: Option<serde_json::Value>,
}

/// POSTs `body` as JSON to `url` (`bearer` as its token, when given): the URL judged by
/// the address rule first, the request and the reading of its answer bounded by `timeout`
/// each. The platforms' calls share this; each reads the answer its own way.
pub(crate) async fn post_json(
    client: &reqwest::Client,
    url: &str,
    bearer: Option<&str>,
    body: &serde_json::Value,
    allow_private_networks: bool,
    timeout: Duration,
    max_answer: usize,
) -> Result<Answer, CallError> {
    let url = reqwest::Url::parse(url).map_err(|_| CallError::transient("invalid_url"))?;
    if let Err(refused) = crate::address::check_url(&url, allow_private_networks) {
        return Err(CallError::transient(refused.class()));
    }
    let mut request = client.post(url).json(body);
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    let response = match tokio::time::timeout(timeout, request.send()).await {
        Err(_) => return Err(CallError::transient("timeout")),
        Ok(Err(e)) => return Err(CallError::transient(request_class(&e))),
        Ok(Ok(response)) => response,
    };
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .map(Duration::from_secs);
    let body = tokio::time::timeout(timeout, read_bounded(response, max_answer))
        .await
        .ok()
        .flatten()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    Ok(Answer {
        status,
        retry_after,
        body,
    })
}

/// At most `max` bytes of `response`'s body; `None` past it or on a broken body.
async fn read_bounded(mut response: reqwest::Response, max: usize) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.ok()? {
        if body.len() + chunk.len() > max {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    Some(body)
}

/// Why a platform call failed: a class for logs and attempt rows (never the platform's
/// description, which may quote the message), whether trying again can help, and the
/// wait the platform asked for (429).
#[derive(Debug)]
pub struct CallError {
    pub class: &'static str,
    pub status: Option<u16>,
    pub permanent: bool,
    pub retry_after: Option<Duration>,
}

impl CallError {
    pub(crate) fn transient(class: &'static str) -> Self {
        Self {
            class,
            status: None,
            permanent: false,
            retry_after: None,
        }
    }
}

fn status_class(status: u16) -> &'static str {
    match status {
        400 => "bad_request",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        429 => "rate_limited",
        500..=599 => "server_error",
        _ => "status",
    }
}
