//! The operator's team API (L1): off without `BRAIN_OPERATOR_TOKEN`, on its token alone;
//! teams created with their first key, listed a page at a time, read with this month's
//! usage, renamed. Disabling a team across replicas is in `auth.rs`
//! (`a_disabled_teams_keys_tokens_streams_and_turns_end_on_every_replica`), its schedules
//! in `autostart.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::replies::text;
use crate::common::{TestApp, error_code};

/// The operator's token of these tests.
pub(crate) const OPERATOR: &str = "op-test-0123456789abcdef0123456789abcdef";

async fn operator_app() -> TestApp {
    TestApp::start_with(|c| c.operator_token = Some(crate::auth::operator_token())).await
}

pub(crate) async fn as_operator(
    app: &TestApp,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = app
        .http
        .request(method, format!("{}{path}", app.url))
        .bearer_auth(OPERATOR);
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn without_an_operator_token_the_team_api_is_absent() {
    let app = TestApp::start().await;
    for bearer in [OPERATOR, app.key.as_str()] {
        let response = app
            .http
            .get(format!("{}/v1/teams", app.url))
            .bearer_auth(bearer)
            .send()
            .await
            .unwrap();
        assert_eq!(error_code(response).await, (404, "not_found".into()));
    }
}

#[tokio::test]
async fn only_the_operators_token_opens_the_team_api() {
    let app = operator_app().await;
    for bearer in [app.key.as_str(), "op-test-0123456789abcdef0123456789abcdeX"] {
        let response = app
            .http
            .get(format!("{}/v1/teams", app.url))
            .bearer_auth(bearer)
            .send()
            .await
            .unwrap();
        assert_eq!(error_code(response).await, (401, "unauthorized".into()));
    }
    let bare = app
        .http
        .get(format!("{}/v1/teams", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), 401);
    // Nor does the operator's token open a team's routes.
    let response = app
        .http
        .get(format!("{}/v1/agents", app.url))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
}

#[tokio::test]
async fn a_team_is_created_with_its_first_key_listed_in_pages_read_and_renamed() {
    let app = operator_app().await;
    let created = as_operator(
        &app,
        Method::POST,
        "/v1/teams",
        Some(json!({"name": "Acme"})),
    )
    .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    assert_eq!(created["name"], "Acme");
    let acme = created["team_id"].as_str().unwrap().to_owned();
    let key = created["api_key"].as_str().unwrap().to_owned();
    // Its key is an admin key of the new team.
    let agent = app
        .http
        .post(format!("{}/v1/agents", app.url))
        .bearer_auth(&key)
        .json(&json!({"name": "a", "system_prompt": "Be brief.", "model": "openai/gpt-test"}))
        .send()
        .await
        .unwrap();
    assert_eq!(agent.status(), 201);
    let agent: Value = agent.json().await.unwrap();
    let chat: Value = app
        .http
        .post(format!(
            "{}/v1/agents/{}/chats",
            app.url,
            agent["id"].as_str().unwrap()
        ))
        .bearer_auth(&key)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    app.provider.push(text("Hello."));
    let turn = app
        .http
        .post(format!(
            "{}/v1/chats/{}/messages",
            app.url,
            chat["id"].as_str().unwrap()
        ))
        .bearer_auth(&key)
        .json(&json!({"content": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(turn.status(), 200);
    turn.text().await.unwrap();
    app.settled().await;

    let bad = as_operator(&app, Method::POST, "/v1/teams", Some(json!({"name": " "}))).await;
    assert_eq!(error_code(bad).await, (400, "invalid_request".into()));
    let unknown_field = as_operator(
        &app,
        Method::POST,
        "/v1/teams",
        Some(json!({"name": "x", "plan": 1})),
    )
    .await;
    assert_eq!(unknown_field.status(), 400);
    as_operator(
        &app,
        Method::POST,
        "/v1/teams",
        Some(json!({"name": "Beta"})),
    )
    .await;

    // Three teams (the test's own, Acme, Beta), one per page, in creation order.
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/teams?limit=1&cursor={c}"),
            None => "/v1/teams?limit=1".to_owned(),
        };
        let page: Value = as_operator(&app, Method::GET, &path, None)
            .await
            .json()
            .await
            .unwrap();
        let teams = page["teams"].as_array().unwrap();
        assert!(teams.len() <= 1, "{page}");
        names.extend(teams.iter().map(|t| t["name"].as_str().unwrap().to_owned()));
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(names, ["test team", "Acme", "Beta"]);
    let bad_cursor = as_operator(&app, Method::GET, "/v1/teams?cursor=nope", None).await;
    assert_eq!(
        error_code(bad_cursor).await,
        (400, "invalid_request".into())
    );

    let one: Value = as_operator(&app, Method::GET, &format!("/v1/teams/{acme}"), None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(one["status"], "active");
    assert_eq!(one["usage_this_month"]["model_calls"], 1, "{one}");
    assert!(one["usage_this_month"]["tokens_in"].as_i64().unwrap() > 0);

    let renamed = as_operator(
        &app,
        Method::PATCH,
        &format!("/v1/teams/{acme}"),
        Some(json!({"name": "Acme Corp"})),
    )
    .await;
    assert_eq!(renamed.status(), 200);
    let renamed: Value = renamed.json().await.unwrap();
    assert_eq!(renamed["name"], "Acme Corp");
    assert_eq!(renamed["status"], "active");

    let missing = as_operator(
        &app,
        Method::GET,
        &format!("/v1/teams/{}", uuid::Uuid::now_v7()),
        None,
    )
    .await;
    assert_eq!(error_code(missing).await, (404, "not_found".into()));
}

/// L1: a disabled team's worker sessions end at once, and the runtime-manager stops their
/// workers on its next pass (not after the profile's idle window, here a minute).
#[tokio::test]
async fn a_disabled_teams_workers_are_released_at_once() {
    let (app, _manager) = crate::workers::system(60_000, |c| {
        c.operator_token = Some(crate::auth::operator_token());
    })
    .await;
    let (_, chat) = crate::common::light_agent(&app).await;
    app.provider.push(crate::workers::shell("c1", "echo hi"));
    app.provider.push(text("done"));
    crate::common::read_stream(app.send(&chat, &json!({"content": "run it"})).await).await;
    app.settled().await;
    let pid = crate::workers::worker_pid(&app).await;
    assert!(crate::workers::alive(pid));

    let disabled = as_operator(
        &app,
        Method::PATCH,
        &format!("/v1/teams/{}", app.team),
        Some(json!({"disabled": true})),
    )
    .await;
    assert_eq!(disabled.status(), 200);
    let state: String = sqlx::query_scalar("SELECT state FROM agent_runtime_sessions")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(state, "terminated");
    crate::erasure::eventually(
        std::time::Duration::from_secs(10),
        "the worker stops",
        || {
            let gone = !crate::workers::alive(pid);
            async move { gone }
        },
    )
    .await;
}
