//! Where a write may go, and the directory it goes in.
//!
//! A session's destination is checked exactly like an apply_patch target: the path is resolved
//! as the kernel would walk it (symlinks on the way followed, the final name not), and the result
//! must lie inside a writable root and outside every protected path; a read-only session writes
//! nothing. Then the parent directory is opened component by component from `/` with
//! `O_NOFOLLOW`, so what is held open is exactly the directory that was checked — a symlink
//! swapped in meanwhile makes the call fail instead of redirecting it. Every later step acts on
//! that descriptor.
//!
//! At or below the worker's pinned working directory (spec/sandbox.md H24) the path is resolved
//! from that directory (as apply_patch resolves it) and the parent is opened from its descriptor,
//! not from `/`: a swapped parent of the directory redirects nothing.

use super::fsx::{self, Node};
use super::{Kind, sys_error};
use crate::tools::apply_patch::{PatchContext, canonical_or_self, resolve_target};
use crate::tools::shell::pinned_cwd::{beneath, from_pinned, fs_path};
use crate::tools::{ErrorKind, ToolError};
use nix::errno::Errno;
use nix::sys::stat::{Mode, fchmod, mkdirat};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// The parent directory (held open) and the name a write lands at.
#[derive(Debug)]
pub struct Destination {
    pub(super) parent: OwnedFd,
    pub(super) name: OsString,
    /// The destination's path, for answers and messages.
    pub path: PathBuf,
}

/// What exists at a destination now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Existing {
    pub node: Node,
    /// Its permission bits.
    pub mode: u32,
}

impl Existing {
    /// Whether a transfer of `kind` may replace it: a directory a directory, anything else
    /// anything else (a symlink there is replaced itself, never followed).
    pub fn replaceable_by(&self, kind: Kind) -> bool {
        (self.node == Node::Directory) == (kind == Kind::Directory)
    }

    pub fn noun(&self) -> &'static str {
        match self.node {
            Node::File => "a file",
            Node::Directory => "a directory",
            Node::Symlink => "a symlink",
            Node::Other(what) => what,
        }
    }
}

impl Destination {
    /// What is at the destination now, if anything.
    pub fn existing(&self) -> Result<Option<Existing>, ToolError> {
        match fsx::lstat_at(&self.parent, &self.name) {
            Ok(st) => Ok(Some(Existing {
                node: fsx::node_of(&st),
                mode: st.st_mode & 0o777,
            })),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(sys_error("cannot inspect", &self.path, e)),
        }
    }

    /// A destination on the caller's own side (the CLI's download): no sandbox rules, symlinks
    /// on the way followed as any program would; the final name is still never followed.
    pub fn local(path: &Path) -> Result<Destination, ToolError> {
        let name = final_name(path)?;
        let parent_path = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let parent = nix::fcntl::open(
            &parent_path,
            nix::fcntl::OFlag::O_RDONLY
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| sys_error("cannot open directory", &parent_path, e))?;
        Ok(Destination {
            parent,
            name,
            path: path.to_path_buf(),
        })
    }
}

/// The last component of `path`, which must be a name (not `/`, `.` or `..`).
fn final_name(path: &Path) -> Result<OsString, ToolError> {
    match path.components().next_back() {
        Some(Component::Normal(name)) => Ok(name.to_os_string()),
        _ => Err(ToolError::invalid(format!(
            "the destination {} must end in a name (not `/`, `.` or `..`)",
            path.display()
        ))),
    }
}

