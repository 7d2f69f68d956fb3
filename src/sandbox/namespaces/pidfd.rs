//! The pidfd wrappers the namespace layer's fork uses: before forking, the worker opens a pidfd
//! of itself; the child, once its `PR_SET_PDEATHSIG` is armed, polls it to notice a parent that
//! died before that (the signal would never come, and the sandbox would run on unowned).
//! Apart from the layer, like `mount_api`, so the raw calls sit with their `SAFETY` reasons.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub(super) fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    // SAFETY: pidfd_open of our own pid.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a non-negative return is a fresh descriptor we own.
    (r >= 0).then(|| unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// A pidfd polls readable once its process has exited.
pub(super) fn pidfd_exited(fd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one valid descriptor without waiting.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}
