//! The events stream (S2) under load: 1,000 observers of one chat on one replica while a
//! turn streams, and what each observer's copy of a text delta adds over the turn's own
//! client. Every delta carries the scripted provider's send stamp ([`Reply::Stamped`]), so
//! each reader, in this process and on the same clock, measures the delta's time in
//! flight; the client's figure is the floor, the observers' minus it is the stream's cost
//! (the publisher's pipeline to Redis, the shared reader's `XREAD`, the broadcast, SSE).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use scripted_provider::Reply;
use serde_json::Value;

use crate::relay::in_flight;
use crate::system::{Row, SseData, System, instant_ok, ms, pct, row, signed_ms, sorted};

const OBSERVERS: usize = 1000;
const DELTAS: usize = 200;
const GAP: Duration = Duration::from_millis(5);

/// Each text delta's stamp, seen at the instant its piece was read; stops at `finish`.
async fn read_deltas(response: reqwest::Response, epoch: Instant) -> Result<Vec<Duration>> {
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
            match chunk["type"].as_str() {
                Some("text-delta") => {
                    let stamp = chunk["delta"]
                        .as_str()
                        .context("text-delta without delta")?;
                    out.push(in_flight(stamp, read, epoch)?);
                }
                Some("finish") => return Ok(out),
                Some("data-notice") => bail!("an observer was cut off: {data}"),
                _ => {}
            }
        }
    }
    bail!("a stream ended before finish")
}

pub async fn observers(rows: &mut Vec<Row>) -> Result<()> {
    let system = Arc::new(System::start(None).await?);
    let (_, chat) = system.agent_and_chat(None).await?;
    system.provider.push(instant_ok());
    system.send(&chat, "warm up").await?.bytes().await?;
    // Its own client, so the observers' connections do not queue behind each other in
    // one pool.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(OBSERVERS)
        .build()?;
    let mut watching = Vec::with_capacity(OBSERVERS);
    for _ in 0..OBSERVERS {
        let response = http
            .get(format!("{}/v1/chats/{chat}/events", system.url))
            .bearer_auth(&system.key)
            .send()
            .await?;
        if response.status() != 200 {
            bail!("events: {}", response.status());
        }
        let epoch = system.provider.epoch();
        watching.push(tokio::spawn(read_deltas(response, epoch)));
    }
    // Every observer is subscribed (its response came); a moment for the shared reader.
    tokio::time::sleep(Duration::from_millis(500)).await;
    system.provider.push(Reply::Stamped {
        count: DELTAS,
        delay: GAP,
    });
    let started = Instant::now();
    let response = system.send(&chat, "count").await?;
    if response.status() != 200 {
        bail!("turn: {}", response.status());
    }
    let client = sorted(read_deltas(response, system.provider.epoch()).await?);
    let turn_took = started.elapsed();
    let mut seen = Vec::with_capacity(OBSERVERS * DELTAS);
    for observer in watching {
        let deltas = tokio::time::timeout(Duration::from_secs(60), observer)
            .await
            .context("an observer never saw finish")???;
        if deltas.len() != DELTAS {
            bail!("an observer saw {} of {DELTAS} deltas", deltas.len());
        }
        seen.extend(deltas);
    }
    let seen = sorted(seen);
    let scenario = format!("events stream, {OBSERVERS} observers");
    rows.push(row(
        &scenario,
        "turn client: provider → delta",
        ms(pct(&client, 50.0)),
        ms(pct(&client, 99.0)),
        format!("{DELTAS} deltas, turn {} ms", turn_took.as_millis()),
    ));
    rows.push(row(
        &scenario,
        "observers: provider → delta",
        ms(pct(&seen, 50.0)),
        ms(pct(&seen, 99.0)),
        format!("{} deltas", seen.len()),
    ));
    rows.push(row(
        &scenario,
        "added per delta (observer - client)",
        signed_ms(pct(&seen, 50.0), pct(&client, 50.0)),
        signed_ms(pct(&seen, 99.0), pct(&client, 99.0)),
        "difference of percentiles".into(),
    ));
    eprintln!("bench: observers done");
    if let Ok(system) = Arc::try_unwrap(system) {
        system.close().await;
    }
    Ok(())
}
