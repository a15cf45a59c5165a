//! The offline demo model (SPEC O4): with no provider key configured, the brain starts the
//! scripted provider on loopback and points both adapters at it, so `make dev` answers
//! without network access. Any provider key turns it off.

use scripted_provider::ScriptedProvider;

use engine::config::Config;

/// Starts the demo model and rewrites `config` to use it.
pub async fn start(config: &mut Config) -> std::io::Result<ScriptedProvider> {
    let provider = ScriptedProvider::start().await?;
    config.openai.base_url = provider.openai_base_url();
    config.anthropic.base_url = provider.anthropic_base_url();
    tracing::info!(addr = %provider.addr(), "offline demo model serving; set OPENAI_API_KEY or ANTHROPIC_API_KEY for a real model");
    Ok(provider)
}
