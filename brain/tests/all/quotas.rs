//! Team quotas (SPEC T2, E2) through real turns, over real Postgres and Redis: refusals
//! before spend with their codes and headers, token budgets that concurrent turns overshoot
//! by at most one reservation, the Postgres side when Redis is unreachable, the session
//! path's refusal as a tool error, and the quota API.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use crate::common::error_code;
use crate::common::replies::text;
use crate::common::{TestApp, read_stream, streamed_text};
use futures_util::future::join_all;
use protocol::ui::UiChunk;
use scripted_provider::{Reply, ToolCall};
use serde_json::{Value, json};

/// Small windows, so a turn's reservation is a few hundred tokens.
fn small_context(c: &mut engine::config::Config) {
    c.context_tokens = 100;
    c.max_output_tokens = 50;
}

async fn put_quotas(app: &TestApp, body: Value) -> reqwest::Response {
    app.auth(app.http.put(format!("{}/v1/quotas", app.url)))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn quotas(app: &TestApp) -> Value {
    let response = app.get("/v1/quotas").await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn billed_tokens(app: &TestApp) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT coalesce(sum(input_tokens + output_tokens), 0)::int8 FROM billing_events \
         WHERE kind = 'model_call'",
    )
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    n
}

async fn turn_rows(app: &TestApp) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM turns")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    n
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn turns_per_minute_refuses_the_next_turn_before_anything_is_written() {
    let app = TestApp::start().await;
    assert_eq!(
        put_quotas(&app, json!({"turns_per_minute": 2}))
            .await
            .status(),
        200
    );
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    for n in 0..2 {
        app.provider.push(text("ok"));
        let response = app
            .send(&chat, &json!({"content": format!("turn {n}")}))
            .await;
        assert_eq!(response.status(), 200);
        // A successful turn tells the client how much is left.
        assert_eq!(
            header(&response, "ratelimit-policy"),
            "\"turns_per_minute\";q=2;w=60"
        );
        let left = header(&response, "ratelimit").to_owned();
        assert!(
            left.starts_with(&format!("\"turns_per_minute\";r={};t=", 1 - n)),
            "{left}"
        );
        read_stream(response).await;
        app.settled().await;
    }
    let requests = app.provider.requests().len();
    let rows = turn_rows(&app).await;
    let response = app.send(&chat, &json!({"content": "one too many"})).await;
    assert_eq!(response.status(), 429);
    let retry: u64 = header(&response, "retry-after").parse().unwrap();
    assert!((1..=60).contains(&retry), "retry after {retry}");
    assert_eq!(
        header(&response, "ratelimit-policy"),
        "\"turns_per_minute\";q=2;w=60"
    );
    assert!(header(&response, "ratelimit").starts_with("\"turns_per_minute\";r=0;t="));
    assert_eq!(error_code(response).await.1, "quota_exceeded");
    assert_eq!(app.provider.requests().len(), requests, "no model call");
    assert_eq!(turn_rows(&app).await, rows, "no turn row");
    assert_eq!(app.messages(&chat).await.len(), 4, "no user message");
    assert!(
        app.metrics()
            .await
            .contains("brain_quota_refusals_total{quota=\"turns_per_minute\"} 1")
    );
}

/// T12's lookup runs beside the admission: a retry that finds its agent idle is admitted
/// before its earlier turn answers it, and that admission must leave no trace.
#[tokio::test]
async fn a_retried_message_id_is_answered_without_counting_as_a_turn_of_the_minute() {
    let app = TestApp::start().await;
    put_quotas(&app, json!({"turns_per_minute": 2})).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(text("first answer"));
    let body = json!({"content": "hi", "message_id": "once"});
    read_stream(app.send(&chat, &body).await).await;
    app.settled().await;
    for _ in 0..2 {
        let again = app.send(&chat, &body).await;
        assert_eq!(again.status(), 200);
        let (chunks, done) = read_stream(again).await;
        assert!(done);
        assert_eq!(streamed_text(&chunks), "first answer");
    }
    assert_eq!(app.provider.requests().len(), 1, "the model ran once");
    // The minute's second turn is still there to take, and only it.
    app.provider.push(text("second answer"));
    let second = app.send(&chat, &json!({"content": "next"})).await;
    assert_eq!(second.status(), 200);
    read_stream(second).await;
    app.settled().await;
    let refused = app.send(&chat, &json!({"content": "one too many"})).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(turn_rows(&app).await, 2);
}

