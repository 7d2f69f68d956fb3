//! The patch-language parser (spec/tools.md §5.1–5.2).
//!
//! The parser is deliberately more lenient than the grammar sent to the model: markers may carry
//! surrounding whitespace, the whole patch may be wrapped in a `<<EOF` … `EOF` heredoc, hunk headers
//! are recognised on the trimmed line, and the first chunk of an Update may omit its `@@` line.
//! The parser never touches the file system; it only turns text into a [`Patch`].

use std::fmt;

const BEGIN_PATCH: &str = "*** Begin Patch";
const ENVIRONMENT_ID: &str = "*** Environment ID:";
const END_PATCH: &str = "*** End Patch";
const ADD_FILE: &str = "*** Add File: ";
const DELETE_FILE: &str = "*** Delete File: ";
const UPDATE_FILE: &str = "*** Update File: ";
const MOVE_TO: &str = "*** Move to: ";
const END_OF_FILE: &str = "*** End of File";
const CONTEXT_MARKER_EMPTY: &str = "@@";
const CONTEXT_MARKER: &str = "@@ ";

/// A parsed patch: the hunks in patch order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Patch {
    pub hunks: Vec<Hunk>,
}

/// One file operation of a patch. Paths are exactly as spelled in the patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hunk {
    /// `*** Add File: {path}` followed by `+` lines; `contents` has a `\n` after every line.
    Add { path: String, contents: String },
    /// `*** Delete File: {path}`.
    Delete { path: String },
    /// `*** Update File: {path}`, an optional `*** Move to: {move_to}` and at least one chunk.
    Update {
        path: String,
        move_to: Option<String>,
        chunks: Vec<UpdateChunk>,
    },
}

impl Hunk {
    /// The path named by the hunk header, as spelled in the patch.
    pub fn path(&self) -> &str {
        match self {
            Hunk::Add { path, .. } | Hunk::Delete { path } | Hunk::Update { path, .. } => path,
        }
    }
}

/// One `@@` chunk of an Update hunk.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UpdateChunk {
    /// The text after `@@ `, if any: a single line that must be found before the old lines.
    pub context: Option<String>,
    /// Lines the chunk expects in the file (context and `-` lines), without terminators.
    pub old_lines: Vec<String>,
    /// Lines that replace them (context and `+` lines), without terminators.
    pub new_lines: Vec<String>,
    /// The chunk ended with `*** End of File`: its old lines must sit at the end of the file.
    pub is_end_of_file: bool,
    /// `(index in old_lines, index in new_lines)` of every context line, in order: the update
    /// keeps those original lines untouched (§5.5).
    pub context_line_indices: Vec<(usize, usize)>,
}

/// A parse failure. `Display` gives the tool's spelling (`invalid patch: …`,
/// `invalid hunk at line N, …`); [`ParseError::cli_message`] gives the CLI's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// The patch as a whole is malformed (markers).
    InvalidPatch(String),
    /// A hunk is malformed; `line_number` is 1-based with `*** Begin Patch` as line 1.
    InvalidHunk { message: String, line_number: usize },
}

impl ParseError {
    /// The CLI/library spelling: `Invalid patch: {msg}` or `Invalid patch hunk on line {N}: {msg}`.
    pub fn cli_message(&self) -> String {
        match self {
            ParseError::InvalidPatch(msg) => format!("Invalid patch: {msg}"),
            ParseError::InvalidHunk {
                message,
                line_number,
            } => format!("Invalid patch hunk on line {line_number}: {message}"),
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::InvalidPatch(msg) => write!(f, "invalid patch: {msg}"),
            ParseError::InvalidHunk {
                message,
                line_number,
            } => write!(f, "invalid hunk at line {line_number}, {message}"),
        }
    }
}

impl std::error::Error for ParseError {}

fn hunk_error(message: String, line_number: usize) -> ParseError {
    ParseError::InvalidHunk {
        message,
        line_number,
    }
}

/// Parses a complete patch (strict mode: both markers required). Never panics.
pub fn parse_patch(input: &str) -> Result<Patch, ParseError> {
    let lines: Vec<&str> = input.trim().lines().collect();
    let body = match check_markers(&lines) {
        Ok(()) => &lines[1..lines.len() - 1],
        Err(strict_error) => heredoc_body(&lines).ok_or(strict_error)??,
    };
    let mut hunks = Vec::new();
    let (remaining, line_number) = skip_environment_id(body)?;
    let mut remaining = remaining;
    let mut line_number = line_number;
    while !remaining.is_empty() {
        let (hunk, used) = parse_hunk(remaining, line_number)?;
        hunks.push(hunk);
        line_number += used;
        remaining = &remaining[used..];
    }
    Ok(Patch { hunks })
}

