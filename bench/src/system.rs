//! What every scenario stands on: a fresh database, a brain in this process over it, its
//! scripted provider, a team, and the percentile, table and SSE helpers.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use brain::AppState;
use engine::config::Config;
use scripted_provider::{Reply, ScriptedProvider};
use serde_json::{Value, json};
use store::Store;
use tokio_util::sync::CancellationToken;

const ADMIN_URL_DEFAULT: &str = "postgres://postgres:postgres@127.0.0.1:5432/postgres";
const REDIS_DEFAULT: &str = "redis://127.0.0.1:6379";

pub fn admin_url() -> String {
    std::env::var("BENCH_DATABASE_URL").unwrap_or_else(|_| ADMIN_URL_DEFAULT.to_owned())
}

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| REDIS_DEFAULT.to_owned())
}

/// The admin URL with its database replaced by `name`; its options (`?sslmode=...`) kept.
pub fn db_url(name: &str) -> String {
    let admin = admin_url();
    let (admin, options) = match admin.split_once('?') {
        Some((url, options)) => (url, format!("?{options}")),
        None => (admin.as_str(), String::new()),
    };
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(admin);
    format!("{base}/{name}{options}")
}

/// One row of the table.
pub struct Row {
    pub scenario: String,
    pub metric: String,
    pub p50: String,
    pub p99: String,
    pub other: String,
}

pub fn row(scenario: &str, metric: &str, p50: String, p99: String, other: String) -> Row {
    Row {
        scenario: scenario.to_owned(),
        metric: metric.to_owned(),
        p50,
        p99,
        other,
    }
}

/// Nearest-rank percentile of a sorted slice.
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

pub fn signed_ms(a: Duration, b: Duration) -> String {
    format!("{:.3} ms", (a.as_secs_f64() - b.as_secs_f64()) * 1000.0)
}

pub fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort();
    v
}

/// A fresh Postgres database, migrated, and a store over it. The `brain_test_` prefix lets
/// the test harness drop what a crashed run leaves.
pub struct Database {
    pub name: String,
    pub store: Store,
}

/// A new empty database named `brain_test_<secs>_<what><uuid>`: its name.
pub async fn create_database(what: &str) -> Result<String> {
    let admin = sqlx::PgPool::connect(&admin_url())
        .await
        .context("Postgres must run (make services starts it)")?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let name = format!("brain_test_{now}_{what}{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&admin)
        .await?;
    admin.close().await;
    Ok(name)
}

/// Drops database `name`, whoever is still connected to it; best effort.
pub async fn drop_database(name: &str) {
    if let Ok(admin) = sqlx::PgPool::connect(&admin_url()).await {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
        )))
        .execute(&admin)
        .await;
    }
}

impl Database {
    pub async fn create() -> Result<Self> {
        let db = Self::create_empty().await?;
        db.store.migrate().await?;
        Ok(db)
    }

    /// [`Database::create`] without the migrations, for a brain binary to apply its own.
    pub async fn create_empty() -> Result<Self> {
        let name = create_database("bench").await?;
        let store = Store::connect(&db_url(&name), 20).await?;
        Ok(Self { name, store })
    }

    pub async fn drop(self) {
        // An in-process brain's tasks share this pool and may still hold a connection as
        // they wind down: closing waits for it, within a bound; the drop below forces off
        // whatever is left.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.store.db().close()).await;
        drop_database(&self.name).await;
    }
}

/// Brings database `name`'s planner statistics up to date, as autovacuum does within the
/// first hundred turns of a production database. This machine's Postgres runs with
/// autovacuum off, so a fresh bench database is never analyzed and keeps the plans chosen
/// while its tables were empty, where `turns`' two indexes on `team_id` tie and a
/// single-turn lookup reads the team's whole `turns` (measured in
/// docs/design/performance-history.md, the Postgres CPU rounds' first stop). The `ANALYZE`
/// invalidates the brain's cached plans, so its next statements plan again.
pub async fn analyze(name: &str) -> Result<()> {
    let db = sqlx::PgPool::connect(&db_url(name)).await?;
    sqlx::query("ANALYZE").execute(&db).await?;
    db.close().await;
    Ok(())
}

