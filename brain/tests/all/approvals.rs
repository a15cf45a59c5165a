//! Approvals (SPEC A1-A4) through real turns: a call that asks ends its turn pending, the
//! answer (`POST /v1/approvals/{id}` or a `useChat` re-post with the real `ai@7` client)
//! resumes the loop in a new turn, at most once; a new message supersedes, expiry
//! expires, and a denied tool never runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crate::common::replies::text;
use crate::common::{TestApp, read_stream};
use protocol::ui::{FinishReason, UiChunk};
use scripted_provider::{Reply, ToolCall};
use serde_json::{Value, json};

fn remember(id: &str, note: &str) -> Reply {
    Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: id.into(),
            name: "memory_write".into(),
            arguments: json!({"content": note}).to_string(),
        }],
        fragment: 16,
    }
}

/// An agent with `policy` and a chat with it.
async fn agent_with(app: &TestApp, policy: Value) -> String {
    let agent = app
        .post_json(
            "/v1/agents",
            &json!({"name": "careful", "system_prompt": "You are terse.",
                    "model": "openai/gpt-test", "approval_policy": policy}),
        )
        .await;
    assert_eq!(agent.status(), 201);
    let agent: Value = agent.json().await.unwrap();
    assert_eq!(agent["approval_policy"]["ask"], policy["ask"]);
    let chat = app
        .post_json(
            &format!("/v1/agents/{}/chats", agent["id"].as_str().unwrap()),
            &json!({}),
        )
        .await;
    let chat: Value = chat.json().await.unwrap();
    chat["id"].as_str().unwrap().to_owned()
}

async fn memories(app: &TestApp) -> Vec<String> {
    sqlx::query_scalar("SELECT content FROM memories ORDER BY created_at")
        .fetch_all(app.store.pool())
        .await
        .unwrap()
}

async fn approvals(app: &TestApp, chat: &str) -> Vec<Value> {
    let response = app.get(&format!("/v1/chats/{chat}/approvals")).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    body["approvals"].as_array().unwrap().clone()
}

/// Sends a message whose model call asks for `memory_write`; answers the approval id.
async fn ask(app: &TestApp, chat: &str, note: &str) -> String {
    app.provider.push(remember("call-1", note));
    let response = app.send(chat, &json!({"content": "remember it"})).await;
    assert_eq!(response.status(), 200);
    let (chunks, done) = read_stream(response).await;
    assert!(done);
    let approval = chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::ToolApprovalRequest {
                approval_id,
                tool_call_id,
            } => {
                assert_eq!(tool_call_id, "call-1");
                Some(approval_id.clone())
            }
            _ => None,
        })
        .expect("a tool-approval-request part");
    assert_eq!(
        chunks.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::ToolCalls
        })
    );
    assert!(
        !chunks
            .iter()
            .any(|c| matches!(c, UiChunk::ToolOutputAvailable { .. })),
        "nothing ran: {chunks:?}"
    );
    app.settled().await;
    approval
}

async fn wait_turns(app: &TestApp, n: usize) {
    for _ in 0..300 {
        let turns = app.turns().await;
        if turns.len() >= n && turns.iter().all(|(s, _)| s != "running") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the continuation did not finish: {:?}", app.turns().await);
}

#[tokio::test]
async fn an_approved_call_runs_in_a_continuation() {
    let app = TestApp::start().await;
    let chat = agent_with(&app, json!({"ask": ["write"], "deny": []})).await;
    let approval = ask(&app, &chat, "the user likes tea").await;
    assert!(
        memories(&app).await.is_empty(),
        "nothing ran before the answer"
    );
    let listed = approvals(&app, &chat).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], approval);
    assert_eq!(listed[0]["state"], "pending");
    assert_eq!(listed[0]["tool"], "memory_write");
    assert_eq!(listed[0]["input"], json!({"content": "the user likes tea"}));
    // The hold was released: the agent is free while the call waits.
    let stored = app.messages(&chat).await;
    assert_eq!(stored[1]["parts"][1]["state"], "approval-requested");

    app.provider.push(text("Noted."));
    let answer = app
        .post_json(
            &format!("/v1/approvals/{approval}"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(answer.status(), 202);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["approval"]["state"], "approved");
    assert!(body["turn_id"].is_string());
    wait_turns(&app, 2).await;
    assert_eq!(memories(&app).await, vec!["the user likes tea".to_owned()]);
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 2);
    let second = requests[1].body.to_string();
    assert!(
        !second.contains("waiting for a person"),
        "the model reads the real result: {second}"
    );
    let stored = app.messages(&chat).await;
    assert_eq!(stored.len(), 3);
    assert_eq!(stored[1]["parts"][1]["state"], "output-available");
    assert_eq!(stored[1]["parts"][1]["approval"]["approved"], true);
    assert!(
        stored[2]["parts"].to_string().contains("Noted."),
        "{:?}",
        stored[2]
    );
    let again = app
        .post_json(
            &format!("/v1/approvals/{approval}"),
            &json!({"approved": false}),
        )
        .await;
    assert_eq!(again.status(), 409);
    let error: Value = again.json().await.unwrap();
    assert_eq!(error["error"]["code"], "conflict");
}

