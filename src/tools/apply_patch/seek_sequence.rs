//! The four-pass line matcher (spec/tools.md §5.3).
//!
//! Finds a chunk's old lines in a file's lines, starting at a given index. Each pass scans the
//! whole remaining range before the next, looser pass starts, so an exact match anywhere beats a
//! fuzzy match earlier in the file.

/// Returns the index of the first position at or after `start` where `pattern` matches `lines`.
///
/// Passes: exact; trailing whitespace trimmed; both ends trimmed; trimmed and typographic
/// punctuation normalised. An empty pattern matches at `start`. With `eof`, the only candidate
/// is `lines.len() - pattern.len()` (and only if that is not before `start`).
pub fn seek_sequence<L: AsRef<str>, P: AsRef<str>>(
    lines: &[L],
    pattern: &[P],
    start: usize,
    eof: bool,
) -> Option<usize> {
    if pattern.is_empty() {
        return Some(start);
    }
    if pattern.len() > lines.len() {
        return None;
    }
    let last = lines.len() - pattern.len();
    let first = if eof { last } else { start };
    if first < start || first > last {
        return None;
    }
    let passes: [fn(&str, &str) -> bool; 4] = [
        |a, b| a == b,
        |a, b| a.trim_end() == b.trim_end(),
        |a, b| a.trim() == b.trim(),
        |a, b| normalised_eq(a.trim(), b.trim()),
    ];
    passes.into_iter().find_map(|eq| {
        (first..=last).find(|&i| {
            lines[i..i + pattern.len()]
                .iter()
                .zip(pattern)
                .all(|(l, p)| eq(l.as_ref(), p.as_ref()))
        })
    })
}

/// Maps typographic dashes, quotes and spaces to their ASCII forms (pass 4).
fn normalise(c: char) -> char {
    match c {
        '\u{2010}'..='\u{2015}' | '\u{2212}' => '-',
        '\u{2018}'..='\u{201B}' => '\'',
        '\u{201C}'..='\u{201F}' => '"',
        '\u{00A0}' | '\u{2002}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => ' ',
        other => other,
    }
}

fn normalised_eq(a: &str, b: &str) -> bool {
    a.chars().map(normalise).eq(b.chars().map(normalise))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn exact_match() {
        let lines = v(&["foo", "bar", "baz"]);
        assert_eq!(
            seek_sequence(&lines, &v(&["bar", "baz"]), 0, false),
            Some(1)
        );
        assert_eq!(seek_sequence(&lines, &v(&["foo"]), 1, false), None);
    }

    #[test]
    fn empty_pattern_matches_at_start() {
        let lines = v(&["a"]);
        assert_eq!(seek_sequence(&lines, &v(&[]), 0, false), Some(0));
        assert_eq!(seek_sequence(&lines, &v(&[]), 1, true), Some(1));
    }

    #[test]
    fn pattern_longer_than_file() {
        assert_eq!(seek_sequence(&v(&["a"]), &v(&["a", "b"]), 0, false), None);
        assert_eq!(seek_sequence(&v(&[]), &v(&["a"]), 0, false), None);
    }

    #[test]
    fn trailing_whitespace_pass() {
        let lines = v(&["foo   ", "bar\t"]);
        assert_eq!(
            seek_sequence(&lines, &v(&["foo", "bar"]), 0, false),
            Some(0)
        );
    }

    #[test]
    fn trim_pass() {
        let lines = v(&["    foo   ", "   bar\t"]);
        assert_eq!(
            seek_sequence(&lines, &v(&["foo", "bar"]), 0, false),
            Some(0)
        );
    }

    #[test]
    fn unicode_pass() {
        let lines = v(&[
            "x = \u{201C}hi\u{201D}",
            "a\u{2013}b\u{00A0}c \u{2018}d\u{2019}",
        ]);
        assert_eq!(
            seek_sequence(&lines, &v(&["x = \"hi\"", "a-b c 'd'"]), 0, false),
            Some(0)
        );
    }

    #[test]
    fn exact_later_beats_fuzzy_earlier() {
        let lines = v(&["foo ", "x", "foo"]);
        assert_eq!(seek_sequence(&lines, &v(&["foo"]), 0, false), Some(2));
    }

    #[test]
    fn eof_only_at_end() {
        let lines = v(&["x", "needle", "y", "needle"]);
        assert_eq!(seek_sequence(&lines, &v(&["needle"]), 0, true), Some(3));
        assert_eq!(seek_sequence(&lines, &v(&["y"]), 0, true), None);
        assert_eq!(seek_sequence(&lines, &v(&["needle"]), 0, false), Some(1));
        // The end position before `start` is not a match.
        assert_eq!(seek_sequence(&lines, &v(&["needle"]), 4, true), None);
    }

    #[test]
    fn start_past_end() {
        assert_eq!(seek_sequence(&v(&["a", "b"]), &v(&["b"]), 5, false), None);
    }
}
