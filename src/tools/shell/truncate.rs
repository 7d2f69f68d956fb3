//! Model-facing truncation of tool output (spec/tools.md §6.5): the `Bytes`/`Tokens` policy,
//! `formatted_truncate_text`, `truncate_text` and middle truncation.
//!
//! The algorithms are defined on the complete text, but a shell command's output is only kept as
//! a head window and a tail window plus exact totals (capture.rs). [`TextView`] is that shape: a
//! known prefix, a known suffix and the totals of the whole. Middle truncation only ever needs
//! the characters ending within the first `budget / 2` bytes and those starting within the last
//! `budget - budget / 2` bytes, so as long as the windows are at least that large the result is
//! byte-for-byte what the algorithm gives on the full text. Plain `&str` callers use the same code
//! through [`TextView::complete`].

/// Bytes per token in the approximate token count (`ceil(bytes / 4)`).
pub const APPROX_BYTES_PER_TOKEN: usize = 4;

/// How much model text a tool output may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TruncationPolicy {
    /// A budget in bytes; the marker counts removed characters.
    Bytes(usize),
    /// A budget in approximate tokens (4 bytes each); the marker counts removed tokens.
    Tokens(usize),
}

impl Default for TruncationPolicy {
    /// `Bytes(10_000)`, corral's default for every model (spec/tools.md §6.5).
    fn default() -> Self {
        TruncationPolicy::Bytes(10_000)
    }
}

impl TruncationPolicy {
    /// The budget in bytes: `b` for `Bytes(b)`, `4·t` for `Tokens(t)` (saturating, so an absurd
    /// token count cannot wrap to a tiny budget).
    pub fn byte_budget(self) -> usize {
        match self {
            TruncationPolicy::Bytes(b) => b,
            TruncationPolicy::Tokens(t) => t.saturating_mul(APPROX_BYTES_PER_TOKEN),
        }
    }

    /// The same policy with its byte budget capped at `max_bytes`. Windowed output can only be
    /// truncated exactly up to the window size, so shell output caps the budget at 1 MiB (§6.2).
    pub fn capped(self, max_bytes: usize) -> Self {
        match self {
            TruncationPolicy::Bytes(b) => TruncationPolicy::Bytes(b.min(max_bytes)),
            TruncationPolicy::Tokens(t) => {
                TruncationPolicy::Tokens(t.min(max_bytes / APPROX_BYTES_PER_TOKEN))
            }
        }
    }
}

/// The approximate token count of a text of `len` bytes: `ceil(len / 4)`.
pub fn approx_token_count(len: usize) -> usize {
    len.div_ceil(APPROX_BYTES_PER_TOKEN)
}

/// The number of lines as Rust's `str::lines()` counts them: `\n`-terminated lines plus a final
/// unterminated one (`\r\n` ends a line once, like `\n`).
pub fn count_lines(s: &str) -> usize {
    let newlines = s.bytes().filter(|&b| b == b'\n').count();
    newlines + usize::from(!s.is_empty() && !s.ends_with('\n'))
}

/// The largest character boundary of `s` at or below `i` (`str::floor_char_boundary`, which
/// is newer than the crate's minimum Rust version).
pub fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest character boundary of `s` at or above `i` (`str::ceil_char_boundary`).
pub fn ceil_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// A text known by its two ends and its totals.
///
/// Invariants: `head` is a prefix and `tail` a suffix of the text, both on character boundaries,
/// and `head.len() + tail.len() <= len`; when equal, the text is exactly `head + tail`.
#[derive(Debug, Clone, Copy)]
pub struct TextView<'a> {
    head: &'a str,
    tail: &'a str,
    len: usize,
    chars: usize,
    lines: usize,
}

impl<'a> TextView<'a> {
    /// A text held entirely in memory.
    pub fn complete(text: &'a str) -> Self {
        TextView {
            head: text,
            tail: "",
            len: text.len(),
            chars: text.chars().count(),
            lines: count_lines(text),
        }
    }

