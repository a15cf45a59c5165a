//! The model catalog (T16): what each model can do and what it costs, from the table the
//! project ships (`engine/models.json`), the operator's file (`BRAIN_MODEL_CATALOG_FILE`),
//! and a team connection's declared models, each overriding the one before it model by
//! model.
//!
//! A model is found by its exact name, or as a dated snapshot of a listed name
//! (`claude-sonnet-4-5-20250929` is `claude-sonnet-4-5`, `gpt-4o-2024-08-06` is `gpt-4o`),
//! since agents name either.

use std::collections::BTreeMap;
use std::path::Path;

use protocol::TeamId;
use serde::{Deserialize, Serialize};
use store::{MAX_PROVIDER_CONNECTIONS, Store, StoreError};

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

/// Models per connection name, as the shipped table and the operator's file write them:
/// `{"openai": [ModelFacts...], "anthropic": [...]}`.
pub type Table = BTreeMap<String, Vec<ModelFacts>>;

const SHIPPED: &str = include_str!("../../models.json");

/// Why a catalog could not be loaded; a configuration error at start.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CatalogError {
    #[error("cannot read the file: {0}")]
    Read(String),
    #[error("not a catalog (a JSON object of connection name to a list of models): {0}")]
    Parse(String),
    #[error("{0}")]
    Invalid(String),
}

/// The deployment's catalog: the shipped table with the operator's file over it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Catalog {
    connections: Table,
}

impl Catalog {
    /// The table the project ships.
    pub fn shipped() -> Result<Self, CatalogError> {
        let mut catalog = Self::default();
        catalog.merge(parse(SHIPPED)?);
        Ok(catalog)
    }

    /// The shipped table, with the operator's file at `path` adding and overriding.
    pub fn load(path: Option<&Path>) -> Result<Self, CatalogError> {
        let mut catalog = Self::shipped()?;
        if let Some(path) = path {
            let raw = std::fs::read_to_string(path)
                .map_err(|err| CatalogError::Read(err.kind().to_string()))?;
            catalog.merge(parse(&raw)?);
        }
        Ok(catalog)
    }

    /// Adds `table`'s entries; one naming a model already listed under its connection
    /// replaces it.
    pub fn merge(&mut self, table: Table) {
        for (connection, entries) in table {
            let listed = self.connections.entry(connection).or_default();
            for entry in entries {
                match listed.iter_mut().find(|known| known.model == entry.model) {
                    Some(known) => *known = entry,
                    None => listed.push(entry),
                }
            }
        }
    }

    /// The models listed for `connection`, in the order listed.
    pub fn models(&self, connection: &str) -> &[ModelFacts] {
        self.connections.get(connection).map_or(&[], Vec::as_slice)
    }
}

fn parse(raw: &str) -> Result<Table, CatalogError> {
    let table: Table =
        serde_json::from_str(raw).map_err(|err| CatalogError::Parse(err.to_string()))?;
    for (connection, entries) in &table {
        for entry in entries {
            entry
                .validate()
                .map_err(|problem| CatalogError::Invalid(format!("{connection}: {problem}")))?;
        }
    }
    Ok(table)
}

/// The entry for `model` among `entries`: by name, or as a dated snapshot (`-20250929`,
/// `-2024-08-06`) or `-latest` of a listed name, the longest such name winning.
pub fn find<'a>(entries: &'a [ModelFacts], model: &str) -> Option<&'a ModelFacts> {
    if let Some(exact) = entries.iter().find(|entry| entry.model == model) {
        return Some(exact);
    }
    entries
        .iter()
        .filter(|entry| {
            model
                .strip_prefix(entry.model.as_str())
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|suffix| {
                    suffix == "latest"
                        || (!suffix.is_empty()
                            && suffix.bytes().all(|b| b.is_ascii_digit() || b == b'-'))
                })
        })
        .max_by_key(|entry| entry.model.len())
}

/// One route a team can use, with what its model can do.
#[derive(Clone, Debug, PartialEq)]
pub struct TeamRoute {
    pub connection: String,
    pub facts: ModelFacts,
}

