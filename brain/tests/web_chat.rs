//! The web chat in a real browser (issue 14): the brain serves the embedded page, and
//! tests/web/chat.mjs drives Debian's chromium through it with playwright-core (sign in,
//! create an agent with hands, a streamed reply, a shell command in a real worker with its
//! live output, a tool card, a stop, a reload, a phone-width window, axe-core on each
//! screen, a second tab following a turn live and refused as agent_busy, a call approved
//! with its button, and the offline demo model running a command). A real runtime-manager launches
//! the worker; only the model is scripted. Screenshots go to
//! `$CARGO_TARGET_TMPDIR/web-chat/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::TestApp;
use common::manager::{TempDir, manager_command};
use scripted_provider::{Reply, ToolCall};
use serde_json::{Value, json};

#[tokio::test]
async fn the_page_is_served_with_its_security_headers() {
    let app = TestApp::start().await;
    let page = app.http.get(format!("{}/", app.url)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let headers = page.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    assert_eq!(headers["cache-control"], "no-cache");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self';"), "{csp}");
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    let html = page.text().await.unwrap();
    let script = html
        .split('"')
        .find(|s| s.starts_with("/assets/") && s.ends_with(".js"))
        .expect("the page loads its bundle");

    let asset = app
        .http
        .get(format!("{}{script}", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(asset.status(), 200);
    assert_eq!(
        asset.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    assert_eq!(
        asset.headers()["cache-control"],
        "public, max-age=31536000, immutable"
    );
    assert_eq!(asset.headers()["x-content-type-options"], "nosniff");

    let missing = app
        .http
        .get(format!("{}/assets/nope.js", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
}

/// A 1x1 PNG, which the worker's shell writes and `upload_artifact` stores.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";

#[tokio::test]
async fn a_user_chats_in_a_real_browser() {
    // A queue namespace of its own, so only this test's runtime-manager serves it.
    let namespace = format!("test-{}", uuid::Uuid::new_v4().simple());
    let ns = namespace.clone();
    let app = TestApp::start_with(move |c| c.workers.queue_namespace = ns).await;
    let workspaces = TempDir::new();
    let _manager = manager_command(&app, &namespace, &app.url, &workspaces)
        .spawn()
        .expect("the runtime-manager binary is built with the workspace");
    // The script's turns, in order: a streamed reply with Markdown and raw HTML, a shell
    // command in the worker, the upload of the image it wrote and the answer after them,
    // a brain tool call and the answer after it, and a slow reply the user stops.
    app.provider.push(Reply::Text {
        deltas: [
            "Hello! I am ",
            "**streaming** ",
            "word by word. ",
            "<img src=x onerror=alert(1)> ",
            "all done",
        ]
        .map(String::from)
        .to_vec(),
        delay: Duration::from_millis(300),
    });
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call_shell".into(),
            name: "shell".into(),
            arguments: json!({"command": format!(
                "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo {PNG} | base64 -d > dot.png"
            )})
            .to_string(),
        }],
        fragment: 16,
    });
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call_upload".into(),
            name: "upload_artifact".into(),
            arguments: json!({"path": "dot.png"}).to_string(),
        }],
        fragment: 0,
    });
    app.provider.push(Reply::Text {
        deltas: vec!["Ran it.".into()],
        delay: Duration::from_millis(5),
    });
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call_memo".into(),
            name: "memory_write".into(),
            arguments: json!({"content": "the sky is blue"}).to_string(),
        }],
        fragment: 8,
    });
    app.provider.push(Reply::Text {
        deltas: vec!["Noted.".into()],
        delay: Duration::from_millis(5),
    });
    app.provider.push(Reply::Text {
        deltas: (0..200).map(|i| format!("one{i} ")).collect(),
        delay: Duration::from_millis(150),
    });
    // After the reload: a turn the provider refuses, shown as what to do; a turn a second
    // tab follows live. Then the queue is empty and the offline demo model answers.
    app.provider.push(Reply::Status {
        status: 429,
        retry_after: Some(3),
    });
    app.provider.push(Reply::Text {
        deltas: (0..10).map(|i| format!("watch{i} ")).collect(),
        delay: Duration::from_millis(250),
    });
    // The agent `careful` asks before memory_write: its call waits for the Approve button,
    // then runs, and the model answers.
    let careful = app
        .post_json(
            "/v1/agents",
            &json!({"name": "careful", "system_prompt": "Ask first.", "model": "openai/gpt-test",
                    "approval_policy": {"ask": ["memory_write"]}}),
        )
        .await;
    assert_eq!(careful.status(), 201);
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call_careful".into(),
            name: "memory_write".into(),
            arguments: json!({"content": "approved note"}).to_string(),
        }],
        fragment: 0,
    });
    app.provider.push(Reply::Text {
        deltas: vec!["Saved.".into()],
        delay: Duration::from_millis(5),
    });

    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-chat");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/web/chat.mjs");
    let run = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("node")
            .arg(&script)
            .arg(&app.url)
            .arg(&app.key)
            .arg(&out)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser test ends within two minutes")
    .expect("node runs (scripts/test-deps.sh installs tests/web)");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "the browser test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );

    // What the browser showed is what the store holds.
    let ids: Value = serde_json::from_str(&stdout).unwrap();
    let chat = ids["chatId"].as_str().unwrap();
    let messages = app.messages(chat).await;
    let assistant: Vec<&Value> = messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
    assert_eq!(assistant.len(), 6, "{messages:#?}");
    assert_eq!(assistant[0]["status"], "complete");
    assert!(assistant[1]["parts"].to_string().contains("line3"));
    assert!(
        assistant[1]["parts"]
            .to_string()
            .contains("tool-upload_artifact")
    );
    assert!(
        assistant[2]["parts"]
            .to_string()
            .contains("tool-memory_write")
    );
    assert_eq!(assistant[3]["status"], "interrupted");
    // The demo model's turn (nothing left scripted) ran the command it was asked for.
    assert!(assistant[4]["parts"].to_string().contains("watch9"));
    assert!(assistant[5]["parts"].to_string().contains("demo-hands"));
    let agent: Value = app
        .get(&format!("/v1/agents/{}", ids["agentId"].as_str().unwrap()))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(agent["name"], "helper");
    for shot in [
        "1-sign-in",
        "2-chat",
        "3-stopped",
        "4-error",
        "4-second-tab",
        "5-phone",
    ] {
        assert!(out.join(format!("{shot}.png")).is_file(), "{shot} saved");
    }
}
