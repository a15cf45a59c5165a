//! The bench harness (issue 6): starts a brain in-process over a fresh Postgres database
//! and the local Redis, the scripted provider on loopback, and (for the hands scenarios)
//! a release runtime-manager child with the local launcher; runs each scenario and prints
//! one table. Not a test: `make bench` builds everything in release and runs it.
//!
//! Environment: `BENCH_DATABASE_URL` (admin URL, default the local Postgres), `REDIS_URL`
//! (default redis://127.0.0.1:6379), `BENCH_SECONDS` (window per concurrency level,
//! default 5), `BENCH_ONLY` (comma-separated scenario names: turn, busy, hands).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use brain::AppState;
use brain::config::Config;
use brain::store::Store;
use futures_util::StreamExt;
use scripted_provider::{Reply, ScriptedProvider, ToolCall};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const ADMIN_URL_DEFAULT: &str = "postgres://postgres:postgres@127.0.0.1:5432/postgres";
const REDIS_DEFAULT: &str = "redis://127.0.0.1:6379";

fn admin_url() -> String {
    std::env::var("BENCH_DATABASE_URL").unwrap_or_else(|_| ADMIN_URL_DEFAULT.to_owned())
}

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| REDIS_DEFAULT.to_owned())
}

fn db_url(name: &str) -> String {
    let admin = admin_url();
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    format!("{base}/{name}")
}

/// One row of the table.
struct Row {
    scenario: String,
    metric: String,
    p50: String,
    p99: String,
    other: String,
}

fn row(scenario: &str, metric: &str, p50: String, p99: String, other: String) -> Row {
    Row {
        scenario: scenario.to_owned(),
        metric: metric.to_owned(),
        p50,
        p99,
        other,
    }
}

/// Nearest-rank percentile of a sorted slice.
fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn signed_ms(a: Duration, b: Duration) -> String {
    format!("{:.3} ms", (a.as_secs_f64() - b.as_secs_f64()) * 1000.0)
}

fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort();
    v
}

/// A brain in this process, its database, its scripted provider, and a team.
struct System {
    url: String,
    store: Store,
    provider: ScriptedProvider,
    key: String,
    http: reqwest::Client,
    db_name: String,
    shutdown: CancellationToken,
}

impl System {
    async fn start(queue_namespace: Option<String>) -> Result<Self> {
        let admin = sqlx::PgPool::connect(&admin_url())
            .await
            .context("Postgres must run (make services starts it)")?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        // The `brain_test_` prefix lets the test harness drop what a crashed run leaves.
        let db_name = format!("brain_test_{now}_bench{}", uuid::Uuid::new_v4().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE \"{db_name}\""
        )))
        .execute(&admin)
        .await?;
        admin.close().await;
        let store = Store::connect(&db_url(&db_name), 20).await?;
        store.migrate().await?;
        let provider = ScriptedProvider::start().await?;
        let mut env: HashMap<String, String> = HashMap::new();
        env.insert("OPENAI_BASE_URL".into(), provider.openai_base_url());
        env.insert("OPENAI_API_KEY".into(), "sk-bench-openai".into());
        env.insert("ANTHROPIC_BASE_URL".into(), provider.anthropic_base_url());
        env.insert("ANTHROPIC_API_KEY".into(), "sk-bench-anthropic".into());
        env.insert("BRAIN_ADDR".into(), "127.0.0.1:0".into());
        env.insert("DATABASE_URL".into(), db_url(&db_name));
        env.insert("REDIS_URL".into(), redis_url());
        let artifacts = std::env::temp_dir().join(format!("brain-bench-artifacts-{db_name}"));
        env.insert(
            "BRAIN_ARTIFACTS_DIR".into(),
            artifacts.to_string_lossy().into_owned(),
        );
        let mut config = Config::from_env(&env).map_err(|e| anyhow!("config: {e}"))?;
        if let Some(ns) = queue_namespace {
            config.workers.queue_namespace = ns;
        }
        let redis = redis::Client::open(config.redis_url.as_str())?;
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
        })
    }

    async fn post_json(&self, path: &str, body: &Value) -> Result<reqwest::Response> {
        Ok(self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.key)
            .json(body)
            .send()
            .await?)
    }

    /// An agent (on `profile` if given) and a chat with it: (agent id, chat id).
    async fn agent_and_chat(&self, profile: Option<&str>) -> Result<(String, String)> {
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
        let chat = self
            .post_json(&format!("/v1/agents/{agent_id}/chats"), &json!({}))
            .await?;
        if chat.status() != 201 {
            bail!("create chat: {}", chat.status());
        }
        let chat: Value = chat.json().await?;
        Ok((agent_id, chat["id"].as_str().context("chat id")?.to_owned()))
    }

    async fn send(&self, chat: &str, content: &str) -> Result<reqwest::Response> {
        self.post_json(
            &format!("/v1/chats/{chat}/messages"),
            &json!({ "content": content }),
        )
        .await
    }

    async fn close(self) {
        self.shutdown.cancel();
        self.provider.shutdown();
        self.store.pool().close().await;
        if let Ok(admin) = sqlx::PgPool::connect(&admin_url()).await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.db_name
            )))
            .execute(&admin)
            .await;
        }
    }
}

