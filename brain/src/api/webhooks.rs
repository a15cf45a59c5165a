//! `POST/GET /v1/webhooks`, `DELETE /v1/webhooks/{webhook_id}`,
//! `GET /v1/webhooks/{webhook_id}/deliveries`: the team's signed webhooks (P4), for admins.
//! The signing secret is answered once, at creation; it is stored sealed and never shown
//! again. docs/design/webhooks.md is the design.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use protocol::ErrorBody;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::paging::{self, KeysetKey, PageParams};
use super::{ClientAddr, JsonBody, QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use engine::address;
use engine::auth::Principal;
use engine::webhooks::sign;
use store::webhooks::{DeliveryRow, WebhookEvent, WebhookRow};
use store::{SecretsError, StoreError, bounded};

/// Webhooks per team.
pub const MAX_PER_TEAM: i64 = 20;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"url": "https://hooks.example.com/agents", "events": ["turn.completed", "turn.failed"]}))]
pub struct CreateWebhook {
    /// Where deliveries are POSTed: `http` or `https`, at most 2000 characters, no
    /// credentials, a public address unless the operator allows private networks.
    url: String,
    /// 1 to 6 of `turn.completed`, `turn.failed`, `approval.requested`,
    /// `autostart.failed`, `quota.exhausted`, `a2a.task`.
    events: Vec<String>,
}

/// A webhook as created: with its signing secret, shown this once.
#[derive(Serialize, utoipa::ToSchema)]
pub struct CreatedWebhook {
    #[serde(flatten)]
    webhook: WebhookRow,
    /// `whsec_…`: verify each delivery's `webhook-signature` with it (Standard Webhooks).
    /// Never shown again.
    secret: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct WebhookList {
    webhooks: Vec<WebhookRow>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// A page of a webhook's deliveries. Without `next_cursor` it reaches the first one.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Deliveries {
    /// Newest first, each with its attempts.
    deliveries: Vec<DeliveryRow>,
    /// `cursor` for the page of older deliveries; absent on the oldest page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
    /// When this page was read, to compare with `next_attempt_at`.
    read_at: DateTime<Utc>,
}

const DELIVERIES_CURSOR: &str = "wd1:";
const WEBHOOKS_CURSOR: &str = "wh1:";

fn checked_events(events: &[String]) -> Result<Vec<String>, ApiError> {
    let mut parsed: Vec<WebhookEvent> = Vec::with_capacity(events.len());
    for raw in events {
        let event = WebhookEvent::parse(raw).ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "unknown event {raw:?}; events are {}",
                WebhookEvent::ALL.map(WebhookEvent::as_str).join(", ")
            ))
        })?;
        if !parsed.contains(&event) {
            parsed.push(event);
        }
    }
    if parsed.is_empty() {
        return Err(ApiError::InvalidRequest(
            "events must name at least one event".into(),
        ));
    }
    Ok(parsed.into_iter().map(|e| e.as_str().to_owned()).collect())
}

fn secrets_error(err: SecretsError) -> ApiError {
    match err {
        SecretsError::NotConfigured => ApiError::NotConfigured(
            "webhooks need BRAIN_SECRETS_KEY, which their signing secrets are sealed under; \
             it is unset on this server",
        ),
        SecretsError::TooMany => ApiError::InvalidRequest(format!(
            "a team may have at most {MAX_PER_TEAM} webhooks; delete one first"
        )),
        SecretsError::Crypto => ApiError::Internal("a webhook secret could not be sealed".into()),
        SecretsError::Store(e) => e.into(),
    }
}

