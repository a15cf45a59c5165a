//! The state transitions of `agent_runtime_sessions` (SPEC W1, W2, W6, W7, L1): which moves
//! a session may make ([`allowed`]), and the one statement of each. The brain and the
//! runtime-manager move the same rows, and both move them here, so neither writes a
//! transition the other's rules do not allow.
//!
//! **Architecture Invariant:** every transition is a compare-and-set on the row's current
//! state, guarded by the states its [`Move`] leaves from (and, where one process holds
//! the row, by its holder or its worker), and sets `updated_at`. A row found in any other
//! state changes nothing, and the caller learns it: [`Transition::Refused`], or no row in
//! the answer.
//!
//! What is not a transition stays with the process that writes it: the inserts a session
//! is born by (`pending` by the brain's `create_session`, `ready` by a warm-pool claim in
//! one statement with its slot), and the writes that keep the state (the channel's owner,
//! uses, the dial clock, idle checks, snapshot progress, a failure's late detail).
//!
//! Idle time counts from `ready` (W7): only the move into `ready` writes a `ready` row's
//! `updated_at`, so [`IDLE_SINCE`] is when it was last used or became ready.

use std::time::Duration;

use protocol::channel::{FailureReason, SessionState};
use protocol::snapshot::SNAPSHOT_PG_CHANNEL;
use protocol::{AgentId, ChatId, ReplicaId, SessionId, TeamId};
use sqlx::PgExecutor;
use uuid::Uuid;

use SessionState::{Connecting, Failed, Pending, Provisioning, Ready, Terminated, Terminating};

/// Whether a session may move from `from` to `to`. `terminated` and `failed` are final;
/// a session fails only while live, and any session not yet over may be terminated (its
/// team disabled, its worker stopped on purpose).
pub const fn allowed(from: SessionState, to: SessionState) -> bool {
    match (from, to) {
        // A provision whose claimer died is claimed again (O3).
        (Pending | Provisioning, Provisioning)
        | (Provisioning, Connecting)
        | (Connecting, Ready)
        | (Ready, Terminating) => true,
        (Pending | Provisioning | Connecting | Ready, Failed) => true,
        (Pending | Provisioning | Connecting | Ready | Terminating, Terminated) => true,
        _ => false,
    }
}

/// One transition's states: those it leaves from, and the one it writes.
#[derive(Clone, Copy, Debug)]
pub struct Move {
    pub from: &'static [SessionState],
    pub to: SessionState,
}

impl Move {
    /// `state IN (...)` of the states moved from: constants, never input.
    fn guard(self) -> String {
        let states: Vec<String> = self
            .from
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        format!("state IN ({})", states.join(", "))
    }

    fn set(self) -> String {
        format!("state = '{}'", self.to.as_str())
    }
}

pub const CLAIM_PROVISION: Move = Move {
    from: &[Pending, Provisioning],
    to: Provisioning,
};
pub const CONNECTING: Move = Move {
    from: &[Provisioning],
    to: Connecting,
};
pub const FAIL_PROVISION: Move = Move {
    from: &[Provisioning],
    to: Failed,
};
pub const READY: Move = Move {
    from: &[Connecting],
    to: Ready,
};
pub const FAIL_CONNECTING: Move = Move {
    from: &[Connecting],
    to: Failed,
};
pub const FAIL_WORKER: Move = Move {
    from: &[Connecting, Ready],
    to: Failed,
};
pub const FAIL_LIVE: Move = Move {
    from: &[Pending, Provisioning, Connecting, Ready],
    to: Failed,
};
pub const BEGIN_TERMINATING: Move = Move {
    from: &[Ready],
    to: Terminating,
};
pub const FINISH_TERMINATING: Move = Move {
    from: &[Terminating],
    to: Terminated,
};
pub const TERMINATE_WORKER: Move = Move {
    from: &[Connecting, Ready, Terminating],
    to: Terminated,
};
pub const END_SESSION: Move = Move {
    from: &[Pending, Provisioning, Connecting, Ready, Terminating],
    to: Terminated,
};

/// Every transition this crate writes.
pub const MOVES: [Move; 11] = [
    CLAIM_PROVISION,
    CONNECTING,
    FAIL_PROVISION,
    READY,
    FAIL_CONNECTING,
    FAIL_WORKER,
    FAIL_LIVE,
    BEGIN_TERMINATING,
    FINISH_TERMINATING,
    TERMINATE_WORKER,
    END_SESSION,
];

/// What a transition of one row found.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Moved,
    /// The row was in no state its move leaves from, not the caller's, or gone: nothing
    /// changed.
    Refused,
}

impl Transition {
    pub fn moved(self) -> bool {
        self == Self::Moved
    }

