//! The scenario fixtures (spec/tools.md §5.11) and acceptance tests (§5.12), each asserting the
//! whole final tree byte for byte (with modes) and the exact model text; plus fault-injection
//! tests of the commit's rollback.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use super::fault;
use super::*;

/// One entry of a tree snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(Vec<u8>, u32),
    Dir(u32),
    Link(PathBuf),
    Special,
}

struct Ws {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Ws {
    fn new(files: &[(&str, &str)]) -> Ws {
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        for (path, content) in files {
            let p = root.join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, content).unwrap();
        }
        Ws { _dir: dir, root }
    }

    fn ctx(&self) -> PatchContext {
        PatchContext {
            cwd: self.root.clone(),
            writable_roots: vec![self.root.clone()],
            read_only: false,
            protected_names: vec![".git".into(), ".codex".into(), ".agents".into()],
            protected_paths: vec![],
        }
    }

    fn abs(&self, p: &str) -> String {
        self.root.join(p).display().to_string()
    }

    fn apply(&self, body: &str) -> Result<ApplyPatchOutput, ToolError> {
        apply_patch(&wrap(body), &self.ctx())
    }

    fn apply_raw(&self, patch: &str) -> Result<ApplyPatchOutput, ToolError> {
        apply_patch(patch, &self.ctx())
    }

    fn tree(&self) -> BTreeMap<String, Node> {
        let mut out = BTreeMap::new();
        walk(&self.root, &self.root, &mut out);
        out
    }

    /// The files of the tree (path → content), ignoring directories and modes.
    fn files(&self) -> BTreeMap<String, String> {
        self.tree()
            .into_iter()
            .filter_map(|(k, v)| match v {
                Node::File(b, _) => Some((k, String::from_utf8(b).unwrap())),
                _ => None,
            })
            .collect()
    }

    fn read(&self, p: &str) -> String {
        fs::read_to_string(self.root.join(p)).unwrap()
    }
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Node>) {
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let rel = path.strip_prefix(root).unwrap().display().to_string();
        let meta = fs::symlink_metadata(&path).unwrap();
        if meta.file_type().is_symlink() {
            out.insert(rel, Node::Link(fs::read_link(&path).unwrap()));
        } else if meta.is_dir() {
            out.insert(rel, Node::Dir(meta.mode() & 0o7777));
            walk(root, &path, out);
        } else if !meta.is_file() {
            out.insert(rel, Node::Special);
        } else {
            out.insert(
                rel,
                Node::File(fs::read(&path).unwrap(), meta.mode() & 0o7777),
            );
        }
    }
}

/// Sets the exec format's wall time to `0` (it varies with load).
fn norm(text: &str) -> String {
    match text.split_once("\nWall time: ") {
        Some((head, rest)) if head.starts_with("Exit code: ") => {
            let end = rest.find(" seconds\n").unwrap_or(0);
            format!("{head}\nWall time: 0{}", &rest[end..])
        }
        _ => text.to_string(),
    }
}

/// The exec format of a commit-stage failure (exit code 1) after [`norm`].
fn failure(output: &str) -> String {
    format!("Exit code: 1\nWall time: 0 seconds\nOutput:\n{output}")
}

fn wrap(body: &str) -> String {
    format!("*** Begin Patch\n{body}\n*** End Patch")
}

