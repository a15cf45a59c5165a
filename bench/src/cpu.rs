//! CPU per turn: what one no-tool turn costs the brain, Postgres and Redis, the
//! figures an optimization of the turn is judged by.
//!
//! The brain is the release binary as its own process ([`System::start_process`]), so its
//! `/proc` CPU is its own: the client and the scripted provider stay in this process. The
//! turn is the production one: the binary's default log level (`info`, its spans on), the
//! team's four turn quotas set (high enough never to refuse), the events stream published
//! as every turn does, an agent with the default runtime profile (its tool catalog in the
//! request). After a warm-up, a fixed number of turns at a fixed concurrency; then a window
//! at concurrency 64 for throughput.
//!
//! - **brain**: utime + stime of the brain process (all its threads) over the turns.
//! - **Postgres, bench database's backends**: on-CPU time of the backends
//!   `pg_stat_activity` lists for the bench database (the brain's pool), from
//!   `/proc/<pid>/schedstat`. It leaves out the WAL writer, checkpointer and background
//!   writer, which work for every database; **all postgres processes** adds them, and any
//!   other database's backends on the machine (other runs' noise included).
//! - **Redis**: `INFO commandstats` deltas (this bench's own `INFO` calls left out), on a
//!   private `redis-server` started for the scenario so that no other client's commands
//!   count, and its main thread's on-CPU time; the shared Redis (`REDIS_URL`) when
//!   `redis-server` is not on PATH, and then the counts include whatever else uses it.
//! - **Postgres transactions**: `pg_stat_database` deltas for the bench database. Its
//!   counters are flushed by the backends at most once a second, so each end may miss the
//!   last second; both ends are read the same way, right after the clients stopped.
//!
//! Each client renews its chat every [`crate::turn::TURNS_PER_CHAT`] turns, as in the turn-overhead
//! scenario: a twentieth of a `POST /chats` is in every turn's figures.
//!
//! `BENCH_PERF_DATA=<file>` records the brain with `perf record --call-graph dwarf` over
//! the counted turns (docs/PERFORMANCE.md, the profile); the CPU figures of that run carry
//! perf's own cost and say so. `BENCH_CALLGRIND=<file>` runs the brain under callgrind
//! instead and adds its instructions per turn over the counted turns (their profile in
//! `<file>.1`); every timing of that run is valgrind's.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::system::{
    Row, System, clock_ticks_per_second, counted_loop, free_addr, ms, on_cpu, pct, proc_stat,
    redis_url, row, sorted, window,
};
use crate::turn::{ChatClient, high_quotas, put_quotas};

/// The counted turns and their concurrency.
const TURNS: usize = 2_000;
const CONCURRENCY: usize = 8;
/// Warm-up turns per client: connections, prepared statements, caches.
const WARM_UP_EACH: usize = 25;
/// The throughput level, for `BENCH_SECONDS`.
const WIDE: usize = 64;
/// Redis commands named in the row.
const TOP_COMMANDS: usize = 6;
/// Bound on each of the bench's own Postgres and Redis reads.
const READ_BOUND: Duration = Duration::from_secs(10);

/// A `redis-server` of the scenario's own.
struct PrivateRedis {
    child: tokio::process::Child,
    pid: u32,
    url: String,
}

