//! The open loop (`BENCH_ONLY=openloop`): turns sent at a fixed arrival rate, at 25 %, 50 %
//! and 80 % of the capacity measured first, with the brain as its own process and the
//! client and the scripted provider in this one. A closed loop ties latency to throughput
//! (a client waits for its last turn before it sends the next, so a slow brain is offered
//! less load); here every turn leaves at its instant on the schedule and is timed from
//! that instant ([`open_loop`]), so the latency at one offered rate compares like for like.
//! Also the pool of clients and the [`Timed`] seam the peer's open loop uses.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::system::{
    OPEN_LOOP_TURN_LIMIT, OpenLoop, Row, System, closed_loop, ms, open_loop, pct, row, signed_ms,
    sorted, window,
};
use crate::turn::{ChatClient, timed_provider_with, warmed_clients};

/// The closed loop that measures capacity: the turn scenario's throughput has levelled off
/// by this concurrency.
const CAPACITY_CONCURRENCY: usize = 64;
/// The offered loads, as fractions of the capacity.
const LOADS: [f64; 3] = [0.25, 0.5, 0.8];
/// Turns wanted per level: a p99.9 needs a thousand, two keep it off the maximum.
const SAMPLES: f64 = 2000.0;
/// The longest window of one level, so that a slow machine's low rate does not take minutes.
const LONGEST: Duration = Duration::from_secs(30);
/// Sent at the level's rate and not counted before each window: the connections and
/// clients the rate needs.
const WARM_UP: Duration = Duration::from_secs(1);
/// The target: p99 at 50 % load at most this many times the p50 at 25 %.
const TARGET_FACTOR: f64 = 3.0;

/// A client an open loop can time: one turn at a time, from the instant it was due.
pub trait Timed: Send + Sync + 'static {
    /// Readies the client for its turn number `n` (a new chat or thread when one is due),
    /// off the clock: between turns, not inside a timed one.
    fn prepare(&self, n: usize) -> impl Future<Output = Result<()>> + Send;
    /// One turn read to its end, timed from `since`: (first token, end).
    fn time_from(
        &self,
        since: Instant,
    ) -> impl Future<Output = Result<(Duration, Duration)>> + Send;
}

impl Timed for ChatClient {
    async fn prepare(&self, n: usize) -> Result<()> {
        self.renew_if_due(n).await
    }

    /// First text-delta and end.
    async fn time_from(&self, since: Instant) -> Result<(Duration, Duration)> {
        let (_, delta, end) = self.timed(since).await?;
        Ok((delta, end))
    }
}

/// The scripted provider alone, with `body`: what the added time is measured against.
pub struct Direct {
    pub system: Arc<System>,
    pub body: Value,
}

impl Timed for Direct {
    async fn prepare(&self, _: usize) -> Result<()> {
        Ok(())
    }

    /// First body byte and end.
    async fn time_from(&self, since: Instant) -> Result<(Duration, Duration)> {
        timed_provider_with(&self.system, &self.body, since).await
    }
}

type Make<C> = Box<dyn Fn() -> BoxFuture<'static, Result<Arc<C>>> + Send + Sync>;
/// Idle clients, each with the number of its next turn.
type Idle<C> = Vec<(Arc<C>, usize)>;

/// The idle clients of an open loop. A due turn takes one; when every client is busy (the
/// server has fallen behind the rate) it makes one more, on the clock: the turn waited for
/// it. How many were made so is in [`Pool::grown`].
pub struct Pool<C> {
    idle: Mutex<Idle<C>>,
    make: Make<C>,
    grown: AtomicUsize,
}

impl<C: Timed> Pool<C> {
    /// `size` clients from `make`.
    pub async fn new(size: usize, make: Make<C>) -> Result<Arc<Self>> {
        let made: Vec<Result<Arc<C>>> = futures_util::stream::iter(0..size)
            .map(|_| make())
            .buffer_unordered(8)
            .collect()
            .await;
        let idle = made
            .into_iter()
            .map(|client| client.map(|c| (c, 0)))
            .collect::<Result<_>>()?;
        Ok(Arc::new(Self {
            idle: Mutex::new(idle),
            make,
            grown: AtomicUsize::new(0),
        }))
    }

    /// Clients made because none was idle when a turn was due.
    pub fn grown(&self) -> usize {
        self.grown.load(Ordering::Relaxed)
    }

    fn idle(&self) -> Result<std::sync::MutexGuard<'_, Idle<C>>> {
        self.idle.lock().map_err(|_| anyhow!("pool lock poisoned"))
    }

    async fn turn(&self, due: Instant) -> Result<(Duration, Duration)> {
        let taken = self.idle()?.pop();
        let (client, n) = match taken {
            Some(idle) => idle,
            None => {
                self.grown.fetch_add(1, Ordering::Relaxed);
                ((self.make)().await?, 0)
            }
        };
        let sample = client.time_from(due).await?;
        client.prepare(n + 1).await?;
        self.idle()?.push((client, n + 1));
        Ok(sample)
    }
}

