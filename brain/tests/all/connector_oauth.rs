//! Connector OAuth end to end (SPEC B2): a real brain, Postgres and Redis, server-everything
//! (streamable HTTP) behind a resource server that demands tokens, and an authorization
//! server, both on loopback (`common/oauth_servers.rs` says why those two are doubles).
//! The person who consents is a plain HTTP client following the redirects.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::oauth_servers;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::common::mcp::HttpServer;
use crate::common::{TestApp, read_stream};
use oauth_servers::{AuthServer, ResourceServer};
use protocol::ui::{ConnectorState, ConnectorStatus, UiChunk};
use scripted_provider::{Reply, ToolCall};
use serde_json::{Value, json};
use store::SecretsKey;

const SECRETS_KEY: &str = "5f0e1d2c3b4a59687766554433221100ffeeddccbbaa99887766554433221100";
const JWT_SECRET: &str = "a-test-only-hs256-secret-of-at-least-32-bytes";
const JWT_ISSUER: &str = "https://id.test.example";
const JWT_AUDIENCE: &str = "agent-runtime";

// ---------------------------------------------------------------------------------------
// What the brain logs, at every level the privacy cap lets through (SPEC X4).

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs (once per process) a subscriber like the brain's own, at `trace`, writing
/// into memory: what a production log at its most verbose would hold.
fn logs() -> Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            use tracing_subscriber::layer::SubscriberExt;
            let captured = Captured::default();
            let writer = captured.clone();
            let subscriber = tracing_subscriber::registry()
                .with(logging::privacy_cap())
                .with(tracing_subscriber::filter::LevelFilter::TRACE)
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_ansi(false)
                        .with_writer(move || writer.clone()),
                );
            tracing::subscriber::set_global_default(subscriber).unwrap();
            captured
        })
        .clone()
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

// ---------------------------------------------------------------------------------------
// The setting: servers, a brain, a connector.

pub(crate) struct World {
    pub(crate) app: TestApp,
    pub(crate) auth: AuthServer,
    resource: ResourceServer,
    _everything: HttpServer,
    pub(crate) agent: String,
    pub(crate) connector: String,
    /// The browser of whoever authorizes in a test, unless it says otherwise.
    pub(crate) browser: Browser,
}

pub(crate) async fn world() -> World {
    world_with(|_| {}).await
}

