//! Commands start in the session's working directory as the worker found it, not wherever its
//! path leads later (spec/sandbox.md H24): another session of the same user can swap a parent
//! of a nested root for a symlink (in its own mount namespace the parent is no mount point), and
//! a `chdir` by path would then follow the link. The worker opens the directory once, right
//! after its mounts are built, and every command starts with `fchdir` to it (or to a directory
//! opened beneath it, for a relative workdir).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static PINNED: OnceLock<(PathBuf, OwnedFd)> = OnceLock::new();

/// Opens `cwd` (`O_PATH | O_DIRECTORY`) as the directory commands start from. Once per worker;
/// a second call is ignored.
pub fn pin(cwd: &Path) -> io::Result<()> {
    let fd = open_dir(libc::AT_FDCWD, cwd)?;
    let _ = PINNED.set((cwd.to_path_buf(), fd));
    Ok(())
}

/// The pinned directory's descriptor, which the worker keeps open when it closes the others.
pub fn fd() -> Option<RawFd> {
    PINNED.get().map(|(_, fd)| fd.as_raw_fd())
}

/// Where a command whose working directory is `cwd` starts: a descriptor reached from the
/// pinned directory when `cwd` is it or lies below it (by its path's text), else `None` (chdir
/// by path, as before: an absolute workdir elsewhere, or a worker that pinned nothing).
pub fn open(cwd: &Path) -> Option<io::Result<StartDir>> {
    let (pinned, fd) = PINNED.get()?;
    let rel = cwd.strip_prefix(pinned).ok()?;
    if rel.as_os_str().is_empty() {
        return Some(Ok(StartDir::Pinned(fd.as_raw_fd())));
    }
    Some(open_dir(fd.as_raw_fd(), rel).map(StartDir::Beneath))
}

/// A directory to `fchdir` to.
pub enum StartDir {
    /// The pinned directory itself (held for the worker's life).
    Pinned(RawFd),
    /// A directory opened beneath it for this command.
    Beneath(OwnedFd),
}

impl StartDir {
    pub fn raw(&self) -> RawFd {
        match self {
            StartDir::Pinned(fd) => *fd,
            StartDir::Beneath(fd) => fd.as_raw_fd(),
        }
    }
}

fn open_dir(at: RawFd, path: &Path) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a valid NUL-terminated path; the result is checked before being owned.
    let fd = unsafe {
        libc::openat(
            at,
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this function owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
