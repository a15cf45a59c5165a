//! Masking a session's secret values in tool output (SPEC W12).
//!
//! Every occurrence of a value of the session's [`SessionEnv`] becomes `[secret:NAME]`.
//! The worker masks before output leaves it (streamed lines and results), the brain masks
//! again what it receives (defense in depth), so a value never reaches the model, the UI
//! stream, the store or a log even if one side misses it. The brain masks a connector's
//! results the same way, with the values its credentials were filled with.
//!
//! A value is also recognised in base64 (standard and URL-safe): encoded alone, and inside
//! longer encoded data at each of its three possible offsets, where the characters that
//! carry only the value's bits are always the same (the one or two at each edge that also
//! carry a neighbour's bits stay). Values shorter than `protocol::env::MIN_VALUE` are never
//! masked (nor sent), nor is an encoded form that short.
//!
//! Output that is streamed arrives in arbitrary pieces: [`StreamMask`] holds back the end
//! of what it was given while that end could still be the start of a value (at most the
//! longest value's length minus one byte), so a value cut across two reads is masked
//! too. Output that does not end in a possible start of a value is never held. Where a
//! text or a stream ends in the beginning of a value (a command cut off, a value printed
//! short of its end), that beginning is masked as the value when it has at least
//! `MIN_VALUE` bytes.
//!
//! Where values overlap, the longest match at the leftmost position wins.
//!
//! What masking does not promise (it is hygiene, not a boundary): a value transformed in
//! any other way (hex, reversed, split by the command's own output, quoted with escapes) or
//! only a piece of it inside the output passes as it is; a resource's base64 `blob` is not
//! masked, since replacing text there would corrupt the file; nor are the bytes of a file a
//! tool uploads as an artifact.

use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use protocol::env::{MIN_VALUE, SessionEnv};
use serde_json::Value;

/// The most bytes of values (encoded forms included) masked through the automaton: it
/// takes about five times their size in memory and builds at about 20 MB/s, so values far
/// longer than secrets usually are (up to 100 of 8 KiB each) are scanned byte by byte
/// instead, ten times slower but with no memory beyond the values.
const FINDER_MAX_BYTES: usize = 1 << 20;

/// The values to mask and what replaces each. `Debug` shows the count of secrets only.
pub struct Masks {
    /// (value or encoded form, replacement), longest first.
    values: Vec<(Vec<u8>, Vec<u8>)>,
    /// For each first byte, the indexes into `values` that start with it, longest first.
    by_first: Vec<Vec<usize>>,
    /// Finds the leftmost-longest value in one pass; its pattern ids index `values`.
    /// `None` without values, past [`FINDER_MAX_BYTES`] or if it could not be built: the
    /// scan byte by byte then masks everything.
    finder: Option<AhoCorasick>,
    longest: usize,
    /// Distinct values masked (their encoded forms not counted).
    secrets: usize,
}

impl std::fmt::Debug for Masks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Masks({} values)", self.secrets)
    }
}

impl Default for Masks {
    fn default() -> Self {
        Self::new(&SessionEnv::default())
    }
}

/// The base64 text `value` always becomes, in both alphabets: encoded alone (padded), and
/// for each offset it may have in longer data (0, 1 or 2 bytes into a 3-byte group) the
/// characters that carry the value's bits only.
fn base64_forms(value: &[u8]) -> Vec<Vec<u8>> {
    let mut forms = Vec::with_capacity(8);
    for (padded, unpadded) in [(&STANDARD, &STANDARD_NO_PAD), (&URL_SAFE, &URL_SAFE_NO_PAD)] {
        forms.push(padded.encode(value).into_bytes());
        for offset in 0..3 {
            let mut placed = vec![0u8; offset];
            placed.extend_from_slice(value);
            let encoded = unpadded.encode(&placed).into_bytes();
            // Character i carries bits 6i..6i+6; the value's are 8·offset..8·(offset+len).
            let first = (8 * offset).div_ceil(6);
            let end = 8 * placed.len() / 6;
            forms.push(encoded[first..end].to_vec());
        }
    }
    forms
}

