//! Computing the new content of an updated file (spec/tools.md §5.4–5.5).
//!
//! The original is split into lines that remember their own terminator (`\n`, `\r\n` or none).
//! Chunks are located with [`seek_sequence`] strictly forward. Within a matched region the
//! context lines stay untouched (text and terminator, as in Codex's `PreserveLineEndings` mode,
//! `codex-rs/apply-patch/src/file_update.rs`); the runs between them are replaced back to front
//! by the patch's lines, which get the file's preferred terminator. The result always ends with
//! a terminator.

use super::parser::UpdateChunk;
use super::seek_sequence::seek_sequence;

/// One line of a file: its text (without terminator) and its terminator.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line<'a> {
    text: &'a str,
    term: &'a str,
}

/// Splits `content` on `\n`; a `\r` before the `\n` belongs to the terminator. A final
/// unterminated piece is a line without terminator; a trailing `\n` adds no empty line.
fn split_lines(content: &str) -> Vec<Line<'_>> {
    let mut lines = Vec::new();
    let mut rest = content;
    while !rest.is_empty() {
        match rest.find('\n') {
            Some(i) => {
                let (text, term) = if i > 0 && rest.as_bytes()[i - 1] == b'\r' {
                    (&rest[..i - 1], &rest[i - 1..=i])
                } else {
                    (&rest[..i], &rest[i..=i])
                };
                lines.push(Line { text, term });
                rest = &rest[i + 1..];
            }
            None => {
                lines.push(Line {
                    text: rest,
                    term: "",
                });
                rest = "";
            }
        }
    }
    lines
}

/// A region of the original lines replaced by new lines.
struct Replacement<'c> {
    start: usize,
    old_len: usize,
    new_lines: &'c [String],
}