impl PrivateRedis {
    /// `None` when `redis-server` is not on PATH.
    async fn start() -> Result<Option<Self>> {
        let port = free_addr()?.port().to_string();
        let spawned = tokio::process::Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no"])
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).context("starting redis-server"),
        };
        let pid = child.id().context("redis-server's pid")?;
        let url = format!("redis://127.0.0.1:{port}");
        let client = redis::Client::open(url.as_str())?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("redis-server exited at start: {status}");
            }
            let ping = tokio::time::timeout(Duration::from_secs(1), async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut conn).await
            });
            if let Ok(Ok(_)) = ping.await {
                return Ok(Some(Self { child, pid, url }));
            }
            if Instant::now() > deadline {
                bail!("redis-server did not answer within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// `pg_stat_database` counters of one database.
#[derive(Clone, Copy, Default)]
struct DbStats {
    commits: i64,
    rollbacks: i64,
    returned: i64,
    fetched: i64,
    inserted: i64,
    updated: i64,
    deleted: i64,
}

/// Everything measured, at one instant.
struct Snapshot {
    at: Instant,
    brain: Duration,
    /// pid → on-CPU time, for the bench database's backends and for every postgres process.
    backends: HashMap<u32, Duration>,
    postgres: HashMap<u32, Duration>,
    db: DbStats,
    /// Command → calls.
    redis_calls: HashMap<String, u64>,
    /// The private Redis' main thread.
    redis_cpu: Option<Duration>,
}

/// What the scenario reads its figures with.
struct Probe {
    admin: sqlx::PgPool,
    db_name: String,
    redis: redis::aio::MultiplexedConnection,
    redis_pid: Option<u32>,
    brain_pid: u32,
    ticks_per_second: u64,
}

impl Probe {
    async fn snapshot(&mut self) -> Result<Snapshot> {
        let pids: Vec<(i32,)> = bounded(
            sqlx::query_as("SELECT pid FROM pg_stat_activity WHERE datname = $1")
                .bind(&self.db_name)
                .fetch_all(&self.admin),
        )
        .await?;
        let row: (i64, i64, i64, i64, i64, i64, i64) = bounded(
            sqlx::query_as(
                "SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, tup_inserted, \
                 tup_updated, tup_deleted FROM pg_stat_database WHERE datname = $1",
            )
            .bind(&self.db_name)
            .fetch_one(&self.admin),
        )
        .await?;
        let info: String = bounded(
            redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut self.redis),
        )
        .await?;
        let at = Instant::now();
        let brain = proc_stat(self.brain_pid, self.ticks_per_second)?.1;
        // A backend may end between the query and the read: it is left out.
        let backends = pids
            .into_iter()
            .filter_map(|(pid,)| {
                let pid = pid as u32;
                on_cpu(pid).ok().map(|t| (pid, t))
            })
            .collect();
        Ok(Snapshot {
            at,
            brain,
            backends,
            postgres: postgres_processes(self.ticks_per_second)?,
            db: DbStats {
                commits: row.0,
                rollbacks: row.1,
                returned: row.2,
                fetched: row.3,
                inserted: row.4,
                updated: row.5,
                deleted: row.6,
            },
            redis_calls: command_calls(&info),
            redis_cpu: self.redis_pid.map(on_cpu).transpose()?,
        })
    }
}

async fn bounded<T, E>(work: impl Future<Output = Result<T, E>>) -> Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    Ok(tokio::time::timeout(READ_BOUND, work)
        .await
        .context("a bench probe timed out")??)
}

/// Every process named `postgres`: pid → on-CPU time.
fn postgres_processes(ticks_per_second: u64) -> Result<HashMap<u32, Duration>> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // Processes come and go while the directory is read.
        if let Ok((comm, _)) = proc_stat(pid, ticks_per_second)
            && comm == "postgres"
            && let Ok(t) = on_cpu(pid)
        {
            out.insert(pid, t);
        }
    }
    Ok(out)
}

/// `INFO commandstats`: command → calls (`cmdstat_xadd:calls=12,usec=…`).
fn command_calls(info: &str) -> HashMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// Σ over the processes at the end of (end − start); a process that started in between
/// counts from zero, one that ended in between is lost (none of the brain's pool does).
fn summed(start: &HashMap<u32, Duration>, end: &HashMap<u32, Duration>) -> Duration {
    end.iter()
        .map(|(pid, t)| t.saturating_sub(start.get(pid).copied().unwrap_or_default()))
        .sum()
}

fn us_per(d: Duration, turns: usize) -> String {
    format!("{:.0} us", d.as_secs_f64() * 1e6 / turns as f64)
}

/// What records the brain over the counted turns, if anything.
enum Recording {
    /// `BENCH_PERF_DATA`: `perf record`, until interrupted.
    Perf(std::process::Child),
    /// `BENCH_CALLGRIND`: the brain runs under callgrind, collecting from the start of the
    /// counted turns (its counters zeroed) to their end (a dump, `<file>.1`).
    Callgrind { pid: u32, out: String },
}

