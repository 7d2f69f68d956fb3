//! The `list_dir` tool (spec/tools.md §3): a breadth-first listing of a directory tree to a given
//! depth, sorted globally by relative path and paged with `offset`/`limit`.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::shell::pinned_cwd::fs_path;
use super::{ToolError, resolve_path, truncate_to_char_boundary};

/// Longest relative path (sort key) or name shown, in bytes, cut at a character boundary.
pub const MAX_ENTRY_LENGTH: usize = 500;
pub const INDENTATION_SPACES: usize = 2;
pub const DEFAULT_OFFSET: usize = 1;
pub const DEFAULT_LIMIT: usize = 25;
pub const DEFAULT_DEPTH: usize = 2;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ListDirArgs {
    pub dir_path: String,
    #[serde(default)]
    pub offset: Option<usize>,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub depth: Option<usize>,
}

/// The entry's own type; symlinks are never followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    /// FIFO, socket, device.
    Other,
}

impl EntryKind {
    pub fn suffix(self) -> &'static str {
        match self {
            EntryKind::File => "",
            EntryKind::Directory => "/",
            EntryKind::Symlink => "@",
            EntryKind::Other => "?",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntryLine {
    /// `/`-separated path relative to the listed directory, lossy UTF-8, cut to
    /// `MAX_ENTRY_LENGTH` bytes; this is the sort key.
    pub relative_path: String,
    /// Final component, lossy UTF-8, cut to `MAX_ENTRY_LENGTH` bytes.
    pub name: String,
    /// Number of parent components (the line is indented by `2 × depth` spaces).
    pub depth: usize,
    pub kind: EntryKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListDirOutput {
    /// `dir_path` as resolved against the session cwd.
    pub absolute_path: PathBuf,
    /// The entries on this page.
    pub entries: Vec<DirEntryLine>,
    /// Entries remain after this page (the `More than N entries found` trailer).
    pub more_entries: bool,
}

impl ListDirOutput {
    pub fn model_text(&self) -> String {
        let mut lines = Vec::with_capacity(self.entries.len() + 2);
        lines.push(format!("Absolute path: {}", self.absolute_path.display()));
        for e in &self.entries {
            lines.push(format!(
                "{}{}{}",
                " ".repeat(e.depth * INDENTATION_SPACES),
                e.name,
                e.kind.suffix()
            ));
        }
        if self.more_entries {
            lines.push(format!("More than {} entries found", self.entries.len()));
        }
        lines.join("\n")
    }
}

pub fn list_dir(cwd: &Path, args: &ListDirArgs) -> Result<ListDirOutput, ToolError> {
    let offset = args.offset.unwrap_or(DEFAULT_OFFSET);
    if offset == 0 {
        return Err(ToolError::invalid("offset must be a 1-indexed entry number").on("offset"));
    }
    let limit = args.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 {
        return Err(ToolError::invalid("limit must be greater than zero").on("limit"));
    }
    let depth = args.depth.unwrap_or(DEFAULT_DEPTH);
    if depth == 0 {
        return Err(ToolError::invalid("depth must be greater than zero").on("depth"));
    }
    let absolute_path = resolve_path(cwd, &args.dir_path);

    // Walked from the pinned working directory when it lies there (H24); entries are named
    // relative to it, so nothing shown changes.
    let mut all = collect_entries(&fs_path(&absolute_path), depth)?;
    if all.is_empty() {
        // An empty listing is not an offset error, whatever the offset.
        return Ok(ListDirOutput {
            absolute_path,
            entries: Vec::new(),
            more_entries: false,
        });
    }
    // Stable sort: entries whose cut keys tie keep their traversal order.
    all.sort_by(|a, b| a.relative_path.cmp(&b.relative_path));

    let start = offset - 1;
    if start >= all.len() {
        return Err(ToolError::invalid("offset exceeds directory entry count").on("offset"));
    }
    let end = start + limit.min(all.len() - start);
    let more_entries = end < all.len();
    all.truncate(end);
    all.drain(..start);
    Ok(ListDirOutput {
        absolute_path,
        entries: all,
        more_entries,
    })
}

fn dir_error(err: &std::io::Error) -> ToolError {
    ToolError::io("failed to read directory: ", err)
}

fn cut(s: &str) -> String {
    truncate_to_char_boundary(s, MAX_ENTRY_LENGTH).to_string()
}

/// The display form of the entry `name` found under the relative directory `prefix`.
fn entry_line(prefix: &Path, name: &OsStr, kind: EntryKind) -> DirEntryLine {
    DirEntryLine {
        relative_path: cut(&prefix.join(name).to_string_lossy()),
        name: cut(&name.to_string_lossy()),
        depth: prefix.components().count(),
        kind,
    }
}

/// Breadth-first walk to `max_depth` levels. Traversal uses the raw `OsString` names so
/// directories whose names are not UTF-8 are still descended into.
fn collect_entries(root: &Path, max_depth: usize) -> Result<Vec<DirEntryLine>, ToolError> {
    struct Child {
        name: OsString,
        relative: PathBuf,
        line: DirEntryLine,
    }

    let mut out = Vec::new();
    let mut queue: VecDeque<(PathBuf, PathBuf, usize)> = VecDeque::new();
    queue.push_back((root.to_path_buf(), PathBuf::new(), max_depth));

    while let Some((dir, prefix, remaining)) = queue.pop_front() {
        let mut children = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| dir_error(&e))? {
            let entry = entry.map_err(|e| dir_error(&e))?;
            // DirEntry::file_type does not follow symlinks.
            let ft = entry.file_type().map_err(|e| dir_error(&e))?;
            let kind = if ft.is_symlink() {
                EntryKind::Symlink
            } else if ft.is_dir() {
                EntryKind::Directory
            } else if ft.is_file() {
                EntryKind::File
            } else {
                EntryKind::Other
            };
            let name = entry.file_name();
            let relative = prefix.join(&name);
            children.push(Child {
                line: entry_line(&prefix, &name, kind),
                name,
                relative,
            });
        }
        children.sort_by(|a, b| a.line.relative_path.cmp(&b.line.relative_path));
        for child in children {
            if child.line.kind == EntryKind::Directory && remaining > 1 {
                queue.push_back((dir.join(&child.name), child.relative, remaining - 1));
            }
            out.push(child.line);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ErrorKind;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::symlink;
    use tempfile::TempDir;

    fn args(offset: Option<usize>, limit: Option<usize>, depth: Option<usize>) -> ListDirArgs {
        ListDirArgs {
            dir_path: String::new(),
            offset,
            limit,
            depth,
        }
    }

    /// Lists `dir` and returns the lines after the header.
    fn listing(dir: &Path, a: ListDirArgs) -> Vec<String> {
        let a = ListDirArgs {
            dir_path: dir.to_str().unwrap().to_string(),
            ..a
        };
        let text = list_dir(Path::new("/"), &a).unwrap().model_text();
        let mut lines = text.split('\n').map(str::to_string);
        assert_eq!(
            lines.next().unwrap(),
            format!("Absolute path: {}", dir.display())
        );
        lines.collect()
    }

    fn touch(p: &Path) {
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(p, b"x").unwrap();
    }

    fn layout3() -> TempDir {
        let d = TempDir::new().unwrap();
        touch(&d.path().join("root.txt"));
        touch(&d.path().join("nested/child.txt"));
        touch(&d.path().join("nested/deeper/grandchild.txt"));
        d
    }

    // §3.6 test 1
    #[test]
    fn lists_files_symlinks_and_nesting() {
        let d = TempDir::new().unwrap();
        touch(&d.path().join("entry.txt"));
        symlink(d.path().join("entry.txt"), d.path().join("link")).unwrap();
        touch(&d.path().join("nested/child.txt"));
        touch(&d.path().join("nested/deeper/grandchild.txt"));
        assert_eq!(
            listing(d.path(), args(Some(1), Some(20), Some(3))),
            [
                "entry.txt",
                "link@",
                "nested/",
                "  child.txt",
                "  deeper/",
                "    grandchild.txt"
            ]
        );
    }

    // test 2
    #[test]
    fn offset_past_end() {
        let d = TempDir::new().unwrap();
        fs::create_dir(d.path().join("nested")).unwrap();
        let a = ListDirArgs {
            dir_path: d.path().to_str().unwrap().into(),
            ..args(Some(10), Some(1), Some(2))
        };
        let err = list_dir(Path::new("/"), &a).unwrap_err();
        assert_eq!(err.message, "offset exceeds directory entry count");
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
    }

    // test 3
    #[test]
    fn depth_controls_recursion() {
        let d = layout3();
        assert_eq!(
            listing(d.path(), args(None, None, Some(1))),
            ["nested/", "root.txt"]
        );
        assert_eq!(
            listing(d.path(), args(None, None, Some(2))),
            ["nested/", "  child.txt", "  deeper/", "root.txt"]
        );
        assert_eq!(
            listing(d.path(), args(None, None, Some(3))),
            [
                "nested/",
                "  child.txt",
                "  deeper/",
                "    grandchild.txt",
                "root.txt"
            ]
        );
    }

    // test 4
    #[test]
    fn paging_with_trailer() {
        let d = TempDir::new().unwrap();
        touch(&d.path().join("a/a_child.txt"));
        touch(&d.path().join("b/b_child.txt"));
        assert_eq!(
            listing(d.path(), args(Some(1), Some(2), Some(2))),
            ["a/", "  a_child.txt", "More than 2 entries found"]
        );
        assert_eq!(
            listing(d.path(), args(Some(3), Some(2), Some(2))),
            ["b/", "  b_child.txt"]
        );
    }

    // test 5
    #[test]
    fn huge_limit_does_not_overflow() {
        let d = TempDir::new().unwrap();
        for n in ["alpha.txt", "beta.txt", "gamma.txt"] {
            touch(&d.path().join(n));
        }
        assert_eq!(
            listing(d.path(), args(Some(2), Some(usize::MAX), Some(1))),
            ["beta.txt", "gamma.txt"]
        );
    }

    // test 6
    #[test]
    fn default_limit_is_25() {
        let d = TempDir::new().unwrap();
        for i in 0..40 {
            touch(&d.path().join(format!("file_{i:02}.txt")));
        }
        let lines = listing(d.path(), args(None, Some(25), Some(1)));
        assert_eq!(lines.len(), 26);
        assert_eq!(lines[0], "file_00.txt");
        assert_eq!(lines[24], "file_24.txt");
        assert_eq!(lines[25], "More than 25 entries found");
        assert_eq!(listing(d.path(), args(None, None, None)).len(), 26);
    }

    // test 7
    #[test]
    fn global_sort_before_paging() {
        let d = layout3();
        assert_eq!(
            listing(d.path(), args(None, Some(3), Some(3))),
            [
                "nested/",
                "  child.txt",
                "  deeper/",
                "More than 3 entries found"
            ]
        );
    }

    // test 8
    #[test]
    fn validation_errors() {
        let cases = [
            (
                args(Some(0), None, None),
                "offset must be a 1-indexed entry number",
            ),
            (args(None, Some(0), None), "limit must be greater than zero"),
            (args(None, None, Some(0)), "depth must be greater than zero"),
        ];
        for (a, msg) in cases {
            let a = ListDirArgs {
                dir_path: "/d".into(),
                ..a
            };
            let err = list_dir(Path::new("/"), &a).unwrap_err();
            assert_eq!(err.message, msg);
            assert_eq!(err.kind, ErrorKind::InvalidArgument);
        }
        // Validation order: offset before limit before depth.
        let a = ListDirArgs {
            dir_path: "/d".into(),
            ..args(Some(0), Some(0), Some(0))
        };
        assert_eq!(
            list_dir(Path::new("/"), &a).unwrap_err().message,
            "offset must be a 1-indexed entry number"
        );
    }

    // test 9
    #[test]
    fn relative_path_resolves_against_cwd() {
        let d = TempDir::new().unwrap();
        touch(&d.path().join("sub/file.txt"));
        let a = ListDirArgs {
            dir_path: "sub".into(),
            ..Default::default()
        };
        let out = list_dir(d.path(), &a).unwrap();
        assert_eq!(out.absolute_path, d.path().join("sub"));
        assert_eq!(
            out.model_text(),
            format!("Absolute path: {}/sub\nfile.txt", d.path().display())
        );
    }

    // test 10
    #[test]
    fn io_errors() {
        let d = TempDir::new().unwrap();
        let a = ListDirArgs {
            dir_path: "missing".into(),
            ..Default::default()
        };
        let err = list_dir(d.path(), &a).unwrap_err();
        assert_eq!(
            err.message,
            "failed to read directory: No such file or directory (os error 2)"
        );
        assert_eq!(err.kind, ErrorKind::NotFound);

        touch(&d.path().join("plain.txt"));
        let a = ListDirArgs {
            dir_path: "plain.txt".into(),
            ..Default::default()
        };
        let err = list_dir(d.path(), &a).unwrap_err();
        assert_eq!(
            err.message,
            "failed to read directory: Not a directory (os error 20)"
        );
        assert_eq!(err.kind, ErrorKind::FailedPrecondition);
    }

    // test 11
    #[test]
    fn empty_directory_with_offset_is_header_only() {
        let d = TempDir::new().unwrap();
        let a = ListDirArgs {
            dir_path: d.path().to_str().unwrap().into(),
            offset: Some(5),
            ..Default::default()
        };
        let out = list_dir(Path::new("/"), &a).unwrap();
        assert_eq!(
            out.model_text(),
            format!("Absolute path: {}", d.path().display())
        );
        assert!(!out.more_entries);
    }

    // test 12
    #[test]
    fn full_path_sort_separates_children() {
        let d = TempDir::new().unwrap();
        touch(&d.path().join("src/main.rs"));
        touch(&d.path().join("src.rs"));
        assert_eq!(
            listing(d.path(), args(None, None, Some(2))),
            ["src/", "src.rs", "  main.rs"]
        );

        let d = TempDir::new().unwrap();
        touch(&d.path().join("a/y"));
        touch(&d.path().join("a-b/x"));
        assert_eq!(
            listing(d.path(), args(None, None, None)),
            ["a/", "a-b/", "  x", "  y"]
        );
    }

    // test 13
    #[test]
    fn byte_order_puts_uppercase_first() {
        let d = TempDir::new().unwrap();
        touch(&d.path().join("B.txt"));
        fs::create_dir(d.path().join("a")).unwrap();
        assert_eq!(listing(d.path(), args(None, None, None)), ["B.txt", "a/"]);
    }

    // test 14
    #[test]
    fn symlinked_directory_is_not_followed() {
        let d = TempDir::new().unwrap();
        touch(&d.path().join("real/inside.txt"));
        symlink(d.path().join("real"), d.path().join("alias")).unwrap();
        assert_eq!(
            listing(d.path(), args(None, None, Some(3))),
            ["alias@", "real/", "  inside.txt"]
        );
    }

    // test 15
    #[test]
    fn fifo_is_other() {
        let d = TempDir::new().unwrap();
        let fifo = d.path().join("pipe");
        // mkfifo(1) rather than libc keeps the test free of unsafe code.
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success(), "mkfifo failed");
        let out = list_dir(
            Path::new("/"),
            &ListDirArgs {
                dir_path: d.path().to_str().unwrap().into(),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(out.entries[0].kind, EntryKind::Other);
        assert_eq!(listing(d.path(), args(None, None, None)), ["pipe?"]);
    }

    // test 16
    #[test]
    fn long_names_are_cut() {
        let d = TempDir::new().unwrap();
        // 600 bytes is over NAME_MAX (255) on common filesystems, so nest a directory path to
        // exceed 500 bytes in the relative path, and check the name cut with a multibyte name.
        let name = "é".repeat(127); // 254 bytes, a legal name
        touch(&d.path().join(&name));
        let lines = listing(d.path(), args(None, None, None));
        assert_eq!(lines, [name]);

        // A 600-byte name cannot be created on Linux, so check the display form directly.
        let long = OsString::from(format!("a{}", "é".repeat(300)));
        assert_eq!(long.len(), 601);
        let line = entry_line(Path::new("sub"), &long, EntryKind::File);
        assert_eq!(line.name, format!("a{}", "é".repeat(249)));
        assert_eq!(line.name.len(), 499);
        assert_eq!(line.relative_path, format!("sub/a{}", "é".repeat(247)));
        assert_eq!(line.relative_path.len(), 499);
        assert_eq!(line.depth, 1);
    }

    #[test]
    fn long_relative_paths_are_cut_in_sort_key() {
        let d = TempDir::new().unwrap();
        let seg = "d".repeat(200);
        let deep = d.path().join(&seg).join(&seg).join(&seg);
        fs::create_dir_all(&deep).unwrap();
        touch(&deep.join("leaf"));
        let out = list_dir(
            Path::new("/"),
            &ListDirArgs {
                dir_path: d.path().to_str().unwrap().into(),
                depth: Some(4),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(out.entries.len(), 4);
        for e in &out.entries {
            assert!(e.relative_path.len() <= MAX_ENTRY_LENGTH);
        }
        assert_eq!(out.entries[3].name, "leaf");
        assert_eq!(out.entries[3].depth, 3);
    }

    #[test]
    fn non_utf8_directory_is_listed_and_descended() {
        let d = TempDir::new().unwrap();
        let raw = OsStr::from_bytes(b"bad\xFFdir");
        let dir = d.path().join(raw);
        if fs::create_dir(&dir).is_err() {
            // Some filesystems reject non-UTF-8 names; nothing to test there.
            return;
        }
        touch(&dir.join("inner.txt"));
        assert_eq!(
            listing(d.path(), args(None, None, None)),
            ["bad\u{FFFD}dir/", "  inner.txt"]
        );
    }

    #[test]
    fn args_parse_with_serde() {
        let a: ListDirArgs =
            serde_json::from_str(r#"{"dir_path":"/d","environment_id":"x","depth":3}"#).unwrap();
        assert_eq!(
            a,
            ListDirArgs {
                dir_path: "/d".into(),
                depth: Some(3),
                ..Default::default()
            }
        );
        assert!(serde_json::from_str::<ListDirArgs>(r#"{"dir_path":"/d","limit":-1}"#).is_err());
    }
}
