//! The test harness: a runtime-manager in-process over a fresh Postgres database, the real
//! Redis (a queue namespace of its own), and a fake worker: a shell script that records
//! its environment and sleeps, never dialing the brain.
//!
//! Each test gets its own database (`rm_test_<secs>_<uuid>`, a copy of a template the SQL
//! files of `store/migrations/` ran on in order, dropped at the end; leftovers of crashed runs
//! are dropped after an hour) and its own directory for workspaces.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::channel::SessionTask;
use protocol::{AgentId, ChatId, SessionId, TeamId};
use queue::SessionQueue;
use runtime_manager::Config;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

pub const BRAIN_URL: &str = "http://127.0.0.1:9";

/// The fake worker: records what it was given on standard input (its session token) and
/// its environment, starts a grandchild in its process group, and waits (it never dials).
const FAKE_WORKER: &str = r#"#!/bin/sh
cat > "$WORKER_WORKSPACE/stdin.txt"
env > "$WORKER_WORKSPACE/env.txt.tmp" && mv "$WORKER_WORKSPACE/env.txt.tmp" "$WORKER_WORKSPACE/env.txt"
sleep 300 &
echo $! > "$WORKER_WORKSPACE/grandchild.pid"
echo "fake worker $$ up"
wait
"#;

pub use test_support::db::admin_url;
use test_support::db::db_url;

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A migrated database of its own: (pool, name). A copy of the template that the SQL files
/// of `migrations/` were run on, in order, once per set of them.
async fn fresh_database() -> (PgPool, String) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../store/migrations");
    let name = test_support::db::migrated_database("rm_test", &dir, |url| {
        let dir = dir.clone();
        async move { run_migrations(&url, &dir).await }
    })
    .await;
    let options = test_support::db::connect_options(&db_url(&name));
    let pool = PgPool::connect_with(options).await.unwrap();
    (pool, name)
}

