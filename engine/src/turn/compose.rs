//! Compose (T3, A3): what the trigger asks, the tools the turn is offered, the frozen
//! composition, and the turn row with its user message, then the first model request
//! built from the history that write read back.

use std::sync::Arc;

use protocol::TurnId;
use protocol::parts::SourceDocument;
use protocol::ui::ConnectorStatus;
use tokio_util::sync::CancellationToken;

use super::attachments::{self, Files};
use super::auxiliary;
use super::basis::{Found, KeptHistory, Source};
use super::context::{self, Fold};
use super::describe::Describer;
use super::history::{Counted, HistoryRow, model_messages};
use super::offered::Offered;
use super::{Composition, Launch, Launched, Trigger, TurnError, recall, replay};
use crate::Engine;
use crate::connectors;
use crate::tools::Toolset;
use providers::{Catalog, ModelRequest};
use store::{
    AgentRow, Answered, Answerer, ApprovalRow, BasisCheck, Begun, Close, FrozenComposition,
    NewTurn, StoreError, TurnBasis, bounded,
};

/// What the trigger asks of the turn, once answers are recorded.
pub(super) struct Asked {
    /// The user message (or autostart prompt); `None` for a continuation.
    content: Option<String>,
    /// The user message's files (T21), after its text.
    files: Vec<protocol::parts::FilePart>,
    client_message_id: Option<String>,
    /// A continuation's answered approvals, whose approved calls run first (A3).
    resume: Vec<ApprovalRow>,
    /// The approvals these answers closed, as they now are.
    answered: Vec<ApprovalRow>,
    autostart: bool,
    /// A queued turn (T13): its row and user message exist; starting it writes neither.
    queued: bool,
    /// P9: the caller's instructions: the message's, a queued turn's as queued, or those
    /// of the turn a continuation resumes.
    instructions: Option<String>,
}

pub(super) enum Resolved {
    Run(Asked),
    /// Nothing runs (answers that do not complete their turn's set, or a stranded
    /// continuation another replica took): the approvals answered.
    Nothing(Vec<ApprovalRow>),
}

/// The trigger's effects under the hold: a new message denies what waits (A4); an answer
/// is recorded at most once, and the last of its turn resumes it (A3).
pub(super) async fn resolve(
    state: &Engine,
    launch: &Launch,
    basis: &TurnBasis,
    trigger: Trigger,
    turn: TurnId,
) -> Result<Resolved, TurnError> {
    let (team, chat) = (launch.team, launch.chat);
    let autostart = matches!(trigger, Trigger::Autostart(..));
    match trigger {
        Trigger::User(input) | Trigger::Autostart(input, _) => {
            deny_waiting(state, launch, basis).await?;
            Ok(Resolved::Run(Asked {
                content: Some(input.content),
                files: input.files,
                client_message_id: input.client_message_id,
                resume: Vec::new(),
                answered: Vec::new(),
                autostart,
                queued: false,
                instructions: input.instructions,
            }))
        }
        Trigger::Queued(queued) => {
            deny_waiting(state, launch, basis).await?;
            Ok(Resolved::Run(Asked {
                content: None,
                files: Vec::new(),
                client_message_id: None,
                resume: Vec::new(),
                answered: Vec::new(),
                autostart: false,
                queued: true,
                instructions: queued.instructions,
            }))
        }
        Trigger::Stranded(stranded) => {
            let reclaimed = Box::pin(bounded(
                state.store.reclaim_continuation(team, chat, stranded, turn),
            ))
            .await?;
            // `None`: taken by another replica meanwhile, or its turn row exists after all.
            match reclaimed {
                Some(resume) => continued(state, team, resume, Vec::new()).await,
                None => Ok(Resolved::Nothing(Vec::new())),
            }
        }
        Trigger::Approval(answers) => {
            let answerer = launch
                .answerer
                .as_ref()
                .ok_or(TurnError::Internal("answers without an answerer".into()))?;
            let by = Answerer {
                actor: &answerer.actor,
                admin: answerer.may_change_agent(),
            };
            let outcome = Box::pin(bounded(
                state.store.answer_approvals(team, chat, &answers, turn, by),
            ))
            .await;
            match outcome {
                Ok(Answered::Done {
                    answered,
                    resume: Some(resume),
                }) => continued(state, team, resume, answered).await,
                Ok(Answered::Done {
                    answered,
                    resume: None,
                }) => Ok(Resolved::Nothing(answered)),
                Ok(Answered::Closed(row)) => Err(TurnError::Conflict(format!(
                    "this approval is {} already",
                    row.state.as_str()
                ))),
                Err(StoreError::NotFound) => Err(TurnError::NotFound("approval")),
                Err(e) => Err(e.into()),
            }
        }
    }
}

