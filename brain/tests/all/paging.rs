//! L3: the listings page with `limit` and an opaque `cursor`, keyset pages that rows
//! inserted meanwhile neither repeat nor shift, and a cursor works in its own listing only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};

use crate::common::{TestApp, error_code};

/// Every row of `path`'s `field`, a page of `limit` at a time, following `next_cursor`;
/// `between` runs after each page but the last (to insert rows meanwhile).
async fn all_pages(
    app: &TestApp,
    path: &str,
    field: &str,
    limit: u32,
    mut between: impl AsyncFnMut(),
) -> Vec<Value> {
    let mut rows = Vec::new();
    let mut cursor: Option<String> = None;
    let sep = if path.contains('?') { '&' } else { '?' };
    for _ in 0..100 {
        let url = match &cursor {
            Some(c) => format!("{path}{sep}limit={limit}&cursor={c}"),
            None => format!("{path}{sep}limit={limit}"),
        };
        let response = app.get(&url).await;
        assert_eq!(response.status(), 200, "{url}");
        let page: Value = response.json().await.unwrap();
        let got = page[field].as_array().unwrap();
        assert!(got.len() <= limit as usize, "{page}");
        rows.extend(got.iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => {
                cursor = Some(next.to_owned());
                between().await;
            }
            None => return rows,
        }
    }
    panic!("{path} never reached its last page");
}

async fn new_agent(app: &TestApp, name: &str) -> String {
    let created = app
        .post_json(
            "/v1/agents",
            &json!({"name": name, "system_prompt": "Be brief.", "model": "openai/gpt-test"}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    created["id"].as_str().unwrap().to_owned()
}

fn names(rows: &[Value]) -> Vec<&str> {
    rows.iter().map(|r| r["name"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn agents_page_newest_first_and_an_agent_made_meanwhile_shifts_nothing() {
    let app = TestApp::start().await;
    for name in ["a1", "a2", "a3", "a4", "a5"] {
        new_agent(&app, name).await;
    }
    let mut made = 0;
    let listed = all_pages(&app, "/v1/agents", "agents", 2, async || {
        made += 1;
        new_agent(&app, &format!("late{made}")).await;
    })
    .await;
    assert_eq!(names(&listed), ["a5", "a4", "a3", "a2", "a1"]);
    assert_eq!(made, 2);

    let first: Value = app.get("/v1/agents?limit=1").await.json().await.unwrap();
    let cursor = first["next_cursor"].as_str().unwrap();
    let agent = first["agents"][0]["id"].as_str().unwrap();
    // A cursor of the agents is no cursor of an agent's chats, and a made-up one is refused.
    for path in [
        format!("/v1/agents/{agent}/chats?cursor={cursor}"),
        "/v1/agents?cursor=bm90LWEtY3Vyc29y".to_owned(),
        "/v1/agents?limit=0".to_owned(),
    ] {
        assert_eq!(
            error_code(app.get(&path).await).await,
            (400, "invalid_request".into()),
            "{path}"
        );
    }
}

#[tokio::test]
async fn chats_and_keys_page_in_their_own_orders() {
    let app = TestApp::start().await;
    let agent = new_agent(&app, "pager").await;
    let mut made = Vec::new();
    for _ in 0..5 {
        made.push(app.new_chat(&agent).await);
    }
    let listed = all_pages(
        &app,
        &format!("/v1/agents/{agent}/chats"),
        "chats",
        2,
        async || {
            app.new_chat(&agent).await;
        },
    )
    .await;
    let ids: Vec<&str> = listed.iter().map(|c| c["id"].as_str().unwrap()).collect();
    made.reverse();
    assert_eq!(ids, made, "newest first, the five made before the listing");

    for name in ["k1", "k2"] {
        let created = app
            .post_json("/v1/keys", &json!({"name": name, "scope": "chat"}))
            .await;
        assert_eq!(created.status(), 201);
    }
    let keys = all_pages(&app, "/v1/keys", "keys", 1, async || {}).await;
    assert_eq!(names(&keys), ["bootstrap", "k1", "k2"], "oldest first");
}
