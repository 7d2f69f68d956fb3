//! Privileges: the capability drop (spec/sandbox.md §3.4) and `no_new_privs` (§3.5).
//!
//! After [`drop_all_capabilities`] the worker (often uid 0) holds no capability in any of the five
//! sets, and the securebits `NOROOT` and `NO_SETUID_FIXUP` are set and locked so uid 0 gains nothing
//! at `execve` either. Without capabilities, root inside the sandbox cannot `mknod`, `chown` to
//! another user, mount, change the hostname, load modules or raise limits, whatever Landlock allows.
//! The result is verified from `/proc/self/status`, and any remaining bit aborts the worker with
//! `sandbox setup failed: capabilities remain after dropping them ({set}={hex})`.
//!
//! Implementation choice: raw `prctl(2)`/`capset(2)` through `libc`, not the `caps` crate. The
//! securebits have no API in `caps` (they need `prctl` anyway), the whole drop is six kinds of
//! syscall, and raw calls let each failure be reported with the exact step and errno. The crate
//! would add a dependency without removing any of this code.
//!
//! Ordering contract with the identity layer (which runs just before): when the worker switches
//! from root to a non-root caller, the kernel empties the permitted set at `setresuid` unless
//! `PR_SET_KEEPCAPS` was set first. Without `CAP_SETPCAP` in the permitted set the bounding set
//! cannot be emptied nor the securebits set, and this layer then fails closed (the message says
//! so). [`keep_capabilities_across_uid_change`] (`prctl(PR_SET_KEEPCAPS, 1)`) must therefore run
//! before the identity layer's `setresuid`; this layer raises the effective set back to the
//! permitted set itself before dropping.

use std::io;

use crate::sandbox::error::LayerError;
use crate::sandbox::report::{Layer, LayerReport};

const CAPS: &str = Layer::Capabilities.as_str();
const NNP: &str = Layer::NoNewPrivs.as_str();

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set, covering capabilities 0..63.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct` (linux/capability.h); libc does not define it.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`; version 3 uses an array of two (low and high 32 bits).
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Securebits (linux/securebits.h). `NOROOT`: uid 0 gets no capabilities at `execve`.
/// `NO_SETUID_FIXUP`: uid changes do not add or remove capabilities. Each `_LOCKED` bit stops
/// anyone (even with `CAP_SETPCAP`) from clearing its partner later.
const SECBIT_NOROOT: u64 = 1 << 0;
const SECBIT_NOROOT_LOCKED: u64 = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: u64 = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: u64 = 1 << 3;

/// The securebits this layer sets and locks.
pub const REQUIRED_SECUREBITS: u64 =
    SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED;

/// The five capability lines of `/proc/self/status`, in the order they are checked.
pub const CAPABILITY_SETS: [&str; 5] = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];

/// Host fix for failures that mean the worker started without the privileges it must shed.
const FIX_SETPCAP: &str = "The worker must still hold CAP_SETPCAP when it drops capabilities: \
    call caps::keep_capabilities_across_uid_change (PR_SET_KEEPCAPS) before the identity layer's \
    setresuid, and a container must not remove CAP_SETPCAP from a root daemon";