/// The strict marker check: first line `*** Begin Patch`, last line `*** End Patch`, both
/// compared after trimming.
fn check_markers(lines: &[&str]) -> Result<(), ParseError> {
    let first = lines.first().map(|l| l.trim());
    let last = lines.last().map(|l| l.trim());
    if lines.len() >= 2 && first == Some(BEGIN_PATCH) && last == Some(END_PATCH) {
        return Ok(());
    }
    if first.is_some_and(|f| f != BEGIN_PATCH) {
        return Err(ParseError::InvalidPatch(
            "The first line of the patch must be '*** Begin Patch'".to_string(),
        ));
    }
    Err(ParseError::InvalidPatch(
        "The last line of the patch must be '*** End Patch'".to_string(),
    ))
}

/// The optional preamble Codex's grammar allows when a turn has several environments
/// (`*** Environment ID: <id>` right after `*** Begin Patch`, before any hunk). A session is one
/// environment, so the id selects nothing here; an empty or repeated one is refused as Codex's
/// parser refuses it. Returns the body after it and the patch line number it starts on.
fn skip_environment_id<'a, 'b>(body: &'a [&'b str]) -> Result<(&'a [&'b str], usize), ParseError> {
    fn id_of(line: &str) -> Option<&str> {
        line.trim().strip_prefix(ENVIRONMENT_ID).map(str::trim)
    }
    let Some(id) = body.first().and_then(|l| id_of(l)) else {
        return Ok((body, 2));
    };
    if id.is_empty() {
        return Err(hunk_error("Environment ID must not be empty".into(), 2));
    }
    if body.get(1).and_then(|l| id_of(l)).is_some() {
        return Err(hunk_error(
            "Environment ID must not be given more than once".into(),
            3,
        ));
    }
    Ok((&body[1..], 3))
}

