//! `POST/GET /v1/agents/{agent_id}/channels`, `GET/DELETE
//! /v1/agents/{agent_id}/channels/{channel_id}`: an agent's chat channels (P10), for
//! admins; and `POST /v1/channels/{channel_id}/telegram`, `…/slack` and
//! `…/slack/interactivity`, where the platform delivers the channel's messages and the
//! presses of its buttons (authenticated by the channel's `secret_token`, or Slack's
//! signature under its signing secret, not by a team key).
//! Credentials are sealed and never answered. docs/design/channels.md is the design.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use protocol::{AgentId, ErrorBody};
use rand::Rng;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{ClientAddr, JsonBody, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::address;
use engine::auth::{Principal, constant_time_eq};
use engine::channels::inbound::{self, InboundError};
use engine::channels::prompts;
use engine::channels::slack::{self, Api};
use engine::channels::telegram::{self, Bot};
use engine::channels::{self, Kind};
use store::channels::{ChannelRow, NewChannel, OpenedChannel};
use store::{SecretsError, StoreError, bounded};

/// Channels per agent.
pub const MAX_PER_AGENT: i64 = 10;
/// People or Slack channels a channel may allow.
const MAX_ALLOWED: usize = 1000;
/// Bytes of an update taken at most (a Telegram text message is far below).
const MAX_UPDATE: usize = 256 * 1024;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"kind": "telegram", "bot_token": "123456:ABC-DEF", "allowed_users": ["123456789"]}))]
pub struct CreateChannel {
    /// `telegram` or `slack`.
    kind: String,
    /// The bot's token (Telegram: from @BotFather; Slack: the app's `xoxb-` bot token).
    /// Sealed; never answered.
    bot_token: String,
    /// Slack only, required: the app's signing secret, which every event is signed with.
    /// Sealed; never answered.
    #[serde(default)]
    signing_secret: Option<String>,
    /// The platform user ids that may talk to the agent (Telegram: numeric; Slack: `U…`),
    /// at most 1000. Telegram: at least one.
    #[serde(default)]
    allowed_users: Vec<String>,
    /// Slack only: the channel ids (`C…`, `G…`, `D…`) where anyone may talk to the agent,
    /// at most 1000. With `allowed_users`, at least one id in all.
    #[serde(default)]
    allowed_channels: Vec<String>,
    /// The platform API to call instead of the public one (a self-hosted Telegram Bot API
    /// server, a Slack-compatible gateway): held to the connectors' address rule.
    #[serde(default)]
    api_base: Option<String>,
}

/// A channel as its admin sees it, with the URL the platform delivers to.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ChannelView {
    #[serde(flatten)]
    channel: ChannelRow,
    /// Where the platform sends the channel's messages (Telegram: registered by the brain).
    webhook_url: String,
    /// Slack only: where Slack sends the presses of the channel's buttons (the app's
    /// Interactivity Request URL). Telegram sends them to `webhook_url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    interactivity_url: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ChannelList {
    channels: Vec<ChannelView>,
}

fn view(state: &AppState, channel: ChannelRow) -> ChannelView {
    let webhook_url = webhook_url(state, channel.id, &channel.kind);
    let interactivity_url =
        (channel.kind == Kind::Slack.as_str()).then(|| format!("{webhook_url}/interactivity"));
    ChannelView {
        channel,
        webhook_url,
        interactivity_url,
    }
}

fn webhook_url(state: &AppState, id: Uuid, kind: &str) -> String {
    format!("{}/v1/channels/{id}/{kind}", state.config.oauth.public_url)
}

fn secrets_error(err: SecretsError) -> ApiError {
    match err {
        SecretsError::NotConfigured => ApiError::NotConfigured(
            "channels need BRAIN_SECRETS_KEY, which their bot tokens are sealed under; \
             it is unset on this server",
        ),
        SecretsError::TooMany => ApiError::InvalidRequest(format!(
            "an agent may have at most {MAX_PER_AGENT} channels; delete one first"
        )),
        SecretsError::Crypto => ApiError::Internal("a channel's credentials do not open".into()),
        SecretsError::Store(StoreError::NotFound) => ApiError::NotFound("agent"),
        SecretsError::Store(e) => e.into(),
    }
}

