//! Takeover (D6): two brain replicas (release binaries, one database, one
//! scripted provider); replica A runs [`TURNS`] turns, half of them mid-text (their first
//! model call streaming) and half mid-tool (a `memory_write` step done and durable, their
//! second model call streaming), when it is SIGKILLed. Each client does what a careful
//! frontend does (D5): it posts its message id again to replica B, which attaches it to
//! the running turn, and reads on. Measured from the kill: the first chunk of the resumed
//! turn (its `resumed` notice, which comes with the turn's restart) and the turn's
//! `finish`, per turn. A turn that does not complete, or whose shown text holds the lost
//! step's output, fails the run.
//!
//! The lease is the brain's default unless `BRAIN_LEASE_TTL_MS` is set for the bench (the
//! brains inherit it), so the figures are what a default deployment sees: the killed
//! replica's lease to lapse, then at most a tick (a quarter lease) of the survivor.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use scripted_provider::{Reply, ScriptedProvider, ToolCall};
use serde_json::{Value, json};

use crate::system::{BrainProcess, Database, Row, SseData, free_addr, ms, pct, row, sorted};

/// Turns running on the killed replica; the first half mid-text, the rest mid-tool.
const TURNS: usize = 16;
/// A client gives up on a turn after this long from the kill.
const DEADLINE: Duration = Duration::from_secs(30);
/// What the killed replica's model calls stream until the kill.
const LOST: &str = "lost ";

/// What one turn's client saw after the kill.
struct Seen {
    resumed: Duration,
    finished: Duration,
}

pub async fn takeover(rows: &mut Vec<Row>) -> Result<()> {
    let db = Database::create().await?;
    let provider = ScriptedProvider::start().await?;
    let (a_addr, b_addr) = (free_addr()?, free_addr()?);
    let a = BrainProcess::start(&db, &provider, a_addr, &[]).await?;
    let b = BrainProcess::start(&db, &provider, b_addr, &[]).await?;
    let team = db.store.create_team("takeover team").await?;
    let http = reqwest::Client::new();
    let (a_url, b_url) = (format!("http://{a_addr}"), format!("http://{b_addr}"));

    // One agent per turn (one turn per agent at a time, T9). Started one after another,
    // each until its current model call streams, so each takes the replies meant for it.
    let mut turns = Vec::new();
    for i in 0..TURNS {
        turns.push(start_turn(&http, &provider, &a_url, &team.api_key, i).await?);
    }
    // What the model answers the replica that takes each turn over.
    for _ in 0..TURNS {
        provider.push(Reply::Text {
            deltas: vec!["The ".into(), "resumed ".into(), "answer.".into()],
            delay: Duration::from_millis(5),
        });
    }

    let killed = Instant::now();
    a.kill().await;
    let clients: Vec<_> = turns
        .into_iter()
        .map(|(chat, message_id)| {
            let (http, url, key) = (http.clone(), b_url.clone(), team.api_key.clone());
            tokio::spawn(async move { follow(&http, &url, &key, &chat, &message_id, killed).await })
        })
        .collect();
    let mut seen = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let turn = client.await?.with_context(|| format!("turn {i}"))?;
        seen.push(turn);
    }
    let (statuses,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM turns WHERE status = 'completed' AND takeovers = 1")
            .fetch_one(db.store.pool())
            .await?;
    b.stop().await;
    provider.shutdown();
    db.drop().await;
    if statuses != TURNS as i64 {
        bail!("{statuses} of {TURNS} turns completed after one takeover");
    }

    let resumed = sorted(seen.iter().map(|s| s.resumed).collect());
    let finished = sorted(seen.iter().map(|s| s.finished).collect());
    // The brains inherit this process' environment: a lease set there is theirs.
    let lease = std::env::var("BRAIN_LEASE_TTL_MS")
        .map(|ms| format!("BRAIN_LEASE_TTL_MS={ms}"))
        .unwrap_or_else(|_| "the default 6 s lease".into());
    rows.push(row(
        "takeover",
        "kill → first resumed chunk",
        ms(pct(&resumed, 50.0)),
        ms(pct(&resumed, 99.0)),
        format!(
            "{TURNS} turns ({} mid-text, {} mid-tool) on the SIGKILLed replica, {lease}",
            TURNS / 2,
            TURNS - TURNS / 2
        ),
    ));
    rows.push(row(
        "takeover",
        "kill → turn finished",
        ms(pct(&finished, 50.0)),
        ms(pct(&finished, 99.0)),
        "each client re-posted its message id to the survivor (D5); all completed, the lost \
         step shown never"
            .into(),
    ));
    Ok(())
}

