//! The test harness: a real brain on loopback, over a fresh Postgres database and the real
//! Redis, talking to the scripted provider (the one double: no LLM can run here).
//!
//! Each test gets its own database (created from the admin URL, migrated, dropped after an
//! hour by a later run), so tests run in parallel and may install triggers freely.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use brain::AppState;
use brain::config::Config;
use brain::store::Store;
use futures_util::StreamExt;
use protocol::ui::UiChunk;
use scripted_provider::ScriptedProvider;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub const ADMIN_URL_DEFAULT: &str = "postgres://postgres:postgres@127.0.0.1:5432/postgres";

pub fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL").unwrap_or_else(|_| ADMIN_URL_DEFAULT.to_owned())
}

fn db_url(name: &str) -> String {
    let admin = admin_url();
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    format!("{base}/{name}")
}

/// A migrated database of its own.
pub async fn fresh_store() -> (Store, String) {
    let admin = sqlx::PgPool::connect(&admin_url())
        .await
        .expect("Postgres must run (make test starts it)");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Databases of runs that crashed: anything older than an hour.
    let stale: Vec<(String,)> =
        sqlx::query_as("SELECT datname FROM pg_database WHERE datname LIKE 'brain_test_%'")
            .fetch_all(&admin)
            .await
            .unwrap();
    for (name,) in stale {
        let born: u64 = name
            .split('_')
            .nth(2)
            .and_then(|s| s.parse().ok())
            .unwrap_or(now);
        if now.saturating_sub(born) > 3600 {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
            )))
            .execute(&admin)
            .await;
        }
    }
    let name = format!("brain_test_{now}_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&admin)
        .await
        .unwrap();
    let url = db_url(&name);
    let store = Store::connect(&url, 10).await.unwrap();
    store.migrate().await.unwrap();
    (store, name)
}

pub struct TestApp {
    pub url: String,
    pub store: Store,
    pub provider: ScriptedProvider,
    pub team: protocol::TeamId,
    pub key: String,
    pub http: reqwest::Client,
    pub db_name: String,
    shutdown: CancellationToken,
    config: Config,
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
        env.insert("BRAIN_ADDR".into(), "127.0.0.1:0".into());
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
        let mut config = Config::from_env(&env).unwrap();
        tweak(&mut config);
        let config_copy = config.clone();
        let redis = redis::Client::open(config.redis_url.as_str()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = AppState::new(config, store.clone(), redis).unwrap();
        let shutdown = CancellationToken::new();
        tokio::spawn(brain::serve(listener, state, shutdown.clone()));
        let created = store.create_team("test team").await.unwrap();
        Self {
            url,
            store,
            provider,
            team: created.team_id,
            key: created.api_key,
            http: reqwest::Client::new(),
            db_name,
            shutdown,
            config: config_copy,
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
        let store = Store::connect(&self.store_url(), 10).await.unwrap();
        let redis = redis::Client::open(config.redis_url.as_str()).unwrap();
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
        let chat = self
            .post_json(&format!("/v1/agents/{agent_id}/chats"), &json!({}))
            .await;
        assert_eq!(chat.status(), 201);
        let chat: Value = chat.json().await.unwrap();
        (agent_id, chat["id"].as_str().unwrap().to_owned())
    }

    pub async fn send(&self, chat: &str, body: &Value) -> reqwest::Response {
        self.post_json(&format!("/v1/chats/{chat}/messages"), body)
            .await
    }

    pub async fn messages(&self, chat: &str) -> Vec<Value> {
        let response = self.get(&format!("/v1/chats/{chat}/messages")).await;
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        body["messages"].as_array().unwrap().clone()
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
    /// SIGTERM, as far as the server is concerned.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    /// The DATABASE_URL of this app's database, for driving the binary.
    pub fn store_url(&self) -> String {
        db_url(&self.db_name)
    }
}