/// `pool`'s clients at `rate` turns per second for `span`.
pub async fn run<C: Timed>(
    pool: &Arc<Pool<C>>,
    rate: f64,
    span: Duration,
) -> Result<OpenLoop<(Duration, Duration)>> {
    let pool = pool.clone();
    open_loop(rate, span, move |due| {
        let pool = pool.clone();
        async move { pool.turn(due).await }
    })
    .await
}

/// Clients for `rate`: a tenth of a second's turns (a turn ends in milliseconds when the
/// server keeps up), at least 16.
pub fn pool_size(rate: f64) -> usize {
    ((rate * 0.1).ceil() as usize).max(16)
}

/// A pool of brain chats on `system`.
pub async fn chat_pool(system: &Arc<System>, size: usize) -> Result<Arc<Pool<ChatClient>>> {
    let system = system.clone();
    Pool::new(
        size,
        Box::new(move || {
            let system = system.clone();
            Box::pin(async move { ChatClient::new(&system).await })
        }),
    )
    .await
}

/// A pool of direct provider clients sending `body`.
pub async fn direct_pool(
    system: &Arc<System>,
    body: Value,
    size: usize,
) -> Result<Arc<Pool<Direct>>> {
    let system = system.clone();
    Pool::new(
        size,
        Box::new(move || {
            let direct = Direct {
                system: system.clone(),
                body: body.clone(),
            };
            Box::pin(async move { Ok(Arc::new(direct)) })
        }),
    )
    .await
}

/// The first tokens of an open loop, sorted, and a summary of the run for a row.
pub struct Measured {
    pub first: Vec<Duration>,
    pub summary: String,
    /// Turns sent, the warm-up's included.
    pub sent: usize,
}

/// Warms `pool` up at `rate`, then measures it for `span`.
pub async fn measure<C: Timed>(pool: &Arc<Pool<C>>, rate: f64, span: Duration) -> Result<Measured> {
    let warm = run(pool, rate, WARM_UP).await?;
    let grown = pool.grown();
    let measured = run(pool, rate, span).await?;
    // A turn cut off at the limit counts at the limit, a lower bound of its latency:
    // leaving it out would flatter a server that fell behind.
    let cut_off = || std::iter::repeat_n(OPEN_LOOP_TURN_LIMIT, measured.cut_off);
    let first = sorted(
        measured
            .samples
            .iter()
            .map(|s| s.0)
            .chain(cut_off())
            .collect(),
    );
    let end = sorted(
        measured
            .samples
            .iter()
            .map(|s| s.1)
            .chain(cut_off())
            .collect(),
    );
    let mut summary = format!(
        "p99.9 {}; {} over {:.1} s, end p50 {}; sends late p99 {}, max {}; {} clients made while all were busy",
        ms(pct(&first, 99.9)),
        first.len(),
        span.as_secs_f64(),
        ms(pct(&end, 50.0)),
        ms(pct(&measured.lateness, 99.0)),
        ms(pct(&measured.lateness, 100.0)),
        pool.grown() - grown,
    );
    let missed = warm.cut_off + measured.cut_off;
    if missed > 0 {
        summary.push_str(&format!(
            "; did NOT sustain the rate: {missed} turns not ended within {OPEN_LOOP_TURN_LIMIT:?} \
             (those measured count as {OPEN_LOOP_TURN_LIMIT:?}, a lower bound)"
        ));
    }
    Ok(Measured {
        sent: warm.samples.len() + warm.cut_off + first.len(),
        first,
        summary,
    })
}

/// `a`'s percentile `p` minus `b`'s, in seconds: the added time of an open-loop row.
pub fn added(a: &[Duration], b: &[Duration], p: f64) -> f64 {
    pct(a, p).as_secs_f64() - pct(b, p).as_secs_f64()
}

pub async fn openloop(rows: &mut Vec<Row>) -> Result<()> {
    let system = Arc::new(System::start_process(&[]).await?);
    let result = levels(&system, rows).await;
    if let Ok(system) = Arc::try_unwrap(system) {
        system.close().await;
    }
    result
}

