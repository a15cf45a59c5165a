//! Files into the model (T23): a user message's image and PDF reach a model that reads
//! them as the provider's own content, on each wire (OpenAI Chat Completions, the
//! Responses API, Anthropic Messages), its CSV inline after the text; a model without
//! vision gets a note instead; a later turn still shows the earlier files. Team
//! connections to a scripted provider (a test double speaking the exact wire formats)
//! declare what their model reads (T16); what the provider received is asserted part by
//! part. Real bytes: a PNG written by the `image` crate, a PDF written by fpdf2.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Cursor;

use base64::Engine as _;
use image::{DynamicImage, ImageFormat, Rgb, RgbImage};
use scripted_provider::{RecordedRequest, Reply, ScriptedProvider, SeenFile, SeenKind};
use serde_json::{Value, json};
use store::SecretsKey;

use crate::common::replies::text;
use crate::common::{TestApp, read_stream};
use crate::webhooks::KEY_HEX;

const PDF: &[u8] = include_bytes!("fixtures/report.pdf");
const CSV: &[u8] = b"city,visits\nLyon,3\nNantes,5\n";

/// What the model reads of the CSV after the message's text.
const CSV_INLINE: &str = "[file visits.csv (text/csv)]\ncity,visits\nLyon,3\nNantes,5\n\
                          [end of file visits.csv]";

fn png() -> Vec<u8> {
    let picture = RgbImage::from_fn(64, 48, |x, y| Rgb([(x * 4) as u8, (y * 5) as u8, 7]));
    let mut out = Vec::new();
    DynamicImage::ImageRgb8(picture)
        .write_to(&mut Cursor::new(&mut out), ImageFormat::Png)
        .unwrap();
    out
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn data_url(media_type: &str, bytes: &[u8]) -> String {
    format!("data:{media_type};base64,{}", base64(bytes))
}

async fn app() -> TestApp {
    TestApp::start_with(|c| {
        c.secrets_key = Some(SecretsKey::parse(KEY_HEX).unwrap());
        c.providers_allow_private_networks = true;
    })
    .await
}

/// A team connection `name` of `kind` to `server`, whose model `eye` reads images and
/// documents, and a chat with an agent on it.
async fn chat_on(app: &TestApp, name: &str, kind: &str, server: &ScriptedProvider) -> String {
    let base_url = if kind == "anthropic" {
        server.anthropic_base_url()
    } else {
        server.openai_base_url()
    };
    let created = app
        .post_json(
            "/v1/providers",
            &json!({"name": name, "kind": kind, "base_url": base_url, "api_key": "sk-t",
                    "models": [{"model": "eye", "vision": true, "documents": true}]}),
        )
        .await;
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
    let (_, chat) = app.agent_and_chat(&format!("{name}/eye"), &[]).await;
    chat
}

/// `POST /v1/chats/{chat}/files`: the uploaded file's URL.
async fn upload(app: &TestApp, chat: &str, filename: &str, bytes: &[u8]) -> String {
    let boundary = "----vision-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let response = app
        .auth(app.http.post(format!("{}/v1/chats/{chat}/files", app.url)))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let file: Value = response.json().await.unwrap();
    file["url"].as_str().unwrap().to_owned()
}

/// Posts a message of `parts` and waits for its turn to end.
async fn say(app: &TestApp, chat: &str, parts: Value) {
    let body = json!({"id": "c", "trigger": "submit-message", "messages": [
        {"id": uuid::Uuid::now_v7().to_string(), "role": "user", "parts": parts}]});
    let response = app.send(chat, &body).await;
    assert_eq!(response.status(), 200);
    let (chunks, done) = read_stream(response).await;
    assert!(done, "{chunks:?}");
    app.settled().await;
}

/// The image, as stored (re-encoded without its metadata), and the PDF, as the model
/// should see them in message `message`.
fn seen(message: usize, image: &[u8]) -> Vec<SeenFile> {
    vec![
        SeenFile {
            message,
            tool_call: None,
            kind: SeenKind::Image,
            media_type: "image/png".into(),
            filename: None,
            bytes: image.to_vec(),
        },
        SeenFile {
            message,
            tool_call: None,
            kind: SeenKind::Document,
            media_type: "application/pdf".into(),
            filename: Some("report.pdf".into()),
            bytes: PDF.to_vec(),
        },
    ]
}

/// The bytes stored for the message's image part (the brain re-encodes images, T22).
async fn stored_image(app: &TestApp, chat: &str) -> Vec<u8> {
    let messages = app.messages(chat).await;
    let url = messages[0]["parts"][1]["url"].as_str().unwrap().to_owned();
    let response = app.get(&url).await;
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap().to_vec()
}

/// A message with an image, a PDF and a CSV, posted to a chat on `kind`: what the model
/// got, and the stored image's bytes.
async fn post_files(kind: &str) -> (TestApp, ScriptedProvider, String, RecordedRequest, Vec<u8>) {
    let app = app().await;
    let server = ScriptedProvider::start().await.unwrap();
    let chat = chat_on(&app, "team", kind, &server).await;
    let csv = upload(&app, &chat, "visits.csv", CSV).await;
    server.push(text("A chart and a report."));
    say(
        &app,
        &chat,
        json!([
            {"type": "text", "text": "What are these?"},
            {"type": "file", "mediaType": "image/png", "filename": "chart.png",
             "url": data_url("image/png", &png())},
            {"type": "file", "mediaType": "application/pdf", "filename": "report.pdf",
             "url": data_url("application/pdf", PDF)},
            {"type": "file", "mediaType": "text/csv", "url": csv},
        ]),
    )
    .await;
    let image = stored_image(&app, &chat).await;
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "one model call");
    assert!(server.violations().is_empty(), "{:?}", server.violations());
    (app, server, chat, requests[0].clone(), image)
}