/// A brain (in this process, or a child: [`System::start_process`]), its database, its
/// scripted provider, and a team.
pub struct System {
    pub url: String,
    pub store: Store,
    pub provider: ScriptedProvider,
    pub key: String,
    pub http: reqwest::Client,
    pub db_name: String,
    pub shutdown: CancellationToken,
    /// The brain's process when it runs as a child; `None` when it runs in this one.
    process: Option<BrainProcess>,
}

/// The brain's environment over database `db_name` and `provider`, in-process or as a
/// child alike.
pub fn brain_env(db_name: &str, provider: &ScriptedProvider) -> HashMap<String, String> {
    let artifacts = std::env::temp_dir().join(format!("brain-bench-artifacts-{db_name}"));
    HashMap::from([
        ("OPENAI_BASE_URL".into(), provider.openai_base_url()),
        ("OPENAI_API_KEY".into(), "sk-bench-openai".into()),
        ("ANTHROPIC_BASE_URL".into(), provider.anthropic_base_url()),
        ("ANTHROPIC_API_KEY".into(), "sk-bench-anthropic".into()),
        ("DATABASE_URL".into(), db_url(db_name)),
        ("REDIS_URL".into(), redis_url()),
        // One key drives every scenario, faster than a deployment's default lets one key
        // go; the limit is still checked on every request, so its cost is in the figures.
        (
            "BRAIN_RATE_LIMIT_PER_SECOND".into(),
            engine::quota::MAX_REQUESTS.to_string(),
        ),
        (
            "SESSION_TOKEN_KEY".into(),
            test_support::SESSION_TOKEN_KEY.into(),
        ),
        (
            "BRAIN_ARTIFACTS_DIR".into(),
            artifacts.to_string_lossy().into_owned(),
        ),
        // Off unless `BENCH_CHAT_TITLES=1`: the scenarios measure the turn path, and with
        // titles on, the title call's cost (T17) is a row's difference.
        (
            "BRAIN_CHAT_TITLES".into(),
            if chat_titles() { "true" } else { "false" }.into(),
        ),
    ])
}

impl System {
    pub async fn start(queue_namespace: Option<String>) -> Result<Self> {
        Self::start_with(queue_namespace, &[]).await
    }

    /// [`System::start`] with `extra` variables in the brain's environment.
    pub async fn start_with(
        queue_namespace: Option<String>,
        extra: &[(&str, &str)],
    ) -> Result<Self> {
        let Database {
            name: db_name,
            store,
        } = Database::create().await?;
        let provider = ScriptedProvider::start().await?;
        let mut env = brain_env(&db_name, &provider);
        env.insert("BRAIN_ADDR".into(), "127.0.0.1:0".into());
        env.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let mut config = Config::from_env(&env).map_err(|e| anyhow!("config: {e}"))?;
        if let Some(ns) = queue_namespace {
            config.workers.queue_namespace = ns;
        }
        let redis =
            engine::redis::Client::open(&config.redis_url, config.redis_cluster_urls.as_deref())?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let state = AppState::new(config, store.clone(), redis).map_err(|e| anyhow!("{e}"))?;
        let shutdown = CancellationToken::new();
        tokio::spawn(brain::serve(listener, state, shutdown.clone()));
        let created = store.create_team("bench team").await?;
        Ok(Self {
            url,
            store,
            provider,
            key: created.api_key,
            http: reqwest::Client::new(),
            db_name,
            shutdown,
            process: None,
        })
    }

    /// A system whose brain is the release binary as its own process, with `extra` in its
    /// environment; the client and the provider stay in this process. The binary migrates
    /// the database and creates the team itself, so a brain of another revision (make
    /// bench-compare) runs on its own schema; `close` stops it.
    pub async fn start_process(extra: &[(&str, &str)]) -> Result<Self> {
        Self::start_process_under(&[], extra).await
    }

