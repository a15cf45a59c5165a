//! The bases this replica's turns start from: a chat with its agent and its
//! unsummarized history, kept after a turn's intake read them, so the next turn of the
//! chat starts without reading the chat and agent, and reads only the messages written
//! since.
//!
//! What is kept may be stale by any amount of time: an agent changed through another
//! replica, a chat summarized, a connector added, a message changed or deleted. No turn
//! acts on it stale: the intake's one statement checks it on its own snapshot
//! ([`store::TurnBasis::check`]) and writes the turn only when it is current;
//! otherwise the intake forgets the entry, lets go of what it admitted and starts over
//! from Postgres. Only a user message or an autostart starts from a kept basis: their
//! effects before the intake's write (A4's denial of waiting calls) can be done twice; an
//! approval's answers cannot.
//!
//! With a basis goes the last composition its turns froze, hashed: a turn that renders
//! the same text reuses its hash (compared byte for byte, so a changed catalog or a
//! fresh summary makes a new one).
//!
//! Bounded by bytes (prompts, summaries, histories and compositions held), least
//! recently used first out.

use std::sync::{Arc, Mutex, PoisonError};

use hashlink::LruCache;
use protocol::{ChatId, TeamId};

use super::history::HistoryRow;
use crate::metrics::Metrics;
use store::{
    BasisVersions, FrozenComposition, KeptHistoryCheck, Store, StoreError, TurnBasis, bounded,
};

/// The most a replica keeps: the bytes of the prompts, summaries and histories, plus
/// [`ENTRY_OVERHEAD`] an entry and [`ROW_OVERHEAD`] a message.
const MAX_BYTES: usize = 64 << 20;
/// What an entry costs beyond its texts: the row's other fields and the map's slot.
const ENTRY_OVERHEAD: usize = 512;
/// What a kept message costs beyond its estimate's bytes (ids, role, the parts' structure).
const ROW_OVERHEAD: usize = 256;

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

/// A chat's unsummarized history as an intake's statement saw it: every complete or
/// interrupted message with `seq` in (`summary_through`, `through`], in order.
#[derive(Debug)]
pub(super) struct KeptHistory {
    pub through: i64,
    pub rows: Vec<Arc<HistoryRow>>,
}

impl KeptHistory {
    /// What the intake checks of it: that Postgres holds as many such messages (none
    /// written late with an earlier `seq`); a change or deletion of one bumps the chat's
    /// version (migration 0039).
    pub fn check(&self) -> KeptHistoryCheck {
        KeptHistoryCheck {
            through: self.through,
            count: i64::try_from(self.rows.len()).unwrap_or(i64::MAX),
        }
    }
}

/// What an intake starts from.
pub(super) struct Found {
    pub basis: Arc<TurnBasis>,
    pub source: Source,
    /// The history kept with a kept basis, if any.
    pub history: Option<Arc<KeptHistory>>,
    /// The composition last frozen from a kept basis, if any.
    pub composition: Option<Arc<FrozenComposition>>,
    /// Whether the history this intake reads is kept for the next: only a message's or
    /// an autostart's, the intakes that may start from it.
    pub keeps: bool,
}

#[derive(Clone)]
struct Entry {
    basis: Arc<TurnBasis>,
    history: Option<Arc<KeptHistory>>,
    composition: Option<Arc<FrozenComposition>>,
    weight: usize,
}

impl Entry {
    fn new(basis: Arc<TurnBasis>) -> Self {
        Self {
            basis,
            history: None,
            composition: None,
            weight: 0,
        }
    }
}

struct Kept {
    entries: LruCache<Key, Entry>,
    bytes: usize,
    max_bytes: usize,
}

