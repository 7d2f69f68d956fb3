//! Thin wrappers of the system calls the filesystem view is built with: the new mount API
//! (`open_tree`, `move_mount`, `mount_setattr`, `fsopen`/`fsconfig`/`fsmount`) and `openat2`.
//! Each wrapper is a few lines around one call (`empty_tmpfs`: the `fsopen` sequence that makes
//! the masks' source), with its `SAFETY` reason, turning a failure into the namespace layer's
//! error; none decides anything about the view (that is `fsview`).
//!
//! They exist apart so the raw, `unsafe` part of the layer is small and reviewable in one place,
//! and the view reads as a sequence of mounts.

use super::{LAYER, check, owned};
use crate::sandbox::error::LayerError;
use nix::errno::Errno;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

// Kernel ABI constants, defined here so the layer does not depend on which libc release exposes
// them (values from include/uapi/linux/mount.h and fcntl.h; identical on every architecture).
pub(super) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(super) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(super) const MOUNT_ATTR_NODEV: u64 = 0x4;
pub(super) const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub(super) const AT_RECURSIVE: libc::c_uint = 0x8000;
const OPEN_TREE_CLONE: libc::c_uint = 0x1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;

/// `struct mount_attr` for `mount_setattr(2)`.
#[repr(C)]
#[derive(Default)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr(2)` on `path` (relative to `dirfd`, or the empty path of a mount fd).
pub(super) fn setattr(
    dirfd: Option<&OwnedFd>,
    path: &Path,
    flags: libc::c_uint,
    set: u64,
    clr: u64,
) -> Result<(), LayerError> {
    let c = cpath(path)?;
    let (fd, flags) = match dirfd {
        Some(fd) => (fd.as_raw_fd(), flags | libc::AT_EMPTY_PATH as libc::c_uint),
        None => (libc::AT_FDCWD, flags),
    };
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clr,
        ..Default::default()
    };
    // SAFETY: mount_setattr with a valid path and a correctly sized attribute struct.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            c.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(
        r,
        &format!("mount_setattr on {}", shown(path, dirfd.is_some())),
    )
}

/// `open_tree(OPEN_TREE_CLONE)`: a detached bind mount of `path`.
pub(super) fn open_tree(path: &Path, flags: libc::c_uint) -> Result<OwnedFd, LayerError> {
    open_tree_at(libc::AT_FDCWD, path, flags)
}

pub(super) fn open_tree_at(
    dirfd: RawFd,
    path: &Path,
    flags: libc::c_uint,
) -> Result<OwnedFd, LayerError> {
    let c = cpath(path)?;
    // SAFETY: open_tree with a valid path.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dirfd,
            c.as_ptr(),
            flags | OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    owned(r, &format!("cloning the mount at {}", path.display()))
}

/// `move_mount(2)`: attaches a detached mount at `target` (a final symlink is not followed).
pub(super) fn move_mount(fd: &OwnedFd, target: &Path) -> Result<(), LayerError> {
    let empty = CString::new("").unwrap();
    let t = cpath(target)?;
    // SAFETY: move_mount with valid strings.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(r, &format!("attaching a mount at {}", target.display()))
}

/// `openat2(path, O_PATH | O_DIRECTORY, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`.
pub(super) fn open_no_symlinks(path: &Path) -> Result<OwnedFd, Errno> {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    const RESOLVE_NO_SYMLINKS: u64 = 0x04;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2 with a valid path and a correctly sized open_how.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    Errno::result(r)?;
    // SAFETY: a non-negative return of openat2 is a descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// A detached recursive clone of the mount tree at the directory `fd` refers to.
pub(super) fn clone_tree_of(fd: &OwnedFd, shown_as: &Path) -> Result<OwnedFd, LayerError> {
    let empty = CString::new("").unwrap();
    // SAFETY: open_tree on our descriptor with the empty path.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            fd.as_raw_fd(),
            empty.as_ptr(),
            OPEN_TREE_CLONE
                | AT_RECURSIVE
                | libc::AT_EMPTY_PATH as libc::c_uint
                | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    owned(r, &format!("cloning the mount at {}", shown_as.display()))
}

/// Attaches the detached mount `tree` onto the directory `target` refers to (no path lookup).
pub(super) fn attach_at(
    tree: &OwnedFd,
    target: &OwnedFd,
    shown_as: &Path,
) -> Result<(), LayerError> {
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    let empty = CString::new("").unwrap();
    // SAFETY: move_mount between two of our descriptors with empty paths.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            target.as_raw_fd(),
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    check(r, &format!("attaching a mount at {}", shown_as.display()))
}

/// A detached tmpfs holding an empty directory `dir` and an empty file `file`.
pub(super) fn empty_tmpfs() -> Result<OwnedFd, LayerError> {
    let fstype = CString::new("tmpfs").unwrap();
    // SAFETY: fsopen with a valid C string.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) };
    let fs = owned(fs, "fsopen(tmpfs) for the mask source")?;
    for (key, value) in [("mode", "0755"), ("size", "16k")] {
        let (k, v) = (CString::new(key).unwrap(), CString::new(value).unwrap());
        // SAFETY: fsconfig with valid C strings on our fs context.
        let r = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                k.as_ptr(),
                v.as_ptr(),
                0,
            )
        };
        check(r, "fsconfig for the mask source")?;
    }
    // SAFETY: fsconfig command without strings.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_char>(),
            0,
        )
    };
    check(r, "creating the mask tmpfs")?;
    // SAFETY: fsmount on our configured context.
    let mnt = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, 0) };
    let mnt = owned(mnt, "fsmount of the mask tmpfs")?;
    let dir = CString::new("dir").unwrap();
    let file = CString::new("file").unwrap();
    // SAFETY: creating entries relative to the detached mount's root.
    unsafe {
        check(
            libc::mkdirat(mnt.as_raw_fd(), dir.as_ptr(), 0o555) as i64,
            "mkdir in the mask tmpfs",
        )?;
        let f = libc::openat(
            mnt.as_raw_fd(),
            file.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
            0o444,
        );
        owned(f as i64, "creating the empty mask file")?;
    }
    Ok(mnt)
}

fn cpath(path: &Path) -> Result<CString, LayerError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| LayerError {
        layer: LAYER,
        message: format!(
            "sandbox unavailable: {LAYER} could not be applied: path {} contains a NUL byte. Remove it from the policy.",
            path.display()
        ),
    })
}

fn shown(path: &Path, is_fd: bool) -> String {
    if is_fd {
        "a detached mount".into()
    } else {
        path.display().to_string()
    }
}