/// The catalog as one team sees it: the deployment's connections' entries, and each of
/// the team's connections with its declared models over the operator's entries of its
/// name.
#[derive(Clone, Debug, Default)]
pub struct TeamCatalog {
    connections: Vec<(String, Vec<ModelFacts>)>,
}

impl TeamCatalog {
    /// `builtins` are the deployment's connection names; `declared` the team's
    /// connections with their declared models.
    pub fn new(
        catalog: &Catalog,
        builtins: &[&str],
        declared: impl IntoIterator<Item = (String, Vec<ModelFacts>)>,
    ) -> Self {
        let mut connections: Vec<(String, Vec<ModelFacts>)> = builtins
            .iter()
            .map(|name| ((*name).to_owned(), catalog.models(name).to_vec()))
            .collect();
        for (name, models) in declared {
            let mut own = Catalog::default();
            own.merge(Table::from([(
                name.clone(),
                catalog.models(&name).to_vec(),
            )]));
            own.merge(Table::from([(name.clone(), models)]));
            let models = own.connections.remove(&name).unwrap_or_default();
            connections.push((name, models));
        }
        Self { connections }
    }

    /// Every route, connection by connection.
    pub fn routes(&self) -> impl Iterator<Item = TeamRoute> + '_ {
        self.connections.iter().flat_map(|(connection, models)| {
            models.iter().map(|facts| TeamRoute {
                connection: connection.clone(),
                facts: facts.clone(),
            })
        })
    }

    /// What the model of `route` (`<connection>/<model>`) can do, where known.
    pub fn facts(&self, route: &str) -> Option<&ModelFacts> {
        let (connection, model) = route.split_once('/')?;
        let (_, models) = self
            .connections
            .iter()
            .find(|(name, _)| name == connection)?;
        find(models, model)
    }

    /// USD for `tokens_in` and `tokens_out` of `route`; `None` where its prices are not
    /// both known.
    pub fn cost(&self, route: &str, tokens_in: i64, tokens_out: i64) -> Option<f64> {
        let facts = self.facts(route)?;
        let (input, output) = (facts.input_price_per_mtok?, facts.output_price_per_mtok?);
        // Token counts stay far below 2^53, where f64 is exact.
        #[allow(clippy::cast_precision_loss)]
        let cost = (tokens_in as f64 * input + tokens_out as f64 * output) / 1_000_000.0;
        Some(cost)
    }
}

