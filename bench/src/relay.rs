//! Token relay: the time the brain adds to each text delta on its way from the model to
//! the client.
//!
//! The scripted provider stamps every delta with the instant it writes it
//! ([`Reply::Stamped`]); the client, in this process and on the same clock, subtracts the
//! stamp from the instant it reads the delta. The same measured straight from the
//! provider is the floor (loopback, HTTP, SSE framing, the client's wake-up and parse);
//! the brain's share is the difference.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use scripted_provider::Reply;
use serde_json::{Value, json};

use crate::system::{Row, SseData, System, instant_ok, ms, pct, row, signed_ms, sorted};

/// Deltas per model answer, and the gap between them.
const DELTAS: usize = 200;
const GAP: Duration = Duration::from_millis(5);

/// (streams at once, answers each stream reads one after the other): 20 × 200 = 4,000
/// deltas alone, and 16 × 2 × 200 = 6,400 with 16 streams sharing the two cores.
const LEVELS: [(usize, usize); 2] = [(1, 20), (16, 2)];

fn stamped() -> Reply {
    Reply::Stamped {
        count: DELTAS,
        delay: GAP,
    }
}

/// How long ago, on the provider's clock, a stamp was taken, seen at `read` (the instant
/// the client read the piece holding it).
pub fn in_flight(stamp: &str, read: Instant, epoch: Instant) -> Result<Duration> {
    let sent: u64 = stamp
        .trim()
        .parse()
        .with_context(|| format!("not a stamp: {stamp:?}"))?;
    let read = u64::try_from(read.duration_since(epoch).as_micros())?;
    let took = read
        .checked_sub(sent)
        .context("a delta was read before it was stamped")?;
    Ok(Duration::from_micros(took))
}

/// One answer straight from the provider, with a body shaped like the brain's: each
/// delta's time in flight.
async fn direct(system: &System) -> Result<Vec<Duration>> {
    let provider = &system.provider;
    provider.push(stamped());
    let body = json!({
        "model": "gpt-test",
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "hi"}
        ]
    });
    let response = system
        .http
        .post(format!("{}/chat/completions", provider.openai_base_url()))
        .bearer_auth("sk-bench-openai")
        .json(&body)
        .send()
        .await?;
    if response.status() != 200 {
        bail!("provider: {}", response.status());
    }
    let mut stream = response.bytes_stream();
    let mut sse = SseData::default();
    let mut out = Vec::with_capacity(DELTAS);
    while let Some(piece) = stream.next().await {
        let piece = piece?;
        let read = Instant::now();
        for data in sse.push(&piece) {
            if data == "[DONE]" {
                continue;
            }
            let chunk: Value = serde_json::from_str(&data)?;
            // The role chunk opens with empty content; only stamps are non-empty.
            match chunk["choices"][0]["delta"]["content"].as_str() {
                Some(stamp) if !stamp.is_empty() => {
                    out.push(in_flight(stamp, read, provider.epoch())?);
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

/// One turn through the brain: each text-delta's time in flight, provider to client.
async fn via_brain(system: &System, chat: &str) -> Result<Vec<Duration>> {
    system.provider.push(stamped());
    let response = system.send(chat, "count").await?;
    if response.status() != 200 {
        bail!("turn: {} {}", response.status(), response.text().await?);
    }
    let mut stream = response.bytes_stream();
    let mut sse = SseData::default();
    let mut out = Vec::with_capacity(DELTAS);
    let mut finished = false;
    while let Some(piece) = stream.next().await {
        let piece = piece?;
        let read = Instant::now();
        for data in sse.push(&piece) {
            if data == "[DONE]" {
                continue;
            }
            let chunk: Value = serde_json::from_str(&data)?;
            match chunk["type"].as_str() {
                Some("text-delta") => {
                    let stamp = chunk["delta"]
                        .as_str()
                        .context("text-delta without delta")?;
                    out.push(in_flight(stamp, read, system.provider.epoch())?);
                }
                Some("finish") => finished = chunk["finishReason"] == "stop",
                Some("error") => bail!("the turn failed: {data}"),
                _ => {}
            }
        }
    }
    if !finished {
        bail!("a relay turn did not finish with `stop`");
    }
    Ok(out)
}

/// Runs `rounds` answers on each of `streams` concurrent tasks; every answer must carry
/// all its deltas, or a lost one would look like a fast one.
async fn collect<F, Fut>(streams: usize, rounds: usize, one: F) -> Result<Vec<Duration>>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Duration>>> + Send + 'static,
{
    let tasks: Vec<_> = (0..streams)
        .map(|stream| {
            let rounds: Vec<Fut> = (0..rounds).map(|_| one(stream)).collect();
            tokio::spawn(async move {
                let mut out = Vec::new();
                for round in rounds {
                    let deltas = round.await?;
                    if deltas.len() != DELTAS {
                        bail!("an answer carried {} of {DELTAS} deltas", deltas.len());
                    }
                    out.extend(deltas);
                }
                anyhow::Ok(out)
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
    }
    Ok(sorted(all))
}

pub async fn relay(rows: &mut Vec<Row>) -> Result<()> {
    for (streams, rounds) in LEVELS {
        let system = std::sync::Arc::new(System::start(None).await?);
        let mut chats = Vec::new();
        for _ in 0..streams {
            chats.push(system.agent_and_chat(None).await?.1);
        }
        // Warm-up: a turn per chat and a request per stream straight to the provider
        // (connections, prepared statements), so neither path pays for its first use.
        for _ in &chats {
            system.provider.push(instant_ok());
        }
        let warm = chats.iter().map(|chat| async {
            let response = system.send(chat, "hi").await?;
            if response.status() != 200 {
                bail!("warm-up turn: {}", response.status());
            }
            response.bytes().await?;
            anyhow::Ok(())
        });
        for warmed in futures_util::future::join_all(warm).await {
            warmed?;
        }
        collect(streams, 1, |_| {
            let system = system.clone();
            async move { direct(&system).await }
        })
        .await?;

        let floor = collect(streams, rounds, |_| {
            let system = system.clone();
            async move { direct(&system).await }
        })
        .await?;
        let brain = collect(streams, rounds, |stream| {
            let system = system.clone();
            let chat = chats[stream].clone();
            async move { via_brain(&system, &chat).await }
        })
        .await?;

        let scenario = format!("token relay c={streams}");
        let max = |v: &[Duration]| ms(v.last().copied().unwrap_or_default());
        rows.push(row(
            &scenario,
            "provider -> client, direct (floor)",
            ms(pct(&floor, 50.0)),
            ms(pct(&floor, 99.0)),
            format!("{} deltas, max {}", floor.len(), max(&floor)),
        ));
        rows.push(row(
            &scenario,
            "provider -> brain -> client",
            ms(pct(&brain, 50.0)),
            ms(pct(&brain, 99.0)),
            format!("{} deltas, max {}", brain.len(), max(&brain)),
        ));
        rows.push(row(
            &scenario,
            "brain added per delta (via brain - direct)",
            signed_ms(pct(&brain, 50.0), pct(&floor, 50.0)),
            signed_ms(pct(&brain, 99.0), pct(&floor, 99.0)),
            format!("difference of percentiles; {DELTAS} deltas 5 ms apart per answer"),
        ));
        eprintln!("bench: token relay with {streams} streams done");
        if let Ok(system) = std::sync::Arc::try_unwrap(system) {
            system.close().await;
        }
    }
    Ok(())
}
