//! The per-agent turn hold against the real Redis (SPEC T9): one turn per agent, a fast
//! busy answer, token-checked release and extension, best effort when Redis is down.
//!
//! Every test uses fresh agent ids, so tests never share a hold when run in parallel.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use engine::hold::{Acquired, HoldConfig, HoldGuard, Holds};
use engine::metrics::Metrics;
use protocol::{AgentId, TeamId, TurnId};

/// The team of every hold here: each test takes holds of agents of its own, and the key
/// of an agent's hold is named by its team (its hash tag).
const TEAM: TeamId = TeamId(uuid::Uuid::from_u128(
    0x0190_f5c2_7d1e_7a3b_9c4d_5e6f_7081_9203,
));

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

fn holds_at(url: &str, config: HoldConfig) -> (Holds, Metrics) {
    let metrics = Metrics::new(false).unwrap();
    let client = engine::redis::Client::open(url, None).unwrap();
    (
        Holds::new(client, protocol::ReplicaId::new(), config, metrics.clone()),
        metrics,
    )
}

fn holds(config: HoldConfig) -> Holds {
    holds_at(&redis_url(), config).0
}

#[track_caller]
fn held(acquired: Acquired) -> HoldGuard {
    match acquired {
        Acquired::Held(guard) => guard,
        other => panic!("expected the hold, got {other:?} (is Redis running?)"),
    }
}

#[track_caller]
fn busy(acquired: Acquired) -> TurnId {
    match acquired {
        Acquired::Busy { running } => running,
        other => panic!("expected busy, got {other:?}"),
    }
}

/// Acquires the agent's hold for `turn` once it is free (released, or expired), within
/// ten seconds.
async fn until_held(holds: &Holds, agent: AgentId, turn: TurnId) -> HoldGuard {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match holds.acquire(TEAM, agent, turn).await {
            Acquired::Held(guard) => return guard,
            Acquired::Busy { .. } if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => panic!("the hold was never free: {other:?}"),
        }
    }
}

#[test]
fn defaults_follow_the_spec() {
    let config = HoldConfig::default();
    assert_eq!(config.ttl, Duration::from_secs(300));
    assert_eq!(config.extend_every, Duration::from_secs(100));
    assert_eq!(config.max_total, Duration::from_secs(3600));
    assert_eq!(config.op_timeout, Duration::from_millis(250));
}

#[tokio::test]
async fn a_second_turn_is_refused_with_the_running_turn() {
    let holds = holds(HoldConfig::default());
    let agent = AgentId::new();
    let first = TurnId::new();
    let guard = held(holds.acquire(TEAM, agent, first).await);

    // How fast the refusal comes is the bench's `busy` scenario's to measure.
    for _ in 0..20 {
        let running = busy(holds.acquire(TEAM, agent, TurnId::new()).await);
        assert_eq!(running, first);
    }

    // Another agent is unaffected.
    held(holds.acquire(TEAM, AgentId::new(), TurnId::new()).await)
        .release()
        .await;
    guard.release().await;
}

#[tokio::test]
async fn release_frees_the_agent() {
    let holds = holds(HoldConfig::default());
    let agent = AgentId::new();
    held(holds.acquire(TEAM, agent, TurnId::new()).await)
        .release()
        .await;
    held(holds.acquire(TEAM, agent, TurnId::new()).await)
        .release()
        .await;
}

#[tokio::test]
async fn a_turn_that_outlived_its_hold_cannot_free_the_next_one() {
    // The first hold expires (no extension before it does) and a second turn takes the
    // agent; the first turn's late release must leave the second's hold alone.
    let short = holds(HoldConfig {
        ttl: Duration::from_millis(150),
        extend_every: Duration::from_secs(30),
        max_total: Duration::from_secs(60),
        ..HoldConfig::default()
    });
    let holds = holds(HoldConfig::default());
    let agent = AgentId::new();
    let stale = held(short.acquire(TEAM, agent, TurnId::new()).await);
    let second = TurnId::new();
    let current = until_held(&holds, agent, second).await;
    stale.release().await;
    assert_eq!(
        busy(holds.acquire(TEAM, agent, TurnId::new()).await),
        second
    );
    current.release().await;
}

#[tokio::test]
async fn the_hold_is_extended_while_the_turn_runs_but_never_past_max_total() {
    let holds = holds(HoldConfig {
        ttl: Duration::from_millis(300),
        extend_every: Duration::from_millis(100),
        max_total: Duration::from_secs(1),
        ..HoldConfig::default()
    });
    let agent = AgentId::new();
    let turn = TurnId::new();
    let started = Instant::now();
    let guard = held(holds.acquire(TEAM, agent, turn).await);

    // Twice the ttl: only the extensions keep it. The pause is what is tested (the hold
    // outlives its ttl), not a wait for something to happen.
    tokio::time::sleep_until((started + Duration::from_millis(600)).into()).await;
    assert_eq!(busy(holds.acquire(TEAM, agent, TurnId::new()).await), turn);

    // Extension stops at max_total (1 s): the hold expires on its own, the guard alive.
    until_held(&holds, agent, TurnId::new())
        .await
        .release()
        .await;
    guard.release().await;
}

#[tokio::test]
async fn redis_down_means_no_hold_quickly_and_counted() {
    let (holds, metrics) = holds_at("redis://127.0.0.1:1", HoldConfig::default());
    // Bounded: a refused connection is an answer, not something to wait out (how long it
    // takes is the bench's to measure).
    let acquired = tokio::time::timeout(
        Duration::from_secs(5),
        holds.acquire(TEAM, AgentId::new(), TurnId::new()),
    )
    .await
    .expect("no hold with Redis down is answered, not waited for");
    assert!(
        matches!(acquired, Acquired::Unavailable),
        "got {acquired:?}"
    );
    assert_eq!(metrics.hold_unavailable.get(), 1);
    let rendered = metrics.render();
    assert!(
        rendered.contains("brain_hold_unavailable_total 1"),
        "{rendered}"
    );
}

#[tokio::test]
async fn dropping_a_guard_releases_it() {
    let holds = holds(HoldConfig::default());
    let agent = AgentId::new();
    drop(held(holds.acquire(TEAM, agent, TurnId::new()).await));
    // Well within the default ttl (five minutes): only the drop frees it.
    until_held(&holds, agent, TurnId::new())
        .await
        .release()
        .await;
}

#[tokio::test]
async fn a_redis_that_never_answers_costs_at_most_op_timeout() {
    // Accepts connections and never replies.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let (holds, metrics) = holds_at(
        &url,
        HoldConfig {
            op_timeout: Duration::from_millis(100),
            ..HoldConfig::default()
        },
    );
    for expected in 1..=2 {
        // A Redis that never answers would hold the acquire forever without its bound.
        let acquired = tokio::time::timeout(
            Duration::from_secs(5),
            holds.acquire(TEAM, AgentId::new(), TurnId::new()),
        )
        .await
        .expect("the op timeout bounds the acquire");
        assert!(
            matches!(acquired, Acquired::Unavailable),
            "got {acquired:?}"
        );
        assert_eq!(metrics.hold_unavailable.get(), expected);
    }
}
