//! Budgets per end user (L4) through real turns of JWT users, over real Postgres and Redis:
//! each user's counters under the team's, refusals naming the level that refused, the
//! tighter level's `RateLimit`, one user's overrides, the Postgres side when Redis is
//! unreachable, usage grouped by user, and the API's validation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use jsonwebtoken::Algorithm;
use reqwest::Method;
use scripted_provider::Reply;
use serde_json::{Value, json};

use crate::auth::jwt;
use crate::common::replies::text;
use crate::common::{TestApp, read_stream};

/// A brain taking EdDSA tokens signed with the fixture key, with `tweak` applied.
async fn app_with(tweak: impl FnOnce(&mut engine::config::Config) + Send + 'static) -> TestApp {
    let config = engine::auth::JwtConfig::from_env(&envcfg::vars(&[
        ("BRAIN_JWT_ISSUER", jwt::ISSUER),
        ("BRAIN_JWT_AUDIENCE", jwt::AUDIENCE),
        (
            "BRAIN_JWT_PUBLIC_KEYS",
            include_str!("fixtures/jwt/ed.pub.pem"),
        ),
    ]))
    .unwrap()
    .unwrap();
    TestApp::start_with(move |c| {
        c.jwt = Some(config);
        tweak(c);
    })
    .await
}

/// A user token of the app's team, valid for a minute.
fn token(app: &TestApp, user: &str) -> String {
    jwt::sign(
        &jwt::ed(),
        Algorithm::EdDSA,
        None,
        &jwt::claims(app.team, user, json!({})),
    )
}

