//! The transitions against a real Postgres migrated by `store/migrations/`: each moves a
//! row from the states its move leaves from, and from any other changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use protocol::channel::{FailureReason, SessionState};
use protocol::{AgentId, ChatId, ReplicaId, SessionId, TeamId};
use session_states::{Move, Transition};
use sqlx::PgPool;

const ALL: [SessionState; 7] = [
    SessionState::Pending,
    SessionState::Provisioning,
    SessionState::Connecting,
    SessionState::Ready,
    SessionState::Terminating,
    SessionState::Terminated,
    SessionState::Failed,
];

const WORKER: &str = "local:1";

struct Db {
    pool: PgPool,
    team: TeamId,
    agent: AgentId,
}

async fn run_migrations(url: String, dir: PathBuf) {
    let pool = PgPool::connect_with(test_support::db::connect_options(&url))
        .await
        .unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    for file in files {
        let sql = std::fs::read_to_string(&file).unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("migration {}: {e}", file.display()));
    }
    pool.close().await;
}

impl Db {
    async fn new() -> Self {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../store/migrations");
        let name = test_support::db::migrated_database("states_test", &dir, |url| {
            run_migrations(url, dir.clone())
        })
        .await;
        let options = test_support::db::connect_options(&test_support::db::db_url(&name));
        let pool = PgPool::connect_with(options).await.unwrap();
        let (team, agent) = (TeamId::new(), AgentId::new());
        sqlx::query("INSERT INTO teams (id, name) VALUES ($1, 'states')")
            .bind(team.0)
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO agents (id, team_id, name, system_prompt, model, runtime_profile)
             VALUES ($1, $2, 'a', 'terse', 'openai/test', 'light')",
        )
        .bind(agent.0)
        .bind(team.0)
        .execute(&pool)
        .await
        .unwrap();
        Self { pool, team, agent }
    }

    /// A session of a chat of its own in `state`, with a worker, an hour old.
    async fn session(&self, state: SessionState) -> SessionId {
        let (chat, session) = (ChatId::new(), SessionId::new());
        sqlx::query("INSERT INTO chats (id, team_id, agent_id) VALUES ($1, $2, $3)")
            .bind(chat.0)
            .bind(self.team.0)
            .bind(self.agent.0)
            .execute(&self.pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO agent_runtime_sessions
               (id, team_id, agent_id, chat_id, profile, state, worker_ref, updated_at)
             VALUES ($1, $2, $3, $4, 'light', $5, $6, now() - interval '1 hour')",
        )
        .bind(session.0)
        .bind(self.team.0)
        .bind(self.agent.0)
        .bind(chat.0)
        .bind(state.as_str())
        .bind(WORKER)
        .execute(&self.pool)
        .await
        .unwrap();
        session
    }

    /// The columns a transition writes.
    async fn row(&self, id: SessionId) -> (String, i64, Option<String>, Option<uuid::Uuid>) {
        sqlx::query_as(
            "SELECT state, (extract(epoch from updated_at) * 1000000)::int8, failure_reason, owner_replica
             FROM agent_runtime_sessions WHERE id = $1",
        )
        .bind(id.0)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }
}

#[tokio::test]
async fn terminated_to_ready_changes_nothing() {
    let db = Db::new().await;
    let session = db.session(SessionState::Terminated).await;
    let before = db.row(session).await;
    let moved = session_states::ready(&db.pool, session, ReplicaId::new())
        .await
        .unwrap();
    assert_eq!(moved, Transition::Refused);
    assert_eq!(db.row(session).await, before);
}

/// The single-row transitions tried, by name.
const TRIED: [(&str, Move); 6] = [
    ("ready", session_states::READY),
    ("fail_live", session_states::FAIL_LIVE),
    ("fail_connecting", session_states::FAIL_CONNECTING),
    ("fail_worker", session_states::FAIL_WORKER),
    ("finish_terminating", session_states::FINISH_TERMINATING),
    ("terminate_worker", session_states::TERMINATE_WORKER),
];