#[tokio::test]
async fn concurrent_turns_refuses_a_second_agent_while_the_first_runs() {
    let app = TestApp::start().await;
    put_quotas(&app, json!({"concurrent_turns": 1})).await;
    let (_, first) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (_, second) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(Reply::Text {
        deltas: vec!["slow ".into(); 20],
        delay: Duration::from_millis(50),
    });
    let running = app.send(&first, &json!({"content": "long"})).await;
    assert_eq!(running.status(), 200);
    let refused = app.send(&second, &json!({"content": "meanwhile"})).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "retry-after"), "1");
    assert_eq!(error_code(refused).await.1, "quota_exceeded");
    read_stream(running).await;
    app.settled().await;
    // The first turn's end gave its place back.
    app.provider.push(text("now"));
    let after = app.send(&second, &json!({"content": "now?"})).await;
    assert_eq!(after.status(), 200);
    read_stream(after).await;
}

/// E2: 50 turns of one team at once (50 agents, since an agent runs one turn at a time)
/// against a budget of a few turns. Each admitted turn reserves before its call, so the
/// budget is overshot by at most one reservation; then settling on the billed tokens lets
/// turns run until what was billed reaches the budget.
#[tokio::test]
async fn fifty_concurrent_turns_overshoot_a_token_budget_by_at_most_one_reservation() {
    // A window wide enough that no chat folds its history here: a fold's summary call is
    // billed and counted, but it is no turn's reservation.
    // Pinned, so that the turns' day is one day however long they run.
    let app = TestApp::start_with(|c| {
        c.context_tokens = 3000;
        c.max_output_tokens = 50;
        c.clock = common::pinned_clock();
    })
    .await;
    let mut chats = Vec::new();
    for _ in 0..50 {
        chats.push(app.agent_and_chat("openai/gpt-test", &[]).await.1);
    }
    // The reservation of one turn here: prompt + summary + message + window + output cap,
    // as the brain estimates them ("You are terse." and "go" are a few tokens each).
    let reservation: i64 = 3000 + 50 + 3 * 4 + 5;
    let budget = 3 * reservation;
    put_quotas(&app, json!({"tokens_per_day": budget})).await;
    // A thousand output tokens an answer (the scripted model ignores the output cap, as
    // a real one would not), so a few turns spend the budget. The answer takes long
    // enough that no turn settles (giving back its reservation) before all 50 were
    // admitted or refused, even on a loaded machine.
    let long = || Reply::Text {
        deltas: vec!["x".repeat(4000)],
        delay: Duration::from_millis(2000),
    };
    for _ in 0..50 {
        app.provider.push(long());
    }
    let sends = chats.iter().map(|chat| async {
        let response = app.send(chat, &json!({"content": "go"})).await;
        let status = response.status().as_u16();
        if status == 200 {
            read_stream(response).await;
        } else {
            assert_eq!(status, 402);
            assert_eq!(error_code(response).await.1, "quota_exhausted");
        }
        status
    });
    let statuses = join_all(sends).await;
    app.settled().await;
    let admitted = statuses.iter().filter(|s| **s == 200).count() as i64;
    let refused = statuses.iter().filter(|s| **s == 402).count() as i64;
    assert_eq!(admitted + refused, 50);
    // Reservations are at least `reservation` each and admitted while anything is left.
    assert!(admitted >= 1, "nothing ran");
    assert!(
        admitted <= budget / reservation + 1,
        "{admitted} turns admitted against {budget} tokens at {reservation} each"
    );
    assert_eq!(
        turn_rows(&app).await,
        admitted,
        "refused turns wrote nothing"
    );
    let billed = billed_tokens(&app).await;
    assert!(
        billed <= budget + reservation,
        "billed {billed} of {budget}"
    );
    println!("concurrent phase: {admitted} admitted, billed {billed} of a {budget} budget");

    // One at a time from here: settled reservations gave back what was not billed, so
    // turns run until the billed total reaches the budget, then are refused.
    let mut after = 0;
    for chat in &chats {
        app.provider.push(long());
        let response = app.send(chat, &json!({"content": "go"})).await;
        if response.status() == 402 {
            break;
        }
        assert_eq!(response.status(), 200);
        read_stream(response).await;
        app.settled().await;
        after += 1;
    }
    let billed = billed_tokens(&app).await;
    assert!(after >= 1, "settling gave nothing back");
    assert!(
        billed >= budget,
        "refused before the budget was billed: {billed} of {budget}"
    );
    assert!(
        billed <= budget + reservation,
        "overshoot {} over one reservation {reservation}",
        billed - budget
    );
    println!(
        "sequential phase: {after} more, billed {billed} of {budget}: overshoot {} tokens, one reservation is {reservation}",
        billed - budget
    );
    let view = quotas(&app).await;
    assert_eq!(view["limits"]["tokens_per_day"], budget);
    assert_eq!(view["used"]["tokens_per_day"], billed);
}