/// The command the brain runs under: callgrind's with `BENCH_CALLGRIND=<file>`, which
/// counts the brain's instructions, the one figure of its CPU this machine repeats
/// within a percent (its timings spread by a quarter, and the VM has no hardware counters).
fn launcher() -> Vec<String> {
    match std::env::var("BENCH_CALLGRIND") {
        Ok(out) => vec![
            "valgrind".into(),
            "--tool=callgrind".into(),
            format!("--callgrind-out-file={out}"),
        ],
        Err(_) => Vec::new(),
    }
}

impl Recording {
    fn start(pid: u32) -> Result<Option<Self>> {
        if let Ok(out) = std::env::var("BENCH_CALLGRIND") {
            // An earlier run's dump must not pass for this one's.
            match std::fs::remove_file(format!("{out}.1")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).context("BENCH_CALLGRIND: removing an earlier dump");
                }
                _ => {}
            }
            callgrind_control(pid, "--zero")?;
            return Ok(Some(Self::Callgrind { pid, out }));
        }
        let Ok(out) = std::env::var("BENCH_PERF_DATA") else {
            return Ok(None);
        };
        let child = std::process::Command::new("perf")
            .args(["record", "--call-graph", "dwarf,16384", "-F", "499", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&out)
            .stdout(Stdio::null())
            .spawn()
            .context("BENCH_PERF_DATA: starting perf")?;
        // perf attaches to the process' threads before it records.
        std::thread::sleep(Duration::from_millis(500));
        Ok(Some(Self::Perf(child)))
    }

    /// Ends the recording: the brain's instructions since the start, under callgrind.
    fn stop(self) -> Result<Option<u64>> {
        match self {
            Self::Perf(mut perf) => {
                std::process::Command::new("kill")
                    .args(["-INT", &perf.id().to_string()])
                    .status()?;
                perf.wait()?;
                Ok(None)
            }
            Self::Callgrind { pid, out } => {
                callgrind_control(pid, "--dump=counted turns")?;
                let dump = format!("{out}.1");
                let text = std::fs::read_to_string(&dump)
                    .with_context(|| format!("BENCH_CALLGRIND: reading {dump}"))?;
                let instructions = text
                    .lines()
                    .find_map(|line| line.strip_prefix("summary: "))
                    .and_then(|n| n.trim().parse().ok())
                    .with_context(|| format!("BENCH_CALLGRIND: no summary in {dump}"))?;
                Ok(Some(instructions))
            }
        }
    }
}

/// `callgrind_control <action> <pid>`, within a minute (coreutils' `timeout`): it talks
/// to the brain through valgrind's gdbserver, which a wedged brain would never answer.
fn callgrind_control(pid: u32, action: &str) -> Result<()> {
    let done = std::process::Command::new("timeout")
        .args(["60", "callgrind_control", action])
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .status()
        .context("BENCH_CALLGRIND: running callgrind_control")?;
    if !done.success() {
        bail!("BENCH_CALLGRIND: callgrind_control {action}: {done}");
    }
    Ok(())
}

pub async fn cpu(rows: &mut Vec<Row>) -> Result<()> {
    let redis = PrivateRedis::start().await?;
    let redis_url = redis.as_ref().map_or_else(redis_url, |r| r.url.clone());
    // The binary's own default level: what production runs (BrainProcess quiets it).
    let system = Arc::new(
        System::start_process_under(
            &launcher(),
            &[("REDIS_URL", &redis_url), ("BRAIN_LOG", "info")],
        )
        .await?,
    );
    let brain_pid = system
        .brain_pid()
        .context("the brain runs as its own process")?;
    let measured = measure(&system, brain_pid, &redis, &redis_url).await;
    // The clients, which hold the other references, ended with `measure`.
    if let Ok(system) = Arc::try_unwrap(system) {
        system.close().await;
    }
    if let Some(redis) = redis {
        redis.stop().await;
    }
    rows.extend(measured?);
    eprintln!("bench: cpu per turn done");
    Ok(())
}

