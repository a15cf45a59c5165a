//! Every SQL statement of the runtime-manager. The `agent_runtime_sessions` transitions it
//! makes (SPEC W2, W6, W7, O3) are the `session_states` crate's, shared with the brain,
//! which moves the same rows: each is a compare-and-set on the row's current state, so
//! one that finds the row elsewhere changes nothing and says so.
//!
//! Times cross the process boundary as unix milliseconds of the database clock, so the
//! idle check compares `last_used_at` (set by the brain with `now()`) with values from the
//! same clock.
//!
//! Idle time counts from `ready` (W7): a session is idle since its last use or since it
//! became ready, whichever is later. Nothing writes a `ready` row's `updated_at` but the
//! transition into `ready` (the brain's touches set `last_used_at` only, and
//! `idle_check_at` is not a transition), so `GREATEST(last_used_at, updated_at)` is that
//! time. A write that moved `updated_at` of a `ready` row later would only postpone the
//! teardown, never hasten it.

use std::time::Duration;

use protocol::channel::{FailureReason, SessionState};
use protocol::{AgentId, ChatId, ReplicaId, SessionId};
pub use session_states::{Claimed, ProvisionClaim, SnapshotAsk, Teardown};
use session_states::{IDLE_SINCE, ms};
use uuid::Uuid;

/// A session row as the manager sees it.
#[derive(Clone, Debug)]
pub struct SessionRow {
    pub state: Option<SessionState>,
    pub profile: String,
    pub worker_ref: Option<String>,
    /// For a `ready` row, when it was last used or became ready, whichever is later; unix
    /// ms.
    pub idle_since_ms: i64,
    /// When a session started speculatively and left unused by its turn is torn down
    /// (W11), unix ms; `None` for any other session.
    pub speculation_due_ms: Option<i64>,
    /// The database's `now()`, unix ms.
    pub now_ms: i64,
}

/// A `ready` session whose idle timer is not armed, or whose check is overdue.
#[derive(Clone, Debug)]
pub struct Unarmed {
    pub session: SessionId,
    pub profile: String,
    /// As [`SessionRow::idle_since_ms`].
    pub idle_since_ms: i64,
    /// As [`SessionRow::speculation_due_ms`].
    pub speculation_due_ms: Option<i64>,
    pub now_ms: i64,
    /// For a cold session never armed before (it just became ready): from its worker's
    /// launch (`billing_from`, set with `worker_ref`) to `ready`. `None` once armed, and
    /// for a session that claimed a warm-pool worker (no `manager_replica`: no manager
    /// provisioned it; it was ready at once).
    pub launch_to_ready_ms: Option<i64>,
}

/// A row whose worker the reaper or the start-up reconciliation looks at.
#[derive(Clone, Debug)]
pub struct WorkerRow {
    pub session: SessionId,
    pub state: Option<SessionState>,
    pub worker_ref: Option<String>,
    /// `terminating` for longer than the reaper's patience (and not waiting for its
    /// snapshot within its deadline).
    pub stale: bool,
}

#[derive(Clone)]
pub struct Store {
    pool: dbpool::Db,
}

/// When a speculative session its turn left unused is due for teardown (W11): the end of
/// its grace, or when it became ready if that came later; NULL for any other session (one
/// whose turn still runs included: GREATEST would skip the NULL).
const SPECULATION_DUE: &str = "CASE WHEN speculative AND speculation_expires_at IS NOT NULL \
     THEN GREATEST(speculation_expires_at, updated_at) END";

