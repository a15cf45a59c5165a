//! Hands: a worker's first tool call on a cold session and on a warm pool, tool calls on
//! a reused session, workspace snapshots and their restore, and how soon a client's hang-up kills the command a call runs; with
//! a release runtime-manager child on the local launcher.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures_util::StreamExt;
use scripted_provider::{Reply, ToolCall};
use serde_json::{Value, json};

use crate::system::{
    Row, SseData, System, bin, db_url, instant_ok, ms, pct, redis_url, row, sorted,
};

/// Hang-ups timed, and how often `/proc` is looked at meanwhile.
const HANGUPS: usize = 40;
const POLL: Duration = Duration::from_micros(200);
/// errno "no such process".
const ESRCH: i32 = 3;

pub(crate) struct Manager {
    child: tokio::process::Child,
    pub(crate) workspaces: PathBuf,
}

impl Manager {
    async fn start(system: &System, namespace: &str, profiles: Option<Value>) -> Result<Self> {
        Self::start_with(system, namespace, profiles, &[]).await
    }

    /// [`Manager::start`] with `extra` variables added to (or replacing) the manager's.
    async fn start_with(
        system: &System,
        namespace: &str,
        profiles: Option<Value>,
        extra: &[(&str, &str)],
    ) -> Result<Self> {
        Self::launch(&system.db_name, &system.url, namespace, profiles, extra)
    }

    /// A manager over database `db_name` whose workers dial `public_url`.
    pub(crate) fn launch(
        db_name: &str,
        public_url: &str,
        namespace: &str,
        profiles: Option<Value>,
        extra: &[(&str, &str)],
    ) -> Result<Self> {
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
            .env("DATABASE_URL", db_url(db_name))
            .env("REDIS_URL", redis_url())
            .env("SESSION_QUEUE_NAMESPACE", namespace)
            .env("SESSION_TOKEN_KEY", test_support::SESSION_TOKEN_KEY)
            .env("BRAIN_PUBLIC_URL", public_url)
            .env("RUNTIME_MANAGER_WORKER_BIN", bin("worker")?)
            .env("RUNTIME_MANAGER_WORKSPACES", &workspaces)
            .env("RUNTIME_MANAGER_IDLE_WINDOW_MS", "60000")
            .env("RUNTIME_MANAGER_LOG", "warn")
            .env("RUNTIME_MANAGER_METRICS_ADDR", "off")
            .envs(extra.iter().copied())
            .kill_on_drop(true)
            .spawn()?;
        Ok(Self { child, workspaces })
    }

