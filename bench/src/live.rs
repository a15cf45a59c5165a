//! Many live turns: N turns posted at once on one brain, each on a slow model stream (a
//! delta a second), for how long the burst takes to be admitted (the intakes wait their
//! turn in the brain's intake queue), the brain's memory and CPU per open turn and
//! whether every stream ends as it should.
//!
//! The brain runs as its own process, the release binary next to this one, so that its
//! RSS and CPU can be read from `/proc` apart from the load generator's (the scripted
//! provider and the client stay in this process). The client speaks HTTP/2 with prior
//! knowledge over a few dozen connections: 10,000 turns over HTTP/1.1 would need 10,000
//! client sockets in the brain on top of its 10,000 provider sockets, over the 20,000
//! descriptors a process may have here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http2::SendRequest;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE};
use hyper_util::rt::{TokioExecutor, TokioIo};
use scripted_provider::{Reply, ScriptedProvider};
use store::{CreatedTeam, NewAgent, Store};
use tokio::sync::watch;

use crate::system::{
    BrainProcess, Database, Row, SseData, Usage, clock_ticks_per_second, free_addr, ms, pct, row,
    sorted, usage, window,
};

const LEVELS: [usize; 2] = [1_000, 10_000];
/// Turns per HTTP/2 connection: under the 200 concurrent streams hyper's server allows
/// on one connection by default.
const STREAMS_PER_CONNECTION: usize = 150;
/// The brain's wait bound for a queued intake. The default queue bound (10,000) admits the
/// whole burst, but its last intakes wait as long as the brain takes to get through the
/// 9,985 before them, which on two cores shared with this process and Postgres can pass
/// the default 30 s: this scenario measures how long admission takes, so it lets it take
/// that long rather than count refusals.
const INTAKE_WAIT: (&str, &str) = ("BRAIN_INTAKE_QUEUE_WAIT_MS", "120000");
/// The slow stream: the model sends a delta this often until the bench releases it.
const TICK: Duration = Duration::from_secs(1);
/// How long all N may take to open, and to end after the release, before the bench
/// gives up on the missing ones (and fails).
const OPEN_LIMIT: Duration = Duration::from_secs(600);
const END_LIMIT: Duration = Duration::from_secs(300);

/// HTTP/2 connections to the brain, enough for `turns` streams.
async fn connect(addr: SocketAddr, turns: usize) -> Result<Vec<SendRequest<Full<Bytes>>>> {
    let mut senders = Vec::new();
    for _ in 0..turns.div_ceil(STREAMS_PER_CONNECTION) {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            // Every stream on it fails too and is counted; this says why.
            if let Err(e) = connection.await {
                eprintln!("bench: an HTTP/2 connection to the brain failed: {e}");
            }
        });
        senders.push(sender);
    }
    Ok(senders)
}

/// What a live turn's stream said so far.
#[derive(Default)]
struct Tally {
    deltas: usize,
    /// A `finish` chunk with reason `stop`.
    finished: bool,
    /// `[DONE]`.
    done: bool,
}

impl Tally {
    /// Counts one SSE payload; `Err` for an `error` chunk. Prefix tests, not a JSON
    /// parse: this runs for every delta of every open turn, on the cores the brain uses.
    fn read(&mut self, payload: &str) -> Result<()> {
        if payload.starts_with(r#"{"type":"text-delta""#) {
            self.deltas += 1;
        } else if payload.starts_with(r#"{"type":"finish""#) {
            self.finished = payload.contains(r#""finishReason":"stop""#);
        } else if payload.starts_with(r#"{"type":"error""#) {
            bail!("the turn failed: {payload}");
        } else if payload == "[DONE]" {
            self.done = true;
        }
        Ok(())
    }
}

/// A live turn whose first text-delta arrived.
struct Opened {
    body: Incoming,
    sse: SseData,
    tally: Tally,
    /// Send → first text-delta.
    took: Duration,
}

/// Posts a message and reads the stream up to its first text-delta.
async fn open(mut sender: SendRequest<Full<Bytes>>, uri: String, key: Arc<str>) -> Result<Opened> {
    let started = Instant::now();
    let request = hyper::Request::post(uri)
        .header(AUTHORIZATION, format!("Bearer {key}"))
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(br#"{"content":"hold on"}"#)))?;
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let mut body = response.into_body();
    if status != 200 {
        let text = body.collect().await?.to_bytes();
        bail!("turn: {status} {}", String::from_utf8_lossy(&text));
    }
    let mut sse = SseData::default();
    let mut tally = Tally::default();
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            for payload in sse.push(data) {
                tally.read(&payload)?;
            }
        }
        if tally.deltas > 0 {
            return Ok(Opened {
                body,
                sse,
                tally,
                took: started.elapsed(),
            });
        }
    }
    bail!("the stream ended before its first text-delta")
}

