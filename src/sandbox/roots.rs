//! Writable roots and protected paths: turning a session's parameters into the effective
//! [`SandboxPolicy`] (spec/sandbox.md §2.2 and §2.3).
//!
//! This runs in the daemon at `OpenSession`, before any worker exists, so every refusal here is a
//! clean error returned to the client (never a panic, never a half-built sandbox). The worker later
//! trusts the lists computed here: `writable_roots` are bound read-write, `protected_paths` are
//! bound read-only on top of them, and `protected_missing` feeds the creation watcher (§3.3).

use crate::sandbox::policy::{Identity, Mode, ResourceLimits, SandboxPolicy};
use crate::sandbox::profile::WritableSource;
use std::collections::HashSet;
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};

/// The names protected at the top of every writable root (spec/sandbox.md §9), as Codex
/// 0.171 (the pinned release) protects them: its sandbox keeps `.git`, `.agents`, `.codex`
/// and `.aws` read-only at every project root (the last, since AWS tools run what a config
/// there names, e.g. `credential_process`).
pub const PROTECTED_NAMES: [&str; 4] = [".git", ".codex", ".agents", ".aws"];

const NOT_A_DIRECTORY: &str = "not a directory";

/// Symlink hops followed before giving up (the kernel's own limit is 40).
const MAX_SYMLINK_HOPS: usize = 40;

/// Largest `.git` or `commondir` file read (each holds one path). A bigger one is refused: it
/// is not what git writes, and a FIFO or `/dev/zero` planted there must cost nothing.
const MAX_POINTER_FILE_BYTES: usize = 4096;

/// The names that make a directory a git directory to git's discovery (`is_git_directory`):
/// `HEAD`, `objects/` and `refs/` — or `HEAD` plus a `commondir` naming where the other two
/// live. A writable root's top must never become one (spec/sandbox.md §8.6 H2).
const GIT_DIR_MARKERS: [&str; 3] = ["HEAD", "objects", "refs"];

/// What git reads from a git directory that could run code or redirect it (hooks, config
/// `core.fsmonitor`/`core.worktree`), protected when a root's top already is a git directory.
const GIT_DIR_SENSITIVE: [&str; 3] = ["config", "hooks", "commondir"];

/// What a client asked for when opening a session (spec/sandbox.md §1), plus the daemon-supplied
/// parts (mask list, identity, limits) that pass through unchanged.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionParams {
    pub mode: Mode,
    pub cwd: PathBuf,
    pub writable_roots: Vec<PathBuf>,
    pub network_access: bool,
    pub exclude_tmpdir_env_var: bool,
    pub exclude_slash_tmp: bool,
    /// The environment commands receive; `TMPDIR` is read from here, never from the daemon's own.
    pub env: Vec<(String, String)>,
    pub masked_paths: Vec<PathBuf>,
    pub identity: Option<Identity>,
    pub limits: ResourceLimits,
    /// Where writable roots come from, in order (the session's profile).
    pub writable_sources: Vec<WritableSource>,
    /// Names protected at the top of every writable root (the session's profile).
    pub protected_names: Vec<String>,
}

/// The standard workspace-write order of §2.2.
pub fn standard_writable_sources() -> Vec<WritableSource> {
    vec![
        WritableSource::SessionRoots,
        WritableSource::Cwd,
        WritableSource::SlashTmp,
        WritableSource::TmpdirEnv,
    ]
}

/// The standard protected names, as owned strings.
pub fn standard_protected_names() -> Vec<String> {
    PROTECTED_NAMES.iter().map(|n| n.to_string()).collect()
}

