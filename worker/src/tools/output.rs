//! Output capping: keep the head and the tail, say how much was cut in between.
//!
//! Everything the model reads is bounded. [`Capped`] takes bytes as they arrive (a
//! command's output can be any size) and keeps the first half of the cap and a ring of
//! the last half; [`render`] joins the two with [`marker`] and repairs UTF-8 cut at
//! either edge.

use std::collections::VecDeque;

/// The line put where bytes were dropped.
pub fn marker(dropped: u64) -> String {
    format!("\n[... {dropped} bytes truncated ...]\n")
}

/// A byte sink that keeps at most `cap` bytes: the first `cap / 2` and the last rest.
#[derive(Debug)]
pub struct Capped {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl Capped {
    pub fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        Self {
            head_cap,
            tail_cap: cap - head_cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.head_cap.saturating_sub(self.head.len());
        let (to_head, rest) = bytes.split_at(room.min(bytes.len()));
        self.head.extend_from_slice(to_head);
        bytes = rest;
        if bytes.len() >= self.tail_cap {
            self.tail.clear();
            self.tail
                .extend(bytes[bytes.len() - self.tail_cap..].iter().copied());
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(bytes.iter().copied());
    }

    /// Bytes pushed so far, kept or not.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The kept text, with the marker if anything was dropped.
    pub fn finish(self) -> String {
        let kept = (self.head.len() + self.tail.len()) as u64;
        let tail: Vec<u8> = self.tail.into_iter().collect();
        render(&self.head, self.total - kept, &tail)
    }
}

/// `head`, then the marker for `dropped` bytes (if any), then `tail`, as text. A character
/// cut at the end of `head` or the start of `tail` is dropped (and counted) rather than
/// shown as garbage; other invalid bytes become U+FFFD.
pub fn render(head: &[u8], dropped: u64, tail: &[u8]) -> String {
    if dropped == 0 {
        let mut all = head.to_vec();
        all.extend_from_slice(tail);
        return String::from_utf8_lossy(&all).into_owned();
    }
    let head_end = match std::str::from_utf8(head) {
        Err(err) if err.error_len().is_none() => err.valid_up_to(),
        _ => head.len(),
    };
    let tail_start = tail
        .iter()
        .take(3)
        .take_while(|b| (**b & 0b1100_0000) == 0b1000_0000)
        .count();
    let dropped = dropped + (head.len() - head_end) as u64 + tail_start as u64;
    let mut text = String::from_utf8_lossy(&head[..head_end]).into_owned();
    text.push_str(&marker(dropped));
    text.push_str(&String::from_utf8_lossy(&tail[tail_start..]));
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut c = Capped::new(16);
        c.push(b"hello ");
        c.push(b"world");
        assert_eq!(c.total(), 11);
        assert_eq!(c.finish(), "hello world");
        let mut exact = Capped::new(4);
        exact.push(b"abcd");
        assert_eq!(exact.finish(), "abcd");
    }

    #[test]
    fn long_output_keeps_head_and_tail_with_the_marker() {
        let mut c = Capped::new(8);
        for chunk in [b"0123".as_slice(), b"456789", b"abcdef"] {
            c.push(chunk);
        }
        assert_eq!(c.total(), 16);
        assert_eq!(c.finish(), "0123\n[... 8 bytes truncated ...]\ncdef");
        // One huge push behaves like many small ones.
        let mut big = Capped::new(8);
        big.push(b"0123456789abcdef");
        assert_eq!(big.finish(), "0123\n[... 8 bytes truncated ...]\ncdef");
    }

    #[test]
    fn a_character_cut_at_the_edges_is_dropped_and_counted() {
        // "é" is two bytes: the head ends in its first, the tail starts with its second.
        let text = "aaaé-----ébbb";
        let mut c = Capped::new(8);
        c.push(text.as_bytes());
        let out = c.finish();
        assert_eq!(out, "aaa\n[... 9 bytes truncated ...]\nbbb");
    }
}
