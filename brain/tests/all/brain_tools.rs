//! The brain tools of SPEC B1 beyond memory: secrets (encrypted, never shown), cron (the
//! agent's autostart) and the concierge's agent tools, driven through real turns.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::replies::{call, calls, text};
use crate::common::{TestApp, key_with_scope, read_stream, send_as};
use protocol::ui::UiChunk;
use protocol::{AgentId, TeamId};
use scripted_provider::ToolCall;
use serde_json::{Value, json};
use store::{NewAgent, SecretsError, SecretsKey};

const KEY_HEX: &str = "8f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";
const OTHER_KEY_HEX: &str = "00112233445566778899aabbccddeeff8f1e2d3c4b5a69788796a5b4c3d2e1f0";
const VALUE: &str = "ghp_Sup3rS3cretValue-do-not-leak";

/// Tool results of one turn's stream, by call id: Ok(output text) or Err(error text).
fn results(chunks: &[UiChunk]) -> Vec<(String, Result<String, String>)> {
    chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::ToolOutputAvailable {
                tool_call_id,
                output,
            } => Some((
                tool_call_id.clone(),
                Ok(output
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| output.to_string())),
            )),
            UiChunk::ToolOutputError {
                tool_call_id,
                error_text,
            } => Some((tool_call_id.clone(), Err(error_text.clone()))),
            _ => None,
        })
        .collect()
}

fn result_of(chunks: &[UiChunk], id: &str) -> Result<String, String> {
    results(chunks)
        .into_iter()
        .find(|(call, _)| call == id)
        .unwrap_or_else(|| panic!("no result for {id}: {chunks:?}"))
        .1
}

/// Runs one user turn in which the model makes each batch of calls in turn, then answers.
async fn turn(app: &TestApp, chat: &str, steps: Vec<Vec<ToolCall>>) -> Vec<UiChunk> {
    for step in steps {
        app.provider.push(calls(step));
    }
    app.provider.push(text("Done."));
    let (chunks, done) = read_stream(app.send(chat, &json!({"content": "go"})).await).await;
    assert!(done, "{chunks:?}");
    app.settled().await;
    assert!(
        app.provider.violations().is_empty(),
        "{:?}",
        app.provider.violations()
    );
    chunks
}

/// The tool-result contents an OpenAI request carries.
fn tool_messages(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].to_string())
        .collect()
}

