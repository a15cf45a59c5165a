//! Model routes: `<connection>/<model>`, and the adapter of each wire kind. A route names a
//! connection (the deployment's `openai` and `anthropic`, or one of a team's own, T14); what
//! a connection is, and which kind of wire it speaks, the engine resolves.

use std::sync::Arc;

use super::anthropic::AnthropicProvider;
use super::openai::OpenAiProvider;
use super::responses::ResponsesProvider;
use super::{Endpoint, ModelProvider};

/// A parsed `connection/model` string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelRoute<'a> {
    pub connection: &'a str,
    pub model: &'a str,
}

/// The longest connection name: `[a-z0-9][a-z0-9_-]{0,62}`.
pub const MAX_CONNECTION_NAME: usize = 63;

/// Whether `name` may name a connection: `[a-z0-9][a-z0-9_-]{0,62}`.
pub fn is_connection_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_CONNECTION_NAME
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// The wire a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// OpenAI-compatible Chat Completions.
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// The OpenAI Responses API (T15).
    OpenAiResponses,
}

impl<'a> ModelRoute<'a> {
    /// Parses `<connection>/<model>`; the message says what is wrong.
    pub fn parse(route: &'a str) -> Result<Self, String> {
        let (connection, model) = route.split_once('/').ok_or_else(|| {
            format!(
                "model `{route}` must look like <connection>/<model>: openai/<model>, \
                     anthropic/<model> or a team connection's name"
            )
        })?;
        if !is_connection_name(connection) {
            return Err(format!(
                "connection `{connection}` in model `{route}` must match [a-z0-9][a-z0-9_-]{{0,62}}"
            ));
        }
        if model.is_empty() || model.len() > 200 || model.chars().any(char::is_whitespace) {
            return Err(format!(
                "model name in `{route}` is empty, too long or has spaces"
            ));
        }
        Ok(Self { connection, model })
    }
}

impl ProviderKind {
    /// Every kind, as the API names them.
    pub const ALL: [Self; 3] = [Self::OpenAi, Self::Anthropic, Self::OpenAiResponses];

    /// The API's name of the kind (a trace attribute, a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
            Self::OpenAiResponses => "openai-responses",
        }
    }

    /// The kind the API's `kind` string names.
    pub fn parse_kind(kind: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == kind)
    }
}

/// The adapter of `kind` over `client`, calling `endpoint`.
pub fn adapter(
    kind: ProviderKind,
    client: reqwest::Client,
    endpoint: Endpoint,
) -> Arc<dyn ModelProvider> {
    match kind {
        ProviderKind::OpenAi => Arc::new(OpenAiProvider::new(client, endpoint)),
        ProviderKind::Anthropic => Arc::new(AnthropicProvider::new(client, endpoint)),
        ProviderKind::OpenAiResponses => Arc::new(ResponsesProvider::new(client, endpoint)),
    }
}

/// The deployment's two connections from the environment, shared by every team and every
/// turn: `openai` speaks Chat Completions, `anthropic` Messages.
#[derive(Clone)]
pub struct Providers {
    pub openai: Arc<dyn ModelProvider>,
    pub anthropic: Arc<dyn ModelProvider>,
}

impl Providers {
    /// The names of the deployment's connections, which no team connection may take.
    pub const BUILTIN: [&'static str; 2] = ["openai", "anthropic"];

    /// The built-in connection `name`, with its kind; `None` for any other name.
    pub fn builtin(&self, name: &str) -> Option<(ProviderKind, &Arc<dyn ModelProvider>)> {
        match name {
            "openai" => Some((ProviderKind::OpenAi, &self.openai)),
            "anthropic" => Some((ProviderKind::Anthropic, &self.anthropic)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_or_explain() {
        let route = ModelRoute::parse("anthropic/claude-sonnet-4-5").unwrap();
        assert_eq!(route.connection, "anthropic");
        assert_eq!(route.model, "claude-sonnet-4-5");
        assert_eq!(
            ModelRoute::parse("openai/org/model").unwrap().model,
            "org/model"
        );
        let team = ModelRoute::parse("my-vllm_2/qwen3").unwrap();
        assert_eq!((team.connection, team.model), ("my-vllm_2", "qwen3"));
        assert!(ModelRoute::parse("gpt-4o").is_err());
        assert!(ModelRoute::parse("Google/gemini").is_err());
        assert!(ModelRoute::parse("-x/gemini").is_err());
        assert!(ModelRoute::parse(&format!("{}/m", "a".repeat(64))).is_err());
        assert!(ModelRoute::parse(&format!("{}/m", "a".repeat(63))).is_ok());
        assert!(ModelRoute::parse("openai/").is_err());
        assert!(ModelRoute::parse("/gpt").is_err());
    }

    #[test]
    fn kinds_round_trip_their_api_names() {
        for kind in ProviderKind::ALL {
            assert_eq!(ProviderKind::parse_kind(kind.as_str()), Some(kind));
        }
        assert_eq!(ProviderKind::parse_kind("gemini"), None);
    }
}
