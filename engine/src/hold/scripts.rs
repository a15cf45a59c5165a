//! The hold's Redis scripts, each in its own `.lua` file beside this one; a file's head
//! comment says its keys, arguments and answers.

pub(super) struct Scripts {
    /// Takes a free hold, or answers the holder's value.
    pub acquire: redis::Script,
    /// Pushes a hold's expiry back while it is ours.
    pub extend: redis::Script,
    /// Deletes a hold while it is ours.
    pub release: redis::Script,
    /// Deletes a hold while it names a given turn.
    pub release_turn: redis::Script,
    /// Takes a hold over for a turn taken over from a dead replica.
    pub adopt: redis::Script,
    /// The quota-aware `acquire`: busy, refused, or held and reserved.
    pub admit: redis::Script,
    /// A further model call's reservation.
    pub reserve: redis::Script,
    /// The quota-aware `release`: frees the hold and settles the turn's counters.
    pub settle: redis::Script,
    /// Sets missing budget counters from billing events.
    pub rebuild: redis::Script,
    /// The quota-aware `extend`: also keeps the turn counted as running.
    pub extend_counted: redis::Script,
    /// Counts tokens billed outside a turn's reservation.
    pub bill: redis::Script,
}

impl Scripts {
    pub fn new() -> Self {
        Self {
            acquire: redis::Script::new(include_str!("acquire.lua")),
            extend: redis::Script::new(include_str!("extend.lua")),
            release: redis::Script::new(include_str!("release.lua")),
            release_turn: redis::Script::new(include_str!("release_turn.lua")),
            adopt: redis::Script::new(include_str!("adopt.lua")),
            admit: redis::Script::new(include_str!("admit.lua")),
            reserve: redis::Script::new(include_str!("reserve.lua")),
            settle: redis::Script::new(include_str!("settle.lua")),
            rebuild: redis::Script::new(include_str!("rebuild.lua")),
            extend_counted: redis::Script::new(include_str!("extend_counted.lua")),
            bill: redis::Script::new(include_str!("bill.lua")),
        }
    }
}
