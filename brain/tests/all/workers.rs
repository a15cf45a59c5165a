//! Hands on demand, end to end (SPEC W1-W8, T8): a real runtime-manager (local-process
//! launcher) and real worker binaries, over the real queue, Postgres and Redis. Only the
//! model is scripted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::manager::{TempDir, bin, manager_command};
use crate::common::replies::text;
use crate::common::{BrainProcess, TestApp, light_agent, parse_events, read_stream, streamed_text};
use futures_util::StreamExt;
use protocol::channel::SessionState;
use protocol::ui::UiChunk;
use scripted_provider::{Reply, ToolCall};
use serde_json::{Value, json};
use sha2::Digest;

pub(crate) struct Manager {
    child: tokio::process::Child,
    workspaces: TempDir,
}

impl Manager {
    /// Where the local launcher keeps each session's workspace directory.
    pub(crate) fn workspaces(&self) -> &std::path::Path {
        &self.workspaces.0
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A brain whose queue namespace is its own, and a runtime-manager serving it.
pub(crate) async fn system(
    idle_window_ms: u64,
    tweak: impl FnOnce(&mut engine::config::Config),
) -> (TestApp, Manager) {
    system_with_profiles(idle_window_ms, None, tweak).await
}

/// [`system`], with a RuntimeProfiles file (JSON) for the runtime-manager.
pub(crate) async fn system_with_profiles(
    idle_window_ms: u64,
    profiles: Option<Value>,
    tweak: impl FnOnce(&mut engine::config::Config),
) -> (TestApp, Manager) {
    let idle_window = idle_window_ms.to_string();
    system_with(
        profiles,
        &[("RUNTIME_MANAGER_IDLE_WINDOW_MS", &idle_window)],
        tweak,
    )
    .await
}

/// [`system`], with `env` added to (or replacing) the runtime-manager's variables.
pub(crate) async fn system_with(
    profiles: Option<Value>,
    env: &[(&str, &str)],
    tweak: impl FnOnce(&mut engine::config::Config),
) -> (TestApp, Manager) {
    let (app, namespace) = app_with_own_queue(tweak).await;
    let manager = start_manager_with(&app, &namespace, profiles, &app.url, env);
    (app, manager)
}

/// A brain whose queue namespace is its own: the app, and the namespace for its manager.
async fn app_with_own_queue(tweak: impl FnOnce(&mut engine::config::Config)) -> (TestApp, String) {
    let namespace = format!("test-{}", uuid::Uuid::new_v4().simple());
    let ns = namespace.clone();
    let app = TestApp::start_with(move |c| {
        c.workers.queue_namespace = ns;
        tweak(c);
    })
    .await;
    (app, namespace)
}

/// A runtime-manager consuming `namespace` for `app`'s database, whose workers dial
/// `public_url` (the app itself, or a [`Service`] in front of several replicas).
fn start_manager(
    app: &TestApp,
    namespace: &str,
    idle_window_ms: u64,
    profiles: Option<Value>,
    public_url: &str,
) -> Manager {
    let idle_window = idle_window_ms.to_string();
    start_manager_with(
        app,
        namespace,
        profiles,
        public_url,
        &[("RUNTIME_MANAGER_IDLE_WINDOW_MS", &idle_window)],
    )
}

/// [`start_manager`], with `env` added to (or replacing) the manager's variables.
fn start_manager_with(
    app: &TestApp,
    namespace: &str,
    profiles: Option<Value>,
    public_url: &str,
    env: &[(&str, &str)],
) -> Manager {
    let workspaces = TempDir::new();
    let mut command = manager_command(app, namespace, public_url, &workspaces);
    if let Some(profiles) = profiles {
        let file = workspaces.0.join("profiles.json");
        std::fs::write(&file, profiles.to_string()).unwrap();
        command.env("RUNTIME_MANAGER_PROFILES", file);
    }
    command.envs(env.iter().copied());
    let child = command
        .spawn()
        .expect("the runtime-manager binary is built with the workspace");
    Manager { child, workspaces }
}

/// The manager's variables that run its workers unconfined (development only): for a
/// worker that is a script around the real one, which its sandbox would not hold.
const UNCONFINED: [(&str, &str); 2] = [
    ("RUNTIME_MANAGER_LOCAL_UNCONFINED", "true"),
    ("AGENT_RUNTIME_DEV", "true"),
];

/// An executable script in `dir` that runs `body` (a POSIX shell script).
fn script(dir: &TempDir, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.0.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A first call, after which the chat's session is `ready` with its worker.
async fn warm_up(app: &TestApp, chat: &str) {
    app.provider.push(shell("warm", "echo ready"));
    app.provider.push(text("ok"));
    read_stream(app.send(chat, &json!({"content": "warm up"})).await).await;
    app.settled().await;
}

/// The model calls tool `name` with `arguments`.
pub(crate) fn call(id: &str, name: &str, arguments: Value) -> Reply {
    Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.to_string(),
        }],
        fragment: 32,
    }
}

pub(crate) fn shell(id: &str, command: &str) -> Reply {
    call(id, "shell", json!({ "command": command }))
}

pub(crate) fn output_of(chunks: &[UiChunk], call: &str) -> String {
    chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::ToolOutputAvailable {
                tool_call_id,
                output,
            } if tool_call_id == call => Some(output.as_str().unwrap_or_default().to_owned()),
            UiChunk::ToolOutputError {
                tool_call_id,
                error_text,
            } if tool_call_id == call => Some(format!("ERROR {error_text}")),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no output for {call} in {chunks:?}"))
}

/// The artifact a `stored artifact <id> (…)` tool output names, downloaded.
async fn download_stored(app: &TestApp, stored: &str) -> reqwest::Response {
    let id = stored
        .strip_prefix("stored artifact ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{stored}"));
    let download = app.get(&format!("/v1/artifacts/{id}")).await;
    assert_eq!(download.status(), 200);
    download
}

fn worker_states(chunks: &[UiChunk]) -> Vec<SessionState> {
    chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::DataWorkerStatus { data } => Some(data.state),
            _ => None,
        })
        .collect()
}

async fn sessions(app: &TestApp, agent: &str) -> Vec<Value> {
    let body: Value = app
        .get(&format!("/v1/agents/{agent}/sessions"))
        .await
        .json()
        .await
        .unwrap();
    body["sessions"].as_array().unwrap().clone()
}

pub(crate) async fn worker_pid(app: &TestApp) -> i32 {
    let (worker_ref,): (Option<String>,) = sqlx::query_as(
        "SELECT worker_ref FROM agent_runtime_sessions ORDER BY created_at DESC LIMIT 1",
    )
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    worker_ref
        .unwrap()
        .strip_prefix("local:")
        .unwrap()
        .parse()
        .unwrap()
}

/// Reads a stream until a command's live output says `pid=<n>` (from `echo pid=$$`):
/// the output line, not the command text in the tool input. The pid is the host's: the
/// command printed its own in its worker's PID namespace (`app`'s newest worker).
async fn pid_from_live_output(
    app: &TestApp,
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
) -> i32 {
    let inner = printed_pid(body).await;
    let worker = worker_pid(app).await as u32;
    test_support::sandbox::host_pid(worker, inner as u32)
        .map(|pid| pid as i32)
        .unwrap_or_else(|| panic!("no process {inner} under the worker {worker}"))
}

async fn printed_pid(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
) -> i32 {
    const MARK: &str = "\"text\":\"pid=";
    let mut seen = String::new();
    loop {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
        if let Some(at) = seen.find(MARK) {
            let rest = &seen[at + MARK.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if !digits.is_empty() && rest[digits.len()..].starts_with(|c: char| !c.is_ascii_digit())
            {
                return digits.parse().unwrap();
            }
        }
    }
}

/// Reads a stream until a command's live output starts with `marker` (the output line,
/// not the command text in the tool input): the stream's text so far.
async fn read_until_output(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    marker: &str,
) -> String {
    let mark = format!("\"text\":\"{marker}");
    let mut seen = String::new();
    while !seen.contains(&mark) {
        let piece = body
            .next()
            .await
            .expect("the stream ended before the output");
        seen.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
    }
    seen
}

/// The stream's chunks, and whether it ended with `[DONE]`: `seen` (read from its start),
/// then the rest of `body`.
async fn read_rest(
    mut seen: String,
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
) -> (Vec<UiChunk>, bool) {
    while let Some(piece) = body.next().await {
        seen.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
    }
    parse_events(&seen)
}

/// Waits for the agent's newest session to end `terminated` (idle teardown) and for its
/// worker process `pid` to be gone.
async fn torn_down(app: &TestApp, agent: &str, pid: i32, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let listed = sessions(app, agent).await;
        if listed[0]["state"] == "terminated" {
            break;
        }
        assert!(Instant::now() < deadline, "never torn down: {listed:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for _ in 0..50 {
        if !alive(pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!alive(pid), "the worker process {pid} is gone");
}

pub(crate) fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.contains(") Z "))
        .unwrap_or(false)
}

/// Timestamps of the first tool-input-available and tool-output chunks of `call`.
async fn timed_stream(response: reqwest::Response, call: &str) -> (Vec<UiChunk>, Duration) {
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut chunks = Vec::new();
    let (mut asked, mut answered) = (None, None);
    while let Some(piece) = body.next().await {
        buffer.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let data = event.trim().strip_prefix("data: ").unwrap().to_owned();
            if data == "[DONE]" {
                continue;
            }
            let chunk: UiChunk = serde_json::from_str(&data).unwrap();
            match &chunk {
                UiChunk::ToolInputAvailable { tool_call_id, .. } if tool_call_id == call => {
                    asked = Some(Instant::now())
                }
                UiChunk::ToolOutputAvailable { tool_call_id, .. }
                | UiChunk::ToolOutputError { tool_call_id, .. }
                    if tool_call_id == call =>
                {
                    answered = Some(Instant::now())
                }
                _ => {}
            }
            chunks.push(chunk);
        }
    }
    (chunks, answered.unwrap().duration_since(asked.unwrap()))
}

/// The local launcher detaches its workers (they outlive a manager's restart); a test's must
/// not outlive the test, or they re-dial its brain's port after another test took it.
#[tokio::test]
async fn a_tests_workers_end_with_its_workspaces() {
    let (app, manager) = system(60_000, |_| {}).await;
    let (_agent, chat) = light_agent(&app).await;
    warm_up(&app, &chat).await;
    let pid = worker_pid(&app).await;
    assert!(alive(pid));
    drop(manager);
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "worker {pid} outlived its workspaces"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_shell_call_provisions_a_worker_reuses_it_and_idle_ends_it() {
    let (app, _manager) = system(3_000, |_| {}).await;
    let (agent, chat) = light_agent(&app).await;

    app.provider.push(shell("c1", "echo hi"));
    app.provider.push(text("The worker said hi."));
    let response = app.send(&chat, &json!({"content": "run echo hi"})).await;
    assert_eq!(response.status(), 200);
    let (chunks, cold) = timed_stream(response, "c1").await;
    println!("first worker tool call (cold, local launcher): {cold:?}");
    assert!(output_of(&chunks, "c1").contains("hi"), "{chunks:?}");
    let logs: Vec<&UiChunk> = chunks
        .iter()
        .filter(|c| matches!(c, UiChunk::DataWorkerLog { .. }))
        .collect();
    assert!(
        !logs.is_empty(),
        "live output reached the stream: {chunks:?}"
    );
    assert_eq!(streamed_text(&chunks), "The worker said hi.");
    let states = worker_states(&chunks);
    assert_eq!(states.first(), Some(&SessionState::Pending), "{states:?}");
    // The waiting call shows the states it observes, in lifecycle order (it polls, so a
    // fast launch may skip one).
    let order = [
        SessionState::Pending,
        SessionState::Provisioning,
        SessionState::Connecting,
        SessionState::Ready,
    ];
    let positions: Vec<usize> = states
        .iter()
        .map(|s| order.iter().position(|o| o == s).unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{states:?}");
    // The model's second request carried the shell result.
    assert!(app.provider.requests()[1].body.to_string().contains("hi"));
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["state"], "ready");
    let pid = worker_pid(&app).await;
    assert!(alive(pid));

    // A second turn inside the idle window reuses the session: no new row, no status parts.
    app.provider.push(shell("c2", "echo again"));
    app.provider.push(text("Again."));
    let (chunks, warm) = timed_stream(
        app.send(&chat, &json!({"content": "once more"})).await,
        "c2",
    )
    .await;
    println!("worker tool call on a reused session: {warm:?}");
    assert!(output_of(&chunks, "c2").contains("again"));
    assert!(
        worker_states(&chunks).is_empty(),
        "a live session is reused without provisioning"
    );
    assert_eq!(sessions(&app, &agent).await.len(), 1);
    assert!(app.provider.violations().is_empty());
    // O2: a worker tool is counted under its own name.
    let calls = test_support::promtool::sample(
        &app.metrics().await,
        "brain_tool_calls_total",
        &[("tool", "shell"), ("outcome", "ok")],
    );
    assert_eq!(calls, Some(2.0));

    // Idle teardown: the window passes with no use; the worker is stopped.
    torn_down(&app, &agent, pid, Duration::from_secs(15)).await;
}

/// Output with NUL bytes (binary on stdout) is stored with U+FFFD in their place,
/// and the multi-step answer around it is kept, not lost with a refused write.
#[tokio::test]
async fn shell_output_with_nul_bytes_keeps_the_answer() {
    let (app, _manager) = system(60_000, |_| {}).await;
    let (_, chat) = light_agent(&app).await;
    app.provider
        .push(shell("bin", "printf 'a\\000b\\n'; head -c 64 /bin/ls"));
    app.provider.push(text("It printed binary."));
    let body = json!({"content": "show me binary", "message_id": "nul-worker"});
    let (chunks, done) = read_stream(app.send(&chat, &body).await).await;
    assert!(done);
    assert!(
        output_of(&chunks, "bin").contains("a\u{FFFD}b"),
        "{chunks:?}"
    );
    assert_eq!(streamed_text(&chunks), "It printed binary.");
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: protocol::ui::FinishReason::Stop
        }),
        "{chunks:?}"
    );
    assert_eq!(app.settled().await, vec![("completed".to_owned(), None)]);
    let messages = app.messages(&chat).await;
    let parts = messages[1]["parts"].to_string();
    assert!(parts.contains("a\u{FFFD}b"), "{parts}");
    assert!(parts.contains("It printed binary."), "{parts}");
    // The model read the same text the store kept.
    assert!(
        app.provider.requests()[1]
            .body
            .to_string()
            .contains("a\u{FFFD}b")
    );
    // A retry of the message id replays the stored answer.
    let (replayed, _) = read_stream(app.send(&chat, &body).await).await;
    assert_eq!(streamed_text(&replayed), "It printed binary.");
    assert_eq!(app.provider.requests().len(), 2);
}

