//! Auth, tenancy and the closed schemas of the API (SPEC X1, X3).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use crate::common::TestApp;
use crate::common::error_code;
use serde_json::{Value, json};

#[tokio::test]
async fn every_v1_call_needs_a_known_key() {
    let app = TestApp::start().await;
    let no_key = app
        .http
        .get(format!("{}/v1/agents/x", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(no_key).await, (401, "unauthorized".into()));
    let bad_key = app
        .http
        .post(format!("{}/v1/agents", app.url))
        .bearer_auth("ar_not-a-key")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(bad_key).await, (401, "unauthorized".into()));
}

#[tokio::test]
async fn a_team_never_sees_another_teams_rows() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let other = app.store.create_team("other").await.unwrap();
    let as_other = |req: reqwest::RequestBuilder| req.bearer_auth(&other.api_key);

    for path in [
        format!("/v1/agents/{agent}"),
        format!("/v1/chats/{chat}/messages"),
    ] {
        let response = as_other(app.http.get(format!("{}{path}", app.url)))
            .send()
            .await
            .unwrap();
        assert_eq!(
            error_code(response).await,
            (404, "not_found".into()),
            "{path}"
        );
        // The owner still sees it.
        assert_eq!(app.get(&path).await.status(), 200, "{path}");
    }
    let chat_on_foreign_agent = as_other(
        app.http
            .post(format!("{}/v1/agents/{agent}/chats", app.url)),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(
        error_code(chat_on_foreign_agent).await,
        (404, "not_found".into())
    );
    let post_to_foreign_chat = as_other(
        app.http
            .post(format!("{}/v1/chats/{chat}/messages", app.url)),
    )
    .json(&json!({"content": "hi"}))
    .send()
    .await
    .unwrap();
    assert_eq!(
        error_code(post_to_foreign_chat).await,
        (404, "not_found".into())
    );
    assert!(
        app.provider.requests().is_empty(),
        "no turn ran for the other team"
    );
}