async fn call(
    app: &TestApp,
    bearer: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = app.http.request(method, format!("{}{path}", app.url));
    request = match bearer {
        Some(bearer) => request.bearer_auth(bearer),
        None => app.auth(request),
    };
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

async fn put_quotas(app: &TestApp, body: Value) -> reqwest::Response {
    call(app, None, Method::PUT, "/v1/quotas", Some(body)).await
}

async fn put_user(app: &TestApp, user: &str, body: Value) -> reqwest::Response {
    let path = format!("/v1/quotas/users/{user}");
    call(app, None, Method::PUT, &path, Some(body)).await
}

/// A chat of `agent` opened by `user` (`None`: the team's key).
async fn chat_of(app: &TestApp, user: Option<&str>, agent: &str) -> String {
    let bearer = user.map(|u| token(app, u));
    let path = format!("/v1/agents/{agent}/chats");
    let response = call(app, bearer.as_deref(), Method::POST, &path, Some(json!({}))).await;
    assert_eq!(response.status(), 201);
    let chat: Value = response.json().await.unwrap();
    chat["id"].as_str().unwrap().to_owned()
}

async fn agent(app: &TestApp) -> String {
    app.agent_and_chat("openai/gpt-test", &[]).await.0
}

/// Posts a message as `user` (`None`: the team's key).
async fn send(app: &TestApp, user: Option<&str>, chat: &str, content: &str) -> reqwest::Response {
    let bearer = user.map(|u| token(app, u));
    let path = format!("/v1/chats/{chat}/messages");
    call(
        app,
        bearer.as_deref(),
        Method::POST,
        &path,
        Some(json!({"content": content})),
    )
    .await
}

/// A whole turn that answers "ok"; its status.
async fn turn(app: &TestApp, user: Option<&str>, chat: &str) -> u16 {
    app.provider.push(text("ok"));
    let response = send(app, user, chat, "hello").await;
    let status = response.status().as_u16();
    if status == 200 {
        read_stream(response).await;
        app.settled().await;
    }
    status
}

/// A refusal's status and its error body.
async fn refusal(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    (status, body["error"].clone())
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_user_who_spent_its_day_is_refused_while_others_of_the_team_go_on() {
    let app = app_with(|_| {}).await;
    // Any budget under a turn's reservation admits one turn and leaves nothing after it.
    let response = put_quotas(&app, json!({"per_user": {"tokens_per_day": 1}})).await;
    let status = response.status();
    let view: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["per_user"]["tokens_per_day"], 1);
    assert_eq!(view["limits"]["tokens_per_day"], Value::Null);
    let agent = agent(&app).await;
    let (alice, bob, key) = (
        chat_of(&app, Some("alice"), &agent).await,
        chat_of(&app, Some("bob"), &agent).await,
        chat_of(&app, None, &agent).await,
    );
    assert_eq!(turn(&app, Some("alice"), &alice).await, 200);
    let calls = app.provider.requests().len();
    let (status, error) = refusal(send(&app, Some("alice"), &alice, "more").await).await;
    assert_eq!(status, 402);
    assert_eq!(error["code"], "quota_exhausted");
    assert_eq!(error["scope"], "user", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .starts_with("the user's model tokens for today are spent"),
        "{error}"
    );
    assert_eq!(app.provider.requests().len(), calls, "no model call");
    // Another user of the team, and the team's key (no user), are not refused.
    assert_eq!(turn(&app, Some("bob"), &bob).await, 200);
    assert_eq!(turn(&app, None, &key).await, 200);
    // Alice's override lets her past the team's per-user budget.
    let response = put_user(&app, "alice", json!({"tokens_per_day": 1_000_000})).await;
    assert_eq!(response.status(), 200);
    let view: Value = response.json().await.unwrap();
    assert_eq!(view["limits"]["tokens_per_day"], 1_000_000);
    assert_eq!(view["overrides"], json!({"tokens_per_day": 1_000_000}));
    assert!(view["used"]["tokens_per_day"].as_u64().unwrap() > 0);
    assert_eq!(turn(&app, Some("alice"), &alice).await, 200);
    // Dropping it brings the per-user budget back.
    let response = call(&app, None, Method::DELETE, "/v1/quotas/users/alice", None).await;
    assert_eq!(response.status(), 204);
    let (status, error) = refusal(send(&app, Some("alice"), &alice, "again").await).await;
    assert_eq!((status, error["scope"].as_str()), (402, Some("user")));
    let response = call(&app, None, Method::DELETE, "/v1/quotas/users/alice", None).await;
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn turns_per_minute_and_concurrent_turns_count_per_user() {
    let app = app_with(|_| {}).await;
    put_quotas(
        &app,
        json!({"per_user": {"turns_per_minute": 2, "concurrent_turns": 1}}),
    )
    .await;
    let (first, second) = (agent(&app).await, agent(&app).await);
    let alice = chat_of(&app, Some("alice"), &first).await;
    let alice_too = chat_of(&app, Some("alice"), &second).await;
    let bob = chat_of(&app, Some("bob"), &second).await;

    // While one of Alice's turns runs, her second (on another agent) is refused; Bob's is
    // not.
    app.provider.push(Reply::Text {
        deltas: vec!["slow ".into(); 20],
        delay: Duration::from_millis(50),
    });
    let running = send(&app, Some("alice"), &alice, "long").await;
    assert_eq!(running.status(), 200);
    let refused = send(&app, Some("alice"), &alice_too, "meanwhile").await;
    assert_eq!(header(&refused, "retry-after"), "1");
    let (status, error) = refusal(refused).await;
    assert_eq!(status, 429);
    assert_eq!(error["code"], "quota_exceeded");
    assert_eq!(error["scope"], "user");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("concurrent_turns")
    );
    read_stream(running).await;
    app.settled().await;
    assert_eq!(turn(&app, Some("bob"), &bob).await, 200);

    // Alice started her two turns of the minute (the refused one does not count).
    assert_eq!(turn(&app, Some("alice"), &alice_too).await, 200);
    let (status, error) = refusal(send(&app, Some("alice"), &alice, "third").await).await;
    assert_eq!(status, 429);
    assert_eq!(error["scope"], "user");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("turns_per_minute")
    );
    assert_eq!(turn(&app, Some("bob"), &bob).await, 200);
}

#[tokio::test]
async fn a_team_limit_refuses_as_the_team_and_headers_show_the_tighter_level() {
    let app = app_with(|_| {}).await;
    put_quotas(
        &app,
        json!({"turns_per_minute": 3, "per_user": {"turns_per_minute": 2}}),
    )
    .await;
    let agent = agent(&app).await;
    let alice = chat_of(&app, Some("alice"), &agent).await;
    let bob = chat_of(&app, Some("bob"), &agent).await;
    let key = chat_of(&app, None, &agent).await;

    // Alice's first: the team has 2 left, she 1: hers is told.
    app.provider.push(text("ok"));
    let response = send(&app, Some("alice"), &alice, "one").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "ratelimit-policy"),
        "\"turns_per_minute\";q=2;w=60"
    );
    assert!(
        header(&response, "ratelimit").starts_with("\"turns_per_minute\";r=1;t="),
        "{}",
        header(&response, "ratelimit")
    );
    read_stream(response).await;
    app.settled().await;
    // Bob's first: the team has 1 left, he 1 too: the team's is told on a tie.
    app.provider.push(text("ok"));
    let response = send(&app, Some("bob"), &bob, "one").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "ratelimit-policy"),
        "\"turns_per_minute\";q=3;w=60"
    );
    assert!(header(&response, "ratelimit").starts_with("\"turns_per_minute\";r=1;t="));
    read_stream(response).await;
    app.settled().await;
    // The key's turn counts at the team's level only: the team's last of the minute.
    app.provider.push(text("ok"));
    let response = send(&app, None, &key, "one").await;
    assert_eq!(response.status(), 200);
    assert!(header(&response, "ratelimit").starts_with("\"turns_per_minute\";r=0;t="));
    read_stream(response).await;
    app.settled().await;
    // Bob has one left, the team none: the team refuses, and says so.
    let refused = send(&app, Some("bob"), &bob, "two").await;
    assert_eq!(
        header(&refused, "ratelimit-policy"),
        "\"turns_per_minute\";q=3;w=60"
    );
    let (status, error) = refusal(refused).await;
    assert_eq!(status, 429);
    assert_eq!(error["scope"], "team", "{error}");
    assert!(error["message"].as_str().unwrap().starts_with("the team "));
}