fn files(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The success model text for a summary body.
fn success(lines: &str) -> String {
    format!(
        "Exit code: 0\nWall time: 0 seconds\nOutput:\nSuccess. Updated the following files:\n{lines}"
    )
}

/// Applies `body`, asserts success with `summary_lines`, returns the output.
fn ok(ws: &Ws, body: &str, summary_lines: &str) -> ApplyPatchOutput {
    let out = ws
        .apply(body)
        .unwrap_or_else(|e| panic!("patch failed: {}", e.message));
    assert_eq!(norm(&out.model_text()), success(summary_lines));
    out
}

/// Applies `patch` (complete), asserts failure with `message` and an unchanged tree.
fn fails_unchanged(ws: &Ws, patch: &str, message: &str) -> ToolError {
    let before = ws.tree();
    let err = ws.apply_raw(patch).unwrap_err();
    assert_eq!(norm(&err.message), message);
    assert_eq!(ws.tree(), before, "tree changed");
    err
}

const HEADER_HELP: &str = "Valid hunk headers: '*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'";

// ---- §5.11 scenario fixtures -------------------------------------------------------------

#[test]
fn s001_add_file() {
    let ws = Ws::new(&[]);
    ok(
        &ws,
        "*** Add File: bar.md\n+This is a new file",
        "A bar.md\n",
    );
    assert_eq!(ws.files(), files(&[("bar.md", "This is a new file\n")]));
}

#[test]
fn s002_multiple_operations() {
    let ws = Ws::new(&[("delete.txt", "x\n"), ("modify.txt", "line1\nline2\n")]);
    ok(
        &ws,
        "*** Add File: nested/new.txt\n+created\n*** Delete File: delete.txt\n\
         *** Update File: modify.txt\n@@\n-line2\n+changed",
        "A nested/new.txt\nM modify.txt\nD delete.txt\n",
    );
    assert_eq!(
        ws.files(),
        files(&[
            ("nested/new.txt", "created\n"),
            ("modify.txt", "line1\nchanged\n")
        ])
    );
}

#[test]
fn s003_multiple_chunks() {
    let ws = Ws::new(&[("multi.txt", "line1\nline2\nline3\nline4\n")]);
    ok(
        &ws,
        "*** Update File: multi.txt\n@@\n-line2\n+changed2\n@@\n-line4\n+changed4",
        "M multi.txt\n",
    );
    assert_eq!(
        ws.files(),
        files(&[("multi.txt", "line1\nchanged2\nline3\nchanged4\n")])
    );
}

#[test]
fn s004_move_to_new_directory() {
    let ws = Ws::new(&[
        ("old/name.txt", "old content\n"),
        ("old/other.txt", "other\n"),
    ]);
    let out = ok(
        &ws,
        "*** Update File: old/name.txt\n*** Move to: renamed/dir/name.txt\n@@\n-old content\n+new content",
        "M renamed/dir/name.txt\n",
    );
    assert_eq!(
        ws.files(),
        files(&[
            ("renamed/dir/name.txt", "new content\n"),
            ("old/other.txt", "other\n")
        ])
    );
    assert_eq!(
        out.changes[0].kind,
        FileChangeKind::Moved {
            from: ws.root.join("old/name.txt")
        }
    );
    assert!(!out.changes[0].overwritten);
}

#[test]
fn s005_rejects_empty_patch() {
    let ws = Ws::new(&[("foo.txt", "foo\n")]);
    let err = fails_unchanged(
        &ws,
        "*** Begin Patch\n*** End Patch",
        "patch rejected: empty patch",
    );
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
}

#[test]
fn s006_rejects_missing_context() {
    let ws = Ws::new(&[("modify.txt", "line1\nline2\n")]);
    let err = fails_unchanged(
        &ws,
        &wrap("*** Update File: modify.txt\n@@\n-missing\n+changed"),
        &format!(
            "apply_patch verification failed: Failed to find expected lines in {}:\nmissing",
            ws.abs("modify.txt")
        ),
    );
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
}

#[test]
fn s007_rejects_missing_file_delete() {
    let ws = Ws::new(&[("foo.txt", "foo\n")]);
    fails_unchanged(
        &ws,
        &wrap("*** Delete File: missing.txt"),
        &format!(
            "apply_patch verification failed: Failed to read {}: No such file or directory (os error 2)",
            ws.abs("missing.txt")
        ),
    );
}

#[test]
fn s008_rejects_empty_update_hunk() {
    let ws = Ws::new(&[("foo.txt", "foo\n")]);
    fails_unchanged(
        &ws,
        &wrap("*** Update File: foo.txt"),
        "apply_patch verification failed: invalid hunk at line 2, Update file hunk for path 'foo.txt' is empty",
    );
}

#[test]
fn s009_requires_existing_file_for_update() {
    let ws = Ws::new(&[("foo.txt", "foo\n")]);
    fails_unchanged(
        &ws,
        &wrap("*** Update File: missing.txt\n@@\n-old\n+new"),
        &format!(
            "apply_patch verification failed: Failed to read file to update {}: No such file or directory (os error 2)",
            ws.abs("missing.txt")
        ),
    );
}

#[test]
fn s010_move_overwrites_existing_destination() {
    let ws = Ws::new(&[
        ("old/name.txt", "from\n"),
        ("old/other.txt", "other\n"),
        ("renamed/dir/name.txt", "existing\n"),
    ]);
    let out = ok(
        &ws,
        "*** Update File: old/name.txt\n*** Move to: renamed/dir/name.txt\n@@\n-from\n+new",
        "M renamed/dir/name.txt\n",
    );
    assert_eq!(
        ws.files(),
        files(&[
            ("renamed/dir/name.txt", "new\n"),
            ("old/other.txt", "other\n")
        ])
    );
    assert_eq!(
        out.overwritten_paths(),
        vec![ws.root.join("renamed/dir/name.txt")]
    );
}

#[test]
fn s011_add_overwrites_existing_file() {
    let ws = Ws::new(&[("duplicate.txt", "old content\n")]);
    let out = ok(
        &ws,
        "*** Add File: duplicate.txt\n+new content",
        "A duplicate.txt\n",
    );
    assert_eq!(ws.files(), files(&[("duplicate.txt", "new content\n")]));
    assert_eq!(out.overwritten_paths(), vec![ws.root.join("duplicate.txt")]);
    assert_eq!(
        out.changes[0].unified_diff,
        "@@ -1 +1 @@\n-old content\n+new content\n"
    );
}

#[test]
fn s012_delete_directory_fails() {
    let ws = Ws::new(&[("dir/foo.txt", "foo\n")]);
    fails_unchanged(
        &ws,
        &wrap("*** Delete File: dir"),
        &format!(
            "apply_patch verification failed: Failed to read {}: Is a directory (os error 21)",
            ws.abs("dir")
        ),
    );
}

#[test]
fn s013_rejects_invalid_hunk_header() {
    let ws = Ws::new(&[("foo.txt", "foo\n")]);
    fails_unchanged(
        &ws,
        &wrap("*** Frobnicate File: foo"),
        &format!(
            "apply_patch verification failed: invalid hunk at line 2, '*** Frobnicate File: foo' is not a valid hunk header. {HEADER_HELP}"
        ),
    );
}

#[test]
fn s014_update_file_appends_trailing_newline() {
    let ws = Ws::new(&[("no_newline.txt", "no newline at end")]);
    ok(
        &ws,
        "*** Update File: no_newline.txt\n@@\n-no newline at end\n+first line\n+second line",
        "M no_newline.txt\n",
    );
    assert_eq!(
        ws.files(),
        files(&[("no_newline.txt", "first line\nsecond line\n")])
    );
}

#[test]
fn s015_failure_after_partial_success_changes_nothing() {
    let ws = Ws::new(&[]);
    fails_unchanged(
        &ws,
        &wrap("*** Add File: created.txt\n+hello\n*** Update File: missing.txt\n@@\n-old\n+new"),
        &format!(
            "apply_patch verification failed: Failed to read file to update {}: No such file or directory (os error 2)",
            ws.abs("missing.txt")
        ),
    );
    assert!(ws.tree().is_empty());
}

#[test]
fn s016_pure_addition_update_chunk() {
    let ws = Ws::new(&[("input.txt", "line1\nline2\n")]);
    ok(
        &ws,
        "*** Update File: input.txt\n@@\n+added line 1\n+added line 2",
        "M input.txt\n",
    );
    assert_eq!(
        ws.files(),
        files(&[("input.txt", "line1\nline2\nadded line 1\nadded line 2\n")])
    );
}

#[test]
fn s017_whitespace_padded_hunk_header() {
    let ws = Ws::new(&[("foo.txt", "old\n")]);
    ok(
        &ws,
        "  *** Update File: foo.txt\n@@\n-old\n+new",
        "M foo.txt\n",
    );
    assert_eq!(ws.files(), files(&[("foo.txt", "new\n")]));
}

#[test]
fn s018_whitespace_padded_patch_markers() {
    let ws = Ws::new(&[("file.txt", "one\n")]);
    let out = ws
        .apply_raw(" *** Begin Patch\n*** Update File: file.txt\n@@\n-one\n+two\n*** End Patch \n")
        .unwrap();
    assert_eq!(norm(&out.model_text()), success("M file.txt\n"));
    assert_eq!(ws.files(), files(&[("file.txt", "two\n")]));
}

#[test]
fn s019_unicode_simple() {
    let ws = Ws::new(&[("foo.txt", "line1\nnaïve café\nline3\n")]);
    let out = ws
        .apply_raw(
            "*** Begin Patch\n*** Update File: foo.txt\n@@\n line1\n-naïve café\n+naïve café ✅\n*** End Patch ",
        )
        .unwrap();
    assert_eq!(norm(&out.model_text()), success("M foo.txt\n"));
    assert_eq!(
        ws.files(),
        files(&[("foo.txt", "line1\nnaïve café ✅\nline3\n")])
    );
}

#[test]
fn s020a_delete_file_success() {
    let ws = Ws::new(&[("obsolete.txt", "old\n"), ("keep.txt", "keep\n")]);
    ok(&ws, "*** Delete File: obsolete.txt", "D obsolete.txt\n");
    assert_eq!(ws.files(), files(&[("keep.txt", "keep\n")]));
}

#[test]
fn s020b_whitespace_padded_patch_marker_lines() {
    let ws = Ws::new(&[("file.txt", "one\n")]);
    let out = ws
        .apply_raw("*** Begin Patch \n*** Update File: file.txt\n@@\n-one\n+two\n *** End Patch")
        .unwrap();
    assert_eq!(norm(&out.model_text()), success("M file.txt\n"));
    assert_eq!(ws.files(), files(&[("file.txt", "two\n")]));
}

#[test]
fn s021_update_file_deletion_only() {
    let ws = Ws::new(&[("lines.txt", "line1\nline2\nline3\n")]);
    ok(
        &ws,
        "*** Update File: lines.txt\n@@\n line1\n-line2\n line3",
        "M lines.txt\n",
    );
    assert_eq!(ws.files(), files(&[("lines.txt", "line1\nline3\n")]));
}

#[test]
fn s022_update_file_end_of_file_marker() {
    let ws = Ws::new(&[("tail.txt", "first\nsecond\n")]);
    ok(
        &ws,
        "*** Update File: tail.txt\n@@\n first\n-second\n+second updated\n*** End of File",
        "M tail.txt\n",
    );
    assert_eq!(
        ws.files(),
        files(&[("tail.txt", "first\nsecond updated\n")])
    );
}

// ---- §5.12 acceptance tests --------------------------------------------------------------

/// One file `f` with `initial`, one patch, expected final content and summary.
fn single(initial: &str, body: &str, expected: &str, summary: &str) {
    let ws = Ws::new(&[("f", initial)]);
    ok(&ws, body, summary);
    assert_eq!(ws.files(), files(&[("f", expected)]));
}

#[test]
fn a01_simple_update() {
    single(
        "foo\nbar\n",
        "*** Update File: f\n@@\n foo\n-bar\n+baz",
        "foo\nbaz\n",
        "M f\n",
    );
}

#[test]
fn a02_three_chunks_one_file() {
    single(
        "a\nb\nc\nd\ne\nf\n",
        "*** Update File: f\n@@\n a\n-b\n+B\n@@\n c\n d\n-e\n+E\n@@\n f\n+g\n*** End of File",
        "a\nB\nc\nd\nE\nf\ng\n",
        "M f\n",
    );
}

#[test]
fn a03_pure_addition_goes_to_end() {
    single(
        "line1\nline2\nline3\n",
        "*** Update File: f\n@@\n+after-context\n+second-line\n@@\n line1\n-line2\n-line3\n+line2-replacement",
        "line1\nline2-replacement\nafter-context\nsecond-line\n",
        "M f\n",
    );
}

#[test]
fn a04_unicode_dashes() {
    single(
        "import asyncio  # local import \u{2013} avoids top\u{2011}level dep\n",
        "*** Update File: f\n@@\n-import asyncio  # local import - avoids top-level dep\n+import asyncio  # HELLO",
        "import asyncio  # HELLO\n",
        "M f\n",
    );
}

#[test]
fn a05_reorder() {
    single(
        "a\nb\n",
        "*** Update File: f\n@@\n-a\n-b\n+b\n+b\n+a",
        "b\nb\na\n",
        "M f\n",
    );
}

#[test]
fn a06_move() {
    let ws = Ws::new(&[("src.txt", "line\n")]);
    ok(
        &ws,
        "*** Update File: src.txt\n*** Move to: dst.txt\n@@\n-line\n+line2",
        "M dst.txt\n",
    );
    assert_eq!(ws.files(), files(&[("dst.txt", "line2\n")]));
}

#[test]
fn a07_relative_and_absolute_paths() {
    let ws = Ws::new(&[("upd.txt", "x\n"), ("rel-del.txt", "gone\n")]);
    let abs = ws.root.display().to_string();
    ok(
        &ws,
        &format!(
            "*** Add File: rel-add.txt\n+r\n*** Update File: {abs}/upd.txt\n@@\n-x\n+y\n\
             *** Delete File: rel-del.txt\n*** Add File: {abs}/abs-add.txt\n+a"
        ),
        &format!("A rel-add.txt\nA {abs}/abs-add.txt\nM {abs}/upd.txt\nD rel-del.txt\n"),
    );
    assert_eq!(
        ws.files(),
        files(&[
            ("rel-add.txt", "r\n"),
            ("upd.txt", "y\n"),
            ("abs-add.txt", "a\n")
        ])
    );
}

#[test]
fn a08_heredoc_wrapping() {
    let inner = "*** Begin Patch\n*** Add File: foo\n+hi\n*** End Patch";
    for open in ["<<EOF", "<<'EOF'", "<<\"EOF\""] {
        let ws = Ws::new(&[]);
        let out = ws.apply_raw(&format!("{open}\n{inner}\nEOF")).unwrap();
        assert_eq!(norm(&out.model_text()), success("A foo\n"));
        assert_eq!(ws.files(), files(&[("foo", "hi\n")]));
    }
    let ws = Ws::new(&[]);
    fails_unchanged(
        &ws,
        &format!("<<\"EOF'\n{inner}\nEOF"),
        "apply_patch verification failed: invalid patch: The first line of the patch must be '*** Begin Patch'",
    );
    fails_unchanged(
        &ws,
        "<<EOF\n*** Begin Patch\n*** Update File: file2.py\nEOF\n",
        "apply_patch verification failed: invalid patch: The last line of the patch must be '*** End Patch'",
    );
}

#[test]
fn a09_trim_pass() {
    single(
        "    foo   \n",
        "*** Update File: f\n@@\n-foo\n+bar",
        "bar\n",
        "M f\n",
    );
}

#[test]
fn a10_exact_beats_earlier_fuzzy() {
    single(
        "foo \nx\nfoo\n",
        "*** Update File: f\n@@\n-foo\n+BAR",
        "foo \nx\nBAR\n",
        "M f\n",
    );
}

#[test]
fn a11_context_keeps_file_spelling() {
    // Newest Codex (PreserveLineEndings) leaves context lines untouched; older Codex rewrote
    // them in the patch's spelling.
    single(
        "  a\nb\n",
        "*** Update File: f\n@@\n a\n-b\n+B",
        "  a\nB\n",
        "M f\n",
    );
}

#[test]
fn a12_forward_only() {
    let ws = Ws::new(&[("f", "a\nb\nc\n")]);
    fails_unchanged(
        &ws,
        &wrap("*** Update File: f\n@@\n-c\n+C\n@@\n-a\n+A"),
        &format!(
            "apply_patch verification failed: Failed to find expected lines in {}:\na",
            ws.abs("f")
        ),
    );
}

#[test]
fn a13_end_of_file_marker() {
    single(
        "x\nneedle\ny\nneedle\n",
        "*** Update File: f\n@@\n-needle\n+EOF\n*** End of File",
        "x\nneedle\ny\nEOF\n",
        "M f\n",
    );
    single(
        "x\nneedle\ny\nneedle\n",
        "*** Update File: f\n@@\n-needle\n+FIRST",
        "x\nFIRST\ny\nneedle\n",
        "M f\n",
    );
}

#[test]
fn a14_end_of_file_no_fallback() {
    let ws = Ws::new(&[("f", "a\nb\nc\n")]);
    fails_unchanged(
        &ws,
        &wrap("*** Update File: f\n@@\n-b\n+B\n*** End of File"),
        &format!(
            "apply_patch verification failed: Failed to find expected lines in {}:\nb",
            ws.abs("f")
        ),
    );
}

#[test]
fn a15_unicode_quotes() {
    single(
        "x = \u{201C}hi\u{201D}\n",
        "*** Update File: f\n@@\n-x = \"hi\"\n+x = 1",
        "x = 1\n",
        "M f\n",
    );
}

#[test]
fn a16_unified_diff_header_is_context() {
    let ws = Ws::new(&[("f", "a\nb\n")]);
    fails_unchanged(
        &ws,
        &wrap("*** Update File: f\n@@ -1,2 +1,2 @@\n-a\n+A"),
        &format!(
            "apply_patch verification failed: Failed to find context '-1,2 +1,2 @@' in {}",
            ws.abs("f")
        ),
    );
}

#[test]
fn a17_invalid_hunk_header_line_3() {
    let ws = Ws::new(&[]);
    fails_unchanged(
        &ws,
        &wrap("*** Add File: x\nhello"),
        &format!(
            "apply_patch verification failed: invalid hunk at line 3, 'hello' is not a valid hunk header. {HEADER_HELP}"
        ),
    );
    let err = parse_patch(&wrap("*** Add File: x\nhello")).unwrap_err();
    assert_eq!(
        err.cli_message(),
        format!("Invalid patch hunk on line 3: 'hello' is not a valid hunk header. {HEADER_HELP}")
    );
}

#[test]
fn a18_add_empty_file() {
    let ws = Ws::new(&[]);
    ok(&ws, "*** Add File: empty.txt", "A empty.txt\n");
    assert_eq!(ws.files(), files(&[("empty.txt", "")]));
}

#[test]
fn a19_crlf_preserved() {
    single(
        "a\r\nb\r\n",
        "*** Update File: f\n@@\n-a\n+A",
        "A\r\nb\r\n",
        "M f\n",
    );
}

#[test]
fn a20_second_hunk_mismatch_leaves_first_file() {
    let ws = Ws::new(&[("one", "1\n"), ("two", "2\n")]);
    let before = ws.tree();
    let err = ws
        .apply("*** Update File: one\n@@\n-1\n+uno\n*** Update File: two\n@@\n-nope\n+dos")
        .unwrap_err();
    assert!(
        err.message
            .starts_with("apply_patch verification failed: Failed to find expected lines in /"),
        "{}",
        err.message
    );
    assert_eq!(ws.tree(), before);
}

#[test]
fn a21_mixed_line_endings() {
    single(
        "a\r\nb\nc\r\n",
        "*** Update File: f\n@@\n-b\n+B",
        "a\r\nB\r\nc\r\n",
        "M f\n",
    );
    single(
        "a\r\nb",
        "*** Update File: f\n@@\n-b\n+B",
        "a\r\nB\r\n",
        "M f\n",
    );
}

#[test]
fn a22_add_then_update_same_file() {
    let ws = Ws::new(&[]);
    ok(
        &ws,
        "*** Add File: n.txt\n+one\n*** Update File: n.txt\n@@\n-one\n+two",
        "A n.txt\nM n.txt\n",
    );
    assert_eq!(ws.files(), files(&[("n.txt", "two\n")]));
}

#[test]
fn a23_two_updates_same_file() {
    let ws = Ws::new(&[("f", "a\nb\n")]);
    ok(
        &ws,
        "*** Update File: f\n@@\n-a\n+A\n*** Update File: f\n@@\n-b\n+B",
        "M f\nM f\n",
    );
    assert_eq!(ws.files(), files(&[("f", "A\nB\n")]));
}

/// Fails the first fault point matching `point` whose path ends with `suffix`.
fn fail_at(point: fault::Point, suffix: &'static str) {
    fault::set(move |p, path| {
        (p == point && path.ends_with(suffix))
            .then(|| std::io::Error::from_raw_os_error(13 /* EACCES */))
    });
}

#[test]
fn a24_atomic_rollback_on_write_failure() {
    let ws = Ws::new(&[
        ("a.txt", "a\n"),
        ("gone.txt", "bye\n"),
        ("locked/c.txt", "c\n"),
    ]);
    fs::set_permissions(ws.root.join("a.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::set_permissions(ws.root.join("gone.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    let before = ws.tree();
    fail_at(fault::Point::Write, "locked/c.txt");
    let err = ws
        .apply(
            "*** Update File: a.txt\n@@\n-a\n+A\n*** Add File: new/dir/b.txt\n+b\n\
             *** Delete File: gone.txt\n*** Update File: locked/c.txt\n@@\n-c\n+C",
        )
        .unwrap_err();
    fault::clear();
    assert_eq!(
        norm(&err.message),
        failure(&format!(
            "Failed to write file {}: Permission denied (os error 13)\nAll changes made by this patch were rolled back.\n",
            ws.abs("locked/c.txt")
        ))
    );
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
    assert_eq!(ws.tree(), before, "tree not restored byte for byte");
}

#[test]
fn a24b_rollback_with_real_permissions_when_not_root() {
    let ws = Ws::new(&[("a.txt", "a\n"), ("locked/c.txt", "c\n")]);
    if fs::metadata(ws.root.join("a.txt")).unwrap().uid() == 0 {
        // Root ignores permission bits; a24 covers this path with the fault hook.
        return;
    }
    fs::set_permissions(ws.root.join("locked"), fs::Permissions::from_mode(0o555)).unwrap();
    let before = ws.tree();
    let err = ws
        .apply("*** Update File: a.txt\n@@\n-a\n+A\n*** Update File: locked/c.txt\n@@\n-c\n+C")
        .unwrap_err();
    fs::set_permissions(ws.root.join("locked"), fs::Permissions::from_mode(0o755)).unwrap();
    assert!(
        err.message.contains("Failed to write file"),
        "{}",
        err.message
    );
    assert!(
        err.message
            .contains("All changes made by this patch were rolled back.")
    );
    let mut after = ws.tree();
    after.insert("locked".into(), Node::Dir(0o555));
    assert_eq!(after, before);
}

#[test]
fn a25_no_torn_reads() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let line = format!("{}\n", "x".repeat(1023));
    let old = line.repeat(50 * 1024); // 50 MiB
    let new = format!("changed\n{}", &old[line.len()..]);
    let ws = Ws::new(&[]);
    fs::write(ws.root.join("big.txt"), &old).unwrap();
    let path = ws.root.join("big.txt");
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (done, path, old, new) = (done.clone(), path.clone(), old.clone(), new.clone());
        std::thread::spawn(move || {
            let mut reads = 0usize;
            while !done.load(Ordering::Relaxed) || reads == 0 {
                let seen = fs::read(&path).unwrap();
                assert!(
                    seen == old.as_bytes() || seen == new.as_bytes(),
                    "torn read"
                );
                reads += 1;
                if reads > 10_000 {
                    break;
                }
            }
            reads
        })
    };
    let body = format!("*** Update File: big.txt\n@@\n-{}\n+changed", &line[..1023]);
    ws.apply(&body).unwrap();
    done.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    assert!(fs::read(&path).unwrap() == new.as_bytes());
}

#[test]
fn a26_read_only_session() {
    let ws = Ws::new(&[("f", "a\n")]);
    let mut ctx = ws.ctx();
    ctx.read_only = true;
    let before = ws.tree();
    let err = apply_patch(&wrap("*** Add File: new.txt\n+x"), &ctx).unwrap_err();
    assert_eq!(
        err.message,
        "patch rejected: writing is blocked by read-only sandbox; rejected by user approval settings"
    );
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
    assert_eq!(ws.tree(), before);
}

#[test]
fn a27_outside_writable_roots() {
    let outside = tempfile::tempdir().unwrap();
    let out_root = fs::canonicalize(outside.path()).unwrap();
    fs::write(out_root.join("target.txt"), "t\n").unwrap();
    let ws = Ws::new(&[("src.txt", "s\n")]);
    symlink(&out_root, ws.root.join("escape")).unwrap();
    symlink(out_root.join("target.txt"), ws.root.join("flink")).unwrap();
    let text = "patch rejected: writing outside of the project; rejected by user approval settings";
    let o = out_root.display();
    for body in [
        format!("*** Add File: {o}/x\n+x"),
        "*** Update File: src.txt\n*** Move to: ../elsewhere.txt\n@@\n-s\n+t".to_string(),
        format!("*** Update File: src.txt\n*** Move to: {o}/moved.txt\n@@\n-s\n+t"),
        "*** Add File: escape/x\n+x".to_string(),
        "*** Update File: flink\n@@\n-t\n+u".to_string(),
        // A later hunk's target poisons the whole patch.
        format!("*** Add File: fine.txt\n+ok\n*** Add File: {o}/x\n+x"),
    ] {
        let before = ws.tree();
        let err = ws.apply(&body).unwrap_err();
        assert_eq!(err.message, text, "{body}");
        assert_eq!(err.kind, ErrorKind::PermissionDenied);
        assert_eq!(ws.tree(), before);
    }
    assert_eq!(fs::read_dir(&out_root).unwrap().count(), 1);
    assert_eq!(
        fs::read_to_string(out_root.join("target.txt")).unwrap(),
        "t\n"
    );
    // Deleting the symlink itself is inside the workspace and allowed.
    ok(&ws, "*** Delete File: flink", "D flink\n");
    assert_eq!(
        fs::read_to_string(out_root.join("target.txt")).unwrap(),
        "t\n"
    );
}

#[test]
fn a28_protected_metadata_paths() {
    let ws = Ws::new(&[(".git/hooks/README", "hooks\n"), ("f", "x\n")]);
    for (body, path) in [
        (
            "*** Add File: .git/hooks/pre-commit\n+#!/bin/sh",
            ".git/hooks/pre-commit",
        ),
        (
            "*** Add File: .codex/config.toml\n+x = 1",
            ".codex/config.toml",
        ),
        (
            "*** Update File: f\n*** Move to: .agents/f\n@@\n-x\n+y",
            ".agents/f",
        ),
    ] {
        let before = ws.tree();
        let err = ws.apply(body).unwrap_err();
        assert_eq!(
            err.message,
            format!(
                "patch rejected: writing to protected workspace metadata path {} is blocked by the sandbox",
                ws.abs(path)
            )
        );
        assert_eq!(err.kind, ErrorKind::PermissionDenied);
        assert_eq!(ws.tree(), before);
    }
    // Through a symlink into .git.
    symlink(ws.root.join(".git"), ws.root.join("g")).unwrap();
    let err = ws.apply("*** Add File: g/config\n+x").unwrap_err();
    assert!(err.message.contains("protected workspace metadata path"));
    // An extra protected path.
    let mut ctx = ws.ctx();
    ctx.protected_paths.push(ws.root.join("gitdir"));
    let err = apply_patch(&wrap("*** Add File: gitdir/HEAD\n+x"), &ctx).unwrap_err();
    assert_eq!(
        err.message,
        format!(
            "patch rejected: writing to protected workspace metadata path {} is blocked by the sandbox",
            ws.abs("gitdir/HEAD")
        )
    );
}

#[test]
fn a29_mode_kept() {
    let ws = Ws::new(&[("run.sh", "#!/bin/sh\necho hi\n")]);
    fs::set_permissions(ws.root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    ok(
        &ws,
        "*** Update File: run.sh\n@@\n-echo hi\n+echo bye",
        "M run.sh\n",
    );
    assert_eq!(
        ws.tree()["run.sh"],
        Node::File(b"#!/bin/sh\necho bye\n".to_vec(), 0o755)
    );
}

// ---- further behaviour -------------------------------------------------------------------

#[test]
fn added_file_gets_default_mode_and_dirs_created() {
    let ws = Ws::new(&[]);
    ok(&ws, "*** Add File: a/b/c.txt\n+x", "A a/b/c.txt\n");
    let tree = ws.tree();
    let Node::File(_, mode) = &tree["a/b/c.txt"] else {
        panic!()
    };
    // 0666 & ~umask: never the 0600 of a bare temporary file unless the umask says so.
    let probe = ws.root.join("probe");
    fs::write(&probe, "").unwrap();
    assert_eq!(*mode, fs::metadata(&probe).unwrap().mode() & 0o7777);
    assert!(matches!(tree["a/b"], Node::Dir(_)));
}

#[test]
fn update_through_symlink_writes_target() {
    let ws = Ws::new(&[("real.txt", "a\n")]);
    symlink("real.txt", ws.root.join("link.txt")).unwrap();
    ok(&ws, "*** Update File: link.txt\n@@\n-a\n+b", "M link.txt\n");
    assert_eq!(ws.read("real.txt"), "b\n");
    assert_eq!(ws.tree()["link.txt"], Node::Link("real.txt".into()));
}

#[test]
fn move_onto_itself_is_in_place() {
    let ws = Ws::new(&[("f", "a\n")]);
    let out = ok(
        &ws,
        "*** Update File: f\n*** Move to: ./f\n@@\n-a\n+b",
        "M ./f\n",
    );
    assert_eq!(ws.files(), files(&[("f", "b\n")]));
    assert_eq!(out.changes[0].kind, FileChangeKind::Modified);
}

#[test]
fn add_onto_directory_fails_in_verification() {
    let ws = Ws::new(&[("d/x", "x\n")]);
    fails_unchanged(
        &ws,
        &wrap("*** Add File: d\n+x"),
        &format!(
            "apply_patch verification failed: Failed to write file {}: Is a directory (os error 21)",
            ws.abs("d")
        ),
    );
    // A directory that only exists in the view (created by an earlier hunk).
    fails_unchanged(
        &ws,
        &wrap("*** Add File: n/x\n+x\n*** Add File: n\n+y"),
        &format!(
            "apply_patch verification failed: Failed to write file {}: Is a directory (os error 21)",
            ws.abs("n")
        ),
    );
}

#[test]
fn delete_then_update_fails_against_view() {
    let ws = Ws::new(&[("f", "a\n")]);
    fails_unchanged(
        &ws,
        &wrap("*** Delete File: f\n*** Update File: f\n@@\n-a\n+b"),
        &format!(
            "apply_patch verification failed: Failed to read file to update {}: No such file or directory (os error 2)",
            ws.abs("f")
        ),
    );
}

#[test]
fn non_utf8_update_fails_but_delete_works() {
    let ws = Ws::new(&[]);
    fs::write(ws.root.join("bin"), [0xff, 0xfe, b'\n']).unwrap();
    fails_unchanged(
        &ws,
        &wrap("*** Update File: bin\n@@\n-x\n+y"),
        &format!(
            "apply_patch verification failed: Failed to read file to update {}: stream did not contain valid UTF-8",
            ws.abs("bin")
        ),
    );
    ok(&ws, "*** Delete File: bin", "D bin\n");
}

#[test]
fn special_files_are_refused_without_blocking() {
    let ws = Ws::new(&[]);
    let fifo = ws.root.join("fifo");
    let status = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !status.is_ok_and(|s| s.success()) {
        return; // no mkfifo on this system
    }
    symlink("fifo", ws.root.join("flink")).unwrap();
    for (body, text) in [
        (
            "*** Update File: fifo\n@@\n-a\n+b",
            "Failed to read file to update {abs}/fifo",
        ),
        ("*** Delete File: fifo", "Failed to read {abs}/fifo"),
        ("*** Delete File: flink", "Failed to read {abs}/flink"),
        ("*** Add File: fifo\n+x", "Failed to write file {abs}/fifo"),
    ] {
        let expected = format!(
            "apply_patch verification failed: {}: not a regular file",
            text.replace("{abs}", &ws.root.display().to_string())
        );
        fails_unchanged(&ws, &wrap(body), &expected);
    }
}

#[test]
fn rollback_after_delete_and_move() {
    let ws = Ws::new(&[("del.txt", "d\n"), ("src.txt", "s\n"), ("z.txt", "z\n")]);
    symlink("z.txt", ws.root.join("zlink")).unwrap();
    let before = ws.tree();
    fail_at(fault::Point::Write, "last.txt");
    let err = ws
        .apply(
            "*** Delete File: del.txt\n*** Delete File: zlink\n\
             *** Update File: src.txt\n*** Move to: moved/dst.txt\n@@\n-s\n+t\n\
             *** Add File: last.txt\n+l",
        )
        .unwrap_err();
    fault::clear();
    assert!(
        err.message.contains("Failed to write file "),
        "{}",
        err.message
    );
    assert!(err.message.contains("rolled back"));
    assert_eq!(ws.tree(), before);
}

#[test]
fn commit_error_texts() {
    let cases: [(fault::Point, &str, &str, &str); 3] = [
        (
            fault::Point::CreateDir,
            "deep",
            "*** Add File: deep/x.txt\n+x",
            "Failed to create parent directories for {abs}/deep/x.txt: Permission denied (os error 13)",
        ),
        (
            fault::Point::Remove,
            "del.txt",
            "*** Delete File: del.txt",
            "Failed to delete file {abs}/del.txt: Permission denied (os error 13)",
        ),
        (
            fault::Point::Remove,
            "src.txt",
            "*** Update File: src.txt\n*** Move to: dst.txt\n@@\n-s\n+t",
            "Failed to remove original {abs}/src.txt: Permission denied (os error 13)",
        ),
    ];
    for (point, suffix, body, first) in cases {
        let ws = Ws::new(&[("del.txt", "d\n"), ("src.txt", "s\n")]);
        let before = ws.tree();
        fail_at(point, suffix);
        let err = ws.apply(body).unwrap_err();
        fault::clear();
        let output = format!(
            "{}\nAll changes made by this patch were rolled back.\n",
            first.replace("{abs}", &ws.root.display().to_string())
        );
        assert_eq!(norm(&err.message), failure(&output));
        assert_eq!(ws.tree(), before, "{body}");
    }
}

#[test]
fn rollback_failure_is_reported() {
    let ws = Ws::new(&[("a.txt", "a\n"), ("b.txt", "b\n")]);
    fault::set(|p, path| {
        let hit = (p == fault::Point::Write && path.ends_with("b.txt"))
            || (p == fault::Point::Rollback && path.ends_with("a.txt"));
        hit.then(|| std::io::Error::from_raw_os_error(28 /* ENOSPC */))
    });
    let err = ws
        .apply("*** Update File: a.txt\n@@\n-a\n+A\n*** Update File: b.txt\n@@\n-b\n+B")
        .unwrap_err();
    fault::clear();
    let output = format!(
        "Failed to write file {0}/b.txt: No space left on device (os error 28)\n\
         Rollback failed for {0}/a.txt: No space left on device (os error 28)\n",
        ws.root.display()
    );
    assert_eq!(norm(&err.message), failure(&output));
    // Classed by the first failure: the disk is full.
    assert_eq!(err.kind, ErrorKind::ResourceExhausted);
    // The failed file is untouched and no temporary file is left behind.
    assert_eq!(ws.files(), files(&[("a.txt", "A\n"), ("b.txt", "b\n")]));
}

/// While new content is written and synced it has no name yet, so a worker killed there (the
/// longest part of a commit) leaves no temporary file behind; tests/it/faults.rs kills real
/// workers mid-commit.
#[test]
fn content_is_written_to_an_unnamed_file() {
    let ws = Ws::new(&[("a.txt", "a\n")]);
    if let Err(e) = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(&ws.root)
    {
        eprintln!("skipped: this filesystem has no O_TMPFILE ({e})");
        return;
    }
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let record = seen.clone();
    fault::set(move |point, path| {
        if point == fault::Point::Write {
            let names: Vec<String> = fs::read_dir(path.parent().unwrap())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            record.borrow_mut().push(names);
        }
        None
    });
    let result = ws.apply("*** Update File: a.txt\n@@\n-a\n+A\n*** Add File: sub/b.txt\n+b");
    fault::clear();
    result.unwrap();
    let seen = seen.borrow();
    assert_eq!(
        *seen,
        vec![vec!["a.txt".to_string()], vec![]],
        "only the files themselves, written and synced"
    );
    assert_eq!(ws.files(), files(&[("a.txt", "A\n"), ("sub/b.txt", "b\n")]));
}
