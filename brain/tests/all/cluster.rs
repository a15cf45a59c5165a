//! The brain on a Redis Cluster (O5), three masters on loopback
//! (`test_support::redis_cluster`).
//!
//! These run in every test run. The wider set (turns, holds, quotas, events, stop,
//! revocation, a worker through the queue, autostart) runs on the shared cluster in
//! `make test`'s `cluster` target, which sets `TEST_REDIS_CLUSTER=1` for that subset of the
//! other modules' tests (`common::cluster_mode`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use scripted_provider::Reply;
use serde_json::{Value, json};
use test_support::redis_cluster::{self, RedisCluster, Secured};

use crate::common::{BrainProcess, TestApp, error_code, read_stream, streamed_text, words};

/// How many turns ran without the hold because Redis failed them.
async fn holds_unavailable(app: &TestApp) -> f64 {
    test_support::promtool::sample(&app.metrics().await, "brain_hold_unavailable_total", &[])
        .unwrap_or(0.0)
}

/// Sends a message whose turn answers `text`.
async fn turn(app: &TestApp, chat: &str, text: &str) -> reqwest::Response {
    app.provider.push(Reply::Text {
        deltas: words(text),
        delay: Duration::from_millis(1),
    });
    app.send(chat, &json!({"content": "hello"})).await
}

async fn on(cluster: &RedisCluster) -> TestApp {
    let urls = cluster.urls();
    TestApp::start_with(move |c| c.redis_cluster_urls = Some(urls)).await
}

