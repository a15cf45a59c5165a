//! T25: a chat's files in its worker's workspace, end to end: a real runtime-manager and
//! real workers (local launcher), files uploaded or sent inline, the scripted model
//! calling `shell` on `uploads/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use protocol::AgentId;
use serde_json::{Value, json};

use crate::common::replies::text;
use crate::common::{TestApp, light_agent, read_stream};
use crate::files::{ai_sdk, data_url, upload};
use crate::worker_channel::{session, token_of};
use crate::workers::{
    newest_snapshot_state, output_of, shell, snapshot_blob, system, system_with_profiles,
    terminated,
};

/// One turn of `parts` whose model calls `shell` with `command` (call `id`); the call's
/// output.
async fn turn(app: &TestApp, chat: &str, parts: Value, id: &str, command: &str) -> String {
    app.provider.push(shell(id, command));
    app.provider.push(text("done"));
    let response = app.send(chat, &ai_sdk(parts)).await;
    assert_eq!(response.status(), 200);
    let (chunks, done) = read_stream(response).await;
    assert!(done, "{chunks:?}");
    app.settled().await;
    output_of(&chunks, id)
}

fn file_part(filename: &str, bytes: &[u8]) -> Value {
    json!({"type": "file", "mediaType": "text/plain", "filename": filename,
           "url": data_url("text/plain", bytes)})
}

/// What the model read in the newest request of the turn that began at request `from`.
fn first_request_of_turn(app: &TestApp, from: usize) -> String {
    app.provider.requests()[from].body.to_string()
}

#[tokio::test]
async fn every_file_of_the_chat_is_in_uploads_before_the_first_call() {
    let (app, _manager) = system(60_000, |_| {}).await;
    let (_, chat) = light_agent(&app).await;
    let uploaded = upload(&app, &chat, "a.csv", "text/csv", b"x,y\n1,2\n").await;

    // An uploaded file, a name that tries to climb out, and a name that collides.
    let out = turn(
        &app,
        &chat,
        json!([
            {"type": "text", "text": "Look at these."},
            {"type": "file", "mediaType": "text/csv", "filename": "a.csv", "url": uploaded["url"]},
            file_part("../../escape.txt", b"escape-bytes"),
            file_part("a.csv", b"second,csv\n"),
        ]),
        "c1",
        "cat uploads/a.csv; echo ---; cat uploads/a-2.csv; echo ---; cat uploads/escape.txt; \
         echo; echo ---; LC_ALL=C ls -A uploads",
    )
    .await;
    let stdout = out.split_once("--- stdout ---").unwrap().1;
    let sections: Vec<&str> = stdout.split("---").collect();
    assert!(sections[0].contains("x,y\n1,2"), "{out}");
    assert!(sections[1].contains("second,csv"), "{out}");
    assert!(sections[2].contains("escape-bytes"), "{out}");
    assert!(sections[3].contains("a-2.csv\na.csv\nescape.txt"), "{out}");
    assert!(
        !sections[3].contains(".part"),
        "no partial download left: {out}"
    );
    assert!(!out.starts_with("These files"), "nothing failed: {out}");
    // The model was told where they are, in the message that carried them.
    let asked = first_request_of_turn(&app, 0);
    assert!(
        asked.contains(
            "[Attached files are in your workspace at uploads/a.csv, uploads/escape.txt, \
             uploads/a-2.csv]"
        ),
        "{asked}"
    );

    // A file attached on a later turn is there at that turn's first call, beside the
    // earlier ones; a file the model changed is left as it is.
    let out = turn(
        &app,
        &chat,
        json!([{"type": "text", "text": "And this."}, file_part("b.txt", b"bee")]),
        "c2",
        "echo changed > uploads/a.csv && cat uploads/b.txt && LC_ALL=C ls uploads",
    )
    .await;
    assert!(out.contains("bee"), "{out}");
    assert!(out.contains("a-2.csv\na.csv\nb.txt\nescape.txt"), "{out}");
    assert!(
        first_request_of_turn(&app, 2).contains("at uploads/b.txt]"),
        "the new file's path is told"
    );
    let out = turn(
        &app,
        &chat,
        json!([{"type": "text", "text": "Again."}]),
        "c3",
        "cat uploads/a.csv",
    )
    .await;
    assert!(out.contains("changed") && !out.contains("x,y"), "{out}");
    assert!(app.provider.violations().is_empty());
}

/// A call relayed to the replica holding the worker carries the chat's files, and that
/// replica delivers them before the call.
#[tokio::test]
async fn a_relayed_call_has_its_files_delivered_by_the_owner() {
    let (app, _manager) = system(60_000, |_| {}).await;
    let (_, chat) = light_agent(&app).await;
    let out = turn(
        &app,
        &chat,
        json!([file_part("on-a.txt", b"from a")]),
        "a1",
        "cat uploads/on-a.txt",
    )
    .await;
    assert!(out.contains("from a"), "{out}");

    let b = app.second_replica().await;
    app.provider.push(shell("b1", "cat uploads/on-b.txt"));
    app.provider.push(text("done"));
    let response = app
        .http
        .post(format!("{b}/v1/chats/{chat}/messages"))
        .bearer_auth(&app.key)
        .json(&ai_sdk(json!([file_part("on-b.txt", b"from b")])))
        .send()
        .await
        .unwrap();
    let (chunks, done) = read_stream(response).await;
    assert!(done, "{chunks:?}");
    let out = output_of(&chunks, "b1");
    assert!(out.contains("from b"), "{out}");
}

