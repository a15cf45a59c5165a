//! The audit log (L5): every admin change and every tool call that changes an agent is
//! written in the change's own transaction, with who (a key's id, never the key), what, on
//! which object and from where; `GET /v1/audit` pages it for admins; old entries are swept.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use engine::config::Config;
use reqwest::Method;
use serde_json::{Value, json};
use store::SecretsKey;

use crate::common::replies::{call, calls, text};
use crate::common::{TestApp, error_code, read_stream};

const KEY_HEX: &str = "8f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";
const VALUE: &str = "ghp_Aud1tS3cretValue-never-logged";
const PROMPT: &str = "You answer in riddles about the PROMPT_MARKER.";

async fn keyed_app() -> TestApp {
    TestApp::start_with(|c| c.secrets_key = Some(SecretsKey::parse(KEY_HEX).unwrap())).await
}

async fn request(
    app: &TestApp,
    bearer: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = app
        .http
        .request(method, format!("{}{path}", app.url))
        .bearer_auth(bearer);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The id of the test team's first key (the one `app.key` is).
async fn bootstrap_key_id(app: &TestApp) -> String {
    let (id,): (uuid::Uuid,) =
        sqlx::query_as("SELECT id FROM api_keys WHERE team_id = $1 AND name = 'bootstrap'")
            .bind(app.team.0)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    id.to_string()
}

/// Every entry of `query`, page by page, and the raw bodies read.
async fn all_entries(app: &TestApp, bearer: &str, query: &str) -> (Vec<Value>, String) {
    let mut entries = Vec::new();
    let mut bodies = String::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/audit?limit=200{query}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (status, body) = request(app, bearer, Method::GET, &path, None).await;
        assert_eq!(status, 200, "{body}");
        bodies.push_str(&body.to_string());
        entries.extend(body["entries"].as_array().unwrap().iter().cloned());
        match body.get("next_cursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    (entries, bodies)
}

/// The whole table, as text, for what must never be in it.
async fn table_text(app: &TestApp) -> String {
    let (text,): (Option<String>,) =
        sqlx::query_as("SELECT string_agg(a::text, ' ') FROM audit_log a")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    text.unwrap_or_default()
}

fn actions(entries: &[Value]) -> Vec<&str> {
    entries
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn admin_changes_are_logged_with_their_key_newest_first_without_secrets() {
    let app = keyed_app().await;
    let me = bootstrap_key_id(&app).await;
    let admin = app.key.clone();

    let (status, key) = request(
        &app,
        &admin,
        Method::POST,
        "/v1/keys",
        Some(json!({"name": "ci", "scope": "chat"})),
    )
    .await;
    assert_eq!(status, 201);
    let (key_id, api_key) = (
        key["id"].as_str().unwrap().to_owned(),
        key["api_key"].as_str().unwrap().to_owned(),
    );
    let path = format!("/v1/keys/{key_id}");
    assert_eq!(
        request(&app, &admin, Method::DELETE, &path, None).await.0,
        204
    );
    let quotas = json!({"tokens_per_day": 100_000});
    let (status, _) = request(&app, &admin, Method::PUT, "/v1/quotas", Some(quotas)).await;
    assert_eq!(status, 200);
    let (status, agent) = request(
        &app,
        &admin,
        Method::POST,
        "/v1/agents",
        Some(json!({"name": "a", "system_prompt": "Terse.", "model": "openai/gpt-test"})),
    )
    .await;
    assert_eq!(status, 201);
    let agent_id = agent["id"].as_str().unwrap().to_owned();
    let (status, _) = request(
        &app,
        &admin,
        Method::PATCH,
        &format!("/v1/agents/{agent_id}"),
        Some(json!({"system_prompt": PROMPT, "model": "openai/gpt-test-2"})),
    )
    .await;
    assert_eq!(status, 200);
    let secret = json!({"value": VALUE});
    let path = "/v1/secrets/AUDIT_TOKEN";
    assert_eq!(
        request(&app, &admin, Method::PUT, path, Some(secret))
            .await
            .0,
        201
    );
    assert_eq!(
        request(&app, &admin, Method::DELETE, path, None).await.0,
        204
    );
    let (status, hook) = request(
        &app,
        &admin,
        Method::POST,
        "/v1/webhooks",
        Some(json!({"url": "https://hooks.example.com/a?token=QUERY_MARKER", "events": ["turn.failed"]})),
    )
    .await;
    assert_eq!(status, 201, "{hook}");
    let (hook_id, hook_secret) = (
        hook["id"].as_str().unwrap().to_owned(),
        hook["secret"].as_str().unwrap().to_owned(),
    );
    let path = format!("/v1/webhooks/{hook_id}");
    assert_eq!(
        request(&app, &admin, Method::DELETE, &path, None).await.0,
        204
    );
    let (status, connector) = request(
        &app,
        &admin,
        Method::POST,
        "/v1/connectors",
        Some(json!({"name": "docs", "url": "https://mcp.example.com/mcp"})),
    )
    .await;
    assert_eq!(status, 201, "{connector}");
    let connector_id = connector["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/connectors/{connector_id}");
    assert_eq!(
        request(&app, &admin, Method::DELETE, &path, None).await.0,
        204
    );
    let path = format!("/v1/agents/{agent_id}");
    assert_eq!(
        request(&app, &admin, Method::DELETE, &path, None).await.0,
        204
    );

    let (entries, bodies) = all_entries(&app, &admin, "").await;
    let team = app.team.to_string();
    let expected = [
        ("agent.deleted", "agent", agent_id.as_str()),
        ("connector.deleted", "connector", connector_id.as_str()),
        ("connector.created", "connector", connector_id.as_str()),
        ("webhook.deleted", "webhook", hook_id.as_str()),
        ("webhook.created", "webhook", hook_id.as_str()),
        ("secret.deleted", "secret", "AUDIT_TOKEN"),
        ("secret.set", "secret", "AUDIT_TOKEN"),
        ("agent.updated", "agent", agent_id.as_str()),
        ("agent.created", "agent", agent_id.as_str()),
        ("quotas.set", "team", team.as_str()),
        ("key.revoked", "key", key_id.as_str()),
        ("key.created", "key", key_id.as_str()),
    ];
    // The test team's own creation comes first of all, by the operator.
    assert_eq!(entries.len(), expected.len() + 1, "{entries:#?}");
    for (entry, (action, kind, object)) in entries.iter().zip(expected) {
        assert_eq!(entry["action"], action, "{entry}");
        assert_eq!(entry["object_kind"], kind, "{entry}");
        assert_eq!(entry["object_id"], object, "{entry}");
        assert_eq!(entry["actor_kind"], "key", "{entry}");
        assert_eq!(entry["actor"], me.as_str(), "{entry}");
        assert_eq!(entry["address"], "127.0.0.1", "{entry}");
    }
    let first = entries.last().unwrap();
    assert_eq!(
        (&first["action"], &first["actor_kind"]),
        (&json!("team.created"), &json!("operator"))
    );
    let at: Vec<&str> = entries.iter().map(|e| e["at"].as_str().unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] >= w[1]), "newest first: {at:?}");
    // What changed is named, never its value.
    assert_eq!(
        entries[7]["details"]["fields"],
        json!(["system_prompt", "model"])
    );
    assert_eq!(entries[9]["details"]["fields"], json!(["tokens_per_day"]));
    assert_eq!(
        entries[11]["details"],
        json!({"name": "ci", "scope": "chat"})
    );

    let table = table_text(&app).await;
    for leak in [
        VALUE,
        api_key.as_str(),
        admin.as_str(),
        hook_secret.as_str(),
        "PROMPT_MARKER",
        "QUERY_MARKER",
    ] {
        assert!(!bodies.contains(leak), "{leak} in the answer");
        assert!(!table.contains(leak), "{leak} in the table");
    }
}

#[tokio::test]
async fn the_operators_team_changes_are_the_teams_entries() {
    let app = TestApp::start_with(|c| c.operator_token = Some(crate::auth::operator_token())).await;
    let operator = crate::teams::OPERATOR;
    let (status, created) = request(
        &app,
        operator,
        Method::POST,
        "/v1/teams",
        Some(json!({"name": "acme"})),
    )
    .await;
    assert_eq!(status, 201);
    let (team, key) = (
        created["team_id"].as_str().unwrap().to_owned(),
        created["api_key"].as_str().unwrap().to_owned(),
    );
    let path = format!("/v1/teams/{team}");
    let rename = json!({"name": "acme two"});
    assert_eq!(
        request(&app, operator, Method::PATCH, &path, Some(rename))
            .await
            .0,
        200
    );

    let (entries, bodies) = all_entries(&app, &key, "").await;
    assert_eq!(actions(&entries), ["team.updated", "team.created"]);
    for entry in &entries {
        assert_eq!(entry["actor_kind"], "operator");
        assert_eq!(entry["object_id"], team.as_str());
        assert_eq!(entry["address"], "127.0.0.1");
    }
    assert_eq!(entries[0]["details"]["name"], "acme two");
    assert!(!bodies.contains(operator) && !bodies.contains(&key));
    // The test team's log has none of another team's entries.
    let (own, _) = all_entries(&app, &app.key, "").await;
    assert_eq!(actions(&own), ["team.created"]);
}

#[tokio::test]
async fn a_tool_call_that_changes_the_agent_is_logged_as_the_turns_principal() {
    let app = keyed_app().await;
    let me = bootstrap_key_id(&app).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(calls(vec![
        call(
            "set",
            "secret_set",
            json!({"name": "GITHUB_TOKEN", "value": VALUE}),
        ),
        call(
            "cron",
            "cron_set",
            json!({"cron": "0 9 * * *", "prompt": "Morning report."}),
        ),
    ]));
    app.provider.push(text("Done."));
    let (chunks, done) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    assert!(done, "{chunks:?}");
    app.settled().await;

    let (entries, bodies) = all_entries(&app, &app.key, &format!("&object={agent}")).await;
    let mut tools: Vec<&str> = actions(&entries)[..2].to_vec();
    tools.sort_unstable();
    assert_eq!(tools, ["tool.cron_set", "tool.secret_set"], "{entries:#?}");
    assert_eq!(actions(&entries)[2], "agent.created");
    for entry in &entries[..2] {
        assert_eq!(entry["actor_kind"], "key");
        assert_eq!(entry["actor"], me.as_str());
        assert_eq!(entry["object_kind"], "agent");
        assert!(
            entry.get("address").is_none(),
            "the model made the call: {entry}"
        );
    }
    let secret_set = entries
        .iter()
        .find(|e| e["action"] == "tool.secret_set")
        .unwrap();
    assert_eq!(secret_set["details"], json!({"secret": "GITHUB_TOKEN"}));
    assert!(!bodies.contains(VALUE));
    assert!(!table_text(&app).await.contains(VALUE));
}

#[tokio::test]
async fn only_an_admin_reads_the_audit_log() {
    let app = TestApp::start().await;
    let (status, key) = request(
        &app,
        &app.key,
        Method::POST,
        "/v1/keys",
        Some(json!({"name": "chat", "scope": "chat"})),
    )
    .await;
    assert_eq!(status, 201);
    let chat_key = key["api_key"].as_str().unwrap();
    let refused = app
        .http
        .get(format!("{}/v1/audit", app.url))
        .bearer_auth(chat_key)
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(refused).await, (403, "forbidden".to_owned()));
    let anonymous = app
        .http
        .get(format!("{}/v1/audit", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
}

#[tokio::test]
async fn the_audit_log_pages_newest_first_and_filters_by_object_and_actor() {
    let app = TestApp::start().await;
    let mut agents = Vec::new();
    for n in 0..5 {
        let (status, agent) = request(
            &app,
            &app.key,
            Method::POST,
            "/v1/agents",
            Some(json!({"name": format!("a{n}"), "system_prompt": "Terse.", "model": "openai/gpt-test"})),
        )
        .await;
        assert_eq!(status, 201);
        agents.push(agent["id"].as_str().unwrap().to_owned());
    }
    let (_, second) = request(
        &app,
        &app.key,
        Method::POST,
        "/v1/keys",
        Some(json!({"name": "second", "scope": "admin"})),
    )
    .await;
    let (second_id, second_key) = (
        second["id"].as_str().unwrap().to_owned(),
        second["api_key"].as_str().unwrap().to_owned(),
    );
    let (status, _) = request(
        &app,
        &second_key,
        Method::PATCH,
        &format!("/v1/agents/{}", agents[2]),
        Some(json!({"model": "openai/gpt-test-2"})),
    )
    .await;
    assert_eq!(status, 200);

    // Two at a time: every entry once, newest first, and no cursor after the last page.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = "/v1/audit?limit=2".to_owned();
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (status, page) = request(&app, &app.key, Method::GET, &path, None).await;
        assert_eq!(status, 200, "{page}");
        let entries = page["entries"].as_array().unwrap();
        assert!(entries.len() <= 2);
        seen.extend(entries.iter().cloned());
        pages += 1;
        match page.get("next_cursor") {
            Some(next) => cursor = Some(next.as_str().unwrap().to_owned()),
            None => break,
        }
    }
    let (all, _) = all_entries(&app, &app.key, "").await;
    assert_eq!(all.len(), 8, "team, five agents, a key, an update");
    assert_eq!(seen, all);
    assert_eq!(pages, 4);
    assert_eq!(
        actions(&all),
        [
            "agent.updated",
            "key.created",
            "agent.created",
            "agent.created",
            "agent.created",
            "agent.created",
            "agent.created",
            "team.created"
        ]
    );
    assert_eq!(all[2]["object_id"], agents[4].as_str());

    let (about, _) = all_entries(&app, &app.key, &format!("&object={}", agents[2])).await;
    assert_eq!(actions(&about), ["agent.updated", "agent.created"]);
    let (by_second, _) = all_entries(&app, &app.key, &format!("&actor={second_id}")).await;
    assert_eq!(actions(&by_second), ["agent.updated"]);
    let both = format!("&actor={second_id}&object={}", agents[1]);
    assert!(all_entries(&app, &app.key, &both).await.0.is_empty());

    // Bad paging and filters are the caller's to fix.
    let keys_cursor = {
        let (_, page) = request(&app, &app.key, Method::GET, "/v1/keys?limit=1", None).await;
        page["next_cursor"].as_str().unwrap().to_owned()
    };
    for query in [
        "limit=0".to_owned(),
        "limit=201".to_owned(),
        "cursor=nonsense".to_owned(),
        format!("cursor={keys_cursor}"),
        "object=".to_owned(),
        format!("actor={}", "x".repeat(513)),
        // Postgres text cannot hold a NUL: such a filter is the caller's error, not a 500
        // (schemathesis found it).
        "object=%25%07y%00".to_owned(),
        "actor=a%00b".to_owned(),
        "offset=2".to_owned(),
    ] {
        let response = app.get(&format!("/v1/audit?{query}")).await;
        assert_eq!(
            error_code(response).await,
            (400, "invalid_request".to_owned()),
            "{query}"
        );
    }
}

#[tokio::test]
async fn an_entry_exists_exactly_when_its_change_does() {
    let app = keyed_app().await;
    let connector = json!({"name": "docs", "url": "https://mcp.example.com/mcp"});
    let (status, _) = request(
        &app,
        &app.key,
        Method::POST,
        "/v1/connectors",
        Some(connector.clone()),
    )
    .await;
    assert_eq!(status, 201);
    // A change that fails in its transaction (the name is taken) leaves no entry.
    let (status, _) = request(
        &app,
        &app.key,
        Method::POST,
        "/v1/connectors",
        Some(connector),
    )
    .await;
    assert_eq!(status, 409);
    let (entries, _) = all_entries(&app, &app.key, "").await;
    assert_eq!(actions(&entries), ["connector.created", "team.created"]);

    // An entry that cannot be written takes its change with it.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN RAISE EXCEPTION 'audit refused'; END $$; \
         CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_log \
           FOR EACH ROW EXECUTE FUNCTION refuse_audit();",
    )
    .execute(app.store.pool())
    .await
    .unwrap();
    let hook = json!({"url": "https://hooks.example.com/a", "events": ["turn.failed"]});
    let (status, _) = request(&app, &app.key, Method::POST, "/v1/webhooks", Some(hook)).await;
    assert_eq!(status, 503);
    let agent = json!({"name": "b", "system_prompt": "Terse.", "model": "openai/gpt-test"});
    let (status, _) = request(&app, &app.key, Method::POST, "/v1/agents", Some(agent)).await;
    assert_eq!(status, 503);
    let secret = json!({"value": VALUE});
    let (status, _) = request(
        &app,
        &app.key,
        Method::PUT,
        "/v1/secrets/NOPE",
        Some(secret),
    )
    .await;
    assert_eq!(status, 503);
    for table in ["webhooks", "agents", "team_secrets"] {
        let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE team_id = $1"
        )))
        .bind(app.team.0)
        .fetch_one(app.store.pool())
        .await
        .unwrap();
        assert_eq!(n, 0, "{table}");
    }
    sqlx::raw_sql("DROP TRIGGER refuse_audit ON audit_log")
        .execute(app.store.pool())
        .await
        .unwrap();
    let (entries, _) = all_entries(&app, &app.key, "").await;
    assert_eq!(entries.len(), 2);
}

