//! `GET /v1/usage` (SPEC E1): billing events summed per day, agent and model, for the
//! caller's team only, and the validation of its query string. The arithmetic runs over
//! events written here directly; one turn shows a real model call reaching the report.
//! Worker-seconds events written by the runtime-manager are tested in `workers.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::{TestApp, read_stream};
use protocol::TeamId;
use scripted_provider::Reply;
use serde_json::{Value, json};
use uuid::Uuid;

struct Event<'a> {
    agent: &'a str,
    at: &'a str,
    model: Option<&'a str>,
    tokens: (i64, i64),
    seconds: Option<f64>,
}

/// A model call (`model` set) or worker-seconds event, as its writers would store it.
async fn insert(app: &TestApp, team: TeamId, event: Event<'_>) {
    let kind = if event.model.is_some() {
        "model_call"
    } else {
        "worker_seconds"
    };
    let tokens = event.model.map(|_| event.tokens);
    sqlx::query(
        "INSERT INTO billing_events \
           (id, team_id, agent_id, event_key, kind, model, input_tokens, output_tokens, seconds, created_at) \
         VALUES ($1, $2, $3::uuid, $4, $5, $6, $7, $8, $9, $10::timestamptz)",
    )
    .bind(Uuid::now_v7())
    .bind(team.0)
    .bind(event.agent)
    .bind(format!("test:{}", Uuid::new_v4()))
    .bind(kind)
    .bind(event.model)
    .bind(tokens.map(|t| t.0))
    .bind(tokens.map(|t| t.1))
    .bind(event.seconds)
    .bind(event.at)
    .execute(app.store.pool())
    .await
    .unwrap();
}

fn call<'a>(agent: &'a str, at: &'a str, model: &'a str, tokens: (i64, i64)) -> Event<'a> {
    Event {
        agent,
        at,
        model: Some(model),
        tokens,
        seconds: None,
    }
}

fn worker<'a>(agent: &'a str, at: &'a str, seconds: f64) -> Event<'a> {
    Event {
        agent,
        at,
        model: None,
        tokens: (0, 0),
        seconds: Some(seconds),
    }
}

