//! A reply made fit for a platform (P11): cut under its message limit at a paragraph, else
//! a sentence, else a word boundary, and its Markdown written in the platform's own
//! formatting (Telegram's HTML subset; Slack's mrkdwn).

use super::Kind;

/// Cuts `text` into parts of at most `limit` characters, each cut at the last paragraph
/// break of the part, else its last sentence end, else its last space (in its second half,
/// so no part is tiny), else at `limit`. Whitespace at a cut is dropped; nothing else is.
pub fn split(text: &str, limit: usize) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = text.trim();
    while rest.chars().count() > limit {
        let window_end = rest
            .char_indices()
            .nth(limit)
            .map_or(rest.len(), |(i, _)| i);
        let window = &rest[..window_end];
        let half = window.len() / 2;
        let cut = last_after(window, half, &["\n\n"])
            .or_else(|| last_after(window, half, &[". ", "! ", "? ", ".\n", "!\n", "?\n", "\n"]))
            .or_else(|| last_after(window, half, &[" "]))
            .unwrap_or(window_end);
        let (head, tail) = rest.split_at(cut);
        parts.push(head.trim_end().to_owned());
        rest = tail.trim_start();
    }
    if !rest.is_empty() {
        parts.push(rest.to_owned());
    }
    parts
}

/// The end of the last of `marks` in `window` past byte `from` (after the mark's
/// punctuation, before its whitespace).
fn last_after(window: &str, from: usize, marks: &[&str]) -> Option<usize> {
    marks
        .iter()
        .filter_map(|mark| {
            let at = window.rfind(mark)?;
            let keep = mark.trim_end().len();
            (at + keep > from).then_some(at + keep.max(1))
        })
        .max()
}

/// The parts a reply is sent as on `kind`: cut under the platform's limit, each formatted
/// (formatting can only lengthen a part, so a part still too long is cut again smaller),
/// each beside its Markdown (sent as plain text when the platform refuses the formatting).
pub fn parts(kind: Kind, markdown: &str) -> Vec<(String, String)> {
    let limit = kind.message_limit();
    let mut out = Vec::new();
    let mut budget = limit;
    let mut pending = split(markdown, budget);
    while let Some(part) = pending.first().cloned() {
        let formatted = format(kind, &part);
        if formatted.chars().count() <= limit || budget < 64 {
            out.push((formatted, part));
            pending.remove(0);
        } else {
            budget /= 2;
            let smaller = split(&part, budget);
            pending.splice(0..1, smaller);
        }
    }
    out
}

/// `markdown` in `kind`'s formatting.
pub fn format(kind: Kind, markdown: &str) -> String {
    match kind {
        Kind::Telegram => telegram_html(markdown),
        Kind::Slack => slack_mrkdwn(markdown),
    }
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Telegram's HTML parse mode: fenced code as `<pre>`, `code` as `<code>`, `**bold**` as
/// `<b>`, `*italic*`/`_italic_` as `<i>`, `[text](url)` as a link; everything else
/// escaped. A fence left open (a part cut inside a code block) closes at the part's end.
pub fn telegram_html(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len() + 16);
    let mut in_code = false;
    for (i, line) in markdown.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if line.trim_start().starts_with("```") {
            out.push_str(if in_code { "</pre>" } else { "<pre>" });
            in_code = !in_code;
            continue;
        }
        if in_code {
            out.push_str(&html_escape(line));
        } else {
            inline(line, &mut out, &TELEGRAM);
        }
    }
    if in_code {
        out.push_str("</pre>");
    }
    out
}

/// Slack's mrkdwn: `**bold**` as `*bold*`, `*italic*` as `_italic_`, links as
/// `<url|text>`; `&`, `<` and `>` escaped as Slack asks.
pub fn slack_mrkdwn(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len() + 16);
    let mut in_code = false;
    for (i, line) in markdown.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            out.push_str("```");
            continue;
        }
        if in_code {
            out.push_str(&slack_escape(line));
        } else {
            inline(line, &mut out, &SLACK);
        }
    }
    out
}

fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// How one platform writes the inline forms.
struct Inline {
    escape: fn(&str) -> String,
    code: (&'static str, &'static str),
    bold: (&'static str, &'static str),
    italic: (&'static str, &'static str),
    link: fn(&str, &str) -> String,
}

const TELEGRAM: Inline = Inline {
    escape: html_escape,
    code: ("<code>", "</code>"),
    bold: ("<b>", "</b>"),
    italic: ("<i>", "</i>"),
    link: |text, url| format!("<a href=\"{}\">{}</a>", html_escape(url), html_escape(text)),
};

const SLACK: Inline = Inline {
    escape: slack_escape,
    code: ("`", "`"),
    bold: ("*", "*"),
    italic: ("_", "_"),
    link: |text, url| format!("<{}|{}>", slack_escape(url), slack_escape(text)),
};

