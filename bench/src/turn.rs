//! Turn overhead (the brain's added time to first text-delta and end to end, at several
//! concurrencies) and the busy answer (the 409 on an agent with a running turn).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures_util::StreamExt;
use scripted_provider::Reply;
use serde_json::{Value, json};

use crate::system::{
    Row, System, closed_loop, instant_ok, ms, pct, row, signed_ms, sorted, window,
};

/// One turn read to its end: (first body byte, first text-delta, end), from `started`
/// (the send, or its instant on an open loop's schedule).
async fn timed_turn(
    system: &System,
    chat: &str,
    started: Instant,
) -> Result<(Duration, Duration, Duration)> {
    system.provider.push(instant_ok());
    let response = system.send(chat, "hi").await?;
    read_timed(response, started).await
}

/// A turn's answer `response` read to its end, timed as [`timed_turn`] does.
pub async fn read_timed(
    response: reqwest::Response,
    started: Instant,
) -> Result<(Duration, Duration, Duration)> {
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

/// A minimal chat-completions body: a system prompt and one user message.
pub fn minimal_body() -> Value {
    json!({
        "model": "gpt-test",
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "hi"}
        ]
    })
}

/// A request straight to the scripted provider with [`minimal_body`]: (first body byte,
/// end).
pub async fn timed_provider(system: &System) -> Result<(Duration, Duration)> {
    timed_provider_with(system, &minimal_body(), Instant::now()).await
}

/// A request straight to the scripted provider with `body`: (first body byte, end), from
/// `started` (the send, or its instant on an open loop's schedule).
pub async fn timed_provider_with(
    system: &System,
    body: &Value,
    started: Instant,
) -> Result<(Duration, Duration)> {
    system.provider.push(instant_ok());
    let response = system
        .http
        .post(format!(
            "{}/chat/completions",
            system.provider.openai_base_url()
        ))
        .bearer_auth("sk-bench-openai")
        .json(body)
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

/// The concurrency levels: `BENCH_CONCURRENCY` (comma-separated) or 1, 16, 64 and 256.
fn levels() -> Result<Vec<usize>> {
    match std::env::var("BENCH_CONCURRENCY") {
        Ok(list) => list
            .split(',')
            .map(|n| n.trim().parse().context("BENCH_CONCURRENCY: numbers"))
            .collect(),
        Err(_) => Ok(vec![1, 16, 64, 256]),
    }
}

/// Exchanges per chat in a closed loop; each client then opens a new chat, since a loop
/// on one chat would otherwise measure an ever longer history.
pub const TURNS_PER_CHAT: usize = 20;

/// One client of the brain: an agent of its own (an agent runs one turn at a time) and
/// a chat with it, renewed every [`TURNS_PER_CHAT`] turns.
pub struct ChatClient {
    system: Arc<System>,
    agent: String,
    chat: Mutex<String>,
}

impl ChatClient {
    pub async fn new(system: &Arc<System>) -> Result<Arc<Self>> {
        let (agent, chat) = system.agent_and_chat(None).await?;
        Ok(Arc::new(Self {
            system: system.clone(),
            agent,
            chat: Mutex::new(chat),
        }))
    }

    /// The client's turn number `n`, timed as [`timed_turn`] does.
    pub async fn turn(&self, n: usize) -> Result<(Duration, Duration, Duration)> {
        self.renew_if_due(n).await?;
        self.timed(Instant::now()).await
    }

    /// Before turn number `n`: a new chat when this one has had its turns.
    pub async fn renew_if_due(&self, n: usize) -> Result<()> {
        if n % TURNS_PER_CHAT == TURNS_PER_CHAT - 1 {
            let fresh = self.system.new_chat(&self.agent).await?;
            *self
                .chat
                .lock()
                .map_err(|_| anyhow!("chat lock poisoned"))? = fresh;
        }
        Ok(())
    }

    /// A turn on the current chat, timed from `started` as [`timed_turn`] does.
    pub async fn timed(&self, started: Instant) -> Result<(Duration, Duration, Duration)> {
        let chat = self
            .chat
            .lock()
            .map_err(|_| anyhow!("chat lock poisoned"))?
            .clone();
        timed_turn(&self.system, &chat, started).await
    }
}

/// `n` chat clients, each warmed up by one turn (connections, prepared statements), and
/// the body the brain sent the provider for a warm-up turn (system prompt, history, the
/// tool catalog): a provider baseline that replays it leaves the brain's share.
pub async fn warmed_clients(
    system: &Arc<System>,
    n: usize,
) -> Result<(Vec<Arc<ChatClient>>, Value)> {
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(ChatClient::new(system).await?);
    }
    let warm = clients.iter().map(|client| client.turn(0));
    for result in futures_util::future::join_all(warm).await {
        result?;
    }
    crate::system::analyze(&system.db_name).await?;
    let brain_body = system
        .provider
        .requests()
        .pop()
        .context("the warm-up reached the provider")?
        .body;
    Ok((clients, brain_body))
}

