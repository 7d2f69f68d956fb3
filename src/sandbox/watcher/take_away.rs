//! Taking a guarded name away (spec/sandbox.md §8.6 H1): renamed at once to a quarantine name
//! in the same directory (which ends the danger: git looks for `.git`, not for that name), then
//! the tree is made writable by its owner and deleted, off the guard's lock. Apart from the guard
//! because it must work against a sandbox that prepared for it (write bits removed, names
//! refilled, symlinks planted), and that care is easier to check alone.

use super::report::GuardReport;
use super::{Inner, State, lock};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Attempts to take away a name that is being refilled concurrently.
const REMOVE_ATTEMPTS: usize = 20;

/// Prefix of the name a guarded path is renamed to before it is deleted.
pub(super) const QUARANTINE_PREFIX: &str = ".corral-removed-";

/// Takes away every path of `paths` that exists now and — in attributed mode — that an event
/// attributed to the sandbox (H27: what a host process made is never touched).
///
/// Renames happen here; the quarantined trees are returned for deletion by the caller once it
/// has recorded the report (deleting a large tree must not hold up other calls, and a call must
/// never finish between a removal and its report).
pub(super) fn sweep(
    attributed: bool,
    state: &mut State,
    paths: &[PathBuf],
    trash: &mut Vec<PathBuf>,
) -> GuardReport {
    let mut report = GuardReport::default();
    for p in paths {
        if attributed && !state.sandbox_made.contains(p) {
            continue;
        }
        match take_away(p, trash) {
            // Gone: whatever appears there next comes with an event of its own.
            Ok(false) => {
                state.sandbox_made.remove(p);
            }
            Ok(true) => {
                state.sandbox_made.remove(p);
                report.removed.push(p.clone());
            }
            Err(cause) => report.not_removed.push((p.clone(), cause)),
        }
    }
    report
}

/// Whether `path` exists. Only "no such entry" (or a parent that is not a directory) counts as
/// absent: a path that cannot be looked at (a parent made unsearchable) may be there, and is
/// reported as not taken away rather than as nothing found.
fn exists(path: &Path) -> Result<bool, String> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(false),
        Err(e) => Err(format!("cannot check whether it is there: {e}")),
    }
}

/// Takes `path` away: renamed to a quarantine name in the same directory (pushed on `trash`
/// for [`delete_tree`]). `Ok(true)`: it was there and is gone; `Ok(false)`: it was not there;
/// `Err`: it is still there, and why. A tree that cannot be deleted after the rename is
/// harmless (its name is not one git or codex looks for) and is not an error.
fn take_away(path: &Path, trash: &mut Vec<PathBuf>) -> Result<bool, String> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let (Some(dir), Some(_)) = (path.parent(), path.file_name()) else {
        return Ok(false);
    };
    let mut found = false;
    let mut last_error = String::new();
    for _ in 0..REMOVE_ATTEMPTS {
        if !exists(path)? {
            return Ok(found);
        }
        found = true;
        let quarantine = dir.join(format!(
            "{QUARANTINE_PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match rename_noreplace(path, &quarantine) {
            Ok(()) => {
                trash.push(quarantine);
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(found),
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM))
                    && let Some(restore) = make_owner_writable(dir) =>
            {
                // The sandbox removed the write bit of the directory itself; its owner (us)
                // may put it back for the rename.
                let r = rename_noreplace(path, &quarantine);
                let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(restore));
                match r {
                    Ok(()) => trash.push(quarantine),
                    Err(e) => last_error = e.to_string(),
                }
            }
            Err(e) => last_error = e.to_string(),
        }
    }
    if !exists(path)? {
        return Ok(found);
    }
    Err(if last_error.is_empty() {
        "it kept being recreated".into()
    } else {
        last_error
    })
}

/// `renameat2(RENAME_NOREPLACE)`: never clobbers an existing quarantine name.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let (f, t) = (
        std::ffi::CString::new(from.as_os_str().as_bytes())?,
        std::ffi::CString::new(to.as_os_str().as_bytes())?,
    );
    // SAFETY: renameat2 with valid C strings. The raw syscall: musl (the static build) has no
    // wrapper for it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Adds the owner's write and search bits to `dir` when we own it; returns its old mode.
fn make_owner_writable(dir: &Path) -> Option<u32> {
    let meta = std::fs::symlink_metadata(dir).ok()?;
    // SAFETY: geteuid cannot fail.
    if !meta.is_dir() || meta.uid() != unsafe { libc::geteuid() } {
        return None;
    }
    let old = meta.mode() & 0o7777;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(old | 0o700)).ok()?;
    Some(old)
}

/// Deletes every pending quarantined tree; one that cannot be deleted yet stays pending for
/// the next sweep or the next finishing call. Never called with `state` locked.
pub(super) fn empty_trash(inner: &Inner) {
    let _one_deleter = lock(&inner.deleting);
    let pending = std::mem::take(&mut *lock(&inner.trash));
    let left: Vec<PathBuf> = pending
        .into_iter()
        .filter(|t| {
            delete_tree(t);
            std::fs::symlink_metadata(t).is_ok()
        })
        .collect();
    lock(&inner.trash).extend(left);
}

/// Deletes a quarantined tree: every directory in it is first given its owner's rwx back (a
/// `0555` tree cannot be emptied otherwise), never following a symlink.
fn delete_tree(path: &Path) {
    fn open_up(dir: &Path) {
        let Ok(meta) = std::fs::symlink_metadata(dir) else {
            return;
        };
        if !meta.is_dir() {
            return;
        }
        let _ = std::fs::set_permissions(
            dir,
            std::fs::Permissions::from_mode((meta.mode() & 0o7777) | 0o700),
        );
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    open_up(&e.path());
                }
            }
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            open_up(path);
            // std's remove_dir_all works through O_NOFOLLOW directory descriptors, so a
            // symlink planted inside the tree cannot redirect the deletion.
            with_writable_parent(path, || std::fs::remove_dir_all(path));
        }
        Ok(_) => with_writable_parent(path, || std::fs::remove_file(path)),
        Err(_) => {}
    }
}

/// Runs `remove`; when it is refused because the sandbox took the write bit off the
/// quarantine's directory (ours), runs it once more with the bit back, then restores the
/// directory's mode exactly as the sandbox left it.
fn with_writable_parent(path: &Path, remove: impl Fn() -> io::Result<()>) {
    let refused =
        |e: &io::Error| matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM));
    match remove() {
        Err(e) if refused(&e) => {
            if let Some(dir) = path.parent()
                && let Some(mode) = make_owner_writable(dir)
            {
                let _ = remove();
                let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::testutil::TempDir;

    #[test]
    fn only_a_missing_entry_counts_as_absent() {
        let s = TempDir::new("watch");
        std::fs::write(s.path().join("file"), "f").unwrap();
        assert_eq!(exists(&s.path().join("file")), Ok(true));
        assert_eq!(exists(&s.path().join("none")), Ok(false));
        // A parent that is a file: the path cannot exist.
        assert_eq!(exists(&s.path().join("file/x")), Ok(false));
        // A name longer than any file system allows cannot be checked: not "absent".
        let long = s.path().join("n".repeat(300));
        assert!(exists(&long).is_err(), "{:?}", exists(&long));
    }
}
