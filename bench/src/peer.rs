//! The peers side by side (`BENCH_ONLY=peer`, run by `make bench-peer`): the turn-overhead
//! scenario against the brain, LangGraph's dev server and Aegra (the Apache-2.0 server of
//! LangGraph's API on Postgres and Redis) in the same run, all calling the same scripted
//! provider, so that the ratio of what each adds survives a noisy shared machine; first
//! closed loops at concurrency 1 and 8, then an open loop at one arrival rate every side
//! sustains. Both peers serve the same one-node graph (`bench/peer/graph.py`) making one
//! streamed `ChatOpenAI` call and speak the same API, so one client ([`Peer`]) drives both;
//! the brain runs as its own process, as the peers do, and its turn is the one `turn`
//! measures.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::openloop::{self, Pool, Timed, added, chat_pool, direct_pool, pool_size};
use crate::system::{
    Row, System, closed_loop, create_database, db_url, drop_database, instant_ok, ms, pct,
    redis_url, row, signed_ms, sorted, window,
};
use crate::turn::{ChatClient, TURNS_PER_CHAT, minimal_body, timed_provider};

/// LangGraph's port: not its default 2024, which other services of these machines take.
const LANGGRAPH_PORT: u16 = 2124;
/// Aegra's port (its default 2026 is left to whoever runs one by hand).
const AEGRA_PORT: u16 = 2125;
/// The graph's name in `bench/peer/langgraph.json`.
const GRAPH: &str = "agent";
/// 8 is the level the peer target was first stated at (docs/PERFORMANCE.md); 1 shows the
/// cost without queueing.
const CONCURRENCY: [usize; 2] = [1, 8];
/// The open loop's arrival rate (`BENCH_PEER_RATE`, turns per second). By default 20 (the
/// rate the peer target was stated at), lowered to 70 % of the slowest side's closed-loop throughput at
/// concurrency 8 when that is less: a rate a side cannot sustain grows its queue without
/// bound and measures the queue, not the side (Aegra here tops out near 10 runs/s).
fn open_rate(slowest: f64) -> Result<f64> {
    match std::env::var("BENCH_PEER_RATE") {
        Ok(rate) => rate.trim().parse().context("BENCH_PEER_RATE: a number"),
        Err(_) => Ok((slowest * 0.7).clamp(1.0, 20.0).round()),
    }
}
/// The target: the brain's added time at least this many times lower than each
/// peer's, in the open loop.
const TARGET_RATIO: f64 = 300.0;

pub async fn peer(rows: &mut Vec<Row>) -> Result<()> {
    let system = Arc::new(System::start_process(&[]).await?);
    let aegra = match std::env::var("BENCH_PEER_AEGRA") {
        Ok(python) => Some(AegraStore::create(python).await?),
        Err(_) => None,
    };
    let result = with_servers(&system, aegra.as_ref(), rows).await;
    // Whatever happened, the databases and Aegra's Redis keys go (unless an interrupted
    // task still holds the brain's).
    if let Some(aegra) = aegra {
        aegra.remove().await;
    }
    if let Ok(system) = Arc::try_unwrap(system) {
        system.close().await;
    }
    result
}

async fn with_servers(
    system: &Arc<System>,
    aegra: Option<&AegraStore>,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let base_url = system.provider.openai_base_url();
    let mut servers = vec![Server::start(Kind::LangGraph, &base_url)?];
    match aegra {
        Some(store) => servers.push(Server::start(Kind::Aegra(store), &base_url)?),
        None => rows.push(row(
            "peer",
            "Aegra",
            String::new(),
            String::new(),
            format!(
                "not run: {}",
                std::env::var("BENCH_PEER_AEGRA_SKIPPED")
                    .unwrap_or_else(|_| "BENCH_PEER_AEGRA is not set".into())
            ),
        )),
    }
    // A Ctrl-C or SIGTERM must still stop the servers, which may sit in a session of
    // their own where the terminal's signal does not reach them: turn either into an error
    // so that the guards' drop runs.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = measure(system, &servers, rows) => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = terminate.recv() => Err(anyhow::anyhow!("terminated")),
    }
}

