//! The filesystem, TCP and scope confinement with Landlock (spec/sandbox.md §3.6).
//!
//! Landlock applies even to root: writes outside the allowed hierarchies fail with `EACCES`
//! despite `CAP_DAC_OVERRIDE`. The ruleset built here:
//! - handles every filesystem right of the newest ABI the crate knows (best effort: the crate drops
//!   what the kernel lacks, and the status says so) — except in a read-only worker, see below;
//! - `/`: `EXECUTE | READ_FILE | READ_DIR` (everything readable, nothing writable);
//! - each writable root and `/dev/shm`: every handled right **except** `MAKE_CHAR`, `MAKE_BLOCK`
//!   and `IOCTL_DEV`, so device nodes can never be created, even by root with `CAP_MKNOD`;
//! - `/dev/null`, `/dev/zero`, `/dev/full`, `/dev/tty`, `/dev/ptmx`, `/dev/pts`:
//!   `READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV` (shells open `> /dev/null` with `O_TRUNC`);
//! - TCP bind and connect handled with no allowing rule when the network is off (ABI ≥ 4);
//! - scopes `ABSTRACT_UNIX_SOCKET` and `SIGNAL` always (ABI ≥ 6);
//! - pathname UNIX socket connect (`RESOLVE_UNIX`, ABI ≥ 9) is among "every right", so it is
//!   allowed only inside the writable roots;
//! - denial logging (ABI ≥ 7) is left at the kernel's default (on for this process).
//!
//! **Read-only workers** ([`handled_access`]): when the namespaces layer is in force and seccomp
//! cannot be degraded ([`Cover`]), the ruleset does not handle [`READ_ONLY_UNHANDLED`]:
//! `EXECUTE | READ_FILE | READ_DIR` (granted on `/` anyway) and `TRUNCATE`. Landlock checks an
//! `open` by walking from the file up to `/` until rules grant every handled right it asks for,
//! and every open asks for `TRUNCATE` (an "optional" right, for a later `ftruncate`), so with these
//! rights handled each read walked the whole path (18 % of a grep's CPU). Not handled, a read,
//! directory or exec open asks Landlock for nothing and takes no walk. What they still denied, and
//! what covers it now:
//! - reads and execs of files not beneath this worker's `/` — detached mounts, other mount
//!   namespaces, file handles: mounts and new namespaces are refused by Landlock itself (any
//!   domain that handles a filesystem right may not mount), by seccomp and by the capability
//!   drop; `open_by_handle_at` by seccomp and the capability drop; the fresh `/proc` shows only
//!   the sandbox's processes, which all live in this mount namespace. A descriptor a host process
//!   hands over a UNIX socket (network on) was already readable by whoever holds it;
//! - truncation: every mount of the view is read-only except `/dev/shm` (which grants
//!   `TRUNCATE` anyway) and `/dev/pts` (character devices only, which cannot be truncated), so
//!   `truncate(2)` and `O_TRUNC` fail with `EROFS`. The one way out of the view is a magic link
//!   (`/proc/self/fd/N`) to a descriptor received from a host process, which names a file on the
//!   host's writable mount: seccomp refuses `truncate(2)` and `O_TRUNC` opens without write
//!   access in read-only mode (an `O_TRUNC` open with write access still needs `WRITE_FILE`).
//!
//! Every right that can create, change or remove anything stays handled, as in the other modes.
//!
//! Landlock does **not** stop metadata changes (chmod, chown, setxattr, utimensat), mknod where
//! `MAKE_CHAR` is granted, host-global syscalls, UDP, raw sockets or MPTCP. The read-only mounts,
//! the capability drop and seccomp cover those; this is one layer of several.
//!
//! Pitfalls handled here (shared/notes/crates.md §3):
//! - `restrict_self` restricts only the calling thread below ABI 8, so [`apply`] refuses to run
//!   in a process with more than one thread instead of leaving other threads unconfined;
//! - `path_beneath_rules` silently skips paths it cannot open, so paths are opened one by one here
//!   and every missing one is listed in the report (a missing writable root means no write access);
//! - the ABI is detected with the raw `landlock_create_ruleset(NULL, 0, VERSION)` syscall
//!   ([`kernel_abi`]), never by looking for securityfs (often unmounted even when Landlock is on).

