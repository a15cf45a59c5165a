//! The text of a file (T27), for a model that does not read the file's own format and
//! for anything that indexes files by their words.
//!
//! - A PDF's pages through `pdf-extract` (pure Rust, over `lopdf`), one page after
//!   another separated by a form feed, at most [`MAX_PDF_PAGES`] of them. The crate
//!   unwraps on some malformed documents: a panic is caught and is
//!   [`ExtractError::Malformed`], never the caller's.
//! - HTML with its markup gone: scripts, styles and templates dropped, blocks and list
//!   items on lines of their own, headings as Markdown `#` lines so a chunker can split
//!   by structure, character references decoded.
//! - Text, Markdown, CSV and JSON as they are, once they are valid UTF-8.
//!
//! Every extraction runs on a blocking thread within [`EXTRACT_BOUND`] and keeps at most
//! [`MAX_CHARS`] characters; a cut is said in [`ExtractedText::truncated`], never
//! silent.

use std::time::Duration;

use bytes::Bytes;

/// How long one extraction may take: a PDF built to be slow is given up on.
pub const EXTRACT_BOUND: Duration = Duration::from_secs(20);
/// The most characters kept of one file's text.
pub const MAX_CHARS: usize = 2_000_000;
/// The most pages of a PDF read.
pub const MAX_PDF_PAGES: u32 = 1_000;

/// A file's readable text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtractedText {
    /// Markdown-like for HTML (headings as `#` lines); a PDF's pages separated by a form
    /// feed (`\u{c}`).
    pub text: String,
    /// Whether a bound ([`MAX_CHARS`], [`MAX_PDF_PAGES`]) cut the text short: what is
    /// there is the file's start.
    pub truncated: bool,
}

/// Why a file has no text to give.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExtractError {
    #[error("files of type {0} have no text to extract")]
    Unsupported(String),
    #[error("the file is not valid UTF-8 text")]
    NotUtf8,
    #[error("the PDF is malformed")]
    Malformed,
    #[error("the PDF is encrypted")]
    Encrypted,
    #[error("extracting the text took longer than {} seconds", EXTRACT_BOUND.as_secs())]
    TimedOut,
}

impl ExtractError {
    /// A bounded label for logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Unsupported(_) => "unsupported",
            Self::NotUtf8 => "not_utf8",
            Self::Malformed => "malformed",
            Self::Encrypted => "encrypted",
            Self::TimedOut => "timeout",
        }
    }
}

/// The text of `bytes` of `media_type` (parameters such as `; charset=utf-8` ignored),
/// extracted on a blocking thread within [`EXTRACT_BOUND`].
pub async fn extract_text(media_type: &str, bytes: Bytes) -> Result<ExtractedText, ExtractError> {
    let kind = Kind::of(media_type)?;
    let work = tokio::task::spawn_blocking(move || kind.extract(&bytes));
    match tokio::time::timeout(EXTRACT_BOUND, work).await {
        Ok(Ok(extracted)) => extracted,
        // The closure catches the PDF reader's panics; any other is a malformed input too.
        Ok(Err(_)) => Err(ExtractError::Malformed),
        // The thread cannot be stopped; it ends on its own, bounded by the file's size.
        Err(_) => Err(ExtractError::TimedOut),
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Pdf,
    Html,
    Text,
}

impl Kind {
    fn of(media_type: &str) -> Result<Self, ExtractError> {
        let essence = media_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/pdf" => Ok(Self::Pdf),
            "text/html" | "application/xhtml+xml" => Ok(Self::Html),
            "application/json" => Ok(Self::Text),
            other if other.starts_with("text/") => Ok(Self::Text),
            _ => Err(ExtractError::Unsupported(essence)),
        }
    }

    fn extract(self, bytes: &[u8]) -> Result<ExtractedText, ExtractError> {
        match self {
            Self::Pdf => pdf(bytes),
            Self::Html => Ok(bounded(html(utf8(bytes)?), false)),
            Self::Text => Ok(bounded(utf8(bytes)?.to_owned(), false)),
        }
    }
}

/// `bytes` as UTF-8, without a byte order mark.
fn utf8(bytes: &[u8]) -> Result<&str, ExtractError> {
    let text = std::str::from_utf8(bytes).map_err(|_| ExtractError::NotUtf8)?;
    Ok(text.strip_prefix('\u{feff}').unwrap_or(text))
}

