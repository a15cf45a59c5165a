//! `GET /v1/models`: the routes a team can use and what each model can do (T16).

use axum::Json;
use axum::extract::State;
use serde::Serialize;

use crate::AppState;
use crate::error::ApiError;
use engine::auth::Principal;
use engine::models::catalog::{TeamRoute, team_catalog};
use store::bounded;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ModelList {
    /// The deployment's connections' models first, then the team's connections' in the
    /// order they were created; the catalog's order within each.
    data: Vec<ModelEntry>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ModelEntry {
    /// The route an agent names: `<connection>/<model>`.
    id: String,
    connection: String,
    /// The model's name at the provider.
    model: String,
    tools: bool,
    vision: bool,
    documents: bool,
    /// Tokens of input and output together; `null` where unknown.
    context_window: Option<u32>,
    /// The most tokens one answer may have; `null` where unknown.
    max_output_tokens: Option<u32>,
    /// `null` unless both prices are known.
    pricing: Option<Pricing>,
}

/// USD per million tokens.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Pricing {
    input_per_mtok: f64,
    output_per_mtok: f64,
}

impl From<TeamRoute> for ModelEntry {
    fn from(route: TeamRoute) -> Self {
        let facts = route.facts;
        let pricing = facts
            .input_price_per_mtok
            .zip(facts.output_price_per_mtok)
            .map(|(input_per_mtok, output_per_mtok)| Pricing {
                input_per_mtok,
                output_per_mtok,
            });
        Self {
            id: format!("{}/{}", route.connection, facts.model),
            connection: route.connection,
            model: facts.model,
            tools: facts.tools,
            vision: facts.vision,
            documents: facts.documents,
            context_window: facts.context_window,
            max_output_tokens: facts.max_output_tokens,
            pricing,
        }
    }
}

#[utoipa::path(
    get,
    path = "/models",
    operation_id = "list_models",
    tag = "models",
    responses((status = 200, description = "The routes the team can use: the catalog's \
        models of the deployment's connections (`openai`, `anthropic`), and each of the \
        team's connections' declared models, with what each can do and its price where \
        known. A route not listed may still work: the list is what is known about.",
        body = ModelList)),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
) -> Result<Json<ModelList>, ApiError> {
    // Any key of the team: choosing a model is what every agent author does.
    let catalog = bounded(team_catalog(
        &state.store,
        &state.config.model_catalog,
        principal.team,
    ))
    .await?;
    Ok(Json(ModelList {
        data: catalog.routes().map(ModelEntry::from).collect(),
    }))
}
