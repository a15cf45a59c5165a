//! The artifact store (SPEC "object storage", W8): both real backends, the download API
//! and its tenancy, the size limit.
//!
//! The S3 tests run against a real S3-protocol server, s3s-fs, started here on a free
//! port with a temporary directory and its own keys. It checks SigV4 signatures, so a
//! wrong secret is refused as it would be by S3. `scripts/test-deps.sh` installs it; the
//! tests fail (they do not skip) when it is missing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::TestApp;
use crate::common::error_code;
use brain::error::ApiError;
use bytes::Bytes;
use engine::artifacts::{
    ArtifactError, ArtifactOwner, ArtifactStore, LocalDirStore, S3Store, SaveError, save_artifact,
};
use engine::config::{ArtifactBackend, S3Config, S3Credentials};
use protocol::{AgentId, ChatId, ErrorCode};
use serde_json::Value;
use sha2::{Digest, Sha256};

const S3S_FS: &str = "/var/tmp/agent-runtime-tools/bin/s3s-fs";
const MAX: usize = 25 << 20;

/// A directory of its own under the system temp dir, removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    fn new(what: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("brain-{what}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Bytes that are not text and span several read chunks.
fn payload(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 7)) as u8)
        .collect::<Vec<u8>>()
        .into()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn owner_of(app: &TestApp) -> ArtifactOwner {
    let (agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    ArtifactOwner {
        team: app.team,
        agent: agent.parse::<AgentId>().unwrap(),
        chat: Some(chat.parse::<ChatId>().unwrap()),
        turn: None,
    }
}

/// Downloads `id` and checks every header against what was saved.
async fn download_matches(app: &TestApp, id: &str, bytes: &[u8], name_header: &str) {
    let response = app.get(&format!("/v1/artifacts/{id}")).await;
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    let header = |name: &str| headers.get(name).unwrap().to_str().unwrap().to_owned();
    assert_eq!(header("content-type"), "application/octet-stream");
    assert_eq!(header("content-length"), bytes.len().to_string());
    assert_eq!(header("content-disposition"), name_header);
    assert_eq!(header("etag"), format!("\"{}\"", sha256_hex(bytes)));
    assert_eq!(header("x-content-type-options"), "nosniff");
    let body = response.bytes().await.unwrap();
    assert!(body == bytes, "downloaded bytes differ from the saved ones");
}

#[tokio::test]
async fn local_backend_saves_and_serves_to_the_owning_team_only() {
    let dir = TempDir::new("artifacts");
    let root = dir.0.clone();
    let app =
        TestApp::start_with(|c| c.artifacts.backend = ArtifactBackend::Local { dir: root }).await;
    let owner = owner_of(&app).await;
    let backend = LocalDirStore::new(&dir.0);
    let bytes = payload(300_000);
    let row = save_artifact(
        &app.store,
        &backend,
        MAX,
        owner,
        "../report \"Q3\".bin",
        "application/octet-stream",
        bytes.clone(),
    )
    .await
    .unwrap();
    assert_eq!(row.size_bytes, 300_000);
    assert_eq!(row.sha256, sha256_hex(&bytes));
    assert_eq!(row.storage_key, format!("{}/{}", app.team, row.id));
    // The bytes sit under generated ids, whatever the name; no temporary file is left.
    assert_eq!(
        files_under(&dir.0),
        vec![dir.0.join(app.team.to_string()).join(row.id.to_string())]
    );

    let id = row.id.to_string();
    download_matches(
        &app,
        &id,
        &bytes,
        "attachment; filename=\"report _Q3_.bin\"; filename*=UTF-8''report%20%22Q3%22.bin",
    )
    .await;

    let meta = app.get(&format!("/v1/artifacts/{id}/meta")).await;
    assert_eq!(meta.status(), 200);
    let meta: Value = meta.json().await.unwrap();
    assert_eq!(meta["id"], id.as_str());
    assert_eq!(meta["team_id"], app.team.to_string());
    assert_eq!(meta["agent_id"], owner.agent.to_string());
    assert_eq!(meta["chat_id"], owner.chat.unwrap().to_string());
    assert_eq!(meta["turn_id"], Value::Null);
    assert_eq!(meta["name"], "../report \"Q3\".bin");
    assert_eq!(meta["content_type"], "application/octet-stream");
    assert_eq!(meta["size_bytes"], 300_000);
    assert_eq!(meta["sha256"], sha256_hex(&bytes));
    assert!(meta["created_at"].is_string());
    assert!(
        meta.get("storage_key").is_none(),
        "the storage key is internal"
    );

    // A client that has it already gets 304 without the bytes.
    let cached = app
        .auth(app.http.get(format!("{}/v1/artifacts/{id}", app.url)))
        .header("if-none-match", format!("\"{}\"", row.sha256))
        .send()
        .await
        .unwrap();
    assert_eq!(cached.status(), 304);

    // Another team, an unknown id and a malformed id all look the same: 404.
    let other = app.store.create_team("other").await.unwrap();
    for path in [
        format!("/v1/artifacts/{id}"),
        format!("/v1/artifacts/{id}/meta"),
    ] {
        let response = app
            .http
            .get(format!("{}{path}", app.url))
            .bearer_auth(&other.api_key)
            .send()
            .await
            .unwrap();
        assert_eq!(
            error_code(response).await,
            (404, "not_found".into()),
            "{path}"
        );
    }
    for path in [
        format!("/v1/artifacts/{}", uuid::Uuid::now_v7()),
        "/v1/artifacts/not-a-uuid".to_owned(),
        "/v1/artifacts/..%2F..%2Fetc%2Fpasswd".to_owned(),
        "/v1/artifacts/not-a-uuid/meta".to_owned(),
    ] {
        assert_eq!(
            error_code(app.get(&path).await).await,
            (404, "not_found".into()),
            "{path}"
        );
    }
    let unauthenticated = app
        .http
        .get(format!("{}/v1/artifacts/{id}", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), 401);

    // The row outlives bytes that vanished, and the client sees a missing artifact.
    backend.delete(&row.storage_key).await.unwrap();
    assert_eq!(
        error_code(app.get(&format!("/v1/artifacts/{id}")).await).await,
        (404, "not_found".into())
    );
}

#[tokio::test]
async fn the_size_limit_and_bad_metadata_write_nothing() {
    let dir = TempDir::new("artifacts-limit");
    let app = TestApp::start().await;
    let owner = owner_of(&app).await;
    let backend = LocalDirStore::new(&dir.0);

    let limit = 1000;
    let err = save_artifact(
        &app.store,
        &backend,
        limit,
        owner,
        "big.bin",
        "application/octet-stream",
        payload(limit + 1),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, SaveError::TooLarge { limit: 1000 }),
        "{err:?}"
    );
    assert_eq!(ApiError::from(err).code(), ErrorCode::PayloadTooLarge);
    // Exactly the limit is fine.
    save_artifact(
        &app.store,
        &backend,
        limit,
        owner,
        "fits.bin",
        "application/octet-stream",
        payload(limit),
    )
    .await
    .unwrap();
    assert_eq!(files_under(&dir.0).len(), 1);

    for (name, content_type) in [
        ("", "text/plain"),
        ("line\nbreak.txt", "text/plain"),
        ("ok.txt", "text/plain\r\nX-Evil: 1"),
        ("ok.txt", "plain"),
    ] {
        let err = save_artifact(
            &app.store,
            &backend,
            limit,
            owner,
            name,
            content_type,
            payload(10),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, SaveError::Invalid(_)),
            "{name:?} {content_type:?}"
        );
        assert_eq!(ApiError::from(err).code(), ErrorCode::InvalidRequest);
    }

    // An agent of another team: the row is refused and the bytes are removed again.
    let other = app.store.create_team("other").await.unwrap();
    let foreign = ArtifactOwner {
        team: other.team_id,
        ..owner
    };
    let err = save_artifact(
        &app.store,
        &backend,
        limit,
        foreign,
        "x.bin",
        "application/octet-stream",
        payload(10),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, SaveError::Store(store::StoreError::NotFound)),
        "{err:?}"
    );
    assert_eq!(
        files_under(&dir.0).len(),
        1,
        "the orphan bytes were removed"
    );

    let rows: (i64,) = sqlx::query_as("SELECT count(*) FROM artifacts")
        .fetch_one(app.store.pool())
        .await
        .unwrap();
    assert_eq!(rows.0, 1);
}