    /// A text of which only `head` and `tail` are held; `len`, `chars` and `lines` describe the
    /// whole text. If `head` and `tail` together are `len` bytes they must be the whole text.
    pub fn windowed(head: &'a str, tail: &'a str, len: usize, chars: usize, lines: usize) -> Self {
        assert!(
            head.len() + tail.len() <= len,
            "text windows overlap or exceed the total length"
        );
        TextView {
            head,
            tail,
            len,
            chars,
            lines,
        }
    }

    /// Length of the whole text in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the whole text is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of characters of the whole text.
    pub fn chars(&self) -> usize {
        self.chars
    }

    /// Number of lines of the whole text (`str::lines()` semantics).
    pub fn lines(&self) -> usize {
        self.lines
    }

    /// Whether the windows hold the whole text.
    pub fn is_complete(&self) -> bool {
        self.head.len() + self.tail.len() == self.len
    }

    /// Offset in the whole text at which `tail` starts.
    fn tail_base(&self) -> usize {
        self.len - self.tail.len()
    }

    /// The whole text. Only defined for complete views; a windowed one yields its two windows
    /// (callers never reach this for windowed views: their text exceeds any capped budget).
    fn to_full_string(self) -> String {
        debug_assert!(
            self.is_complete(),
            "the whole text of a windowed view was needed"
        );
        let mut s = String::with_capacity(self.head.len() + self.tail.len());
        s.push_str(self.head);
        s.push_str(self.tail);
        s
    }

    /// The longest prefix of the text, on a character boundary, of at most `max` bytes.
    fn prefix_upto(self, max: usize) -> (&'a str, &'a str) {
        if max <= self.head.len() || !self.is_complete() {
            debug_assert!(
                max <= self.head.len(),
                "head window smaller than half the budget"
            );
            let cut = floor_char_boundary(self.head, max.min(self.head.len()));
            (&self.head[..cut], "")
        } else {
            let cut = floor_char_boundary(self.tail, max - self.head.len());
            (self.head, &self.tail[..cut])
        }
    }

    /// The shortest suffix of the text that starts on a character boundary at or after `start`.
    fn suffix_from(self, start: usize) -> (&'a str, &'a str) {
        let base = self.tail_base();
        if start >= base || !self.is_complete() {
            debug_assert!(start >= base, "tail window smaller than half the budget");
            let cut = ceil_char_boundary(self.tail, start.saturating_sub(base));
            ("", &self.tail[cut..])
        } else {
            let cut = ceil_char_boundary(self.head, start);
            (&self.head[cut..], self.tail)
        }
    }
}

/// `formatted_truncate_text` (§6.5): the text unchanged if it fits the budget (inclusive), else
/// `Total output lines: {n}\n\n` then [`truncate_text`]. The newest Codex dropped the older
/// `Warning: truncated output …` line (codex-rs/utils/output-truncation/src/lib.rs).
pub fn formatted_truncate_text(content: &str, policy: TruncationPolicy) -> String {
    formatted_truncate_view(TextView::complete(content), policy)
}

/// `truncate_text` (§6.5): middle truncation, the marker counting characters (`Bytes`) or tokens
/// (`Tokens`).
pub fn truncate_text(content: &str, policy: TruncationPolicy) -> String {
    truncate_view(TextView::complete(content), policy)
}

/// [`formatted_truncate_text`] of a (possibly windowed) text.
pub fn formatted_truncate_view(view: TextView<'_>, policy: TruncationPolicy) -> String {
    if view.len() <= policy.byte_budget() {
        return view.to_full_string();
    }
    let body = truncate_view(view, policy);
    format!("Total output lines: {}\n\n{}", view.lines(), body)
}

/// [`truncate_text`] of a (possibly windowed) text.
pub fn truncate_view(view: TextView<'_>, policy: TruncationPolicy) -> String {
    match policy {
        TruncationPolicy::Bytes(b) => truncate_middle(view, b, Marker::Chars),
        TruncationPolicy::Tokens(t) => {
            let budget = policy.byte_budget();
            if t > 0 && view.len() <= budget {
                view.to_full_string()
            } else {
                truncate_middle(view, budget, Marker::Tokens)
            }
        }
    }
}

/// What the elision marker counts.
#[derive(Debug, Clone, Copy)]
enum Marker {
    Chars,
    Tokens,
}