#[tokio::test]
async fn closing_the_stream_kills_the_running_command_and_the_session_survives() {
    let (app, _manager) = system(60_000, |_| {}).await;
    let (agent, chat) = light_agent(&app).await;
    warm_up(&app, &chat).await;

    app.provider
        .push(shell("long", "echo pid=$$; exec sleep 30"));
    let response = app.send(&chat, &json!({"content": "sleep"})).await;
    let mut body = response.bytes_stream();
    let pid = pid_from_live_output(&app, &mut body).await;
    assert!(alive(pid));
    let hung_up = Instant::now();
    drop(body);
    while alive(pid) {
        assert!(
            hung_up.elapsed() < crate::common::PROMPTLY,
            "pid {pid} still alive"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("client hang-up to command gone: {:?}", hung_up.elapsed());
    assert_eq!(app.settled().await.last().unwrap().0, "interrupted");

    app.provider.push(shell("after", "echo still here"));
    app.provider.push(text("ok"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "again"})).await).await;
    assert!(output_of(&chunks, "after").contains("still here"));
    assert_eq!(
        sessions(&app, &agent).await.len(),
        1,
        "the same session served it"
    );
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
}

/// T8: a stop from another replica, with the client still attached, kills the running
/// command exactly as a hang-up does; the client reads `finish` (interrupted), the call
/// keeps its synthetic result, and the session serves the next turn.
#[tokio::test]
async fn a_stop_from_another_replica_kills_the_running_command() {
    let (app, _manager) = system(60_000, |_| {}).await;
    let other = app.second_replica().await;
    let (agent, chat) = light_agent(&app).await;
    warm_up(&app, &chat).await;

    app.provider
        .push(shell("long", "echo pid=$$; exec sleep 30"));
    let response = app.send(&chat, &json!({"content": "sleep"})).await;
    let mut body = response.bytes_stream();
    let pid = pid_from_live_output(&app, &mut body).await;
    assert!(alive(pid));
    let stopped = Instant::now();
    let answer = app
        .auth(app.http.post(format!("{other}/v1/chats/{chat}/stop")))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
    while alive(pid) {
        assert!(
            stopped.elapsed() < crate::common::PROMPTLY,
            "pid {pid} still alive"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "stop from another replica to command gone: {:?}",
        stopped.elapsed()
    );
    let mut rest = String::new();
    while let Some(piece) = body.next().await {
        rest.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
    }
    // The stream was read from an event boundary on: the rest starts at one too.
    let events = rest
        .get(rest.find("data: ").unwrap_or(0)..)
        .unwrap_or_default();
    let (chunks, done) = parse_events(events);
    // The stream ends with the turn: no clone of its sender (a progress route of the
    // dropped call) holds it open after `finish`.
    let ended = stopped.elapsed();
    println!("stop from another replica to the end of the stream: {ended:?}");
    assert!(
        ended < crate::common::PROMPTLY,
        "the stream ended after {ended:?}"
    );
    assert!(done);
    assert!(
        matches!(
            chunks.last(),
            Some(UiChunk::Finish {
                finish_reason: protocol::ui::FinishReason::Interrupted
            })
        ),
        "{chunks:?}"
    );
    assert_eq!(app.settled().await.last().unwrap().0, "interrupted");
    let messages = app.messages(&chat).await;
    let answer = messages.last().unwrap();
    assert_eq!(answer["status"], "interrupted");
    let part = answer["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["toolCallId"] == "long")
        .expect("the cut-off call is in the history");
    assert!(
        part.to_string().contains("cancelled: the turn was stopped"),
        "{part}"
    );

    app.provider.push(shell("after", "echo still here"));
    app.provider.push(text("ok"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "again"})).await).await;
    assert!(output_of(&chunks, "after").contains("still here"));
    assert_eq!(
        sessions(&app, &agent).await.len(),
        1,
        "the same session served it"
    );
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
}

#[tokio::test]
async fn a_stopped_worker_is_heartbeat_lost_and_the_next_call_starts_afresh() {
    let (app, _manager) = system(60_000, |c| {
        c.workers.ping_interval = Duration::from_millis(200);
        c.workers.heartbeat_timeout = Duration::from_secs(1);
    })
    .await;
    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell("a", "echo first"));
    app.provider.push(text("ok"));
    read_stream(app.send(&chat, &json!({"content": "start"})).await).await;
    app.settled().await;
    let pid = worker_pid(&app).await;

    // SIGSTOP mid-session: the in-flight call fails once the heartbeat is lost.
    app.provider
        .push(shell("b", "echo started; sleep 3; echo late"));
    app.provider.push(text("lost it"));
    let mut body = app
        .send(&chat, &json!({"content": "slow"}))
        .await
        .bytes_stream();
    let seen = read_until_output(&mut body, "started").await;
    let stopped = Instant::now();
    // The group: the worker, and its bwrap around it.
    std::process::Command::new("kill")
        .args(["-STOP", "--", &format!("-{pid}")])
        .status()
        .unwrap();
    let (chunks, _) = read_rest(seen, &mut body).await;
    let detected = stopped.elapsed();
    println!("SIGSTOP to heartbeat_lost: {detected:?}");
    assert!(detected < Duration::from_secs(30));
    assert!(output_of(&chunks, "b").starts_with("ERROR"), "{chunks:?}");
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed[0]["state"], "failed");
    assert_eq!(listed[0]["failure_reason"], "heartbeat_lost");

    // The next call provisions a fresh session.
    app.provider.push(shell("c", "echo fresh"));
    app.provider.push(text("ok"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "again"})).await).await;
    assert!(output_of(&chunks, "c").contains("fresh"));
    assert_eq!(sessions(&app, &agent).await.len(), 2);
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
}

/// A worker that never dials ends `dial_timeout`, even with an idle window far shorter than
/// the dial timeout: idle time counts from `ready`.
#[tokio::test]
async fn a_worker_sigkilled_mid_call_ends_the_call_with_a_tool_error_and_the_next_call_provisions()
{
    let (app, _manager) = system(60_000, |_| {}).await;
    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell("a", "echo first"));
    app.provider.push(text("ok"));
    read_stream(app.send(&chat, &json!({"content": "start"})).await).await;
    app.settled().await;
    let pid = worker_pid(&app).await;

    app.provider
        .push(shell("b", "echo started; sleep 30; echo never"));
    app.provider.push(text("the worker died"));
    let mut body = app
        .send(&chat, &json!({"content": "slow"}))
        .await
        .bytes_stream();
    let seen = read_until_output(&mut body, "started").await;
    let killed = Instant::now();
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    let (chunks, done) = read_rest(seen, &mut body).await;
    let ended = killed.elapsed();
    assert!(done);
    assert!(
        ended < Duration::from_secs(15),
        "the call ended {ended:?} after the kill"
    );
    assert!(output_of(&chunks, "b").starts_with("ERROR"), "{chunks:?}");
    assert!(chunks.contains(&UiChunk::Finish {
        finish_reason: protocol::ui::FinishReason::Stop
    }));
    assert_eq!(
        app.settled().await.last(),
        Some(&("completed".to_owned(), None)),
        "a dead worker fails the call, never the turn"
    );

    // The next call provisions a fresh session, and the dead one says why it ended.
    app.provider.push(shell("c", "echo fresh"));
    app.provider.push(text("ok"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "again"})).await).await;
    assert!(output_of(&chunks, "c").contains("fresh"), "{chunks:?}");
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    let dead = listed
        .iter()
        .find(|s| s["state"] == "failed")
        .unwrap_or_else(|| panic!("the dead session is failed: {listed:?}"));
    assert!(dead["failure_reason"].is_string(), "{dead}");
}

#[tokio::test]
async fn a_worker_that_never_dials_is_a_dial_timeout() {
    let scripts = TempDir::new();
    // A "worker" that starts and never dials.
    let silent = script(&scripts, "silent-worker", "exec sleep 30");
    let silent = silent.to_str().unwrap();
    let (app, _manager) = system_with(
        None,
        &[
            ("RUNTIME_MANAGER_WORKER_BIN", silent),
            ("RUNTIME_MANAGER_DIAL_TIMEOUT_MS", "2500"),
            ("RUNTIME_MANAGER_IDLE_WINDOW_MS", "200"),
        ],
        |c| c.workers.provision_timeout = Duration::from_secs(10),
    )
    .await;
    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell("d", "echo never"));
    app.provider.push(text("no hands"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    let output = output_of(&chunks, "d");
    assert!(
        output.contains("dial_timeout"),
        "the model reads the reason: {output}"
    );
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed[0]["state"], "failed", "{listed:?}");
    assert_eq!(listed[0]["failure_reason"], "dial_timeout");
}

/// A worker that dials later than its idle window (an image pull, a cold
/// node) becomes ready and serves the call; its idle time counts from `ready`, so it is
/// torn down one window after its last use, not while it starts.
#[tokio::test]
async fn a_worker_slower_to_dial_than_its_idle_window_becomes_ready_and_serves() {
    let scripts = TempDir::new();
    let worker = bin("worker");
    let slow = script(
        &scripts,
        "slow-worker",
        &format!("sleep 3\nexec '{}' \"$@\"", worker.display()),
    );
    let (app, _manager) = system_with(
        None,
        &[
            ("RUNTIME_MANAGER_WORKER_BIN", slow.to_str().unwrap()),
            ("RUNTIME_MANAGER_IDLE_WINDOW_MS", "1500"),
            UNCONFINED[0],
            UNCONFINED[1],
        ],
        |_| {},
    )
    .await;
    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell("s", "echo slow but here"));
    app.provider.push(text("ok"));
    let started = Instant::now();
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    let took = started.elapsed();
    assert!(
        output_of(&chunks, "s").contains("slow but here"),
        "{chunks:?}"
    );
    assert!(
        took >= Duration::from_secs(3),
        "the worker dialed late: {took:?}"
    );
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "ready", "{listed:?}");
    let pid = worker_pid(&app).await;
    torn_down(&app, &agent, pid, Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_worker_on_replica_a_serves_a_turn_on_replica_b() {
    let (app, _manager) = system(60_000, |_| {}).await;
    let (agent, chat) = light_agent(&app).await;
    // Replica A (the app) provisions; the worker dials A (BRAIN_PUBLIC_URL).
    app.provider.push(shell("a1", "echo on a"));
    app.provider.push(text("ok"));
    read_stream(app.send(&chat, &json!({"content": "start on A"})).await).await;
    app.settled().await;

    let b = app.second_replica().await;
    let post_to_b = |body: Value| {
        app.http
            .post(format!("{b}/v1/chats/{chat}/messages"))
            .bearer_auth(&app.key)
            .json(&body)
            .send()
    };
    // Live output and the answer travel from A to B.
    app.provider.push(shell(
        "b1",
        "for i in 1 2 3; do echo line$i; sleep 0.05; done",
    ));
    app.provider.push(text("relayed"));
    let (chunks, _) = read_stream(post_to_b(json!({"content": "run on B"})).await.unwrap()).await;
    let output = output_of(&chunks, "b1");
    assert!(output.contains("line3"), "{output}");
    assert!(
        chunks
            .iter()
            .any(|c| matches!(c, UiChunk::DataWorkerLog { .. })),
        "live lines relayed"
    );
    assert_eq!(
        sessions(&app, &agent).await.len(),
        1,
        "B reused A's session"
    );
    app.settled().await;

    // Cancellation from B reaches the worker held by A.
    app.provider.push(shell("b2", "echo pid=$$; exec sleep 30"));
    let mut body = post_to_b(json!({"content": "sleep on B"}))
        .await
        .unwrap()
        .bytes_stream();
    let pid = pid_from_live_output(&app, &mut body).await;
    let hung_up = Instant::now();
    drop(body);
    while alive(pid) {
        assert!(
            hung_up.elapsed() < crate::common::PROMPTLY,
            "pid {pid} still alive"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "hang-up on replica B to command gone on A's worker: {:?}",
        hung_up.elapsed()
    );
}

/// A call from a replica whose Redis blips (the relay's carrier) is sent again once Redis is
/// back, within a few seconds, instead of failing at once: nothing reached the worker's
/// replica, so the command runs once (D6's soak found these failing by the dozen).
#[tokio::test]
async fn a_relayed_call_waits_out_a_redis_blip_and_runs_once() {
    let (app, _manager) = system(60_000, |_| {}).await;
    let (_, chat) = light_agent(&app).await;
    warm_up(&app, &chat).await;
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let upstream = redis.trim_start_matches("redis://").trim_end_matches('/');
    let proxy = test_support::proxy::FaultProxy::start(upstream).await;
    let proxied = format!("redis://{}", proxy.addr());
    let (b, _) = app.second_replica_with(|c| c.redis_url = proxied).await;
    let post_to_b = |content: &str| {
        app.http
            .post(format!("{b}/v1/chats/{chat}/messages"))
            .bearer_auth(&app.key)
            .json(&json!({ "content": content }))
            .send()
    };
    app.provider.push(shell("b0", "echo relayed"));
    app.provider.push(text("ok"));
    let (chunks, _) = read_stream(post_to_b("through B").await.unwrap()).await;
    assert!(output_of(&chunks, "b0").contains("relayed"));
    app.settled().await;

    proxy.set(test_support::proxy::Fault::Cut);
    let heal = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        proxy.set(test_support::proxy::Fault::None);
        proxy
    });
    app.provider
        .push(shell("b1", "echo once >> blip.log; wc -l < blip.log"));
    app.provider.push(text("done"));
    let (chunks, _) = read_stream(post_to_b("during the blip").await.unwrap()).await;
    let _proxy = heal.await.unwrap();
    let output = output_of(&chunks, "b1");
    assert!(
        !output.starts_with("ERROR") && output.lines().any(|l| l.trim() == "1"),
        "the command ran once and answered: {output:?}"
    );
}

