//! Bounded capture of a byte stream (spec/tools.md §6.2): a head window and a tail window of the
//! raw bytes, exact totals over the whole stream, and — for the stream the model sees — head and
//! tail windows of the lossy-UTF-8 *decoded* text with its exact length, character and line
//! counts.
//!
//! Why decoded windows as well as raw ones: the model text is computed from the lossy decoding,
//! whose byte offsets differ from the raw ones wherever the output has invalid UTF-8 (one bad
//! byte becomes the three bytes of U+FFFD). Re-decoding a raw window cannot reproduce the decoding
//! of the whole stream at the window edges, so the decoder runs incrementally over every byte and
//! the windows are cut from its output. Nothing is silently dropped: what leaves the windows is
//! counted in `dropped_bytes`, and the totals always describe the whole stream.

use std::collections::VecDeque;

use super::denial::KeywordScanner;
use super::truncate::{TextView, floor_char_boundary};

/// Raw head window (`CAPTURE_HEAD_BYTES`, §6.2).
pub const CAPTURE_HEAD_BYTES: usize = 512 * 1024;
/// Raw tail window (`CAPTURE_TAIL_BYTES`, §6.2).
pub const CAPTURE_TAIL_BYTES: usize = 512 * 1024;
/// The largest truncation budget that windowed text can serve exactly (§6.2).
pub const MAX_TRUNCATION_BUDGET: usize = CAPTURE_HEAD_BYTES + CAPTURE_TAIL_BYTES;

/// Extra decoded bytes kept on each side beyond half the maximal budget. With them, text that
/// does not fit the two windows is necessarily longer than `MAX_TRUNCATION_BUDGET` (the head
/// window may end up to 3 bytes short, because it only ever holds whole characters), so a text
/// within the budget is always held completely.
const TEXT_WINDOW_SLACK: usize = 4;

/// Window sizes of a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureLimits {
    /// Raw bytes kept from the start of the stream.
    pub head_bytes: usize,
    /// Raw bytes kept from the end of the stream (never overlapping the head window).
    pub tail_bytes: usize,
    /// Decoded bytes kept on each side for model text; `None` for streams the model never sees.
    pub text_window_bytes: Option<usize>,
}

impl CaptureLimits {
    /// Raw windows only (the separate stdout and stderr of the typed result).
    pub const RAW: CaptureLimits = CaptureLimits {
        head_bytes: CAPTURE_HEAD_BYTES,
        tail_bytes: CAPTURE_TAIL_BYTES,
        text_window_bytes: None,
    };

    /// Raw windows plus decoded text windows large enough for any budget up to
    /// `MAX_TRUNCATION_BUDGET` (the arrival-order stream the model sees).
    pub const WITH_TEXT: CaptureLimits = CaptureLimits {
        head_bytes: CAPTURE_HEAD_BYTES,
        tail_bytes: CAPTURE_TAIL_BYTES,
        text_window_bytes: Some(MAX_TRUNCATION_BUDGET / 2 + TEXT_WINDOW_SLACK),
    };

    /// The largest budget the text windows of these limits serve exactly.
    pub fn max_text_budget(&self) -> usize {
        self.text_window_bytes
            .map_or(0, |w| 2 * w.saturating_sub(TEXT_WINDOW_SLACK))
    }
}

/// Accumulates a stream as it arrives; [`CaptureBuffer::finish`] yields the [`Captured`] result.
#[derive(Debug)]
pub struct CaptureBuffer {
    limits: CaptureLimits,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total_bytes: u64,
    dropped_bytes: u64,
    decoder: LossyDecoder,
    text_len: u64,
    chars: u64,
    newlines: u64,
    last_char_newline: bool,
    text: Option<TextWindows>,
    keywords: KeywordScanner,
}

impl CaptureBuffer {
    pub fn new(limits: CaptureLimits) -> Self {
        CaptureBuffer {
            limits,
            head: Vec::new(),
            tail: VecDeque::new(),
            total_bytes: 0,
            dropped_bytes: 0,
            decoder: LossyDecoder::default(),
            text_len: 0,
            chars: 0,
            newlines: 0,
            last_char_newline: false,
            text: limits.text_window_bytes.map(TextWindows::new),
            keywords: KeywordScanner::default(),
        }
    }

    /// Appends a chunk of the stream.
    pub fn push(&mut self, data: &[u8]) {
        self.total_bytes += data.len() as u64;
        self.keywords.scan(data);
        self.push_raw(data);
        let mut decoded = std::mem::take(&mut self.decoder);
        decoded.feed(data, |s| self.push_text(s));
        self.decoder = decoded;
    }