use std::io;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath,
    PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetError, RulesetStatus, Scope,
};
use serde::{Deserialize, Serialize};

use crate::sandbox::error::LayerError;
use crate::sandbox::policy::{Mode, SandboxPolicy};
use crate::sandbox::report::{Layer, LayerReport};

const LAYER: &str = Layer::Landlock.as_str();

/// The newest ABI this code was written and tested for; rights beyond the kernel's are dropped
/// by the crate in best-effort mode.
const TARGET_ABI: ABI = ABI::V9;

/// `LANDLOCK_CREATE_RULESET_VERSION` (linux/landlock.h).
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;

/// Device nodes that commands need to write (and ioctl, for terminals) inside the sandbox.
pub const WRITABLE_DEVICES: [&str; 6] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// The private `/dev/shm` of the worker's `/dev`, writable in RO and WW (§2.5).
pub const DEV_SHM: &str = "/dev/shm";

/// Host fix shown whenever Landlock cannot be enforced at all.
const FIX_NO_LANDLOCK: &str = "Use a kernel built with CONFIG_SECURITY_LANDLOCK=y and \"landlock\" \
    in its lsm= list, or allow degraded mode for landlock.";

/// The kernel's Landlock ABI version, from `landlock_create_ruleset(NULL, 0,
/// LANDLOCK_CREATE_RULESET_VERSION)`; `None` when Landlock is absent or disabled.
pub fn kernel_abi() -> Option<u32> {
    kernel_abi_raw().ok()
}

/// The raw query, keeping the errno for error messages (`ENOSYS`: not built in;
/// `EOPNOTSUPP`: built in but not enabled at boot).
fn kernel_abi_raw() -> io::Result<u32> {
    // SAFETY: a NULL attribute pointer with size 0 and the VERSION flag is the documented way to
    // query the ABI; the kernel reads nothing from user memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if rc > 0 {
        Ok(rc as u32)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Why Landlock is unavailable, in the words of spec §6.
fn unavailable_cause() -> String {
    match kernel_abi_raw() {
        Ok(abi) => format!("the kernel reports Landlock ABI {abi} but the ruleset was not enforced"),
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOSYS) => "the kernel does not support Landlock (landlock_create_ruleset returned ENOSYS)".into(),
            Some(libc::EOPNOTSUPP) => {
                "Landlock is built into the kernel but not enabled (landlock_create_ruleset returned EOPNOTSUPP)".into()
            }
            _ => format!("landlock_create_ruleset failed: {e}"),
        },
    }
}

/// One feature added by a Landlock ABI, and what covers for it when the kernel lacks it (§3.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbiFeature {
    pub abi: u32,
    pub name: &'static str,
    /// Whether the feature is used only when the network is off.
    pub network_off_only: bool,
    /// What is lost without it, and what covers it.
    pub without: &'static str,
}

/// The ABI table of spec §3.6 (ABI 8, thread synchronisation, is not used: the worker is
/// single-threaded when it confines itself).
pub const ABI_FEATURES: [AbiFeature; 8] = [
    AbiFeature {
        abi: 1,
        name: "filesystem rights",
        network_off_only: false,
        without: "Landlock unavailable: fail closed",
    },
    AbiFeature {
        abi: 2,
        name: "REFER",
        network_off_only: false,
        without: "renames and hard links across directories are always denied",
    },
    AbiFeature {
        abi: 3,
        name: "TRUNCATE",
        network_off_only: false,
        without: "truncate(2) is not controlled by Landlock; the read-only mounts still stop it outside the roots, and in read-only mode seccomp refuses truncate(2) and O_TRUNC opens without write access",
    },
    AbiFeature {
        abi: 4,
        name: "TCP bind/connect",
        network_off_only: true,
        without: "covered by seccomp and the network namespace",
    },
    AbiFeature {
        abi: 5,
        name: "IOCTL_DEV",
        network_off_only: false,
        without: "device ioctls are not controlled; only the minimal /dev exists",
    },
    AbiFeature {
        abi: 6,
        name: "scopes (abstract UNIX sockets, signals)",
        network_off_only: false,
        without: "covered by the PID and network namespaces when the network is off; with the network on, abstract sockets on the host are reachable",
    },
    AbiFeature {
        abi: 7,
        name: "denial logging",
        network_off_only: false,
        without: "denial detection falls back to the heuristic",
    },
    AbiFeature {
        abi: 9,
        name: "pathname UNIX socket connect",
        network_off_only: false,
        without: "only the mask list protects host sockets when the network is on",
    },
];

