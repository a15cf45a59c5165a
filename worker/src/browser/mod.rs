//! The headless browser behind the `browser_*` tools (SPEC W8), with the `browser`
//! cargo feature.
//!
//! - `launch`: starting Chromium as its own process group, registered in the session's
//!   [`Groups`].
//! - `cdp`: CDP commands sent as plain JSON (robust to a newer Chromium).
//! - `snapshot`: the accessibility tree as indented text with `[ref=N]`.
//!
//! **Lifecycle.** Chromium is started by the first browser tool call, with
//! `--user-data-dir=<workspace>/.browser-profile`, and drives one page. After
//! `WORKER_BROWSER_IDLE_MS` without a browser call it is stopped (its process group
//! killed; the profile stays); the next browser call starts it again and reopens the last
//! page. A Chromium that died by itself is restarted the same way. The end of the session
//! kills it with every other process group ([`Groups::kill_all`]), and so does dropping
//! the manager.
//!
//! **Refs.** A snapshot numbers the interactive elements it prints. Numbers are never
//! reused within a worker: each snapshot continues from the last one, so a ref from an
//! older snapshot is recognisably stale instead of silently naming another element. A
//! snapshot replaces the previous refs, a navigation (or a restart) drops them.
//!
//! Calls are serialized (one page); the idle clock runs from the end of the last call.
//! Logs carry classes, counts, pids and durations, never URLs or page text (X4).

pub mod cdp;
pub mod launch;
pub mod snapshot;

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use base64::Engine;
use chromiumoxide::handler::HandlerConfig;
use chromiumoxide::handler::viewport::Viewport;
use chromiumoxide::{Browser as CdpBrowser, Page};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::process::Child;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::BrowserSettings;
use crate::groups::{GroupGuard, Groups};
use launch::LaunchError;
use snapshot::Target;

/// The snapshot text is cut at this many bytes (with a marker).
pub const SNAPSHOT_CAP: usize = 48 * 1024;
/// A CDP command (and a navigation) that takes longer fails.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// After a click, how long the page may take to finish loading before the tool answers.
const SETTLE_LIMIT: Duration = Duration::from_secs(5);
/// The object group of the DOM handles a call resolves (released after the call).
const OBJECT_GROUP: &str = "agent-runtime-worker";

/// A browser tool that ran and failed; the message is for the model.
#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    #[error("{0}")]
    Launch(#[from] LaunchError),
    #[error("{0}")]
    BadUrl(&'static str),
    #[error(
        "ref {0} is not in the latest browser_snapshot (refs last until the next snapshot or \
         navigation); take a new browser_snapshot"
    )]
    StaleRef(u64),
    #[error(
        "ref {0} no longer exists on the page (it changed since the snapshot); take a new \
         browser_snapshot"
    )]
    Gone(u64),
    #[error("ref {0} ({1}) cannot take text")]
    NotEditable(u64, String),
    #[error("navigation failed: {0}")]
    Navigation(String),
    #[error("the browser failed: {0}")]
    Page(String),
}

impl BrowserError {
    pub fn class(&self) -> &'static str {
        match self {
            Self::Launch(err) => err.class(),
            Self::BadUrl(_) => "bad_url",
            Self::StaleRef(_) => "stale_ref",
            Self::Gone(_) => "ref_gone",
            Self::NotEditable(..) => "not_editable",
            Self::Navigation(_) => "navigation_failed",
            Self::Page(_) => "cdp_failed",
        }
    }
}

impl From<chromiumoxide::error::CdpError> for BrowserError {
    fn from(err: chromiumoxide::error::CdpError) -> Self {
        Self::Page(cdp::describe(&err))
    }
}

/// A screenshot taken by `browser_screenshot`.
#[derive(Debug)]
pub struct Screenshot {
    /// `screenshot-<n>.png`, numbered from 1 within the worker.
    pub name: String,
    pub png: Vec<u8>,
    pub url: String,
}

/// The running Chromium.
struct Running {
    /// Kept for its connection; the process is ours (`child`), not chromiumoxide's.
    _browser: CdpBrowser,
    page: Page,
    handler: JoinHandle<()>,
    child: Child,
    pid: u32,
    group: GroupGuard,
}

impl Running {
    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None)) && !self.handler.is_finished()
    }
}

struct State {
    running: Option<Running>,
    /// Counts starts; an idle watcher only stops the start it was made for.
    generation: u64,
    /// The page to reopen after a restart.
    last_url: Option<String>,
    refs: HashMap<u64, Target>,
    next_ref: u64,
    screenshots: u64,
    last_used: Instant,
}