    fn of(done: sqlx::postgres::PgQueryResult) -> Self {
        if done.rows_affected() == 1 {
            Self::Moved
        } else {
            Self::Refused
        }
    }
}

/// Since when a `ready` row is idle (see the crate's documentation).
pub const IDLE_SINCE: &str = "GREATEST(last_used_at, updated_at)";

/// `expr`, a timestamp, as unix milliseconds.
pub fn ms(expr: &str) -> String {
    format!("floor(extract(epoch from {expr}) * 1000)::bigint")
}

/// What a claimed provision needs to launch.
#[derive(Clone, Debug)]
pub struct Claimed {
    pub team: TeamId,
    pub agent: AgentId,
    pub chat: ChatId,
    pub profile: String,
}

/// What claiming a provision found.
#[derive(Clone, Debug)]
pub enum ProvisionClaim {
    /// This replica holds it now.
    Claimed(Claimed),
    /// A live replica (its lease current) claimed it and is launching.
    Held,
    /// Launched already, or over.
    Done,
}

/// `pending` → `provisioning`, claimed by `replica`; or a `provisioning` row with no
/// worker yet taken over (a provision retried after a crash between claim and launch)
/// when it is `replica`'s own claim, or its claimer's lease has lapsed (O3). A live
/// claimer's row is [`ProvisionClaim::Held`].
pub async fn claim_provision<'e>(
    db: impl PgExecutor<'e> + Copy,
    id: SessionId,
    replica: ReplicaId,
) -> Result<ProvisionClaim, sqlx::Error> {
    let row: Option<(Uuid, Uuid, Uuid, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE agent_runtime_sessions s
         SET {}, manager_replica = $2, updated_at = now()
         WHERE id = $1 AND worker_ref IS NULL AND {}
           AND (state = 'pending'
                OR (manager_replica IS NULL OR manager_replica = $2
                    OR NOT EXISTS (SELECT 1 FROM replicas r
                                   WHERE r.id = s.manager_replica
                                     AND r.lease_until > now())))
         RETURNING team_id, agent_id, chat_id, profile",
        CLAIM_PROVISION.set(),
        CLAIM_PROVISION.guard()
    )))
    .bind(id.0)
    .bind(replica.0)
    .fetch_optional(db)
    .await?;
    if let Some((team, agent, chat, profile)) = row {
        return Ok(ProvisionClaim::Claimed(Claimed {
            team: TeamId(team),
            agent: AgentId(agent),
            chat: ChatId(chat),
            profile,
        }));
    }
    let (held,): (bool,) = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM agent_runtime_sessions
                        WHERE id = $1 AND state = 'provisioning' AND worker_ref IS NULL)",
    )
    .bind(id.0)
    .fetch_one(db)
    .await?;
    Ok(if held {
        ProvisionClaim::Held
    } else {
        ProvisionClaim::Done
    })
}

/// `provisioning` (claimed by `replica`, no worker yet) → `connecting` with its worker;
/// refused when the row moved on meanwhile, or another replica took the provision over.
pub async fn connecting<'e>(
    db: impl PgExecutor<'e>,
    id: SessionId,
    replica: ReplicaId,
    worker_ref: &str,
) -> Result<Transition, sqlx::Error> {
    let done = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE agent_runtime_sessions SET {}, worker_ref = $3, updated_at = now()
         WHERE id = $1 AND manager_replica = $2 AND {} AND worker_ref IS NULL",
        CONNECTING.set(),
        CONNECTING.guard()
    )))
    .bind(id.0)
    .bind(replica.0)
    .bind(worker_ref)
    .execute(db)
    .await?;
    Ok(Transition::of(done))
}

/// `provisioning` (claimed by `replica`, no worker) → `failed`.
pub async fn fail_provision<'e>(
    db: impl PgExecutor<'e>,
    id: SessionId,
    replica: ReplicaId,
    reason: FailureReason,
    detail: &str,
) -> Result<Transition, sqlx::Error> {
    let done = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE agent_runtime_sessions
         SET {}, failure_reason = $3, failure_detail = $4, updated_at = now()
         WHERE id = $1 AND manager_replica = $2 AND {} AND worker_ref IS NULL",
        FAIL_PROVISION.set(),
        FAIL_PROVISION.guard()
    )))
    .bind(id.0)
    .bind(replica.0)
    .bind(reason.as_str())
    .bind(detail)
    .execute(db)
    .await?;
    Ok(Transition::of(done))
}