/// A budget spent by the first model call of a turn refuses the next one: the turn ends
/// `failed` with `quota_exhausted`, after the output the client already saw.
#[tokio::test]
async fn a_budget_spent_mid_turn_refuses_the_next_model_call() {
    // Pinned at noon: both model calls count in one day, which ends in twelve hours.
    let app = TestApp::start_with(|c| {
        small_context(c);
        c.clock = common::pinned_clock();
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // Any budget under the first call's reservation admits the turn and leaves nothing.
    put_quotas(&app, json!({"tokens_per_day": 10})).await;
    app.provider.push(Reply::ToolCalls {
        text: Some("Let me look.".into()),
        calls: vec![ToolCall {
            id: "c1".into(),
            name: "memory_search".into(),
            arguments: json!({"query": "anything"}).to_string(),
        }],
        fragment: 8,
    });
    let response = app.send(&chat, &json!({"content": "search"})).await;
    assert_eq!(response.status(), 200);
    let (chunks, _) = read_stream(response).await;
    assert_eq!(streamed_text(&chunks), "Let me look.");
    let error = chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::Error { error_text } => Some(error_text.clone()),
            _ => None,
        })
        .expect("an error chunk");
    assert!(error.contains("tokens_per_day"), "{error}");
    assert_eq!(
        app.provider.requests().len(),
        1,
        "the second call was not made"
    );
    assert_eq!(
        app.settled().await,
        vec![("failed".to_owned(), Some("quota_exhausted".to_owned()))]
    );
    // The next turn is refused at intake with the reset time.
    let refused = app.send(&chat, &json!({"content": "again"})).await;
    assert_eq!(refused.status(), 402);
    assert_eq!(header(&refused, "retry-after"), "43200");
    assert_eq!(
        header(&refused, "ratelimit"),
        "\"tokens_per_day\";r=0;t=43200"
    );
}