    /// [`System::start_process`] with the brain run by the command `under` (`valgrind
    /// --tool=callgrind …`), which must keep the brain's pid as its own.
    pub async fn start_process_under(under: &[String], extra: &[(&str, &str)]) -> Result<Self> {
        let db = Database::create_empty().await?;
        let provider = ScriptedProvider::start().await?;
        BrainProcess::run(&db, &provider, &["migrate"]).await?;
        let team =
            BrainProcess::run(&db, &provider, &["admin", "create-team", "bench team"]).await?;
        let team: Value = serde_json::from_slice(&team).context("create-team's output")?;
        let key = team["api_key"]
            .as_str()
            .context("create-team: api_key")?
            .to_owned();
        let brain = BrainProcess::start_under(under, &db, &provider, free_addr()?, extra).await?;
        let Database { name, store } = db;
        Ok(Self {
            url: format!("http://{}", brain.addr),
            store,
            provider,
            key,
            http: reqwest::Client::new(),
            db_name: name,
            shutdown: CancellationToken::new(),
            process: Some(brain),
        })
    }

    /// The brain's pid when it runs as its own process ([`System::start_process`]).
    pub fn brain_pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.pid)
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Result<reqwest::Response> {
        self.post_json_as(&self.key, path, body).await
    }

    /// `POST path` with a `multipart/form-data` body of one field, `file`, holding `bytes`
    /// named `filename` (the upload routes' form: chat files, knowledge documents).
    pub async fn post_file(
        &self,
        path: &str,
        filename: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<reqwest::Response> {
        let boundary = "bench-upload-boundary";
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; \
             filename=\"{filename}\"\r\nContent-Type: {media_type}\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(bytes);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        Ok(self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.key)
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body)
            .send()
            .await?)
    }

    /// [`System::post_json`] with another team's key.
    pub async fn post_json_as(
        &self,
        key: &str,
        path: &str,
        body: &Value,
    ) -> Result<reqwest::Response> {
        Ok(self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(key)
            .json(body)
            .send()
            .await?)
    }

    /// An agent (on `profile` if given) and a chat with it: (agent id, chat id).
    pub async fn agent_and_chat(&self, profile: Option<&str>) -> Result<(String, String)> {
        let mut body = json!({"name": "bench", "system_prompt": "You are terse.",
                              "model": "openai/gpt-test"});
        if let Some(profile) = profile {
            body["runtime_profile"] = json!(profile);
        }
        let agent = self.post_json("/v1/agents", &body).await?;
        if agent.status() != 201 {
            bail!("create agent: {} {}", agent.status(), agent.text().await?);
        }
        let agent: Value = agent.json().await?;
        let agent_id = agent["id"].as_str().context("agent id")?.to_owned();
        let chat = self.new_chat(&agent_id).await?;
        Ok((agent_id, chat))
    }

    /// A new chat with `agent`: its id.
    pub async fn new_chat(&self, agent: &str) -> Result<String> {
        let chat = self
            .post_json(&format!("/v1/agents/{agent}/chats"), &json!({}))
            .await?;
        if chat.status() != 201 {
            bail!("create chat: {}", chat.status());
        }
        let chat: Value = chat.json().await?;
        if chat_titles() {
            // The reply the title call after the chat's first turn takes.
            self.provider.push(instant_ok());
        }
        Ok(chat["id"].as_str().context("chat id")?.to_owned())
    }

    /// Posts a message; with `BENCH_MESSAGE_IDS=1` each carries a fresh `message_id`, as the
    /// web chat's every message does (the AI SDK's id), which the brain checks for a retry
    /// (T12) before it admits the turn.
    pub async fn send(&self, chat: &str, content: &str) -> Result<reqwest::Response> {
        let mut body = json!({ "content": content });
        if message_ids() {
            body["message_id"] = json!(uuid::Uuid::new_v4().to_string());
        }
        self.post_json(&format!("/v1/chats/{chat}/messages"), &body)
            .await
    }

    pub async fn close(self) {
        self.shutdown.cancel();
        if let Some(process) = self.process {
            process.stop().await;
        }
        self.provider.shutdown();
        Database {
            name: self.db_name,
            store: self.store,
        }
        .drop()
        .await;
    }
}