fn checked(body: &CreateChannel, allow_private: bool) -> Result<(Kind, String), ApiError> {
    let kind = Kind::parse(&body.kind)
        .ok_or_else(|| ApiError::InvalidRequest("kind must be `telegram` or `slack`".into()))?;
    let token_ok = (1..=256).contains(&body.bot_token.len())
        && body
            .bot_token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b':' || b == b'_' || b == b'-');
    if !token_ok {
        return Err(ApiError::InvalidRequest(
            "bot_token must be 1 to 256 letters, digits, `:`, `_` or `-`".into(),
        ));
    }
    match kind {
        Kind::Telegram => checked_telegram(body)?,
        Kind::Slack => checked_slack(body)?,
    }
    let base = body.api_base.as_deref().unwrap_or(match kind {
        Kind::Telegram => telegram::DEFAULT_API_BASE,
        Kind::Slack => slack::DEFAULT_API_BASE,
    });
    let base = address::valid_url(base, allow_private, "BRAIN_WEBHOOKS_ALLOW_PRIVATE_NETWORKS")
        .map_err(|e| ApiError::InvalidRequest(format!("api_base: {e}")))?;
    Ok((kind, base.as_str().trim_end_matches('/').to_owned()))
}

fn checked_telegram(body: &CreateChannel) -> Result<(), ApiError> {
    if body.signing_secret.is_some() || !body.allowed_channels.is_empty() {
        return Err(ApiError::InvalidRequest(
            "signing_secret and allowed_channels are Slack's; a Telegram channel takes neither"
                .into(),
        ));
    }
    let users_ok = (1..=MAX_ALLOWED).contains(&body.allowed_users.len())
        && body
            .allowed_users
            .iter()
            .all(|u| !u.is_empty() && u.len() <= 64 && u.bytes().all(|b| b.is_ascii_digit()));
    if !users_ok {
        return Err(ApiError::InvalidRequest(format!(
            "allowed_users must list 1 to {MAX_ALLOWED} Telegram user ids (digits)"
        )));
    }
    Ok(())
}

/// A Slack id: `U…`, `C…`, capital letters and digits.
fn slack_id(id: &str) -> bool {
    (2..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
}

fn checked_slack(body: &CreateChannel) -> Result<(), ApiError> {
    let secret_ok = body
        .signing_secret
        .as_deref()
        .is_some_and(|s| (8..=256).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic()));
    if !secret_ok {
        return Err(ApiError::InvalidRequest(
            "a Slack channel needs signing_secret (the app's, 8 to 256 printable characters)"
                .into(),
        ));
    }
    let (users, channels) = (&body.allowed_users, &body.allowed_channels);
    let ids_ok = users.len() <= MAX_ALLOWED
        && channels.len() <= MAX_ALLOWED
        && users.len() + channels.len() > 0
        && users.iter().chain(channels).all(|id| slack_id(id));
    if !ids_ok {
        return Err(ApiError::InvalidRequest(format!(
            "allowed_users and allowed_channels must list Slack ids (capital letters and \
             digits), at most {MAX_ALLOWED} each and at least one in all"
        )));
    }
    Ok(())
}

/// A `secret_token` for Telegram's `setWebhook`: 48 of the characters it allows.
fn new_secret() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
    let mut rng = rand::rng();
    (0..48)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn bot<'a>(
    state: &'a AppState,
    client: &'a reqwest::Client,
    base: &'a str,
    token: &'a str,
) -> Bot<'a> {
    Bot {
        client,
        base,
        token,
        allow_private_networks: state.config.webhooks.allow_private_networks,
        timeout: state.config.webhooks.timeout,
    }
}

