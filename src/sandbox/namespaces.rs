//! The namespace layer: a private mount, PID, UTS, IPC (and, with the network off, network)
//! namespace, and the read-only filesystem view built inside it (spec/sandbox.md §2.5–§2.8,
//! §3.1 step 1, §3.2).
//!
//! [`enter_namespaces`] is step 1 of the worker's confinement. It must run in a single-threaded
//! process that still holds `CAP_SYS_ADMIN`: `unshare(CLONE_NEWNS)` refuses a process whose
//! filesystem state is shared with other threads, and every mount below needs the capability.
//! A root daemon's worker has it on the host; a worker of a daemon that is not root has it in the
//! user namespace it entered just before (`userns`), which then owns every namespace made here.
//!
//! **It forks.** A new PID namespace applies only to children, so after `unshare` the calling
//! process forks once: the child becomes PID 1 of the new namespace, builds the filesystem view
//! and is the only one that returns (`Ok` to continue confining, or `Err` naming what failed).
//! The parent never returns: it closes its descriptors, waits for the child and exits with the
//! child's status (re-raising the signal if the child was killed), so whoever started the worker
//! still sees one process with the right exit status. The child gets `PR_SET_PDEATHSIG` =
//! `SIGKILL`, so killing the parent kills the whole sandbox.
//!
//! Every mount happens after `unshare(CLONE_NEWNS)` and after `/` has been made recursively
//! private, so nothing done here is visible to, or propagates back to, the host.

use crate::sandbox::error::LayerError;
use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::userns;
use nix::errno::Errno;
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::unistd::{ForkResult, fork};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// The layer name used in error messages and degraded-mode settings (spec/sandbox.md §6).
pub const LAYER: &str = "namespaces";

/// Size of the private `/dev/shm` (spec/sandbox.md §2.5: "size-limited").
pub const DEV_SHM_SIZE: &str = "64m";

/// Host device nodes bound into the fresh `/dev` (spec/sandbox.md §2.5).
pub const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

// Kernel ABI constants, defined here so the layer does not depend on which libc release exposes
// them (values from include/uapi/linux/mount.h and fcntl.h; identical on every architecture).
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const OPEN_TREE_CLONE: libc::c_uint = 0x1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;

/// `struct mount_attr` for `mount_setattr(2)`.
#[repr(C)]
#[derive(Default)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// The part of `struct ifreq` used for `SIOC[GS]IFFLAGS` (40 bytes, as the kernel copies).
#[repr(C)]
struct IfreqFlags {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Enters the sandbox namespaces and builds the filesystem view. **Returns only in the child**,
/// which is PID 1 of the new PID namespace; the calling process waits for that child and exits
/// with its status (see the module documentation).
///
/// In danger-full-access there are no namespaces (spec/sandbox.md §2.9): the call does nothing and
/// returns `Ok` in the calling process, without forking.
pub fn enter_namespaces(policy: &SandboxPolicy) -> Result<(), LayerError> {
    if !policy.mode.is_sandboxed() {
        return Ok(());
    }
    let mut flags = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWIPC;
    if !policy.network {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    unshare(flags).map_err(|e| {
        fail(
            format!("unshare({}) failed: {}", describe_flags(flags), e.desc()),
            e,
        )
    })?;

    // Used by the child to notice that the parent died before PDEATHSIG was armed.
    let parent_pidfd = pidfd_open(std::process::id() as libc::pid_t);

    // SAFETY: the worker is single-threaded here (a precondition of this layer), so the child
    // may run arbitrary code after fork.
    match unsafe { fork() } {
        Err(e) => Err(fail(
            format!("fork into the new PID namespace failed: {}", e.desc()),
            e,
        )),
        Ok(ForkResult::Parent { child }) => {
            drop(parent_pidfd);
            wait_and_exit(child.as_raw())
        }
        Ok(ForkResult::Child) => {
            // SAFETY: prctl with integer arguments only.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
            if let Some(fd) = &parent_pidfd
                && pidfd_exited(fd)
            {
                // SAFETY: leaving at once; nothing of ours needs flushing.
                unsafe { libc::_exit(1) };
            }
            drop(parent_pidfd);
            if !policy.network {
                loopback_up()?;
            }
            build_view(policy)
        }
    }
}

/// The parent half: never returns. It holds nothing the sandbox needs, so it closes every
/// descriptor beyond 0–2 (otherwise the daemon would not see the worker's end of the request
/// socket close when the child exits), then mirrors the child's fate.
fn wait_and_exit(child: libc::pid_t) -> ! {
    // SAFETY: close_range on our own descriptor table; failure (old kernel) only leaves fds open.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    // It only waits, so it keeps no capability either (it lives in the sandbox's mount and
    // network namespaces, outside its pid namespace). If even that fails, take the sandbox down.
    if crate::sandbox::caps::clear_capability_sets().is_err() {
        // SAFETY: killing our own child, then leaving without running destructors.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::_exit(1);
        }
    }
    let mut status = 0;
    loop {
        // SAFETY: plain waitpid on our only child.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        if r == child {
            break;
        }
        if r < 0 && Errno::last() != Errno::EINTR {
            // SAFETY: leaving without running destructors or flushing shared stdio buffers.
            unsafe { libc::_exit(1) };
        }
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // Re-raise so our own parent sees the same signal; fall back to the shell convention.
        // SAFETY: resetting a disposition and signalling ourselves.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
    }
    // SAFETY: as above; _exit avoids flushing stdio buffers the child also owns.
    unsafe { libc::_exit(libc::WEXITSTATUS(status)) }
}

