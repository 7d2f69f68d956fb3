//! The `read_file` tool (spec/tools.md §2): numbered lines of a text file, either a plain slice
//! (`offset`/`limit`) or the indentation block around an anchor line.
//!
//! Only regular files are read (a FIFO would block the worker, `/dev/zero` would never end), and
//! at most [`MAX_LINE_BYTES`] of each line are kept (spec/sandbox.md §8.6, H11).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::shell::pinned_cwd::fs_path;
use super::{ToolError, resolve_path, truncate_to_char_boundary};

/// Longest line text returned, in bytes (cut at a character boundary, no marker).
pub const MAX_LINE_LENGTH: usize = 500;
/// Bytes of one line kept for formatting and indentation; the rest of a longer line is read and
/// discarded (still counting lines), so a single huge line cannot grow the worker. Far above the
/// 500 bytes shown, so output is unchanged; only indentation mode's view of a line whose first
/// 64 KiB are all whitespace can differ from Codex (which keeps whole lines).
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Indent width of one tab when measuring indentation.
pub const TAB_WIDTH: usize = 4;
pub const DEFAULT_OFFSET: usize = 1;
pub const DEFAULT_LIMIT: usize = 2000;
/// Trimmed lines starting with one of these count as header comments (indentation mode).
const COMMENT_PREFIXES: [&str; 3] = ["#", "//", "--"];

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ReadFileArgs {
    pub file_path: String,
    #[serde(default)]
    pub offset: Option<usize>,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub mode: Option<ReadMode>,
    #[serde(default)]
    pub indentation: Option<IndentationArgs>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadMode {
    #[default]
    Slice,
    Indentation,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct IndentationArgs {
    #[serde(default)]
    pub anchor_line: Option<usize>,
    #[serde(default)]
    pub max_levels: Option<usize>,
    #[serde(default)]
    pub include_siblings: Option<bool>,
    #[serde(default)]
    pub include_header: Option<bool>,
    #[serde(default)]
    pub max_lines: Option<usize>,
}

/// One returned line: its 1-based number and its (lossy, length-capped) text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumberedLine {
    pub number: usize,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadFileOutput {
    /// The path as resolved against the session cwd.
    pub path: PathBuf,
    pub lines: Vec<NumberedLine>,
}

impl ReadFileOutput {
    /// `L{n}: {text}` lines joined by `\n`; no header, no trailing newline.
    pub fn model_text(&self) -> String {
        use std::fmt::Write as _;
        // Sized up front (a line's number takes at most 20 digits), written in place.
        let size: usize = self.lines.iter().map(|l| l.text.len() + 24).sum();
        let mut out = String::with_capacity(size);
        for (i, line) in self.lines.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            // Cannot fail: writing to a String.
            let _ = write!(out, "L{}: {}", line.number, line.text);
        }
        out
    }
}

pub fn read_file(cwd: &Path, args: &ReadFileArgs) -> Result<ReadFileOutput, ToolError> {
    let offset = args.offset.unwrap_or(DEFAULT_OFFSET);
    if offset == 0 {
        return Err(ToolError::invalid("offset must be a 1-indexed line number").on("offset"));
    }
    let limit = args.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 {
        return Err(ToolError::invalid("limit must be greater than zero").on("limit"));
    }
    let path = resolve_path(cwd, &args.file_path);
    // Opened from the pinned working directory when it lies there (H24); shown as given.
    let at = fs_path(&path);
    let lines = match args.mode.unwrap_or_default() {
        ReadMode::Slice => read_slice(&at, offset, limit)?,
        ReadMode::Indentation => {
            let indentation = args.indentation.clone().unwrap_or_default();
            read_indentation_block(&at, offset, limit, &indentation)?
        }
    };
    Ok(ReadFileOutput { path, lines })
}

fn read_error(err: &std::io::Error) -> ToolError {
    ToolError::io("failed to read file: ", err)
}

/// `failed to read file: not a regular file ({what})`: the tool reads only regular files.
fn not_regular(what: &str) -> ToolError {
    ToolError::invalid(format!("failed to read file: not a regular file ({what})"))
}

/// What a non-regular file is, for the refusal; `None` for regular files and directories (a
/// directory keeps Codex's `Is a directory` read error).
fn special_kind(ft: std::fs::FileType) -> Option<&'static str> {
    if ft.is_fifo() {
        Some("a FIFO")
    } else if ft.is_char_device() {
        Some("a character device")
    } else if ft.is_block_device() {
        Some("a block device")
    } else if ft.is_socket() {
        Some("a socket")
    } else {
        None
    }
}