/// A single path component: a name, not `.`, `..` or empty, without `/`.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// Resolves a session's write destination: `path` (absolute or relative to the cwd), or
/// `path/source_name` when `path` is an existing directory and `source_name` is set (cp's
/// rule). Checks it against the session's rules and opens its parent, creating missing parents
/// (0755) when asked.
pub fn for_write(
    rules: &PatchContext,
    path: &str,
    source_name: &str,
    create_parents: bool,
) -> Result<Destination, ToolError> {
    if rules.read_only {
        return Err(ToolError::new(
            ErrorKind::PermissionDenied,
            "this session is read-only: it may not write files; open a workspace-write session \
             to upload or write",
        ));
    }
    if path.is_empty() {
        return Err(ToolError::invalid("path is required"));
    }
    if path.contains('\0') {
        return Err(ToolError::invalid("path contains a NUL byte"));
    }
    if !source_name.is_empty() && !valid_name(source_name) {
        return Err(ToolError::invalid(format!(
            "source_name `{source_name}` must be a single name (no `/`, not `.` or `..`)"
        )));
    }
    let full = rules.cwd.join(path);
    let resolve = |p: &Path, follow_last: bool| {
        resolve_target(p, follow_last).map_err(|e| super::io_error("cannot resolve", p, e))
    };
    // cp's rule: an existing directory (or a symlink to one) receives the source inside it.
    let (parent, name, shown) = match (!source_name.is_empty())
        .then(|| resolve(&full, true))
        .transpose()?
        .filter(|dir| std::fs::metadata(fs_path(dir)).is_ok_and(|m| m.is_dir()))
    {
        Some(dir) => (dir, OsString::from(source_name), full.join(source_name)),
        // The pinned directory itself: named as it is, never by walking its parent (which may
        // have been swapped); the checks below refuse it when it is a root, and otherwise its
        // parent is opened from `/` without following a link.
        None if beneath(&full)
            .is_some_and(|(_, rest)| rest.components().all(|c| c == Component::CurDir)) =>
        {
            let (pinned, _) = beneath(&full).unwrap_or((Path::new("/"), Path::new("")));
            let name = final_name(pinned)?;
            let parent = pinned.parent().unwrap_or(Path::new("/")).to_path_buf();
            (parent, name, full.clone())
        }
        None => {
            let name = final_name(&full)?;
            let parent = full.parent().unwrap_or(Path::new("/"));
            (resolve(parent, true)?, name, full.clone())
        }
    };
    let target = parent.join(&name);
    check_target(rules, &target, &shown)?;
    let parent = open_parent(&parent, create_parents)?;
    Ok(Destination {
        parent,
        name,
        path: target,
    })
}

