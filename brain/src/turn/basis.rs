//! The bases this replica's turns start from (issue 31): a chat with its agent, kept after
//! a turn's intake read them so the next turn of the chat starts without that read.
//!
//! What is kept may be stale by any amount of time: an agent changed through another
//! replica, a chat summarized, a connector added. No turn acts on it stale: the intake's
//! one statement checks it on its own snapshot ([`crate::store::TurnBasis::check`]) and
//! writes the turn only when it is current; otherwise the intake forgets the entry, lets
//! go of what it admitted and starts over from Postgres. Only a user message or an
//! autostart starts from a kept basis: their effects before the intake's write (A4's
//! denial of waiting calls) can be done twice; an approval's answers cannot.
//!
//! Bounded by bytes (the prompts and summaries held), least recently used first out.

use std::sync::{Arc, Mutex, PoisonError};

use hashlink::LruCache;
use protocol::{ChatId, TeamId};

use crate::metrics::Metrics;
use crate::store::{Store, StoreError, TurnBasis, bounded};

/// The most a replica keeps: the bytes of the prompts and summaries, plus
/// [`ENTRY_OVERHEAD`] each.
const MAX_BYTES: usize = 64 << 20;
/// What an entry costs beyond its texts: the row's other fields and the map's slot.
const ENTRY_OVERHEAD: usize = 512;

type Key = (TeamId, ChatId);

#[derive(Clone)]
pub struct Bases {
    inner: Arc<Mutex<Kept>>,
    metrics: Metrics,
}

/// Where an intake's basis came from: `brain_turn_bases_total{source}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// This replica's: the intake's statement checks it.
    Kept,
    /// Read from Postgres just now.
    Read,
}

/// The label of an intake that found its kept basis stale (and then read it).
const STALE: &str = "stale";

struct Kept {
    entries: LruCache<Key, Arc<TurnBasis>>,
    bytes: usize,
    max_bytes: usize,
}

fn weight(basis: &TurnBasis) -> usize {
    ENTRY_OVERHEAD
        + basis.agent.system_prompt.len()
        + basis.agent.name.len()
        + basis.chat.summary.len()
        + basis.agent.autostart_prompt.as_ref().map_or(0, String::len)
}

impl Bases {
    pub fn new(metrics: Metrics) -> Self {
        Self::bounded(MAX_BYTES, metrics)
    }

    fn bounded(max_bytes: usize, metrics: Metrics) -> Self {
        for source in ["kept", "read", STALE] {
            metrics.turn_bases.with_label_values(&[source]);
        }
        Self {
            inner: Arc::new(Mutex::new(Kept {
                entries: LruCache::new_unbounded(),
                bytes: 0,
                max_bytes,
            })),
            metrics,
        }
    }

    /// The chat's basis: the kept one if `kept_ok` and there is one, else read from
    /// Postgres (and kept for the next turn). `NotFound` for an unknown chat.
    pub(super) async fn basis(
        &self,
        store: &Store,
        team: TeamId,
        chat: ChatId,
        kept_ok: bool,
    ) -> Result<(Arc<TurnBasis>, Source), StoreError> {
        if kept_ok && let Some(basis) = self.get(team, chat) {
            self.metrics.turn_bases.with_label_values(&["kept"]).inc();
            return Ok((basis, Source::Kept));
        }
        let basis = Arc::new(bounded(store.chat_with_agent(team, chat)).await?);
        self.keep(team, basis.clone());
        self.metrics.turn_bases.with_label_values(&["read"]).inc();
        Ok((basis, Source::Read))
    }

    /// The intake found the chat's kept basis stale.
    pub(super) fn stale(&self, team: TeamId, chat: ChatId) {
        self.forget(team, chat);
        self.metrics.turn_bases.with_label_values(&[STALE]).inc();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        // Consistent after any panic: each method leaves `bytes` equal to the entries' sum
        // before it can panic (no allocation happens between the two updates).
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, team: TeamId, chat: ChatId) -> Option<Arc<TurnBasis>> {
        self.lock().entries.get(&(team, chat)).cloned()
    }