/// Redis unreachable: the hold is skipped (best effort, as before) but quotas are not;
/// they are decided from Postgres.
#[tokio::test]
async fn without_redis_quotas_are_enforced_from_postgres() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let app = TestApp::start_with(|c| {
        c.redis_url = format!("redis://127.0.0.1:{port}/");
        c.quotas.turns_per_minute = Some(1);
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(text("ok"));
    let first = app.send(&chat, &json!({"content": "one"})).await;
    assert_eq!(first.status(), 200);
    assert!(header(&first, "ratelimit").starts_with("\"turns_per_minute\";r=0;"));
    read_stream(first).await;
    app.settled().await;
    let second = app.send(&chat, &json!({"content": "two"})).await;
    assert_eq!(second.status(), 429);
    assert_eq!(error_code(second).await.1, "quota_exceeded");
    assert_eq!(app.provider.requests().len(), 1);
    assert_eq!(turn_rows(&app).await, 1);
}

#[tokio::test]
async fn the_quota_api_merges_overrides_over_the_defaults() {
    let app = TestApp::start_with(|c| {
        c.quotas.tokens_per_day = Some(1_000_000);
        c.quotas.concurrent_sessions = Some(4);
    })
    .await;
    let view = quotas(&app).await;
    assert_eq!(
        view["limits"],
        json!({"tokens_per_day": 1_000_000, "tokens_per_month": null, "turns_per_minute": null,
               "concurrent_turns": null, "concurrent_sessions": 4, "worker_seconds_per_day": null})
    );
    assert_eq!(view["used"]["tokens_per_day"], 0);
    assert!(
        view["resets"]["tokens_per_day"]
            .as_str()
            .unwrap()
            .ends_with("T00:00:00Z")
    );
    let put = put_quotas(
        &app,
        json!({"tokens_per_day": null, "turns_per_minute": 30}),
    )
    .await;
    assert_eq!(put.status(), 200);
    let view: Value = put.json().await.unwrap();
    assert_eq!(
        view["limits"]["tokens_per_day"],
        Value::Null,
        "null is unlimited"
    );
    assert_eq!(view["limits"]["turns_per_minute"], 30);
    assert_eq!(
        view["limits"]["concurrent_sessions"], 4,
        "absent is left as it was"
    );
    let view = quotas(&app).await;
    assert_eq!(view["limits"]["turns_per_minute"], 30);
    for bad in [
        json!({"turns": 3}),
        json!({"turns_per_minute": -1}),
        json!({"turns_per_minute": "many"}),
        json!({"turns_per_minute": 1u64 << 60}),
    ] {
        let response = put_quotas(&app, bad.clone()).await;
        assert_eq!(response.status(), 400, "{bad}");
        assert_eq!(error_code(response).await.1, "invalid_request");
    }
    assert_eq!(quotas(&app).await["limits"]["turns_per_minute"], 30);
    // Another team sees its own defaults, not this team's overrides.
    let other = app.store.create_team("other").await.unwrap();
    let theirs: Value = app
        .http
        .get(format!("{}/v1/quotas", app.url))
        .bearer_auth(&other.api_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(theirs["limits"]["tokens_per_day"], 1_000_000);
    assert_eq!(theirs["limits"]["turns_per_minute"], Value::Null);
}

/// A worker session the team may not start is a tool error the model reads; the turn goes
/// on, and nothing is provisioned.
#[tokio::test]
async fn a_refused_worker_session_is_a_tool_error_and_the_turn_goes_on() {
    let app = TestApp::start_with(|c| c.quotas.concurrent_sessions = Some(0)).await;
    let agent: Value = app
        .post_json(
            "/v1/agents",
            &json!({"name": "hands", "system_prompt": "Use your shell.", "model": "openai/gpt-test",
                    "runtime_profile": "light"}),
        )
        .await
        .json()
        .await
        .unwrap();
    let chat: Value = app
        .post_json(
            &format!("/v1/agents/{}/chats", agent["id"].as_str().unwrap()),
            &json!({}),
        )
        .await
        .json()
        .await
        .unwrap();
    let chat = chat["id"].as_str().unwrap();
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "c1".into(),
            name: "shell".into(),
            arguments: json!({"command": "echo hi"}).to_string(),
        }],
        fragment: 8,
    });
    app.provider.push(text("No shell for now."));
    let response = app.send(chat, &json!({"content": "run it"})).await;
    assert_eq!(response.status(), 200);
    let (chunks, _) = read_stream(response).await;
    let tool_error = chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::ToolOutputError { error_text, .. } => Some(error_text.clone()),
            _ => None,
        })
        .expect("the shell call failed");
    assert!(
        tool_error.contains("concurrent_sessions = 0"),
        "{tool_error}"
    );
    assert_eq!(streamed_text(&chunks), "No shell for now.");
    assert_eq!(app.settled().await, vec![("completed".to_owned(), None)]);
    // The model read the refusal in its next request.
    let second = app.provider.requests()[1].body.to_string();
    assert!(second.contains("concurrent_sessions"), "{second}");
    let (sessions,): (i64,) = sqlx::query_as("SELECT count(*) FROM agent_runtime_sessions")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(sessions, 0, "nothing was provisioned");
    assert!(
        app.metrics()
            .await
            .contains("brain_quota_refusals_total{quota=\"concurrent_sessions\"} 1")
    );
}

