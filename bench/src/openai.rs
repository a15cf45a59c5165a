//! The OpenAI-compatible front end beside the native one (`BENCH_ONLY=openai`, P7): one
//! turn at a time to the same agent, `POST /openai/v1/chat/completions` (streamed) against
//! `POST /v1/chats/{id}/messages`, each timed from the send to the first text and to the
//! end of the answer. Two shapes of conversation: a new one (a new chat each turn) and
//! one continued after nine exchanges (the OpenAI client resends all 19 messages before
//! its new one, which the front end matches to the chat by their fingerprint; the native
//! client posts only its new message). The four kinds take turns, so drift in the
//! machine's load falls on all of them alike.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::system::{Row, SseData, System, instant_ok, ms, pct, row, signed_ms, sorted};
use crate::turn::read_timed;

/// Timed turns of each kind, after [`WARM`] untimed ones.
const TURNS: usize = 60;
const WARM: usize = 5;
/// Exchanges before a continued conversation's timed turn.
const HISTORY: usize = 9;

/// One streamed chat completion of `messages` to `agent`: (first text, end) and the chat
/// the answer names.
async fn completion(
    system: &System,
    agent: &str,
    messages: &[Value],
) -> Result<(Duration, Duration, String)> {
    system.provider.push(instant_ok());
    let body = json!({"model": agent, "stream": true, "messages": messages});
    let started = Instant::now();
    let response = system
        .post_json("/openai/v1/chat/completions", &body)
        .await?;
    if response.status() != 200 {
        bail!(
            "completion: {} {}",
            response.status(),
            response.text().await?
        );
    }
    let chat = response
        .headers()
        .get("x-chat-id")
        .context("completion: x-chat-id")?
        .to_str()?
        .to_owned();
    let mut stream = response.bytes_stream();
    let (mut sse, mut first) = (SseData::default(), None);
    while let Some(piece) = stream.next().await {
        let piece = piece?;
        if first.is_some() {
            continue;
        }
        for data in sse.push(&piece) {
            let Ok(chunk) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            let text = chunk["choices"][0]["delta"]["content"].as_str();
            if text.is_some_and(|t| !t.is_empty()) {
                first.get_or_insert(started.elapsed());
            }
        }
    }
    let end = started.elapsed();
    Ok((first.context("a completion streamed no text")?, end, chat))
}

/// One native turn on `chat`: (first text-delta, end).
async fn native(system: &System, chat: &str) -> Result<(Duration, Duration)> {
    system.provider.push(instant_ok());
    let started = Instant::now();
    let response = system.send(chat, "hi").await?;
    let (_, first, end) = read_timed(response, started).await?;
    Ok((first, end))
}

/// An OpenAI conversation after `exchanges` untimed ones, its next turn timed.
async fn continued_completion(
    system: &System,
    agent: &str,
    exchanges: usize,
) -> Result<(Duration, Duration)> {
    let mut messages = Vec::new();
    let mut chat = None;
    for n in 0..=exchanges {
        messages.push(json!({"role": "user", "content": format!("question {n}")}));
        let (first, end, answered_in) = completion(system, agent, &messages).await?;
        if *chat.get_or_insert_with(|| answered_in.clone()) != answered_in {
            bail!("a resent conversation opened a new chat: the wrong path would be timed");
        }
        messages.push(json!({"role": "assistant", "content": "ok"}));
        if n == exchanges {
            return Ok((first, end));
        }
    }
    bail!("a conversation of {exchanges} exchanges ended early")
}

/// A native chat after `exchanges` untimed turns, its next turn timed.
async fn continued_native(
    system: &System,
    agent: &str,
    exchanges: usize,
) -> Result<(Duration, Duration)> {
    let chat = system.new_chat(agent).await?;
    for _ in 0..exchanges {
        native(system, &chat).await?;
    }
    native(system, &chat).await
}

#[derive(Default)]
struct Timings {
    first: Vec<Duration>,
    end: Vec<Duration>,
}

impl Timings {
    fn add(&mut self, i: usize, (first, end): (Duration, Duration)) {
        if i >= WARM {
            self.first.push(first);
            self.end.push(end);
        }
    }
}

pub async fn openai(rows: &mut Vec<Row>) -> Result<()> {
    let system = System::start(None).await?;
    let (agent, _) = system.agent_and_chat(None).await?;
    let mut kinds = [
        ("a new conversation", Timings::default(), Timings::default()),
        ("after 9 exchanges", Timings::default(), Timings::default()),
    ];
    for i in 0..WARM + TURNS {
        let chat = system.new_chat(&agent).await?;
        kinds[0].1.add(i, native(&system, &chat).await?);
        let new = completion(&system, &agent, &[json!({"role": "user", "content": "hi"})]).await?;
        kinds[0].2.add(i, (new.0, new.1));
        kinds[1]
            .1
            .add(i, continued_native(&system, &agent, HISTORY).await?);
        kinds[1]
            .2
            .add(i, continued_completion(&system, &agent, HISTORY).await?);
    }
    for (name, native, openai) in kinds {
        for (what, native, openai) in [
            ("first text", native.first, openai.first),
            ("end", native.end, openai.end),
        ] {
            let (native, openai) = (sorted(native), sorted(openai));
            rows.push(row(
                "openai",
                &format!("{what}, {name}: /openai/v1 (native)"),
                format!("{} ({})", ms(pct(&openai, 50.0)), ms(pct(&native, 50.0))),
                format!("{} ({})", ms(pct(&openai, 99.0)), ms(pct(&native, 99.0))),
                format!(
                    "added: p50 {}, p99 {} ({TURNS} turns each)",
                    signed_ms(pct(&openai, 50.0), pct(&native, 50.0)),
                    signed_ms(pct(&openai, 99.0), pct(&native, 99.0)),
                ),
            ));
        }
    }
    eprintln!("bench: openai done");
    system.close().await;
    Ok(())
}
