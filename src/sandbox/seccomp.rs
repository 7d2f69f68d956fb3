//! The syscall filter (spec/sandbox.md §3.7): what the kernel must refuse to do for a sandboxed
//! process whatever its identity, capabilities or Landlock rights.
//!
//! The filter is data: [`RULES`] is the whole policy, one entry per (syscall, condition, errno,
//! why), grouped by what each protects. Everything not listed is allowed (a denylist); a denied
//! syscall returns `EPERM` unless the entry says otherwise (`clone3` and `openat2` → `ENOSYS`, so
//! libc falls back to `clone`/`openat`, whose flags and mode the filter can inspect).
//!
//! Three BPF programs are installed, all with `SECCOMP_FILTER_FLAG_TSYNC`:
//! - one `seccompiler` program per distinct errno in the table (`seccompiler` gives a whole filter
//!   a single match action, so `EPERM` and `ENOSYS` entries need separate programs);
//! - a small hand-built **architecture guard** ([`arch_guard_program`]): a syscall made through a
//!   foreign ABI (the i386 `int 0x80` entry, whose numbers differ: `socketcall`, i386 `socket`)
//!   kills the process, and a syscall number with the x32 bit `0x40000000` set returns `EPERM`.
//!   `seccompiler` matches exact syscall numbers and only checks the arch value; x32 calls carry
//!   `AUDIT_ARCH_X86_64` too, so on a kernel with x32 enabled `socket` as `41 | 0x40000000` would
//!   pass every rule. The guard needs a bit test (`BPF_JSET`), which `seccompiler` cannot express,
//!   hence a separate program. `EPERM` (not the kernel's `ENOSYS` for disabled x32) lets tests
//!   prove the filter acted.
//!
//! The kernel runs every installed program for each syscall and takes the most severe result
//! (kill > errno > allow; among equal kinds, the newest program's), so the programs compose:
//! a syscall is allowed only if every program allows it.
//!
//! Consequences: the worker itself must not use io_uring, namespaces or ptrace after this layer;
//! `strace`/`gdb` and programs that build their own namespace sandbox do not work inside.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};
use std::collections::{BTreeMap, BTreeSet};

use crate::sandbox::error::LayerError;
use crate::sandbox::policy::{Mode, Net, SandboxPolicy};
use crate::sandbox::report::{Layer, LayerReport};

const LAYER: &str = Layer::Seccomp.as_str();

const FIX_SECCOMP: &str = "Use a kernel with CONFIG_SECCOMP_FILTER=y (Linux 4.14 or newer) and, \
    inside a container, a seccomp profile that allows seccomp(2), or allow degraded mode for seccomp.";

/// When an entry applies, depending on the session's mode and network setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    Always,
    /// The network off entirely.
    NetworkOff,
    /// The network off, or reached only through corral's egress proxy.
    NoNetwork,
    /// Only through the egress proxy.
    Proxied,
    NetworkOn,
    /// Read-only mode, either network setting.
    ReadOnly,
}

/// The condition on the syscall's arguments under which the entry denies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Every call.
    Always,
    /// Argument `arg`, compared as 32 bits, differs from the value.
    Arg32Ne(u8, u64),
    /// Argument `arg`, compared as 32 bits, is none of the values.
    Arg32NotIn(u8, &'static [u64]),
    /// Argument `arg`, compared as 32 bits, equals the value.
    Arg32Eq(u8, u64),
    /// Argument `arg`, compared as 64 bits (a pointer), differs from the value.
    Arg64Ne(u8, u64),
    /// Argument `arg`, compared as 32 bits, has any of these bits set.
    Arg32AnyBit(u8, &'static [u64]),
    /// Argument `arg`, compared as 32 bits, masked with the first value, equals the second.
    Arg32MaskedEq(u8, u64, u64),
}

/// One entry of the filter table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyscallRule {
    /// The libc constant's name (`SYS_ptrace`); see [`SyscallRule::name`].
    pub syscall: &'static str,
    /// The native syscall number.
    pub nr: i64,
    pub applies: Applies,
    pub when: When,
    /// The errno the call returns when denied.
    pub errno: i32,
    /// What the entry protects, for reports and reviewers.
    pub why: &'static str,
}

impl SyscallRule {
    /// The syscall's name (`ptrace`).
    pub fn name(&self) -> &'static str {
        self.syscall.trim_start_matches("SYS_")
    }

    /// Whether the entry is part of the filter for this mode and network setting.
    pub fn active(&self, read_only: bool, net: Net) -> bool {
        match self.applies {
            Applies::Always => true,
            Applies::NetworkOff => net == Net::Off,
            Applies::NoNetwork => net != Net::On,
            Applies::Proxied => net == Net::Proxy,
            Applies::NetworkOn => net == Net::On,
            Applies::ReadOnly => read_only,
        }
    }
}

/// One table entry: the libc syscall constant, when it applies, the condition, the errno, why.
macro_rules! rule {
    ($sys:ident, $applies:ident, $when:expr, $errno:ident, $why:expr) => {
        SyscallRule {
            syscall: stringify!($sys),
            nr: libc::$sys,
            applies: Applies::$applies,
            when: $when,
            errno: libc::$errno,
            why: $why,
        }
    };
    // A syscall the libc crate does not name on every target: its number given explicitly.
    ($sys:ident = $nr:expr, $applies:ident, $when:expr, $errno:ident, $why:expr) => {
        SyscallRule {
            syscall: stringify!($sys),
            nr: $nr,
            applies: Applies::$applies,
            when: $when,
            errno: libc::$errno,
            why: $why,
        }
    };
}

const IO_URING: &str = "io_uring performs socket, connect and open operations without the \
    corresponding syscalls, bypassing the socket rules";
const OTHER_PROCESSES: &str = "reading or altering another process (including the worker) and \
    stealing its descriptors";
const KERNEL_SURFACE: &str =
    "large kernel attack surface used by exploits; not needed by normal tools";
const KEYRINGS: &str = "kernel keyrings are not namespaced; data could cross sessions";
const MOUNTS: &str = "the mounts are what enforce read-only paths";
const NAMESPACES: &str = "a new user namespace regains capabilities inside it and opens kernel \
    attack surface; setns could join other namespaces";
const CLONE3: &str = "clone3 passes its flags in memory the filter cannot read; ENOSYS makes libc \
    fall back to clone, whose flags the filter sees";
const HOSTNAME: &str = "host-global; Landlock does not cover it";
const HOST_TAKEOVER: &str = "host takeover (kernel modules, kexec, reboot)";
const HOST_CLOCK: &str = "host clock";
const HOST_GLOBAL: &str = "host-global state, raw port I/O, kernel log (host details)";
const HANDLES: &str = "opens files by handle, bypassing path-based confinement (the classic \
    container escape)";
const TERMINAL: &str = "injecting keystrokes into a terminal (the CVE-2017-5226 class)";
const NET_SOCKETS: &str = "network off: no IP, raw, netlink, packet or vsock sockets";
const NET_HOST_UNIX: &str = "network off: blocks reaching host UNIX sockets, which Landlock below \
    ABI 9 cannot control (e.g. docker.sock)";
const NET_ADDRESSED: &str =
    "network off: an unconnected datagram socket could address a host socket";
const NET_MMSG: &str = "network off: as Codex's restricted mode";
const PROXY_SOCKETS: &str = "network through the egress proxy: IP sockets only, which reach nothing \
    but the sandbox's own loopback (where Landlock allows TCP connect to the proxy's port alone); \
    no UNIX, netlink, packet or vsock sockets, since connect is allowed and a UNIX socket could \
    name a host socket";
const VSOCK: &str = "VSOCK reaches services on the hypervisor host and WSL2's Windows interop";
const SETID: &str = "no set-user-ID/set-group-ID file may be made: the owner may set these bits \
    without CAP_FSETID, and a setuid copy of a shell in a writable root gives the session's uid \
    (root, for a confined root caller) to any local user outside the sandbox";
const INOTIFY: &str = "inotify instances are a per-uid, host-wide resource (128 by default): a \
    sandbox holding them all breaks the caller's own unsandboxed programs. Commands get none (file \
    watchers must poll)";
const FANOTIFY: &str = "fanotify groups are a per-uid, host-wide resource (128 by default) that \
    unprivileged processes may create since Linux 5.13: a sandbox holding them all breaks the \
    caller's own programs and the guard of every later sandbox of the caller. The worker makes \
    the one group its guard needs before this filter; commands get none";
const OPENAT2: &str = "openat2 passes its mode in memory the filter cannot read; ENOSYS makes libc \
    fall back to openat, whose mode the filter sees";
