//! Documents cut into passages by their structure (B4). Markdown (and HTML, whose
//! extracted text marks headings with `#` lines) is cut into sections at its headings,
//! each passage carrying its heading path (`Guide > Install > Linux`); a section is cut
//! into passages of whole paragraphs up to [`TARGET_BYTES`], a paragraph longer than that
//! at a line, sentence or word; each passage after a section's first begins with the last
//! [`OVERLAP_BYTES`] or so of the one before, so a sentence cut in two is found whole in
//! one of them. A CSV's passages are runs of rows, each under the header line. Fenced code
//! blocks are never read as headings.

use store::NewChunk;

/// The size a passage is filled up to: about 300 tokens, a few paragraphs, small enough
/// that several fit in a prompt.
pub const TARGET_BYTES: usize = 1200;
/// How much of a passage the next one repeats.
pub const OVERLAP_BYTES: usize = 200;
/// The longest heading path kept.
const MAX_HEADING_BYTES: usize = 500;

/// A document's passages, and its title when its text names one (its first top-level
/// heading).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Chunked {
    pub title: Option<String>,
    pub chunks: Vec<NewChunk>,
}

/// Markdown, or text whose `#` lines are headings.
pub fn markdown(text: &str) -> Chunked {
    let mut out = Chunked::default();
    let mut path: Vec<(usize, String)> = Vec::new();
    let mut paragraphs: Vec<String> = Vec::new();
    let mut paragraph = String::new();
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(marker) = fence {
            paragraph.push_str(line);
            paragraph.push('\n');
            if trimmed.starts_with(marker) {
                fence = None;
            }
            continue;
        }
        if let Some(marker) = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m)) {
            fence = Some(marker);
            paragraph.push_str(line);
            paragraph.push('\n');
            continue;
        }
        if let Some((level, heading)) = heading_of(trimmed) {
            end_paragraph(&mut paragraph, &mut paragraphs);
            pack(&heading_path(&path), &paragraphs, &mut out.chunks);
            paragraphs.clear();
            if level == 1 && out.title.is_none() {
                out.title = Some(cut(heading, MAX_HEADING_BYTES).to_owned());
            }
            path.retain(|(l, _)| *l < level);
            path.push((level, heading.to_owned()));
            continue;
        }
        if line.trim().is_empty() {
            end_paragraph(&mut paragraph, &mut paragraphs);
        } else {
            paragraph.push_str(line);
            paragraph.push('\n');
        }
    }
    end_paragraph(&mut paragraph, &mut paragraphs);
    pack(&heading_path(&path), &paragraphs, &mut out.chunks);
    out
}

/// Text without structure but its blank lines: passages of whole paragraphs.
pub fn plain(text: &str) -> Chunked {
    let mut paragraphs = Vec::new();
    let mut paragraph = String::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            end_paragraph(&mut paragraph, &mut paragraphs);
        } else {
            paragraph.push_str(line);
            paragraph.push('\n');
        }
    }
    end_paragraph(&mut paragraph, &mut paragraphs);
    let mut out = Chunked::default();
    pack("", &paragraphs, &mut out.chunks);
    out
}

/// A CSV: runs of rows, each passage under the header line so its columns keep their
/// names.
pub fn csv(text: &str) -> Chunked {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let mut out = Chunked::default();
    let Some(header) = lines.next() else {
        return out;
    };
    let header = cut(header, TARGET_BYTES / 2);
    let mut body = String::new();
    for line in lines {
        if !body.is_empty() && header.len() + body.len() + line.len() + 2 > TARGET_BYTES {
            out.chunks.push(NewChunk {
                heading: String::new(),
                body: format!("{header}\n{}", body.trim_end()),
            });
            body.clear();
        }
        for piece in split_long(line, TARGET_BYTES - header.len() - 1) {
            body.push_str(&piece);
            body.push('\n');
        }
    }
    if !body.is_empty() {
        out.chunks.push(NewChunk {
            heading: String::new(),
            body: format!("{header}\n{}", body.trim_end()),
        });
    }
    out
}

