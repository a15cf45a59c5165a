//! Masking a session's secret values in tool output (SPEC W12).
//!
//! Every occurrence of a value of the session's [`SessionEnv`] becomes `[secret:NAME]`.
//! The worker masks before output leaves it (streamed lines and results), the brain masks
//! again what it receives (defense in depth), so a value never reaches the model, the UI
//! stream, the store or a log even if one side misses it.
//!
//! Output that is streamed arrives in arbitrary pieces: [`StreamMask`] holds back the end
//! of what it was given while that end could still be the start of a value (at most the
//! longest value's length minus one byte), so a value cut across two reads is masked
//! too. Output that does not end in a possible start of a value is never held.
//!
//! Where values overlap, the longest match at the leftmost position wins. Values shorter
//! than `protocol::env::MIN_VALUE` are never masked (nor sent).

use std::sync::Arc;

use protocol::env::{MIN_VALUE, SessionEnv};
use serde_json::Value;

/// The values to mask and what replaces each. `Debug` shows the count only.
pub struct Masks {
    /// (value, replacement), longest value first.
    values: Vec<(Vec<u8>, Vec<u8>)>,
    /// For each first byte, the indexes into `values` that start with it, longest first.
    by_first: Vec<Vec<usize>>,
    longest: usize,
}

impl std::fmt::Debug for Masks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Masks({} values)", self.values.len())
    }
}

impl Default for Masks {
    fn default() -> Self {
        Self::new(&SessionEnv::default())
    }
}

impl Masks {
    pub fn new(env: &SessionEnv) -> Self {
        let mut values: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        // By name: of two secrets holding the same value, the first name is shown.
        for (name, value) in &env.vars {
            if value.len() >= MIN_VALUE && !values.iter().any(|(v, _)| v == value.as_bytes()) {
                values.push((
                    value.as_bytes().to_vec(),
                    format!("[secret:{name}]").into_bytes(),
                ));
            }
        }
        values.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        let mut by_first = vec![Vec::new(); 256];
        for (i, (value, _)) in values.iter().enumerate() {
            by_first[usize::from(value[0])].push(i);
        }
        let longest = values.first().map_or(0, |(value, _)| value.len());
        Self {
            values,
            by_first,
            longest,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The longest value that starts `rest`, if any.
    fn match_at(&self, rest: &[u8]) -> Option<&(Vec<u8>, Vec<u8>)> {
        let first = usize::from(*rest.first()?);
        self.by_first[first]
            .iter()
            .map(|&i| &self.values[i])
            .find(|(value, _)| rest.starts_with(value))
    }

    /// Whether a value could still begin at the start of `rest`, the end of what arrived
    /// so far: `rest` is the beginning of a value, or holds one that a longer value may
    /// extend.
    fn undecided(&self, rest: &[u8]) -> bool {
        let Some(first) = rest.first() else {
            return false;
        };
        self.by_first[usize::from(*first)].iter().any(|&i| {
            let value = &self.values[i].0;
            value.starts_with(rest) || rest.starts_with(value)
        })
    }

    /// The values starting in the first `until` bytes of `bytes` masked, appended to
    /// `out`; returns where it stopped: `until`, or past it when a match runs past it.
    fn mask_into(&self, bytes: &[u8], until: usize, out: &mut Vec<u8>) -> usize {
        let mut at = 0;
        while at < until {
            match self.match_at(&bytes[at..]) {
                Some((value, replacement)) => {
                    out.extend_from_slice(replacement);
                    at += value.len();
                }
                None => {
                    out.push(bytes[at]);
                    at += 1;
                }
            }
        }
        at
    }

    /// `bytes`, whole, with every value masked.
    pub fn mask_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        if self.is_empty() {
            return bytes.to_vec();
        }
        let mut out = Vec::with_capacity(bytes.len());
        self.mask_into(bytes, bytes.len(), &mut out);
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
        let at = self.masks.mask_into(&buf, settled, &mut out);
        let hold_from = (at..buf.len())
            .find(|&i| self.masks.undecided(&buf[i..]))
            .unwrap_or(buf.len());
        out.extend_from_slice(&buf[at..hold_from]);
        self.held = buf.split_off(hold_from);
        out
    }

    /// The end of the stream: what was held, masked.
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
        // The stream ends on a value's beginning: it goes out as it is.
        assert_eq!(stream.finish(), b"secret-val");
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
    }
}