/// The scripted answer of a bench turn: `BENCH_DELTAS` deltas (default 1, `ok`) at once.
/// More deltas a turn give the per-delta costs (docs/SCALING.md) by difference.
pub fn instant_ok() -> Reply {
    static DELTAS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let n = *DELTAS.get_or_init(|| {
        std::env::var("BENCH_DELTAS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n >= 1)
            .unwrap_or(1)
    });
    Reply::Text {
        deltas: vec!["ok".into(); n],
        delay: Duration::ZERO,
    }
}

/// Splits a body read piece by piece into its SSE events' `data:` payloads.
#[derive(Default)]
pub struct SseData {
    buffer: Vec<u8>,
}

impl SseData {
    /// Takes the next piece of the body; returns the payloads of the events it completed.
    pub fn push(&mut self, piece: &[u8]) -> Vec<String> {
        self.buffer.extend_from_slice(piece);
        let mut payloads = Vec::new();
        while let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.buffer.drain(..end + 2).collect();
            for line in String::from_utf8_lossy(&event).lines() {
                if let Some(data) = line.strip_prefix("data: ") {
                    payloads.push(data.to_owned());
                }
            }
        }
        payloads
    }
}

/// `BENCH_MESSAGE_IDS=1`: every message posted carries an id ([`System::send`]).
fn message_ids() -> bool {
    static IDS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IDS.get_or_init(|| std::env::var("BENCH_MESSAGE_IDS").is_ok_and(|v| v.trim() == "1"))
}

/// `BENCH_CHAT_TITLES=1`: the brain titles each new chat after its first turn (T17).
fn chat_titles() -> bool {
    static TITLES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TITLES.get_or_init(|| std::env::var("BENCH_CHAT_TITLES").is_ok_and(|v| v.trim() == "1"))
}

pub fn window() -> Duration {
    let secs = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(5.0);
    Duration::from_secs_f64(secs)
}

/// The workspace's binaries, next to this one.
pub fn bin(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(exe.parent().context("binary directory")?.join(name))
}

/// Runs `turn` back to back on every client until `span` is over, each client in a task
/// of its own (closed loop: a client sends its next turn when the last one ended).
/// `turn` gets the client and the index of its turn. Returns every sample and the time the
/// last client took to finish, for turns per second.
pub async fn closed_loop<C, T, F, Fut>(
    span: Duration,
    clients: Vec<C>,
    turn: F,
) -> Result<(Vec<T>, Duration)>
where
    C: Clone + Send + 'static,
    T: Send + 'static,
    F: Fn(C, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T>> + Send,
{
    let until = Instant::now() + span;
    run_loop(clients, turn, move |_| Instant::now() < until).await
}

/// [`closed_loop`] for a fixed number of turns: `turns_each` on every client.
pub async fn counted_loop<C, T, F, Fut>(
    turns_each: usize,
    clients: Vec<C>,
    turn: F,
) -> Result<(Vec<T>, Duration)>
where
    C: Clone + Send + 'static,
    T: Send + 'static,
    F: Fn(C, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T>> + Send,
{
    run_loop(clients, turn, move |done| done < turns_each).await
}

/// Each client in a task of its own, sending its next turn while `more(turns it ran)`.
async fn run_loop<C, T, F, Fut, M>(clients: Vec<C>, turn: F, more: M) -> Result<(Vec<T>, Duration)>
where
    C: Clone + Send + 'static,
    T: Send + 'static,
    F: Fn(C, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T>> + Send,
    M: Fn(usize) -> bool + Clone + Send + 'static,
{
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let (turn, more) = (turn.clone(), more.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                while more(out.len()) {
                    out.push(turn(client.clone(), out.len()).await?);
                }
                anyhow::Ok(out)
            })
        })
        .collect();
    let mut samples = Vec::new();
    for task in tasks {
        samples.extend(task.await??);
    }
    Ok((samples, started.elapsed()))
}

/// How long one turn of an open loop is waited for: far past any latency worth a figure,
/// short of hanging the bench on a server that fell behind the rate. A turn cut off there
/// is counted ([`OpenLoop::cut_off`]), not dropped from the figures.
pub const OPEN_LOOP_TURN_LIMIT: Duration = Duration::from_secs(60);

/// What an open loop measured.
pub struct OpenLoop<T> {
    /// One per scheduled send that ended within [`OPEN_LOOP_TURN_LIMIT`].
    pub samples: Vec<T>,
    /// The sends that did not: the server did not sustain the rate.
    pub cut_off: usize,
    /// How late each send left against its instant on the schedule, sorted: the load
    /// generator's own error, already inside every sample.
    pub lateness: Vec<Duration>,
}

