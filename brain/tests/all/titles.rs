//! Auxiliary routes and chat titles (T17): the title a chat's first turn earns from the
//! `title` route, a person's rename, and the `summary` route of the fold (M1). The title
//! and summary routes point at a second scripted provider (the deployment's `anthropic`
//! connection), so which model answered is what that server recorded.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::{TestApp, error_code, key_with_scope, read_stream, streamed_text, words};
use scripted_provider::{Reply, ScriptedProvider, Wire};
use serde_json::{Value, json};

/// A brain whose `anthropic` connection is a second scripted server, with titles on.
async fn app_with_second_model(
    tweak: impl FnOnce(&mut engine::config::Config),
) -> (TestApp, ScriptedProvider) {
    let second = ScriptedProvider::start().await.unwrap();
    let base = second.anthropic_base_url();
    let app = TestApp::start_with(move |c| {
        c.anthropic.base_url = base;
        c.chat_titles = true;
        tweak(c);
    })
    .await;
    (app, second)
}

async fn agent(app: &TestApp, auxiliary: Value) -> String {
    let created = app
        .post_json(
            "/v1/agents",
            &json!({"name": "a", "system_prompt": "You are terse.", "model": "openai/gpt-test",
                    "auxiliary_models": auxiliary}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    created["id"].as_str().unwrap().to_owned()
}

/// The chat as the agent's listing shows it.
async fn listed(app: &TestApp, agent: &str, chat: &str) -> Value {
    let page: Value = app
        .get(&format!("/v1/agents/{agent}/chats"))
        .await
        .json()
        .await
        .unwrap();
    page["chats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == chat)
        .cloned()
        .unwrap()
}

/// Waits for the billing event of a title call: written after the title's store, so the
/// title is settled once it exists. Its model.
async fn title_billed(app: &TestApp, chat: &str) -> String {
    let chat: uuid::Uuid = chat.parse().unwrap();
    for _ in 0..500 {
        let found: Option<(String,)> = sqlx::query_as(
            "SELECT b.model FROM billing_events b JOIN turns t ON t.id = b.turn_id \
             WHERE t.chat_id = $1 AND b.event_key LIKE '%:title'",
        )
        .bind(chat)
        .fetch_optional(app.store.pool())
        .await
        .unwrap();
        if let Some((model,)) = found {
            return model;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no title call was billed");
}

async fn patch_chat(app: &TestApp, bearer: &str, chat: &str, body: &Value) -> reqwest::Response {
    app.http
        .patch(format!("{}/v1/chats/{chat}", app.url))
        .bearer_auth(bearer)
        .json(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_new_chat_is_titled_once_by_its_title_route() {
    let (app, second) = app_with_second_model(|_| {}).await;
    let agent = agent(&app, json!({"title": "anthropic/title-model"})).await;
    let chat = app.new_chat(&agent).await;
    assert_eq!(listed(&app, &agent, &chat).await["title"], Value::Null);
    // An open reasoning model thinks inline first: none of it reaches the title (T18).
    second.push(Reply::Text {
        deltas: words("<think>They ask about travel.</think>\n\"Planning a trip to Lyon.\""),
        delay: Duration::from_millis(1),
    });
    app.provider.push(Reply::Text {
        deltas: words("Take the train from Paris."),
        delay: Duration::from_millis(1),
    });
    let (chunks, done) = read_stream(
        app.send(&chat, &json!({"content": "How do I get to Lyon?"}))
            .await,
    )
    .await;
    assert!(done);
    assert_eq!(streamed_text(&chunks), "Take the train from Paris.");

    assert_eq!(title_billed(&app, &chat).await, "anthropic/title-model");
    assert_eq!(
        listed(&app, &agent, &chat).await["title"],
        "Planning a trip to Lyon"
    );
    let asked = second.requests();
    assert_eq!(asked.len(), 1);
    assert_eq!(
        (asked[0].wire, asked[0].model.as_str()),
        (Wire::Anthropic, "title-model")
    );
    let body = asked[0].body.to_string();
    assert!(
        body.contains("How do I get to Lyon?") && body.contains("Take the train"),
        "{body}"
    );
    assert!(
        asked[0].body["max_tokens"].as_u64().unwrap() <= 32,
        "a bounded output"
    );
    // The turn's own model never wrote the title.
    assert_eq!(app.provider.requests().len(), 1);

    // The second turn earns no title call; a new chat's first turn does, after it, so
    // a call the second turn had made would be on the second server before the new one.
    app.provider.push(Reply::Text {
        deltas: words("Two hours."),
        delay: Duration::from_millis(1),
    });
    read_stream(app.send(&chat, &json!({"content": "How long?"})).await).await;
    let other = app.new_chat(&agent).await;
    second.push(Reply::Text {
        deltas: words("Weather"),
        delay: Duration::from_millis(1),
    });
    read_stream(app.send(&other, &json!({"content": "Rain today?"})).await).await;
    title_billed(&app, &other).await;
    let asked = second.requests();
    assert_eq!(asked.len(), 2, "one title call per chat");
    assert!(asked[1].body.to_string().contains("Rain today?"));
    assert_eq!(
        listed(&app, &agent, &chat).await["title"],
        "Planning a trip to Lyon"
    );
    assert_eq!(listed(&app, &agent, &other).await["title"], "Weather");
}

#[tokio::test]
async fn the_answer_does_not_wait_for_its_title_and_a_rename_wins() {
    let (app, second) = app_with_second_model(|_| {}).await;
    // The team's default title route serves an agent that names none.
    let put = app
        .auth(app.http.put(format!("{}/v1/team/settings", app.url)))
        .json(&json!({"retention_days": null, "auxiliary_models": {"title": "anthropic/team-titles"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let agent = agent(&app, json!({})).await;
    let chat = app.new_chat(&agent).await;
    // The title model answers only once released: the turn ends meanwhile.
    second.push(Reply::Held {
        delta: "Late title".into(),
        every: Duration::from_millis(50),
    });
    app.provider.push(Reply::Text {
        deltas: words("Here it is."),
        delay: Duration::from_millis(1),
    });
    let (chunks, done) = read_stream(app.send(&chat, &json!({"content": "Hello"})).await).await;
    assert!(
        done,
        "the turn's stream ended while its title was still being written"
    );
    assert_eq!(streamed_text(&chunks), "Here it is.");
    for _ in 0..500 {
        if !second.requests().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(second.requests()[0].model, "team-titles");
    assert_eq!(listed(&app, &agent, &chat).await["title"], Value::Null);

    let renamed = patch_chat(&app, &app.key, &chat, &json!({"title": "  My trip  "})).await;
    assert_eq!(renamed.status(), 200);
    let renamed: Value = renamed.json().await.unwrap();
    assert_eq!(renamed["title"], "My trip");
    second.release_held();
    assert_eq!(title_billed(&app, &chat).await, "anthropic/team-titles");
    assert_eq!(listed(&app, &agent, &chat).await["title"], "My trip");
}

#[tokio::test]
async fn a_rename_is_checked_and_needs_the_chat() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    for bad in [
        json!({"title": "   "}),
        json!({"title": "x".repeat(81)}),
        json!({"title": "a\nb"}),
        json!({"title": "ok", "color": "red"}),
        json!({}),
    ] {
        let (status, code) = error_code(patch_chat(&app, &app.key, &chat, &bad).await).await;
        assert_eq!((status, code.as_str()), (400, "invalid_request"), "{bad}");
    }
    assert_eq!(listed(&app, &agent, &chat).await["title"], Value::Null);

    // Another team's chat is not there.
    let other = app.store.create_team("other team").await.unwrap();
    let (status, code) =
        error_code(patch_chat(&app, &other.api_key, &chat, &json!({"title": "mine"})).await).await;
    assert_eq!((status, code.as_str()), (404, "not_found"));

    // A chat key may rename what it may post to, and not the agent's autostart chat.
    let (chat_key, _) = key_with_scope(&app, "chat").await;
    let ok = patch_chat(&app, &chat_key, &chat, &json!({"title": "Renamed"})).await;
    assert_eq!(ok.status(), 200);
    sqlx::query("UPDATE chats SET autostart = true WHERE id = $1")
        .bind(chat.parse::<uuid::Uuid>().unwrap())
        .execute(app.store.pool())
        .await
        .unwrap();
    let (status, code) =
        error_code(patch_chat(&app, &chat_key, &chat, &json!({"title": "Nope"})).await).await;
    assert_eq!((status, code.as_str()), (404, "not_found"));
    let ok = patch_chat(&app, &app.key, &chat, &json!({"title": "Admin's"})).await;
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn auxiliary_routes_are_checked_like_the_model() {
    let app = TestApp::start().await;
    for bad in [
        json!({"title": "no-slash"}),
        json!({"summary": "openai/"}),
        json!({"colour": "openai/x"}),
    ] {
        let created = app
            .post_json(
                "/v1/agents",
                &json!({"name": "a", "system_prompt": "", "model": "openai/gpt-test",
                        "auxiliary_models": bad}),
            )
            .await;
        let (status, code) = error_code(created).await;
        assert_eq!((status, code.as_str()), (400, "invalid_request"), "{bad}");
    }
    // Like `model`, a route names the team's connections or the deployment's (T14).
    let created = app
        .post_json(
            "/v1/agents",
            &json!({"name": "a", "system_prompt": "", "model": "openai/gpt-test",
                    "auxiliary_models": {"title": "nosuch/model"}}),
        )
        .await;
    let (status, code) = error_code(created).await;
    assert_eq!((status, code.as_str()), (400, "unknown_connection"));
    let agent = agent(&app, json!({"vision": "openai/gpt-4o"})).await;
    let read: Value = app
        .get(&format!("/v1/agents/{agent}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(read["auxiliary_models"]["vision"], "openai/gpt-4o");
    assert_eq!(read["auxiliary_models"]["title"], Value::Null);
    let patched = app
        .auth(app.http.patch(format!("{}/v1/agents/{agent}", app.url)))
        .json(&json!({"auxiliary_models": {"summary": "anthropic/claude-haiku"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);
    let patched: Value = patched.json().await.unwrap();
    assert_eq!(
        patched["auxiliary_models"]["summary"],
        "anthropic/claude-haiku"
    );
    assert_eq!(
        patched["auxiliary_models"]["vision"],
        Value::Null,
        "replaced whole"
    );

    let settings = |body: Value| {
        app.auth(app.http.put(format!("{}/v1/team/settings", app.url)))
            .json(&body)
            .send()
    };
    let (status, code) = error_code(
        settings(json!({"retention_days": 30, "auxiliary_models": {"title": "x"}}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, code.as_str()), (400, "invalid_request"));
    let (status, code) = error_code(
        settings(json!({"retention_days": 30, "auxiliary_models": {"summary": "nosuch/m"}}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, code.as_str()), (400, "unknown_connection"));
    let put = settings(json!({"retention_days": 30, "auxiliary_models": {"title": "openai/mini"}}))
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    // Absent, the routes stay as they are.
    settings(json!({"retention_days": 40})).await.unwrap();
    let read: Value = app.get("/v1/team/settings").await.json().await.unwrap();
    assert_eq!(read["retention_days"], 40);
    assert_eq!(read["auxiliary_models"]["title"], "openai/mini");
}

#[tokio::test]
async fn the_fold_asks_the_summary_route_first() {
    let (app, second) = app_with_second_model(|c| {
        c.context_tokens = 160;
        c.chat_titles = false;
    })
    .await;
    let agent = agent(&app, json!({"summary": "anthropic/summary-model"})).await;
    let chat = app.new_chat(&agent).await;
    let long = |tag: &str| format!("{tag} {}", "lorem ipsum ".repeat(20));
    for i in 0..2 {
        app.provider.push(Reply::Text {
            deltas: vec![long(&format!("answer{i}"))],
            delay: Duration::from_millis(1),
        });
        read_stream(
            app.send(&chat, &json!({"content": long(&format!("question{i}"))}))
                .await,
        )
        .await;
        app.settled().await;
    }
    // The second exchange outgrows 160 tokens: its wrap-up folds the first.
    for _ in 0..500 {
        let (through,): (i64,) = sqlx::query_as("SELECT summary_through FROM chats")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
        if through > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let folds = second.requests();
    assert!(!folds.is_empty(), "the summary route was asked");
    assert_eq!(folds[0].model, "summary-model");
    assert!(folds[0].body.to_string().contains("running summary"));
    assert!(
        app.provider
            .requests()
            .iter()
            .all(|r| !r.body.to_string().contains("running summary")),
        "the agent's own route was not needed"
    );
    let (model,): (String,) =
        sqlx::query_as("SELECT model FROM billing_events WHERE event_key LIKE '%:summary'")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(model, "anthropic/summary-model");
}
