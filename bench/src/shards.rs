//! The per-shard spread on a Redis Cluster (O5, docs/SCALING.md): a brain on a cluster of
//! three masters on loopback (the tests' `test_support::redis_cluster`, a private one),
//! [`TEAMS`] teams each with its own agent, chat and quotas, turns in a closed loop for
//! `BENCH_SECONDS`; then each master's share of the commands it ran and of the CPU its
//! process spent (`INFO commandstats`, `INFO cpu` deltas), and how far the busiest and the
//! idlest are from an even third. Keys are placed by the hash tags of
//! docs/design/redis-keys.md: a team's hold and counters on its team's slot, a chat's
//! events stream on its bucket's.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use test_support::redis_cluster::RedisCluster;

use crate::system::{Row, System, closed_loop, instant_ok, row, window};
use crate::turn::high_quotas;

/// Teams, each with one client: a team's keys live on one slot, so the spread needs many.
const TEAMS: usize = 48;

/// One team's client: its key and its chat.
struct TeamClient {
    system: Arc<System>,
    key: String,
    chat: String,
}

impl TeamClient {
    async fn new(system: &Arc<System>, n: usize) -> Result<Arc<Self>> {
        let key = system
            .store
            .create_team(&format!("shard team {n}"))
            .await?
            .api_key;
        let quotas = system
            .http
            .put(format!("{}/v1/quotas", system.url))
            .bearer_auth(&key)
            .json(&high_quotas())
            .send()
            .await?;
        if !quotas.status().is_success() {
            bail!("quotas: {}", quotas.status());
        }
        let agent: Value = created(
            system
                .post_json_as(
                    &key,
                    "/v1/agents",
                    &json!({"name": "bench", "system_prompt": "You are terse.",
                            "model": "openai/gpt-test"}),
                )
                .await?,
        )
        .await?;
        let agent = agent["id"].as_str().context("agent id")?;
        let chat: Value = created(
            system
                .post_json_as(&key, &format!("/v1/agents/{agent}/chats"), &json!({}))
                .await?,
        )
        .await?;
        let chat = chat["id"].as_str().context("chat id")?.to_owned();
        Ok(Arc::new(Self {
            system: system.clone(),
            key,
            chat,
        }))
    }

    async fn turn(&self) -> Result<()> {
        self.system.provider.push(instant_ok());
        let response = self
            .system
            .post_json_as(
                &self.key,
                &format!("/v1/chats/{}/messages", self.chat),
                &json!({"content": "hi"}),
            )
            .await?;
        if response.status() != 200 {
            bail!("turn: {}", response.status());
        }
        let body = response.text().await?;
        if !body.contains("\"text-delta\"") {
            bail!("a turn streamed no text");
        }
        Ok(())
    }
}

async fn created(response: reqwest::Response) -> Result<Value> {
    if response.status() != 201 {
        bail!("create: {} {}", response.status(), response.text().await?);
    }
    Ok(response.json().await?)
}

/// (commands run, CPU seconds) of one node so far.
async fn node_load(url: &str) -> Result<(u64, f64)> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await?;
    let cpu: String = redis::cmd("INFO").arg("cpu").query_async(&mut conn).await?;
    let calls = stats
        .lines()
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    let seconds = cpu
        .lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum();
    Ok((calls, seconds))
}

/// `shares` as "a / b / c", and the largest distance of one from the mean, in percent.
fn spread(shares: &[f64]) -> (String, f64) {
    let mean = shares.iter().sum::<f64>() / shares.len() as f64;
    let worst = shares
        .iter()
        .map(|s| (s / mean - 1.0).abs())
        .fold(0.0, f64::max);
    let listed = shares
        .iter()
        .map(|s| format!("{:.1} %", 100.0 * s / shares.iter().sum::<f64>()))
        .collect::<Vec<_>>()
        .join(" / ");
    (listed, 100.0 * worst)
}

pub async fn shards(rows: &mut Vec<Row>) -> Result<()> {
    let cluster = RedisCluster::start(3, 0);
    let masters = cluster.urls();
    let system =
        Arc::new(System::start_with(None, &[("REDIS_CLUSTER_URLS", &cluster.urls_list())]).await?);
    let mut clients = Vec::with_capacity(TEAMS);
    for n in 0..TEAMS {
        clients.push(TeamClient::new(&system, n).await?);
    }
    // Warm-up: connections, slot maps, statements.
    for client in &clients {
        client.turn().await?;
    }
    let mut before = Vec::new();
    for url in &masters {
        before.push(node_load(url).await?);
    }
    let (turns, elapsed) =
        closed_loop(window(), clients, |client: Arc<TeamClient>, _| async move {
            client.turn().await
        })
        .await?;
    let mut commands = Vec::new();
    let mut cpu = Vec::new();
    for (url, (calls, seconds)) in masters.iter().zip(before) {
        let (calls_now, seconds_now) = node_load(url).await?;
        commands.push(calls_now.saturating_sub(calls) as f64);
        cpu.push(seconds_now - seconds);
    }
    let (command_shares, command_spread) = spread(&commands);
    let (cpu_shares, cpu_spread) = spread(&cpu);
    let scenario = format!("shards: 3 masters, {TEAMS} teams");
    rows.push(row(
        &scenario,
        "commands per master",
        String::new(),
        String::new(),
        format!(
            "{command_shares}; farthest from even {command_spread:.1} %; {:.1} commands a turn, {} turns at {:.0} turns/s",
            commands.iter().sum::<f64>() / turns.len() as f64,
            turns.len(),
            turns.len() as f64 / elapsed.as_secs_f64()
        ),
    ));
    rows.push(row(
        &scenario,
        "CPU per master",
        String::new(),
        String::new(),
        format!(
            "{cpu_shares}; farthest from even {cpu_spread:.1} %; {:.0} us a turn in all",
            1e6 * cpu.iter().sum::<f64>() / turns.len() as f64
        ),
    ));
    eprintln!("bench: shards done ({} turns)", turns.len());
    if let Ok(system) = Arc::try_unwrap(system) {
        system.close().await;
    }
    drop(cluster);
    Ok(())
}
