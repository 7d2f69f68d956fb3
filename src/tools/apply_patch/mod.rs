//! The `apply_patch` tool: Codex's patch language, applied atomically (spec/tools.md §5).
//!
//! Pipeline: [`parse_patch`] → verify every hunk over a virtual tree (`apply::verify`) → check
//! every target against the session's writable roots and protected paths (`paths`) → commit each
//! file through a temporary file and rename, rolling everything back on an I/O error
//! (`apply::commit`). Nothing on disk changes unless the whole patch applies.
//!
//! Files: `parser` (the patch language), `seek_sequence` (the four-pass matcher), `update` (new
//! content of an updated file, line endings), `paths` (resolution and sandbox rules), `apply`
//! (verification, commit, rollback), `fault` (test-only failure injection), `invocation`
//! (recognising apply_patch sent as a command).

mod apply;
pub mod invocation;
mod parser;
mod paths;
mod seek_sequence;
mod update;

#[cfg(test)]
mod fault;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod scenario_tests;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::shell::format::{duration_seconds, format_freeform};
use super::shell::truncate::{TextView, TruncationPolicy};
use super::{ErrorKind, ToolError};

pub use parser::{Hunk, ParseError, Patch, UpdateChunk, parse_patch};
pub(crate) use paths::canonical_or_self;
/// How a write target is resolved (symlinks on the way followed, the missing tail lexical); the
/// Files service resolves its destinations the same way.
pub use paths::resolve as resolve_target;
pub use paths::{OUTSIDE_REJECTION, READ_ONLY_REJECTION};
pub use seek_sequence::seek_sequence;

/// The tool's answer to a patch with no hunks (the library/CLI says `No files were modified.`).
pub const EMPTY_PATCH_REJECTION: &str = "patch rejected: empty patch";

/// Arguments of the JSON (function) variant of the tool: `{"input": "<patch>"}`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ApplyPatchArgs {
    pub input: String,
}

/// The session facts apply_patch needs.
#[derive(Debug, Clone)]
pub struct PatchContext {
    /// The session's working directory; relative patch paths are joined to it.
    pub cwd: PathBuf,
    /// Canonical writable roots; every target must resolve inside one of them.
    pub writable_roots: Vec<PathBuf>,
    /// A read-only session rejects every patch.
    pub read_only: bool,
    /// Names protected at the top of each writable root (`.git`, `.codex`, `.agents`, `.aws`).
    pub protected_names: Vec<String>,
    /// Extra read-only paths (e.g. a worktree's gitdir).
    pub protected_paths: Vec<PathBuf>,
}

#[cfg(test)]
impl PatchContext {
    /// A workspace-write session on `root` alone, with the standard protected names: what the
    /// tools' unit tests run under.
    pub(crate) fn writable_root_for_tests(root: &std::path::Path) -> Self {
        Self {
            cwd: root.to_path_buf(),
            writable_roots: vec![root.to_path_buf()],
            read_only: false,
            protected_names: [".git", ".codex", ".agents", ".aws"]
                .map(String::from)
                .to_vec(),
            protected_paths: vec![],
        }
    }
}

/// What a hunk did to its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileChangeKind {
    /// `A`: an Add hunk (possibly overwriting an existing file).
    Added,
    /// `M`: an Update hunk in place (including a move onto the source itself).
    Modified,
    /// `D`: a Delete hunk.
    Deleted,
    /// `M` (destination): an Update hunk with `Move to`; `from` is the source (`cwd.join` form).
    Moved { from: PathBuf },
}

/// One line of the result: one per hunk, in patch order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// The file as `cwd.join(path)` (the destination for a move).
    pub path: PathBuf,
    /// The path as spelled in the patch (the destination for a move); used in the summary.
    pub spelled: String,
    pub kind: FileChangeKind,
    /// Unified diff (context 1, no header) between the content before and after this hunk.
    pub unified_diff: String,
    /// An existing file was replaced by an Add or by a move's destination (§5.7.5).
    pub overwritten: bool,
}

/// A successful patch.
#[derive(Debug, Clone, PartialEq)]
pub struct ApplyPatchOutput {
    pub changes: Vec<FileChange>,
    /// Warnings for the typed result (e.g. apply_patch requested through a shell tool).
    pub warnings: Vec<String>,
    /// Wall time of the call, rounded to one decimal.
    pub duration_seconds: f32,
}