#[utoipa::path(
    post,
    path = "/webhooks",
    operation_id = "create_webhook",
    tag = "webhooks",
    request_body = CreateWebhook,
    responses(
        (status = 201, description = "Created; `secret` is shown this once.", body = CreatedWebhook),
        (status = 400, description = "A bad URL (`private_address` and metadata addresses \
            are refused here with a message naming the rule), an unknown event, or the team \
            has too many webhooks (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 501, description = "The server has no `BRAIN_SECRETS_KEY` (`not_configured`).",
            body = ErrorBody),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    JsonBody(body): JsonBody<CreateWebhook>,
) -> Result<(StatusCode, Json<CreatedWebhook>), ApiError> {
    principal.require_admin()?;
    let url = address::valid_url(
        &body.url,
        state.config.webhooks.allow_private_networks,
        "BRAIN_WEBHOOKS_ALLOW_PRIVATE_NETWORKS",
    )
    .map_err(ApiError::InvalidRequest)?;
    if body.events.len() > WebhookEvent::ALL.len() {
        return Err(ApiError::InvalidRequest(format!(
            "events may name at most {} events",
            WebhookEvent::ALL.len()
        )));
    }
    let events = checked_events(&body.events)?;
    let secret = sign::new_secret();
    let by = principal.actor(address);
    let webhook = tokio::time::timeout(
        store::CALL_BOUND,
        state.store.create_webhook(
            principal.team,
            url.as_str(),
            &events,
            &secret,
            MAX_PER_TEAM,
            &by,
        ),
    )
    .await
    .unwrap_or(Err(SecretsError::Store(StoreError::TimedOut)))
    .map_err(secrets_error)?;
    tracing::info!(team = %principal.team, webhook = %webhook.id, "webhook created");
    Ok((
        StatusCode::CREATED,
        Json(CreatedWebhook { webhook, secret }),
    ))
}

#[utoipa::path(
    get,
    path = "/webhooks",
    operation_id = "list_webhooks",
    tag = "webhooks",
    params(PageParams),
    responses(
        (status = 200, description = "A page of the team's webhooks, oldest first, without \
            secrets.", body = WebhookList),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<WebhookList>, ApiError> {
    principal.require_admin()?;
    let limit = params.limit()?;
    let after = params.after::<KeysetKey>(WEBHOOKS_CURSOR)?.map(|k| k.0);
    let rows = bounded(state.store.list_webhooks(principal.team, after, limit + 1)).await?;
    let (webhooks, next_cursor) = paging::page(rows, limit, WEBHOOKS_CURSOR, |w| {
        KeysetKey::of(w.created_at, w.id)
    });
    Ok(Json(WebhookList {
        webhooks,
        next_cursor,
    }))
}

#[utoipa::path(
    delete,
    path = "/webhooks/{webhook_id}",
    operation_id = "delete_webhook",
    tag = "webhooks",
    params(("webhook_id" = Uuid, Path, description = "The webhook.")),
    responses(
        (status = 204, description = "Deleted, with its deliveries: pending ones are not sent."),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such webhook in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(webhook_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let id: Uuid = parse_id(&webhook_id, "webhook")?;
    let by = principal.actor(address);
    match bounded(state.store.delete_webhook(principal.team, id, &by)).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("webhook")),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(
    get,
    path = "/webhooks/{webhook_id}/deliveries",
    operation_id = "list_webhook_deliveries",
    tag = "webhooks",
    params(("webhook_id" = Uuid, Path, description = "The webhook."), PageParams),
    responses(
        (status = 200, description = "The webhook's deliveries, newest first, with every \
            recorded attempt (status, error class, duration; never the response body).",
            body = Deliveries),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor \
            of this listing (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such webhook in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn deliveries(
    State(state): State<AppState>,
    principal: Principal,
    Path(webhook_id): Path<String>,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<Deliveries>, ApiError> {
    principal.require_admin()?;
    let id: Uuid = parse_id(&webhook_id, "webhook")?;
    let limit = params.limit()?;
    let before: Option<i64> = params.after(DELIVERIES_CURSOR)?;
    let mut deliveries = match bounded(state.store.webhook_deliveries(
        principal.team,
        id,
        before,
        limit + 1,
    ))
    .await
    {
        Ok(rows) => rows,
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("webhook")),
        Err(e) => return Err(e.into()),
    };
    let more = deliveries.len() as i64 > limit;
    deliveries.truncate(limit as usize);
    let next_cursor = more
        .then(|| {
            deliveries
                .last()
                .map(|d| paging::cursor_of(DELIVERIES_CURSOR, d.seq))
        })
        .flatten();
    Ok(Json(Deliveries {
        deliveries,
        next_cursor,
        read_at: Utc::now(),
    }))
}