fn instant_ok() -> Reply {
    Reply::Text {
        deltas: vec!["ok".into()],
        delay: Duration::ZERO,
    }
}

/// One turn read to its end: (first body byte, first text-delta, end), from the send.
async fn timed_turn(system: &System, chat: &str) -> Result<(Duration, Duration, Duration)> {
    system.provider.push(instant_ok());
    let started = Instant::now();
    let response = system.send(chat, "hi").await?;
    if response.status() != 200 {
        bail!("turn: {} {}", response.status(), response.text().await?);
    }
    let mut body = response.bytes_stream();
    let (mut first_byte, mut first_delta) = (None, None);
    let mut seen = String::new();
    while let Some(piece) = body.next().await {
        let piece = piece?;
        let now = started.elapsed();
        first_byte.get_or_insert(now);
        if first_delta.is_none() {
            seen.push_str(&String::from_utf8_lossy(&piece));
            if seen.contains("\"text-delta\"") {
                first_delta = Some(now);
            }
        }
    }
    let end = started.elapsed();
    if !seen.contains("\"text-delta\"") {
        bail!("a turn streamed no text: {seen}");
    }
    Ok((first_byte.unwrap_or(end), first_delta.unwrap_or(end), end))
}

/// A request straight to the scripted provider, body shaped like the brain's: (first
/// body byte, end).
async fn timed_provider(system: &System) -> Result<(Duration, Duration)> {
    system.provider.push(instant_ok());
    let body = json!({
        "model": "gpt-test",
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "hi"}
        ]
    });
    let started = Instant::now();
    let response = system
        .http
        .post(format!(
            "{}/chat/completions",
            system.provider.openai_base_url()
        ))
        .bearer_auth("sk-bench-openai")
        .json(&body)
        .send()
        .await?;
    let mut stream = response.bytes_stream();
    let mut first = None;
    while let Some(piece) = stream.next().await {
        piece?;
        first.get_or_insert(started.elapsed());
    }
    let end = started.elapsed();
    Ok((first.unwrap_or(end), end))
}

fn window() -> Duration {
    let secs = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(5.0);
    Duration::from_secs_f64(secs)
}