fn client(state: &AppState) -> Result<reqwest::Client, ApiError> {
    channels::client(&state.config.webhooks)
        .map_err(|_| ApiError::Internal("no HTTP client for the platform".into()))
}

/// Tells the platform of the channel, or checks its token: Telegram is pointed at `url`
/// with a secret the brain generates (`setWebhook`); Slack's token must pass `auth.test`
/// (its events are pointed at `url` in the app's settings, by the admin). Answers the
/// secret the platform's calls are checked with.
async fn register(
    state: &AppState,
    client: &reqwest::Client,
    kind: Kind,
    base: &str,
    body: &CreateChannel,
    url: &str,
) -> Result<String, ApiError> {
    match kind {
        Kind::Telegram => {
            let secret = new_secret();
            let bot = bot(state, client, base, &body.bot_token);
            if let Err(e) = bot.set_webhook(url, &secret).await {
                return Err(ApiError::InvalidRequest(format!(
                    "Telegram refused setWebhook ({}); check bot_token and api_base",
                    e.class
                )));
            }
            Ok(secret)
        }
        Kind::Slack => {
            let api = Api {
                client,
                base,
                token: &body.bot_token,
                allow_private_networks: state.config.webhooks.allow_private_networks,
                timeout: state.config.webhooks.timeout,
            };
            if let Err(e) = api.auth_test().await {
                return Err(ApiError::InvalidRequest(format!(
                    "Slack refused auth.test ({}); check bot_token and api_base",
                    e.class
                )));
            }
            Ok(body.signing_secret.clone().unwrap_or_default())
        }
    }
}