/// A call relayed to the replica holding the worker's socket ends with a
/// tool error the model reads within seconds when that replica is SIGKILLed mid-call,
/// instead of hanging the turn until the client leaves.
/// D3: the replica holding the worker's socket dies while a relayed call runs. The caller
/// hears the owner fall silent; the worker goes on with the call and dials the survivor
/// (W9), where the call is attached to by its key: its answer is the command's own, the
/// command ran once, and the session (one row) and its workspace go on.
#[tokio::test]
async fn a_relayed_call_is_reattached_when_its_owner_replica_is_killed() {
    let (app, namespace) = app_with_own_queue(|_| {}).await;
    let mut owner = BrainProcess::start(&app, &[("SESSION_QUEUE_NAMESPACE", &namespace)]).await;
    let service = Service::start(&[&owner.url, &app.url]).await;
    let _manager = start_manager(&app, &namespace, 60_000, None, &service.url);
    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell(
        "k",
        "echo ran >> runs.log; echo pid=$$; sleep 8; echo slept-through",
    ));
    app.provider.push(shell("count", "cat runs.log"));
    app.provider.push(text("the call survived"));
    let response = app.send(&chat, &json!({"content": "sleep"})).await;
    let mut body = response.bytes_stream();
    let mut stream = String::new();
    // The worker dialed the other replica: the command's live output came through the relay.
    while !stream.contains("\"text\":\"pid=") {
        stream.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    assert_eq!(service.reached(), vec![addr_of(&owner.url)]);
    owner.kill().await;
    let killed = Instant::now();
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(piece) = body.next().await {
            stream.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the turn still hangs 30 s after its owner died"
    );
    println!("owner killed to the turn's end: {:?}", killed.elapsed());
    let (chunks, done) = parse_events(&stream);
    assert!(done);
    let output = output_of(&chunks, "k");
    assert!(
        output.contains("slept-through"),
        "the command's own answer: {output}"
    );
    assert_eq!(output_of(&chunks, "count").matches("ran").count(), 1);
    assert_eq!(streamed_text(&chunks), "the call survived");
    assert_eq!(app.settled().await, vec![("completed".into(), None)]);
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 1, "the same session: {listed:?}");
    assert_eq!(
        service.reached().last(),
        Some(&addr_of(&app.url)),
        "the worker dialed the survivor"
    );
}

/// How a test playing the calling replica on Redis (the wire format of docs/protocol.md)
/// cancels the relayed call it sent.
enum CancelSent {
    /// The key and the channel in the call's own pipeline: before the owner can have
    /// subscribed to the call's cancel channel.
    WithTheCall,
    /// Only the key, once the owner beats (it runs the call): the publish on the cancel
    /// channel lost, as a Redis blip or a bound that ran out loses it.
    KeyOnlyWhileRunning,
}

/// Sends a relayed `sleep 30` to the replica holding the worker and cancels it as `how`
/// says; the call's answer must be `cancelled` within [`common::PROMPTLY`].
async fn relayed_call_cancelled(how: CancelSent) {
    let (app, _manager) = system(60_000, |_| {}).await;
    let (agent, chat) = light_agent(&app).await;
    warm_up(&app, &chat).await;
    let session = sessions(&app, &agent).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let redis = redis::Client::open(
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
    )
    .unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let owner: String = redis::AsyncCommands::get(&mut conn, format!("worker-owner:{session}"))
        .await
        .unwrap();
    let key = uuid::Uuid::new_v4().simple().to_string();
    let mut events = redis.get_async_pubsub().await.unwrap();
    events.subscribe(format!("relay:call:{key}")).await.unwrap();
    let (turn,): (uuid::Uuid,) = sqlx::query_as("SELECT id FROM turns LIMIT 1")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    let call = json!({
        "key": key, "session": session, "tool": "shell",
        "arguments": {"command": "sleep 30"}, "call_id": "c", "chat": chat, "turn": turn,
    });
    let sent = Instant::now();
    let mut pipe = redis::pipe();
    pipe.publish(format!("relay:{owner}"), call.to_string())
        .ignore();
    if matches!(how, CancelSent::WithTheCall) {
        pipe.pset_ex(format!("relay:cancelled:{key}"), 1, 60_000)
            .ignore()
            .publish(format!("relay:cancel:{key}"), "cancel")
            .ignore();
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();
    let mut events = events.into_on_message();
    let mut cancel_pending = matches!(how, CancelSent::KeyOnlyWhileRunning);
    // The owner's first beat comes at once, the key is read a beat later.
    let deadline = tokio::time::Instant::now() + common::PROMPTLY;
    let answer = loop {
        let message = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("no answer within 5 s: the cancel was lost")
            .unwrap();
        let event: Value = serde_json::from_str(&message.get_payload::<String>().unwrap()).unwrap();
        if event["kind"] == "beat" && cancel_pending {
            cancel_pending = false;
            let _: () = redis::AsyncCommands::pset_ex(
                &mut conn,
                format!("relay:cancelled:{key}"),
                1,
                60_000,
            )
            .await
            .unwrap();
        }
        if event["kind"] != "log" && event["kind"] != "beat" {
            break event;
        }
    };
    println!("relayed call to its cancelled answer: {:?}", sent.elapsed());
    assert!(!cancel_pending, "the owner never beat");
    assert_eq!(
        answer,
        json!({"kind": "answer", "content": "cancelled", "is_error": true})
    );
}

/// A cancel published right after a relayed call, before the owner can
/// have subscribed to that call's cancel channel, still stops the call.
#[tokio::test]
async fn a_cancel_sent_right_after_a_relayed_call_is_not_lost() {
    relayed_call_cancelled(CancelSent::WithTheCall).await;
}

/// W4: a cancel whose publish was lost (only its key written) still stops a relayed call
/// that runs: the owner reads the key with each beat. Found while looking for why a
/// hang-up once left a command running (not-built-yet, "Known rough edges"); not shown to
/// be that failure's cause.
#[tokio::test]
async fn a_cancel_whose_publish_was_lost_still_stops_a_running_relayed_call() {
    relayed_call_cancelled(CancelSent::KeyOnlyWhileRunning).await;
}

/// A file near the artifact size limit, uploaded by a relayed call, is
/// stored: its bytes never ride Redis pub/sub, whose output buffer for a subscriber (32 MiB
/// hard limit by default) they would exceed base64-encoded. On several threads, as the
/// brain runs: decoding and hashing 24 MiB in a debug build would otherwise stall the
/// owner's beats past the caller's patience.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relayed_upload_near_the_size_limit_is_stored() {
    const SIZE: usize = 24 << 20;
    let (app, _manager) = system(60_000, |_| {}).await;
    let (_, chat) = light_agent(&app).await;
    app.provider.push(shell(
        "m",
        &format!("head -c {SIZE} /dev/urandom > big.bin && sha256sum big.bin"),
    ));
    app.provider.push(text("made"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "make"})).await).await;
    let made = output_of(&chunks, "m");
    let sha = made
        .split_whitespace()
        .find(|w| w.len() == 64 && w.chars().all(|c| c.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("{made}"))
        .to_owned();
    let b = app.second_replica().await;
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "u".into(),
            name: "upload_artifact".into(),
            arguments: json!({"path": "big.bin"}).to_string(),
        }],
        fragment: 32,
    });
    app.provider.push(text("uploaded"));
    let response = app
        .http
        .post(format!("{b}/v1/chats/{chat}/messages"))
        .bearer_auth(&app.key)
        .json(&json!({"content": "upload it on B"}))
        .send()
        .await
        .unwrap();
    let (chunks, took) = timed_stream(response, "u").await;
    println!("relayed upload of {SIZE} bytes: {took:?}");
    let stored = output_of(&chunks, "u");
    assert!(stored.contains(&format!("{SIZE} bytes")), "{stored}");
    let download = download_stored(&app, &stored).await;
    let bytes = download.bytes().await.unwrap();
    assert_eq!(bytes.len(), SIZE);
    let digest: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(digest, sha, "the stored bytes are the worker's file");
}

