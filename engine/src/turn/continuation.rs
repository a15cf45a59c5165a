//! Continuing an answer cut by the output limit (T19): the join of a continuation to the
//! answer so far. Models asked to go on often repeat the end of what they wrote; the
//! longest end of the answer (up to [`MAX_OVERLAP`] characters) that the continuation
//! starts with is dropped from it, so the answer reads once. The continuation's first
//! characters are held back until that is decided ([`decided`]), so the client is never
//! shown text it would have to take back.

/// The instruction that follows the partial answer in the continuing call.
pub(super) const INSTRUCTION: &str = "Your previous answer was cut off by the output limit. \
     Continue it exactly where it stopped: do not repeat any of it, do not start over, do \
     not comment on the interruption.";

/// The longest overlap looked for, in characters.
const MAX_OVERLAP: usize = 200;
/// Shorter repeats are taken for coincidence (a word that happens to recur), not for a
/// restart: dropping them could drop words the model meant.
const MIN_OVERLAP: usize = 8;

/// Whether `held`, the continuation's start so far, is enough to decide its overlap with
/// `answer`: it is as long as the longest overlap can be, or it no longer occurs in the
/// answer's end, so no longer overlap can come.
pub(super) fn decided(answer: &str, held: &str) -> bool {
    let body = held.trim_start();
    let end = tail(answer.trim_end());
    body.chars().count() >= end.chars().count() || !end.contains(body)
}

/// What of `held` joins `answer`: all of it, or what follows the overlap.
pub(super) fn fresh<'a>(answer: &str, held: &'a str) -> &'a str {
    let body = held.trim_start();
    let end = answer.trim_end();
    let overlap = body
        .char_indices()
        .map(|(at, c)| at + c.len_utf8())
        .take(MAX_OVERLAP)
        .skip(MIN_OVERLAP - 1)
        .filter(|&len| end.ends_with(&body[..len]))
        .last();
    match overlap {
        None => held,
        // The answer's own trailing space stands; the continuation's is not doubled.
        Some(len) if end.len() < answer.len() => body[len..].trim_start(),
        Some(len) => &body[len..],
    }
}

/// The last [`MAX_OVERLAP`] characters.
fn tail(text: &str) -> &str {
    let start = text
        .char_indices()
        .rev()
        .nth(MAX_OVERLAP - 1)
        .map_or(0, |(at, _)| at);
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(answer: &str, continuation: &str) -> String {
        format!("{answer}{}", fresh(answer, continuation))
    }

    #[test]
    fn a_repeated_end_is_joined_once() {
        let answer = "The first point is speed. The second point is cost";
        assert_eq!(
            join(answer, "The second point is cost, which matters."),
            "The first point is speed. The second point is cost, which matters."
        );
        assert_eq!(
            join(answer, "  second point is cost, which matters."),
            "The first point is speed. The second point is cost, which matters."
        );
        assert_eq!(
            join("Lists come first. ", " Lists come first. Then maps."),
            "Lists come first. Then maps."
        );
    }

    #[test]
    fn a_plain_continuation_is_kept_whole() {
        assert_eq!(
            join("It was the be", "st of times"),
            "It was the best of times"
        );
        assert_eq!(join("one two", " three"), "one two three");
        // A short coincidence is not taken for a repeat.
        assert_eq!(join("go to the", "the end"), "go to thethe end");
    }

    #[test]
    fn the_overlap_is_bounded_and_respects_characters() {
        let long = "é".repeat(300);
        let answer = format!("start {long}");
        // Only the last 200 characters can be an overlap: a longer repeat keeps its head.
        let joined = join(&answer, &format!("{long} end"));
        assert_eq!(joined, format!("start {long}{} end", "é".repeat(100)));
        assert_eq!(
            join("naïve café au lait", "café au lait!"),
            "naïve café au lait!"
        );
    }

    #[test]
    fn the_decision_waits_only_while_a_longer_overlap_can_come() {
        let answer = "The first point is speed. The second point is cost";
        assert!(!decided(answer, ""));
        assert!(!decided(answer, "  The sec"));
        assert!(decided(answer, "Moreover"));
        assert!(decided(answer, answer));
        assert!(decided("short", "short and more"));
    }
}
