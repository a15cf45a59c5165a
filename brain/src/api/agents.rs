//! `POST /v1/agents`, `GET /v1/agents/{id}`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::{JsonBody, Team, parse_id};
use crate::AppState;
use crate::error::ApiError;
use crate::provider::ModelRoute;
use crate::store::{AgentRow, NewAgent, SessionRow, StoreError};

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
    /// Offer this agent the agent tools (create, archive, change prompt) for its team.
    #[serde(default)]
    concierge: bool,
}

impl CreateAgent {
    fn validate(self) -> Result<NewAgent, ApiError> {
        validate_new_agent(
            self.name,
            self.system_prompt,
            self.model,
            self.fallback_models,
            self.runtime_profile,
            self.concierge,
        )
        .map_err(ApiError::InvalidRequest)
    }
}

/// Checks a new agent's fields the same way wherever they come from (`POST /v1/agents`,
/// the concierge's `agent_create` tool); the message says what is wrong.
pub(crate) fn validate_new_agent(
    name: String,
    system_prompt: String,
    model: String,
    fallback_models: Vec<String>,
    runtime_profile: Option<String>,
    concierge: bool,
) -> Result<NewAgent, String> {
    let name = name.trim().to_owned();
    if name.is_empty() || name.chars().count() > MAX_NAME {
        return Err(format!("name must have 1 to {MAX_NAME} characters"));
    }
    validate_system_prompt(&system_prompt)?;
    if fallback_models.len() > MAX_FALLBACKS {
        return Err(format!("at most {MAX_FALLBACKS} fallback_models"));
    }
    for model in std::iter::once(&model).chain(&fallback_models) {
        ModelRoute::parse(model)?;
    }
    let runtime_profile = runtime_profile.unwrap_or_else(|| "none".into());
    if !RUNTIME_PROFILES.contains(&runtime_profile.as_str()) {
        return Err(format!(
            "runtime_profile must be one of {}",
            RUNTIME_PROFILES.join(", ")
        ));
    }
    Ok(NewAgent {
        name,
        system_prompt,
        model,
        fallback_models,
        runtime_profile,
        concierge,
    })
}

/// Checks a system prompt, on creation and on change.
pub(crate) fn validate_system_prompt(system_prompt: &str) -> Result<(), String> {
    if system_prompt.chars().count() > MAX_PROMPT {
        return Err(format!(
            "system_prompt must have at most {MAX_PROMPT} characters"
        ));
    }
    Ok(())
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

#[derive(serde::Serialize)]
pub struct Sessions {
    sessions: Vec<SessionRow>,
}

/// `GET /v1/agents/{id}/sessions`: the agent's worker sessions, newest first, with
/// state and failure reason (SPEC W6).
pub async fn sessions(
    State(state): State<AppState>,
    Team(team): Team,
    Path(agent_id): Path<String>,
) -> Result<Json<Sessions>, ApiError> {
    let id = parse_id(&agent_id, "agent")?;
    match state.store.agent_sessions(team, id).await {
        Ok(sessions) => Ok(Json(Sessions { sessions })),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}