/// Middle truncation of the text to `budget` bytes plus an inline marker (§6.5 steps 1-4).
fn truncate_middle(view: TextView<'_>, budget: usize, marker: Marker) -> String {
    if view.is_empty() {
        return String::new();
    }
    if budget == 0 {
        return marker_text(marker, view.chars(), approx_token_count(view.len()));
    }
    if view.len() <= budget {
        return view.to_full_string();
    }
    let left = budget / 2;
    let right = budget - left;
    let tail_start = view.len() - right;
    let (p1, p2) = view.prefix_upto(left);
    let (s1, s2) = view.suffix_from(tail_start);
    let kept_chars = [p1, p2, s1, s2]
        .iter()
        .map(|s| s.chars().count())
        .sum::<usize>();
    let removed_chars = view.chars().saturating_sub(kept_chars);
    let removed_tokens = approx_token_count(view.len() - budget);
    let mark = marker_text(marker, removed_chars, removed_tokens);
    let mut out = String::with_capacity(p1.len() + p2.len() + mark.len() + s1.len() + s2.len());
    out.push_str(p1);
    out.push_str(p2);
    out.push_str(&mark);
    out.push_str(s1);
    out.push_str(s2);
    out
}

fn marker_text(marker: Marker, removed_chars: usize, removed_tokens: usize) -> String {
    match marker {
        Marker::Chars => format!("\u{2026}{removed_chars} chars truncated\u{2026}"),
        Marker::Tokens => format!("\u{2026}{removed_tokens} tokens truncated\u{2026}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: usize) -> String {
        (1..=n).map(|i| format!("{i}\n")).collect()
    }

    const B10K: TruncationPolicy = TruncationPolicy::Bytes(10_000);

    #[test]
    fn seq_3000_worked_example() {
        let s = seq(3000);
        assert_eq!(s.len(), 13_893);
        assert_eq!(count_lines(&s), 3000);
        let body = truncate_text(&s, B10K);
        let (head, rest) = body.split_once('\u{2026}').unwrap();
        assert_eq!(head.len(), 5000);
        assert!(head.ends_with("1221\n12"));
        assert!(head.starts_with("1\n2\n"));
        let (mark, tail) = rest.split_once('\u{2026}').unwrap();
        assert_eq!(mark, "3893 chars truncated");
        assert_eq!(tail.len(), 5000);
        assert!(tail.starts_with("2001\n2002\n"));
        assert!(tail.ends_with("3000\n"));
        assert_eq!(count_lines(&body), 2221);
        let formatted = formatted_truncate_text(&s, B10K);
        assert_eq!(formatted, format!("Total output lines: 3000\n\n{body}"));
        // 40 000 bytes of budget: untouched.
        assert_eq!(truncate_text(&s, TruncationPolicy::Tokens(10_000)), s);
        assert_eq!(
            formatted_truncate_text(&s, TruncationPolicy::Tokens(10_000)),
            s
        );
    }

    #[test]
    fn twenty_thousand_x() {
        let s = "x".repeat(20_000);
        let expected_body = format!(
            "{}\u{2026}10000 chars truncated\u{2026}{}",
            "x".repeat(5000),
            "x".repeat(5000)
        );
        assert_eq!(truncate_text(&s, B10K), expected_body);
        assert_eq!(
            formatted_truncate_text(&s, B10K),
            format!("Total output lines: 1\n\n{expected_body}")
        );
        assert_eq!(count_lines(&expected_body), 1);
    }

    #[test]
    fn exactly_budget_is_unchanged() {
        let s = "y".repeat(10_000);
        assert_eq!(formatted_truncate_text(&s, B10K), s);
        assert_eq!(truncate_text(&s, B10K), s);
        let s2 = "y".repeat(10_001);
        assert!(formatted_truncate_text(&s2, B10K).starts_with("Total output lines: 1\n\n"));
    }

    #[test]
    fn six_thousand_e_acute() {
        let s = "é".repeat(6000);
        assert_eq!(s.len(), 12_000);
        assert_eq!(
            truncate_text(&s, B10K),
            format!(
                "{}\u{2026}1000 chars truncated\u{2026}{}",
                "é".repeat(2500),
                "é".repeat(2500)
            )
        );
    }

    #[test]
    fn odd_budget_and_multibyte_cuts() {
        // 12 bytes, budget 5: left = 2, right = 3, tail_start = 9. "é" at 0..2 ends within the
        // prefix; the "é" at 8..10 starts before 9, so only the last one (10..12) is kept.
        let s = "éééééé";
        let out = truncate_text(s, TruncationPolicy::Bytes(5));
        assert_eq!(out, "é\u{2026}4 chars truncated\u{2026}é");
        // 14 bytes: "a" + 6 × "é" + "b", budget 6: left 3 keeps "aé" (0..3), tail_start 11
        // keeps "éb" (11..14).
        let s = "aééééééb";
        assert_eq!(
            truncate_text(s, TruncationPolicy::Bytes(6)),
            "aé\u{2026}4 chars truncated\u{2026}éb"
        );
    }

    #[test]
    fn zero_budgets() {
        assert_eq!(
            truncate_text("hello", TruncationPolicy::Bytes(0)),
            "\u{2026}5 chars truncated\u{2026}"
        );
        assert_eq!(
            truncate_text("hello", TruncationPolicy::Tokens(0)),
            "\u{2026}2 tokens truncated\u{2026}"
        );
        assert_eq!(truncate_text("", TruncationPolicy::Tokens(0)), "");
        assert_eq!(formatted_truncate_text("", TruncationPolicy::Bytes(0)), "");
    }

    #[test]
    fn tokens_marker() {
        let s = "x".repeat(50);
        // budget 40: left 20, right 20, removed ceil(10 / 4) = 3 tokens.
        assert_eq!(
            truncate_text(&s, TruncationPolicy::Tokens(10)),
            format!(
                "{}\u{2026}3 tokens truncated\u{2026}{}",
                "x".repeat(20),
                "x".repeat(20)
            )
        );
        assert_eq!(
            truncate_text(&s[..40], TruncationPolicy::Tokens(10)),
            &s[..40]
        );
    }

    #[test]
    fn capped_policy() {
        assert_eq!(
            TruncationPolicy::Bytes(5 << 20).capped(1 << 20),
            TruncationPolicy::Bytes(1 << 20)
        );
        assert_eq!(
            TruncationPolicy::Tokens(usize::MAX).capped(1 << 20),
            TruncationPolicy::Tokens(262_144)
        );
        assert_eq!(
            TruncationPolicy::Tokens(usize::MAX).byte_budget(),
            usize::MAX
        );
    }

    #[test]
    fn line_counting_matches_str_lines() {
        for s in ["", "a", "a\n", "a\nb", "a\r\nb\r\n", "\n\n", "\r", "x\n\ny"] {
            assert_eq!(count_lines(s), s.lines().count(), "{s:?}");
        }
    }

    /// A windowed view with windows at least half the budget truncates exactly like the full
    /// text, for every cut position and policy.
    #[test]
    fn windowed_equals_complete() {
        let text: String = (0..400)
            .map(|i| match i % 7 {
                0 => "é".to_string(),
                1 => "\n".to_string(),
                2 => "😀".to_string(),
                3 => "\u{2026}".to_string(),
                _ => ((b'a' + (i % 26) as u8) as char).to_string(),
            })
            .collect();
        let full = TextView::complete(&text);
        for budget in [0usize, 1, 2, 3, 7, 40, 101, 300, 555] {
            let half = budget - budget / 2;
            let head_cut = ceil_char_boundary(&text, half + 3);
            let tail_cut = floor_char_boundary(&text, text.len() - half - 3);
            if head_cut >= tail_cut {
                continue;
            }
            let view = TextView::windowed(
                &text[..head_cut],
                &text[tail_cut..],
                full.len(),
                full.chars(),
                full.lines(),
            );
            for policy in [
                TruncationPolicy::Bytes(budget),
                TruncationPolicy::Tokens(budget / 4),
            ] {
                assert_eq!(
                    formatted_truncate_view(view, policy),
                    formatted_truncate_view(full, policy),
                    "budget {budget} {policy:?}"
                );
            }
        }
    }
}