/// `text` cut to [`MAX_CHARS`] characters.
fn bounded(mut text: String, truncated: bool) -> ExtractedText {
    match text.char_indices().nth(MAX_CHARS) {
        Some((end, _)) => {
            text.truncate(end);
            ExtractedText {
                text,
                truncated: true,
            }
        }
        None => ExtractedText { text, truncated },
    }
}

fn pdf(bytes: &[u8]) -> Result<ExtractedText, ExtractError> {
    use pdf_extract::{Document, PlainTextOutput, output_doc_page};
    let read = std::panic::catch_unwind(|| {
        let mut doc = Document::load_mem(bytes).map_err(|_| ExtractError::Malformed)?;
        if doc.is_encrypted() && doc.decrypt("").is_err() {
            return Err(ExtractError::Encrypted);
        }
        let pages: Vec<u32> = doc.get_pages().into_keys().collect();
        let mut text = String::new();
        let mut truncated = pages.len() > MAX_PDF_PAGES as usize;
        for page in pages.into_iter().take(MAX_PDF_PAGES as usize) {
            if !text.is_empty() {
                text.push('\u{c}');
            }
            let mut raw = String::new();
            let mut output = PlainTextOutput::new(&mut raw);
            output_doc_page(&doc, &mut output, page).map_err(|_| ExtractError::Malformed)?;
            tidy_into(&raw, &mut text);
            // Bytes bound characters from above: past the bound in bytes, count them.
            if text.len() > MAX_CHARS && text.chars().count() > MAX_CHARS {
                truncated = true;
                break;
            }
        }
        Ok(bounded(text, truncated))
    });
    read.unwrap_or(Err(ExtractError::Malformed))
}

/// `page` appended to `text` without blank lines at its ends, trailing spaces, or more
/// than one blank line in a row (the reader writes a newline per vertical gap).
fn tidy_into(page: &str, text: &mut String) {
    let mut blank = false;
    let mut first = true;
    for line in page.lines().map(str::trim_end) {
        if line.trim().is_empty() {
            blank = !first;
            continue;
        }
        if blank {
            text.push('\n');
        }
        if !first {
            text.push('\n');
        }
        text.push_str(line);
        blank = false;
        first = false;
    }
}

/// Elements whose content is never text to read.
const SKIPPED: &[&str] = &[
    "script", "style", "template", "noscript", "svg", "math", "title", "head", "iframe", "object",
];
/// Elements that stand on lines of their own.
const BLOCKS: &[&str] = &[
    "address",
    "article",
    "aside",
    "blockquote",
    "body",
    "caption",
    "dd",
    "details",
    "div",
    "dl",
    "dt",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "header",
    "hr",
    "html",
    "main",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "summary",
    "table",
    "tbody",
    "thead",
    "tfoot",
    "ul",
];
/// Elements without content, whose end tag never comes.
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr",
];

/// HTML as readable text: markup gone, headings as `#` lines, blocks apart.
fn html(source: &str) -> String {
    let mut out = Out::default();
    // The skipped element being inside of, and how deep in it.
    let mut skipping: Option<(String, usize)> = None;
    let mut pre = 0usize;
    let mut rest = source;
    while !rest.is_empty() {
        let Some(lt) = rest.find('<') else {
            if skipping.is_none() {
                out.text(&decode_entities(rest), pre > 0);
            }
            break;
        };
        if lt > 0 && skipping.is_none() {
            out.text(&decode_entities(&rest[..lt]), pre > 0);
        }
        rest = &rest[lt..];
        if let Some(comment) = rest.strip_prefix("<!--") {
            rest = comment.find("-->").map_or("", |end| &comment[end + 3..]);
            continue;
        }
        let Some(tag) = Tag::parse(rest) else {
            // A `<` that opens no tag is text.
            if skipping.is_none() {
                out.text("<", pre > 0);
            }
            rest = &rest[1..];
            continue;
        };
        rest = &rest[tag.len..];
        let Some(name) = tag.name else { continue };
        if let Some((skipped, depth)) = &mut skipping {
            if *skipped == name {
                if tag.closing {
                    *depth -= 1;
                } else if !tag.self_closing {
                    *depth += 1;
                }
                if *depth == 0 {
                    skipping = None;
                }
            }
            continue;
        }
        if SKIPPED.contains(&name.as_str()) {
            if tag.closing || tag.self_closing {
                continue;
            }
            // Scripts and styles are raw text: their content may hold `<` of no tag.
            if matches!(name.as_str(), "script" | "style" | "title") {
                rest = raw_text_end(rest, &name);
            } else {
                skipping = Some((name, 1));
            }
            continue;
        }
        match name.as_str() {
            "br" => out.line_break(),
            "li" if !tag.closing => out.list_item(),
            "td" | "th" if !tag.closing => out.cell(),
            "pre" => {
                pre = if tag.closing {
                    pre.saturating_sub(1)
                } else {
                    pre + 1
                };
                out.block();
            }
            "tr" => out.line_break(),
            heading if is_heading(heading) && tag.closing => out.end_heading(),
            heading if is_heading(heading) => out.heading(heading.as_bytes()[1] - b'0'),
            block if BLOCKS.contains(&block) => out.block(),
            _ => {}
        }
    }
    out.finish()
}

