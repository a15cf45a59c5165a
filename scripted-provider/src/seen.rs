//! The files a request showed the model (T23, T24), read back from any of the three wires
//! into one shape, so a test asserts what the model got without knowing each format.

use base64::Engine as _;
use serde_json::Value;

use crate::{Wire, responses};

/// What kind of content a file was sent as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeenKind {
    /// Chat Completions `image_url`, Responses `input_image`, Anthropic `image`.
    Image,
    /// Chat Completions `file`, Responses `input_file`, Anthropic `document`.
    Document,
}

/// One file of a request, as the model saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenFile {
    /// The message it rode in, counted in the request's messages (for the Responses API,
    /// its input items joined as chat messages are: a call and its output items count
    /// like chat messages).
    pub message: usize,
    /// The call whose result carried it (Anthropic `tool_result` blocks); `None` for a
    /// user message's file, and for the OpenAI wires, where a result's images follow the
    /// results as a user message.
    pub tool_call: Option<String>,
    pub kind: SeenKind,
    pub media_type: String,
    /// The name the wire carries (OpenAI `filename`, Anthropic `title`), where it does.
    pub filename: Option<String>,
    /// The bytes, decoded.
    pub bytes: Vec<u8>,
}

/// Every file `body` shows the model, in order.
pub(crate) fn files(wire: Wire, body: &Value) -> Vec<SeenFile> {
    let chat = responses::chat_view(wire, body);
    let mut out = Vec::new();
    let messages = chat.get("messages").and_then(Value::as_array);
    for (index, message) in messages.into_iter().flatten().enumerate() {
        for part in message["content"].as_array().into_iter().flatten() {
            if part["type"] == "tool_result" {
                let call = part["tool_use_id"].as_str().map(str::to_owned);
                for inner in part["content"].as_array().into_iter().flatten() {
                    out.extend(
                        file(inner).map(|(kind, filename, media_type, bytes)| SeenFile {
                            message: index,
                            tool_call: call.clone(),
                            kind,
                            media_type,
                            filename,
                            bytes,
                        }),
                    );
                }
            }
            out.extend(
                file(part).map(|(kind, filename, media_type, bytes)| SeenFile {
                    message: index,
                    tool_call: None,
                    kind,
                    media_type,
                    filename,
                    bytes,
                }),
            );
        }
    }
    out
}

type Parsed = (SeenKind, Option<String>, String, Vec<u8>);

/// One content part as a file, in whichever wire's form it is.
fn file(part: &Value) -> Option<Parsed> {
    let name = |key: &str| part[key].as_str().map(str::to_owned);
    match part["type"].as_str()? {
        "image_url" => data_url(part["image_url"]["url"].as_str()?)
            .map(|(media, bytes)| (SeenKind::Image, None, media, bytes)),
        "file" => data_url(part["file"]["file_data"].as_str()?).map(|(media, bytes)| {
            let filename = part["file"]["filename"].as_str().map(str::to_owned);
            (SeenKind::Document, filename, media, bytes)
        }),
        "input_image" => data_url(part["image_url"].as_str()?)
            .map(|(media, bytes)| (SeenKind::Image, None, media, bytes)),
        "input_file" => data_url(part["file_data"].as_str()?)
            .map(|(media, bytes)| (SeenKind::Document, name("filename"), media, bytes)),
        "image" => base64_source(&part["source"])
            .map(|(media, bytes)| (SeenKind::Image, None, media, bytes)),
        "document" => base64_source(&part["source"])
            .map(|(media, bytes)| (SeenKind::Document, name("title"), media, bytes)),
        _ => None,
    }
}

/// `data:<media type>;base64,<data>`.
fn data_url(url: &str) -> Option<(String, Vec<u8>)> {
    let (media, data) = url.strip_prefix("data:")?.split_once(";base64,")?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .ok()?;
    Some((media.to_owned(), bytes))
}

/// Anthropic's `{"type":"base64","media_type":…,"data":…}`.
fn base64_source(source: &Value) -> Option<(String, Vec<u8>)> {
    if source["type"] != "base64" {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(source["data"].as_str()?)
        .ok()?;
    Some((source["media_type"].as_str()?.to_owned(), bytes))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn image(message: usize, tool_call: Option<&str>) -> SeenFile {
        SeenFile {
            message,
            tool_call: tool_call.map(str::to_owned),
            kind: SeenKind::Image,
            media_type: "image/png".into(),
            filename: None,
            bytes: b"\x89PNG".to_vec(),
        }
    }

    fn pdf(message: usize) -> SeenFile {
        SeenFile {
            message,
            tool_call: None,
            kind: SeenKind::Document,
            media_type: "application/pdf".into(),
            filename: Some("r.pdf".into()),
            bytes: b"%PDF".to_vec(),
        }
    }

    #[test]
    fn each_wire_reads_back_alike() {
        let chat = json!({"messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
                {"type": "file", "file": {"filename": "r.pdf", "file_data": "data:application/pdf;base64,JVBERg=="}}
            ]}
        ]});
        assert_eq!(files(Wire::OpenAi, &chat), vec![image(0, None), pdf(0)]);

        let responses = json!({"input": [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "message", "role": "user", "content": [
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw==", "detail": "auto"},
                {"type": "input_file", "filename": "r.pdf", "file_data": "data:application/pdf;base64,JVBERg=="}
            ]}
        ]});
        assert_eq!(
            files(Wire::OpenAiResponses, &responses),
            vec![image(1, None), pdf(1)]
        );

        let png = json!({"type": "base64", "media_type": "image/png", "data": "iVBORw=="});
        let anthropic = json!({"messages": [
            {"role": "user", "content": [
                {"type": "image", "source": png},
                {"type": "document", "title": "r.pdf", "source":
                    {"type": "base64", "media_type": "application/pdf", "data": "JVBERg=="}}
            ]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "s", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "text", "text": "shot"}, {"type": "image", "source": png}
            ]}]}
        ]});
        assert_eq!(
            files(Wire::Anthropic, &anthropic),
            vec![image(0, None), pdf(0), image(2, Some("t"))]
        );
    }
}