#[tokio::test]
async fn chat_completions_get_image_url_and_file_parts() {
    let (app, server, chat, request, image) = post_files("openai").await;
    assert_eq!(request.files(), seen(1, &image));
    assert_eq!(
        request.body["messages"][1],
        json!({"role": "user", "content": [
            {"type": "text", "text": format!("What are these?\n\n{CSV_INLINE}")},
            {"type": "image_url", "image_url": {"url": data_url("image/png", &image)}},
            {"type": "file", "file": {"filename": "report.pdf",
                                      "file_data": data_url("application/pdf", PDF)}},
        ]})
    );

    // A later turn still shows the model the earlier files, where they were.
    server.push(text("Lyon."));
    say(
        &app,
        &chat,
        json!([{"type": "text", "text": "Which city?"}]),
    )
    .await;
    let later = server.requests().pop().unwrap();
    assert_eq!(later.files(), seen(1, &image));
    assert_eq!(
        later.body["messages"][3],
        json!({"role": "user", "content": "Which city?"})
    );
}

#[tokio::test]
async fn the_responses_api_gets_input_image_and_input_file_parts() {
    let (_app, _server, _chat, request, image) = post_files("openai-responses").await;
    assert_eq!(request.files(), seen(0, &image));
    assert_eq!(
        request.body["input"][0],
        json!({"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": format!("What are these?\n\n{CSV_INLINE}")},
            {"type": "input_image", "image_url": data_url("image/png", &image), "detail": "auto"},
            {"type": "input_file", "filename": "report.pdf",
             "file_data": data_url("application/pdf", PDF)},
        ]})
    );
}

#[tokio::test]
async fn anthropic_gets_image_and_document_blocks() {
    let (_app, _server, _chat, request, image) = post_files("anthropic").await;
    assert_eq!(request.files(), seen(0, &image));
    assert_eq!(
        request.body["messages"][0],
        json!({"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64(&image)}},
            {"type": "document", "title": "report.pdf", "source":
                {"type": "base64", "media_type": "application/pdf", "data": base64(PDF)}},
            {"type": "text", "text": format!("What are these?\n\n{CSV_INLINE}")},
        ]})
    );
}

