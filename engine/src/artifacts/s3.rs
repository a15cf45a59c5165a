//! [`S3Store`]: artifacts as objects in an S3 bucket, on AWS or an S3-compatible server
//! (MinIO, s3s).
//!
//! The client is configured by hand from `BRAIN_S3_*` and the static `AWS_*` credentials
//! (no `aws-config`: no profile files, no instance metadata lookups at start-up). A
//! `PutObject` is atomic on S3, and so is a multipart upload (its object appears at
//! `CompleteMultipartUpload`), so a reader never sees half an object. A body larger than a
//! part goes up in parts as it arrives, never held whole. Errors are reduced
//! to their class, HTTP status and S3 error code; the SDK's messages are not kept.

use std::time::Duration;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    timeout::TimeoutConfig,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};

use super::{ArtifactBody, ArtifactError, ArtifactStore, ByteStream as Source, valid_key};
use crate::config::S3Config;

/// The size of one part of a multipart upload, and the largest object sent in one
/// `PutObject`: S3 takes parts of 5 MiB and more (the last one excepted).
const PART_BYTES: usize = 8 << 20;
/// S3's most parts in one upload: 80 GB at 8 MiB a part, far above any cap here.
const MAX_PARTS: i32 = 10_000;

/// One bucket.
#[derive(Clone, Debug)]
pub struct S3Store {
    client: Client,
    bucket: String,
}

impl S3Store {
    /// Builds the client; nothing is sent until the first request.
    pub fn new(config: &S3Config) -> Self {
        let credentials = Credentials::new(
            config.credentials.access_key_id.clone(),
            config.credentials.secret_access_key.clone(),
            config.credentials.session_token.clone(),
            None,
            "brain-environment",
        );
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(5))
            .operation_attempt_timeout(Duration::from_secs(120))
            .build();
        let mut builder = aws_sdk_s3::config::Builder::new()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(config.region.clone()))
            .credentials_provider(credentials)
            .force_path_style(config.force_path_style)
            .timeout_config(timeouts)
            // S3-compatible servers differ in their support of the SDK's default trailing
            // checksums; the brain keeps its own SHA-256 of every artifact.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        if let Some(endpoint) = &config.endpoint {
            builder = builder.endpoint_url(endpoint.clone());
        }
        Self {
            client: Client::from_conf(builder.build()),
            bucket: config.bucket.clone(),
        }
    }

    /// One `PutObject` when the body fits in a part, else a multipart upload whose parts
    /// are sent as they fill: one part in memory at a time.
    async fn put_object(
        &self,
        key: &str,
        mut body: Source,
        content_type: &str,
    ) -> Result<u64, ArtifactError> {
        if !valid_key(key) {
            return Err(ArtifactError::InvalidKey);
        }
        let (first, mut ended) = fill(&mut body).await?;
        let mut size = first.len() as u64;
        if ended {
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(key)
                .content_type(content_type)
                .content_length(i64::try_from(first.len()).unwrap_or(i64::MAX))
                .body(ByteStream::from(first))
                .send()
                .await
                .map_err(classify)?;
            return Ok(size);
        }
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .content_type(content_type)
            .send()
            .await
            .map_err(classify)?;
        let upload = Multipart {
            client: self.client.clone(),
            bucket: self.bucket.clone(),
            key: key.to_owned(),
            id: created
                .upload_id()
                .ok_or(ArtifactError::Unavailable("no upload id"))?
                .to_owned(),
        };
        let mut parts = Vec::new();
        let mut part = first;
        loop {
            let number = i32::try_from(parts.len() + 1)
                .ok()
                .filter(|n| *n <= MAX_PARTS)
                .ok_or(ArtifactError::Rejected("too many parts".into()))?;
            let sent = self
                .client
                .upload_part()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(&upload.id)
                .part_number(number)
                .content_length(i64::try_from(part.len()).unwrap_or(i64::MAX))
                .body(ByteStream::from(part))
                .send()
                .await
                .map_err(classify)?;
            parts.push(
                CompletedPart::builder()
                    .set_e_tag(sent.e_tag().map(str::to_owned))
                    .part_number(number)
                    .build(),
            );
            if ended {
                break;
            }
            let next;
            (next, ended) = fill(&mut body).await?;
            if next.is_empty() {
                break;
            }
            size += next.len() as u64;
            part = next;
        }
        self.client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(&upload.id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(classify)?;
        upload.completed();
        Ok(size)
    }

    async fn get_object(&self, key: &str) -> Result<ArtifactBody, ArtifactError> {
        if !valid_key(key) {
            return Err(ArtifactError::InvalidKey);
        }
        let output = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(classify)?;
        // S3 always sends the length of a whole object; without it the download could not
        // announce one.
        let size = output
            .content_length()
            .and_then(|n| u64::try_from(n).ok())
            .ok_or(ArtifactError::Unavailable("no content length"))?;
        let stream = futures_util::stream::unfold(output.body, |mut body| async move {
            let piece = body.next().await?;
            Some((
                piece.map_err(|_| ArtifactError::Unavailable("transfer")),
                body,
            ))
        });
        Ok(ArtifactBody {
            size,
            stream: Box::pin(stream),
        })
    }

    async fn delete_object(&self, key: &str) -> Result<(), ArtifactError> {
        if !valid_key(key) {
            return Err(ArtifactError::InvalidKey);
        }
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }
}

