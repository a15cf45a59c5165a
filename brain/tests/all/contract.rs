//! The OpenAPI contract (`brain/src/api/openapi.rs`): the committed `docs/openapi.json` is
//! the rendered document, the live brain serves it, schemathesis finds no server error and
//! no answer that breaks its schema, and every operation with a path parameter answers
//! `404` to another team's ids.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::TestApp;
use crate::common::manager::TempDir;
use bytes::Bytes;
use engine::artifacts::{ArtifactOwner, LocalDirStore, save_artifact};
use engine::config::ArtifactBackend;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json")
}

const REGENERATE: &str = "UPDATE_OPENAPI=1 cargo nextest run -p brain --test contract committed";

#[test]
fn committed_document_is_current() {
    let rendered = brain::api::openapi::render();
    let path = committed_path();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &rendered).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == rendered,
        "docs/openapi.json is not the contract the handlers render; regenerate it with\n  \
         {REGENERATE}\nand commit the result"
    );
}

#[tokio::test]
async fn served_document_is_the_rendered_one() {
    let app = TestApp::start().await;
    let response = app
        .http
        .get(format!("{}/openapi.json", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let served: Value = response.json().await.unwrap();
    let rendered: Value = serde_json::from_str(&brain::api::openapi::render()).unwrap();
    assert_eq!(served, rendered);
    assert_eq!(served["openapi"], "3.1.0");
}

/// Clients generate a function per operation id: two alike would collide.
#[test]
fn operation_ids_are_unique() {
    let doc: Value = serde_json::from_str(&brain::api::openapi::render()).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default();
            assert!(!id.is_empty(), "{method} {path} has no operationId");
            assert!(seen.insert(id.to_owned()), "operationId {id} twice");
        }
    }
}

/// A team's real resources, by the name of the path parameter that takes each id.
type Ids = BTreeMap<&'static str, String>;

async fn start(artifacts: &TempDir) -> TestApp {
    let dir = artifacts.0.clone();
    TestApp::start_with(|c| {
        c.artifacts.backend = ArtifactBackend::Local { dir };
        // Secrets on, so the secret operations are exercised rather than `not_configured`.
        c.secrets_key = Some(secrets_key());
    })
    .await
}

fn secrets_key() -> store::SecretsKey {
    store::SecretsKey::parse(&"5a".repeat(32)).unwrap()
}

/// Operations whose path names a resource inside the caller's own team by a name the
/// caller chooses: another team's name addresses the caller's own (a `PUT` creates it), so
/// a foreign name is no probe of isolation there. `DELETE` of the same path still is. An
/// end user's limits (L4) are the caller's team's for any user id, so reading them is no
/// probe either; nor is erasing, reading or disabling an end user (L2, X1), which is the
/// caller's team's user of that id, known or not.
const NAMED_IN_CALLERS_TEAM: [&str; 6] = [
    "PUT /v1/secrets/{secret_name}",
    "GET /v1/quotas/users/{user_id}",
    "PUT /v1/quotas/users/{user_id}",
    "DELETE /v1/users/{user_id}",
    "GET /v1/users/{user_id}",
    "PATCH /v1/users/{user_id}",
];

/// Operations a chat platform calls, authenticated by the channel's own secret rather than
/// a team key: any key's call is the documented 401. Their refusals are tested in
/// brain/tests/all/channels.rs (`channels::an_update_runs_once_and_a_bad_secret_runs_nothing`,
/// `channels::a_bad_slack_signature_or_a_stale_timestamp_runs_nothing`,
/// `channels::a_slack_approval_is_answered_by_its_button_and_a_bad_signature_answers_nothing`).
const PLATFORM_CALLS: [&str; 3] = [
    "POST /v1/channels/{channel_id}/telegram",
    "POST /v1/channels/{channel_id}/slack",
    "POST /v1/channels/{channel_id}/slack/interactivity",
];

