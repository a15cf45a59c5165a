//! A team's own JWT issuers: a token of a team's issuer is that team's
//! and no other's, a deleted issuer's tokens are refused within the cache bound, and a
//! JWKS URL on a private or metadata address is refused at create.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use crate::auth::jwt;
use crate::common::{TestApp, error_code};

const TEAM_ISSUER: &str = "https://id.team-a.example";
const TEAM_AUDIENCE: &str = "team-a-app";

async fn call(
    app: &TestApp,
    base: &str,
    bearer: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = app
        .http
        .request(method, format!("{base}{path}"))
        .bearer_auth(bearer);
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

async fn create(app: &TestApp, bearer: &str, jwks_url: &str) -> reqwest::Response {
    let body = json!({"issuer": TEAM_ISSUER, "audience": TEAM_AUDIENCE, "jwks_url": jwks_url});
    call(
        app,
        &app.url,
        bearer,
        reqwest::Method::POST,
        "/v1/issuers",
        Some(body),
    )
    .await
}

/// A token of the team issuer for `user`; `team` is its team claim, if any.
fn token(team: Option<&str>, user: &str) -> String {
    let mut claims = json!({
        "iss": TEAM_ISSUER, "aud": TEAM_AUDIENCE, "sub": user,
        "exp": jwt::now() + 60, "iat": jwt::now(),
    });
    if let Some(team) = team {
        claims["team_id"] = json!(team);
    }
    jwt::sign(&jwt::rsa1(), Algorithm::RS256, Some("team-a-1"), &claims)
}

async fn whoami(app: &TestApp, base: &str, token: &str) -> (u16, Value) {
    let response = call(app, base, token, reqwest::Method::GET, "/v1/whoami", None).await;
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn a_team_issuers_tokens_are_that_teams_only_until_it_is_deleted() {
    let jwks =
        jwt::JwksServer::start(vec![jwt::jwk(&jwt::rsa1(), Algorithm::RS256, "team-a-1")]).await;
    // The deployment has an issuer of its own too, which stays trusted for every team.
    let deployment = engine::auth::JwtConfig::from_env(&envcfg::vars(&[
        ("BRAIN_JWT_ISSUER", jwt::ISSUER),
        ("BRAIN_JWT_AUDIENCE", jwt::AUDIENCE),
        (
            "BRAIN_JWT_HS256_SECRET",
            "an-explicit-hs256-secret-of-32-bytes-or-more",
        ),
    ]))
    .unwrap()
    .unwrap();
    let app = TestApp::start_with(|c| {
        c.jwt = Some(deployment);
        // The JWKS is served on loopback.
        c.issuers_allow_private_networks = true;
    })
    .await;
    let other = app.second_replica().await;
    let team_b = app.store.create_team("team b").await.unwrap();
    let (a, b) = (app.team.to_string(), team_b.team_id.to_string());

    // Before it is registered, the team's tokens are nobody's.
    assert_eq!(
        whoami(&app, &app.url, &token(Some(&a), "alice")).await.0,
        401
    );
    let created = create(&app, &app.key, &jwks.url).await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["issuer"], TEAM_ISSUER);

    // A's issuer signs for A: with A's team claim or none, the principal is A's.
    for claim in [Some(a.as_str()), None] {
        let (status, who) = whoami(&app, &app.url, &token(claim, "alice")).await;
        assert_eq!(status, 200, "{who}");
        assert_eq!(who["team_id"], a.as_str());
        assert_eq!(who["user"], "alice");
    }
    // A token of A's issuer claiming B is refused: it is never B's.
    let (status, body) = whoami(&app, &app.url, &token(Some(&b), "mallory")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    // Nor can B take the issuer over, nor anyone register the deployment's.
    let taken = create(&app, &team_b.api_key, &jwks.url).await;
    assert_eq!(error_code(taken).await, (409, "conflict".into()));
    let body = json!({"issuer": jwt::ISSUER, "audience": "x", "jwks_url": jwks.url});
    let own = call(
        &app,
        &app.url,
        &team_b.api_key,
        reqwest::Method::POST,
        "/v1/issuers",
        Some(body),
    );
    assert_eq!(error_code(own.await).await, (409, "conflict".into()));

    // Listed, read and audited for A; not found for B.
    let list = call(
        &app,
        &app.url,
        &app.key,
        reqwest::Method::GET,
        "/v1/issuers?limit=1",
        None,
    );
    let list: Value = list.await.json().await.unwrap();
    assert_eq!(list["issuers"][0]["id"], id.as_str());
    assert!(list.get("next_cursor").is_none());
    let path = format!("/v1/issuers/{id}");
    let got = call(&app, &app.url, &app.key, reqwest::Method::GET, &path, None).await;
    assert_eq!(got.status(), 200);
    let theirs = call(
        &app,
        &app.url,
        &team_b.api_key,
        reqwest::Method::GET,
        &path,
        None,
    )
    .await;
    assert_eq!(error_code(theirs).await, (404, "not_found".into()));
    let gone = call(
        &app,
        &app.url,
        &team_b.api_key,
        reqwest::Method::DELETE,
        &path,
        None,
    )
    .await;
    assert_eq!(error_code(gone).await, (404, "not_found".into()));

    // The second replica has read the issuer before it goes.
    let alice = token(Some(&a), "alice");
    assert_eq!(whoami(&app, &other, &alice).await.0, 200);
    let deleted = call(
        &app,
        &app.url,
        &app.key,
        reqwest::Method::DELETE,
        &path,
        None,
    )
    .await;
    assert_eq!(deleted.status(), 204);
    // At once on the replica that deleted it, within the cache bound on the other.
    assert_eq!(whoami(&app, &app.url, &alice).await.0, 401);
    let since = Instant::now();
    while whoami(&app, &other, &alice).await.0 != 401 {
        assert!(
            since.elapsed() < Duration::from_secs(12),
            "still accepted after 12 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let audit = call(
        &app,
        &app.url,
        &app.key,
        reqwest::Method::GET,
        "/v1/audit",
        None,
    );
    let audit: Value = audit.await.json().await.unwrap();
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert!(actions.contains(&"issuer.created"), "{actions:?}");
    assert!(actions.contains(&"issuer.deleted"), "{actions:?}");
    // The deployment's issuer still signs for any team.
    let secret =
        jsonwebtoken::EncodingKey::from_secret(b"an-explicit-hs256-secret-of-32-bytes-or-more")
            .unwrap();
    let operator_token = jwt::sign(
        &secret,
        Algorithm::HS256,
        None,
        &jwt::claims(team_b.team_id, "u", json!({})),
    );
    let (status, who) = whoami(&app, &app.url, &operator_token).await;
    assert_eq!((status, who["team_id"].as_str()), (200, Some(b.as_str())));
}

#[tokio::test]
async fn a_jwks_url_on_a_private_or_metadata_address_is_refused_at_create() {
    let app = TestApp::start().await;
    for url in [
        "http://127.0.0.1:9/jwks.json",
        "http://10.1.2.3/jwks.json",
        "http://localhost/jwks.json",
        "http://169.254.169.254/latest/meta-data",
    ] {
        let refused = create(&app, &app.key, url).await;
        let status = refused.status();
        let body: Value = refused.json().await.unwrap();
        assert_eq!(status, 400, "{url}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("jwks_url"),
            "{body}"
        );
    }
    // Metadata addresses stay refused when the operator allows private networks.
    let open = TestApp::start_with(|c| c.issuers_allow_private_networks = true).await;
    let refused = create(&open, &open.key, "http://169.254.169.254/jwks.json").await;
    assert_eq!(error_code(refused).await, (400, "invalid_request".into()));
    // Only an admin registers an issuer.
    let chat = app.chat_key().await;
    let forbidden = create(&app, &chat, "https://id.team-a.example/jwks.json").await;
    assert_eq!(error_code(forbidden).await, (403, "forbidden".into()));
}

#[tokio::test]
async fn a_team_issuers_jwks_fetches_obey_the_address_rule_and_the_refetch_bound() {
    let jwks =
        jwt::JwksServer::start(vec![jwt::jwk(&jwt::rsa1(), Algorithm::RS256, "team-a-1")]).await;
    let app = TestApp::start_with(|c| c.issuers_allow_private_networks = true).await;
    // A replica whose operator did not allow private networks never fetches from one.
    let (closed, _) = app
        .second_replica_with(|c| c.issuers_allow_private_networks = false)
        .await;
    assert_eq!(create(&app, &app.key, &jwks.url).await.status(), 201);
    let a = app.team.to_string();
    let alice = token(Some(&a), "alice");
    assert_eq!(whoami(&app, &app.url, &alice).await.0, 200);
    let fetched = jwks.fetches();
    let (status, body) = whoami(&app, &closed, &alice).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("auth_unavailable"))
    );
    assert_eq!(
        jwks.fetches(),
        fetched,
        "the closed replica reached the JWKS"
    );
    // Made-up `kid`s refetch the set at most once per BRAIN_JWT_JWKS_MIN_REFETCH_MS.
    for i in 0..20 {
        let claims = json!({
            "iss": TEAM_ISSUER, "aud": TEAM_AUDIENCE, "sub": "alice",
            "exp": jwt::now() + 60, "team_id": a,
        });
        let forged = jwt::sign(
            &jwt::rsa1(),
            Algorithm::RS256,
            Some(&format!("kid-{i}")),
            &claims,
        );
        assert_eq!(whoami(&app, &app.url, &forged).await.0, 401);
    }
    assert!(jwks.fetches() <= fetched + 1, "{} fetches", jwks.fetches());
}