/// Sends `turn(intended)` at `rate` per second for `span`: an open loop, as wrk2 does.
/// Each send leaves at its instant on the schedule whether or not the earlier ones have
/// ended, and `turn` times itself from `intended`, that instant, not from when it left:
/// a stall is charged to every request it held up (no coordinated omission). The schedule
/// is kept by a thread of its own sleeping to each instant, since tokio's timer ticks in
/// whole milliseconds, coarser than what is measured.
pub async fn open_loop<T, F, Fut>(rate: f64, span: Duration, turn: F) -> Result<OpenLoop<T>>
where
    T: Send + 'static,
    F: Fn(Instant) -> Fut,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    if rate.is_nan() || rate <= 0.0 {
        bail!("open loop: a rate of {rate} per second");
    }
    let sends = (rate * span.as_secs_f64()).round() as u64;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let start = Instant::now() + Duration::from_millis(10);
    let scheduler = std::thread::spawn(move || {
        for i in 0..sends {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if tx.send(due).is_err() {
                return;
            }
        }
    });
    let mut tasks = Vec::new();
    let mut lateness = Vec::new();
    while let Some(due) = rx.recv().await {
        lateness.push(due.elapsed());
        let sent = turn(due);
        tasks.push(tokio::spawn(async move {
            match tokio::time::timeout(OPEN_LOOP_TURN_LIMIT, sent).await {
                Ok(sample) => sample.map(Some),
                Err(_) => Ok(None),
            }
        }));
    }
    scheduler
        .join()
        .map_err(|_| anyhow!("the open loop's scheduler panicked"))?;
    let mut samples = Vec::with_capacity(tasks.len());
    let mut cut_off = 0;
    for task in tasks {
        match task.await?? {
            Some(sample) => samples.push(sample),
            None => cut_off += 1,
        }
    }
    Ok(OpenLoop {
        samples,
        cut_off,
        lateness: sorted(lateness),
    })
}

/// A free loopback address, released for a child to bind right after.
pub fn free_addr() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The release brain binary as a child process over `db`, with `provider` as OpenAI, on
/// `addr`, with `extra` variables over [`brain_env`].
pub struct BrainProcess {
    child: tokio::process::Child,
    pub pid: u32,
    pub addr: SocketAddr,
    /// Where it serves `/metrics` (`BRAIN_METRICS_ADDR`), a port of its own.
    pub metrics_addr: SocketAddr,
    artifacts: PathBuf,
}

/// The release brain binary next to this one.
fn brain_binary() -> Result<PathBuf> {
    let binary = bin("brain")?;
    if !binary.exists() {
        bail!(
            "{} is missing: run `cargo build --release --bins` (make bench does)",
            binary.display()
        );
    }
    Ok(binary)
}

impl BrainProcess {
    /// Runs `brain <args>` to its end over `db` (`migrate`, `admin create-team`): its
    /// stdout.
    pub async fn run(db: &Database, provider: &ScriptedProvider, args: &[&str]) -> Result<Vec<u8>> {
        let run = tokio::process::Command::new(brain_binary()?)
            .args(args)
            .envs(brain_env(&db.name, provider))
            .env("BRAIN_LOG", "warn")
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .with_context(|| format!("brain {args:?} took over 60 s"))??;
        if !out.status.success() {
            bail!(
                "brain {args:?}: {} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(out.stdout)
    }

    pub async fn start(
        db: &Database,
        provider: &ScriptedProvider,
        addr: SocketAddr,
        extra: &[(&str, &str)],
    ) -> Result<Self> {
        Self::start_under(&[], db, provider, addr, extra).await
    }

    /// [`BrainProcess::start`], the binary run by the command `under` when it is not empty.
    pub async fn start_under(
        under: &[String],
        db: &Database,
        provider: &ScriptedProvider,
        addr: SocketAddr,
        extra: &[(&str, &str)],
    ) -> Result<Self> {
        let binary = brain_binary()?;
        let env = brain_env(&db.name, provider);
        let artifacts = PathBuf::from(&env["BRAIN_ARTIFACTS_DIR"]);
        let metrics_addr = free_addr()?;
        let mut command = match under.split_first() {
            Some((program, args)) => {
                let mut command = tokio::process::Command::new(program);
                command.args(args).arg(binary);
                command
            }
            None => tokio::process::Command::new(binary),
        };
        // Under valgrind the brain starts some fifty times slower.
        let ready_within = Duration::from_secs(if under.is_empty() { 30 } else { 300 });
        let mut child = command
            .arg("serve")
            .envs(env)
            .env("BRAIN_ADDR", addr.to_string())
            .env("BRAIN_METRICS_ADDR", metrics_addr.to_string())
            // Its own provision queue, so no runtime-manager of another run sees it.
            .env(
                "SESSION_QUEUE_NAMESPACE",
                format!("bench-{}", uuid::Uuid::new_v4().simple()),
            )
            .env("BRAIN_LOG", "warn,rmcp=error")
            .envs(extra.iter().copied())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().context("the brain's pid")?;
        let http = reqwest::Client::new();
        let deadline = Instant::now() + ready_within;
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("the brain exited at start: {status}");
            }
            if let Ok(ready) = http.get(format!("http://{addr}/readyz")).send().await
                && ready.status() == 200
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("the brain was not ready within {ready_within:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Self {
            child,
            pid,
            addr,
            metrics_addr,
            artifacts,
        })
    }