const RO_TRUNCATE: &str = "read-only mode: Landlock does not handle TRUNCATE there (landlock.rs), \
    and the read-only mounts do not cover a file reached through /proc/self/fd of a descriptor a \
    host process handed over; an O_TRUNC open with write access still needs Landlock's WRITE_FILE";

/// The access mode and `O_TRUNC` bits of an `open` flags argument. `O_TRUNC` truncates whatever
/// the access mode, and access mode 3 ("check read and write permission, allow neither") asks
/// Landlock for no write right at all, so both 0 (`O_RDONLY`) and 3 are refused with `O_TRUNC`.
const TRUNC_ACCMODE: u64 = (libc::O_ACCMODE | libc::O_TRUNC) as u64;
const TRUNC_RDONLY: u64 = libc::O_TRUNC as u64;
const TRUNC_NOACCESS: u64 = (libc::O_TRUNC | libc::O_ACCMODE) as u64;

/// `S_ISUID` and `S_ISGID`: either bit in a mode argument (compared as 32 bits: `mode_t` and the
/// kernel's `umode_t` are at most 32 bits wide, and both bits lie in the low 16) denies the call.
/// The mode of `open`/`openat` is checked whatever the flags: the kernel ignores it without
/// `O_CREAT`/`O_TMPFILE`, and libc passes 0 there, so checking it always costs nothing and leaves
/// no flag combination to get wrong.
const SETID_BITS: &[u64] = &[libc::S_ISUID as u64, libc::S_ISGID as u64];

/// `fchmodat2` (Linux 6.6) has number 452 in both the x86_64 table and the generic table aarch64
/// uses; the libc crate names it only on some targets, hence the number (checked on x86_64).
const SYS_FCHMODAT2: i64 = 452;

/// `CLONE_NEW*` flags visible in `clone`'s first argument. (`CLONE_NEWTIME`, 0x80, overlaps the
/// exit-signal byte of `clone` and is only accepted by `clone3`, which returns `ENOSYS` anyway.)
const CLONE_NEW_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// Terminal ioctl requests (asm-generic values, the same on x86_64 and aarch64; libc's type for
/// them differs between C libraries, hence plain numbers, checked against libc in the tests).
const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;

const AF_UNIX: u64 = libc::AF_UNIX as u64;
const AF_VSOCK: u64 = libc::AF_VSOCK as u64;
const AF_INET: u64 = libc::AF_INET as u64;
const AF_INET6: u64 = libc::AF_INET6 as u64;

/// The whole filter policy (spec/sandbox.md §3.7): syscall, when it applies, condition on its
/// arguments, errno, and what the entry protects.
#[rustfmt::skip]
pub const RULES: &[SyscallRule] = &[
    // io_uring: bypasses every socket rule.
    rule!(SYS_io_uring_setup,     Always,     When::Always,                        EPERM,  IO_URING),
    rule!(SYS_io_uring_enter,     Always,     When::Always,                        EPERM,  IO_URING),
    rule!(SYS_io_uring_register,  Always,     When::Always,                        EPERM,  IO_URING),
    // Other processes' memory and descriptors.
    rule!(SYS_ptrace,             Always,     When::Always,                        EPERM,  OTHER_PROCESSES),
    rule!(SYS_process_vm_readv,   Always,     When::Always,                        EPERM,  OTHER_PROCESSES),
    rule!(SYS_process_vm_writev,  Always,     When::Always,                        EPERM,  OTHER_PROCESSES),
    rule!(SYS_pidfd_getfd,        Always,     When::Always,                        EPERM,  OTHER_PROCESSES),
    // Kernel attack surface.
    rule!(SYS_bpf,                Always,     When::Always,                        EPERM,  KERNEL_SURFACE),
    rule!(SYS_perf_event_open,    Always,     When::Always,                        EPERM,  KERNEL_SURFACE),
    rule!(SYS_userfaultfd,        Always,     When::Always,                        EPERM,  KERNEL_SURFACE),
    // Keyrings.
    rule!(SYS_keyctl,             Always,     When::Always,                        EPERM,  KEYRINGS),
    rule!(SYS_add_key,            Always,     When::Always,                        EPERM,  KEYRINGS),
    rule!(SYS_request_key,        Always,     When::Always,                        EPERM,  KEYRINGS),
    // The read-only mounts.
    rule!(SYS_mount,              Always,     When::Always,                        EPERM,  MOUNTS),
    rule!(SYS_umount2,            Always,     When::Always,                        EPERM,  MOUNTS),
    rule!(SYS_pivot_root,         Always,     When::Always,                        EPERM,  MOUNTS),
    rule!(SYS_move_mount,         Always,     When::Always,                        EPERM,  MOUNTS),
    rule!(SYS_open_tree,          Always,     When::Always,                        EPERM,  MOUNTS),
    rule!(SYS_fsopen,             Always,     When::Always,                        EPERM,  MOUNTS),
    rule!(SYS_fsconfig,           Always,     When::Always,                        EPERM,  MOUNTS),
    rule!(SYS_fsmount,            Always,     When::Always,                        EPERM,  MOUNTS),
    rule!(SYS_fspick,             Always,     When::Always,                        EPERM,  MOUNTS),
    rule!(SYS_mount_setattr,      Always,     When::Always,                        EPERM,  MOUNTS),
    // Namespaces.
    rule!(SYS_unshare,            Always,     When::Always,                        EPERM,  NAMESPACES),
    rule!(SYS_setns,              Always,     When::Always,                        EPERM,  NAMESPACES),
    rule!(SYS_clone,              Always,     When::Arg32AnyBit(0, CLONE_NEW_FLAGS), EPERM, NAMESPACES),
    rule!(SYS_clone3,             Always,     When::Always,                        ENOSYS, CLONE3),
    // Host-global state.
    rule!(SYS_sethostname,        Always,     When::Always,                        EPERM,  HOSTNAME),
    rule!(SYS_setdomainname,      Always,     When::Always,                        EPERM,  HOSTNAME),
    rule!(SYS_init_module,        Always,     When::Always,                        EPERM,  HOST_TAKEOVER),
    rule!(SYS_finit_module,       Always,     When::Always,                        EPERM,  HOST_TAKEOVER),
    rule!(SYS_delete_module,      Always,     When::Always,                        EPERM,  HOST_TAKEOVER),
    rule!(SYS_kexec_load,         Always,     When::Always,                        EPERM,  HOST_TAKEOVER),
    rule!(SYS_kexec_file_load,    Always,     When::Always,                        EPERM,  HOST_TAKEOVER),
    rule!(SYS_reboot,             Always,     When::Always,                        EPERM,  HOST_TAKEOVER),
    rule!(SYS_settimeofday,       Always,     When::Always,                        EPERM,  HOST_CLOCK),
    rule!(SYS_clock_settime,      Always,     When::Always,                        EPERM,  HOST_CLOCK),
    rule!(SYS_clock_adjtime,      Always,     When::Always,                        EPERM,  HOST_CLOCK),
    rule!(SYS_adjtimex,           Always,     When::Always,                        EPERM,  HOST_CLOCK),
    rule!(SYS_swapon,             Always,     When::Always,                        EPERM,  HOST_GLOBAL),
    rule!(SYS_swapoff,            Always,     When::Always,                        EPERM,  HOST_GLOBAL),
    rule!(SYS_acct,               Always,     When::Always,                        EPERM,  HOST_GLOBAL),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_iopl,               Always,     When::Always,                        EPERM,  HOST_GLOBAL),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_ioperm,             Always,     When::Always,                        EPERM,  HOST_GLOBAL),
    rule!(SYS_syslog,             Always,     When::Always,                        EPERM,  HOST_GLOBAL),
    // Path-based confinement.
    rule!(SYS_open_by_handle_at,  Always,     When::Always,                        EPERM,  HANDLES),
    // Terminal injection (the request is an unsigned int in the kernel: 32-bit compare).
    rule!(SYS_ioctl,              Always,     When::Arg32Eq(1, TIOCSTI),           EPERM,  TERMINAL),
    rule!(SYS_ioctl,              Always,     When::Arg32Eq(1, TIOCLINUX),         EPERM,  TERMINAL),
    // Set-user-ID / set-group-ID bits (arm64 has only the *at forms; the argument is the mode).
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_chmod,              Always,     When::Arg32AnyBit(1, SETID_BITS),    EPERM,  SETID),
    rule!(SYS_fchmod,             Always,     When::Arg32AnyBit(1, SETID_BITS),    EPERM,  SETID),
    rule!(SYS_fchmodat,           Always,     When::Arg32AnyBit(2, SETID_BITS),    EPERM,  SETID),
    rule!(SYS_fchmodat2 = SYS_FCHMODAT2, Always, When::Arg32AnyBit(2, SETID_BITS), EPERM,  SETID),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_open,               Always,     When::Arg32AnyBit(2, SETID_BITS),    EPERM,  SETID),
    rule!(SYS_openat,             Always,     When::Arg32AnyBit(3, SETID_BITS),    EPERM,  SETID),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_creat,              Always,     When::Arg32AnyBit(1, SETID_BITS),    EPERM,  SETID),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_mkdir,              Always,     When::Arg32AnyBit(1, SETID_BITS),    EPERM,  SETID),
    rule!(SYS_mkdirat,            Always,     When::Arg32AnyBit(2, SETID_BITS),    EPERM,  SETID),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_mknod,              Always,     When::Arg32AnyBit(1, SETID_BITS),    EPERM,  SETID),
    rule!(SYS_mknodat,            Always,     When::Arg32AnyBit(2, SETID_BITS),    EPERM,  SETID),
    rule!(SYS_openat2,            Always,     When::Always,                        ENOSYS, OPENAT2),
    // Read-only mode: truncation by path (creat always opens for writing: not listed).
    rule!(SYS_truncate,           ReadOnly,   When::Always,                        EPERM,  RO_TRUNCATE),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_open,               ReadOnly,   When::Arg32MaskedEq(1, TRUNC_ACCMODE, TRUNC_RDONLY),   EPERM, RO_TRUNCATE),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_open,               ReadOnly,   When::Arg32MaskedEq(1, TRUNC_ACCMODE, TRUNC_NOACCESS), EPERM, RO_TRUNCATE),
    rule!(SYS_openat,             ReadOnly,   When::Arg32MaskedEq(2, TRUNC_ACCMODE, TRUNC_RDONLY),   EPERM, RO_TRUNCATE),
    rule!(SYS_openat,             ReadOnly,   When::Arg32MaskedEq(2, TRUNC_ACCMODE, TRUNC_NOACCESS), EPERM, RO_TRUNCATE),
    // Per-uid kernel resources the caller's unsandboxed processes need.
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_inotify_init,       Always,     When::Always,                        EPERM,  INOTIFY),
    rule!(SYS_inotify_init1,      Always,     When::Always,                        EPERM,  INOTIFY),
    rule!(SYS_fanotify_init,      Always,     When::Always,                        EPERM,  FANOTIFY),
    // Network off: only AF_UNIX sockets, and no reaching out with them.
    rule!(SYS_socket,             NetworkOff, When::Arg32Ne(0, AF_UNIX),           EPERM,  NET_SOCKETS),
    rule!(SYS_connect,            NetworkOff, When::Always,                        EPERM,  NET_HOST_UNIX),
    // Network off or proxied: no servers, no addressed datagrams.
    rule!(SYS_socketpair,         NoNetwork,  When::Arg32Ne(0, AF_UNIX),           EPERM,  NET_SOCKETS),
    rule!(SYS_bind,               NoNetwork,  When::Always,                        EPERM,  NET_HOST_UNIX),
    rule!(SYS_listen,             NoNetwork,  When::Always,                        EPERM,  NET_HOST_UNIX),
    rule!(SYS_accept,             NoNetwork,  When::Always,                        EPERM,  NET_HOST_UNIX),
    rule!(SYS_accept4,            NoNetwork,  When::Always,                        EPERM,  NET_HOST_UNIX),
    rule!(SYS_sendto,             NoNetwork,  When::Arg64Ne(4, 0),                 EPERM,  NET_ADDRESSED),
    rule!(SYS_sendmmsg,           NoNetwork,  When::Always,                        EPERM,  NET_MMSG),
    rule!(SYS_recvmmsg,           NoNetwork,  When::Always,                        EPERM,  NET_MMSG),
    // Proxied: IP sockets only (connect is allowed; Landlock and the namespace bound it).
    rule!(SYS_socket,             Proxied,    When::Arg32NotIn(0, &[AF_INET, AF_INET6]), EPERM, PROXY_SOCKETS),
    // Network on: still no VSOCK.
    rule!(SYS_socket,             NetworkOn,  When::Arg32Eq(0, AF_VSOCK),          EPERM,  VSOCK),
    rule!(SYS_socketpair,         NetworkOn,  When::Arg32Eq(0, AF_VSOCK),          EPERM,  VSOCK),
];