/// A turn runs while a second message to the same agent is refused `agent_busy` and a
/// second agent is refused by the team's `concurrent_turns` quota: the admission script
/// (the agent's hold and the team's counters in one call) ran on the cluster, which only
/// a single slot for all its keys allows (else `CROSSSLOT`, and the turn would run without
/// the hold, counted).
#[tokio::test]
async fn the_hold_and_the_quota_script_run_on_a_cluster() {
    let cluster = redis_cluster::shared();
    let app = on(&cluster).await;
    let put = app
        .auth(app.http.put(format!("{}/v1/quotas", app.url)))
        .json(&json!({"concurrent_turns": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let other_chat = app.new_chat(&agent).await;
    let (_, second_agent_chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(Reply::Text {
        deltas: words("a slow answer of several words"),
        delay: Duration::from_millis(100),
    });
    let running = app.send(&chat, &json!({"content": "one"})).await;
    assert_eq!(running.status(), 200);

    let busy = app.send(&other_chat, &json!({"content": "two"})).await;
    assert_eq!(error_code(busy).await, (409, "agent_busy".to_owned()));
    let refused = app
        .send(&second_agent_chat, &json!({"content": "three"}))
        .await;
    assert_eq!(
        error_code(refused).await,
        (429, "quota_exceeded".to_owned())
    );

    let (chunks, _) = read_stream(running).await;
    assert_eq!(streamed_text(&chunks), "a slow answer of several words");
    app.settled().await;
    assert_eq!(
        holds_unavailable(&app).await,
        0.0,
        "every hold was taken on the cluster"
    );
}

/// Failover: a cluster with a replica per master; the master holding the team's keys is
/// killed. Turns go on (without the hold, counted, or refused `503`, while its slots have
/// no master), and once the replica is promoted they take the hold on the cluster again.
#[tokio::test]
async fn turns_take_the_hold_again_after_a_master_fails_over() {
    let cluster = RedisCluster::start(3, 1);
    let app = on(&cluster).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (chunks, _) = read_stream(turn(&app, &chat, "before the failover").await).await;
    assert_eq!(streamed_text(&chunks), "before the failover");
    assert_eq!(holds_unavailable(&app).await, 0.0);

    let master = cluster.master_of(&format!("hold:{{{}}}:", app.team));
    cluster.kill(master);
    let killed = Instant::now();
    cluster.wait_failed_over(master);
    println!("replica promoted {:?} after the kill", killed.elapsed());

    // Within a bound, a turn runs with its hold taken on the cluster (the counter of
    // turns run without it stays put across the turn).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tries = 0;
    loop {
        tries += 1;
        let before = holds_unavailable(&app).await;
        let response = tokio::time::timeout(
            Duration::from_secs(30),
            turn(&app, &chat, "after the failover"),
        )
        .await
        .expect("a turn answers within its bounds, failover or not");
        let status = response.status().as_u16();
        if status == 200 {
            let (chunks, _) = read_stream(response).await;
            assert_eq!(streamed_text(&chunks), "after the failover");
            app.settled().await;
            if holds_unavailable(&app).await == before {
                break;
            }
        } else {
            // The brain's bounds make the blip a clean refusal, never a hang.
            let body: Value = response.json().await.unwrap();
            assert_eq!(status, 503, "{body}");
        }
        assert!(
            Instant::now() < deadline,
            "no turn took the hold on the cluster again within a minute ({tries} tries)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "turns took the hold again {:?} after the kill ({tries} tries)",
        killed.elapsed()
    );
}

/// TLS and auth on a cluster as on one node (O5): every node of a cluster of the test's own
/// serves only TLS and only with the password; a brain process given `rediss://` seeds
/// with the password, trusting the test's CA through `SSL_CERT_FILE`, runs a turn whose
/// hold script and events went to the cluster's nodes, with none of them failed. Without
/// the password, or without the CA, a client is refused: the nodes check both.
#[tokio::test]
async fn a_brain_on_a_tls_cluster_with_a_password_runs_its_turns() {
    let certs = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cluster-tls-{}", uuid::Uuid::new_v4().simple()));
    test_support::tls::certificates(&certs);
    let cluster = RedisCluster::start_secured(
        3,
        Secured {
            certs: certs.clone(),
            password: "cluster-test-password".into(),
        },
    );
    let app = TestApp::start().await;
    let seeds = cluster.urls_list();
    let ca = certs.join("ca.pem");
    let brain = BrainProcess::start(
        &app,
        &[
            ("REDIS_CLUSTER_URLS", seeds.as_str()),
            ("SSL_CERT_FILE", ca.to_str().unwrap()),
        ],
    )
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(Reply::Text {
        deltas: words("an answer over TLS"),
        delay: Duration::from_millis(1),
    });
    let response = app
        .http
        .post(format!("{}/v1/chats/{chat}/messages", brain.url))
        .bearer_auth(&app.key)
        .json(&json!({"content": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (chunks, _) = read_stream(response).await;
    assert_eq!(streamed_text(&chunks), "an answer over TLS");

    let scrape = brain.metrics(&app.http).await;
    for failed in ["brain_hold_unavailable_total", "brain_events_dropped_total"] {
        let count = test_support::promtool::sample(&scrape, failed, &[]).unwrap_or(0.0);
        assert_eq!(count, 0.0, "{failed}");
    }
    let stats: String = cluster
        .ports()
        .iter()
        .filter_map(|port| cluster.cli(*port, &["INFO", "commandstats"]))
        .collect();
    for command in ["cmdstat_eval", "cmdstat_xadd"] {
        assert!(stats.contains(command), "{command} not in {stats}");
    }

    let refused = |url: String| async move {
        let client = redis::cluster::ClusterClient::new(vec![url]).unwrap();
        tokio::time::timeout(Duration::from_secs(10), client.get_async_connection())
            .await
            .expect("a refusal is prompt")
            .is_err()
    };
    let port = cluster.ports()[0];
    assert!(
        refused(format!("rediss://:wrong-password@127.0.0.1:{port}")).await,
        "a wrong password was accepted"
    );
    // The default roots do not hold the test's CA (this process has no SSL_CERT_FILE).
    assert!(
        refused(format!("rediss://:cluster-test-password@127.0.0.1:{port}")).await,
        "an unknown CA's certificate was accepted"
    );
    drop(cluster);
    let _ = std::fs::remove_dir_all(&certs);
}