#[tokio::test]
async fn a_denial_and_its_reason_reach_the_model() {
    let app = TestApp::start().await;
    let chat = agent_with(&app, json!({"ask": ["memory_write"]})).await;
    let approval = ask(&app, &chat, "secret plans").await;
    app.provider.push(text("Understood, I will not."));
    let answer = app
        .post_json(
            &format!("/v1/approvals/{approval}"),
            &json!({"approved": false, "reason": "not about plans"}),
        )
        .await;
    assert_eq!(answer.status(), 202);
    wait_turns(&app, 2).await;
    assert!(memories(&app).await.is_empty(), "a denied call never runs");
    let second = app.provider.requests()[1].body.to_string();
    assert!(second.contains("a person denied this call"), "{second}");
    assert!(second.contains("not about plans"), "{second}");
    let listed = approvals(&app, &chat).await;
    assert_eq!(listed[0]["state"], "denied");
    assert_eq!(listed[0]["reason"], "not about plans");
    let stored = app.messages(&chat).await;
    assert_eq!(stored[1]["parts"][1]["state"], "output-denied");
}

#[tokio::test]
async fn two_concurrent_answers_one_wins() {
    let app = TestApp::start().await;
    let chat = agent_with(&app, json!({"ask": ["write"]})).await;
    let approval = ask(&app, &chat, "once").await;
    app.provider.push(text("Done."));
    app.provider.push(text("Done again."));
    let path = format!("/v1/approvals/{approval}");
    let yes = json!({"approved": true});
    let (a, b) = tokio::join!(app.post_json(&path, &yes), app.post_json(&path, &yes));
    let mut statuses = vec![a.status().as_u16(), b.status().as_u16()];
    statuses.sort_unstable();
    assert_eq!(statuses, vec![202, 409], "exactly one answer wins");
    wait_turns(&app, 2).await;
    assert_eq!(memories(&app).await, vec!["once".to_owned()]);
    assert_eq!(app.turns().await.len(), 2, "one continuation");
}

