//! `POST /v1/connectors`, `GET /v1/connectors`, `PATCH /v1/connectors/{id}` (its tools'
//! risk rules), `DELETE /v1/connectors/{id}` (SPEC B2).
//!
//! A connector names an MCP server whose tools join the toolset of the team's turns: every
//! agent's (no `agent_id`) or one agent's. Exactly one transport: `url` (streamable HTTP,
//! `http` or `https`) or `command` (stdio: a program and its arguments, run by the brain;
//! refused unless the operator set `BRAIN_CONNECTORS_ALLOW_STDIO=true`). A URL may not
//! point at a link-local or cloud metadata address, nor, unless the operator set
//! `BRAIN_CONNECTORS_ALLOW_PRIVATE_NETWORKS=true`, at loopback or a private range.
//! Credentials go in `headers` (HTTP) or `env` (stdio) as `{{secret:NAME}}` templates
//! (`connectors::credentials`); the API echoes the templates, never a secret's value.
//! The server's tool annotations lower no risk class below `write` unless the admin sets
//! `trust_hints`; `tool_risks` sets classes outright (`approvals::RiskClass`).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use protocol::{AgentId, ErrorBody};
use serde::{Deserialize, Serialize};

use super::paging::{self, KeysetKey, PageParams};
use super::{ClientAddr, JsonBody, QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use domain::approvals::{self, RiskClass};
use engine::address;
use engine::auth::Principal;
use engine::connectors::{ConnectorConfig, authorization, credentials};
use store::{
    AuthorizationCounts, ConnectorRow, ConnectorTarget, NewConnector, StoreError, bounded,
};

pub const MAX_CONNECTORS_PER_TEAM: i64 = 50;
const MAX_NAME: usize = 32;
const MAX_ARGS: usize = 64;
const MAX_ARG_BYTES: usize = 4096;
const MIN_CALL_TIMEOUT_MS: u32 = 100;
const MAX_CALL_TIMEOUT_MS: u32 = 3_600_000;
/// The most tools `tool_risks` may name (a connector lends at most 128).
const MAX_TOOL_RISKS: usize = 128;

/// Exactly one of `url` and `command`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "name": "linear",
    "url": "https://mcp.linear.app/mcp",
    "headers": {"Authorization": "Bearer {{secret:LINEAR_TOKEN}}"}
}))]
pub struct CreateConnector {
    /// Prefixes the connector's tool names.
    #[schema(pattern = "^[a-z0-9_]{1,32}$")]
    name: String,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    command: Option<Vec<String>>,
    /// With `url`: request headers, each value a template whose `{{secret:NAME}}`
    /// references name a secret of the agent or the team, resolved only when the brain
    /// connects. Credential-bearing headers (`Authorization`, anything naming a token or
    /// key) must take their value from a secret.
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    /// With `command`: environment variables of the child, values templated like `headers`.
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    /// The bound on one of its tool calls, 100 to 3,600,000 ms; absent: the server's
    /// `BRAIN_CONNECTOR_CALL_TIMEOUT_MS`.
    #[serde(default)]
    #[schema(minimum = 100, maximum = 3_600_000)]
    call_timeout_ms: Option<u32>,
    /// Only this agent's turns get the tools; absent for every agent of the team.
    #[serde(default)]
    #[schema(value_type = Option<Uuid>)]
    agent_id: Option<String>,
    /// Whether the server's tool annotations (`readOnlyHint`, `destructiveHint`,
    /// `openWorldHint`) may lower a tool's risk class below `write`. Off (the default),
    /// they can only raise it: a tool the server calls read-only is `write` all the same.
    #[serde(default)]
    trust_hints: bool,
    /// Risk classes (`read`, `write`, `external`, `irreversible`) by the tool's name on
    /// the server; they win over the annotations, trusted or not. At most 128.
    #[serde(default)]
    #[schema(value_type = BTreeMap<String, String>)]
    tool_risks: BTreeMap<String, String>,
}

