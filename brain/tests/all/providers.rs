//! Provider connections per team (T14): a team's own endpoint beside the deployment's.
//! Two scripted provider servers stand for them (the scripted provider is a test double
//! speaking the exact wire formats): the deployment's `openai`/`anthropic` from the
//! environment, and the team's, which listens on loopback (so these brains allow private
//! networks for connections unless a test is about refusing them).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use scripted_provider::{Reply, ScriptedProvider};
use serde_json::{Value, json};
use store::SecretsKey;

use crate::common::replies::text;
use crate::common::{TestApp, error_code, read_stream, streamed_text};
use crate::webhooks::KEY_HEX;

const TEAM_KEY: &str = "sk-team-secret-9876";

async fn app() -> TestApp {
    TestApp::start_with(|c| {
        c.secrets_key = Some(SecretsKey::parse(KEY_HEX).unwrap());
        c.providers_allow_private_networks = true;
    })
    .await
}

async fn request(app: &TestApp, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
    app.auth(app.http.request(method, format!("{}{path}", app.url)))
}

/// Adds the team's connection `name` to `server`: its id and the answer's body.
async fn connect(app: &TestApp, name: &str, server: &ScriptedProvider) -> (String, String) {
    let created = app
        .post_json(
            "/v1/providers",
            &json!({"name": name, "kind": "openai", "base_url": server.openai_base_url(),
                    "api_key": TEAM_KEY, "models": [{"model": "team-model", "vision": true}]}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let body = created.text().await.unwrap();
    let row: Value = serde_json::from_str(&body).unwrap();
    (row["id"].as_str().unwrap().to_owned(), body)
}

async fn provider(app: &TestApp, id: &str) -> Value {
    let read = app.get(&format!("/v1/providers/{id}")).await;
    assert_eq!(read.status(), 200);
    read.json().await.unwrap()
}

/// Waits until the connection's `last_error` is set: written off the turn's path.
async fn last_error(app: &TestApp, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let row = provider(app, id).await;
        if !row["last_error"].is_null() {
            return row["last_error"].clone();
        }
        assert!(Instant::now() < deadline, "no last error recorded: {row}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_team_connection_serves_its_routes_with_its_key_and_never_shows_it() {
    let app = app().await;
    let team_server = ScriptedProvider::start().await.unwrap();
    let (id, created) = connect(&app, "team-llm", &team_server).await;
    assert!(!created.contains(TEAM_KEY), "{created}");
    let row: Value = serde_json::from_str(&created).unwrap();
    assert_eq!(row["key_hint"], "9876");
    assert_eq!(row["builtin"], false);
    assert_eq!(row["models"][0]["model"], "team-model");
    assert_eq!(row["models"][0]["vision"], true);

    let (agent, chat) = app.agent_and_chat("team-llm/team-model", &[]).await;
    team_server.push(text("from the team's endpoint"));
    let (chunks, done) = read_stream(app.send(&chat, &json!({"content": "hi"})).await).await;
    assert!(done);
    assert_eq!(streamed_text(&chunks), "from the team's endpoint");
    let asked = team_server.requests();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].model, "team-model");
    assert_eq!(
        asked[0].authorization.as_deref(),
        Some(format!("Bearer {TEAM_KEY}").as_str())
    );
    assert!(
        app.provider.requests().is_empty(),
        "the deployment's was not called"
    );

    // A rotated key is used by the next turn on this replica.
    let rotated = request(&app, reqwest::Method::PATCH, &format!("/v1/providers/{id}"))
        .await
        .json(&json!({"api_key": "sk-rotated-key-5555"}))
        .send()
        .await
        .unwrap();
    assert_eq!(rotated.status(), 200);
    let rotated = rotated.text().await.unwrap();
    assert!(!rotated.contains("sk-rotated"), "{rotated}");
    team_server.push(text("again"));
    read_stream(app.send(&chat, &json!({"content": "again"})).await).await;
    assert_eq!(
        team_server.requests()[1].authorization.as_deref(),
        Some("Bearer sk-rotated-key-5555")
    );

    // No listing, read or audit entry carries a key.
    let list = app.get("/v1/providers").await.text().await.unwrap();
    let one = app
        .get(&format!("/v1/providers/{id}"))
        .await
        .text()
        .await
        .unwrap();
    let audit = app.get("/v1/audit").await.text().await.unwrap();
    for body in [&list, &one, &audit] {
        assert!(
            !body.contains(TEAM_KEY) && !body.contains("sk-rotated"),
            "{body}"
        );
    }
    let list: Value = serde_json::from_str(&list).unwrap();
    let names: Vec<(&str, bool)> = list["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["builtin"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        names,
        [("openai", true), ("anthropic", true), ("team-llm", false)]
    );
    assert!(audit.contains("provider.created") && audit.contains("provider.updated"));
    drop(agent);
}

#[tokio::test]
async fn a_failing_team_connection_falls_back_to_the_deployments_openai() {
    let app = app().await;
    let team_server = ScriptedProvider::start().await.unwrap();
    let (id, _) = connect(&app, "team-llm", &team_server).await;
    let (_, chat) = app
        .agent_and_chat("team-llm/team-model", &["openai/gpt-test"])
        .await;
    team_server.push(Reply::Status {
        status: 503,
        retry_after: None,
    });
    app.provider.push(text("from the deployment"));
    let (chunks, done) = read_stream(app.send(&chat, &json!({"content": "hi"})).await).await;
    assert!(done);
    assert_eq!(streamed_text(&chunks), "from the deployment");
    assert_eq!(team_server.requests().len(), 1);
    assert_eq!(app.provider.requests()[0].model, "gpt-test");
    let error = last_error(&app, &id).await;
    assert_eq!(error["class"], "status");
    assert_eq!(error["description"], "provider unavailable: status 503");
}

#[tokio::test]
async fn a_connection_deleted_since_fails_its_route_and_the_turn_falls_back() {
    let app = app().await;
    let team_server = ScriptedProvider::start().await.unwrap();
    connect(&app, "gone", &team_server).await;
    let (_, chat) = app.agent_and_chat("gone/m", &["openai/gpt-test"]).await;
    // Behind the API's back (which refuses while an agent names it).
    sqlx::query("DELETE FROM provider_connections WHERE name = 'gone'")
        .execute(app.store.pool())
        .await
        .unwrap();
    app.provider.push(text("fallback"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "hi"})).await).await;
    assert_eq!(streamed_text(&chunks), "fallback");
    assert!(team_server.requests().is_empty());
}

