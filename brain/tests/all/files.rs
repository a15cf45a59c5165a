//! Files in chats (T21, T22): uploads and `data:` URLs in a message's `file`
//! parts, stored with the artifacts and served to exactly those who may read the chat;
//! the media type sniffed from the bytes; images cleaned of their metadata and bounded;
//! the three limits refused `413` with nothing stored; erasure takes the bytes. Real bytes
//! throughout: PNG and JPEG written by the `image` crate (the JPEG with an EXIF block
//! holding a GPS position), a PDF written by fpdf2 (`fixtures/report.pdf`), a CSV, and
//! text posing as a PNG.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Cursor;
use std::time::Duration;

use base64::Engine as _;
use image::{DynamicImage, ImageFormat, Rgb, RgbImage};
use reqwest::Response;
use serde_json::{Value, json};

use crate::auth::jwt;
use crate::common::replies::text;
use crate::common::{TestApp, error_code, read_stream};
use crate::erasure::{artifacts_dir, eventually, files_under};
use crate::teams::as_operator;

const PDF: &[u8] = include_bytes!("fixtures/report.pdf");
const CSV: &[u8] = b"city,visits\nLyon,3\nNantes,5\n";
/// What the JPEG's EXIF block carries: where the photo was taken.
const GPS: &str = "GPS 48.8584N 2.2945E";

fn png(width: u32, height: u32) -> Vec<u8> {
    let picture = RgbImage::from_fn(width, height, |x, y| {
        Rgb([(x % 256) as u8, (y % 256) as u8, 7])
    });
    let mut out = Vec::new();
    DynamicImage::ImageRgb8(picture)
        .write_to(&mut Cursor::new(&mut out), ImageFormat::Png)
        .unwrap();
    out
}

/// A 40×30 JPEG whose APP1 segment is an EXIF block (big-endian TIFF): an
/// ImageDescription holding [`GPS`] and, when given, an Orientation.
fn jpeg_with_exif(orientation: Option<u16>) -> Vec<u8> {
    let mut jpeg = Vec::new();
    DynamicImage::ImageRgb8(RgbImage::from_pixel(40, 30, Rgb([200, 30, 30])))
        .write_to(&mut Cursor::new(&mut jpeg), ImageFormat::Jpeg)
        .unwrap();
    let description = format!("{GPS}\0");
    let entries: u16 = if orientation.is_some() { 2 } else { 1 };
    let text_at = 8 + 2 + 12 * u32::from(entries) + 4;
    let mut tiff = b"MM\0\x2a\0\0\0\x08".to_vec();
    tiff.extend_from_slice(&entries.to_be_bytes());
    tiff.extend_from_slice(&[0x01, 0x0e, 0, 2]);
    tiff.extend_from_slice(&(description.len() as u32).to_be_bytes());
    tiff.extend_from_slice(&text_at.to_be_bytes());
    if let Some(orientation) = orientation {
        tiff.extend_from_slice(&[0x01, 0x12, 0, 3, 0, 0, 0, 1]);
        tiff.extend_from_slice(&orientation.to_be_bytes());
        tiff.extend_from_slice(&[0, 0]);
    }
    tiff.extend_from_slice(&0u32.to_be_bytes());
    tiff.extend_from_slice(description.as_bytes());
    let mut payload = b"Exif\0\0".to_vec();
    payload.extend_from_slice(&tiff);
    let mut segment = vec![0xFF, 0xE1];
    segment.extend_from_slice(&((payload.len() + 2) as u16).to_be_bytes());
    segment.extend_from_slice(&payload);
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&segment);
    out.extend_from_slice(&jpeg[2..]);
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