/// Starts turn `i` on the replica at `url` and answers its chat and message id once its
/// current model call streams: mid-text, or for the second half mid-tool.
async fn start_turn(
    http: &reqwest::Client,
    provider: &ScriptedProvider,
    url: &str,
    key: &str,
    i: usize,
) -> Result<(String, String)> {
    let chat = chat(http, url, key, i).await?;
    let mid_tool = i >= TURNS / 2;
    if mid_tool {
        provider.push(Reply::ToolCalls {
            text: None,
            fragment: 0,
            calls: vec![ToolCall {
                id: format!("call_{i}"),
                name: "memory_write".into(),
                arguments: json!({"content": format!("fact {i}")}).to_string(),
            }],
        });
    }
    provider.push(Reply::Held {
        delta: LOST.into(),
        every: Duration::from_millis(50),
    });
    let message_id = format!("takeover-{i}");
    let response = http
        .post(format!("{url}/v1/chats/{chat}/messages"))
        .bearer_auth(key)
        .json(&json!({"content": "go", "message_id": message_id}))
        .send()
        .await?;
    if response.status() != 200 {
        bail!("turn {i}: {}", response.status());
    }
    let (streaming, reader) = tokio::sync::oneshot::channel();
    tokio::spawn(read_until_cut(response, mid_tool, streaming));
    tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .with_context(|| format!("turn {i} never streamed"))??;
    Ok((chat, message_id))
}

async fn chat(http: &reqwest::Client, url: &str, key: &str, i: usize) -> Result<String> {
    let created = |response: reqwest::Response| async move {
        if response.status() != 201 {
            bail!("create: {}", response.status());
        }
        let body: Value = response.json().await?;
        Ok::<_, anyhow::Error>(body["id"].as_str().context("id")?.to_owned())
    };
    let agent = created(
        http.post(format!("{url}/v1/agents"))
            .bearer_auth(key)
            .json(
                &json!({"name": format!("takeover-{i}"), "system_prompt": "Be brief.",
                          "model": "openai/gpt-test"}),
            )
            .send()
            .await?,
    )
    .await?;
    created(
        http.post(format!("{url}/v1/agents/{agent}/chats"))
            .bearer_auth(key)
            .json(&json!({}))
            .send()
            .await?,
    )
    .await
}

/// Reads a turn's stream on the replica to be killed until it breaks; says when the model
/// call to be lost streams (for a mid-tool turn, the one after its tool's result).
async fn read_until_cut(
    response: reqwest::Response,
    mid_tool: bool,
    streaming: tokio::sync::oneshot::Sender<()>,
) {
    let mut streaming = Some(streaming);
    let mut tool_done = !mid_tool;
    let mut body = response.bytes_stream();
    let mut sse = SseData::default();
    while let Some(Ok(piece)) = body.next().await {
        for data in sse.push(&piece) {
            let Ok(chunk) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            match chunk["type"].as_str() {
                Some("tool-output-available") => tool_done = true,
                Some("text-delta") if tool_done => {
                    if let Some(tx) = streaming.take() {
                        let _ = tx.send(());
                    }
                }
                _ => {}
            }
        }
    }
}

/// The client of one turn after the kill: posts its message id to the survivor until it
/// gets the turn's stream, and reads it to its end.
async fn follow(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    chat: &str,
    message_id: &str,
    killed: Instant,
) -> Result<Seen> {
    loop {
        if killed.elapsed() > DEADLINE {
            bail!("not finished {DEADLINE:?} after the kill");
        }
        let response = http
            .post(format!("{url}/v1/chats/{chat}/messages"))
            .bearer_auth(key)
            .json(&json!({"content": "go", "message_id": message_id}))
            .send()
            .await?;
        if response.status() != 200 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let mut body = response.bytes_stream();
        let mut sse = SseData::default();
        let mut resumed = None;
        // The text a client shows: each step's, a `reset-step` dropping the current one's.
        let mut steps = vec![String::new()];
        while let Some(piece) = body.next().await {
            for data in sse.push(&piece?) {
                if data == "[DONE]" {
                    continue;
                }
                let chunk: Value = serde_json::from_str(&data)?;
                match chunk["type"].as_str() {
                    Some("data-notice") if chunk["data"]["code"] == "resumed" => {
                        resumed.get_or_insert_with(|| killed.elapsed());
                    }
                    Some("start-step") => steps.push(String::new()),
                    Some("reset-step") => steps.last_mut().context("a step")?.clear(),
                    Some("text-delta") => steps
                        .last_mut()
                        .context("a step")?
                        .push_str(chunk["delta"].as_str().unwrap_or_default()),
                    Some("finish") => {
                        let finished = killed.elapsed();
                        let shown = steps.concat();
                        if chunk["finishReason"] != "stop" || shown.contains(LOST) {
                            bail!("ended {}, showing {shown:?}", chunk["finishReason"]);
                        }
                        let resumed = resumed.context("no resumed notice")?;
                        return Ok(Seen { resumed, finished });
                    }
                    Some("error") => bail!("the turn failed: {data}"),
                    _ => {}
                }
            }
        }
    }
}