impl Store {
    /// A pool over `url`, a transaction pooler's connections when `behind_pooler` (O5:
    /// `dbpool` says what changes then; the manager holds no session state, so it needs
    /// no direct connection).
    pub async fn connect(url: &str, behind_pooler: bool) -> Result<Self, sqlx::Error> {
        let options = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5));
        let pool = if behind_pooler {
            let connect: sqlx::postgres::PgConnectOptions = url.parse()?;
            let pool = options
                .connect_with(dbpool::for_pooler(connect).extra_float_digits(None))
                .await?;
            dbpool::Db::behind_pooler(pool, None)
        } else {
            dbpool::Db::direct(options.connect(url).await?)
        };
        Ok(Self { pool })
    }

    /// The pool, for the statements the manager shares with the brain through the `store`
    /// crate (the egress proxy's, `egress.rs`).
    pub fn db(&self) -> &dbpool::Db {
        &self.pool
    }

    /// Records (or renews) this process's lease in `replicas` (O3): it holds until
    /// `lease` from now. An upsert, so a row a reconciler removed comes back.
    pub async fn renew_lease(
        &self,
        replica: ReplicaId,
        lease: Duration,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO replicas (id, kind, lease_until)
             VALUES ($1, 'runtime-manager', now() + make_interval(secs => $2))
             ON CONFLICT (id) DO UPDATE SET lease_until = EXCLUDED.lease_until",
        )
        .bind(replica.0)
        .bind(lease.as_secs_f64())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Removes this process's lease (clean shutdown).
    pub async fn release_lease(&self, replica: ReplicaId) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM replicas WHERE id = $1")
            .bind(replica.0)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Fails when the schema is missing (`brain migrate` has not run).
    pub async fn live_sessions(&self) -> Result<i64, sqlx::Error> {
        let (count,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM agent_runtime_sessions WHERE state NOT IN ('terminated', 'failed')",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(count)
    }

    /// Live sessions (not `terminated` or `failed`) per state, for the metrics. The
    /// predicate is the one of the `sessions_live` partial index, so the count reads that
    /// index rather than every session that ever was.
    pub async fn live_sessions_by_state(&self) -> Result<Vec<(String, i64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT state, count(*) FROM agent_runtime_sessions
             WHERE state NOT IN ('terminated', 'failed') GROUP BY state",
        )
        .fetch_all(&self.pool)
        .await
    }

    /// `pending` → `provisioning`, claimed by `replica` (or taken over: O3).
    pub async fn claim_for_provision(
        &self,
        id: SessionId,
        replica: ReplicaId,
    ) -> Result<ProvisionClaim, sqlx::Error> {
        session_states::claim_provision(&self.pool, id, replica).await
    }

    /// `provisioning` (claimed by `replica`) → `connecting` with its worker; `false` when
    /// the row moved on meanwhile, or another replica took the provision over.
    pub async fn mark_connecting(
        &self,
        id: SessionId,
        replica: ReplicaId,
        worker_ref: &str,
    ) -> Result<bool, sqlx::Error> {
        Ok(
            session_states::connecting(&self.pool, id, replica, worker_ref)
                .await?
                .moved(),
        )
    }

    /// `provisioning` (claimed by `replica`, no worker) → `failed`.
    pub async fn fail_provision(
        &self,
        id: SessionId,
        replica: ReplicaId,
        reason: FailureReason,
        detail: &str,
    ) -> Result<bool, sqlx::Error> {
        Ok(
            session_states::fail_provision(&self.pool, id, replica, reason, detail)
                .await?
                .moved(),
        )
    }

    pub async fn session(&self, id: SessionId) -> Result<Option<SessionRow>, sqlx::Error> {
        type Row = (String, String, Option<String>, i64, Option<i64>, i64);
        let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT state, profile, worker_ref, {}, {}, {} FROM agent_runtime_sessions WHERE id = $1",
            ms(IDLE_SINCE),
            ms(SPECULATION_DUE),
            ms("now()")
        )))
        .bind(id.0)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(
            |(state, profile, worker_ref, idle_since_ms, speculation_due_ms, now_ms)| SessionRow {
                state: SessionState::parse(&state),
                profile,
                worker_ref,
                idle_since_ms,
                speculation_due_ms,
                now_ms,
            },
        ))
    }

    /// `ready` → `terminating` if unused since `idle_since_ms`, its snapshot asked for
    /// with `snapshot` (W10).
    pub async fn begin_terminating(
        &self,
        id: SessionId,
        idle_since_ms: i64,
        snapshot: Option<SnapshotAsk>,
    ) -> Result<Teardown, sqlx::Error> {
        session_states::begin_terminating(&self.pool, id, idle_since_ms, snapshot).await
    }

    /// Whether (agent, chat) has a workspace snapshot to restore (W10).
    pub async fn chat_has_snapshot(
        &self,
        agent: AgentId,
        chat: ChatId,
    ) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM workspace_snapshots WHERE agent_id = $1 AND chat_id = $2)",
        )
        .bind(agent.0)
        .bind(chat.0)
        .fetch_one(&self.pool)
        .await
    }

    /// Whether the teardown of `id` still waits for its snapshot: `requested`, and its
    /// deadline not passed.
    pub async fn awaits_snapshot(&self, id: SessionId) -> Result<bool, sqlx::Error> {
        let waiting: Option<bool> = sqlx::query_scalar(
            "SELECT COALESCE(snapshot_state = 'requested' AND snapshot_deadline > now(), false)
             FROM agent_runtime_sessions WHERE id = $1",
        )
        .bind(id.0)
        .fetch_optional(&self.pool)
        .await?;
        Ok(waiting.unwrap_or(false))
    }

    /// `requested` → `timed_out`: the teardown goes on without the snapshot.
    pub async fn snapshot_timed_out(&self, id: SessionId) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE agent_runtime_sessions SET snapshot_state = 'timed_out'
             WHERE id = $1 AND snapshot_state = 'requested'",
        )
        .bind(id.0)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// `ready` sessions with no idle check armed, or whose check was due more than
    /// `grace` ago (lost: it would have fired by then).
    pub async fn unarmed_idle_checks(&self, grace: Duration) -> Result<Vec<Unarmed>, sqlx::Error> {
        type Row = (Uuid, String, i64, Option<i64>, i64, Option<i64>);
        let rows: Vec<Row> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT id, profile, {}, {}, {},
                        CASE WHEN idle_check_at IS NULL AND billing_from IS NOT NULL
                                  AND manager_replica IS NOT NULL
                             THEN {} END
                 FROM agent_runtime_sessions
                 WHERE state = 'ready'
                   AND (idle_check_at IS NULL OR idle_check_at < now() - make_interval(secs => $1))",
                ms(IDLE_SINCE),
                ms(SPECULATION_DUE),
                ms("now()"),
                ms("(updated_at - billing_from)"),
            )))
            .bind(grace.as_secs_f64())
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, profile, idle_since_ms, speculation_due_ms, now_ms, launch_to_ready_ms)| {
                    Unarmed {
                        session: SessionId(id),
                        profile,
                        idle_since_ms,
                        speculation_due_ms,
                        now_ms,
                        launch_to_ready_ms,
                    }
                },
            )
            .collect())
    }

    /// Records the idle check of a `ready` session as due at `due_ms` (or now, if that
    /// has passed), before it is pushed; `false` when another one is pending (one due
    /// later than `stale_after` ago) or the session is no longer `ready`. Writing first
    /// makes arming recoverable: a push that fails leaves a due time that passes, and the
    /// reaper arms the session again once it is overdue by its grace.
    pub async fn claim_idle_check(
        &self,
        id: SessionId,
        due_ms: i64,
        stale_after: Duration,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE agent_runtime_sessions
             SET idle_check_at = GREATEST(to_timestamp($2::double precision / 1000), now())
             WHERE id = $1 AND state = 'ready'
               AND (idle_check_at IS NULL
                    OR idle_check_at <= now() - make_interval(secs => $3))",
        )
        .bind(id.0)
        .bind(due_ms)
        .bind(stale_after.as_secs_f64())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// `terminating` → `terminated`.
    pub async fn finish_terminating(&self, id: SessionId) -> Result<bool, sqlx::Error> {
        Ok(session_states::finish_terminating(&self.pool, id)
            .await?
            .moved())
    }

    /// `connecting` for longer than `timeout` → `failed` (`dial_timeout`): those sessions,
    /// with their workers.
    pub async fn fail_dial_timeouts(
        &self,
        timeout: Duration,
    ) -> Result<Vec<(SessionId, Option<String>)>, sqlx::Error> {
        session_states::fail_dial_timeouts(&self.pool, timeout).await
    }

    /// The rows of `ids` (sessions whose workers run here).
    pub async fn rows(
        &self,
        ids: &[SessionId],
        stale_after: Duration,
    ) -> Result<Vec<WorkerRow>, sqlx::Error> {
        let ids: Vec<Uuid> = ids.iter().map(|id| id.0).collect();
        let rows: Vec<(Uuid, String, Option<String>, bool)> = sqlx::query_as(
            "SELECT id, state, worker_ref,
                    state = 'terminating' AND updated_at <= now() - make_interval(secs => $2)
                      AND (snapshot_state IS DISTINCT FROM 'requested'
                           OR snapshot_deadline <= now())
             FROM agent_runtime_sessions WHERE id = ANY($1)",
        )
        .bind(&ids)
        .bind(stale_after.as_secs_f64())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(worker_row).collect())
    }

    /// Sessions with a worker that may be running: what O3 reconciles at start.
    pub async fn launched(&self) -> Result<Vec<WorkerRow>, sqlx::Error> {
        let rows: Vec<(Uuid, String, Option<String>, bool)> = sqlx::query_as(
            "SELECT id, state, worker_ref, false FROM agent_runtime_sessions
             WHERE state IN ('connecting', 'ready', 'terminating') AND worker_ref IS NOT NULL",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(worker_row).collect())
    }

    /// `connecting`/`ready` with `worker_ref` → `failed`, for a worker that is gone.
    pub async fn fail_worker(
        &self,
        id: SessionId,
        worker_ref: &str,
        reason: FailureReason,
        detail: &str,
    ) -> Result<bool, sqlx::Error> {
        Ok(
            session_states::fail_worker(&self.pool, id, worker_ref, reason, detail)
                .await?
                .moved(),
        )
    }

    /// A session that failed with `worker_ref` and no detail yet gets `detail` (a launcher
    /// learned why after the brain recorded the failure).
    pub async fn add_failure_detail(
        &self,
        id: SessionId,
        worker_ref: &str,
        detail: &str,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE agent_runtime_sessions SET failure_detail = $3, updated_at = now()
             WHERE id = $1 AND worker_ref = $2 AND state = 'failed' AND failure_detail IS NULL",
        )
        .bind(id.0)
        .bind(worker_ref)
        .bind(detail)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Any live state with `worker_ref` → `terminated`, for a worker stopped on purpose
    /// (shutdown of a launcher whose workers die with the manager).
    pub async fn terminate_worker(
        &self,
        id: SessionId,
        worker_ref: &str,
    ) -> Result<bool, sqlx::Error> {
        Ok(session_states::terminate_worker(&self.pool, id, worker_ref)
            .await?
            .moved())
    }
}