/// Gives the team behind `key` one of everything a path can name: an agent, a chat with
/// a finished turn, an artifact of that chat and a connector of that agent (agent-scoped,
/// so that other agents' turns never dial it).
async fn populate(app: &TestApp, artifacts: &TempDir, key: &str) -> Ids {
    let post = |path: &str, body: Value| {
        app.http
            .post(format!("{}{path}", app.url))
            .bearer_auth(key)
            .json(&body)
            .send()
    };
    let created = |response: reqwest::Response| async move {
        assert_eq!(response.status(), 201);
        let row: Value = response.json().await.unwrap();
        row["id"].as_str().unwrap().to_owned()
    };
    let agent = created(
        post(
            "/v1/agents",
            json!({"name": "a", "system_prompt": "You are terse.", "model": "openai/gpt-test",
                   "approval_policy": {"ask": ["write"]}}),
        )
        .await
        .unwrap(),
    )
    .await;
    // The turn's model call asks for a write, which waits for approval.
    app.provider.push(scripted_provider::Reply::ToolCalls {
        text: None,
        calls: vec![scripted_provider::ToolCall {
            id: "call-1".into(),
            name: "memory_write".into(),
            arguments: json!({"content": "a note"}).to_string(),
        }],
        fragment: 16,
    });
    let chat = created(
        post(&format!("/v1/agents/{agent}/chats"), json!({}))
            .await
            .unwrap(),
    )
    .await;
    let turn = post(
        &format!("/v1/chats/{chat}/messages"),
        json!({"content": "hello", "message_id": "m1"}),
    )
    .await
    .unwrap();
    assert_eq!(turn.status(), 200);
    let streamed = String::from_utf8(turn.bytes().await.unwrap().to_vec()).unwrap();
    // The stream's `data-turn` part names the turn.
    let (chunks, _) = common::parse_events(&streamed);
    let turn = chunks
        .iter()
        .find_map(|c| match c {
            protocol::ui::UiChunk::DataTurn { data, .. } => Some(data.turn_id.to_string()),
            _ => None,
        })
        .unwrap();
    let connector = created(
        post(
            "/v1/connectors",
            json!({"name": "tools", "url": "https://mcp.example.com/mcp", "agent_id": agent}),
        )
        .await
        .unwrap(),
    )
    .await;
    // A second admin key, so deleting it is allowed for its own team.
    let key_id = created(
        post("/v1/keys", json!({"name": "second", "scope": "admin"}))
            .await
            .unwrap(),
    )
    .await;
    let row: Value = app
        .http
        .get(format!("{}/v1/agents/{agent}", app.url))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let owner = ArtifactOwner {
        team: row["team_id"].as_str().unwrap().parse().unwrap(),
        agent: agent.parse().unwrap(),
        chat: Some(chat.parse().unwrap()),
        turn: None,
    };
    let artifact = save_artifact(
        &app.store,
        &LocalDirStore::new(&artifacts.0),
        1 << 20,
        owner,
        "report.txt",
        "text/plain",
        Bytes::from_static(b"quarterly numbers"),
    )
    .await
    .unwrap();
    // A file of the chat (T21), uploaded as a client does.
    let boundary = "contract-boundary";
    let file: Value = app
        .http
        .post(format!("{}/v1/chats/{chat}/files", app.url))
        .bearer_auth(key)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; \
             filename=\"notes.txt\"\r\n\r\ntheir notes\r\n--{boundary}--\r\n"
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let file = file["id"].as_str().unwrap().to_owned();
    let approvals: Value = app
        .http
        .get(format!("{}/v1/chats/{chat}/approvals", app.url))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let approval = approvals["approvals"][0]["id"].as_str().unwrap().to_owned();
    let secret = app
        .http
        .put(format!("{}/v1/secrets/THEIRS", app.url))
        .bearer_auth(key)
        .json(&json!({"value": "their value"}))
        .send()
        .await
        .unwrap();
    assert_eq!(secret.status(), 201);
    let user_quota = app
        .http
        .put(format!("{}/v1/quotas/users/their-user", app.url))
        .bearer_auth(key)
        .json(&json!({"tokens_per_day": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(user_quota.status(), 200);
    let webhook = created(
        post(
            "/v1/webhooks",
            json!({"url": "https://hooks.example.com/a", "events": ["turn.completed"]}),
        )
        .await
        .unwrap(),
    )
    .await;
    // The team API is the operator's: another team's id is as absent as any (L1).
    let team = app
        .store
        .key_by_hash(&store::key_hash(key))
        .await
        .unwrap()
        .unwrap()
        .team
        .to_string();
    // An `iss` is one team's across the deployment.
    let issuer = created(
        post(
            "/v1/issuers",
            json!({"issuer": format!("https://id.example.com/{team}"), "audience": "app",
                "jwks_url": "https://id.example.com/jwks.json"}),
        )
        .await
        .unwrap(),
    )
    .await;
    // A provider connection (T14), at a public address no call here reaches.
    let provider = created(
        post(
            "/v1/providers",
            json!({"name": "theirs", "kind": "openai", "base_url": "https://llm.example.com/v1",
                   "api_key": "sk-contract-1234"}),
        )
        .await
        .unwrap(),
    )
    .await;
    // A pending OAuth flow of the connector, begun by someone else than `key` (the
    // operator), so no caller here may continue it.
    let state = format!("contract-{connector}");
    let owner = store::GrantOwner {
        team: team.parse().unwrap(),
        connector: connector.parse().unwrap(),
        user: None,
    };
    let bounds = (std::time::Duration::from_secs(600), 50, 5);
    let operator = store::Actor::operator(None);
    let keyed = app.store.clone().with_secrets_key(Some(secrets_key()));
    keyed
        .put_flow(&owner, &state, &json!({}), bounds, &operator, None)
        .await
        .unwrap();
    let flow = engine::connectors::authorization::handle_of_state(&state);
    // A Telegram channel of the agent (P10), kept through the store: creating one over the
    // API registers its webhook with Telegram, which no test reaches.
    let channel = uuid::Uuid::now_v7();
    let new_channel = store::channels::NewChannel {
        id: channel,
        kind: "telegram",
        api_base: "https://telegram.example.com",
        allowed_users: &["1".to_owned()],
        allowed_channels: &[],
        token: "1:contract",
        secret: "contract-secret",
    };
    keyed
        .create_channel(
            team.parse().unwrap(),
            agent.parse().unwrap(),
            &new_channel,
            10,
            &operator,
        )
        .await
        .unwrap();
    // A memory of the agent's (M4): the turn's `memory_write` waits for its approval.
    // A worker session, as the runtime-manager writes it (its egress ledger is listed
    // under it, W15).
    let session = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO agent_runtime_sessions (id, team_id, agent_id, chat_id, profile, state) \
         VALUES ($1, $2, $3, $4, 'light', 'terminated')",
    )
    .bind(session)
    .bind(team.parse::<uuid::Uuid>().unwrap())
    .bind(agent.parse::<uuid::Uuid>().unwrap())
    .bind(chat.parse::<uuid::Uuid>().unwrap())
    .execute(app.store.pool())
    .await
    .unwrap();
    let memory = uuid::Uuid::now_v7();
    sqlx::query("INSERT INTO memories (id, team_id, agent_id, content) VALUES ($1, $2, $3, 'x')")
        .bind(memory)
        .bind(team.parse::<uuid::Uuid>().unwrap())
        .bind(agent.parse::<uuid::Uuid>().unwrap())
        .execute(app.store.pool())
        .await
        .unwrap();
    // A knowledge base with a document (B3).
    let knowledge = created(
        post("/v1/knowledge", json!({"name": "theirs"}))
            .await
            .unwrap(),
    )
    .await;
    let document: Value = app
        .http
        .post(format!("{}/v1/knowledge/{knowledge}/documents", app.url))
        .bearer_auth(key)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; \
             filename=\"notes.md\"\r\n\r\n# Their notes\r\n--{boundary}--\r\n"
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let document = document["id"].as_str().unwrap().to_owned();
    // A skill (B8): a tar.gz of one folder, as a client uploads it.
    let skill_md = b"---\nname: contract-skill\ndescription: Their skill.\n---\nBody\n";
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(skill_md.len() as u64);
    header.set_mode(0o644);
    tar.append_data(&mut header, "SKILL.md", &skill_md[..])
        .unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar.into_inner().unwrap()).unwrap();
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; \
         filename=\"skill.tar.gz\"\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(&gz.finish().unwrap());
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let skill = app
        .http
        .post(format!("{}/v1/skills", app.url))
        .bearer_auth(key)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(skill.status(), 201);
    Ids::from([
        ("agent_id", agent),
        ("approval_id", approval),
        ("chat_id", chat),
        ("channel_id", channel.to_string()),
        ("artifact_id", artifact.id.to_string()),
        ("file_id", file),
        ("connector_id", connector),
        ("flow", flow),
        ("issuer_id", issuer),
        ("key_id", key_id),
        ("knowledge_id", knowledge),
        ("document_id", document),
        ("memory_id", memory.to_string()),
        ("provider_id", provider),
        ("response_id", format!("resp_{turn}")),
        ("secret_name", "THEIRS".to_owned()),
        ("session_id", session.to_string()),
        ("skill_name", "contract-skill".to_owned()),
        ("team_id", team),
        ("turn_id", turn),
        ("user_id", "their-user".to_owned()),
        ("webhook_id", webhook),
    ])
}

/// The schemathesis that `scripts/test-deps.sh` installed from
/// `tests/contract/requirements.txt`: its virtualenv is named by that file's hash.
fn schemathesis() -> PathBuf {
    let requirements =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/contract/requirements.txt");
    let pins = std::fs::read(&requirements).unwrap();
    let hash: String = Sha256::digest(&pins)
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    let bin = PathBuf::from(format!(
        "/var/tmp/agent-runtime-tools/schemathesis-{hash}/bin/schemathesis"
    ));
    assert!(
        bin.exists(),
        "{} is missing: run scripts/test-deps.sh (or make test-deps)",
        bin.display()
    );
    bin
}

/// A schemathesis configuration that draws each path id from the team's real ones most of
/// the time, so operations reach real resources, and generates the rest.
fn schemathesis_config(dir: &Path, ids: &Ids) -> PathBuf {
    let mut toml = String::new();
    for (param, id) in ids {
        toml.push_str(&format!("[dictionaries.{param}]\nvalues = [\"{id}\"]\n\n"));
    }
    toml.push_str("[parameters]\n");
    for param in ids.keys() {
        toml.push_str(&format!(
            "\"path.{param}\" = {{ dictionary = \"{param}\", probability = 0.8 }}\n"
        ));
    }
    let path = dir.join("schemathesis.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// schemathesis over the served contract, with the team's key and its real ids: no
/// server error, no answer outside its schema. The worker's WebSocket upgrade is skipped
/// (schemathesis speaks plain HTTP).
#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_no_server_error_and_no_schema_violation() {
    let bin = schemathesis();
    let artifacts = TempDir::new();
    let app = start(&artifacts).await;
    let ids = populate(&app, &artifacts, &app.key).await;
    let work = TempDir::new();
    let config = schemathesis_config(&work.0, &ids);
    let mut command = Command::new(bin);
    command
        .current_dir(&work.0)
        .arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{}/openapi.json", app.url))
        .args(["-H", &format!("Authorization: Bearer {}", app.key)])
        .args(["--checks", "not_a_server_error,response_schema_conformance"])
        .args(["--exclude-path", protocol::channel::CONNECT_PATH])
        // The worker's snapshot routes take a session token, which no team key is: every
        // call is the documented 401. They run end to end in brain/tests/all/workers.rs.
        .args(["--exclude-path", protocol::snapshot::SNAPSHOT_PATH])
        .args(["--exclude-path", protocol::snapshot::SNAPSHOT_SKIPPED_PATH])
        // An events stream never ends by itself: every call would time out. Its answers
        // are checked in brain/tests/all/events.rs, its refusals by the cross-tenant matrix.
        .args(["--exclude-path", "/v1/chats/{chat_id}/events"])
        // Authorizing dials the connector's MCP server: the fixture's (mcp.example.com) does
        // not resolve here, so every call is the documented `502 authorization_failed`.
        // The flow itself runs against live servers in brain/tests/all/connector_oauth.rs.
        .args(["--exclude-path", "/v1/connectors/{connector_id}/authorize"])
        .args(["--max-examples", "25", "--workers", "1"])
        .args(["--request-timeout", "20", "--generation-database", "none"])
        .args(["--no-color", "--max-failures", "20"])
        .env("SCHEMATHESIS_TELEMETRY", "false");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{report}");
    assert!(output.status.success(), "schemathesis failed:\n{report}");
    // A run that tested nothing would pass too.
    assert!(report.contains("passed"), "{report}");
}

/// Follows a `#/components/schemas/…` reference.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(target) => {
            let name = target.trim_start_matches("#/components/schemas/");
            resolve(doc, &doc["components"]["schemas"][name])
        }
        None => schema,
    }
}

