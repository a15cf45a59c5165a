//! The team's agents as an MCP server (P2): what `api/mcp.rs` needs besides HTTP.
//!
//! - `rpc.rs`: JSON-RPC messages as MCP's streamable HTTP carries them.
//! - here: the sessions (`Mcp-Session-Id`) this replica holds, with their caps, and the
//!   tool name each agent gets.
//!
//! A protocol is a front end, never a second engine: a `tools/call` is a
//! `POST /v1/chats/{id}/messages` (`api/chats.rs`'s `launch`), under the same principal,
//! quotas, busy policy and approvals. What is held here is only what the wire needs: who
//! opened a session, which protocol version it speaks, and the calls it has in flight
//! (so `notifications/cancelled` can stop one). Design: docs/design/mcp-server.md.
//!
//! Sessions live in this replica's memory. A session id another replica never issued is
//! answered `404`, which MCP clients take as "initialize again" (the spec's rule); a
//! deployment with several replicas routes a session to one replica (affinity on the
//! `Mcp-Session-Id` header) or lets clients re-initialize.

pub mod rpc;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use protocol::AgentId;
use tokio_util::sync::CancellationToken;

use engine::config::McpSessionLimits;
use rpc::RequestId;
use store::AgentRow;

/// The protocol versions this server speaks, newest first; an `initialize` asking for
/// another is answered with the newest (MCP's negotiation).
pub const PROTOCOL_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

/// MCP's rule for a tool name (2025-11-25): 1 to 128 of `[A-Za-z0-9_.-]`.
const MAX_TOOL_NAME: usize = 128;
const TOOL_PREFIX: &str = "ask_";

/// Why no session was opened.
#[derive(Debug, thiserror::Error)]
pub enum SessionsFull {
    #[error("this principal has as many MCP sessions open as allowed; end one (DELETE /mcp)")]
    Principal,
    #[error("this server has as many MCP sessions open as it holds; retry later")]
    Replica,
}

struct Session {
    /// `Principal::identity()` of who opened it: only the same principal may use it.
    owner: String,
    last_seen: Instant,
    in_flight: HashMap<RequestId, CancellationToken>,
}

/// The MCP sessions this replica holds.
#[derive(Clone)]
pub struct McpSessions {
    sessions: Arc<Mutex<HashMap<String, Session>>>,
    limits: McpSessionLimits,
}

/// A call in flight: its token is cancelled by `notifications/cancelled` or the session's
/// end; dropping it forgets the call.
pub struct InFlight {
    sessions: McpSessions,
    session: String,
    request: RequestId,
    pub cancel: CancellationToken,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(session) = self.sessions.lock().get_mut(&self.session) {
            session.in_flight.remove(&self.request);
            session.last_seen = Instant::now();
        }
    }
}

