//! The test harness: a real brain on loopback, over a fresh Postgres database and the real
//! Redis, talking to the scripted provider (the one double: no LLM can run here).
//!
//! Each test gets its own database (a copy of a template migrated once per migration set,
//! dropped after an hour by a later run), so tests run in parallel and may install
//! triggers freely.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use brain::AppState;
use engine::config::Config;
use futures_util::StreamExt;
use protocol::ui::UiChunk;
use scripted_provider::ScriptedProvider;
use serde_json::{Value, json};
use store::Store;
use tokio_util::sync::CancellationToken;

use test_support::db::db_url;

pub mod manager;
pub mod mcp;
pub mod oauth_servers;
pub mod platform;
pub mod replies;
pub mod slack;
pub mod telegram;

/// How soon a stop or a hang-up must end a command or a stream for the tests that check
/// it happens at once: far under the commands' 30 s and any idle window, with room for a
/// machine loaded by a parallel build (the usual figure, printed by the tests, is a few
/// milliseconds; timings are measured by the bench, not asserted here).
pub const PROMPTLY: Duration = Duration::from_secs(5);

/// A migrated database of its own.
pub async fn fresh_store() -> (Store, String) {
    let name = migrated_database().await;
    let store = Store::connect(&db_url(&name), 10).await.unwrap();
    // Nothing to apply on a copy of the template: this checks that it has every migration
    // the store's migrator has, under the same checksums.
    store.migrate().await.unwrap();
    (store, name)
}

/// A database of its own with every migration applied, copied from the template of this
/// migration set (`test_support::db::migrated_database`): its name.
pub async fn migrated_database() -> String {
    let migrations = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../store/migrations");
    test_support::db::migrated_database("brain_test", &migrations, |url| async move {
        let options = test_support::db::connect_options(&url);
        let pool = sqlx::PgPool::connect_with(options).await.unwrap();
        Store::from_pool(pool.clone()).migrate().await.unwrap();
        pool.close().await;
    })
    .await
}

pub struct TestApp {
    pub url: String,
    /// The metrics listener's base URL (`BRAIN_METRICS_ADDR`, apart from the API).
    pub metrics_url: String,
    pub store: Store,
    pub provider: ScriptedProvider,
    pub team: protocol::TeamId,
    pub key: String,
    pub http: reqwest::Client,
    pub db_name: String,
    /// The brain's background tasks, for a test that adds one which ends.
    pub supervisor: brain::supervisor::Supervisor,
    shutdown: CancellationToken,
    /// The transaction pooler the brain reaches Postgres through, under
    /// `TEST_THROUGH_PGBOUNCER=1` (O5); the test itself keeps its direct `store`.
    _pooler: Option<std::sync::Arc<test_support::pgbouncer::PgBouncer>>,
    config: Config,
    /// The environment `config` was read from, for brain processes beside this one.
    env: HashMap<String, String>,
}

/// A clock pinned at the last UTC noon before now: twelve hours from any day's or month's
/// edge however long the test runs, and before every row Postgres writes during it, so
/// those rows count in its day and month (a period's usage is counted from its start).
pub fn pinned_clock() -> engine::clock::Clock {
    let now = chrono::Utc::now();
    let noon = now.date_naive().and_time(chrono::NaiveTime::MIN) + chrono::TimeDelta::hours(12);
    let noon = noon.and_utc();
    let last = if noon <= now {
        noon
    } else {
        noon - chrono::TimeDelta::days(1)
    };
    engine::clock::Clock::pinned(last)
}

/// Whether this run puts every brain on the shared Redis Cluster (O5):
/// `TEST_REDIS_CLUSTER=1`, which `make test` sets for the subset of tests that matter on a
/// cluster (the `cluster` target of the Makefile). A test that sets its own Redis URL
/// (a dead one, a proxy) is not in that subset.
pub fn cluster_mode() -> bool {
    std::env::var("TEST_REDIS_CLUSTER").is_ok_and(|v| v == "1")
}

