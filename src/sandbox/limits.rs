//! Resources and the worker's own memory and descriptors (spec/sandbox.md §3.1 step 7).
//!
//! - `setrlimit` for `RLIMIT_CORE` (0: no core dump leaks memory contents), `RLIMIT_NPROC`
//!   (fork-bomb ceiling), `RLIMIT_NOFILE` and `RLIMIT_FSIZE`, soft = hard, so commands cannot
//!   raise them again (the capability drop already removed `CAP_SYS_RESOURCE`);
//! - `PR_SET_DUMPABLE 0`: commands (same uid) cannot read the worker's memory through
//!   `/proc/PID/mem` or take its descriptors through `/proc/PID/fd`; `execve` resets this flag
//!   for the commands themselves, which is fine;
//! - every inherited descriptor is closed except an allow-list (the request socketpair, stdio),
//!   so nothing the daemon had open leaks into the sandbox.
//!
//! Applied in every mode, danger-full-access included (§2.9). Note that `RLIMIT_NPROC` counts all
//! processes of the uid on the host, not only the session's.

use std::io;
use std::os::fd::RawFd;

use crate::sandbox::error::LayerError;
use crate::sandbox::policy::ResourceLimits;
use crate::sandbox::report::{Layer, LayerReport};

const LAYER: &str = Layer::Limits.as_str();

/// setrlimit's resource argument: glibc gives it its own type, musl (the static build) a plain
/// int.
#[cfg(target_env = "gnu")]
pub type Resource = libc::__rlimit_resource_t;
#[cfg(not(target_env = "gnu"))]
pub type Resource = libc::c_int;

fn limit_error(step: &str, err: impl std::fmt::Display) -> LayerError {
    LayerError::new(
        LAYER,
        format!("{step} failed: {err}"),
        "Check that the daemon's own limits and the container allow these values",
    )
}