/// Why a policy could not be built. Every variant is a client-visible refusal of `OpenSession`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyError {
    /// The cwd does not exist or cannot be resolved (`INVALID_ARGUMENT`).
    Cwd { path: PathBuf, cause: String },
    /// A writable root exists but cannot be used (not a directory, unreadable, ...).
    InvalidRoot { path: PathBuf, cause: String },
    /// A protected path reaches, through a symlink, somewhere the sandbox can write, so a
    /// read-only mount could be sidestepped by swapping the link (§2.3).
    WritableSymlink { path: PathBuf, symlink: PathBuf },
    /// A protected path is named through `dir/..` with `dir` below a writable root: the kernel
    /// (and so the host's git) resolves `..` from wherever `dir` leads, and the sandbox can
    /// replace `dir` with a symlink (H9).
    WritableDotDot { path: PathBuf, dir: PathBuf },
    /// A protected path or `.git` file could not be inspected.
    Inspect { path: PathBuf, cause: String },
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Cwd { path, cause } if cause == NOT_A_DIRECTORY => {
                write!(f, "cwd {} is not a directory", path.display())
            }
            PolicyError::Cwd { path, cause } => {
                write!(f, "cwd {} is not usable: {cause}", path.display())
            }
            PolicyError::InvalidRoot { path, cause } => {
                write!(f, "writable root {} is not usable: {cause}", path.display())
            }
            PolicyError::WritableSymlink { path, symlink } => write!(
                f,
                "cannot enforce sandbox read-only path {} because it crosses writable symlink {}",
                path.display(),
                symlink.display()
            ),
            PolicyError::WritableDotDot { path, dir } => write!(
                f,
                "cannot enforce sandbox read-only path {} because it climbs out of writable \
                 directory {} with `..` (the sandbox could replace that directory with a \
                 symlink); name it without `..` below the writable root",
                path.display(),
                dir.display()
            ),
            PolicyError::Inspect { path, cause } => {
                write!(
                    f,
                    "cannot inspect protected path {}: {cause}",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for PolicyError {}

/// Computes the effective policy (spec/sandbox.md §2.2, §2.3).
///
/// Requested roots that do not exist are skipped and listed in `SandboxPolicy::skipped_roots`.
pub fn build_policy(params: &SessionParams) -> Result<SandboxPolicy, PolicyError> {
    let cwd = std::fs::canonicalize(&params.cwd).map_err(|e| PolicyError::Cwd {
        path: params.cwd.clone(),
        cause: e.to_string(),
    })?;
    if !cwd.is_dir() {
        return Err(PolicyError::Cwd {
            path: params.cwd.clone(),
            cause: NOT_A_DIRECTORY.into(),
        });
    }

    let mut policy = SandboxPolicy {
        mode: params.mode,
        cwd: cwd.clone(),
        writable_roots: Vec::new(),
        protected_paths: Vec::new(),
        protected_missing: Vec::new(),
        // DFA always has the host network (§2.1).
        network: params.mode == Mode::DangerFullAccess || params.network_access,
        masked_paths: dedup(params.masked_paths.clone()),
        identity: params.identity.clone(),
        limits: params.limits.clone(),
        skipped_roots: Vec::new(),
        root_ids: Vec::new(),
        protected_names: params.protected_names.clone(),
        sandbox_generation: 0,
    };

    // RO and DFA have no writable roots, hence nothing to protect inside them.
    if params.mode != Mode::WorkspaceWrite {
        return Ok(policy);
    }

    let (roots, skipped) = writable_roots(params, &cwd)?;
    let (protected, missing) = protected_paths(&roots, &params.protected_names)?;
    policy.root_ids = roots
        .iter()
        .map(|r| {
            pin(r).map_err(|e| PolicyError::InvalidRoot {
                path: r.clone(),
                cause: e.to_string(),
            })
        })
        .collect::<Result<_, _>>()?;
    policy.writable_roots = roots;
    policy.skipped_roots = skipped;
    policy.protected_paths = protected;
    policy.protected_missing = missing;
    Ok(policy)
}

/// The candidate roots in the order of §2.2, canonicalised and deduplicated; missing ones are
/// returned separately so the daemon can report them.
fn writable_roots(
    params: &SessionParams,
    cwd: &Path,
) -> Result<(Vec<PathBuf>, Vec<PathBuf>), PolicyError> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    for source in &params.writable_sources {
        match source {
            WritableSource::SessionRoots => {
                // A relative root can only sensibly mean "relative to the session's cwd".
                candidates.extend(params.writable_roots.iter().map(|r| {
                    if r.is_absolute() {
                        r.clone()
                    } else {
                        cwd.join(r)
                    }
                }));
            }
            WritableSource::Cwd => candidates.push(cwd.to_path_buf()),
            WritableSource::SlashTmp => {
                if !params.exclude_slash_tmp && Path::new("/tmp").is_dir() {
                    candidates.push(PathBuf::from("/tmp"));
                }
            }
            WritableSource::TmpdirEnv => {
                if !params.exclude_tmpdir_env_var {
                    // The last assignment wins, as it would for the command's own getenv.
                    let tmpdir = params
                        .env
                        .iter()
                        .rev()
                        .find(|(k, _)| k == "TMPDIR")
                        .map(|(_, v)| v.as_str());
                    if let Some(dir) = tmpdir.filter(|d| !d.is_empty())
                        && Path::new(dir).is_dir()
                    {
                        candidates.push(PathBuf::from(dir));
                    }
                }
            }
            WritableSource::Path(p) => candidates.push(p.clone()),
        }
    }

    let mut roots = Vec::new();
    let mut skipped = Vec::new();
    let mut seen = HashSet::new();
    for candidate in candidates {
        let canonical = match std::fs::canonicalize(&candidate) {
            Ok(c) => c,
            // A missing directory grants nothing; skip it but say so (§2.2).
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !skipped.contains(&candidate) {
                    skipped.push(candidate);
                }
                continue;
            }
            Err(e) => {
                return Err(PolicyError::InvalidRoot {
                    path: candidate,
                    cause: e.to_string(),
                });
            }
        };
        if !canonical.is_dir() {
            return Err(PolicyError::InvalidRoot {
                path: candidate,
                cause: "not a directory".into(),
            });
        }
        if seen.insert(canonical.clone()) {
            roots.push(canonical);
        }
    }
    Ok((roots, skipped))
}

