//! Upload slots: how many uploads one replica takes at once, in all and per team. Each
//! holds bytes in memory or streams them to the artifact store, so these bounds keep
//! their sum, disk and bandwidth within the replica's share, and a team from taking all
//! of it. Held in memory, per replica: a refused client retries, and may reach another
//! replica. Snapshot uploads (W10) and chat files (T27) each have their own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::IntGauge;
use protocol::TeamId;

/// The uploads one replica takes at once, of one kind.
#[derive(Clone)]
pub struct UploadSlots(Arc<SlotsInner>);

struct SlotsInner {
    replica: usize,
    per_team: usize,
    /// The uploads under way, as a metric: what an operator sees, and what a test waits on
    /// instead of guessing how long a request takes to reach its slot.
    gauge: IntGauge,
    /// Uploads under way: in all, and per team (a team with none has no entry).
    held: Mutex<(usize, HashMap<TeamId, usize>)>,
}

impl UploadSlots {
    pub fn new(replica: usize, per_team: usize, gauge: IntGauge) -> Self {
        Self(Arc::new(SlotsInner {
            replica,
            per_team,
            gauge,
            held: Mutex::new((0, HashMap::new())),
        }))
    }

    /// A slot for one upload of `team`, or none when the replica or the team is full.
    pub fn try_take(&self, team: TeamId) -> Option<UploadSlot> {
        let mut held = self.0.held.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, teams) = &mut *held;
        let of_team = teams.entry(team).or_default();
        if *total >= self.0.replica || *of_team >= self.0.per_team {
            if *of_team == 0 {
                teams.remove(&team);
            }
            return None;
        }
        *of_team += 1;
        *total += 1;
        self.0.gauge.inc();
        Some(UploadSlot {
            slots: self.clone(),
            team,
        })
    }
}

/// One upload's place, given back when dropped (the upload ended, or its request did).
pub struct UploadSlot {
    slots: UploadSlots,
    team: TeamId,
}

impl Drop for UploadSlot {
    fn drop(&mut self) {
        let mut held = self
            .slots
            .0
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (total, teams) = &mut *held;
        *total -= 1;
        self.slots.0.gauge.dec();
        if let Some(of_team) = teams.get_mut(&self.team) {
            *of_team -= 1;
            if *of_team == 0 {
                teams.remove(&self.team);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_slots_bound_the_replica_and_each_team() {
        let gauge = IntGauge::new("uploads", "uploads").expect("a valid gauge");
        let slots = UploadSlots::new(3, 2, gauge.clone());
        let (a, b, c) = (TeamId::new(), TeamId::new(), TeamId::new());
        let a1 = slots.try_take(a).expect("a's first");
        let a2 = slots.try_take(a).expect("a's second");
        assert!(slots.try_take(a).is_none(), "a team holds at most two");
        let b1 = slots.try_take(b).expect("b's first");
        assert!(
            slots.try_take(c).is_none(),
            "the replica holds at most three"
        );
        drop(a1);
        let c1 = slots.try_take(c).expect("a released slot is taken again");
        assert!(slots.try_take(b).is_none());
        assert_eq!(gauge.get(), 3, "the gauge counts what is held");
        drop((a2, b1, c1));
        let held = slots.0.held.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(held.0, 0);
        assert_eq!(gauge.get(), 0);
        assert!(
            held.1.is_empty(),
            "no team is remembered once it holds none"
        );
    }
}
