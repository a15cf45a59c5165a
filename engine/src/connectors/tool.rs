//! One MCP tool of a connector, as a [`Tool`] of the turn's toolset.

use std::sync::Arc;
use std::time::Duration;

use channel::mask::Masks;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use rmcp::ServiceError;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, ResourceContents};
use serde_json::Value;

use super::session::{ConnectError, Session, auth_challenge};
use crate::tools::{Tool, ToolCtx, ToolOutput};
use domain::approvals::RiskClass;
use providers::ToolSpec;

/// The longest description offered to the model.
const MAX_DESCRIPTION: usize = 4096;
/// The longest output handed to the model; the rest is cut with a note.
const MAX_OUTPUT: usize = 100_000;

pub(super) struct ConnectorTool {
    /// Kept alive by every tool of the connector; the last one dropped closes it.
    session: Arc<Session>,
    spec: ToolSpec,
    /// The tool's name on the MCP server.
    remote_name: String,
    writes: bool,
    risk: RiskClass,
    call_timeout: Duration,
}

/// What the connector's admin said of its tools' risk: whether the server's hints may
/// lower it, and the classes set outright (by the tool's name on the server).
#[derive(Clone, Copy)]
pub(super) struct RiskRules<'a> {
    pub trust_hints: bool,
    pub set: &'a std::collections::BTreeMap<String, RiskClass>,
}

impl RiskRules<'_> {
    /// A1: the class an admin set, else the annotations' ([`risk_of`]), raised to `write`
    /// unless the admin trusts this server's hints: an annotation is the server's claim,
    /// and `read` spares a call the approval its policy asks for writes.
    fn risk(&self, remote: &rmcp::model::Tool) -> RiskClass {
        if let Some(set) = self.set.get(remote.name.as_ref()) {
            return *set;
        }
        match risk_of(remote.annotations.as_ref()) {
            RiskClass::Read if !self.trust_hints => RiskClass::Write,
            claimed => claimed,
        }
    }
}

impl ConnectorTool {
    pub fn new(
        session: Arc<Session>,
        name: String,
        remote: rmcp::model::Tool,
        call_timeout: Duration,
        rules: RiskRules<'_>,
    ) -> Self {
        let risk = rules.risk(&remote);
        // The write budget follows the same rule: an untrusted read-only claim is a write.
        let writes = risk != RiskClass::Read;
        let description = remote
            .description
            .as_deref()
            .map(str::to_owned)
            .or_else(|| remote.title.clone())
            .filter(|d| !d.trim().is_empty())
            .unwrap_or_else(|| format!("Tool `{}` of connector `{}`.", remote.name, session.name));
        let mut input_schema = (*remote.input_schema).clone();
        // Providers need the object schema only.
        input_schema.remove("$schema");
        input_schema
            .entry("type")
            .or_insert_with(|| Value::String("object".into()));
        // What the server lists reaches the model too.
        let mut input_schema = Value::Object(input_schema);
        session.masks.mask_json(&mut input_schema);
        Self {
            spec: ToolSpec {
                name,
                description: truncate(session.masks.mask(&description), MAX_DESCRIPTION),
                input_schema,
            },
            remote_name: remote.name.into_owned(),
            writes,
            risk,
            call_timeout,
            session,
        }
    }
}

/// A1: a connector tool's class from its MCP annotations, the strongest claim first; a
/// server that says nothing is taken to act outside (the hints are only hints, and an
/// unannotated tool is the one a policy most needs to catch).
fn risk_of(annotations: Option<&rmcp::model::ToolAnnotations>) -> RiskClass {
    let Some(a) = annotations else {
        return RiskClass::External;
    };
    if a.read_only_hint == Some(true) {
        RiskClass::Read
    } else if a.destructive_hint == Some(true) {
        RiskClass::Irreversible
    } else if a.open_world_hint == Some(true)
        || (a.read_only_hint.is_none()
            && a.destructive_hint.is_none()
            && a.open_world_hint.is_none())
    {
        RiskClass::External
    } else {
        RiskClass::Write
    }
}