/// The session's rules for one resolved target (`shown` is the path as the caller named it).
fn check_target(rules: &PatchContext, target: &Path, shown: &Path) -> Result<(), ToolError> {
    let denied = |text: String| ToolError::new(ErrorKind::PermissionDenied, text);
    let roots: Vec<PathBuf> = rules
        .writable_roots
        .iter()
        .map(|r| canonical_or_self(r))
        .collect();
    let listed = || {
        roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let containing: Vec<&PathBuf> = roots.iter().filter(|r| target.starts_with(r)).collect();
    if containing.is_empty() {
        return Err(denied(format!(
            "{} is outside the session's writable roots ({}); the sandbox lets it write only there",
            shown.display(),
            listed()
        )));
    }
    let protected: Vec<PathBuf> = containing
        .iter()
        .flat_map(|root| rules.protected_names.iter().map(move |n| root.join(n)))
        .chain(
            rules
                .protected_paths
                .iter()
                .flat_map(|p| protected_spellings(p)),
        )
        .collect();
    if let Some(p) = protected.iter().find(|p| target.starts_with(p)) {
        return Err(denied(format!(
            "{} is protected workspace metadata ({}): the sandbox keeps it read-only and blocks \
             its creation, and so does every write of this session",
            shown.display(),
            p.display()
        )));
    }
    // Replacing a directory moves everything below it: never a root or a protected path.
    if let Some(p) = roots
        .iter()
        .chain(&protected)
        .find(|p| p.starts_with(target))
    {
        return Err(denied(format!(
            "{} is or contains {}, a writable root or protected path of this session, which a \
             transfer may not replace",
            shown.display(),
            p.display()
        )));
    }
    Ok(())
}

/// A protected path as given, resolved as a root is, and, beside the pinned working directory,
/// resolved from it (where `..` from the cwd really reaches after a parent was swapped; the
/// same spellings apply_patch compares with).
fn protected_spellings(p: &Path) -> Vec<PathBuf> {
    let mut out = vec![p.to_path_buf(), canonical_or_self(p)];
    if let Some(real) = from_pinned(p).and_then(|q| resolve_target(&q, true).ok()) {
        out.push(real);
    }
    out
}

/// Opens the resolved directory `dir` from `/` (from the pinned working directory's descriptor
/// when `dir` is it or lies below it), one component at a time, never through a symlink;
/// creates missing components (0755) when asked.
fn open_parent(dir: &Path, create: bool) -> Result<OwnedFd, ToolError> {
    // At or below the pinned working directory: from its descriptor (H24).
    let (start, rest) = beneath(dir).unwrap_or((Path::new("/"), dir));
    let mut fd = nix::fcntl::open(&*fs_path(start), fsx::DIR_FLAGS, Mode::empty())
        .map_err(|e| sys_error("cannot open", start, e))?;
    let mut at = start.to_path_buf();
    for c in rest.components() {
        let name: &OsStr = match c {
            Component::Normal(n) => n,
            Component::RootDir => continue,
            // A resolved path has no `.` or `..` left.
            _ => {
                return Err(ToolError::new(
                    ErrorKind::Internal,
                    format!("unresolved component in {}", dir.display()),
                ));
            }
        };
        at.push(name);
        fd = match fsx::open_dir(fd.as_fd(), name) {
            Ok(next) => next,
            Err(Errno::ENOENT) if create => {
                let made = match mkdirat(fd.as_fd(), name, Mode::from_bits_truncate(0o755)) {
                    Ok(()) => true,
                    Err(Errno::EEXIST) => false,
                    Err(e) => return Err(sys_error("cannot create directory", &at, e)),
                };
                let next = fsx::open_dir(fd.as_fd(), name).map_err(|e| changed(&at, e))?;
                if made {
                    // 0755 exactly, whatever the umask.
                    fchmod(&next, Mode::from_bits_truncate(0o755))
                        .map_err(|e| sys_error("cannot set the mode of", &at, e))?;
                }
                next
            }
            Err(Errno::ENOENT) => {
                return Err(ToolError::new(
                    ErrorKind::NotFound,
                    format!(
                        "the parent directory {} does not exist ({} is missing); set \
                         create_parents to create it (`corral cp -p`)",
                        dir.display(),
                        at.display()
                    ),
                ));
            }
            Err(e) => return Err(changed(&at, e)),
        };
    }
    Ok(fd)
}

/// A component that was a directory when the path was resolved is not one now (or cannot be
/// opened).
fn changed(at: &Path, e: Errno) -> ToolError {
    match e {
        Errno::ELOOP | Errno::ENOTDIR => ToolError::new(
            ErrorKind::FailedPrecondition,
            format!(
                "{} is not a directory (it changed while the call ran, or is a symlink or file); \
                 nothing was written",
                at.display()
            ),
        ),
        e => sys_error("cannot open directory", at, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(root: &Path) -> PatchContext {
        PatchContext::writable_root_for_tests(root)
    }

    #[test]
    fn destinations_follow_the_session_rules() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let r = rules(&root);
        let d = for_write(&r, "a.txt", "", false).unwrap();
        assert_eq!(d.path, root.join("a.txt"));
        assert_eq!(d.existing().unwrap(), None);
        // Missing parent: NOT_FOUND unless created.
        let e = for_write(&r, "x/y/a.txt", "", false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
        assert!(e.message.contains("create_parents"), "{e}");
        let d = for_write(&r, "x/y/a.txt", "", true).unwrap();
        assert_eq!(d.path, root.join("x/y/a.txt"));
        assert!(root.join("x/y").is_dir());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(root.join("x/y"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o7777,
            0o755,
            "created parents are 0755 whatever the umask"
        );
        // Outside, protected, the root itself, `..` at the end.
        for (path, kind) in [
            ("../elsewhere", ErrorKind::PermissionDenied),
            (".git", ErrorKind::PermissionDenied),
            (".git/config", ErrorKind::PermissionDenied),
            (root.to_str().unwrap(), ErrorKind::PermissionDenied),
            ("x/..", ErrorKind::InvalidArgument),
        ] {
            let e = for_write(&r, path, "", true).unwrap_err();
            assert_eq!(e.kind, kind, "{path}: {e}");
        }
        assert!(!root.join(".git").exists());
        // cp's rule: an existing directory receives the source inside it.
        let d = for_write(&r, "x", "src", false).unwrap();
        assert_eq!(d.path, root.join("x/src"));
        let e = for_write(&r, ".", ".git", false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e}");
        let e = for_write(&r, "x", "../y", false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        // Read-only sessions write nothing.
        let mut ro = rules(&root);
        ro.read_only = true;
        let e = for_write(&ro, "b.txt", "", false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied);
        assert!(e.message.contains("read-only"), "{e}");
    }

    #[test]
    fn a_symlink_on_the_way_is_checked_where_it_leads() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        let e = for_write(&rules(&root), "out/f", "", false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e}");
        assert!(e.message.contains("outside"), "{e}");
    }
}