    /// Ends the stream: a trailing incomplete UTF-8 sequence becomes U+FFFD, as in
    /// `String::from_utf8_lossy`.
    pub fn finish(mut self) -> Captured {
        let mut decoder = std::mem::take(&mut self.decoder);
        decoder.finish(|s| self.push_text(s));
        let lines = self.newlines + u64::from(self.chars > 0 && !self.last_char_newline);
        Captured {
            head: self.head,
            tail: Vec::from(self.tail),
            total_bytes: self.total_bytes,
            dropped_bytes: self.dropped_bytes,
            text_len: self.text_len,
            total_chars: self.chars,
            total_lines: lines,
            text: self.text.map(TextWindows::finish),
            denial_keyword: self.keywords.found(),
        }
    }

    fn push_raw(&mut self, mut data: &[u8]) {
        let room = self.limits.head_bytes - self.head.len();
        if room > 0 {
            let n = room.min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        self.dropped_bytes += push_ring(&mut self.tail, self.limits.tail_bytes, data, false);
    }

    fn push_text(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        self.text_len += s.len() as u64;
        self.chars += s.chars().count() as u64;
        self.newlines += s.bytes().filter(|&b| b == b'\n').count() as u64;
        self.last_char_newline = s.ends_with('\n');
        if let Some(text) = &mut self.text {
            text.push(s);
        }
    }
}

/// A captured stream: raw windows, exact totals and (if requested) decoded text windows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first raw bytes (up to the head window).
    pub head: Vec<u8>,
    /// The last raw bytes after the head window; `head + tail` is the whole stream iff
    /// `dropped_bytes == 0`.
    pub tail: Vec<u8>,
    /// Raw bytes in the whole stream.
    pub total_bytes: u64,
    /// Raw bytes between the windows, not kept (but delivered to the chunk callback).
    pub dropped_bytes: u64,
    /// Bytes of the lossy-UTF-8 decoding of the whole stream.
    pub text_len: u64,
    /// Characters of the lossy-UTF-8 decoding of the whole stream.
    pub total_chars: u64,
    /// Lines (`str::lines()` semantics) of the lossy-UTF-8 decoding of the whole stream.
    pub total_lines: u64,
    text: Option<CapturedText>,
    denial_keyword: bool,
}