impl Tool for ConnectorTool {
    fn metric_label(&self) -> &'static str {
        "connector"
    }

    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn writes(&self) -> bool {
        self.writes
    }

    fn risk(&self) -> RiskClass {
        self.risk
    }

    fn call<'a>(&'a self, ctx: &'a ToolCtx, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            let arguments = match arguments {
                Value::Object(map) => map,
                Value::Null => serde_json::Map::new(),
                _ => return ToolOutput::error("arguments must be a JSON object"),
            };
            let connector = &self.session.name;
            // The server's questions during this call are asked through it (P5).
            let _entered = self
                .session
                .asking
                .enter(ctx, &self.spec.name, &Value::Object(arguments.clone()));
            let params =
                CallToolRequestParams::new(self.remote_name.clone()).with_arguments(arguments);
            // Whichever arm loses is dropped; dropping the request sends
            // `notifications/cancelled` to the server.
            let request = self.session.peer().call_tool(params);
            tokio::pin!(request);
            let asking = &self.session.asking;
            let (started, waited_before) = (tokio::time::Instant::now(), asking.waited());
            let mut deadline = started + self.call_timeout;
            loop {
                tokio::select! {
                    biased;
                    () = ctx.cancel.cancelled() => {
                        return ToolOutput::error("cancelled: the turn was stopped before this tool call finished");
                    }
                    () = tokio::time::sleep_until(deadline) => {
                        // Time a person spent on the server's questions does not count: the
                        // timeout is the server's, and a question keeps it waiting.
                        let due = started
                            + self.call_timeout
                            + asking.waited().saturating_sub(waited_before);
                        if asking.is_waiting() || due > tokio::time::Instant::now() {
                            deadline = due.max(tokio::time::Instant::now() + Duration::from_millis(200));
                            continue;
                        }
                        tracing::warn!(turn = %ctx.turn, connector = %connector, tool = %self.spec.name, class = "timeout", "connector tool call failed");
                        return ToolOutput::error(format!(
                            "the connector `{connector}` did not answer within {} ms; the call was cancelled",
                            self.call_timeout.as_millis()
                        ));
                    }
                    answered = &mut request => return match answered {
                        Ok(result) => render(result, &self.session.masks),
                        Err(err) => {
                            tracing::warn!(turn = %ctx.turn, connector = %connector, tool = %self.spec.name, class = error_class(&err), "connector tool call failed");
                            // A server's error message may quote the request.
                            ToolOutput::error(self.session.masks.mask(&error_text(connector, &err)))
                        }
                    },
                }
            }
        }
        .boxed()
    }
}

fn error_class(err: &ServiceError) -> &'static str {
    match auth_challenge(err) {
        Some(ConnectError::NeedsAuthorization { .. }) => return "needs_authorization",
        Some(ConnectError::InsufficientScope { .. }) => return "insufficient_scope",
        _ => {}
    }
    match err {
        ServiceError::McpError(_) => "mcp_error",
        ServiceError::TransportSend(_) | ServiceError::TransportClosed => "unreachable",
        ServiceError::Timeout { .. } => "timeout",
        ServiceError::Cancelled { .. } => "cancelled",
        _ => "protocol",
    }
}

/// What the model reads when the call itself failed.
fn error_text(connector: &str, err: &ServiceError) -> String {
    // A token refused in the middle of a turn (revoked, expired early, or short of a scope
    // this tool needs): the model can tell the person what to do; the next turn asks for
    // authorization again where the server refuses the grant outright.
    match auth_challenge(err) {
        Some(ConnectError::NeedsAuthorization { .. }) => {
            return format!(
                "the connector `{connector}` refused the call: its authorization is no longer \
                 accepted; the connector must be authorized again"
            );
        }
        Some(ConnectError::InsufficientScope { .. }) => {
            return format!(
                "the connector `{connector}` refused the call: the authorization lacks a scope \
                 this tool needs; authorize the connector again to grant it"
            );
        }
        _ => {}
    }
    match err {
        ServiceError::McpError(e) => {
            format!(
                "the connector `{connector}` refused the call: {}",
                e.message
            )
        }
        ServiceError::TransportSend(_) | ServiceError::TransportClosed => {
            format!("the connector `{connector}` is unreachable (the connection was lost)")
        }
        ServiceError::Timeout { .. } => {
            format!("the connector `{connector}` did not answer in time")
        }
        ServiceError::Cancelled { .. } => {
            format!("the connector `{connector}` cancelled the call")
        }
        _ => format!("the connector `{connector}` gave an answer that is not a tool result"),
    }
}