/// `^[a-z0-9_]{1,32}$`: the name prefixes the connector's tool names.
pub fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl CreateConnector {
    fn validate(self, config: &ConnectorConfig) -> Result<NewConnector, ApiError> {
        let invalid = |m: &str| Err(ApiError::InvalidRequest(m.to_owned()));
        if !valid_name(&self.name) {
            return invalid("name must match ^[a-z0-9_]{1,32}$");
        }
        let agent = match self.agent_id {
            // An id that does not parse is as unknown as another team's (404).
            Some(raw) => Some(parse_id::<AgentId>(&raw, "agent")?),
            None => None,
        };
        let target = match (self.url, self.command) {
            (Some(url), None) => {
                if self.env.is_some() {
                    return invalid("env applies to a command; give headers with a url");
                }
                let headers = self.headers.unwrap_or_default();
                credentials::check_headers(&headers).map_err(ApiError::InvalidRequest)?;
                ConnectorTarget::Http {
                    url: validate_url(&url, config.allow_private_networks)?,
                    headers,
                }
            }
            (None, Some(command)) => {
                if !config.allow_stdio {
                    return invalid(
                        "stdio connectors (command) are disabled on this server; use a url",
                    );
                }
                if command.is_empty() || command.len() > MAX_ARGS {
                    return invalid("command must have 1 to 64 entries (program, then arguments)");
                }
                if command[0].trim().is_empty() {
                    return invalid("command must start with a program");
                }
                if command
                    .iter()
                    .any(|a| a.len() > MAX_ARG_BYTES || a.contains('\0'))
                {
                    return invalid("each command entry must have at most 4096 bytes and no NUL");
                }
                if self.headers.is_some() {
                    return invalid("headers apply to a url; give env with a command");
                }
                let env = self.env.unwrap_or_default();
                credentials::check_env(&env).map_err(ApiError::InvalidRequest)?;
                ConnectorTarget::Stdio { command, env }
            }
            _ => return invalid("give exactly one of url or command"),
        };
        if self
            .call_timeout_ms
            .is_some_and(|ms| !(MIN_CALL_TIMEOUT_MS..=MAX_CALL_TIMEOUT_MS).contains(&ms))
        {
            return invalid("call_timeout_ms must be 100 to 3600000");
        }
        Ok(NewConnector {
            agent,
            name: self.name,
            target,
            call_timeout_ms: self.call_timeout_ms,
            trust_hints: self.trust_hints,
            tool_risks: tool_risks(self.tool_risks)?,
        })
    }
}

/// `tool_risks` as classes: bounded names, each class one of the approval policy's.
fn tool_risks(raw: BTreeMap<String, String>) -> Result<BTreeMap<String, RiskClass>, ApiError> {
    if raw.len() > MAX_TOOL_RISKS {
        return Err(ApiError::InvalidRequest(format!(
            "tool_risks may name at most {MAX_TOOL_RISKS} tools"
        )));
    }
    raw.into_iter()
        .map(|(tool, class)| {
            if tool.is_empty() || tool.len() > approvals::MAX_TOOL_NAME {
                return Err(ApiError::InvalidRequest(format!(
                    "tool_risks names a tool of 1 to {} bytes",
                    approvals::MAX_TOOL_NAME
                )));
            }
            let Some(risk) = RiskClass::parse(&class) else {
                let classes: Vec<&str> = RiskClass::ALL.iter().map(|c| c.as_str()).collect();
                return Err(ApiError::InvalidRequest(format!(
                    "tool_risks[{tool:?}] must be one of {}",
                    classes.join(", ")
                )));
            };
            Ok((tool, risk))
        })
        .collect()
}

/// A URL the address rule allows (`address::valid_url`; checked again after
/// DNS at every connect).
fn validate_url(raw: &str, allow_private: bool) -> Result<String, ApiError> {
    address::valid_url(
        raw,
        allow_private,
        "BRAIN_CONNECTORS_ALLOW_PRIVATE_NETWORKS",
    )
    .map(|url| url.to_string())
    .map_err(ApiError::InvalidRequest)
}

