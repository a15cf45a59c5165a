//! The OpenAPI 3.1 contract of the HTTP API, derived from the handlers' own types.
//!
//! Each handler carries its `#[utoipa::path]` (method, path, parameters, body, every answer
//! it can give); `api::routes` registers the route and its operation together. What every
//! authenticated operation shares is added here once, by [`document`]: the bearer
//! requirement and the `401`/`503` answers of the key check. The rendered document is
//! served at `GET /openapi.json` and committed as `docs/openapi.json`;
//! `brain/tests/all/contract.rs` fails when the two differ, and drives schemathesis and the
//! cross-tenant matrix from it.

use std::sync::LazyLock;

use axum::http::header;
use protocol::{ErrorBody, ErrorCode, ErrorDetail, ui};
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::schema::{AnyOfBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

/// The security scheme of a team's API key (`Authorization: Bearer <key>`).
pub const TEAM_KEY: &str = "team_key";
/// The security scheme of the platform operator's token (`BRAIN_OPERATOR_TOKEN`), on the
/// team API only (L1).
pub const OPERATOR_TOKEN: &str = "operator_token";
/// The team API's routes, on the operator's token rather than a team's credentials.
const TEAMS: &str = "/v1/teams";
/// The security scheme of a worker's session or pool token, on the channel upgrade only.
pub const WORKER_TOKEN: &str = "worker_token";
/// The routes a browser reaches without credentials: the OAuth callback and the client
/// metadata document.
pub const OAUTH_PUBLIC: &str = "/v1/oauth/";
/// The AG-UI runs (P3): outside `/v1`, on the same credentials.
const AGUI: &str = "/agui/";
/// The OpenAI-compatible front end (P7): outside `/v1`, on the same credentials, its
/// refusals in OpenAI's error shape.
const OPENAI: &str = "/openai/";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "agent-runtime brain",
        description = "The brain's HTTP API: agents, chats and their turns (the AI SDK UI \
            message stream), artifacts, connectors, probes. Every error is \
            `{\"error\":{\"code\",\"message\",\"turn_id\"?}}` with a stable `code`. \
            `/mcp` is an MCP server (streamable HTTP) whose messages the MCP specification \
            describes: https://modelcontextprotocol.io/specification/2025-11-25 (see \
            docs/design/mcp-server.md). \
            Each agent is also an A2A 1.0 server: its card is `GET \
            /a2a/{agent_id}/.well-known/agent-card.json` (below), its JSON-RPC interface \
            `POST /a2a/{agent_id}` is described by the A2A specification \
            (https://a2a-protocol.org/latest/specification/), not by this document.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(schemas(ErrorBody, ErrorDetail, ErrorCode, ui::UiChunk)),
    modifiers(&Schemes),
)]
struct ApiDoc;

struct Schemes;

impl Modify for Schemes {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        for (name, what) in [
            (
                TEAM_KEY,
                "A team's API key (`POST /v1/teams`, `brain admin create-team`), or a \
                 user's JWT.",
            ),
            (
                OPERATOR_TOKEN,
                "The platform operator's token (`BRAIN_OPERATOR_TOKEN`), for `/v1/teams` only.",
            ),
            (
                WORKER_TOKEN,
                "A worker's session or pool token, minted by the runtime-manager.",
            ),
        ] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(what))
                        .build(),
                ),
            );
        }
    }
}

/// The document's head (info, shared schemas, security schemes) before the routes add
/// their operations.
pub(super) fn base() -> Document {
    ApiDoc::openapi()
}

/// The whole contract: the routes' operations on [`base`], each `/v1`, AG-UI and `/mcp` operation but the
/// worker's (its upgrade, its snapshots and its chat's files, on the session token) and the OAuth callback's (whose `state` is its credential) made to
/// require the team key (the operator's token for the team API) and to answer its failures.
pub fn document() -> Document {
    let mut doc = super::routes().into_openapi();
    for (path, item) in doc.paths.paths.iter_mut() {
        // `/mcp` and AG-UI take the same credentials as `/v1`.
        if !(path.starts_with("/v1/")
            || path.starts_with(AGUI)
            || path.starts_with(OPENAI)
            || path == "/mcp")
            || path == protocol::channel::CONNECT_PATH
            || path.starts_with(protocol::snapshot::SNAPSHOT_PATH)
            || path == protocol::uploads::UPLOAD_PATH
            || path == protocol::skills::SKILL_PATH
            || path.starts_with(OAUTH_PUBLIC)
        {
            continue;
        }
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            let scheme = if path.starts_with(TEAMS) {
                OPERATOR_TOKEN
            } else {
                TEAM_KEY
            };
            // A route that names its own (a signed file URL's, T26) keeps it.
            op.security.get_or_insert_with(|| {
                vec![SecurityRequirement::new::<_, [&str; 0], &str>(scheme, [])]
            });
            let body = if path.starts_with(OPENAI) {
                "OpenAiErrorBody"
            } else {
                "ErrorBody"
            };
            for (status, what) in [
                (
                    "401",
                    "No credentials, an unknown or revoked API key, or a refused token \
                     (`unauthorized`).",
                ),
                (
                    "503",
                    "A store the request needs is unavailable (`store_unavailable`), the \
                     token issuer's keys could not be fetched (`auth_unavailable`, with \
                     `Retry-After`), or this replica is draining (`shutting_down`, with \
                     `Retry-After`).",
                ),
            ] {
                op.responses
                    .responses
                    .entry(status.into())
                    .or_insert_with(|| error_in(body, what).into());
            }
            // Every such route counts against the caller's request rate limit.
            match op.responses.responses.entry("429".into()) {
                std::collections::btree_map::Entry::Vacant(vacant) => {
                    vacant.insert(error_in(body, RATE_LIMITED).into());
                }
                std::collections::btree_map::Entry::Occupied(mut occupied) => {
                    if let RefOr::T(response) = occupied.get_mut() {
                        response.description.push_str(" Or: ");
                        response.description.push_str(RATE_LIMITED);
                    }
                }
            }
        }
    }
    inline_chunk_schema(&mut doc);
    doc
}

