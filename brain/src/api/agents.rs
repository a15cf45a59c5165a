//! `POST|GET /v1/agents`, `GET|PATCH /v1/agents/{id}`, `GET /v1/agents/{id}/sessions`,
//! `GET /v1/agents/{id}/schedule`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use protocol::ErrorBody;
use serde::Deserialize;

use super::paging::{self, KeysetKey, PageParams};
use super::{ClientAddr, JsonBody, QueryParams, parse_id};
use crate::AppState;
use crate::error::ApiError;
use domain::approvals::ApprovalPolicy;
use domain::egress::AgentEgress;
use engine::agents::{
    AgentChange, AuxiliaryModels, BusyPolicy, DelegatesError, DisconnectPolicy,
    KnowledgeBasesError, KnowledgeRecall, MemoryRecall, apply_change, check_delegates,
    check_knowledge_bases, validate_agent_auxiliary, validate_knowledge_bases, validate_new_agent,
};
use engine::auth::{Principal, Scope};
use engine::models::connections;
use store::{
    Action, AgentRow, FireRow, NewAgent, ScheduleView, SessionRow, SnapshotRow, StoreError, bounded,
};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "support", "system_prompt": "You are terse.", "model": "openai/gpt-4o-mini"}))]
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
    /// Which calls ask a person first and which tools never run; by default nothing asks.
    #[serde(default)]
    approval_policy: ApprovalPolicy,
    /// What a hang-up of an interactive turn's client does (D1): `cancel` (the default)
    /// stops the turn, `continue` lets it run to its end.
    #[serde(default)]
    disconnect_policy: DisconnectPolicy,
    /// The routes of the agent's titles, summaries and image descriptions (T17), each
    /// checked like `model`; an absent one is the team's default, else `model`.
    #[serde(default)]
    auxiliary_models: AuxiliaryModels,
    /// Stream the model's reasoning to the client as AI SDK reasoning parts (T18); off by
    /// default. Reasoning is never stored, so a replay or the transcript shows none.
    #[serde(default)]
    stream_reasoning: bool,
    /// `auto` (the default) puts the memories most relevant to each message into the
    /// turn's prompt, the agent's and the chat owner's own (M3); `off` leaves them to
    /// `memory_search`.
    #[serde(default)]
    memory_recall: MemoryRecall,
    /// The ids of the team's knowledge bases the agent searches with `knowledge_search`
    /// (B5), at most 20; another team's or an unknown id is `unknown_knowledge_base`.
    #[serde(default)]
    knowledge_bases: Vec<uuid::Uuid>,
    /// `auto` puts the passages of those bases most relevant to each message into the
    /// turn's prompt (B5); `off` (the default) leaves them to `knowledge_search`.
    #[serde(default)]
    knowledge_recall: KnowledgeRecall,
    /// The names of the team's skills the agent uses (B8), at most 20: each turn's prompt
    /// lists them and `skill_read` reads them; a name that is no skill of the team is
    /// `unknown_skill`.
    #[serde(default)]
    skills: Vec<String>,
    /// The ids of the agents of its team it may hand a task to with the `delegate` tool
    /// (B7), at most 20; itself, another team's or an unknown id is `unknown_delegate`.
    #[serde(default)]
    delegates: Vec<uuid::Uuid>,
    /// The hosts the agent's commands may reach through the egress proxy (W14); absent:
    /// every host, as before (the address rule applies either way).
    #[serde(default)]
    egress: Option<AgentEgress>,
}

impl CreateAgent {
    fn validate(self) -> Result<NewAgent, ApiError> {
        self.approval_policy
            .validate()
            .map_err(ApiError::InvalidRequest)?;
        validate_agent_auxiliary(&self.auxiliary_models).map_err(ApiError::InvalidRequest)?;
        let (approval_policy, disconnect_policy) = (self.approval_policy, self.disconnect_policy);
        let (auxiliary_models, stream_reasoning) = (self.auxiliary_models, self.stream_reasoning);
        let memory_recall = self.memory_recall;
        let knowledge_bases =
            validate_knowledge_bases(self.knowledge_bases).map_err(ApiError::InvalidRequest)?;
        let knowledge_recall = self.knowledge_recall;
        let skills =
            engine::agents::validate_agent_skills(self.skills).map_err(ApiError::InvalidRequest)?;
        let delegates = self.delegates;
        if let Some(egress) = &self.egress {
            egress.validate().map_err(ApiError::InvalidRequest)?;
        }
        let egress = self.egress;
        validate_new_agent(
            self.name,
            self.system_prompt,
            self.model,
            self.fallback_models,
            self.runtime_profile,
            self.concierge,
        )
        .map(|agent| NewAgent {
            approval_policy,
            disconnect_policy,
            auxiliary_models,
            stream_reasoning,
            memory_recall,
            knowledge_bases,
            knowledge_recall,
            skills,
            delegates,
            egress,
            ..agent
        })
        .map_err(ApiError::InvalidRequest)
    }
}

