//! `upload_artifact`: a workspace file as an MCP embedded resource.
//!
//! The pod holds no storage credentials, so the bytes travel over the channel: the result
//! is a `resource` content block with a base64 `blob`, `uri` = `workspace:///<path>` (the
//! path relative to the workspace, percent-encoded outside RFC 3986's unreserved
//! characters and `/`) and a `mimeType` guessed from the extension. The brain stores it.

use base64::Engine;
use rmcp::model::ResourceContents;

/// The URI scheme of workspace files.
pub const URI_PREFIX: &str = "workspace:///";
pub const DEFAULT_MIME: &str = "application/octet-stream";

/// A small table of the types agents commonly produce; anything else is
/// `application/octet-stream`.
pub fn guess_mime(path: &str) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or(path);
    let Some((_, ext)) = name.rsplit_once('.') else {
        return DEFAULT_MIME;
    };
    match ext.to_ascii_lowercase().as_str() {
        "txt" | "log" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "js" | "mjs" => "text/javascript",
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/x-ndjson",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "py" => "text/x-python",
        "rs" => "text/x-rust",
        "sh" => "application/x-sh",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "ico" => "image/x-icon",
        "mp3" => "audio/mpeg",
        "wav" => "audio/wav",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "zip" => "application/zip",
        "gz" | "tgz" => "application/gzip",
        "tar" => "application/x-tar",
        "wasm" => "application/wasm",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        _ => DEFAULT_MIME,
    }
}

/// `workspace:///<relative path>`, percent-encoded.
pub fn uri_of(relative: &str) -> String {
    let mut uri = String::from(URI_PREFIX);
    for byte in relative.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/') {
            uri.push(char::from(byte));
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    uri
}

/// The embedded resource for `bytes` read from `relative`.
pub fn resource(relative: &str, bytes: &[u8]) -> ResourceContents {
    let blob = base64::engine::general_purpose::STANDARD.encode(bytes);
    ResourceContents::blob(blob, uri_of(relative)).with_mime_type(guess_mime(relative))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn mime_types_come_from_the_extension() {
        assert_eq!(guess_mime("report.PDF"), "application/pdf");
        assert_eq!(guess_mime("out/chart.png"), "image/png");
        assert_eq!(guess_mime("data.csv"), "text/csv");
        assert_eq!(guess_mime("a.tar.gz"), "application/gzip");
        assert_eq!(guess_mime("Makefile"), DEFAULT_MIME);
        assert_eq!(guess_mime("dir.d/noext"), DEFAULT_MIME);
        assert_eq!(guess_mime("x.unknown"), DEFAULT_MIME);
    }

    #[test]
    fn the_uri_names_the_workspace_path() {
        assert_eq!(uri_of("out/report.pdf"), "workspace:///out/report.pdf");
        assert_eq!(uri_of("my file#1.txt"), "workspace:///my%20file%231.txt");
        let ResourceContents::BlobResourceContents {
            uri,
            mime_type,
            blob,
            ..
        } = resource("a.txt", b"hi")
        else {
            panic!("a blob")
        };
        assert_eq!(uri, "workspace:///a.txt");
        assert_eq!(mime_type.as_deref(), Some("text/plain"));
        assert_eq!(blob, "aGk=");
    }

    #[test]
    fn the_wire_form_is_an_embedded_blob_resource() {
        let block = rmcp::model::ContentBlock::resource(resource("out/a.txt", b"hi"));
        assert_eq!(
            serde_json::to_value(block).unwrap(),
            serde_json::json!({
                "type": "resource",
                "resource": {
                    "uri": "workspace:///out/a.txt",
                    "mimeType": "text/plain",
                    "blob": "aGk="
                }
            })
        );
    }
}
