//! Every key the hold and the quota counters use: only this file spells them.

use protocol::{AgentId, TeamId};

use crate::quota::Periods;

pub(super) fn hold_key(team: TeamId, agent: AgentId) -> String {
    format!("hold:{{{team}}}:agent:{agent}")
}

/// The counter keys of one level: the team's (`quota:{<team>}:…`, the braces literal: the
/// hash tag) or one of its end users' (`quota:{<team>}:user:<bytes>:<user>:…`; the user id's length keeps one user's keys from
/// reading as another's, whatever its characters). The budget counters are those of the
/// UTC day and month of `periods`.
pub(super) struct LevelKeys {
    /// The team's limits, or the user's overrides.
    pub limits: String,
    pub running: String,
    pub reserved: String,
    pub reserved_total: String,
    pub starts: String,
    pub day: String,
    pub month: String,
    /// The cutoff each counter was rebuilt at (`rebuild.lua`).
    pub day_since: String,
    pub month_since: String,
    /// The ledger of settled turns: when each was billed, and its tokens.
    pub settled: String,
    pub settled_tokens: String,
}

impl LevelKeys {
    pub fn team(team: TeamId, periods: &Periods) -> Self {
        Self::new(format!("quota:{{{team}}}:"), periods)
    }

    pub fn user(team: TeamId, user: &str, periods: &Periods) -> Self {
        Self::new(
            format!("quota:{{{team}}}:user:{}:{user}:", user.len()),
            periods,
        )
    }

    pub fn of(team: TeamId, user: Option<&str>, periods: &Periods) -> Self {
        match user {
            Some(user) => Self::user(team, user, periods),
            None => Self::team(team, periods),
        }
    }

    fn new(prefix: String, periods: &Periods) -> Self {
        let key = |name: &str| format!("{prefix}{name}");
        let day = key(&format!("tokens:day:{}", periods.day_tag()));
        let month = key(&format!("tokens:month:{}", periods.month_tag()));
        Self {
            limits: key("limits"),
            running: key("running"),
            reserved: key("reserved"),
            reserved_total: key("reserved_total"),
            starts: key("starts"),
            day_since: format!("{day}:since"),
            month_since: format!("{month}:since"),
            day,
            month,
            settled: key("settled"),
            settled_tokens: key("settled_tokens"),
        }
    }
}