/// T14: an agent's routes (its auxiliary ones too, T17) may name only its team's provider
/// connections and the deployment's own.
async fn check_connections(
    state: &AppState,
    team: protocol::TeamId,
    model: &str,
    fallback_models: &[String],
    auxiliary: &AuxiliaryModels,
) -> Result<(), ApiError> {
    let routes: Vec<&str> = std::iter::once(model)
        .chain(fallback_models.iter().map(String::as_str))
        .chain(auxiliary.routes())
        .collect();
    bounded(async { Ok(connections::check_routes(&state.store, team, &routes).await) }).await??;
    Ok(())
}

/// B7: an agent delegates only to other live agents of its team (the engine's rule); the
/// ids as they will be stored.
async fn checked_delegates(
    state: &AppState,
    team: protocol::TeamId,
    agent: Option<protocol::AgentId>,
    ids: Vec<uuid::Uuid>,
) -> Result<Vec<uuid::Uuid>, ApiError> {
    check_delegates(&state.store, team, agent, ids)
        .await
        .map_err(|e| match e {
            DelegatesError::Unknown(problem) => ApiError::UnknownDelegate(problem),
            DelegatesError::Store(e) => e.into(),
        })
}

/// B5: an agent names only its team's knowledge bases.
async fn check_bases(
    state: &AppState,
    team: protocol::TeamId,
    ids: &[uuid::Uuid],
) -> Result<(), ApiError> {
    check_knowledge_bases(&state.store, team, ids)
        .await
        .map_err(|e| match e {
            KnowledgeBasesError::Unknown(problem) => ApiError::UnknownKnowledgeBase(problem),
            KnowledgeBasesError::Store(e) => e.into(),
        })
}

#[utoipa::path(
    post,
    path = "/agents",
    operation_id = "create_agent",
    tag = "agents",
    request_body = CreateAgent,
    responses(
        (status = 201, description = "The agent.", body = AgentRow),
        (status = 400, description = "A field is missing, unknown or invalid (`invalid_request`), or a route names a provider connection the team does not have (`unknown_connection`), or `knowledge_bases` names an id that is no knowledge base of the team (`unknown_knowledge_base`), or `skills` names no skill of the team (`unknown_skill`), or `delegates` names the agent itself or no live agent of the team (`unknown_delegate`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).", body = ErrorBody),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    JsonBody(body): JsonBody<CreateAgent>,
) -> Result<(StatusCode, Json<AgentRow>), ApiError> {
    principal.require_admin()?;
    let team = principal.team;
    let mut agent = body.validate()?;
    agent.delegates = checked_delegates(&state, team, None, agent.delegates).await?;
    check_connections(
        &state,
        principal.team,
        &agent.model,
        &agent.fallback_models,
        &agent.auxiliary_models,
    )
    .await?;
    check_bases(&state, team, &agent.knowledge_bases).await?;
    engine::skills::check_agent_skills(&state.store, team, &agent.skills).await?;
    let by = principal.actor(address);
    let row = bounded(state.store.create_agent(team, &agent, &by)).await?;
    tracing::info!(team = %team, agent = %row.id, "agent created");
    Ok((StatusCode::CREATED, Json(row)))
}