pub(crate) fn data_url(media_type: &str, bytes: &[u8]) -> String {
    format!(
        "data:{media_type};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// `POST /v1/chats/{chat}/files` as `bearer`: a multipart form written by hand, the
/// client's claimed type in the part's header.
async fn upload_as(
    app: &TestApp,
    bearer: &str,
    chat: &str,
    filename: &str,
    claimed: &str,
    bytes: &[u8],
) -> Response {
    let boundary = "----test-boundary-7d3f";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
         Content-Type: {claimed}\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    app.http
        .post(format!("{}/v1/chats/{chat}/files", app.url))
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

pub(crate) async fn upload(
    app: &TestApp,
    chat: &str,
    filename: &str,
    claimed: &str,
    bytes: &[u8],
) -> Value {
    let response = upload_as(app, &app.key, chat, filename, claimed, bytes).await;
    assert_eq!(response.status(), 201);
    response.json().await.unwrap()
}

/// The bytes and content type served at `url` to `bearer`.
async fn download_as(app: &TestApp, bearer: &str, url: &str) -> (u16, String, Vec<u8>) {
    let response = app
        .http
        .get(format!("{}{url}", app.url))
        .bearer_auth(bearer)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (
        status,
        content_type,
        response.bytes().await.unwrap().to_vec(),
    )
}

async fn file_rows(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM chat_files")
        .fetch_one(app.store.pool())
        .await
        .unwrap()
}

/// An AI SDK `useChat` body: one user message of `parts`, under a new message id.
pub(crate) fn ai_sdk(parts: Value) -> Value {
    json!({"id": "c", "trigger": "submit-message",
           "messages": [{"id": uuid::Uuid::now_v7().to_string(), "role": "user", "parts": parts}]})
}

#[tokio::test]
async fn the_bytes_decide_the_type_and_images_lose_their_metadata() {
    let app = TestApp::start_with(|c| c.files.image_max_side = 256).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;

    let wide = upload(&app, &chat, "wide.png", "image/png", &png(1000, 200)).await;
    assert_eq!(wide["media_type"], "image/png");
    assert_eq!(wide["filename"], "wide.png");
    let (status, served_type, bytes) =
        download_as(&app, &app.key, wide["url"].as_str().unwrap()).await;
    assert_eq!((status, served_type.as_str()), (200, "image/png"));
    assert_eq!(wide["size"], bytes.len());
    let picture = image::load_from_memory(&bytes).unwrap();
    assert_eq!(
        (picture.width(), picture.height()),
        (256, 51),
        "scaled to the bound"
    );

    let photo = jpeg_with_exif(None);
    assert!(contains(&photo, b"Exif") && contains(&photo, GPS.as_bytes()));
    let stored = upload(&app, &chat, "../holiday.jpg", "image/jpeg", &photo).await;
    assert_eq!(stored["media_type"], "image/jpeg");
    assert_eq!(stored["filename"], "holiday.jpg");
    let (_, _, bytes) = download_as(&app, &app.key, stored["url"].as_str().unwrap()).await;
    assert!(!contains(&bytes, b"Exif"), "the EXIF block is gone");
    assert!(!contains(&bytes, GPS.as_bytes()), "the position is gone");
    let picture = image::load_from_memory_with_format(&bytes, ImageFormat::Jpeg).unwrap();
    assert_eq!((picture.width(), picture.height()), (40, 30));
    // A photo taken on its side (EXIF orientation 6) is stored upright, its tag gone.
    let sideways = upload(
        &app,
        &chat,
        "side.jpg",
        "image/jpeg",
        &jpeg_with_exif(Some(6)),
    )
    .await;
    let (_, _, bytes) = download_as(&app, &app.key, sideways["url"].as_str().unwrap()).await;
    assert!(!contains(&bytes, b"Exif"));
    let picture = image::load_from_memory_with_format(&bytes, ImageFormat::Jpeg).unwrap();
    assert_eq!((picture.width(), picture.height()), (30, 40));

    for (name, claimed, bytes, sniffed) in [
        ("report.pdf", "text/plain", PDF, "application/pdf"),
        ("visits.csv", "application/octet-stream", CSV, "text/csv"),
        (
            "cat.png",
            "image/png",
            b"I am not a picture, only words.\n".as_slice(),
            "text/plain",
        ),
        (
            "data.bin",
            "image/png",
            br#"{"cat": false}"#.as_slice(),
            "application/json",
        ),
    ] {
        let file = upload(&app, &chat, name, claimed, bytes).await;
        assert_eq!(file["media_type"], sniffed, "{name}");
        let (status, served_type, served) =
            download_as(&app, &app.key, file["url"].as_str().unwrap()).await;
        assert_eq!((status, served_type.as_str()), (200, sniffed), "{name}");
        assert_eq!(served, bytes, "{name}: stored as sent");
    }

    // Bytes that begin as a PNG and are not one are refused, not stored as an image.
    let rows = file_rows(&app).await;
    let broken = upload_as(
        &app,
        &app.key,
        &chat,
        "x.png",
        "image/png",
        b"\x89PNG\r\n\x1a\nnope",
    )
    .await;
    assert_eq!(error_code(broken).await, (400, "invalid_request".into()));
    assert_eq!(file_rows(&app).await, rows);
}

#[tokio::test]
async fn a_message_carries_file_parts_and_the_transcript_keeps_their_urls() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let csv = upload(&app, &chat, "visits.csv", "text/csv", CSV).await;
    let picture = png(64, 48);
    app.provider.push(text("Seen."));
    let body = ai_sdk(json!([
        {"type": "text", "text": "What do these show?"},
        // The client says JPEG; the bytes are a PNG.
        {"type": "file", "mediaType": "image/jpeg", "filename": "chart.png",
         "url": data_url("image/jpeg", &picture)},
        {"type": "file", "mediaType": "application/pdf", "url": csv["url"]},
    ]));
    let response = app.send(&chat, &body).await;
    assert_eq!(response.status(), 200);
    let (_, done) = read_stream(response).await;
    assert!(done);
    app.settled().await;
    assert_eq!(file_rows(&app).await, 2);
    // A retry of the message (T12) replays its turn and stores no copy of its files.
    let replayed = app.send(&chat, &body).await;
    assert_eq!(replayed.status(), 200);
    read_stream(replayed).await;
    assert_eq!(file_rows(&app).await, 2);

    let messages = app.messages(&chat).await;
    let user = &messages[0];
    assert_eq!(user["role"], "user");
    let parts = user["parts"].as_array().unwrap();
    assert_eq!(parts.len(), 3, "{parts:?}");
    assert_eq!(
        parts[0],
        json!({"type": "text", "text": "What do these show?"})
    );
    assert_eq!(parts[1]["type"], "file");
    assert_eq!(parts[1]["mediaType"], "image/png");
    assert_eq!(parts[1]["filename"], "chart.png");
    let inline_url = parts[1]["url"].as_str().unwrap();
    assert!(inline_url.starts_with("/v1/files/"), "{inline_url}");
    // Both URLs are signed (T26): the same file, whatever their `exp`.
    let unsigned = |url: &Value| url.as_str().unwrap().split('?').next().unwrap().to_owned();
    assert_eq!(unsigned(&parts[2]["url"]), unsigned(&csv["url"]));
    assert_eq!(
        (&parts[2]["mediaType"], &parts[2]["filename"]),
        (&json!("text/csv"), &json!("visits.csv"))
    );
    assert!(!user.to_string().contains("data:"), "no data URL is stored");
    let (status, served_type, bytes) = download_as(&app, &app.key, inline_url).await;
    assert_eq!((status, served_type.as_str()), (200, "image/png"));
    assert_eq!(image::load_from_memory(&bytes).unwrap().width(), 64);

    // A message of files alone is a message.
    app.provider.push(text("A PDF."));
    let response = app
        .send(
            &chat,
            &ai_sdk(json!([{"type": "file", "mediaType": "application/pdf",
                             "url": data_url("application/pdf", PDF)}])),
        )
        .await;
    assert_eq!(response.status(), 200);
    let (chunks, done) = read_stream(response).await;
    assert!(done, "{chunks:?}");
    app.settled().await;
    let messages = app.messages(&chat).await;
    assert_eq!(messages.len(), 4, "{messages:?} {chunks:?}");
    let parts = messages[2]["parts"].as_array().unwrap();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0]["mediaType"], "application/pdf");
}