/// Runs the SQL files of `dir` in order on the database at `url`.
async fn run_migrations(url: &str, dir: &Path) {
    let pool = PgPool::connect_with(test_support::db::connect_options(url))
        .await
        .unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
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

/// The columns a test looks at.
#[derive(Clone, Debug)]
pub struct Row {
    pub state: String,
    pub failure_reason: Option<String>,
    pub failure_detail: Option<String>,
    pub worker_ref: Option<String>,
}

impl Row {
    pub fn pid(&self) -> u32 {
        self.worker_ref
            .as_deref()
            .and_then(|r| r.strip_prefix("local:"))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no local worker_ref: {self:?}"))
    }
}

pub struct Harness {
    pub pool: PgPool,
    pub db_name: String,
    pub dir: PathBuf,
    pub worker_bin: PathBuf,
    pub namespace: String,
    pub queue: SessionQueue,
    pub team: TeamId,
    pub agent: AgentId,
    shutdown: CancellationToken,
    manager: Option<tokio::task::JoinHandle<Result<(), runtime_manager::Error>>>,
}

impl Harness {
    /// A database with a team and an agent, a directory with the fake worker, and a queue
    /// namespace; no manager yet.
    pub async fn new() -> Self {
        let (pool, db_name) = fresh_database().await;
        let dir = std::env::temp_dir().join(format!("rm-test-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let worker_bin = dir.join("fake-worker.sh");
        std::fs::write(&worker_bin, FAKE_WORKER).unwrap();
        std::fs::set_permissions(&worker_bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let namespace = format!("test-rm-{}", uuid::Uuid::new_v4().simple());
        let queue = SessionQueue::connect_with_namespace(
            &redis_conn::Client::open(&redis_url(), None).unwrap(),
            &namespace,
        )
        .await
        .expect("Redis must run (make test starts it)");
        let team = TeamId::new();
        let agent = AgentId::new();
        sqlx::query("INSERT INTO teams (id, name) VALUES ($1, 'test team')")
            .bind(team.0)
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO agents (id, team_id, name, system_prompt, model, runtime_profile)
             VALUES ($1, $2, 'a', 'You are terse.', 'openai/test', 'light')",
        )
        .bind(agent.0)
        .bind(team.0)
        .execute(&pool)
        .await
        .unwrap();
        Self {
            pool,
            db_name,
            dir,
            worker_bin,
            namespace,
            queue,
            team,
            agent,
            shutdown: CancellationToken::new(),
            manager: None,
        }
    }

    pub fn workspaces(&self) -> PathBuf {
        self.dir.join("workspaces")
    }

    /// Starts the manager; `env` adds or overrides variables of the base configuration.
    pub fn start(&mut self, env: &[(&str, &str)]) {
        self.start_with(env, |_| {});
    }

    /// [`Self::start`], with `tweak` adjusting what no variable sets.
    pub fn start_with(&mut self, env: &[(&str, &str)], tweak: impl FnOnce(&mut Config)) {
        let mut config = self.config(env);
        tweak(&mut config);
        self.manager = Some(tokio::spawn(runtime_manager::run(
            config,
            self.shutdown.clone(),
        )));
    }

    /// Starts the manager with the Kubernetes launcher over `client` (a fake API server's).
    pub fn start_kubernetes(&mut self, client: kube::Client, env: &[(&str, &str)]) {
        let mut vars = vec![("RUNTIME_MANAGER_LAUNCHER", "kubernetes")];
        vars.extend_from_slice(env);
        let config = self.config(&vars);
        let launcher = runtime_manager::launcher::kubernetes::KubernetesLauncher::new(
            client,
            runtime_manager::launcher::kubernetes::KubernetesSettings::from_config(&config),
        );
        self.manager = Some(tokio::spawn(runtime_manager::run_with_launcher(
            config,
            Arc::new(launcher),
            self.shutdown.clone(),
        )));
    }

    /// The configuration of a manager of this harness.
    pub fn config(&self, env: &[(&str, &str)]) -> Config {
        let mut vars: HashMap<String, String> = HashMap::new();
        vars.insert("DATABASE_URL".into(), db_url(&self.db_name));
        vars.insert("REDIS_URL".into(), redis_url());
        vars.insert("BRAIN_PUBLIC_URL".into(), BRAIN_URL.into());
        vars.insert(
            "SESSION_TOKEN_KEY".into(),
            test_support::SESSION_TOKEN_KEY.into(),
        );
        vars.insert(
            "RUNTIME_MANAGER_WORKER_BIN".into(),
            self.worker_bin.display().to_string(),
        );
        vars.insert(
            "RUNTIME_MANAGER_WORKSPACES".into(),
            self.workspaces().display().to_string(),
        );
        // Tests run many managers at once: none takes the metrics port unless it asks.
        vars.insert("RUNTIME_MANAGER_METRICS_ADDR".into(), "off".into());
        for (k, v) in env {
            vars.insert((*k).to_owned(), (*v).to_owned());
        }
        let mut config = Config::from_env(&vars).unwrap();
        config.queue_namespace = self.namespace.clone();
        config
    }

    /// The runtime-manager replicas with a lease row: (id, lease still current).
    pub async fn manager_leases(&self) -> Vec<(uuid::Uuid, bool)> {
        sqlx::query_as(
            "SELECT id, lease_until > now() FROM replicas WHERE kind = 'runtime-manager'",
        )
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// A session row (in a chat of its own) in `state`, with no worker.
    pub async fn insert_session(&self, state: &str, profile: &str) -> (SessionId, ChatId) {
        let chat = ChatId::new();
        sqlx::query("INSERT INTO chats (id, team_id, agent_id) VALUES ($1, $2, $3)")
            .bind(chat.0)
            .bind(self.team.0)
            .bind(self.agent.0)
            .execute(&self.pool)
            .await
            .unwrap();
        let session = SessionId::new();
        sqlx::query(
            "INSERT INTO agent_runtime_sessions (id, team_id, agent_id, chat_id, profile, state)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(session.0)
        .bind(self.team.0)
        .bind(self.agent.0)
        .bind(chat.0)
        .bind(profile)
        .bind(state)
        .execute(&self.pool)
        .await
        .unwrap();
        (session, chat)
    }

    /// What the brain does on the first worker tool call: the row, then the task.
    pub async fn provision(&self, profile: &str) -> SessionId {
        let (session, chat) = self.insert_session("pending", profile).await;
        self.push_provision(session, chat, profile).await;
        session
    }

    pub async fn push_provision(&self, session: SessionId, chat: ChatId, profile: &str) {
        self.queue
            .push(SessionTask::Provision {
                session,
                team: self.team,
                agent: self.agent,
                chat,
                profile: profile.to_owned(),
            })
            .await
            .unwrap();
    }

    pub async fn row(&self, session: SessionId) -> Row {
        let (state, failure_reason, failure_detail, worker_ref): (
            String,
            Option<String>,
            Option<String>,
            Option<String>,
        ) = sqlx::query_as(
            "SELECT state, failure_reason, failure_detail, worker_ref
             FROM agent_runtime_sessions WHERE id = $1",
        )
        .bind(session.0)
        .fetch_one(&self.pool)
        .await
        .unwrap();
        Row {
            state,
            failure_reason,
            failure_detail,
            worker_ref,
        }
    }

    /// Waits until the row is in `state`.
    pub async fn wait_state(&self, session: SessionId, state: &str, within: Duration) -> Row {
        let deadline = Instant::now() + within;
        loop {
            let row = self.row(session).await;
            if row.state == state {
                return row;
            }
            assert!(
                Instant::now() < deadline,
                "session still {row:?}, expected {state}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The fake worker's workspace.
    pub fn workspace(&self, session: SessionId) -> PathBuf {
        self.workspaces().join(session.0.to_string())
    }

    /// The environment the fake worker saw.
    pub async fn worker_env(&self, session: SessionId) -> HashMap<String, String> {
        let path = self.workspace(session).join("env.txt");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !path.exists() {
            assert!(Instant::now() < deadline, "the worker never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// The (host) pid of the `sleep` the fake worker started in its process group.
    pub async fn grandchild(&self, session: SessionId) -> u32 {
        let path = self.workspace(session).join("grandchild.pid");
        let worker = self.row(session).await.pid();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(pid) = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .and_then(|inner| test_support::sandbox::host_pid(worker, inner))
            {
                return pid;
            }
            assert!(Instant::now() < deadline, "the worker never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Asks the manager to stop (what its binary does on SIGTERM) and hands back its task,
    /// for a test that acts while it stops; the harness can start another.
    pub fn signal_stop(
        &mut self,
    ) -> Option<tokio::task::JoinHandle<Result<(), runtime_manager::Error>>> {
        self.shutdown.cancel();
        self.shutdown = CancellationToken::new();
        self.manager.take()
    }

    /// Stops the manager (as SIGTERM would) and waits for it; the harness can start another.
    pub async fn stop_manager(&mut self) {
        if let Some(manager) = self.signal_stop() {
            tokio::time::timeout(Duration::from_secs(10), manager)
                .await
                .expect("the manager stops within 10 s")
                .unwrap()
                .unwrap();
        }
    }

    /// Stops the manager and removes the database, the queue keys and the directory.
    pub async fn finish(mut self) {
        self.stop_manager().await;
        self.pool.close().await;
        if let Ok(admin) = PgPool::connect(&admin_url()).await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.db_name
            )))
            .execute(&admin)
            .await;
        }
        let _ = self.queue.clone().destroy().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis server of a test's own (`redis-server` on a free loopback port, no
/// persistence), for a manager whose Redis goes away.
pub struct ThrowawayRedis {
    pub url: String,
    child: tokio::process::Child,
}

impl ThrowawayRedis {
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = tokio::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server is installed (scripts/services.sh)");
        let deadline = Instant::now() + Duration::from_secs(5);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "redis-server did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self {
            url: format!("redis://127.0.0.1:{port}"),
            child,
        }
    }

    /// SIGKILL: every later call to it fails.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|end| stat[end + 1..].split_whitespace().next());
    !matches!(state, Some("Z") | Some("X") | None)
}

/// Waits until `pid` is gone.
pub async fn wait_gone(pid: u32, within: Duration) {
    let deadline = Instant::now() + within;
    while alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