/// Redis unreachable: the per-user limits are decided from Postgres, like the team's.
#[tokio::test]
async fn without_redis_per_user_limits_are_enforced_from_postgres() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let app = app_with(move |c| c.redis_url = format!("redis://127.0.0.1:{port}/")).await;
    put_quotas(&app, json!({"per_user": {"turns_per_minute": 1}})).await;
    let (first, second) = (agent(&app).await, agent(&app).await);
    let alice = chat_of(&app, Some("alice"), &first).await;
    let bob = chat_of(&app, Some("bob"), &second).await;
    assert_eq!(turn(&app, Some("alice"), &alice).await, 200);
    let (status, error) = refusal(send(&app, Some("alice"), &alice, "two").await).await;
    assert_eq!((status, error["scope"].as_str()), (429, Some("user")));
    assert_eq!(turn(&app, Some("bob"), &bob).await, 200);
}

#[tokio::test]
async fn usage_groups_billing_events_by_user() {
    let app = app_with(|_| {}).await;
    let agent = agent(&app).await;
    let alice = chat_of(&app, Some("alice"), &agent).await;
    let bob = chat_of(&app, Some("bob"), &agent).await;
    let key = chat_of(&app, None, &agent).await;
    for (user, chat) in [
        (Some("alice"), &alice),
        (Some("alice"), &alice),
        (Some("bob"), &bob),
        (None, &key),
    ] {
        assert_eq!(turn(&app, user, chat).await, 200);
    }
    let sums: Vec<(Option<String>, i64, i64)> = sqlx::query_as(
        "SELECT user_id, sum(input_tokens)::int8, count(*) FROM billing_events \
         GROUP BY user_id ORDER BY user_id NULLS LAST",
    )
    .fetch_all(app.store.pool())
    .await
    .unwrap();
    assert_eq!(
        sums.iter().map(|s| s.0.as_deref()).collect::<Vec<_>>(),
        [Some("alice"), Some("bob"), None],
        "each event carries its turn's user"
    );
    let response = app.get("/v1/usage?group_by=user").await;
    assert_eq!(response.status(), 200);
    let report: Value = response.json().await.unwrap();
    assert_eq!(report["group_by"], "user");
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{report}");
    for (row, (user, tokens_in, calls)) in rows.iter().zip(&sums) {
        assert_eq!(row["key"].as_str(), user.as_deref());
        assert_eq!(row["tokens_in"], *tokens_in);
        assert_eq!(row["model_calls"], *calls);
    }
    assert_eq!(rows[0]["model_calls"], 2, "alice's two turns");
}

