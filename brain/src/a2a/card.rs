//! An agent's A2A agent card: who it is, where its JSON-RPC interface is, what it can do
//! and how to authenticate (a bearer: the team's API keys and user tokens).

use serde_json::{Value, json};

use store::AgentRow;

/// The protocol version every interface of the card speaks.
pub const PROTOCOL_VERSION: &str = "1.0";

/// The longest description the card carries.
const MAX_DESCRIPTION: usize = 280;

/// The agent's description: the first paragraph of its system prompt, cut at
/// [`MAX_DESCRIPTION`] characters (an agent has no field of its own for it).
pub fn description(agent: &AgentRow) -> String {
    let first = agent
        .system_prompt
        .split("\n\n")
        .map(str::trim)
        .find(|p| !p.is_empty())
        .unwrap_or("");
    if first.is_empty() {
        return format!("The agent {}.", agent.name);
    }
    let mut cut: String = first.chars().take(MAX_DESCRIPTION).collect();
    if first.chars().count() > MAX_DESCRIPTION {
        cut.push('…');
    }
    cut
}

/// The card of `agent`, whose JSON-RPC interface is at `url`. `push`: whether push
/// notifications can be kept (their credentials are sealed under `BRAIN_SECRETS_KEY`).
pub fn card(agent: &AgentRow, url: &str, provider_url: &str, push: bool) -> Value {
    let description = description(agent);
    json!({
        "name": agent.name,
        "description": description,
        "supportedInterfaces": [{
            "url": url,
            "protocolBinding": "JSONRPC",
            "protocolVersion": PROTOCOL_VERSION,
        }],
        "provider": {"organization": "agent-runtime", "url": provider_url},
        "version": agent.created_at.format("%Y%m%d%H%M%S").to_string(),
        "capabilities": {
            "streaming": true,
            "pushNotifications": push,
            "extendedAgentCard": false,
        },
        "securitySchemes": {
            "bearer": {"httpAuthSecurityScheme": {
                "scheme": "Bearer",
                "description": "An API key of the agent's team (`ar_…`) or a user token \
                    (JWT) of its issuer, as for the HTTP API.",
            }},
        },
        "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [{
            "id": "chat",
            "name": agent.name,
            "description": description,
            "tags": ["chat"],
            "inputModes": ["text/plain"],
            "outputModes": ["text/plain"],
        }],
    })
}
