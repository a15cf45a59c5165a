//! Knowledge bases (B3, B4): real Markdown, text, HTML, PDF, CSV and JSON files indexed in the
//! background and searched with Postgres full-text search; a corrupt PDF failing alone
//! with its reason; deletion (a deleted document is in no answer); two teams (nothing
//! crosses); the per-team limits and their codes; and a replica killed mid-indexing (its
//! claim lapses and another replica indexes the document).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use reqwest::Response;
use serde_json::{Value, json};

use crate::common::replies::{call, calls, text};
use crate::common::{TestApp, error_code, send_as};
use protocol::ui::UiChunk;

const HANDBOOK: &[u8] = include_bytes!("fixtures/knowledge/handbook.md");
const FAQ: &[u8] = include_bytes!("fixtures/knowledge/faq.txt");
const CITIES: &[u8] = include_bytes!("fixtures/knowledge/cities.csv");
const SETTINGS: &[u8] = include_bytes!("fixtures/knowledge/settings.json");
const BROKEN_PDF: &[u8] = include_bytes!("fixtures/knowledge/broken.pdf");
const ONBOARDING: &[u8] = include_bytes!("fixtures/knowledge/onboarding.html");
/// Two pages written by a real PDF writer (the text extractor's fixture).
const VISITS_PDF: &[u8] = include_bytes!("../../../engine/tests/fixtures/visits.pdf");

/// Indexing is the background's work; on a loaded machine it may take a few seconds.
const INDEXED_WITHIN: Duration = Duration::from_secs(20);

async fn create_base_as(app: &TestApp, bearer: &str, name: &str) -> Response {
    app.http
        .post(format!("{}/v1/knowledge", app.url))
        .bearer_auth(bearer)
        .json(&json!({"name": name, "description": "what we know"}))
        .send()
        .await
        .unwrap()
}

async fn create_base(app: &TestApp, bearer: &str, name: &str) -> String {
    let created = create_base_as(app, bearer, name).await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    created["id"].as_str().unwrap().to_owned()
}

/// `POST /v1/knowledge/{base}/documents` as `bearer`, a multipart form written by hand.
async fn upload_as(
    app: &TestApp,
    bearer: &str,
    base: &str,
    filename: &str,
    bytes: &[u8],
) -> Response {
    let boundary = "----knowledge-boundary-91c2";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    app.http
        .post(format!("{}/v1/knowledge/{base}/documents", app.url))
        .bearer_auth(bearer)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .unwrap()
}

/// Uploads a document and answers its id.
async fn upload(app: &TestApp, bearer: &str, base: &str, filename: &str, bytes: &[u8]) -> String {
    let response = upload_as(app, bearer, base, filename, bytes).await;
    assert_eq!(response.status(), 202);
    let document: Value = response.json().await.unwrap();
    assert_eq!(document["status"], "queued");
    document["id"].as_str().unwrap().to_owned()
}

async fn get_as(app: &TestApp, bearer: &str, path: &str) -> Response {
    app.http
        .get(format!("{}{path}", app.url))
        .bearer_auth(bearer)
        .send()
        .await
        .unwrap()
}