async fn measure(
    system: &Arc<System>,
    brain_pid: u32,
    redis: &Option<PrivateRedis>,
    redis_url: &str,
) -> Result<Vec<Row>> {
    put_quotas(system, &high_quotas()).await?;
    let mut clients = Vec::new();
    for _ in 0..WIDE {
        clients.push(ChatClient::new(system).await?);
    }
    let mut probe = Probe {
        admin: sqlx::PgPool::connect(&crate::system::admin_url()).await?,
        db_name: system.db_name.clone(),
        redis: redis::Client::open(redis_url)?
            .get_multiplexed_async_connection()
            .await?,
        redis_pid: redis.as_ref().map(|r| r.pid),
        brain_pid,
        ticks_per_second: clock_ticks_per_second()?,
    };
    let few: Vec<_> = clients[..CONCURRENCY].to_vec();
    counted_loop(WARM_UP_EACH, few.clone(), |client, n| async move {
        client.turn(n).await
    })
    .await?;
    crate::system::analyze(&system.db_name).await?;

    let before = probe.snapshot().await?;
    let recording = Recording::start(brain_pid)?;
    let recording_started = Instant::now();
    let (samples, _) = counted_loop(TURNS / CONCURRENCY, few, |client, n| async move {
        client.turn(WARM_UP_EACH + n).await
    })
    .await?;
    let recorded = recording.is_some();
    let instructions = recording.map(Recording::stop).transpose()?.flatten();
    let after = probe.snapshot().await?;
    if recorded {
        eprintln!(
            "bench: cpu: recorded the brain for {:.1} s",
            recording_started.elapsed().as_secs_f64(),
        );
    }
    let counted = Counted {
        n: samples.len(),
        delta: sorted(samples.iter().map(|s| s.1).collect()),
        end: sorted(samples.iter().map(|s| s.2).collect()),
        before,
        after,
        instructions,
        recorded,
        private_redis: redis.is_some(),
    };
    let mut out = counted.rows();
    out.extend(wide(&mut probe, clients).await?);
    probe.admin.close().await;
    Ok(out)
}

/// The counted run at [`CONCURRENCY`]: its turns' latencies and the probes around it.
struct Counted {
    n: usize,
    /// Sorted first text-delta and end-to-end latencies.
    delta: Vec<Duration>,
    end: Vec<Duration>,
    before: Snapshot,
    after: Snapshot,
    /// The brain's instructions, when callgrind recorded it.
    instructions: Option<u64>,
    recorded: bool,
    /// Redis is the bench's own, so its commands are the brain's alone.
    private_redis: bool,
}

impl Counted {
    fn rows(&self) -> Vec<Row> {
        let Self {
            n,
            ref delta,
            ref end,
            ref before,
            ref after,
            instructions,
            recorded,
            ..
        } = *self;
        let span = after.at - before.at;
        let brain_cpu = after.brain.saturating_sub(before.brain);
        let perf_note = if recorded { "; recorded" } else { "" };
        let scenario = format!("cpu per turn c={CONCURRENCY}");
        let mut out = vec![row(
            &scenario,
            "brain CPU per no-tool turn",
            String::new(),
            String::new(),
            format!(
                "{} ({n} turns in {:.2} s, {:.2} cores; utime+stime of the brain process{perf_note})",
                us_per(brain_cpu, n),
                span.as_secs_f64(),
                brain_cpu.as_secs_f64() / span.as_secs_f64()
            ),
        )];
        if let Some(instructions) = instructions {
            out.push(row(
                &scenario,
                "brain instructions per no-tool turn",
                String::new(),
                String::new(),
                format!(
                    "{:.0} k (callgrind, all threads, {n} turns)",
                    instructions as f64 / n as f64 / 1e3
                ),
            ));
        }
        out.extend(self.store_rows(&scenario));
        out.push(row(
            &scenario,
            "first text-delta",
            ms(pct(delta, 50.0)),
            ms(pct(delta, 99.0)),
            String::new(),
        ));
        out.push(row(
            &scenario,
            "end to end",
            ms(pct(end, 50.0)),
            ms(pct(end, 99.0)),
            format!("{:.0} turns/s", n as f64 / span.as_secs_f64()),
        ));
        out
    }

