//! A scripted Telegram Bot API server. A chat platform cannot run here, so this double
//! speaks the Bot API's exact wire (`POST /bot<token>/<method>` with a JSON body, answered
//! `{"ok":true,"result":…}` or `{"ok":false,"error_code":…,"description":…}`), records
//! every call, and fails or holds `sendMessage` on demand. A message counts as sent only
//! when it is answered `ok`: a request held (the test kills its client meanwhile) is
//! never taken, as with a connection that broke before the platform had the message.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Notify;

pub use super::platform::Call;
use super::platform::Recorder;

#[derive(Debug, Default)]
struct Script {
    calls: Vec<Call>,
    /// `sendMessage` answers `500` this many more times.
    fail_sends: usize,
    /// `sendMessage` requests wait for [`ScriptedTelegram::release`] before they are taken.
    hold_sends: bool,
    /// `sendMessage` requests that arrived and wait.
    held: usize,
}

#[derive(Clone, Default)]
struct Shared {
    recorder: Recorder<Script>,
    released: Arc<Notify>,
}

pub struct ScriptedTelegram {
    pub url: String,
    shared: Shared,
}

impl ScriptedTelegram {
    pub async fn start() -> Self {
        let shared = Shared::default();
        let app = axum::Router::new()
            .route("/{bot}/{method}", axum::routing::post(answer))
            .with_state(shared.clone());
        let url = Recorder::<Script>::serve(app).await;
        Self { url, shared }
    }

    pub fn fail_sends(&self, times: usize) {
        self.shared.recorder.script.lock().unwrap().fail_sends = times;
    }

    pub fn hold_sends(&self, hold: bool) {
        self.shared.recorder.script.lock().unwrap().hold_sends = hold;
        if !hold {
            self.shared.released.notify_waiters();
        }
    }

    pub fn calls(&self, method: &str) -> Vec<Call> {
        let script = self.shared.recorder.script.lock().unwrap();
        Recorder::<Script>::of(&script.calls, method)
    }

    /// Waits (at most `within`) until `ready` holds of the script's calls and held count.
    pub async fn wait_until(&self, within: Duration, ready: impl Fn(&[Call], usize) -> bool) {
        let ready = |script: &Script| ready(&script.calls, script.held);
        self.shared
            .recorder
            .wait_until("Telegram", within, ready)
            .await;
    }

    /// The secret the brain gave `setWebhook`, which Telegram sends with every update.
    pub fn secret_token(&self) -> String {
        let calls = self.calls("setWebhook");
        calls.last().unwrap().body["secret_token"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

async fn answer(
    State(shared): State<Shared>,
    Path((bot, method)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let Some(token) = bot.strip_prefix("bot").map(str::to_owned) else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"ok": false, "error_code": 404, "description": "Not Found"})),
        );
    };
    if method == "sendMessage" {
        let (fail, hold) = {
            let mut script = shared.recorder.script.lock().unwrap();
            let fail = script.fail_sends > 0;
            if fail {
                script.fail_sends -= 1;
            }
            (fail, script.hold_sends && !fail)
        };
        if fail {
            shared.recorder.changed.notify_waiters();
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(
                    json!({"ok": false, "error_code": 500, "description": "Internal Server Error"}),
                ),
            );
        }
        if hold {
            let released = shared.released.notified();
            shared.recorder.script.lock().unwrap().held += 1;
            shared.recorder.changed.notify_waiters();
            released.await;
            // A held request is never taken: its client (killed meanwhile) saw no answer,
            // as when the connection to the platform broke before the platform had it.
            return (
                StatusCode::BAD_GATEWAY,
                Json(json!({"ok": false, "error_code": 502, "description": "Bad Gateway"})),
            );
        }
    }
    let result = match method.as_str() {
        "sendMessage" => {
            json!({"message_id": 1, "date": 0, "chat": {"id": body["chat_id"]}, "text": body["text"]})
        }
        _ => json!(true),
    };
    shared.recorder.script.lock().unwrap().calls.push(Call {
        token,
        method,
        body,
        at: Instant::now(),
    });
    shared.recorder.changed.notify_waiters();
    (StatusCode::OK, Json(json!({"ok": true, "result": result})))
}