/// Opens `path` (following symlinks) only if it is a regular file. A `stat` first spares devices
/// the side effects of an open; the open itself is non-blocking and takes no controlling
/// terminal, so a FIFO swapped in after the `stat` cannot block, and `fstat` on the opened file
/// decides.
fn open_regular(path: &Path) -> Result<File, ToolError> {
    if let Ok(meta) = std::fs::metadata(path)
        && let Some(what) = special_kind(meta.file_type())
    {
        return Err(not_regular(what));
    }
    open_checked(path)
}

fn open_checked(path: &Path) -> Result<File, ToolError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| read_error(&e))?;
    let ft = file.metadata().map_err(|e| read_error(&e))?.file_type();
    if ft.is_dir() {
        return Err(read_error(&io::Error::from_raw_os_error(libc::EISDIR)));
    }
    if let Some(what) = special_kind(ft) {
        return Err(not_regular(what));
    }
    // Back to blocking reads (the flag means nothing for most regular files, but a network or
    // FUSE file system may honour it and answer EAGAIN).
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0
        {
            return Err(read_error(&io::Error::last_os_error()));
        }
    }
    Ok(file)
}

/// Reads one line (through its `\n`, or to EOF) into `buf`, keeping at most `cap` bytes of it and
/// discarding the rest; returns the bytes consumed (0 at EOF).
fn read_capped_line(reader: &mut impl BufRead, buf: &mut Vec<u8>, cap: usize) -> io::Result<usize> {
    let mut consumed = 0;
    loop {
        let available = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(consumed);
        }
        let (len, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        let room = cap.saturating_sub(buf.len());
        buf.extend_from_slice(&available[..len.min(room)]);
        reader.consume(len);
        consumed += len;
        if done {
            return Ok(consumed);
        }
    }
}

/// Yields each line's bytes without its `\n` and one `\r` before it; a final line without a
/// newline keeps any trailing `\r`, and a trailing newline adds no empty line. A line longer than
/// [`MAX_LINE_BYTES`] yields only its first `MAX_LINE_BYTES` bytes.
fn for_each_line(path: &Path, f: impl FnMut(&[u8]) -> bool) -> Result<(), ToolError> {
    let file = open_regular(path)?;
    lines_of(&mut BufReader::new(file), MAX_LINE_BYTES, f).map_err(|e| read_error(&e))
}

fn lines_of(
    reader: &mut impl BufRead,
    cap: usize,
    mut f: impl FnMut(&[u8]) -> bool,
) -> io::Result<()> {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if read_capped_line(reader, &mut buf, cap)? == 0 {
            return Ok(());
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
        }
        if !f(&buf) {
            return Ok(());
        }
    }
}

fn display_text(raw: &str) -> String {
    truncate_to_char_boundary(raw, MAX_LINE_LENGTH).to_string()
}

fn read_slice(path: &Path, offset: usize, limit: usize) -> Result<Vec<NumberedLine>, ToolError> {
    let mut seen = 0usize;
    let mut lines = Vec::new();
    // Streamed so a huge file costs only the lines we keep.
    for_each_line(path, |bytes| {
        seen += 1;
        if seen < offset {
            return true;
        }
        if lines.len() == limit {
            return false;
        }
        lines.push(NumberedLine {
            number: seen,
            text: display_text(&String::from_utf8_lossy(bytes)),
        });
        true
    })?;
    if seen < offset {
        return Err(ToolError::invalid("offset exceeds file length").on("offset"));
    }
    Ok(lines)
}

/// A loaded line with what the indentation walk needs: its shown text and its measures, not the
/// whole line, so loading a file costs at most ~500 bytes per line.
struct LineRecord {
    text: String,
    indent: usize,
    blank: bool,
    comment: bool,
}

impl LineRecord {
    fn new(raw: &str) -> Self {
        let indent = raw
            .chars()
            .map_while(|c| match c {
                ' ' => Some(1),
                '\t' => Some(TAB_WIDTH),
                _ => None,
            })
            .sum();
        let trimmed = raw.trim();
        Self {
            text: display_text(raw),
            indent,
            blank: trimmed.is_empty(),
            comment: COMMENT_PREFIXES.iter().any(|p| trimmed.starts_with(p)),
        }
    }

