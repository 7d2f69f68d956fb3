//! Writable roots and protected paths: turning a session's parameters into the effective
//! [`SandboxPolicy`] (spec/sandbox.md §2.2 and §2.3).
//!
//! This runs in the daemon at `OpenSession`, before any worker exists, so every refusal here is a
//! clean error returned to the client (never a panic, never a half-built sandbox). The worker later
//! trusts the lists computed here: `writable_roots` are bound read-write, `protected_paths` are
//! bound read-only on top of them, and `protected_missing` feeds the creation watcher (§3.3).
//!
//! This file turns parameters into the policy: the session's parameters, the writable roots in
//! the order of §2.2, their pinned identities, and the refusals. Its parts:
//! - `protected`: the protected and guarded paths of every root (§2.3, H2, H20, H28): the
//!   protected names, what a `.git` leads to, submodules, linked worktrees, git-dir markers;
//! - `resolve`: reading pointer files and resolving the paths they name without trusting
//!   anything the sandbox can change (symlinks into a root, `..` out of one).

use crate::sandbox::policy::{Identity, Mode, ResourceLimits, SandboxPolicy};
use crate::sandbox::profile::WritableSource;
use std::collections::HashSet;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

mod protected;
mod resolve;

pub use protected::protected_paths;
pub(super) use resolve::{Resolved, inside_any, inspect, read_small_file, resolve_checked};

#[cfg(test)]
/// The names protected at the top of every writable root (spec/sandbox.md §9), as Codex
/// 0.171 (the pinned release) protects them: its sandbox keeps `.git`, `.agents`, `.codex`
/// and `.aws` read-only at every project root (the last, since AWS tools run what a config
/// there names, e.g. `credential_process`).
pub const PROTECTED_NAMES: [&str; 4] = [".git", ".codex", ".agents", ".aws"];

const NOT_A_DIRECTORY: &str = "not a directory";

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

#[cfg(test)]
/// The standard workspace-write order of §2.2.
pub fn standard_writable_sources() -> Vec<WritableSource> {
    vec![
        WritableSource::SessionRoots,
        WritableSource::Cwd,
        WritableSource::SlashTmp,
        WritableSource::TmpdirEnv,
    ]
}

#[cfg(test)]
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
        egress: None,
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
    use crate::sandbox::testutil::TempDir;
    use std::os::unix::fs::symlink;

    /// A fresh scratch directory ([`TempDir`]: canonical, removed on drop), with a helper that
    /// makes directories in it. Shared with the parts' tests (`protected`, `resolve`).
    pub(super) struct Scratch(TempDir);
    impl Scratch {
        pub(super) fn new() -> Self {
            Scratch(TempDir::new("roots"))
        }
        pub(super) fn path(&self) -> &Path {
            self.0.path()
        }
        pub(super) fn dir(&self, rel: &str) -> PathBuf {
            let p = self.path().join(rel);
            std::fs::create_dir_all(&p).unwrap();
            p
        }
    }

    pub(super) fn params(cwd: &Path) -> SessionParams {
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
        symlink(&extra, s.path().join("extra-link")).unwrap();
        let mut p = params(&cwd);
        p.exclude_slash_tmp = false;
        // The link and a `..` spelling both canonicalise to `extra`; cwd listed explicitly too.
        p.writable_roots = vec![
            s.path().join("extra-link"),
            cwd.join("../extra"),
            cwd.clone(),
        ];
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
            s.path().join("nope").to_string_lossy().into_owned(),
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
        let missing = s.path().join("missing");
        let mut p = params(&cwd);
        p.writable_roots = vec![existing.clone(), missing.clone()];
        let policy = build_policy(&p).unwrap();
        assert_eq!(policy.writable_roots, vec![existing, cwd]);
        assert_eq!(policy.skipped_roots, vec![missing]);
    }

    #[test]
    fn missing_cwd_is_an_error() {
        let s = Scratch::new();
        let err = build_policy(&params(&s.path().join("nope"))).unwrap_err();
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
    fn roots_are_pinned_by_device_and_inode() {
        use std::os::unix::fs::MetadataExt;
        let s = Scratch::new();
        let cwd = s.dir("cwd");
        let policy = build_policy(&params(&cwd)).unwrap();
        let meta = std::fs::metadata(&cwd).unwrap();
        assert_eq!(policy.root_ids, vec![(meta.dev(), meta.ino())]);
    }
}