/// The handshake of a session's first worker is done: `connecting` → `ready`, its
/// channel held by `replica`.
pub async fn ready<'e>(
    db: impl PgExecutor<'e>,
    id: SessionId,
    replica: ReplicaId,
) -> Result<Transition, sqlx::Error> {
    let done = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE agent_runtime_sessions SET {}, owner_replica = $2, updated_at = now()
         WHERE id = $1 AND {}",
        READY.set(),
        READY.guard()
    )))
    .bind(id.0)
    .bind(replica.0)
    .execute(db)
    .await?;
    Ok(Transition::of(done))
}

/// `m`'s states → `failed` with a reason (W6), for [`FAIL_LIVE`] or [`FAIL_CONNECTING`].
async fn fail_from<'e>(
    db: impl PgExecutor<'e>,
    m: Move,
    id: SessionId,
    reason: FailureReason,
    detail: Option<&str>,
) -> Result<Transition, sqlx::Error> {
    let done = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE agent_runtime_sessions
         SET {}, failure_reason = $2, failure_detail = $3, updated_at = now()
         WHERE id = $1 AND {}",
        m.set(),
        m.guard()
    )))
    .bind(id.0)
    .bind(reason.as_str())
    .bind(detail)
    .execute(db)
    .await?;
    Ok(Transition::of(done))
}

/// Any live state → `failed` (W6); refused when the session had already ended.
pub async fn fail_live<'e>(
    db: impl PgExecutor<'e>,
    id: SessionId,
    reason: FailureReason,
    detail: Option<&str>,
) -> Result<Transition, sqlx::Error> {
    fail_from(db, FAIL_LIVE, id, reason, detail).await
}

/// `connecting` → `failed`: only while the session waits for its worker; refused in any
/// other state, a `ready` one included.
pub async fn fail_connecting<'e>(
    db: impl PgExecutor<'e>,
    id: SessionId,
    reason: FailureReason,
) -> Result<Transition, sqlx::Error> {
    fail_from(db, FAIL_CONNECTING, id, reason, None).await
}

/// `connecting` for longer than `timeout` → `failed` (`dial_timeout`): the sessions moved,
/// with their workers. The brain touches `updated_at` of a `connecting` row when the
/// worker's socket is accepted, so only sessions nobody dialed time out here.
pub async fn fail_dial_timeouts<'e>(
    db: impl PgExecutor<'e>,
    timeout: Duration,
) -> Result<Vec<(SessionId, Option<String>)>, sqlx::Error> {
    let rows: Vec<(Uuid, Option<String>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE agent_runtime_sessions
         SET {}, failure_reason = $1, failure_detail = NULL, updated_at = now()
         WHERE {} AND updated_at <= now() - make_interval(secs => $2)
         RETURNING id, worker_ref",
        FAIL_CONNECTING.set(),
        FAIL_CONNECTING.guard()
    )))
    .bind(FailureReason::DialTimeout.as_str())
    .bind(timeout.as_secs_f64())
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, worker_ref)| (SessionId(id), worker_ref))
        .collect())
}

/// `connecting`/`ready` with `worker_ref` → `failed`, for a worker that is gone.
pub async fn fail_worker<'e>(
    db: impl PgExecutor<'e>,
    id: SessionId,
    worker_ref: &str,
    reason: FailureReason,
    detail: &str,
) -> Result<Transition, sqlx::Error> {
    let done = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE agent_runtime_sessions
         SET {}, failure_reason = $3, failure_detail = $4, updated_at = now()
         WHERE id = $1 AND worker_ref = $2 AND {}",
        FAIL_WORKER.set(),
        FAIL_WORKER.guard()
    )))
    .bind(id.0)
    .bind(worker_ref)
    .bind(reason.as_str())
    .bind(detail)
    .execute(db)
    .await?;
    Ok(Transition::of(done))
}

/// What an idle teardown asks of the worker before it is stopped (W10).
#[derive(Clone, Copy, Debug)]
pub struct SnapshotAsk {
    pub max_bytes: u64,
    /// How long the teardown waits for the upload.
    pub timeout: Duration,
}

/// The outcome of [`begin_terminating`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Teardown {
    /// Used since, or no longer `ready`: nothing changed.
    NotIdle,
    /// `terminating`, no snapshot asked (off for the profile, or no replica holds the
    /// worker's channel).
    Begun,
    /// `terminating`, and the worker's snapshot is asked for.
    SnapshotRequested,
}