/// A continuation (A3): no message of its own, and the instructions of the turn it
/// resumes (P9), read again from that turn's row.
async fn continued(
    state: &Engine,
    team: protocol::TeamId,
    resume: Vec<ApprovalRow>,
    answered: Vec<ApprovalRow>,
) -> Result<Resolved, TurnError> {
    let instructions = match resume.first() {
        Some(asking) => {
            let stored = state.store.turn_instructions(team, asking.turn);
            Box::pin(bounded(stored)).await?
        }
        None => None,
    };
    Ok(Resolved::Run(Asked {
        content: None,
        files: Vec::new(),
        client_message_id: None,
        resume,
        answered,
        autostart: false,
        queued: false,
        instructions,
    }))
}

/// A4: a new message denies the chat's calls that wait for a person.
///
/// The store calls of this file's rarer triggers are boxed: a transaction's future is
/// some 15 KB (sqlx's pool acquire), and inline it would be moved with every turn's
/// request future (measured in docs/design/performance-history.md: futures not moved
/// whole).
async fn deny_waiting(state: &Engine, launch: &Launch, basis: &TurnBasis) -> Result<(), TurnError> {
    if basis.has_pending_approvals {
        Box::pin(bounded(state.store.close_approvals(
            launch.team,
            launch.chat,
            Close::Superseded,
        )))
        .await?;
    }
    Ok(())
}

/// Everything the loop starts from.
pub(super) struct Ready {
    pub request: ModelRequest,
    pub route: Vec<String>,
    pub toolset: Arc<Toolset>,
    pub connector_status: Vec<ConnectorStatus>,
    pub fold: Fold,
    pub resume: Vec<ApprovalRow>,
    pub answered: Vec<ApprovalRow>,
    pub autostart: bool,
    /// B5: the sources of the passages recalled into the request (`knowledge_recall:
    /// "auto"`): the turn streams them when its stream opens and keeps them first in the
    /// answer's parts.
    pub recalled: Vec<SourceDocument>,
}

pub(super) enum Composed {
    Ready(Box<Ready>),
    /// Another request with the same message id wrote its turn first: its replay.
    Replayed(Launched),
    /// The kept basis `check` came from is stale: nothing was written.
    Stale,
}

/// Starts the connectors, renders the composition, and writes the turn row with the user
/// message; a failed write means no provider call. From a kept basis, the write happens
/// only if the basis is current, and reads only the messages after the kept history.
pub(super) async fn compose(
    state: &Engine,
    launch: &Launch,
    found: &Found,
    mut asked: Asked,
    turn: TurnId,
    cancel: &CancellationToken,
) -> Result<Composed, TurnError> {
    let basis = &*found.basis;
    let TurnBasis {
        chat: chat_row,
        agent,
        ..
    } = basis;
    let (offered, connector_status) = offer(state, launch, basis, cancel).await;
    // Cloned: `begin_new` writes the asked message, and with it these, meanwhile.
    let instructions = asked.instructions.clone();
    // B8: the agent's skills, listed in the system text and frozen with it.
    let skills = crate::skills::prompt_listing(&state.store, agent).await;
    let composition = Composition {
        version: 1,
        system_prompt: &agent.system_prompt,
        instructions: instructions.as_deref(),
        model_route: model_route(agent),
        tools: &offered.composition_tools,
        max_iterations: state.config.limits.max_iterations,
        max_writes: state.config.limits.max_writes,
        max_output_tokens: state.config.max_output_tokens,
        summary_through: chat_row.summary_through,
        skills: skills.as_deref(),
    };
    let frozen = freeze(state, launch, found, &composition)?;
    let begun = if asked.queued {
        begin_queued(state, launch, turn, &frozen, composition.summary_through).await?
    } else {
        let summary_through = composition.summary_through;
        begin_new(
            state,
            launch,
            found,
            &mut asked,
            turn,
            &frozen,
            summary_through,
        )
        .await?
    };
    let history = match begun {
        Beginning::History(history) => history,
        Beginning::Instead(composed) => return Ok(composed),
    };
    let route: Vec<String> = composition
        .model_route
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let (request, fold, recalled) = first_request(
        state,
        launch,
        basis,
        turn,
        &history,
        offered.catalog.clone(),
        route.clone(),
        state.config.max_output_tokens,
        instructions.as_deref(),
    )
    .await;
    let mut request = request;
    if let Some(listing) = &skills {
        request.system = format!("{}\n\n{listing}", request.system);
    }
    // M6: the workspace's AGENTS.md, as the workspace's words beside the user's message.
    let hands = agent.runtime_profile != protocol::profile::NONE;
    if hands && let Some(context) = state.sessions.project_context(agent.id, launch.chat).await {
        recall::place(&mut request.messages, context);
    }
    Ok(Composed::Ready(Box::new(Ready {
        request,
        route,
        toolset: offered.toolset.clone(),
        connector_status,
        fold,
        resume: asked.resume,
        answered: asked.answered,
        autostart: asked.autostart,
        recalled,
    })))
}

