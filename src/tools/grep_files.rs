//! The `grep_files` tool (spec/tools.md §4): lists the files whose contents match a regular
//! expression, newest first.
//!
//! Codex runs
//! `rg --files-with-matches --sortr=modified --regexp <pattern> --no-messages [--glob <include>] -- <search_path>`;
//! corral does the same search in-process with the crates ripgrep itself is built from
//! (`ignore` for the walk, `grep-regex` for the matcher, `grep-searcher` for the line-oriented
//! search), configured the way ripgrep 14+/15 configures them:
//!
//! - **Matcher**: `grep-regex` with `multi_line(true)`, `line_terminator(Some(b'\n'))` (matches
//!   never span lines; a pattern that can match `\n` is rejected), Unicode on, octal off,
//!   case-sensitive, and the NUL byte banned from patterns (binary detection makes it unmatchable).
//! - **Walk**: `ignore::WalkBuilder` (parallel) with ripgrep's default filters: hidden entries
//!   skipped; `.gitignore`, `.git/info/exclude` and the global git excludes only inside a git
//!   repository; `.ignore` and `.rgignore` always; ignore files of parent directories apply;
//!   symlinks are not followed (a symlink named as the root is, as in rg). The `include` glob is an
//!   `ignore::overrides` override rooted at the session cwd, exactly as rg's `--glob`. As in rg,
//!   a directory whose *own* name matches the glob is whitelisted too (`include:"*"` enters hidden
//!   and ignored directories; `*.txt` enters a directory named `x.txt`); directories that do not
//!   match it, such as `.hd/` for `*.txt`, keep their hidden/ignored status.
//! - **Binary data**: walked files stop at the first NUL byte (`BinaryDetection::quit(0)`); a file
//!   named directly by `path` is searched whole (`BinaryDetection::none()` for a regular file, which
//!   is what rg's memory-mapped explicit-file search amounts to; `convert(0)` for a non-regular
//!   file such as a FIFO or `/dev/zero`, where rg falls back to its reader). Detection works per
//!   read buffer: a match in a buffer read before the one holding the NUL counts. Every file is
//!   searched as with a fresh 64 KiB buffer, so the answer depends on the file alone (rg reuses a
//!   buffer that may have grown on an earlier file; see `FreshSearcher`).
//! - **Order**: only matching files are stat'ed; one global sort, newest mtime first, ties by path
//!   bytes ascending, unknown mtimes last (by path).
//!
//! Deliberate differences from Codex (spec §4.2 item 3): unreadable files and directories are
//! skipped quietly instead of turning the whole result into `rg failed: `; paths that are not valid
//! UTF-8 are skipped and not counted.
//!
//! Time limit: [`grep_files`] allows [`COMMAND_TIMEOUT`] (30 s) for the whole search and then fails
//! with `rg timed out after 30 seconds` ([`ErrorKind::DeadlineExceeded`]).
//! [`grep_files_with_timeout`] takes another limit and names *its* length in seconds in the message
//! (`rg timed out after 0.5 seconds`), so the text equals Codex's whenever the limit is Codex's.
//! On expiry the search is cancelled cooperatively: the walker quits at its next entry and the file
//! being read fails at its next read. A search blocked inside a single system call (opening a FIFO
//! named by `path` that has no writer) cannot be interrupted; its thread is left to finish on its
//! own while the call returns the timeout error.
//!
//! Invalid regexes: the text is `rg failed: {error}`. Syntax errors are reported from
//! the `regex` crate on the pattern exactly as given (`regex parse error:\n    (\n    ^\nerror:
//! unclosed group`, as in the spec), not on `grep-regex`'s internal `(?:…)` wrapping that rg 15
//! prints (`(?:()`). Errors found later by `grep-regex` (a pattern that can match `\n`, a NUL byte,
//! size limits) carry `grep-regex`'s text without rg's command-line hints (`--multiline`, `--text`),
//! which name flags the model cannot pass. An invalid `include` glob gives `rg failed: {glob error}`
//! (rg's message for `--glob`), and is checked before the regex, as rg does.

use crate::sync::LockExt;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, SystemTime};

use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkMatch};
use ignore::overrides::{Override, OverrideBuilder};
use ignore::{WalkBuilder, WalkState};

use super::shell::pinned_cwd::{fs_path, shown};
use super::{ErrorKind, ToolError, resolve_path};

/// Number of paths returned when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 100;
/// Largest accepted `limit`; larger values are clamped to it.
pub const MAX_LIMIT: usize = 2000;
/// Time allowed for the whole search.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Nesting limit of the regex parser (grep-regex's default).
const NEST_LIMIT: u32 = 250;

/// The tool's arguments (spec/tools.md §4.1). Unknown keys are ignored.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct GrepFilesArgs {
    pub pattern: String,
    pub include: Option<String>,
    pub path: Option<String>,
    pub limit: Option<usize>,
}

/// One matching file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrepMatch {
    /// `search_path` joined with the path found below it (no normalisation), or `search_path`
    /// itself when it names a file. Always valid UTF-8.
    pub path: PathBuf,
    /// Modification time, `None` when it could not be read.
    pub modified: Option<SystemTime>,
}

/// The result of a search: at most `limit` matches, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrepFilesOutput {
    pub matches: Vec<GrepMatch>,
    /// More files matched than `limit`; the list was cut.
    pub truncated: bool,
}

impl GrepFilesOutput {
    /// The model text: the paths joined by `\n` (no trailing newline), or exactly
    /// `No matches found.`.
    pub fn model_text(&self) -> String {
        if self.matches.is_empty() {
            return "No matches found.".to_string();
        }
        let mut text = String::new();
        for (i, m) in self.matches.iter().enumerate() {
            if i > 0 {
                text.push('\n');
            }
            // Paths are UTF-8 by construction (non-UTF-8 paths are skipped).
            text.push_str(&m.path.to_string_lossy());
        }
        text
    }

    /// The `success` flag: `true` iff some file matched.
    pub fn success(&self) -> bool {
        !self.matches.is_empty()
    }
}

/// Runs `grep_files` with the 30 s [`COMMAND_TIMEOUT`].
pub fn grep_files(cwd: &Path, args: &GrepFilesArgs) -> Result<GrepFilesOutput, ToolError> {
    grep_files_with_timeout(cwd, args, COMMAND_TIMEOUT)
}

