//! A user message's files as the model reads them (T23).
//!
//! The stored message names each file by its download URL (`crate::files`); a turn reads
//! the bytes of the files of its history window and shows each in the form its media type
//! (sniffed from the bytes when stored, T22) allows:
//! - an image or a PDF as content of its own ([`providers::Attachment`]), which each
//!   adapter renders in its wire's form; a model the catalog does not say reads it gets
//!   what its `instead` says in its place (`ModelRequest::fitted`, at the model call,
//!   since a fallback may be another model): a PDF's text, an image's description by the
//!   `vision` route (T27, `describe.rs`), else a note;
//! - text, CSV and JSON inline after the message's text, up to [`INLINE_TEXT_BYTES`]; a
//!   longer file is cut with a note that says where, never silently;
//! - anything else as a note naming the file.
//!
//! For an agent with hands, each message with files also says where they are in its
//! worker's workspace (`uploads/<name>`, T25): the model can work on the bytes there.
//!
//! Files share the context budget with the text: what the window's text leaves. The newest
//! message's files are taken first, so when the budget runs out the oldest files are the
//! ones left out, each replaced by a note.

use std::collections::HashMap;

use protocol::parts::{FilePart, Part};
use protocol::{ChatId, TeamId};
use providers::{Attachment, AttachmentKind};
use store::MessageRow;

use crate::Engine;
use crate::files::workspace::Manifest;
use crate::files::{self, FileError};

/// The most bytes of one text file shown inline; past it the file is cut, with a note.
pub const INLINE_TEXT_BYTES: usize = 32 * 1024;

/// What a file part becomes for the model.
#[derive(Clone, Debug, PartialEq)]
pub enum Shown {
    /// Content of its own: an image or a PDF.
    Attachment(Attachment),
    /// Text after the message's text: the file's content, or a note about it.
    Text(String),
}

/// The files of a history window, by the URL their parts name them by. Empty for a
/// history read without them (the summary's transcript): each file is then named only.
#[derive(Debug, Default)]
pub struct Files {
    shown: HashMap<String, Shown>,
    /// For an agent with hands, where each file is in its worker's workspace (T25).
    paths: HashMap<String, String>,
}

impl Files {
    pub fn get(&self, url: &str) -> Option<&Shown> {
        self.shown.get(url)
    }

    /// The workspace path of the file `url` names, for an agent with hands.
    pub fn path(&self, url: &str) -> Option<&str> {
        self.paths.get(url).map(String::as_str)
    }
}

#[cfg(test)]
impl FromIterator<(String, Shown)> for Files {
    fn from_iter<I: IntoIterator<Item = (String, Shown)>>(iter: I) -> Self {
        Self {
            shown: iter.into_iter().collect(),
            paths: HashMap::new(),
        }
    }
}

/// Sets what a model without vision reads in an image's place (T27): `describe.rs`
/// does, for a turn whose model has none.
pub(super) trait Describe {
    async fn describe(&self, row: &store::ChatFileRow, image: &mut Attachment);
}

/// Whether any user message of `history` has a file.
pub fn any<'a>(mut history: impl Iterator<Item = &'a MessageRow>) -> bool {
    history
        .any(|row| row.role == "user" && row.parts.iter().any(|part| matches!(part, Part::File(_))))
}

/// The files of `history`'s user messages (given oldest first), read within `budget`
/// tokens, newest first; with `workspace` (the chat's files as its worker places them,
/// T25), where each is in the workspace. `describer` gives an image its description for
/// a model without vision (T27).
pub(super) async fn load<'a>(
    state: &Engine,
    (team, chat): (TeamId, ChatId),
    history: impl DoubleEndedIterator<Item = &'a MessageRow>,
    budget: usize,
    workspace: Option<&Manifest>,
    describer: &impl Describe,
) -> Files {
    let mut files = Files::default();
    let mut left = budget;
    let user_rows = history.rev().filter(|row| row.role == "user");
    for row in user_rows {
        for part in &row.parts {
            let Part::File(file) = part else { continue };
            if files.shown.contains_key(&file.url) {
                continue;
            }
            let shown = show(state, (team, chat), file, &mut left, describer).await;
            files.shown.insert(file.url.clone(), shown);
            let path = workspace.zip(files::id_of_url(&file.url));
            if let Some(path) = path.and_then(|(manifest, id)| manifest.path_of(id)) {
                files.paths.insert(file.url.clone(), path);
            }
        }
    }
    files
}

