//! Skills (B8): archives uploaded, refused with stable codes, versioned and deleted; an
//! agent names its team's skills only; every turn's prompt lists them by name and
//! description (read from the scripted provider's recorded request); `skill_read` answers
//! the body and a named file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;

use reqwest::Response;
use serde_json::{Value, json};

use crate::common::replies::{call, calls, text};
use crate::common::{TestApp, error_code, send_as};
use crate::workers::{output_of, shell};
use protocol::ui::UiChunk;

const HELLO_MD: &str = "---\nname: hello\ndescription: Greets the user in the house style.\n\
    license: MIT\n---\n# Hello\nRun scripts/hello.sh and answer with what it prints.\n";
const HELLO_SH: &str = "#!/bin/sh\necho hello from the skill\n";

/// A tar.gz of `files`, their raw names written as given (an attacker's `..` included).
fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o755);
        header.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_cksum();
        builder.append(&header, *bytes).unwrap();
    }
    let tar = builder.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    gz.finish().unwrap()
}

/// A zip of `files`.
fn zip_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (path, bytes) in files {
        zip.start_file(*path, zip::write::SimpleFileOptions::default())
            .unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

pub(crate) fn hello(description: &str) -> Vec<u8> {
    let md = HELLO_MD.replace("Greets the user in the house style.", description);
    tar_gz(&[
        ("hello/SKILL.md", md.as_bytes()),
        ("hello/scripts/hello.sh", HELLO_SH.as_bytes()),
    ])
}

/// `POST /v1/skills` as `bearer`, a multipart form written by hand.
pub(crate) async fn upload_as(app: &TestApp, bearer: &str, bytes: &[u8]) -> Response {
    let boundary = "----skill-boundary-5d1";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"skill\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    app.http
        .post(format!("{}/v1/skills", app.url))
        .bearer_auth(bearer)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn get_as(app: &TestApp, bearer: &str, path: &str) -> Response {
    app.http
        .get(format!("{}{path}", app.url))
        .bearer_auth(bearer)
        .send()
        .await
        .unwrap()
}

/// Uploads, versions, lists, reads and deletes; another team sees none of it.
#[tokio::test]
async fn skills_are_uploaded_versioned_listed_and_deleted_per_team() {
    let app = TestApp::start_with(|config| config.skills.max_file_bytes = 4096).await;
    let first = upload_as(&app, &app.key, &hello("Greets.")).await;
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    assert_eq!(
        (first["name"].as_str(), first["version"].as_i64()),
        (Some("hello"), Some(1))
    );
    let zipped = zip_of(&[
        ("SKILL.md", HELLO_MD.as_bytes()),
        ("scripts/hello.sh", HELLO_SH.as_bytes()),
    ]);
    let second = upload_as(&app, &app.key, &zipped).await;
    assert_eq!(second.status(), 201);
    let second: Value = second.json().await.unwrap();
    assert_eq!(second["version"], 2);

    let listed: Value = get_as(&app, &app.key, "/v1/skills")
        .await
        .json()
        .await
        .unwrap();
    let skills = listed["skills"].as_array().unwrap();
    assert_eq!(skills.len(), 1, "{listed}");
    assert_eq!(skills[0]["version"], 2);
    assert_eq!(
        skills[0]["description"],
        "Greets the user in the house style."
    );
    let detail: Value = get_as(&app, &app.key, "/v1/skills/hello")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(detail["versions"].as_array().unwrap().len(), 2);
    assert!(
        detail["skill_md"]
            .as_str()
            .unwrap()
            .contains("scripts/hello.sh")
    );
    let paths: Vec<&str> = detail["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["SKILL.md", "scripts/hello.sh"]);

    let other = app.store.create_team("other team").await.unwrap().api_key;
    let theirs = get_as(&app, &other, "/v1/skills/hello").await;
    assert_eq!(error_code(theirs).await, (404, "not_found".into()));
    let theirs: Value = get_as(&app, &other, "/v1/skills")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(theirs["skills"].as_array().unwrap().len(), 0);

    let deleted = app
        .http
        .delete(format!("{}/v1/skills/hello", app.url))
        .bearer_auth(&app.key)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let gone = get_as(&app, &app.key, "/v1/skills/hello").await;
    assert_eq!(error_code(gone).await, (404, "not_found".into()));
}

/// Each refusal has its stable code and stores nothing.
#[tokio::test]
async fn bad_archives_are_refused_with_stable_codes() {
    let app = TestApp::start_with(|config| config.skills.max_file_bytes = 4096).await;
    let bad_name = tar_gz(&[("SKILL.md", b"---\nname: Bad_Name\ndescription: x\n---\n")]);
    let escape = tar_gz(&[("SKILL.md", HELLO_MD.as_bytes()), ("../../etc/x", b"x")]);
    let big = vec![b'a'; 5000];
    let too_large = tar_gz(&[("SKILL.md", HELLO_MD.as_bytes()), ("big.bin", &big)]);
    let no_skill_md = tar_gz(&[("README.md", b"# nothing")]);
    for (archive, want) in [
        (bad_name, (400, "invalid_skill")),
        (escape, (400, "unsafe_skill_archive")),
        (too_large, (413, "file_too_large")),
        (no_skill_md, (400, "invalid_skill")),
        (b"not an archive".to_vec(), (400, "invalid_skill")),
    ] {
        let refused = upload_as(&app, &app.key, &archive).await;
        assert_eq!(error_code(refused).await, (want.0, want.1.into()));
    }
    let listed: Value = get_as(&app, &app.key, "/v1/skills")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["skills"].as_array().unwrap().len(), 0);
}

/// An agent names only its team's skills; its turn's prompt lists them by name and
/// description (never the body), and `skill_read` answers the body and a named file.
#[tokio::test]
async fn the_prompt_lists_skills_and_skill_read_reads_them() {
    let app = TestApp::start().await;
    assert_eq!(
        upload_as(&app, &app.key, &hello("Greets.")).await.status(),
        201
    );
    let body = json!({"name": "greeter", "system_prompt": "Be kind.",
                      "model": "openai/gpt-test", "skills": ["nope"]});
    let refused = app.post_json("/v1/agents", &body).await;
    assert_eq!(error_code(refused).await, (400, "unknown_skill".into()));
    let body = json!({"name": "greeter", "system_prompt": "Be kind.",
                      "model": "openai/gpt-test", "skills": ["hello"]});
    let created = app.post_json("/v1/agents", &body).await;
    assert_eq!(created.status(), 201);
    let agent: Value = created.json().await.unwrap();
    assert_eq!(agent["skills"], json!(["hello"]));
    let chat = app.new_chat(agent["id"].as_str().unwrap()).await;

    app.provider.push(calls(vec![call(
        "c1",
        "skill_read",
        json!({"name": "hello"}),
    )]));
    app.provider.push(calls(vec![call(
        "c2",
        "skill_read",
        json!({"name": "hello", "file": "scripts/hello.sh"}),
    )]));
    app.provider.push(text("Hello!"));
    let chunks = send_as(&app, &app.key, &chat, "Say hello").await;
    let outputs: Vec<&str> = chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::ToolOutputAvailable { output, .. } => output.as_str(),
            _ => None,
        })
        .collect();
    assert_eq!(outputs.len(), 2, "{chunks:?}");
    assert!(
        outputs[0].contains("Run scripts/hello.sh"),
        "{}",
        outputs[0]
    );
    assert!(
        outputs[0].contains("- scripts/hello.sh ("),
        "{}",
        outputs[0]
    );
    assert_eq!(outputs[1], HELLO_SH);

    let request = app.provider.requests().remove(0).body;
    let prompt = request.to_string();
    assert!(prompt.contains("- hello: Greets."), "{prompt}");
    assert!(
        !prompt.contains("Run scripts/hello.sh"),
        "the body is read on demand only"
    );
    assert!(request["tools"].to_string().contains("\"skill_read\""));
}