async fn levels(system: &Arc<System>, rows: &mut Vec<Row>) -> Result<()> {
    // The provider baseline replays what the brain sent for a warm-up turn, as the turn
    // scenario's does.
    let (clients, brain_body) = warmed_clients(system, CAPACITY_CONCURRENCY).await?;
    let (samples, took) = closed_loop(window(), clients, |client, n| async move {
        client.turn(n).await
    })
    .await?;
    let capacity = samples.len() as f64 / took.as_secs_f64();
    rows.push(row(
        "open loop",
        &format!("capacity: closed loop c={CAPACITY_CONCURRENCY}"),
        String::new(),
        String::new(),
        format!("{capacity:.0} turns/s ({} turns)", samples.len()),
    ));
    eprintln!("bench: open loop capacity {capacity:.0} turns/s");

    let most = pool_size(capacity * LOADS[LOADS.len() - 1]);
    let chats = chat_pool(system, most).await?;
    let direct = direct_pool(system, brain_body, most).await?;
    // p50 of the added time at the first (25 %) load, for the target at 50 %.
    let mut quarter_p50 = None;
    for load in LOADS {
        let rate = capacity * load;
        let span = Duration::from_secs_f64(SAMPLES / rate).clamp(window(), LONGEST);
        let brain = measure(&chats, rate, span).await?;
        let provider = measure(&direct, rate, span).await?;
        let scenario = format!("open loop {:.0}% ({rate:.0} turns/s)", load * 100.0);
        let (p50, p99) = (
            added(&brain.first, &provider.first, 50.0),
            added(&brain.first, &provider.first, 99.0),
        );
        let mut other = format!(
            "p99.9 {}; difference of percentiles",
            signed_ms(pct(&brain.first, 99.9), pct(&provider.first, 99.9))
        );
        match quarter_p50 {
            None => quarter_p50 = Some(p50),
            Some(base) if load == 0.5 => {
                let bound = TARGET_FACTOR * base;
                other.push_str(&format!(
                    "; target p99 <= {TARGET_FACTOR}x p50 at 25%: {:.3} ms vs {:.3} ms: {}",
                    p99 * 1000.0,
                    bound * 1000.0,
                    if p99 <= bound { "met" } else { "missed" }
                ));
            }
            Some(_) => {}
        }
        let turns = brain.first.len();
        rows.extend(added_rows(&scenario, brain, provider, other));
        eprintln!(
            "bench: open loop at {:.0}% done ({turns} turns)",
            load * 100.0,
        );
    }
    Ok(())
}

/// An open loop's three rows: the brain's first text-delta, the provider's alone at the
/// same rate, and their difference (`other` on that last row).
fn added_rows(scenario: &str, brain: Measured, provider: Measured, other: String) -> [Row; 3] {
    let added = row(
        scenario,
        "brain added TTFB (text-delta - provider)",
        signed_ms(pct(&brain.first, 50.0), pct(&provider.first, 50.0)),
        signed_ms(pct(&brain.first, 99.0), pct(&provider.first, 99.0)),
        other,
    );
    let first = |metric: &str, m: Measured| {
        let (p50, p99) = (ms(pct(&m.first, 50.0)), ms(pct(&m.first, 99.0)));
        row(scenario, metric, p50, p99, m.summary)
    };
    [
        first("client first text-delta (from intended send)", brain),
        first("provider TTFB (direct, same rate)", provider),
        added,
    ]
}

/// The quiet open loop's rate by default: the latency target at rest (docs/PERFORMANCE.md)
/// is stated at 5 turns/s.
const QUIET_RATE: f64 = 5.0;
/// Turns wanted at the quiet rate: enough for a p99 that is not the maximum.
const QUIET_SAMPLES: f64 = 300.0;

/// `quiet` (`BENCH_ONLY=quiet`, `BENCH_QUIET_RATE`, default 5 turns/s): the brain's added
/// time when every turn finds it idle, the figure the closed loop at concurrency 1 misses
/// (there each send follows the last turn's end, while the brain's threads are still
/// awake). The brain is its own process, so a `perf trace -p` of it (docs/PERFORMANCE.md)
/// sees only its own system calls.
pub async fn quiet(rows: &mut Vec<Row>) -> Result<()> {
    let rate: f64 = match std::env::var("BENCH_QUIET_RATE") {
        Ok(rate) => rate.trim().parse().context("BENCH_QUIET_RATE: a number")?,
        Err(_) => QUIET_RATE,
    };
    if !(rate.is_finite() && rate > 0.0) {
        anyhow::bail!("BENCH_QUIET_RATE: turns per second above 0, not {rate}");
    }
    let system = Arc::new(System::start_process(&[]).await?);
    let result = quiet_on(&system, rate, rows).await;
    if let Ok(system) = Arc::try_unwrap(system) {
        system.close().await;
    }
    result
}

async fn quiet_on(system: &Arc<System>, rate: f64, rows: &mut Vec<Row>) -> Result<()> {
    let (_, brain_body) = warmed_clients(system, 1).await?;
    let size = pool_size(rate);
    let chats = chat_pool(system, size).await?;
    let direct = direct_pool(system, brain_body, size).await?;
    let span = Duration::from_secs_f64(QUIET_SAMPLES / rate).max(window());
    if let Some(pid) = system.brain_pid() {
        eprintln!("bench: quiet open loop, brain pid {pid}, measuring for {span:?}");
    }
    let brain = measure(&chats, rate, span).await?;
    let provider = measure(&direct, rate, span).await?;
    let scenario = format!("quiet open loop ({rate} turns/s)");
    let other = "difference of percentiles".to_owned();
    rows.extend(added_rows(&scenario, brain, provider, other));
    Ok(())
}