/// The identity a writable root is pinned by: `(st_dev, st_ino)` of the directory itself.
pub fn pin(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

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
    // nested inside a protected path is handled by the mount order in namespaces.rs.)
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
    let (exists, absent) = super::git_exec::executed_paths(worktree, &gitdirs, roots)?;
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
    let text =
        read_small_file(&list, super::git_exec::MAX_CONFIG_BYTES).map_err(|e| inspect(&list, e))?;
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

/// Reads a small pointer file (`.git`, `commondir`) without trusting it: no symlink followed,
/// never blocking (a FIFO), regular files only, at most [`MAX_POINTER_FILE_BYTES`].
pub(super) fn read_pointer_file(path: &Path) -> io::Result<String> {
    read_small_file(path, MAX_POINTER_FILE_BYTES)
}

/// A regular file's text, its last component not followed, never blocking (a FIFO), at most
/// `max` bytes (more is an error, not a truncation).
pub(super) fn read_small_file(path: &Path, max: usize) -> io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let mut buf = Vec::with_capacity(256);
    file.take(max as u64 + 1).read_to_end(&mut buf)?;
    if buf.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        ));
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
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

/// The outcome of resolving a gitdir pointer.
pub(super) enum Resolved {
    /// The canonical path of an existing target.
    Exists(PathBuf),
    /// The target does not exist; this is its first missing component (canonical parent).
    Missing(PathBuf),
}

/// Resolves `rel` against the canonical directory `base` one component at a time, refusing any
/// symlink on the way whose target lies inside a writable root.
pub(super) fn resolve_checked(
    base: &Path,
    rel: &Path,
    roots: &[PathBuf],
) -> Result<Resolved, PolicyError> {
    let requested = base.join(rel);
    let mut current = if rel.is_absolute() {
        PathBuf::from("/")
    } else {
        base.to_path_buf()
    };
    // How many directories this walk went down into (not `base`'s own ancestors, which are
    // canonical and fixed): `..` out of one below a writable root is refused.
    let mut descended = 0usize;
    for component in rel.components() {
        match component {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            // `current` is canonical, so popping is exact — today. A directory this walk
            // entered that lies below a writable root (and is not a root, which is pinned)
            // could become a symlink, and then the kernel's `..` leads elsewhere.
            Component::ParentDir => {
                if descended > 0 {
                    descended -= 1;
                    if inside_any(&current, roots) && !roots.contains(&current) {
                        return Err(PolicyError::WritableDotDot {
                            path: requested,
                            dir: current,
                        });
                    }
                }
                current.pop();
            }
            Component::Normal(name) => {
                let next = current.join(name);
                let meta = match std::fs::symlink_metadata(&next) {
                    Ok(m) => m,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        return Ok(Resolved::Missing(next));
                    }
                    Err(e) => return Err(inspect(&next, e)),
                };
                if meta.file_type().is_symlink() {
                    check_symlink(&requested, &next, roots)?;
                    current = match std::fs::canonicalize(&next) {
                        Ok(c) => c,
                        // Dangling into somewhere outside every root (checked above): the
                        // sandbox cannot create it, so there is nothing to guard.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {
                            return Ok(Resolved::Missing(next));
                        }
                        Err(e) => return Err(inspect(&next, e)),
                    };
                } else {
                    current = next;
                }
                descended += 1;
            }
        }
    }
    Ok(Resolved::Exists(current))
}