impl TestApp {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Starts a brain; `tweak` adjusts the configuration after the provider URLs are set.
    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> Self {
        let (store, db_name) = fresh_store().await;
        let provider = ScriptedProvider::start().await.unwrap();
        let mut env: HashMap<String, String> = HashMap::new();
        env.insert("OPENAI_BASE_URL".into(), provider.openai_base_url());
        env.insert("OPENAI_API_KEY".into(), "sk-test-openai".into());
        env.insert("ANTHROPIC_BASE_URL".into(), provider.anthropic_base_url());
        env.insert("ANTHROPIC_API_KEY".into(), "sk-test-anthropic".into());
        // A title call after each chat's first turn would take the replies the tests
        // script for their turns: the tests of titles turn it on (`titles.rs`).
        env.insert("BRAIN_CHAT_TITLES".into(), "false".into());
        env.insert("BRAIN_ADDR".into(), "127.0.0.1:0".into());
        env.insert(
            "SESSION_TOKEN_KEY".into(),
            test_support::SESSION_TOKEN_KEY.into(),
        );
        env.insert("DATABASE_URL".into(), db_url(&db_name));
        // Artifacts of a test live in its own temporary directory, never in the tree.
        let artifacts = std::env::temp_dir().join(format!("brain-test-artifacts-{db_name}"));
        env.insert(
            "BRAIN_ARTIFACTS_DIR".into(),
            artifacts.to_string_lossy().into_owned(),
        );
        if let Ok(redis) = std::env::var("REDIS_URL") {
            env.insert("REDIS_URL".into(), redis);
        }
        let pooler = through_pgbouncer().then(|| {
            let pooler = test_support::pgbouncer::PgBouncer::start(POOLER_SERVER_CONNECTIONS);
            env.insert("DATABASE_URL".into(), pooler.url_for(&db_url(&db_name)));
            env.insert("DATABASE_DIRECT_URL".into(), db_url(&db_name));
            std::sync::Arc::new(pooler)
        });
        // Through the environment, so brain processes beside this one share the cluster.
        if cluster_mode() {
            let cluster = test_support::redis_cluster::shared().urls_list();
            env.insert("REDIS_CLUSTER_URLS".into(), cluster);
        }
        let mut config = Config::from_env(&env).unwrap();
        let env_copy = env.clone();
        let configured_pool = config.database_max_connections;
        tweak(&mut config);
        let mut config_copy = config.clone();
        let redis =
            engine::redis::Client::open(&config.redis_url, config.redis_cluster_urls.as_deref())
                .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        // The public URL defaults to BRAIN_ADDR, whose port 0 only the bind resolves; a
        // test that set its own keeps it.
        if config.oauth.public_url == "http://127.0.0.1:0" {
            config.oauth.public_url = url.clone();
            config_copy.oauth.public_url = url.clone();
        }
        // A tweaked database URL (a fault proxy in front of the test's database) or pool
        // size is the brain's; the test itself keeps the direct connection to look at rows.
        let pool_size = if config.database_max_connections == configured_pool {
            10
        } else {
            config.database_max_connections
        };
        let brain_store = if config.database_url == db_url(&db_name) && pool_size == 10 {
            store.clone()
        } else {
            brain_store(&config, pool_size).await
        };
        let state = AppState::new(config, brain_store, redis).unwrap();
        let shutdown = CancellationToken::new();
        let metrics_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics_url = format!("http://{}", metrics_listener.local_addr().unwrap());
        // Not stopped by `shutdown`: a test scrapes through the drain, as Prometheus does.
        tokio::spawn(brain::metrics_server::serve(
            metrics_listener,
            state.metrics.clone(),
            CancellationToken::new(),
        ));
        let supervisor = state.supervisor.clone();
        tokio::spawn(brain::serve(listener, state, shutdown.clone()));
        let created = store.create_team("test team").await.unwrap();
        Self {
            supervisor,
            url,
            metrics_url,
            store,
            provider,
            team: created.team_id,
            key: created.api_key,
            http: reqwest::Client::new(),
            db_name,
            shutdown,
            _pooler: pooler,
            config: config_copy,
            env: env_copy,
        }
    }

    /// A second brain replica over the same database and Redis (SPEC W4): its URL.
    pub async fn second_replica(&self) -> String {
        self.second_replica_with(|_| {}).await.0
    }