/// Applies `chunks` to `original`. `path` is the absolute path used in error messages. The error
/// is the message without the `apply_patch verification failed: ` prefix.
pub fn compute_update(
    original: &str,
    chunks: &[UpdateChunk],
    path: &str,
) -> Result<String, String> {
    let lines = split_lines(original);
    let texts: Vec<&str> = lines.iter().map(|l| l.text).collect();
    let preferred = lines
        .iter()
        .map(|l| l.term)
        .find(|t| !t.is_empty())
        .unwrap_or("\n");

    let mut replacements = Vec::new();
    let mut line_index = 0;
    for chunk in chunks {
        if let Some(ctx) = &chunk.context {
            match seek_sequence(&texts, std::slice::from_ref(ctx), line_index, false) {
                Some(found) => line_index = found + 1,
                None => return Err(format!("Failed to find context '{ctx}' in {path}")),
            }
        }
        if chunk.old_lines.is_empty() {
            // Pure addition: after the last line. (Codex's LF-normalising mode inserts before a
            // trailing blank line, an artefact of splitting on `\n`; its line-ending-preserving
            // mode, which corral follows, has no such phantom line.)
            replacements.push(Replacement {
                start: texts.len(),
                old_len: 0,
                new_lines: &chunk.new_lines,
            });
            continue;
        }
        let mut pattern: &[String] = &chunk.old_lines;
        let mut new_lines: &[String] = &chunk.new_lines;
        let mut found = seek_sequence(&texts, pattern, line_index, chunk.is_end_of_file);
        if found.is_none() && pattern.last().is_some_and(String::is_empty) {
            pattern = &pattern[..pattern.len() - 1];
            if new_lines.last().is_some_and(String::is_empty) {
                new_lines = &new_lines[..new_lines.len() - 1];
            }
            found = seek_sequence(&texts, pattern, line_index, chunk.is_end_of_file);
        }
        let Some(start) = found else {
            return Err(format!(
                "Failed to find expected lines in {path}:\n{}",
                chunk.old_lines.join("\n")
            ));
        };
        // Replace only the runs between context lines, so every original line the patch names
        // as context survives with its own text and terminator.
        let (mut old_at, mut new_at) = (0, 0);
        for &(old_ctx, new_ctx) in &chunk.context_line_indices {
            // A trailing empty context line may have been dropped by the retry above.
            if old_ctx >= pattern.len() || new_ctx >= new_lines.len() {
                break;
            }
            if old_at != old_ctx || new_at != new_ctx {
                replacements.push(Replacement {
                    start: start + old_at,
                    old_len: old_ctx - old_at,
                    new_lines: &new_lines[new_at..new_ctx],
                });
            }
            old_at = old_ctx + 1;
            new_at = new_ctx + 1;
        }
        if old_at != pattern.len() || new_at != new_lines.len() {
            replacements.push(Replacement {
                start: start + old_at,
                old_len: pattern.len() - old_at,
                new_lines: &new_lines[new_at..],
            });
        }
        line_index = start + pattern.len();
    }

    replacements.sort_by_key(|r| r.start);
    let mut result: Vec<Line<'_>> = lines;
    for r in replacements.iter().rev() {
        let start = r.start.min(result.len());
        let end = (start + r.old_len).min(result.len());
        let new = r.new_lines.iter().map(|text| Line {
            text,
            term: preferred,
        });
        result.splice(start..end, new);
    }

    let mut out = String::with_capacity(original.len() + 64);
    for line in &result {
        out.push_str(line.text);
        out.push_str(if line.term.is_empty() {
            preferred
        } else {
            line.term
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::apply_patch::parser::{Hunk, parse_patch};

    /// Parses `*** Update File: f` + `body` and applies its chunks to `original`.
    fn run(original: &str, body: &str) -> Result<String, String> {
        let patch = parse_patch(&format!(
            "*** Begin Patch\n*** Update File: f\n{body}\n*** End Patch"
        ))
        .unwrap();
        let Hunk::Update { chunks, .. } = &patch.hunks[0] else {
            panic!("not an update")
        };
        compute_update(original, chunks, "/abs/f")
    }

    #[test]
    fn split_keeps_terminators() {
        let l = split_lines("a\r\nb\nc");
        assert_eq!(
            l,
            vec![
                Line {
                    text: "a",
                    term: "\r\n"
                },
                Line {
                    text: "b",
                    term: "\n"
                },
                Line {
                    text: "c",
                    term: ""
                }
            ]
        );
        assert!(split_lines("").is_empty());
        assert_eq!(split_lines("\n").len(), 1);
    }

    #[test]
    fn simple_replace() {
        assert_eq!(
            run("foo\nbar\n", "@@\n foo\n-bar\n+baz").unwrap(),
            "foo\nbaz\n"
        );
    }

    #[test]
    fn appends_trailing_newline() {
        assert_eq!(
            run(
                "no newline at end",
                "@@\n-no newline at end\n+first line\n+second line"
            )
            .unwrap(),
            "first line\nsecond line\n"
        );
        assert_eq!(run("a\nb", "@@\n+c").unwrap(), "a\nb\nc\n");
    }

    #[test]
    fn pure_addition_goes_after_the_last_line() {
        // A trailing blank line is a real line here, so the addition follows it.
        assert_eq!(run("a\n\n", "@@ a\n+b").unwrap(), "a\n\nb\n");
        assert_eq!(run("", "@@\n+x").unwrap(), "x\n");
        assert_eq!(run("a\r\nb", "@@\n+c").unwrap(), "a\r\nb\r\nc\r\n");
    }

    #[test]
    fn deleting_everything_gives_empty_file() {
        assert_eq!(run("a\n", "@@\n-a").unwrap(), "");
    }

    #[test]
    fn trailing_empty_old_line_retry() {
        // The blank line before `*** End Patch` becomes an empty context line that is dropped.
        assert_eq!(run("a\nb\n", "@@\n-b\n+B\n").unwrap(), "a\nB\n");
    }

    #[test]
    fn context_errors() {
        assert_eq!(
            run("a\n", "@@ -1,2 +1,2 @@\n-a\n+b").unwrap_err(),
            "Failed to find context '-1,2 +1,2 @@' in /abs/f"
        );
        assert_eq!(
            run("a\n", "@@\n-x\n-y\n+b").unwrap_err(),
            "Failed to find expected lines in /abs/f:\nx\ny"
        );
    }

    #[test]
    fn context_marker_advances() {
        assert_eq!(
            run("x\nfn a\nx\nfn b\nx\n", "@@ fn b\n-x\n+y").unwrap(),
            "x\nfn a\nx\nfn b\ny\n"
        );
        // `@@ ` (trailing space) is an empty context: matches the first empty line.
        assert_eq!(run("x\n\nx\n", "@@ \n-x\n+y").unwrap(), "x\n\ny\n");
    }

    /// Codex's `preserves_*` cases (`codex-rs/apply-patch/tests/suite/tool.rs`), own contents.
    #[test]
    fn surviving_lines_keep_their_own_endings() {
        assert_eq!(
            run("p\r\nq\r\nr\r\n", "@@\n-p\n+P\n@@\n q\n+\n+mid\n r").unwrap(),
            "P\r\nq\r\n\r\nmid\r\nr\r\n"
        );
        // The context line is the second one: the first is removed, the LF line survives.
        assert_eq!(run("dup\r\ndup\n", "@@\n-dup\n dup").unwrap(), "dup\n");
        assert_eq!(
            run("1\r\n2\n3\r\n4\n", "@@\n 1\n 2\n-3\n+III\n 4").unwrap(),
            "1\r\n2\nIII\r\n4\n"
        );
        assert_eq!(run("x\r\ny", "@@\n-x\n+X").unwrap(), "X\r\ny\r\n");
        // Reordering keeps the patch's order.
        assert_eq!(
            run("m\nn\n", "@@\n-m\n-n\n+n\n+n\n+m").unwrap(),
            "n\nn\nm\n"
        );
    }

    #[test]
    fn context_lines_keep_their_original_text() {
        // Matched by the trim pass: the file's spelling stays.
        assert_eq!(run("  a\nb\n", "@@\n a\n-b\n+B").unwrap(), "  a\nB\n");
    }

    #[test]
    fn crlf_preserved() {
        assert_eq!(run("a\r\nb\r\n", "@@\n-a\n+A").unwrap(), "A\r\nb\r\n");
        assert_eq!(
            run("a\r\nb\nc\r\n", "@@\n-b\n+B").unwrap(),
            "a\r\nB\r\nc\r\n"
        );
        assert_eq!(run("a\r\nb", "@@\n-b\n+B").unwrap(), "a\r\nB\r\n");
        assert_eq!(run("a\r\nb", "@@\n+c").unwrap(), "a\r\nb\r\nc\r\n");
    }
}
