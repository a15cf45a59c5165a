//! The Responses API as a team connection's wire (T15), inline reasoning kept out of the
//! answer (T18), the model catalog (`GET /v1/models`) and usage cost (T16). The team's
//! endpoint is a second scripted provider (a test double speaking the exact wire formats,
//! here `/v1/responses`) on loopback, so these brains allow private networks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use engine::models::catalog::{Catalog, ModelFacts, Table};
use scripted_provider::{Reply, ScriptedProvider, Wire};
use serde_json::{Value, json};
use store::SecretsKey;
use uuid::Uuid;

use crate::common::replies::{call, calls, deltas, text};
use crate::common::{TestApp, read_stream, streamed_text};
use crate::webhooks::KEY_HEX;

/// A brain whose operator catalog adds `local/operator-model` with prices.
async fn app() -> TestApp {
    TestApp::start_with(|c| {
        c.secrets_key = Some(SecretsKey::parse(KEY_HEX).unwrap());
        c.providers_allow_private_networks = true;
        let mut catalog = Catalog::shipped().unwrap();
        let entry: ModelFacts = serde_json::from_value(json!({
            "model": "operator-model", "context_window": 8192,
            "input_price_per_mtok": 4.0, "output_price_per_mtok": 8.0,
        }))
        .unwrap();
        catalog.merge(Table::from([("local".to_owned(), vec![entry])]));
        c.model_catalog = Arc::new(catalog);
    })
    .await
}

/// The team's connection `name` of `kind` at `server`, declaring `models`.
async fn connect(app: &TestApp, name: &str, kind: &str, server: &ScriptedProvider, models: Value) {
    let created = app
        .post_json(
            "/v1/providers",
            &json!({"name": name, "kind": kind, "base_url": server.openai_base_url(),
                    "api_key": "sk-team-1234", "models": models}),
        )
        .await;
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
}

#[tokio::test]
async fn a_responses_connection_streams_text_and_runs_tool_calls() {
    let app = app().await;
    let team = ScriptedProvider::start().await.unwrap();
    connect(&app, "resp", "openai-responses", &team, json!([])).await;
    let (_agent, chat) = app.agent_and_chat("resp/gpt-4.1", &[]).await;

    team.push(calls(vec![call(
        "call_1",
        "memory_write",
        json!({"content": "the deploy is on Friday"}),
    )]));
    team.push(deltas(&["No", "ted."]));
    let (chunks, done) = read_stream(
        app.send(&chat, &json!({"content": "remember the deploy"}))
            .await,
    )
    .await;
    assert!(done);
    assert_eq!(streamed_text(&chunks), "Noted.");

    let asked = team.requests();
    assert_eq!(asked.len(), 2);
    assert!(asked.iter().all(|r| r.wire == Wire::OpenAiResponses));
    assert_eq!(
        asked[0].authorization.as_deref(),
        Some("Bearer sk-team-1234")
    );
    let body = &asked[1].body;
    assert_eq!(body["model"], "gpt-4.1");
    assert_eq!(body["stream"], true);
    assert_eq!(body["store"], false);
    assert!(body["instructions"].is_string());
    assert!(body["tools"].as_array().unwrap().iter().any(|t| {
        t["type"] == "function" && t["name"] == "memory_write" && t["strict"] == false
    }));
    let input = body["input"].as_array().unwrap();
    let kinds: Vec<&str> = input.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["message", "function_call", "function_call_output"]);
    assert_eq!(input[1]["call_id"], "call_1");
    assert_eq!(input[2]["call_id"], "call_1");
    assert!(team.violations().is_empty(), "{:?}", team.violations());
    assert!(app.provider.requests().is_empty());
}

