//! Erasure (L2): a deleted chat, agent or team leaves nothing of itself in Postgres (no
//! row that names it, no row holding its text), in Redis (no key naming it), in the
//! artifact store or in the worker's workspace directory; only usage records stay.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use store::SecretsKey;
use uuid::Uuid;

use crate::common::replies::text;
use crate::common::{TestApp, error_code, light_agent, read_stream};
use crate::teams::as_operator;
use crate::workers::{call, output_of, system};

/// Every table of the schema with a column named `column`.
async fn tables_with(app: &TestApp, column: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.columns
         WHERE table_schema = 'public' AND column_name = $1 ORDER BY 1",
    )
    .bind(column)
    .fetch_all(app.store.pool())
    .await
    .unwrap()
}

/// The tables (but `except`) that still have a row whose `column` is `id`.
async fn rows_naming(app: &TestApp, column: &str, id: &str, except: &[&str]) -> Vec<String> {
    let mut left = Vec::new();
    for table in tables_with(app, column).await {
        if except.contains(&table.as_str()) {
            continue;
        }
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE {column}::text = $1"
        )))
        .bind(id)
        .fetch_one(app.store.pool())
        .await
        .unwrap();
        if n > 0 {
            left.push(format!("{table}: {n}"));
        }
    }
    left
}

/// The tables with a row whose text holds `marker` anywhere.
async fn rows_holding(app: &TestApp, marker: &str) -> Vec<String> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    let mut holding = Vec::new();
    for table in tables {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} x WHERE x::text LIKE '%' || $1 || '%'"
        )))
        .bind(marker)
        .fetch_one(app.store.pool())
        .await
        .unwrap();
        if n > 0 {
            holding.push(table);
        }
    }
    holding
}

/// The Redis keys whose name holds `id`.
async fn redis_keys_naming(id: &str) -> Vec<String> {
    let mut redis = redis::Client::open(
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
    )
    .unwrap()
    .get_multiplexed_async_connection()
    .await
    .unwrap();
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("*{id}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut redis)
            .await
            .unwrap();
        keys.extend(page);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// Every file under `dir`, recursively.
pub(crate) fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                found.extend(files_under(&path));
            } else {
                found.push(path);
            }
        }
    }
    found
}

/// Waits up to `within` for `check` to hold.
pub(crate) async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The artifact directory of `app` (`BRAIN_ARTIFACTS_DIR`, as `TestApp` sets it).
pub(crate) fn artifacts_dir(app: &TestApp) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("brain-test-artifacts-{}", app.db_name))
}

/// A workspace snapshot of `chat` as an idle teardown stores it: its row and its bytes.
pub(crate) async fn stored_snapshot(
    app: &TestApp,
    agent: &str,
    chat: &str,
    session: Uuid,
) -> String {
    let id = Uuid::new_v4();
    let key = format!("{}/{id}", app.team);
    let path = artifacts_dir(app).join(&key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"snapshot bytes").unwrap();
    sqlx::query(
        "INSERT INTO workspace_snapshots
           (id, team_id, agent_id, chat_id, session_id, storage_key, size_bytes, unpacked_bytes)
         VALUES ($1, $2, $3::uuid, $4::uuid, $5, $6, 14, 14)",
    )
    .bind(id)
    .bind(app.team.0)
    .bind(agent)
    .bind(chat)
    .bind(session)
    .bind(&key)
    .execute(app.store.pool())
    .await
    .unwrap();
    key
}

/// An approval of `chat`'s last turn, as a tool call waiting for a person leaves it.
async fn pending_approval(app: &TestApp, chat: &str, marker: &str) {
    sqlx::query(
        "INSERT INTO approvals (id, team_id, agent_id, chat_id, turn_id, message_id, part_index,
                                tool_call_id, tool, input, state, expires_at)
         SELECT gen_random_uuid(), t.team_id, t.agent_id, t.chat_id, t.id, m.id, 0, 'call',
                'shell', jsonb_build_object('command', $2::text), 'pending', now() + interval '1 hour'
         FROM turns t JOIN messages m ON m.turn_id = t.id
         WHERE t.chat_id = $1::uuid ORDER BY m.seq DESC LIMIT 1",
    )
    .bind(chat)
    .bind(marker)
    .execute(app.store.pool())
    .await
    .unwrap();
}