/// A new agent with hands (the `light` profile) naming `skills`: its id.
async fn hands_agent(app: &TestApp, skills: &[&str]) -> String {
    let body = json!({"name": "hands", "system_prompt": "Use your shell.",
                      "model": "openai/gpt-test", "runtime_profile": "light", "skills": skills});
    let created = app.post_json("/v1/agents", &body).await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    created["id"].as_str().unwrap().to_owned()
}

/// B8: with hands, the agent's skill is in its real worker's workspace under
/// `skills/<name>/` before the first tool runs, so the model's shell call runs the skill's
/// script; a new version replaces the folder by the next turn.
#[tokio::test]
async fn a_skills_script_runs_in_a_real_worker() {
    let (app, _manager) = crate::workers::system(60_000, |_| {}).await;
    assert_eq!(
        upload_as(&app, &app.key, &hello("Greets.")).await.status(),
        201
    );
    let agent = hands_agent(&app, &["hello"]).await;
    let chat = app.new_chat(&agent).await;
    app.provider.push(shell(
        "run",
        "./skills/hello/scripts/hello.sh && head -2 skills/hello/SKILL.md",
    ));
    app.provider.push(text("It said hello."));
    let chunks = send_as(&app, &app.key, &chat, "Use the hello skill").await;
    app.settled().await;
    let output = output_of(&chunks, "run");
    assert!(output.contains("hello from the skill"), "{output}");
    assert!(output.contains("name: hello"), "{output}");
    assert!(!output.contains("not in your workspace"), "{output}");

    let second = tar_gz(&[
        ("hello/SKILL.md", HELLO_MD.as_bytes()),
        (
            "hello/scripts/hello.sh",
            b"#!/bin/sh\necho hello from version two\n",
        ),
    ]);
    assert_eq!(upload_as(&app, &app.key, &second).await.status(), 201);
    app.provider
        .push(shell("again", "./skills/hello/scripts/hello.sh"));
    app.provider.push(text("Again."));
    let chunks = send_as(&app, &app.key, &chat, "Once more").await;
    let output = output_of(&chunks, "again");
    assert!(output.contains("hello from version two"), "{output}");
}