struct Inner {
    settings: BrowserSettings,
    groups: Groups,
    shutdown: CancellationToken,
    state: Mutex<State>,
}

/// The browser of one worker. Cheap to clone.
#[derive(Clone)]
pub struct Browser {
    inner: Arc<Inner>,
}

/// What a page looks like now (for results).
struct PageInfo {
    url: String,
    title: String,
}

fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

impl Browser {
    pub fn new(settings: BrowserSettings, groups: Groups, shutdown: CancellationToken) -> Self {
        Self {
            inner: Arc::new(Inner {
                settings,
                groups,
                shutdown,
                state: Mutex::new(State {
                    running: None,
                    generation: 0,
                    last_url: None,
                    refs: HashMap::new(),
                    next_ref: 1,
                    screenshots: 0,
                    last_used: Instant::now(),
                }),
            }),
        }
    }

    /// Stops Chromium now (the profile stays).
    pub async fn stop(&self, reason: &'static str) {
        let mut state = self.inner.state.lock().await;
        stop(&mut state, reason).await;
    }

    /// `browser_navigate`: opens `url`; the final URL, title and HTTP status.
    pub async fn navigate(&self, url: &str) -> Result<String, BrowserError> {
        check_url(url)?;
        let mut state = self.inner.state.lock().await;
        let result = async {
            self.ensure(&mut state, false).await?;
            state.refs.clear();
            let page = page_of(&state)?;
            let opened = tokio::time::timeout(REQUEST_TIMEOUT, page.goto(url)).await;
            match opened {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => return Err(BrowserError::Navigation(cdp::describe(&err))),
                Err(_) => {
                    return Err(BrowserError::Navigation(format!(
                        "the page did not load within {} s",
                        REQUEST_TIMEOUT.as_secs()
                    )));
                }
            }
            let info = cdp::evaluate(
                &page,
                "({url: location.href, title: document.title, \
                  status: (performance.getEntriesByType('navigation')[0] || {}).responseStatus || 0})",
            )
            .await?;
            let final_url = info["url"].as_str().unwrap_or(url).to_owned();
            state.last_url = Some(final_url.clone());
            let status = match info["status"].as_u64() {
                Some(status) if status > 0 => status.to_string(),
                _ => "unknown".to_owned(),
            };
            Ok(format!(
                "url: {final_url}\ntitle: {}\nstatus: {status}",
                quoted(info["title"].as_str().unwrap_or(""))
            ))
        }
        .await;
        self.used(&mut state);
        result
    }

    /// `browser_snapshot`: the page as text with fresh refs.
    pub async fn snapshot(&self) -> Result<String, BrowserError> {
        let mut state = self.inner.state.lock().await;
        let result = async {
            let note = self.ensure(&mut state, true).await?;
            let page = page_of(&state)?;
            let tree = cdp::call(&page, "Accessibility.getFullAXTree", json!({})).await?;
            let nodes = tree["nodes"].as_array().cloned().unwrap_or_default();
            let snap = snapshot::render(&nodes, state.next_ref, SNAPSHOT_CAP);
            state.next_ref += snap.refs.len() as u64;
            state.refs = snap.refs.into_iter().collect();
            let info = page_info(&page).await;
            if !info.url.is_empty() && info.url != "about:blank" {
                state.last_url = Some(info.url.clone());
            }
            tracing::debug!(
                nodes = nodes.len(),
                refs = state.refs.len(),
                truncated = snap.truncated,
                "snapshot"
            );
            Ok(format!(
                "{note}url: {}\ntitle: {}\n\n{}",
                info.url,
                quoted(&info.title),
                snap.text
            ))
        }
        .await;
        self.used(&mut state);
        result
    }

    /// `browser_click`: clicks the element of `reference`.
    pub async fn click(&self, reference: u64) -> Result<String, BrowserError> {
        let mut state = self.inner.state.lock().await;
        let result = async {
            // A restart drops refs: a ref after one is stale, reported as such.
            self.ensure(&mut state, true).await?;
            let target = state
                .refs
                .get(&reference)
                .cloned()
                .ok_or(BrowserError::StaleRef(reference))?;
            let page = page_of(&state)?;
            let object = resolve(&page, &target, reference).await?;
            let clicked = click_object(&page, &object, reference).await;
            release(&page).await;
            clicked?;
            settle(&page).await;
            let info = page_info(&page).await;
            if !info.url.is_empty() {
                state.last_url = Some(info.url.clone());
            }
            Ok(format!(
                "clicked ref {reference} ({} {})\nurl: {}\ntitle: {}",
                target.role,
                quoted(&target.name),
                info.url,
                quoted(&info.title)
            ))
        }
        .await;
        self.used(&mut state);
        result
    }