/// `ready` → `terminating`, only if idle since `idle_since_ms` (unused since). A
/// session still starting is never torn down for idleness: its dial and start
/// deadlines govern it. With `snapshot`, and while a brain replica holds the worker's
/// channel (nobody else could ask the worker), the workspace snapshot is requested in
/// the same statement (W10): `snapshot_state = requested`, due by `now() + timeout`,
/// and a `NOTIFY` on [`SNAPSHOT_PG_CHANNEL`], sent when the statement commits.
pub async fn begin_terminating<'e>(
    db: impl PgExecutor<'e>,
    id: SessionId,
    idle_since_ms: i64,
    snapshot: Option<SnapshotAsk>,
) -> Result<Teardown, sqlx::Error> {
    let row: Option<(Option<String>, Option<String>)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "WITH t AS (
               UPDATE agent_runtime_sessions SET {}, updated_at = now(),
                 snapshot_state = CASE WHEN $3 AND owner_replica IS NOT NULL
                                       THEN 'requested' END,
                 snapshot_max_bytes = CASE WHEN $3 AND owner_replica IS NOT NULL THEN $4 END,
                 snapshot_deadline = CASE WHEN $3 AND owner_replica IS NOT NULL
                                          THEN now() + make_interval(secs => $5) END
               WHERE id = $1 AND {} AND {} <= $2
               RETURNING id, snapshot_state)
             SELECT snapshot_state,
                    (CASE WHEN snapshot_state = 'requested' THEN pg_notify($6,
                        json_build_object('session', id, 'max_bytes', $4)::text) END)::text
             FROM t",
            BEGIN_TERMINATING.set(),
            BEGIN_TERMINATING.guard(),
            ms(IDLE_SINCE)
        )))
        .bind(id.0)
        .bind(idle_since_ms)
        .bind(snapshot.is_some())
        .bind(snapshot.map_or(0, |s| i64::try_from(s.max_bytes).unwrap_or(i64::MAX)))
        .bind(snapshot.map_or(0.0, |s| s.timeout.as_secs_f64()))
        .bind(SNAPSHOT_PG_CHANNEL)
        .fetch_optional(db)
        .await?;
    Ok(match row {
        None => Teardown::NotIdle,
        Some((Some(_), _)) => Teardown::SnapshotRequested,
        Some((None, _)) => Teardown::Begun,
    })
}

/// `terminating` → `terminated`.
pub async fn finish_terminating<'e>(
    db: impl PgExecutor<'e>,
    id: SessionId,
) -> Result<Transition, sqlx::Error> {
    let done = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE agent_runtime_sessions SET {}, updated_at = now() WHERE id = $1 AND {}",
        FINISH_TERMINATING.set(),
        FINISH_TERMINATING.guard()
    )))
    .bind(id.0)
    .execute(db)
    .await?;
    Ok(Transition::of(done))
}

/// Any state with `worker_ref` running → `terminated`, for a worker stopped on purpose
/// (shutdown of a launcher whose workers die with the manager).
pub async fn terminate_worker<'e>(
    db: impl PgExecutor<'e>,
    id: SessionId,
    worker_ref: &str,
) -> Result<Transition, sqlx::Error> {
    let done = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE agent_runtime_sessions SET {}, updated_at = now()
         WHERE id = $1 AND worker_ref = $2 AND {}",
        TERMINATE_WORKER.set(),
        TERMINATE_WORKER.guard()
    )))
    .bind(id.0)
    .bind(worker_ref)
    .execute(db)
    .await?;
    Ok(Transition::of(done))
}

/// Every session of `team` not over yet → `terminated` (a disabled team's workers are
/// released at once, L1; the runtime-manager's reaper stops them on its next pass): the
/// sessions moved.
pub async fn end_team_sessions<'e>(
    db: impl PgExecutor<'e>,
    team: TeamId,
) -> Result<Vec<SessionId>, sqlx::Error> {
    let ids: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "UPDATE agent_runtime_sessions SET {}, updated_at = now()
         WHERE team_id = $1 AND {} RETURNING id",
        END_SESSION.set(),
        END_SESSION.guard()
    )))
    .bind(team.0)
    .fetch_all(db)
    .await?;
    Ok(ids.into_iter().map(SessionId).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [SessionState; 7] = [
        Pending,
        Provisioning,
        Connecting,
        Ready,
        Terminating,
        Terminated,
        Failed,
    ];

    #[test]
    fn every_statement_moves_only_as_allowed() {
        for m in MOVES {
            assert!(!m.from.is_empty(), "{m:?}");
            for &from in m.from {
                assert!(allowed(from, m.to), "{m:?}: {from:?}");
            }
        }
    }

    #[test]
    fn final_states_go_nowhere() {
        for to in ALL {
            assert!(!allowed(Terminated, to), "terminated -> {to:?}");
            assert!(!allowed(Failed, to), "failed -> {to:?}");
        }
    }

    #[test]
    fn a_guard_lists_the_states_moved_from() {
        assert_eq!(FAIL_WORKER.guard(), "state IN ('connecting', 'ready')");
        assert_eq!(FAIL_WORKER.set(), "state = 'failed'");
    }
}
