//! The agent's secrets as its session's environment (SPEC W12, B1).
//!
//! Right after the MCP handshake of a session's channel (before the session is `ready`;
//! for a re-dial too, which may reach a replica that never sent them) and right after a
//! pooled worker's bind, the brain reads the agent's secrets and sends them in the custom
//! request `agent_runtime/env`; the worker answers once it holds them, so the first
//! command already sees them. Only then may calls run.
//!
//! A secret stored during a session (`secret_set`) is sent again, the whole set, to every
//! worker of the agent whose channel this replica holds, before `secret_set` answers: a
//! later command of the chat sees it. A worker held by another replica gets it at its
//! next re-dial or in the chat's next session.
//!
//! An egress secret (W13) is sent as its placeholder only; its value stays in the brain,
//! which masks it too, and goes to the session's egress proxy (docs/design/egress.md).
//!
//! The same values mask what this replica receives from the worker: live output and
//! answers ([`super::registry::WorkerClient`]), so a value the worker failed to mask still
//! never reaches the model, the stream, the store or a log.

use std::sync::Arc;

use channel::mask::Masks;
use protocol::env::{ENV_REQUEST, MAX_VARS, SessionEnv, usable};
use protocol::{AgentId, TeamId};
use rmcp::RoleClient;
use rmcp::model::{ClientRequest, CustomRequest};
use rmcp::service::RunningService;

use futures_util::FutureExt;

use super::Sessions;
use super::registry::WorkerClient;
use crate::tools::secrets::OnSecretSet;

/// Why a session's environment did not reach its worker.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("the agent's secrets cannot be read")]
    Store(#[from] store::StoreError),
    #[error("the worker refused or did not answer the environment")]
    NotDelivered,
}

impl EnvError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Store(err) => err.metric_label(),
            Self::NotDelivered => "not_delivered",
        }
    }
}

impl Sessions {
    /// What `secret_set` runs once it stored a secret: [`Sessions::refresh_env`].
    pub fn on_secret_set(&self) -> OnSecretSet {
        let sessions = self.clone();
        Arc::new(move |team, agent| {
            let sessions = sessions.clone();
            async move { sessions.refresh_env(team, agent).await }.boxed()
        })
    }

    /// Sends the agent's secrets again to each of its workers this replica holds.
    async fn refresh_env(&self, team: TeamId, agent: AgentId) {
        let workers = self.registry.all().into_iter().filter(|worker| {
            worker
                .binding()
                .is_some_and(|b| b.team == team && b.agent == agent)
        });
        for worker in workers {
            if let Err(err) = self.send_env(&worker.service, team, agent).await {
                // The worker keeps the set it had; the next session gets the new one.
                tracing::warn!(session = ?worker.binding().map(|b| b.session), class = err.metric_label(), "session environment update not delivered");
            }
        }
    }

    /// Sends the agent's secrets to the worker on `service` and masks their values in
    /// what it answers from now on; within the ready timeout.
    pub(super) async fn send_env(
        &self,
        service: &RunningService<RoleClient, WorkerClient>,
        team: TeamId,
        agent: AgentId,
    ) -> Result<(), EnvError> {
        let secrets = self.store.agent_secrets(team, agent).await?;
        let mut env = SessionEnv::default();
        let mut left_out = secrets.unreadable;
        // An egress secret's value never goes to the worker (W13): its commands hold the
        // placeholder, which the egress proxy replaces on the way to the secret's hosts.
        let placeholders = secrets
            .egress
            .iter()
            .map(|e| (e.name.clone(), domain::egress::placeholder(&e.name)));
        for (name, value) in secrets.values.iter().cloned().chain(placeholders) {
            // A name a shell cannot use or must not have overwritten, a value too short to
            // mask: left out, so one odd secret does not cost the session.
            if usable(&name, &value).is_ok() && env.vars.len() < MAX_VARS {
                env.vars.insert(name, value);
            } else {
                left_out += 1;
            }
        }
        // Masks first: whatever the worker sends from now on is masked here too, an
        // egress secret's real value included (an upstream that echoes it in a body).
        let masked = secrets.values.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        let egress = secrets.egress.iter();
        let masked = masked.chain(egress.map(|e| (e.name.as_str(), e.value.as_str())));
        service.service().set_masks(Arc::new(Masks::of(masked)));
        let vars = env.vars.len();
        let params = serde_json::to_value(&env).map_err(|_| EnvError::NotDelivered)?;
        let request = ClientRequest::CustomRequest(CustomRequest::new(ENV_REQUEST, Some(params)));
        match tokio::time::timeout(
            self.config.ready_timeout,
            service.peer().send_request(request),
        )
        .await
        {
            Ok(Ok(_)) => {
                tracing::info!(vars, left_out, "session environment sent");
                Ok(())
            }
            _ => Err(EnvError::NotDelivered),
        }
    }
}
