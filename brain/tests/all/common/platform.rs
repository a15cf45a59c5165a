//! What the scripted chat platforms (`telegram.rs`, `slack.rs`) share: each call they
//! answered recorded with when it came, and a wait on what was recorded. A chat platform
//! cannot run here; these doubles speak each platform's wire, this is their bookkeeping.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Notify;

/// One call a double answered, and when it arrived.
#[derive(Clone, Debug)]
pub struct Call {
    pub token: String,
    pub method: String,
    pub body: Value,
    pub at: Instant,
}

/// A double's script `S` (its calls and what it is told to do), and the signal each
/// recorded change sends.
pub struct Recorder<S> {
    pub script: Arc<Mutex<S>>,
    pub changed: Arc<Notify>,
}

impl<S> Clone for Recorder<S> {
    fn clone(&self) -> Self {
        Self {
            script: self.script.clone(),
            changed: self.changed.clone(),
        }
    }
}

impl<S: Default> Default for Recorder<S> {
    fn default() -> Self {
        Self {
            script: Arc::default(),
            changed: Arc::default(),
        }
    }
}

impl<S: std::fmt::Debug> Recorder<S> {
    /// Serves `app` on a port of its own: its URL.
    pub async fn serve(app: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    /// The calls of `method` among `calls`.
    pub fn of(calls: &[Call], method: &str) -> Vec<Call> {
        calls
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    /// Waits (at most `within`) until `ready` holds of the script; `platform` names the
    /// double in the failure.
    pub async fn wait_until(&self, platform: &str, within: Duration, ready: impl Fn(&S) -> bool) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let changed = self.changed.notified();
            if ready(&self.script.lock().unwrap()) {
                return;
            }
            tokio::select! {
                // Something was recorded: look again.
                () = changed => {}
                // Never waits longer than the caller allows.
                () = tokio::time::sleep_until(deadline) => {
                    let script = self.script.lock().unwrap();
                    panic!("the {platform} double never saw what the test waits for: {script:?}");
                }
            }
        }
    }
}