fn weight(entry: &Entry) -> usize {
    let basis = &entry.basis;
    ENTRY_OVERHEAD
        + basis.agent.system_prompt.len()
        + basis.agent.name.len()
        + basis.chat.summary.len()
        + basis.agent.autostart_prompt.as_ref().map_or(0, String::len)
        + entry.history.as_ref().map_or(0, |h| {
            h.rows
                .iter()
                .map(|r| ROW_OVERHEAD + r.tokens * 4)
                .sum::<usize>()
        })
        + entry.composition.as_ref().map_or(0, |c| c.text().len())
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

    /// The chat's basis: the kept one (with its history) if `kept_ok` and there is one,
    /// else read from Postgres, and kept for the next turn only if `kept_ok`. The other
    /// intakes (an approval's answers, a queued message's start) change the chat's
    /// messages, which bumps its version: what was kept would only be found stale, so it
    /// is forgotten. `NotFound` for an unknown chat.
    pub(super) async fn basis(
        &self,
        store: &Store,
        team: TeamId,
        chat: ChatId,
        kept_ok: bool,
    ) -> Result<Found, StoreError> {
        if kept_ok && let Some(entry) = self.get(team, chat) {
            self.metrics.turn_bases.with_label_values(&["kept"]).inc();
            return Ok(Found {
                basis: entry.basis,
                source: Source::Kept,
                history: entry.history,
                composition: entry.composition,
                keeps: true,
            });
        }
        let basis = Arc::new(bounded(store.chat_with_agent(team, chat)).await?);
        if kept_ok {
            self.keep(team, chat, Entry::new(basis.clone()));
        } else {
            self.forget(team, chat);
        }
        self.metrics.turn_bases.with_label_values(&["read"]).inc();
        Ok(Found {
            basis,
            source: Source::Read,
            history: None,
            composition: None,
            keeps: kept_ok,
        })
    }

    /// Keeps `history` with the chat's kept basis, if that is still the one of
    /// `versions` (the basis the history was read with, or an older one: a pair the next
    /// intake's check finds stale at worst).
    pub(super) fn keep_history(
        &self,
        team: TeamId,
        chat: ChatId,
        versions: BasisVersions,
        history: Arc<KeptHistory>,
    ) {
        self.amend(
            team,
            chat,
            |basis| basis.versions == versions,
            |entry| {
                entry.history = Some(history);
            },
        );
    }

    /// Keeps `composition` with the chat's kept basis, if that is still `basis` (the one
    /// it was rendered from).
    pub(super) fn keep_composition(
        &self,
        team: TeamId,
        chat: ChatId,
        basis: &Arc<TurnBasis>,
        composition: Arc<FrozenComposition>,
    ) {
        self.amend(
            team,
            chat,
            |kept| Arc::ptr_eq(kept, basis),
            |entry| {
                entry.composition = Some(composition);
            },
        );
    }

    /// Changes the chat's kept entry with `change`, if it has one whose basis passes `is`.
    fn amend(
        &self,
        team: TeamId,
        chat: ChatId,
        is: impl FnOnce(&Arc<TurnBasis>) -> bool,
        change: impl FnOnce(&mut Entry),
    ) {
        let mut entry = {
            let mut kept = self.lock();
            match kept.entries.get(&(team, chat)) {
                Some(entry) if is(&entry.basis) => entry.clone(),
                _ => return,
            }
        };
        change(&mut entry);
        self.keep(team, chat, entry);
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

    fn get(&self, team: TeamId, chat: ChatId) -> Option<Entry> {
        self.lock().entries.get(&(team, chat)).cloned()
    }

    /// Keeps `entry`, replacing what was kept for the chat; the least recently used go
    /// until the whole fits. An entry larger than the bound is not kept.
    fn keep(&self, team: TeamId, chat: ChatId, mut entry: Entry) {
        entry.weight = weight(&entry);
        let size = entry.weight;
        let mut kept = self.lock();
        if let Some(old) = kept.entries.remove(&(team, chat)) {
            kept.bytes -= old.weight;
        }
        if size > kept.max_bytes {
            return;
        }
        kept.entries.insert((team, chat), entry);
        kept.bytes += size;
        while kept.bytes > kept.max_bytes {
            let Some((_, out)) = kept.entries.remove_lru() else {
                break;
            };
            kept.bytes -= out.weight;
        }
    }

    /// Drops what is kept of the chat: this replica changed its messages (a failed turn
    /// took its message back), so the next intake reads it rather than finding it stale.
    pub(super) fn forget(&self, team: TeamId, chat: ChatId) {
        let mut kept = self.lock();
        if let Some(old) = kept.entries.remove(&(team, chat)) {
            kept.bytes -= old.weight;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use protocol::AgentId;
    use store::{AgentRow, BasisVersions, ChatRow};

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
            auxiliary_models: Default::default(),
            stream_reasoning: false,
            memory_recall: Default::default(),
            knowledge_bases: Vec::new(),
            knowledge_recall: Default::default(),
            skills: Vec::new(),
            delegates: Vec::new(),
            egress: None,
            created_at: chrono::Utc::now(),
        };
        Arc::new(TurnBasis {
            chat: ChatRow {
                id: chat,
                agent_id: agent.id,
                summary: String::new(),
                summary_through: 0,
                created_by: None,
                autostart: false,
                title: None,
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
        let bases = Bases::bounded(3 * (ENTRY_OVERHEAD + 1001), Metrics::new(false).unwrap());
        let (a, b, c, d) = (ChatId::new(), ChatId::new(), ChatId::new(), ChatId::new());
        for chat in [a, b, c] {
            bases.keep(team, chat, Entry::new(basis(chat, 1000)));
        }
        // `a` is used, so `b` is the least recently used when `d` comes in.
        assert!(bases.get(team, a).is_some());
        bases.keep(team, d, Entry::new(basis(d, 1000)));
        assert!(bases.get(team, b).is_none());
        for chat in [a, c, d] {
            assert!(bases.get(team, chat).is_some());
        }
        // A replaced entry's bytes are given back: keeping `a` again evicts nothing.
        bases.keep(team, a, Entry::new(basis(a, 1000)));
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
        bases.keep(team, small, Entry::new(basis(small, 10)));
        let large = ChatId::new();
        bases.keep(team, large, Entry::new(basis(large, 4 * ENTRY_OVERHEAD)));
        assert!(bases.get(team, small).is_some());
        assert_eq!(bases.lock().entries.len(), 1);
    }

    #[test]
    fn a_history_is_kept_only_with_the_basis_it_was_read_with_and_weighs_its_rows() {
        let team = TeamId::new();
        let bases = Bases::bounded(1 << 20, Metrics::new(false).unwrap());
        let chat = ChatId::new();
        bases.keep(team, chat, Entry::new(basis(chat, 10)));
        let row = |text: &str| {
            Arc::new(HistoryRow::new(store::MessageRow {
                id: protocol::MessageId::new(),
                seq: 1,
                turn_id: protocol::TurnId::new(),
                role: "user".into(),
                parts: vec![protocol::parts::Part::Text { text: text.into() }],
                status: "complete".into(),
                client_message_id: None,
                created_at: chrono::Utc::now(),
            }))
        };
        let history = || {
            Arc::new(KeptHistory {
                through: 1,
                rows: vec![row(&"y".repeat(4000))],
            })
        };
        let newer = BasisVersions { chat: 1, agent: 0 };
        bases.keep_history(team, chat, newer, history());
        assert!(bases.get(team, chat).unwrap().history.is_none());
        let before = bases.lock().bytes;

        bases.keep_history(team, chat, BasisVersions { chat: 0, agent: 0 }, history());
        let kept = bases.get(team, chat).unwrap().history;
        assert_eq!(kept.unwrap().check().count, 1);
        assert!(bases.lock().bytes >= before + ROW_OVERHEAD + 4000);
    }

    #[test]
    fn a_composition_is_kept_only_with_the_basis_it_was_rendered_from_and_outlives_a_history() {
        let team = TeamId::new();
        let bases = Bases::bounded(1 << 20, Metrics::new(false).unwrap());
        let chat = ChatId::new();
        let first = basis(chat, 10);
        bases.keep(team, chat, Entry::new(first.clone()));
        let frozen = || {
            let text = serde_json::value::to_raw_value(&"z".repeat(3000)).unwrap();
            Arc::new(FrozenComposition::new(text))
        };
        // Rendered from a basis since replaced: not kept with the newer one.
        bases.keep_composition(team, chat, &basis(chat, 10), frozen());
        assert!(bases.get(team, chat).unwrap().composition.is_none());
        let before = bases.lock().bytes;

        bases.keep_composition(team, chat, &first, frozen());
        assert!(bases.lock().bytes >= before + 3000);
        let history = Arc::new(KeptHistory {
            through: 0,
            rows: Vec::new(),
        });
        bases.keep_history(team, chat, first.versions, history);
        let entry = bases.get(team, chat).unwrap();
        assert!(entry.history.is_some());
        assert_eq!(entry.composition.unwrap().text().len(), 3002);
    }
}