async fn usage_as(app: &TestApp, key: &str, query: &str) -> (u16, Value) {
    let response = app
        .http
        .get(format!("{}/v1/usage{query}", app.url))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

async fn usage(app: &TestApp, query: &str) -> Value {
    let (status, body) = usage_as(app, &app.key, query).await;
    assert_eq!(status, 200, "{body}");
    body
}

fn sums(tokens_in: i64, tokens_out: i64, model_calls: i64, worker_seconds: f64) -> Value {
    // The models billed here have no catalog price (`models.rs` tests priced ones): a
    // group with model calls has no known cost, one without costs nothing.
    let cost = if model_calls > 0 {
        Value::Null
    } else {
        json!(0.0)
    };
    json!({"tokens_in": tokens_in, "tokens_out": tokens_out, "model_calls": model_calls,
           "worker_seconds": worker_seconds, "cost": cost})
}

/// A row without its key (and agent name), for comparing its sums.
fn sums_of(row: &Value) -> Value {
    let mut row = row.clone();
    let object = row.as_object_mut().unwrap();
    object.remove("key");
    object.remove("agent_name");
    row
}

async fn agent(app: &TestApp, name: &str) -> String {
    let created: Value = app
        .post_json(
            "/v1/agents",
            &json!({"name": name, "system_prompt": "p", "model": "openai/gpt-test"}),
        )
        .await
        .json()
        .await
        .unwrap();
    created["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn usage_is_summed_per_day_agent_and_model_over_the_range() {
    let app = TestApp::start().await;
    let a = agent(&app, "alpha").await;
    let b = agent(&app, "beta").await;
    // Billing events outlive a deleted agent: its row has no name.
    let gone = Uuid::new_v4().to_string();
    let team = app.team;
    for event in [
        call(&a, "2026-05-01T10:00:00Z", "openai/m1", (100, 10)),
        call(&a, "2026-05-01T23:59:59.999Z", "anthropic/m2", (50, 5)),
        worker(&a, "2026-05-01T12:00:00Z", 60.0),
        // `from` is inclusive.
        worker(&a, "2026-05-01T00:00:00Z", 0.25),
        call(&b, "2026-05-02T00:00:00Z", "openai/m1", (7, 3)),
        worker(&b, "2026-05-02T01:00:00Z", 12.5),
        call(&gone, "2026-05-02T08:00:00+02:00", "openai/m1", (1, 1)),
        // Outside: `to` is exclusive, and before `from`.
        call(&b, "2026-05-03T00:00:00Z", "openai/m1", (1000, 1000)),
        worker(&a, "2026-04-30T23:59:59.999Z", 60.0),
    ] {
        insert(&app, team, event).await;
    }
    let range = "from=2026-05-01&to=2026-05-03T00:00:00Z";
    let totals = sums(158, 19, 4, 72.75);

    let by_day = usage(&app, &format!("?{range}")).await;
    assert_eq!(by_day["group_by"], "day");
    assert_eq!(by_day["from"], "2026-05-01T00:00:00Z");
    assert_eq!(by_day["totals"], totals);
    let rows = by_day["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{by_day}");
    assert_eq!(rows[0]["key"], "2026-05-01");
    assert_eq!(sums_of(&rows[0]), sums(150, 15, 2, 60.25));
    // 08:00+02:00 is 06:00 UTC: days are UTC days.
    assert_eq!(rows[1]["key"], "2026-05-02");
    assert_eq!(sums_of(&rows[1]), sums(8, 4, 2, 12.5));
    assert!(rows.iter().all(|r| r.get("agent_name").is_none()));

    let by_agent = usage(&app, &format!("?{range}&group_by=agent")).await;
    assert_eq!(by_agent["totals"], totals);
    let rows = by_agent["rows"].as_array().unwrap();
    let keys: Vec<&str> = rows.iter().map(|r| r["key"].as_str().unwrap()).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(keys, sorted, "rows are ordered by key");
    let row = |id: &str| rows.iter().find(|r| r["key"] == id).unwrap().clone();
    assert_eq!(row(&a)["agent_name"], "alpha");
    assert_eq!(sums_of(&row(&a)), sums(150, 15, 2, 60.25));
    assert_eq!(row(&b)["agent_name"], "beta");
    assert_eq!(sums_of(&row(&b)), sums(7, 3, 1, 12.5));
    assert_eq!(row(&gone)["agent_name"], Value::Null);
    assert_eq!(sums_of(&row(&gone)), sums(1, 1, 1, 0.0));
    assert_eq!(rows.len(), 3);

    let by_model = usage(&app, &format!("?{range}&group_by=model")).await;
    assert_eq!(by_model["totals"], totals);
    let rows = by_model["rows"].as_array().unwrap();
    let keys: Vec<&Value> = rows.iter().map(|r| &r["key"]).collect();
    // Worker-seconds have no model: their row's key is null, last.
    assert_eq!(
        keys,
        [&json!("anthropic/m2"), &json!("openai/m1"), &Value::Null]
    );
    assert_eq!(sums_of(&rows[0]), sums(50, 5, 1, 0.0));
    assert_eq!(sums_of(&rows[1]), sums(108, 14, 3, 0.0));
    assert_eq!(sums_of(&rows[2]), sums(0, 0, 0, 72.75));

    // An empty range: no rows, zero totals.
    let empty = usage(&app, "?from=2026-05-01&to=2026-05-01").await;
    assert_eq!(empty["rows"], json!([]));
    assert_eq!(empty["totals"], sums(0, 0, 0, 0.0));
}

#[tokio::test]
async fn another_team_sees_none_of_it() {
    let app = TestApp::start().await;
    let a = agent(&app, "alpha").await;
    insert(
        &app,
        app.team,
        call(&a, "2026-05-01T10:00:00Z", "openai/m1", (5, 5)),
    )
    .await;
    insert(&app, app.team, worker(&a, "2026-05-01T10:00:00Z", 30.0)).await;
    let other = app.store.create_team("other team").await.unwrap();
    let theirs = Uuid::new_v4().to_string();
    insert(
        &app,
        other.team_id,
        call(&theirs, "2026-05-01T11:00:00Z", "openai/m1", (2, 1)),
    )
    .await;

    for group in ["day", "agent", "model"] {
        let query = format!("?from=2026-05-01&to=2026-05-02&group_by={group}");
        let (status, body) = usage_as(&app, &other.api_key, &query).await;
        assert_eq!(status, 200);
        assert_eq!(body["totals"], sums(2, 1, 1, 0.0), "{group}: {body}");
        assert_eq!(body["rows"].as_array().unwrap().len(), 1, "{group}: {body}");
        let ours = usage(&app, &query).await;
        assert_eq!(ours["totals"], sums(5, 5, 1, 30.0), "{group}: {ours}");
    }
    let (status, body) = usage_as(&app, "not-a-key", "").await;
    assert_eq!(status, 401, "{body}");
}

#[tokio::test]
async fn usage_defaults_to_the_current_month_and_counts_a_real_turn() {
    let clock = engine::clock::Clock::pinned(chrono::Utc::now());
    let app = TestApp::start_with(|c| c.clock = clock.clone()).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(Reply::Text {
        deltas: vec!["Hello there.".into()],
        delay: Duration::from_millis(1),
    });
    let response = app.send(&chat, &json!({"content": "Say hello"})).await;
    assert_eq!(response.status(), 200);
    read_stream(response).await;
    app.settled().await;
    let (tokens_in, tokens_out, billed_at): (i64, i64, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as(
            "SELECT input_tokens, output_tokens, created_at FROM billing_events \
             WHERE kind = 'model_call'",
        )
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert!(tokens_in > 0 && tokens_out > 0);

    // "Now" just after the turn was billed (`to` is exclusive): in the month and on the
    // day it was billed in, which midnight may have passed since.
    let now = billed_at + chrono::TimeDelta::microseconds(1);
    clock.set(now);
    let by_model = usage(&app, "?group_by=model").await;
    let from: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(by_model["from"].clone()).unwrap();
    assert_eq!(
        from.format("%Y-%m-%d").to_string(),
        now.format("%Y-%m-01").to_string()
    );
    assert_eq!(by_model["totals"], sums(tokens_in, tokens_out, 1, 0.0));
    assert_eq!(
        by_model["rows"],
        json!([{"key": "openai/gpt-test", "tokens_in": tokens_in, "tokens_out": tokens_out,
                "model_calls": 1, "worker_seconds": 0.0, "cost": null}])
    );
    let by_agent = usage(&app, "?group_by=agent").await;
    assert_eq!(by_agent["rows"][0]["key"], agent.as_str());
    assert_eq!(by_agent["rows"][0]["agent_name"], "a");
    let by_day = usage(&app, "").await;
    assert_eq!(
        by_day["rows"][0]["key"],
        now.format("%Y-%m-%d").to_string(),
        "{by_day}"
    );
}

#[tokio::test]
async fn bad_usage_queries_are_invalid_requests_that_say_why() {
    let app = TestApp::start().await;
    for (query, says) in [
        ("?from=yesterday", "from must be an RFC 3339 timestamp"),
        ("?to=2026-02-30", "to must be"),
        // An unencoded '+' arrives as a space.
        ("?from=2026-05-01T00:00:00+02:00", "%2B"),
        ("?from=2026-05-02&to=2026-05-01", "is after"),
        ("?from=2024-01-01&to=2026-01-01", "longer than 400 days"),
        (
            "?group_by=week",
            "group_by must be day, agent, model or user",
        ),
        ("?team=someone-else", "unknown field `team`"),
        ("?group_by=day&group_by=agent", "duplicate field `group_by`"),
    ] {
        let (status, body) = usage_as(&app, &app.key, query).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{query}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{query}: {message}");
    }
    // An encoded offset is fine.
    usage(&app, "?from=2026-05-01T00:00:00%2B02:00&to=2026-05-02").await;
}

/// L3: the groups page by key, `null` last; every page carries the whole range's totals,
/// and a cursor of one grouping is refused by another.
#[tokio::test]
async fn usage_groups_page_by_key_with_the_totals_on_every_page() {
    let app = TestApp::start().await;
    let a = agent(&app, "alpha").await;
    let team = app.team;
    for event in [
        call(&a, "2026-05-01T10:00:00Z", "openai/m1", (1, 1)),
        call(&a, "2026-05-02T10:00:00Z", "openai/m2", (2, 2)),
        call(&a, "2026-05-03T10:00:00Z", "openai/m3", (3, 3)),
        worker(&a, "2026-05-03T11:00:00Z", 5.0),
    ] {
        insert(&app, team, event).await;
    }
    let range = "from=2026-05-01&to=2026-05-04";
    let totals = sums(6, 6, 3, 5.0);
    let mut keys = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let query = match &cursor {
            None => format!("?{range}&group_by=model&limit=3"),
            Some(c) => format!("?{range}&group_by=model&limit=3&cursor={c}"),
        };
        let page = usage(&app, &query).await;
        assert_eq!(page["totals"], totals, "{page}");
        keys.extend(
            page["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["key"].clone()),
        );
        pages += 1;
        match page.get("next_cursor") {
            Some(next) => cursor = Some(next.as_str().unwrap().to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 2);
    assert_eq!(
        keys,
        vec![
            json!("openai/m1"),
            json!("openai/m2"),
            json!("openai/m3"),
            Value::Null
        ],
        "every group once, in key order, null last"
    );

    let first = usage(&app, &format!("?{range}&group_by=model&limit=1")).await;
    let cursor = first["next_cursor"].as_str().unwrap();
    let (status, body) = usage_as(
        &app,
        &app.key,
        &format!("?{range}&group_by=day&cursor={cursor}"),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, _) = usage_as(&app, &app.key, &format!("?{range}&limit=0")).await;
    assert_eq!(status, 400);
}