impl Masks {
    pub fn new(env: &SessionEnv) -> Self {
        Self::of(
            env.vars
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str())),
        )
    }

    /// The masks of `(name, value)` pairs: by name, so of two holding the same value the
    /// first name is shown; a value's own text wins over another's encoded form.
    pub fn of<'a>(secrets: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let secrets: Vec<(&str, &str)> = secrets
            .into_iter()
            .filter(|(_, value)| value.len() >= MIN_VALUE)
            .collect();
        let mut values: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut add = |value: Vec<u8>, name: &str| {
            if value.len() >= MIN_VALUE && !values.iter().any(|(v, _)| *v == value) {
                values.push((value, format!("[secret:{name}]").into_bytes()));
                true
            } else {
                false
            }
        };
        let mut count = 0;
        for (name, value) in &secrets {
            count += usize::from(add(value.as_bytes().to_vec(), name));
        }
        for (name, value) in &secrets {
            for form in base64_forms(value.as_bytes()) {
                add(form, name);
            }
        }
        values.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        let mut by_first = vec![Vec::new(); 256];
        for (i, (value, _)) in values.iter().enumerate() {
            by_first[usize::from(value[0])].push(i);
        }
        let longest = values.first().map_or(0, |(value, _)| value.len());
        let pattern_bytes: usize = values.iter().map(|(value, _)| value.len()).sum();
        let finder = (!values.is_empty() && pattern_bytes <= FINDER_MAX_BYTES)
            .then(|| {
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(values.iter().map(|(value, _)| value))
                    .ok()
            })
            .flatten();
        Self {
            values,
            by_first,
            finder,
            longest,
            secrets: count,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The values starting with `rest`'s first byte, longest first.
    fn starting_like(&self, rest: &[u8]) -> impl Iterator<Item = &(Vec<u8>, Vec<u8>)> {
        let indexes = match rest.first() {
            Some(first) => self.by_first[usize::from(*first)].as_slice(),
            None => &[],
        };
        indexes.iter().map(|&i| &self.values[i])
    }

    /// The longest value that starts `rest`, if any.
    fn match_at(&self, rest: &[u8]) -> Option<&(Vec<u8>, Vec<u8>)> {
        self.starting_like(rest)
            .find(|(value, _)| rest.starts_with(value))
    }

    /// The replacement of the value that `rest`, the end of the output, begins: a value cut
    /// off by the end. Fewer than `MIN_VALUE` bytes are not told apart from other text.
    fn cut_off(&self, rest: &[u8]) -> Option<&[u8]> {
        if rest.len() < MIN_VALUE {
            return None;
        }
        self.starting_like(rest)
            .find(|(value, _)| value.starts_with(rest))
            .map(|(_, replacement)| replacement.as_slice())
    }

    /// Whether a value could still begin at the start of `rest`, the end of what arrived
    /// so far: `rest` is the beginning of a value, or holds one that a longer value may
    /// extend.
    fn undecided(&self, rest: &[u8]) -> bool {
        self.starting_like(rest)
            .any(|(value, _)| value.starts_with(rest) || rest.starts_with(value))
    }

    /// The values starting in the first `until` bytes of `bytes` masked, appended to
    /// `out`; returns where it stopped: `until`, or past it when a match runs past it.
    /// When `bytes` is the end of the output, a value it ends in the middle of is masked.
    fn mask_into(&self, bytes: &[u8], until: usize, ends: bool, out: &mut Vec<u8>) -> usize {
        let mut at = self.mask_settled(bytes, until, ends, out);
        while at < until {
            let rest = &bytes[at..];
            let found = self.match_at(rest);
            // At the end, a longer value cut off wins over a shorter one that is whole.
            let cut_off = match found {
                Some((value, _)) if value.len() == rest.len() => None,
                _ if ends => self.cut_off(rest),
                _ => None,
            };
            if let Some(replacement) = cut_off {
                out.extend_from_slice(replacement);
                at = bytes.len();
            } else if let Some((value, replacement)) = found {
                out.extend_from_slice(replacement);
                at += value.len();
            } else {
                out.push(bytes[at]);
                at += 1;
            }
        }
        at
    }

    /// `mask_into` in one pass of the finder, up to where a value cut off by the end of
    /// the output could start (its last `longest - 1` bytes): there the scan byte by byte
    /// above decides. Returns where it stopped.
    fn mask_settled(&self, bytes: &[u8], until: usize, ends: bool, out: &mut Vec<u8>) -> usize {
        let Some(finder) = &self.finder else {
            return 0;
        };
        let stop = match ends {
            true => until.min(bytes.len().saturating_sub(self.longest.saturating_sub(1))),
            false => until,
        };
        let mut at = 0;
        for found in finder.find_iter(bytes) {
            if found.start() >= stop {
                break;
            }
            out.extend_from_slice(&bytes[at..found.start()]);
            out.extend_from_slice(&self.values[found.pattern().as_usize()].1);
            at = found.end();
        }
        if at < stop {
            out.extend_from_slice(&bytes[at..stop]);
            at = stop;
        }
        at
    }

    /// `bytes`, a whole output, with every value masked.
    pub fn mask_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        if self.is_empty() {
            return bytes.to_vec();
        }
        let mut out = Vec::with_capacity(bytes.len());
        self.mask_into(bytes, bytes.len(), true, &mut out);
        out
    }

    /// `text` with every value masked. Values are whole UTF-8 strings, so a match always
    /// starts and ends on a character boundary and the result stays valid text.
    pub fn mask(&self, text: &str) -> String {
        if self.is_empty() {
            return text.to_owned();
        }
        let masked = self.mask_bytes(text.as_bytes());
        String::from_utf8(masked)
            .unwrap_or_else(|err| String::from_utf8_lossy(err.as_bytes()).into_owned())
    }

    /// Masks every string in `value` except a resource's base64 `blob` (a file's bytes:
    /// a value's letters may occur in any base64 text by chance, and replacing them would
    /// corrupt the file).
    pub fn mask_json(&self, value: &mut Value) {
        if self.is_empty() {
            return;
        }
        match value {
            Value::String(text) => *text = self.mask(text),
            Value::Array(items) => items.iter_mut().for_each(|item| self.mask_json(item)),
            Value::Object(map) => {
                for (key, item) in map.iter_mut() {
                    if key != "blob" {
                        self.mask_json(item);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Masks one output stream that arrives in pieces.
pub struct StreamMask {
    masks: Arc<Masks>,
    held: Vec<u8>,
}

impl StreamMask {
    pub fn new(masks: Arc<Masks>) -> Self {
        Self {
            masks,
            held: Vec::new(),
        }
    }

    /// What of the stream so far can go out, masked; the end that may still turn into a
    /// value is held for the next piece.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        if self.masks.is_empty() {
            return bytes.to_vec();
        }
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(bytes);
        // A value starting before `settled` lies wholly in `buf`: a match there is final.
        let settled = buf.len().saturating_sub(self.masks.longest - 1);
        let mut out = Vec::with_capacity(buf.len());
        let at = self.masks.mask_into(&buf, settled, false, &mut out);
        let hold_from = (at..buf.len())
            .find(|&i| self.masks.undecided(&buf[i..]))
            .unwrap_or(buf.len());
        out.extend_from_slice(&buf[at..hold_from]);
        self.held = buf.split_off(hold_from);
        out
    }

    /// The end of the stream: what was held, masked (a value it ends in the middle of
    /// too).
    pub fn finish(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        self.masks.mask_bytes(&held)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn masks(pairs: &[(&str, &str)]) -> Arc<Masks> {
        Arc::new(Masks::new(&SessionEnv {
            vars: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }))
    }

    /// Streams `text` cut at every `cuts` offset and returns what came out.
    fn streamed(masks: &Arc<Masks>, text: &str, cuts: &[usize]) -> String {
        let mut stream = StreamMask::new(masks.clone());
        let mut out = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain([text.len()].iter()) {
            out.extend(stream.push(&text.as_bytes()[from..cut]));
            from = cut;
        }
        out.extend(stream.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_occurrence_is_masked_longest_first() {
        let m = masks(&[("A", "abcd"), ("LONG", "abcdef"), ("SHORT", "xyz")]);
        assert_eq!(
            m.mask("1abcdef2abcd3abcd"),
            "1[secret:LONG]2[secret:A]3[secret:A]"
        );
        assert_eq!(m.mask("xyz"), "xyz", "values under 4 bytes are not masked");
        assert_eq!(format!("{m:?}"), "Masks(2 values)");
        let mut json = serde_json::json!([{"type": "text", "text": "k=abcd"},
            {"type": "resource", "resource": {"uri": "workspace:///abcd", "blob": "abcd"}}]);
        m.mask_json(&mut json);
        assert_eq!(json[0]["text"], "k=[secret:A]");
        assert_eq!(json[1]["resource"]["uri"], "workspace:///[secret:A]");
        assert_eq!(json[1]["resource"]["blob"], "abcd");
    }

    #[test]
    fn a_value_split_across_pieces_is_masked() {
        let m = masks(&[("MY_TOKEN", "tok-s3cr3t-value"), ("B", "béta")]);
        let text = "before tok-s3cr3t-value middle tok-s3cr3t-value after béta!";
        let whole = "before [secret:MY_TOKEN] middle [secret:MY_TOKEN] after [secret:B]!";
        // Cut at every single offset, and in one-byte pieces.
        for cut in 0..=text.len() {
            assert_eq!(streamed(&m, text, &[cut]), whole, "cut at {cut}");
        }
        let every: Vec<usize> = (1..text.len()).collect();
        assert_eq!(streamed(&m, text, &every), whole);
    }

    #[test]
    fn only_a_possible_start_of_a_value_is_held() {
        let m = masks(&[("T", "secret-value")]);
        let mut stream = StreamMask::new(m.clone());
        assert_eq!(stream.push(b"plain output\n"), b"plain output\n");
        assert_eq!(stream.push(b"half secr"), b"half ");
        assert_eq!(stream.push(b"et-"), b"");
        assert_eq!(stream.push(b"valu"), b"");
        assert_eq!(stream.push(b"e and on"), b"[secret:T] and on");
        assert_eq!(stream.push(b" secret-val"), b" ");
        // The stream ends on a value's beginning: it goes out masked.
        assert_eq!(stream.finish(), b"[secret:T]");
        // Nothing to mask: every piece passes as it is.
        let mut none = StreamMask::new(masks(&[]));
        assert_eq!(none.push(b"abc"), b"abc");
    }

    #[test]
    fn a_short_value_that_a_longer_one_extends_waits_for_the_longer() {
        let m = masks(&[("SHORT", "abcd"), ("LONG", "abcdefgh")]);
        assert_eq!(
            streamed(&m, "x abcdefgh y abcd z", &[6]),
            "x [secret:LONG] y [secret:SHORT] z"
        );
        assert_eq!(streamed(&m, "abcd", &[]), "[secret:SHORT]");
        assert_eq!(streamed(&m, "x abcdef", &[4]), "x [secret:LONG]");
    }

    #[test]
    fn base64_forms_of_a_value_are_masked_at_every_alignment() {
        use base64::Engine as _;
        use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
        let secret = "tok-s3cr3t-value?>~";
        let m = masks(&[("T", secret)]);
        assert_eq!(m.mask(&STANDARD.encode(secret)), "[secret:T]");
        // The value after 0, 1 or 2 other bytes and before 0 to 2 more: what is left
        // beside the mask are the few characters that also carry bits of the neighbours.
        for before in ["", "a", "ab"] {
            for after in ["", "y", "yz"] {
                let text = format!("{before}{secret}{after}");
                for encoded in [STANDARD.encode(&text), URL_SAFE_NO_PAD.encode(&text)] {
                    let masked = m.mask(&format!("data: {encoded}\n"));
                    let inner = masked
                        .strip_prefix("data: ")
                        .and_then(|rest| rest.strip_suffix('\n'))
                        .unwrap();
                    let (left, right) = inner
                        .split_once("[secret:T]")
                        .unwrap_or_else(|| panic!("{before:?} {after:?}: {masked}"));
                    assert!(left.len() <= 3 && right.len() <= 6, "{masked}");
                    // Cut anywhere while streamed, the same.
                    let streamed_text = format!("data: {encoded}\n");
                    for cut in 0..=streamed_text.len() {
                        assert_eq!(streamed(&m, &streamed_text, &[cut]), masked);
                    }
                }
            }
        }
        assert_eq!(
            format!("{m:?}"),
            "Masks(1 values)",
            "the count is of values"
        );
    }

    #[test]
    fn a_value_cut_off_at_the_end_of_a_stream_is_masked() {
        let m = masks(&[("T", "secret-value")]);
        // The command printed a value short of its end, and the stream ended there.
        assert_eq!(
            streamed(&m, "token: secret-valu", &[9]),
            "token: [secret:T]"
        );
        assert_eq!(streamed(&m, "token: secr", &[]), "token: [secret:T]");
        // Fewer bytes than a value may have are not recognised as one.
        assert_eq!(streamed(&m, "token: sec", &[]), "token: sec");
        // Within the stream, a piece of a value is not a value.
        assert_eq!(streamed(&m, "secret-val\n", &[3]), "secret-val\n");
    }
}

#[cfg(test)]
mod same_as_the_scan {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A small xorshift generator: the texts differ from run to run only if the seed does.
    struct Texts(u64);

    impl Texts {
        fn next(&mut self, below: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % below as u64) as usize
        }
    }

    #[test]
    fn the_finder_masks_as_the_scan_byte_by_byte_does() {
        let pairs = [
            ("A", "abcd"),
            ("LONG", "abcdefgh"),
            ("B", "bcde"),
            ("X", "xxxx"),
            ("XL", "xxxxxxx"),
            ("T", "tok-s3cr3t?>~"),
        ];
        let with = Arc::new(Masks::of(pairs));
        let mut scan = Masks::of(pairs);
        assert!(scan.finder.take().is_some());
        let scan = Arc::new(scan);
        let pieces: Vec<Vec<u8>> = with
            .values
            .iter()
            .flat_map(|(value, _)| [value.clone(), value[..value.len() - 1].to_vec()])
            .chain(b"abcdefghx-tok3s? \n".iter().map(|b| vec![*b]))
            .collect();
        let mut texts = Texts(0x2545_f491_4f6c_dd1d);
        for _ in 0..3000 {
            let mut text = Vec::new();
            for _ in 0..texts.next(24) {
                text.extend_from_slice(&pieces[texts.next(pieces.len())]);
            }
            assert_eq!(with.mask_bytes(&text), scan.mask_bytes(&text), "{text:?}");
            let cuts = [texts.next(text.len() + 1), texts.next(text.len() + 1)];
            let (first, second) = (cuts[0].min(cuts[1]), cuts[0].max(cuts[1]));
            let stream = |masks: &Arc<Masks>| {
                let mut stream = StreamMask::new(masks.clone());
                let mut out = stream.push(&text[..first]);
                out.extend(stream.push(&text[first..second]));
                out.extend(stream.push(&text[second..]));
                out.extend(stream.finish());
                out
            };
            assert_eq!(stream(&with), stream(&scan), "{text:?} cut at {cuts:?}");
        }
    }
}