/// Reads an open turn to its end: it must end with `finish` (stop) and `[DONE]`.
async fn read_to_end(mut opened: Opened) -> Result<()> {
    while let Some(frame) = opened.body.frame().await {
        if let Some(data) = frame?.data_ref() {
            for payload in opened.sse.push(data) {
                opened.tally.read(&payload)?;
            }
        }
    }
    let tally = opened.tally;
    if !(tally.finished && tally.done) {
        bail!(
            "the stream ended without finish (stop) and [DONE] after {} deltas",
            tally.deltas
        );
    }
    Ok(())
}

/// `n` agents with a chat each (one turn runs per agent), written straight to the
/// database: chat ids.
async fn chats(store: &Store, team: &CreatedTeam, n: usize) -> Result<Vec<String>> {
    let agent = NewAgent {
        name: "bench".into(),
        system_prompt: "You are terse.".into(),
        model: "openai/gpt-test".into(),
        fallback_models: Vec::new(),
        runtime_profile: "none".into(),
        concierge: false,
        approval_policy: Default::default(),
        disconnect_policy: Default::default(),
        auxiliary_models: Default::default(),
        stream_reasoning: false,
        memory_recall: Default::default(),
        knowledge_bases: Vec::new(),
        knowledge_recall: Default::default(),
        skills: Vec::new(),
        delegates: Vec::new(),
        egress: None,
    };
    let created: Vec<Result<String>> = futures_util::stream::iter(0..n)
        .map(|_| async {
            let agent = store
                .create_agent(team.team_id, &agent, &store::Actor::operator(None))
                .await?;
            let chat = store.create_chat(team.team_id, agent.id, None).await?;
            Ok(chat.id.to_string())
        })
        .buffer_unordered(16)
        .collect()
        .await;
    created.into_iter().collect()
}

#[derive(Default)]
struct Progress {
    opened: usize,
    failed: usize,
}

/// What one level measured.
struct Level {
    n: usize,
    /// From the burst's start to the last turn's first text-delta.
    open_all: Duration,
    /// The most intakes that waited in the brain's queue at once (its
    /// `brain_intake_queued_peak`).
    queue_peak: f64,
    /// Send → first text-delta, per turn that opened.
    open_each: Vec<Duration>,
    idle: Usage,
    at_open: Usage,
    held: Usage,
    end: Usage,
    /// This process's descriptors with all open (it hosts the provider).
    bench_fds: usize,
    hold: Duration,
    drain: Duration,
    /// Streams that ended with finish and [DONE].
    completed: usize,
    /// Why the others did not.
    failures: Vec<String>,
    /// Turns Postgres has as completed.
    stored: i64,
}

/// Opens `n` turns, holds them all open for the window, releases them and reads them to
/// their end.
async fn drive(
    brain: &BrainProcess,
    store: &Store,
    provider: &ScriptedProvider,
    key: &str,
    chats: &[String],
    ticks_per_second: u64,
) -> Result<Level> {
    let n = chats.len();
    for _ in 0..n {
        provider.push(Reply::Held {
            delta: "tick ".into(),
            every: TICK,
        });
    }
    let senders = connect(brain.addr, n).await?;
    let key: Arc<str> = Arc::from(key);
    let (progress, mut watch_progress) = watch::channel(Progress::default());
    let progress = Arc::new(progress);
    let idle = usage(brain.pid, ticks_per_second)?;
    let started = Instant::now();
    let tasks: Vec<_> = chats
        .iter()
        .enumerate()
        .map(|(i, chat)| {
            let sender = senders[i / STREAMS_PER_CONNECTION].clone();
            let uri = format!("http://{}/v1/chats/{chat}/messages", brain.addr);
            let (key, progress) = (key.clone(), progress.clone());
            // (send → first text-delta if it came, how the stream ended)
            tokio::spawn(async move {
                let opened = open(sender, uri, key).await;
                progress.send_modify(|p| match opened {
                    Ok(_) => p.opened += 1,
                    Err(_) => p.failed += 1,
                });
                match opened {
                    Ok(opened) => (Some(opened.took), read_to_end(opened).await),
                    Err(e) => (None, Err(e)),
                }
            })
        })
        .collect();
    let settled = tokio::time::timeout(
        OPEN_LIMIT,
        watch_progress.wait_for(|p| p.opened + p.failed >= n),
    )
    .await;
    let open_all = started.elapsed();
    if settled.is_err() {
        eprintln!("bench: live {n}: not every turn opened within {OPEN_LIMIT:?}");
    }
    let at_open = usage(brain.pid, ticks_per_second)?;
    let queue_peak = intake_queue_peak(brain.metrics_addr).await?;
    // All open for the window: the steady cost of N open turns.
    let hold = window();
    tokio::time::sleep(hold).await;
    let held = usage(brain.pid, ticks_per_second)?;
    let bench_fds = std::fs::read_dir("/proc/self/fd")?.count();
    provider.release_held();
    let released = Instant::now();
    let ended = tokio::time::timeout(END_LIMIT, futures_util::future::join_all(tasks)).await;
    let drain = released.elapsed();
    let end = usage(brain.pid, ticks_per_second)?;
    let (mut open_each, mut completed, mut failures) = (Vec::new(), 0, Vec::new());
    match ended {
        Ok(results) => {
            for result in results {
                let (took, ended) = result?;
                open_each.extend(took);
                match ended {
                    Ok(()) => completed += 1,
                    Err(e) => failures.push(format!("{e:#}")),
                }
            }
        }
        Err(_) => failures.push(format!(
            "streams still open {END_LIMIT:?} after the release"
        )),
    }
    Ok(Level {
        n,
        open_all,
        queue_peak,
        completed,
        open_each: sorted(open_each),
        idle,
        at_open,
        held,
        end,
        bench_fds,
        hold,
        drain,
        failures,
        // Every turn that ended has its end stored: the brain persists before `finish`.
        stored: completed_turns(store).await?,
    })
}

