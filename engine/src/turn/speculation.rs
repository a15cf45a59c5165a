//! Speculative provisioning (SPEC W11): the provider adapters name a tool call before its
//! arguments finish streaming; when that is a worker tool and the chat has no live
//! session, the worker is started (or a pooled one claimed) at once, so its start overlaps
//! the rest of the model's output instead of following it.
//!
//! The session is the chat's one session (W1): the call, once its arguments are complete,
//! finds it live and waits for it like any call, so a speculation never makes a second
//! one. Until a call uses it the row is `speculative`; when the turn ends, a session still
//! unused (the stream failed or was cancelled, the model chose another tool, the budget or
//! the approval policy held the call back) is given a short grace, after which the
//! runtime-manager tears it down.

use std::sync::Mutex;
use std::time::Duration;

use protocol::{AgentId, ChatId, SessionId, TeamId};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::sessions::{Sessions, Wanted};

/// The speculation of one turn: at most one start per turn.
pub(super) struct Speculation {
    sessions: Sessions,
    grace: Duration,
    team: TeamId,
    agent: AgentId,
    chat: ChatId,
    /// The turn's end user, whose budgets a session it starts counts against (L4).
    user: Option<String>,
    started: Mutex<Option<JoinHandle<Option<SessionId>>>>,
}

impl Speculation {
    /// `None` when speculation is off (`BRAIN_WORKER_SPECULATION_GRACE_MS=0`).
    pub fn new(
        sessions: &Sessions,
        grace: Option<Duration>,
        team: TeamId,
        agent: AgentId,
        chat: ChatId,
        user: Option<&str>,
    ) -> Option<Self> {
        Some(Self {
            sessions: sessions.clone(),
            grace: grace?,
            team,
            agent,
            chat,
            user: user.map(str::to_owned),
            started: Mutex::new(None),
        })
    }

    /// The model began streaming a call of a tool that runs on a `profile` worker: start
    /// that worker unless this turn did already. Never waits.
    pub fn begin(&self, profile: &str) {
        let Ok(mut started) = self.started.lock() else {
            return;
        };
        if started.is_some() {
            return;
        }
        let (sessions, profile) = (self.sessions.clone(), profile.to_owned());
        let (team, agent, chat, user) = (self.team, self.agent, self.chat, self.user.clone());
        // In the turn's trace: its `provision` span, and the worker's handshake under it,
        // belong to the turn that started them.
        let span = tracing::Span::current();
        *started = Some(tokio::spawn(
            async move {
                let wanted = Wanted {
                    team,
                    agent,
                    chat,
                    profile: &profile,
                    user: user.as_deref(),
                };
                sessions.speculate(wanted).await
            }
            .instrument(span),
        ));
    }
}

impl Drop for Speculation {
    /// The turn ended, however it ended: a session it started and no call used is given
    /// its grace. In the background: the turn's end does not wait for it.
    fn drop(&mut self) {
        let Some(handle) = self.started.get_mut().ok().and_then(Option::take) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (sessions, grace) = (self.sessions.clone(), self.grace);
        runtime.spawn(async move {
            if let Ok(Some(session)) = handle.await {
                sessions.abandon_speculation(session, grace).await;
            }
        });
    }
}
