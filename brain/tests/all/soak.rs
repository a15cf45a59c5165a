//! The soak's short form (the long one is `make bench-soak`, bench/src/soak.rs):
//! [`AGENTS`] agents, each with [`CHATS`] chats of [`TURNS`] turns, over two replicas (this
//! process's brain and a brain process), with the process SIGKILLed a third of the way.
//! Clients behave as a careful frontend does: every message has a client id, and a turn
//! whose request fails or whose stream breaks is asked again with the same id on either
//! replica (T12), which follows it wherever it runs or learns how it ended (D3, D5). Then
//! Postgres is checked: every turn terminal, every message stored once, none lost. `make
//! test` runs it on one Redis and one Postgres, on a Redis Cluster and behind a pooler.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::common::{BrainProcess, TestApp};

const AGENTS: usize = 8;
const CHATS: usize = 3;
const TURNS: usize = 3;
/// A client gives a turn up (and the test fails) after this long.
const TURN_DEADLINE: Duration = Duration::from_secs(60);

/// How a turn ended, as its client saw it.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Completed,
    Interrupted,
    Failed(String),
}

/// One turn, asked again with the same message id until its end is known.
async fn turn(app: &TestApp, urls: &[String; 2], chat: &str, id: &str, first: usize) -> Seen {
    let deadline = Instant::now() + TURN_DEADLINE;
    for attempt in 0.. {
        assert!(Instant::now() < deadline, "turn {id} never ended");
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let sent = app
            .http
            .post(format!(
                "{}/v1/chats/{chat}/messages",
                urls[(first + attempt) % 2]
            ))
            .bearer_auth(&app.key)
            .json(&json!({"content": format!("message {id}"), "message_id": id}))
            .timeout(Duration::from_secs(20))
            .send()
            .await;
        let Ok(response) = sent else { continue };
        match response.status().as_u16() {
            200 => {}
            // Busy (a killed turn's hold not yet given back), in progress (its turn runs
            // or waits for its takeover), or a blip: ask again.
            409 | 500 | 502 | 503 => continue,
            other => return Seen::Failed(format!("status {other}")),
        }
        if let Some(seen) = end_of(response).await {
            return seen;
        }
    }
    unreachable!()
}

/// How a UI message stream ended: `None` if it broke first, or its turn was handed over.
async fn end_of(response: reqwest::Response) -> Option<Seen> {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(piece) = stream.next().await {
        body.extend_from_slice(&piece.ok()?);
    }
    let body = String::from_utf8(body).ok()?;
    let mut end = None;
    for event in body.split("\n\n").filter(|e| !e.is_empty()) {
        let data = event.strip_prefix("data: ")?;
        if data == "[DONE]" {
            return end;
        }
        let chunk: Value = serde_json::from_str(data).ok()?;
        match chunk["type"].as_str() {
            Some("finish") if chunk["finishReason"] == "stop" => end = Some(Seen::Completed),
            Some("finish") => end = Some(Seen::Interrupted),
            Some("error")
                if chunk["errorText"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("replica_lost")) =>
            {
                return None;
            }
            Some("error") => end = Some(Seen::Failed(chunk["errorText"].to_string())),
            _ => {}
        }
    }
    None
}

#[tokio::test]
async fn a_short_soak_over_two_replicas_and_a_kill_loses_no_turn_and_stores_none_twice() {
    let app = Arc::new(TestApp::start_with(|c| c.lease_ttl = Duration::from_millis(800)).await);
    let mut victim = BrainProcess::start(&app, &[("BRAIN_LEASE_TTL_MS", "800")]).await;
    let urls = Arc::new([app.url.clone(), victim.url.clone()]);
    let mut plans = Vec::new();
    for a in 0..AGENTS {
        let agent = app
            .post_json(
                "/v1/agents",
                &json!({"name": format!("soak-{a}"), "system_prompt": "Be brief.",
                        "model": "openai/gpt-test"}),
            )
            .await;
        assert_eq!(agent.status(), 201);
        let agent: Value = agent.json().await.unwrap();
        let mut chats = Vec::new();
        for _ in 0..CHATS {
            let chat = app
                .post_json(
                    &format!("/v1/agents/{}/chats", agent["id"].as_str().unwrap()),
                    &json!({}),
                )
                .await;
            assert_eq!(chat.status(), 201);
            let chat: Value = chat.json().await.unwrap();
            chats.push(chat["id"].as_str().unwrap().to_owned());
        }
        plans.push(chats);
    }

    let ended = Arc::new(AtomicUsize::new(0));
    let total = AGENTS * CHATS * TURNS;
    // One client per agent (one turn per agent at a time, T9), its chats in turn.
    let clients: Vec<_> = plans
        .into_iter()
        .enumerate()
        .map(|(a, chats)| {
            let (app, urls, ended) = (app.clone(), urls.clone(), ended.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for (c, chat) in chats.iter().enumerate() {
                    for t in 0..TURNS {
                        let id = uuid::Uuid::new_v4().to_string();
                        let end = turn(&app, &urls, chat, &id, a + c + t).await;
                        ended.fetch_add(1, Ordering::Relaxed);
                        seen.push((id, end));
                    }
                }
                seen
            })
        })
        .collect();
    while ended.load(Ordering::Relaxed) < total / 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    victim.kill().await;
    let mut seen = Vec::new();
    for client in clients {
        seen.extend(client.await.unwrap());
    }

    let failed: Vec<_> = seen
        .iter()
        .filter(|(_, end)| matches!(end, Seen::Failed(_)))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    app.settled().await;
    let open: i64 =
        sqlx::query_scalar("SELECT count(*) FROM turns WHERE status IN ('running', 'queued')")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(open, 0, "every turn ends");
    let stored: Vec<(String, i64)> = sqlx::query_as(
        "SELECT client_message_id, count(*) FROM messages \
         WHERE role = 'user' AND client_message_id IS NOT NULL GROUP BY 1",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    assert_eq!(stored.len(), total, "every message stored");
    assert!(
        stored.iter().all(|(_, n)| *n == 1),
        "none twice: {stored:?}"
    );
    for (id, _) in &seen {
        assert!(stored.iter().any(|(s, _)| s == id), "message {id} lost");
    }
}
