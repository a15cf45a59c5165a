//! The model catalog (T16): what each model can do and what it costs, from the table the
//! project ships, the operator's file, and a team connection's declared models.

use serde::{Deserialize, Serialize};

/// One model's facts. The same shape serves the shipped table, the operator's file
/// (`BRAIN_MODEL_CATALOG_FILE`) and a connection's declared models.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelFacts {
    /// The model's name at the provider (`gpt-4o`, `claude-sonnet-4-5`).
    pub model: String,
    /// Whether it accepts tools (function calling). Most chat models do.
    #[serde(default = "yes")]
    pub tools: bool,
    /// Whether it reads images.
    #[serde(default)]
    pub vision: bool,
    /// Whether it reads documents (PDF) natively.
    #[serde(default)]
    pub documents: bool,
    /// Tokens of input and output together, where known.
    #[serde(default)]
    pub context_window: Option<u32>,
    /// The most tokens one answer may have, where known.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// USD per million input tokens, where known.
    #[serde(default)]
    pub input_price_per_mtok: Option<f64>,
    /// USD per million output tokens, where known.
    #[serde(default)]
    pub output_price_per_mtok: Option<f64>,
}

fn yes() -> bool {
    true
}

impl ModelFacts {
    /// What is wrong with an entry, for the one who wrote it.
    pub fn validate(&self) -> Result<(), String> {
        let model = &self.model;
        if model.is_empty() || model.len() > 200 || model.chars().any(char::is_whitespace) {
            return Err(format!(
                "model name {:?} is empty, too long or has spaces",
                model.chars().take(40).collect::<String>()
            ));
        }
        for (name, limit) in [
            ("context_window", self.context_window),
            ("max_output_tokens", self.max_output_tokens),
        ] {
            if limit == Some(0) {
                return Err(format!("{name} of {model} must be positive"));
            }
        }
        for (name, price) in [
            ("input_price_per_mtok", self.input_price_per_mtok),
            ("output_price_per_mtok", self.output_price_per_mtok),
        ] {
            if price.is_some_and(|price| !price.is_finite() || price < 0.0) {
                return Err(format!("{name} of {model} must be a number of at least 0"));
            }
        }
        Ok(())
    }
}
