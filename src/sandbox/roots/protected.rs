//! The protected and guarded paths of every writable root (spec/sandbox.md §2.3, §8.6 H2, H20,
//! H28): the protected names at each root's top, what a `.git` there leads to (its gitdir and
//! common dir, and what git would run from them), the `.git` of submodules and of linked
//! worktrees below a root, and the markers that would make a root's top a git directory.
//! Existing ones are bound read-only; missing ones are guarded by the watcher.
//!
//! Apart from building the policy (`mod.rs`) because the worker recomputes exactly this before
//! every call that can write, and because it is where git's own discovery rules are mirrored.

use super::resolve::{
    Resolved, check_symlink, inspect, read_pointer_file, read_small_file, resolve_checked,
};
use super::{PolicyError, dedup};
use crate::sandbox::git_exec;
use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};

/// The names that make a directory a git directory to git's discovery (`is_git_directory`):
/// `HEAD`, `objects/` and `refs/` — or `HEAD` plus a `commondir` naming where the other two
/// live. A writable root's top must never become one (spec/sandbox.md §8.6 H2).
const GIT_DIR_MARKERS: [&str; 3] = ["HEAD", "objects", "refs"];

/// What git reads from a git directory that could run code or redirect it (hooks, config
/// `core.fsmonitor`/`core.worktree`), protected when a root's top already is a git directory.
const GIT_DIR_SENSITIVE: [&str; 3] = ["config", "hooks", "commondir"];

/// Existing and missing protected paths for every root (§2.3, §8.6 H2). Public because the
/// worker recomputes it before every call that can write (protection is per call, not per
/// worker): a name that appeared since the worker was built means the worker is stale.
pub fn protected_paths(
    roots: &[PathBuf],
    names: &[String],
) -> Result<(Vec<PathBuf>, Vec<PathBuf>), PolicyError> {
    let mut protected = Vec::new();
    let mut missing = Vec::new();
    for root in roots {
        for name in names {
            let path = root.join(name);
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    missing.push(path);
                    continue;
                }
                Err(e) => return Err(inspect(&path, e)),
            };
            if meta.file_type().is_symlink() {
                // A link whose target the sandbox can write (or re-point) cannot be protected by
                // a mount made before the command runs. One pointing outside every root needs
                // nothing: its target is read-only anyway.
                check_symlink(&path, &path, roots)?;
                continue;
            }
            protected.push(path.clone());
            if name == ".git" {
                what_a_dot_git_leads_to(
                    root,
                    &path,
                    meta.is_file(),
                    roots,
                    &mut protected,
                    &mut missing,
                )?;
            }
        }
        if names.iter().any(|n| n == ".git") {
            git_dir_markers(root, roots, &mut protected, &mut missing)?;
            submodules(root, roots, &mut protected, &mut missing)?;
            linked_worktrees(root, roots, &mut protected, &mut missing)?;
        }
    }

    // Explicit override: a protected path that is itself a writable root stays writable. (A root
    // nested inside a protected path is handled by the mount order in namespaces/fsview.rs.)
    let root_set: HashSet<&PathBuf> = roots.iter().collect();
    protected.retain(|p| !root_set.contains(p));
    missing.retain(|p| !root_set.contains(p));
    Ok((dedup(protected), dedup(missing)))
}

/// For a protected `.git` of the worktree `worktree`: the gitdir a `.git` file points to (and its
/// common dir), and what git will run from the worktree as the repository's config says (H20).
fn what_a_dot_git_leads_to(
    worktree: &Path,
    dot_git: &Path,
    is_file: bool,
    roots: &[PathBuf],
    protected: &mut Vec<PathBuf>,
    missing: &mut Vec<PathBuf>,
) -> Result<(), PolicyError> {
    let gitdirs = if is_file {
        let (exists, absent) = gitdir_paths(worktree, dot_git, roots)?;
        protected.extend(exists.iter().cloned());
        missing.extend(absent);
        exists
    } else {
        vec![dot_git.to_path_buf()]
    };
    let (exists, absent) = git_exec::executed_paths(worktree, &gitdirs, roots)?;
    protected.extend(exists);
    missing.extend(absent);
    Ok(())
}

/// Submodules read from a `.gitmodules` at most this many.
const MAX_SUBMODULES: usize = 256;