/// O3: a session left `ready` by a replica that died (no replica holds its
/// channel any more) is failed and replaced by the next call, never waited on.
#[tokio::test]
async fn a_ready_session_whose_replica_died_is_replaced() {
    // No worker will dial back: the call waits out the re-dial grace, then replaces it.
    let (app, _manager) = system(60_000, |c| {
        c.workers.redial_grace = Duration::from_millis(300)
    })
    .await;
    let (agent, chat) = light_agent(&app).await;
    let orphan = protocol::SessionId::new();
    sqlx::query(
        "INSERT INTO agent_runtime_sessions (id, team_id, agent_id, chat_id, profile, state, worker_ref) \
         VALUES ($1, $2, $3::uuid, $4::uuid, 'light', 'ready', 'local:999999')",
    )
    .bind(orphan.0)
    .bind(app.team.0)
    .bind(&agent)
    .bind(&chat)
    .execute(app.store.pool())
    .await
    .unwrap();
    app.provider.push(shell("r1", "echo replaced"));
    app.provider.push(text("ok"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    assert!(output_of(&chunks, "r1").contains("replaced"), "{chunks:?}");
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 2);
    let old = listed
        .iter()
        .find(|s| s["id"] == orphan.to_string())
        .unwrap();
    assert_eq!(old["state"], "failed");
    assert_eq!(old["failure_reason"], "heartbeat_lost");
    // Whoever noticed first: the call, after the grace, or the runtime-manager, which
    // finds no such worker running.
    let detail = old["failure_detail"].as_str().unwrap();
    assert!(
        ["no replica holds its channel", "worker_gone_on_restart"].contains(&detail),
        "{detail}"
    );
}

/// A stand-in for the brain's Kubernetes Service: workers dial it, and it forwards each
/// connection to the first of its backends that accepts, as a Service reaches any ready
/// replica. `cut` drops every open connection at once, without a WebSocket close frame, as
/// a network blip does. Which backend each connection reached is recorded, in order.
struct Service {
    url: String,
    backends: std::sync::Arc<std::sync::Mutex<Vec<std::net::SocketAddr>>>,
    open: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    reached: std::sync::Arc<std::sync::Mutex<Vec<std::net::SocketAddr>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Service {
    async fn start(backends: &[&str]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let backends = std::sync::Arc::new(std::sync::Mutex::new(
            backends.iter().map(|b| addr_of(b)).collect::<Vec<_>>(),
        ));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let reached = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let accept = tokio::spawn({
            let (backends, open, reached) = (backends.clone(), open.clone(), reached.clone());
            async move {
                while let Ok((mut down, _)) = listener.accept().await {
                    let _ = down.set_nodelay(true);
                    let targets = backends.lock().unwrap().clone();
                    let reached = reached.clone();
                    let conn = tokio::spawn(async move {
                        for target in targets {
                            if let Ok(mut up) = tokio::net::TcpStream::connect(target).await {
                                let _ = up.set_nodelay(true);
                                reached.lock().unwrap().push(target);
                                let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                                return;
                            }
                        }
                        // No backend up: the dial fails, and the worker tries again.
                    });
                    let mut open = open.lock().unwrap();
                    open.retain(|h: &tokio::task::AbortHandle| !h.is_finished());
                    open.push(conn.abort_handle());
                }
            }
        });
        Self {
            url,
            backends,
            open,
            reached,
            accept,
        }
    }

    /// Which backends new connections go to (a draining replica leaves the Service).
    fn route_to(&self, backends: &[&str]) {
        *self.backends.lock().unwrap() = backends.iter().map(|b| addr_of(b)).collect();
    }

    /// Drops every open connection: both sockets close, no close frame is sent.
    fn cut(&self) {
        for conn in self.open.lock().unwrap().drain(..) {
            conn.abort();
        }
    }

    /// The backend each connection reached, in order.
    fn reached(&self) -> Vec<std::net::SocketAddr> {
        self.reached.lock().unwrap().clone()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// `http://host:port` → its socket address.
fn addr_of(url: &str) -> std::net::SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

/// Posts a message to `chat` on the replica at `url`. A hold is released just after the
/// turn's `finish`, so a message sent right after a turn may still find it: retried on
/// `409 agent_busy` for a moment, as a client honouring it would.
async fn send_to(app: &TestApp, url: &str, chat: &str, body: &Value) -> reqwest::Response {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let response = app
            .http
            .post(format!("{url}/v1/chats/{chat}/messages"))
            .bearer_auth(&app.key)
            .json(body)
            .send()
            .await
            .unwrap();
        if response.status() != 409 || Instant::now() >= deadline {
            return response;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// W9: the replica holding a worker's socket is SIGKILLed. The worker re-dials through
/// the Service, reaches the surviving replica, and the next call, served there, finds the
/// file an earlier call wrote: the same session, its workspace intact.
#[tokio::test]
async fn a_worker_redials_the_surviving_replica_when_its_replica_is_killed() {
    let (app, namespace) = app_with_own_queue(|_| {}).await;
    let mut doomed = BrainProcess::start(&app, &[("SESSION_QUEUE_NAMESPACE", &namespace)]).await;
    let service = Service::start(&[&doomed.url, &app.url]).await;
    let _manager = start_manager(&app, &namespace, 60_000, None, &service.url);
    let (agent, chat) = light_agent(&app).await;

    app.provider.push(call(
        "w",
        "write_file",
        json!({"path": "notes/kept.txt", "content": "written before the crash"}),
    ));
    app.provider.push(text("written"));
    let (chunks, _) =
        read_stream(send_to(&app, &doomed.url, &chat, &json!({"content": "write it"})).await).await;
    assert!(!output_of(&chunks, "w").starts_with("ERROR"), "{chunks:?}");
    assert_eq!(
        service.reached(),
        vec![addr_of(&doomed.url)],
        "the doomed replica holds it"
    );
    let before = sessions(&app, &agent).await;
    assert_eq!(before.len(), 1);

    doomed.kill().await;
    app.provider
        .push(call("r", "read_file", json!({"path": "notes/kept.txt"})));
    app.provider.push(text("read"));
    let (chunks, _) =
        read_stream(send_to(&app, &app.url, &chat, &json!({"content": "read it"})).await).await;
    assert_eq!(
        output_of(&chunks, "r"),
        "written before the crash",
        "{chunks:?}"
    );
    let after = sessions(&app, &agent).await;
    assert_eq!(after.len(), 1, "no new session: {after:?}");
    assert_eq!(after[0]["id"], before[0]["id"]);
    assert_eq!(after[0]["state"], "ready");
    assert_eq!(
        service.reached().last(),
        Some(&addr_of(&app.url)),
        "the re-dial reached the survivor"
    );
    assert!(app.provider.violations().is_empty());
}

/// W9, D3: the channel drops (a network blip) while a command runs. The worker goes on
/// with the call, dials again, and the brain attaches to the call by its key: the answer is
/// the command's own, the line it appended is in the file once, and the session is the
/// same one.
#[tokio::test]
async fn a_call_in_flight_when_the_channel_drops_is_reattached_and_never_run_twice() {
    let (app, namespace) = app_with_own_queue(|_| {}).await;
    let service = Service::start(&[&app.url]).await;
    let _manager = start_manager(&app, &namespace, 60_000, None, &service.url);
    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell("warm", "echo ready"));
    app.provider.push(text("ok"));
    read_stream(app.send(&chat, &json!({"content": "warm up"})).await).await;
    app.settled().await;

    app.provider.push(shell(
        "inflight",
        "echo appended-line >> runs.log; echo pid=$$; sleep 2; echo slept-through",
    ));
    app.provider.push(shell("count", "cat runs.log"));
    app.provider.push(text("done"));
    let response = send_to(&app, &app.url, &chat, &json!({"content": "append"})).await;
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("\"text\":\"pid=") {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    service.cut();
    while let Some(piece) = body.next().await {
        seen.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
    }
    let (chunks, done) = common::parse_events(&seen);
    assert!(done);
    let answered = output_of(&chunks, "inflight");
    assert!(
        answered.contains("slept-through"),
        "the command's own answer: {answered}"
    );
    let count = output_of(&chunks, "count");
    assert_eq!(
        count.matches("appended-line").count(),
        1,
        "the command ran once: {count}"
    );
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 1, "the same session: {listed:?}");
    assert_eq!(listed[0]["state"], "ready");
    assert!(service.reached().len() >= 2, "the worker dialed again");
    assert!(app.provider.violations().is_empty());
}

/// D3: the replica running a turn dies while its worker call runs, and it held the
/// worker's socket too. The worker dials the survivor, the survivor takes the turn over,
/// and the call in flight is attached to on the worker: its answer is the command's own,
/// the command ran once, and the turn completes.
#[tokio::test]
async fn a_taken_over_turn_reattaches_its_worker_call() {
    let (app, namespace) = app_with_own_queue(|c| c.lease_ttl = Duration::from_millis(800)).await;
    let mut victim = BrainProcess::start(
        &app,
        &[
            ("SESSION_QUEUE_NAMESPACE", &namespace),
            ("BRAIN_LEASE_TTL_MS", "800"),
        ],
    )
    .await;
    let service = Service::start(&[&victim.url, &app.url]).await;
    let _manager = start_manager(&app, &namespace, 60_000, None, &service.url);
    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell(
        "inflight",
        "echo ran >> runs.log; echo pid=$$; sleep 5; echo slept-through",
    ));
    app.provider.push(shell("count", "cat runs.log"));
    app.provider.push(text("taken over"));
    let response = send_to(
        &app,
        &victim.url,
        &chat,
        &json!({"content": "run it", "message_id": "m-worker"}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("\"text\":\"pid=") {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    victim.kill().await;
    drop(body);
    let (row, waited) =
        crate::takeover::until_ended(&app, "m-worker", Duration::from_secs(30)).await;
    assert_eq!(row, ("completed".into(), None), "after {waited:?}");
    let parts = crate::takeover::assistant_parts(&app, &app.url, &chat).await;
    let output = |id: &str| {
        parts
            .iter()
            .find(|p| p["toolCallId"] == id)
            .map(|p| p["output"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
    assert!(output("inflight").contains("slept-through"), "{parts:?}");
    assert_eq!(output("count").matches("ran").count(), 1, "{parts:?}");
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 1, "the same session: {listed:?}");
}

/// W9 and drain: a replica closes its worker channels with "going away" (1001) and leaves
/// the Service; the worker re-dials the other replica at once, and its session goes on.
#[tokio::test]
async fn a_channel_closed_going_away_redials_another_replica() {
    let (app, namespace) = app_with_own_queue(|_| {}).await;
    let (draining, state) = app.second_replica_with(|_| {}).await;
    let service = Service::start(&[&draining, &app.url]).await;
    let _manager = start_manager(&app, &namespace, 60_000, None, &service.url);
    let (agent, chat) = light_agent(&app).await;
    app.provider.push(call(
        "w",
        "write_file",
        json!({"path": "kept.txt", "content": "before the drain"}),
    ));
    app.provider.push(text("written"));
    read_stream(send_to(&app, &draining, &chat, &json!({"content": "write"})).await).await;
    assert_eq!(service.reached(), vec![addr_of(&draining)]);

    service.route_to(&[&app.url]);
    let closed = Instant::now();
    assert_eq!(state.sessions.close_all_going_away().await, 1);
    app.provider
        .push(call("r", "read_file", json!({"path": "kept.txt"})));
    app.provider.push(text("read"));
    let (chunks, _) =
        read_stream(send_to(&app, &app.url, &chat, &json!({"content": "read"})).await).await;
    println!(
        "going away to the next call answered elsewhere: {:?}",
        closed.elapsed()
    );
    assert_eq!(output_of(&chunks, "r"), "before the drain", "{chunks:?}");
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "ready");
    assert_eq!(service.reached().last(), Some(&addr_of(&app.url)));
}

/// The caller replica cannot reach Redis (a listener that accepts and never
/// answers), so it cannot tell who holds the session's socket. Unknown is not absent: the
/// call fails as a tool error the model can retry, the healthy session (held by the other
/// replica) stays `ready`, and no second session is provisioned.
#[tokio::test]
async fn an_owner_lookup_that_fails_leaves_a_session_held_elsewhere_alone() {
    let (app, _manager) = system(60_000, |_| {}).await;
    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell("a", "echo held by A"));
    app.provider.push(text("ok"));
    read_stream(app.send(&chat, &json!({"content": "start"})).await).await;
    app.settled().await;

    let blackhole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole = blackhole.local_addr().unwrap();
    let _hole = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = blackhole.accept().await {
            held.push(socket);
        }
    });
    let (blind, _) = app
        .second_replica_with(|c| c.redis_url = format!("redis://{hole}"))
        .await;
    app.provider.push(shell("b", "echo must not run here"));
    app.provider.push(text("could not"));
    let turn = tokio::time::timeout(
        Duration::from_secs(30),
        read_stream(send_to(&app, &blind, &chat, &json!({"content": "go"})).await),
    )
    .await;
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 1, "no second session: {listed:?}");
    assert_eq!(listed[0]["state"], "ready", "{listed:?}");
    let (chunks, _) = turn.expect("the turn ends");
    let output = output_of(&chunks, "b");
    assert!(
        output.starts_with("ERROR") && output.contains("try again"),
        "a retryable tool error: {output}"
    );

    // The session is still healthy on its own replica.
    app.provider.push(shell("c", "echo still held"));
    app.provider.push(text("ok"));
    let (chunks, _) =
        read_stream(send_to(&app, &app.url, &chat, &json!({"content": "again"})).await).await;
    assert!(output_of(&chunks, "c").contains("still held"), "{chunks:?}");
    assert_eq!(sessions(&app, &agent).await.len(), 1);
}

#[tokio::test]
async fn an_uploaded_artifact_is_stored_by_the_brain_and_downloadable() {
    let (app, _manager) = system(60_000, |_| {}).await;
    let (_, chat) = light_agent(&app).await;
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![
            ToolCall {
                id: "w".into(),
                name: "write_file".into(),
                arguments: json!({"path": "out/report.txt", "content": "made in the worker"})
                    .to_string(),
            },
            ToolCall {
                id: "u".into(),
                name: "upload_artifact".into(),
                arguments: json!({"path": "out/report.txt"}).to_string(),
            },
        ],
        fragment: 32,
    });
    app.provider.push(text("uploaded"));
    let (chunks, _) =
        read_stream(app.send(&chat, &json!({"content": "make a report"})).await).await;
    let stored = output_of(&chunks, "u");
    let download = download_stored(&app, &stored).await;
    assert_eq!(download.text().await.unwrap(), "made in the worker");
}

/// R3, brain side: a worker pre-started with a pool token dials in unassigned; the first
/// worker tool call claims it (no launch, no queue) and binds it over the channel. The
/// test plays the runtime-manager's part of starting the pooled worker.
#[tokio::test]
async fn a_first_call_claims_a_warm_worker_instead_of_a_cold_start() {
    let namespace = format!("test-{}", uuid::Uuid::new_v4().simple());
    let app = TestApp::start_with(move |c| c.workers.queue_namespace = namespace).await;
    let slot = protocol::SessionId::new();
    // The slot is written before the worker starts, as the runtime-manager does: a worker
    // that dials first finds no `starting` slot and is refused (4002).
    sqlx::query("INSERT INTO worker_pool (id, profile, state) VALUES ($1, 'light', 'starting')")
        .bind(slot.0)
        .execute(app.store.pool())
        .await
        .unwrap();
    let workspace = TempDir::new();
    let mut worker = tokio::process::Command::new(bin("worker"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("BRAIN_PUBLIC_URL", &app.url)
        .env("WORKER_SESSION_ID", slot.to_string())
        .env(
            "WORKER_SESSION_TOKEN",
            channel::token::TokenKeys::new(test_support::SESSION_TOKEN_KEY.as_bytes())
                .unwrap()
                .mint_pool(slot, Duration::from_secs(600))
                .unwrap(),
        )
        .env("WORKER_WORKSPACE", &workspace.0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    sqlx::query("UPDATE worker_pool SET worker_ref = $2 WHERE id = $1")
        .bind(slot.0)
        .bind(format!("local:{}", worker.id().unwrap()))
        .execute(app.store.pool())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (state,): (String,) = sqlx::query_as("SELECT state FROM worker_pool WHERE id = $1")
            .bind(slot.0)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
        if state == "idle" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pooled worker never became idle ({state})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell("w1", "echo warm"));
    app.provider.push(text("ok"));
    let (chunks, first_call) =
        timed_stream(app.send(&chat, &json!({"content": "go"})).await, "w1").await;
    println!("first worker tool call on a warm pool: {first_call:?}");
    assert!(output_of(&chunks, "w1").contains("warm"), "{chunks:?}");
    assert!(
        worker_states(&chunks).is_empty(),
        "no provisioning: the session was ready at once"
    );
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["state"], "ready");
    let (state, session): (String, Option<uuid::Uuid>) =
        sqlx::query_as("SELECT state, session_id FROM worker_pool WHERE id = $1")
            .bind(slot.0)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(state, "claimed");
    assert_eq!(
        session.unwrap().to_string(),
        listed[0]["id"].as_str().unwrap()
    );
    let _ = worker.start_kill();
}

/// R3 end to end: the runtime-manager keeps one pooled `light` worker; the first worker
/// tool call claims it (no launch on the call's path), the pool refills, and the claimed
/// session is torn down after its idle window like any other.
#[tokio::test]
async fn the_runtime_manager_keeps_a_warm_pool_that_a_first_call_claims() {
    let profiles = json!({"profiles": {"light": {"warmPoolSize": 1}}});
    let (app, _manager) = system_with_profiles(3_000, Some(profiles), |_| {}).await;
    pool_filled(&app).await;
    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell("p1", "echo pooled"));
    app.provider.push(text("ok"));
    let (chunks, first_call) =
        timed_stream(app.send(&chat, &json!({"content": "go"})).await, "p1").await;
    println!("first worker tool call, warm pool kept by the runtime-manager: {first_call:?}");
    assert!(output_of(&chunks, "p1").contains("pooled"));
    assert!(
        worker_states(&chunks).is_empty(),
        "claimed, not provisioned"
    );
    let pid = worker_pid(&app).await;

    // The pool refills behind the claim.
    pool_filled(&app).await;
    // The claimed session ends after its idle window, and its worker with it.
    torn_down(&app, &agent, pid, Duration::from_secs(20)).await;
}

/// Waits (up to 15 s) for an idle warm-pool slot.
async fn pool_filled(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM worker_pool WHERE state = 'idle'")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
        if n >= 1 {
            return;
        }
        assert!(Instant::now() < deadline, "no pooled worker became idle");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// R3 across replicas: the pooled worker dialed another replica (a real brain process).
/// The first call here claims its slot in Postgres, the holder binds the worker when asked
/// over the relay, and the calls go to it through the relay (W4): no cold start, though
/// this replica's own pool is empty.
#[tokio::test]
async fn a_warm_worker_another_replica_holds_is_claimed_through_it() {
    let (app, namespace) = app_with_own_queue(|_| {}).await;
    let holder = BrainProcess::start(&app, &[("SESSION_QUEUE_NAMESPACE", &namespace)]).await;
    let profiles = json!({"profiles": {"light": {"warmPoolSize": 1}}});
    let _manager = start_manager_with(&app, &namespace, Some(profiles), &holder.url, &[]);
    pool_filled(&app).await;

    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell("r1", "echo held elsewhere"));
    app.provider.push(shell("r2", "echo and again"));
    app.provider.push(text("ok"));
    let (chunks, first_call) =
        timed_stream(app.send(&chat, &json!({"content": "go"})).await, "r1").await;
    println!("first worker tool call, warm worker on another replica: {first_call:?}");
    assert!(
        output_of(&chunks, "r1").contains("held elsewhere"),
        "{chunks:?}"
    );
    assert!(output_of(&chunks, "r2").contains("and again"), "{chunks:?}");
    // A session found ready on another replica is shown as such; nothing was provisioned.
    assert!(
        worker_states(&chunks)
            .iter()
            .all(|state| *state == SessionState::Ready),
        "claimed, not provisioned: {chunks:?}"
    );
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["state"], "ready");
    // The session is the holder's, and so was the slot.
    let (state, claimed_for, holder_replica, owner_replica): (
        String,
        Option<uuid::Uuid>,
        Option<uuid::Uuid>,
        Option<uuid::Uuid>,
    ) = sqlx::query_as(
        "SELECT p.state, p.session_id, p.holder_replica, s.owner_replica
         FROM worker_pool p JOIN agent_runtime_sessions s ON s.id = p.session_id",
    )
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(state, "claimed");
    assert_eq!(
        claimed_for.unwrap().to_string(),
        listed[0]["id"].as_str().unwrap()
    );
    assert!(holder_replica.is_some());
    assert_eq!(owner_replica, holder_replica);
    assert!(app.provider.violations().is_empty());
    drop(holder);
}

/// R3, the holder dies: a slot claimed from a replica that was SIGKILLed (its lease not yet
/// lapsed, so the slot still looks claimable) is not left `ready` without a worker: the
/// bind finds nobody listening, the session fails `heartbeat_lost` ("bind not delivered"),
/// and the call goes on to a worker of its own.
#[tokio::test]
async fn a_warm_claim_whose_holder_died_fails_that_session_and_the_call_goes_on() {
    let (app, namespace) = app_with_own_queue(|_| {}).await;
    let mut holder = BrainProcess::start(&app, &[("SESSION_QUEUE_NAMESPACE", &namespace)]).await;
    // Workers reach whichever replica is up, as through a Kubernetes Service.
    let service = Service::start(&[&holder.url, &app.url]).await;
    let profiles = json!({"profiles": {"light": {"warmPoolSize": 1}}});
    let _manager = start_manager_with(&app, &namespace, Some(profiles), &service.url, &[]);
    pool_filled(&app).await;
    holder.kill().await;

    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell("d1", "echo still served"));
    app.provider.push(text("ok"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    assert!(
        output_of(&chunks, "d1").contains("still served"),
        "{chunks:?}"
    );
    let failed: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT state, failure_reason, failure_detail FROM agent_runtime_sessions
         WHERE state = 'failed'",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    assert_eq!(
        failed,
        vec![(
            "failed".to_owned(),
            Some("heartbeat_lost".to_owned()),
            Some("bind not delivered".to_owned())
        )],
        "the claim of the dead holder's slot"
    );
    let live = sessions(&app, &agent).await;
    assert!(live.iter().any(|s| s["state"] == "ready"), "{live:?}");
    assert!(app.provider.violations().is_empty());
}

/// W10 with a warm pool: a chat whose workspace was snapshotted at an idle teardown claims
/// a pooled worker for its next session (no cold start), and the worker restores the
/// snapshot when bound, before the first call runs.
#[tokio::test]
async fn a_chat_with_a_snapshot_claims_a_warm_worker_that_restores_it() {
    let profiles = json!({"profiles": {"light": {"warmPoolSize": 1}}});
    let (app, _manager) = system_with_profiles(1_500, Some(profiles), |_| {}).await;
    pool_filled(&app).await;
    let (agent, chat) = light_agent(&app).await;
    let out = shell_turn(
        &app,
        &chat,
        "w1",
        "echo remember-me > notes.txt && echo written",
    )
    .await;
    assert!(out.contains("written"), "{out}");
    terminated(&app, &agent, Duration::from_secs(20)).await;
    assert_eq!(newest_snapshot_state(&app, &agent).await, "stored");

    pool_filled(&app).await;
    app.provider.push(shell("w2", "cat notes.txt"));
    app.provider.push(text("done"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "go on"})).await).await;
    assert!(
        output_of(&chunks, "w2").contains("remember-me"),
        "{chunks:?}"
    );
    assert!(
        worker_states(&chunks).is_empty(),
        "a pooled worker, not a cold start: {chunks:?}"
    );
    let (claimed,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM worker_pool WHERE state = 'claimed'")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(claimed, 2, "both sessions were pooled workers");
    assert!(app.provider.violations().is_empty());
}

