//! The bytes decide (T22): a file's media type from its content, never from the client's
//! word. Magic numbers name the images and PDFs; anything else is text only if it is
//! UTF-8 without NUL and nearly no control characters, and then JSON if it parses as a
//! JSON object or array, CSV if its name says so or its lines split alike on commas.

/// What the bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sniffed {
    Png,
    Jpeg,
    Gif,
    Webp,
    Pdf,
    Json,
    Csv,
    Text,
    /// None of the above: stored and served as bytes, never shown to a model as content.
    Binary,
}

impl Sniffed {
    /// The media type stored and served.
    pub fn media_type(self) -> &'static str {
        match self {
            Self::Png => "image/png",
            Self::Jpeg => "image/jpeg",
            Self::Gif => "image/gif",
            Self::Webp => "image/webp",
            Self::Pdf => "application/pdf",
            Self::Json => "application/json",
            Self::Csv => "text/csv",
            Self::Text => "text/plain",
            Self::Binary => "application/octet-stream",
        }
    }

    /// Whether the bytes are one of the image formats a model may be shown.
    pub fn is_image(self) -> bool {
        matches!(self, Self::Png | Self::Jpeg | Self::Gif | Self::Webp)
    }
}

/// What `bytes`, named `filename`, are.
pub fn sniff(bytes: &[u8], filename: &str) -> Sniffed {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Sniffed::Png
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Sniffed::Jpeg
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Sniffed::Gif
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Sniffed::Webp
    } else if bytes.starts_with(b"%PDF-") {
        Sniffed::Pdf
    } else {
        match text_of(bytes) {
            Some(text) => sniff_text(text, filename),
            None => Sniffed::Binary,
        }
    }
}

/// The bytes as text, if they are text: UTF-8 (a byte order mark allowed), no NUL, and
/// at most one control character in a hundred besides tab, newlines and form feed.
fn text_of(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut controls = 0usize;
    for c in text.chars() {
        if c == '\0' {
            return None;
        }
        if c.is_control() && !matches!(c, '\t' | '\n' | '\r' | '\u{c}') {
            controls += 1;
        }
    }
    (controls * 100 <= text.len()).then_some(text)
}

fn sniff_text(text: &str, filename: &str) -> Sniffed {
    let trimmed = text.trim_start();
    if (trimmed.starts_with('{') || trimmed.starts_with('['))
        && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
    {
        return Sniffed::Json;
    }
    let named_csv = filename
        .rsplit_once('.')
        .is_some_and(|(_, ext)| ext.eq_ignore_ascii_case("csv"));
    if named_csv || looks_like_csv(text) {
        Sniffed::Csv
    } else {
        Sniffed::Text
    }
}

/// At least two lines among the first ten, each with the same number (one or more) of
/// commas.
fn looks_like_csv(text: &str) -> bool {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty()).take(10);
    let Some(first) = lines.next() else {
        return false;
    };
    let commas = first.matches(',').count();
    let mut others = 0;
    for line in lines {
        if line.matches(',').count() != commas {
            return false;
        }
        others += 1;
    }
    commas > 0 && others > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_numbers_and_text_decide() {
        let cases: [(&[u8], &str, Sniffed); 12] = [
            (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", "x.txt", Sniffed::Png),
            (&[0xFF, 0xD8, 0xFF, 0xE1, 0, 0], "x.png", Sniffed::Jpeg),
            (b"GIF89a\x01\0\x01\0", "x", Sniffed::Gif),
            (b"RIFF\x10\0\0\0WEBPVP8 ", "x", Sniffed::Webp),
            (b"%PDF-1.7\n", "x.png", Sniffed::Pdf),
            (b"{\"a\": [1, 2]}", "x.png", Sniffed::Json),
            (b"[1, 2", "x", Sniffed::Text),
            (b"name,age\nann,3\nbob,4\n", "x.txt", Sniffed::Csv),
            (b"just one, line", "data.CSV", Sniffed::Csv),
            (b"Hello, world.\nNothing here.\n", "x.png", Sniffed::Text),
            (b"\xff\xfe\0h\0i", "x.txt", Sniffed::Binary),
            (b"nul\0inside", "x.txt", Sniffed::Binary),
        ];
        for (bytes, name, expected) in cases {
            assert_eq!(sniff(bytes, name), expected, "{name} {bytes:?}");
        }
        assert!(Sniffed::Png.is_image() && !Sniffed::Pdf.is_image());
    }
}
