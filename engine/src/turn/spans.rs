//! The turn's spans under the OpenTelemetry GenAI semantic conventions (P6), so
//! Langfuse, Phoenix or Grafana read a turn as an agent invocation with its model calls
//! and tool executions: `invoke_agent {agent}`, `chat {model}`, `execute_tool {tool}`
//! (the exported span name comes from `otel.name`; the tracing name, which logs show,
//! stays `turn`, `model_call`, `tool_call`).
//!
//! X4: ids, names, counts and outcomes only. None of the conventions' opt-in content
//! attributes (`gen_ai.input.messages`, `gen_ai.output.messages`,
//! `gen_ai.system_instructions`, `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`)
//! is ever recorded.

use protocol::{AgentId, ChatId, TeamId, TurnId};
use tracing::field::Empty;

use crate::models::connections::Resolved;

/// Who a `turn` span is about.
pub(super) struct TurnSpan {
    pub turn: TurnId,
    pub chat: ChatId,
    pub agent: AgentId,
    pub team: TeamId,
    pub detached: bool,
    /// Continued by this replica after another one died or drained (D3, D4).
    pub resumed: bool,
}

impl TurnSpan {
    /// A turn this replica starts now.
    pub(super) fn new(turn: TurnId, launch: &super::Launch, basis: &store::TurnBasis) -> Self {
        Self {
            turn,
            chat: launch.chat,
            agent: basis.agent.id,
            team: launch.team,
            detached: launch.detached,
            resumed: false,
        }
    }
}

/// The `turn` span (`invoke_agent`): named after the agent when its name is known. Its
/// usage is recorded at wrap-up, summed over the turn's model calls.
pub(super) fn turn_span(of: TurnSpan, agent_name: Option<&str>) -> tracing::Span {
    let name = match agent_name {
        Some(agent) => format!("invoke_agent {agent}"),
        None => "invoke_agent".to_owned(),
    };
    tracing::info_span!(
        "turn",
        otel.name = %name,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.id = %of.agent,
        gen_ai.agent.name = agent_name,
        gen_ai.conversation.id = %of.chat,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        turn.id = %of.turn,
        chat.id = %of.chat,
        agent.id = %of.agent,
        team.id = %of.team,
        detached = of.detached,
        resumed = of.resumed,
        outcome = Empty,
        model_calls = Empty,
        tool_calls = Empty,
    )
}

/// A `model_call` span (`chat`, a client call to the provider): `route` is the agent's
/// `connection/model` as written, `resolved` what it called.
pub(super) fn model_call_span(
    route: &str,
    resolved: &Resolved,
    chat: ChatId,
    call_index: u32,
) -> tracing::Span {
    tracing::info_span!(
        "model_call",
        otel.name = %format!("chat {}", resolved.model),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = resolved.kind.as_str(),
        gen_ai.request.model = resolved.model.as_str(),
        gen_ai.conversation.id = %chat,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        route = %route,
        adapter = resolved.kind.as_str(),
        call_index,
        input_tokens = Empty,
        output_tokens = Empty,
        ttft_ms = Empty,
        outcome = Empty,
    )
}

/// A model call's tokens, when the provider reported them, under both names.
pub(super) fn record_model_usage(
    span: &tracing::Span,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
) {
    if let Some(tokens) = input_tokens {
        span.record("input_tokens", tokens);
        span.record("gen_ai.usage.input_tokens", tokens);
    }
    if let Some(tokens) = output_tokens {
        span.record("output_tokens", tokens);
        span.record("gen_ai.usage.output_tokens", tokens);
    }
}

/// A `tool_call` span (`execute_tool`): the tool's name and the model's call id, never
/// its arguments or its output (X4).
pub(super) fn tool_span(name: &str, call_id: &str) -> tracing::Span {
    tracing::info_span!(
        "tool_call",
        otel.name = %format!("execute_tool {name}"),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %name,
        gen_ai.tool.call.id = %call_id,
        gen_ai.tool.type = "function",
        tool = %name,
        outcome = Empty,
    )
}