#[utoipa::path(
    get,
    path = "/agents/{agent_id}",
    operation_id = "get_agent",
    tag = "agents",
    params(("agent_id" = Uuid, Path, description = "The agent.")),
    responses(
        (status = 200, description = "The agent.", body = AgentRow),
        (status = 404, description = "No such agent in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
) -> Result<Json<AgentRow>, ApiError> {
    let id = parse_id(&agent_id, "agent")?;
    match state.store.agent(principal.team, id).await {
        Ok(row) => Ok(Json(row)),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

/// `PATCH /v1/agents/{id}`: any of the fields; an absent one is left as it is.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"autostart_cron": "0 9 * * MON-FRI", "autostart_prompt": "Summarize yesterday's tickets.", "autostart_timezone": "Europe/Paris"}))]
pub struct PatchAgent {
    #[serde(default)]
    system_prompt: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    fallback_models: Option<Vec<String>>,
    #[serde(default)]
    runtime_profile: Option<String>,
    /// 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first;
    /// `null` turns autostart off.
    #[serde(default, deserialize_with = "engine::agents::present")]
    #[schema(value_type = Option<String>)]
    autostart_cron: Option<Option<String>>,
    /// The message each autostart turn begins with (1 to 4000 characters).
    #[serde(default)]
    autostart_prompt: Option<String>,
    /// The IANA time zone the cron is read in; `null` is UTC.
    #[serde(default, deserialize_with = "engine::agents::present")]
    #[schema(value_type = Option<String>)]
    autostart_timezone: Option<Option<String>>,
    /// Replaces the agent's approval policy (A2) as a whole.
    #[serde(default)]
    approval_policy: Option<ApprovalPolicy>,
    /// `cancel` or `continue` (D1).
    #[serde(default)]
    disconnect_policy: Option<DisconnectPolicy>,
    /// `reject`, `enqueue` or `interrupt` (T13): what a message does while the agent runs
    /// another turn.
    #[serde(default)]
    busy_policy: Option<BusyPolicy>,
    /// Replaces the auxiliary routes (T17) as a whole: `{}` names none.
    #[serde(default)]
    auxiliary_models: Option<AuxiliaryModels>,
    /// Stream the model's reasoning to the client as reasoning parts, or stop (T18).
    #[serde(default)]
    stream_reasoning: Option<bool>,
    /// `auto` or `off`: whether each turn's prompt recalls memories (M3).
    #[serde(default)]
    memory_recall: Option<MemoryRecall>,
    /// Replaces the knowledge bases the agent searches (B5) as a whole: `[]` names none.
    #[serde(default)]
    knowledge_bases: Option<Vec<uuid::Uuid>>,
    /// `auto` or `off`: whether each turn's prompt recalls passages of them (B5).
    #[serde(default)]
    knowledge_recall: Option<KnowledgeRecall>,
    /// Replaces the skills the agent uses (B8) as a whole: `[]` names none.
    #[serde(default)]
    skills: Option<Vec<String>>,
    /// Replaces the agents it may delegate to (B7) as a whole: `[]` names none.
    #[serde(default)]
    delegates: Option<Vec<uuid::Uuid>>,
    /// Replaces the egress allowlist (W14) as a whole; `null`: every host again.
    #[serde(default, deserialize_with = "engine::agents::present")]
    #[schema(value_type = Option<AgentEgress>)]
    egress: Option<Option<AgentEgress>>,
}

impl From<PatchAgent> for AgentChange {
    fn from(patch: PatchAgent) -> Self {
        Self {
            system_prompt: patch.system_prompt,
            model: patch.model,
            fallback_models: patch.fallback_models,
            runtime_profile: patch.runtime_profile,
            autostart_cron: patch.autostart_cron,
            approval_policy: patch.approval_policy,
            disconnect_policy: patch.disconnect_policy,
            busy_policy: patch.busy_policy,
            auxiliary_models: patch.auxiliary_models,
            stream_reasoning: patch.stream_reasoning,
            memory_recall: patch.memory_recall,
            knowledge_bases: patch.knowledge_bases,
            knowledge_recall: patch.knowledge_recall,
            skills: patch.skills,
            delegates: patch.delegates,
            egress: patch.egress,
            autostart_prompt: patch.autostart_prompt,
            autostart_timezone: patch.autostart_timezone,
        }
    }
}

/// `PATCH /v1/agents/{id}` (admin): changes any of the agent's fields, checked by the
/// rules `POST /v1/agents` and the agent tools use. A changed cadence gets its next tick
/// from now and drops the firings planned under the old one.
#[utoipa::path(
    patch,
    path = "/agents/{agent_id}",
    operation_id = "update_agent",
    tag = "agents",
    params(("agent_id" = Uuid, Path, description = "The agent.")),
    request_body = PatchAgent,
    responses(
        (status = 200, description = "The agent as changed.", body = AgentRow),
        (status = 400, description = "A field is unknown or invalid (`invalid_request`): a bad cron expression or time zone, say; or a route names a provider connection the team does not have (`unknown_connection`), or `knowledge_bases` names an id that is no knowledge base of the team (`unknown_knowledge_base`), or `skills` names no skill of the team (`unknown_skill`), or `delegates` names the agent itself or no live agent of the team (`unknown_delegate`).", body = ErrorBody),
        (status = 403, description = "The caller is not an admin (`forbidden`).", body = ErrorBody),
        (status = 404, description = "No such live agent in the team (`not_found`).", body = ErrorBody),
        (status = 413, description = "The body is too large (`payload_too_large`).", body = ErrorBody),
    ),
)]
pub async fn update(
    State(state): State<AppState>,
    principal: Principal,
    ClientAddr(address): ClientAddr,
    Path(agent_id): Path<String>,
    JsonBody(body): JsonBody<PatchAgent>,
) -> Result<Json<AgentRow>, ApiError> {
    principal.require_admin()?;
    let id = parse_id(&agent_id, "agent")?;
    let not_found = |e| match e {
        StoreError::NotFound => ApiError::NotFound("agent"),
        other => other.into(),
    };
    let current = state
        .store
        .agent(principal.team, id)
        .await
        .map_err(not_found)?;
    if current.archived {
        return Err(ApiError::NotFound("agent"));
    }
    let bases_given = body.knowledge_bases.is_some();
    let skills_given = body.skills.is_some();
    let delegates_given = body.delegates.is_some();
    let mut update = apply_change(
        &current,
        body.into(),
        state.config.autostart.min_interval_secs,
        &principal.authority().actor,
        state.clock.now(),
    )
    .map_err(ApiError::InvalidRequest)?;
    check_connections(
        &state,
        principal.team,
        &update.model,
        &update.fallback_models,
        &update.auxiliary_models,
    )
    .await?;
    // Only ids the change names are checked: a base deleted since the agent named it is
    // no reason to refuse another field's change (it drops out of the searches).
    if bases_given {
        check_bases(&state, principal.team, &update.knowledge_bases).await?;
    }
    // As the bases: a skill deleted since is no reason to refuse another field's change.
    if skills_given {
        engine::skills::check_agent_skills(&state.store, principal.team, &update.skills).await?;
    }
    // As the bases: only a change that names delegates checks them.
    if delegates_given {
        let ids = std::mem::take(&mut update.delegates);
        update.delegates = checked_delegates(&state, principal.team, Some(id), ids).await?;
    }
    let by = principal.actor(address);
    let row =
        bounded(
            state
                .store
                .update_agent(principal.team, id, &update, &by, Action::AgentUpdated),
        )
        .await
        .map_err(not_found)?;
    tracing::info!(team = %principal.team, agent = %id, "agent changed");
    Ok(Json(row))
}

/// `GET /v1/agents/{id}/schedule`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Schedule {
    /// `null` when no autostart is set.
    cron: Option<String>,
    /// The IANA time zone the cron is read in.
    timezone: String,
    next_fire_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Why the cadence does not fire until an admin sets it again: `setter_revoked` (who
    /// set it lost their standing, X1). `null` while it fires.
    paused: Option<String>,
    /// The latest fires, newest first.
    fires: Vec<Fire>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Fire {
    scheduled_for: chrono::DateTime<chrono::Utc>,
    #[schema(value_type = String, example = "fired")]
    /// `fired`, `skipped_busy` (the agent was running another turn) or `failed`.
    outcome: String,
    turn_id: Option<protocol::TurnId>,
    chat_id: Option<protocol::ChatId>,
    /// Why a `failed` fire failed: a stable error code (`quota_exceeded`, ...).
    error_code: Option<String>,
}

impl From<FireRow> for Fire {
    fn from(row: FireRow) -> Self {
        Self {
            scheduled_for: row.scheduled_for,
            outcome: row.outcome,
            turn_id: row.turn_id,
            chat_id: row.chat_id,
            error_code: row.error_code,
        }
    }
}

/// `?limit=` of the schedule's latest fires: 1 to 200, 50 when absent.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// How many, newest first: 1 to 200, 50 when absent.
    #[serde(default)]
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
}

/// `GET /v1/agents/{id}/schedule`: the autostart cadence, its next tick and the latest
/// fires (SPEC T11), newest first; `?limit=` as the listings (50 by default).
#[utoipa::path(
    get,
    path = "/agents/{agent_id}/schedule",
    operation_id = "get_agent_schedule",
    tag = "agents",
    params(("agent_id" = Uuid, Path, description = "The agent."), ListParams),
    responses(
        (status = 200, description = "The cadence, the next tick and the latest fires.", body = Schedule),
        (status = 400, description = "`limit` is out of range (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such agent in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn schedule(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
    QueryParams(params): QueryParams<ListParams>,
) -> Result<Json<Schedule>, ApiError> {
    let id = parse_id(&agent_id, "agent")?;
    let limit = paging::checked_limit(params.limit)?;
    let view: ScheduleView = match state.store.schedule(principal.team, id, limit).await {
        Ok(view) => view,
        Err(StoreError::NotFound) => return Err(ApiError::NotFound("agent")),
        Err(e) => return Err(e.into()),
    };
    Ok(Json(Schedule {
        cron: view.cron,
        timezone: view.timezone.unwrap_or_else(|| "UTC".into()),
        next_fire_at: view.next_fire_at,
        paused: view.paused,
        fires: view.fires.into_iter().map(Fire::from).collect(),
    }))
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Sessions {
    /// A page of the agent's sessions, newest first.
    sessions: Vec<SessionRow>,
    /// The agent's workspace snapshots (W10), newest first: at most one per chat, restored
    /// by that chat's next session. Every page carries them all.
    snapshots: Vec<SnapshotRow>,
    /// `cursor` for the next page of sessions; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// `GET /v1/agents/{id}/sessions`: the agent's worker sessions, newest first, with
/// state and failure reason (SPEC W6), and its workspace snapshots with their size and
/// time (W10); for a user token without the admin claim, those of the user's chats only.
#[utoipa::path(
    get,
    path = "/agents/{agent_id}/sessions",
    operation_id = "list_agent_sessions",
    tag = "agents",
    params(("agent_id" = Uuid, Path, description = "The agent."), PageParams),
    responses(
        (status = 200, description = "A page of the agent's worker sessions, newest first.",
            body = Sessions),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
        (status = 404, description = "No such agent in the team (`not_found`).", body = ErrorBody),
    ),
)]
pub async fn sessions(
    State(state): State<AppState>,
    principal: Principal,
    Path(agent_id): Path<String>,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<Sessions>, ApiError> {
    let id = parse_id(&agent_id, "agent")?;
    let limit = params.limit()?;
    let before = params.after::<KeysetKey>(SESSIONS_CURSOR)?.map(|k| k.0);
    let only = principal.only_chats_of();
    // The autostart chat's work is the agent's own: only admins see it (X1).
    let admin = principal.scope == Scope::Admin;
    let sessions =
        bounded(
            state
                .store
                .agent_sessions(principal.team, id, only, admin, before, limit + 1),
        );
    let listed = match sessions.await {
        Ok(rows) => {
            let (sessions, next_cursor) = paging::page(rows, limit, SESSIONS_CURSOR, |s| {
                KeysetKey::of(s.created_at, s.id.0)
            });
            bounded(state.store.agent_snapshots(principal.team, id, only, admin))
                .await
                .map(|snapshots| Sessions {
                    sessions,
                    snapshots,
                    next_cursor,
                })
        }
        Err(e) => Err(e),
    };
    match listed {
        Ok(listed) => Ok(Json(listed)),
        Err(StoreError::NotFound) => Err(ApiError::NotFound("agent")),
        Err(e) => Err(e.into()),
    }
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Agents {
    agents: Vec<AgentRow>,
    /// `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

const AGENTS_CURSOR: &str = "ag1:";
const SESSIONS_CURSOR: &str = "ws1:";

/// `GET /v1/agents`: the team's agents that are not archived, newest first.
#[utoipa::path(
    get,
    path = "/agents",
    operation_id = "list_agents",
    tag = "agents",
    params(PageParams),
    responses(
        (status = 200, description = "A page of the team's agents, newest first.", body = Agents),
        (status = 400, description = "`limit` is out of range or `cursor` is not a cursor of \
            this listing (`invalid_request`).", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<Agents>, ApiError> {
    let limit = params.limit()?;
    let before = params.after::<KeysetKey>(AGENTS_CURSOR)?.map(|k| k.0);
    let rows = bounded(state.store.agents(principal.team, before, limit + 1)).await?;
    let (agents, next_cursor) = paging::page(rows, limit, AGENTS_CURSOR, |a| {
        KeysetKey::of(a.created_at, a.id.0)
    });
    Ok(Json(Agents {
        agents,
        next_cursor,
    }))
}
