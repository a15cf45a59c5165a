//! The web chat in a real browser: the brain serves the embedded page, and
//! tests/web/chat.mjs drives Debian's chromium through it with playwright-core (sign in,
//! create an agent with hands, a streamed reply, a shell command in a real worker with its
//! live output, a tool card, a stop, a reload, a phone-width window, axe-core on each
//! screen, a second tab following a turn live with its worker's output and refused as
//! agent_busy, a third tab opened mid-turn resuming it from its start, a call approved and
//! one denied with their buttons, a connector that is down, the offline demo model running a
//! command and taking a real Chromium screenshot, a quota refusal, and sign-in with a
//! frontend token handed over in the address, then expired; the page shows the team and
//! user signed in, and a link with another team's token replaces a tab's credential only
//! when the person agrees). A real runtime-manager launches the workers; only the model is
//! scripted. Screenshots go to `$CARGO_TARGET_TMPDIR/web-chat/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use crate::common::TestApp;
use crate::common::manager::{TempDir, manager_command};
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

const ISSUER: &str = "https://id.web-chat.test";
const AUDIENCE: &str = "agent-runtime";
const JWT_SECRET: &str = "a-secret-of-the-test-issuer-at-least-32-bytes";

/// A 1x1 PNG, which the worker's shell writes and `upload_artifact` stores.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";

#[tokio::test]
async fn a_user_chats_in_a_real_browser() {
    // A queue namespace of its own, so only this test's runtime-manager serves it.
    let namespace = format!("test-{}", uuid::Uuid::new_v4().simple());
    let ns = namespace.clone();
    // Frontend tokens of an issuer of the test's own (HS256: the test signs them).
    let jwt = engine::auth::JwtConfig::from_env(&envcfg::vars(&[
        ("BRAIN_JWT_ISSUER", ISSUER),
        ("BRAIN_JWT_AUDIENCE", AUDIENCE),
        ("BRAIN_JWT_HS256_SECRET", JWT_SECRET),
    ]))
    .unwrap()
    .unwrap();
    let app = TestApp::start_with(move |c| {
        c.workers.queue_namespace = ns;
        c.jwt = Some(jwt);
        // The connector that is down points at loopback.
        c.connectors.allow_private_networks = true;
    })
    .await;
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
    // T13: "Stop and send" interrupts the slow turn, then the message queued meanwhile runs.
    app.provider.push(Reply::Text {
        deltas: vec!["Hi there.".into()],
        delay: Duration::from_millis(5),
    });
    app.provider.push(Reply::Text {
        deltas: vec!["Waved.".into()],
        delay: Duration::from_millis(5),
    });
    // After the reload: a turn the provider refuses, shown as what to do; a turn a second
    // tab follows live. Then the queue is empty and the offline demo model answers.
    app.provider.push(Reply::Status {
        status: 429,
        retry_after: Some(3),
    });
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call_ticks".into(),
            name: "shell".into(),
            arguments: json!({"command": "for i in 1 2 3 4; do echo tick$i; sleep 0.5; done"})
                .to_string(),
        }],
        fragment: 0,
    });
    app.provider.push(Reply::Text {
        deltas: (0..10).map(|i| format!("watch{i} ")).collect(),
        delay: Duration::from_millis(400),
    });
    // The agent `careful` asks before memory_write: its call waits for the Approve button,
    // then runs, and the model answers; the next one is denied. Its connector is down (no
    // server at that port).
    let careful = app
        .post_json(
            "/v1/agents",
            &json!({"name": "careful", "system_prompt": "Ask first.", "model": "openai/gpt-test",
                    "approval_policy": {"ask": ["memory_write"]}}),
        )
        .await;
    assert_eq!(careful.status(), 201);
    let careful: Value = careful.json().await.unwrap();
    let connector = app
        .post_json(
            "/v1/connectors",
            &json!({"name": "tracker", "url": "http://127.0.0.1:1/mcp", "agent_id": careful["id"]}),
        )
        .await;
    assert_eq!(connector.status(), 201);
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
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call_denied".into(),
            name: "memory_write".into(),
            arguments: json!({"content": "a note the user refuses"}).to_string(),
        }],
        fragment: 0,
    });
    app.provider.push(Reply::Text {
        deltas: vec!["Not saved.".into()],
        delay: Duration::from_millis(5),
    });

    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-chat");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/web/chat.mjs");
    let now = chrono::Utc::now().timestamp();
    // Another team's user, whose token a link may try to slip into a signed-in tab.
    let other = app.store.create_team("other team").await.unwrap();
    let token = |team: protocol::TeamId, user: &str, exp: i64| {
        let claims = json!({"iss": ISSUER, "aud": AUDIENCE, "sub": user, "iat": now,
                            "exp": exp, "team_id": team.to_string()});
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()).unwrap(),
        )
        .unwrap()
    };
    let run = tokio::time::timeout(
        Duration::from_secs(240),
        tokio::process::Command::new("node")
            .arg(&script)
            .arg(&app.url)
            .arg(&app.key)
            .arg(&out)
            .arg(token(app.team, "web-user", now + 600))
            .arg(token(app.team, "web-user", now - 600))
            .arg(token(other.team_id, "mallory", now + 600))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser test ends within four minutes")
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
    assert_eq!(assistant.len(), 8, "{messages:#?}");
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
    assert!(assistant[4]["parts"].to_string().contains("Hi there."));
    assert!(assistant[5]["parts"].to_string().contains("Waved."));
    // The demo model's turn (nothing left scripted) ran the command it was asked for.
    assert!(assistant[6]["parts"].to_string().contains("tick4"));
    assert!(assistant[6]["parts"].to_string().contains("watch9"));
    assert!(assistant[7]["parts"].to_string().contains("demo-hands"));
    let agent: Value = app
        .get(&format!("/v1/agents/{}", ids["agentId"].as_str().unwrap()))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(agent["name"], "helper");
    // The chat deleted with its button is erased.
    let erased = app
        .get(&format!(
            "/v1/chats/{}/messages",
            ids["erasedChatId"].as_str().unwrap()
        ))
        .await;
    assert_eq!(erased.status(), 404);
    for shot in [
        "1-sign-in",
        "2-chat",
        "3-queued",
        "3-stopped",
        "4-error",
        "4-second-tab",
        "4-third-tab",
        "5-phone",
        "6-screenshot",
        "7-switch-accounts",
    ] {
        assert!(out.join(format!("{shot}.png")).is_file(), "{shot} saved");
    }
}