/// Reads `body` until a part is full or the body ends: the part, and whether it ended.
async fn fill(body: &mut Source) -> Result<(Bytes, bool), ArtifactError> {
    let mut part = BytesMut::new();
    while part.len() < PART_BYTES {
        match body.next().await {
            Some(piece) => part.extend_from_slice(&piece?),
            None => return Ok((part.freeze(), true)),
        }
    }
    Ok((part.freeze(), false))
}

/// A multipart upload under way, aborted when dropped before it completed (a failed part,
/// a body that broke off, a request whose future was dropped): S3 keeps the parts of an
/// upload neither completed nor aborted, and bills them, until a lifecycle rule removes
/// them.
struct Multipart {
    client: Client,
    bucket: String,
    key: String,
    id: String,
}

impl Multipart {
    fn completed(self) {
        std::mem::forget(self);
    }
}

impl Drop for Multipart {
    fn drop(&mut self) {
        let abort = self
            .client
            .abort_multipart_upload()
            .bucket(std::mem::take(&mut self.bucket))
            .key(std::mem::take(&mut self.key))
            .upload_id(std::mem::take(&mut self.id));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(err) = abort.send().await {
                    tracing::warn!(
                        class = classify(err).metric_label(),
                        "multipart upload not aborted"
                    );
                }
            });
        }
    }
}

/// Reduces an SDK error to its class; nothing of the request or the credentials is kept.
fn classify<E: ProvideErrorMetadata>(
    err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> ArtifactError {
    match &err {
        SdkError::TimeoutError(_) => ArtifactError::Unavailable("timeout"),
        SdkError::DispatchFailure(_) => ArtifactError::Unavailable("connect"),
        SdkError::ResponseError(_) => ArtifactError::Unavailable("response"),
        SdkError::ConstructionFailure(_) => ArtifactError::Unavailable("request"),
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let code = err.code().unwrap_or("").to_owned();
            let label = if code.is_empty() {
                format!("status {status}")
            } else {
                format!("{code} (status {status})")
            };
            match (status, code.as_str()) {
                (404, _) | (_, "NoSuchKey") if code != "NoSuchBucket" => ArtifactError::NotFound,
                (401 | 403, _)
                | (
                    _,
                    "AccessDenied"
                    | "SignatureDoesNotMatch"
                    | "InvalidAccessKeyId"
                    | "ExpiredToken",
                ) => ArtifactError::Denied(label),
                (500..=599, _) => ArtifactError::Unavailable("server error"),
                _ => ArtifactError::Rejected(label),
            }
        }
        _ => ArtifactError::Unavailable("unknown"),
    }
}

impl ArtifactStore for S3Store {
    fn put_stream<'a>(
        &'a self,
        key: &'a str,
        body: Source,
        content_type: &'a str,
    ) -> BoxFuture<'a, Result<u64, ArtifactError>> {
        self.put_object(key, body, content_type).boxed()
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ArtifactBody, ArtifactError>> {
        self.get_object(key).boxed()
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), ArtifactError>> {
        self.delete_object(key).boxed()
    }

    fn kind(&self) -> &'static str {
        "s3"
    }
}
