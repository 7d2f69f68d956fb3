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
//!
//! This file is the layer itself: the `unshare`, the fork, the parent's wait, the loopback
//! interface and the layer's fail-closed message. Its parts:
//! - `fsview`: what the sandbox sees, the filesystem view built by the child (§3.2);
//! - `mount_api`: thin, `SAFETY`-commented wrappers of the new mount API (`open_tree`,
//!   `move_mount`, `mount_setattr`, `fsopen`) and `openat2`, which the view is built with;
//! - `pidfd`: the two pidfd wrappers the fork uses to notice a parent that died early.

use crate::sandbox::error::LayerError;
use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::userns;
use fsview::build_view;
use nix::errno::Errno;
use nix::sched::{CloneFlags, unshare};
use nix::unistd::{ForkResult, fork};
use pidfd::{pidfd_exited, pidfd_open};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

mod fsview;
mod mount_api;
mod pidfd;

/// The layer name used in error messages and degraded-mode settings (spec/sandbox.md §6).
pub const LAYER: &str = "namespaces";

// Kernel ABI constants, defined here so the layer does not depend on which libc release exposes
// them (values from include/uapi/linux/sockios.h; identical on every architecture).
const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;

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

/// A TCP listener on 127.0.0.1:`port` inside the network namespace of process `pid`. A socket
/// belongs to the namespace it was made in, so a thread of its own enters that namespace,
/// makes it and ends: no other thread of the daemon ever leaves the host's namespace.
pub fn listen_in_netns(pid: u32, port: u16) -> std::io::Result<std::net::TcpListener> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)?;
                let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))?;
                listener.set_nonblocking(true)?;
                Ok(listener)
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the namespace thread panicked")))
    })
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
    use crate::sandbox::testutil::TempDir;
    use std::ffi::CString;
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Path, PathBuf};

    /// A scratch tree in a [`TempDir`]: `root` (the session cwd, the only writable root) and
    /// `out` (outside every root). Shared with the view's tests (`fsview`).
    pub(super) struct Scratch {
        _dir: TempDir,
        pub(super) root: PathBuf,
        pub(super) out: PathBuf,
    }

    impl Scratch {
        pub(super) fn new() -> Self {
            let dir = TempDir::new("ns");
            let (root, out) = (dir.path().join("root"), dir.path().join("out"));
            std::fs::create_dir_all(&root).unwrap();
            std::fs::create_dir_all(&out).unwrap();
            Scratch {
                _dir: dir,
                root,
                out,
            }
        }

        pub(super) fn params(&self) -> SessionParams {
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

        pub(super) fn policy(&self) -> SandboxPolicy {
            build_policy(&self.params()).unwrap()
        }

        /// Replaces ROOT and OUT in a script.
        pub(super) fn script(&self, s: &str) -> String {
            s.replace("ROOT", &self.root.to_string_lossy())
                .replace("OUT", &self.out.to_string_lossy())
        }
    }

    pub(super) fn is_root() -> bool {
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            eprintln!("skipped: namespace tests need root (CI runs them as root)");
        }
        root
    }

    /// Runs `script` under `policy` in a forked child; returns (exit code, stdout+stderr).
    pub(super) fn run(policy: &SandboxPolicy, cwd: &Path, script: &str) -> (i32, String) {
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