/// What one billing sweep wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Billed {
    /// Sessions billed: each one due an event (a full interval, or its end).
    pub sessions: i64,
    /// `worker_seconds` events inserted.
    pub events: i64,
    /// Sessions whose billing is complete now (their final event written).
    pub closed: i64,
}

impl Store {
    /// E1: bills worker-seconds up to now for at most `batch` sessions, in one statement
    /// (so one implicit transaction): for each session due an event (it ended, or a full
    /// interval has passed since its events end), one event per full `interval` since `billed_until` (or `billing_from`),
    /// ending at or before its end (`ended_at`, or now while it lives), then, once it has
    /// ended, the `final` event for the rest, and `billed_until` moved to where the events
    /// reach. Each event's `created_at` is the end of the interval it bills and `seconds`
    /// its length, so a session's events tile its lifetime: they sum to `ended_at -
    /// billing_from`. Rows another sweep holds are skipped (`SKIP LOCKED`) and billed
    /// by the next pass; a key already written (`worker:<session>:<ms since
    /// billing_from>` or `worker:<session>:final`) is not written again. Each event carries
    /// the session's end user (L4: the one whose turn started it), whose worker-seconds
    /// it counts.
    pub async fn bill_worker_seconds(
        &self,
        interval: Duration,
        batch: i64,
    ) -> Result<Billed, sqlx::Error> {
        let (sessions, events, closed): (i64, i64, i64) = sqlx::query_as(
            "WITH due AS (
               SELECT id, team_id, agent_id, user_id, billing_from, ended_at,
                      COALESCE(billed_until, billing_from) AS start
               FROM agent_runtime_sessions
               WHERE billing_from IS NOT NULL
                 AND (ended_at IS NULL OR billed_until IS NULL OR billed_until < ended_at)
                 AND (ended_at IS NOT NULL
                      OR COALESCE(billed_until, billing_from)
                         <= now() - make_interval(secs => $1::float8 / 1000))
               ORDER BY billing_from
               LIMIT $2
               FOR UPDATE SKIP LOCKED),
             n AS (
               SELECT due.*, make_interval(secs => $1::float8 / 1000) AS step,
                      GREATEST(floor(extract(epoch FROM COALESCE(ended_at, now()) - start)
                                     * 1000 / $1), 0)::int8 AS full
               FROM due),
             ev AS (
               SELECT n.id, n.team_id, n.agent_id, n.user_id, n.start + k * n.step AS at,
                      $1::float8 / 1000 AS seconds,
                      'worker:' || n.id || ':'
                        || round(extract(epoch FROM n.start + k * n.step - n.billing_from)
                                 * 1000)::int8 AS key
               FROM n, generate_series(1::int8, n.full) AS k
               UNION ALL
               SELECT n.id, n.team_id, n.agent_id, n.user_id, n.ended_at,
                      GREATEST(extract(epoch FROM n.ended_at - (n.start + n.full * n.step)),
                               0)::float8,
                      'worker:' || n.id || ':final'
               FROM n WHERE n.ended_at IS NOT NULL),
             ins AS (
               INSERT INTO billing_events
                 (id, team_id, agent_id, user_id, event_key, kind, seconds, created_at)
               SELECT gen_random_uuid(), team_id, agent_id, user_id, key, 'worker_seconds',
                      seconds, at
               FROM ev
               ON CONFLICT (event_key) DO NOTHING
               RETURNING 1),
             upd AS (
               UPDATE agent_runtime_sessions s
               SET billed_until = CASE WHEN n.ended_at IS NULL THEN n.start + n.full * n.step
                                       ELSE GREATEST(n.ended_at, n.start + n.full * n.step) END
               FROM n
               WHERE s.id = n.id AND (n.full > 0 OR n.ended_at IS NOT NULL)
               RETURNING n.ended_at IS NOT NULL AS closed)
             SELECT (SELECT count(*) FROM due),
                    (SELECT count(*) FROM ins),
                    (SELECT count(*) FROM upd WHERE closed)",
        )
        .bind(interval.as_millis() as i64)
        .bind(batch)
        .fetch_one(&self.pool)
        .await?;
        Ok(Billed {
            sessions,
            events,
            closed,
        })
    }
}

