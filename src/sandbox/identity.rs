//! The identity layer: the worker takes the caller's uid, gid and supplementary groups
//! (spec/sandbox.md §3.1 step 2, §3.4).
//!
//! It runs after the namespaces are built (the mounts need root) and before the capability drop.
//! Groups go first and uid last, because once the uid is no longer 0 the process could no longer
//! change its groups or gid. Every change is read back: a half-applied identity (say, groups
//! left as root's) is a failed layer, never a silent success.

use crate::sandbox::error::LayerError;
use crate::sandbox::policy::{Identity, SandboxPolicy};

/// The layer name used in error messages and degraded-mode settings (spec/sandbox.md §6).
pub const LAYER: &str = "identity";

/// Switches to `policy.identity` when it is set and the process is root; otherwise checks that
/// the process already runs as that identity (a non-root daemon cannot become anyone else).
pub fn apply_identity(policy: &SandboxPolicy) -> Result<(), LayerError> {
    let Some(id) = &policy.identity else {
        return Ok(());
    };
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        let (uids, gids) = (getresuid()?, getresgid()?);
        if uids != [id.uid; 3] || gids != [id.gid; 3] {
            return Err(fail(
                format!(
                    "the daemon runs as uid {} gid {} and cannot switch to uid {} gid {}",
                    uids[1], gids[1], id.uid, id.gid
                ),
                "Run the corral daemon as root, or serve only callers with the daemon's own uid",
            ));
        }
        return Ok(());
    }
    set_identity(id)?;
    verify(id)
}

fn set_identity(id: &Identity) -> Result<(), LayerError> {
    let groups: Vec<libc::gid_t> = id.groups.clone();
    // SAFETY: setgroups with a valid buffer of the given length.
    if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } != 0 {
        return Err(os_fail("setgroups"));
    }
    // SAFETY: plain id-setting syscalls. (Raw libc calls act on this thread only, which is the
    // whole process: the worker is single-threaded here.)
    if unsafe { libc::setresgid(id.gid, id.gid, id.gid) } != 0 {
        return Err(os_fail("setresgid"));
    }
    // SAFETY: as above.
    if unsafe { libc::setresuid(id.uid, id.uid, id.uid) } != 0 {
        return Err(os_fail("setresuid"));
    }
    Ok(())
}

/// Reads the identity back and compares it with what was asked.
fn verify(id: &Identity) -> Result<(), LayerError> {
    let (uids, gids) = (getresuid()?, getresgid()?);
    if uids != [id.uid; 3] {
        return Err(mismatch(format!("uids are {uids:?}, expected {}", id.uid)));
    }
    if gids != [id.gid; 3] {
        return Err(mismatch(format!("gids are {gids:?}, expected {}", id.gid)));
    }
    let mut have = getgroups()?;
    let mut want = id.groups.clone();
    have.sort_unstable();
    have.dedup();
    want.sort_unstable();
    want.dedup();
    if have != want {
        return Err(mismatch(format!(
            "supplementary groups are {have:?}, expected {want:?}"
        )));
    }
    Ok(())
}

fn getresuid() -> Result<[u32; 3], LayerError> {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: three valid out-pointers.
    if unsafe { libc::getresuid(&mut r, &mut e, &mut s) } != 0 {
        return Err(os_fail("getresuid"));
    }
    Ok([r, e, s])
}

fn getresgid() -> Result<[u32; 3], LayerError> {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: three valid out-pointers.
    if unsafe { libc::getresgid(&mut r, &mut e, &mut s) } != 0 {
        return Err(os_fail("getresgid"));
    }
    Ok([r, e, s])
}