/// A running s3s-fs, killed (and its directory removed) on drop.
pub(crate) struct S3sFs {
    child: Child,
    endpoint: String,
    pub(crate) root: TempDir,
}

pub(crate) const ACCESS_KEY: &str = "brain-test-access";
pub(crate) const SECRET_KEY: &str = "brain-test-secret-0123456789";
pub(crate) const BUCKET: &str = "artifacts";

impl S3sFs {
    pub(crate) fn start() -> Self {
        assert!(
            Path::new(S3S_FS).is_file(),
            "{S3S_FS} is missing: run scripts/test-deps.sh (it installs s3s-fs 0.14.1)"
        );
        let root = TempDir::new("s3s-fs");
        // s3s-fs maps a bucket to a directory under its root.
        std::fs::create_dir(root.0.join(BUCKET)).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(S3S_FS)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(&root.0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut server = Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            root,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!("s3s-fs exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "s3s-fs did not listen within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    pub(crate) fn config(&self, secret: &str) -> S3Config {
        S3Config {
            bucket: BUCKET.into(),
            endpoint: Some(self.endpoint.clone()),
            region: "us-east-1".into(),
            force_path_style: true,
            credentials: S3Credentials {
                access_key_id: ACCESS_KEY.into(),
                secret_access_key: secret.into(),
                session_token: None,
            },
        }
    }
}

impl Drop for S3sFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A body of `len` bytes of [`payload`] in pieces of `piece` bytes, failing after
/// `fail_after` pieces when given.
fn pieces(len: usize, piece: usize, fail_after: Option<usize>) -> engine::artifacts::ByteStream {
    let all = payload(len);
    let items: Vec<_> = (0..len)
        .step_by(piece)
        .map(|at| Ok(all.slice(at..(at + piece).min(len))))
        .enumerate()
        .map(|(n, item)| match fail_after {
            Some(after) if n >= after => Err(ArtifactError::Source("broke off")),
            _ => item,
        })
        .collect();
    Box::pin(futures_util::stream::iter(items))
}

/// A body larger than a part goes up as a multipart upload, part by part; one that breaks
/// off half-way stores nothing, and its upload is aborted.
#[tokio::test]
async fn s3_backend_streams_a_large_body_in_parts() {
    let server = S3sFs::start();
    let store = S3Store::new(&server.config(SECRET_KEY));
    let bucket = server.root.0.join(BUCKET);
    let key = format!("{}/{}", uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let len = (20 << 20) + 12_345;
    let stored = store
        .put_stream(&key, pieces(len, 1 << 20, None), "application/zstd")
        .await
        .unwrap();
    assert_eq!(stored, len as u64);
    assert!(std::fs::read(bucket.join(&key)).unwrap() == payload(len)[..]);
    assert!(store.get(&key).await.unwrap().collect().await.unwrap() == payload(len));
    // The server's files for the stored object (its bytes and metadata).
    let kept = files_under(&server.root.0);

    let broken = format!("{}/{}", uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let err = store
        .put_stream(&broken, pieces(len, 1 << 20, Some(12)), "application/zstd")
        .await
        .unwrap_err();
    assert!(matches!(err, ArtifactError::Source(_)), "{err:?}");
    assert!(matches!(
        store.get(&broken).await.err(),
        Some(ArtifactError::NotFound)
    ));
    // The aborted upload's parts are gone from the server: only the stored object's files
    // are left.
    let deadline = Instant::now() + Duration::from_secs(10);
    while files_under(&server.root.0) != kept {
        assert!(
            Instant::now() < deadline,
            "the broken upload was not aborted: {:?}",
            files_under(&server.root.0)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn s3_backend_round_trip_against_s3s_fs() {
    let server = S3sFs::start();
    let store = S3Store::new(&server.config(SECRET_KEY));
    let key = format!("{}/{}", uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let bytes = payload(200_000);

    assert!(matches!(
        store.get(&key).await.err(),
        Some(ArtifactError::NotFound)
    ));
    store.put(&key, bytes.clone(), "image/png").await.unwrap();
    // The object really is in the server's bucket directory.
    assert_eq!(
        std::fs::read(server.root.0.join(BUCKET).join(&key)).unwrap(),
        &bytes[..]
    );
    let body = store.get(&key).await.unwrap();
    assert_eq!(body.size, 200_000);
    assert!(body.collect().await.unwrap() == bytes);

    store.delete(&key).await.unwrap();
    assert!(matches!(
        store.get(&key).await.err(),
        Some(ArtifactError::NotFound)
    ));
    store.delete(&key).await.unwrap();
    assert!(matches!(
        store.put("../escape", Bytes::new(), "text/plain").await,
        Err(ArtifactError::InvalidKey)
    ));

    // A wrong secret key: the server checks the signature and refuses.
    let wrong = S3Store::new(&server.config("not-the-secret"));
    for err in [
        wrong
            .put(&key, Bytes::from_static(b"x"), "text/plain")
            .await
            .unwrap_err(),
        wrong.get(&key).await.err().unwrap(),
    ] {
        assert!(matches!(err, ArtifactError::Denied(_)), "{err:?}");
        assert_eq!(err.metric_label(), "denied");
        assert!(!format!("{err:?} {err}").contains("not-the-secret"));
        assert_eq!(ApiError::from(err).code(), ErrorCode::StorageUnavailable);
    }
    assert!(
        !server.root.0.join(BUCKET).join(&key).exists(),
        "a refused put stored nothing"
    );
    let mut unknown_key = server.config(SECRET_KEY);
    unknown_key.credentials.access_key_id = "someone-else".into();
    let err = S3Store::new(&unknown_key).get(&key).await.err().unwrap();
    assert!(matches!(err, ArtifactError::Denied(_)), "{err:?}");

    // A server that is gone: unreachable, after the SDK's retries.
    let endpoint = server.config(SECRET_KEY);
    drop(server);
    let started = Instant::now();
    let err = S3Store::new(&endpoint).get(&key).await.err().unwrap();
    assert!(
        matches!(err, ArtifactError::Unavailable("connect")),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(ApiError::from(err).code(), ErrorCode::StorageUnavailable);
}

#[tokio::test]
async fn the_api_serves_artifacts_from_s3_and_reports_refused_credentials() {
    let server = S3sFs::start();
    let config = server.config(SECRET_KEY);
    let app = {
        let config = config.clone();
        TestApp::start_with(|c| c.artifacts.backend = ArtifactBackend::S3(config)).await
    };
    let owner = owner_of(&app).await;
    let backend = S3Store::new(&config);
    let bytes = payload(70_000);
    let row = save_artifact(
        &app.store,
        &backend,
        MAX,
        owner,
        "shot.bin",
        "application/octet-stream",
        bytes.clone(),
    )
    .await
    .unwrap();
    assert!(
        server
            .root
            .0
            .join(BUCKET)
            .join(app.team.to_string())
            .join(row.id.to_string())
            .is_file()
    );
    download_matches(
        &app,
        &row.id.to_string(),
        &bytes,
        "attachment; filename=\"shot.bin\"",
    )
    .await;

    // A brain configured with a wrong secret: the client gets 503 storage_unavailable,
    // never the bytes and never the reason's details.
    let refused = TestApp::start_with(|c| {
        c.artifacts.backend = ArtifactBackend::S3(server.config("not-the-secret"))
    })
    .await;
    let refused_owner = owner_of(&refused).await;
    let row = save_artifact(
        &refused.store,
        &backend,
        MAX,
        refused_owner,
        "x.bin",
        "application/octet-stream",
        payload(10),
    )
    .await
    .unwrap();
    let response = refused.get(&format!("/v1/artifacts/{}", row.id)).await;
    let status = response.status().as_u16();
    let body = response.text().await.unwrap();
    assert_eq!(status, 503);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "storage_unavailable");
    assert!(!body.to_string().contains("Signature"));
}
