//! `POST /v1/agents`, `GET /v1/agents/{id}`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::{JsonBody, Team, parse_id};
use crate::AppState;
use crate::error::ApiError;
use crate::provider::ModelRoute;
use crate::store::{AgentRow, NewAgent, StoreError};

const MAX_NAME: usize = 200;
const MAX_PROMPT: usize = 100_000;
const MAX_FALLBACKS: usize = 5;
/// SPEC R: the modes an agent may name.
pub const RUNTIME_PROFILES: [&str; 5] = ["none", "light", "browser", "heavy", "warm"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateAgent {
    name: String,
    system_prompt: String,
    model: String,
    #[serde(default)]
    fallback_models: Vec<String>,
    #[serde(default)]
    runtime_profile: Option<String>,
}

impl CreateAgent {
    fn validate(self) -> Result<NewAgent, ApiError> {
        let invalid = |m: String| Err(ApiError::InvalidRequest(m));
        let name = self.name.trim().to_owned();
        if name.is_empty() || name.chars().count() > MAX_NAME {
            return invalid(format!("name must have 1 to {MAX_NAME} characters"));
        }
        if self.system_prompt.chars().count() > MAX_PROMPT {
            return invalid(format!(
                "system_prompt must have at most {MAX_PROMPT} characters"
            ));
        }
        if self.fallback_models.len() > MAX_FALLBACKS {
            return invalid(format!("at most {MAX_FALLBACKS} fallback_models"));
        }
        for model in std::iter::once(&self.model).chain(&self.fallback_models) {
            ModelRoute::parse(model).map_err(ApiError::InvalidRequest)?;
        }
        let runtime_profile = self.runtime_profile.unwrap_or_else(|| "none".into());
        if !RUNTIME_PROFILES.contains(&runtime_profile.as_str()) {
            return invalid(format!(
                "runtime_profile must be one of {}",
                RUNTIME_PROFILES.join(", ")
            ));
        }
        Ok(NewAgent {
            name,
            system_prompt: self.system_prompt,
            model: self.model,
            fallback_models: self.fallback_models,
            runtime_profile,
        })
    }
}

pub async fn create(
    State(state): State<AppState>,
    Team(team): Team,
    JsonBody(body): JsonBody<CreateAgent>,
) -> Result<(StatusCode, Json<AgentRow>), ApiError> {
    let agent = body.validate()?;
    let row = state.store.create_agent(team, &agent).await?;
    tracing::info!(team = %team, agent = %row.id, "agent created");
    Ok((StatusCode::CREATED, Json(row)))
}

pub async fn get(
    State(state): State<AppState>,
    Team(team): Team,
    Path(agent_id): Path<String>,
) -> Result<Json<AgentRow>, ApiError> {
    let id = parse_id(&agent_id, "agent")?;
    match state.store.agent(team, id).await {
        Ok(row) => Ok(Json(row)),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}