    /// `browser_type`: replaces the text of the field of `reference` with `text`.
    pub async fn type_text(&self, reference: u64, text: &str) -> Result<String, BrowserError> {
        let mut state = self.inner.state.lock().await;
        let result = async {
            self.ensure(&mut state, true).await?;
            let target = state
                .refs
                .get(&reference)
                .cloned()
                .ok_or(BrowserError::StaleRef(reference))?;
            let page = page_of(&state)?;
            let object = resolve(&page, &target, reference).await?;
            let typed = type_into(&page, &object, &target, reference, text).await;
            release(&page).await;
            typed?;
            // Never echoes the text: it may be a password.
            Ok(format!(
                "typed {} characters into ref {reference} ({} {})",
                text.chars().count(),
                target.role,
                quoted(&target.name)
            ))
        }
        .await;
        self.used(&mut state);
        result
    }

    /// `browser_screenshot`: a PNG of the visible page.
    pub async fn screenshot(&self) -> Result<Screenshot, BrowserError> {
        let mut state = self.inner.state.lock().await;
        let result = async {
            self.ensure(&mut state, true).await?;
            let page = page_of(&state)?;
            let shot = cdp::call(
                &page,
                "Page.captureScreenshot",
                json!({"format": "png", "captureBeyondViewport": false}),
            )
            .await?;
            let png = shot["data"]
                .as_str()
                .and_then(|data| base64::engine::general_purpose::STANDARD.decode(data).ok())
                .ok_or_else(|| BrowserError::Page("the screenshot had no PNG data".into()))?;
            state.screenshots += 1;
            let info = page_info(&page).await;
            Ok(Screenshot {
                name: format!("screenshot-{}.png", state.screenshots),
                png,
                url: info.url,
            })
        }
        .await;
        self.used(&mut state);
        result
    }

    /// Starts the idle clock again (at the end of every call).
    fn used(&self, state: &mut State) {
        state.last_used = Instant::now();
    }

    /// Makes sure Chromium runs; starts it if not. With `restore`, a fresh start reopens
    /// the last page and the returned note says so (empty otherwise).
    async fn ensure(&self, state: &mut State, restore: bool) -> Result<String, BrowserError> {
        match state
            .running
            .as_mut()
            .map(|running| (running.alive(), running.pid))
        {
            Some((true, _)) => return Ok(String::new()),
            Some((false, pid)) => {
                tracing::warn!(pid, "browser gone; starting it again");
                stop(state, "crashed").await;
            }
            None => {}
        }
        let started = Instant::now();
        let settings = &self.inner.settings;
        let launched = launch::launch(
            settings.chromium.as_deref(),
            &settings.profile_dir,
            settings.proxy.as_deref(),
            &self.inner.groups,
        )
        .await
        .inspect_err(|err| tracing::warn!(class = err.class(), "browser start failed"))?;
        let config = HandlerConfig {
            ignore_https_errors: false,
            viewport: Some(Viewport {
                width: launch::WINDOW.0,
                height: launch::WINDOW.1,
                ..Viewport::default()
            }),
            request_timeout: REQUEST_TIMEOUT,
            ..HandlerConfig::default()
        };
        let (browser, mut handler) =
            CdpBrowser::connect_with_config(launched.ws_url.clone(), config).await?;
        // The handler drives the DevTools socket; it ends when Chromium goes.
        let handler = tokio::spawn(async move {
            while let Some(event) = handler.next().await {
                if event.is_err() {
                    break;
                }
            }
        });
        let page = match browser.new_page("about:blank").await {
            Ok(page) => page,
            Err(err) => {
                handler.abort();
                return Err(err.into());
            }
        };
        state.generation += 1;
        state.refs.clear();
        state.running = Some(Running {
            _browser: browser,
            page: page.clone(),
            handler,
            child: launched.child,
            pid: launched.pid,
            group: launched.group,
        });
        tracing::info!(
            pid = launched.pid,
            start = state.generation,
            ms = started.elapsed().as_millis() as u64,
            "browser started"
        );
        self.watch_idle(state.generation);
        let mut note = String::new();
        if let (true, Some(url)) = (restore, state.last_url.clone()) {
            note = match tokio::time::timeout(REQUEST_TIMEOUT, page.goto(url.as_str())).await {
                Ok(Ok(_)) => format!("(the browser had been stopped; reopened {url})\n"),
                _ => format!("(the browser had been stopped; reopening {url} failed)\n"),
            };
        }
        Ok(note)
    }

