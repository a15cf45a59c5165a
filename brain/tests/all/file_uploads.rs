//! T27: a replica reads and stores only so many chat file uploads at once. An upload
//! holds its slot while its body arrives and is stored, so with one slot a second upload,
//! and a message whose `data:` file part would be stored, are refused `503 overloaded`
//! with `Retry-After` before anything of theirs is read; once the first one ends, the
//! slot serves again. (Per team: `engine::slots`' unit test.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::common::{TestApp, error_code};

const BOUNDARY: &str = "----uploads-cap";

fn form_start(filename: &str) -> Bytes {
    Bytes::from(format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
         Content-Type: text/plain\r\n\r\n"
    ))
}

fn form_end() -> Bytes {
    Bytes::from(format!("\r\n--{BOUNDARY}--\r\n"))
}

async fn upload(app: &TestApp, chat: &str, body: reqwest::Body) -> reqwest::Response {
    app.auth(app.http.post(format!("{}/v1/chats/{chat}/files", app.url)))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body)
        .send()
        .await
        .unwrap()
}

fn whole(filename: &str, text: &str) -> reqwest::Body {
    let mut body = form_start(filename).to_vec();
    body.extend_from_slice(text.as_bytes());
    body.extend_from_slice(&form_end());
    reqwest::Body::from(body)
}

#[tokio::test]
async fn uploads_past_the_replicas_slots_are_refused_until_one_ends() {
    let app = TestApp::start_with(|c| {
        c.files.uploads = 1;
        c.files.uploads_per_team = 1;
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;

    // A slow upload: its form starts, and the rest waits for the test.
    let (more, parts) = mpsc::channel::<Bytes>(4);
    more.send(form_start("slow.txt")).await.unwrap();
    let stream = futures_util::stream::unfold(parts, |mut parts| async move {
        parts
            .recv()
            .await
            .map(|part| (Ok::<_, std::io::Error>(part), parts))
    });
    let slow = tokio::spawn(
        app.auth(app.http.post(format!("{}/v1/chats/{chat}/files", app.url)))
            .header(
                "content-type",
                format!("multipart/form-data; boundary={BOUNDARY}"),
            )
            .body(reqwest::Body::wrap_stream(stream.boxed()))
            .send(),
    );

    // Its slot is taken before its body is read, once its headers arrived: the replica's
    // gauge says when (a probe upload could take the slot first).
    app.wait_gauge("brain_file_uploads", 1.0).await;
    assert!(!slow.is_finished(), "the slow upload waits for its body");

    // Refused while it holds the slot: another upload, and a message's data: part.
    let refused = upload(&app, &chat, whole("b.txt", "b")).await;
    assert_eq!(
        refused.headers()["retry-after"].to_str().unwrap(),
        "2",
        "worth trying again shortly"
    );
    assert_eq!(error_code(refused).await, (503, "overloaded".to_owned()));
    let body = json!({"id": "c", "trigger": "submit-message", "messages": [
        {"id": uuid::Uuid::now_v7().to_string(), "role": "user", "parts": [
            {"type": "text", "text": "read this"},
            {"type": "file", "mediaType": "text/plain", "filename": "n.txt",
             "url": "data:text/plain;base64,aGk="}]}]});
    let message = app.send(&chat, &body).await;
    assert_eq!(error_code(message).await, (503, "overloaded".to_owned()));
    assert!(
        app.messages(&chat).await.is_empty(),
        "the refused message was not stored"
    );

    // The slow one ends and is stored; the slot serves again.
    more.send(Bytes::from_static(b"slow bytes")).await.unwrap();
    more.send(form_end()).await.unwrap();
    drop(more);
    let slow = slow.await.unwrap().unwrap();
    assert_eq!(slow.status(), 201);
    let stored: Value = slow.json().await.unwrap();
    assert_eq!(stored["size"], 10);
    app.wait_gauge("brain_file_uploads", 0.0).await;
    let again = upload(&app, &chat, whole("c.txt", "c")).await;
    assert_eq!(again.status(), 201, "the slot was given back");
}
