//! A scripted Telegram Bot API server. A chat platform cannot run here, so this double
//! speaks the Bot API's exact wire (`POST /bot<token>/<method>` with a JSON body, answered
//! `{"ok":true,"result":…}` or `{"ok":false,"error_code":…,"description":…}`), records
//! every call, and fails or holds `sendMessage` on demand. A message counts as sent only
//! when it is answered `ok`: a request held (the test kills its client meanwhile) is
//! never taken, as with a connection that broke before the platform had the message.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Notify;

/// One call the server answered.
#[derive(Clone, Debug)]
pub struct Call {
    pub token: String,
    pub method: String,
    pub body: Value,
}

#[derive(Default)]
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
    script: Arc<Mutex<Script>>,
    changed: Arc<Notify>,
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
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, shared }
    }

    pub fn fail_sends(&self, times: usize) {
        self.shared.script.lock().unwrap().fail_sends = times;
    }

    pub fn hold_sends(&self, hold: bool) {
        self.shared.script.lock().unwrap().hold_sends = hold;
        if !hold {
            self.shared.released.notify_waiters();
        }
    }

    pub fn calls(&self, method: &str) -> Vec<Call> {
        let script = self.shared.script.lock().unwrap();
        script
            .calls
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    /// Waits (at most `within`) until `ready` holds of the script's calls and held count.
    pub async fn wait_until(&self, within: Duration, ready: impl Fn(&[Call], usize) -> bool) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let changed = self.shared.changed.notified();
            {
                let script = self.shared.script.lock().unwrap();
                if ready(&script.calls, script.held) {
                    return;
                }
            }
            tokio::select! {
                // Something was recorded: look again.
                () = changed => {}
                // Never waits longer than the caller allows.
                () = tokio::time::sleep_until(deadline) => {
                    let script = self.shared.script.lock().unwrap();
                    panic!("the Telegram double never saw what the test waits for: {:?}", script.calls);
                }
            }
        }
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
            let mut script = shared.script.lock().unwrap();
            let fail = script.fail_sends > 0;
            if fail {
                script.fail_sends -= 1;
            }
            (fail, script.hold_sends && !fail)
        };
        if fail {
            shared.changed.notify_waiters();
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(
                    json!({"ok": false, "error_code": 500, "description": "Internal Server Error"}),
                ),
            );
        }
        if hold {
            let released = shared.released.notified();
            shared.script.lock().unwrap().held += 1;
            shared.changed.notify_waiters();
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
    shared.script.lock().unwrap().calls.push(Call {
        token,
        method,
        body,
    });
    shared.changed.notify_waiters();
    (StatusCode::OK, Json(json!({"ok": true, "result": result})))
}
