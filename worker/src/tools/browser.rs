//! The `browser_*` tools (profile `browser`, cargo feature `browser`): thin handlers over
//! [`crate::browser::Browser`] with the argument types of `channel::catalog`.
//!
//! `browser_screenshot` answers like `upload_artifact`: an embedded resource with a
//! base64 PNG `blob`, `mimeType` `image/png` and `uri` `browser:///screenshot-<n>.png`,
//! then a text line. The brain stores the blob as an artifact and answers the model with
//! its id.

use std::time::Instant;

use base64::Engine;
use channel::catalog::{
    self, BrowserClickArgs, BrowserNavigateArgs, BrowserScreenshotArgs, BrowserSnapshotArgs,
    BrowserTypeArgs,
};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};

use super::{Worker, describe, error, text};
use crate::browser::{Browser, BrowserError};

/// The URI scheme of screenshots.
pub const SCREENSHOT_URI_PREFIX: &str = "browser:///";

impl Worker {
    /// Runs one browser call: stops when the brain cancels it or its channel ends, logs
    /// the outcome class, maps errors to `isError` results.
    async fn browser_call<F, Fut>(
        &self,
        tool: &'static str,
        context: &RequestContext<RoleServer>,
        run: F,
    ) -> CallToolResult
    where
        F: FnOnce(Browser) -> Fut,
        Fut: Future<Output = Result<CallToolResult, BrowserError>>,
    {
        let call = self.call_id();
        let started = Instant::now();
        let Some(browser) = self.shared.browser.clone() else {
            tracing::info!(call, tool, outcome = "not_served", "tool call");
            return error("this worker does not serve the browser tools");
        };
        let channel = self.channel.clone();
        let result = tokio::select! {
            result = run(browser) => result,
            () = context.ct.cancelled() => {
                tracing::info!(call, tool, outcome = "cancelled", "tool call");
                return error("cancelled");
            }
            () = channel.cancelled() => {
                return error("the channel ended");
            }
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(err) => err.class(),
        };
        tracing::info!(
            call,
            tool,
            outcome,
            ms = started.elapsed().as_millis() as u64,
            "tool call"
        );
        result.unwrap_or_else(|err| error(err.to_string()))
    }
}

#[tool_router(router = browser_router, vis = "pub(super)")]
impl Worker {
    #[tool(
        description = describe(catalog::BROWSER_NAVIGATE),
        annotations(open_world_hint = true)
    )]
    async fn browser_navigate(
        &self,
        Parameters(args): Parameters<BrowserNavigateArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        self.browser_call("browser_navigate", &context, |browser| async move {
            browser.navigate(&args.url).await.map(text)
        })
        .await
    }

    #[tool(
        description = describe(catalog::BROWSER_SNAPSHOT),
        annotations(read_only_hint = true)
    )]
    async fn browser_snapshot(
        &self,
        Parameters(_args): Parameters<BrowserSnapshotArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        self.browser_call("browser_snapshot", &context, |browser| async move {
            browser.snapshot().await.map(text)
        })
        .await
    }

    #[tool(description = describe(catalog::BROWSER_CLICK))]
    async fn browser_click(
        &self,
        Parameters(args): Parameters<BrowserClickArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        self.browser_call("browser_click", &context, |browser| async move {
            browser.click(args.element).await.map(text)
        })
        .await
    }

    #[tool(description = describe(catalog::BROWSER_TYPE))]
    async fn browser_type(
        &self,
        Parameters(args): Parameters<BrowserTypeArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        self.browser_call("browser_type", &context, |browser| async move {
            browser.type_text(args.element, &args.text).await.map(text)
        })
        .await
    }

    #[tool(description = describe(catalog::BROWSER_SCREENSHOT))]
    async fn browser_screenshot(
        &self,
        Parameters(_args): Parameters<BrowserScreenshotArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        self.browser_call("browser_screenshot", &context, |browser| async move {
            let shot = browser.screenshot().await?;
            let blob = base64::engine::general_purpose::STANDARD.encode(&shot.png);
            let resource =
                ResourceContents::blob(blob, format!("{SCREENSHOT_URI_PREFIX}{}", shot.name))
                    .with_mime_type("image/png");
            Ok(CallToolResult::success(vec![
                ContentBlock::resource(resource),
                ContentBlock::text(format!(
                    "{} ({} bytes, image/png) of {}",
                    shot.name,
                    shot.png.len(),
                    shot.url
                )),
            ]))
        })
        .await
    }
}
