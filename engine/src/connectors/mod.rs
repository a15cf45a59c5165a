//! Connector tools: the tools of the MCP servers a team configured (SPEC B2), joined to a
//! turn's toolset (SPEC T4).
//!
//! [`connector_tools`] runs once per turn. It loads the connectors that apply to the agent
//! (its own, then the team-wide ones; an agent's connector shadows a team-wide one of the
//! same name), connects to all of them concurrently as an MCP client (streamable HTTP, or
//! a child process on stdio), and runs `initialize` and `tools/list`, all within
//! `BRAIN_CONNECTOR_STARTUP_TIMEOUT_MS` and the turn's cancellation. A connector that fails,
//! times out or is not allowed (stdio while `BRAIN_CONNECTORS_ALLOW_STDIO` is off; a URL
//! whose host is or resolves to an address [`crate::address`] refuses) adds no tool and is
//! reported `down` with an error class; the turn goes on without it.
//!
//! A server that demands OAuth is connected with a stored grant (the chat creator's, else
//! the connector's), refreshed first when it expires soon; one that answers `401` without
//! a usable grant is reported `needs_authorization` with the flow's link, which the
//! turn's principal `POST`s from its browser for the authorization URL ([`authorization`]),
//! and the turn goes on without it too.
//!
//! # Tool names
//!
//! A connector tool is named `{connector}_{tool}`, where `connector` is the connector's
//! name (`^[a-z0-9_]{1,32}$`) and `tool` the MCP tool's name, then sanitized to what every
//! provider accepts, `^[a-zA-Z0-9_-]{1,64}$`:
//!
//! - every character outside `[a-zA-Z0-9_-]` becomes `_` (`files.read` → `fs_files_read`);
//! - a name longer than 64 characters keeps its first 55 and ends with `_` and 8 hex digits
//!   of the SHA-256 of the MCP tool name, so long names that share a prefix stay distinct.
//!
//! Two tools that end up with one name: the first wins (connectors in the order above, tools
//! in the server's order) and the later one is left out with a log line. Brain tools win
//! over every connector tool because the turn adds them to the [`Toolset`] first.
//!
//! # Calls
//!
//! A call is `tools/call`, raced against `BRAIN_CONNECTOR_CALL_TIMEOUT_MS` and the turn's
//! cancellation. The loser is dropped, and rmcp then sends `notifications/cancelled` for the
//! request, so the server can stop working on it. The text content of the result becomes
//! the tool output; other content is summarized by type; `isError` makes an error output.
//! Everything the server answers is masked with the credentials its session sent
//! (`[secret:NAME]`, `[secret:oauth_token]`, SPEC W12), as a worker's output is.
//! A tool writes (SPEC T6) unless its annotations say `readOnlyHint: true`.
//!
//! # Questions (P5)
//!
//! A server may ask the person a question during a call (`elicitation/create`): an
//! interactive turn's session asks it in the chat and the call waits (`elicitation.rs`); a
//! background or autostart turn's session declines at once ([`session::Answerer`]).
//!
//! # Lifetime
//!
//! One MCP session per connector and turn, shared by that connector's tools. It closes when
//! the last of its tools is dropped (at the end of the turn): a stdio child then gets its
//! stdin closed, then SIGTERM, then SIGKILL, to its whole process group; it is also spawned
//! with kill-on-drop so it never outlives the brain's runtime.
//!
//! # What a connector is not given
//!
//! A stdio child starts with an empty environment except `PATH`, `HOME`, `LANG`, `LC_ALL`,
//! `TZ`, `TMPDIR` and the connector's own `env`: the brain's own variables (database URL,
//! provider keys) never reach it. Its stderr is discarded. Logs name the connector and an
//! error class only (SPEC X4). Credentials ([`credentials`]) are resolved from secrets at
//! connect time and go into the connection only.
//!
//! [`Toolset`]: crate::tools::Toolset

pub mod authorization;
pub mod credentials;
mod elicitation;
pub mod oauth;
pub mod session;
mod tool;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use protocol::{AgentId, TeamId};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

pub use crate::config::ConnectorConfig;
use crate::tools::Tool;
pub use authorization::Requester;
use authorization::Started;
pub use protocol::ui::{ConnectorState, ConnectorStatus};
pub use session::Answerer;
use store::{ConnectorRow, Store};
use tool::{ConnectorTool, RiskRules};

/// The longest tool name every provider accepts.
pub const MAX_TOOL_NAME: usize = 64;
/// Tools taken from one connector; a server listing more is cut (with a log line).
pub const MAX_TOOLS_PER_CONNECTOR: usize = 128;

