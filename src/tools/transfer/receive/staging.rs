//! Making a staging and filling it: a fresh, locked staging name beside the destination (a file
//! or a tree's root), the exclusive creation of staged files with their space reserved, the check
//! that a file got all its bytes, and the walk below a staged root that never follows a symlink.
//! The stream's order and its refusals are mod.rs's; these are the filesystem steps it takes.

use super::{Filling, Receiver, changed};
use crate::tools::ErrorKind;
use crate::tools::ToolError;
use crate::tools::transfer::{Kind, fsx, io_error, shown, sys_error};
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, fchmod, mkdirat};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

impl Receiver {
    /// Makes the staging of a file or a tree under a fresh name and locks it. A remover of
    /// stagings left behind can take one in the instant between its making and its lock (and
    /// removes it): then another name is tried.
    pub(super) fn make_staging(
        &self,
        kind: Kind,
        size: u64,
    ) -> Result<(OsString, Made), ToolError> {
        let parent = self.dest.parent.as_fd();
        for _ in 0..3 {
            let staged = fsx::staging_name(&self.dest.name, "upload");
            let at = self
                .dest
                .path
                .parent()
                .unwrap_or(Path::new("/"))
                .join(&staged);
            let made = if kind == Kind::Directory {
                mkdirat(parent, staged.as_os_str(), Mode::from_bits_truncate(0o700))
                    .map_err(|e| sys_error("cannot create directory", &at, e))?;
                match fsx::open_dir(parent, &staged) {
                    Ok(fd) => Made::Tree(fd),
                    Err(e) => {
                        let _ = fsx::remove_tree(parent, &staged);
                        return Err(changed(&at, e));
                    }
                }
            } else {
                let file = create_file(parent, &staged, &at, size)?;
                match file.try_clone() {
                    Ok(lock) => Made::File { file, lock },
                    Err(e) => {
                        drop(file);
                        let _ = fsx::remove_tree(parent, &staged);
                        return Err(io_error("cannot keep open", &at, e));
                    }
                }
            };
            let fd = match &made {
                Made::File { lock, .. } => lock.as_fd(),
                Made::Tree(root) => root.as_fd(),
            };
            match hold(parent, &staged, fd) {
                Ok(()) => return Ok((staged, made)),
                // Taken: its remover removes it.
                Err(None) => continue,
                Err(Some(e)) => {
                    drop(made);
                    let _ = fsx::remove_tree(parent, &staged);
                    return Err(sys_error("cannot lock", &at, e));
                }
            }
        }
        Err(ToolError::new(
            ErrorKind::Aborted,
            format!(
                "the staging beside {} was taken away three times as it was made (another \
                 transfer there removing what it took for leftovers); nothing was changed, retry",
                self.dest.path.display()
            ),
        ))
    }
}

/// A staging just made, open.
pub(super) enum Made {
    /// The file being filled, and a second descriptor of it that holds the lock after the
    /// first is closed.
    File { file: File, lock: File },
    /// The staged root directory, which holds the lock.
    Tree(OwnedFd),
}

/// Locks a staging just made (`fsx::lock_staging`) and checks its name is still the thing
/// locked. `Err(None)`: a remover took it meanwhile (nothing to remove here then);
/// `Err(Some(e))`: the lock or the check failed otherwise.
fn hold(parent: BorrowedFd<'_>, staged: &OsStr, fd: BorrowedFd<'_>) -> Result<(), Option<Errno>> {
    match fsx::lock_staging(fd) {
        Ok(()) => {}
        Err(Errno::EWOULDBLOCK) => return Err(None),
        Err(e) if fsx::locks_unsupported(e) => {}
        Err(e) => return Err(Some(e)),
    }
    let held = nix::sys::stat::fstat(fd).map_err(Some)?;
    match fsx::lstat_at(parent, staged) {
        Ok(now) if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino) => Ok(()),
        _ => Err(None),
    }
}

/// Creates a staged file exclusively (owner-only until its final mode), and reserves its size
/// so a disk that cannot hold it says so before any data is sent.
pub(super) fn create_file(
    dir: impl AsFd,
    name: &OsStr,
    shown: &Path,
    size: u64,
) -> Result<File, ToolError> {
    let dir = dir.as_fd();
    let fd = openat(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| sys_error("cannot create", shown, e))?;
    if size > 0 {
        let len = libc::off_t::try_from(size).unwrap_or(libc::off_t::MAX);
        // SAFETY: fallocate on a descriptor we own.
        let rc = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&fd), 0, 0, len) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            // Filesystems without fallocate simply get the data.
            if !matches!(
                err.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL)
            ) {
                // Nothing holds the new file yet: take it away here.
                let _ = nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
                return Err(io_error("cannot reserve space for", shown, err));
            }
        }
    }
    Ok(File::from(fd))
}

/// Checks a file got all its bytes and gives it its final mode.
pub(super) fn close_file(f: Filling, base: &Path) -> Result<File, ToolError> {
    let path = shown(base, &f.path);
    if f.written != f.size {
        return Err(ToolError::invalid(format!(
            "{}: {} of its {} bytes were sent before the next entry or the end; nothing was \
             written",
            path.display(),
            f.written,
            f.size
        )));
    }
    fchmod(&f.file, Mode::from_bits_truncate(f.mode))
        .map_err(|e| sys_error("cannot set the mode of", &path, e))?;
    Ok(f.file)
}

/// Opens directory `rel` below `root`, never through a symlink.
pub(super) fn walk(root: std::os::fd::BorrowedFd<'_>, rel: &str) -> nix::Result<OwnedFd> {
    let mut fd = nix::unistd::dup(root)?;
    for name in rel.split('/').filter(|c| !c.is_empty()) {
        fd = fsx::open_dir(&fd, OsStr::new(name))?;
    }
    Ok(fd)
}
