//! Retention (L6): a team's `retention_days` and the sweep any replica may run, one at a
//! time under an advisory lock: turns that ended before the cutoff go with their messages,
//! artifacts and snapshots made before it go with their bytes; the rest stays.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::replies::text;
use crate::common::{TestApp, error_code, read_stream};
use crate::erasure::{artifacts_dir, eventually, files_under, stored_snapshot};

async fn put_settings(app: &TestApp, bearer: &str, body: Value) -> reqwest::Response {
    app.http
        .request(Method::PUT, format!("{}/v1/team/settings", app.url))
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// An artifact row of `chat` made `days_ago`, with its bytes: its storage key.
async fn artifact(app: &TestApp, agent: &str, chat: &str, days_ago: i32) -> String {
    let id = uuid::Uuid::new_v4();
    let key = format!("{}/{id}", app.team);
    let path = artifacts_dir(app).join(&key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"artifact bytes").unwrap();
    sqlx::query(
        "INSERT INTO artifacts (id, team_id, agent_id, chat_id, name, content_type, size_bytes,
                                sha256, storage_key, created_at)
         VALUES ($1, $2, $3::uuid, $4::uuid, 'a.txt', 'text/plain', 14, repeat('0', 64), $5,
                 now() - make_interval(days => $6))",
    )
    .bind(id)
    .bind(app.team.0)
    .bind(agent)
    .bind(chat)
    .bind(&key)
    .bind(days_ago)
    .execute(app.store.pool())
    .await
    .unwrap();
    key
}

#[tokio::test]
async fn the_retention_is_an_admins_setting_in_days() {
    let app = TestApp::start().await;
    let read: Value = app.get("/v1/team/settings").await.json().await.unwrap();
    assert_eq!(read["retention_days"], Value::Null);
    for bad in [
        json!({"retention_days": 0}),
        json!({"retention_days": 36_501}),
        json!({"retention_days": "90"}),
        json!({"retention_days": 90, "keep": true}),
    ] {
        let refused = put_settings(&app, &app.key, bad.clone()).await;
        assert_eq!(
            error_code(refused).await,
            (400, "invalid_request".into()),
            "{bad}"
        );
    }
    let chat_key = app.chat_key().await;
    let refused = put_settings(&app, &chat_key, json!({"retention_days": 30})).await;
    assert_eq!(error_code(refused).await, (403, "forbidden".into()));
    let set = put_settings(&app, &app.key, json!({"retention_days": 30})).await;
    assert_eq!(set.status(), 200);
    let read: Value = app.get("/v1/team/settings").await.json().await.unwrap();
    assert_eq!(read["retention_days"], 30);
    let cleared = put_settings(&app, &app.key, json!({"retention_days": null})).await;
    assert_eq!(
        cleared.json::<Value>().await.unwrap()["retention_days"],
        Value::Null
    );
}

#[tokio::test]
async fn the_sweep_deletes_what_is_past_retention_and_keeps_the_rest() {
    let app =
        TestApp::start_with(|c| c.retention_sweep_interval = Duration::from_millis(200)).await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(text("old reply"));
    read_stream(app.send(&chat, &json!({"content": "old question"})).await).await;
    app.provider.push(text("new reply"));
    read_stream(app.send(&chat, &json!({"content": "new question"})).await).await;
    app.settled().await;
    // The first turn ended three days ago, and the chat's summary covers it.
    let old_seq: i64 = sqlx::query_scalar(
        "WITH old AS (
             UPDATE turns SET started_at = now() - interval '3 days',
                              finished_at = now() - interval '3 days'
             WHERE id = (SELECT turn_id FROM messages WHERE chat_id = $1::uuid
                         ORDER BY seq LIMIT 1)
             RETURNING id)
         SELECT max(seq) FROM messages WHERE turn_id = (SELECT id FROM old)",
    )
    .bind(&chat)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    sqlx::query(
        "UPDATE chats SET summary = 'the old question', summary_through = $2 WHERE id = $1::uuid",
    )
    .bind(&chat)
    .bind(old_seq)
    .execute(app.store.pool())
    .await
    .unwrap();
    let old_artifact = artifact(&app, &agent, &chat, 3).await;
    let new_artifact = artifact(&app, &agent, &chat, 0).await;
    let session = uuid::Uuid::new_v4();
    let old_snapshot = stored_snapshot(&app, &agent, &chat, session).await;
    sqlx::query("UPDATE workspace_snapshots SET created_at = now() - interval '3 days'")
        .execute(app.store.pool())
        .await
        .unwrap();

    // Nothing goes while the team keeps everything.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(app.messages(&chat).await.len(), 4);

    let set = put_settings(&app, &app.key, json!({"retention_days": 2})).await;
    assert_eq!(set.status(), 200);
    eventually(Duration::from_secs(10), "the old turn goes", || async {
        app.messages(&chat).await.len() == 2
    })
    .await;
    let kept = app.messages(&chat).await;
    assert!(
        kept[0]["parts"].to_string().contains("new question"),
        "{kept:?}"
    );
    assert!(
        kept[1]["parts"].to_string().contains("new reply"),
        "{kept:?}"
    );
    let (summary, through): (String, i64) =
        sqlx::query_as("SELECT summary, summary_through FROM chats WHERE id = $1::uuid")
            .bind(&chat)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(
        (summary.as_str(), through),
        ("", old_seq),
        "the summary held the old text"
    );
    let dir = artifacts_dir(&app);
    let old_files = [dir.join(&old_artifact), dir.join(&old_snapshot)];
    eventually(Duration::from_secs(10), "the old bytes go", || {
        let files = files_under(&dir);
        let gone = !old_files.iter().any(|old| files.contains(old));
        async move { gone }
    })
    .await;
    assert!(artifacts_dir(&app).join(&new_artifact).is_file());
    let artifacts: i64 = sqlx::query_scalar("SELECT count(*) FROM artifacts")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(artifacts, 1);
    let snapshots: i64 = sqlx::query_scalar("SELECT count(*) FROM workspace_snapshots")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(snapshots, 0);
    let metrics = app.metrics().await;
    for (kind, want) in [
        ("turn", 1.0),
        ("message", 2.0),
        ("artifact", 1.0),
        ("snapshot", 1.0),
    ] {
        let counted = test_support::promtool::sample(
            &metrics,
            "brain_retention_deleted_total",
            &[("kind", kind)],
        );
        assert_eq!(counted, Some(want), "{kind}");
    }
    // The next turn of the chat runs on what is left.
    app.provider.push(text("still here"));
    read_stream(app.send(&chat, &json!({"content": "and now?"})).await).await;
    let body = app.provider.requests().last().unwrap().body.to_string();
    assert!(
        !body.contains("old question") && body.contains("new question"),
        "{body}"
    );
}

/// One replica sweeps at a time: the lock is refused while held and free once dropped.
#[tokio::test]
async fn one_replica_sweeps_at_a_time() {
    let app = TestApp::start().await;
    let held = app.store.take_retention_lock().await.unwrap();
    assert!(held.is_some());
    assert!(app.store.take_retention_lock().await.unwrap().is_none());
    drop(held);
    eventually(Duration::from_secs(5), "the lock is free again", || async {
        app.store.take_retention_lock().await.unwrap().is_some()
    })
    .await;
}