    /// SIGTERM (the manager stops its workers), then SIGKILL after 5 s.
    pub(crate) async fn stop(mut self) {
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
    let mut sse = SseData::default();
    let (mut asked, mut answered, mut failed) = (None, None, false);
    while let Some(piece) = body.next().await {
        for data in sse.push(&piece?) {
            if data == "[DONE]" {
                continue;
            }
            let chunk: Value = serde_json::from_str(&data)?;
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

/// One fresh agent's first worker tool call whose arguments stream for about 1.5 s (a
/// model writing a longer command): input complete → output, the wait speculative
/// provisioning shortens (W11).
async fn first_slow_call(system: &System, n: usize) -> Result<Duration> {
    let (_, chat) = system.agent_and_chat(Some("light")).await?;
    let id = format!("slow{n}");
    let arguments = json!({"command": format!("true # {}", "x".repeat(110))}).to_string();
    let fragment = 8;
    let pieces = arguments.len().div_ceil(fragment) as u32;
    system.provider.push(Reply::PacedToolCalls {
        calls: vec![ToolCall {
            id: id.clone(),
            name: "shell".into(),
            arguments,
        }],
        fragment,
        delay: Duration::from_millis(1500) / pieces,
    });
    system.provider.push(instant_ok());
    let (took, failed) = timed_tool_turn(system.send(&chat, "go").await?, &id).await?;
    if failed {
        bail!("the first tool call failed");
    }
    Ok(took)
}

/// The first call's wait with and without speculative provisioning, back to back.
pub async fn speculation(rows: &mut Vec<Row>) -> Result<()> {
    for (label, grace) in [("on", "10000"), ("off", "0")] {
        let namespace = format!("bench-{}", uuid::Uuid::new_v4().simple());
        let system = System::start_with(
            Some(namespace.clone()),
            &[("BRAIN_WORKER_SPECULATION_GRACE_MS", grace)],
        )
        .await?;
        let manager = Manager::start(&system, &namespace, None).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut waits = Vec::new();
        for n in 0..8 {
            waits.push(first_slow_call(&system, n).await?);
        }
        let waits = sorted(waits);
        rows.push(row(
            &format!("hands: first call, speculation {label}"),
            "args stream 1.5 s; input complete->output",
            ms(pct(&waits, 50.0)),
            ms(pct(&waits, 99.0)),
            format!("{} fresh agents, local launcher", waits.len()),
        ));
        eprintln!("bench: speculation {label} done");
        manager.stop().await;
        system.close().await;
    }
    Ok(())
}

/// Polls `query` (one row, one boolean, `$1` bound to `bind`) every 20 ms until it holds;
/// the instant it did.
async fn when(system: &System, query: &str, bind: &str, within: Duration) -> Result<Instant> {
    let deadline = Instant::now() + within;
    loop {
        let (holds,): (bool,) = sqlx::query_as(sqlx::AssertSqlSafe(query.to_owned()))
            .bind(bind)
            .fetch_one(system.store.pool())
            .await?;
        if holds {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("not within {within:?}: {query}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Workspace snapshots (W10): a workspace of random bytes (incompressible, the worst case)
/// torn down idle; the time from the snapshot asked (the session row `requested`) to it
/// stored (its row written: packed, uploaded through the brain, stored), then the chat's
/// next call, whose new worker restores the workspace before it dials.
pub async fn snapshots(rows: &mut Vec<Row>) -> Result<()> {
    for mib in [10u64, 200] {
        let namespace = format!("bench-{}", uuid::Uuid::new_v4().simple());
        let system = System::start(Some(namespace.clone())).await?;
        let manager = Manager::start_with(
            &system,
            &namespace,
            None,
            &[
                ("RUNTIME_MANAGER_IDLE_WINDOW_MS", "1500"),
                // The restore runs before the dial: the dial timeout covers it.
                ("RUNTIME_MANAGER_DIAL_TIMEOUT_MS", "120000"),
            ],
        )
        .await?;
        let (agent, chat) = system.agent_and_chat(Some("light")).await?;
        let command = format!("head -c {mib}M /dev/urandom > data.bin");
        system
            .provider
            .push(tool_call("write", "shell", json!({ "command": command })));
        system.provider.push(instant_ok());
        timed_tool_turn(system.send(&chat, "write").await?, "write").await?;
        let asked = when(
            &system,
            "SELECT EXISTS (SELECT 1 FROM agent_runtime_sessions \
             WHERE agent_id = $1::uuid AND snapshot_state = 'requested')",
            &agent,
            Duration::from_secs(60),
        )
        .await?;
        let stored = when(
            &system,
            "SELECT EXISTS (SELECT 1 FROM workspace_snapshots WHERE agent_id = $1::uuid)",
            &agent,
            Duration::from_secs(120),
        )
        .await?;
        when(
            &system,
            "SELECT NOT EXISTS (SELECT 1 FROM agent_runtime_sessions \
             WHERE agent_id = $1::uuid AND state NOT IN ('terminated', 'failed'))",
            &agent,
            Duration::from_secs(60),
        )
        .await?;
        system.provider.push(tool_call(
            "read",
            "shell",
            json!({"command": "wc -c < data.bin"}),
        ));
        system.provider.push(instant_ok());
        let (restored, failed) = timed_tool_turn(system.send(&chat, "read").await?, "read").await?;
        if failed {
            bail!("the call after the restore failed");
        }
        rows.push(row(
            &format!("snapshots: {mib} MiB workspace"),
            "asked->stored; next call, restore incl.",
            ms(stored.duration_since(asked)),
            ms(restored),
            "one sample each: p50 column the snapshot, p99 column the next call".to_owned(),
        ));
        eprintln!("bench: snapshots {mib} MiB done");
        manager.stop().await;
        system.close().await;
    }
    Ok(())
}

async fn idle_pool_slots(system: &System) -> Result<i64> {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM worker_pool WHERE state = 'idle'")
        .fetch_one(system.store.pool())
        .await?;
    Ok(n)
}

pub async fn hands(rows: &mut Vec<Row>) -> Result<()> {
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

/// Sends a message on `chat`; while the agent's previous turn still winds down after its
/// hang-up, the brain answers 409 `agent_busy`, and the send is tried again.
async fn send_when_idle(system: &System, chat: &str) -> Result<reqwest::Response> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = system.send(chat, "run it").await?;
        if response.status() == 200 {
            return Ok(response);
        }
        if response.status() != 409 || Instant::now() > deadline {
            bail!("turn: {} {}", response.status(), response.text().await?);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `/proc/<pid>/stat` from `hung_up` until the process is gone: (killed, reaped).
/// Killed is when it turned zombie (or vanished, if that came first): it runs no more.
/// Reaped is when its entry vanished: the worker collected its exit.
fn wait_gone(pid: u32, hung_up: Instant) -> Result<(Duration, Duration)> {
    let path = format!("/proc/{pid}/stat");
    let deadline = hung_up + Duration::from_secs(10);
    let mut killed = None;
    loop {
        match std::fs::read_to_string(&path) {
            // ESRCH: the entry went away between the open and the read.
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(ESRCH) =>
            {
                let reaped = hung_up.elapsed();
                return Ok((killed.unwrap_or(reaped), reaped));
            }
            Err(e) => return Err(e.into()),
            // The state follows the command name, which is in parentheses.
            Ok(stat) => {
                let state = stat
                    .rsplit_once(") ")
                    .and_then(|(_, rest)| rest.chars().next());
                if killed.is_none() && matches!(state, Some('Z' | 'X')) {
                    killed = Some(hung_up.elapsed());
                }
            }
        }
        if Instant::now() > deadline {
            bail!("the command (pid {pid}) was still there 10 s after the hang-up");
        }
        std::thread::sleep(POLL);
    }
}

/// One call of a long command on the reused session: reads the stream until the command
/// printed its pid, hangs up, and times the command's end.
async fn hang_up_once(system: &System, chat: &str, n: usize) -> Result<(Duration, Duration)> {
    let id = format!("hang{n}");
    // `exec` keeps the pid: the one printed is the one that must die.
    system.provider.push(tool_call(
        &id,
        "shell",
        json!({"command": "echo $$; exec sleep 30"}),
    ));
    let mut body = send_when_idle(system, chat).await?.bytes_stream();
    let mut sse = SseData::default();
    let pid: u32 = 'read: loop {
        let Some(piece) = body.next().await else {
            bail!("the stream ended before the command printed its pid");
        };
        for data in sse.push(&piece?) {
            if data == "[DONE]" {
                continue;
            }
            let chunk: Value = serde_json::from_str(&data)?;
            if chunk["type"] == "data-worker-log" && chunk["data"]["toolCallId"] == id.as_str() {
                let text = chunk["data"]["text"].as_str().unwrap_or_default();
                break 'read text.trim().parse()?;
            }
        }
    };
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        bail!("the command (pid {pid}) ended before the hang-up");
    }
    let hung_up = Instant::now();
    drop(body);
    tokio::task::spawn_blocking(move || wait_gone(pid, hung_up)).await?
}

/// Client hang-up during a worker call → the command's process gone: the turn's cancel,
/// the brain's `notifications/cancelled` over the channel, the worker's `killpg`.
pub async fn hangup(rows: &mut Vec<Row>) -> Result<()> {
    let namespace = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let system = System::start(Some(namespace.clone())).await?;
    let manager = Manager::start(&system, &namespace, None).await?;
    let (_, chat) = system.agent_and_chat(Some("light")).await?;
    // The session is made here, so every timed call runs on a reused one.
    system
        .provider
        .push(tool_call("setup", "shell", json!({"command": "true"})));
    system.provider.push(instant_ok());
    timed_tool_turn(system.send(&chat, "setup").await?, "setup").await?;
    let (mut killed, mut reaped) = (Vec::new(), Vec::new());
    for n in 0..HANGUPS {
        let (k, r) = hang_up_once(&system, &chat, n).await?;
        killed.push(k);
        reaped.push(r);
    }
    let (killed, reaped) = (sorted(killed), sorted(reaped));
    let other = format!(
        "{HANGUPS} calls on a reused session, /proc polled every {} ms",
        POLL.as_secs_f64() * 1000.0
    );
    rows.push(row(
        "hands: hang-up -> command killed",
        "client drops stream -> pid zombie or gone",
        ms(pct(&killed, 50.0)),
        ms(pct(&killed, 99.0)),
        other.clone(),
    ));
    rows.push(row(
        "hands: hang-up -> command reaped",
        "client drops stream -> /proc/<pid> gone",
        ms(pct(&reaped, 50.0)),
        ms(pct(&reaped, 99.0)),
        other,
    ));
    eprintln!("bench: hands hang-up done");
    manager.stop().await;
    system.close().await;
    Ok(())
}