/// `make dev`'s own script (scripts/dev.sh, copied to a directory of the test's own so its
/// `.dev/` lands there), with the binaries the tests built instead of a build of its own:
/// it prints one link and a key, and in Chromium that key and the agent "demo" it made give
/// a chat where the offline demo model runs a command in a real worker. A second start
/// reuses the key and the agent.
#[tokio::test]
async fn make_dev_prints_a_link_to_a_chat_where_the_demo_runs_a_command() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let root = TempDir::new();
    std::fs::create_dir_all(root.0.join("scripts")).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/dev.sh"),
        root.0.join("scripts/dev.sh"),
    )
    .unwrap();
    let (_store, db) = common::fresh_store().await;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{addr}");
    let namespace = format!("test-{}", uuid::Uuid::new_v4().simple());
    let http = reqwest::Client::new();
    let mut first_key = None;
    for start in 0..2 {
        let mut dev = tokio::process::Command::new("bash")
            .arg(root.0.join("scripts/dev.sh"))
            .env("DEV_BIN", common::manager::bin_dir())
            .env("DATABASE_URL", test_support::db::db_url(&db))
            .env("REDIS_URL", common::manager::redis_url())
            .env("BRAIN_ADDR", addr.to_string())
            .env("BRAIN_PUBLIC_URL", &url)
            // Not the default 127.0.0.1:9465, which a `make dev` of the developer's holds.
            .env("BRAIN_METRICS_ADDR", "off")
            .env("SESSION_QUEUE_NAMESPACE", &namespace)
            .env("BRAIN_LOG", "warn")
            .env("RUNTIME_MANAGER_LOG", "warn")
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let group = dev.id().unwrap();
        let mut leftover = GroupKiller(Some(group));
        let mut lines = BufReader::new(dev.stdout.take().unwrap()).lines();
        let mut printed = String::new();
        let key = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                printed.push_str(&line);
                printed.push('\n');
                if let Some(key) = line.trim().strip_prefix("Sign in with the key ") {
                    // And the line that says what to type.
                    printed.push_str(&lines.next_line().await.unwrap().unwrap_or_default());
                    return key.to_owned();
                }
            }
            panic!("make dev ended before printing a key:\n{printed}");
        })
        .await
        .expect("make dev prints its link within a minute");
        assert!(printed.contains(&format!("{url}/")), "{printed}");
        assert!(printed.contains("offline demo model"), "{printed}");
        assert!(printed.contains("run `ls -la`"), "{printed}");

        if start == 0 {
            let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-chat");
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/web/dev.mjs");
            let run = tokio::time::timeout(
                Duration::from_secs(120),
                tokio::process::Command::new("node")
                    .arg(&script)
                    .arg(&url)
                    .arg(&key)
                    .arg(&out)
                    .kill_on_drop(true)
                    .output(),
            )
            .await
            .expect("the browser ends within two minutes")
            .unwrap();
            assert!(
                run.status.success(),
                "the first five minutes failed:\n{}",
                String::from_utf8_lossy(&run.stderr)
            );
            first_key = Some(key);
        } else {
            assert_eq!(Some(&key), first_key.as_ref(), "the key is kept");
            let agents: Value = http
                .get(format!("{url}/v1/agents"))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let demos = agents["agents"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|a| a["name"] == "demo")
                .count();
            assert_eq!(demos, 1, "one demo agent: {agents}");
        }
        // Ctrl-C, as a user stops it: the whole process group.
        let stopped = std::process::Command::new("kill")
            .args(["-INT", "--", &format!("-{group}")])
            .status()
            .unwrap();
        assert!(stopped.success());
        tokio::time::timeout(Duration::from_secs(30), dev.wait())
            .await
            .expect("make dev stops on Ctrl-C")
            .unwrap();
        // Stopped as a user stops it: nothing left to kill, and the group's id may be reused.
        leftover.0 = None;
    }
}

