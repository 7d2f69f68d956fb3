//! Looking at what the sandbox can change without trusting it: pointer files (`.git`,
//! `commondir`, config) read bounded, never following a final symlink nor blocking on a FIFO;
//! paths resolved one component at a time, refusing a symlink whose target lies in a writable
//! root and a `..` out of a directory below one (H9). A protected path reached that way could
//! be swapped after its read-only mount was made, so the session is refused instead.
//!
//! Apart because both the protected paths (`protected`) and what git executes (`git_exec`)
//! rely on these checks, and they are the part of the policy an attacker aims at.

use super::PolicyError;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Symlink hops followed before giving up (the kernel's own limit is 40).
const MAX_SYMLINK_HOPS: usize = 40;

/// Largest `.git` or `commondir` file read (each holds one path). A bigger one is refused: it
/// is not what git writes, and a FIFO or `/dev/zero` planted there must cost nothing.
const MAX_POINTER_FILE_BYTES: usize = 4096;

/// Reads a small pointer file (`.git`, `commondir`) without trusting it: no symlink followed,
/// never blocking (a FIFO), regular files only, at most [`MAX_POINTER_FILE_BYTES`].
pub(super) fn read_pointer_file(path: &Path) -> io::Result<String> {
    read_small_file(path, MAX_POINTER_FILE_BYTES)
}

/// A regular file's text, its last component not followed, never blocking (a FIFO), at most
/// `max` bytes (more is an error, not a truncation).
pub(in crate::sandbox) fn read_small_file(path: &Path, max: usize) -> io::Result<String> {
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

/// The outcome of resolving a gitdir pointer.
pub(in crate::sandbox) enum Resolved {
    /// The canonical path of an existing target.
    Exists(PathBuf),
    /// The target does not exist; this is its first missing component (canonical parent).
    Missing(PathBuf),
}

/// Resolves `rel` against the canonical directory `base` one component at a time, refusing any
/// symlink on the way whose target lies inside a writable root.
pub(in crate::sandbox) fn resolve_checked(
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
pub(super) fn check_symlink(
    protected: &Path,
    link: &Path,
    roots: &[PathBuf],
) -> Result<(), PolicyError> {
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

pub(in crate::sandbox) fn inside_any(path: &Path, roots: &[PathBuf]) -> bool {
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

pub(in crate::sandbox) fn inspect(path: &Path, e: io::Error) -> PolicyError {
    PolicyError::Inspect {
        path: path.to_path_buf(),
        cause: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::roots::build_policy;
    use crate::sandbox::roots::tests::{Scratch, params};
    use std::os::unix::fs::symlink;

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
        symlink(r2.join("real"), s.path().join("outside/link")).unwrap();
        std::fs::write(
            cwd.join(".git"),
            format!("gitdir: {}\n", s.path().join("outside/link/wt").display()),
        )
        .unwrap();
        let mut p = params(&cwd);
        p.writable_roots = vec![r2];
        match build_policy(&p) {
            Err(PolicyError::WritableSymlink { path, symlink }) => {
                assert_eq!(path, s.path().join("outside/link/wt"));
                assert_eq!(symlink, s.path().join("outside/link"));
            }
            other => panic!("expected a symlink refusal, got {other:?}"),
        }
    }
}