/// The brain's `brain_intake_queued_peak`, from its `/metrics` at `addr` (its metrics
/// port).
async fn intake_queue_peak(addr: SocketAddr) -> Result<f64> {
    let scrape = reqwest::get(format!("http://{addr}/metrics"))
        .await?
        .error_for_status()?
        .text()
        .await?;
    test_support::promtool::sample(&scrape, "brain_intake_queued_peak", &[])
        .context("brain_intake_queued_peak in the brain's /metrics")
}

async fn completed_turns(store: &Store) -> Result<i64> {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM turns WHERE status = 'completed'")
        .fetch_one(store.pool())
        .await?;
    Ok(n)
}

async fn level(n: usize, ticks_per_second: u64) -> Result<Level> {
    let db = Database::create().await?;
    let provider = ScriptedProvider::start().await?;
    let team = db.store.create_team("bench team").await?;
    let chats = chats(&db.store, &team, n).await?;
    let brain = BrainProcess::start(&db, &provider, free_addr()?, &[INTAKE_WAIT]).await?;
    let driven = drive(
        &brain,
        &db.store,
        &provider,
        &team.api_key,
        &chats,
        ticks_per_second,
    )
    .await;
    brain.stop().await;
    provider.shutdown();
    db.drop().await;
    driven
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn level_rows(m: &Level) -> Vec<Row> {
    let scenario = format!("live turns N={}", m.n);
    let n = m.n as f64;
    let per_turn_kib = (m.held.rss.saturating_sub(m.idle.rss)) as f64 / 1024.0 / n;
    let open_cpu = m.at_open.cpu.saturating_sub(m.idle.cpu);
    let hold_cpu = m.held.cpu.saturating_sub(m.at_open.cpu);
    let total_cpu = m.end.cpu.saturating_sub(m.idle.cpu);
    vec![
        row(
            &scenario,
            "send -> first text-delta",
            ms(pct(&m.open_each, 50.0)),
            ms(pct(&m.open_each, 99.0)),
            format!(
                "all {} posted at once: last first text-delta after {}, intake queue peak {:.0}",
                m.n,
                secs(m.open_all),
                m.queue_peak
            ),
        ),
        row(
            &scenario,
            "brain RSS",
            String::new(),
            String::new(),
            format!(
                "idle {}, all open {} ({per_turn_kib:.0} KiB/turn), peak (VmHWM) {}; fds all open: brain {}, bench {}",
                mib(m.idle.rss),
                mib(m.held.rss),
                mib(m.end.peak),
                m.held.fds,
                m.bench_fds
            ),
        ),
        row(
            &scenario,
            "brain CPU",
            String::new(),
            String::new(),
            format!(
                "opening {} ({:.2} ms/turn); holding {:.2} cores ({:.0} deltas/s, {}); all {} ({:.2} ms/turn)",
                secs(open_cpu),
                open_cpu.as_secs_f64() * 1000.0 / n,
                hold_cpu.as_secs_f64() / m.hold.as_secs_f64(),
                n / TICK.as_secs_f64(),
                secs(m.hold),
                secs(total_cpu),
                total_cpu.as_secs_f64() * 1000.0 / n,
            ),
        ),
        row(
            &scenario,
            "streams completed",
            String::new(),
            String::new(),
            format!(
                "{}/{} finish+[DONE], {}/{} turns completed in Postgres, all ended {} after release",
                m.completed,
                m.n,
                m.stored,
                m.n,
                secs(m.drain)
            ),
        ),
    ]
}

pub async fn live(rows: &mut Vec<Row>) -> Result<()> {
    let ticks_per_second = clock_ticks_per_second()?;
    for n in LEVELS {
        let measured = level(n, ticks_per_second).await?;
        let measured_rows = level_rows(&measured);
        // Also on stderr at once: a later level that fails stops the table from printing.
        for r in &measured_rows {
            eprintln!(
                "bench: {} | {} | {} | {} | {}",
                r.scenario, r.metric, r.p50, r.p99, r.other
            );
        }
        if measured.completed != n || measured.stored != n as i64 {
            for failure in measured.failures.iter().take(5) {
                eprintln!("bench: live {n}: {failure}");
            }
            bail!(
                "live turns N={n}: {} of {n} streams completed and {} turns were stored completed; {} streams failed",
                measured.completed,
                measured.stored,
                measured.failures.len()
            );
        }
        rows.extend(measured_rows);
    }
    Ok(())
}