/// H28, submodules: the `.git` of every submodule a root's `.gitmodules` lists is protected like
/// the root's own (a sandbox rewrote a submodule's `gitdir:` pointer to a gitdir it made, and the
/// host's `git status` in that folder ran its fsmonitor), and guarded while missing in a
/// submodule directory that exists. `.gitmodules` itself is read-only, so a sandbox cannot drop a
/// submodule from the list before a worker is next built.
fn submodules(
    root: &Path,
    roots: &[PathBuf],
    protected: &mut Vec<PathBuf>,
    missing: &mut Vec<PathBuf>,
) -> Result<(), PolicyError> {
    let list = root.join(".gitmodules");
    match std::fs::symlink_metadata(&list) {
        Ok(m) if m.is_file() => {}
        Ok(m) if m.file_type().is_symlink() => return check_symlink(&list, &list, roots),
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(inspect(&list, e)),
    }
    protected.push(list.clone());
    let text = read_small_file(&list, git_exec::MAX_CONFIG_BYTES).map_err(|e| inspect(&list, e))?;
    for rel in submodule_paths(&text).into_iter().take(MAX_SUBMODULES) {
        let dir = root.join(rel);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            // Not checked out (or not a directory the sandbox could make a repository of
            // without creating it first): nothing to protect yet.
            _ => continue,
        }
        let dot_git = dir.join(".git");
        match std::fs::symlink_metadata(&dot_git) {
            Ok(m) if m.file_type().is_symlink() => check_symlink(&dot_git, &dot_git, roots)?,
            Ok(m) => {
                protected.push(dot_git.clone());
                what_a_dot_git_leads_to(&dir, &dot_git, m.is_file(), roots, protected, missing)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(dot_git),
            Err(e) => return Err(inspect(&dot_git, e)),
        }
    }
    Ok(())
}

/// Linked worktrees read from a repository's `worktrees/` at most this many.
const MAX_WORKTREES: usize = 256;

/// H28, linked worktrees: a root's repository lists its linked worktrees in
/// `<common dir>/worktrees/<name>/gitdir`, each the path of the worktree's `.git` file. One that
/// lies under a writable root is protected like the root's own `.git` (with what it points to
/// and what git runs from it), and guarded while missing in a directory that exists — else a
/// sandbox rewrites the `gitdir:` pointer of a worktree below it to a gitdir it made, and the
/// host's git in that worktree runs its fsmonitor. The list itself lies in the repository's git
/// directory, which is read-only (or outside every root).
fn linked_worktrees(
    root: &Path,
    roots: &[PathBuf],
    protected: &mut Vec<PathBuf>,
    missing: &mut Vec<PathBuf>,
) -> Result<(), PolicyError> {
    let dot_git = root.join(".git");
    let common_dirs = match std::fs::symlink_metadata(&dot_git) {
        Ok(m) if m.is_dir() => vec![dot_git.clone()],
        Ok(m) if m.is_file() => gitdir_paths(root, &dot_git, roots)?.0,
        _ => return Ok(()),
    };
    for common in common_dirs {
        let list = common.join("worktrees");
        let entries = match std::fs::read_dir(&list) {
            Ok(e) => e,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                continue;
            }
            Err(e) => return Err(inspect(&list, e)),
        };
        for entry in entries.take(MAX_WORKTREES) {
            let entry = entry.map_err(|e| inspect(&list, e))?;
            let pointer = entry.path().join("gitdir");
            let text = match read_pointer_file(&pointer) {
                Ok(t) => t,
                // A worktree entry without its pointer (being made or pruned): git ignores it.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(inspect(&pointer, e)),
            };
            let worktree_git = PathBuf::from(text.trim());
            if !worktree_git.is_absolute()
                || worktree_git == dot_git
                || !roots.iter().any(|r| worktree_git.starts_with(r))
            {
                continue;
            }
            let Some(worktree) = worktree_git.parent() else {
                continue;
            };
            match std::fs::symlink_metadata(&worktree_git) {
                Ok(m) if m.file_type().is_symlink() => {
                    check_symlink(&worktree_git, &worktree_git, roots)?
                }
                Ok(m) => {
                    protected.push(worktree_git.clone());
                    what_a_dot_git_leads_to(
                        worktree,
                        &worktree_git,
                        m.is_file(),
                        roots,
                        protected,
                        missing,
                    )?;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if std::fs::symlink_metadata(worktree).is_ok_and(|m| m.is_dir()) {
                        missing.push(worktree_git);
                    }
                }
                Err(e) => return Err(inspect(&worktree_git, e)),
            }
        }
    }
    Ok(())
}