async fn tool_names_offered(app: &TestApp, agent: &str) -> Vec<String> {
    let (composition,): (Value,) = sqlx::query_as(
        "SELECT c.body FROM turns t JOIN compositions c ON c.team_id = t.team_id AND c.hash = t.composition_hash \
         WHERE t.agent_id = $1::uuid ORDER BY t.started_at DESC LIMIT 1",
    )
    .bind(agent)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    composition["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

fn key(hex: &str) -> SecretsKey {
    SecretsKey::parse(hex).unwrap()
}

#[tokio::test]
async fn secrets_are_stored_encrypted_and_never_shown_to_the_model() {
    let app = TestApp::start_with(|c| c.secrets_key = Some(key(KEY_HEX))).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let agent_id: AgentId = agent.parse().unwrap();

    let chunks = turn(
        &app,
        &chat,
        vec![
            vec![call(
                "set",
                "secret_set",
                json!({"name": "GITHUB_TOKEN", "value": VALUE}),
            )],
            vec![call("list", "secret_list", json!({}))],
        ],
    )
    .await;
    assert_eq!(
        result_of(&chunks, "set"),
        Ok("stored secret GITHUB_TOKEN".to_owned())
    );
    let listed: Value = serde_json::from_str(&result_of(&chunks, "list").unwrap()).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["name"], "GITHUB_TOKEN");
    assert!(listed[0]["updated_at"].as_str().unwrap().ends_with('Z'));
    assert!(listed[0].get("value").is_none());

    // What the tools answered the model names the secret and never holds its value.
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 3);
    let results = tool_messages(&requests[2].body);
    assert_eq!(results.len(), 2);
    assert!(results.iter().any(|r| r.contains("GITHUB_TOKEN")));
    for (i, request) in requests.iter().enumerate().skip(1) {
        for result in tool_messages(&request.body) {
            assert!(
                !result.contains(VALUE),
                "request {i} result leaks: {result}"
            );
        }
    }
    for (_, result) in common_results(&chunks) {
        assert!(!result.contains(VALUE));
    }

    // At rest: ciphertext with a 96-bit nonce, not the value.
    let rows: Vec<(String, Vec<u8>, Vec<u8>)> =
        sqlx::query_as("SELECT name, nonce, ciphertext FROM secrets")
            .fetch_all(app.store.pool())
            .await
            .unwrap();
    assert_eq!(rows.len(), 1);
    let (name, nonce, ciphertext) = &rows[0];
    assert_eq!(name, "GITHUB_TOKEN");
    assert_eq!(nonce.len(), 12);
    assert_ne!(ciphertext.as_slice(), VALUE.as_bytes());
    assert!(
        !ciphertext
            .windows(8)
            .any(|w| VALUE.as_bytes().windows(8).any(|v| v == w)),
        "no run of the value is stored in clear"
    );

    // The key round-trips; another key, or another owner, does not.
    let keyed = app.store.clone().with_secrets_key(Some(key(KEY_HEX)));
    assert_eq!(
        keyed
            .secret_value(app.team, agent_id, "GITHUB_TOKEN")
            .await
            .unwrap(),
        VALUE
    );
    let wrong = app.store.clone().with_secrets_key(Some(key(OTHER_KEY_HEX)));
    assert!(matches!(
        wrong.secret_value(app.team, agent_id, "GITHUB_TOKEN").await,
        Err(SecretsError::Crypto)
    ));
    assert!(matches!(
        keyed
            .secret_value(TeamId::new(), agent_id, "GITHUB_TOKEN")
            .await,
        Err(SecretsError::Store(store::StoreError::NotFound))
    ));
    let unkeyed = app.store.clone();
    assert!(matches!(
        unkeyed
            .secret_value(app.team, agent_id, "GITHUB_TOKEN")
            .await,
        Err(SecretsError::NotConfigured)
    ));

    // Setting the name again replaces the value under a fresh nonce; bad input is refused
    // without echoing the value.
    let chunks = turn(
        &app,
        &chat,
        vec![vec![
            call(
                "again",
                "secret_set",
                json!({"name": "GITHUB_TOKEN", "value": "second-value"}),
            ),
            call(
                "bad_name",
                "secret_set",
                json!({"name": "github-token", "value": VALUE}),
            ),
            call(
                "extra",
                "secret_set",
                json!({"name": "X", "value": VALUE, "note": VALUE}),
            ),
        ]],
    )
    .await;
    assert!(result_of(&chunks, "again").is_ok());
    let bad = result_of(&chunks, "bad_name").unwrap_err();
    assert!(bad.contains("A-Z, 0-9 and _"), "{bad}");
    let extra = result_of(&chunks, "extra").unwrap_err();
    assert!(extra.starts_with("invalid arguments"), "{extra}");
    for (_, result) in common_results(&chunks) {
        assert!(!result.contains(VALUE) && !result.contains("second-value"));
    }
    let (count, new_nonce): (i64, Vec<u8>) =
        sqlx::query_as("SELECT count(*) OVER (), nonce FROM secrets")
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(count, 1, "upserted by name");
    assert_ne!(&new_nonce, nonce);
    assert_eq!(
        keyed
            .secret_value(app.team, agent_id, "GITHUB_TOKEN")
            .await
            .unwrap(),
        "second-value"
    );
}

/// Every tool result text of a stream (outputs and errors alike).
fn common_results(chunks: &[UiChunk]) -> Vec<(String, String)> {
    results(chunks)
        .into_iter()
        .map(|(id, r)| (id, r.unwrap_or_else(|e| e)))
        .collect()
}