// ---------------------------------------------------------------------------------------------
// Architecture guard (hand-built BPF).

/// `AUDIT_ARCH_*` of the native ABI (linux/audit.h).
#[cfg(target_arch = "x86_64")]
pub const NATIVE_AUDIT_ARCH: u32 = 0xC000_003E; // EM_X86_64 | 64BIT | LE
#[cfg(target_arch = "aarch64")]
pub const NATIVE_AUDIT_ARCH: u32 = 0xC000_00B7; // EM_AARCH64 | 64BIT | LE

#[cfg(target_arch = "x86_64")]
const TARGET: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const TARGET: TargetArch = TargetArch::aarch64;

/// `__X32_SYSCALL_BIT`.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20)
const BPF_JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
#[cfg(target_arch = "x86_64")]
const BPF_JSET_K: u16 = 0x05 | 0x40; // BPF_JMP | BPF_JSET | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
const SECCOMP_DATA_NR: u32 = 0; // offsetof(struct seccomp_data, nr)
const SECCOMP_DATA_ARCH: u32 = 4; // offsetof(struct seccomp_data, arch)
const RET_KILL_PROCESS: u32 = 0x8000_0000;
#[cfg(target_arch = "x86_64")]
const RET_ERRNO: u32 = 0x0005_0000;
const RET_ALLOW: u32 = 0x7fff_0000;

const fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The guard program:
/// ```text
/// 0: ld  [arch]
/// 1: jeq NATIVE_AUDIT_ARCH, +1, +0   ; native → 3
/// 2: ret KILL_PROCESS                 ; i386 int 0x80, or any foreign ABI
/// 3: ld  [nr]
/// 4: jset 0x40000000, +0, +1          ; x32 bit set → 5, else → 6
/// 5: ret ERRNO(EPERM)
/// 6: ret ALLOW                        ; the table's programs decide
/// ```
/// (On aarch64 there is no x32 ABI, so steps 3–5 are left out.)
pub fn arch_guard_program() -> BpfProgram {
    let mut p = vec![
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARCH),
        jump(BPF_JEQ_K, NATIVE_AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, RET_KILL_PROCESS),
    ];
    #[cfg(target_arch = "x86_64")]
    p.extend([
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR),
        jump(BPF_JSET_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET_K, RET_ERRNO | libc::EPERM as u32),
    ]);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = SECCOMP_DATA_NR;
    p.push(stmt(BPF_RET_K, RET_ALLOW));
    p
}

// ---------------------------------------------------------------------------------------------
// Compiling the table.