/// "12x", or why there is no ratio: a brain that adds nothing measurable (noise can push
/// the difference below zero) has none.
fn ratio(peer: f64, brain: f64) -> String {
    if brain > 0.0 {
        format!("{:.0}x", peer / brain)
    } else {
        "n/a (brain added <= 0)".into()
    }
}

async fn measure(system: &Arc<System>, servers: &[Server], rows: &mut Vec<Row>) -> Result<()> {
    let http = reqwest::Client::new();
    let mut peers = Vec::new();
    for server in servers {
        let peer = Arc::new(Peer {
            http: http.clone(),
            base: format!("http://127.0.0.1:{}", server.port),
        });
        server.wait_ready(&peer).await?;
        eprintln!("bench: {} up on port {}", server.name, server.port);
        peers.push((server.name, peer));
    }
    // Every timed call below queues exactly one scripted reply; counted to show at the
    // end whether any request went unscripted.
    let mut scripted = 0;
    // Runs per second of the slowest peer at the highest concurrency: what bounds the
    // open loop's rate.
    let mut slowest = f64::INFINITY;
    for concurrency in CONCURRENCY {
        let round = Round::run(system, &peers, concurrency).await?;
        scripted += round.scripted;
        if concurrency == CONCURRENCY[CONCURRENCY.len() - 1] {
            for side in &round.sides {
                slowest = slowest.min(per_second(side.runs, side.took));
            }
        }
        round.rows(rows);
        eprintln!(
            "bench: peer at concurrency {concurrency} done ({} turns; {})",
            round.brain_turns,
            round
                .sides
                .iter()
                .map(|side| format!("{} {} runs", side.name, side.runs))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    scripted += open_loop(system, &peers, slowest, rows).await?;

    let requests = system.provider.requests().len();
    let violations = system.provider.violations();
    for v in &violations {
        eprintln!("bench: scripted provider violation: {v}");
    }
    // A request beyond the scripted ones (a summary fold, a client retry) took a reply
    // meant for a turn, and the last turn got the provider's slow demo reply instead:
    // said in the table rather than fatal, since it shifts at most a p99.
    let unscripted = requests.saturating_sub(scripted);
    rows.push(row(
        "peer",
        "scripted provider",
        String::new(),
        String::new(),
        format!(
            "{requests} requests, {unscripted} unscripted, {} history violations",
            violations.len()
        ),
    ));
    Ok(())
}

fn per_second(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

/// One concurrency's closed loops: the brain, each peer, and the provider alone. The
/// latencies are sorted.
struct Round {
    concurrency: usize,
    /// The scripted replies the round used.
    scripted: usize,
    provider_requests: usize,
    p_first: Vec<Duration>,
    brain_turns: usize,
    brain_took: Duration,
    b_first: Vec<Duration>,
    b_end: Vec<Duration>,
    sides: Vec<Side>,
}

/// A peer's runs in a round.
struct Side {
    name: &'static str,
    runs: usize,
    took: Duration,
    first: Vec<Duration>,
    end: Vec<Duration>,
}

impl Round {
    async fn run(
        system: &Arc<System>,
        peers: &[(&'static str, Arc<Peer>)],
        concurrency: usize,
    ) -> Result<Self> {
        let mut chats = Vec::new();
        for _ in 0..concurrency {
            chats.push(ChatClient::new(system).await?);
        }
        // Warm-up, one turn per client on each side: connections, prepared statements,
        // and the peers' lazy imports on their first run.
        let warm = chats.iter().map(|client| client.turn(0));
        for result in futures_util::future::join_all(warm).await {
            result?;
        }
        let mut scripted = concurrency;
        let (brain, brain_took) =
            closed_loop(
                window(),
                chats,
                |client, n| async move { client.turn(n).await },
            )
            .await?;
        scripted += brain.len();
        let mut sides = Vec::new();
        for (name, peer) in peers {
            let mut threads = Vec::new();
            for _ in 0..concurrency {
                threads.push(GraphClient::new(peer, system).await?);
            }
            let warm = threads.iter().map(|client| client.run(0));
            for result in futures_util::future::join_all(warm).await {
                result?;
            }
            let (graph, took) =
                closed_loop(
                    window(),
                    threads,
                    |client, n| async move { client.run(n).await },
                )
                .await?;
            scripted += concurrency + graph.len();
            sides.push(Side {
                name,
                runs: graph.len(),
                took,
                first: sorted(graph.iter().map(|s| s.0).collect()),
                end: sorted(graph.iter().map(|s| s.1).collect()),
            });
        }
        // The provider alone at the same concurrency: what every side's added time is
        // measured against.
        let clients = vec![system.clone(); concurrency];
        let provider_window = window().min(Duration::from_secs(2));
        let (provider, _) = closed_loop(provider_window, clients, |system, _| async move {
            timed_provider(&system).await
        })
        .await?;
        scripted += provider.len();
        Ok(Self {
            concurrency,
            scripted,
            provider_requests: provider.len(),
            p_first: sorted(provider.iter().map(|s| s.0).collect()),
            brain_turns: brain.len(),
            brain_took,
            b_first: sorted(brain.iter().map(|s| s.1).collect()),
            b_end: sorted(brain.iter().map(|s| s.2).collect()),
            sides,
        })
    }

    fn rows(&self, rows: &mut Vec<Row>) {
        let Self {
            concurrency,
            ref p_first,
            ref b_first,
            ref b_end,
            ..
        } = *self;
        let scenario = format!("peer c={concurrency}");
        rows.push(row(
            &scenario,
            "provider TTFB (direct)",
            ms(pct(p_first, 50.0)),
            ms(pct(p_first, 99.0)),
            format!("{} requests", self.provider_requests),
        ));
        rows.push(row(
            &scenario,
            "brain added TTFB (text-delta - provider)",
            signed_ms(pct(b_first, 50.0), pct(p_first, 50.0)),
            signed_ms(pct(b_first, 99.0), pct(p_first, 99.0)),
            "difference of percentiles".into(),
        ));
        rows.push(row(
            &scenario,
            "brain end to end",
            ms(pct(b_end, 50.0)),
            ms(pct(b_end, 99.0)),
            format!(
                "{} turns, {:.0} turns/s",
                self.brain_turns,
                per_second(self.brain_turns, self.brain_took)
            ),
        ));
        for Side {
            name,
            runs,
            took,
            first: g_first,
            end: g_end,
        } in &self.sides
        {
            rows.push(row(
                &scenario,
                &format!("{name} added TTFB (first token - provider)"),
                signed_ms(pct(g_first, 50.0), pct(p_first, 50.0)),
                signed_ms(pct(g_first, 99.0), pct(p_first, 99.0)),
                "difference of percentiles".into(),
            ));
            rows.push(row(
                &scenario,
                &format!("{name} end to end"),
                ms(pct(g_end, 50.0)),
                ms(pct(g_end, 99.0)),
                format!("{runs} turns, {:.1} turns/s", per_second(*runs, *took)),
            ));
            let times = |p: f64| ratio(added(g_first, p_first, p), added(b_first, p_first, p));
            rows.push(row(
                &scenario,
                &format!("ratio {name} added / brain added"),
                times(50.0),
                times(99.0),
                "added TTFB".into(),
            ));
        }
    }
}

/// Every side at [`open_rate`] (of `slowest`, the slowest peer's runs per second) in an
/// open loop (`openloop`'s), one after the other, and the provider alone at the same
/// rate: the added time at equal load. Returns the number of scripted replies it queued.
async fn open_loop(
    system: &Arc<System>,
    peers: &[(&'static str, Arc<Peer>)],
    slowest: f64,
    rows: &mut Vec<Row>,
) -> Result<usize> {
    // 300 turns a side at the default window and rate: a p99 off the maximum.
    let span = window() * 3;
    let rate = open_rate(slowest)?;
    let size = pool_size(rate);
    let chats = chat_pool(system, size).await?;
    let brain = openloop::measure(&chats, rate, span).await?;
    let mut scripted = brain.sent;
    let mut sides = Vec::new();
    for (name, peer) in peers {
        let (peer, system) = (peer.clone(), system.clone());
        let threads = Pool::new(
            size,
            Box::new(move || {
                let (peer, system) = (peer.clone(), system.clone());
                Box::pin(async move { GraphClient::new(&peer, &system).await })
            }),
        )
        .await?;
        let graph = openloop::measure(&threads, rate, span).await?;
        scripted += graph.sent;
        sides.push((*name, graph));
    }
    let direct = direct_pool(system, minimal_body(), size).await?;
    let provider = openloop::measure(&direct, rate, span).await?;
    scripted += provider.sent;

    let scenario = format!("peer open loop {rate} turns/s");
    let p_first = &provider.first;
    rows.push(row(
        &scenario,
        "provider TTFB (direct)",
        ms(pct(p_first, 50.0)),
        ms(pct(p_first, 99.0)),
        provider.summary,
    ));
    rows.push(row(
        &scenario,
        "brain added TTFB (text-delta - provider)",
        signed_ms(pct(&brain.first, 50.0), pct(p_first, 50.0)),
        signed_ms(pct(&brain.first, 99.0), pct(p_first, 99.0)),
        format!("difference of percentiles; {}", brain.summary),
    ));
    for (name, graph) in sides {
        rows.push(row(
            &scenario,
            &format!("{name} added TTFB (first token - provider)"),
            signed_ms(pct(&graph.first, 50.0), pct(p_first, 50.0)),
            signed_ms(pct(&graph.first, 99.0), pct(p_first, 99.0)),
            format!("difference of percentiles; {}", graph.summary),
        ));
        let verdict = |p: f64| {
            let (g, b) = (
                added(&graph.first, p_first, p),
                added(&brain.first, p_first, p),
            );
            if b > 0.0 && g / b >= TARGET_RATIO {
                "met"
            } else {
                "missed"
            }
        };
        rows.push(row(
            &scenario,
            &format!("ratio {name} added / brain added"),
            ratio(
                added(&graph.first, p_first, 50.0),
                added(&brain.first, p_first, 50.0),
            ),
            ratio(
                added(&graph.first, p_first, 99.0),
                added(&brain.first, p_first, 99.0),
            ),
            format!(
                "target >= {TARGET_RATIO:.0}x: p50 {}, p99 {}",
                verdict(50.0),
                verdict(99.0)
            ),
        ));
    }
    eprintln!("bench: peer open loop done");
    Ok(scripted)
}

/// One client of a peer: a thread of its own, renewed every [`TURNS_PER_CHAT`] runs as the
/// brain's clients renew their chats, so both sides carry histories of the same length.
struct GraphClient {
    peer: Arc<Peer>,
    system: Arc<System>,
    thread: Mutex<String>,
}

impl GraphClient {
    async fn new(peer: &Arc<Peer>, system: &Arc<System>) -> Result<Arc<Self>> {
        Ok(Arc::new(Self {
            peer: peer.clone(),
            system: system.clone(),
            thread: Mutex::new(peer.thread().await?),
        }))
    }

    async fn run(&self, n: usize) -> Result<(Duration, Duration)> {
        self.prepare(n).await?;
        self.time_from(Instant::now()).await
    }
}

impl Timed for GraphClient {
    async fn prepare(&self, n: usize) -> Result<()> {
        if n % TURNS_PER_CHAT == TURNS_PER_CHAT - 1 {
            let fresh = self.peer.thread().await?;
            *self
                .thread
                .lock()
                .map_err(|_| anyhow!("thread lock poisoned"))? = fresh;
        }
        Ok(())
    }

    async fn time_from(&self, since: Instant) -> Result<(Duration, Duration)> {
        let thread = self
            .thread
            .lock()
            .map_err(|_| anyhow!("thread lock poisoned"))?
            .clone();
        self.peer.timed_run(&self.system, &thread, since).await
    }
}

/// A client of a peer's HTTP API (LangGraph's, which Aegra speaks too).
struct Peer {
    http: reqwest::Client,
    base: String,
}

impl Peer {
    /// A new thread: one per client, so that runs never queue behind each other on a
    /// thread (LangGraph rejects a second run on a busy thread by default).
    async fn thread(&self) -> Result<String> {
        let response = self
            .http
            .post(format!("{}/threads", self.base))
            .json(&json!({}))
            .send()
            .await?;
        if !response.status().is_success() {
            bail!(
                "POST /threads: {} {}",
                response.status(),
                response.text().await?
            );
        }
        let thread: Value = response.json().await?;
        Ok(thread["thread_id"]
            .as_str()
            .context("POST /threads: no thread_id")?
            .to_owned())
    }

    /// One run streamed to its end: (first event carrying the model's text, end), from
    /// `started` (the send, or its instant on an open loop's schedule). `messages-tuple` is
    /// the stream mode that relays the model's tokens as they come, as `event: messages`
    /// with `data: [message chunk, metadata]`.
    async fn timed_run(
        &self,
        system: &System,
        thread: &str,
        started: Instant,
    ) -> Result<(Duration, Duration)> {
        system.provider.push(instant_ok());
        let body = json!({
            "assistant_id": GRAPH,
            "input": {"messages": [{"role": "user", "content": "hi"}]},
            "stream_mode": ["messages-tuple"],
        });
        let response = self
            .http
            .post(format!("{}/threads/{thread}/runs/stream", self.base))
            .json(&body)
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("run: {} {}", response.status(), response.text().await?);
        }
        let mut stream = response.bytes_stream();
        let mut buffer = Vec::new();
        let mut first_token = None;
        while let Some(piece) = stream.next().await {
            let piece = piece?;
            let now = started.elapsed();
            // Events are separated by a blank line; the server may end lines with CRLF.
            buffer.extend(piece.iter().filter(|b| **b != b'\r'));
            while let Some(at) = buffer.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = buffer.drain(..at + 2).collect();
                let event = String::from_utf8_lossy(&event);
                let mut name = "message";
                let mut data = String::new();
                for line in event.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                match name {
                    "error" => bail!("a peer's run failed: {data}"),
                    "messages" if first_token.is_none() => {
                        let tuple: Value = serde_json::from_str(&data)?;
                        if tuple[0]["content"].as_str().is_some_and(|t| !t.is_empty()) {
                            first_token = Some(now);
                        }
                    }
                    _ => {}
                }
            }
        }
        let end = started.elapsed();
        match first_token {
            Some(first) => Ok((first, end)),
            None => bail!("a peer's run streamed no model text"),
        }
    }
}

/// Aegra's own state: a Postgres database (its migrations run at its start) and a prefix
/// for its Redis keys (its job queue and run channels), so that nothing of another run or
/// another user of the local Redis mixes in. The database is made before the server
/// starts and both are removed after it stopped.
struct AegraStore {
    /// The virtualenv's interpreter, with `aegra-api` installed (`BENCH_PEER_AEGRA`).
    python: String,
    db_name: String,
    redis_prefix: String,
}

/// How long the Redis cleanup may take before it is given up (the keys expire anyway).
const REDIS_CLEANUP_LIMIT: Duration = Duration::from_secs(10);

impl AegraStore {
    async fn create(python: String) -> Result<Self> {
        Ok(Self {
            python,
            db_name: create_database("aegra").await?,
            redis_prefix: format!("bench-aegra-{}", uuid::Uuid::new_v4().simple()),
        })
    }

    async fn remove(self) {
        drop_database(&self.db_name).await;
        let prefix = self.redis_prefix;
        let cleanup = async {
            let client = redis::Client::open(redis_url())?;
            let mut redis = client.get_multiplexed_async_connection().await?;
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{prefix}:*"))
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut redis)
                    .await?;
                if !keys.is_empty() {
                    let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut redis).await?;
                }
                if next == 0 {
                    return anyhow::Ok(());
                }
                cursor = next;
            }
        };
        match tokio::time::timeout(REDIS_CLEANUP_LIMIT, cleanup).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("bench: Aegra's Redis keys {prefix}:* not removed: {e:#}"),
            Err(_) => eprintln!("bench: Aegra's Redis keys {prefix}:* not removed in time"),
        }
    }
}

/// Which peer a [`Server`] runs.
enum Kind<'a> {
    /// `langgraph dev` (in-memory runs, no Postgres or Redis).
    LangGraph,
    /// Aegra's API (`aegra_api.main:app` under uvicorn) on its own database and the local
    /// Redis, with its Redis job queue and broker on (`REDIS_BROKER_ENABLED`): the
    /// production arrangement, runs handed to its worker loops through Redis.
    Aegra(&'a AegraStore),
}

/// A peer's server as a child process, in a scratch directory of its own holding a copy
/// of `langgraph.json` and `graph.py` (LangGraph keeps its in-memory state in
/// `.langgraph_api` under its working directory, and both resolve the graph's path from
/// the config's directory). Dropping it stops the server.
struct Server {
    name: &'static str,
    port: u16,
    /// The path that answers 200 once it serves.
    ready: &'static str,
    child: tokio::process::Child,
    workdir: PathBuf,
    log: PathBuf,
}

impl Server {
    fn start(kind: Kind<'_>, openai_base_url: &str) -> Result<Self> {
        let (name, port, ready) = match kind {
            Kind::LangGraph => ("LangGraph", LANGGRAPH_PORT, "/ok"),
            Kind::Aegra(_) => ("Aegra", AEGRA_PORT, "/health"),
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            bail!(
                "port {port} is taken (listening pids: {:?}): the peer bench runs {name} \
                 there; stop whatever holds it",
                listeners(port)
            );
        }
        let source = peer_dir();
        let workdir =
            std::env::temp_dir().join(format!("bench-peer-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&workdir)?;
        for file in ["langgraph.json", "graph.py"] {
            std::fs::copy(source.join(file), workdir.join(file))
                .with_context(|| format!("{} (BENCH_PEER_DIR)", source.join(file).display()))?;
        }
        let log = workdir.join("server.log");
        let output = std::fs::File::create(&log)?;
        let port_arg = port.to_string();
        let mut command = match kind {
            Kind::LangGraph => {
                let langgraph = std::env::var("BENCH_PEER_LANGGRAPH")
                    .unwrap_or_else(|_| "langgraph".to_owned());
                let mut command = tokio::process::Command::new(langgraph);
                command
                    .args(["dev", "--no-browser", "--no-reload", "--host", "127.0.0.1"])
                    .args(["--port", &port_arg, "--config", "langgraph.json"])
                    // Without these it tries to reach the internet.
                    .env("LANGGRAPH_CLI_NO_ANALYTICS", "1")
                    .env("LANGGRAPH_NO_VERSION_CHECK", "true")
                    .env("LANGSMITH_TRACING", "false");
                command
            }
            Kind::Aegra(store) => {
                let mut command = tokio::process::Command::new(&store.python);
                command
                    .args(["-m", "uvicorn", "aegra_api.main:app", "--host", "127.0.0.1"])
                    .args(["--port", &port_arg, "--no-access-log"])
                    // It reads `langgraph.json` when there is no `aegra.json`; said
                    // explicitly so that a stray one is not picked up.
                    .env("AEGRA_CONFIG", "langgraph.json")
                    .env("DATABASE_URL", db_url(&store.db_name))
                    .env("REDIS_BROKER_ENABLED", "true")
                    .env("REDIS_URL", redis_url())
                    .env(
                        "REDIS_CHANNEL_PREFIX",
                        format!("{}:run:", store.redis_prefix),
                    )
                    .env("WORKER_QUEUE_KEY", format!("{}:jobs", store.redis_prefix))
                    // JSON logs at warning and above, as the brain logs at warn here.
                    .env("ENV_MODE", "PRODUCTION")
                    .env("LOG_LEVEL", "WARNING")
                    .env("LANGSMITH_TRACING", "false");
                command
            }
        };
        let child = command
            .current_dir(&workdir)
            .env("OPENAI_BASE_URL", openai_base_url)
            .env("OPENAI_API_KEY", "sk-bench-openai")
            .stdin(std::process::Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!("starting {name} (BENCH_PEER_LANGGRAPH, BENCH_PEER_AEGRA; make bench-peer installs both)")
            })?;
        Ok(Self {
            name,
            port,
            ready,
            child,
            workdir,
            log,
        })
    }

    /// Waits for its ready path; the first start imports LangChain (and Aegra migrates
    /// its database) and takes seconds.
    async fn wait_ready(&self, peer: &Peer) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let ok = peer
                .http
                .get(format!("{}{}", peer.base, self.ready))
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            if ok.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if Instant::now() > deadline || !pid_alive(self.child.id()) {
                // Kept for reading: the drop removes the directory it is in.
                let kept = std::env::temp_dir().join(format!("bench-peer-{}.log", self.port));
                let _ = std::fs::copy(&self.log, &kept);
                bail!("{} did not come up; its log: {}", self.name, kept.display());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Server {
    /// SIGTERM to the child and to whatever listens on the port (the dev server may
    /// re-execute itself in a new session, out of the child's reach), SIGKILL after 5 s.
    fn drop(&mut self) {
        let port = self.port;
        let mut pids: HashSet<u32> = listeners(port).into_iter().collect();
        pids.extend(self.child.id());
        signal(&pids, "-TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        let alive = |pids: &HashSet<u32>| {
            pids.iter().any(|pid| pid_alive(Some(*pid))) || !listeners(port).is_empty()
        };
        while alive(&pids) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if alive(&pids) {
            pids.extend(listeners(port));
            signal(&pids, "-KILL");
            let _ = self.child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

/// Where `langgraph.json` and `graph.py` are: `BENCH_PEER_DIR` (the script sets it to
/// the clone it runs from), else the source tree this binary was built from.
fn peer_dir() -> PathBuf {
    std::env::var_os("BENCH_PEER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("peer"))
}

fn signal(pids: &HashSet<u32>, which: &str) {
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .args([which, &pid.to_string()])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Whether a process exists and is not a zombie (`/proc/PID/stat`'s state field).
fn pid_alive(pid: Option<u32>) -> bool {
    let Some(pid) = pid else { return false };
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// Pids of the processes holding a TCP socket listening on `port`: the socket inodes from
/// /proc/net/tcp{,6}, then the processes with a descriptor on one of them.
fn listeners(port: u16) -> Vec<u32> {
    let mut sockets = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            // sl, local_address (hex ADDR:PORT), rem_address, st (0A = LISTEN), …, inode.
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields
                .get(1)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port)
                && fields.get(3) == Some(&"0A")
                && let Some(inode) = fields.get(9)
            {
                sockets.insert(format!("socket:[{inode}]"));
            }
        }
    }
    if sockets.is_empty() {
        return Vec::new();
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let fds = std::fs::read_dir(entry.path().join("fd")).ok()?;
            fds.flatten()
                .any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| sockets.contains(target.to_string_lossy().as_ref()))
                })
                .then_some(pid)
        })
        .collect()
}