/// One file as the model sees it, its cost taken from `left`.
async fn show(
    state: &Engine,
    (team, chat): (TeamId, ChatId),
    file: &FilePart,
    left: &mut usize,
    describer: &impl Describe,
) -> Shown {
    let name = file.filename.as_deref().unwrap_or("file");
    let Some(id) = files::id_of_url(&file.url) else {
        return Shown::Text(format!("[a file {name} was attached here, but not kept]"));
    };
    let read = match files::read(&state.store, &*state.artifacts, team, id).await {
        Ok(read) if read.row.chat_id == chat => read,
        Ok(_) | Err(FileError::NotFound) => {
            return Shown::Text(format!(
                "[a file {name} was attached here; it no longer exists]"
            ));
        }
        Err(err) => {
            tracing::warn!(%chat, class = err.metric_label(), "a chat file could not be read for the model");
            return Shown::Text(format!(
                "[a file {name} was attached here; it could not be read just now]"
            ));
        }
    };
    let media = read.row.media_type.as_str();
    let shown = match media {
        "image/png" | "image/jpeg" | "image/gif" | "image/webp" => {
            let mut image = Attachment::new(AttachmentKind::Image, media, name, &read.bytes);
            // T27: a model without vision reads a description instead.
            describer.describe(&read.row, &mut image).await;
            Shown::Attachment(image)
        }
        "application/pdf" => {
            let mut pdf = Attachment::new(AttachmentKind::Pdf, media, name, &read.bytes);
            // T27: a model that does not read documents reads the text instead.
            pdf.instead = Some(pdf_text(name, read.bytes).await.into());
            Shown::Attachment(pdf)
        }
        "text/plain" | "text/csv" | "application/json" => {
            Shown::Text(inline_text(name, media, &read.bytes))
        }
        _ => {
            return Shown::Text(format!(
                "[a file {name} ({media}, {} bytes) was attached here; it is neither text nor \
                 an image or document a model reads]",
                read.bytes.len()
            ));
        }
    };
    let cost = match &shown {
        Shown::Attachment(attachment) => attachment.estimated_tokens(),
        // Four characters to a token, as the history's estimate counts.
        Shown::Text(text) => text.len() / 4,
    };
    if cost > *left {
        return Shown::Text(format!(
            "[a file {name} ({media}) was attached here; left out to stay within the \
             context budget]"
        ));
    }
    *left -= cost;
    shown
}