/// The heredoc leniency: `None` when the input is not heredoc-shaped (the strict error stands),
/// otherwise the result of the strict check on the lines between the heredoc lines.
#[allow(clippy::type_complexity)]
fn heredoc_body<'a>(lines: &'a [&'a str]) -> Option<Result<&'a [&'a str], ParseError>> {
    if lines.len() < 4 {
        return None;
    }
    let first = lines[0];
    let last = lines[lines.len() - 1];
    if !matches!(first, "<<EOF" | "<<'EOF'" | "<<\"EOF\"") || !last.ends_with("EOF") {
        return None;
    }
    let inner = &lines[1..lines.len() - 1];
    Some(check_markers(inner).map(|()| &inner[1..inner.len() - 1]))
}

/// Parses the hunk starting at `lines[0]` (which is line `line_number` of the patch); returns the
/// hunk and the number of lines it used.
fn parse_hunk(lines: &[&str], line_number: usize) -> Result<(Hunk, usize), ParseError> {
    let header = lines[0].trim();
    if let Some(path) = header.strip_prefix(ADD_FILE) {
        let mut contents = String::new();
        let mut used = 1;
        for line in &lines[1..] {
            let Some(text) = line.strip_prefix('+') else {
                break;
            };
            contents.push_str(text);
            contents.push('\n');
            used += 1;
        }
        let hunk = Hunk::Add {
            path: path.to_string(),
            contents,
        };
        return Ok((hunk, used));
    }
    if let Some(path) = header.strip_prefix(DELETE_FILE) {
        let hunk = Hunk::Delete {
            path: path.to_string(),
        };
        return Ok((hunk, 1));
    }
    if let Some(path) = header.strip_prefix(UPDATE_FILE) {
        let mut used = 1;
        let mut remaining = &lines[1..];
        let move_to = remaining
            .first()
            .and_then(|l| l.strip_prefix(MOVE_TO))
            .map(str::to_string);
        if move_to.is_some() {
            used += 1;
            remaining = &remaining[1..];
        }
        let mut chunks = Vec::new();
        while let Some(first) = remaining.first() {
            if first.trim().is_empty() {
                used += 1;
                remaining = &remaining[1..];
                continue;
            }
            if first.starts_with('*') {
                break;
            }
            let (chunk, chunk_used) =
                parse_chunk(remaining, line_number + used, chunks.is_empty())?;
            chunks.push(chunk);
            used += chunk_used;
            remaining = &remaining[chunk_used..];
        }
        if chunks.is_empty() {
            return Err(hunk_error(
                format!("Update file hunk for path '{path}' is empty"),
                line_number,
            ));
        }
        let hunk = Hunk::Update {
            path: path.to_string(),
            move_to,
            chunks,
        };
        return Ok((hunk, used));
    }
    Err(hunk_error(
        format!(
            "'{header}' is not a valid hunk header. Valid hunk headers: '*** Add File: {{path}}', \
             '*** Delete File: {{path}}', '*** Update File: {{path}}'"
        ),
        line_number,
    ))
}

/// Parses one chunk starting at `lines[0]` (line `line_number`); `first_chunk` allows the `@@`
/// line to be omitted. Returns the chunk and the number of lines it used. `lines` is non-empty.
fn parse_chunk(
    lines: &[&str],
    line_number: usize,
    first_chunk: bool,
) -> Result<(UpdateChunk, usize), ParseError> {
    let no_lines = || {
        hunk_error(
            "Update hunk does not contain any lines".into(),
            line_number + 1,
        )
    };
    let (context, start) = if lines[0] == CONTEXT_MARKER_EMPTY {
        (None, 1)
    } else if let Some(ctx) = lines[0].strip_prefix(CONTEXT_MARKER) {
        (Some(ctx.to_string()), 1)
    } else if first_chunk {
        (None, 0)
    } else {
        return Err(hunk_error(
            format!(
                "Expected update hunk to start with a @@ context marker, got: '{}'",
                lines[0]
            ),
            line_number,
        ));
    };
    if start >= lines.len() {
        return Err(no_lines());
    }
    let mut chunk = UpdateChunk {
        context,
        ..UpdateChunk::default()
    };
    let mut used = 0;
    for &line in &lines[start..] {
        if line == END_OF_FILE {
            if used == 0 {
                return Err(no_lines());
            }
            chunk.is_end_of_file = true;
            used += 1;
            break;
        }
        match line.chars().next() {
            None | Some(' ') => {
                let text = line.get(1..).unwrap_or("").to_string();
                chunk
                    .context_line_indices
                    .push((chunk.old_lines.len(), chunk.new_lines.len()));
                chunk.old_lines.push(text.clone());
                chunk.new_lines.push(text);
            }
            Some('+') => chunk.new_lines.push(line[1..].to_string()),
            Some('-') => chunk.old_lines.push(line[1..].to_string()),
            Some(_) => {
                if used == 0 {
                    return Err(hunk_error(
                        format!(
                            "Unexpected line found in update hunk: '{line}'. Every line should \
                             start with ' ' (context line), '+' (added line), or '-' (removed line)"
                        ),
                        line_number + 1,
                    ));
                }
                break;
            }
        }
        used += 1;
    }
    Ok((chunk, used + start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_id_preamble_is_accepted_once_and_only_first() {
        let p = parse_patch(
            "*** Begin Patch\n*** Environment ID: remote\n*** Add File: a\n+x\n*** End Patch",
        )
        .unwrap();
        assert_eq!(p.hunks.len(), 1);
        let empty = parse_patch(
            "*** Begin Patch\n*** Environment ID:  \n*** Add File: a\n+x\n*** End Patch",
        );
        assert!(empty.is_err());
        let twice = parse_patch(
            "*** Begin Patch\n*** Environment ID: a\n*** Environment ID: b\n*** Add File: a\n+x\n*** End Patch",
        );
        assert!(twice.is_err());
        // After a hunk it is no preamble: not a hunk header either.
        let late = parse_patch(
            "*** Begin Patch\n*** Add File: a\n+x\n*** Environment ID: r\n*** End Patch",
        );
        assert!(late.is_err());
    }

    fn wrap(body: &str) -> String {
        format!("*** Begin Patch\n{body}\n*** End Patch")
    }

    fn err_text(input: &str) -> String {
        parse_patch(input).unwrap_err().to_string()
    }

    const HEADER_HELP: &str = "Valid hunk headers: '*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'";

    #[test]
    fn empty_patch_is_valid() {
        assert_eq!(
            parse_patch("*** Begin Patch\n*** End Patch"),
            Ok(Patch::default())
        );
        assert_eq!(
            parse_patch("\n  *** Begin Patch  \n*** End Patch \n\n"),
            Ok(Patch::default())
        );
    }

    #[test]
    fn marker_errors() {
        let first = "invalid patch: The first line of the patch must be '*** Begin Patch'";
        let last = "invalid patch: The last line of the patch must be '*** End Patch'";
        assert_eq!(err_text("bad"), first);
        assert_eq!(err_text("*** End Patch"), first);
        assert_eq!(err_text(""), last);
        assert_eq!(err_text("*** Begin Patch"), last);
        assert_eq!(err_text("*** Begin Patch\n*** Add File: a\n+x"), last);
    }

    #[test]
    fn cli_spelling() {
        let e = parse_patch("bad").unwrap_err();
        assert_eq!(
            e.cli_message(),
            "Invalid patch: The first line of the patch must be '*** Begin Patch'"
        );
        let e = parse_patch(&wrap("*** Add File: x\nhello")).unwrap_err();
        assert_eq!(
            e.cli_message(),
            format!(
                "Invalid patch hunk on line 3: 'hello' is not a valid hunk header. {HEADER_HELP}"
            )
        );
    }

    #[test]
    fn heredoc_forms() {
        let inner = "*** Begin Patch\n*** Add File: foo\n+hi\n*** End Patch";
        let expected = Patch {
            hunks: vec![Hunk::Add {
                path: "foo".into(),
                contents: "hi\n".into(),
            }],
        };
        for open in ["<<EOF", "<<'EOF'", "<<\"EOF\""] {
            assert_eq!(
                parse_patch(&format!("{open}\n{inner}\nEOF")),
                Ok(expected.clone()),
                "{open}"
            );
        }
        assert_eq!(
            err_text(&format!("<<\"EOF'\n{inner}\nEOF")),
            "invalid patch: The first line of the patch must be '*** Begin Patch'"
        );
        assert_eq!(
            err_text("<<EOF\n*** Begin Patch\n*** Update File: file2.py\nEOF\n"),
            "invalid patch: The last line of the patch must be '*** End Patch'"
        );
        // Fewer than 4 lines: the strict error stands.
        assert_eq!(
            err_text("<<EOF\n*** Begin Patch\nEOF"),
            "invalid patch: The first line of the patch must be '*** Begin Patch'"
        );
        // The heredoc's own line must be exact.
        assert_eq!(
            err_text(&format!("<<EOF \n{inner}\nEOF")),
            "invalid patch: The first line of the patch must be '*** Begin Patch'"
        );
    }

    #[test]
    fn add_delete_update() {
        let patch = parse_patch(&wrap(
            "*** Add File: a.txt\n+one\n+\n+two\n*** Delete File: b.txt\n*** Update File: c.txt\n\
             *** Move to: d.txt\n@@ fn main\n ctx\n-old\n+new\n\n@@\n-x\n*** End of File",
        ))
        .unwrap();
        assert_eq!(
            patch.hunks,
            vec![
                Hunk::Add {
                    path: "a.txt".into(),
                    contents: "one\n\ntwo\n".into()
                },
                Hunk::Delete {
                    path: "b.txt".into()
                },
                Hunk::Update {
                    path: "c.txt".into(),
                    move_to: Some("d.txt".into()),
                    chunks: vec![
                        UpdateChunk {
                            context: Some("fn main".into()),
                            old_lines: vec!["ctx".into(), "old".into(), "".into()],
                            new_lines: vec!["ctx".into(), "new".into(), "".into()],
                            is_end_of_file: false,
                            context_line_indices: vec![(0, 0), (2, 2)],
                        },
                        UpdateChunk {
                            context: None,
                            old_lines: vec!["x".into()],
                            new_lines: vec![],
                            is_end_of_file: true,
                            context_line_indices: vec![],
                        },
                    ],
                },
            ]
        );
    }

    #[test]
    fn add_with_no_lines_is_empty_file() {
        let patch = parse_patch(&wrap("*** Add File: empty.txt")).unwrap();
        assert_eq!(
            patch.hunks,
            vec![Hunk::Add {
                path: "empty.txt".into(),
                contents: String::new()
            }]
        );
    }

    #[test]
    fn padded_headers_and_crlf() {
        let patch =
            parse_patch("*** Begin Patch\r\n  *** Update File: foo.txt  \r\n@@\r\n-old\r\n+new\r\n*** End Patch\r\n")
                .unwrap();
        assert_eq!(
            patch.hunks,
            vec![Hunk::Update {
                path: "foo.txt".into(),
                move_to: None,
                chunks: vec![UpdateChunk {
                    context: None,
                    old_lines: vec!["old".into()],
                    new_lines: vec!["new".into()],
                    is_end_of_file: false,
                    context_line_indices: vec![],
                }]
            }]
        );
    }

    #[test]
    fn first_chunk_may_omit_marker_and_context_quirks() {
        let patch = parse_patch(&wrap(
            "*** Update File: f\n foo\n-bar\n+baz\n@@ \n-a\n@@ -1,3 +1,3 @@\n-b",
        ))
        .unwrap();
        let Hunk::Update { chunks, .. } = &patch.hunks[0] else {
            panic!()
        };
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[0].context, None);
        assert_eq!(chunks[0].old_lines, vec!["foo", "bar"]);
        assert_eq!(chunks[1].context.as_deref(), Some(""));
        assert_eq!(chunks[2].context.as_deref(), Some("-1,3 +1,3 @@"));
    }

    #[test]
    fn hunk_errors() {
        assert_eq!(
            err_text(&wrap("*** Frobnicate File: foo")),
            format!(
                "invalid hunk at line 2, '*** Frobnicate File: foo' is not a valid hunk header. {HEADER_HELP}"
            )
        );
        assert_eq!(
            err_text(&wrap("*** Add File: x\nhello")),
            format!("invalid hunk at line 3, 'hello' is not a valid hunk header. {HEADER_HELP}")
        );
        assert_eq!(
            err_text(&wrap("*** Update File: foo.txt")),
            "invalid hunk at line 2, Update file hunk for path 'foo.txt' is empty"
        );
        assert_eq!(
            err_text(&wrap("*** Update File: foo.txt\n   \n")),
            "invalid hunk at line 2, Update file hunk for path 'foo.txt' is empty"
        );
        // First chunk without @@: the line number is one past the offending line.
        assert_eq!(
            err_text(&wrap("*** Update File: f\nbad")),
            "invalid hunk at line 4, Unexpected line found in update hunk: 'bad'. Every line \
             should start with ' ' (context line), '+' (added line), or '-' (removed line)"
        );
        assert_eq!(
            err_text(&wrap("*** Update File: f\n@@\nbad")),
            "invalid hunk at line 4, Unexpected line found in update hunk: 'bad'. Every line \
             should start with ' ' (context line), '+' (added line), or '-' (removed line)"
        );
        assert_eq!(
            err_text(&wrap("*** Update File: f\n@@\n-a\nbad")),
            "invalid hunk at line 5, Expected update hunk to start with a @@ context marker, got: 'bad'"
        );
        assert_eq!(
            err_text(&wrap("*** Update File: f\n@@")),
            "invalid hunk at line 4, Update hunk does not contain any lines"
        );
        assert_eq!(
            err_text(&wrap("*** Update File: f\n@@\n*** End of File")),
            "invalid hunk at line 4, Update hunk does not contain any lines"
        );
        // A bare end-of-file marker as the first chunk of a hunk.
        assert_eq!(
            err_text(&wrap(
                "*** Update File: f\n-a\n*** End of File\n*** End of File"
            )),
            format!(
                "invalid hunk at line 5, '*** End of File' is not a valid hunk header. {HEADER_HELP}"
            )
        );
    }

    #[test]
    fn chunk_line_numbers_accumulate() {
        // Line 2 header, 3 move, 4 @@, 5 -a, 6 @@, 7 bad.
        assert_eq!(
            err_text(&wrap("*** Update File: f\n*** Move to: g\n@@\n-a\n@@\nbad")),
            "invalid hunk at line 7, Unexpected line found in update hunk: 'bad'. Every line \
             should start with ' ' (context line), '+' (added line), or '-' (removed line)"
        );
    }

    #[test]
    fn move_must_be_next_line_untrimmed() {
        let patch = parse_patch(&wrap("*** Update File: f\n*** Move to: g\n-a")).unwrap();
        assert!(matches!(&patch.hunks[0], Hunk::Update { move_to: Some(m), .. } if m == "g"));
        // A padded Move line is not a move: it reads as a context line of the first chunk.
        let patch = parse_patch(&wrap("*** Update File: f\n *** Move to: g\n-a")).unwrap();
        let Hunk::Update {
            move_to, chunks, ..
        } = &patch.hunks[0]
        else {
            panic!()
        };
        assert_eq!(move_to, &None);
        assert_eq!(chunks[0].old_lines, vec!["*** Move to: g", "a"]);
    }
}