    /// Keeps `basis`, replacing what was kept for its chat; the least recently used go
    /// until the whole fits. A basis larger than the bound is not kept.
    fn keep(&self, team: TeamId, basis: Arc<TurnBasis>) {
        let size = weight(&basis);
        let mut kept = self.lock();
        if size > kept.max_bytes {
            return;
        }
        if let Some(old) = kept.entries.insert((team, basis.chat.id), basis) {
            kept.bytes -= weight(&old);
        }
        kept.bytes += size;
        while kept.bytes > kept.max_bytes {
            let Some((_, out)) = kept.entries.remove_lru() else {
                break;
            };
            kept.bytes -= weight(&out);
        }
    }

    fn forget(&self, team: TeamId, chat: ChatId) {
        let mut kept = self.lock();
        if let Some(old) = kept.entries.remove(&(team, chat)) {
            kept.bytes -= weight(&old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::{AgentRow, BasisVersions, ChatRow};
    use protocol::AgentId;

    fn basis(chat: ChatId, prompt_bytes: usize) -> Arc<TurnBasis> {
        let agent = AgentRow {
            id: AgentId::new(),
            team_id: TeamId::new(),
            name: "a".into(),
            system_prompt: "x".repeat(prompt_bytes),
            model: "m".into(),
            fallback_models: Vec::new(),
            runtime_profile: "default".into(),
            autostart_cron: None,
            autostart_prompt: None,
            autostart_timezone: None,
            archived: false,
            concierge: false,
            approval_policy: Default::default(),
            disconnect_policy: Default::default(),
            busy_policy: Default::default(),
            created_at: chrono::Utc::now(),
        };
        Arc::new(TurnBasis {
            chat: ChatRow {
                id: chat,
                agent_id: agent.id,
                summary: String::new(),
                summary_through: 0,
                created_by: None,
                created_at: chrono::Utc::now(),
            },
            agent,
            has_connectors: false,
            has_pending_approvals: false,
            versions: BasisVersions { chat: 0, agent: 0 },
        })
    }

    #[test]
    fn the_least_recently_used_go_first_until_the_bytes_fit() {
        let team = TeamId::new();
        let bases = Bases::bounded(3 * (ENTRY_OVERHEAD + 1000), Metrics::new(false).unwrap());
        let (a, b, c, d) = (ChatId::new(), ChatId::new(), ChatId::new(), ChatId::new());
        for chat in [a, b, c] {
            bases.keep(team, basis(chat, 1000));
        }
        // `a` is used, so `b` is the least recently used when `d` comes in.
        assert!(bases.get(team, a).is_some());
        bases.keep(team, basis(d, 1000));
        assert!(bases.get(team, b).is_none());
        for chat in [a, c, d] {
            assert!(bases.get(team, chat).is_some());
        }
        // A replaced entry's bytes are given back: keeping `a` again evicts nothing.
        bases.keep(team, basis(a, 1000));
        for chat in [a, c, d] {
            assert!(bases.get(team, chat).is_some());
        }
        bases.forget(team, c);
        assert!(bases.get(team, c).is_none());
        assert_eq!(bases.lock().bytes, 2 * (ENTRY_OVERHEAD + 1000 + 1));
    }

    #[test]
    fn a_basis_larger_than_the_bound_is_not_kept_and_evicts_nothing() {
        let team = TeamId::new();
        let bases = Bases::bounded(2 * ENTRY_OVERHEAD + 100, Metrics::new(false).unwrap());
        let small = ChatId::new();
        bases.keep(team, basis(small, 10));
        bases.keep(team, basis(ChatId::new(), 4 * ENTRY_OVERHEAD));
        assert!(bases.get(team, small).is_some());
        assert_eq!(bases.lock().entries.len(), 1);
    }
}
