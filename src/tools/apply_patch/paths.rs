//! Target resolution and the sandbox rules for apply_patch (spec/tools.md §5.6).
//!
//! A target is resolved the way the kernel would walk it: existing components have their symlinks
//! followed, `.` and `..` are applied as they come, and the missing tail is appended lexically. The
//! resolved path must lie inside a writable root and outside every protected path.
//!
//! A path at or below the worker's pinned working directory is walked from that directory, not
//! from `/` (spec/sandbox.md H24): its parents, which another session could swap, are never
//! walked, `..` above it leads to its real parent, and every look at the disk goes through the
//! pinned descriptor (`pinned_cwd::fs_path`). Such a path keeps its spelling in the result, so a
//! resolved path is compared with roots resolved the same way ([`canonical_or_self`]) and the
//! writes that follow reach it through the descriptor too.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use super::PatchContext;
use crate::tools::ToolError;
use crate::tools::shell::pinned_cwd::{self, fs_path};

/// Symlink hops allowed while resolving one path (Linux's `MAXSYMLINKS`).
const MAX_SYMLINK_HOPS: usize = 40;
/// `ELOOP` on Linux.
const ELOOP: i32 = 40;

/// Text of the policy rejections (§5.8).
pub const READ_ONLY_REJECTION: &str =
    "patch rejected: writing is blocked by read-only sandbox; rejected by user approval settings";
pub const OUTSIDE_REJECTION: &str =
    "patch rejected: writing outside of the project; rejected by user approval settings";

enum Step {
    Parent,
    Name(OsString),
}