async fn apply(p: &PgPool, name: &str, session: SessionId) -> Transition {
    let reason = FailureReason::HeartbeatLost;
    match name {
        "ready" => session_states::ready(p, session, ReplicaId::new()).await,
        "fail_live" => session_states::fail_live(p, session, reason, None).await,
        "fail_connecting" => session_states::fail_connecting(p, session, reason).await,
        "fail_worker" => session_states::fail_worker(p, session, WORKER, reason, "gone").await,
        "finish_terminating" => session_states::finish_terminating(p, session).await,
        "terminate_worker" => session_states::terminate_worker(p, session, WORKER).await,
        other => panic!("no transition {other}"),
    }
    .unwrap()
}

/// Each single-row transition, tried from every state: it moves exactly the rows in a
/// state its move leaves from, to its state, and leaves every other row as it was.
#[tokio::test]
async fn each_transition_moves_only_from_its_states() {
    let db = Db::new().await;
    for from in ALL {
        for (name, m) in TRIED {
            let session = db.session(from).await;
            let before = db.row(session).await;
            let moved = apply(&db.pool, name, session).await;
            let after = db.row(session).await;
            if m.from.contains(&from) {
                assert_eq!(moved, Transition::Moved, "{from:?} by {name}");
                assert_eq!(after.0, m.to.as_str(), "{from:?} by {name}");
                assert!(after.1 > before.1, "{from:?} by {name}: updated_at");
            } else {
                assert_eq!(moved, Transition::Refused, "{from:?} by {name}");
                assert_eq!(after, before, "{from:?} by {name}");
            }
        }
    }
}

/// A team's end terminates its sessions not over yet, and none that are.
#[tokio::test]
async fn a_team_end_leaves_ended_sessions_alone() {
    let db = Db::new().await;
    let mut sessions = Vec::new();
    for state in ALL {
        sessions.push((state, db.session(state).await));
    }
    let before: Vec<_> = rows(&db, &sessions).await;
    let ended = session_states::end_team_sessions(&db.pool, db.team)
        .await
        .unwrap();
    assert_eq!(ended.len(), 5);
    for ((state, session), before) in sessions.iter().zip(before) {
        let after = db.row(*session).await;
        if state.is_live() || *state == SessionState::Terminating {
            assert!(ended.contains(session), "{state:?}");
            assert_eq!(after.0, "terminated", "{state:?}");
        } else {
            assert!(!ended.contains(session), "{state:?}");
            assert_eq!(after, before, "{state:?}");
        }
    }
}

async fn rows(
    db: &Db,
    sessions: &[(SessionState, SessionId)],
) -> Vec<(String, i64, Option<String>, Option<uuid::Uuid>)> {
    let mut rows = Vec::new();
    for (_, session) in sessions {
        rows.push(db.row(*session).await);
    }
    rows
}

/// The runtime-manager's provision and teardown moves find an ended row and leave it.
#[tokio::test]
async fn provision_and_teardown_leave_an_ended_session_alone() {
    let db = Db::new().await;
    let replica = ReplicaId::new();
    for from in [SessionState::Terminated, SessionState::Failed] {
        let session = db.session(from).await;
        sqlx::query("UPDATE agent_runtime_sessions SET worker_ref = NULL WHERE id = $1")
            .bind(session.0)
            .execute(&db.pool)
            .await
            .unwrap();
        let before = db.row(session).await;
        let p = &db.pool;
        let claim = session_states::claim_provision(p, session, replica)
            .await
            .unwrap();
        assert!(
            matches!(claim, session_states::ProvisionClaim::Done),
            "{from:?}: {claim:?}"
        );
        let moved = session_states::connecting(p, session, replica, WORKER)
            .await
            .unwrap();
        assert_eq!(moved, Transition::Refused, "{from:?}");
        let moved =
            session_states::fail_provision(p, session, replica, FailureReason::LaunchFailed, "x")
                .await
                .unwrap();
        assert_eq!(moved, Transition::Refused, "{from:?}");
        let teardown = session_states::begin_terminating(p, session, i64::MAX, None)
            .await
            .unwrap();
        assert_eq!(teardown, session_states::Teardown::NotIdle, "{from:?}");
        let timed_out = session_states::fail_dial_timeouts(p, std::time::Duration::ZERO)
            .await
            .unwrap();
        assert!(timed_out.iter().all(|(id, _)| *id != session), "{from:?}");
        assert_eq!(db.row(session).await, before, "{from:?}");
    }
}
