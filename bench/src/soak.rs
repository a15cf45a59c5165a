//! The soak: 1,000 chats × 10 turns at concurrency 64 over two brain
//! replicas (release binaries, one database, one scripted provider), with Redis blipping
//! (blackholed, then cut, a few hundred ms at a time, through a fault proxy) and one
//! replica SIGKILLed and restarted on the same address along the way. Clients behave as a
//! careful frontend does: every message has a client id, and a request that fails (a
//! refused connection, a stream cut by the kill or ended `replica_lost` by a handover,
//! `503`, `409`) is retried with the same id
//! on either replica, so a turn is never sent twice (T12). At the end the database is
//! checked: every turn terminal, no user message lost or stored twice.
//!
//! `BENCH_SOAK_CHATS` shrinks the run (default 1,000). `BENCH_SOAK_KILL_EVERY_S` (D6)
//! replaces the one kill by a SIGKILL every that many seconds, of each replica in turn,
//! each restarted a second later: the turns of the killed one are taken over by the other
//! (D3) and their clients' retries follow them there (D5), so the run then also fails when
//! a single turn ends `interrupted`. `BENCH_SOAK_ROLLING=1` (D6) replaces the kills by a
//! rolling restart: replica A is SIGTERMed at 30 % of the turns (with a 500 ms drain, so
//! its longer turns are handed over, D4) and started again, then replica B at 60 %; the run
//! also fails when a turn ends `interrupted`.
//!
//! `BENCH_SOAK_TOOLS=1` (D6) puts worker tool calls in the mix: the agents get the `light`
//! profile and a release runtime-manager starts their workers (which dial replica A, and
//! dial it again across its restarts, W9); every other turn asks the offline demo model to
//! run `sleep 0.3; echo <message id> >> calls.log` in the chat's workspace. At the end each
//! such id must be in the workspaces' `calls.log` files exactly once: a call in flight at a
//! kill is re-attached on its worker, never run twice (D3). Keep `BENCH_SOAK_CHATS` near
//! the concurrency (64) in this mode: each chat has a worker process of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use scripted_provider::ScriptedProvider;
use serde_json::{Value, json};
use test_support::proxy::{Fault, FaultProxy};
use tokio::sync::Mutex;

use crate::hands::Manager;
use crate::system::{BrainProcess, Database, Row, SseData, free_addr, redis_url, row};

const TURNS_PER_CHAT: usize = 10;
const CONCURRENCY: usize = 64;
/// A client gives a turn up (and counts it lost) after this long.
const TURN_DEADLINE: Duration = Duration::from_secs(120);
/// The kill comes when this share of the turns has ended.
const KILL_AT: f64 = 0.4;
/// Short leases, so the killed replica's turns are reconciled within seconds.
const LEASE_TTL_MS: &str = "2000";
/// The rolling restart's drain: shorter than a tool turn, so those are handed over.
const ROLLING_DRAIN_MS: &str = "500";
/// When the rolling restart stops each replica, as a share of the turns ended.
const ROLLING_AT: [f64; 2] = [0.3, 0.6];

/// What disrupts the replicas along the run.
#[derive(Clone, Copy)]
enum Disruption {
    /// Replica B SIGKILLed once, at [`KILL_AT`].
    KillOnce,
    /// Each replica in turn SIGKILLed at this interval.
    KillEvery(Duration),
    /// Each replica SIGTERMed once, at [`ROLLING_AT`], and started again.
    Rolling,
}

/// The message of turn `t` whose id is `id`: with tools, every other one runs a command
/// that appends its id to the workspace's `calls.log`.
fn content(tools: bool, t: usize, id: &str) -> String {
    if tools && t % 2 == 1 {
        format!("run `sleep 0.3; echo {id} >> calls.log`")
    } else {
        "soak".to_owned()
    }
}

/// Whether the tool call of the turn of user message `id` ended `output-error`.
async fn call_failed(db: &Database, id: &str) -> Result<bool> {
    let (failed,): (bool,) = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM messages u JOIN messages a \
           ON a.team_id = u.team_id AND a.turn_id = u.turn_id AND a.role = 'assistant' \
         CROSS JOIN LATERAL jsonb_array_elements(a.parts) p \
         WHERE u.client_message_id = $1 AND u.role = 'user' \
           AND p->>'state' = 'output-error')",
    )
    .bind(id)
    .fetch_one(db.store.pool())
    .await?;
    Ok(failed)
}