/// Follows the symlink `link` hop by hop; if any hop (or the final target) lies inside a writable
/// root, the protection of `protected` could be sidestepped and the session is refused.
fn check_symlink(protected: &Path, link: &Path, roots: &[PathBuf]) -> Result<(), PolicyError> {
    let refuse = || PolicyError::WritableSymlink {
        path: protected.to_path_buf(),
        symlink: link.to_path_buf(),
    };
    let mut at = link.to_path_buf();
    for _ in 0..MAX_SYMLINK_HOPS {
        let target = std::fs::read_link(&at).map_err(|e| inspect(&at, e))?;
        let parent = at.parent().unwrap_or(Path::new("/"));
        let lexical = normalize(&parent.join(&target));
        // Check both the literal and the resolved location: a directory symlink in the target's
        // own path could lead into a root either way.
        let resolved = canonicalize_lenient(&lexical);
        if inside_any(&lexical, roots) || inside_any(&resolved, roots) {
            return Err(refuse());
        }
        match std::fs::symlink_metadata(&resolved) {
            Ok(m) if m.file_type().is_symlink() => at = resolved,
            _ => return Ok(()),
        }
    }
    // A loop this long is either malicious or broken; neither can be protected.
    Err(refuse())
}

pub(super) fn inside_any(path: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|r| path.starts_with(r))
}

