//! B7, X5: an agent hands a task to another agent of its team with the `delegate` tool;
//! the child turn runs with the parent's authority, its approvals fail closed, its tree is
//! bounded, and a stop of the parent stops it. Real brain, scripted model.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tokio::io::AsyncBufReadExt;

use crate::common::replies::{call, calls, text};
use crate::common::{TestApp, error_code, key_with_scope, read_stream, send_as, streamed_text};
use protocol::ui::{DelegationEvent, UiChunk};
use scripted_provider::Reply;
use serde_json::{Value, json};

/// A new agent named `name` that may delegate to `delegates`: its id.
async fn agent(app: &TestApp, name: &str, delegates: &[&str], extra: Value) -> String {
    let mut body = json!({"name": name, "system_prompt": format!("You are {name}."),
                          "model": "openai/gpt-test", "delegates": delegates});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let created = app.post_json("/v1/agents", &body).await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    assert_eq!(created["delegates"], json!(delegates));
    created["id"].as_str().unwrap().to_owned()
}

/// A tool call's result in `chunks`: Ok(output) or Err(error text).
fn outcome(chunks: &[UiChunk], id: &str) -> Result<String, String> {
    chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::ToolOutputAvailable {
                tool_call_id,
                output,
            } if tool_call_id == id => Some(Ok(output.as_str().unwrap_or_default().to_owned())),
            UiChunk::ToolOutputError {
                tool_call_id,
                error_text,
            } if tool_call_id == id => Some(Err(error_text.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no result for {id}: {chunks:?}"))
}

fn delegate(id: &str, agent: &str, task: &str) -> scripted_provider::ToolCall {
    call(id, "delegate", json!({"agent": agent, "task": task}))
}

async fn turn_json(app: &TestApp, turn: &str) -> Value {
    let response = app.get(&format!("/v1/turns/{turn}")).await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// The turns of the team, oldest first: (id, status, parent).
async fn turn_rows(app: &TestApp) -> Vec<(String, String, Option<String>)> {
    sqlx::query_as(
        "SELECT id::text, status, parent_turn_id::text FROM turns ORDER BY started_at, id",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap()
}

/// Waits until the scripted model has received `n` requests.
pub(crate) async fn requests_reach(app: &TestApp, n: usize) {
    tokio::time::timeout(Duration::from_secs(20), async {
        while app.provider.requests().len() < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} requests, wanted {n}", app.provider.requests().len()));
}

fn held() -> Reply {
    Reply::Held {
        delta: "working ".into(),
        every: Duration::from_millis(20),
    }
}

#[tokio::test]
async fn a_delegate_answers_and_the_turns_name_each_other() {
    let app = TestApp::start().await;
    let helper = agent(&app, "helper", &[], json!({})).await;
    let lead = agent(&app, "lead", &[&helper], json!({})).await;
    let chat = app.new_chat(&lead).await;
    app.provider
        .push(calls(vec![delegate("d1", "helper", "Add 40 and 2.")]));
    app.provider.push(text("The sum is 42."));
    app.provider.push(text("Done."));
    let (chunks, done) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    assert!(done, "{chunks:?}");
    app.settled().await;
    assert_eq!(outcome(&chunks, "d1"), Ok("The sum is 42.".to_owned()));

    // The child ran as the helper: its prompt, the task as its message.
    let child_request = app.provider.requests()[1].body.clone();
    let messages = child_request["messages"].to_string();
    assert!(messages.contains("You are helper."), "{messages}");
    assert!(messages.contains("Add 40 and 2."), "{messages}");
    assert!(!messages.contains("You are lead."), "{messages}");

    // The parent's stream showed the child working, tagged with the call.
    let progress: Vec<&DelegationEvent> = chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::DataDelegation { data, .. } if data.tool_call_id == "d1" => Some(&data.event),
            _ => None,
        })
        .collect();
    assert_eq!(progress.first(), Some(&&DelegationEvent::Started));
    assert!(
        progress
            .iter()
            .any(|e| matches!(e, DelegationEvent::Text { delta } if delta.contains("42")))
    );
    assert_eq!(
        progress.last(),
        Some(&&DelegationEvent::Finished {
            status: "completed".into()
        })
    );

    // parent_turn_id on the child, children on the parent.
    let rows = turn_rows(&app).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    let (parent, child) = (&rows[0].0, &rows[1].0);
    assert_eq!(rows[1].2.as_deref(), Some(parent.as_str()));
    let shown = turn_json(&app, parent).await;
    assert_eq!(shown["children"], json!([child]));
    assert_eq!(shown["parent_turn_id"], Value::Null);
    let shown = turn_json(&app, child).await;
    assert_eq!(shown["parent_turn_id"], json!(parent));
    assert_eq!(shown["agent_id"], json!(helper));

    // E1: the child's model call is billed to the team, beside the parent's.
    let billed: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT turn_id) FROM billing_events WHERE team_id = $1")
            .bind(app.team.0)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(billed, 2);
}

#[tokio::test]
async fn delegate_calls_of_one_step_run_at_once_up_to_the_cap() {
    let app = TestApp::start_with(|c| c.delegation.max_parallel = 2).await;
    let b = agent(&app, "b", &[], json!({})).await;
    let c = agent(&app, "c", &[], json!({})).await;
    let d = agent(&app, "d", &[], json!({})).await;
    let lead = agent(&app, "lead", &[&b, &c, &d], json!({})).await;
    let chat = app.new_chat(&lead).await;
    app.provider.push(calls(vec![
        delegate("to-b", "b", "part one"),
        delegate("to-c", "c", "part two"),
        delegate("to-d", "d", "part three"),
    ]));
    app.provider.push(held());
    app.provider.push(held());
    app.provider.push(text("Done."));
    let response = app.send(&chat, &json!({"content": "go"})).await;
    let posted = tokio::spawn(read_stream(response));
    // Both children stream at the same time: neither answers before the release.
    requests_reach(&app, 3).await;
    app.provider.release_held();
    let (chunks, done) = posted.await.unwrap();
    assert!(done, "{chunks:?}");
    app.settled().await;
    assert!(outcome(&chunks, "to-b").unwrap().contains("working"));
    assert!(outcome(&chunks, "to-c").unwrap().contains("working"));
    let refused = outcome(&chunks, "to-d").unwrap_err();
    assert!(refused.contains("at most 2 delegated tasks"), "{refused}");
    assert_eq!(app.provider.requests().len(), 4);
}

#[tokio::test]
async fn a_recursive_delegation_ends_with_a_clear_error() {
    let app = TestApp::start().await;
    let a = agent(&app, "alpha", &[], json!({})).await;
    let b = agent(&app, "beta", &[&a], json!({})).await;
    let patched = app
        .auth(app.http.patch(format!("{}/v1/agents/{a}", app.url)))
        .json(&json!({"delegates": [b]}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);
    let chat = app.new_chat(&a).await;
    app.provider
        .push(calls(vec![delegate("ab", "beta", "ask alpha")]));
    app.provider
        .push(calls(vec![delegate("ba", "alpha", "back to you")]));
    app.provider.push(text("Alpha cannot be asked again."));
    app.provider.push(text("Done."));
    let (chunks, done) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    assert!(done, "{chunks:?}");
    app.settled().await;
    assert_eq!(
        outcome(&chunks, "ab"),
        Ok("Alpha cannot be asked again.".to_owned())
    );
    // Beta's model read the refusal of its call back to alpha; no third turn started.
    let beta_second = app.provider.requests()[2].body["messages"].to_string();
    assert!(
        beta_second.contains("recursive delegation"),
        "{beta_second}"
    );
    assert_eq!(turn_rows(&app).await.len(), 2);
}

#[tokio::test]
async fn stopping_the_parent_stops_the_child() {
    let app = TestApp::start().await;
    let helper = agent(&app, "helper", &[], json!({})).await;
    let lead = agent(&app, "lead", &[&helper], json!({})).await;
    let chat = app.new_chat(&lead).await;
    app.provider
        .push(calls(vec![delegate("d1", "helper", "take your time")]));
    app.provider.push(held());
    let response = app.send(&chat, &json!({"content": "go"})).await;
    let posted = tokio::spawn(read_stream(response));
    requests_reach(&app, 2).await;
    let parent = turn_rows(&app).await[0].0.clone();
    let stopped = app
        .auth(app.http.post(format!("{}/v1/turns/{parent}/stop", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(stopped.status(), 202);
    let (chunks, _) = posted.await.unwrap();
    assert!(
        chunks.iter().any(|c| matches!(c, UiChunk::Finish { .. })),
        "{chunks:?}"
    );
    app.settled().await;
    // The child's provider stream was cut, and both turns ended interrupted.
    assert!(
        !app.provider
            .wait_aborted(1, Duration::from_secs(10))
            .await
            .is_empty()
    );
    let rows = turn_rows(&app).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter().all(|(_, status, _)| status == "interrupted"),
        "{rows:?}"
    );
    app.provider.release_held();
}

/// X5: a chat key's turn may not change the agent for everyone (X1), and neither may the
/// task it delegates: the child's `cron_set` is refused and nothing is planted.
#[tokio::test]
async fn a_chat_keys_child_cannot_plant_an_autostart() {
    let app = TestApp::start().await;
    let helper = agent(&app, "helper", &[], json!({})).await;
    let lead = agent(&app, "lead", &[&helper], json!({})).await;
    let chat = app.new_chat(&lead).await;
    let (chat_key, _) = key_with_scope(&app, "chat").await;
    app.provider
        .push(calls(vec![delegate("d1", "helper", "schedule yourself")]));
    app.provider.push(calls(vec![call(
        "plant",
        "cron_set",
        json!({"cron": "0 9 * * *", "prompt": "post the secrets"}),
    )]));
    app.provider.push(text("I may not."));
    app.provider.push(text("Done."));
    let chunks = send_as(&app, &chat_key, &chat, "go").await;
    assert_eq!(outcome(&chunks, "d1"), Ok("I may not.".to_owned()));
    let refusal = app.provider.requests()[2].body["messages"].to_string();
    assert!(refusal.contains("only an admin"), "{refusal}");
    let planted: Option<String> =
        sqlx::query_scalar("SELECT autostart_cron FROM agents WHERE id = $1::uuid")
            .bind(&helper)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(planted, None);
}

/// X5: nobody answers a delegated task's questions: a call its policy would hold is
/// denied at once, and the parent reads why.
#[tokio::test]
async fn an_approval_in_a_child_fails_closed() {
    let app = TestApp::start().await;
    let careful = agent(
        &app,
        "careful",
        &[],
        json!({"approval_policy": {"ask": ["memory_write"]}}),
    )
    .await;
    let lead = agent(&app, "lead", &[&careful], json!({})).await;
    let chat = app.new_chat(&lead).await;
    app.provider
        .push(calls(vec![delegate("d1", "careful", "remember this")]));
    app.provider.push(calls(vec![call(
        "note",
        "memory_write",
        json!({"content": "a note"}),
    )]));
    app.provider.push(text("I could not remember it."));
    app.provider.push(text("Done."));
    let (chunks, done) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    assert!(done, "{chunks:?}");
    app.settled().await;
    let answer = outcome(&chunks, "d1").unwrap();
    assert!(answer.starts_with("I could not remember it."), "{answer}");
    assert!(
        answer.contains("refused in a delegated task: `memory_write` needs a person's approval"),
        "{answer}"
    );
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM approvals")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(waiting, 0);
    let notes: i64 = sqlx::query_scalar("SELECT count(*) FROM memories")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(notes, 0);
}

#[tokio::test]
async fn delegates_are_agents_of_the_same_team() {
    let app = TestApp::start().await;
    let other = app.store.create_team("other team").await.unwrap();
    let theirs: Value = app
        .http
        .post(format!("{}/v1/agents", app.url))
        .bearer_auth(&other.api_key)
        .json(&json!({"name": "theirs", "system_prompt": "", "model": "openai/gpt-test"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let theirs = theirs["id"].as_str().unwrap().to_owned();
    let unknown = uuid::Uuid::new_v4().to_string();
    for id in [&theirs, &unknown] {
        let refused = app
            .post_json(
                "/v1/agents",
                &json!({"name": "x", "system_prompt": "", "model": "openai/gpt-test",
                        "delegates": [id]}),
            )
            .await;
        let (status, code) = error_code(refused).await;
        assert_eq!((status, code.as_str()), (400, "unknown_delegate"), "{id}");
    }
    let mine = agent(&app, "mine", &[], json!({})).await;
    for id in [&theirs, &unknown, &mine] {
        let refused = app
            .auth(app.http.patch(format!("{}/v1/agents/{mine}", app.url)))
            .json(&json!({"delegates": [id]}))
            .send()
            .await
            .unwrap();
        let (status, code) = error_code(refused).await;
        assert_eq!((status, code.as_str()), (400, "unknown_delegate"), "{id}");
    }
    let shown: Value = app
        .get(&format!("/v1/agents/{mine}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(shown["delegates"], json!([]));
}

/// The progress events of delegate call `id` in the parent's stream.
fn progress_of<'a>(chunks: &'a [UiChunk], id: &str) -> Vec<&'a DelegationEvent> {
    chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::DataDelegation { data, .. } if data.tool_call_id == id => Some(&data.event),
            _ => None,
        })
        .collect()
}

/// Asserts that the parent's stream showed the delegate's own call `d2` failing inside the
/// delegate call `d1`.
fn assert_d2_failed_inside_d1(chunks: &[UiChunk]) {
    let progress = progress_of(chunks, "d1");
    assert!(
        progress.contains(&&DelegationEvent::ToolResult {
            tool_call_id: "d2".into(),
            error: true
        }),
        "{progress:?}"
    );
}

/// Agents `lead` → `middle` → `last` and a chat with the lead, whose model's first two
/// steps are scripted: the lead delegates to the middle (`d1`), the middle to the last
/// (`d2`). The chat's id.
async fn chain_of_three(app: &TestApp) -> String {
    let last = agent(app, "last", &[], json!({})).await;
    let middle = agent(app, "middle", &[&last], json!({})).await;
    let lead = agent(app, "lead", &[&middle], json!({})).await;
    app.provider
        .push(calls(vec![delegate("d1", "middle", "go one level")]));
    app.provider
        .push(calls(vec![delegate("d2", "last", "go two levels")]));
    app.new_chat(&lead).await
}

/// X5: a task delegated deeper than `BRAIN_DELEGATION_MAX_DEPTH` is refused as the
/// delegate call's error (no turn starts); the delegate that asked reads why and answers.
#[tokio::test]
async fn a_delegation_deeper_than_the_limit_is_the_calls_error() {
    let app = TestApp::start_with(|c| c.delegation.max_depth = 1).await;
    let chat = chain_of_three(&app).await;
    app.provider.push(text("I did it myself."));
    app.provider.push(text("Done."));
    let (chunks, done) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    assert!(done, "{chunks:?}");
    app.settled().await;
    assert_eq!(outcome(&chunks, "d1"), Ok("I did it myself.".to_owned()));
    // The middle's call was the refused one, and the lead's stream showed it failing.
    assert_d2_failed_inside_d1(&chunks);
    let middle_second = app.provider.requests()[2].body["messages"].to_string();
    assert!(
        middle_second.contains("delegated tasks go at most 1 deep and this one would be 2 deep"),
        "{middle_second}"
    );
    assert_eq!(turn_rows(&app).await.len(), 2, "no turn of `last` started");
    assert_eq!(app.provider.requests().len(), 4);
}

/// X5: the model calls of a whole tree of delegated turns are bounded
/// (`BRAIN_DELEGATION_MAX_TREE_MODEL_CALLS`): a child that finds none left stops, its
/// delegate call is an error that says so, a call into the spent tree starts no turn, and
/// the turn a person started goes on.
#[tokio::test]
async fn a_tree_out_of_model_calls_is_the_delegate_calls_error() {
    let app = TestApp::start_with(|c| c.delegation.max_tree_model_calls = 1).await;
    // The tree's one model call is the middle's first step.
    let chat = chain_of_three(&app).await;
    app.provider.push(text("The helpers ran out."));
    let (chunks, done) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    assert!(done, "{chunks:?}");
    app.settled().await;
    assert_eq!(streamed_text(&chunks), "The helpers ran out.");
    let refused = outcome(&chunks, "d1").unwrap_err();
    assert!(
        refused.contains("the delegated task of `middle` stopped: the model calls of this tree")
            && refused.contains("spent"),
        "{refused}"
    );
    // The middle's own call to `last` found the tree spent and was refused: no turn of
    // `last` started.
    assert_d2_failed_inside_d1(&chunks);
    assert_eq!(
        progress_of(&chunks, "d1").last(),
        Some(&&DelegationEvent::Finished {
            status: "completed".into()
        })
    );
    // Lead, middle, lead: three model calls; two turns, the parent's completed.
    assert_eq!(app.provider.requests().len(), 3);
    let lead_second = app.provider.requests()[2].body["messages"].to_string();
    assert!(lead_second.contains("are spent"), "{lead_second}");
    let rows = turn_rows(&app).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].1, "completed", "{rows:?}");
}

/// B7, B8 in a real browser (tests/web/delegation.mjs): the lead's settings name its
/// delegate and a skill (saved with `PATCH /v1/agents/{id}`), and the delegated task shows
/// as a card nested in the delegate call's: the delegate's name, its tool call, its text
/// while it still writes (its model held until the page saw it) and its end.
#[tokio::test]
async fn the_page_sets_delegates_and_shows_the_delegated_task() {
    let app = TestApp::start().await;
    let uploaded = crate::skills::upload_as(&app, &app.key, &crate::skills::hello("Greets.")).await;
    assert_eq!(uploaded.status(), 201);
    let helper = agent(&app, "helper", &[], json!({})).await;
    let lead = agent(&app, "lead", &[], json!({})).await;
    app.provider
        .push(calls(vec![delegate("d1", "helper", "Look for notes.")]));
    app.provider.push(calls(vec![call(
        "m1",
        "memory_search",
        json!({"query": "notes"}),
    )]));
    app.provider.push(held());
    app.provider.push(text("The lead is done."));

    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-chat");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/web/delegation.mjs");
    let mut page = tokio::process::Command::new("node")
        .arg(script)
        .args([
            &app.url,
            &app.key,
            "lead",
            "helper",
            "hello",
            "Find my notes",
            "memory_search",
            "working",
            "The lead is done.",
            out.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs (scripts/test-deps.sh installs tests/web)");
    let mut lines = tokio::io::BufReader::new(page.stdout.take().unwrap()).lines();
    let bound = Duration::from_secs(180);
    // The page showed the delegate working before its model was let go.
    let live = tokio::time::timeout(bound, lines.next_line()).await;
    let live = live
        .expect("the page answers within three minutes")
        .unwrap();
    app.provider.release_held();
    let ids = tokio::time::timeout(bound, lines.next_line()).await;
    let ids = ids.expect("the page ends within three minutes").unwrap();
    let run = tokio::time::timeout(bound, page.wait_with_output()).await;
    let run = run.expect("the browser ends").unwrap();
    assert!(
        run.status.success() && live.as_deref() == Some("live"),
        "the page did not show the delegated task:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // The settings the page saved are the agent's, and the delegation they allowed ran.
    let shown = agent_json(&app, &lead).await;
    assert_eq!(shown["delegates"], json!([helper]));
    assert_eq!(shown["skills"], json!(["hello"]));
    let rows = turn_rows(&app).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[1].2.as_deref(), Some(rows[0].0.as_str()));
    let ids: Value = serde_json::from_str(&ids.unwrap()).unwrap();
    let messages = app.messages(ids["chatId"].as_str().unwrap()).await;
    assert!(
        messages.last().unwrap()["parts"]
            .to_string()
            .contains("working"),
        "the delegate call's result is in the transcript"
    );
    for shot in ["delegation-settings", "delegation-live", "delegation-card"] {
        assert!(out.join(format!("{shot}.png")).is_file(), "{shot} saved");
    }
}

async fn agent_json(app: &TestApp, agent: &str) -> Value {
    let response = app.get(&format!("/v1/agents/{agent}")).await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}