#[tokio::test]
async fn bad_quota_input_is_an_invalid_request() {
    let app = app_with(|_| {}).await;
    for body in [
        json!({"per_user": {"tokens": 1}}),
        json!({"per_user": {"tokens_per_day": -1}}),
        json!({"per_user": {"tokens_per_day": 1.5}}),
        json!({"per_user": {"tokens_per_day": 1_u64 << 51}}),
        json!({"per_user": 3}),
    ] {
        let response = put_quotas(&app, body.clone()).await;
        let (status, error) = refusal(response).await;
        assert_eq!(
            (status, error["code"].as_str()),
            (400, Some("invalid_request")),
            "{body}"
        );
    }
    for body in [json!({"per_user": {}}), json!({"concurrent_turns": -2})] {
        let (status, _) = refusal(put_user(&app, "alice", body.clone()).await).await;
        assert_eq!(status, 400, "{body}");
    }
    let long = "u".repeat(256);
    for user in [long.as_str(), "a%0Ab", "%20"] {
        let (status, error) =
            refusal(put_user(&app, user, json!({"turns_per_minute": 1})).await).await;
        if user == "%20" {
            // A space is a valid subject.
            assert_eq!(status, 200, "{error}");
            continue;
        }
        assert_eq!(
            (status, error["code"].as_str()),
            (400, Some("invalid_request")),
            "{user}"
        );
    }
    // An empty user id names no route: `not_found`, never an empty user's limits.
    let response = call(
        &app,
        None,
        Method::PUT,
        "/v1/quotas/users/",
        Some(json!({})),
    )
    .await;
    let (status, error) = refusal(response).await;
    assert_eq!((status, error["code"].as_str()), (404, Some("not_found")));
    // A user reads its own limits, not another's; only an admin changes them.
    let alice = token(&app, "alice");
    let own = call(
        &app,
        Some(&alice),
        Method::GET,
        "/v1/quotas/users/alice",
        None,
    )
    .await;
    assert_eq!(own.status(), 200);
    let view: Value = own.json().await.unwrap();
    assert_eq!(view["user_id"], "alice");
    assert_eq!(view["overrides"], json!({}));
    let theirs = call(
        &app,
        Some(&alice),
        Method::GET,
        "/v1/quotas/users/bob",
        None,
    )
    .await;
    assert_eq!(theirs.status(), 403);
    let change = call(
        &app,
        Some(&alice),
        Method::PUT,
        "/v1/quotas/users/alice",
        Some(json!({"tokens_per_day": null})),
    )
    .await;
    assert_eq!(change.status(), 403);
}

// ---------------------------------------------------------------------------------------
// Worker sessions per user (L4): `concurrent_sessions` and `worker_seconds_per_day`.

/// A brain taking user tokens whose provision tasks go to a queue no runtime-manager
/// reads: a worker tool's first call writes its session (attributed to the turn's user)
/// and waits `PROVISION_WAIT` for a worker that never comes.
async fn hands_app(redis_down: bool) -> TestApp {
    let port = if redis_down {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        Some(port)
    } else {
        None
    };
    let namespace = format!("test-{}", uuid::Uuid::new_v4().simple());
    app_with(move |c| {
        c.clock = crate::common::pinned_clock();
        c.workers.queue_namespace = namespace;
        c.workers.provision_timeout = PROVISION_WAIT;
        if let Some(port) = port {
            c.redis_url = format!("redis://127.0.0.1:{port}/");
        }
    })
    .await
}

/// How long a worker tool's call waits for a worker nobody launches.
const PROVISION_WAIT: Duration = Duration::from_secs(1);

/// One turn of `chat` as `user` whose model calls `shell`: what the call answered.
async fn shell_as(app: &TestApp, user: Option<&str>, chat: &str) -> String {
    app.provider.push(crate::workers::shell("sh", "echo hi"));
    app.provider.push(text("done"));
    let response = send(app, user, chat, "run it").await;
    assert_eq!(response.status(), 200);
    let (chunks, _) = read_stream(response).await;
    app.settled().await;
    crate::workers::output_of(&chunks, "sh")
}

/// Whether a worker tool's answer is a refusal by `user`'s `field`.
fn refused_for_user(output: &str, field: &str) -> bool {
    output.starts_with("ERROR no worker: refused: the user")
        && output.contains(&format!("({field} = "))
}