/// A model the catalog does not say reads images or documents (here one it does not list
/// at all), with no vision route, is told an image was attached and why it gets no
/// description, and reads the document's text instead (T27).
#[tokio::test]
async fn a_model_without_vision_is_told_an_image_was_attached_and_reads_a_pdfs_text() {
    let app = app().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(text("I cannot see it."));
    say(
        &app,
        &chat,
        json!([
            {"type": "text", "text": "What is this?"},
            {"type": "file", "mediaType": "image/png", "filename": "chart.png",
             "url": data_url("image/png", &png())},
            {"type": "file", "mediaType": "application/pdf", "filename": "report.pdf",
             "url": data_url("application/pdf", PDF)},
        ]),
    )
    .await;
    let request = app.provider.requests().pop().unwrap();
    assert!(request.files().is_empty());
    assert_eq!(
        request.body["messages"][1],
        json!({"role": "user", "content": "What is this?\n\
            [an image was attached here (chart.png, image/png), but this model cannot read it, \
            and no vision route is configured to describe it]\n\
            [file report.pdf (application/pdf), its text]\n\
            Quarterly report: revenue rose 12 percent.\n\
            [end of file report.pdf]"})
    );
}

/// T23: files share the context budget with the text, newest first: when a second image
/// no longer fits beside the first, the older one is the one left out, with a note.
#[tokio::test]
async fn the_oldest_files_are_left_out_when_the_budget_runs_out() {
    let app = TestApp::start_with(|c| {
        c.secrets_key = Some(SecretsKey::parse(KEY_HEX).unwrap());
        c.providers_allow_private_networks = true;
        // Room for one image (about 1,600 tokens) and the text, not for two.
        c.context_tokens = 2_500;
    })
    .await;
    let server = ScriptedProvider::start().await.unwrap();
    let chat = chat_on(&app, "team", "openai", &server).await;
    for (name, answer) in [("first.png", "One."), ("second.png", "Two.")] {
        server.push(text(answer));
        say(
            &app,
            &chat,
            json!([{"type": "text", "text": "And this?"},
                   {"type": "file", "mediaType": "image/png", "filename": name,
                    "url": data_url("image/png", &png())}]),
        )
        .await;
    }
    let requests = server.requests();
    assert_eq!(
        requests[0].files().len(),
        1,
        "the first turn shows its image"
    );
    let later = &requests[1];
    let files = later.files();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(
        files[0].message, 3,
        "the newest message's image is the one kept"
    );
    assert_eq!(
        later.body["messages"][1]["content"],
        "And this?\n\n[a file first.png (image/png) was attached here; left out to stay \
         within the context budget]"
    );
}

/// A chat with an agent on `team/blind`, a model without vision, whose `vision` route is
/// `team/eye`, a model with vision, both on `server`.
async fn blind_chat(app: &TestApp, server: &ScriptedProvider) -> String {
    let created = app
        .post_json(
            "/v1/providers",
            &json!({"name": "team", "kind": "openai", "base_url": server.openai_base_url(),
                    "api_key": "sk-t",
                    "models": [{"model": "eye", "vision": true}, {"model": "blind"}]}),
        )
        .await;
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
    let agent = app
        .post_json(
            "/v1/agents",
            &json!({"name": "a", "system_prompt": "You are terse.", "model": "team/blind",
                    "auxiliary_models": {"vision": "team/eye"}}),
        )
        .await;
    assert_eq!(agent.status(), 201);
    let agent: Value = agent.json().await.unwrap();
    app.new_chat(agent["id"].as_str().unwrap()).await
}

async fn say_with_image(app: &TestApp, chat: &str) {
    say(
        app,
        chat,
        json!([
            {"type": "text", "text": "What is this?"},
            {"type": "file", "mediaType": "image/png", "filename": "chart.png",
             "url": data_url("image/png", &png())},
        ]),
    )
    .await;
}

