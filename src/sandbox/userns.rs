//! The user namespace of a daemon that is not root (DESIGN.md §1, spec/sandbox.md §3.1 step 1
//! and §6): the only way an ordinary user's worker gets the capabilities that building the
//! mount, pid and network namespaces needs.
//!
//! A root daemon builds the sandbox with its own `CAP_SYS_ADMIN`. A daemon running as an ordinary
//! user has no capability, so its worker first enters a new user namespace. The creator of a user
//! namespace holds every capability **in it**, and those capabilities reach only objects owned by
//! that namespace — the mount, pid, uts, ipc and network namespaces created right after — never
//! the host's files, processes or network. The capability layer empties all of them (and
//! verifies it) before any command runs.
//!
//! **Mapping: the daemon's own uid and gid, to themselves** (`U U 1`, `G G 1`), and nothing else.
//! The alternative, root inside (`0 U 1`) and dropping back later, is worse on every count:
//! - nothing inside ever sees itself as uid 0, so no program takes root-only paths, and the
//!   kernel's uid-0 rules (every capability regained at `execve` unless `SECBIT_NOROOT` holds,
//!   set-user-ID-root binaries of the namespace) never apply: the capability drop is one of two
//!   independent reasons a command holds no privilege, not the only one;
//! - files a command creates show their real owner inside as on the host (`ls -l`, git's
//!   `safe.directory` ownership check and ssh's permission checks behave as outside);
//! - "dropping back" from 0 to U inside would need U mapped as well, and a second mapped id needs
//!   `CAP_SETUID` in the parent namespace (the set-user-ID `newuidmap` helper, which corral does
//!   not depend on) or a second, nested user namespace: more moving parts for no protection.
//!
//! Building mounts needs the namespace's capabilities, not uid 0, so uid U inside suffices.
//! `setgroups` is set to `deny` first — the kernel requires it before an unprivileged `gid_map`,
//! and it also means nothing in the sandbox can shed a supplementary group to get around a
//! "deny this group" permission.
//!
//! Where the kernel or an LSM forbids unprivileged user namespaces, [`host_blockers`] names the
//! setting and the command that enables it; that text is the fix of the fail-closed message —
//! here when the namespace cannot be made or mapped, and in `namespaces` when a capability of
//! the namespace is refused at its first use (AppArmor's restriction lets the namespace be
//! made, then denies every capability in it).

use crate::sandbox::error::LayerError;
use nix::errno::Errno;
use std::path::Path;

/// The layer this step belongs to (it is part of the namespaces layer: degrading `namespaces`
/// skips it too).
const LAYER: &str = crate::sandbox::namespaces::LAYER;

/// `CAP_SYS_ADMIN`, which every mount of the filesystem view needs.
const CAP_SYS_ADMIN: u32 = 21;

/// Whether this process needs its own user namespace to build the sandbox: it is not root.
pub fn needed() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() != 0 }
}

/// Enters a new user namespace mapping this process's uid and gid to themselves. Must run in a
/// single-threaded process (the kernel refuses `CLONE_NEWUSER` otherwise). Returns a summary
/// for the namespaces layer's report.
pub fn enter_own_user_namespace() -> Result<String, LayerError> {
    let (uids, gids) = (getresuid(), getresgid());
    let (uid, gid) = (uids[1], gids[1]);
    // A map holds one id only, so real, effective and saved ids must agree: an id left out of
    // the map would show up inside as the overflow id.
    if uids != [uid; 3] || gids != [gid; 3] {
        return Err(fail(
            format!("the daemon's real, effective and saved ids differ (uids {uids:?}, gids {gids:?})"),
            "Start the corral daemon with one uid and one gid (not through a set-user-ID or set-group-ID program)".into(),
        ));
    }

    // SAFETY: unshare with a flag only; the caller guarantees a single thread.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
        let e = Errno::last();
        return Err(fail(
            format!(
                "unshare(CLONE_NEWUSER) failed: {} ({})",
                e.desc(),
                errno_name(e)
            ),
            enable_fix(uid),
        ));
    }
    // Order fixed by the kernel: setgroups must be denied before an unprivileged gid_map.
    write_proc("/proc/self/setgroups", "deny", uid)?;
    write_proc("/proc/self/uid_map", &format!("{uid} {uid} 1\n"), uid)?;
    write_proc("/proc/self/gid_map", &format!("{gid} {gid} 1\n"), gid)?;

    // Read everything back: the same ids inside, and the capability the mounts need.
    let (inside_uids, inside_gids) = (getresuid(), getresgid());
    if inside_uids != [uid; 3] || inside_gids != [gid; 3] {
        return Err(fail(
            format!(
                "inside the new user namespace the ids are uids {inside_uids:?}, gids \
                 {inside_gids:?}, not uid {uid} gid {gid}"
            ),
            "Report this with the kernel version".into(),
        ));
    }
    if !holds_effective(CAP_SYS_ADMIN) {
        return Err(fail(
            "the new user namespace grants no CAP_SYS_ADMIN to its creator".into(),
            enable_fix(uid),
        ));
    }
    Ok(format!(
        "user (uid {uid} and gid {gid} mapped to themselves, setgroups denied)"
    ))
}