fn capget() -> io::Result<[CapData; 2]> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and data are valid, correctly laid out structs for version 3.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if rc == 0 {
        Ok(data)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn capset(data: &[CapData; 2]) -> io::Result<()> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: as for capget; the kernel only reads `data`.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `prctl` with integer arguments; returns the result or the OS error.
fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: every option used here takes integer arguments only.
    let rc = unsafe {
        libc::prctl(
            option,
            arg2,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn cap_error(step: &str, err: io::Error, fix: &str) -> LayerError {
    LayerError::new(CAPS, format!("{step} failed: {err}"), fix)
}

/// Keeps the permitted set across the identity layer's `setresuid` away from uid 0
/// (`PR_SET_KEEPCAPS`), so [`drop_all_capabilities`] still holds `CAP_SETPCAP` afterwards. Call
/// it just before the identity switch; `execve` clears the flag again.
pub fn keep_capabilities_across_uid_change() -> Result<(), LayerError> {
    prctl(libc::PR_SET_KEEPCAPS, 1).map(drop).map_err(|e| {
        cap_error(
            "prctl(PR_SET_KEEPCAPS)",
            e,
            "Report this with the kernel version",
        )
    })
}

/// Raises the effective set to the permitted one (what a uid change with `PR_SET_KEEPCAPS`
/// cleared), for a step between the identity change and the capability drop that needs a
/// capability of the new uid: the guard's fanotify group (`CAP_SYS_ADMIN`, charged to the
/// session owner's per-uid count). The drop that follows empties every set again.
pub fn raise_effective_to_permitted() -> io::Result<()> {
    let mut data = capget()?;
    if data.iter().all(|d| d.effective == d.permitted) {
        return Ok(());
    }
    for d in &mut data {
        d.effective = d.permitted;
    }
    capset(&data)
}

/// Empties the effective, permitted and inheritable sets (lowering them needs no privilege).
/// For a process that keeps running but never executes anything (the namespace layer's
/// waiting parent); a confined worker uses [`drop_all_capabilities`].
pub fn clear_capability_sets() -> io::Result<()> {
    capset(&[CapData::default(); 2])
}

/// Empties every capability set, sets and locks the securebits, and verifies the result.
///
/// Order matters: the securebits and the bounding set need `CAP_SETPCAP` in the effective set, so
/// they come before the permitted and effective sets are emptied.
pub fn drop_all_capabilities() -> Result<LayerReport, LayerError> {
    // 1. Make effective = permitted, so CAP_SETPCAP is usable even if the identity layer's uid
    //    switch (with PR_SET_KEEPCAPS) cleared the effective set.
    let mut data = capget().map_err(|e| cap_error("capget", e, FIX_SETPCAP))?;
    if data.iter().any(|d| d.effective != d.permitted) {
        for d in &mut data {
            d.effective = d.permitted;
        }
        capset(&data).map_err(|e| cap_error("raising the effective set", e, FIX_SETPCAP))?;
    }

    // 2. Securebits: set and lock NOROOT and NO_SETUID_FIXUP, keeping any bits already set.
    let current = prctl(libc::PR_GET_SECUREBITS, 0)
        .map_err(|e| cap_error("PR_GET_SECUREBITS", e, FIX_SETPCAP))?
        as libc::c_ulong;
    let wanted = REQUIRED_SECUREBITS as libc::c_ulong;
    if current & wanted != wanted {
        prctl(libc::PR_SET_SECUREBITS, current | wanted)
            .map_err(|e| cap_error("PR_SET_SECUREBITS", e, FIX_SETPCAP))?;
    }

    // 3. Bounding set: drop each capability the kernel knows. PR_CAPBSET_READ answers EINVAL past
    //    the last capability, which ends the loop without needing /proc/sys/kernel/cap_last_cap.
    for cap in 0..64 {
        match prctl(libc::PR_CAPBSET_READ, cap) {
            Ok(0) => {}
            Ok(_) => {
                prctl(libc::PR_CAPBSET_DROP, cap).map_err(|e| {
                    cap_error(
                        &format!("PR_CAPBSET_DROP of capability {cap}"),
                        e,
                        FIX_SETPCAP,
                    )
                })?;
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
            Err(e) => return Err(cap_error("PR_CAPBSET_READ", e, FIX_SETPCAP)),
        }
    }

    // 4. Ambient set: clear it (it would otherwise survive execve of non-setuid programs).
    // SAFETY: PR_CAP_AMBIENT takes integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc != 0 {
        return Err(cap_error(
            "PR_CAP_AMBIENT_CLEAR_ALL",
            io::Error::last_os_error(),
            "Use a kernel with ambient capabilities (Linux 4.3 or newer)",
        ));
    }

    // 5. Inheritable, permitted and effective: all empty in one capset.
    capset(&[CapData::default(); 2]).map_err(|e| {
        cap_error(
            "capset to empty sets",
            e,
            "This should not fail; report it with the kernel version",
        )
    })?;

    // 6. Verify, from the kernel's own report, that nothing remains.
    verify_no_capabilities()?;
    let bits = prctl(libc::PR_GET_SECUREBITS, 0)
        .map_err(|e| cap_error("PR_GET_SECUREBITS", e, FIX_SETPCAP))? as u64;
    if bits & REQUIRED_SECUREBITS != REQUIRED_SECUREBITS {
        return Err(LayerError::new(
            CAPS,
            format!("securebits are {bits:#x} after locking NOROOT and NO_SETUID_FIXUP"),
            FIX_SETPCAP,
        ));
    }
    Ok(LayerReport::enforced(
        Layer::Capabilities,
        format!(
            "all five capability sets empty; securebits {bits:#x} (NOROOT, NO_SETUID_FIXUP locked)"
        ),
    ))
}

/// Reads `/proc/self/status` and fails if any capability set is non-empty.
pub fn verify_no_capabilities() -> Result<(), LayerError> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| {
        LayerError::new(
            CAPS,
            format!("cannot read /proc/self/status to verify the capability drop: {e}"),
            "The worker needs its own /proc mounted before it confines itself",
        )
    })?;
    check_status_capabilities(&status)
}

/// The check of [`verify_no_capabilities`] on given status text (separate so it can be tested
/// with a crafted status).
pub fn check_status_capabilities(status: &str) -> Result<(), LayerError> {
    check_status_sets(status, &CAPABILITY_SETS)
}

/// Fails naming the first of `sets` that is not empty in `status`.
fn check_status_sets(status: &str, sets: &[&str]) -> Result<(), LayerError> {
    for &set in sets {
        let value = status
            .lines()
            .find_map(|line| line.strip_prefix(set)?.strip_prefix(':'))
            .map(str::trim)
            .ok_or_else(|| {
                LayerError::new(
                    CAPS,
                    format!("/proc/self/status has no {set} line"),
                    "Use a kernel with ambient capabilities (Linux 4.3 or newer)",
                )
            })?;
        let bits = u64::from_str_radix(value, 16).map_err(|_| {
            LayerError::new(
                CAPS,
                format!("cannot parse {set} value {value:?} in /proc/self/status"),
                "Report this with the kernel version",
            )
        })?;
        if bits != 0 {
            return Err(LayerError::fixed(
                CAPS,
                format!("capabilities remain after dropping them ({set}={value})"),
            ));
        }
    }
    Ok(())
}

/// The capability layer of a worker that is neither root nor inside a user namespace of its
/// own: a daemon that is not root, running with the namespaces layer degraded (the host forbids
/// unprivileged user namespaces and the operator allowed that). Such a process holds no
/// capability worth dropping, and without `CAP_SETPCAP` it cannot empty its bounding set or set
/// securebits. It does what it can — ambient cleared; inheritable, permitted and effective
/// emptied; the four verified — and reports the bounding set as left: with no_new_privs (always
/// set next) no `execve` can gain a capability through it (set-user-ID bits and file
/// capabilities are ignored), and seccomp denies creating a user namespace. Never used for a
/// root worker, which must pass [`drop_all_capabilities`].
pub fn drop_capabilities_without_privilege() -> Result<LayerReport, LayerError> {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return Err(LayerError::new(
            CAPS,
            "the unprivileged capability step was asked of a root process",
            "Report this: a root worker must drop every capability set",
        ));
    }
    // SAFETY: PR_CAP_AMBIENT takes integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc != 0 {
        return Err(cap_error(
            "PR_CAP_AMBIENT_CLEAR_ALL",
            io::Error::last_os_error(),
            "Use a kernel with ambient capabilities (Linux 4.3 or newer)",
        ));
    }
    clear_capability_sets().map_err(|e| {
        cap_error(
            "capset to empty sets",
            e,
            "This should not fail; report it with the kernel version",
        )
    })?;
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| {
        LayerError::new(
            CAPS,
            format!("cannot read /proc/self/status to verify the capability drop: {e}"),
            "The worker needs /proc mounted",
        )
    })?;
    check_status_sets(&status, &["CapInh", "CapPrm", "CapEff", "CapAmb"])?;
    Ok(LayerReport::with_missing(
        Layer::Capabilities,
        format!(
            "no capability held (uid {uid}, not root): inheritable, permitted, effective and \
             ambient sets empty"
        ),
        vec![
            "bounding set not emptied and securebits not locked (both need CAP_SETPCAP, which \
             a process that is not root holds only in a user namespace); no_new_privs keeps \
             execve from gaining capabilities through them"
                .to_string(),
        ],
    ))
}