/// Which Landlock features a worker gets on a kernel with ABI `abi` (for the Capabilities RPC,
/// which can call this with [`kernel_abi`] without applying anything).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockFeatures {
    pub kernel_abi: Option<u32>,
    /// Names of the features in force.
    pub enforced: Vec<String>,
    /// `"{name} (ABI {n}): {what is lost}"` for each feature the kernel lacks.
    pub missing: Vec<String>,
}

/// Features in force and missing for `abi` (`None`: Landlock unavailable) and the network setting.
pub fn features(abi: Option<u32>, network: bool) -> LandlockFeatures {
    let have = abi.unwrap_or(0);
    let mut out = LandlockFeatures {
        kernel_abi: abi,
        enforced: Vec::new(),
        missing: Vec::new(),
    };
    for f in ABI_FEATURES {
        if f.network_off_only && network {
            continue; // not wanted with the network on, so not missing either
        }
        if f.abi <= have {
            out.enforced.push(f.name.to_string());
        } else {
            out.missing
                .push(format!("{} (ABI {}): {}", f.name, f.abi, f.without));
        }
    }
    out
}

/// The rights granted on `/`: everything readable and executable.
pub fn root_access() -> BitFlags<AccessFs> {
    AccessFs::Execute | AccessFs::ReadFile | AccessFs::ReadDir
}

/// Rights a read-only worker does not handle when [`Cover::relaxes_read_only`] holds (module
/// documentation): those `/` grants, which then only guarded files not beneath `/`, and
/// `TRUNCATE`, which the read-only mounts and seccomp's read-only entries stop. Each of them made
/// every `open` walk from the file up to `/`.
pub const READ_ONLY_UNHANDLED: [AccessFs; 4] = [
    AccessFs::Execute,
    AccessFs::ReadFile,
    AccessFs::ReadDir,
    AccessFs::Truncate,
];

/// What the layers applied around Landlock guarantee in this worker (the confinement sequence
/// knows; Landlock is applied before seccomp, so seccomp's part is a promise that a failure to
/// install it stops the worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cover {
    /// The namespaces layer is in force: every mount of the view is read-only outside the
    /// writable roots, `/dev/shm` and `/dev/pts`, and `/proc` shows only the sandbox.
    pub read_only_mounts: bool,
    /// seccomp may not be degraded: if it cannot be installed, confinement fails and no command
    /// runs, so its read-only entries (`truncate`, `O_TRUNC` without write access) follow.
    pub seccomp_required: bool,
}

impl Cover {
    #[cfg(test)]
    /// Nothing known about the other layers: handle every right (fail closed).
    pub const NONE: Cover = Cover {
        read_only_mounts: false,
        seccomp_required: false,
    };

    /// Whether a read-only worker may leave [`READ_ONLY_UNHANDLED`] to the other layers.
    pub fn relaxes_read_only(self) -> bool {
        self.read_only_mounts && self.seccomp_required
    }
}

/// The filesystem rights the ruleset handles: every right, except [`READ_ONLY_UNHANDLED`] in a
/// read-only worker whose other layers cover them. Rules grant only handled rights.
pub fn handled_access(policy: &SandboxPolicy, cover: Cover) -> BitFlags<AccessFs> {
    let all = AccessFs::from_all(TARGET_ABI);
    if policy.mode == Mode::ReadOnly && cover.relaxes_read_only() {
        READ_ONLY_UNHANDLED.iter().fold(all, |acc, &r| acc & !r)
    } else {
        all
    }
}

/// The rights granted on each writable root and `/dev/shm`: every handled right except creating
/// device nodes and device ioctls.
pub fn writable_access() -> BitFlags<AccessFs> {
    AccessFs::from_all(TARGET_ABI)
        & !(AccessFs::MakeChar | AccessFs::MakeBlock | AccessFs::IoctlDev)
}

/// The rights granted on the few writable device nodes.
pub fn device_access() -> BitFlags<AccessFs> {
    AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev
}

fn ruleset_error(step: &str, e: RulesetError) -> LayerError {
    LayerError::new(LAYER, format!("{step}: {e}"), FIX_NO_LANDLOCK)
}