/// The rlimits applied, as (resource, name, value).
fn rlimits(limits: &ResourceLimits) -> [(Resource, &'static str, u64); 5] {
    [
        (libc::RLIMIT_CORE, "RLIMIT_CORE", limits.core_bytes),
        (libc::RLIMIT_NPROC, "RLIMIT_NPROC", limits.processes),
        (libc::RLIMIT_NOFILE, "RLIMIT_NOFILE", limits.open_files),
        (libc::RLIMIT_FSIZE, "RLIMIT_FSIZE", limits.file_size_bytes),
        // The memory fallback when no cgroup could be made (u64::MAX = RLIM_INFINITY).
        (libc::RLIMIT_DATA, "RLIMIT_DATA", limits.data_bytes),
    ]
}

/// Sets each limit (soft and hard) to the requested value, or to the current hard limit if that
/// is lower (raising a hard limit needs the capability this process no longer has). Returns the
/// values in force.
pub fn set_rlimits(limits: &ResourceLimits) -> Result<Vec<(&'static str, u64)>, LayerError> {
    let mut applied = Vec::new();
    for (resource, name, wanted) in rlimits(limits) {
        let mut cur = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills the struct.
        if unsafe { libc::getrlimit(resource, &mut cur) } != 0 {
            return Err(limit_error(
                &format!("getrlimit({name})"),
                io::Error::last_os_error(),
            ));
        }
        let value = wanted.min(cur.rlim_max);
        let new = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        // SAFETY: setrlimit reads the struct.
        if unsafe { libc::setrlimit(resource, &new) } != 0 {
            return Err(limit_error(
                &format!("setrlimit({name}, {value})"),
                io::Error::last_os_error(),
            ));
        }
        applied.push((name, value));
    }
    Ok(applied)
}

/// Marks the process non-dumpable and verifies it.
pub fn set_not_dumpable() -> Result<(), LayerError> {
    // SAFETY: integer arguments only.
    if unsafe {
        libc::prctl(
            libc::PR_SET_DUMPABLE,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    } != 0
    {
        return Err(limit_error(
            "prctl(PR_SET_DUMPABLE, 0)",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: as above.
    match unsafe {
        libc::prctl(
            libc::PR_GET_DUMPABLE,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    } {
        0 => Ok(()),
        other => Err(limit_error(
            "verifying PR_GET_DUMPABLE",
            format!("it returned {other}"),
        )),
    }
}

/// `close_range(first, last, 0)`.
fn close_range(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: closes descriptors only; the caller's contract says none of them is owned by Rust
    // objects still in use.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Closes every descriptor except those in `keep`.
///
/// Uses `close_range` over the gaps between kept descriptors; on kernels without it (before 5.9)
/// falls back to closing what `/proc/self/fd` lists. The caller must not hold Rust owners
/// (`OwnedFd`, `File`, ...) of descriptors outside `keep`: they would later close a number that
/// may have been reused.
pub fn close_inherited_fds(keep: &[RawFd]) -> Result<(), LayerError> {
    let mut kept: Vec<u32> = keep
        .iter()
        .filter(|&&fd| fd >= 0)
        .map(|&fd| fd as u32)
        .collect();
    kept.sort_unstable();
    kept.dedup();
    let mut ranges = Vec::new();
    let mut start = 0u32;
    for &k in &kept {
        if k > start {
            ranges.push((start, k - 1));
        }
        start = k + 1;
    }
    ranges.push((start, u32::MAX));
    for (first, last) in ranges {
        match close_range(first, last) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => return close_listed_fds(&kept),
            Err(e) => return Err(limit_error(&format!("close_range({first}, {last})"), e)),
        }
    }
    Ok(())
}

/// Fallback for kernels without `close_range`: close each fd listed in `/proc/self/fd`.
fn close_listed_fds(kept: &[u32]) -> Result<(), LayerError> {
    // Collect first: the directory stream itself holds a descriptor while it is read.
    let fds: Vec<u32> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| limit_error("listing /proc/self/fd", e))?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in fds.into_iter().filter(|fd| !kept.contains(fd)) {
        // SAFETY: see close_inherited_fds; EBADF (the directory's own fd, now closed) is ignored.
        unsafe { libc::close(fd as RawFd) };
    }
    Ok(())
}

/// The whole step: limits, non-dumpable, close every descriptor but `keep_fds`.
pub fn apply(limits: &ResourceLimits, keep_fds: &[RawFd]) -> Result<LayerReport, LayerError> {
    let applied = set_rlimits(limits)?;
    set_not_dumpable()?;
    close_inherited_fds(keep_fds)?;
    let text: Vec<String> = applied.iter().map(|(n, v)| format!("{n}={v}")).collect();
    Ok(LayerReport::enforced(
        Layer::Limits,
        format!(
            "{}; not dumpable; descriptors kept: {keep_fds:?}",
            text.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::testutil::{TempDir, assert_child_ok, cstr, expect_errno, sh_ok};

    fn small() -> ResourceLimits {
        ResourceLimits {
            core_bytes: 0,
            processes: 64,
            open_files: 32,
            file_size_bytes: 4096,
            memory_bytes: 1 << 30,
            user_memory_bytes: 1 << 30,
            data_bytes: 1 << 30,
        }
    }

    fn fd_is_open(fd: RawFd) -> bool {
        // SAFETY: F_GETFD only inspects the descriptor table.
        (unsafe { libc::fcntl(fd, libc::F_GETFD) }) >= 0
    }

    #[test]
    fn rlimits_are_set_hard_and_commands_inherit_them() {
        let dir = TempDir::new("lim");
        let big = dir.path().join("big");
        let b = big.clone();
        // Baseline: without the limits, an 8 KiB file can be written and `ulimit -c` is not 0
        // or the limits differ from the ones set below.
        let before = String::from_utf8(sh_ok("ulimit -n").unwrap().stdout).unwrap();
        assert_ne!(before.trim(), "32");
        assert_child_ok(move || {
            let applied = set_rlimits(&small()).map_err(|e| e.to_string())?;
            if applied
                != vec![
                    ("RLIMIT_CORE", 0),
                    ("RLIMIT_NPROC", 64),
                    ("RLIMIT_NOFILE", 32),
                    ("RLIMIT_FSIZE", 4096),
                    ("RLIMIT_DATA", 1 << 30),
                ]
            {
                return Err(format!("applied {applied:?}"));
            }
            let out = sh_ok("ulimit -c; ulimit -n; ulimit -p 2>/dev/null || ulimit -u")?;
            let text = String::from_utf8_lossy(&out.stdout);
            if text != "0\n32\n64\n" {
                return Err(format!("ulimit in a command: {text:?}"));
            }
            // Hard limit: raising again fails (as root, only CAP_SYS_RESOURCE could; this host's
            // bounding set lacks it, and the worker drops all capabilities anyway).
            let up = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            // SAFETY: setrlimit reads the struct.
            let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &up) };
            expect_errno("raising RLIMIT_NOFILE", rc as i64, libc::EPERM)?;
            // RLIMIT_FSIZE: a write past 4096 bytes fails with EFBIG (SIGXFSZ ignored).
            // SAFETY: ignoring a signal in this child.
            unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
            let c = cstr(&b);
            // SAFETY: valid path and buffer.
            let fd = unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                    0o600,
                )
            };
            let buf = [0u8; 8192];
            // SAFETY: valid buffer.
            let first = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
            if first != 4096 {
                return Err(format!("first write wrote {first}"));
            }
            // SAFETY: as above.
            expect_errno(
                "write past RLIMIT_FSIZE",
                unsafe { libc::write(fd, buf.as_ptr().cast(), 1) } as i64,
                libc::EFBIG,
            )?;
            // RLIMIT_NOFILE: opening more than 32 descriptors fails with EMFILE.
            let mut last = 0;
            for _ in 0..40 {
                // SAFETY: valid path.
                last =
                    unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
                if last < 0 {
                    break;
                }
            }
            expect_errno("open past RLIMIT_NOFILE", last as i64, libc::EMFILE)
        });
        assert_eq!(
            std::fs::metadata(&big).unwrap().len(),
            4096,
            "host sees the truncated file"
        );
    }

    #[test]
    fn nproc_stops_forks_of_an_unprivileged_uid() {
        assert_child_ok(|| {
            let mut l = small();
            l.processes = 1;
            set_rlimits(&l).map_err(|e| e.to_string())?;
            // An otherwise unused uid without capabilities (RLIMIT_NPROC is not enforced while
            // CAP_SYS_ADMIN or CAP_SYS_RESOURCE is effective).
            // SAFETY: integer arguments only.
            unsafe {
                libc::setresgid(64999, 64999, 64999);
                libc::setresuid(64999, 64999, 64999);
            }
            // SAFETY: the forked child (if any) exits at once.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: leaving the unexpected child.
                unsafe { libc::_exit(0) };
            }
            expect_errno("fork past RLIMIT_NPROC", pid as i64, libc::EAGAIN)
        });
    }

    #[test]
    fn worker_becomes_not_dumpable() {
        // SAFETY: integer arguments only.
        assert_eq!(
            unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) },
            1,
            "baseline dumpable"
        );
        assert_child_ok(|| {
            set_not_dumpable().map_err(|e| e.to_string())?;
            // /proc/self/* of a non-dumpable process belongs to root:root (owner check), and the
            // flag reads back as 0.
            // SAFETY: as above.
            match unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) } {
                0 => Ok(()),
                v => Err(format!("dumpable {v}")),
            }
        });
    }

    #[test]
    fn inherited_descriptors_are_closed_except_the_allow_list() {
        assert_child_ok(|| {
            // Keep everything that existed before (stdio, the test's report pipe), open new ones
            // without CLOEXEC so a command would inherit them.
            let listed: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
                .map_err(|e| e.to_string())?
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect();
            // The listing's own descriptor is closed by now; keep only what is still open.
            let existing: Vec<RawFd> = listed.into_iter().filter(|&fd| fd_is_open(fd)).collect();
            // SAFETY: valid path.
            let open = || unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
            let (a, b, c) = (open(), open(), open());
            let high = 900;
            // SAFETY: duplicating a descriptor we own to a high number.
            if unsafe { libc::dup2(a, high) } != high {
                return Err("dup2".into());
            }
            // Baseline: a command inherits the leaked descriptor.
            sh_ok(&format!("test -e /proc/self/fd/{c}"))?;
            let mut keep = existing.clone();
            keep.push(b);
            close_inherited_fds(&keep).map_err(|e| e.to_string())?;
            for fd in [a, c, high] {
                if fd_is_open(fd) {
                    return Err(format!("fd {fd} still open"));
                }
            }
            if !fd_is_open(b) || !existing.iter().all(|&fd| fd_is_open(fd)) {
                return Err("a kept descriptor was closed".into());
            }
            // The command no longer sees it.
            sh_ok(&format!("! test -e /proc/self/fd/{c}"))?;
            Ok(())
        });
    }

    #[test]
    fn apply_reports_every_part() {
        assert_child_ok(|| {
            let r = apply(&small(), &[0, 1, 2]).map_err(|e| e.to_string())?;
            let want = "RLIMIT_CORE=0, RLIMIT_NPROC=64, RLIMIT_NOFILE=32, RLIMIT_FSIZE=4096, RLIMIT_DATA=1073741824; not dumpable; descriptors kept: [0, 1, 2]";
            if r.layer != Layer::Limits || r.detail != want {
                return Err(format!("{r:?}"));
            }
            // stdio survived; the report pipe is gone, so the verdict travels by exit code.
            if !(0..3).all(fd_is_open) {
                return Err("stdio closed".into());
            }
            Ok(())
        });
    }
}
