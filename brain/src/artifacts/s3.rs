//! [`S3Store`]: artifacts as objects in an S3 bucket, on AWS or an S3-compatible server
//! (MinIO, s3s).
//!
//! The client is configured by hand from `BRAIN_S3_*` and the static `AWS_*` credentials
//! (no `aws-config`: no profile files, no instance metadata lookups at start-up). A
//! `PutObject` is atomic on S3, so a reader never sees half an object. Errors are reduced
//! to their class, HTTP status and S3 error code; the SDK's messages are not kept.

use std::time::Duration;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    timeout::TimeoutConfig,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use super::{ArtifactBody, ArtifactError, ArtifactStore, valid_key};
use crate::config::S3Config;

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

    async fn put_object(
        &self,
        key: &str,
        bytes: Bytes,
        content_type: &str,
    ) -> Result<(), ArtifactError> {
        if !valid_key(key) {
            return Err(ArtifactError::InvalidKey);
        }
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type(content_type)
            .content_length(i64::try_from(bytes.len()).unwrap_or(i64::MAX))
            .body(ByteStream::from(bytes))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
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
    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        content_type: &'a str,
    ) -> BoxFuture<'a, Result<(), ArtifactError>> {
        self.put_object(key, bytes, content_type).boxed()
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