/// A text file between markers, cut at [`INLINE_TEXT_BYTES`] (on a character boundary)
/// with a note saying so.
fn inline_text(name: &str, media: &str, bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut end = text.len().min(INLINE_TEXT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = format!("[file {name} ({media})]\n{}", &text[..end]);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    if end < text.len() {
        out.push_str(&format!(
            "[file {name} truncated at {end} of {} bytes]",
            text.len()
        ));
    } else {
        out.push_str(&format!("[end of file {name}]"));
    }
    out
}

/// A PDF's text as a model that does not read documents reads it (T27), or a note that it
/// has none.
async fn pdf_text(name: &str, bytes: bytes::Bytes) -> String {
    let extracted = match files::extract_text("application/pdf", bytes).await {
        Ok(extracted) if !extracted.text.trim().is_empty() => extracted,
        Ok(_) => {
            return format!(
                "[a PDF document {name} was attached here; this model cannot read PDFs, and it \
                 has no text to extract]"
            );
        }
        Err(err) => {
            tracing::info!(class = err.metric_label(), "a PDF's text was not extracted");
            return format!(
                "[a PDF document {name} was attached here; this model cannot read PDFs, and its \
                 text could not be extracted]"
            );
        }
    };
    inline_pdf_text(name, &extracted)
}

/// Extracted text between markers, cut at [`INLINE_TEXT_BYTES`] with how much was kept.
fn inline_pdf_text(name: &str, extracted: &files::ExtractedText) -> String {
    // Pages apart as paragraphs are.
    let text = extracted.text.replace('\u{c}', "\n\n");
    let mut end = text.len().min(INLINE_TEXT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = format!(
        "[file {name} (application/pdf), its text]\n{}",
        &text[..end]
    );
    if !out.ends_with('\n') {
        out.push('\n');
    }
    if end < text.len() || extracted.truncated {
        let kept = text[..end].chars().count();
        let total = text.chars().count();
        let more = if extracted.truncated {
            "more than "
        } else {
            ""
        };
        out.push_str(&format!("[truncated: {kept} of {more}{total} characters]"));
    } else {
        out.push_str(&format!("[end of file {name}]"));
    }
    out
}

/// What the model reads for a file part of a history read without its files.
pub fn named(file: &FilePart) -> String {
    let name = file.filename.as_deref().unwrap_or("file");
    format!("[a file {name} ({}) was attached here]", file.media_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// T23: a text file is shown whole between markers, and a longer one is cut on a
    /// character boundary with a note that says where, never silently.
    #[test]
    fn text_is_inlined_whole_or_cut_with_a_note() {
        assert_eq!(
            inline_text("a.csv", "text/csv", b"x,y\n1,2\n"),
            "[file a.csv (text/csv)]\nx,y\n1,2\n[end of file a.csv]"
        );
        let long = "é".repeat(INLINE_TEXT_BYTES); // two bytes each
        let shown = inline_text("b.txt", "text/plain", long.as_bytes());
        assert!(shown.ends_with(&format!(
            "\n[file b.txt truncated at {INLINE_TEXT_BYTES} of {} bytes]",
            2 * INLINE_TEXT_BYTES
        )));
        assert_eq!(
            shown.matches('é').count(),
            INLINE_TEXT_BYTES / 2,
            "cut on a character boundary"
        );
    }

    /// T27: a PDF's text for a model that does not read documents: its pages as
    /// paragraphs between markers, and a longer one cut with how much was kept, never
    /// silently.
    #[tokio::test]
    async fn a_pdfs_text_is_inlined_whole_or_cut_with_a_note() {
        let pdf = include_bytes!("../../tests/fixtures/visits.pdf");
        let shown = pdf_text("visits.pdf", bytes::Bytes::from_static(pdf)).await;
        assert!(
            shown.starts_with("[file visits.pdf (application/pdf), its text]\nQuarterly visits"),
            "{shown}"
        );
        assert!(shown.contains("quarter.\n\nSecond page"), "{shown}");
        assert!(
            shown.ends_with("winter.\n[end of file visits.pdf]"),
            "{shown}"
        );
        let broken = pdf_text("x.pdf", bytes::Bytes::from_static(b"%PDF-1.7\n")).await;
        assert!(
            broken.contains("its text could not be extracted"),
            "{broken}"
        );

        let long = files::ExtractedText {
            text: "é".repeat(INLINE_TEXT_BYTES),
            truncated: false,
        };
        let cut = inline_pdf_text("l.pdf", &long);
        assert!(
            cut.ends_with(&format!(
                "[truncated: {} of {INLINE_TEXT_BYTES} characters]",
                INLINE_TEXT_BYTES / 2
            )),
            "{}",
            &cut[cut.len() - 80..]
        );
        let bounded = files::ExtractedText {
            text: "short".into(),
            truncated: true,
        };
        assert!(
            inline_pdf_text("b.pdf", &bounded)
                .ends_with("[truncated: 5 of more than 5 characters]")
        );
    }
}