fn getgroups() -> Result<Vec<u32>, LayerError> {
    // SAFETY: a zero-sized query returns the count only.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n < 0 {
        return Err(os_fail("getgroups"));
    }
    let mut buf = vec![0; n as usize];
    // SAFETY: the buffer holds `n` entries.
    let n = unsafe { libc::getgroups(n, buf.as_mut_ptr()) };
    if n < 0 {
        return Err(os_fail("getgroups"));
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn os_fail(call: &str) -> LayerError {
    let e = std::io::Error::last_os_error();
    fail(
        format!("{call} failed: {e}"),
        "Run the corral daemon as root (CAP_SETUID, CAP_SETGID), or allow degraded mode for identity",
    )
}

fn mismatch(cause: String) -> LayerError {
    fail(
        format!("the identity did not take effect ({cause})"),
        "Check for an LSM or seccomp policy interfering with setresuid/setgroups, or allow degraded mode for identity",
    )
}

/// The fail-closed message of spec/sandbox.md §6.
fn fail(cause: String, fix: &str) -> LayerError {
    LayerError {
        layer: LAYER,
        message: format!("sandbox unavailable: {LAYER} could not be applied: {cause}. {fix}."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::policy::Mode;

    fn policy(identity: Option<Identity>) -> SandboxPolicy {
        SandboxPolicy {
            identity,
            ..SandboxPolicy::bare(Mode::ReadOnly, "/")
        }
    }

    /// Runs `f` in a forked child (changing ids must not touch the test process) and returns its
    /// exit code: 0 on success, 1 on a layer error, 2 on a failed check.
    fn in_child(f: fn() -> i32) -> i32 {
        // SAFETY: the child only makes syscalls and small allocations, then _exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = f();
                // SAFETY: leave without running the harness's destructors.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                match nix::sys::wait::waitpid(child, None).unwrap() {
                    nix::sys::wait::WaitStatus::Exited(_, code) => code,
                    other => panic!("child ended with {other:?}"),
                }
            }
        }
    }

    fn is_root() -> bool {
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            eprintln!("skipped: identity tests need root");
        }
        root
    }

    #[test]
    fn switches_to_the_caller_and_verifies() {
        if !is_root() {
            return;
        }
        let code = in_child(|| {
            let id = Identity {
                uid: 65534,
                gid: 65533,
                groups: vec![100, 65533, 4242],
            };
            if apply_identity(&policy(Some(id))).is_err() {
                return 1;
            }
            let ok = getresuid().unwrap() == [65534; 3]
                && getresgid().unwrap() == [65533; 3]
                && {
                    let mut g = getgroups().unwrap();
                    g.sort_unstable();
                    g == vec![100, 4242, 65533]
                }
                // Root powers are gone: switching back must fail.
                && unsafe { libc::setresuid(0, 0, 0) } != 0;
            if ok { 0 } else { 2 }
        });
        assert_eq!(code, 0);
    }

    #[test]
    fn empty_groups_and_root_caller() {
        if !is_root() {
            return;
        }
        let code = in_child(|| {
            let id = Identity {
                uid: 0,
                gid: 0,
                groups: Vec::new(),
            };
            if apply_identity(&policy(Some(id))).is_err() {
                return 1;
            }
            if getresuid().unwrap() == [0; 3] && getgroups().unwrap().is_empty() {
                0
            } else {
                2
            }
        });
        assert_eq!(code, 0);
    }

    #[test]
    fn none_keeps_identity() {
        let before = (getresuid().unwrap(), getresgid().unwrap());
        apply_identity(&policy(None)).unwrap();
        assert_eq!(before, (getresuid().unwrap(), getresgid().unwrap()));
    }

    #[test]
    fn non_root_cannot_become_someone_else() {
        if !is_root() {
            return;
        }
        let code = in_child(|| {
            // Drop to 1000 first, then ask for another uid: the layer must refuse, with §6's text.
            unsafe {
                libc::setgroups(0, std::ptr::null());
                libc::setresgid(1000, 1000, 1000);
                libc::setresuid(1000, 1000, 1000);
            }
            let other = Identity {
                uid: 1001,
                gid: 1001,
                groups: Vec::new(),
            };
            let same = Identity {
                uid: 1000,
                gid: 1000,
                groups: Vec::new(),
            };
            match (
                apply_identity(&policy(Some(other))),
                apply_identity(&policy(Some(same))),
            ) {
                (Err(e), Ok(()))
                    if e.layer == "identity"
                        && e.message.starts_with(
                            "sandbox unavailable: identity could not be applied: ",
                        ) =>
                {
                    0
                }
                _ => 2,
            }
        });
        assert_eq!(code, 0);
    }
}