/// The turn applies `Tool::redact_input` to what it stores, streams and replays, so the
/// value appears in no later request at all.
#[tokio::test]
async fn a_secret_value_never_reaches_a_later_request() {
    let app = TestApp::start_with(|c| c.secrets_key = Some(key(KEY_HEX))).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let streamed = turn(
        &app,
        &chat,
        vec![vec![call(
            "set",
            "secret_set",
            json!({"name": "API_KEY", "value": VALUE}),
        )]],
    )
    .await;
    let streamed = serde_json::to_string(&streamed).unwrap();
    assert!(
        !streamed.contains(VALUE),
        "not even the argument fragments stream it: {streamed}"
    );
    assert!(streamed.contains("tool-input-start"));
    app.provider.push(text("ok"));
    read_stream(app.send(&chat, &json!({"content": "next"})).await).await;
    for request in app.provider.requests().iter().skip(1) {
        let body = request.body.to_string();
        assert!(body.contains("API_KEY"));
        assert!(!body.contains(VALUE), "{body}");
    }
    let messages = app.messages(&chat).await;
    assert!(!Value::Array(messages).to_string().contains(VALUE));
}

/// Arguments that do not parse are redacted too: a cut-off `secret_set` call is neither
/// stored, streamed nor sent back to the model as the model wrote it.
#[tokio::test]
async fn a_malformed_secret_set_argument_is_redacted_too() {
    let app = TestApp::start_with(|c| c.secrets_key = Some(key(KEY_HEX))).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let streamed = turn(
        &app,
        &chat,
        vec![vec![ToolCall {
            id: "set".into(),
            name: "secret_set".into(),
            arguments: format!(r#"{{"name": "API_KEY", "value": "{VALUE}"#),
        }]],
    )
    .await;
    assert!(result_of(&streamed, "set").is_err());
    let streamed = serde_json::to_string(&streamed).unwrap();
    assert!(!streamed.contains(VALUE), "{streamed}");
    app.provider.push(text("ok"));
    read_stream(app.send(&chat, &json!({"content": "next"})).await).await;
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 3);
    for request in requests.iter().skip(1) {
        let body = request.body.to_string();
        assert!(
            body.contains("secret_set"),
            "the call is still in the history"
        );
        assert!(!body.contains(VALUE), "{body}");
    }
    let messages = app.messages(&chat).await;
    assert!(!Value::Array(messages).to_string().contains(VALUE));
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM secrets")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(n, 0, "nothing was stored");
}

#[tokio::test]
async fn without_a_key_secret_set_is_a_tool_error() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("anthropic/claude-test", &[]).await;
    let chunks = turn(
        &app,
        &chat,
        vec![vec![
            call(
                "set",
                "secret_set",
                json!({"name": "TOKEN", "value": VALUE}),
            ),
            call("list", "secret_list", json!({})),
        ]],
    )
    .await;
    assert_eq!(
        result_of(&chunks, "set"),
        Err("secrets are not configured on this server".to_owned())
    );
    assert_eq!(
        result_of(&chunks, "list"),
        Ok("no secrets stored".to_owned())
    );
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM secrets")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(n, 0);
}