#[tokio::test]
async fn a_new_message_supersedes_a_pending_approval() {
    let app = TestApp::start().await;
    let chat = agent_with(&app, json!({"ask": ["write"]})).await;
    let approval = ask(&app, &chat, "stale").await;
    app.provider.push(text("Sure, something else."));
    let response = app.send(&chat, &json!({"content": "never mind"})).await;
    assert_eq!(response.status(), 200);
    read_stream(response).await;
    app.settled().await;
    let listed = approvals(&app, &chat).await;
    assert_eq!(listed[0]["state"], "superseded");
    // The basis kept from the first turn knew of no waiting call: the intake
    // found it stale and the message started over from Postgres, which denied the call.
    let scrape = app.metrics().await;
    let stale =
        test_support::promtool::sample(&scrape, "brain_turn_bases_total", &[("source", "stale")]);
    assert_eq!(stale, Some(1.0));
    let second = app.provider.requests()[1].body.to_string();
    assert!(
        second.contains("the user sent a new message"),
        "the history has a denial for the call: {second}"
    );
    let answer = app
        .post_json(
            &format!("/v1/approvals/{approval}"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(answer.status(), 409);
    assert!(memories(&app).await.is_empty());
}

#[tokio::test]
async fn an_unanswered_approval_expires() {
    let app = TestApp::start_with(|c| c.approval_ttl = Duration::from_millis(200)).await;
    let chat = agent_with(&app, json!({"ask": ["write"]})).await;
    let approval = ask(&app, &chat, "too late").await;
    // Past its expiry by the store's clock, the one the answer is judged by.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let expired: bool =
            sqlx::query_scalar("SELECT expires_at <= now() FROM approvals WHERE id = $1::uuid")
                .bind(&approval)
                .fetch_one(app.store.pool())
                .await
                .unwrap();
        if expired {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answer = app
        .post_json(
            &format!("/v1/approvals/{approval}"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(answer.status(), 409);
    let listed = approvals(&app, &chat).await;
    assert_eq!(listed[0]["state"], "expired");
    let stored = app.messages(&chat).await;
    assert_eq!(stored[1]["parts"][1]["state"], "output-denied");
    assert!(memories(&app).await.is_empty());
    assert_eq!(app.turns().await.len(), 1, "no continuation");
}

#[tokio::test]
async fn a_denied_tool_never_runs_nor_asks() {
    let app = TestApp::start().await;
    let chat = agent_with(&app, json!({"ask": ["write"], "deny": ["memory_write"]})).await;
    app.provider.push(remember("call-1", "forbidden"));
    app.provider.push(text("I may not."));
    let response = app.send(&chat, &json!({"content": "remember it"})).await;
    let (chunks, _) = read_stream(response).await;
    app.settled().await;
    assert!(
        !chunks
            .iter()
            .any(|c| matches!(c, UiChunk::ToolApprovalRequest { .. }))
    );
    assert!(chunks.iter().any(|c| matches!(c,
        UiChunk::ToolOutputError { error_text, .. } if error_text.contains("policy never runs"))));
    assert!(memories(&app).await.is_empty());
    assert!(approvals(&app, &chat).await.is_empty());
}

#[tokio::test]
async fn policies_are_validated() {
    let app = TestApp::start().await;
    for policy in [
        json!({"ask": ["dangerous things"]}),
        json!({"deny": ["has space"]}),
        json!({"ask": [], "allow": []}),
    ] {
        let response = app
            .post_json(
                "/v1/agents",
                &json!({"name": "x", "system_prompt": "", "model": "openai/gpt-test",
                        "approval_policy": policy}),
            )
            .await;
        assert_eq!(response.status(), 400, "{policy}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_request");
    }
}

#[tokio::test]
async fn another_teams_approval_is_not_found() {
    let app = TestApp::start().await;
    let chat = agent_with(&app, json!({"ask": ["write"]})).await;
    let approval = ask(&app, &chat, "mine").await;
    let other = app.store.create_team("other").await.unwrap();
    let response = app
        .http
        .post(format!("{}/v1/approvals/{approval}", app.url))
        .bearer_auth(&other.api_key)
        .json(&json!({"approved": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(approvals(&app, &chat).await[0]["state"], "pending");
}

#[tokio::test]
async fn the_ai_sdk_client_approves_and_the_tool_runs() {
    let app = TestApp::start().await;
    let chat = agent_with(&app, json!({"ask": ["write"]})).await;
    app.provider
        .push(remember("call-1", "approved through useChat"));
    app.provider.push(text("Remembered."));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/ai-sdk/approve.mjs");
    let output = tokio::process::Command::new("node")
        .arg(script)
        .arg(format!("{}/v1/chats/{chat}/messages", app.url))
        .arg(&app.key)
        .arg("Remember this")
        .output()
        .await
        .expect("node must be installed (make test installs it)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let messages: Value = serde_json::from_slice(&output.stdout).unwrap();
    let assistant = messages.as_array().unwrap().last().unwrap();
    assert_eq!(assistant["role"], "assistant");
    let tool = assistant["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "tool-memory_write")
        .unwrap();
    assert_eq!(tool["state"], "output-available", "{assistant}");
    assert_eq!(tool["approval"]["approved"], true);
    assert!(assistant["parts"].to_string().contains("Remembered."));
    wait_turns(&app, 2).await;
    assert_eq!(
        memories(&app).await,
        vec!["approved through useChat".to_owned()]
    );
    assert_eq!(approvals(&app, &chat).await[0]["state"], "approved");
}

/// A3: the answer is recorded before the continuation's connectors start and its turn
/// row is written. A client that hangs up in that window (here a connector that accepts
/// and never answers holds the continuation for its startup timeout) does not strand the
/// approved call: it runs all the same, within a bound.
#[tokio::test]
async fn an_answer_whose_client_hangs_up_at_once_still_runs_the_call() {
    let app = TestApp::start_with(|c| {
        c.connectors.allow_private_networks = true;
        c.connectors.startup_timeout = Duration::from_secs(2);
    })
    .await;
    let chat = agent_with(&app, json!({"ask": ["write"], "deny": []})).await;
    let approval = ask(&app, &chat, "the user likes tea").await;
    // A server that accepts connections and never answers them.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}/mcp", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let created = app
        .post_json(
            "/v1/connectors",
            &json!({"name": "silent", "url": silent_url}),
        )
        .await;
    assert_eq!(created.status(), 201);

    app.provider.push(text("Noted."));
    let hung_up = app
        .auth(
            app.http
                .post(format!("{}/v1/approvals/{approval}", app.url)),
        )
        .json(&json!({"approved": true}))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(hung_up.is_err(), "the client gave up first: {hung_up:?}");
    for _ in 0..100 {
        if !memories(&app).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(memories(&app).await, vec!["the user likes tea".to_owned()]);
    wait_turns(&app, 2).await;
    held.abort();
}

/// A3: answers to several approvals of a turn land all or none; one that finds its
/// approval expired records nothing of the others.
#[tokio::test]
async fn a_multi_answer_with_an_expired_approval_records_nothing_else() {
    let app = TestApp::start().await;
    let chat = agent_with(&app, json!({"ask": ["write"], "deny": []})).await;
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: ["first", "second"]
            .into_iter()
            .map(|id| ToolCall {
                id: id.into(),
                name: "memory_write".into(),
                arguments: json!({"content": id}).to_string(),
            })
            .collect(),
        fragment: 16,
    });
    let (_, done) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    assert!(done);
    app.settled().await;
    let listed = approvals(&app, &chat).await;
    assert_eq!(listed.len(), 2);
    let ids: Vec<uuid::Uuid> = listed
        .iter()
        .map(|a| a["id"].as_str().unwrap().parse().unwrap())
        .collect();
    sqlx::query("UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(ids[1])
        .execute(app.store.pool())
        .await
        .unwrap();
    let answers: Vec<store::Answer> = ids
        .iter()
        .map(|&id| store::Answer {
            id,
            approved: true,
            reason: None,
        })
        .collect();
    let by = store::Answerer {
        actor: "test",
        admin: false,
    };
    let answered = app
        .store
        .answer_approvals(
            app.team,
            chat.parse().unwrap(),
            &answers,
            protocol::TurnId::new(),
            by,
        )
        .await
        .unwrap();
    assert!(
        matches!(answered, store::Answered::Closed(ref row) if row.id == ids[1]),
        "{answered:?}"
    );
    let states: Vec<(uuid::Uuid, String)> =
        sqlx::query_as("SELECT id, state FROM approvals ORDER BY part_index")
            .fetch_all(app.store.pool())
            .await
            .unwrap();
    assert_eq!(
        states,
        vec![
            (ids[0], "pending".to_owned()),
            (ids[1], "expired".to_owned())
        ]
    );
}

/// A3: a continuation whose turn row was never written (its replica died, or a store
/// call failed, between the answer and the turn) is started again by a live replica.
#[tokio::test]
async fn a_stranded_continuation_is_started_again() {
    let app = TestApp::start_with(|c| c.lease_ttl = Duration::from_millis(400)).await;
    let chat = agent_with(&app, json!({"ask": ["write"], "deny": []})).await;
    let approval = ask(&app, &chat, "the user likes tea").await;
    // What a replica that died right after recording the answer leaves: the approval
    // answered, its continuation named, no such turn.
    sqlx::query(
        "UPDATE approvals SET state = 'approved', answered_at = now() - interval '1 hour', \
         continuation_turn = gen_random_uuid(), answered_by = 'key:test', answered_admin = false \
         WHERE id = $1::uuid",
    )
    .bind(&approval)
    .execute(app.store.pool())
    .await
    .unwrap();
    app.provider.push(text("Noted."));
    for _ in 0..100 {
        if !memories(&app).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(memories(&app).await, vec!["the user likes tea".to_owned()]);
    wait_turns(&app, 2).await;
    let continued: Option<uuid::Uuid> =
        sqlx::query_scalar("SELECT continuation_turn FROM approvals WHERE id = $1::uuid")
            .bind(&approval)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    let turn_exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM turns WHERE id = $1)")
        .bind(continued.unwrap())
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert!(turn_exists, "the continuation now names its turn");
}