#[tokio::test]
async fn inline_reasoning_is_neither_streamed_nor_stored_nor_sent_back() {
    let app = app().await;
    let team = ScriptedProvider::start().await.unwrap();
    connect(&app, "resp", "openai-responses", &team, json!([])).await;
    let (_agent, chat) = app.agent_and_chat("resp/qwen3", &[]).await;

    team.push(deltas(&[
        "<thi",
        "nk>geheime Überle",
        "gung</th",
        "ink>\n\nHal",
        "lo!",
    ]));
    let (chunks, done) = read_stream(app.send(&chat, &json!({"content": "hi"})).await).await;
    assert!(done);
    assert_eq!(streamed_text(&chunks), "Hallo!");
    let transcript = app
        .get(&format!("/v1/chats/{chat}/messages"))
        .await
        .text()
        .await
        .unwrap();
    assert!(transcript.contains("Hallo!"), "{transcript}");
    assert!(!transcript.contains("Überlegung"), "{transcript}");

    team.push(text("again"));
    read_stream(app.send(&chat, &json!({"content": "and?"})).await).await;
    let history = team.requests()[1].body["input"].to_string();
    assert!(
        history.contains("Hallo!") && !history.contains("Überlegung"),
        "{history}"
    );
}

#[tokio::test]
async fn reasoning_from_every_wire_stays_out_of_the_answer() {
    let app = app().await;
    let team = ScriptedProvider::start().await.unwrap();
    connect(&app, "resp", "openai-responses", &team, json!([])).await;
    for (route, server) in [
        ("openai/gpt-test", &app.provider),
        ("anthropic/claude-test", &app.provider),
        ("resp/o4-mini", &team),
    ] {
        let (_agent, chat) = app.agent_and_chat(route, &[]).await;
        server.push(Reply::Reasoning {
            reasoning: vec!["geheime ".into(), "Überlegung".into()],
            deltas: vec!["Hal".into(), "lo!".into()],
            delay: std::time::Duration::from_millis(1),
        });
        let (chunks, done) = read_stream(app.send(&chat, &json!({"content": "hi"})).await).await;
        assert!(done, "{route}");
        assert_eq!(streamed_text(&chunks), "Hallo!", "{route}");
        let transcript = app
            .get(&format!("/v1/chats/{chat}/messages"))
            .await
            .text()
            .await
            .unwrap();
        assert!(
            transcript.contains("Hallo!") && !transcript.contains("Überlegung"),
            "{route}: {transcript}"
        );
    }
}