    /// Postgres's and Redis's share of each turn.
    fn store_rows(&self, scenario: &str) -> Vec<Row> {
        let Self {
            n,
            ref before,
            ref after,
            private_redis,
            ..
        } = *self;
        let backends = summed(&before.backends, &after.backends);
        let postgres = summed(&before.postgres, &after.postgres);
        let per = |count: i64| count as f64 / n as f64;
        let db = |f: fn(&DbStats) -> i64| per(f(&after.db) - f(&before.db));
        let (total, top) = redis_commands(before, after, n);
        let mut out = vec![
            row(
                scenario,
                "Postgres CPU per turn, bench db backends",
                String::new(),
                String::new(),
                format!(
                    "{} ({} backends of the bench database; on-CPU time)",
                    us_per(backends, n),
                    after.backends.len()
                ),
            ),
            row(
                scenario,
                "Postgres CPU per turn, all postgres procs",
                String::new(),
                String::new(),
                format!(
                    "{} (adds WAL writer, checkpointer, bg writer, autovacuum, other databases)",
                    us_per(postgres, n)
                ),
            ),
            row(
                scenario,
                "Postgres transactions per turn",
                String::new(),
                String::new(),
                format!(
                    "{:.2} commits, {:.2} rollbacks; tuples returned {:.1}, fetched {:.1}, inserted {:.1}, updated {:.1}, deleted {:.1}",
                    db(|s| s.commits),
                    db(|s| s.rollbacks),
                    db(|s| s.returned),
                    db(|s| s.fetched),
                    db(|s| s.inserted),
                    db(|s| s.updated),
                    db(|s| s.deleted),
                ),
            ),
            row(
                scenario,
                "Redis commands per turn",
                String::new(),
                String::new(),
                format!(
                    "{:.2} ({}{})",
                    total as f64 / n as f64,
                    top.join(", "),
                    if private_redis {
                        ""
                    } else {
                        "; shared Redis: other clients' commands included"
                    }
                ),
            ),
        ];
        if let (Some(start), Some(stop)) = (before.redis_cpu, after.redis_cpu) {
            out.push(row(
                scenario,
                "Redis CPU per turn",
                String::new(),
                String::new(),
                format!(
                    "{} (the private redis-server's main thread)",
                    us_per(stop.saturating_sub(start), n)
                ),
            ));
        }
        out
    }
}

/// Redis commands per turn between two probes (the probe's own `INFO` aside): their
/// total, and the most frequent ones.
fn redis_commands(before: &Snapshot, after: &Snapshot, n: usize) -> (u64, Vec<String>) {
    let mut calls: Vec<(String, u64)> = after
        .redis_calls
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, &calls)| {
            let earlier = before.redis_calls.get(name).copied().unwrap_or_default();
            (name.to_uppercase(), calls.saturating_sub(earlier))
        })
        .filter(|(_, calls)| *calls > 0)
        .collect();
    calls.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let total: u64 = calls.iter().map(|c| c.1).sum();
    let top: Vec<String> = calls
        .iter()
        .take(TOP_COMMANDS)
        .map(|(name, calls)| format!("{name} {:.2}", *calls as f64 / n as f64))
        .collect();
    (total, top)
}

/// Throughput at concurrency [`WIDE`]: every client warm, then the window.
async fn wide(probe: &mut Probe, clients: Vec<Arc<ChatClient>>) -> Result<Vec<Row>> {
    let rest = clients[CONCURRENCY..].iter().map(|client| client.turn(0));
    for warmed in futures_util::future::join_all(rest).await {
        warmed?;
    }
    let start = probe.snapshot().await?;
    let first = WARM_UP_EACH + TURNS / CONCURRENCY;
    let (wide, _) = crate::system::closed_loop(window(), clients, move |client, n| async move {
        client.turn(first + n).await
    })
    .await?;
    let stop = probe.snapshot().await?;
    let span = stop.at - start.at;
    let wide_n = wide.len();
    let wide_end = sorted(wide.iter().map(|s| s.2).collect());
    let scenario = format!("cpu per turn c={WIDE}");
    let mut out = vec![row(
        &scenario,
        "end to end, client outside the brain",
        ms(pct(&wide_end, 50.0)),
        ms(pct(&wide_end, 99.0)),
        format!(
            "{:.0} turns/s ({wide_n} turns in {:.2} s)",
            wide_n as f64 / span.as_secs_f64(),
            span.as_secs_f64()
        ),
    )];
    out.push(row(
        &scenario,
        "brain CPU per no-tool turn",
        String::new(),
        String::new(),
        format!(
            "{} (Postgres backends {})",
            us_per(stop.brain.saturating_sub(start.brain), wide_n),
            us_per(summed(&start.backends, &stop.backends), wide_n)
        ),
    ));
    Ok(out)
}