    fn is_blank(&self) -> bool {
        self.blank
    }

    fn is_comment(&self) -> bool {
        self.comment
    }
}

/// Blank lines inherit the indent of the nearest non-blank line above, so they never end a block.
fn effective_indents(records: &[LineRecord]) -> Vec<usize> {
    let mut previous = 0;
    records
        .iter()
        .map(|r| {
            if !r.is_blank() {
                previous = r.indent;
            }
            previous
        })
        .collect()
}

fn read_indentation_block(
    path: &Path,
    offset: usize,
    limit: usize,
    options: &IndentationArgs,
) -> Result<Vec<NumberedLine>, ToolError> {
    let anchor_line = options.anchor_line.unwrap_or(offset);
    if anchor_line == 0 {
        return Err(
            ToolError::invalid("anchor_line must be a 1-indexed line number")
                .on("indentation.anchor_line"),
        );
    }
    let guard = options.max_lines.unwrap_or(limit);
    if guard == 0 {
        return Err(
            ToolError::invalid("max_lines must be greater than zero").on("indentation.max_lines")
        );
    }
    let max_levels = options.max_levels.unwrap_or(0);
    let include_siblings = options.include_siblings.unwrap_or(false);
    let include_header = options.include_header.unwrap_or(true);

    let mut records = Vec::new();
    for_each_line(path, |bytes| {
        records.push(LineRecord::new(&String::from_utf8_lossy(bytes)));
        true
    })?;
    if records.is_empty() || anchor_line > records.len() {
        return Err(
            ToolError::invalid("anchor_line exceeds file length").on("indentation.anchor_line")
        );
    }

    let anchor = anchor_line - 1;
    let indents = effective_indents(&records);
    let min_indent = if max_levels == 0 {
        0
    } else {
        indents[anchor].saturating_sub(max_levels.saturating_mul(TAB_WIDTH))
    };
    let final_limit = limit.min(guard).min(records.len());
    let numbered = |i: usize| NumberedLine {
        number: i + 1,
        text: records[i].text.clone(),
    };
    if final_limit == 1 {
        return Ok(vec![numbered(anchor)]);
    }

    // Block is the index range [start, end); `up`/`down` stay live until their walk stops.
    let (mut start, mut end) = (anchor, anchor + 1);
    let (mut up, mut down) = (true, true);
    let (mut up_min_taken, mut down_min_taken) = (0usize, 0usize);
    while end - start < final_limit {
        let mut progressed = false;

        if up && start > 0 {
            let i = start - 1;
            let indent = indents[i];
            if indent < min_indent {
                up = false;
            } else if indent == min_indent && !include_siblings {
                let header_comment = include_header && records[i].is_comment();
                if up_min_taken == 0 || header_comment {
                    up_min_taken += 1;
                    start = i;
                    progressed = true;
                } else {
                    up = false;
                }
            } else {
                start = i;
                progressed = true;
            }
            if end - start >= final_limit {
                break;
            }
        }

        if down && end < records.len() {
            let j = end;
            let indent = indents[j];
            if indent < min_indent {
                down = false;
            } else if indent == min_indent && !include_siblings {
                // Keep the first min-indent line below (usually the closing brace), not a sibling.
                if down_min_taken == 0 {
                    down_min_taken += 1;
                    end = j + 1;
                    progressed = true;
                } else {
                    down = false;
                }
            } else {
                end = j + 1;
                progressed = true;
            }
        }

        if !progressed {
            break;
        }
    }

    let mut block: VecDeque<usize> = (start..end).collect();
    while block.front().is_some_and(|&i| records[i].is_blank()) {
        block.pop_front();
    }
    while block.back().is_some_and(|&i| records[i].is_blank()) {
        block.pop_back();
    }
    Ok(block.into_iter().map(numbered).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ErrorKind;
    use std::fs;
    use tempfile::TempDir;

    fn write(dir: &TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.path().join(name);
        fs::write(&p, bytes).unwrap();
        p
    }

    fn parse(json: &str) -> ReadFileArgs {
        serde_json::from_str(json).unwrap()
    }

    /// Runs the tool on `contents` with the given JSON args (without `file_path`).
    fn run(contents: &[u8], extra: &str) -> Result<String, ToolError> {
        let dir = TempDir::new().unwrap();
        let p = write(&dir, "f.txt", contents);
        let sep = if extra.is_empty() { "" } else { "," };
        let json = format!(
            "{{\"file_path\":{}{sep}{extra}}}",
            serde_json::to_string(p.to_str().unwrap()).unwrap()
        );
        read_file(dir.path(), &parse(&json)).map(|o| o.model_text())
    }

    fn numbers(contents: &str, extra: &str) -> Vec<usize> {
        let dir = TempDir::new().unwrap();
        let p = write(&dir, "f.txt", contents.as_bytes());
        let json = format!(
            "{{\"file_path\":{},{extra}}}",
            serde_json::to_string(p.to_str().unwrap()).unwrap()
        );
        read_file(dir.path(), &parse(&json))
            .unwrap()
            .lines
            .iter()
            .map(|l| l.number)
            .collect()
    }

    fn range(a: usize, b: usize) -> Vec<usize> {
        (a..=b).collect()
    }

    // §2.8 test 1
    #[test]
    fn slice_offset_and_limit() {
        assert_eq!(
            run(b"alpha\nbeta\ngamma\n", r#""offset":2,"limit":2"#).unwrap(),
            "L2: beta\nL3: gamma"
        );
    }

    // test 2
    #[test]
    fn slice_offset_past_end() {
        let err = run(b"only\n", r#""offset":3,"limit":1"#).unwrap_err();
        assert_eq!(err.message, "offset exceeds file length");
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn slice_offset_on_last_line_and_empty_file() {
        assert_eq!(run(b"a\nb\n", r#""offset":2"#).unwrap(), "L2: b");
        assert_eq!(
            run(b"", "").unwrap_err().message,
            "offset exceeds file length"
        );
    }

    // test 3
    #[test]
    fn invalid_utf8_is_lossy() {
        assert_eq!(
            run(b"\xFF\xFE\nplain\n", r#""offset":1,"limit":2"#).unwrap(),
            "L1: \u{FFFD}\u{FFFD}\nL2: plain"
        );
    }

    // test 4
    #[test]
    fn crlf_is_stripped() {
        assert_eq!(run(b"one\r\ntwo\r\n", "").unwrap(), "L1: one\nL2: two");
    }

    #[test]
    fn final_line_without_newline_keeps_cr() {
        assert_eq!(run(b"a\r\nb\r", "").unwrap(), "L1: a\nL2: b\r");
    }

    // test 5
    #[test]
    fn limit_only() {
        assert_eq!(
            run(b"first\nsecond\nthird\n", r#""limit":2"#).unwrap(),
            "L1: first\nL2: second"
        );
    }

    // test 6
    #[test]
    fn long_line_is_cut_to_500_bytes() {
        let line = "x".repeat(550);
        assert_eq!(
            run(line.as_bytes(), "").unwrap(),
            format!("L1: {}", "x".repeat(500))
        );
    }

    // test 7
    #[test]
    fn offset_zero() {
        let err =
            read_file(Path::new("/"), &parse(r#"{"file_path":"/f","offset":0}"#)).unwrap_err();
        assert_eq!(err.message, "offset must be a 1-indexed line number");
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
    }

    // test 8
    #[test]
    fn limit_zero() {
        let err = read_file(Path::new("/"), &parse(r#"{"file_path":"/f","limit":0}"#)).unwrap_err();
        assert_eq!(err.message, "limit must be greater than zero");
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
    }

    // test 9
    #[test]
    fn relative_path_resolves_against_cwd() {
        let dir = TempDir::new().unwrap();
        fs::create_dir(dir.path().join("rel")).unwrap();
        fs::write(dir.path().join("rel/f.txt"), "hello\n").unwrap();
        let out = read_file(dir.path(), &parse(r#"{"file_path":"rel/f.txt"}"#)).unwrap();
        assert_eq!(out.path, dir.path().join("rel/f.txt"));
        assert_eq!(out.model_text(), "L1: hello");
    }

    // test 10
    #[test]
    fn missing_file() {
        let dir = TempDir::new().unwrap();
        let err = read_file(dir.path(), &parse(r#"{"file_path":"nope.txt"}"#)).unwrap_err();
        assert_eq!(
            err.message,
            "failed to read file: No such file or directory (os error 2)"
        );
        assert_eq!(err.kind, ErrorKind::NotFound);
    }

    #[test]
    fn directory_is_a_read_error() {
        let dir = TempDir::new().unwrap();
        let err = read_file(dir.path(), &parse(r#"{"file_path":"."}"#)).unwrap_err();
        assert_eq!(
            err.message,
            "failed to read file: Is a directory (os error 21)"
        );
    }

    // test 11
    #[test]
    fn no_final_newline() {
        assert_eq!(run(b"a\nb", "").unwrap(), "L1: a\nL2: b");
    }

    // test 12
    #[test]
    fn default_limit_is_2000() {
        let text: String = (1..=2500).map(|i| format!("line {i}\n")).collect();
        let out = run(text.as_bytes(), "").unwrap();
        let lines: Vec<&str> = out.split('\n').collect();
        assert_eq!(lines.len(), 2000);
        assert_eq!(lines[0], "L1: line 1");
        assert_eq!(lines[1999], "L2000: line 2000");
    }

    // test 13
    #[test]
    fn cut_moves_back_to_char_boundary() {
        let line = format!("{}é", "a".repeat(499));
        assert_eq!(line.len(), 501);
        assert_eq!(
            run(line.as_bytes(), "").unwrap(),
            format!("L1: {}", "a".repeat(499))
        );
    }

    #[test]
    fn bad_mode_is_a_serde_error() {
        let err =
            serde_json::from_str::<ReadFileArgs>(r#"{"file_path":"/f","mode":"x"}"#).unwrap_err();
        let msg = ToolError::parse(&err).message;
        assert!(
            msg.starts_with(
                "failed to parse function arguments: unknown variant `x`, expected `slice` or `indentation` at line 1 column"
            ),
            "{msg}"
        );
    }

    #[test]
    fn args_parsing_ignores_unknown_keys_and_rejects_bad_numbers() {
        let args = parse(r#"{"file_path":"/f","bogus":true,"indentation":{"zzz":1}}"#);
        assert_eq!(args.file_path, "/f");
        assert_eq!(args.indentation, Some(IndentationArgs::default()));
        for bad in [r#"-1"#, r#"1.5"#, r#""3""#] {
            let json = format!(r#"{{"file_path":"/f","offset":{bad}}}"#);
            assert!(
                serde_json::from_str::<ReadFileArgs>(&json).is_err(),
                "{bad}"
            );
        }
        let err = serde_json::from_str::<ReadFileArgs>("{}").unwrap_err();
        assert_eq!(
            ToolError::parse(&err).message,
            "failed to parse function arguments: missing field `file_path` at line 1 column 2"
        );
    }

    #[test]
    fn indentation_ignored_in_slice_mode() {
        assert_eq!(
            run(
                b"a\n    b\nc\n",
                r#""mode":"slice","indentation":{"anchor_line":2,"max_lines":0}"#
            )
            .unwrap(),
            "L1: a\nL2:     b\nL3: c"
        );
    }

    // test 14
    #[test]
    fn indentation_basic_block() {
        let out = run(
            b"fn outer() {\n    if cond {\n        inner();\n    }\n    tail();\n}\n",
            r#""offset":3,"limit":10,"mode":"indentation","indentation":{"anchor_line":3,"max_levels":1}"#,
        )
        .unwrap();
        assert_eq!(out, "L2:     if cond {\nL3:         inner();\nL4:     }");
    }

    // test 15
    #[test]
    fn indentation_max_levels() {
        let src = "mod root {\n    fn outer() {\n        if cond {\n            inner();\n        }\n    }\n}\n";
        assert_eq!(
            numbers(
                src,
                r#""offset":4,"limit":50,"mode":"indentation","indentation":{"anchor_line":4,"max_levels":2}"#
            ),
            range(2, 6)
        );
        assert_eq!(
            numbers(
                src,
                r#""offset":4,"limit":50,"mode":"indentation","indentation":{"anchor_line":4,"max_levels":3}"#
            ),
            range(1, 7)
        );
    }

    // test 16
    #[test]
    fn indentation_siblings() {
        let src = "fn wrapper() {\n    if first {\n        do_first();\n    }\n    if second {\n        do_second();\n    }\n}\n";
        let args = |siblings: bool| {
            format!(
                r#""limit":50,"mode":"indentation","indentation":{{"anchor_line":3,"max_levels":1,"include_siblings":{siblings}}}"#
            )
        };
        assert_eq!(numbers(src, &args(false)), range(2, 4));
        assert_eq!(numbers(src, &args(true)), range(2, 7));
    }

    const PYTHON: &str = "class Foo:
    def __init__(self, size):
        self.size = size
    def double(self, value):
        if value is None:
            return 0
        result = value * self.size
        return result
class Bar:
    def compute(self):
        helper = Foo(2)
        return helper.double(5)
";

    // test 17
    #[test]
    fn indentation_python() {
        assert_eq!(PYTHON.lines().count(), 12);
        let args = |siblings: bool| {
            format!(
                r#""offset":1,"limit":200,"mode":"indentation","indentation":{{"anchor_line":7,"max_levels":1,"include_siblings":{siblings}}}"#
            )
        };
        let dir = TempDir::new().unwrap();
        let p = write(&dir, "sample.py", PYTHON.as_bytes());
        let json = format!(
            "{{\"file_path\":{},{}}}",
            serde_json::to_string(p.to_str().unwrap()).unwrap(),
            args(true)
        );
        let out = read_file(dir.path(), &parse(&json)).unwrap();
        assert_eq!(out.lines.first().unwrap().number, 2);
        assert_eq!(
            out.model_text(),
            "L2:     def __init__(self, size):\n\
             L3:         self.size = size\n\
             L4:     def double(self, value):\n\
             L5:         if value is None:\n\
             L6:             return 0\n\
             L7:         result = value * self.size\n\
             L8:         return result"
        );
        assert_eq!(numbers(PYTHON, &args(false)), range(3, 8));
    }

    const CPP: &str = "#include <vector>
#include <string>

namespace sample {
class Runner {
public:
    void setup() {
        if (enabled_) {
            init();
        }
    }

    // Run the code
    int run() const {
        switch (mode_) {
            case Mode::Fast:
                return fast();
            case Mode::Slow:
                return slow();
            default:
                return fallback();
        }
    }

private:
    bool enabled_ = false;
    Mode mode_ = Mode::Fast;

    int fast() const {
        return 1;
    }
};
}  // namespace sample
";

    // test 18
    #[test]
    fn indentation_cpp() {
        assert_eq!(CPP.lines().count(), 33);
        let args = |opts: &str| {
            format!(r#""limit":200,"mode":"indentation","indentation":{{"anchor_line":18{opts}}}"#)
        };
        assert_eq!(numbers(CPP, &args(r#","max_levels":1"#)), range(15, 22));
        assert_eq!(numbers(CPP, &args(r#","max_levels":2"#)), range(13, 23));
        assert!(
            run(CPP.as_bytes(), &args(r#","max_levels":2"#))
                .unwrap()
                .starts_with("L13:     // Run the code\nL14:     int run() const {")
        );
        assert_eq!(
            numbers(CPP, &args(r#","max_levels":2,"include_header":false"#)),
            range(14, 23)
        );
        let opts = r#","max_levels":2,"include_header":false,"include_siblings":true"#;
        assert_eq!(numbers(CPP, &args(opts)), range(7, 23));
        let out = run(CPP.as_bytes(), &args(opts)).unwrap();
        assert!(
            out.contains("\nL11:     }\nL12: \nL13:     // Run the code\n"),
            "{out}"
        );
    }

    // test 19
    #[test]
    fn indentation_errors() {
        let err = run(
            b"a\nb\nc\n",
            r#""mode":"indentation","indentation":{"anchor_line":99}"#,
        )
        .unwrap_err();
        assert_eq!(err.message, "anchor_line exceeds file length");
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        let err = run(
            b"a\nb\nc\n",
            r#""mode":"indentation","indentation":{"max_lines":0}"#,
        )
        .unwrap_err();
        assert_eq!(err.message, "max_lines must be greater than zero");
        let err = run(
            b"a\nb\nc\n",
            r#""mode":"indentation","indentation":{"anchor_line":0}"#,
        )
        .unwrap_err();
        assert_eq!(err.message, "anchor_line must be a 1-indexed line number");
        let err = run(b"", r#""mode":"indentation""#).unwrap_err();
        assert_eq!(err.message, "anchor_line exceeds file length");
        // The anchor defaults to offset.
        let err = run(b"a\n", r#""offset":2,"mode":"indentation""#).unwrap_err();
        assert_eq!(err.message, "anchor_line exceeds file length");
    }

    #[test]
    fn indentation_validation_order() {
        // anchor_line is checked before max_lines, and both before the file is read.
        let err = read_file(
            Path::new("/"),
            &parse(
                r#"{"file_path":"/nonexistent/x","mode":"indentation","indentation":{"anchor_line":0,"max_lines":0}}"#,
            ),
        )
        .unwrap_err();
        assert_eq!(err.message, "anchor_line must be a 1-indexed line number");
        let err = read_file(
            Path::new("/"),
            &parse(r#"{"file_path":"/nonexistent/x","mode":"indentation","indentation":{"max_lines":0}}"#),
        )
        .unwrap_err();
        assert_eq!(err.message, "max_lines must be greater than zero");
    }

    // test 20
    #[test]
    fn indentation_single_line_limit() {
        assert_eq!(
            run(
                CPP.as_bytes(),
                r#""limit":1,"mode":"indentation","indentation":{"anchor_line":18}"#
            )
            .unwrap(),
            "L18:             case Mode::Slow:"
        );
        assert_eq!(
            run(
                CPP.as_bytes(),
                r#""mode":"indentation","indentation":{"anchor_line":18,"max_lines":1}"#
            )
            .unwrap(),
            "L18:             case Mode::Slow:"
        );
    }

    #[test]
    fn indentation_trims_blank_edges_and_counts_tabs() {
        // Tab = 4 columns; blank lines inherit the indent above and are trimmed at the edges.
        let src = "top\n\tif x {\n\t\tbody();\n\n\t}\nend\n";
        assert_eq!(
            numbers(
                src,
                r#""mode":"indentation","indentation":{"anchor_line":3,"max_levels":1}"#
            ),
            range(2, 5)
        );
        // A blank anchor with max_lines 2 is trimmed away with its blank neighbour only.
        assert_eq!(
            numbers(
                "a\n\n\nb\n",
                r#""mode":"indentation","indentation":{"anchor_line":2,"max_lines":2}"#
            ),
            range(1, 1)
        );
    }

    const JS: &str = "export function makeThing() {
    const cache = new Map();
    function remember(key, value) {
        if (!cache.has(key)) {
            cache.set(key, value);
        }
        return cache.get(key);
    }
    const handlers = {
        start() {
            return remember(\"start\", 1);
        },
        flip() {
            if (Math.random() > 0.5) {
                return \"heads\";
            }
            return \"tails\";
        },
    };
    return {
        handlers,
        size: () => cache.size,
    };
}
";

    // test 21
    #[test]
    fn indentation_javascript() {
        assert_eq!(JS.lines().count(), 24);
        let out = run(
            JS.as_bytes(),
            r#""mode":"indentation","indentation":{"anchor_line":15,"max_levels":1}"#,
        )
        .unwrap();
        assert_eq!(
            out,
            "L14:             if (Math.random() > 0.5) {\n\
             L15:                 return \"heads\";\n\
             L16:             }"
        );
    }

    // ---- H11: only regular files, bounded lines -------------------------------------------

    /// Runs read_file on `path` in another thread; a call that blocks fails the test instead of
    /// hanging it.
    fn read_within_5s(path: &Path) -> Result<String, ToolError> {
        let json = format!(
            "{{\"file_path\":{}}}",
            serde_json::to_string(path.to_str().unwrap()).unwrap()
        );
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(read_file(Path::new("/"), &parse(&json)).map(|o| o.model_text()));
        });
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .expect("read_file blocked")
    }

    fn mkfifo(dir: &TempDir, name: &str) -> PathBuf {
        let p = dir.path().join(name);
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        p
    }

    #[test]
    fn fifo_is_refused_without_blocking() {
        let dir = TempDir::new().unwrap();
        let fifo = mkfifo(&dir, "pipe");
        // Baseline: a plain blocking open of a FIFO with no writer does not return.
        let (tx, rx) = std::sync::mpsc::channel();
        let p = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(File::open(&p).is_ok());
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "baseline: a blocking open of a FIFO must block"
        );
        let err = read_within_5s(&fifo).unwrap_err();
        assert_eq!(
            err.message,
            "failed to read file: not a regular file (a FIFO)"
        );
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        // The open-then-fstat path (a FIFO swapped in after the stat) does not block either.
        let err = open_checked(&fifo).unwrap_err();
        assert_eq!(
            err.message,
            "failed to read file: not a regular file (a FIFO)"
        );
        // Unblock the baseline thread's open so it can finish.
        let _ = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo);
    }

    #[test]
    fn devices_and_sockets_are_refused() {
        for dev in ["/dev/zero", "/dev/null", "/dev/urandom"] {
            let err = read_within_5s(Path::new(dev)).unwrap_err();
            assert_eq!(
                err.message, "failed to read file: not a regular file (a character device)",
                "{dev}"
            );
            assert_eq!(err.kind, ErrorKind::InvalidArgument);
            assert_eq!(
                open_checked(Path::new(dev)).unwrap_err().message,
                err.message,
                "{dev} after open"
            );
        }
        let dir = TempDir::new().unwrap();
        let sock = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert_eq!(
            read_within_5s(&sock).unwrap_err().message,
            "failed to read file: not a regular file (a socket)"
        );
        // A symlink to a device is refused too (the target decides).
        let link = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(
            read_within_5s(&link)
                .unwrap_err()
                .message
                .contains("character device")
        );
    }

    #[test]
    fn symlink_to_a_regular_file_still_works() {
        let dir = TempDir::new().unwrap();
        write(&dir, "real.txt", b"one\ntwo\n");
        let link = dir.path().join("link.txt");
        std::os::unix::fs::symlink("real.txt", &link).unwrap();
        assert_eq!(read_within_5s(&link).unwrap(), "L1: one\nL2: two");
        // And in indentation mode.
        let json = format!(
            "{{\"file_path\":{},\"mode\":\"indentation\",\"offset\":2}}",
            serde_json::to_string(link.to_str().unwrap()).unwrap()
        );
        assert_eq!(
            read_file(dir.path(), &parse(&json)).unwrap().model_text(),
            "L1: one\nL2: two"
        );
    }

    #[test]
    fn a_10_mib_line_is_read_with_a_bounded_buffer() {
        let dir = TempDir::new().unwrap();
        let mut contents = vec![b'x'; 10 << 20];
        contents.extend_from_slice(b"\nsecond\r\nthird");
        let p = write(&dir, "long.txt", &contents);
        let json = format!(
            "{{\"file_path\":{}}}",
            serde_json::to_string(p.to_str().unwrap()).unwrap()
        );
        assert_eq!(
            read_file(dir.path(), &parse(&json)).unwrap().model_text(),
            format!("L1: {}\nL2: second\nL3: third", "x".repeat(500))
        );
        let json = format!(
            "{{\"file_path\":{},\"offset\":2,\"limit\":1}}",
            serde_json::to_string(p.to_str().unwrap()).unwrap()
        );
        assert_eq!(
            read_file(dir.path(), &parse(&json)).unwrap().model_text(),
            "L2: second"
        );
        // What the tool holds per line never exceeds the cap, whatever the line's length.
        let mut reader = BufReader::new(File::open(&p).unwrap());
        let mut seen = Vec::new();
        lines_of(&mut reader, MAX_LINE_BYTES, |bytes| {
            seen.push(bytes.len());
            true
        })
        .unwrap();
        assert_eq!(seen, vec![MAX_LINE_BYTES, 6, 5]);
    }

    #[test]
    fn capped_lines_keep_counting_across_an_endless_looking_stream() {
        // 256 MiB of one line from a reader (no file): consumed in full, kept to the cap, and the
        // next line is found.
        use std::io::Read;
        let long = std::io::repeat(b'z').take(256 << 20);
        let mut reader = BufReader::new(long.chain(&b"\nnext\nlast"[..]));
        let mut buf = Vec::new();
        let n = read_capped_line(&mut reader, &mut buf, 1024).unwrap();
        assert_eq!(
            (n, buf.len(), buf.capacity() <= 16 * 1024),
            ((256 << 20) + 1, 1024, true)
        );
        let mut lines = Vec::new();
        lines_of(&mut reader, 1024, |b| {
            lines.push(String::from_utf8_lossy(b).into_owned());
            true
        })
        .unwrap();
        assert_eq!(lines, ["next", "last"]);
    }
}