impl ApplyPatchOutput {
    /// The library/CLI summary: `Success. Updated the following files:\n` then `A`, `M`, `D`
    /// lines grouped in that order, each in patch order, each ending with `\n`.
    pub fn summary(&self) -> String {
        let mut out = String::from("Success. Updated the following files:\n");
        for letter in ['A', 'M', 'D'] {
            for change in &self.changes {
                let l = match change.kind {
                    FileChangeKind::Added => 'A',
                    FileChangeKind::Modified | FileChangeKind::Moved { .. } => 'M',
                    FileChangeKind::Deleted => 'D',
                };
                if l == letter {
                    out.push(letter);
                    out.push(' ');
                    out.push_str(&change.spelled);
                    out.push('\n');
                }
            }
        }
        out
    }

    /// The model text: the summary in the freeform exec format (§5.8) with exit code 0.
    pub fn model_text(&self) -> String {
        exec_text(&self.summary(), 0, self.duration_seconds)
    }

    /// Paths replaced by an Add or a move (for the typed result and the audit log).
    pub fn overwritten_paths(&self) -> Vec<PathBuf> {
        self.changes
            .iter()
            .filter(|c| c.overwritten)
            .map(|c| c.path.clone())
            .collect()
    }
}

/// The freeform exec format (§5.8, §6.4): Codex runs every apply_patch, whichever way it arrived,
/// as an exec and answers with that exec's text (`codex-rs/core/tests/suite/shell_serialization.rs`,
/// `apply_patch_*_output_is_structured`).
fn exec_text(output: &str, exit_code: i32, duration_seconds: f32) -> String {
    format_freeform(
        TextView::complete(output),
        exit_code,
        Duration::from_secs_f32(duration_seconds),
        TruncationPolicy::default(),
    )
}

fn rounded_secs(started: Instant) -> f32 {
    duration_seconds(started.elapsed())
}

/// Applies a patch given as the JSON variant's `arguments` string.
pub fn apply_patch_json(
    arguments: &str,
    ctx: &PatchContext,
) -> Result<ApplyPatchOutput, ToolError> {
    let args: ApplyPatchArgs = crate::tools::parse_arguments(arguments)?;
    apply_patch_for_model(&args.input, ctx)
}

/// Parses, verifies, checks and atomically applies `input`, with a unified diff of each change.
/// The error's message is the exact model text: plain for parse, verification and policy
/// failures, the freeform exec format (exit code 1) for commit-stage failures.
pub fn apply_patch(input: &str, ctx: &PatchContext) -> Result<ApplyPatchOutput, ToolError> {
    apply(input, ctx, true)
}

/// The same, for the model: its text lists the files only, so no diffs are computed.
pub fn apply_patch_for_model(
    input: &str,
    ctx: &PatchContext,
) -> Result<ApplyPatchOutput, ToolError> {
    apply(input, ctx, false)
}