impl McpSessions {
    pub fn new(limits: McpSessionLimits) -> Self {
        Self {
            sessions: Arc::default(),
            limits,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Session>> {
        // Each change is a single insert, remove or field write: consistent after a panic.
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a session for `owner`; idle sessions are dropped first.
    pub fn open(&self, owner: &str) -> Result<String, SessionsFull> {
        let mut sessions = self.lock();
        let idle = self.limits.idle;
        sessions.retain(|_, s| !s.in_flight.is_empty() || s.last_seen.elapsed() < idle);
        if sessions.values().filter(|s| s.owner == owner).count() >= self.limits.max_per_principal {
            return Err(SessionsFull::Principal);
        }
        if sessions.len() >= self.limits.max {
            return Err(SessionsFull::Replica);
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        sessions.insert(
            id.clone(),
            Session {
                owner: owner.to_owned(),
                last_seen: Instant::now(),
                in_flight: HashMap::new(),
            },
        );
        Ok(id)
    }

    /// Whether `owner` has a live session `id`, marking it used; `false` for an unknown,
    /// expired or another principal's session.
    pub fn touch(&self, id: &str, owner: &str) -> bool {
        let mut sessions = self.lock();
        let Some(session) = sessions.get_mut(id).filter(|s| s.owner == owner) else {
            return false;
        };
        if session.in_flight.is_empty() && session.last_seen.elapsed() >= self.limits.idle {
            sessions.remove(id);
            return false;
        }
        session.last_seen = Instant::now();
        true
    }

    /// Ends `owner`'s session `id`, cancelling its calls; whether there was one.
    pub fn close(&self, id: &str, owner: &str) -> bool {
        let mut sessions = self.lock();
        if sessions.get(id).is_none_or(|s| s.owner != owner) {
            return false;
        }
        if let Some(session) = sessions.remove(id) {
            session
                .in_flight
                .values()
                .for_each(CancellationToken::cancel);
        }
        true
    }

    /// Records a call of session `id`; `None` when the session is gone or already has a
    /// call under this request id.
    pub fn begin(&self, id: &str, request: RequestId) -> Option<InFlight> {
        let mut sessions = self.lock();
        let session = sessions.get_mut(id)?;
        if session.in_flight.contains_key(&request) {
            return None;
        }
        let cancel = CancellationToken::new();
        session.in_flight.insert(request.clone(), cancel.clone());
        Some(InFlight {
            sessions: self.clone(),
            session: id.to_owned(),
            request,
            cancel,
        })
    }

    /// `notifications/cancelled`: cancels the call, if it is still in flight.
    pub fn cancel(&self, id: &str, request: &RequestId) {
        if let Some(token) = self.lock().get(id).and_then(|s| s.in_flight.get(request)) {
            token.cancel();
        }
    }
}

/// An agent as a tool.
pub struct Tool {
    pub name: String,
    pub agent: AgentId,
    pub agent_name: String,
}

/// Each agent's tool name, `ask_<name>` within MCP's rules: other characters become `_`,
/// long names are cut. The oldest agent keeps a name that two would share; the others
/// get their id's first eight hex digits appended, so a name never moves between agents
/// as agents are added.
pub fn tool_names(agents: &[AgentRow]) -> Vec<Tool> {
    let mut ordered: Vec<&AgentRow> = agents.iter().collect();
    ordered.sort_by_key(|a| (a.created_at, a.id.0));
    let mut taken = std::collections::HashSet::new();
    let mut named = Vec::with_capacity(ordered.len());
    for agent in ordered {
        let base = sanitize(&agent.name);
        let name = if taken.contains(&base) {
            let suffix = format!("_{}", &agent.id.0.simple().to_string()[..8]);
            let keep = MAX_TOOL_NAME - suffix.len();
            format!("{}{suffix}", &base[..base.len().min(keep)])
        } else {
            base
        };
        taken.insert(name.clone());
        named.push(Tool {
            name,
            agent: agent.id,
            agent_name: agent.name.clone(),
        });
    }
    named
}

fn sanitize(agent_name: &str) -> String {
    let mut name = String::from(TOOL_PREFIX);
    for c in agent_name.chars() {
        if name.len() >= MAX_TOOL_NAME {
            break;
        }
        name.push(
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            },
        );
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_follow_the_rules_and_stay_put() {
        assert_eq!(sanitize("Release notes (v2)"), "ask_Release_notes__v2_");
        assert_eq!(sanitize("é.x-y"), "ask__.x-y");
        assert_eq!(sanitize(&"a".repeat(300)).len(), MAX_TOOL_NAME);
    }

    #[test]
    fn sessions_are_capped_per_principal_and_replica_and_owned() {
        let sessions = McpSessions::new(McpSessionLimits {
            max: 3,
            max_per_principal: 2,
            idle: std::time::Duration::from_secs(60),
        });
        let a1 = sessions.open("a").unwrap();
        sessions.open("a").unwrap();
        assert!(matches!(sessions.open("a"), Err(SessionsFull::Principal)));
        sessions.open("b").unwrap();
        assert!(matches!(sessions.open("c"), Err(SessionsFull::Replica)));
        assert!(!sessions.touch(&a1, "b"), "another principal's");
        assert!(sessions.touch(&a1, "a"));
        let call = sessions
            .begin(&a1, RequestId::of(&serde_json::json!(1)).unwrap())
            .unwrap();
        assert!(!sessions.close(&a1, "b"));
        assert!(sessions.close(&a1, "a"));
        assert!(
            call.cancel.is_cancelled(),
            "ending a session cancels its calls"
        );
        sessions.open("c").unwrap();
    }
}