fn condition(
    arg: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, LayerError> {
    SeccompCondition::new(arg, len, op, value).map_err(|e| build_error(&e.to_string()))
}

fn seccomp_rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, LayerError> {
    SeccompRule::new(conditions).map_err(|e| build_error(&e.to_string()))
}

fn build_error(cause: &str) -> LayerError {
    LayerError::new(
        LAYER,
        format!("building the filter failed: {cause}"),
        "This is a bug in corral's filter table; report it",
    )
}

/// The `seccompiler` rules (ORed) for one entry's condition.
fn to_seccompiler(when: When) -> Result<Vec<SeccompRule>, LayerError> {
    use SeccompCmpArgLen::{Dword, Qword};
    Ok(match when {
        When::Always => Vec::new(),
        When::Arg32Ne(arg, v) => vec![seccomp_rule(vec![condition(
            arg,
            Dword,
            SeccompCmpOp::Ne,
            v,
        )?])?],
        When::Arg32NotIn(arg, values) => vec![seccomp_rule(
            values
                .iter()
                .map(|&v| condition(arg, Dword, SeccompCmpOp::Ne, v))
                .collect::<Result<_, _>>()?,
        )?],
        When::Arg32Eq(arg, v) => vec![seccomp_rule(vec![condition(
            arg,
            Dword,
            SeccompCmpOp::Eq,
            v,
        )?])?],
        When::Arg64Ne(arg, v) => vec![seccomp_rule(vec![condition(
            arg,
            Qword,
            SeccompCmpOp::Ne,
            v,
        )?])?],
        When::Arg32AnyBit(arg, bits) => bits
            .iter()
            .map(|&bit| {
                seccomp_rule(vec![condition(
                    arg,
                    Dword,
                    SeccompCmpOp::MaskedEq(bit),
                    bit,
                )?])
            })
            .collect::<Result<_, _>>()?,
        When::Arg32MaskedEq(arg, mask, v) => vec![seccomp_rule(vec![condition(
            arg,
            Dword,
            SeccompCmpOp::MaskedEq(mask),
            v,
        )?])?],
    })
}

/// Compiles `rules` (already selected for the network setting) into one program per errno, in
/// ascending errno order. Entries for the same syscall and errno are ORed; an unconditional entry
/// makes the whole syscall unconditional.
pub fn compile(rules: &[SyscallRule]) -> Result<Vec<BpfProgram>, LayerError> {
    let errnos: BTreeSet<i32> = rules.iter().map(|r| r.errno).collect();
    let mut programs = Vec::new();
    for errno in errnos {
        let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        let mut unconditional: BTreeSet<i64> = BTreeSet::new();
        for r in rules.iter().filter(|r| r.errno == errno) {
            if r.when == When::Always {
                unconditional.insert(r.nr);
            }
            map.entry(r.nr).or_default().extend(to_seccompiler(r.when)?);
        }
        for nr in unconditional {
            map.insert(nr, Vec::new()); // empty chain = match every call
        }
        let filter = SeccompFilter::new(
            map,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            TARGET,
        )
        .map_err(|e| build_error(&e.to_string()))?;
        programs.push(BpfProgram::try_from(filter).map_err(|e| build_error(&e.to_string()))?);
    }
    Ok(programs)
}

/// The entries in force for a mode (read-only or not) and network setting.
pub fn active_rules(read_only: bool, net: Net) -> Vec<SyscallRule> {
    RULES
        .iter()
        .copied()
        .filter(|r| r.active(read_only, net))
        .collect()
}

/// Every program for the mode and `net`: the table's programs, then the architecture guard.
pub fn build(read_only: bool, net: Net) -> Result<Vec<BpfProgram>, LayerError> {
    let mut programs = compile(&active_rules(read_only, net))?;
    programs.push(arch_guard_program());
    Ok(programs)
}

/// Installs programs on every thread of the process (TSYNC), in order.
pub fn install(programs: &[BpfProgram]) -> Result<(), LayerError> {
    for p in programs {
        seccompiler::apply_filter_all_threads(p).map_err(|e| {
            LayerError::new(
                LAYER,
                format!("installing the filter failed: {e}"),
                FIX_SECCOMP,
            )
        })?;
    }
    Ok(())
}

/// Builds and installs the filter for `policy`. Not applicable in danger-full-access.
pub fn apply(policy: &SandboxPolicy) -> Result<LayerReport, LayerError> {
    if !policy.mode.is_sandboxed() {
        return Ok(LayerReport::not_applicable(
            Layer::Seccomp,
            "danger-full-access uses no seccomp filter",
        ));
    }
    let read_only = policy.mode == Mode::ReadOnly;
    let programs = build(read_only, policy.net())?;
    install(&programs)?;
    let rules = active_rules(read_only, policy.net());
    let names: BTreeSet<&str> = rules.iter().map(SyscallRule::name).collect();
    Ok(LayerReport::enforced(
        Layer::Seccomp,
        format!(
            "{} programs ({} table entries, {}, network {}, arch guard: foreign arch kills, x32 EPERM); \
             filtered syscalls: {}",
            programs.len(),
            rules.len(),
            policy.mode.as_str(),
            match policy.net() {
                Net::On => "on",
                Net::Proxy => "through the egress proxy",
                Net::Off => "off",
            },
            names.into_iter().collect::<Vec<_>>().join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::policy::Mode;
    use crate::sandbox::testutil::{
        TempDir, assert_child_ok, expect_errno, expect_success, in_child, sh_denied, sh_ok,
    };
    use nix::sys::signal::Signal;
    use nix::sys::wait::WaitStatus;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};

    fn policy(network: bool) -> SandboxPolicy {
        SandboxPolicy {
            network,
            ..SandboxPolicy::bare(Mode::ReadOnly, "/")
        }
    }

    fn apply_in_child(network: bool) -> Result<(), String> {
        apply(&policy(network)).map(drop).map_err(|e| e.to_string())
    }

    /// A syscall with every argument set to all-ones: invalid for each denied syscall, so even if
    /// the filter let it through it would fail harmlessly (no hostname change, no reboot...).
    fn probe(nr: i64) -> i64 {
        let a = u64::MAX;
        // SAFETY: all-ones arguments are rejected by the kernel before any side effect.
        unsafe { libc::syscall(nr, a, a, a, a, a, a) }
    }

    fn socket(domain: i32, ty: i32, proto: i32) -> i64 {
        // SAFETY: integer arguments only.
        let fd = unsafe { libc::socket(domain, ty, proto) };
        if fd >= 0 {
            // SAFETY: closing the fd just created.
            unsafe { libc::close(fd) };
        }
        fd as i64
    }

    fn hostname() -> String {
        nix::unistd::gethostname().unwrap().into_string().unwrap()
    }

    #[test]
    fn table_is_well_formed() {
        assert_eq!(TIOCSTI, libc::TIOCSTI as libc::c_ulong);
        assert_eq!(TIOCLINUX, libc::TIOCLINUX as libc::c_ulong);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(SYS_FCHMODAT2, libc::SYS_fchmodat2);
        let mut seen = BTreeSet::new();
        for r in RULES {
            assert!(r.syscall.starts_with("SYS_") && !r.why.is_empty(), "{r:?}");
            assert!(
                seen.insert((r.nr, format!("{:?}{:?}", r.applies, r.when))),
                "duplicate {r:?}"
            );
            assert!(
                r.errno == libc::EPERM
                    || (["clone3", "openat2"].contains(&r.name()) && r.errno == libc::ENOSYS),
                "{r:?}"
            );
        }
        // Both network settings compile, with the guard last.
        for read_only in [false, true] {
            for net in [Net::Off, Net::Proxy, Net::On] {
                let p = build(read_only, net).unwrap();
                assert_eq!(p.len(), 3, "EPERM program, ENOSYS program, guard");
                assert_eq!(p.last(), Some(&arch_guard_program()));
            }
        }
    }

    #[test]
    fn every_unconditional_entry_is_caught_by_the_filter() {
        // Remap every errno to a marker no kernel path returns for these calls, so the result
        // proves the filter (not the kernel) refused each one.
        const MARKER: i32 = libc::EHWPOISON;
        let marked: Vec<SyscallRule> = RULES
            .iter()
            .filter(|r| r.applies == Applies::Always)
            .map(|r| SyscallRule {
                errno: MARKER,
                ..*r
            })
            .collect();
        assert_child_ok(move || {
            install(&compile(&marked).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
            for r in marked
                .iter()
                .filter(|r| r.when == When::Always || r.name() == "clone")
            {
                expect_errno(r.name(), probe(r.nr), MARKER)?;
            }
            Ok(())
        });
        // And with the real table each returns its specified errno.
        assert_child_ok(|| {
            apply_in_child(false)?;
            for r in RULES
                .iter()
                .filter(|r| r.applies == Applies::Always && r.when == When::Always)
            {
                expect_errno(r.name(), probe(r.nr), r.errno)?;
            }
            Ok(())
        });
    }

    #[test]
    fn network_off_allows_only_unix_sockets_that_reach_nothing() {
        // Baseline: the host can make every one of these sockets.
        assert!(socket(libc::AF_INET, libc::SOCK_STREAM, 0) >= 0);
        assert!(socket(libc::AF_NETLINK, libc::SOCK_RAW, 0) >= 0);
        let dir = TempDir::new("sc-net");
        let path = dir.path().join("listener.sock");
        let listener = UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        drop(UnixStream::connect(&path).unwrap()); // baseline connect works
        let _ = listener.accept().unwrap();
        let p = path.clone();
        assert_child_ok(move || {
            apply_in_child(false)?;
            for (name, d, t, pr) in [
                ("AF_INET", libc::AF_INET, libc::SOCK_STREAM, 0),
                ("AF_INET6", libc::AF_INET6, libc::SOCK_DGRAM, 0),
                ("AF_NETLINK", libc::AF_NETLINK, libc::SOCK_RAW, 0),
                ("AF_PACKET", libc::AF_PACKET, libc::SOCK_RAW, 0),
                ("AF_VSOCK", libc::AF_VSOCK, libc::SOCK_STREAM, 0),
                (
                    "MPTCP",
                    libc::AF_INET,
                    libc::SOCK_STREAM,
                    libc::IPPROTO_MPTCP,
                ),
            ] {
                expect_errno(name, socket(d, t, pr), libc::EPERM)?;
            }
            // The upper 32 bits of the domain are ignored by the kernel and by the filter.
            // SAFETY: integer arguments only.
            let wide = unsafe {
                libc::syscall(
                    libc::SYS_socket,
                    (1u64 << 32) | libc::AF_INET as u64,
                    libc::SOCK_STREAM,
                    0,
                )
            };
            expect_errno("AF_INET with high bits", wide, libc::EPERM)?;
            // AF_UNIX socketpairs work, with send (sendto, null address), option and name calls.
            let (a, b) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
            // SAFETY: valid fds and buffers.
            unsafe {
                expect_success(
                    "send",
                    libc::send(a.as_raw_fd(), b"x".as_ptr().cast(), 1, 0) as i64,
                )?;
                let mut buf = [0u8; 1];
                expect_success(
                    "recv",
                    libc::recv(b.as_raw_fd(), buf.as_mut_ptr().cast(), 1, 0) as i64,
                )?;
                let mut v: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                expect_success(
                    "getsockopt",
                    libc::getsockopt(
                        a.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_TYPE,
                        (&mut v as *mut libc::c_int).cast(),
                        &mut len,
                    ) as i64,
                )?;
                let mut ss: libc::sockaddr_storage = std::mem::zeroed();
                let mut sl = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                expect_success(
                    "getsockname",
                    libc::getsockname(
                        a.as_raw_fd(),
                        (&mut ss as *mut libc::sockaddr_storage).cast(),
                        &mut sl,
                    ) as i64,
                )?;
                expect_success(
                    "shutdown",
                    libc::shutdown(a.as_raw_fd(), libc::SHUT_WR) as i64,
                )?;
            }
            let (da, _db) = UnixDatagram::pair().map_err(|e| format!("dgram socketpair: {e}"))?;
            // Addressed sendto (to the host listener's path) is refused, connect too.
            match da.send_to(b"x", &p) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                other => return Err(format!("addressed sendto: {other:?}")),
            }
            match UnixStream::connect(&p) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                other => return Err(format!("connect to host unix socket: {other:?}")),
            }
            // sendmmsg is denied whatever the arguments.
            // SAFETY: null vector with length 0.
            let rc = unsafe { libc::sendmmsg(da.as_raw_fd(), std::ptr::null_mut(), 0, 0) };
            expect_errno("sendmmsg", rc as i64, libc::EPERM)?;
            // What commands see: Python and bash get "Operation not permitted".
            sh_denied(
                "python3 -c 'import socket; socket.socket(socket.AF_INET)'",
                "PermissionError: [Errno 1] Operation not permitted",
            )?;
            sh_denied(
                "bash -c 'echo hi >/dev/tcp/127.0.0.1/80'",
                "Operation not permitted",
            )?;
            sh_ok(
                "python3 -c 'import socket;a,b=socket.socketpair();a.send(b\"x\");assert b.recv(1)'",
            )?;
            Ok(())
        });
        assert!(
            listener.accept().is_err(),
            "the host listener must have accepted nothing"
        );
    }

    #[test]
    fn proxied_allows_ip_sockets_and_connect_but_no_unix_sockets_or_servers() {
        // The seccomp layer alone: in a sandbox the namespace holds only loopback and Landlock
        // allows TCP connect to the proxy's port alone (landlock.rs tests that part).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let unix_dir = TempDir::new("proxied-unix");
        let unix_path = unix_dir.path().join("host.sock");
        let _host_socket = UnixListener::bind(&unix_path).unwrap();
        assert_child_ok(move || {
            let proxied = SandboxPolicy {
                egress: Some(crate::sandbox::policy::Egress {
                    port: addr.port(),
                    session: "s".into(),
                }),
                ..policy(false)
            };
            install(&build(true, proxied.net()).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            std::net::TcpStream::connect(addr).map_err(|e| format!("connect to the proxy: {e}"))?;
            expect_success(
                "socket(AF_INET6)",
                socket(libc::AF_INET6, libc::SOCK_STREAM, 0),
            )?;
            expect_errno(
                "socket(AF_UNIX)",
                socket(libc::AF_UNIX, libc::SOCK_STREAM, 0),
                libc::EPERM,
            )?;
            expect_errno(
                "socket(AF_NETLINK)",
                socket(libc::AF_NETLINK, libc::SOCK_RAW, 0),
                libc::EPERM,
            )?;
            expect_errno(
                "socket(AF_VSOCK)",
                socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0),
                libc::EPERM,
            )?;
            match UnixStream::connect(&unix_path) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                other => return Err(format!("a host UNIX socket: {other:?}")),
            }
            match std::net::TcpListener::bind("127.0.0.1:0") {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                other => return Err(format!("a server: {other:?}")),
            }
            sh_ok(
                "python3 -c 'import socket;a,b=socket.socketpair();a.send(b\"x\");assert b.recv(1)'",
            )?;
            Ok(())
        });
        assert!(
            listener.accept().is_ok(),
            "the proxy's listener was reached"
        );
    }

    #[test]
    fn network_on_allows_ip_but_not_vsock() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert_child_ok(move || {
            apply_in_child(true)?;
            expect_errno(
                "AF_VSOCK",
                socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0),
                libc::EPERM,
            )?;
            let mut fds = [0; 2];
            // SAFETY: valid array for two fds.
            let rc =
                unsafe { libc::socketpair(libc::AF_VSOCK, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) };
            expect_errno("socketpair(AF_VSOCK)", rc as i64, libc::EPERM)?;
            std::net::TcpStream::connect(addr).map_err(|e| format!("TCP connect: {e}"))?;
            Ok(())
        });
        assert!(
            listener.accept().is_ok(),
            "the permitted connection arrived"
        );
    }

    #[test]
    fn namespaces_cannot_be_created_but_processes_and_threads_can() {
        // Baseline in a throwaway child: unshare(CLONE_NEWUSER) works without the filter.
        assert_child_ok(|| {
            // SAFETY: integer argument; affects only this child.
            expect_success("baseline unshare(CLONE_NEWUSER)", unsafe {
                libc::unshare(libc::CLONE_NEWUSER)
            } as i64)
            .map(drop)
        });
        assert_child_ok(|| {
            apply_in_child(false)?;
            // SAFETY: integer arguments only.
            expect_errno(
                "unshare(CLONE_NEWUSER)",
                unsafe { libc::unshare(libc::CLONE_NEWUSER) } as i64,
                libc::EPERM,
            )?;
            for flag in CLONE_NEW_FLAGS {
                // A fork-like raw clone with one CLONE_NEW* flag; the filter refuses it before
                // any child exists.
                // SAFETY: raw clone with a null stack behaves like fork; on success the child
                // would _exit at once.
                let rc = unsafe {
                    libc::syscall(libc::SYS_clone, *flag | libc::SIGCHLD as u64, 0, 0, 0, 0)
                };
                if rc == 0 {
                    // SAFETY: leaving the unexpected child.
                    unsafe { libc::_exit(0) };
                }
                expect_errno(&format!("clone({flag:#x})"), rc, libc::EPERM)?;
            }
            // clone3 says ENOSYS so libc falls back to clone.
            let mut args = [0u64; 11];
            // SAFETY: a zeroed clone_args; it is refused before use.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_clone3,
                    args.as_mut_ptr(),
                    std::mem::size_of_val(&args),
                )
            };
            expect_errno("clone3", rc, libc::ENOSYS)?;
            // The allowed path: fork, threads, and spawning commands (glibc tries clone3 first).
            // SAFETY: the forked child only calls _exit.
            match unsafe { libc::fork() } {
                0 => unsafe { libc::_exit(7) },
                -1 => return Err("fork failed".into()),
                pid => {
                    let mut st = 0;
                    // SAFETY: waiting for our own child.
                    unsafe { libc::waitpid(pid, &mut st, 0) };
                    if libc::WEXITSTATUS(st) != 7 {
                        return Err(format!("fork child status {st}"));
                    }
                }
            }
            std::thread::spawn(|| 1)
                .join()
                .map_err(|_| "thread failed")?;
            sh_ok("true")?;
            sh_denied("unshare -U true", "Operation not permitted")?;
            Ok(())
        });
    }

    #[test]
    fn sethostname_is_denied_and_the_host_keeps_its_name() {
        let before = hostname();
        // Baseline: the syscall works in a private UTS namespace (never on the host).
        assert_child_ok(|| {
            // SAFETY: integer argument; this child only.
            expect_success(
                "unshare(CLONE_NEWUTS)",
                unsafe { libc::unshare(libc::CLONE_NEWUTS) } as i64,
            )?;
            nix::unistd::sethostname("corral-baseline")
                .map_err(|e| format!("baseline sethostname: {e}"))
        });
        assert_eq!(hostname(), before);
        assert_child_ok(|| {
            apply_in_child(false)?;
            match nix::unistd::sethostname("corral-pwned") {
                Err(nix::errno::Errno::EPERM) => {}
                other => return Err(format!("sethostname: {other:?}")),
            }
            sh_denied("hostname corral-pwned", "you must be root")?;
            Ok(())
        });
        assert_eq!(hostname(), before, "host hostname unchanged");
    }

    #[test]
    fn io_uring_setup_is_denied() {
        // Baseline: this kernel gives a ring without the filter (io_uring_disabled = 0).
        let mut params = [0u8; 120];
        // SAFETY: io_uring_setup(1, params) with a zeroed struct io_uring_params.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, params.as_mut_ptr()) };
        assert!(
            fd >= 0,
            "baseline io_uring_setup failed: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: closing the ring fd.
        unsafe { libc::close(fd as i32) };
        assert_child_ok(|| {
            apply_in_child(true)?;
            let mut params = [0u8; 120];
            // SAFETY: as above.
            let rc = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, params.as_mut_ptr()) };
            expect_errno("io_uring_setup", rc, libc::EPERM)
        });
    }

    /// H13: commands cannot take the caller's per-uid inotify instances; an instance made before
    /// the filter (the worker's guard) still works.
    #[test]
    fn inotify_instances_cannot_be_made_but_an_existing_one_works() {
        assert_child_ok(|| {
            // SAFETY: plain inotify calls on our own descriptors.
            let before = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
            expect_success("baseline inotify_init1", before as i64)?;
            apply_in_child(false)?;
            let rc = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
            expect_errno("inotify_init1", rc as i64, libc::EPERM)?;
            #[cfg(target_arch = "x86_64")]
            {
                let rc = unsafe { libc::syscall(libc::SYS_inotify_init) };
                expect_errno("inotify_init", rc, libc::EPERM)?;
            }
            let dir = crate::sandbox::testutil::cstr("/tmp");
            let wd = unsafe { libc::inotify_add_watch(before, dir.as_ptr(), libc::IN_CREATE) };
            expect_success("inotify_add_watch on the earlier instance", wd as i64).map(drop)
        });
    }

    /// H13 for fanotify: commands cannot take the caller's per-uid fanotify groups (unprivileged
    /// ones exist since Linux 5.13); a group made before the filter (the guard's) still marks.
    #[test]
    fn fanotify_groups_cannot_be_made_but_an_existing_one_works() {
        assert_child_ok(|| {
            let flags = libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_REPORT_DFID_NAME;
            // SAFETY: plain fanotify calls on our own descriptors.
            let before = unsafe { libc::fanotify_init(flags, libc::O_RDONLY as libc::c_uint) };
            expect_success("baseline fanotify_init", before as i64)?;
            apply_in_child(false)?;
            let rc = unsafe { libc::fanotify_init(flags, libc::O_RDONLY as libc::c_uint) };
            expect_errno("fanotify_init", rc as i64, libc::EPERM)?;
            let dir = crate::sandbox::testutil::cstr("/tmp");
            let rc = unsafe {
                libc::fanotify_mark(
                    before,
                    libc::FAN_MARK_ADD,
                    libc::FAN_CREATE | libc::FAN_ONDIR,
                    libc::AT_FDCWD,
                    dir.as_ptr(),
                )
            };
            expect_success("fanotify_mark on the earlier group", rc as i64).map(drop)
        });
    }

    #[test]
    fn strace_and_process_vm_readv_are_denied() {
        assert_child_ok(|| {
            apply_in_child(true)?;
            sh_denied("strace -f true", "Operation not permitted")?;
            // process_vm_readv on our own child.
            let child = match unsafe { libc::fork() } {
                0 => unsafe {
                    libc::pause();
                    libc::_exit(0)
                },
                pid => pid,
            };
            let mut buf = [0u8; 8];
            let local = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: 8,
            };
            let remote = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: 8,
            };
            // SAFETY: valid iovecs; the call is refused by the filter.
            let rc = unsafe { libc::process_vm_readv(child, &local, 1, &remote, 1, 0) };
            // SAFETY: ending and reaping our child.
            unsafe {
                libc::kill(child, libc::SIGKILL);
                libc::waitpid(child, std::ptr::null_mut(), 0);
            }
            expect_errno("process_vm_readv", rc as i64, libc::EPERM)
        });
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_and_i386_syscalls_are_stopped_by_the_arch_guard() {
        let x32_socket = (X32_SYSCALL_BIT as i64) | libc::SYS_socket;
        let x32_getpid = (X32_SYSCALL_BIT as i64) | libc::SYS_getpid;
        // Baseline: this kernel has x32 disabled, so the raw call says ENOSYS (a socket where x32
        // is enabled); the filtered call must say EPERM instead.
        assert_child_ok(move || {
            // SAFETY: integer arguments only.
            let rc = unsafe { libc::syscall(x32_socket, libc::AF_INET, libc::SOCK_STREAM, 0) };
            if rc >= 0 {
                return Ok(()); // x32 enabled: a socket; the filtered check below still applies
            }
            expect_errno("baseline x32 socket", rc, libc::ENOSYS)
        });
        assert_child_ok(move || {
            apply_in_child(true)?;
            // SAFETY: integer arguments only.
            expect_errno(
                "x32 socket",
                unsafe { libc::syscall(x32_socket, libc::AF_INET, libc::SOCK_STREAM, 0) },
                libc::EPERM,
            )?;
            // SAFETY: no arguments.
            expect_errno(
                "x32 getpid",
                unsafe { libc::syscall(x32_getpid) },
                libc::EPERM,
            )
        });
        // i386 entry: socket (359) through int 0x80. Baseline: a socket (IA32 emulation is on).
        let baseline = in_child(|| {
            let fd = i386_socket();
            if fd >= 0 {
                Ok(())
            } else {
                Err(format!("baseline i386 socket returned {fd}"))
            }
        });
        assert!(baseline.exited_ok(), "baseline: {baseline:?}");
        let filtered = in_child(|| {
            apply_in_child(true)?;
            let fd = i386_socket();
            Err(format!(
                "i386 socket returned {fd} instead of killing the process"
            ))
        });
        assert!(
            matches!(filtered.status, WaitStatus::Signaled(_, Signal::SIGSYS, _)),
            "expected death by SIGSYS, got {filtered:?}"
        );
    }

    /// i386 `socket(AF_INET, SOCK_STREAM, 0)` via `int 0x80` (syscall 359); ebx is saved by hand
    /// because LLVM reserves rbx.
    #[cfg(target_arch = "x86_64")]
    fn i386_socket() -> i64 {
        let ret: i32;
        // SAFETY: int 0x80 with i386 socket arguments; rbx is restored before returning.
        unsafe {
            std::arch::asm!(
                "mov {save}, rbx",
                "mov ebx, 2",
                "int 0x80",
                "mov rbx, {save}",
                save = out(reg) _,
                inout("eax") 359 => ret,
                in("ecx") 1,
                in("edx") 0,
            );
        }
        ret as i64
    }

    #[test]
    fn tiocsti_and_tioclinux_are_denied_other_ioctls_work() {
        // SAFETY: posix_openpt/grantpt/unlockpt/ptsname on a fresh master.
        let (master, slave_path) = unsafe {
            let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
            assert!(m >= 0);
            assert_eq!(libc::grantpt(m), 0);
            assert_eq!(libc::unlockpt(m), 0);
            (m, std::ffi::CStr::from_ptr(libc::ptsname(m)).to_owned())
        };
        // SAFETY: opening the slave side.
        let slave = unsafe { libc::open(slave_path.as_ptr(), libc::O_RDWR | libc::O_NOCTTY) };
        assert!(slave >= 0);
        let c = b'x';
        // Baseline: root with CAP_SYS_ADMIN may inject into a terminal that is not its own.
        // SAFETY: TIOCSTI reads one byte from the pointer.
        assert_eq!(
            unsafe { libc::ioctl(slave, libc::TIOCSTI, &c) },
            0,
            "baseline TIOCSTI"
        );
        assert_child_ok(move || {
            apply_in_child(false)?;
            // SAFETY: as above.
            expect_errno(
                "TIOCSTI",
                unsafe { libc::ioctl(slave, libc::TIOCSTI, &c) } as i64,
                libc::EPERM,
            )?;
            let mut arg = 0u8;
            // SAFETY: TIOCLINUX reads a subcode byte; refused by the filter first.
            expect_errno(
                "TIOCLINUX",
                unsafe { libc::ioctl(slave, libc::TIOCLINUX, &mut arg) } as i64,
                libc::EPERM,
            )?;
            let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
            // SAFETY: TIOCGWINSZ fills a winsize.
            expect_success(
                "TIOCGWINSZ",
                unsafe { libc::ioctl(slave, libc::TIOCGWINSZ, &mut ws) } as i64,
            )?;
            Ok(())
        });
        // SAFETY: closing our fds.
        unsafe {
            libc::close(slave);
            libc::close(master);
        }
    }

    #[test]
    fn commands_see_seccomp_mode_2() {
        assert_child_ok(|| {
            apply_in_child(false)?;
            let out = sh_ok("grep -E '^Seccomp(_filters)?:' /proc/self/status")?;
            let text = String::from_utf8_lossy(&out.stdout);
            if text != "Seccomp:\t2\nSeccomp_filters:\t3\n" {
                return Err(format!("status: {text:?}"));
            }
            Ok(())
        });
    }

    // ---- H3: set-user-ID / set-group-ID bits ----------------------------------------------

    const SETID_MASK: u32 = libc::S_ISUID | libc::S_ISGID;

    fn mode_of(p: &std::path::Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(p).unwrap().permissions().mode()
    }

    fn raw_fchmodat2(path: &std::ffi::CStr, mode: u32) -> i64 {
        // SAFETY: valid C string; integer arguments.
        unsafe { libc::syscall(SYS_FCHMODAT2, libc::AT_FDCWD, path.as_ptr(), mode, 0) }
    }

    #[test]
    fn setid_bits_cannot_be_set_by_the_chmod_family() {
        use crate::sandbox::testutil::cstr;
        let dir = TempDir::new("sc-setid-chmod");
        let file = dir.path().join("rootsh");
        std::fs::copy("/bin/true", &file).unwrap();
        let c = cstr(&file);
        // Baseline: outside the filter every one of these calls sets the bits (we are root, and
        // the owner may anyway), including fchmodat2 on this kernel.
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::chmod(c.as_ptr(), 0o4755) }, 0);
        assert_eq!(mode_of(&file) & 0o7777, 0o4755);
        assert_eq!(raw_fchmodat2(&c, 0o2755), 0, "baseline fchmodat2");
        assert_eq!(mode_of(&file) & 0o7777, 0o2755);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::chmod(c.as_ptr(), 0o644) }, 0);

        let path = file.clone();
        assert_child_ok(move || {
            apply_in_child(false)?;
            let c = cstr(&path);
            for mode in [0o4755, 0o2755, 0o6755, 0o7777, 0o4000, 0o2000] {
                // SAFETY: valid C string; integer mode.
                let rc = unsafe { libc::chmod(c.as_ptr(), mode) };
                expect_errno(&format!("chmod {mode:o}"), rc as i64, libc::EPERM)?;
            }
            // The kernel reads the mode as umode_t; bits above 32 must not hide the set-id bit.
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: valid C string; integer mode.
                let rc =
                    unsafe { libc::syscall(libc::SYS_chmod, c.as_ptr(), (1u64 << 32) | 0o4755) };
                expect_errno("chmod with high bits", rc, libc::EPERM)?;
            }
            // SAFETY: valid C string.
            let rc = unsafe { libc::fchmodat(libc::AT_FDCWD, c.as_ptr(), 0o2755, 0) };
            expect_errno("fchmodat 2755", rc as i64, libc::EPERM)?;
            expect_errno("fchmodat2 4755", raw_fchmodat2(&c, 0o4755), libc::EPERM)?;
            let f = std::fs::File::open(&path).map_err(|e| format!("open: {e}"))?;
            // SAFETY: our own open fd.
            let rc = unsafe { libc::fchmod(f.as_raw_fd(), 0o4755) };
            expect_errno("fchmod 4755", rc as i64, libc::EPERM)?;
            // The same inode through /proc/self/fd is still a chmod with the bit.
            let via_proc = cstr(format!("/proc/self/fd/{}", f.as_raw_fd()));
            // SAFETY: valid C string.
            let rc = unsafe { libc::chmod(via_proc.as_ptr(), 0o4755) };
            expect_errno("chmod /proc/self/fd/N", rc as i64, libc::EPERM)?;
            expect_errno(
                "fchmodat2 /proc/self/fd/N",
                raw_fchmodat2(&via_proc, 0o6755),
                libc::EPERM,
            )?;
            // The allowed path: ordinary modes, sticky bit included.
            // SAFETY: valid C string / our own fd.
            unsafe {
                expect_success("chmod 0755", libc::chmod(c.as_ptr(), 0o755) as i64)?;
                expect_success("fchmod 0700", libc::fchmod(f.as_raw_fd(), 0o700) as i64)?;
                expect_success(
                    "fchmodat 1755",
                    libc::fchmodat(libc::AT_FDCWD, c.as_ptr(), 0o1755, 0) as i64,
                )?;
            }
            expect_success("fchmodat2 0755", raw_fchmodat2(&c, 0o755))?;
            Ok(())
        });
        assert_eq!(
            mode_of(&file) & 0o7777,
            0o755,
            "host sees the last allowed mode"
        );
    }

    #[test]
    fn setid_files_and_directories_cannot_be_created() {
        use crate::sandbox::testutil::cstr;
        let dir = TempDir::new("sc-setid-create");
        let d = dir.path().to_path_buf();
        // Baseline: open(O_CREAT, 04755) and mknod(S_IFREG|06755) make set-id files without the
        // filter (umask 0 so the harness's umask does not mask the bits). Linux ignores S_ISGID
        // in mkdir's mode (a directory inherits it from its parent instead), so mkdir has no
        // baseline; the filter refuses it anyway so no kernel detail decides.
        assert_child_ok({
            let d = d.clone();
            move || {
                // SAFETY: integer argument; this child only.
                unsafe { libc::umask(0) };
                let f = cstr(d.join("baseline-open"));
                let n = cstr(d.join("baseline-mknod"));
                // SAFETY: valid C strings, integer arguments.
                unsafe {
                    let fd = libc::open(f.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o4755);
                    libc::close(expect_success("baseline open", fd as i64)? as i32);
                    let rc = libc::mknodat(libc::AT_FDCWD, n.as_ptr(), libc::S_IFREG | 0o6755, 0);
                    expect_success("baseline mknodat", rc as i64)?;
                }
                Ok(())
            }
        });
        assert_eq!(
            mode_of(&d.join("baseline-open")) & SETID_MASK,
            libc::S_ISUID
        );
        assert_eq!(mode_of(&d.join("baseline-mknod")) & SETID_MASK, SETID_MASK);

        let existing = d.join("existing");
        std::fs::write(&existing, b"data").unwrap();
        let cd = d.clone();
        assert_child_ok(move || {
            // SAFETY: integer argument; this child only.
            unsafe { libc::umask(0) };
            apply_in_child(false)?;
            let at = |name: &str| cstr(cd.join(name));
            let exists = |name: &str| cd.join(name).symlink_metadata().is_ok();
            // SAFETY (whole block): valid C strings and integer arguments only.
            unsafe {
                let p = at("open-suid");
                let rc = libc::open(p.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o4755);
                expect_errno("open(O_CREAT, 04755)", rc as i64, libc::EPERM)?;
                let p = at("openat-sgid");
                let rc = libc::openat(
                    libc::AT_FDCWD,
                    p.as_ptr(),
                    libc::O_CREAT | libc::O_RDWR,
                    0o2755,
                );
                expect_errno("openat(O_CREAT, 02755)", rc as i64, libc::EPERM)?;
                let p = at("");
                let rc = libc::open(p.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o4700);
                expect_errno("open(O_TMPFILE, 04700)", rc as i64, libc::EPERM)?;
                #[cfg(target_arch = "x86_64")]
                {
                    let p = at("creat-suid");
                    expect_errno(
                        "creat 04755",
                        libc::creat(p.as_ptr(), 0o4755) as i64,
                        libc::EPERM,
                    )?;
                    let p = at("mknod-suid");
                    let rc = libc::syscall(libc::SYS_mknod, p.as_ptr(), libc::S_IFREG | 0o4755, 0);
                    expect_errno("mknod(S_IFREG|04755)", rc, libc::EPERM)?;
                }
                let p = at("mkdir-sgid");
                expect_errno(
                    "mkdir 02775",
                    libc::mkdir(p.as_ptr(), 0o2775) as i64,
                    libc::EPERM,
                )?;
                let p = at("mkdirat-suid");
                let rc = libc::mkdirat(libc::AT_FDCWD, p.as_ptr(), 0o4755);
                expect_errno("mkdirat 04755", rc as i64, libc::EPERM)?;
                let p = at("mknodat-sgid");
                let rc = libc::mknodat(libc::AT_FDCWD, p.as_ptr(), libc::S_IFREG | 0o2755, 0);
                expect_errno("mknodat(S_IFREG|02755)", rc as i64, libc::EPERM)?;
                // openat2 carries its mode in a struct: refused as ENOSYS so libc uses openat.
                let p = at("openat2-suid");
                let how = [libc::O_CREAT as u64 | libc::O_WRONLY as u64, 0o4755, 0];
                let rc = libc::syscall(
                    libc::SYS_openat2,
                    libc::AT_FDCWD,
                    p.as_ptr(),
                    how.as_ptr(),
                    std::mem::size_of_val(&how),
                );
                expect_errno("openat2", rc, libc::ENOSYS)?;
                for name in [
                    "open-suid",
                    "openat-sgid",
                    "creat-suid",
                    "mknod-suid",
                    "mkdir-sgid",
                    "mkdirat-suid",
                    "mknodat-sgid",
                    "openat2-suid",
                ] {
                    if exists(name) {
                        return Err(format!("{name} was created"));
                    }
                }
                // The allowed path: ordinary creation and opening.
                let p = at("plain-file");
                let fd = libc::open(p.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o755);
                libc::close(expect_success("open(O_CREAT, 0755)", fd as i64)? as i32);
                let p = at("plain-dir");
                expect_success("mkdir 0755", libc::mkdir(p.as_ptr(), 0o755) as i64)?;
                let p = at("sticky-dir");
                expect_success("mkdir 01777", libc::mkdir(p.as_ptr(), 0o1777) as i64)?;
                let p = at("existing");
                let fd = libc::open(p.as_ptr(), libc::O_RDONLY);
                libc::close(expect_success("open existing", fd as i64)? as i32);
            }
            std::fs::write(cd.join("std-write"), b"x").map_err(|e| format!("std write: {e}"))?;
            std::fs::create_dir_all(cd.join("a/b")).map_err(|e| format!("create_dir_all: {e}"))?;
            Ok(())
        });
        // Host side: nothing set-id beyond the baseline entries, and the allowed ones exist.
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            if !name.starts_with("baseline-") {
                assert_eq!(mode_of(&entry.path()) & SETID_MASK, 0, "{name} is set-id");
            }
        }
        assert_eq!(mode_of(&d.join("plain-file")) & 0o7777, 0o755);
        assert!(d.join("plain-dir").is_dir() && d.join("a/b").is_dir());
    }

    #[test]
    fn commands_cannot_make_setuid_copies() {
        let dir = TempDir::new("sc-setid-cmd");
        let d = dir.path().to_path_buf();
        // A setuid source (made on the host) for `cp -p`; baseline: the host can copy it with its
        // mode, so `cp -p` really tries to set the bit.
        let src = d.join("suid-src");
        std::fs::copy("/bin/true", &src).unwrap();
        std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o4755))
            .unwrap();
        let status = std::process::Command::new("cp")
            .args(["-p", "suid-src", "baseline-copy"])
            .current_dir(&d)
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(
            mode_of(&d.join("baseline-copy")) & SETID_MASK,
            libc::S_ISUID
        );
        std::fs::remove_file(d.join("baseline-copy")).unwrap();

        let cd = d.clone();
        assert_child_ok(move || {
            apply_in_child(false)?;
            std::env::set_current_dir(&cd).map_err(|e| format!("chdir: {e}"))?;
            sh_ok("cp /bin/bash ./rootsh && mkdir ./shared")?;
            for (script, needle) in [
                ("chmod 4755 ./rootsh", "Operation not permitted"),
                ("chmod u+s ./rootsh", "Operation not permitted"),
                ("chmod g+s ./rootsh", "Operation not permitted"),
                ("chmod g+s ./shared", "Operation not permitted"),
                (
                    "install -m 4755 /bin/true ./installed",
                    "Operation not permitted",
                ),
                ("cp -p ./suid-src ./copy", "Operation not permitted"),
                ("mkdir -m 2775 ./sgid-dir", "Operation not permitted"),
                (
                    "python3 -c 'import os; os.open(\"py-suid\", os.O_CREAT|os.O_WRONLY, 0o4755)'",
                    "PermissionError",
                ),
                (
                    "python3 -c 'import os; os.chmod(\"rootsh\", 0o6755)'",
                    "PermissionError",
                ),
            ] {
                sh_denied(script, needle)?;
            }
            // The allowed path.
            sh_ok(
                "chmod 0755 ./rootsh && chmod u+x,g-w ./rootsh && install -m 755 /bin/true ./ok",
            )?;
            Ok(())
        });
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            if name != "suid-src" {
                assert_eq!(mode_of(&entry.path()) & SETID_MASK, 0, "{name} is set-id");
            }
        }
        assert!(!d.join("sgid-dir").exists() && !d.join("py-suid").exists());
        assert_eq!(mode_of(&d.join("ok")) & 0o7777, 0o755);
        // `cp -p` made the copy but could not give it the bit.
        assert!(d.join("copy").exists());
    }

    #[test]
    fn read_only_mode_refuses_truncation_by_path_and_nothing_else() {
        let dir = TempDir::new("sc-trunc");
        let f = dir.path().join("f");
        let c = crate::sandbox::testutil::cstr(&f);
        let open = |c: &std::ffi::CStr, flags: i32| -> i64 {
            // SAFETY: valid C string; the descriptor is closed at once when opened.
            let fd = unsafe { libc::open(c.as_ptr(), flags, 0o600) };
            if fd >= 0 {
                // SAFETY: closing our own descriptor.
                unsafe { libc::close(fd) };
            }
            fd as i64
        };
        // The read-only entries are only in the read-only filter.
        let ro: Vec<_> = active_rules(true, Net::Off);
        let ww: Vec<_> = active_rules(false, Net::Off);
        assert!(ro.iter().any(|r| r.name() == "truncate"));
        assert!(!ww.iter().any(|r| r.applies == Applies::ReadOnly));
        for read_only in [true, false] {
            std::fs::write(&f, "data").unwrap();
            let c = c.clone();
            let mut p = policy(false);
            if !read_only {
                p.mode = Mode::WorkspaceWrite;
            }
            assert_child_ok(move || {
                apply(&p).map_err(|e| e.to_string())?;
                let refused = |what: &str, ret: i64| {
                    if read_only {
                        expect_errno(what, ret, libc::EPERM)
                    } else {
                        expect_success(what, ret).map(drop)
                    }
                };
                // SAFETY: valid C string.
                refused("truncate", unsafe { libc::truncate(c.as_ptr(), 1) } as i64)?;
                refused("O_RDONLY|O_TRUNC", open(&c, libc::O_RDONLY | libc::O_TRUNC))?;
                refused(
                    "O_ACCMODE|O_TRUNC",
                    open(&c, libc::O_ACCMODE | libc::O_TRUNC),
                )?;
                refused(
                    "openat O_RDONLY|O_TRUNC|O_CLOEXEC",
                    // SAFETY: valid C string.
                    unsafe {
                        libc::openat(
                            libc::AT_FDCWD,
                            c.as_ptr(),
                            libc::O_RDONLY | libc::O_TRUNC | libc::O_CLOEXEC,
                        )
                    } as i64,
                )?;
                // Allowed in both modes: opens without O_TRUNC, O_TRUNC with write access
                // (Landlock's WRITE_FILE decides those), ftruncate of a writable descriptor.
                expect_success("O_RDONLY", open(&c, libc::O_RDONLY))?;
                expect_success("O_WRONLY|O_TRUNC", open(&c, libc::O_WRONLY | libc::O_TRUNC))?;
                expect_success("O_RDWR|O_TRUNC", open(&c, libc::O_RDWR | libc::O_TRUNC))?;
                // SAFETY: valid C string.
                let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY) };
                let fd = expect_success("O_WRONLY", fd as i64)? as i32;
                // SAFETY: our descriptor.
                expect_success(
                    "write",
                    unsafe { libc::write(fd, b"abc".as_ptr().cast(), 3) } as i64,
                )?;
                // SAFETY: our descriptor.
                expect_success("ftruncate", unsafe { libc::ftruncate(fd, 2) } as i64)?;
                // SAFETY: our descriptor.
                unsafe { libc::close(fd) };
                Ok(())
            });
            assert_eq!(std::fs::read_to_string(&f).unwrap(), "ab");
        }
    }

    #[test]
    fn danger_full_access_is_not_applicable() {
        let mut p = policy(true);
        p.mode = Mode::DangerFullAccess;
        assert_eq!(
            apply(&p).unwrap().status,
            crate::sandbox::report::LayerStatus::NotApplicable
        );
    }
}
