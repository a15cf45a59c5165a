//! CDP commands sent as plain JSON.
//!
//! chromiumoxide's generated types follow one protocol revision; a newer Chromium adds
//! enum values (AX property names, value types) that would fail to decode. The commands
//! whose answers the browser tools read are therefore sent as [`Raw`] and read as
//! `serde_json::Value`, field by field.

use chromiumoxide::Page;
use chromiumoxide::error::CdpError;
use chromiumoxide::types::{Command, Method, MethodId};
use serde::Serialize;
use serde_json::Value;

/// One CDP method with JSON params; the answer is the JSON `result`.
#[derive(Debug, Clone)]
pub struct Raw {
    pub method: &'static str,
    pub params: Value,
}

impl Serialize for Raw {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.params.serialize(serializer)
    }
}

impl Method for Raw {
    fn identifier(&self) -> MethodId {
        self.method.into()
    }
}

impl Command for Raw {
    type Response = Value;
}

/// Sends `method` with `params` to the page's target.
pub async fn call(page: &Page, method: &'static str, params: Value) -> Result<Value, CdpError> {
    Ok(page.execute(Raw { method, params }).await?.result)
}

/// Evaluates `expression` in the page and returns its value (`returnByValue`).
pub async fn evaluate(page: &Page, expression: &str) -> Result<Value, CdpError> {
    let result = call(
        page,
        "Runtime.evaluate",
        serde_json::json!({"expression": expression, "returnByValue": true}),
    )
    .await?;
    Ok(result["result"]["value"].clone())
}

/// A short, model-readable account of a CDP failure (no page content).
pub fn describe(err: &CdpError) -> String {
    match err {
        CdpError::Chrome(err) => err.message.clone(),
        CdpError::ChromeMessage(message) => message.clone(),
        CdpError::Timeout => "the browser did not answer in time".into(),
        CdpError::Ws(_) | CdpError::ChannelSendError(_) | CdpError::NoResponse => {
            "the browser connection was lost".into()
        }
        other => other.to_string(),
    }
}