/// Builds the filesystem view of §3.2, in its order.
fn build_view(policy: &SandboxPolicy) -> Result<(), LayerError> {
    // 1. Nothing below may propagate to the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| {
        fail(
            format!("making / recursively private failed: {}", e.desc()),
            e,
        )
    })?;

    // 2. Each writable root, opened without following any symlink and checked against the
    //    identity pinned when the session opened (H4), is cloned as a detached bind mount while
    //    the host's flags are still on it: a read-only submount below a root stays read-only
    //    (H8). The clones are sealed nosuid/nodev before anything can use them.
    let mut clones: Vec<(PathBuf, OwnedFd)> = Vec::new();
    for (i, root) in policy.writable_roots.iter().enumerate() {
        let dir = open_pinned(root, policy.root_ids.get(i).copied())?;
        let clone = clone_tree_of(&dir, root)?;
        setattr(
            Some(&clone),
            Path::new(""),
            AT_RECURSIVE,
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            0,
        )?;
        clones.push((root.clone(), clone));
    }

    // 3. Everything read-only, nosuid, nodev.
    setattr(
        None,
        Path::new("/"),
        AT_RECURSIVE,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        0,
    )?;

    // 3b. The roots' clones attached over them, shallowest first (a nested root lands in its
    //     enclosing root's clone), each onto the directory it was pinned as — by descriptor, so
    //     no path is followed between the check and the mount. Roots under /dev wait for it.
    let dev = Path::new("/dev");
    let (dev_roots, mut roots): (Vec<_>, Vec<_>) =
        clones.into_iter().partition(|(r, _)| r.starts_with(dev));
    roots.sort_by_key(|(r, _)| r.components().count());
    for (root, clone) in &roots {
        let i = policy.writable_roots.iter().position(|r| r == root);
        let target = open_pinned(root, i.and_then(|i| policy.root_ids.get(i).copied()))?;
        attach_at(clone, &target, root)?;
    }

    // 3c. Pin the way to nested roots and protected paths (H4, H9): every directory between an
    //     enclosing writable root and a nested root or protected path becomes a mount point, so
    //     renaming it from inside fails with EBUSY and a root or a gitdir cannot be swapped.
    for (dir, needed) in ancestors_to_pin(policy) {
        // Only on the way to a protected path or a missing gitdir (not to a nested root), a
        // directory gone or replaced since the session's protection was computed has nothing to
        // pin: every write first recomputes the protection (`check_current`), finds the change,
        // and the daemon builds a worker for what is there now.
        let fd = match open_no_symlinks(&dir) {
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) if !needed => continue,
            _ => open_pinned(&dir, None)?,
        };
        let clone = clone_tree_of(&fd, &dir)?;
        attach_at(&clone, &fd, &dir)?;
    }

    // 4. The minimal /dev. Host nodes and /dev roots are cloned before the host /dev is covered.
    build_dev(dev_roots)?;

    // 5. A fresh procfs for the new PID namespace; never the host's (no fallback).
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(|e| fail(format!("mounting a fresh /proc failed: {}", e.desc()), e))?;

    // 6. Protected paths read-only, and explicit roots nested inside them writable again.
    protect(policy)?;

    // 7. corral's state and the runtime sockets hidden.
    mask(&policy.masked_paths)?;

    // /dev itself is read-only, so nothing can be created beside the nodes (§2.1 "write nothing").
    setattr(None, Path::new("/dev"), 0, MOUNT_ATTR_RDONLY, 0)?;

    // Our cwd still names the mount that was there before the binds (now read-only);
    // re-resolve it so relative paths of the worker see the new view.
    if let Ok(cwd) = std::env::current_dir() {
        let _ = std::env::set_current_dir(cwd);
    }
    Ok(())
}

/// Mounts the fresh `/dev` of §2.5 over the host's. `dev_roots` are the writable roots under
/// `/dev`, already cloned (step 2), attached read-write in the new `/dev`.
fn build_dev(dev_roots: Vec<(PathBuf, OwnedFd)>) -> Result<(), LayerError> {
    let dev = Path::new("/dev");
    // Clones of the host nodes (bind mounts not attached anywhere yet).
    let mut nodes = Vec::new();
    for name in DEV_NODES {
        let src = dev.join(name);
        let fd = open_tree(&src, 0)?;
        // The clone inherited nodev from step 3; a device node must be openable. It stays
        // read-only, so chmod/chown of the host node is refused while reads and writes work.
        setattr(Some(&fd), Path::new(""), 0, 0, MOUNT_ATTR_NODEV)?;
        nodes.push((name, fd));
    }
    // `/dev` itself as a root is covered by the fresh one like any other host /dev.
    let dev_roots: Vec<_> = dev_roots.into_iter().filter(|(r, _)| r != dev).collect();

    mount(
        Some("tmpfs"),
        dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )
    .map_err(|e| {
        fail(
            format!("mounting the tmpfs for /dev failed: {}", e.desc()),
            e,
        )
    })?;

    for (name, fd) in &nodes {
        let target = dev.join(name);
        std::fs::File::create(&target).map_err(|e| io_fail(&target, e))?;
        move_mount(fd, &target)?;
    }

    let pts = dev.join("pts");
    mkdir(&pts)?;
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(|e| {
        fail(
            format!("mounting a private devpts on /dev/pts failed: {}", e.desc()),
            e,
        )
    })?;

    let shm = dev.join("shm");
    mkdir(&shm)?;
    if !dev_roots.iter().any(|(r, _)| r == &shm) {
        let opts = format!("mode=1777,size={DEV_SHM_SIZE}");
        mount(
            Some("tmpfs"),
            &shm,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(opts.as_str()),
        )
        .map_err(|e| {
            fail(
                format!("mounting the private /dev/shm failed: {}", e.desc()),
                e,
            )
        })?;
    }
    for (root, fd) in &dev_roots {
        std::fs::create_dir_all(root).map_err(|e| io_fail(root, e))?;
        move_mount(fd, root)?;
    }

    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let path = dev.join(link);
        symlink(target, &path).map_err(|e| io_fail(&path, e))?;
    }
    Ok(())
}