/// The `path = …` values of a `.gitmodules`, relative and without `..`.
fn submodule_paths(text: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut in_submodule = false;
    for line in text.lines().map(str::trim) {
        if let Some(header) = line.strip_prefix('[') {
            in_submodule = header
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("submodule");
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if !in_submodule || !key.trim().eq_ignore_ascii_case("path") {
            continue;
        }
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        let path = PathBuf::from(value);
        let plain = path
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !value.is_empty() && plain {
            out.push(path);
        }
    }
    out
}

/// H2: a root's top must not become a git directory. If it already is one (`HEAD`, `objects/`,
/// `refs/` all present), those and what git runs from (`config`, `hooks`, `commondir`) are
/// protected; otherwise the markers that are absent are guarded like missing protected names —
/// only `HEAD` while `HEAD` is absent (git needs it first), so a project may still have an
/// `objects/` or `refs/` directory of its own.
fn git_dir_markers(
    root: &Path,
    roots: &[PathBuf],
    protected: &mut Vec<PathBuf>,
    missing: &mut Vec<PathBuf>,
) -> Result<(), PolicyError> {
    let mut present = Vec::new();
    for name in GIT_DIR_MARKERS {
        let path = root.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                check_symlink(&path, &path, roots)?;
                present.push(name);
            }
            Ok(_) => present.push(name),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(inspect(&path, e)),
        }
    }
    if present.len() == GIT_DIR_MARKERS.len() {
        for name in GIT_DIR_MARKERS.iter().chain(&GIT_DIR_SENSITIVE) {
            let path = root.join(name);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => check_symlink(&path, &path, roots)?,
                Ok(_) => protected.push(path),
                Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(path),
                Err(e) => return Err(inspect(&path, e)),
            }
        }
        return Ok(());
    }
    if !present.contains(&"HEAD") {
        missing.push(root.join("HEAD"));
        return Ok(());
    }
    // A `HEAD` of the project's own: guard what would complete it (`commondir` supplies
    // `objects/` and `refs/` from elsewhere).
    for name in ["objects", "refs", "commondir"] {
        if !present.contains(&name) {
            let path = root.join(name);
            if std::fs::symlink_metadata(&path).is_err() {
                missing.push(path);
            }
        }
    }
    Ok(())
}