#[tokio::test]
async fn another_team_can_neither_name_nor_read_a_connection() {
    let app = app().await;
    let team_server = ScriptedProvider::start().await.unwrap();
    let (id, _) = connect(&app, "team-llm", &team_server).await;
    let other = app.store.create_team("other team").await.unwrap().api_key;
    let as_other = |method: reqwest::Method, path: &str| {
        app.http
            .request(method, format!("{}{path}", app.url))
            .bearer_auth(&other)
    };
    let named = as_other(reqwest::Method::POST, "/v1/agents")
        .json(&json!({"name": "thief", "system_prompt": "", "model": "team-llm/team-model"}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(named).await, (400, "unknown_connection".into()));
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let read = as_other(method, &format!("/v1/providers/{id}"))
            .send()
            .await
            .unwrap();
        assert_eq!(error_code(read).await, (404, "not_found".into()));
    }
    let checked = as_other(
        reqwest::Method::POST,
        &format!("/v1/providers/{id}/check?model=m"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(error_code(checked).await, (404, "not_found".into()));
    let listed: Value = as_other(reqwest::Method::GET, "/v1/providers")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["providers"].as_array().unwrap().len(), 2, "{listed}");

    // In its own team, an unknown name is refused too, at create and at change.
    let unknown = app
        .post_json(
            "/v1/agents",
            &json!({"name": "a", "system_prompt": "", "model": "openai/gpt-test",
                    "fallback_models": ["nowhere/m"]}),
        )
        .await;
    let (status, code) = error_code(unknown).await;
    assert_eq!((status, code.as_str()), (400, "unknown_connection"));
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let patched = request(&app, reqwest::Method::PATCH, &format!("/v1/agents/{agent}"))
        .await
        .json(&json!({"model": "nowhere/m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(patched).await,
        (400, "unknown_connection".into())
    );
}

#[tokio::test]
async fn a_check_answers_the_latency_or_the_providers_error_and_records_it() {
    let app = app().await;
    let team_server = ScriptedProvider::start().await.unwrap();
    let (id, _) = connect(&app, "team-llm", &team_server).await;
    team_server.push(text("p"));
    let ok: Value = app
        .post_json(&format!("/v1/providers/{id}/check"), &json!(null))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(ok["ok"], true, "{ok}");
    assert!(ok["latency_ms"].is_u64(), "{ok}");
    let asked = &team_server.requests()[0];
    assert_eq!(asked.model, "team-model", "the first declared model");
    assert_eq!(asked.body["max_tokens"], 1);
    assert!(!provider(&app, &id).await["last_check"].is_null());

    team_server.push(Reply::Status {
        status: 401,
        retry_after: None,
    });
    let refused = app
        .post_json(
            &format!("/v1/providers/{id}/check?model=other"),
            &json!(null),
        )
        .await;
    assert_eq!(refused.status(), 200);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(
        refused,
        json!({"ok": false, "error": {"code": "provider_rejected", "class": "rejected", "status": 401}})
    );
    let error = provider(&app, &id).await["last_error"].clone();
    assert_eq!(error["class"], "rejected");
    assert!(error["at"].is_string());
}

#[tokio::test]
async fn base_urls_names_and_keys_are_held_to_the_rules() {
    // Neither private networks nor a secrets key on this server.
    let app = TestApp::start().await;
    let create = |body: Value| {
        let app = &app;
        async move { error_code(app.post_json("/v1/providers", &body).await).await }
    };
    let private = app
        .post_json(
            "/v1/providers",
            &json!({"name": "local", "kind": "openai", "base_url": "http://127.0.0.1:8000/v1"}),
        )
        .await;
    assert_eq!(private.status(), 400);
    let message = private.json::<Value>().await.unwrap()["error"]["message"].clone();
    assert!(
        message
            .as_str()
            .unwrap()
            .contains("BRAIN_PROVIDERS_ALLOW_PRIVATE_NETWORKS"),
        "{message}"
    );
    let refusals = [
        json!({"name": "meta", "kind": "openai", "base_url": "http://169.254.169.254/v1"}),
        json!({"name": "openai", "kind": "openai", "base_url": "https://llm.example.com/v1"}),
        json!({"name": "Caps", "kind": "openai", "base_url": "https://llm.example.com/v1"}),
        json!({"name": "ok", "kind": "gemini", "base_url": "https://llm.example.com/v1"}),
        json!({"name": "ok", "kind": "openai", "base_url": "https://llm.example.com/v1",
               "models": [{"model": "m", "context_window": 0}]}),
    ];
    for body in refusals {
        assert_eq!(
            create(body.clone()).await,
            (400, "invalid_request".into()),
            "{body}"
        );
    }
    let keyed = create(json!({"name": "ok", "kind": "anthropic",
                              "base_url": "https://llm.example.com", "api_key": "sk-x-1234"}))
    .await;
    assert_eq!(keyed, (501, "not_configured".into()));
    // Without a key, a public address is taken.
    let plain = app
        .post_json(
            "/v1/providers",
            &json!({"name": "ok", "kind": "anthropic", "base_url": "https://llm.example.com"}),
        )
        .await;
    assert_eq!(plain.status(), 201);
}

#[tokio::test]
async fn a_connection_agents_name_is_not_deleted_until_they_stop_naming_it() {
    let app = app().await;
    let team_server = ScriptedProvider::start().await.unwrap();
    let (id, _) = connect(&app, "team-llm", &team_server).await;
    let (agent, _) = app
        .agent_and_chat("openai/gpt-test", &["team-llm/team-model"])
        .await;
    let path = format!("/v1/providers/{id}");
    let refused = request(&app, reqwest::Method::DELETE, &path)
        .await
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(refused).await, (409, "provider_in_use".into()));
    let patched = request(&app, reqwest::Method::PATCH, &format!("/v1/agents/{agent}"))
        .await
        .json(&json!({"fallback_models": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);
    let deleted = request(&app, reqwest::Method::DELETE, &path)
        .await
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert_eq!(app.get(&path).await.status(), 404);
}

#[tokio::test]
async fn a_team_connection_that_breaks_after_its_first_output_records_its_error() {
    let app = app().await;
    let team_server = ScriptedProvider::start().await.unwrap();
    let (id, _) = connect(&app, "team-llm", &team_server).await;
    let (_, chat) = app.agent_and_chat("team-llm/team-model", &[]).await;
    team_server.push(Reply::StreamError {
        deltas: vec!["partial".into()],
        delay: Duration::from_millis(1),
    });
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "hi"})).await).await;
    assert_eq!(streamed_text(&chunks), "partial");
    let error = last_error(&app, &id).await;
    assert_eq!(error["class"], "stream_error");
    assert!(
        !error["description"].as_str().unwrap().contains("partial"),
        "no provider text: {error}"
    );
}