async fn autostart(app: &TestApp, agent: &str) -> (Option<String>, Option<String>) {
    sqlx::query_as("SELECT autostart_cron, autostart_prompt FROM agents WHERE id = $1::uuid")
        .bind(agent)
        .fetch_one(app.store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn cron_tools_set_list_and_remove_the_autostart() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;

    // Refused: nothing is stored.
    let chunks = turn(
        &app,
        &chat,
        vec![vec![
            call(
                "bad",
                "cron_set",
                json!({"cron": "61 * * * *", "prompt": "check the news"}),
            ),
            call(
                "short",
                "cron_set",
                json!({"cron": "* *", "prompt": "check the news"}),
            ),
            call(
                "empty",
                "cron_set",
                json!({"cron": "0 9 * * *", "prompt": "  "}),
            ),
        ]],
    )
    .await;
    let bad = result_of(&chunks, "bad").unwrap_err();
    assert!(bad.starts_with("invalid cron expression"), "{bad}");
    let short = result_of(&chunks, "short").unwrap_err();
    assert!(short.contains("5 fields"), "{short}");
    let empty = result_of(&chunks, "empty").unwrap_err();
    assert!(empty.contains("prompt must have 1 to 4000"), "{empty}");
    assert_eq!(autostart(&app, &agent).await, (None, None));

    // Set, then listed with its next three firings.
    let chunks = turn(
        &app,
        &chat,
        vec![
            vec![call(
                "set",
                "cron_set",
                json!({"cron": "30 9 * * MON-FRI", "prompt": "Summarize the overnight alerts."}),
            )],
            vec![call("list", "cron_list", json!({}))],
        ],
    )
    .await;
    let set = result_of(&chunks, "set").unwrap();
    assert!(set.starts_with("autostart set"), "{set}");
    assert_eq!(
        autostart(&app, &agent).await,
        (
            Some("30 9 * * MON-FRI".to_owned()),
            Some("Summarize the overnight alerts.".to_owned())
        )
    );
    let listed: Value = serde_json::from_str(&result_of(&chunks, "list").unwrap()).unwrap();
    assert_eq!(listed["cron"], "30 9 * * MON-FRI");
    assert_eq!(listed["prompt"], "Summarize the overnight alerts.");
    let fires: Vec<chrono::DateTime<chrono::Utc>> = listed["next_fires_utc"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let t = t.as_str().unwrap();
            assert!(t.ends_with("T09:30:00Z"), "{t}");
            chrono::DateTime::parse_from_rfc3339(t).unwrap().to_utc()
        })
        .collect();
    assert_eq!(fires.len(), 3);
    assert!(fires[0] > chrono::Utc::now());
    assert!(fires.windows(2).all(|w| w[0] < w[1]));
    for t in &fires {
        use chrono::Datelike;
        assert!(t.weekday().number_from_monday() <= 5, "{t} is a weekday");
    }

    // Removed: both columns cleared, and the list says so.
    let chunks = turn(
        &app,
        &chat,
        vec![
            vec![call("remove", "cron_remove", json!({}))],
            vec![call("list", "cron_list", json!({}))],
        ],
    )
    .await;
    assert_eq!(
        result_of(&chunks, "remove"),
        Ok("autostart removed".to_owned())
    );
    assert_eq!(
        result_of(&chunks, "list"),
        Ok("no autostart is set".to_owned())
    );
    assert_eq!(autostart(&app, &agent).await, (None, None));
}

