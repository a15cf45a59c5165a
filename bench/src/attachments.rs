//! Attachments (`BENCH_ONLY=attachments`): what a 1 MB image adds to a turn's time to first
//! text-delta (T21-T23). One turn at a time, each in a new chat (a chat's earlier files go
//! to the model again on its later turns), three kinds of message to a model with vision:
//! text alone; the image inline as a `data:` URL (sniffed, decoded, stripped of its
//! metadata, encoded again and stored before the turn starts); the image uploaded before
//! (`POST /v1/chats/{id}/files`, not timed) and named by its URL (read back from the
//! artifact store). Each image turn sends the model the image's base64, so the scripted
//! provider's reading of a 1.4 MB request is in the figure as a real provider's would be.

use std::io::Cursor;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use image::codecs::jpeg::JpegEncoder;
use image::{Rgb, RgbImage};
use serde_json::{Value, json};

use crate::system::{Row, System, instant_ok, ms, pct, row, signed_ms, sorted};
use crate::turn::read_timed;

/// Timed turns of each kind, after [`WARM`] untimed ones.
const TURNS: usize = 60;
const WARM: usize = 5;

/// A photograph's worth of JPEG: noise over a gradient compresses about as badly as a
/// photo does, so 1024x768 at quality 90 is about 1 MB. A fixed generator keeps every
/// run's bytes the same.
fn photo() -> Result<Vec<u8>> {
    let mut state: u32 = 0x9e37_79b9;
    let picture = RgbImage::from_fn(1024, 768, |x, y| {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let noise = (state & 0x3f) as u8;
        Rgb([
            (x / 4) as u8 ^ noise,
            (y / 3) as u8 ^ noise.rotate_left(2),
            noise,
        ])
    });
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut Cursor::new(&mut out), 90).encode_image(&picture)?;
    Ok(out)
}

/// A message of `parts`, as the AI SDK posts it.
fn message(parts: Value) -> Value {
    json!({"id": "bench", "trigger": "submit-message", "messages": [
        {"id": uuid::Uuid::new_v4().to_string(), "role": "user", "parts": parts}]})
}

fn image_part(url: &str) -> Value {
    json!({"type": "file", "mediaType": "image/jpeg", "filename": "photo.jpg", "url": url})
}

/// `POST /v1/chats/{chat}/files` with `bytes`: the file's URL.
async fn upload(system: &System, chat: &str, bytes: &[u8]) -> Result<String> {
    let response = system
        .post_file(
            &format!("/v1/chats/{chat}/files"),
            "photo.jpg",
            "image/jpeg",
            bytes,
        )
        .await?;
    if response.status() != 201 {
        bail!("upload: {} {}", response.status(), response.text().await?);
    }
    let file: Value = response.json().await?;
    Ok(file["url"].as_str().context("upload: url")?.to_owned())
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Text,
    Inline,
    Uploaded,
}

/// The first text-delta of each timed turn of `kind`, sorted.
async fn first_deltas(
    system: &System,
    agent: &str,
    kind: Kind,
    photo: &[u8],
) -> Result<Vec<Duration>> {
    let inline = format!(
        "data:image/jpeg;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(photo)
    );
    let mut timings = Vec::with_capacity(TURNS);
    for i in 0..WARM + TURNS {
        let chat = system.new_chat(agent).await?;
        let text = json!({"type": "text", "text": "What is in this picture?"});
        let parts = match kind {
            Kind::Text => json!([text]),
            Kind::Inline => json!([text, image_part(&inline)]),
            Kind::Uploaded => json!([text, image_part(&upload(system, &chat, photo).await?)]),
        };
        let body = message(parts);
        system.provider.push(instant_ok());
        let started = Instant::now();
        let response = system
            .post_json(&format!("/v1/chats/{chat}/messages"), &body)
            .await?;
        let (_, first_delta, _) = read_timed(response, started).await?;
        if i >= WARM {
            timings.push(first_delta);
        }
    }
    Ok(sorted(timings))
}

pub async fn attachments(rows: &mut Vec<Row>) -> Result<()> {
    let system = System::start(None).await?;
    let agent = system
        .post_json(
            "/v1/agents",
            &json!({"name": "eyes", "system_prompt": "You are terse.",
                    "model": "openai/gpt-4o"}),
        )
        .await?;
    if agent.status() != 201 {
        bail!("create agent: {} {}", agent.status(), agent.text().await?);
    }
    let agent: Value = agent.json().await?;
    let agent = agent["id"].as_str().context("agent id")?.to_owned();
    let photo = photo()?;
    let text = first_deltas(&system, &agent, Kind::Text, &photo).await?;
    for (kind, name) in [
        (Kind::Inline, "1 MB JPEG inline (data: URL)"),
        (Kind::Uploaded, "1 MB JPEG uploaded before"),
    ] {
        let image = first_deltas(&system, &agent, kind, &photo).await?;
        rows.push(row(
            "attachments",
            &format!("first text-delta, {name}"),
            ms(pct(&image, 50.0)),
            ms(pct(&image, 99.0)),
            format!(
                "added to text alone: p50 {}, p99 {} ({} bytes, {TURNS} turns each)",
                signed_ms(pct(&image, 50.0), pct(&text, 50.0)),
                signed_ms(pct(&image, 99.0), pct(&text, 99.0)),
                photo.len()
            ),
        ));
    }
    rows.push(row(
        "attachments",
        "first text-delta, text alone",
        ms(pct(&text, 50.0)),
        ms(pct(&text, 99.0)),
        format!("{TURNS} turns, a new chat each"),
    ));
    eprintln!("bench: attachments done");
    system.close().await;
    Ok(())
}