async fn document(app: &TestApp, bearer: &str, base: &str, id: &str) -> Value {
    let response = get_as(app, bearer, &format!("/v1/knowledge/{base}/documents/{id}")).await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// Waits until document `id` is indexed (`ready` or `failed`) and answers it.
async fn settled(app: &TestApp, bearer: &str, base: &str, id: &str) -> Value {
    let deadline = std::time::Instant::now() + INDEXED_WITHIN;
    loop {
        let now = document(app, bearer, base, id).await;
        if matches!(now["status"].as_str(), Some("ready" | "failed")) {
            return now;
        }
        assert!(std::time::Instant::now() < deadline, "never indexed: {now}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn search_as(app: &TestApp, bearer: &str, base: &str, query: &str) -> Response {
    app.http
        .post(format!("{}/v1/knowledge/{base}/search", app.url))
        .bearer_auth(bearer)
        .json(&json!({"query": query, "limit": 5}))
        .send()
        .await
        .unwrap()
}

async fn passages(app: &TestApp, bearer: &str, base: &str, query: &str) -> Vec<Value> {
    let response = search_as(app, bearer, base, query).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    body["passages"].as_array().unwrap().clone()
}

/// Markdown, text, CSV and JSON are indexed and found, each passage with its document,
/// title, heading path and place; a corrupt PDF fails alone with its reason; the base
/// counts them; a deleted document is in no answer and its counts go with it.
#[tokio::test]
async fn documents_are_indexed_searched_and_deleted() {
    let app = TestApp::start().await;
    let key = app.key.clone();
    let base = create_base(&app, &key, "Handbook").await;
    let handbook = upload(&app, &key, &base, "handbook.md", HANDBOOK).await;
    let faq = upload(&app, &key, &base, "faq.txt", FAQ).await;
    let cities = upload(&app, &key, &base, "cities.csv", CITIES).await;
    let settings = upload(&app, &key, &base, "settings.json", SETTINGS).await;
    let broken = upload(&app, &key, &base, "broken.pdf", BROKEN_PDF).await;
    let onboarding = upload(&app, &key, &base, "onboarding.html", ONBOARDING).await;
    let visits = upload(&app, &key, &base, "visits.pdf", VISITS_PDF).await;

    let done = settled(&app, &key, &base, &handbook).await;
    assert_eq!(done["status"], "ready", "{done}");
    assert_eq!(done["media_type"], "text/markdown");
    assert_eq!(done["title"], "Team Handbook");
    assert!(done["chunks"].as_i64().unwrap() >= 4, "{done}");
    for id in [&faq, &cities, &settings, &onboarding, &visits] {
        let done = settled(&app, &key, &base, id).await;
        assert_eq!(done["status"], "ready", "{done}");
    }
    let failed = settled(&app, &key, &base, &broken).await;
    assert_eq!(failed["status"], "failed");
    assert!(!failed["error"].as_str().unwrap().is_empty(), "{failed}");

    let counts: Value = get_as(&app, &key, &format!("/v1/knowledge/{base}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(counts["documents"], 7);
    assert_eq!(counts["documents_ready"], 6);
    assert!(counts["chunks"].as_i64().unwrap() >= 9, "{counts}");

    // A Markdown passage carries its heading path; the best match is the section that
    // says it.
    let found = passages(&app, &key, &base, "how do I reset a forgotten password").await;
    let best = &found[0];
    assert_eq!(best["document_id"], handbook.as_str());
    assert_eq!(best["filename"], "handbook.md");
    assert_eq!(best["title"], "Team Handbook");
    assert_eq!(best["heading"], "Team Handbook > Security > Passwords");
    assert!(best["text"].as_str().unwrap().contains("thirty minutes"));
    assert!(best["score"].as_f64().unwrap() > 0.0);
    assert!(best["position"].as_i64().is_some());
    // A code block's `#` line is no heading: the holidays section holds it.
    let holidays = passages(&app, &key, &base, "shell comment").await;
    assert_eq!(holidays[0]["heading"], "Team Handbook > Holidays");
    // Text, CSV (under its header) and JSON are found too.
    let espresso = passages(&app, &key, &base, "descaled espresso").await;
    assert_eq!(espresso[0]["document_id"], faq.as_str());
    let grenoble = passages(&app, &key, &base, "Grenoble").await;
    assert_eq!(grenoble[0]["document_id"], cities.as_str());
    assert!(
        grenoble[0]["text"]
            .as_str()
            .unwrap()
            .starts_with("city,office,desks")
    );
    let invoices = passages(&app, &key, &base, "invoices archived").await;
    assert_eq!(invoices[0]["document_id"], settings.as_str());
    // HTML by its headings (its script is no text), a PDF by its pages.
    let badge = passages(&app, &key, &base, "lost badge").await;
    assert_eq!(badge[0]["document_id"], onboarding.as_str());
    assert_eq!(badge[0]["heading"], "Onboarding > Badges");
    assert!(!badge[0]["text"].as_str().unwrap().contains("console"));
    let harbour = passages(&app, &key, &base, "harbour winter").await;
    assert_eq!(harbour[0]["document_id"], visits.as_str());
    assert!(
        harbour[0]["text"]
            .as_str()
            .unwrap()
            .contains("harbour of Nantes")
    );
    // Nothing matches nothing.
    assert!(passages(&app, &key, &base, "zeppelin").await.is_empty());

    // Pages of documents.
    let page: Value = get_as(
        &app,
        &key,
        &format!("/v1/knowledge/{base}/documents?limit=2"),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(page["documents"].as_array().unwrap().len(), 2);
    let cursor = page["next_cursor"].as_str().unwrap();
    let rest: Value = get_as(
        &app,
        &key,
        &format!("/v1/knowledge/{base}/documents?limit=10&cursor={cursor}"),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(rest["documents"].as_array().unwrap().len(), 5);
    assert!(rest.get("next_cursor").is_none());

    // Deleted: in no answer, and out of the counts.
    let deleted = app
        .auth(app.http.delete(format!(
            "{}/v1/knowledge/{base}/documents/{handbook}",
            app.url
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(
        passages(&app, &key, &base, "password")
            .await
            .iter()
            .all(|p| p["document_id"] != handbook.as_str())
    );
    assert!(passages(&app, &key, &base, "password").await.is_empty());
    let gone = get_as(
        &app,
        &key,
        &format!("/v1/knowledge/{base}/documents/{handbook}"),
    )
    .await;
    assert_eq!(gone.status(), 404);
    let counts: Value = get_as(&app, &key, &format!("/v1/knowledge/{base}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(counts["documents"], 6);
    assert_eq!(counts["documents_ready"], 5);
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM knowledge_chunks WHERE document_id = $1::uuid")
            .bind(&handbook)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(left, 0);

    // The base goes with everything in it.
    let deleted = app
        .auth(app.http.delete(format!("{}/v1/knowledge/{base}", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let chunks: i64 = sqlx::query_scalar("SELECT count(*) FROM knowledge_chunks")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(chunks, 0);
    assert_eq!(search_as(&app, &key, &base, "espresso").await.status(), 404);
}

/// Another team sees nothing of a team's knowledge: its bases, documents and search are
/// `404`, and its own search answers only its own passages.
/// B4: passages with every word of the query come before those with only some of them,
/// however often those repeat one word; a word no passage has with the others still finds
/// what has any of them.
#[tokio::test]
async fn passages_with_every_word_rank_first() {
    let app = TestApp::start().await;
    let base = create_base(&app, &app.key, "Tiers").await;
    let dense = b"# Kettles\n\nThe kettle kettle kettle kettle boils kettle water kettle fast.\n";
    let both = b"# Descaling\n\nA descaling routine keeps any old kettle working for years.\n";
    for (name, bytes) in [("dense.md", &dense[..]), ("both.md", &both[..])] {
        let doc = upload(&app, &app.key, &base, name, bytes).await;
        assert_eq!(
            settled(&app, &app.key, &base, &doc).await["status"],
            "ready"
        );
    }
    let found = passages(&app, &app.key, &base, "kettle descaling").await;
    let files: Vec<&str> = found
        .iter()
        .map(|p| p["filename"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["both.md", "dense.md"], "{found:?}");
    let found = passages(&app, &app.key, &base, "kettle zeppelin").await;
    assert_eq!(
        found.len(),
        2,
        "any word fills the answer when none has all: {found:?}"
    );
}

#[tokio::test]
async fn nothing_crosses_teams() {
    let app = TestApp::start().await;
    let ours = create_base(&app, &app.key, "Ours").await;
    let doc = upload(&app, &app.key, &ours, "faq.txt", FAQ).await;
    settled(&app, &app.key, &ours, &doc).await;
    let other = app.store.create_team("other team").await.unwrap().api_key;
    let theirs = create_base(&app, &other, "Theirs").await;
    let their_doc = upload(&app, &other, &theirs, "handbook.md", HANDBOOK).await;
    settled(&app, &other, &theirs, &their_doc).await;

    for path in [
        format!("/v1/knowledge/{ours}"),
        format!("/v1/knowledge/{ours}/documents"),
        format!("/v1/knowledge/{ours}/documents/{doc}"),
    ] {
        let (status, code) = error_code(get_as(&app, &other, &path).await).await;
        assert_eq!((status, code.as_str()), (404, "not_found"), "{path}");
    }
    let (status, _) = error_code(search_as(&app, &other, &ours, "espresso").await).await;
    assert_eq!(status, 404);
    let (status, _) = error_code(upload_as(&app, &other, &ours, "faq.txt", FAQ).await).await;
    assert_eq!(status, 404);
    let listed: Value = get_as(&app, &other, "/v1/knowledge")
        .await
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = listed["knowledge_bases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [theirs.as_str()]);
    assert!(passages(&app, &other, &theirs, "espresso").await.is_empty());
    assert!(!passages(&app, &app.key, &ours, "espresso").await.is_empty());
}

/// Each team bound refuses with its stable code and stores nothing; a document whose
/// passages would pass the team's chunks fails with that reason.
#[tokio::test]
async fn limits_refuse_with_stable_codes() {
    let app = TestApp::start_with(|c| {
        c.knowledge.max_bases = 1;
        c.knowledge.max_documents = 2;
        c.knowledge.max_file_bytes = 1000;
        c.knowledge.quota_bytes = 1200;
        c.knowledge.max_chunks = 3;
    })
    .await;
    let base = create_base(&app, &app.key, "One").await;
    let (status, code) = error_code(create_base_as(&app, &app.key, "Two").await).await;
    assert_eq!((status, code.as_str()), (429, "knowledge_limit_reached"));

    let big = "word ".repeat(300);
    let (status, code) =
        error_code(upload_as(&app, &app.key, &base, "big.txt", big.as_bytes()).await).await;
    assert_eq!((status, code.as_str()), (413, "file_too_large"));
    let (status, code) =
        error_code(upload_as(&app, &app.key, &base, "photo.png", b"\x89PNG\r\n\x1a\n....").await)
            .await;
    assert_eq!((status, code.as_str()), (400, "invalid_request"));

    let handbook = upload(&app, &app.key, &base, "handbook.md", HANDBOOK).await;
    let failed = settled(&app, &app.key, &base, &handbook).await;
    assert_eq!(failed["status"], "failed");
    assert!(
        failed["error"].as_str().unwrap().contains("3 chunks"),
        "{failed}"
    );
    let (status, code) =
        error_code(upload_as(&app, &app.key, &base, "faq2.txt", &[FAQ, FAQ].concat()).await).await;
    assert_eq!((status, code.as_str()), (413, "knowledge_quota_exceeded"));
    upload(&app, &app.key, &base, "cities.csv", CITIES).await;
    let (status, code) =
        error_code(upload_as(&app, &app.key, &base, "settings.json", SETTINGS).await).await;
    assert_eq!((status, code.as_str()), (429, "knowledge_limit_reached"));
    let documents: i64 = sqlx::query_scalar("SELECT count(*) FROM knowledge_documents")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(documents, 2);
}

/// A replica that claimed a document and died mid-indexing leaves its claim to lapse;
/// another replica claims the job again and indexes it, and the dead claim's late write
/// is refused.
#[tokio::test]
async fn a_job_whose_replica_died_is_indexed_by_another() {
    // This replica runs no indexer, so nothing but the claim below can take the job: no
    // wait shows more than this read does.
    let app = TestApp::start_with(|c| c.knowledge.indexers = 0).await;
    let base = create_base(&app, &app.key, "Handbook").await;
    let id = upload(&app, &app.key, &base, "handbook.md", HANDBOOK).await;
    assert_eq!(
        document(&app, &app.key, &base, &id).await["status"],
        "queued"
    );

    // The replica that dies: it claims the job and never ends it.
    let dead = app
        .store
        .claim_knowledge_jobs(10, Duration::from_millis(500), 3)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        document(&app, &app.key, &base, &id).await["status"],
        "indexing"
    );

    let (_, _survivor) = app.second_replica_with(|c| c.knowledge.indexers = 2).await;
    let done = settled(&app, &app.key, &base, &id).await;
    assert_eq!(done["status"], "ready", "{done}");
    let attempts: i32 =
        sqlx::query_scalar("SELECT attempts FROM knowledge_documents WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(attempts, 2);
    // The dead replica's write, had it come back, is fenced off.
    let late = app
        .store
        .finish_knowledge_job(&dead[0], None, &[], store::ChunkVectors::None, 1000)
        .await
        .unwrap();
    assert_eq!(late, store::JobEnd::Lost);
    assert!(!passages(&app, &app.key, &base, "password").await.is_empty());
}

/// `POST /v1/agents` with `knowledge_bases` and `knowledge_recall`.
async fn create_agent_with(app: &TestApp, bearer: &str, extra: Value) -> Response {
    let mut body = json!({"name": "librarian", "system_prompt": "Answer from the handbook.",
                          "model": "openai/gpt-test"});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    app.http
        .post(format!("{}/v1/agents", app.url))
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn patch_agent(app: &TestApp, agent: &str, body: Value) -> Response {
    app.http
        .patch(format!("{}/v1/agents/{agent}", app.url))
        .bearer_auth(&app.key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// X1 over knowledge: an admin searches any base of its team; a chat-scoped key only a base
/// an agent of the team names (that agent's `knowledge_search` answers the same passages to
/// whoever may chat with it), any other base `403 forbidden`, and it reads no base, listing
/// or document (`403`); another team's base is `404` to both.
#[tokio::test]
async fn a_chat_key_searches_only_bases_an_agent_names() {
    let app = TestApp::start().await;
    let chat_key = app.chat_key().await;
    let base = create_base(&app, &app.key, "Handbook").await;
    let doc = upload(&app, &app.key, &base, "faq.txt", FAQ).await;
    assert_eq!(
        settled(&app, &app.key, &base, &doc).await["status"],
        "ready"
    );

    assert!(!passages(&app, &app.key, &base, "espresso").await.is_empty());
    let (status, code) = error_code(search_as(&app, &chat_key, &base, "espresso").await).await;
    assert_eq!((status, code.as_str()), (403, "forbidden"));
    for path in [
        "/v1/knowledge".to_owned(),
        format!("/v1/knowledge/{base}"),
        format!("/v1/knowledge/{base}/documents"),
        format!("/v1/knowledge/{base}/documents/{doc}"),
    ] {
        let (status, code) = error_code(get_as(&app, &chat_key, &path).await).await;
        assert_eq!((status, code.as_str()), (403, "forbidden"), "{path}");
    }

    // Named by an agent, the base answers the chat key what the agent's tool would.
    let created = create_agent_with(&app, &app.key, json!({"knowledge_bases": [base]})).await;
    assert_eq!(created.status(), 201);
    let agent: Value = created.json().await.unwrap();
    let agent = agent["id"].as_str().unwrap();
    assert!(
        !passages(&app, &chat_key, &base, "espresso")
            .await
            .is_empty()
    );
    // No longer named: refused again.
    assert_eq!(
        patch_agent(&app, agent, json!({"knowledge_bases": []}))
            .await
            .status(),
        200
    );
    let (status, code) = error_code(search_as(&app, &chat_key, &base, "espresso").await).await;
    assert_eq!((status, code.as_str()), (403, "forbidden"));

    // Another team's base, named by its agent or not, is absent to every key of ours.
    let other = app.store.create_team("other team").await.unwrap().api_key;
    let theirs = create_base(&app, &other, "Theirs").await;
    assert_eq!(
        create_agent_with(&app, &other, json!({"knowledge_bases": [theirs]}))
            .await
            .status(),
        201
    );
    for bearer in [&app.key, &chat_key] {
        let (status, code) = error_code(search_as(&app, bearer, &theirs, "espresso").await).await;
        assert_eq!((status, code.as_str()), (404, "not_found"));
    }
}

/// L5: creating, changing and deleting a base, and uploading and deleting a document, are
/// each an entry of the audit log naming the admin key and the object, never a
/// document's name or content; a refused upload writes none.
#[tokio::test]
async fn knowledge_changes_are_in_the_audit_log() {
    let app = TestApp::start_with(|c| c.knowledge.max_documents = 1).await;
    let base = create_base(&app, &app.key, "Handbook").await;
    let patched = app
        .http
        .patch(format!("{}/v1/knowledge/{base}", app.url))
        .bearer_auth(&app.key)
        .json(&json!({"description": "How we work"}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);
    let doc = upload(&app, &app.key, &base, "secret-plans.txt", FAQ).await;
    let (status, _) = error_code(upload_as(&app, &app.key, &base, "more.txt", FAQ).await).await;
    assert_eq!(status, 429);
    for path in [
        format!("/v1/knowledge/{base}/documents/{doc}"),
        format!("/v1/knowledge/{base}"),
    ] {
        let deleted = app
            .auth(app.http.delete(format!("{}{path}", app.url)))
            .send()
            .await
            .unwrap();
        assert_eq!(deleted.status(), 204, "{path}");
    }

    let log: Value = get_as(&app, &app.key, "/v1/audit?limit=200")
        .await
        .json()
        .await
        .unwrap();
    let entries: Vec<(&str, &str, &str, Value)> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"].as_str().unwrap().starts_with("knowledge."))
        .map(|e| {
            assert_eq!(e["actor_kind"], "key", "{e}");
            (
                e["action"].as_str().unwrap(),
                e["object_kind"].as_str().unwrap(),
                e["object_id"].as_str().unwrap(),
                e["details"].clone(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            (
                "knowledge.deleted",
                "knowledge_base",
                base.as_str(),
                json!({"documents": 0})
            ),
            (
                "knowledge.document_deleted",
                "knowledge_document",
                doc.as_str(),
                json!({"knowledge_id": base})
            ),
            (
                "knowledge.document_added",
                "knowledge_document",
                doc.as_str(),
                json!({"knowledge_id": base, "media_type": "text/plain"})
            ),
            (
                "knowledge.updated",
                "knowledge_base",
                base.as_str(),
                json!({"fields": ["description"]})
            ),
            (
                "knowledge.created",
                "knowledge_base",
                base.as_str(),
                json!({"name": "Handbook"})
            ),
        ]
    );
    let text = log.to_string();
    assert!(
        !text.contains("secret-plans") && !text.contains("espresso"),
        "{text}"
    );
}

/// B5: an agent names only its team's bases: another team's id or an unknown one is
/// `400 unknown_knowledge_base` at create and patch; a base deleted after the agent named
/// it blocks no other change.
#[tokio::test]
async fn an_agent_names_only_its_teams_knowledge_bases() {
    let app = TestApp::start().await;
    let ours = create_base(&app, &app.key, "Ours").await;
    let other = app.store.create_team("other team").await.unwrap().api_key;
    let theirs = create_base(&app, &other, "Theirs").await;

    for ids in [
        json!([theirs]),
        json!([ours, theirs]),
        json!([uuid::Uuid::new_v4()]),
    ] {
        let refused = create_agent_with(&app, &app.key, json!({"knowledge_bases": ids})).await;
        assert_eq!(
            error_code(refused).await,
            (400, "unknown_knowledge_base".into())
        );
    }
    let created = create_agent_with(
        &app,
        &app.key,
        json!({"knowledge_bases": [ours, ours], "knowledge_recall": "auto"}),
    )
    .await;
    assert_eq!(created.status(), 201);
    let agent: Value = created.json().await.unwrap();
    assert_eq!(agent["knowledge_bases"], json!([ours]));
    assert_eq!(agent["knowledge_recall"], "auto");
    let id = agent["id"].as_str().unwrap();

    let refused = patch_agent(&app, id, json!({"knowledge_bases": [theirs]})).await;
    assert_eq!(
        error_code(refused).await,
        (400, "unknown_knowledge_base".into())
    );
    let refused = patch_agent(&app, id, json!({"knowledge_recall": "sometimes"})).await;
    assert_eq!(refused.status(), 400);

    let deleted = app
        .http
        .delete(format!("{}/v1/knowledge/{ours}", app.url))
        .bearer_auth(&app.key)
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success());
    let changed = patch_agent(&app, id, json!({"system_prompt": "Be brief."})).await;
    assert_eq!(changed.status(), 200);
    let none = patch_agent(&app, id, json!({"knowledge_bases": []})).await;
    assert_eq!(none.status(), 200);
    let agent: Value = none.json().await.unwrap();
    assert_eq!(agent["knowledge_bases"], json!([]));
}

/// A base holding the handbook, indexed, and an agent naming it (`extra` adds fields):
/// the agent's id and a chat of it, and the handbook's document id.
async fn librarian(app: &TestApp, extra: Value) -> (String, String, String) {
    let base = create_base(app, &app.key, "Handbook").await;
    let handbook = upload(app, &app.key, &base, "handbook.md", HANDBOOK).await;
    assert_eq!(
        settled(app, &app.key, &base, &handbook).await["status"],
        "ready"
    );
    let mut fields = json!({"knowledge_bases": [base]});
    fields
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let created = create_agent_with(app, &app.key, fields).await;
    assert_eq!(created.status(), 201);
    let agent: Value = created.json().await.unwrap();
    let agent = agent["id"].as_str().unwrap().to_owned();
    let chat = app.new_chat(&agent).await;
    (agent, chat, handbook)
}

/// Whether a model request offered the tool `name`.
fn offers(request: &Value, name: &str) -> bool {
    request["tools"]
        .to_string()
        .contains(&format!("\"{name}\""))
}

/// B5: an agent with a base is offered `knowledge_search`; the tool answers the passage
/// with its source, each passage is streamed as a `source-document` chunk after the
/// output and kept in the transcript as the same part; another team's passages never
/// answer.
#[tokio::test]
async fn knowledge_search_answers_passages_and_streams_their_sources() {
    let app = TestApp::start().await;
    let other = app.store.create_team("other team").await.unwrap().api_key;
    let theirs = create_base(&app, &other, "Theirs").await;
    let their_doc = upload(&app, &other, &theirs, "faq.txt", FAQ).await;
    settled(&app, &other, &theirs, &their_doc).await;
    let (_, chat, handbook) = librarian(&app, json!({})).await;

    let args = json!({"query": "reset a forgotten password", "limit": 3});
    app.provider
        .push(calls(vec![call("c1", "knowledge_search", args)]));
    app.provider.push(text("Use the Forgot password link."));
    let chunks = send_as(&app, &app.key, &chat, "How do I reset my password?").await;

    let output = chunks
        .iter()
        .find_map(|c| match c {
            UiChunk::ToolOutputAvailable { output, .. } => Some(output.as_str().unwrap()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool output: {chunks:?}"));
    let output: Value = serde_json::from_str(output).unwrap();
    let passages = output["passages"].as_array().unwrap();
    assert!(!passages.is_empty() && passages.len() <= 3, "{output}");
    let first = &passages[0];
    assert_eq!(first["document_id"], handbook.as_str());
    assert_eq!(first["filename"], "handbook.md");
    assert_eq!(first["title"], "Team Handbook");
    assert!(
        first["heading"].as_str().unwrap().contains("Passwords"),
        "{first}"
    );
    assert!(
        first["text"].as_str().unwrap().contains("thirty minutes"),
        "{first}"
    );
    assert!(first["position"].is_i64());
    assert!(
        passages
            .iter()
            .all(|p| p["document_id"] == handbook.as_str()),
        "another team's passage answered: {output}"
    );

    let sources: Vec<(&str, &str, &str, Option<&str>)> = chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::SourceDocument {
                source_id,
                media_type,
                title,
                filename,
            } => Some((
                source_id.as_str(),
                media_type.as_str(),
                title.as_str(),
                filename.as_deref(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(sources.len(), passages.len(), "{chunks:?}");
    let expected_id = format!("{handbook}:{}", first["position"]);
    assert_eq!(sources[0].0, expected_id);
    assert_eq!(sources[0].1, "text/markdown");
    assert!(sources[0].2.contains("Passwords"), "{sources:?}");
    assert_eq!(sources[0].3, Some("handbook.md"));
    let output_at = chunks
        .iter()
        .position(|c| matches!(c, UiChunk::ToolOutputAvailable { .. }))
        .unwrap();
    let source_at = chunks
        .iter()
        .position(|c| matches!(c, UiChunk::SourceDocument { .. }))
        .unwrap();
    assert!(output_at < source_at, "{chunks:?}");

    let messages = app.messages(&chat).await;
    let answer = messages.last().unwrap();
    let parts = answer["parts"].as_array().unwrap();
    let stored: Vec<&Value> = parts
        .iter()
        .filter(|p| p["type"] == "source-document")
        .collect();
    assert_eq!(stored.len(), sources.len(), "{answer}");
    assert_eq!(
        stored[0],
        &json!({"type": "source-document", "sourceId": expected_id,
                "mediaType": "text/markdown", "title": sources[0].2,
                "filename": "handbook.md"})
    );
    let tool_at = parts
        .iter()
        .position(|p| p["type"] == "tool-knowledge_search")
        .unwrap();
    let stored_at = parts
        .iter()
        .position(|p| p["type"] == "source-document")
        .unwrap();
    assert_eq!(stored_at, tool_at + 1, "{answer}");

    let requests = app.provider.requests();
    assert!(offers(&requests[0].body, "knowledge_search"));
    // Recall is off by default: the passage came only through the tool.
    assert!(
        !requests[0].body["messages"]
            .to_string()
            .contains("thirty minutes")
    );
}

/// B5 in a real browser (tests/web/knowledge.mjs): the passage `knowledge_search` found
/// shows as a citation under the answer in the web chat, live and after a reload, naming
/// the passage the transcript keeps.
#[tokio::test]
async fn the_page_shows_a_knowledge_citation_under_the_answer() {
    let app = TestApp::start().await;
    let (_, _, handbook) = librarian(&app, json!({})).await;
    let args = json!({"query": "reset a forgotten password", "limit": 1});
    app.provider
        .push(calls(vec![call("c1", "knowledge_search", args)]));
    app.provider.push(text("Use the Forgot password link."));

    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-chat");
    let run = crate::web_chat::page_script(
        "knowledge.mjs",
        &[
            &app.url,
            &app.key,
            "librarian",
            "How do I reset my password?",
            "Use the Forgot password link.",
            "Source: Team Handbook > Security > Passwords (handbook.md)",
            &handbook,
            out.to_str().unwrap(),
        ],
    )
    .await;
    assert!(
        run.status.success(),
        "the page did not show the citation:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let ids: Value = serde_json::from_slice(&run.stdout).unwrap();
    let messages = app.messages(ids["chatId"].as_str().unwrap()).await;
    let parts = messages.last().unwrap()["parts"].as_array().unwrap();
    let sources: Vec<&Value> = parts
        .iter()
        .filter(|p| p["type"] == "source-document")
        .collect();
    assert_eq!(sources.len(), 1, "{parts:?}");
    assert!(
        sources[0]["sourceId"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{handbook}:"))
    );
    for shot in ["knowledge-cited", "knowledge-reloaded"] {
        assert!(out.join(format!("{shot}.png")).is_file(), "{shot} saved");
    }
}

/// An agent that names no base is not offered `knowledge_search`.
#[tokio::test]
async fn an_agent_without_bases_is_not_offered_knowledge_search() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    app.provider.push(text("Hello."));
    send_as(&app, &app.key, &chat, "hi").await;
    let request = app.provider.requests().pop().unwrap();
    assert!(offers(&request.body, "memory_search"), "{}", request.body);
    assert!(!offers(&request.body, "knowledge_search"));
}

/// `knowledge_recall: "auto"` puts the passages matching the user's message into the
/// turn's request just before that message, without a tool call; each passage put there
/// is streamed as a `source-document` chunk when the answer's stream opens and kept first
/// in the answer's parts, as a `knowledge_search` call's are.
#[tokio::test]
async fn auto_recall_puts_matching_passages_into_the_prompt() {
    let app = TestApp::start().await;
    let (_, chat, handbook) = librarian(&app, json!({"knowledge_recall": "auto"})).await;
    app.provider.push(text("Use the link."));
    let chunks = send_as(
        &app,
        &app.key,
        &chat,
        "How do I reset a forgotten password?",
    )
    .await;
    let streamed: Vec<String> = chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::SourceDocument { source_id, .. } => Some(source_id.clone()),
            _ => None,
        })
        .collect();
    assert!(!streamed.is_empty(), "{chunks:?}");
    assert!(
        streamed
            .iter()
            .all(|id| id.starts_with(&format!("{handbook}:"))),
        "{streamed:?}"
    );
    let first_source = chunks
        .iter()
        .position(|c| matches!(c, UiChunk::SourceDocument { .. }))
        .unwrap();
    let first_text = chunks
        .iter()
        .position(|c| matches!(c, UiChunk::TextDelta { .. }))
        .unwrap();
    assert!(first_source < first_text, "{chunks:?}");
    let answer = app.messages(&chat).await.pop().unwrap();
    let stored: Vec<&str> = answer["parts"]
        .as_array()
        .unwrap()
        .iter()
        .take_while(|p| p["type"] == "source-document")
        .map(|p| p["sourceId"].as_str().unwrap())
        .collect();
    assert_eq!(stored, streamed, "{answer}");
    let request = app.provider.requests().pop().unwrap();
    let messages: Vec<String> = request.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(Value::to_string)
        .collect();
    let recalled = messages
        .iter()
        .position(|m| m.contains("Passages of your knowledge bases"))
        .unwrap_or_else(|| panic!("no recalled passages: {messages:?}"));
    assert!(messages[recalled].contains("thirty minutes"));
    assert!(messages[recalled].contains(&handbook));
    assert!(messages[recalled].contains("handbook.md"));
    for id in &streamed {
        let position = id.rsplit_once(':').unwrap().1;
        assert!(
            messages[recalled].contains(&format!("{handbook}, passage {position}")),
            "a streamed source the prompt does not hold: {id}"
        );
    }
    let asked = messages
        .iter()
        .rposition(|m| m.contains("reset a forgotten password?"))
        .unwrap();
    assert_eq!(recalled + 1, asked, "{messages:?}");
}

/// A document whose words are not a question's but whose meaning is, per the scripted
/// provider's embeddings (its synonym groups: "vacation" and "holiday", "salary" and
/// "pay").
const VACATION: &[u8] = b"# Benefits\n\n\
    Staff get twenty-five days of paid vacation every year, booked in the team calendar.\n\n\
    ## Printers\n\nThe printers are on the second floor, beside the kitchen.\n";
const MEANING: &str = "annual holiday allowance";

/// A brain whose teams may hold provider connections (their keys sealed) on this
/// machine's scripted provider.
async fn embedding_app() -> TestApp {
    TestApp::start_with(|c| {
        c.secrets_key = Some(store::SecretsKey::parse(crate::webhooks::KEY_HEX).unwrap());
        c.providers_allow_private_networks = true;
    })
    .await
}

/// The body of `POST /v1/knowledge/{base}/search` as `bearer`.
async fn search_body(app: &TestApp, bearer: &str, base: &str, query: &str) -> Value {
    let response = search_as(app, bearer, base, query).await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// A team connection `name` at `base_url`, and the team's `embedding` route on it.
async fn embedding_route(app: &TestApp, bearer: &str, name: &str, base_url: &str) {
    let created = app
        .http
        .post(format!("{}/v1/providers", app.url))
        .bearer_auth(bearer)
        .json(
            &json!({"name": name, "kind": "openai", "base_url": base_url,
                      "api_key": "sk-t", "models": [{"model": "embed"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
    let set = app
        .http
        .put(format!("{}/v1/team/settings", app.url))
        .bearer_auth(bearer)
        .json(&json!({"auxiliary_models": {"embedding": format!("{name}/embed")}}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200, "{}", set.text().await.unwrap());
}

/// B6: without an embedding route a question that shares no word with a passage finds
/// nothing (the search is lexical, as before); with the team's route on the scripted
/// provider's `/v1/embeddings`, a document uploaded then has its passages embedded and the
/// same question finds the passage by its meaning (hybrid: lexical and vector candidates
/// fused), while a document indexed before the route stays lexical. Each embedding call is
/// a usage event of the route. Deleting the document deletes its vectors and it is in no
/// answer; authority is unchanged: a chat key still needs an agent naming the base, and
/// another team's hybrid search never answers our passages.
#[tokio::test]
async fn hybrid_search_finds_a_passage_by_its_meaning() {
    let app = embedding_app().await;
    let key = app.key.clone();
    let base = create_base(&app, &key, "Benefits").await;
    let before = upload(&app, &key, &base, "before.md", VACATION).await;
    let indexed = settled(&app, &key, &base, &before).await;
    assert_eq!(indexed["status"], "ready");
    assert!(indexed.get("embedding_model").is_none(), "{indexed}");
    let lexical = search_body(&app, &key, &base, MEANING).await;
    assert_eq!(lexical["mode"], "lexical");
    assert_eq!(
        lexical["passages"],
        json!([]),
        "no word of the question is in it"
    );
    assert!(lexical.get("note").is_none());

    embedding_route(&app, &key, "team", &app.provider.openai_base_url()).await;
    let doc = upload(&app, &key, &base, "benefits.md", VACATION).await;
    let embedded = settled(&app, &key, &base, &doc).await;
    assert_eq!(embedded["status"], "ready", "{embedded}");
    assert_eq!(embedded["embedding_model"], "team/embed", "{embedded}");
    let vectors: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM knowledge_chunks WHERE document_id = $1::uuid \
         AND embedding IS NOT NULL AND length(embedding_bits) = 256",
    )
    .bind(&doc)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(vectors, embedded["chunks"].as_i64().unwrap());

    let hybrid = search_body(&app, &key, &base, MEANING).await;
    assert_eq!(hybrid["mode"], "hybrid", "{hybrid}");
    let found = hybrid["passages"].as_array().unwrap();
    assert_eq!(found[0]["document_id"], doc.as_str(), "{hybrid}");
    assert!(found[0]["text"].as_str().unwrap().contains("paid vacation"));
    assert!(
        found.iter().all(|p| p["document_id"] == doc.as_str()),
        "the document indexed before the route has no vectors: {hybrid}"
    );
    // A question with the passage's own words still finds it first.
    let words = search_body(&app, &key, &base, "printers second floor").await;
    assert!(
        words["passages"][0]["text"]
            .as_str()
            .unwrap()
            .contains("printers")
    );
    let billed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM billing_events WHERE team_id = (SELECT team_id FROM \
         knowledge_bases WHERE id = $1::uuid) AND model = 'team/embed' AND input_tokens > 0",
    )
    .bind(&base)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert!(
        billed >= 3,
        "the indexing's call and the two queries': {billed}"
    );

    // Authority as before: a chat key reads only bases an agent names.
    let chat_key = app.chat_key().await;
    let (status, code) = error_code(search_as(&app, &chat_key, &base, MEANING).await).await;
    assert_eq!((status, code.as_str()), (403, "forbidden"));
    let other = app.store.create_team("other team").await.unwrap().api_key;
    embedding_route(&app, &other, "theirs", &app.provider.openai_base_url()).await;
    let theirs = create_base(&app, &other, "Theirs").await;
    let their_doc = upload(&app, &other, &theirs, "faq.txt", FAQ).await;
    assert_eq!(
        settled(&app, &other, &theirs, &their_doc).await["status"],
        "ready"
    );
    let (status, _) = error_code(search_as(&app, &other, &base, MEANING).await).await;
    assert_eq!(status, 404);
    let across = search_body(&app, &other, &theirs, MEANING).await;
    assert!(
        across["passages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["document_id"] == their_doc.as_str()),
        "{across}"
    );

    // An agent may not name its own embedding route: the team's embeds the passages.
    let refused = create_agent_with(
        &app,
        &key,
        json!({"auxiliary_models": {"embedding": "team/embed"}}),
    )
    .await;
    let (status, code) = error_code(refused).await;
    assert_eq!((status, code.as_str()), (400, "invalid_request"));

    let deleted = app
        .auth(
            app.http
                .delete(format!("{}/v1/knowledge/{base}/documents/{doc}", app.url)),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM knowledge_chunks WHERE document_id = $1::uuid")
            .bind(&doc)
            .fetch_one(app.store.pool())
            .await
            .unwrap();
    assert_eq!(left, 0, "its passages and their vectors are gone");
    let after = search_body(&app, &key, &base, MEANING).await;
    assert_eq!(after["mode"], "hybrid");
    assert_eq!(after["passages"], json!([]), "{after}");
}

/// B6: an embedding route that cannot be reached never fails the lexical index: the
/// document is `ready`, searched by its words, with the reason its passages were not
/// embedded; a search then answers the lexical passages with a note saying why.
#[tokio::test]
async fn a_failing_embedding_route_leaves_search_lexical() {
    let app = embedding_app().await;
    let key = app.key.clone();
    // Nothing listens on the discard port: every call is refused at once.
    embedding_route(&app, &key, "dead", "http://127.0.0.1:9/v1").await;
    let base = create_base(&app, &key, "Benefits").await;
    let doc = upload(&app, &key, &base, "benefits.md", VACATION).await;
    let indexed = settled(&app, &key, &base, &doc).await;
    assert_eq!(indexed["status"], "ready", "{indexed}");
    assert!(indexed.get("embedding_model").is_none(), "{indexed}");
    let reason = indexed["embedding_error"].as_str().unwrap();
    assert!(reason.contains("embedding call failed"), "{reason}");
    let vectors: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM knowledge_chunks WHERE document_id = $1::uuid \
         AND embedding IS NOT NULL",
    )
    .bind(&doc)
    .fetch_one(app.store.pool())
    .await
    .unwrap();
    assert_eq!(vectors, 0);

    let found = search_body(&app, &key, &base, "paid vacation").await;
    assert_eq!(found["mode"], "lexical");
    assert!(
        found["note"].as_str().unwrap().contains("words only"),
        "{found}"
    );
    assert_eq!(found["passages"][0]["document_id"], doc.as_str());
    let meaning = search_body(&app, &key, &base, MEANING).await;
    assert_eq!(meaning["passages"], json!([]));
}