/// For a `.git` file (`gitdir: <path>`): the resolved gitdir and its `commondir` that exist, and
/// the first missing component of each that does not (guarded like a missing protected name,
/// so the sandbox cannot create the gitdir a host `git` would then trust; H2).
fn gitdir_paths(
    root: &Path,
    git_file: &Path,
    roots: &[PathBuf],
) -> Result<(Vec<PathBuf>, Vec<PathBuf>), PolicyError> {
    let content = read_pointer_file(git_file).map_err(|e| inspect(git_file, e))?;
    let Some(target) = content
        .lines()
        .find_map(|l| l.strip_prefix("gitdir:"))
        .map(str::trim)
        .filter(|t| !t.is_empty())
    else {
        // Not a gitdir pointer: the file itself is protected, and there is nothing more.
        return Ok((Vec::new(), Vec::new()));
    };

    let mut exists = Vec::new();
    let mut absent = Vec::new();
    let gitdir = match resolve_checked(root, Path::new(target), roots)? {
        Resolved::Exists(p) => p,
        Resolved::Missing(first) => {
            absent.push(first);
            return Ok((exists, absent));
        }
    };
    exists.push(gitdir.clone());

    // Hooks and config of a linked worktree live in the common directory (§2.3).
    let commondir_file = gitdir.join("commondir");
    match read_pointer_file(&commondir_file) {
        Ok(text) => {
            let common = text.trim();
            if !common.is_empty() {
                match resolve_checked(&gitdir, Path::new(common), roots)? {
                    Resolved::Exists(dir) => exists.push(dir),
                    Resolved::Missing(first) => absent.push(first),
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(inspect(&commondir_file, e)),
    }
    Ok((exists, absent))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::roots::build_policy;
    use crate::sandbox::roots::tests::{Scratch, params};
    use std::os::unix::fs::symlink;

    #[test]
    fn protected_and_missing_names() {
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        s.dir("cwd/.git/hooks");
        std::fs::write(cwd.join(".codex"), "x").unwrap();
        // Nested repositories are ordinary content.
        s.dir("cwd/vendor/x/.git");
        let policy = build_policy(&params(&cwd)).unwrap();
        assert_eq!(
            policy.protected_paths,
            vec![cwd.join(".git"), cwd.join(".codex")]
        );
        // No `HEAD` at the top: git could be made to see the root as a git dir (H2).
        assert_eq!(
            policy.protected_missing,
            vec![cwd.join(".agents"), cwd.join(".aws"), cwd.join("HEAD")]
        );
    }

    #[test]
    fn gitdir_file_and_commondir_are_protected() {
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        let main_git = s.dir("main/.git");
        let wt = s.dir("main/.git/worktrees/wt");
        std::fs::write(wt.join("commondir"), "../..\n").unwrap();
        // Relative gitdir, resolved against the root.
        std::fs::write(cwd.join(".git"), "gitdir: ../main/.git/worktrees/wt\n").unwrap();
        let policy = build_policy(&params(&cwd)).unwrap();
        assert_eq!(
            policy.protected_paths,
            vec![cwd.join(".git"), wt.clone(), main_git.clone()]
        );
        // Absolute gitdir without commondir.
        std::fs::remove_file(wt.join("commondir")).unwrap();
        std::fs::write(cwd.join(".git"), format!("gitdir: {}\n", wt.display())).unwrap();
        let policy = build_policy(&params(&cwd)).unwrap();
        assert_eq!(policy.protected_paths, vec![cwd.join(".git"), wt]);
    }

    #[test]
    fn explicit_root_overrides_protection() {
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        let git = s.dir("cwd/.git");
        let wt = s.dir("cwd/.git/worktrees/wt");
        let mut p = params(&cwd);
        p.writable_roots = vec![git.clone(), wt.clone()];
        let policy = build_policy(&p).unwrap();
        assert_eq!(policy.writable_roots, vec![git.clone(), wt, cwd.clone()]);
        // `.git` is a root itself, so it is not re-protected.
        assert!(!policy.protected_paths.contains(&git));
        assert!(policy.protected_missing.contains(&cwd.join(".codex")));
    }

    /// H2: a root's top is never allowed to become a git directory.
    #[test]
    fn git_dir_markers_are_guarded_or_protected() {
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        // A project with an `objects/` directory of its own: only `HEAD` is guarded.
        s.dir("cwd/objects");
        let policy = build_policy(&params(&cwd)).unwrap();
        assert!(policy.protected_missing.contains(&cwd.join("HEAD")));
        assert!(!policy.protected_missing.contains(&cwd.join("refs")));
        // A `HEAD` of its own: what would complete a git dir is guarded instead.
        std::fs::write(cwd.join("HEAD"), "not git\n").unwrap();
        let policy = build_policy(&params(&cwd)).unwrap();
        for name in ["refs", "commondir"] {
            assert!(policy.protected_missing.contains(&cwd.join(name)), "{name}");
        }
        assert!(!policy.protected_paths.contains(&cwd.join("HEAD")));
        // Already a git dir (a bare repository as the cwd): its parts are read-only.
        s.dir("cwd/refs");
        s.dir("cwd/hooks");
        let policy = build_policy(&params(&cwd)).unwrap();
        for name in ["HEAD", "objects", "refs", "hooks"] {
            assert!(policy.protected_paths.contains(&cwd.join(name)), "{name}");
        }
        assert!(policy.protected_missing.contains(&cwd.join("config")));
    }

    /// H2: a `.git` file whose gitdir does not exist guards the gitdir's first missing part;
    /// H5: pointer files are read bounded, never from a FIFO or a device.
    #[test]
    fn missing_gitdir_is_guarded_and_pointer_files_are_bounded() {
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        let other = s.dir("other");
        let mut p = params(&cwd);
        p.writable_roots = vec![other.clone()];
        std::fs::write(
            cwd.join(".git"),
            format!("gitdir: {}\n", other.join("g/wt").display()),
        )
        .unwrap();
        let policy = build_policy(&p).unwrap();
        assert!(policy.protected_missing.contains(&other.join("g")));

        // A FIFO as commondir: refused at once, never blocking.
        let g = s.dir("other/g");
        nix::unistd::mkfifo(&g.join("commondir"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::fs::write(cwd.join(".git"), format!("gitdir: {}\n", g.display())).unwrap();
        let started = std::time::Instant::now();
        let err = build_policy(&p).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        assert!(err.to_string().contains("not a regular file"), "{err}");
        // A symlink to /dev/zero: not followed.
        std::fs::remove_file(g.join("commondir")).unwrap();
        symlink("/dev/zero", g.join("commondir")).unwrap();
        assert!(matches!(build_policy(&p), Err(PolicyError::Inspect { .. })));
        // A huge `.git` file: refused without reading it.
        std::fs::remove_file(g.join("commondir")).unwrap();
        let f = std::fs::File::create(cwd.join(".git")).unwrap();
        f.set_len(1 << 32).unwrap();
        let err = build_policy(&p).unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");
    }

    #[test]
    fn submodule_paths_are_read_from_submodule_sections_only() {
        let text = "[core]\n\tpath = nope\n[submodule \"a\"]\n\tpath = libs/a\n\turl = x\n\
                    [submodule \"b\"]\n  PATH = \"b c\"\n[submodule \"up\"]\n\tpath = ../up\n\
                    [submodule \"abs\"]\n\tpath = /etc\n[submodule \"e\"]\n\tpath =\n";
        assert_eq!(
            submodule_paths(text),
            [PathBuf::from("libs/a"), PathBuf::from("b c")]
        );
    }
}