/// Writes one of the namespace's `/proc/self` files; a refusal means the kernel or an LSM
/// withholds the mapping.
fn write_proc(path: &str, text: &str, id: u32) -> Result<(), LayerError> {
    std::fs::write(path, text).map_err(|e| {
        fail(
            format!("writing {:?} to {path} failed: {e}", text.trim_end()),
            enable_fix(id),
        )
    })
}

/// The host settings that forbid unprivileged user namespaces, as read from `/proc/sys`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSettings {
    /// `kernel.unprivileged_userns_clone` (Debian and older Ubuntu kernels only).
    pub unprivileged_userns_clone: Option<u64>,
    /// `user.max_user_namespaces` (as seen from this process's user namespace).
    pub max_user_namespaces: Option<u64>,
    /// `kernel.apparmor_restrict_unprivileged_userns` (Ubuntu 23.10 and later).
    pub apparmor_restrict_unprivileged_userns: Option<u64>,
}

impl HostSettings {
    /// Reads the three settings; one that does not exist on this kernel is `None`.
    pub fn read() -> HostSettings {
        let read = |p: &str| {
            std::fs::read_to_string(Path::new(p))
                .ok()
                .and_then(|s| s.trim().parse().ok())
        };
        HostSettings {
            unprivileged_userns_clone: read("/proc/sys/kernel/unprivileged_userns_clone"),
            max_user_namespaces: read("/proc/sys/user/max_user_namespaces"),
            apparmor_restrict_unprivileged_userns: read(
                "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            ),
        }
    }
}

/// Each setting in `s` that forbids unprivileged user namespaces: what it is set to and the
/// command that enables them. Empty when none does.
pub fn host_blockers(s: &HostSettings) -> Vec<String> {
    let mut out = Vec::new();
    if s.unprivileged_userns_clone == Some(0) {
        out.push(
            "kernel.unprivileged_userns_clone is 0 (unprivileged user namespaces are disabled); \
             enable them with `sysctl -w kernel.unprivileged_userns_clone=1`"
                .to_string(),
        );
    }
    if s.max_user_namespaces == Some(0) {
        out.push(
            "user.max_user_namespaces is 0 (no user namespace may be created); allow them with \
             `sysctl -w user.max_user_namespaces=15000`"
                .to_string(),
        );
    }
    if s.apparmor_restrict_unprivileged_userns == Some(1) {
        out.push(
            "kernel.apparmor_restrict_unprivileged_userns is 1 (AppArmor gives the user \
             namespaces of unconfined programs no capabilities); lift it with `sysctl -w \
             kernel.apparmor_restrict_unprivileged_userns=0`, or load an AppArmor profile for \
             the corral binary that has the `userns,` rule"
                .to_string(),
        );
    }
    out
}

/// The fix for a refused user namespace: the blocking settings of this host, or, when none of
/// them blocks, what else can (a seccomp profile, an LSM, an enclosing namespace's limit).
fn enable_fix(uid: u32) -> String {
    fix_text(uid, &HostSettings::read())
}

/// The fix text for a daemon of `uid` on a host with `settings` (see [`enable_fix`]).
pub fn fix_text(uid: u32, settings: &HostSettings) -> String {
    let why = format!(
        "This daemon runs as uid {uid}, not root, and builds the sandbox's mount, pid and network \
         namespaces inside an unprivileged user namespace"
    );
    let blockers = host_blockers(settings);
    let what = if blockers.is_empty() {
        let shown = |v: Option<u64>| v.map_or("absent".to_string(), |v| v.to_string());
        format!(
            "No sysctl forbids it (user.max_user_namespaces={}, \
             kernel.unprivileged_userns_clone={}, kernel.apparmor_restrict_unprivileged_userns={}), \
             so something else refuses it: a container's seccomp profile (allow unshare and clone \
             with CLONE_NEWUSER), an LSM policy (AppArmor, SELinux), or the user-namespace limit \
             of an enclosing namespace",
            shown(settings.max_user_namespaces),
            shown(settings.unprivileged_userns_clone),
            shown(settings.apparmor_restrict_unprivileged_userns),
        )
    } else {
        format!("Blocked by: {}", blockers.join("; "))
    };
    format!(
        "{why}. {what}. Otherwise run the corral daemon as root, or allow degraded mode for \
         namespaces"
    )
}

/// The fail-closed message of spec/sandbox.md §6.
fn fail(cause: String, fix: String) -> LayerError {
    LayerError {
        layer: LAYER,
        message: format!("sandbox unavailable: {LAYER} could not be applied: {cause}. {fix}."),
    }
}

fn errno_name(e: Errno) -> String {
    format!("{e:?}")
}

fn getresuid() -> [u32; 3] {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: three valid out-pointers; getresuid cannot fail with them.
    unsafe { libc::getresuid(&mut r, &mut e, &mut s) };
    [r, e, s]
}

fn getresgid() -> [u32; 3] {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: as above.
    unsafe { libc::getresgid(&mut r, &mut e, &mut s) };
    [r, e, s]
}

/// Whether `cap` is in this process's effective set (from `/proc/self/status`, which reflects
/// the user namespace the process is in).
fn holds_effective(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|bits| bits & (1 << cap) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::testutil::in_child;

    #[test]
    fn each_blocking_setting_is_named_with_its_command() {
        let open = HostSettings {
            unprivileged_userns_clone: Some(1),
            max_user_namespaces: Some(15000),
            apparmor_restrict_unprivileged_userns: Some(0),
        };
        assert!(host_blockers(&open).is_empty());
        assert!(host_blockers(&HostSettings::default()).is_empty());

        let closed = HostSettings {
            unprivileged_userns_clone: Some(0),
            max_user_namespaces: Some(0),
            apparmor_restrict_unprivileged_userns: Some(1),
        };
        let b = host_blockers(&closed);
        assert_eq!(b.len(), 3, "{b:?}");
        assert!(b[0].contains("sysctl -w kernel.unprivileged_userns_clone=1"));
        assert!(b[1].contains("sysctl -w user.max_user_namespaces=15000"));
        assert!(b[2].contains("sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"));
        assert!(b[2].contains("userns,"));
    }

    #[test]
    fn the_fix_names_the_blocker_or_what_else_can_refuse() {
        let apparmor = HostSettings {
            apparmor_restrict_unprivileged_userns: Some(1),
            max_user_namespaces: Some(100),
            ..Default::default()
        };
        let fix = fix_text(1000, &apparmor);
        assert!(fix.contains("uid 1000, not root"), "{fix}");
        assert!(
            fix.contains("Blocked by: kernel.apparmor_restrict_unprivileged_userns is 1"),
            "{fix}"
        );
        assert!(!fix.contains("max_user_namespaces is 0"), "{fix}");
        assert!(
            fix.ends_with("or allow degraded mode for namespaces"),
            "{fix}"
        );

        let nothing = fix_text(1000, &HostSettings::default());
        assert!(nothing.contains("No sysctl forbids it"), "{nothing}");
        assert!(nothing.contains("seccomp profile"), "{nothing}");
        assert!(
            nothing.contains("user.max_user_namespaces=absent"),
            "{nothing}"
        );
    }

    #[test]
    fn the_message_splits_into_cause_and_fix() {
        let e = fail(
            "unshare(CLONE_NEWUSER) failed: No space left on device (ENOSPC)".into(),
            fix_text(7, &HostSettings::default()),
        );
        let parts = e.parts().expect("standard shape");
        assert_eq!(
            parts.cause,
            "unshare(CLONE_NEWUSER) failed: No space left on device (ENOSPC)"
        );
        assert!(parts.fix.starts_with("This daemon runs as uid 7"));
        assert_eq!(e.layer, "namespaces");
    }

    /// As root, the test drops to an ordinary uid in a forked child (no capability left) and
    /// enters the namespace there: the same ids inside, CAP_SYS_ADMIN held in the namespace
    /// only (a host mount is still refused), and the maps hold exactly one id each.
    #[test]
    fn an_ordinary_uid_maps_itself_and_gains_no_host_power() {
        if needed() {
            eprintln!("skipped: the test switches to another uid, which needs root (CI is root)");
            return;
        }
        let outcome = in_child(|| {
            // SAFETY: plain id changes in the forked, single-threaded child.
            unsafe {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(65534, 65534, 65534) != 0
                    || libc::setresuid(65534, 65534, 65534) != 0
                {
                    return Err(format!("dropping to nobody: {}", Errno::last()));
                }
            }
            if !needed() {
                return Err("still root after setresuid".into());
            }
            // A uid change makes a process non-dumpable, which gives its /proc/self files to
            // root; a worker exec'd as the user (as the daemon's are) is dumpable.
            // SAFETY: integer arguments only.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
            let summary = enter_own_user_namespace().map_err(|e| e.to_string())?;
            if !summary.contains("uid 65534 and gid 65534 mapped to themselves") {
                return Err(format!("summary: {summary}"));
            }
            let uid_map = std::fs::read_to_string("/proc/self/uid_map").unwrap();
            let fields: Vec<&str> = uid_map.split_whitespace().collect();
            if fields != ["65534", "65534", "1"] {
                return Err(format!("uid_map: {uid_map:?}"));
            }
            let setgroups = std::fs::read_to_string("/proc/self/setgroups").unwrap();
            if setgroups.trim() != "deny" {
                return Err(format!("setgroups: {setgroups:?}"));
            }
            if !holds_effective(CAP_SYS_ADMIN) {
                return Err("no CAP_SYS_ADMIN inside the new namespace".into());
            }
            // The capability is the namespace's: the host's mount table is still out of reach
            // (the mount namespace is still the host's, owned by the initial user namespace).
            let r = nix::mount::mount(
                Some("tmpfs"),
                "/mnt",
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            );
            if r != Err(Errno::EPERM) {
                return Err(format!("host mount from the user namespace: {r:?}"));
            }
            Ok(())
        });
        assert!(outcome.exited_ok(), "{outcome:?}");
    }
}