/// Step 6: binds each protected path read-only onto itself. Paths are handled shallowest first,
/// and a writable root lying inside a protected path (an explicit override, §2.3) is made
/// writable again after its enclosing protected mount, so the deepest rule wins.
fn protect(policy: &SandboxPolicy) -> Result<(), LayerError> {
    enum Item<'a> {
        Protect(&'a Path),
        Reopen(&'a Path),
    }
    let mut items: Vec<(usize, Item)> = Vec::new();
    for p in &policy.protected_paths {
        items.push((p.components().count(), Item::Protect(p)));
    }
    for r in &policy.writable_roots {
        if policy
            .protected_paths
            .iter()
            .any(|p| r.starts_with(p) && r != p)
        {
            items.push((r.components().count(), Item::Reopen(r)));
        }
    }
    items.sort_by_key(|(depth, _)| *depth);
    for (_, item) in items {
        match item {
            Item::Protect(path) => {
                // Gone since the protection was computed (removed on the host): nothing to make
                // read-only. Every write first recomputes the protection (`check_current`),
                // finds it changed and gets a worker built for what is there now.
                if std::fs::symlink_metadata(path)
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
                {
                    continue;
                }
                // Clone without following a final symlink and seal the clone before attaching it,
                // so there is no moment where the new mount is writable, and a path swapped for a
                // symlink since the policy was computed cannot redirect the mount.
                let fd = open_tree(
                    path,
                    AT_RECURSIVE | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
                )?;
                setattr(
                    Some(&fd),
                    Path::new(""),
                    AT_RECURSIVE,
                    MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                    0,
                )?;
                move_mount(&fd, path)?;
            }
            Item::Reopen(root) => setattr(None, root, AT_RECURSIVE, 0, MOUNT_ATTR_RDONLY)?,
        }
    }
    Ok(())
}

/// Step 7: hides each existing masked path behind an empty read-only directory or file. Both come
/// from one detached tmpfs that is never attached anywhere itself, so no placeholder is visible.
fn mask(paths: &[PathBuf]) -> Result<(), LayerError> {
    let targets: Vec<PathBuf> = paths
        .iter()
        // Resolve links (e.g. /var/run -> /run) so the mount lands on the object itself; a path
        // that does not exist has nothing to hide.
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    if targets.is_empty() {
        return Ok(());
    }
    let source = empty_tmpfs()?;
    for target in &targets {
        let is_dir = target.is_dir();
        let fd = open_tree_at(
            source.as_raw_fd(),
            Path::new(if is_dir { "dir" } else { "file" }),
            0,
        )?;
        setattr(
            Some(&fd),
            Path::new(""),
            0,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            0,
        )?;
        move_mount(&fd, target)?;
    }
    Ok(())
}

/// A detached tmpfs holding an empty directory `dir` and an empty file `file`.
fn empty_tmpfs() -> Result<OwnedFd, LayerError> {
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

/// Brings `lo` up in the new network namespace (it starts down), so local-only tools keep working.
fn loopback_up() -> Result<(), LayerError> {
    // SAFETY: plain socket creation.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    let s = owned(s as i64, "socket for configuring lo")?;
    let mut req = IfreqFlags {
        name: [0; 16],
        flags: 0,
        _pad: [0; 22],
    };
    req.name[..2].copy_from_slice(b"lo");
    // SAFETY: ioctls on our socket with a correctly sized ifreq.
    unsafe {
        check(
            libc::ioctl(s.as_raw_fd(), SIOCGIFFLAGS as _, &mut req) as i64,
            "SIOCGIFFLAGS on lo",
        )?;
        req.flags |= libc::IFF_UP as libc::c_short;
        check(
            libc::ioctl(s.as_raw_fd(), SIOCSIFFLAGS as _, &req) as i64,
            "SIOCSIFFLAGS (up) on lo",
        )?;
    }
    Ok(())
}

/// `mount_setattr(2)` on `path` (relative to `dirfd`, or the empty path of a mount fd).
fn setattr(
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
fn open_tree(path: &Path, flags: libc::c_uint) -> Result<OwnedFd, LayerError> {
    open_tree_at(libc::AT_FDCWD, path, flags)
}

fn open_tree_at(dirfd: RawFd, path: &Path, flags: libc::c_uint) -> Result<OwnedFd, LayerError> {
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
fn move_mount(fd: &OwnedFd, target: &Path) -> Result<(), LayerError> {
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

/// Directories that must not be renamed from inside (step 3c): for each writable root nested in
/// another, each protected path and each guarded missing path (a `.git` file's gitdir that does
/// not exist yet: the guard takes it away if it appears, and the pin keeps it from being built
/// in a parent moved away and moved back), every directory strictly between the deepest
/// enclosing writable root and it. A guarded missing path is the first missing component, so
/// its ancestors existed when it was computed. Each with whether it must exist: `true` on the
/// way to a nested root (H4), `false` when it is only on the way to a protected path or a
/// missing gitdir. Shallowest first, deduplicated.
fn ancestors_to_pin(policy: &SandboxPolicy) -> Vec<(PathBuf, bool)> {
    let mut out: Vec<(PathBuf, bool)> = Vec::new();
    let targets = policy
        .writable_roots
        .iter()
        .map(|t| (t, true))
        .chain(policy.protected_paths.iter().map(|t| (t, false)))
        .chain(policy.protected_missing.iter().map(|t| (t, false)));
    for (target, needed) in targets {
        let Some(enclosing) = policy
            .writable_roots
            .iter()
            .filter(|r| *r != target && target.starts_with(r))
            .max_by_key(|r| r.components().count())
        else {
            continue;
        };
        let mut dir = target.parent();
        while let Some(d) = dir {
            if d == enclosing.as_path() || !d.starts_with(enclosing) {
                break;
            }
            match out.iter_mut().find(|(o, _)| o == d) {
                Some((_, n)) => *n |= needed,
                None => out.push((d.to_path_buf(), needed)),
            }
            dir = d.parent();
        }
    }
    out.sort_by_key(|(d, _)| d.components().count());
    out
}

/// Opens the canonical directory `path` as an `O_PATH` descriptor without following any
/// symlink on the way (`openat2` with `RESOLVE_NO_SYMLINKS`), and, when `pinned` is given,
/// checks it is that `(st_dev, st_ino)` (spec/sandbox.md §8.6 H4). A root that was replaced or
/// redirected since the session opened refuses the worker: nothing is ever re-resolved.
fn open_pinned(path: &Path, pinned: Option<(u64, u64)>) -> Result<OwnedFd, LayerError> {
    let fd = match open_no_symlinks(path) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => {
            return Err(fail(
                format!(
                    "{} now passes through a symlink; it was a plain directory path when the \
                     session opened",
                    path.display()
                ),
                Errno::ESTALE,
            ));
        }
        Err(e) => {
            return Err(fail(
                format!(
                    "opening {} without following symlinks failed: {}",
                    path.display(),
                    e.desc()
                ),
                e,
            ));
        }
    };
    if let Some(want) = pinned {
        // SAFETY: fstat on our descriptor into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        check(
            unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } as i64,
            &format!("fstat of {}", path.display()),
        )?;
        let now = (st.st_dev, st.st_ino);
        if now != want {
            return Err(fail(
                format!(
                    "writable root {} is no longer the directory pinned when the session opened \
                     (it was replaced or one of its parents was renamed)",
                    path.display()
                ),
                Errno::ESTALE,
            ));
        }
    }
    Ok(fd)
}

/// `openat2(path, O_PATH | O_DIRECTORY, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`.
fn open_no_symlinks(path: &Path) -> Result<OwnedFd, Errno> {
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
fn clone_tree_of(fd: &OwnedFd, shown_as: &Path) -> Result<OwnedFd, LayerError> {
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
fn attach_at(tree: &OwnedFd, target: &OwnedFd, shown_as: &Path) -> Result<(), LayerError> {
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

fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    // SAFETY: pidfd_open of our own pid.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a non-negative return is a fresh descriptor we own.
    (r >= 0).then(|| unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// A pidfd polls readable once its process has exited.
fn pidfd_exited(fd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one valid descriptor without waiting.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

fn mkdir(path: &Path) -> Result<(), LayerError> {
    std::fs::create_dir(path).map_err(|e| io_fail(path, e))
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

fn check(r: i64, what: &str) -> Result<(), LayerError> {
    if r < 0 {
        let e = Errno::last();
        return Err(fail(format!("{what} failed: {}", e.desc()), e));
    }
    Ok(())
}

fn owned(r: i64, what: &str) -> Result<OwnedFd, LayerError> {
    check(r, what)?;
    // SAFETY: a non-negative return of a descriptor-creating call is a descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

fn io_fail(path: &Path, e: std::io::Error) -> LayerError {
    let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
    fail(format!("preparing {} failed: {e}", path.display()), errno)
}

/// The fail-closed message of spec/sandbox.md §6, with a fix chosen from the errno.
fn fail(cause: String, errno: Errno) -> LayerError {
    // A refusal inside the user namespace of a daemon that is not root: name the host setting
    // that withholds its capabilities (AppArmor's restriction lets the namespace be made, then
    // refuses every capability in it), read now.
    let unprivileged = userns::needed().then(|| {
        (
            nix::unistd::geteuid().as_raw(),
            userns::HostSettings::read(),
        )
    });
    fail_with(cause, errno, unprivileged.as_ref())
}

/// [`fail`] with the daemon's situation spelled out: `Some((uid, settings))` when it is not
/// root (testable without changing the process's uid).
fn fail_with(
    cause: String,
    errno: Errno,
    unprivileged: Option<&(u32, userns::HostSettings)>,
) -> LayerError {
    let fix = match (errno, unprivileged) {
        (Errno::ESTALE, _) => {
            "Open a new session: writable roots are pinned when a session opens and are never re-resolved.".to_string()
        }
        (Errno::ENOSYS, _) => {
            "Use Linux 5.12 or newer (mount_setattr, open_tree, fsopen), or allow degraded mode for namespaces.".to_string()
        }
        (Errno::EPERM | Errno::EACCES, Some((uid, settings))) => format!(
            "The kernel refused it inside corral's own user namespace. {}.",
            userns::fix_text(*uid, settings)
        ),
        (Errno::EPERM | Errno::EACCES, None) => {
            "Run the corral daemon as root with CAP_SYS_ADMIN (inside a container, grant CAP_SYS_ADMIN and allow unshare and mount in its seccomp profile and LSM policy), or allow degraded mode for namespaces.".to_string()
        }
        _ => {
            "Check the kernel log and the mount table of the host, or allow degraded mode for namespaces.".to_string()
        }
    };
    LayerError {
        layer: LAYER,
        message: format!("sandbox unavailable: {LAYER} could not be applied: {cause}. {fix}"),
    }
}

fn describe_flags(flags: CloneFlags) -> String {
    let names = [
        (CloneFlags::CLONE_NEWNS, "CLONE_NEWNS"),
        (CloneFlags::CLONE_NEWPID, "CLONE_NEWPID"),
        (CloneFlags::CLONE_NEWUTS, "CLONE_NEWUTS"),
        (CloneFlags::CLONE_NEWIPC, "CLONE_NEWIPC"),
        (CloneFlags::CLONE_NEWNET, "CLONE_NEWNET"),
    ];
    names
        .iter()
        .filter(|(f, _)| flags.contains(*f))
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join("|")
}

#[cfg(test)]
mod tests {
    //! Each test forks a child that enters the namespaces and execs `/bin/sh -c <script>`; the
    //! parent reads its output through a pipe and checks the host afterwards. Every mount happens
    //! in the child's new mount namespace (made private first), and the targets are scratch
    //! directories, so a failing test cannot damage the host.

    use super::*;
    use crate::sandbox::policy::Mode;
    use crate::sandbox::roots::{SessionParams, build_policy};
    use std::collections::HashMap;
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// A scratch tree: `root` (the session cwd, the only writable root) and `out` (outside every
    /// root). Removed on drop.
    struct Scratch {
        base: PathBuf,
        root: PathBuf,
        out: PathBuf,
    }

    impl Scratch {
        fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let base = std::env::temp_dir().join(format!(
                "corral-ns-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = std::fs::remove_dir_all(&base);
            std::fs::create_dir_all(base.join("root")).unwrap();
            std::fs::create_dir_all(base.join("out")).unwrap();
            let base = std::fs::canonicalize(base).unwrap();
            Scratch {
                root: base.join("root"),
                out: base.join("out"),
                base,
            }
        }

        fn params(&self) -> SessionParams {
            SessionParams {
                mode: Mode::WorkspaceWrite,
                cwd: self.root.clone(),
                writable_roots: Vec::new(),
                network_access: false,
                exclude_tmpdir_env_var: true,
                // /tmp holds `out`; it must not be writable here.
                exclude_slash_tmp: true,
                env: Vec::new(),
                masked_paths: Vec::new(),
                identity: None,
                limits: Default::default(),
                writable_sources: crate::sandbox::roots::standard_writable_sources(),
                protected_names: crate::sandbox::roots::standard_protected_names(),
            }
        }

        fn policy(&self) -> SandboxPolicy {
            build_policy(&self.params()).unwrap()
        }

        /// Replaces ROOT and OUT in a script.
        fn script(&self, s: &str) -> String {
            s.replace("ROOT", &self.root.to_string_lossy())
                .replace("OUT", &self.out.to_string_lossy())
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }

    #[test]
    fn the_existing_parents_of_a_missing_gitdir_are_pinned() {
        let s = Scratch::new();
        std::fs::create_dir_all(s.root.join("sub/deeper")).unwrap();
        // A gitdir one and two levels below existing directories, and one whose first missing
        // component is directly in the root (nothing between to pin).
        std::fs::write(
            s.root.join(".git"),
            format!("gitdir: {}\n", s.root.join("sub/deeper/wt").display()),
        )
        .unwrap();
        let policy = s.policy();
        assert!(
            policy
                .protected_missing
                .contains(&s.root.join("sub/deeper/wt")),
            "{:?}",
            policy.protected_missing
        );
        let pins = ancestors_to_pin(&policy);
        assert_eq!(
            pins,
            [
                (s.root.join("sub"), false),
                (s.root.join("sub/deeper"), false)
            ]
        );

        std::fs::write(
            s.root.join(".git"),
            format!("gitdir: {}\n", s.root.join("gone/wt").display()),
        )
        .unwrap();
        let policy = s.policy();
        assert!(policy.protected_missing.contains(&s.root.join("gone")));
        assert_eq!(ancestors_to_pin(&policy), Vec::<(PathBuf, bool)>::new());
    }

    fn is_root() -> bool {
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            eprintln!("skipped: namespace tests need root (CI runs them as root)");
        }
        root
    }

    /// Runs `script` under `policy` in a forked child; returns (exit code, stdout+stderr).
    fn run(policy: &SandboxPolicy, cwd: &Path, script: &str) -> (i32, String) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 into a two-element buffer; close-on-exec so unrelated children (other
        // tests fork concurrently) do not keep our write end open.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let (r, w) = (fds[0], fds[1]);
        let sh = CString::new("/bin/sh").unwrap();
        let args = [
            CString::new("sh").unwrap(),
            CString::new("-c").unwrap(),
            CString::new(script).unwrap(),
        ];
        let cwd = CString::new(cwd.as_os_str().as_bytes()).unwrap();
        // SAFETY: the child only makes syscalls, the (single-threaded) confinement and exec.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => unsafe {
                libc::dup2(w, 1);
                libc::dup2(w, 2);
                libc::chdir(cwd.as_ptr());
                match enter_namespaces(policy) {
                    Ok(()) => {
                        let argv = [
                            args[0].as_ptr(),
                            args[1].as_ptr(),
                            args[2].as_ptr(),
                            std::ptr::null(),
                        ];
                        libc::execv(sh.as_ptr(), argv.as_ptr());
                        libc::_exit(127);
                    }
                    Err(e) => {
                        let msg = format!("LAYER ERROR: {e}\n");
                        libc::write(2, msg.as_ptr().cast(), msg.len());
                        libc::_exit(99);
                    }
                }
            },
            ForkResult::Parent { child } => {
                // SAFETY: our own descriptors.
                unsafe { libc::close(w) };
                let mut out = String::new();
                // SAFETY: r is ours; File closes it.
                let mut f = unsafe { std::fs::File::from_raw_fd(r) };
                f.read_to_string(&mut out).unwrap();
                let code = match nix::sys::wait::waitpid(child, None).unwrap() {
                    nix::sys::wait::WaitStatus::Exited(_, c) => c,
                    nix::sys::wait::WaitStatus::Signaled(_, s, _) => 128 + s as i32,
                    other => panic!("unexpected {other:?}"),
                };
                (code, out)
            }
        }
    }

    #[test]
    fn writes_outside_roots_are_read_only() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        let existing = s.out.join("existing");
        std::fs::write(&existing, "orig\n").unwrap();
        std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o644)).unwrap();
        // Baseline (§8.1 rule 1): outside the sandbox these all work.
        std::fs::write(s.out.join("baseline"), "b").unwrap();
        std::fs::remove_file(s.out.join("baseline")).unwrap();
        std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o644)).unwrap();

        let script = s.script(
            "echo in > ROOT/f && echo inside-ok\n\
             echo x > OUT/new || echo new-denied\n\
             echo x >> OUT/existing || echo append-denied\n\
             chmod 777 OUT/existing || echo chmod-denied\n\
             touch -d 2000-01-01 OUT/existing || echo touch-denied\n\
             exec 3<OUT/existing; echo x > /proc/self/fd/3 || echo fd-denied\n\
             echo x > /proc/self/rootOUT/existing || echo root-denied\n\
             chmod 700 ROOT/f && echo chmod-inside-ok\n",
        );
        let (code, out) = run(&s.policy(), &s.root, &script);
        assert_eq!(code, 0, "{out}");
        for want in [
            "inside-ok",
            "new-denied",
            "append-denied",
            "chmod-denied",
            "touch-denied",
            "fd-denied",
            "root-denied",
            "chmod-inside-ok",
        ] {
            assert!(out.contains(want), "missing {want} in:\n{out}");
        }
        assert!(out.contains("Read-only file system"), "{out}");
        // Host-side effects.
        assert_eq!(std::fs::read_to_string(s.root.join("f")).unwrap(), "in\n");
        assert!(!s.out.join("new").exists());
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "orig\n");
        let meta = std::fs::metadata(&existing).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        assert!(
            meta.modified().unwrap()
                > std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000)
        );
    }

    #[test]
    fn protected_paths_are_read_only_and_explicit_roots_win() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        let wt = s.root.join(".git/worktrees/wt");
        std::fs::create_dir_all(&wt).unwrap();
        std::fs::create_dir_all(s.root.join(".git/hooks")).unwrap();
        std::fs::write(s.root.join(".git/config"), "[core]\n").unwrap();
        std::fs::create_dir_all(s.root.join(".codex")).unwrap();
        let mut params = s.params();
        // An explicitly listed gitdir inside the protected .git stays writable (§2.3 override).
        params.writable_roots = vec![wt.clone()];
        let policy = build_policy(&params).unwrap();
        assert!(policy.protected_paths.contains(&s.root.join(".git")));

        let script = "echo x >> .git/config || echo config-denied\n\
             echo x > .git/hooks/pre-commit || echo hook-denied\n\
             echo x > .codex/config.toml || echo codex-denied\n\
             rm -rf .git 2>/dev/null || echo rm-denied\n\
             mv .git moved 2>/dev/null || echo mv-denied\n\
             echo w > .git/worktrees/wt/index.lock && echo wt-ok\n\
             echo ordinary > file && echo file-ok\n";
        let (code, out) = run(&policy, &s.root, script);
        assert_eq!(code, 0, "{out}");
        for want in [
            "config-denied",
            "hook-denied",
            "codex-denied",
            "rm-denied",
            "mv-denied",
            "wt-ok",
            "file-ok",
        ] {
            assert!(out.contains(want), "missing {want} in:\n{out}");
        }
        assert_eq!(
            std::fs::read_to_string(s.root.join(".git/config")).unwrap(),
            "[core]\n"
        );
        assert!(!s.root.join(".git/hooks/pre-commit").exists());
        assert!(!s.root.join(".codex/config.toml").exists());
        assert_eq!(
            std::fs::read_to_string(wt.join("index.lock")).unwrap(),
            "w\n"
        );
    }

    #[test]
    fn proc_shows_only_the_namespace() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        let me = std::process::id();
        // Builtins only, so the shell (PID 1) is the only process.
        let script = format!(
            "for d in /proc/[0-9]*; do echo pid=${{d#/proc/}}; done\n\
             echo self=$$\n\
             kill -0 {me} 2>/dev/null && echo host-visible || echo host-invisible\n\
             test -d /proc/{me} && echo host-proc || echo no-host-proc\n\
             echo x > /proc/sys/kernel/hostname 2>/dev/null || echo proc-ro\n"
        );
        let (code, out) = run(&s.policy(), &s.root, &script);
        assert_eq!(code, 0, "{out}");
        let pids: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("pid=")).collect();
        assert_eq!(pids, vec!["1"], "{out}");
        assert!(out.contains("self=1"), "{out}");
        assert!(out.contains("host-invisible"), "{out}");
        assert!(out.contains("no-host-proc"), "{out}");
        assert!(out.contains("proc-ro"), "{out}");
    }

    #[test]
    fn dev_is_minimal() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        let script = "for n in null zero full random urandom tty; do test -c /dev/$n || echo missing-$n; done\n\
             ls -A /dev | tr '\\n' ' '; echo\n\
             echo x > /dev/null && head -c1 /dev/urandom >/dev/null && echo hi > /dev/stdout\n\
             test \"$(head -c3 /dev/zero | wc -c)\" = 3 && echo zero-ok\n\
             echo x > /dev/full 2>/dev/null || echo full-enospc\n\
             echo s > /dev/shm/s && cat /dev/shm/s\n\
             test -c /dev/pts/ptmx && test -L /dev/ptmx && echo pts-ok\n\
             echo x > /dev/newfile 2>/dev/null || echo dev-ro\n\
             chmod 666 /dev/null 2>/dev/null || echo node-chmod-denied\n\
             mknod /dev/shm/n c 1 3 2>/dev/null; echo x > /dev/shm/n 2>/dev/null || echo shm-nodev\n";
        let (code, out) = run(&s.policy(), &s.root, script);
        assert_eq!(code, 0, "{out}");
        assert!(!out.contains("missing-"), "{out}");
        let listing = out.lines().next().unwrap();
        let mut names: Vec<&str> = listing.split_whitespace().collect();
        names.sort_unstable();
        assert_eq!(
            names,
            vec![
                "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
                "tty", "urandom", "zero"
            ],
            "{out}"
        );
        for want in [
            "hi",
            "zero-ok",
            "full-enospc",
            "s",
            "pts-ok",
            "dev-ro",
            "node-chmod-denied",
            "shm-nodev",
        ] {
            assert!(out.lines().any(|l| l == want), "missing {want} in:\n{out}");
        }
    }

    #[test]
    fn host_dev_shm_as_a_root_is_bound_read_write() {
        if !is_root() {
            return;
        }
        if !Path::new("/dev/shm").is_dir() {
            eprintln!("skipped: the host has no /dev/shm");
            return;
        }
        let s = Scratch::new();
        // A scratch file on the host's /dev/shm, overwritten from inside (Codex's
        // bwrap_preserves_writable_dev_shm_bind_mount).
        let name = format!("corral-ns-shm-{}", std::process::id());
        let host_file = Path::new("/dev/shm").join(&name);
        std::fs::write(&host_file, "before").unwrap();
        let mut params = s.params();
        params.writable_roots = vec!["/dev/shm".into()];
        let policy = build_policy(&params).unwrap();
        let script = format!("printf sandbox-after > /dev/shm/{name} && cat /dev/shm/{name}");
        let (code, out) = run(&policy, &s.root, &script);
        let host = std::fs::read_to_string(&host_file).unwrap();
        std::fs::remove_file(&host_file).unwrap();
        assert_eq!((code, out.as_str()), (0, "sandbox-after"));
        assert_eq!(host, "sandbox-after");
    }

    #[test]
    fn hostname_change_stays_inside() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        // Root still holds CAP_SYS_ADMIN at this layer, so the change succeeds inside; the point
        // is that it lands in the private UTS namespace.
        let (code, out) = run(
            &s.policy(),
            &s.root,
            "echo before=$(hostname); hostname corral-ns-test && echo after=$(hostname)",
        );
        assert_eq!(code, 0, "{out}");
        assert!(out.contains(&format!("before={}", host.trim())), "{out}");
        assert!(out.contains("after=corral-ns-test"), "{out}");
        assert_eq!(
            std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
            host
        );
    }

    #[test]
    fn network_off_has_only_loopback_and_it_is_up() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        let script = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '\n\
             if command -v ip >/dev/null; then ip -o link show lo; fi\n";
        let (code, out) = run(&s.policy(), &s.root, script);
        assert_eq!(code, 0, "{out}");
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("lo"), "{out}");
        let rest: Vec<&str> = lines.collect();
        if let Some(link) = rest.first() {
            assert!(link.contains("<LOOPBACK,UP"), "lo is not up: {out}");
        }
        assert!(
            rest.iter().all(|l| l.contains("lo:")),
            "unexpected interface: {out}"
        );

        // Network on keeps the host's namespace: the same interfaces as outside.
        let host_ifaces = std::fs::read_to_string("/proc/net/dev")
            .unwrap()
            .lines()
            .count()
            - 2;
        let mut policy = s.policy();
        policy.network = true;
        let (code, out) = run(&policy, &s.root, "tail -n +3 /proc/net/dev | wc -l");
        assert_eq!(code, 0, "{out}");
        assert_eq!(out.trim(), host_ifaces.to_string());
    }

    #[test]
    fn mountinfo_is_read_only_nosuid_nodev() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        std::fs::create_dir_all(s.root.join(".git")).unwrap();
        let policy = s.policy();
        let (code, out) = run(&policy, &s.root, "cat /proc/self/mountinfo");
        assert_eq!(code, 0, "{out}");
        let dev_nodes: Vec<String> = DEV_NODES.iter().map(|n| format!("/dev/{n}")).collect();
        // mountinfo also lists the host mounts now covered (host /dev, /proc and their children);
        // they must be sealed too, so every line is checked, with implications rather than
        // equalities. The last entry for a mount point is the one on top.
        let mut top: HashMap<&str, Vec<&str>> = HashMap::new();
        for line in out.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let (point, opts) = (f[4], f[5]);
            let opts: Vec<&str> = opts.split(',').collect();
            assert!(opts.contains(&"nosuid"), "{line}");
            if opts.contains(&"rw") {
                let allowed = point == "/dev/shm"
                    || point == "/dev/pts"
                    || policy
                        .writable_roots
                        .iter()
                        .any(|r| Path::new(point).starts_with(r))
                        && !policy
                            .protected_paths
                            .iter()
                            .any(|p| Path::new(point).starts_with(p));
                assert!(allowed, "writable mount outside the roots: {line}");
            }
            if !opts.contains(&"nodev") {
                let device = point == "/dev/pts" || dev_nodes.iter().any(|d| d == point);
                assert!(device, "device-capable mount: {line}");
            }
            top.insert(point, opts);
        }
        let root = s.root.to_string_lossy();
        let git = s.root.join(".git");
        let git = git.to_string_lossy();
        assert!(top[root.as_ref()].contains(&"rw"), "{out}");
        assert!(top[git.as_ref()].contains(&"ro"), "{out}");
        assert!(top["/"].contains(&"ro"), "{out}");
        assert!(
            top["/proc"].contains(&"ro") && top["/proc"].contains(&"noexec"),
            "{out}"
        );
        assert!(top["/dev"].contains(&"ro"), "{out}");
        assert!(top["/dev/null"].contains(&"ro"), "{out}");
        assert!(top["/dev/shm"].contains(&"rw"), "{out}");
    }

    #[test]
    fn masked_paths_are_hidden() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        let state = s.out.join("state");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("audit.log"), "secret").unwrap();
        let token = s.out.join("token");
        std::fs::write(&token, "tok").unwrap();
        let sock = s.out.join("docker.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let mut params = s.params();
        params.masked_paths = vec![
            state.clone(),
            token.clone(),
            sock.clone(),
            s.out.join("missing"),
        ];
        let policy = build_policy(&params).unwrap();
        let script = s.script(
            "echo entries=$(ls -A OUT/state | wc -l)\n\
             echo token=[$(cat OUT/token)]\n\
             test -S OUT/docker.sock && echo sock-visible || echo sock-hidden\n\
             echo x > OUT/token 2>/dev/null || echo token-ro\n\
             touch OUT/state/x 2>/dev/null || echo state-ro\n",
        );
        let (code, out) = run(&policy, &s.root, &script);
        assert_eq!(code, 0, "{out}");
        for want in [
            "entries=0",
            "token=[]",
            "sock-hidden",
            "token-ro",
            "state-ro",
        ] {
            assert!(out.lines().any(|l| l == want), "missing {want} in:\n{out}");
        }
        assert_eq!(
            std::fs::read_to_string(state.join("audit.log")).unwrap(),
            "secret"
        );
        assert_eq!(std::fs::read_to_string(&token).unwrap(), "tok");
    }

    #[test]
    fn read_only_mode_writes_nothing_and_status_propagates() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        let mut params = s.params();
        params.mode = Mode::ReadOnly;
        let policy = build_policy(&params).unwrap();
        let (code, out) = run(&policy, &s.root, "echo x > f || echo cwd-denied; exit 7");
        assert_eq!(code, 7, "{out}");
        assert!(
            out.contains("cwd-denied") && out.contains("Read-only file system"),
            "{out}"
        );
        assert!(!s.root.join("f").exists());
    }

    #[test]
    fn a_refusal_without_root_names_the_host_setting() {
        let apparmor = userns::HostSettings {
            apparmor_restrict_unprivileged_userns: Some(1),
            ..Default::default()
        };
        let e = fail_with(
            "unshare(CLONE_NEWNS|CLONE_NEWPID) failed: Operation not permitted".into(),
            Errno::EPERM,
            Some(&(1000, apparmor)),
        );
        let parts = e.parts().expect("standard shape");
        assert_eq!(
            parts.cause,
            "unshare(CLONE_NEWNS|CLONE_NEWPID) failed: Operation not permitted"
        );
        assert!(
            parts.fix.starts_with(
                "The kernel refused it inside corral's own user namespace. This daemon runs as uid 1000"
            ) && parts
                .fix
                .contains("sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"),
            "{}",
            parts.fix
        );
        // As root the fix is about root's own capabilities.
        let root = fail_with("x".into(), Errno::EPERM, None);
        assert!(root.message.contains("CAP_SYS_ADMIN"), "{}", root.message);
    }

    #[test]
    fn layer_error_names_the_layer() {
        let e = fail(
            "unshare(CLONE_NEWNS) failed: Operation not permitted".into(),
            Errno::EPERM,
        );
        assert_eq!(e.layer, "namespaces");
        assert!(
            e.message.starts_with(
                "sandbox unavailable: namespaces could not be applied: unshare(CLONE_NEWNS) failed: Operation not permitted. "
            ),
            "{}",
            e.message
        );
    }
}