/// Runs `grep_files` with the given time limit for the search (see the module docs for the text
/// of the timeout error).
pub fn grep_files_with_timeout(
    cwd: &Path,
    args: &GrepFilesArgs,
    timeout: Duration,
) -> Result<GrepFilesOutput, ToolError> {
    let pattern = args.pattern.trim();
    if pattern.is_empty() {
        return Err(ToolError::invalid("pattern must not be empty").on("pattern"));
    }
    let limit = args.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 {
        return Err(ToolError::invalid("limit must be greater than zero").on("limit"));
    }
    let limit = limit.min(MAX_LIMIT);

    let search_path = match &args.path {
        Some(p) => resolve_path(cwd, p),
        None => cwd.to_path_buf(),
    };
    // The search runs from the pinned working directory when the path lies there (H24): the
    // walk, the include glob's root and the global excludes' directory all in those terms, so
    // they match as before; the paths found are shown as under `search_path`.
    let reached = fs_path(&search_path).into_owned();
    let metadata = fs::metadata(&reached).map_err(|err| {
        ToolError::io(
            &format!("unable to access `{}`: ", search_path.display()),
            &err,
        )
    })?;

    let include = args
        .include
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let fs_cwd = fs_path(cwd).into_owned();
    let overrides = build_overrides(&fs_cwd, include)?;
    let matcher = build_matcher(pattern)?;

    let job = Job {
        cwd: fs_cwd,
        search_path: reached.clone(),
        is_dir: metadata.is_dir(),
        overrides,
        matcher,
        cancel: Arc::new(AtomicBool::new(false)),
    };
    let cancel = Arc::clone(&job.cancel);
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("grep_files".into())
        .spawn(move || {
            let _ = tx.send(job.run());
        })
        .map_err(|err| ToolError::io("failed to start search: ", &err))?;
    let mut found = match rx.recv_timeout(timeout) {
        Ok(found) => found,
        Err(_) => {
            cancel.store(true, Ordering::Relaxed);
            return Err(ToolError::new(
                ErrorKind::DeadlineExceeded,
                timeout_message(timeout),
            ));
        }
    };
    if reached.as_os_str() != search_path.as_os_str() {
        for m in &mut found {
            m.path = shown(&m.path).into_owned();
        }
        // As if walked by the shown path: one that is not UTF-8 is skipped.
        found.retain(|m| m.path.to_str().is_some());
    }

    // Newest first; equal times by path bytes; unknown times last, by path.
    found.sort_unstable_by(|a, b| {
        let by_time = match (a.modified, b.modified) {
            (Some(x), Some(y)) => y.cmp(&x),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        };
        by_time.then_with(|| {
            a.path
                .as_os_str()
                .as_encoded_bytes()
                .cmp(b.path.as_os_str().as_encoded_bytes())
        })
    });
    let truncated = found.len() > limit;
    found.truncate(limit);
    Ok(GrepFilesOutput {
        matches: found,
        truncated,
    })
}

/// `rg timed out after {seconds} seconds`; `30` for the default limit, as Codex words it.
fn timeout_message(timeout: Duration) -> String {
    format!("rg timed out after {} seconds", timeout.as_secs_f64())
}

/// The `include` glob as rg's `--glob` builds it: an override rooted at rg's working directory.
fn build_overrides(cwd: &Path, include: Option<&str>) -> Result<Override, ToolError> {
    let Some(glob) = include else {
        return Ok(Override::empty());
    };
    let mut builder = OverrideBuilder::new(cwd);
    builder
        .add(glob)
        .map_err(|err| ToolError::invalid(format!("rg failed: {err}")).on("include"))?;
    builder
        .build()
        .map_err(|err| ToolError::invalid(format!("rg failed: {err}")).on("include"))
}

/// The matcher rg builds for a single `--regexp` without `-U`, `-i`, `-F` or `-a`.
fn build_matcher(pattern: &str) -> Result<RegexMatcher, ToolError> {
    // Syntax errors are quoted against the pattern as the model wrote it (grep-regex would quote
    // its internal `(?:…)` wrapping). Only syntax errors are taken from this check; size limits
    // and everything else are left to grep-regex, which builds the matcher actually used.
    let check = regex::bytes::RegexBuilder::new(pattern)
        .nest_limit(NEST_LIMIT)
        .octal(false)
        .unicode(true)
        .multi_line(true)
        .build();
    if let Err(err @ regex::Error::Syntax(_)) = check {
        return Err(ToolError::invalid(format!("rg failed: {err}")));
    }
    RegexMatcherBuilder::new()
        .multi_line(true)
        .unicode(true)
        .octal(false)
        .fixed_strings(false)
        .case_insensitive(false)
        .line_terminator(Some(b'\n'))
        .dot_matches_new_line(false)
        .ban_byte(Some(b'\0'))
        .build_many(&[pattern])
        .map_err(|err| ToolError::invalid(format!("rg failed: {err}")))
}

/// Everything the search thread needs.
struct Job {
    cwd: PathBuf,
    search_path: PathBuf,
    is_dir: bool,
    overrides: Override,
    matcher: RegexMatcher,
    cancel: Arc<AtomicBool>,
}