/// Sets `no_new_privs` (§3.5) and verifies it. Must come before Landlock and seccomp: root could
/// otherwise restrict itself without it, and setuid binaries would still elevate.
pub fn set_no_new_privs() -> Result<LayerReport, LayerError> {
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1).map_err(|e| {
        LayerError::new(
            NNP,
            format!("prctl(PR_SET_NO_NEW_PRIVS) failed: {e}"),
            "Use a kernel with no_new_privs (Linux 3.5 or newer)",
        )
    })?;
    match prctl(libc::PR_GET_NO_NEW_PRIVS, 0) {
        Ok(1) => Ok(LayerReport::enforced(Layer::NoNewPrivs, "NoNewPrivs: 1")),
        other => Err(LayerError::new(
            NNP,
            format!("PR_GET_NO_NEW_PRIVS returned {other:?} after setting it"),
            "Report this with the kernel version",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::testutil::{
        TempDir, assert_child_ok, cstr, expect_errno, expect_success, in_child, sh_ok,
    };
    use std::os::unix::fs::MetadataExt;

    /// The five sets and NoNewPrivs as a shell command (and hence every command) sees them.
    fn shell_status() -> Result<String, String> {
        let out = sh_ok("grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/self/status")?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn own_status() -> String {
        std::fs::read_to_string("/proc/self/status").unwrap()
    }

    #[test]
    fn check_status_reports_first_remaining_set() {
        let clean = "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
                     CapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n";
        assert_eq!(check_status_capabilities(clean), Ok(()));
        let bnd = clean.replace("CapBnd:\t0000000000000000", "CapBnd:\t000001ffffffffff");
        let err = check_status_capabilities(&bnd).unwrap_err();
        assert_eq!(err.layer, "capabilities");
        assert_eq!(
            err.to_string(),
            "sandbox setup failed: capabilities remain after dropping them (CapBnd=000001ffffffffff)"
        );
        let missing = clean.replace("CapAmb:\t0000000000000000\n", "");
        assert!(
            check_status_capabilities(&missing)
                .unwrap_err()
                .message
                .contains("no CapAmb line")
        );
    }

    /// Baseline: the test runs as root with capabilities, so the drop has something to remove.
    fn require_root_with_caps() {
        assert_eq!(
            nix::unistd::geteuid().as_raw(),
            0,
            "layer tests must run as root"
        );
        assert!(
            check_status_capabilities(&own_status()).is_err(),
            "baseline: the test process should hold capabilities"
        );
    }

    #[test]
    fn drop_empties_every_set_locks_securebits_and_commands_inherit_it() {
        require_root_with_caps();
        assert_child_ok(|| {
            // Baseline inside the child: a shell still has capabilities and NoNewPrivs 0.
            let before = shell_status()?;
            if !before.contains("NoNewPrivs:\t0") || before.contains("CapEff:\t0000000000000000") {
                return Err(format!("baseline shell status unexpected:\n{before}"));
            }
            drop_all_capabilities().map_err(|e| e.to_string())?;
            set_no_new_privs().map_err(|e| e.to_string())?;
            // SAFETY: PR_GET_SECUREBITS has no pointer arguments.
            let bits = unsafe { libc::prctl(libc::PR_GET_SECUREBITS, 0, 0, 0, 0) } as u64;
            if bits & REQUIRED_SECUREBITS != REQUIRED_SECUREBITS {
                return Err(format!("securebits {bits:#x}"));
            }
            // Locked: clearing NOROOT again must fail even for this uid-0 process.
            // SAFETY: integer arguments only.
            let clear = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, 0, 0, 0, 0) } as i64;
            expect_errno("clearing locked securebits", clear, libc::EPERM)?;
            // What a command sees after execve as uid 0: still nothing (NOROOT).
            let after = shell_status()?;
            for set in CAPABILITY_SETS {
                if !after.contains(&format!("{set}:\t0000000000000000")) {
                    return Err(format!("{set} not empty in a command:\n{after}"));
                }
            }
            if !after.contains("NoNewPrivs:\t1") {
                return Err(format!("NoNewPrivs not inherited:\n{after}"));
            }
            Ok(())
        });
    }

    #[test]
    fn root_without_caps_cannot_chown_to_another_user_or_mknod() {
        require_root_with_caps();
        let dir = TempDir::new("caps");
        let file = dir.path().join("owned-by-root");
        std::fs::write(&file, "x").unwrap();
        let node = dir.path().join("node");
        let baseline = dir.path().join("baseline-node");

        // Baseline: root with capabilities can do both (and we undo them).
        let f = cstr(&file);
        // SAFETY: valid C string path.
        assert_eq!(unsafe { libc::chown(f.as_ptr(), 65534, 65534) }, 0);
        assert_eq!(std::fs::metadata(&file).unwrap().uid(), 65534);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::chown(f.as_ptr(), 0, 0) }, 0);
        let b = cstr(&baseline);
        // SAFETY: valid path; char device 1:3 (/dev/null's numbers).
        assert_eq!(
            unsafe { libc::mknod(b.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) },
            0
        );
        std::fs::remove_file(&baseline).unwrap();

        let (f2, n) = (f.clone(), cstr(&node));
        assert_child_ok(move || {
            drop_all_capabilities().map_err(|e| e.to_string())?;
            // SAFETY: valid C strings.
            expect_errno(
                "chown to 65534",
                unsafe { libc::chown(f2.as_ptr(), 65534, 65534) } as i64,
                libc::EPERM,
            )?;
            // SAFETY: as above.
            let rc = unsafe { libc::mknod(n.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) };
            expect_errno("mknod char device", rc as i64, libc::EPERM)?;
            // SAFETY: as above; block device 7:0 (loop0).
            let rc = unsafe { libc::mknod(n.as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(7, 0)) };
            expect_errno("mknod block device", rc as i64, libc::EPERM)?;
            // The allowed path still works: root may chown its own file to itself.
            // SAFETY: as above.
            expect_success(
                "chown to own uid",
                unsafe { libc::chown(f2.as_ptr(), 0, 0) } as i64,
            )?;
            Ok(())
        });
        // Host: owner unchanged, no node created.
        assert_eq!(std::fs::metadata(&file).unwrap().uid(), 0);
        assert!(!node.exists());
    }

    #[test]
    fn drop_after_switching_to_a_non_root_uid_with_keepcaps() {
        require_root_with_caps();
        assert_child_ok(|| {
            // What must run before the identity layer: keep the permitted set across setresuid.
            keep_capabilities_across_uid_change().map_err(|e| e.to_string())?;
            // SAFETY: plain syscalls with integer arguments.
            expect_success("setresgid", unsafe { libc::setresgid(65534, 65534, 65534) }
                as i64)?;
            // SAFETY: as above.
            expect_success("setresuid", unsafe { libc::setresuid(65534, 65534, 65534) }
                as i64)?;
            drop_all_capabilities().map_err(|e| e.to_string())?;
            let status = own_status();
            check_status_capabilities(&status).map_err(|e| e.to_string())
        });
    }

    #[test]
    fn drop_fails_closed_when_setpcap_is_already_gone() {
        require_root_with_caps();
        let outcome = in_child(|| {
            // Without KEEPCAPS the switch to uid 65534 empties permitted/effective, but the bounding
            // set stays full and can no longer be emptied: the layer must refuse.
            // SAFETY: plain syscalls with integer arguments.
            unsafe {
                libc::setresgid(65534, 65534, 65534);
                libc::setresuid(65534, 65534, 65534);
            }
            match drop_all_capabilities() {
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        });
        assert!(!outcome.exited_ok(), "drop must fail without CAP_SETPCAP");
        assert!(
            outcome
                .message
                .starts_with("sandbox setup failed: capabilities could not be applied: ")
                && outcome.message.contains("PR_SET_KEEPCAPS"),
            "{}",
            outcome.message
        );
    }

    #[test]
    fn without_privilege_every_held_set_is_emptied_and_the_bounding_set_reported() {
        require_root_with_caps();
        assert_child_ok(|| {
            // A non-root process that still holds something: permitted kept across the uid
            // change, plus an inheritable and an ambient capability (CAP_NET_BIND_SERVICE).
            keep_capabilities_across_uid_change().map_err(|e| e.to_string())?;
            // SAFETY: plain syscalls with integer arguments.
            expect_success("setresgid", unsafe { libc::setresgid(65534, 65534, 65534) }
                as i64)?;
            // SAFETY: as above.
            expect_success("setresuid", unsafe { libc::setresuid(65534, 65534, 65534) }
                as i64)?;
            const CAP_NET_BIND_SERVICE: u32 = 10;
            let mut data = capget().map_err(|e| e.to_string())?;
            data[0].inheritable |= 1 << CAP_NET_BIND_SERVICE;
            data[0].effective = data[0].permitted;
            capset(&data).map_err(|e| e.to_string())?;
            // SAFETY: integer arguments only.
            let raised = unsafe {
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_RAISE,
                    CAP_NET_BIND_SERVICE,
                    0,
                    0,
                )
            };
            expect_success("raising an ambient capability", raised as i64)?;
            if !own_status().contains("CapAmb:\t0000000000000400") {
                return Err(format!(
                    "baseline: no ambient capability:\n{}",
                    own_status()
                ));
            }
            let report = drop_capabilities_without_privilege().map_err(|e| e.to_string())?;
            if report.status != crate::sandbox::report::LayerStatus::PartiallyEnforced
                || !report.missing[0].contains("bounding set not emptied")
            {
                return Err(format!("{report:?}"));
            }
            let status = own_status();
            check_status_sets(&status, &["CapInh", "CapPrm", "CapEff", "CapAmb"])
                .map_err(|e| e.to_string())?;
            // The bounding set is what remains, and the report says so.
            if status.contains("CapBnd:\t0000000000000000") {
                return Err(format!("bounding set unexpectedly empty:\n{status}"));
            }
            Ok(())
        });
        // A root process must take the full drop: the unprivileged step refuses it.
        let outcome = in_child(|| {
            drop_capabilities_without_privilege()
                .map(drop)
                .map_err(|e| e.to_string())
        });
        assert!(
            outcome.message.contains("asked of a root process"),
            "{}",
            outcome.message
        );
    }

    #[test]
    fn verify_reports_a_retained_capability() {
        require_root_with_caps();
        // A child that empties everything but keeps one bounding capability (the "retained
        // capability" test hook of spec §8.4): the self-check must name CapBnd.
        let outcome = in_child(|| {
            // SAFETY: integer arguments only.
            for cap in 1..64 {
                if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
                    break;
                }
            }
            // SAFETY: integer arguments only.
            unsafe {
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL,
                    0,
                    0,
                    0,
                )
            };
            capset(&[CapData::default(); 2]).map_err(|e| e.to_string())?;
            verify_no_capabilities().map_err(|e| e.to_string())
        });
        assert_eq!(
            outcome.message,
            "sandbox setup failed: capabilities remain after dropping them (CapBnd=0000000000000001)"
        );
    }

    #[test]
    fn no_new_privs_is_set_verified_and_inherited() {
        assert!(
            own_status().contains("NoNewPrivs:\t0"),
            "baseline: harness has NoNewPrivs 0"
        );
        assert_child_ok(|| {
            let report = set_no_new_privs().map_err(|e| e.to_string())?;
            if report.layer != Layer::NoNewPrivs || !report.is_in_force() {
                return Err(format!("{report:?}"));
            }
            let out = sh_ok("grep NoNewPrivs: /proc/self/status")?;
            if String::from_utf8_lossy(&out.stdout).trim() != "NoNewPrivs:\t1" {
                return Err(format!(
                    "command sees {:?}",
                    String::from_utf8_lossy(&out.stdout)
                ));
            }
            Ok(())
        });
        // Host: the harness itself is untouched.
        assert!(own_status().contains("NoNewPrivs:\t0"));
    }
}