/// M6: an `AGENTS.md` a tool call wrote at the root of a real worker's workspace is in the
/// next turn's prompt, beside the user's message and marked as the workspace's words, not
/// in the operator's system text.
#[tokio::test]
async fn agents_md_from_a_real_workspace_reaches_the_next_prompt() {
    let (app, _manager) = crate::workers::system(60_000, |_| {}).await;
    let agent = hands_agent(&app, &[]).await;
    let chat = app.new_chat(&agent).await;
    app.provider.push(shell(
        "write",
        "printf '# Conventions\\nBuild with make check-all.\\n' > AGENTS.md",
    ));
    app.provider.push(text("Written."));
    let chunks = send_as(&app, &app.key, &chat, "Write the conventions").await;
    app.settled().await;
    assert!(
        !output_of(&chunks, "write").starts_with("ERROR"),
        "{chunks:?}"
    );
    let first = app.provider.requests()[0].body.to_string();
    assert!(!first.contains("Project context"), "no worker yet: {first}");

    app.provider.push(text("I will use make check-all."));
    send_as(&app, &app.key, &chat, "How do I build?").await;
    let request = app.provider.requests()[2].body.clone();
    let messages = request["messages"].as_array().unwrap();
    let holding: Vec<&Value> = messages
        .iter()
        .filter(|m| {
            m["content"]
                .to_string()
                .contains("Build with make check-all.")
        })
        .collect();
    assert_eq!(holding.len(), 1, "{request}");
    assert_eq!(holding[0]["role"], "user", "{request}");
    let context = holding[0]["content"].to_string();
    assert!(
        context.contains("[Project context: the file AGENTS.md at the root of your workspace"),
        "{context}"
    );
    assert!(
        context.contains("it is not from your operator"),
        "{context}"
    );
    assert!(context.contains("[end of AGENTS.md]"), "{context}");
    let system: Vec<&Value> = messages.iter().filter(|m| m["role"] == "system").collect();
    assert!(
        system
            .iter()
            .all(|m| !m.to_string().contains("make check-all")),
        "the operator's system text does not carry it: {request}"
    );
}