/// The catalog `team` sees: the deployment's connections, and the team's own (all of
/// them: a team has at most [`MAX_PROVIDER_CONNECTIONS`]).
pub async fn team_catalog(
    store: &Store,
    catalog: &Catalog,
    team: TeamId,
) -> Result<TeamCatalog, StoreError> {
    let rows = store
        .provider_connections(team, None, MAX_PROVIDER_CONNECTIONS)
        .await?;
    let declared = rows.into_iter().map(|row| {
        // Written by the engine from checked entries; a row it cannot read declares none.
        let models = serde_json::from_value(row.models).unwrap_or_default();
        (row.name, models)
    });
    Ok(TeamCatalog::new(
        catalog,
        &providers::Providers::BUILTIN,
        declared,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(model: &str) -> ModelFacts {
        serde_json::from_value(serde_json::json!({ "model": model })).unwrap()
    }

    #[test]
    fn the_shipped_table_loads_and_is_valid() {
        let catalog = Catalog::shipped().unwrap();
        for connection in ["openai", "anthropic"] {
            assert!(catalog.models(connection).len() >= 8, "{connection}");
        }
        let gpt = find(catalog.models("openai"), "gpt-4o").unwrap();
        assert!(gpt.tools && gpt.vision);
        assert_eq!(gpt.context_window, Some(128_000));
        assert_eq!(gpt.input_price_per_mtok, Some(2.5));
    }

    #[test]
    fn dated_snapshots_find_their_model() {
        let catalog = Catalog::shipped().unwrap();
        let anthropic = catalog.models("anthropic");
        let openai = catalog.models("openai");
        for (entries, asked, found) in [
            (anthropic, "claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
            (anthropic, "claude-sonnet-4-20250514", "claude-sonnet-4"),
            (anthropic, "claude-3-5-sonnet-latest", "claude-3-5-sonnet"),
            (openai, "gpt-4o-2024-08-06", "gpt-4o"),
            (openai, "gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
            (openai, "gpt-4.1-mini", "gpt-4.1-mini"),
        ] {
            assert_eq!(find(entries, asked).map(|f| f.model.as_str()), Some(found));
        }
        // Another model that merely starts like a listed one is not that model.
        assert_eq!(find(openai, "gpt-5-codex"), None);
        assert_eq!(find(openai, "gpt-4o-audio-preview"), None);
        assert_eq!(find(openai, "gpt-4"), None);
    }

    #[test]
    fn the_operator_file_adds_and_overrides() {
        let dir = std::env::temp_dir().join(format!("catalog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("models.json");
        std::fs::write(
            &path,
            r#"{"openai": [{"model": "gpt-4o", "input_price_per_mtok": 1.0}],
                "vllm": [{"model": "qwen3-32b", "tools": false, "context_window": 32768}]}"#,
        )
        .unwrap();
        let catalog = Catalog::load(Some(&path)).unwrap();
        let gpt = find(catalog.models("openai"), "gpt-4o").unwrap();
        // The whole entry is replaced: what the file leaves out is unknown.
        assert_eq!(gpt.input_price_per_mtok, Some(1.0));
        assert_eq!(gpt.context_window, None);
        assert!(find(catalog.models("openai"), "gpt-4.1").is_some());
        assert!(!catalog.models("vllm")[0].tools);

        for (bad, expected) in [
            ("[]", "not a catalog"),
            (
                r#"{"openai": [{"model": "x", "colour": "red"}]}"#,
                "not a catalog",
            ),
            (
                r#"{"openai": [{"model": "x", "context_window": 0}]}"#,
                "openai: context_window",
            ),
            (
                r#"{"openai": [{"model": "x", "output_price_per_mtok": -1}]}"#,
                "at least 0",
            ),
            (r#"{"openai": [{"model": "has space"}]}"#, "has spaces"),
        ] {
            std::fs::write(&path, bad).unwrap();
            let err = Catalog::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains(expected), "{bad}: {err}");
        }
        let missing = Catalog::load(Some(&dir.join("absent.json"))).unwrap_err();
        assert_eq!(missing, CatalogError::Read("entity not found".into()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_team_sees_builtins_and_its_declared_models_with_costs() {
        let mut catalog = Catalog::shipped().unwrap();
        catalog.merge(Table::from([(
            "local".to_owned(),
            vec![ModelFacts {
                input_price_per_mtok: Some(9.0),
                ..facts("operator-only")
            }],
        )]));
        let declared = ModelFacts {
            vision: true,
            input_price_per_mtok: Some(0.5),
            output_price_per_mtok: Some(1.5),
            ..facts("qwen3")
        };
        let team = TeamCatalog::new(
            &catalog,
            &["openai", "anthropic"],
            [("local".to_owned(), vec![declared.clone()])],
        );
        let routes: Vec<TeamRoute> = team.routes().collect();
        let locals: Vec<&str> = routes
            .iter()
            .filter(|route| route.connection == "local")
            .map(|route| route.facts.model.as_str())
            .collect();
        assert_eq!(locals, ["operator-only", "qwen3"]);
        assert!(routes.iter().any(|route| route.connection == "anthropic"));
        assert_eq!(team.facts("local/qwen3"), Some(&declared));
        assert_eq!(team.facts("elsewhere/qwen3"), None);
        // 2M input at 0.5 and 1M output at 1.5 per million.
        assert_eq!(team.cost("local/qwen3", 2_000_000, 1_000_000), Some(2.5));
        assert_eq!(
            team.cost("openai/gpt-4o-2024-08-06", 1_000_000, 100_000),
            Some(3.5)
        );
        // A price half known is no price.
        assert_eq!(team.cost("local/operator-only", 1, 1), None);
        assert_eq!(team.cost("openai/unknown", 1, 1), None);
        assert!(facts("x").tools && !facts("x").vision);
    }
}