pub async fn turn_overhead(rows: &mut Vec<Row>) -> Result<()> {
    for concurrency in levels()? {
        let system = Arc::new(System::start(None).await?);
        let (clients, brain_body) = warmed_clients(&system, concurrency).await?;
        let (samples, elapsed) = closed_loop(window(), clients, |client, n| async move {
            client.turn(n).await
        })
        .await?;
        // The provider alone at the same concurrency, same client, the brain's body.
        let provider_window = window().min(Duration::from_secs(2));
        let bodies = vec![(system.clone(), brain_body); concurrency];
        let (provider, _) = closed_loop(provider_window, bodies, |(system, body), _| async move {
            timed_provider_with(&system, &body, Instant::now()).await
        })
        .await?;
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
        if let Ok(system) = Arc::try_unwrap(system) {
            system.close().await;
        }
    }
    Ok(())
}

pub async fn busy_answer(rows: &mut Vec<Row>) -> Result<()> {
    let system = System::start(None).await?;
    let (agent, chat) = system.agent_and_chat(None).await?;
    let other = system.new_chat(&agent).await?;
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
    interrupt(&system, rows).await?;
    hang_up(&system, rows).await?;
    system.close().await;
    Ok(())
}

/// Tries of [`hang_up`].
const HANG_UPS: usize = 30;

/// T8: a client that drops a turn's stream mid-answer. The time from the drop to the
/// provider seeing its request aborted: the turn's cancel reaching the model call.
async fn hang_up(system: &System, rows: &mut Vec<Row>) -> Result<()> {
    let mut latencies = Vec::new();
    for n in 0..HANG_UPS {
        // An agent per try: the last try's turn may still be winding up on its own.
        let (_, chat) = system.agent_and_chat(None).await?;
        system.provider.push(Reply::Text {
            deltas: vec!["long ".into(); 200],
            delay: Duration::from_millis(20),
        });
        let response = system.send(&chat, "long").await?;
        if response.status() != 200 {
            bail!("hang-up {n}: {}", response.status());
        }
        let before = system.provider.aborted_streams().len();
        let mut body = response.bytes_stream();
        let mut seen = String::new();
        while !seen.contains("\"text-delta\"") {
            let piece = body
                .next()
                .await
                .ok_or_else(|| anyhow!("hang-up {n}: the answer ended before a word"))?;
            seen.push_str(&String::from_utf8_lossy(&piece?));
        }
        let hung_up = Instant::now();
        drop(body);
        let aborted = system
            .provider
            .wait_aborted(before + 1, Duration::from_secs(5))
            .await;
        let at = aborted
            .get(before)
            .ok_or_else(|| anyhow!("hang-up {n}: the provider's request was not aborted"))?;
        latencies.push(at.saturating_duration_since(hung_up));
    }
    let latencies = sorted(latencies);
    rows.push(row(
        "busy answer",
        "hang-up: client drops the stream -> provider request aborted",
        ms(pct(&latencies, 50.0)),
        ms(pct(&latencies, 99.0)),
        format!("{HANG_UPS} hang-ups"),
    ));
    Ok(())
}

/// Tries of [`interrupt`].
const INTERRUPTS: usize = 50;