/// A turn's first model request over `history`, and the fold that summarises the history
/// once the turn outgrew the context budget (by the `summary` route, then the turn's own
/// `route`), carrying the chat's title when this is its first turn (T17). The window's
/// files are read within what its text leaves of the context budget (T23). `instructions`
/// are the caller's for this turn (P9), as frozen with it.
#[allow(clippy::too_many_arguments)]
pub(super) async fn first_request(
    state: &Engine,
    launch: &Launch,
    basis: &TurnBasis,
    turn: TurnId,
    history: &[impl Counted],
    catalog: Arc<Catalog>,
    route: Vec<String>,
    max_output_tokens: u32,
    instructions: Option<&str>,
) -> (ModelRequest, Fold, Vec<SourceDocument>) {
    let window = &history[context::window_start(history, state.config.context_tokens)..];
    let files = if attachments::any(window.iter().map(Counted::row)) {
        let budget = state
            .config
            .context_tokens
            .saturating_sub(context::history_tokens(window));
        // Boxed: a text-only turn's future stays as small as it was.
        let rows = window.iter().map(Counted::row);
        let hands = basis.agent.runtime_profile != protocol::profile::NONE;
        let model = route.first().map(String::as_str);
        Box::pin(async move {
            // T25: where the files are in the worker's workspace, for an agent with hands.
            let workspace = if hands {
                state
                    .sessions
                    .chat_files(launch.team, launch.chat, turn)
                    .await
            } else {
                None
            };
            let files = workspace.as_deref();
            // T27: images described for a turn whose model has no vision.
            let describer = Describer::new(
                state,
                (launch.team, basis.agent.id, turn),
                launch.authority.user(),
                model,
                basis.agent.auxiliary_models.vision.as_deref(),
            );
            let ids = (launch.team, launch.chat);
            attachments::load(state, ids, rows, budget, files, &describer).await
        })
        .await
    } else {
        Files::default()
    };
    let mut messages = model_messages(window, &files);
    if let Some(recalled) = recall::recalled(state, basis, window).await {
        recall::place(&mut messages, recalled);
    }
    // B5: the recalled passages' sources, streamed and kept as the tool's are.
    let recalled = match recall::passages(state, basis, window).await {
        Some((passages, sources)) => {
            recall::place(&mut messages, passages);
            sources
        }
        None => Vec::new(),
    };
    let request = ModelRequest {
        model: String::new(),
        system: system_text(
            &basis.agent.system_prompt,
            instructions,
            &basis.chat.summary,
        ),
        messages,
        tools: catalog,
        max_output_tokens,
    };
    let fold = Fold {
        store: state.store.clone(),
        holds: state.holds.clone(),
        connections: state.connections.clone(),
        team: launch.team,
        agent: basis.agent.id,
        chat: launch.chat,
        turn,
        user: launch.authority.user().map(str::to_owned),
        title: auxiliary::Title::for_first_turn(
            state,
            basis,
            turn,
            launch.authority.user(),
            history,
            &route,
        ),
        route,
        summary_route: basis.agent.auxiliary_models.summary.clone(),
        budget: state.config.context_tokens,
        max_output_tokens,
        unsummarized: context::history_tokens(history),
    };
    (request, fold, recalled)
}