/// The tool result as text: text content as is, other content summarized by type, the
/// session's credentials masked (before the cut, which could leave half a value).
fn render(result: CallToolResult, masks: &Masks) -> ToolOutput {
    let mut parts: Vec<String> = result.content.iter().map(describe).collect();
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        parts.push(structured.to_string());
    }
    let text = truncate(masks.mask(&parts.join("\n")), MAX_OUTPUT);
    if result.is_error == Some(true) {
        if text.is_empty() {
            return ToolOutput::error("the tool reported an error without details");
        }
        return ToolOutput::error(text);
    }
    ToolOutput::ok(text)
}

fn describe(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(t) => t.text.clone(),
        ContentBlock::Image(i) => format!("[image content ({}) not shown]", i.mime_type),
        ContentBlock::Audio(a) => format!("[audio content ({}) not shown]", a.mime_type),
        ContentBlock::Resource(r) => match &r.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => {
                format!("[resource {uri}]\n{text}")
            }
            ResourceContents::BlobResourceContents { uri, mime_type, .. } => format!(
                "[binary resource {uri} ({}) not shown]",
                mime_type.as_deref().unwrap_or("unknown type")
            ),
            _ => "[resource of an unknown kind not shown]".to_owned(),
        },
        ContentBlock::ResourceLink(r) => format!("[resource link: {} ({})]", r.name, r.uri),
        _ => "[content of an unknown kind not shown]".to_owned(),
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary, saying so.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str("\n[… cut]");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_give_the_risk_class() {
        use rmcp::model::ToolAnnotations;
        let hints = |read, destructive, open| {
            ToolAnnotations::from_raw(None, read, destructive, None, open)
        };
        let cases = [
            (None, RiskClass::External),
            (Some(hints(None, None, None)), RiskClass::External),
            (Some(hints(Some(true), None, Some(true))), RiskClass::Read),
            (
                Some(hints(Some(false), Some(true), Some(true))),
                RiskClass::Irreversible,
            ),
            (
                Some(hints(Some(false), Some(false), Some(true))),
                RiskClass::External,
            ),
            (
                Some(hints(Some(false), Some(false), Some(false))),
                RiskClass::Write,
            ),
            (Some(hints(None, Some(false), None)), RiskClass::Write),
        ];
        for (annotations, class) in cases {
            assert_eq!(risk_of(annotations.as_ref()), class, "{annotations:?}");
        }
    }

    #[test]
    fn truncates_on_char_boundaries() {
        assert_eq!(truncate("abc".into(), 10), "abc");
        assert_eq!(truncate("ééé".into(), 3), "é\n[… cut]");
    }

    #[test]
    fn renders_text_and_summarizes_the_rest() {
        let result: CallToolResult = serde_json::from_value(serde_json::json!({
            "content": [
                {"type": "text", "text": "hello"},
                {"type": "image", "data": "AAAA", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "inside"}}
            ]
        }))
        .unwrap();
        let out = render(result, &Masks::default());
        assert!(!out.is_error);
        assert_eq!(
            out.content,
            "hello\n[image content (image/png) not shown]\n[resource file:///a.txt]\ninside"
        );
        let failed: CallToolResult = serde_json::from_value(
            serde_json::json!({"content": [{"type": "text", "text": "bad zone"}], "isError": true}),
        )
        .unwrap();
        assert_eq!(
            render(failed, &Masks::of([("ZONE", "zone")])),
            ToolOutput::error("bad [secret:ZONE]")
        );
        let structured: CallToolResult = serde_json::from_value(
            serde_json::json!({"content": [], "structuredContent": {"a": 1}}),
        )
        .unwrap();
        assert_eq!(
            render(structured, &Masks::default()),
            ToolOutput::ok(r#"{"a":1}"#)
        );
    }
}