/// A file whose bytes are gone is not silently missing: the call still runs and its
/// result opens with the file's path and why it is not there.
#[tokio::test]
async fn a_file_that_cannot_be_placed_is_named_in_the_result() {
    let (app, _manager) = system(60_000, |_| {}).await;
    let (_, chat) = light_agent(&app).await;
    let kept = upload(&app, &chat, "kept.txt", "text/plain", b"kept").await;
    let gone = upload(&app, &chat, "gone.txt", "text/plain", b"gone").await;
    let (key,): (String,) = sqlx::query_as("SELECT storage_key FROM chat_files WHERE id = $1")
        .bind(uuid::Uuid::parse_str(gone["id"].as_str().unwrap()).unwrap())
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    std::fs::remove_file(snapshot_blob(&app, &key)).unwrap();

    let out = turn(
        &app,
        &chat,
        json!([
            {"type": "file", "mediaType": "text/plain", "url": kept["url"]},
            {"type": "file", "mediaType": "text/plain", "url": gone["url"]},
        ]),
        "c1",
        "ls uploads",
    )
    .await;
    assert!(
        out.starts_with(
            "These files attached to this chat are not in your workspace: uploads/gone.txt \
             (the brain refused the download (the file is gone))."
        ),
        "{out}"
    );
    assert!(
        out.contains("kept.txt") && !out.contains("gone.txt\n"),
        "{out}"
    );
}

/// After an idle teardown the chat's next session has the files again: from the
/// workspace snapshot (the model's change kept), or, without a snapshot, delivered anew.
#[tokio::test]
async fn after_a_snapshot_restore_the_files_are_there_again() {
    let (app, _manager) = system(1_500, |_| {}).await;
    let (agent, chat) = light_agent(&app).await;
    let out = turn(
        &app,
        &chat,
        json!([file_part("notes.txt", b"remember")]),
        "c1",
        "echo changed >> uploads/notes.txt && cat uploads/notes.txt",
    )
    .await;
    assert!(out.contains("rememberchanged"), "{out}");
    terminated(&app, &agent, Duration::from_secs(20)).await;
    assert_eq!(newest_snapshot_state(&app, &agent).await, "stored");
    let out = turn(
        &app,
        &chat,
        json!([{"type": "text", "text": "Again."}]),
        "c2",
        "cat uploads/notes.txt",
    )
    .await;
    assert!(out.contains("rememberchanged"), "restored as it was: {out}");
}

#[tokio::test]
async fn without_a_snapshot_a_new_worker_gets_the_files_delivered_again() {
    let profiles = json!({"profiles": {"light": {"snapshots": false}}});
    let (app, _manager) = system_with_profiles(1_500, Some(profiles), |_| {}).await;
    let (agent, chat) = light_agent(&app).await;
    let out = turn(
        &app,
        &chat,
        json!([file_part("notes.txt", b"remember")]),
        "c1",
        "echo changed >> uploads/notes.txt && cat uploads/notes.txt",
    )
    .await;
    assert!(out.contains("rememberchanged"), "{out}");
    terminated(&app, &agent, Duration::from_secs(20)).await;
    let out = turn(
        &app,
        &chat,
        json!([{"type": "text", "text": "Again."}]),
        "c2",
        "cat uploads/notes.txt",
    )
    .await;
    assert!(
        out.contains("remember") && !out.contains("changed"),
        "{out}"
    );
}

/// `GET /v1/worker/files/{id}` serves a session's worker the files of its own chat only:
/// another chat's file, or a token minted under another team, is a `404`; no token a
/// `401`.
#[tokio::test]
async fn a_worker_downloads_only_its_own_chats_files() {
    let app = TestApp::start().await;
    let (id, agent) = session(&app, "ready").await;
    let (chat,): (uuid::Uuid,) =
        sqlx::query_as("SELECT chat_id FROM agent_runtime_sessions WHERE id = $1")
            .bind(id.0)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    let own = upload(&app, &chat.to_string(), "own.txt", "text/plain", b"own").await;
    let other_chat = app.new_chat(&agent.to_string()).await;
    let other = upload(&app, &other_chat, "other.txt", "text/plain", b"other").await;
    let get = |file: &Value, token: Option<String>| {
        let url = format!(
            "{}{}{}",
            app.url,
            protocol::uploads::UPLOAD_PATH_PREFIX,
            file["id"].as_str().unwrap()
        );
        async move {
            let mut request = reqwest::Client::new().get(url);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.bytes().await.unwrap())
        }
    };
    let mine = token_of(id, app.team, agent);
    assert_eq!(get(&own, Some(mine.clone())).await, (200, "own".into()));
    assert_eq!(get(&other, Some(mine)).await.0, 404);
    let other_team = app.store.create_team("other team").await.unwrap().team_id;
    assert_eq!(
        get(&own, Some(token_of(id, other_team, agent))).await.0,
        404
    );
    assert_eq!(
        get(&own, Some(token_of(id, app.team, AgentId::new())))
            .await
            .0,
        404
    );
    assert_eq!(get(&own, None).await.0, 401);
}