impl Job {
    /// Searches and returns the matching files, unsorted.
    fn run(self) -> Vec<GrepMatch> {
        if !self.is_dir {
            // An explicit file: always searched, filters do not apply (rg's explicit mode).
            let binary = match fs::metadata(&self.search_path) {
                Ok(md) if md.is_file() => BinaryDetection::none(),
                _ => BinaryDetection::convert(b'\0'),
            };
            return FreshSearcher::new(binary)
                .match_file(&self.matcher, &self.search_path, &self.cancel)
                .into_iter()
                .collect();
        }

        let found = Mutex::new(Vec::new());
        let mut builder = WalkBuilder::new(&self.search_path);
        builder
            .standard_filters(true)
            .require_git(true)
            .follow_links(false)
            .same_file_system(false)
            .max_depth(None)
            .max_filesize(None)
            .overrides(self.overrides.clone())
            .add_custom_ignore_filename(".rgignore")
            .current_dir(self.cwd.clone());
        builder.threads(0);
        builder.build_parallel().run(|| {
            let matcher = self.matcher.clone();
            let cancel = &self.cancel;
            let found = &found;
            let mut searcher = FreshSearcher::walked();
            Box::new(move |entry| {
                if cancel.load(Ordering::Relaxed) {
                    return WalkState::Quit;
                }
                // Unreadable directories and vanished entries are skipped quietly.
                let Ok(entry) = entry else {
                    return WalkState::Continue;
                };
                let is_file = entry.file_type().is_some_and(|t| t.is_file());
                if !is_file {
                    // Directories are entered by the walker; symlinks and special files are
                    // not searched (the root is always a directory here).
                    return WalkState::Continue;
                }
                if let Some(m) = searcher.match_file(&matcher, entry.path(), cancel) {
                    found.locked().push(m);
                }
                WalkState::Continue
            })
        });
        found.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

/// Bytes read from a walked file by its first `read(2)` (see [`FileReader`]). Two thirds of the
/// files of a typical tree (a Python install: 66 % of 111k files) are smaller, and are read with
/// one `read(2)` instead of two.
const HEAD: usize = 8 * 1024;

/// A searcher configured as rg's for `--files-with-matches`, that starts every file with a
/// buffer of the initial size.
///
/// Binary detection in quit mode looks at each buffer as it is read, so whether a NUL byte hides
/// a match before it depends on the buffer size; and a `Searcher` keeps a buffer that grew for a
/// long line. rg reuses one searcher per thread, so its answer for a file with a NUL byte past
/// 64 KiB depends on which files the same searcher read before (with `--sortr=modified`: on every
/// file sorted ahead of it). corral makes the answer depend only on the file: the searcher is
/// replaced after any file that may have grown its buffer.
struct FreshSearcher {
    binary: BinaryDetection,
    searcher: Searcher,
    /// The first bytes of the file being searched (walked files only; see [`FileReader`]).
    head: Option<Box<[u8]>>,
}

impl FreshSearcher {
    /// A searcher for files named directly by `path`: they are read exactly as rg reads them.
    fn new(binary: BinaryDetection) -> Self {
        let searcher = build_searcher(binary.clone());
        Self {
            binary,
            searcher,
            head: None,
        }
    }

    /// A searcher for walked files, which are regular files (the walker reports their type):
    /// their first bytes are read ahead (see [`FileReader`]).
    fn walked() -> Self {
        Self {
            head: Some(vec![0; HEAD].into_boxed_slice()),
            ..Self::new(BinaryDetection::quit(b'\0'))
        }
    }

    /// Searches one file; `Some` (with its mtime) when it has a match. Files whose path is not
    /// UTF-8, and files that cannot be opened or read, yield `None`.
    fn match_file(
        &mut self,
        matcher: &RegexMatcher,
        path: &Path,
        cancel: &AtomicBool,
    ) -> Option<GrepMatch> {
        path.to_str()?;
        let file = File::open(path).ok()?;
        let mut sink = FirstMatch(false);
        let mut reader = FileReader {
            file: &file,
            cancel,
            head: self.head.as_deref_mut(),
            head_read: false,
            head_pos: 0,
            head_len: 0,
            offset: 0,
            may_grow: false,
            nul_quits: self.binary.quit_byte().is_some(),
        };
        let result = self.searcher.search_reader(matcher, &mut reader, &mut sink);
        if reader.may_grow {
            self.searcher = build_searcher(self.binary.clone());
        }
        result.ok()?;
        if !sink.0 {
            return None;
        }
        // The file searched, not whatever the path names by now; no second path lookup.
        let modified = file.metadata().and_then(|md| md.modified()).ok();
        Some(GrepMatch {
            path: path.to_path_buf(),
            modified,
        })
    }
}

fn build_searcher(binary: BinaryDetection) -> Searcher {
    SearcherBuilder::new()
        .line_terminator(grep_matcher::LineTerminator::byte(b'\n'))
        .line_number(false)
        .multi_line(false)
        .binary_detection(binary)
        .build()
}

/// A sink that records whether any line matched and stops the search at the first match.
/// (grep-searcher's convenience sinks fail when line numbers are off.)
struct FirstMatch(bool);

impl Sink for FirstMatch {
    type Error = io::Error;

    fn matched(&mut self, _: &Searcher, _: &SinkMatch<'_>) -> Result<bool, io::Error> {
        self.0 = true;
        Ok(false)
    }
}

/// The searcher's reader: hands out exactly the bytes a `read(2)` of the same length at the same
/// offset would (the searcher's answer depends on how its reads split the file: binary detection
/// discards the whole buffer fill that holds the NUL byte), fails once the search has been
/// cancelled (time limit) so that a long read of one big file stops too, and notes whether the
/// searcher's buffer may have grown.
///
/// With `head` (walked regular files), the first request, which is grep-searcher's 3-byte BOM
/// peek, is served from one `read(2)` of up to [`HEAD`] bytes; the next request continues from
/// that copy, and reads on from the file only if the copy was full (a short read of a regular
/// file ends at its end). A file smaller than `HEAD` thus costs one `read(2)` plus the one that
/// sees the end, instead of rg's `read(3)`, `read(65533)` and the one that sees the end.
struct FileReader<'a> {
    file: &'a File,
    cancel: &'a AtomicBool,
    head: Option<&'a mut [u8]>,
    head_read: bool,
    head_pos: usize,
    head_len: usize,
    /// Bytes handed out so far.
    offset: u64,
    /// Some request after the BOM peek was filled completely without a line terminator (nor,
    /// when a NUL byte stops the search, a NUL byte): only then can the searcher's line buffer
    /// have grown (it grows when it is full and holds no complete line; every fill stops at the
    /// first read that brings a line terminator, or a NUL byte in quit mode).
    may_grow: bool,
    /// Binary detection quits at a NUL byte (walked files).
    nul_quits: bool,
}

impl FileReader<'_> {
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut file = self.file;
        let Some(head) = self.head.as_deref_mut() else {
            return file.read(buf);
        };
        if self.offset == 0 && !self.head_read && buf.len() < head.len() {
            self.head_read = true;
            self.head_len = file.read(head)?;
            if self.head_len == 0 {
                return Ok(0);
            }
        }
        if self.head_pos == self.head_len {
            return file.read(buf);
        }
        let n = buf.len().min(self.head_len - self.head_pos);
        buf[..n].copy_from_slice(&head[self.head_pos..self.head_pos + n]);
        self.head_pos += n;
        if n < buf.len() && self.head_len == head.len() {
            // The head was a full read: return what one read(2) of the whole request would.
            return Ok(n + file.read(&mut buf[n..])?);
        }
        Ok(n)
    }
}