fn apply(input: &str, ctx: &PatchContext, diffs: bool) -> Result<ApplyPatchOutput, ToolError> {
    let started = Instant::now();
    let patch = parse_patch(input)
        .map_err(|e| ToolError::invalid(format!("apply_patch verification failed: {e}")))?;
    // Codex's safety check refuses an empty patch before anything else (`core/src/safety.rs`,
    // `assess_patch_safety`), so this text wins over the read-only one.
    if patch.hunks.is_empty() {
        return Err(ToolError::new(
            ErrorKind::PermissionDenied,
            EMPTY_PATCH_REJECTION,
        ));
    }
    let plan = apply::verify(&patch, ctx, diffs)?;
    if ctx.read_only {
        return Err(ToolError::new(
            ErrorKind::PermissionDenied,
            READ_ONLY_REJECTION,
        ));
    }
    for (resolved, display) in &plan.targets {
        paths::check_target(resolved.as_deref(), display, ctx)?;
    }
    apply::commit(&plan)
        .map_err(|e| ToolError::new(e.kind, exec_text(&e.text, 1, rounded_secs(started))))?;
    Ok(ApplyPatchOutput {
        changes: plan.changes,
        warnings: Vec::new(),
        duration_seconds: rounded_secs(started),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_format() {
        assert_eq!(
            exec_text(
                "Success. Updated the following files:\nM src/app.ts\n",
                0,
                0.0
            ),
            "Exit code: 0\nWall time: 0 seconds\nOutput:\nSuccess. Updated the following files:\nM src/app.ts\n"
        );
        // Display of the rounded f32: a fraction only when there is one.
        assert_eq!(
            exec_text("Failed to write file /w/a\n", 1, 1.2),
            "Exit code: 1\nWall time: 1.2 seconds\nOutput:\nFailed to write file /w/a\n"
        );
    }

    #[test]
    fn empty_patch_is_rejected_before_the_read_only_check() {
        let dir = tempfile::tempdir().unwrap();
        let mut ctx = PatchContext {
            cwd: dir.path().to_path_buf(),
            writable_roots: vec![dir.path().to_path_buf()],
            read_only: true,
            protected_names: vec![],
            protected_paths: vec![],
        };
        for read_only in [true, false] {
            ctx.read_only = read_only;
            let e = apply_patch_for_model("*** Begin Patch\n*** End Patch", &ctx).unwrap_err();
            assert_eq!(e.message, "patch rejected: empty patch");
            assert_eq!(e.kind, ErrorKind::PermissionDenied);
        }
    }

    #[test]
    fn a_temporary_file_a_killed_commit_left_is_removed_by_the_next_one_there() {
        crate::tools::transfer::fsx::set_leftovers_possible(true);
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("sub")).unwrap();
        let ctx = PatchContext {
            cwd: d.to_path_buf(),
            writable_roots: vec![d.to_path_buf()],
            read_only: false,
            protected_names: vec![],
            protected_paths: vec![],
        };
        // Left by a dead commit (nobody holds its lock), one still being committed (locked),
        // one made write-only (opened write-only to lock it; as root its mode is no obstacle),
        // and names that are not a commit's temporary file.
        std::fs::write(d.join("sub/.corral-patch-aB3xY9.tmp"), "stale").unwrap();
        std::fs::write(d.join("sub/.corral-patch-wr1te0.tmp"), "stale").unwrap();
        std::fs::set_permissions(
            d.join("sub/.corral-patch-wr1te0.tmp"),
            std::os::unix::fs::PermissionsExt::from_mode(0o200),
        )
        .unwrap();
        let live = std::fs::File::create(d.join("sub/.corral-patch-L1ve00.tmp")).unwrap();
        crate::tools::transfer::fsx::lock_staging(std::os::fd::AsFd::as_fd(&live)).unwrap();
        let keep = [
            ".corral-patch-abc.tmp",
            ".corral-patch-abcdef.txt",
            "corral-patch-abcdef.tmp",
            ".corral-patch-abc-ef.tmp",
        ];
        for k in keep {
            std::fs::write(d.join("sub").join(k), "mine").unwrap();
        }
        // In another directory: not looked at.
        std::fs::write(d.join(".corral-patch-aB3xY9.tmp"), "elsewhere").unwrap();

        apply_patch(
            "*** Begin Patch\n*** Add File: sub/new.txt\n+hi\n*** End Patch",
            &ctx,
        )
        .unwrap();
        let mut left: Vec<String> = std::fs::read_dir(d.join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want: Vec<String> = keep.iter().map(|k| k.to_string()).collect();
        want.extend([".corral-patch-L1ve00.tmp".into(), "new.txt".into()]);
        want.sort();
        assert_eq!(left, want);
        assert!(d.join(".corral-patch-aB3xY9.tmp").exists());
        drop(live);
    }

    #[test]
    fn summary_groups_a_m_d() {
        let change = |spelled: &str, kind| FileChange {
            path: PathBuf::from("/w").join(spelled),
            spelled: spelled.into(),
            kind,
            unified_diff: String::new(),
            overwritten: false,
        };
        let out = ApplyPatchOutput {
            changes: vec![
                change("d1", FileChangeKind::Deleted),
                change("m1", FileChangeKind::Modified),
                change("a1", FileChangeKind::Added),
                change(
                    "mv",
                    FileChangeKind::Moved {
                        from: PathBuf::from("/w/src"),
                    },
                ),
                change("a2", FileChangeKind::Added),
            ],
            warnings: vec![],
            duration_seconds: 0.0,
        };
        assert_eq!(
            out.summary(),
            "Success. Updated the following files:\nA a1\nA a2\nM m1\nM mv\nD d1\n"
        );
    }

    #[test]
    fn json_variant_bad_arguments() {
        let ctx = PatchContext {
            cwd: PathBuf::from("/nonexistent"),
            writable_roots: vec![],
            read_only: false,
            protected_names: vec![],
            protected_paths: vec![],
        };
        let e = apply_patch_json("{}", &ctx).unwrap_err();
        assert_eq!(
            e.message,
            "failed to parse function arguments: missing field `input` at line 1 column 2"
        );
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        let e = apply_patch_json(r#"{"input":"nope","extra":1}"#, &ctx).unwrap_err();
        assert_eq!(
            e.message,
            "apply_patch verification failed: invalid patch: The first line of the patch must be '*** Begin Patch'"
        );
    }
}