/// A body that decodes for the operation: its schema's `example`, or the first of its
/// `oneOf` forms that has one.
fn example_body(doc: &Value, schema: &Value) -> Option<Value> {
    let schema = resolve(doc, schema);
    if let Some(example) = schema.get("example") {
        return Some(example.clone());
    }
    schema["oneOf"]
        .as_array()?
        .iter()
        .find_map(|form| example_body(doc, form))
}

/// An operation only a worker calls, with its session token, which no team key is: a team
/// key's every call is the documented 401. Their tenancy is tested with other sessions'
/// tokens (`workspace_files::a_worker_downloads_only_its_own_chats_files`).
fn workers_only(op: &Value) -> bool {
    op["security"] == json!([{"worker_token": []}])
}

/// Who calls, and with whose ids. Each path parameter, and each body field of the same
/// name the body's schema allows, takes the `foreign` id, or else the caller's `own`
/// (when there is no `own`, a parameter without a foreign id fails the test). An
/// operation that ends up with no foreign id is not part of the matrix.
struct Probe<'a> {
    key: &'a str,
    foreign: &'a Ids,
    own: Option<&'a Ids>,
}

/// Calls every operation of the contract that takes an id with `probe`'s ids and checks
/// that each answers `404 not_found`; returns the operations it called.
async fn assert_foreign_ids_not_found(
    app: &TestApp,
    doc: &Value,
    probe: &Probe<'_>,
) -> Vec<String> {
    let mut called = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let label = format!("{} {path}", method.to_uppercase());
            if NAMED_IN_CALLERS_TEAM.contains(&label.as_str())
                || workers_only(op)
                || PLATFORM_CALLS.contains(&label.as_str())
            {
                continue;
            }
            let mut foreign_ids = 0;
            let mut id_for = |param: &str| -> String {
                if let Some(id) = probe.foreign.get(param) {
                    foreign_ids += 1;
                    return id.clone();
                }
                match probe.own.and_then(|own| own.get(param)) {
                    Some(id) => id.clone(),
                    None => panic!(
                        "{label}: no id of a real resource for `{param}`; create one in \
                         `populate` so the cross-tenant matrix covers it"
                    ),
                }
            };
            let mut url = path.clone();
            for param in op["parameters"].as_array().into_iter().flatten() {
                if param["in"] == "path" {
                    let name = param["name"].as_str().unwrap();
                    url = url.replace(&format!("{{{name}}}"), &id_for(name));
                }
            }
            let schema = &op["requestBody"]["content"]["application/json"]["schema"];
            let body = if schema.is_null() {
                None
            } else {
                let mut body = example_body(doc, schema).unwrap_or_else(|| {
                    panic!("{label}: its request body schema needs an `example`")
                });
                let allowed = &resolve(doc, schema)["properties"];
                for name in probe.foreign.keys() {
                    if allowed.get(*name).is_some() {
                        body[*name] = Value::String(id_for(name));
                    }
                }
                Some(body)
            };
            if foreign_ids == 0 {
                continue;
            }
            let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let mut request = app
                .http
                .request(method, format!("{}{url}", app.url))
                .bearer_auth(probe.key);
            if let Some(body) = &body {
                request = request.json(body);
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let text = response.text().await.unwrap();
            let code = serde_json::from_str::<Value>(&text)
                .ok()
                .map(|b| b["error"]["code"].clone());
            assert_eq!(
                (status, code),
                (404, Some(json!("not_found"))),
                "{label} with another team's ids ({url}, body {body:?}) answered {text}"
            );
            called.push(label);
        }
    }
    called
}