#[tokio::test]
async fn file_parts_that_name_no_file_of_the_chat_are_refused() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let other_chat = app.new_chat(&agent).await;
    let elsewhere = upload(&app, &other_chat, "a.txt", "text/plain", b"hello").await;
    let rows = file_rows(&app).await;
    for part in [
        json!({"type": "file", "mediaType": "text/plain", "url": elsewhere["url"]}),
        json!({"type": "file", "mediaType": "text/plain",
               "url": format!("/v1/files/{}", uuid::Uuid::now_v7())}),
        json!({"type": "file", "mediaType": "text/plain", "url": "https://example.com/a.txt"}),
        json!({"type": "file", "mediaType": "text/plain", "url": "data:text/plain,hello"}),
    ] {
        let response = app
            .send(
                &chat,
                &ai_sdk(json!([{"type": "text", "text": "hi"}, part])),
            )
            .await;
        assert_eq!(
            error_code(response).await,
            (400, "invalid_request".into()),
            "{part}"
        );
    }
    assert_eq!(file_rows(&app).await, rows);
    assert!(app.messages(&chat).await.is_empty());
    assert!(app.provider.requests().is_empty());
}

#[tokio::test]
async fn each_limit_is_refused_413_with_nothing_stored() {
    let app = TestApp::start_with(|c| {
        c.files.max_file_bytes = 1000;
        c.files.max_message_bytes = 1500;
        c.files.quota_bytes = 2500;
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let dir = artifacts_dir(&app);

    let big = upload_as(
        &app,
        &app.key,
        &chat,
        "big.txt",
        "text/plain",
        &[b'a'; 1001],
    )
    .await;
    assert_eq!(error_code(big).await, (413, "file_too_large".into()));
    let inline_big = app
        .send(
            &chat,
            &ai_sdk(json!([{"type": "file", "mediaType": "text/plain",
                             "url": data_url("text/plain", &[b'a'; 1001])}])),
        )
        .await;
    assert_eq!(error_code(inline_big).await, (413, "file_too_large".into()));
    let two = app
        .send(
            &chat,
            &ai_sdk(json!([
                {"type": "file", "mediaType": "text/plain", "url": data_url("text/plain", &[b'a'; 800])},
                {"type": "file", "mediaType": "text/plain", "url": data_url("text/plain", &[b'b'; 800])},
            ])),
        )
        .await;
    assert_eq!(
        error_code(two).await,
        (413, "message_files_too_large".into())
    );
    assert_eq!(file_rows(&app).await, 0);
    assert!(files_under(&dir).is_empty(), "{:?}", files_under(&dir));
    assert!(app.messages(&chat).await.is_empty());

    upload(&app, &chat, "one.txt", "text/plain", &[b'a'; 1000]).await;
    upload(&app, &chat, "two.txt", "text/plain", &[b'b'; 1000]).await;
    let over = upload_as(
        &app,
        &app.key,
        &chat,
        "three.txt",
        "text/plain",
        &[b'c'; 1000],
    )
    .await;
    assert_eq!(error_code(over).await, (413, "file_quota_exceeded".into()));
    assert_eq!(file_rows(&app).await, 2);
    assert_eq!(
        files_under(&dir).len(),
        2,
        "the refused file's bytes are gone"
    );
    let inline_over = app
        .send(
            &chat,
            &ai_sdk(json!([{"type": "file", "mediaType": "text/plain",
                             "url": data_url("text/plain", &[b'c'; 600])}])),
        )
        .await;
    assert_eq!(
        error_code(inline_over).await,
        (413, "file_quota_exceeded".into())
    );
    assert_eq!(file_rows(&app).await, 2);
    assert_eq!(files_under(&dir).len(), 2);
    assert!(app.messages(&chat).await.is_empty());
    assert!(app.provider.requests().is_empty());
}

#[tokio::test]
async fn only_those_who_may_read_the_chat_get_its_files() {
    let app = jwt::app_with(&[(
        "BRAIN_JWT_PUBLIC_KEYS",
        include_str!("fixtures/jwt/ed.pub.pem"),
    )])
    .await;
    let token = |user: &str| {
        jwt::sign(
            &jwt::ed(),
            jsonwebtoken::Algorithm::EdDSA,
            None,
            &jwt::claims(app.team, user, json!({"admin": false})),
        )
    };
    let (alice, bob) = (token("alice"), token("bob"));
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let created = app
        .http
        .post(format!("{}/v1/agents/{agent}/chats", app.url))
        .bearer_auth(&alice)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let alices: Value = created.json().await.unwrap();
    let alices = alices["id"].as_str().unwrap();

    let response = upload_as(&app, &alice, alices, "note.txt", "text/plain", b"for alice").await;
    assert_eq!(response.status(), 201);
    let file: Value = response.json().await.unwrap();
    let url = file["url"].as_str().unwrap();
    assert_eq!(download_as(&app, &alice, url).await.0, 200);
    assert_eq!(
        download_as(&app, &app.key, url).await.0,
        200,
        "a team key sees every chat"
    );
    assert_eq!(
        download_as(&app, &bob, url).await.0,
        404,
        "another user's chat"
    );
    let refused = upload_as(&app, &bob, alices, "x.txt", "text/plain", b"bob").await;
    assert_eq!(error_code(refused).await, (404, "not_found".into()));

    let other = app.store.create_team("other team").await.unwrap();
    assert_eq!(
        download_as(&app, &other.api_key, url).await.0,
        404,
        "another team"
    );
    let refused = upload_as(&app, &other.api_key, alices, "x.txt", "text/plain", b"x").await;
    assert_eq!(error_code(refused).await, (404, "not_found".into()));
    assert_eq!(file_rows(&app).await, 1);
}

#[tokio::test]
async fn erasing_the_chat_takes_its_files_and_their_bytes() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let file = upload(&app, &chat, "visits.csv", "text/csv", CSV).await;
    app.provider.push(text("Noted."));
    let response = app
        .send(
            &chat,
            &ai_sdk(json!([{"type": "file", "mediaType": "image/png",
                             "url": data_url("image/png", &png(8, 8))}])),
        )
        .await;
    read_stream(response).await;
    app.settled().await;
    let dir = artifacts_dir(&app);
    assert_eq!(files_under(&dir).len(), 2);

    let erased = app
        .auth(app.http.delete(format!("{}/v1/chats/{chat}", app.url)))
        .send()
        .await
        .unwrap();
    assert!(erased.status().is_success(), "{}", erased.status());
    assert_eq!(file_rows(&app).await, 0);
    assert!(files_under(&dir).is_empty(), "{:?}", files_under(&dir));
    assert_eq!(
        download_as(&app, &app.key, file["url"].as_str().unwrap())
            .await
            .0,
        404
    );
}

#[tokio::test]
async fn erasing_the_team_takes_its_files_and_their_bytes() {
    let app = TestApp::start_with(|c| c.operator_token = Some(crate::auth::operator_token())).await;
    let created = as_operator(
        &app,
        reqwest::Method::POST,
        "/v1/teams",
        Some(json!({"name": "leaving"})),
    )
    .await;
    let created: Value = created.json().await.unwrap();
    let team = created["team_id"].as_str().unwrap().to_owned();
    let key = created["api_key"].as_str().unwrap().to_owned();
    let agent: Value = app
        .http
        .post(format!("{}/v1/agents", app.url))
        .bearer_auth(&key)
        .json(&json!({"name": "a", "system_prompt": "", "model": "openai/gpt-test"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let chat: Value = app
        .http
        .post(format!(
            "{}/v1/agents/{}/chats",
            app.url,
            agent["id"].as_str().unwrap()
        ))
        .bearer_auth(&key)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let chat = chat["id"].as_str().unwrap();
    let uploaded = upload_as(&app, &key, chat, "visits.csv", "text/csv", CSV).await;
    assert_eq!(uploaded.status(), 201);
    let dir = artifacts_dir(&app);
    assert_eq!(files_under(&dir).len(), 1);

    let asked = as_operator(
        &app,
        reqwest::Method::DELETE,
        &format!("/v1/teams/{team}"),
        None,
    )
    .await;
    assert_eq!(asked.status(), 202);
    eventually(Duration::from_secs(20), "the team is erased", || async {
        let read: Value = as_operator(
            &app,
            reqwest::Method::GET,
            &format!("/v1/teams/{team}"),
            None,
        )
        .await
        .json()
        .await
        .unwrap();
        read["status"] == "erased"
    })
    .await;
    assert_eq!(file_rows(&app).await, 0);
    assert!(files_under(&dir).is_empty(), "{:?}", files_under(&dir));
}

#[tokio::test]
async fn files_past_the_teams_retention_go_with_their_bytes() {
    let app =
        TestApp::start_with(|c| c.retention_sweep_interval = Duration::from_millis(200)).await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let old = upload(&app, &chat, "old.csv", "text/csv", CSV).await;
    let new = upload(&app, &chat, "new.txt", "text/plain", b"kept").await;
    sqlx::query("UPDATE chat_files SET created_at = now() - interval '3 days' WHERE id = $1::uuid")
        .bind(old["id"].as_str().unwrap())
        .execute(app.store.pool())
        .await
        .unwrap();
    let set = app
        .auth(app.http.put(format!("{}/v1/team/settings", app.url)))
        .json(&json!({"retention_days": 1}))
        .send()
        .await
        .unwrap();
    assert!(set.status().is_success(), "{}", set.status());
    let dir = artifacts_dir(&app);
    eventually(Duration::from_secs(20), "the old file is swept", || async {
        file_rows(&app).await == 1 && files_under(&dir).len() == 1
    })
    .await;
    let old_url = old["url"].as_str().unwrap();
    assert_eq!(download_as(&app, &app.key, old_url).await.0, 404);
    let (status, _, bytes) = download_as(&app, &app.key, new["url"].as_str().unwrap()).await;
    assert_eq!((status, bytes.as_slice()), (200, b"kept".as_slice()));
}

#[tokio::test]
async fn files_live_in_an_s3_bucket_and_leave_it_with_their_chat() {
    use crate::artifacts::{BUCKET, S3sFs, SECRET_KEY};
    let server = S3sFs::start();
    let s3 = server.config(SECRET_KEY);
    let app = TestApp::start_with(|c| {
        c.artifacts.backend = engine::config::ArtifactBackend::S3(s3.clone());
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let photo = upload(
        &app,
        &chat,
        "holiday.jpg",
        "image/jpeg",
        &jpeg_with_exif(None),
    )
    .await;
    let key = format!("{}/{}", app.team, photo["id"].as_str().unwrap());
    let object = server.root.0.join(BUCKET).join(&key);
    assert!(object.is_file(), "{key}");
    let stored = std::fs::read(&object).unwrap();
    assert!(
        !contains(&stored, GPS.as_bytes()),
        "the bucket holds the cleaned bytes"
    );
    let (status, served_type, bytes) =
        download_as(&app, &app.key, photo["url"].as_str().unwrap()).await;
    assert_eq!((status, served_type.as_str()), (200, "image/jpeg"));
    assert_eq!(bytes, stored);

    let erased = app
        .auth(app.http.delete(format!("{}/v1/chats/{chat}", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(erased.status(), 204);
    assert!(!object.exists(), "the erased chat's file left the bucket");
}

/// The key `BRAIN_SECRETS_KEY` of the signed-URL tests: the test signs URLs itself, as the
/// brain does (`engine::files::FileUrls`), to reach what no URL it hands out would.
const URL_KEY_HEX: &str = "8f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";

/// `/v1/files/{file}?exp=…&sig=…` signed for `team`, under the key the brain derives from
/// [`URL_KEY_HEX`]: HMAC-SHA256 over a fixed prefix, the team, the file and `exp`.
fn signed_by_hand(team: &str, file: &str, exp: i64) -> String {
    use aws_lc_rs::hmac;
    let raw: Vec<u8> = (0..64)
        .step_by(2)
        .map(|i| u8::from_str_radix(&URL_KEY_HEX[i..i + 2], 16).unwrap())
        .collect();
    let derived = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &raw), b"chat-file-urls");
    let key = hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref());
    let mut signed = b"agent-runtime file url v1\0".to_vec();
    signed.extend_from_slice(uuid::Uuid::parse_str(team).unwrap().as_bytes());
    signed.extend_from_slice(uuid::Uuid::parse_str(file).unwrap().as_bytes());
    signed.extend_from_slice(&exp.to_be_bytes());
    let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hmac::sign(&key, &signed));
    format!("/v1/files/{file}?exp={exp}&sig={sig}")
}

/// `GET` of `url` with no credentials, as an `<img src>` does.
async fn fetch_plain(app: &TestApp, url: &str) -> Response {
    app.http
        .get(format!("{}{url}", app.url))
        .send()
        .await
        .unwrap()
}

fn query_of(url: &str) -> (i64, String) {
    let query = url.split_once('?').expect("a signed URL").1;
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap()
            .to_owned()
    };
    (param("exp").parse().unwrap(), param("sig"))
}

/// T26: a transcript read with the stock `useChat` shows its images: every `file` part's
/// URL (and the upload's answer) is signed, and `GET` of it serves the file without the
/// bearer, with safe headers; the stored message keeps the unsigned URL. A signature
/// tampered with, moved to another `exp` or another file, is `403 invalid_file_url`;
/// the bearer path still works, and wins over a bad signature.
#[tokio::test]
async fn signed_urls_serve_the_file_without_the_bearer() {
    let app = TestApp::start_with(|c| {
        c.secrets_key = Some(store::SecretsKey::parse(URL_KEY_HEX).unwrap())
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let csv = upload(&app, &chat, "visits.csv", "text/csv", CSV).await;
    let csv_url = csv["url"].as_str().unwrap().to_owned();
    let (exp, _) = query_of(&csv_url);
    let now = chrono::Utc::now().timestamp();
    assert!(
        exp >= now + 3600 && exp <= now + 3600 + 400,
        "an hour or a little more: {exp}"
    );
    // The brain's signature is the one the documented scheme gives.
    assert_eq!(
        csv_url,
        signed_by_hand(&app.team.to_string(), csv["id"].as_str().unwrap(), exp)
    );
    app.provider.push(text("Seen."));
    let response = app
        .send(
            &chat,
            &ai_sdk(json!([
                {"type": "text", "text": "Look"},
                {"type": "file", "mediaType": "image/png", "filename": "dot.png",
                 "url": data_url("image/png", &png(8, 8))},
                // The signed URL the upload answered, as a client posts it back.
                {"type": "file", "mediaType": "text/csv", "url": csv_url},
            ])),
        )
        .await;
    assert_eq!(response.status(), 200);
    read_stream(response).await;
    app.settled().await;

    let messages = app.messages(&chat).await;
    let parts = messages[0]["parts"].as_array().unwrap();
    let image_url = parts[1]["url"].as_str().unwrap().to_owned();
    let table_url = parts[2]["url"].as_str().unwrap().to_owned();
    for url in [&image_url, &table_url] {
        assert!(
            url.starts_with("/v1/files/") && url.contains("?exp="),
            "{url}"
        );
    }
    let stored: Value = sqlx::query_scalar("SELECT parts FROM messages WHERE role = 'user'")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    for part in stored.as_array().unwrap().iter().skip(1) {
        let url = part["url"].as_str().unwrap();
        assert!(
            !url.contains('?'),
            "the stored URL is the unsigned one: {url}"
        );
    }

    let image = fetch_plain(&app, &image_url).await;
    assert_eq!(image.status(), 200);
    let headers = image.headers().clone();
    assert_eq!(headers["content-type"], "image/png");
    assert!(
        headers["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("inline")
    );
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert!(headers.get("content-security-policy").is_none());
    assert!(image::load_from_memory(&image.bytes().await.unwrap()).is_ok());
    let table = fetch_plain(&app, &table_url).await;
    assert_eq!(table.status(), 200);
    let headers = table.headers().clone();
    assert_eq!(headers["content-type"], "text/csv");
    assert!(
        headers["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment")
    );
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert!(
        headers["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("sandbox")
    );
    assert_eq!(table.bytes().await.unwrap().as_ref(), CSV);

    let (exp, sig) = query_of(&image_url);
    let image_id = image_url
        .split('?')
        .next()
        .unwrap()
        .trim_start_matches("/v1/files/");
    let table_id = table_url
        .split('?')
        .next()
        .unwrap()
        .trim_start_matches("/v1/files/");
    let flipped: String = sig
        .chars()
        .enumerate()
        .map(|(i, c)| {
            if i == 5 {
                if c == 'A' { 'B' } else { 'A' }
            } else {
                c
            }
        })
        .collect();
    for bad in [
        format!("/v1/files/{image_id}?exp={exp}&sig={flipped}"),
        format!("/v1/files/{image_id}?exp={}&sig={sig}", exp + 3600),
        format!("/v1/files/{image_id}?exp={exp}&sig=short"),
        // The image's signature on another file of the team.
        format!("/v1/files/{table_id}?exp={exp}&sig={sig}"),
    ] {
        assert_eq!(
            error_code(fetch_plain(&app, &bad).await).await,
            (403, "invalid_file_url".into()),
            "{bad}"
        );
    }
    // Neither a bearer nor a signature: the usual refusal.
    let bare = image_url.split('?').next().unwrap();
    assert_eq!(
        error_code(fetch_plain(&app, bare).await).await,
        (401, "unauthorized".into())
    );
    // With the bearer the query is not read.
    let bad = format!("/v1/files/{image_id}?exp={exp}&sig={flipped}");
    assert_eq!(download_as(&app, &app.key, &bad).await.0, 200);
    assert_eq!(download_as(&app, &app.key, bare).await.0, 200);
}

/// T26: a signature opens the file of its own team only. Another team's file is not
/// reached by a signature of this team, even one made with the server's key for that
/// file's id; and a signature for the right file under the wrong team is refused too.
#[tokio::test]
async fn a_signature_opens_no_other_teams_file() {
    let app = TestApp::start_with(|c| {
        c.secrets_key = Some(store::SecretsKey::parse(URL_KEY_HEX).unwrap())
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let ours = upload(&app, &chat, "ours.txt", "text/plain", b"ours").await;
    let other = app.store.create_team("other team").await.unwrap();
    let agent: Value = app
        .http
        .post(format!("{}/v1/agents", app.url))
        .bearer_auth(&other.api_key)
        .json(&json!({"name": "a", "system_prompt": "", "model": "openai/gpt-test"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let their_chat = app
        .http
        .post(format!(
            "{}/v1/agents/{}/chats",
            app.url,
            agent["id"].as_str().unwrap()
        ))
        .bearer_auth(&other.api_key)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let theirs = upload_as(
        &app,
        &other.api_key,
        their_chat["id"].as_str().unwrap(),
        "theirs.txt",
        "text/plain",
        b"theirs",
    )
    .await;
    assert_eq!(theirs.status(), 201);
    let theirs: Value = theirs.json().await.unwrap();
    let their_id = theirs["id"].as_str().unwrap();

    let (exp, sig) = query_of(ours["url"].as_str().unwrap());
    assert_eq!(
        fetch_plain(&app, ours["url"].as_str().unwrap())
            .await
            .status(),
        200
    );
    let reused = format!("/v1/files/{their_id}?exp={exp}&sig={sig}");
    assert_eq!(
        error_code(fetch_plain(&app, &reused).await).await,
        (403, "invalid_file_url".into())
    );
    let wrong_team = signed_by_hand(&app.team.to_string(), their_id, exp);
    assert_eq!(
        error_code(fetch_plain(&app, &wrong_team).await).await,
        (403, "invalid_file_url".into())
    );
    // Their own signed URL opens their file, and only theirs.
    let right = signed_by_hand(&other.team_id.to_string(), their_id, exp);
    let served = fetch_plain(&app, &right).await;
    assert_eq!(served.status(), 200);
    assert_eq!(served.bytes().await.unwrap().as_ref(), b"theirs");
    // And our key does not read their file through the bearer path.
    assert_eq!(download_as(&app, &app.key, &right).await.0, 404);
}

/// T26: without `BRAIN_SECRETS_KEY` the key is a random one stored once in Postgres: a
/// second replica checks what the first signed. A URL past its time is refused
/// `403 invalid_file_url` (the bearer still reads the file), and once the chat is erased
/// its file's signed URL is `404`.
#[tokio::test]
async fn signed_urls_expire_hold_across_replicas_and_die_with_the_file() {
    let clock = crate::common::pinned_clock();
    let pinned = clock.clone();
    let app = TestApp::start_with(move |c| {
        c.clock = pinned;
        c.files.url_ttl = Duration::from_secs(600);
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let file = upload(&app, &chat, "note.txt", "text/plain", b"hello").await;
    let url = file["url"].as_str().unwrap().to_owned();
    let second = app.second_replica().await;
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM server_keys")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(keys, 1);
    for base in [&app.url, &second] {
        let served = app.http.get(format!("{base}{url}")).send().await.unwrap();
        assert_eq!(served.status(), 200, "{base}");
        assert_eq!(served.bytes().await.unwrap().as_ref(), b"hello");
    }
    let (exp, _) = query_of(&url);
    clock.set(chrono::DateTime::from_timestamp(exp - 1, 0).unwrap());
    assert_eq!(
        fetch_plain(&app, &url).await.status(),
        200,
        "valid to its last second"
    );
    clock.set(chrono::DateTime::from_timestamp(exp, 0).unwrap());
    assert_eq!(
        error_code(fetch_plain(&app, &url).await).await,
        (403, "invalid_file_url".into())
    );
    assert_eq!(download_as(&app, &app.key, &url).await.0, 200);
    // A fresh one, from the transcript or a new upload, works again.
    let fresh = upload(&app, &chat, "other.txt", "text/plain", b"again").await;
    assert_eq!(
        fetch_plain(&app, fresh["url"].as_str().unwrap())
            .await
            .status(),
        200
    );

    let erased = app
        .auth(app.http.delete(format!("{}/v1/chats/{chat}", app.url)))
        .send()
        .await
        .unwrap();
    assert!(erased.status().is_success(), "{}", erased.status());
    assert_eq!(
        error_code(fetch_plain(&app, fresh["url"].as_str().unwrap()).await).await,
        (404, "not_found".into())
    );
}
