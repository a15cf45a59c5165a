//! Request rate limits: a token bucket per API key, per JWT user and
//! per client address, shared by the replicas in Redis, overridable per team through the
//! quota API; and the readiness probe, which reuses its connections and answers from a
//! second-old check.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use test_support::proxy::{Fault, FaultProxy};

use crate::auth::jwt;
use crate::common::{TestApp, error_code};
use crate::faults::host_port;

fn limit(per_second: u64, burst: u64) -> Option<engine::quota::RequestLimit> {
    Some(engine::quota::RequestLimit { per_second, burst })
}

async fn put_requests(app: &TestApp, per_second: u64, burst: u64) {
    let set = app
        .auth(app.http.put(format!("{}/v1/quotas", app.url)))
        .json(&json!({"requests_per_second": per_second, "request_burst": burst}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    let view: Value = set.json().await.unwrap();
    assert_eq!(
        view["requests"],
        json!({"requests_per_second": per_second, "request_burst": burst})
    );
}

async fn whoami(app: &TestApp, base: &str, bearer: &str) -> reqwest::Response {
    app.http
        .get(format!("{base}/v1/whoami"))
        .bearer_auth(bearer)
        .send()
        .await
        .unwrap()
}

/// Asks until refused (at most ten times, so a slow machine's refill cannot hide the
/// limit); the refusal.
async fn until_refused(mut ask: impl AsyncFnMut() -> reqwest::Response) -> reqwest::Response {
    for _ in 0..10 {
        let response = ask().await;
        if response.status() == 429 {
            return response;
        }
        assert!(response.status().is_success() || response.status() == 401);
    }
    panic!("ten requests past the burst were all let through");
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {name} header"))
}

#[tokio::test]
async fn each_key_has_its_teams_request_rate_shared_by_every_replica() {
    let app = TestApp::start().await;
    let other = app.second_replica().await;
    let chat_key = app.chat_key().await;
    put_requests(&app, 1, 3).await;
    // The burst, spread over both replicas, is let through...
    for base in [&app.url, &other, &app.url] {
        assert_eq!(whoami(&app, base, &app.key).await.status(), 200);
    }
    // ...and what comes past it is refused on either.
    let refused = until_refused(async || whoami(&app, &other, &app.key).await).await;
    let after: u64 = header(&refused, "retry-after").parse().unwrap();
    assert!((1..=2).contains(&after), "Retry-After {after}");
    assert_eq!(header(&refused, "ratelimit-policy"), "\"requests\";q=3;w=3");
    assert!(
        header(&refused, "ratelimit").starts_with("\"requests\";r=0;t="),
        "{}",
        header(&refused, "ratelimit")
    );
    assert_eq!(error_code(refused).await, (429, "rate_limited".into()));
    // Another key of the team has a bucket of its own.
    assert_eq!(whoami(&app, &app.url, &chat_key).await.status(), 200);
    // A second refills one request.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(whoami(&app, &app.url, &app.key).await.status(), 200);
    // Unlimited again (once the admin key has a request left for it): the team's override
    // is dropped on every replica at once.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let unset = app
        .auth(app.http.put(format!("{}/v1/quotas", app.url)))
        .json(&json!({"requests_per_second": null}))
        .send()
        .await
        .unwrap();
    assert_eq!(unset.status(), 200);
    for _ in 0..10 {
        assert_eq!(whoami(&app, &other, &app.key).await.status(), 200);
    }
}

#[tokio::test]
async fn each_token_user_and_each_unauthenticated_address_has_its_own_bucket() {
    let secret = "an-explicit-hs256-secret-of-32-bytes-or-more";
    let jwt_config = engine::auth::JwtConfig::from_env(&envcfg::vars(&[
        ("BRAIN_JWT_ISSUER", jwt::ISSUER),
        ("BRAIN_JWT_AUDIENCE", jwt::AUDIENCE),
        ("BRAIN_JWT_HS256_SECRET", secret),
    ]))
    .unwrap()
    .unwrap();
    let app = TestApp::start_with(|c| {
        c.jwt = Some(jwt_config);
        c.anonymous_requests = limit(1, 2);
        // The test's addresses come from a proxy the brain trusts, so its bucket is its own.
        c.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    })
    .await;
    put_requests(&app, 1, 2).await;
    let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap();
    let token = |user: &str| {
        let claims = jwt::claims(app.team, user, json!({}));
        jwt::sign(&key, jsonwebtoken::Algorithm::HS256, None, &claims)
    };
    let (alice, bob) = (token("alice"), token("bob"));
    let refused = until_refused(async || whoami(&app, &app.url, &alice).await).await;
    assert_eq!(error_code(refused).await, (429, "rate_limited".into()));
    assert_eq!(whoami(&app, &app.url, &bob).await.status(), 200);

    let from = |address: &'static str| {
        app.http
            .get(format!("{}/v1/whoami", app.url))
            .bearer_auth("ar_not_a_key")
            .header("x-forwarded-for", address)
    };
    let refused = until_refused(async || from("203.0.113.9").send().await.unwrap()).await;
    assert_eq!(header(&refused, "ratelimit-policy"), "\"requests\";q=2;w=2");
    assert_eq!(error_code(refused).await, (429, "rate_limited".into()));
    let elsewhere = from("198.51.100.7").send().await.unwrap();
    assert_eq!(
        elsewhere.status(),
        401,
        "another address has its own bucket"
    );
    // A valid key from the refused address is the key's, not the address's.
    let keyed = app
        .http
        .get(format!("{}/v1/whoami", app.url))
        .bearer_auth(&app.key)
        .header("x-forwarded-for", "203.0.113.9")
        .send()
        .await
        .unwrap();
    assert_eq!(keyed.status(), 200);
    // Probes are never limited: a kubelet behind the same address keeps its answers.
    for _ in 0..10 {
        let probe = app
            .http
            .get(format!("{}/readyz", app.url))
            .header("x-forwarded-for", "203.0.113.9")
            .send()
            .await
            .unwrap();
        assert_eq!(probe.status(), 200);
    }
}

#[tokio::test]
async fn without_redis_requests_are_let_through() {
    let app = TestApp::start_with(|c| {
        c.redis_url = "redis://127.0.0.1:1".into();
        c.requests = limit(1, 1);
    })
    .await;
    for _ in 0..5 {
        assert_eq!(whoami(&app, &app.url, &app.key).await.status(), 200);
    }
}

#[tokio::test]
async fn readiness_probes_reuse_one_connection_and_answer_from_the_last_second() {
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let proxy = FaultProxy::start(&host_port(&redis_url)).await;
    let app = TestApp::start_with(|c| c.redis_url = format!("redis://{}", proxy.addr())).await;
    let probe = async || {
        let response = app
            .http
            .get(format!("{}/readyz", app.url))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap())
    };
    assert_eq!(
        probe().await,
        (200, json!({"postgres": true, "redis": true}))
    );
    let before = proxy.accepted();
    for _ in 0..50 {
        assert_eq!(probe().await.0, 200);
    }
    let opened = proxy.accepted() - before;
    assert!(opened <= 2, "50 probes opened {opened} Redis connections");

    // A check older than a second is made again; a younger one is the answer.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(probe().await.0, 200);
    let checked = Instant::now();
    proxy.set(Fault::Cut);
    assert_eq!(
        probe().await,
        (200, json!({"postgres": true, "redis": true})),
        "the last second's answer stands"
    );
    loop {
        let (status, body) = probe().await;
        if status == 503 {
            assert_eq!(body, json!({"postgres": true, "redis": false}));
            break;
        }
        assert!(
            checked.elapsed() < Duration::from_secs(5),
            "Redis cut 5 s ago"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = checked.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "the cut showed after {took:?}, under the second an answer is kept"
    );
    proxy.set(Fault::None);
    let back = Instant::now();
    while probe().await.0 != 200 {
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "Redis back 10 s ago"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn worker_dials_and_the_operators_team_api_are_not_limited() {
    let app = TestApp::start_with(|c| {
        c.anonymous_requests = limit(1, 1);
        c.operator_token = Some(crate::auth::operator_token());
        c.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    })
    .await;
    let from = |request: reqwest::RequestBuilder| request.header("x-forwarded-for", "203.0.113.20");
    for _ in 0..5 {
        let teams = from(app.http.get(format!("{}/v1/teams", app.url)))
            .bearer_auth(crate::teams::OPERATOR)
            .send()
            .await
            .unwrap();
        assert_eq!(teams.status(), 200);
        // A dial with a made-up token: refused by the channel, never by the rate limit.
        let dial = from(
            app.http
                .get(format!("{}{}", app.url, protocol::channel::CONNECT_PATH)),
        )
        .bearer_auth("not-a-session-token")
        .send()
        .await
        .unwrap();
        assert_ne!(dial.status(), 429);
    }
    // A wrong token on the team API counts against its address.
    let refused = until_refused(async || {
        from(app.http.get(format!("{}/v1/teams", app.url)))
            .bearer_auth("op-wrong-0123456789abcdef0123456789abcdef")
            .send()
            .await
            .unwrap()
    })
    .await;
    assert_eq!(error_code(refused).await, (429, "rate_limited".into()));
}