/// Browser mode end to end (W8): an agent on profile `browser` navigates a page served on
/// 127.0.0.1, reads its snapshot, clicks by reference, and its screenshot is stored by
/// the brain as an artifact, and the model, one with vision here, sees the screenshot as an
/// image in the call's result (T24). Real Chromium (Debian), real worker, real
/// runtime-manager. The page is on loopback outside the worker's sandbox: Chromium
/// reaches it through the session's egress proxy, which may reach private addresses here.
#[tokio::test]
async fn a_browser_agent_navigates_snapshots_clicks_and_screenshots() {
    let env = [
        ("RUNTIME_MANAGER_IDLE_WINDOW_MS", "60000"),
        ("EGRESS_ALLOW_PRIVATE_NETWORKS", "true"),
    ];
    let (app, _manager) = system_with(None, &env, |c| {
        let mut catalog = engine::models::catalog::Catalog::shipped().unwrap();
        let vision = serde_json::from_value(json!({"model": "gpt-test", "vision": true}));
        catalog.merge(engine::models::catalog::Table::from([(
            "openai".to_owned(),
            vec![vision.unwrap()],
        )]));
        c.model_catalog = std::sync::Arc::new(catalog);
    })
    .await;
    let page = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let page_url = format!("http://{}/", page.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let html = "<html><head><title>Test page</title></head><body><h1>Hello hands</h1>\
            <button onclick=\"document.querySelector('h1').textContent='Clicked'\">Press me</button>\
            </body></html>";
        loop {
            let Ok((mut socket, _)) = page.accept().await else {
                return;
            };
            let mut buf = [0u8; 2048];
            let _ = socket.read(&mut buf).await;
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{html}",
                html.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
        }
    });
    let agent: Value = app
        .post_json(
            "/v1/agents",
            &json!({"name": "browser", "system_prompt": "Browse.", "model": "openai/gpt-test",
                    "runtime_profile": "browser"}),
        )
        .await
        .json()
        .await
        .unwrap();
    let agent = agent["id"].as_str().unwrap().to_owned();
    let chat = app.new_chat(&agent).await;
    app.provider
        .push(call("n", "browser_navigate", json!({ "url": page_url })));
    app.provider.push(call("s", "browser_snapshot", json!({})));
    app.provider.push(text("looked"));
    let (chunks, _) =
        read_stream(app.send(&chat, &json!({"content": "open the page"})).await).await;
    assert!(output_of(&chunks, "n").contains("Test page"), "{chunks:?}");
    let snapshot = output_of(&chunks, "s");
    assert!(snapshot.contains("Hello hands"), "{snapshot}");
    let button_ref: u64 = snapshot
        .lines()
        .find(|l| l.contains("Press me"))
        .and_then(|l| l.split("[ref=").nth(1))
        .and_then(|r| r.split(']').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no ref for the button in {snapshot}"));
    app.settled().await;

    app.provider
        .push(call("c", "browser_click", json!({ "ref": button_ref })));
    app.provider.push(call("s2", "browser_snapshot", json!({})));
    app.provider
        .push(call("shot", "browser_screenshot", json!({})));
    app.provider.push(text("done"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "press it"})).await).await;
    assert!(!output_of(&chunks, "c").starts_with("ERROR"), "{chunks:?}");
    assert!(
        output_of(&chunks, "s2").contains("Clicked"),
        "the click changed the page"
    );
    let stored = output_of(&chunks, "shot");
    let id = stored
        .strip_prefix("stored artifact ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{stored}"));
    let png = app
        .get(&format!("/v1/artifacts/{id}"))
        .await
        .bytes()
        .await
        .unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // The call after the screenshot shows it to the model: the chat wire's tool message
    // takes text only, so it follows as a user message's image (T24).
    let after = app.provider.requests().pop().unwrap();
    let seen = after.files();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].kind, scripted_provider::SeenKind::Image);
    assert_eq!(seen[0].bytes, png.to_vec());
    let messages = after.body["messages"].as_array().unwrap();
    assert_eq!(seen[0].message, messages.len() - 1);
    assert_eq!(messages[seen[0].message - 1]["tool_call_id"], "shot");
    assert!(app.provider.violations().is_empty());
}

/// A process started by a test: its stderr goes to `log`; SIGKILLed on drop.
struct Child {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Child {
    fn spawn(mut command: tokio::process::Command, log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).unwrap();
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self { child, log }
    }

    /// SIGTERM, and the process is waited for (at most 15 s), so its log is complete.
    async fn stop(&mut self) -> String {
        let pid = self.child.id().unwrap();
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .expect("the process stops on SIGTERM")
            .unwrap();
        std::fs::read_to_string(&self.log).unwrap()
    }
}

/// The brain binary over `app`'s database and scripted provider, its own replica beside
/// the in-process one: (the process, its URL).
async fn brain_binary(app: &TestApp, namespace: &str, dir: &TempDir, log: &str) -> (Child, String) {
    brain_binary_with(app, namespace, dir, log, &[]).await
}