/// The tools of every connector that applies to `agent`, and what became of each
/// connector. Never fails: a store failure yields no connectors (and a log line).
/// `requester` names the chat's creator, whose own OAuth grants come first, and whether
/// the turn may begin a flow for the whole connector.
pub async fn connector_tools(
    store: &Store,
    config: &ConnectorConfig,
    oauth: &authorization::OAuth,
    team: TeamId,
    agent: AgentId,
    requester: Requester<'_>,
    cancel: &CancellationToken,
) -> (Vec<Arc<dyn Tool>>, Vec<ConnectorStatus>) {
    let rows = match store.connectors_for_agent(team, agent).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(team = %team, agent = %agent, class = e.metric_label(), "could not load connectors; the turn goes on without them");
            return (Vec::new(), Vec::new());
        }
    };
    let rows = applicable(rows);
    if rows.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let turn = authorization::Turn {
        oauth,
        store,
        team,
        agent,
        requester,
        config,
        cancel,
    };
    let started = join_all(rows.iter().map(|row| authorization::start(&turn, row))).await;

    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let mut statuses = Vec::with_capacity(rows.len());
    let mut taken = HashSet::new();
    for (row, result) in rows.iter().zip(started) {
        match result {
            Started::Ready(session, listed) => {
                let session = Arc::new(session);
                let mut added = 0;
                if listed.len() > MAX_TOOLS_PER_CONNECTOR {
                    tracing::warn!(connector = %row.name, listed = listed.len(), "connector lists too many tools; the rest are left out");
                }
                for remote in listed.into_iter().take(MAX_TOOLS_PER_CONNECTOR) {
                    let Some(name) = tool_name(&row.name, &remote.name) else {
                        continue;
                    };
                    if !taken.insert(name.clone()) {
                        tracing::warn!(connector = %row.name, tool = %name, "tool name already taken by another connector tool; left out");
                        continue;
                    }
                    let rules = RiskRules {
                        trust_hints: row.trust_hints,
                        set: &row.tool_risks,
                    };
                    tools.push(Arc::new(ConnectorTool::new(
                        session.clone(),
                        name,
                        remote,
                        row.call_timeout_ms
                            .map_or(config.call_timeout, |ms| Duration::from_millis(ms.into())),
                        rules,
                    )));
                    added += 1;
                }
                statuses.push(ConnectorStatus {
                    name: row.name.clone(),
                    state: ConnectorState::Ready,
                    tools: added,
                    error: None,
                    authorize: None,
                });
            }
            Started::NeedsAuthorization(link) => {
                tracing::info!(team = %team, agent = %agent, connector = %row.name, "connector needs authorization; its tools are left out of this turn");
                statuses.push(ConnectorStatus {
                    name: row.name.clone(),
                    state: ConnectorState::NeedsAuthorization,
                    tools: 0,
                    error: None,
                    authorize: link,
                });
            }
            Started::Down(class) => {
                tracing::warn!(team = %team, agent = %agent, connector = %row.name, class, "connector is down; its tools are left out of this turn");
                statuses.push(ConnectorStatus {
                    name: row.name.clone(),
                    state: ConnectorState::Down,
                    tools: 0,
                    error: Some(class.to_owned()),
                    authorize: None,
                });
            }
        }
    }
    (tools, statuses)
}

/// Drops a team-wide connector that the agent's own connector of the same name shadows.
/// `rows` come with the agent's own first.
fn applicable(rows: Vec<ConnectorRow>) -> Vec<ConnectorRow> {
    let mut names = HashSet::new();
    rows.into_iter()
        .filter(|row| names.insert(row.name.clone()))
        .collect()
}

/// The toolset name of MCP tool `tool` of connector `connector` (see the module docs), or
/// `None` for a tool without a name.
pub fn tool_name(connector: &str, tool: &str) -> Option<String> {
    if tool.is_empty() {
        return None;
    }
    let sanitized: String = format!("{connector}_{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if sanitized.len() <= MAX_TOOL_NAME {
        return Some(sanitized);
    }
    let digest = Sha256::digest(tool.as_bytes());
    let suffix: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    // Only ASCII is left, so byte slicing is on character boundaries.
    Some(format!("{}_{suffix}", &sanitized[..MAX_TOOL_NAME - 9]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(name: &str) -> bool {
        (1..=MAX_TOOL_NAME).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn tool_names_are_prefixed_and_sanitized() {
        assert_eq!(tool_name("everything", "echo").unwrap(), "everything_echo");
        assert_eq!(
            tool_name("everything", "get-sum").unwrap(),
            "everything_get-sum"
        );
        assert_eq!(tool_name("fs", "files.read").unwrap(), "fs_files_read");
        assert_eq!(tool_name("x", "héllo wörld/∑").unwrap(), "x_h_llo_w_rld__");
        assert_eq!(tool_name("x", ""), None);
    }

    #[test]
    fn long_names_keep_a_prefix_and_stay_distinct() {
        let connector = "c".repeat(32);
        let a = tool_name(&connector, &format!("{}_a", "t".repeat(60))).unwrap();
        let b = tool_name(&connector, &format!("{}_b", "t".repeat(60))).unwrap();
        assert_eq!(a.len(), MAX_TOOL_NAME);
        assert!(valid(&a) && valid(&b));
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("{connector}_ttt")));
        // Deterministic: the same tool gets the same name in every turn.
        assert_eq!(
            a,
            tool_name(&connector, &format!("{}_a", "t".repeat(60))).unwrap()
        );
        let exactly = format!("{}_{}", "c".repeat(31), "t".repeat(32));
        assert_eq!(
            tool_name(&"c".repeat(31), &"t".repeat(32)).unwrap(),
            exactly
        );
    }

    #[test]
    fn status_wire_form() {
        let status = ConnectorStatus {
            name: "time".into(),
            state: ConnectorState::Down,
            tools: 0,
            error: Some("timeout".into()),
            authorize: None,
        };
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            serde_json::json!({"name": "time", "state": "down", "tools": 0, "error": "timeout"})
        );
    }
}