/// Today's worker-seconds, as billed, refuse a new worker once the day's budget is spent.
#[tokio::test]
async fn spent_worker_seconds_refuse_a_new_worker_until_the_day_ends() {
    let clock = common::pinned_clock();
    let app = TestApp::start_with(|c| {
        c.quotas.worker_seconds_per_day = Some(50);
        c.clock = clock.clone();
    })
    .await;
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    sqlx::query(
        "INSERT INTO billing_events (id, team_id, agent_id, event_key, kind, seconds) \
         VALUES (gen_random_uuid(), $1, $2::uuid, 'test:ws', 'worker_seconds', 50.5)",
    )
    .bind(app.team.0)
    .bind(&agent)
    .execute(app.store.pool())
    .await
    .unwrap();
    let limits = engine::quota::Limits {
        worker_seconds_per_day: Some(50),
        ..Default::default()
    };
    let checker = engine::quota::Quotas::new(app.store.clone(), limits).with_clock(clock.clone());
    let refusal = checker
        .admit_session(app.team, None)
        .await
        .unwrap()
        .expect("refused");
    assert_eq!(refusal.field.name(), "worker_seconds_per_day");
    assert_eq!(refusal.code(), protocol::ErrorCode::QuotaExhausted);
    assert_eq!(
        refusal.retry_after,
        Duration::from_secs(12 * 3600),
        "noon to midnight"
    );
    assert_eq!(quotas(&app).await["used"]["worker_seconds_per_day"], 51);
    // A later day (after today's, whose rows these are) counts none of them.
    clock.set(clock.now() + chrono::TimeDelta::days(2));
    assert!(
        checker
            .admit_session(app.team, None)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(quotas(&app).await["used"]["worker_seconds_per_day"], 0);
}

mod settle {
    //! Settling a turn adds its billed tokens to the budget counters exactly
    //! once, keyed by the turn, whatever became of its reservation and however a rebuild
    //! of the counters from billing events interleaves with its end.

    use std::time::Duration;

    use engine::clock::Clock;
    use engine::hold::{Admitted, Billed, HoldConfig, HoldGuard, Holds, TurnAdmission};
    use engine::metrics::Metrics;
    use engine::quota::{Limits, Periods, Quotas};
    use protocol::{AgentId, TeamId, TurnId};
    use redis::AsyncCommands;
    use store::Store;

    struct Counters {
        store: Store,
        quotas: Quotas,
        holds: Holds,
        team: TeamId,
        /// The end user whose turns these are (L4), with a day budget of its own.
        user: Option<&'static str>,
        redis: redis::aio::MultiplexedConnection,
        /// Pinned: the billing moved back below stays in the counters' day.
        clock: Clock,
    }

    impl Counters {
        async fn start(config: HoldConfig) -> Self {
            let (store, _) = super::common::fresh_store().await;
            let team = store.create_team("settle").await.unwrap().team_id;
            let budget = Limits {
                tokens_per_day: Some(1_000_000),
                ..Limits::default()
            };
            let url = super::common::manager::redis_url();
            let client = redis::Client::open(url.as_str()).unwrap();
            let redis = client.get_multiplexed_async_connection().await.unwrap();
            let clock = super::common::pinned_clock();
            Self {
                quotas: Quotas::new(store.clone(), budget).with_clock(clock.clone()),
                holds: Holds::new(
                    engine::redis::Client::Node(Box::new(client)),
                    protocol::ReplicaId::new(),
                    HoldConfig {
                        clock: clock.clone(),
                        ..config
                    },
                    Metrics::new(false).unwrap(),
                ),
                clock,
                store,
                team,
                user: None,
                redis,
            }
        }

        /// `start`, the turns being `user`'s, which has a day budget of its own.
        async fn for_user(config: HoldConfig, user: &'static str) -> Self {
            let mut counters = Self::start(config).await;
            counters
                .store
                .merge_quota_overrides(
                    counters.team,
                    &serde_json::json!({}),
                    &serde_json::json!({"tokens_per_day": 1_000_000}),
                    &store::Actor::operator(None),
                )
                .await
                .unwrap();
            counters.user = Some(user);
            counters
        }

        /// A counted turn of a fresh agent.
        async fn admit(&self, turn: TurnId) -> HoldGuard {
            let admission = TurnAdmission {
                team: self.team,
                agent: AgentId::new(),
                turn,
                user: self.user,
                reservation: 100,
            };
            match self.holds.admit(&self.quotas, admission).await.unwrap() {
                Admitted::Held { guard, .. } => guard,
                other => panic!("expected the hold, got {other:?} (is Redis running?)"),
            }
        }

        /// The tokens the day's counter holds (what admissions are decided on).
        async fn day(&self) -> i64 {
            let key = format!(
                "quota:{{{}}}:tokens:day:{}",
                self.team,
                Periods::now(&self.clock).day_tag()
            );
            let value: Option<i64> = self.redis.clone().get(key).await.unwrap();
            value.expect("the day's counter exists")
        }

        /// The tokens the user's day counter holds.
        async fn user_day(&self) -> i64 {
            let user = self.user.unwrap();
            let key = format!(
                "quota:{{{}}}:user:{}:{user}:tokens:day:{}",
                self.team,
                user.len(),
                Periods::now(&self.clock).day_tag()
            );
            let value: Option<i64> = self.redis.clone().get(key).await.unwrap();
            value.expect("the user's day counter exists")
        }

        /// A turn's end written to Postgres: its model call billed `tokens`. What its
        /// settlement carries.
        async fn bill(&self, turn: TurnId, tokens: u64) -> Billed {
            let (at,): (chrono::DateTime<chrono::Utc>,) = sqlx::query_as(
                "INSERT INTO billing_events \
                   (id, team_id, agent_id, turn_id, event_key, kind, model, input_tokens, \
                    output_tokens, user_id) \
                 VALUES ($1, $2, $3, $4, $5, 'model_call', 'openai/x', $6, 0, $7) \
                 RETURNING created_at",
            )
            .bind(uuid::Uuid::now_v7())
            .bind(self.team.0)
            .bind(AgentId::new().0)
            .bind(turn.0)
            .bind(format!("test:{turn}"))
            .bind(tokens as i64)
            .bind(self.user)
            .fetch_one(self.store.pool())
            .await
            .unwrap();
            Billed {
                tokens,
                at: Some(at),
                unstarted: false,
            }
        }
    }

    #[tokio::test]
    async fn a_turn_whose_reservation_was_reaped_still_counts_its_tokens_once() {
        // A short ceiling: the turn outlives its hold, and the next admission reaps its
        // reservation as a dead replica's.
        let counters = Counters::start(HoldConfig {
            ttl: Duration::from_millis(300),
            max_total: Duration::from_millis(300),
            ..HoldConfig::default()
        })
        .await;
        let turn = TurnId::new();
        let long = counters.admit(turn).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let next = counters.admit(TurnId::new()).await;
        // Its billing events were not written (the wrap-up could not reach Postgres).
        let billed = |tokens| Billed {
            tokens,
            at: None,
            unstarted: false,
        };
        long.release_billed(billed(1000)).await;
        assert_eq!(
            counters.day().await,
            1000,
            "the reaped turn's tokens were lost"
        );
        // Its settlement runs again (a retried release whose first answer was lost).
        counters
            .admit(turn)
            .await
            .release_billed(billed(1000))
            .await;
        assert_eq!(
            counters.day().await,
            1000,
            "a second settlement added them again"
        );
        next.release_billed(billed(500)).await;
        assert_eq!(counters.day().await, 1500);
    }

    #[tokio::test]
    async fn a_rebuild_racing_turn_ends_neither_loses_nor_doubles_their_tokens() {
        let counters = Counters::start(HoldConfig::default()).await;
        // Billed long before: the rebuild reads it from Postgres.
        let old = TurnId::new();
        counters.bill(old, 50).await;
        sqlx::query("UPDATE billing_events SET created_at = now() - interval '5 minutes'")
            .execute(counters.store.pool())
            .await
            .unwrap();

        // A turn's end lands in Postgres while the counters are due for their rebuild, and
        // another admission rebuilds them before the turn settles.
        let ending = TurnId::new();
        let guard = counters.admit(ending).await;
        counters.holds.forget_limits(counters.team).await.unwrap();
        let billed = counters.bill(ending, 700).await;
        let other = counters.admit(TurnId::new()).await;
        guard.release_billed(billed).await;
        assert_eq!(
            counters.day().await,
            750,
            "the turn's tokens were counted twice"
        );

        // A turn that settles while the counters are missing, rebuilt afterwards.
        let ending = TurnId::new();
        let guard = counters.admit(ending).await;
        counters.holds.forget_limits(counters.team).await.unwrap();
        let billed = counters.bill(ending, 300).await;
        guard.release_billed(billed).await;
        let last = counters.admit(TurnId::new()).await;
        assert_eq!(counters.day().await, 1050, "the turn's tokens were lost");
        other.release().await;
        last.release().await;
        assert_eq!(counters.day().await, 1050);
    }

    /// L4: a user's counters settle like the team's, beside them in the same script: once
    /// per turn, however a rebuild of the user's counters interleaves with the turn's end.
    #[tokio::test]
    async fn a_users_counters_count_its_turns_tokens_once_beside_the_teams() {
        let counters = Counters::for_user(HoldConfig::default(), "alice").await;
        let old = TurnId::new();
        counters.bill(old, 50).await;
        sqlx::query("UPDATE billing_events SET created_at = now() - interval '5 minutes'")
            .execute(counters.store.pool())
            .await
            .unwrap();
        let ending = TurnId::new();
        let guard = counters.admit(ending).await;
        counters
            .holds
            .forget_user(counters.team, "alice")
            .await
            .unwrap();
        let billed = counters.bill(ending, 700).await;
        // This admission rebuilds the user's counters: the turn's 700 are in Postgres but
        // younger than the rebuild's cutoff, so the settlement below adds them.
        let other = counters.admit(TurnId::new()).await;
        guard.release_billed(billed).await;
        assert_eq!(counters.user_day().await, 750, "the user's counter");
        assert_eq!(counters.day().await, 750, "the team's counter");
        // A retried settlement adds nothing at either level.
        counters.admit(ending).await.release_billed(billed).await;
        assert_eq!(counters.user_day().await, 750);
        assert_eq!(counters.day().await, 750);
        other.release().await;
        assert_eq!(counters.user_day().await, 750);
    }
}