impl Read for FileReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(io::Error::other("search cancelled"));
        }
        let n = self.fill(buf)?;
        // The BOM peek reads the first 3 bytes; the line buffer's reads start after them.
        if n > 0
            && n == buf.len()
            && self.offset >= 3
            && !buf[..n].contains(&b'\n')
            && !(self.nul_quits && buf[..n].contains(&0))
        {
            self.may_grow = true;
        }
        self.offset += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
    use std::process::Command;
    use std::time::UNIX_EPOCH;

    /// A fresh directory under the system temp dir (`/tmp`), outside any git repository.
    fn tmp() -> tempfile::TempDir {
        crate::tools::tempdir_outside_any_repository()
    }

    fn write(root: &Path, rel: impl AsRef<Path>, content: impl AsRef<[u8]>) -> PathBuf {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(&path, content).unwrap();
        path
    }

    fn set_mtime(path: &Path, secs: u64) {
        let file = File::options().write(true).open(path).unwrap();
        file.set_modified(UNIX_EPOCH + Duration::from_secs(secs))
            .unwrap();
    }

    fn args(pattern: &str) -> GrepFilesArgs {
        GrepFilesArgs {
            pattern: pattern.to_string(),
            ..Default::default()
        }
    }

    fn with_path(pattern: &str, path: &Path) -> GrepFilesArgs {
        GrepFilesArgs {
            path: Some(path.to_str().unwrap().to_string()),
            ..args(pattern)
        }
    }

    fn lines(out: &GrepFilesOutput) -> Vec<String> {
        let text = out.model_text();
        if !out.success() {
            return Vec::new();
        }
        text.split('\n').map(str::to_string).collect()
    }

    fn p(path: &Path) -> String {
        path.to_str().unwrap().to_string()
    }

    fn err(cwd: &Path, a: &GrepFilesArgs) -> ToolError {
        grep_files(cwd, a).expect_err("expected an error")
    }

    // §4.6 test 1
    #[test]
    fn finds_matching_files() {
        let d = tmp();
        let one = write(d.path(), "match_one.txt", "alpha beta gamma");
        let two = write(d.path(), "match_two.txt", "alpha delta");
        write(d.path(), "other.txt", "omega");
        set_mtime(&one, 2_000);
        set_mtime(&two, 1_000);
        let out = grep_files(d.path(), &with_path("alpha", d.path())).unwrap();
        assert!(out.success());
        assert!(!out.truncated);
        let l = lines(&out);
        assert_eq!(l.len(), 2);
        assert!(l[0].ends_with("match_one.txt"), "{l:?}");
        assert!(l[1].ends_with("match_two.txt"), "{l:?}");
        assert_eq!(out.model_text(), format!("{}\n{}", p(&one), p(&two)));
        assert_eq!(
            out.matches[0].modified,
            Some(UNIX_EPOCH + Duration::from_secs(2_000))
        );
    }

    // §4.6 test 2
    #[test]
    fn include_glob_filters() {
        let d = tmp();
        let rs = write(d.path(), "match_one.rs", "alpha");
        write(d.path(), "match_two.txt", "alpha");
        let a = GrepFilesArgs {
            include: Some("*.rs".into()),
            ..with_path("alpha", d.path())
        };
        let out = grep_files(d.path(), &a).unwrap();
        assert_eq!(out.model_text(), p(&rs));
        // Brace alternatives.
        write(d.path(), "three.ts", "alpha");
        write(d.path(), "four.tsx", "alpha");
        let a = GrepFilesArgs {
            include: Some("*.{ts,tsx}".into()),
            ..with_path("alpha", d.path())
        };
        assert_eq!(grep_files(d.path(), &a).unwrap().matches.len(), 2);
    }

    // §4.6 test 3
    #[test]
    fn limit_cuts_the_list() {
        let d = tmp();
        for (i, name) in ["a.txt", "b.txt", "c.txt"].iter().enumerate() {
            let f = write(d.path(), name, "alpha");
            set_mtime(&f, 1_000 + i as u64);
        }
        let a = GrepFilesArgs {
            limit: Some(2),
            ..with_path("alpha", d.path())
        };
        let out = grep_files(d.path(), &a).unwrap();
        assert_eq!(lines(&out).len(), 2);
        assert!(out.truncated);
        assert_eq!(
            out.model_text(),
            format!(
                "{}\n{}",
                p(&d.path().join("c.txt")),
                p(&d.path().join("b.txt"))
            )
        );
        let a = GrepFilesArgs {
            limit: Some(3),
            ..with_path("alpha", d.path())
        };
        assert!(!grep_files(d.path(), &a).unwrap().truncated);
    }

    // §4.6 test 4
    #[test]
    fn no_match() {
        let d = tmp();
        write(d.path(), "a.txt", "omega");
        let out = grep_files(d.path(), &with_path("alpha", d.path())).unwrap();
        assert_eq!(out.model_text(), "No matches found.");
        assert!(!out.success());
        assert!(!out.truncated);
    }

    // §4.6 test 5
    #[test]
    fn blank_pattern() {
        let d = tmp();
        for pat in ["   ", "", "\t\n"] {
            let e = err(d.path(), &args(pat));
            assert_eq!(e.message, "pattern must not be empty");
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
        }
    }

    // §4.6 test 6
    #[test]
    fn zero_limit() {
        let d = tmp();
        let a = GrepFilesArgs {
            limit: Some(0),
            ..args("alpha")
        };
        let e = err(d.path(), &a);
        assert_eq!(e.message, "limit must be greater than zero");
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        // The pattern is checked first.
        let a = GrepFilesArgs {
            limit: Some(0),
            ..args(" ")
        };
        assert_eq!(err(d.path(), &a).message, "pattern must not be empty");
    }

    // §4.6 test 7
    #[test]
    fn limit_is_clamped() {
        let d = tmp();
        for i in 0..2100 {
            write(d.path(), format!("f{i:04}.txt"), "alpha\n");
        }
        let a = GrepFilesArgs {
            limit: Some(5000),
            ..with_path("alpha", d.path())
        };
        let out = grep_files(d.path(), &a).unwrap();
        assert_eq!(lines(&out).len(), 2000);
        assert!(out.truncated);
        // Default limit.
        let out = grep_files(d.path(), &with_path("alpha", d.path())).unwrap();
        assert_eq!(lines(&out).len(), DEFAULT_LIMIT);
    }

    // §4.6 test 8
    #[test]
    fn inaccessible_path() {
        let d = tmp();
        let a = GrepFilesArgs {
            path: Some("nope".into()),
            ..args("alpha")
        };
        let e = err(d.path(), &a);
        assert_eq!(
            e.message,
            format!(
                "unable to access `{}/nope`: No such file or directory (os error 2)",
                p(d.path())
            )
        );
        assert_eq!(e.kind, ErrorKind::NotFound);
        // The path is checked before the regex.
        let a = GrepFilesArgs {
            path: Some("nope".into()),
            ..args("(")
        };
        assert!(err(d.path(), &a).message.starts_with("unable to access"));
        // A path through a regular file.
        write(d.path(), "file", "x");
        let a = GrepFilesArgs {
            path: Some("file/x".into()),
            ..args("alpha")
        };
        let e = err(d.path(), &a);
        assert_eq!(
            e.message,
            format!(
                "unable to access `{}/file/x`: Not a directory (os error 20)",
                p(d.path())
            )
        );
        assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    }

    // §4.6 test 9
    #[test]
    fn newest_first() {
        let d = tmp();
        let old = write(d.path(), "old.txt", "alpha");
        let new = write(d.path(), "new.txt", "alpha");
        set_mtime(&new, 2_000_000);
        set_mtime(&old, 1_000_000);
        let out = grep_files(d.path(), &with_path("alpha", d.path())).unwrap();
        assert_eq!(out.model_text(), format!("{}\n{}", p(&new), p(&old)));
        // And the other way round, so directory order cannot be what passes the test.
        set_mtime(&old, 3_000_000);
        let out = grep_files(d.path(), &with_path("alpha", d.path())).unwrap();
        assert_eq!(out.model_text(), format!("{}\n{}", p(&old), p(&new)));
    }

    // §4.6 test 10
    #[test]
    fn pattern_is_trimmed() {
        let d = tmp();
        let f = write(d.path(), "a.txt", "xx alpha yy");
        let out = grep_files(d.path(), &with_path("  alpha  ", d.path())).unwrap();
        assert_eq!(out.model_text(), p(&f));
        // Trimmed means the surrounding spaces are not part of the regex.
        write(d.path(), "b.txt", "alpha");
        let out = grep_files(d.path(), &with_path("  alpha  ", d.path())).unwrap();
        assert_eq!(out.matches.len(), 2);
    }

    // §4.6 test 11
    #[test]
    fn blank_include_is_no_glob() {
        let d = tmp();
        write(d.path(), "a.rs", "alpha");
        write(d.path(), "b.txt", "alpha");
        for inc in ["  ", ""] {
            let a = GrepFilesArgs {
                include: Some(inc.into()),
                ..with_path("alpha", d.path())
            };
            assert_eq!(grep_files(d.path(), &a).unwrap().matches.len(), 2);
        }
        // The glob itself is trimmed too.
        let a = GrepFilesArgs {
            include: Some("  *.rs ".into()),
            ..with_path("alpha", d.path())
        };
        assert_eq!(grep_files(d.path(), &a).unwrap().matches.len(), 1);
    }

    // §4.6 test 12
    #[test]
    fn ignore_rules_and_hidden_files() {
        // Outside a git repository .gitignore has no effect; .ignore and .rgignore always do.
        let d = tmp();
        let root = d.path();
        let visible = write(root, "visible.txt", "alpha");
        let gi = write(root, "gi.txt", "alpha");
        write(root, "ig.txt", "alpha");
        write(root, "rgig.txt", "alpha");
        write(root, ".dot.txt", "alpha");
        write(root, ".hdir/x.txt", "alpha");
        write(root, ".gitignore", "gi.txt\n");
        write(root, ".ignore", "ig.txt\n");
        write(root, ".rgignore", "rgig.txt\n");
        set_mtime(&visible, 2_000);
        set_mtime(&gi, 1_000);
        let out = grep_files(root, &with_path("alpha", root)).unwrap();
        assert_eq!(out.model_text(), format!("{}\n{}", p(&visible), p(&gi)));

        // Inside a git repository .gitignore applies as well.
        fs::create_dir(root.join(".git")).unwrap();
        let out = grep_files(root, &with_path("alpha", root)).unwrap();
        assert_eq!(out.model_text(), p(&visible));

        // .git/info/exclude applies inside a repository.
        write(root, ".git/info/exclude", "visible.txt\n");
        let out = grep_files(root, &with_path("alpha", root)).unwrap();
        assert_eq!(out.model_text(), "No matches found.");
        fs::remove_file(root.join(".git/info/exclude")).unwrap();

        // Ignore files of parent directories apply when searching a subdirectory.
        let sub = write(root, "sub/ig.txt", "alpha");
        write(root, "sub/gi.txt", "alpha");
        let kept = write(root, "sub/kept.txt", "alpha");
        write(root, ".ignore", "ig.txt\n!sub/kept.txt\n");
        let out = grep_files(root, &with_path("alpha", &root.join("sub"))).unwrap();
        assert_eq!(out.model_text(), p(&kept));
        assert!(!out.model_text().contains(p(&sub).as_str()));
    }

    // §4.6 test 13
    #[test]
    fn path_naming_a_file() {
        let d = tmp();
        let f = write(d.path(), "one.txt", "alpha");
        write(d.path(), "two.txt", "alpha");
        let out = grep_files(d.path(), &with_path("alpha", &f)).unwrap();
        assert_eq!(out.model_text(), p(&f));
        // Relative, and a hidden or ignored file named explicitly is still searched; the glob
        // does not apply to it either (rg's explicit-path rule).
        let hidden = write(d.path(), ".secret.txt", "alpha");
        write(d.path(), ".ignore", ".secret.txt\n");
        let a = GrepFilesArgs {
            path: Some(".secret.txt".into()),
            include: Some("*.rs".into()),
            ..args("alpha")
        };
        let out = grep_files(d.path(), &a).unwrap();
        assert_eq!(out.model_text(), p(&hidden));
        let out = grep_files(d.path(), &with_path("omega", &f)).unwrap();
        assert_eq!(out.model_text(), "No matches found.");
    }

    // §4.6 test 14 and the other regex errors
    #[test]
    fn invalid_regex() {
        let d = tmp();
        let e = err(d.path(), &args("("));
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(
            e.message.starts_with("rg failed: regex parse error"),
            "{}",
            e.message
        );
        assert_eq!(
            e.message,
            "rg failed: regex parse error:\n    (\n    ^\nerror: unclosed group"
        );
        // A literal line terminator cannot be matched line by line.
        let e = err(d.path(), &args("alpha\nbeta"));
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.starts_with("rg failed: "), "{}", e.message);
        assert!(
            e.message.contains(r#"the literal "\n" is not allowed"#),
            "{}",
            e.message
        );
        let e = err(d.path(), &args(r"a\nb"));
        assert!(e.message.starts_with("rg failed: "), "{}", e.message);
        // NUL bytes are unmatchable with binary detection on, so rg rejects them.
        let e = err(d.path(), &args(r"a\x00b"));
        assert!(e.message.starts_with("rg failed: "), "{}", e.message);
        // An invalid glob.
        let a = GrepFilesArgs {
            include: Some("a[".into()),
            ..args("alpha")
        };
        let e = err(d.path(), &a);
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(
            e.message.starts_with("rg failed: error parsing glob"),
            "{}",
            e.message
        );
    }

    // §4.6 test 15
    #[test]
    fn absolute_path_outside_cwd() {
        let cwd = tmp();
        let other = tmp();
        let f = write(other.path(), "deep/a.txt", "alpha");
        write(cwd.path(), "b.txt", "alpha");
        let out = grep_files(cwd.path(), &with_path("alpha", other.path())).unwrap();
        assert_eq!(out.model_text(), p(&f));
    }

    // §4.6 test 16
    #[test]
    fn include_overrides_ignore_and_hidden_but_not_for_directories() {
        let d = tmp();
        let root = d.path();
        fs::create_dir(root.join(".git")).unwrap();
        write(root, ".gitignore", "ign.txt\n");
        let a = write(root, "a.txt", "alpha");
        let h = write(root, ".hidden.txt", "alpha");
        let i = write(root, "ign.txt", "alpha");
        write(root, ".hd/x.txt", "alpha");
        write(root, "b.rs", "alpha");
        set_mtime(&a, 3_000);
        set_mtime(&h, 2_000);
        set_mtime(&i, 1_000);
        let args = GrepFilesArgs {
            include: Some("*.txt".into()),
            ..with_path("alpha", root)
        };
        let out = grep_files(root, &args).unwrap();
        assert_eq!(out.model_text(), format!("{}\n{}\n{}", p(&a), p(&h), p(&i)));
        // Without the glob, only a.txt and b.rs.
        let out = grep_files(root, &with_path("alpha", root)).unwrap();
        assert_eq!(out.matches.len(), 2);
    }

    // §4.6 test 17
    #[test]
    fn binary_files() {
        let d = tmp();
        let b1 = write(d.path(), "b1.dat", b"alpha\n\0\n");
        let mut big = b"alpha\n".to_vec();
        big.extend(std::iter::repeat_n(b'x', 200_000));
        big.extend_from_slice(b"\n\0\n");
        let b2 = write(d.path(), "b2.dat", &big);
        let out = grep_files(d.path(), &with_path("alpha", d.path())).unwrap();
        assert_eq!(out.model_text(), p(&b2));
        let out = grep_files(d.path(), &with_path("alpha", &b1)).unwrap();
        assert_eq!(out.model_text(), p(&b1));
        // A named file is searched past its NUL bytes, and NUL is an ordinary byte there.
        let b3 = write(d.path(), "b3.dat", b"\0\0\nzz a\0b zz\n");
        let out = grep_files(d.path(), &with_path("a.b", &b3)).unwrap();
        assert_eq!(out.model_text(), p(&b3));
        let out = grep_files(d.path(), &with_path("a.b", d.path())).unwrap();
        assert_eq!(out.model_text(), "No matches found.");
    }

    // Whether a NUL past the first buffer hides a match must not depend on other files.
    #[test]
    fn binary_detection_does_not_depend_on_other_files() {
        let d = tmp();
        // Lines longer than the 64 KiB buffer make a reused searcher's buffer grow.
        for i in 0..8 {
            let mut long = vec![b'z'; 300_000];
            long.push(b'\n');
            write(d.path(), format!("long{i}.txt"), &long);
        }
        let mut content = b"alpha\n".to_vec();
        content.extend(std::iter::repeat_n(b'y', 70_000));
        content.extend_from_slice(b"\n\0\n");
        let f = write(d.path(), "late_nul.txt", &content);
        for _ in 0..20 {
            let out = grep_files(d.path(), &with_path("alpha", d.path())).unwrap();
            assert_eq!(out.model_text(), p(&f));
        }
    }

    /// Records what each `read` asked for and returned.
    struct Recording<R> {
        inner: R,
        calls: Vec<(usize, Vec<u8>)>,
    }

    impl<R: Read> Read for Recording<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.calls.push((buf.len(), buf[..n].to_vec()));
            Ok(n)
        }
    }

    /// Searches `path` as a walked file, with or without the read-ahead head; returns the
    /// answer, the searcher's reads and whether the reader saw a possible buffer growth.
    fn search_recorded(
        path: &Path,
        pattern: &str,
        with_head: bool,
    ) -> (bool, Vec<(usize, Vec<u8>)>, bool) {
        let matcher = build_matcher(pattern).unwrap();
        let mut searcher = build_searcher(BinaryDetection::quit(b'\0'));
        let mut head = vec![0; HEAD];
        let cancel = AtomicBool::new(false);
        let file = File::open(path).unwrap();
        let mut reader = Recording {
            inner: FileReader {
                file: &file,
                cancel: &cancel,
                head: with_head.then_some(&mut head[..]),
                head_read: false,
                head_pos: 0,
                head_len: 0,
                offset: 0,
                may_grow: false,
                nul_quits: true,
            },
            calls: Vec::new(),
        };
        let mut sink = FirstMatch(false);
        searcher
            .search_reader(&matcher, &mut reader, &mut sink)
            .unwrap();
        (sink.0, reader.calls, reader.inner.may_grow)
    }

    // The read-ahead head changes the system calls, never what the searcher sees: every read
    // returns the bytes one read(2) of the same request would (so binary detection splits the
    // file identically), on contents around the 3-byte BOM peek, HEAD and the 64 KiB buffer.
    #[test]
    fn read_ahead_hands_out_the_same_reads() {
        let d = tmp();
        let mut rng = Rng(0x5151_7a7a_0101_fefe);
        let sizes = [
            0,
            1,
            2,
            3,
            4,
            5,
            100,
            HEAD - 4,
            HEAD - 3,
            HEAD - 1,
            HEAD,
            HEAD + 1,
            HEAD + 3,
            65_532,
            65_533,
            65_535,
            65_536,
            65_537,
            65_539,
            70_000,
            140_000,
        ];
        let mut cases = 0;
        for (i, &size) in sizes.iter().enumerate() {
            for variant in 0..12 {
                let mut content: Vec<u8> = (0..size)
                    .map(|_| match rng.below(40) {
                        0 => b'\n',
                        1..=3 => b' ',
                        _ => b'a' + rng.below(4) as u8,
                    })
                    .collect();
                // Lines longer than the buffer, a NUL at a random place, BOMs, a line
                // terminator among the first 3 bytes, a match at the very start.
                if variant % 3 == 1 {
                    content.retain(|&b| b != b'\n');
                }
                if variant % 4 == 2 && size > 0 {
                    let at = rng.below(size as u64) as usize;
                    content[at] = 0;
                }
                let prefix: &[u8] = match variant {
                    3 => b"\xef\xbb\xbfab",
                    5 => b"\xff\xfea\0b\0",
                    7 => b"a\nb",
                    9 => b"\n",
                    _ => b"",
                };
                let mut full = prefix.to_vec();
                full.extend_from_slice(&content);
                let f = write(d.path(), format!("f{i}_{variant}"), &full);
                for pattern in ["ab", "^b", "dd", "zzz"] {
                    let (plain_match, plain_reads, plain_grow) =
                        search_recorded(&f, pattern, false);
                    let (head_match, head_reads, head_grow) = search_recorded(&f, pattern, true);
                    assert_eq!(
                        plain_match, head_match,
                        "size {size} variant {variant} {pattern}"
                    );
                    assert!(
                        plain_reads == head_reads,
                        "size {size} variant {variant} {pattern}"
                    );
                    assert_eq!(plain_grow, head_grow);
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, sizes.len() * 12 * 4);
    }

    // The searcher is replaced exactly when its buffer may have grown: after a line longer than
    // the buffer, not after a big file of short lines or a big binary file.
    #[test]
    fn searcher_replaced_only_after_long_lines() {
        let d = tmp();
        let mut short = Vec::new();
        while short.len() < 200_000 {
            short.extend_from_slice(b"short line\n");
        }
        let short = write(d.path(), "short.txt", &short);
        // No line terminator at all, but binary detection stops the search at the NUL byte.
        let mut binary = vec![b'x'; 200_000];
        binary[100] = 0;
        let binary = write(d.path(), "binary.dat", &binary);
        let mut long = vec![b'z'; 100_000];
        long.push(b'\n');
        let long = write(d.path(), "long.txt", &long);
        assert!(!search_recorded(&short, "nomatch", true).2);
        assert!(!search_recorded(&binary, "nomatch", true).2);
        assert!(search_recorded(&long, "nomatch", true).2);
        assert!(search_recorded(&long, "nomatch", false).2);
    }

    // §4.6 test 18
    #[test]
    fn ties_broken_by_path() {
        let d = tmp();
        let b = write(d.path(), "b.txt", "alpha");
        let a = write(d.path(), "a.txt", "alpha");
        let c = write(d.path(), "sub/c.txt", "alpha");
        let z = write(d.path(), "z.txt", "alpha");
        for f in [&a, &b, &c] {
            set_mtime(f, 5_000);
        }
        set_mtime(&z, 4_000);
        let out = grep_files(d.path(), &with_path("alpha", d.path())).unwrap();
        assert_eq!(
            out.model_text(),
            format!("{}\n{}\n{}\n{}", p(&a), p(&b), p(&c), p(&z))
        );
    }

    // §4.6 test 20. Permission bits do not bind root, so as root the test re-runs itself as
    // `nobody` (uid/gid 65534); if that is impossible it checks only that the call succeeds.
    #[test]
    fn unreadable_entries_are_skipped() {
        const CHILD: &str = "CORRAL_GREP_UNPRIVILEGED_CHILD";
        let d = tmp();
        let a = write(d.path(), "a.txt", "alpha");
        let b = write(d.path(), "b.txt", "alpha");
        write(d.path(), "locked/c.txt", "alpha");
        fs::set_permissions(&b, fs::Permissions::from_mode(0o000)).unwrap();
        fs::set_permissions(d.path().join("locked"), fs::Permissions::from_mode(0o000)).unwrap();
        let is_root = fs::metadata(&a).unwrap().uid() == 0;
        let out = grep_files(d.path(), &with_path("alpha", d.path()));
        // Let the temp dir be removed.
        let restore = || {
            fs::set_permissions(d.path().join("locked"), fs::Permissions::from_mode(0o755)).ok();
        };
        if !is_root {
            restore();
            let out = out.unwrap();
            assert_eq!(out.model_text(), p(&a));
            assert!(out.success());
            return;
        }
        restore();
        let out = out.unwrap();
        assert!(out.success());
        assert!(out.model_text().contains(&p(&a)));
        if std::env::var_os(CHILD).is_some() {
            panic!("the unprivileged child still runs as root");
        }
        // Re-run this test as nobody.
        let name = format!(
            "{}::unreadable_entries_are_skipped",
            module_path!().split_once("::").unwrap().1
        );
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe().unwrap();
        let status = Command::new(&exe)
            .args(["--exact", &name, "--test-threads=1", "--nocapture"])
            .env(CHILD, "1")
            .env("TMPDIR", "/tmp")
            .uid(65534)
            .gid(65534)
            .status();
        match status {
            Ok(s) => assert!(s.success(), "unprivileged run of {name} failed: {s}"),
            Err(e) => eprintln!(
                "note: running as root and cannot re-run as nobody ({e}); permission bits do \
                 not apply to root, so only success was checked"
            ),
        }
    }

    #[test]
    fn path_forms_are_joined_without_normalisation() {
        let d = tmp();
        let root = d.path();
        write(root, "sub/a.txt", "alpha");
        let r = p(root);
        for (path, expected) in [
            ("./sub", format!("{r}/./sub/a.txt")),
            ("sub/", format!("{r}/sub/a.txt")),
            ("sub", format!("{r}/sub/a.txt")),
            ("sub/../sub", format!("{r}/sub/../sub/a.txt")),
            ("./sub/a.txt", format!("{r}/./sub/a.txt")),
        ] {
            let a = GrepFilesArgs {
                path: Some(path.into()),
                ..args("alpha")
            };
            assert_eq!(
                grep_files(root, &a).unwrap().model_text(),
                expected,
                "{path}"
            );
        }
        // No path: the cwd.
        assert_eq!(
            grep_files(root, &args("alpha")).unwrap().model_text(),
            format!("{r}/sub/a.txt")
        );
    }

    #[test]
    fn symlinks_are_not_followed_below_the_root() {
        let d = tmp();
        let root = d.path();
        let real = write(root, "real/a.txt", "alpha");
        symlink(root.join("real"), root.join("dirlink")).unwrap();
        symlink(&real, root.join("filelink.txt")).unwrap();
        let out = grep_files(root, &with_path("alpha", root)).unwrap();
        assert_eq!(out.model_text(), p(&real));
        // A symlink named as the root is followed.
        let out = grep_files(root, &with_path("alpha", &root.join("dirlink"))).unwrap();
        assert_eq!(out.model_text(), format!("{}/dirlink/a.txt", p(root)));
        let out = grep_files(root, &with_path("alpha", &root.join("filelink.txt"))).unwrap();
        assert_eq!(out.model_text(), format!("{}/filelink.txt", p(root)));
    }

    #[test]
    fn non_utf8_names_are_skipped_and_not_counted() {
        let d = tmp();
        let root = d.path();
        let bad = root.join(OsStr::from_bytes(b"bad\xff.txt"));
        fs::write(&bad, "alpha").unwrap();
        set_mtime(&bad, 9_000);
        let good = write(root, "good.txt", "alpha");
        set_mtime(&good, 1_000);
        let a = GrepFilesArgs {
            limit: Some(1),
            ..with_path("alpha", root)
        };
        let out = grep_files(root, &a).unwrap();
        assert_eq!(out.model_text(), p(&good));
        assert!(!out.truncated);
    }

    #[test]
    fn non_utf8_content() {
        let d = tmp();
        let root = d.path();
        let f = write(root, "latin1.txt", b"caf\xe9 \xc3\x28 alpha\n");
        write(root, "other.txt", "beta\n");
        assert_eq!(
            grep_files(root, &with_path("alpha", root))
                .unwrap()
                .model_text(),
            p(&f)
        );
        assert_eq!(
            grep_files(root, &with_path(r"(?-u:\xe9)", root))
                .unwrap()
                .model_text(),
            p(&f)
        );
        // Unicode classes still work on valid text.
        let u = write(root, "u.txt", "naïve Ωmega\n");
        assert_eq!(
            grep_files(root, &with_path(r"\p{Greek}mega", root))
                .unwrap()
                .model_text(),
            p(&u)
        );
    }

    #[test]
    fn matches_are_line_by_line_and_case_sensitive() {
        let d = tmp();
        let root = d.path();
        let one = write(root, "one.txt", "foo\nbar\n");
        write(root, "two.txt", "FOO\n");
        assert_eq!(
            grep_files(root, &with_path("^bar$", root))
                .unwrap()
                .model_text(),
            p(&one)
        );
        assert_eq!(
            grep_files(root, &with_path("foo.bar", root))
                .unwrap()
                .model_text(),
            "No matches found."
        );
        assert_eq!(
            grep_files(root, &with_path("foo", root))
                .unwrap()
                .model_text(),
            p(&one)
        );
        // A pattern starting with a dash is a pattern, not a flag.
        let dash = write(root, "dash.txt", "x --foo y\n");
        assert_eq!(
            grep_files(root, &with_path("--foo", root))
                .unwrap()
                .model_text(),
            p(&dash)
        );
    }

    #[test]
    fn arguments_parse_with_serde() {
        let a: GrepFilesArgs =
            serde_json::from_str(r#"{"pattern":"x","limit":3,"extra":true}"#).unwrap();
        assert_eq!(a.pattern, "x");
        assert_eq!(a.limit, Some(3));
        assert!(a.include.is_none() && a.path.is_none());
        assert!(serde_json::from_str::<GrepFilesArgs>(r#"{"limit":3}"#).is_err());
        assert!(serde_json::from_str::<GrepFilesArgs>(r#"{"pattern":"x","limit":-1}"#).is_err());
    }

    #[test]
    fn timeout() {
        assert_eq!(
            timeout_message(COMMAND_TIMEOUT),
            "rg timed out after 30 seconds"
        );
        assert_eq!(
            timeout_message(Duration::from_millis(200)),
            "rg timed out after 0.2 seconds"
        );
        // A FIFO named by `path` blocks in open() until a writer appears.
        let d = tmp();
        let fifo = d.path().join("fifo");
        let ok = Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("note: mkfifo unavailable; timeout path not exercised");
            return;
        }
        let e = grep_files_with_timeout(
            d.path(),
            &with_path("alpha", &fifo),
            Duration::from_millis(200),
        )
        .expect_err("must time out");
        assert_eq!(e.kind, ErrorKind::DeadlineExceeded);
        assert_eq!(e.message, "rg timed out after 0.2 seconds");
        // Release the blocked search thread.
        drop(File::options().write(true).open(&fifo));
    }

    // ---------------------------------------------------------------------------------------
    // §4.6 test 19: differential test against ripgrep >= 14.

    /// An `rg` >= 14 from `$CORRAL_RG` or `PATH`.
    fn find_rg() -> Option<PathBuf> {
        let candidates: Vec<PathBuf> = match std::env::var_os("CORRAL_RG") {
            Some(rg) => vec![PathBuf::from(rg)],
            None => std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|dir| dir.join("rg"))
                .filter(|p| p.is_file())
                .collect(),
        };
        for rg in candidates {
            let Ok(out) = Command::new(&rg).arg("--version").output() else {
                continue;
            };
            let text = String::from_utf8_lossy(&out.stdout);
            let major = text
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.split('.').next())
                .and_then(|m| m.parse::<u32>().ok());
            match major {
                Some(m) if m >= 14 => return Some(rg),
                _ => eprintln!(
                    "note: {} is `{}`, need ripgrep >= 14",
                    rg.display(),
                    text.trim()
                ),
            }
        }
        None
    }

    /// Runs Codex's command line; returns the UTF-8 lines of its output.
    fn rg_lines(
        rg: &Path,
        cwd: &Path,
        pattern: &str,
        include: Option<&str>,
        path: &Path,
    ) -> Vec<String> {
        let mut cmd = Command::new(rg);
        cmd.current_dir(cwd)
            .env_remove("RIPGREP_CONFIG_PATH")
            .args([
                "--files-with-matches",
                "--sortr=modified",
                "--regexp",
                pattern,
                "--no-messages",
            ]);
        if let Some(glob) = include {
            cmd.args(["--glob", glob]);
        }
        cmd.arg("--").arg(path);
        let out = cmd.output().expect("run rg");
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "rg failed for {pattern:?} {include:?} {path:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| std::str::from_utf8(l).ok().map(str::to_string))
            .collect()
    }

    /// A small deterministic generator (xorshift), so trees are reproducible.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len() as u64) as usize]
        }
    }

    /// Builds a tree with nested ignore files (with negations), hidden entries, binary files,
    /// symlinks, a non-UTF-8 name and distinct mtimes. Returns the files written.
    fn generate_tree(root: &Path, seed: u64, git: bool) -> Vec<PathBuf> {
        let mut rng = Rng(seed);
        let dirs = [
            "",
            "d1",
            "d1/sub",
            "d1/sub/deep",
            "d2",
            "d2/build",
            ".hd",
            "d2/.hd2",
            "keep",
            "d1/node",
            "x.txt",
            "d3/deep",
        ];
        let stems = ["a", "b", "keep", "ign", "main", "lib", ".dot", "Err", "k"];
        let exts = ["txt", "rs", "md", "dat", "log", "ts"];
        let words = [
            "alpha",
            "beta",
            "gamma",
            "IoError",
            "ParseError here",
            "x",
            "xx",
            "héllo",
            "Ωmega",
            "",
            "ALPHA",
            "a b",
            "foo bar",
            "alphabet",
        ];
        let mut files = Vec::new();
        if git {
            fs::create_dir_all(root.join(".git/info")).unwrap();
            fs::write(root.join(".git/info/exclude"), "*.log\n!keep.log\n").unwrap();
        }
        for dir in dirs {
            fs::create_dir_all(root.join(dir)).unwrap();
            for _ in 0..(3 + rng.below(6)) {
                let name = format!("{}{}.{}", rng.pick(&stems), rng.below(4), rng.pick(&exts));
                let path = root.join(dir).join(name);
                let mut content = Vec::new();
                for _ in 0..rng.below(6) {
                    content.extend_from_slice(rng.pick(&words).as_bytes());
                    content.push(b'\n');
                }
                match rng.below(10) {
                    // NUL in the first buffer: skipped when walked.
                    0 => content.extend_from_slice(b"a\0b\n"),
                    // NUL beyond the first 64 KiB buffer: a match in an earlier buffer counts,
                    // one in the NUL's buffer does not. Lines stay short: a line longer than
                    // the buffer grows rg's reused buffer and makes its answer for later files
                    // depend on search order (see `FreshSearcher`).
                    1 => {
                        for _ in 0..2_000 {
                            content.extend_from_slice(b"yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\n");
                        }
                        content.extend_from_slice(rng.pick(&["alpha\n", "gamma\n"]).as_bytes());
                        content.extend_from_slice(b"\0\n");
                    }
                    // Invalid UTF-8.
                    2 => content.extend_from_slice(b"caf\xe9 alpha\n"),
                    // No trailing newline.
                    3 => content.extend_from_slice(b"gamma"),
                    _ => {}
                }
                fs::write(&path, &content).unwrap();
                files.push(path);
            }
        }
        let ignore_files: [(&str, &str); 6] = [
            (".gitignore", "*.md\n!keep*.md\nbuild/\n/d3\n"),
            ("d1/.gitignore", "ign*\n!ign1.txt\nsub/deep/\n"),
            ("d1/sub/.ignore", "*.rs\n!main*.rs\n"),
            (".rgignore", "node/\n*.ts\n!lib0.ts\n"),
            ("d2/.ignore", "a*\n"),
            ("keep/.gitignore", "*\n!*.txt\n"),
        ];
        for (rel, content) in ignore_files {
            fs::write(root.join(rel), content).unwrap();
        }
        symlink(root.join("d1"), root.join("link_dir")).unwrap();
        symlink(&files[0], root.join("link_file.txt")).unwrap();
        symlink(root.join("missing"), root.join("dangling.txt")).unwrap();
        let bad = root.join(OsStr::from_bytes(b"bad\xffname.txt"));
        fs::write(&bad, "alpha\n").unwrap();
        files.push(bad);
        // Distinct mtimes, in an order unrelated to names.
        let mut order: Vec<usize> = (0..files.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for (rank, &i) in order.iter().enumerate() {
            set_mtime(&files[i], 1_600_000_000 + 17 * rank as u64);
        }
        files
    }

    #[test]
    fn differential_against_ripgrep() {
        let Some(rg) = find_rg() else {
            eprintln!(
                "note: skipping the rg differential test: no ripgrep >= 14 on PATH or in \
                 $CORRAL_RG (install with `cargo install --locked ripgrep`)"
            );
            return;
        };
        let patterns = [
            "alpha",
            r"[A-Z][a-z]+Error\b",
            "^x+$",
            "héllo",
            "(?i)alpha",
            "a.b",
            r"\bbeta\b|gamma",
            "^$",
            r"(?-u:\xe9)",
            r"\p{Greek}",
        ];
        let globs = [
            None,
            Some("*.rs"),
            Some("*.{txt,md}"),
            Some("!*.txt"),
            Some("d1/**"),
            Some(".*"),
            Some("*"),
            Some("d1/*.txt"),
            Some("*.log"),
            Some("**/deep/*"),
        ];
        let mut cases = 0;
        let mut nonempty = 0;
        for (seed, git) in [
            (0x9e37_79b9_7f4a_7c15_u64, false),
            (0xdead_beef_cafe_f00d, true),
            (12345, true),
        ] {
            let d = tmp();
            let root = d.path().join("tree");
            fs::create_dir(&root).unwrap();
            let files = generate_tree(&root, seed, git);
            if std::env::var_os("CORRAL_GREP_KEEP_TREES").is_some() {
                eprintln!("keeping {}", d.keep().display());
            }
            let explicit = files
                .iter()
                .find(|f| fs::read(f).unwrap().contains(&0))
                .cloned()
                .unwrap_or_else(|| files[1].clone());
            let paths: Vec<Option<PathBuf>> = vec![
                None,
                Some("d1".into()),
                Some("./d1".into()),
                Some("d1/".into()),
                Some("link_dir".into()),
                Some(explicit.strip_prefix(&root).unwrap().to_path_buf()),
                Some(root.join("d2")),
            ];
            for pattern in patterns {
                for glob in globs {
                    for path in &paths {
                        let search_path = match path {
                            Some(p) => root.join(p),
                            None => root.clone(),
                        };
                        let expected = rg_lines(&rg, &root, pattern, glob, &search_path);
                        let a = GrepFilesArgs {
                            pattern: pattern.to_string(),
                            include: glob.map(str::to_string),
                            path: path.as_ref().map(|p| p.to_str().unwrap().to_string()),
                            limit: Some(MAX_LIMIT),
                        };
                        let out = grep_files(&root, &a).unwrap();
                        let got = lines(&out);
                        assert_eq!(
                            got, expected,
                            "pattern {pattern:?} glob {glob:?} path {path:?} (git: {git})"
                        );
                        cases += 1;
                        nonempty += usize::from(!got.is_empty());
                    }
                }
            }
        }
        eprintln!(
            "rg differential: {cases} cases identical, {nonempty} with matches ({})",
            rg.display()
        );
        assert!(
            nonempty > cases / 3,
            "the generated trees should mostly match"
        );
    }
}