fn worker_row((id, state, worker_ref, stale): (Uuid, String, Option<String>, bool)) -> WorkerRow {
    WorkerRow {
        session: SessionId(id),
        state: SessionState::parse(&state),
        worker_ref,
        stale,
    }
}

/// A warm-pool slot as the manager tends it (R3).
#[derive(Clone, Debug)]
pub struct PoolSlot {
    pub slot: SessionId,
    pub state: String,
    pub worker_ref: Option<String>,
    /// The session that claimed it, once claimed.
    pub session: Option<SessionId>,
}

impl Store {
    /// Per profile: the slots starting or idle (the pool's size), and the idle ones
    /// (ready to be claimed), for the metrics. Reads the `worker_pool_open` index.
    pub async fn pool_counts(&self) -> Result<Vec<(String, i64, i64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT profile, count(*), count(*) FILTER (WHERE state = 'idle') FROM worker_pool
             WHERE state IN ('starting', 'idle') GROUP BY profile",
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Opens slots of `profile` up to `size` (starting or idle), and returns the new
    /// ones, written `starting`: their workers are to be launched. The count and the
    /// inserts run under a transaction-scoped advisory lock per profile, so managers
    /// topping up the same pool at once never open more than `size` between them (R3).
    pub async fn pool_top_up(
        &self,
        profile: &str,
        size: u32,
    ) -> Result<Vec<SessionId>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('worker_pool:' || $1, 0))")
            .bind(profile)
            .execute(&mut *tx)
            .await?;
        let rows: Vec<(Uuid,)> = sqlx::query_as(
            "INSERT INTO worker_pool (id, profile, state) \
             SELECT gen_random_uuid(), $1, 'starting' \
             FROM generate_series(1, $2 - (SELECT count(*) FROM worker_pool \
                                           WHERE profile = $1 AND state IN ('starting', 'idle'))) \
             RETURNING id",
        )
        .bind(profile)
        .bind(i64::from(size))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(rows.into_iter().map(|(id,)| SessionId(id)).collect())
    }

    /// Idle slots of `profile` started more than `max_age` ago, now `gone`: their workers
    /// are stopped and replaced (R3). An idle slot only: a claim of the same slot and
    /// this retirement are both compare-and-set on `state = 'idle'`, so one of them wins.
    pub async fn pool_retire_aged(
        &self,
        profile: &str,
        max_age: Duration,
    ) -> Result<Vec<SessionId>, sqlx::Error> {
        let rows: Vec<(Uuid,)> = sqlx::query_as(
            "UPDATE worker_pool SET state = 'gone', updated_at = now() \
             WHERE profile = $1 AND state = 'idle' \
               AND created_at <= now() - make_interval(secs => $2) \
             RETURNING id",
        )
        .bind(profile)
        .bind(max_age.as_secs_f64())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(id,)| SessionId(id)).collect())
    }

    pub async fn pool_launched(
        &self,
        slot: SessionId,
        worker_ref: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE worker_pool SET worker_ref = $2, updated_at = now() WHERE id = $1")
            .bind(slot.0)
            .bind(worker_ref)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// An unclaimed slot ends (launch failed, never dialed in).
    pub async fn pool_gone(&self, slot: SessionId) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE worker_pool SET state = 'gone', updated_at = now() \
             WHERE id = $1 AND state IN ('starting', 'idle')",
        )
        .bind(slot.0)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Slots `starting` for longer than `timeout`: their worker never became ready.
    pub async fn pool_stale_starting(
        &self,
        timeout: Duration,
    ) -> Result<Vec<SessionId>, sqlx::Error> {
        let rows: Vec<(Uuid,)> = sqlx::query_as(
            "UPDATE worker_pool SET state = 'gone', updated_at = now() \
             WHERE state = 'starting' AND updated_at <= now() - make_interval(secs => $1) \
             RETURNING id",
        )
        .bind(timeout.as_secs_f64())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(id,)| SessionId(id)).collect())
    }

    /// Gone slots whose worker may still run; the row is removed once it is stopped.
    pub async fn pool_gone_workers(&self) -> Result<Vec<(SessionId, Option<String>)>, sqlx::Error> {
        let rows: Vec<(Uuid, Option<String>)> =
            sqlx::query_as("SELECT id, worker_ref FROM worker_pool WHERE state = 'gone'")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(|(id, r)| (SessionId(id), r)).collect())
    }

    pub async fn pool_forget(&self, slot: SessionId) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM worker_pool WHERE id = $1 AND state = 'gone'")
            .bind(slot.0)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The slots among `ids` (workers the launcher runs under a slot id, not a session id).
    pub async fn pool_slots(&self, ids: &[SessionId]) -> Result<Vec<PoolSlot>, sqlx::Error> {
        let ids: Vec<Uuid> = ids.iter().map(|id| id.0).collect();
        let rows: Vec<(Uuid, String, Option<String>, Option<Uuid>)> = sqlx::query_as(
            "SELECT id, state, worker_ref, session_id FROM worker_pool WHERE id = ANY($1)",
        )
        .bind(&ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, state, worker_ref, session)| PoolSlot {
                slot: SessionId(id),
                state,
                worker_ref,
                session: session.map(SessionId),
            })
            .collect())
    }
}