async fn turn_overhead(rows: &mut Vec<Row>) -> Result<()> {
    for concurrency in [1usize, 16, 64, 256] {
        let system = std::sync::Arc::new(System::start(None).await?);
        let mut chats = Vec::new();
        for _ in 0..concurrency {
            chats.push(system.agent_and_chat(None).await?.1);
        }
        // Warm-up: one turn per chat (connections, prepared statements), then the window.
        let warm = chats.iter().map(|chat| timed_turn(&system, chat));
        for result in futures_util::future::join_all(warm).await {
            result?;
        }
        let until = Instant::now() + window();
        let started = Instant::now();
        let tasks: Vec<_> = chats
            .iter()
            .cloned()
            .map(|chat| {
                let system = system.clone();
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    while Instant::now() < until {
                        out.push(timed_turn(&system, &chat).await?);
                    }
                    anyhow::Ok(out)
                })
            })
            .collect();
        let mut samples = Vec::new();
        for task in tasks {
            samples.extend(task.await??);
        }
        let elapsed = started.elapsed();
        // The provider alone at the same concurrency, same client, same body shape.
        let until = Instant::now() + window().min(Duration::from_secs(2));
        let tasks: Vec<_> = (0..concurrency)
            .map(|_| {
                let system = system.clone();
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    while Instant::now() < until {
                        out.push(timed_provider(&system).await?);
                    }
                    anyhow::Ok(out)
                })
            })
            .collect();
        let mut provider = Vec::new();
        for task in tasks {
            provider.extend(task.await??);
        }
        let byte = sorted(samples.iter().map(|s| s.0).collect());
        let delta = sorted(samples.iter().map(|s| s.1).collect());
        let end = sorted(samples.iter().map(|s| s.2).collect());
        let p_first = sorted(provider.iter().map(|s| s.0).collect());
        let p_end = sorted(provider.iter().map(|s| s.1).collect());
        let scenario = format!("turn overhead c={concurrency}");
        let n = samples.len();
        rows.push(row(
            &scenario,
            "client TTFB (first body byte)",
            ms(pct(&byte, 50.0)),
            ms(pct(&byte, 99.0)),
            format!("{n} turns"),
        ));
        rows.push(row(
            &scenario,
            "client first text-delta",
            ms(pct(&delta, 50.0)),
            ms(pct(&delta, 99.0)),
            String::new(),
        ));
        rows.push(row(
            &scenario,
            "provider TTFB (direct)",
            ms(pct(&p_first, 50.0)),
            ms(pct(&p_first, 99.0)),
            format!(
                "{} requests, end p50 {}",
                provider.len(),
                ms(pct(&p_end, 50.0))
            ),
        ));
        rows.push(row(
            &scenario,
            "brain added TTFB (text-delta - provider)",
            signed_ms(pct(&delta, 50.0), pct(&p_first, 50.0)),
            signed_ms(pct(&delta, 99.0), pct(&p_first, 99.0)),
            "difference of percentiles".into(),
        ));
        rows.push(row(
            &scenario,
            "end to end",
            ms(pct(&end, 50.0)),
            ms(pct(&end, 99.0)),
            format!("{:.0} turns/s", n as f64 / elapsed.as_secs_f64()),
        ));
        eprintln!("bench: turn overhead at concurrency {concurrency} done ({n} turns)");
        if let Ok(system) = std::sync::Arc::try_unwrap(system) {
            system.close().await;
        }
    }
    Ok(())
}