/// Kills a process group of `make dev` that a failed assertion or timeout left running:
/// `kill_on_drop` reaches bash alone, and the brain and runtime-manager it started would
/// otherwise outlive the test holding their ports (a later run's brain then fails to bind).
struct GroupKiller(Option<u32>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(group) = self.0 {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{group}")])
                .status();
        }
    }
}

/// P5 in a real browser: server-everything (stdio) asks a question while its tool call
/// waits; the page renders the form pre-filled with the schema's defaults (axe-core finds
/// no serious violation), the person fills in and sends it, and the tool's result (the
/// server's echo) and the model's answer after it appear (tests/web/elicit.mjs).
#[tokio::test]
async fn a_person_answers_an_mcp_servers_question_in_the_page() {
    let app = TestApp::start_with(|c| c.connectors.allow_stdio = true).await;
    let agent = app
        .post_json(
            "/v1/agents",
            &json!({"name": "asker", "system_prompt": "You are terse.", "model": "openai/gpt-test"}),
        )
        .await;
    assert_eq!(agent.status(), 201);
    let agent: Value = agent.json().await.unwrap();
    let connector = app
        .post_json(
            "/v1/connectors",
            &json!({"name": "everything", "agent_id": agent["id"],
                    "command": ["node", common::mcp::everything_js(), "stdio"]}),
        )
        .await;
    assert_eq!(connector.status(), 201);
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call_ask".into(),
            name: "everything_trigger-elicitation-request".into(),
            arguments: "{}".into(),
        }],
        fragment: 0,
    });
    app.provider.push(Reply::Text {
        deltas: vec!["Done.".into()],
        delay: Duration::from_millis(1),
    });
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-chat");
    let run = page_script(
        "elicit.mjs",
        &[&app.url, &app.key, "asker", out.to_str().unwrap()],
    )
    .await;
    assert!(
        run.status.success(),
        "the page did not answer the question:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// Runs the page script `tests/web/<name>` under node (Chromium through playwright-core)
/// with `args`, for at most three minutes: what it printed and how it ended.
pub(crate) async fn page_script(name: &str, args: &[&str]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/web")
        .join(name);
    tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new("node")
            .arg(&script)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser ends within three minutes")
    .expect("node runs (scripts/test-deps.sh installs tests/web)")
}

/// T26 in a real browser (tests/web/files.mjs): a PNG attached through the file input
/// shows as a thumbnail, a file past `BRAIN_FILE_MAX_BYTES` shows its refusal and is not
/// sent, a dropped file is removed again; the sent message and the transcript after a
/// reload show the image from its signed URL. The model (a team connection to the scripted
/// provider, with vision) received the stored PNG as an image, and nothing else.
#[tokio::test]
async fn a_person_attaches_a_picture_in_the_page() {
    use std::io::Cursor;

    use image::{DynamicImage, ImageFormat, Rgb, RgbImage};
    use scripted_provider::SeenKind;

    let app = TestApp::start_with(|c| {
        c.secrets_key = Some(store::SecretsKey::parse(crate::webhooks::KEY_HEX).unwrap());
        c.providers_allow_private_networks = true;
        c.files.max_file_bytes = 20_000;
    })
    .await;
    let connection = app
        .post_json(
            "/v1/providers",
            &json!({"name": "team", "kind": "openai", "base_url": app.provider.openai_base_url(),
                    "api_key": "sk-t", "models": [{"model": "eye", "vision": true}]}),
        )
        .await;
    assert_eq!(connection.status(), 201);
    let agent = app
        .post_json(
            "/v1/agents",
            &json!({"name": "looker", "system_prompt": "You see.", "model": "team/eye"}),
        )
        .await;
    assert_eq!(agent.status(), 201);
    app.provider.push(Reply::Text {
        deltas: vec!["A red square.".into()],
        delay: Duration::from_millis(5),
    });
    let files = TempDir::new();
    let mut png = Vec::new();
    DynamicImage::ImageRgb8(RgbImage::from_pixel(16, 16, Rgb([220, 20, 20])))
        .write_to(&mut Cursor::new(&mut png), ImageFormat::Png)
        .unwrap();
    let png_path = files.0.join("square.png");
    std::fs::write(&png_path, &png).unwrap();
    let big_path = files.0.join("big.txt");
    std::fs::write(&big_path, "a".repeat(30_000)).unwrap();

    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-chat");
    let run = page_script(
        "files.mjs",
        &[
            &app.url,
            &app.key,
            "looker",
            png_path.to_str().unwrap(),
            big_path.to_str().unwrap(),
            out.to_str().unwrap(),
        ],
    )
    .await;
    assert!(
        run.status.success(),
        "the page did not attach the picture:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let requests = app.provider.requests();
    assert_eq!(requests.len(), 1, "one turn");
    let seen = requests[0].files();
    assert_eq!(seen.len(), 1, "the image alone: {seen:?}");
    assert_eq!(seen[0].kind, SeenKind::Image);
    assert_eq!(seen[0].media_type, "image/png");
    let shown = image::load_from_memory(&seen[0].bytes).unwrap().to_rgb8();
    assert_eq!(shown.dimensions(), (16, 16));
    assert_eq!(shown.get_pixel(8, 8), &Rgb([220, 20, 20]));
    let body = requests[0].body.to_string();
    assert!(body.contains("What is in this picture?"));
    assert!(
        !body.contains("city,visits"),
        "the removed CSV was not sent"
    );

    let ids: Value = serde_json::from_slice(&run.stdout).unwrap();
    let messages = app.messages(ids["chatId"].as_str().unwrap()).await;
    let parts = messages[0]["parts"].as_array().unwrap();
    let files: Vec<&Value> = parts.iter().filter(|p| p["type"] == "file").collect();
    assert_eq!(files.len(), 1, "{parts:?}");
    assert_eq!(files[0]["filename"], "square.png");
    for shot in ["files-attached", "files-sent", "files-reloaded"] {
        assert!(out.join(format!("{shot}.png")).is_file(), "{shot} saved");
    }
}