async fn user_view(app: &TestApp, user: &str) -> Value {
    let path = format!("/v1/quotas/users/{user}");
    let response = call(app, None, Method::GET, &path, None).await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// A user with a live worker session is refused a second one at its `concurrent_sessions`
/// (here an override of its own), as the user, while another user of the team and the
/// team's key start theirs.
#[tokio::test]
async fn concurrent_sessions_count_per_user() {
    let app = hands_app(false).await;
    let response = put_user(&app, "alice", json!({"concurrent_sessions": 1})).await;
    assert_eq!(response.status(), 200);
    let (agent, _) = crate::common::light_agent(&app).await;
    let alice = chat_of(&app, Some("alice"), &agent).await;
    let alice_too = chat_of(&app, Some("alice"), &agent).await;
    let bob = chat_of(&app, Some("bob"), &agent).await;
    let key = chat_of(&app, None, &agent).await;

    // Her first session is written and waits for its worker (none comes): it is live.
    let first = shell_as(&app, Some("alice"), &alice).await;
    assert!(first.contains("did not become ready in time"), "{first}");
    let second = shell_as(&app, Some("alice"), &alice_too).await;
    assert!(
        refused_for_user(&second, "concurrent_sessions"),
        "alice's second session is refused as hers: {second}"
    );
    assert!(
        second.contains("runs its limit of concurrent worker sessions"),
        "{second}"
    );
    for (user, chat) in [(Some("bob"), &bob), (None, &key)] {
        let other = shell_as(&app, user, chat).await;
        assert!(other.contains("did not become ready in time"), "{other}");
    }
    let view = user_view(&app, "alice").await;
    assert_eq!(view["limits"]["concurrent_sessions"], 1);
    assert_eq!(view["used"]["concurrent_sessions"], 1, "{view}");
    let (live,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM agent_runtime_sessions WHERE state NOT IN ('terminated', 'failed')",
    )
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(
        live, 3,
        "alice's first, bob's and the key's; the refused one wrote nothing"
    );
    assert!(
        app.metrics()
            .await
            .contains("brain_quota_refusals_total{quota=\"concurrent_sessions\"} 1")
    );
}

/// A user's worker-seconds of the day (its sessions' billed lifetime and the unbilled rest
/// of them) refuse it a new worker at its `worker_seconds_per_day`, while another user of
/// the team starts one.
#[tokio::test]
async fn worker_seconds_per_day_count_per_user() {
    // The clock pinned at noon: the 100 s moved back below all fall in its day.
    let app = hands_app(false).await;
    let response = put_quotas(&app, json!({"per_user": {"worker_seconds_per_day": 50}})).await;
    assert_eq!(response.status(), 200);
    let (agent, _) = crate::common::light_agent(&app).await;
    let alice = chat_of(&app, Some("alice"), &agent).await;
    let bob = chat_of(&app, Some("bob"), &agent).await;

    let first = shell_as(&app, Some("alice"), &alice).await;
    assert!(first.contains("did not become ready in time"), "{first}");
    // As if the runtime-manager had launched her worker 100 s ago and it then ended
    // (`billing_from` and `ended_at` are set by the schema; the first is moved back).
    let ended = sqlx::query(
        "UPDATE agent_runtime_sessions SET worker_ref = 'local:1', state = 'terminated' \
         WHERE chat_id = $1::uuid",
    )
    .bind(&alice)
    .execute(app.store.pool())
    .await
    .unwrap();
    assert_eq!(ended.rows_affected(), 1);
    sqlx::query(
        "UPDATE agent_runtime_sessions SET billing_from = ended_at - interval '100 seconds' \
         WHERE chat_id = $1::uuid",
    )
    .bind(&alice)
    .execute(app.store.pool())
    .await
    .unwrap();

    let again = shell_as(&app, Some("alice"), &alice).await;
    assert!(
        refused_for_user(&again, "worker_seconds_per_day"),
        "alice's day is spent: {again}"
    );
    assert!(
        again.contains("'s worker-seconds for today are spent"),
        "{again}"
    );
    let other = shell_as(&app, Some("bob"), &bob).await;
    assert!(other.contains("did not become ready in time"), "{other}");
    let used = user_view(&app, "alice").await["used"]["worker_seconds_per_day"]
        .as_u64()
        .unwrap();
    assert!((100..=101).contains(&used), "{used}");
    assert_eq!(
        user_view(&app, "bob").await["used"]["worker_seconds_per_day"],
        0,
        "bob's session has no worker yet"
    );
}

/// Redis unreachable: the session limits of a user are decided from Postgres, as the
/// team's are (a worker cannot be queued then, but the refusal comes first).
#[tokio::test]
async fn without_redis_per_user_session_limits_are_enforced() {
    let app = hands_app(true).await;
    put_quotas(&app, json!({"per_user": {"worker_seconds_per_day": 50}})).await;
    let (agent, _) = crate::common::light_agent(&app).await;
    let alice = chat_of(&app, Some("alice"), &agent).await;
    let bob = chat_of(&app, Some("bob"), &agent).await;
    sqlx::query(
        "INSERT INTO billing_events (id, team_id, agent_id, event_key, kind, seconds, user_id) \
         VALUES (gen_random_uuid(), $1, $2::uuid, 'test:ws', 'worker_seconds', 60, 'alice')",
    )
    .bind(app.team.0)
    .bind(&agent)
    .execute(app.store.pool())
    .await
    .unwrap();
    let refused = shell_as(&app, Some("alice"), &alice).await;
    assert!(
        refused_for_user(&refused, "worker_seconds_per_day"),
        "{refused}"
    );
    let other = shell_as(&app, Some("bob"), &bob).await;
    assert!(other.contains("provision queue is unavailable"), "{other}");
}