    /// A second replica whose configuration `tweak` adjusts (another Redis URL, say): its
    /// URL and its state, for what a test drives directly (its sessions).
    pub async fn second_replica_with(&self, tweak: impl FnOnce(&mut Config)) -> (String, AppState) {
        let mut config = self.config.clone();
        tweak(&mut config);
        let store = brain_store(&config, 10).await;
        let redis =
            engine::redis::Client::open(&config.redis_url, config.redis_cluster_urls.as_deref())
                .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = AppState::new(config, store, redis).unwrap();
        tokio::spawn(brain::serve(
            listener,
            state.clone(),
            self.shutdown.child_token(),
        ));
        (url, state)
    }

    pub fn auth(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        req.bearer_auth(&self.key)
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> reqwest::Response {
        self.auth(self.http.post(format!("{}{path}", self.url)))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.auth(self.http.get(format!("{}{path}", self.url)))
            .send()
            .await
            .unwrap()
    }

    /// An agent on `model` (with `fallbacks`) and a chat with it: (agent id, chat id).
    pub async fn agent_and_chat(&self, model: &str, fallbacks: &[&str]) -> (String, String) {
        let agent = self
            .post_json(
                "/v1/agents",
                &json!({"name": "a", "system_prompt": "You are terse.", "model": model, "fallback_models": fallbacks}),
            )
            .await;
        assert_eq!(agent.status(), 201);
        let agent: Value = agent.json().await.unwrap();
        let agent_id = agent["id"].as_str().unwrap().to_owned();
        let chat = self.new_chat(&agent_id).await;
        (agent_id, chat)
    }

    /// A new API key of the team with the `chat` scope.
    pub async fn chat_key(&self) -> String {
        let created = self
            .post_json("/v1/keys", &json!({"name": "frontend", "scope": "chat"}))
            .await;
        assert_eq!(created.status(), 201);
        let created: Value = created.json().await.unwrap();
        created["api_key"].as_str().unwrap().to_owned()
    }

    /// A new chat with `agent`: its id.
    pub async fn new_chat(&self, agent: &str) -> String {
        let chat = self
            .post_json(&format!("/v1/agents/{agent}/chats"), &json!({}))
            .await;
        assert_eq!(chat.status(), 201);
        let chat: Value = chat.json().await.unwrap();
        chat["id"].as_str().unwrap().to_owned()
    }

    pub async fn send(&self, chat: &str, body: &Value) -> reqwest::Response {
        self.post_json(&format!("/v1/chats/{chat}/messages"), body)
            .await
    }

    /// Posts `content` to the chat on a raw connection that never reads its answer: a
    /// client that stopped reading, held open while the caller keeps the socket.
    pub async fn post_unread(&self, chat: &str, content: &str) -> tokio::net::TcpStream {
        use tokio::io::AsyncWriteExt;
        let address = self.url.trim_start_matches("http://").to_owned();
        let body = serde_json::json!({ "content": content }).to_string();
        let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
        socket
            .write_all(
                format!(
                    "POST /v1/chats/{chat}/messages HTTP/1.1\r\nhost: {address}\r\n\
                     authorization: Bearer {}\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\n\r\n{body}",
                    self.key,
                    body.len()
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        socket
    }

    pub async fn messages(&self, chat: &str) -> Vec<Value> {
        let response = self.get(&format!("/v1/chats/{chat}/messages")).await;
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        body["messages"].as_array().unwrap().clone()
    }

    /// The Prometheus text of this app's `/metrics`.
    pub async fn metrics(&self) -> String {
        scrape(&self.http, &self.metrics_url).await
    }

    /// Scrapes until the series `name` (no labels) reads `want`, or fails after 5 s.
    pub async fn wait_gauge(&self, name: &str, want: f64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let scrape = self.metrics().await;
            if test_support::promtool::sample(&scrape, name, &[]) == Some(want) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name} is not {want}:\n{scrape}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The turn rows of this app's database: (status, error_code).
    pub async fn turns(&self) -> Vec<(String, Option<String>)> {
        sqlx::query_as("SELECT status, error_code FROM turns ORDER BY started_at")
            .fetch_all(self.store.pool())
            .await
            .unwrap()
    }

    /// Waits until no turn is running (the turn task persists after the stream ends).
    pub async fn settled(&self) -> Vec<(String, Option<String>)> {
        for _ in 0..200 {
            let turns = self.turns().await;
            if turns.iter().all(|(s, _)| s != "running") {
                return turns;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("a turn is still running");
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.provider.shutdown();
    }
}

/// A key of the team with `scope`, made over the API: its secret and its id.
pub async fn key_with_scope(app: &TestApp, scope: &str) -> (String, String) {
    let created = app
        .post_json("/v1/keys", &json!({"name": scope, "scope": scope}))
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    (
        created["api_key"].as_str().unwrap().to_owned(),
        created["id"].as_str().unwrap().to_owned(),
    )
}

/// Posts `content` to `chat` as `bearer` and reads the stream to its end.
pub async fn send_as(app: &TestApp, bearer: &str, chat: &str, content: &str) -> Vec<UiChunk> {
    let response = app
        .http
        .post(format!("{}/v1/chats/{chat}/messages", app.url))
        .bearer_auth(bearer)
        .json(&json!({"content": content}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (chunks, done) = read_stream(response).await;
    assert!(done, "{chunks:?}");
    app.settled().await;
    chunks
}

/// An agent of the `light` profile (the worker tools) and a chat with it: their ids.
pub async fn light_agent(app: &TestApp) -> (String, String) {
    let agent: Value = app
        .post_json(
            "/v1/agents",
            &json!({"name": "hands", "system_prompt": "Use your shell.", "model": "openai/gpt-test",
                    "runtime_profile": "light"}),
        )
        .await
        .json()
        .await
        .unwrap();
    let agent = agent["id"].as_str().unwrap().to_owned();
    let chat = app.new_chat(&agent).await;
    (agent, chat)
}

/// An error answer's status and `error.code`.
pub async fn error_code(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    (status, body["error"]["code"].as_str().unwrap().to_owned())
}

/// Reads a whole UI message stream: the chunks, and whether `[DONE]` ended it.
pub async fn read_stream(response: reqwest::Response) -> (Vec<UiChunk>, bool) {
    let mut body = String::new();
    let mut bytes = response.bytes_stream();
    while let Some(piece) = bytes.next().await {
        body.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
    }
    parse_events(&body)
}

pub fn parse_events(body: &str) -> (Vec<UiChunk>, bool) {
    let mut chunks = Vec::new();
    let mut done = false;
    for event in body.split("\n\n").filter(|e| !e.is_empty()) {
        let data = event
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("not an SSE data event: {event:?}"));
        assert!(!done, "an event after [DONE]");
        if data == "[DONE]" {
            done = true;
        } else {
            chunks.push(
                serde_json::from_str(data).unwrap_or_else(|e| panic!("bad chunk {data}: {e}")),
            );
        }
    }
    (chunks, done)
}

/// The text of all text-delta chunks.
pub fn streamed_text(chunks: &[UiChunk]) -> String {
    chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::TextDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect()
}

pub fn words(text: &str) -> Vec<String> {
    text.split_inclusive(' ').map(str::to_owned).collect()
}

impl TestApp {
    /// The chat's events stream (S2), opened now and read until a turn's `finish`: its
    /// raw text.
    pub async fn observe(&self, chat: &str) -> tokio::task::JoinHandle<String> {
        let response = self
            .auth(
                self.http
                    .get(format!("{}/v1/chats/{chat}/events", self.url)),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        tokio::spawn(async move {
            let mut body = response.bytes_stream();
            let mut seen = String::new();
            while !seen.contains(r#""type":"finish""#) {
                match tokio::time::timeout(Duration::from_secs(30), body.next()).await {
                    Ok(Some(Ok(piece))) => seen.push_str(&String::from_utf8_lossy(&piece)),
                    _ => panic!("the events stream ended before the turn's finish: {seen}"),
                }
            }
            seen
        })
    }

    /// SIGTERM, as far as the server is concerned.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    /// The DATABASE_URL of this app's database, for driving the binary.
    pub fn store_url(&self) -> String {
        db_url(&self.db_name)
    }

    /// `DATABASE_URL` and `DATABASE_DIRECT_URL` as the brain has them, for a process
    /// beside it (the runtime-manager): through the pooler when the brain is.
    pub fn database_env(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![("DATABASE_URL", self.config.database_url.clone())];
        if let Some(direct) = &self.config.database_direct_url {
            vars.push(("DATABASE_DIRECT_URL", direct.clone()));
        }
        vars
    }
}

/// `TEST_THROUGH_PGBOUNCER=1`: every brain of the test reaches its database through a
/// PgBouncer of its own in transaction mode (O5); `make test` runs the subset of the
/// tests that matters so (the Makefile's `pooler` target).
pub fn through_pgbouncer() -> bool {
    std::env::var("TEST_THROUGH_PGBOUNCER").is_ok_and(|v| v == "1")
}

/// Server connections per database the test's PgBouncer lends: fewer than a brain's
/// pool, so clients take turns on them and a statement that relied on keeping its server
/// connection between two exchanges would meet another client's.
pub const POOLER_SERVER_CONNECTIONS: u32 = 4;

/// The brain's store as its configuration has it (through the pooler or not).
pub async fn brain_store(config: &Config, pool_size: u32) -> Store {
    Store::connect_configured(
        &config.database_url,
        config.database_direct_url.as_deref(),
        pool_size,
        store::DEFAULT_STATEMENT_TIMEOUT,
    )
    .await
    .unwrap()
}

/// A brain replica as a real process over the app's database and Redis (its environment,
/// plus `extra`), for tests that kill a replica: SIGKILLed on drop.
pub struct BrainProcess {
    pub url: String,
    /// Its metrics listener's base URL (`BRAIN_METRICS_ADDR`).
    pub metrics_url: String,
    child: tokio::process::Child,
}

impl BrainProcess {
    pub async fn start(app: &TestApp, extra: &[(&str, &str)]) -> Self {
        // A free port, released for the brain to bind right after: another process of the
        // parallel tests may take it in between, so a start that fails is tried again on
        // another port (any other failure fails every attempt the same way).
        for _ in 0..3 {
            if let Some(started) = Self::try_start(app, extra).await {
                return started;
            }
        }
        panic!("the brain process exited at start, three times");
    }

    async fn try_start(app: &TestApp, extra: &[(&str, &str)]) -> Option<Self> {
        // Both held until both are known, so they differ.
        let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let scrape = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (addr, metrics_addr) = (api.local_addr().unwrap(), scrape.local_addr().unwrap());
        drop((api, scrape));
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_brain"))
            .arg("serve")
            .envs(&app.env)
            .envs(extra.iter().copied())
            .env("BRAIN_ADDR", addr.to_string())
            .env("BRAIN_METRICS_ADDR", metrics_addr.to_string())
            .env("BRAIN_LOG", "warn")
            .kill_on_drop(true)
            .spawn()
            .expect("the brain binary is built with its tests");
        let url = format!("http://{addr}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if child.try_wait().unwrap().is_some() {
                return None;
            }
            if let Ok(ready) = app.http.get(format!("{url}/readyz")).send().await
                && ready.status() == 200
            {
                return Some(Self {
                    url,
                    metrics_url: format!("http://{metrics_addr}"),
                    child,
                });
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the brain process was not ready within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM, then waits for the process to exit: the drain, as Kubernetes starts it.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().expect("the brain process is running");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the brain process did not stop within 30 s of SIGTERM")
            .unwrap()
    }

    /// The Prometheus text of this process' `/metrics`.
    pub async fn metrics(&self, http: &reqwest::Client) -> String {
        scrape(http, &self.metrics_url).await
    }

    /// The process id, to read its memory in `/proc`.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the brain process is running")
    }

    /// SIGKILL: the replica stops at once, without a word to anyone.
    pub async fn kill(&mut self) {
        self.child.kill().await.unwrap();
    }
}

/// The Prometheus text served at `metrics_url`'s `/metrics`.
async fn scrape(http: &reqwest::Client, metrics_url: &str) -> String {
    http.get(format!("{metrics_url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}