async fn world_with(tweak: impl FnOnce(&mut engine::config::Config)) -> World {
    let everything = HttpServer::everything();
    let auth = AuthServer::start().await;
    let resource = ResourceServer::start(&auth, everything.url()).await;
    let jwt = engine::auth::JwtConfig::from_env(&envcfg::vars(&[
        ("BRAIN_JWT_ISSUER", JWT_ISSUER),
        ("BRAIN_JWT_AUDIENCE", JWT_AUDIENCE),
        ("BRAIN_JWT_HS256_SECRET", JWT_SECRET),
    ]))
    .unwrap();
    let app = TestApp::start_with(|c| {
        // Every server of the test listens on loopback.
        c.connectors.allow_private_networks = true;
        c.secrets_key = Some(SecretsKey::parse(SECRETS_KEY).unwrap());
        c.jwt = jwt;
        tweak(c);
    })
    .await;
    let (agent, _) = app.agent_and_chat("openai/gpt-test", &[]).await;
    let created = app
        .post_json(
            "/v1/connectors",
            &json!({"name": "everything", "url": resource.url}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let connector = created["id"].as_str().unwrap().to_owned();
    World {
        app,
        auth,
        resource,
        _everything: everything,
        agent,
        connector,
        browser: Browser::new(),
    }
}

/// A JWT for `user` of the app's team (a chat-scoped user unless `admin`).
pub(crate) fn user_token(app: &TestApp, user: &str, admin: bool) -> String {
    let now = chrono::Utc::now().timestamp();
    let claims = json!({
        "iss": JWT_ISSUER, "aud": JWT_AUDIENCE, "iat": now, "exp": now + 600,
        "sub": user, "team_id": app.team.to_string(), "admin": admin,
    });
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

impl World {
    /// A new chat with the agent, opened with `bearer` (the team key, or a user's JWT).
    pub(crate) async fn chat(&self, bearer: &str) -> String {
        let response = self
            .app
            .http
            .post(format!("{}/v1/agents/{}/chats", self.app.url, self.agent))
            .bearer_auth(bearer)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.unwrap();
        body["id"].as_str().unwrap().to_owned()
    }

    /// One turn of `chat` as `bearer`; the model answers in text. The connector's status
    /// and the chunks.
    pub(crate) async fn turn(&self, bearer: &str, chat: &str) -> (ConnectorStatus, Vec<UiChunk>) {
        self.app.provider.push(Reply::Text {
            deltas: vec!["Fine.".into()],
            delay: Duration::from_millis(1),
        });
        self.turn_as_scripted(bearer, chat).await
    }

    async fn turn_as_scripted(&self, bearer: &str, chat: &str) -> (ConnectorStatus, Vec<UiChunk>) {
        let response = self
            .app
            .http
            .post(format!("{}/v1/chats/{chat}/messages", self.app.url))
            .bearer_auth(bearer)
            .json(&json!({"content": "hello"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let (chunks, done) = read_stream(response).await;
        assert!(done, "the turn ended its stream: {chunks:?}");
        assert!(
            chunks.iter().any(|c| matches!(c, UiChunk::Finish { .. })),
            "the turn finished: {chunks:?}"
        );
        let status = chunks
            .iter()
            .find_map(|c| match c {
                UiChunk::DataConnectorStatus { data } if data.name == "everything" => {
                    Some(data.clone())
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("no connector status in {chunks:?}"));
        (status, chunks)
    }

    /// `POST /v1/connectors/{id}/authorize` as `bearer` in the world's browser: (status,
    /// body).
    pub(crate) async fn authorize(&self, bearer: &str) -> (u16, Value) {
        let url = format!(
            "{}/v1/connectors/{}/authorize",
            self.app.url, self.connector
        );
        self.browser.post(bearer, &url).await
    }

    /// The authorization URL of a turn's flow `link`, which `bearer` (the turn's
    /// principal) opens in the world's browser.
    pub(crate) async fn follow(&self, bearer: &str, link: &str) -> String {
        let (status, body) = self.browser.post(bearer, link).await;
        assert_eq!(status, 200, "{body}");
        body["authorization_url"].as_str().unwrap().to_owned()
    }

    /// The grants stored for the connector: (user, version).
    async fn grants(&self) -> Vec<(Option<String>, i64)> {
        sqlx::query_as(
            "SELECT user_id, version FROM connector_grants WHERE connector_id = $1::uuid \
             ORDER BY user_id NULLS FIRST",
        )
        .bind(&self.connector)
        .fetch_all(self.app.store.pool())
        .await
        .unwrap()
    }
}

/// A person's browser: it follows no redirect by itself, and keeps the cookies the brain
/// sets (each flow's: `ar_oauth_<flow>`) to send them back to the brain.
pub(crate) struct Browser {
    client: reqwest::Client,
    cookies: Mutex<Vec<String>>,
}

impl Browser {
    pub(crate) fn new() -> Self {
        Self {
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .build()
                .unwrap(),
            cookies: Mutex::default(),
        }
    }

    fn keep(&self, response: &reqwest::Response) {
        for set in response.headers().get_all("set-cookie") {
            let pair = set.to_str().unwrap().split(';').next().unwrap().to_owned();
            self.cookies.lock().unwrap().push(pair);
        }
    }

    fn with_cookies(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let cookies = self.cookies.lock().unwrap().join("; ");
        if cookies.is_empty() {
            request
        } else {
            request.header("cookie", cookies)
        }
    }

    /// A `POST` with `bearer` from this browser's page (as the web chat's): (status, body).
    pub(crate) async fn post(&self, bearer: &str, url: &str) -> (u16, Value) {
        let response = self
            .client
            .post(url)
            .bearer_auth(bearer)
            .send()
            .await
            .unwrap();
        self.keep(&response);
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// The person opens `url`, consents at once and follows the redirect back to the
    /// brain: the callback's URL and its response.
    pub(crate) async fn consent(&self, app: &TestApp, url: &str) -> (String, reqwest::Response) {
        let at_server = self.client.get(url).send().await.unwrap();
        assert_eq!(
            at_server.status(),
            302,
            "the authorization server redirects back"
        );
        let back = at_server.headers()["location"].to_str().unwrap().to_owned();
        assert!(
            back.starts_with(&format!("{}/v1/oauth/callback?", app.url)),
            "{back}"
        );
        let response = self
            .with_cookies(self.client.get(&back))
            .send()
            .await
            .unwrap();
        (back, response)
    }

    /// The callback with `query`, from this browser: (status, page).
    async fn callback(&self, app: &TestApp, query: &str) -> (u16, String) {
        let url = format!("{}/v1/oauth/callback?{query}", app.url);
        let response = self
            .with_cookies(self.client.get(url))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }
}

fn echo_call() -> Reply {
    Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call_1".into(),
            name: "everything_echo".into(),
            arguments: json!({"message": "through the token"}).to_string(),
        }],
        fragment: 0,
    }
}

fn tool_output(chunks: &[UiChunk]) -> String {
    chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::ToolOutputAvailable { output, .. } => Some(output.to_string()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool output in {chunks:?}"))
}

// ---------------------------------------------------------------------------------------

/// Before any authorization the turn completes without the connector and says where to
/// authorize; after the person consents, the next turn gets its tools and a call goes
/// through with the token. Nothing the flow handled appears in an API answer or a log.
#[tokio::test]
async fn a_turn_asks_for_authorization_then_the_grant_serves_the_next_turn() {
    let logs = logs();
    let w = world().await;
    let chat = w.chat(&w.app.key).await;

    let (status, _) = w.turn(&w.app.key, &chat).await;
    assert_eq!(status.state, ConnectorState::NeedsAuthorization);
    assert_eq!(status.tools, 0);
    let link = status.authorize.expect("the status carries the link");
    assert!(
        link.starts_with(&format!("{}/v1/oauth/flows/", w.app.url)),
        "{link}"
    );
    assert_eq!(w.app.settled().await.last().unwrap().0, "completed");
    let registrations = w.auth.ledger().registrations;
    assert_eq!(registrations, 1, "the brain registered a client");

    // The next turn, while the person has not come yet, hands out the same flow.
    let (again, _) = w.turn(&w.app.key, &chat).await;
    assert_eq!(again.state, ConnectorState::NeedsAuthorization);
    assert_eq!(again.authorize.as_deref(), Some(link.as_str()));
    assert_eq!(w.auth.ledger().registrations, registrations);

    let listed: Value = w.app.get("/v1/connectors").await.json().await.unwrap();
    assert_eq!(listed["connectors"][0]["authorization"], "needed");

    let url = w.follow(&w.app.key, &link).await;
    assert!(
        url.starts_with(&format!("{}/authorize?", w.auth.issuer)),
        "{url}"
    );
    let (back, connected) = w.browser.consent(&w.app, &url).await;
    assert_eq!(connected.status(), 200);
    assert_eq!(
        connected.headers()["cache-control"].to_str().unwrap(),
        "no-store"
    );
    let page = connected.text().await.unwrap();
    assert!(page.contains("Connected"), "{page}");
    assert_eq!(w.grants().await, vec![(None, 1)]);

    // The same callback again (a replay) finds nothing.
    let replay = w.app.http.get(&back).send().await.unwrap();
    assert_eq!(replay.status(), 400);
    assert!(replay.text().await.unwrap().contains("already used"));
    assert_eq!(w.auth.ledger().code_exchanges, 1);

    w.app.provider.push(echo_call());
    w.app.provider.push(Reply::Text {
        deltas: vec!["Done.".into()],
        delay: Duration::from_millis(1),
    });
    let (status, chunks) = w.turn_as_scripted(&w.app.key, &chat).await;
    assert_eq!(status.state, ConnectorState::Ready, "{status:?}");
    assert!(status.tools > 0);
    assert!(status.authorize.is_none());
    assert!(tool_output(&chunks).contains("Echo: through the token"));
    let issued = w.auth.ledger().issued_access.clone();
    assert_eq!(issued.len(), 1);
    assert!(
        w.auth.ledger().accepted.iter().all(|t| t == &issued[0]),
        "the resource server saw the issued token only"
    );
    assert!(!w.auth.ledger().accepted.is_empty());

    let listed = w.app.get("/v1/connectors").await.text().await.unwrap();
    assert!(
        listed.contains("\"authorization\":\"authorized\""),
        "{listed}"
    );

    // Nothing secret in what the API answered or what the brain logged.
    let messages = serde_json::to_string(&w.app.messages(&chat).await).unwrap();
    let code = reqwest::Url::parse(&back)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "code")
        .unwrap()
        .1
        .into_owned();
    let ledger_secrets: Vec<String> = {
        let l = w.auth.ledger();
        l.issued_access
            .iter()
            .chain(&l.issued_refresh)
            .cloned()
            .collect()
    };
    let logged = logs.text();
    assert!(logged.contains("connector authorized"), "logs are captured");
    for secret in ledger_secrets.iter().chain([&code]) {
        assert!(!listed.contains(secret.as_str()));
        assert!(!messages.contains(secret.as_str()));
        assert!(!logged.contains(secret.as_str()), "a token in the logs");
    }
    let state = reqwest::Url::parse(&url)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "state")
        .unwrap()
        .1
        .into_owned();
    assert!(!logged.contains(&state), "the state in the logs");
}

/// An access token about to expire is refreshed before the turn's connect, and the new
/// grant is stored; the refreshed token is the one the server then sees.
#[tokio::test]
async fn an_expiring_token_is_refreshed_before_connect() {
    let w = world().await;
    // Shorter than the brain's refresh margin: every turn finds it expiring.
    w.auth.set_access_ttl(Duration::from_secs(30));
    let (status, body) = w.authorize(&w.app.key).await;
    assert_eq!(status, 200, "{body}");
    let (_, connected) = w
        .browser
        .consent(&w.app, body["authorization_url"].as_str().unwrap())
        .await;
    assert_eq!(connected.status(), 200);
    assert_eq!(w.grants().await, vec![(None, 1)]);

    let chat = w.chat(&w.app.key).await;
    let (status, _) = w.turn(&w.app.key, &chat).await;
    assert_eq!(status.state, ConnectorState::Ready, "{status:?}");
    let ledger_view = {
        let l = w.auth.ledger();
        (l.refreshes, l.issued_access.clone(), l.accepted.clone())
    };
    assert_eq!(ledger_view.0, 1, "one refresh");
    assert_eq!(ledger_view.1.len(), 2);
    assert!(
        ledger_view.2.iter().all(|t| t == &ledger_view.1[1]),
        "the server saw only the refreshed token"
    );
    assert_eq!(w.grants().await, vec![(None, 2)], "the new grant is stored");

    // The rotated refresh token was stored too: the next refresh uses the new one.
    let (status, _) = w.turn(&w.app.key, &chat).await;
    assert_eq!(status.state, ConnectorState::Ready, "{status:?}");
    assert_eq!(w.auth.ledger().refreshes, 2);
    assert_eq!(w.auth.ledger().refresh_replays, 0);
    assert_eq!(w.grants().await, vec![(None, 3)]);
}

/// W12 for OAuth: a server that quotes the access token back hands it to the brain (here
/// server-everything's `echo`, handed the token by the model, stands in for a server that
/// echoes its request or quotes it in an error). The result carries the mask wherever it
/// goes: the client's stream, the transcript and the events stream.
#[tokio::test]
async fn an_access_token_the_server_quotes_back_is_masked() {
    let w = world().await;
    let (status, body) = w.authorize(&w.app.key).await;
    assert_eq!(status, 200, "{body}");
    let (_, connected) = w
        .browser
        .consent(&w.app, body["authorization_url"].as_str().unwrap())
        .await;
    assert_eq!(connected.status(), 200);
    let token = w.auth.ledger().issued_access.last().unwrap().clone();
    let chat = w.chat(&w.app.key).await;
    w.app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![ToolCall {
            id: "call_1".into(),
            name: "everything_echo".into(),
            arguments: json!({"message": format!("sent {token}")}).to_string(),
        }],
        fragment: 0,
    });
    w.app.provider.push(Reply::Text {
        deltas: vec!["Done.".into()],
        delay: Duration::from_millis(1),
    });
    let events = w.app.observe(&chat).await;
    let (status, chunks) = w.turn_as_scripted(&w.app.key, &chat).await;
    assert_eq!(status.state, ConnectorState::Ready, "{status:?}");
    assert_eq!(
        w.auth.ledger().accepted.last(),
        Some(&token),
        "the session sent this token"
    );
    let masked = "Echo: sent [secret:oauth_token]";
    assert_eq!(tool_output(&chunks), json!(masked).to_string());
    let messages = w.app.messages(&chat).await;
    let part = messages[1]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "tool-everything_echo")
        .unwrap()
        .clone();
    assert_eq!(part["output"], masked, "{part}");
    let to_model = w.app.provider.requests()[1].body.clone();
    let results = to_model["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(Value::to_string)
        .collect::<String>();
    assert!(results.contains("[secret:oauth_token]"), "{to_model}");
    assert!(!results.contains(&token), "{results}");
    let events = events.await.unwrap();
    let output_events: String = events
        .lines()
        .filter(|line| line.contains("tool-output"))
        .collect();
    assert!(output_events.contains(masked), "{events}");
    assert!(!output_events.contains(&token), "{output_events}");
}

/// A token the server refuses before its stated expiry gets one refresh and the connect
/// is tried again; when the refresh is refused too, the turn asks a person.
#[tokio::test]
async fn a_token_refused_early_is_refreshed_once_then_authorization_is_asked() {
    let w = world().await;
    let (_, body) = w.authorize(&w.app.key).await;
    let (_, connected) = w
        .browser
        .consent(&w.app, body["authorization_url"].as_str().unwrap())
        .await;
    assert_eq!(connected.status(), 200);
    let chat = w.chat(&w.app.key).await;

    w.auth.expire_access_tokens();
    let (status, _) = w.turn(&w.app.key, &chat).await;
    assert_eq!(status.state, ConnectorState::Ready, "{status:?}");
    assert_eq!(w.auth.ledger().refreshes, 1);
    assert_eq!(w.grants().await, vec![(None, 2)]);

    // Revoked at the server: the refresh is refused, and a person is asked.
    let refresh = w.auth.ledger().issued_refresh.last().unwrap().clone();
    w.auth.revoke(&refresh);
    w.auth.expire_access_tokens();
    let (status, _) = w.turn(&w.app.key, &chat).await;
    assert_eq!(
        status.state,
        ConnectorState::NeedsAuthorization,
        "{status:?}"
    );
    assert!(status.authorize.is_some());
    assert_eq!(w.auth.ledger().refreshes, 1);
}

/// Two replicas starting turns at once with an expiring grant refresh it once: the second
/// waits for the first's lock and connects with its tokens, never spending the rotated
/// refresh token again.
#[tokio::test]
async fn two_replicas_refresh_a_grant_once() {
    let w = world().await;
    w.auth.set_access_ttl(Duration::from_secs(30));
    let (_, body) = w.authorize(&w.app.key).await;
    let (_, connected) = w
        .browser
        .consent(&w.app, body["authorization_url"].as_str().unwrap())
        .await;
    assert_eq!(connected.status(), 200);
    // The refreshed tokens live long; the refresh is slow enough that both replicas read
    // the expiring grant before either has refreshed it.
    w.auth.set_access_ttl(Duration::from_secs(3600));
    w.auth.set_refresh_delay(Duration::from_millis(700));
    let second = w.app.second_replica().await;

    // One turn per agent at a time (T9): two agents share the team-wide connector.
    let chat_a = w.chat(&w.app.key).await;
    let (_, chat_b) = w.app.agent_and_chat("openai/gpt-test", &[]).await;
    for _ in 0..2 {
        w.app.provider.push(Reply::Text {
            deltas: vec!["Fine.".into()],
            delay: Duration::from_millis(1),
        });
    }
    let send = |base: String, chat: String| {
        let http = w.app.http.clone();
        let key = w.app.key.clone();
        async move {
            let response = http
                .post(format!("{base}/v1/chats/{chat}/messages"))
                .bearer_auth(key)
                .json(&json!({"content": "hello"}))
                .send()
                .await
                .unwrap();
            read_stream(response).await.0
        }
    };
    let (a, b) = tokio::join!(
        send(w.app.url.clone(), chat_a),
        send(second.clone(), chat_b)
    );
    for chunks in [&a, &b] {
        let status = chunks
            .iter()
            .find_map(|c| match c {
                UiChunk::DataConnectorStatus { data } => Some(data.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no status in {chunks:?}"));
        assert_eq!(status.state, ConnectorState::Ready, "{status:?}");
    }
    {
        let ledger = w.auth.ledger();
        assert_eq!(ledger.refreshes, 1, "one refresh for both replicas");
        assert_eq!(ledger.refresh_replays, 0);
        let refreshed = ledger.issued_access.last().unwrap();
        assert!(
            ledger.accepted.iter().all(|t| t == refreshed),
            "both replicas connected with the refreshed token"
        );
    }
    assert_eq!(w.grants().await, vec![(None, 2)]);
}

/// A state never issued, one already used, one past its time, and a refusal at the
/// authorization server: each is refused with a page saying so, and nothing is stored.
#[tokio::test]
async fn unknown_replayed_expired_and_refused_callbacks_store_nothing() {
    let w = world().await;
    let (status, page) = w
        .browser
        .callback(&w.app, "code=abc&state=never-issued")
        .await;
    assert_eq!(status, 400);
    assert!(page.contains("unknown or was already used"), "{page}");
    assert!(!page.contains("abc"), "the code is not echoed");
    let (status, _) = w.browser.callback(&w.app, "code=abc").await;
    assert_eq!(status, 400);

    // Refused by the person: the flow is spent.
    let (_, body) = w.authorize(&w.app.key).await;
    let link = body["authorization_url"].as_str().unwrap().to_owned();
    let state = reqwest::Url::parse(&link)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "state")
        .unwrap()
        .1
        .into_owned();
    let (status, page) = w
        .browser
        .callback(&w.app, &format!("error=access_denied&state={state}"))
        .await;
    assert_eq!(status, 403);
    assert!(page.contains("refused"), "{page}");
    let (status, _) = w
        .browser
        .callback(&w.app, &format!("code=abc&state={state}"))
        .await;
    assert_eq!(status, 400, "a refused flow cannot be finished later");

    // Past its time.
    let (_, body) = w.authorize(&w.app.key).await;
    let link = body["authorization_url"].as_str().unwrap().to_owned();
    sqlx::query("UPDATE oauth_flows SET expires_at = now() - interval '1 second'")
        .execute(w.app.store.pool())
        .await
        .unwrap();
    let person = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let back = person.get(&link).send().await.unwrap().headers()["location"]
        .to_str()
        .unwrap()
        .to_owned();
    let expired = person.get(&back).send().await.unwrap();
    assert_eq!(expired.status(), 400);
    assert!(expired.text().await.unwrap().contains("expired"));

    assert!(w.grants().await.is_empty());
    assert_eq!(w.auth.ledger().code_exchanges, 0, "no code was exchanged");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM oauth_flows")
        .fetch_one(w.app.store.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "every flow was taken");
}

/// Deleting the connector revokes its grants at the authorization server and deletes
/// them with it.
#[tokio::test]
async fn deleting_the_connector_revokes_its_grants() {
    let w = world().await;
    let (_, body) = w.authorize(&w.app.key).await;
    let (_, connected) = w
        .browser
        .consent(&w.app, body["authorization_url"].as_str().unwrap())
        .await;
    assert_eq!(connected.status(), 200);
    let alice = user_token(&w.app, "alice", false);
    let (status, body) = w.authorize(&alice).await;
    assert_eq!(status, 200, "{body}");
    let (_, connected) = w
        .browser
        .consent(&w.app, body["authorization_url"].as_str().unwrap())
        .await;
    assert_eq!(connected.status(), 200);
    assert_eq!(w.grants().await.len(), 2);

    let deleted = w
        .app
        .auth(
            w.app
                .http
                .delete(format!("{}/v1/connectors/{}", w.app.url, w.connector)),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    {
        let ledger = w.auth.ledger();
        for refresh in &ledger.issued_refresh {
            assert!(
                ledger.revoked.contains(refresh),
                "refresh token revoked: {:?}",
                ledger.revoked
            );
        }
    }
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM connector_grants")
        .fetch_one(w.app.store.pool())
        .await
        .unwrap();
    assert_eq!(left, 0);
}

/// A user's grant serves that user's chats; another user's chat uses the connector's
/// grant, or asks for authorization while there is none.
#[tokio::test]
async fn a_users_grant_serves_that_users_chats() {
    let w = world().await;
    let alice = user_token(&w.app, "alice", false);
    let bob = user_token(&w.app, "bob", false);
    w.auth.set_subject("alice-at-the-service");
    let (status, body) = w.authorize(&alice).await;
    assert_eq!(status, 200, "{body}");
    let (_, connected) = w
        .browser
        .consent(&w.app, body["authorization_url"].as_str().unwrap())
        .await;
    assert_eq!(connected.status(), 200);
    assert_eq!(w.grants().await, vec![(Some("alice".into()), 1)]);

    let alices = w.chat(&alice).await;
    let (status, _) = w.turn(&alice, &alices).await;
    assert_eq!(status.state, ConnectorState::Ready, "{status:?}");
    let seen = w.auth.ledger().accepted.last().unwrap().clone();
    assert_eq!(
        w.auth.subject_of(&seen).as_deref(),
        Some("alice-at-the-service")
    );

    // Bob has no grant and the connector none: his turn asks, for him.
    let bobs = w.chat(&bob).await;
    let (status, _) = w.turn(&bob, &bobs).await;
    assert_eq!(status.state, ConnectorState::NeedsAuthorization);
    let flow_user: Option<String> =
        sqlx::query_scalar("SELECT user_id FROM oauth_flows ORDER BY created_at DESC LIMIT 1")
            .fetch_one(w.app.store.pool())
            .await
            .unwrap();
    assert_eq!(flow_user.as_deref(), Some("bob"));

    // Once the connector has its own grant, Bob's chats use it; Alice's keep hers.
    w.auth.set_subject("the-team-at-the-service");
    let (_, body) = w.authorize(&w.app.key).await;
    let (_, connected) = w
        .browser
        .consent(&w.app, body["authorization_url"].as_str().unwrap())
        .await;
    assert_eq!(connected.status(), 200);
    let (status, _) = w.turn(&bob, &bobs).await;
    assert_eq!(status.state, ConnectorState::Ready, "{status:?}");
    let seen = w.auth.ledger().accepted.last().unwrap().clone();
    assert_eq!(
        w.auth.subject_of(&seen).as_deref(),
        Some("the-team-at-the-service")
    );
    let (status, _) = w.turn(&alice, &alices).await;
    assert_eq!(status.state, ConnectorState::Ready, "{status:?}");
    let seen = w.auth.ledger().accepted.last().unwrap().clone();
    assert_eq!(
        w.auth.subject_of(&seen).as_deref(),
        Some("alice-at-the-service")
    );
}

/// What authorize refuses: a chat key without a user, a stdio connector, a server that
/// asks for nothing, a brain without the secrets key.
#[tokio::test]
async fn authorize_refuses_what_it_cannot_do() {
    let w = world_with(|c| c.connectors.allow_stdio = true).await;
    let created = w
        .app
        .post_json("/v1/keys", &json!({"name": "frontend", "scope": "chat"}))
        .await;
    let chat_key: Value = created.json().await.unwrap();
    let (status, body) = w.authorize(chat_key["api_key"].as_str().unwrap()).await;
    assert_eq!(status, 403, "{body}");

    let open = HttpServer::everything();
    for (name, target, status, code) in [
        (
            "open",
            json!({"url": open.url()}),
            409,
            "authorization_not_required",
        ),
        (
            "local",
            json!({"command": ["node", "x.js"]}),
            400,
            "invalid_request",
        ),
    ] {
        let mut body = target.clone();
        body["name"] = json!(name);
        let created: Value = w
            .app
            .post_json("/v1/connectors", &body)
            .await
            .json()
            .await
            .unwrap();
        let response = w
            .app
            .auth(w.app.http.post(format!(
                "{}/v1/connectors/{}/authorize",
                w.app.url,
                created["id"].as_str().unwrap()
            )))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{name}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], code, "{name}: {body}");
    }

    let keyless = TestApp::start_with(|c| c.connectors.allow_private_networks = true).await;
    let created: Value = keyless
        .post_json(
            "/v1/connectors",
            &json!({"name": "everything", "url": w.resource.url}),
        )
        .await
        .json()
        .await
        .unwrap();
    let response = keyless
        .auth(keyless.http.post(format!(
            "{}/v1/connectors/{}/authorize",
            keyless.url,
            created["id"].as_str().unwrap()
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 501);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_configured");
}

/// A token the server stops accepting in the middle of a turn (after the session started
/// with it): the tool call is an error that tells the model what the person must do, not
/// a bare transport failure.
#[tokio::test]
async fn a_token_refused_mid_turn_is_a_tool_error_that_says_so() {
    use engine::connectors::authorization::OAuth;
    use engine::tools::ToolCtx;
    let w = world().await;
    let (code, started) = w.authorize(&w.app.key).await;
    assert_eq!(code, 200, "{started}");
    let (_, connected) = w
        .browser
        .consent(&w.app, started["authorization_url"].as_str().unwrap())
        .await;
    assert_eq!(connected.status(), 200);

    let keyed = w
        .app
        .store
        .clone()
        .with_secrets_key(Some(SecretsKey::parse(SECRETS_KEY).unwrap()));
    let oauth = OAuth::new(
        &engine::config::OAuthConfig {
            public_url: w.app.url.clone(),
            clients: Default::default(),
        },
        true,
    )
    .unwrap();
    let config = engine::config::ConnectorConfig {
        allow_stdio: false,
        allow_private_networks: true,
        startup_timeout: Duration::from_secs(10),
        call_timeout: Duration::from_secs(30),
    };
    let agent: protocol::AgentId = w.agent.parse().unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let (tools, statuses) = engine::connectors::connector_tools(
        &keyed,
        &config,
        &oauth,
        w.app.team,
        agent,
        engine::connectors::Requester {
            user: None,
            admin: true,
            actor: "key:test",
            answerer: engine::connectors::Answerer::Nobody,
        },
        &cancel,
    )
    .await;
    assert_eq!(statuses[0].state, ConnectorState::Ready, "{statuses:?}");
    let echo = tools
        .iter()
        .find(|t| t.spec().name == "everything_echo")
        .unwrap();
    let ctx = ToolCtx {
        store: keyed.clone(),
        team: w.app.team,
        agent,
        chat: protocol::ChatId::new(),
        turn: protocol::TurnId::new(),
        call_id: "call".into(),
        ui: None,
        authority: engine::auth::Authority {
            scope: engine::auth::Scope::Chat,
            actor: "test".into(),
        },
        cancel,
        liveness: Default::default(),
    };
    let before = echo.call(&ctx, json!({"message": "hi"})).await;
    assert!(!before.is_error, "{before:?}");

    w.auth.expire_access_tokens();
    let after = echo.call(&ctx, json!({"message": "hi"})).await;
    assert!(
        after.is_error && after.content.contains("must be authorized again"),
        "{after:?}"
    );
}

/// What the events stream of `chat` holds, as text (its Redis stream, entries whole).
pub(crate) async fn events_text(chat: &str) -> String {
    let mut redis = redis::Client::open(
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
    )
    .unwrap()
    .get_multiplexed_async_connection()
    .await
    .unwrap();
    let entries: redis::Value = redis::cmd("XRANGE")
        .arg(engine::events::stream_key(chat.parse().unwrap()))
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await
        .unwrap();
    format!("{entries:?}")
}

/// X1, B2: a chat key's turn never begins a flow for the whole connector (whoever opened
/// its link would bind their account for every chat without a user grant); an admin's
/// turn does, its link stays out of the events stream every key holder reads, and its
/// callback never replaces a grant bound meanwhile.
#[tokio::test]
async fn a_chat_keys_turn_never_binds_the_connectors_grant() {
    let w = world().await;
    let created = w
        .app
        .post_json("/v1/keys", &json!({"name": "chat", "scope": "chat"}))
        .await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let chat_key = created["api_key"].as_str().unwrap().to_owned();

    let keys_chat = w.chat(&chat_key).await;
    let (status, _) = w.turn(&chat_key, &keys_chat).await;
    assert_eq!(status.state, ConnectorState::NeedsAuthorization);
    assert_eq!(status.authorize, None, "no link for a chat key: {status:?}");
    let flows: i64 = sqlx::query_scalar("SELECT count(*) FROM oauth_flows")
        .fetch_one(w.app.store.pool())
        .await
        .unwrap();
    assert_eq!(flows, 0, "no flow was begun");

    // An admin key's turn gets the link; the events stream does not.
    let admins_chat = w.chat(&w.app.key).await;
    let (status, _) = w.turn(&w.app.key, &admins_chat).await;
    let link = status.authorize.expect("an admin's turn gets the link");
    // The publisher writes in batches: wait until the status is in the stream.
    let mut observed = events_text(&admins_chat).await;
    for _ in 0..100 {
        if observed.contains("needs_authorization") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        observed = events_text(&admins_chat).await;
    }
    assert!(
        observed.contains("needs_authorization"),
        "the status reached the events stream: {observed}"
    );
    assert!(
        !observed.contains("/v1/oauth/flows/") && !observed.contains(&w.auth.issuer),
        "no authorization link in the events stream: {observed}"
    );

    // An admin binds the connector over the API meanwhile; the turn's flow then comes
    // back and does not replace it.
    let (code, body) = w.authorize(&w.app.key).await;
    assert_eq!(code, 200, "{body}");
    let (_, bound) = w
        .browser
        .consent(&w.app, body["authorization_url"].as_str().unwrap())
        .await;
    assert_eq!(bound.status(), 200);
    assert_eq!(w.grants().await, vec![(None, 1)]);
    let url = w.follow(&w.app.key, &link).await;
    let (_, late) = w.browser.consent(&w.app, &url).await;
    assert_eq!(late.status(), 409);
    assert!(late.text().await.unwrap().contains("kept"));
    assert_eq!(w.grants().await, vec![(None, 1)], "the bound grant stays");
}

/// A flow's link sent on to someone else binds nothing. The callback takes a
/// flow only from the browser holding its cookie, which only the principal that began it
/// got (on the authenticated answer that handed out the URL); a turn's link answers no one
/// but the turn's principal.
#[tokio::test]
async fn a_link_sent_to_someone_else_binds_nothing() {
    let w = world().await;
    let alice = user_token(&w.app, "alice", false);
    let (code, body) = w.authorize(&alice).await;
    assert_eq!(code, 200, "{body}");
    let link = body["authorization_url"].as_str().unwrap().to_owned();

    // Alice sends the link to someone, who consents with their own account.
    let someone = Browser::new();
    let (_, theirs) = someone.consent(&w.app, &link).await;
    assert_eq!(theirs.status(), 403);
    assert!(theirs.text().await.unwrap().contains("another browser"));
    assert!(w.grants().await.is_empty(), "nothing was bound");
    assert_eq!(
        w.auth.ledger().code_exchanges,
        0,
        "their code was not exchanged"
    );
    // The flow still waits for its own browser.
    let (_, mine) = w.browser.consent(&w.app, &link).await;
    assert_eq!(mine.status(), 200);
    assert_eq!(w.grants().await, vec![(Some("alice".to_owned()), 1)]);

    // A user's turn hands out its flow's link; no other principal can open it, not even
    // the team's admin.
    let bob = user_token(&w.app, "bob", false);
    let bobs = w.chat(&bob).await;
    let (status, _) = w.turn(&bob, &bobs).await;
    let link = status.authorize.expect("bob's turn gets his flow's link");
    let eve = user_token(&w.app, "eve", false);
    for other in [&eve, &w.app.key] {
        let (code, body) = someone.post(other, &link).await;
        assert_eq!(code, 404, "{body}");
    }
    let opened = someone.client.get(&link).send().await.unwrap();
    assert!(!opened.status().is_success(), "a link is no page to open");
    // Bob opens it in his browser: his URL, bound to that browser only.
    let bobs_browser = Browser::new();
    let (code, body) = bobs_browser.post(&bob, &link).await;
    assert_eq!(code, 200, "{body}");
    let url = body["authorization_url"].as_str().unwrap();
    let (_, theirs) = someone.consent(&w.app, url).await;
    assert_eq!(theirs.status(), 403);
    let (_, his) = bobs_browser.consent(&w.app, url).await;
    assert_eq!(his.status(), 200);
    assert_eq!(
        w.grants().await,
        vec![(Some("alice".to_owned()), 1), (Some("bob".to_owned()), 1)]
    );
}

/// The flow's cookie is the browser's alone and the callback's only: HttpOnly, SameSite=Lax,
/// its path the callback's, for the flow's lifetime.
#[tokio::test]
async fn the_flows_cookie_is_kept_from_scripts_and_other_paths() {
    let w = world().await;
    let response = w
        .app
        .http
        .post(format!(
            "{}/v1/connectors/{}/authorize",
            w.app.url, w.connector
        ))
        .bearer_auth(&w.app.key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    for attribute in [
        "HttpOnly",
        "SameSite=Lax",
        "Path=/v1/oauth/callback",
        "Max-Age=600",
    ] {
        assert!(cookie.contains(attribute), "{attribute}: {cookie}");
    }
    assert!(
        !cookie.contains("Secure"),
        "a plain-http public URL: {cookie}"
    );
}

/// One principal cannot take every place for pending flows of a connector: past
/// its share it is refused (`409 conflict`), and others can still begin theirs.
#[tokio::test]
async fn one_principal_cannot_fill_a_connectors_pending_flows() {
    let w = world().await;
    let alice = user_token(&w.app, "alice", false);
    for _ in 0..5 {
        let (code, body) = w.authorize(&alice).await;
        assert_eq!(code, 200, "{body}");
    }
    let (code, body) = w.authorize(&alice).await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("you have 5"),
        "{body}"
    );
    let bob = user_token(&w.app, "bob", false);
    let (code, body) = w.authorize(&bob).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = w.authorize(&w.app.key).await;
    assert_eq!(code, 200, "{body}");
}

/// The web chat's "Authorize" button in a real browser (tests/web/authorize.mjs): it
/// `POST`s the turn's flow link with the page's key, the answer's cookie stays in that
/// browser, and the authorization server's redirect back finishes the flow there.
#[tokio::test]
async fn the_web_chats_authorize_button_binds_the_grant_from_its_browser() {
    let w = world().await;
    let created = w
        .app
        .post_json(
            "/v1/agents",
            &json!({"name": "authorizer", "system_prompt": "You are terse.",
                    "model": "openai/gpt-test"}),
        )
        .await;
    assert_eq!(created.status(), 201);
    w.app.provider.push(Reply::Text {
        deltas: vec!["Fine.".into()],
        delay: Duration::from_millis(1),
    });
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-chat");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/web/authorize.mjs");
    let run = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new("node")
            .arg(&script)
            .arg(&w.app.url)
            .arg(&w.app.key)
            .arg("authorizer")
            .arg(&out)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser ends within three minutes")
    .unwrap();
    assert!(
        run.status.success(),
        "the page did not authorize the connector:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(w.grants().await, vec![(None, 1)]);
}