    /// SIGTERM (the brain drains), then SIGKILL after 10 s.
    pub async fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
        let _ = std::fs::remove_dir_all(&self.artifacts);
    }

    /// SIGKILL: no drain, no lease given up.
    pub async fn kill(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// What `/proc` says about a process.
#[derive(Clone, Copy)]
pub struct Usage {
    /// VmRSS, bytes.
    pub rss: u64,
    /// VmHWM: the peak RSS so far, bytes.
    pub peak: u64,
    /// utime + stime.
    pub cpu: Duration,
    /// Open file descriptors: each live turn holds a provider socket in the brain and
    /// in this process, against a limit of 20,000 per process here.
    pub fds: usize,
}

/// `/proc/<pid>/stat` counts CPU time in clock ticks.
pub fn clock_ticks_per_second() -> Result<u64> {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .context("getconf CLK_TCK")?;
    Ok(String::from_utf8(out.stdout)?.trim().parse()?)
}

/// `/proc/<pid>/stat`: the command name and utime + stime, all threads, living and ended.
pub fn proc_stat(pid: u32, ticks_per_second: u64) -> Result<(String, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name is in parentheses and may hold spaces; after it, the state is the
    // first field and utime, stime the 12th and 13th (fields 14 and 15 in proc(5)).
    let (head, rest) = stat.rsplit_once(')').context("/proc/<pid>/stat")?;
    let comm = head.split_once('(').map(|(_, c)| c).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<u64> {
        Ok(fields
            .get(i)
            .context("a field of /proc/<pid>/stat")?
            .parse()?)
    };
    let ticks = field(11)? + field(12)?;
    Ok((
        comm.to_owned(),
        Duration::from_secs_f64(ticks as f64 / ticks_per_second as f64),
    ))
}

/// The time a single-threaded process has spent on a CPU, to the nanosecond
/// (`/proc/<pid>/schedstat`), where [`proc_stat`] rounds to clock ticks (10 ms): summed
/// over twenty Postgres backends, the ticks' rounding would be a fifth of what a bench
/// measures. Only the main thread's: [`proc_stat`] for a threaded process.
pub fn on_cpu(pid: u32) -> Result<Duration> {
    let schedstat = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))?;
    let ns: u64 = schedstat
        .split_whitespace()
        .next()
        .context("/proc/<pid>/schedstat")?
        .parse()?;
    Ok(Duration::from_nanos(ns))
}

pub fn usage(pid: u32, ticks_per_second: u64) -> Result<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .with_context(|| format!("{key} in /proc/{pid}/status"))
    };
    Ok(Usage {
        rss: kib("VmRSS:")? * 1024,
        peak: kib("VmHWM:")? * 1024,
        cpu: proc_stat(pid, ticks_per_second)?.1,
        fds: std::fs::read_dir(format!("/proc/{pid}/fd"))?.count(),
    })
}