/// How many times each line appears in the `calls.log` files under `dir`.
fn logged_calls(dir: &std::path::Path, counts: &mut std::collections::HashMap<String, usize>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            logged_calls(&path, counts);
        } else if path.file_name().is_some_and(|name| name == "calls.log") {
            for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
                *counts.entry(line.to_owned()).or_default() += 1;
            }
        }
    }
}

/// How one turn ended, as its client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Completed,
    Interrupted,
    Failed,
    Lost,
}

#[derive(Default)]
struct Counts {
    completed: AtomicUsize,
    interrupted: AtomicUsize,
    failed: AtomicUsize,
    lost: AtomicUsize,
    retries: AtomicUsize,
}

impl Counts {
    fn add(&self, seen: Seen) {
        let counter = match seen {
            Seen::Completed => &self.completed,
            Seen::Interrupted => &self.interrupted,
            Seen::Failed => &self.failed,
            Seen::Lost => &self.lost,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn ended(&self) -> usize {
        self.completed.load(Ordering::Relaxed)
            + self.interrupted.load(Ordering::Relaxed)
            + self.failed.load(Ordering::Relaxed)
            + self.lost.load(Ordering::Relaxed)
    }
}

struct Client {
    http: reqwest::Client,
    key: String,
    urls: [String; 2],
}

impl Client {
    /// One turn, retried with the same message id until its end is known.
    async fn turn(
        &self,
        chat: &str,
        message_id: &str,
        content: &str,
        first: usize,
        counts: &Counts,
    ) -> Seen {
        let deadline = Instant::now() + TURN_DEADLINE;
        for attempt in 0.. {
            if Instant::now() > deadline {
                return Seen::Lost;
            }
            if attempt > 0 {
                counts.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let url = &self.urls[(first + attempt) % 2];
            let sent = self
                .http
                .post(format!("{url}/v1/chats/{chat}/messages"))
                .bearer_auth(&self.key)
                .json(&json!({"content": content, "message_id": message_id}))
                .timeout(Duration::from_secs(30))
                .send()
                .await;
            let Ok(response) = sent else { continue };
            match response.status().as_u16() {
                200 => {}
                // Busy (a lost turn's hold not yet freed), in progress (its turn runs or
                // awaits reconciliation), draining or a store blip: ask again.
                409 | 503 | 500 | 502 => continue,
                _ => return Seen::Failed,
            }
            match read_end(response).await {
                Some(seen) => return seen,
                // The stream broke (its replica was killed): the retry learns the end.
                None => continue,
            }
        }
        Seen::Lost
    }
}

/// How a UI message stream ended: `None` if it broke before `finish` or `error`.
async fn read_end(response: reqwest::Response) -> Option<Seen> {
    let mut body = response.bytes_stream();
    let mut sse = SseData::default();
    let mut end = None;
    while let Some(piece) = body.next().await {
        let Ok(piece) = piece else { return None };
        for data in sse.push(&piece) {
            if data == "[DONE]" {
                return end;
            }
            let Ok(chunk) = serde_json::from_str::<Value>(&data) else {
                return None;
            };
            match chunk["type"].as_str() {
                Some("finish") => {
                    end = Some(match chunk["finishReason"].as_str() {
                        Some("stop") => Seen::Completed,
                        _ => Seen::Interrupted,
                    });
                }
                // A turn handed over at a drain (D4) goes on elsewhere: the retry with the
                // same id follows it there (D5).
                Some("error")
                    if chunk["errorText"]
                        .as_str()
                        .is_some_and(|t| t.starts_with("replica_lost")) =>
                {
                    return None;
                }
                Some("error") => end = Some(Seen::Failed),
                _ => {}
            }
        }
    }
    None
}

async fn create(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    path: &str,
    body: Value,
) -> Result<String> {
    let response = http
        .post(format!("{url}{path}"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await?;
    if response.status() != 201 {
        bail!("POST {path}: {}", response.status());
    }
    let created: Value = response.json().await?;
    Ok(created["id"].as_str().context("id")?.to_owned())
}

/// The run's shape, from the environment (the module doc lists the variables).
struct Settings {
    chats_total: usize,
    tools: bool,
    rolling: bool,
    disruption: Disruption,
}

impl Settings {
    fn from_env() -> Self {
        let chats_total: usize = std::env::var("BENCH_SOAK_CHATS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1_000);
        let flag = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
        let (tools, rolling) = (flag("BENCH_SOAK_TOOLS"), flag("BENCH_SOAK_ROLLING"));
        let kill_every = std::env::var("BENCH_SOAK_KILL_EVERY_S")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|s| *s > 0)
            .map(Duration::from_secs);
        let disruption = match (rolling, kill_every) {
            (true, _) => Disruption::Rolling,
            (false, Some(every)) => Disruption::KillEvery(every),
            (false, None) => Disruption::KillOnce,
        };
        Self {
            chats_total,
            tools,
            rolling,
            disruption,
        }
    }
}

/// What the run itself measured, beside the clients' counts.
struct Run {
    took: Duration,
    restarted_after: Duration,
    blips: usize,
    kills: usize,
}

/// What Postgres holds once the run is over.
struct Tally {
    /// Turns still `running` after reconciliation had its time.
    running: i64,
    by_status: Vec<(String, Option<String>, i64)>,
    stored_ids: i64,
    duplicated: i64,
    answers_twice: i64,
}

/// How the tool turns' commands ran (all 0 without tools).
#[derive(Default)]
struct ToolRuns {
    ran_twice: usize,
    never_ran: usize,
    failed_cleanly: usize,
    tool_turns: usize,
}

pub async fn soak(rows: &mut Vec<Row>) -> Result<()> {
    let settings = Settings::from_env();
    let db = Database::create().await?;
    let provider = ScriptedProvider::start().await?;
    let redis_upstream = redis_url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let redis = FaultProxy::start(&redis_upstream).await;
    let redis_via = format!("redis://{}", redis.addr());
    let namespace = format!("soak-{}", uuid::Uuid::new_v4().simple());
    let mut extra = vec![
        ("REDIS_URL", redis_via.as_str()),
        ("BRAIN_LEASE_TTL_MS", LEASE_TTL_MS),
        ("SESSION_QUEUE_NAMESPACE", namespace.as_str()),
    ];
    if settings.rolling {
        extra.push(("BRAIN_DRAIN_TIMEOUT_MS", ROLLING_DRAIN_MS));
    }
    let (a_addr, b_addr) = (free_addr()?, free_addr()?);
    let a = BrainProcess::start(&db, &provider, a_addr, &extra).await?;
    let b = BrainProcess::start(&db, &provider, b_addr, &extra).await?;
    let team = db.store.create_team("soak team").await?;
    let http = reqwest::Client::new();
    let urls = [format!("http://{a_addr}"), format!("http://{b_addr}")];
    // The workers dial replica A, and dial it again once it is back (W9).
    let manager = if settings.tools {
        Some(Manager::launch(&db.name, &urls[0], &namespace, None, &[])?)
    } else {
        None
    };
    let (plans, all_chats) = create_chats(&http, &urls[0], &team.api_key, &settings).await?;

    let counts = Arc::new(Counts::default());
    let total = settings.chats_total * TURNS_PER_CHAT;
    let client = Arc::new(Client {
        http: http.clone(),
        key: team.api_key.clone(),
        urls: urls.clone(),
    });
    let replicas = Arc::new(Mutex::new([Some(a), Some(b)]));
    let disruptor = Disruptor {
        counts: counts.clone(),
        replicas: replicas.clone(),
        kills: Arc::new(AtomicUsize::new(0)),
        stop: tokio_util::sync::CancellationToken::new(),
        // The same database for the restarted replicas (the original is dropped at the end).
        db: Database {
            name: db.name.clone(),
            store: db.store.clone(),
        },
        provider: provider.clone(),
        extra: extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        addrs: [a_addr, b_addr],
        total,
        disruption: settings.disruption,
    };
    let run = run(plans, client, redis, disruptor, settings.tools).await?;

    let tally = Tally::read(&db).await?;
    let tool_runs = match manager {
        Some(manager) => tool_runs(manager, &db, &all_chats).await?,
        None => ToolRuns::default(),
    };
    for replica in replicas.lock().await.iter_mut() {
        if let Some(replica) = replica.take() {
            replica.stop().await;
        }
    }
    provider.shutdown();
    db.drop().await;

    report(rows, &settings, &counts, total, &run, &tally, &tool_runs);
    if lost_or_broken(&settings, &counts, total, &tally, &tool_runs) {
        for r in &rows[rows.len() - 3..] {
            eprintln!("{}: {} {} {}", r.metric, r.p50, r.p99, r.other);
        }
        bail!("the soak lost, duplicated, interrupted or left turns running");
    }
    Ok(())
}

/// One agent per client (one turn per agent at a time, T9), its chats in turn. Answers
/// each client's agent and chats, and every chat.
async fn create_chats(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    settings: &Settings,
) -> Result<(Vec<(String, Vec<String>)>, Vec<String>)> {
    let profile = if settings.tools { "light" } else { "none" };
    let mut plans: Vec<(String, Vec<String>)> = Vec::new();
    for c in 0..CONCURRENCY {
        let agent = create(
            http,
            url,
            key,
            "/v1/agents",
            json!({"name": format!("soak-{c}"), "system_prompt": "Be brief.", "model": "openai/gpt-test",
                   "runtime_profile": profile}),
        )
        .await?;
        plans.push((agent, Vec::new()));
    }
    let mut all_chats = Vec::with_capacity(settings.chats_total);
    for i in 0..settings.chats_total {
        let (agent, chats) = &mut plans[i % CONCURRENCY];
        let path = format!("/v1/agents/{agent}/chats");
        let chat = create(http, url, key, &path, json!({})).await?;
        all_chats.push(chat.clone());
        chats.push(chat);
    }
    Ok((plans, all_chats))
}

/// The clients' turns, with Redis blipping and the replicas disrupted all along; over
/// when every client is done and the disruption that was under way finished.
async fn run(
    plans: Vec<(String, Vec<String>)>,
    client: Arc<Client>,
    redis: FaultProxy,
    disruptor: Disruptor,
    tools: bool,
) -> Result<Run> {
    let started = Instant::now();
    let clients: Vec<_> = plans
        .into_iter()
        .enumerate()
        .map(|(c, (_, chats))| {
            let client = client.clone();
            let counts = disruptor.counts.clone();
            tokio::spawn(async move {
                for (k, chat) in chats.iter().enumerate() {
                    for t in 0..TURNS_PER_CHAT {
                        let id = format!("soak-{chat}-{t}");
                        let said = content(tools, t, &id);
                        let seen = client.turn(chat, &id, &said, c + k + t, &counts).await;
                        counts.add(seen);
                    }
                }
            })
        })
        .collect();
    let done = tokio_util::sync::CancellationToken::new();
    let blips = Arc::new(AtomicUsize::new(0));
    let blipper = tokio::spawn(blip(redis, done.clone(), blips.clone()));
    let (clients_done, kills) = (disruptor.stop.clone(), disruptor.kills.clone());
    let killer = tokio::spawn(disruptor.disrupt());
    for c in clients {
        c.await?;
    }
    let took = started.elapsed();
    clients_done.cancel();
    let restarted_after = killer.await??;
    done.cancel();
    blipper.await?;
    Ok(Run {
        took,
        restarted_after,
        blips: blips.load(Ordering::Relaxed),
        kills: kills.load(Ordering::Relaxed),
    })
}

/// Redis blips until `done`: 300 ms blackholed, 300 ms cut, every 2 s.
async fn blip(
    redis: FaultProxy,
    done: tokio_util::sync::CancellationToken,
    blips: Arc<AtomicUsize>,
) {
    let mut next = Fault::Blackhole;
    loop {
        tokio::select! {
            () = done.cancelled() => break,
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
        redis.set(next);
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.set(Fault::None);
        blips.fetch_add(1, Ordering::Relaxed);
        next = if next == Fault::Blackhole {
            Fault::Cut
        } else {
            Fault::Blackhole
        };
    }
    redis.set(Fault::None);
}

/// What stops and restarts the replicas along the run.
struct Disruptor {
    counts: Arc<Counts>,
    replicas: Arc<Mutex<[Option<BrainProcess>; 2]>>,
    kills: Arc<AtomicUsize>,
    /// Cancelled once the clients are done.
    stop: tokio_util::sync::CancellationToken,
    db: Database,
    provider: ScriptedProvider,
    extra: Vec<(String, String)>,
    addrs: [std::net::SocketAddr; 2],
    total: usize,
    disruption: Disruption,
}

impl Disruptor {
    /// One replica SIGKILLed at 40 %, restarted on its address a second later; or, with
    /// `kill_every`, each replica in turn at that interval until the clients are done.
    /// Answers how long the last one took to be back.
    async fn disrupt(self) -> Result<Duration> {
        let extra: Vec<(&str, &str)> = self
            .extra
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut back_after = Duration::ZERO;
        for k in 0.. {
            if !self.next_disruption(k).await {
                break;
            }
            // The one kill is of replica B; the periodic ones and the rolling restart go
            // through both.
            let which = match self.disruption {
                Disruption::KillOnce => 1,
                Disruption::KillEvery(_) | Disruption::Rolling => k % 2,
            };
            let Some(victim) = self.replicas.lock().await[which].take() else {
                continue;
            };
            let killed_at = Instant::now();
            if matches!(self.disruption, Disruption::Rolling) {
                victim.stop().await;
            } else {
                victim.kill().await;
            }
            self.kills.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_secs(1)).await;
            let restarted =
                BrainProcess::start(&self.db, &self.provider, self.addrs[which], &extra).await?;
            self.replicas.lock().await[which] = Some(restarted);
            back_after = killed_at.elapsed();
        }
        Ok(back_after)
    }

    /// Waits for the time of disruption `k`; false when there is none.
    async fn next_disruption(&self, k: usize) -> bool {
        match self.disruption {
            Disruption::KillOnce if k > 0 => false,
            Disruption::KillOnce => {
                self.reached(KILL_AT).await;
                true
            }
            Disruption::Rolling => {
                let Some(&share) = ROLLING_AT.get(k) else {
                    return false;
                };
                tokio::select! {
                    () = self.stop.cancelled() => false,
                    () = self.reached(share) => true,
                }
            }
            Disruption::KillEvery(every) => tokio::select! {
                () = self.stop.cancelled() => false,
                () = tokio::time::sleep(every) => true,
            },
        }
    }

    async fn reached(&self, share: f64) {
        while (self.counts.ended() as f64) < self.total as f64 * share {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Tally {
    async fn read(db: &Database) -> Result<Self> {
        // Reconciliation of the killed replica's turns is at most a lease and a tick away.
        let mut running = i64::MAX;
        for _ in 0..100 {
            let (n,): (i64,) =
                sqlx::query_as("SELECT count(*) FROM turns WHERE status = 'running'")
                    .fetch_one(db.store.pool())
                    .await?;
            running = n;
            if n == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let by_status: Vec<(String, Option<String>, i64)> = sqlx::query_as(
            "SELECT status, error_code, count(*) FROM turns GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .fetch_all(db.store.pool())
        .await?;
        let (stored_ids,): (i64,) = sqlx::query_as(
            "SELECT count(DISTINCT client_message_id) FROM messages \
             WHERE role = 'user' AND client_message_id LIKE 'soak-%'",
        )
        .fetch_one(db.store.pool())
        .await?;
        let (duplicated,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM (SELECT chat_id, client_message_id FROM messages \
             WHERE role = 'user' GROUP BY 1, 2 HAVING count(*) > 1) d",
        )
        .fetch_one(db.store.pool())
        .await?;
        let (answers_twice,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM (SELECT turn_id FROM messages WHERE role = 'assistant' \
             GROUP BY 1 HAVING count(*) > 1) d",
        )
        .fetch_one(db.store.pool())
        .await?;
        Ok(Self {
            running,
            by_status,
            stored_ids,
            duplicated,
            answers_twice,
        })
    }
}

/// Every tool turn's command ran exactly once, or its call failed and said so (its part
/// `output-error`: the worker could not be reached within its bound, as during a Redis
/// blip when the call is relayed); a call that never ran yet reported an output would be
/// a lost call. Stops the manager.
async fn tool_runs(manager: Manager, db: &Database, all_chats: &[String]) -> Result<ToolRuns> {
    let mut runs = ToolRuns::default();
    let mut logged = std::collections::HashMap::new();
    logged_calls(&manager.workspaces, &mut logged);
    manager.stop().await;
    for chat in all_chats {
        for t in (1..TURNS_PER_CHAT).step_by(2) {
            runs.tool_turns += 1;
            let id = format!("soak-{chat}-{t}");
            match logged.get(&id).copied().unwrap_or(0) {
                0 if call_failed(db, &id).await? => runs.failed_cleanly += 1,
                0 => runs.never_ran += 1,
                1 => {}
                _ => runs.ran_twice += 1,
            }
        }
    }
    Ok(runs)
}

fn report(
    rows: &mut Vec<Row>,
    settings: &Settings,
    counts: &Counts,
    total: usize,
    run: &Run,
    tally: &Tally,
    tool_runs: &ToolRuns,
) {
    let statuses: Vec<String> = tally
        .by_status
        .iter()
        .map(|(s, code, n)| match code {
            Some(code) => format!("{s} ({code}) {n}"),
            None => format!("{s} {n}"),
        })
        .collect();
    rows.push(row(
        "soak",
        "turns sent / seen by clients",
        total.to_string(),
        String::new(),
        format!(
            "completed {}, interrupted {}, failed {}, lost {}; {} retries with the same id; {:.0} s",
            counts.completed.load(Ordering::Relaxed),
            counts.interrupted.load(Ordering::Relaxed),
            counts.failed.load(Ordering::Relaxed),
            counts.lost.load(Ordering::Relaxed),
            counts.retries.load(Ordering::Relaxed),
            run.took.as_secs_f64()
        ),
    ));
    rows.push(row(
        "soak",
        "turn rows in Postgres",
        statuses.join(", "),
        String::new(),
        format!("running {}", tally.running),
    ));
    rows.push(row(
        "soak",
        "user messages lost / duplicated",
        format!("{} / {}", total as i64 - tally.stored_ids, tally.duplicated),
        String::new(),
        format!(
            "{} stored for {total} ids; turns answered twice {}; {} Redis blips; {}",
            tally.stored_ids,
            tally.answers_twice,
            run.blips,
            disruption_note(settings.disruption, run)
        ),
    ));
    if settings.tools {
        rows.push(row(
            "soak",
            "tool calls run twice / never",
            format!("{} / {}", tool_runs.ran_twice, tool_runs.never_ran),
            String::new(),
            format!(
                "{} tool turns, each appending its id to the workspace's calls.log; \
                 {} calls failed and said so (output-error)",
                tool_runs.tool_turns, tool_runs.failed_cleanly
            ),
        ));
    }
}

fn disruption_note(disruption: Disruption, run: &Run) -> String {
    match disruption {
        Disruption::KillOnce => format!(
            "replica B killed at 40 % and back {:.1} s later",
            run.restarted_after.as_secs_f64()
        ),
        Disruption::KillEvery(every) => format!(
            "{} SIGKILLs, one every {} s, each replica back {:.1} s later",
            run.kills,
            every.as_secs(),
            run.restarted_after.as_secs_f64()
        ),
        Disruption::Rolling => format!(
            "{} replicas SIGTERMed in turn ({ROLLING_DRAIN_MS} ms drain), each back {:.1} s later",
            run.kills,
            run.restarted_after.as_secs_f64()
        ),
    }
}

/// Whether the run lost, duplicated, interrupted or left a turn running.
fn lost_or_broken(
    settings: &Settings,
    counts: &Counts,
    total: usize,
    tally: &Tally,
    tool_runs: &ToolRuns,
) -> bool {
    // With takeover (D3) and handover (D4), a stopped replica's turns go on elsewhere:
    // none is interrupted.
    let interrupted = !matches!(settings.disruption, Disruption::KillOnce)
        && (counts.interrupted.load(Ordering::Relaxed) != 0
            || tally.by_status.iter().any(|(s, _, _)| s == "interrupted"));
    tally.running != 0
        || counts.lost.load(Ordering::Relaxed) != 0
        || total as i64 != tally.stored_ids
        || tally.duplicated != 0
        || tally.answers_twice != 0
        || interrupted
        || tool_runs.ran_twice != 0
        || tool_runs.never_ran != 0
}