/// [`brain_binary`], with `env` added to the brain's variables.
async fn brain_binary_with(
    app: &TestApp,
    namespace: &str,
    dir: &TempDir,
    log: &str,
    env: &[(&str, &str)],
) -> (Child, String) {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_brain"));
    command
        .arg("serve")
        .env("BRAIN_ADDR", addr.to_string())
        .env("BRAIN_METRICS_ADDR", "off")
        .env("DATABASE_URL", app.store_url())
        .env(
            "REDIS_URL",
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
        )
        .env("OPENAI_BASE_URL", app.provider.openai_base_url())
        .env("OPENAI_API_KEY", "sk-test-openai")
        .env("BRAIN_ARTIFACTS_DIR", dir.0.join("artifacts"))
        .env("SESSION_QUEUE_NAMESPACE", namespace)
        .env("SESSION_TOKEN_KEY", test_support::SESSION_TOKEN_KEY)
        .env("BRAIN_LOG", log)
        // As in every test brain: a title call after the chat's first turn would be one
        // more model request than the turn's, whenever it came before the test looked.
        .env("BRAIN_CHAT_TITLES", "false")
        .envs(env.iter().copied());
    let brain = Child::spawn(command, dir.0.join("brain.log"));
    let url = format!("http://{addr}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !app
        .http
        .get(format!("{url}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(
            Instant::now() < deadline,
            "the brain binary never became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (brain, url)
}

/// X4 at every log level: the brain, the runtime-manager and the worker
/// binaries at `trace` run a shell command; neither the user's message, the command, its
/// output (which also travels as progress notifications) nor the answer reaches any of
/// the three logs.
#[tokio::test]
async fn no_payload_reaches_the_logs_at_trace() {
    let app = TestApp::start().await;
    let dir = TempDir::new();
    let namespace = format!("test-{}", uuid::Uuid::new_v4().simple());
    let (mut brain, url) = brain_binary(&app, &namespace, &dir, "trace").await;
    let workspaces = TempDir::new();
    let worker = script(
        &dir,
        "worker-at-trace",
        &format!("WORKER_LOG=trace exec '{}' \"$@\"", bin("worker").display()),
    );
    let mut command = manager_command(&app, &namespace, &app.url, &workspaces);
    command
        .env("BRAIN_PUBLIC_URL", &url)
        .env("RUNTIME_MANAGER_WORKER_BIN", &worker)
        .envs(UNCONFINED)
        .env("RUNTIME_MANAGER_LOG", "trace");
    let mut manager = Child::spawn(command, dir.0.join("manager.log"));

    let mark = uuid::Uuid::new_v4().simple().to_string();
    let message = format!("msg-{mark}");
    // The command names the marker in capitals; its output is the lowercase secret.
    let secret = format!("sk-live-{mark}");
    // It keeps running after the line, so the line travels as a progress notification
    // while the call runs, not only in the result of a command that already exited.
    let command = format!("echo {} | tr A-Z a-z; sleep 0.5", secret.to_uppercase());
    let answer = format!("ans-{mark}");
    let post = |path: String, body: Value| {
        app.http
            .post(format!("{url}{path}"))
            .bearer_auth(&app.key)
            .json(&body)
            .send()
    };
    let agent: Value = post(
        "/v1/agents".into(),
        json!({"name": "hands", "system_prompt": "Use your shell.", "model": "openai/gpt-test",
               "runtime_profile": "light"}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let chat: Value = post(
        format!("/v1/agents/{}/chats", agent["id"].as_str().unwrap()),
        json!({}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    app.provider.push(shell("c", &command));
    app.provider.push(text(&answer));
    let response = post(
        format!("/v1/chats/{}/messages", chat["id"].as_str().unwrap()),
        json!({ "content": message }),
    )
    .await
    .unwrap();
    let (chunks, _) = read_stream(response).await;
    assert!(output_of(&chunks, "c").contains(&secret), "{chunks:?}");
    assert!(
        chunks
            .iter()
            .any(|c| matches!(c, UiChunk::DataWorkerLog { .. })),
        "the output also travelled as progress notifications"
    );
    assert_eq!(streamed_text(&chunks), answer);

    let (session,): (uuid::Uuid,) =
        sqlx::query_as("SELECT id FROM agent_runtime_sessions ORDER BY created_at DESC LIMIT 1")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    let brain_log = brain.stop().await;
    let manager_log = manager.stop().await;
    let worker_log = std::fs::read_to_string(workspaces.0.join(format!("{session}.log"))).unwrap();
    // The filters took: debug lines of the workspace's own crates are there.
    assert!(brain_log.contains(" DEBUG brain::"), "{brain_log}");
    assert!(manager_log.contains(" DEBUG queue"), "{manager_log}");
    for (process, log, alive_line) in [
        ("brain", &brain_log, "worker ready"),
        ("runtime-manager", &manager_log, "worker launched"),
        ("worker", &worker_log, "tool call"),
    ] {
        assert!(log.contains(alive_line), "{process} logged:\n{log}");
        for payload in [&message, &secret, &secret.to_uppercase(), &answer] {
            let at = log.find(payload.as_str());
            assert!(
                at.is_none(),
                "{process} logged {payload}: …{}…",
                at.map(|at| &log[at.saturating_sub(400)..(at + 200).min(log.len())])
                    .unwrap_or_default()
            );
        }
    }
}

/// `BRAIN_SECRETS_KEY` of the secrets tests, and the store that writes under it.
const SECRETS_KEY_HEX: &str = "8f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";

fn secrets_key() -> store::SecretsKey {
    store::SecretsKey::parse(SECRETS_KEY_HEX).unwrap()
}

async fn set_secret(app: &TestApp, agent: &str, name: &str, value: &str) {
    let agent = protocol::AgentId(agent.parse().unwrap());
    app.store
        .clone()
        .with_secrets_key(Some(secrets_key()))
        .set_secret(
            app.team,
            agent,
            name,
            value,
            100,
            &store::Actor::operator(None),
        )
        .await
        .unwrap();
}

/// Every row of `messages` and `turns` as JSON text, for grepping.
async fn message_and_turn_rows(app: &TestApp) -> String {
    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT row_to_json(m)::text FROM messages m \
         UNION ALL SELECT row_to_json(t)::text FROM turns t",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    rows.into_iter()
        .map(|(row,)| row)
        .collect::<Vec<_>>()
        .join("\n")
}

/// W12 end to end, cold start: an agent's secret becomes its `shell` commands'
/// environment (the command sees its length), and its value is masked everywhere it
/// could go: the live output and the result (even written in two pieces), so none of the
/// model's requests, the UI stream, the stored messages and turns, or the brain's, the
/// runtime-manager's and the worker's logs at `debug` holds it.
#[tokio::test]
async fn secrets_reach_the_commands_and_no_sink_sees_their_values() {
    let app = TestApp::start().await;
    let dir = TempDir::new();
    let namespace = format!("test-{}", uuid::Uuid::new_v4().simple());
    let (mut brain, url) = brain_binary_with(
        &app,
        &namespace,
        &dir,
        "debug",
        &[("BRAIN_SECRETS_KEY", SECRETS_KEY_HEX)],
    )
    .await;
    let workspaces = TempDir::new();
    let worker = script(
        &dir,
        "worker-at-debug",
        &format!("WORKER_LOG=debug exec '{}' \"$@\"", bin("worker").display()),
    );
    let mut command = manager_command(&app, &namespace, &app.url, &workspaces);
    command
        .env("BRAIN_PUBLIC_URL", &url)
        .env("RUNTIME_MANAGER_WORKER_BIN", &worker)
        .envs(UNCONFINED)
        .env("RUNTIME_MANAGER_LOG", "debug");
    let mut manager = Child::spawn(command, dir.0.join("manager.log"));
    let post = |path: String, body: Value| {
        app.http
            .post(format!("{url}{path}"))
            .bearer_auth(&app.key)
            .json(&body)
            .send()
    };
    let agent: Value = post(
        "/v1/agents".into(),
        json!({"name": "hands", "system_prompt": "Use your shell.", "model": "openai/gpt-test",
               "runtime_profile": "light"}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let agent = agent["id"].as_str().unwrap().to_owned();
    let chat: Value = post(format!("/v1/agents/{agent}/chats"), json!({}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let chat = chat["id"].as_str().unwrap().to_owned();
    let secret = format!("tok-{}", uuid::Uuid::new_v4().simple());
    set_secret(&app, &agent, "MY_TOKEN", &secret).await;
    // A reserved name is not passed: the shell keeps its own PATH.
    set_secret(&app, &agent, "PATH", "/nowhere-at-all").await;

    // The value leaves the command whole, then in two writes 0.2 s apart (two reads of
    // the pipe, two progress notifications were it not held back), then on stderr; the
    // command runs on so its lines travel live.
    let command = "echo $MY_TOKEN; printenv MY_TOKEN | wc -c; \
                   printf %s \"${MY_TOKEN%%-*}\"; sleep 0.2; echo \"-${MY_TOKEN#*-}\"; \
                   echo \"$MY_TOKEN\" >&2; sleep 0.3";
    app.provider.push(shell("s1", command));
    app.provider.push(text("done"));
    let response = post(
        format!("/v1/chats/{chat}/messages"),
        json!({"content": "go"}),
    )
    .await
    .unwrap();
    let stream = response.text().await.unwrap();
    let (chunks, _) = parse_events(&stream);
    let output = output_of(&chunks, "s1");
    assert_eq!(
        output,
        format!(
            "exit code: 0\n--- stdout ---\n[secret:MY_TOKEN]\n{}\n[secret:MY_TOKEN]\n\
             --- stderr ---\n[secret:MY_TOKEN]\n",
            secret.len() + 1
        ),
        "the command saw the value (its length) and printed it masked"
    );
    let live: String = chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::DataWorkerLog { data, .. } => Some(data.text.as_str()),
            _ => None,
        })
        .collect();
    assert!(live.contains("[secret:MY_TOKEN]"), "live output: {live:?}");

    // What the model read next: the masked output, never the value.
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 2);
    let to_model = requests
        .iter()
        .map(|r| r.body.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(requests[1].body.to_string().contains("[secret:MY_TOKEN]"));
    let stored = app
        .http
        .get(format!("{url}/v1/chats/{chat}/messages"))
        .bearer_auth(&app.key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(stored.contains("[secret:MY_TOKEN]"), "{stored}");
    let rows = message_and_turn_rows(&app).await;
    assert!(rows.contains("[secret:MY_TOKEN]"));

    let (session,): (uuid::Uuid,) =
        sqlx::query_as("SELECT id FROM agent_runtime_sessions ORDER BY created_at DESC LIMIT 1")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    let brain_log = brain.stop().await;
    let manager_log = manager.stop().await;
    let worker_log = std::fs::read_to_string(workspaces.0.join(format!("{session}.log"))).unwrap();
    assert!(
        brain_log.contains("session environment sent"),
        "{brain_log}"
    );
    assert!(
        worker_log.contains("session environment set"),
        "{worker_log}"
    );
    assert!(manager_log.contains(" DEBUG "), "{manager_log}");
    for (sink, text) in [
        ("the model's requests", &to_model),
        ("the UI stream", &stream),
        ("GET messages", &stored),
        ("the messages and turns rows", &rows),
        ("the brain's log", &brain_log),
        ("the runtime-manager's log", &manager_log),
        ("the worker's log", &worker_log),
    ] {
        let at = text.find(secret.as_str());
        assert!(
            at.is_none(),
            "{sink} holds the value: …{}…",
            at.map(|at| &text[at.saturating_sub(300)..(at + 100).min(text.len())])
                .unwrap_or_default()
        );
    }
    // Nor did it reach the worker any other way than the channel: not its launch
    // environment, not a file in its workspace.
    for entry in std::fs::read_dir(&workspaces.0).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{path:?}"
            );
        }
    }
}

/// W12 with a warm pool: the pooled worker, started before the agent had any secret, gets
/// them at bind, so the first call is served by the claimed worker (no cold start) and its
/// command already sees them.
#[tokio::test]
async fn a_pooled_worker_gets_the_secrets_at_bind() {
    let profiles = json!({"profiles": {"light": {"warmPoolSize": 1}}});
    let (app, _manager) = system_with_profiles(60_000, Some(profiles), |c| {
        c.secrets_key = Some(secrets_key())
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (idle,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM worker_pool WHERE state = 'idle'")
                .fetch_one(app.store.pool())
                .await
                .unwrap();
        if idle == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the pool never filled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (agent, chat) = light_agent(&app).await;
    let secret = format!("pool-{}", uuid::Uuid::new_v4().simple());
    set_secret(&app, &agent, "MY_TOKEN", &secret).await;
    app.provider
        .push(shell("p1", "echo $MY_TOKEN; printenv MY_TOKEN | wc -c"));
    app.provider.push(text("ok"));
    let response = app.send(&chat, &json!({"content": "go"})).await;
    let stream = response.text().await.unwrap();
    let (chunks, _) = parse_events(&stream);
    assert!(
        worker_states(&chunks).is_empty(),
        "claimed, not provisioned"
    );
    assert_eq!(
        output_of(&chunks, "p1"),
        format!(
            "exit code: 0\n--- stdout ---\n[secret:MY_TOKEN]\n{}\n",
            secret.len() + 1
        )
    );
    assert!(!stream.contains(&secret));
    let (claimed,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM worker_pool WHERE state = 'claimed'")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(claimed, 1);
}

/// W12, what masking can still catch: a secret printed in base64 (alone, and one and two
/// bytes into longer data, in the standard and the URL-safe alphabet), and printed short of
/// its last byte at the very end of the output, through a real worker's shell. None of it
/// reaches the client's stream (live lines and result) or the model.
#[tokio::test]
async fn a_secrets_base64_and_a_cut_off_tail_are_masked() {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    let (app, _manager) = system(60_000, |c| c.secrets_key = Some(secrets_key())).await;
    let (agent, chat) = light_agent(&app).await;
    let secret = format!("b64-{}", uuid::Uuid::new_v4().simple());
    set_secret(&app, &agent, "MY_TOKEN", &secret).await;
    let command = "printf %s \"$MY_TOKEN\" | base64; printf a%s \"$MY_TOKEN\" | base64; \
                   printf ab%s \"$MY_TOKEN\" | base64 | tr '+/' '-_'; sleep 0.2; \
                   printf %s \"${MY_TOKEN%?}\"";
    app.provider.push(shell("b1", command));
    app.provider.push(text("ok"));
    let stream = app
        .send(&chat, &json!({"content": "go"}))
        .await
        .text()
        .await
        .unwrap();
    let (chunks, _) = parse_events(&stream);
    let output = output_of(&chunks, "b1");
    let stdout: Vec<&str> = output
        .strip_prefix("exit code: 0\n--- stdout ---\n")
        .unwrap_or_else(|| panic!("{output}"))
        .lines()
        .collect();
    assert_eq!(stdout.len(), 4, "{output}");
    assert_eq!(stdout[0], "[secret:MY_TOKEN]", "encoded alone");
    for line in &stdout[1..3] {
        // Beside the mask, only the characters that also carry the prefix's bits.
        let (left, right) = line
            .split_once("[secret:MY_TOKEN]")
            .unwrap_or_else(|| panic!("{output}"));
        assert!(left.len() <= 3 && right.len() <= 4, "{output}");
    }
    assert_eq!(stdout[3], "[secret:MY_TOKEN]", "cut off at the end");
    let to_model = app.provider.requests()[1].body.to_string();
    assert!(to_model.contains("[secret:MY_TOKEN]"));
    for sink in [&stream, &to_model] {
        assert!(!sink.contains(&secret[..secret.len() - 1]), "{sink}");
        for prefix in ["", "a", "ab"] {
            let encoded = STANDARD.encode(format!("{prefix}{secret}"));
            for window in encoded.as_bytes()[4..encoded.len() - 4].windows(8) {
                let window = std::str::from_utf8(window).unwrap();
                let url_safe = window.replace('+', "-").replace('/', "_");
                assert!(
                    !sink.contains(window) && !sink.contains(&url_safe),
                    "{window} of {prefix:?}: {sink}"
                );
            }
        }
    }
}

/// W12 mid-chat: a secret the agent stores with `secret_set` while its session is live
/// reaches that session before `secret_set` answers, so the next command of the same turn
/// sees it, on the same worker.
#[tokio::test]
async fn a_secret_set_mid_chat_reaches_the_live_session() {
    let (app, _manager) = system(60_000, |c| c.secrets_key = Some(secrets_key())).await;
    let (agent, chat) = light_agent(&app).await;
    warm_up(&app, &chat).await;
    let secret = format!("mid-{}", uuid::Uuid::new_v4().simple());
    app.provider.push(call(
        "set",
        "secret_set",
        json!({"name": "MY_TOKEN", "value": secret}),
    ));
    app.provider
        .push(shell("s2", "printenv MY_TOKEN | wc -c; echo $MY_TOKEN"));
    app.provider.push(text("ok"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "keep it"})).await).await;
    assert_eq!(output_of(&chunks, "set"), "stored secret MY_TOKEN");
    assert_eq!(
        output_of(&chunks, "s2"),
        format!(
            "exit code: 0\n--- stdout ---\n{}\n[secret:MY_TOKEN]\n",
            secret.len() + 1
        )
    );
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 1, "the same session: {listed:?}");
    assert_eq!(listed[0]["state"], "ready");
}

/// The runtime-manager SIGKILLed with a provision in hand (its claim held
/// in the database by a trigger, the process killed inside it): once a manager is back,
/// the call completes. The task comes back from the dead consumer (after about 15 s), and
/// the new manager takes the session over because the dead one's lease has lapsed.
#[tokio::test]
async fn a_runtime_manager_killed_with_a_provision_in_hand_is_taken_over_by_the_next() {
    let namespace = format!("test-{}", uuid::Uuid::new_v4().simple());
    let ns = namespace.clone();
    let app = TestApp::start_with(move |c| c.workers.queue_namespace = ns).await;
    for ddl in [
        "CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS
         $$ BEGIN PERFORM pg_sleep(3); RETURN NEW; END $$",
        "CREATE TRIGGER slow_claim BEFORE UPDATE ON agent_runtime_sessions FOR EACH ROW
         WHEN (OLD.state = 'pending' AND NEW.state = 'provisioning')
         EXECUTE FUNCTION slow_claim()",
    ] {
        sqlx::query(ddl).execute(app.store.pool()).await.unwrap();
    }
    let workspaces = TempDir::new();
    let mut first = manager_command(&app, &namespace, &app.url, &workspaces)
        .spawn()
        .unwrap();
    let (agent, chat) = light_agent(&app).await;
    app.provider.push(shell("k", "echo after the takeover"));
    app.provider.push(text("ok"));
    let call = app
        .http
        .post(format!("{}/v1/chats/{chat}/messages", app.url))
        .bearer_auth(&app.key)
        .json(&json!({"content": "go"}))
        .send();
    let turn = tokio::spawn(async move { read_stream(call.await.unwrap()).await });

    // The first manager is inside its claim.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (claiming,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event = 'PgSleep'",
        )
        .fetch_one(app.store.pool())
        .await
        .unwrap();
        if claiming > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the manager never claimed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    let killed = Instant::now();
    // The claim the dead manager sent still commits: the session is left `provisioning`,
    // claimed by a replica that is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (state, claimer): (String, Option<uuid::Uuid>) =
            sqlx::query_as("SELECT state, manager_replica FROM agent_runtime_sessions")
                .fetch_one(app.store.pool())
                .await
                .unwrap();
        if state == "provisioning" && claimer.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "still {state} by {claimer:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let _second = Manager {
        child: manager_command(&app, &namespace, &app.url, &workspaces)
            .spawn()
            .unwrap(),
        workspaces: TempDir::new(),
    };
    let (chunks, _) = tokio::time::timeout(Duration::from_secs(50), turn)
        .await
        .expect("the call completes once a manager is back")
        .unwrap();
    println!(
        "runtime-manager SIGKILLed in a claim to the call's answer: {:?}",
        killed.elapsed()
    );
    assert!(
        output_of(&chunks, "k").contains("after the takeover"),
        "{chunks:?}"
    );
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 1, "the session was taken over: {listed:?}");
    assert_eq!(listed[0]["state"], "ready");
}

/// E1: a worker session's lifetime, from its launch to its end, is billed as
/// worker-seconds: one event per interval while it lives and a final one at teardown, each
/// exactly once, though two managers sweep at once and one of them is SIGKILLed while the
/// session lives. The events tile the lifetime, and `GET /v1/usage` shows their sum.
#[tokio::test]
async fn a_sessions_worker_seconds_tile_its_lifetime_through_racing_and_killed_managers() {
    let (app, namespace) = app_with_own_queue(|_| {}).await;
    let env = [
        ("RUNTIME_MANAGER_IDLE_WINDOW_MS", "4000"),
        ("RUNTIME_MANAGER_BILLING_INTERVAL_MS", "500"),
    ];
    let mut first = start_manager_with(&app, &namespace, None, &app.url, &env);
    let _second = start_manager_with(&app, &namespace, None, &app.url, &env);
    let (agent, chat) = light_agent(&app).await;
    let asked = Instant::now();
    warm_up(&app, &chat).await;
    // Both managers bill while the session lives; then one dies without a word.
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    first.child.start_kill().unwrap();
    first.child.wait().await.unwrap();

    // Idle teardown by the survivor (or, if the worker died with its manager, the lost
    // heartbeat): either way the session ends, and its final event follows.
    let deadline = Instant::now() + Duration::from_secs(40);
    let ended = loop {
        let listed = sessions(&app, &agent).await;
        if listed[0]["state"] == "terminated" || listed[0]["state"] == "failed" {
            break Instant::now();
        }
        assert!(Instant::now() < deadline, "never ended: {listed:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let observed = ended.duration_since(asked).as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(10);
    let events: Vec<(String, i64, f64, bool)> = loop {
        let events = sqlx::query_as(
            "SELECT e.event_key,
                    round(extract(epoch FROM e.created_at - s.billing_from) * 1000)::int8,
                    e.seconds, e.created_at = s.ended_at
             FROM billing_events e JOIN agent_runtime_sessions s
               ON e.event_key LIKE 'worker:' || s.id || ':%'
             WHERE e.kind = 'worker_seconds' AND e.team_id = s.team_id
               AND e.agent_id = s.agent_id AND e.model IS NULL AND e.turn_id IS NULL
             ORDER BY e.created_at",
        )
        .fetch_all(app.store.pool())
        .await
        .unwrap();
        if events
            .iter()
            .any(|e: &(String, i64, f64, bool)| e.0.ends_with(":final"))
        {
            break events;
        }
        assert!(Instant::now() < deadline, "no final event: {events:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (lifetime,): (f64,) = sqlx::query_as(
        "SELECT extract(epoch FROM ended_at - billing_from)::float8 FROM agent_runtime_sessions",
    )
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    println!(
        "a session of {lifetime:.3} s billed in {} events (the test saw {observed:.3} s)",
        events.len()
    );

    let (last, intervals) = events.split_last().unwrap();
    assert!(
        last.0.ends_with(":final") && last.3,
        "the final event ends at the end: {events:?}"
    );
    assert!(
        intervals
            .iter()
            .all(|e| e.2 == 0.5 && !e.0.ends_with(":final"))
    );
    let mut reached_ms = 0.0;
    for (key, end_ms, seconds, _) in &events {
        let start_ms = *end_ms as f64 - seconds * 1000.0;
        assert!(
            (start_ms - reached_ms).abs() < 1.0,
            "{key} starts at {start_ms} ms, the events before reach {reached_ms} ms: {events:?}"
        );
        reached_ms = *end_ms as f64;
    }
    let billed: f64 = events.iter().map(|e| e.2).sum();
    assert!(
        (billed - lifetime).abs() < 1e-3,
        "{billed} s billed, {lifetime} s lived"
    );
    // The session lived at least its idle window, and no longer than the test watched it.
    assert!(lifetime >= 4.0, "{lifetime}");
    assert!(
        lifetime <= observed + 0.05,
        "{lifetime} s billed, {observed} s observed"
    );
    assert!(intervals.len() >= 8, "{events:?}");

    let usage: Value = app
        .get("/v1/usage?group_by=model")
        .await
        .json()
        .await
        .unwrap();
    let worker_row = usage["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"].is_null())
        .unwrap_or_else(|| panic!("{usage}"))
        .clone();
    let shown = worker_row["worker_seconds"].as_f64().unwrap();
    assert!((shown - billed).abs() < 1e-3, "{usage}");
    assert_eq!(
        usage["totals"]["worker_seconds"],
        worker_row["worker_seconds"]
    );
    assert_eq!(
        usage["totals"]["model_calls"], 2,
        "the warm-up turn's two model calls"
    );
}

/// A shell call whose arguments stream for about `secs` seconds (a model writing a long
/// command): named at once, complete only at the end.
fn slow_shell(id: &str, command: &str, secs: u64) -> Reply {
    let arguments = json!({ "command": command }).to_string();
    let fragment = 4;
    let pieces = arguments.len().div_ceil(fragment) as u32;
    Reply::PacedToolCalls {
        calls: vec![ToolCall {
            id: id.into(),
            name: "shell".into(),
            arguments,
        }],
        fragment,
        delay: Duration::from_secs(secs) / pieces,
    }
}

/// Reads `body` up to the `tool-input-start` of `call`; returns what it read.
async fn until_tool_input_start(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    call: &str,
) -> String {
    let mark = format!("\"type\":\"tool-input-start\",\"toolCallId\":\"{call}\"");
    let mut seen = String::new();
    while !seen.contains(&mark) {
        let piece = tokio::time::timeout(Duration::from_secs(20), body.next())
            .await
            .expect("the call is named in time")
            .expect("the stream goes on")
            .unwrap();
        seen.push_str(std::str::from_utf8(&piece).unwrap());
    }
    seen
}

/// W11: the worker of a call the model is still writing starts while it writes: the
/// session exists before the call's arguments are complete, and the call then uses that
/// session (one session for the chat, W1). With speculation off, nothing starts until the
/// call does.
#[tokio::test]
async fn a_worker_starts_while_the_model_still_streams_its_call() {
    for speculating in [true, false] {
        let (app, _manager) = system(60_000, |c| {
            if !speculating {
                c.workers.speculation_grace = None;
            }
        })
        .await;
        let (agent, chat) = light_agent(&app).await;
        let padding = "x".repeat(60);
        app.provider
            .push(slow_shell("c1", &format!("echo started # {padding}"), 3));
        app.provider.push(text("Done."));
        let response = app.send(&chat, &json!({"content": "run it"})).await;
        assert_eq!(response.status(), 200);
        let mut body = response.bytes_stream();
        let mut seen = until_tool_input_start(&mut body, "c1").await;
        // The arguments go on streaming for about three seconds from here.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let early = sessions(&app, &agent).await;
        assert!(
            !seen.contains("tool-input-available"),
            "still streaming its arguments: {seen}"
        );
        if speculating {
            assert_eq!(early.len(), 1, "started while the call streams: {early:?}");
        } else {
            assert!(
                early.is_empty(),
                "nothing starts before the call: {early:?}"
            );
        }
        while let Some(piece) = body.next().await {
            seen.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
        }
        let (chunks, done) = parse_events(&seen);
        assert!(done);
        assert!(output_of(&chunks, "c1").contains("started"), "{chunks:?}");
        let listed = sessions(&app, &agent).await;
        assert_eq!(listed.len(), 1, "one session for the chat: {listed:?}");
        assert_eq!(listed[0]["state"], "ready");
        let (speculative,): (bool,) =
            sqlx::query_as("SELECT speculative FROM agent_runtime_sessions")
                .fetch_one(app.store.pool())
                .await
                .unwrap();
        assert!(!speculative, "the call used it");
    }
}

/// W11: a speculation the model does not follow through (here the turn is stopped while
/// the call streams) is torn down after its grace, not after the profile's idle window
/// (a minute here); the next call starts afresh.
#[tokio::test]
async fn an_unused_speculative_worker_is_torn_down_after_its_grace() {
    let (app, _manager) = system(60_000, |c| {
        c.workers.speculation_grace = Some(Duration::from_secs(1));
    })
    .await;
    let (agent, chat) = light_agent(&app).await;
    app.provider.push(slow_shell(
        "c1",
        &format!("echo never # {}", "y".repeat(80)),
        20,
    ));
    let response = app.send(&chat, &json!({"content": "run it"})).await;
    let mut body = response.bytes_stream();
    until_tool_input_start(&mut body, "c1").await;
    // Let it become ready, then stop the turn before the call is complete.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = sessions(&app, &agent).await;
        if listed.first().is_some_and(|s| s["state"] == "ready") {
            break;
        }
        assert!(Instant::now() < deadline, "never ready: {listed:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = worker_pid(&app).await;
    let stopped = app
        .post_json(&format!("/v1/chats/{chat}/stop"), &json!({}))
        .await;
    assert_eq!(stopped.status(), 202);
    while body.next().await.is_some() {}
    torn_down(&app, &agent, pid, Duration::from_secs(15)).await;

    app.provider.push(shell("c2", "echo fresh"));
    app.provider.push(text("ok"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "now"})).await).await;
    assert!(output_of(&chunks, "c2").contains("fresh"), "{chunks:?}");
    assert_eq!(sessions(&app, &agent).await.len(), 2);
}

/// W10: the newest workspace snapshot row of `agent`, with its storage key.
async fn snapshot_row(app: &TestApp, agent: &str) -> Option<(String, i64, String)> {
    sqlx::query_as(
        "SELECT storage_key, size_bytes, session_id::text FROM workspace_snapshots
         WHERE agent_id = $1::uuid",
    )
    .bind(agent)
    .fetch_optional(app.store.pool())
    .await
    .unwrap()
}

/// The file a stored snapshot's bytes are in (the test's local artifact directory).
pub(crate) fn snapshot_blob(app: &TestApp, storage_key: &str) -> PathBuf {
    std::env::temp_dir()
        .join(format!("brain-test-artifacts-{}", app.db_name))
        .join(storage_key)
}

/// The snapshot outcome recorded on the agent's newest session.
pub(crate) async fn newest_snapshot_state(app: &TestApp, agent: &str) -> Value {
    sessions(app, agent).await[0]["snapshot_state"].clone()
}

/// One turn whose shell call runs `command`; returns the call's output.
async fn shell_turn(app: &TestApp, chat: &str, id: &str, command: &str) -> String {
    app.provider.push(shell(id, command));
    app.provider.push(text("done"));
    let (chunks, _) = read_stream(app.send(chat, &json!({"content": "go"})).await).await;
    app.settled().await;
    output_of(&chunks, id)
}

/// Waits for the agent's newest session to be `terminated`.
pub(crate) async fn terminated(app: &TestApp, agent: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let listed = sessions(app, agent).await;
        if listed[0]["state"] == "terminated" {
            return;
        }
        assert!(Instant::now() < deadline, "never torn down: {listed:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_workspace_survives_idle_teardown_into_the_chats_next_session() {
    let (app, _manager) = system(1_500, |_| {}).await;
    let (agent, chat) = light_agent(&app).await;
    let out = shell_turn(
        &app,
        &chat,
        "w1",
        "mkdir -p src && echo remember-me > src/notes.txt && ln -s src/notes.txt link && echo written",
    )
    .await;
    assert!(out.contains("written"), "{out}");
    let first = sessions(&app, &agent).await[0]["id"].clone();

    terminated(&app, &agent, Duration::from_secs(20)).await;
    assert_eq!(newest_snapshot_state(&app, &agent).await, "stored");
    let (key, size, taken_by) = snapshot_row(&app, &agent).await.expect("a snapshot row");
    assert_eq!(json!(taken_by), first);
    let blob = std::fs::metadata(snapshot_blob(&app, &key)).expect("the bytes are stored");
    assert_eq!(blob.len() as i64, size);
    // Listed on the session API, counted in usage.
    let listed: Value = app
        .get(&format!("/v1/agents/{agent}/sessions"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["snapshots"][0]["size_bytes"], json!(size));
    assert_eq!(listed["snapshots"][0]["chat_id"], json!(chat));
    assert!(listed["snapshots"][0]["created_at"].is_string());
    let usage: Value = app.get("/v1/usage").await.json().await.unwrap();
    assert_eq!(usage["snapshot_bytes"], json!(size), "{usage}");

    // The next turn gets a new session whose worker restored the files before it was
    // ready: the first call already finds them.
    let out = shell_turn(&app, &chat, "w2", "cat src/notes.txt link").await;
    assert_eq!(out.matches("remember-me").count(), 2, "{out}");
    let listed = sessions(&app, &agent).await;
    assert_eq!(listed.len(), 2);
    assert_ne!(listed[0]["id"], first, "a new session");
    assert_eq!(listed[0]["state"], "ready");
    assert!(app.provider.violations().is_empty());
}

#[tokio::test]
async fn a_workspace_over_the_cap_drops_the_chats_snapshot() {
    let profiles = json!({"profiles": {"light": {"snapshotMaxBytes": 16384}}});
    let (app, _manager) = system_with_profiles(1_500, Some(profiles), |c| {
        c.artifacts.snapshot_sweep_interval = Duration::from_millis(200);
    })
    .await;
    let (agent, chat) = light_agent(&app).await;
    shell_turn(&app, &chat, "o1", "echo small > small.txt").await;
    terminated(&app, &agent, Duration::from_secs(20)).await;
    assert_eq!(newest_snapshot_state(&app, &agent).await, "stored");
    let (key, _, _) = snapshot_row(&app, &agent)
        .await
        .expect("the small one is kept");

    // The next session restores it, then the workspace grows past the cap.
    let out = shell_turn(
        &app,
        &chat,
        "o2",
        "cat small.txt && head -c 65536 /dev/urandom > big.bin && echo grown",
    )
    .await;
    assert!(out.contains("small") && out.contains("grown"), "{out}");
    terminated(&app, &agent, Duration::from_secs(20)).await;
    assert_eq!(newest_snapshot_state(&app, &agent).await, "over_cap");
    // No snapshot is taken and the older one is dropped, bytes included: a restore never
    // brings back an older state than the one the chat left.
    assert!(snapshot_row(&app, &agent).await.is_none());
    let blob = snapshot_blob(&app, &key);
    let deadline = Instant::now() + Duration::from_secs(10);
    while blob.exists() {
        assert!(
            Instant::now() < deadline,
            "the dropped snapshot's bytes are swept"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let usage: Value = app.get("/v1/usage").await.json().await.unwrap();
    assert_eq!(usage["snapshot_bytes"], json!(0));
    let out = shell_turn(&app, &chat, "o3", "ls").await;
    assert!(
        !out.contains("small.txt"),
        "the third session starts empty: {out}"
    );
}

#[tokio::test]
async fn a_snapshot_past_retention_is_deleted_with_its_bytes() {
    let (app, _manager) = system(1_500, |c| {
        c.artifacts.snapshot_sweep_interval = Duration::from_millis(200);
    })
    .await;
    let (agent, chat) = light_agent(&app).await;
    shell_turn(&app, &chat, "r1", "echo old > old.txt").await;
    terminated(&app, &agent, Duration::from_secs(20)).await;
    let (key, _, _) = snapshot_row(&app, &agent).await.expect("stored");
    let blob = snapshot_blob(&app, &key);
    assert!(blob.exists());
    // Older than the default retention (168 h).
    sqlx::query("UPDATE workspace_snapshots SET created_at = now() - interval '169 hours'")
        .execute(app.store.pool())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while snapshot_row(&app, &agent).await.is_some() || blob.exists() {
        assert!(
            Instant::now() < deadline,
            "the expired snapshot and its bytes are swept"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = shell_turn(&app, &chat, "r2", "cat old.txt || echo missing").await;
    assert!(out.contains("missing"), "{out}");
}

#[tokio::test]
async fn a_profile_with_snapshots_off_tears_down_without_one() {
    let profiles = json!({"profiles": {"light": {"snapshots": false}}});
    let (app, _manager) = system_with_profiles(1_500, Some(profiles), |_| {}).await;
    let (agent, chat) = light_agent(&app).await;
    shell_turn(&app, &chat, "f1", "echo gone > notes.txt").await;
    let started = Instant::now();
    terminated(&app, &agent, Duration::from_secs(20)).await;
    println!(
        "idle teardown without a snapshot: {:?} after the turn",
        started.elapsed()
    );
    assert_eq!(newest_snapshot_state(&app, &agent).await, Value::Null);
    assert!(snapshot_row(&app, &agent).await.is_none());
    let out = shell_turn(&app, &chat, "f2", "cat notes.txt || echo missing").await;
    assert!(out.contains("missing"), "{out}");
}

/// The local launcher confines each worker. A command of one chat's worker
/// (a) finds no other session's workspace, by a relative or an absolute path, (b) sees no
/// process of the machine but its own sandbox's (not the runtime-manager, not the test,
/// not the other worker), and (c) reads no session token and no secret of another
/// process in `/proc/*/environ`, its worker's (`$PPID`) and pid 1 included; its own
/// workspace works as ever.
#[tokio::test]
async fn a_local_workers_commands_see_only_their_own_workspace_and_processes() {
    let (app, manager) = system(60_000, |_| {}).await;
    let (agent, first) = light_agent(&app).await;
    let second = app.new_chat(&agent).await;
    let marker = format!("notes-of-the-first-chat-{}", uuid::Uuid::new_v4().simple());

    app.provider.push(shell(
        "a",
        &format!("echo {marker} > notes.txt && echo written"),
    ));
    app.provider.push(text("ok"));
    let (chunks, _) = read_stream(app.send(&first, &json!({"content": "write"})).await).await;
    assert!(output_of(&chunks, "a").contains("written"), "{chunks:?}");

    let root = manager.workspaces().display().to_string();
    let command = format!(
        "echo mine > own.txt; cat own.txt; \
         echo '== siblings'; cat ../*/notes.txt {root}/*/notes.txt 2>&1; ls -a .. {root} 2>&1; \
         echo '== processes'; for p in /proc/[0-9]*; do printf '%s: ' \"$p\"; \
           tr '\\0' ' ' < \"$p/cmdline\"; echo; done; \
         echo '== environments'; tr '\\0' '\\n' < /proc/$PPID/environ 2>&1; \
           tr '\\0' '\\n' < /proc/1/environ 2>&1; \
           for p in /proc/[0-9]*; do tr '\\0' '\\n' < \"$p/environ\"; done 2>&1; \
         cat /etc/shadow >/dev/null 2>&1 && echo shadow-read-$((6 * 7)); echo '== end'"
    );
    app.provider.push(shell("b", &command));
    app.provider.push(text("ok"));
    let (chunks, _) =
        read_stream(app.send(&second, &json!({"content": "look around"})).await).await;
    let out = output_of(&chunks, "b");
    assert!(
        out.contains("\nmine\n== siblings") && out.contains("\n== end"),
        "{out}"
    );
    // (a) No other workspace, by any path.
    assert!(
        !out.contains(&marker),
        "another session's workspace is readable:\n{out}"
    );
    // (b) No process outside the sandbox: not the manager, not this test (the brain).
    let test_binary = std::env::current_exe().unwrap();
    let test_binary = test_binary.file_name().unwrap().to_str().unwrap();
    for outside in ["runtime-manager", test_binary] {
        assert!(!out.contains(outside), "{outside} is visible:\n{out}");
    }
    let processes = out
        .split("== processes")
        .nth(1)
        .and_then(|rest| rest.split("== environments").next())
        .unwrap_or_default();
    let workers = processes
        .lines()
        .filter(|line| line.contains(&bin("worker").display().to_string()))
        .count();
    assert!(
        workers <= 2,
        "only its own worker (and the sandbox's init naming it): {processes}"
    );
    // (c) No token (a JWT: `eyJ…`) and none of the manager's secrets, anywhere in /proc.
    for secret in ["eyJ", test_support::SESSION_TOKEN_KEY, "DATABASE_URL"] {
        assert!(!out.contains(secret), "{secret} is readable:\n{out}");
    }
    // Nor a file only root may read, where the manager runs as root (as here in CI): the
    // sandbox's uid is not root's, inside or out. (The markers are computed: the command's
    // own text is in the process listing.)
    assert!(!out.contains("shadow-read-42"), "{out}");
}

/// Where no namespace can be made (here: no `bwrap` on the manager's `PATH`)
/// the local launcher refuses to launch, and the session fails `launch_failed`
/// (`confinement_unavailable`); explicitly unconfined, for development only, it launches.
#[tokio::test]
async fn without_namespaces_a_local_worker_is_refused_unless_explicitly_unconfined() {
    let path = TempDir::new();
    std::os::unix::fs::symlink("/bin/sh", path.0.join("sh")).unwrap();
    let path = path.0.display().to_string();
    for unconfined in [false, true] {
        let mut env = vec![("PATH", path.as_str())];
        if unconfined {
            env.extend([
                ("RUNTIME_MANAGER_LOCAL_UNCONFINED", "true"),
                ("AGENT_RUNTIME_DEV", "true"),
            ]);
        }
        let (app, _manager) = system_with(None, &env, |_| {}).await;
        let (_, chat) = light_agent(&app).await;
        app.provider.push(shell("a", "echo ran-$((6 * 7))"));
        app.provider.push(text("ok"));
        let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "run"})).await).await;
        let out = output_of(&chunks, "a");
        let (reason, detail): (Option<String>, Option<String>) =
            sqlx::query_as("SELECT failure_reason, failure_detail FROM agent_runtime_sessions")
                .fetch_one(app.store.pool())
                .await
                .unwrap();
        if unconfined {
            assert!(out.contains("ran-42"), "{out}");
        } else {
            assert!(!out.contains("ran-42"), "{out}");
            assert_eq!(
                (reason.as_deref(), detail.as_deref()),
                (Some("launch_failed"), Some("confinement_unavailable"))
            );
        }
    }
}
