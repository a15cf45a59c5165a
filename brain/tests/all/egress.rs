//! Egress secrets and the egress allowlist through the API (W13, W14;
//! docs/design/egress.md): what an admin sets, what the agent shows, and what reaches a
//! real worker's commands.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};

use crate::common::replies::text;
use crate::common::{TestApp, error_code, key_with_scope, light_agent, read_stream};
use crate::workers::{output_of, shell};

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
    // The manager unseals the egress secret for the session's proxy.
    let (app, _manager) =
        crate::workers::system_with(None, &[("BRAIN_SECRETS_KEY", KEY_HEX)], keyed).await;
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

/// A worker session row of `agent`'s `chat`, as the runtime-manager writes it.
async fn session_row(app: &TestApp, agent: &str, chat: &str) -> uuid::Uuid {
    let session = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO agent_runtime_sessions (id, team_id, agent_id, chat_id, profile, state) \
         VALUES ($1, $2, $3, $4, 'light', 'ready')",
    )
    .bind(session)
    .bind(app.team.0)
    .bind(uuid::Uuid::parse_str(agent).unwrap())
    .bind(uuid::Uuid::parse_str(chat).unwrap())
    .execute(app.store.pool())
    .await
    .unwrap();
    session
}

/// W15 at the store and the API: the ledger keeps a session's first 10,000 requests in
/// order and counts the rest (dropped by the proxy included); the listing pages through
/// them, and another session id is 404.
#[tokio::test]
async fn a_sessions_egress_ledger_is_kept_up_to_its_bound_and_listed_in_pages() {
    let app = TestApp::start().await;
    let (agent, chat) = light_agent(&app).await;
    let session = session_row(&app, &agent, &chat).await;
    let request = |i: usize| store::EgressRequest {
        id: 0,
        host: format!("h{i}.example"),
        port: 443,
        method: if i.is_multiple_of(2) {
            "CONNECT"
        } else {
            "GET"
        }
        .to_owned(),
        status: if i == 1 { 403 } else { 200 },
        refused: (i == 1).then(|| "host_not_allowed".to_owned()),
        bytes_sent: i as u64,
        bytes_received: 2 * i as u64,
        tls_ended: i == 2,
        at: chrono::Utc::now(),
    };
    let first: Vec<_> = (0..3).map(request).collect();
    let stored = app
        .store
        .append_egress_requests(protocol::SessionId(session), &first, 0)
        .await
        .unwrap();
    assert_eq!(stored, 3);
    let rest: Vec<_> = (3..=store::MAX_EGRESS_REQUESTS as usize)
        .map(request)
        .collect();
    let stored = app
        .store
        .append_egress_requests(protocol::SessionId(session), &rest, 2)
        .await
        .unwrap();
    assert_eq!(stored, store::MAX_EGRESS_REQUESTS as u64 - 3);

    let page: Value = app
        .get(&format!("/v1/sessions/{session}/egress?limit=2"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        page["not_kept"], 3,
        "one past the bound and two the proxy dropped"
    );
    let hosts = |page: &Value| -> Vec<String> {
        page["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["host"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(hosts(&page), ["h0.example", "h1.example"]);
    let refused = &page["requests"][1];
    assert_eq!(
        (refused["status"].clone(), refused["refused"].clone()),
        (json!(403), json!("host_not_allowed"))
    );
    assert_eq!(page["requests"][0].get("refused"), None);
    let cursor = page["next_cursor"].as_str().unwrap();
    let next: Value = app
        .get(&format!(
            "/v1/sessions/{session}/egress?limit=2&cursor={cursor}"
        ))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(hosts(&next), ["h2.example", "h3.example"]);
    assert_eq!(next["requests"][0]["tls_ended"], true);
    assert_eq!(next["requests"][1]["bytes_received"], 6);

    let unknown = app
        .get(&format!("/v1/sessions/{}/egress", uuid::Uuid::now_v7()))
        .await;
    assert_eq!(error_code(unknown).await, (404, "not_found".to_owned()));
    let bad_cursor = app
        .get(&format!("/v1/sessions/{session}/egress?cursor=nope"))
        .await;
    assert_eq!(
        error_code(bad_cursor).await,
        (400, "invalid_request".to_owned())
    );
}

/// A real HTTP (or, with a certificate and key, HTTPS) server on loopback, Python's: it
/// prints the `Authorization` header of every request it receives and answers `hello from
/// upstream`. Its port, and its output to read the headers from.
async fn upstream(
    tls: Option<(&std::path::Path, &std::path::Path)>,
) -> (
    u16,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    tokio::process::Child,
) {
    use tokio::io::AsyncBufReadExt;
    const SERVER: &str = r#"
import http.server, ssl, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("AUTH " + (self.headers.get("Authorization") or "-"), flush=True)
        body = b"hello from upstream\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
if len(sys.argv) > 2:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(sys.argv[1], sys.argv[2])
    server.socket = context.wrap_socket(server.socket, server_side=True)
print("PORT", server.server_address[1], flush=True)
server.serve_forever()
"#;
    let mut command = tokio::process::Command::new("python3");
    command.args(["-c", SERVER]);
    if let Some((cert, key)) = tls {
        command.arg(cert).arg(key);
    }
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let port = first.strip_prefix("PORT ").unwrap().parse().unwrap();
    (port, lines, child)
}

/// The next `Authorization` an upstream printed, within 20 s.
async fn next_auth(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) -> String {
    let line = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .expect("the upstream received a request")
        .unwrap()
        .unwrap();
    line.strip_prefix("AUTH ").unwrap().to_owned()
}

/// The Done-when of W13/W14 on a real worker of the local launcher, confined: its
/// commands reach real HTTP and HTTPS upstreams on loopback only through the session's
/// egress proxy, which sets the credential (the HTTPS one with the session CA the worker
/// put in their trust store, the upstream verified against the test CA); a host off the
/// allowlist is refused with the reason in the command's output; `--noproxy` and a raw
/// socket reach nothing; no command's environment or output, no stored message or turn
/// holds the value; and the session's ledger lists the requests (W15).
#[tokio::test]
async fn a_confined_workers_commands_reach_only_through_the_proxy_which_sets_the_credential() {
    let certs = crate::common::manager::TempDir::new();
    test_support::tls::certificates(&certs.0);
    let (http_port, mut http_seen, _http) = upstream(None).await;
    let (https_port, mut https_seen, _https) = upstream(Some((
        &certs.0.join("server.pem"),
        &certs.0.join("server.key"),
    )))
    .await;
    let roots = certs.0.join("ca.pem");
    let roots = roots.to_str().unwrap();
    let (app, _manager) = crate::workers::system_with(
        None,
        &[
            ("BRAIN_SECRETS_KEY", KEY_HEX),
            ("EGRESS_ALLOW_PRIVATE_NETWORKS", "true"),
            ("EGRESS_EXTRA_ROOTS", roots),
        ],
        keyed,
    )
    .await;
    let (agent, chat) = light_agent(&app).await;
    let allowed = json!({"egress": {"allow": [format!("127.0.0.1:{http_port}")]}});
    assert_eq!(patch_agent(&app, &agent, allowed).await.status(), 200);
    let secret = format!("ghp_{}", uuid::Uuid::new_v4().simple());
    let egress = json!({"hosts": [format!("127.0.0.1:{http_port}"), format!("127.0.0.1:{https_port}")],
                        "header": "Authorization", "format": "Bearer {value}"});
    let put = put_secret(
        &app,
        &app.key,
        &agent,
        "GH_TOKEN",
        json!({"value": secret, "egress": egress}),
    )
    .await;
    assert_eq!(put.status(), 201);

    let script = format!(
        "echo '--- http'; curl -sS --max-time 20 http://127.0.0.1:{http_port}/plain; \
         echo '--- https'; curl -sS --max-time 20 https://127.0.0.1:{https_port}/tls; \
         echo '--- refused'; curl -sS --max-time 20 -w ' status=%{{http_code}}' http://blocked.example/; echo; \
         echo '--- noproxy'; curl -sS --max-time 5 --noproxy '*' http://127.0.0.1:{http_port}/ && echo NOPROXY-REACHED; \
         echo '--- raw'; bash -c 'echo > /dev/tcp/127.0.0.1/{http_port}' && echo RAW-REACHED; \
         echo '--- env'; env | grep -c ghp_; test -s \"$SSL_CERT_FILE\" && echo ca-bundle; true"
    );
    app.provider.push(shell("e1", &script));
    app.provider.push(text("done"));
    let (chunks, _) = read_stream(app.send(&chat, &json!({"content": "go"})).await).await;
    app.settled().await;
    let output = output_of(&chunks, "e1");
    assert!(!output.contains(&secret), "{output}");
    assert_eq!(output.matches("hello from upstream").count(), 2, "{output}");
    assert!(
        output.contains("blocked.example:80 is not on this agent's egress allowlist")
            && output.contains("status=403"),
        "{output}"
    );
    for escaped in ["NOPROXY-REACHED", "RAW-REACHED"] {
        assert!(!output.contains(escaped), "{output}");
    }
    assert!(output.contains("--- env\n0\nca-bundle"), "{output}");
    let bearer = format!("Bearer {secret}");
    assert_eq!(next_auth(&mut http_seen).await, bearer);
    assert_eq!(next_auth(&mut https_seen).await, bearer);

    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT row_to_json(m)::text FROM messages m \
         UNION ALL SELECT row_to_json(t)::text FROM turns t",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    assert!(!rows.into_iter().any(|(r,)| r.contains(&secret)));

    // The ledger is written every two seconds: wait for the three requests.
    let (session,): (uuid::Uuid,) =
        sqlx::query_as("SELECT id FROM agent_runtime_sessions WHERE chat_id = $1")
            .bind(uuid::Uuid::parse_str(&chat).unwrap())
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let requests = loop {
        let page: Value = app
            .get(&format!("/v1/sessions/{session}/egress"))
            .await
            .json()
            .await
            .unwrap();
        let requests = page["requests"].as_array().unwrap().clone();
        if requests.len() >= 3 || std::time::Instant::now() > deadline {
            break requests;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let summary: Vec<(String, u64, String, u64, bool)> = requests
        .iter()
        .map(|r| {
            (
                r["host"].as_str().unwrap().to_owned(),
                r["port"].as_u64().unwrap(),
                r["method"].as_str().unwrap().to_owned(),
                r["status"].as_u64().unwrap(),
                r["tls_ended"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "127.0.0.1".to_owned(),
                u64::from(http_port),
                "GET".to_owned(),
                200,
                false
            ),
            (
                "127.0.0.1".to_owned(),
                u64::from(https_port),
                "GET".to_owned(),
                200,
                true
            ),
            (
                "blocked.example".to_owned(),
                80,
                "GET".to_owned(),
                403,
                false
            ),
        ]
    );
    assert_eq!(requests[2]["refused"], "host_not_allowed");
}
