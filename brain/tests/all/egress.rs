//! Egress secrets and the egress allowlist through the API (W13, W14;
//! docs/design/egress.md): what an admin sets, what the agent shows, and what reaches a
//! real worker's commands.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};

use crate::common::replies::text;
use crate::common::{TestApp, error_code, key_with_scope, light_agent, read_stream};
use crate::workers::{output_of, shell, system};

const KEY_HEX: &str = "5e1f2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";

fn keyed(c: &mut engine::config::Config) {
    c.secrets_key = Some(store::SecretsKey::parse(KEY_HEX).unwrap());
}

async fn put_secret(
    app: &TestApp,
    bearer: &str,
    agent: &str,
    name: &str,
    body: Value,
) -> reqwest::Response {
    app.http
        .put(format!("{}/v1/agents/{agent}/secrets/{name}", app.url))
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn patch_agent(app: &TestApp, agent: &str, body: Value) -> reqwest::Response {
    app.auth(app.http.patch(format!("{}/v1/agents/{agent}", app.url)))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// An error answer's code and message.
async fn refusal(response: reqwest::Response) -> (u16, String, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    let code = body["error"]["code"].as_str().unwrap().to_owned();
    (
        status,
        code,
        body["error"]["message"].as_str().unwrap().to_owned(),
    )
}

/// The allowlist is the agent's, set at create and patch (`null` is every host again),
/// shown on GET, and checked in the domain layer with the field named.
#[tokio::test]
async fn an_agents_egress_allowlist_is_set_shown_checked_and_cleared() {
    let app = TestApp::start().await;
    let created = app
        .post_json(
            "/v1/agents",
            &json!({"name": "out", "system_prompt": "x", "model": "openai/gpt-test",
                    "egress": {"allow": ["api.github.com", "*.pypi.org", "localhost:8080"]}}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let agent: Value = created.json().await.unwrap();
    let id = agent["id"].as_str().unwrap().to_owned();
    let shown: Value = app
        .get(&format!("/v1/agents/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        shown["egress"],
        json!({"allow": ["api.github.com", "*.pypi.org", "localhost:8080"]})
    );

    for bad in [
        json!({"egress": {"allow": ["a b"]}}),
        json!({"egress": {"allow": ["host:0"]}}),
        json!({"egress": {"allow": ["ok.com"], "deny": []}}),
    ] {
        let (status, code, message) = refusal(patch_agent(&app, &id, bad.clone()).await).await;
        assert_eq!((status, code.as_str()), (400, "invalid_request"), "{bad}");
        assert!(message.contains("egress"), "{bad}: {message}");
    }
    let bad_create = app
        .post_json(
            "/v1/agents",
            &json!({"name": "o2", "system_prompt": "x", "model": "openai/gpt-test",
                    "egress": {"allow": ["*."]}}),
        )
        .await;
    let (status, code, message) = refusal(bad_create).await;
    assert_eq!((status, code.as_str()), (400, "invalid_request"));
    assert!(message.starts_with("egress.allow"), "{message}");

    let narrowed: Value = patch_agent(&app, &id, json!({"egress": {"allow": []}}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(narrowed["egress"], json!({"allow": []}));
    // Another field's change leaves the allowlist as it is.
    let other: Value = patch_agent(&app, &id, json!({"system_prompt": "y"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(other["egress"], json!({"allow": []}));
    let cleared: Value = patch_agent(&app, &id, json!({"egress": null}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(cleared["egress"], Value::Null);
}

/// `PUT /v1/agents/{id}/secrets/{name}`: admin only, the name and value rules of
/// `secret_set`, the egress settings checked field by field without quoting the value,
/// 201 for a new name and 204 for a replaced one, 404 for another team's agent.
#[tokio::test]
async fn an_admin_sets_an_agents_secret_with_egress_settings_checked() {
    let app = TestApp::start_with(keyed).await;
    let (agent, _chat) = light_agent(&app).await;
    let egress = json!({"hosts": ["api.github.com"], "header": "Authorization",
                        "format": "Bearer {value}"});
    let good = json!({"value": "ghp_secret1", "egress": egress});
    assert_eq!(
        put_secret(&app, &app.key, &agent, "GH_TOKEN", good.clone())
            .await
            .status(),
        201
    );
    assert_eq!(
        put_secret(&app, &app.key, &agent, "GH_TOKEN", good.clone())
            .await
            .status(),
        204
    );
    assert_eq!(
        put_secret(&app, &app.key, &agent, "PLAIN", json!({"value": "plain-1"}))
            .await
            .status(),
        201
    );

    let bad_cases = [
        ("bad-name", good.clone(), "name"),
        ("HTTPS_PROXY", good.clone(), "reserved"),
        ("K", json!({"value": ""}), "value"),
        (
            "K",
            json!({"value": "v1234", "egress": {"hosts": [], "header": "X"}}),
            "egress.hosts",
        ),
        (
            "K",
            json!({"value": "v1234", "egress": {"hosts": ["a.com"], "header": "X Y"}}),
            "egress.header",
        ),
        (
            "K",
            json!({"value": "v1234", "egress": {"hosts": ["a.com"], "header": "X", "format": "Bearer"}}),
            "egress.format",
        ),
        (
            "K",
            json!({"value": "new\nline-secret", "egress": {"hosts": ["a.com"], "header": "X"}}),
            "value",
        ),
        (
            "K",
            json!({"value": "v1234", "egress": {"hosts": ["a.com"], "header": "X", "port": 1}}),
            "",
        ),
    ];
    for (name, body, names) in bad_cases {
        let (status, code, message) =
            refusal(put_secret(&app, &app.key, &agent, name, body.clone()).await).await;
        assert_eq!((status, code.as_str()), (400, "invalid_request"), "{body}");
        assert!(message.contains(names), "{body}: {message}");
        assert!(!message.contains("line-secret"), "{message}");
    }

    let (member, _) = key_with_scope(&app, "chat").await;
    let as_member = put_secret(&app, &member, &agent, "GH_TOKEN", good.clone()).await;
    assert_eq!(error_code(as_member).await, (403, "forbidden".to_owned()));
    let other = uuid::Uuid::now_v7();
    let unknown = put_secret(&app, &app.key, &other.to_string(), "GH_TOKEN", good).await;
    assert_eq!(error_code(unknown).await, (404, "not_found".to_owned()));

    // The tool's list shows both names, never a value.
    let names: Vec<(String, Option<Value>)> =
        sqlx::query_as("SELECT name, egress FROM secrets WHERE agent_id = $1 ORDER BY name")
            .bind(uuid::Uuid::parse_str(&agent).unwrap())
            .fetch_all(app.store.pool())
            .await
            .unwrap();
    assert_eq!(
        names,
        [
            ("GH_TOKEN".to_owned(), Some(egress)),
            ("PLAIN".to_owned(), None)
        ]
    );
}

/// W13 on a real worker: an egress secret's command environment holds only its
/// placeholder (an ordinary secret its value, masked in output); the value is in no
/// command output, stored message or turn.
#[tokio::test]
async fn an_egress_secret_reaches_a_real_workers_commands_only_as_its_placeholder() {
    let (app, _manager) = system(60_000, keyed).await;
    let (agent, chat) = light_agent(&app).await;
    let secret = format!("ghp_{}", uuid::Uuid::new_v4().simple());
    let egress = json!({"hosts": ["api.github.com"], "header": "Authorization",
                        "format": "Bearer {value}"});
    let put = put_secret(
        &app,
        &app.key,
        &agent,
        "GH_TOKEN",
        json!({"value": secret, "egress": egress}),
    )
    .await;
    assert_eq!(put.status(), 201);
    let plain = format!("plain-{}", uuid::Uuid::new_v4().simple());
    let put = put_secret(
        &app,
        &app.key,
        &agent,
        "PLAIN_TOKEN",
        json!({"value": plain}),
    )
    .await;
    assert_eq!(put.status(), 201);

    app.provider.push(shell(
        "e1",
        "printenv GH_TOKEN | sed s/^egress-placeholder-/held:/; printenv PLAIN_TOKEN | wc -c; env | grep -c ghp_ || true",
    ));
    app.provider.push(text("done"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    app.settled().await;
    let output = output_of(&chunks, "e1");
    assert_eq!(
        output,
        format!(
            "exit code: 0\n--- stdout ---\nheld:GH_TOKEN\n{}\n0\n",
            plain.len() + 1
        ),
        "the egress secret is its placeholder, the ordinary one its value"
    );
    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT row_to_json(m)::text FROM messages m \
         UNION ALL SELECT row_to_json(t)::text FROM turns t",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    let rows = rows.into_iter().map(|(r,)| r).collect::<String>();
    assert!(!rows.contains(&secret) && !rows.contains(&plain));
}