/// `## Title` → (2, "Title"); at most six `#`, then a space.
fn heading_of(line: &str) -> Option<(usize, &str)> {
    let level = line.bytes().take_while(|b| *b == b'#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &line[level..];
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let heading = rest.trim().trim_end_matches('#').trim();
    (!heading.is_empty()).then_some((level, heading))
}

fn heading_path(path: &[(usize, String)]) -> String {
    let joined = path
        .iter()
        .map(|(_, h)| h.as_str())
        .collect::<Vec<_>>()
        .join(" > ");
    cut(&joined, MAX_HEADING_BYTES).to_owned()
}

fn end_paragraph(paragraph: &mut String, paragraphs: &mut Vec<String>) {
    let text = paragraph.trim();
    if !text.is_empty() {
        paragraphs.push(text.to_owned());
    }
    paragraph.clear();
}

/// One section's paragraphs into passages under `heading`, each after the first opening
/// with the end of the one before.
fn pack(heading: &str, paragraphs: &[String], chunks: &mut Vec<NewChunk>) {
    let mut body = String::new();
    let mut pieces = paragraphs.iter().flat_map(|p| split_long(p, TARGET_BYTES));
    let mut next = pieces.next();
    while let Some(piece) = next {
        if !body.is_empty() && body.len() + piece.len() + 2 > TARGET_BYTES {
            let overlap = tail(&body, OVERLAP_BYTES).to_owned();
            chunks.push(NewChunk {
                heading: heading.to_owned(),
                body: std::mem::take(&mut body),
            });
            body = overlap;
        }
        if !body.is_empty() {
            body.push_str("\n\n");
        }
        body.push_str(&piece);
        next = pieces.next();
    }
    if !body.is_empty() {
        chunks.push(NewChunk {
            heading: heading.to_owned(),
            body,
        });
    }
}

/// `text` in pieces of at most `max` bytes, each cut at the last line end, else sentence
/// end, else space in its second half, else at a character boundary.
fn split_long(text: &str, max: usize) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut rest = text.trim();
    while rest.len() > max {
        let window = cut(rest, max);
        let at = ["\n", ". ", " "]
            .iter()
            .filter_map(|sep| window.rfind(sep).map(|i| i + sep.len()))
            .find(|i| *i > max / 2)
            .unwrap_or(window.len());
        pieces.push(rest[..at].trim().to_owned());
        rest = rest[at..].trim_start();
    }
    if !rest.is_empty() {
        pieces.push(rest.to_owned());
    }
    pieces
}

/// The first at most `max` bytes of `text`, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// About the last `max` bytes of `text`, from the start of a word.
fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let rest = &text[start..];
    match rest.find(char::is_whitespace) {
        Some(i) => rest[i..].trim_start(),
        None => rest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headings_make_sections_with_their_path() {
        let doc = "# Guide\n\nIntro text.\n\n## Install\n\nRun it.\n\n### Linux\n\napt install.\n\n## Use\n\n```sh\n# not a heading\n```\n";
        let chunked = markdown(doc);
        assert_eq!(chunked.title.as_deref(), Some("Guide"));
        let headings: Vec<&str> = chunked.chunks.iter().map(|c| c.heading.as_str()).collect();
        assert_eq!(
            headings,
            [
                "Guide",
                "Guide > Install",
                "Guide > Install > Linux",
                "Guide > Use"
            ]
        );
        assert!(chunked.chunks[3].body.contains("# not a heading"));
    }

    #[test]
    fn long_sections_are_cut_with_overlap() {
        let paragraph = |n: usize| format!("Paragraph {n} says something. ").repeat(12);
        let doc = (0..10).map(paragraph).collect::<Vec<_>>().join("\n\n");
        let chunked = plain(&doc);
        assert!(chunked.chunks.len() > 3, "{}", chunked.chunks.len());
        for pair in chunked.chunks.windows(2) {
            assert!(pair[0].body.len() <= TARGET_BYTES + OVERLAP_BYTES + 2);
            let end = tail(&pair[0].body, OVERLAP_BYTES);
            assert!(pair[1].body.starts_with(end), "no overlap");
        }
        let one_line = "word ".repeat(1000);
        assert!(
            plain(&one_line)
                .chunks
                .iter()
                .all(|c| c.body.len() <= TARGET_BYTES + OVERLAP_BYTES + 2)
        );
    }

    #[test]
    fn csv_passages_keep_the_header() {
        let rows: String = (0..200).map(|i| format!("city{i},{i}\n")).collect();
        let chunked = csv(&format!("city,visits\n{rows}"));
        assert!(chunked.chunks.len() > 1);
        assert!(
            chunked
                .chunks
                .iter()
                .all(|c| c.body.starts_with("city,visits\n"))
        );
    }
}