/// The request rate limit's refusal, which every authenticated route may answer.
const RATE_LIMITED: &str = "The caller's request rate limit (its key's or user's, or \
     without valid credentials its address's) is reached (`rate_limited`, with `Retry-After` \
     and the `RateLimit` and `RateLimit-Policy` headers).";

/// An error answer: the `{"error":{…}}` body.
pub fn error(description: &str) -> utoipa::openapi::Response {
    error_in("ErrorBody", description)
}

/// An error answer whose body is the schema `body` names.
pub(super) fn error_in(body: &str, description: &str) -> utoipa::openapi::Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(body)))
                .build(),
        )
        .build()
}

/// One event of the UI message stream, as OpenAPI 3.1 describes an event of a
/// `text/event-stream` body: its `data` is a JSON [`ui::UiChunk`] (`contentSchema`), or
/// the closing `[DONE]`.
pub enum UiStreamEvent {}

impl UiStreamEvent {
    fn with_chunk_schema(chunk_schema: serde_json::Value) -> RefOr<Schema> {
        let mut content = Extensions::default();
        content.insert("contentSchema".into(), chunk_schema);
        let chunk = ObjectBuilder::new()
            .schema_type(Type::String)
            .content_media_type("application/json")
            .extensions(Some(content));
        let done = ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some([ui::DONE_SENTINEL]));
        ObjectBuilder::new()
            .property("data", AnyOfBuilder::new().item(chunk).item(done))
            .required("data")
            .property("event", ObjectBuilder::new().schema_type(Type::String))
            .into()
    }
}

impl PartialSchema for UiStreamEvent {
    /// The reference form; [`document`] replaces it with the inlined one.
    fn schema() -> RefOr<Schema> {
        Self::with_chunk_schema(serde_json::json!({ "$ref": "#/components/schemas/UiChunk" }))
    }
}

impl ToSchema for UiStreamEvent {}

/// Validators (schemathesis among them) resolve no `$ref` inside a `contentSchema`, and a
/// schema they cannot resolve goes unchecked; so the stream's event carries the chunk
/// schema inlined, every reference replaced by its component.
fn inline_chunk_schema(doc: &mut Document) {
    let Some(components) = doc.components.as_mut() else {
        return;
    };
    let Ok(schemas) = serde_json::to_value(&components.schemas) else {
        return;
    };
    fn inline(value: &serde_json::Value, schemas: &serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref")
                    && let Some(name) = target.strip_prefix("#/components/schemas/")
                    && let Some(schema) = schemas.get(name)
                {
                    let mut resolved = inline(schema, schemas);
                    // A `$ref`'s siblings (its description) stay with it.
                    if let Value::Object(resolved_map) = &mut resolved {
                        for (key, sibling) in map.iter().filter(|(k, _)| *k != "$ref") {
                            resolved_map.insert(key.clone(), sibling.clone());
                        }
                    }
                    return resolved;
                }
                Value::Object(
                    map.iter()
                        .map(|(k, v)| (k.clone(), inline(v, schemas)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(|v| inline(v, schemas)).collect()),
            other => other.clone(),
        }
    }
    let chunk = inline(
        &serde_json::json!({ "$ref": "#/components/schemas/UiChunk" }),
        &schemas,
    );
    components.schemas.insert(
        UiStreamEvent::name().into_owned(),
        UiStreamEvent::with_chunk_schema(chunk),
    );
}

/// The rendered contract, as `docs/openapi.json` holds it.
pub fn render() -> String {
    // Serializing a document of plain maps and strings cannot fail.
    let mut json = serde_json::to_string_pretty(&document()).unwrap_or_default();
    json.push('\n');
    json
}

static RENDERED: LazyLock<String> = LazyLock::new(render);

/// `GET /openapi.json`: this contract, without authentication.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "meta",
    responses((status = 200, description = "This OpenAPI 3.1 document.", content_type = "application/json", body = Object)),
)]
pub async fn serve() -> ([(header::HeaderName, &'static str); 1], &'static str) {
    (
        [(header::CONTENT_TYPE, "application/json")],
        RENDERED.as_str(),
    )
}