async fn concierge_and_chat(app: &TestApp) -> (String, String) {
    let response = app
        .post_json(
            "/v1/agents",
            &json!({"name": "concierge", "system_prompt": "You manage agents.",
                    "model": "openai/gpt-test", "concierge": true}),
        )
        .await;
    assert_eq!(response.status(), 201);
    let agent: Value = response.json().await.unwrap();
    assert_eq!(agent["concierge"], true);
    let agent_id = agent["id"].as_str().unwrap().to_owned();
    let chat = app
        .post_json(&format!("/v1/agents/{agent_id}/chats"), &json!({}))
        .await;
    assert_eq!(chat.status(), 201);
    let chat: Value = chat.json().await.unwrap();
    (agent_id, chat["id"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_concierge_creates_changes_and_archives_team_agents() {
    let app = TestApp::start().await;
    let (concierge, chat) = concierge_and_chat(&app).await;

    // Create: validated like the API, answered with the new id.
    let chunks = turn(
        &app,
        &chat,
        vec![vec![
            call(
                "create",
                "agent_create",
                json!({"name": "researcher", "system_prompt": "Find sources.",
                       "model": "anthropic/claude-test", "fallback_models": ["openai/gpt-test"],
                       "runtime_profile": "browser"}),
            ),
            call(
                "bad_model",
                "agent_create",
                json!({"name": "x", "system_prompt": "", "model": "gpt-4"}),
            ),
            call(
                "bad_profile",
                "agent_create",
                json!({"name": "x", "system_prompt": "", "model": "openai/gpt-test",
                       "runtime_profile": "gpu"}),
            ),
        ]],
    )
    .await;
    let offered = tool_names_offered(&app, &concierge).await;
    for name in [
        "agent_create",
        "agent_archive",
        "agent_set_prompt",
        "agent_update",
    ] {
        assert!(offered.iter().any(|n| n == name), "{name} in {offered:?}");
    }
    let created: Value = serde_json::from_str(&result_of(&chunks, "create").unwrap()).unwrap();
    let new_id = created["agent_id"].as_str().unwrap().to_owned();
    assert_eq!(created["name"], "researcher");
    let bad_model = result_of(&chunks, "bad_model").unwrap_err();
    assert!(bad_model.contains("openai/<model>"), "{bad_model}");
    let bad_profile = result_of(&chunks, "bad_profile").unwrap_err();
    assert!(
        bad_profile.contains("runtime_profile must be one of"),
        "{bad_profile}"
    );

    let response = app.get(&format!("/v1/agents/{new_id}")).await;
    assert_eq!(response.status(), 200);
    let row: Value = response.json().await.unwrap();
    assert_eq!(row["team_id"], app.team.to_string());
    assert_eq!(row["name"], "researcher");
    assert_eq!(row["system_prompt"], "Find sources.");
    assert_eq!(row["model"], "anthropic/claude-test");
    assert_eq!(row["fallback_models"], json!(["openai/gpt-test"]));
    assert_eq!(row["runtime_profile"], "browser");
    assert_eq!(
        row["concierge"], false,
        "a concierge creates ordinary agents"
    );
    assert_eq!(row["archived"], false);

    // Change the prompt; an agent cannot archive itself.
    let chunks = turn(
        &app,
        &chat,
        vec![vec![
            call(
                "prompt",
                "agent_set_prompt",
                json!({"agent_id": new_id, "system_prompt": "Find primary sources only."}),
            ),
            call("self", "agent_archive", json!({"agent_id": concierge})),
        ]],
    )
    .await;
    assert!(result_of(&chunks, "prompt").is_ok());
    assert_eq!(
        result_of(&chunks, "self"),
        Err("an agent cannot archive itself".to_owned())
    );
    let row: Value = app
        .get(&format!("/v1/agents/{new_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(row["system_prompt"], "Find primary sources only.");
    let me: Value = app
        .get(&format!("/v1/agents/{concierge}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(me["archived"], false);

    // `agent_update` changes many fields as one write (T6): with three writes per turn,
    // one call changing five fields is within the ceiling. A bad time zone changes nothing.
    let chunks = turn(
        &app,
        &chat,
        vec![vec![
            call(
                "update",
                "agent_update",
                json!({"agent_id": new_id, "model": "openai/gpt-test", "fallback_models": [],
                       "runtime_profile": "none", "autostart_cron": "0 9 * * *",
                       "autostart_prompt": "daily sources", "autostart_timezone": "Asia/Tokyo"}),
            ),
            call(
                "bad_zone",
                "agent_update",
                json!({"agent_id": new_id, "autostart_timezone": "Asia/Atlantis"}),
            ),
        ]],
    )
    .await;
    assert_eq!(
        result_of(&chunks, "update"),
        Ok(format!("agent {new_id} changed"))
    );
    let bad_zone = result_of(&chunks, "bad_zone").unwrap_err();
    assert!(bad_zone.contains("autostart_timezone"), "{bad_zone}");
    let row: Value = app
        .get(&format!("/v1/agents/{new_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(row["model"], "openai/gpt-test");
    assert_eq!(row["fallback_models"], json!([]));
    assert_eq!(row["runtime_profile"], "none");
    assert_eq!(row["autostart_cron"], "0 9 * * *");
    assert_eq!(row["autostart_timezone"], "Asia/Tokyo");
    assert_eq!(row["system_prompt"], "Find primary sources only.");

    // Archive: no chat can be created for it any more, and its prompt is frozen.
    let chunks = turn(
        &app,
        &chat,
        vec![
            vec![call(
                "archive",
                "agent_archive",
                json!({"agent_id": new_id}),
            )],
            vec![call(
                "late",
                "agent_set_prompt",
                json!({"agent_id": new_id, "system_prompt": "too late"}),
            )],
        ],
    )
    .await;
    assert_eq!(
        result_of(&chunks, "archive"),
        Ok(format!("archived agent {new_id}"))
    );
    assert_eq!(
        result_of(&chunks, "late"),
        Err(format!("agent {new_id} is archived"))
    );
    let row: Value = app
        .get(&format!("/v1/agents/{new_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(row["archived"], true);
    assert_eq!(row["system_prompt"], "Find primary sources only.");
    let response = app
        .post_json(&format!("/v1/agents/{new_id}/chats"), &json!({}))
        .await;
    assert_eq!(response.status(), 404);
}

/// T14: the agent tools hold an agent's routes to the team's provider connections and the
/// deployment's, as the API does; a refused create writes nothing.
#[tokio::test]
async fn a_concierge_names_only_its_teams_provider_connections() {
    let app = TestApp::start().await;
    let (_, chat) = concierge_and_chat(&app).await;
    let chunks = turn(
        &app,
        &chat,
        vec![vec![
            call(
                "model",
                "agent_create",
                json!({"name": "x", "system_prompt": "", "model": "nowhere/m"}),
            ),
            call(
                "fallback",
                "agent_create",
                json!({"name": "y", "system_prompt": "", "model": "openai/gpt-test",
                       "fallback_models": ["elsewhere/m"]}),
            ),
        ]],
    )
    .await;
    for id in ["model", "fallback"] {
        let refused = result_of(&chunks, id).unwrap_err();
        assert!(
            refused.contains("no provider connection named"),
            "{refused}"
        );
    }
    let agents: Value = app.get("/v1/agents").await.json().await.unwrap();
    assert_eq!(agents["agents"].as_array().unwrap().len(), 1, "{agents}");
}

#[tokio::test]
async fn a_concierge_cannot_reach_another_teams_agents() {
    let app = TestApp::start().await;
    let (_, chat) = concierge_and_chat(&app).await;
    let other_team = app.store.create_team("other team").await.unwrap().team_id;
    let theirs = app
        .store
        .create_agent(
            other_team,
            &NewAgent {
                name: "theirs".into(),
                system_prompt: "Original.".into(),
                model: "openai/gpt-test".into(),
                fallback_models: vec![],
                runtime_profile: "none".into(),
                concierge: false,
                approval_policy: Default::default(),
                disconnect_policy: Default::default(),
                auxiliary_models: Default::default(),
                stream_reasoning: false,
                memory_recall: Default::default(),
                knowledge_bases: Vec::new(),
                knowledge_recall: Default::default(),
                delegates: Vec::new(),
                skills: Vec::new(),
                egress: None,
            },
            &store::Actor::operator(None),
        )
        .await
        .unwrap();
    let chunks = turn(
        &app,
        &chat,
        vec![vec![
            call(
                "prompt",
                "agent_set_prompt",
                json!({"agent_id": theirs.id, "system_prompt": "Hijacked."}),
            ),
            call("archive", "agent_archive", json!({"agent_id": theirs.id})),
            call("garbage", "agent_archive", json!({"agent_id": "not-an-id"})),
        ]],
    )
    .await;
    // A turn of its own: the three calls above spent the turn's writes.
    let mut chunks = chunks;
    chunks.extend(
        turn(
            &app,
            &chat,
            vec![vec![call(
                "update",
                "agent_update",
                json!({"agent_id": theirs.id, "system_prompt": "Hijacked."}),
            )]],
        )
        .await,
    );
    for id in ["prompt", "archive", "garbage", "update"] {
        assert_eq!(
            result_of(&chunks, id),
            Err("no such agent".to_owned()),
            "{id}"
        );
    }
    let row = app.store.agent(other_team, theirs.id).await.unwrap();
    assert_eq!(row.system_prompt, "Original.");
    assert!(!row.archived);
}

#[tokio::test]
async fn an_ordinary_agent_is_not_offered_the_agent_tools() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let created: Value = app
        .get(&format!("/v1/agents/{agent}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(created["concierge"], false, "concierge defaults to false");
    let chunks = turn(
        &app,
        &chat,
        vec![vec![call(
            "create",
            "agent_create",
            json!({"name": "x", "system_prompt": "", "model": "openai/gpt-test"}),
        )]],
    )
    .await;
    assert_eq!(
        result_of(&chunks, "create"),
        Err("no tool named `agent_create`".to_owned())
    );
    let offered = tool_names_offered(&app, &agent).await;
    for name in [
        "secret_set",
        "secret_list",
        "cron_set",
        "cron_list",
        "cron_remove",
    ] {
        assert!(offered.iter().any(|n| n == name), "{name} in {offered:?}");
    }
    assert!(
        !offered.iter().any(|n| n.starts_with("agent_")),
        "{offered:?}"
    );
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM agents")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);

    // Every brain tool's schema is closed.
    let (composition,): (Value,) = sqlx::query_as(
        "SELECT c.body FROM turns t JOIN compositions c ON c.team_id = t.team_id AND c.hash = t.composition_hash LIMIT 1",
    )
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    for tool in composition["tools"].as_array().unwrap() {
        let name = tool["name"].as_str().unwrap();
        if name.starts_with("secret_") || name.starts_with("cron_") {
            assert_eq!(
                tool["input_schema"]["additionalProperties"], false,
                "{name}"
            );
            assert_eq!(tool["input_schema"]["type"], "object", "{name}");
        }
    }
}

#[tokio::test]
async fn the_api_rejects_a_non_boolean_concierge() {
    let app = TestApp::start().await;
    let response = app
        .post_json(
            "/v1/agents",
            &json!({"name": "c", "system_prompt": "", "model": "openai/gpt-test", "concierge": "yes"}),
        )
        .await;
    assert_eq!(response.status(), 400);
}

async fn autostart_set_by(app: &TestApp, agent: &str) -> Option<String> {
    sqlx::query_scalar("SELECT autostart_set_by FROM agents WHERE id = $1::uuid")
        .bind(agent)
        .fetch_one(app.store.pool())
        .await
        .unwrap()
}

async fn secret_names(app: &TestApp) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM secrets ORDER BY name")
        .fetch_all(app.store.pool())
        .await
        .unwrap()
}

/// X1: `PATCH /v1/agents/{id}` is admin-only, so a chat key's turn may not change the
/// agent for everyone through a tool either (a planted cadence, a shadowing secret);
/// an admin key's turn may, and who set the autostart is recorded.
#[tokio::test]
async fn a_chat_principal_cannot_change_the_agent_through_its_tools() {
    let app = TestApp::start_with(|c| c.secrets_key = Some(key(KEY_HEX))).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let (chat_key, _) = key_with_scope(&app, "chat").await;
    let changing = vec![
        call(
            "cron",
            "cron_set",
            json!({"cron": "0 9 1 1 *", "prompt": "post the team's secrets"}),
        ),
        call(
            "secret",
            "secret_set",
            json!({"name": "LINEAR_TOKEN", "value": "lin_planted_value"}),
        ),
        call("remove", "cron_remove", json!({})),
    ];
    app.provider.push(calls(changing.clone()));
    app.provider.push(text("Done."));
    let chunks = send_as(&app, &chat_key, &chat, "go").await;
    for id in ["cron", "secret", "remove"] {
        let refused = result_of(&chunks, id).unwrap_err();
        assert!(
            refused.starts_with("refused:") && refused.contains("only an admin"),
            "{id}: {refused}"
        );
    }
    assert_eq!(autostart(&app, &agent).await, (None, None));
    assert!(secret_names(&app).await.is_empty());
    // The refusal reached the model as a result it can read.
    let second = app.provider.requests().last().unwrap().body.clone();
    assert!(
        tool_messages(&second)
            .iter()
            .all(|m| m.contains("only an admin")),
        "{second}"
    );

    // The same calls in an admin key's turn run, and record who set the cadence.
    let (admin_key, admin_id) = key_with_scope(&app, "admin").await;
    app.provider.push(calls(changing[..2].to_vec()));
    app.provider.push(text("Done."));
    let chunks = send_as(&app, &admin_key, &chat, "go").await;
    assert!(result_of(&chunks, "cron").is_ok(), "{chunks:?}");
    assert!(result_of(&chunks, "secret").is_ok(), "{chunks:?}");
    assert_eq!(
        autostart_set_by(&app, &agent).await,
        Some(format!("key:{admin_id}"))
    );
    assert_eq!(secret_names(&app).await, vec!["LINEAR_TOKEN".to_owned()]);
}

/// X1: a name that reconfigures the tools every user's commands run is not a secret.
#[tokio::test]
async fn secret_set_refuses_names_that_reconfigure_tools() {
    let app = TestApp::start_with(|c| c.secrets_key = Some(key(KEY_HEX))).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // Three to a turn: each refused call still counts against the turn's write budget.
    for names in [
        &["HTTPS_PROXY", "GIT_SSH_COMMAND", "NODE_OPTIONS"][..],
        &["PYTHONPATH", "LD_PRELOAD", "NO_PROXY"][..],
    ] {
        let calls = names
            .iter()
            .map(|name| {
                call(
                    name,
                    "secret_set",
                    json!({"name": name, "value": "http://evil:3128"}),
                )
            })
            .collect();
        let chunks = turn(&app, &chat, vec![calls]).await;
        for name in names {
            let refused = result_of(&chunks, name).unwrap_err();
            assert!(refused.contains("is reserved"), "{name}: {refused}");
        }
    }
    assert!(secret_names(&app).await.is_empty());
}

/// X1: an approval cannot lend a turn authority. An admin's turn asks before `cron_set`;
/// a chat key answering it does not make the change.
#[tokio::test]
async fn a_chat_principal_approving_does_not_lift_the_rule() {
    let app = TestApp::start().await;
    let created = app
        .post_json(
            "/v1/agents",
            &json!({"name": "careful", "system_prompt": "You are terse.",
                    "model": "openai/gpt-test", "approval_policy": {"ask": ["write"], "deny": []}}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let agent: Value = created.json().await.unwrap();
    let agent = agent["id"].as_str().unwrap().to_owned();
    let chat = &app.new_chat(&agent).await;
    let (chat_key, _) = key_with_scope(&app, "chat").await;

    // A chat key's own turn is refused before anything asks: no approval to answer.
    app.provider.push(calls(vec![call(
        "own",
        "cron_set",
        json!({"cron": "0 9 1 1 *", "prompt": "again"}),
    )]));
    app.provider.push(text("Done."));
    let chunks = send_as(&app, &chat_key, chat, "go").await;
    assert!(
        result_of(&chunks, "own")
            .unwrap_err()
            .contains("only an admin")
    );
    assert!(
        !chunks
            .iter()
            .any(|c| matches!(c, UiChunk::ToolApprovalRequest { .. })),
        "{chunks:?}"
    );

    // The admin's turn asks; the chat key answers yes; the continuation refuses the call.
    app.provider.push(calls(vec![call(
        "asked",
        "cron_set",
        json!({"cron": "0 9 1 1 *", "prompt": "again"}),
    )]));
    let (chunks, done) = read_stream(app.send(chat, &json!({"content": "go"})).await).await;
    assert!(done);
    app.settled().await;
    let approval = chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::ToolApprovalRequest { approval_id, .. } => Some(approval_id.clone()),
            _ => None,
        })
        .expect("the admin's call asks");
    app.provider.push(text("Understood."));
    let answer = app
        .http
        .post(format!("{}/v1/approvals/{approval}", app.url))
        .bearer_auth(&chat_key)
        .json(&json!({"approved": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
    for _ in 0..300 {
        if app.turns().await.len() == 3 && app.turns().await.iter().all(|(s, _)| s != "running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(autostart(&app, &agent).await, (None, None));
    let stored = app.messages(chat).await;
    let answered = stored
        .iter()
        .flat_map(|m| m["parts"].as_array().unwrap())
        .find(|p| p["toolCallId"] == "asked" && p["state"] == "output-error")
        .unwrap_or_else(|| panic!("no refused part: {stored:?}"));
    assert!(
        answered["errorText"]
            .as_str()
            .unwrap()
            .contains("only an admin"),
        "{answered}"
    );
}