#[tokio::test]
async fn entries_older_than_the_retention_are_swept() {
    let app = TestApp::start().await;
    for (object, days) in [("expired", 31), ("kept", 29)] {
        sqlx::query(
            "INSERT INTO audit_log (id, team_id, created_at, actor_kind, actor, action, \
               object_kind, object_id) \
             VALUES ($1, $2, now() - make_interval(days => $3), 'key', 'k', 'key.created', \
               'key', $4)",
        )
        .bind(uuid::Uuid::now_v7())
        .bind(app.team.0)
        .bind(days)
        .bind(object)
        .execute(app.store.pool())
        .await
        .unwrap();
    }
    // The first replica swept at its start, under the default 400 days: both are there.
    let objects = || async {
        let (entries, _) = all_entries(&app, &app.key, "").await;
        entries
            .iter()
            .map(|e| e["object_id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert!(objects().await.contains(&"expired".to_owned()));
    // A replica keeping 30 days sweeps as it starts.
    app.second_replica_with(|c| c.audit_retention_days = 30)
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = objects().await;
        if !now.contains(&"expired".to_owned()) {
            assert!(now.contains(&"kept".to_owned()), "{now:?}");
            assert!(now.contains(&app.team.to_string()), "{now:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not swept: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn the_retention_is_a_positive_number_of_days() {
    let env = |value: Option<&str>| {
        let mut env: HashMap<String, String> = HashMap::new();
        env.insert(
            "SESSION_TOKEN_KEY".into(),
            test_support::SESSION_TOKEN_KEY.into(),
        );
        if let Some(v) = value {
            env.insert("BRAIN_AUDIT_RETENTION_DAYS".into(), v.into());
        }
        Config::from_env(&env)
    };
    assert_eq!(env(None).unwrap().audit_retention_days, 400);
    assert_eq!(env(Some("30")).unwrap().audit_retention_days, 30);
    for bad in ["0", "-1", "1.5", "forever", "36501"] {
        let err = env(Some(bad)).unwrap_err();
        assert_eq!(err.name, "BRAIN_AUDIT_RETENTION_DAYS", "{bad}");
    }
}

/// A grant bound by the OAuth callback (against the real authorization server of
/// `tests/oauth`) is logged as whoever began its flow: a user's turn, the admin key's turn,
/// a user through the API; from the callback's address. Deleting the connector logs each
/// of its grants revoked. No token, code or state is in the log.
#[tokio::test]
async fn grants_bound_and_revoked_are_logged_as_who_began_them_without_tokens() {
    use crate::connector_oauth::{user_token, world};
    use protocol::ui::ConnectorState;

    let w = world().await;
    let app = &w.app;
    let me = bootstrap_key_id(app).await;
    // Bob's turn asks for his authorization; he consents.
    let bob = user_token(app, "bob", false);
    let bobs = w.chat(&bob).await;
    let (status, _) = w.turn(&bob, &bobs).await;
    assert_eq!(status.state, ConnectorState::NeedsAuthorization);
    let url = w.follow(&bob, status.authorize.as_deref().unwrap()).await;
    let (_, connected) = w.browser.consent(app, &url).await;
    assert_eq!(connected.status(), 200);
    // A turn of the admin key's chat asks for the connector's own.
    let keys = w.chat(&app.key).await;
    let (status, _) = w.turn(&app.key, &keys).await;
    assert_eq!(status.state, ConnectorState::NeedsAuthorization);
    let url = w
        .follow(&app.key, status.authorize.as_deref().unwrap())
        .await;
    let (callback_url, connected) = w.browser.consent(app, &url).await;
    assert_eq!(connected.status(), 200);
    // Alice authorizes for herself through the API.
    let alice = user_token(app, "alice", false);
    let (status, body) = w.authorize(&alice).await;
    assert_eq!(status, 200, "{body}");
    let (_, connected) = w
        .browser
        .consent(app, body["authorization_url"].as_str().unwrap())
        .await;
    assert_eq!(connected.status(), 200);

    let (entries, _) = all_entries(app, &app.key, "").await;
    let bound: Vec<(&str, &str, &Value)> = entries
        .iter()
        .filter(|e| e["action"] == "grant.bound")
        .map(|e| {
            assert_eq!(e["object_kind"], "connector", "{e}");
            assert_eq!(e["object_id"], w.connector.as_str(), "{e}");
            assert_eq!(e["address"], "127.0.0.1", "the callback's: {e}");
            (
                e["actor_kind"].as_str().unwrap(),
                e["actor"].as_str().unwrap(),
                &e["details"],
            )
        })
        .collect();
    assert_eq!(
        bound,
        [
            ("user", "alice", &json!({"user": "alice"})),
            ("key", me.as_str(), &json!({"user": null})),
            ("user", "bob", &json!({"user": "bob"})),
        ]
    );

    // A replayed callback binds nothing and logs nothing.
    let query = callback_url.split_once('?').unwrap().1;
    let replayed = app
        .http
        .get(format!("{}/v1/oauth/callback?{query}", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(replayed.status(), 400);

    let path = format!("/v1/connectors/{}", w.connector);
    assert_eq!(
        request(app, &app.key, Method::DELETE, &path, None).await.0,
        204
    );
    let object = format!("&object={}", w.connector);
    let (entries, bodies) = all_entries(app, &app.key, &object).await;
    assert_eq!(
        actions(&entries),
        [
            "connector.deleted",
            "grant.revoked",
            "grant.revoked",
            "grant.revoked",
            "grant.bound",
            "grant.bound",
            "grant.bound",
            "connector.created",
        ]
    );
    let mut revoked: Vec<Value> = entries[1..4]
        .iter()
        .map(|e| {
            assert_eq!(
                (e["actor_kind"].as_str(), e["actor"].as_str()),
                (Some("key"), Some(me.as_str()))
            );
            assert_eq!(e["address"], "127.0.0.1");
            e["details"]["user"].clone()
        })
        .collect();
    revoked.sort_by_key(Value::to_string);
    assert_eq!(revoked, [json!("alice"), json!("bob"), Value::Null]);

    let table = table_text(app).await;
    let ledger = w.auth.ledger();
    assert!(!ledger.issued_access.is_empty() && !ledger.issued_refresh.is_empty());
    let state = query
        .split('&')
        .find_map(|p| p.strip_prefix("state="))
        .unwrap();
    for leak in ledger
        .issued_access
        .iter()
        .chain(&ledger.issued_refresh)
        .map(String::as_str)
        .chain([state])
    {
        assert!(!bodies.contains(leak), "a token in the answer");
        assert!(!table.contains(leak), "a token in the table");
    }
}

/// Deleting an agent deletes the grants of the connectors bound to it: each is logged
/// revoked, in the agent's deletion's transaction.
#[tokio::test]
async fn an_agents_deletion_logs_its_connectors_grants_revoked() {
    let app = keyed_app().await;
    let me = bootstrap_key_id(&app).await;
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (status, connector) = request(
        &app,
        &app.key,
        Method::POST,
        "/v1/connectors",
        Some(json!({"name": "docs", "url": "https://mcp.example.com/mcp", "agent_id": agent})),
    )
    .await;
    assert_eq!(status, 201, "{connector}");
    let connector = connector["id"].as_str().unwrap().to_owned();
    // The grant's sealed content is never read on the way out: any bytes do.
    sqlx::query(
        "INSERT INTO connector_grants (id, team_id, connector_id, user_id, nonce, ciphertext) \
         VALUES (gen_random_uuid(), $1, $2::uuid, 'carol', '\\x00', '\\x00')",
    )
    .bind(app.team.0)
    .bind(&connector)
    .execute(app.store.pool())
    .await
    .unwrap();
    let path = format!("/v1/agents/{agent}");
    assert_eq!(
        request(&app, &app.key, Method::DELETE, &path, None).await.0,
        204
    );
    let (entries, _) = all_entries(&app, &app.key, &format!("&object={connector}")).await;
    assert_eq!(
        actions(&entries),
        ["grant.revoked", "connector.created"],
        "{entries:#?}"
    );
    assert_eq!(entries[0]["actor"], me.as_str());
    assert_eq!(entries[0]["details"], json!({"user": "carol"}));
}

/// L5 behind a proxy: with the test client's loopback as `BRAIN_TRUSTED_PROXIES`, the
/// entry names the client its `X-Forwarded-For` gives (past the trusted hops); on a brain
/// that trusts no proxy the same header is the client's own and the peer is recorded.
#[tokio::test]
async fn a_trusted_proxys_forwarded_for_names_the_address_and_no_one_elses_does() {
    for (trusted, expected) in [
        (vec!["127.0.0.0/8".parse().unwrap()], "203.0.113.7"),
        (Vec::new(), "127.0.0.1"),
    ] {
        let app = TestApp::start_with(|c| c.trusted_proxies = trusted).await;
        let created = app
            .http
            .post(format!("{}/v1/keys", app.url))
            .bearer_auth(&app.key)
            .header("x-forwarded-for", "198.51.100.9, 203.0.113.7")
            .header("x-forwarded-for", "127.0.0.2")
            .json(&json!({"name": "behind a proxy", "scope": "chat"}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), 201);
        let (entries, _) = all_entries(&app, &app.key, "").await;
        assert_eq!(entries[0]["action"], "key.created", "{entries:#?}");
        assert_eq!(entries[0]["address"], expected, "{entries:#?}");
    }
}