/// T13: a message sent with `if_busy: interrupt` to an agent with a slow turn. Two figures:
/// the client's time from the send to the new turn's first text-delta (the stop, the
/// wind-up of the stopped turn, the new turn's intake and its first token), and Postgres'
/// own gap between the stopped turn's `finished_at` and the new turn's `started_at` (the
/// 100 ms of T13, on one clock).
async fn interrupt(system: &System, rows: &mut Vec<Row>) -> Result<()> {
    let (agent, _) = system.agent_and_chat(None).await?;
    let agent = agent.as_str();
    let mut to_first_delta = Vec::new();
    for _ in 0..INTERRUPTS {
        let chat = system.new_chat(agent).await?;
        system.provider.push(Reply::Text {
            deltas: vec!["slow ".into(); 100],
            delay: Duration::from_millis(100),
        });
        // The previous try's new turn may still be winding up (its hold is released after
        // its stream ends).
        let slow = loop {
            let slow = system.send(&chat, "slow").await?;
            match slow.status().as_u16() {
                200 => break slow,
                409 => tokio::time::sleep(Duration::from_millis(5)).await,
                other => bail!("slow turn: {other}"),
            }
        };
        let slow = tokio::spawn(async move { slow.bytes().await });
        system.provider.push(instant_ok());
        let started = Instant::now();
        let response = system
            .post_json(
                &format!("/v1/chats/{chat}/messages"),
                &json!({"content": "stop that", "if_busy": "interrupt"}),
            )
            .await?;
        if response.status() != 200 {
            bail!(
                "interrupt: {} {}",
                response.status(),
                response.text().await?
            );
        }
        let mut body = response.bytes_stream();
        let mut seen = String::new();
        while let Some(piece) = body.next().await {
            seen.push_str(&String::from_utf8_lossy(&piece?));
            if seen.contains("\"text-delta\"") {
                to_first_delta.push(started.elapsed());
                break;
            }
        }
        while body.next().await.is_some() {}
        slow.await??;
    }
    let gaps: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM n.started_at - o.finished_at)::float8 \
         FROM turns o JOIN turns n ON n.chat_id = o.chat_id AND n.started_at > o.started_at \
         WHERE o.agent_id = $1::uuid AND o.status = 'interrupted'",
    )
    .bind(agent)
    .fetch_all(system.store.pool())
    .await?;
    if to_first_delta.len() != INTERRUPTS || gaps.len() != INTERRUPTS {
        bail!(
            "interrupt: {} new turns streamed, {} stopped turns followed",
            to_first_delta.len(),
            gaps.len()
        );
    }
    let gaps = sorted(gaps.into_iter().map(Duration::from_secs_f64).collect());
    let to_first_delta = sorted(to_first_delta);
    rows.push(row(
        "busy answer",
        "interrupt: stopped turn's end -> new turn's start (Postgres)",
        ms(pct(&gaps, 50.0)),
        ms(pct(&gaps, 99.0)),
        format!("{INTERRUPTS} interrupts"),
    ));
    rows.push(row(
        "busy answer",
        "interrupt: send -> new turn's first text-delta",
        ms(pct(&to_first_delta, 50.0)),
        ms(pct(&to_first_delta, 99.0)),
        format!("{INTERRUPTS} interrupts, provider answers at once"),
    ));
    Ok(())
}

/// All four turn quotas, set high enough never to refuse: with them a turn counts,
/// reserves and settles, as a team's turn does in production.
pub fn high_quotas() -> Value {
    json!({"tokens_per_day": 1u64 << 40, "tokens_per_month": 1u64 << 40,
           "turns_per_minute": 1u64 << 30, "concurrent_turns": 1000})
}

/// `PUT /v1/quotas` of the system's team.
pub async fn put_quotas(system: &System, limits: &Value) -> Result<()> {
    let response = system
        .http
        .put(format!("{}/v1/quotas", system.url))
        .bearer_auth(&system.key)
        .json(limits)
        .send()
        .await?;
    if response.status() != 200 {
        bail!("PUT /v1/quotas: {}", response.status());
    }
    Ok(())
}

/// What the quota check (T2, E2) adds to a turn: one client, turns alternating in blocks
/// between the team without quotas and with all four turn quotas set (high enough never to
/// refuse), so both sides see the same machine. The check itself runs in the hold's
/// script either way; with quotas it also counts, reserves and settles.
pub async fn quota_overhead(rows: &mut Vec<Row>) -> Result<()> {
    let system = Arc::new(System::start(None).await?);
    let client = ChatClient::new(&system).await?;
    let unlimited = json!({"tokens_per_day": null, "tokens_per_month": null,
                           "turns_per_minute": null, "concurrent_turns": null});
    let limited = high_quotas();
    for n in 0..20 {
        client.turn(n).await?;
    }
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut n = 20;
    for _ in 0..8 {
        for (limits, samples) in [(&unlimited, &mut without), (&limited, &mut with)] {
            put_quotas(&system, limits).await?;
            // The first turn after a change reloads the limits (one more round trip).
            client.turn(n).await?;
            n += 1;
            for _ in 0..40 {
                samples.push(client.turn(n).await?.1);
                n += 1;
            }
        }
    }
    let (without, with) = (sorted(without), sorted(with));
    let scenario = "quota check c=1";
    rows.push(row(
        scenario,
        "first text-delta, no quotas",
        ms(pct(&without, 50.0)),
        ms(pct(&without, 99.0)),
        format!("{} turns", without.len()),
    ));
    rows.push(row(
        scenario,
        "first text-delta, four turn quotas",
        ms(pct(&with, 50.0)),
        ms(pct(&with, 99.0)),
        format!("{} turns", with.len()),
    ));
    rows.push(row(
        scenario,
        "added by counting and reserving",
        signed_ms(pct(&with, 50.0), pct(&without, 50.0)),
        signed_ms(pct(&with, 99.0), pct(&without, 99.0)),
        "difference of percentiles".into(),
    ));
    eprintln!("bench: quota check done");
    if let Ok(system) = Arc::try_unwrap(system) {
        system.close().await;
    }
    Ok(())
}