/// The model, files and first user message of a request the scripted server recorded.
fn user_message(request: &RecordedRequest) -> (&Value, Vec<SeenFile>, &Value) {
    (
        &request.body["model"],
        request.files(),
        &request.body["messages"][1]["content"],
    )
}

/// T27: a model without vision reads each image's description by the `vision` route in
/// the image's place. The vision route's request holds the image, the main model's the
/// description and no image; the description is kept and billed once, so a later turn
/// does not ask again.
#[tokio::test]
async fn a_model_without_vision_reads_a_description_made_once_by_the_vision_route() {
    let app = app().await;
    let server = ScriptedProvider::start().await.unwrap();
    let chat = blind_chat(&app, &server).await;
    server.push(text("A bar chart: Lyon 3 visits, Nantes 5."));
    server.push(text("Nantes had more."));
    say_with_image(&app, &chat).await;
    let image = stored_image(&app, &chat).await;
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "a description, then the answer");
    let described = "What is this?\n[image chart.png, described: A bar chart: Lyon 3 visits, \
                     Nantes 5.]";
    let (model, files, _) = user_message(&requests[0]);
    assert_eq!(model, "eye");
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0].bytes, image, "the vision route sees the image");
    let (model, files, content) = user_message(&requests[1]);
    assert_eq!(model, "blind");
    assert!(files.is_empty(), "{files:?}");
    assert_eq!(content, described);
    assert!(server.violations().is_empty(), "{:?}", server.violations());

    let billed: Vec<(String,)> = sqlx::query_as(
        "SELECT b.model FROM billing_events b JOIN turns t ON t.id = b.turn_id \
         WHERE t.chat_id = $1 AND b.event_key LIKE '%:vision:%'",
    )
    .bind(chat.parse::<uuid::Uuid>().unwrap())
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    assert_eq!(billed, [("team/eye".to_owned(),)], "billed as usage, once");

    server.push(text("Lyon."));
    say(
        &app,
        &chat,
        json!([{"type": "text", "text": "Which city had fewer?"}]),
    )
    .await;
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "one vision request in all");
    let (model, files, content) = user_message(&requests[2]);
    assert_eq!(model, "blind");
    assert!(files.is_empty());
    assert_eq!(content, described, "the kept description");
}

/// T27: when the vision route fails, the model is told the description could not be
/// made, and the turn still answers; a later turn tries again, three times in all.
#[tokio::test]
async fn a_failing_vision_route_leaves_a_note_and_the_turn_answers() {
    let app = app().await;
    let server = ScriptedProvider::start().await.unwrap();
    let chat = blind_chat(&app, &server).await;
    server.push(Reply::Status {
        status: 400,
        retry_after: None,
    });
    server.push(text("I cannot tell."));
    say_with_image(&app, &chat).await;
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "the failed description, then the answer");
    let (model, files, content) = user_message(&requests[1]);
    assert_eq!(model, "blind");
    assert!(files.is_empty());
    assert_eq!(
        content,
        "What is this?\n[an image was attached here (chart.png, image/png), but this model \
         cannot read it, and its description could not be made]"
    );
    let messages = app.messages(&chat).await;
    assert_eq!(messages[1]["role"], "assistant");
    assert!(messages[1]["parts"].to_string().contains("I cannot tell."));

    let failed_note = content.clone();
    for (turn, asked) in [(2, 4), (3, 6), (4, 7)] {
        if asked - server.requests().len() == 2 {
            server.push(Reply::Status {
                status: 400,
                retry_after: None,
            });
        }
        server.push(text("Still no."));
        say(&app, &chat, json!([{"type": "text", "text": "And now?"}])).await;
        let requests = server.requests();
        assert_eq!(requests.len(), asked, "turn {turn}");
        let (_, _, content) = user_message(requests.last().unwrap());
        assert_eq!(content, &failed_note, "turn {turn}");
    }
}