#[utoipa::path(
    post,
    path = "/agents/{agent_id}/channels",
    operation_id = "create_channel",
    tag = "channels",
    params(("agent_id" = Uuid, Path, description = "The agent.")),
    request_body = CreateChannel,
    responses(
        (status = 201, description = "Created; Telegram was told the `webhook_url` \
            (`setWebhook`, with a secret the brain keeps); Slack's token passed `auth.test` \
            (give the `webhook_url` as the app's Events API request URL).", body = ChannelView),
        (status = 400, description = "A bad field, an `api_base` the address rule refuses, \
            too many channels, or the platform refused the bot token (`invalid_request`).",
            body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such agent in the team (`not_found`).", body = ErrorBody),
        (status = 501, description = "The server has no `BRAIN_SECRETS_KEY` (`not_configured`).",
            body = ErrorBody),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(agent_id): Path<String>,
    JsonBody(body): JsonBody<CreateChannel>,
) -> Result<(StatusCode, Json<ChannelView>), ApiError> {
    principal.require_admin()?;
    let agent: AgentId = parse_id(&agent_id, "agent")?;
    if !state.store.secrets_configured() {
        return Err(secrets_error(SecretsError::NotConfigured));
    }
    let (kind, base) = checked(&body, state.config.webhooks.allow_private_networks)?;
    // Telegram is told of a channel only for an agent that exists.
    agent_exists(&state, &principal, agent).await?;
    let id = Uuid::now_v7();
    let client = client(&state)?;
    let url = webhook_url(&state, id, kind.as_str());
    let secret = register(&state, &client, kind, &base, &body, &url).await?;
    let new = NewChannel {
        id,
        kind: kind.as_str(),
        api_base: &base,
        allowed_users: &body.allowed_users,
        allowed_channels: &body.allowed_channels,
        token: &body.bot_token,
        secret: &secret,
    };
    let by = principal.actor(address);
    let created = bounded(async {
        state
            .store
            .create_channel(principal.team, agent, &new, MAX_PER_AGENT, &by)
            .await
            .map_err(|e| match e {
                SecretsError::Store(e) => e,
                other => StoreError::Corrupt(other.to_string()),
            })
    })
    .await;
    match created {
        Ok(row) => Ok((StatusCode::CREATED, Json(view(&state, row)))),
        Err(e) => {
            // The platform was pointed at a channel that is not kept.
            if kind == Kind::Telegram
                && let Err(undo) = bot(&state, &client, &base, &body.bot_token)
                    .delete_webhook()
                    .await
            {
                tracing::warn!(
                    class = undo.class,
                    "channels: webhook of a refused channel left set"
                );
            }
            Err(match e {
                StoreError::NotFound => ApiError::NotFound("agent"),
                StoreError::Corrupt(_) => secrets_error(SecretsError::TooMany),
                other => other.into(),
            })
        }
    }
}

#[utoipa::path(
    get,
    path = "/agents/{agent_id}/channels",
    operation_id = "list_channels",
    tag = "channels",
    params(("agent_id" = Uuid, Path, description = "The agent.")),
    responses(
        (status = 200, description = "The agent's channels, oldest first (never a token).",
            body = ChannelList),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such agent in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
) -> Result<Json<ChannelList>, ApiError> {
    principal.require_admin()?;
    let agent: AgentId = parse_id(&agent_id, "agent")?;
    agent_exists(&state, &principal, agent).await?;
    let rows = bounded(state.store.list_channels(principal.team, agent)).await?;
    let channels = rows.into_iter().map(|c| view(&state, c)).collect();
    Ok(Json(ChannelList { channels }))
}

/// `404 not_found` for an agent not of the principal's team.
async fn agent_exists(
    state: &AppState,
    principal: &Principal,
    agent: AgentId,
) -> Result<(), ApiError> {
    match bounded(state.store.agent(principal.team, agent)).await {
        Ok(_) => Ok(()),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

async fn find(
    state: &AppState,
    principal: &Principal,
    agent_id: &str,
    channel_id: &str,
) -> Result<OpenedChannel, ApiError> {
    let agent: AgentId = parse_id(agent_id, "channel")?;
    let id: Uuid = parse_id(channel_id, "channel")?;
    let found = bounded(async {
        state
            .store
            .agent_channel(principal.team, agent, id)
            .await
            .map_err(|e| match e {
                SecretsError::Store(e) => e,
                other => StoreError::Corrupt(other.to_string()),
            })
    })
    .await;
    match found {
        Ok(channel) => Ok(channel),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("channel")),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(
    get,
    path = "/agents/{agent_id}/channels/{channel_id}",
    operation_id = "get_channel",
    tag = "channels",
    params(
        ("agent_id" = Uuid, Path, description = "The agent."),
        ("channel_id" = Uuid, Path, description = "The channel."),
    ),
    responses(
        (status = 200, description = "The channel (never its token).", body = ChannelView),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such channel of the agent (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path((agent_id, channel_id)): Path<(String, String)>,
) -> Result<Json<ChannelView>, ApiError> {
    principal.require_admin()?;
    let channel = find(&state, &principal, &agent_id, &channel_id).await?;
    Ok(Json(view(&state, channel.row)))
}

#[utoipa::path(
    delete,
    path = "/agents/{agent_id}/channels/{channel_id}",
    operation_id = "delete_channel",
    tag = "channels",
    params(
        ("agent_id" = Uuid, Path, description = "The agent."),
        ("channel_id" = Uuid, Path, description = "The channel."),
    ),
    responses(
        (status = 204, description = "Deleted, with its pending replies; Telegram's webhook \
            is removed (`deleteWebhook`, best effort). Its chats stay the agent's."),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such channel of the agent (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path((agent_id, channel_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let channel = find(&state, &principal, &agent_id, &channel_id).await?;
    let by = principal.actor(address);
    let agent = AgentId(channel.row.agent_id);
    match bounded(
        state
            .store
            .delete_channel(principal.team, agent, channel.row.id, &by),
    )
    .await
    {
        Ok(()) => {}
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("channel")),
        Err(e) => return Err(e.into()),
    }
    // Slack's events are pointed at the channel by the app's settings; a deleted channel's
    // URL answers 404.
    if channel.row.kind != Kind::Telegram.as_str() {
        return Ok(StatusCode::NO_CONTENT);
    }
    let client = client(&state)?;
    if let Err(e) = bot(&state, &client, &channel.row.api_base, &channel.token)
        .delete_webhook()
        .await
    {
        tracing::warn!(class = e.class, channel = %channel.row.id, "channels: deleteWebhook failed");
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/channels/{channel_id}/telegram",
    operation_id = "telegram_update",
    tag = "channels",
    params(("channel_id" = Uuid, Path, description = "The channel.")),
    request_body(content = serde_json::Value, description = "A Telegram `Update`."),
    responses(
        (status = 200, description = "Taken: the turn runs detached, its reply is sent \
            through the Bot API. A redelivered update runs nothing more. A `callback_query` \
            (a press of an approval's button) answers the approval once, for a person the \
            channel allows."),
        (status = 401, description = "The `X-Telegram-Bot-Api-Secret-Token` is missing or \
            wrong (`unauthorized`); nothing runs.", body = ErrorBody),
        (status = 404, description = "No such channel (`not_found`).", body = ErrorBody),
    ),
    security(()),
)]
pub async fn telegram_update(
    State(state): State<AppState>,
    Path(channel_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let id: Uuid = parse_id(&channel_id, "channel")?;
    let channel = platform_channel(&state, id, Kind::Telegram).await?;
    let given = headers
        .get(telegram::SECRET_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !constant_time_eq(given, channel.secret.as_bytes()) {
        return Err(ApiError::Unauthorized);
    }
    if body.len() > MAX_UPDATE {
        return Err(ApiError::PayloadTooLarge(MAX_UPDATE));
    }
    let mut update: telegram::Update = serde_json::from_slice(&body)
        .map_err(|_| ApiError::InvalidRequest("not a Telegram Update".into()))?;
    if let Some(query) = update.callback_query.take() {
        // Delivered again after a failure, the press answers once: the approval's own rule.
        prompts::telegram(&state, &channel, query).await?;
        return Ok(StatusCode::OK);
    }
    match inbound::telegram(&state, &channel, update).await {
        Ok(_) => Ok(StatusCode::OK),
        // Telegram delivers again after a failure; the update id makes that run once.
        Err(InboundError::Store(e)) => Err(e.into()),
        Err(InboundError::Post(e)) => {
            // A refusal of the turn itself (a spent quota, a full queue) is the answer to
            // this update: delivered again, it would be refused again.
            tracing::info!(channel = %id, error = %e, "channels: update started no turn");
            Ok(StatusCode::OK)
        }
    }
}

/// Channel `id` on `kind`, for a call of that platform: `404` for any other.
async fn platform_channel(
    state: &AppState,
    id: Uuid,
    kind: Kind,
) -> Result<OpenedChannel, ApiError> {
    let found = bounded(async {
        state.store.channel(id).await.map_err(|e| match e {
            SecretsError::Store(e) => e,
            _ => StoreError::NotFound,
        })
    })
    .await;
    match found {
        Ok(channel) if channel.row.kind == kind.as_str() => Ok(channel),
        Ok(_) | Err(StoreError::NotFound) => Err(ApiError::NotFound("channel")),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(
    post,
    path = "/channels/{channel_id}/slack",
    operation_id = "slack_event",
    tag = "channels",
    params(("channel_id" = Uuid, Path, description = "The channel.")),
    request_body(content = serde_json::Value, description = "A Slack Events API request \
        (`url_verification` or `event_callback`), signed with the app's signing secret."),
    responses(
        (status = 200, description = "Taken: a `url_verification` is answered \
            `{\"challenge\"}`; a message's turn runs detached, its reply is posted in the \
            thread with `chat.postMessage`. A redelivered event runs nothing more."),
        (status = 401, description = "`X-Slack-Signature` is missing or wrong, or \
            `X-Slack-Request-Timestamp` is missing or more than five minutes from the \
            server's clock (`unauthorized`); nothing runs.", body = ErrorBody),
        (status = 404, description = "No such channel (`not_found`).", body = ErrorBody),
    ),
    security(()),
)]
pub async fn slack_event(
    State(state): State<AppState>,
    Path(channel_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let (id, channel) = signed_by_slack(&state, &channel_id, &headers, &body).await?;
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let envelope: slack::Envelope = serde_json::from_slice(&body)
        .map_err(|_| ApiError::InvalidRequest("not a Slack Events API request".into()))?;
    match envelope.kind.as_str() {
        "url_verification" => {
            let challenge = envelope.challenge.unwrap_or_default();
            return Ok(Json(serde_json::json!({ "challenge": challenge })).into_response());
        }
        "event_callback" => {}
        _ => return Ok(StatusCode::OK.into_response()),
    }
    if let Some(retry) = header(slack::RETRY_HEADER) {
        // Its event id is the message's client id: the retry starts nothing new.
        tracing::debug!(channel = %id, retry, "channels: Slack redelivered an event");
    }
    match inbound::slack(&state, &channel, envelope).await {
        Ok(_) => Ok(StatusCode::OK.into_response()),
        // Slack retries after a failure; the event id makes that run once.
        Err(InboundError::Store(e)) => Err(e.into()),
        Err(InboundError::Post(e)) => {
            tracing::info!(channel = %id, error = %e, "channels: event started no turn");
            Ok(StatusCode::OK.into_response())
        }
    }
}

/// Slack's channel `channel_id` when `body` is signed by its signing secret (v0, within
/// five minutes): nothing of the body is read before.
async fn signed_by_slack(
    state: &AppState,
    channel_id: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Uuid, OpenedChannel), ApiError> {
    let id: Uuid = parse_id(channel_id, "channel")?;
    let channel = platform_channel(state, id, Kind::Slack).await?;
    if body.len() > MAX_UPDATE {
        return Err(ApiError::PayloadTooLarge(MAX_UPDATE));
    }
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let now = chrono::Utc::now().timestamp();
    let timestamp = header(slack::TIMESTAMP_HEADER);
    let signature = header(slack::SIGNATURE_HEADER);
    if let Err(refused) = slack::verify(&channel.secret, timestamp, signature, body, now) {
        tracing::info!(channel = %id, refused = ?refused, "channels: Slack request refused");
        return Err(ApiError::Unauthorized);
    }
    Ok((id, channel))
}

#[utoipa::path(
    post,
    path = "/channels/{channel_id}/slack/interactivity",
    operation_id = "slack_interaction",
    tag = "channels",
    params(("channel_id" = Uuid, Path, description = "The channel.")),
    request_body(content = String, content_type = "application/x-www-form-urlencoded",
        description = "A Slack interactivity request: `payload=` and its JSON (a \
        `block_actions` when an approval's button is pressed), signed with the app's \
        signing secret."),
    responses(
        (status = 200, description = "Taken: a press of an approval's button by a person the \
            channel allows answers the approval once (the buttons' message is rewritten with \
            the outcome, `chat.update`); anyone else is told so alone \
            (`chat.postEphemeral`) and answers nothing."),
        (status = 400, description = "No `payload` of Slack's form (`invalid_request`).",
            body = ErrorBody),
        (status = 401, description = "`X-Slack-Signature` is missing or wrong, or \
            `X-Slack-Request-Timestamp` is missing or more than five minutes from the \
            server's clock (`unauthorized`); nothing runs.", body = ErrorBody),
        (status = 404, description = "No such channel (`not_found`).", body = ErrorBody),
    ),
    security(()),
)]
pub async fn slack_interaction(
    State(state): State<AppState>,
    Path(channel_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (_, channel) = signed_by_slack(&state, &channel_id, &headers, &body).await?;
    let interaction = slack::interaction_payload(&body)
        .ok_or_else(|| ApiError::InvalidRequest("not a Slack interactivity request".into()))?;
    prompts::slack(&state, &channel, interaction).await?;
    Ok(StatusCode::OK)
}