fn is_heading(name: &str) -> bool {
    matches!(name.as_bytes(), [b'h', b'1'..=b'6'])
}

/// What follows the end tag of raw text element `name` in `rest`; nothing when it never
/// ends.
fn raw_text_end<'a>(rest: &'a str, name: &str) -> &'a str {
    let closing = format!("</{name}");
    let lower = rest.to_ascii_lowercase();
    match lower.find(&closing) {
        Some(at) => {
            let after = &rest[at..];
            after.find('>').map_or("", |end| &after[end + 1..])
        }
        None => "",
    }
}

/// A tag at the start of the text: its lowercased name (`None` for a declaration or
/// processing instruction) and its length.
struct Tag {
    name: Option<String>,
    closing: bool,
    self_closing: bool,
    len: usize,
}

impl Tag {
    /// `None` when the `<` opens no tag (`a < b`).
    fn parse(text: &str) -> Option<Self> {
        let bytes = text.as_bytes();
        let (closing, start) = match bytes.get(1)? {
            b'/' => (true, 2),
            b'!' | b'?' => {
                let end = text.find('>').map_or(text.len(), |end| end + 1);
                return Some(Self {
                    name: None,
                    closing: false,
                    self_closing: false,
                    len: end,
                });
            }
            _ => (false, 1),
        };
        if !bytes.get(start)?.is_ascii_alphabetic() {
            return None;
        }
        let name_end = bytes[start..]
            .iter()
            .position(|b| !(b.is_ascii_alphanumeric() || *b == b'-' || *b == b':'))
            .map_or(bytes.len(), |at| start + at);
        // The tag ends at the first `>` outside a quoted attribute value.
        let mut quote = None;
        let mut end = bytes.len();
        for (at, &b) in bytes.iter().enumerate().skip(name_end) {
            match (quote, b) {
                (Some(q), _) if b == q => quote = None,
                (Some(_), _) => {}
                (None, b'"' | b'\'') => quote = Some(b),
                (None, b'>') => {
                    end = at + 1;
                    break;
                }
                _ => {}
            }
        }
        let name = text[start..name_end].to_ascii_lowercase();
        let self_closing = VOID.contains(&name.as_str()) || text[..end].ends_with("/>");
        Some(Self {
            name: Some(name),
            closing,
            self_closing,
            len: end,
        })
    }
}