#[tokio::test]
async fn models_list_the_builtin_catalog_and_the_teams_declared_models() {
    let app = app().await;
    let team = ScriptedProvider::start().await.unwrap();
    connect(
        &app,
        "local",
        "openai",
        &team,
        json!([{"model": "qwen3", "vision": true, "max_output_tokens": 4096,
                "input_price_per_mtok": 0.5, "output_price_per_mtok": 1.5}]),
    )
    .await;
    let listed = app.get("/v1/models").await;
    assert_eq!(listed.status(), 200);
    let listed: Value = listed.json().await.unwrap();
    let data = listed["data"].as_array().unwrap();
    let entry = |id: &str| data.iter().find(|e| e["id"] == id).cloned();

    let gpt = entry("openai/gpt-4o").expect("shipped openai model");
    assert_eq!(gpt["connection"], "openai");
    assert_eq!(gpt["model"], "gpt-4o");
    assert_eq!(gpt["tools"], true);
    assert_eq!(gpt["vision"], true);
    assert_eq!(gpt["context_window"], 128_000);
    assert_eq!(
        gpt["pricing"],
        json!({"input_per_mtok": 2.5, "output_per_mtok": 10.0})
    );
    assert!(entry("anthropic/claude-sonnet-4-5").is_some());

    let declared = entry("local/qwen3").expect("declared model");
    assert_eq!(
        declared,
        json!({"id": "local/qwen3", "connection": "local", "model": "qwen3", "tools": true,
               "vision": true, "documents": false, "context_window": null,
               "max_output_tokens": 4096,
               "pricing": {"input_per_mtok": 0.5, "output_per_mtok": 1.5}})
    );
    // The operator's entry for a connection of that name is there too.
    assert_eq!(
        entry("local/operator-model").unwrap()["context_window"],
        8192
    );

    // A chat key of the team lists the same routes: choosing a model is not admin work.
    let chat_key: Value = app
        .post_json("/v1/keys", &json!({"name": "chat", "scope": "chat"}))
        .await
        .json()
        .await
        .unwrap();
    let as_chat: Value = app
        .http
        .get(format!("{}/v1/models", app.url))
        .bearer_auth(chat_key["api_key"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(as_chat, listed);

    // Another team sees the shipped catalog, not this team's connection.
    let other_key = app.store.create_team("other team").await.unwrap().api_key;
    let theirs: Value = app
        .http
        .get(format!("{}/v1/models", app.url))
        .bearer_auth(&other_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = theirs["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"openai/gpt-4o"));
    assert!(!ids.iter().any(|id| id.starts_with("local/")), "{ids:?}");
}

/// A model call billed to the team, as the turn writes it.
async fn billed(app: &TestApp, agent: &str, route: &str, tokens: (i64, i64)) {
    sqlx::query(
        "INSERT INTO billing_events \
           (id, team_id, agent_id, event_key, kind, model, input_tokens, output_tokens, created_at) \
         VALUES ($1, $2, $3::uuid, $4, 'model_call', $5, $6, $7, now())",
    )
    .bind(Uuid::now_v7())
    .bind(app.team.0)
    .bind(agent)
    .bind(format!("test:{}", Uuid::new_v4()))
    .bind(route)
    .bind(tokens.0)
    .bind(tokens.1)
    .execute(app.store.pool())
    .await
    .unwrap();
}

#[tokio::test]
async fn usage_costs_what_the_catalog_prices_and_is_unknown_otherwise() {
    let app = app().await;
    let team = ScriptedProvider::start().await.unwrap();
    connect(
        &app,
        "local",
        "openai",
        &team,
        json!([{"model": "qwen3", "input_price_per_mtok": 0.5, "output_price_per_mtok": 1.5}]),
    )
    .await;
    let (priced, _) = app.agent_and_chat("openai/gpt-4o", &[]).await;
    let (unpriced, _) = app.agent_and_chat("openai/no-such-model", &[]).await;
    // 1M in at 2.50 and 100k out at 10.00; a dated snapshot of a listed model.
    billed(
        &app,
        &priced,
        "openai/gpt-4o-2024-08-06",
        (1_000_000, 100_000),
    )
    .await;
    // 2M in at 0.50 and 1M out at 1.50, the team's declared price.
    billed(&app, &priced, "local/qwen3", (2_000_000, 1_000_000)).await;
    billed(&app, &unpriced, "openai/no-such-model", (10, 10)).await;

    let by_model: Value = app
        .get("/v1/usage?group_by=model")
        .await
        .json()
        .await
        .unwrap();
    let cost_of = |key: &str| {
        by_model["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["key"] == key)
            .map(|row| row["cost"].clone())
            .unwrap()
    };
    assert_eq!(cost_of("openai/gpt-4o-2024-08-06"), json!(3.5));
    assert_eq!(cost_of("local/qwen3"), json!(2.5));
    assert_eq!(cost_of("openai/no-such-model"), Value::Null);
    // One unpriced model leaves the whole range's cost unknown.
    assert_eq!(by_model["totals"]["cost"], Value::Null);

    let by_agent: Value = app
        .get("/v1/usage?group_by=agent")
        .await
        .json()
        .await
        .unwrap();
    let agent_cost = |id: &str| {
        by_agent["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["key"] == id)
            .map(|row| row["cost"].clone())
            .unwrap()
    };
    assert_eq!(agent_cost(&priced), json!(6.0));
    assert_eq!(agent_cost(&unpriced), Value::Null);
}