impl Captured {
    /// The decoded text as a [`TextView`], if this capture kept text windows.
    pub fn text_view(&self) -> Option<TextView<'_>> {
        self.text.as_ref().map(|t| {
            TextView::windowed(
                &t.head,
                &t.tail,
                self.text_len as usize,
                self.total_chars as usize,
                self.total_lines as usize,
            )
        })
    }

    /// The decoded head and tail text windows (`head + tail` is the whole text iff nothing
    /// was dropped from them).
    pub fn text_windows(&self) -> Option<(&str, &str)> {
        self.text
            .as_ref()
            .map(|t| (t.head.as_str(), t.tail.as_str()))
    }

    /// The whole raw stream, if it fit the windows.
    pub fn complete_bytes(&self) -> Option<Vec<u8>> {
        (self.dropped_bytes == 0).then(|| [self.head.as_slice(), self.tail.as_slice()].concat())
    }

    /// Whether the lowercased stream contains one of the sandbox-denial keywords
    /// (spec/sandbox.md §5.1 step 2), scanned over every byte, not just the windows.
    pub fn has_denial_keyword(&self) -> bool {
        self.denial_keyword
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct CapturedText {
    head: String,
    tail: String,
}

/// Decoded-text windows: the first `cap` bytes (whole characters only) and the last `cap`
/// bytes after them (whole characters only).
#[derive(Debug)]
struct TextWindows {
    cap: usize,
    head: String,
    head_closed: bool,
    tail: VecDeque<u8>,
}

impl TextWindows {
    fn new(cap: usize) -> Self {
        TextWindows {
            cap,
            head: String::new(),
            head_closed: false,
            tail: VecDeque::new(),
        }
    }

    fn push(&mut self, mut s: &str) {
        if !self.head_closed {
            let room = self.cap - self.head.len();
            if s.len() <= room {
                self.head.push_str(s);
                return;
            }
            // The head must stay a prefix of the text: once a character does not fit, nothing
            // more goes into it, even a shorter character that would.
            let cut = floor_char_boundary(s, room);
            self.head.push_str(&s[..cut]);
            self.head_closed = true;
            s = &s[cut..];
        }
        push_ring(&mut self.tail, self.cap, s.as_bytes(), true);
    }

    fn finish(self) -> CapturedText {
        let tail = String::from_utf8(Vec::from(self.tail))
            .expect("the tail window is cut on character boundaries");
        CapturedText {
            head: self.head,
            tail,
        }
    }
}

/// Appends `data` to a ring of at most `cap` bytes, returning how many bytes fell out. With
/// `char_aligned`, the ring (which then holds UTF-8) also drops the continuation bytes of a
/// character cut at its front, so it always starts on a character boundary.
fn push_ring(ring: &mut VecDeque<u8>, cap: usize, data: &[u8], char_aligned: bool) -> u64 {
    let mut dropped = 0u64;
    if data.len() >= cap {
        dropped += (ring.len() + data.len() - cap) as u64;
        ring.clear();
        ring.extend(&data[data.len() - cap..]);
    } else {
        let overflow = (ring.len() + data.len()).saturating_sub(cap);
        if overflow > 0 {
            ring.drain(..overflow);
            dropped += overflow as u64;
        }
        ring.extend(data);
    }
    if char_aligned && dropped > 0 {
        while ring.front().is_some_and(|&b| (b & 0xC0) == 0x80) {
            ring.pop_front();
            dropped += 1;
        }
    }
    dropped
}

/// Incremental lossy UTF-8 decoder whose output, concatenated, equals
/// `String::from_utf8_lossy` of the concatenated input, however the input is split. An
/// incomplete sequence at the end of a chunk is held back until the next chunk decides whether
/// it is a character or an invalid subsequence.
#[derive(Debug, Default)]
struct LossyDecoder {
    pending: Vec<u8>,
}

impl LossyDecoder {
    fn feed(&mut self, data: &[u8], mut out: impl FnMut(&str)) {
        if self.pending.is_empty() {
            let rest = decode_complete(data, &mut out);
            self.pending.extend_from_slice(rest);
        } else {
            // Only the bytes that can complete the pending sequence are copied; after that the
            // chunk is decoded in place.
            let take = data.len().min(4);
            let mut joined = std::mem::take(&mut self.pending);
            let joined_len = joined.len();
            joined.extend_from_slice(&data[..take]);
            let rest_len = decode_complete(&joined, &mut out).len();
            let consumed = joined.len() - rest_len;
            if consumed < joined_len {
                // Still incomplete: the chunk was shorter than the missing bytes.
                self.pending = joined;
                self.pending.drain(..consumed);
            } else {
                let rest = decode_complete(&data[consumed - joined_len..], &mut out);
                self.pending.extend_from_slice(rest);
            }
        }
    }

    fn finish(&mut self, mut out: impl FnMut(&str)) {
        if !self.pending.is_empty() {
            out("\u{FFFD}");
            self.pending.clear();
        }
    }
}

/// Decodes `data` lossily up to a trailing incomplete sequence, which it returns undecoded.
fn decode_complete<'a>(mut data: &'a [u8], out: &mut impl FnMut(&str)) -> &'a [u8] {
    loop {
        match std::str::from_utf8(data) {
            Ok(s) => {
                out(s);
                return &[];
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out(std::str::from_utf8(&data[..valid]).expect("validated prefix"));
                match e.error_len() {
                    Some(n) => {
                        out("\u{FFFD}");
                        data = &data[valid + n..];
                    }
                    None => return &data[valid..],
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::shell::truncate::{TruncationPolicy, count_lines, formatted_truncate_view};

    /// Deterministic xorshift, so the property tests need no extra crate.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
        let pieces: [&[u8]; 12] = [
            b"a",
            b"\n",
            "é".as_bytes(),
            "😀".as_bytes(),
            "\u{2026}".as_bytes(),
            b"\xff",
            b"\xe2\x82",
            b"\xf0\x9f\x98",
            b"\x80",
            b"\xc3",
            b"\r\n",
            b"permission DENIED",
        ];
        let mut v = Vec::new();
        while v.len() < n {
            v.extend_from_slice(pieces[rng.below(pieces.len())]);
        }
        v
    }

    fn capture_in_chunks(data: &[u8], limits: CaptureLimits, rng: &mut Rng) -> Captured {
        let mut buf = CaptureBuffer::new(limits);
        let mut rest = data;
        while !rest.is_empty() {
            let n = (1 + rng.below(9)).min(rest.len());
            buf.push(&rest[..n]);
            rest = &rest[n..];
        }
        buf.finish()
    }

    #[test]
    fn decoder_matches_from_utf8_lossy_for_any_split() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for round in 0..300 {
            let data = random_bytes(&mut rng, 1 + round % 60);
            let mut out = String::new();
            let mut dec = LossyDecoder::default();
            let mut rest = data.as_slice();
            while !rest.is_empty() {
                let n = (1 + rng.below(5)).min(rest.len());
                dec.feed(&rest[..n], |s| out.push_str(s));
                rest = &rest[n..];
            }
            dec.finish(|s| out.push_str(s));
            assert_eq!(out, String::from_utf8_lossy(&data), "{data:?}");
        }
    }

    #[test]
    fn totals_and_windows_are_exact() {
        let mut rng = Rng(42);
        let limits = CaptureLimits {
            head_bytes: 16,
            tail_bytes: 16,
            text_window_bytes: Some(24),
        };
        for round in 0..300 {
            let data = random_bytes(&mut rng, round % 90);
            let cap = capture_in_chunks(&data, limits, &mut rng);
            let text = String::from_utf8_lossy(&data);
            assert_eq!(cap.total_bytes, data.len() as u64);
            assert_eq!(cap.text_len, text.len() as u64);
            assert_eq!(cap.total_chars, text.chars().count() as u64);
            assert_eq!(cap.total_lines, count_lines(&text) as u64);
            assert_eq!(
                cap.dropped_bytes,
                (data.len() as u64).saturating_sub(32),
                "raw windows"
            );
            assert_eq!(&cap.head[..], &data[..data.len().min(16)]);
            assert_eq!(
                &cap.tail[..],
                &data[data.len().min(16).max(data.len().saturating_sub(16))..]
            );
            if cap.dropped_bytes == 0 {
                assert_eq!(cap.complete_bytes().unwrap(), data);
            }
            assert_eq!(
                cap.has_denial_keyword(),
                text.to_lowercase().contains("permission denied")
            );
            // Windowed model text equals full-text model text for every budget it serves.
            let view = cap.text_view().unwrap();
            for budget in 0..=limits.max_text_budget() {
                for policy in [
                    TruncationPolicy::Bytes(budget),
                    TruncationPolicy::Tokens(budget / 4),
                ] {
                    assert_eq!(
                        formatted_truncate_view(view, policy),
                        crate::tools::shell::truncate::formatted_truncate_text(&text, policy),
                        "{data:?} {policy:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn three_million_x_beyond_the_windows() {
        let mut buf = CaptureBuffer::new(CaptureLimits::WITH_TEXT);
        let chunk = vec![b'x'; 65_536];
        let mut left = 3_000_000usize;
        while left > 0 {
            let n = left.min(chunk.len());
            buf.push(&chunk[..n]);
            left -= n;
        }
        let cap = buf.finish();
        assert_eq!(cap.total_bytes, 3_000_000);
        assert_eq!(cap.dropped_bytes, 1_951_424);
        assert_eq!(cap.head.len(), CAPTURE_HEAD_BYTES);
        assert_eq!(cap.tail.len(), CAPTURE_TAIL_BYTES);
        let out = formatted_truncate_view(cap.text_view().unwrap(), TruncationPolicy::default());
        let expected = format!(
            "Total output lines: 1\n\n{}\u{2026}2990000 chars truncated\u{2026}{}",
            "x".repeat(5000),
            "x".repeat(5000)
        );
        assert_eq!(out, expected);
        // The largest budget is still exact.
        let out = formatted_truncate_view(
            cap.text_view().unwrap(),
            TruncationPolicy::Bytes(MAX_TRUNCATION_BUDGET),
        );
        assert!(out.contains("\u{2026}1951424 chars truncated\u{2026}"));
    }

    #[test]
    fn text_at_the_cap_is_held_completely() {
        // A 4-byte character straddling the head window edge leaves the head 3 bytes short; the
        // slack keeps a text of exactly MAX_TRUNCATION_BUDGET bytes whole.
        let mut data = vec![b'a'; MAX_TRUNCATION_BUDGET / 2 + TEXT_WINDOW_SLACK - 1];
        data.extend_from_slice("😀".as_bytes());
        data.resize(MAX_TRUNCATION_BUDGET, b'b');
        let mut buf = CaptureBuffer::new(CaptureLimits::WITH_TEXT);
        buf.push(&data);
        let cap = buf.finish();
        let view = cap.text_view().unwrap();
        assert!(view.is_complete());
        let out = formatted_truncate_view(view, TruncationPolicy::Bytes(MAX_TRUNCATION_BUDGET));
        assert_eq!(out.as_bytes(), data.as_slice());
    }
}
