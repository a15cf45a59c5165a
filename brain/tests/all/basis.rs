//! The bases a replica keeps (issue 31, `brain/src/turn/basis.rs`): a turn starts from its
//! chat and agent as this replica last read them, and no turn runs on a stale one: the
//! intake's statement finds it stale and the turn starts over from Postgres.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::replies::deltas;
use crate::common::{TestApp, error_code, read_stream};
use serde_json::json;

/// `brain_turn_bases_total{source}` of `app`'s replica.
async fn bases(app: &TestApp, source: &str) -> f64 {
    let scrape = app.metrics().await;
    test_support::promtool::sample(&scrape, "brain_turn_bases_total", &[("source", source)])
        .unwrap_or_else(|| panic!("no brain_turn_bases_total{{source={source}}}"))
}

async fn turn(app: &TestApp, chat: &str) {
    app.provider.push(deltas(&["ok"]));
    let response = app.send(chat, &json!({"content": "hi"})).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    assert!(read_stream(response).await.1);
    app.settled().await;
}

/// An agent changed through another replica: this replica's next turn of the chat sends
/// the new prompt, having found what it kept stale; the turn after starts from the kept
/// basis again.
#[tokio::test]
async fn a_prompt_changed_through_another_replica_reaches_the_next_turn() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("anthropic/claude-test", &[]).await;
    turn(&app, &chat).await;
    turn(&app, &chat).await;
    assert_eq!(bases(&app, "read").await, 1.0);
    assert_eq!(bases(&app, "kept").await, 1.0);

    let other = app.second_replica().await;
    let patched = app
        .auth(app.http.patch(format!("{other}/v1/agents/{agent}")))
        .json(&json!({"system_prompt": "You are verbose."}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);

    turn(&app, &chat).await;
    let requests = app.provider.requests();
    assert_eq!(requests[1].body["system"], "You are terse.");
    assert_eq!(requests[2].body["system"], "You are verbose.");
    assert_eq!(requests.len(), 3, "the stale intake called no model");
    assert_eq!(bases(&app, "stale").await, 1.0);
    assert_eq!(bases(&app, "read").await, 2.0);
    let (turns,): (i64,) = sqlx::query_as("SELECT count(*) FROM turns")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(turns, 3, "the stale intake wrote no turn");

    turn(&app, &chat).await;
    assert_eq!(
        app.provider.requests()[3].body["system"],
        "You are verbose."
    );
    assert_eq!(bases(&app, "stale").await, 1.0);
    assert_eq!(bases(&app, "kept").await, 3.0);
}

/// An agent archived behind this replica's back (any writer: the trigger bumps its
/// version) runs no new turn here, though the kept basis says it is live.
#[tokio::test]
async fn an_agent_archived_elsewhere_runs_no_turn_from_a_kept_basis() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    turn(&app, &chat).await;
    sqlx::query("UPDATE agents SET archived_at = now() WHERE id = $1::uuid")
        .bind(&agent)
        .execute(app.store.pool())
        .await
        .unwrap();

    let response = app.send(&chat, &json!({"content": "hi"})).await;
    let (status, code) = error_code(response).await;
    assert_eq!((status, code.as_str()), (404, "not_found"));
    assert_eq!(bases(&app, "stale").await, 1.0);
    assert_eq!(app.provider.requests().len(), 1);
    assert_eq!(app.messages(&chat).await.len(), 2, "nothing was written");
}
