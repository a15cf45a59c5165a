//! The bench harness: starts a brain in-process over a fresh Postgres database
//! and the local Redis, the scripted provider on loopback, and (for the hands scenarios)
//! a release runtime-manager child with the local launcher; runs each scenario and prints
//! one table. Not a test: `make bench` builds everything in release and runs it.
//!
//! Environment: `BENCH_DATABASE_URL` (admin URL, default the local Postgres), `REDIS_URL`
//! (default redis://127.0.0.1:6379), `BENCH_SECONDS` (window per concurrency level,
//! default 5; also how long the live turns stay all open), `BENCH_CONCURRENCY` (the
//! turn-overhead levels, default 1,16,64,256), `BENCH_ONLY` (comma-separated
//! scenario names: cpu, turn, quota, observers, busy, relay, live, hands, snapshots,
//! speculation, hangup, openloop, quiet, takeover, attachments, openai, knowledge, peer,
//! soak, shards; empty runs all but peer, soak, shards, quiet and knowledge),
//! `BENCH_MESSAGE_IDS` (`1`: every message posted carries a fresh `message_id`),
//! `BENCH_CHAT_TITLES` (`1`: each new chat is titled after its first turn),
//! `BENCH_QUIET_RATE` (the `quiet` open loop's turns per second, default 5),
//! `BENCH_TSV` (a file to write the table's rows to as tab-separated values, for make
//! bench-compare).
//!
//! `cpu` runs the release `brain` binary as a child and reports its CPU, Postgres' and
//! Redis' per no-tool turn (bench/src/cpu.rs).
//!
//! `soak` (`make bench-soak`) runs 1,000 chats × 10 turns over two brain processes with
//! Redis blips and one replica killed and restarted, and prints what became of every turn.
//!
//! `takeover` SIGKILLs a replica running 16 turns and times each turn's resumption on the
//! other (bench/src/takeover.rs).
//!
//! `knowledge` ingests generated Markdown into two knowledge bases through the API and
//! times lexical search and its recall@5 over about 1,000 passages and over
//! `BENCH_KNOWLEDGE_CHUNKS` (default 100,000) (bench/src/knowledge.rs).
//!
//! `live` runs the release `brain` binary as a child, to read its RSS and CPU from `/proc`.
//!
//! `peer` (`make bench-peer`) measures the turn overhead of LangGraph's dev server beside
//! the brain's; it needs `langgraph` installed: `BENCH_PEER_LANGGRAPH` (the executable,
//! default `langgraph` on PATH), `BENCH_PEER_DIR` (where `langgraph.json` and `graph.py`
//! are, default the `bench/peer` this binary was built from).

mod attachments;
mod cpu;
mod hands;
mod knowledge;
mod live;
mod observers;
mod openai;
mod openloop;
mod peer;
mod relay;
mod shards;
mod soak;
mod system;
mod takeover;
mod turn;

use anyhow::{Context, Result};

use system::Row;

fn print_table(rows: &[Row]) {
    let headers = ["scenario", "metric", "p50", "p99", "other"];
    let cells: Vec<[&str; 5]> = rows
        .iter()
        .map(|r| {
            [
                r.scenario.as_str(),
                r.metric.as_str(),
                r.p50.as_str(),
                r.p99.as_str(),
                r.other.as_str(),
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for line in &cells {
        for (w, c) in widths.iter_mut().zip(line) {
            *w = (*w).max(c.len());
        }
    }
    let print = |line: [&str; 5]| {
        let parts: Vec<String> = line
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("| {} |", parts.join(" | "));
    };
    print(headers);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    println!("|-{}-|", rule.join("-|-"));
    for line in cells {
        print(line);
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    // `peer` needs LangGraph installed, which plain `make bench` does not do, `soak`
    // (make bench-soak) takes minutes and measures survival, not speed, `shards`
    // measures a Redis Cluster's spread, not the turn, `quiet` spends a minute on what
    // `peer` also measures, and `knowledge` indexes 100,000 passages (minutes): they run
    // only when named.
    let wants = |name: &str| {
        let named = only.split(',').any(|s| s.trim() == name);
        named
            || (only.is_empty()
                && !["peer", "soak", "shards", "quiet", "knowledge"].contains(&name))
    };
    let mut rows = Vec::new();
    if wants("cpu") {
        cpu::cpu(&mut rows).await?;
    }
    if wants("turn") {
        turn::turn_overhead(&mut rows).await?;
    }
    if wants("quota") {
        turn::quota_overhead(&mut rows).await?;
    }
    if wants("observers") {
        observers::observers(&mut rows).await?;
    }
    if wants("busy") {
        turn::busy_answer(&mut rows).await?;
    }
    if wants("relay") {
        relay::relay(&mut rows).await?;
    }
    if wants("live") {
        live::live(&mut rows).await?;
    }
    if wants("hands") {
        hands::hands(&mut rows).await?;
    }
    if wants("snapshots") {
        hands::snapshots(&mut rows).await?;
    }
    if wants("speculation") {
        hands::speculation(&mut rows).await?;
    }
    if wants("hangup") {
        hands::hangup(&mut rows).await?;
    }
    if wants("openloop") {
        openloop::openloop(&mut rows).await?;
    }
    if wants("quiet") {
        openloop::quiet(&mut rows).await?;
    }
    if wants("attachments") {
        attachments::attachments(&mut rows).await?;
    }
    if wants("openai") {
        openai::openai(&mut rows).await?;
    }
    if wants("knowledge") {
        knowledge::knowledge(&mut rows).await?;
    }
    if wants("takeover") {
        takeover::takeover(&mut rows).await?;
    }
    if wants("peer") {
        peer::peer(&mut rows).await?;
    }
    if wants("soak") {
        soak::soak(&mut rows).await?;
    }
    if wants("shards") {
        shards::shards(&mut rows).await?;
    }
    print_table(&rows);
    if let Ok(path) = std::env::var("BENCH_TSV") {
        write_tsv(&path, &rows)?;
    }
    Ok(())
}

/// The table's rows as tab-separated values, for scripts (scripts/bench-compare.sh): a
/// header line, then one line per row; a tab or newline inside a cell becomes a space.
fn write_tsv(path: &str, rows: &[Row]) -> Result<()> {
    let clean = |cell: &str| cell.replace(['\t', '\n'], " ");
    let mut out = String::from("scenario\tmetric\tp50\tp99\tother\n");
    for r in rows {
        let cells = [&r.scenario, &r.metric, &r.p50, &r.p99, &r.other].map(|c| clean(c));
        out.push_str(&cells.join("\t"));
        out.push('\n');
    }
    std::fs::write(path, out).with_context(|| format!("BENCH_TSV: writing {path}"))
}