#[tokio::test]
async fn agents_are_created_and_read_back() {
    let app = TestApp::start().await;
    let created = app
        .post_json(
            "/v1/agents",
            &json!({"name": "helper", "system_prompt": "Be brief.", "model": "anthropic/claude-test",
                    "fallback_models": ["openai/gpt-test"]}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    assert_eq!(
        created["runtime_profile"], "none",
        "the default profile has no hands"
    );
    let id = created["id"].as_str().unwrap();
    let read: Value = app
        .get(&format!("/v1/agents/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(read["name"], "helper");
    assert_eq!(read["model"], "anthropic/claude-test");
    assert_eq!(read["fallback_models"], json!(["openai/gpt-test"]));
    let malformed = app.get("/v1/agents/not-a-uuid").await;
    assert_eq!(error_code(malformed).await, (404, "not_found".into()));
}

#[tokio::test]
async fn bad_bodies_get_stable_codes_and_write_nothing() {
    let app = TestApp::start().await;
    let cases = [
        json!({"name": "a", "system_prompt": "", "model": "gpt-4o"}),
        json!({"name": "a", "system_prompt": "", "model": "Google/gemini"}),
        json!({"name": "", "system_prompt": "", "model": "openai/x"}),
        json!({"name": "a", "system_prompt": "", "model": "openai/x", "runtime_profile": "gpu"}),
        json!({"name": "a", "system_prompt": "", "model": "openai/x", "temperature": 2}),
        json!({"name": "a", "model": "openai/x"}),
    ];
    for body in cases {
        let response = app.post_json("/v1/agents", &body).await;
        assert_eq!(
            error_code(response).await,
            (400, "invalid_request".into()),
            "{body}"
        );
    }
    let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM agents")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(count, 0);

    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    for body in [
        json!({"content": ""}),
        json!({"content": "hi", "extra": 1}),
        json!({"text": "hi"}),
        json!({"id": "c", "messages": [], "trigger": "submit-message"}),
        json!({"id": "c", "messages": [{"id": "m", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
               "trigger": "regenerate-message"}),
    ] {
        let response = app.send(&chat, &body).await;
        assert_eq!(
            error_code(response).await,
            (400, "invalid_request".into()),
            "{body}"
        );
    }
    // Past the body limit and the room a message's inline files have beside it (T21).
    let huge = "x".repeat(30 << 20);
    let response = app.send(&chat, &json!({ "content": huge })).await;
    assert_eq!(
        error_code(response).await,
        (413, "payload_too_large".into())
    );
    assert!(app.messages(&chat).await.is_empty());
    assert!(app.provider.requests().is_empty());
}

#[tokio::test]
async fn health_and_readiness() {
    let app = TestApp::start().await;
    let health = app
        .http
        .get(format!("{}/healthz", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let ready = app
        .http
        .get(format!("{}/readyz", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(body, json!({"postgres": true, "redis": true}));
}

#[tokio::test]
async fn a_background_task_that_ends_fails_readiness_and_is_counted() {
    let app = TestApp::start().await;
    let readyz = || app.http.get(format!("{}/readyz", app.url)).send();
    assert_eq!(readyz().await.unwrap().status(), 200);

    app.supervisor
        .spawn("test_returns", async {})
        .await
        .unwrap();
    app.supervisor
        .spawn("test_panics", async { panic!("a background task failed") })
        .await
        .unwrap();

    let ready = readyz().await.unwrap();
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(
        body,
        json!({"postgres": true, "redis": true, "stopped": ["test_returns", "test_panics"]})
    );
    let scrape = app.metrics().await;
    let exits = |task, class| {
        test_support::promtool::sample(
            &scrape,
            "brain_background_task_exits_total",
            &[("task", task), ("class", class)],
        )
    };
    assert_eq!(exits("test_returns", "returned"), Some(1.0));
    assert_eq!(exits("test_panics", "panicked"), Some(1.0));
    // The tasks `serve` started run, and are listed at 0.
    assert_eq!(exits("scheduler", "returned"), Some(0.0));
    assert_eq!(exits("events_publisher", "panicked"), Some(0.0));
}

#[tokio::test]
async fn readiness_fails_without_redis() {
    let app = TestApp::start_with(|c| c.redis_url = "redis://127.0.0.1:1".into()).await;
    let ready = app
        .http
        .get(format!("{}/readyz", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(body, json!({"postgres": true, "redis": false}));
}

#[tokio::test]
async fn admin_create_team_prints_a_working_key() {
    let app = TestApp::start().await;
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_brain"))
        .args(["admin", "create-team", "from-cli"])
        .env("DATABASE_URL", app.store_url())
        .env("SESSION_TOKEN_KEY", test_support::SESSION_TOKEN_KEY)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: Value = serde_json::from_slice(&output.stdout).unwrap();
    let key = printed["api_key"].as_str().unwrap();
    assert!(printed["team_id"].is_string());
    let response = app
        .http
        .post(format!("{}/v1/agents", app.url))
        .bearer_auth(key)
        .json(&json!({"name": "a", "system_prompt": "", "model": "openai/x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let (hashed,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM api_keys WHERE key_hash = sha256($1::bytea)")
            .bind(key.as_bytes())
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(hashed, 1, "keys are stored hashed");
    let (plain,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM api_keys WHERE encode(key_hash, 'escape') LIKE '%' || $1 || '%'",
    )
    .bind(key)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(plain, 0, "the key itself is not stored");
}

/// A brain older than the database's schema (a rollback after a newer brain migrated it)
/// would misread rows whose meaning it does not know: it refuses to serve or migrate,
/// naming both versions (O6).
#[tokio::test]
async fn a_brain_refuses_a_schema_newer_than_it_knows() {
    // A database with no schema yet is migrated, not refused.
    let empty = test_support::db::db_url(&test_support::db::fresh_database("brain_test").await);
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_brain"))
        .arg("migrate")
        .env("DATABASE_URL", &empty)
        .env("SESSION_TOKEN_KEY", test_support::SESSION_TOKEN_KEY)
        .output()
        .await
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let app = TestApp::start().await;
    let newest = store::newest_migration();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, 'from a newer brain', true, '\\x00'::bytea, 0)",
    )
    .bind(newest + 1)
    .execute(app.store.pool())
    .await
    .unwrap();
    for command in ["serve", "migrate"] {
        let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_brain"))
            .arg(command)
            .env("DATABASE_URL", app.store_url())
            .env("BRAIN_ADDR", "127.0.0.1:0")
            .env("SESSION_TOKEN_KEY", test_support::SESSION_TOKEN_KEY)
            .kill_on_drop(true)
            .output();
        // A brain that does not refuse would serve until killed.
        let output = tokio::time::timeout(std::time::Duration::from_secs(60), run)
            .await
            .unwrap_or_else(|_| panic!("`brain {command}` served a newer schema"))
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{command}: {stderr}");
        assert!(
            stderr.contains(&format!("version {}", newest + 1))
                && stderr.contains(&format!("migration {newest}")),
            "{command}: {stderr}"
        );
    }
}

#[tokio::test]
async fn bad_configuration_names_the_variable() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_brain"))
        .arg("serve")
        .env("BRAIN_ADDR", "not-an-address")
        .env("SESSION_TOKEN_KEY", test_support::SESSION_TOKEN_KEY)
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("BRAIN_ADDR"), "{stderr}");
}

/// No published key signs worker tokens: without `SESSION_TOKEN_KEY` the
/// brain refuses to start, naming it, unless in development mode, whose key is made once
/// under `.dev/` of the working directory and kept for the next start.
#[tokio::test]
async fn without_a_session_token_key_the_brain_refuses_to_start() {
    let dir = crate::common::manager::TempDir::new();
    let brain = |dev: bool| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_brain"));
        command
            .args(["admin", "create-team", "never"])
            .current_dir(&dir.0)
            .env_remove("SESSION_TOKEN_KEY")
            // Unreachable: a start that passes the configuration fails right after it.
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none");
        if dev {
            command.env("AGENT_RUNTIME_DEV", "true");
        } else {
            command.env_remove("AGENT_RUNTIME_DEV");
        }
        command.output()
    };
    let refused = brain(false).await.unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("SESSION_TOKEN_KEY"), "{stderr}");
    assert!(!dir.0.join(".dev").exists());

    let dev = brain(true).await.unwrap();
    let stderr = String::from_utf8_lossy(&dev.stderr);
    assert_ne!(dev.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("connecting to Postgres"), "{stderr}");
    let key = std::fs::read_to_string(dir.0.join(".dev/session-token-key")).unwrap();
    assert_eq!(key.len(), 64);
    brain(true).await.unwrap();
    let kept = std::fs::read_to_string(dir.0.join(".dev/session-token-key")).unwrap();
    assert_eq!(kept, key, "a restart keeps the key");
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_json_errors() {
    let app = TestApp::start().await;
    let missing = app.get("/v1/nothing-here").await;
    assert_eq!(error_code(missing).await, (404, "not_found".into()));
    let outside = app
        .http
        .get(format!("{}/nope", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(outside).await, (404, "not_found".into()));
    let wrong_method = app
        .auth(app.http.delete(format!("{}/v1/agents", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(wrong_method).await,
        (405, "method_not_allowed".into())
    );
}

/// The transcript is read a page at a time, from the newest page back, on a
/// keyset: a message written between two reads neither repeats nor skips one, and a
/// chat shorter than a page reads whole in one answer, as the web chat reads it.
#[tokio::test]
async fn the_transcript_pages_from_the_newest_back_without_gaps() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let turn = async |text: &str| {
        app.provider.push(scripted_provider::Reply::Text {
            deltas: vec![format!("re {text}")],
            delay: std::time::Duration::ZERO,
        });
        let response = app.send(&chat, &json!({ "content": text })).await;
        assert_eq!(response.status(), 200);
        common::read_stream(response).await;
    };
    for i in 0..4 {
        turn(&format!("m{i}")).await;
    }
    // An assistant message opens with a `step-start` part.
    let text = |m: &Value| -> String {
        let parts = m["parts"].as_array().unwrap();
        parts.iter().filter_map(|p| p["text"].as_str()).collect()
    };
    let page = async |query: &str| -> (Vec<String>, Option<String>) {
        let response = app.get(&format!("/v1/chats/{chat}/messages{query}")).await;
        assert_eq!(response.status(), 200, "{query}");
        let body: Value = response.json().await.unwrap();
        let texts = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(text)
            .collect();
        (texts, body["next_cursor"].as_str().map(str::to_owned))
    };
    let whole: Vec<String> = (0..4)
        .flat_map(|i| [format!("m{i}"), format!("re m{i}")])
        .collect();
    assert_eq!(page("").await, (whole.clone(), None));

    let (newest, cursor) = page("?limit=3").await;
    assert_eq!(newest, ["re m2", "m3", "re m3"]);
    // Written after the first page was read: the next pages go on from where it ended.
    turn("m4").await;
    let cursor = cursor.unwrap();
    let (middle, cursor) = page(&format!("?limit=3&before={cursor}")).await;
    assert_eq!(middle, ["m1", "re m1", "m2"]);
    let (oldest, cursor) = page(&format!("?limit=3&before={}", cursor.unwrap())).await;
    assert_eq!(oldest, ["m0", "re m0"]);
    assert_eq!(cursor, None, "the oldest page has no cursor");
    assert_eq!(page("?limit=2").await.0, ["m4", "re m4"]);

    for query in [
        "?limit=0",
        "?limit=201",
        "?before=bm90IGEgY3Vyc29y",
        "?before=",
        "?offset=2",
    ] {
        let response = app.get(&format!("/v1/chats/{chat}/messages{query}")).await;
        assert_eq!(
            error_code(response).await,
            (400, "invalid_request".into()),
            "{query}"
        );
    }
}