/// One line's inline Markdown; a marker without its closing one stays as written.
fn inline(line: &str, out: &mut String, style: &Inline) {
    let mut rest = line;
    while !rest.is_empty() {
        if let Some((piece, after)) = span(rest, "`", "`") {
            out.push_str(style.code.0);
            out.push_str(&(style.escape)(piece));
            out.push_str(style.code.1);
            rest = after;
        } else if let Some((piece, after)) = span(rest, "**", "**") {
            out.push_str(style.bold.0);
            out.push_str(&(style.escape)(piece));
            out.push_str(style.bold.1);
            rest = after;
        } else if let Some((piece, after)) = span(rest, "*", "*").or_else(|| span(rest, "_", "_")) {
            out.push_str(style.italic.0);
            out.push_str(&(style.escape)(piece));
            out.push_str(style.italic.1);
            rest = after;
        } else if let Some((text, url, after)) = link(rest) {
            out.push_str(&(style.link)(text, url));
            rest = after;
        } else {
            let next = rest
                .char_indices()
                .skip(1)
                .find(|(_, c)| matches!(c, '`' | '*' | '_' | '['))
                .map_or(rest.len(), |(i, _)| i);
            out.push_str(&(style.escape)(&rest[..next]));
            rest = &rest[next..];
        }
    }
}

/// `open` piece `close` at the start of `text`, the piece not empty nor starting or ending
/// with a space (so `2 * 3 * 4` stays arithmetic).
fn span<'a>(text: &'a str, open: &str, close: &str) -> Option<(&'a str, &'a str)> {
    let body = text.strip_prefix(open)?;
    let end = body.find(close)?;
    let piece = &body[..end];
    let ok = !piece.is_empty() && !piece.starts_with(' ') && !piece.ends_with(' ');
    ok.then(|| (piece, &body[end + close.len()..]))
}

/// `[text](url)` at the start of `text`, for an `http(s)` URL only.
fn link(text: &str) -> Option<(&str, &str, &str)> {
    let body = text.strip_prefix('[')?;
    let close = body.find("](")?;
    let after = &body[close + 2..];
    let end = after.find(')')?;
    let url = &after[..end];
    (url.starts_with("https://") || url.starts_with("http://"))
        .then(|| (&body[..close], url, &after[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_text_is_cut_at_paragraphs_then_sentences_and_loses_nothing() {
        let sentence = "This sentence is one of many in a long answer. ";
        // Past half the limit, so the break is taken.
        let paragraph = sentence.repeat(60);
        let text = format!("{}\n\n{}", paragraph.trim(), sentence.repeat(150).trim());
        let parts = split(&text, 4096);
        assert!(parts.len() >= 3, "{}", parts.len());
        assert!(parts.iter().all(|p| p.chars().count() <= 4096));
        // The first cut is the paragraph break; the next ones end sentences.
        assert_eq!(parts[0], paragraph.trim());
        assert!(
            parts[1].ends_with('.'),
            "{}",
            &parts[1][parts[1].len() - 20..]
        );
        let rejoined: String = parts.concat().split_whitespace().collect();
        let original: String = text.split_whitespace().collect();
        assert_eq!(rejoined, original);
    }

    #[test]
    fn a_text_without_spaces_is_cut_at_the_limit() {
        let text = "é".repeat(9000);
        let parts = split(&text, 4096);
        assert_eq!(
            parts.iter().map(|p| p.chars().count()).collect::<Vec<_>>(),
            [4096, 4096, 808]
        );
    }

    #[test]
    fn markdown_becomes_telegram_html_with_the_rest_escaped() {
        let md = "**Bold** and *it* with `a<b>` & [docs](https://x.test/?a=1&b=2)\n```\nif a < b {}\n```\n2 * 3 * 4";
        assert_eq!(
            telegram_html(md),
            "<b>Bold</b> and <i>it</i> with <code>a&lt;b&gt;</code> &amp; \
             <a href=\"https://x.test/?a=1&amp;b=2\">docs</a>\n<pre>\nif a &lt; b {}\n</pre>\n2 * 3 * 4"
        );
    }

    #[test]
    fn markdown_becomes_slack_mrkdwn() {
        assert_eq!(
            slack_mrkdwn("**Bold** <x> [docs](https://x.test)"),
            "*Bold* &lt;x&gt; <https://x.test|docs>"
        );
    }

    #[test]
    fn escaping_that_lengthens_a_part_past_the_limit_cuts_it_again() {
        let text = "<&> ".repeat(2000);
        let parts = parts(Kind::Telegram, &text);
        assert!(parts.len() > 2);
        assert!(parts.iter().all(|(p, _)| p.chars().count() <= 4096));
    }
}