#[utoipa::path(
    post,
    path = "/connectors",
    operation_id = "create_connector",
    tag = "connectors",
    request_body = CreateConnector,
    responses(
        (status = 201, description = "The connector.", body = ConnectorRow),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 400, description = "A field is missing, unknown or invalid, the transport is \
            refused, or the team has too many connectors (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "`agent_id` names no agent of the team (`not_found`).",
            body = ErrorBody),
        (status = 409, description = "The name is taken for this agent or team (`conflict`).",
            body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).", body = ErrorBody),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    JsonBody(body): JsonBody<CreateConnector>,
) -> Result<(StatusCode, Json<ConnectorRow>), ApiError> {
    principal.require_admin()?;
    let team = principal.team;
    let connector = body.validate(&state.config.connectors)?;
    if let Some(agent) = connector.agent {
        match state.store.agent(team, agent).await {
            Ok(_) => {}
            Err(StoreError::NotFound) => return Err(ApiError::NotFound("agent")),
            Err(e) => return Err(e.into()),
        }
    }
    let by = principal.actor(address);
    match bounded(
        state
            .store
            .create_connector(team, &connector, MAX_CONNECTORS_PER_TEAM, &by),
    )
    .await
    {
        Ok(row) => {
            tracing::info!(team = %team, connector = %row.id, "connector created");
            Ok((StatusCode::CREATED, Json(row)))
        }
        Err(StoreError::Conflict("connector_name")) => Err(ApiError::Conflict(format!(
            "a connector named `{}` already exists for this {}",
            connector.name,
            if connector.agent.is_some() {
                "agent"
            } else {
                "team"
            }
        ))),
        Err(StoreError::Conflict("connector_limit")) => Err(ApiError::InvalidRequest(format!(
            "a team may have at most {MAX_CONNECTORS_PER_TEAM} connectors"
        ))),
        // The agent was deleted between the check and the insert.
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ConnectorList {
    connectors: Vec<ConnectorView>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

const CONNECTORS_CURSOR: &str = "cn1:";

/// A connector as listed: its row and where its OAuth stands (never a token).
#[derive(Serialize, utoipa::ToSchema)]
pub struct ConnectorView {
    #[serde(flatten)]
    row: ConnectorRow,
    authorization: Authorization,
}

/// Where a connector's OAuth stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Authorization {
    /// No grant and no flow: the server never asked, or nobody began one yet.
    None,
    /// The connector holds its own grant (every chat without a user's grant uses it).
    Authorized,
    /// Only users' grants, or flows begun and not finished: chats without a user's grant
    /// connect without a token.
    Needed,
}

impl Authorization {
    fn of(counts: Option<&AuthorizationCounts>) -> Self {
        match counts {
            Some(c) if c.connector_grant => Self::Authorized,
            Some(c) if c.user_grants > 0 || c.pending_flows > 0 => Self::Needed,
            _ => Self::None,
        }
    }
}

#[utoipa::path(
    get,
    path = "/connectors",
    operation_id = "list_connectors",
    tag = "connectors",
    params(PageParams),
    responses(
        (status = 200, description = "A page of the team's connectors, oldest first.",
            body = ConnectorList),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<ConnectorList>, ApiError> {
    principal.require_admin()?;
    let team = principal.team;
    let limit = params.limit()?;
    let after = params.after::<KeysetKey>(CONNECTORS_CURSOR)?.map(|k| k.0);
    let rows = store::bounded(state.store.connectors(team, after, limit + 1)).await?;
    let (connectors, next_cursor) = paging::page(rows, limit, CONNECTORS_CURSOR, |c| {
        KeysetKey::of(c.created_at, c.id)
    });
    let authorizations = store::bounded(state.store.connector_authorizations(team)).await?;
    let connectors = connectors
        .into_iter()
        .map(|row| ConnectorView {
            authorization: Authorization::of(authorizations.get(&row.id)),
            row,
        })
        .collect();
    Ok(Json(ConnectorList {
        connectors,
        next_cursor,
    }))
}

/// What an admin may change of a connector it keeps: how its tools' risk is judged.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"trust_hints": false, "tool_risks": {"search": "read"}}))]
pub struct UpdateConnector {
    /// As `POST /v1/connectors`' `trust_hints`.
    #[serde(default)]
    trust_hints: Option<bool>,
    /// As `POST /v1/connectors`' `tool_risks`; replaces the whole map.
    #[serde(default)]
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    tool_risks: Option<BTreeMap<String, String>>,
}

#[utoipa::path(
    patch,
    path = "/connectors/{connector_id}",
    operation_id = "update_connector",
    tag = "connectors",
    params(("connector_id" = Uuid, Path, description = "The connector.")),
    request_body = UpdateConnector,
    responses(
        (status = 200, description = "The connector; later turns judge its tools' risk by \
            the new rules. Its grants stay.", body = ConnectorRow),
        (status = 400, description = "Neither field, or an invalid class (`invalid_request`).",
            body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such connector in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn update(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(connector_id): Path<String>,
    JsonBody(body): JsonBody<UpdateConnector>,
) -> Result<Json<ConnectorRow>, ApiError> {
    principal.require_admin()?;
    let id = parse_id(&connector_id, "connector")?;
    if body.trust_hints.is_none() && body.tool_risks.is_none() {
        return Err(ApiError::InvalidRequest(
            "give trust_hints, tool_risks or both".into(),
        ));
    }
    let risks = body.tool_risks.map(tool_risks).transpose()?;
    let by = principal.actor(address);
    let update = state.store.update_connector_risks(
        principal.team,
        id,
        body.trust_hints,
        risks.as_ref(),
        &by,
    );
    match bounded(update).await {
        Ok(row) => Ok(Json(row)),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("connector")),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(
    delete,
    path = "/connectors/{connector_id}",
    operation_id = "delete_connector",
    tag = "connectors",
    params(("connector_id" = Uuid, Path, description = "The connector.")),
    responses(
        (status = 204, description = "Deleted; later turns no longer get its tools. Its OAuth \
            grants are revoked at their authorization servers (best effort, within 5 s) and \
            deleted."),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such connector in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(connector_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require_admin()?;
    let team = principal.team;
    let id = parse_id(&connector_id, "connector")?;
    // Read before the delete, which takes them with the connector; revoked after it, so a
    // slow authorization server never keeps a connector alive.
    let grants = authorization::grants_to_revoke(&state.store, team, id).await;
    let by = principal.actor(address);
    match bounded(state.store.delete_connector(team, id, &by)).await {
        Ok(()) => {
            tracing::info!(team = %team, connector = %id, grants = grants.len(), "connector deleted");
            authorization::revoke_all(&state.oauth, id, grants).await;
            Ok(StatusCode::NO_CONTENT)
        }
        Err(StoreError::NotFound) => Err(ApiError::NotFound("connector")),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "github", "my_tools_2", &"x".repeat(32)] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "GitHub", "my-tools", "a b", "é", &"x".repeat(33)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn urls() {
        assert_eq!(
            validate_url(" http://127.0.0.1:3001/mcp ", true).unwrap(),
            "http://127.0.0.1:3001/mcp"
        );
        assert!(validate_url("http://127.0.0.1:3001/mcp", false).is_err());
        assert!(validate_url("http://169.254.169.254/", true).is_err());
        assert!(validate_url("https://mcp.example.com", false).is_ok());
        for bad in [
            "ftp://x/",
            "file:///etc/passwd",
            "mcp.example.com",
            "http://user:pw@x/",
            "http://x/a b",
        ] {
            assert!(validate_url(bad, true).is_err(), "{bad}");
        }
    }
}