fn push_front_components(queue: &mut VecDeque<Step>, path: &Path) {
    let steps: Vec<Step> = path
        .components()
        .filter_map(|c| match c {
            Component::ParentDir => Some(Step::Parent),
            Component::Normal(n) => Some(Step::Name(n.to_os_string())),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    for step in steps.into_iter().rev() {
        queue.push_front(step);
    }
}

/// Resolves `path` (made absolute first). With `follow_last`, a final symlink is followed too
/// (the file a write would land in); without it the final entry itself is named (what a delete
/// removes). Components below a missing one are taken lexically.
pub fn resolve(path: &Path, follow_last: bool) -> io::Result<PathBuf> {
    let path = std::path::absolute(path)?;
    let mut queue = VecDeque::new();
    let (mut out, pinned) = match pinned_cwd::beneath(&path) {
        Some((pinned, rest)) => {
            push_front_components(&mut queue, rest);
            (pinned.to_path_buf(), Some(pinned))
        }
        None => {
            push_front_components(&mut queue, &path);
            (PathBuf::from("/"), None)
        }
    };
    let mut missing = false;
    let mut hops = 0;
    while let Some(step) = queue.pop_front() {
        let name = match step {
            Step::Parent if pinned.is_some_and(|p| out == p) => {
                // Above the pinned directory: its real parent, wherever that is now.
                out = fs::canonicalize(fs_path(&out).join(".."))?;
                continue;
            }
            Step::Parent => {
                out.pop();
                continue;
            }
            Step::Name(name) => name,
        };
        let candidate = out.join(&name);
        if missing || (queue.is_empty() && !follow_last) {
            out = candidate;
            continue;
        }
        match fs::symlink_metadata(fs_path(&candidate)) {
            Ok(meta) if meta.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_SYMLINK_HOPS {
                    return Err(io::Error::from_raw_os_error(ELOOP));
                }
                let target = fs::read_link(fs_path(&candidate))?;
                if target.is_absolute() {
                    out = PathBuf::from("/");
                }
                push_front_components(&mut queue, &target);
            }
            Ok(_) => out = candidate,
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.kind() == io::ErrorKind::NotADirectory =>
            {
                missing = true;
                out = candidate;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// A root or protected path in the terms of [`resolve`]'s results: at or below the pinned
/// working directory resolved the same way, elsewhere canonicalised; itself when it cannot be.
pub(crate) fn canonical_or_self(p: &Path) -> PathBuf {
    if pinned_cwd::beneath(p).is_some() {
        return resolve(p, true).unwrap_or_else(|_| p.to_path_buf());
    }
    fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The spellings of a protected path a resolved target is compared with: as given, resolved as
/// a root is ([`canonical_or_self`]), and, when it lies beside the pinned working directory,
/// resolved from that directory (`pinned_cwd::from_pinned`): after a parent of the cwd was
/// swapped, `..` from the cwd reaches the real parent, and so must the protected paths there
/// (a `.git` file's gitdir beside the cwd), whose text now leads into the swapped-in tree.
fn protected_spellings(p: &Path) -> Vec<PathBuf> {
    let mut out = vec![p.to_path_buf(), canonical_or_self(p)];
    if let Some(real) = pinned_cwd::from_pinned(p).and_then(|q| resolve(&q, true).ok()) {
        out.push(real);
    }
    out
}

/// Checks one resolved target against the session's roots and protected paths. `display` is the
/// `cwd.join(path)` form used in the protected-path message. `resolved` is `None` when the target
/// could not be resolved (fail closed: treated as outside the project).
pub fn check_target(
    resolved: Option<&Path>,
    display: &Path,
    ctx: &PatchContext,
) -> Result<(), ToolError> {
    let outside = || ToolError::new(super::ErrorKind::PermissionDenied, OUTSIDE_REJECTION);
    let Some(resolved) = resolved else {
        return Err(outside());
    };
    let roots: Vec<PathBuf> = ctx
        .writable_roots
        .iter()
        .map(|r| canonical_or_self(r))
        .filter(|r| resolved.starts_with(r))
        .collect();
    if roots.is_empty() {
        return Err(outside());
    }
    let protected = roots
        .iter()
        .flat_map(|root| ctx.protected_names.iter().map(move |n| root.join(n)))
        .chain(
            ctx.protected_paths
                .iter()
                .flat_map(|p| protected_spellings(p)),
        )
        .any(|p| resolved.starts_with(&p));
    if protected {
        return Err(ToolError::new(
            super::ErrorKind::PermissionDenied,
            format!(
                "patch rejected: writing to protected workspace metadata path {} is blocked by the sandbox",
                display.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn ctx(root: &Path) -> PatchContext {
        PatchContext::writable_root_for_tests(root)
    }

    #[test]
    fn resolves_dots_and_missing_tail() {
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        fs::create_dir(root.join("a")).unwrap();
        assert_eq!(
            resolve(&root.join("a/./../a/new/x/../y"), true).unwrap(),
            root.join("a/new/y")
        );
    }

    #[test]
    fn follows_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        fs::create_dir(root.join("real")).unwrap();
        fs::write(root.join("real/f"), "x").unwrap();
        symlink("real", root.join("link")).unwrap();
        symlink(root.join("real/f"), root.join("flink")).unwrap();
        assert_eq!(
            resolve(&root.join("link/f"), true).unwrap(),
            root.join("real/f")
        );
        assert_eq!(
            resolve(&root.join("link/../x"), true).unwrap(),
            root.join("x")
        );
        assert_eq!(
            resolve(&root.join("flink"), true).unwrap(),
            root.join("real/f")
        );
        assert_eq!(
            resolve(&root.join("flink"), false).unwrap(),
            root.join("flink")
        );
        // A dangling link resolves to where a write through it would land.
        symlink("nowhere/z", root.join("dangling")).unwrap();
        assert_eq!(
            resolve(&root.join("dangling"), true).unwrap(),
            root.join("nowhere/z")
        );
    }

    #[test]
    fn symlink_loop_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        symlink("b", root.join("a")).unwrap();
        symlink("a", root.join("b")).unwrap();
        assert_eq!(
            resolve(&root.join("a"), true).unwrap_err().raw_os_error(),
            Some(ELOOP)
        );
    }

    #[test]
    fn policy_checks() {
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        let c = ctx(&root);
        assert!(check_target(Some(&root.join("x")), &root.join("x"), &c).is_ok());
        let e = check_target(Some(Path::new("/etc/x")), Path::new("/etc/x"), &c).unwrap_err();
        assert_eq!(e.message, OUTSIDE_REJECTION);
        let e = check_target(None, &root.join("x"), &c).unwrap_err();
        assert_eq!(e.message, OUTSIDE_REJECTION);
        let e = check_target(
            Some(&root.join(".git/config")),
            Path::new("/d/.git/config"),
            &c,
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "patch rejected: writing to protected workspace metadata path /d/.git/config is blocked by the sandbox"
        );
        assert_eq!(e.kind, super::super::ErrorKind::PermissionDenied);
        // Only the top of the root is protected; `.gitignore` is not `.git`.
        assert!(check_target(Some(&root.join("sub/.git/x")), Path::new("/x"), &c).is_ok());
        assert!(check_target(Some(&root.join(".gitignore")), Path::new("/x"), &c).is_ok());
        let mut c2 = ctx(&root);
        c2.protected_paths.push(root.join("gitdir"));
        assert!(check_target(Some(&root.join("gitdir/HEAD")), Path::new("/x"), &c2).is_err());
    }
}