    /// Stops Chromium once it has been idle for the configured window.
    fn watch_idle(&self, generation: u64) {
        let inner: Weak<Inner> = Arc::downgrade(&self.inner);
        let idle = self.inner.settings.idle;
        let shutdown = self.inner.shutdown.clone();
        tokio::spawn(async move {
            let mut wait = idle;
            loop {
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = shutdown.cancelled() => return,
                }
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let mut state = inner.state.lock().await;
                if state.generation != generation || state.running.is_none() {
                    return;
                }
                let since = state.last_used.elapsed();
                if since >= idle {
                    stop(&mut state, "idle").await;
                    return;
                }
                wait = idle - since;
            }
        });
    }
}

/// Kills Chromium's process group and reaps it; drops the refs.
async fn stop(state: &mut State, reason: &'static str) {
    state.refs.clear();
    let Some(mut running) = state.running.take() else {
        return;
    };
    running.group.kill();
    running.handler.abort();
    let _ = tokio::time::timeout(Duration::from_secs(2), running.child.wait()).await;
    tracing::info!(pid = running.pid, reason, "browser stopped");
}

fn page_of(state: &State) -> Result<Page, BrowserError> {
    state
        .running
        .as_ref()
        .map(|running| running.page.clone())
        .ok_or_else(|| BrowserError::Page("the browser is not running".into()))
}

/// Only absolute http(s) URLs with a host.
fn check_url(url: &str) -> Result<(), BrowserError> {
    const BAD: BrowserError = BrowserError::BadUrl(
        "only absolute http:// and https:// URLs can be opened (for example https://example.com/)",
    );
    let (scheme, rest) = url.trim().split_once("://").ok_or(BAD)?;
    if !matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https") {
        return Err(BAD);
    }
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = host.rsplit('@').next().unwrap_or_default();
    if host.is_empty() || host.starts_with(':') {
        return Err(BAD);
    }
    Ok(())
}

async fn page_info(page: &Page) -> PageInfo {
    let info = cdp::evaluate(page, "({url: location.href, title: document.title})")
        .await
        .unwrap_or_default();
    PageInfo {
        url: info["url"].as_str().unwrap_or_default().to_owned(),
        title: info["title"].as_str().unwrap_or_default().to_owned(),
    }
}

/// The JS handle of a ref's DOM node.
async fn resolve(page: &Page, target: &Target, reference: u64) -> Result<String, BrowserError> {
    let resolved = cdp::call(
        page,
        "DOM.resolveNode",
        json!({"backendNodeId": target.backend_node_id, "objectGroup": OBJECT_GROUP}),
    )
    .await
    .map_err(|_| BrowserError::Gone(reference))?;
    resolved["object"]["objectId"]
        .as_str()
        .map(str::to_owned)
        .ok_or(BrowserError::Gone(reference))
}

async fn call_on(
    page: &Page,
    object: &str,
    function: &str,
    arguments: Value,
) -> Result<Value, BrowserError> {
    let answer = cdp::call(
        page,
        "Runtime.callFunctionOn",
        json!({
            "objectId": object,
            "functionDeclaration": function,
            "arguments": arguments,
            "returnByValue": true,
            "awaitPromise": false,
        }),
    )
    .await?;
    if let Some(exception) = answer.get("exceptionDetails") {
        let text = exception["exception"]["description"]
            .as_str()
            .or_else(|| exception["text"].as_str())
            .unwrap_or("a script error");
        return Err(BrowserError::Page(
            text.lines().next().unwrap_or_default().to_owned(),
        ));
    }
    Ok(answer["result"]["value"].clone())
}

async fn release(page: &Page) {
    let _ = cdp::call(
        page,
        "Runtime.releaseObjectGroup",
        json!({"objectGroup": OBJECT_GROUP}),
    )
    .await;
}