async fn busy_answer(rows: &mut Vec<Row>) -> Result<()> {
    let system = System::start(None).await?;
    let (agent, chat) = system.agent_and_chat(None).await?;
    let other: Value = system
        .post_json(&format!("/v1/agents/{agent}/chats"), &json!({}))
        .await?
        .json()
        .await?;
    let other = other["id"].as_str().context("chat id")?.to_owned();
    system.provider.push(Reply::Text {
        deltas: vec!["slow ".into(); 100],
        delay: Duration::from_millis(100),
    });
    let slow = system.send(&chat, "slow").await?;
    if slow.status() != 200 {
        bail!("slow turn: {}", slow.status());
    }
    let mut timings = Vec::new();
    for i in 0..210 {
        let started = Instant::now();
        let busy = system.send(&other, "two").await?;
        let status = busy.status();
        let body = busy.bytes().await?;
        let took = started.elapsed();
        if status != 409 {
            bail!(
                "expected 409, got {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        // The first ten warm the connection.
        if i >= 10 {
            timings.push(took);
        }
    }
    drop(slow);
    let timings = sorted(timings);
    rows.push(row(
        "busy answer",
        "409 agent_busy round trip",
        ms(pct(&timings, 50.0)),
        ms(pct(&timings, 99.0)),
        format!("{} tries", timings.len()),
    ));
    eprintln!("bench: busy answer done");
    system.close().await;
    Ok(())
}

/// The workspace's binaries, next to this one.
fn bin(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(exe.parent().context("binary directory")?.join(name))
}

struct Manager {
    child: tokio::process::Child,
    workspaces: PathBuf,
}

impl Manager {
    async fn start(system: &System, namespace: &str, profiles: Option<Value>) -> Result<Self> {
        let workspaces =
            std::env::temp_dir().join(format!("rm-bench-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&workspaces)?;
        let manager = bin("runtime-manager")?;
        if !manager.exists() {
            bail!(
                "{} is missing: run `cargo build --release --bins` (make bench does)",
                manager.display()
            );
        }
        let mut command = tokio::process::Command::new(manager);
        if let Some(profiles) = profiles {
            let file = workspaces.join("profiles.json");
            std::fs::write(&file, profiles.to_string())?;
            command.env("RUNTIME_MANAGER_PROFILES", file);
        }
        let child = command
            .env("DATABASE_URL", db_url(&system.db_name))
            .env("REDIS_URL", redis_url())
            .env("SESSION_QUEUE_NAMESPACE", namespace)
            .env("BRAIN_PUBLIC_URL", &system.url)
            .env("RUNTIME_MANAGER_WORKER_BIN", bin("worker")?)
            .env("RUNTIME_MANAGER_WORKSPACES", &workspaces)
            .env("RUNTIME_MANAGER_IDLE_WINDOW_MS", "60000")
            .env("RUNTIME_MANAGER_LOG", "warn")
            .kill_on_drop(true)
            .spawn()?;
        Ok(Self { child, workspaces })
    }

    /// SIGTERM (the manager stops its workers), then SIGKILL after 5 s.
    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
        let _ = std::fs::remove_dir_all(&self.workspaces);
    }
}

fn tool_call(id: &str, name: &str, arguments: Value) -> Reply {
    Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.to_string(),
        }],
        fragment: 0,
    }
}

/// Reads a turn with one tool call `call` to its end: tool-input-available →
/// tool-output-available (or -error) as seen by the client, and whether it errored.
async fn timed_tool_turn(response: reqwest::Response, call: &str) -> Result<(Duration, bool)> {
    if response.status() != 200 {
        bail!("turn: {}", response.status());
    }
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let (mut asked, mut answered, mut failed) = (None, None, false);
    while let Some(piece) = body.next().await {
        buffer.push_str(&String::from_utf8_lossy(&piece?));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let chunk: Value = serde_json::from_str(data)?;
            if chunk["toolCallId"] != call {
                continue;
            }
            match chunk["type"].as_str() {
                Some("tool-input-available") => asked = Some(Instant::now()),
                Some("tool-output-available") => answered = Some(Instant::now()),
                Some("tool-output-error") => {
                    answered = Some(Instant::now());
                    failed = true;
                }
                _ => {}
            }
        }
    }
    match (asked, answered) {
        (Some(a), Some(b)) => Ok((b.duration_since(a), failed)),
        _ => bail!("the stream carried no tool input/output for {call}"),
    }
}

/// One fresh agent's first worker tool call (`shell true`): input → output.
async fn first_call(system: &System, n: usize) -> Result<Duration> {
    let (_, chat) = system.agent_and_chat(Some("light")).await?;
    let id = format!("first{n}");
    system
        .provider
        .push(tool_call(&id, "shell", json!({"command": "true"})));
    system.provider.push(instant_ok());
    let (took, failed) = timed_tool_turn(system.send(&chat, "go").await?, &id).await?;
    if failed {
        bail!("the first tool call failed");
    }
    Ok(took)
}

async fn idle_pool_slots(system: &System) -> Result<i64> {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM worker_pool WHERE state = 'idle'")
        .fetch_one(system.store.pool())
        .await?;
    Ok(n)
}