/// What beginning a turn gave.
enum Beginning {
    /// The history the turn runs on.
    History(Vec<Arc<HistoryRow>>),
    /// What answers instead of running: a stale kept basis, a replay.
    Instead(Composed),
}

/// A queued turn (T13): its row and user message exist; it begins here unless it was
/// withdrawn, or another replica began it, since it was read.
async fn begin_queued(
    state: &Engine,
    launch: &Launch,
    turn: TurnId,
    frozen: &FrozenComposition,
    summary_through: i64,
) -> Result<Beginning, TurnError> {
    let begun = bounded(state.store.begin_queued_turn(
        launch.team,
        turn,
        state.replica,
        frozen,
        summary_through,
    ))
    .await?;
    let history = begun.ok_or(TurnError::NotFound("turn"))?;
    Ok(Beginning::History(
        history
            .into_iter()
            .map(|row| Arc::new(HistoryRow::new(row)))
            .collect(),
    ))
}

/// Writes the turn row with its user message and reads back the history after what this
/// replica kept (only while the kept basis is current); a message id another request
/// wrote first replays that turn (T12).
async fn begin_new(
    state: &Engine,
    launch: &Launch,
    found: &Found,
    asked: &mut Asked,
    turn: TurnId,
    frozen: &FrozenComposition,
    summary_through: i64,
) -> Result<Beginning, TurnError> {
    let (team, chat) = (launch.team, launch.chat);
    let basis = &*found.basis;
    let kept = found.history.as_deref();
    let after = kept.map_or(summary_through, |k| k.through);
    let check = (found.source == Source::Kept).then(|| BasisCheck {
        history: kept.map(KeptHistory::check),
        ..basis.check()
    });
    let files = std::mem::take(&mut asked.files);
    let user_parts = asked
        .content
        .take()
        .map(|text| super::TurnInput::parts(text, files));
    let begun = bounded(state.store.begin_turn(
        NewTurn {
            id: turn,
            team,
            agent: basis.agent.id,
            chat,
            background: launch.detached,
            trigger: if !asked.resume.is_empty() {
                "approval"
            } else if asked.autostart {
                "autostart"
            } else {
                "user"
            },
            composition: frozen,
            user_parts: user_parts.as_deref(),
            client_message_id: asked.client_message_id.as_deref(),
            replica: state.replica,
            actor: &launch.authority.actor,
            actor_admin: launch.authority.may_change_agent(),
            instructions: asked.instructions.as_deref(),
        },
        after,
        check,
    ))
    .await;
    match begun {
        Ok(Begun::History(read)) => {
            let rows: Vec<Arc<HistoryRow>> = kept
                .map(|k| k.rows.iter().cloned())
                .into_iter()
                .flatten()
                .chain(read.into_iter().map(|row| Arc::new(HistoryRow::new(row))))
                .collect();
            if found.keeps {
                let through = rows.last().map_or(after, |r| r.row.seq);
                let history = KeptHistory {
                    through,
                    rows: rows.clone(),
                };
                state
                    .bases
                    .keep_history(team, chat, basis.versions, Arc::new(history));
            }
            Ok(Beginning::History(rows))
        }
        Ok(Begun::Stale) => Ok(Beginning::Instead(Composed::Stale)),
        Err(StoreError::Conflict("message_id")) => {
            let client_id = asked.client_message_id.as_deref().unwrap_or_default();
            let existing = bounded(state.store.turn_for_client_message(team, chat, client_id))
                .await?
                .ok_or(TurnError::Internal(
                    "conflicting message id vanished".into(),
                ))?;
            replay::replay(existing)
                .map(|replayed| Beginning::Instead(Composed::Replayed(replayed)))
        }
        Err(e) => Err(e.into()),
    }
}