/// Scrolls the element into view and says where its centre is, whether that point hits
/// it (nothing covers it), and handles `<option>`s (no mouse path in a headless select).
const PREPARE_CLICK: &str = r#"function() {
  if (!this.isConnected) return {gone: true};
  if (this instanceof HTMLOptionElement) {
    const select = this.closest('select');
    this.selected = true;
    if (select) {
      select.dispatchEvent(new Event('input', {bubbles: true}));
      select.dispatchEvent(new Event('change', {bubbles: true}));
    }
    return {done: true};
  }
  if (!(this instanceof Element)) return {gone: true};
  this.scrollIntoView({block: 'center', inline: 'center', behavior: 'instant'});
  const r = this.getBoundingClientRect();
  const x = r.left + r.width / 2, y = r.top + r.height / 2;
  const hit = r.width > 0 && r.height > 0 && (() => {
    const at = document.elementFromPoint(x, y);
    return !!at && (at === this || this.contains(at));
  })();
  return {x, y, hit};
}"#;

async fn click_object(page: &Page, object: &str, reference: u64) -> Result<(), BrowserError> {
    let prepared = call_on(page, object, PREPARE_CLICK, json!([])).await?;
    if prepared["gone"] == true {
        return Err(BrowserError::Gone(reference));
    }
    if prepared["done"] == true {
        return Ok(());
    }
    if prepared["hit"] == true {
        let (x, y) = (
            prepared["x"].as_f64().unwrap_or_default(),
            prepared["y"].as_f64().unwrap_or_default(),
        );
        for (kind, buttons) in [("mouseMoved", 0), ("mousePressed", 1), ("mouseReleased", 0)] {
            let mut event = json!({"type": kind, "x": x, "y": y, "buttons": buttons});
            if kind != "mouseMoved" {
                event["button"] = json!("left");
                event["clickCount"] = json!(1);
            }
            cdp::call(page, "Input.dispatchMouseEvent", event).await?;
        }
    } else {
        // Covered, or without a box: the element's own click.
        call_on(page, object, "function() { this.click(); }", json!([])).await?;
    }
    Ok(())
}

/// Focuses the field and selects its content, so inserted text replaces it. Answers
/// "ok", "gone", or "not editable".
const PREPARE_TYPE: &str = r#"function(clear) {
  if (!this.isConnected) return 'gone';
  if (!(this instanceof Element)) return 'gone';
  this.scrollIntoView({block: 'center', inline: 'center', behavior: 'instant'});
  const field = this instanceof HTMLInputElement || this instanceof HTMLTextAreaElement;
  if (!field && !this.isContentEditable) return 'not editable';
  if (this.disabled || this.readOnly) return 'not editable';
  this.focus();
  const active = document.activeElement;
  if (active !== this && !this.contains(active)) return 'not editable';
  if (field) {
    this.select();
    if (clear || this.selectionStart === null) {
      this.value = '';
      this.dispatchEvent(new Event('input', {bubbles: true}));
    }
  } else {
    const range = document.createRange();
    range.selectNodeContents(this);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    if (clear) {
      document.execCommand('delete');
    }
  }
  return 'ok';
}"#;

async fn type_into(
    page: &Page,
    object: &str,
    target: &Target,
    reference: u64,
    text: &str,
) -> Result<(), BrowserError> {
    let prepared = call_on(
        page,
        object,
        PREPARE_TYPE,
        json!([{"value": text.is_empty()}]),
    )
    .await?;
    match prepared.as_str() {
        Some("ok") => {}
        Some("gone") => return Err(BrowserError::Gone(reference)),
        _ => return Err(BrowserError::NotEditable(reference, target.role.clone())),
    }
    if !text.is_empty() {
        cdp::call(page, "Input.insertText", json!({"text": text})).await?;
    }
    Ok(())
}

/// Waits (a little) for what a click started: a navigation, a load.
async fn settle(page: &Page) {
    let deadline = Instant::now() + SETTLE_LIMIT;
    tokio::time::sleep(Duration::from_millis(100)).await;
    while Instant::now() < deadline {
        let state = tokio::time::timeout(
            Duration::from_secs(1),
            cdp::evaluate(page, "document.readyState"),
        )
        .await;
        if matches!(state, Ok(Ok(ref v)) if v == "complete") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_and_https_urls_are_opened() {
        for good in [
            "http://127.0.0.1:8080/",
            "https://example.com",
            "HTTPS://example.com/a?b#c",
            "http://user@host/",
        ] {
            assert!(check_url(good).is_ok(), "{good}");
        }
        for bad in [
            "file:///etc/passwd",
            "javascript:alert(1)",
            "about:blank",
            "chrome://settings",
            "data:text/html,hi",
            "example.com",
            "http://",
            "http:///path",
            "ftp://example.com/",
        ] {
            assert!(
                matches!(check_url(bad), Err(BrowserError::BadUrl(_))),
                "{bad}"
            );
        }
    }
}