/// Every operation that takes an id, generated from the contract: team A's key with team
/// B's real ids answers `404 not_found` (never `403`, which would confirm the id exists),
/// and B's resources are untouched afterwards.
#[tokio::test]
async fn another_teams_ids_are_not_found_on_every_operation() {
    let artifacts = TempDir::new();
    let app = start(&artifacts).await;
    let other = app.store.create_team("b").await.unwrap();
    let theirs = populate(&app, &artifacts, &other.api_key).await;
    let doc: Value = serde_json::from_str(&brain::api::openapi::render()).unwrap();

    let called = assert_foreign_ids_not_found(
        &app,
        &doc,
        &Probe {
            key: &app.key,
            foreign: &theirs,
            own: None,
        },
    )
    .await;
    // Every operation with a path parameter is in the matrix, and so is one that takes an
    // id in its body (a connector for another team's agent).
    let with_path_ids = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| item.as_object().unwrap().iter().map(move |m| (path, m)))
        .filter(|(path, (method, op))| {
            let label = format!("{} {path}", method.to_uppercase());
            path.contains('{')
                && !workers_only(op)
                && !NAMED_IN_CALLERS_TEAM.contains(&label.as_str())
                && !PLATFORM_CALLS.contains(&label.as_str())
        })
        .count();
    assert!(called.len() > with_path_ids, "{called:?}");
    assert!(
        called.contains(&"POST /v1/connectors".to_owned()),
        "{called:?}"
    );

    // The owner still has everything, and the foreign calls wrote nothing.
    let as_owner = |path: String| {
        app.http
            .get(format!("{}{path}", app.url))
            .bearer_auth(&other.api_key)
            .send()
    };
    for path in [
        format!("/v1/agents/{}", theirs["agent_id"]),
        format!("/v1/artifacts/{}/meta", theirs["artifact_id"]),
        format!("/v1/artifacts/{}", theirs["artifact_id"]),
    ] {
        assert_eq!(
            as_owner(path.clone()).await.unwrap().status(),
            200,
            "{path}"
        );
    }
    let messages: Value = as_owner(format!("/v1/chats/{}/messages", theirs["chat_id"]))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(messages["messages"].as_array().unwrap().len(), 2);
    // The transcript's pages as the contract describes them: newest first, `next_cursor`
    // to the older one, none on the oldest; the caller's key with the owner's cursor finds
    // nothing either.
    let newest: Value = as_owner(format!("/v1/chats/{}/messages?limit=1", theirs["chat_id"]))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(newest["messages"][0], messages["messages"][1]);
    let cursor = newest["next_cursor"].as_str().unwrap();
    let older = format!(
        "/v1/chats/{}/messages?limit=1&before={cursor}",
        theirs["chat_id"]
    );
    let oldest: Value = as_owner(older.clone()).await.unwrap().json().await.unwrap();
    assert_eq!(oldest["messages"][0], messages["messages"][0]);
    assert_eq!(oldest.get("next_cursor"), None);
    let foreign = app.get(&older).await;
    assert_eq!(foreign.status(), 404);
    let connectors: Value = as_owner("/v1/connectors".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = connectors["connectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [theirs["connector_id"].as_str()]);
    let secrets: Value = as_owner("/v1/secrets".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(secrets["secrets"][0]["name"], "THEIRS");
}