/// The tools the turn is offered: the brain's, then the worker's, then the connectors'
/// (started here, each within its bound), with the connectors' status for the stream.
pub(super) async fn offer(
    state: &Engine,
    launch: &Launch,
    basis: &TurnBasis,
    cancel: &CancellationToken,
) -> (Arc<Offered>, Vec<ConnectorStatus>) {
    let (connector_tools, connector_status) = if basis.has_connectors {
        connectors::connector_tools(
            &state.store,
            &state.config.connectors,
            &state.oauth,
            launch.team,
            basis.agent.id,
            connectors::Requester {
                user: basis.chat.created_by.as_deref(),
                admin: launch.authority.may_change_agent(),
                actor: &launch.authority.actor,
                // P5: a person answers the servers' questions only where one follows the
                // turn; a background or autostart turn declines them at once.
                answerer: if launch.detached {
                    connectors::Answerer::Nobody
                } else {
                    connectors::Answerer::Person {
                        ttl: state.config.approval_ttl,
                    }
                },
            },
            cancel,
        )
        .await
    } else {
        (Vec::new(), Vec::new())
    };
    let shared = state.toolsets.get(
        state,
        basis.agent.concierge,
        !basis.agent.knowledge_bases.is_empty(),
        &basis.agent.runtime_profile,
    );
    let mut extra = connector_tools;
    // B8: `skill_read` for an agent that names skills, on top of the shared set.
    if !basis.agent.skills.is_empty() {
        extra.push(crate::skills::tool::tool(state.artifacts.clone()));
    }
    // B7: the delegate tool holds the turn's place in its tree, so it is the turn's own.
    if let Some(delegate) =
        super::delegation::tool(state, &basis.agent, launch.lineage.as_ref()).await
    {
        extra.push(delegate);
    }
    let offered = if extra.is_empty() {
        shared
    } else {
        Arc::new(shared.with(extra))
    };
    (offered, connector_status)
}

/// The composition as it is stored, its hash reused from the chat's kept basis when this
/// turn rendered the same text, and kept for the next turn otherwise.
fn freeze(
    state: &Engine,
    launch: &Launch,
    found: &Found,
    composition: &Composition<'_>,
) -> Result<Arc<FrozenComposition>, TurnError> {
    let text = serde_json::value::to_raw_value(composition)
        .map_err(|e| TurnError::Internal(format!("composition: {e}")))?;
    if let Some(kept) = &found.composition
        && kept.text() == text.get()
    {
        return Ok(kept.clone());
    }
    let frozen = Arc::new(FrozenComposition::new(text));
    if found.keeps {
        state
            .bases
            .keep_composition(launch.team, launch.chat, &found.basis, frozen.clone());
    }
    Ok(frozen)
}

/// The most characters a caller's instructions for a turn may have (P9); the column
/// that keeps them (migration 0057) has the same bound.
pub const MAX_INSTRUCTIONS_CHARS: usize = 16_384;

/// Where the caller's instructions begin in the system text: they are the caller's
/// words, added after the agent's own prompt, which they do not replace (P9).
const INSTRUCTIONS_HEADING: &str =
    "Instructions from the caller for this turn (in addition to the above, not replacing it):";

/// Checks a caller's instructions for a turn (P9): 1 to [`MAX_INSTRUCTIONS_CHARS`]
/// characters, no NUL (Postgres text cannot hold one).
pub fn validate_instructions(text: &str) -> Result<(), String> {
    if text.is_empty() || text.chars().count() > MAX_INSTRUCTIONS_CHARS {
        return Err(format!(
            "instructions must have 1 to {MAX_INSTRUCTIONS_CHARS} characters"
        ));
    }
    if text.contains('\0') {
        return Err("instructions must not contain NUL characters".into());
    }
    Ok(())
}

/// The system text of a turn's requests: the agent's prompt, the caller's instructions
/// for the turn under their heading, then the running summary (M1).
pub(super) fn system_text(prompt: &str, instructions: Option<&str>, summary: &str) -> String {
    let mut text = prompt.to_owned();
    if let Some(instructions) = instructions {
        text.push_str("\n\n");
        text.push_str(INSTRUCTIONS_HEADING);
        text.push('\n');
        text.push_str(instructions);
    }
    if !summary.is_empty() {
        text.push_str("\n\nSummary of the earlier conversation:\n");
        text.push_str(summary);
    }
    text
}

/// The primary model, then the fallbacks in order.
fn model_route(agent: &AgentRow) -> Vec<&str> {
    std::iter::once(agent.model.as_str())
        .chain(agent.fallback_models.iter().map(String::as_str))
        .collect()
}
