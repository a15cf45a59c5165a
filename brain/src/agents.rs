//! What makes an agent valid, whoever writes it: `POST /v1/agents` and the concierge's
//! agent tools check fields with the same code, so a tool cannot create an agent the API
//! would refuse (SPEC B1). The messages say what is wrong and are shown to the API client
//! or to the model.

use crate::approvals::ApprovalPolicy;
use crate::provider::ModelRoute;
use crate::store::NewAgent;

const MAX_NAME: usize = 200;
const MAX_PROMPT: usize = 100_000;
const MAX_FALLBACKS: usize = 5;
/// SPEC R: the modes an agent may name.
pub const RUNTIME_PROFILES: [&str; 5] = ["none", "light", "browser", "heavy", "warm"];

/// Checks a new agent's fields; the message says what is wrong.
pub fn validate_new_agent(
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
    // Postgres text cannot hold NUL: refused here rather than failing the write.
    if std::iter::once(&name)
        .chain([&model])
        .chain(&fallback_models)
        .any(|field| field.contains('\0'))
    {
        return Err("name and models must not contain NUL characters".into());
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
        approval_policy: ApprovalPolicy::default(),
    })
}

/// Checks a system prompt, on creation and on change.
pub fn validate_system_prompt(system_prompt: &str) -> Result<(), String> {
    if system_prompt.chars().count() > MAX_PROMPT {
        return Err(format!(
            "system_prompt must have at most {MAX_PROMPT} characters"
        ));
    }
    if system_prompt.contains('\0') {
        return Err("system_prompt must not contain NUL characters".into());
    }
    Ok(())
}
