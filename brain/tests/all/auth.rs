//! Principals (SPEC X1): API keys with scopes, their revocation across replicas, JWTs from
//! a JWKS served by the test itself, and the user isolation of chats.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::{Duration, Instant};

use crate::common::TestApp;
use protocol::ui::UiChunk;
use reqwest::{Method, StatusCode};
use scripted_provider::Reply;
use serde_json::{Value, json};

/// `method path` with `bearer`, and a JSON body when given: (status, body or null).
async fn call(
    app: &TestApp,
    base: &str,
    bearer: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = app
        .http
        .request(method, format!("{base}{path}"))
        .bearer_auth(bearer);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn create_key(app: &TestApp, bearer: &str, name: &str, scope: &str) -> (String, String) {
    let (status, body) = call(
        app,
        &app.url,
        bearer,
        Method::POST,
        "/v1/keys",
        Some(json!({"name": name, "scope": scope})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    (
        body["id"].as_str().unwrap().to_owned(),
        body["api_key"].as_str().unwrap().to_owned(),
    )
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn keys_are_created_listed_and_revoked() {
    let app = TestApp::start().await;
    let (status, created) = call(
        &app,
        &app.url,
        &app.key,
        Method::POST,
        "/v1/keys",
        Some(json!({"name": "frontend backend", "scope": "chat"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["name"], "frontend backend");
    assert_eq!(created["scope"], "chat");
    let secret = created["api_key"].as_str().unwrap();
    assert!(secret.starts_with("ar_") && secret.len() == 67, "{secret}");
    assert!(created["created_at"].is_string());

    let (status, listed) = call(&app, &app.url, &app.key, Method::GET, "/v1/keys", None).await;
    assert_eq!(status, 200);
    let keys = listed["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "{listed}");
    assert_eq!(keys[0]["name"], "bootstrap");
    assert_eq!(keys[0]["scope"], "admin", "the bootstrap key is admin");
    assert_eq!(keys[1]["id"], created["id"]);
    assert_eq!(keys[1]["prefix"], &secret[..9]);
    assert!(
        !listed.to_string().contains(secret) && keys.iter().all(|k| k.get("api_key").is_none()),
        "no secret is listed"
    );

    // The new key works, and works as a chat key.
    let (status, _) = call(&app, &app.url, secret, Method::GET, "/v1/agents", None).await;
    assert_eq!(status, 200);

    let id = created["id"].as_str().unwrap();
    let (status, _) = call(
        &app,
        &app.url,
        &app.key,
        Method::DELETE,
        &format!("/v1/keys/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, body) = call(&app, &app.url, secret, Method::GET, "/v1/agents", None).await;
    assert_eq!(status, 401);
    assert_eq!(code(&body), "unauthorized");
    let (_, listed) = call(&app, &app.url, &app.key, Method::GET, "/v1/keys", None).await;
    assert_eq!(
        listed["keys"].as_array().unwrap().len(),
        1,
        "revoked keys are not listed"
    );
    // Deleting it again, an unknown id and a malformed one: all 404.
    for path in [
        format!("/v1/keys/{id}"),
        format!("/v1/keys/{}", uuid::Uuid::now_v7()),
        "/v1/keys/nope".to_owned(),
    ] {
        let (status, body) = call(&app, &app.url, &app.key, Method::DELETE, &path, None).await;
        assert_eq!(status, 404, "{path}");
        assert_eq!(code(&body), "not_found");
    }
}

#[tokio::test]
async fn another_teams_key_is_not_found() {
    let app = TestApp::start().await;
    let other = app.store.create_team("other").await.unwrap();
    let (status, listed) = call(
        &app,
        &app.url,
        &other.api_key,
        Method::GET,
        "/v1/keys",
        None,
    )
    .await;
    assert_eq!(status, 200);
    let their_key = listed["keys"][0]["id"].as_str().unwrap().to_owned();
    let (status, _) = call(
        &app,
        &app.url,
        &app.key,
        Method::DELETE,
        &format!("/v1/keys/{their_key}"),
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = call(
        &app,
        &app.url,
        &other.api_key,
        Method::GET,
        "/v1/agents",
        None,
    )
    .await;
    assert_eq!(status, 200, "their key still works");
}

#[tokio::test]
async fn key_bodies_are_validated() {
    let app = TestApp::start().await;
    for body in [
        json!({"name": "", "scope": "chat"}),
        json!({"name": "   ", "scope": "chat"}),
        json!({"name": "a\u{0}b", "scope": "chat"}),
        json!({"name": "x".repeat(201), "scope": "chat"}),
        json!({"name": "x", "scope": "owner"}),
        json!({"name": "x"}),
        json!({"name": "x", "scope": "chat", "expires": 3}),
    ] {
        let (status, answer) = call(
            &app,
            &app.url,
            &app.key,
            Method::POST,
            "/v1/keys",
            Some(body.clone()),
        )
        .await;
        assert_eq!(status, 400, "{body} → {answer}");
        assert_eq!(code(&answer), "invalid_request");
    }
    create_key(&app, &app.key, &"é".repeat(200), "admin").await;
}

#[tokio::test]
async fn a_chat_key_cannot_administer() {
    let app = TestApp::start().await;
    let (agent, chat) = app.agent_and_chat("openai/test", &[]).await;
    let (_, chat_key) = create_key(&app, &app.key, "chat", "chat").await;
    let forbidden = [
        (
            Method::POST,
            "/v1/keys".to_owned(),
            Some(json!({"name": "x", "scope": "admin"})),
        ),
        (Method::GET, "/v1/keys".to_owned(), None),
        (
            Method::DELETE,
            format!("/v1/keys/{}", uuid::Uuid::now_v7()),
            None,
        ),
        (
            Method::POST,
            "/v1/agents".to_owned(),
            Some(json!({"name": "a", "system_prompt": "", "model": "openai/x"})),
        ),
        (
            Method::POST,
            "/v1/connectors".to_owned(),
            Some(json!({"name": "gh", "url": "https://mcp.example.com"})),
        ),
        (Method::GET, "/v1/connectors".to_owned(), None),
        (
            Method::DELETE,
            format!("/v1/connectors/{}", uuid::Uuid::now_v7()),
            None,
        ),
    ];
    for (method, path, body) in forbidden {
        let (status, answer) = call(&app, &app.url, &chat_key, method.clone(), &path, body).await;
        assert_eq!(status, 403, "{method} {path}: {answer}");
        assert_eq!(code(&answer), "forbidden");
    }
    // What a chat key may do.
    for path in [
        format!("/v1/agents/{agent}"),
        "/v1/agents".to_owned(),
        format!("/v1/agents/{agent}/chats"),
        format!("/v1/agents/{agent}/sessions"),
        format!("/v1/chats/{chat}/messages"),
    ] {
        let (status, answer) = call(&app, &app.url, &chat_key, Method::GET, &path, None).await;
        assert_eq!(status, 200, "GET {path}: {answer}");
    }
    let (status, _) = call(
        &app,
        &app.url,
        &chat_key,
        Method::POST,
        &format!("/v1/agents/{agent}/chats"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201);
    app.provider.push(Reply::Text {
        deltas: vec!["hello from a chat key".into()],
        delay: Duration::from_millis(1),
    });
    let response = app
        .http
        .post(format!("{}/v1/chats/{chat}/messages", app.url))
        .bearer_auth(&chat_key)
        .json(&json!({"content": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (chunks, done) = common::read_stream(response).await;
    assert!(done);
    assert_eq!(common::streamed_text(&chunks), "hello from a chat key");
}

#[tokio::test]
async fn the_last_admin_key_stays() {
    let app = TestApp::start().await;
    let (_, listed) = call(&app, &app.url, &app.key, Method::GET, "/v1/keys", None).await;
    let bootstrap = listed["keys"][0]["id"].as_str().unwrap().to_owned();
    let (chat_id, _) = create_key(&app, &app.key, "chat", "chat").await;
    let (status, body) = call(
        &app,
        &app.url,
        &app.key,
        Method::DELETE,
        &format!("/v1/keys/{bootstrap}"),
        None,
    )
    .await;
    assert_eq!(status, 409, "a chat key does not count: {body}");
    assert_eq!(code(&body), "conflict");
    // A chat key can always go.
    let (status, _) = call(
        &app,
        &app.url,
        &app.key,
        Method::DELETE,
        &format!("/v1/keys/{chat_id}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    // With a second admin key the bootstrap key can go, revoked by the new one.
    let (_, second) = create_key(&app, &app.key, "second admin", "admin").await;
    let (status, _) = call(
        &app,
        &app.url,
        &second,
        Method::DELETE,
        &format!("/v1/keys/{bootstrap}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (_, listed) = call(&app, &app.url, &second, Method::GET, "/v1/keys", None).await;
    let own = listed["keys"][0]["id"].as_str().unwrap().to_owned();
    let (status, _) = call(
        &app,
        &app.url,
        &second,
        Method::DELETE,
        &format!("/v1/keys/{own}"),
        None,
    )
    .await;
    assert_eq!(status, 409, "nor can the last one revoke itself");
}

#[tokio::test]
async fn two_concurrent_revocations_of_the_last_two_admin_keys_leave_one() {
    let app = TestApp::start().await;
    for round in 0..8 {
        let team = app
            .store
            .create_team(&format!("race {round}"))
            .await
            .unwrap();
        let first_secret = team.api_key;
        let (_, listed) = call(&app, &app.url, &first_secret, Method::GET, "/v1/keys", None).await;
        let first = listed["keys"][0]["id"].as_str().unwrap().to_owned();
        let (second, second_secret) = create_key(&app, &first_secret, "other admin", "admin").await;
        let (second_path, first_path) = (format!("/v1/keys/{second}"), format!("/v1/keys/{first}"));
        // Each key revokes the other.
        let (a, b) = tokio::join!(
            call(
                &app,
                &app.url,
                &first_secret,
                Method::DELETE,
                &second_path,
                None
            ),
            call(
                &app,
                &app.url,
                &second_secret,
                Method::DELETE,
                &first_path,
                None
            ),
        );
        let mut statuses = [a.0.as_u16(), b.0.as_u16()];
        statuses.sort_unstable();
        // The loser is refused by the rule (409) or, when the winner's revocation of its
        // key landed before it authenticated, as a revoked key (401); never both 204.
        assert!(
            statuses == [204, 409] || statuses == [204, 401],
            "round {round}: {a:?} {b:?}"
        );
        let (live,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM api_keys WHERE team_id = $1 AND revoked_at IS NULL AND scope = 'admin'",
        )
        .bind(team.team_id.0)
        .fetch_one(app.store.pool())
        .await
        .unwrap();
        assert_eq!(live, 1, "round {round}");
    }
}

/// Revokes `key` in Postgres only (no message to any replica) while `check` runs, then
/// restores it: whether the replica at `base` still took the key, i.e. served it from its
/// cache.
async fn served_from_cache(app: &TestApp, base: &str, key: &str) -> bool {
    sqlx::query("UPDATE api_keys SET revoked_at = now() WHERE key_hash = sha256($1::bytea)")
        .bind(key.as_bytes())
        .execute(app.store.pool())
        .await
        .unwrap();
    let (status, _) = call(app, base, key, Method::GET, "/v1/agents", None).await;
    sqlx::query("UPDATE api_keys SET revoked_at = NULL WHERE key_hash = sha256($1::bytea)")
        .bind(key.as_bytes())
        .execute(app.store.pool())
        .await
        .unwrap();
    status == 200
}

#[tokio::test]
async fn a_revoked_key_is_refused_on_every_replica_within_a_second() {
    let app = TestApp::start().await;
    let replica_b = app.second_replica().await;
    let (id, key) = create_key(&app, &app.key, "soon revoked", "chat").await;
    // Replica B has the key cached (once its subscription is live, it caches).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = call(&app, &replica_b, &key, Method::GET, "/v1/agents", None).await;
        assert_eq!(status, 200);
        if served_from_cache(&app, &replica_b, &key).await {
            break;
        }
        assert!(Instant::now() < deadline, "replica B never cached the key");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = call(
        &app,
        &app.url,
        &app.key,
        Method::DELETE,
        &format!("/v1/keys/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let revoked = Instant::now();
    loop {
        let (status, _) = call(&app, &replica_b, &key, Method::GET, "/v1/agents", None).await;
        if status == 401 {
            break;
        }
        assert!(
            revoked.elapsed() < Duration::from_secs(1),
            "replica B still takes the key a second after its revocation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn without_its_subscription_a_replica_trusts_no_cached_key() {
    let app = TestApp::start().await;
    // Replica B's Redis is unreachable: its revocation subscription never comes up.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("redis://{}", dead.local_addr().unwrap());
    drop(dead);
    let (replica_b, _) = app
        .second_replica_with(|config| config.redis_url = dead_url)
        .await;
    let (_, key) = create_key(&app, &app.key, "k", "chat").await;
    for _ in 0..5 {
        let (status, _) = call(&app, &replica_b, &key, Method::GET, "/v1/agents", None).await;
        assert_eq!(status, 200, "Postgres still answers");
    }
    assert!(
        !served_from_cache(&app, &replica_b, &key).await,
        "a replica without its subscription asked Postgres"
    );
}

#[tokio::test]
async fn bearers_that_are_neither_keys_nor_tokens_are_refused() {
    let app = TestApp::start().await;
    for bearer in [
        "ar_unknown",
        "nonsense",
        "a.b",
        "a.b.c.d",
        &"x".repeat(9000),
    ] {
        let (status, body) = call(&app, &app.url, bearer, Method::GET, "/v1/agents", None).await;
        assert_eq!(status, 401, "{bearer}");
        assert_eq!(code(&body), "unauthorized");
        assert!(
            !body.to_string().contains(bearer),
            "the bearer is not echoed"
        );
    }
}

// ---- JWTs -------------------------------------------------------------------------

pub(crate) mod jwt {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use jsonwebtoken::jwk::{Jwk, JwkSet};
    use jsonwebtoken::{Algorithm, EncodingKey, Header};

    use super::*;

    pub const ISSUER: &str = "https://id.test.example";
    pub const AUDIENCE: &str = "agent-runtime";

    pub fn rsa1() -> EncodingKey {
        EncodingKey::from_rsa_der(include_bytes!("fixtures/jwt/rsa1.der"))
    }
    pub fn rsa2() -> EncodingKey {
        EncodingKey::from_rsa_der(include_bytes!("fixtures/jwt/rsa2.der"))
    }
    pub fn ec() -> EncodingKey {
        EncodingKey::from_ec_der(include_bytes!("fixtures/jwt/ec.p8.der"))
    }
    pub fn ed() -> EncodingKey {
        EncodingKey::from_ed_der(include_bytes!("fixtures/jwt/ed.p8.der"))
    }

    pub fn jwk(key: &EncodingKey, alg: Algorithm, kid: &str) -> Jwk {
        let mut jwk = Jwk::from_encoding_key(key, alg).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        jwk
    }

    pub fn now() -> i64 {
        chrono::Utc::now().timestamp()
    }

    /// Standard claims for `team` and `user`, valid for a minute; `extra` overrides.
    pub fn claims(team: protocol::TeamId, user: &str, extra: Value) -> Value {
        let mut claims = json!({
            "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 60, "iat": now(),
            "sub": user, "team_id": team.to_string(),
        });
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                claims.as_object_mut().unwrap().remove(k);
            } else {
                claims[k] = v.clone();
            }
        }
        claims
    }

    pub fn sign(key: &EncodingKey, alg: Algorithm, kid: Option<&str>, claims: &Value) -> String {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, key).unwrap()
    }

    /// A JWKS served on loopback: its URL, the set it serves, and how often it was fetched.
    pub struct JwksServer {
        pub url: String,
        pub keys: Arc<Mutex<Vec<Jwk>>>,
        pub fetches: Arc<AtomicUsize>,
    }

    impl JwksServer {
        pub async fn start(keys: Vec<Jwk>) -> Self {
            let keys = Arc::new(Mutex::new(keys));
            let fetches = Arc::new(AtomicUsize::new(0));
            let (k, f) = (keys.clone(), fetches.clone());
            let app = axum::Router::new().route(
                "/jwks.json",
                axum::routing::get(move || {
                    let (k, f) = (k.clone(), f.clone());
                    async move {
                        f.fetch_add(1, Ordering::SeqCst);
                        let set = JwkSet {
                            keys: k.lock().unwrap().clone(),
                        };
                        axum::Json(set)
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await });
            Self { url, keys, fetches }
        }

        pub fn fetches(&self) -> usize {
            self.fetches.load(Ordering::SeqCst)
        }
    }

    /// A brain accepting tokens of [`ISSUER`] with the `BRAIN_JWT_*` variables in `vars`.
    pub async fn app_with(vars: &[(&str, &str)]) -> TestApp {
        let mut all = vec![
            ("BRAIN_JWT_ISSUER", ISSUER),
            ("BRAIN_JWT_AUDIENCE", AUDIENCE),
        ];
        all.extend_from_slice(vars);
        let config = engine::auth::JwtConfig::from_env(&envcfg::vars(&all))
            .unwrap()
            .unwrap();
        TestApp::start_with(move |c| c.jwt = Some(config)).await
    }
}

use jsonwebtoken::Algorithm;
use jwt::{claims, sign};

async fn status_of(app: &TestApp, token: &str) -> (StatusCode, Value) {
    call(app, &app.url, token, Method::GET, "/v1/agents", None).await
}

#[tokio::test]
async fn jwks_keys_of_each_algorithm_are_accepted_and_rotation_is_picked_up() {
    let server = jwt::JwksServer::start(vec![
        jwt::jwk(&jwt::rsa1(), Algorithm::RS256, "rsa-1"),
        jwt::jwk(&jwt::ec(), Algorithm::ES256, "ec-1"),
        jwt::jwk(&jwt::ed(), Algorithm::EdDSA, "ed-1"),
    ])
    .await;
    let app = jwt::app_with(&[
        ("BRAIN_JWT_JWKS_URL", &server.url),
        ("BRAIN_JWT_JWKS_MIN_REFETCH_MS", "300"),
    ])
    .await;
    let c = claims(app.team, "alice", json!({}));
    for (key, alg, kid) in [
        (jwt::rsa1(), Algorithm::RS256, "rsa-1"),
        (jwt::ec(), Algorithm::ES256, "ec-1"),
        (jwt::ed(), Algorithm::EdDSA, "ed-1"),
    ] {
        let (status, body) = status_of(&app, &sign(&key, alg, Some(kid), &c)).await;
        assert_eq!(status, 200, "{alg:?}: {body}");
    }
    assert_eq!(server.fetches(), 1, "the set is cached");

    // A new key the set does not have yet: refused, and a flood of such tokens fetches
    // the set at most once per interval.
    let rotated = sign(&jwt::rsa2(), Algorithm::RS256, Some("rsa-2"), &c);
    let before = server.fetches();
    for _ in 0..20 {
        assert_eq!(status_of(&app, &rotated).await.0, 401);
    }
    assert!(
        server.fetches() - before <= 1,
        "{} fetches",
        server.fetches() - before
    );
    // The issuer rotates: the new kid is accepted once the set is fetched again.
    server
        .keys
        .lock()
        .unwrap()
        .push(jwt::jwk(&jwt::rsa2(), Algorithm::RS256, "rsa-2"));
    // Refused until the refetch interval since the last fetch has passed, then accepted.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = status_of(&app, &rotated).await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 401, "{body}");
        assert!(
            std::time::Instant::now() < deadline,
            "never accepted: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The old key's signature under the new kid is no signature of the new key.
    let forged = sign(&jwt::rsa1(), Algorithm::RS256, Some("rsa-2"), &c);
    assert_eq!(status_of(&app, &forged).await.0, 401);
}

#[tokio::test]
async fn refused_tokens() {
    let server =
        jwt::JwksServer::start(vec![jwt::jwk(&jwt::rsa1(), Algorithm::RS256, "rsa-1")]).await;
    let app = jwt::app_with(&[
        ("BRAIN_JWT_JWKS_URL", &server.url),
        ("BRAIN_JWT_LEEWAY_S", "2"),
    ])
    .await;
    let key = jwt::rsa1();
    let good = |extra: Value| {
        sign(
            &key,
            Algorithm::RS256,
            Some("rsa-1"),
            &claims(app.team, "u", extra),
        )
    };
    assert_eq!(status_of(&app, &good(json!({}))).await.0, 200);
    // Within the leeway, then beyond it.
    assert_eq!(
        status_of(&app, &good(json!({"exp": jwt::now() - 1})))
            .await
            .0,
        200
    );
    let other_team = app.store.create_team("other").await.unwrap().team_id;
    let refused = [
        (
            "expired beyond the leeway",
            good(json!({"exp": jwt::now() - 4})),
            "token expired",
        ),
        (
            "not valid yet",
            good(json!({"nbf": jwt::now() + 60})),
            "token not valid yet",
        ),
        (
            "wrong audience",
            good(json!({"aud": "someone-else"})),
            "wrong audience",
        ),
        (
            "wrong issuer",
            good(json!({"iss": "https://evil.example"})),
            "wrong issuer",
        ),
        (
            "no exp",
            good(json!({"exp": null})),
            "token lacks exp, iss or aud",
        ),
        ("no aud", good(json!({"aud": null})), ""),
        ("no iss", good(json!({"iss": null})), ""),
        ("no team", good(json!({"team_id": null})), "team claim"),
        (
            "unknown team",
            good(json!({"team_id": uuid::Uuid::now_v7().to_string()})),
            "unknown team",
        ),
        (
            "team not a uuid",
            good(json!({"team_id": "acme"})),
            "team claim",
        ),
        ("no user", good(json!({"sub": null})), "user claim"),
        (
            "user with NUL",
            good(json!({"sub": "a\u{0}b"})),
            "user claim",
        ),
        (
            "admin not a boolean",
            good(json!({"admin": "true"})),
            "admin claim",
        ),
    ];
    for (what, token, reason) in refused {
        let (status, body) = status_of(&app, &token).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert_eq!(code(&body), "unauthorized", "{what}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(reason), "{what}: {message}");
        assert!(!message.contains(&token), "the token is not echoed");
    }
    // Another team's existing id in a validly signed token is that team's, not ours.
    let theirs = good(json!({"team_id": other_team.to_string()}));
    assert_eq!(status_of(&app, &theirs).await.0, 200);

    // `alg: none`, unsigned.
    let b64 = |v: &Value| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&claims(app.team, "u", json!({})))
    );
    assert_eq!(status_of(&app, &none).await.0, 401, "alg none");
    // HS256 with the RSA public key (as PEM text and as a JWK's modulus) for the secret.
    let public_pem = include_bytes!("fixtures/jwt/rsa1.pub.pem");
    let confused = sign(
        &jsonwebtoken::EncodingKey::from_secret(public_pem).unwrap(),
        Algorithm::HS256,
        Some("rsa-1"),
        &claims(app.team, "u", json!({})),
    );
    assert_eq!(
        status_of(&app, &confused).await.0,
        401,
        "HS256 with the public key"
    );
    // A key of the right type that is not the issuer's.
    let stranger = sign(
        &jwt::rsa2(),
        Algorithm::RS256,
        None,
        &claims(app.team, "u", json!({})),
    );
    assert_eq!(status_of(&app, &stranger).await.0, 401);
    // The RSA key offered for ES256 (a kid whose key is for another algorithm).
    let wrong_alg = sign(
        &jwt::ec(),
        Algorithm::ES256,
        Some("rsa-1"),
        &claims(app.team, "u", json!({})),
    );
    assert_eq!(status_of(&app, &wrong_alg).await.0, 401);
}

#[tokio::test]
async fn inline_pem_keys_and_an_explicit_hs256_secret() {
    let pem = include_str!("fixtures/jwt/ed.pub.pem");
    let secret = "an-explicit-hs256-secret-of-32-bytes-or-more";
    let app = jwt::app_with(&[
        ("BRAIN_JWT_PUBLIC_KEYS", pem),
        ("BRAIN_JWT_HS256_SECRET", secret),
    ])
    .await;
    let c = claims(app.team, "u", json!({}));
    assert_eq!(
        status_of(&app, &sign(&jwt::ed(), Algorithm::EdDSA, None, &c))
            .await
            .0,
        200
    );
    let hs = sign(
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap(),
        Algorithm::HS256,
        None,
        &c,
    );
    assert_eq!(status_of(&app, &hs).await.0, 200);
    let other_secret = sign(
        &jsonwebtoken::EncodingKey::from_secret(b"another-secret-of-thirty-two-bytes!!").unwrap(),
        Algorithm::HS256,
        None,
        &c,
    );
    assert_eq!(status_of(&app, &other_secret).await.0, 401);
    // The EdDSA public key as the HS256 secret is still refused.
    let confused = sign(
        &jsonwebtoken::EncodingKey::from_secret(pem.as_bytes()).unwrap(),
        Algorithm::HS256,
        None,
        &c,
    );
    assert_eq!(status_of(&app, &confused).await.0, 401);
    assert_eq!(
        status_of(&app, &sign(&jwt::rsa1(), Algorithm::RS256, None, &c))
            .await
            .0,
        401
    );
}

#[tokio::test]
async fn an_unreachable_jwks_is_unavailable_not_refused() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/jwks.json", dead.local_addr().unwrap());
    drop(dead);
    let app = jwt::app_with(&[("BRAIN_JWT_JWKS_URL", &url)]).await;
    let token = sign(
        &jwt::rsa1(),
        Algorithm::RS256,
        Some("rsa-1"),
        &claims(app.team, "u", json!({})),
    );
    let (status, body) = status_of(&app, &token).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(code(&body), "auth_unavailable");
    // API keys do not depend on the issuer.
    assert_eq!(status_of(&app, &app.key.clone()).await.0, 200);
}

// ---- Users and their chats --------------------------------------------------------

/// A brain that takes EdDSA tokens signed with the fixture key, and a token maker.
async fn users_app() -> (TestApp, impl Fn(&str, bool) -> String) {
    let app = jwt::app_with(&[(
        "BRAIN_JWT_PUBLIC_KEYS",
        include_str!("fixtures/jwt/ed.pub.pem"),
    )])
    .await;
    let team = app.team;
    let token = move |user: &str, admin: bool| {
        sign(
            &jwt::ed(),
            Algorithm::EdDSA,
            None,
            &claims(team, user, json!({"admin": admin})),
        )
    };
    (app, token)
}

#[tokio::test]
async fn a_user_sees_only_their_own_chats_unless_admin() {
    let (app, token) = users_app().await;
    let (alice, bob, boss) = (
        token("alice", false),
        token("bob", false),
        token("boss", true),
    );
    let (agent, key_chat) = app.agent_and_chat("openai/test", &[]).await;

    // A user token may not administer, but may open chats and run turns.
    let (status, _) = call(&app, &app.url, &alice, Method::GET, "/v1/keys", None).await;
    assert_eq!(status, 403);
    let (status, _) = call(
        &app,
        &app.url,
        &alice,
        Method::POST,
        "/v1/agents",
        Some(json!({"name": "a", "system_prompt": "", "model": "openai/x"})),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = call(&app, &app.url, &boss, Method::GET, "/v1/keys", None).await;
    assert_eq!(status, 200, "the admin claim grants the admin scope");

    let (status, chat) = call(
        &app,
        &app.url,
        &alice,
        Method::POST,
        &format!("/v1/agents/{agent}/chats"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(chat["created_by"], "alice");
    let alices = chat["id"].as_str().unwrap().to_owned();
    app.provider.push(Reply::Text {
        deltas: vec!["hi alice".into()],
        delay: Duration::from_millis(1),
    });
    let response = app
        .http
        .post(format!("{}/v1/chats/{alices}/messages", app.url))
        .bearer_auth(&alice)
        .json(&json!({"content": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (chunks, _) = common::read_stream(response).await;
    assert_eq!(common::streamed_text(&chunks), "hi alice");
    app.settled().await;

    // Bob: 404 on everything of Alice's chat, exactly like an unknown chat.
    let unknown = uuid::Uuid::now_v7();
    for chat in [alices.as_str(), key_chat.as_str(), &unknown.to_string()] {
        let (status, body) = call(
            &app,
            &app.url,
            &bob,
            Method::GET,
            &format!("/v1/chats/{chat}/messages"),
            None,
        )
        .await;
        assert_eq!(status, 404, "{chat}: {body}");
        assert_eq!(code(&body), "not_found");
        let (status, _) = call(
            &app,
            &app.url,
            &bob,
            Method::POST,
            &format!("/v1/chats/{chat}/messages"),
            Some(json!({"content": "let me in"})),
        )
        .await;
        assert_eq!(status, 404, "{chat}");
    }
    assert_eq!(
        app.provider.requests().len(),
        1,
        "bob's turns never reached a model"
    );
    // Nor may Bob stop Alice's turn (T8): 404, while Alice may (a no-op once it ended).
    let alices_turn = chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::DataTurn { data, .. } => Some(data.turn_id.to_string()),
            _ => None,
        })
        .unwrap();
    for path in [
        format!("/v1/turns/{alices_turn}/stop"),
        format!("/v1/chats/{alices}/stop"),
    ] {
        let (status, body) = call(&app, &app.url, &bob, Method::POST, &path, None).await;
        assert_eq!(status, 404, "{path}: {body}");
        let (status, body) = call(&app, &app.url, &alice, Method::POST, &path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }

    // Alice, the admin claim and an API key read her transcript.
    for who in [&alice, &boss, &app.key] {
        let (status, body) = call(
            &app,
            &app.url,
            who,
            Method::GET,
            &format!("/v1/chats/{alices}/messages"),
            None,
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(body["messages"].as_array().unwrap().len(), 2);
    }

    // Listings: each user their own, the admin and the key the team's, newest first.
    let listed = |who: String| {
        let app = &app;
        let agent = agent.clone();
        async move {
            let (status, body) = call(
                app,
                &app.url,
                &who,
                Method::GET,
                &format!("/v1/agents/{agent}/chats"),
                None,
            )
            .await;
            assert_eq!(status, 200, "{body}");
            body["chats"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(alice.clone()).await, vec![alices.clone()]);
    assert!(listed(bob.clone()).await.is_empty());
    assert_eq!(
        listed(boss.clone()).await,
        [alices.clone(), key_chat.clone()]
    );
    assert_eq!(
        listed(app.key.clone()).await,
        [alices.clone(), key_chat.clone()]
    );

    // Artifacts and worker sessions of Alice's chat are hers too.
    let artifact = uuid::Uuid::now_v7();
    app.store
        .insert_artifact(
            app.team,
            &store::NewArtifact {
                id: artifact,
                agent: agent.parse().unwrap(),
                chat: Some(alices.parse().unwrap()),
                turn: None,
                name: "notes.txt",
                content_type: "text/plain",
                size_bytes: 1,
                sha256: &"0".repeat(64),
                storage_key: "nowhere",
            },
        )
        .await
        .unwrap();
    app.store
        .create_session(&store::NewSession {
            team: app.team,
            agent: agent.parse().unwrap(),
            chat: alices.parse().unwrap(),
            profile: "light",
            speculative: false,
            user: Some("alice"),
        })
        .await
        .unwrap();
    let meta = format!("/v1/artifacts/{artifact}/meta");
    let sessions = format!("/v1/agents/{agent}/sessions");
    for (who, artifact_status, session_count) in [
        (&bob, 404, 0),
        (&alice, 200, 1),
        (&boss, 200, 1),
        (&app.key, 200, 1),
    ] {
        let (status, _) = call(&app, &app.url, who, Method::GET, &meta, None).await;
        assert_eq!(status, artifact_status);
        let (status, _) = call(
            &app,
            &app.url,
            who,
            Method::GET,
            &format!("/v1/artifacts/{artifact}"),
            None,
        )
        .await;
        if artifact_status == 404 {
            assert_eq!(status, 404, "the bytes are as hidden as the row");
        }
        let (status, body) = call(&app, &app.url, who, Method::GET, &sessions, None).await;
        assert_eq!(status, 200);
        assert_eq!(body["sessions"].as_array().unwrap().len(), session_count);
    }
}

/// D1: a turn is read like its chat: a user's own, or any with the admin claim or a key.
#[tokio::test]
async fn a_user_reads_only_their_own_chats_turns() {
    let (app, token) = users_app().await;
    let (alice, bob, boss) = (
        token("alice", false),
        token("bob", false),
        token("boss", true),
    );
    let (agent, _) = app.agent_and_chat("openai/test", &[]).await;
    let (status, chat) = call(
        &app,
        &app.url,
        &alice,
        Method::POST,
        &format!("/v1/agents/{agent}/chats"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201);
    let alices = chat["id"].as_str().unwrap().to_owned();
    app.provider.push(Reply::Text {
        deltas: vec!["hi alice".into()],
        delay: Duration::from_millis(1),
    });
    let (status, accepted) = call(
        &app,
        &app.url,
        &alice,
        Method::POST,
        &format!("/v1/chats/{alices}/messages"),
        Some(json!({"content": "hello", "background": true})),
    )
    .await;
    assert_eq!(status, 202, "{accepted}");
    let turn = accepted["turn_id"].as_str().unwrap().to_owned();
    app.settled().await;

    let turn_path = format!("/v1/turns/{turn}");
    let list_path = format!("/v1/chats/{alices}/turns");
    for (who, want) in [(&bob, 404), (&alice, 200), (&boss, 200), (&app.key, 200)] {
        let (status, body) = call(&app, &app.url, who, Method::GET, &turn_path, None).await;
        assert_eq!(status, want, "{body}");
        let (status, body) = call(&app, &app.url, who, Method::GET, &list_path, None).await;
        assert_eq!(status, want, "{body}");
        if want == 200 {
            assert_eq!(body["turns"][0]["id"], turn.as_str());
        } else {
            assert_eq!(code(&body), "not_found");
        }
    }
    let (status, _) = call(
        &app,
        &app.url,
        &bob,
        Method::POST,
        &format!("/v1/chats/{alices}/messages"),
        Some(json!({"content": "let me in", "background": true})),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(app.provider.requests().len(), 1, "bob started nothing");
}

#[tokio::test]
async fn agents_are_listed_newest_first_without_archived_ones() {
    let app = TestApp::start().await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let response = app
            .post_json(
                "/v1/agents",
                &json!({"name": format!("a{n}"), "system_prompt": "", "model": "openai/x"}),
            )
            .await;
        let body: Value = response.json().await.unwrap();
        ids.push(body["id"].as_str().unwrap().to_owned());
    }
    app.store
        .archive_agent(
            app.team,
            ids[1].parse().unwrap(),
            &store::Actor::operator(None),
        )
        .await
        .unwrap();
    let other = app.store.create_team("other").await.unwrap();
    let names = |body: &Value| -> Vec<String> {
        body["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (status, body) = call(&app, &app.url, &app.key, Method::GET, "/v1/agents", None).await;
    assert_eq!(status, 200);
    assert_eq!(names(&body), [ids[2].clone(), ids[0].clone()]);
    let (_, body) = call(
        &app,
        &app.url,
        &app.key,
        Method::GET,
        "/v1/agents?limit=1",
        None,
    )
    .await;
    assert_eq!(names(&body), [ids[2].clone()]);
    let (_, body) = call(
        &app,
        &app.url,
        &other.api_key,
        Method::GET,
        "/v1/agents",
        None,
    )
    .await;
    assert!(
        names(&body).is_empty(),
        "another team's agents are not listed"
    );
    for bad in ["limit=0", "limit=201", "limit=x", "offset=3"] {
        let (status, body) = call(
            &app,
            &app.url,
            &app.key,
            Method::GET,
            &format!("/v1/agents?{bad}"),
            None,
        )
        .await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(code(&body), "invalid_request");
    }
    let (status, _) = call(
        &app,
        &app.url,
        &other.api_key,
        Method::GET,
        &format!("/v1/agents/{}/chats", ids[0]),
        None,
    )
    .await;
    assert_eq!(status, 404, "another team's agent has no chats to list");
}

#[tokio::test]
async fn a_user_observes_only_their_own_chats_events() {
    let (app, token) = users_app().await;
    let (alice, bob, boss) = (
        token("alice", false),
        token("bob", false),
        token("boss", true),
    );
    let (agent, key_chat) = app.agent_and_chat("openai/test", &[]).await;
    let (status, chat) = call(
        &app,
        &app.url,
        &alice,
        Method::POST,
        &format!("/v1/agents/{agent}/chats"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201);
    let alices = chat["id"].as_str().unwrap().to_owned();
    // Only the status: an events stream never ends by itself.
    let status = |who: String, chat: String| {
        let app = &app;
        async move {
            app.http
                .get(format!("{}/v1/chats/{chat}/events", app.url))
                .bearer_auth(who)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    for who in [&alice, &boss, &app.key] {
        assert_eq!(status(who.clone(), alices.clone()).await, 200);
    }
    assert_eq!(status(bob.clone(), alices.clone()).await, 404);
    assert_eq!(status(alice.clone(), key_chat.clone()).await, 404);
}

// ---- Long-lived responses end with their principal's authority --------------------

/// An open streaming response, read piece by piece.
struct Open {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    seen: String,
}

impl Open {
    async fn get(app: &TestApp, base: &str, bearer: &str, path: &str) -> Self {
        let response = app
            .http
            .get(format!("{base}{path}"))
            .bearer_auth(bearer)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        Self::from(response)
    }

    fn from(response: reqwest::Response) -> Self {
        use futures_util::StreamExt;
        Self {
            body: response.bytes_stream().boxed(),
            seen: String::new(),
        }
    }

    /// Reads until `seen` holds `what`; panics after `within`.
    async fn wait_for(&mut self, what: &str, within: Duration) {
        use futures_util::StreamExt;
        let deadline = tokio::time::Instant::now() + within;
        while !self.seen.contains(what) {
            let piece = tokio::time::timeout_at(deadline, self.body.next())
                .await
                .unwrap_or_else(|_| panic!("no {what:?} in time"))
                .unwrap_or_else(|| panic!("the stream ended before {what:?}"));
            self.seen
                .push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
        }
    }

    /// Reads until the body ends: whether it did before `deadline`.
    async fn ends_by(&mut self, deadline: tokio::time::Instant) -> bool {
        use futures_util::StreamExt;
        loop {
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) => return false,
                Ok(None | Some(Err(_))) => return true,
                Ok(Some(Ok(piece))) => self.seen.push_str(&String::from_utf8_lossy(&piece)),
            }
        }
    }

    /// The `id:` of the last event read.
    fn last_id(&self) -> Option<String> {
        self.seen
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("id: "))
            .map(str::to_owned)
    }
}

/// A key's turn stream, its events streams on two replicas and its resumed turn stream all
/// close within a second of its revocation; a reconnect with `Last-Event-ID` is refused.
#[tokio::test]
async fn a_revoked_keys_open_streams_close_on_every_replica_within_a_second() {
    let app = TestApp::start().await;
    let replica_b = app.second_replica().await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    let (id, key) = create_key(&app, &app.key, "streams", "chat").await;
    let events = format!("/v1/chats/{chat}/events");
    let mut on_a = Open::get(&app, &app.url, &key, &events).await;
    let mut on_b = Open::get(&app, &replica_b, &key, &events).await;
    // A long turn of the key's, streaming to its client.
    app.provider.push(Reply::Text {
        deltas: vec!["tick ".into(); 300],
        delay: Duration::from_millis(50),
    });
    let response = app
        .http
        .post(format!("{}/v1/chats/{chat}/messages", app.url))
        .bearer_auth(&key)
        .json(&json!({"content": "go"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut turn = Open::from(response);
    let mut resumed = Open::get(&app, &replica_b, &key, &format!("/v1/chats/{chat}/stream")).await;
    for open in [&mut turn, &mut on_a, &mut on_b, &mut resumed] {
        open.wait_for("tick", Duration::from_secs(10)).await;
    }

    let (status, _) = call(
        &app,
        &app.url,
        &app.key,
        Method::DELETE,
        &format!("/v1/keys/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    for (what, open) in [
        ("the turn's stream", &mut turn),
        ("the events stream on A", &mut on_a),
        ("the events stream on B", &mut on_b),
        ("the resumed turn stream on B", &mut resumed),
    ] {
        assert!(
            open.ends_by(deadline).await,
            "{what} still open a second after the revocation"
        );
    }
    assert!(
        on_b.seen.contains("unauthorized: "),
        "the events stream says why it ended"
    );
    let last = on_b.last_id().unwrap();
    let response = app
        .http
        .get(format!("{replica_b}{events}"))
        .bearer_auth(&key)
        .header("Last-Event-ID", last)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401, "the reconnect is refused");
}

/// A user token's events stream ends when the token expires, and its reconnect is refused.
#[tokio::test]
async fn a_user_tokens_events_stream_ends_at_its_expiry() {
    let app = jwt::app_with(&[
        (
            "BRAIN_JWT_PUBLIC_KEYS",
            include_str!("fixtures/jwt/ed.pub.pem"),
        ),
        ("BRAIN_JWT_LEEWAY_S", "0"),
    ])
    .await;
    let (agent, _) = app.agent_and_chat("openai/test", &[]).await;
    let expires = jwt::now() + 3;
    let token = sign(
        &jwt::ed(),
        Algorithm::EdDSA,
        None,
        &claims(app.team, "alice", json!({"exp": expires})),
    );
    let (status, chat) = call(
        &app,
        &app.url,
        &token,
        Method::POST,
        &format!("/v1/agents/{agent}/chats"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201);
    let chat = chat["id"].as_str().unwrap().to_owned();
    let events = format!("/v1/chats/{chat}/events");
    let mut open = Open::get(&app, &app.url, &token, &events).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    assert!(
        open.ends_by(deadline).await,
        "the stream outlived its token"
    );
    let left = jwt::now() - expires;
    assert!(left >= -1, "ended {}s before the token's expiry", -left);
    assert!(open.seen.contains("unauthorized: "));
    let (status, _) = call(&app, &app.url, &token, Method::GET, &events, None).await;
    assert_eq!(status, 401, "the reconnect is refused");
}

/// The operator's token for the tests that disable a team (L1).
pub(crate) fn operator_token() -> engine::auth::OperatorToken {
    engine::auth::OperatorToken::from_env(&envcfg::vars(&[(
        "BRAIN_OPERATOR_TOKEN",
        crate::teams::OPERATOR,
    )]))
    .unwrap()
    .unwrap()
}

/// L1: a team disabled on one replica: its cached key and its user's token are refused
/// `403 team_disabled` on the other within a second, their open streams there end, and its
/// background turn is stopped; enabled again, the key works.
#[tokio::test]
async fn a_disabled_teams_keys_tokens_streams_and_turns_end_on_every_replica() {
    let app = jwt::app_with(&[(
        "BRAIN_JWT_PUBLIC_KEYS",
        include_str!("fixtures/jwt/ed.pub.pem"),
    )])
    .await;
    let (operator_replica, _) = app
        .second_replica_with(|c| c.operator_token = Some(operator_token()))
        .await;
    let token = sign(
        &jwt::ed(),
        Algorithm::EdDSA,
        None,
        &claims(
            app.team,
            "alice",
            json!({"exp": jwt::now() + 600, "admin": true}),
        ),
    );
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !served_from_cache(&app, &app.url, &app.key).await {
        assert!(Instant::now() < deadline, "replica A never cached the key");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status_of(&app, &token).await.0, 200);
    let events = format!("/v1/chats/{chat}/events");
    let mut by_key = Open::get(&app, &app.url, &app.key, &events).await;
    let mut by_token = Open::get(&app, &app.url, &token, &events).await;
    // A long background turn: nothing holds it but the runtime.
    app.provider.push(Reply::Text {
        deltas: vec!["tick ".into(); 400],
        delay: Duration::from_millis(50),
    });
    let posted = app
        .send(&chat, &json!({"content": "go", "background": true}))
        .await;
    assert_eq!(posted.status(), 202);
    let posted: Value = posted.json().await.unwrap();
    let turn = posted["turn_id"].as_str().unwrap().to_owned();
    by_key.wait_for("tick", Duration::from_secs(10)).await;

    // The operator disables (or enables) the team on replica B; answers its status.
    let set_disabled = |disabled: bool| {
        let (app, base) = (&app, &operator_replica);
        async move {
            let path = format!("/v1/teams/{}", app.team);
            let body = json!({"disabled": disabled});
            let (status, body) = call(
                app,
                base,
                crate::teams::OPERATOR,
                Method::PATCH,
                &path,
                Some(body),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            body["status"].as_str().unwrap().to_owned()
        }
    };
    assert_eq!(set_disabled(true).await, "disabled");
    let disabled = Instant::now();
    for bearer in [&app.key, &token] {
        loop {
            let (status, body) = status_of(&app, bearer).await;
            if status == 403 {
                assert_eq!(code(&body), "team_disabled");
                break;
            }
            assert!(
                disabled.elapsed() < Duration::from_secs(1),
                "replica A still takes the team's credentials a second after it was disabled"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    assert!(by_key.ends_by(deadline).await, "the key's stream is open");
    assert!(
        by_token.ends_by(deadline).await,
        "the token's stream is open"
    );
    let ended = Instant::now() + Duration::from_secs(10);
    loop {
        let (status,): (String,) = sqlx::query_as("SELECT status FROM turns WHERE id = $1::uuid")
            .bind(&turn)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
        if status != "running" {
            assert_eq!(status, "interrupted");
            break;
        }
        assert!(Instant::now() < ended, "the background turn still runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    assert_eq!(set_disabled(false).await, "active");
    assert_eq!(status_of(&app, &app.key).await.0, 200, "enabled again");
    assert_eq!(status_of(&app, &token).await.0, 200);
    // What it opens now is not ended as if it had raced the disabling.
    let mut reopened = Open::get(&app, &app.url, &app.key, &events).await;
    let soon = tokio::time::Instant::now() + Duration::from_millis(500);
    assert!(
        !reopened.ends_by(soon).await,
        "a stream opened after enabling ended"
    );
}
