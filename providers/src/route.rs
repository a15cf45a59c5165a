//! Model routes: `openai/<model>` or `anthropic/<model>`, resolved to an adapter.

use std::sync::Arc;

use super::ModelProvider;

/// A parsed `provider/model` string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelRoute<'a> {
    pub provider: ProviderKind,
    pub model: &'a str,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    OpenAi,
    Anthropic,
}

impl<'a> ModelRoute<'a> {
    /// Parses `openai/<model>` or `anthropic/<model>`; the message says what is wrong.
    pub fn parse(route: &'a str) -> Result<Self, String> {
        let (prefix, model) = route.split_once('/').ok_or_else(|| {
            format!("model `{route}` must look like openai/<model> or anthropic/<model>")
        })?;
        let provider = match prefix {
            "openai" => ProviderKind::OpenAi,
            "anthropic" => ProviderKind::Anthropic,
            _ => {
                return Err(format!(
                    "model provider `{prefix}` is not openai or anthropic"
                ));
            }
        };
        if model.is_empty() || model.len() > 200 || model.chars().any(char::is_whitespace) {
            return Err(format!(
                "model name in `{route}` is empty, too long or has spaces"
            ));
        }
        Ok(Self { provider, model })
    }
}

impl ProviderKind {
    /// The adapter's name, as a route's prefix spells it (a trace attribute).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }
}

/// Both adapters, shared by every turn.
#[derive(Clone)]
pub struct Providers {
    pub openai: Arc<dyn ModelProvider>,
    pub anthropic: Arc<dyn ModelProvider>,
}

impl Providers {
    pub fn get(&self, kind: ProviderKind) -> &Arc<dyn ModelProvider> {
        match kind {
            ProviderKind::OpenAi => &self.openai,
            ProviderKind::Anthropic => &self.anthropic,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_or_explain() {
        let route = ModelRoute::parse("anthropic/claude-sonnet-4-5").unwrap();
        assert_eq!(route.provider, ProviderKind::Anthropic);
        assert_eq!(route.model, "claude-sonnet-4-5");
        assert_eq!(
            ModelRoute::parse("openai/org/model").unwrap().model,
            "org/model"
        );
        assert!(ModelRoute::parse("gpt-4o").is_err());
        assert!(ModelRoute::parse("google/gemini").is_err());
        assert!(ModelRoute::parse("openai/").is_err());
    }
}