#[tokio::test]
async fn an_erased_chat_leaves_nothing_in_postgres_redis_the_artifact_store_or_the_workspace() {
    let (app, manager) = system(60_000, |_| {}).await;
    let (agent, chat) = light_agent(&app).await;
    let kept = app.new_chat(&agent).await;
    let marker = format!("erase-me-{}", Uuid::new_v4().simple());

    // A turn with a worker: a file in its workspace, uploaded as an artifact.
    app.provider.push(call(
        "w",
        "write_file",
        json!({"path": "notes.txt", "content": marker}),
    ));
    app.provider
        .push(call("u", "upload_artifact", json!({"path": "notes.txt"})));
    app.provider.push(text(&format!("stored {marker}")));
    let (chunks, _) = read_stream(
        app.send(&chat, &json!({"content": format!("keep {marker}")}))
            .await,
    )
    .await;
    let stored = output_of(&chunks, "u");
    assert!(stored.starts_with("stored artifact "), "{stored}");
    app.settled().await;
    let session: Uuid = sqlx::query_scalar(
        "SELECT id FROM agent_runtime_sessions WHERE chat_id = $1::uuid AND state = 'ready'",
    )
    .bind(&chat)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    let workspace = manager.workspaces().join(session.to_string());
    assert!(workspace.join("notes.txt").exists());
    let snapshot_key = stored_snapshot(&app, &agent, &chat, session).await;
    pending_approval(&app, &chat, &marker).await;
    app.provider.push(text("the other chat's reply"));
    read_stream(app.send(&kept, &json!({"content": "stay"})).await).await;
    app.settled().await;
    assert!(
        !redis_keys_naming(&chat).await.is_empty(),
        "its events stream"
    );
    assert_eq!(files_under(&artifacts_dir(&app)).len(), 2);
    let billed: i64 = sqlx::query_scalar("SELECT count(*) FROM billing_events")
        .fetch_one(app.store.pool())
        .await
        .unwrap();

    let erased = app
        .auth(app.http.delete(format!("{}/v1/chats/{chat}", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 204);
    let again = app
        .auth(app.http.delete(format!("{}/v1/chats/{chat}", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(again).await, (404, "not_found".into()));
    let messages = app.get(&format!("/v1/chats/{chat}/messages")).await;
    assert_eq!(error_code(messages).await, (404, "not_found".into()));

    // Postgres: no row names the chat, none holds its text; usage stays.
    assert_eq!(
        rows_naming(&app, "chat_id", &chat, &[]).await,
        Vec::<String>::new()
    );
    assert_eq!(
        rows_naming(&app, "id", &chat, &[]).await,
        Vec::<String>::new()
    );
    assert_eq!(rows_holding(&app, &marker).await, Vec::<String>::new());
    let billed_after: i64 = sqlx::query_scalar("SELECT count(*) FROM billing_events")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(billed_after, billed, "usage records stay");
    // Redis: its events stream is gone.
    assert_eq!(redis_keys_naming(&chat).await, Vec::<String>::new());
    // The artifact store: the artifact's and the snapshot's bytes, and nothing queued.
    let files = files_under(&artifacts_dir(&app));
    assert!(files.is_empty(), "{files:?} (snapshot {snapshot_key})");
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM blob_garbage")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(queued, 0);
    // The worker: stopped by the runtime-manager's next pass, its workspace removed.
    eventually(Duration::from_secs(15), "the workspace is removed", || {
        let gone = !workspace.exists();
        async move { gone }
    })
    .await;

    // The other chat is whole.
    let kept_messages = app.messages(&kept).await;
    assert_eq!(kept_messages.len(), 2, "{kept_messages:?}");
}

/// With the artifacts in S3 (s3s-fs, a real S3-protocol server), an erased chat's bytes
/// leave the bucket, and another chat's stay.
#[tokio::test]
async fn an_erased_chats_bytes_leave_the_s3_bucket() {
    use crate::artifacts::{BUCKET, S3sFs, SECRET_KEY};
    let server = S3sFs::start();
    let s3 = server.config(SECRET_KEY);
    let app = TestApp::start_with(|c| {
        c.artifacts.backend = engine::config::ArtifactBackend::S3(s3.clone());
    })
    .await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let kept = app.new_chat(&agent).await;
    let backend = engine::artifacts::S3Store::new(&s3);
    let mut keys = Vec::new();
    for on in [&chat, &kept] {
        let owner = engine::artifacts::ArtifactOwner {
            team: app.team,
            agent: protocol::AgentId(agent.parse().unwrap()),
            chat: Some(protocol::ChatId(on.parse().unwrap())),
            turn: None,
        };
        let row = engine::artifacts::save_artifact(
            &app.store,
            &backend,
            1 << 20,
            owner,
            "notes.txt",
            "text/plain",
            bytes::Bytes::from_static(b"in the bucket"),
        )
        .await
        .unwrap();
        keys.push(format!("{}/{}", app.team, row.id));
    }
    let bucket = server.root.0.join(BUCKET);
    assert!(bucket.join(&keys[0]).is_file() && bucket.join(&keys[1]).is_file());

    let erased = app
        .auth(app.http.delete(format!("{}/v1/chats/{chat}", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 204);
    assert!(
        !bucket.join(&keys[0]).exists(),
        "the erased chat's bytes left the bucket"
    );
    assert!(bucket.join(&keys[1]).is_file(), "the other chat's stay");
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM blob_garbage")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(queued, 0);
}

/// A user token erases the chats its user opened, and no other; a chat-scoped key none.
#[tokio::test]
async fn a_chat_is_erased_by_an_admin_or_the_user_who_opened_it() {
    const SECRET: &str = "a-test-only-hs256-secret-of-at-least-32-bytes";
    let jwt = engine::auth::JwtConfig::from_env(&envcfg::vars(&[
        ("BRAIN_JWT_ISSUER", "https://id.test.example"),
        ("BRAIN_JWT_AUDIENCE", "agent-runtime"),
        ("BRAIN_JWT_HS256_SECRET", SECRET),
    ]))
    .unwrap();
    let app = TestApp::start_with(|c| c.jwt = jwt).await;
    let token = |user: &str, admin: bool| {
        let now = chrono::Utc::now().timestamp();
        let claims = json!({
            "iss": "https://id.test.example", "aud": "agent-runtime", "iat": now,
            "exp": now + 600, "sub": user, "team_id": app.team.to_string(), "admin": admin,
        });
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
        )
        .unwrap()
    };
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let open = |bearer: String| {
        let app = &app;
        let agent = agent.clone();
        async move {
            let created: Value = app
                .http
                .post(format!("{}/v1/agents/{agent}/chats", app.url))
                .bearer_auth(bearer)
                .json(&json!({}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            created["id"].as_str().unwrap().to_owned()
        }
    };
    let erase = |bearer: String, chat: String| {
        let app = &app;
        async move {
            app.http
                .delete(format!("{}/v1/chats/{chat}", app.url))
                .bearer_auth(bearer)
                .send()
                .await
                .unwrap()
        }
    };
    let alices = open(token("alice", false)).await;
    let bobs = open(token("bob", false)).await;
    let chat_key = app.chat_key().await;

    // Bob does not see Alice's chat; a chat key sees it but may not erase it.
    let response = erase(token("bob", false), alices.clone()).await;
    assert_eq!(error_code(response).await, (404, "not_found".into()));
    let response = erase(chat_key, alices.clone()).await;
    assert_eq!(error_code(response).await, (403, "forbidden".into()));
    assert_eq!(
        erase(token("alice", false), alices.clone()).await.status(),
        204
    );
    assert_eq!(
        erase(token("carol", true), bobs.clone()).await.status(),
        204
    );
    for chat in [alices, bobs] {
        let gone = app.get(&format!("/v1/chats/{chat}/messages")).await;
        assert_eq!(error_code(gone).await, (404, "not_found".into()));
    }
}

#[tokio::test]
async fn an_erased_agent_takes_its_chats_memories_secrets_schedule_and_connectors() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (other, other_chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let marker = format!("erase-me-{}", Uuid::new_v4().simple());
    for chat in [&chat, &other_chat] {
        app.provider.push(text(&format!("noted {marker}")));
        read_stream(app.send(chat, &json!({"content": marker})).await).await;
    }
    let second = app.new_chat(&agent).await;
    app.provider.push(text("second"));
    read_stream(app.send(&second, &json!({"content": "again"})).await).await;
    app.settled().await;
    let schedule = app
        .auth(app.http.patch(format!("{}/v1/agents/{agent}", app.url)))
        .json(&json!({"autostart_cron": "0 9 * * *", "autostart_prompt": marker}))
        .send()
        .await
        .unwrap();
    assert_eq!(schedule.status(), 200);
    for sql in [
        "INSERT INTO memories (id, team_id, agent_id, content)
         VALUES (gen_random_uuid(), $1, $2::uuid, $3)",
        "INSERT INTO secrets (id, team_id, agent_id, name, nonce, ciphertext)
         VALUES (gen_random_uuid(), $1, $2::uuid, 'TOKEN', '\\x00', convert_to($3, 'UTF8'))",
        "INSERT INTO connectors (id, team_id, agent_id, name, url)
         VALUES (gen_random_uuid(), $1, $2::uuid, 'docs', 'https://mcp.example/' || $3)",
        "INSERT INTO scheduled_tasks (id, team_id, agent_id, kind, due_at, state)
         VALUES (gen_random_uuid(), $1, $2::uuid, 'autostart', now() + interval '1 day', 'pending')",
    ] {
        sqlx::query(sql)
            .bind(app.team.0)
            .bind(&agent)
            .bind(&marker)
            .execute(app.store.pool())
            .await
            .unwrap();
    }

    let chat_key = app.chat_key().await;
    let refused = app
        .http
        .delete(format!("{}/v1/agents/{agent}", app.url))
        .bearer_auth(&chat_key)
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(refused).await, (403, "forbidden".into()));

    let erased = app
        .auth(app.http.delete(format!("{}/v1/agents/{agent}", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 204);
    let read = app.get(&format!("/v1/agents/{agent}")).await;
    assert_eq!(error_code(read).await, (404, "not_found".into()));
    let again = app
        .auth(app.http.delete(format!("{}/v1/agents/{agent}", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(again).await, (404, "not_found".into()));

    // Nothing names it but its usage; its text is nowhere but in the other agent's chat.
    assert_eq!(
        rows_naming(&app, "agent_id", &agent, &["billing_events"]).await,
        Vec::<String>::new()
    );
    assert_eq!(
        rows_naming(&app, "id", &agent, &[]).await,
        Vec::<String>::new()
    );
    for chat in [&chat, &second] {
        assert_eq!(
            rows_naming(&app, "chat_id", chat, &[]).await,
            Vec::<String>::new()
        );
        assert_eq!(redis_keys_naming(chat).await, Vec::<String>::new());
    }
    let billed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM billing_events WHERE agent_id = $1::uuid")
            .bind(&agent)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert!(billed > 0, "usage records stay");
    assert_eq!(
        rows_holding(&app, &marker).await,
        vec!["messages".to_owned()],
        "only the other agent's chat holds the text"
    );
    assert_eq!(app.messages(&other_chat).await.len(), 2);
    let read = app.get(&format!("/v1/agents/{other}")).await;
    assert_eq!(read.status(), 200);
}

/// The operator's API, and a secrets key for the teams' webhooks.
async fn operator_app() -> TestApp {
    TestApp::start_with(|c| {
        c.operator_token = Some(crate::auth::operator_token());
        c.secrets_key = Some(SecretsKey::parse(crate::webhooks::KEY_HEX).unwrap());
    })
    .await
}

/// What a team holds, made through its own key: an agent with a chat and a turn, a
/// webhook, a team secret, a provider connection, a knowledge base with a document.
async fn populated_team(app: &TestApp, marker: &str) -> (String, String) {
    let created = as_operator(
        app,
        Method::POST,
        "/v1/teams",
        Some(json!({"name": "leaving"})),
    )
    .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let team = created["team_id"].as_str().unwrap().to_owned();
    let key = created["api_key"].as_str().unwrap().to_owned();
    let post = |path: &str, body: Value| {
        app.http
            .post(format!("{}{path}", app.url))
            .bearer_auth(&key)
            .json(&body)
            .send()
    };
    let agent: Value = post(
        "/v1/agents",
        json!({"name": "a", "system_prompt": marker, "model": "openai/gpt-test"}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let agent = agent["id"].as_str().unwrap();
    let chat: Value = post(&format!("/v1/agents/{agent}/chats"), json!({}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let chat = chat["id"].as_str().unwrap();
    app.provider.push(text(&format!("reply {marker}")));
    let turn = post(
        &format!("/v1/chats/{chat}/messages"),
        json!({"content": marker}),
    )
    .await
    .unwrap();
    read_stream(turn).await;
    let hook = post(
        "/v1/webhooks",
        json!({"url": "https://hooks.example/in", "events": ["turn.completed"]}),
    )
    .await
    .unwrap();
    assert_eq!(hook.status(), 201);
    // A provider connection (T14) with a sealed key, at a public address never called.
    let provider = post(
        "/v1/providers",
        json!({"name": "own", "kind": "openai", "base_url": "https://llm.example.com/v1",
               "api_key": "sk-erased-1234"}),
    )
    .await
    .unwrap();
    assert_eq!(provider.status(), 201);
    // A knowledge base (B3) with a document that holds the marker.
    let base: Value = post("/v1/knowledge", json!({"name": marker}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let base = base["id"].as_str().unwrap();
    let boundary = "erasure-boundary";
    let document = app
        .http
        .post(format!("{}/v1/knowledge/{base}/documents", app.url))
        .bearer_auth(&key)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; \
             filename=\"notes.md\"\r\n\r\n# Notes\n\n{marker}\r\n--{boundary}--\r\n"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(document.status(), 202);
    (team, key)
}

/// Waits for `team` to be `erased`, then finds no row of it but its usage, and its
/// `marker` text nowhere.
async fn erased_whole(app: &TestApp, team: &str, marker: &str) {
    eventually(Duration::from_secs(20), "the team is erased", || async {
        let read: Value = as_operator(app, Method::GET, &format!("/v1/teams/{team}"), None)
            .await
            .json()
            .await
            .unwrap();
        read["status"] == "erased"
    })
    .await;
    assert_eq!(
        rows_naming(app, "team_id", team, &["billing_events"]).await,
        Vec::<String>::new()
    );
    assert_eq!(rows_holding(app, marker).await, Vec::<String>::new());
}

#[tokio::test]
async fn an_erased_team_is_taken_in_the_background_and_only_its_row_and_usage_stay() {
    let app = operator_app().await;
    let marker = format!("erase-me-{}", Uuid::new_v4().simple());
    let (team, key) = populated_team(&app, &marker).await;
    let usage: i64 =
        sqlx::query_scalar("SELECT count(*) FROM billing_events WHERE team_id = $1::uuid")
            .bind(&team)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert!(usage > 0);

    let asked = as_operator(&app, Method::DELETE, &format!("/v1/teams/{team}"), None).await;
    assert_eq!(asked.status(), 202);
    let asked: Value = asked.json().await.unwrap();
    assert!(
        ["erasing", "erased"].contains(&asked["status"].as_str().unwrap()),
        "{asked}"
    );
    // Its key is refused at once.
    let refused = app
        .http
        .get(format!("{}/v1/agents", app.url))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert!([401, 403].contains(&refused.status().as_u16()));

    erased_whole(&app, &team, &marker).await;
    let after: i64 =
        sqlx::query_scalar("SELECT count(*) FROM billing_events WHERE team_id = $1::uuid")
            .bind(&team)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(after, usage, "usage records stay");
    assert_eq!(
        redis_keys_naming(&format!("quota:{{{team}}}")).await,
        Vec::<String>::new()
    );
    // The operator cannot enable it again; asking to erase it again is harmless.
    let enable = as_operator(
        &app,
        Method::PATCH,
        &format!("/v1/teams/{team}"),
        Some(json!({"disabled": false})),
    )
    .await;
    assert_eq!(error_code(enable).await, (409, "conflict".into()));
    let again = as_operator(&app, Method::DELETE, &format!("/v1/teams/{team}"), None).await;
    assert_eq!(again.status(), 202);
}

/// A replica that died part way through an erasure held its lease: once the lease lapses,
/// another replica takes the erasure over and finishes it.
#[tokio::test]
async fn a_team_erasure_cut_off_by_a_dead_replica_is_finished_by_another() {
    let app = operator_app().await;
    let marker = format!("erase-me-{}", Uuid::new_v4().simple());
    let (team, _key) = populated_team(&app, &marker).await;
    // As the dead replica left it: marked, disabled, its chat already erased, and its lease
    // still running for two seconds.
    sqlx::query(
        "UPDATE teams SET disabled_at = now(), erasing_at = now(),
                          erase_lease_until = now() + interval '2 seconds'
         WHERE id = $1::uuid",
    )
    .bind(&team)
    .execute(app.store.pool())
    .await
    .unwrap();
    sqlx::query("DELETE FROM chats WHERE team_id = $1::uuid")
        .bind(&team)
        .execute(app.store.pool())
        .await
        .unwrap();
    let read: Value = as_operator(&app, Method::GET, &format!("/v1/teams/{team}"), None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(read["status"], "erasing");

    erased_whole(&app, &team, &marker).await;
}