/// Landlock restricts only the calling thread (ABI < 8), so a second thread would stay free.
fn require_single_thread() -> Result<(), LayerError> {
    let threads = std::fs::read_dir("/proc/self/task")
        .map_err(|e| {
            LayerError::new(
                LAYER,
                format!("cannot count this process's threads in /proc/self/task: {e}"),
                "The worker needs its own /proc mounted before it confines itself",
            )
        })?
        .count();
    if threads != 1 {
        return Err(LayerError::new(
            LAYER,
            format!(
                "the process has {threads} threads and Landlock restricts only the calling one"
            ),
            "Apply the sandbox in the freshly re-executed, single-threaded worker",
        ));
    }
    Ok(())
}

/// Builds the ruleset for `policy` and restricts the calling (only) thread with it. `cover` says
/// what the other layers guarantee ([`handled_access`]).
///
/// Fails closed when Landlock is not enforced at all; a partially enforced ruleset (older ABI)
/// is accepted and its missing features are reported. Paths that do not exist (a missing
/// writable root, an absent device) get no rule and are listed in the report.
pub fn apply(policy: &SandboxPolicy, cover: Cover) -> Result<LayerReport, LayerError> {
    if !policy.mode.is_sandboxed() {
        return Ok(LayerReport::not_applicable(
            Layer::Landlock,
            "danger-full-access uses no Landlock",
        ));
    }
    require_single_thread()?;

    let handled = handled_access(policy, cover);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(handled)
        .map_err(|e| ruleset_error("handling filesystem rights", e))?;
    if !policy.network {
        // Handled without any allowing rule: every TCP bind and connect is denied.
        ruleset = ruleset
            .handle_access(AccessNet::from_all(TARGET_ABI))
            .map_err(|e| ruleset_error("handling TCP rights", e))?;
    }
    let mut created = ruleset
        .scope(Scope::from_all(TARGET_ABI))
        .map_err(|e| ruleset_error("adding scopes", e))?
        .create()
        .map_err(|e| ruleset_error("creating the ruleset", e))?;
    if let Some(egress) = &policy.egress {
        // Proxied: the one TCP connect allowed is to the egress proxy's port (on the sandbox's
        // own loopback, the only interface its network namespace has).
        created = created
            .add_rule(NetPort::new(egress.port, AccessNet::ConnectTcp))
            .map_err(|e| ruleset_error("allowing TCP connect to the egress proxy", e))?;
    }

    let mut skipped: Vec<PathBuf> = Vec::new();
    let mut add = |created: landlock::RulesetCreated,
                   path: &Path,
                   access: BitFlags<AccessFs>|
     -> Result<landlock::RulesetCreated, LayerError> {
        // A rule may grant only handled rights; one left with none grants nothing.
        let access = access & handled;
        if access.is_empty() {
            return Ok(created);
        }
        match PathFd::new(path) {
            Ok(fd) => created
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|e| ruleset_error(&format!("adding the rule for {}", path.display()), e)),
            Err(_) => {
                skipped.push(path.to_path_buf());
                Ok(created)
            }
        }
    };

    created = add(created, Path::new("/"), root_access())?;
    let mut writable: Vec<&Path> = policy.writable_roots.iter().map(PathBuf::as_path).collect();
    writable.push(Path::new(DEV_SHM));
    for root in &writable {
        created = add(created, root, writable_access())?;
    }
    for dev in WRITABLE_DEVICES {
        created = add(created, Path::new(dev), device_access())?;
    }
    if skipped.iter().any(|p| p == Path::new("/")) {
        return Err(LayerError::new(
            LAYER,
            "cannot open / for its rule",
            FIX_NO_LANDLOCK,
        ));
    }

    let status = created
        .restrict_self()
        .map_err(|e| ruleset_error("restrict_self", e))?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(LayerError::new(LAYER, unavailable_cause(), FIX_NO_LANDLOCK));
    }

    let abi = kernel_abi();
    let feats = features(abi, policy.network);
    let mut missing = feats.missing;
    missing.extend(
        skipped
            .iter()
            .map(|p| format!("{}: does not exist, no rule added", p.display())),
    );
    let roots: Vec<String> = writable
        .iter()
        .filter(|p| !skipped.iter().any(|s| s == *p))
        .map(|p| p.display().to_string())
        .collect();
    let detail = format!(
        "ABI {}; {:?}; {}; writable: [{}]; TCP {}; enforced: {}",
        abi.map_or_else(|| "unknown".into(), |a| a.to_string()),
        status.ruleset,
        if handled == AccessFs::from_all(TARGET_ABI) {
            "every filesystem right handled"
        } else {
            "read, execute and truncate rights left to the read-only mounts and seccomp"
        },
        roots.join(", "),
        if policy.network {
            "allowed"
        } else {
            "bind/connect denied"
        },
        feats.enforced.join(", "),
    );
    Ok(LayerReport::with_missing(Layer::Landlock, detail, missing))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::policy::Mode;
    use crate::sandbox::report::LayerStatus;
    use crate::sandbox::testutil::{
        TempDir, assert_child_ok, cstr, expect_errno, expect_success, sh_denied, sh_ok,
    };
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::UnixListener;

    fn policy(roots: &[&Path], network: bool) -> SandboxPolicy {
        let mode = if roots.is_empty() {
            Mode::ReadOnly
        } else {
            Mode::WorkspaceWrite
        };
        SandboxPolicy {
            cwd: roots
                .first()
                .map_or_else(|| PathBuf::from("/"), |p| p.to_path_buf()),
            writable_roots: roots.iter().map(|p| p.to_path_buf()).collect(),
            network,
            ..SandboxPolicy::bare(mode, "/")
        }
    }

    fn apply_in_child(p: &SandboxPolicy) -> Result<LayerReport, String> {
        apply(p, Cover::NONE).map_err(|e| e.to_string())
    }

    #[test]
    fn kernel_abi_comes_from_the_syscall_and_matches_the_table() {
        let abi = kernel_abi().expect("this host has Landlock");
        assert!(abi >= 1);
        let f = features(Some(abi), false);
        // Every feature is either enforced or missing, split exactly at the kernel's ABI.
        assert_eq!(f.enforced.len() + f.missing.len(), ABI_FEATURES.len());
        for feat in ABI_FEATURES {
            let on = f.enforced.iter().any(|n| n == feat.name);
            assert_eq!(on, feat.abi <= abi, "{feat:?}");
        }
        // Without Landlock everything is missing; with the network on, TCP is not wanted.
        assert!(features(None, false).enforced.is_empty());
        assert!(
            !features(Some(1), true)
                .missing
                .iter()
                .any(|m| m.starts_with("TCP"))
        );
    }

    #[test]
    fn writes_outside_the_roots_fail_inside_work_and_devices_stay_usable() {
        let root = TempDir::new("ll-root");
        let outside_dir = TempDir::new("ll-out");
        let outside = outside_dir.path().join("outside");
        let existing = outside_dir.path().join("existing");
        std::fs::write(&existing, "before\n").unwrap();
        // Baseline: without the layer, the same writes succeed.
        assert_child_ok({
            let outside = outside.clone();
            move || {
                std::fs::write(&outside, "x").map_err(|e| format!("baseline write: {e}"))?;
                std::fs::remove_file(&outside).map_err(|e| e.to_string())
            }
        });
        let p = policy(&[root.path()], false);
        let (r, o, ex) = (root.path().to_path_buf(), outside.clone(), existing.clone());
        assert_child_ok(move || {
            let report = apply_in_child(&p)?;
            if !report.is_in_force() {
                return Err(format!("{report:?}"));
            }
            // Raw attempt: even root with CAP_DAC_OVERRIDE gets EACCES.
            let c = cstr(&o);
            // SAFETY: valid C string.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_CREAT, 0o644) };
            expect_errno("open outside for create", fd as i64, libc::EACCES)?;
            sh_denied(&format!("echo x > {}", o.display()), "Permission denied")?;
            sh_denied(&format!("echo x >> {}", ex.display()), "Permission denied")?;
            sh_denied(
                &format!("mkdir {}/d", o.parent().unwrap().display()),
                "Permission denied",
            )?;
            // Allowed paths: the root, reading the host, the devices (with O_TRUNC).
            let out = sh_ok(&format!(
                "echo x > {r}/f && cat {r}/f && mkdir {r}/d && mv {r}/f {r}/d/g && cat /etc/hostname >/dev/null \
                 && echo hi > /dev/null && head -c1 /dev/zero >/dev/full 2>/dev/null; echo done",
                r = r.display()
            ))?;
            let text = String::from_utf8_lossy(&out.stdout);
            if text != "x\ndone\n" {
                return Err(format!("unexpected output {text:?}"));
            }
            Ok(())
        });
        // Host: nothing appeared outside, the existing file is unchanged, the root got the file.
        assert!(!outside.exists());
        assert!(!outside_dir.path().join("d").exists());
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "before\n");
        assert_eq!(
            std::fs::read_to_string(root.path().join("d/g")).unwrap(),
            "x\n"
        );
    }

    #[test]
    fn read_only_policy_denies_writing_the_cwd_and_tmp() {
        let dir = TempDir::new("ll-ro");
        let target = dir.path().join("f");
        let p = policy(&[], false);
        let t = target.clone();
        assert_child_ok(move || {
            apply_in_child(&p)?;
            sh_denied(&format!("echo x > {}", t.display()), "Permission denied")?;
            sh_ok("ls -l /bin >/dev/null && cat /etc/os-release >/dev/null")?;
            Ok(())
        });
        assert!(!target.exists());
    }

    const COVERED: Cover = Cover {
        read_only_mounts: true,
        seccomp_required: true,
    };

    #[test]
    fn read_only_leaves_read_and_truncate_rights_only_when_both_covers_hold() {
        let all = AccessFs::from_all(TARGET_ABI);
        let ro = policy(&[], false);
        let root = TempDir::new("ll-handled");
        let ww = policy(&[root.path()], false);
        let relaxed = handled_access(&ro, COVERED);
        for r in READ_ONLY_UNHANDLED {
            assert!(!relaxed.contains(r), "{r:?} still handled");
        }
        // Everything that creates, changes or removes stays handled.
        assert_eq!(
            relaxed
                | READ_ONLY_UNHANDLED
                    .iter()
                    .fold(BitFlags::empty(), |a, &r| a | r),
            all
        );
        assert!(relaxed.contains(AccessFs::WriteFile | AccessFs::MakeReg | AccessFs::Refer));
        assert!(relaxed.contains(AccessFs::MakeChar | AccessFs::IoctlDev | AccessFs::RemoveFile));
        // Fail closed: either cover missing, or another mode, keeps every right.
        for cover in [
            Cover::NONE,
            Cover {
                read_only_mounts: false,
                ..COVERED
            },
            Cover {
                seccomp_required: false,
                ..COVERED
            },
        ] {
            assert_eq!(handled_access(&ro, cover), all, "{cover:?}");
        }
        assert_eq!(handled_access(&ww, COVERED), all);
        // The rights / grants are exactly the read-only rights left unhandled, but TRUNCATE.
        assert_eq!(
            root_access() | AccessFs::Truncate,
            READ_ONLY_UNHANDLED
                .iter()
                .fold(BitFlags::empty(), |a, &r| a | r)
        );
    }

    #[test]
    fn relaxed_read_only_ruleset_still_denies_every_change_and_no_longer_checks_truncate() {
        let dir = TempDir::new("ll-relaxed");
        let existing = dir.path().join("existing");
        std::fs::write(&existing, "before\n").unwrap();
        let victim = dir.path().join("victim");
        let p = policy(&[], false);
        // Fully handled (no cover): an O_RDONLY | O_TRUNC open is Landlock's to refuse.
        let (p1, v1) = (p.clone(), victim.clone());
        std::fs::write(&victim, "data\n").unwrap();
        assert_child_ok(move || {
            apply(&p1, Cover::NONE).map_err(|e| e.to_string())?;
            let c = cstr(&v1);
            // SAFETY: valid C string.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_TRUNC) };
            expect_errno("O_RDONLY|O_TRUNC, fully handled", fd as i64, libc::EACCES)
        });
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "data\n");
        let (d, ex, v) = (dir.path().to_path_buf(), existing.clone(), victim.clone());
        assert_child_ok(move || {
            let report = apply(&p, COVERED).map_err(|e| e.to_string())?;
            if !report
                .detail
                .contains("left to the read-only mounts and seccomp")
            {
                return Err(format!("detail: {}", report.detail));
            }
            // Not handled any more: this process has no read-only mounts nor seccomp, so the
            // open truncates — it is the other layers' job in a worker (tests/hardening_readonly).
            let c = cstr(&v);
            // SAFETY: valid C string.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_TRUNC) };
            let fd = expect_success("O_RDONLY|O_TRUNC, relaxed", fd as i64)?;
            // SAFETY: closing the descriptor just opened.
            unsafe { libc::close(fd as i32) };
            // Every change is still refused, even to root.
            let c = cstr(&ex);
            // SAFETY: valid C string.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY) };
            expect_errno("open for writing", fd as i64, libc::EACCES)?;
            for script in [
                format!("echo x >> {}", ex.display()),
                format!("echo x > {}/new", d.display()),
                format!("mkdir {}/sub", d.display()),
                format!("mv {} {}/moved", ex.display(), d.display()),
                format!("ln {} {}/hard", ex.display(), d.display()),
                format!("ln -s {} {}/soft", ex.display(), d.display()),
                format!("mkfifo {}/fifo", d.display()),
                format!("rm {}", ex.display()),
            ] {
                sh_denied(&script, "ermission denied")?;
            }
            // Reading, listing, executing and the devices still work.
            let out = sh_ok(&format!(
                "cat {} && ls {} >/dev/null && /bin/true && echo ok > /dev/null && echo done",
                ex.display(),
                d.display()
            ))?;
            let text = String::from_utf8_lossy(&out.stdout);
            if text != "before\ndone\n" {
                return Err(format!("unexpected output {text:?}"));
            }
            Ok(())
        });
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "before\n");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "");
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["existing", "victim"]);
    }

    #[test]
    fn mknod_in_a_writable_root_fails_even_with_cap_mknod() {
        let root = TempDir::new("ll-mknod");
        let node = root.path().join("c");
        // Baseline: root with CAP_MKNOD creates a char device in the same directory.
        let c = cstr(&node);
        // SAFETY: valid path; 1:3 are /dev/null's numbers.
        assert_eq!(
            unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) },
            0
        );
        std::fs::remove_file(&node).unwrap();
        let p = policy(&[root.path()], false);
        let c2 = c.clone();
        assert_child_ok(move || {
            apply_in_child(&p)?;
            // SAFETY: as above; the child still holds every capability.
            let rc =
                unsafe { libc::mknod(c2.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) };
            expect_errno("mknod char in root", rc as i64, libc::EACCES)?;
            // SAFETY: as above; 7:0 is loop0.
            let rc =
                unsafe { libc::mknod(c2.as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(7, 0)) };
            expect_errno("mknod block in root", rc as i64, libc::EACCES)?;
            // A FIFO (MAKE_FIFO) is still allowed in the root.
            // SAFETY: as above.
            let rc = unsafe { libc::mknod(c2.as_ptr(), libc::S_IFIFO | 0o600, 0) };
            expect_success("mkfifo in root", rc as i64)?;
            Ok(())
        });
        let kind = std::fs::symlink_metadata(&node).unwrap().file_type();
        assert!(
            std::os::unix::fs::FileTypeExt::is_fifo(&kind),
            "only the FIFO exists"
        );
    }

    #[test]
    fn signal_scope_stops_kill_of_the_parent() {
        let p = policy(&[], true);
        assert_child_ok(move || {
            // Baseline: before the layer, the child may signal its parent (signal 0 = probe).
            // SAFETY: kill with signal 0 only checks permission.
            expect_success(
                "baseline kill(parent, 0)",
                unsafe { libc::kill(libc::getppid(), 0) } as i64,
            )?;
            apply_in_child(&p)?;
            // SAFETY: as above.
            expect_errno(
                "kill(parent, 0)",
                unsafe { libc::kill(libc::getppid(), 0) } as i64,
                libc::EPERM,
            )?;
            // Its own process (inside the domain) still works.
            // SAFETY: as above.
            expect_success("kill(self, 0)", unsafe { libc::kill(libc::getpid(), 0) }
                as i64)?;
            Ok(())
        });
    }

    #[test]
    fn tcp_connect_denied_with_network_off_and_allowed_with_it_on() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let off = policy(&[], false);
        assert_child_ok(move || {
            apply_in_child(&off)?;
            match TcpStream::connect(addr) {
                Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(()),
                other => Err(format!("TCP connect with network off: {other:?}")),
            }
        });
        assert!(listener.accept().is_err(), "no connection may have arrived");
        let on = policy(&[], true);
        assert_child_ok(move || {
            apply_in_child(&on)?;
            let mut s =
                TcpStream::connect(addr).map_err(|e| format!("connect with network on: {e}"))?;
            s.write_all(b"ok").map_err(|e| e.to_string())
        });
        listener.set_nonblocking(false).unwrap();
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0u8; 2];
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ok");
    }

    #[test]
    fn proxied_tcp_connect_reaches_the_proxy_port_only() {
        let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        other.set_nonblocking(true).unwrap();
        let (proxy_addr, other_addr) = (proxy.local_addr().unwrap(), other.local_addr().unwrap());
        let proxied = SandboxPolicy {
            egress: Some(crate::sandbox::policy::Egress {
                port: proxy_addr.port(),
                session: "s".into(),
            }),
            ..policy(&[], false)
        };
        assert_child_ok(move || {
            apply_in_child(&proxied)?;
            match TcpStream::connect(other_addr) {
                Err(e) if e.raw_os_error() == Some(libc::EACCES) => {}
                other => return Err(format!("TCP connect to another port: {other:?}")),
            }
            match TcpListener::bind("127.0.0.1:0") {
                Err(e) if e.raw_os_error() == Some(libc::EACCES) => {}
                other => return Err(format!("TCP bind: {other:?}")),
            }
            let mut s = TcpStream::connect(proxy_addr)
                .map_err(|e| format!("connect to the proxy's port: {e}"))?;
            s.write_all(b"ok").map_err(|e| e.to_string())
        });
        assert!(other.accept().is_err(), "no connection may have arrived");
        let (mut conn, _) = proxy.accept().unwrap();
        let mut buf = [0u8; 2];
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ok");
    }

    #[test]
    fn abstract_unix_socket_outside_the_domain_is_unreachable() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("corral-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixListener::bind_addr(&addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        // Baseline: reachable without the layer.
        assert_child_ok({
            let addr = addr.clone();
            move || {
                std::os::unix::net::UnixStream::connect_addr(&addr)
                    .map(drop)
                    .map_err(|e| format!("baseline connect: {e}"))
            }
        });
        let _ = listener.accept().expect("baseline connection arrived");
        let p = policy(&[], true);
        assert_child_ok(move || {
            apply_in_child(&p)?;
            match std::os::unix::net::UnixStream::connect_addr(&addr) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(()),
                other => Err(format!("abstract connect: {other:?}")),
            }
        });
        assert!(
            listener.accept().is_err(),
            "the sandboxed connect must not arrive"
        );
    }

    #[test]
    fn missing_root_is_skipped_and_reported_and_status_reflects_the_abi() {
        let root = TempDir::new("ll-miss");
        let missing = root.path().join("does-not-exist");
        let p = policy(&[root.path(), &missing], false);
        let m = missing.clone();
        assert_child_ok(move || {
            let report = apply_in_child(&p)?;
            let want = format!("{}: does not exist, no rule added", m.display());
            if !report.missing.contains(&want) {
                return Err(format!("missing root not reported: {report:?}"));
            }
            let abi = kernel_abi().ok_or("no ABI")?;
            if !report.detail.starts_with(&format!("ABI {abi};")) {
                return Err(format!("detail: {}", report.detail));
            }
            if report.status != LayerStatus::PartiallyEnforced {
                return Err(format!("status {:?}", report.status));
            }
            Ok(())
        });
    }

    #[test]
    fn refuses_a_multi_threaded_process() {
        // The test harness itself has several threads: apply must refuse before restricting.
        let _t = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
        let err = apply(&policy(&[], false), Cover::NONE).unwrap_err();
        assert!(err.message.contains("threads"), "{err}");
        // And the harness is still unrestricted.
        let dir = TempDir::new("ll-mt");
        std::fs::write(dir.path().join("still-writable"), "x").unwrap();
    }

    #[test]
    fn danger_full_access_is_not_applicable() {
        let mut p = policy(&[], true);
        p.mode = Mode::DangerFullAccess;
        let r = apply(&p, Cover::NONE).unwrap();
        assert_eq!(r.status, LayerStatus::NotApplicable);
    }
}
