//! A scripted Slack Web API server. A chat platform cannot run here, so this double speaks
//! the Web API's exact wire (`POST /api/<method>` with a bearer token and a JSON body,
//! answered `200 {"ok":true,…}` or `200 {"ok":false,"error":…}`), records every call, and
//! fails `chat.postMessage` on demand. The events Slack would send are made by the tests
//! themselves, signed with the v0 algorithm Slack documents ([`sign`]).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

pub use super::platform::Call;
use super::platform::Recorder;

#[derive(Debug, Default)]
struct Script {
    calls: Vec<Call>,
    /// The reply's next sends (`chat.postMessage`, or `chat.update` of the progress message
    /// it replaces) answer `500` this many more times; a progress message's own are
    /// answered, so a test fails the reply whether or not the turn ran long enough to show
    /// progress.
    fail_posts: usize,
    /// Messages posted so far, for their `ts`.
    posted: u64,
}

type Shared = Recorder<Script>;

pub struct ScriptedSlack {
    pub url: String,
    shared: Shared,
}

impl ScriptedSlack {
    pub async fn start() -> Self {
        let shared = Shared::default();
        let app = axum::Router::new()
            .route("/api/{method}", axum::routing::post(answer))
            .with_state(shared.clone());
        let url = Shared::serve(app).await;
        Self { url, shared }
    }

    pub fn fail_posts(&self, times: usize) {
        self.shared.script.lock().unwrap().fail_posts = times;
    }

    pub fn calls(&self, method: &str) -> Vec<Call> {
        Shared::of(&self.shared.script.lock().unwrap().calls, method)
    }

    /// What [`shown`] says of the calls so far.
    pub fn shown(&self) -> Vec<Value> {
        shown(&self.shared.script.lock().unwrap().calls)
    }

    /// Waits (at most `within`) until `ready` holds of the calls answered.
    pub async fn wait_until(&self, within: Duration, ready: impl Fn(&[Call]) -> bool) {
        let ready = |script: &Script| ready(&script.calls);
        self.shared.wait_until("Slack", within, ready).await;
    }
}

/// The messages a person sees in the conversations at the end of `calls`: each
/// `chat.postMessage` body in the order posted, its `text` (and `blocks`) replaced by the
/// last `chat.update` of its `ts`. A turn that runs past a second shows its answer in a
/// progress message the reply's first part then replaces (P15), so what a test asserts of
/// a reply is what is shown, however the brain got it there.
pub fn shown(calls: &[Call]) -> Vec<Value> {
    let mut messages: Vec<(String, Value)> = Vec::new();
    for call in calls {
        match call.method.as_str() {
            // Only answered posts are recorded, so the n-th is the one given `ts` n.
            "chat.postMessage" => {
                let ts = format!("900.{:06}", messages.len() + 1);
                messages.push((ts, call.body.clone()));
            }
            "chat.update" => {
                let ts = call.body["ts"].as_str().unwrap_or_default();
                if let Some((_, body)) = messages.iter_mut().find(|(t, _)| t == ts) {
                    body["text"] = call.body["text"].clone();
                    match call.body.get("blocks") {
                        Some(blocks) => body["blocks"] = blocks.clone(),
                        None => _ = body.as_object_mut().map(|b| b.remove("blocks")),
                    }
                }
            }
            _ => {}
        }
    }
    messages.into_iter().map(|(_, body)| body).collect()
}

/// How many of the [`shown`] messages are settled: not a progress message still streaming.
pub fn settled(calls: &[Call]) -> usize {
    shown(calls).iter().filter(|m| !streaming(m)).count()
}

/// A progress message's text while the answer streams ends in ` …` (P15).
fn streaming(body: &Value) -> bool {
    body["text"].as_str().unwrap_or_default().ends_with(" …")
}

/// Slack's `X-Slack-Signature` of `body` sent at `timestamp`: `v0=` and the hex of
/// HMAC-SHA256 under the signing secret of `v0:{timestamp}:{body}`.
pub fn sign(signing_secret: &str, timestamp: i64, body: &[u8]) -> String {
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, signing_secret.as_bytes());
    let mut context = aws_lc_rs::hmac::Context::with_key(&key);
    context.update(format!("v0:{timestamp}:").as_bytes());
    context.update(body);
    let mut out = String::from("v0=");
    for byte in context.sign().as_ref() {
        write!(out, "{byte:02x}").unwrap();
    }
    out
}

async fn answer(
    State(shared): State<Shared>,
    Path(method): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let Some(token) = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
    else {
        return (
            StatusCode::OK,
            Json(json!({"ok": false, "error": "not_authed"})),
        );
    };
    let mut script = shared.script.lock().unwrap();
    let result = match method.as_str() {
        "auth.test" => json!({"ok": true, "user_id": "UBOT", "bot_id": "BBOT", "team_id": "T1"}),
        "chat.postMessage" | "chat.update" if script.fail_posts > 0 && !streaming(&body) => {
            script.fail_posts -= 1;
            drop(script);
            shared.changed.notify_waiters();
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"ok": false, "error": "internal_error"})),
            );
        }
        "chat.postMessage" => {
            script.posted += 1;
            let ts = format!("900.{:06}", script.posted);
            json!({"ok": true, "channel": body["channel"], "ts": ts,
                   "message": {"text": body["text"], "ts": ts}})
        }
        "chat.update" => json!({"ok": true, "channel": body["channel"], "ts": body["ts"]}),
        "chat.postEphemeral" => json!({"ok": true, "message_ts": "901.000001"}),
        _ => json!({"ok": false, "error": "unknown_method"}),
    };
    script.calls.push(Call {
        token,
        method,
        body,
        at: Instant::now(),
    });
    drop(script);
    shared.changed.notify_waiters();
    (StatusCode::OK, Json(result))
}