/// `text` with its character references decoded: numeric ones and the common named
/// ones; any other `&` stays as it is.
fn decode_entities(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('&') {
        return text.into();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let decoded = rest[1..]
            .find(';')
            .filter(|end| *end <= 32)
            .and_then(|end| Some((entity(&rest[1..=end])?, end + 2)));
        match decoded {
            Some((c, len)) => {
                out.push(c);
                rest = &rest[len..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out.into()
}

fn entity(name: &str) -> Option<char> {
    if let Some(number) = name.strip_prefix('#') {
        let code = match number.strip_prefix(['x', 'X']) {
            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
            None => number.parse().ok()?,
        };
        return char::from_u32(code).filter(|c| *c != '\0');
    }
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        "nbsp" => ' ',
        "ndash" => '–',
        "mdash" => '—',
        "hellip" => '…',
        "lsquo" => '‘',
        "rsquo" => '’',
        "ldquo" => '“',
        "rdquo" => '”',
        "laquo" => '«',
        "raquo" => '»',
        "copy" => '©',
        "reg" => '®',
        "trade" => '™',
        "euro" => '€',
        "middot" => '·',
        "bull" => '•',
        "times" => '×',
        "deg" => '°',
        _ => return None,
    })
}

/// The text being written, with the break owed before the next word.
#[derive(Default)]
struct Out {
    text: String,
    /// Newlines owed before the next text: 1 a line break, 2 a blank line.
    owed: usize,
    space: bool,
    in_heading: bool,
}

impl Out {
    fn text(&mut self, text: &str, pre: bool) {
        if pre {
            if !text.is_empty() {
                self.pay();
                self.text.push_str(text);
            }
            return;
        }
        if text.trim().is_empty() {
            // Whitespace between elements (`<b>a</b> <i>b</i>`) still parts words.
            self.space |= !text.is_empty() && !self.text.is_empty();
            return;
        }
        for (i, word) in text.split_whitespace().enumerate() {
            if i == 0 && !text.starts_with(char::is_whitespace) && self.owed == 0 {
                // Glued to what came before (`<b>x</b>y`): no space between.
            } else if !self.text.is_empty() && self.owed == 0 && !self.text.ends_with(' ') {
                self.space = true;
            }
            self.pay();
            self.text.push_str(word);
        }
        if text.ends_with(char::is_whitespace) {
            self.space = true;
        }
    }

    /// Writes the break or space owed.
    fn pay(&mut self) {
        if self.text.is_empty() {
            self.owed = 0;
            self.space = false;
            return;
        }
        if self.owed > 0 {
            let trimmed = self.text.trim_end_matches(' ').len();
            self.text.truncate(trimmed);
            let have = self.text.len() - self.text.trim_end_matches('\n').len();
            for _ in have..self.owed {
                self.text.push('\n');
            }
        } else if self.space {
            self.text.push(' ');
        }
        self.owed = 0;
        self.space = false;
    }

    fn owe(&mut self, newlines: usize) {
        self.owed = self.owed.max(newlines);
        self.space = false;
    }

    fn block(&mut self) {
        if self.in_heading {
            self.space = true;
        } else {
            self.owe(2);
        }
    }

    fn line_break(&mut self) {
        if self.in_heading {
            self.space = true;
        } else {
            self.owe(1);
        }
    }

    fn list_item(&mut self) {
        self.owe(1);
        self.pay();
        self.text.push_str("- ");
    }

    fn cell(&mut self) {
        if !self.text.is_empty() && !self.text.ends_with('\n') && self.owed == 0 {
            self.text.push_str(" | ");
            self.space = false;
        }
    }

    fn heading(&mut self, level: u8) {
        self.owe(2);
        self.pay();
        for _ in 0..level {
            self.text.push('#');
        }
        self.text.push(' ');
        self.in_heading = true;
    }

    fn end_heading(&mut self) {
        self.in_heading = false;
        self.owe(2);
    }

    /// The text, without headings left empty or trailing blanks.
    fn finish(self) -> String {
        let mut lines: Vec<&str> = Vec::new();
        for line in self.text.lines() {
            let line = line.trim_end();
            if !line.is_empty() && line.trim_start_matches('#').is_empty() {
                continue;
            }
            if line.is_empty() && lines.last().is_none_or(|last| last.is_empty()) {
                continue;
            }
            lines.push(line);
        }
        while lines.last().is_some_and(|last| last.is_empty()) {
            lines.pop();
        }
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written by fpdf2: a title line and a paragraph on page one, a paragraph on page two.
    const VISITS_PDF: &[u8] = include_bytes!("../../tests/fixtures/visits.pdf");

    #[tokio::test]
    async fn a_pdf_gives_the_text_of_its_pages_in_order() {
        let extracted = extract_text("application/pdf", Bytes::from_static(VISITS_PDF))
            .await
            .unwrap();
        assert!(!extracted.truncated);
        let pages: Vec<&str> = extracted.text.split('\u{c}').collect();
        assert_eq!(pages.len(), 2, "{:?}", extracted.text);
        let first = pages[0].split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(
            first,
            "Quarterly visits Lyon had 3 visits and Nantes had 5 visits in the first quarter."
        );
        let second = pages[1].split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(
            second,
            "Second page: the harbour of Nantes stays open all winter."
        );
    }

    /// A corrupt PDF is an error, never a panic: its header without a body, its body cut
    /// in half, garbage after the magic number, and each byte of the real one flipped in
    /// turn past the header (some of which reach the reader's unwraps).
    #[tokio::test]
    async fn a_corrupt_pdf_is_an_error_never_a_panic() {
        let half = &VISITS_PDF[..VISITS_PDF.len() / 2];
        for bytes in [
            &b"%PDF-1.7\n"[..],
            half,
            b"%PDF-1.4\n\x00\x01garbage trailer",
        ] {
            assert_eq!(
                extract_text("application/pdf", Bytes::copy_from_slice(bytes)).await,
                Err(ExtractError::Malformed)
            );
        }
        let mut malformed = 0;
        for at in (16..VISITS_PDF.len()).step_by(7) {
            let mut bytes = VISITS_PDF.to_vec();
            bytes[at] ^= 0x5a;
            match extract_text("application/pdf", Bytes::from(bytes)).await {
                Ok(_) => {}
                Err(ExtractError::Malformed) => malformed += 1,
                Err(other) => panic!("byte {at}: {other:?}"),
            }
        }
        assert!(malformed > 0, "some flipped byte breaks the document");
    }

    #[tokio::test]
    async fn html_becomes_text_with_markdown_headings() {
        let page = r#"<!DOCTYPE html>
<html><head><title>Ignored</title><style>p { color: red }</style>
<script>if (a < b && c) { document.write("<p>no</p>") }</script></head>
<body>
  <nav><a href="/">Home</a></nav>
  <h1>Harbour <em>guide</em></h1>
  <p>Boats &amp; ferries leave at 9&nbsp;am.<br>Tickets: &#8364;5 &#x2014; cash.</p>
  <!-- <h2>a comment</h2> -->
  <h2 class="x">Times</h2>
  <ul><li>Lyon</li><li>Nantes <b>daily</b></li></ul>
  <table><tr><th>Day</th><th>Boats</th></tr><tr><td>Mon</td><td>3</td></tr></table>
  <pre>a  b
  c</pre>
  <p>1 < 2 and <span>x</span>y</p>
  <template><p>hidden</p></template><svg><text>chart</text></svg>
  <h3></h3>
</body></html>"#;
        let extracted = extract_text("text/html; charset=utf-8", Bytes::from(page))
            .await
            .unwrap();
        assert_eq!(
            extracted.text,
            "Home\n\n# Harbour guide\n\nBoats & ferries leave at 9 am.\nTickets: €5 — cash.\n\n\
             ## Times\n\n- Lyon\n- Nantes daily\n\nDay | Boats\nMon | 3\n\na  b\n  c\n\n\
             1 < 2 and xy"
        );
        assert!(!extracted.truncated);
    }

    #[tokio::test]
    async fn text_passes_through_once_it_is_utf8() {
        for media in [
            "text/plain",
            "text/markdown",
            "text/csv",
            "application/json",
        ] {
            let extracted = extract_text(media, Bytes::from("\u{feff}é,1\n# x\n"))
                .await
                .unwrap();
            assert_eq!(extracted.text, "é,1\n# x\n", "{media}");
        }
        assert_eq!(
            extract_text("text/plain", Bytes::from_static(b"\xff\xfe")).await,
            Err(ExtractError::NotUtf8)
        );
        assert_eq!(
            extract_text("image/png", Bytes::from_static(b"\x89PNG")).await,
            Err(ExtractError::Unsupported("image/png".into()))
        );
    }

    #[test]
    fn a_long_text_is_cut_on_a_character_and_says_so() {
        let cut = bounded("é".repeat(MAX_CHARS + 3), false);
        assert!(cut.truncated);
        assert_eq!(cut.text.chars().count(), MAX_CHARS);
        let whole = bounded("é".repeat(MAX_CHARS), false);
        assert!(!whole.truncated);
    }
}