/// Lexically removes `.` and `..` (used only for symlink targets before they are resolved).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// Canonicalises the longest existing ancestor of `path` and appends the rest, so a dangling
/// target still yields the place the sandbox could create it.
fn canonicalize_lenient(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    loop {
        // The last component is resolved too (canonicalize follows it), which is what we want
        // for the "final target" check.
        if let Ok(c) = std::fs::canonicalize(&existing) {
            let mut out = c;
            out.extend(rest.iter().rev());
            return out;
        }
        match (
            existing.file_name().map(|n| n.to_os_string()),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

pub(super) fn inspect(path: &Path, e: io::Error) -> PolicyError {
    PolicyError::Inspect {
        path: path.to_path_buf(),
        cause: e.to_string(),
    }
}

fn dedup(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut seen = HashSet::new();
    paths
        .into_iter()
        .filter(|p| seen.insert(p.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh scratch directory, canonical, removed on drop.
    struct Scratch(PathBuf);
    impl Scratch {
        fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "corral-roots-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Scratch(std::fs::canonicalize(&p).unwrap())
        }
        fn dir(&self, rel: &str) -> PathBuf {
            let p = self.0.join(rel);
            std::fs::create_dir_all(&p).unwrap();
            p
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn params(cwd: &Path) -> SessionParams {
        SessionParams {
            mode: Mode::WorkspaceWrite,
            cwd: cwd.to_path_buf(),
            writable_roots: Vec::new(),
            network_access: false,
            exclude_tmpdir_env_var: false,
            exclude_slash_tmp: true,
            env: Vec::new(),
            masked_paths: Vec::new(),
            identity: None,
            limits: ResourceLimits::default(),
            writable_sources: standard_writable_sources(),
            protected_names: standard_protected_names(),
        }
    }

    #[test]
    fn roots_are_ordered_canonical_and_deduplicated() {
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        let extra = s.dir("extra");
        let tmpdir = s.dir("tmpdir");
        symlink(&extra, s.0.join("extra-link")).unwrap();
        let mut p = params(&cwd);
        p.exclude_slash_tmp = false;
        // The link and a `..` spelling both canonicalise to `extra`; cwd listed explicitly too.
        p.writable_roots = vec![s.0.join("extra-link"), cwd.join("../extra"), cwd.clone()];
        p.env = vec![("TMPDIR".into(), tmpdir.to_string_lossy().into_owned())];
        let policy = build_policy(&p).unwrap();
        let tmp = std::fs::canonicalize("/tmp").unwrap();
        assert_eq!(policy.writable_roots, vec![extra, cwd.clone(), tmp, tmpdir]);
        assert!(policy.skipped_roots.is_empty());
        assert_eq!(policy.cwd, cwd);
        assert!(!policy.network);
    }

    #[test]
    fn exclusions_and_empty_tmpdir() {
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        let tmpdir = s.dir("tmpdir");
        let mut p = params(&cwd);
        p.exclude_slash_tmp = true;
        p.exclude_tmpdir_env_var = true;
        p.env = vec![("TMPDIR".into(), tmpdir.to_string_lossy().into_owned())];
        assert_eq!(build_policy(&p).unwrap().writable_roots, vec![cwd.clone()]);
        p.exclude_tmpdir_env_var = false;
        p.env = vec![("TMPDIR".into(), String::new())];
        assert_eq!(build_policy(&p).unwrap().writable_roots, vec![cwd.clone()]);
        // A TMPDIR that is not a directory is ignored, not skipped (§2.2 item 4).
        p.env = vec![(
            "TMPDIR".into(),
            s.0.join("nope").to_string_lossy().into_owned(),
        )];
        let policy = build_policy(&p).unwrap();
        assert_eq!(policy.writable_roots, vec![cwd]);
        assert!(policy.skipped_roots.is_empty());
    }

    #[test]
    fn missing_root_is_skipped_and_reported() {
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        let existing = s.dir("existing");
        let missing = s.0.join("missing");
        let mut p = params(&cwd);
        p.writable_roots = vec![existing.clone(), missing.clone()];
        let policy = build_policy(&p).unwrap();
        assert_eq!(policy.writable_roots, vec![existing, cwd]);
        assert_eq!(policy.skipped_roots, vec![missing]);
    }

    #[test]
    fn missing_cwd_is_an_error() {
        let s = Scratch::new();
        let err = build_policy(&params(&s.0.join("nope"))).unwrap_err();
        assert!(matches!(err, PolicyError::Cwd { .. }), "{err}");
    }

    #[test]
    fn read_only_and_full_access_have_no_roots() {
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        s.dir("cwd/.git");
        let mut p = params(&cwd);
        p.writable_roots = vec![s.dir("extra")];
        for (mode, network) in [(Mode::ReadOnly, false), (Mode::DangerFullAccess, true)] {
            p.mode = mode;
            let policy = build_policy(&p).unwrap();
            assert!(policy.writable_roots.is_empty());
            assert!(policy.protected_paths.is_empty());
            assert!(policy.protected_missing.is_empty());
            assert_eq!(policy.network, network);
        }
    }

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
    fn symlinked_codex_into_root_is_refused() {
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        s.dir("cwd/decoy");
        symlink("decoy", cwd.join(".codex")).unwrap();
        let err = build_policy(&params(&cwd)).unwrap_err();
        let path = cwd.join(".codex");
        assert_eq!(
            err.to_string(),
            format!(
                "cannot enforce sandbox read-only path {} because it crosses writable symlink {}",
                path.display(),
                path.display()
            )
        );
        // Dangling into the root is just as swappable.
        std::fs::remove_dir(cwd.join("decoy")).unwrap();
        assert!(matches!(
            build_policy(&params(&cwd)),
            Err(PolicyError::WritableSymlink { .. })
        ));
    }

    #[test]
    fn symlink_outside_roots_needs_nothing() {
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        let outside = s.dir("outside-codex");
        symlink(&outside, cwd.join(".codex")).unwrap();
        let policy = build_policy(&params(&cwd)).unwrap();
        assert!(policy.protected_paths.is_empty());
        assert_eq!(
            policy.protected_missing,
            vec![
                cwd.join(".git"),
                cwd.join(".agents"),
                cwd.join(".aws"),
                cwd.join("HEAD")
            ]
        );
        // ...unless a later hop leads back into a root.
        let other = s.dir("other");
        std::fs::remove_dir(&outside).unwrap();
        symlink(other.join("target"), &outside).unwrap();
        let mut p = params(&cwd);
        p.writable_roots = vec![other];
        assert!(matches!(
            build_policy(&p),
            Err(PolicyError::WritableSymlink { .. })
        ));
    }

    #[test]
    fn gitdir_through_writable_symlink_is_refused() {
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        let r2 = s.dir("r2");
        s.dir("r2/real/wt");
        // `outside/link` is not in a root, but points into r2, which is.
        s.dir("outside");
        symlink(r2.join("real"), s.0.join("outside/link")).unwrap();
        std::fs::write(
            cwd.join(".git"),
            format!("gitdir: {}\n", s.0.join("outside/link/wt").display()),
        )
        .unwrap();
        let mut p = params(&cwd);
        p.writable_roots = vec![r2];
        match build_policy(&p) {
            Err(PolicyError::WritableSymlink { path, symlink }) => {
                assert_eq!(path, s.0.join("outside/link/wt"));
                assert_eq!(symlink, s.0.join("outside/link"));
            }
            other => panic!("expected a symlink refusal, got {other:?}"),
        }
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

    #[test]
    fn roots_are_pinned_by_device_and_inode() {
        use std::os::unix::fs::MetadataExt;
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        let policy = build_policy(&params(&cwd)).unwrap();
        let meta = std::fs::metadata(&cwd).unwrap();
        assert_eq!(policy.root_ids, vec![(meta.dev(), meta.ino())]);
    }
}