/// The address rule holds at connect time too: a replica that does not allow private
/// networks refuses a connection another replica accepted, and the turn falls back.
#[tokio::test]
async fn a_replica_that_refuses_private_networks_does_not_call_a_private_connection() {
    let app = app().await;
    let team_server = ScriptedProvider::start().await.unwrap();
    connect(&app, "team-llm", &team_server).await;
    let (_, chat) = app
        .agent_and_chat("team-llm/team-model", &["openai/gpt-test"])
        .await;
    let (strict, _) = app
        .second_replica_with(|c| c.providers_allow_private_networks = false)
        .await;
    app.provider.push(text("from the deployment"));
    let answer = app
        .auth(app.http.post(format!("{strict}/v1/chats/{chat}/messages")))
        .json(&json!({"content": "hi"}))
        .send()
        .await
        .unwrap();
    let (chunks, _) = read_stream(answer).await;
    assert_eq!(streamed_text(&chunks), "from the deployment");
    assert!(team_server.requests().is_empty());
}

/// The cache bound: the replica a deletion went through forgets the connection at once;
/// another replica, which read it before, within `TEAM_TTL`.
#[tokio::test]
async fn a_deleted_connection_is_gone_here_at_once_and_elsewhere_within_the_cache_bound() {
    use engine::models::connections::{RouteError, TEAM_TTL};
    let app = app().await;
    let team_server = ScriptedProvider::start().await.unwrap();
    let (id, _) = connect(&app, "team-llm", &team_server).await;
    let (_, here) = app.second_replica_with(|_| {}).await;
    let (_, there) = app.second_replica_with(|_| {}).await;
    let route = "team-llm/team-model";
    for replica in [&here, &there] {
        let resolved = replica.connections.resolve(app.team, route).await.unwrap();
        assert_eq!(resolved.model, "team-model");
        assert_eq!(resolved.connection.unwrap().to_string(), id);
    }
    let by = store::Actor::operator(None);
    here.store
        .delete_provider_connection(app.team, id.parse().unwrap(), &by)
        .await
        .unwrap();
    here.connections.forget(app.team);
    let deleted = Instant::now();
    assert!(matches!(
        here.connections.resolve(app.team, route).await,
        Err(RouteError::UnknownConnection)
    ));
    loop {
        match there.connections.resolve(app.team, route).await {
            Err(RouteError::UnknownConnection) => break,
            Ok(_) => assert!(
                deleted.elapsed() < TEAM_TTL + Duration::from_secs(1),
                "still resolved {:?} after the deletion",
                deleted.elapsed()
            ),
            Err(other) => panic!("{other}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