async fn hands(rows: &mut Vec<Row>) -> Result<()> {
    // Cold and reused, with no pool.
    let namespace = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let system = System::start(Some(namespace.clone())).await?;
    let manager = Manager::start(&system, &namespace, None).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut cold = Vec::new();
    for n in 0..10 {
        cold.push(first_call(&system, n).await?);
    }
    let cold = sorted(cold);
    rows.push(row(
        "hands: cold first call",
        "shell `true`, input->output at client",
        ms(pct(&cold, 50.0)),
        ms(pct(&cold, 99.0)),
        format!("{} fresh agents, local launcher", cold.len()),
    ));
    eprintln!("bench: hands cold done");

    let (_, chat) = system.agent_and_chat(Some("light")).await?;
    system.provider.push(tool_call(
        "setup",
        "shell",
        json!({"command": "echo small > small.txt"}),
    ));
    system.provider.push(instant_ok());
    timed_tool_turn(system.send(&chat, "setup").await?, "setup").await?;
    let mut reused = Vec::new();
    for n in 0..210 {
        let id = format!("r{n}");
        system
            .provider
            .push(tool_call(&id, "read_file", json!({"path": "small.txt"})));
        system.provider.push(instant_ok());
        let (took, failed) = timed_tool_turn(system.send(&chat, "read").await?, &id).await?;
        if failed {
            bail!("read_file failed on the reused session");
        }
        if n >= 10 {
            reused.push(took);
        }
    }
    let reused = sorted(reused);
    rows.push(row(
        "hands: reused session",
        "read_file small, input->output at client",
        ms(pct(&reused, 50.0)),
        ms(pct(&reused, 99.0)),
        format!("{} calls, one turn each", reused.len()),
    ));
    eprintln!("bench: hands reused done");
    manager.stop().await;
    system.close().await;

    // Warm pool.
    let namespace = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let system = System::start(Some(namespace.clone())).await?;
    let profiles = json!({"profiles": {"light": {"warmPoolSize": 1}}});
    let manager = Manager::start(&system, &namespace, Some(profiles)).await?;
    let mut warm = Vec::new();
    for n in 0..10 {
        let deadline = Instant::now() + Duration::from_secs(30);
        while idle_pool_slots(&system).await? < 1 {
            if Instant::now() > deadline {
                bail!("the warm pool never filled");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        warm.push(first_call(&system, n).await?);
    }
    let warm = sorted(warm);
    rows.push(row(
        "hands: warm pool first call",
        "shell `true`, input->output at client",
        ms(pct(&warm, 50.0)),
        ms(pct(&warm, 99.0)),
        format!("{} fresh agents, warmPoolSize 1", warm.len()),
    ));
    eprintln!("bench: hands warm pool done");
    manager.stop().await;
    system.close().await;
    Ok(())
}

fn print_table(rows: &[Row]) {
    let headers = ["scenario", "metric", "p50", "p99", "other"];
    let cells: Vec<[&str; 5]> = rows
        .iter()
        .map(|r| {
            [
                r.scenario.as_str(),
                r.metric.as_str(),
                r.p50.as_str(),
                r.p99.as_str(),
                r.other.as_str(),
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for line in &cells {
        for (w, c) in widths.iter_mut().zip(line) {
            *w = (*w).max(c.len());
        }
    }
    let print = |line: [&str; 5]| {
        let parts: Vec<String> = line
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("| {} |", parts.join(" | "));
    };
    print(headers);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    println!("|-{}-|", rule.join("-|-"));
    for line in cells {
        print(line);
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let wants = |name: &str| only.is_empty() || only.split(',').any(|s| s.trim() == name);
    let mut rows = Vec::new();
    if wants("turn") {
        turn_overhead(&mut rows).await?;
    }
    if wants("busy") {
        busy_answer(&mut rows).await?;
    }
    if wants("hands") {
        hands(&mut rows).await?;
    }
    print_table(&rows);
    Ok(())
}
